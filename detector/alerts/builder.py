"""Matches -> alerts (docs/architecture.md, "Alert schema"), with dedup.

Dedup folds matches of one rule with the same identity (identity.py: host, job, user and the
process, file and peer of the action; a correlation's group) inside one window of event time
into one alert whose `count` says how many were folded. `alert.id` is a hash of (rule, key,
window), so the same situation seen by two scans, or by the agent before and after a
restart, gets the same id and receivers can deduplicate on it.
"""

from __future__ import annotations

import hashlib
import string
from dataclasses import dataclass, field
from typing import Any

from hpcsec.detector.alerts.identity import (
    MAX_DISTINCT_PER_HOST,
    MAX_DISTINCT_PER_KEY,
    OVERFLOW_FIELD,
    Facets,
    base_key,
    host_of,
    identity_values,
    overflow_key,
    rule_identity,
)
from hpcsec.detector.alerts.model import Alert
from hpcsec.detector.core.schema import ALERT_COPIED_PREFIXES, Event, parse_time
from hpcsec.detector.engine.context import rule_context
from hpcsec.detector.engine.evaluate import Match

MAX_EVIDENCE_EVENTS = 20
# the summary of an overflow alert, by the bound that opened it (AlertBuilder._ident)
OVERFLOWS = {
    "key": f"More than {MAX_DISTINCT_PER_KEY} distinct actions of this rule by one job and "
    "user in the window, folded here; the first: ",
    "host": f"More than {MAX_DISTINCT_PER_HOST} distinct alerts of this rule from one host "
    "in the window (any job and user), folded here; the first: ",
}


def _epoch(ts: str | None) -> float:
    try:
        return parse_time(ts).timestamp() if ts else 0.0
    except ValueError:
        return 0.0


def alert_id(rule_id: str, key: tuple, window: int | str) -> str:
    raw = "\x1f".join([rule_id, repr(key), str(window)])
    return hashlib.sha256(raw.encode()).hexdigest()[:32]


FACT_CHARS = 160  # a value of the event in the generic summary line
SUMMARY_CHARS = 1024  # the whole line, template or generic


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def human_bytes(value: float) -> str:
    """`1.5 GiB`: a byte count (or a rate's bytes) in IEC units, three significant digits."""
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.3g} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


class _Formatter(string.Formatter):
    """`{user.name}` templates over flat dotted fields; missing fields print as `?`.

    Two additions for numbers: `{a/b}` is field a divided by field b (a rate: bytes over the
    interval), and the `:bytes` format spec writes a byte count in IEC units. A value a spec
    does not fit (text from a node, `?`) is printed as it is rather than losing the summary.
    """

    def get_field(self, field_name: str, args: Any, kwargs: Any) -> tuple[Any, str]:
        if "/" in field_name and field_name not in kwargs:
            top, _, bottom = field_name.partition("/")
            a, b = _number(kwargs.get(top)), _number(kwargs.get(bottom))
            return ("?" if a is None or not b else a / b), field_name
        value = kwargs.get(field_name)
        return ("?" if value is None else value), field_name

    def format_field(self, value: Any, format_spec: str) -> str:
        if format_spec == "bytes":
            number = _number(value)
            return str(value) if number is None else human_bytes(number)
        try:
            return str(super().format_field(value, format_spec))
        except (ValueError, TypeError):
            return str(value)


_FORMATTER = _Formatter()


def summarize(title: str, event: Event, template: str | None = None) -> str:
    """One line an analyst reads without opening the JSON: each value from the event cut to
    FACT_CHARS, the line to SUMMARY_CHARS (a node's megabyte path would otherwise be the
    line, and a table wrapping it takes seconds per alert; the event keeps it whole)."""
    if template:
        try:
            return _shorten(_FORMATTER.vformat(template, (), event), SUMMARY_CHARS)
        except (ValueError, IndexError):
            pass  # a broken template must not lose the alert: fall back to the generic line
    return _shorten(_generic_summary(title, event), SUMMARY_CHARS)


def _generic_summary(title: str, event: Event) -> str:
    def cut(value: Any) -> str:
        return _shorten(str(value), FACT_CHARS)

    facts = []
    if event.get("user.name"):
        facts.append(f"user {cut(event['user.name'])}")
    facts.append(f"job {cut(event['slurm.job.id'])}" if event.get("slurm.job.id") else "no job")
    if event.get("process.name"):
        facts.append(f"{cut(event['process.name'])}[{cut(event.get('process.pid', '?'))}]")
        command = event.get("process.command_line")
        if command and command != event["process.name"]:
            facts.append(f"`{_shorten(str(command), 80)}`")
    for key, label in (
        ("file.path", ""),
        ("destination.ip", "to "),
        ("gpu.index", "GPU "),
        ("rdma.device", ""),
    ):
        if event.get(key) is not None:
            value = event[key]
            if key == "destination.ip" and event.get("destination.port") is not None:
                value = f"{value}:{event['destination.port']}"
            facts.append(f"{label}{cut(value)}")
    if event.get("firmware.component"):
        fw = f"{event['firmware.component']} {event.get('firmware.version')}"
        if event.get("firmware.baseline_version"):
            fw += f" (baseline {event['firmware.baseline_version']})"
        facts.append(cut(fw))
    return f"{title}: " + ", ".join(facts)


def _span(match: Match) -> tuple[tuple[float, str | None], tuple[float, str | None]]:
    """(epoch, text) of the earliest and the latest event of a match (events may be unordered);
    a correlation's window start and completing event count too (its evidence is a sample)."""
    stamps = [e.get("@timestamp") for e in match.events]
    stamps += [ts for ts in (match.window_start, match.time) if ts]
    times = [(_epoch(ts), ts) for ts in stamps]
    return min(times, key=lambda t: t[0]), max(times, key=lambda t: t[0])


def trigger_event(match: Match) -> Event:
    """The event an alert describes: a detection's only event, or the event that completed a
    correlation (its time is `match.time`; the latest such event in the evidence, which the
    engine appends in feeding order). "Dataset modified while a training job reads it" is then
    about the writer, not about the reader whose event opened the chain."""
    if match.time is None or len(match.events) < 2:
        return match.events[0]
    when = _epoch(match.time)
    for event in reversed(match.events):
        if _epoch(event.get("@timestamp")) == when:
            return event
    return match.events[-1]


def correlation_note(sigma: Any, value: float | None) -> str:
    """What a correlation counted, e.g. ` (12 events in 1m)`; empty for detection rules."""
    kind = getattr(getattr(sigma, "type", None), "name", None)
    if value is None or kind is None:
        return ""
    field = getattr(getattr(sigma, "condition", None), "fieldref", None)
    what = {
        "EVENT_COUNT": f"{value:g} events",
        "VALUE_COUNT": f"{value:g} distinct {field or 'values'}",
        "VALUE_SUM": f"{field or 'sum'} totals {value:g}",
        "VALUE_AVG": f"{field or 'average'} averages {value:g}",
    }.get(kind)
    if what is None:
        return ""
    timespan = getattr(getattr(sigma, "timespan", None), "spec", None)
    return f" ({what} in {timespan})" if timespan else f" ({what})"


@dataclass
class _Open:
    """A dedup slot: the alert's current value and the epochs of its first and last event."""

    alert: Alert
    first: float
    last: float


def _folded(slot: _Open, match: Match) -> Alert:
    """The slot's alert with one more match folded in: a new value, the old one untouched."""
    alert = slot.alert
    changes: dict[str, Any] = {"count": alert["count"] + 1}
    evidence = list(alert["events"])
    room = MAX_EVIDENCE_EVENTS - len(evidence)
    evidence.extend(match.events[: max(room, 0)])
    if len(match.events) > room:
        changes["alert.events_truncated"] = True
    changes["events"] = evidence
    earliest, latest = _span(match)
    if earliest[0] < slot.first:
        slot.first, changes["alert.first_seen"] = earliest
    if latest[0] > slot.last:
        slot.last, changes["alert.last_seen"] = latest
    return alert.evolve(changes)


@dataclass
class AlertBuilder:
    """Turns engine matches into alerts; keeps one open alert per (rule, key, window)."""

    dedup: bool = True
    window_s: int = 300
    _open: dict[str, _Open] = field(default_factory=dict)
    _order: list[str] = field(default_factory=list)
    _distinct: dict[str, int] = field(default_factory=dict)  # (rule, host/job/user, window)
    _grown: dict[str, None] = field(default_factory=dict)  # ids folded into since take_grown
    _facets: dict[str, Facets] = field(default_factory=dict)  # rule id -> identity facets
    # rule.id -> (the rule's pySigma object, its context fields): built once per rule, and
    # again when a reload brings a new object under the same id
    _contexts: dict[str, tuple[Any, dict[str, Any]]] = field(default_factory=dict)

    def add(self, matches: list[Match]) -> list[Alert]:
        """Fold matches in; returns the alerts that are new (the rest only grew `count`:
        `alerts()` has their current values)."""
        new = []
        for match in matches:
            created = self._add_one(match)
            if created is not None:
                new.append(created)
        return new

    def alerts(self) -> list[Alert]:
        """The current value of every open alert, in the order they were opened."""
        return [self._open[i].alert for i in self._order]

    def take_grown(self) -> list[Alert]:
        """The current value of every alert that matches were folded into since the last
        call (the agent stores them so the store keeps up with the counts)."""
        grown, self._grown = self._grown, {}
        return [self._open[i].alert for i in grown if i in self._open]

    def _identity(self, match: Match) -> Facets:
        rule = match.rule
        facets = self._facets.get(rule.id)
        if facets is None:
            facets = self._facets[rule.id] = rule_identity(rule.sigma)
        return facets

    def _ident(self, match: Match) -> tuple[str, tuple, str | None]:
        """(alert id, key, overflow) of a match: which open alert it folds into; `overflow`
        says which bound sent it to an overflow alert ("key", "host"; None: none)."""
        rule = match.rule
        first = match.events[0]
        if match.group:
            key: tuple = tuple(match.group)
        else:
            key = base_key(first) + identity_values(first, self._identity(match))
        when = _epoch(first.get("@timestamp"))
        if not self.dedup:
            return alert_id(rule.id, key, "event:" + str(first.get("event.id", when))), key, None
        # Correlations fire once per group and correlation window; repeated firings of
        # one group inside the dedup window fold like repeated detection matches.
        start = _epoch(match.window_start) if match.window_start else when
        window = int(start // self.window_s)
        ident = alert_id(rule.id, key, window)
        if match.group or ident in self._open:
            return ident, key, None
        base = base_key(first)
        per_key = alert_id(rule.id, base, window)
        distinct = self._distinct.get(per_key, 0)
        overflow = None
        if distinct >= MAX_DISTINCT_PER_KEY:
            overflow, key = "key", overflow_key(base)
            ident = alert_id(rule.id, key, window)
            if ident in self._open:
                return ident, key, overflow
        # a new alert: within the host's bound too, or into the host's overflow alert
        host = host_of(base)
        per_host = alert_id(rule.id, host, window)
        made = self._distinct.get(per_host, 0)
        if made >= MAX_DISTINCT_PER_HOST:
            key = overflow_key(host)
            return alert_id(rule.id, key, window), key, "host"
        self._distinct[per_host] = made + 1
        if overflow is None:
            self._distinct[per_key] = distinct + 1
        return ident, key, overflow

    def _add_one(self, match: Match) -> Alert | None:
        ident, key, overflow = self._ident(match)
        existing = self._open.get(ident)
        if existing is not None:
            existing.alert = _folded(existing, match)
            self._grown[ident] = None
            return None
        alert = self._new_alert(ident, match, key)
        if overflow is not None:
            alert = alert.evolve(
                {
                    OVERFLOW_FIELD: True,
                    "alert.summary": OVERFLOWS[overflow] + alert["alert.summary"],
                }
            )
        (first_t, _), (last_t, _) = _span(match)
        self._open[ident] = _Open(alert, first_t, last_t)
        self._order.append(ident)
        return alert

    def _new_alert(self, ident: str, match: Match, key: tuple) -> Alert:
        rule = match.rule
        sigma = rule.sigma
        first = trigger_event(match)
        sigma_level = getattr(sigma, "level", None)  # correlation rules may have none
        level = sigma_level.name.lower() if sigma_level else "medium"
        alert: dict[str, Any] = {
            "alert.id": ident,
            # a correlation happened when its completing event did
            "@timestamp": match.time or first.get("@timestamp"),
            "rule.id": rule.id,
            "rule.title": sigma.title,
            "rule.level": level,
            "rule.tags": [str(t) for t in (sigma.tags or [])],
            "rule.vector": rule.vector,
            "rule.kind": rule.kind,
            "host.name": first.get("host.name"),
        }
        for k, v in first.items():
            if k.startswith(ALERT_COPIED_PREFIXES):
                alert[k] = v
        if match.group:
            alert["alert.group"] = {k: v for k, v in match.group}
        if match.value is not None:
            alert["alert.value"] = match.value
        template = (getattr(sigma, "custom_attributes", None) or {}).get("summary")
        alert["alert.summary"] = summarize(
            sigma.title, {**first, **dict(match.group)}, template
        ) + correlation_note(sigma, match.value)
        (_, alert["alert.first_seen"]), (_, alert["alert.last_seen"]) = _span(match)
        alert["events"] = list(match.events[:MAX_EVIDENCE_EVENTS])
        alert["count"] = 1
        alert.update(self._context(rule.id, sigma))
        return Alert(alert)

    def _context(self, rule_id: str, sigma: Any) -> dict[str, Any]:
        cached = self._contexts.get(rule_id)
        if cached is None or cached[0] is not sigma:
            cached = self._contexts[rule_id] = (sigma, rule_context(sigma))
        return cached[1]

"""The alert value every stage after the alert builder reads: outputs, the store, renderers.

An alert is immutable once built. Dedup and suppression do not edit an alert that may already
be on its way to a receiver or in the store's write buffer: they make a new value
(`Alert.evolve`) with the grown `count` or the later `alert.last_seen`, and hand that on.

`Alert` is a `dict` subclass whose mutating methods raise. That is deliberate: outputs and the
store serialize alerts with orjson, which writes dict subclasses natively, so the bytes a
receiver gets are exactly those of the plain dicts alerts used to be, with no conversion per
alert. Nested values (the evidence events, tags) are shared with the builder's inputs and are
never modified either: a new value gets new lists.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any, NoReturn

from hpcsec.detector.core.schema import LEVELS, rfc3339, status_event


class Alert(dict[str, Any]):
    """A read-only alert: the alert schema's flat dotted fields."""

    __slots__ = ()

    def _immutable(self, *_args: object, **_kwargs: object) -> NoReturn:
        raise TypeError("an Alert is immutable: use evolve() for a changed copy")

    __setitem__ = _immutable
    __delitem__ = _immutable
    __ior__ = _immutable
    clear = _immutable
    pop = _immutable
    popitem = _immutable
    setdefault = _immutable
    update = _immutable

    def evolve(self, changes: Mapping[str, Any]) -> Alert:
        """A new alert: these fields changed (or added at the end), the others as they are."""
        return Alert({**self, **changes})

    def __reduce__(self) -> tuple[type[Alert], tuple[dict[str, Any]]]:
        # copy and pickle rebuild a dict subclass item by item, which __setitem__ refuses
        return (Alert, (dict(self),))


def level_rank(level: object) -> int:
    """Position of a rule level in LEVELS (the one order of severity); unknown levels rank
    lowest, so they never trip `--fail-on` on their own."""
    return LEVELS.index(level) if isinstance(level, str) and level in LEVELS else 0


def highest_level(alerts: Iterable[Mapping[str, Any]], default: str = "medium") -> str:
    """The most severe known level among `alerts`, or `default` when none has one."""
    levels = [a.get("rule.level") for a in alerts]
    known = [level for level in levels if isinstance(level, str) and level in LEVELS]
    return max(known, key=LEVELS.index) if known else default


def sort_alerts(alerts: Iterable[Alert]) -> list[Alert]:
    """Most severe first, then by time."""
    return sorted(
        alerts, key=lambda a: (-level_rank(a.get("rule.level")), str(a.get("@timestamp") or ""))
    )


def own_alert(
    *,
    ident: str,
    timestamp: str,
    rule_id: str,
    title: str,
    level: str,
    tags: Iterable[str] = (),
    vector: Any = "hpcsec",
    kind: str | None = "internal",
    host: str | None,
    body: Mapping[str, Any],
) -> Alert:
    """An alert hpcsec raises about itself (a failed reload, a rate-limit summary), with the
    head every alert has; `body` follows in its own order (it is what receivers parse)."""
    head: dict[str, Any] = {
        "alert.id": ident,
        "@timestamp": timestamp,
        "rule.id": rule_id,
        "rule.title": title,
        "rule.level": level,
        "rule.tags": list(tags),
        "rule.vector": vector,
    }
    if kind is not None:
        head["rule.kind"] = kind
    head["host.name"] = host
    return Alert({**head, **body})


RELOAD_FAILED_RULE_ID = "hpcsec-reload-failed"


def reload_failed_alert(error: str, host: str) -> Alert:
    """The agent kept its running rules and config because the new ones did not load."""
    now = rfc3339()
    summary = f"Reload of rules and config failed, the previous ones keep running: {error}"
    raw = "\x1f".join([RELOAD_FAILED_RULE_ID, host, now, summary])
    return own_alert(
        ident=hashlib.sha256(raw.encode()).hexdigest()[:32],
        timestamp=now,
        rule_id=RELOAD_FAILED_RULE_ID,
        title="Rule or config reload failed; the previous set keeps running",
        level="high",
        host=host,
        body={
            "alert.summary": summary,
            "alert.first_seen": now,
            "alert.last_seen": now,
            "events": [status_event("agent", "reload_failed", error, host, now)],
            "count": 1,
        },
    )

"""Incidents: the alerts an analyst triages together share an `incident.id`.

Alerts belong together when they are about the same thing on the same node:

- the same Slurm job (`host.name`, `slurm.job.id`), whoever the alert names as the user;
- without a job, the same user and process (`user.name`, `process.pid`), or the same user
  alone when the alert names no process;
- without a job and a user, the same threat vector on the node (firmware drift, RDMA probing
  of a device);
- a correlation and the alerts of its steps, whatever their keys: an alert whose evidence
  holds an event (`event.id`) that an earlier alert of an open incident holds joins that
  incident. The link works in both directions, whichever of them the engine raised first.

An incident stays open while its alerts keep coming: an alert joins it when it starts within
`window_s` of the incident's last alert. Its id is a hash of the grouping key and the
`window_s` slice of event time its first alert fell in, like `alert.id`, so the same input
gives the same incidents in every scan. The agent keeps the open incidents of the last
`window_s` of event time; one that restarts in the middle of an incident continues it under
the same id when its first alert after the restart falls in the same slice.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hpcsec.detector.alerts.model import Alert, highest_level, level_rank
from hpcsec.detector.core.timefmt import parse_time

INCIDENT_FIELD = "incident.id"
INCIDENT_WINDOW_S = 3600


def _epoch(value: Any) -> float | None:
    try:
        return parse_time(str(value)).timestamp() if value else None
    except ValueError:
        return None


def _span(alert: Mapping[str, Any]) -> tuple[float, float]:
    """(first, last) epoch of an alert; 0 for an alert whose times do not parse."""
    first = _epoch(alert.get("alert.first_seen")) or _epoch(alert.get("@timestamp")) or 0.0
    last = _epoch(alert.get("alert.last_seen")) or first
    return first, max(first, last)


def grouping_key(alert: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """What makes alerts one incident when no shared event links them (module docstring)."""
    host = ("host", str(alert.get("host.name")))
    job = alert.get("slurm.job.id")
    if job not in (None, ""):
        return (host, ("job", str(job)))
    user = alert.get("user.name")
    if user not in (None, ""):
        pid = alert.get("process.pid")
        if pid not in (None, ""):
            return (host, ("user", str(user)), ("pid", str(pid)))
        return (host, ("user", str(user)))
    return (host, ("vector", str(alert.get("rule.vector"))))


def incident_id(key: tuple[tuple[str, str], ...], bucket: int) -> str:
    raw = "\x1f".join(["incident", repr(key), str(bucket)])
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


def _event_ids(alert: Mapping[str, Any]) -> list[str]:
    events = alert.get("events")
    if not isinstance(events, list):
        return []
    return [str(e["event.id"]) for e in events if isinstance(e, Mapping) and e.get("event.id")]


@dataclass
class _Open:
    ident: str
    key: tuple[tuple[str, str], ...]
    last: float
    event_ids: set[str] = field(default_factory=set)


class IncidentTracker:
    """Assigns `incident.id` to new alerts and remembers it for their later values."""

    def __init__(self, window_s: int = INCIDENT_WINDOW_S):
        self.window_s = max(int(window_s), 1)
        self._by_key: dict[tuple[tuple[str, str], ...], _Open] = {}
        self._by_event: dict[str, _Open] = {}
        self._by_alert: dict[str, str] = {}
        self._latest = 0.0

    def _linked(self, alert: Mapping[str, Any], start: float) -> _Open | None:
        for eid in _event_ids(alert):
            found = self._by_event.get(eid)
            if found is not None and start <= found.last + self.window_s:
                return found
        return None

    def _open_for(self, alert: Mapping[str, Any]) -> _Open:
        start, end = _span(alert)
        incident = self._linked(alert, start)
        if incident is None:
            key = grouping_key(alert)
            incident = self._by_key.get(key)
            if incident is None or start > incident.last + self.window_s:
                ident = incident_id(key, int(start // self.window_s))
                incident = self._by_key[key] = _Open(ident, key, end)
        incident.last = max(incident.last, end)
        self._latest = max(self._latest, end)
        for eid in _event_ids(alert):
            incident.event_ids.add(eid)
            self._by_event.setdefault(eid, incident)
        return incident

    def tag(self, alerts: Iterable[Alert]) -> list[Alert]:
        """The alerts with their `incident.id`: new ones are assigned one, those seen before
        (a grown dedup value) keep theirs."""
        out = []
        for alert in alerts:
            aid = str(alert.get("alert.id"))
            ident = self._by_alert.get(aid)
            if ident is None:
                ident = self._by_alert[aid] = self._open_for(alert).ident
            out.append(
                alert
                if alert.get(INCIDENT_FIELD) == ident
                else alert.evolve({INCIDENT_FIELD: ident})
            )
        return out

    def forget(self, alerts: Iterable[Alert]) -> None:
        """Drop what dedup forgot, and incidents that ended a window before the latest alert
        (the agent: memory stays bounded by what is open)."""
        for alert in alerts:
            self._by_alert.pop(str(alert.get("alert.id")), None)
        horizon = self._latest - self.window_s
        for key, incident in list(self._by_key.items()):
            if incident.last < horizon:
                del self._by_key[key]
        for eid, incident in list(self._by_event.items()):
            if incident.last < horizon:
                del self._by_event[eid]


@dataclass(frozen=True)
class IncidentSummary:
    """One row of `--incidents`: who, which job, which node, what, when, how bad."""

    ident: str
    hosts: tuple[str, ...]
    jobs: tuple[str, ...]
    users: tuple[str, ...]
    vectors: tuple[str, ...]
    first: str
    last: str
    level: str
    count: int
    alerts: tuple[Mapping[str, Any], ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            INCIDENT_FIELD: self.ident,
            "host.name": list(self.hosts),
            "slurm.job.id": list(self.jobs),
            "user.name": list(self.users),
            "rule.vector": list(self.vectors),
            "incident.first_seen": self.first,
            "incident.last_seen": self.last,
            "rule.level": self.level,
            "incident.alerts": len(self.alerts),
            "count": self.count,
        }


def _distinct(alerts: Iterable[Mapping[str, Any]], *keys: str) -> tuple[str, ...]:
    seen: dict[str, None] = {}
    for alert in alerts:
        for key in keys:
            value = alert.get(key)
            if value not in (None, ""):
                seen[str(value)] = None
                break
    return tuple(seen)


def timeline(alerts: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Alerts in the order they happened (first event), the most severe first at a tie."""
    return sorted(
        alerts,
        key=lambda a: (_span(a)[0], -level_rank(a.get("rule.level")), str(a.get("rule.title"))),
    )


def summarize_incidents(alerts: Iterable[Mapping[str, Any]]) -> list[IncidentSummary]:
    """Incidents of these alerts, most severe first, then the earliest first. An alert
    without an `incident.id` (hpcsec's own alerts) is an incident of its own."""
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for alert in alerts:
        ident = alert.get(INCIDENT_FIELD) or f"alert:{alert.get('alert.id')}"
        groups.setdefault(str(ident), []).append(alert)
    out = []
    for ident, members in groups.items():
        ordered = timeline(members)
        spans = [_span(a) for a in ordered]
        last = max(range(len(ordered)), key=lambda i: spans[i][1])
        out.append(
            IncidentSummary(
                ident=ident,
                hosts=_distinct(ordered, "host.name"),
                jobs=_distinct(ordered, "slurm.job.id"),
                users=_distinct(ordered, "user.name", "slurm.job.user"),
                vectors=_distinct(ordered, "rule.vector"),
                first=str(ordered[0].get("alert.first_seen") or ordered[0].get("@timestamp")),
                last=str(ordered[last].get("alert.last_seen") or ordered[last].get("@timestamp")),
                level=highest_level(ordered, default="informational"),
                count=sum(int(a.get("count") or 1) for a in ordered),
                alerts=tuple(ordered),
            )
        )
    out.sort(key=lambda s: (-level_rank(s.level), _epoch(s.first) or 0.0, s.ident))
    return out

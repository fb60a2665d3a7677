"""Rows of the store's tables, built from events, alerts and the agent's journal records.

No duckdb here: the row shapes are shared by direct writes (`scan --store`) and by applying
the journal the agent writes (journal.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from hpcsec.detector.core.jsonenc import dumps
from hpcsec.detector.core.log import get_logger
from hpcsec.detector.core.schema import parse_time

DISPOSITIONS = ("sent", "silenced", "rate_limited", "below_min_level")
logger = get_logger(__name__)


def _utc(value: Any) -> datetime | None:
    if value in (None, ""):
        return None
    try:
        return parse_time(str(value)).replace(tzinfo=None)
    except ValueError:
        return None


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def event_row(e: Mapping[str, Any]) -> tuple:
    eid = _str(e.get("event.id")) or dumps(e).hex()[:40]
    return (
        eid,
        _utc(e.get("@timestamp")),
        _str(e.get("event.category")),
        _str(e.get("event.action")),
        _str(e.get("host.name")),
        _str(e.get("hpcsec.sensor")),
        _str(e.get("slurm.job.id")),
        _str(e.get("user.name")),
        dumps(e).decode(),
    )


def alert_row(a: Mapping[str, Any], disposition: str, reason: str, now: datetime | None) -> tuple:
    return (
        str(a.get("alert.id")),
        _utc(a.get("@timestamp")),
        _utc(a.get("alert.first_seen")),
        _utc(a.get("alert.last_seen")),
        _str(a.get("rule.id")),
        _str(a.get("rule.title")),
        _str(a.get("rule.level")),
        _str(a.get("rule.vector")),
        _str(a.get("host.name")),
        _str(a.get("slurm.job.id")),
        _str(a.get("user.name")),
        int(a.get("count") or 1),
        disposition,
        reason,
        _str(a.get("alert.summary")),
        dumps(a).decode(),
        now,
        _str(a.get("incident.id")),
    )


class Rows:
    """The rows of one write, keyed so that a later record of the same key wins."""

    def __init__(self) -> None:
        self.events: dict[str, tuple] = {}
        self.alerts: dict[str, tuple] = {}
        self.deliveries: dict[tuple[str, str], tuple] = {}

    def add_record(self, record: list[Any], cutoff: datetime) -> None:
        """One journal record (journal.py); malformed ones are skipped: the node's input
        they came from was checked when they were written, so this is damage, not data."""
        try:
            if record[0] == "e" and isinstance(record[1], dict):
                row = event_row(record[1])
                if row[1] is None or row[1] >= cutoff:  # retention applies here too
                    self.events[row[0]] = row
            elif record[0] == "a" and record[1] in DISPOSITIONS and isinstance(record[4], dict):
                row = alert_row(record[4], record[1], str(record[2] or ""), _utc(record[3]))
                self.alerts[row[0]] = row
            elif record[0] == "d":
                aid, dest, state, error, updated = (_str(v) for v in record[1:6])
                if aid is not None and dest is not None:
                    self.deliveries[(aid, dest)] = (aid, dest, state, error or None, _utc(updated))
        except (IndexError, TypeError, ValueError):
            logger.warning("store journal: a malformed record was skipped")

    def writes(self) -> list[tuple[str, str, list[tuple]]]:
        return [
            ("INSERT OR IGNORE", "events", list(self.events.values())),
            ("INSERT OR REPLACE", "alerts", list(self.alerts.values())),
            ("INSERT OR REPLACE", "deliveries", list(self.deliveries.values())),
        ]

"""What `hpcsec alerts` asks the store: the filter, and `--since` as people write it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from hpcsec.detector.core.errors import UsageError
from hpcsec.detector.core.schema import parse_time

_DURATION = re.compile(r"^(\d+)\s*([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """`90s`, `15m`, `1h`, `7d`, `2w` before now, or an RFC 3339 time; aware UTC."""
    now = now or datetime.now(UTC)
    m = _DURATION.match(text.strip())
    if m:
        return now - timedelta(seconds=int(m[1]) * _UNITS[m[2]])
    try:
        return parse_time(text)
    except ValueError:
        raise UsageError(
            f"--since {text!r}: expected a duration (30m, 1h, 7d) or an RFC 3339 time"
        ) from None


@dataclass(frozen=True)
class AlertQuery:
    since: datetime | None = None
    job: str | None = None
    user: str | None = None
    rule: str | None = None  # an exact rule id, or a part of the title (any case)
    vector: str | None = None
    disposition: str | None = None
    incident: str | None = None
    host: str | None = None
    levels: tuple[str, ...] | None = None  # the rule levels wanted (e.g. high and above)
    limit: int = 1000

    def conditions(self) -> tuple[list[str], list[object]]:
        """SQL conditions (AND-ed) and their parameters; values are never SQL text."""
        where: list[str] = ["TRUE"]
        params: list[object] = []
        if self.since is not None:
            where.append("coalesce(last_seen, ts) >= ?")
            params.append(self.since.astimezone(UTC).replace(tzinfo=None))
        for column, value in (
            ("job_id", self.job),
            ("user_name", self.user),
            ("disposition", self.disposition),
            ("host", self.host),
            ("incident_id", self.incident),
        ):
            if value is not None:
                where.append(f"{column} = ?")
                params.append(value)
        if self.rule is not None:
            # contains() and not LIKE: `%` and `_` in what the user typed are plain text
            where.append("(rule_id = ? OR contains(lower(rule_title), lower(?)))")
            params += [self.rule, self.rule]
        if self.vector is not None:
            where.append("lower(rule_vector) = lower(?)")
            params.append(self.vector)
        if self.levels is not None:
            where.append(f"rule_level IN ({', '.join('?' * len(self.levels)) or 'NULL'})")
            params += list(self.levels)
        return where, params

    def select_sql(self) -> tuple[str, list[object]]:
        """The SELECT of the newest `limit` matching alerts (newest first), and its params."""
        where, params = self.conditions()
        sql = (
            f"SELECT alert_id, doc, disposition, reason FROM alerts WHERE "
            f"{' AND '.join(where)} ORDER BY ts DESC, alert_id "
            f"LIMIT {int(self.limit)}"
        )
        return sql, params

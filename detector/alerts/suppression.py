"""Silences and per-rule rate limits: what is sent, what is only stored, and why.

Nothing is dropped silently: a silenced alert is stored (with the silence that matched), and
alerts over a rule's per-minute limit are stored and, when that minute is over, summed up in
one "N alerts suppressed" alert that is sent like any other.
"""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from hpcsec.detector.alerts.model import Alert, highest_level, own_alert
from hpcsec.detector.config.site import Silence, SiteConfig
from hpcsec.detector.core.schema import rfc3339

RATE_LIMIT_RULE_ID = "hpcsec-rate-limited"
MAX_IDS_IN_SUMMARY = 100


@dataclass(frozen=True)
class Decision:
    """The outcome for one batch. `send`: to the outputs (summaries included); `silenced`
    and `rate_limited`: to the store only."""

    send: list[Alert]
    silenced: list[tuple[Alert, Silence]]
    rate_limited: list[Alert]
    summaries: list[Alert]


def silence_reason(silence: Silence) -> str:
    """Why a silenced alert was not sent, as the store shows it."""
    reason = "silenced by " + ", ".join(
        f"{k}={v}"
        for k, v in (
            ("rule_id", silence.rule_id),
            ("host", silence.host),
            ("job", silence.job),
            ("user", silence.user),
        )
        if v is not None
    )
    return f"{reason} ({silence.comment})" if silence.comment else reason


RATE_LIMITED_REASON = "over the per-rule rate limit"


def dispositions(decision: Decision) -> list[tuple[list[Alert], str, str]]:
    """The decision's alerts grouped as (alerts, disposition, reason) for the store: sent
    (summaries included), silenced (by the silence that matched), rate_limited."""
    groups: list[tuple[list[Alert], str, str]] = []
    if decision.send:
        groups.append((decision.send, "sent", ""))
    by_reason: dict[str, list[Alert]] = {}
    for alert, silence in decision.silenced:
        by_reason.setdefault(silence_reason(silence), []).append(alert)
    groups.extend((alerts, "silenced", reason) for reason, alerts in by_reason.items())
    if decision.rate_limited:
        groups.append((decision.rate_limited, "rate_limited", RATE_LIMITED_REASON))
    return groups


@dataclass
class _Window:
    minute: int  # epoch minute the counts belong to
    sent: int = 0
    suppressed: list[Alert] = field(default_factory=list)


class Suppressor:
    def __init__(
        self,
        silences: tuple[Silence, ...] = (),
        rate_limit_per_rule: int = 0,
        clock: Callable[[], datetime] | None = None,
    ):
        self.silences = silences
        self.rate_limit = rate_limit_per_rule
        self._clock = clock or (lambda: datetime.now(UTC))
        self._windows: dict[str, _Window] = {}

    @classmethod
    def from_config(cls, config: SiteConfig, **kwargs: Any) -> Suppressor:
        return cls(config.silences, config.rate_limit_per_rule, **kwargs)

    def reconfigure(self, config: SiteConfig) -> None:
        """New silences and limit (SIGHUP); counts of the current minute carry over."""
        self.silences = config.silences
        self.rate_limit = config.rate_limit_per_rule

    def silence_for(self, alert: Alert, now: datetime) -> Silence | None:
        return next((s for s in self.silences if s.matches(alert, now)), None)

    def apply(self, alerts: list[Alert]) -> Decision:
        now = self._clock()
        minute = int(now.timestamp() // 60)
        summaries = self._close_windows(before=minute)
        send: list[Alert] = []
        silenced: list[tuple[Alert, Silence]] = []
        limited: list[Alert] = []
        for alert in alerts:
            silence = self.silence_for(alert, now)
            if silence is not None:
                silenced.append((alert, silence))
                continue
            if self.rate_limit <= 0:
                send.append(alert)
                continue
            rule = str(alert.get("rule.id"))
            window = self._windows.get(rule)
            if window is None or window.minute != minute:
                window = self._windows[rule] = _Window(minute)
            if window.sent < self.rate_limit:
                window.sent += 1
                send.append(alert)
            else:
                window.suppressed.append(alert)
                limited.append(alert)
        return Decision(summaries + send, silenced, limited, summaries)

    def finish(self) -> list[Alert]:
        """Summaries of every window with suppressed alerts, ended or not (end of a scan,
        agent shutdown)."""
        return self._close_windows(before=None)

    def _close_windows(self, before: int | None) -> list[Alert]:
        summaries = []
        for rule, window in list(self._windows.items()):
            if before is not None and window.minute >= before:
                continue
            del self._windows[rule]
            if window.suppressed:
                summaries.append(summary_alert(rule, window.minute, window.suppressed))
        return summaries


def summary_alert(rule_id: str, minute: int, suppressed: list[Alert]) -> Alert:
    """The one alert that stands for a rule's alerts held back in one minute."""
    first, last = suppressed[0], suppressed[-1]
    start = datetime.fromtimestamp(minute * 60, UTC)
    n = len(suppressed)
    title = str(first.get("rule.title", rule_id))
    hosts = sorted({str(a.get("host.name")) for a in suppressed if a.get("host.name")})
    ident = hashlib.sha256(f"{RATE_LIMIT_RULE_ID}\x1f{rule_id}\x1f{minute}".encode())
    return own_alert(
        ident=ident.hexdigest()[:32],
        timestamp=rfc3339(start),
        rule_id=RATE_LIMIT_RULE_ID,
        title=f"Rate limit: {n} alerts suppressed",
        level=highest_level(suppressed),
        tags=first.get("rule.tags") or [],
        vector=first.get("rule.vector", "hpcsec"),
        kind=None,  # a summary stands for alerts of any kind
        host=hosts[0] if len(hosts) == 1 else socket.gethostname(),
        body={
            "events": [],
            "count": n,
            "alert.first_seen": first.get("alert.first_seen", first.get("@timestamp")),
            "alert.last_seen": last.get("alert.last_seen", last.get("@timestamp")),
            "alert.summary": f"{n} alerts suppressed by the rate limit of rule {rule_id} "
            f"({title}) in the minute from {rfc3339(start)}; "
            "they are in the alert store",
            "hpcsec.suppressed.rule_id": rule_id,
            "hpcsec.suppressed.hosts": hosts,
            "hpcsec.suppressed.alert_ids": [
                str(a.get("alert.id")) for a in suppressed[:MAX_IDS_IN_SUMMARY]
            ],
        },
    )

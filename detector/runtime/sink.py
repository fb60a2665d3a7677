"""Where the agent's alerts and events go: silences and rate limits, the durable outputs, the
store; and the agent's own alerts (a failed reload) built to the alert schema.

The main loop calls `emit` with new alerts and `tick` on every turn. Delivery never blocks the
loop for long: `emit` puts alerts in the spool (durable before anything is sent) and makes at
most one attempt per destination; `tick` retries what is left in short slices, so a receiver
that is down costs a retry now and then, not a stalled agent. Store writes are batched: each
opens the DuckDB file (so `hpcsec alerts` can read it in between), which costs tens of
milliseconds, so events are written every EVENTS_FLUSH_S and alerts within ALERTS_FLUSH_S.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TextIO

from hpcsec.detector.alerts.builder import AlertBuilder
from hpcsec.detector.alerts.suppression import Suppressor
from hpcsec.detector.config.site import SiteConfig
from hpcsec.detector.core.schema import Event, parse_time, rfc3339, status_event
from hpcsec.detector.engine.evaluate import Match
from hpcsec.detector.runtime.metrics import AgentMetrics

Alert = dict[str, Any]
RELOAD_FAILED_RULE_ID = "hpcsec-reload-failed"
ALERTS_FLUSH_S = 5.0
EVENTS_FLUSH_S = 60.0
FLUSH_SLICE_S = 0.5  # longest a spool retry holds the main loop
RETRY_IDLE_S = 1.0  # pause between retry rounds that delivered nothing
MAX_BUFFERED_EVENTS = 200_000  # store down: keep at most this many events for it


def log(message: str, out: TextIO | None = None) -> None:
    print(f"hpcsec agent: {message}", file=out or sys.stderr, flush=True)


def internal_alert(
    rule_id: str, title: str, level: str, summary: str, host: str, sensor_event: Event
) -> Alert:
    """An alert about the agent itself, shaped like every other alert."""
    now = rfc3339()
    ident = hashlib.sha256("\x1f".join([rule_id, host, now, summary]).encode()).hexdigest()[:32]
    return {
        "alert.id": ident,
        "@timestamp": now,
        "rule.id": rule_id,
        "rule.title": title,
        "rule.level": level,
        "rule.tags": [],
        "rule.vector": "hpcsec",
        "rule.kind": "internal",
        "host.name": host,
        "alert.summary": summary,
        "alert.first_seen": now,
        "alert.last_seen": now,
        "events": [sensor_event],
        "count": 1,
    }


def reload_failed_alert(error: str, host: str) -> Alert:
    event = status_event("agent", "reload_failed", error, host, rfc3339())
    return internal_alert(
        RELOAD_FAILED_RULE_ID,
        "Rule or config reload failed; the previous set keeps running",
        "high",
        f"Reload of rules and config failed, the previous ones keep running: {error}",
        host,
        event,
    )


def file_stamp(path: str | None) -> tuple:
    """Identity of a file's content for "did it change": a rotated secret reopens outputs."""
    if not path:
        return (None,)
    try:
        st = os.stat(path)
    except OSError:
        return (path, None)
    return (path, st.st_ino, st.st_mtime_ns, st.st_size)


def open_alert_outputs(
    urls: tuple[str, ...], secret_file: str | None, spool_dir: str | None, config: SiteConfig
) -> Any:
    """The OutputSet; with no output configured, stdout (the journal, under systemd)."""
    from hpcsec.detector.outputs.registry import open_outputs

    return open_outputs(
        list(urls or ("-",)), secret_file=secret_file, spool_dir=spool_dir, config=config
    )


def open_alert_store(path: str | None, retention_days: int) -> Any:
    if not path:
        return None
    from hpcsec.detector.store.alert_store import Store

    # A short lock wait: `hpcsec alerts` reading the file must not stall the agent for long
    # (the write is retried at the next flush).
    return Store(path, retention_days=retention_days, lock_wait_s=0.5)


class WindowedDedup:
    """The AlertBuilder of a process that never ends: dedup state is dropped window by window.

    Dedup folds matches per window of event time (`dedup_window_s`), and alert ids are per
    window, so an ended window's open alerts can only grow by late matches. At each window
    boundary the builder becomes `previous` (which still takes matches whose event time is in
    an earlier window: a sample that straddled the boundary) and a fresh one takes the rest;
    the one before is forgotten. Memory: two windows of open alerts.
    """

    def __init__(self, window_s: int, clock: Callable[[], float] = time.time):
        self.window_s = max(int(window_s), 1)
        self._clock = clock
        self.builder = AlertBuilder(dedup=True, window_s=self.window_s)
        self.previous: AlertBuilder | None = None
        self.window = self._window_of(self._clock())

    def _window_of(self, epoch: float) -> int:
        return int(epoch // self.window_s)

    def rotate(self) -> list[Alert]:
        """Start a new window when the clock passed a boundary; returns the forgotten
        builder's alerts (their final counts, for the store)."""
        window = self._window_of(self._clock())
        if window <= self.window:
            return []
        forgotten = self.previous.alerts() if self.previous is not None else []
        self.previous = self.builder
        self.builder = AlertBuilder(dedup=True, window_s=self.window_s)
        self.window = window
        return forgotten

    def _late(self, match: Match) -> bool:
        if match.window_start is not None:  # correlations: ids by their own window
            return False
        try:
            when = parse_time(str(match.events[0].get("@timestamp"))).timestamp()
        except ValueError:
            return False
        return self._window_of(when) < self.window

    def add(self, matches: list[Match]) -> list[Alert]:
        if self.previous is None:
            return self.builder.add(matches)
        late = [m for m in matches if self._late(m)]
        if not late:
            return self.builder.add(matches)
        current = [m for m in matches if not self._late(m)]
        return self.previous.add(late) + self.builder.add(current)

    def alerts(self) -> list[Alert]:
        return (self.previous.alerts() if self.previous is not None else []) + self.builder.alerts()


class AlertSink:
    """Suppression, store and outputs for the alerts of the running agent."""

    def __init__(self, suppressor: Suppressor, outputs: Any, store: Any, metrics: AgentMetrics):
        self.suppressor = suppressor
        self.outputs = outputs  # OutputSet or None
        self.store = store  # Store or None
        self.metrics = metrics
        self._events: list[Event] = []
        self._alerts: list[tuple[list[Alert], str, str]] = []
        self._outcomes: list[Any] = []
        self._dispositions: dict[str, tuple[str, str]] = {}  # alert id -> (disposition, why)
        self._store_due = time.monotonic() + EVENTS_FLUSH_S
        self._retry_due = 0.0
        self.store_errors = 0

    # -- alerts ------------------------------------------------------------------------------

    def emit(self, alerts: list[Alert]) -> None:
        decision = self.suppressor.apply(alerts)
        self._keep(decision.send, "sent", "")
        for alert, silence in decision.silenced:
            why = f"silence {silence.comment}".strip() if silence.comment else "silence"
            self._keep([alert], "silenced", why)
        self._keep(
            decision.rate_limited,
            "rate_limited",
            f"over {self.suppressor.rate_limit} alerts per minute",
        )
        if decision.send and self.outputs is not None:
            self._delivered(self.outputs.deliver(decision.send, timeout_s=0.0))
            self._retry_due = 0.0  # the rest of the batch goes out in the next tick

    def _keep(self, alerts: list[Alert], disposition: str, reason: str) -> None:
        if not alerts:
            return
        self._alerts.append((alerts, disposition, reason))
        self._store_due = min(self._store_due, time.monotonic() + ALERTS_FLUSH_S)
        for alert in alerts:
            self._dispositions[str(alert.get("alert.id"))] = (disposition, reason)
            self.metrics.alerts.labels(
                str(alert.get("rule.vector")), str(alert.get("rule.level")), disposition
            ).inc()

    def restore_counts(self, alerts: list[Alert]) -> None:
        """Store again the alerts dedup folded repeats into (their `count` grew since)."""
        for alert in alerts:
            known = self._dispositions.pop(str(alert.get("alert.id")), None)
            if known is not None and int(alert.get("count") or 1) > 1:
                self._alerts.append(([alert], *known))

    def _delivered(self, report: Any) -> None:
        self._outcomes.extend(report.outcomes)
        self.spool_depth()  # the gauge follows every delivery round
        for name, dest in report.destinations.items():
            if dest.delivered:
                self.metrics.delivered.labels(name).inc(dest.delivered)
            if dest.failed or dest.dropped:
                self.metrics.delivery_failed.labels(name).inc(dest.failed + dest.dropped)
        for notice in report.notices:  # the spool was full: say so everywhere we can
            log(str(notice.get("alert.summary") or notice.get("rule.title")))
            self._keep([notice], "sent", "")

    # -- events ------------------------------------------------------------------------------

    def keep_events(self, events: list[Event]) -> None:
        if self.store is None:
            return
        self._events.extend(events)
        if len(self._events) > MAX_BUFFERED_EVENTS:  # the store is failing: keep the newest
            del self._events[: len(self._events) - MAX_BUFFERED_EVENTS]

    # -- periodic ----------------------------------------------------------------------------

    def tick(self, now: float) -> float:
        """Retries and store writes that are due; returns seconds until the next one is."""
        if self.outputs is not None and now >= self._retry_due:
            depth = self.spool_depth()
            if depth:
                report = self.outputs.flush(timeout_s=FLUSH_SLICE_S)
                self._delivered(report)
                progressed = any(d.delivered for d in report.destinations.values())
                self._retry_due = time.monotonic() + (0.0 if progressed else RETRY_IDLE_S)
            else:
                self._retry_due = now + RETRY_IDLE_S
        if now >= self._store_due:
            self.flush_store()
        due = self._store_due if self.outputs is None else min(self._retry_due, self._store_due)
        return max(due - time.monotonic(), 0.0)

    def spool_depth(self) -> int:
        if self.outputs is None:
            return 0
        depths = self.outputs.spool_depth()
        for name, depth in depths.items():
            self.metrics.spool_depth.labels(name).set(depth)
        return sum(depths.values())

    def flush_store(self) -> None:
        self._store_due = time.monotonic() + EVENTS_FLUSH_S
        if self.store is None:
            self._alerts, self._outcomes = [], []
            return
        from hpcsec.detector.store.alert_store import StoreError

        try:
            if self._events:
                self.store.insert_events(self._events)
                self._events = []
            while self._alerts:
                alerts, disposition, reason = self._alerts[0]
                self.store.insert_alerts(alerts, disposition, reason)
                self._alerts.pop(0)
            if self._outcomes:
                self.store.record_deliveries(self._outcomes)
                self._outcomes = []
        except StoreError as exc:  # kept in memory (bounded) and written at the next flush
            self.store_errors += 1
            log(f"store: {exc}")

    def prune_store(self) -> None:
        if self.store is None:
            return
        from hpcsec.detector.store.alert_store import StoreError

        try:
            deleted = self.store.prune(datetime.now(UTC))
        except StoreError as exc:
            log(f"store: {exc}")
            return
        if deleted:
            log(f"store: {deleted} events older than {self.store.retention_days} days removed")

    # -- shutdown ----------------------------------------------------------------------------

    def drain(self, timeout_s: float) -> int:
        """Rate-limit summaries, a last delivery round within `timeout_s`, the store; returns
        how many alerts are still spooled (the next start sends them)."""
        summaries = self.suppressor.finish()
        if summaries:
            self._keep(summaries, "sent", "")
            if self.outputs is not None:
                self._delivered(self.outputs.deliver(summaries, timeout_s=0.0))
        left = 0
        if self.outputs is not None:
            deadline = time.monotonic() + max(timeout_s, 0.0)
            while self.spool_depth() and time.monotonic() < deadline:
                self._delivered(self.outputs.flush(timeout_s=deadline - time.monotonic()))
                if self.spool_depth():
                    time.sleep(min(0.2, max(deadline - time.monotonic(), 0.0)))
            left = self.spool_depth()
        self.flush_store()
        return left

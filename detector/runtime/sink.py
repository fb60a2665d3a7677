"""Where the agent's decided alerts and its events go: the durable outputs and the store.

The main loop calls `emit` with each Decision of the alert stage and `tick` on every turn.
Delivery never blocks the loop for long: `emit` puts alerts in the spool (durable before
anything is sent) and makes at most one attempt per destination; `tick` retries what is left
in short slices, so a receiver that is down costs a retry now and then, not a stalled agent.
Store writes are batched: events are written every EVENTS_FLUSH_S (sooner once their JSON
passes EVENTS_FLUSH_BYTES) and alerts within ALERTS_FLUSH_S, each flush as one segment of
the store's journal (store/journal.py; the agent never loads DuckDB, which would cost it
~40 MB). Every APPLY_EVERY_S a short-lived child,
`hpcsec alerts --apply`, moves the segments into the DuckDB file and applies the retention,
so the journal stays small even when no one queries.

Faults of the sink itself (a spool that cannot be written or has unreadable lines, outputs
that keep failing, a store that cannot be written) never stop the agent: each is counted in a
metric, logged, and kept as a health record that the agent turns into a `sensor_status`
event, so the self-health rules (rules/self_health.yml) raise an alert about it.
"""

from __future__ import annotations

import subprocess
import sys
import time

from hpcsec.detector.alerts.model import Alert, level_rank
from hpcsec.detector.alerts.suppression import Decision, dispositions
from hpcsec.detector.core.log import get_logger
from hpcsec.detector.core.schema import Event
from hpcsec.detector.runtime.endpoints import (
    DeliveryOutcome,
    DeliveryReport,
    DestinationReport,
    OutputSet,
)
from hpcsec.detector.runtime.metrics import AgentMetrics
from hpcsec.detector.store.journal import (
    JournalWriter,
    StoreError,
    encode_events,
    encode_records,
)

logger = get_logger(__name__)

ALERTS_FLUSH_S = 5.0
EVENTS_FLUSH_S = 60.0
FLUSH_SLICE_S = 0.5  # longest a spool retry holds the main loop
RETRY_IDLE_S = 1.0  # pause between retry rounds that delivered nothing
# Events are kept for the store as their journal lines, encoded when they are kept (a line is
# about a quarter of the memory of its event's dict). A node's users choose how large their
# events are: 300 sleeping processes with 64 KiB command lines made 38 MB of events per
# sample, gigabytes by the minute. So the store is written as soon as the lines pass
# EVENTS_FLUSH_BYTES; while it cannot be written (a full disk) at most MAX_BUFFERED_EVENTS
# lines and MAX_BUFFERED_BYTES are kept, the newest, and the oldest let go are counted.
EVENTS_FLUSH_BYTES = 4 * 2**20
MAX_BUFFERED_EVENTS = 200_000
MAX_BUFFERED_BYTES = 16 * 2**20
SELF_HEALTH_VECTOR = "self_health"  # rules/self_health.yml
FAILING_REPORT_EVERY_S = 300.0  # a destination that keeps failing is reported this often

# A health record: (component, action, message, extra fields) for a `sensor_status` event.
Health = tuple[str, str, str, dict[str, object]]


class AlertSink:
    """Store and outputs for the alerts of the running agent."""

    def __init__(
        self,
        outputs: OutputSet | None,
        store: JournalWriter | None,
        metrics: AgentMetrics,
        min_level: str = "informational",
        track_lost: bool = False,
    ):
        """`track_lost`: keep the ids of alerts a destination dropped for `take_lost` (the
        hub asks after every batch; the agent, which never asks, keeps none)."""
        self.outputs = outputs
        self.track_lost = track_lost
        self.min_level = min_level  # alerts below it are stored only (`--min-level`)
        self.store = store
        self.metrics = metrics
        self._event_lines: list[bytes] = []  # the events kept for the store, encoded
        self._event_bytes = 0
        self.events_dropped = 0  # events let go while the store could not be written
        self._alerts: list[tuple[list[Alert], str, str]] = []
        self._grown: dict[str, tuple[Alert, str, str]] = {}  # id -> (value, disposition, why)
        self._outcomes: list[DeliveryOutcome] = []
        # ids of alerts a destination let go (a full spool, or memory while its disk is
        # full) since `take_lost` was last asked: never delivered there
        self._lost: set[str] = set()
        self._dispositions: dict[str, tuple[str, str]] = {}  # alert id -> (disposition, why)
        self._store_due = time.monotonic() + EVENTS_FLUSH_S
        self._retry_due = 0.0
        self.store_errors = 0
        self._health: list[Health] = []
        self._failing_reported: dict[str, float] = {}  # destination -> when last reported
        self._applier: subprocess.Popen[bytes] | None = None

    def take_health(self) -> list[Health]:
        """Faults of the sink since the last call, oldest first."""
        health, self._health = self._health, []
        return health

    def _fault(self, component: str, action: str, message: str, **extra: object) -> None:
        logger.warning("%s: %s", component, message)
        self._health.append((component, action, message, extra))

    # -- alerts ------------------------------------------------------------------------------

    def emit(self, decision: Decision) -> None:
        """Keep every alert of the decision for the store; send what is to be sent."""
        floor = level_rank(self.min_level)
        below = [a for a in decision.send if level_rank(a.get("rule.level")) < floor]
        if below:
            sent = [a for a in decision.send if level_rank(a.get("rule.level")) >= floor]
            decision = Decision(sent, decision.silenced, decision.rate_limited, decision.summaries)
            self._keep(below, "below_min_level", f"below --min-level {self.min_level}")
        for alerts, disposition, reason in dispositions(decision):
            self._keep(alerts, disposition, reason)
        for alert in decision.send:  # the detector's own blindness goes to the journal too
            if alert.get("rule.vector") == SELF_HEALTH_VECTOR:
                logger.warning(
                    "self-health alert: %s: %s",
                    alert.get("rule.title"),
                    alert.get("alert.summary", ""),
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

    def restore_counts(self, alerts: list[Alert], *, closed: bool = True) -> None:
        """Store again the alerts dedup folded repeats into (their `count` grew since), with
        the disposition they were decided with, within ALERTS_FLUSH_S. `closed`: dedup has
        let go of these alerts (an ended window, shutdown), so their dispositions are
        forgotten too; the agent's housekeeping passes open alerts that grew."""
        for alert in alerts:
            ident = str(alert.get("alert.id"))
            known = (self._dispositions.pop if closed else self._dispositions.get)(ident, None)
            if known is not None and int(alert.get("count") or 1) > 1:
                self._grown[ident] = (alert, *known)  # the latest value replaces the older
                self._store_due = min(self._store_due, time.monotonic() + ALERTS_FLUSH_S)

    def _delivered(self, report: DeliveryReport) -> None:
        self._outcomes.extend(report.outcomes)
        if self.track_lost:
            self._lost.update(o.alert_id for o in report.outcomes if o.state == "dropped")
        self.spool_depth()  # the gauge follows every delivery round
        for name, dest in report.destinations.items():
            if dest.delivered:
                self.metrics.delivered.labels(name).inc(dest.delivered)
            if dest.failed or dest.dropped:
                self.metrics.delivery_failed.labels(name).inc(dest.failed + dest.dropped)
            self._destination_faults(name, dest)
        for notice in report.notices:  # the spool was full: say so everywhere we can
            logger.warning("%s", notice.get("alert.summary") or notice.get("rule.title"))
            self._keep([Alert(notice)], "sent", "")

    def _destination_faults(self, name: str, dest: DestinationReport) -> None:
        if dest.unspooled:
            self.metrics.unspooled.labels(name).inc(dest.unspooled)
            self._fault(
                "spool",
                "unwritable",
                f"{dest.unspooled} alert(s) for {name} could not be spooled, sent directly: "
                f"{dest.spool_error}",
                **{"hpcsec.count": dest.unspooled, "hpcsec.destination": name},
            )
        if dest.corrupt:
            self.metrics.spool_corrupt.labels(name).inc(dest.corrupt)
            self._fault(
                "spool",
                "corrupt",
                f"{dest.corrupt} unreadable line(s) in the spool for {name}, moved to failed/",
                **{"hpcsec.count": dest.corrupt, "hpcsec.destination": name},
            )
        now = time.monotonic()
        if dest.pending and dest.last_error and not dest.delivered:
            if now - self._failing_reported.get(name, -FAILING_REPORT_EVERY_S) >= (
                FAILING_REPORT_EVERY_S
            ):
                self._failing_reported[name] = now
                self._fault(
                    "outputs",
                    "failing",
                    f"{name}: {dest.pending} alert(s) waiting: {dest.last_error}",
                    **{"hpcsec.count": dest.pending, "hpcsec.destination": name},
                )
        elif dest.delivered:
            self._failing_reported.pop(name, None)  # recovered: the next failure is news

    # -- events ------------------------------------------------------------------------------

    def keep_events(self, events: list[Event]) -> None:
        if self.store is None:
            return
        lines = encode_events(events)
        self._event_lines.extend(lines)
        self._event_bytes += sum(map(len, lines))
        if self._event_bytes >= EVENTS_FLUSH_BYTES:
            self._store_due = 0.0  # written at the next tick, not in a minute
        kept = self._event_lines
        if len(kept) > MAX_BUFFERED_EVENTS or self._event_bytes > MAX_BUFFERED_BYTES:
            self._let_go_oldest()

    def _let_go_oldest(self) -> None:
        """The store is failing: keep the newest events within the bounds, count the rest."""
        kept, size, n = self._event_lines, self._event_bytes, 0
        while n < len(kept) and (len(kept) - n > MAX_BUFFERED_EVENTS or size > MAX_BUFFERED_BYTES):
            size -= len(kept[n])
            n += 1
        del kept[:n]
        self._event_bytes = size
        self.events_dropped += n
        self.metrics.store_events_dropped.inc(n)

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

    def take_lost(self) -> set[str]:
        """Ids of the alerts a destination dropped since the last call (the hub must not
        record them as delivered)."""
        lost, self._lost = self._lost, set()
        return lost

    def unspooled_ids(self) -> set[str]:
        """Ids of the alerts held in memory only, because a spool could not take them (disk
        full): a crash would lose them. Empty (and cheap) when none is held."""
        return set() if self.outputs is None else self.outputs.unspooled_ids()

    def spooled(self) -> int:
        """Alerts waiting in the spools on disk (the next start sends them), not counting
        those held in memory."""
        if self.outputs is None:
            return 0
        return sum(self.outputs.spool_depth(in_memory=False).values())

    def spool_depth(self) -> int:
        if self.outputs is None:
            return 0
        depths = self.outputs.spool_depth()
        for name, depth in depths.items():
            self.metrics.spool_depth.labels(name).set(depth)
        return sum(depths.values())

    def flush_store(self) -> None:
        """Everything buffered for the store as one journal segment. On failure (a full disk)
        nothing is lost: the buffers are kept (events bounded) and written at the next flush."""
        self._store_due = time.monotonic() + EVENTS_FLUSH_S
        if self.store is None:
            self._alerts, self._outcomes, self._grown = [], [], {}
            return
        deliveries = [(o.alert_id, o.destination, o.state, o.error) for o in self._outcomes]
        grown = self._grown_records()
        records = [*self._alerts, *grown]
        try:
            self.store.append(encode_records([], records, deliveries, self._event_lines))
        except StoreError as exc:  # kept in memory (bounded) and written at the next flush
            self.store_errors += 1
            self.metrics.store_errors.inc()
            dropped = (
                f"; {self.events_dropped} event(s) let go so far" if self.events_dropped else ""
            )
            self._fault("store", "write_failed", f"{exc}{dropped}")
            return
        self._event_lines, self._event_bytes = [], 0
        self._alerts, self._outcomes, self._grown = [], [], {}

    def _grown_records(self) -> list[tuple[list[Alert], str, str]]:
        """The counts repeats grew, as alert records after the alerts they update (an id
        stored again replaces the earlier row), grouped by disposition."""
        by_disposition: dict[tuple[str, str], list[Alert]] = {}
        for alert, disposition, reason in self._grown.values():
            by_disposition.setdefault((disposition, reason), []).append(alert)
        return [(alerts, d, r) for (d, r), alerts in by_disposition.items()]

    def apply_store(self) -> None:
        """Start `hpcsec alerts --apply` for the journal unless the last one still runs: DuckDB
        and its memory live in that child for a few seconds, never in the agent."""
        if self.store is None or (self._applier is not None and self._applier.poll() is None):
            return
        if self._applier is not None and self._applier.returncode:
            logger.warning("store: applying the journal failed (exit %d)", self._applier.returncode)
        argv = [sys.executable, "-m", "hpcsec.detector", "alerts", "--apply"]
        argv += ["--store", self.store.path, "--retention-days", str(self.store.retention_days)]
        try:
            self._applier = subprocess.Popen(argv, stdin=subprocess.DEVNULL, close_fds=True)
        except OSError as exc:
            logger.warning("store: cannot start the journal applier: %s", exc)
            self._applier = None

    # -- shutdown ----------------------------------------------------------------------------

    def drain(self, timeout_s: float) -> int:
        """A last delivery round within `timeout_s`, then the store; returns how many alerts
        are still spooled (the next start sends them)."""
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

"""Delivering alerts to every configured output: the OutputSet the scan command and the agent
call, its per-destination lanes, the retry policy and the delivery reports.

Network outputs sit behind a durable spool (spool.py): an alert is on disk before the first
attempt and leaves it only once the receiver has taken it, so an outage or a crash loses
nothing. Local outputs (stdout, JSONL file) are written directly.

A spool that cannot be written (disk full) does not stop delivery: those alerts are held in
memory (bounded by count and size per destination: held.py), sent directly, and spooled
again as soon as the disk takes them (tried about once a second, even while the receiver
is down); each is counted (`unspooled`), and only what does not fit in memory is dropped,
counted, as when the spool is full. `unspooled_ids` names the alerts held so: not durable
yet (the hub does not acknowledge their events).
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from hpcsec.detector.outputs.held import HeldAlerts
from hpcsec.detector.outputs.protocol import Alert, DeliveryFailed, Output
from hpcsec.detector.outputs.spool import Admission, Spool, SpoolEntry, SpoolError

RESPOOL_EVERY_S = 1.0


@dataclass(frozen=True)
class DeliveryOutcome:
    """What happened to one alert at one destination (for the store's deliveries table)."""

    alert_id: str
    destination: str
    state: str  # delivered | pending | failed | dropped
    error: str = ""


@dataclass
class DestinationReport:
    delivered: int = 0
    pending: int = 0  # still in the spool, will be retried
    failed: int = 0  # not retried: refused for good by the receiver (kept in the spool's
    #                  failed/ folder), or a local output that could not write
    dropped: int = 0  # evicted or refused because the spool was full (see notices)
    unspooled: int = 0  # could not be written to the spool (disk full): held in memory
    corrupt: int = 0  # unreadable spool lines moved to failed/
    spool_error: str = ""
    last_error: str = ""


@dataclass
class DeliveryReport:
    destinations: dict[str, DestinationReport] = field(default_factory=dict)
    outcomes: list[DeliveryOutcome] = field(default_factory=list)
    notices: list[Alert] = field(default_factory=list)  # `spool full` alerts raised meanwhile
    spool_dir: str | None = None

    def get(self, name: str) -> DestinationReport:
        return self.destinations.setdefault(name, DestinationReport())

    @property
    def pending(self) -> int:
        return sum(d.pending for d in self.destinations.values())

    @property
    def complete(self) -> bool:
        return all(d.pending == d.failed == d.dropped == 0 for d in self.destinations.values())

    def problems(self) -> list[str]:
        """One line per destination that did not get everything, for stderr."""
        lines = []
        for name, d in self.destinations.items():
            if d.pending:
                why = d.last_error or "time ran out before the receiver took them"
                lines.append(
                    f"{name}: {d.pending} alert(s) not delivered yet, kept in the spool "
                    f"{self.spool_dir} ({why})"
                )
            if d.failed:
                lines.append(
                    f"{name}: {d.failed} alert(s) failed and will not be retried ({d.last_error})"
                )
            if d.dropped:
                lines.append(f"{name}: {d.dropped} alert(s) dropped because the spool is full")
            if d.unspooled:
                lines.append(
                    f"{name}: {d.unspooled} alert(s) could not be spooled, sent directly "
                    f"({d.spool_error})"
                )
            if d.corrupt:
                lines.append(
                    f"{name}: {d.corrupt} unreadable spool line(s) moved to the spool's failed/"
                )
        return lines


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter, per destination; Retry-After wins when given.

    The n-th failure in a row waits a random time between half and all of
    min(cap, base * 2**(n-1)): random so that many agents do not retry a receiver that comes
    back all at once, at least half so that the wait still grows."""

    base_s: float = 0.5
    cap_s: float = 60.0
    max_retry_after_s: float = 3600.0

    def delay(self, failures: int, retry_after: float | None = None) -> float:
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_retry_after_s)
        ceiling = min(self.cap_s, self.base_s * (2 ** max(failures - 1, 0)))
        return random.uniform(ceiling / 2, ceiling)


def _attempt(output: Output, alert: Alert) -> DeliveryFailed | None:
    """One send; its failure, if any, as a DeliveryFailed."""
    try:
        output.send(alert)
    except DeliveryFailed as exc:
        return exc
    except Exception as exc:
        # An output's bug must not stop the agent: the alert stays spooled and the error is
        # reported.
        return DeliveryFailed(f"{type(exc).__name__}: {exc}")
    return None


class _Lane:
    """One durable destination: its spool, its backoff state, one delivery at a time."""

    def __init__(self, output: Output, spool: Spool, policy: RetryPolicy):
        self.output, self.spool, self.policy = output, spool, policy
        self.failures = 0
        self.next_attempt = 0.0
        self.last_error = ""
        self.lock = threading.Lock()
        self.unspooled = HeldAlerts()  # the spool could not take them (disk full)
        self.respool_at = 0.0  # next time.monotonic() to try writing them to the spool again

    def drain(
        self, deadline: float, report: DeliveryReport, sleep: Callable[[float], None]
    ) -> None:
        """Send what the spool holds, oldest first, until it is empty or `deadline` (a
        time.monotonic() value) passes; at least one attempt is made when one is due."""
        with self.lock:
            # before the backoff: a receiver that is down must not keep a freed disk from
            # taking back what waits in memory (a crash would lose it)
            self._respool(report)
            attempted = False
            while True:
                now = time.monotonic()
                if attempted and now >= deadline:
                    break  # a slow receiver must not hold the caller past its timeout
                if self.next_attempt > now:
                    if self.next_attempt >= deadline:
                        break
                    sleep(self.next_attempt - now)
                entry = self.spool.next_entry()
                if entry is None:
                    if not self._send_unspooled(report):
                        break
                    attempted = True
                    continue
                attempted = True
                self._settle(entry, _attempt(self.output, entry.alert), report)
            d = report.get(self.output.name)
            d.pending = self.depth()
            d.corrupt += self.spool.take_corrupt()
            d.last_error = d.last_error or self.last_error

    def depth(self) -> int:
        return self.spool.depth() + len(self.unspooled)

    def admit(self, alerts: Sequence[Alert], report: DeliveryReport) -> None:
        """`alerts` into the spool, after what an unwritable spool left in memory; when the
        spool still cannot be written, they wait in memory (bounded) and go out directly."""
        name = self.output.name
        d = report.get(name)
        held = [*self.unspooled, *alerts]
        try:
            admitted = self.spool.add_many(held)
        except SpoolError as exc:
            d.unspooled += len(alerts)
            d.spool_error = str(exc)
            for lost in self.unspooled.add(alerts):  # memory is bounded too (held.py)
                d.dropped += 1
                report.outcomes.append(
                    DeliveryOutcome(str(lost.get("alert.id")), name, "dropped", str(exc))
                )
            return
        self.unspooled.clear()
        self._admitted(admitted, report)

    def _admitted(self, admitted: Admission, report: DeliveryReport) -> None:
        """What a full spool dropped to take alerts in, into the report."""
        name = self.output.name
        report.get(name).dropped += len(admitted.dropped_ids)
        report.outcomes.extend(
            DeliveryOutcome(i, name, "dropped", "spool full") for i in admitted.dropped_ids
        )
        if admitted.notice is not None:
            report.notices.append(admitted.notice)

    def _respool(self, report: DeliveryReport) -> bool:
        """The alerts held in memory written to the spool, tried at most every
        RESPOOL_EVERY_S (each try writes); True when they are on disk now."""
        if not self.unspooled or time.monotonic() < self.respool_at:
            return False
        self.respool_at = time.monotonic() + RESPOOL_EVERY_S
        try:
            admitted = self.spool.add_many(list(self.unspooled))
        except SpoolError:
            return False
        self.unspooled.clear()
        self._admitted(admitted, report)
        return True

    def unspooled_ids(self) -> set[str]:
        with self.lock:
            return {str(alert.get("alert.id")) for alert in self.unspooled}

    def _send_unspooled(self, report: DeliveryReport) -> bool:
        """One direct attempt for the oldest alert the spool could not take; False when there
        is none. Tried again on disk first, so a freed disk takes them back in order."""
        if not self.unspooled:
            return False
        if self._respool(report):
            return True  # spooled now: the loop sends them from there
        alert = self.unspooled.first()
        failure = _attempt(self.output, alert)
        name = self.output.name
        alert_id = str(alert.get("alert.id"))
        if failure is None:
            self.unspooled.popleft()
            self.failures, self.next_attempt, self.last_error = 0, 0.0, ""
            report.get(name).delivered += 1
            report.outcomes.append(DeliveryOutcome(alert_id, name, "delivered"))
        elif failure.permanent:
            self.unspooled.popleft()
            report.get(name).failed += 1
            report.outcomes.append(DeliveryOutcome(alert_id, name, "failed", str(failure)))
        else:
            self.last_error = str(failure)
            self.failures += 1
            self.next_attempt = time.monotonic() + self.policy.delay(
                self.failures, failure.retry_after
            )
        return True

    def _settle(
        self, entry: SpoolEntry, failure: DeliveryFailed | None, report: DeliveryReport
    ) -> None:
        name = self.output.name
        if failure is None:
            self.spool.remove(entry)
            self.failures, self.next_attempt, self.last_error = 0, 0.0, ""
            report.get(name).delivered += 1
            report.outcomes.append(DeliveryOutcome(entry.alert_id, name, "delivered"))
            return
        self.last_error = str(failure)
        if failure.permanent:
            self.spool.reject(entry, str(failure))
            report.get(name).failed += 1
            report.get(name).last_error = str(failure)
            report.outcomes.append(DeliveryOutcome(entry.alert_id, name, "failed", str(failure)))
            return
        self.failures += 1
        delay = self.policy.delay(self.failures, failure.retry_after)
        self.next_attempt = time.monotonic() + delay


def _send_direct(output: Output, alerts: Sequence[Alert]) -> list[str | None]:
    """Per alert None (written) or the error. A file output writes the whole batch and then
    fsyncs once (its `send_many`)."""
    send_many: Callable[[Sequence[Alert]], list[str | None]] | None = getattr(
        output, "send_many", None
    )
    if send_many is not None:
        return send_many(alerts)
    errors: list[str | None] = []
    for alert in alerts:
        try:
            output.send(alert)
            errors.append(None)
        except DeliveryFailed as exc:
            errors.append(str(exc))
    return errors


class OutputSet:
    """Every configured output. `deliver` spools, then sends; `flush` retries what is left."""

    def __init__(
        self,
        outputs: list[Output],
        spool_dir: str | None,
        spool_max_bytes: int,
        policy: RetryPolicy | None = None,
    ):
        self.outputs = outputs
        self.spool_dir = spool_dir
        self.policy = policy or RetryPolicy()
        self._lanes: list[_Lane] = []
        self._direct: list[Output] = []
        self._sleep: Callable[[float], None] = time.sleep
        try:
            for out in outputs:
                if out.durable:
                    assert spool_dir is not None
                    spool = Spool.open(Path(spool_dir), out.name, max_bytes=spool_max_bytes)
                    self._lanes.append(_Lane(out, spool, self.policy))
                else:
                    self._direct.append(out)
        except BaseException:
            self.close()
            raise

    @property
    def names(self) -> list[str]:
        return [o.name for o in self.outputs]

    def spool_depth(self, *, in_memory: bool = True) -> dict[str, int]:
        """Alerts waiting per destination: spooled, or (`in_memory`) held in memory while
        the spool is unwritable."""
        if not in_memory:
            return {lane.output.name: lane.spool.depth() for lane in self._lanes}
        return {lane.output.name: lane.depth() for lane in self._lanes}

    def unspooled_ids(self) -> set[str]:
        """Ids of the alerts some destination holds in memory because its spool could not
        take them (disk full): not durable yet. Cheap when none is held."""
        held: set[str] = set()
        for lane in self._lanes:
            if lane.unspooled:
                held |= lane.unspooled_ids()
        return held

    def deliver(self, alerts: Sequence[Alert], timeout_s: float = 5.0) -> DeliveryReport:
        report = DeliveryReport(spool_dir=self.spool_dir)
        for out in self._direct:
            self._write_direct(out, alerts, report)
        for lane in self._lanes:
            self._admit(lane, alerts, report)
        self._drain_all(timeout_s, report)
        self._report_pending(alerts, report)
        return report

    @staticmethod
    def _write_direct(out: Output, alerts: Sequence[Alert], report: DeliveryReport) -> None:
        d = report.get(out.name)
        for alert, error in zip(alerts, _send_direct(out, alerts), strict=True):
            alert_id = str(alert.get("alert.id"))
            if error is not None:
                d.failed += 1
                d.last_error = error
                report.outcomes.append(DeliveryOutcome(alert_id, out.name, "failed", error))
            else:
                d.delivered += 1
                report.outcomes.append(DeliveryOutcome(alert_id, out.name, "delivered"))

    @staticmethod
    def _admit(lane: _Lane, alerts: Sequence[Alert], report: DeliveryReport) -> None:
        """`alerts` into the lane's spool; what a full spool dropped goes into the report."""
        with lane.lock:
            lane.admit(alerts, report)

    def _report_pending(self, alerts: Sequence[Alert], report: DeliveryReport) -> None:
        """What is spooled and not settled yet, so the store can show it as pending."""
        settled = {(o.alert_id, o.destination) for o in report.outcomes}
        alert_ids = dict.fromkeys(str(a.get("alert.id")) for a in alerts)
        for lane in self._lanes:
            name = lane.output.name
            report.outcomes.extend(
                DeliveryOutcome(i, name, "pending", report.get(name).last_error)
                for i in alert_ids
                if (i, name) not in settled
            )

    def flush(self, timeout_s: float = 5.0) -> DeliveryReport:
        """Send what the spools hold (leftovers of an earlier run, retries after an outage)."""
        report = DeliveryReport(spool_dir=self.spool_dir)
        self._drain_all(timeout_s, report)
        return report

    def _drain_all(self, timeout_s: float, report: DeliveryReport) -> None:
        deadline = time.monotonic() + max(timeout_s, 0.0)
        if len(self._lanes) == 1:
            self._lanes[0].drain(deadline, report, self._sleep)
            return
        # One thread per destination: a dead receiver must not hold up the healthy ones.
        lock = threading.Lock()

        def run(lane: _Lane) -> None:
            local = DeliveryReport()
            lane.drain(deadline, local, self._sleep)
            with lock:
                report.destinations.update(local.destinations)
                report.outcomes.extend(local.outcomes)

        if self._lanes:
            with ThreadPoolExecutor(max_workers=len(self._lanes)) as pool:
                list(pool.map(run, self._lanes))

    def close(self) -> None:
        for lane in self._lanes:
            lane.spool.close()
        for out in self.outputs:
            with contextlib.suppress(OSError):  # a broken connection has nothing left to lose
                out.close()

    def __enter__(self) -> OutputSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

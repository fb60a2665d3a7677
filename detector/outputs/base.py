"""Output protocol, the URL registry and the OutputSet the scan command and the agent call.

One way to name an output (a contract, the same in the config file and on the command line):
`syslog+udp|tcp|tls://HOST:PORT`, `http(s)://…` (signed webhook), `file:///PATH.jsonl`, `-`.
Network outputs sit behind a durable spool (spool.py): an alert is on disk before the first
attempt and leaves it only once the receiver has taken it, so an outage or a crash loses
nothing. Local outputs (stdout, JSONL file) are written directly.
"""

from __future__ import annotations

import contextlib
import os
import random
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

from hpcsec.detector.config.site import SiteConfig
from hpcsec.detector.core.errors import HpcsecError

Alert = dict[str, Any]


class OutputError(HpcsecError):
    """An output URL or its settings are invalid (unknown type, bad URL, unreadable secret)."""


class DeliveryFailed(Exception):
    """One attempt did not get the alert to the receiver.

    `permanent`: the receiver refused this alert and will refuse it again (HTTP 400, 413, …);
    it is moved aside instead of being retried forever. `retry_after`: seconds the receiver
    asked us to wait (HTTP 429/503 Retry-After).
    """

    def __init__(self, message: str, *, permanent: bool = False, retry_after: float | None = None):
        super().__init__(message)
        self.permanent = permanent
        self.retry_after = retry_after


class Output(Protocol):
    """A destination. `send` delivers one alert or raises DeliveryFailed; it never retries
    itself: retries, backoff and Retry-After are the delivery loop's job (one policy for all)."""

    name: str  # the URL without credentials or query: what reports and the store show
    durable: bool  # True: goes through the spool (network outputs)

    def send(self, alert: Alert) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class OutputOptions:
    """What an output needs besides its URL."""

    secret_file: str | None = None
    syslog_format: str = "json"
    timeout_s: float = 10.0


def redact(url: str) -> str:
    """The URL without user info, query or fragment (webhook URLs often carry tokens)."""
    if url == "-":
        return url
    parts = urlsplit(url)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _open_one(url: str, options: OutputOptions) -> Output:
    # Imported here so `hpcsec alerts` does not pay for httpx and ssl at start-up.
    if url == "-":
        from hpcsec.detector.outputs.stdout import StdoutOutput

        return StdoutOutput()
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "file":
        from hpcsec.detector.outputs.jsonl import JsonlOutput

        return JsonlOutput.from_url(url)
    if scheme in ("syslog+udp", "syslog+tcp", "syslog+tls"):
        from hpcsec.detector.outputs.syslog import SyslogOutput

        return SyslogOutput.from_url(url, options)
    if scheme in ("http", "https"):
        from hpcsec.detector.outputs.webhook import WebhookOutput

        return WebhookOutput.from_url(url, options)
    known = "syslog+udp://, syslog+tcp://, syslog+tls://, http(s)://, file:///….jsonl, -"
    raise OutputError(f"unknown output type {redact(url)!r} (expected one of: {known})")


def open_output(url: str, options: OutputOptions) -> Output:
    if not isinstance(url, str) or not url.strip():
        raise OutputError("empty output URL")
    return _open_one(url.strip(), options)


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


def default_spool_dir() -> str:
    if os.geteuid() == 0:
        return "/var/spool/hpcsec"
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(Path.home(), ".local", "state")
    return os.path.join(state, "hpcsec", "spool")


class _Lane:
    """One durable destination: its spool, its backoff state, one delivery at a time."""

    def __init__(self, output: Output, spool: Any, policy: RetryPolicy):
        self.output, self.spool, self.policy = output, spool, policy
        self.failures = 0
        self.next_attempt = 0.0
        self.last_error = ""
        self.lock = threading.Lock()

    def drain(
        self, deadline: float, report: DeliveryReport, sleep: Callable[[float], None]
    ) -> None:
        name = self.output.name
        with self.lock:
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
                    break
                attempted = True
                try:
                    try:
                        self.output.send(entry.alert)
                    except DeliveryFailed:
                        raise
                    except Exception as exc:
                        # An output's bug must not stop the agent: the alert stays spooled
                        # and the error is reported.
                        raise DeliveryFailed(f"{type(exc).__name__}: {exc}") from exc
                except DeliveryFailed as exc:
                    self.last_error = str(exc)
                    if exc.permanent:
                        self.spool.reject(entry, str(exc))
                        report.get(name).failed += 1
                        report.get(name).last_error = str(exc)
                        report.outcomes.append(
                            DeliveryOutcome(entry.alert_id, name, "failed", str(exc))
                        )
                        continue
                    self.failures += 1
                    delay = self.policy.delay(self.failures, exc.retry_after)
                    self.next_attempt = time.monotonic() + delay
                    continue
                self.spool.remove(entry)
                self.failures, self.next_attempt, self.last_error = 0, 0.0, ""
                report.get(name).delivered += 1
                report.outcomes.append(DeliveryOutcome(entry.alert_id, name, "delivered"))
            d = report.get(name)
            d.pending = self.spool.depth()
            d.last_error = d.last_error or self.last_error


def _try(output: Output, alert: Alert) -> str | None:
    try:
        output.send(alert)
    except DeliveryFailed as exc:
        return str(exc)
    return None


class OutputSet:
    """Every configured output. `deliver` spools, then sends; `flush` retries what is left."""

    def __init__(
        self,
        outputs: list[Output],
        spool_dir: str | None,
        spool_max_bytes: int,
        policy: RetryPolicy | None = None,
    ):
        from hpcsec.detector.outputs.spool import Spool

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

    def spool_depth(self) -> dict[str, int]:
        return {lane.output.name: lane.spool.depth() for lane in self._lanes}

    def deliver(self, alerts: list[Alert], timeout_s: float = 5.0) -> DeliveryReport:
        report = DeliveryReport(spool_dir=self.spool_dir)
        for out in self._direct:
            d = report.get(out.name)
            # A file output writes the whole batch and then fsyncs once.
            send_many = getattr(out, "send_many", None)
            errors = send_many(alerts) if send_many else [_try(out, a) for a in alerts]
            for alert, error in zip(alerts, errors, strict=True):
                alert_id = str(alert.get("alert.id"))
                if error is not None:
                    d.failed += 1
                    d.last_error = error
                    report.outcomes.append(DeliveryOutcome(alert_id, out.name, "failed", error))
                else:
                    d.delivered += 1
                    report.outcomes.append(DeliveryOutcome(alert_id, out.name, "delivered"))
        for lane in self._lanes:
            with lane.lock:
                admitted = lane.spool.add_many(alerts)
            d = report.get(lane.output.name)
            d.dropped += len(admitted.dropped_ids)
            report.outcomes.extend(
                DeliveryOutcome(i, lane.output.name, "dropped", "spool full")
                for i in admitted.dropped_ids
            )
            if admitted.notice is not None:
                report.notices.append(admitted.notice)
        self._drain_all(timeout_s, report)
        # What is spooled and not settled yet, so the store can show it as pending.
        settled = {(o.alert_id, o.destination) for o in report.outcomes}
        for lane in self._lanes:
            name = lane.output.name
            report.outcomes.extend(
                DeliveryOutcome(i, name, "pending", report.get(name).last_error)
                for i in dict.fromkeys(str(a.get("alert.id")) for a in alerts)
                if (i, name) not in settled
            )
        return report

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
                for name, d in local.destinations.items():
                    report.destinations[name] = d
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


def open_outputs(
    urls: list[str] | tuple[str, ...],
    *,
    secret_file: str | None = None,
    spool_dir: str | None = None,
    config: SiteConfig | None = None,
) -> OutputSet:
    """Outputs for `urls` (command line first, else the config's `outputs`).

    Raises OutputError for an unknown type, a malformed URL, a missing or unreadable secret;
    SpoolError when the spool cannot be used.
    """
    config = config or SiteConfig()
    options = OutputOptions(
        secret_file=secret_file or config.webhook_secret_file, syslog_format=config.syslog_format
    )
    outputs: list[Output] = []
    seen: set[str] = set()
    try:
        for url in urls or config.outputs:
            out = open_output(url, options)
            if out.name in seen:
                raise OutputError(f"output {out.name!r} is given twice")
            seen.add(out.name)
            outputs.append(out)
    except BaseException:
        for out in outputs:
            out.close()
        raise
    durable = any(o.durable for o in outputs)
    spool = (spool_dir or config.spool_dir or default_spool_dir()) if durable else None
    return OutputSet(outputs, spool, config.spool_max_bytes)

"""`hpcsec agent`: the continuous per-node loop.

    sampler thread (every interval) ─┐
                                     ├─▶ EventQueue (bounded) ─▶ main loop: enrich, evaluate,
    fanotify stream thread ──────────┘                          dedup, silence, store, deliver

The main thread owns everything stateful (enricher, engine, alert builder, outputs, store), so
none of it needs locks. It sleeps on the queue; signal handlers only set flags and wake it.
SIGHUP loads a new generation (config + rules + engine) completely before swapping it in: a
broken rule or config leaves the running generation in place, is logged with its file:line and
raised as an alert. SIGTERM/SIGINT stop the sources, evaluate what is queued, close the rules'
open windows, and give the spool a bounded time to drain before exiting 0.
"""

from __future__ import annotations

import signal
import socket
import time
from dataclasses import dataclass
from typing import Any

from hpcsec.detector.alerts.suppression import Suppressor
from hpcsec.detector.config.site import SiteConfig, load_config
from hpcsec.detector.core.errors import HpcsecError, UsageError
from hpcsec.detector.core.schema import Event, rfc3339, status_event
from hpcsec.detector.engine.evaluate import Engine
from hpcsec.detector.engine.loader import load_rules
from hpcsec.detector.engine.ruleset import RuleSet
from hpcsec.detector.enrich.enricher import Enricher
from hpcsec.detector.runtime import registry
from hpcsec.detector.runtime.metrics import AgentMetrics
from hpcsec.detector.runtime.node import live_context
from hpcsec.detector.runtime.sink import (
    AlertSink,
    WindowedDedup,
    file_stamp,
    log,
    open_alert_outputs,
    open_alert_store,
    reload_failed_alert,
)
from hpcsec.detector.runtime.threads import Chunk, EventQueue, SampledSource, StreamSource
from hpcsec.sensors.base import SensorContext, SensorRun, SensorSpec

STREAM_SENSOR = "file_access"
MAX_BATCH_EVENTS = 4096
QUEUE_MAX_EVENTS = 100_000
IDLE_WAKE_S = 2.0  # the loop looks at deadlines and retries at least this often
SUMMARY_EVERY_S = 15.0  # rate-limit minutes that ended are summed up this soon after
PRUNE_EVERY_S = 3600.0


@dataclass(frozen=True)
class AgentSettings:
    """The command line; each value, when set, wins over the config file's."""

    config_path: str | None = None
    rule_paths: tuple[str, ...] | None = None  # None: the bundled rules
    outputs: tuple[str, ...] = ()
    secret_file: str | None = None
    spool_dir: str | None = None
    store_path: str | None = None
    interval_s: float | None = None
    metrics_address: str | None = None
    sysfs_root: str = "/sys"
    procfs_root: str = "/proc"
    etc_root: str = "/etc"
    sensors: tuple[str, ...] | None = None
    once_for_s: float | None = None
    drain_timeout_s: float = 10.0
    host_name: str | None = None


@dataclass(frozen=True)
class Generation:
    """One consistent config + rule set + engine: what a reload swaps as a whole."""

    config: SiteConfig
    ruleset: RuleSet
    engine: Engine
    enricher: Enricher
    outputs_key: tuple
    store_key: tuple
    interval_s: float


def load_generation(settings: AgentSettings) -> Generation:
    """Config, rules and engine, fully built; raises HpcsecError (with file:line)."""
    config = load_config(settings.config_path)
    ruleset = load_rules(
        list(settings.rule_paths) if settings.rule_paths else None,
        with_tests=False,
        threshold_values=config.thresholds,
    )
    engine = Engine(ruleset, placeholders=config.placeholders())
    interval = settings.interval_s if settings.interval_s is not None else config.interval_s
    if interval <= 0:
        raise UsageError(f"the sampling interval must be positive, not {interval}")
    secret = settings.secret_file or config.webhook_secret_file
    outputs_key = (
        tuple(settings.outputs or config.outputs),
        file_stamp(secret),
        settings.spool_dir or config.spool_dir,
        config.syslog_format,
        config.spool_max_bytes,
    )
    store_key = (settings.store_path or config.store_path, config.retention_days)
    return Generation(config, ruleset, engine, Enricher(config), outputs_key, store_key, interval)


def open_outputs_for(settings: AgentSettings, gen: Generation) -> Any:
    return open_alert_outputs(
        gen.outputs_key[0], settings.secret_file, settings.spool_dir, gen.config
    )


def open_store(gen: Generation) -> Any:
    return open_alert_store(*gen.store_key)


class Agent:
    def __init__(self, settings: AgentSettings, metrics: AgentMetrics | None = None):
        self.settings = settings
        self.metrics = metrics or AgentMetrics()
        self.host = settings.host_name or socket.gethostname().split(".")[0]
        try:
            self.specs: list[SensorSpec] = registry.select(
                list(settings.sensors) if settings.sensors else None
            )
        except KeyError as exc:
            raise UsageError(f"unknown sensor {exc.args[0]}") from None
        self.gen = load_generation(settings)
        self.queue = EventQueue(QUEUE_MAX_EVENTS)
        self.dedup = WindowedDedup(self.gen.config.dedup_window_s)
        self.sink = AlertSink(
            Suppressor.from_config(self.gen.config),
            open_outputs_for(settings, self.gen),
            None,
            self.metrics,
        )
        try:
            self.sink.store = open_store(self.gen)
        except BaseException:
            self._close_outputs()
            raise
        self.sampler: SampledSource | None = None
        self.stream: StreamSource | None = None
        self.metrics_address: str | None = None
        self._stop = False
        self._reload = False
        self._prune_at = time.monotonic()
        self._summary_at = time.monotonic() + SUMMARY_EVERY_S

    # -- sources -----------------------------------------------------------------------------

    def _context(self) -> SensorContext:
        s = self.settings
        return live_context(
            self.gen.config, s.sysfs_root, s.procfs_root, s.etc_root, host_name=self.host
        )

    def _on_run(self, run: SensorRun) -> None:
        self.metrics.events.labels(run.name).inc(len(run.events))
        self.metrics.sensor_up.labels(run.name).set(1 if run.ok else 0)

    def _start_sources(self, state: dict[str, Any] | None = None) -> None:
        sampled = [s for s in self.specs if s.name != STREAM_SENSOR]
        stream_spec = next((s for s in self.specs if s.name == STREAM_SENSOR), None)
        if stream_spec is not None:
            stream = StreamSource(stream_spec, self._context, self.queue, self._on_run)
            run = stream.open()
            self._on_run(run)
            if run.ok:
                self.stream = stream
                stream.start()
            else:  # no fanotify here (not root, old kernel): sample open files instead
                stream.close()
                log(
                    f"file access stream unavailable ({run.status.get('message')}); "
                    "sampling open files every interval instead"
                )
                sampled.append(stream_spec)
        self.sampler = SampledSource(
            sampled,
            self._context,
            self.queue,
            self.gen.interval_s,
            self._on_run,
            self.metrics.sampled,
        )
        if state is not None:
            self.sampler.state = state
        self.sampler.start()

    def _stop_sources(self) -> dict[str, Any]:
        state: dict[str, Any] = {}
        if self.sampler is not None:
            self.sampler.stop()
            state = self.sampler.state
        if self.stream is not None:
            self.stream.stop()
        self.sampler = self.stream = None
        return state

    # -- signals -----------------------------------------------------------------------------

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if signum == signal.SIGHUP:
            self._reload = True
        else:
            self._stop = True
        self.queue.wake()

    def install_signal_handlers(self) -> None:
        for sig in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._on_signal)

    # -- the loop ----------------------------------------------------------------------------

    def run(self) -> int:
        address = self.settings.metrics_address or self.gen.config.metrics_address
        try:
            _server, self.metrics_address = self.metrics.serve(address)
        except BaseException:  # port taken: release the spool for whoever retries
            self._close_outputs()
            raise
        self.metrics.rules_loaded.set(len(self.gen.ruleset.rules))
        self._start_sources()
        # Logged once the sources run: from this line on, file accesses are being watched.
        log(
            f"started: {len(self.gen.ruleset.rules)} rules, sensors "
            f"{', '.join(s.name for s in self.specs)}, every {self.gen.interval_s:g} s; "
            f"metrics at http://{self.metrics_address}/metrics"
        )
        deadline = (
            time.monotonic() + self.settings.once_for_s
            if self.settings.once_for_s is not None
            else None
        )
        wait = 0.0
        while not self._stop:
            if self._reload:
                self._reload = False
                self.reload()
            if deadline is not None and time.monotonic() >= deadline:
                break
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
            chunks = self.queue.get(MAX_BATCH_EVENTS, max(wait, 0.0))
            self.sink.restore_counts(self.dedup.rotate())  # a window boundary passed
            self._process(chunks)
            wait = self._housekeeping()
        return self.shutdown()

    def _drop_events(self) -> list[Chunk]:
        dropped = self.queue.take_dropped()
        if not dropped:
            return []
        events = []
        for sensor, count in sorted(dropped.items()):
            self.metrics.drops.labels(sensor).inc(count)
            events.append(
                status_event(
                    sensor,
                    "dropped",
                    f"{count} events dropped: the agent queue was full",
                    self.host,
                    rfc3339(),
                    **{"hpcsec.dropped": count},
                )
            )
        return [Chunk(None, events)]  # status records: nothing of the node to look at

    def _process(self, chunks: list[Chunk]) -> None:
        chunks = chunks + self._drop_events()
        self.metrics.queue_depth.set(len(self.queue))
        if not chunks:
            return
        gen = self.gen
        events: list[Event] = []
        # Enrich a sample's events together, as scan does: some fields relate events of
        # different sensors read at the same time (the same context).
        groups: list[Chunk] = []
        for chunk in chunks:
            if groups and groups[-1].view is chunk.view:
                groups[-1].events.extend(chunk.events)
            else:
                groups.append(Chunk(chunk.view, list(chunk.events)))
        for group in groups:
            try:
                events.extend(gen.enricher.enrich(group.events, group.view))
            except Exception as exc:  # an enrichment bug must not cost the events
                log(f"enrichment failed, evaluating without it: {type(exc).__name__}: {exc}")
                events.extend(group.events)
        started = time.perf_counter()
        try:
            matches = gen.engine.evaluate(events)
        except Exception as exc:  # an engine bug: say so loudly, keep the agent running
            log(f"rule evaluation failed on {len(events)} events: {type(exc).__name__}: {exc}")
            matches = []
        self.metrics.eval_seconds.observe(time.perf_counter() - started)
        self.metrics.batch_events.observe(len(events))
        self.sink.keep_events(events)
        self.sink.emit(self.dedup.add(matches))

    def _housekeeping(self) -> float:
        now = time.monotonic()
        if now >= self._summary_at:
            self._summary_at = now + SUMMARY_EVERY_S
            if self.sink.suppressor.rate_limit > 0:
                self.sink.emit([])  # closes rate-limit minutes that ended: summaries go out
        if now >= self._prune_at:
            self._prune_at = now + PRUNE_EVERY_S
            self.sink.prune_store()
        return min(self.sink.tick(now), IDLE_WAKE_S)

    # -- reload ------------------------------------------------------------------------------

    def reload(self) -> bool:
        try:
            gen = load_generation(self.settings)
        except HpcsecError as exc:
            return self._reload_failed(str(exc))
        except Exception as exc:  # a loader bug is still a failed reload, not a dead agent
            return self._reload_failed(f"{type(exc).__name__}: {exc}")
        new_store = self.sink.store
        if gen.store_key != self.gen.store_key:
            try:
                new_store = open_store(gen)
            except HpcsecError as exc:
                return self._reload_failed(str(exc))
        if gen.outputs_key != self.gen.outputs_key:
            error = self._swap_outputs(gen)
            if error:
                if new_store is not self.sink.store and new_store is not None:
                    new_store.close()
                return self._reload_failed(error)
        if new_store is not self.sink.store:  # what is buffered belongs to the old store
            self.sink.flush_store()
            if self.sink.store is not None:
                self.sink.store.close()
            self.sink.store = new_store
        old = self.gen
        self.gen = gen
        self.sink.suppressor.reconfigure(gen.config)
        if gen.config.dedup_window_s != old.config.dedup_window_s:
            self.sink.restore_counts(self.dedup.alerts())
            self.dedup = WindowedDedup(gen.config.dedup_window_s)
        if gen.config.assets != old.config.assets and self.stream is not None:
            self._start_sources(self._stop_sources())  # new paths to watch
        elif self.sampler is not None:
            self.sampler.interval_s = gen.interval_s
        self.metrics.reloads.labels("ok").inc()
        self.metrics.rules_loaded.set(len(gen.ruleset.rules))
        log(f"reloaded: {len(gen.ruleset.rules)} rules")
        return True

    def _swap_outputs(self, gen: Generation) -> str | None:
        """Reopen the outputs for the new generation (the spool is locked by its owner, so
        the old set closes first); on failure the old set is reopened. Returns the error."""
        self._close_outputs()
        try:
            self.sink.outputs = open_outputs_for(self.settings, gen)
            return None
        except HpcsecError as exc:
            error = str(exc)
        try:
            self.sink.outputs = open_outputs_for(self.settings, self.gen)
        except HpcsecError as exc:  # e.g. the old secret file is gone too: store-only now
            self.sink.outputs = None
            log(f"outputs could not be reopened, alerts are only stored: {exc}")
        return error

    def _reload_failed(self, error: str) -> bool:
        self.metrics.reloads.labels("failed").inc()
        log(f"reload failed, the previous rules and config keep running: {error}")
        self.sink.emit([reload_failed_alert(error, self.host)])
        return False

    # -- shutdown ----------------------------------------------------------------------------

    def shutdown(self) -> int:
        log("stopping: draining the queue and the spool")
        self._stop_sources()
        while True:
            chunks = self.queue.get(MAX_BATCH_EVENTS, 0.0)
            if not chunks:
                break
            self._process(chunks)
        self._process([])  # drops counted at the very end
        self.sink.emit(self.dedup.add(self.gen.engine.flush()))
        self.sink.restore_counts(self.dedup.alerts())
        left = self.sink.drain(self.settings.drain_timeout_s)
        if left:
            log(f"{left} alert(s) not delivered yet, kept in the spool; the next start sends them")
        self._close_outputs()
        if self.sink.store is not None:
            self.sink.store.close()
        log("stopped")
        return 0

    def _close_outputs(self) -> None:
        if self.sink.outputs is not None:
            self.sink.outputs.close()
            self.sink.outputs = None


def run_agent(settings: AgentSettings) -> int:
    signals = (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)
    previous = {sig: signal.getsignal(sig) for sig in signals}
    # A reload asked for while starting would kill the process (SIGHUP's default); the start
    # reads the newest rules and config anyway, so it is ignored until the handlers are in.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        agent = Agent(settings)
        agent.install_signal_handlers()
        return agent.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

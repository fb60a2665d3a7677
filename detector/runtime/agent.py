"""`hpcsec agent`: the continuous per-node loop.

    sampler thread (every interval) ─┐
                                     ├─▶ EventQueue (bounded) ─▶ main loop: the pipeline
    fanotify stream thread ──────────┘     (enrich, evaluate, dedup, silence), store, deliver

The main thread owns everything stateful (pipeline, alert stage, outputs, store), so none of
it needs locks. It sleeps on the queue; signal handlers only set flags and wake it. SIGHUP
loads a new generation (config + rules + engine) completely before swapping it in: a broken
rule or config leaves the running generation in place, is logged with its file:line and raised
as an alert. SIGTERM/SIGINT stop the sources, evaluate what is queued, close the rules' open
windows, and give the spool a bounded time to drain before exiting 0.
"""

from __future__ import annotations

import signal
import socket
import time
from types import FrameType

from hpcsec.detector.alerts.model import reload_failed_alert
from hpcsec.detector.alerts.stage import AlertStage
from hpcsec.detector.alerts.suppression import Decision
from hpcsec.detector.core.errors import HpcsecError, UsageError
from hpcsec.detector.core.log import get_logger
from hpcsec.detector.core.schema import rfc3339, status_event
from hpcsec.detector.runtime import registry
from hpcsec.detector.runtime.agent_settings import AgentSettings, Generation, load_generation
from hpcsec.detector.runtime.agent_sources import AgentSources
from hpcsec.detector.runtime.endpoints import OutputSet, open_alert_outputs, open_store_journal
from hpcsec.detector.runtime.metrics import AgentMetrics
from hpcsec.detector.runtime.node import live_context
from hpcsec.detector.runtime.pipeline import SourceBatch
from hpcsec.detector.runtime.sink import AlertSink
from hpcsec.detector.runtime.tap import EventTap
from hpcsec.detector.runtime.threads import EventQueue
from hpcsec.detector.store.journal import JournalWriter
from hpcsec.sensors.base import SensorContext, SensorRun, SensorSpec

logger = get_logger(__name__)

MAX_BATCH_EVENTS = 4096
QUEUE_MAX_EVENTS = 100_000
IDLE_WAKE_S = 2.0  # the loop looks at deadlines and retries at least this often
SUMMARY_EVERY_S = 15.0  # rate-limit minutes that ended are summed up this soon after
APPLY_EVERY_S = 3600.0  # the store's journal is moved into DuckDB (and pruned) this often


def _open_outputs(settings: AgentSettings, gen: Generation) -> OutputSet | None:
    """The generation's outputs; with none configured, stdout (the journal, under systemd)."""
    return open_alert_outputs(
        gen.outputs_key.urls,
        secret_file=settings.secret_file,
        spool_dir=settings.spool_dir,
        config=gen.pipeline.config,
        fallback="-",
        private_secret=True,  # a service: a secret others can read is refused, not warned about
    )


def _open_store(gen: Generation) -> JournalWriter | None:
    return open_store_journal(gen.store_key.path, gen.store_key.retention_days)


class Agent:
    def __init__(
        self,
        settings: AgentSettings,
        metrics: AgentMetrics | None = None,
        tap: EventTap | None = None,
    ):
        self.settings = settings
        self.tap = tap  # e.g. the cluster's NATS publisher: events and alerts, never blocking
        self.metrics = metrics or AgentMetrics()
        self.host = settings.host_name or socket.gethostname().split(".")[0]
        try:
            self.specs: list[SensorSpec] = registry.select(
                list(settings.sensors) if settings.sensors else None
            )
        except KeyError as exc:
            raise UsageError(f"unknown sensor {exc.args[0]}") from None
        self.gen = load_generation(settings)
        self._tap_rules()
        self.queue = EventQueue(QUEUE_MAX_EVENTS)
        self.sink = AlertSink(
            _open_outputs(settings, self.gen), None, self.metrics, min_level=settings.min_level
        )
        try:
            self.sink.store = _open_store(self.gen)
        except BaseException:
            self._close_outputs()
            raise
        self.sources = AgentSources(
            self.specs, self._context, self.queue, self._on_run, self.metrics.sampled
        )
        self.metrics_address: str | None = None
        self._stop = False
        self._reload = False
        self._apply_at = time.monotonic() + APPLY_EVERY_S
        self._summary_at = time.monotonic() + SUMMARY_EVERY_S

    @property
    def stage(self) -> AlertStage:
        """The pipeline's alert stage: the same object across reloads."""
        return self.gen.pipeline.stage

    def _context(self) -> SensorContext:
        s = self.settings
        pipeline = self.gen.pipeline
        return live_context(
            pipeline.config,
            s.sysfs_root,
            s.procfs_root,
            s.etc_root,
            host_name=self.host,
            cmdline_literals=pipeline.cmdline_literals,
        )

    def _on_run(self, run: SensorRun) -> None:
        self.metrics.events.labels(run.name).inc(len(run.events))
        self.metrics.sensor_ran(run.name, str(run.status.get("event.action")))

    def _tap_rules(self) -> None:
        if self.tap is not None:
            pipeline = self.gen.pipeline
            self.tap.rules(pipeline.ruleset, pipeline.config.placeholders())

    def _emit(self, decision: Decision) -> None:
        self.sink.emit(decision)
        if self.tap is not None and decision.send:
            self.tap.alerts(decision.send)

    # -- signals -----------------------------------------------------------------------------

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
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
        address = self.settings.metrics_address or self.gen.pipeline.config.metrics_address
        try:
            _server, self.metrics_address = self.metrics.serve(address)
        except BaseException:  # port taken: release the spool for whoever retries
            self._close_outputs()
            raise
        rules = len(self.gen.pipeline.ruleset.rules)
        self.metrics.rules_loaded.set(rules)
        self.sources.start(self.gen.interval_s)
        # Logged once the sources run: from this line on, file accesses are being watched.
        logger.info(
            "started: %d rules, sensors %s, every %g s; metrics at http://%s/metrics",
            rules,
            ", ".join(s.name for s in self.specs),
            self.gen.interval_s,
            self.metrics_address,
        )
        once_for = self.settings.once_for_s
        deadline = time.monotonic() + once_for if once_for is not None else None
        wait = 0.0
        while not self._stop:
            if self._reload:
                self._reload = False
                self.reload()
            if deadline is not None and time.monotonic() >= deadline:
                break
            if deadline is not None:
                wait = min(wait, deadline - time.monotonic())
            batches = self.queue.get(MAX_BATCH_EVENTS, max(wait, 0.0))
            self.sink.restore_counts(self.stage.rotate())  # a window boundary passed
            self._process(batches)
            wait = self._housekeeping()
        return self.shutdown()

    def _drop_events(self) -> list[SourceBatch]:
        """The queue's drops since the last turn, as status events rules can match."""
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
        return [SourceBatch(events, None)]  # about the agent itself: no node to look at

    def _late_events(self) -> list[SourceBatch]:
        """Matches that reached the correlations later than the allowance (since the last
        turn), as a status event rules can match."""
        late = self.gen.pipeline.engine.take_late()
        if not late:
            return []
        event = status_event(
            "engine",
            "late_events",
            f"{late} events arrived later than the correlation lateness allowance "
            "and were not correlated",
            self.host,
            rfc3339(),
            **{"hpcsec.late_events": late},
        )
        return [SourceBatch([event], None)]

    def _health_events(self) -> list[SourceBatch]:
        """Faults of the spool, outputs and store, as status events the self-health rules
        match (rules/self_health.yml)."""
        now = rfc3339()
        events = [
            status_event(component, action, message, self.host, now, **extra)
            for component, action, message, extra in self.sink.take_health()
            + (self.tap.take_health() if self.tap is not None else [])
        ]
        return [SourceBatch(events, None)] if events else []

    def _process(self, batches: list[SourceBatch]) -> None:
        batches = batches + self._drop_events() + self._late_events() + self._health_events()
        self.metrics.queue_depth.set(len(self.queue))
        if not batches:
            return
        step = self.gen.pipeline.process(batches)
        self.metrics.eval_seconds.observe(step.eval_s)
        self.metrics.batch_events.observe(len(step.events))
        self.sink.keep_events(step.events)
        if self.tap is not None:
            self.tap.events(step.events)
        self._emit(self.stage.decide(step.alerts))

    def _housekeeping(self) -> float:
        # repeats folded since the last turn: the store gets their counts within seconds
        self.sink.restore_counts(self.stage.grown(), closed=False)
        now = time.monotonic()
        if now >= self._summary_at:
            self._summary_at = now + SUMMARY_EVERY_S
            if self.stage.suppressor.rate_limit > 0:
                self._emit(self.stage.due_summaries())
        if now >= self._apply_at:
            self._apply_at = now + APPLY_EVERY_S
            self.sink.apply_store()
        return min(self.sink.tick(now), IDLE_WAKE_S)

    # -- reload ------------------------------------------------------------------------------

    def reload(self) -> bool:
        try:
            gen = load_generation(self.settings, stage=self.stage)
        except HpcsecError as exc:
            return self._reload_failed(str(exc))
        except Exception as exc:  # a loader bug is still a failed reload, not a dead agent
            logger.exception("reload: unexpected error while loading")
            return self._reload_failed(f"{type(exc).__name__}: {exc}")
        error = self._swap_endpoints(gen)
        if error:
            return self._reload_failed(error)
        old, self.gen = self.gen, gen
        self._tap_rules()
        self.sink.restore_counts(self.stage.reconfigure(gen.pipeline.config))
        if gen.pipeline.config.assets != old.pipeline.config.assets and self.sources.stream:
            self.sources.restart(gen.interval_s)  # new paths to watch
        else:
            self.sources.set_interval(gen.interval_s)
        rules = len(gen.pipeline.ruleset.rules)
        self.metrics.reloads.labels("ok").inc()
        self.metrics.rules_loaded.set(rules)
        logger.info("reloaded: %d rules", rules)
        return True

    def _swap_endpoints(self, gen: Generation) -> str | None:
        """Open the new generation's store and outputs where they changed; returns the error
        that keeps the running ones (then nothing changed, but see _swap_outputs)."""
        new_store = self.sink.store
        if gen.store_key != self.gen.store_key:
            try:
                new_store = _open_store(gen)
            except HpcsecError as exc:
                return str(exc)
        if gen.outputs_key != self.gen.outputs_key:
            error = self._swap_outputs(gen)
            if error:
                if new_store is not self.sink.store and new_store is not None:
                    new_store.close()
                return error
        if new_store is not self.sink.store:  # what is buffered belongs to the old store
            self.sink.flush_store()
            if self.sink.store is not None:
                self.sink.store.close()
            self.sink.store = new_store
        return None

    def _swap_outputs(self, gen: Generation) -> str | None:
        """Reopen the outputs for the new generation (the spool is locked by its owner, so
        the old set closes first); on failure the old set is reopened. Returns the error."""
        self._close_outputs()
        try:
            self.sink.outputs = _open_outputs(self.settings, gen)
            return None
        except HpcsecError as exc:
            error = str(exc)
        try:
            self.sink.outputs = _open_outputs(self.settings, self.gen)
        except HpcsecError as exc:  # e.g. the old secret file is gone too: store-only now
            self.sink.outputs = None
            logger.error("outputs could not be reopened, alerts are only stored: %s", exc)
        return error

    def _reload_failed(self, error: str) -> bool:
        self.metrics.reloads.labels("failed").inc()
        logger.error("reload failed, the previous rules and config keep running: %s", error)
        self._emit(self.stage.decide([reload_failed_alert(error, self.host)]))
        return False

    # -- shutdown ----------------------------------------------------------------------------

    def shutdown(self) -> int:
        logger.info("stopping: draining the queue and the spool")
        self.sources.stop()
        while True:
            batches = self.queue.get(MAX_BATCH_EVENTS, 0.0)
            if not batches:
                break
            self._process(batches)
        self._process([])  # drops counted at the very end
        self._emit(self.stage.decide(self.gen.pipeline.flush()))
        self.sink.restore_counts(self.stage.current())
        summaries = self.stage.finish()
        self._emit(Decision(summaries, [], [], summaries))
        self.sink.drain(self.settings.drain_timeout_s)
        spooled, in_memory = self.sink.spooled(), len(self.sink.unspooled_ids())
        if spooled:
            logger.warning(
                "%d alert(s) not delivered yet, kept in the spool; the next start sends them",
                spooled,
            )
        if in_memory:  # the spool could not take them (disk full): nothing can replay them
            logger.error(
                "%d alert(s) not delivered and lost: the spool could not take them (disk full?)",
                in_memory,
            )
        if self.tap is not None and self.tap.close(self.settings.drain_timeout_s):
            logger.warning("cluster publishing: messages not acknowledged yet are kept")
        self._close_outputs()
        if self.sink.store is not None:
            self.sink.store.close()
        logger.info("stopped")
        return 0

    def _close_outputs(self) -> None:
        if self.sink.outputs is not None:
            self.sink.outputs.close()
            self.sink.outputs = None


def run_agent(settings: AgentSettings, tap: EventTap | None = None) -> int:
    signals = (signal.SIGHUP, signal.SIGTERM, signal.SIGINT)
    previous = {sig: signal.getsignal(sig) for sig in signals}
    # A reload asked for while starting would kill the process (SIGHUP's default); the start
    # reads the newest rules and config anyway, so it is ignored until the handlers are in.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        agent = Agent(settings, tap=tap)
        agent.install_signal_handlers()
        return agent.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)

"""Sensor lifecycle, in one place for every command: create, sample, close.

Sensor objects live as long as the set (NVML stays initialised, counters keep their previous
values, the fanotify stream keeps its groups), and every sensor is closed at the end.

`BudgetedSensors` is the agent's way to sample them: every sensor in its own long-lived
thread, each started when the one before has its run (or has read for HANDOVER_S), each
waited for until its own deadline from the sample's start. A sensor still reading
at its deadline is reported `slow` and left to finish in its thread; what it read then comes
with the next sample (it is not discarded: a sensor that is always a little late must not
become a sensor that never reports). A sensor has at most one run in flight, so a stuck one
costs one thread and never piles up work.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace

from hpcsec.detector.core.log import get_logger
from hpcsec.sensors import stalls
from hpcsec.sensors.base import (
    FsRoot,
    Sensor,
    SensorContext,
    SensorRun,
    SensorSpec,
    load_sensor,
    run_sensor,
)
from hpcsec.sensors.snapshot import close_sensor

logger = get_logger(__name__)

SLOW = "slow"
# How long closing waits for a sensor thread still reading before leaving it (a daemon).
CLOSE_WAIT_S = 2.0
# How long a sample waits for one sensor's run before it starts the next one beside it.
HANDOVER_S = 0.1
# How often a caller waiting for a sensor's run looks whether it stalled (SensorSet).
WATCH_S = 0.5


def make_sensor(spec: SensorSpec) -> Sensor:
    """A sensor whose module cannot be imported is reported unavailable (sensors/base.py)."""
    return load_sensor(spec)


class SensorSet:
    """The sensors of `specs`, created once, sampled together, closed together.

    Each sensor runs in a thread of its own, started at its first run and kept until the set
    closes (a sensor may start helpers that live as long as the thread that started them:
    the file-access responder dies with it), while the caller waits, watching: a run stalled
    in a read of a process's memory (sensors/stalls.py) is given up, and the sensor runs
    again in a new thread without that process's memory, rather than the caller (`scan`)
    waiting for it forever."""

    def __init__(self, specs: Iterable[SensorSpec]):
        self.sensors: list[tuple[SensorSpec, Sensor]] = [(s, make_sensor(s)) for s in specs]
        self._lock = threading.RLock()
        self._done = threading.Condition(self._lock)
        self._workers: dict[int, _Worker] = {}  # by position, started at the first run

    def runs(self, ctx: SensorContext) -> Iterator[SensorRun]:
        """Every sensor once, in order, run as the caller iterates (it may stop early);
        absent or failing ones give their status record."""
        for position in range(len(self.sensors)):
            yield self._run(position, ctx)

    def sample(self, ctx: SensorContext) -> list[SensorRun]:
        return list(self.runs(ctx))

    def _run(self, position: int, ctx: SensorContext) -> SensorRun:
        spec, sensor = self.sensors[position]
        with self._done:
            worker = self._workers.get(position)
            if worker is None:
                worker = self._workers[position] = _Worker(spec, sensor, self._lock, self._done)
            late = worker.take()  # of a run left to its thread (stuck_run), ended since
            if late is not None:
                return late  # what it read (a stream's accesses) is not dropped
            if worker.busy:  # stuck in an earlier run: given up now if it may be
                if not _gave_up(spec, worker.thread.ident):
                    return stuck_run(spec, ctx)
                worker = self._workers[position] = worker.successor()
            worker.submit(fork_context(ctx))
            while True:
                self._done.wait(WATCH_S)
                if not worker.busy:
                    run = worker.take()
                    assert run is not None  # a worker that is not busy has its run
                    return run
                seen = stalls.stalled(worker.thread.ident)
                if seen is not None and stalls.at_most_abandoned():
                    return stuck_run(spec, ctx)  # left to its thread: waited for no longer
                if _gave_up(spec, worker.thread.ident):
                    worker = self._workers[position] = worker.successor()
                    worker.submit(fork_context(ctx))

    def close(self) -> None:
        """Close the sensors (from the caller's thread, while their threads still live),
        then end the threads; a sensor whose thread is still reading is left unclosed."""
        with self._done:
            reading = {p for p, w in self._workers.items() if w.busy}
        for position, (_, sensor) in enumerate(self.sensors):
            if position not in reading:
                close_sensor(sensor)
        with self._done:
            for worker in self._workers.values():
                worker.close()
        for worker in self._workers.values():
            worker.thread.join(CLOSE_WAIT_S)
        self._workers.clear()

    def __enter__(self) -> SensorSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _own_root(root: FsRoot) -> FsRoot:
    mine = copy.copy(root)
    mine.refused = []
    return mine


def fork_context(ctx: SensorContext) -> SensorContext:
    """The sample's context for one sensor thread: the same time, config, options and carried
    state, but its own refusal lists, so sensors running at once do not take each other's."""
    return replace(
        ctx,
        sys=_own_root(ctx.sys),
        proc=_own_root(ctx.proc),
        etc=_own_root(ctx.etc),
        refused=[],
    )


def _gave_up(spec: SensorSpec, ident: int | None) -> bool:
    """Whether the sensor thread `ident` was stalled in a read of a process's memory and is
    now given up (its process quarantined): the caller runs the sensor again."""
    seen = stalls.stalled(ident)
    if seen is None:
        return False
    pid = stalls.abandon(ident, seen)
    if pid is None:  # too many given up already (or the read just ended)
        return False
    stalls.log_given_up(pid, f"sensor {spec.name}")
    return True


class _Worker:
    """One sensor's thread: runs the sensor on each context it is given, one run at a time.

    Every field is guarded by the set's lock. Work for this worker wakes this worker only
    (`_wake`); a finished run wakes the sampler only (`done`): one condition shared by every
    thread woke all of them at each hand-over, about a tenth of a sample's CPU."""

    def __init__(
        self, spec: SensorSpec, sensor: Sensor, lock: threading.RLock, done: threading.Condition
    ):
        self.spec, self.sensor = spec, sensor
        self._lock, self._done = lock, done
        self._wake = threading.Condition(lock)
        self.job: SensorContext | None = None
        self.reading: SensorContext | None = None  # the sample it is reading now
        self.result: SensorRun | None = None
        self.closed = False
        self.thread = threading.Thread(
            target=self._loop, name=f"hpcsec-sensor-{spec.name}", daemon=True
        )
        self.thread.start()

    @property
    def busy(self) -> bool:
        return self.job is not None or self.reading is not None

    def submit(self, ctx: SensorContext) -> None:
        self.job = ctx
        self._wake.notify()

    def close(self) -> None:
        self.closed = True
        self.job = None
        self._wake.notify()

    def successor(self) -> _Worker:
        """A new thread for this sensor, this one given up (stalled in a read of a process's
        memory): it ends, its run dropped, once its read returns. The caller holds the lock."""
        self.close()
        return _Worker(self.spec, self.sensor, self._lock, self._done)

    def take(self) -> SensorRun | None:
        result, self.result = self.result, None
        return result

    def _loop(self) -> None:
        with stalls.watched():  # the sampler gives this thread up if a read stalls it
            self._serve()

    def _serve(self) -> None:
        while True:
            with self._wake:
                while self.job is None and not self.closed:
                    self._wake.wait()
                if self.closed:
                    return
                ctx, self.job = self.job, None
                self.reading = ctx
            assert ctx is not None  # the wait above ends on a job or on close
            run = run_sensor(self.spec, self.sensor, ctx)  # never raises (see run_sensor)
            with self._done:
                self.result, self.reading = run, None
                self._done.notify_all()  # the sampler (and close) wait on it


def stuck_run(spec: SensorSpec, ctx: SensorContext) -> SensorRun:
    """The status of a sensor stalled in a read of a process's memory that could not be
    given up (stalls.MAX_ABANDONED are already)."""
    stuck = ", ".join(map(str, stalls.quarantined())) or "none yet"
    message = (
        "stalled in a read of a process's memory, with too many such reads given up already: "
        f"skipped (processes whose memory reads are stuck: {stuck})"
    )
    return SensorRun(spec.name, [], ctx.status(spec.name, SLOW, message))


def slow_run(spec: SensorSpec, ctx: SensorContext, budget_s: float, reading: str) -> SensorRun:
    """The status of a sensor that did not finish within its budget in this sample."""
    message = (
        f"still reading (the sample of {reading}) after its budget of {budget_s:g} s: skipped "
        "in this sample; what it reads comes with the next sample"
    )
    status = ctx.status(spec.name, SLOW, message, **{"hpcsec.budget_s": budget_s})
    return SensorRun(spec.name, [], status)


class BudgetedSensors:
    """The sensors of `specs`, each in its own thread, sampled together within budgets."""

    def __init__(self, specs: Iterable[SensorSpec]):
        self.sensors = SensorSet(specs)
        self._lock = lock = threading.RLock()
        self._cond = threading.Condition(lock)  # a run finished, or the sample is interrupted
        self._interrupted = False
        self.workers = [
            _Worker(spec, sensor, lock, self._cond) for spec, sensor in self.sensors.sensors
        ]

    def sample(self, ctx: SensorContext, budget_s: Callable[[str], float]) -> list[SensorRun]:
        """One sample: late results of the previous samples first, then each sensor's run of
        this one, or its `slow` status when it is still reading at `budget_s(name)` seconds
        after the start. Returns early (with what it has) when interrupted."""
        start = time.monotonic()
        runs: list[SensorRun] = []
        with self._cond:
            for worker in self.workers:
                # taken here, just before the worker is given this sample: a run of an earlier
                # sample may end while the sensors before it read (a new run would overwrite it)
                late = worker.take()
                if late is not None:
                    runs.append(late)
                if worker.busy:
                    if not _gave_up(worker.spec, worker.thread.ident):
                        continue  # still reading an earlier sample
                    worker = self._replace(worker)
                worker.submit(fork_context(ctx))
                # one at a time while each is quick: sensors reading at once fought over the
                # GIL at every file they read (a sample cost 1.2-1.8x the CPU of the same
                # runs in turn); a slow one is given company after HANDOVER_S
                handover = time.monotonic() + HANDOVER_S
                self._wait_while_busy(worker, min(handover, start + budget_s(worker.spec.name)))
                if self._interrupted:
                    break
            for worker in list(self.workers):
                budget = budget_s(worker.spec.name)
                worker = self._wait_watching(worker, ctx, start + budget)
                if self._interrupted:
                    break
                run = worker.take()
                if run is None:
                    reading = worker.reading or worker.job or ctx
                    run = slow_run(worker.spec, ctx, budget, reading.timestamp)
                runs.append(run)
        return runs

    def _wait_watching(self, worker: _Worker, ctx: SensorContext, deadline: float) -> _Worker:
        """_wait_while_busy, looking every WATCH_S whether the worker is stalled in a read of
        a process's memory: then it is given up and a new thread makes this sample's run
        (returned); the caller holds the condition."""
        while True:
            self._wait_while_busy(worker, min(deadline, time.monotonic() + WATCH_S))
            if not worker.busy or self._interrupted or time.monotonic() >= deadline:
                return worker
            if _gave_up(worker.spec, worker.thread.ident):
                worker = self._replace(worker)
                worker.submit(fork_context(ctx))

    def _replace(self, worker: _Worker) -> _Worker:
        """The given-up worker's successor, in its place; the caller holds the condition."""
        fresh = self.workers[self.workers.index(worker)] = worker.successor()
        return fresh

    def _wait_while_busy(self, worker: _Worker, deadline: float) -> None:
        """Until `worker` has its run (or the sample is interrupted), at most to `deadline`
        (monotonic); the caller holds the condition."""
        while worker.busy and not self._interrupted:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._cond.wait(left)

    def interrupt(self) -> None:
        """Make a waiting `sample` return now (the source is stopping)."""
        with self._cond:
            self._interrupted = True
            self._cond.notify_all()

    def close(self) -> None:
        """Stop the threads and close the sensors; a sensor still reading after CLOSE_WAIT_S
        is left to its (daemon) thread unclosed: closing a library mid-call is worse."""
        self.interrupt()
        with self._cond:
            for worker in self.workers:
                worker.close()
        deadline = time.monotonic() + CLOSE_WAIT_S
        for worker in self.workers:
            worker.thread.join(max(deadline - time.monotonic(), 0.0))
            if worker.thread.is_alive():
                logger.warning("sensor %s still reading at shutdown: left open", worker.spec.name)
            else:
                close_sensor(worker.sensor)

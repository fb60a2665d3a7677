"""Where the agent's events come from: sampled sensors and the fanotify stream, each in its own
thread, both feeding one bounded queue that the agent's main loop drains in micro-batches.

The queue is bounded in events, not in items, so a burst of file accesses cannot grow the
agent's memory: what does not fit is dropped, counted per sensor, and reported by the main loop
(a `sensor_status` event with action `dropped` and the `hpcsec_events_dropped_total` metric).
Each batch carries the node view captured in its source thread right after the sensors read
(process fields, Slurm job attribution, hosts): the main loop enriches later, from that view
alone, so it never reads the live node at a time other than the sensors'.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from hpcsec.detector.core.log import get_logger
from hpcsec.detector.core.schema import Event, rfc3339
from hpcsec.detector.enrich.view import NodeView
from hpcsec.detector.runtime.pipeline import SourceBatch, capture
from hpcsec.detector.runtime.sensorset import BudgetedSensors, SensorSet
from hpcsec.sensors.base import SensorContext, SensorRun, SensorSpec

logger = get_logger(__name__)

# A sampled sensor's budget when the site config names none: this share of the interval. The
# sensors run at once, so a sample waits at most this long for the slowest one.
DEFAULT_BUDGET_SHARE = 0.5
# How often the stream thread collects what the fanotify reader folded: the bound on the
# latency it adds between a file access and its evaluation.
STREAM_POLL_S = 0.25


def fair_shares(sizes: list[int], room: int) -> list[int]:
    """How much of each size fits in `room` shared evenly: the smaller ones whole, the
    largest cut to what is left (max-min fairness)."""
    shares = [0] * len(sizes)
    left = room
    order = sorted(range(len(sizes)), key=sizes.__getitem__)
    for n, i in enumerate(order):
        shares[i] = min(sizes[i], left // (len(order) - n))
        left -= shares[i]
    return shares


class EventQueue:
    """Bounded (in events) FIFO of batches between the source threads and the main loop."""

    def __init__(self, max_events: int):
        self.max_events = max_events
        self._batches: deque[SourceBatch] = deque()
        self._size = 0
        self._cond = threading.Condition()
        self._dropped: dict[str, int] = {}

    def __len__(self) -> int:
        return self._size

    def put(self, batch: SourceBatch, sensor: str) -> int:
        """Queue what fits of the batch; returns how many events were dropped."""
        return self.put_many([(batch, sensor)])

    def put_many(self, batches: list[tuple[SourceBatch, str]]) -> int:
        """Queue batches (with the sensor each came from) at once, so the main loop sees a
        whole sample together; what does not fit is dropped and counted per sensor.

        The room left is shared out evenly (`fair_shares`), not first come first served: a
        user who floods one sensor (100,000 sockets) must not crowd out the others' events
        of the same sample, which came after it."""
        lost_total = 0
        with self._cond:
            room = max(self.max_events - self._size, 0)
            shares = fair_shares([len(batch.events) for batch, _ in batches], room)
            for (batch, sensor), share in zip(batches, shares, strict=True):
                kept = batch.events[:share]
                lost = len(batch.events) - len(kept)
                if lost:
                    self._dropped[sensor] = self._dropped.get(sensor, 0) + lost
                    lost_total += lost
                if kept:
                    self._batches.append(SourceBatch(kept, batch.node))
                    self._size += len(kept)
            self._cond.notify()
        return lost_total

    def get(self, max_events: int, timeout: float) -> list[SourceBatch]:
        """Batches holding up to about `max_events` events; waits up to `timeout` for the first.

        A micro-batch is whatever is queued when the loop comes back for more: no extra
        waiting to fill it, so an event is evaluated as soon as the loop is free.
        """
        with self._cond:
            if not self._batches and timeout > 0:
                self._cond.wait(timeout)
            out: list[SourceBatch] = []
            taken = 0
            while self._batches and (not out or taken + len(self._batches[0].events) <= max_events):
                batch = self._batches.popleft()
                out.append(batch)
                taken += len(batch.events)
            self._size -= taken
            return out

    def wake(self) -> None:
        """Make a waiting `get` return now (a signal arrived)."""
        with self._cond:
            self._cond.notify_all()

    def take_dropped(self) -> dict[str, int]:
        with self._cond:
            dropped, self._dropped = self._dropped, {}
        return dropped


SampleHook = Callable[[SensorRun], None]


def _capture(ctx: SensorContext, events: list[Event]) -> tuple[NodeView | None, list[Event]]:
    """The node as enrichment needs it, read in this thread at the sensors' time; a capture
    bug costs the enrichment of these events, never the events."""
    try:
        return capture(ctx, events)
    except Exception as exc:
        logger.exception(
            "node capture failed, enriching without it: %s: %s", type(exc).__name__, exc
        )
        return None, []


def sensor_budget(config: Any, name: str, interval_s: float) -> float:
    """Seconds the sampler waits for sensor `name` in one sample: `agent.sensor_budget_s` of
    the site config (for this sensor, else for every sensor), else DEFAULT_BUDGET_SHARE of
    the interval; never more than the interval, so a sample ends before the next is due."""
    budgets: dict[str, float] = getattr(config, "sensor_budget_s", None) or {}
    budget = budgets.get(name, budgets.get("*", DEFAULT_BUDGET_SHARE * interval_s))
    return min(budget, interval_s)


class _SourceThread:
    def __init__(self, name: str):
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._guarded, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _guarded(self) -> None:
        try:
            self._run()
        except Exception as exc:  # logged with its traceback; the main loop keeps going
            logger.exception("%s stopped: %s: %s", self._thread.name, type(exc).__name__, exc)
        finally:
            self._close()

    def _run(self) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        pass


class SampledSource(_SourceThread):
    """Runs every sampled sensor once per interval, all at once, each on a fork of the same
    fresh context and within its budget (see `sensorset.BudgetedSensors`).

    Sensor objects live as long as the source, and `state` (counter values for deltas,
    firmware versions for changes) is carried from one sample to the next.
    """

    def __init__(
        self,
        specs: list[SensorSpec],
        make_context: Callable[[], SensorContext],
        queue: EventQueue,
        interval_s: float,
        on_run: SampleHook,
        on_sample: Callable[[float], None],
    ):
        super().__init__("hpcsec-sampler")
        self.sensors = BudgetedSensors(specs)
        self.make_context = make_context
        self.queue = queue
        self.interval_s = interval_s
        self.on_run, self.on_sample = on_run, on_sample
        self.state: dict[str, Any] = {}

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self.sensors.interrupt()  # a sample waiting on a slow sensor returns now
        super().stop(timeout)

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.wait(max(next_at - time.monotonic(), 0.0)):
            started = time.monotonic()
            try:
                if not self._sample():
                    return
            except Exception as exc:  # not a sensor's (run_sensor catches those): keep going
                logger.exception("sample failed: %s: %s", type(exc).__name__, exc)
            else:
                self.on_sample(time.monotonic() - started)
            next_at += self.interval_s
            if next_at < time.monotonic():  # a sample took longer than the interval: skip
                next_at = time.monotonic() + self.interval_s

    def _sample(self) -> bool:
        ctx = self.make_context()
        ctx.state = self.state
        if self._stop.is_set():
            return False
        interval = self.interval_s
        runs = self.sensors.sample(ctx, lambda name: sensor_budget(ctx.config, name, interval))
        if self._stop.is_set():
            return False
        for run in runs:
            self.on_run(run)
        # One view for the whole sample: enrichment relates events of different sensors.
        view, status = _capture(ctx, [e for run in runs for e in run.events])
        sample = [(SourceBatch([*run.events, run.status], view), run.name) for run in runs]
        if status:
            sample.append((SourceBatch(status, view), "slurm_jobs"))
        self.queue.put_many(sample)
        return True

    def _close(self) -> None:
        self.sensors.close()


class StreamSource(_SourceThread):
    """The file-access sensor in streaming mode: its fanotify reader folds accesses as they
    happen, and this thread hands them to the queue every STREAM_POLL_S.

    A streaming sensor may offer `pending() -> bool` (accesses, drops or errors waiting to be
    collected; it must be cheap): then an idle poll is that one call instead of a whole
    collect, which is most of what an idle agent spends.
    """

    def __init__(
        self,
        spec: SensorSpec,
        make_context: Callable[[], SensorContext],
        queue: EventQueue,
        on_run: SampleHook,
        poll_s: float = STREAM_POLL_S,
    ):
        super().__init__("hpcsec-stream")
        self.spec = spec
        self.sensors = SensorSet([spec])
        self.sensor = self.sensors.sensors[0][1]
        self.make_context = make_context
        self.queue = queue
        self.on_run = on_run
        self.poll_s = poll_s
        self._base: SensorContext | None = None
        self._reported_ok = False

    def _context(self) -> SensorContext:
        # The roots and config stay for the stream's life (new assets restart it), so each
        # poll copies one context with a new time: a fresh one costs more than the poll.
        if self._base is None:
            self._base = self.make_context()
            self._base.options["stream"] = True
        return replace(self._base, timestamp=rfc3339())

    def open(self) -> SensorRun:
        """Start the fanotify stream (its first collect); the caller looks at the status to
        decide between streaming and the sampled fallback."""
        ctx = self._context()
        (run,) = self.sensors.sample(ctx)
        view, status = _capture(ctx, run.events)
        self.queue.put(SourceBatch([*run.events, *status, run.status], view), self.spec.name)
        self._reported_ok = run.ok  # the caller reports this run
        return run

    def _run(self) -> None:
        pending = getattr(self.sensor, "pending", None)
        while not self._stop.wait(self.poll_s):
            if pending is None or pending():
                self._collect()
        self._collect()  # what the reader folded since the last poll, before stopping

    def _collect(self) -> None:
        ctx = self._context()
        (run,) = self.sensors.sample(ctx)
        if run.events or not (run.ok and self._reported_ok):  # an idle poll changes no metric
            self.on_run(run)
        self._reported_ok = run.ok
        # Idle polls carry no accesses: their `ok` status would only fill the store.
        events = run.events if run.ok else [*run.events, run.status]
        if events:
            view, status = _capture(ctx, events)
            self.queue.put(SourceBatch([*events, *status], view), self.spec.name)

    def _close(self) -> None:
        self.sensors.close()

    def close(self) -> None:
        """Release the fanotify groups of a stream that was opened but never started."""
        self._close()

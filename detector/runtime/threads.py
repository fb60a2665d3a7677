"""Where the agent's events come from: sampled sensors and the fanotify stream, each in its own
thread, both feeding one bounded queue that the agent's main loop drains in micro-batches.

The queue is bounded in events, not in items, so a burst of file accesses cannot grow the
agent's memory: what does not fit is dropped, counted per sensor, and reported by the main loop
(a `sensor_status` event with action `dropped` and the `hpcsec_events_dropped_total` metric).
Each item carries the NodeView captured right after its sensors ran, because enrichment
(the process and Slurm job of a pid) must see the node as the sensors did, not later.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from hpcsec.detector.core.schema import Event, rfc3339
from hpcsec.detector.enrich.view import NodeView, capture_view
from hpcsec.sensors.base import SensorContext, SensorRun, SensorSpec, run_sensor

# How often the stream thread collects what the fanotify reader folded: the bound on the
# latency it adds between a file access and its evaluation.
STREAM_POLL_S = 0.25


@dataclass(frozen=True)
class Chunk:
    """Events of one sensor run, with the node as captured with them (None: nothing to see)."""

    view: NodeView | None
    events: list[Event]


class EventQueue:
    """Bounded (in events) FIFO of chunks between the source threads and the main loop."""

    def __init__(self, max_events: int):
        self.max_events = max_events
        self._chunks: deque[Chunk] = deque()
        self._size = 0
        self._cond = threading.Condition()
        self._dropped: dict[str, int] = {}

    def __len__(self) -> int:
        return self._size

    def put(self, chunk: Chunk, sensor: str) -> int:
        """Queue what fits of the chunk; returns how many events were dropped."""
        return self.put_many([(chunk, sensor)])

    def put_many(self, chunks: list[tuple[Chunk, str]]) -> int:
        """Queue chunks (with the sensor each came from) at once, so the main loop sees a
        whole sample together; what does not fit is dropped and counted per sensor."""
        lost_total = 0
        with self._cond:
            for chunk, sensor in chunks:
                room = max(self.max_events - self._size, 0)
                kept = chunk.events if len(chunk.events) <= room else chunk.events[:room]
                lost = len(chunk.events) - len(kept)
                if lost:
                    self._dropped[sensor] = self._dropped.get(sensor, 0) + lost
                    lost_total += lost
                if kept:
                    self._chunks.append(Chunk(chunk.view, kept))
                    self._size += len(kept)
            self._cond.notify()
        return lost_total

    def get(self, max_events: int, timeout: float) -> list[Chunk]:
        """Chunks holding up to about `max_events` events; waits up to `timeout` for the first.

        A micro-batch is whatever is queued when the loop comes back for more: no extra
        waiting to fill it, so an event is evaluated as soon as the loop is free.
        """
        with self._cond:
            if not self._chunks and timeout > 0:
                self._cond.wait(timeout)
            out: list[Chunk] = []
            taken = 0
            while self._chunks and (not out or taken + len(self._chunks[0].events) <= max_events):
                chunk = self._chunks.popleft()
                out.append(chunk)
                taken += len(chunk.events)
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


def _capture(ctx: SensorContext, events: list[Event]) -> NodeView | None:
    """The node as enrichment needs it; a capture bug must not cost the events."""
    try:
        return capture_view(ctx, events)
    except Exception as exc:
        print(f"hpcsec agent: node capture failed, enriching without it: {exc!r}", file=sys.stderr)
        return None


class _Unloadable:
    """Stands in for a sensor whose module failed to import: every run reports the error
    (run_sensor turns it into an `error` status) instead of taking the agent down."""

    def __init__(self, name: str, error: Exception):
        self.name = name
        self.error = f"cannot load the sensor: {type(error).__name__}: {error}"

    def collect(self, ctx: SensorContext) -> list[Event]:
        raise RuntimeError(self.error)


def make_sensor(spec: SensorSpec) -> Any:
    try:
        return spec.factory()
    except Exception as exc:
        return _Unloadable(spec.name, exc)


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
        finally:
            self._close()

    def _run(self) -> None:
        raise NotImplementedError

    def _close(self) -> None:
        pass


class SampledSource(_SourceThread):
    """Runs every sampled sensor once per interval, each on the same fresh context.

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
        self.sensors = [(spec, make_sensor(spec)) for spec in specs]
        self.make_context = make_context
        self.queue = queue
        self.interval_s = interval_s
        self.on_run, self.on_sample = on_run, on_sample
        self.state: dict[str, Any] = {}

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.wait(max(next_at - time.monotonic(), 0.0)):
            started = time.monotonic()
            try:
                if not self._sample():
                    return
            except Exception as exc:  # not a sensor's (run_sensor catches those): keep going
                print(
                    f"hpcsec agent: sample failed: {type(exc).__name__}: {exc}",
                    file=sys.stderr,
                    flush=True,
                )
            else:
                self.on_sample(time.monotonic() - started)
            next_at += self.interval_s
            if next_at < time.monotonic():  # a sample took longer than the interval: skip
                next_at = time.monotonic() + self.interval_s

    def _sample(self) -> bool:
        ctx = self.make_context()
        ctx.state = self.state
        runs: list[tuple[list[Event], str]] = []
        for spec, sensor in self.sensors:
            if self._stop.is_set():
                return False
            run = run_sensor(spec, sensor, ctx)
            self.on_run(run)
            runs.append(([*run.events, run.status], spec.name))
        # One view for the whole sample: some fields relate events of different sensors.
        view = _capture(ctx, [e for events, _ in runs for e in events])
        self.queue.put_many([(Chunk(view, events), name) for events, name in runs])
        return True

    def _close(self) -> None:
        for _spec, sensor in self.sensors:
            close = getattr(sensor, "close", None)
            if close is not None:
                close()


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
        self.sensor = make_sensor(spec)
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
        run = run_sensor(self.spec, self.sensor, ctx)
        events = [*run.events, run.status]
        self.queue.put(Chunk(_capture(ctx, events), events), self.spec.name)
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
        run = run_sensor(self.spec, self.sensor, ctx)
        if run.events or not (run.ok and self._reported_ok):  # an idle poll changes no metric
            self.on_run(run)
        self._reported_ok = run.ok
        # Idle polls carry no accesses: their `ok` status would only fill the store.
        events = run.events if run.ok else [*run.events, run.status]
        if events:
            self.queue.put(Chunk(_capture(ctx, events), events), self.spec.name)

    def _close(self) -> None:
        close = getattr(self.sensor, "close", None)
        if close is not None:
            close()

    def close(self) -> None:
        """Release the fanotify groups of a stream that was opened but never started."""
        self._close()

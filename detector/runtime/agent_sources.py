"""The agent's source threads: sampled sensors every interval, and the fanotify stream when
the node allows it (else the file-access sensor is sampled like the others)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hpcsec.detector.core.log import get_logger
from hpcsec.detector.runtime.threads import EventQueue, SampledSource, SampleHook, StreamSource
from hpcsec.sensors.base import SensorContext, SensorSpec

logger = get_logger(__name__)

STREAM_SENSOR = "file_access"


class AgentSources:
    def __init__(
        self,
        specs: list[SensorSpec],
        make_context: Callable[[], SensorContext],
        queue: EventQueue,
        on_run: SampleHook,
        on_sample: Callable[[float], None],
    ):
        self.specs = specs
        self.make_context = make_context
        self.queue = queue
        self.on_run, self.on_sample = on_run, on_sample
        self.sampler: SampledSource | None = None
        self.stream: StreamSource | None = None

    def start(self, interval_s: float, state: dict[str, Any] | None = None) -> None:
        """Start the threads; `state`: what the sampled sensors carried over (a restart)."""
        sampled = [s for s in self.specs if s.name != STREAM_SENSOR]
        stream_spec = next((s for s in self.specs if s.name == STREAM_SENSOR), None)
        if stream_spec is not None and not self._start_stream(stream_spec):
            sampled.append(stream_spec)
        self.sampler = SampledSource(
            sampled, self.make_context, self.queue, interval_s, self.on_run, self.on_sample
        )
        if state is not None:
            self.sampler.state = state
        self.sampler.start()

    def _start_stream(self, spec: SensorSpec) -> bool:
        stream = StreamSource(spec, self.make_context, self.queue, self.on_run)
        run = stream.open()
        self.on_run(run)
        if not run.ok:  # no fanotify here (not root, old kernel): sample open files instead
            stream.close()
            logger.warning(
                "file access stream unavailable (%s); sampling open files every interval instead",
                run.status.get("message"),
            )
            return False
        self.stream = stream
        stream.start()
        return True

    def stop(self) -> dict[str, Any]:
        """Stop the threads; returns the sampled sensors' state, for a restart."""
        state: dict[str, Any] = {}
        if self.sampler is not None:
            self.sampler.stop()
            state = self.sampler.state
        if self.stream is not None:
            self.stream.stop()
        self.sampler = self.stream = None
        return state

    def restart(self, interval_s: float) -> None:
        """New paths to watch (the assets changed): the stream starts over."""
        self.start(interval_s, self.stop())

    def set_interval(self, interval_s: float) -> None:
        if self.sampler is not None:
            self.sampler.interval_s = interval_s

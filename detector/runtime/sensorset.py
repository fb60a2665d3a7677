"""Sensor lifecycle, in one place for every command: create, sample, close.

Sensor objects live as long as the set (NVML stays initialised, counters keep their previous
values, the fanotify stream keeps its groups), and every sensor is closed at the end.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from hpcsec.sensors.base import (
    Sensor,
    SensorContext,
    SensorRun,
    SensorSpec,
    load_sensor,
    run_sensor,
)
from hpcsec.sensors.snapshot import close_sensor


def make_sensor(spec: SensorSpec) -> Sensor:
    """A sensor whose module cannot be imported is reported unavailable (sensors/base.py)."""
    return load_sensor(spec)


class SensorSet:
    """The sensors of `specs`, created once, sampled together, closed together."""

    def __init__(self, specs: Iterable[SensorSpec]):
        self.sensors: list[tuple[SensorSpec, Sensor]] = [(s, make_sensor(s)) for s in specs]

    def runs(self, ctx: SensorContext) -> Iterator[SensorRun]:
        """Every sensor once, in order, run as the caller iterates (it may stop early);
        absent or failing ones give their status record."""
        for spec, sensor in self.sensors:
            yield run_sensor(spec, sensor, ctx)

    def sample(self, ctx: SensorContext) -> list[SensorRun]:
        return list(self.runs(ctx))

    def close(self) -> None:
        for _, sensor in self.sensors:
            close_sensor(sensor)

    def __enter__(self) -> SensorSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

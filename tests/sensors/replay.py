"""Replay a snapshot as `scan --snapshot` and `collect --from-snapshot` do: one SensorSet kept
across the samples, each sample's context from the snapshot, sensor state carried over."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hpcsec.detector.runtime.sources import SensorSet
from hpcsec.sensors.base import SensorRun, SensorSpec
from hpcsec.sensors.snapshot import open_snapshot


def replay(
    directory: str | Path,
    specs: list[SensorSpec],
    config: Any = None,
    options: dict[str, Any] | None = None,
) -> list[SensorRun]:
    snapshot = open_snapshot(directory)
    state: dict[str, Any] = {}
    runs: list[SensorRun] = []
    with SensorSet(specs) as sensors:
        for sample in snapshot.samples:
            runs.extend(sensors.sample(sample.context(config, state, options)))
    return runs

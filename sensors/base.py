"""The one interface every sensor implements, and the context it reads the node through.

A sensor never opens `/sys` or `/proc` itself: it reads through `ctx.sys`, `ctx.proc` and
`ctx.etc` (FsRoot), and gets command outputs and library dumps (`rdma -j res show qp`,
NVML, squeue) through `ctx.raw_input(name, live)`. That single seam gives us three things:
tests point the roots at fixture trees; a snapshot records exactly the raw inputs that were
read (FsRoot copies each file it serves); and replaying a snapshot runs the same parsing code
with the roots pointed at the snapshot sample.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Protocol

from hpcsec.detector.core.schema import Event, rfc3339, status_event


class Recorder(Protocol):
    """Receives every raw input a sensor read, to write it into a snapshot sample."""

    def record_file(self, root: str, rel: str, data: bytes) -> None: ...
    def record_link(self, root: str, rel: str, target: str) -> None: ...
    def record_input(self, name: str, data: str) -> None: ...


class FsRoot:
    """A directory tree read as if it were mounted at `/` + `name` (sys, proc, etc)."""

    def __init__(self, name: str, path: str | Path, recorder: Recorder | None = None):
        self.name = name
        self.path = Path(path)
        self.recorder = recorder

    def __repr__(self) -> str:
        return f"FsRoot({self.name!r}, {str(self.path)!r})"

    def _abs(self, rel: str) -> Path:
        return self.path / rel.lstrip("/")

    def exists(self, rel: str) -> bool:
        return self._abs(rel).exists()

    def is_dir(self, rel: str) -> bool:
        return self._abs(rel).is_dir()

    def listdir(self, rel: str = "") -> list[str]:
        """Sorted entries; [] when the directory is absent or unreadable."""
        try:
            return sorted(os.listdir(self._abs(rel)))
        except OSError:
            return []

    def read_bytes(self, rel: str, limit: int = 1 << 16) -> bytes | None:
        """The file's bytes (at most `limit`), or None when absent or unreadable.

        The limit is also the buffer Python allocates for the read, so it stays small: sysfs
        attributes are at most a page, and the /proc files we read are small too.
        """
        try:
            with open(self._abs(rel), "rb") as fh:
                data = fh.read(limit)
        except OSError:
            return None
        if self.recorder is not None:
            self.recorder.record_file(self.name, rel, data)
        return data

    def read_condensed(self, rel: str, condense: Callable[[BinaryIO], bytes]) -> bytes | None:
        """What `condense` keeps of the file, which it reads whole in bounded chunks (a
        cmdline or environ of any length); None when absent or unreadable. A snapshot
        records what was kept."""
        try:
            with open(self._abs(rel), "rb") as fh:
                data = condense(fh)
        except OSError:
            return None
        if self.recorder is not None:
            self.recorder.record_file(self.name, rel, data)
        return data

    def read_text(self, rel: str, limit: int = 1 << 16) -> str | None:
        data = self.read_bytes(rel, limit)
        return None if data is None else data.decode("utf-8", "replace")

    def readlink(self, rel: str) -> str | None:
        try:
            target = os.readlink(self._abs(rel))
        except OSError:
            return None
        if self.recorder is not None:
            self.recorder.record_link(self.name, rel, target)
        return target


@dataclass
class SensorContext:
    """Everything a sensor may look at during one sample."""

    host_name: str
    sys: FsRoot
    proc: FsRoot
    etc: FsRoot
    timestamp: str = field(default_factory=rfc3339)
    config: Any = None  # hpcsec.detector.config.site.SiteConfig
    options: dict[str, Any] = field(default_factory=dict)  # e.g. pcap, watch, duration
    # Sensor state carried from the previous sample (counter values, firmware versions),
    # keyed by sensor name; the sensor owns what it puts there.
    state: dict[str, Any] = field(default_factory=dict)
    # Snapshot replay: name -> stored raw input (None = not in the snapshot). Live: None.
    replay_inputs: dict[str, str | None] | None = None
    recorder: Recorder | None = None

    @property
    def replaying(self) -> bool:
        return self.replay_inputs is not None

    def raw_input(self, name: str, live: Callable[[], str | None]) -> str | None:
        """A command output or library dump by its snapshot file name (e.g. `nvml.json`).

        Replaying, it comes from the snapshot (None if the sample lacks it, and `live` is
        never called); live, `live()` produces it and the recorder keeps a copy.
        """
        if self.replay_inputs is not None:
            return self.replay_inputs.get(name)
        data = live()
        if data is not None and self.recorder is not None:
            self.recorder.record_input(name, data)
        return data

    def status(self, sensor: str, status: str, message: str, **extra: Any) -> Event:
        return status_event(sensor, status, message, self.host_name, self.timestamp, **extra)


class SensorUnavailable(Exception):
    """The source does not exist on this node (no NVML, no InfiniBand): not an error."""


class Sensor(Protocol):
    """A sampled source. `collect` yields events; raise SensorUnavailable when absent."""

    name: str

    def collect(self, ctx: SensorContext) -> Iterable[Event]: ...


@dataclass(frozen=True)
class SensorSpec:
    name: str
    factory: Callable[[], Sensor]
    description: str
    default_enabled: bool = True
    categories: tuple[str, ...] = ()


@dataclass
class SensorRun:
    """What one sensor did in one sample: its events and its status record."""

    name: str
    events: list[Event]
    status: Event

    @property
    def ok(self) -> bool:
        return self.status["event.action"] == "ok"


class _Unloadable:
    """Stands in for a sensor whose module failed to import (a missing or broken library):
    every run reports it unavailable, like any absent source, and the others still run."""

    def __init__(self, name: str, error: Exception):
        self.name = name
        self.error = f"cannot load the sensor: {type(error).__name__}: {error}"

    def collect(self, ctx: SensorContext) -> Iterable[Event]:
        raise SensorUnavailable(self.error)


def load_sensor(spec: SensorSpec) -> Sensor:
    """The sensor of `spec`, or a stand-in that reports why it could not be loaded."""
    try:
        return spec.factory()
    except Exception as exc:
        return _Unloadable(spec.name, exc)


def run_sensor(spec: SensorSpec, sensor: Sensor, ctx: SensorContext) -> SensorRun:
    """Run one sensor; absence and failure become its status record, never an exception."""
    try:
        events = list(sensor.collect(ctx))
    except SensorUnavailable as exc:
        return SensorRun(spec.name, [], ctx.status(spec.name, "unavailable", str(exc)))
    except Exception as exc:  # a sensor bug must not take the node's other sensors down
        return SensorRun(
            spec.name, [], ctx.status(spec.name, "error", f"{type(exc).__name__}: {exc}")
        )
    return SensorRun(
        spec.name,
        events,
        ctx.status(spec.name, "ok", f"{len(events)} events", **{"hpcsec.events": len(events)}),
    )

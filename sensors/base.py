"""The one interface every sensor implements, and the context it reads the node through.

A sensor never opens `/sys` or `/proc` itself: it reads through `ctx.sys`, `ctx.proc` and
`ctx.etc` (FsRoot), and gets command outputs and library dumps (`rdma -j res show qp`,
NVML, squeue) through `ctx.raw_input(name, live)`. That single seam gives us three things:
tests point the roots at fixture trees; a snapshot records exactly the raw inputs that were
read (FsRoot copies each file it serves); and replaying a snapshot runs the same parsing code
with the roots pointed at the snapshot sample.
"""

from __future__ import annotations

import io
import os
import stat
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Protocol

from hpcsec.detector.core.schema import Event, rfc3339, status_event
from hpcsec.detector.core.text import escape_surrogates, from_node_bytes

if TYPE_CHECKING:
    from hpcsec.sensors.cmdline_condense import Literals

# How many of a sample's refused files a sensor's status record names (it counts them all).
MAX_REPORTED_REFUSALS = 10


class Recorder(Protocol):
    """Receives every raw input a sensor read, to write it into a snapshot sample."""

    def record_file(self, root: str, rel: str, data: bytes) -> None: ...
    def record_link(self, root: str, rel: str, target: str) -> None: ...
    def record_input(self, name: str, data: str) -> None: ...


# A recorded cmdline or environ is what `condense` kept (a head, a tail and the indicators
# of a long one): well under this; a larger file in a snapshot was not written by hpcsec.
CONDENSED_RECORD_LIMIT = 1 << 18
# A streamed raw input (`raw_chunks`) is copied for the recorder up to this many characters:
# a longer one (`rdma` listing millions of QPs) is recorded cut there, so recording it never
# holds more, and its replay reads a cut output (which the sensor reports).
RECORDED_STREAM_MAX = 64 << 20


class Refused(Exception):
    """A replayed file that is not plain data inside the snapshot (the message says why)."""


def inside(path: str, jail: str) -> bool:
    return path == jail or path.startswith(jail.rstrip("/") + "/")


def read_confined(path: str | Path, jail: str, limit: int) -> bytes | None:
    """At most `limit` bytes of the regular file `path`, which must resolve inside the
    directory `jail` (a real path); None when it does not exist; Refused for a link out, a
    FIFO, socket or device, or a file larger than `limit` (its first `limit` bytes are not
    returned either: a snapshot hpcsec wrote holds no such file, so the sample is forged).

    A snapshot is a directory its author controls: a `cmdline` linked to a root-only file, a
    FIFO that blocks the reader forever, `proc -> /proc` that would read the live node. The
    type is checked before the open (opening a device can act on it), the open does not
    follow a last link or block, and the opened file is checked again, so a swap between
    the checks gains nothing.
    """
    real = os.path.realpath(path)
    if not inside(real, jail):
        raise Refused(f"links outside the snapshot (to {escape_surrogates(real)})")
    try:
        if not stat.S_ISREG(os.lstat(real).st_mode):
            raise Refused("not a regular file (a FIFO, socket, device or directory)")
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise Refused(f"cannot open: {exc.strerror}") from None
    with open(fd, "rb") as fh:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or not inside(os.readlink(f"/proc/self/fd/{fd}"), jail):
            raise Refused("changed while it was opened")
        if info.st_size > limit:
            raise Refused(f"{info.st_size} bytes, more than the {limit} a sensor reads")
        return fh.read(limit)


class FsRoot:
    """A directory tree read as if it were mounted at `/` + `name` (sys, proc, etc).

    With a `jail` (a snapshot sample being replayed) nothing outside that directory is read
    and only regular files are opened; what is refused is kept in `refused` for the sensor's
    status record (sensors treat it as absent).
    """

    def __init__(
        self,
        name: str,
        path: str | Path,
        recorder: Recorder | None = None,
        jail: str | Path | None = None,
    ):
        self.name = name
        self.path = path  # the setter keeps a Path, and its string for joining
        self.recorder = recorder
        self.jail = None if jail is None else os.path.realpath(jail)
        self.refused: list[str] = []

    @property
    def path(self) -> Path:
        return self._path

    @path.setter
    def path(self, path: str | Path) -> None:
        self._path = Path(path)
        self._root = str(self._path)

    def __repr__(self) -> str:
        return f"FsRoot({self.name!r}, {self._root!r})"

    def full_path(self, rel: str) -> str:
        """Where `rel` is under this root (no jail check: the read methods make it).

        A string, not a Path: a sample opens thousands of files, and pathlib's joining was
        a fifth of the process sensor's time."""
        rel = rel.lstrip("/")
        return os.path.join(self._root, rel) if rel else self._root

    def _confined(self, path: str, rel: str) -> bool:
        """Whether `path` (with its last link followed) stays in the jail; a refusal when not."""
        if self.jail is None or inside(os.path.realpath(path), self.jail):
            return True
        self._refuse(rel, "links outside the snapshot")
        return False

    def _refuse(self, rel: str, why: str) -> None:
        self.refused.append(f"{self.name}/{escape_surrogates(rel.lstrip('/'))}: {why}")

    def exists(self, rel: str) -> bool:
        path = self.full_path(rel)
        return os.path.exists(path) and self._confined(path, rel)

    def is_dir(self, rel: str) -> bool:
        path = self.full_path(rel)
        return os.path.isdir(path) and self._confined(path, rel)

    def listdir(self, rel: str = "") -> list[str]:
        """Sorted entries (names as the OS gives them, for further reads: escape one before
        it goes into an event); [] when the directory is absent or unreadable."""
        path = self.full_path(rel)
        try:
            return sorted(os.listdir(path)) if self._confined(path, rel) else []
        except OSError:
            return []

    def read_bytes(self, rel: str, limit: int = 1 << 16) -> bytes | None:
        """The file's bytes (at most `limit`), or None when absent, unreadable or refused.

        The limit is also the buffer Python allocates for the read, so it stays small: sysfs
        attributes are at most a page, and the /proc files we read are small too.
        """
        if self.jail is None:
            return self._read_live(rel, limit)
        return self._read(rel, limit, lambda fh: fh.read(limit))

    def _read_live(self, rel: str, limit: int) -> bytes | None:
        """read_bytes on the live node: plain reads on a descriptor, without the file
        object `open` builds around it (a third of a small sysfs or proc file's cost)."""
        try:
            # O_NONBLOCK: a FIFO (in a tree given as the root; sysfs and /proc have none)
            # must not hold the read for good; a regular file reads as it would without it
            fd = os.open(self.full_path(rel), os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            return None
        try:
            chunks: list[bytes] = []
            left = limit
            while left > 0:
                chunk = os.read(fd, left)
                if not chunk:
                    break
                chunks.append(chunk)
                left -= len(chunk)
        except OSError:
            return None
        finally:
            os.close(fd)
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        if self.recorder is not None:
            self.recorder.record_file(self.name, rel, data)
        return data

    def read_condensed(self, rel: str, condense: Callable[[BinaryIO], bytes]) -> bytes | None:
        """What `condense` keeps of the file, which it reads whole in bounded chunks (a
        cmdline or environ of any length); None when absent or unreadable. A snapshot
        records what was kept; a replay reads that record inside the snapshot only."""
        return self._read(rel, CONDENSED_RECORD_LIMIT, condense)

    def _read(self, rel: str, replay_limit: int, take: Callable[[BinaryIO], bytes]) -> bytes | None:
        """`take` applied to the file: live, on the open file; replaying, on the bytes read
        inside the snapshot (no link out, no FIFO, at most `replay_limit`). The recorder
        keeps what was taken, so a replay reads exactly that."""
        try:
            if self.jail is not None:
                raw = read_confined(self.full_path(rel), self.jail, replay_limit)
                if raw is None:
                    return None
                data = take(io.BytesIO(raw))
            else:
                with open(self.full_path(rel), "rb", buffering=0) as fh:  # each read a syscall
                    data = take(fh)
        except Refused as exc:
            self._refuse(rel, str(exc))
            return None
        except OSError:
            return None
        if self.recorder is not None:
            self.recorder.record_file(self.name, rel, data)
        return data

    def read_text(self, rel: str, limit: int = 1 << 16) -> str | None:
        """The file as event text (bytes that are not UTF-8 as visible `\\xNN`)."""
        data = self.read_bytes(rel, limit)
        return None if data is None else from_node_bytes(data)

    def readlink(self, rel: str) -> str | None:
        """The link's target as event text; a snapshot records the exact target."""
        path = self.full_path(rel)
        if self.jail is not None and not self._confined(os.path.dirname(path.rstrip("/")), rel):
            return None  # `proc -> /proc` would read the live node's links
        try:
            target = os.readlink(path)
        except OSError:
            return None
        if self.recorder is not None:
            self.recorder.record_link(self.name, rel, target)
        return escape_surrogates(target)


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
    # Snapshot replay: raw inputs the sample holds but that were refused (name -> why).
    refused_inputs: dict[str, str] = field(default_factory=dict)
    refused: list[str] = field(default_factory=list)
    # What the loaded rules look for in a command line, kept first when a long one is
    # condensed (cmdline_condense.Literals); None: flags and URLs only (no rules loaded).
    cmdline_literals: Literals | None = None

    @property
    def replaying(self) -> bool:
        return self.replay_inputs is not None

    def raw_input(self, name: str, live: Callable[[], str | None]) -> str | None:
        """A command output or library dump by its snapshot file name (e.g. `nvml.json`).

        Replaying, it comes from the snapshot (None if the sample lacks it, and `live` is
        never called); live, `live()` produces it and the recorder keeps a copy.
        """
        if self.replay_inputs is not None:
            if name in self.refused_inputs:
                self.refused.append(f"{name}: {self.refused_inputs[name]}")
            return self.replay_inputs.get(name)
        data = live()
        if data is not None and self.recorder is not None:
            self.recorder.record_input(name, data)
        return data

    def raw_chunks(self, name: str, live: Callable[[], Iterable[str]]) -> Iterator[str] | None:
        """`raw_input` for an output read as it arrives, so that a sensor holds only what it
        keeps of it: its text in chunks. Replaying, the stored text as one chunk (None if the
        sample lacks it; `live` is never called); live, `live()`'s chunks, and the recorder
        gets their text, up to RECORDED_STREAM_MAX characters, when the sensor is done with
        them (read to the end, or closed early: what was read)."""
        if self.replay_inputs is not None:
            text = self.raw_input(name, live=lambda: None)
            return None if text is None else iter((text,))
        chunks = iter(live())
        if self.recorder is None:
            return chunks
        return _recording(chunks, name, self.recorder)

    def take_refusals(self) -> list[str]:
        """What a replay refused to read since the last call (see FsRoot)."""
        out = [*self.refused]
        self.refused.clear()
        for root in (self.sys, self.proc, self.etc):
            out.extend(root.refused)
            root.refused.clear()
        return out

    def status(self, sensor: str, status: str, message: str, **extra: Any) -> Event:
        return status_event(sensor, status, message, self.host_name, self.timestamp, **extra)


def _recording(chunks: Iterator[str], name: str, recorder: Recorder) -> Iterator[str]:
    """`chunks`, passed on as they come, then their text (cut) to the recorder. Nothing is
    recorded when reading them failed, as `raw_input` records no output that failed."""
    kept: list[str] = []
    size = 0
    try:
        for chunk in chunks:
            if size < RECORDED_STREAM_MAX:
                kept.append(chunk[: RECORDED_STREAM_MAX - size])
                size += len(kept[-1])
            yield chunk
    except GeneratorExit:  # the sensor stopped reading: what it read is what it saw
        recorder.record_input(name, "".join(kept))
        raise
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
    recorder.record_input(name, "".join(kept))


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
    # Whether its events hold process command lines read now (procinfo.process_fields, by
    # the sensor or by enrichment of the pids it names): only then are the rules loaded for
    # the literals a long one keeps (SensorContext.cmdline_literals).
    command_lines: bool = False


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
    """Run one sensor; absence and failure become its status record, never an exception.
    What a replay refused to read for it is one `malformed` status record among its events
    (also when the sensor then found its source absent: the refusal is why)."""
    ctx.take_refusals()  # those of the sample's setup, not this sensor's
    try:
        events = list(sensor.collect(ctx))
    except SensorUnavailable as exc:
        status = ctx.status(spec.name, "unavailable", str(exc))
        return SensorRun(spec.name, _refusal_events(spec, ctx), status)
    except Exception as exc:  # a sensor bug must not take the node's other sensors down
        status = ctx.status(spec.name, "error", f"{type(exc).__name__}: {exc}")
        return SensorRun(spec.name, _refusal_events(spec, ctx), status)
    events.extend(_refusal_events(spec, ctx))
    return SensorRun(
        spec.name,
        events,
        ctx.status(spec.name, "ok", f"{len(events)} events", **{"hpcsec.events": len(events)}),
    )


def _refusal_events(spec: SensorSpec, ctx: SensorContext) -> list[Event]:
    refusals = ctx.take_refusals()
    if not refusals:
        return []
    message = f"{len(refusals)} snapshot file(s) refused: " + "; ".join(
        refusals[:MAX_REPORTED_REFUSALS]
    )
    return [ctx.status(spec.name, "malformed", message, **{"hpcsec.malformed": len(refusals)})]

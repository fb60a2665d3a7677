"""Node snapshots (contract: docs/architecture.md, "Node snapshot"): record, then replay.

A snapshot stores what the sensors *read*, not the events they made: files under
DIR/<n>/sys|proc|etc in kernel layout (links as symlinks), command outputs and library dumps
as DIR/<n>/<name>, the sample time in DIR/<n>/time, and DIR/meta.json. Replaying points the
roots of a SensorContext at a sample, so the same parsing code runs with no access to the
live system; sensor state is carried from sample to sample, so counter deltas work too.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcsec.detector.core.errors import SourceError, UsageError, location
from hpcsec.detector.core.private_fs import (
    DIR_MODE,
    PrivatePathError,
    make_private_dir,
    open_private_new,
    write_private_file,
)
from hpcsec.detector.core.schema import parse_time, rfc3339
from hpcsec.sensors.base import (
    FsRoot,
    Refused,
    Sensor,
    SensorContext,
    SensorRun,
    SensorSpec,
    load_sensor,
    read_confined,
    run_sensor,
)

FORMAT_VERSION = 1
META = "meta.json"
TIME = "time"
# A raw input (nvml.json, file-events.jsonl, …) is read whole at replay: this bounds it.
RAW_INPUT_MAX = 256 << 20
META_MAX = 1 << 20
TIME_MAX = 256
EPOCH = "1970-01-01T00:00:00.000Z"
# What the enrichment reads from the node's /etc at replay: users and groups are named from
# passwd and group, and hosts tells whether a peer address is a node of the job.
NODE_DATABASE = ("passwd", "group", "hosts")


def _safe_rel(rel: str) -> str | None:
    """`rel` normalised inside its root, or None when it would leave it."""
    norm = os.path.normpath(rel.lstrip("/"))
    if norm in (".", "") or norm.startswith(".."):
        return None
    return norm


class SnapshotWriter:
    """The Recorder of `hpcsec collect --snapshot DIR`.

    Thread-safe, and within one sample the first copy of a file wins, so a process's entry
    stays as it was seen at the access that made us read it. The snapshot is readable by its
    owner only: it holds every process's environment (tokens, keys), which /proc shows to
    the process's own user alone.
    """

    def __init__(self, directory: str | Path, host_name: str):
        self.directory = Path(directory)
        self.host_name = host_name
        self.samples = 0
        self._current: Path | None = None
        self._lock = threading.Lock()
        if self.directory.exists() and (
            not self.directory.is_dir() or any(self.directory.iterdir())
        ):
            raise UsageError(f"snapshot directory {self.directory} exists and is not empty")
        try:
            # An existing empty directory must be ours and closed to others: one made by
            # another user would let them read every environment we record, or swap files.
            make_private_dir(self.directory)
        except PrivatePathError as exc:
            raise UsageError(f"snapshot directory: {exc.message}") from None

    def begin_sample(self) -> Path:
        with self._lock:
            self._current = self.directory / str(self.samples)
            self._current.mkdir(mode=DIR_MODE)
            self.samples += 1
            return self._current

    def write_time(self, timestamp: str) -> None:
        self._write(TIME, (timestamp + "\n").encode(), overwrite=True)

    def finish(self) -> None:
        meta = {
            "hpcsec.snapshot": FORMAT_VERSION,
            "host.name": self.host_name,
            "samples": self.samples,
        }
        write_private_file(self.directory / META, (json.dumps(meta, indent=1) + "\n").encode())

    # Recorder protocol
    def record_file(self, root: str, rel: str, data: bytes) -> None:
        safe = _safe_rel(rel)
        if safe is not None:
            self._write(f"{root}/{safe}", data)

    def record_link(self, root: str, rel: str, target: str) -> None:
        safe = _safe_rel(rel)
        if safe is None:
            return
        with self._lock:
            if self._current is None:
                return
            path = self._current / root / safe
            if path.is_symlink() or path.exists():
                return
            if self._mkdirs(path.parent):
                os.symlink(target, path)

    def record_input(self, name: str, data: str) -> None:
        # Raw inputs are decoded with surrogateescape (see SampleDir.replay_inputs): this
        # writes the bytes the source gave, so the replay decodes the same text.
        if "/" not in name and name not in (TIME, "", ".", ".."):
            self._write(name, data.encode("utf-8", "surrogateescape"))

    def _write(self, rel: str, data: bytes, overwrite: bool = False) -> None:
        with self._lock:
            if self._current is None:
                return
            path = self._current / rel
            if not overwrite and (path.exists() or path.is_symlink()):
                return
            if not self._mkdirs(path.parent):
                return
            if overwrite:
                write_private_file(path, data)
                return
            with open(open_private_new(path), "wb") as fh:
                fh.write(data)

    def _mkdirs(self, directory: Path) -> bool:
        """`directory` and its missing parents inside the sample, each 0700 whatever the umask.

        False when the way there passes through a recorded symlink (`proc/<pid>/root -> /`):
        writing through it would put a file of the node's into the live filesystem."""
        assert self._current is not None
        missing = []
        while directory not in (self._current, directory.parent):
            if directory.is_symlink():
                return False
            if not directory.is_dir():
                missing.append(directory)
            directory = directory.parent
        for each in reversed(missing):
            each.mkdir(mode=DIR_MODE)
        return True


@dataclass(frozen=True)
class SampleDir:
    index: int
    path: Path
    host_name: str

    def jail(self) -> str:
        return os.path.realpath(self.path)

    def timestamp(self) -> str:
        """The sample's `time` (the epoch when the sample has none: every file is optional)."""
        path = self.path / TIME
        try:
            data = read_confined(path, self.jail(), TIME_MAX)
        except Refused as exc:
            raise SourceError(f"refused: {exc}", location(path)) from None
        except OSError as exc:
            raise SourceError(f"cannot read: {exc.strerror}", location(path)) from None
        if data is None:
            return EPOCH
        text = data.decode("utf-8", "replace").strip()
        try:
            parse_time(text)
        except ValueError:
            raise SourceError(f"not an RFC 3339 time: {text[:40]!r}", location(path, 1)) from None
        return text

    def replay_inputs(self) -> tuple[dict[str, str | None], dict[str, str]]:
        """The raw inputs of the sample (name -> text), and those refused (name -> why).

        Decoded with surrogateescape, as the live commands' outputs are: bytes that are not
        UTF-8 come out as they went in, and the sensor escapes them into its events.
        """
        inputs: dict[str, str | None] = {}
        refused: dict[str, str] = {}
        jail = self.jail()
        for entry in sorted(self.path.iterdir()):
            if entry.name == TIME or (entry.is_dir() and not entry.is_symlink()):
                continue  # the sys/proc/etc roots
            try:
                data = read_confined(entry, jail, RAW_INPUT_MAX)
            except (Refused, OSError) as exc:
                refused[entry.name] = str(exc)
                continue
            if data is not None:
                inputs[entry.name] = data.decode("utf-8", "surrogateescape")
        return inputs, refused

    def context(
        self, config: Any, state: dict[str, Any], options: dict[str, Any] | None = None
    ) -> SensorContext:
        """A context whose roots and raw inputs are this sample; `state` carries over.
        Nothing outside the sample directory is read (FsRoot's jail)."""
        jail = self.jail()
        inputs, refused = self.replay_inputs()
        return SensorContext(
            host_name=self.host_name,
            sys=FsRoot("sys", self.path / "sys", jail=jail),
            proc=FsRoot("proc", self.path / "proc", jail=jail),
            etc=FsRoot("etc", self.path / "etc", jail=jail),
            timestamp=self.timestamp(),
            config=config,
            options=dict(options or {}),
            state=state,
            replay_inputs=inputs,
            refused_inputs=refused,
        )


@dataclass(frozen=True)
class Snapshot:
    path: Path
    host_name: str
    samples: tuple[SampleDir, ...]


def open_snapshot(directory: str | Path) -> Snapshot:
    """Read and check DIR/meta.json and the sample directories it announces."""
    root = Path(directory)
    meta_path = root / META
    if not root.is_dir():
        raise UsageError(f"snapshot directory not found: {root}")
    try:
        data = read_confined(meta_path, os.path.realpath(root), META_MAX)
        if data is None:
            raise FileNotFoundError
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise SourceError("missing: not a node snapshot", location(meta_path)) from None
    except (OSError, UnicodeDecodeError, Refused) as exc:
        raise SourceError(f"cannot read: {exc}", location(meta_path)) from None
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SourceError(
            f"invalid JSON: {exc.msg}", location(meta_path, exc.lineno, exc.colno)
        ) from None
    if not isinstance(meta, dict):
        raise SourceError("expected a JSON object", location(meta_path, 1))
    version = meta.get("hpcsec.snapshot")
    if version != FORMAT_VERSION:
        raise SourceError(
            f'"hpcsec.snapshot" must be {FORMAT_VERSION}, not {version!r}', location(meta_path)
        )
    host = meta.get("host.name")
    if not isinstance(host, str) or not host:
        raise SourceError(
            f'"host.name" must be a non-empty string, not {host!r}', location(meta_path)
        )
    count = meta.get("samples")
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise SourceError(
            f'"samples" must be a count (0 or more), not {count!r}', location(meta_path)
        )
    samples = []
    for n in range(count):
        sample = root / str(n)
        if sample.is_symlink():  # `0 -> /` would make the whole node the sample
            raise SourceError(
                f"sample directory {n}/ is a symbolic link (refused)", location(meta_path)
            )
        if not sample.is_dir():
            raise SourceError(
                f'sample directory {n}/ is missing ("samples" is {count})', location(meta_path)
            )
        samples.append(SampleDir(n, sample, host))
    return Snapshot(root, host, tuple(samples))


def close_sensor(sensor: Sensor) -> None:
    """Stop what a streaming sensor started (its `close`, when it has one)."""
    close = getattr(sensor, "close", None)
    if close is not None:
        with contextlib.suppress(Exception):
            close()


def record_snapshot(
    directory: str | Path,
    ctx: SensorContext,
    specs: list[SensorSpec],
    samples: int = 1,
    interval: float = 10.0,
    sleep: Callable[[float], None] = time.sleep,
) -> list[SensorRun]:
    """Run `specs` `samples` times, `interval` seconds apart, recording into `directory`.

    Sample n is opened before the wait that ends at it, so what a streaming sensor reads
    during the interval (the /proc entry of a process at its file access) lands in sample n.
    """
    if samples < 1:
        raise UsageError(f"--samples must be 1 or more, not {samples}")
    writer = SnapshotWriter(directory, ctx.host_name)
    ctx.recorder = writer
    for root in (ctx.sys, ctx.proc, ctx.etc):
        root.recorder = writer
    sensors = [(spec, load_sensor(spec)) for spec in specs]
    runs: list[SensorRun] = []
    try:
        for n in range(samples):
            writer.begin_sample()
            if n:
                sleep(interval)
            ctx.timestamp = rfc3339()
            writer.write_time(ctx.timestamp)
            for name in NODE_DATABASE:
                ctx.etc.read_bytes(name)
            runs.extend(run_sensor(spec, sensor, ctx) for spec, sensor in sensors)
    finally:
        for _, sensor in sensors:
            close_sensor(sensor)
        writer.finish()
    return runs

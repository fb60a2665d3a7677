"""The agent's side of the alert store: compact JSONL segments beside the DuckDB file.

DuckDB in the agent's process would cost it ~40 MB of resident memory for a file it only
appends to. So the agent never imports duckdb: each store flush becomes one segment under
`<store>.journal/`, and the store (alert_store.py) applies the finished segments in name
order, then deletes them, whenever `hpcsec alerts` opens it (or the agent's hourly
`hpcsec alerts --apply` child runs).

A segment is written as a hidden temp file, fsynced, then linked to its final name (which
must not exist yet) and the temp name removed, and the directory fsynced: a segment is either
complete under its final name or not there at all. A writer that dies mid-segment leaves only
a temp file, which the applier ignores and the next agent start removes.

Every event is written by the node's users, and segments hold every process's command line
and environment: the directory is 0700 and owned by us, segments are 0600, created with
O_EXCL|O_NOFOLLOW relative to the directory's descriptor, so no one else can plant, read or
redirect them. A directory that is someone else's, or open to others, is refused.

Records, one JSON array a line:
    ["e", event]
    ["a", disposition, reason, stored_at, alert]
    ["d", alert_id, destination, state, error, updated]
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from hpcsec.detector.core.errors import HpcsecError
from hpcsec.detector.core.jsonenc import dumps

JOURNAL_SUFFIX = ".journal"
SEGMENT_NAME = re.compile(r"^(\d{20})\.jsonl$")
TEMP_PREFIX = ".tmp-"
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
_MAX_NAME_TRIES = 1000  # a writer racing another for names gives up after this many


class StoreError(HpcsecError):
    """The store file or its journal cannot be opened or written."""


def journal_dir(store_path: str | Path) -> Path:
    return Path(str(store_path) + JOURNAL_SUFFIX)


def _now() -> str:
    return datetime.now(UTC).replace(tzinfo=None).isoformat()


def open_private_dir(path: Path, create: bool) -> int:
    """A descriptor of `path`, a directory of ours that no one else can enter (created 0700
    when `create`). Raises StoreError for anything else: a symlink, someone else's directory
    (a user who made `<store>.journal` first), or one others can write or read. Root may read
    (`create` False) the journal of the service account the agent runs as."""
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(path, 0o700)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise StoreError(f"cannot open store journal {path}: {exc.strerror}") from None
    st = os.fstat(fd)
    problem = None
    if st.st_uid != os.geteuid() and (create or os.geteuid() != 0):
        problem = f"owned by uid {st.st_uid}, not by us (uid {os.geteuid()})"
    elif st.st_mode & 0o077:
        problem = f"open to other users (mode {stat.S_IMODE(st.st_mode):04o}); expected 0700"
    if problem:
        os.close(fd)
        raise StoreError(f"refusing store journal {path}: {problem}")
    return fd


def encode_events(events: Iterable[dict[str, Any]]) -> list[bytes]:
    """The event lines of a segment, encoded ahead (the agent keeps its events for the store
    this way: a line is a fraction of the memory of the event it holds)."""
    return [dumps(["e", e]) for e in events]


def encode_records(
    events: Sequence[dict[str, Any]],
    alerts: Iterable[tuple[Sequence[Any], str, str]],
    deliveries: Iterable[tuple[str, str, str, str]],
    event_lines: Sequence[bytes] = (),
) -> bytes:
    """One segment's bytes: events (`event_lines`, encoded ahead by `encode_events`, then
    `events`), then alert batches, then delivery states, in the order the agent decided them
    (a later record of the same alert or delivery wins)."""
    now = _now()
    lines = [*event_lines, *encode_events(events)]
    for batch, disposition, reason in alerts:
        lines.extend(dumps(["a", disposition, reason, now, dict(a)]) for a in batch)
    lines.extend(
        dumps(["d", aid, dest, state, error, now]) for aid, dest, state, error in deliveries
    )
    return b"\n".join(lines) + b"\n" if lines else b""


class JournalWriter:
    """Appends segments for one store; what the agent holds instead of a DuckDB connection."""

    def __init__(self, store_path: str | Path, retention_days: int = 30):
        self.path = str(store_path)
        self.retention_days = retention_days
        self.dir = journal_dir(store_path)
        self._fd = open_private_dir(self.dir, create=True)
        self._seq = 1 + max((seq for seq, _ in list_segments(self._fd)), default=0)
        for name in os.listdir(self._fd):  # a writer that died mid-segment: never committed
            if name.startswith(TEMP_PREFIX):
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=self._fd)

    def append(self, data: bytes) -> str | None:
        """Commit `data` as the next segment; returns its name (None when there was nothing).
        A failed write (a full disk) leaves no segment and no temp file, and is a StoreError:
        the caller keeps the records and tries again."""
        if not data:
            return None
        temp = f"{TEMP_PREFIX}{os.getpid()}-{self._seq}"
        try:
            fd = os.open(temp, _CREATE, 0o600, dir_fd=self._fd)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                os.fsync(fd)
            finally:
                os.close(fd)
            name = self._link(temp)
            os.fsync(self._fd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=self._fd)
            raise StoreError(f"cannot write to store journal {self.dir}: {exc.strerror}") from None
        return name

    def _link(self, temp: str) -> str:
        """Give the temp file the next free segment name; an existing name is never
        replaced (another writer's segment, or one planted there)."""
        for _ in range(_MAX_NAME_TRIES):
            name = f"{self._seq:020d}.jsonl"
            self._seq += 1
            try:
                os.link(temp, name, src_dir_fd=self._fd, dst_dir_fd=self._fd)
            except FileExistsError:
                continue
            os.unlink(temp, dir_fd=self._fd)
            return name
        raise OSError(17, "no free segment name")

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def list_segments(dir_fd: int) -> list[tuple[int, str]]:
    """Committed segments, oldest first (temp files and anything else are ignored)."""
    found = []
    for name in os.listdir(dir_fd):
        m = SEGMENT_NAME.match(name)
        if m:
            found.append((int(m[1]), name))
    return sorted(found)


def read_segment(dir_fd: int, name: str) -> Iterator[list[Any]]:
    """The records of one segment. A file that is not a regular file of the journal's owner
    is skipped; a
    line that does not parse as a record is skipped too (it cannot be applied anyway)."""
    try:
        fd = os.open(name, _READ, dir_fd=dir_fd)
    except OSError:
        return
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.fstat(dir_fd).st_uid:
            return
        for line in f:
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if isinstance(record, list) and record and record[0] in ("e", "a", "d"):
                yield record

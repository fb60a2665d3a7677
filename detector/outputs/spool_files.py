"""Files of one destination's spool: segment names, crash-safe writes, and the open segment.

A segment `N.jsonl` is written once (in tmp/, fsynced, renamed into pending/) and then only
read. `N.marks` beside it is written with it: one byte per line, `0` pending and `1` settled.
Settling a line overwrites its byte in place, which needs no new disk block: a delivery is
recorded even when the filesystem is full, so a restart never sends it again. (Spools of
earlier versions have `N.done` instead, settled line numbers as text; they are still read.)
spool.py keeps the queue's bookkeeping; this module is what touches those files.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import BinaryIO

SEGMENT_NAME = re.compile(r"^\d{20}-\d+-\d{6}\.jsonl$")
NOTICE_NAME = re.compile(r"^\d{20}-\d+-\d{6}-notice\.json$")


def done_name(segment: str) -> str:
    """The legacy .done file that goes with `segment` (N.jsonl -> N.done)."""
    return segment[: -len(".jsonl")] + ".done"


def marks_name(segment: str) -> str:
    """The .marks file that goes with `segment` (N.jsonl -> N.marks)."""
    return segment[: -len(".jsonl")] + ".marks"


PENDING, SETTLED = b"0", b"1"


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(path: Path, data: bytes) -> None:
    """`data` in a new file at `path`, on disk (fsynced) when this returns."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def unlink_quietly(*paths: Path) -> None:
    """Remove what a failed write left behind; a failure to remove changes nothing more."""
    for path in paths:
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)


def settled_lines(pending: Path, segment: str) -> set[int]:
    """Line numbers of `segment` already delivered, as its .marks (or legacy .done) says."""
    done: set[int] = set()
    with contextlib.suppress(FileNotFoundError):
        marks = (pending / marks_name(segment)).read_bytes()
        done.update(i for i, mark in enumerate(marks) if mark == SETTLED[0])
    with contextlib.suppress(FileNotFoundError):
        for line in (pending / done_name(segment)).read_text().split():
            if line.isdigit():
                done.add(int(line))
    return done


class SegmentFiles:
    """The segment being delivered, open for reading, and its .marks file, open for writing.

    Delivery reads one segment line after line and settles its lines in order: keeping both
    files open saves an open and a close per alert."""

    def __init__(self, pending: Path):
        self.pending = pending
        self._reader: tuple[str, BinaryIO] | None = None
        self._marks: tuple[str, int] | None = None  # (segment, fd)
        self.unrecorded = 0  # deliveries whose mark could not be written (sent again later)

    def read(self, segment: str, offset: int, size: int) -> bytes:
        if self._reader is None or self._reader[0] != segment:
            self.close()
            self._reader = (segment, open(self.pending / segment, "rb"))  # noqa: SIM115
        return os.pread(self._reader[1].fileno(), size, offset)

    def read_line(self, segment: str, number: int) -> bytes:
        with open(self.pending / segment, "rb") as fh:
            return fh.readlines()[number]

    def mark_done(self, segment: str, number: int) -> None:
        """Record line `number` of `segment` as settled: one byte overwritten in place, in the
        kernel when this returns (a crash of this process loses none of it). Not fsynced:
        only a power loss can lose it, and then the alert is sent again (at least once)."""
        try:
            if self._marks is None or self._marks[0] != segment:
                self._close_marks()
                path = self.pending / marks_name(segment)
                if path.exists():
                    self._marks = (segment, os.open(path, os.O_WRONLY | os.O_NOFOLLOW))
                else:  # a segment of an earlier version: append to its .done
                    with open(self.pending / done_name(segment), "a") as done:
                        done.write(f"{number}\n")
                    return
            if os.pwrite(self._marks[1], SETTLED, number) != 1:
                raise OSError(0, "short write")
        except OSError:
            # Not recorded (an I/O error; a full disk cannot cause it for .marks): the alert
            # is sent again after a restart; it is not a reason to stop delivering.
            self.unrecorded += 1
            self.close(segment)

    def drop(self, segment: str) -> None:
        """Delete `segment` and its .marks or .done file (every line settled)."""
        self.close(segment)
        (self.pending / segment).unlink(missing_ok=True)
        (self.pending / marks_name(segment)).unlink(missing_ok=True)
        (self.pending / done_name(segment)).unlink(missing_ok=True)

    def _close_marks(self) -> None:
        if self._marks is not None:
            os.close(self._marks[1])
            self._marks = None

    def close(self, segment: str | None = None) -> None:
        """Close the open files (those of `segment` only, if given)."""
        if self._reader is not None and segment in (None, self._reader[0]):
            self._reader[1].close()
            self._reader = None
        if self._marks is not None and segment in (None, self._marks[0]):
            self._close_marks()

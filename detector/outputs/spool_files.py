"""Files of one destination's spool: segment names, crash-safe writes, and the open segment.

A segment `N.jsonl` is written once (in tmp/, fsynced, renamed into pending/) and then only
read; `N.done` beside it lists the line numbers settled since. spool.py keeps the queue's
bookkeeping; this module is what touches those files.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import BinaryIO, TextIO

from hpcsec.detector.core.private_fs import open_private

SEGMENT_NAME = re.compile(r"^\d{20}-\d+-\d{6}\.jsonl$")
NOTICE_NAME = re.compile(r"^\d{20}-\d+-\d{6}-notice\.json$")


def done_name(segment: str) -> str:
    """The .done file that goes with `segment` (N.jsonl -> N.done)."""
    return segment[: -len(".jsonl")] + ".done"


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


def settled_lines(pending: Path, segment: str) -> set[int]:
    """Line numbers of `segment` already delivered, as its .done file lists them."""
    done: set[int] = set()
    with contextlib.suppress(FileNotFoundError):
        for line in (pending / done_name(segment)).read_text().split():
            if line.isdigit():
                done.add(int(line))
    return done


class SegmentFiles:
    """The segment being delivered, open for reading, and its .done file, open for appending.

    Delivery reads one segment line after line and settles its lines in order: keeping both
    files open saves an open and a close per alert."""

    def __init__(self, pending: Path):
        self.pending = pending
        self._reader: tuple[str, BinaryIO] | None = None
        self._done: tuple[str, TextIO] | None = None

    def read(self, segment: str, offset: int, size: int) -> bytes:
        if self._reader is None or self._reader[0] != segment:
            self.close()
            self._reader = (segment, open(self.pending / segment, "rb"))  # noqa: SIM115
        return os.pread(self._reader[1].fileno(), size, offset)

    def read_line(self, segment: str, number: int) -> bytes:
        with open(self.pending / segment, "rb") as fh:
            return fh.readlines()[number]

    def mark_done(self, segment: str, number: int) -> None:
        """Record line `number` of `segment` as settled. Not fsynced: losing the record only
        means sending that alert again, which at-least-once delivery allows."""
        try:
            if self._done is None or self._done[0] != segment:
                if self._done is not None:
                    self._done[1].close()
                    self._done = None
                fd = open_private(self.pending / done_name(segment))
                done = open(fd, "a")  # noqa: SIM115 - kept open
                self._done = (segment, done)
            self._done[1].write(f"{number}\n")
            self._done[1].flush()  # in the kernel: a crash of this process loses none of it
        except OSError:
            # Not recorded (disk full): the alert is sent again after a restart; it is not a
            # reason to stop delivering.
            self.close(segment)

    def drop(self, segment: str) -> None:
        """Delete `segment` and its .done file (every line settled)."""
        self.close(segment)
        (self.pending / segment).unlink(missing_ok=True)
        (self.pending / done_name(segment)).unlink(missing_ok=True)

    def close(self, segment: str | None = None) -> None:
        """Close the open files (those of `segment` only, if given)."""
        if self._reader is not None and segment in (None, self._reader[0]):
            self._reader[1].close()
            self._reader = None
        if self._done is not None and segment in (None, self._done[0]):
            self._done[1].close()
            self._done = None

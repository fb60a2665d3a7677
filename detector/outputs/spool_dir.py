"""Claiming a destination's spool directory: private, named, and held by one process.

spool.py keeps the queue; this module makes sure the directory it works in is ours alone
before anything is read from it or written to it.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
from pathlib import Path

from hpcsec.detector.core.errors import HpcsecError
from hpcsec.detector.core.private_fs import (
    PrivatePathError,
    make_private_dir,
    open_private,
    write_private_file,
)

SUBDIRS = ("tmp", "pending", "failed")


class SpoolError(HpcsecError):
    """The spool directory cannot be used (permissions, in use by another process)."""


def destination_key(destination: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9.]+", "_", destination).strip("_")[:48]
    return f"{slug}-{hashlib.sha256(destination.encode()).hexdigest()[:12]}"


def _note_destination(path: Path, destination: str) -> None:
    """Write the spool's `destination` file unless it already says so: rewriting it takes
    disk space, and a spool must open on a full disk to hand over what it holds."""
    want = (destination + "\n").encode()
    try:
        fd = open_private(path, os.O_RDONLY)
    except FileNotFoundError:
        fd = -1
    if fd >= 0:
        try:
            if os.read(fd, len(want) + 1) == want:
                return
        finally:
            os.close(fd)
    write_private_file(path, want)


def claim_spool_dir(root: Path, destination: str) -> tuple[Path, int]:
    """The destination's directory under `root` and its lock descriptor, flocked by us."""
    path = Path(root) / destination_key(destination)
    try:
        # Ours and private, or refused: a spool directory another user made (or can write)
        # would let them read the alerts and plant ones we would sign and deliver.
        for directory in (Path(root), path, *(path / sub for sub in SUBDIRS)):
            make_private_dir(directory)
        _note_destination(path / "destination", destination)
        fd = open_private(path / "lock", os.O_RDWR)
    except PrivatePathError as exc:
        raise SpoolError(f"cannot use spool directory {root}: {exc.message}") from None
    except OSError as exc:
        raise SpoolError(f"cannot use spool directory {root}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise SpoolError(
            f"spool {path} ({destination}) is in use by another hpcsec process (pid {holder})"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return path, fd

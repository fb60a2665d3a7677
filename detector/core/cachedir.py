"""hpcsec's private cache directory: what several caches (rule sets, parsed site configs) share.

Entries are pickles or other data we trust once read, so only the user who runs hpcsec may be
able to write them: the cache is `$XDG_CACHE_HOME/hpcsec` (else `~/.cache/hpcsec`), created
0700; a directory is used only when it is a real directory (not a symlink) owned by this user
with no access for others, and every entry is opened relative to that directory's descriptor
with O_NOFOLLOW, so a path swapped after the check is not followed. A cache that cannot be
used only costs time: every function here answers None or False instead of raising.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
import sys
from collections.abc import Sequence
from pathlib import Path


def default_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "hpcsec"


def installed_version(distribution: str) -> str:
    """importlib.metadata.version(distribution), read from the `NAME-VERSION.dist-info`
    directory on sys.path: importing importlib.metadata (email, zipfile, csv...) would cost a
    cached `rules list` more than reading its rules does. Falls back to it when no such
    directory names the distribution (an egg, say); "-" when it is not installed."""
    wanted = _normalized(distribution)
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:  # a zip, a path hook, a directory gone
            continue
        for name in names:
            if name.endswith(".dist-info"):
                found, _, version = name[: -len(".dist-info")].rpartition("-")
                if _normalized(found) == wanted:
                    return version
    import importlib.metadata  # rare: only where no dist-info directory was found

    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def _normalized(name: str) -> str:
    """A distribution's name as packaging compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def open_private_dir(directory: Path, create: bool) -> int | None:
    """A descriptor of the cache directory if it is ours and private, else None."""
    try:
        if create:
            directory.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                os.mkdir(directory, 0o700)
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return None
    info = os.fstat(fd)
    if info.st_uid != os.geteuid() or stat.S_IMODE(info.st_mode) & 0o077:
        os.close(fd)
        return None
    return fd


def read_entry(directory: Path, name: str) -> bytes | None:
    """The bytes of entry `name`: a regular file of ours in our private directory, else None."""
    fd = open_private_dir(directory, create=False)
    if fd is None:
        return None
    try:
        return read_entry_at(fd, name)
    finally:
        os.close(fd)


def read_entry_at(fd: int, name: str) -> bytes | None:
    """`read_entry` in the directory open as `fd` (open_private_dir's)."""
    try:
        entry = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    except OSError:
        return None
    try:
        with os.fdopen(entry, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
                return None
            return f.read()
    except OSError:
        return None


def write_entry(directory: Path, name: str, data: bytes) -> bool:
    """Store entry `name` atomically (a reader sees the old state or the whole entry), 0600;
    False when the directory is not private or the write fails."""
    fd = open_private_dir(directory, create=True)
    if fd is None:
        return False
    try:
        return write_entry_at(fd, name, [data])
    finally:
        os.close(fd)


def write_entry_at(fd: int, name: str, parts: Sequence[bytes | memoryview]) -> bool:
    """`write_entry` of the bytes of `parts` in turn, in the directory open as `fd`."""
    temporary = f".{name}.{os.getpid()}"
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
        with os.fdopen(os.open(temporary, flags, 0o600, dir_fd=fd), "wb") as f:
            f.writelines(parts)
        os.replace(temporary, name, src_dir_fd=fd, dst_dir_fd=fd)
    except OSError:
        remove_entry_at(fd, temporary)
        return False
    return True


def remove_entry(directory: Path, name: str) -> None:
    """Remove entry `name` (a damaged one), if the directory is ours and private."""
    fd = open_private_dir(directory, create=False)
    if fd is not None:
        remove_entry_at(fd, name)
        os.close(fd)


def remove_entry_at(fd: int, name: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(name, dir_fd=fd)

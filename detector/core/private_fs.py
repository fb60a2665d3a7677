"""Files and directories that hpcsec writes: private (0600/0700) and ours, whatever the umask.

What hpcsec writes holds what the node's users must not read (command lines, environments,
LD_PRELOAD values, alerts about them) and what they must not change (a spooled alert is
delivered signed with the real secret). Those users are the adversary, and they can write to
shared places such as /tmp. So:

- a directory we use is owned by us and writable by no one else, or it is refused; one we
  create is 0700;
- every directory above it is owned by root or by us, and any of them writable by others is
  sticky (as /tmp is), so nobody can rename ours away and put theirs in its place;
- a new file is created 0600 with O_EXCL and O_NOFOLLOW: a symlink planted at its name makes
  the open fail instead of making root write through it;
- an existing file we append to must be a regular file of ours.

A refusal is a `PrivatePathError` (exit 2) that says which path and why.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
from pathlib import Path

from hpcsec.detector.core.errors import HpcsecError

DIR_MODE = 0o700
FILE_MODE = 0o600
_NEW_FILE = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class PrivatePathError(HpcsecError):
    """A path hpcsec would write to belongs to someone else or is open to others."""


def _owner(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def check_owned_dir(path: str | Path) -> None:
    """Refuse `path` unless it is a real directory (not a symlink) of ours that neither group
    nor others can write."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise PrivatePathError(f"cannot use directory {path}: {exc.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        raise PrivatePathError(f"refusing directory {path}: it is a symbolic link")
    if not stat.S_ISDIR(st.st_mode):
        raise PrivatePathError(f"refusing directory {path}: it is not a directory")
    if st.st_uid != os.geteuid():
        raise PrivatePathError(
            f"refusing directory {path}: it belongs to {_owner(st.st_uid)}, not to us"
        )
    if st.st_mode & 0o022:
        raise PrivatePathError(
            f"refusing directory {path}: it is writable by group or others "
            f"(mode {stat.S_IMODE(st.st_mode):04o})"
        )


def check_safe_ancestors(path: str | Path) -> None:
    """Refuse `path` when someone else could replace it: every directory above it must be
    owned by root or by us, and one that others may write must be sticky."""
    me = os.geteuid()
    parent = Path(os.path.abspath(path)).parent
    for link in (parent, *parent.parents):
        with contextlib.suppress(OSError):
            st = os.lstat(link)
            # A symlink in the path (/var/run -> /run) is fine when its owner is trusted;
            # one planted by a user would send us into their directory.
            if stat.S_ISLNK(st.st_mode) and st.st_uid not in (0, me):
                raise PrivatePathError(
                    f"refusing {path}: {link} is a symbolic link of {_owner(st.st_uid)}"
                )
    real = Path(os.path.realpath(parent))
    for directory in (real, *real.parents):
        try:
            st = os.stat(directory)
        except OSError:
            continue
        if st.st_uid not in (0, me):
            raise PrivatePathError(
                f"refusing {path}: {directory} belongs to {_owner(st.st_uid)}, "
                "who could replace what we write there"
            )
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise PrivatePathError(
                f"refusing {path}: {directory} is writable by group or others and not sticky "
                f"(mode {stat.S_IMODE(st.st_mode):04o})"
            )


def make_private_dir(path: str | Path) -> Path:
    """`path` as a directory of ours, mode 0700: created (with missing parents, 0700) or
    checked. An existing directory of ours with a wider mode that others cannot write (0755)
    is narrowed to 0700; one of another user, or writable by others, is refused."""
    path = Path(path)
    check_safe_ancestors(path)
    missing = [d for d in (path, *path.parents) if not os.path.lexists(d)]
    for directory in reversed(missing):
        try:
            os.mkdir(directory, DIR_MODE)
        except FileExistsError:
            pass  # made meanwhile: checked below like any existing one
        except OSError as exc:
            raise PrivatePathError(f"cannot create directory {directory}: {exc.strerror}") from None
    check_owned_dir(path)
    if stat.S_IMODE(os.lstat(path).st_mode) != DIR_MODE:
        os.chmod(path, DIR_MODE, follow_symlinks=False)
    return path


def open_private_new(path: str | Path, flags: int = os.O_WRONLY) -> int:
    """A descriptor on a new file at `path`, mode 0600; fails (FileExistsError) when anything,
    a symlink included, is already there."""
    fd = os.open(path, flags | _NEW_FILE, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)  # umask only narrows, but a mode set by ACL defaults can widen
    except OSError:
        os.close(fd)
        raise
    return fd


def open_private(path: str | Path, flags: int = os.O_WRONLY | os.O_APPEND) -> int:
    """A descriptor on `path`, created 0600 if missing; an existing one must be a regular file
    of ours (not a symlink, FIFO or device), or PrivatePathError."""
    with contextlib.suppress(FileExistsError):
        return open_private_new(path, flags)
    # O_NONBLOCK: a FIFO planted there must not hang us before fstat can refuse it.
    fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise PrivatePathError(f"refusing {path}: it is not a regular file")
        if st.st_uid != os.geteuid():
            raise PrivatePathError(f"refusing {path}: it belongs to {_owner(st.st_uid)}, not to us")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_private_file(path: str | Path, data: bytes) -> None:
    """Replace `path` atomically with a new 0600 file holding `data`. The rename replaces
    whatever is at `path` (a symlink included) and never writes through it."""
    path = Path(path)
    # os.urandom is what secrets.token_hex reads, without importing secrets (random, hmac,
    # base64) into the Slurm prolog
    tmp = path.with_name(f".{path.name}.{os.urandom(6).hex()}.tmp")
    fd = open_private_new(tmp)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise

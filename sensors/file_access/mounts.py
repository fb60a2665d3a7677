"""Where a file held open through another mount lies in this mount namespace.

The one-shot open-files check (fdwalk.py) reads the /proc/<pid>/fd links, whose text is
the path in the *opener's* mount namespace: a protected file bind-mounted elsewhere (any
user can, in a user namespace of their own: `unshare -Urm`) or reached through another
mount of its filesystem reads as some other path. /proc/<pid>/fdinfo/<fd> names the mount
(`mnt_id`) and the inode (`ino`) without asking the filesystem (a stat of the file would:
a FUSE filesystem its user mounted could keep that from ever returning). The opener's
mountinfo gives that mount's device and which directory of its filesystem it shows (its
root); this namespace's mountinfo gives where that directory is here. The path so found
counts only if it is protected and an lstat there (a protected path: the operator's
filesystems) shows the same inode. A protected file reached through a hard link of another
name is not found this way (the fanotify stream finds it by identity).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import NamedTuple

from hpcsec.sensors.base import FsRoot

MOUNTINFO_MAX = 4 * 2**20  # a container host's mountinfo is some hundred KB
# Mount namespaces whose mountinfo is read in one walk: any user can make more (unshare), and
# each read costs up to MOUNTINFO_MAX; past this, their files are matched by path text only.
MAX_NAMESPACES = 256
_OCTAL = re.compile(r"\\([0-7]{3})")
_FDINFO = re.compile(r"^(mnt_id|ino):\s*(\d+)$", re.M)


class Mount(NamedTuple):
    dev: str  # major:minor of its filesystem
    root: str  # the directory of that filesystem it shows
    point: str  # where it is mounted


def unescape(text: str) -> str:
    """A mountinfo field: the kernel writes space, tab, newline and backslash as `\\ooo`."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), text)


def parse_mountinfo(text: str) -> dict[int, Mount]:
    """Mount id -> Mount, from /proc/<pid>/mountinfo; lines that are not as the kernel
    writes them are skipped."""
    mounts: dict[int, Mount] = {}
    for line in text.splitlines():
        fields = line.split(" ", 5)
        if len(fields) < 6 or not fields[0].isdigit() or ":" not in fields[2]:
            continue
        mounts[int(fields[0])] = Mount(fields[2], unescape(fields[3]), unescape(fields[4]))
    return mounts


def _under(path: str, top: str) -> str | None:
    """`path` relative to `top` ("" or "/…"), None when it is not under it."""
    if top == "/":
        return path if path.startswith("/") else None
    if path == top:
        return ""
    return path[len(top) :] if path.startswith(top + "/") else None


def filesystem_path(mount: Mount, path: str) -> str | None:
    """Where `path` (seen through `mount`) lies in the mount's filesystem."""
    rest = _under(path, mount.point)
    if rest is None:
        return None
    return (mount.root.rstrip("/") + rest) or "/"


@dataclass
class Identity:
    """Protected files held open under another path, for one walk of /proc."""

    proc: FsRoot
    ours: dict[str, list[Mount]]  # our mounts by device, the deepest roots first
    namespaces: dict[str, dict[int, Mount]] = field(default_factory=dict)
    skipped_namespaces: int = 0

    @classmethod
    def here(cls, proc: FsRoot) -> Identity | None:
        """From this process's own mountinfo; None when it cannot be read."""
        text = proc.read_text("self/mountinfo", MOUNTINFO_MAX)
        if not text:
            return None
        ours: dict[str, list[Mount]] = {}
        for mount in parse_mountinfo(text).values():
            ours.setdefault(mount.dev, []).append(mount)
        for mounts in ours.values():
            mounts.sort(key=lambda m: -len(m.root))
        return cls(proc, ours)

    def candidates(self, pid: str, fd: str, path: str) -> list[tuple[str, int]]:
        """The paths in this namespace the file of `pid`'s `fd` (its link text `path`)
        may have, with its inode number: none when it is on no filesystem mounted here."""
        info = self.proc.read_text(f"{pid}/fdinfo/{fd}", 4096) or ""
        numbers = dict(_FDINFO.findall(info))
        if "mnt_id" not in numbers or "ino" not in numbers:
            return []
        mount = self._mounts_of(pid).get(int(numbers["mnt_id"]))
        if mount is None or mount.dev not in self.ours:
            return []
        inside = filesystem_path(mount, path)
        if inside is None:
            return []
        found = []
        for here in self.ours[mount.dev]:
            rest = _under(inside, here.root)
            if rest is not None:
                found.append(((here.point.rstrip("/") + rest) or "/", int(numbers["ino"])))
        return found

    def _mounts_of(self, pid: str) -> dict[int, Mount]:
        namespace = self.proc.readlink(f"{pid}/ns/mnt") or f"pid {pid}"
        mounts = self.namespaces.get(namespace)
        if mounts is not None:
            return mounts
        if len(self.namespaces) >= MAX_NAMESPACES:
            self.skipped_namespaces += 1
            return {}
        mounts = parse_mountinfo(self.proc.read_text(f"{pid}/mountinfo", MOUNTINFO_MAX) or "")
        self.namespaces[namespace] = mounts
        return mounts


def same_inode(path: str, ino: int) -> bool:
    """Whether the file at `path` (not followed if a symbolic link) is inode `ino`."""
    try:
        return os.lstat(path).st_ino == ino
    except (OSError, ValueError):
        return False

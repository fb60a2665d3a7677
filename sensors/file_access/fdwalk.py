"""Open files under protected paths, from /proc/<pid>/fd — the file-access sensor without
a daemon (`hpcsec scan`).

A walk sees only what is open at that instant: a `cat` of a model that ran a second ago is
gone. It is the fallback for one-shot scans; the fanotify stream is the real sensor. A link
whose text is no protected path may still be a protected file, reached through a bind
mount or another mount of its filesystem: mounts.py finds where it lies here.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from hpcsec.sensors.base import SensorContext
from hpcsec.sensors.file_access.mounts import Identity, same_inode
from hpcsec.sensors.file_access.records import AccessRecord

_DELETED = " (deleted)"


def open_files(
    ctx: SensorContext, protected: Callable[[str], bool], identity: Identity | None = None
) -> list[AccessRecord]:
    """One `open` record per (pid, path) with a descriptor on a protected file: by the
    link's path, or (`identity`) by where the file lies in this namespace (`asset`)."""
    own = str(os.getpid()) if not ctx.replaying else None
    records: dict[tuple[int, str], AccessRecord] = {}
    for name in ctx.proc.listdir():
        if not name.isdigit() or name == own:
            continue
        for fd in ctx.proc.listdir(f"{name}/fd"):
            target = ctx.proc.readlink(f"{name}/fd/{fd}")
            if not target or not target.startswith("/"):
                continue  # socket:[…], pipe:[…], anon_inode:…
            path = target.removesuffix(_DELETED)
            asset = path if protected(path) else _asset(identity, name, fd, path, protected)
            if asset is None:
                continue
            key = (int(name), path)
            if key in records:
                records[key].count += 1
            else:
                records[key] = AccessRecord(ctx.timestamp, int(name), path, ["open"], asset=asset)
    return sorted(records.values(), key=lambda r: (r.pid, r.path))


def _asset(
    identity: Identity | None, pid: str, fd: str, path: str, protected: Callable[[str], bool]
) -> str | None:
    """The protected path of the file `path` names in `pid`'s namespace, if it is one."""
    if identity is None:
        return None
    for candidate, ino in identity.candidates(pid, fd, path):
        if protected(candidate) and same_inode(candidate, ino):
            return candidate
    return None

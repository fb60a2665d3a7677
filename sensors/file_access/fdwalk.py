"""Open files under protected paths, from /proc/<pid>/fd — the file-access sensor without
a daemon (`hpcsec scan`).

A walk sees only what is open at that instant: a `cat` of a model that ran a second ago is
gone. It is the fallback for one-shot scans; the fanotify stream is the real sensor.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from hpcsec.sensors.base import SensorContext
from hpcsec.sensors.file_access.records import AccessRecord

_DELETED = " (deleted)"


def open_files(ctx: SensorContext, protected: Callable[[str], bool]) -> list[AccessRecord]:
    """One `open` record per (pid, path) with a descriptor on a protected path."""
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
            if not protected(path):
                continue
            key = (int(name), path)
            if key in records:
                records[key].count += 1
            else:
                records[key] = AccessRecord(ctx.timestamp, int(name), path, ["open"])
    return sorted(records.values(), key=lambda r: (r.pid, r.path))

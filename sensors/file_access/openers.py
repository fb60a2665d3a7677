"""Process fields of the pids that touch protected files, read at the access.

The fanotify reader reads /proc through its own root: when a snapshot is being recorded,
what it read is kept per pid and written into the sample that gets the records.
"""

from __future__ import annotations

import time
from typing import Any

from hpcsec.sensors.base import FsRoot, SensorContext
from hpcsec.sensors.file_access.records import ProcCapture, ProcInput, access_process_fields
from hpcsec.sensors.procinfo import Users

_NO_USERS = Users({})  # names are filled in at conversion, from the sample's passwd
_MAX_PROCESSES = 16_384
_REREAD_S = 1.0


class OpenerCache:
    def __init__(self, ctx: SensorContext):
        self._capture = ProcCapture() if ctx.recorder is not None else None
        self._proc_ctx = SensorContext(
            ctx.host_name,
            ctx.sys,
            FsRoot("proc", ctx.proc.path, self._capture),
            ctx.etc,
            timestamp=ctx.timestamp,
            cmdline_literals=ctx.cmdline_literals,
        )
        self._processes: dict[int, dict[str, Any]] = {}
        self._read_at: dict[int, float] = {}  # pid -> monotonic time of its /proc read
        self._proc_inputs: dict[int, tuple[ProcInput, ...]] = {}

    def remember(self, pid: int, fresh: bool) -> bool:
        """Process fields of `pid` at the access (through ctx.proc, so snapshots keep them);
        whether any are known for it (False: its events name it by pid alone).

        An open re-reads them unless this pid was read in the last `_REREAD_S` (a loader
        opening shard after shard pays the /proc read once; an exec or a reused pid is
        seen again within a second).
        """
        now = time.monotonic()
        if pid in self._processes and (not fresh or now - self._read_at.get(pid, 0) < _REREAD_S):
            return bool(self._processes[pid])
        if self._capture is not None:
            self._capture.inputs = []
        fields = access_process_fields(self._proc_ctx, pid, _NO_USERS)
        if fields or pid not in self._processes:
            self._processes[pid] = fields
            self._read_at[pid] = now
            if self._capture is not None:
                self._proc_inputs[pid] = tuple(self._capture.inputs)
        return bool(self._processes[pid])

    def take(
        self, pids: set[int]
    ) -> tuple[dict[int, dict[str, Any]], dict[int, tuple[ProcInput, ...]]]:
        """The fields and recorded /proc inputs of `pids`, for one drain."""
        processes = {pid: self._processes[pid] for pid in pids if pid in self._processes}
        proc_inputs = {pid: self._proc_inputs[pid] for pid in pids if pid in self._proc_inputs}
        # Kept across intervals (a dataloader opened its shard long before it reads it);
        # every open refreshes its pid's entry, so only a bound is needed.
        if len(self._processes) > _MAX_PROCESSES:
            self._processes, self._read_at, self._proc_inputs = {}, {}, {}
        return processes, proc_inputs

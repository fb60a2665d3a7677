"""Processes from /proc — category `process`, one event per user-space process.

Kernel threads (empty cmdline) are skipped. The agent runs this every interval, so it reads
only what the rules use: status, cmdline, comm, the exe link, cgroup, and three variables of
the environment (LD_PRELOAD for injection, SLURM_JOB_ID and CUDA_VISIBLE_DEVICES to compare
with what Slurm says — the environment is forgeable, the cgroup is not).
"""

from __future__ import annotations

from collections.abc import Iterator

from hpcsec.detector.core.schema import Event, new_event
from hpcsec.sensors.base import SensorContext, SensorUnavailable
from hpcsec.sensors.cmdline_budget import CommandLineBudget
from hpcsec.sensors.procinfo import (
    Users,
    environ_value,
    owner_key,
    process_fields,
    read_environ,
)

SELECTED_ENV = ("LD_PRELOAD", "SLURM_JOB_ID", "CUDA_VISIBLE_DEVICES")
# a process without a command line because its memory was not read (stalls.py) is reported
UNREAD_MEMORY = frozenset({"process.memory_read_stalled", "process.memory_read_skipped"})


def pids(ctx: SensorContext) -> list[int]:
    return sorted(int(name) for name in ctx.proc.listdir() if name.isdigit())


class ProcessSensor:
    name = "process"

    def collect(self, ctx: SensorContext) -> Iterator[Event]:
        found = pids(ctx)
        if not found:
            raise SensorUnavailable(f"no processes under {ctx.proc.path}")
        users = Users.load(ctx.etc)
        budget = CommandLineBudget(ctx.cmdline_literals)
        for pid in found:
            fields = process_fields(ctx, pid, users, budget)
            if "process.command_line" not in fields and not fields.keys() & UNREAD_MEMORY:
                continue  # a kernel thread, or the process exited while we looked
            cgroup = ctx.proc.read_text(f"{pid}/cgroup")
            if cgroup:
                fields["process.cgroup"] = cgroup.strip()
            environ = read_environ(ctx.proc, pid, owner_key(ctx, pid, fields.get("user.id")))
            for var in SELECTED_ENV:
                value = environ_value(environ, var)
                if value is not None:
                    fields[f"process.env.{var}"] = value
            yield new_event("process", "present", self.name, ctx.host_name, ctx.timestamp, fields)

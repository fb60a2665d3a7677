"""Slurm's Prolog= and Epilog= hooks (`hpcsec slurm prolog|epilog`, see docs/slurm.md).

slurmd runs them as root with the job's SLURM_* environment. The prolog records that the job
started; the epilog records that it ended and looks for what the job left behind: processes of
the job's user that are in no other job on the node, processes still on the job's GPUs, GPU
memory not given back. Both append `slurm_job` events to `<state dir>/slurm-events.jsonl`,
which the agent's slurm_jobs sensor tails. They must be fast and ALWAYS succeed: a failing
prolog or epilog drains the node, so an internal error is logged to stderr (slurmd's log) and
swallowed. Fast also means light imports: nothing here pulls in pySigma or DuckDB, and the
prolog, which runs before every job, imports none of what only the epilog uses (the Slurm
commands and their parsers, the process readers): those imports are in the epilog's methods.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import orjson

from hpcsec.detector.core import log
from hpcsec.detector.core.errors import HpcsecError
from hpcsec.detector.core.private_fs import make_private_dir, open_private, write_private_file
from hpcsec.detector.core.schema import new_event, rfc3339
from hpcsec.detector.slurm.hookstate import HOOK_EVENTS_FILE

# typing.TYPE_CHECKING without importing typing (mypy reads any name TYPE_CHECKING so): the
# prolog runs before every job and nothing of it needs typing at run time
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from hpcsec.detector.slurm.jobs import SlurmCommands
    from hpcsec.detector.slurm.parse import PidJob

GPU_MEMORY_SLACK = 64 << 20  # bytes above the prolog's reading that still count as released


@dataclass(frozen=True)
class HookSettings:
    """How a hook was run (the command line of `hpcsec slurm prolog|epilog`)."""

    hook: str  # prolog | epilog
    state_dir: str
    procfs_root: str = "/proc"
    etc_root: str = "/etc"
    host_name: str | None = None
    nvml_json: str | None = None  # GPU state from a dump instead of NVML
    slurm_timeout: float = 2.0


class HookUsage(Exception):
    """Run the wrong way (not by slurmd): said plainly, still a success."""


def run_hook(settings: HookSettings, env: dict[str, str]) -> None:
    """Run the prolog or epilog; every problem is reported on stderr, never raised."""
    try:
        hook = Hook(settings, env)
        hook.prolog() if settings.hook == "prolog" else hook.epilog()
    except (HookUsage, HpcsecError) as exc:
        print(f"hpcsec slurm {settings.hook}: {exc}", file=sys.stderr)
    except Exception as exc:  # never drain the node because of us; the traceback is a bug
        log.get_logger(__name__).error(  # `logging` imported only here: see core/log.py
            "slurm %s: internal error: %s: %s",
            settings.hook,
            type(exc).__name__,
            exc,
            exc_info=True,
        )


def _gpu_list(value: str | None) -> list[int]:
    out = []
    for item in (value or "").split(","):
        item = item.strip()
        if item.isdigit():
            out.append(int(item))
    return out


class Hook:
    def __init__(
        self, settings: HookSettings, env: dict[str, str], commands: SlurmCommands | None = None
    ):
        self.settings = settings
        self.env = env
        self._commands = commands
        self.state_dir = Path(settings.state_dir)
        # the kernel's host name, as socket.gethostname() reads it (without importing socket)
        self.host = settings.host_name or os.uname().nodename.split(".")[0]
        self.now = rfc3339()
        self.job_id = env.get("SLURM_JOB_ID", "").strip()
        if not self.job_id.isdigit():
            raise HookUsage("SLURM_JOB_ID is not set: not run by slurmd?")
        uid = env.get("SLURM_JOB_UID", "").strip()
        self.uid = int(uid) if uid.isdigit() else None
        self.user = env.get("SLURM_JOB_USER") or None
        # SLURM_JOB_GPUS in the prolog/epilog (22.05); CUDA_VISIBLE_DEVICES as a fallback
        gpus = env.get("SLURM_JOB_GPUS") or env.get("CUDA_VISIBLE_DEVICES")
        self.gpus = _gpu_list(gpus)

    @property
    def commands(self) -> SlurmCommands:
        """The Slurm commands (only the epilog runs one)."""
        if self._commands is None:
            from hpcsec.detector.slurm.jobs import SlurmCommands  # the epilog's: see the top

            self._commands = SlurmCommands(self.settings.slurm_timeout)
        return self._commands

    # ---------------------------------------------------------------- common
    def job_fields(self) -> dict[str, Any]:
        return {
            "slurm.job.id": self.job_id,
            "slurm.job.user": self.user,
            "slurm.job.account": self.env.get("SLURM_JOB_ACCOUNT") or None,
            "slurm.job.partition": self.env.get("SLURM_JOB_PARTITION") or None,
            "slurm.job.gpus": self.gpus,
            "slurm.job.id_source": "slurmd",
            "user.name": self.user,
            "user.id": self.uid,
        }

    def emit(self, action: str, fields: dict[str, Any]) -> dict[str, Any]:
        event = new_event(
            "slurm_job", action, f"slurm_{self.settings.hook}", self.host, self.now, fields
        )
        # The state is private: it names every job's user and GPUs, and an events file that
        # a user could write would let them forge or erase their own job's record.
        make_private_dir(self.state_dir)
        line = orjson.dumps(event) + b"\n"
        fd = open_private(self.state_dir / HOOK_EVENTS_FILE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # prologs of concurrent jobs run in parallel
            os.write(fd, line)
        finally:
            os.close(fd)
        return event

    def state_path(self) -> Path:
        return self.state_dir / "jobs" / f"{self.job_id}.json"

    # ---------------------------------------------------------------- prolog
    def prolog(self) -> None:
        record = {
            "job_id": self.job_id,
            "user": self.user,
            "uid": self.uid,
            "gpus": self.gpus,
            "start": self.now,
            "gpu_memory_used": self.gpu_memory(self.gpus),
        }
        path = self.state_path()
        make_private_dir(path.parent)
        write_private_file(path, json.dumps(record).encode())
        self.emit(
            "prolog",
            {**self.job_fields(), "slurm.job.state": "RUNNING", "slurm.job.start": self.now},
        )

    # ---------------------------------------------------------------- epilog
    def epilog(self) -> None:
        path = self.state_path()
        try:
            started = json.loads(path.read_text())
        except (OSError, ValueError):
            started = {}
        findings = self.lingering_processes() + self.gpu_leftovers(started)
        kinds = sorted({f["kind"] for f in findings})
        # hpcsec.findings is only on epilog_findings events: rules select on its presence
        fields = {
            **self.job_fields(),
            "slurm.job.start": started.get("start"),
            "slurm.job.end": self.now,
            "slurm.job.state": "COMPLETING",
            "message": f"{len(findings)} findings" + (f": {', '.join(kinds)}" if kinds else ""),
        }
        self.emit("epilog", fields)
        for finding in findings:
            kind, message = finding.pop("kind"), finding.pop("message")
            self.emit(
                "epilog_findings",
                {
                    **self.job_fields(),
                    "slurm.job.end": self.now,
                    "hpcsec.findings": [kind],
                    "message": message,
                    **finding,
                },
            )
        path.unlink(missing_ok=True)

    def _other_jobs(self) -> dict[int, PidJob]:
        """pid -> job for processes slurmd still tracks on this node (other running jobs)."""
        from hpcsec.detector.slurm.jobs import SlurmUnreachable  # the epilog's: see the top
        from hpcsec.detector.slurm.parse import parse_listpids

        try:
            text = self.commands.listpids()
        except SlurmUnreachable as exc:
            print(f"hpcsec slurm epilog: {exc}", file=sys.stderr)
            return {}
        return parse_listpids(text).pids

    def lingering_processes(self) -> list[dict[str, Any]]:
        if self.uid is None or self.uid == 0:
            return []
        # the epilog's imports (see the top): the prolog reads no process
        from hpcsec.detector.slurm.parse import job_from_cgroup, job_from_environ
        from hpcsec.sensors.base import FsRoot, SensorContext
        from hpcsec.sensors.procinfo import (
            Users,
            owner_key,
            process_fields,
            read_environ,
            status_fields,
        )

        proc = FsRoot("proc", self.settings.procfs_root)
        ctx = SensorContext(
            self.host,
            FsRoot("sys", "/sys"),
            proc,
            FsRoot("etc", self.settings.etc_root),
            timestamp=self.now,
        )
        users = Users.load(ctx.etc)
        tracked = self._other_jobs()
        out = []
        for name in proc.listdir():
            if not name.isdigit():
                continue
            pid = int(name)
            status = status_fields(proc.read_text(f"{name}/status") or "")
            uids = status.get("Uid", "").split()
            if not uids or not uids[0].isdigit() or int(uids[0]) != self.uid:
                continue
            if status.get("State", "").startswith("Z"):
                continue  # already dead, waiting to be reaped
            cgroup = job_from_cgroup(proc.read_text(f"{name}/cgroup") or "")
            owner = cgroup or tracked.get(pid)
            if owner is not None and owner.job_id != self.job_id:
                continue  # belongs to another running job of this user
            claimed = job_from_environ(
                read_environ(proc, name, owner_key(ctx, pid, self.uid)) or b""
            )
            proc_fields = process_fields(ctx, pid, users)
            if not proc_fields:
                continue  # exited meanwhile
            out.append(
                {
                    "kind": "lingering_process",
                    "message": f"process {pid} ({proc_fields.get('process.name')}) of "
                    f"{self.user or self.uid} still running after job {self.job_id} "
                    "and in no other job on this node",
                    **proc_fields,
                    "process.env.SLURM_JOB_ID": claimed.job_id if claimed else None,
                }
            )
        return out

    # ---------------------------------------------------------------- GPUs
    def nvml_devices(self) -> list[dict[str, Any]] | None:
        try:
            if self.settings.nvml_json:
                doc = json.loads(Path(self.settings.nvml_json).read_text())
            else:
                from hpcsec.sensors.gpu import nvml_dump

                doc = nvml_dump.snapshot()
        except Exception as exc:  # no NVML on this node: GPU checks are skipped, not failed
            print(f"hpcsec slurm {self.settings.hook}: GPU checks skipped: {exc}", file=sys.stderr)
            return None
        devices = doc.get("devices") if isinstance(doc, dict) else None
        return [d for d in devices or [] if isinstance(d, dict)]

    def gpu_memory(self, gpus: list[int]) -> dict[str, int]:
        if not gpus:
            return {}
        devices = self.nvml_devices() or []
        return {
            str(d["index"]): d["memory_used_bytes"]
            for d in devices
            if d.get("index") in gpus and isinstance(d.get("memory_used_bytes"), int)
        }

    def gpu_leftovers(self, started: dict[str, Any]) -> list[dict[str, Any]]:
        if not self.gpus:
            return []
        devices = self.nvml_devices()
        if devices is None:
            return []
        baseline = started.get("gpu_memory_used") or {}
        out = []
        for dev in devices:
            index = dev.get("index")
            if index not in self.gpus:
                continue
            gpu = {"gpu.index": index, "gpu.uuid": dev.get("uuid")}
            for p in dev.get("processes") or []:
                out.append(
                    {
                        "kind": "gpu_process_after_job",
                        **gpu,
                        "process.pid": p.get("pid"),
                        "gpu.memory_used_bytes": p.get("used_gpu_memory_bytes"),
                        "message": f"process {p.get('pid')} still on GPU {index} after "
                        f"job {self.job_id}",
                    }
                )
            used = dev.get("memory_used_bytes")
            before = baseline.get(str(index))
            if (
                isinstance(used, int)
                and isinstance(before, int)
                and used > before + GPU_MEMORY_SLACK
            ):
                out.append(
                    {
                        "kind": "gpu_memory_not_released",
                        **gpu,
                        "gpu.memory_used_bytes": used,
                        "message": f"GPU {index} holds {used - before} bytes more than "
                        f"before job {self.job_id}",
                    }
                )
        return out

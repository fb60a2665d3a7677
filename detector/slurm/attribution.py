"""Which Slurm job a process belongs to: cgroup, then listpids (the process or its nearest
listed ancestor, while that pid runs as the job's owner or root), then (marked as forgeable)
the environment, accepted only for the job's owner.

The decision is pure: it asks a `ProcessReader` for what /proc says about a pid. Where the
sensors ran, `ProcReader` reads the node and remembers every answer; enrichment later asks the
remembered answers (`RecordedProcesses`), so both run this same code and agree, and
enrichment never reads the node again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from hpcsec.detector.slurm.parse import JobRecord, PidJob, job_from_cgroup, job_from_environ
from hpcsec.detector.slurm.table import JobTable
from hpcsec.sensors.base import FsRoot
from hpcsec.sensors.procinfo import read_environ

# How far up the process tree a pid unknown to listpids is looked for (a job's script, its
# interpreter and a launcher or two sit between the step and the reader).
MAX_ANCESTORS = 8


class ProcessReader(Protocol):
    """What attribution needs to know about a pid (None: the process is gone or unreadable)."""

    def cgroup(self, pid: int) -> str | None: ...
    def parent(self, pid: int) -> int | None: ...
    def uid(self, pid: int) -> int | None: ...
    def environ_job(self, pid: int) -> PidJob | None: ...


@dataclass(frozen=True)
class RecordedProcesses:
    """The answers a ProcReader gave, by pid; a pid never asked about reads as gone."""

    cgroups: Mapping[int, str | None] = field(default_factory=dict)
    parents: Mapping[int, int | None] = field(default_factory=dict)
    uids: Mapping[int, int | None] = field(default_factory=dict)
    environ_jobs: Mapping[int, PidJob | None] = field(default_factory=dict)

    def cgroup(self, pid: int) -> str | None:
        return self.cgroups.get(pid)

    def parent(self, pid: int) -> int | None:
        return self.parents.get(pid)

    def uid(self, pid: int) -> int | None:
        return self.uids.get(pid)

    def environ_job(self, pid: int) -> PidJob | None:
        return self.environ_jobs.get(pid)


class ProcReader:
    """Reads /proc through the context's root (so snapshots record and replay it) and keeps
    every answer; `recorded()` hands them over as an immutable value."""

    def __init__(
        self, proc: FsRoot, owner_of: Callable[[int, int | None], int | None] | None = None
    ):
        self.proc = proc
        # who answers for a process in the bounds of stalls.py (procinfo.owner_key)
        self.owner_of = owner_of
        self._cgroups: dict[int, str | None] = {}
        self._status: dict[int, str | None] = {}
        self._environ_jobs: dict[int, PidJob | None] = {}

    def cgroup(self, pid: int) -> str | None:
        if pid not in self._cgroups:
            self._cgroups[pid] = self.proc.read_text(f"{pid}/cgroup")
        return self._cgroups[pid]

    def _status_value(self, pid: int, key: str) -> int | None:
        """The first number of a `Key:` line of /proc/<pid>/status (Uid: real uid, PPid:)."""
        if pid not in self._status:
            self._status[pid] = self.proc.read_text(f"{pid}/status")
        # `\n` only: the Name line holds the process's own comm (procinfo.status_fields)
        for line in (self._status[pid] or "").split("\n"):
            if line.startswith(key + ":"):
                parts = line.split()
                return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else None
        return None

    def parent(self, pid: int) -> int | None:
        return self._status_value(pid, "PPid")

    def uid(self, pid: int) -> int | None:
        return self._status_value(pid, "Uid")

    def environ_job(self, pid: int) -> PidJob | None:
        # Only the job id is kept: the environment itself may hold secrets.
        if pid not in self._environ_jobs:
            uid = self.uid(pid)
            owner = uid if self.owner_of is None else self.owner_of(pid, uid)
            raw = read_environ(self.proc, pid, owner)
            self._environ_jobs[pid] = job_from_environ(raw) if raw else None
        return self._environ_jobs[pid]

    def recorded(self) -> RecordedProcesses:
        pids = set(self._status)
        return RecordedProcesses(
            dict(self._cgroups),
            {pid: self.parent(pid) for pid in pids},
            {pid: self.uid(pid) for pid in pids},
            dict(self._environ_jobs),
        )


def attribute(
    pid: int,
    table: JobTable,
    procs: ProcessReader,
    seen: Mapping[str, Any] | None = None,
    use_environ: bool = True,
) -> PidJob | None:
    """The job of `pid`, or None.

    `seen` is the event's own fields (`process.cgroup`, `process.parent.pid`,
    `process.env.SLURM_JOB_ID`, `user.id`), captured when the sensor saw the process. They win
    over /proc: a short-lived reader of a model file may be gone by the time the node is read
    again, and its pid may already name another process.
    """
    seen = seen or {}
    text = seen.get("process.cgroup")
    if not isinstance(text, str):
        text = procs.cgroup(pid)
    found = job_from_cgroup(text) if text else None
    if found is None:
        listed = table.listpids.get(pid)
        if listed is not None and _runs_as_owner(listed, _uid_of(pid, procs, seen), table):
            found = listed
        elif listed is None:
            found = _listed_ancestor(pid, table, procs, seen)
    if found is None and use_environ:
        found = _from_environ(pid, table, procs, seen)
    return found


def _listed_ancestor(
    pid: int, table: JobTable, procs: ProcessReader, seen: Mapping[str, Any]
) -> PidJob | None:
    """The job of the nearest ancestor `scontrol listpids` lists.

    Without Slurm cgroups (proctrack/linuxproc, pgid) a job is its processes and their
    descendants, and listpids only knows the pids alive when it ran: a `cat` the job's script
    started after that, and that exited since, is found through its parent (the script). A
    process that left its job (setsid, double fork) was re-parented to init and has no listed
    ancestor.
    """
    if not table.listpids:
        return None
    own = _uid_of(pid, procs, seen)  # a job's descendant keeps its owner's real uid
    parent = seen.get("process.parent.pid")
    if isinstance(parent, bool) or not isinstance(parent, int):
        parent = procs.parent(pid)
    for _ in range(MAX_ANCESTORS):
        if parent is None or parent <= 1:
            return None
        found = table.listpids.get(parent)
        if found is not None:
            # the process and the listed ancestor both run as the owner (or root), each
            # where known: an ancestor gone since (its pid perhaps another user's by then)
            # must not vouch for a child of another user
            mine = _runs_as_owner(found, own, table)
            return found if mine and _runs_as_owner(found, procs.uid(parent), table) else None
        parent = procs.parent(parent)
    return None


def _uid_of(pid: int, procs: ProcessReader, seen: Mapping[str, Any]) -> int | None:
    """The process's uid as the sensor saw it, else as /proc says now."""
    uid = seen.get("user.id")
    if isinstance(uid, int) and not isinstance(uid, bool):
        return uid
    return procs.uid(pid)


def _runs_as_owner(listed: PidJob, uid: int | None, table: JobTable) -> bool:
    """Whether a pid listpids listed may still be the job's process: it runs as the job's
    owner or root (a setuid program keeps its real uid). listpids is cached between
    refreshes (jobs.py), and a pid freed since may be taken by anyone's process: another
    user cycling through pids could otherwise put theirs in a victim's job (and on the
    victim's GPUs). Unknown uids (the process gone, no owner listed) are not held against
    it."""
    job = table.jobs.get(listed.job_id)
    if uid is None or job is None or job.user_id is None:
        return True
    return uid in (0, job.user_id)


def _environ_claim(
    pid: int, procs: ProcessReader, seen: Mapping[str, Any]
) -> tuple[PidJob | None, int | None]:
    """The job the process's environment names, and the process's uid (captured first)."""
    claimed = seen.get("process.env.SLURM_JOB_ID")
    if isinstance(claimed, str):
        seen_uid = seen.get("user.id")
        uid = seen_uid if isinstance(seen_uid, int) and not isinstance(seen_uid, bool) else None
        return job_from_environ(b"SLURM_JOB_ID=" + claimed.encode()), uid
    return procs.environ_job(pid), procs.uid(pid)


def unlisted_claim(
    pid: int, table: JobTable, procs: ProcessReader, seen: Mapping[str, Any] | None = None
) -> str | None:
    """The job id a process's environment names when the job table does not hold that job.

    A job that started after the table was fetched looks like this (on proctrack/linuxproc
    nodes listpids does not list its processes either), and so does a forged SLURM_JOB_ID:
    only a fresh job list tells them apart, so the caller refreshes before deciding.
    """
    claim, _uid = _environ_claim(pid, procs, seen or {})
    if claim is None or claim.job_id in table.jobs:
        return None
    return claim.job_id


def _from_environ(
    pid: int, table: JobTable, procs: ProcessReader, seen: Mapping[str, Any]
) -> PidJob | None:
    found, uid = _environ_claim(pid, procs, seen)
    if found is None:
        return None
    # A user can only claim their own job: the job's owner must be the process's uid.
    job = table.jobs.get(found.job_id)
    if job is None or job.user_id is None or uid is None or job.user_id != uid:
        return None
    return found


def job_fields(found: PidJob | None, table: JobTable, host: str) -> dict[str, Any]:
    """`slurm.job.*` of an attributed process ({} when it has no job)."""
    if found is None:
        return {}
    job = table.jobs.get(found.job_id) or JobRecord(found.job_id)
    fields = job.fields(host)
    fields["slurm.job.id_source"] = found.source
    if found.step is not None:
        fields["slurm.job.step"] = found.step
    return fields

"""NodeView: what enrichment needs to know about the node, read where the sensors ran.

The sensors and the capture read the node at one moment, through one SensorContext (its roots
and `raw_input`, so a snapshot records and replays these reads as it does the sensors'). The
view is an immutable value: it can travel through the agent's queue to the thread that
enriches, and enrichment reads nothing else, so it never sees the node at a later moment than
the sensors did.

What the capture reads, and only when some event needs it:
- process and user fields of the pids events carry without a user (an RDMA queue pair's pid);
- what job attribution needs of those pids (cgroup, parents up the tree, the job id a
  process's environment claims, its uid), as `attribution` asks for it;
- the Slurm job table (cached per node by JobContext) and the status records it produced;
- the node's /etc/hosts, for events with a peer address; the node's passwd.
"""

from __future__ import annotations

import ipaddress
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from hpcsec.detector.core.schema import Event
from hpcsec.detector.slurm.attribution import (
    ProcReader,
    RecordedProcesses,
    attribute,
    unlisted_claim,
)
from hpcsec.detector.slurm.jobs import job_context
from hpcsec.detector.slurm.parse import JobRecord, PidJob
from hpcsec.detector.slurm.table import EMPTY_TABLE, JobTable
from hpcsec.sensors.base import FsRoot, SensorContext
from hpcsec.sensors.procinfo import Users, owner_key, process_fields, users_of

FILE_EVENTS_NOTE = (
    "events read from a file carry no node to look at: they get no process or Slurm job "
    "fields beyond those they hold; only cross-event and site-policy fields are added"
)
# Events with a peer address, and events about the node rather than a process.
PEER_CATEGORIES = ("roce_flow", "network_socket")
NODE_CATEGORIES = ("rdma_counters", "roce_flow", "gpu_device")


@dataclass(frozen=True)
class SlurmView:
    """The job table as the capture saw it, and whether Slurm answered."""

    table: JobTable = EMPTY_TABLE
    reachable: bool | None = None  # None: never asked
    status: tuple[Event, ...] = ()  # outage, recovery and parse-error records to report
    # job ids processes' environments named that no table fetched since has settled yet
    pending_jobs: frozenset[str] = frozenset()

    @property
    def list_known(self) -> bool:
        """Slurm answered (live or in the snapshot) and its job list parsed cleanly."""
        return self.reachable is True and not self.table.errors


@dataclass(frozen=True)
class NodeView:
    host_name: str
    processes: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    procs: RecordedProcesses = field(default_factory=RecordedProcesses)
    slurm: SlurmView | None = None  # None: no Slurm enrichment (disabled, or nothing needs it)
    hosts: Mapping[str, frozenset[str]] = field(default_factory=dict)
    users: Users = field(default_factory=Users)

    def jobs_on_node(self) -> list[JobRecord]:
        return [] if self.slurm is None else self.slurm.table.jobs_on(self.host_name)

    def status_events(self) -> list[Event]:
        """The records the capture produced about Slurm (unreachable, back, unparsable).

        They are events of the sample the view was captured with, added once by whoever
        captured it, never by enrichment: a sample may be enriched in several parts.
        """
        return [] if self.slurm is None else [dict(status) for status in self.slurm.status]

    def job_of(self, pid: int, seen: Mapping[str, Any]) -> PidJob | None:
        """The job of `pid` from the captured facts (the same decision the capture made)."""
        if self.slurm is None:
            return None
        return attribute(pid, self.slurm.table, self.procs, seen)

    def job_decided(self, pid: int, seen: Mapping[str, Any]) -> bool:
        """Whether "no job" is an answer for `pid`: Slurm gave a clean job list, and the
        process does not name a job that started after it (pending a fresh list)."""
        if self.slurm is None or not self.slurm.list_known:
            return False
        if not self.slurm.pending_jobs:
            return True
        claim = unlisted_claim(pid, self.slurm.table, self.procs, seen)
        return claim is None or claim not in self.slurm.pending_jobs


def event_pid(event: Event) -> int | None:
    pid = event.get("process.pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return None
    return pid


def needs_process_fields(event: Event) -> bool:
    """An event with a pid but no user: the sensor did not name the process (RDMA QPs)."""
    return "user.name" not in event and event_pid(event) is not None


def needs_job(event: Event) -> bool:
    """Prolog/epilog events already name their job."""
    return "slurm.job.id" not in event and event_pid(event) is not None


def _needs_slurm(event: Event) -> bool:
    return (
        event_pid(event) is not None
        or "user.id" in event
        or "user.name" in event
        or event.get("event.category") in NODE_CATEGORIES
        or _is_peer(event)
    )


def _is_peer(event: Event) -> bool:
    return event.get("event.category") in PEER_CATEGORIES and bool(event.get("destination.ip"))


def capture_view(ctx: SensorContext, events: list[Event], slurm: bool = True) -> NodeView:
    """Read, through `ctx`, what enrichment of `events` will need (see the module docstring)."""
    users = Users()
    processes: dict[int, Mapping[str, Any]] = {}
    if any(needs_process_fields(e) for e in events):
        users = users_of(ctx)
        for event in filter(needs_process_fields, events):
            pid = event["process.pid"]
            if pid not in processes:
                processes[pid] = process_fields(ctx, pid, users)
    slurm_view, procs = None, RecordedProcesses()
    if slurm and any(_needs_slurm(e) for e in events):
        slurm_view, procs = _capture_jobs(ctx, events, processes)
    hosts = host_addresses(ctx.etc) if any(_is_peer(e) for e in events) else {}
    return NodeView(ctx.host_name, processes, procs, slurm_view, hosts, users)


def _capture_jobs(
    ctx: SensorContext, events: list[Event], processes: Mapping[int, Mapping[str, Any]]
) -> tuple[SlurmView, RecordedProcesses]:
    jobs = job_context(ctx)
    jobs.refresh(ctx)
    reader = ProcReader(ctx.proc, partial(owner_key, ctx))
    for _ in range(2):
        refreshes = jobs.refreshes
        for event in filter(needs_job, events):
            pid = event["process.pid"]
            # As enrichment will see it: the process fields fill what the sensor left out.
            seen = {**processes.get(pid, {}), **event}
            jobs.pid_job(ctx, pid, seen=seen, procs=reader)
        if jobs.refreshes == refreshes:
            break
        # A process named a job newer than the table, which was fetched again: ask once more
        # with the new table, so the facts cover the walk enrichment will make with it.
    status = tuple(jobs.take_status())
    view = SlurmView(jobs.table, jobs.reachable, status, jobs.pending_claims())
    return view, reader.recorded()


def host_addresses(etc: FsRoot) -> dict[str, frozenset[str]]:
    """Short host name -> addresses, from the node's own /etc/hosts (through the etc root)."""
    table: dict[str, set[str]] = defaultdict(set)
    text = etc.read_text("hosts") or ""
    for line in text.splitlines():
        fields = line.split("#", 1)[0].split()
        if len(fields) < 2:
            continue
        try:
            address = str(ipaddress.ip_address(fields[0]))
        except ValueError:
            continue
        for name in fields[1:]:
            table[name.split(".")[0]].add(address)
    return {name: frozenset(addresses) for name, addresses in table.items()}

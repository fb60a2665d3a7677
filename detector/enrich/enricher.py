"""Enrichment: the Slurm job of each event, what one event says about another, site policy.

Order matters: the job comes first (policy decides asset access by the job's Slurm account),
then the cross-event fields (users on each GPU, whether a peer address is a node of the
job), then policy, which every event gets.
"""

from __future__ import annotations

import ipaddress
from collections import defaultdict
from collections.abc import Iterable

from hpcsec.detector.config.site import SiteConfig
from hpcsec.detector.core.schema import Event
from hpcsec.detector.enrich.policy import policy_for
from hpcsec.detector.enrich.slurm_job import SlurmEnricher
from hpcsec.detector.slurm.jobs import job_context
from hpcsec.sensors.base import SensorContext
from hpcsec.sensors.procinfo import process_fields, users_of

PEER_CATEGORIES = ("roce_flow", "network_socket")
# Events about the node rather than a process: they get the count of jobs running here.
NODE_CATEGORIES = ("rdma_counters", "roce_flow", "gpu_device")


class Enricher:
    def __init__(self, config: SiteConfig, slurm: bool = True):
        self.config = config
        self.slurm = SlurmEnricher() if slurm else None

    def enrich(self, events: list[Event], ctx: SensorContext | None = None) -> list[Event]:
        """Enrich in place and return `events` (Slurm status records may be appended)."""
        if ctx is not None:
            fill_process_fields(events, ctx)
        if ctx is not None and self.slurm is not None:
            events = self.slurm.enrich(events, ctx)
            mark_job_peers(events, ctx)
            mark_node_jobs(events, ctx)
        fill_gpu_users(events)
        policy = policy_for(self.config)
        for event in events:
            policy.apply(event)
        return events


def fill_process_fields(events: list[Event], ctx: SensorContext) -> None:
    """Process and user fields for events that carry only a pid (e.g. RDMA queue pairs).

    Read through the procfs root, so a replayed snapshot names the process from its own
    proc/ copy. Fields a sensor already set are kept.
    """
    users = None
    for event in events:
        pid = event.get("process.pid")
        if "user.name" in event or not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
            continue
        if users is None:
            users = users_of(ctx)
        for key, value in process_fields(ctx, pid, users).items():
            event.setdefault(key, value)


def mark_node_jobs(events: list[Event], ctx: SensorContext) -> None:
    """`slurm.node.job_count` on node-level events: traffic on an idle node is a signal."""
    node_events = [e for e in events if e.get("event.category") in NODE_CATEGORIES]
    if not node_events:
        return
    jobs = job_context(ctx)
    jobs.refresh(ctx)
    # Jobs seen on this node's processes (cgroup) count even when Slurm's list lacks them.
    running = {str(e["slurm.job.id"]) for e in events if e.get("slurm.job.id") is not None}
    if not job_list_known(jobs):
        if not running:
            return  # unknown is not zero: no job count when Slurm did not answer
    else:
        running |= {job.job_id for job in jobs.jobs_on(ctx.host_name)}
    for event in node_events:
        event.setdefault("slurm.node.job_count", len(running))


def job_list_known(jobs: object) -> bool:
    """Slurm answered (live or in the snapshot) and its job list parsed cleanly."""
    return getattr(jobs, "reachable", None) is True and not jobs.table.errors  # type: ignore[attr-defined]


def fill_gpu_users(events: Iterable[Event]) -> None:
    """`gpu.process_users` / `gpu.process_user_count` on each gpu_device, from gpu_process."""
    events = list(events)
    users: dict[object, set[str]] = defaultdict(set)
    for e in events:
        if e.get("event.category") == "gpu_process":
            name = e.get("user.name") or (str(e["user.id"]) if "user.id" in e else None)
            if name is not None:
                users[(e.get("host.name"), e.get("gpu.uuid") or e.get("gpu.index"))].add(name)
    for e in events:
        if e.get("event.category") == "gpu_device":
            found = users.get((e.get("host.name"), e.get("gpu.uuid") or e.get("gpu.index")))
            if found is None and e.get("gpu.process_users"):
                continue  # the sensor (or a replayed event) already said who
            e["gpu.process_users"] = sorted(found or ())
            e["gpu.process_user_count"] = len(found or ())


def host_addresses(ctx: SensorContext) -> dict[str, set[str]]:
    """Host name -> addresses, from the node's own /etc/hosts (through the etc root)."""
    table: dict[str, set[str]] = defaultdict(set)
    text = ctx.etc.read_text("hosts") or ""
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
    return table


def mark_job_peers(events: list[Event], ctx: SensorContext) -> None:
    """`destination.is_job_node`: is the peer address one of the job's nodes?

    Events with a job use that job's nodes; RoCE flows carry no pid, so they use the nodes of
    every job running on this node. A node with no job has no job peers at all.
    """
    peers = [
        e
        for e in events
        if e.get("event.category") in PEER_CATEGORIES
        and e.get("destination.ip")
        and "destination.is_job_node" not in e
    ]
    if not peers:
        return
    addresses = host_addresses(ctx)
    jobs = job_context(ctx)
    jobs.refresh(ctx)
    node_jobs = jobs.jobs_on(ctx.host_name)
    local_nodes = {n.split(".")[0] for job in node_jobs for n in job.nodes}

    def addresses_of(nodes: Iterable[str]) -> set[str]:
        return {a for n in nodes for a in addresses.get(str(n).split(".")[0], ())}

    local = addresses_of(local_nodes)
    # Flows carry no pid: whether their peer is a job node is known only from a job list
    # Slurm gave, and that agrees with the jobs this node's processes are in.
    seen_jobs = {str(e["slurm.job.id"]) for e in events if e.get("slurm.job.id") is not None}
    listed = {job.job_id for job in node_jobs}
    local_known = job_list_known(jobs) and seen_jobs <= listed
    for e in peers:
        try:
            dest = str(ipaddress.ip_address(e["destination.ip"]))
        except ValueError:
            continue
        if ipaddress.ip_address(dest).is_loopback or ipaddress.ip_address(dest).is_unspecified:
            continue
        nodes = e.get("slurm.job.nodes")
        if isinstance(nodes, list):
            e["destination.is_job_node"] = dest in addresses_of(nodes)
        elif e.get("slurm.job.id") is None and local_known:
            e["destination.is_job_node"] = dest in local
        # else: a job whose nodes Slurm did not give, or no job list: undecided

"""Slurm enrichment, from the NodeView captured where the sensors ran.

Every event with a `process.pid` gets the `slurm.job.*` of its job; events whose process has
no job get no `slurm.job.id` at all (rules test `slurm.job.id: null`). `gpu_process` events
also get `gpu.allocated_to_job`: whether their GPU is in the job's allocation on this node
(false for a process with no job, once that is decided).

Events with a user (`user.id`, else `user.name`) get `slurm.node.user_has_job`: whether that
user has a running job on this node. A process with no job of a user who has one here is an
SSH session outside pam_slurm_adopt; of a user who has none, someone who should not be here.

Unknown is never "no": "no job" is decided only when Slurm gave a clean job list and the
process does not name (in its environment) a job newer than that list. Until then a process
without a job id has neither `slurm.node.user_has_job` nor `gpu.allocated_to_job`, so rules
that conclude from the absence of a job require one of them.

Node-level events (RDMA counters, RoCE flows, GPU devices: no pid) get
`slurm.node.job_count`, the jobs running on this node, so rules can tell traffic or GPU use on
an idle node; it is left out while Slurm does not answer and no process shows a job (unknown
is not zero).

Events with a peer address get `destination.is_job_node`: is the peer one of the job's nodes?
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping

from hpcsec.detector.core.schema import Event
from hpcsec.detector.enrich.view import (
    NODE_CATEGORIES,
    PEER_CATEGORIES,
    NodeView,
    needs_job,
)
from hpcsec.detector.slurm.attribution import job_fields
from hpcsec.detector.slurm.parse import JobRecord

JOB_FIELDS = frozenset(
    {
        "slurm.job.id",
        "slurm.job.id_source",
        "slurm.job.step",
        "slurm.job.user",
        "slurm.job.account",
        "slurm.job.partition",
        "slurm.job.nodes",
        "slurm.job.gpus",
        "slurm.job.state",
        "slurm.job.start",
        "slurm.job.name",
        "gpu.allocated_to_job",
        "slurm.node.user_has_job",
    }
)


def apply_jobs(events: list[Event], view: NodeView | None) -> None:
    """Job fields of each process, and which users have a job here."""
    if view is None or view.slurm is None:
        return
    undecided = [e for e in filter(needs_job, events) if not _job_of_event(e, view)]
    if view.slurm.reachable:
        mark_users_with_jobs(events, view.jobs_on_node(), skip=undecided)


def _job_of_event(event: Event, view: NodeView) -> bool:
    """Set the job fields of `event`; False when whether it has a job is still unknown."""
    assert view.slurm is not None
    pid = event["process.pid"]
    fields = job_fields(view.job_of(pid, event), view.slurm.table, view.host_name)
    for key, value in fields.items():
        event.setdefault(key, value)
    decided = bool(fields) or view.job_decided(pid, event)
    if event.get("event.category") == "gpu_process":
        index = event.get("gpu.index")
        gpus = fields.get("slurm.job.gpus")
        if not fields and decided:
            event["gpu.allocated_to_job"] = False
        elif isinstance(index, int) and gpus is not None:
            event["gpu.allocated_to_job"] = index in gpus
        # a job whose GRES detail we could not read, or no job list: leave the field out
    return decided


def mark_users_with_jobs(
    events: list[Event], on_node: list[JobRecord], skip: Iterable[Event] = ()
) -> None:
    """`slurm.node.user_has_job` on every event with a user (uid first: names can differ
    between Slurm and the node's passwd; the name where the event has no uid).

    A user counts as having a job here when Slurm lists one, or when one of their processes
    was seen in a job (a cgroup names a job the list lacks). Events in `skip` (processes whose
    job is undecided) get no answer.
    """
    uids = {j.user_id for j in on_node if j.user_id is not None}
    names = {j.user for j in on_node if j.user}
    for event in events:
        if event.get("slurm.job.id") is not None and event.get("slurm.job.id_source") in (
            "cgroup",
            "listpids",
        ):
            uid = event.get("user.id")
            if isinstance(uid, int) and not isinstance(uid, bool):
                uids.add(uid)
    skipped = {id(e) for e in skip}
    for event in events:
        if (
            "slurm.node.user_has_job" in event
            or event.get("event.category") == "sensor_status"
            or id(event) in skipped
        ):
            continue
        uid, name = event.get("user.id"), event.get("user.name")
        if isinstance(uid, int) and not isinstance(uid, bool):
            event["slurm.node.user_has_job"] = uid in uids
        elif isinstance(name, str):
            event["slurm.node.user_has_job"] = name in names


def mark_node_jobs(events: list[Event], view: NodeView | None) -> None:
    """`slurm.node.job_count` on node-level events: traffic on an idle node is a signal.

    The count is the jobs Slurm lists on this node together with the jobs this node's
    processes were seen in (a cgroup names a job even when the list lacks it). While Slurm
    does not answer, only the jobs seen count, and with none seen the field stays out.
    """
    if view is None or view.slurm is None:  # events from a file: no pass over them
        return
    node_events = [
        e
        for e in events
        if e.get("event.category") in NODE_CATEGORIES and "slurm.node.job_count" not in e
    ]
    if not node_events:
        return
    running = {str(e["slurm.job.id"]) for e in events if e.get("slurm.job.id") is not None}
    if view.slurm.reachable:
        running |= {job.job_id for job in view.jobs_on_node()}
    elif not running:
        return  # unknown is not zero
    for event in node_events:
        event["slurm.node.job_count"] = len(running)


def mark_job_peers(events: list[Event], view: NodeView | None) -> None:
    """`destination.is_job_node`: is the peer address one of the job's nodes?

    Events with a job use that job's nodes; RoCE flows carry no pid, so they use the nodes of
    every job running on this node. A node with no job has no job peers at all.
    """
    if view is None or view.slurm is None:  # events from a file: no pass over them
        return
    peers = [
        e
        for e in events
        if e.get("event.category") in PEER_CATEGORIES
        and e.get("destination.ip")
        and "destination.is_job_node" not in e
    ]
    if not peers:
        return
    node_jobs = view.jobs_on_node()
    local = _addresses_of(view.hosts, (n for job in node_jobs for n in job.nodes))
    # Flows carry no pid: whether their peer is a job node is known only from a job list
    # Slurm gave, and that agrees with the jobs this node's processes are in.
    seen_jobs = {str(e["slurm.job.id"]) for e in events if e.get("slurm.job.id") is not None}
    local_known = view.slurm.list_known and seen_jobs <= {job.job_id for job in node_jobs}
    for e in peers:
        try:
            dest = ipaddress.ip_address(e["destination.ip"])
        except ValueError:
            continue
        if dest.is_loopback or dest.is_unspecified:
            continue
        nodes = e.get("slurm.job.nodes")
        if isinstance(nodes, list):
            e["destination.is_job_node"] = str(dest) in _addresses_of(view.hosts, nodes)
        elif e.get("slurm.job.id") is None and local_known:
            e["destination.is_job_node"] = str(dest) in local
        # else: a job whose nodes Slurm did not give, or no job list: undecided


def _addresses_of(hosts: Mapping[str, frozenset[str]], nodes: Iterable[object]) -> set[str]:
    return {a for n in nodes for a in hosts.get(str(n).split(".")[0], ())}

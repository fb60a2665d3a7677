"""Slurm enrichment: every event with a `process.pid` gets the `slurm.job.*` of its job.

Events whose process has no job get no `slurm.job.id` at all (rules test `slurm.job.id: null`).
`gpu_process` events also get `gpu.allocated_to_job`: whether their GPU is in the job's
allocation on this node (false for a process with no job). `rdma_qp`, `file_access`,
`network_socket` and `process` events are handled the same way, through their pid.

Node-level events (RDMA counters, RoCE flows, GPU devices: no pid) get
`slurm.node.job_count`, the jobs running on this node, so rules can tell traffic or GPU use
on an idle node; it is left out while Slurm does not answer (unknown is not zero).

Events with a user (`user.id`, else `user.name`) get `slurm.node.user_has_job`: whether that
user has a running job on this node. A process with no job of a user who has one here is an
SSH session outside pam_slurm_adopt; of a user who has none, someone who should not be here.
"""

from __future__ import annotations

from hpcsec.detector.core.schema import Event
from hpcsec.detector.slurm.jobs import JobContext, job_context
from hpcsec.detector.slurm.parse import JobRecord
from hpcsec.sensors.base import SensorContext

NODE_CATEGORIES = ("rdma_counters", "roce_flow", "gpu_device")


class SlurmEnricher:
    """Adds job fields in place; one refresh of the job table per batch at most."""

    def __init__(self, jobs: JobContext | None = None):
        self.jobs = jobs

    def enrich(self, events: list[Event], ctx: SensorContext) -> list[Event]:
        """Enrich `events` (modified in place and returned), then append Slurm status events."""
        jobs = self.jobs or job_context(ctx)
        node_events = [
            e
            for e in events
            if e.get("event.category") in NODE_CATEGORIES and "slurm.node.job_count" not in e
        ]
        if node_events or any(_pid(e) is not None or _has_user(e) for e in events):
            jobs.refresh(ctx)
        for event in events:
            enrich_event(event, jobs, ctx)
        if jobs.reachable:
            on_node = jobs.jobs_on(ctx.host_name)
            for event in node_events:
                event["slurm.node.job_count"] = len(on_node)
            mark_users_with_jobs(events, on_node)
        events.extend(jobs.take_status())
        return events


def _has_user(event: Event) -> bool:
    return "user.id" in event or "user.name" in event


def mark_users_with_jobs(events: list[Event], on_node: list[JobRecord]) -> None:
    """`slurm.node.user_has_job` on every event with a user (uid first: names can differ
    between Slurm and the node's passwd; the name where the event has no uid)."""
    uids = {j.user_id for j in on_node if j.user_id is not None}
    names = {j.user for j in on_node if j.user}
    for event in events:
        if "slurm.node.user_has_job" in event or event.get("event.category") == "sensor_status":
            continue
        uid, name = event.get("user.id"), event.get("user.name")
        if isinstance(uid, int) and not isinstance(uid, bool):
            event["slurm.node.user_has_job"] = uid in uids
        elif isinstance(name, str):
            event["slurm.node.user_has_job"] = name in names


def _pid(event: Event) -> int | None:
    pid = event.get("process.pid")
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return None
    return pid


def enrich_event(event: Event, jobs: JobContext, ctx: SensorContext) -> Event:
    pid = _pid(event)
    if pid is None or "slurm.job.id" in event:  # prolog/epilog events already name their job
        return event
    fields = jobs.fields_for_pid(ctx, pid, seen=event)
    for key, value in fields.items():
        event.setdefault(key, value)
    if event.get("event.category") == "gpu_process":
        index = event.get("gpu.index")
        gpus = fields.get("slurm.job.gpus")
        if not fields:
            event["gpu.allocated_to_job"] = False
        elif isinstance(index, int) and gpus is not None:
            event["gpu.allocated_to_job"] = index in gpus
        # a job whose GRES detail we could not read: leave the field out rather than guess
    return event

"""Enrichment: declared steps, run in a fixed order, each the only writer of its fields.

The order (STEPS) matters:
1. `process`: process and user fields of events that carry only a pid (RDMA queue pairs);
2. `job`: the Slurm job of each process (attribution reads the process fields), and users
   with a job on this node (Slurm's status records come with the view, not from a step);
3. `node_jobs` and `job_peers`: fields relating events to each other through their jobs
   (the jobs running here, whether a peer address is a node of the job);
4. `gpu_users`: who runs on each GPU, from the GPU's processes;
5. `policy`: the site's decisions, last because asset access depends on the job's account.

The first three read only the NodeView captured where the sensors ran; events from a file
have none (FILE_EVENTS_NOTE), and only the cross-event and policy steps run on them.
Enrichment never reads the node itself.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from hpcsec.detector.config.site import SiteConfig
from hpcsec.detector.core.schema import Event
from hpcsec.detector.enrich.policy import POLICY_FIELDS, policy_for
from hpcsec.detector.enrich.slurm_job import (
    JOB_FIELDS,
    apply_jobs,
    mark_job_peers,
    mark_node_jobs,
)
from hpcsec.detector.enrich.view import FILE_EVENTS_NOTE, NodeView, needs_process_fields

__all__ = ["FILE_EVENTS_NOTE", "POLICY_STEP", "STEPS", "EnrichStep", "Enricher", "apply_policy"]

PROCESS_FIELDS = frozenset(
    {
        "process.pid",
        "process.name",
        "process.executable",
        "process.parent.pid",
        "process.args",
        "process.command_line",
        "user.id",
        "user.name",
    }
)
GPU_USER_FIELDS = frozenset({"gpu.process_users", "gpu.process_user_count"})


@dataclass(frozen=True)
class EnrichStep:
    """One enrichment step: the fields only it writes, and how it writes them (in place)."""

    name: str
    writes: frozenset[str]
    apply: Callable[[list[Event], NodeView | None, SiteConfig], None]


def fill_process_fields(events: list[Event], view: NodeView | None) -> None:
    """Process and user fields for events that carry only a pid; fields a sensor set stay."""
    if view is None:
        return
    for event in filter(needs_process_fields, events):
        for key, value in view.processes.get(event["process.pid"], {}).items():
            event.setdefault(key, value)


def fill_gpu_users(events: list[Event]) -> None:
    """`gpu.process_users` / `gpu.process_user_count` on each gpu_device, from gpu_process
    (one pass over the events to find both kinds: it runs on every batch)."""
    users: dict[object, set[str]] = defaultdict(set)
    devices: list[Event] = []
    for e in events:
        category = e.get("event.category")
        if category == "gpu_process":
            name = e.get("user.name") or (str(e["user.id"]) if "user.id" in e else None)
            if name is not None:
                users[(e.get("host.name"), e.get("gpu.uuid") or e.get("gpu.index"))].add(name)
        elif category == "gpu_device":
            devices.append(e)
    for e in devices:
        found = users.get((e.get("host.name"), e.get("gpu.uuid") or e.get("gpu.index")))
        if found is None and e.get("gpu.process_users"):
            continue  # the sensor (or a replayed event) already said who
        e["gpu.process_users"] = sorted(found or ())
        e["gpu.process_user_count"] = len(found or ())


def _apply_policy(events: list[Event], _view: NodeView | None, config: SiteConfig) -> None:
    apply = policy_for(config).apply
    for event in events:
        apply(event)


POLICY_STEP = frozenset({"policy"})
STEPS: tuple[EnrichStep, ...] = (
    EnrichStep("process", PROCESS_FIELDS, lambda ev, view, _c: fill_process_fields(ev, view)),
    EnrichStep("job", JOB_FIELDS, lambda ev, view, _c: apply_jobs(ev, view)),
    EnrichStep(
        "node_jobs",
        frozenset({"slurm.node.job_count"}),
        lambda ev, view, _c: mark_node_jobs(ev, view),
    ),
    EnrichStep(
        "job_peers",
        frozenset({"destination.is_job_node"}),
        lambda ev, view, _c: mark_job_peers(ev, view),
    ),
    EnrichStep("gpu_users", GPU_USER_FIELDS, lambda ev, _v, _c: fill_gpu_users(ev)),
    EnrichStep("policy", POLICY_FIELDS, _apply_policy),
)


class Enricher:
    def __init__(self, config: SiteConfig, steps: tuple[EnrichStep, ...] = STEPS):
        self.config = config
        self.steps = steps

    def enrich(
        self, events: list[Event], view: NodeView | None, skip: frozenset[str] = frozenset()
    ) -> list[Event]:
        """Enrich in place and return `events`.

        `view`: the node as captured with these events; None for events read from a file.
        `skip`: names of steps already applied to these events (see `apply_policy`).
        """
        for step in self.steps:
            if step.name not in skip:
                step.apply(events, view, self.config)
        return events


def apply_policy(events: list[Event], config: SiteConfig) -> frozenset[str]:
    """The policy step alone, ahead of the others, for events without a node view (read
    from a file: a worker process that parses them applies it there); returns the steps
    done, for `Enricher.enrich`'s `skip`. Without a view the steps before policy leave the
    events alone except `gpu_users`, which writes only fields policy does not read, so the
    order makes no difference to the values; the fields `gpu_users` will write get their
    place first, so they also come in the same order (tests/detector/test_enrich_steps.py
    checks both)."""
    for event in events:
        if event.get("event.category") == "gpu_device" and not event.get("gpu.process_users"):
            # fill_gpu_users sets both on such an event: a placeholder keeps their place
            for name in ("gpu.process_users", "gpu.process_user_count"):
                event.setdefault(name, None)
    _apply_policy(events, None, config)
    return POLICY_STEP

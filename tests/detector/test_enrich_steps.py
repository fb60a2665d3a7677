"""The enrichment steps: a fixed order, one owner per field, every field in the schema."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from hpcsec.detector.config.site import load_config
from hpcsec.detector.core.schema import Event, is_known_field
from hpcsec.detector.enrich.enricher import STEPS, Enricher, EnrichStep, apply_policy
from hpcsec.detector.enrich.view import capture_view
from hpcsec.detector.runtime import registry
from hpcsec.detector.runtime.sources import SensorSet, demo_snapshot_dir
from hpcsec.sensors.snapshot import open_snapshot


def test_steps_run_job_first_then_cross_event_then_policy():
    assert [s.name for s in STEPS] == [
        "process",
        "job",
        "node_jobs",
        "job_peers",
        "gpu_users",
        "policy",
    ]


def test_no_field_has_two_owners():
    owners: dict[str, list[str]] = {}
    for step in STEPS:
        for name in step.writes:
            owners.setdefault(name, []).append(step.name)
    assert {k: v for k, v in owners.items() if len(v) > 1} == {}
    assert owners["slurm.node.job_count"] == ["node_jobs"]
    assert owners["firmware.drift"] == ["policy"]


def test_every_declared_field_is_in_the_schema():
    assert sorted(n for s in STEPS for n in s.writes if not is_known_field(n)) == []


def _demo_samples() -> list[tuple[list[Event], object]]:
    """Every demo snapshot sample: its sensors' events and the view captured with them."""
    root = demo_snapshot_dir()
    config = load_config(Path(root) / "site-config.yml")
    snapshot = open_snapshot(Path(root))
    state: dict = {}
    out = []
    with SensorSet(registry.select(None)) as sensors:
        for sample in snapshot.samples:
            ctx = sample.context(config, state)
            events = [e for run in sensors.sample(ctx) for e in run.events]
            out.append((events, capture_view(ctx, events), config))
    return out


def written_by(step: EnrichStep, events: list[Event], view, config) -> set[str]:
    """Fields `step` added to or changed on the events it was given."""
    before = [dict(e) for e in events]
    step.apply(events, view, config)
    return {
        key
        for old, new in zip(before, events, strict=False)
        for key, value in new.items()
        if key not in old or old[key] != value
    }


@pytest.mark.parametrize("sample", range(4))
def test_steps_write_only_their_own_fields_and_only_schema_fields(sample):
    events, view, config = _demo_samples()[sample]
    written: set[str] = set()
    for step in STEPS:
        fields = written_by(step, events, view, config)
        assert fields <= step.writes, f"{step.name} wrote undeclared {fields - step.writes}"
        assert [f for f in fields if not is_known_field(f)] == []
        written |= fields
    # the demo exercises the job, peer, node and policy steps, not only the easy ones
    assert {"slurm.job.id", "slurm.node.job_count", "hpcsec.in_maintenance"} <= written


@pytest.mark.parametrize("sample", range(4))
def test_policy_applied_first_gives_what_the_steps_in_order_give_without_a_view(sample):
    """Events from a file (no node view): the worker that parses them applies the policy
    first (runtime/chunked.py), and the pipeline then runs the other steps."""
    events, _view, config = _demo_samples()[sample]
    in_order = copy.deepcopy(events)
    Enricher(config).enrich(in_order, None)
    policy_first = copy.deepcopy(events)
    done = apply_policy(policy_first, config)
    Enricher(config).enrich(policy_first, None, skip=done)
    assert [list(e.items()) for e in policy_first] == [list(e.items()) for e in in_order]
    assert {"gpu_device", "gpu_process", "file_access"} <= {e["event.category"] for e in events}
    assert all("hpcsec.in_maintenance" in e for e in in_order)

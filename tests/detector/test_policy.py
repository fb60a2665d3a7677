"""Site policy at enrichment: detector/policy.py against a real parsed config."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcsec.detector.config.site import load_config
from hpcsec.detector.enrich.policy import annotate_fleet_majority, policy_for

CONFIG = """\
node_class: h100-8x
assets:
  - name: llama-70b
    kind: model
    paths: ["/lustre/models/llama-70b/**"]
    readers: {accounts: [llm-core]}
    writers: {users: [svc-publish]}
  - name: imagenet
    kind: dataset
    paths: ["/lustre/datasets/imagenet/**"]
    readers: {users: [bob]}
    writers: {users: [svc-data], accounts: [data-eng]}
admins: {users: [adm-carol]}
gpu_services: [nv-hostengine, nvidia-persistenced]
maintenance:
  - {start: 2026-12-01T02:00:00Z, end: 2026-12-01T06:00:00Z, hosts: ["gpu-[001-016]"]}
firmware:
  baselines: {h100-8x: {gpu_vbios: "96.00.99.00.01", hca: "28.39.1002"}}
  vulnerable: {hca: ["28.33.*"]}
"""


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    path = Path(tmp_path_factory.mktemp("policy")) / "site.yml"
    path.write_text(CONFIG)
    return load_config(path)


def file_event(path, user, account=None, action="open", ts="2026-11-30T10:00:00Z"):
    event = {
        "@timestamp": ts,
        "event.category": "file_access",
        "event.action": action,
        "host.name": "gpu-017",
        "file.path": path,
        "user.name": user,
    }
    if account:
        event["slurm.job.account"] = account
    return event


def test_asset_read_allowed_by_job_account_not_by_user(config):
    allowed = file_event("/lustre/models/llama-70b/model-00001.safetensors", "alice", "llm-core")
    denied = file_event("/lustre/models/llama-70b/model-00001.safetensors", "mallory", "vision")
    policy_for(config).apply(allowed)
    policy_for(config).apply(denied)
    assert allowed["hpcsec.asset.name"] == "llama-70b"
    assert allowed["hpcsec.asset.kind"] == "model"
    assert allowed["hpcsec.asset.read_allowed"] is True
    assert allowed["hpcsec.asset.write_allowed"] is False
    assert denied["hpcsec.asset.read_allowed"] is False
    assert denied["hpcsec.asset.write_allowed"] is False


def test_an_asset_read_through_another_path_is_decided_by_its_own_path(config):
    """A bind mount or hard link: file.path is what the opener used, the asset path decides."""
    event = file_event("/home/mallory/view/model-00001.safetensors", "mallory", "vision")
    event["hpcsec.asset.path"] = "/lustre/models/llama-70b/model-00001.safetensors"
    policy_for(config).apply(event)
    assert (event["hpcsec.asset.name"], event["hpcsec.asset.read_allowed"]) == (
        "llama-70b",
        False,
    )


def test_a_newline_in_a_name_under_an_asset_stays_in_the_asset(config):
    """A writer of the tree (or a copy of it) names a directory `a\nb`: `**` still covers
    it, so a read of it is decided as the asset's (a glob's `.` stopped at the newline)."""
    event = file_event("/lustre/models/llama-70b/a\nb/model.safetensors", "mallory", "vision")
    policy_for(config).apply(event)
    assert (event["hpcsec.asset.name"], event["hpcsec.asset.read_allowed"]) == (
        "llama-70b",
        False,
    )


def test_writers_may_write_and_read(config):
    by_user = file_event("/lustre/datasets/imagenet/train/a.JPEG", "svc-data", action="write")
    by_account = file_event("/lustre/datasets/imagenet/x", "carl", "data-eng", action="delete")
    reader = file_event("/lustre/datasets/imagenet/train/a.JPEG", "bob", action="write")
    reader["slurm.node.user_has_job"] = True  # Slurm answered: bob's process is in no job
    for e in (by_user, by_account, reader):
        policy_for(config).apply(e)
    assert (by_user["hpcsec.asset.read_allowed"], by_user["hpcsec.asset.write_allowed"]) == (
        True,
        True,
    )
    assert by_account["hpcsec.asset.write_allowed"] is True
    assert (reader["hpcsec.asset.read_allowed"], reader["hpcsec.asset.write_allowed"]) == (
        True,
        False,
    )


def test_path_outside_assets_and_non_file_events_get_no_asset_fields(config):
    outside = file_event("/lustre/models/llama-70b-copy/w.bin", "alice", "llm-core")
    process = {
        "@timestamp": "2026-11-30T10:00:00Z",
        "event.category": "process",
        "host.name": "gpu-017",
        "file.path": "/lustre/models/llama-70b/w.bin",
    }
    policy_for(config).apply(outside)
    policy_for(config).apply(process)
    assert not any(k.startswith("hpcsec.asset.") for k in outside)
    assert not any(k.startswith("hpcsec.asset.") for k in process)


def test_users_admins_system_and_gpu_services(config):
    admin = {
        "event.category": "process",
        "user.name": "adm-carol",
        "user.id": 1500,
        "process.name": "flint",
        "@timestamp": "2026-11-30T10:00:00Z",
    }
    system = {
        "event.category": "gpu_process",
        "user.name": "root",
        "user.id": 0,
        "process.name": "nv-hostengine",
        "@timestamp": "2026-11-30T10:00:00Z",
    }
    regular = {
        "event.category": "gpu_process",
        "user.name": "alice",
        "user.id": 1000,
        "process.name": "python3",
        "@timestamp": "2026-11-30T10:00:00Z",
    }
    for e in (admin, system, regular):
        policy_for(config).apply(e, "gpu-017")
    assert (admin["user.is_admin"], admin["user.is_system"]) == (True, False)
    assert (system["user.is_admin"], system["user.is_system"]) == (False, True)
    assert (regular["user.is_admin"], regular["user.is_system"]) == (False, False)
    assert system["process.is_gpu_service"] is True
    assert regular["process.is_gpu_service"] is False
    assert admin["process.is_gpu_service"] is False


def test_no_user_fields_invented():
    event = {"event.category": "rdma_counters", "@timestamp": "2026-11-30T10:00:00Z"}
    policy_for(load_config(None)).apply(event)
    assert event == {
        "event.category": "rdma_counters",
        "@timestamp": "2026-11-30T10:00:00Z",
        "hpcsec.in_maintenance": False,
    }


@pytest.mark.parametrize(
    ("host", "ts", "expected"),
    [
        ("gpu-003", "2026-12-01T02:00:00Z", True),  # start is inside
        ("gpu-003", "2026-12-01T05:59:59.999Z", True),
        ("gpu-003", "2026-12-01T06:00:00Z", False),  # end is outside
        ("gpu-003", "2026-12-01T01:59:59Z", False),
        ("gpu-017", "2026-12-01T03:00:00Z", False),  # host not in the window's list
        ("gpu-003", "2026-12-01T04:00:00+01:00", True),  # offsets are converted to UTC
        ("gpu-003", "not a time", False),
    ],
)
def test_maintenance_window_by_host_and_time(config, host, ts, expected):
    event = {"event.category": "firmware", "host.name": host, "@timestamp": ts}
    policy_for(config).apply(event)
    assert event["hpcsec.in_maintenance"] is expected


def test_host_argument_overrides_missing_host_name(config):
    event = {"event.category": "process", "@timestamp": "2026-12-01T03:00:00Z"}
    policy_for(config).apply(event, "gpu-010")
    assert event["hpcsec.in_maintenance"] is True


def firmware(component, version, **extra):
    return {
        "event.category": "firmware",
        "host.name": "gpu-017",
        "@timestamp": "2026-11-30T10:00:00Z",
        "firmware.component": component,
        "firmware.version": version,
        **extra,
    }


def test_firmware_baseline_drift_and_vulnerable(config):
    same, drift, vulnerable, unknown = (
        firmware("gpu_vbios", "96.00.99.00.01"),
        firmware("hca", "28.37.1014"),
        firmware("hca", "28.33.2028"),
        firmware("bios", "2.1.7"),
    )
    for e in (same, drift, vulnerable, unknown):
        policy_for(config).apply(e)
    assert (same["firmware.baseline_version"], same["firmware.drift"]) == ("96.00.99.00.01", False)
    assert same["firmware.known_vulnerable"] is False
    assert (drift["firmware.drift"], drift["firmware.known_vulnerable"]) == (True, False)
    assert (vulnerable["firmware.drift"], vulnerable["firmware.known_vulnerable"]) == (True, True)
    # no baseline for the component: drift is unknown, not false
    assert "firmware.baseline_version" not in unknown and "firmware.drift" not in unknown
    assert unknown["firmware.known_vulnerable"] is False


def test_firmware_fields_from_the_sensor_are_kept(config):
    event = firmware(
        "hca",
        "28.37.1014",
        **{
            "firmware.baseline_version": "28.37.1014",
            "firmware.drift": False,
            "firmware.known_vulnerable": True,
        },
    )
    policy_for(config).apply(event)
    assert (
        event["firmware.baseline_version"],
        event["firmware.drift"],
        event["firmware.known_vulnerable"],
    ) == ("28.37.1014", False, True)


def test_policy_is_prepared_once_per_config(config):
    assert policy_for(config) is policy_for(config)
    other = load_config(None)
    assert policy_for(other) is not policy_for(config)


def fleet_event(host, component, version, device="system"):
    return {
        "event.category": "firmware",
        "host.name": host,
        "firmware.component": component,
        "firmware.device": device,
        "firmware.version": version,
    }


def test_fleet_majority_per_component_counts_hosts_once():
    events = [fleet_event(f"gpu-{i:03d}", "bios", "2.3.1") for i in range(1, 5)]
    events.append(fleet_event("gpu-005", "bios", "2.1.7"))
    # one host with 8 GPUs on an odd VBIOS does not outvote three hosts
    events += [fleet_event("gpu-009", "gpu_vbios", "96.00.61.00.01", f"GPU-{n}") for n in range(8)]
    events += [fleet_event(f"gpu-00{i}", "gpu_vbios", "96.00.99.00.01", "GPU-0") for i in (1, 2, 3)]
    assert annotate_fleet_majority(events) == len(events)
    assert {
        e["firmware.fleet_majority_version"] for e in events if e["firmware.component"] == "bios"
    } == {"2.3.1"}
    assert {
        e["firmware.fleet_majority_version"]
        for e in events
        if e["firmware.component"] == "gpu_vbios"
    } == {"96.00.99.00.01"}


def test_fleet_majority_needs_three_hosts_and_a_strict_majority():
    two_hosts = [
        fleet_event("gpu-001", "hca", "28.39.1002"),
        fleet_event("gpu-002", "hca", "28.37.1014"),
    ]
    split = [fleet_event(f"gpu-00{i}", "hca", v) for i, v in enumerate(("a", "a", "b", "b"), 1)]
    assert annotate_fleet_majority(two_hosts) == 0
    assert annotate_fleet_majority(split) == 0
    assert not any("firmware.fleet_majority_version" in e for e in two_hosts + split)


def test_a_job_without_known_account_leaves_access_undecided():
    from hpcsec.detector.config.site import Asset, Principals, SiteConfig
    from hpcsec.detector.enrich.policy import Policy

    asset = Asset(
        "ckpt",
        "checkpoint",
        ("/ckpt/**",),
        readers=Principals(accounts=("llm",)),
        writers=Principals(accounts=("llm",)),
    )
    policy = Policy(SiteConfig(assets=(asset,)))
    unknown = {
        "event.category": "file_access",
        "file.path": "/ckpt/a",
        "user.name": "alice",
        "slurm.job.id": "42",
    }
    policy.apply(unknown)
    assert "hpcsec.asset.read_allowed" not in unknown
    assert "hpcsec.asset.write_allowed" not in unknown
    # Slurm answered: no job (the enrichment set slurm.node.user_has_job)
    no_job = {
        "event.category": "file_access",
        "file.path": "/ckpt/a",
        "user.name": "alice",
        "slurm.node.user_has_job": False,
    }
    policy.apply(no_job)
    assert no_job["hpcsec.asset.read_allowed"] is False
    # Slurm did not answer: the account that might allow the access is unknown
    job_unknown = {"event.category": "file_access", "file.path": "/ckpt/a", "user.name": "alice"}
    policy.apply(job_unknown)
    assert "hpcsec.asset.read_allowed" not in job_unknown
    assert "hpcsec.asset.write_allowed" not in job_unknown
    known = {**unknown, "slurm.job.account": "other"}
    policy.apply(known)
    assert known["hpcsec.asset.write_allowed"] is False


def test_a_known_job_without_an_account_is_decided_by_its_user():
    from hpcsec.detector.config.site import Asset, Principals, SiteConfig
    from hpcsec.detector.enrich.policy import Policy

    asset = Asset("m", "model", ("/m/**",), readers=Principals(accounts=("llm",)))
    event = {
        "event.category": "file_access",
        "file.path": "/m/w",
        "user.name": "bob",
        "slurm.job.id": "7",
        "slurm.job.user": "bob",
    }  # Slurm without accounting
    Policy(SiteConfig(assets=(asset,))).apply(event)
    assert event["hpcsec.asset.read_allowed"] is False

"""Bundled rules whose events carry no process, file or peer declare what makes their
actions distinct (`alert_identity:`): two GPUs, two HCAs or two firmware components of one
node are two alerts, not one alert whose count hides the second device."""

from __future__ import annotations

import pytest

from hpcsec.detector.alerts.builder import AlertBuilder
from hpcsec.detector.engine.evaluate import Engine
from hpcsec.detector.engine.loader import bundled_rules_dir, load_rules

BASE = {"@timestamp": "2026-11-30T01:00:00Z", "host.name": "gpu-017"}


def _gpu(index):
    return {
        **BASE,
        "event.category": "gpu_device",
        "gpu.index": index,
        "gpu.uuid": f"GPU-5b0c8a3e-000{index}-4d6c-9a51-1f00d0c0ffee",
        "gpu.ecc_mode": 0,
    }


def _hca(device):
    return {
        **BASE,
        "event.category": "rdma_counters",
        "rdma.device": device,
        "rdma.port": 1,
        "rdma.delta.hw.req_remote_access_errors": 50,
    }


def _firmware(component):
    return {
        **BASE,
        "event.category": "firmware",
        "firmware.component": component,
        "firmware.device": "system",
        "firmware.version": "1.0",
        "firmware.baseline_version": "2.0",
        "firmware.drift": True,
        "hpcsec.in_maintenance": False,
    }


def _listener(port):
    return {
        **BASE,
        "event.category": "network_socket",
        "network.state": "listen",
        "network.transport": "tcp",
        "source.ip": "0.0.0.0",
        "source.port": port,
        "process.pid": 5100,
        "process.name": "vllm",
        "process.command_line": "vllm serve /models/m",
        "user.name": "alice",
        "slurm.job.id": "4242",
    }


@pytest.mark.parametrize(
    "ruleset, title, events",
    [
        ("isolation_escape", "GPU with ECC disabled", [_gpu(0), _gpu(1)]),
        (
            "rdma_abuse",
            "Node issued many RDMA requests rejected for bad keys",
            [_hca("mlx5_0"), _hca("mlx5_1")],
        ),
        (
            "firmware_drift",
            "Firmware differs from the golden baseline",
            [_firmware("bios"), _firmware("bmc")],
        ),
        (
            "gpu_hijack",
            "Inference, notebook or Ray service listening on a compute node",
            [_listener(8000), _listener(8265)],
        ),
    ],
)
def test_two_devices_are_two_alerts_and_a_repeat_folds(ruleset, title, events):
    engine = Engine(load_rules([bundled_rules_dir() / f"{ruleset}.yml"]))
    repeat = {**events[0], "@timestamp": "2026-11-30T01:01:00Z"}
    builder = AlertBuilder()
    builder.add(engine.evaluate([*events, repeat]) + engine.flush())
    alerts = [a for a in builder.alerts() if a["rule.title"] == title]
    assert [a["count"] for a in alerts] == [2, 1]

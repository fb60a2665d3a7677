"""Firmware inventory on the fixture node: fake NVML, real-layout sysfs, canned ethtool answers."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from hpcsec.detector.cli import main as cli
from hpcsec.detector.config.site import load_config
from hpcsec.detector.core.schema import FIRMWARE_COMPONENTS
from hpcsec.detector.enrich.enricher import Enricher
from hpcsec.detector.runtime.registry import by_name
from hpcsec.sensors import firmware
from hpcsec.sensors.base import FsRoot, SensorContext, SensorSpec, run_sensor
from hpcsec.sensors.firmware import (
    FirmwareSensor,
    ethtool_drvinfo,
    nic_items,
    physical_interfaces,
)
from hpcsec.sensors.snapshot import record_snapshot
from tests.fakes.nvml import FakeNvml, h100_node, installed
from tests.sensors.replay import replay

POLICY_KEYS = ("firmware.baseline_version", "firmware.drift", "firmware.known_vulnerable")

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures"
DRVINFO = json.loads((FIXTURES / "firmware" / "ethtool-drvinfo.json").read_text())
TIME = "2026-11-30T02:00:00.000Z"
SPEC = SensorSpec("firmware", FirmwareSensor, "firmware")
UUID2 = "GPU-0c9b8a7f-6e5d-4c3b-9a2f-1e0d9c8b7a65"


class CannedEthtool:
    """Answers like the ioctl from the saved `ethtool -i` of the fixture node."""

    def __init__(self):
        self.asked: list[str] = []

    def __call__(self, ifname: str) -> dict[str, str]:
        self.asked.append(ifname)
        if ifname not in DRVINFO:
            raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))
        return DRVINFO[ifname]


def node_ctx(
    sysfs: Path = FIXTURES / "sysfs-node", config=None, state=None, replay=None
) -> SensorContext:
    return SensorContext(
        "gpu-017",
        FsRoot("sys", sysfs),
        FsRoot("proc", FIXTURES / "nvml/proc"),
        FsRoot("etc", FIXTURES / "nvml/etc"),
        timestamp=TIME,
        config=config,
        state=state if state is not None else {},
        replay_inputs=replay,
    )


def inventory_run(fake: FakeNvml | None = None, ctx: SensorContext | None = None, query=None):
    with installed(fake or h100_node()):
        return run_sensor(SPEC, FirmwareSensor(query or CannedEthtool()), ctx or node_ctx())


def firmware_events(run):
    return [e for e in run.events if e["event.category"] == "firmware"]


def triples(run):
    return [
        (e["firmware.component"], e["firmware.device"], e["firmware.version"])
        for e in firmware_events(run)
    ]


def test_inventory_of_the_fixture_node():
    run = inventory_run()
    assert run.ok, run.status
    found = triples(run)
    gpu0 = "GPU-3a4b5c6d-0e1f-4a2b-8c3d-4e5f6a7b8c90"
    assert found[:5] == [
        ("gpu_vbios", gpu0, "96.00.99.00.01"),
        ("gpu_inforom_image", gpu0, "G520.0200.00.05"),
        ("gpu_inforom_oem", gpu0, "2.1"),
        ("gpu_inforom_ecc", gpu0, "7.16"),
        ("gpu_gsp", gpu0, "550.127.05"),
    ]  # no power object on H100
    assert found[40:] == [
        ("gpu_driver", "system", "550.127.05"),
        ("hca", "mlx5_0", "28.39.1002"),
        ("hca", "mlx5_1", "28.39.1002"),
        ("hca", "mlx5_2", "28.39.1002"),
        ("hca", "mlx5_3", "28.39.1002"),
        ("nic", "eno1", "9.20 0x8000d8c5 1.3353.0"),
        ("nic", "eno2", "9.20 0x8000d8c5 1.3353.0"),
        ("nic", "ibp156s0", "28.39.1002"),
        ("nic", "ibp188s0", "28.39.1002"),
        ("nic", "ibp26s0", "28.39.1002"),
        ("nic", "ibp60s0", "28.39.1002"),
        ("bios", "system", "2.1"),
    ]
    assert {c for c, _, _ in found} == set(FIRMWARE_COMPONENTS) - {"gpu_inforom_power"}
    events = firmware_events(run)
    assert all(e["event.action"] == "inventory" for e in events)
    assert {k: v for k, v in events[41].items() if k.startswith(("firmware.", "rdma."))} == {
        "firmware.component": "hca",
        "firmware.device": "mlx5_0",
        "firmware.version": "28.39.1002",
        "firmware.board_id": "MT_0000000838",
        "rdma.device": "mlx5_0",
        "rdma.hca_type": "MT4129",
    }
    assert {k: v for k, v in events[50].items() if k.startswith("firmware.")} == {
        "firmware.component": "nic",
        "firmware.device": "ibp60s0",
        "firmware.version": "28.39.1002",
        "firmware.board_id": "MT_0000000838",
        "firmware.driver": "mlx5_core[ib_ipoib]",
    }
    assert {k: v for k, v in events[-1].items() if k.startswith("firmware.")} == {
        "firmware.component": "bios",
        "firmware.device": "system",
        "firmware.version": "2.1",
        "firmware.vendor": "American Megatrends International, LLC.",
        "firmware.release_date": "02/06/2024",
        "firmware.board_name": "X13DEG-OAD",
        "firmware.product_name": "SYS-821GE-TNHR",
    }
    assert (events[10]["gpu.index"], events[10]["gpu.pci_bus_id"]) == (2, "0000:3a:00.0")


def test_only_interfaces_with_a_device_are_asked():
    query = CannedEthtool()
    inventory_run(query=query)
    assert query.asked == ["eno1", "eno2", "ibp156s0", "ibp188s0", "ibp26s0", "ibp60s0"]
    assert physical_interfaces(node_ctx()) == query.asked  # no lo, docker0, bond0


def test_baseline_drift_and_vulnerable_versions_are_decided_at_enrichment(tmp_path):
    config_file = tmp_path / "site.yml"
    config_file.write_text(
        "node_class: h100-8x\n"
        "firmware:\n"
        "  baselines:\n"
        "    h100-8x: {gpu_vbios: '96.00.99.00.01', hca: '28.40.1000', bios: '2.1'}\n"
        "    a100-8x: {gpu_vbios: '92.00.45.00.05'}\n"
        "  vulnerable: {hca: ['28.39.*'], gpu_driver: ['535.*']}\n"
    )
    config = load_config(config_file)
    raw = firmware_events(inventory_run(ctx=node_ctx(config=config)))
    # the sensor reports versions only: comparing them is site policy
    assert not any(key in e for e in raw for key in POLICY_KEYS)
    enriched = Enricher(config).enrich(raw, None)
    events = {(e["firmware.component"], e["firmware.device"]): e for e in enriched}

    def policy(key):
        return {k: v for k, v in events[key].items() if k in POLICY_KEYS}

    assert policy(("hca", "mlx5_2")) == {
        "firmware.baseline_version": "28.40.1000",
        "firmware.drift": True,
        "firmware.known_vulnerable": True,
    }
    assert policy(("gpu_vbios", UUID2)) == {
        "firmware.baseline_version": "96.00.99.00.01",
        "firmware.drift": False,
        "firmware.known_vulnerable": False,
    }
    assert policy(("gpu_driver", "system")) == {"firmware.known_vulnerable": False}
    assert policy(("bios", "system"))["firmware.drift"] is False


def test_changes_between_samples_are_marked():
    state: dict = {}
    inventory_run(ctx=node_ctx(state=state))
    fake = h100_node()
    fake.gpus[2] = replace(fake.gpus[2], vbios="96.00.74.00.1C")
    ctx = node_ctx(state=state)
    ctx.timestamp = "2026-11-30T02:10:00.000Z"
    events = firmware_events(inventory_run(fake, ctx))
    changed = [
        (
            e["firmware.component"],
            e["firmware.device"],
            e["firmware.previous_version"],
            e["firmware.version"],
        )
        for e in events
        if e["firmware.changed"]
    ]
    assert changed == [("gpu_vbios", UUID2, "96.00.99.00.01", "96.00.74.00.1C")]
    assert all("firmware.previous_version" in e for e in events)


def test_without_nvml_the_rest_is_still_inventoried():
    run = inventory_run(FakeNvml([], library_missing=True))
    assert run.ok
    assert [c for c, _, _ in triples(run)] == ["hca"] * 4 + ["nic"] * 6 + ["bios"]
    (status,) = [e for e in run.events if e["event.category"] == "sensor_status"]
    assert (status["event.action"], status["message"]) == (
        "degraded",
        "GPU firmware not read: NVML library not found (libnvidia-ml.so.1): "
        "no NVIDIA driver installed on this node",
    )


def test_no_source_at_all_is_unavailable(tmp_path):
    run = inventory_run(FakeNvml([], library_missing=True), node_ctx(sysfs=tmp_path))
    assert run.status["event.action"] == "unavailable"
    assert run.status["message"] == (
        "no firmware source answered: GPU firmware not read: NVML library not found "
        "(libnvidia-ml.so.1): no NVIDIA driver installed on this node; "
        f"no HCA fw_ver under {tmp_path}/class/infiniband; "
        "no NIC reports a firmware version (no interface with a device); "
        f"no bios_version under {tmp_path}/class/dmi/id"
    )


def test_collect_cli_on_a_node_without_firmware_sources(tmp_path, capsys):
    """A VM: no NVML, no HCA, a virtio NIC without firmware, no DMI table."""
    (tmp_path / "class/net/eth0").mkdir(parents=True)
    (tmp_path / "class/net/eth0/device").symlink_to("../../../virtio0")
    virtio = {
        "eth0": {
            "driver": "virtio_net",
            "version": "1.0.0",
            "fw_version": "",
            "bus_info": "0000:00:03.0",
        }
    }
    with installed(FakeNvml([], library_missing=True)), pytest.MonkeyPatch.context() as mp:
        mp.setattr(firmware, "ethtool_drvinfo", virtio.__getitem__)
        rc = cli.main(["collect", "--sensor", "firmware", "--raw", "--sysfs-root", str(tmp_path)])
    out, err = capsys.readouterr()
    assert rc == 0
    message = (
        "no firmware source answered: GPU firmware not read: NVML library not found "
        "(libnvidia-ml.so.1): no NVIDIA driver installed on this node; "
        f"no HCA fw_ver under {tmp_path}/class/infiniband; "
        "no NIC reports a firmware version (asked: eth0); "
        f"no bios_version under {tmp_path}/class/dmi/id"
    )
    assert err == f"hpcsec: sensor firmware: unavailable: {message}\n"
    (record,) = [json.loads(line) for line in out.splitlines()]
    assert (record["event.action"], record["message"]) == ("unavailable", message)


def test_nic_answers_are_parsed_defensively():
    items, problems = nic_items(
        json.dumps(
            {
                "eth0": {
                    "driver": "virtio_net",
                    "version": "1.0.0",
                    "fw_version": "",
                    "bus_info": "0000:00:03.0",
                },
                "ens3": {"driver": "ice", "fw_version": "4.40 0x8001c967 1.3534.0"},
                "ens4": {"error": "No such device"},
                "ens5": ["not", "an", "object"],
                "ib0": {
                    "driver": "mlx5_core[ib_ipoib]",
                    "fw_version": "28.39.1002 (MT_0000000838)",
                },
            }
        )
    )
    assert [(i.device, i.version, i.extra) for i in items] == [
        ("ens3", "4.40 0x8001c967 1.3534.0", {"firmware.driver": "ice", "firmware.board_id": None}),
        (
            "ib0",
            "28.39.1002",
            {"firmware.driver": "mlx5_core[ib_ipoib]", "firmware.board_id": "MT_0000000838"},
        ),
    ]
    assert problems == [
        "ethtool-drvinfo.json: ens4: No such device",
        "ethtool-drvinfo.json: ens5: not an object",
    ]
    assert nic_items("[1") == (
        [],
        ["ethtool-drvinfo.json: not JSON: Expecting ',' delimiter: line 1 column 3 (char 2)"],
    )


def test_snapshot_round_trip_replays_the_same_inventory(tmp_path):
    spec = SensorSpec("firmware", lambda: FirmwareSensor(CannedEthtool()), "firmware")
    ctx = node_ctx()
    with installed(h100_node()):
        (live,) = record_snapshot(tmp_path / "snap", ctx, [spec, by_name()["gpu"]])[:1]
    stored = tmp_path / "snap" / "0"
    assert json.loads((stored / "ethtool-drvinfo.json").read_text()) == DRVINFO
    assert (stored / "sys/class/infiniband/mlx5_3/board_id").read_text() == "MT_0000000838\n"
    assert os.readlink(stored / "sys/class/net/eno1/device") == "../../../0000:c1:00.0"
    assert (stored / "nvml.json").exists()
    # no NVML, no fixture roots: only the snapshot
    with installed(FakeNvml([], library_missing=True)):
        (replayed,) = replay(tmp_path / "snap", [spec], None)
    assert replayed.events == live.events and len(live.events) == 52


def test_ethtool_ioctl_on_this_machine():
    with pytest.raises(OSError) as lo:
        ethtool_drvinfo("lo")
    assert lo.value.errno == errno.EOPNOTSUPP
    with pytest.raises(OSError) as missing:
        ethtool_drvinfo("hpcsec-none0")
    assert missing.value.errno == errno.ENODEV
    live = node_ctx(sysfs=Path("/sys"))
    interfaces = physical_interfaces(live)
    if not interfaces:
        pytest.skip("no network interface with a device on this machine")
    info = ethtool_drvinfo(interfaces[0])
    assert info["driver"]
    if shutil.which("ethtool"):  # agree with the ethtool binary where it is installed
        text = subprocess.run(
            ["ethtool", "-i", interfaces[0]], capture_output=True, text=True, check=True
        ).stdout
        fields = dict(line.split(": ", 1) for line in text.splitlines() if ": " in line)
        assert (info["driver"], info["version"], info["fw_version"], info["bus_info"]) == (
            fields["driver"],
            fields["version"],
            fields["firmware-version"],
            fields["bus-info"],
        )

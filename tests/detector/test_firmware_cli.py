"""`hpcsec firmware baseline`: from this node (fixture roots, fake NVML) and from a snapshot."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import yaml

from hpcsec.detector.cli import main as cli
from hpcsec.detector.config.site import load_config
from hpcsec.detector.enrich.enricher import Enricher
from hpcsec.sensors.base import FsRoot, SensorContext, SensorSpec, run_sensor
from hpcsec.sensors.firmware import FirmwareSensor
from hpcsec.sensors.snapshot import record_snapshot
from tests.fakes.nvml import FakeNvml, h100_node, installed

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
DRVINFO = json.loads((FIXTURES / "firmware" / "ethtool-drvinfo.json").read_text())
GOLDEN = {
    "gpu_vbios": "96.00.99.00.01",
    "gpu_inforom_image": "G520.0200.00.05",
    "gpu_inforom_oem": "2.1",
    "gpu_inforom_ecc": "7.16",
    "gpu_gsp": "550.127.05",
    "gpu_driver": "550.127.05",
    "hca": "28.39.1002",
    "nic": "28.39.1002",
    "bios": "2.1",
}


def node_ctx() -> SensorContext:
    return SensorContext(
        "gpu-017",
        FsRoot("sys", FIXTURES / "sysfs-node"),
        FsRoot("proc", FIXTURES / "nvml/proc"),
        FsRoot("etc", FIXTURES / "nvml/etc"),
    )


def snapshot_of(tmp_path: Path, fake: FakeNvml) -> Path:
    spec = SensorSpec("firmware", lambda: FirmwareSensor(DRVINFO.__getitem__), "firmware")
    with installed(fake):
        (run,) = record_snapshot(tmp_path / "snap", node_ctx(), [spec])
    assert run.ok
    return tmp_path / "snap"


def test_baseline_from_a_snapshot_is_a_site_config(tmp_path, capsys):
    snap = snapshot_of(tmp_path, h100_node())
    out = tmp_path / "baseline.yml"
    rc = cli.main(
        [
            "firmware",
            "baseline",
            "--node-class",
            "h100-8x",
            "--from-snapshot",
            str(snap),
            "-o",
            str(out),
        ]
    )
    assert rc == 0
    text = out.read_text()
    assert text.startswith(
        f"# hpcsec firmware baseline for node class 'h100-8x'\n# from snapshot {snap} at "
    )
    assert yaml.safe_load(text) == {
        "node_class": "h100-8x",
        "firmware": {"baselines": {"h100-8x": GOLDEN}},
    }
    assert "gpu_inforom_oem: '2.1'" in text  # quoted: YAML would read 2.1 as a number
    # the eno1/eno2 NICs (i40e) run other firmware than the four ConnectX-7 ports
    assert capsys.readouterr().err == (
        "hpcsec firmware baseline: warning: nic: devices disagree; keeping 28.39.1002 "
        "(4 devices), also found 9.20 0x8000d8c5 1.3353.0 on eno1, eno2\n"
    )
    # used as the site config, the node it came from drifts only where it disagreed itself
    config = load_config(out)
    assert (config.node_class, config.firmware.baseline("h100-8x", "gpu_inforom_oem")) == (
        "h100-8x",
        "2.1",
    )
    ctx = node_ctx()
    ctx.config = config
    with installed(h100_node()):
        run = run_sensor(
            SensorSpec("firmware", FirmwareSensor, ""), FirmwareSensor(DRVINFO.__getitem__), ctx
        )
    events = [e for e in run.events if e["event.category"] == "firmware"]
    events = Enricher(config).enrich(events, None)  # baseline and drift are site policy
    assert all("firmware.baseline_version" in e for e in events)
    drift = {(e["firmware.component"], e["firmware.device"]) for e in events if e["firmware.drift"]}
    assert drift == {("nic", "eno1"), ("nic", "eno2")}


def test_collect_with_the_baseline_as_config_shows_a_flashed_hca(tmp_path, capsys):
    """The whole loop as a user runs it: baseline from a snapshot, then collect against it."""
    snap = snapshot_of(tmp_path, h100_node())
    baseline = tmp_path / "baseline.yml"
    assert (
        cli.main(
            [
                "firmware",
                "baseline",
                "--node-class",
                "h100-8x",
                "--from-snapshot",
                str(snap),
                "-o",
                str(baseline),
            ]
        )
        == 0
    )
    sysfs = tmp_path / "sys"
    shutil.copytree(FIXTURES / "sysfs-node", sysfs, symlinks=True)
    (sysfs / "class/infiniband/mlx5_1/fw_ver").write_text("28.33.0800\n")
    capsys.readouterr()
    with installed(FakeNvml([], library_missing=True)):
        assert (
            cli.main(
                [
                    "collect",
                    "--sensor",
                    "firmware",
                    "--config",
                    str(baseline),
                    "--sysfs-root",
                    str(sysfs),
                ]
            )
            == 0
        )
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    hcas = {
        e["firmware.device"]: (
            e["firmware.version"],
            e["firmware.baseline_version"],
            e["firmware.drift"],
        )
        for e in out
        if e.get("firmware.component") == "hca"
    }
    assert hcas == {
        "mlx5_0": ("28.39.1002", "28.39.1002", False),
        "mlx5_1": ("28.33.0800", "28.39.1002", True),
        "mlx5_2": ("28.39.1002", "28.39.1002", False),
        "mlx5_3": ("28.39.1002", "28.39.1002", False),
    }


def test_disagreeing_gpus_keep_the_majority(tmp_path, capsys):
    fake = h100_node()
    fake.gpus[6] = replace(fake.gpus[6], vbios="96.00.74.00.1C")
    snap = snapshot_of(tmp_path, fake)
    rc = cli.main(["firmware", "baseline", "--node-class", "h100-8x", "--from-snapshot", str(snap)])
    out, err = capsys.readouterr()
    assert rc == 0
    assert yaml.safe_load(out)["firmware"]["baselines"]["h100-8x"]["gpu_vbios"] == "96.00.99.00.01"
    assert (
        "warning: gpu_vbios: devices disagree; keeping 96.00.99.00.01 (7 devices), also "
        "found 96.00.74.00.1C on GPU-1f2e3d4c-5b6a-4798-a6b5-c4d3e2f1a0b9\n"
    ) in err


def test_baseline_of_this_node_uses_the_node_class_of_the_config(tmp_path, capsys):
    site = tmp_path / "site.yml"
    site.write_text("node_class: h100-8x\n")
    with installed(h100_node()):
        rc = cli.main(
            [
                "firmware",
                "baseline",
                "--config",
                str(site),
                "--sysfs-root",
                str(FIXTURES / "sysfs-node"),
            ]
        )
    out, err = capsys.readouterr()
    assert rc == 0
    golden = yaml.safe_load(out)["firmware"]["baselines"]["h100-8x"]
    # this machine has none of the fixture's interfaces: no nic entry, a note per interface
    assert golden == {k: v for k, v in GOLDEN.items() if k != "nic"}
    assert "note: ethtool-drvinfo.json: eno1: No such device\n" in err


def test_usage_errors_exit_2_with_a_message(tmp_path, capsys):
    assert cli.main(["firmware", "baseline"]) == 2
    assert capsys.readouterr().err == (
        "hpcsec: error: name the node class: --node-class NAME (or node_class in --config)\n"
    )
    assert (
        cli.main(
            ["firmware", "baseline", "--node-class", "x", "--from-snapshot", str(tmp_path / "none")]
        )
        == 2
    )
    assert capsys.readouterr().err == (
        f"hpcsec: error: snapshot directory not found: {tmp_path / 'none'}\n"
    )
    assert (
        cli.main(
            ["firmware", "baseline", "--node-class", "x", "--sysfs-root", str(tmp_path / "none")]
        )
        == 2
    )
    assert capsys.readouterr().err == (
        f"hpcsec: error: --sysfs-root {tmp_path / 'none'}: no such directory\n"
    )


def test_a_node_without_any_firmware_source_is_an_error(tmp_path, capsys):
    with installed(FakeNvml([], library_missing=True)):
        rc = cli.main(["firmware", "baseline", "--node-class", "x", "--sysfs-root", str(tmp_path)])
    assert rc == 2
    assert capsys.readouterr().err == (
        "hpcsec: error: firmware inventory unavailable: no firmware source answered: GPU "
        "firmware not read: NVML library not found (libnvidia-ml.so.1): no NVIDIA driver "
        f"installed on this node; no HCA fw_ver under {tmp_path}/class/infiniband; no NIC "
        "reports a firmware version (no interface with a device); no bios_version under "
        f"{tmp_path}/class/dmi/id\n"
    )

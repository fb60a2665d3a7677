"""`hpcsec firmware baseline`: from this node (fixture roots, fake NVML) and from a snapshot."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import yaml

from hpcsec.detector import cli
from hpcsec.detector.config import load_config
from hpcsec.sensors.base import FsRoot, SensorContext, SensorSpec, run_sensor
from hpcsec.sensors.firmware import FirmwareSensor
from hpcsec.sensors.snapshot import record_snapshot
from tests.fakes.nvml import FakeNvml, h100_node, installed

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
DRVINFO = json.loads((FIXTURES / "firmware" / "ethtool-drvinfo.json").read_text())
GOLDEN = {"gpu_vbios": "96.00.99.00.01", "gpu_inforom_image": "G520.0200.00.05",
          "gpu_inforom_oem": "2.1", "gpu_inforom_ecc": "7.16", "gpu_gsp": "550.127.05",
          "gpu_driver": "550.127.05", "hca": "28.39.1002", "nic": "28.39.1002", "bios": "2.1"}


def node_ctx() -> SensorContext:
    return SensorContext("gpu-017", FsRoot("sys", FIXTURES / "sysfs-node"),
                         FsRoot("proc", FIXTURES / "nvml/proc"),
                         FsRoot("etc", FIXTURES / "nvml/etc"))


def snapshot_of(tmp_path: Path, fake: FakeNvml) -> Path:
    spec = SensorSpec("firmware", lambda: FirmwareSensor(DRVINFO.__getitem__), "firmware")
    with installed(fake):
        (run,) = record_snapshot(tmp_path / "snap", node_ctx(), [spec])
    assert run.ok
    return tmp_path / "snap"


def test_baseline_from_a_snapshot_loads_as_site_config(tmp_path, capsys):
    snap = snapshot_of(tmp_path, h100_node())
    out = tmp_path / "baseline.yml"
    rc = cli.main(["firmware", "baseline", "--node-class", "h100-8x", "--from-snapshot",
                   str(snap), "-o", str(out)])
    assert rc == 0
    text = out.read_text()
    assert text.startswith("# hpcsec firmware baseline for node class 'h100-8x'\n"
                           f"# from snapshot {snap} at ")
    assert yaml.safe_load(text) == {"baselines": {"h100-8x": GOLDEN}}
    # the eno1/eno2 NICs (i40e) run other firmware than the four ConnectX-7 ports
    assert capsys.readouterr().err == (
        "hpcsec firmware baseline: warning: nic: devices disagree; keeping 28.39.1002 "
        "(4 devices), also found 9.20 0x8000d8c5 1.3353.0 on eno1, eno2\n")
    # pasted under `firmware:`, the node it came from shows no drift at all
    site = tmp_path / "site.yml"
    indented = "".join(f"  {line}\n" for line in text.splitlines() if not line.startswith("#"))
    site.write_text("node_class: h100-8x\nfirmware:\n" + indented)
    config = load_config(site)
    assert config.firmware.baseline("h100-8x", "gpu_inforom_oem") == "2.1"
    ctx = node_ctx()
    ctx.config = config
    with installed(h100_node()):
        run = run_sensor(SensorSpec("firmware", FirmwareSensor, ""),
                         FirmwareSensor(DRVINFO.__getitem__), ctx)
    drift = {(e["firmware.component"], e["firmware.device"]) for e in run.events
             if e.get("firmware.drift")}
    assert drift == {("nic", "eno1"), ("nic", "eno2")}


def test_disagreeing_gpus_keep_the_majority(tmp_path, capsys):
    fake = h100_node()
    fake.gpus[6] = replace(fake.gpus[6], vbios="96.00.74.00.1C")
    snap = snapshot_of(tmp_path, fake)
    rc = cli.main(["firmware", "baseline", "--node-class", "h100-8x", "--from-snapshot",
                   str(snap)])
    out, err = capsys.readouterr()
    assert rc == 0
    assert yaml.safe_load(out)["baselines"]["h100-8x"]["gpu_vbios"] == "96.00.99.00.01"
    assert ("warning: gpu_vbios: devices disagree; keeping 96.00.99.00.01 (7 devices), also "
            "found 96.00.74.00.1C on GPU-1f2e3d4c-5b6a-4798-a6b5-c4d3e2f1a0b9\n") in err


def test_baseline_of_this_node_uses_the_node_class_of_the_config(tmp_path, capsys):
    site = tmp_path / "site.yml"
    site.write_text("node_class: h100-8x\n")
    with installed(h100_node()):
        rc = cli.main(["firmware", "baseline", "--config", str(site), "--sysfs-root",
                       str(FIXTURES / "sysfs-node")])
    out, err = capsys.readouterr()
    assert rc == 0
    golden = yaml.safe_load(out)["baselines"]["h100-8x"]
    # this machine has none of the fixture's interfaces: no nic entry, a note per interface
    assert golden == {k: v for k, v in GOLDEN.items() if k != "nic"}
    assert "note: ethtool-drvinfo.json: eno1: No such device\n" in err


def test_usage_errors_exit_2_with_a_message(tmp_path, capsys):
    assert cli.main(["firmware", "baseline"]) == 2
    assert capsys.readouterr().err == (
        "hpcsec: error: name the node class: --node-class NAME (or node_class in --config)\n")
    assert cli.main(["firmware", "baseline", "--node-class", "x", "--from-snapshot",
                     str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err == (
        f"hpcsec: error: snapshot directory not found: {tmp_path / 'none'}\n")


def test_a_node_without_any_firmware_source_is_an_error(tmp_path, capsys):
    with installed(FakeNvml([], library_missing=True)):
        rc = cli.main(["firmware", "baseline", "--node-class", "x", "--sysfs-root",
                       str(tmp_path)])
    assert rc == 2
    assert capsys.readouterr().err == (
        "hpcsec: error: firmware inventory unavailable: no firmware source answered: GPU "
        "firmware not read: NVML library not found (libnvidia-ml.so.1): no NVIDIA driver "
        "installed on this node\n")

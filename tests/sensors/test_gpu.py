"""The gpu sensor through the real pynvml wrapper, its C entry points replaced by tests/fakes."""

from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pynvml
import pytest

from hpcsec.detector.cli import main as cli
from hpcsec.sensors.base import FsRoot, SensorContext, SensorSpec, run_sensor
from hpcsec.sensors.gpu import nvml_dump
from hpcsec.sensors.gpu.nvml import GpuSensor, parse_nvml, sysfs_bus_id
from hpcsec.sensors.procinfo import process_fields
from tests.fakes.nvml import FakeNvml, h100_node, installed

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "fixtures"
GOLDEN = FIXTURES / "nvml" / "h100-8x.json"
TIME = "2026-11-30T02:00:00.000Z"
SPEC = SensorSpec("gpu", GpuSensor, "gpu")


class Recorder:
    def __init__(self):
        self.inputs: dict[str, list[str]] = {}

    def record_file(self, root, rel, data):
        pass

    def record_link(self, root, rel, target):
        pass

    def record_input(self, name, data):
        self.inputs.setdefault(name, []).append(data)


def node_ctx(replay=None, recorder=None) -> SensorContext:
    return SensorContext(
        "gpu-017",
        FsRoot("sys", FIXTURES / "sysfs-node"),
        FsRoot("proc", FIXTURES / "nvml" / "proc"),
        FsRoot("etc", FIXTURES / "nvml" / "etc"),
        timestamp=TIME,
        replay_inputs=replay,
        recorder=recorder,
    )


def collect(fake: FakeNvml, ctx: SensorContext | None = None):
    with installed(fake):
        return run_sensor(SPEC, GpuSensor(), ctx or node_ctx())


def by_category(run, category):
    return [e for e in run.events if e["event.category"] == category]


def test_dump_of_the_fake_node_is_the_golden_nvml_json():
    with installed(h100_node()):
        dumped = json.loads(nvml_dump.dump())
    if os.environ.get("HPCSEC_REGENERATE"):
        GOLDEN.write_text(json.dumps(dumped, indent=1) + "\n")
    assert dumped == json.loads(GOLDEN.read_text())


def test_process_lists_use_count_then_fill():
    fake = h100_node()
    with installed(fake):
        nvml_dump.snapshot()
    compute = [c for c in fake.process_calls if c[0] == "nvmlDeviceGetComputeRunningProcesses_v3"]
    # GPU 0, one process: asked with 0 -> INSUFFICIENT_SIZE and the count, then filled
    # into the wrapper's oversized array (count * 2 + 5)
    assert compute[:2] == [
        ("nvmlDeviceGetComputeRunningProcesses_v3", 0, 1, pynvml.NVML_ERROR_INSUFFICIENT_SIZE),
        ("nvmlDeviceGetComputeRunningProcesses_v3", 7, 1, pynvml.NVML_SUCCESS),
    ]
    # GPU 5 has no compute process: one call, answered with 0 and success
    graphics_only = [c for c in compute if c[1] == 0 and c[3] == pynvml.NVML_SUCCESS]
    assert graphics_only == [("nvmlDeviceGetComputeRunningProcesses_v3", 0, 0, 0)]
    assert len(fake.process_calls) == 8 * 3 + 9  # a second call for each non-empty list


def test_device_events():
    run = collect(h100_node())
    assert run.ok, run.status
    devices = by_category(run, "gpu_device")
    assert [d["gpu.index"] for d in devices] == list(range(8))
    mig = devices[3]
    assert {k: v for k, v in mig.items() if k.startswith("gpu.")} == {
        "gpu.index": 3,
        "gpu.uuid": "GPU-d1c2b3a4-9584-4736-a251-f4e3d2c1b0a9",
        "gpu.serial": "1654923010903",
        "gpu.name": "NVIDIA H100 80GB HBM3",
        "gpu.pci_bus_id": "0000:5d:00.0",
        "gpu.minor": 1,
        "gpu.mig_mode": 1,
        "gpu.ecc_mode": 1,
        "gpu.memory_total_bytes": 85520809984,
        "gpu.memory_used_bytes": 30 * (1 << 30),
        "gpu.driver_version": "550.127.05",
        "gpu.process_count": 2,
        "gpu.process_users": [],
    }  # no gpu.utilization_percent: NVML does not report it on a MIG-enabled GPU
    assert mig["event.action"] == "sample"
    assert mig["host.name"] == "gpu-017" and mig["@timestamp"] == TIME
    assert devices[0]["gpu.utilization_percent"] == 97
    assert devices[5]["gpu.ecc_mode"] == 0
    assert devices[7]["gpu.pci_bus_id"] == "0000:db:00.0"
    assert run.status["hpcsec.events"] == 20


def test_process_events_with_proc_and_passwd():
    run = collect(h100_node())
    procs = by_category(run, "gpu_process")
    assert [(p["gpu.index"], p["process.pid"], p["gpu.process_type"]) for p in procs] == [
        (0, 41000, "compute"),
        (1, 41001, "compute"),
        (2, 41002, "compute"),
        (2, 41003, "compute"),
        (3, 42000, "compute"),
        (3, 42001, "compute"),
        (4, 41002, "compute"),
        (5, 43000, "graphics"),
        (6, 44000, "compute"),
        (6, 44100, "mps"),
        (6, 44101, "mps"),
        (7, 45000, "compute"),
    ]
    mig_proc = procs[5]
    assert {k: v for k, v in mig_proc.items() if not k.startswith(("event.", "@", "host"))} == {
        "hpcsec.sensor": "gpu",
        "process.pid": 42001,
        "process.name": "jupyter-lab",
        "process.executable": "/opt/conda/bin/python3.10",
        "process.parent.pid": 41990,
        "process.args": [
            "/opt/conda/bin/python",
            "/opt/conda/bin/jupyter-lab",
            "--ip=0.0.0.0",
            "--no-browser",
        ],
        "process.command_line": "/opt/conda/bin/python /opt/conda/bin/jupyter-lab "
        "--ip=0.0.0.0 --no-browser",
        "user.id": 1004,
        "user.name": "dave",
        "gpu.index": 3,
        "gpu.uuid": "GPU-d1c2b3a4-9584-4736-a251-f4e3d2c1b0a9",
        "gpu.pci_bus_id": "0000:5d:00.0",
        "gpu.mig_mode": 1,
        "gpu.process_type": "compute",
        "gpu.instance_id": 2,
        "gpu.compute_instance_id": 0,
    }  # memory NVML_VALUE_NOT_AVAILABLE: no gpu.memory_used_bytes
    miner = procs[11]
    assert (miner["user.name"], miner["process.executable"], miner["gpu.memory_used_bytes"]) == (
        "mallory",
        "/tmp/.cache/xmrig (deleted)",
        7 * (1 << 30),
    )
    assert "gpu.instance_id" not in miner  # outside MIG NVML reports 0xFFFFFFFF
    exited = procs[3]  # in NVML's list, gone from /proc when we looked
    assert exited["process.pid"] == 41003 and "user.name" not in exited


def test_unsupported_and_failing_calls_give_null_fields():
    fake = h100_node()
    fake.gpus[0] = replace(
        fake.gpus[0],
        errors={
            "nvmlDeviceGetSerial": pynvml.NVML_ERROR_NOT_SUPPORTED,
            "nvmlDeviceGetMemoryInfo": pynvml.NVML_ERROR_GPU_IS_LOST,
            "nvmlDeviceGetComputeRunningProcesses_v3": pynvml.NVML_ERROR_NO_PERMISSION,
            "nvmlDeviceGetGspFirmwareVersion": pynvml.NVML_ERROR_NOT_SUPPORTED,
        },
    )
    fake.gpus[1] = replace(
        fake.gpus[1],
        gsp="",  # some drivers answer GSP-off with ""
        serial=b"\xff\xfe1654923",
    )  # not UTF-8
    with installed(fake):
        device, other = nvml_dump.snapshot()["devices"][:2]
    assert (other["gsp_firmware_version"], other["serial"]) == (None, None)
    assert (
        device["serial"],
        device["memory_total_bytes"],
        device["memory_used_bytes"],
        device["gsp_firmware_version"],
        device["processes"],
    ) == (None, None, None, None, [])
    assert device["uuid"] == "GPU-3a4b5c6d-0e1f-4a2b-8c3d-4e5f6a7b8c90"
    assert device["inforom"] == {
        "image": "G520.0200.00.05",
        "oem": "2.1",
        "ecc": "7.16",
        "power": None,
    }


def test_drivers_without_v3_process_lists_fall_back_to_v2():
    fake = replace(h100_node(), has_v3_process_lists=False)
    with installed(fake):
        doc = nvml_dump.snapshot()
    assert doc == json.loads(GOLDEN.read_text())
    assert {c[0].rsplit("_", 1)[1] for c in fake.process_calls} == {"v2"}


@pytest.mark.parametrize(
    ("fake", "message"),
    [
        (
            FakeNvml([], library_missing=True),
            "NVML library not found (libnvidia-ml.so.1): no NVIDIA driver installed on this node",
        ),
        (
            FakeNvml([], init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED),
            "NVIDIA driver not loaded (NVML: Driver Not Loaded)",
        ),
        (
            FakeNvml([], init_error=pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH),
            "NVML initialisation failed: RM has detected an NVML/RM version mismatch.",
        ),
    ],
)
def test_absent_nvml_is_unavailable(fake, message):
    run = collect(fake)
    assert run.events == []
    assert (run.status["event.action"], run.status["message"]) == ("unavailable", message)


def test_collect_cli_without_nvml_library_prints_a_status_not_a_traceback(capsys):
    with installed(FakeNvml([], library_missing=True)):
        rc = cli.main(
            [
                "collect",
                "--sensor",
                "gpu",
                "--host-name",
                "gpu-017",
                "--procfs-root",
                str(FIXTURES / "nvml" / "proc"),
            ]
        )
    out, err = capsys.readouterr()
    assert rc == 0
    assert err == (
        "hpcsec: sensor gpu: unavailable: NVML library not found "
        "(libnvidia-ml.so.1): no NVIDIA driver installed on this node\n"
    )
    (record,) = [json.loads(line) for line in out.splitlines()]
    assert (record["event.category"], record["event.action"], record["hpcsec.sensor"]) == (
        "sensor_status",
        "unavailable",
        "gpu",
    )


@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None, reason="this machine has a real NVML library"
)
def test_collect_cli_on_a_machine_without_nvidia_driver():
    """No fake: the real pynvml loader finds no libnvidia-ml.so.1 here."""
    proc = subprocess.run(
        [sys.executable, "-m", "hpcsec.detector.cli.main", "collect", "--sensor", "gpu"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0
    assert proc.stderr == (
        "hpcsec: sensor gpu: unavailable: NVML library not found "
        "(libnvidia-ml.so.1): no NVIDIA driver installed on this node\n"
    )
    assert json.loads(proc.stdout)["event.action"] == "unavailable"


def test_replaying_the_stored_json_gives_the_same_events():
    live = collect(h100_node()).events
    replayed = run_sensor(SPEC, GpuSensor(), node_ctx(replay={"nvml.json": GOLDEN.read_text()}))
    assert replayed.events == live
    missing = run_sensor(SPEC, GpuSensor(), node_ctx(replay={}))
    assert missing.status["message"] == "no nvml.json in this snapshot sample"


def test_one_sample_queries_nvml_once_and_records_it():
    from hpcsec.sensors.firmware import FirmwareSensor

    recorder = Recorder()
    ctx = node_ctx(recorder=recorder)
    fake = h100_node()
    with installed(fake):
        run_sensor(SPEC, GpuSensor(), ctx)
        calls = len(fake.process_calls)
        run_sensor(SensorSpec("firmware", FirmwareSensor, ""), FirmwareSensor(lambda i: {}), ctx)
        assert len(fake.process_calls) == calls  # firmware reused this sample's dump
        ctx.timestamp = "2026-11-30T02:00:10.000Z"
        run_sensor(SPEC, GpuSensor(), ctx)
    assert len(recorder.inputs["nvml.json"]) == 2  # one per sample
    assert json.loads(recorder.inputs["nvml.json"][0]) == json.loads(GOLDEN.read_text())


def test_malformed_entries_are_dropped_and_reported():
    doc = json.loads(GOLDEN.read_text())
    doc["devices"][1]["minor"] = "one"
    doc["devices"][2]["processes"][0] = {"pid": "41002", "type": "compute"}
    doc["devices"][4]["pci_bus_id"] = "18:00"
    del doc["devices"][6]["index"]
    doc["devices"].append("GPU 8")
    run = run_sensor(SPEC, GpuSensor(), node_ctx(replay={"nvml.json": json.dumps(doc)}))
    devices = by_category(run, "gpu_device")
    assert [d["gpu.index"] for d in devices] == [0, 1, 2, 3, 4, 5, 7]
    assert "gpu.minor" not in devices[1] and "gpu.pci_bus_id" not in devices[4]
    (status,) = by_category(run, "sensor_status")
    assert status["event.action"] == "malformed"
    assert status["hpcsec.parse_errors"] == [
        "devices[1].minor: expected an integer, got 'one'",
        "devices[2].processes[0].pid: expected an integer, got '41002'",
        "devices[2].processes[0]: needs a pid and a type in ('compute', 'graphics', 'mps'), "
        "dropped",
        "devices[4].pci_bus_id: not a PCI address: '18:00'",
        "devices[6]: no index, dropped",
        "devices[8]: expected an object, dropped",
    ]
    assert run.ok  # the rest of the dump still counts


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "{",
            "NvmlFormatError: nvml.json: not JSON: Expecting property name enclosed in double "
            "quotes: line 1 column 2 (char 1)",
        ),
        ('{"devices": {}}', "NvmlFormatError: nvml.json: expected an object with a 'devices' list"),
    ],
)
def test_unreadable_nvml_json_is_an_error_status(text, message):
    run = run_sensor(SPEC, GpuSensor(), node_ctx(replay={"nvml.json": text}))
    assert (run.status["event.action"], run.status["message"]) == ("error", message)


@pytest.mark.parametrize(
    ("nvml", "sysfs"),
    [
        ("00000000:1A:00.0", "0000:1a:00.0"),
        ("00000001:DB:1F.7", "0001:db:1f.7"),
        ("0000:18:00.0", "0000:18:00.0"),
        ("1A:00.0", None),
        ("", None),
    ],
)
def test_sysfs_bus_id(nvml, sysfs):
    assert sysfs_bus_id(nvml) == sysfs


def test_parse_keeps_driver_and_cuda_versions():
    report = parse_nvml(GOLDEN.read_text())
    assert (
        report.driver_version,
        report.cuda_driver_version,
        len(report.gpus),
        report.problems,
    ) == ("550.127.05", 12040, 8, ())
    assert report.gpus[6].processes[1] == report.gpus[6].processes[1].__class__(
        44100, "mps", 5 * (1 << 30), None, None
    )


def test_process_fields_reads_proc_and_the_nodes_passwd():
    ctx = node_ctx()
    assert process_fields(ctx, 44000) == {
        "process.pid": 44000,
        "process.name": "nvidia-cuda-mps",
        "process.executable": "/usr/bin/nvidia-cuda-mps-server",
        "process.parent.pid": 43990,
        "process.args": ["nvidia-cuda-mps-server"],
        "process.command_line": "nvidia-cuda-mps-server",
        "user.id": 1006,
        "user.name": "frank",
    }
    assert process_fields(ctx, 99999) == {}


def test_fake_rejects_calls_before_init():
    with installed(FakeNvml([])), pytest.raises(pynvml.NVMLError_Uninitialized):
        pynvml.nvmlDeviceGetCount()

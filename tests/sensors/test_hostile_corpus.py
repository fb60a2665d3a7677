"""The hostile-strings corpus through every sensor parser: each item, written where a node
user can put it, gives its event (escaped losslessly), costs the item beside it nothing, and
gives the same event ids when read twice."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from snapshot_builder import NodeTree

from hpcsec.detector.slurm.parse import parse_jobs_json, parse_listpids
from hpcsec.sensors.base import SensorSpec, run_sensor
from hpcsec.sensors.file_access.sensor import FileAccessSensor
from hpcsec.sensors.gpu.nvml import GpuSensor
from hpcsec.sensors.process import ProcessSensor
from hpcsec.sensors.rdma.qp import INPUT_NAME, RdmaQpSensor
from hpcsec.sensors.sockets import SocketSensor
from tests.fakes.nvml import FakeProcess, h100_node, installed
from tests.hostile_corpus import CORPUS, IDS, as_text, escaped, file_name
from tests.sensors.test_firmware import CannedEthtool, firmware_events, inventory_run, node_ctx

ITEMS = pytest.mark.parametrize("raw", CORPUS.values(), ids=IDS)
MINER = ["./xmrig", "--url", "stratum+tcp://pool:3333"]


def hostile_node(tmp_path, raw: bytes, fds: dict[int, bytes] | None = None) -> NodeTree:
    """alice's process 500 carries the item in its comm, argv, environ and exe; bob's 600 is
    a miner."""
    node = NodeTree(tmp_path)
    node.passwd(("root", 0), ("alice", 1001), ("bob", 1002))
    d = node.process(500, "placeholder", ["placeholder"], uid=1001)
    (d / "comm").write_bytes(raw.replace(b"\n", b" ")[:15] + b"\n")
    (d / "cmdline").write_bytes(b"./run\0" + raw.replace(b"\0", b"") + b"\0")
    (d / "environ").write_bytes(b"NOTE=" + raw.replace(b"\0", b"") + b"\0LD_PRELOAD=evil.so\0")
    (d / "exe").unlink()
    os.symlink(b"/tmp/" + file_name(raw), os.fsencode(d / "exe"))
    for fd, target in (fds or {}).items():
        os.symlink(target, os.fsencode(d / "fd" / str(fd)))
    node.process(600, "xmrig", MINER, uid=1002, fds={3: "/models/w.safetensors"})
    return node


def by_pid(events) -> dict:
    return {e["process.pid"]: e for e in events}


@ITEMS
def test_process_sensor(tmp_path, raw):
    ctx = hostile_node(tmp_path, raw).context()
    first = list(ProcessSensor().collect(ctx))
    again = list(ProcessSensor().collect(ctx))
    assert [e["event.id"] for e in first] == [e["event.id"] for e in again]
    events = by_pid(first)
    hostile = events[500]
    assert hostile["process.executable"] == "/tmp/" + escaped(file_name(raw))
    assert hostile["process.env.LD_PRELOAD"] == "evil.so"  # found after any value before it
    assert hostile["user.name"] == "alice"
    if len(raw) < 4096:
        assert hostile["process.command_line"] == "./run " + escaped(raw.replace(b"\0", b""))
    assert events[600]["process.command_line"] == " ".join(MINER)
    json.dumps(first)  # every field is text a JSON encoder takes as is


@ITEMS
def test_file_access_fd_walk(tmp_path, raw):
    path = b"/models/" + file_name(raw)
    node = hostile_node(tmp_path, raw, fds={3: path})
    ctx = node.context(watch=["/models"])
    first = list(FileAccessSensor().collect(ctx))
    again = list(FileAccessSensor().collect(ctx))
    assert [e["event.id"] for e in first] == [e["event.id"] for e in again]
    assert [(e["process.pid"], e["file.path"]) for e in first] == [
        (500, escaped(path)),
        (600, "/models/w.safetensors"),
    ]


@ITEMS
def test_file_access_stream_records(tmp_path, raw):
    ctx = hostile_node(tmp_path, raw).context()
    path = as_text(b"/models/" + file_name(raw))
    ctx.replay_inputs = {
        "file-events.jsonl": "".join(
            json.dumps({"time": ctx.timestamp, "pid": pid, "path": p, "actions": ["read"]}) + "\n"
            for pid, p in ((500, path), (600, "/models/w.safetensors"))
        )
    }
    events = list(FileAccessSensor().collect(ctx))
    assert [(e["process.pid"], e["file.path"]) for e in events] == [
        (500, escaped(b"/models/" + file_name(raw))),
        (600, "/models/w.safetensors"),
    ]


@ITEMS
def test_sockets(tmp_path, raw):
    ctx = hostile_node(tmp_path, raw).context()
    record = {"transport": "tcp", "state": "LISTEN", "source.ip": "0.0.0.0", "inode": 1}
    ctx.replay_inputs = {
        "sockets.json": json.dumps(
            [{**record, "source.port": 8888, "pid": 500}, {**record, "source.port": 22, "pid": 600}]
        )
    }
    events = list(SocketSensor().collect(ctx))
    assert [(e["source.port"], e["process.pid"]) for e in events] == [(8888, 500), (22, 600)]
    assert events[1]["process.name"] == "xmrig"


@ITEMS
def test_rdma_qp_text(tmp_path, raw):
    ctx = NodeTree(tmp_path).context()
    qp = {"ifname": "mlx5_0", "port": 1, "type": "RC", "state": "RTS"}
    output = json.dumps(
        [{**qp, "lqpn": 1, "pid": 500, "comm": "@@"}, {**qp, "lqpn": 2, "pid": 600, "comm": "ok"}]
    ).encode()
    comm = json.dumps(as_text(raw[:64]))[1:-1].encode("utf-8", "surrogateescape")
    ctx.replay_inputs = {INPUT_NAME: output.replace(b"@@", comm).decode("utf-8", "surrogateescape")}
    events = list(RdmaQpSensor().collect(ctx))
    assert [e["rdma.qp.lqpn"] for e in events] == [1, 2]
    assert events[0]["process.name"] == escaped(raw[:64])
    assert events[1]["process.name"] == "ok"


@ITEMS
def test_slurm_squeue_json_and_listpids(raw):
    name = json.dumps(as_text(raw))[1:-1]
    text = json.dumps(
        {
            "jobs": [
                {"job_id": 1, "name": "@@", "user_name": "alice", "job_state": "RUNNING"},
                {"job_id": 2, "name": "train", "user_name": "bob", "job_state": "RUNNING"},
            ]
        }
    ).replace("@@", name)
    jobs = parse_jobs_json(text).jobs
    assert [(j.job_id, j.name) for j in jobs] == [("1", escaped(raw)), ("2", "train")]
    step = as_text(file_name(raw).replace(b" ", b"_").replace(b"\n", b"_")[:64])
    pids = parse_listpids(f"PID JOBID STEPID\n10 1 {step}\n11 2 batch\n").pids
    assert pids[11].step == "batch"


FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"


@ITEMS
def test_firmware_versions_from_sysfs_and_dmi(tmp_path, raw):

    sysfs = tmp_path / "sys"
    shutil.copytree(FIXTURES / "sysfs-node", sysfs, symlinks=True)
    (sysfs / "class/infiniband/mlx5_0/fw_ver").write_bytes(raw[:200] + b"\n")
    (sysfs / "class/dmi/id/bios_version").write_bytes(raw[:200] + b"\n")
    clean = firmware_events(inventory_run(ctx=node_ctx(sysfs=FIXTURES / "sysfs-node")))
    hostile = firmware_events(inventory_run(ctx=node_ctx(sysfs=sysfs), query=CannedEthtool()))
    devices = [(e["firmware.component"], e["firmware.device"]) for e in hostile]
    assert devices == [(e["firmware.component"], e["firmware.device"]) for e in clean]
    for event in hostile:  # every version is text a JSON encoder takes as is
        json.dumps(event, ensure_ascii=False).encode("utf-8")


@ITEMS
def test_gpu_processes_through_the_nvml_fake(tmp_path, raw):

    node = hostile_node(tmp_path, raw)
    fake = h100_node()
    fake.gpus[0] = replace(
        fake.gpus[0],
        vbios=raw[:24],  # NVML's buffer is 32 bytes
        compute=(FakeProcess(500, 1 << 30), FakeProcess(600, 1 << 30)),
    )
    with installed(fake):
        run = run_sensor(SensorSpec("gpu", GpuSensor, "gpu"), GpuSensor(), node.context())
    procs = [e for e in run.events if e["event.category"] == "gpu_process"]
    on_gpu0 = {e["process.pid"]: e for e in procs if e["gpu.index"] == 0}
    assert sorted(on_gpu0) == [500, 600]
    assert on_gpu0[500]["user.name"] == "alice"
    assert on_gpu0[600]["process.command_line"] == " ".join(MINER)
    assert len([e for e in run.events if e["event.category"] == "gpu_device"]) == 8

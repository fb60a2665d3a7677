"""Names that are not UTF-8: every sensor escapes them (`\\xff`), and one hostile item never
costs another item its event."""

from __future__ import annotations

import json
import os

from snapshot_builder import NodeTree

from hpcsec.detector.slurm.parse import job_from_environ, parse_jobs_json, parse_listpids
from hpcsec.sensors.file_access.sensor import FileAccessSensor
from hpcsec.sensors.process import ProcessSensor
from hpcsec.sensors.rdma.qp import INPUT_NAME, RdmaQpSensor
from hpcsec.sensors.sockets import SocketSensor

HOSTILE_NAME = b"\xffsl"
ESCAPED = "\\xffsl"


def hostile_process(node: NodeTree, pid: int, uid: int, fds: dict[int, bytes] | None = None):
    """A /proc entry whose comm, exe, argv and environ are not UTF-8."""
    d = node.process(pid, "placeholder", ["placeholder"], uid=uid)
    (d / "comm").write_bytes(HOSTILE_NAME + b"\n")
    (d / "cmdline").write_bytes(b"./" + HOSTILE_NAME + b"\0--x=\xfe\0")
    (d / "environ").write_bytes(b"LD_PRELOAD=/tmp/\xff.so\0")
    (d / "exe").unlink()
    os.symlink(b"/tmp/" + HOSTILE_NAME, os.fsencode(d / "exe"))
    for fd, target in (fds or {}).items():
        os.symlink(target, os.fsencode(d / "fd" / str(fd)))


def node_with_alice_hostile_and_bob_miner(tmp_path) -> NodeTree:
    node = NodeTree(tmp_path)
    node.passwd(("root", 0), ("alice", 1001), ("bob", 1002))
    hostile_process(node, 500, 1001)
    node.process(600, "xmrig", ["./xmrig", "--url", "stratum+tcp://pool:3333"], uid=1002)
    return node


def test_process_sensor_emits_the_hostile_process_and_the_miner_beside_it(tmp_path):
    ctx = node_with_alice_hostile_and_bob_miner(tmp_path).context()
    events = list(ProcessSensor().collect(ctx))
    hostile, miner = events
    assert hostile["process.name"] == ESCAPED
    assert hostile["process.executable"] == "/tmp/" + ESCAPED
    assert hostile["process.args"] == ["./" + ESCAPED, "--x=\\xfe"]
    assert hostile["process.command_line"] == "./\\xffsl --x=\\xfe"
    assert hostile["process.env.LD_PRELOAD"] == "/tmp/\\xff.so"
    assert miner["process.name"] == "xmrig" and miner["user.name"] == "bob"


def test_file_access_replay_of_a_hostile_path_beside_a_normal_one(tmp_path):
    node = node_with_alice_hostile_and_bob_miner(tmp_path)
    ctx = node.context()
    hostile_path = os.fsdecode(b"/models/\xff.bin")  # json.dumps writes it as "\udcff"
    ctx.replay_inputs = {
        "file-events.jsonl": "".join(
            json.dumps({"time": ctx.timestamp, "pid": pid, "path": path, "actions": ["read"]})
            + "\n"
            for pid, path in ((500, hostile_path), (600, "/models/w.safetensors"))
        )
    }
    events = list(FileAccessSensor().collect(ctx))
    assert [(e["process.pid"], e["file.path"]) for e in events] == [
        (500, "/models/\\xff.bin"),
        (600, "/models/w.safetensors"),
    ]
    assert events[0]["file.name"] == "\\xff.bin"


def test_fd_walk_of_a_hostile_path_beside_a_normal_one(tmp_path):
    node = node_with_alice_hostile_and_bob_miner(tmp_path)
    hostile_process(node, 700, 1001, fds={3: b"/models/\xff.bin"})
    node.process(800, "cat", ["cat"], uid=1002, fds={3: "/models/w.safetensors"})
    events = list(FileAccessSensor().collect(node.context(watch=["/models"])))
    assert [(e["process.pid"], e["file.path"]) for e in events] == [
        (700, "/models/\\xff.bin"),
        (800, "/models/w.safetensors"),
    ]


def test_sockets_of_a_hostile_process_beside_a_normal_one(tmp_path):
    node = node_with_alice_hostile_and_bob_miner(tmp_path)
    ctx = node.context()
    record = {"transport": "tcp", "state": "LISTEN", "source.ip": "0.0.0.0", "inode": 1}
    ctx.replay_inputs = {
        "sockets.json": json.dumps(
            [{**record, "source.port": 8888, "pid": 500}, {**record, "source.port": 22, "pid": 600}]
        )
    }
    events = list(SocketSensor().collect(ctx))
    assert [(e["source.port"], e["process.name"]) for e in events] == [
        (8888, ESCAPED),
        (22, "xmrig"),
    ]


def test_rdma_qps_with_a_hostile_comm_beside_a_normal_one(tmp_path):
    ctx = NodeTree(tmp_path).context()
    qp = {"ifname": "mlx5_0", "port": 1, "type": "RC", "state": "RTS"}
    # what `rdma -j` prints for a comm that is not UTF-8, read with surrogateescape
    output = json.dumps(
        [{**qp, "lqpn": 1, "pid": 500, "comm": "@@"}, {**qp, "lqpn": 2, "pid": 600, "comm": "ok"}]
    ).encode()
    ctx.replay_inputs = {
        INPUT_NAME: output.replace(b"@@", HOSTILE_NAME).decode("utf-8", "surrogateescape")
    }
    events = RdmaQpSensor().collect(ctx)
    assert [(e["rdma.qp.lqpn"], e["process.name"]) for e in events] == [(1, ESCAPED), (2, "ok")]


def test_slurm_output_with_hostile_names_is_escaped_and_other_jobs_kept():
    text = (
        json.dumps(
            {
                "jobs": [
                    {"job_id": 1, "name": "@@", "user_name": "alice", "job_state": "RUNNING"},
                    {"job_id": 2, "name": "train", "user_name": "bob", "job_state": "RUNNING"},
                ]
            }
        )
        .encode()
        .replace(b"@@", HOSTILE_NAME)
        .decode("utf-8", "surrogateescape")
    )
    jobs = parse_jobs_json(text).jobs
    assert [(j.job_id, j.name) for j in jobs] == [("1", ESCAPED), ("2", "train")]
    listpids = "PID JOBID STEPID\n10 1 " + os.fsdecode(HOSTILE_NAME) + "\n11 2 batch\n"
    pids = parse_listpids(listpids).pids
    assert (pids[10].step, pids[11].step) == (ESCAPED, "batch")
    assert job_from_environ(b"SLURM_JOB_ID=\xd9\xa1\0") is None  # only ASCII digits name a job

"""The process sensor over a kernel-layout /proc tree, and once over the live /proc."""

from __future__ import annotations

import os

from snapshot_builder import NodeTree

from hpcsec.sensors.base import FsRoot, SensorContext
from hpcsec.sensors.process import ProcessSensor
from hpcsec.sensors.procinfo import environ_value, process_fields


def build_node(tmp_path) -> NodeTree:
    node = NodeTree(tmp_path)
    node.passwd(("root", 0), ("alice", 1001))
    node.process(2, "kthreadd", [])  # kernel thread: empty cmdline
    node.process(
        4242,
        "python3",
        ["/usr/bin/python3", "train.py", "--lr", "3e-4"],
        uid=1001,
        ppid=4200,
        environ={
            "SLURM_JOB_ID": "77",
            "CUDA_VISIBLE_DEVICES": "0,1",
            "LD_PRELOAD": "/tmp/x.so",
            "HOME": "/home/alice",
        },
        cgroup="0::/system.slice/slurmstepd.scope/job_77/step_0/user/task_0\n",
    )
    node.process(4300, "xmrig", ["./xmrig"], uid=2002, exe="/tmp/xmrig (deleted)")
    return node


def test_one_event_per_user_process_with_fields(tmp_path):
    events = list(ProcessSensor().collect(build_node(tmp_path).context()))
    assert [e["process.pid"] for e in events] == [4242, 4300]
    train = events[0]
    assert train["event.category"] == "process"
    assert train["event.action"] == "present"
    assert train["@timestamp"] == "2026-11-30T10:00:00.000Z"
    assert train["process.name"] == "python3"
    assert train["process.executable"] == "/usr/bin/python3"
    assert train["process.command_line"] == "/usr/bin/python3 train.py --lr 3e-4"
    assert train["process.args"] == ["/usr/bin/python3", "train.py", "--lr", "3e-4"]
    assert train["process.parent.pid"] == 4200
    assert train["user.id"] == 1001
    assert train["user.name"] == "alice"
    assert train["process.cgroup"] == "0::/system.slice/slurmstepd.scope/job_77/step_0/user/task_0"
    assert train["process.env.SLURM_JOB_ID"] == "77"
    assert train["process.env.CUDA_VISIBLE_DEVICES"] == "0,1"
    assert train["process.env.LD_PRELOAD"] == "/tmp/x.so"
    assert "process.env.HOME" not in train


def test_user_unknown_to_the_nodes_passwd_has_only_its_uid(tmp_path):
    miner = list(ProcessSensor().collect(build_node(tmp_path).context()))[1]
    assert miner["user.id"] == 2002
    assert "user.name" not in miner
    assert miner["process.executable"] == "/tmp/xmrig (deleted)"
    assert "process.env.LD_PRELOAD" not in miner


def test_vanished_process_gives_no_fields(tmp_path):
    ctx = build_node(tmp_path).context()
    assert process_fields(ctx, 99999) == {}


def test_parsers():
    assert environ_value(b"A=1\0LD_PRELOAD=/x.so\0", "LD_PRELOAD") == "/x.so"
    assert environ_value(b"XLD_PRELOAD=1\0", "LD_PRELOAD") is None


def test_live_proc_contains_this_test_process():
    ctx = SensorContext(
        "live", FsRoot("sys", "/sys"), FsRoot("proc", "/proc"), FsRoot("etc", "/etc")
    )
    mine = [e for e in ProcessSensor().collect(ctx) if e["process.pid"] == os.getpid()]
    assert len(mine) == 1
    assert mine[0]["user.id"] == os.getuid()
    assert "pytest" in mine[0]["process.command_line"] or "python" in mine[0]["process.name"]

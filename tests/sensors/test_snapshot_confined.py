"""Snapshot replay never leaves the sample: no link out, no FIFO or device, bounded sizes.
What is refused is a `malformed` status record of the sensor that asked for it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from replay import replay
from snapshot_builder import sample_tree, write_meta

from hpcsec.detector.core.errors import SourceError
from hpcsec.sensors.base import SensorSpec
from hpcsec.sensors.process import ProcessSensor
from hpcsec.sensors.snapshot import open_snapshot
from hpcsec.sensors.sockets import SocketSensor

T0 = "2026-11-30T10:00:00.000Z"
PROCESS = SensorSpec("process", ProcessSensor, "processes")
SOCKETS = SensorSpec("sockets", SocketSensor, "sockets")


def snapshot_with_two_processes(tmp_path: Path):
    tree = sample_tree(tmp_path / "snap", 0, T0)
    tree.passwd(("root", 0), ("alice", 1001))
    tree.process(10, "python3", ["python3", "train.py"], uid=1001)
    tree.process(11, "sleep", ["sleep", "60"], uid=1001)
    write_meta(tmp_path / "snap", "node1", 1)
    return tree


def statuses(runs, action: str) -> list[dict]:
    return [e for r in runs for e in r.events if e["event.action"] == action]


def test_a_cmdline_linked_to_a_file_outside_is_not_read(tmp_path):
    secret = tmp_path / "root-only"
    secret.write_text("TOKEN=hunter2\0")
    tree = snapshot_with_two_processes(tmp_path)
    (tree.proc / "11" / "cmdline").unlink()
    os.symlink(secret, tree.proc / "11" / "cmdline")
    runs = replay(tmp_path / "snap", [PROCESS])
    events = [e for r in runs for e in r.events if e["event.category"] == "process"]
    assert [e["process.pid"] for e in events] == [10]
    assert all("hunter2" not in str(e) for r in runs for e in [*r.events, r.status])
    (refused,) = statuses(runs, "malformed")
    assert "proc/11/cmdline: links outside the snapshot" in refused["message"]


def test_a_link_inside_the_sample_is_still_followed(tmp_path):
    tree = snapshot_with_two_processes(tmp_path)
    (tree.proc / "11" / "cmdline").unlink()
    os.symlink("../10/cmdline", tree.proc / "11" / "cmdline")
    runs = replay(tmp_path / "snap", [PROCESS])
    assert [e["process.command_line"] for e in runs[0].events] == ["python3 train.py"] * 2
    assert statuses(runs, "malformed") == []


def test_proc_linked_to_the_live_proc_is_not_read(tmp_path):
    tree = sample_tree(tmp_path / "snap", 0, T0)
    tree.proc.rmdir()
    os.symlink("/proc", tree.proc)
    write_meta(tmp_path / "snap", "node1", 1)
    runs = replay(tmp_path / "snap", [PROCESS])
    assert runs[0].status["event.action"] == "unavailable"
    (refused,) = statuses(runs, "malformed")
    assert "links outside the snapshot" in refused["message"]
    assert not [e for e in runs[0].events if e["event.category"] == "process"]


def test_a_sample_directory_that_is_a_link_is_refused(tmp_path):
    (tmp_path / "snap").mkdir()
    os.symlink("/", tmp_path / "snap" / "0")
    write_meta(tmp_path / "snap", "node1", 1)
    with pytest.raises(SourceError, match="symbolic link"):
        open_snapshot(tmp_path / "snap")


def test_an_oversized_file_is_refused_and_reported(tmp_path):
    tree = snapshot_with_two_processes(tmp_path)
    (tree.proc / "11" / "cmdline").write_bytes(b"x" * (1 << 20) + b"\0")
    runs = replay(tmp_path / "snap", [PROCESS])
    assert [e["process.pid"] for e in runs[0].events if "process.pid" in e] == [10]
    (refused,) = statuses(runs, "malformed")
    assert "proc/11/cmdline: 1048577 bytes, more than the" in refused["message"]


def test_a_raw_input_linked_outside_is_refused_for_its_sensor(tmp_path):
    secret = tmp_path / "secret.json"
    secret.write_text("[]")
    snapshot_with_two_processes(tmp_path)
    os.symlink(secret, tmp_path / "snap" / "0" / "sockets.json")
    runs = replay(tmp_path / "snap", [SOCKETS])
    assert runs[0].status["event.action"] == "unavailable"
    (refused,) = statuses(runs, "malformed")
    assert "sockets.json: links outside the snapshot" in refused["message"]


REPLAY_IN_CHILD = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, "tests/sensors"); sys.path.insert(0, "tests")
    from replay import replay
    from hpcsec.sensors.base import SensorSpec
    from hpcsec.sensors.process import ProcessSensor
    from hpcsec.sensors.sockets import SocketSensor
    runs = replay(sys.argv[1], [SensorSpec("process", ProcessSensor, "p"),
                                SensorSpec("sockets", SocketSensor, "s")])
    for run in runs:
        for e in run.events:
            print(e["event.action"], e.get("process.pid"), e.get("message", ""))
    """
)


def test_fifos_are_never_opened(tmp_path):
    tree = snapshot_with_two_processes(tmp_path)
    (tree.proc / "11" / "status").unlink()
    os.mkfifo(tree.proc / "11" / "status")
    os.mkfifo(tmp_path / "snap" / "0" / "sockets.json")
    (tmp_path / "snap" / "0" / "time").unlink()
    os.mkfifo(tmp_path / "snap" / "0" / "time")
    # the time file is a FIFO too: the sample is refused with a clear error, never a hang
    child = subprocess.run(
        [sys.executable, "-c", REPLAY_IN_CHILD, str(tmp_path / "snap")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "refused: not a regular file" in child.stderr
    (tmp_path / "snap" / "0" / "time").unlink()  # a sample without time replays at the epoch
    child = subprocess.run(
        [sys.executable, "-c", REPLAY_IN_CHILD, str(tmp_path / "snap")],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "present 10" in child.stdout and "present 11" not in child.stdout
    assert "proc/11/status: not a regular file" in child.stdout
    assert "sockets.json: not a regular file" in child.stdout

"""Live, as unprivileged users: a name that is not UTF-8 by one user never hides what
another user does (the process sensor, `scan`, the fanotify stream)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hpcsec.detector.cli.main import main
from hpcsec.detector.slurm.attribution import ProcReader
from hpcsec.sensors.base import FsRoot, SensorContext
from hpcsec.sensors.process import ProcessSensor
from hpcsec.sensors.procinfo import process_fields
from tests.slurm_harness import ensure_users

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs processes as alice and bob")

MINER_ARGS = ["--url", "stratum+tcp://pool.example:3333"]


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="hpcsec-hostile-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def start_as(user: str, argv: list) -> subprocess.Popen:
    entry = pwd.getpwnam(user)

    def drop() -> None:
        os.setgid(entry.pw_gid)
        os.setuid(entry.pw_uid)

    return subprocess.Popen(argv, preexec_fn=drop, cwd="/", stdout=subprocess.DEVNULL)


def wait_exec(child: subprocess.Popen, marker: bytes) -> None:
    """Until the child's command line shows `marker` (it has exec'd)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            if marker in Path(f"/proc/{child.pid}/cmdline").read_bytes():
                return
        except OSError:
            pass
        time.sleep(0.02)
    raise AssertionError(f"process {child.pid} never ran {marker!r}")


@pytest.fixture
def alice_hostile_and_bob_miner(shared_dir) -> Iterator[tuple[int, int]]:
    ensure_users()
    exe = os.path.join(os.fsencode(shared_dir), b"\xffsl")
    shutil.copy("/bin/sleep", exe)
    os.chmod(exe, 0o755)
    alice = start_as("alice", [exe, "120"])
    bob = start_as("bob", ["/usr/bin/python3", "-c", "import time; time.sleep(120)", *MINER_ARGS])
    try:
        wait_exec(alice, b"\xffsl")
        wait_exec(bob, b"stratum+tcp://")
        yield alice.pid, bob.pid
    finally:
        for child in (alice, bob):
            child.kill()
            child.wait()


def test_process_sensor_emits_the_hostile_executable_and_the_miner(
    alice_hostile_and_bob_miner, shared_dir
):
    alice, bob = alice_hostile_and_bob_miner
    ctx = SensorContext(
        "node", FsRoot("sys", "/sys"), FsRoot("proc", "/proc"), FsRoot("etc", "/etc")
    )
    by_pid = {e["process.pid"]: e for e in ProcessSensor().collect(ctx)}
    assert by_pid[alice]["process.executable"] == f"{shared_dir}/\\xffsl"
    assert by_pid[alice]["process.name"] == "\\xffsl"
    assert by_pid[alice]["user.name"] == "alice"
    assert by_pid[bob]["user.name"] == "bob"
    assert by_pid[bob]["process.command_line"].endswith(" ".join(MINER_ARGS))


def test_scan_raises_the_miner_alert_beside_a_hostile_executable(
    alice_hostile_and_bob_miner, capsys
):
    _, bob = alice_hostile_and_bob_miner
    rc = main(["scan", "--sensor", "process", "--format", "json"])
    out = capsys.readouterr().out
    alerts = json.loads(out)
    assert rc == 1
    assert any(str(bob) in json.dumps(a) and "stratum" in json.dumps(a) for a in alerts), out[:2000]


def test_stream_keeps_a_read_of_weights_beside_a_read_of_a_hostile_name(shared_dir):
    from snapshot_builder import NodeTree

    from hpcsec.sensors.file_access.sensor import FileAccessSensor

    ensure_users()
    models = shared_dir / "models"
    models.mkdir()
    models.chmod(0o755)
    weights = models / "w.safetensors"
    weights.write_bytes(b"w" * 4096)
    hostile = os.path.join(os.fsencode(models), b"\xff.bin")
    Path(os.fsdecode(hostile)).write_bytes(b"x" * 10)
    for path in (weights, Path(os.fsdecode(hostile))):
        path.chmod(0o644)
    ctx = NodeTree(shared_dir / "ctx").context(watch=[str(models)], stream=True)
    ctx.proc.path, ctx.etc.path = Path("/proc"), Path("/etc")
    sensor = FileAccessSensor()
    try:
        assert list(sensor.collect(ctx)) == []  # starts the stream
        alice = start_as("alice", ["cat", hostile])
        bob = start_as("bob", ["cat", str(weights)])
        alice.wait(), bob.wait()
        events: list[dict] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            events += list(sensor.collect(ctx))
            reads = {e.get("process.pid") for e in events if e["event.action"] == "read"}
            if {alice.pid, bob.pid} <= reads:
                break
            time.sleep(0.05)
    finally:
        sensor.close()
    paths = {(e["process.pid"], e["file.path"]) for e in events if e["event.action"] == "read"}
    assert (alice.pid, f"{models}/\\xff.bin") in paths
    assert (bob.pid, str(weights)) in paths


def test_a_comm_with_carriage_returns_does_not_forge_the_uid_or_parent():
    """A process names itself (prctl, /proc/self/comm): the kernel escapes `\\n` in the status
    Name line but not `\\r`. Split with str.splitlines, `\\rPPid:\\t1\\rUid:\\t0` became lines
    of their own, read before the real ones; every reader of the status file must keep the
    real uid and parent (the process sensor, the Slurm attribution's reader)."""
    ensure_users()
    forged = "import time; open('/proc/self/comm', 'w').write('\\rPPid:\\t1\\rUid:\\t0'); "
    child = start_as("alice", ["python3", "-c", forged + "time.sleep(60)", "hpcsec-comm-forger"])
    try:
        wait_exec(child, b"hpcsec-comm-forger")
        deadline = time.monotonic() + 10
        while b"Uid" not in Path(f"/proc/{child.pid}/comm").read_bytes():
            assert time.monotonic() < deadline, "the child never renamed itself"
            time.sleep(0.02)
        ctx = SensorContext(
            "n1", FsRoot("sys", "/sys"), FsRoot("proc", "/proc"), FsRoot("etc", "/etc")
        )
        fields = process_fields(ctx, child.pid)
        alice = pwd.getpwnam("alice").pw_uid
        assert (fields["user.id"], fields["user.name"]) == (alice, "alice")
        assert fields["process.parent.pid"] == os.getpid()
        reader = ProcReader(ctx.proc)
        assert (reader.uid(child.pid), reader.parent(child.pid)) == (alice, os.getpid())
    finally:
        child.kill()
        child.wait()

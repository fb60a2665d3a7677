"""The sockets sensor's owner mapping costs what changed, not what users hold: a process of an
unprivileged user holding 20,000 descriptors is walked once across samples, and the sockets it
opens later are still attributed to it (real sock_diag, real /proc, a real user)."""

from __future__ import annotations

import os
import pwd
import resource
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from hpcsec.sensors.base import FsRoot, SensorContext
from hpcsec.sensors.sockets import FULL_WALK_EVERY, SocketSensor
from tests.slurm_harness import ensure_users

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs a process as alice")

# About 20,000 descriptors in all: the most a process may hold where the hard limit is 20,000
# (raising it needs CAP_SYS_RESOURCE, which a test container may lack).
HELD = 19_900
# Holds HELD descriptors and a listening socket; on "socket" opens one more socket, on "swap"
# closes a descriptor first, so the new socket takes its number and the count stays the same.
HOLDER = f"""
import os, socket, sys
held = [os.open("/dev/null", os.O_RDONLY) for _ in range({HELD})]
keep = []
def listen():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    keep.append(s)
    print(s.getsockname()[1], flush=True)
listen()
for line in sys.stdin:
    if line.strip() == "swap":
        os.close(held.pop())
    listen()
"""


class CountingProc(FsRoot):
    """/proc, counting the reads of one process's descriptor directory."""

    def __init__(self, pid: int):
        super().__init__("proc", "/proc")
        self.pid = pid
        self.readlinks = self.listdirs = 0

    def readlink(self, rel: str) -> str | None:
        if rel.startswith(f"{self.pid}/fd/"):
            self.readlinks += 1
        return super().readlink(rel)

    def listdir(self, rel: str = "") -> list[str]:
        if rel == f"{self.pid}/fd":
            self.listdirs += 1
        return super().listdir(rel)


@pytest.fixture
def holder() -> Iterator[subprocess.Popen]:
    ensure_users()
    if resource.getrlimit(resource.RLIMIT_NOFILE)[1] < HELD + 50:
        pytest.skip(f"the descriptor limit is below {HELD + 50}")
    entry = pwd.getpwnam("alice")

    def as_alice() -> None:
        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        os.setgid(entry.pw_gid)
        os.setuid(entry.pw_uid)

    child = subprocess.Popen(
        ["/usr/bin/python3", "-c", HOLDER],
        preexec_fn=as_alice,
        cwd="/",
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield child
    finally:
        child.kill()
        child.wait()


def _new_socket(child: subprocess.Popen, command: str | None = None) -> int:
    assert child.stdin is not None and child.stdout is not None
    if command is not None:
        child.stdin.write(command + "\n")
        child.stdin.flush()
    return int(child.stdout.readline())


def _listening(sensor: SocketSensor, proc: FsRoot) -> dict[int, dict[str, Any]]:
    ctx = SensorContext("live", FsRoot("sys", "/sys"), proc, FsRoot("etc", "/etc"))
    return {
        e["source.port"]: e
        for e in sensor.collect(ctx)
        if e.get("network.state") == "LISTEN" and e.get("source.ip") == "127.0.0.1"
    }


def test_a_process_with_20000_descriptors_is_walked_once(holder: subprocess.Popen):
    first_port = _new_socket(holder)
    proc = CountingProc(holder.pid)
    sensor = SocketSensor()
    owner = _listening(sensor, proc)[first_port]
    assert (owner["process.pid"], owner["user.name"]) == (holder.pid, "alice")
    walked = proc.readlinks
    assert walked > HELD and proc.listdirs == 1
    for _ in range(3):
        assert _listening(sensor, proc)[first_port]["process.pid"] == holder.pid
    assert (proc.readlinks, proc.listdirs) == (walked, 1)  # nothing read again

    # A socket opened later changes the count: the process is walked again, once.
    later = _new_socket(holder, "socket")
    found = _listening(sensor, proc)
    assert found[later]["process.pid"] == holder.pid
    assert found[first_port]["process.pid"] == holder.pid and proc.listdirs == 2


def test_a_socket_swapped_in_without_a_count_change_is_still_attributed(
    holder: subprocess.Popen,
):
    _new_socket(holder)
    proc = CountingProc(holder.pid)
    sensor = SocketSensor()
    _listening(sensor, proc)
    swapped = _new_socket(holder, "swap")
    owners = []
    for _ in range(FULL_WALK_EVERY + 1):
        owners.append(_listening(sensor, proc)[swapped].get("process.pid"))
    # unattributed at first (the count did not move), found by the bounded full walk
    assert owners[0] is None and owners[-1] == holder.pid
    assert proc.listdirs == 2

"""The file-access stream never blocks the node: whatever the agent's process is doing
(stopped, holding the GIL, killed), opens of protected files by another user complete,
and what the agent could not take is counted, not lost silently."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import slurm_harness

from hpcsec.sensors.base import FsRoot, SensorContext
from hpcsec.sensors.file_access import openers
from hpcsec.sensors.file_access.sensor import FileAccessSensor

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="fanotify and runuser need root")
OPEN_TIMEOUT_S = 5.0  # a liveness bound: an open the kernel holds for an answer never returns

# The agent's side, as the agent runs it: the file-access sensor streaming in a process of
# its own, so the test can stop it, hold its GIL or kill it.
AGENT = r"""
import ctypes, json, sys, time
from hpcsec.sensors.base import FsRoot, SensorContext
from hpcsec.sensors.file_access.sensor import FileAccessSensor

watch, mode, wanted, count_by = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
ctx = SensorContext(
    "node", FsRoot("sys", "/sys"), FsRoot("proc", "/proc"), FsRoot("etc", "/etc"),
    options={"watch": [watch], "stream": True},
)
sensor = FileAccessSensor()
list(sensor.collect(ctx))
print(sensor._watch.responder_pid, flush=True)
if mode == "gil":
    # A C call made through PyDLL keeps the GIL, as a stuck regex match does: no thread of
    # this process runs Python until it returns.
    ctypes.PyDLL(None).sleep(int(sys.argv[5]))
else:
    sys.stdin.readline()
# open events (one per opener) and the opens they fold (access_count counts every action
# of the record, e.g. a `cat`'s open and read: only the open-only test reads it); the loop
# waits for `wanted` of what the test counts, so a record folding two actions cannot end it
# before every opener was reported
open_events = opens = dropped = timeouts = unnamed = 0
deadline = time.monotonic() + 90  # a bound for a loaded machine, not a speed
while (open_events if count_by == "events" else opens) + dropped < wanted and (
    time.monotonic() < deadline
):
    for e in sensor.collect(ctx):
        if e.get("event.action") == "open":
            open_events += 1
            opens += e.get("file.access_count") or 1
            unnamed += "user.id" not in e
        dropped += e.get("hpcsec.dropped", 0)
        if e.get("event.action") == "answer_timeout":
            timeouts += e["hpcsec.errors"]
    time.sleep(0.05)
result = {
    "open_events": open_events,
    "opens": opens,
    "dropped": dropped,
    "timeouts": timeouts,
    "unnamed": unnamed,
}
print(json.dumps(result), flush=True)
sensor.close()
"""


@pytest.fixture
def protected():
    slurm_harness.ensure_users()
    top = Path(tempfile.mkdtemp(prefix="hpcsec-failopen-"))
    top.chmod(0o755)
    (top / "model").mkdir(mode=0o755)
    shard = top / "model" / "shard-0.safetensors"
    shard.write_bytes(b"s" * 128)
    shard.chmod(0o644)
    yield top
    shutil.rmtree(top, ignore_errors=True)


def start_agent(
    watch: Path, mode: str, wanted: int, *extra: str, count_by: str = "events"
) -> tuple[subprocess.Popen, int]:
    """The agent's side in a process of its own; it reports once `wanted` open events (or
    with count_by="opens", folded opens) plus drops were read."""
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT, str(watch), mode, str(wanted), count_by, *extra],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert agent.stdout is not None
    responder = int(agent.stdout.readline())
    return agent, responder


def opens_by_alice(path: Path, count: int) -> None:
    """`count` opens by another user, each bounded: one that hangs fails the test."""
    for _ in range(count):
        cat = subprocess.run(
            ["runuser", "-u", "alice", "--", "cat", str(path)],
            capture_output=True,
            timeout=OPEN_TIMEOUT_S,
        )
        assert (cat.returncode, len(cat.stdout)) == (0, 128)


def summary(agent: subprocess.Popen) -> dict:
    out, _ = agent.communicate(timeout=150)
    return json.loads(out.strip().splitlines()[-1])


@root_only
def test_opens_complete_while_the_agent_is_stopped_and_are_reported_after(protected):
    shard = protected / "model" / "shard-0.safetensors"
    agent, _ = start_agent(protected / "model", "stop", 100)
    try:
        os.kill(agent.pid, signal.SIGSTOP)
        opens_by_alice(shard, 100)
    finally:
        os.kill(agent.pid, signal.SIGCONT)
    assert agent.stdin is not None
    agent.stdin.write("go\n")
    agent.stdin.flush()
    result = summary(agent)
    assert (result["open_events"], result["dropped"]) == (100, 0)  # all fit in the channel
    # The first open waited out the hold; the rest did not wait, and each `cat` was gone
    # when the agent came to read it: every one is counted, as many as name no user.
    assert result["timeouts"] == result["unnamed"] == 100


@root_only
def test_opens_complete_while_the_agent_holds_the_gil(protected):
    shard = protected / "model" / "shard-0.safetensors"
    agent, _ = start_agent(protected / "model", "gil", 20, "5")
    opens_by_alice(shard, 20)
    assert agent.poll() is None  # the GIL was held all along: the opens did not wait for it
    result = summary(agent)
    assert result["open_events"] == 20


@root_only
def test_what_a_stopped_agent_cannot_take_is_counted_never_waited_for(protected):
    """More accesses than the channel holds while the agent is stopped: each open completes
    at once, and reported plus dropped is exactly what happened."""
    shard = protected / "model" / "shard-0.safetensors"
    opens = 6000
    agent, _ = start_agent(protected / "model", "stop", opens, count_by="opens")
    try:
        os.kill(agent.pid, signal.SIGSTOP)
        subprocess.run(
            [sys.executable, "-c", f"for _ in range({opens}): open({str(shard)!r}).close()"],
            check=True,
            timeout=60,
        )
    finally:
        os.kill(agent.pid, signal.SIGCONT)
    assert agent.stdin is not None
    agent.stdin.write("go\n")
    agent.stdin.flush()
    result = summary(agent)
    assert result["dropped"] > 0
    assert result["opens"] + result["dropped"] == opens


@root_only
def test_the_responder_goes_with_a_killed_agent_and_its_marks_with_it(protected):
    shard = protected / "model" / "shard-0.safetensors"
    agent, responder = start_agent(protected / "model", "stop", 1)
    agent.kill()
    agent.wait()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{responder}").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    state = Path(f"/proc/{responder}/stat")
    assert not state.exists() or state.read_text().split(") ")[1][0] == "Z"
    opens_by_alice(shard, 3)


@root_only
def test_the_responder_never_reads_proc_for_an_answer(protected):
    """Its only /proc use is its own descriptor table: it has no open file under /proc."""
    agent, responder = start_agent(protected / "model", "stop", 1)
    try:
        targets = [os.readlink(fd) for fd in Path(f"/proc/{responder}/fd").iterdir()]
        assert not [t for t in targets if t.startswith("/proc")]
        assert pwd.getpwuid(os.stat(f"/proc/{responder}").st_uid).pw_name == "root"
    finally:
        agent.kill()
        agent.wait()


@root_only
def test_every_open_let_through_unheld_whose_opener_is_gone_is_counted(protected, monkeypatch):
    """After one open waits out the hold the responder holds nothing until the agent answers
    again: the opens it lets through meanwhile are reported with their pid alone when the
    opener is gone by the time the agent reads it. Each is counted in the `answer_timeout`
    status, with the one that timed out, so the count is exactly the opens whose events
    name no user; an opener still alive when read is named and not counted."""
    shard = protected / "model" / "shard-0.safetensors"
    release = threading.Event()
    read_opener = openers.access_process_fields

    def stalled(ctx, pid, users=None):  # the agent's thread stuck (a slow /proc, a GC)
        release.wait(30)
        return read_opener(ctx, pid, users)

    monkeypatch.setattr(openers, "access_process_fields", stalled)
    ctx = SensorContext(
        "node",
        FsRoot("sys", "/sys"),
        FsRoot("proc", "/proc"),
        FsRoot("etc", "/etc"),
        options={"watch": [str(protected / "model")], "stream": True},
    )
    sensor = FileAccessSensor()
    lingering = None
    events: list[dict] = []
    try:
        list(sensor.collect(ctx))
        opens_by_alice(shard, 5)  # the first waits out the hold, the other four are not held
        lingering = subprocess.Popen(  # not held either, but alive when the agent reads it
            ["runuser", "-u", "alice", "--", "sh", "-c", 'exec 3<"$0"; echo opened; read x', shard],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert lingering.stdout is not None and lingering.stdout.readline() == "opened\n"
        release.set()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            events += list(sensor.collect(ctx))
            if len([e for e in events if e["event.action"] == "open"]) >= 6:
                break
            time.sleep(0.05)
        time.sleep(0.3)  # any count still on its way
        events += list(sensor.collect(ctx))
    finally:
        release.set()
        if lingering is not None:
            lingering.communicate("\n", timeout=10)
        sensor.close()
    opened = [e for e in events if e["event.action"] == "open"]
    assert len(opened) == 6
    unnamed = [e for e in opened if "user.id" not in e]
    named = [e for e in opened if "user.id" in e]
    assert [(e["user.name"], e["process.name"]) for e in named] == [("alice", "sh")]
    counted = [e for e in events if e["event.action"] == "answer_timeout"]
    assert sum(e["hpcsec.errors"] for e in counted) == len(unnamed) == 5

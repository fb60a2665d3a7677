"""A process whose arguments never come back (sensors/stalls.py): its owner maps a file of a
FUSE file system that does not answer over them. Here the read blocks in the kernel on a
FIFO with no writer, in a /proc fixture tree: the same wait, without FUSE."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest

from hpcsec.detector.config.site import SiteConfig
from hpcsec.detector.runtime import sensorset
from hpcsec.detector.runtime.node import live_context
from hpcsec.detector.runtime.registry import by_name
from hpcsec.detector.runtime.sensorset import BudgetedSensors, SensorSet
from hpcsec.detector.slurm.attribution import ProcReader
from hpcsec.sensors import procinfo, stalls, subuids
from hpcsec.sensors.base import SensorContext
from hpcsec.sensors.procinfo import owner_key, process_fields, read_environ

STALL_S = 0.3
HOSTILE, HONEST = 4242, 100


def _wait_for(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _process(proc: Path, pid: int, uid: int, cmdline: bytes | None, start: int = 5000) -> None:
    base = proc / str(pid)
    base.mkdir()
    fields = ["S", "1", *["0"] * 17, str(start)]  # field 22: the start time
    (base / "stat").write_text(f"{pid} (python3) {' '.join(fields)} 0 0\n")
    (base / "status").write_text(f"Name:\tpython3\nPPid:\t1\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    (base / "comm").write_text("python3\n")
    (base / "environ").write_bytes(b"SLURM_JOB_ID=7\0")
    if cmdline is None:
        os.mkfifo(base / "cmdline")  # opened for reading, it waits for a writer: forever
    else:
        (base / "cmdline").write_bytes(cmdline)


class Node:
    """A /proc with an honest process and one whose cmdline read never returns."""

    def __init__(self, root: Path):
        self.proc = root / "proc"
        self.proc.mkdir()
        etc = root / "etc"
        etc.mkdir()
        (etc / "passwd").write_text(
            "alice:x:1000:1000::/:/bin/sh\nmallory:x:1001:1001::/:/bin/sh\n"
        )
        _process(self.proc, HONEST, 1000, b"python3\0train.py\0")
        _process(self.proc, HOSTILE, 1001, None)
        self.etc = etc

    def context(self) -> SensorContext:
        return live_context(
            SiteConfig(), procfs_root=str(self.proc), etc_root=str(self.etc), host_name="n1"
        )

    def answer(self, pid: int = HOSTILE, name: str = "cmdline") -> None:
        """The FUSE daemon answers at last: the blocked open and read return (empty)."""
        fifo = self.proc / str(pid) / name
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # fails unless a reader waits
        os.close(fd)
        fifo.unlink()
        fifo.write_bytes(b"python3\0miner.py\0")


@pytest.fixture
def node(tmp_path: Path, monkeypatch) -> Iterator[Node]:
    monkeypatch.setattr(stalls, "STALL_S", STALL_S)
    monkeypatch.setattr(sensorset, "WATCH_S", 0.05)
    yield Node(tmp_path)
    _wait_for(lambda: not stalls.quarantined())  # every test lets its stuck reads go


def _by_pid(events: list[dict]) -> dict[int, dict]:
    return {e["process.pid"]: e for e in events if "process.pid" in e}


def test_a_scan_is_not_held_by_a_process_whose_arguments_never_come(node: Node, caplog):
    """`hpcsec scan` runs each sensor in a watched thread: the stalled run is given up and
    the sensor run again, the process reported without its arguments and marked."""
    with caplog.at_level(logging.WARNING), SensorSet([by_name()["process"]]) as sensors:
        (run,) = sensors.sample(node.context())
    assert run.ok
    found = _by_pid(run.events)
    assert found[HONEST]["process.command_line"] == "python3 train.py"
    assert found[HONEST]["process.env.SLURM_JOB_ID"] == "7"
    hostile = found[HOSTILE]
    assert hostile["process.memory_read_stalled"] is True
    assert hostile["user.name"] == "mallory" and "process.command_line" not in hostile
    assert "process.env.SLURM_JOB_ID" not in hostile  # its memory is not read at all
    assert stalls.quarantined() == [HOSTILE]
    assert f"a read of process {HOSTILE}'s memory has not returned" in caplog.text
    node.answer()  # the daemon answers: the given-up read returns, the quarantine ends
    _wait_for(lambda: not stalls.quarantined())
    with SensorSet([by_name()["process"]]) as sensors:
        (run,) = sensors.sample(node.context())
    assert _by_pid(run.events)[HOSTILE]["process.command_line"] == "python3 miner.py"


def test_the_agent_gives_the_stuck_thread_up_at_its_next_sample(node: Node):
    sensors = BudgetedSensors([by_name()["process"]])
    try:
        (slow,) = sensors.sample(node.context(), lambda _: 0.1)
        assert slow.status["event.action"] == "slow"
        stuck = sensors.workers[0]
        time.sleep(STALL_S)
        (run,) = sensors.sample(node.context(), lambda _: 30.0)
        assert run.ok and sensors.workers[0] is not stuck
        assert _by_pid(run.events)[HOSTILE]["process.memory_read_stalled"] is True
        assert _by_pid(run.events)[HONEST]["process.command_line"] == "python3 train.py"
        node.answer()
        _wait_for(lambda: not stuck.thread.is_alive())  # it ended at its read
        runs = sensors.sample(node.context(), lambda _: 30.0)
        assert [r.status["event.action"] for r in runs] == ["ok"]  # its run was dropped
        assert _by_pid(runs[0].events)[HOSTILE]["process.command_line"] == "python3 miner.py"
    finally:
        if stalls.quarantined():
            node.answer()
        sensors.close()


def test_a_thread_nobody_watches_gets_its_answer_or_quarantined_in_time(node: Node):
    """Enrichment, Slurm attribution and the file-access watch read process fields outside
    any sensor run: a reader thread makes the read, waited for at most STALL_S."""
    ctx = node.context()
    started = time.monotonic()
    fields = process_fields(ctx, HOSTILE)
    assert time.monotonic() - started < 10 * STALL_S
    assert fields["process.memory_read_stalled"] is True and fields["user.id"] == 1001
    assert read_environ(ctx.proc, HOSTILE) is None  # quarantined: not read, not waited for
    assert process_fields(ctx, HONEST)["process.command_line"] == "python3 train.py"
    assert stalls.quarantined() == [HOSTILE]
    node.answer()
    _wait_for(lambda: not stalls.quarantined())
    assert process_fields(ctx, HOSTILE)["process.command_line"] == "python3 miner.py"


def test_reads_queued_behind_a_stuck_one_go_to_a_new_reader(node: Node):
    release = threading.Event()
    results: list[object] = []

    def later() -> None:
        time.sleep(STALL_S / 3)  # queued while the first read is stuck
        results.append(stalls.guarded(HONEST, lambda: "honest"))

    helper = threading.Thread(target=later)
    helper.start()
    with pytest.raises(stalls.Quarantined):
        stalls.guarded(HOSTILE, lambda: release.wait(30))
    helper.join(10)
    assert results == ["honest"] and stalls.quarantined() == [HOSTILE]
    release.set()
    _wait_for(lambda: not stalls.quarantined())


def test_given_up_threads_are_bounded(node: Node, monkeypatch):
    """Hostile processes cannot pile up blocked threads: past MAX_ABANDONED, reads of other
    threads are refused at once while the reader is stuck."""
    monkeypatch.setattr(stalls, "MAX_ABANDONED", 1)
    first, second = threading.Event(), threading.Event()
    with pytest.raises(stalls.Quarantined):
        stalls.guarded(HOSTILE, lambda: first.wait(30))
    with pytest.raises(stalls.NoReader):  # stuck, and not given up: not quarantined either
        stalls.guarded(HOSTILE + 1, lambda: second.wait(30))
    assert stalls.quarantined() == [HOSTILE]
    started = time.monotonic()
    with pytest.raises(stalls.NoReader):  # an innocent process: refused, never marked
        stalls.guarded(HONEST, lambda: "honest")
    assert time.monotonic() - started < STALL_S
    assert "process.memory_read_stalled" not in process_fields(node.context(), HONEST)
    second.set()
    first.set()
    _wait_for(lambda: not stalls.quarantined())
    _wait_for(lambda: _reads(HONEST) == "honest")


def _reads(pid: int) -> object:
    try:
        return stalls.guarded(pid, lambda: "honest")
    except stalls.Quarantined:
        return None


def test_the_environment_stalling_alone_is_caught_too(node: Node):
    (node.proc / str(HOSTILE) / "cmdline").unlink()
    (node.proc / str(HOSTILE) / "cmdline").write_bytes(b"python3\0x.py\0")
    (node.proc / str(HOSTILE) / "environ").unlink()
    os.mkfifo(node.proc / str(HOSTILE) / "environ")
    with SensorSet([by_name()["process"]]) as sensors:
        (run,) = sensors.sample(node.context())
    hostile = _by_pid(run.events)[HOSTILE]
    assert hostile["process.memory_read_stalled"] is True
    node.answer(HOSTILE, "environ")


def test_a_backlog_of_quick_reads_quarantines_nobody(node: Node):
    """Reads that each take under STALL_S but wait longer in the reader's queue are not
    stalls: no process is quarantined, every read is answered."""
    results: dict[int, object] = {}

    def read(pid: int) -> None:
        try:
            results[pid] = stalls.guarded(pid, lambda: time.sleep(STALL_S * 0.4) or pid)
        except stalls.Quarantined:
            results[pid] = "quarantined"

    threads = [threading.Thread(target=read, args=(pid,)) for pid in range(1, 6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results == {pid: pid for pid in range(1, 6)} and not stalls.quarantined()


def test_a_scan_is_not_held_when_no_more_threads_may_be_given_up(node: Node, monkeypatch):
    """Past the bound the stalled sensor is reported slow; once threads may be given up
    again, the next run gives it up (it is not left stuck for good)."""
    monkeypatch.setattr(stalls, "MAX_ABANDONED", 0)
    with SensorSet([by_name()["process"]]) as sensors:
        (run,) = sensors.sample(node.context())
        assert run.status["event.action"] == "slow"
        assert "too many such reads given up" in run.status["message"]
        monkeypatch.setattr(stalls, "MAX_ABANDONED", 8)
        (run,) = sensors.sample(node.context())
        assert run.ok and _by_pid(run.events)[HOSTILE]["process.memory_read_stalled"] is True
        node.answer()


def test_a_reused_pid_is_read_while_the_old_process_read_is_still_stuck(node: Node, tmp_path):
    """A stuck read pins the old process's memory, not its pid: the process the kernel
    gives that pid to next is read as any other, not marked."""
    with SensorSet([by_name()["process"]]) as sensors:
        (run,) = sensors.sample(node.context())
        assert _by_pid(run.events)[HOSTILE]["process.memory_read_stalled"] is True
        held = tmp_path / "held-fifo"
        (node.proc / str(HOSTILE) / "cmdline").rename(held)  # the stuck open keeps waiting
        for name in ("stat", "cmdline", "environ"):
            (node.proc / str(HOSTILE) / name).unlink(missing_ok=True)
        _process_files(node.proc / str(HOSTILE), start=9000)
        (run,) = sensors.sample(node.context())
        victim = _by_pid(run.events)[HOSTILE]
        assert victim["process.command_line"] == "python3 victim.py"
        assert victim["process.env.LD_PRELOAD"] == "/home/alice/lib.so"
        assert "process.memory_read_stalled" not in victim
        assert stalls.quarantined() == [HOSTILE]  # the old process's read is still stuck
    os.close(os.open(held, os.O_WRONLY | os.O_NONBLOCK))


def _process_files(base: Path, start: int) -> None:
    fields = ["S", "1", *["0"] * 17, str(start)]
    (base / "stat").write_text(f"{base.name} (python3) {' '.join(fields)} 0 0\n")
    (base / "cmdline").write_bytes(b"python3\0victim.py\0")
    (base / "environ").write_bytes(b"LD_PRELOAD=/home/alice/lib.so\0")


def test_the_agent_gives_the_stuck_thread_up_within_a_sample_that_has_time(node: Node):
    """A budget longer than STALL_S: the sample itself gives the thread up and delivers the
    new run, the process marked."""
    sensors = BudgetedSensors([by_name()["process"]])
    try:
        (run,) = sensors.sample(node.context(), lambda _: 30.0)
        assert run.ok
        assert _by_pid(run.events)[HOSTILE]["process.memory_read_stalled"] is True
        assert _by_pid(run.events)[HONEST]["process.command_line"] == "python3 train.py"
    finally:
        if stalls.quarantined():
            node.answer()
        sensors.close()


def test_one_owners_stuck_reads_do_not_use_up_what_may_be_given_up(node: Node, monkeypatch):
    """Mallory has more processes whose arguments hang than threads may be given up: once
    her share of stuck reads is blocked, her other processes are not read (marked skipped),
    so the scan is not left stuck for every user of the node."""
    monkeypatch.setattr(stalls, "MAX_STUCK_PER_OWNER", 1)
    monkeypatch.setattr(stalls, "MAX_ABANDONED", 2)
    for pid in (HOSTILE + 1, HOSTILE + 2):
        _process(node.proc, pid, 1001, None)
    _process(node.proc, HOSTILE + 3, 1001, b"python3\0mine.py\0")
    with SensorSet([by_name()["process"]]) as sensors:
        (run,) = sensors.sample(node.context())
    assert run.ok
    found = _by_pid(run.events)
    assert found[HOSTILE]["process.memory_read_stalled"] is True
    for pid in (HOSTILE + 1, HOSTILE + 2, HOSTILE + 3):
        assert found[pid]["process.memory_read_skipped"] is True, pid
        assert found[pid]["user.name"] == "mallory"
        assert "process.command_line" not in found[pid]
        assert "process.memory_read_stalled" not in found[pid]
    assert found[HONEST]["process.command_line"] == "python3 train.py"
    assert stalls.quarantined() == [HOSTILE]  # one thread given up, not the bound
    node.answer()  # her stuck read returns: her other processes are read again
    _wait_for(lambda: not stalls.quarantined())
    fields = process_fields(node.context(), HOSTILE + 3)
    assert fields["process.command_line"] == "python3 mine.py"
    assert "process.memory_read_skipped" not in fields


def test_threads_nobody_watches_skip_the_processes_of_an_owner_with_stuck_reads(
    node: Node, monkeypatch
):
    monkeypatch.setattr(stalls, "MAX_STUCK_PER_OWNER", 1)
    _process(node.proc, HOSTILE + 3, 1001, b"python3\0mine.py\0")
    ctx = node.context()
    assert process_fields(ctx, HOSTILE)["process.memory_read_stalled"] is True
    started = time.monotonic()
    assert process_fields(ctx, HOSTILE + 3)["process.memory_read_skipped"] is True
    assert read_environ(ctx.proc, HOSTILE + 3) is None
    assert time.monotonic() - started < STALL_S  # refused at once, not waited for
    assert process_fields(ctx, HONEST)["process.command_line"] == "python3 train.py"
    node.answer()
    _wait_for(lambda: not stalls.quarantined())
    assert read_environ(ctx.proc, HOSTILE + 3) == b"SLURM_JOB_ID=7\0"


def test_the_reader_says_when_it_gives_a_read_up(node: Node, caplog):
    with caplog.at_level(logging.WARNING):
        assert process_fields(node.context(), HOSTILE)["process.memory_read_stalled"] is True
    assert (
        f"the /proc reader (enrichment, attribution): a read of process {HOSTILE}'s memory "
        "has not returned" in caplog.text
    )
    node.answer()


def test_an_owner_is_counted_even_when_its_process_is_gone_by_the_give_up(node: Node, monkeypatch):
    """The owner is read before the read: a process whose environ read hangs may exit (its
    stuck read keeps its memory) before the read is given up, and still counts for her."""
    monkeypatch.setattr(stalls, "MAX_STUCK_PER_OWNER", 1)
    (node.proc / str(HOSTILE) / "cmdline").unlink()
    (node.proc / str(HOSTILE) / "cmdline").write_bytes(b"python3\0x.py\0")
    (node.proc / str(HOSTILE) / "environ").unlink()
    os.mkfifo(node.proc / str(HOSTILE) / "environ")
    _process(node.proc, HOSTILE + 3, 1001, b"python3\0mine.py\0")
    ctx = node.context()

    def reaped() -> None:  # once the read waits: the process exits and is reaped
        time.sleep(STALL_S / 3)
        for name in ("status", "stat"):
            (node.proc / str(HOSTILE) / name).unlink()

    threading.Thread(target=reaped).start()
    assert read_environ(ctx.proc, HOSTILE) is None  # given up after STALL_S
    assert process_fields(ctx, HOSTILE + 3)["process.memory_read_skipped"] is True
    node.answer(HOSTILE, "environ")


def test_a_users_subordinate_uids_count_as_that_user(node: Node, monkeypatch):
    """Processes her rootless container runs (another user namespace) as uids of her
    subuid range are hers; a process of the initial namespace with a uid in her range (a real
    user the range overlaps) is its own owner."""
    monkeypatch.setattr(stalls, "MAX_STUCK_PER_OWNER", 1)
    (node.etc / "subuid").write_text("mallory:165536:65536\n")
    subuids.forget()
    try:
        _namespace(node.proc, 1, "user:[4026531837]")  # init's
        _process(node.proc, HOSTILE + 1, 165540, None)  # hangs too, as another uid of hers
        _process(node.proc, HOSTILE + 2, 165541, b"python3\0mine.py\0")
        _process(node.proc, HOSTILE + 5, 165542, b"python3\0real.py\0")  # init's namespace
        for pid in (HOSTILE + 1, HOSTILE + 2):
            _namespace(node.proc, pid, "user:[4026532999]")
        _namespace(node.proc, HOSTILE + 5, "user:[4026531837]")
        with SensorSet([by_name()["process"]]) as sensors:
            (run,) = sensors.sample(node.context())
        found = _by_pid(run.events)
        assert run.ok and stalls.quarantined() == [HOSTILE]
        assert found[HOSTILE + 1]["process.memory_read_skipped"] is True
        assert found[HOSTILE + 2]["process.memory_read_skipped"] is True
        assert found[HOSTILE + 5]["process.command_line"] == "python3 real.py"
        assert found[HONEST]["process.command_line"] == "python3 train.py"
        node.answer()
    finally:
        subuids.forget()


def _namespace(proc: Path, pid: int, target: str) -> None:
    (proc / str(pid) / "ns").mkdir(parents=True)
    os.symlink(target, proc / str(pid) / "ns" / "user")


def test_slurm_attribution_counts_a_containers_processes_for_their_user(node: Node, monkeypatch):
    """Attribution reads environments outside any sensor run (the reader thread): her
    container's processes count for her there too, so they cannot fill the give-ups."""
    monkeypatch.setattr(stalls, "MAX_STUCK_PER_OWNER", 1)
    (node.etc / "subuid").write_text("mallory:165536:65536\n")
    subuids.forget()
    try:
        _namespace(node.proc, 1, "user:[4026531837]")
        for pid, uid in ((HOSTILE + 1, 165540), (HOSTILE + 2, 165541)):
            _process(node.proc, pid, uid, b"python3\0x.py\0")
            _namespace(node.proc, pid, "user:[4026532999]")
        (node.proc / str(HOSTILE + 1) / "environ").unlink()
        os.mkfifo(node.proc / str(HOSTILE + 1) / "environ")  # hangs
        ctx = node.context()
        reader = ProcReader(ctx.proc, partial(owner_key, ctx))
        assert reader.environ_job(HOSTILE + 1) is None  # given up after STALL_S
        started = time.monotonic()
        assert reader.environ_job(HOSTILE + 2) is None  # hers: not read
        assert time.monotonic() - started < STALL_S
        assert reader.environ_job(HONEST) is not None  # alice's is read
        node.answer(HOSTILE + 1, "environ")
    finally:
        subuids.forget()


def test_a_context_kept_for_a_whole_run_sees_the_ranges_change(node: Node, monkeypatch):
    """The file-access watch keeps one context (one timestamp) for its whole run: the
    ranges it names owners by still follow the node's subuid file."""
    monkeypatch.setattr(procinfo, "RANGES_TTL_S", 0.0)
    monkeypatch.setattr(subuids, "RELOAD_S", 0.0)
    subuids.forget()
    try:
        _namespace(node.proc, 1, "user:[4026531837]")
        _process(node.proc, HOSTILE + 1, 165540, b"python3\0x.py\0")
        _namespace(node.proc, HOSTILE + 1, "user:[4026532999]")
        ctx = node.context()
        assert procinfo.owner_key(ctx, HOSTILE + 1, 165540) == 165540  # no ranges yet
        (node.etc / "subuid").write_text("mallory:165536:65536\n")
        assert procinfo.owner_key(ctx, HOSTILE + 1, 165540) == 1001
    finally:
        subuids.forget()

"""The file-access sensor: folding, records, replay, the /proc fd walk, and fanotify for real."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest
from snapshot_builder import NodeTree

from hpcsec.sensors.base import SensorUnavailable
from hpcsec.sensors.file_access.records import Folder, parse_records
from hpcsec.sensors.file_access.sensor import FileAccessSensor
from hpcsec.sensors.snapshot import SnapshotWriter

TEST_USER = "hpcsec-test"
T0 = "2026-11-30T10:00:00.000Z"


def test_folder_folds_repeats_of_one_pid_and_path():
    folder = Folder()
    folder.add(T0, 7, "/m/w.bin", "open", size=10)
    for _ in range(999):
        folder.add("2026-11-30T10:00:01.000Z", 7, "/m/w.bin", "read")
    folder.add(T0, 8, "/m/w.bin", "read")
    records, dropped = folder.drain()
    assert dropped == 0
    assert [(r.pid, r.path, r.actions, r.count, r.time, r.size) for r in records] == [
        (7, "/m/w.bin", ["open", "read"], 1000, T0, 10),
        (8, "/m/w.bin", ["read"], 1, T0, None),
    ]
    assert folder.drain() == ([], 0)


def test_folder_is_bounded_and_counts_what_it_drops():
    folder = Folder(max_records=2)
    for pid in range(5):
        folder.add(T0, pid, "/m/a", "read")
    folder.add(T0, 1, "/m/a", "read")  # folds into a kept record: not a drop
    records, dropped = folder.drain()
    assert [(r.pid, r.count) for r in records] == [(0, 1), (1, 2)]
    assert dropped == 3


def test_parse_records_reports_each_bad_line():
    text = "\n".join(
        [
            json.dumps({"time": T0, "pid": 1, "path": "/a", "actions": ["read"], "count": 3}),
            "{oops",
            json.dumps({"time": T0, "pid": "1", "path": "/a", "actions": ["read"]}),
            json.dumps({"time": T0, "pid": 1, "path": "/a", "actions": ["chmod"]}),
            json.dumps({"time": T0, "pid": 1, "path": "/a", "actions": ["read"], "count": 0}),
        ]
    )
    records, problems = parse_records(text)
    assert [(r.pid, r.count) for r in records] == [(1, 3)]
    assert problems == [
        "line 2: invalid JSON: Expecting property name enclosed in double quotes",
        'line 3: "pid" must be an integer',
        'line 4: "actions" must be a non-empty list of open, read, write, close_write, '
        "create, delete, rename, exec",
        'line 5: "count" must be a positive integer',
    ]


def replay_node(tmp_path) -> NodeTree:
    node = NodeTree(tmp_path)
    node.passwd(("root", 0), ("mallory", 1666))
    node.process(31337, "scp", ["scp", "/lustre/models/llama/w.safetensors", "x:"], uid=1666)
    return node


def test_replay_turns_each_record_into_one_event_per_action(tmp_path):
    ctx = replay_node(tmp_path).context()
    ctx.replay_inputs = {
        "file-events.jsonl": json.dumps(
            {
                "time": "2026-11-30T09:59:58.120Z",
                "pid": 31337,
                "path": "/lustre/models/llama/w.safetensors",
                "actions": ["read", "open"],
                "count": 4096,
            }
        )
        + "\n"
        + json.dumps(
            {
                "time": "2026-11-30T09:59:59.000Z",
                "pid": 999,
                "path": "/lustre/models/llama/x",
                "actions": ["rename"],
                "count": 1,
                "target": "/scratch/x",
            }
        )
        + "\n"
    }
    events = list(FileAccessSensor().collect(ctx))
    assert [(e["event.action"], e["@timestamp"]) for e in events] == [
        ("open", "2026-11-30T09:59:58.120Z"),
        ("read", "2026-11-30T09:59:58.120Z"),
        ("rename", "2026-11-30T09:59:59.000Z"),
    ]
    read = events[1]
    assert read["event.category"] == "file_access"
    assert read["file.path"] == "/lustre/models/llama/w.safetensors"
    assert read["file.name"] == "w.safetensors"
    assert read["file.extension"] == "safetensors"
    assert read["file.directory"] == "/lustre/models/llama"
    assert read["file.access_count"] == 4096
    assert read["process.pid"] == 31337
    assert read["process.name"] == "scp"
    assert read["user.name"] == "mallory"
    assert read["user.id"] == 1666
    rename = events[2]
    assert rename["file.target_path"] == "/scratch/x"
    assert "file.access_count" not in rename and "file.extension" not in rename
    assert rename["process.pid"] == 999 and "user.id" not in rename  # pid not in the sample


def test_replay_reports_malformed_lines_and_missing_file(tmp_path):
    ctx = replay_node(tmp_path).context()
    ctx.replay_inputs = {"file-events.jsonl": "[]\n"}
    (status,) = FileAccessSensor().collect(ctx)
    assert status["event.action"] == "malformed"
    assert status["message"] == "file-events.jsonl: line 1: expected a JSON object"
    ctx.replay_inputs = {}
    with pytest.raises(SensorUnavailable, match=r"^no file-events.jsonl in this sample$"):
        list(FileAccessSensor().collect(ctx))


def test_live_without_protected_paths_is_unavailable(tmp_path):
    with pytest.raises(SensorUnavailable, match="no protected paths: give --watch PATH"):
        list(FileAccessSensor().collect(NodeTree(tmp_path).context()))


def test_fd_walk_finds_open_files_under_protected_paths(tmp_path):
    node = replay_node(tmp_path)
    node.process(
        4000,
        "python3",
        ["python3", "load.py"],
        uid=1666,
        fds={
            0: "/dev/null",
            3: "/lustre/models/llama/w.safetensors",
            4: "/lustre/models/llama/w.safetensors",
            5: "socket:[123]",
            6: "/lustre/models/llamas-not/x",
            7: "/lustre/models/llama/old (deleted)",
        },
    )
    ctx = node.context(watch=["/lustre/models/llama"])
    events = list(FileAccessSensor().collect(ctx))
    assert [
        (e["event.action"], e["process.pid"], e["file.path"], e.get("file.access_count"))
        for e in events
    ] == [
        ("open", 4000, "/lustre/models/llama/old", None),
        ("open", 4000, "/lustre/models/llama/w.safetensors", 2),
    ]
    assert events[0]["@timestamp"] == T0
    assert events[0]["user.name"] == "mallory"


def test_fd_walk_live_sees_a_child_holding_a_file(tmp_path):
    target = tmp_path / "ckpt.pt"
    target.write_bytes(b"x" * 10)
    child = subprocess.Popen(["sh", "-c", f"exec 3<'{target}'; exec sleep 30"])
    try:
        node = NodeTree(tmp_path / "unused")
        ctx = node.context(watch=[str(tmp_path)])
        ctx.proc.path, ctx.etc.path = Path("/proc"), Path("/etc")
        for _ in range(100):  # until the shell has opened it and exec'd sleep
            events = [
                e
                for e in FileAccessSensor().collect(ctx)
                if e.get("process.pid") == child.pid and e.get("process.name") == "sleep"
            ]
            if events:
                break
            time.sleep(0.05)
        assert [(e["event.action"], e["file.path"]) for e in events] == [("open", str(target))]
    finally:
        child.kill()
        child.wait()


# --- fanotify, for real -------------------------------------------------------------------

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="fanotify and setuid need root")


def unprivileged_user() -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(TEST_USER)
    except KeyError:
        # no check: a parallel worker may have created the user in the meantime
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", TEST_USER],
        )
        return pwd.getpwnam(TEST_USER)


@pytest.fixture
def shared_dir():
    """A directory the unprivileged user can write (pytest's tmp_path is root-only)."""
    path = Path(tempfile.mkdtemp(prefix="hpcsec-fan-"))
    path.chmod(0o1777)  # sticky, as /tmp: hpcsec refuses to write under an open, non-sticky one
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run_as(user: pwd.struct_passwd, argv: list[str], cwd: Path) -> int:
    def drop() -> None:
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)

    child = subprocess.Popen(argv, cwd=cwd, preexec_fn=drop, stdout=subprocess.DEVNULL)
    assert child.wait() == 0
    return child.pid


def collect_until(sensor, ctx, wanted: set[tuple[int, str]], limit_s: float = 10.0):
    """Drain the stream until every (pid, action) in `wanted` was seen (or the limit)."""
    events: list[dict] = []
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        events += list(sensor.collect(ctx))
        seen = {(e.get("process.pid"), e["event.action"]) for e in events}
        if wanted <= seen:
            break
        time.sleep(0.05)
    return events


@root_only
def test_short_lived_processes_of_an_unprivileged_user_are_attributed(shared_dir):
    user = unprivileged_user()
    weights = shared_dir / "model" / "weights.safetensors"
    weights.parent.mkdir()
    weights.parent.chmod(0o777)
    weights.write_bytes(b"w" * 4096)
    ctx = NodeTree(shared_dir / ".." / f"{shared_dir.name}-ctx").context(
        watch=[str(shared_dir / "model")], stream=True
    )
    ctx.proc.path, ctx.etc.path = Path("/proc"), Path("/etc")
    sensor = FileAccessSensor()
    try:
        assert [e["event.action"] for e in sensor.collect(ctx)] == []  # starts the stream
        weights.read_bytes()  # our own pid: ignored
        cat = run_as(user, ["cat", str(weights)], shared_dir)
        writer = run_as(user, ["sh", "-c", "echo stolen > copy.bin"], weights.parent)
        mover = run_as(user, ["mv", "copy.bin", "moved.bin"], weights.parent)
        # No permission event stops an unlink: the deleter is named by pid, and by user
        # while it is still alive when the event is read (this one lingers a moment).
        remover = run_as(
            user,
            ["find", ".", "-name", "moved.bin", "-delete", "-exec", "sleep", "1", ";"],
            weights.parent,
        )
        events = collect_until(
            sensor,
            ctx,
            {(cat, "read"), (writer, "close_write"), (mover, "rename"), (remover, "delete")},
        )
    finally:
        sensor.close()
        shutil.rmtree(shared_dir.parent / f"{shared_dir.name}-ctx", ignore_errors=True)
    by = {}
    for e in events:
        by.setdefault(e["process.pid"], []).append(e)
    assert os.getpid() not in by
    assert sorted(e["event.action"] for e in by[cat]) == ["open", "read"]
    for e in by[cat]:
        assert e["file.path"] == str(weights)
        assert e["file.size"] == 4096
        assert e["process.name"] == "cat"
        assert e["process.command_line"] == f"cat {weights}"
        assert e["user.name"] == TEST_USER
        assert e["user.id"] == user.pw_uid
    copy = str(weights.parent / "copy.bin")
    assert {(e["event.action"], e["file.path"]) for e in by[writer]} >= {
        ("create", copy),
        ("open", copy),
        ("write", copy),
        ("close_write", copy),
    }
    assert all(e["user.name"] == TEST_USER for e in by[writer])
    (rename,) = by[mover]  # `mv` may be gone before its event is read: pid only is certain
    assert (rename["event.action"], rename["file.path"], rename["file.target_path"]) == (
        "rename",
        copy,
        str(weights.parent / "moved.bin"),
    )
    (delete,) = by[remover]
    assert (delete["event.action"], delete["file.path"], delete["user.id"]) == (
        "delete",
        str(weights.parent / "moved.bin"),
        user.pw_uid,
    )


@root_only
def test_a_full_queue_is_reported_as_dropped(shared_dir):
    for name in ("a", "b", "c"):
        (shared_dir / name).write_text(name)
    ctx = NodeTree(shared_dir / "ctx").context(watch=[str(shared_dir)], stream=True)
    ctx.proc.path, ctx.etc.path = Path("/proc"), Path("/etc")
    sensor = FileAccessSensor(max_records=1)
    try:
        list(sensor.collect(ctx))
        cats = [
            subprocess.run(["cat", str(shared_dir / n)], capture_output=True).returncode
            for n in ("a", "b", "c")
        ]
        assert cats == [0, 0, 0]
        events = collect_until(sensor, ctx, {(None, "dropped")})
    finally:
        sensor.close()
    dropped = [e for e in events if e["event.action"] == "dropped"]
    assert dropped and dropped[0]["event.category"] == "sensor_status"
    assert sum(e["hpcsec.dropped"] for e in dropped) >= 2


@root_only
def test_refuses_to_watch_its_own_snapshot_directory(shared_dir):
    ctx = NodeTree(shared_dir / "ctx").context(watch=[str(shared_dir)], stream=True)
    ctx.recorder = SnapshotWriter(shared_dir / "snap", "h")
    writer_dir = str(shared_dir / "snap")
    with pytest.raises(SensorUnavailable, match=f"snapshot directory {writer_dir} is inside"):
        list(FileAccessSensor().collect(ctx))


@contextlib.contextmanager
def _watch_with_a_stalled_proc_read(shared_dir, monkeypatch):
    """A watch whose /proc read of the opener hangs: only the responder's deadline answers."""
    from hpcsec.sensors.file_access import fanwatch, openers

    (shared_dir / "w.bin").write_text("w")
    release = threading.Event()

    def stalled_proc_read(ctx, pid, users=None):
        release.wait(10)
        return {}

    monkeypatch.setattr(openers, "access_process_fields", stalled_proc_read)
    ctx = NodeTree(shared_dir / "ctx").context()
    watch = fanwatch.FanotifyWatch.start(ctx, [str(shared_dir)], lambda p: True, Folder(), 0.2)
    try:
        yield watch, release
    finally:
        release.set()
        watch.stop()


@root_only
def test_the_responder_answers_when_the_proc_read_stalls(shared_dir, monkeypatch):
    with _watch_with_a_stalled_proc_read(shared_dir, monkeypatch) as (watch, release):
        for _ in range(3):  # the first waits out the hold; the agent is late: no more holds
            child = subprocess.run(
                ["cat", str(shared_dir / "w.bin")], capture_output=True, timeout=5
            )
            assert (child.returncode, child.stdout) == (0, b"w")  # answered, not stuck
        release.set()  # the reader reads what the responder counted meanwhile
        deadline = time.monotonic() + 5
        while watch.answered_by_timeout < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        # the timeout, and the two let through unheld whose opener the reader found gone
        assert watch.answered_by_timeout == 3


@root_only
def test_without_fid_mode_the_stream_says_what_it_misses(shared_dir, monkeypatch):
    from hpcsec.sensors.file_access import fanotify, fanwatch

    real_init = fanotify.init

    def no_fid(flags, *rest):
        if flags & fanotify.FAN_REPORT_DFID_NAME:
            raise OSError(22, "Invalid argument")
        return real_init(flags, *rest)

    monkeypatch.setattr(fanwatch.fan, "init", no_fid)
    ctx = NodeTree(shared_dir / "ctx").context(watch=[str(shared_dir)], stream=True)
    sensor = FileAccessSensor()
    try:
        (status,) = sensor.collect(ctx)
    finally:
        sensor.close()
    assert status["event.action"] == "degraded"
    assert status["message"] == (
        "create/delete/rename not reported: this kernel has no fanotify FID mode (Invalid argument)"
    )


@root_only
def test_never_marks_proc_or_the_root_directory(tmp_path):
    from hpcsec.sensors.file_access import fanwatch

    ctx = NodeTree(tmp_path).context()
    watch = fanwatch.FanotifyWatch.start(
        ctx, ["/", "/proc/self", str(tmp_path / "absent")], lambda p: True, Folder()
    )
    watch.stop()
    assert watch.notes == [
        "protected path / not watched: it holds /proc",
        "protected path /proc/self not watched: it holds /proc",
        f"protected path {tmp_path / 'absent'} does not exist (not watched)",
    ]


@root_only
def test_an_event_the_reader_fails_on_is_answered_counted_and_the_stream_goes_on(
    shared_dir, monkeypatch
):
    from hpcsec.sensors.file_access import fanwatch

    for name in ("a", "b"):
        (shared_dir / name).write_text(name)
    real_asset_of = fanwatch.FanotifyWatch._asset_of
    calls = []

    def fails_once(self, access):
        calls.append(access)
        if len(calls) == 1:
            raise RuntimeError("boom")
        return real_asset_of(self, access)

    monkeypatch.setattr(fanwatch.FanotifyWatch, "_asset_of", fails_once)
    ctx = NodeTree(shared_dir / "ctx").context(watch=[str(shared_dir)], stream=True)
    ctx.proc.path, ctx.etc.path = Path("/proc"), Path("/etc")
    sensor = FileAccessSensor()
    try:
        list(sensor.collect(ctx))
        first = subprocess.run(["cat", str(shared_dir / "a")], capture_output=True, timeout=10)
        second = subprocess.run(["cat", str(shared_dir / "b")], capture_output=True, timeout=10)
        assert (first.stdout, second.stdout) == (b"a", b"b")  # both answered, none stuck
        events = collect_until(sensor, ctx, {(None, "error")})
    finally:
        sensor.close()
    errors = [e for e in events if e["event.action"] == "error"]
    assert [(e["hpcsec.errors"], e["message"]) for e in errors] == [
        (1, "1 fanotify reads or events not handled (last: RuntimeError: boom)")
    ]
    assert {e["file.path"] for e in events if e["event.category"] == "file_access"} >= {
        str(shared_dir / "b")
    }


def fanotify_marks(fdinfo: Path) -> list[str]:
    """The kinds of marks a group holds (ino, mnt_id, sdev), as the kernel lists them."""
    kinds = (
        line.split()[1].split(":")[0]
        for line in fdinfo.read_text().splitlines()
        if line.startswith("fanotify ") and len(line.split()) > 1
    )
    return sorted(k for k in kinds if k in ("ino", "mnt_id", "sdev"))


def responder_group(pid: int) -> Path:
    """The fdinfo of the responder's fanotify group."""
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        if os.readlink(fd) == "anon_inode:[fanotify]":
            return Path(f"/proc/{pid}/fdinfo/{fd.name}")
    raise AssertionError("the responder holds no fanotify group")


def drain_until(watch, wanted, limit_s: float = 10.0):
    records = []
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        records += watch.drain().records
        if wanted(records):
            break
        time.sleep(0.05)
    return records


@root_only
def test_a_protected_mount_is_seen_through_another_mount_of_its_filesystem(shared_dir):
    """A tmpfs mounted twice: a read through the other mount is the protected file's too."""
    from hpcsec.sensors.file_access import fanwatch

    mount, other = shared_dir / "models", shared_dir / "elsewhere"
    mount.mkdir()
    other.mkdir()
    if (
        subprocess.run(
            ["mount", "-t", "tmpfs", "hpcsec-test", str(mount)], capture_output=True
        ).returncode
        != 0
    ):
        pytest.skip("cannot mount here (no CAP_SYS_ADMIN in this mount namespace)")
    watch = None
    try:
        subprocess.run(["mount", "--bind", str(mount), str(other)], check=True)
        (mount / "w.bin").write_text("w")
        ctx = NodeTree(shared_dir / "ctx").context()
        protected = FileAccessSensorPaths(str(mount))
        watch = fanwatch.FanotifyWatch.start(ctx, [str(mount)], protected, Folder())
        # inode marks only: a mount mark would miss the other mount
        assert set(fanotify_marks(responder_group(watch.responder_pid))) == {"ino"}
        if watch.fid_fd >= 0:
            assert fanotify_marks(Path(f"/proc/self/fdinfo/{watch.fid_fd}")) == ["ino"]
        cat = subprocess.run(["cat", str(other / "w.bin")], capture_output=True, timeout=10)
        assert cat.stdout == b"w"
        records = drain_until(watch, lambda rs: any("read" in r.actions for r in rs))
        assert {(r.path, r.asset) for r in records} == {
            (str(other / "w.bin"), str(mount / "w.bin"))
        }
        assert {a for r in records for a in r.actions} == {"open", "read"}
    finally:
        if watch is not None:
            watch.stop()
        for path in (other, mount):
            subprocess.run(["umount", str(path)], capture_output=True)


def FileAccessSensorPaths(root: str):
    """The sensor's own path filter for --watch ROOT."""
    from hpcsec.sensors.file_access.sensor import path_filter

    ctx = NodeTree(Path(tempfile.mkdtemp(prefix="hpcsec-ctx-"))).context(watch=[root])
    return path_filter(ctx, [root])


@root_only
def test_cli_collect_watch_duration_streams_the_accesses(shared_dir, capsys):
    from hpcsec.detector.cli.main import main

    target = shared_dir / "ckpt.pt"
    target.write_bytes(b"c" * 64)
    done = threading.Event()
    readers: list[int] = []

    def read_until_done() -> None:  # the stream starts inside collect: read until it returns
        while not done.is_set():
            child = subprocess.Popen(["cat", str(target)], stdout=subprocess.DEVNULL)
            child.wait()
            readers.append(child.pid)
            time.sleep(0.05)

    thread = threading.Thread(target=read_until_done)
    thread.start()
    try:
        assert (
            main(
                [
                    "collect",
                    "--sensor",
                    "file_access",
                    "--watch",
                    str(shared_dir),
                    "--duration",
                    "1",
                    "--raw",
                ]
            )
            == 0
        )
    finally:
        done.set()
        thread.join()
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    opens = [e for e in events if e["event.action"] == "open"]
    assert opens, "no access seen in one second of cat every 50 ms"
    assert {(e["file.path"], e["process.name"], e["user.id"], e["file.size"]) for e in opens} == {
        (str(target), "cat", 0, 64)
    }
    assert {e["process.pid"] for e in opens} <= set(readers)
    assert events[-1]["event.category"] == "sensor_status"
    assert events[-1]["event.action"] == "ok"


def test_pending_is_true_until_started_then_follows_the_queue():
    from hpcsec.sensors.file_access.fanwatch import FanotifyWatch
    from hpcsec.sensors.file_access.records import Folder
    from hpcsec.sensors.file_access.sensor import FileAccessSensor

    sensor = FileAccessSensor()
    assert sensor.pending() is True  # the first streaming collect starts the stream
    watch = FanotifyWatch.__new__(FanotifyWatch)  # only the queue side is exercised
    watch.folder, watch._errors, watch.answered_by_timeout = Folder(), 0, 0
    watch.restarts = watch._unwatched = 0
    sensor._watch = watch
    assert sensor.pending() is False
    watch.folder.add("2026-11-30T00:00:00Z", 7, "/m/w.bin", "open")
    assert sensor.pending() is True
    watch.folder.drain()
    watch.folder.drop()
    assert sensor.pending() is True
    watch.folder.drain()
    watch._errors = 1
    assert sensor.pending() is True
    watch._errors, watch.restarts = 0, 1  # a restarted responder is reported promptly
    assert sensor.pending() is True
    watch.restarts, watch._unwatched = 0, 1  # so is a new directory left unwatched
    assert sensor.pending() is True


@root_only
def test_a_running_watch_keeps_thread_switches_quick_and_puts_them_back(shared_dir):
    """An open waits for the reader thread: while the watch runs, a thread of the agent that
    computes must let it have the GIL at once (bench file_access: 16 ms an open at the
    default interval while one computes, 1 ms so)."""
    import sys

    from hpcsec.detector.core.switching import QUICK_SWITCH_S
    from hpcsec.sensors.file_access import fanwatch

    before = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    try:
        ctx = NodeTree(shared_dir / "ctx").context(watch=[str(shared_dir)], stream=True)
        watch = fanwatch.FanotifyWatch.start(ctx, [str(shared_dir)], lambda p: True, Folder())
        try:
            assert sys.getswitchinterval() == pytest.approx(QUICK_SWITCH_S)
        finally:
            watch.stop()
        assert sys.getswitchinterval() == pytest.approx(0.005)
        watch.stop()  # stopped twice: nothing more to put back
        assert sys.getswitchinterval() == pytest.approx(0.005)
    finally:
        sys.setswitchinterval(before)

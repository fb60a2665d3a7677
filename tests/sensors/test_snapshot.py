"""Node snapshots: recording what sensors read, replaying it to the same events, meta checks."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
from snapshot_builder import NodeTree, sample_tree, write_meta

from hpcsec.detector.cli.main import main
from hpcsec.detector.core.errors import SourceError, UsageError
from hpcsec.detector.runtime import registry
from hpcsec.sensors.base import SensorSpec
from hpcsec.sensors.snapshot import (
    SnapshotWriter,
    open_snapshot,
    record_snapshot,
)
from tests.sensors.replay import replay

MODEL = "/lustre/models/llama-70b/model-00001.safetensors"


def build_node(base) -> NodeTree:
    node = NodeTree(base)
    node.passwd(("root", 0), ("alice", 1001), ("mallory", 1666))
    node.process(1, "systemd", ["/sbin/init"], cgroup="0::/init.scope\n")
    node.process(2, "kthreadd", [])
    node.process(
        4242,
        "python3",
        ["python3", "train.py"],
        uid=1001,
        ppid=1,
        environ={"SLURM_JOB_ID": "77", "CUDA_VISIBLE_DEVICES": "0,1,2,3"},
        cgroup="0::/system.slice/slurmstepd.scope/job_77/step_0/user/task_0\n",
        fds={3: MODEL, 4: "socket:[99]"},
    )
    node.process(5000, "rsync", ["rsync", MODEL, "/scratch/m/"], uid=1666, fds={3: MODEL})
    return node


def specs(*names: str) -> list[SensorSpec]:
    return registry.select(list(names))


def events_of(runs) -> list[dict]:
    return [e for run in runs for e in [*run.events, run.status]]


def test_replay_gives_the_events_the_recording_run_gave(tmp_path):
    ctx = build_node(tmp_path / "node").context(watch=["/lustre/models"])
    chosen = specs("process", "sockets", "file_access")
    recorded = record_snapshot(
        tmp_path / "snap", ctx, chosen, samples=2, interval=0, sleep=lambda s: None
    )
    replayed = replay(tmp_path / "snap", chosen, None)
    assert [r.status["event.action"] for r in recorded] == ["ok"] * 6
    assert events_of(replayed) == events_of(recorded)
    kinds = {(e["event.category"], e.get("process.pid")) for e in events_of(recorded)}
    assert {("process", 4242), ("process", 5000), ("file_access", 5000)} <= kinds
    meta = json.loads((tmp_path / "snap" / "meta.json").read_text())
    assert meta == {"hpcsec.snapshot": 1, "host.name": "node-test", "samples": 2}


def test_sample_layout_is_the_kernel_layout(tmp_path):
    ctx = build_node(tmp_path / "node").context(watch=["/lustre/models"])
    record_snapshot(tmp_path / "snap", ctx, specs("process", "file_access"))
    sample = tmp_path / "snap" / "0"
    assert (sample / "proc/4242/cmdline").read_bytes() == b"python3\0train.py\0"
    assert (sample / "proc/4242/status").read_text().startswith("Name:\tpython3\n")
    assert os.readlink(sample / "proc/5000/fd/3") == MODEL
    assert (sample / "etc/passwd").read_text().splitlines()[1].startswith("alice:x:1001:")
    lines = (sample / "file-events.jsonl").read_text().splitlines()
    moment = (sample / "time").read_text().strip()
    assert [json.loads(line) for line in lines] == [
        {"time": moment, "pid": pid, "path": MODEL, "actions": ["open"], "count": 1}
        for pid in (4242, 5000)
    ]
    assert (sample / "time").read_text().endswith("Z\n")


def test_replay_carries_sensor_state_between_samples(tmp_path):
    class Counter:
        name = "counter"

        def collect(self, ctx):
            ctx.state["seen"] = ctx.state.get("seen", 0) + 1
            yield {"n": ctx.state["seen"], "t": ctx.timestamp}

    for n, moment in enumerate(("2026-11-30T10:00:00.000Z", "2026-11-30T10:00:10.000Z")):
        sample_tree(tmp_path, n, moment)
    write_meta(tmp_path, "gpu-017", 2)
    runs = replay(tmp_path, [SensorSpec("counter", Counter, "")], None)
    assert [r.events for r in runs] == [
        [{"n": 1, "t": "2026-11-30T10:00:00.000Z"}],
        [{"n": 2, "t": "2026-11-30T10:00:10.000Z"}],
    ]


def test_context_points_into_the_sample(tmp_path):
    tree = sample_tree(tmp_path, 0, "2026-11-30T10:00:00.000Z")
    (tree.base / "nvml.json").write_text('{"devices": []}')
    (tree.base / "slurm-listpids.txt").write_text("PID JOBID\n")
    write_meta(tmp_path, "gpu-017", 1)
    snap = open_snapshot(tmp_path)
    assert snap.host_name == "gpu-017"
    ctx = snap.samples[0].context(None, {})
    assert ctx.replaying and ctx.host_name == "gpu-017"
    assert ctx.timestamp == "2026-11-30T10:00:00.000Z"
    assert ctx.replay_inputs == {
        "nvml.json": '{"devices": []}',
        "slurm-listpids.txt": "PID JOBID\n",
    }
    assert ctx.raw_input("rdma-res-qp.json", lambda: "live!") is None
    assert ctx.proc.path == tmp_path / "0" / "proc"


@pytest.mark.parametrize(
    ("meta", "message"),
    [
        (None, "meta.json: missing: not a node snapshot"),
        (
            '{"hpcsec.snapshot": 1,\n "host.name": }',
            "meta.json:2:15: invalid JSON: Expecting value",
        ),
        ("[1]", "meta.json:1: expected a JSON object"),
        (
            '{"hpcsec.snapshot": 2, "host.name": "h", "samples": 0}',
            'meta.json: "hpcsec.snapshot" must be 1, not 2',
        ),
        (
            '{"hpcsec.snapshot": 1, "host.name": "", "samples": 0}',
            "meta.json: \"host.name\" must be a non-empty string, not ''",
        ),
        (
            '{"hpcsec.snapshot": 1, "host.name": "h", "samples": "2"}',
            "meta.json: \"samples\" must be a count (0 or more), not '2'",
        ),
        (
            '{"hpcsec.snapshot": 1, "host.name": "h", "samples": 1}',
            'meta.json: sample directory 0/ is missing ("samples" is 1)',
        ),
    ],
)
def test_meta_errors_name_the_file_and_the_problem(tmp_path, meta, message):
    if meta is not None:
        (tmp_path / "meta.json").write_text(meta)
    with pytest.raises(SourceError) as info:
        open_snapshot(tmp_path)
    assert str(info.value) == f"{tmp_path}/{message}"


def test_bad_time_file_is_an_error_with_its_location(tmp_path):
    sample_tree(tmp_path, 0, "yesterday")
    write_meta(tmp_path, "h", 1)
    with pytest.raises(SourceError) as info:
        open_snapshot(tmp_path).samples[0].context(None, {})
    assert str(info.value) == f"{tmp_path}/0/time:1: not an RFC 3339 time: 'yesterday'"


def test_writer_refuses_a_non_empty_directory_and_escaping_paths(tmp_path):
    (tmp_path / "x").write_text("")
    with pytest.raises(UsageError, match="exists and is not empty"):
        SnapshotWriter(tmp_path, "h")
    writer = SnapshotWriter(tmp_path / "s", "h")
    writer.begin_sample()
    writer.record_file("proc", "../../../evil", b"x")
    writer.record_file("proc", "1/status", b"first")
    writer.record_file("proc", "1/status", b"second")  # first copy in a sample wins
    writer.record_input("../evil.json", "x")
    writer.finish()
    assert sorted(
        p.relative_to(tmp_path / "s").as_posix() for p in (tmp_path / "s").rglob("*") if p.is_file()
    ) == ["0/proc/1/status", "meta.json"]
    assert (tmp_path / "s/0/proc/1/status").read_bytes() == b"first"


def test_cli_collect_snapshot_then_from_snapshot(tmp_path, capsys):
    node = build_node(tmp_path / "node")
    roots = [
        "--procfs-root",
        str(node.proc),
        "--sysfs-root",
        str(node.sys),
        "--etc-root",
        str(node.etc),
        "--host-name",
        "gpu-017",
    ]
    # --raw: the live run would add a "Slurm unreachable" status that a replay cannot have
    sensors = [
        "--sensor",
        "process",
        "--sensor",
        "file_access",
        "--watch",
        "/lustre/models",
        "--raw",
    ]
    assert (
        main(
            [
                "collect",
                *roots,
                *sensors,
                "--snapshot",
                str(tmp_path / "snap"),
                "--samples",
                "2",
                "--interval",
                "0",
            ]
        )
        == 0
    )
    assert json.loads((tmp_path / "snap/meta.json").read_text())["samples"] == 2
    capsys.readouterr()
    assert main(["collect", *sensors, "--from-snapshot", str(tmp_path / "snap")]) == 0
    replayed = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert main(["collect", *roots, *sensors]) == 0
    direct = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]
    strip = [{k: v for k, v in e.items() if k not in ("@timestamp", "event.id")} for e in direct]
    assert [
        {k: v for k, v in e.items() if k not in ("@timestamp", "event.id")} for e in replayed
    ] == strip * 2  # two samples of an unchanged node
    assert {e["host.name"] for e in replayed} == {"gpu-017"}
    assert len([e for e in replayed if e["event.category"] == "process"]) == 6


def test_cli_snapshot_needs_a_sample(tmp_path, capsys):
    assert (
        main(
            ["collect", "--sensor", "process", "--snapshot", str(tmp_path / "s"), "--samples", "0"]
        )
        == 2
    )
    assert capsys.readouterr().err == "hpcsec: error: --samples must be at least 1, got 0\n"
    assert not (tmp_path / "s").exists()


def test_cli_reports_a_broken_snapshot(tmp_path, capsys):
    assert main(["collect", "--from-snapshot", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"hpcsec: error: {tmp_path}/meta.json: missing: not a node snapshot\n"
    )


def test_live_sockets_replay_through_sockets_json(tmp_path):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    try:
        ctx = NodeTree(tmp_path / "n").context()
        ctx.proc.path, ctx.etc.path = Path("/proc"), Path("/etc")
        recorded = record_snapshot(tmp_path / "snap", ctx, specs("sockets"))
    finally:
        server.close()
    replayed = replay(tmp_path / "snap", specs("sockets"), None)
    assert events_of(replayed) == events_of(recorded)
    stored = json.loads((tmp_path / "snap/0/sockets.json").read_text())
    assert {tuple(sorted(r)) for r in stored} == {
        (
            "destination.ip",
            "destination.port",
            "inode",
            "pid",
            "source.ip",
            "source.port",
            "state",
            "transport",
        )
    }
    assert [
        (r["transport"], r["pid"])
        for r in stored
        if r["state"] == "LISTEN" and r["source.port"] == port
    ] == [("tcp", os.getpid())]
    assert os.readlink(
        next((tmp_path / "snap/0/proc" / str(os.getpid()) / "fd").iterdir())
    ).startswith(("socket:[", "/", "pipe:", "anon_inode:"))


@pytest.mark.skipif(os.geteuid() != 0, reason="fanotify needs root (CAP_SYS_ADMIN)")
def test_stream_snapshot_keeps_the_short_lived_readers_proc_entry(tmp_path):
    watched = tmp_path / "models"
    watched.mkdir()
    (watched / "w.bin").write_bytes(b"w" * 100)
    ctx = NodeTree(tmp_path / "n").context(watch=[str(watched)], stream=True)
    ctx.proc.path, ctx.etc.path = Path("/proc"), Path("/etc")
    readers: list[int] = []

    def read_during_interval(_seconds: float) -> None:
        child = subprocess.Popen(["cat", str(watched / "w.bin")], stdout=subprocess.DEVNULL)
        assert child.wait() == 0
        readers.append(child.pid)

    recorded = record_snapshot(
        tmp_path / "snap",
        ctx,
        specs("file_access"),
        samples=2,
        interval=0,
        sleep=read_during_interval,
    )
    replayed = replay(tmp_path / "snap", specs("file_access"), None)
    assert events_of(replayed) == events_of(recorded)
    (pid,) = readers
    opens = [
        e
        for e in events_of(replayed)
        if e["event.action"] == "open" and e.get("process.pid") == pid
    ]
    assert [(e["process.name"], e["file.path"], e["user.name"]) for e in opens] == [
        ("cat", str(watched / "w.bin"), "root")
    ]
    assert (tmp_path / f"snap/1/proc/{pid}/cmdline").read_bytes() == (
        f"cat\0{watched / 'w.bin'}\0".encode()
    )


LOADER = """
import os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
os.read(fd, 10)
print("ready", flush=True)
for _ in sys.stdin:
    os.pread(fd, 10, 0)
    print("read", flush=True)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="fanotify needs root (CAP_SYS_ADMIN)")
def test_every_stream_sample_holds_the_proc_entries_of_the_pids_it_names(tmp_path):
    """A loader opens in interval 1 and only reads in interval 2: sample 2 still names it."""
    watched = tmp_path / "models"
    watched.mkdir()
    (watched / "w.bin").write_bytes(b"w" * 100)
    ctx = NodeTree(tmp_path / "n").context(watch=[str(watched)], stream=True)
    ctx.proc.path, ctx.etc.path = Path("/proc"), Path("/etc")
    sensor = registry.by_name()["file_access"].factory()
    loader: list[subprocess.Popen] = []

    def folded(pid: int, action: str) -> None:
        for _ in range(200):
            if any(
                r.pid == pid and action in r.actions
                for r in list(sensor._watch.folder.records.values())
            ):
                return
            time.sleep(0.02)
        raise AssertionError(f"no {action} by {pid} folded")

    def interval(_seconds: float) -> None:
        if not loader:  # interval 1: the loader starts, opens and reads
            loader.append(
                subprocess.Popen(
                    [sys.executable, "-c", LOADER, str(watched / "w.bin")],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
            assert loader[0].stdout.readline() == "ready\n"
        else:  # interval 2: it only reads
            loader[0].stdin.write("go\n")
            loader[0].stdin.flush()
            assert loader[0].stdout.readline() == "read\n"
        folded(loader[0].pid, "read")

    spec = SensorSpec("file_access", lambda: sensor, "")
    try:
        recorded = record_snapshot(
            tmp_path / "snap", ctx, [spec], samples=3, interval=0, sleep=interval
        )
    finally:
        for child in loader:
            child.stdin.close()
            child.wait()
    replayed = replay(tmp_path / "snap", specs("file_access"), None)
    assert events_of(replayed) == events_of(recorded)
    pid = loader[0].pid
    by_sample = [
        [
            (e["event.action"], e.get("process.command_line"), e.get("user.name"))
            for e in run.events
            if e.get("process.pid") == pid
        ]
        for run in replayed
    ]
    command = f"{sys.executable} -c {LOADER} {watched / 'w.bin'}"
    assert by_sample == [
        [],
        [("open", command, "root"), ("read", command, "root")],
        [("read", command, "root")],
    ]
    assert (tmp_path / f"snap/2/proc/{pid}/cmdline").is_file()


def test_snapshot_is_private_to_its_owner_and_keeps_the_user_database(tmp_path):
    node = build_node(tmp_path / "node")
    (node.etc / "hosts").write_text("10.0.0.18 gpu-018\n")
    record_snapshot(tmp_path / "snap", node.context(), specs("process"))
    assert (tmp_path / "snap").stat().st_mode & 0o777 == 0o700
    environ = tmp_path / "snap/0/proc/4242/environ"
    assert environ.read_bytes() == b"SLURM_JOB_ID=77\0CUDA_VISIBLE_DEVICES=0,1,2,3\0"
    assert environ.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "snap/0/etc/group").read_text() == (node.etc / "group").read_text()
    # the enrichment tells job peers from others by the node's hosts file
    assert (tmp_path / "snap/0/etc/hosts").read_text() == "10.0.0.18 gpu-018\n"


REPO = Path(__file__).resolve().parents[2]
# Runs the CLI with an audit hook that lists every touch of the live system: opening or
# listing /proc, /sys, /etc or /dev, starting a command, loading a C library (NVML), opening
# a socket (sock_diag, rdma netlink, Slurm).
ISOLATED = """
import json, sys
touched = []
LIVE = ("/proc", "/sys", "/etc", "/dev")

def hook(event, args):
    if event in ("open", "os.listdir", "os.scandir"):
        path = args[0].decode(errors="replace") if isinstance(args[0], bytes) else args[0]
        if isinstance(path, str) and (path + "/").startswith(tuple(r + "/" for r in LIVE)):
            touched.append(f"{event} {path}")
    elif event == "ctypes.dlopen" and args[0] is None:
        pass  # `import ctypes` opens the running program itself (ctypes.pythonapi)
    elif event in ("subprocess.Popen", "os.posix_spawn", "os.exec", "os.system", "os.fork",
                   "ctypes.dlopen", "socket.__new__", "socket.gethostname"):
        touched.append(f"{event} {args[:2]!r}")

sys.addaudithook(hook)
from hpcsec.detector.cli.main import main
codes = [main(argv) for argv in json.loads(sys.argv[2])]
with open(sys.argv[1], "w") as out:
    json.dump({"codes": codes, "touched": touched}, out)
"""
NOWHERE = [
    "--sysfs-root",
    "/nonexistent/sys",
    "--procfs-root",
    "/nonexistent/proc",
    "--etc-root",
    "/nonexistent/etc",
]


def replay_touches(tmp_path, commands: list[list[str]]) -> dict:
    result = tmp_path / "isolation.json"
    subprocess.run(
        [sys.executable, "-c", ISOLATED, str(result), json.dumps(commands)],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        timeout=120,
    )
    return json.loads(result.read_text())


@pytest.mark.parametrize("fixture", ["fixtures/scenarios/benign-training", "fixtures/demo"])
def test_replay_never_touches_the_live_system(tmp_path, fixture):
    snap = REPO / fixture
    if not (snap / "meta.json").is_file():
        pytest.skip(f"{fixture} is not in this tree")
    config = (
        ["--config", str(snap / "site-config.yml")] if (snap / "site-config.yml").is_file() else []
    )
    out = replay_touches(
        tmp_path,
        [
            ["collect", "--from-snapshot", str(snap), *config, *NOWHERE],
            ["scan", "--snapshot", str(snap), *config, "--format", "jsonl"],
        ],
    )
    assert out["touched"] == []
    assert out["codes"][0] == 0 and out["codes"][1] in (0, 1)


def test_replay_of_a_recorded_snapshot_never_touches_the_live_system(tmp_path):
    node = build_node(tmp_path / "node")
    roots = [
        "--procfs-root",
        str(node.proc),
        "--sysfs-root",
        str(node.sys),
        "--etc-root",
        str(node.etc),
        "--host-name",
        "gpu-017",
    ]
    assert (
        main(
            [
                "collect",
                *roots,
                "--watch",
                "/lustre/models",
                "--raw",
                "--snapshot",
                str(tmp_path / "snap"),
            ]
        )
        == 0
    )
    out = replay_touches(
        tmp_path,
        [
            ["collect", "--from-snapshot", str(tmp_path / "snap"), *NOWHERE],
            ["scan", "--snapshot", str(tmp_path / "snap"), "--format", "jsonl"],
        ],
    )
    assert out["touched"] == []
    assert out["codes"][0] == 0 and out["codes"][1] in (0, 1)


def test_the_isolation_check_sees_a_live_read(tmp_path):
    """The audit hook above is what the replay tests rely on: it does see /proc reads."""
    out = replay_touches(tmp_path, [["collect", "--sensor", "process", "--raw"]])
    assert "os.listdir /proc" in out["touched"]


def test_cli_snapshot_options_exclude_each_other(tmp_path, capsys):
    assert (
        main(["collect", "--snapshot", str(tmp_path / "a"), "--from-snapshot", str(tmp_path / "b")])
        == 2
    )
    assert capsys.readouterr().err == (
        "hpcsec: error: --snapshot and --from-snapshot exclude each other\n"
    )


def test_a_snapshot_directory_that_cannot_be_made_is_a_usage_error(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(UsageError, match=f"cannot create directory {tmp_path}/file/s"):
        SnapshotWriter(tmp_path / "file" / "s", "h")


def test_scan_skips_a_sample_with_a_bad_time_and_says_so(tmp_path, capsys):
    import shutil

    snap = tmp_path / "demo"
    shutil.copytree(REPO / "fixtures" / "demo", snap)
    (snap / "2" / "time").write_text("not-a-time\n")
    rc = main(
        [
            "scan",
            "--snapshot",
            str(snap),
            "--config",
            str(REPO / "fixtures" / "demo" / "site-config.yml"),
            "--format",
            "json",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 1  # the other samples are still scanned and alert
    assert f"skipped a snapshot sample: {snap}/2/time:1: not an RFC 3339 time" in err
    assert "in 3 samples" in err
    assert main(["collect", "--from-snapshot", str(snap), "--sensor", "process"]) == 0
    assert "skipped a snapshot sample" in capsys.readouterr().err

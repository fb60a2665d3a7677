"""The issue's end-to-end case, live: alice runs every trick at once (an executable named
`\\xffsl`, a markup argv[0], a 70 KB variable before LD_PRELOAD, a 66 KB argument before the
pool URL, a read of a model file whose name is not UTF-8) while bob copies the model weights
with `cp` and runs a miner. Root's real `hpcsec scan --config … --store …` still shows every
alert of both users, literally, exits 1, and writes a private store."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from tests.slurm_harness import ensure_users

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="runs processes as alice and bob")

POOL = "stratum+tcp://pool.example:3333"
MARKUP_ARGV0 = "python3 train.py [/x] [black on black]hid[/] [link=file:///etc/shadow]x"
MINER_RULE = "743946f7-19b5-40ca-97f8-197cf6f01537"
NOT_ALLOWED_RULE = "4c174e27-ed1a-4006-900a-52f92b9e8ebf"
COPY_TOOL_RULE = "2bfe7e5b-9535-4165-b5f8-2deff1e79153"
# alice's miner calls itself by a name with markup and an OSC title sequence
MINER_ARGV0 = "python3 train.py [/x][black on black]hid[/]\x1b]0;t\x07"
MINER_ARGV0_SHOWN = "python3 train.py [/x][black on black]hid[/]\\x1b]0;t\\x07"
RAW = ("\x1b", "\x07", "\x00", "\x9b", "\r", "\u202e", "\u200b")
HOLD = ["-c", "import time; time.sleep(120)"]


def start_as(user: str, argv: list, env: dict | None = None, executable: str | None = None):
    entry = pwd.getpwnam(user)

    def drop() -> None:
        os.setgid(entry.pw_gid)
        os.setuid(entry.pw_uid)

    return subprocess.Popen(
        argv,
        executable=executable,
        env=env if env is not None else {"PATH": "/usr/bin:/bin"},
        preexec_fn=drop,
        cwd="/",
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def wait_until(what: str, predicate) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except OSError:
            pass
        time.sleep(0.02)
    raise AssertionError(f"never saw {what}")


def holds_open(pid: int, path: bytes) -> bool:
    fds = Path(f"/proc/{pid}/fd")
    return any(os.readlink(os.fsencode(fd)) == path for fd in fds.iterdir())


def has_exec(pid: int, marker: bytes) -> bool:
    return marker in Path(f"/proc/{pid}/cmdline").read_bytes()


@pytest.fixture
def node() -> Iterator[dict]:
    """The shared directory, the model, and alice's and bob's processes, all running."""
    ensure_users()
    root = Path(tempfile.mkdtemp(prefix="hpcsec-e2e-"))
    root.chmod(0o777)
    models = root / "models" / "llama"
    models.mkdir(parents=True)
    for d in (root / "models", models):
        d.chmod(0o755)
    weights = models / "w.safetensors"
    weights.write_bytes(b"w" * 65536)
    hostile_file = os.path.join(os.fsencode(models), b"\xff.bin")
    Path(os.fsdecode(hostile_file)).write_bytes(b"x" * 10)
    for f in (weights, Path(os.fsdecode(hostile_file))):
        f.chmod(0o644)
    hostile_exe = os.path.join(os.fsencode(root), b"\xffsl")
    shutil.copy("/bin/sleep", hostile_exe)
    os.chmod(hostile_exe, 0o755)
    fifo = root / "out.fifo"
    os.mkfifo(fifo)
    fifo.chmod(0o666)  # bob's cp waits on it, holding the weights open
    big_env = {"BIG": "e" * 70_000, "LD_PRELOAD": "evil.so", "PATH": "/usr/bin:/bin"}
    children = {
        "alice_exe": start_as("alice", [hostile_exe, "120"]),
        "alice_markup": start_as("alice", [MARKUP_ARGV0, "120"], executable="/bin/sleep"),
        "alice_preload": start_as("alice", ["/bin/sleep", "121"], env=big_env),
        "alice_miner": start_as(
            "alice",
            [MINER_ARGV0, *HOLD, "a" * 66_000, "--url", POOL],
            executable="/usr/bin/python3",
        ),
        "alice_reads": start_as("alice", ["/usr/bin/tail", "-f", hostile_file]),
        "bob_copy": start_as("bob", ["/bin/cp", str(weights), str(fifo)]),
        "bob_miner": start_as("bob", ["/usr/bin/python3", *HOLD, "--url", POOL]),
    }
    try:
        pid = {name: child.pid for name, child in children.items()}
        wait_until("alice's executable", lambda: has_exec(pid["alice_exe"], b"\xffsl"))
        wait_until("alice's argv[0]", lambda: has_exec(pid["alice_markup"], b"[/x]"))
        wait_until("alice's environ", lambda: has_exec(pid["alice_preload"], b"121"))
        wait_until("alice's miner", lambda: has_exec(pid["alice_miner"], POOL.encode()))
        wait_until("bob's miner", lambda: has_exec(pid["bob_miner"], POOL.encode()))
        wait_until("alice's read", lambda: holds_open(pid["alice_reads"], hostile_file))
        wait_until("bob's copy", lambda: holds_open(pid["bob_copy"], bytes(weights)))
        yield {"root": root, "models": models, "pid": pid}
    finally:
        for child in children.values():
            child.kill()
            child.wait()
        shutil.rmtree(root, ignore_errors=True)


def site_config(root: Path, models: Path) -> Path:
    config = root / "site.yml"
    config.write_text(
        "assets:\n"
        "  - name: llama\n"
        "    kind: model\n"
        f"    paths: ['{models}/**']\n"
        "    readers: {users: [alice]}\n"
        "lists:\n"
        "  copy_tools: [scp, rsync, cp]\n"
    )
    return config


def test_scan_shows_every_alert_of_both_users_literally(node, tmp_path):
    config = site_config(node["root"], node["models"])
    store = tmp_path / "alerts.duckdb"
    hpcsec = [sys.executable, "-m", "hpcsec.detector"]
    run = subprocess.run(
        [*hpcsec, "scan", "--config", str(config), "--store", str(store)],
        capture_output=True,
        timeout=300,
        env={**os.environ, "COLUMNS": "400", "TERM": "xterm"},
    )
    out = run.stdout.decode("utf-8")  # strict: a stray invalid byte fails the test
    err = run.stderr.decode("utf-8")
    assert run.returncode == 1, err[-3000:]
    for raw in RAW:
        assert raw not in out + err, f"raw {raw!r} in scan's output"
    assert "Traceback" not in err

    # Every alert of each user is in the store, the one the analyst queries next
    assert stat.S_IMODE(store.stat().st_mode) == 0o600
    with duckdb.connect(str(store), read_only=True) as con:
        rows = con.execute("SELECT rule_id, user_name, doc FROM alerts").fetchall()
        events = con.execute("SELECT doc FROM events").fetchall()
    pid = node["pid"]
    by_rule_pid = {(r, json.loads(doc).get("process.pid")): user for r, user, doc in rows}
    assert by_rule_pid.get((MINER_RULE, pid["bob_miner"])) == "bob"
    assert by_rule_pid.get((MINER_RULE, pid["alice_miner"])) == "alice"
    assert by_rule_pid.get((COPY_TOOL_RULE, pid["bob_copy"])) == "bob"
    assert by_rule_pid.get((NOT_ALLOWED_RULE, pid["bob_copy"])) == "bob"
    assert not any(r == NOT_ALLOWED_RULE and user == "alice" for r, user, _ in rows)

    # alice's processes are events, each named literally: the odd item costs nothing
    docs = {json.loads(d).get("process.pid"): json.loads(d) for (d,) in events}
    assert docs[pid["alice_exe"]]["process.name"] == "\\xffsl"
    assert docs[pid["alice_markup"]]["process.command_line"] == f"{MARKUP_ARGV0} 120"
    assert docs[pid["alice_preload"]]["process.env.LD_PRELOAD"] == "evil.so"
    assert docs[pid["alice_preload"]]["process.ld_preload_allowed"] is False
    reads = [
        json.loads(d) for (d,) in events if json.loads(d).get("event.category") == "file_access"
    ]
    assert any(
        e["process.pid"] == pid["alice_reads"] and e["file.path"].endswith("/llama/\\xff.bin")
        for e in reads
    )

    # the table shows both users' alerts, markup as text
    for user in ("alice", "bob"):
        assert f" {user} " in out
    assert "stratum+tcp://" in out
    assert f"`{MINER_ARGV0_SHOWN} -c" in out  # the markup as text, the OSC escaped

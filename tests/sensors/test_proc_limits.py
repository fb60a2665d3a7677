"""No blind spot from read limits: what a user pads their argv or environment with cannot
hide LD_PRELOAD or a mining pool URL, and memory stays bounded."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from hpcsec.detector.enrich.policy import preload_allowed
from hpcsec.sensors import cmdline_condense, proclists
from hpcsec.sensors.base import FsRoot, SensorContext
from hpcsec.sensors.process import ProcessSensor
from hpcsec.sensors.procinfo import ENVIRON_KEYS, EVERY_LOADER, environ_value, read_environ
from tests.hostile_fs import as_root

PAD = 70 * 1024


def condense(args: list[bytes]) -> list[bytes]:
    return cmdline_condense.cmdline_args(io.BytesIO(b"".join(a + b"\0" for a in args)))


def test_a_command_line_that_fits_is_kept_whole():
    args = [b"python3", b"train.py", b"x" * 60_000]
    assert condense(args) == args
    assert not cmdline_condense.is_condensed(args)


def test_a_flag_and_url_in_the_middle_of_a_huge_command_line_are_kept():
    padding = [b"p" * 1000] * 100
    args = [b"./worker", *padding, b"--url", b"stratum+tcp://pool:3333", *padding, b"end"]
    kept = condense(args)
    joined = b" ".join(kept)
    assert b" --url stratum+tcp://pool:3333 " in joined
    assert kept[0] == b"./worker" and kept[-1] == b"end"
    assert len(b"\0".join(kept)) < cmdline_condense.CMDLINE_MAX
    assert cmdline_condense.GAP.match(kept[kept.index(b"--url") - 1])  # says what was left out
    assert cmdline_condense.is_condensed(kept)


def test_one_huge_argument_is_cut_with_a_marker():
    kept = condense([b"sh", b"a" * 66_000, b"--url", b"stratum+tcp://p:1"])
    assert kept[1] == b"a" * cmdline_condense.ARG_KEEP + "\u2026[hpcsec: cut 61904 bytes]".encode()
    assert kept[2:] == [b"--url", b"stratum+tcp://p:1"]


def test_condensing_is_stable_so_a_snapshot_replays_the_same_event():
    args = [b"./x", *([b"q" * 3000] * 50), b"-o", b"stratum+ssl://h:1", *([b"r" * 9] * 9000)]
    once = condense(args)
    assert condense(once) == once


def test_memory_stays_bounded_with_a_million_arguments():
    kept = condense([b"a"] * 1_000_000)
    assert len(b"\0".join(kept)) < cmdline_condense.CMDLINE_MAX


def test_environ_keeps_the_asked_entries_wherever_they_are():
    env = b"BIG=" + b"x" * PAD + b"\0HOME=/root\0LD_PRELOAD=/tmp/evil.so\0LD_PRELOAD=second\0"
    assert proclists.environ_entries(io.BytesIO(env), ["LD_PRELOAD", "SLURM_JOB_ID"]) == (
        b"LD_PRELOAD=/tmp/evil.so\0"
    )


@pytest.mark.parametrize("user_first", [False, True])
def test_the_first_and_the_last_ld_preload_are_both_read(tmp_path, user_first):
    """glibc's ld.so loads the last LD_PRELOAD of an environment, musl's the first (getenv):
    an allowed library on one side must not hide the user's on the other."""
    allowed = b"LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
    evil = b"LD_PRELOAD=/home/u/evil.so"
    first, last = (evil, allowed) if user_first else (allowed, evil)
    env = first + b"\0SLURM_JOB_ID=5\0LD_PRELOAD=/middle.so\0" + last + b"\0SLURM_JOB_ID=6\0"
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "environ").write_bytes(env)
    kept = read_environ(FsRoot("proc", tmp_path), 42)
    assert kept == first + b"\0SLURM_JOB_ID=5\0" + last + b"\0"  # what a snapshot records
    value = environ_value(kept, "LD_PRELOAD")
    assert value == f"{first[11:].decode()}:{last[11:].decode()}"
    assert not preload_allowed(value or "", ["libjemalloc"])
    assert environ_value(kept, "SLURM_JOB_ID") == "5"  # getenv's, the first
    again = proclists.environ_entries(io.BytesIO(kept), ENVIRON_KEYS, EVERY_LOADER)
    assert again == kept  # a snapshot's record reads back the same


def test_one_allowed_ld_preload_given_twice_is_allowed(tmp_path):
    lib = b"LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2\0"
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "environ").write_bytes(lib + b"HOME=/\0" + lib)
    value = environ_value(read_environ(FsRoot("proc", tmp_path), 7), "LD_PRELOAD")
    assert value == "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
    assert preload_allowed(value, ["libjemalloc"])


def test_an_ld_preload_past_the_kept_length_is_cut_with_a_marker():
    """Padding before the library (`allowed.so` + 20,000 `:` + `evil.so`) hid it: the cut
    is marked, and a marked value is never an allowed preload."""
    value = b"/usr/lib/x86_64-linux-gnu/libjemalloc.so.2" + b":" * 20_000 + b":/home/u/evil.so"
    kept = proclists.environ_entries(io.BytesIO(b"LD_PRELOAD=" + value + b"\0"), ["LD_PRELOAD"])
    assert proclists.CUT.search(kept.rstrip(b"\0"))
    assert len(kept) < proclists.ENTRY_MAX + proclists.MARKER_ROOM
    again = proclists.environ_entries(io.BytesIO(kept), ["LD_PRELOAD"])
    assert again == kept  # a snapshot's record reads back the same
    shown = environ_value(kept, "LD_PRELOAD")
    assert shown is not None and proclists.holds_cut(shown)
    assert not preload_allowed(shown, ["libjemalloc"])
    # a cut value is refused, even when what stands before the marker is allowed
    assert not preload_allowed(shown.split(":")[0] + "\u2026[hpcsec: cut 9 bytes]", ["*"])
    assert preload_allowed(shown.split(":")[0], ["libjemalloc"])  # the library alone is


# -- live, as an unprivileged user -----------------------------------------------------------


def live_context() -> SensorContext:
    return SensorContext(
        "live", FsRoot("sys", "/sys"), FsRoot("proc", "/proc"), FsRoot("etc", "/etc")
    )


def wait_for_process(tag: str, name: str) -> dict:
    """Alice's process `name` with `tag` in its command line; by name, because runuser's
    child and `env` hold the same command line (and not yet the environment) for a moment
    before they exec the program."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for event in ProcessSensor().collect(live_context()):
            if (
                tag in event.get("process.command_line", "")
                and event.get("user.name") == "alice"
                and event.get("process.name") == name
            ):
                return event
        time.sleep(0.05)
    raise AssertionError(f"no process {name} of alice with {tag}")


@pytest.fixture
def alice_runs() -> Iterator:
    started: list[subprocess.Popen] = []

    def run(*argv: str) -> None:
        started.append(subprocess.Popen(["runuser", "-u", "alice", "--", *argv]))

    yield run
    for proc in started:
        subprocess.run(["pkill", "-KILL", "-P", str(proc.pid)], check=False)
        proc.kill()
        proc.wait()


@as_root
def test_ld_preload_behind_a_70_kb_variable_is_found(alice_runs):
    tag = "31415"
    alice_runs("env", "-i", f"BIG={'x' * PAD}", "LD_PRELOAD=/tmp/evil.so", "sleep", tag)
    event = wait_for_process(tag, "sleep")
    assert event["process.env.LD_PRELOAD"] == "/tmp/evil.so"


@as_root
def test_a_miner_url_behind_a_66_kb_argument_still_raises_the_alert(alice_runs):
    tag = "hpcsec-tag-27182"
    sleeper = "import time; time.sleep(120)"
    alice_runs(
        "/usr/bin/python3", "-c", sleeper, tag, "a" * 66_000, "--url", "stratum+tcp://p:3333"
    )
    event = wait_for_process(tag, "python3")
    assert "--url stratum+tcp://p:3333" in event["process.command_line"]
    assert event["process.command_line_truncated"] is True
    miner = [a["rule.title"] for a in live_scan_alerts(event["process.pid"])]
    assert "Cryptocurrency miner process" in miner


def live_scan_alerts(pid: int) -> list[dict]:
    """The alerts `hpcsec scan --sensor process` raises on this node about process `pid`."""
    scan = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpcsec.detector.cli.main",
            "scan",
            "--sensor",
            "process",
            "--format",
            "json",
            "--no-dedup",  # one alert per process, whatever else on the node looks like a miner
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert scan.returncode == 1, scan.stderr
    return [a for a in json.loads(scan.stdout) if a.get("process.pid") == pid]


@pytest.mark.parametrize(
    "flags",
    [
        [b"-v"] * 4200,  # the same flag, 12.6 KB of it
        [f"-a{n:05d}".encode() for n in range(3000)],  # as many distinct ones
    ],
)
def test_flags_padding_the_middle_do_not_hide_the_url_after_them(flags):
    """The middle kept flags in order until 12 KiB were full: 4,200 `-v` before the pool
    URL left it out (and `--donate-level`). Each indicator is kept once, and a URL takes
    the room of the oldest flags."""
    head, tail = [b"A" * 100] * 330, [b"B" * 100] * 200
    args = [b"./flagpad", *head, *flags, b"-o", b"stratum+tcp://pool.example:3333", *tail]
    kept = condense(args)
    assert b"stratum+tcp://pool.example:3333" in kept
    assert kept.count(flags[0]) <= 1  # an indicator is kept once
    assert len(b"\0".join(kept)) < cmdline_condense.CMDLINE_MAX
    (gap,) = [arg for arg in kept if cmdline_condense.GAP.match(arg)]
    assert b"with a URL" not in gap
    assert condense(kept) == kept  # a snapshot replays the same event


def test_urls_past_the_middle_are_counted_in_the_marker():
    """Only a flood of URLs can push a URL out of the middle, and the marker then says how
    many (a rule or an analyst can tell such a command line from a long build's)."""
    urls = [f"s3://bucket/shard-{n:06d}".encode() for n in range(2000)]
    kept = condense([b"./loader", *([b"A" * 100] * 330), *urls, *([b"B" * 100] * 200)])
    (gap,) = [arg for arg in kept if cmdline_condense.GAP.match(arg)]
    left_out = 2000 - sum(arg.startswith(b"s3://") for arg in kept)
    assert left_out > 0 and gap.endswith(f", {left_out} with a URL]".encode())
    assert condense(kept) == kept

"""Attacker text in every human-facing report: shown literally, never obeyed.

The people whose jobs hpcsec watches choose their command lines, file names and (through
Slurm and /etc) names. Markup (`[black on black]`, `[link=…]`, `[/x]`), ANSI and OSC escape
sequences, CR/LF and bidi or invisible characters must reach the analyst as visible text.
"""

import io
import json
import logging
import os
import re
import subprocess
import sys
import time

import pytest

from hpcsec.detector.cli import collect as collect_command
from hpcsec.detector.cli import config as config_command
from hpcsec.detector.cli import main as cli
from hpcsec.detector.cli import render
from hpcsec.detector.core.errors import ConfigError
from hpcsec.detector.core.schema import status_event
from hpcsec.detector.runtime.sources import ScanReport
from hpcsec.sensors.base import SensorRun

# Raw characters that must never reach a terminal from node data.
RAW = ("\x1b", "\x07", "\x00", "\x9b", "\r", "\u202e", "\u2066", "\u200b", "\ufeff", "\u2028")
NAME = "[/x][black on black]hid[/][link=file:///etc/shadow]mallory\u202egnp.exe\x1b]0;t\x07"
COMMAND = "python3 train.py [/x] \x1b[2J\r\nhpcsec: forged\u200b\x9b31m"


def assert_inert(text: str) -> None:
    found = [repr(c) for c in RAW if c in text]
    assert not found, f"raw {found} in output"


def test_scan_table_is_literal_with_bidi_and_invisible_characters():
    alert = {
        "@timestamp": "2026-11-30T01:00:00Z",
        "rule.level": "critical",
        "rule.title": "Miner",
        "rule.vector": "gpu_hijack",
        "host.name": "gpu\ufeff-1",
        "user.name": NAME,
        "alert.summary": f"Miner: {COMMAND}",
    }
    out = io.StringIO()
    render.write_table([alert], out=out, title="[bold]1 alert\x1b[2J", width=400)
    text = out.getvalue()
    assert_inert(text)
    assert "[/x][black on black]hid[/][link=file:///etc/shadow]mallory\\u202egnp.exe" in text
    assert "python3 train.py [/x] \\x1b[2J\\x0d\\x0ahpcsec:" in text  # rich folds at the space
    assert "forged\\u200b\\x9b31m" in text
    assert "gpu\\ufeff-1" in text
    assert "[bold]1 alert\\x1b[2J" in text


def test_json_to_a_terminal_carries_escapes_not_controls():
    alert = {"user.name": NAME, "process.command_line": COMMAND}
    out = io.StringIO()
    render.write_json([alert], out=out)
    assert_inert(out.getvalue())
    assert json.loads(out.getvalue()) == [alert]
    out = io.StringIO()
    render.write_jsonl([alert], out=out)
    assert_inert(out.getvalue())
    assert json.loads(out.getvalue()) == alert


def _event(**fields):
    return {
        "@timestamp": "2026-11-30T01:00:00.000000Z",
        "event.category": "process",
        "event.action": "sample",
        "hpcsec.sensor": "process",
        "host.name": "n1",
        **fields,
    }


def test_collect_table_does_not_run_markup(capsys, monkeypatch):
    # rich would raise MarkupError on `[/x]` and obey `[link=…]` if the cell were markup
    collect_command.write_events(
        [_event(**{"user.name": NAME, "process.command_line": COMMAND})], "table"
    )
    text = capsys.readouterr().out
    assert_inert(text)
    assert "[/x][black" in text
    assert "\\x1b[2J" in text


def test_collect_jsonl_carries_escapes_not_controls(capsys):
    event = _event(**{"user.name": NAME, "process.command_line": COMMAND})
    collect_command.write_events([event], "jsonl")
    out = capsys.readouterr().out
    assert_inert(out)
    assert json.loads(out) == event


def test_sensor_status_lines_quote_node_data_escaped(capsys):
    status = status_event("process", "malformed\x1b[2J", f"/proc/1/cmdline: {COMMAND}", "h", "t")
    collect_command.print_status(SensorRun("process", [], status))
    report = ScanReport(sensor_runs=[SensorRun("process", [], status)])
    report.skipped_samples.append(f"sample 2: {COMMAND}")
    out = io.StringIO()
    report.print(out)
    for text in (capsys.readouterr().err, out.getvalue()):
        assert_inert(text)
        assert "\\x1b[2J\\x0d\\x0ahpcsec: forged" in text
    lines = out.getvalue().splitlines()
    assert not any(line.startswith("hpcsec: forged") for line in lines)


@pytest.fixture
def terminal_env(monkeypatch, tmp_path):
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    monkeypatch.delenv("INVOCATION_ID", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def test_error_lines_and_log_records_are_escaped(monkeypatch, terminal_env, capsys):
    def load_config(path):
        logging.getLogger("hpcsec.detector.config").warning("user %s: odd", NAME)
        raise ConfigError(f"asset path {COMMAND!s} is odd")

    monkeypatch.setattr(config_command, "load_config", load_config)
    assert cli.main(["config", "check", "site.yml"]) == 2
    err = capsys.readouterr().err
    assert_inert(err)
    assert len(err.splitlines()) == 2  # a CR/LF in a value never starts a line of its own
    assert "mallory\\u202egnp.exe\\x1b]0;t\\x07: odd" in err
    assert "hpcsec: error: asset path python3 train.py [/x] \\x1b[2J\\x0d\\x0a" in err


def test_rules_list_shows_a_hostile_title_escaped(tmp_path, capsys):
    from tests.rule_texts import MINER_RULE

    rules = tmp_path / "gpu_hijack.yml"
    rules.write_text(
        re.sub(r"title: (.*)", r'title: "\\u202eRLO \\e[2J \1"', MINER_RULE, count=1),
        encoding="utf-8",
    )
    assert cli.main(["rules", "list", str(rules)]) == 0
    out = capsys.readouterr().out
    assert_inert(out)
    assert "\\u202eRLO \\x1b[2J" in out


HPCSEC = [sys.executable, "-m", "hpcsec.detector.cli.main"]
LIVE_NAME = (
    "xmrig [/x] \x1b[2J\x1b]0;pwn\x07 [black on black]hid[/] [link=http://e.x]l[/link] "
    "\u202eab stratum+tcp://pool:3333"
)


@pytest.fixture
def hostile_process():
    """A process of the unprivileged user alice whose command line is attacker text."""
    if os.geteuid() != 0:
        pytest.skip("needs root (runs a process as another user)")
    from tests.slurm_harness import ensure_users

    ensure_users()
    proc = subprocess.Popen(
        ["runuser", "-u", "alice", "--", "bash", "-c", 'exec -a "$0" sleep 60', LIVE_NAME]
    )
    try:
        for _ in range(100):  # until bash has exec'd sleep under the new name
            pids = subprocess.run(["pgrep", "-u", "alice", "-f", "stratum"], capture_output=True)
            if pids.stdout:
                break
            time.sleep(0.05)
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_live_scan_shows_a_hostile_command_line_literally(hostile_process, tmp_path):
    store = tmp_path / "alerts.duckdb"
    wide = {**os.environ, "COLUMNS": "400"}  # each value on one line, for the asserts
    scan = subprocess.run(
        [*HPCSEC, "scan", "--sensor", "process", "--store", str(store)],
        capture_output=True,
        env=wide,
    )
    out, err = scan.stdout.decode(), scan.stderr.decode()
    assert scan.returncode == 1, err  # alerts found: not a crash (3), not an error (2)
    for text in (out, err):
        assert_inert(text)
    assert "MarkupError" not in err
    for fragment in ("xmrig [/x] \\x1b[2J\\x1b]0;pwn\\x07", "[black on black]hid[/]", "\\u202eab"):
        assert fragment in out
    assert "alice" in out
    listed = subprocess.run(
        [*HPCSEC, "alerts", "--store", str(store)], capture_output=True, env=wide
    )
    assert listed.returncode == 0, listed.stderr.decode()
    assert_inert(listed.stdout.decode())
    assert "xmrig [/x] \\x1b[2J\\x1b]0;pwn\\x07 [black on black]hid[/]" in listed.stdout.decode()

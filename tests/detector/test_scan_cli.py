"""`hpcsec scan --events`: exit codes, formats, malformed lines, --fail-on, --no-dedup."""

import json
import subprocess
import sys

import pytest

from hpcsec.detector.cli.main import main
from tests.rule_texts import MINER_RULE

RULES = (
    MINER_RULE
    + """---
title: Copy tool on weights
id: 7b2e3d4c-5f6a-4b7c-9d8e-0f1a2b3c4d5e
status: test
level: low
logsource: {product: hpc, category: file_access}
detection:
  sel:
    process.name: scp
  condition: sel
"""
)


def _ev(category, name, pid, ts="2026-11-30T01:00:00Z"):
    return {
        "@timestamp": ts,
        "event.id": f"{name}{pid}",
        "event.category": category,
        "event.action": "sample",
        "host.name": "n1",
        "hpcsec.sensor": "t",
        "process.name": name,
        "process.pid": pid,
        "user.name": "mallory",
    }


@pytest.fixture
def setup(tmp_path):
    rules = tmp_path / "gpu_hijack.yml"
    rules.write_text(RULES)
    events = tmp_path / "events.jsonl"
    lines = [
        json.dumps(_ev("process", "xmrig", 1)),
        "{broken",
        json.dumps([1]),
        json.dumps(_ev("file_access", "scp", 2)),
        json.dumps(_ev("process", "bash", 3)),
        json.dumps(_ev("process", "xmrig", 4)),
    ]
    events.write_text("\n".join(lines) + "\n")
    return rules, events


def test_alerts_exit_1_and_json_output(setup, capsys):
    rules, events = setup
    rc = main(
        [
            "scan",
            "--events",
            str(events),
            "--no-default-rules",
            "--rules",
            str(rules),
            "--format",
            "json",
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 1
    alerts = json.loads(out)
    assert [(a["rule.title"], a["process.pid"], a["count"]) for a in alerts] == [
        ("Miner process", 1, 1),  # two miner processes: two distinct actions
        ("Miner process", 4, 1),
        ("Copy tool on weights", 2, 1),
    ]
    assert "skipped 2 malformed line(s) of 6 (line 2: not JSON" in err
    assert "line 3: not an object but list" in err


def test_fail_on_level(setup, capsys):
    rules, events = setup
    events.write_text(json.dumps(_ev("file_access", "scp", 2)) + "\n")
    assert (
        main(
            [
                "scan",
                "--events",
                str(events),
                "--no-default-rules",
                "--rules",
                str(rules),
                "--fail-on",
                "high",
                "--format",
                "jsonl",
            ]
        )
        == 0
    )
    assert (
        main(
            [
                "scan",
                "--events",
                str(events),
                "--no-default-rules",
                "--rules",
                str(rules),
                "--fail-on",
                "low",
                "--format",
                "jsonl",
            ]
        )
        == 1
    )


def test_no_alert_exits_0(setup, capsys):
    rules, events = setup
    events.write_text(json.dumps(_ev("process", "bash", 3)) + "\n")
    assert main(["scan", "--events", str(events), "--no-default-rules", "--rules", str(rules)]) == 0


def test_events_file_says_it_gets_no_node_enrichment(setup, capsys):
    """A file has no node to capture: the report says which fields the events cannot gain."""
    rules, events = setup
    events.write_text(json.dumps(_ev("process", "bash", 3)) + "\n")
    main(["scan", "--events", str(events), "--no-default-rules", "--rules", str(rules)])
    assert "note: events read from a file carry no node to look at" in capsys.readouterr().err


def test_no_dedup_and_jsonl(setup, capsys):
    rules, events = setup
    main(
        [
            "scan",
            "--events",
            str(events),
            "--no-default-rules",
            "--rules",
            str(rules),
            "--no-dedup",
            "--format",
            "jsonl",
        ]
    )
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(x)["process.pid"] for x in lines] == [1, 4, 2]


def test_stdin_and_table(setup, monkeypatch, capsys):
    rules, events = setup
    monkeypatch.setattr(sys, "stdin", open(events))  # noqa: SIM115
    assert main(["scan", "--events", "-", "--no-default-rules", "--rules", str(rules)]) == 1
    out = capsys.readouterr().out
    assert "Miner process" in out and "critical" in out and "mallory" in out


def test_errors_exit_2_without_traceback(setup, tmp_path):
    rules, events = setup
    bad = tmp_path / "bad.yml"
    bad.write_text(
        "title: x\nlogsource: {product: hpc, category: process}\n"
        "detection:\n  sel:\n    process.name|nosuchmod: x\n  condition: sel\n"
    )
    for args in (
        ["--no-default-rules", "--rules", str(bad)],
        ["--no-default-rules", "--rules", str(rules), "--config", str(tmp_path / "missing.yml")],
        ["--no-default-rules", "--rules", str(rules), "--events", str(tmp_path / "none.jsonl")],
    ):
        cmd = [sys.executable, "-m", "hpcsec.detector", "scan", "--events", str(events), *args]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr
        assert proc.stderr.startswith("hpcsec: error: ")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "hpcsec.detector",
            "scan",
            "--events",
            str(events),
            "--no-default-rules",
            "--rules",
            str(bad),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert f"{bad}:5" in proc.stderr


def test_report_counts_every_sample_and_shows_problems_of_later_ones():
    import io

    from hpcsec.detector.core.schema import status_event
    from hpcsec.detector.runtime.sources import ScanReport
    from hpcsec.sensors.base import SensorRun

    def run(n_events, status="ok", inner=None):
        events = [{"event.category": "rdma_counters"}] * n_events + (inner or [])
        return SensorRun(
            "rdma_counters", events, status_event("rdma_counters", status, "m", "h", "t")
        )

    bad = status_event("rdma_counters", "malformed", "port_rcv_data: not a number", "h", "t")
    report = ScanReport(sensor_runs=[run(4), run(4, inner=[bad]), run(4, inner=[bad])])
    out = io.StringIO()
    report.print(out)
    assert out.getvalue().splitlines()[:2] == [
        "hpcsec: sensor rdma_counters: malformed: 12 events in 3 samples",
        "hpcsec:   malformed: port_rcv_data: not a number (x2)",
    ]

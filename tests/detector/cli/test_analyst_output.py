"""What an analyst sees: tables that fit, times with their zone, --min-level, the footer,
--require-sensor, the alert store's filters and dispositions, --version."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcsec.detector.cli import render
from hpcsec.detector.cli.alerts import display_state
from hpcsec.detector.cli.main import main
from hpcsec.detector.store.alert_store import AlertQuery, Store

HPCSEC = [sys.executable, "-m", "hpcsec.detector.cli.main"]
RDMA_FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "sysfs" / "rdma"


def lines_of(text: str) -> list[str]:
    return text.rstrip("\n").splitlines()


def test_width_comes_from_columns_then_the_terminal_then_120():
    assert render.table_width(io.StringIO(), {"COLUMNS": "97"}) == 97
    assert render.table_width(io.StringIO(), {"COLUMNS": "5"}) == render.MIN_WIDTH
    assert render.table_width(io.StringIO(), {}) == 120  # a pipe is not 220 columns
    assert render.table_width(io.StringIO(), {"COLUMNS": "wide"}) == 120


@pytest.mark.parametrize("width", [60, 80, 100, 120, 150, 220])
def test_the_demo_table_fits_the_width_and_keeps_rule_and_summary_readable(width, capsys):
    os.environ["COLUMNS"] = str(width)
    try:
        assert main(["scan", "--demo"]) == 1
    finally:
        del os.environ["COLUMNS"]
    out = lines_of(capsys.readouterr().out)
    table = out[:-1]  # the footer follows
    assert max(len(line) for line in table) <= width
    assert all(line.rstrip()[-1] in "┓┃┩│┤┘" for line in table[1:])  # nothing cut off
    head = table[2 : next(i for i, line in enumerate(table) if line.startswith("┡"))]
    cells = [line.strip("┃").split("┃") for line in head]  # a header may take two lines
    names = [" ".join(c[i].strip() for c in cells).strip() for i in range(len(cells[0]))]
    widths = [len(c) for c in table[1].strip("┏┓").split("┳")]
    rule = next(i for i, n in enumerate(names) if n.startswith("rule"))
    summary = next(i for i, n in enumerate(names) if n.startswith("summary"))
    # rule and summary wrap in columns an analyst can read, never squeezed to a few characters
    assert widths[rule] >= 16 and widths[summary] >= 16, (names, widths)
    assert "Cryptocurrency" in "\n".join(table)
    assert "01:00:00Z" in "\n".join(table)  # the zone, also when the date wraps


def test_wide_tables_name_techniques_narrow_ones_give_ids(capsys):
    alert = {
        "@timestamp": "2026-11-30T01:00:00Z",
        "rule.level": "critical",
        "rule.title": "Miner",
        "rule.vector": "gpu_hijack",
        "rule.techniques": [{"id": "T1496", "name": "Resource Hijacking"}],
    }
    wide, narrow = io.StringIO(), io.StringIO()
    render.write_table([alert], out=wide, width=200)
    render.write_table([alert], out=narrow, width=100)
    assert "T1496 Resource Hijacking" in wide.getvalue()
    assert "T1496" in narrow.getvalue() and "Resource Hijacking" not in narrow.getvalue()
    assert "vector" in wide.getvalue() and "host/job/user" in narrow.getvalue()


def test_a_line_break_in_a_value_is_escaped_in_stacked_cells():
    alert = {"rule.title": "R", "rule.level": "high", "host.name": "h\nforged", "user.name": "u"}
    for width in (70, 100, 200):
        out = io.StringIO()
        render.write_table([alert], out=out, width=width)
        assert "h\\x0aforged" in out.getvalue(), width


def test_footer_counts_levels_and_names_blind_sensors():
    alerts = [{"rule.level": "high"}, {"rule.level": "critical"}, {"rule.level": "high"}]
    assert render.footer(alerts, ["gpu", "rdma_qp"], ["roce"], hidden=2) == (
        "hpcsec: 3 alert(s): 1 critical, 2 high | 2 below --min-level (stored only) | "
        "unavailable: gpu, rdma_qp | failing: roce"
    )
    assert render.footer([]) == "hpcsec: 0 alert(s)"


def test_min_level_filters_what_is_shown_and_stores_the_rest(tmp_path, capsys):
    store = str(tmp_path / "s.duckdb")
    assert main(["scan", "--demo", "--format", "json", "--store", store]) == 1
    everything = json.loads(capsys.readouterr().out)
    assert any(a["rule.level"] == "medium" for a in everything)
    store2 = str(tmp_path / "s2.duckdb")
    args = ["scan", "--demo", "--format", "json", "--min-level", "critical", "--store", store2]
    assert main(args) == 1
    captured = capsys.readouterr()
    shown = json.loads(captured.out)
    assert shown and {a["rule.level"] for a in shown} == {"critical"}
    hidden = len(everything) - len(shown)
    assert f"{hidden} below --min-level (stored only)" in captured.err
    with Store(store2, read_only=True) as s:
        below = s.query_alerts(AlertQuery(disposition="below_min_level"))
        sent = s.query_alerts(AlertQuery(disposition="sent"))
    assert len(below) == hidden and len(sent) == len(shown)
    assert display_state(below[0]) == "stored only (below --min-level)"


def test_min_level_filters_what_outputs_receive(tmp_path, capsys):
    out = tmp_path / "alerts.jsonl"
    code = main(["scan", "--demo", "--min-level", "critical", "--output", f"file://{out}"])
    assert code == 1
    sent = [json.loads(line) for line in out.read_text().splitlines()]
    assert sent and {a["rule.level"] for a in sent} == {"critical"}


def test_fail_on_looks_only_at_what_min_level_lets_through(tmp_path, capsys):
    events = tmp_path / "e.jsonl"
    events.write_text(
        json.dumps(
            {
                "@timestamp": "2026-11-30T01:00:00Z",
                "event.category": "process",
                "host.name": "n1",
                "process.name": "xmrig",
                "process.pid": 1,
            }
        )
        + "\n"
    )
    rules = tmp_path / "r.yml"
    rules.write_text(
        "title: Medium miner\nid: 0a1d2c3b-4e5f-4a6b-8c7d-9e0f1a2b3c4d\nstatus: test\n"
        "level: medium\nlogsource: {product: hpc, category: process}\n"
        "detection:\n  sel:\n    process.name: xmrig\n  condition: sel\n"
    )
    base = ["scan", "--events", str(events), "--rules", str(rules), "--no-default-rules"]
    base += ["--format", "json"]
    assert main(base) == 1
    assert len(json.loads(capsys.readouterr().out)) == 1
    assert main([*base, "--min-level", "high"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_require_sensor_fails_a_blind_scan(tmp_path):
    empty = tmp_path / "sys"
    empty.mkdir()
    scan = subprocess.run(
        [
            *HPCSEC,
            "scan",
            "--sensor",
            "rdma_counters",
            "--sensor",
            "process",
            "--sysfs-root",
            str(empty),
            "--format",
            "json",
            "--require-sensor",
            "rdma_counters",
        ],
        capture_output=True,
        text=True,
    )
    assert scan.returncode == 2, scan.stderr
    assert "hpcsec: error: required sensor rdma_counters is unavailable" in scan.stderr
    assert "unavailable: rdma_counters" in scan.stderr  # the footer names it too
    json.loads(scan.stdout)  # the alerts were still written, as JSON


def test_require_sensor_passes_when_it_ran_and_rejects_unknown_names(capsys):
    assert main(["scan", "--demo", "--format", "json", "--require-sensor", "gpu"]) == 1
    capsys.readouterr()
    assert main(["scan", "--demo", "--format", "json", "--require-sensor", "roce"]) == 2
    assert "required sensor roce did not run" in capsys.readouterr().err
    assert main(["scan", "--demo", "--format", "json", "--require-sensor", "gpus"]) == 2
    assert "no such sensor" in capsys.readouterr().err


def _alert(aid: str, title: str, level: str, host: str) -> dict:
    return {
        "alert.id": aid,
        "@timestamp": "2026-11-30T01:00:00Z",
        "rule.id": f"id-{aid}",
        "rule.title": title,
        "rule.level": level,
        "rule.vector": "gpu_hijack",
        "host.name": host,
        "count": 1,
    }


def test_alert_store_filters_by_title_part_id_host_and_level(tmp_path):
    path = tmp_path / "s.duckdb"
    store = Store(path)
    store.insert_alerts(
        [
            _alert("a", "Cryptocurrency miner process", "critical", "gpu-1"),
            _alert("b", "GPU process outside any Slurm job", "high", "gpu-2"),
            _alert("c", "100%_done marker", "low", "gpu-1"),
        ]
    )

    def ids(**query) -> list[str]:
        with Store(path, read_only=True) as s:
            return [a["alert.id"] for a in s.query_alerts(AlertQuery(**query))]

    assert ids(rule="MINER") == ["a"]
    assert ids(rule="id-b") == ["b"]
    assert sorted(ids(rule="process")) == ["a", "b"]
    assert ids(rule="%") == ["c"]  # typed text, not a LIKE pattern
    assert ids(rule="_") == ["c"]
    assert sorted(ids(host="gpu-1")) == ["a", "c"]
    assert sorted(ids(levels=("high", "critical"))) == ["a", "b"]
    assert ids(host="gpu-1", levels=("critical",)) == ["a"]


def test_alerts_command_level_and_host_options(tmp_path, capsys):
    path = tmp_path / "s.duckdb"
    Store(path).insert_alerts(
        [
            _alert("a", "Cryptocurrency miner process", "critical", "gpu-1"),
            _alert("b", "GPU process outside any Slurm job", "high", "gpu-2"),
        ]
    )
    base = ["alerts", "--store", str(path), "--format", "json"]
    assert main([*base, "--level", "critical"]) == 0
    assert [a["alert.id"] for a in json.loads(capsys.readouterr().out)] == ["a"]
    assert main([*base, "--host", "gpu-2", "--rule", "slurm JOB"]) == 0
    assert [a["alert.id"] for a in json.loads(capsys.readouterr().out)] == ["b"]


@pytest.mark.parametrize(
    ("disposition", "deliveries", "shown"),
    [
        ("sent", {}, "stored only (no output)"),
        ("sent", {"syslog": "delivered"}, "sent"),
        ("sent", {"syslog": "delivered", "hook": "pending"}, "partly sent (pending)"),
        ("sent", {"hook": "failed"}, "not sent (failed)"),
        ("silenced", {}, "stored only (silenced)"),
        ("rate_limited", {}, "stored only (rate limited)"),
        ("below_min_level", {}, "stored only (below --min-level)"),
    ],
)
def test_disposition_says_stored_only_unless_an_output_took_it(disposition, deliveries, shown):
    alert = {"hpcsec.disposition": disposition, "hpcsec.deliveries": deliveries}
    assert display_state(alert) == shown


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    from importlib.metadata import version

    assert capsys.readouterr().out == f"hpcsec {version('hpcsec')}\n"


def test_require_sensor_fails_when_slurm_is_unreachable(tmp_path):
    """slurm_jobs runs, but says among its events that Slurm cannot be reached: a scan with
    no job context must not pass for a clean one when the user requires it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("scontrol", "squeue", "sinfo"):
        fake = bin_dir / tool
        fake.write_text(
            "#!/bin/sh\necho 'fatal: Could not establish a configuration source' >&2\nexit 1\n"
        )
        fake.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    argv = [*HPCSEC, "scan", "--sensor", "slurm_jobs", "--format", "jsonl"]
    scan = subprocess.run(
        [*argv, "--require-sensor", "slurm_jobs"], capture_output=True, text=True, env=env
    )
    assert scan.returncode == 2, scan.stderr
    assert "required sensor slurm_jobs is unavailable" in scan.stderr
    assert "unavailable: slurm_jobs" in scan.stderr  # the footer names it too

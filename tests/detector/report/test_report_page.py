"""`hpcsec report` as HTML text: sources, hostile node strings, no external asset."""

from __future__ import annotations

import json
import re
import stat

import pytest

from hpcsec.detector.cli.main import main

HOSTILE_USER = '<script>alert("x")</script>'
HOSTILE_HOST = '"><img src=x onerror=alert(1)>\x1b[2J'
HOSTILE_CMD = "</code></details><iframe src=//evil.example></iframe> --url stratum+tcp://p:1"


def hostile_events(path) -> None:
    """A miner whose user, host and command line are markup: the report must show it as text."""
    event = {
        "@timestamp": "2026-11-30T01:00:00Z",
        "event.category": "process",
        "event.action": "start",
        "host.name": HOSTILE_HOST,
        "process.pid": 51000,
        "process.name": "xmrig",
        "user.name": HOSTILE_USER,
        "process.command_line": HOSTILE_CMD,
    }
    path.write_text(json.dumps(event) + "\n")


def test_demo_report_is_self_contained_and_private(tmp_path):
    out = tmp_path / "demo.html"
    assert main(["report", "--demo", "-o", str(out)]) == 0
    page = out.read_text()
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert (
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; '
        "style-src 'unsafe-inline'; img-src data:\">" in page
    )
    assert "<script" not in page.lower()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)  # nothing fetched
    assert page.count("<svg") == 2
    for vector in ("gpu_hijack", "rdma_abuse", "model_theft", "data_poisoning"):
        assert vector in page
    assert "d98889930973ef5e" in page  # the miner's incident, with its timeline


def test_hostile_node_strings_are_escaped(tmp_path):
    events = tmp_path / "events.jsonl"
    hostile_events(events)
    out = tmp_path / "r.html"
    assert main(["report", "--events", str(events), "-o", str(out)]) == 0
    page = out.read_text()
    assert "<script" not in page.lower() and "<iframe" not in page and "<img" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert "&lt;iframe src=//evil.example&gt;" in page
    assert "\x1b" not in page and "\\x1b[2J" in page  # control bytes shown, not sent


def test_report_from_the_store_matches_the_scan(tmp_path, capsys):
    store = str(tmp_path / "a.duckdb")
    assert main(["scan", "--demo", "--format", "json", "--store", store]) == 1
    alerts = json.loads(capsys.readouterr().out)
    incidents = {a["incident.id"] for a in alerts}
    out = tmp_path / "store.html"
    assert main(["report", "--store", store, "-o", str(out)]) == 0
    page = out.read_text()
    assert f"{len(alerts)} alert(s) in {len(incidents)} incident(s)" in page
    assert "alert store" in page


def test_a_source_is_required_and_rules_do_not_go_with_the_store(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["report", "-o", str(tmp_path / "x.html")])
    rc = main(["report", "--store", "s", "--rules", "r", "-o", str(tmp_path / "x.html")])
    assert rc == 2
    assert not (tmp_path / "x.html").exists()


def test_a_flood_of_incidents_is_cut_to_the_most_severe(tmp_path):
    from hpcsec.detector.alerts.model import Alert
    from hpcsec.detector.report.gather import ReportInput
    from hpcsec.detector.report.page import MAX_SHOWN, render

    alerts = [
        Alert(
            {
                "alert.id": f"a{n}",
                "@timestamp": "2026-11-30T01:00:00Z",
                "rule.title": "t",
                "rule.level": "critical" if n == MAX_SHOWN + 1 else "low",
                "rule.vector": "gpu_hijack",
                "host.name": "gpu-1",
                "incident.id": f"inc-{n}",
            }
        )
        for n in range(MAX_SHOWN + 2)
    ]
    page = render(ReportInput(alerts=alerts, source="test"), generated="now")
    assert "2 less severe incident(s) not shown" in page
    assert f"inc-{MAX_SHOWN + 1}" in page  # the critical one is first, so shown


def test_event_times_years_apart_plot_in_a_bounded_chart(tmp_path):
    # year 1 and 2026: the first bucket began before year 1 (a crash), and 7-day bars would
    # have been 105,000 of them
    from hpcsec.detector.report.svg import MAX_BUCKETS, alerts_over_time

    alerts = [
        {"@timestamp": t, "rule.vector": "gpu_hijack"}
        for t in ("0001-01-01T00:00:00Z", "2026-01-01T00:00:00Z", "9999-12-31T23:59:59Z")
    ]
    svg = alerts_over_time(alerts, {"gpu_hijack": "#000"})
    assert 0 < svg.count("<rect") <= 3
    (step,) = re.findall(r"one bar per (\d+) s", svg)
    span = 9999 * 365.25 * 86400
    assert int(step) * (MAX_BUCKETS + 1) >= span  # at most about MAX_BUCKETS bars
    labels = re.findall(r'font-size="11">(\d{4}-\d\d-\d\d)</text>', svg)
    assert labels and labels[0] == "0001-01-01" and len(labels) <= MAX_BUCKETS
    events = tmp_path / "e.jsonl"
    events.write_text(
        "".join(
            json.dumps(
                {
                    "event.category": "process",
                    "@timestamp": t,
                    "host.name": "h",
                    "process.pid": n,
                    "process.name": "xmrig",
                    "user.name": "u",
                }
            )
            + "\n"
            for n, t in enumerate(("0001-01-01T00:00:00Z", "2026-01-01T00:00:00Z"))
        )
    )
    assert main(["report", "--events", str(events), "-o", str(tmp_path / "r.html")]) == 0

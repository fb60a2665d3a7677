"""The hostile-strings corpus through every surface a person or a SIEM reads: scan's table,
JSON and JSONL, the alerts table, the HTML report, collect, snapshot replay, and the stdout,
JSONL file, syslog (JSON and CEF, to a real rsyslogd) and webhook outputs. For each item: no
crash, the miner beside it still alerts, the alert id is stable, and nothing a terminal or a
SIEM would obey arrives raw."""

from __future__ import annotations

import io
import json
import logging
import uuid
from pathlib import Path

import pytest
from snapshot_builder import sample_tree, write_meta

from hpcsec.detector.cli import collect as collect_command
from hpcsec.detector.cli.main import main
from hpcsec.detector.core import log
from hpcsec.detector.core.schema import status_event
from hpcsec.detector.runtime.sources import ScanReport
from hpcsec.sensors.base import SensorRun
from tests.detector.outputs.test_output_syslog import RSYSLOGD, Rsyslog, complete_lines
from tests.detector.outputs.test_output_webhook import SECRET, Receiver
from tests.hostile_corpus import CORPUS, IDS, as_text, assert_inert, escaped

ITEMS = pytest.mark.parametrize("raw", CORPUS.values(), ids=IDS)
MINER_RULE = "743946f7-19b5-40ca-97f8-197cf6f01537"
SHORT = 4096  # items shorter than this are checked to appear whole, escaped


def events_file(tmp_path: Path, raw: bytes) -> Path:
    """One miner event whose user, command line and executable carry the item."""
    text = as_text(raw)
    event = {
        "@timestamp": "2026-11-30T01:00:00Z",
        "event.id": "e1",
        "event.category": "process",
        "event.action": "sample",
        "host.name": "n1",
        "hpcsec.sensor": "process",
        "process.name": "xmrig",
        "process.pid": 4242,
        "process.executable": f"/tmp/{text}",
        "process.command_line": f"xmrig {text} --url stratum+tcp://pool:3333",
        "user.name": text,
    }
    path = tmp_path / "events.jsonl"
    path.write_text(json.dumps(event) + "\n", errors="surrogateescape")
    return path


def scan(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["scan", *args])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


@pytest.fixture(autouse=True)
def wide_tables(monkeypatch):
    """Tables fit the terminal and wrap long cells: wide enough here that an item (and the
    rule title) stays on one line, so the test can look for it whole."""
    monkeypatch.setenv("COLUMNS", "400")


def check_literal(text: str, raw: bytes) -> None:
    """Markup and forged lines arrive as text: the item's visible form is in the output, and
    no line of it starts with what the item would forge."""
    if raw.startswith((b"[", b"python3")):
        assert raw.decode() in text  # markup shown, not obeyed (and not a MarkupError)
    assert "\n<13>1" not in text


@ITEMS
def test_scan_table(tmp_path, capsys, raw):
    rc, out, err = scan(capsys, "--events", str(events_file(tmp_path, raw)))
    assert rc == 1, err
    assert "Cryptocurrency miner process" in out
    assert_inert(out + err)
    check_literal(out, raw)


@ITEMS
@pytest.mark.parametrize("fmt", ["json", "jsonl"])
def test_scan_json_and_jsonl_ids_stable(tmp_path, capsys, raw, fmt):
    events = str(events_file(tmp_path, raw))
    runs = [scan(capsys, "--events", events, "--format", fmt) for _ in range(2)]
    for rc, out, err in runs:
        assert rc == 1, err
        assert_inert(out + err)
    parsed = [json.loads(out) if fmt == "json" else [json.loads(out)] for _, out, _ in runs]
    first, second = ([a["alert.id"] for a in p] for p in parsed)
    assert first == second
    (alert,) = parsed[0]
    assert alert["rule.id"] == MINER_RULE
    if len(raw) < SHORT:
        assert alert["user.name"] == escaped(raw)


@ITEMS
def test_alerts_table_from_the_store(tmp_path, capsys, raw):
    store = str(tmp_path / "alerts.duckdb")
    rc, _, err = scan(capsys, "--events", str(events_file(tmp_path, raw)), "--store", store)
    assert rc == 1, err
    assert main(["alerts", "--store", store]) == 0
    captured = capsys.readouterr()
    assert "Cryptocurrency miner process" in captured.out
    assert_inert(captured.out + captured.err)
    check_literal(captured.out, raw)


@ITEMS
def test_report_html(tmp_path, capsys, raw):
    page = tmp_path / "report.html"
    rc = main(["report", "--events", str(events_file(tmp_path, raw)), "-o", str(page)])
    assert rc in (0, 1), capsys.readouterr().err
    html = page.read_text()
    assert_inert(html)
    assert "<13>" not in html  # the forged header is HTML-escaped text
    assert "Cryptocurrency miner process" in html


@ITEMS
def test_output_stdout_and_jsonl_file(tmp_path, capsys, raw):
    out_file = tmp_path / "alerts.jsonl"
    rc, out, err = scan(
        capsys,
        "--events",
        str(events_file(tmp_path, raw)),
        "--output",
        "-",
        "--output",
        f"file://{out_file}",
    )
    assert rc == 1, err
    written = out_file.read_text()
    for text in (out, written):
        assert_inert(text)
        (alert,) = [json.loads(line) for line in text.splitlines() if line.strip()]
        assert alert["rule.id"] == MINER_RULE


@pytest.fixture(scope="module")
def rsyslog(tmp_path_factory):
    if RSYSLOGD is None:
        pytest.skip("rsyslogd not installed (Debian package rsyslog; `make system-deps`)")
    server = Rsyslog(tmp_path_factory.mktemp("rsyslog"))
    yield server
    server.stop()


@pytest.mark.rsyslog
@ITEMS
@pytest.mark.parametrize("body", ["json", "cef"])
def test_output_syslog(tmp_path, capsys, rsyslog, raw, body):
    marker = uuid.uuid4().hex
    events = events_file(tmp_path, marker.encode() + raw)  # cut values keep their start
    url = f"syslog+tcp://127.0.0.1:{rsyslog.tcp}?format={body}"
    rc, _, err = scan(capsys, "--events", str(events), "--output", url)
    assert rc == 1, err
    (record,) = rsyslog.records(marker, 1)
    # RFC 5424 marks a UTF-8 message with a BOM: the one before the body is the protocol's
    assert_inert(record["raw"].replace(" \ufeff", " ", 1))
    assert record["app"] == "hpcsec"
    every = [json.loads(line) for line in complete_lines(rsyslog.out)]
    assert not [r for r in every if r["app"] == "app" or r["msg"].startswith("forged")]
    if body == "json":
        assert json.loads(record["msg"])["rule.id"] == MINER_RULE


@ITEMS
def test_output_webhook(tmp_path, capsys, raw):
    receiver = Receiver().start()
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    secret.chmod(0o600)
    try:
        rc, _, err = scan(
            capsys,
            "--events",
            str(events_file(tmp_path, raw)),
            "--output",
            receiver.url,
            "--webhook-secret-file",
            str(secret),
            "--spool",
            str(tmp_path / "spool"),
        )
    finally:
        receiver.stop()
    assert rc == 1, err
    (body,) = receiver.bodies
    assert_inert(body.decode("utf-8"))
    assert json.loads(body)["rule.id"] == MINER_RULE


def hostile_snapshot(tmp_path: Path, raw: bytes) -> Path:
    root = tmp_path / "snap"
    tree = sample_tree(root, 0, "2026-11-30T10:00:00.000Z")
    tree.passwd(("root", 0), ("alice", 1001), ("bob", 1002))
    d = tree.process(500, "placeholder", ["placeholder"], uid=1001)
    (d / "comm").write_bytes(raw.replace(b"\n", b" ")[:15] + b"\n")
    (d / "cmdline").write_bytes(b"./run\0" + raw.replace(b"\0", b"") + b"\0")
    tree.process(600, "xmrig", ["./xmrig", "--url", "stratum+tcp://p:1"], uid=1002)
    write_meta(root, "n1", 1)
    return root


@ITEMS
def test_snapshot_replay_scan_and_collect(tmp_path, capsys, raw):
    snap = str(hostile_snapshot(tmp_path, raw))
    rc, out, err = scan(capsys, "--snapshot", snap, "--sensor", "process", "--format", "json")
    assert rc == 1, err
    miners = [a["process.pid"] for a in json.loads(out) if a["rule.id"] == MINER_RULE]
    assert miners == [600]
    collect = ["collect", "--from-snapshot", snap, "--sensor", "process", "--format", "table"]
    assert main(collect) == 0
    captured = capsys.readouterr()
    assert_inert(captured.out + captured.err)
    assert "xmrig" in captured.out


@ITEMS
def test_log_records_and_stderr_reports(capsys, raw):
    text = as_text(raw)
    log.setup(service=True, env={})
    # records quote event text, which is escaped at the edge (pytest-xdist cannot carry a
    # captured record with a lone surrogate back from its worker)
    logging.getLogger("hpcsec.test").error("delivery failed: %s", escaped(raw))
    status = status_event("process", "malformed", f"/proc/1/cmdline: {text}", "h", "t")
    collect_command.print_status(SensorRun("process", [], status))
    report = ScanReport(sensor_runs=[SensorRun("process", [], status)])
    report.skipped_samples.append(f"sample 2: {text}")
    out = io.StringIO()
    report.print(out)
    err = capsys.readouterr().err
    for shown in (err, out.getvalue()):
        assert_inert(shown)
        assert "\n<13>1" not in shown
    assert "delivery failed: " in err

"""Incidents in the DuckDB store and in `hpcsec alerts --incidents / --incident ID`."""

from __future__ import annotations

import json

import duckdb

from hpcsec.detector.cli.main import main
from hpcsec.detector.store.alert_store import AlertQuery, Store

# the alerts table as the first release created it, before incidents
_OLD_ALERTS = """CREATE TABLE alerts (
    alert_id VARCHAR PRIMARY KEY, ts TIMESTAMP, first_seen TIMESTAMP, last_seen TIMESTAMP,
    rule_id VARCHAR, rule_title VARCHAR, rule_level VARCHAR, rule_vector VARCHAR,
    host VARCHAR, job_id VARCHAR, user_name VARCHAR, count BIGINT,
    disposition VARCHAR, reason VARCHAR, summary VARCHAR, doc VARCHAR,
    stored_at TIMESTAMP)"""


def _scan_into(path: str) -> list[dict]:
    assert main(["scan", "--demo", "--format", "json", "--store", path]) == 1
    with Store(path, read_only=True) as store:
        return store.query_alerts(AlertQuery())


def test_scan_stores_the_incident_and_alerts_filter_by_it(tmp_path, capsys):
    path = str(tmp_path / "a.duckdb")
    stored = _scan_into(path)
    capsys.readouterr()
    miner = next(a for a in stored if a.get("process.pid") == 51000)
    ident = miner["incident.id"]
    with duckdb.connect(path, read_only=True) as con:
        rows = con.execute("SELECT count(*) FROM alerts WHERE incident_id = ?", [ident]).fetchone()
    assert rows is not None and rows[0] >= 3
    assert main(["alerts", "--store", path, "--incident", ident, "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {a["incident.id"] for a in out} == {ident} and len(out) == rows[0]


def test_alerts_incidents_table_and_timeline(tmp_path, capsys, monkeypatch):
    path = str(tmp_path / "a.duckdb")
    stored = _scan_into(path)
    capsys.readouterr()
    assert main(["alerts", "--store", path, "--incidents", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == len({a["incident.id"] for a in stored})
    assert main(["alerts", "--store", path, "--incidents"]) == 0
    table = capsys.readouterr().out
    assert all(r["incident.id"] in table for r in rows)
    miner = next(r for r in rows if r["user.name"] == ["mallory"] and not r["slurm.job.id"])
    assert main(["alerts", "--store", path, "--incident", miner["incident.id"]]) == 0
    timeline = capsys.readouterr().out
    assert f"incident {miner['incident.id']}" in timeline and "mallory" in timeline
    assert "Cryptocurrency miner process" in timeline
    assert "Firmware" not in timeline  # other incidents stay out


def test_a_store_from_before_incidents_is_read_and_upgraded(tmp_path, capsys):
    path = str(tmp_path / "old.duckdb")
    with duckdb.connect(path) as con:
        con.execute(_OLD_ALERTS)
    assert main(["alerts", "--store", path, "--incident", "abc", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    store = Store(path)  # a writer adds the column
    store.insert_alerts([{"alert.id": "x", "rule.id": "r", "incident.id": "inc-1"}])
    assert [a["alert.id"] for a in store.query_alerts(AlertQuery(incident="inc-1"))] == ["x"]

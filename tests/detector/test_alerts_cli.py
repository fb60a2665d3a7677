"""`hpcsec alerts` over a real DuckDB store."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import duckdb

from hpcsec.detector.cli.main import main
from hpcsec.detector.store.alert_store import Store


def stamp(ago: timedelta) -> str:
    return (datetime.now(UTC) - ago).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def alert(aid: str, ago: timedelta, **fields) -> dict:
    return {
        "alert.id": aid,
        "@timestamp": stamp(ago),
        "rule.id": "r-gpu",
        "rule.title": "GPU process outside any job",
        "rule.level": "high",
        "rule.tags": [],
        "rule.vector": "gpu_hijack",
        "host.name": "gpu-007",
        "user.name": "mallory",
        "events": [],
        "count": 2,
        "alert.first_seen": stamp(ago),
        "alert.last_seen": stamp(ago),
        "alert.summary": f"miner {aid}",
        **fields,
    }


def make_store(tmp_path) -> str:
    path = str(tmp_path / "alerts.duckdb")
    store = Store(path)
    store.insert_alerts(
        [
            alert("old", timedelta(hours=5)),
            alert("new", timedelta(minutes=5), **{"slurm.job.id": "77"}),
        ]
    )
    store.insert_alerts(
        [alert("quiet", timedelta(minutes=1), **{"user.name": "svc"})], disposition="silenced"
    )
    store.insert_events(
        [
            {
                "event.id": "e1",
                "@timestamp": stamp(timedelta(minutes=2)),
                "event.category": "gpu_process",
                "host.name": "gpu-007",
            }
        ]
    )
    return path


def test_json_output_with_filters(tmp_path, capsys):
    path = make_store(tmp_path)
    assert main(["alerts", "--store", path, "--since", "1h", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [a["alert.id"] for a in out] == ["new", "quiet"]
    assert out[0]["slurm.job.id"] == "77"
    assert out[1]["hpcsec.disposition"] == "silenced"
    assert main(["alerts", "--store", path, "--job", "77", "--format", "json"]) == 0
    assert [a["alert.id"] for a in json.loads(capsys.readouterr().out)] == ["new"]
    assert (
        main(
            [
                "alerts",
                "--store",
                path,
                "--user",
                "mallory",
                "--rule",
                "r-gpu",
                "--vector",
                "gpu_hijack",
                "--state",
                "sent",
                "--format",
                "json",
            ]
        )
        == 0
    )
    assert [a["alert.id"] for a in json.loads(capsys.readouterr().out)] == ["old", "new"]


def test_table_output(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    path = make_store(tmp_path)
    assert main(["alerts", "--store", path, "--job", "77"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = [c.strip() for c in lines[1].strip("┃").split("┃")]
    assert header == ["time", "level", "vector", "rule", "host", "job", "user", "state", "summary"]
    row = [c.strip() for c in lines[3].strip("│").split("│")]
    assert row[1:] == [
        "high",
        "gpu_hijack",
        "GPU process outside any job",  # the title, not the rule's id
        "gpu-007",
        "77",
        "mallory",
        "stored only (no output)",  # no output took it: not "sent"
        "miner new (x2)",
    ]
    assert row[0].endswith("Z")  # times say their zone
    assert lines[-1] == "hpcsec: 1 alert(s): 1 high"


def test_store_path_from_the_config_and_export(tmp_path, capsys):
    path = make_store(tmp_path)
    config = tmp_path / "site.yml"
    config.write_text(f"store:\n  path: {path}\n  retention_days: 3\n")
    target = tmp_path / "events.parquet"
    assert main(["alerts", "--config", str(config), "--export-events", str(target)]) == 0
    assert capsys.readouterr().err == f"exported 1 event(s) to {target}\n"
    assert duckdb.sql(f"SELECT \"event.id\" FROM '{target}'").fetchall() == [("e1",)]


def test_usage_errors_exit_2(tmp_path, capsys):
    assert main(["alerts"]) == 2
    assert capsys.readouterr().err == (
        "hpcsec: error: no alert store: give --store FILE or store.path in --config\n"
    )
    path = make_store(tmp_path)
    assert main(["alerts", "--store", path, "--since", "soon"]) == 2
    assert "--since 'soon': expected a duration" in capsys.readouterr().err
    assert main(["alerts", "--store", str(tmp_path / "nope.duckdb")]) == 2
    assert capsys.readouterr().err == (
        f"hpcsec: error: alert store {tmp_path}/nope.duckdb does not exist\n"
    )

"""The DuckDB store on real files: insert, upsert, query filters, retention, Parquet export."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta

import duckdb
import pytest

from hpcsec.detector.core.errors import UsageError
from hpcsec.detector.outputs.delivery import DeliveryOutcome
from hpcsec.detector.store.alert_store import AlertQuery, Store, StoreError, parse_since

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def ts(hours_ago: float) -> str:
    return (NOW - timedelta(hours=hours_ago)).strftime("%Y-%m-%dT%H:%M:%S.000Z")


def alert(aid: str, hours_ago: float, **fields) -> dict:
    base = {
        "alert.id": aid,
        "@timestamp": ts(hours_ago),
        "rule.id": "r-theft",
        "rule.title": "Model read by outsider",
        "rule.level": "high",
        "rule.tags": ["attack.t1005"],
        "rule.vector": "model_theft",
        "host.name": "gpu-001",
        "slurm.job.id": "42",
        "user.name": "alice",
        "events": [{"event.id": "e1"}],
        "count": 1,
        "alert.first_seen": ts(hours_ago),
        "alert.last_seen": ts(hours_ago),
        "alert.summary": f"summary {aid}",
    }
    return {**base, **fields}


def event(eid: str, days_ago: float) -> dict:
    return {
        "event.id": eid,
        "@timestamp": (NOW - timedelta(days=days_ago)).isoformat(),
        "event.category": "file_access",
        "event.action": "read",
        "host.name": "gpu-001",
        "hpcsec.sensor": "fanotify",
        "slurm.job.id": "42",
        "user.name": "alice",
        "file.path": "/lustre/models/llama/w.safetensors",
    }


def test_alerts_round_trip_with_filters_and_delivery_state(tmp_path):
    store = Store(tmp_path / "s.duckdb")
    store.insert_alerts(
        [
            alert("a1", 30),
            alert("a2", 2, **{"slurm.job.id": "43", "user.name": "bob"}),
            alert("a3", 0.5, **{"rule.id": "r-fw", "rule.vector": "firmware_drift"}),
        ]
    )
    store.insert_alerts([alert("a4", 0.2)], disposition="silenced", reason="silence: known job")
    store.record_deliveries(
        [
            DeliveryOutcome("a3", "syslog+tcp://siem:514", "pending", "down"),
            DeliveryOutcome("a3", "syslog+tcp://siem:514", "delivered"),
            DeliveryOutcome("a3", "https://hook", "failed", "HTTP 400"),
        ]
    )
    everything = store.query_alerts(AlertQuery())
    assert [a["alert.id"] for a in everything] == ["a1", "a2", "a3", "a4"]  # oldest first
    assert everything[0]["events"] == [{"event.id": "e1"}]
    assert everything[2]["hpcsec.deliveries"] == {
        "https://hook": "failed",
        "syslog+tcp://siem:514": "delivered",
    }
    assert everything[3]["hpcsec.disposition"] == "silenced"
    assert everything[3]["hpcsec.disposition_reason"] == "silence: known job"

    def ids(**kw) -> list[str]:
        return [a["alert.id"] for a in store.query_alerts(AlertQuery(**kw))]

    assert ids(since=NOW - timedelta(hours=3)) == ["a2", "a3", "a4"]
    assert ids(job="43") == ["a2"]
    assert ids(user="alice") == ["a1", "a3", "a4"]
    assert ids(rule="r-fw") == ["a3"]
    assert ids(vector="MODEL_THEFT") == ["a1", "a2", "a4"]
    assert ids(disposition="silenced") == ["a4"]
    assert ids(user="alice", job="42", since=NOW - timedelta(hours=1)) == ["a3", "a4"]
    assert ids(limit=2) == ["a3", "a4"]  # the newest two
    assert ids(user="nobody") == []


def test_an_alert_id_stored_again_replaces_the_earlier_row(tmp_path):
    store = Store(tmp_path / "s.duckdb")
    store.insert_alerts([alert("a1", 1)])
    store.insert_alerts([alert("a1", 1, count=7, **{"alert.last_seen": ts(0.1)})])
    (only,) = store.query_alerts(AlertQuery())
    assert only["count"] == 7
    assert store.count("alerts") == 1


def test_events_are_pruned_after_retention_and_exported_to_parquet(tmp_path):
    store = Store(tmp_path / "s.duckdb", retention_days=7)
    assert (
        store.insert_events(
            [event("e-old", 8), event("e-mid", 6.5), event("e-new", 0.1), event("e-new", 0.1)]
        )
        == 3
    )
    assert store.insert_events([event("e-new", 0.1)]) == 1  # seen before: kept once
    assert store.count("events") == 3
    assert store.prune(now=NOW) == 1
    assert store.count("events") == 2
    out = tmp_path / "hunt.parquet"
    assert store.export_events(out) == 2
    rows = duckdb.sql(
        f'SELECT "event.id", "event.category", "user.name", '
        f"json_extract_string(doc, '$.\"file.path\"') FROM '{out}' "
        'ORDER BY "@timestamp"'
    ).fetchall()
    assert rows == [
        ("e-mid", "file_access", "alice", "/lustre/models/llama/w.safetensors"),
        ("e-new", "file_access", "alice", "/lustre/models/llama/w.safetensors"),
    ]
    recent = tmp_path / "recent.parquet"
    assert store.export_events(recent, since=NOW - timedelta(days=1)) == 1


def test_bytes_that_are_not_utf8_are_stored_escaped(tmp_path):
    store = Store(tmp_path / "s.duckdb")
    store.insert_events([{**event("e1", 0.1), "file.path": "/models/\udcff.bin"}])
    store.insert_alerts([alert("a1", 1, **{"file.path": "/models/\udcff.bin"})])
    (stored,) = store.query_alerts(AlertQuery())
    assert stored["file.path"] == "/models/\\xff.bin"
    assert store.count("events") == 1


def test_reading_a_missing_store_is_a_clear_error(tmp_path):
    with pytest.raises(StoreError, match=rf"alert store {tmp_path}/none.duckdb does not exist"):
        Store(tmp_path / "none.duckdb", read_only=True)


def test_a_store_held_by_another_process_is_reported(tmp_path):
    path = tmp_path / "s.duckdb"
    Store(path)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from hpcsec.detector.store.alert_store import Store; "
            f"s = Store({str(path)!r}, hold=True); s.count('alerts'); print('held', flush=True); "
            "sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline() == "held\n"
        with pytest.raises(StoreError, match=rf"cannot open alert store {path}: .*lock"):
            Store(path, lock_wait_s=0.3)
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert Store(path, read_only=True).count("alerts") == 0  # free again


def test_parse_since():
    assert parse_since("90m", NOW) == NOW - timedelta(minutes=90)
    assert parse_since("2w", NOW) == NOW - timedelta(days=14)
    assert parse_since("2026-11-30T10:00:00Z", NOW) == datetime(2026, 11, 30, 10, tzinfo=UTC)
    with pytest.raises(UsageError, match=r"--since 'yesterday': expected a duration"):
        parse_since("yesterday", NOW)


def test_a_suppression_decision_is_stored_with_dispositions(tmp_path):
    from hpcsec.detector.alerts.suppression import Suppressor
    from hpcsec.detector.config.site import Silence

    sup = Suppressor(
        (Silence(job="42", user="alice", comment="pentest"),),
        rate_limit_per_rule=1,
        clock=lambda: NOW,
    )
    decision = sup.apply(
        [
            alert("s1", 1, **{"slurm.job.id": "7"}),
            alert("s2", 1, **{"slurm.job.id": "8"}),
            alert("s3", 1),
        ]
    )
    store = Store(tmp_path / "s.duckdb")
    store.insert_decision(decision)
    rows = {
        a["alert.id"]: (a["hpcsec.disposition"], a.get("hpcsec.disposition_reason"))
        for a in store.query_alerts(AlertQuery())
    }
    assert rows == {
        "s1": ("sent", None),
        "s2": ("rate_limited", "over the per-rule rate limit"),
        "s3": ("silenced", "silenced by job=42, user=alice (pentest)"),
    }


def test_alerts_come_back_in_the_order_of_their_time(tmp_path):
    from hpcsec.detector.store.alert_store import AlertQuery, Store

    store = Store(tmp_path / "s.duckdb")
    base = {
        "rule.id": "r",
        "rule.title": "t",
        "rule.level": "high",
        "rule.vector": "v",
        "host.name": "n",
        "events": [],
        "count": 1,
    }
    store.insert_alerts(
        [
            {
                **base,
                "alert.id": "late",
                "@timestamp": "2026-11-30T01:00:10Z",
                "alert.last_seen": "2026-11-30T01:00:10Z",
            },
            {
                **base,
                "alert.id": "early",
                "@timestamp": "2026-11-30T01:00:00Z",
                "alert.last_seen": "2026-11-30T01:05:00Z",
            },  # seen again later: still the older one
        ]
    )
    assert [a["alert.id"] for a in store.query_alerts(AlertQuery())] == ["early", "late"]

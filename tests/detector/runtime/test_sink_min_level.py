"""`hpcsec agent --min-level`: alerts below it reach the store, never the outputs."""

from __future__ import annotations

import json

from hpcsec.detector.alerts.model import Alert
from hpcsec.detector.alerts.suppression import Decision
from hpcsec.detector.config.site import load_config
from hpcsec.detector.runtime.endpoints import open_alert_outputs
from hpcsec.detector.runtime.metrics import AgentMetrics
from hpcsec.detector.runtime.sink import AlertSink
from hpcsec.detector.store.alert_store import AlertQuery, Store
from hpcsec.detector.store.journal import JournalWriter


def _alert(aid: str, level: str) -> Alert:
    return Alert(
        {
            "alert.id": aid,
            "@timestamp": "2026-11-30T01:00:00Z",
            "rule.id": f"r-{aid}",
            "rule.title": f"rule {aid}",
            "rule.level": level,
            "rule.vector": "gpu_hijack",
            "host.name": "n1",
            "count": 1,
        }
    )


def test_alerts_below_min_level_are_stored_not_sent(tmp_path):
    out = tmp_path / "out.jsonl"
    outputs = open_alert_outputs(
        [f"file://{out}"], secret_file=None, spool_dir=None, config=load_config(None)
    )
    journal = JournalWriter(tmp_path / "s.duckdb")  # what the agent writes
    sink = AlertSink(outputs, journal, AgentMetrics(), min_level="high")
    sink.emit(Decision([_alert("a", "critical"), _alert("b", "medium")], [], [], []))
    sink.flush_store()
    assert outputs is not None
    outputs.close()
    store = Store(tmp_path / "s.duckdb")  # applies the journal
    assert [json.loads(line)["alert.id"] for line in out.read_text().splitlines()] == ["a"]
    below = store.query_alerts(AlertQuery(disposition="below_min_level"))
    assert [a["alert.id"] for a in below] == ["b"]
    assert below[0]["hpcsec.disposition_reason"] == "below --min-level high"
    sent = store.query_alerts(AlertQuery(disposition="sent"))
    assert [a["alert.id"] for a in sent] == ["a"]

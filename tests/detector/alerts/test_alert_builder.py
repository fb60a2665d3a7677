"""Matches -> alerts: the alert schema, dedup by (rule, key, window), stable ids."""

import orjson
import pytest

from hpcsec.detector.alerts.builder import AlertBuilder, alert_id, summarize
from hpcsec.detector.alerts.model import Alert, level_rank, sort_alerts
from hpcsec.detector.engine.evaluate import Engine
from hpcsec.detector.engine.loader import load_rules

RULE = """
title: Weights read by a copy tool
id: 0f4c9b5e-9a77-4a43-9f0b-0f5a2b1c3d4e
status: test
summary: "{process.name} of {user.name} read {file.path}"
level: high
tags: [attack.exfiltration, attack.t1048]
logsource: {product: hpc, category: file_access}
detection:
  sel:
    process.name: [scp, rsync]
  condition: sel
"""


def _event(n, user="mallory", job="881", ts="2026-11-30T01:00:00Z", action=1, **extra):
    """Event `n` of `action`: the same action (process and file) repeated, unless told."""
    return {
        "@timestamp": ts,
        "event.id": f"e{n}",
        "event.category": "file_access",
        "event.action": "open",
        "host.name": "gpu-017",
        "hpcsec.sensor": "file_access",
        "process.name": "scp",
        "process.pid": 4000 + action,
        "user.name": user,
        "slurm.job.id": job,
        "slurm.job.account": "vision",
        "file.path": f"/models/m/{action}.bin",
        "gpu.index": 3,
        **extra,
    }


def _matches(tmp_path, events):
    path = tmp_path / "model_theft.yml"
    path.write_text(RULE)
    engine = Engine(load_rules([path]))
    return engine.evaluate(events) + engine.flush()


def test_alert_schema_fields(tmp_path):
    builder = AlertBuilder()
    builder.add(_matches(tmp_path, [_event(1)]))
    (alert,) = builder.alerts()
    assert alert["rule.id"] == "0f4c9b5e-9a77-4a43-9f0b-0f5a2b1c3d4e"
    assert alert["rule.title"] == "Weights read by a copy tool"
    assert alert["rule.level"] == "high"
    assert alert["rule.tags"] == ["attack.exfiltration", "attack.t1048"]
    assert alert["rule.vector"] == "model_theft"
    assert alert["host.name"] == "gpu-017"
    assert alert["@timestamp"] == "2026-11-30T01:00:00Z"
    assert alert["slurm.job.id"] == "881" and alert["slurm.job.account"] == "vision"
    assert alert["user.name"] == "mallory" and alert["process.pid"] == 4001
    assert alert["gpu.index"] == 3
    assert alert["file.path"] == "/models/m/1.bin"
    assert "event.action" not in alert and "hpcsec.sensor" not in alert
    assert alert["events"] == [_event(1)]
    assert alert["count"] == 1
    assert alert["alert.summary"] == "scp of mallory read /models/m/1.bin"


def test_dedup_folds_same_key_in_one_window(tmp_path):
    events = [
        _event(1),
        _event(2, ts="2026-11-30T01:01:00Z"),
        _event(3, user="eve", job="882"),
        _event(4, ts="2026-11-30T02:00:00Z"),
    ]  # another 5-minute window
    builder = AlertBuilder(window_s=300)
    builder.add(_matches(tmp_path, events))
    alerts = builder.alerts()
    assert [(a["user.name"], a["count"]) for a in alerts] == [
        ("mallory", 2),
        ("eve", 1),
        ("mallory", 1),
    ]
    first = alerts[0]
    assert [e["event.id"] for e in first["events"]] == ["e1", "e2"]
    assert first["alert.first_seen"] == "2026-11-30T01:00:00Z"
    assert first["alert.last_seen"] == "2026-11-30T01:01:00Z"
    assert len({a["alert.id"] for a in alerts}) == 3


def test_alert_id_is_stable_across_runs_and_changes_with_key(tmp_path):
    one, two = AlertBuilder(), AlertBuilder()
    one.add(_matches(tmp_path, [_event(1)]))
    two.add(_matches(tmp_path, [_event(2, ts="2026-11-30T01:02:00Z")]))  # same window and key
    assert one.alerts()[0]["alert.id"] == two.alerts()[0]["alert.id"]
    assert alert_id("r", (("user.name", "a"),), 1) != alert_id("r", (("user.name", "b"),), 1)


def test_no_dedup_gives_one_alert_per_match(tmp_path):
    builder = AlertBuilder(dedup=False)
    new = builder.add(_matches(tmp_path, [_event(1), _event(2)]))
    assert len(new) == 2 and len(builder.alerts()) == 2
    assert new[0]["alert.id"] != new[1]["alert.id"]


def test_generic_summary_and_broken_template():
    event = _event(1)
    assert summarize("T", event) == ("T: user mallory, job 881, scp[4001], /models/m/1.bin, GPU 3")
    assert summarize("T", event, "{oops").startswith("T: user mallory")


def test_sort_puts_most_severe_first():
    alerts = [
        Alert({"rule.level": "low", "@timestamp": "1"}),
        Alert({"rule.level": "critical", "@timestamp": "2"}),
        Alert({"rule.level": "bogus", "@timestamp": "0"}),
    ]
    assert [a["rule.level"] for a in sort_alerts(alerts)] == ["critical", "low", "bogus"]
    assert level_rank("bogus") == level_rank("informational") == 0


def test_folding_makes_new_values_and_leaves_emitted_alerts_alone(tmp_path):
    builder = AlertBuilder(window_s=300)
    (emitted,) = builder.add(_matches(tmp_path, [_event(1)]))
    assert builder.add(_matches(tmp_path, [_event(2)])) == []
    (current,) = builder.alerts()
    assert (emitted["count"], current["count"]) == (1, 2)
    assert [e["event.id"] for e in emitted["events"]] == ["e1"]
    assert current["alert.id"] == emitted["alert.id"]
    with pytest.raises(TypeError, match="immutable"):
        emitted["count"] = 5
    with pytest.raises(TypeError, match="immutable"):
        emitted.update(count=5)
    assert orjson.dumps(current) == orjson.dumps(dict(current))  # what outputs serialize


def test_correlation_firings_of_one_group_fold_within_the_dedup_window(tmp_path):
    from hpcsec.detector.engine.evaluate import Match

    (match,) = _matches(tmp_path, [_event(1)])
    group = (("user.name", "mallory"),)
    firings = [
        Match(
            match.rule,
            (_event(n, ts=f"2026-11-30T01:00:{n}0Z"),),
            group,
            f"2026-11-30T01:00:{n}0Z",
            5.0,
        )
        for n in range(4)
    ]
    later = Match(
        match.rule, (_event(9, ts="2026-11-30T03:00:00Z"),), group, "2026-11-30T03:00:00Z", 7.0
    )
    builder = AlertBuilder(window_s=300)
    builder.add([*firings, later])
    alerts = builder.alerts()
    assert [a["count"] for a in alerts] == [4, 1]
    assert alerts[0]["alert.group"] == {"user.name": "mallory"}
    assert alerts[0]["alert.value"] == 5.0 and alerts[1]["alert.value"] == 7.0


def test_summary_shows_a_short_command_line():
    event = _event(1, **{"process.command_line": "scp -r /models/m " + "x" * 100})
    text = summarize("T", event)
    assert "`scp -r /models/m xxx" in text and text.endswith("…`, /models/m/1.bin, GPU 3")


def test_correlation_note_says_what_was_counted():
    from types import SimpleNamespace

    from sigma.correlations import SigmaCorrelationType

    from hpcsec.detector.alerts.builder import correlation_note

    rule = SimpleNamespace(
        type=SigmaCorrelationType.VALUE_COUNT,
        condition=SimpleNamespace(fieldref="file.path"),
        timespan=SimpleNamespace(spec="5m"),
    )
    assert correlation_note(rule, 40.0) == " (40 distinct file.path in 5m)"
    rule.type = SigmaCorrelationType.EVENT_COUNT
    assert correlation_note(rule, 3.0) == " (3 events in 5m)"
    rule.type = SigmaCorrelationType.TEMPORAL
    assert correlation_note(rule, None) == ""


def test_first_and_last_seen_follow_event_time_not_arrival_order(tmp_path):
    from hpcsec.detector.engine.evaluate import Match

    (match,) = _matches(tmp_path, [_event(1)])
    group = (("user.name", "mallory"),)
    late = Match(
        match.rule,
        (_event(1, ts="2026-11-30T01:02:00Z"), _event(2, ts="2026-11-30T01:04:00Z")),
        group,
        "2026-11-30T01:02:00Z",
        2.0,
    )
    early = Match(
        match.rule, (_event(3, ts="2026-11-30T01:01:00Z"),), group, "2026-11-30T01:01:00Z", 1.0
    )
    builder = AlertBuilder(window_s=300)
    builder.add([late, early])
    (alert,) = builder.alerts()
    assert alert["alert.first_seen"] == "2026-11-30T01:01:00Z"
    assert alert["alert.last_seen"] == "2026-11-30T01:04:00Z"
    assert alert["count"] == 2


def test_a_huge_value_from_the_node_is_cut_in_the_summary_not_in_the_event():
    # the table wraps the summary: a 3 MB `rdma.device` took 19 s and 15 MB of terminal
    from hpcsec.detector.alerts.builder import FACT_CHARS, SUMMARY_CHARS

    huge = "a" * 3_000_000
    event = {"rdma.device": huge, "file.path": "/p" + "x" * 500, "user.name": "u" * 500}
    line = summarize("RDMA probe", event)
    assert len(line) <= 4 * FACT_CHARS
    every = {
        **event,
        **{k: "v" * 500 for k in ("slurm.job.id", "process.name", "process.command_line")},
        **{k: "v" * 500 for k in ("destination.ip", "gpu.index", "firmware.component")},
    }
    assert len(summarize("t", every)) == SUMMARY_CHARS  # nine facts: the line is cut too
    assert f"user {'u' * (FACT_CHARS - 1)}…," in line
    assert "/p" + "x" * (FACT_CHARS - 3) + "…" in line
    templated = summarize("t", event, "{rdma.device} on {user.name}")
    assert len(templated) == SUMMARY_CHARS and templated.endswith("…")
    assert event["rdma.device"] is huge

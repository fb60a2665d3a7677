"""Incidents: which alerts share an `incident.id`, on hand-made alerts and on the demo."""

from __future__ import annotations

import json

from hpcsec.detector.alerts.incidents import (
    INCIDENT_FIELD,
    IncidentTracker,
    summarize_incidents,
)
from hpcsec.detector.alerts.model import Alert
from hpcsec.detector.cli.main import main


def _alert(aid: str, ts: str = "2026-11-30T01:00:00Z", events=None, **fields) -> Alert:
    return Alert(
        {
            "alert.id": aid,
            "@timestamp": ts,
            "rule.id": f"rule-{aid}",
            "rule.title": f"title {aid}",
            "rule.level": fields.pop("level", "high"),
            "rule.vector": fields.pop("vector", "gpu_hijack"),
            "host.name": fields.pop("host", "gpu-017"),
            "alert.first_seen": ts,
            "alert.last_seen": ts,
            "events": [{"event.id": e} for e in (events or [f"ev-{aid}"])],
            "count": 1,
            **fields,
        }
    )


def _ids(alerts: list[Alert]) -> list[str]:
    return [a[INCIDENT_FIELD] for a in alerts]


def test_same_job_is_one_incident_whoever_the_user():
    tagged = IncidentTracker().tag(
        [
            _alert("a", **{"slurm.job.id": "4242", "user.name": "alice", "process.pid": 1}),
            _alert("b", **{"slurm.job.id": "4242", "user.name": "mallory", "process.pid": 9}),
            _alert("c", **{"slurm.job.id": "4243", "user.name": "alice", "process.pid": 1}),
        ]
    )
    assert tagged[0][INCIDENT_FIELD] == tagged[1][INCIDENT_FIELD] != tagged[2][INCIDENT_FIELD]


def test_without_a_job_user_and_process_group_and_unrelated_users_do_not():
    tagged = IncidentTracker().tag(
        [
            _alert("a", **{"user.name": "mallory", "process.pid": 51000}),
            _alert("b", **{"user.name": "mallory", "process.pid": 51000}, vector="rdma_abuse"),
            _alert("c", **{"user.name": "mallory", "process.pid": 51001}),
            _alert("d", **{"user.name": "eve", "process.pid": 51000}),
            _alert("e", **{"user.name": "eve"}),
            _alert("f", **{"user.name": "eve"}),
        ]
    )
    a, b, c, d, e, f = _ids(tagged)
    assert a == b
    assert len({a, c, d, e}) == 4
    assert e == f  # the user alone when no process is named


def test_a_correlation_joins_the_incident_of_its_steps_in_either_order():
    # the step names a user and a process; the correlation (grouped by device) names neither:
    # only the shared evidence event ties them
    step = _alert("step", events=("ev-1", "ev-2"), **{"user.name": "bob", "process.pid": 7})
    corr = _alert("corr", events=("ev-2",), **{"rule.kind": "correlation"}, vector="rdma_abuse")
    unrelated = _alert("other", events=("ev-9",), vector="rdma_abuse")
    forward = IncidentTracker().tag([step, corr, unrelated])
    assert forward[0][INCIDENT_FIELD] == forward[1][INCIDENT_FIELD] != forward[2][INCIDENT_FIELD]
    backward = IncidentTracker().tag([corr, step])
    assert backward[0][INCIDENT_FIELD] == backward[1][INCIDENT_FIELD]


def test_ids_are_deterministic_and_an_incident_ends_after_a_quiet_window():
    later = "2026-11-30T03:30:00Z"  # more than an hour after the last alert
    alerts = [
        _alert("a", **{"user.name": "eve"}),
        _alert("b", ts="2026-11-30T01:50:00Z", **{"user.name": "eve"}),
        _alert("c", ts=later, **{"user.name": "eve"}),
    ]
    first, second = IncidentTracker().tag(alerts), IncidentTracker().tag(alerts)
    assert _ids(first) == _ids(second)
    a, b, c = _ids(first)
    assert a == b != c


def test_a_grown_alert_keeps_its_incident_and_summaries_count_per_incident():
    tracker = IncidentTracker()
    (one,) = tracker.tag([_alert("a", **{"user.name": "eve"})])
    (grown,) = tracker.tag([one.evolve({"count": 5, "user.name": "someone-else"})])
    assert grown[INCIDENT_FIELD] == one[INCIDENT_FIELD]
    other = tracker.tag([_alert("z", level="critical", **{"user.name": "zed"})])
    (top, low) = summarize_incidents([grown, *other])
    assert (top.users, top.level, top.count) == (("zed",), "critical", 1)
    assert (low.users, low.count, len(low.alerts)) == (("someone-else",), 5, 1)


def test_demo_miner_alerts_share_one_incident_and_other_users_have_their_own(capsys):
    assert main(["scan", "--demo", "--format", "json"]) == 1
    alerts = json.loads(capsys.readouterr().out)
    assert all(a.get(INCIDENT_FIELD) for a in alerts)
    miner = {a[INCIDENT_FIELD] for a in alerts if a.get("process.pid") == 51000}
    miner_alerts = [a for a in alerts if a.get("process.pid") == 51000]
    assert len(miner_alerts) >= 3 and len(miner) == 1
    kinds = {a["rule.kind"] for a in miner_alerts}
    assert kinds == {"detection", "correlation"}  # the correlation is in its steps' incident
    by_user = {
        a["user.name"]: a[INCIDENT_FIELD]
        for a in alerts
        if not a.get("slurm.job.id") and a.get("user.name")
    }
    assert by_user["mallory"] != by_user["root"]
    jobs = {a["slurm.job.id"]: a[INCIDENT_FIELD] for a in alerts if a.get("slurm.job.id")}
    assert jobs["4242"] != jobs["4260"] and miner.isdisjoint(jobs.values())


def test_scan_incidents_prints_one_row_per_incident(capsys):
    assert main(["scan", "--demo", "--incidents", "--format", "json"]) == 1
    rows = json.loads(capsys.readouterr().out)
    miner = [r for r in rows if r["user.name"] == ["mallory"] and not r["slurm.job.id"]]
    assert len(miner) == 1
    assert miner[0]["rule.level"] == "critical" and miner[0]["incident.alerts"] >= 3
    assert miner[0]["rule.vector"] == ["gpu_hijack"]
    assert len({r["incident.id"] for r in rows}) == len(rows)
    # --format jsonl: the same rows, one JSON object per line
    assert main(["scan", "--demo", "--incidents", "--format", "jsonl"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert [json.loads(line) for line in lines] == rows


def test_the_stage_tags_new_grown_and_forgotten_alerts_as_the_agent_sees_them(tmp_path):
    from hpcsec.detector.alerts.stage import AlertStage
    from hpcsec.detector.config.site import SiteConfig
    from hpcsec.detector.core.schema import parse_time
    from tests.detector.alerts.test_alert_builder import _event, _matches

    now = [parse_time("2026-11-30T01:00:30Z").timestamp()]
    stage = AlertStage(SiteConfig(dedup_window_s=300), clock=lambda: now[0])
    (alice,) = stage.fold(_matches(tmp_path, [_event(1, user="alice", job="881")]))
    (other,) = stage.fold(_matches(tmp_path, [_event(2, user="bob", job="882")]))
    assert alice[INCIDENT_FIELD] != other[INCIDENT_FIELD]
    assert stage.fold(_matches(tmp_path, [_event(3, user="alice", job="881")])) == []
    grown = next(a for a in stage.current() if a["alert.id"] == alice["alert.id"])
    assert (grown["count"], grown[INCIDENT_FIELD]) == (2, alice[INCIDENT_FIELD])
    now[0] += 300
    assert stage.rotate() == []  # the first window is now the previous one
    now[0] += 300
    forgotten = stage.rotate()  # and now forgotten: its final values, with their incidents
    assert {(a["alert.id"], a[INCIDENT_FIELD]) for a in forgotten} == {
        (alice["alert.id"], alice[INCIDENT_FIELD]),
        (other["alert.id"], other[INCIDENT_FIELD]),
    }

"""Silences and per-rule rate limits: stored not sent, and summed up, never silently lost."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hpcsec.detector.alerts.suppression import RATE_LIMIT_RULE_ID, Suppressor
from hpcsec.detector.config.site import Silence, SiteConfig

T0 = datetime(2026, 11, 30, 1, 0, 10, tzinfo=UTC)


class Clock:
    def __init__(self, now: datetime):
        self.now = now

    def __call__(self) -> datetime:
        return self.now


def alert(n: int, rule: str = "r1", level: str = "medium", **fields) -> dict:
    return {
        "alert.id": f"a{n}",
        "rule.id": rule,
        "rule.title": f"Title {rule}",
        "rule.level": level,
        "rule.tags": ["attack.t1020"],
        "rule.vector": "model_theft",
        "host.name": "gpu-001",
        "@timestamp": "2026-11-30T01:00:05.000Z",
        **fields,
    }


def test_silences_match_every_given_field_and_expire():
    clock = Clock(T0)
    silences = (
        Silence(rule_id="r1", job="42", expires=T0 + timedelta(hours=1), comment="known job"),
        Silence(host="gpu-00*", user="alice"),
    )
    sup = Suppressor(silences, clock=clock)
    batch = [
        alert(1, **{"slurm.job.id": "42"}),
        alert(2, **{"slurm.job.id": "43"}),
        alert(3, rule="r2", **{"user.name": "alice"}),
        alert(4, **{"user.name": "bob"}),
    ]
    d = sup.apply(batch)
    assert [a["alert.id"] for a in d.send] == ["a2", "a4"]
    assert [(a["alert.id"], s.comment) for a, s in d.silenced] == [("a1", "known job"), ("a3", "")]
    clock.now = T0 + timedelta(hours=1)  # the first silence has expired
    d = sup.apply(batch)
    assert [a["alert.id"] for a in d.send] == ["a1", "a2", "a4"]


def test_rate_limit_sends_a_summary_when_the_minute_is_over():
    clock = Clock(T0)
    sup = Suppressor.from_config(SiteConfig(rate_limit_per_rule=2), clock=clock)
    d = sup.apply([alert(i) for i in range(5)] + [alert(9, rule="r2")])
    assert [a["alert.id"] for a in d.send] == ["a0", "a1", "a9"]
    assert [a["alert.id"] for a in d.rate_limited] == ["a2", "a3", "a4"]
    assert d.summaries == []
    d = sup.apply([alert(5, level="high")])  # same minute: still over the limit
    assert d.send == [] and [a["alert.id"] for a in d.rate_limited] == ["a5"]

    clock.now = T0 + timedelta(seconds=60)
    d = sup.apply([alert(6)])
    (summary,) = d.summaries
    assert d.send == [summary, alert(6)]
    assert summary["rule.id"] == RATE_LIMIT_RULE_ID
    assert summary["rule.title"] == "Rate limit: 4 alerts suppressed"
    assert summary["rule.level"] == "high"  # the highest level among the suppressed
    assert summary["count"] == 4
    assert summary["hpcsec.suppressed.rule_id"] == "r1"
    assert summary["hpcsec.suppressed.alert_ids"] == ["a2", "a3", "a4", "a5"]
    assert summary["@timestamp"] == "2026-11-30T01:00:00.000Z"
    assert summary["host.name"] == "gpu-001"
    assert summary["alert.summary"] == (
        "4 alerts suppressed by the rate limit of rule r1 (Title r1) in the minute from "
        "2026-11-30T01:00:00.000Z; they are in the alert store"
    )
    assert summary["events"] == [] and len(summary["alert.id"]) == 32


def test_finish_flushes_open_windows_and_silenced_alerts_are_not_counted():
    clock = Clock(T0)
    sup = Suppressor((Silence(user="svc"),), rate_limit_per_rule=1, clock=clock)
    d = sup.apply([alert(1), alert(2), alert(3, **{"user.name": "svc"})])
    assert [a["alert.id"] for a in d.send] == ["a1"]
    assert [a["alert.id"] for a in d.rate_limited] == ["a2"]
    (summary,) = sup.finish()
    assert summary["count"] == 1
    assert sup.finish() == []


def test_no_limit_sends_everything_and_reconfigure_applies_new_silences():
    clock = Clock(T0)
    sup = Suppressor(clock=clock)
    assert len(sup.apply([alert(i) for i in range(50)]).send) == 50
    sup.reconfigure(SiteConfig(silences=(Silence(rule_id="r*"),), rate_limit_per_rule=3))
    d = sup.apply([alert(1)])
    assert d.send == [] and len(d.silenced) == 1

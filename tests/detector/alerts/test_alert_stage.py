"""The alert stage scan and agent share: dedup, then silences and rate limits; a scan decides
once at the end, the agent as alerts appear. Alerts already handed on never change."""

from __future__ import annotations

from hpcsec.detector.alerts.stage import AlertStage
from hpcsec.detector.alerts.suppression import RATE_LIMIT_RULE_ID
from hpcsec.detector.config.site import Silence, SiteConfig
from hpcsec.detector.core.schema import parse_time
from tests.detector.alerts.test_alert_builder import _event, _matches

T0 = parse_time("2026-11-30T01:00:00Z").timestamp()


def test_a_scan_decides_once_over_the_folded_alerts_with_a_summary(tmp_path):
    config = SiteConfig(rate_limit_per_rule=1, silences=(Silence(user="eve"),))
    stage = AlertStage(config)
    (first,) = stage.fold(_matches(tmp_path, [_event(1)]))
    events = [_event(2), _event(3, user="bob"), _event(4, user="eve")]
    assert len(stage.fold(_matches(tmp_path, events))) == 2  # bob and eve are new
    decision = stage.conclude()
    sent, summary = decision.send
    assert (sent["alert.id"], sent["count"], first["count"]) == (first["alert.id"], 2, 1)
    assert summary["rule.id"] == RATE_LIMIT_RULE_ID and summary["count"] == 1
    assert [a["user.name"] for a in decision.rate_limited] == ["bob"]
    assert [(a["user.name"], s.user) for a, s in decision.silenced] == [("eve", "eve")]


def test_without_dedup_every_match_is_an_alert(tmp_path):
    stage = AlertStage(SiteConfig(), dedup=False)
    stage.fold(_matches(tmp_path, [_event(1), _event(2)]))
    assert [a["count"] for a in stage.conclude().send] == [1, 1]


def test_the_agent_decides_as_alerts_appear_and_forgets_ended_windows(tmp_path):
    now = [T0 + 30]
    stage = AlertStage(SiteConfig(dedup_window_s=300), clock=lambda: now[0])
    decision = stage.decide(stage.fold(_matches(tmp_path, [_event(1)])))
    (emitted,) = decision.send
    assert stage.fold(_matches(tmp_path, [_event(2)])) == []  # folded: nothing to decide
    assert stage.rotate() == []
    now[0] = T0 + 301
    assert stage.rotate() == []  # the ended window may still get late matches
    now[0] = T0 + 601
    (final,) = stage.rotate()
    assert (final["alert.id"], final["count"], emitted["count"]) == (emitted["alert.id"], 2, 1)
    assert stage.current() == []


def test_a_new_dedup_window_hands_back_the_open_alerts(tmp_path):
    stage = AlertStage(SiteConfig(dedup_window_s=300), clock=lambda: T0)
    stage.fold(_matches(tmp_path, [_event(1), _event(2)]))
    assert stage.reconfigure(SiteConfig(dedup_window_s=300, rate_limit_per_rule=5)) == []
    assert stage.suppressor.rate_limit == 5
    (handed_back,) = stage.reconfigure(SiteConfig(dedup_window_s=60))
    assert handed_back["count"] == 2 and stage.current() == []

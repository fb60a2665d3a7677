"""Matches later than the agent's correlation lateness allowance: counted, reported as a
`late_events` status event, and alerted by the bundled self-health rule."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson

from hpcsec.detector.core.schema import status_event
from hpcsec.detector.core.timefmt import rfc3339
from hpcsec.detector.engine.loader import bundled_rules_dir
from hpcsec.detector.runtime.agent import Agent, AgentSettings
from hpcsec.detector.runtime.pipeline import SourceBatch
from tests.detector.runtime.agent_harness import Node

LATE_RULE = "0c5e8b27-4d1a-4f93-b6e2-9a7d3f1c5b48"  # Events arrived too late to correlate


def _sensor_error(hours_ago: float):
    # a failed sample feeds the bundled "Sensor down for several samples" correlation
    when = rfc3339(datetime.now(UTC) - timedelta(hours=hours_ago))
    return status_event("gpu", "error", "NVMLError: Unknown Error", "n1", when)


def test_a_match_older_than_the_allowance_raises_the_late_events_alert(tmp_path: Path):
    node = Node(tmp_path)
    node.config.write_text("correlation_lateness_s: 60\n")
    out = node.root / "alerts.jsonl"
    agent = Agent(
        AgentSettings(
            config_path=str(node.config),
            rule_paths=(str(bundled_rules_dir() / "self_health.yml"),),
            default_rules=False,
            outputs=(f"file://{out}",),
            etc_root=str(node.etc),
            host_name="n1",
        )
    )
    try:
        # an hour old: past the 60 s allowance on the agent's clock, so handed on at once
        agent._process([SourceBatch([_sensor_error(1)], None)])
        assert agent.gen.pipeline.engine.take_late() == 0
        # older than what the correlations already saw: late, not correlated
        agent._process([SourceBatch([_sensor_error(2), _sensor_error(2.5)], None)])
        agent._process([])  # the next turn reports what the last one counted
        agent.sink.drain(0)
    finally:
        agent._close_outputs()
    alerts = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    (late,) = [a for a in alerts if a["rule.id"] == LATE_RULE]
    (event,) = late["events"]
    assert (event["hpcsec.sensor"], event["event.action"]) == ("engine", "late_events")
    assert event["hpcsec.late_events"] == 2
    assert late["host.name"] == "n1"
    assert agent.gen.pipeline.engine.take_late() == 0  # taken once, not reported again

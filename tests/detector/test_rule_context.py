"""Rule context in alerts: description, false positives, references, response, technique names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcsec.detector.alerts.builder import AlertBuilder, summarize
from hpcsec.detector.cli.main import main
from hpcsec.detector.engine.context import (
    classify_tag,
    rule_context,
    technique_table,
    techniques_and_tactics,
)
from hpcsec.detector.engine.evaluate import Engine
from hpcsec.detector.engine.lint import check_paths
from hpcsec.detector.engine.loader import load_rules
from hpcsec.detector.outputs.rfc5424 import DEFAULT_MAX_BYTES, format_message

RULE_WITHOUT_RESPONSE = """
title: Miner process
id: 6a1d2c3b-4e5f-4a6b-8c7d-9e0f1a2b3c4d
status: test
description: a miner
level: critical
tags: [attack.impact, attack.t1496]
logsource: {product: hpc, category: process}
detection:
  sel:
    process.name: xmrig
  condition: sel
"""
BASE_AND_CORRELATION = """
title: Miner seen (base)
name: miner_seen
id: 7b2d3c4b-4e5f-4a6b-8c7d-9e0f1a2b3c4d
status: test
description: base
level: low
tags: [attack.impact]
logsource: {product: hpc, category: process}
detection:
  sel:
    process.name: xmrig
  condition: sel
---
title: Many miners
id: 8c3e4d5c-4e5f-4a6b-8c7d-9e0f1a2b3c4d
status: test
description: many
level: high
tags: [attack.impact]
response: Cancel the job.
correlation:
  type: event_count
  rules: [miner_seen]
  group-by: [host.name]
  timespan: 1m
  condition: {gte: 3}
"""


def test_tags_get_names_from_the_bundled_table():
    techniques, tactics = techniques_and_tactics(
        ["attack.impact", "attack.t1496", "atlas.aml.t0034", "attack.t1496", "cve.2024-1"]
    )
    assert techniques == [
        {"id": "T1496", "name": "Resource Hijacking"},
        {"id": "AML.T0034", "name": "Cost Harvesting"},
    ]
    assert tactics == [{"id": "TA0040", "name": "Impact"}]
    assert classify_tag("attack.t9999") == ("technique", {"id": "T9999", "name": None})
    assert classify_tag("attack.g0001") is None


def test_every_bundled_technique_tag_has_a_name():
    for rule in load_rules(None, with_tests=False).rules:
        techniques, tactics = techniques_and_tactics(rule.sigma.tags or [])
        for entry in techniques + tactics:
            assert entry["name"], (rule.id, entry)


def test_technique_table_is_package_data():
    pyproject = (Path(__file__).parents[2] / "pyproject.toml").read_text()
    assert '"techniques.json"' in pyproject
    assert technique_table()["attack_techniques"]["T1496"] == "Resource Hijacking"


def test_every_alerting_bundled_rule_has_a_one_line_response():
    ruleset = load_rules(None, with_tests=False)
    findings = [f for f in check_paths(None) if f.code == "missing-response"]
    assert findings == []
    responses = [rule_context(r.sigma)["rule.response"] for r in ruleset.rules]
    assert sum(1 for r in responses if r) >= 40
    assert all("\n" not in r for r in responses if r)


def test_check_flags_an_alerting_rule_without_response(tmp_path, capsys):
    (tmp_path / "r.yml").write_text(RULE_WITHOUT_RESPONSE)
    assert main(["rules", "check", "--strict", str(tmp_path)]) == 2
    out = capsys.readouterr().out
    assert "rule has no response note" in out and "[missing-response]" in out


def test_a_rule_that_only_feeds_a_correlation_needs_no_response(tmp_path):
    (tmp_path / "r.yml").write_text(BASE_AND_CORRELATION)
    codes = [(f.line, f.code) for f in check_paths([tmp_path])]
    assert not any(code == "missing-response" for _, code in codes), codes


def test_check_warns_on_a_technique_the_table_does_not_name(tmp_path):
    (tmp_path / "r.yml").write_text(RULE_WITHOUT_RESPONSE.replace("t1496", "t1999"))
    assert any(f.code == "unknown-technique" for f in check_paths([tmp_path]))


def _demo_alerts(capsys) -> list[dict]:
    assert main(["scan", "--demo", "--format", "json"]) == 1
    return json.loads(capsys.readouterr().out)


def test_demo_alerts_carry_the_rules_context(capsys):
    alerts = _demo_alerts(capsys)
    miner = next(a for a in alerts if a["rule.title"] == "Cryptocurrency miner process")
    assert miner["rule.description"].startswith("A process whose name is a known")
    assert "scancel" in miner["rule.response"]
    assert miner["rule.falsepositives"] and miner["rule.references"]
    assert {"id": "T1496", "name": "Resource Hijacking"} in miner["rule.techniques"]
    assert {"id": "TA0040", "name": "Impact"} in miner["rule.tactics"]
    assert all(a.get("rule.response") for a in alerts if a["rule.vector"] != "hpcsec")


def test_context_fits_a_syslog_record_without_cutting_it(capsys):
    """Evidence events are left out first (outputs/fit.py); the context must then fit whole."""
    for alert in _demo_alerts(capsys):
        message = format_message(alert, hostname="n1", procid=1, max_bytes=DEFAULT_MAX_BYTES)
        assert len(message) <= DEFAULT_MAX_BYTES
        body = json.loads(message[message.index(b"{") :])
        assert "cut " not in body.get("rule.response", ""), alert["rule.title"]
        assert body.get("rule.techniques") == alert["rule.techniques"]


def test_builder_recomputes_context_when_a_reload_changes_the_rule(tmp_path):
    (tmp_path / "r.yml").write_text(RULE_WITHOUT_RESPONSE)
    builder = AlertBuilder()
    event = {
        "@timestamp": "2026-11-30T01:00:00Z",
        "event.category": "process",
        "process.name": "xmrig",
        "host.name": "n1",
    }
    first = builder.add(Engine(load_rules([tmp_path], with_tests=False)).evaluate([event]))
    assert first[0]["rule.response"] is None
    (tmp_path / "r.yml").write_text(RULE_WITHOUT_RESPONSE + "response: Cancel it.\n")
    later = dict(event, **{"@timestamp": "2026-11-30T02:00:00Z"})
    second = builder.add(Engine(load_rules([tmp_path], with_tests=False)).evaluate([later]))
    assert second[0]["rule.response"] == "Cancel it."


@pytest.mark.parametrize(
    ("template", "event", "expected"),
    [
        ("{b:bytes}", {"b": 3 * 1024**3}, "3 GiB"),
        ("{b:bytes}", {"b": 1536}, "1.5 KiB"),
        ("{b:bytes}", {"b": 100}, "100 B"),
        ("{b/s:bytes}/s", {"b": 2 * 1024**3, "s": 10}, "205 MiB/s"),
        ("{b/s:bytes}/s", {"b": 2 * 1024**3, "s": 0}, "?/s"),
        ("{b/s:bytes}/s", {"b": "x", "s": 2}, "?/s"),
        ("{b:bytes}", {"b": "hostile text"}, "hostile text"),  # from a node: shown as it is
        ("{b:,.0f}", {}, "?"),  # a missing field with a number spec keeps the template
    ],
)
def test_summary_templates_format_bytes_and_rates(template, event, expected):
    assert summarize("T", event, template) == expected


def test_rdma_bulk_transfer_summary_has_bytes_rate_source_and_destination():
    ruleset = load_rules(None)
    rule = next(r for r in ruleset.rules if r.sigma.title.startswith("One-sided RDMA bulk"))
    event = {
        "@timestamp": "2026-11-30T01:00:00Z",
        "event.category": "roce_flow",
        "host.name": "gpu01",
        "source.ip": "10.0.0.5",
        "destination.ip": "10.9.9.9",
        "destination.is_job_node": False,
        "rdma.qp.dqpn": 77,
        "rdma.flow.read_bytes": 4 * 1024**3,
        "rdma.flow.write_bytes": 0,
        "rdma.flow.interval_s": 10.0,
        "network.bytes": 4 * 1024**3,
    }
    matches = [m for m in Engine(ruleset).evaluate([event]) if m.rule.id == rule.id]
    summary = AlertBuilder().add(matches)[0]["alert.summary"]
    assert "10.0.0.5 -> 10.9.9.9" in summary
    assert "4 GiB" in summary and "410 MiB/s" in summary


def test_rules_show_prints_one_rules_card(capsys):
    assert main(["rules", "show", "cryptocurrency MINER"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(
        "Cryptocurrency miner process\n  id: 743946f7-19b5-40ca-97f8-197cf6f01537"
    )
    for part in (
        "level: critical   vector: gpu_hijack   status: experimental",
        "T1496 Resource Hijacking",
        "AML.T0034 Cost Harvesting",
        "false positives:\n  - Security research on miners",
        "references:\n  - https://attack.mitre.org/techniques/T1496/",
        "response:\n  Confirm the binary",
        "detection:\n  name:\n  - process.name|expand: '%miner_names%'\n"
        "  - process.executable_name|expand",
        "test events: ",
    ):
        assert part in out, part
    assert main(["rules", "show", "743946f7-19b5-40ca-97f8-197cf6f01537"]) == 0
    assert capsys.readouterr().out == out


def test_rules_show_correlation_and_errors(capsys):
    assert main(["rules", "show", "RDMA rkey probing (remote access errors per minute)"]) == 0
    assert "correlation:\n  type: value_sum" in capsys.readouterr().out
    assert main(["rules", "show", "RDMA"]) == 2
    assert "names 8 rules" in capsys.readouterr().err
    assert main(["rules", "show", "no such rule"]) == 2
    assert "no rule with id or title" in capsys.readouterr().err


def test_rules_show_does_not_obey_control_bytes_in_a_rule(tmp_path, capsys):
    hostile = RULE_WITHOUT_RESPONSE.replace("a miner", '"\\e[2J\\e]0;pwned\\a"')
    (tmp_path / "r.yml").write_text(hostile)
    assert main(["rules", "show", "Miner", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out


def test_rules_list_json_and_table_carry_the_context(capsys):
    assert main(["rules", "list", "--format", "json"]) == 0
    rows = {r["title"]: r for r in json.loads(capsys.readouterr().out)}
    miner = rows["Cryptocurrency miner process"]
    assert miner["description"].startswith("A process whose name")
    assert miner["falsepositives"] and miner["references"] and "scancel" in miner["response"]
    assert {"id": "T1496", "name": "Resource Hijacking"} in miner["techniques"]
    assert main(["rules", "list"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "miner process" in x)
    assert line.rstrip().endswith("T1496 Resource Hijacking, AML.T0034 Cost Harvesting")

from pathlib import Path

import pytest

from hpcsec.detector.core import schema


def test_docs_field_table_is_generated_from_the_schema():
    docs = Path(__file__).parents[2] / "docs" / "fields.md"
    assert docs.read_text() == schema.fields_markdown(), (
        "docs/fields.md is stale: python -m hpcsec.detector.core.schema > docs/fields.md"
    )


def test_new_event_has_the_common_fields_and_a_stable_id():
    a = schema.new_event(
        "process",
        "sample",
        "process",
        "gpu-017",
        "2026-11-30T01:00:00.000Z",
        {"process.pid": 42, "process.name": None},
    )
    b = schema.new_event(
        "process", "sample", "process", "gpu-017", "2026-11-30T01:00:00.000Z", {"process.pid": 42}
    )
    for key in (
        "@timestamp",
        "event.id",
        "event.kind",
        "event.category",
        "event.action",
        "host.name",
        "hpcsec.sensor",
    ):
        assert key in a
    assert "process.name" not in a  # None values are left out: rules test absence with null
    assert a["event.id"] == b["event.id"]
    c = schema.new_event(
        "process", "sample", "process", "gpu-017", "2026-11-30T01:00:00.000Z", {"process.pid": 43}
    )
    assert c["event.id"] != a["event.id"]


def test_known_fields_include_namespaces():
    assert schema.is_known_field("rdma.counters.port_rcv_data")
    assert schema.is_known_field("slurm.job.id")
    assert not schema.is_known_field("slurm.jobid")


def test_time_round_trip():
    moment = schema.parse_time("2026-11-30T01:02:03.456Z")
    assert schema.rfc3339(moment) == "2026-11-30T01:02:03.456Z"
    assert schema.parse_time("2026-11-30T02:02:03+01:00") == schema.parse_time(
        "2026-11-30T01:02:03Z"
    )
    for bad in ("yesterday", 1764464523, None, ["2026-11-30T01:02:03Z"]):
        with pytest.raises(ValueError):
            schema.parse_time(bad)


def test_field_table_rows_have_their_columns():
    """A `|` in a description (`tcp | udp`) must not split a Markdown table cell."""
    import re

    header_cells = 0
    for line in schema.fields_markdown().splitlines():
        if not line.startswith("|"):
            header_cells = 0
            continue
        cells = len(re.split(r"(?<!\\)\|", line)) - 2
        header_cells = header_cells or cells
        assert cells == header_cells, line
    assert "| `rule.level` | keyword | informational \\| low \\| medium" in schema.fields_markdown()


def test_every_key_an_alert_carries_is_documented():
    from hpcsec.detector.alerts.builder import AlertBuilder
    from hpcsec.detector.engine.evaluate import Engine
    from hpcsec.detector.engine.loader import load_rules

    rules = load_rules([Path(__file__).parents[2] / "fixtures" / "rules" / "valid"])
    events = [
        {
            "@timestamp": f"2026-11-30T01:0{i}:00Z",
            "event.category": "gpu_process",
            "host.name": "gpu-001",
            "process.name": "xmrig",
            "user.name": "mallory",
            "user.is_system": False,
        }
        for i in range(3)
    ]
    engine = Engine(rules)
    builder = AlertBuilder()
    builder.add(engine.evaluate(events) + engine.flush())
    alerts = builder.alerts()
    assert {a["rule.kind"] for a in alerts} == {"detection", "correlation"}
    documented = {f.name for f in schema.ALERT_FIELDS}
    for alert in alerts:
        extra = {
            k
            for k in alert
            if k not in documented and not k.startswith(schema.ALERT_COPIED_PREFIXES)
        }
        assert extra == set(), alert["rule.title"]

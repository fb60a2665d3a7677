"""The field catalog and the docs/fields.md generated from it."""

from pathlib import Path

from hpcsec.detector.core import fields, fieldsdoc


def test_docs_field_table_is_generated_from_the_schema():
    docs = Path(__file__).parents[3] / "docs" / "fields.md"
    assert docs.read_text() == fieldsdoc.fields_markdown(), (
        "docs/fields.md is stale: python -m hpcsec.detector.core.fieldsdoc > docs/fields.md"
    )


def test_known_fields_include_namespaces():
    assert fields.is_known_field("rdma.counters.port_rcv_data")
    assert fields.is_known_field("slurm.job.id")
    assert not fields.is_known_field("slurm.jobid")


def test_field_table_rows_have_their_columns():
    """A `|` in a description (`tcp | udp`) must not split a Markdown table cell."""
    import re

    header_cells = 0
    for line in fieldsdoc.fields_markdown().splitlines():
        if not line.startswith("|"):
            header_cells = 0
            continue
        cells = len(re.split(r"(?<!\\)\|", line)) - 2
        header_cells = header_cells or cells
        assert cells == header_cells, line
    row = "| `rule.level` | keyword | informational \\| low \\| medium"
    assert row in fieldsdoc.fields_markdown()


def test_every_key_an_alert_carries_is_documented():
    from hpcsec.detector.alerts.builder import AlertBuilder
    from hpcsec.detector.engine.evaluate import Engine
    from hpcsec.detector.engine.loader import load_rules

    rules = load_rules([Path(__file__).parents[3] / "fixtures" / "rules" / "valid"])
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
    documented = {f.name for f in fields.ALERT_FIELDS}
    for alert in alerts:
        extra = {
            k
            for k in alert
            if k not in documented and not k.startswith(fields.ALERT_COPIED_PREFIXES)
        }
        assert extra == set(), alert["rule.title"]

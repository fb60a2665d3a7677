from pathlib import Path

from hpcsec.detector import schema


def test_docs_field_table_is_generated_from_the_schema():
    docs = Path(__file__).parents[2] / "docs" / "fields.md"
    assert docs.read_text() == schema.fields_markdown(), (
        "docs/fields.md is stale: python -m hpcsec.detector.schema > docs/fields.md")


def test_new_event_has_the_common_fields_and_a_stable_id():
    a = schema.new_event("process", "sample", "process", "gpu-017", "2026-11-30T01:00:00.000Z",
                         {"process.pid": 42, "process.name": None})
    b = schema.new_event("process", "sample", "process", "gpu-017", "2026-11-30T01:00:00.000Z",
                         {"process.pid": 42})
    for key in ("@timestamp", "event.id", "event.kind", "event.category", "event.action",
                "host.name", "hpcsec.sensor"):
        assert key in a
    assert "process.name" not in a  # None values are left out: rules test absence with null
    assert a["event.id"] == b["event.id"]
    c = schema.new_event("process", "sample", "process", "gpu-017", "2026-11-30T01:00:00.000Z",
                         {"process.pid": 43})
    assert c["event.id"] != a["event.id"]


def test_known_fields_include_namespaces():
    assert schema.is_known_field("rdma.counters.port_rcv_data")
    assert schema.is_known_field("slurm.job.id")
    assert not schema.is_known_field("slurm.jobid")


def test_time_round_trip():
    moment = schema.parse_time("2026-11-30T01:02:03.456Z")
    assert schema.rfc3339(moment) == "2026-11-30T01:02:03.456Z"
    assert schema.parse_time("2026-11-30T02:02:03+01:00") == schema.parse_time(
        "2026-11-30T01:02:03Z")

"""Events: the common fields and the stable id; `schema` still names the catalog."""

from hpcsec.detector.core import fields, schema, timefmt


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


def test_schema_names_the_catalog_and_the_time_helpers():
    assert schema.LEVELS is fields.LEVELS
    assert schema.FIRMWARE_COMPONENTS is fields.FIRMWARE_COMPONENTS
    assert schema.parse_time is timefmt.parse_time
    assert schema.rfc3339 is timefmt.rfc3339

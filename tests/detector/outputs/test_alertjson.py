"""Alerts as JSON whatever Mapping they arrive as, and every output leaves them unchanged."""

from __future__ import annotations

import json
from types import MappingProxyType

from hpcsec.detector.outputs.alertjson import alert_bytes, alert_dict
from hpcsec.detector.outputs.registry import open_outputs
from hpcsec.detector.outputs.spool import Spool
from tests.detector.outputs.sample_alerts import make_alert


def frozen(alert: dict) -> MappingProxyType:
    """`alert` as a read-only view, its events too, as an immutable alert would be."""
    events = tuple(MappingProxyType(dict(e)) for e in alert.get("events", ()))
    return MappingProxyType({**alert, "events": events})


def test_a_read_only_alert_encodes_as_its_fields_not_its_repr():
    alert = make_alert("ro", 0)
    assert json.loads(alert_bytes(frozen(alert))) == alert
    assert alert_dict(frozen(alert)) == alert
    assert isinstance(alert_dict(frozen(alert))["events"][0], dict)


def test_the_slow_path_for_bytes_that_are_not_utf8_handles_read_only_alerts():
    alert = make_alert("ro", 1, **{"file.path": "/x/\udcff.bin"})
    assert json.loads(alert_bytes(frozen(alert)))["file.path"] == "/x/\\xff.bin"
    assert alert["file.path"] == "/x/\udcff.bin"  # the original is left as it was


def test_outputs_write_read_only_alerts_and_leave_them_unchanged(tmp_path, capsys):
    alerts = [frozen(make_alert("ro", i)) for i in range(3)]
    before = [json.dumps(alert_dict(a), sort_keys=True) for a in alerts]
    path = tmp_path / "a.jsonl"
    with open_outputs([f"file://{path}", "-"]) as outputs:
        assert outputs.deliver(alerts).complete
    written = [json.loads(line) for line in path.read_text().splitlines()]
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert written == printed == [make_alert("ro", i) for i in range(3)]
    assert [json.dumps(alert_dict(a), sort_keys=True) for a in alerts] == before


def test_the_spool_keeps_a_read_only_alert_as_its_fields(tmp_path):
    alert = make_alert("ro", 9)
    spool = Spool.open(tmp_path, "syslog+tcp://h:514", max_bytes=1 << 20)
    try:
        assert spool.add_many([frozen(alert)]).dropped_ids == ()
        entry = spool.next_entry()
        assert entry is not None and entry.alert == alert and entry.alert_id == "ro-9"
    finally:
        spool.close()

"""RFC 5424 messages byte for byte: header, structured data, JSON body and its size limit."""

from __future__ import annotations

import json
import re
from types import MappingProxyType

from hpcsec.detector.outputs.rfc5424 import (
    format_message,
    msgid,
    sd_escape,
    structured_data,
)
from tests.detector.outputs.sample_alerts import make_alert


def test_message_format_details():
    alert = make_alert(
        "fmt", 0, events=[{"event.id": str(i), "pad": "x" * 200} for i in range(100)]
    )
    message = format_message(alert, hostname="node-a", procid=7, max_bytes=2048)
    assert len(message) <= 2048
    head, body = message.split(b"] ", 1)
    assert head.startswith(b"<83>1 2026-11-30T01:02:03.456Z node-a hpcsec 7 ")
    parsed = json.loads(body)
    assert "events" not in parsed and parsed["hpcsec.events_omitted"] == 100
    assert parsed["alert.id"] == "fmt-0"
    # the whole alert when it fits
    assert json.loads(format_message(alert, max_bytes=1 << 20).split(b"] ", 1)[1]) == alert
    assert sd_escape('a"b\\c]d') == 'a\\"b\\\\c\\]d'
    assert msgid("short-rule") == "short-rule"
    assert msgid("x" * 40) == "x" * 32
    assert msgid("has space") == "-"
    assert structured_data({"alert.id": "i", "rule.id": "r"}) == '[hpcsec@32473 id="i" rule="r"]'
    unknown = format_message({"rule.level": "weird", "@timestamp": "bad"}, hostname="h")
    assert re.match(
        rb"<84>1 \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z h hpcsec \d+ - "
        rb"\[hpcsec@32473 level=\"weird\"\] \{",
        unknown,
    )


def test_json_message_byte_for_byte():
    alert = {
        "alert.id": "0123abcd",
        "@timestamp": "2026-11-30T03:04:05.678+02:00",
        "rule.id": "fw-drift",
        "rule.level": "medium",
        "rule.vector": "firmware_drift",
        "host.name": "gpu-002",
        "slurm.job.id": 17,
        "user.name": "zoë",
        "rule.title": "Fïrmware",
    }
    message = format_message(alert, hostname="collector.example", procid=4711)
    # header: version 1, UTC time with milliseconds, MSGID = the short rule id; SD values are
    # UTF-8 (allowed), the JSON body is ASCII with \\u escapes, hence no BOM
    assert (
        message
        == (
            "<84>1 2026-11-30T01:04:05.678Z collector.example hpcsec 4711 fw-drift "
            '[hpcsec@32473 id="0123abcd" rule="fw-drift" level="medium" vector="firmware_drift" '
            'host="gpu-002" job="17" user="zoë"] '
            '{"alert.id":"0123abcd","@timestamp":"2026-11-30T03:04:05.678+02:00",'
            '"rule.id":"fw-drift","rule.level":"medium","rule.vector":"firmware_drift",'
            '"host.name":"gpu-002","slurm.job.id":17,"user.name":"zo\\u00eb",'
            '"rule.title":"F\\u00efrmware"}'
        ).encode()
    )
    assert message.split(b"] ", 1)[1].isascii()
    # NILVALUE for header fields that have no valid value
    nil = format_message(
        {"rule.id": "", "rule.level": "low"}, hostname="bad host", procid=1, facility=16
    )
    assert nil.startswith(b"<133>1 ")
    assert nil.split(b" ")[2:6] == [b"-", b"hpcsec", b"1", b"-"]


def test_bytes_that_are_not_utf8_do_not_make_an_alert_undeliverable():
    # a file name with a byte that is not UTF-8, as os.readlink hands it to the sensor
    path = "/lustre/models/\udcff\udcfe.bin"
    alert = {
        "alert.id": "s1",
        "rule.id": "r",
        "rule.level": "high",
        "user.name": "\udce9ve",
        "@timestamp": "2026-11-30T01:00:00Z",
        "file.path": path,
        "events": [{"file.path": path}],
    }
    message = format_message(alert, hostname="h", procid=1)
    message.decode("utf-8")  # valid UTF-8 throughout
    assert b' user="\\\\xe9ve"]' in message  # SD escapes the backslash
    body = json.loads(message.split(b"] ", 1)[1])
    assert body["file.path"] == body["events"][0]["file.path"] == "/lustre/models/\\xff\\xfe.bin"
    cef = format_message(alert, body_format="cef", hostname="h", procid=1)
    assert b"duser=\\\\xe9ve" in cef  # the escape's backslash, escaped for CEF


def test_a_read_only_alert_gives_the_same_message_and_is_not_changed():
    events = [MappingProxyType({"event.id": str(i), "pad": "x" * 200}) for i in range(20)]
    plain = make_alert("ro", 0, events=[dict(e) for e in events], **{"user.name": "\udce9ve"})
    frozen = MappingProxyType({**plain, "events": tuple(events)})
    before = json.dumps(plain, sort_keys=True)
    for body_format in ("json", "cef"):
        for max_bytes in (1 << 20, 1024):
            expected = format_message(
                plain, body_format=body_format, hostname="h", procid=1, max_bytes=max_bytes
            )
            got = format_message(
                frozen, body_format=body_format, hostname="h", procid=1, max_bytes=max_bytes
            )
            assert got == expected
    assert json.dumps(plain, sort_keys=True) == before  # cleaning made a copy
    assert b"mappingproxy" not in format_message(frozen, hostname="h", procid=1)

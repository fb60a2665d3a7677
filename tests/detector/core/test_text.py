"""Node bytes as event text: one escaped form, and ids that never raise."""

from __future__ import annotations

import os

import orjson

from hpcsec.detector.core.eventio import InputReport, read_jsonl
from hpcsec.detector.core.schema import event_id, new_event
from hpcsec.detector.core.text import TOO_DEEP, escape_surrogates, escape_value, from_node_bytes

T0 = "2026-11-30T10:00:00.000Z"


def test_bytes_that_are_not_utf8_become_visible_escapes_and_utf8_stays():
    assert from_node_bytes(b"\xffsl") == "\\xffsl"
    assert from_node_bytes("caf\u00e9 \u2603".encode()) == "caf\u00e9 \u2603"
    assert from_node_bytes(b"a\xc3") == "a\\xc3"  # a cut multi-byte character


def test_an_os_string_gets_the_same_form_as_its_bytes():
    raw = b"/data/\xff\xfe model.bin"
    assert escape_surrogates(os.fsdecode(raw)) == from_node_bytes(raw)
    assert escape_surrogates("plain") == "plain"
    assert escape_surrogates("\ud800x") == "\\ud800x"  # a surrogate from no byte


def test_event_id_never_raises_and_is_computed_on_the_escaped_form():
    hostile = {"process.name": os.fsdecode(b"\xffsl"), "big": 2**80}
    assert event_id(hostile) == event_id({"process.name": "\\xffsl", "big": str(2**80)})
    deep: list = []
    for _ in range(300):  # orjson stops at 255 levels
        deep = [deep]
    assert len(event_id({"x": deep})) == 20


def test_new_event_carries_the_escaped_form_its_id_was_computed_on():
    event = new_event(
        "process", "present", "process", "n1", T0, {"process.args": [os.fsdecode(b"\xff")]}
    )
    assert event["process.args"] == ["\\xff"]
    orjson.dumps(event)  # valid for every later stage
    assert event["event.id"] == event_id({k: v for k, v in event.items() if k != "event.id"})


def test_escape_value_cuts_hostile_nesting():
    deep: list = []
    for _ in range(100):
        deep = [deep]
    cut = escape_value({"x": deep})
    assert orjson.dumps(cut)
    assert TOO_DEEP in orjson.dumps(cut).decode()


def test_jsonl_with_hostile_nesting_is_malformed_and_the_next_line_still_an_event():
    deep_object = b'{"a":' * 1000 + b"1" + b"}" * 1000
    deep_list = b"[" * 300 + b"]" * 300
    lines = [
        b'{"@timestamp":"' + T0.encode() + b'","x":' + deep_object + b"}\n",
        b'{"@timestamp":"' + T0.encode() + b'","x":' + deep_list + b"}\n",
        b'{"@timestamp":"' + T0.encode() + b'","process.name":"ok"}\n',
    ]
    report = InputReport("events.jsonl")
    events = list(read_jsonl(lines, report))
    assert [e["process.name"] for e in events] == ["ok"]
    assert report.malformed == 2
    assert [n for n, _ in report.malformed_lines] == [1, 2]

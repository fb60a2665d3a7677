import io

from hpcsec.detector.core.eventio import InputReport, read_jsonl
from hpcsec.detector.core.schema import event_id


def without_ids(events):
    """The events read, less the `event.id` the reader gives events that have none."""
    return [{k: v for k, v in e.items() if k != "event.id"} for e in events]


def test_malformed_lines_are_skipped_counted_and_reported():
    data = b'{"a": 1}\nnot json\n\n[1, 2]\n{"b": 2}\n{"c":\n'
    report = InputReport("events.jsonl")
    events = without_ids(read_jsonl(io.BytesIO(data), report))
    assert events == [{"a": 1}, {"b": 2}]
    assert report.malformed == 3
    assert [n for n, _ in report.malformed_lines] == [2, 4, 6]
    text = report.describe()
    assert text.startswith("events.jsonl: skipped 3 malformed line(s) of 6 (line 2: not JSON")
    assert "line 4: not an object but list" in text


def test_clean_input_reports_nothing():
    report = InputReport("x")
    assert without_ids(read_jsonl(io.BytesIO(b'{"a": 1}\n'), report)) == [{"a": 1}]
    assert report.describe() is None


def test_nested_objects_are_read_as_dotted_names():
    data = (
        b'{"@timestamp": "2026-11-30T01:00:00Z", "process": {"name": "xmrig", '
        b'"parent": {"pid": 1}}, "process.args": ["xmrig", "-o"]}\n'
        b'{"process": {"name": "a"}, "process.name": "b"}\n'
    )
    report = InputReport("nested.jsonl")
    assert without_ids(read_jsonl(io.BytesIO(data), report)) == [
        {
            "@timestamp": "2026-11-30T01:00:00Z",
            "process.name": "xmrig",
            "process.parent.pid": 1,
            "process.args": ["xmrig", "-o"],
        }
    ]
    assert report.malformed_lines == [(2, "field process.name is given twice")]


def test_one_value_schema_field_holding_a_list_or_object_is_malformed():
    data = (
        b'{"process.name": ["xmrig", "bash"]}\n'
        b'{"user.id": {"value": 1000}}\n'
        b'{"slurm.job.gpus": [0, 1], "x.custom": [1, {"a": 2}]}\n'
        b'{"@timestamp": 1764464523, "process.name": "x"}\n'
    )
    report = InputReport("shapes.jsonl")
    assert without_ids(read_jsonl(io.BytesIO(data), report)) == [
        {"slurm.job.gpus": [0, 1], "x.custom": [1, {"a": 2}]}
    ]  # list fields, unknown fields
    assert report.malformed_lines == [
        (1, "field process.name is a list, not one keyword value"),
        (2, "field user.id is an object, not one long value"),
        (4, "@timestamp must be RFC 3339 text, not int"),
    ]


def test_scan_skips_badly_shaped_lines_and_alerts_on_the_rest(tmp_path, capsys):
    """Lines whose fields enrichment cannot read are reported; the good lines still alert."""
    import json

    from hpcsec.detector.cli.main import main

    rules = tmp_path / "miners.yml"
    rules.write_text(
        "title: Miner\nid: 1f0e0d0c-0000-4000-8000-0000000000a9\nlevel: high\n"
        "logsource: {product: hpc, category: process}\n"
        "detection:\n  sel: {process.name: xmrig}\n  condition: sel\n"
    )
    good = {
        "@timestamp": "2026-11-30T01:00:00Z",
        "event.category": "process",
        "host.name": "gpu-001",
        "process.name": "xmrig",
        "user.name": "mallory",
    }
    lines = [
        {**good, "process.name": ["xmrig"]},
        {
            **good,
            "event.category": "firmware",
            "firmware.component": "hca",
            "host.name": ["gpu-001"],
        },
        {**good, "@timestamp": 1764464400},
        good,
    ]
    events = tmp_path / "events.jsonl"
    events.write_text("".join(json.dumps(e) + "\n" for e in lines))
    assert (
        main(
            [
                "scan",
                "--events",
                str(events),
                "--no-default-rules",
                "--rules",
                str(rules),
                "--format",
                "jsonl",
            ]
        )
        == 1
    )
    out, err = capsys.readouterr()
    assert [json.loads(line)["process.name"] for line in out.splitlines()] == ["xmrig"]
    assert (
        f"hpcsec: {events}: skipped 3 malformed line(s) of 4 (line 1: field process.name "
        "is a list, not one keyword value; line 2: field host.name is a list, not one "
        "keyword value; line 3: @timestamp must be RFC 3339 text, not int)"
    ) in err


def test_events_without_an_id_get_a_stable_one():
    data = b'{"process.name": "a"}\n{"process.name": "a", "event.id": "given"}\n'
    first, second = read_jsonl(io.BytesIO(data), InputReport("ids.jsonl"))
    assert first["event.id"] == event_id({"process.name": "a"})
    assert second["event.id"] == "given"
    again, _ = read_jsonl(io.BytesIO(data), InputReport("ids.jsonl"))
    assert again["event.id"] == first["event.id"]


def test_no_dedup_gives_one_alert_per_event_even_without_ids(tmp_path, capsys):
    import json

    from hpcsec.detector.cli.main import main

    rules = tmp_path / "miners.yml"
    rules.write_text(
        "title: Miner\nid: 1f0e0d0c-0000-4000-8000-0000000000aa\nlevel: high\n"
        "logsource: {product: hpc, category: process}\n"
        "detection:\n  sel: {process.name|startswith: xmrig}\n  condition: sel\n"
    )
    events = tmp_path / "events.jsonl"
    events.write_text(
        "".join(
            json.dumps({"event.category": "process", "process.name": name}) + "\n"
            for name in ("xmrig", "xmrig-6", "bash", "xmrig-7")
        )
    )
    main(
        [
            "scan",
            "--events",
            str(events),
            "--no-default-rules",
            "--rules",
            str(rules),
            "--no-dedup",
            "--format",
            "jsonl",
        ]
    )
    alerts = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted(a["events"][0]["process.name"] for a in alerts) == ["xmrig", "xmrig-6", "xmrig-7"]
    assert [a["count"] for a in alerts] == [1, 1, 1]


def test_a_time_that_is_not_rfc3339_makes_the_line_malformed():
    data = (
        b'{"@timestamp": "garbage", "event.category": "process"}\n'
        b'{"@timestamp": "2026-11-30", "event.category": "process"}\n'
        b'{"@timestamp": "2026-11-30T01:00:00+01:00", "event.category": "process"}\n'
    )
    report = InputReport("e.jsonl")
    events = list(read_jsonl(io.BytesIO(data), report))
    assert [e["@timestamp"] for e in events] == ["2026-11-30T01:00:00+01:00"]
    assert [n for n, _ in report.malformed_lines] == [1, 2]
    assert "@timestamp 'garbage' is not an RFC 3339 time" in report.describe()


def test_a_lone_surrogate_escape_is_read_as_escaped_bytes_not_lost():
    # what Python's json writes for a name read with surrogateescape; orjson refuses it
    lines = [
        b'{"@timestamp": "2026-11-30T01:00:00Z", "user.name": "x\\udcff\\udcfey"}\n',
        b'{"@timestamp": "2026-11-30T01:00:00Z", "user.name": "bob"}\n',
        b'{"@timestamp": "2026-11-30T01:00:00Z", "n": NaN, "user.name": "\\udcff"}\n',
    ]
    report = InputReport("f")
    events = list(read_jsonl(lines, report))
    assert [e["user.name"] for e in events] == ["x\\xff\\xfey", "bob"]
    assert report.malformed == 1 and report.malformed_lines[0][0] == 3  # NaN stays refused

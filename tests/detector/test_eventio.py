import io

from hpcsec.detector.eventio import InputReport, read_jsonl


def test_malformed_lines_are_skipped_counted_and_reported():
    data = b'{"a": 1}\nnot json\n\n[1, 2]\n{"b": 2}\n{"c":\n'
    report = InputReport("events.jsonl")
    events = list(read_jsonl(io.BytesIO(data), report))
    assert events == [{"a": 1}, {"b": 2}]
    assert report.malformed == 3
    assert [n for n, _ in report.malformed_lines] == [2, 4, 6]
    text = report.describe()
    assert text.startswith("events.jsonl: skipped 3 malformed line(s) of 6 (line 2: not JSON")
    assert "line 4: not an object but list" in text


def test_clean_input_reports_nothing():
    report = InputReport("x")
    assert list(read_jsonl(io.BytesIO(b'{"a": 1}\n'), report)) == [{"a": 1}]
    assert report.describe() is None

"""The reader's quick shape test (bracket counting, list fields only) must decide every line
exactly as the full check (`checked_event`) does: same events, same rejections, same words."""

from __future__ import annotations

import io
import itertools
import random

import orjson

from hpcsec.detector.core.eventio import InputReport, checked_event, read_jsonl

KEYS = ["process.name", "user.id", "slurm.job.gpus", "process.args", "x.custom", "process"]
VALUES: list[object] = [
    "x",
    "a[b",  # a bracket inside a string
    "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[",  # more brackets in text than lists may nest
    7,
    True,
    None,
    [0, 1],
    ["a[b", "c"],
    [],
    [[0]],
    [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[0]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]],  # too deep
    {"name": "n"},
    {"a": [1]},
]


def reference(line: bytes) -> tuple[dict | None, str | None]:
    """What the full check says of one line that parses to an object."""
    event, problem = checked_event(orjson.loads(line))
    return (None, problem) if problem is not None else (event, None)


def lines() -> list[bytes]:
    """Every pair of keys with every pair of values (with a valid time), and a random sample
    of three-field events: all the ways a list can sit in a line, in a known or an unknown
    field, nested or in text."""
    out = []
    for keys in itertools.combinations(KEYS, 2):
        for values in itertools.product(VALUES, repeat=2):
            event = dict(zip(keys, values, strict=True))
            event["@timestamp"] = "2026-11-30T01:00:00.000Z"
            out.append(orjson.dumps(event))
    rng = random.Random(5)
    for _ in range(2000):
        keys = rng.sample(KEYS, 3)
        out.append(orjson.dumps({k: rng.choice(VALUES) for k in keys}))
    return out


def test_the_quick_shape_test_agrees_with_the_full_check_on_every_line():
    corpus = lines()
    report = InputReport("shapes.jsonl")
    got = list(read_jsonl(io.BytesIO(b"\n".join(corpus) + b"\n"), report))
    expected_events, expected_problems = [], []
    for line_no, line in enumerate(corpus, 1):
        event, problem = reference(line)
        if problem is None:
            expected_events.append(event)
        else:
            expected_problems.append((line_no, problem))
    assert [{k: v for k, v in e.items() if k != "event.id"} for e in got] == expected_events
    assert report.malformed == len(expected_problems) > 100
    assert report.malformed_lines == expected_problems[:5]
    assert len(got) > 100  # both kinds are exercised


def test_a_list_in_a_one_value_field_beside_a_list_field_is_malformed():
    """One `[` for the list field and one for the wrong list: not as many `[` as list fields
    hold lists, so the full check runs and names the field."""
    data = (
        b'{"slurm.job.gpus": [0], "process.name": ["a"]}\n'
        b'{"slurm.job.gpus": 5, "user.name": ["a"]}\n'
        b'{"process.args": ["a[b"], "process.name": "x[y"}\n'
    )
    report = InputReport("e.jsonl")
    events = list(read_jsonl(io.BytesIO(data), report))
    assert [e["process.name"] for e in events] == ["x[y"]
    assert report.malformed_lines == [
        (1, "field process.name is a list, not one keyword value"),
        (2, "field user.name is a list, not one keyword value"),
    ]

"""What a scan's correlations could not see is said on stderr, never silently missed: rule
matches further out of event-time order than the matches a scan holds to sort them, matches
whose event has no @timestamp, and groups dropped because too many were open."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from hpcsec.detector.cli.main import main
from hpcsec.detector.engine import evaluate, reorder

RULES = """\
title: A probe ran
id: 6f0d1c52-6a53-4d2e-9a77-0c1e2b3a4d01
status: test
description: feeds the correlation below
logsource: {product: hpc, category: process}
detection:
  sel:
    process.name: probe
  condition: sel
level: low
---
title: Three probes on one host within an hour
id: 6f0d1c52-6a53-4d2e-9a77-0c1e2b3a4d02
status: test
description: fires on the third probe of a host within the hour
correlation:
  type: event_count
  rules: [6f0d1c52-6a53-4d2e-9a77-0c1e2b3a4d01]
  group-by: [host.name]
  timespan: 1h
  condition: {gte: 3}
level: high
"""
BASE = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)


def probe(host: str, minute: int | None) -> dict:
    event = {"event.category": "process", "process.name": "probe", "host.name": host}
    if minute is not None:
        when = BASE + timedelta(minutes=minute)
        event["@timestamp"] = when.strftime("%Y-%m-%dT%H:%M:%S.000Z")
    return event


def scan(
    tmp_path: Path, events: list[dict], capsys: pytest.CaptureFixture[str], jobs: int = 1
) -> tuple:
    rules = tmp_path / "rules.yml"
    rules.write_text(RULES)
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in events))
    argv = ["scan", "--events", str(path), "--format", "jsonl", "--jobs", str(jobs), "--no-dedup"]
    main([*argv, "--no-default-rules", "--rules", str(rules)])
    out, err = capsys.readouterr()
    alerts = [json.loads(line) for line in out.splitlines()]
    warnings = [line for line in err.splitlines() if line.startswith("hpcsec: warning:")]
    return alerts, warnings


def test_a_scan_in_event_time_order_warns_of_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(reorder, "MAX_PENDING", 2)
    alerts, warnings = scan(tmp_path, [probe("gpu001", m) for m in range(6)], capsys)
    assert len(alerts) == 2 and warnings == []


@pytest.mark.parametrize("jobs", [1, 2])
def test_matches_too_far_out_of_order_are_counted_and_said(
    tmp_path, capsys, monkeypatch, small_chunks, jobs
):
    """Held matches beyond MAX_PENDING go on early (after each batch of the scan); a match
    older than those is late: two nodes' files joined one after the other. With two jobs
    (the workers detect, the scan's process correlates) the same."""
    monkeypatch.setattr(reorder, "MAX_PENDING", 2)
    events = [probe("gpu001", m) for m in range(100, 400)] + [probe("gpu002", m) for m in (1, 2, 3)]
    alerts, warnings = scan(tmp_path, events, capsys, jobs)
    assert warnings == [
        "hpcsec: warning: 3 rule match(es) not correlated: the events are further out of "
        "event-time order than a scan holds to sort them (2 matches, 256 MiB of their "
        "events) (sort the events by @timestamp to correlate them all)"
    ]
    monkeypatch.setattr(reorder, "MAX_PENDING", 1000)  # held whole: put in order, all seen
    alerts_sorted, warnings = scan(tmp_path, events, capsys)
    assert warnings == []
    assert {a["host.name"] for a in alerts_sorted} - {a["host.name"] for a in alerts} == {"gpu002"}


@pytest.mark.parametrize("jobs", [1, 2])
def test_long_events_are_held_up_to_a_size_too(tmp_path, capsys, monkeypatch, small_chunks, jobs):
    """The held matches are bounded by their events' size as well as by their count: long
    events (a process can make its command line half a megabyte) go on early, and the same
    disorder that fits in the count no longer fits in the size."""
    pad = {"process.command_line": "x" * 20_000}
    events = [{**probe("gpu001", m), **pad} for m in range(100, 400)]
    events += [{**probe("gpu002", m), **pad} for m in (1, 2, 3)]
    monkeypatch.setattr(reorder, "MAX_PENDING_BYTES", 2**20)  # about fifty of them
    _, warnings = scan(tmp_path, events, capsys, jobs)
    assert warnings == [
        "hpcsec: warning: 3 rule match(es) not correlated: the events are further out of "
        "event-time order than a scan holds to sort them (200,000 matches, 1 MiB of their "
        "events) (sort the events by @timestamp to correlate them all)"
    ]
    monkeypatch.setattr(reorder, "MAX_PENDING_BYTES", 64 * 2**20)  # held whole: none late
    assert scan(tmp_path, events, capsys, jobs)[1] == []


def test_matches_without_a_time_are_said(tmp_path, capsys):
    events = [probe("gpu001", 1), probe("gpu001", None), probe("gpu001", 2), probe("x", None)]
    _, warnings = scan(tmp_path, events, capsys)
    assert warnings == [
        "hpcsec: warning: 2 rule match(es) not correlated: their event has no @timestamp"
    ]


def test_groups_dropped_for_room_are_said(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(evaluate, "MAX_GROUPS", 2)
    events = [probe(f"gpu{n:03d}", n) for n in range(5)]
    _, warnings = scan(tmp_path, events, capsys)
    assert warnings == [
        "hpcsec: warning: 3 correlation group(s) dropped before their window ended: more "
        "than 2 of one correlation were open at once"
    ]

"""`scan --events --jobs 2`: worker processes parse chunks of a large file; the alerts and the
malformed-line report must be exactly those of the one-process path."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
from pathlib import Path

import pytest

from hpcsec.detector.cli.main import main
from hpcsec.detector.engine.loader import bundled_rules_dir, load_rules
from hpcsec.detector.runtime import chunked

MALFORMED = [
    "{broken",
    json.dumps([1, 2]),
    json.dumps({"@timestamp": "2026-13-01T00:00:00.000Z", "event.category": "process"}),
    json.dumps({"@timestamp": 5, "event.category": "process"}),
    json.dumps({"event.category": "process", "process.name": ["a", "b"]}),
    json.dumps({"event.category": "process", "x": {"y": 1}, "x.y": 2}),
    json.dumps(
        {
            "event.category": "process",
            "deep": [[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]],
        }
    ),
    "   ",
    "",
]


def attack_events() -> list[dict]:
    """Every bundled rule's own matching test events, flat, with their category."""
    ruleset = load_rules([str(bundled_rules_dir())], with_tests=True)
    return [dict(e) for t in ruleset.tests for e in t.match if "event.category" in e]


def write_events(path: Path, rounds: int) -> None:
    """Rounds of attack events an hour apart, malformed lines among them (several per chunk
    of the test's chunk size, so renumbering across chunks is exercised), nested events too,
    and a last line without its newline."""
    attacks = attack_events()
    lines = []
    for r in range(rounds):
        for i, event in enumerate(attacks):
            event = {**event, "@timestamp": f"2026-11-{1 + r % 28:02d}T{i % 24:02d}:00:00.000Z"}
            event["event.id"] = f"r{r}-{i}"
            lines.append(json.dumps(event))
            if i % 7 == 3:
                lines.append(MALFORMED[(r + i) % len(MALFORMED)])
            if i % 11 == 5:  # nested objects are read as dotted names
                lines.append(json.dumps({"event.category": "process", "process": {"name": "x"}}))
    path.write_text("\n".join(lines))


def scan(events: Path, jobs: int, capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(["scan", "--events", str(events), "--format", "jsonl", "--jobs", str(jobs)])
    out, err = capsys.readouterr()
    return rc, out, err


def test_parallel_scan_gives_the_same_alerts_and_report(tmp_path, capsys, small_chunks):
    events = tmp_path / "events.jsonl"
    write_events(events, rounds=6)
    assert events.stat().st_size > 10 * 4096  # many chunks
    serial = scan(events, 1, capsys)
    parallel = scan(events, 2, capsys)
    assert small_chunks == []  # the worker parsed every chunk
    assert serial[1].count("\n") > 20  # alerts, detections and correlations
    assert parallel == serial
    assert "malformed line(s) of" in serial[2]


def test_parallel_scan_survives_a_killed_worker(tmp_path, capsys, small_chunks, monkeypatch):
    """A worker that dies only costs speed: the caller parses the chunks left."""
    events = tmp_path / "events.jsonl"
    write_events(events, rounds=6)
    serial = scan(events, 1, capsys)
    real_merge = chunked.merge

    def kill_workers_after_first_chunk(*args: object) -> None:
        for child in multiprocessing.active_children():
            if child.pid is not None:
                # already reaped by the pool since active_children(): it is dead anyway
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.pid, signal.SIGKILL)
        real_merge(*args)

    monkeypatch.setattr(chunked, "merge", kill_workers_after_first_chunk)
    assert scan(events, 2, capsys) == serial
    assert small_chunks  # the chunks after the kill were parsed here


def test_jobs_must_be_at_least_one(tmp_path, capsys):
    events = tmp_path / "events.jsonl"
    events.write_text("{}\n")
    assert main(["scan", "--events", str(events), "--jobs", "0"]) == 2
    assert "--jobs 0: needs at least 1" in capsys.readouterr().err


def test_parallel_scan_applies_the_scans_own_site_policy(tmp_path, capsys, small_chunks):
    """The workers apply site policy (the caller skips that step): with the scan's config,
    so maintenance, admins and GPU services decide the same as in one process."""
    config = tmp_path / "site.yml"
    config.write_text(
        "maintenance:\n"
        "  - {start: 2026-11-01T00:00:00Z, end: 2026-11-04T00:00:00Z}\n"
        "admins: {users: [root, alice]}\n"
        "gpu_services: [xmrig]\n"
    )
    events = tmp_path / "events.jsonl"
    write_events(events, rounds=6)
    runs = []
    for jobs in (1, 2):
        argv = ["scan", "--events", str(events), "--format", "jsonl", "--jobs", str(jobs)]
        rc = main([*argv, "--config", str(config)])
        runs.append((rc, *capsys.readouterr()))
    assert small_chunks == []
    assert runs[1] == runs[0]
    alerts = [json.loads(line) for line in runs[0][1].splitlines()]
    during = [e["hpcsec.in_maintenance"] for a in alerts for e in a.get("events", [])]
    assert True in during and False in during  # the window covers some rounds only

"""`scan --events`'s reading: the firmware pass finds every firmware line wherever the file's
blocks split it, and batches hold exactly `size` events whatever lines are skipped."""

from __future__ import annotations

import io
import json

import pytest

from hpcsec.detector.config.site import SiteConfig
from hpcsec.detector.core.eventio import InputReport, read_jsonl
from hpcsec.detector.runtime import chunked
from hpcsec.detector.runtime.sources import EventSources, ScanReport, lines_containing


def firmware(host: str, version: str) -> dict:
    return {
        "@timestamp": "2026-11-30T01:00:00.000Z",
        "event.category": "firmware",
        "host.name": host,
        "firmware.component": "gpu_vbios",
        "firmware.version": version,
    }


@pytest.mark.parametrize("block", [1, 7, 64, 4096])
def test_lines_containing_finds_lines_across_block_edges(block):
    lines = [b'{"a": 1}', b'{"firmware.component": "x"}', b"", b"firmware.component", b"{}"]
    data = b"\n".join(lines) + b"\n" + b'{"firmware.component": "last, no newline"}'
    found = list(lines_containing(io.BytesIO(data), b"firmware.component", block))
    assert found == [
        b'{"firmware.component": "x"}\n',
        b"firmware.component\n",
        b'{"firmware.component": "last, no newline"}',
    ]


@pytest.mark.parametrize("jobs", [1, 2])
def test_the_fleet_majority_is_set_on_the_events_of_a_file(tmp_path, monkeypatch, jobs):
    """With two jobs the worker sets it (and the site policy: the batches say so)."""
    monkeypatch.setattr(chunked, "PARALLEL_MIN_BYTES", 0)
    path = tmp_path / "events.jsonl"
    events = [firmware(f"gpu{i:03d}", "2.0" if i else "1.0") for i in range(4)]
    path.write_bytes(b"\n".join(json.dumps(e).encode() for e in events))  # no last newline
    sources = EventSources(SiteConfig(), ScanReport())
    batches = list(sources.from_events_file(str(path), 256, jobs))
    read = [e for batch in batches for e in batch.events]
    assert [e.get("firmware.fleet_majority_version") for e in read] == ["2.0"] * 4
    assert [b.enriched for b in batches] == [frozenset({"policy"}) if jobs == 2 else frozenset()]
    assert all(("hpcsec.in_maintenance" in e) == (jobs == 2) for e in read)


def test_batches_hold_exactly_size_events_when_lines_are_skipped(tmp_path):
    lines = []
    for i in range(700):
        lines.append(json.dumps({"event.category": "process", "event.id": str(i)}))
        if i % 9 == 0:
            lines.append("not json")
        if i % 13 == 0:
            lines.append("")
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(lines) + "\n")
    report = ScanReport()
    batches = list(EventSources(SiteConfig(), report).from_events_file(str(path), 100))
    assert [len(b.events) for b in batches] == [100] * 7
    expected = list(read_jsonl(io.BytesIO(path.read_bytes()), InputReport("x")))
    assert [e for b in batches for e in b.events] == expected
    assert report.events == 700 and report.inputs[0].malformed == 78
    assert report.inputs[0].lines == len(lines)

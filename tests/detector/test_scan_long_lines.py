"""An events file line too long to be an event (a file of one endless line, a hostile
export) is never read whole, by any of `scan --events`'s readers: the line reader, the
firmware pass and the chunks of `--jobs 2`. It is skipped and reported by its number, as a
malformed line; the lines around it are read as always."""

from __future__ import annotations

import io
import itertools
import json
import os
import threading
import weakref
from pathlib import Path

import pytest

from hpcsec.detector.cli.main import main
from hpcsec.detector.config.site import SiteConfig
from hpcsec.detector.core import eventio, jsonenc
from hpcsec.detector.core.eventio import InputReport, read_jsonl
from hpcsec.detector.core.text import from_node_bytes
from hpcsec.detector.runtime import chunked
from hpcsec.detector.runtime.pipeline import Pipeline
from hpcsec.detector.runtime.sources import EventSources, ScanReport, lines_containing
from hpcsec.sensors import cmdline_condense, proclists
from tests.detector.test_scan_parallel import attack_events


class BoundedStream(io.BytesIO):
    """A file that records the most bytes any one call asked for, and refuses the calls
    that read a line whole (iteration, readline without a limit)."""

    def __init__(self, data: bytes):
        super().__init__(data)
        self.most = 0

    def readline(self, size: int | None = -1) -> bytes:  # type: ignore[override]
        assert size is not None and size >= 0, "a whole line read"
        self.most = max(self.most, size)
        return super().readline(size)

    def readinto(self, buffer) -> int:  # type: ignore[no-untyped-def, override]
        self.most = max(self.most, len(buffer))
        return super().readinto(buffer)

    def __iter__(self):  # type: ignore[no-untyped-def]
        raise AssertionError("lines iterated whole")


@pytest.fixture
def short_limit(monkeypatch: pytest.MonkeyPatch) -> int:
    monkeypatch.setattr(eventio, "MAX_LINE_BYTES", 1000)
    monkeypatch.setattr(eventio, "SKIP_READ", 64)
    return 1000


def event_line(n: int, length: int | None = None) -> bytes:
    """An event's line (newline included) of exactly `length` bytes when given."""
    event = {"event.category": "process", "event.id": f"e{n}", "process.name": "x"}
    line = json.dumps(event).encode()
    if length is not None:
        event["process.name"] = "x" * (length - len(line))
        line = json.dumps(event).encode()
    return line + b"\n"


def test_a_line_longer_than_the_limit_is_skipped_and_reported(short_limit):
    lines = [
        event_line(1),
        event_line(2, length=short_limit),  # at the limit, newline included: read
        event_line(3, length=short_limit + 1),  # one byte over
        event_line(4),
        event_line(5, length=50 * short_limit),
        event_line(6),
        event_line(7, length=3 * short_limit).rstrip(b"\n"),  # the last, without newline
    ]
    stream = BoundedStream(b"".join(lines))
    report = InputReport("events.jsonl")
    read = [e["event.id"] for e in read_jsonl(stream, report)]
    assert read == ["e1", "e2", "e4", "e6"]
    why = "line longer than 1000 bytes, not read"
    assert report.malformed_lines == [(3, why), (5, why), (7, why)]
    assert (report.lines, report.events) == (7, 4)
    assert stream.most <= short_limit + 1


def test_the_firmware_pass_skips_long_lines_and_keeps_its_buffer_small(short_limit):
    firmware = b'{"firmware.component": "gpu_vbios"}\n'
    long_line = b'{"firmware.component": "' + b"v" * (40 * short_limit) + b'"}\n'
    last = b'{"firmware.component": "last"}'
    data = firmware + long_line + firmware + long_line[:-1]
    stream = BoundedStream(data + b"\n" + last)
    assert list(lines_containing(stream, b"firmware.component", 64)) == [
        firmware,
        firmware,
        last,
    ]
    assert stream.most <= 2 * short_limit  # the buffer doubles from 64 up to the limit
    # a line between the limit and the buffer's size is left out too, as read_jsonl does
    mid = b'{"firmware.component": "' + b"m" * short_limit + b'"}\n'
    found = list(lines_containing(io.BytesIO(firmware + mid + firmware), b"firmware", 4096))
    assert found == [firmware, firmware]
    ended = list(lines_containing(io.BytesIO(firmware + mid[:-1]), b"firmware", 4096))
    assert ended == [firmware]


def test_chunks_end_after_a_long_line_without_reading_it_whole(short_limit):
    data = event_line(1) * 3 + event_line(2, length=30 * short_limit) + event_line(3) * 3
    stream = BoundedStream(data)
    bounds = list(chunked.chunk_bounds(stream, len(data), 100))
    assert bounds[0][0] == 0 and bounds[-1][1] == len(data)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
    assert all(data[end - 1 : end] == b"\n" for _, end in bounds)
    assert stream.most <= eventio.SKIP_READ


def write_file(path: Path, limit: int) -> None:
    """Attack events with long lines among them: four hosts' firmware of a version of their
    own (were they read, the fleet's majority would be theirs, not the three others'), the
    last of them without a newline, and an attack event."""
    attacks = [json.dumps(e).encode() + b"\n" for e in attack_events()]
    fw = {
        "@timestamp": "2026-11-30T01:00:00.000Z",
        "event.category": "firmware",
        "firmware.component": "long_lines_test",  # no attack event's component
    }

    def firmware(host: int, version: str, pad: int = 0) -> bytes:
        event = {**fw, "host.name": f"gpu{host:03d}", "firmware.version": version}
        if pad:
            event["x"] = "y" * pad
        return json.dumps(event).encode() + b"\n"

    lines = [
        *(firmware(host, "1.0") for host in (1, 2, 3)),
        *attacks,
        *(firmware(host, "9.9", pad=limit) for host in (4, 5, 6)),
        attacks[0].rstrip(b"\n")[:-1] + b', "pad": "' + b"z" * limit + b'"}\n',
        *attacks,
        firmware(7, "9.9", pad=limit).rstrip(b"\n"),
    ]
    path.write_bytes(b"".join(lines))


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_scan_skips_long_lines_alike_with_one_or_two_jobs(tmp_path, capsys, small_chunks, jobs):
    """With the real limit: workers are processes of their own, and read it themselves."""
    path = tmp_path / "events.jsonl"
    write_file(path, eventio.MAX_LINE_BYTES)
    sources = EventSources(SiteConfig(), ScanReport())
    batches = list(sources.from_events_file(str(path), 256, jobs))
    fw = [e for b in batches for e in b.events if e.get("firmware.component") == "long_lines_test"]
    assert [e.get("firmware.fleet_majority_version") for e in fw] == ["1.0"] * 3
    (report,) = sources.report.inputs
    assert report.malformed == 5
    assert [why for _, why in report.malformed_lines] == [
        f"line longer than {eventio.MAX_LINE_BYTES} bytes, not read"
    ] * 5

    one = main(["scan", "--events", str(path), "--format", "jsonl", "--jobs", "1"])
    out_one, err_one = capsys.readouterr()
    two = main(["scan", "--events", str(path), "--format", "jsonl", "--jobs", str(jobs)])
    out_two, err_two = capsys.readouterr()
    assert (one, out_one, err_one) == (two, out_two, err_two)
    assert out_one.count("\n") > 3 and "skipped 5 malformed line(s)" in err_one


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_time_out_of_range_is_a_malformed_line_not_the_end_of_the_scan(
    tmp_path, capsys, small_chunks, jobs
):
    lines = [json.dumps(e) for e in attack_events()]
    late = {
        "event.category": "process",
        "process.name": "x",
        "@timestamp": "9999-12-31T23:59:59-01:00",
    }
    lines.insert(3, json.dumps(late))
    path = tmp_path / "events.jsonl"
    path.write_text("\n".join(lines) + "\n")
    rc = main(["scan", "--events", str(path), "--format", "jsonl", "--jobs", str(jobs)])
    out, err = capsys.readouterr()
    assert rc in (0, 1) and "internal error" not in err and out.count("\n") > 3
    assert "skipped 1 malformed line(s)" in err and "line 4: @timestamp" in err


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_fifo_is_read_once_as_stdin_is(tmp_path, capsys, jobs):
    """No firmware pass ahead of it (it cannot be read twice, nor sought back): the scan
    reads it once, with the same alerts as the file."""
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(json.dumps(e).encode() + b"\n" for e in attack_events()))
    rc = main(["scan", "--events", str(path), "--format", "jsonl", "--jobs", str(jobs)])
    expected = capsys.readouterr().out
    fifo = tmp_path / "events.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_bytes(path.read_bytes()))
    writer.start()
    try:
        got = main(["scan", "--events", str(fifo), "--format", "jsonl", "--jobs", str(jobs)])
    finally:
        writer.join(timeout=30)
    out, err = capsys.readouterr()
    assert (got, out) == (rc, expected) and "internal error" not in err
    assert expected.count("\n") > 3


def test_no_process_can_make_its_own_event_too_long_to_be_read():
    """The longest process event a sensor writes, from argv and environment values filled
    with control bytes (6 bytes of JSON each) as the process sensor keeps them, is far under
    the line limit: a scan never skips it."""
    args = [
        from_node_bytes(a) for a in cmdline_condense.cmdline_args(io.BytesIO(b"\x01\0" * 10**6))
    ]
    env = from_node_bytes(b"\x01\xff" * proclists.ENTRY_MAX)[: proclists.ENTRY_MAX]
    event = {
        "process.args": args,
        "process.command_line": " ".join(args),
        **{f"process.env.{name}": env for name in ("LD_PRELOAD", "SLURM_JOB_ID", "X")},
    }
    assert len(jsonenc.dumps(event)) < eventio.MAX_LINE_BYTES // 2


def test_a_last_line_of_exactly_the_limit_is_read_by_the_firmware_pass_too(short_limit):
    """The main pass reads a line of exactly MAX_LINE_BYTES that ends the file without a
    newline: so must the firmware pass, whose buffer reaches that size exactly (125 x 8)."""
    head = b'{"firmware.component": "a"}\n'
    last = b'{"firmware.component": "' + b"v" * (short_limit - 26) + b'"}'
    assert len(last) == short_limit
    report = InputReport("f")
    assert len(list(read_jsonl(io.BytesIO(head + last), report))) == 2 and not report.malformed
    assert list(lines_containing(io.BytesIO(head + last), b"firmware", 125)) == [head, last]


def test_a_chunk_is_never_read_past_its_end(short_limit):
    """A file changed after its chunks were cut: a chunk's reads stop at its end, so no
    byte is read by two chunks."""
    data = event_line(1) + event_line(2, length=3 * short_limit) + event_line(3)
    for end in (len(event_line(1)) + 10, len(event_line(1)) + 2 * short_limit):
        stream = io.BytesIO(data)
        got = list(eventio.bounded_lines(stream, end))
        assert stream.tell() == end
        assert got[0] == event_line(1) and sum(map(len, got)) <= end


def test_a_block_of_long_lines_is_parsed_before_it_is_a_gigabyte(monkeypatch):
    """256 lines just under the limit are a gigabyte: a block's lines are read only up to
    BLOCK_BYTES (and BLOCK_STEP lines more) before they are parsed, so the raw lines are
    never held beside a batch of their events. The events, their order and the report are
    those of any cut."""
    monkeypatch.setattr(eventio, "BLOCK_BYTES", 10_000)
    lines = [event_line(n, length=900 if n % 3 else None) for n in range(1000)]
    read: list[list[bytes]] = []
    real_parse = eventio._parse_block

    def parse(raws: list[bytes], report: InputReport) -> list:
        read.append(raws)
        return real_parse(raws, report)

    monkeypatch.setattr(eventio, "_parse_block", parse)
    report = InputReport("events.jsonl")
    blocks = list(eventio.read_jsonl_blocks(io.BytesIO(b"".join(lines)), report, 256))
    assert max(sum(map(len, raws)) for raws in read) < 10_000 + eventio.BLOCK_STEP * 900
    assert [e["event.id"] for b in blocks for e in b] == [f"e{n}" for n in range(1000)]
    assert (report.lines, report.events, report.malformed) == (1000, 1000, 0)
    monkeypatch.setattr(eventio, "BLOCK_BYTES", 2**30)
    read.clear()
    list(eventio.read_jsonl_blocks(io.BytesIO(b"".join(lines)), InputReport("e"), 256))
    assert [len(raws) for raws in read] == [256, 256, 256, 232]  # short lines: whole blocks


def test_a_batch_is_let_go_before_the_next_one_is_read(tmp_path, capsys, monkeypatch):
    """A scan holds one batch of events at a time (up to 256 events of up to the line
    limit: a gigabyte), not the one it evaluated while it reads the next."""
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(event_line(n) for n in range(1000)))
    processed: list[weakref.ref] = []
    alive_at_parse: list[int] = []
    real_process, real_parse = Pipeline.process, eventio._parse_block

    def process(self: Pipeline, batches: list) -> object:
        processed.append(weakref.ref(batches[0]))
        return real_process(self, batches)

    def parse(raws: list[bytes], report: InputReport) -> list:
        alive_at_parse.append(sum(ref() is not None for ref in processed))
        return real_parse(raws, report)

    monkeypatch.setattr(Pipeline, "process", process)
    monkeypatch.setattr(eventio, "_parse_block", parse)
    assert main(["scan", "--events", str(path), "--format", "jsonl", "--jobs", "1"]) == 0
    capsys.readouterr()
    assert len(processed) == 4 and len(alive_at_parse) >= 4
    assert alive_at_parse == [0] * len(alive_at_parse)

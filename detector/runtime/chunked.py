"""Parsing a large events file on more cores: workers read byte ranges, the caller evaluates.

`scan --events` spends about half its time reading JSON and checking each event's shape
(see bench/scan.py). For a file of at least PARALLEL_MIN_BYTES, worker processes each take
a chunk of lines (a byte range ending just after a newline), parse and check it exactly as
`read_jsonl` does, and hand back the chunk's valid events as JSON arrays (one C call to
write each, one to read it) with the chunk's counts and first malformed lines. The caller takes the
chunks in file order, so events, and so alerts, come in the same order as when it reads the
file itself, and malformed lines keep their numbers: a chunk's are relative to its first
line, shifted by the lines of the chunks before it. A worker that dies (killed, out of
memory) costs only speed: its chunk, and every later one, is parsed in the caller.
"""

from __future__ import annotations

import gc
import io
import multiprocessing
import os
from collections import deque
from collections.abc import Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from itertools import islice
from typing import BinaryIO

import orjson

from hpcsec.detector.config.site import SiteConfig
from hpcsec.detector.core.eventio import InputReport, read_jsonl_blocks
from hpcsec.detector.core.schema import Event
from hpcsec.detector.enrich.enricher import apply_policy
from hpcsec.detector.enrich.policy import apply_fleet_majority

PARALLEL_MIN_BYTES = 8 * 2**20  # below this, starting a worker costs more than it saves
CHUNK_BYTES = 2 * 2**20  # about 3,500 events: small enough to keep both processes busy
# Events per JSON array the caller reads at once: as few as it evaluates together, so they
# are still in the CPU cache when the rules read them (a whole chunk at once costs more).
PARSE_BATCH = 256
AHEAD_PER_WORKER = 2  # chunks parsed ahead of the caller: bounds the memory they hold


@dataclass(frozen=True)
class Prepare:
    """What a worker does to the events it parsed, before the caller's enrichment: the
    fleet's firmware majority (`apply_fleet_majority`), then the site policy of `config`."""

    config: SiteConfig
    majority: dict[str, str]

    def apply(self, events: list[Event]) -> None:
        if self.majority:
            apply_fleet_majority(events, self.majority)
        apply_policy(events, self.config)


@dataclass(frozen=True)
class ParsedChunk:
    """One chunk's valid events as a JSON array, and what its report would have said."""

    events_json: list[bytes]  # arrays of PARSE_BATCH events
    lines: int
    events: int
    malformed: int
    malformed_lines: list[tuple[int, str]]


def tune_gc() -> None:
    """Collect young objects every 50,000 allocations, not 700: parsed events are short-lived
    dicts, and the collector's passes over them cost a third of a scan (bench/scan.py)."""
    gc.set_threshold(50_000, 20, 20)


def parse_chunk(path: str, start: int, end: int, prepare: Prepare | None) -> ParsedChunk:
    """The events of bytes [start, end) of `path`, checked as `read_jsonl` checks them, then
    given what `prepare` says when it is given (see `read_parallel`)."""
    with open(path, "rb") as stream:
        stream.seek(start)
        data = stream.read(end - start)
    report = InputReport(path)
    events = [e for block in read_jsonl_blocks(io.BytesIO(data), report) for e in block]
    if prepare is not None:
        prepare.apply(events)
    arrays = [
        orjson.dumps(events[at : at + PARSE_BATCH]) for at in range(0, len(events), PARSE_BATCH)
    ]
    return ParsedChunk(
        arrays, report.lines, report.events, report.malformed, report.malformed_lines
    )


def chunk_bounds(stream: BinaryIO, size: int, chunk: int) -> Iterator[tuple[int, int]]:
    """Byte ranges of about `chunk` bytes covering [0, size), each ending after a newline
    (or at `size`), so every line falls whole in one range."""
    start = 0
    while start < size:
        stream.seek(min(start + chunk, size))
        stream.readline()
        end = min(stream.tell(), size)
        yield start, end
        start = end


def merge(report: InputReport, chunk: ParsedChunk, lines_before: int) -> None:
    """Add a chunk's counts and malformed lines (renumbered) to the file's report."""
    for line_no, why in chunk.malformed_lines:
        report.reject(lines_before + line_no, why)
    report.malformed += chunk.malformed - len(chunk.malformed_lines)
    report.events += chunk.events
    if chunk.lines:
        report.lines = lines_before + chunk.lines


def parse_in_caller(path: str, start: int, end: int, prepare: Prepare | None) -> ParsedChunk:
    """A chunk no worker could parse (the pool broke), parsed here."""
    return parse_chunk(path, start, end, prepare)


def read_parallel(
    path: str, stream: BinaryIO, report: InputReport, jobs: int, prepare: Prepare | None = None
) -> Iterator[list[Event]]:
    """The events of the regular file `stream` (opened from `path`), parsed by `jobs - 1`
    worker processes while the caller uses them, in lists of up to PARSE_BATCH; the same
    events, in the same order, and the same report as `read_jsonl(stream, report)`.

    `prepare`: the workers also give the events the fleet's firmware majority and apply the
    site policy (`enricher.apply_policy`), the one enrichment step that needs no node view
    and no other event: that moves a fifth of the caller's work to them, so the caller that
    evaluates keeps up with the parsing."""
    path = os.path.abspath(path)
    size = os.fstat(stream.fileno()).st_size
    bounds = chunk_bounds(stream, size, CHUNK_BYTES)
    workers = max(1, jobs - 1)
    context = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads
    with ProcessPoolExecutor(workers, mp_context=context, initializer=tune_gc) as pool:
        pending: deque[tuple[int, int, Future[ParsedChunk] | None]] = deque()

        def submit(start: int, end: int) -> None:
            try:
                pending.append((start, end, pool.submit(parse_chunk, path, start, end, prepare)))
            except BrokenProcessPool:
                pending.append((start, end, None))

        for start, end in islice(bounds, workers * AHEAD_PER_WORKER + 1):
            submit(start, end)
        lines_before = report.lines
        while pending:
            start, end, future = pending.popleft()
            try:
                parsed = future.result() if future is not None else None
            except BrokenProcessPool:
                parsed = None
            if parsed is None:
                parsed = parse_in_caller(path, start, end, prepare)
            for start, end in islice(bounds, 1):
                submit(start, end)
            merge(report, parsed, lines_before)
            lines_before = report.lines
            for array in parsed.events_json:
                yield orjson.loads(array)

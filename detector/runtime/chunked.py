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

That is the path of a scan with a store, which keeps every event. Without one the workers
also run the detection rules and send back only what the caller still needs (chunk_detect.py,
on `in_file_order` below).
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import stat
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from itertools import islice
from typing import Any, BinaryIO, Protocol, TypeVar

import orjson

from hpcsec.detector.config.site import SiteConfig
from hpcsec.detector.core.eventio import InputReport, bounded_lines, read_jsonl_blocks, skip_line
from hpcsec.detector.core.log import get_logger
from hpcsec.detector.core.schema import Event
from hpcsec.detector.core.switching import quick_thread_switches
from hpcsec.detector.enrich.enricher import apply_policy
from hpcsec.detector.enrich.policy import apply_fleet_majority

logger = get_logger(__name__)

# Below this, starting a worker costs more than it saves: its interpreter, imports and
# engine take about 0.8 s of CPU. Measured (python -m bench scan --events N, the longer of the
# two processes' CPU times against one process): 0.42x at 8 MiB, 0.82x at 17 MiB, 1.24x at
# 34 MiB, 1.66x at 112 MiB.
PARALLEL_MIN_BYTES = 32 * 2**20
CHUNK_BYTES = 2 * 2**20  # about 3,500 events: small enough to keep both processes busy
# Events per JSON array the caller reads at once: as few as it evaluates together, so they
# are still in the CPU cache when the rules read them (a whole chunk at once costs more).
PARSE_BATCH = 256
AHEAD_PER_WORKER = 2  # chunks handed to each worker and not done yet: enough to keep it busy
# Results a caller may hold before it takes them, by what each holds: a whole parsed chunk
# (2 MiB of JSON), or what a chunk's detection keeps (chunk_detect.py: the few events some
# rule matched). Within that bound a worker goes on while the caller is busy with what the
# chunks before kept: capped at its own AHEAD_PER_WORKER results, it waited on the caller,
# which then did more chunks itself: `--jobs 2` got 1.22x of `--jobs 1`'s speed on 600,000
# events, 1.46x without the cap (python -m bench scan; the host gave two processes 2.00x and
# 1.75x then).
WINDOW_PARSED = 3
WINDOW_DETECTED = 48
# and, whatever their number, no more chunks are handed out while the results done and not
# taken hold this much (their JSON): a file whose every event some rule matches (or every
# `gpu_device` event, which the caller always needs) keeps whole chunks, 48 of them 100 MB
WINDOW_BYTES = 32 * 2**20
LOCAL_AHEAD = 16


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

    # PARSE_BATCH events each: JSON arrays from a worker, the lists when parsed in the caller
    arrays: list[bytes] | list[list[Event]]
    lines: int
    events: int
    malformed: int
    malformed_lines: list[tuple[int, str]]

    @property
    def held_bytes(self) -> int:
        return sum(len(a) for a in self.arrays if isinstance(a, bytes))


def tune_gc() -> None:
    """Collect young objects every 50,000 allocations, not 700: parsed events are short-lived
    dicts, and the collector's passes over them cost a third of a scan (bench/scan.py)."""
    gc.set_threshold(50_000, 20, 20)


def parsed_blocks(
    path: str, start: int, end: int, prepare: Prepare | None, report: InputReport
) -> Iterator[list[Event]]:
    """The events of bytes [start, end) of `path`, checked as `read_jsonl` checks them, then
    given what `prepare` says when it is given (see `read_parallel`), in lists of up to
    PARSE_BATCH lines; `report` counts them. A caller works on one list before the next is
    parsed, so its events are still in the CPU cache (a whole chunk parsed, then prepared,
    then evaluated, cost a fifth more CPU per event: python -m bench scan)."""
    with open(path, "rb") as stream:
        stream.seek(start)
        lines = bounded_lines(stream, end - start)  # a range holding an endless line is long
        for events in read_jsonl_blocks(lines, report, PARSE_BATCH):
            if prepare is not None:
                prepare.apply(events)
            yield events


def parse_chunk(
    path: str, start: int, end: int, prepare: Prepare | None, encode: bool = True
) -> ParsedChunk:
    """`parsed_blocks` as JSON arrays for the caller to read (`encode`), or as they are
    (parsed in the caller)."""
    report = InputReport(path)
    lists = list(parsed_blocks(path, start, end, prepare, report))
    arrays: list[bytes] | list[list[Event]] = [orjson.dumps(a) for a in lists] if encode else lists
    return ParsedChunk(
        arrays, report.lines, report.events, report.malformed, report.malformed_lines
    )


def chunk_bounds(stream: BinaryIO, size: int, chunk: int) -> Iterator[tuple[int, int]]:
    """Byte ranges of about `chunk` bytes covering [0, size), each ending after a newline
    (or at `size`), so every line falls whole in one range."""
    start = 0
    while start < size:
        stream.seek(min(start + chunk, size))
        skip_line(stream)
        end = min(stream.tell(), size)
        yield start, end
        start = end


class ChunkCounts(Protocol):
    """What a chunk's result says about its lines, for the file's report."""

    @property
    def lines(self) -> int: ...
    @property
    def events(self) -> int: ...
    @property
    def malformed(self) -> int: ...
    @property
    def malformed_lines(self) -> list[tuple[int, str]]: ...
    @property
    def held_bytes(self) -> int: ...


def merge(report: InputReport, chunk: ChunkCounts, lines_before: int) -> None:
    """Add a chunk's counts and malformed lines (renumbered) to the file's report."""
    for line_no, why in chunk.malformed_lines:
        report.reject(lines_before + line_no, why)
    report.malformed += chunk.malformed - len(chunk.malformed_lines)
    report.events += chunk.events
    if chunk.lines:
        report.lines = lines_before + chunk.lines


def parse_in_caller(path: str, start: int, end: int, prepare: Prepare | None) -> ParsedChunk:
    """A chunk no worker could do (the pool broke, or the worker raised), parsed here (not
    written as JSON: what a worker could not write must not stop the caller)."""
    return parse_chunk(path, start, end, prepare, encode=False)


T = TypeVar("T", bound=ChunkCounts)
Task = Callable[[str, int, int, Prepare | None], T]


@dataclass
class Slot:
    """One chunk on its way: a worker's future, or the result the caller got itself."""

    start: int
    end: int
    future: Future[Any] | None
    result: Any = None


def worth_workers(path: str) -> bool:
    """Whether `path` is a regular file large enough for workers to pay (PARALLEL_MIN_BYTES)."""
    try:
        info = os.stat(path)
    except (OSError, ValueError):
        return False
    return stat.S_ISREG(info.st_mode) and info.st_size >= PARALLEL_MIN_BYTES


def new_pool(workers: int) -> ProcessPoolExecutor:
    """`workers` processes; each starts at the first task it is handed."""
    context = multiprocessing.get_context("spawn")  # no fork of a process that may hold threads
    return ProcessPoolExecutor(workers, mp_context=context, initializer=tune_gc)


def in_file_order(
    path: str,
    stream: BinaryIO,
    report: InputReport,
    workers: int,
    task: Task[T],
    prepare: Prepare | None,
    local: Task[T] | None = None,
    pool: ProcessPoolExecutor | None = None,
    window_size: int = WINDOW_PARSED,
) -> Iterator[T | ParsedChunk]:
    """`task`'s result for each chunk of the regular file `stream` (opened from `path`), in
    file order, each one's counts merged into `report` before it is yielded.

    `workers` processes do the chunks, each given AHEAD_PER_WORKER it has not done yet;
    at most `window_size` chunks are on their way or done and not yet taken, which bounds the
    memory their results hold. With `local`, the caller does a later chunk itself (`local`,
    as `task` would) whenever the next one's worker is not done yet, so its core is not left
    idle, up to LOCAL_AHEAD chunks ahead. A chunk whose worker died or raised (an input no
    test foresaw) is parsed here instead (`parse_in_caller`): a ParsedChunk, whatever `task`
    returns. `pool`: `workers` processes started earlier (chunk_detect.start_workers), which
    whoever started them shuts down."""
    bounds = chunk_bounds(stream, os.fstat(stream.fileno()).st_size, CHUNK_BYTES)
    ahead = workers * AHEAD_PER_WORKER
    window_size = max(window_size, ahead + 1)
    with contextlib.ExitStack() as owned:
        executor = pool if pool is not None else owned.enter_context(new_pool(workers))
        # the pool's threads pass chunks and results while this one parses and evaluates
        owned.enter_context(quick_thread_switches())
        window: deque[Slot] = deque()

        def hand_out() -> None:
            """More chunks to the workers, up to `ahead` not done and `window_size` held."""
            busy = sum(1 for slot in window if _waiting(slot))
            if busy < ahead and _done_bytes(window) >= WINDOW_BYTES:
                return
            for start, end in islice(bounds, max(0, min(ahead - busy, window_size - len(window)))):
                try:
                    future = executor.submit(task, path, start, end, prepare)
                except BrokenProcessPool:
                    future = None
                window.append(Slot(start, end, future))

        hand_out()
        lines_before = report.lines
        while window:
            head = window[0]
            here = sum(1 for slot in window if slot.future is None and slot.result is not None)
            if local is not None and _waiting(head) and here < LOCAL_AHEAD:
                for start, end in islice(bounds, 1):  # a later chunk, done here meanwhile
                    result = _done_here(local, path, start, end, prepare)
                    window.append(Slot(start, end, None, result))
                    break
                else:
                    local = None  # every chunk is handed out: wait for the workers
                hand_out()
                continue
            window.popleft()
            done = head.result if head.result is not None else _result(head, path, prepare)
            hand_out()
            merge(report, done, lines_before)
            lines_before = report.lines
            yield done


def _done_bytes(window: deque[Slot]) -> int:
    """What the workers' results done and not taken yet hold (their JSON)."""
    return sum(
        future.result().held_bytes
        for slot in window
        if (future := slot.future) is not None
        and future.done()
        and not future.cancelled()
        and future.exception() is None
    )


def _waiting(slot: Slot) -> bool:
    return slot.future is not None and not slot.future.done()


def _result(slot: Slot, path: str, prepare: Prepare | None) -> Any:
    """A worker's result, or the chunk parsed here when its worker died or raised."""
    try:
        if slot.future is not None:
            return slot.future.result()
    except BrokenProcessPool:
        pass
    except Exception as exc:  # a bug a worker hit: this chunk is parsed here
        logger.warning("a worker failed on %s, bytes %d-%d: %r", path, slot.start, slot.end, exc)
    return parse_in_caller(path, slot.start, slot.end, prepare)


def _done_here(local: Task[T], path: str, start: int, end: int, prepare: Prepare | None) -> Any:
    try:
        return local(path, start, end, prepare)
    except Exception as exc:  # as a worker's failure: this chunk is parsed here
        logger.warning("failed on %s, bytes %d-%d: %r", path, start, end, exc)
        return parse_in_caller(path, start, end, prepare)


def read_parallel(
    path: str,
    stream: BinaryIO,
    report: InputReport,
    jobs: int,
    prepare: Prepare | None = None,
    pool: ProcessPoolExecutor | None = None,
) -> Iterator[list[Event]]:
    """The events of the regular file `stream` (opened from `path`), parsed by `jobs - 1`
    worker processes while the caller uses them, in lists of up to PARSE_BATCH; the same
    events, in the same order, and the same report as `read_jsonl(stream, report)`.

    `prepare`: the workers also give the events the fleet's firmware majority and apply the
    site policy (`enricher.apply_policy`), the one enrichment step that needs no node view
    and no other event: that moves a fifth of the caller's work to them, so the caller that
    evaluates keeps up with the parsing."""
    path = os.path.abspath(path)
    workers = max(1, jobs - 1)
    for parsed in in_file_order(path, stream, report, workers, parse_chunk, prepare, None, pool):
        for array in parsed.arrays:
            yield orjson.loads(array) if isinstance(array, bytes) else array

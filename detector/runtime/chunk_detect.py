"""`scan --events` on more cores, with the detection rules run in the worker processes.

Parsing a large file in workers (chunked.py) left the caller reading every event back,
enriching it and running every rule: it, not the workers, set the pace. Here each worker
also runs the detection rules (an engine of its own, built from the caller's very rules,
without the correlation rules) on the events of its chunk, and sends back only the events
the caller still needs:

- the events a detection rule matched: the caller evaluates them again with its own engine,
  which makes their matches, feeds the correlations (a correlation consumes only the matches
  of the rules it names, so an event no rule matched feeds none) and builds the alerts;
- every `gpu_device` event, and the fields of every other `gpu_process` event that the
  `gpu_users` enrichment step reads: that step relates the two kinds within a batch of the
  scan, a batch the worker cannot see whole (it may begin in the chunk before), so the
  caller runs it and the rules of those events;
- the chunk's counts and first malformed lines (chunked.py).

The caller cuts the file's events into the same batches of `size` events the one-process
scan evaluates, so every match, and every alert, comes in the same order: the output is that
of `--jobs 1`. Skipping the events no rule matched changes nothing because a scan's engine
holds every correlation match until the end of the input (`lateness=None`, reorder.py);
`Detect.of` refuses any other engine. A chunk whose worker died or raised is parsed by the
caller (chunked.in_file_order), which then evaluates all of its events itself.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import pickle
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import BinaryIO

import orjson

from hpcsec.detector.core.eventio import InputReport
from hpcsec.detector.core.schema import Event
from hpcsec.detector.engine.evaluate import Engine, log_compile_error
from hpcsec.detector.engine.ruleset import RuleSet
from hpcsec.detector.runtime import chunked

# What the gpu_users enrichment step (enricher.fill_gpu_users) reads of a gpu_process event.
GPU_USERS_READS = ("event.category", "host.name", "gpu.uuid", "gpu.index", "user.name", "user.id")
DECIDED_BY_CALLER = "gpu_device"  # its gpu_users fields depend on the whole batch

# (position among the chunk's events, the event, whether it is there for enrichment only)
Kept = tuple[int, Event, bool]


@dataclass(frozen=True)
class Detect:
    """What a worker needs to run the detection rules as the caller would: the caller's
    rules (a cached rule travels as its header and pickled bytes) without the correlations,
    which the caller runs, and the engine's settings, pickled once (`payload`).

    It travels with every chunk, not as the workers' start-up arguments: those are written
    to a starting worker through a pipe the caller itself holds open, so a worker that dies
    before reading them all would block the caller for good. A worker builds its engine from
    the first chunk's and keeps it while `digest` stays the same."""

    payload: bytes
    digest: bytes

    @classmethod
    def of(cls, ruleset: RuleSet, engine: Engine) -> Detect | None:
        """None when the caller's engine hands correlations their matches before the end of
        the input (it would then have to see every event, in batches, itself), or when a
        rule cannot be pickled (as the rule cache, rulecache.write, gives up on it): the
        workers then only parse."""
        if engine.pending.lateness is not None:
            return None
        rules = [r for r in ruleset.rules if r.kind != "correlation"]
        try:
            payload = pickle.dumps(
                (rules, engine.placeholders, engine.index_min, engine.code_cache),
                protocol=pickle.HIGHEST_PROTOCOL,
            )
        except (pickle.PicklingError, RecursionError, TypeError, AttributeError):
            return None
        return cls(payload, hashlib.sha256(payload).digest())

    def engine(self, quiet: bool = False) -> Engine:
        """An engine of these rules; its categories compile at their first event (`quiet`:
        a worker's, whose compile errors go back to the caller with its chunks)."""
        rules, placeholders, index_min, code_cache = pickle.loads(self.payload)
        return Engine(
            RuleSet(rules=rules),
            placeholders,
            index_min=index_min,
            lazy=True,
            code_cache=code_cache,
            quiet=quiet,
        )


@dataclass(frozen=True)
class DetectedChunk:
    """What a worker sends back of a chunk: the events the caller needs, as one JSON array,
    with their positions among the chunk's valid events; the counts of chunked.ParsedChunk."""

    kept: bytes | list[Event]  # JSON from a worker; the events themselves when done here
    positions: list[int]
    context: list[int]  # indices into the array of the events kept for enrichment only
    lines: int
    events: int
    malformed: int
    malformed_lines: list[tuple[int, str]]
    # rules a worker's engine could not compile while detecting this chunk (the caller logs
    # them, once: evaluate.log_compile_error)
    compile_errors: tuple[str, ...] = ()

    @property
    def held_bytes(self) -> int:
        return len(self.kept) if isinstance(self.kept, bytes) else 0


_engines: dict[bytes, Engine] = {}  # a worker's engine, by the digest of its Detect


def worker_engine(detect: Detect) -> Engine:
    engine = _engines.get(detect.digest)
    if engine is None:
        _engines.clear()
        engine = _engines[detect.digest] = detect.engine(quiet=True)
    return engine


def detect_chunk(
    path: str,
    start: int,
    end: int,
    prepare: chunked.Prepare | None,
    detect: Detect,
    engine: Engine | None = None,
) -> DetectedChunk:
    """Bytes [start, end) of `path` parsed and prepared as chunked.parse_chunk does, the
    detection rules run on them; what the caller needs of them (see the module's doc), as
    JSON to send back, or as they are when the caller does the chunk with its `engine`."""
    report = InputReport(path)
    detecting = engine or worker_engine(detect)
    errors_before = len(detecting.compile_errors)
    evaluate = detecting.evaluate
    kept: list[Event] = []
    positions: list[int] = []
    context: list[int] = []
    first = 0  # position of the list's first event among the chunk's
    for events in chunked.parsed_blocks(path, start, end, prepare, report):
        matched = {id(m.events[0]) for m in evaluate(events)}
        for position, event in enumerate(events, first):
            category = event.get("event.category")
            if category == DECIDED_BY_CALLER or id(event) in matched:
                kept.append(event)
            elif category == "gpu_process":
                context.append(len(kept))
                kept.append({k: event[k] for k in GPU_USERS_READS if k in event})
            else:
                continue
            positions.append(position)
        first += len(events)
    return DetectedChunk(
        kept if engine is not None else orjson.dumps(kept),
        positions,
        context,
        report.lines,
        report.events,
        report.malformed,
        report.malformed_lines,
        tuple(detecting.compile_errors[errors_before:]),
    )


def kept_of(chunk: DetectedChunk | chunked.ParsedChunk) -> tuple[int, Iterable[Kept]]:
    """(valid events of the chunk, what the caller keeps of them in file order). A chunk
    parsed here (its worker failed) keeps every event: the caller evaluates them all."""
    if isinstance(chunk, chunked.ParsedChunk):
        events = [
            e
            for array in chunk.arrays
            for e in (orjson.loads(array) if isinstance(array, bytes) else array)
        ]
        return chunk.events, ((n, e, False) for n, e in enumerate(events))
    for message in chunk.compile_errors:
        log_compile_error(message)
    context = set(chunk.context)
    events = orjson.loads(chunk.kept) if isinstance(chunk.kept, bytes) else chunk.kept
    return chunk.events, (
        (position, event, n in context)
        for n, (position, event) in enumerate(zip(chunk.positions, events, strict=True))
    )


def batches_of(
    chunks: Iterable[tuple[int, Iterable[Kept]]], size: int
) -> Iterator[tuple[int, list[Event], list[Event]]]:
    """Per batch of `size` consecutive events of the file (the last one smaller), as the
    one-process scan cuts them: (its number of events, the events to evaluate, the events
    only its enrichment reads)."""
    total = 0  # events of the chunks before this one
    batch = 0  # number of the batch being filled
    evaluate: list[Event] = []
    context: list[Event] = []
    for count, kept in chunks:
        for position, event, only_context in kept:
            while (total + position) // size > batch:
                yield size, evaluate, context
                evaluate, context, batch = [], [], batch + 1
            (context if only_context else evaluate).append(event)
        total += count
        while (batch + 1) * size <= total:
            yield size, evaluate, context
            evaluate, context, batch = [], [], batch + 1
    if total > batch * size:
        yield total - batch * size, evaluate, context


def warm_up() -> None:
    """A worker's first task: taking it imports this module, and so the engine's."""


def start_workers(path: str | None, jobs: int) -> ProcessPoolExecutor | None:
    """The `jobs - 1` workers a scan of the events file `path` will use, started before the
    caller loads its rules: their start (a spawn, the imports: about a second of the other
    core) then overlaps that load and the firmware pass instead of following them. None when
    the scan will not use any (one job, stdin, a file too small to pay)."""
    if jobs < 2 or not path or path == "-" or not chunked.worth_workers(path):
        return None
    pool = chunked.new_pool(jobs - 1)
    pool.submit(warm_up)
    return pool


def build_engine(pool: ProcessPoolExecutor, detect: Detect) -> None:
    """Has a started worker build its engine now (the caller meanwhile reads the firmware
    lines), not at its first chunk. A worker that died costs nothing here: its chunks are
    then parsed in the caller (chunked.in_file_order)."""
    with contextlib.suppress(BrokenProcessPool):
        pool.submit(_build_engine, detect)


def _build_engine(detect: Detect) -> None:  # in a worker: returns nothing to send back
    worker_engine(detect)


def read_detected(
    path: str,
    stream: BinaryIO,
    report: InputReport,
    jobs: int,
    prepare: chunked.Prepare,
    detect: Detect,
    size: int,
    pool: ProcessPoolExecutor | None = None,
) -> Iterator[tuple[int, list[Event], list[Event]]]:
    """`batches_of` the regular file `stream` (opened from `path`), its chunks detected by
    `jobs - 1` workers and by the caller, which does a chunk whenever the next worker's is
    not ready: the caller evaluates only what the chunks keep, so it has time to spare.
    (On two cores that beats two workers and an idle caller: no third process competes for
    them, and the caller starts on the first chunks while its worker is still starting.)"""
    task = functools.partial(detect_chunk, detect=detect)
    local = functools.partial(detect_chunk, detect=detect, engine=detect.engine())
    workers = max(1, jobs - 1)
    chunks = chunked.in_file_order(
        os.path.abspath(path),
        stream,
        report,
        workers,
        task,
        prepare,
        local,
        pool,
        chunked.WINDOW_DETECTED,  # a chunk's result holds only the few events it kept
    )
    yield from batches_of(map(kept_of, chunks), size)

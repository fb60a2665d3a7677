"""Where scan's and collect's events come from: an events file, a snapshot, live sensors."""

from __future__ import annotations

import io
import os
import stat
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any, BinaryIO, TextIO

import orjson

from hpcsec.detector.config.site import SiteConfig
from hpcsec.detector.core import eventio
from hpcsec.detector.core.display import visible
from hpcsec.detector.core.errors import SourceError, UsageError
from hpcsec.detector.core.eventio import InputReport, checked_event, read_jsonl_blocks
from hpcsec.detector.core.schema import Event
from hpcsec.detector.enrich.enricher import POLICY_STEP
from hpcsec.detector.enrich.policy import annotate_fleet_majority, apply_fleet_majority
from hpcsec.detector.enrich.view import FILE_EVENTS_NOTE
from hpcsec.detector.runtime import chunk_detect, chunked, registry
from hpcsec.detector.runtime.node import live_context
from hpcsec.detector.runtime.pipeline import SourceBatch, capture
from hpcsec.detector.runtime.sensorset import SensorSet
from hpcsec.sensors.base import SensorContext, SensorRun
from hpcsec.sensors.cmdline_condense import Literals
from hpcsec.sensors.snapshot import Snapshot, open_snapshot

SEARCH_BLOCK = 4 * 2**20  # bytes searched at once for the firmware lines


@dataclass
class ScanReport:
    """What the scan read, for stderr: sensors that ran (or not) and malformed input."""

    sensor_runs: list[SensorRun] = field(default_factory=list)
    inputs: list[InputReport] = field(default_factory=list)
    skipped_samples: list[str] = field(default_factory=list)
    events: int = 0
    notes: list[str] = field(default_factory=list)

    def print(self, out: TextIO) -> None:
        """One line per sensor over all samples, then every distinct problem it reported
        (its own status, or status records among its events, e.g. malformed inputs)."""
        samples: dict[str, int] = {}
        events: dict[str, int] = {}
        problems: dict[tuple[str, str, str], int] = {}
        for run in self.sensor_runs:
            samples[run.name] = samples.get(run.name, 0) + 1
            events[run.name] = events.get(run.name, 0) + sum(
                1 for e in run.events if e.get("event.category") != "sensor_status"
            )
            for status in (
                run.status,
                *(e for e in run.events if e.get("event.category") == "sensor_status"),
            ):
                if status.get("event.action") != "ok":
                    key = (
                        run.name,
                        str(status.get("event.action")),
                        str(status.get("message", "")),
                    )
                    problems[key] = problems.get(key, 0) + 1
        for name, count in samples.items():
            bad = {k: v for k, v in problems.items() if k[0] == name}
            state = "ok" if not bad else ", ".join(sorted({k[1] for k in bad}))
            per = f" in {count} samples" if count > 1 else ""
            # status messages quote node data (paths, names): shown escaped, never obeyed
            print(f"hpcsec: sensor {name}: {visible(state)}: {events[name]} events{per}", file=out)
            for (_, action, message), times in bad.items():
                again = f" (x{times})" if times > 1 else ""
                print(f"hpcsec:   {visible(action)}: {visible(message)}{again}", file=out)
        for problem in self.skipped_samples:
            print(f"hpcsec: skipped a snapshot sample: {visible(problem)}", file=out)
        for report in self.inputs:
            text = report.describe()
            if text:
                print(f"hpcsec: {visible(text)}", file=out)
        for note in self.notes:
            print(f"hpcsec: note: {visible(note)}", file=out)
        print(f"hpcsec: {self.events} events evaluated", file=out)


def demo_snapshot_dir() -> Path:
    return Path(str(files("hpcsec.demo")))


def fleet_majority(stream: io.BufferedIOBase) -> dict[str, str]:
    """Per firmware component, the version most hosts of an events file run (see policy).

    A first pass that parses only firmware lines, so the majority is known before the
    events are evaluated: the file is searched in large blocks for the field's name (one C
    search, not a Python step per line) and only the lines holding it are parsed.
    """
    firmware: list[Event] = []
    for raw in lines_containing(stream, b"firmware.component"):
        try:
            event = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if isinstance(event, dict) and event.get("event.category") == "firmware":
            event, problem = checked_event(event)  # read_jsonl skips and reports the rest
            if problem is None:
                firmware.append(event)
    if not firmware:
        return {}
    annotate_fleet_majority(firmware)
    return {
        e["firmware.component"]: e["firmware.fleet_majority_version"]
        for e in firmware
        if "firmware.fleet_majority_version" in e
    }


def lines_containing(
    stream: io.BufferedIOBase, needle: bytes, block: int = SEARCH_BLOCK
) -> Iterator[bytes]:
    """The lines of `stream` (split on b"\\n" as iterating it does) that contain `needle`,
    but for lines longer than MAX_LINE_BYTES, which read_jsonl skips too: the buffer never
    grows past about that size, whatever the file holds.

    The file is read into one buffer, again and again: a fresh block per read (and the
    copies that joined it to the last one's unfinished line) cost page faults and copies
    that took three quarters of the search (bench/scan.py)."""
    buffer = bytearray(block)
    held = 0  # bytes at the buffer's start: the line the last read left unfinished
    skipping = False  # in a line too long to keep: its bytes are dropped up to its newline
    while True:
        if held == len(buffer):  # a line longer than the buffer
            if held > eventio.MAX_LINE_BYTES:  # (exactly the limit is a line, if it ends)
                held, skipping = 0, True
            else:  # room for more of it
                buffer.extend(bytes(len(buffer)))
        with memoryview(buffer) as view:
            got = stream.readinto(view[held:])
        if not got:
            break
        filled = held + got
        begin = 0
        if skipping:
            begin = buffer.find(b"\n", 0, filled) + 1
            if not begin:  # still inside the long line
                held = 0
                continue
            skipping = False
        end = buffer.rfind(b"\n", begin, filled) + 1  # the lines that ended in this read
        if end:
            yield from _lines_with(buffer, needle, begin, end)
        keep = end or begin  # from there on: the line this read left unfinished
        buffer[: filled - keep] = buffer[keep:filled]
        held = filled - keep
    if (
        held
        and not skipping
        and held <= eventio.MAX_LINE_BYTES
        and buffer.find(needle, 0, held) >= 0
    ):
        yield bytes(buffer[:held])


def _lines_with(text: bytearray, needle: bytes, begin: int, end: int) -> Iterator[bytes]:
    """The lines of text[begin:end] (whole lines) that contain `needle`, but those longer
    than MAX_LINE_BYTES."""
    found = text.find(needle, begin, end)
    while found >= 0:
        start = text.rfind(b"\n", 0, found) + 1
        stop = text.index(b"\n", found, end) + 1
        if stop - start <= eventio.MAX_LINE_BYTES:
            yield bytes(text[start:stop])
        found = text.find(needle, stop, end)


def snapshot_samples(
    snapshot: Snapshot,
    config: SiteConfig,
    sensors: SensorSet,
    options: dict[str, Any] | None = None,
    on_skip: Callable[[str], None] = lambda problem: None,
) -> Iterator[tuple[SensorContext, list[SensorRun]]]:
    """Each sample of a snapshot run through `sensors`, with the context it was read through;
    an unreadable sample is reported to `on_skip` and the others still count."""
    state: dict[str, Any] = {}
    for sample in snapshot.samples:
        try:
            ctx = sample.context(config, state, options)
        except SourceError as exc:
            on_skip(str(exc))
            continue
        yield ctx, sensors.sample(ctx)


class EventSources:
    """Scan's sources; each yields SourceBatches (not enriched yet: the pipeline does it)."""

    def __init__(
        self, config: SiteConfig, report: ScanReport, workers: ProcessPoolExecutor | None = None
    ):
        self.config = config
        self.report = report
        self.workers = workers  # started early for an events file (chunk_detect.start_workers)

    def _batches(
        self, blocks: Iterator[list[Event]], size: int, enriched: frozenset[str] = frozenset()
    ) -> Iterator[SourceBatch]:
        """Batches of exactly `size` events (the last one smaller) from lists of any size."""
        batch: list[Event] = []
        for events in blocks:
            if not batch and len(events) == size:  # the common case: a block is a batch
                self.report.events += size
                yield SourceBatch(events, None, enriched)
                continue
            batch.extend(events)
            while len(batch) >= size:
                self.report.events += size
                yield SourceBatch(batch[:size], None, enriched)
                batch = batch[size:]
        if batch:
            self.report.events += len(batch)
            yield SourceBatch(batch, None, enriched)

    def from_events_file(
        self, path: str, size: int, jobs: int = 1, detect: chunk_detect.Detect | None = None
    ) -> Iterator[SourceBatch]:
        """`jobs` > 1: a regular file of at least chunked.PARALLEL_MIN_BYTES is parsed by
        `jobs - 1` worker processes while this one evaluates (same events, same order); with
        `detect`, by `jobs` workers that also run the detection rules, and the batches hold
        only the events this process must still evaluate (runtime/chunk_detect.py)."""
        report = InputReport("stdin" if path == "-" else path)
        self.report.inputs.append(report)
        self.report.notes.append(FILE_EVENTS_NOTE)
        if path == "-":
            yield from self._batches(read_jsonl_blocks(sys.stdin.buffer, report, size), size)
            return
        try:
            stream = open(path, "rb")  # noqa: SIM115 - closed below, after the generator
        except OSError as exc:
            raise UsageError(f"cannot read events file {path}: {exc.strerror}") from None
        with stream:
            if self.workers is not None and detect is not None:
                chunk_detect.build_engine(self.workers, detect)
            info = os.fstat(stream.fileno())
            majority: dict[str, str] = {}
            if stat.S_ISREG(info.st_mode):  # a FIFO or a device is read once, as stdin is
                majority = fleet_majority(stream)
                stream.seek(0)
            blocks: Iterator[list[Event]]
            enriched: frozenset[str] = frozenset()
            if (
                jobs > 1
                and stat.S_ISREG(info.st_mode)
                and info.st_size >= chunked.PARALLEL_MIN_BYTES
            ):
                prepare = chunked.Prepare(self.config, majority)
                if detect is not None:
                    yield from self._detected(path, stream, report, jobs, prepare, detect, size)
                    return
                blocks = chunked.read_parallel(path, stream, report, jobs, prepare, self.workers)
                enriched = POLICY_STEP  # the workers applied the majority and the site policy
            else:
                blocks = read_jsonl_blocks(stream, report, size)
                if majority:
                    blocks = (apply_fleet_majority(events, majority) for events in blocks)
            yield from self._batches(blocks, size, enriched)

    def _detected(
        self,
        path: str,
        stream: BinaryIO,
        report: InputReport,
        jobs: int,
        prepare: chunked.Prepare,
        detect: chunk_detect.Detect,
        size: int,
    ) -> Iterator[SourceBatch]:
        """The batches of `chunk_detect.read_detected`; each counts all of its events."""
        for count, events, context in chunk_detect.read_detected(
            path, stream, report, jobs, prepare, detect, size, self.workers
        ):
            self.report.events += count
            if events:  # the context only ever serves events to evaluate
                yield SourceBatch(events, None, POLICY_STEP, context)

    def _sampled(self, ctx: SensorContext, runs: list[SensorRun]) -> SourceBatch:
        self.report.sensor_runs.extend(runs)
        events = [e for run in runs for e in run.events]
        self.report.events += len(events)
        view, status = capture(ctx, events)
        return SourceBatch([*events, *status], view)

    def from_snapshot(self, path: str | None, demo: bool = False) -> Iterator[SourceBatch]:
        snapshot = open_snapshot(demo_snapshot_dir() if demo else Path(path or "."))
        with SensorSet(registry.select(None)) as sensors:
            for ctx, runs in snapshot_samples(
                snapshot, self.config, sensors, on_skip=self.report.skipped_samples.append
            ):
                yield self._sampled(ctx, runs)

    def live(self, args: Any, cmdline_literals: Literals | None = None) -> Iterator[SourceBatch]:
        """The node's sensors now; `cmdline_literals`: the rules' (SensorContext's)."""
        try:
            specs = registry.select(args.sensor)
        except KeyError as exc:
            raise UsageError(f"unknown sensor {exc.args[0]}") from None
        options: dict[str, Any] = {}
        capture = getattr(args, "pcap", None) or getattr(args, "interface", None)
        if capture:  # RoCE flows come from a capture: scan it beside the node's sensors
            options = {
                k: v
                for k, v in (
                    ("pcap", args.pcap),
                    ("interface", args.interface),
                    ("duration", args.duration),
                )
                if v is not None
            }
            if "roce" not in {s.name for s in specs}:
                specs = [*specs, registry.by_name()["roce"]]
        ctx = live_context(
            self.config,
            args.sysfs_root,
            args.procfs_root,
            args.etc_root,
            options=options,
            cmdline_literals=cmdline_literals,
        )
        with SensorSet(specs) as sensors:
            yield self._sampled(ctx, sensors.sample(ctx))

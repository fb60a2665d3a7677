"""Reading events from JSONL: malformed lines are skipped, counted and reported, never fatal.

An event is one JSON object with flat dotted field names. A nested object
(`{"process": {"name": "x"}}`, as some SIEM exports write ECS) is read as those dotted names.
A schema field that holds one value (`process.name`, `user.id`) must not be a list or an
object, and `@timestamp` is RFC 3339 text: enrichment, rules and correlation windows read them
so, and such a line is malformed. An event without `event.id` gets the one new_event would give
it (a hash of its fields), so a replayed file keeps its ids.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any, BinaryIO

import orjson

from hpcsec.detector.core.fields import FIELDS
from hpcsec.detector.core.schema import Event, event_id
from hpcsec.detector.core.text import MAX_DEPTH, escape_value
from hpcsec.detector.core.timefmt import is_event_time

MAX_REPORTED_LINES = 5
ONE_VALUE_FIELDS = {f.name: f.type for f in FIELDS if f.type not in ("list", "object")}
ONE_VALUE_NAMES = ONE_VALUE_FIELDS.keys()
LIST_NAMES = frozenset(f.name for f in FIELDS if f.type == "list")
BLOCK_LINES = 256  # lines parsed per list; scan evaluates batches of this size
# A line longer than this, newline included, is never read whole: a file of one endless line
# must not take the scan's memory (or the node's). It is skipped, SKIP_READ bytes at a time,
# and reported as malformed. It must stay well above the longest event a sensor writes, or a
# process could make its own event unreadable: the process sensor keeps 64 KiB of command
# line, as `process.command_line` and again as `process.args`, and three 16 KiB environment
# values, a control byte costing up to 6 bytes of JSON: such an event stays under 1 MiB
# (test_scan_long_lines.py builds the longest). A batch of BLOCK_LINES events may still hold
# 256 events of up to this size: 1 GiB; the lines of a block are read up to BLOCK_BYTES (and
# BLOCK_STEP more lines), so the raw lines are not held as well.
MAX_LINE_BYTES = 4 * 2**20
SKIP_READ = 2**16
BLOCK_BYTES = 16 * 2**20
BLOCK_STEP = 16  # lines read at once (one C call) before the block's size is looked at
OVERLONG = b"\x00overlong"  # stands for a skipped line; told from a read line by identity


@dataclass
class InputReport:
    """What was wrong with an input: counts and the first few line numbers."""

    source: str
    lines: int = 0
    events: int = 0
    malformed: int = 0
    malformed_lines: list[tuple[int, str]] = field(default_factory=list)

    def reject(self, line_no: int, why: str) -> None:
        self.malformed += 1
        if len(self.malformed_lines) < MAX_REPORTED_LINES:
            self.malformed_lines.append((line_no, why))

    def describe(self) -> str | None:
        if not self.malformed:
            return None
        first = "; ".join(f"line {n}: {why}" for n, why in self.malformed_lines)
        more = "" if self.malformed <= len(self.malformed_lines) else ", …"
        return (
            f"{self.source}: skipped {self.malformed} malformed line(s) of {self.lines} "
            f"({first}{more})"
        )


def read_jsonl(stream: BinaryIO | Iterable[bytes], report: InputReport) -> Iterator[Event]:
    """Events from JSONL lines; blank lines are ignored, anything else must be an object."""
    for events in read_jsonl_blocks(stream, report):
        yield from events


def read_jsonl_blocks(
    stream: BinaryIO | Iterable[bytes], report: InputReport, block: int = BLOCK_LINES
) -> Iterator[list[Event]]:
    """`read_jsonl`'s events as one list per `block` lines (fewer where lines are malformed
    or blank): a caller that works on lists takes them without a generator step per event.
    The report counts the lines and events of each block before the block is yielded. A
    stream is read through `bounded_lines`; other iterables hold their lines already."""
    lines = bounded_lines(stream) if hasattr(stream, "readline") else iter(stream)
    while True:
        raws = _block_of(lines, block)
        if not raws:
            return
        events = _parse_block(raws, report)
        if events:
            yield events


def _block_of(lines: Iterator[bytes], block: int) -> list[bytes]:
    """Up to `block` lines, fewer once they pass BLOCK_BYTES: 256 lines just under the line
    limit would otherwise be a gigabyte read before the first is parsed."""
    raws = list(islice(lines, min(block, BLOCK_STEP)))
    size = sum(map(len, raws))
    while len(raws) < block and size < BLOCK_BYTES:
        more = list(islice(lines, min(block - len(raws), BLOCK_STEP)))
        if not more:
            break
        raws += more
        size += sum(map(len, more))
    return raws


def bounded_lines(stream: Any, budget: int | None = None) -> Iterator[bytes]:
    """The lines of a binary stream (the last one perhaps without its newline), none of them
    read longer than MAX_LINE_BYTES: a longer one is skipped and stands as OVERLONG.
    `budget`: how many bytes to read, when the stream goes on past them (a chunk of a file):
    no read goes past them, even when the file changed after the chunk was cut."""
    readline = stream.readline
    limit = MAX_LINE_BYTES
    while budget is None or budget > 0:
        line = readline(limit + 1 if budget is None else min(limit + 1, budget))
        if not line:
            return
        if budget is not None:
            budget -= len(line)
        if len(line) > limit:
            if not line.endswith(b"\n"):
                skipped = skip_line(stream, budget)
                if budget is not None:
                    budget -= skipped
            line = OVERLONG
        yield line


def skip_line(stream: Any, budget: int | None = None) -> int:
    """Read to just past the next newline (or the end, or `budget` bytes), SKIP_READ bytes
    at most at a time; how many bytes that was."""
    skipped = 0
    while budget is None or skipped < budget:
        want = SKIP_READ if budget is None else min(SKIP_READ, budget - skipped)
        piece = stream.readline(want)
        skipped += len(piece)
        if not piece or piece.endswith(b"\n"):
            break
    return skipped


def _parse_block(raws: list[bytes], report: InputReport) -> list[Event]:
    """The valid events of consecutive lines, each checked as `checked_event` checks it;
    what is not valid is rejected in `report`, by line number. One loop for the block (no
    generator step per line) because this runs for every line of a scanned file."""
    loads, decode_error, events = _loads, orjson.JSONDecodeError, []
    line_no = report.lines
    for raw in raws:
        line_no += 1
        try:
            value = loads(raw)
        except decode_error as exc:  # blank lines fail too: tested only here, off the path
            if raw is OVERLONG:
                report.reject(line_no, f"line longer than {MAX_LINE_BYTES} bytes, not read")
            elif raw.strip():
                report.reject(line_no, f"not JSON ({exc.args[0].split(':')[0]})")
            continue
        if value.__class__ is not dict:
            report.reject(line_no, f"not an object but {type(value).__name__}")
            continue
        # No `{` past the first: no nested object. Each list in the value comes from a `[`
        # of the line, so when the `[` are exactly as many as the lists held by list fields
        # (a set operation on the few list fields, not a test of every field), no one-value
        # field holds a list and no list nests; otherwise (a `[` in a string, a list in an
        # unknown field, a bad line) the full check decides, with its exact message.
        brackets = raw.count(b"[")
        if brackets < MAX_DEPTH and raw.count(b"{") == 1:
            event, problem = value, _time_problem(value.get("@timestamp"))
            if (
                problem is None
                and brackets
                and brackets
                != len([k for k in value.keys() & LIST_NAMES if value[k].__class__ is list])
            ):
                event, problem = checked_event(value, from_orjson=True)
        else:
            event, problem = checked_event(value, from_orjson=True)
        if problem is not None:
            report.reject(line_no, problem)
            continue
        if "event.id" not in event:  # every event has one (alerts without dedup key on it)
            event["event.id"] = event_id(event)
        events.append(event)
    report.lines = line_no  # every line counts, blank or not, the last one too
    report.events += len(events)
    return events


def _not_a_number(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _loads(raw: bytes) -> Any:
    """One JSON value. orjson refuses a lone surrogate escape (`"\\udcff"`, what Python's
    json module writes for a name read with surrogateescape): such a line is read by the
    standard library instead and its strings escaped as sensors escape node bytes (`\\xff`),
    so one odd name does not cost its event."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if b"\\u" not in raw:
            raise
        try:
            return escape_value(json.loads(raw, parse_constant=_not_a_number))
        except (ValueError, RecursionError):
            raise exc from None


def flatten(value: dict, prefix: str, out: Event, depth: int = 0) -> str | None:
    """Nested objects into `out` as dotted names; the problem if a name comes twice."""
    if depth >= MAX_DEPTH:
        return f"objects nest deeper than {MAX_DEPTH} levels"
    for key, item in value.items():
        name = f"{prefix}{key}"
        if isinstance(item, dict) and name in ONE_VALUE_FIELDS:
            return f"field {name} is an object, not one {ONE_VALUE_FIELDS[name]} value"
        if isinstance(item, dict):
            problem = flatten(item, f"{name}.", out, depth + 1)
            if problem is not None:
                return problem
        elif name in out:
            return f"field {name} is given twice"
        else:
            out[name] = item
    return None


def checked_event(value: dict, from_orjson: bool = False) -> tuple[Event, str | None]:
    """The event (flattened when nested) and what is wrong with its shape, if anything.
    `from_orjson`: the values are exactly dict, list or scalars (orjson makes no subclasses),
    so a class test finds the containers, at half the cost of isinstance on every field."""
    problem = _time_problem(value.get("@timestamp"))
    if problem is not None:
        return value, problem
    if from_orjson:
        containers = [k for k, v in value.items() if v.__class__ is list or v.__class__ is dict]
    else:
        containers = [k for k, v in value.items() if isinstance(v, (dict, list))]
    if not containers:  # the common case, kept cheap: sensors write flat scalar fields
        return value, None
    event = value
    if any(isinstance(value[k], dict) for k in containers):
        event = {}
        problem = flatten(value, "", event)
        if problem is not None:
            return value, problem
        containers = [k for k, v in event.items() if isinstance(v, list)]
    for key in containers:
        expected = ONE_VALUE_FIELDS.get(key)
        if expected is not None and isinstance(event[key], list):
            return event, f"field {key} is a list, not one {expected} value"
        if _too_deep(event[key], MAX_DEPTH):  # no output could write it (orjson stops at 255)
            return event, f"field {key} nests deeper than {MAX_DEPTH} levels"
    return event, None


def _time_problem(timestamp: object) -> str | None:
    """What is wrong with an event's `@timestamp` (absent is fine: the engine stamps it)."""
    if timestamp is None:
        return None
    if not isinstance(timestamp, str):
        return f"@timestamp must be RFC 3339 text, not {type(timestamp).__name__}"
    if not is_event_time(timestamp):
        return f"@timestamp {timestamp[:40]!r} is not an RFC 3339 time"
    return None


def _too_deep(value: list | dict, levels: int) -> bool:
    """Whether lists and objects in the container `value` nest deeper than `levels`.
    Recurses only into the items that are containers: a list of scalars costs one pass."""
    if levels <= 0:
        return True
    items = value.values() if isinstance(value, dict) else value
    inner = [item for item in items if isinstance(item, list | dict)]
    return any(_too_deep(item, levels - 1) for item in inner)

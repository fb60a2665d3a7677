"""One part of a scan's end-of-input correlation pass, each alert with its step.

Engine.flush feeds the held matches to the correlations held match by held match, in two
steps each: the windows that match's time closes (an expiry walk, correlation by correlation
in the engine's order), then its feeds, in order; after the last one, the closing rounds.
`feed_part` does that for some correlations alone and tags each alert with its step
(evaluate.StepMatches), a chained alert with the step of the alert it came from. No step
belongs to two parts, so a stable sort of all the parts' alerts by step (`merged`) is the
order of one process. A part walks its correlations at every held match's time, not only at
its own matches': a window closes at the first event time past its end, whichever match
brings it. flush_parts.py splits the pass; part_task.py runs a part in a worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hpcsec.detector.engine.correlate import Correlation
from hpcsec.detector.engine.evaluate import Engine, Feed, Match, StepMatches

Step = tuple[int, ...]
# one held match: its time, event, feeds, and the values of Engine.held_fields (or None): the
# payload Engine._hits pushes
Held = tuple[float, tuple[dict[str, Any], tuple[Feed, ...], tuple[Any, ...] | None]]
Route = tuple[tuple[int, Feed], ...]  # a match's feeds that go to one part, with positions


@dataclass
class Part:
    """Some chains' correlations (ranks, in the engine's order) and the held matches that
    feed them: their indices among all held matches, events, and feeds to these ones."""

    ranks: list[int]
    indices: list[int] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    routes: list[Route] = field(default_factory=list)
    values: list[tuple[Any, ...] | None] = field(default_factory=list)  # of held_fields


def feed_part(
    engine: Engine,
    times: list[float],
    part: Part,
    members: list[Correlation],
    expired_at: float,
) -> StepMatches:
    """The end-of-input pass of `members` alone (Engine.flush's, with each alert's step),
    on the held matches of `part`."""
    engine.start_part(members, expired_at)
    out = StepMatches()
    indices, events, routes = part.indices, part.events, part.routes
    k, n = 0, len(indices)
    for i, t in enumerate(times):
        out.at = i
        engine.release_time(t, out)
        while k < n and indices[k] == i:
            event = events[k]
            for pos, feed in routes[k]:
                out.step = (i, 1, pos)
                engine.feed_one(feed, event, t, out)
            k += 1
    out.at = len(times)
    engine.close_windows(members, out)
    return out


def run_here(
    engine: Engine, part: Part, times: list[float], expired_at: float
) -> list[tuple[Step, Match]]:
    members = [engine.correlations[r] for r in part.ranks]
    out = feed_part(engine, times, part, members, expired_at)
    return list(zip(out.steps, out, strict=True))


def merged(runs: list[list[tuple[Step, Match]]]) -> list[Match]:
    """The parts' alerts in the one-process order: by step (a stable sort: one part's
    alerts of one step stay in the order it made them)."""
    every = [pair for run in runs for pair in run]
    every.sort(key=lambda pair: pair[0])
    return [match for _, match in every]


def read_fields(correlations: list[Correlation]) -> tuple[str, ...]:
    """The event fields `correlations` read: their group-by (per source), value fields."""
    names: set[str] = set()
    for correlation in correlations:
        names.update(name for fields in correlation.fields_by_source for name in fields)
        field = correlation.field
        if isinstance(field, str):
            names.add(field)
        elif isinstance(field, tuple):
            names.update(field)
    return tuple(sorted(names))

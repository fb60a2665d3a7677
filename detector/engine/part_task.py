"""A part of a scan's end-of-input correlation pass in a worker process (flush_parts.py).

The worker gets the correlation rules and the rules they refer to, every held match's time,
its part's matches (each event as the values of the fields its correlations read) and the
state its correlations had, with their evidence events as indices; it builds an engine of
those rules, feeds its part (flush_steps.feed_part) and sends back each alert with its step,
its evidence as indices. The caller turns them back into its own Matches (`received`).
"""

from __future__ import annotations

import copy
import pickle
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any

from hpcsec.detector.engine.evaluate import Engine, Feed, Match
from hpcsec.detector.engine.flush_steps import Part, Route, Step, feed_part, read_fields
from hpcsec.detector.engine.groups import EngineStats, Group
from hpcsec.detector.engine.ruleset import LoadedRule, RuleSet

# what a worker sends back of one alert: its step, rule id, evidence (indices into the events
# the part was given), group, window start, value and time
FiredRecord = tuple[Step, str, tuple[int, ...], tuple[Any, ...], Any, Any, Any]
# an open group sent to a worker: its state, and its evidence as (time, event index)
ShippedGroup = tuple[Group, list[tuple[float, int]]]


@dataclass(frozen=True)
class PartTask:
    """What a worker needs to do one part: the correlation rules and the rules they refer
    to (pickled), the engine's settings, every held match's time, the part's matches (each
    event as the values of the fields its correlations read; each route as an index into
    `routes`, feeds as (position, rank, source)), and the state its correlations had, with
    their evidence events as indices past the matches' (`evidence`: how many there are)."""

    rules: bytes
    ids: tuple[str, ...]  # the correlations' rule ids, in the caller's engine's order
    max_groups: int
    sample_size: int
    ranks: tuple[int, ...]
    times: list[float]
    indices: list[int]
    fields: tuple[str, ...]
    values: list[tuple[Any, ...]]
    route_ids: list[int]
    routes: list[tuple[tuple[int, int, int], ...]]
    state: dict[int, tuple[list[tuple[Any, ShippedGroup]], float]]
    evidence: int
    expired_at: float
    placeholders: dict[str, list[Any]]  # a category-less rule compiles (and warns) at once


@dataclass(frozen=True)
class PartResult:
    fired: list[FiredRecord]
    late_events: int
    evicted_groups: int


def rules_payload(engine: Engine) -> bytes | None:
    """The rules the correlations refer to, then the correlations in the engine's order (so
    that a worker's engine ranks them alike), pickled; None when one cannot be (the caller
    then does every part)."""
    rules: dict[str, LoadedRule] = {}
    for correlation in engine.correlations:
        for source in correlation.sources:
            if source.kind != "correlation":
                rules.setdefault(source.id, source)
    every = [*rules.values(), *(c.rule for c in engine.correlations)]
    try:
        return pickle.dumps(every, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, RecursionError, TypeError, AttributeError):
        return None


def task_for(
    engine: Engine, part: Part, times: list[float], rules: bytes, expired_at: float
) -> PartTask:
    members = [engine.correlations[r] for r in part.ranks]
    fields = engine.held_fields or read_fields(members)
    route_ids: list[int] = []
    routes: dict[int, Route] = {}  # by id: a part's routes are the few tuples _split made
    number: dict[int, int] = {}
    for route in part.routes:
        key = id(route)
        if key not in number:
            number[key] = len(number)
            routes[key] = route
        route_ids.append(number[key])
    # the evidence the open groups keep: as indices past the matches' events
    index: dict[int, int] = {}
    state = {}
    for correlation in members:
        if correlation.groups:
            groups = correlation.groups.items()
            shipped = [(key, _indexed(g, index, len(part.events))) for key, g in groups]
            state[correlation.rank] = (shipped, correlation.settled_until)
    return PartTask(
        rules,
        tuple(c.rule.id for c in engine.correlations),
        engine.max_groups,
        engine.sample_size,
        tuple(part.ranks),
        times,
        part.indices,
        fields,
        [
            kept if kept is not None else tuple(map(event.get, fields))
            for event, kept in zip(part.events, part.values, strict=True)
        ],
        route_ids,
        [tuple((pos, f.rank, f.source) for pos, f in route) for route in routes.values()],
        state,
        len(index),
        expired_at,
        engine.placeholders,
    )


def _indexed(group: Group, index: dict[int, int], first: int) -> ShippedGroup:
    """A copy of `group` without its evidence, and that evidence with each event named by
    its index (from `first` on)."""
    copied = copy.copy(group)
    copied.sample = deque(maxlen=group.sample.maxlen)
    sample = [(t, index.setdefault(id(event), first + len(index))) for t, event in group.sample]
    return copied, sample


def run_part(task: PartTask) -> PartResult:
    """In a worker: one part of the pass (`feed_part`), on an engine of the task's rules."""
    rules = pickle.loads(task.rules)
    engine = Engine(
        RuleSet(rules=rules),
        task.placeholders,
        max_groups=task.max_groups,
        sample_size=task.sample_size,
        lateness=None,
        lazy=True,
    )
    ids = tuple(c.rule.id for c in engine.correlations)
    if ids != task.ids:  # a worker must rank the correlations as the caller does
        raise RuntimeError("the worker's engine orders the correlations differently")
    fields = task.fields
    # an absent field and a null one read the same (`event.get`): only values are sent
    events = [dict(zip(fields, values, strict=True)) for values in task.values]
    # stand-ins for the evidence: only their identity comes back
    evidence: list[dict[str, Any]] = [{} for _ in range(task.evidence)]
    every = events + evidence
    for rank, (groups, settled_until) in task.state.items():
        correlation = engine.correlations[rank]
        for _, (group, sample) in groups:
            group.sample.extend((t, every[i]) for t, i in sample)
        correlation.groups = OrderedDict((key, group) for key, (group, _) in groups)
        correlation.settled_until = settled_until
    correlations = engine.correlations
    routes = [
        tuple((pos, Feed(correlations[rank], source, rank)) for pos, rank, source in route)
        for route in task.routes
    ]
    part = Part(list(task.ranks), task.indices, events, [routes[r] for r in task.route_ids])
    members = [correlations[r] for r in task.ranks]
    out = feed_part(engine, task.times, part, members, task.expired_at)
    index = {id(event): i for i, event in enumerate(every)}
    fired = [
        (
            step,
            m.rule.id,
            tuple(index[id(e)] for e in m.events),
            m.group,
            m.window_start,
            m.value,
            m.time,
        )
        for step, m in zip(out.steps, out, strict=True)
    ]
    return PartResult(fired, engine.stats.late_events, engine.stats.evicted_groups)


def received(engine: Engine, part: Part, result: PartResult) -> list[tuple[Step, Match]]:
    """A worker's alerts as the caller's Matches: its rules, the held events themselves."""
    events = part.events + _evidence_events(engine, part.ranks)
    rule = {c.rule.id: c.rule for c in engine.correlations}
    stats: EngineStats = engine.stats
    stats.late_events += result.late_events
    stats.evicted_groups += result.evicted_groups
    for rank in part.ranks:  # closed by the worker: left here as Correlation.flush leaves them
        engine.correlations[rank].groups.clear()
        engine.correlations[rank].settled_until = float("inf")
    return [
        (step, Match(rule[rule_id], tuple(events[i] for i in found), group, start, value, time))
        for step, rule_id, found, group, start, value, time in result.fired
    ]


def _evidence_events(engine: Engine, ranks: list[int]) -> list[dict[str, Any]]:
    """The events the open groups of `ranks` keep, in the order `task_for` indexed them."""
    seen: dict[int, dict[str, Any]] = {}
    for rank in ranks:
        for group in engine.correlations[rank].groups.values():
            for _, event in group.sample:
                seen.setdefault(id(event), event)
    return list(seen.values())

"""A scan's end-of-input correlation pass, split among processes, with one process's alerts.

A scan holds every correlation match until its input ends (reorder.py, `lateness=None`) and
then feeds them all, oldest first (Engine.flush). On a large file that pass is the serial
tail of `scan --jobs 2`: 1.5-1.9 s of a 9-11 s scan of 600,000 events, 5-6 s at two million,
while the worker that parsed half the file sits idle (bench/scan.py).

Correlations share state only along a chain (a correlation feeds the ones that refer to it),
so the pass splits by chain: each part feeds its correlations the same held matches in the
same order, from the state they had when the pass began, and gets their alerts. What must be
kept is the order one process gives them. It makes them held match by held match, in two
steps each: the windows that match's time closes (an expiry walk, correlation by correlation
in the engine's order), then its feeds, in order; after the last one, the closing rounds.
Each part tags its alerts with that step (evaluate.StepMatches), a chained alert with the
step of the alert it came from. No step belongs to two parts, so a stable sort of all the
parts' alerts by step is the one-process order. A part walks its correlations at every held
match's time, not only at its own matches': a window closes at the first event time past
its end, whichever match brings it.

A part a worker could not do (it died, raised, or its task could not be sent) is done by the
caller afterwards, from the state it kept: the alerts are the same either way.
"""

from __future__ import annotations

import copy
import pickle
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from hpcsec.detector.core.log import get_logger
from hpcsec.detector.engine.correlate import Correlation
from hpcsec.detector.engine.evaluate import Engine, Feed, Match, StepMatches
from hpcsec.detector.engine.groups import EngineStats, Group
from hpcsec.detector.engine.ruleset import LoadedRule, RuleSet

logger = get_logger(__name__)

# Below this many feeds the pass takes a few tenths of a second at most: sending a part
# (its rules, matches and state, pickled) and building its engine would cost as much.
SPLIT_MIN_FEEDS = 20_000

Step = tuple[int, ...]
# one held match: its time, event, feeds, and the values of Engine.held_fields (or None): the
# payload Engine._hits pushes
Held = tuple[float, tuple[dict[str, Any], tuple[Feed, ...], tuple[Any, ...] | None]]
Route = tuple[tuple[int, Feed], ...]  # a match's feeds that go to one part, with positions
# what a worker sends back of one alert: its step, rule id, evidence (indices into the events
# the part was given), group, window start, value and time
FiredRecord = tuple[Step, str, tuple[int, ...], tuple[Any, ...], Any, Any, Any]
# an open group sent to a worker: its state, and its evidence as (time, event index)
ShippedGroup = tuple[Group, list[tuple[float, int]]]


@dataclass
class Part:
    """Some chains' correlations (ranks, in the engine's order) and the held matches that
    feed them: their indices among all held matches, events, and feeds to these ones."""

    ranks: list[int]
    indices: list[int] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    routes: list[Route] = field(default_factory=list)
    values: list[tuple[Any, ...] | None] = field(default_factory=list)  # of held_fields


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


Submit = Callable[[PartTask], "Future[PartResult] | None"]


def flush(engine: Engine, submit: Submit | None, workers: int) -> list[Match]:
    """`engine.flush()`, its correlations split into up to `workers + 1` parts when the held
    matches feed at least SPLIT_MIN_FEEDS times: the caller does the first, `submit` hands
    each other one to a worker (None when it cannot)."""
    if submit is None or workers < 1 or not engine.correlations:
        return engine.flush()
    held: list[Held] = list(engine.pending.drain())
    parts = partition(engine, held, workers + 1)
    if len(parts) < 2:
        return _in_one(engine, held)
    _split(held, parts)
    times = [t for t, _ in held]
    expired_at = engine.expired_at
    rules = _rules_payload(engine)
    futures: list[tuple[Part, Future[PartResult] | None]] = []
    for part in parts[1:]:
        task = None if rules is None else _task(engine, part, times, rules, expired_at)
        futures.append((part, _submitted(submit, task)))
    runs = [_run_here(engine, parts[0], times, expired_at)]
    for part, future in futures:
        result = _result(future)
        if result is None:  # done here, from the state this process kept
            runs.append(_run_here(engine, part, times, expired_at))
        else:
            runs.append(_received(engine, part, result))
    return _merged(runs)


def _in_one(engine: Engine, held: list[Held]) -> list[Match]:
    """Engine.flush on matches already drained from its buffer."""
    out: list[Match] = []
    engine.feed_held(held, out)
    engine.close_windows(engine.correlations, out)
    return out


def components(engine: Engine) -> list[list[int]]:
    """The engine's correlations (ranks) in chains: a correlation with those it feeds."""
    parent = list(range(len(engine.correlations)))

    def root(r: int) -> int:
        while parent[r] != r:
            parent[r] = parent[parent[r]]
            r = parent[r]
        return r

    for correlation in engine.correlations:
        for feed in engine.feeds_of(correlation):
            parent[root(feed.rank)] = root(correlation.rank)
    chains: dict[int, list[int]] = {}
    for rank in range(len(parent)):
        chains.setdefault(root(rank), []).append(rank)
    return list(chains.values())


def partition(engine: Engine, held: list[Held], parts: int) -> list[Part]:
    """Up to `parts` sets of whole chains, the heaviest first (weight: the feeds the held
    matches make, plus the open groups), each chain to the lightest part so far; a single
    part when there are too few feeds to split."""
    weight = [len(c.groups) for c in engine.correlations]
    feeds = 0
    for _, (_, matched, _) in held:
        for feed in matched:
            weight[feed.rank] += 1
        feeds += len(matched)
    if feeds < SPLIT_MIN_FEEDS:
        return [Part(list(range(len(engine.correlations))))]
    chains = sorted(components(engine), key=lambda c: -sum(weight[r] for r in c))
    loads = [0] * parts
    members: list[list[int]] = [[] for _ in range(parts)]
    for chain in chains:
        lightest = loads.index(min(loads))
        members[lightest] += chain
        loads[lightest] += sum(weight[r] for r in chain)
    return [Part(sorted(m)) for m in members if m]


def _split(held: list[Held], parts: list[Part]) -> None:
    """Each held match to the parts its feeds go to, in one pass. The feeds of a match are
    one of a few tuples the engine shares (a rule's, or a few rules' merged), so each
    tuple's routes are worked out once."""
    owner = {rank: n for n, part in enumerate(parts) for rank in part.ranks}
    known: dict[int, list[tuple[Part, Route]]] = {}
    for i, (_, (event, feeds, values)) in enumerate(held):
        routes = known.get(id(feeds))  # alive as long as `held`: the id is not reused
        if routes is None:
            by_part: dict[int, list[tuple[int, Feed]]] = {}
            for pos, feed in enumerate(feeds):
                by_part.setdefault(owner[feed.rank], []).append((pos, feed))
            routes = known[id(feeds)] = [(parts[n], tuple(r)) for n, r in by_part.items()]
        for part, route in routes:
            part.indices.append(i)
            part.events.append(event)
            part.routes.append(route)
            part.values.append(values)


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


def _run_here(
    engine: Engine, part: Part, times: list[float], expired_at: float
) -> list[tuple[Step, Match]]:
    members = [engine.correlations[r] for r in part.ranks]
    out = feed_part(engine, times, part, members, expired_at)
    return list(zip(out.steps, out, strict=True))


def _merged(runs: list[list[tuple[Step, Match]]]) -> list[Match]:
    """The parts' alerts in the one-process order: by step (a stable sort: one part's
    alerts of one step stay in the order it made them)."""
    every = [pair for run in runs for pair in run]
    every.sort(key=lambda pair: pair[0])
    return [match for _, match in every]


# -- a part in a worker ------------------------------------------------------------------------
def _rules_payload(engine: Engine) -> bytes | None:
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


def keep_fields(engine: Engine) -> None:
    """Have each held match keep the fields a worker would read of it (Engine.held_fields),
    taken while its event is in the CPU cache, for a scan that may split its pass: reading
    them at the end, from events held long since, cost the scan's process a fifth of its
    share of the pass."""
    engine.held_fields = read_fields(engine.correlations) or None


def _task(
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


def _submitted(submit: Submit, task: PartTask | None) -> Future[PartResult] | None:
    if task is None:
        return None
    try:
        return submit(task)
    except Exception as exc:  # a broken pool, a task that cannot be pickled: done here
        logger.warning("the correlation pass could not be handed to a worker: %r", exc)
        return None


def _result(future: Future[PartResult] | None) -> PartResult | None:
    if future is None:
        return None
    try:
        return future.result()
    except Exception as exc:  # a worker that died or raised: its part is done here
        logger.warning("a worker failed on its part of the correlation pass: %r", exc)
        return None


def _received(engine: Engine, part: Part, result: PartResult) -> list[tuple[Step, Match]]:
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
    """The events the open groups of `ranks` keep, in the order `_task` indexed them."""
    seen: dict[int, dict[str, Any]] = {}
    for rank in ranks:
        for group in engine.correlations[rank].groups.values():
            for _, event in group.sample:
                seen.setdefault(id(event), event)
    return list(seen.values())

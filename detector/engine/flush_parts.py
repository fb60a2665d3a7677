"""A scan's end-of-input correlation pass, split among processes, with one process's alerts.

A scan holds every correlation match until its input ends (reorder.py, `lateness=None`) and
then feeds them all, oldest first (Engine.flush). On a large file that pass is the serial
tail of `scan --jobs 2`: 1.5-1.9 s of a 9-11 s scan of 600,000 events, 6.6 s at two million,
while the worker that parsed half the file sits idle (bench/scan.py).

Correlations share state only along a chain (a correlation feeds the ones that refer to it),
so the pass splits by chain: each part feeds its correlations the same held matches in the
same order, from the state they had when the pass began, and gets their alerts, each tagged
with the step of the one-process pass that made it; sorted by step, they come in the order
of one process (flush_steps.py). The scan's process does one part, workers the others
(part_task.py). A part a worker could not do (it died, raised, or its task could not be
sent) is done by the caller afterwards, from the state it kept: the alerts are the same
either way.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future

from hpcsec.detector.core.log import get_logger
from hpcsec.detector.core.switching import quick_thread_switches
from hpcsec.detector.engine.evaluate import Engine, Feed, Match
from hpcsec.detector.engine.flush_steps import Held, Part, Route, merged, read_fields, run_here
from hpcsec.detector.engine.part_task import PartResult, PartTask, received, rules_payload, task_for

logger = get_logger(__name__)

# Below this many feeds the pass takes a few tenths of a second at most: sending a part
# (its rules, matches and state, pickled) and building its engine would cost as much.
SPLIT_MIN_FEEDS = 20_000

Submit = Callable[[PartTask], "Future[PartResult] | None"]


@quick_thread_switches()  # the pool's threads send parts while this process does its own
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
    rules = rules_payload(engine)
    futures: list[tuple[Part, Future[PartResult] | None]] = []
    for part in parts[1:]:
        task = None if rules is None else task_for(engine, part, times, rules, expired_at)
        futures.append((part, _submitted(submit, task)))
    runs = [run_here(engine, parts[0], times, expired_at)]
    for part, future in futures:
        result = _result(future)
        if result is None:  # done here, from the state this process kept
            runs.append(run_here(engine, part, times, expired_at))
        else:
            runs.append(received(engine, part, result))
    return merged(runs)


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


def keep_fields(engine: Engine) -> None:
    """Have each held match keep the fields a worker would read of it (Engine.held_fields),
    taken while its event is in the CPU cache, for a scan that may split its pass: reading
    them at the end, from events held long since, cost the scan's process a fifth of its
    share of the pass."""
    engine.held_fields = read_fields(engine.correlations) or None


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

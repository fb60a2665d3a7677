"""The end-of-input correlation pass split among processes (engine/flush_parts.py) must give
exactly the alerts of one engine's flush, in the same order, with the same evidence and
counts: chains kept whole, windows that close on another part's event time, state carried
over from matches fed during the scan, and a worker that fails."""

from __future__ import annotations

import itertools
import pickle
import random
from concurrent.futures import Future
from typing import Any

import pytest

from hpcsec.detector.engine import flush_parts, part_task
from hpcsec.detector.engine.evaluate import Engine, Match
from tests.detector.test_engine_correlation import correlation, ev, gpu, read, ruleset

# Chains of every kind: sliding windows (gte) and windows decided when they close (lt, eq,
# a negation), ordered steps, sums, aliases, and correlations fed by correlations.
CORRELATIONS = [
    correlation("event_count", "[gpu_proc]", "{gte: 3}", name="gpu_burst", timespan="2m"),
    correlation(
        "event_count",
        "[gpu_proc]",
        "{lt: 2}",
        name="gpu_once",
        timespan="3m",
        extra="  generate: true\n",
    ),
    correlation("event_count", "[gpu_once]", "{gte: 2}", name="gpu_once_twice", timespan="1h"),
    correlation(
        "value_count", "[file_read]", "{gte: 3, field: file.path}", name="reads", timespan="5m"
    ),
    correlation(
        "value_count", "[file_read]", "{eq: 1, field: file.path}", name="one_path", timespan="4m"
    ),
    correlation("temporal", "[gpu_proc, file_read]", "{gte: 2}", name="both", timespan="1m"),
    correlation(
        "temporal_ordered",
        "[file_read, gpu_proc]",
        "{gte: 2}",
        name="read_then_gpu",
        timespan="90s",
    ),
    correlation(
        "temporal", "[gpu_proc, file_read]", "x", name="gpu_no_read", timespan="2m"
    ).replace("  condition: x\n", "  condition: gpu_proc and not file_read\n")
    + "  generate: true\n",
    correlation("event_count", "[gpu_no_read]", "{gte: 2}", name="quiet_gpus", timespan="2h"),
    correlation(
        "value_sum",
        "[flow]",
        "{gte: 3000, field: network.bytes}",
        name="bytes",
        group_by="[source.ip]",
        timespan="3m",
    ),
]
RULES = "---\n".join(CORRELATIONS)
USERS = ["bob", "eve", "carol", "dan"]


def events(seed: int, count: int, disorder: float) -> list[dict[str, Any]]:
    """Events of three kinds over a few hours, mostly in time order; `disorder` of them
    moved by up to ten minutes."""
    rng = random.Random(seed)
    out = []
    t = 0.0
    for n in range(count):
        t += rng.expovariate(1 / 7)
        at = t - rng.uniform(0, 600) if rng.random() < disorder else t
        user = rng.choice(USERS)
        kind = rng.random()
        if kind < 0.45:
            event = gpu(at, user)
        elif kind < 0.9:
            event = read(at, user, **{"file.path": f"/models/{rng.randrange(6)}"})
        else:
            event = ev(
                "roce_flow",
                "flow",
                at,
                **{"source.ip": f"10.0.0.{rng.randrange(3)}", "network.bytes": rng.randrange(900)},
            )
        out.append({**event, "event.id": f"{seed}-{n}"})
    return out


def in_process(failing: set[int] = frozenset()) -> tuple[flush_parts.Submit, list[str]]:
    """A `submit` that runs each task as a worker would (pickled both ways) in this process;
    the tasks numbered in `failing` fail instead. Also what became of each task handed:
    "ran" or "failed" (a task that raised in run_part appears in neither: the caller did its
    part, and a test that expects "ran" fails)."""
    handed: list[str] = []
    count = 0

    def submit(task: part_task.PartTask) -> Future[part_task.PartResult]:
        nonlocal count
        count += 1
        future: Future[part_task.PartResult] = Future()
        if count - 1 in failing:
            handed.append("failed")
            future.set_exception(RuntimeError("worker died"))
        else:
            result = part_task.run_part(pickle.loads(pickle.dumps(task)))
            future.set_result(pickle.loads(pickle.dumps(result)))
            handed.append("ran")
        return future

    return submit, handed


def seen(matches: list[Match]) -> list[tuple]:
    """What an alert says, events by their id (the two engines read their own copies)."""
    return [
        (
            m.rule.sigma.name,
            [e.get("event.id") for e in m.events],
            m.group,
            m.window_start,
            m.value,
            m.time,
        )
        for m in matches
    ]


def run(
    stream: list[dict],
    split: flush_parts.Submit | None,
    workers: int,
    held: int,
    rules: str = RULES,
    keep: bool = False,
) -> tuple:
    engine = Engine(ruleset(rules), lateness=None, max_groups=40, sample_size=4)
    if keep:  # as a scan with workers: each held match keeps what a worker reads
        flush_parts.keep_fields(engine)
    engine.pending.max_pending = held
    during = []
    for start in range(0, len(stream), 50):
        during += engine.evaluate([dict(e) for e in stream[start : start + 50]])
    end = engine.flush() if split is None else flush_parts.flush(engine, split, workers)
    stats = engine.stats
    return seen(during), seen(end), (stats.late_events, stats.evicted_groups)


@pytest.fixture
def split_always(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(flush_parts, "SPLIT_MIN_FEEDS", 0)


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("workers", [1, 2, 3])
def test_parts_give_one_engines_alerts_in_its_order(split_always, seed, workers):
    stream = events(seed, 1500, disorder=0.05)
    # a few hundred held: most matches are fed during the scan, so parts carry state over
    held = 300 if seed % 2 else 100_000
    whole = run(stream, None, 0, held)
    submit, handed = in_process()
    parted = run(stream, submit, workers, held)
    assert parted == whole
    assert handed == ["ran"] * workers  # as many parts as processes: the chains spread
    kinds = {name for name, *_ in whole[0] + whole[1]}
    assert {"gpu_once_twice", "quiet_gpus", "one_path"} <= kinds  # chains, closing windows
    assert len(whole[1]) > 20 and len({name for name, *_ in whole[1]}) > 4


def test_alerts_of_parts_interleave_by_step(split_always):
    """A stable sort by step, not the parts one after another: a wrong merge fails here."""
    stream = events(7, 1500, disorder=0.0)
    whole = run(stream, None, 0, 100_000)
    names = [name for name, *_ in whole[1]]
    submit, _ = in_process()
    engine = Engine(ruleset(RULES), lateness=None, max_groups=40, sample_size=4)
    engine.evaluate([dict(e) for e in stream])
    parts = flush_parts.partition(engine, list(engine.pending.drain()), 2)
    first = {engine.correlations[r].rule.sigma.name for r in parts[0].ranks}
    # the parts' alerts alternate in the one-process order
    switches = sum(1 for a, b in itertools.pairwise(names) if (a in first) != (b in first))
    assert switches > 10
    assert run(stream, submit, 1, 100_000) == whole


def test_a_worker_that_fails_leaves_its_part_to_the_caller(split_always):
    stream = events(3, 1500, disorder=0.05)
    whole = run(stream, None, 0, 300)
    submit, handed = in_process(failing={0})
    assert run(stream, submit, 2, 300) == whole
    assert handed == ["failed", "ran"]


def test_a_task_that_cannot_be_handed_out_is_done_here(split_always):
    stream = events(4, 800, disorder=0.0)
    whole = run(stream, None, 0, 100_000)

    def broken(task: part_task.PartTask) -> Future[part_task.PartResult]:
        raise RuntimeError("cannot schedule new futures after shutdown")

    assert run(stream, broken, 1, 100_000) == whole


def test_chains_stay_whole_in_one_part(split_always):
    engine = Engine(ruleset(RULES))
    names = [
        [engine.correlations[r].rule.sigma.name for r in c] for c in flush_parts.components(engine)
    ]
    assert sorted(map(sorted, names)) == sorted(
        [
            ["gpu_burst"],
            ["gpu_once", "gpu_once_twice"],
            ["reads"],
            ["one_path"],
            ["both"],
            ["read_then_gpu"],
            ["gpu_no_read", "quiet_gpus"],
            ["bytes"],
        ]
    )


def test_few_feeds_are_not_split():
    stream = events(5, 300, disorder=0.0)
    whole = run(stream, None, 0, 100_000)
    submit, handed = in_process()
    assert run(stream, submit, 1, 100_000) == whole
    assert handed == []  # under SPLIT_MIN_FEEDS: the pass stays in one process


def test_a_window_closes_at_another_parts_event_time(split_always):
    """One process closes a window at the first held match past its end, whichever
    correlation that match feeds: a part must close it there too, not at its own next
    match (here, none: its window would close only at the end of the input)."""
    rules = CORRELATIONS[0] + "---\n" + CORRELATIONS[4]  # gpu_burst, one_path: two parts
    stream = [read(0, "eve", **{"file.path": "/models/a"})]
    stream += [gpu(10 * n, "bob") for n in range(1, 100)]
    stream = [{**e, "event.id": str(n)} for n, e in enumerate(stream)]
    whole = run(stream, None, 0, 100_000, rules)
    names = [name for name, *_ in whole[1]]
    assert "one_path" in names[1:-1]  # closed at t=250 s, among gpu_burst's alerts
    submit, handed = in_process()
    assert run(stream, submit, 1, 100_000, rules) == whole
    assert handed == ["ran"]


def test_the_callers_engine_is_left_as_one_engines_flush_leaves_it(split_always):
    """A worker closed its part's windows: the caller's copies of them are closed too, so
    that a later flush (or more input) does not see them again, as after Engine.flush."""
    stream = events(1, 1500, disorder=0.05)
    submit, handed = in_process()
    engine = Engine(ruleset(RULES), lateness=None, max_groups=40, sample_size=4)
    engine.pending.max_pending = 300  # state from matches fed during the scan
    engine.evaluate([dict(e) for e in stream])
    assert flush_parts.flush(engine, submit, 1)
    assert handed == ["ran"]
    assert [len(c.groups) for c in engine.correlations] == [0] * len(engine.correlations)
    assert engine.flush() == []


@pytest.mark.parametrize("seed", range(4))
def test_fields_kept_while_matching_give_the_same_alerts(split_always, seed):
    """A scan with workers has each held match keep the fields a worker reads (taken while
    its event is in the cache): what a worker is sent, and so its alerts, are the same."""
    stream = events(seed, 1500, disorder=0.05)
    held = 300 if seed % 2 else 100_000
    whole = run(stream, None, 0, held)
    submit, handed = in_process()
    assert run(stream, submit, 2, held, keep=True) == whole
    assert handed == ["ran", "ran"]

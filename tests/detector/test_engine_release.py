"""The end-of-input release of held matches (Engine.flush with lateness None): the same alerts
as correlating each batch in order, and no expiry pass while no window has ended."""

from __future__ import annotations

from typing import Any

from hpcsec.detector.engine.evaluate import Engine, Match
from tests.detector.test_engine_correlation import correlation, gpu, read, ruleset

RULES = ruleset(
    "---\n".join(
        [
            correlation("temporal", "[gpu_proc, file_read]", "{gte: 2}", name="both"),
            correlation("event_count", "[gpu_proc]", "{gte: 3}", timespan="1m", name="many"),
            correlation("event_count", "[file_read]", "{lt: 2}", timespan="1m", name="few"),
        ]
    )
)


def summary(matches: list[Match]) -> list[tuple[Any, ...]]:
    return [(m.rule.id, m.group, m.window_start, m.time, m.value, m.events) for m in matches]


def stream(n: int) -> list[dict[str, Any]]:
    """Users in turn, a second apart: windows of every group open and end along the way."""
    return [(gpu if i % 3 else read)(float(i), f"user-{i % 7}") for i in range(n)]


def test_held_matches_give_the_alerts_of_a_batch_by_batch_engine():
    events = stream(600)
    held = Engine(RULES, lateness=None)
    at_end = held.evaluate(events) + held.flush()
    batched = Engine(RULES, lateness=0.0)
    in_order = []
    for start in range(0, len(events), 50):
        in_order += batched.evaluate(events[start : start + 50])
    in_order += batched.flush()
    assert at_end and summary(at_end) == summary(in_order)


def test_no_expiry_pass_is_made_for_a_match_before_a_window_ends():
    """Within one window (5 minutes) nothing can expire: releasing the matches makes no
    expiry call, where it used to make one per new event time."""
    engine = Engine(RULES, lateness=None)
    calls = []
    real = engine._expire

    def spy(now: float, out: list[Match]) -> None:
        calls.append(now)
        real(now, out)

    engine._expire = spy  # type: ignore[method-assign]
    events = [gpu(i * 0.1, "bob") for i in range(300)] + [read(30.0 + i * 0.1) for i in range(5)]
    matches = engine.evaluate(events) + engine.flush()
    assert calls == []  # event time spans 30 s: no window of 1 or 5 minutes has ended
    plain = Engine(RULES, lateness=None)
    assert summary(matches) == summary(plain.evaluate(events) + plain.flush())
    assert {m.rule.sigma.name for m in matches} == {"both", "many"}


def test_settled_until_stays_the_window_end_of_the_least_recently_touched_group():
    """A correlation's settled_until (when an expiry pass is first needed) is kept without
    looking at its groups after most feeds; after every feed it must be what a look gives:
    through new groups, evictions, fires and windows closed by a later event."""
    engine = Engine(RULES, lateness=None, max_groups=4)
    checked = 0
    for running in engine.correlations:
        real = running.feed

        def checked_feed(*args: Any, _real: Any = real, _c: Any = running) -> Any:
            nonlocal checked
            fired = _real(*args)
            first = next(iter(_c.groups.values()), None)
            edge = float("inf")
            if first is not None:
                edge = (first.last if _c.sliding else first.start) + _c.span
            assert _c.settled_until == edge
            checked += 1
            return fired

        running.feed = checked_feed  # type: ignore[method-assign]
    events = [(gpu if i % 3 else read)(i * 7.0, f"user-{(i * 5) % 9}") for i in range(400)]
    engine.evaluate(events)
    engine.flush()
    assert checked > 500 and engine.stats.evicted_groups > 0


def test_the_expiry_walk_looks_only_at_correlations_with_a_group_open():
    engine = Engine(RULES, lateness=0.0)
    names = lambda: [c.rule.sigma.name for c in engine._open]  # noqa: E731
    engine.evaluate([read(0.0, "bob")])  # feeds "both" and "few"
    assert names() == ["both", "few"]
    engine.evaluate([gpu(1.0, "bob")])  # completes "both" (its group fires and goes)
    assert sorted(names()) == ["both", "few", "many"]
    engine.evaluate([gpu(200.0, "carol")])  # the 1 minute windows end: "few" closes
    assert names() == ["both", "many"]
    engine.evaluate([read(1000.0, "dave")])  # every earlier window has ended
    assert names() == ["both", "few"]

"""A long stream of hostile events (a new group-by value in each) leaves the engine's state
bounded: open groups per correlation at most `max_groups`, held matches at most what the
lateness allows, and groups whose window has passed dropped or closed as event time moves."""

from __future__ import annotations

import pytest

from hpcsec.detector.engine.evaluate import Engine
from tests.detector.test_engine_correlation import correlation, gpu, read, ruleset

MAX_GROUPS = 50
RULES = ruleset(
    "---\n".join(
        [
            correlation("event_count", "[file_read]", "{gte: 1000}", name="many"),
            correlation("event_count", "[gpu_proc]", "{lt: 2}", name="few"),
            correlation("value_count", "[file_read]", "{gte: 1000, field: file.path}", name="vc"),
            correlation("temporal", "[gpu_proc, file_read]", "{gte: 2}", name="both"),
            correlation("temporal_ordered", "[file_read, gpu_proc]", "{gte: 2}", name="seq"),
        ]
    )
)
STEP_S = 0.5  # event time between two events: a 5 minute window spans 600 of them


def hostile(i: int) -> dict:
    """Each event a user of its own: every one opens a group in every correlation it feeds."""
    user = f"attacker-{i}"
    if i % 2:
        return gpu(i * STEP_S, user)
    return read(i * STEP_S, user, **{"file.path": f"/p/{i}"})


@pytest.mark.parametrize("lateness", [0.0, 30.0, None])
def test_a_long_stream_of_new_groups_keeps_the_state_bounded(lateness):
    engine = Engine(RULES, max_groups=MAX_GROUPS, lateness=lateness)
    events = [hostile(i) for i in range(6_000)]
    most_held = 0
    for start in range(0, len(events), 100):
        engine.evaluate(events[start : start + 100])
        most_held = max(most_held, len(engine.pending))
        assert all(len(c.groups) <= MAX_GROUPS for c in engine.correlations)
    if lateness is None:  # a whole input put in order: held until flush, nothing fed yet
        assert most_held == len(events)
    else:  # what the lateness allows behind the newest event, and the batch
        assert most_held <= lateness / STEP_S + 100
    # 10 minutes later: every window has passed, so every group is dropped or closed
    engine.evaluate([read(len(events) * STEP_S + 600, "late-user", **{"file.path": "/q"})])
    if lateness is None:
        engine.flush()
        assert engine.stats.evicted_groups > 0
        assert all(not c.groups for c in engine.correlations)
        return
    assert engine.stats.evicted_groups > 0
    engine.evaluate([read(len(events) * STEP_S + 600 + lateness + 1, "x", **{"file.path": "/r"})])
    assert len(engine.pending) <= 1
    for c in engine.correlations:
        assert len(c.groups) <= 2, c.rule.id  # only the two late users' groups are open

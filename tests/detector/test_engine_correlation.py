"""Correlation rules: every type, group-by, sliding windows on event time, aliases, chaining,
generate, bounded state."""

from __future__ import annotations

import zlib
from datetime import UTC, datetime, timedelta

import pytest
from sigma.collection import SigmaCollection
from sigma.correlations import SigmaCorrelationRule

from hpcsec.detector.core.errors import RuleError
from hpcsec.detector.engine.evaluate import Engine
from hpcsec.detector.engine.ruleset import LoadedRule, RuleSet

BASE = datetime(2026, 12, 1, 10, 0, 0, tzinfo=UTC)

RULES = """\
title: gpu process
id: 00000000-0000-4000-8000-00000000000a
name: gpu_proc
logsource: {product: hpc, category: gpu_process}
detection:
  sel:
    event.action: seen
  condition: sel
---
title: file read
id: 00000000-0000-4000-8000-00000000000b
name: file_read
logsource: {product: hpc, category: file_access}
detection:
  sel:
    event.action: read
  condition: sel
---
title: flow
id: 00000000-0000-4000-8000-00000000000c
name: flow
logsource: {product: hpc, category: roce_flow}
detection:
  sel:
    network.bytes|gte: 0
  condition: sel
"""


def ruleset(correlation: str) -> RuleSet:
    text = RULES + "---\n" + correlation
    return RuleSet(
        [LoadedRule(item, "rules/c.yml", 1, "test") for item in SigmaCollection.from_yaml(text)]
    )


def correlation(
    kind: str,
    rules: str,
    condition: str,
    group_by: str = "[user.name]",
    timespan: str = "5m",
    extra: str = "",
    name: str = "corr",
) -> str:
    return f"""\
title: {name}
id: 00000000-0000-4000-8000-{zlib.crc32(name.encode()):012d}
name: {name}
correlation:
  type: {kind}
  rules: {rules}
  group-by: {group_by}
  timespan: {timespan}
  condition: {condition}
{extra}"""


def at(seconds: float) -> str:
    return (BASE + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def ev(category: str, action: str, seconds: float, **fields) -> dict:
    return {"event.category": category, "event.action": action, "@timestamp": at(seconds), **fields}


def gpu(seconds: float, user: str = "bob", **fields) -> dict:
    return ev("gpu_process", "seen", seconds, **{"user.name": user, **fields})


def read(seconds: float, user: str = "bob", **fields) -> dict:
    return ev("file_access", "read", seconds, **{"user.name": user, **fields})


def ids(matches) -> list[str]:
    return [m.rule.sigma.name for m in matches]


def test_event_count_fires_once_per_group_with_evidence():
    engine = Engine(ruleset(correlation("event_count", "[gpu_proc]", "{gte: 3}")))
    events = [gpu(0), gpu(60), gpu(10, "alice"), gpu(120)]
    matches = engine.evaluate(events)
    assert ids(matches) == ["corr"]  # the referenced rule does not alert (generate: false)
    assert engine.stats.rule_hits == 4  # ... but its hits are counted
    (m,) = matches
    assert m.group == (("user.name", "bob"),)
    assert m.value == 3.0
    assert m.window_start == "2026-12-01T10:00:00.000Z"
    assert m.events == (events[0], events[1], events[3])
    # fired once: the group starts afresh, two more events are not enough
    assert engine.evaluate([gpu(130), gpu(140)]) == []
    assert ids(engine.evaluate([gpu(150)])) == ["corr"]


def test_event_count_window_slides_on_event_time():
    engine = Engine(ruleset(correlation("event_count", "[gpu_proc]", "{gte: 3}")))
    # 0 and 240 are in one window, 0 has left it by 360 (timespan 5m = 300 s)
    assert engine.evaluate([gpu(0), gpu(240), gpu(360)]) == []
    (m,) = engine.evaluate([gpu(420)])  # state carried across evaluate() calls
    assert m.window_start == at(240)
    assert m.value == 3.0


def test_event_count_gt_needs_one_more():
    engine = Engine(ruleset(correlation("event_count", "[gpu_proc]", "{gt: 2}")))
    assert engine.evaluate([gpu(0), gpu(1)]) == []
    assert [m.value for m in engine.evaluate([gpu(2)])] == [3.0]


def test_event_count_lt_is_decided_when_the_window_closes():
    engine = Engine(ruleset(correlation("event_count", "[gpu_proc]", "{lt: 2}")))
    assert engine.evaluate([gpu(0), gpu(10, "alice"), gpu(20, "alice")]) == []
    # bob's window closes once event time passes 0 + 300 s; alice had 2 events: no alert
    (m,) = engine.evaluate([gpu(400, "carol")])
    assert (m.group, m.value, m.window_start) == ((("user.name", "bob"),), 1.0, at(0))
    (last,) = engine.flush()  # carol's window is still open at end of input
    assert last.group == (("user.name", "carol"),)
    assert engine.flush() == []


def test_value_count_distinct_values():
    rule = correlation("value_count", "[file_read]", "{gte: 3, field: file.path}")
    engine = Engine(ruleset(rule))
    events = [
        read(0, **{"file.path": "/m/a"}),
        read(1, **{"file.path": "/m/a"}),
        read(2, **{"file.path": "/m/b"}),
        read(3, "eve", **{"file.path": "/m/c"}),
    ]
    assert engine.evaluate(events) == []
    (m,) = engine.evaluate([read(4, **{"file.path": "/m/c"})])
    assert (m.value, m.group) == (3.0, (("user.name", "bob"),))
    assert (
        engine.evaluate([read(400, **{"file.path": "/m/d"}), read(401, **{"file.path": "/m/e"})])
        == []
    )


def test_value_count_window_slides():
    rule = correlation("value_count", "[file_read]", "{gte: 2, field: file.path}", timespan="1m")
    engine = Engine(ruleset(rule))
    assert engine.evaluate([read(0, **{"file.path": "/a"}), read(61, **{"file.path": "/b"})]) == []
    assert len(engine.evaluate([read(70, **{"file.path": "/a"})])) == 1


def test_temporal_any_order():
    rule = correlation("temporal", "[gpu_proc, file_read]", "{gte: 2}")
    engine = Engine(ruleset(rule))
    assert engine.evaluate([read(0), gpu(10, "eve")]) == []
    (m,) = engine.evaluate([gpu(20)])
    assert (m.value, m.window_start) == (2.0, at(0))
    assert engine.evaluate([read(1000), gpu(1400)]) == []  # 400 s apart: outside 5m


def test_temporal_default_condition_is_all_rules():
    text = correlation("temporal", "[gpu_proc, file_read]", "x").replace("  condition: x\n", "")
    engine = Engine(ruleset(text))
    assert engine.evaluate([gpu(0), gpu(1)]) == []
    assert len(engine.evaluate([read(2)])) == 1


def test_temporal_ordered_needs_the_order():
    rule = correlation("temporal_ordered", "[file_read, gpu_proc]", "{gte: 2}")
    engine = Engine(ruleset(rule))
    assert engine.evaluate([gpu(0), read(10)]) == []  # wrong order
    (m,) = engine.evaluate([gpu(20)])  # read(10) then gpu(20)
    assert m.window_start == at(10)
    assert engine.evaluate([read(100), gpu(500)]) == []  # right order, too far apart


def test_value_sum_and_value_avg():
    flows = [
        ev("roce_flow", "flow", t, **{"source.ip": "10.0.0.1", "network.bytes": b})
        for t, b in ((0, 400), (10, 500), (20, 200))
    ]
    total = correlation(
        "value_sum", "[flow]", "{gte: 1000, field: network.bytes}", group_by="[source.ip]"
    )
    engine = Engine(ruleset(total))
    matches = engine.evaluate(flows)
    assert [(m.value, m.group) for m in matches] == [(1100.0, (("source.ip", "10.0.0.1"),))]
    average = correlation(
        "value_avg", "[flow]", "{gt: 300, field: network.bytes}", group_by="[source.ip]"
    )
    engine = Engine(ruleset(average))
    assert [m.value for m in engine.evaluate(flows[:1])] == [400.0]
    low = correlation(
        "value_avg", "[flow]", "{lt: 500, field: network.bytes}", group_by="[source.ip]"
    )
    engine = Engine(ruleset(low))
    assert engine.evaluate(flows) == []
    assert [m.value for m in engine.flush()] == [pytest.approx(366.6666, rel=1e-4)]


def test_aliases_join_differently_named_fields():
    aliases = "  aliases:\n    who:\n      gpu_proc: slurm.job.user\n      file_read: user.name\n"
    rule = correlation(
        "temporal", "[gpu_proc, file_read]", "{gte: 2}", group_by="[who]", extra=aliases
    )
    engine = Engine(ruleset(rule))
    matches = engine.evaluate(
        [ev("gpu_process", "seen", 0, **{"slurm.job.user": "bob"}), read(5, "bob")]
    )
    assert [m.group for m in matches] == [(("who", "bob"),)]


def test_chained_correlations_and_generate():
    inner = correlation(
        "event_count", "[gpu_proc]", "{gte: 2}", name="burst", extra="  generate: true\n"
    )
    outer = correlation("event_count", "[burst]", "{gte: 2}", name="bursts", timespan="1h")
    engine = Engine(ruleset(inner + "---\n" + outer))
    out = engine.evaluate([gpu(0), gpu(1), gpu(100), gpu(101)])
    # burst is referenced by bursts without generate: it does not alert; gpu_proc does
    # (burst says generate: true)
    assert ids(out) == ["gpu_proc", "gpu_proc", "gpu_proc", "gpu_proc", "bursts"]
    (m,) = [m for m in out if m.rule.sigma.name == "bursts"]
    assert m.group == (("user.name", "bob"),)
    assert m.value == 2.0
    assert len(m.events) == 4  # the events of both inner windows


def test_open_groups_are_capped_and_evictions_counted():
    engine = Engine(ruleset(correlation("event_count", "[gpu_proc]", "{gte: 2}")), max_groups=2)
    engine.evaluate([gpu(0, "a"), gpu(1, "b"), gpu(2, "c")])
    assert engine.stats.evicted_groups == 1
    assert engine.evaluate([gpu(3, "a")]) == []  # a was evicted: starts again
    assert len(engine.evaluate([gpu(4, "c")])) == 1


def test_groups_expire_as_event_time_advances():
    engine = Engine(ruleset(correlation("event_count", "[gpu_proc]", "{gte: 5}")))
    engine.evaluate([gpu(i, f"user{i}") for i in range(50)])
    (state,) = engine.correlations
    assert len(state.groups) == 50
    engine.evaluate([gpu(1000, "late")])
    assert list(state.groups) == [("late",)]


def test_sample_of_evidence_is_bounded():
    engine = Engine(ruleset(correlation("event_count", "[gpu_proc]", "{gte: 25}")), sample_size=10)
    events = [gpu(i) for i in range(25)]
    (m,) = engine.evaluate(events)
    assert m.value == 25.0
    assert m.events == tuple(events[-10:])


def test_events_without_time_are_counted_not_correlated():
    engine = Engine(ruleset(correlation("event_count", "[gpu_proc]", "{gte: 1}")))
    assert engine.evaluate([{**gpu(0), "@timestamp": "yesterday"}]) == []
    assert engine.stats.untimed_events == 1
    # rules that alert on their own still do
    generating = correlation("event_count", "[gpu_proc]", "{gte: 1}", extra="  generate: true\n")
    engine = Engine(ruleset(generating))
    assert ids(engine.evaluate([{**gpu(0), "@timestamp": None}])) == ["gpu_proc"]


def test_unknown_reference_is_a_rule_error():
    rules = ruleset(correlation("event_count", "[gpu_proc]", "{gte: 1}"))
    broken = SigmaCorrelationRule.from_yaml(correlation("event_count", "[nope]", "{gte: 1}"))
    rules.rules[-1] = LoadedRule(broken, "rules/c.yml", 1, "test")
    with pytest.raises(RuleError) as err:
        Engine(rules)
    assert str(err.value).endswith("correlation refers to unknown rule 'nope'")
    assert str(err.value).startswith("rules/c.yml:1: rule ")


def test_correlation_chain_that_loops_is_a_rule_error():
    first = correlation("event_count", "[second]", "{gte: 1}", name="first")
    second = correlation("event_count", "[first]", "{gte: 1}", name="second")
    items = [SigmaCorrelationRule.from_yaml(first), SigmaCorrelationRule.from_yaml(second)]
    rules = ruleset(correlation("event_count", "[gpu_proc]", "{gte: 1}"))
    rules.rules += [LoadedRule(item, "rules/c.yml", 7, "test") for item in items]
    with pytest.raises(RuleError) as err:
        Engine(rules)
    assert str(err.value).endswith(
        f"correlation chain refers to itself: {items[0].id} -> {items[1].id} -> {items[0].id}"
    )


def test_group_values_may_be_lists_or_objects():
    rule = correlation("event_count", "[gpu_proc]", "{gte: 2}", group_by="[slurm.job.gpus]")
    engine = Engine(ruleset(rule))
    events = [
        gpu(0, **{"slurm.job.gpus": [0, 1]}),
        gpu(1, **{"slurm.job.gpus": {"a": [1]}}),
        gpu(2, **{"slurm.job.gpus": [0, 1]}),
    ]
    (m,) = engine.evaluate(events)
    assert m.group == (("slurm.job.gpus", (0, 1)),)


def test_temporal_extended_condition():
    both = correlation("temporal", "[gpu_proc, file_read]", "x").replace(
        "  condition: x\n", "  condition: gpu_proc and file_read\n"
    )
    engine = Engine(ruleset(both))
    assert engine.evaluate([gpu(0), gpu(5)]) == []
    assert len(engine.evaluate([read(10)])) == 1
    # with a negation the answer needs the whole window: decided when it closes
    alone = both.replace("gpu_proc and file_read", "gpu_proc and not file_read")
    engine = Engine(ruleset(alone))
    assert engine.evaluate([gpu(0), gpu(1, "eve"), read(2, "eve")]) == []
    (m,) = engine.evaluate([gpu(400, "carol")])  # bob's window closed without a read
    assert m.group == (("user.name", "bob"),)
    assert engine.flush()[0].group == (("user.name", "carol"),)


def test_value_count_closing_window_state_is_capped():
    rule = correlation("value_count", "[file_read]", "{lt: 3, field: file.path}")
    engine = Engine(ruleset(rule))
    assert engine.evaluate([read(i, **{"file.path": f"/m/{i}"}) for i in range(50)]) == []
    (state,) = engine.correlations
    (group,) = state.groups.values()
    assert len(group.values) == 4  # enough to know the count is not below 3
    assert engine.flush() == []
    assert [
        m.value
        for m in Engine(ruleset(rule)).evaluate(
            [
                read(0, **{"file.path": "/a"}),
                read(1, **{"file.path": "/b"}),
                read(500, "eve", **{"file.path": "/c"}),
            ]
        )
    ] == [2.0]


def test_an_event_later_than_the_allowance_is_counted_not_added():
    rule = correlation("event_count", "[gpu_proc]", "{gte: 3}", timespan="1h")
    engine = Engine(ruleset(rule), lateness=60)
    assert engine.evaluate([gpu(3600)]) == []
    assert engine.evaluate([gpu(3590)]) == []  # 10 s behind the newest: within the allowance
    # ten minutes behind: in the correlation's window, but later than the allowance
    assert engine.evaluate([gpu(3000)]) == []
    assert engine.stats.late_events == 1
    assert engine.take_late() == 1 and engine.take_late() == 0
    assert engine.flush() == []  # two events were correlated, not three


def test_events_in_one_call_are_put_in_event_time_order():
    engine = Engine(ruleset(correlation("event_count", "[gpu_proc]", "{gte: 3}", timespan="1m")))
    # an hour, then events from long before: three events, but never three within a minute
    assert engine.evaluate([gpu(3600), gpu(0), gpu(600)]) == []
    assert engine.stats.late_events == 0
    assert engine.flush() == []


def test_events_out_of_order_within_the_window_still_count():
    engine = Engine(ruleset(correlation("event_count", "[gpu_proc]", "{gte: 3}", timespan="1m")))
    (m,) = engine.evaluate([gpu(30), gpu(10), gpu(20)])
    assert m.value == 3.0 and m.window_start == "2026-12-01T10:00:10.000Z"
    assert engine.stats.late_events == 0


def test_value_sum_ignores_an_event_from_long_before():
    engine = Engine(
        ruleset(
            correlation("value_sum", "[flow]", "{field: network.bytes, gte: 100}", timespan="1m")
        )
    )

    def flow(s, n):
        return ev("roce_flow", "flow", s, **{"user.name": "bob", "network.bytes": n})

    assert engine.evaluate([flow(7200, 60), flow(0, 60)]) == []
    assert engine.evaluate([flow(7210, 50)])[0].value == 110.0


def test_temporal_ordered_follows_event_time_not_arrival():
    rule = correlation("temporal_ordered", "[file_read, gpu_proc]", "{gte: 2}")
    engine = Engine(ruleset(rule))
    # the GPU process (second step) happened before the read: out of order in event time
    assert engine.evaluate([read(60), gpu(30)]) == []
    engine = Engine(ruleset(rule))
    # the read (30) precedes the GPU process (90) in event time: arrival order does not matter
    assert ids(engine.evaluate([gpu(90), read(30)])) == ["corr"]
    engine = Engine(ruleset(rule))
    assert ids(engine.evaluate([read(30), gpu(90)])) == ["corr"]

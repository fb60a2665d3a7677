"""The engine's per-event work: what is skipped where it cannot change the result (correlations
no event has touched since their last expiry, a field fetched again under the same test), with
the same matches as the work it saves."""

from __future__ import annotations

import random

import pytest
from sigma.collection import SigmaCollection

from bench.engine_events import attack_events, generate
from hpcsec.detector.config.site import SiteConfig
from hpcsec.detector.engine.evaluate import Engine, Match
from hpcsec.detector.engine.groups import epoch
from hpcsec.detector.engine.loader import load_rules
from hpcsec.detector.engine.ruleset import LoadedRule, RuleSet
from tests.detector.test_engine_correlation import correlation, gpu, ids, read, ruleset

# a closing window (decided at its end) on gpu_proc, a sliding one on file_read
FEW_GPU = correlation("event_count", "[gpu_proc]", "{lt: 3}", name="few_gpu")
MANY_READS = correlation("event_count", "[file_read]", "{gte: 100}", name="many_reads")


def two_correlations() -> Engine:
    return Engine(ruleset(FEW_GPU + "---\n" + MANY_READS))


def test_a_window_closes_on_the_time_of_events_that_feed_other_correlations():
    engine = two_correlations()
    assert engine.evaluate([gpu(0), read(10)]) == []
    # only reads from now on: gpu_proc's window (0 s + 5 min) closes as their time passes it
    assert engine.evaluate([read(200)]) == []
    assert ids(engine.evaluate([read(400)])) == ["few_gpu"]
    (few_gpu, many_reads) = engine.correlations
    assert not few_gpu.groups and len(many_reads.groups) == 1


def test_correlations_unchanged_since_their_last_expiry_are_not_walked_again(monkeypatch):
    engine = two_correlations()
    few_gpu, many_reads = engine.correlations
    calls = {"few_gpu": 0, "many_reads": 0}

    def counted(name, expire):
        def count(now):
            calls[name] += 1
            return expire(now)

        return count

    monkeypatch.setattr(few_gpu, "expire", counted("few_gpu", few_gpu.expire))
    monkeypatch.setattr(many_reads, "expire", counted("many_reads", many_reads.expire))
    engine.evaluate([gpu(0)])
    engine.evaluate([read(t, user=f"u{t}") for t in range(1, 101)])
    # a correlation is asked to expire only once event time has passed the end of its first
    # window (gpu_proc's ends at 300 s, the first read's at 301 s): no read before needs it
    assert calls == {"few_gpu": 0, "many_reads": 0}
    assert ids(engine.evaluate([read(301)])) == ["few_gpu"]
    assert calls == {"few_gpu": 1, "many_reads": 0}
    engine.evaluate([read(302)])  # now past the first read's window: it is dropped
    assert calls == {"few_gpu": 1, "many_reads": 1}
    assert len(many_reads.groups) == 101 - 1


class EveryCorrelationEachTime(Engine):
    """The engine as it was: every correlation asked to expire at each new event time, and an
    event's feeds always put in order again."""

    def _expire(self, now, out):
        for each in self.correlations:
            for fired in each.expire(now):
                self._fire(each, fired, out)

    def _hits(self, slots, hits, event, out):
        self.stats.rule_hits += len(hits)
        feeds = []
        for i in hits:
            slot = slots[i]
            if slot.emit:
                out.append(Match(slot.rule, (event,)))
            feeds.extend(slot.feeds)
        if not feeds:
            return
        t = epoch(event.get("@timestamp"))
        if t is None:
            self.stats.untimed_events += 1
            return
        if not self.pending.push(t, event, (event, self._ordered(feeds), None)):
            self.stats.late_events += 1


def outcome(engine: Engine, events: list[dict], batch: int = 256) -> list[tuple]:
    found = []
    for i in range(0, len(events), batch):
        found += engine.evaluate(events[i : i + batch])
    found += engine.flush()
    return [
        (m.rule.id, [id(e) for e in m.events], m.group, m.window_start, m.value, m.time)
        for m in found
    ]


def test_bundled_rules_match_the_same_as_every_correlation_each_time():
    rules = load_rules(None)
    placeholders = SiteConfig().placeholders()
    attacks = [dict(e) for test in rules.tests for e in test.match if "event.category" in e]
    events = list(generate(10_000, attacks + attack_events(Engine(rules, placeholders))))
    ours = outcome(Engine(rules, placeholders), events)
    assert fired_correlations(rules, ours)
    assert ours == outcome(EveryCorrelationEachTime(rules, placeholders), events)


def fired_correlations(rules: RuleSet, found: list[tuple]) -> set[str]:
    correlations = {r.id for r in rules.rules if r.kind == "correlation"}
    return {rule_id for rule_id, *_ in found} & correlations


@pytest.mark.parametrize("lateness", [0.0, 30.0, None])
def test_correlations_and_chains_match_the_same_as_every_correlation_each_time(lateness):
    rules = ruleset(
        "---\n".join(
            [
                FEW_GPU,
                MANY_READS,
                correlation(
                    "event_count",
                    "[gpu_proc]",
                    "{gte: 3}",
                    name="burst",
                    timespan="2m",
                    extra="  generate: true\n",
                ),
                correlation("event_count", "[burst]", "{gte: 2}", name="bursts", timespan="1h"),
                correlation("temporal", "[gpu_proc, file_read]", "{gte: 2}", name="both"),
                correlation(
                    "value_count", "[file_read]", "{gte: 3, field: file.path}", name="paths"
                ),
            ]
        )
    )
    rng = random.Random(7)
    events, t = [], 0.0
    for _ in range(3_000):
        t += rng.expovariate(1 / 20)
        when = max(0.0, t - rng.choice([0, 0, 0, 15, 60]))  # some arrive late
        user = f"u{rng.randrange(12)}"
        if rng.random() < 0.5:
            events.append(gpu(when, user))
        else:
            events.append(read(when, user, **{"file.path": f"/p/{rng.randrange(5)}"}))
    ours = outcome(Engine(rules, lateness=lateness), events, batch=7)
    assert len(fired_correlations(rules, ours)) >= 4
    assert ours == outcome(EveryCorrelationEachTime(rules, lateness=lateness), events, batch=7)


SAME_TEST_RULES = """\
title: to ten
id: 00000000-0000-4000-8000-0000000000a1
logsource: {product: hpc, category: network_socket}
detection:
  sel:
    network.state: established
    destination.ip|startswith: '10.'
  condition: sel
---
title: listening
id: 00000000-0000-4000-8000-0000000000a2
logsource: {product: hpc, category: network_socket}
detection:
  sel:
    network.state: listen
    source.port: 22
  condition: sel
---
title: ssh out
id: 00000000-0000-4000-8000-0000000000a3
logsource: {product: hpc, category: network_socket}
detection:
  sel:
    network.state: established
    destination.port: 22
  local:
    destination.ip|startswith: '127.'
  condition: sel and not local
"""


def test_rules_with_the_same_test_fetch_a_field_once():
    rules = RuleSet(
        [LoadedRule(r, "<test>", 1, "test") for r in SigmaCollection.from_yaml(SAME_TEST_RULES)]
    )
    engine = Engine(rules)
    source = engine._by_category["network_socket"][0].source
    assert source.count("g('destination.ip')") == 1  # by the first rule, for the third too
    event = {
        "event.category": "network_socket",
        "network.state": "ESTABLISHED",
        "destination.ip": "10.0.0.7",
        "destination.port": 22,
    }
    assert [m.rule.title for m in engine.evaluate([event])] == ["to ten", "ssh out"]
    local = {**event, "destination.ip": "127.0.0.1"}
    assert engine.evaluate([local]) == []
    listening = {**event, "network.state": "listen", "source.port": 22}
    assert [m.rule.title for m in engine.evaluate([listening])] == ["listening"]


BIG_READ = """\
title: big read
id: 00000000-0000-4000-8000-0000000000b1
name: big_read
logsource: {product: hpc, category: file_access}
detection:
  sel:
    file.path|startswith: /big/
  condition: sel
"""


def test_feeds_of_rules_matched_together_are_ordered_once_and_keep_the_chain_order(monkeypatch):
    rules = ruleset(
        BIG_READ
        + "---\n"
        + correlation("temporal_ordered", "[file_read, big_read]", "{gte: 2}", name="then_big")
    )
    engine = Engine(rules)
    calls = []
    ordered = engine._ordered
    monkeypatch.setattr(engine, "_ordered", lambda feeds: calls.append(1) or ordered(feeds))
    found = []
    for t in range(50):  # each event matches both steps: it may complete only the first
        found += engine.evaluate([read(t, **{"file.path": f"/big/{t}"})])
    fired = [m.time for m in found if m.rule.id == rules.find("then_big").id]
    assert fired[0] == "2026-12-01T10:00:01.000Z"  # not at the first event alone
    assert len(calls) == 1  # the same two rules each time: put in order once

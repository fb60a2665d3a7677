"""bench/sigmahq.py's unique-values workload, over the vendored SigmaHQ rules
(tests/data/sigmahq, DRL 1.1): every benign value made distinct, the rules' own values kept,
and the same (event, rule) matches as the events as generated, indexed or not."""

from __future__ import annotations

from typing import Any

from bench.sigmahq import FIXED, generate, match_set, run_matches, unique_values
from hpcsec.detector.engine.evaluate import Engine
from tests.detector.test_engine_sigmahq_rules import CATEGORY, ruleset
from tests.detector.test_engine_sigmahq_rules import events as sigmahq_events

EVENTS = 2000
# benign values as the bench writes them (`C:\\Program Files\\NAME\\NAME.exe`) that still fire a
# rule by their end or by what is before the last name: made unique, they must still fire it
FIRING = [
    {"Image": "C:\\Program Files\\bash\\curl.exe", "CommandLine": "C:\\x --insecure\\y.exe"},
    {"Image": "C:\\Program Files\\bash\\ping.exe", "CommandLine": "C:\\0x7F000001\\ping.exe"},
]


def benign_texts(events: list[dict[str, Any]], background: list[bool]) -> list[str]:
    return [
        value
        for event, benign in zip(events, background, strict=True)
        if benign
        for field, value in event.items()
        if field not in FIXED
    ]


def test_unique_values_are_distinct_and_match_the_same_rules():
    rules = ruleset()
    events, background = generate(rules, EVENTS)
    assert 0 < sum(background) < EVENTS
    events += [{"event.category": CATEGORY, **event} for event in FIRING * 3]
    background += [True] * len(FIRING) * 3
    unique = unique_values(events, background)
    texts = benign_texts(unique, background)
    assert len(set(texts)) == len(texts) > len(set(benign_texts(events, background)))
    for event, changed, benign in zip(events, unique, background, strict=True):
        assert event.keys() == changed.keys()
        for field, value in event.items():  # only the benign values change
            assert (changed[field] == value) == (not benign or field in FIXED)
    found = []
    for index_min in (1, 10**6):
        for workload in (events, unique):
            _, matches = run_matches(Engine(rules, index_min=index_min), workload)
            found.append(match_set(matches, workload))
    assert len(found[0]) >= len(FIRING) * 3
    assert all(each == found[0] for each in found)


def test_the_sqlite_peer_converts_the_routed_rules_and_finds_their_matches(tmp_path):
    """The peer reads each rule's routed logsource (its header), not its pySigma object's,
    which keeps the rule's own product: every rule then fell out of the peer unseen."""
    import orjson

    from bench.engine import run_sqlite, sql_queries
    from hpcsec.detector.engine.ruleset import RuleSet

    rules = ruleset()
    # the rules' own cases, without lists (which have no SQL form in the backend)
    events = [{k: v for k, v in e.items() if not isinstance(v, list)} for e in sigmahq_events()]
    queries = []
    for rule in rules.rules:
        try:
            queries += sql_queries(RuleSet([rule]), {})
        except Exception:  # as the bench: the backend refuses a rule now and then
            continue
    assert {category for _, category, _ in queries} == {CATEGORY}
    assert len({rule_id for rule_id, _, _ in queries}) >= len(rules.rules) - 2
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    fields = sorted({field for event in events for field in event})
    _, _, matches, refused = run_sqlite(path, fields, queries)
    engine = Engine(rules)
    found = {(m.rule.id, n) for n, e in enumerate(events) for m in engine.evaluate([e])}
    assert refused == 0
    assert matches == len({(r, n) for r, n in found if r in {q[0] for q in queries}}) > 0

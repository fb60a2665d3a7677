"""Correlations on event time: any arrival order of the same events gives the same alerts.

The bundled rules' correlation tests and a generated set of sequences (every correlation type,
with group-by, aliases, chaining and generate) are replayed in time order, reversed and
shuffled (fixed seeds), as one input (`scan`) and in small batches with a lateness allowance
(the agent), and must give identical alerts.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from hpcsec.detector.alerts.builder import AlertBuilder
from hpcsec.detector.config.site import SiteConfig, load_config
from hpcsec.detector.core.errors import ConfigError
from hpcsec.detector.engine.evaluate import Engine, Match
from hpcsec.detector.engine.groups import epoch
from hpcsec.detector.engine.loader import load_rules
from hpcsec.detector.engine.ruleset import RuleSet
from hpcsec.detector.engine.ruletests import rules_for
from hpcsec.detector.runtime.agent_settings import correlation_lateness
from hpcsec.detector.runtime.pipeline import Pipeline, SourceBatch
from tests.detector.test_engine_correlation import (
    at,
    correlation,
    ev,
    gpu,
    read,
    ruleset,
)

ROOT = Path(__file__).resolve().parents[2]
SEEDS = (1, 2, 3, 4, 5)


def orders(events: list[dict]) -> dict[str, list[dict]]:
    """The same events in time order, reversed, and shuffled with fixed seeds."""
    timed = sorted(events, key=lambda e: epoch(e.get("@timestamp")) or 0.0)
    out = {"time order": timed, "reversed": timed[::-1]}
    for seed in SEEDS:
        shuffled = list(timed)
        random.Random(seed).shuffle(shuffled)
        out[f"shuffled {seed}"] = shuffled
    return out


def correlation_alerts(matches: list[Match]) -> list[dict[str, Any]]:
    """The alerts the correlations' matches become, in a stable order."""
    builder = AlertBuilder()
    builder.add([m for m in matches if m.rule.kind == "correlation"])
    return sorted((dict(a) for a in builder.alerts()), key=lambda a: a["alert.id"])


def run_whole(rules: RuleSet, events: list[dict], placeholders=None) -> list[dict]:
    """`scan`: the whole input, in event-time order."""
    engine = Engine(rules, placeholders, lateness=None)
    matches = engine.evaluate([dict(e) for e in events])
    return correlation_alerts(matches + engine.flush())


def run_batches(rules: RuleSet, events: list[dict], lateness: float, size: int = 2) -> list[dict]:
    """The agent: small batches, each evaluated as it arrives, within a lateness allowance."""
    engine = Engine(rules, lateness=lateness)
    matches: list[Match] = []
    for i in range(0, len(events), size):
        matches += engine.evaluate([dict(e) for e in events[i : i + size]])
    assert engine.stats.late_events == 0
    return correlation_alerts(matches + engine.flush())


def bundled_sequences() -> list[tuple[str, RuleSet, list[dict], dict]]:
    rules = load_rules([str(ROOT / "rules")])
    by_id = rules.by_id()
    cases = []
    for test in rules.tests:
        for sequence in test.sequences:
            rule = by_id[test.rule_id]
            name = f"{rule.sigma.title} ({Path(test.path).name}:{sequence.line})"
            placeholders = {**SiteConfig().placeholders(), **test.placeholders}
            cases.append((name, rules_for(rule, rules), list(sequence.events), placeholders))
    return cases


BUNDLED = bundled_sequences()


@pytest.mark.parametrize(
    ("name", "rules", "events", "values"), BUNDLED, ids=[c[0] for c in BUNDLED]
)
def test_bundled_correlation_tests_give_the_same_alerts_in_any_order(name, rules, events, values):
    results = {label: run_whole(rules, seq, values) for label, seq in orders(events).items()}
    expected = results.pop("time order")
    for label, alerts in results.items():
        assert alerts == expected, f"{name}: {label} differs from time order"


def test_bundled_sequences_include_every_correlation_rule():
    rules = load_rules([str(ROOT / "rules")])
    tested = {t.rule_id for t in rules.tests if t.sequences}
    correlations = {r.id for r in rules.rules if r.kind == "correlation"}
    assert correlations and correlations <= tested


# -- a generated set: every type, group-by, aliases, chaining, generate ----------------------
GENERATED = {
    "event_count": correlation("event_count", "[gpu_proc]", "{gte: 3}", timespan="1m"),
    "event_count_lt": correlation("event_count", "[gpu_proc]", "{lt: 3}", timespan="1m"),
    "value_count": correlation(
        "value_count", "[file_read]", "{field: file.path, gte: 3}", timespan="1m"
    ),
    "temporal": correlation("temporal", "[file_read, gpu_proc]", "{gte: 2}", timespan="1m"),
    "temporal_ordered": correlation(
        "temporal_ordered", "[file_read, gpu_proc]", "{gte: 2}", timespan="1m"
    ),
    "value_sum": correlation(
        "value_sum", "[flow]", "{field: network.bytes, gte: 300}", timespan="1m"
    ),
    "value_avg": correlation(
        "value_avg", "[flow]", "{field: network.bytes, gte: 60}", timespan="1m"
    ),
    "aliases": correlation(
        "temporal",
        "[file_read, gpu_proc]",
        "{gte: 2}",
        group_by="[who]",
        timespan="1m",
        extra=("  aliases:\n    who:\n      file_read: user.name\n      gpu_proc: process.owner\n"),
    ),
    "generate": correlation(
        "event_count", "[gpu_proc]", "{gte: 2}", timespan="1m", extra="  generate: true\n"
    ),
}


def chained() -> str:
    inner = correlation("event_count", "[gpu_proc]", "{gte: 2}", timespan="1m", name="inner")
    outer = correlation("event_count", "[inner]", "{gte: 2}", timespan="10m", name="outer")
    return inner + "---\n" + outer


def generated_events(seed: int) -> list[dict]:
    """Events of two users over a few minutes; several share a timestamp."""
    rng = random.Random(seed)
    events = []
    for _ in range(40):
        s = rng.randrange(0, 240, 3)
        user = rng.choice(("alice", "bob"))
        kind = rng.randrange(3)
        if kind == 0:
            events.append(gpu(s, user, **{"process.owner": user, "process.pid": rng.randrange(4)}))
        elif kind == 1:
            events.append(read(s, user, **{"file.path": f"/m/{rng.randrange(5)}"}))
        else:
            bytes_ = rng.randrange(0, 200)
            events.append(
                ev("roce_flow", "flow", s, **{"user.name": user, "network.bytes": bytes_})
            )
    return events


CASES = [*GENERATED.items(), ("chained", chained())]


@pytest.mark.parametrize(("kind", "text"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("seed", (11, 12, 13))
def test_generated_sequences_give_the_same_alerts_in_any_order(kind, text, seed):
    rules = ruleset(text)
    events = generated_events(seed)
    span = max(epoch(e["@timestamp"]) for e in events) - min(epoch(e["@timestamp"]) for e in events)
    expected = run_whole(rules, sorted(events, key=lambda e: e["@timestamp"]))
    for label, sequence in orders(events).items():
        assert run_whole(rules, sequence) == expected, f"{kind}, {label}: whole input"
        # the agent: batches of two, an allowance that covers the whole disorder
        assert run_batches(rules, sequence, lateness=span) == expected, f"{kind}, {label}"


def test_the_generated_set_fires():
    """The comparison above is only worth something if the sequences make alerts."""
    fired = {
        kind
        for kind, text in CASES
        for seed in (11, 12, 13)
        if run_whole(ruleset(text), generated_events(seed))
    }
    assert fired == {k for k, _ in CASES}


def test_correlation_alert_time_is_the_completing_event():
    rules = ruleset(GENERATED["temporal_ordered"])
    (alert,) = run_whole(rules, [gpu(40), read(5)])
    assert alert["@timestamp"] == at(40)
    assert (alert["alert.first_seen"], alert["alert.last_seen"]) == (at(5), at(40))


# -- the case from the field: the socket sensor's events come before the file events --------
def test_weights_read_then_connection_fires_when_the_connection_arrives_first():
    pipeline = Pipeline.load(SiteConfig(), None)  # scan: the whole input in event-time order
    read_event = {
        "event.category": "file_access",
        "event.action": "read",
        "@timestamp": "2026-11-30T01:00:05Z",
        "host.name": "gpu-017",
        "process.pid": 61000,
        "user.name": "alice",
        "file.path": "/lustre/models/llama-70b/model-00001-of-00030.safetensors",
        "hpcsec.asset.name": "llama-70b",
        "hpcsec.asset.kind": "model",
    }
    socket_event = {
        "event.category": "network_socket",
        "@timestamp": "2026-11-30T01:00:10Z",
        "host.name": "gpu-017",
        "network.state": "ESTABLISHED",
        "source.ip": "10.30.0.17",
        "destination.ip": "198.51.100.23",
        "destination.port": 443,
        "process.pid": 61000,
    }
    step = pipeline.process([SourceBatch([socket_event], None)])  # sockets sensor first
    step2 = pipeline.process([SourceBatch([read_event], None)])
    alerts = step.alerts + step2.alerts + pipeline.flush()
    (theft,) = [a for a in alerts if a["rule.title"].startswith("Model weights read, then")]
    assert theft["@timestamp"] == "2026-11-30T01:00:10.000Z"
    assert theft["alert.first_seen"].startswith("2026-11-30T01:00:05")


# -- the agent's allowance ------------------------------------------------------------------
def test_agent_lateness_allowance_defaults_to_two_intervals_and_is_configurable(tmp_path):
    assert correlation_lateness(SiteConfig(), 10.0) == 20.0
    path = tmp_path / "site.yml"
    path.write_text("correlation_lateness_s: 90\n")
    assert correlation_lateness(load_config(path), 10.0) == 90.0
    path.write_text("correlation_lateness_s: -1\n")
    with pytest.raises(ConfigError, match="correlation_lateness_s must be at least 0"):
        load_config(path)


def test_a_live_clock_moves_time_on_while_the_stream_is_idle():
    now = [epoch(at(100))]
    rules = ruleset(GENERATED["temporal_ordered"])
    engine = Engine(rules, lateness=20, clock=lambda: now[0])
    assert engine.evaluate([gpu(99), read(95)]) == []  # held: 20 s may still bring earlier ones
    now[0] += 30  # nothing new arrived, but the clock says the allowance has passed
    assert [m.rule.sigma.name for m in engine.evaluate([])] == ["corr"]
    # a match older than the clock minus the allowance is late: counted, not correlated
    assert engine.evaluate([read(90), gpu(91)]) == [] and engine.stats.late_events == 2

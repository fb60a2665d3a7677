"""The hub's evaluation without NATS: decode, fleet firmware, cluster rules, ack cutoff."""

from __future__ import annotations

import math

import orjson
import pytest

from hpcsec.detector.alerts.identity import MAX_DISTINCT_PER_HOST, OVERFLOW_FIELD
from hpcsec.detector.cluster.evaluation import HUB_LATENESS_S, HubClock, HubEvaluation
from hpcsec.detector.cluster.fleet import FleetFirmware
from hpcsec.detector.cluster.partition import (
    PARTITIONS,
    member_partitions,
    parse_member,
    partition_of,
    subject_for,
)
from hpcsec.detector.config.site import SiteConfig
from hpcsec.detector.core.errors import UsageError
from hpcsec.detector.runtime.pipeline import Pipeline
from tests.cluster.scenario import (
    CLUSTER_RULES,
    FLEET_FIRMWARE,
    JOB_EXFIL,
    interleaved_events,
)

HOUR = 3600.0


def evaluator(wall: float = 1e10, lateness_s: float | None = HOUR) -> HubEvaluation:
    return HubEvaluation.load(SiteConfig(), lateness_s=lateness_s, clock=HubClock(lambda: wall))


def run_nodes(
    ev: HubEvaluation, scenario: str, batch: int = 7, behind: str | None = None
) -> list[dict]:
    """The nodes' events as nodes publishing at once deliver them: each node in its own
    order, the nodes interleaved (`behind`: that node only after all the others)."""
    events = interleaved_events(scenario, behind)
    alerts = []
    for i in range(0, len(events), batch):
        decoded = [ev.decode(orjson.dumps(e), host) for host, e in events[i : i + batch]]
        alerts += ev.evaluate([e for e in decoded if e is not None])
    return alerts + ev.finish()


def test_a_partition_read_later_holds_the_hub_time_back() -> None:
    now = {"wall": 2_000_000_000.0, "mono": 0.0}
    clock = HubClock(lambda: now["wall"], lambda: now["mono"], sources=(0, 1))
    clock.observe(1_000_007_200.0, 0)  # partition 0 is two hours ahead of partition 1
    assert clock() == float("-inf")  # partition 1 has said nothing yet
    clock.observe(1_000_000_000.0, 1)
    assert clock() == 1_000_000_000.0
    clock.idle(1)  # partition 1 caught up: partition 0's time is the hub's
    assert clock() == 1_000_007_200.0
    clock.idle(0)  # all quiet; then partition 0 delivers again: 1 may follow with older
    clock.observe(1_000_009_000.0, 0)
    assert clock() == 1_000_007_200.0
    clock.idle(1)
    assert clock() == 1_000_009_000.0


def test_a_partition_that_stops_answering_holds_the_hub_time_back_again() -> None:
    """Partition 1 was caught up, then its consumer lost its leader (a server died) while
    the others went on: the events its new leader delivers later are not late."""
    now = {"wall": 2_000_000_000.0, "mono": 0.0}
    clock = HubClock(lambda: now["wall"], lambda: now["mono"], sources=(0, 1, 2))
    for partition in (0, 1, 2):
        clock.observe(1_000_000_000.0, partition)
    clock.idle(1)  # caught up while 0 and 2 still deliver
    clock.busy(1)  # its consumer no longer says so
    clock.observe(1_000_003_600.0, 0)
    clock.observe(1_000_003_600.0, 2)
    clock.idle(0)
    clock.idle(2)
    assert clock() == 1_000_000_000.0  # held at partition 1's newest event
    clock.observe(1_000_001_000.0, 1)  # what the new leader delivers
    clock.idle(1)
    assert clock() == 1_000_003_600.0


def test_a_caught_up_report_stands_for_the_time_it_was_made() -> None:
    """Partition 1 reported caught up, then newer events came from the others while its
    consumer's leader died with events of its own in it (a server killed mid-stream): the
    hub's time stays where it was at the report until partition 1 reports again."""
    now = {"wall": 2_000_000_000.0, "mono": 0.0}
    clock = HubClock(lambda: now["wall"], lambda: now["mono"], sources=(0, 1, 2))
    for partition in (0, 1, 2):
        clock.observe(1_000_000_000.0, partition)
    clock.idle(1)
    clock.observe(1_000_001_800.0, 0)
    clock.observe(1_000_001_900.0, 2)
    clock.idle(0)
    clock.idle(2)
    assert not clock.quiet
    assert clock() == 1_000_000_000.0
    clock.observe(1_000_000_600.0, 1)  # delivered by the new leader: not late
    clock.idle(1)
    assert clock.quiet and clock() == 1_000_001_900.0


def test_hub_runs_the_runtime_pipeline_with_its_lateness() -> None:
    ev = HubEvaluation.load(SiteConfig())
    assert isinstance(ev.pipeline, Pipeline)
    assert ev.pipeline.engine.pending.lateness == HUB_LATENESS_S
    configured = HubEvaluation.load(SiteConfig(correlation_lateness_s=7.0))
    assert configured.pipeline.engine.pending.lateness == 7.0


def test_attack_scenario_raises_every_cluster_rule() -> None:
    alerts = run_nodes(evaluator(), "attack")
    by_rule = {a["rule.id"]: a for a in alerts if a["rule.id"] in CLUSTER_RULES}
    assert set(by_rule) == CLUSTER_RULES
    assert by_rule[JOB_EXFIL]["alert.hosts"] == ["gpu-101", "gpu-102"]
    assert by_rule[JOB_EXFIL]["alert.group"] == {"slurm.job.id": "9100"}
    firmware = by_rule[FLEET_FIRMWARE]
    assert firmware["host.name"] == "gpu-104"
    assert firmware["events"][0]["hpcsec.cluster.firmware_majority_version"] == "28.39.1002"


def test_benign_training_job_raises_nothing() -> None:
    assert run_nodes(evaluator(), "benign") == []


def test_a_node_publishing_behind_the_others_is_correlated_within_the_lateness() -> None:
    """gpu-102 (the upload of job 9100) publishes half an hour of events after every other
    node is done: within the allowance, the job's correlation still sees it."""
    ev = evaluator(lateness_s=HOUR)
    alerts = run_nodes(ev, "attack", behind="gpu-102")
    assert JOB_EXFIL in {a["rule.id"] for a in alerts}
    assert ev.counters.late == 0


def test_events_later_than_the_allowance_are_counted_not_correlated() -> None:
    ev = evaluator(lateness_s=60.0)
    alerts = run_nodes(ev, "attack", behind="gpu-102")
    assert JOB_EXFIL not in {a["rule.id"] for a in alerts}
    assert ev.counters.late > 0


def test_hub_clock_follows_event_time_moves_on_when_idle_and_ignores_the_future() -> None:
    now = {"wall": 2_000_000_000.0, "mono": 0.0}
    clock = HubClock(lambda: now["wall"], lambda: now["mono"])
    assert clock() == float("-inf")
    clock.observe(1_000_000_000.0)  # a replay of old events runs on their time
    assert clock() == 1_000_000_000.0
    now["mono"] = 30.0
    assert clock() == 1_000_000_000.0  # the source may still deliver: time waits for it
    clock.idle()  # caught up
    now["mono"] = 60.0  # nothing arrives for 30 s: a quiet fleet's time still moves on
    assert clock() == 1_000_000_030.0
    clock.observe(9_000_000_000.0)  # a node stamps its events in the future
    assert clock() == now["wall"]


def test_odd_firmware_reported_first_is_flagged_once_the_majority_forms() -> None:
    fleet = FleetFirmware()

    def fw(host: str, version: str) -> dict:
        return {
            "event.category": "firmware",
            "host.name": host,
            "firmware.component": "hca_fw",
            "firmware.version": version,
            "firmware.board_id": "MT_1",
        }

    assert "hpcsec.cluster.firmware_majority_version" not in fleet.observe(fw("a", "2"))[0]
    assert len(fleet.observe(fw("b", "1"))) == 1
    out = fleet.observe(fw("c", "1"))  # majority 1 of 3 forms: a is handed back
    assert [e["host.name"] for e in out] == ["c", "a"]
    assert out[1]["hpcsec.cluster.firmware_majority_version"] == "1"
    # another board is another class: no majority across classes
    other = fleet.observe({**fw("d", "9"), "firmware.board_id": "MT_2"})
    assert "hpcsec.cluster.firmware_majority_version" not in other[0]


@pytest.mark.parametrize(
    "payload",
    [
        b"not json",
        b"[1, 2]",
        b'"text"',
        b'{"@timestamp": 5, "event.category": "process"}',
        b'{"host.name": "x"}',
        b'{"event.category": "process", "process.pid": [1, 2]}',
    ],
)
def test_malformed_messages_are_counted_not_raised(payload: bytes) -> None:
    ev = evaluator()
    assert ev.decode(payload, "gpu-1") is None
    assert ev.counters.malformed == 1 and ev.counters.last_problem


def test_host_name_comes_from_the_subject_and_hub_fields_from_the_hub() -> None:
    ev = evaluator()
    payload = (
        b'{"event.category": "firmware", "host.name": "gpu-9", "firmware.component": "bios",'
        b' "hpcsec.cluster.firmware_majority_version": "forged"}'
    )
    event = ev.decode(payload, "gpu-1")
    assert event is not None and event["host.name"] == "gpu-1"
    assert "hpcsec.cluster.firmware_majority_version" not in event
    assert ev.counters.host_rewritten == 1


def test_ack_cutoff_keeps_open_windows_held_matches_and_ignores_future_times() -> None:
    wall = 2_000_000_000.0
    clock = HubClock(lambda: wall, lambda: 0.0)  # no idle time passes
    ev = HubEvaluation.load(SiteConfig(), lateness_s=120.0, clock=clock)
    assert ev.horizon_s >= 30 * 60  # the longest cluster correlation is 30 minutes
    assert ev.ack_cutoff() == -math.inf  # nothing seen yet: nothing acknowledged
    miner = {"event.category": "process", "process.name": "xmrig", "process.pid": 1}
    at = 1_900_000_000.0
    ev.evaluate([{**miner, "@timestamp": "2030-03-17T17:46:40Z"}])  # = at
    # held for the lateness, then windows reach back the horizon: all of it is kept
    assert ev.ack_cutoff() == at - 120 - ev.horizon_s
    ev.evaluate([{**miner, "process.pid": 2, "@timestamp": "2030-03-17T17:56:40Z"}])
    assert ev.ack_cutoff() == at + 600 - 120 - ev.horizon_s
    future = {**miner, "process.pid": 3, "@timestamp": "2099-01-01T00:00:00Z"}
    ev.evaluate([future])  # a node sent events from the future: the wall clock caps it
    assert ev.ack_cutoff() == wall - 120 - ev.horizon_s
    no_windows = HubEvaluation.load(SiteConfig())
    no_windows.pipeline.engine.correlations.clear()
    assert no_windows.ack_cutoff() == math.inf


def test_partitions_keep_correlation_groups_together() -> None:
    job = [
        {"event.category": "file_access", "user.name": "mallory", "host.name": f"gpu-{i}"}
        for i in range(20)
    ]
    assert len({partition_of(e) for e in job}) == 1
    miners = [
        {"event.category": "process", "process.name": "xmrig", "user.name": f"u{i}"}
        for i in range(20)
    ]
    assert len({partition_of(e) for e in miners}) == 1
    assert subject_for(3, "gpu.1 *>") == "hpcsec.events.p03.gpu_1___"
    owned = [member_partitions(i, 3) for i in range(3)]
    assert sorted(p for ps in owned for p in ps) == list(range(PARTITIONS))


@pytest.mark.parametrize("text", ["2/2", "x", "0/0", "1/13", "-1/2"])
def test_bad_member_is_a_usage_error(text: str) -> None:
    with pytest.raises(UsageError):
        parse_member(text)


def test_a_node_behind_is_correlated_when_the_fleet_sends_long_events_meanwhile() -> None:
    """The hub holds a fleet's matches for its allowance: the others' process events, each
    with the 64 KiB command line a process sensor keeps, more of them in that hour than the
    agent's 16 MiB (reorder.MAX_LIVE_BYTES), must not make gpu-102's events late."""
    ev = evaluator(lateness_s=HOUR)
    command_line = "x" * 2**16
    events = interleaved_events("attack", behind="gpu-102")
    alerts = []
    for i, (host, event) in enumerate(events):
        copies = 1 if host == "gpu-102" else 40
        for n in range(copies):
            padded = {**event, "event.id": f"{i}-{n}", "process.command_line": command_line}
            decoded = ev.decode(orjson.dumps(padded), host)
            alerts += ev.evaluate([decoded] if decoded is not None else [])
    alerts += ev.finish()
    assert ev.pipeline.engine.pending.forced == 0
    assert ev.counters.late == 0
    assert JOB_EXFIL in {a["rule.id"] for a in alerts}


def test_an_event_stamped_past_the_hubs_clock_is_malformed_and_timeless() -> None:
    """One event of the year 2100 held every later message of its partition unacked, and a
    flood of them pushed the engine's release time there (every real match late: every
    cluster correlation blind). Past MAX_AHEAD_S of the hub's wall clock, an event is
    counted as malformed and has no time (the hub holds it as such: acked with the others);
    within it, it is an event as any other."""
    from datetime import UTC, datetime

    from hpcsec.detector.cluster.evaluation import MAX_AHEAD_S
    from hpcsec.detector.core.timefmt import rfc3339

    wall = 2_000_000_000.0
    ev = evaluator(wall=wall)
    future = {"event.category": "process", "@timestamp": "2100-01-01T00:00:00Z"}
    assert ev.timed(ev.decode(orjson.dumps(future), "evil")) == (None, None)
    assert ev.counters.malformed == 1 and "past this hub's clock" in ev.counters.last_problem
    for ahead in (MAX_AHEAD_S - 5, -3600.0):
        stamp = rfc3339(datetime.fromtimestamp(wall + ahead, UTC))
        event, t = ev.timed(ev.decode(orjson.dumps(dict(future, **{"@timestamp": stamp})), "n"))
        assert event is not None and t == pytest.approx(wall + ahead, abs=0.001)
    assert ev.counters.malformed == 1


def test_the_hub_honours_no_default_rules(tmp_path, capsys) -> None:
    """`hpcsec hub --no-default-rules` ran the bundled rules anyway (the flag was parsed and
    never passed on): without other rules it is now the usage error the other commands give,
    before any connection, and with a rule file only that file's rules run."""
    from hpcsec.detector.cli.main import main

    assert main(["hub", "--nats", "nats://127.0.0.1:9", "--no-default-rules"]) == 2
    assert "--no-default-rules needs rules" in capsys.readouterr().err
    own = tmp_path / "own.yml"
    own.write_text(
        "title: Own\nid: 0d1e2f3a-4b5c-4d6e-8f70-8192a3b4c5d6\nstatus: test\nlevel: low\n"
        "logsource: {product: hpc, category: process}\n"
        "detection: {sel: {process.name: own}, condition: sel}\n"
    )
    only = HubEvaluation.load(SiteConfig(), [str(own)], default_rules=False)
    assert [r.title for r in only.pipeline.ruleset.rules] == ["Own"]
    assert len(HubEvaluation.load(SiteConfig(), [str(own)]).pipeline.ruleset.rules) > 1


def test_a_node_making_up_jobs_and_users_gets_a_bounded_number_of_alerts() -> None:
    """The hub takes only `host.name` from where a node published: a compromised node that
    gives each miner event a user and job of its own still gets at most the host's bound
    of alerts per rule and window, the rest folded into one overflow alert per rule."""
    ev = evaluator()
    n = MAX_DISTINCT_PER_HOST + 300
    miners = [
        {
            "@timestamp": f"2026-12-01T10:00:{i % 60:02d}Z",
            "event.id": f"m{i}",
            "event.category": "process",
            "event.action": "start",
            "process.pid": 10_000 + i,
            "process.name": "xmrig",
            "process.executable": "/tmp/xmrig",
            "process.command_line": "xmrig -o stratum+tcp://pool.example:3333",
            "user.name": f"made-up-{i}",
            "user.id": 20_000 + i,
            "slurm.job.id": str(500_000 + i),
        }
        for i in range(n)
    ]
    decoded = [ev.decode(orjson.dumps(e), "gpu-017") for e in miners]
    alerts = ev.evaluate([e for e in decoded if e is not None]) + ev.finish()
    by_rule: dict[str, list[dict]] = {}
    for alert in alerts:
        by_rule.setdefault(alert["rule.id"], []).append(alert)
    assert by_rule  # the miner rules fired
    for rule_alerts in by_rule.values():
        assert len(rule_alerts) <= MAX_DISTINCT_PER_HOST + 1
    assert any(
        len(a) == MAX_DISTINCT_PER_HOST + 1 and a[-1].get(OVERFLOW_FIELD) for a in by_rule.values()
    )

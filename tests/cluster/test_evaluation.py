"""The hub's evaluation without NATS: decode, fleet firmware, cluster rules, ack cutoff."""

from __future__ import annotations

import math

import orjson
import pytest

from hpcsec.detector.cluster.evaluation import ClusterEvaluator
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
from hpcsec.detector.engine.evaluate import Engine
from hpcsec.detector.engine.loader import load_rules
from tests.cluster.scenario import (
    CLUSTER_RULES,
    FLEET_FIRMWARE,
    JOB_EXFIL,
    fleet_batches,
)


def evaluator(clock: float = 1e10) -> ClusterEvaluator:
    config = SiteConfig()
    engine = Engine(load_rules(None, with_tests=False), placeholders=config.placeholders())
    return ClusterEvaluator(config, engine, clock=lambda: clock)


def run_nodes(ev: ClusterEvaluator, scenario: str, batch: int = 7) -> list[dict]:
    """The nodes' events in time order, as nodes publishing at once deliver them."""
    alerts = []
    for chunk in fleet_batches(scenario, batch):
        decoded = [ev.decode(orjson.dumps(e), host) for host, e in chunk]
        alerts += ev.evaluate([e for e in decoded if e is not None])
    return alerts


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


def test_ack_cutoff_keeps_open_windows_and_ignores_future_times() -> None:
    ev = evaluator(clock=2_000_000_000.0)
    assert ev.horizon_s >= 30 * 60  # the longest cluster correlation is 30 minutes
    ev.engine.watermark = 1_900_000_000.0
    assert ev.ack_cutoff() == 1_900_000_000.0 - ev.horizon_s
    ev.engine.watermark = 4_000_000_000.0  # a node sent events from the future
    assert ev.ack_cutoff() == 2_000_000_000.0 - ev.horizon_s
    config = SiteConfig()
    plain = load_rules(None, with_tests=False)
    plain.rules = [r for r in plain.rules if r.kind == "detection"]
    no_windows = ClusterEvaluator(config, Engine(plain, placeholders=config.placeholders()))
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

"""Two hub members share the partitions; one is killed mid-stream and restarted."""

from __future__ import annotations

import asyncio
import re
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from nats.js.errors import KeyNotFoundError

from hpcsec.detector.cluster.consumer import durable_name
from hpcsec.detector.cluster.evaluation import HubEvaluation
from hpcsec.detector.cluster.partition import member_partitions, partition_of
from hpcsec.detector.cluster.publisher import Publisher
from hpcsec.detector.cluster.streams import (
    ALERTS_BUCKET,
    EVENTS_STREAM,
    StreamSettings,
    connect,
    ensure_events_stream,
)
from hpcsec.detector.config.site import SiteConfig
from tests.cluster.conftest import HubProcess, wait_for
from tests.cluster.harness import NatsServer

START = datetime(2026, 12, 1, 2, 0, tzinfo=UTC)
USERS = 40


def read(user: int, host: int, at: datetime) -> dict:
    return {
        "event.category": "file_access",
        "@timestamp": at.strftime("%Y-%m-%dT%H:%M:%S.000Z"),
        "host.name": f"gpu-{host:03d}",
        "event.action": "open",
        "process.pid": 1000 + user,
        "process.name": "python3",
        "user.name": f"user{user:02d}",
        "slurm.node.user_has_job": False,
        "file.path": f"/lustre/models/llama-70b/model-{host:05d}-of-00030.safetensors",
        "hpcsec.asset.name": "llama-70b",
        "hpcsec.asset.kind": "model",
    }


def workload() -> tuple[list[dict], list[dict]]:
    """Every user reads a model on two nodes without a job there, twice: two hours early
    (acknowledged long before the kill) and now. Half of the second reads come after it."""
    early, before, after = [], [], []
    for u in range(USERS):
        at = START + timedelta(seconds=10 * u)
        early += [read(u, 1, at - timedelta(hours=2)), read(u, 2, at - timedelta(hours=2))]
        before.append(read(u, 3, at))
        (before if u < USERS // 2 else after).append(read(u, 4, at + timedelta(minutes=5)))
    key = lambda e: e["@timestamp"]  # noqa: E731
    return sorted(early + before, key=key), sorted(after, key=key)


def expected_ids(events: list[dict]) -> set[str]:
    evaluation = HubEvaluation.load(SiteConfig())
    alerts = []
    for i in range(0, len(events), 16):
        alerts += evaluation.evaluate([dict(e) for e in events[i : i + 16]])
    return {a["alert.id"] for a in alerts + evaluation.finish()}


async def publish(url: str, events: list[dict]) -> None:
    nc = await connect([url], reconnect=False)
    try:
        js = nc.jetstream()
        await ensure_events_stream(js, StreamSettings())
        report = await Publisher(js).publish([dict(e) for e in events])
        assert report.failed == 0
    finally:
        await nc.close()


async def acked(url: str, partitions: set[int]) -> int:
    """The highest ack floor among the partitions' durable consumers."""
    nc = await connect([url], reconnect=False)
    try:
        js = nc.jetstream()
        floors = [
            (await js.consumer_info(EVENTS_STREAM, durable_name(p))).ack_floor.stream_seq
            for p in partitions
        ]
        return max(floors)
    finally:
        await nc.close()


async def recorded(url: str, alert_ids: list[str]) -> bool:
    """Whether the delivered-alerts bucket holds every one of `alert_ids`."""
    nc = await connect([url], reconnect=False)
    try:
        kv = await nc.jetstream().key_value(ALERTS_BUCKET)
        for alert_id in alert_ids:
            try:
                await kv.get(alert_id)
            except KeyNotFoundError:
                return False
        return True
    finally:
        await nc.close()


def test_killed_member_loses_nothing_and_sends_each_alert_once(
    nats_server: NatsServer, hubs: list[HubProcess], tmp_path: Path
) -> None:
    first, second = workload()
    expected = expected_ids(first + second)
    owned = set(member_partitions(0, 2))
    assert {partition_of(e) in owned for e in first} == {True, False}  # both members work
    members = [HubProcess(tmp_path, [nats_server.url], f"{i}/2", f"m{i}") for i in range(2)]
    hubs.extend(members)
    for member in members:
        member.start()
    asyncio.run(publish(nats_server.url, first))
    wait_for(lambda: len(members[0].alerts()) >= 3, 120, "member 0 alerting")
    wait_for(lambda: asyncio.run(acked(nats_server.url, owned)) > 0, 60, "member 0 acking")

    def settled() -> bool:
        # killed between an alert's spool write and its record in the bucket, a member sends
        # that alert again when restarted (docs/cluster.md): the kill comes after both
        before = [a["alert.id"] for a in members[0].alerts()]
        time.sleep(1.0)
        sent = [a["alert.id"] for a in members[0].alerts()]
        return sent == before and asyncio.run(recorded(nats_server.url, sent))

    wait_for(settled, 120, "member 0's alerts recorded as delivered")
    members[0].kill()
    asyncio.run(publish(nats_server.url, second))
    restarted = HubProcess(tmp_path, [nats_server.url], "0/2", "m0", log_name="m0-again")
    hubs.append(restarted)
    restarted.start()
    log = restarted.log.read_text()
    resumed = re.findall(r"(\d+) resumed from their last acknowledged event", log)
    assert resumed and int(resumed[-1]) > 0, log  # the early events were acknowledged

    def delivered() -> list[str]:
        return [a["alert.id"] for m in members for a in m.alerts()]

    wait_for(lambda: set(delivered()) >= expected, 90, "every expected alert")
    assert restarted.terminate() == 0
    assert members[1].terminate() == 0
    ids = delivered()
    assert set(ids) == expected
    assert len(ids) == len(set(ids)), "an alert was delivered twice"
    assert "replayed alerts not resent" in restarted.log.read_text()

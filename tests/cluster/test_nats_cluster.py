"""A three-server JetStream cluster loses a server: hub and publisher carry on."""

from __future__ import annotations

import asyncio
from pathlib import Path

from hpcsec.detector.cli.main import main
from hpcsec.detector.cluster.streams import ALERTS_BUCKET, EVENTS_STREAM, connect
from tests.cluster.conftest import HubProcess, wait_for
from tests.cluster.harness import NatsServer
from tests.cluster.scenario import CLUSTER_RULES, fleet_events


async def replicas(url: str) -> int:
    nc = await connect([url], reconnect=False)
    try:
        info = await nc.jetstream().stream_info(EVENTS_STREAM)
        return int(info.config.num_replicas or 1)
    finally:
        await nc.close()


async def leader(url: str, stream: str) -> str:
    """The name of the server holding the stream's JetStream leader."""
    nc = await connect([url], reconnect=False)
    try:
        info = await nc.jetstream().stream_info(stream)
        return str(info.cluster.leader)
    finally:
        await nc.close()


def write_events(path: Path, events: list[tuple[str, dict]]) -> str:
    import orjson

    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for _, e in events))
    return str(path)


def test_one_of_three_servers_killed(
    nats_cluster: list[NatsServer], hubs: list[HubProcess], tmp_path: Path
) -> None:
    urls = [s.url for s in nats_cluster]
    # The failover pause runs the hub's clock on (it follows the wall clock once caught up):
    # the allowance covers a reconnect, so events published after it are still correlated.
    hub = HubProcess(tmp_path, urls, lateness_s=20).start()
    hubs.append(hub)
    assert asyncio.run(replicas(urls[1])) == 3
    events = fleet_events("attack")
    half = len(events) // 2
    first = write_events(tmp_path / "first.jsonl", events[:half])
    second = write_events(tmp_path / "second.jsonl", events[half:])
    nats = [arg for url in urls for arg in ("--nats", url)]
    assert main(["publish", *nats, "--events", first]) == 0
    wait_for(lambda: len(hub.alerts()) > 0, 30, "alerts before the server is killed")
    # the server leading the delivered-alerts bucket (the hub needs it for every alert), and
    # with it some of the hub's consumers (12 leaders spread over 3 servers)
    bucket_leader = asyncio.run(leader(urls[0], f"KV_{ALERTS_BUCKET}"))
    next(s for s in nats_cluster if s.name == bucket_leader).kill()
    assert main(["publish", *nats, "--events", second]) == 0

    def cluster_rules() -> set[str]:
        return {a["rule.id"] for a in hub.alerts()} & CLUSTER_RULES

    wait_for(lambda: cluster_rules() == CLUSTER_RULES, 120, "every cluster alert")
    assert hub.terminate() == 0
    # the partitions whose consumers lost their leader held the hub's time back meanwhile
    last_report = hub.log.read_text().splitlines()[-1]
    assert f"hub: {len(events)} events," in last_report and ", 0 late events" in last_report

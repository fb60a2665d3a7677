"""publish -> JetStream -> hub -> alert in a file output, against real nats-server processes."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from types import SimpleNamespace

import orjson

from hpcsec.detector.cli.main import main
from hpcsec.detector.cluster.evaluation import HubClock, HubEvaluation
from hpcsec.detector.cluster.hub import Hub, HubSetup
from hpcsec.detector.cluster.partition import subject_for
from hpcsec.detector.cluster.streams import EVENTS_STREAM, StreamSettings, connect
from hpcsec.detector.config.site import SiteConfig
from hpcsec.detector.core.timefmt import parse_time
from hpcsec.detector.runtime.metrics import AgentMetrics
from hpcsec.detector.runtime.sink import AlertSink
from tests.cluster.conftest import HubProcess, wait_for
from tests.cluster.harness import NatsServer
from tests.cluster.scenario import (
    CLUSTER_RULES,
    FLEET_FIRMWARE,
    JOB_EXFIL,
    clock_event,
    node_files,
    write_fleet_file,
)

FLEET_MOVED_ON = "2026-12-01T03:40:00Z"  # the scenario ends 02:32; the fleet's time goes on


def publish_behind(url: str, hub: HubProcess, tmp_path: Path) -> None:
    """The attack scenario's nodes interleaved in their own order; gpu-102 (the job's upload)
    only once the hub has read all the others (its link was down), then one event from later
    on (the fleet's time moved on: what was held is handed on)."""
    nodes = node_files("attack")
    behind = nodes.pop("gpu-102")
    events = write_fleet_file("attack", tmp_path / "fleet.jsonl", behind="gpu-102")
    others = events.read_bytes().splitlines(keepends=True)[: -len(behind.read_bytes().splitlines())]
    first = tmp_path / "others.jsonl"
    first.write_bytes(b"".join(others))
    later = tmp_path / "later.jsonl"
    later.write_bytes(orjson.dumps(clock_event("gpu-101", FLEET_MOVED_ON)) + b"\n")
    read = 0
    for part in (first, behind, later):
        assert main(["publish", "--nats", url, "--events", str(part)]) == 0
        read += len(part.read_bytes().splitlines())
        hub.wait_log(f"hub: {read} events,", 30)
    # through the `hpcsec` logger, at INFO, as a service's progress is
    assert f"hpcsec: INFO: hub: {read} events," in hub.log.read_text()
    # with the member's own span of work (bench.cluster reads it)
    span = re.findall(
        r"messages evaluated from (\S+) to (\S+), ([\d.]+) s CPU", hub.log.read_text()
    )
    assert span and parse_time(span[-1][0]) <= parse_time(span[-1][1])


async def _stream_exists(url: str) -> bool:
    nc = await connect([url], reconnect=False)
    try:
        await nc.jetstream().stream_info(EVENTS_STREAM)
        return True
    except Exception:
        return False
    finally:
        await nc.close()


def test_hub_started_before_the_stream_alerts_on_published_events(
    nats_server: NatsServer, hubs: list[HubProcess], tmp_path: Path
) -> None:
    """Nodes interleaved in their own order, gpu-102 (the job's upload) half an hour behind
    the others: within the hub's lateness allowance, every cluster rule still fires."""
    assert not asyncio.run(_stream_exists(nats_server.url))
    hub = HubProcess(tmp_path, [nats_server.url], lateness_s=3600).start()
    hubs.append(hub)
    assert asyncio.run(_stream_exists(nats_server.url))  # the hub created it
    publish_behind(nats_server.url, hub, tmp_path)

    def cluster_alerts() -> dict[str, dict]:
        return {a["rule.id"]: a for a in hub.alerts() if a["rule.id"] in CLUSTER_RULES}

    wait_for(lambda: set(cluster_alerts()) == CLUSTER_RULES, 30, "the five cluster alerts")
    alerts = cluster_alerts()
    assert alerts[JOB_EXFIL]["alert.hosts"] == ["gpu-101", "gpu-102"]
    assert alerts[FLEET_FIRMWARE]["host.name"] == "gpu-104"
    assert hub.terminate() == 0
    ids = [a["alert.id"] for a in hub.alerts()]
    assert len(ids) == len(set(ids))
    assert "0 late events" in hub.log.read_text()


def test_events_later_than_the_allowance_are_counted_and_reported(
    nats_server: NatsServer, hubs: list[HubProcess], tmp_path: Path
) -> None:
    hub = HubProcess(tmp_path, [nats_server.url], lateness_s=60).start()
    hubs.append(hub)
    publish_behind(nats_server.url, hub, tmp_path)
    wait_for(lambda: FLEET_FIRMWARE in {a["rule.id"] for a in hub.alerts()}, 30, "alerts")
    assert hub.terminate() == 0
    assert JOB_EXFIL not in {a["rule.id"] for a in hub.alerts()}
    late = re.findall(r"(\d+) late events not correlated", hub.log.read_text())
    assert late and int(late[-1]) > 0


def test_publish_per_node_with_host_name(nats_server: NatsServer, tmp_path: Path) -> None:
    files = node_files("benign")
    for host, path in files.items():
        args = ["publish", "--nats", nats_server.url, "--events", str(path), "--host-name", host]
        assert main(args) == 0
    assert main(["publish", "--nats", nats_server.url, "--events", str(tmp_path / "none")]) == 2


def test_publish_without_a_server_or_jetstream_fails_with_2(tmp_path: Path) -> None:
    events = write_fleet_file("benign", tmp_path / "fleet.jsonl")
    no_js = NatsServer(tmp_path / "nojs", jetstream=False).start()
    try:
        assert main(["publish", "--nats", no_js.url, "--events", str(events)]) == 2
    finally:
        no_js.stop()
    assert main(["publish", "--nats", no_js.url, "--events", str(events)]) == 2


async def _publish_raw(url: str, messages: list[tuple[str, bytes]]) -> None:
    nc = await connect([url], reconnect=False)
    try:
        js = nc.jetstream()
        for subject, payload in messages:
            await js.publish(subject, payload, stream=EVENTS_STREAM)
    finally:
        await nc.close()


def test_malformed_messages_are_counted_and_skipped(
    nats_server: NatsServer, hubs: list[HubProcess], tmp_path: Path
) -> None:
    hub = HubProcess(tmp_path, [nats_server.url]).start()
    hubs.append(hub)
    miner = b'{"event.category": "process", "@timestamp": "2026-12-01T05:00:00Z", '
    bad = [
        b"\xff\xfe not json",
        b"[1, 2, 3]",
        b'{"event.category": "process", "@timestamp": 17}',
        b"{" * 5000 + b"}" * 5000,
    ]
    messages = [(subject_for(p, "gpu-666"), payload) for p, payload in enumerate(bad)]
    # stamped in the year 2100, ahead of the miners on their partition: it held their acks
    # (and, flooded, made every real match late); past the hub's clock it is malformed
    future = b'{"event.category": "process", "@timestamp": "2100-01-01T00:00:00Z", '
    messages.append((subject_for(0, "gpu-666"), future + b'"process.name": "xmrig"}'))
    for i, host in enumerate(("gpu-1", "gpu-2", "gpu-3")):
        event = miner + f'"process.name": "xmrig", "process.pid": {i + 10}}}'.encode()
        messages.append((subject_for(0, host), event))
    asyncio.run(_publish_raw(nats_server.url, messages))
    wait_for(
        lambda: any(a["rule.title"].startswith("The same miner") for a in hub.alerts()),
        30,
        "the miner alert after the malformed messages",
    )
    assert hub.terminate() == 0
    assert "5 malformed messages skipped" in hub.log.read_text()


async def _stream_messages(url: str) -> int:
    nc = await connect([url], reconnect=False)
    try:
        return int((await nc.jetstream().stream_info(EVENTS_STREAM)).state.messages)
    finally:
        await nc.close()


def test_publish_a_snapshot_as_scan_reads_it(nats_server: NatsServer) -> None:
    from hpcsec.detector.runtime.sources import demo_snapshot_dir

    snapshot = str(demo_snapshot_dir())
    args = ["publish", "--nats", nats_server.url, "--snapshot", snapshot, "--host-name", "demo-1"]
    assert main(args) == 0
    published = asyncio.run(_stream_messages(nats_server.url))
    assert published > 10
    assert main(args) == 0  # the same events again: the duplicate window keeps one copy
    assert asyncio.run(_stream_messages(nats_server.url)) == published


def test_a_partition_not_confirmed_caught_up_does_not_stop_the_loop() -> None:
    """A fetch that found nothing is queued as None when the consumer does not confirm the
    partition is caught up (a message published meanwhile waits): the loop counted the
    batch's messages with len() and died on it, a member's `internal error` at start-up."""

    async def loop_over(batches: list) -> None:
        clock = HubClock(sources=[0])
        hub = Hub(
            HubSetup([], (0, 1), StreamSettings()),
            HubEvaluation.load(SiteConfig(), clock=clock),
            AlertSink(None, None, AgentMetrics()),
        )
        queue: asyncio.Queue = asyncio.Queue()
        for batch in batches:
            queue.put_nowait(batch)
        task = asyncio.create_task(hub._loop(queue, delivered=None))
        while not queue.empty() and not task.done():
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)
        hub.stop.set()
        await task  # raises what the loop raised

    feed = SimpleNamespace(partition=0)
    asyncio.run(loop_over([(feed, None)]))
    asyncio.run(loop_over([(feed, []), (feed, None), (feed, None)]))  # coalesced behind one

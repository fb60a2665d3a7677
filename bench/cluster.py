"""The cluster tier on a real nats-server: hub throughput with 1 and 2 members, and the time
from a node's publish to the hub's alert, beside `scan --events` over the same events.

`python -m bench.cluster [--events N] [--latency-samples N]`

1. Throughput. `--events` (20 000) events of 32 nodes and 200 users (file reads of a
   protected model inside and outside jobs, sockets, processes; a few per cent alert) are
   published to a fresh single-server JetStream, then 1 (and then 2) `hpcsec hub` members
   start; the clock runs from the moment every member is ready to the moment their
   consumers have nothing pending. Peer: the same events through `hpcsec scan --events`,
   in this process (no NATS, no JSON over the network, one engine).
2. Latency. With one member running, one miner event at a time is published, 0.2 s apart;
   the time until its alert line is in the member's JSONL output, p50 and p99.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import orjson

from hpcsec.detector.cli.main import main as hpcsec_main
from hpcsec.detector.cluster.consumer import durable_name
from hpcsec.detector.cluster.forwarder import BaseRuleFilter
from hpcsec.detector.cluster.partition import PARTITIONS
from hpcsec.detector.cluster.publisher import Publisher, encode
from hpcsec.detector.cluster.streams import (
    EVENTS_STREAM,
    StreamSettings,
    connect,
    ensure_events_stream,
)
from hpcsec.detector.config.site import SiteConfig
from hpcsec.detector.core.schema import parse_time
from hpcsec.detector.engine.loader import load_rules
from tests.cluster.conftest import HubProcess, wait_for
from tests.cluster.harness import NATS_SERVER, NatsServer
from tests.cluster.scenario import node_events

START = datetime(2026, 12, 1, 2, 0, tzinfo=UTC)
IDLE_S = 0.5  # the hub's idle wait before it reports progress (detector/cluster/hub.py)


def make_events(count: int, seed: int = 7) -> list[dict]:
    rng = random.Random(seed)
    events = []
    for i in range(count):
        at = (START + timedelta(milliseconds=50 * i)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        host, user = f"gpu-{rng.randrange(32):03d}", f"user{rng.randrange(200):03d}"
        base = {"@timestamp": at, "host.name": host, "user.name": user, "process.pid": 1000 + i}
        kind = rng.random()
        if kind < 0.6:
            in_job = rng.random() < 0.97
            events.append(
                base
                | {
                    "event.category": "file_access",
                    "event.action": "read",
                    "file.path": f"/lustre/models/m{rng.randrange(4)}/shard-{i % 100}.bin",
                    "hpcsec.asset.name": f"m{rng.randrange(4)}",
                    "hpcsec.asset.kind": "model",
                    "slurm.node.user_has_job": in_job,
                }
                | ({"slurm.job.id": str(5000 + rng.randrange(50))} if in_job else {})
            )
        elif kind < 0.85:
            events.append(
                base
                | {
                    "event.category": "network_socket",
                    "network.state": "ESTABLISHED",
                    "destination.ip": f"10.0.{rng.randrange(4)}.{rng.randrange(250)}",
                    "destination.port": 29500,
                    "destination.is_job_node": True,
                }
            )
        else:
            events.append(base | {"event.category": "process", "process.name": "python3"})
    return events


async def publish(url: str, events: list[dict]) -> float:
    nc = await connect([url], reconnect=False)
    try:
        js = nc.jetstream()
        await ensure_events_stream(js, StreamSettings())
        began = time.perf_counter()
        report = await Publisher(js).publish([dict(e) for e in events])
        assert report.failed == 0, report.last_error
        return time.perf_counter() - began
    finally:
        await nc.close()


async def pending(url: str) -> int:
    nc = await connect([url], reconnect=False)
    try:
        js = nc.jetstream()
        total = 0
        for p in range(PARTITIONS):
            with contextlib.suppress(Exception):
                total += (await js.consumer_info(EVENTS_STREAM, durable_name(p))).num_pending
        return total
    finally:
        await nc.close()


def evaluated(hubs: list[HubProcess]) -> int:
    """Events the members say they evaluated (their last progress line)."""
    total = 0
    for hub in hubs:
        counts = re.findall(r"hub: (\d+) events,", hub.log.read_text(errors="replace"))
        total += int(counts[-1]) if counts else 0
    return total


def hub_throughput(tmp: Path, events: list[dict], members: int) -> float:
    server = NatsServer(tmp / f"nats-{members}").start()
    hubs: list[HubProcess] = []
    try:
        asyncio.run(publish(server.url, events))
        hubs = [
            HubProcess(tmp, [server.url], f"{i}/{members}", f"bench-{members}-{i}")
            for i in range(members)
        ]
        for hub in hubs:
            hub.start()
        began = time.perf_counter()
        wait_for(lambda: asyncio.run(pending(server.url)) == 0, 600, "the hubs to fetch all")
        wait_for(lambda: evaluated(hubs) >= len(events), 600, "the hubs to evaluate all")
        # a member reports once it has been idle for IDLE_S: that wait is not work
        return len(events) / (time.perf_counter() - began - IDLE_S)
    finally:
        for hub in hubs:
            hub.cleanup()
        server.stop()


def timed_scan(path: Path) -> float:
    began = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        hpcsec_main(["scan", "--events", str(path), "--format", "jsonl"])
    return time.perf_counter() - began


def scan_peer(tmp: Path, events: list[dict]) -> float:
    """`scan --events` over the same events, less the time of a scan of no events (loading
    and compiling the rules: the hub does that before it counts as ready)."""
    path, empty = tmp / "events.jsonl", tmp / "empty.jsonl"
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    empty.write_bytes(b"")
    timed_scan(empty)  # warm the imports
    return len(events) / (timed_scan(path) - timed_scan(empty))


def latency(tmp: Path, samples: int) -> list[float]:
    server = NatsServer(tmp / "nats-latency").start()
    hub = HubProcess(tmp, [server.url], "0/1", "bench-latency")
    try:
        hub.start()
        waits = []
        for i in range(samples):
            at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
            miner = {
                "event.category": "process",
                "@timestamp": at,
                "host.name": f"lat-{i:04d}",
                "process.pid": 4000 + i,
                "process.name": "xmrig",
                "user.name": "nobody",
            }
            before = len(hub.alerts())
            began = time.perf_counter()
            asyncio.run(publish(server.url, [miner]))
            while len(hub.alerts()) <= before:
                if time.perf_counter() - began > 30:
                    raise AssertionError("no alert within 30 s")
                time.sleep(0.002)
            waits.append(time.perf_counter() - began)
            time.sleep(0.2)
        return waits
    finally:
        hub.cleanup()
        server.stop()


def wire_bytes_per_node_minute() -> tuple[float, float, int]:
    """What a node of the scenarios sends with edge filtering (the agent's tap) and would send
    without it: message bytes (subject, body, Nats-Msg-Id header) per node per minute of
    event time, over the attack and benign fleets; and the nodes counted."""
    chooser = BaseRuleFilter(load_rules(None, with_tests=False), SiteConfig().placeholders())
    kept = everything = minutes = 0.0
    nodes = 0
    for scenario in ("attack", "benign"):
        for events in node_events(scenario).values():
            times = [parse_time(e["@timestamp"]).timestamp() for e in events]
            minutes += max((max(times) - min(times)) / 60, 1.0)
            size = [len(s) + len(b) + len(i) + 40 for s, b, i in map(encode, map(dict, events))]
            everything += sum(size)
            chosen = {id(e) for e in chooser.select(events)}
            kept += sum(n for e, n in zip(events, size, strict=True) if id(e) in chosen)
            nodes += 1
    return kept / minutes, everything / minutes, nodes


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cluster")
    parser.add_argument("--events", type=int, default=20_000)
    parser.add_argument("--latency-samples", type=int, default=50)
    args = parser.parse_args(argv)
    if NATS_SERVER is None:
        print("bench.cluster: nats-server is not installed (make system-deps)", file=sys.stderr)
        return 0
    events = make_events(args.events)
    with tempfile.TemporaryDirectory(prefix="hpcsec-bench-cluster-") as tmp_dir:
        tmp = Path(tmp_dir)
        peer = scan_peer(tmp, events)
        one = hub_throughput(tmp, events, 1)
        two = hub_throughput(tmp, events, 2)
        waits = sorted(latency(tmp, args.latency_samples))
    filtered, unfiltered, nodes = wire_bytes_per_node_minute()
    p99 = waits[min(len(waits) - 1, int(len(waits) * 0.99))]
    result = {
        "events": len(events),
        "hub_1_member_events_per_s": round(one),
        "hub_2_members_events_per_s": round(two),
        "peer_scan_events_per_s": round(peer),
        "publish_to_alert_p50_ms": round(statistics.median(waits) * 1000, 1),
        "publish_to_alert_p99_ms": round(p99 * 1000, 1),
        "wire_bytes_per_node_minute_edge_filtered": round(filtered),
        "wire_bytes_per_node_minute_unfiltered": round(unfiltered),
        "scenario_nodes": nodes,
        "cpus": os.cpu_count(),
    }
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

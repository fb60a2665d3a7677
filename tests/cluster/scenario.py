"""The multi-node fixtures (fixtures/cluster/) and what the hub must make of them."""

from __future__ import annotations

from pathlib import Path

import orjson

FIXTURES = Path(__file__).parents[2] / "fixtures" / "cluster"
JOB_EXFIL = "9eb2d5dd-c7fe-4055-9ffa-2c0a0f1713f0"
SPREAD_READ = "24831ec2-982c-4d0d-ab21-24443a792920"
FLEET_FIRMWARE = "e3ff7ed2-77b8-4ff6-914c-24466dfbb362"
MINER_SPREAD = "f624b437-9dc3-4e73-bcba-aa463dedf3c9"
SERVICE_SPREAD = "0c5b7a2e-4f1d-4e8b-9a37-6d2c1e5f8b90"
CLUSTER_RULES = {JOB_EXFIL, SPREAD_READ, FLEET_FIRMWARE, MINER_SPREAD, SERVICE_SPREAD}


def node_files(scenario: str) -> dict[str, Path]:
    return {p.stem: p for p in sorted((FIXTURES / scenario).glob("*.jsonl"))}


def node_events(scenario: str) -> dict[str, list[dict]]:
    return {
        host: [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
        for host, path in node_files(scenario).items()
    }


def fleet_events(scenario: str) -> list[tuple[str, dict]]:
    """(host, event) of every node, merged by time: what the hub gets from a live fleet."""
    merged = [(h, e) for h, events in node_events(scenario).items() for e in events]
    return sorted(merged, key=lambda item: item[1]["@timestamp"])


def interleaved_events(scenario: str, behind: str | None = None) -> list[tuple[str, dict]]:
    """(host, event) as nodes publishing at once deliver them: each node in its own order,
    the nodes taken in turn (not merged by time); `behind`: that node publishes only after
    all the others are done (a node whose link was down)."""
    nodes = node_events(scenario)
    late = nodes.pop(behind) if behind else []
    out: list[tuple[str, dict]] = []
    longest = max(len(events) for events in nodes.values())
    for i in range(longest):
        out += [(host, events[i]) for host, events in nodes.items() if i < len(events)]
    return out + [(behind, e) for e in late] if behind else out


def fleet_batches(scenario: str, size: int) -> list[list[tuple[str, dict]]]:
    merged = fleet_events(scenario)
    return [merged[i : i + size] for i in range(0, len(merged), size)]


def clock_event(host: str, at: str) -> dict:
    """A sensor's plain status record at `at`: the fleet's time moving on, matching nothing."""
    return {
        "@timestamp": at,
        "event.kind": "state",
        "event.category": "sensor_status",
        "event.action": "ok",
        "host.name": host,
        "hpcsec.sensor": "process",
    }


def write_fleet_file(
    scenario: str, path: Path, behind: str | None = None, then: str | None = None
) -> Path:
    """The scenario's events as one file, nodes interleaved in their own order; `then`: a
    last event at that time (the rest of the fleet moved on)."""
    events = [e for _, e in interleaved_events(scenario, behind)]
    if then is not None:
        events.append(clock_event("gpu-101", then))
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    return path

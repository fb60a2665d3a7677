"""A hub whose spool disk is full (a real tmpfs) while the webhook receiver is down: the alerts
it holds in memory are not recorded as delivered and their events are not acknowledged, so
neither a restart nor a freed disk loses one, and none is sent twice."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from hpcsec.detector.cli.main import main
from hpcsec.detector.cluster.partition import partition_of
from tests.cluster.conftest import QUICK_LATENESS_S, HubProcess, wait_for
from tests.cluster.harness import NatsServer, acked_events
from tests.cluster.scenario import CLUSTER_RULES, clock_event, write_fleet_file
from tests.detector.runtime.agent_harness import SECRET, Receiver
from tests.tinydisk import TinyDisk, tiny_disk

UNSPOOLED = "could not be spooled, sent directly"  # the sink's warning, fixed hub or not
PAUSED = "events are not acknowledged and fetching pauses"
RESUMED = "acknowledging and fetching resume"
LATENESS_S = 3600  # every node's events in time, whatever the order they come in
# The scenario ends 02:32; past it by the lateness and the longest correlation window (2 h),
# the fleet's time hands every match on and lets every event be acknowledged.
FLEET_MOVED_ON = "2026-12-01T06:00:00Z"
MINER = {"@timestamp": "2026-12-01T05:00:00Z", "event.category": "process", "process.name": "xmrig"}


@pytest.fixture
def disk(tmp_path: Path) -> Iterator[TinyDisk]:
    with tiny_disk(tmp_path / "disk") as d:
        yield d


@pytest.fixture
def receiver_port() -> int:
    """A port where nothing listens yet: the receiver is down until the test starts it."""
    probe = Receiver()
    probe.stop()
    return probe.port


def webhook_hub(
    tmp: Path,
    nats: NatsServer,
    disk: TinyDisk,
    port: int,
    log: str,
    lateness_s: float = QUICK_LATENESS_S,
) -> HubProcess:
    """A hub sending to a webhook on `port` (and to its file output), spooled on `disk`;
    a restart takes the same spool and a fresh `log`."""
    secret = tmp / "webhook-secret"
    secret.write_bytes(SECRET + b"\n")
    secret.chmod(0o600)
    return HubProcess(
        tmp,
        [nats.url],
        log_name=log,
        output=f"http://127.0.0.1:{port}/hook",
        spool=disk.path / "spool",
        secret_file=secret,
        lateness_s=lateness_s,
    )


def publish_attack(url: str, tmp: Path) -> None:
    """The attack scenario, nodes interleaved, then the fleet's time moving on."""
    events = write_fleet_file("attack", tmp / "fleet.jsonl", then=FLEET_MOVED_ON)
    assert main(["publish", "--nats", url, "--events", str(events)]) == 0


def publish(url: str, events: list[dict], path: Path) -> None:
    path.write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    assert main(["publish", "--nats", url, "--events", str(path)]) == 0


def every_alert(hub: HubProcess) -> set[str]:
    """The ids of every alert the hub made, from its file output (written on any disk)."""
    return {a["alert.id"] for a in hub.alerts()}


def made_them_all(hub: HubProcess) -> bool:
    return {a["rule.id"] for a in hub.alerts()} >= CLUSTER_RULES


def restarted(
    tmp_path: Path,
    nats_server: NatsServer,
    disk: TinyDisk,
    receiver: Receiver,
    hubs: list[HubProcess],
    made_first: set[str],
    lateness_s: float = QUICK_LATENESS_S,
) -> HubProcess:
    """A second hub on the same spool, the receiver up: the first run's alerts reach it."""
    again = webhook_hub(tmp_path, nats_server, disk, receiver.port, "again", lateness_s)
    hubs.append(again.start())
    wait_for(lambda: made_first <= set(receiver.received), 30, "the first run's alerts")
    return again


def test_alerts_held_in_memory_are_made_again_and_sent_after_a_restart(
    nats_server: NatsServer,
    hubs: list[HubProcess],
    disk: TinyDisk,
    receiver_port: int,
    tmp_path: Path,
) -> None:
    """Correlations too: the restart replays the events and raises the same alerts again."""
    first = webhook_hub(tmp_path, nats_server, disk, receiver_port, "first", LATENESS_S).start()
    hubs.append(first)
    disk.fill()
    publish_attack(nats_server.url, tmp_path)
    first.wait_log(UNSPOOLED, 60)
    assert first.terminate() == 0
    made_first = every_alert(first)
    assert made_first
    disk.free()
    receiver = Receiver(receiver_port)
    try:
        again = restarted(tmp_path, nats_server, disk, receiver, hubs, made_first, LATENESS_S)
        wait_for(lambda: made_them_all(again), 30, "every alert of the scenario")
        wait_for(lambda: every_alert(again) <= set(receiver.received), 30, "their delivery")
        assert again.terminate() == 0
    finally:
        receiver.stop()
    assert set(Counter(receiver.received).values()) == {1}
    assert receiver.bad_signatures == 0
    log = first.log.read_text()
    assert PAUSED in log
    assert "their events stay unacknowledged, the next start evaluates them again" in log
    assert "left in the spool for the next start" not in log  # nothing got to disk


def test_late_events_are_not_acknowledged_while_their_alerts_are_only_in_memory(
    nats_server: NatsServer,
    hubs: list[HubProcess],
    disk: TinyDisk,
    receiver_port: int,
    tmp_path: Path,
) -> None:
    """Miners a node publishes hours behind the fleet: no window needs their events any more,
    so the hub would acknowledge each as soon as it is evaluated, before its alert is safe."""
    first = webhook_hub(tmp_path, nats_server, disk, receiver_port, "first").start()
    hubs.append(first)
    fleet = clock_event("gpu-101", "2026-12-01T12:00:00Z")
    assert partition_of(fleet) != partition_of(MINER)  # else it holds the miners' acks back
    publish(nats_server.url, [fleet], tmp_path / "fleet.jsonl")
    first.wait_log("hub: 1 events,", 30)
    disk.fill()
    miners = [{**MINER, "host.name": f"gpu-{i}", "process.pid": 10 + i} for i in range(5)]
    publish(nats_server.url, miners, tmp_path / "miners.jsonl")
    wait_for(lambda: len(every_alert(first)) >= 5, 30, "an alert for each miner")
    first.wait_log(UNSPOOLED, 30)
    assert first.terminate() == 0
    assert acked_events(nats_server.url) == 0
    made_first = every_alert(first)
    disk.free()
    receiver = Receiver(receiver_port)
    try:
        again = restarted(tmp_path, nats_server, disk, receiver, hubs, made_first)
        wait_for(lambda: acked_events(nats_server.url) > 0, 30, "the miners' events acknowledged")
        assert again.terminate() == 0
    finally:
        receiver.stop()
    assert set(Counter(receiver.received).values()) == {1}


def test_a_running_hub_resumes_when_the_disk_is_freed(
    nats_server: NatsServer,
    hubs: list[HubProcess],
    disk: TinyDisk,
    receiver_port: int,
    tmp_path: Path,
) -> None:
    hub = webhook_hub(tmp_path, nats_server, disk, receiver_port, "hub", LATENESS_S).start()
    hubs.append(hub)
    disk.fill()
    publish_attack(nats_server.url, tmp_path)
    hub.wait_log(PAUSED, 60)
    assert acked_events(nats_server.url) == 0  # held: a crash now replays every event
    disk.free()
    hub.wait_log(RESUMED, 30)  # spooled within about a second, the receiver still down
    receiver = Receiver(receiver_port)
    try:
        wait_for(lambda: made_them_all(hub), 30, "every alert of the scenario")
        wait_for(lambda: every_alert(hub) <= set(receiver.received), 30, "their delivery")
        wait_for(lambda: acked_events(nats_server.url) > 0, 30, "acknowledgements")
        assert hub.terminate() == 0
    finally:
        receiver.stop()
    assert set(Counter(receiver.received).values()) == {1}
    assert "alert(s) could not be spooled and are not delivered" not in hub.log.read_text()

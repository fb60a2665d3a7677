"""The NATS users of examples/nats-node-permissions.conf, as shipped (only the node's host
name substituted), on a real nats-server: the hub's user sets up the streams and runs the
hub; a node's user publishes its own events and alerts and nothing else. It cannot speak for
another host, delete, purge or reshape a stream, read the stream, or listen on the inboxes
where the hub's pull consumers deliver every node's events."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import orjson
import pytest

from hpcsec.detector.cli.main import main
from hpcsec.detector.cluster.agent_tap import NatsTap
from hpcsec.detector.cluster.streams import (
    EVENTS_STREAM,
    NODE_ALERTS_STREAM,
    NODE_INBOX_PREFIX,
    StreamSettings,
    connect,
    events_config,
    refusal,
)
from tests.cluster.conftest import HubProcess, wait_for
from tests.cluster.harness import NATS_SERVER, NatsServer, acked_events
from tests.cluster.scenario import clock_event, node_files

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "nats-node-permissions.conf"
HOST = "gpu-101"  # a node of the attack scenario
NODE = (HOST, f"CHANGE-ME-{HOST}")
HUB = ("hpcsec-hub", "CHANGE-ME-hub")
MOVED_ON = "2026-12-01T12:00:00Z"  # hours after the scenario: no window needs it
HUB_SETTINGS = StreamSettings(max_age_s=6 * 3600.0)
REFUSED_S = 2.0  # a refused request gets no answer: how long each one here waits


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[NatsServer]:
    if NATS_SERVER is None:
        pytest.skip("nats-server is not installed (make system-deps)")
    users = EXAMPLE.read_text().replace("gpu-001", HOST)
    server = NatsServer(tmp_path / "nats", extra_config=users).start()
    try:
        yield server
    finally:
        server.stop()


def violations(server: NatsServer, user: str) -> list[str]:
    log = (server.root / f"{server.name}.log").read_text(errors="replace")
    return [line for line in log.splitlines() if f'Violation - User "{user}"' in line]


def publish(url: str, events: Path, *more: str) -> int:
    return main(["publish", "--nats", url, "--events", str(events), *more])


async def _subjects(url: str, stream: str) -> dict[str, int]:
    """Messages per subject in `stream`: what the hub's user may ask (it cannot read them)."""
    nc = await connect([url], reconnect=False)
    try:
        info = await nc.jetstream().stream_info(stream, subjects_filter=">")
        return dict(info.state.subjects or {})
    finally:
        await nc.close()


def subjects(url: str, stream: str = EVENTS_STREAM) -> dict[str, int]:
    return asyncio.run(_subjects(url, stream))


def _alert(ident: str) -> dict:
    return {"alert.id": ident, "rule.id": "r1", "rule.level": "high", "host.name": HOST}


def test_the_hub_sets_up_the_streams_and_the_node_publishes_into_them(
    secured: NatsServer, hubs: list[HubProcess], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    node, hub_url = secured.url_for(*NODE), secured.url_for(*HUB)
    events = node_files("attack")[HOST]
    # before the hub: the node may not create the stream, and says who does
    assert publish(node, events) == 2
    err = capsys.readouterr().err
    assert "stream HPCSEC_EVENTS does not exist and this node's NATS user may not create it" in err
    assert "the hub creates the streams" in err and "Traceback" not in err
    hub = HubProcess(tmp_path, [hub_url]).start()  # both streams, consumers, bucket
    hubs.append(hub)
    assert publish(node, events) == 0
    read = len(events.read_bytes().splitlines())
    hub.wait_log(f"hub: {read} events,", 30)
    stored = subjects(hub_url)
    assert sum(stored.values()) == read and all(s.endswith(f".{HOST}") for s in stored)
    later = tmp_path / "later.jsonl"  # the node's time moves on: the hub acknowledges
    later.write_bytes(orjson.dumps(clock_event(HOST, MOVED_ON)) + b"\n")
    assert publish(node, later) == 0
    wait_for(lambda: acked_events(hub_url) > 0, 30, "the hub's acknowledgements")
    tap = NatsTap([node], tmp_path / "node-spool", 1024**2)  # the agent's alerts, same user
    try:
        tap.alerts([_alert("a1")])
        wait_for(lambda: tap.pending() == 0, 30, "the alert to be published")
    finally:
        assert tap.close(5) == 0
    assert subjects(hub_url, NODE_ALERTS_STREAM) == {f"hpcsec.alerts.{HOST}": 1}
    # nothing either needed was refused: only the node's try at creating the stream
    assert violations(secured, HUB[0]) == []
    refused = violations(secured, HOST)
    assert [v for v in refused if f"STREAM.CREATE.{EVENTS_STREAM}" not in v] == []


def test_a_node_cannot_publish_for_another_host(
    secured: NatsServer, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    asyncio.run(_create_events_stream(secured.url_for(*HUB)))
    events = node_files("attack")[HOST]
    assert publish(secured.url_for(*NODE), events, "--host-name", "gpu-102") == 2
    err = capsys.readouterr().err
    assert "not acknowledged by JetStream (permissions violation for publish to" in err
    assert '.gpu-102")' in err
    assert subjects(secured.url_for(*HUB)) == {}


async def _create_events_stream(url: str) -> None:
    """The stream as a hub configured otherwise than the defaults set it up: a node uses it as
    it is (it tried to bring the limits to its own defaults, which its user may not)."""
    nc = await connect([url], reconnect=False)
    try:
        await nc.jetstream().add_stream(events_config(HUB_SETTINGS, 1))
    finally:
        await nc.close()


def test_a_node_cannot_delete_purge_reshape_or_read_the_stream(secured: NatsServer) -> None:
    asyncio.run(_create_events_stream(secured.url_for(*HUB)))
    events = node_files("attack")[HOST]
    assert publish(secured.url_for(*NODE), events) == 0
    kept = subjects(secured.url_for(*HUB))
    assert asyncio.run(_max_age(secured.url_for(*HUB))) == HUB_SETTINGS.max_age_s
    refused = asyncio.run(_try_everything_else(secured.url_for(*NODE)))
    assert refused == {
        "delete": True,
        "purge": True,
        "update": True,
        "read": True,
        "hub inbox": True,
    }
    assert subjects(secured.url_for(*HUB)) == kept
    assert asyncio.run(_max_age(secured.url_for(*HUB))) == HUB_SETTINGS.max_age_s


async def _max_age(url: str) -> float | None:
    nc = await connect([url], reconnect=False)
    try:
        return (await nc.jetstream().stream_info(EVENTS_STREAM)).config.max_age
    finally:
        await nc.close()


async def _try_everything_else(url: str) -> dict[str, bool]:
    """What the node's user tried, refused or not (a refused request times out)."""
    nc = await connect([url], reconnect=False, inbox_prefix=NODE_INBOX_PREFIX)
    js = nc.jetstream(timeout=REFUSED_S)
    shorter = events_config(StreamSettings(max_age_s=60.0), 1)
    attempts: dict[str, tuple[Callable[[], Awaitable[object]], str]] = {
        "delete": (lambda: js.delete_stream(EVENTS_STREAM), "DELETE"),
        "purge": (lambda: js.purge_stream(EVENTS_STREAM), "PURGE"),
        "update": (lambda: js.update_stream(shorter), "UPDATE"),
        "read": (lambda: js.get_msg(EVENTS_STREAM, 1), "MSG.GET"),  # another node's event
    }
    refused = {}
    try:
        for what, (call, verb) in attempts.items():
            subject = f"$JS.API.STREAM.{verb}.{EVENTS_STREAM}"
            try:
                await call()
                refused[what] = False
            except TimeoutError:
                refused[what] = refusal(nc, subject) is not None
        # the hub's fetches are answered on _INBOX: every node's events would pass there
        await nc.subscribe("_INBOX.>")
        await nc.flush()
        deadline = asyncio.get_running_loop().time() + REFUSED_S
        while refusal(nc, "_INBOX.>") is None and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        refused["hub inbox"] = refusal(nc, "_INBOX.>") is not None
        return refused
    finally:
        await nc.close()


def test_the_example_is_the_one_the_docs_point_to() -> None:
    docs = (EXAMPLE.parents[1] / "docs" / "cluster.md").read_text()
    assert "examples/nats-node-permissions.conf" in docs
    body = EXAMPLE.read_text()
    assert f'"{NODE_INBOX_PREFIX}.>"' in body and "CHANGE-ME" in body


HALF_HUB = """
authorization {
  users = [
    { user: "half", password: "half",
      permissions: { publish: ["$JS.API.INFO", "$JS.API.STREAM.INFO.>"], subscribe: ["_INBOX.>"] } }
  ]
}
"""


def test_a_hub_without_the_hubs_permissions_says_what_was_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A refused request only times out: the hub's error names the server's refusal (here:
    creating the events stream), not a bare `nats: timeout`; a node's user is refused at
    once, by name."""
    if NATS_SERVER is None:
        pytest.skip("nats-server is not installed (make system-deps)")
    users = EXAMPLE.read_text().replace("gpu-001", HOST)
    output = ["--output", f"file://{tmp_path / 'a.jsonl'}"]
    server = NatsServer(tmp_path / "nats", extra_config=users).start()
    try:
        assert main(["hub", "--nats", server.url_for(*NODE), *output]) == 2
        assert "permissions violation" in capsys.readouterr().err
    finally:
        server.stop()
    server = NatsServer(tmp_path / "half", extra_config=HALF_HUB).start()
    try:
        assert main(["hub", "--nats", server.url_for("half", "half"), *output]) == 2
    finally:
        server.stop()
    err = capsys.readouterr().err
    assert "cannot set up the hub's consumers" in err
    assert "permissions violation for publish" in err and "stream.create" in err
    assert "Traceback" not in err

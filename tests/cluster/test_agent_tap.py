"""`hpcsec agent --nats`: the agent's alerts and edge-filtered events reach JetStream, through
a spool on disk while NATS is down, each stored once (Nats-Msg-Id), against a real
nats-server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from hpcsec.detector.cli import main as cli
from hpcsec.detector.cluster.agent_tap import NatsTap
from hpcsec.detector.cluster.forwarder import BaseRuleFilter
from hpcsec.detector.cluster.msgid import message_id, message_key
from hpcsec.detector.cluster.streams import EVENTS_STREAM, NODE_ALERTS_STREAM, connect
from hpcsec.detector.config.site import SiteConfig
from hpcsec.detector.engine.loader import load_rules
from hpcsec.detector.runtime.agent import Agent, AgentSettings
from hpcsec.detector.runtime.pipeline import SourceBatch
from tests.cluster.conftest import wait_for
from tests.cluster.harness import NATS_SERVER, NatsServer
from tests.cluster.scenario import fleet_events
from tests.detector.runtime.agent_harness import Node

pytestmark = pytest.mark.skipif(NATS_SERVER is None, reason="nats-server is not installed")
MAX_SPOOL = 64 * 1024**2


async def _messages(url: str, stream: str) -> list[tuple[str, dict]]:
    """(Nats-Msg-Id, body) of every message in `stream`."""
    nc = await connect([url], reconnect=False)
    try:
        js = nc.jetstream()
        last = (await js.stream_info(stream)).state.last_seq
        out = []
        for seq in range(1, last + 1):
            msg = await js.get_msg(stream, seq)
            out.append(((msg.headers or {}).get("Nats-Msg-Id", ""), orjson.loads(msg.data)))
        return out
    finally:
        await nc.close()


def messages(url: str, stream: str) -> list[tuple[str, dict]]:
    return asyncio.run(_messages(url, stream))


def _rules_and_events() -> tuple[object, dict, list[dict]]:
    config = SiteConfig()
    return (
        load_rules(None, with_tests=False),
        config.placeholders(),
        [e for _, e in fleet_events("attack")],
    )


def _key(event: dict) -> tuple:
    return tuple(sorted((k, str(v)) for k, v in event.items() if not k.startswith("hpcsec.")))


def assert_stored_once(stored: list[tuple[str, dict]], wanted: list[dict]) -> None:
    """Each wanted event in the stream exactly once, under one message id each."""
    assert len({i for i, _ in stored}) == len(stored)
    assert sorted(_key(body) for _, body in stored) == sorted(_key(e) for e in wanted)


def _alert(host: str, ident: str) -> dict:
    return {"alert.id": ident, "rule.id": "r1", "rule.level": "high", "host.name": host}


def test_agent_publishes_its_alerts_and_the_events_of_cluster_base_rules(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    out = tmp_path / "alerts.jsonl"
    tap = NatsTap([nats_server.url], tmp_path / "spool", MAX_SPOOL)
    agent = Agent(
        AgentSettings(outputs=(f"file://{out}",), host_name="gpu-101", drain_timeout_s=20),
        tap=tap,
    )
    ruleset, placeholders, events = _rules_and_events()
    agent.queue.put(SourceBatch(events, None), "replay")
    agent._process(agent.queue.get(100_000, 0))
    assert agent.shutdown() == 0
    sent = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert sent, "the attack scenario raises node alerts"
    published = messages(nats_server.url, NODE_ALERTS_STREAM)
    # every alert sent to the outputs, once, under an id keyed by this node (another node
    # cannot take it first and have this one's dropped as a duplicate)
    key = message_key(tmp_path / "spool")
    assert sorted(i for i, _ in published) == sorted(message_id(key, a["alert.id"]) for a in sent)
    assert all(message_id(key, body["alert.id"]) == i for i, body in published)
    assert not {i for i, _ in published} & {a["alert.id"] for a in sent}
    wanted = BaseRuleFilter(ruleset, placeholders).select(events)  # type: ignore[arg-type]
    assert 0 < len(wanted) < len(events)  # edge filtering: matches, not all telemetry
    stored = messages(nats_server.url, EVENTS_STREAM)
    assert_stored_once(stored, wanted)


def test_nats_down_then_up_nothing_lost_nothing_duplicated(tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "nats")  # port chosen, not started: NATS is down
    ruleset, placeholders, events = _rules_and_events()
    half = len(events) // 2
    tap = NatsTap([server.url], tmp_path / "spool", MAX_SPOOL)
    tap.rules(ruleset, placeholders)  # type: ignore[arg-type]
    tap.events(events[:half])
    tap.alerts([_alert("gpu-101", "a1")])
    wait_for(lambda: tap.spool.depth() > 1, 20, "the spool on disk to take them")
    left = tap.close(0)  # the agent stops while NATS is down: kept on disk
    assert left > 1
    server.start()
    try:
        tap = NatsTap([server.url], tmp_path / "spool", MAX_SPOOL)  # the next start
        tap.rules(ruleset, placeholders)  # type: ignore[arg-type]
        tap.events(events)  # the first half again (a resend), and the rest
        tap.alerts([_alert("gpu-101", "a1"), _alert("gpu-102", "a2")])
        wait_for(lambda: tap.pending() == 0, 30, "the spool to drain")
        assert tap.close(5) == 0
        wanted = BaseRuleFilter(ruleset, placeholders).select(events)  # type: ignore[arg-type]
        stored = messages(server.url, EVENTS_STREAM)
        assert_stored_once(stored, wanted)
        alerts = messages(server.url, NODE_ALERTS_STREAM)
        key = message_key(tmp_path / "spool")  # the same across the restart: a1 is stored once
        assert sorted(i for i, _ in alerts) == sorted(message_id(key, a) for a in ("a1", "a2"))
        assert sorted(body["alert.id"] for _, body in alerts) == ["a1", "a2"]
        assert {body["host.name"] for _, body in alerts} == {"gpu-101", "gpu-102"}
        assert tap.take_health() == []
    finally:
        server.stop()


def test_spool_files_are_private(tmp_path: Path) -> None:
    tap = NatsTap(["nats://127.0.0.1:1"], tmp_path / "spool", MAX_SPOOL)
    try:
        tap.alerts([_alert("gpu-101", "a1")])
        wait_for(lambda: tap.spool.depth() == 1, 20, "the alert in the spool")
    finally:
        tap.close(0)
    for path in (tmp_path / "spool").rglob("*"):
        assert path.stat().st_mode & 0o077 == 0, path


def test_what_does_not_fit_is_reported_as_dropped(tmp_path: Path) -> None:
    tap = NatsTap(["nats://127.0.0.1:1"], tmp_path / "spool", max_bytes=300)  # NATS down
    try:
        big = {**_alert("gpu-101", "a-big"), "message": "x" * 1000}
        tap.alerts([big])
        health: list = []
        wait_for(lambda: bool(health.extend(tap.take_health()) or health), 20, "the drop")
        assert health == [
            (
                "cluster",
                "dropped",
                "1 events or alerts not published to NATS: the cluster queue or spool was full",
                {"hpcsec.dropped": 1},
            )
        ]
    finally:
        tap.close(0)


def test_nats_without_a_spool_directory_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "site.yml"
    config.write_text("cluster: {nats: ['nats://127.0.0.1:1']}\n")
    assert cli.main(["agent", "--config", str(config)]) == 2
    assert capsys.readouterr().err == (
        "hpcsec: error: publishing to NATS needs a spool directory "
        "(--spool or spool.dir in the config)\n"
    )


def test_hpcsec_agent_with_nats_publishes_a_miner_alert_and_its_event(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    node = Node(tmp_path / "node")
    node.start_process(4242, "xmrig", 1)
    out = tmp_path / "alerts.jsonl"
    args = ["agent", "--config", str(node.config), "--sensor", "process"]
    args += ["--procfs-root", str(node.proc), "--etc-root", str(node.etc), "--interval", "1"]
    args += ["--once-for", "3", "--metrics-address", "127.0.0.1:0"]
    args += ["--spool", str(tmp_path / "spool"), "--output", f"file://{out}"]
    assert cli.main([*args, "--nats", nats_server.url]) == 0
    sent = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert any(a["process.name"] == "xmrig" for a in sent if "process.name" in a)
    published = messages(nats_server.url, NODE_ALERTS_STREAM)
    assert sorted(body["alert.id"] for _, body in published) == sorted(a["alert.id"] for a in sent)
    stored = messages(nats_server.url, EVENTS_STREAM)
    assert stored and {body["process.name"] for _, body in stored} == {"xmrig"}

"""The agent-side forwarder: spools while NATS is down, bounded, sends once it is up."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from hpcsec.detector.cluster.forwarder import BaseRuleFilter, EventForwarder
from hpcsec.detector.cluster.streams import EVENTS_STREAM, connect
from hpcsec.detector.config.site import SiteConfig
from hpcsec.detector.engine.loader import load_rules
from tests.cluster.conftest import wait_for
from tests.cluster.harness import NATS_SERVER, NatsServer
from tests.cluster.scenario import fleet_events


async def stored(url: str) -> int:
    nc = await connect([url], reconnect=False)
    try:
        return int((await nc.jetstream().stream_info(EVENTS_STREAM)).state.messages)
    finally:
        await nc.close()


@pytest.mark.skipif(NATS_SERVER is None, reason="nats-server is not installed")
def test_spools_while_nats_is_down_then_sends(tmp_path: Path) -> None:
    server = NatsServer(tmp_path / "nats")  # its port is chosen, the server not started yet
    events = [e for _, e in fleet_events("attack")]
    forwarder = EventForwarder([server.url])
    try:
        forwarder.submit(events)
        assert forwarder.pending() == len(events)
        server.start()
        wait_for(lambda: forwarder.pending() == 0, 30, "the spool to drain")
        assert asyncio.run(stored(server.url)) == len(events)
    finally:
        assert forwarder.close(5) == 0
        server.stop()
    assert forwarder.stats.dropped == 0 and forwarder.stats.published == len(events)


def test_spool_is_bounded_oldest_dropped() -> None:
    forwarder = EventForwarder(["nats://127.0.0.1:1"], max_bytes=2000)
    try:
        forwarder.submit([e for _, e in fleet_events("attack")])
        assert 0 < forwarder.pending() < len(fleet_events("attack"))
        assert forwarder.stats.dropped > 0
    finally:
        forwarder.close(0)


def test_only_events_of_correlation_base_rules_are_selected() -> None:
    config = SiteConfig()
    chooser = BaseRuleFilter(load_rules(None, with_tests=False), config.placeholders())
    benign = [e for _, e in fleet_events("benign")]
    chosen = chooser.select(benign)
    # the training job's weight reads feed correlations; its loopback notebook does not
    assert chosen and all(e["event.category"] == "file_access" for e in chosen)
    assert len(chosen) < len(benign)

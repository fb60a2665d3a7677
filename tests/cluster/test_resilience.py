"""What a hub member does while a server it needs does not answer (a JetStream leader that
died, a cluster electing the next): it keeps evaluating, and it does not take the silence
for an answer. A stopped nats-server is the silence here; test_nats_cluster.py kills one
server of three."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest
from nats.aio.client import Client

from hpcsec.detector.cluster.consumer import PartitionFeed
from hpcsec.detector.cluster.delivered import RETRY_S, DeliveredAlerts
from hpcsec.detector.cluster.partition import subject_for
from hpcsec.detector.cluster.streams import (
    JETSTREAM_WAIT_S,
    StreamSettings,
    connect,
    ensure_events_stream,
)
from tests.cluster.harness import NatsServer


async def _reconnected(nc: Client) -> None:
    while not nc.is_connected:
        await asyncio.sleep(0.1)


class FakeMonotonic:
    """The bucket's retry pause, moved on by the test instead of waited for."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _delivered_across_an_outage(server: NatsServer) -> None:
    nc = await connect([server.url])
    try:
        clock = FakeMonotonic()
        delivered = await DeliveredAlerts.open(nc, 1, StreamSettings())
        delivered._monotonic = clock
        await delivered.mark("before")
        server.stop()
        # the bucket does not answer: the alert counts as not delivered, nothing raises
        assert not await delivered.seen("during")
        assert delivered.away
        await delivered.mark("during")
        assert "during" in delivered.unrecorded
        assert await delivered.seen("during")  # this member knows it sent it
        server.start()
        await _reconnected(nc)
        clock.now += RETRY_S
        assert not delivered.away
        assert not await delivered.seen("new")  # asks the bucket again, writes what waited
        assert not delivered.unrecorded
        again = await DeliveredAlerts.open(nc, 1, StreamSettings())  # another member
        assert await again.seen("during") and await again.seen("before")
        assert not await again.seen("new")
    finally:
        await nc.close()


def test_delivered_alerts_go_on_while_the_bucket_does_not_answer(
    nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="hpcsec.detector.cluster.delivered"):
        asyncio.run(_delivered_across_an_outage(nats_server))
    assert caplog.text.count("bucket does not answer") == 1  # once per outage
    assert "bucket answers again" in caplog.text


async def _caught_up_only_when_answered(server: NatsServer) -> list[bool]:
    nc = await connect([server.url])
    try:
        js = nc.jetstream()
        await ensure_events_stream(js, StreamSettings(replicas=1))
        feed = PartitionFeed(js, 3)
        await feed.open()
        answers = [await feed.caught_up()]  # nothing published: caught up
        await js.publish(subject_for(3, "gpu-1"), b"{}")
        answers.append(await feed.caught_up())  # one message waits for the member
        assert [m.data for m in await feed.fetch()] == [b"{}"]
        answers.append(await feed.caught_up())
        server.stop()
        answers.append(await feed.caught_up())  # no answer: not caught up
        feed.behind_since = time.monotonic() - JETSTREAM_WAIT_S  # longer than an election
        answers.append(await feed.caught_up())
        server.start()
        await _reconnected(nc)
        return answers
    finally:
        await nc.close()


def test_a_partition_is_caught_up_only_when_its_consumer_says_so(
    nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="hpcsec.detector.cluster.consumer"):
        answers = asyncio.run(_caught_up_only_when_answered(nats_server))
    # a consumer that stays away longer than an election no longer holds the hub's time
    assert answers == [True, False, True, False, True]
    assert "partition 3: its consumer does not deliver" in caplog.text

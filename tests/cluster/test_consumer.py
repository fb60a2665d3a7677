"""A hub member's per-message path: stream sequences from reply subjects, acks in runs
(against a real nats-server), and batched evaluation giving what one event at a time gives."""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time

import orjson
import pytest
from nats.aio.msg import Msg
from nats.js import JetStreamContext

from hpcsec.detector.cluster import consumer
from hpcsec.detector.cluster.consumer import (
    FETCH_BATCH,
    FETCH_WAIT_S,
    REPLY_GRACE_S,
    PartitionFeed,
    stream_sequence,
)
from hpcsec.detector.cluster.evaluation import HubClock, HubEvaluation
from hpcsec.detector.cluster.partition import subject_for
from hpcsec.detector.cluster.streams import (
    EVENTS_STREAM,
    StreamSettings,
    connect,
    ensure_events_stream,
)
from hpcsec.detector.config.site import SiteConfig
from tests.cluster.harness import NatsServer

V1 = "$JS.ACK.HPCSEC_EVENTS.hpcsec-hub-p03.1.{seq}.17.1733000000000000000.4"
V2 = "$JS.ACK.hub.ACCHASH.HPCSEC_EVENTS.hpcsec-hub-p03.2.{seq}.17.1733000000000000000.4.rnd"


@pytest.mark.parametrize("form", [V1, V2, V2.removesuffix(".rnd")])
@pytest.mark.parametrize("seq", [1, 42, 2**40 + 3])
def test_stream_sequence_agrees_with_nats_metadata(form: str, seq: int) -> None:
    reply = form.format(seq=seq)
    assert stream_sequence(reply) == Msg.Metadata._from_reply(reply).sequence.stream == seq


@pytest.mark.parametrize(
    "reply",
    [
        None,
        "",
        "_INBOX.abc.def",
        "$JS.ACK.S.C",
        "$JS.ACK.S.C.1.x.17.1733000000000000000.4",  # sequence not a number
        "$JS.ACK.S.C.1.-5.17.1733000000000000000.4",
        "$JS.NAK.S.C.1.5.17.1733000000000000000.4",
        "$JS.ACK.S.C.1.5.17.1733000000000000000",  # a token short of either form
    ],
)
def test_a_reply_that_is_not_a_jetstream_ack_has_no_sequence(reply: str | None) -> None:
    assert stream_sequence(reply) is None


async def _ack_floor(js: JetStreamContext, durable: str, expected: int) -> int:
    """The consumer's ack floor once it is `expected` (the server applies an ack a moment
    after it arrives), or what it is after two seconds."""
    for _ in range(40):
        info = await js.consumer_info(EVENTS_STREAM, durable)
        floor = info.ack_floor.stream_seq if info.ack_floor else 0
        if floor == expected:
            break
        await asyncio.sleep(0.05)
    return floor


async def _feed_round(url: str, step: float) -> tuple[list[int | None], list[int], int]:
    """Ten messages through a partition's feed, event times `step` apart: the sequences
    `fresh` gives (a redelivered one again at the end), the ack floor after each
    `ack_before`, and the feed's resume point once it is opened again."""
    nc = await connect([url], reconnect=False)
    try:
        js = nc.jetstream()
        await ensure_events_stream(js, StreamSettings(replicas=1))
        for _ in range(10):
            await js.publish(subject_for(3, "gpu-1"), b"{}", stream=EVENTS_STREAM)
        feed = PartitionFeed(js, 3)
        await feed.open()
        msgs: list[Msg] = []
        while len(msgs) < 10:  # a fetch gives what has arrived: maybe part of the batch
            msgs += await feed.fetch()
        seqs = [feed.fresh(m) for m in msgs] + [feed.fresh(msgs[4])]
        for seq, msg in zip(seqs, msgs, strict=False):
            assert seq is not None
            feed.hold(seq, msg, 100.0 + seq * step if seq != 3 else None)  # 3: none waits
        floors = []
        for cutoff, expected in ((0.0, 0), (4.5, 4), (6.0, 5), (math.inf, 10)):
            await feed.ack_before(100.0 + cutoff * step)
            floors.append(await _ack_floor(js, feed.durable, expected))
        await feed.close()
        return seqs, floors, await PartitionFeed(js, 3).open()
    finally:
        await nc.close()


@pytest.mark.parametrize(
    ("step", "block", "expected"),
    [
        # events further apart than HELD_SPREAD_S are held one by one: one ack per run, up
        # to the first event not older than the cutoff (3 waits for none)
        (100.0, consumer.HELD_BLOCK, [0, 4, 5, 10]),
        # within HELD_SPREAD_S, by blocks (of 4 here): a block is acked once all its events
        # are, so 5-8 waits for 8
        (0.01, 4, [0, 4, 4, 10]),
    ],
)
def test_fresh_sequences_and_acks_in_runs_on_a_real_server(
    nats_server: NatsServer,
    monkeypatch: pytest.MonkeyPatch,
    step: float,
    block: int,
    expected: list[int],
) -> None:
    monkeypatch.setattr(consumer, "HELD_BLOCK", block)
    seqs, floors, resume = asyncio.run(_feed_round(nats_server.url, step))
    assert seqs == [*range(1, 11), None]  # the redelivery of 5 is skipped
    assert floors == expected
    assert resume == 11  # a restart resumes after the ack floor


def test_held_messages_cost_a_block_each_not_a_message_each() -> None:
    """What a member holds until the horizon passes is one message (and a few numbers) per
    HELD_BLOCK messages whose events lie within HELD_SPREAD_S: the others, their event
    bytes with them, are let go once evaluated. Held whole, two hours of a fleet's events
    were gigabytes."""
    import types
    import weakref

    feed = PartitionFeed(types.SimpleNamespace(_nc=None), 3)  # type: ignore[arg-type]
    alive: list[weakref.ref[Msg]] = []
    count = 10 * consumer.HELD_BLOCK + 7
    for seq in range(1, count + 1):
        msg = Msg(_client=None, subject="s", reply=V1.format(seq=seq), data=b"x" * 600)  # type: ignore[arg-type]
        alive.append(weakref.ref(msg))
        feed.hold(seq, msg, 1000.0 + (seq % 50) / 1000)
        del msg
    blocks = -(-count // consumer.HELD_BLOCK)
    assert len(feed.held) == blocks
    assert sum(ref() is not None for ref in alive) == blocks  # each block's last only
    assert [b.last_seq for b in feed.held][-2:] == [count - 7, count]
    assert all(b.newest == 1000.049 for b in list(feed.held)[:-1])
    # past the spread a block ends early: a block's events are acked at most that late
    feed.hold(count + 1, Msg(_client=None, reply=V1.format(seq=count + 1)), 1000.0 + 100)  # type: ignore[arg-type]
    assert len(feed.held) == blocks + 1


def test_events_past_the_last_cutoff_join_any_block() -> None:
    """A node's backlog sent among live events: its events, already past the cutoff, wait
    for nothing and do not break the blocks of the live ones."""
    import types

    feed = PartitionFeed(types.SimpleNamespace(_nc=None), 3)  # type: ignore[arg-type]
    assert asyncio.run(feed.ack_before(2000.0)) == 0  # nothing held: only the cutoff moves
    for seq in range(1, 101):
        t = 3000.0 + seq / 100 if seq % 2 else 1000.0 - seq  # live, backlog, live, …
        feed.hold(seq, Msg(_client=None, reply=V1.format(seq=seq)), t)  # type: ignore[arg-type]
    (block,) = feed.held
    assert (block.count, block.oldest, block.newest) == (100, 3000.01, 3000.99)


def _reference_clock(events: list[dict], sources: list[int], idle_before: set[int]) -> HubClock:
    """The clock as one observation per event gives it."""
    clock = HubClock(lambda: 2e9, lambda: 0.0, sources=range(3))
    for source in idle_before:
        clock.idle(source)
    for event, source in zip(events, sources, strict=True):
        t = HubEvaluation.event_time(event)
        if t is not None:
            clock.observe(t, source)
    return clock


def _stamp(at: int) -> str:
    """RFC 3339 of `at`, for times within the hour after 2001-09-09T01:00:00Z."""
    base = 1_000_000_000 - 6400  # 2001-09-09T00:00:00Z
    return f"2001-09-09T{(at - base) // 3600:02d}:{(at - base) // 60 % 60:02d}:{at % 60:02d}Z"


def _check_batched_clock(runs: list[tuple[int, list[int | None]]], idle_before: set[int]) -> None:
    events = [
        {"event.category": "sensor_status"} | ({"@timestamp": _stamp(at)} if at else {})
        for _, times in runs
        for at in times
    ]
    sources = [source for source, times in runs for _ in times]
    reference = _reference_clock(events, sources, idle_before)
    clock = HubClock(lambda: 2e9, lambda: 0.0, sources=range(3))
    for source in idle_before:
        clock.idle(source)
    evaluation = HubEvaluation.load(SiteConfig(), lateness_s=60.0, clock=clock)
    times = [evaluation.event_time(e) for e in events]
    evaluation.evaluate([dict(e) for e in events], sources, times)
    assert clock() == reference()
    assert clock.quiet == reference.quiet


def test_batched_clock_observations_equal_one_per_event() -> None:
    """Runs of events of one source (fetched batches): the hub's clock after evaluating the
    batch is the clock one observation per event gives. Not the newest per source over the
    whole batch: source 1, caught up before, comes back with older events between two runs
    of source 0, and the clock has already moved on to source 0's first run."""
    t = 1_000_000_000
    _check_batched_clock([(0, [t + 105]), (1, [t + 60]), (0, [t + 110])], idle_before={1, 2})


@pytest.mark.parametrize("seed", range(20))
def test_batched_clock_observations_equal_one_per_event_random(seed: int) -> None:
    """Random runs, sources taking turns, some caught up before, some events without time."""
    rng = random.Random(seed)
    runs: list[tuple[int, list[int | None]]] = []
    for _ in range(rng.randrange(2, 8)):
        start = 1_000_000_000 + rng.randrange(600)
        times = [start + i * rng.randrange(0, 30) for i in range(rng.randrange(1, 6))]
        runs.append((rng.randrange(3), [None if rng.random() < 0.1 else at for at in times]))
    _check_batched_clock(runs, idle_before={s for s in range(3) if rng.random() < 0.5})


async def _fetch_while_busy(url: str) -> tuple[list[int], list[int], list[int]]:
    """A caught-up partition's fetch, then five messages fetched while the event loop is
    busy (evaluating) past the pull request's expiry, then the caught-up fetch again."""
    nc = await connect([url], reconnect=False)
    try:
        js = nc.jetstream()
        await ensure_events_stream(js, StreamSettings(replicas=1))
        feed = PartitionFeed(js, 5)
        await feed.open()
        empty = await feed.fetch()
        for _ in range(5):
            await js.publish(subject_for(5, "gpu-2"), b"{}", stream=EVENTS_STREAM)
        fetching = asyncio.ensure_future(feed.fetch())
        await asyncio.sleep(0.05)  # its pull request is out
        time.sleep(FETCH_WAIT_S + REPLY_GRACE_S + 0.3)  # the loop busy evaluating
        busy = await fetching
        after = await feed.fetch()
        await feed.close()
        return [len(empty)], [m.metadata.sequence.stream for m in busy], [len(after)]
    finally:
        await nc.close()


def test_a_busy_loop_does_not_make_a_partition_look_caught_up(
    nats_server: NatsServer,
) -> None:
    """[] (the partition is caught up, the hub's clock may move on) only when the server
    says a request found nothing, never because a timeout of ours ran out while the loop
    was busy: the events then waiting would be late."""
    empty, busy, after = asyncio.run(_fetch_while_busy(nats_server.url))
    assert empty == [0]
    assert busy == [1, 2, 3, 4, 5]
    assert after == [0]


async def _drain_past_one_batch(url: str) -> tuple[int, int, int]:
    nc = await connect([url], reconnect=False)
    try:
        js = nc.jetstream()
        await ensure_events_stream(js, StreamSettings(replicas=1))
        for _ in range(FETCH_BATCH + 5):
            await js.publish(subject_for(7, "gpu-3"), b"{}", stream=EVENTS_STREAM)
        feed = PartitionFeed(js, 7)
        await feed.open()
        got = 0
        while got < FETCH_BATCH + 5:
            got += len(await feed.fetch())
        await feed.close()
        return got, feed._request.number, feed._request.left
    finally:
        await nc.close()


def test_a_request_that_delivered_its_batch_is_followed_at_once(
    nats_server: NatsServer,
) -> None:
    """Stored messages arrive under their own subjects, not the request's: every one counts
    against the open request, so the next request goes out once a batch is in (not when the
    spent request would have expired, a pause per batch)."""
    got, requests, left = asyncio.run(_drain_past_one_batch(nats_server.url))
    assert (got, requests, left) == (FETCH_BATCH + 5, 2, FETCH_BATCH - 5)


async def _publish(js: JetStreamContext, count: int) -> None:
    for _ in range(count):
        await js.publish(subject_for(4, "gpu-1"), b"{}", stream=EVENTS_STREAM)


async def _steal(js: JetStreamContext, durable: str, count: int) -> None:
    """`count` new events delivered for a pull request from an inbox the feed does not read,
    once the feed has no request open: the server counts them delivered and they never reach
    the feed (what a dropped connection does to the messages on their way). The server drops
    a request nobody listens to: a subscription of its own takes them and is never read."""
    for _ in range(200):  # the feed's own request expires
        if (await js.consumer_info(EVENTS_STREAM, durable)).num_waiting == 0:
            break
        await asyncio.sleep(0.02)
    nc = js._nc
    inbox = nc.new_inbox()
    unread = await nc.subscribe(inbox)
    subject = f"$JS.API.CONSUMER.MSG.NEXT.{EVENTS_STREAM}.{durable}"
    await nc.publish(subject, orjson.dumps({"batch": count}), reply=inbox)
    await nc.flush()
    before = (await js.consumer_info(EVENTS_STREAM, durable)).delivered.consumer_seq
    await _publish(js, count)
    for _ in range(200):
        info = await js.consumer_info(EVENTS_STREAM, durable)
        if info.delivered.consumer_seq == before + count:
            await unread.unsubscribe()
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the server did not deliver to the stolen request")


async def _evaluate(feed: PartitionFeed, evaluated: list[int], until: int, base: float) -> None:
    """Fetch and hold (as the hub does, the event of sequence S at time `base` + S) until
    stream sequence `until` is evaluated; an empty fetch is followed by `caught_up`, as the
    hub's pump does."""
    for _ in range(50):
        msgs = await feed.fetch()
        if not msgs:
            await feed.caught_up()
        for msg in msgs:
            seq = feed.fresh(msg)
            if seq is not None:
                evaluated.append(seq)
                feed.hold(seq, msg, base + seq)
        if evaluated and evaluated[-1] >= until:
            return


async def _lose_in_flight(url: str, at_tail: bool) -> tuple[list[int], list[int]]:
    """Four events evaluated, the first acked and three held (a window needs them), three
    delivered but not received, then (unless `at_tail`) two more published: the sequences the
    feed evaluates, in order, and the ack floor as the server has it after acking up to the
    last one held before the loss, the first one lost, and all."""
    nc = await connect([url], reconnect=False)
    try:
        js = nc.jetstream()
        await ensure_events_stream(js, StreamSettings(replicas=1))
        await _publish(js, 4)
        feed = PartitionFeed(js, 4)
        await feed.open()
        evaluated: list[int] = []
        await _evaluate(feed, evaluated, 4, base=100.0)
        assert await feed.ack_before(101.5) == 1
        await _steal(js, feed.durable, 3)
        total = 7 if at_tail else 9
        await _publish(js, total - 7)
        await _evaluate(feed, evaluated, total, base=200.0)
        floors = []
        for cutoff, expected in ((150.0, 4), (205.5, 5), (math.inf, total)):
            assert await feed.ack_before(cutoff) == expected
            floors.append(await _ack_floor(js, feed.durable, expected))
        await feed.close()
        return evaluated, floors
    finally:
        await nc.close()


@pytest.mark.parametrize("at_tail", [False, True], ids=["gap-in-the-middle", "gap-at-the-tail"])
def test_messages_delivered_but_not_received_are_read_again(
    nats_server: NatsServer,
    at_tail: bool,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Messages the server delivered that never reached the member (lost on their way) are
    read again from the stream and evaluated once, in order: found by the delivery sequence
    of the next message, or, when nothing newer comes, by the consumer saying it delivered
    more than arrived. They are acknowledged only once evaluated."""
    caplog.set_level(logging.WARNING, "hpcsec.detector.cluster.consumer")
    monkeypatch.setattr(consumer, "HELD_SPREAD_S", 0.5)  # events a second apart: one by one
    evaluated, floors = asyncio.run(_lose_in_flight(nats_server.url, at_tail))
    total = 7 if at_tail else 9
    assert evaluated == list(range(1, total + 1))
    # the held ones acked through their redelivery: the old delivery's consumer sequence
    # would tell the new consumer that more was delivered, and it would then ignore the ack
    # of the first message lost
    assert floors == [4, 5, total]
    warnings = [r.getMessage() for r in caplog.records if "re-reading" in r.getMessage()]
    assert warnings == [
        "hub: partition 4: 3 message(s) delivered but not received; "
        "re-reading the partition after stream sequence 1"
    ]

"""One partition of the events stream as a hub member reads it.

Each partition has one durable pull consumer (`hpcsec-hub-pNN`) with AckPolicy.ALL: acking
message S acknowledges every message before it. The hub acks a message only when no open
correlation window can still need its event (its time is older than the watermark minus the
longest correlation timespan), so the consumer's ack floor is where a restarted member must
resume to rebuild every open window. On start the durable is re-created at that floor:
JetStream would otherwise hold the unacked messages until their ack wait expired.

An empty fetch does not prove the partition is caught up: when the server holding the
consumer's leader dies, a pull goes unanswered until the other servers elect a new leader
(seconds), and the events published meanwhile wait there. Taken for "caught up", that silence
let the hub's event time run ahead on the other partitions and made this partition's events
late (not correlated) once they came. So a partition reports itself caught up only when the
consumer's leader says nothing is left to deliver (`caught_up`).

Messages the server delivered for a pull request can still be lost on the way (a dropped
connection, a member cut as a slow consumer): the server counts them delivered, would not
deliver them again for the ack wait (hours), and the next ack (policy all) would acknowledge
them unseen. Each delivery carries the consumer's delivery sequence, one more than the one
before, so a jump (or a consumer that says it delivered more than arrived, `caught_up`) shows
the loss. The feed then re-creates the durable at the ack floor of what it has acked, and
each incarnation gets a subscription of its own, so a message of an earlier incarnation is
never acked (its delivery sequence means nothing to the new consumer): the held one is acked
through its redelivery. Messages after the gap are dropped and delivered again in order, so
what the member evaluated stays a gapless prefix of the partition (no set of sequences is
needed): `last_seq` tells what is fresh.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from dataclasses import dataclass

import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import Error as NatsError
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from hpcsec.detector.cluster.partition import partition_subject
from hpcsec.detector.cluster.streams import EVENTS_STREAM, JETSTREAM_WAIT_S
from hpcsec.detector.core.log import get_logger

# Messages per pull request. The next request goes out as soon as a batch is in, so a small
# batch costs little; what is requested is on its way to the member, and a member whose
# loop stalls (an overloaded machine) must not have megabytes queued at the server for it:
# a server cuts a client that leaves its writes blocked for seconds (a slow consumer).
FETCH_BATCH = 256
FETCH_WAIT_S = 0.5
REPLY_GRACE_S = 0.5  # a pull request's expiry reply may come a little after it expired
JS_API = "$JS.API"  # the JetStream API prefix of nc.jetstream()
# Longer than any window the hub keeps open: a live consumer never gets its own held
# messages redelivered (they are skipped by sequence if it happens anyway).
ACK_WAIT_S = 6 * 3600.0
CONFIRM_TIMEOUT_S = 2.0  # a consumer without a leader does not answer: the fetch goes on

logger = get_logger(__name__)


def durable_name(partition: int) -> str:
    return f"hpcsec-hub-p{partition:02d}"


@dataclass
class PullRequest:
    subject: str  # its reply subject, where its status comes
    number: int
    until: float  # monotonic: past its expiry and the reply's grace, it is given up on
    left: int = FETCH_BATCH  # messages it may still deliver
    ended: bool = False  # the server's status said it is over and found nothing more


# Messages one held block stands for, at most. A member keeps every message it has not acked
# (the horizon: the longest correlation timespan, two hours with the bundled rules), and kept
# whole (its event's bytes, ~1 KB each) that was gigabytes at the fleet's usual rates and
# grew with any node's flood. A block keeps only the event times it spans and its last
# message, whose ack acknowledges the block (AckPolicy.ALL): it is acked once all of its
# events are past the cutoff. Its events lie within HELD_SPREAD_S of each other, so a block
# is acked at most that much event time later than its messages one by one would be (a minute
# against a horizon of hours and an ack wait of six: a restart replays a minute more); an
# event already past the last cutoff, or without a time, joins any block. Nodes' events
# interleave with their forwarding delays, and a node back online sends its backlog among
# live events: a spread of a second broke the blocks at most messages.
HELD_BLOCK = 256
HELD_SPREAD_S = 60.0


@dataclass(slots=True)
class HeldBlock:
    """Consecutive messages evaluated and not acked yet, through `last` (its stream
    sequence: `last_seq`); the oldest and newest event times among them (inf and -inf
    while none has one that anything waits for)."""

    last_seq: int
    oldest: float
    newest: float
    last: Msg
    count: int = 1

    def takes(self, t: float) -> bool:
        """Whether a message of event time `t` (-inf: none) may join the block."""
        if self.count >= HELD_BLOCK:
            return False
        return t == -math.inf or max(self.newest, t) - min(self.oldest, t) < HELD_SPREAD_S


_V1_TOKENS, _V2_MIN_TOKENS = 9, 11  # `$JS.ACK.` reply subjects without and with a domain


def _ack_sequence(reply: str | None, offset: int) -> int | None:
    """A sequence of a JetStream message's reply subject, None when it is not one.

    `$JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>`,
    or with `<domain>.<account hash>.` after `$JS.ACK.` (servers 2.9+). nats-py's
    `Msg.metadata` builds a datetime and three objects per message for the same number.
    `offset`: 0 for the stream sequence, 1 for the consumer's delivery sequence.
    """
    if not reply:
        return None
    tokens = reply.split(".")
    count = len(tokens)
    if count == _V1_TOKENS:
        index = 5 + offset
    elif count >= _V2_MIN_TOKENS:
        index = 7 + offset
    else:
        return None
    if tokens[0] != "$JS" or tokens[1] != "ACK" or not tokens[index].isdigit():
        return None
    return int(tokens[index])


def stream_sequence(reply: str | None) -> int | None:
    """The stream sequence in a JetStream message's reply subject, None when it is not one."""
    return _ack_sequence(reply, 0)


def consumer_sequence(reply: str | None) -> int | None:
    """The consumer's delivery sequence in a JetStream message's reply subject (one more for
    each message it delivers, redeliveries too), None when it is not one."""
    return _ack_sequence(reply, 1)


class PartitionFeed:
    """The partition's messages through pull requests of our own on a callback subscription
    (nats-py's `fetch` awaits each message of a batch with a timeout of its own: several
    times the CPU of everything else it does per message). Each request has its own reply
    subject, so a status reply is known to be about the request it ends."""

    def __init__(self, js: JetStreamContext, partition: int):
        self.js = js
        self.nc: Client = js._nc  # nats-py keeps the context's connection private
        self.partition = partition
        self.durable = durable_name(partition)
        self.held: deque[HeldBlock] = deque()
        self._ends: set[int] = set()  # the held blocks' last stream sequences
        self.cutoff = -math.inf  # the latest `ack_before` was given: older events wait for none
        self.last_seq = 0  # the newest stream sequence evaluated: all before it were too
        self.acked_seq = 0  # the newest stream sequence acked (the ack floor as we know it)
        self.delivered_seq = 0  # the consumer's delivery sequence of the last message in
        self.lost = 0  # messages delivered but not received, until the partition is re-read
        # held messages of an earlier consumer incarnation, by stream sequence: their
        # redelivery, through which they are acked
        self._renewed: dict[int, Msg] = {}
        self.sub: Subscription | None = None
        self._inbox = ""
        self._sid: int | None = None  # the subscription of the consumer's incarnation
        self._arrived: list[Msg] = []
        self._signal = asyncio.Event()
        self._request = PullRequest("", 0, 0.0)
        # since when an empty fetch has not been confirmed as "nothing left to deliver"
        self.behind_since: float | None = None
        self.given_up = False  # for longer than a leader election takes: logged once

    async def open(self) -> int:
        """Bind to the partition's durable consumer, resuming after its ack floor; returns
        the first stream sequence to be delivered (0: from the start of the stream)."""
        floor = 0
        with contextlib.suppress(NotFoundError):
            info = await self.js.consumer_info(EVENTS_STREAM, self.durable)
            floor = info.ack_floor.stream_seq if info.ack_floor else 0
        await self._create(floor)
        self.last_seq = self.acked_seq = floor
        return floor + 1 if floor else 0

    async def _create(self, floor: int) -> None:
        """The durable (re-)created to deliver from after `floor`, to a subscription of its
        own."""
        await self.close()
        self._sid = None  # no message of the old incarnation is acked from here on
        self._arrived = []
        self._request = PullRequest("", 0, 0.0)
        self.delivered_seq = 0
        with contextlib.suppress(NotFoundError):
            await self.js.delete_consumer(EVENTS_STREAM, self.durable)
        config = ConsumerConfig(
            durable_name=self.durable,
            description=f"hpcsec hub, partition {self.partition}",
            filter_subject=partition_subject(self.partition),
            ack_policy=AckPolicy.ALL,
            ack_wait=ACK_WAIT_S,
            max_ack_pending=-1,  # windows hold messages unacked; the stream's limits bound them
            max_deliver=-1,
        )
        if floor:
            config.deliver_policy = DeliverPolicy.BY_START_SEQUENCE
            config.opt_start_seq = floor + 1
        await self.js.add_consumer(EVENTS_STREAM, config)
        inbox = self.nc.new_inbox()
        self.sub = await self.nc.subscribe(f"{inbox}.*", cb=self._deliver)
        self._inbox = inbox
        self._sid = self.sub._id  # nats-py keeps it private; a message says it (Msg.sid)

    async def _reread(self) -> None:
        """Deliver again from after what this member acked: the lost messages come, the ones
        it holds come again (skipped by `fresh`, acked through their redelivery)."""
        lost = self.lost
        await self._create(self.acked_seq)
        self.lost = 0
        logger.warning(
            "hub: partition %d: %d message(s) delivered but not received; re-reading the "
            "partition after stream sequence %d",
            self.partition,
            lost,
            self.acked_seq,
        )

    def _until_gap(self, msgs: list[Msg]) -> list[Msg]:
        """The messages up to the first one after a gap in the delivery sequence; the rest
        come again once the partition is re-read."""
        for index, msg in enumerate(msgs):
            delivered = consumer_sequence(msg.reply)
            if delivered is None:
                continue  # not a stored message: `fresh` drops it
            if delivered != self.delivered_seq + 1:
                self.lost = max(delivered - self.delivered_seq - 1, 1)
                return msgs[:index]
            self.delivered_seq = delivered
        return msgs

    async def _deliver(self, msg: Msg) -> None:
        if not self._current(msg):
            return  # for the consumer's earlier incarnation (re-read meanwhile)
        request = self._request
        if msg.reply:  # a stored message (its ack subject); the server's replies have none
            self._arrived.append(msg)  # under its own subject: counted against the open request
            request.left -= 1
        elif msg.subject == request.subject:  # no messages (404), expired (408), ended (409)
            request.left, request.ended = 0, True
        self._signal.set()

    async def _ask(self) -> None:
        self._request = PullRequest(
            f"{self._inbox}.{self._request.number + 1}",
            self._request.number + 1,
            time.monotonic() + FETCH_WAIT_S + REPLY_GRACE_S,
        )
        body = orjson.dumps({"batch": FETCH_BATCH, "expires": int(FETCH_WAIT_S * 1e9)})
        subject = f"{JS_API}.CONSUMER.MSG.NEXT.{EVENTS_STREAM}.{self.durable}"
        await self.nc.publish(subject, body, reply=self._request.subject)

    async def fetch(self) -> list[Msg]:
        """The messages that arrived; [] only once the server said a request of ours found
        nothing (the partition is caught up), not on a timeout of ours: a loop busy
        evaluating must not make a partition with messages waiting look caught up. A
        request stays open until it has its batch or expires: messages published meanwhile
        arrive at once. After a gap in the deliveries, the partition is re-read first."""
        while True:
            if self.lost:
                await self._reread()
            msgs = await self._arrivals()
            if not msgs:
                return []
            msgs = self._until_gap(msgs)
            if msgs:
                self.behind_since = None  # it delivers
                return msgs

    async def _arrivals(self) -> list[Msg]:
        while not self._arrived:
            request = self._request
            if request.ended:
                request.ended = False  # reported once; the next call asks again
                return []
            self._signal.clear()
            if request.left <= 0 or time.monotonic() >= request.until:
                await self._ask()
            if not self._arrived and not self._request.ended:
                wait = max(self._request.until - time.monotonic(), 0.0)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._signal.wait(), wait)
        msgs, self._arrived = self._arrived, []
        return msgs

    async def caught_up(self) -> bool:
        """After an empty fetch: True when the consumer's leader says nothing is left to
        deliver. Without that answer (a leader election) the partition goes on holding the
        hub's time back, for up to JETSTREAM_WAIT_S: a consumer that stays away longer must
        not stop the member's correlations, so it is then taken as caught up (logged)."""
        try:
            info = await self.js.consumer_info(
                EVENTS_STREAM, self.durable, timeout=CONFIRM_TIMEOUT_S
            )
        except (NatsError, TimeoutError) as exc:
            return self._behind(str(exc) or type(exc).__name__)
        if info.num_pending:
            return self._behind(f"{info.num_pending} messages pending, none delivered")
        delivered = info.delivered.consumer_seq if info.delivered else None
        if delivered is not None and delivered > self.delivered_seq:  # lost at the tail
            self.lost = delivered - self.delivered_seq
            return False  # the next fetch re-reads them
        self.behind_since = None
        return True

    def _behind(self, problem: str) -> bool:
        now = time.monotonic()
        if self.behind_since is None:
            self.behind_since, self.given_up = now, False
        if now - self.behind_since < JETSTREAM_WAIT_S:
            return False
        if not self.given_up:
            self.given_up = True
            logger.warning(
                "hub: partition %d: its consumer does not deliver (%s); taken as caught up",
                self.partition,
                problem,
            )
        return True

    def fresh(self, msg: Msg) -> int | None:
        """The message's stream sequence; None for a redelivery of a message this member
        already evaluated, or for one that is not a JetStream message at all."""
        seq = stream_sequence(msg.reply)
        if seq is None:
            return None
        if seq <= self.last_seq:
            if seq in self._ends and self._current(msg):
                self._renewed[seq] = msg  # a held block's last: acked through this redelivery
            return None
        self.last_seq = seq
        return seq

    def _current(self, msg: Msg) -> bool:
        """Whether the message came from the consumer as it is now: through its incarnation's
        subscription (a stored message keeps its own subject, not the inbox's)."""
        return self._sid is not None and msg._sid == self._sid

    def hold(self, seq: int, msg: Msg, event_time: float | None) -> None:
        # past the last cutoff: nothing waits for it any more than for an event without time
        t = -math.inf if event_time is None or event_time < self.cutoff else event_time
        held = self.held
        if held and held[-1].takes(t):
            block = held[-1]
            self._ends.discard(block.last_seq)
            block.last_seq, block.last, block.count = seq, msg, block.count + 1
            if t > block.newest:
                block.newest = t
            if -math.inf < t < block.oldest:
                block.oldest = t
        else:
            held.append(HeldBlock(seq, math.inf if t == -math.inf else t, t, msg))
        self._ends.add(seq)

    async def ack_before(self, cutoff: float) -> int:
        """Ack the longest run of held blocks whose events are all older than `cutoff`: one
        ack for the run (AckPolicy.ALL)."""
        self.cutoff = max(self.cutoff, cutoff)
        held = self.held
        if not held or held[0].newest >= cutoff:
            return 0
        if cutoff == math.inf:  # nothing waits for any message (no correlation)
            last = held[-1]
            held.clear()
            self._ends.clear()
        else:
            last = held.popleft()
            self._ends.discard(last.last_seq)
            while held and held[0].newest < cutoff:
                last = held.popleft()
                self._ends.discard(last.last_seq)
        ack = last.last if self._current(last.last) else self._renewed.get(last.last_seq)
        if ack is None or not self._current(ack):
            self._put_back(last)  # its redelivery is on the way (a re-read)
            return 0
        try:
            await ack.ack()
        except NatsError:
            self._put_back(last)  # acked later; a restart replays a little more
            return 0
        self.acked_seq = max(self.acked_seq, last.last_seq)
        for seq in [seq for seq in self._renewed if seq <= last.last_seq]:
            del self._renewed[seq]
        return last.last_seq

    def _put_back(self, block: HeldBlock) -> None:
        """The last block of a run not acked after all: held again, first (the run's other
        blocks are acked with it later: AckPolicy.ALL)."""
        self.held.appendleft(block)
        self._ends.add(block.last_seq)

    async def close(self) -> None:
        if self.sub is not None:
            sub, self.sub = self.sub, None
            with contextlib.suppress(NatsError):
                await sub.unsubscribe()

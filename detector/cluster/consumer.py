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
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections import deque
from dataclasses import dataclass

from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError

from hpcsec.detector.cluster.partition import partition_subject
from hpcsec.detector.cluster.streams import EVENTS_STREAM, JETSTREAM_WAIT_S

FETCH_BATCH = 256
FETCH_WAIT_S = 0.5
# Longer than any window the hub keeps open: a live consumer never gets its own held
# messages redelivered (they are skipped by sequence if it happens anyway).
ACK_WAIT_S = 6 * 3600.0
CONFIRM_TIMEOUT_S = 2.0  # a consumer without a leader does not answer: the fetch goes on

logger = logging.getLogger(__name__)


def durable_name(partition: int) -> str:
    return f"hpcsec-hub-p{partition:02d}"


@dataclass
class Held:
    seq: int
    time: float  # event time (epoch); -inf for messages nothing waits for
    msg: Msg


class PartitionFeed:
    def __init__(self, js: JetStreamContext, partition: int):
        self.js = js
        self.partition = partition
        self.durable = durable_name(partition)
        self.held: deque[Held] = deque()
        self.last_seq = 0
        self.sub: JetStreamContext.PullSubscription | None = None
        # since when an empty fetch has not been confirmed as "nothing left to deliver"
        self.behind_since: float | None = None
        self.given_up = False  # for longer than a leader election takes: logged once

    async def open(self) -> int:
        """Bind to the partition's durable consumer, resuming after its ack floor; returns
        the first stream sequence to be delivered (0: from the start of the stream)."""
        floor = 0
        try:
            info = await self.js.consumer_info(EVENTS_STREAM, self.durable)
            floor = info.ack_floor.stream_seq if info.ack_floor else 0
            await self.js.delete_consumer(EVENTS_STREAM, self.durable)
        except NotFoundError:
            pass
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
        self.sub = await self.js.pull_subscribe_bind(durable=self.durable, stream=EVENTS_STREAM)
        self.last_seq = floor
        return floor + 1 if floor else 0

    async def fetch(self) -> list[Msg]:
        assert self.sub is not None
        try:
            msgs = await self.sub.fetch(FETCH_BATCH, timeout=FETCH_WAIT_S)
        except (TimeoutError, NatsTimeoutError):
            return []
        if msgs:
            self.behind_since = None  # it delivers
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

    def fresh(self, msg: Msg) -> bool:
        """False for a redelivery of a message this member already evaluated."""
        try:
            seq = msg.metadata.sequence.stream
        except (AttributeError, ValueError, IndexError):
            return False  # not a JetStream message at all
        if seq <= self.last_seq:
            return False
        self.last_seq = seq
        return True

    def hold(self, msg: Msg, event_time: float | None) -> None:
        seq = msg.metadata.sequence.stream
        self.held.append(Held(seq, -math.inf if event_time is None else event_time, msg))

    async def ack_before(self, cutoff: float) -> int:
        """Ack the longest run of held messages whose events are older than `cutoff`."""
        last: Held | None = None
        while self.held and self.held[0].time < cutoff:
            last = self.held.popleft()
        if last is None:
            return 0
        try:
            await last.msg.ack()
        except NatsError:
            self.held.appendleft(last)  # acked later; a restart replays a little more
            return 0
        return last.seq

    async def close(self) -> None:
        if self.sub is not None:
            with contextlib.suppress(NatsError):
                await self.sub.unsubscribe()

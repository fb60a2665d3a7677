"""A hub member: its partitions' events from JetStream, evaluated, alerts delivered.

One asyncio task per partition fetches messages into a queue; the main loop evaluates them
with the runtime pipeline (evaluation.py), has the pipeline's alert stage decide on the new
alerts (silences, rate limits) and hands the decision to the agent's sink (spool, outputs,
store), and acknowledges what no open window still needs. SIGTERM stops the fetching,
finishes the batch in hand, delivers what it can and exits; open windows are not flushed:
their events are still unacknowledged, so the next start rebuilds them.
"""

from __future__ import annotations

import asyncio
import signal
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import Error as NatsError
from nats.js.errors import APIError

from hpcsec.detector.alerts.model import Alert
from hpcsec.detector.alerts.suppression import Decision
from hpcsec.detector.cluster.consumer import PartitionFeed
from hpcsec.detector.cluster.delivered import DeliveredAlerts
from hpcsec.detector.cluster.evaluation import HubCounters, HubEvaluation
from hpcsec.detector.cluster.partition import host_of_subject, member_partitions
from hpcsec.detector.cluster.streams import (
    ClusterError,
    StreamSettings,
    connect,
    ensure_events_stream,
    require_jetstream,
)
from hpcsec.detector.core.log import get_logger
from hpcsec.detector.core.schema import Event
from hpcsec.detector.core.timefmt import rfc3339
from hpcsec.detector.runtime.sink import AlertSink

QUEUE_BATCHES = 24  # fetched batches (FETCH_BATCH each) waiting; fetchers pause beyond it
# Waiting batches are evaluated together up to this many messages: the loop reads the
# socket only between evaluations, and a server cuts a client that stops reading for
# seconds (a slow consumer), losing what it had sent.
COALESCE_MESSAGES = 4096
DRAIN_TIMEOUT_S = 10.0
REPORT_EVERY_S = 60.0
SUMMARY_EVERY_S = 15.0  # rate-limit minutes that ended are summed up this soon after


logger = get_logger(__name__)


@dataclass
class HubSetup:
    urls: list[str]
    member: tuple[int, int]
    settings: StreamSettings


class Hub:
    def __init__(self, setup: HubSetup, evaluator: HubEvaluation, sink: AlertSink):
        self.setup = setup
        self.evaluator = evaluator
        self.sink = sink
        self.stop = asyncio.Event()
        self.feeds: list[PartitionFeed] = []
        self.acked = 0
        self.reported_events = 0
        self._summary_at = time.monotonic() + SUMMARY_EVERY_S

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self.stop.set)
        nc = await connect(self.setup.urls)
        try:
            return await self._serve(nc)
        finally:
            await nc.close()

    async def _serve(self, nc: Client) -> int:
        js = nc.jetstream()
        await require_jetstream(nc, self.setup.urls[0])
        try:
            replicas = await ensure_events_stream(js, self.setup.settings)
            delivered = await DeliveredAlerts.open(nc, replicas, self.setup.settings)
            self.feeds = [PartitionFeed(js, p) for p in member_partitions(*self.setup.member)]
            starts = [await feed.open() for feed in self.feeds]
        except (APIError, NatsError) as exc:
            raise ClusterError(f"cannot set up the hub's consumers: {exc}") from None
        index, count = self.setup.member
        resumed = sum(1 for s in starts if s)
        logger.info(
            "hub: member %d/%d: partitions %s, %d resumed from their last acknowledged event",
            index,
            count,
            [f.partition for f in self.feeds],
            resumed,
        )
        queue: asyncio.Queue[tuple[PartitionFeed, list[Msg] | None]]
        queue = asyncio.Queue(QUEUE_BATCHES)
        pumps = [asyncio.create_task(self._pump(feed, queue)) for feed in self.feeds]
        try:
            await self._loop(queue, delivered)
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            await self._ack()
            summaries = self.evaluator.stage.finish()  # rate-limit minutes still open
            self.sink.emit(Decision(summaries, [], [], summaries))
            left = self.sink.drain(DRAIN_TIMEOUT_S)
            if left:
                logger.warning("hub: %d alert(s) left in the spool for the next start", left)
            for feed in self.feeds:
                await feed.close()
            self.report()
        return 0

    async def _pump(self, feed: PartitionFeed, queue: asyncio.Queue) -> None:
        while not self.stop.is_set():
            try:
                msgs = await feed.fetch()
            except NatsError as exc:  # a server of the cluster went away: retry through another
                logger.warning("hub: partition %d: fetch failed: %s", feed.partition, exc)
                await asyncio.sleep(0.5)
                continue
            # an empty fetch too, in turn with the batches: the partition is caught up and no
            # longer holds the hub's event time back (evaluation.HubClock); None when the
            # consumer does not say so (its leader died): it holds the time back again
            caught_up = bool(msgs) or await feed.caught_up()
            await queue.put((feed, msgs if caught_up else None))

    async def _loop(self, queue: asyncio.Queue, delivered: DeliveredAlerts) -> None:
        next_report = time.monotonic() + REPORT_EVERY_S
        while not self.stop.is_set():
            try:
                fetched = [await asyncio.wait_for(queue.get(), timeout=0.5)]
            except TimeoutError:
                fetched = []
            # a batch is None when its partition fetched nothing but may not be caught up
            messages = sum(len(msgs or ()) for _, msgs in fetched)
            while not queue.empty() and messages < COALESCE_MESSAGES:
                fetched.append(queue.get_nowait())
                messages += len(fetched[-1][1] or ())
            # with nothing new, time still moves on (HubClock): held matches and windows settle
            await self._handle(fetched, delivered)
            self._housekeeping()
            if not any(msgs for _, msgs in fetched):
                quiet = self.evaluator.clock.quiet
                if quiet and self.evaluator.counters.events != self.reported_events:
                    self.report()  # caught up: say how far (bench.cluster waits for this)
                continue
            if time.monotonic() >= next_report:
                next_report = time.monotonic() + REPORT_EVERY_S
                self.report()

    async def _handle(
        self, fetched: list[tuple[PartitionFeed, list[Msg] | None]], delivered: DeliveredAlerts
    ) -> None:
        """Every batch that is waiting, evaluated as one (in time order, see evaluate)."""
        began, began_cpu = time.time(), time.process_time()
        events: list[Event] = []
        sources: list[int] = []
        times: list[float | None] = []
        decode, timed = self.evaluator.decode, self.evaluator.timed
        for feed, msgs in fetched:
            if msgs is None:
                self.evaluator.clock.busy(feed.partition)
                continue
            if not msgs:
                self.evaluator.clock.idle(feed.partition)
            for msg in msgs:
                seq = feed.fresh(msg)
                if seq is None:
                    continue
                event, t = timed(decode(msg.data, host_of_subject(msg.subject)))
                feed.hold(seq, msg, t)
                if event is not None:
                    events.append(event)
                    sources.append(feed.partition)
                    times.append(t)
        stage = self.evaluator.stage
        self.sink.restore_counts(stage.rotate())  # a dedup window ended (event time)
        alerts = self.evaluator.evaluate(events, sources, times)
        if alerts:
            await self._emit(alerts, delivered)
        self.sink.keep_events(events)
        await self._ack()
        if any(msgs for _, msgs in fetched):
            self.evaluator.counters.busy(began, began_cpu)

    async def _emit(self, alerts: list[Alert], delivered: DeliveredAlerts) -> None:
        fresh = []
        for alert in alerts:
            if await delivered.seen(str(alert["alert.id"])):
                self.evaluator.counters.replayed_alerts += 1
            else:
                fresh.append(alert)
        if not fresh:
            return
        decision = self.evaluator.stage.decide(fresh)
        self.evaluator.counters.alerts += len(decision.send)
        self.sink.emit(decision)  # in the spool (durable) before it is recorded as delivered
        for alert in fresh:  # silenced and rate-limited ones too: decided, stored once
            await delivered.mark(str(alert["alert.id"]))

    def _housekeeping(self) -> None:
        now = time.monotonic()
        if now >= self._summary_at:
            self._summary_at = now + SUMMARY_EVERY_S
            if self.evaluator.stage.suppressor.rate_limit > 0:
                self.sink.emit(self.evaluator.stage.due_summaries())
        self.sink.tick(now)
        for component, _action, message, _extra in self.sink.take_health():
            logger.warning("hub: %s: %s", component, message)

    async def _ack(self) -> None:
        cutoff = self.evaluator.ack_cutoff()
        for feed in self.feeds:
            if await feed.ack_before(cutoff):
                self.acked += 1

    def report(self) -> None:
        c = self.evaluator.counters
        self.reported_events = c.events
        problem = f" (last: {c.last_problem})" if c.malformed else ""
        logger.info(
            f"hub: {c.events} events, {c.alerts} alerts sent, {c.replayed_alerts} replayed alerts "
            f"not resent, {c.malformed} malformed messages skipped{problem}, "
            f"{c.late} late events not correlated (later than the lateness allowance), "
            f"{self.evaluator.evicted_groups} correlation groups evicted (past the open groups "
            f"a correlation keeps), {c.host_rewritten} host names taken from the subject"
            f"{busy_span(c)}"
        )


def busy_span(c: HubCounters) -> str:
    """When the member evaluated messages, from the first to the latest, and the CPU time
    that took (`bench.cluster` reads it: the member's own span, not its start-up)."""
    if not c.first_at:
        return ""
    first = rfc3339(datetime.fromtimestamp(c.first_at, UTC))
    last = rfc3339(datetime.fromtimestamp(c.last_at, UTC))
    return f"; messages evaluated from {first} to {last}, {c.last_cpu - c.first_cpu:.3f} s CPU"

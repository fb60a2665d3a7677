"""A hub member: its partitions' events from JetStream, evaluated, alerts delivered.

One asyncio task per partition fetches messages into a queue; the main loop evaluates them
with the runtime pipeline (evaluation.py), has the pipeline's alert stage decide on the new
alerts (silences, rate limits) and hands the decision to the agent's sink (spool, outputs,
store), and acknowledges what no open window still needs. SIGTERM stops the fetching,
finishes the batch in hand, delivers what it can and exits; open windows are not flushed:
their events are still unacknowledged, so the next start rebuilds them.

An alert is recorded as delivered (delivered.py) once it is durable: in the spool, or sent.
When the spool cannot be written (disk full) the sink holds alerts in memory only; while any
is held, the hub acknowledges no event and fetches no more (memory stays bounded), and its
clock waits (the events not fetched yet must not become late). The loop goes on, so the sink
writes them to the spool as soon as the disk takes them (or the receiver does); then they are
recorded and acknowledging and fetching resume. A hub stopped meanwhile leaves their events
unacknowledged: the next start evaluates them again and sends them (their ids are stable).
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
    ensure_alerts_stream,
    ensure_events_stream,
    refusals,
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
        # alert ids emitted but held in memory only (the spool could not take them), in order
        # of emission: recorded as delivered once durable; until then nothing is acknowledged
        self.unsettled: dict[str, None] = {}
        # ids a destination dropped, of alerts still unsettled: never recorded as delivered
        self.lost: set[str] = set()
        self.fetching = asyncio.Event()  # cleared while alerts are unsettled: the pumps wait
        self.fetching.set()

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
            # the nodes' alerts stream too: a node's user may not create streams
            await ensure_alerts_stream(js, self.setup.settings)
            delivered = await DeliveredAlerts.open(nc, replicas, self.setup.settings)
            self.feeds = [PartitionFeed(js, p) for p in member_partitions(*self.setup.member)]
            starts = [await feed.open() for feed in self.feeds]
        except (APIError, NatsError) as exc:
            # a refused request only times out: the server's refusal says what is missing
            denied = "; ".join(refusals(nc))
            why = f" ({denied}: see the hub's permissions in docs/cluster.md)" if denied else ""
            raise ClusterError(f"cannot set up the hub's consumers: {exc}{why}") from None
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
            await self._ack()  # nothing while alerts are unsettled
            summaries = self.evaluator.stage.finish()  # rate-limit minutes still open
            self.sink.emit(Decision(summaries, [], [], summaries))
            self.sink.drain(DRAIN_TIMEOUT_S)
            await self._settle(delivered)  # the last round may have spooled or sent them
            self._log_left()
            for feed in self.feeds:
                await feed.close()
            self.report()
        return 0

    async def _pump(self, feed: PartitionFeed, queue: asyncio.Queue) -> None:
        while not self.stop.is_set():
            await self.fetching.wait()  # paused while alerts wait for the spool
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
            self._housekeeping()  # spools again what waits in memory, once the disk takes it
            await self._settle(delivered)
            if not any(msgs for _, msgs in fetched):
                quiet = self.evaluator.clock.quiet
                if quiet and self.evaluator.counters.events != self.reported_events:
                    self.report()  # caught up: say how far (bench.cluster waits for this)
                if not self.unsettled:  # paused, it goes on reporting how many alerts wait
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
            alert_id = str(alert["alert.id"])
            if alert_id in self.unsettled or await delivered.seen(alert_id):
                self.evaluator.counters.replayed_alerts += 1
            else:
                fresh.append(alert)
        if not fresh:
            return
        decision = self.evaluator.stage.decide(fresh)
        self.evaluator.counters.alerts += len(decision.send)
        self.sink.emit(decision)  # in the spool (durable) before it is recorded as delivered
        held = self.sink.unspooled_ids()
        lost = self._lost_ids()
        dropped = 0
        for alert in fresh:  # silenced and rate-limited ones too: decided, stored once
            alert_id = str(alert["alert.id"])
            if alert_id in held:  # in memory only: recorded once durable (_settle)
                self.unsettled[alert_id] = None
            elif alert_id in lost:
                dropped += 1
            else:
                await delivered.mark(alert_id)
        self._dropped(dropped)
        if self.unsettled and self.fetching.is_set():
            self._hold_back()

    def _hold_back(self) -> None:
        """Alerts wait in memory: nothing is acknowledged (_ack) and nothing more is fetched,
        so the hub's memory does not grow while the disk is full."""
        self.fetching.clear()
        logger.warning(
            "hub: %d alert(s) could not be spooled (disk full?): events are not acknowledged "
            "and fetching pauses until they are",
            len(self.unsettled),
        )

    async def _settle(self, delivered: DeliveredAlerts) -> None:
        """Unsettled alerts no longer held in memory (spooled since, sent, or settled by the
        lane) recorded as delivered; once none is left, acknowledging and fetching resume."""
        if not self.unsettled:
            return
        held = self.sink.unspooled_ids()
        lost = self._lost_ids()
        dropped = 0
        for alert_id in [i for i in self.unsettled if i not in held]:
            if alert_id in lost:
                dropped += 1
            else:
                await delivered.mark(alert_id)
            del self.unsettled[alert_id]
        self._dropped(dropped)
        if self.unsettled:
            # what is not fetched yet may be older than what the partitions delivered last:
            # the hub's time must not move on without it (it would come late)
            for feed in self.feeds:
                self.evaluator.clock.busy(feed.partition)
            return
        if not self.stop.is_set():
            logger.info(
                "hub: the held alerts are spooled or delivered: acknowledging and fetching resume"
            )
        self.fetching.set()
        await self._ack()

    def _lost_ids(self) -> set[str]:
        """Ids a destination dropped: those it just said, and those of unsettled alerts it
        said before (they are decided when they leave memory)."""
        self.lost |= self.sink.take_lost()
        return self.lost

    def _dropped(self, count: int) -> None:
        """`count` alerts a destination dropped (its spool full, or its disk full and more
        held in memory than it keeps) were not recorded as delivered, so that a restart
        evaluating their events again (not acknowledged yet: within the horizon) sends
        them; said once per batch."""
        self.lost &= self.unsettled.keys()
        if not count:
            return
        self.evaluator.counters.lost_alerts += count
        logger.error(
            "hub: %d alert(s) dropped by a destination (spool or memory full): not delivered",
            count,
        )

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
        if self.unsettled:  # a restart must evaluate their events again: they are in memory
            return
        cutoff = self.evaluator.ack_cutoff()
        for feed in self.feeds:
            if await feed.ack_before(cutoff):
                self.acked += 1

    def _log_left(self) -> None:
        """At exit, what the next start still has to do: send the spooled alerts; evaluate
        again the events of the alerts held in memory only (left unacknowledged)."""
        spooled = self.sink.spooled()
        if spooled:
            logger.warning("hub: %d alert(s) left in the spool for the next start", spooled)
        if self.unsettled:
            logger.warning(
                "hub: %d alert(s) could not be spooled and are not delivered: their events stay "
                "unacknowledged, the next start evaluates them again and sends them",
                len(self.unsettled),
            )
        others = self.sink.unspooled_ids() - self.unsettled.keys()
        if others:
            logger.warning(
                "hub: %d other alert(s) held in memory (rate-limit summaries) are lost: the "
                "spool could not take them",
                len(others),
            )

    def report(self) -> None:
        c = self.evaluator.counters
        self.reported_events = c.events
        problem = f" (last: {c.last_problem})" if c.malformed else ""
        logger.info(
            f"hub: {c.events} events, {c.alerts} alerts sent, {c.replayed_alerts} replayed alerts "
            f"not resent, {c.lost_alerts} dropped by a destination, {c.malformed} malformed "
            f"messages skipped{problem}, "
            f"{c.late} late events not correlated (later than the lateness allowance), "
            f"{self.evaluator.evicted_groups} correlation groups evicted (past the open groups "
            f"a correlation keeps), {c.host_rewritten} host names taken from the subject"
            f"{self._unsettled_note()}{busy_span(c)}"
        )

    def _unsettled_note(self) -> str:
        if not self.unsettled:
            return ""
        return f", {len(self.unsettled)} alerts waiting for the spool (events not acknowledged)"


def busy_span(c: HubCounters) -> str:
    """When the member evaluated messages, from the first to the latest, and the CPU time
    that took (`bench.cluster` reads it: the member's own span, not its start-up)."""
    if not c.first_at:
        return ""
    first = rfc3339(datetime.fromtimestamp(c.first_at, UTC))
    last = rfc3339(datetime.fromtimestamp(c.last_at, UTC))
    return f"; messages evaluated from {first} to {last}, {c.last_cpu - c.first_cpu:.3f} s CPU"

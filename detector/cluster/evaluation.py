"""What a hub member does with the events of its partitions: check, enrich, evaluate, alert.

The evaluation is the runtime's one pipeline (`Pipeline`: enrichment, the engine with its
event-time reordering, the `AlertStage` with dedup), driven with the events of many nodes
instead of one node's samples. What is the hub's own: decoding messages (node data is
hostile: a message that is not a JSON object with a sane shape is counted and skipped, and
`host.name` is taken from the subject the node published on, which NATS permissions tie to
the node), the fleet's firmware majority, `alert.hosts`, and the event-time clock.

Everything here is synchronous and free of NATS, so the tests and the benchmark drive it
directly.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import orjson

from hpcsec.detector.alerts.model import Alert
from hpcsec.detector.alerts.stage import AlertStage
from hpcsec.detector.cluster.fleet import FleetFirmware
from hpcsec.detector.config.site import SiteConfig
from hpcsec.detector.core.eventio import checked_event
from hpcsec.detector.core.schema import Event
from hpcsec.detector.core.timefmt import epoch_seconds
from hpcsec.detector.engine.evaluate import Engine
from hpcsec.detector.engine.reorder import MAX_PENDING_BYTES
from hpcsec.detector.runtime.pipeline import Pipeline, SourceBatch

HORIZON_SLACK_S = 60.0  # late events of a window still find it open
# How far past the hub's wall clock an event may be stamped (nodes keep time by NTP; a
# flood stamped as far as this can make real matches late for as long, not for good)
MAX_AHEAD_S = 120.0
HUB_PREFIX = "hpcsec.cluster."
ASSET_PREFIX = "hpcsec.asset."
# Nodes publish on their own schedule, a node whose link was down publishes its spool later:
# by default the hub correlates events up to two minutes behind the newest one.
HUB_LATENESS_S = 120.0


@dataclass
class HubCounters:
    events: int = 0
    malformed: int = 0
    host_rewritten: int = 0
    late: int = 0  # later than the lateness allowance: evaluated, not correlated
    alerts: int = 0
    replayed_alerts: int = 0  # raised again after a restart, already delivered: not resent
    lost_alerts: int = 0  # dropped by a destination (its spool full, or its disk and memory)
    last_problem: str = ""
    # when the member evaluated its first and (so far) last message, wall clock and CPU
    # time (what `bench.cluster` reads: the member's own span, not its start-up)
    first_at: float = 0.0
    last_at: float = 0.0
    first_cpu: float = 0.0
    last_cpu: float = 0.0

    def busy(self, began: float, began_cpu: float) -> None:
        """A batch that arrived at `began` (wall) and `began_cpu` was evaluated just now."""
        if not self.first_at:
            self.first_at, self.first_cpu = began, began_cpu
        self.last_at, self.last_cpu = time.time(), time.process_time()


class HubClock:
    """The hub's event time, read by the engine's reorder buffer and the dedup windows.

    Each source (a partition the member reads) has its newest event time; the hub's time is
    the oldest of them among the sources still delivering, so a partition fetched later than
    another does not make its events late (a source that has delivered nothing yet holds it
    back until it reports that it is caught up: its consumer has nothing left for it). A
    caught-up report stands for the fleet's time when it was made: once newer events come
    from the other sources, the source holds the time there until it reports again (it may
    have been sent events meanwhile that a leader election keeps from it). Once every source
    is caught up, the time is the newest event seen, moved on by wall time while nothing
    arrives (a quiet fleet still closes its windows). Never past the wall clock: a node that
    stamps its events in the future cannot make every other node late. A replay of old
    events runs on their time; a live fleet runs on (about) the wall clock.
    """

    def __init__(
        self,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sources: Iterable[object] = (None,),
    ):
        self._wall, self._monotonic = wall, monotonic
        self._newest: dict[object, float] = {s: -math.inf for s in sources}
        self._idle: dict[object, float] = {}  # caught-up source -> the fleet's newest then
        self._value = -math.inf
        self._idle_since: float | None = None
        self._quiet = False

    def wall(self) -> float:
        """The wall clock this hub's time never passes."""
        return self._wall()

    def observe(self, t: float, source: object = None) -> None:
        if self._idle and self._quiet:
            # the fleet was quiet and speaks again: the other sources may be about to deliver
            # older events, so each holds the time back until it reports in again
            self._idle.clear()
        self._idle.pop(source, None)
        t = min(t, self._wall())
        if t > self._newest.get(source, -math.inf):
            self._newest[source] = t
        self._settle()

    def idle(self, source: object = None) -> None:
        """`source` is caught up: it no longer holds the hub's time back."""
        self._idle[source] = max(self._newest.values(), default=-math.inf)
        self._settle()

    def busy(self, source: object = None) -> None:
        """`source` has (or may have) events not delivered yet: it holds the hub's time back
        again, at its newest event, while the other sources deliver (a partition whose
        consumer stopped answering after it had been caught up)."""
        if self._idle.pop(source, None) is not None:
            self._settle()

    @property
    def quiet(self) -> bool:
        """Every source is caught up: all that was published has been read."""
        return self._quiet

    def _settle(self) -> None:
        fleet = max(self._newest.values(), default=-math.inf)
        holds = [t for s, t in self._newest.items() if s not in self._idle]
        # caught up before newer events came from the others: held at the time it reported
        holds += [at for at in self._idle.values() if at < fleet]
        self._quiet = not holds
        if holds:
            value = min(holds)
            self._idle_since = None
        else:
            value = fleet
            if self._idle_since is None:
                self._idle_since = self._monotonic()
        self._value = max(self._value, value)

    def __call__(self) -> float:
        if self._value == -math.inf:
            return -math.inf
        idle = 0.0 if self._idle_since is None else self._monotonic() - self._idle_since
        return min(self._value + max(idle, 0.0), self._wall())


def hub_lateness(config: SiteConfig) -> float:
    """The config's `correlation_lateness_s`, else the hub's default."""
    if config.correlation_lateness_s is not None:
        return config.correlation_lateness_s
    return HUB_LATENESS_S


def correlation_horizon_s(engine: Engine) -> float:
    """How far back in event time an open window can reach: events younger than that are
    not acknowledged, so a restarted member can rebuild the windows from the stream."""
    spans = [c.span for c in engine.correlations]
    return (max(spans) + HORIZON_SLACK_S) if spans else 0.0


def hub_pipeline(
    config: SiteConfig,
    rule_paths: Sequence[str] | None,
    clock: HubClock,
    lateness_s: float | None = None,
    default_rules: bool = True,
) -> Pipeline:
    """The runtime pipeline on the hub's event-time clock (the alert stage's dedup windows
    too); raises HpcsecError with file:line for a broken rule."""
    pipeline = Pipeline.load(
        config,
        rule_paths,
        default_rules=default_rules,
        # dedup windows on event time too; 0 until the first event has a time
        stage=AlertStage(config, clock=lambda: max(clock(), 0.0)),
        contain_errors=True,  # a bug on one message must not stop the fleet's detection
        lateness_s=hub_lateness(config) if lateness_s is None else lateness_s,
        clock=clock,
    )
    # The agent's bound (reorder.MAX_LIVE_BYTES, for a node's 80 MB budget) is too small for
    # a fleet's matches held for the hub's allowance: past it, a node behind would be late.
    pipeline.engine.pending.max_bytes = MAX_PENDING_BYTES
    return pipeline


class HubEvaluation:
    def __init__(self, pipeline: Pipeline, clock: HubClock):
        self.pipeline = pipeline
        self.clock = clock
        self.fleet = FleetFirmware()
        self.counters = HubCounters()
        self.horizon_s = correlation_horizon_s(pipeline.engine)
        # With assets in the hub's config, the hub's policy decides what a read may touch;
        # without, the node's enrichment is all there is.
        assets = pipeline.config.assets
        self.hub_fields = (HUB_PREFIX, ASSET_PREFIX) if assets else (HUB_PREFIX,)

    @classmethod
    def load(
        cls,
        config: SiteConfig,
        rule_paths: Sequence[str] | None = None,
        *,
        lateness_s: float | None = None,
        clock: HubClock | None = None,
        default_rules: bool = True,
    ) -> HubEvaluation:
        clock = clock or HubClock()
        return cls(hub_pipeline(config, rule_paths, clock, lateness_s, default_rules), clock)

    @property
    def stage(self) -> AlertStage:
        return self.pipeline.stage

    def decode(self, payload: bytes, host: str) -> Event | None:
        """The event of one message, or None (counted) when it is not one."""
        try:
            value = orjson.loads(payload)
        except orjson.JSONDecodeError as exc:
            return self._malformed(f"not JSON: {exc}")
        if not isinstance(value, dict):
            return self._malformed(f"a JSON {type(value).__name__}, not an object")
        event, problem = checked_event(value, from_orjson=True)
        if problem is None and not isinstance(event.get("event.category"), str):
            problem = "no event.category"
        if problem is not None:
            return self._malformed(problem)
        for name in [k for k in event if k.startswith(self.hub_fields)]:
            del event[name]  # the hub's to set, never the node's
        if event.get("host.name") != host:
            if "host.name" in event:
                self.counters.host_rewritten += 1
            event["host.name"] = host
        return event

    def _malformed(self, problem: str) -> Event | None:
        """Counts a message that is not an event; None, for `decode` to return."""
        self.counters.malformed += 1
        self.counters.last_problem = problem[:200]
        return None

    @staticmethod
    def event_time(event: Event | None) -> float | None:
        return None if event is None else epoch_seconds(event.get("@timestamp"))

    def timed(self, event: Event | None) -> tuple[Event | None, float | None]:
        """The event and its time; (None, None), counted as malformed, for an event stamped
        more than MAX_AHEAD_S past this hub's wall clock. A node's clock is kept by NTP; one
        event stamped in the year 2100 held every later message of its partition unacked
        (in the hub's memory, replayed at each restart), and a flood of such matches pushed
        the engine's release time there, so that every real match was late: every cluster
        correlation blind."""
        t = self.event_time(event)
        if event is not None and t is not None and t > (now := self.clock.wall()) + MAX_AHEAD_S:
            stamp = str(event.get("@timestamp"))[:40]
            return self._malformed(
                f"@timestamp {stamp} is {t - now:.0f} s past this hub's clock "
                f"(more than {MAX_AHEAD_S:g} s)"
            ), None
        return event, t

    def evaluate(
        self,
        events: list[Event],
        sources: Sequence[object] = (),
        times: Sequence[float | None] | None = None,
    ) -> list[Alert]:
        """New alerts for a batch, in any arrival order (the engine puts correlations' input
        in event-time order within the lateness allowance); alerts dedup folded into
        earlier ones are not repeated. `sources`: the source (partition) of each event;
        `times`: each event's `event_time`, where the caller has it already."""
        self.counters.events += len(events)
        if times is None:
            times = [self.event_time(event) for event in events]
        self._observe(times, sources)
        batch: list[Event] = []
        for event in events:
            if event.get("event.category") == "firmware":
                batch.extend(self.fleet.observe(event))
            else:
                batch.append(event)
        self.stage.rotate()  # dedup windows that ended in event time
        step = self.pipeline.process([SourceBatch(batch, None)])
        self.counters.late += self.pipeline.engine.take_late()
        return [with_hosts(alert) for alert in step.alerts]

    def _observe(self, times: Sequence[float | None], sources: Sequence[object]) -> None:
        """The clock learns the event times, one call per run of events of one source (a
        fetched batch): within a run only the source's newest time moves and the clock's
        value only rises, so the newest of the run gives the clock that one call per event
        would."""
        run_source: object = None
        run_newest = -math.inf
        for i, t in enumerate(times):
            source = sources[i] if sources else None
            if source != run_source and run_newest != -math.inf:
                self.clock.observe(run_newest, run_source)
                run_newest = -math.inf
            run_source = source
            if t is not None and t > run_newest:
                run_newest = t
        if run_newest != -math.inf:
            self.clock.observe(run_newest, run_source)

    def finish(self) -> list[Alert]:
        """The end of a finite input (a replay, the benchmark): correlate what is held, close
        the open windows; returns the new alerts. A running hub never calls it: its open
        windows are rebuilt from the stream by the next start."""
        return [with_hosts(alert) for alert in self.pipeline.flush()]

    @property
    def evicted_groups(self) -> int:
        """Correlation groups dropped because a correlation held its most open groups (a
        node flooding distinct group-by values evicts others' groups: said in the report)."""
        return self.pipeline.engine.stats.evicted_groups

    def ack_cutoff(self) -> float:
        """Events older than this (event time) are no longer needed by any open window: the
        engine has handed on everything up to `released` (never past the wall clock, see
        HubClock), and windows reach back at most the horizon from there."""
        if not self.pipeline.engine.correlations:
            return math.inf
        return self.pipeline.engine.pending.released - self.horizon_s


def with_hosts(alert: Alert) -> Alert:
    """A correlation's alert names every host of its evidence (`alert.hosts`)."""
    if alert.get("rule.kind") != "correlation":
        return alert
    hosts = {e.get("host.name") for e in alert.get("events") or ()}
    return alert.evolve({"alert.hosts": sorted(h for h in hosts if isinstance(h, str))})

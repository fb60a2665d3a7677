"""What a hub member does with the events of its partitions: check, enrich, evaluate, alert.

Everything here is synchronous and free of NATS, so the tests and the benchmark drive it
directly. Node data is hostile: a message that is not a JSON object with a sane shape is
counted and skipped, and `host.name` is taken from the subject the node published on (which
NATS permissions tie to the node), not from the event body.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import orjson

from hpcsec.detector.cluster.fleet import FleetFirmware
from hpcsec.detector.config.site import SiteConfig
from hpcsec.detector.core.eventio import checked_event
from hpcsec.detector.core.schema import Event
from hpcsec.detector.engine.correlate import epoch
from hpcsec.detector.engine.evaluate import Engine
from hpcsec.detector.enrich.enricher import Enricher
from hpcsec.detector.runtime.sink import WindowedDedup

Alert = dict[str, Any]
HORIZON_SLACK_S = 60.0  # late events of a window still find it open
HUB_PREFIX = "hpcsec.cluster."
ASSET_PREFIX = "hpcsec.asset."


@dataclass
class HubCounters:
    events: int = 0
    malformed: int = 0
    host_rewritten: int = 0
    alerts: int = 0
    replayed_alerts: int = 0  # raised again after a restart, already delivered: not resent
    last_problem: str = ""


def correlation_horizon_s(engine: Engine) -> float:
    """How far back in event time an open window can reach: events younger than that are
    not acknowledged, so a restarted member can rebuild the windows from the stream."""
    spans = [c.span for c in engine.correlations]
    return (max(spans) + HORIZON_SLACK_S) if spans else 0.0


class ClusterEvaluator:
    def __init__(self, config: SiteConfig, engine: Engine, clock: Any = time.time):
        self.engine = engine
        self.enricher = Enricher(config, slurm=False)  # job context came with the event
        self.fleet = FleetFirmware()
        self.dedup = WindowedDedup(config.dedup_window_s, clock)
        self.counters = HubCounters()
        self.horizon_s = correlation_horizon_s(engine)
        self.clock = clock
        # With assets in the hub's config, the hub's policy decides what a read may touch;
        # without, the node's enrichment is all there is.
        self.hub_fields = (HUB_PREFIX, ASSET_PREFIX) if config.assets else (HUB_PREFIX,)

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
        return None if event is None else epoch(event.get("@timestamp"))

    def evaluate(self, events: list[Event]) -> list[Alert]:
        """New alerts for a batch (alerts dedup folded into earlier ones are not repeated)."""
        self.counters.events += len(events)
        # Partitions and nodes interleave: in time order, a late node's events still find the
        # windows an earlier one opened (the engine expires windows by the latest time seen).
        events.sort(key=lambda e: epoch(e.get("@timestamp")) or -math.inf)
        events = self.enricher.enrich(events)
        batch: list[Event] = []
        for event in events:
            if event.get("event.category") == "firmware":
                batch.extend(self.fleet.observe(event))
            else:
                batch.append(event)
        alerts = self.dedup.add(self.engine.evaluate(batch))
        for alert in alerts:
            if alert.get("rule.kind") == "correlation":
                hosts = {e.get("host.name") for e in alert.get("events") or ()}
                alert["alert.hosts"] = sorted(h for h in hosts if isinstance(h, str))
        self.dedup.rotate()
        return alerts

    def ack_cutoff(self) -> float:
        """Events older than this (event time) are no longer needed by any open window. The
        wall clock caps it: a node that sends events from the future cannot make the hub
        acknowledge what a window still needs."""
        if not self.engine.correlations:
            return math.inf
        return min(self.engine.watermark, self.clock()) - self.horizon_s

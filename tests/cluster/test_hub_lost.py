"""An alert a destination drops (a full spool; or its disk full and more held in memory than
it keeps) is never recorded as delivered by the hub: within the horizon its events are not
acknowledged yet, and a restart that evaluates them again sends it. Recorded as delivered,
the replay would take it for sent."""

from __future__ import annotations

import asyncio
from typing import Any

from hpcsec.detector.cluster.evaluation import HubEvaluation
from hpcsec.detector.cluster.hub import Hub, HubSetup
from hpcsec.detector.cluster.streams import StreamSettings
from hpcsec.detector.config.site import SiteConfig


class Sink:
    """What the hub asks of its AlertSink: what is held in memory, what was dropped."""

    def __init__(self) -> None:
        self.held: set[str] = set()
        self.dropping: set[str] = set()  # dropped at the next emit
        self.lost: set[str] = set()

    def emit(self, decision: Any) -> None:
        self.lost |= self.dropping
        self.dropping = set()

    def unspooled_ids(self) -> set[str]:
        return set(self.held)

    def take_lost(self) -> set[str]:
        lost, self.lost = self.lost, set()
        return lost


class Delivered:
    def __init__(self) -> None:
        self.marked: list[str] = []

    async def seen(self, alert_id: str) -> bool:
        return alert_id in self.marked

    async def mark(self, alert_id: str) -> None:
        self.marked.append(alert_id)


def alert(name: str) -> dict[str, Any]:
    return {
        "alert.id": name,
        "@timestamp": "2026-12-01T01:00:00.000Z",
        "rule.id": f"r-{name}",
        "rule.title": "t",
        "rule.level": "high",
        "rule.vector": "model_theft",
        "host.name": "gpu-1",
        "events": [],
        "count": 1,
    }


def test_a_dropped_alert_is_not_recorded_as_delivered_now_or_once_settled() -> None:
    evaluation = HubEvaluation.load(SiteConfig(), lateness_s=60.0)
    sink = Sink()
    hub = Hub(HubSetup([], (0, 1), StreamSettings(replicas=1)), evaluation, sink)  # type: ignore[arg-type]
    delivered = Delivered()

    async def run() -> None:
        # a: sent; b: held in memory (disk full); c: dropped at once
        sink.held, sink.dropping = {"b"}, {"c"}
        await hub._emit([alert("a"), alert("b"), alert("c")], delivered)
        assert delivered.marked == ["a"] and list(hub.unsettled) == ["b"]
        # the next batch's delivery pushes b out of memory: its id comes with that batch
        sink.held, sink.dropping = {"d"}, {"b"}
        await hub._emit([alert("d")], delivered)
        sink.held = set()  # d spooled since
        await hub._settle(delivered)  # type: ignore[arg-type]

    asyncio.run(run())
    assert delivered.marked == ["a", "d"]  # never b or c
    assert not hub.unsettled and hub.fetching.is_set()
    assert evaluation.counters.lost_alerts == 2


def test_only_a_sink_that_tracks_them_keeps_the_ids_of_dropped_alerts() -> None:
    """The hub asks for them after every batch; the agent never asks, so its sink keeps none
    (kept, they would grow for as long as a destination drops)."""
    from hpcsec.detector.outputs.delivery import DeliveryOutcome, DeliveryReport
    from hpcsec.detector.runtime.metrics import AgentMetrics
    from hpcsec.detector.runtime.sink import AlertSink

    report = DeliveryReport(
        outcomes=[
            DeliveryOutcome("a1", "hook", "dropped"),
            DeliveryOutcome("a2", "hook", "pending"),
        ]
    )
    for track, expected in ((True, {"a1"}), (False, set())):
        sink = AlertSink(None, None, AgentMetrics(), track_lost=track)
        sink._delivered(report)
        assert sink.take_lost() == expected
        assert sink.take_lost() == set()

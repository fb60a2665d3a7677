"""The agent's source threads and the bounded queue between them and the main loop."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from hpcsec.detector.config.site import SiteConfig
from hpcsec.detector.core.schema import new_event
from hpcsec.detector.runtime.node import live_context
from hpcsec.detector.runtime.pipeline import SourceBatch
from hpcsec.detector.runtime.threads import EventQueue, StreamSource, fair_shares
from hpcsec.sensors.base import SensorSpec


def _wait_for(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_queue_is_bounded_in_events_and_counts_drops(tmp_path: Path):
    ctx = live_context(SiteConfig(), etc_root=tmp_path, host_name="n1")
    events = [
        new_event("process", "present", "process", "n1", ctx.timestamp, {"process.pid": i})
        for i in range(5)
    ]
    q = EventQueue(max_events=3)
    assert q.put(SourceBatch(events[:2], ctx), "process") == 0
    assert q.put(SourceBatch(events[2:], ctx), "process") == 2
    assert len(q) == 3
    assert q.take_dropped() == {"process": 2}
    assert q.take_dropped() == {}
    got = q.get(max_events=2, timeout=0)
    assert [[e["process.pid"] for e in c.events] for c in got] == [[0, 1]]
    got = q.get(max_events=2, timeout=0)
    assert [[e["process.pid"] for e in c.events] for c in got] == [[2]]
    assert q.get(max_events=2, timeout=0) == [] and len(q) == 0


def test_a_flood_from_one_sensor_does_not_crowd_out_the_others(tmp_path: Path):
    """A user's 100,000 sockets came first in the sample; the room is shared, so the other
    sensors' events of that sample are queued whole and the flood is cut (and counted)."""
    ctx = live_context(SiteConfig(), etc_root=tmp_path, host_name="n1")

    def batch(sensor: str, n: int) -> tuple[SourceBatch, str]:
        events = [
            new_event("x", "present", sensor, "n1", ctx.timestamp, {"process.pid": i})
            for i in range(n)
        ]
        return SourceBatch(events, ctx), sensor

    q = EventQueue(max_events=100)
    assert q.put(*batch("process", 10)) == 0  # 90 left
    lost = q.put_many([batch("sockets", 1000), batch("file_access", 5), batch("gpu", 3)])
    assert lost == 918 and q.take_dropped() == {"sockets": 918}
    got = q.get(max_events=1000, timeout=0)
    counts = [(c.events[0]["hpcsec.sensor"], len(c.events)) for c in got]
    assert counts == [("process", 10), ("sockets", 82), ("file_access", 5), ("gpu", 3)]


def test_fair_shares_fill_the_room_smallest_first():
    assert fair_shares([1000, 5, 3], 90) == [82, 5, 3]
    assert fair_shares([50, 50, 50], 90) == [30, 30, 30]
    assert fair_shares([10, 20], 100) == [10, 20]
    assert fair_shares([7, 7], 0) == [0, 0] and fair_shares([], 5) == []


class _FakeStream:
    """A streaming sensor: accesses arrive between polls; `pending` says whether any did."""

    name = "file_access"

    def __init__(self) -> None:
        self.waiting: list[int] = []
        self.collects = 0
        self.lock = threading.Lock()

    def pending(self) -> bool:
        with self.lock:
            return bool(self.waiting)

    def collect(self, ctx):
        self.collects += 1
        with self.lock:
            pids, self.waiting = self.waiting, []
        return [
            new_event(
                "file_access",
                "open",
                "file_access",
                ctx.host_name,
                ctx.timestamp,
                {"process.pid": pid, "file.path": "/models/m/w.bin"},
            )
            for pid in pids
        ]


def test_stream_source_collects_only_when_the_sensor_has_something(tmp_path: Path):
    fake = _FakeStream()
    spec = SensorSpec("file_access", lambda: fake, "fake stream")
    q = EventQueue(max_events=100)
    runs = []
    source = StreamSource(
        spec,
        lambda: live_context(SiteConfig(), etc_root=tmp_path, host_name="n1"),
        q,
        runs.append,
        poll_s=0.01,
    )
    assert source.open().ok and fake.collects == 1
    q.get(100, 0)  # the opening run's status
    source.start()
    try:
        time.sleep(0.2)  # about 20 idle polls: none of them collects
        assert fake.collects == 1 and len(q) == 0
        with fake.lock:
            fake.waiting += [41, 42]
        # the accesses, and the capture's Slurm status (no Slurm answers on a test machine)
        _wait_for(lambda: len(q) >= 2)
    finally:
        source.stop()
    chunks = q.get(100, 0)
    accesses = [e for c in chunks for e in c.events if e["event.category"] == "file_access"]
    assert [e["process.pid"] for e in accesses] == [41, 42]
    assert all(c.node is not None for c in chunks)  # captured in the stream thread
    assert fake.collects == 3  # the access poll and the one at stop (empty, ok: not queued)
    # Reported to the metrics: the run with accesses; idle ok runs change nothing there.
    assert len(q) == 0 and [len(r.events) for r in runs] == [2]

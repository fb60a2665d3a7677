"""Sampled sensors run in their own threads, each within its budget, one at a time while
each is quick: a slow one gets company after the hand-over time, is reported and skipped for
that sample, and never delays the others past it (real threads; the asserts are on events
and order)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hpcsec.detector.config.site import SiteConfig, load_config
from hpcsec.detector.core.errors import ConfigError
from hpcsec.detector.core.schema import Event, new_event
from hpcsec.detector.runtime import sensorset
from hpcsec.detector.runtime.node import live_context
from hpcsec.detector.runtime.sensorset import BudgetedSensors
from hpcsec.detector.runtime.threads import EventQueue, SampledSource, sensor_budget
from hpcsec.sensors.base import SensorContext, SensorSpec

STUCK_BUDGET_S = 0.05
GENEROUS_S = 60.0  # the fast sensors' budget: never reached, whatever the machine's load


def _wait_for(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


class _Fast:
    def __init__(self, name: str):
        self.name = name

    def collect(self, ctx: SensorContext) -> list[Event]:
        return [new_event("process", "present", self.name, ctx.host_name, ctx.timestamp, {})]


class _Stuck:
    """Reads until released, as a sensor on a /proc of 200,000 descriptors would."""

    name = "stuck"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0
        self.released = False

    def collect(self, ctx: SensorContext) -> list[Event]:
        self.calls += 1
        self.released = self.release.wait(30)  # False: nobody released it in time
        return [new_event("process", "present", self.name, ctx.host_name, ctx.timestamp, {})]


def _specs(stuck: _Stuck) -> list[SensorSpec]:
    # the slow sensor sits between the fast ones: run one after another, it would delay `b`
    return [
        SensorSpec("a", lambda: _Fast("a"), "fast"),
        SensorSpec("stuck", lambda: stuck, "slow"),
        SensorSpec("b", lambda: _Fast("b"), "fast"),
    ]


def _budget(name: str) -> float:
    return STUCK_BUDGET_S if name == "stuck" else GENEROUS_S


def _context(tmp_path: Path, config: SiteConfig | None = None) -> SensorContext:
    return live_context(config or SiteConfig(), etc_root=tmp_path, host_name="n1")


def test_a_slow_sensor_is_reported_and_the_others_deliver_in_the_same_sample(tmp_path: Path):
    stuck = _Stuck()
    sensors = BudgetedSensors(_specs(stuck))
    try:
        first = _context(tmp_path)
        runs = sensors.sample(first, _budget)
        assert [r.name for r in runs] == ["a", "stuck", "b"]
        a, slow, b = runs
        assert a.ok and b.ok and len(a.events) == len(b.events) == 1
        assert slow.status["event.action"] == "slow" and slow.events == []
        assert f"budget of {STUCK_BUDGET_S:g} s" in slow.status["message"]
        assert slow.status["hpcsec.budget_s"] == STUCK_BUDGET_S
        assert not stuck.release.is_set()  # `b` was read while `stuck` was still reading

        # Still reading in the next sample: slow again, naming the sample it reads, and not
        # started a second time (one run in flight per sensor).
        second = _context(tmp_path)
        runs = sensors.sample(second, _budget)
        assert [r.status["event.action"] for r in runs] == ["ok", "slow", "ok"]
        assert first.timestamp in runs[1].status["message"] and stuck.calls == 1

        # Its late result is not lost: it comes first in the next sample, with its read time.
        stuck.release.set()
        _wait_for(lambda: not sensors.workers[1].busy)
        runs = sensors.sample(_context(tmp_path), _budget)
        late = runs[0]
        assert late.name == "stuck" and late.ok
        assert [e["@timestamp"] for e in late.events] == [first.timestamp]
        assert [r.name for r in runs[1:]] == ["a", "stuck", "b"] and stuck.calls == 2
    finally:
        stuck.release.set()
        sensors.close()


class _Logged:
    """Notes when it starts and ends reading in `log` (shared by the sensors of a sample)."""

    def __init__(self, name: str, log: list[tuple[str, str]], then: Callable[[], object]):
        self.name, self.log, self.then = name, log, then

    def collect(self, ctx: SensorContext) -> list[Event]:
        self.log.append(("start", self.name))
        self.then()
        self.log.append(("end", self.name))
        return [new_event("process", "present", self.name, ctx.host_name, ctx.timestamp, {})]


def test_quick_sensors_read_one_at_a_time(tmp_path: Path, monkeypatch):
    """At once, sensors fought over the GIL at every file read (bench.sensors: 1.2-1.8x the
    CPU of the same runs in turn); each now starts when the one before has its run."""
    monkeypatch.setattr(sensorset, "HANDOVER_S", GENEROUS_S)  # whatever the machine's load
    log: list[tuple[str, str]] = []
    names = ["a", "b", "c", "d"]
    specs = [
        SensorSpec(n, lambda n=n: _Logged(n, log, lambda: time.sleep(0.005)), "q") for n in names
    ]
    sensors = BudgetedSensors(specs)
    try:
        for _ in range(3):
            log.clear()
            runs = sensors.sample(_context(tmp_path), lambda name: GENEROUS_S)
            assert [r.name for r in runs] == names and all(r.ok for r in runs)
            assert log == [(edge, n) for n in names for edge in ("start", "end")]
    finally:
        sensors.close()


def test_a_sensor_still_reading_after_the_handover_time_gets_company(tmp_path: Path, monkeypatch):
    """The next sensor starts beside a slow one after HANDOVER_S, long before the slow
    one's budget ends: here `b` releases the sensor before it, which would otherwise wait
    its whole 60 s budget."""
    monkeypatch.setattr(sensorset, "HANDOVER_S", 0.05)
    stuck = _Stuck()
    log: list[tuple[str, str]] = []
    specs = [
        SensorSpec("stuck", lambda: stuck, "slow"),
        SensorSpec("b", lambda: _Logged("b", log, stuck.release.set), "fast"),
    ]
    sensors = BudgetedSensors(specs)
    try:
        runs = sensors.sample(_context(tmp_path), lambda name: GENEROUS_S)
        assert [(r.name, r.status["event.action"]) for r in runs] == [("stuck", "ok"), ("b", "ok")]
        assert log == [("start", "b"), ("end", "b")] and stuck.calls == 1
        assert stuck.released  # by `b`, started beside it: not after its 30 s wait
    finally:
        stuck.release.set()
        sensors.close()


def test_a_late_run_that_ends_while_the_sample_starts_is_still_delivered(tmp_path: Path):
    """`b` is still reading sample 1 when sample 2 starts; it ends while `a` reads sample 2,
    before `b`'s turn: its run of sample 1 comes with sample 2, beside its run of sample 2
    (taking late runs only before the first start overwrote it with the new one)."""
    stuck = _Stuck()
    holder: list[BudgetedSensors] = []

    class _Releaser(_Fast):
        calls = 0

        def collect(self, ctx: SensorContext) -> list[Event]:
            self.calls += 1
            if self.calls == 2:  # in sample 2: let `b` finish sample 1, and wait till it has
                stuck.release.set()
                deadline = time.monotonic() + GENEROUS_S
                while holder[0].workers[1].busy and time.monotonic() < deadline:
                    time.sleep(0.005)
            return super().collect(ctx)

    specs = [SensorSpec("a", lambda: _Releaser("a"), "fast"), SensorSpec("b", lambda: stuck, "s")]
    sensors = BudgetedSensors(specs)
    holder.append(sensors)
    try:
        first, second = _context(tmp_path), _context(tmp_path)
        first.timestamp, second.timestamp = "2026-12-02T00:00:00.000Z", "2026-12-02T00:00:10.000Z"
        budgets = {"a": GENEROUS_S, "b": STUCK_BUDGET_S}
        runs = sensors.sample(first, budgets.__getitem__)
        assert [(r.name, r.status["event.action"]) for r in runs] == [("a", "ok"), ("b", "slow")]
        runs = sensors.sample(second, lambda name: GENEROUS_S)
        delivered = [(r.name, [e["@timestamp"] for e in r.events]) for r in runs]
        assert delivered == [
            ("b", [first.timestamp]),  # late, first, not lost
            ("a", [second.timestamp]),
            ("b", [second.timestamp]),
        ]
    finally:
        stuck.release.set()
        sensors.close()


def test_the_sampler_queues_the_other_sensors_while_one_is_stuck(tmp_path: Path):
    stuck = _Stuck()
    config = SiteConfig(sensor_budget_s={"stuck": STUCK_BUDGET_S, "*": 5.0})
    queue = EventQueue(max_events=1000)
    runs: list = []
    source = SampledSource(
        _specs(stuck), lambda: _context(tmp_path, config), queue, 5.0, runs.append, lambda _: None
    )
    source.start()
    try:
        seen: list[Event] = []

        def delivered() -> bool:
            seen.extend(e for batch in queue.get(1000, 0.05) for e in batch.events)
            return any(e["hpcsec.sensor"] == "b" and e["event.kind"] == "event" for e in seen)

        _wait_for(delivered)
        assert not stuck.release.is_set()
        slow = [e for e in seen if e["event.action"] == "slow"]
        assert [e["hpcsec.sensor"] for e in slow] == ["stuck"]
        assert "budget of 0.05 s" in slow[0]["message"]
        assert any(r.name == "stuck" and r.status["event.action"] == "slow" for r in runs)
    finally:
        stuck.release.set()
        source.stop()


def test_budgets_come_from_the_config_and_never_exceed_the_interval():
    assert sensor_budget(SiteConfig(), "sockets", 10.0) == 5.0  # half the interval
    config = SiteConfig(sensor_budget_s={"sockets": 8.0, "*": 2.0})
    assert sensor_budget(config, "sockets", 10.0) == 8.0
    assert sensor_budget(config, "gpu", 10.0) == 2.0
    assert sensor_budget(config, "sockets", 4.0) == 4.0  # a sample ends before the next


def test_sensor_budget_config_key(tmp_path: Path):
    path = tmp_path / "site.yml"
    path.write_text("agent:\n  sensor_budget_s: 3\n")
    assert load_config(path).sensor_budget_s == {"*": 3.0}
    path.write_text("agent:\n  sensor_budget_s:\n    sockets: 4\n    '*': 1.5\n")
    assert load_config(path).sensor_budget_s == {"sockets": 4.0, "*": 1.5}
    path.write_text("agent:\n  sensor_budget_s:\n    sockets: soon\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert err.value.location is not None and err.value.location.line == 3
    assert "agent.sensor_budget_s.sockets must be a number" in str(err.value)

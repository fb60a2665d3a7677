"""The runtime pipeline's parts: batches, the sensor lifecycle, contained errors, endpoints."""

from __future__ import annotations

import logging

import pytest

from hpcsec.detector.config.site import SiteConfig
from hpcsec.detector.runtime.endpoints import open_alert_outputs, open_store
from hpcsec.detector.runtime.node import live_context
from hpcsec.detector.runtime.pipeline import Pipeline, SourceBatch, coalesce
from hpcsec.detector.runtime.sensorset import SensorSet
from hpcsec.sensors.base import SensorSpec


def _ctx():
    return live_context(SiteConfig(), host_name="n1")


def test_batches_of_one_node_view_are_enriched_together():
    a, b = _ctx(), _ctx()
    first = SourceBatch([{"n": 1}], a)
    merged = coalesce([first, SourceBatch([{"n": 2}], a), SourceBatch([{"n": 3}], b)])
    assert [([e["n"] for e in m.events], m.node) for m in merged] == [([1, 2], a), ([3], b)]
    assert first.events == [{"n": 1}]  # the queued batch is not changed


class _Closing:
    name = "closing"

    def __init__(self) -> None:
        self.closed = False

    def collect(self, ctx):
        return [{"event.category": "x"}]

    def close(self) -> None:
        self.closed = True


def test_a_sensor_that_cannot_load_is_unavailable_and_the_others_run_and_close():
    closing = _Closing()

    def broken():
        raise ImportError("no pynvml")

    specs = [SensorSpec("broken", broken, "d"), SensorSpec("closing", lambda: closing, "d")]
    with SensorSet(specs) as sensors:
        broken_run, ok_run = sensors.sample(_ctx())
    assert broken_run.status["event.action"] == "unavailable"  # like any absent source
    assert "cannot load the sensor: ImportError: no pynvml" in broken_run.status["message"]
    assert ok_run.ok and len(ok_run.events) == 1 and closing.closed


def test_the_agent_pipeline_logs_an_engine_bug_with_its_traceback_and_goes_on(caplog):
    for contain in (True, False):
        pipeline = Pipeline.load(SiteConfig(), None, contain_errors=contain)

        def explode(events):
            raise RuntimeError("engine bug")

        object.__setattr__(pipeline, "engine", type("E", (), {"evaluate": staticmethod(explode)}))
        batch = SourceBatch([{"@timestamp": "2026-11-30T01:00:00Z"}], None)
        if not contain:
            with pytest.raises(RuntimeError):  # a scan fails loudly instead
                pipeline.process([batch])
            continue
        with caplog.at_level(logging.ERROR, logger="hpcsec"):
            step = pipeline.process([batch])
        assert step.alerts == [] and len(step.events) == 1
        (record,) = caplog.records
        assert record.getMessage() == (
            "rule evaluation failed on 1 events: RuntimeError: engine bug"
        )
        assert record.exc_info is not None


def test_endpoints_open_nothing_unless_asked(tmp_path):
    assert open_alert_outputs([], secret_file=None, spool_dir=None, config=SiteConfig()) is None
    outputs = open_alert_outputs(
        [], secret_file=None, spool_dir=None, config=SiteConfig(), fallback="-"
    )
    assert outputs is not None and outputs.names == ["-"]
    outputs.close()
    assert open_store(None, 30) is None
    store = open_store(str(tmp_path / "s.duckdb"), 7)
    assert store is not None and store.retention_days == 7
    store.close()

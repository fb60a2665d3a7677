"""Alerts a full disk (a real tmpfs) leaves in memory only: the sink names them (the hub does
not acknowledge their events meanwhile) and its tick writes them back to the spool about once
a second once the disk is freed, even while the receiver is down and backing off."""

from __future__ import annotations

import time

from hpcsec.detector.alerts.suppression import Decision
from hpcsec.detector.outputs.delivery import OutputSet, RetryPolicy
from hpcsec.detector.runtime.metrics import AgentMetrics
from hpcsec.detector.runtime.sink import AlertSink
from tests.detector.outputs.test_output_spool import Receiver as Destination
from tests.detector.outputs.test_output_spool import alert
from tests.tinydisk import tiny_disk

LONG_BACKOFF = RetryPolicy(base_s=60.0, cap_s=60.0)  # the next direct attempt: 30-60 s away


def test_held_alerts_are_named_and_spooled_by_a_tick_once_the_disk_is_freed(tmp_path):
    down = Destination("https://siem.example/hook")
    down.up = False
    with tiny_disk(tmp_path / "disk") as disk:
        outputs = OutputSet([down], str(disk.path / "spool"), 1 << 20, LONG_BACKOFF)
        sink = AlertSink(outputs, None, AgentMetrics())
        try:
            assert sink.unspooled_ids() == set()
            disk.fill()
            sink.emit(Decision([alert(0), alert(1)], [], [], []))
            assert sink.unspooled_ids() == {"a000", "a001"}
            assert (sink.spooled(), sink.spool_depth()) == (0, 2)
            disk.free()
            deadline = time.monotonic() + 10.0
            while sink.unspooled_ids() and time.monotonic() < deadline:
                sink.tick(time.monotonic())
                time.sleep(0.05)
            assert sink.unspooled_ids() == set()  # on disk: a crash now loses none
            assert (sink.spooled(), sink.spool_depth()) == (2, 2)
        finally:
            outputs.close()
    assert down.got == []


def test_without_outputs_nothing_is_held() -> None:
    sink = AlertSink(None, None, AgentMetrics())
    assert (sink.unspooled_ids(), sink.spooled()) == (set(), 0)

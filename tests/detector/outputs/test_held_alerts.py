"""Alerts held in memory while the spool's disk is full stay within a count and a size: a
user who fills the disk and then sets off large alerts (20 evidence events, each with a
64 KiB command line) cannot grow the agent past its memory budget."""

from __future__ import annotations

import pytest

from hpcsec.detector.alerts.builder import MAX_EVIDENCE_EVENTS
from hpcsec.detector.outputs import held
from hpcsec.detector.outputs.alertjson import alert_bytes
from hpcsec.detector.outputs.held import HeldAlerts
from tests.detector.outputs.test_output_webhook import alert
from tests.detector.outputs.test_spool_faults import disk, outputs, secret  # noqa: F401

ARGS = 64 * 1024  # the longest command line the process sensor keeps


def large(n: int) -> dict:
    """An alert as large as the builder makes them: every evidence event with the longest
    command line the sensor keeps."""
    big = alert(n)
    event = {"event.category": "process", "process.command_line": "x" * ARGS}
    big["events"] = [dict(event) for _ in range(MAX_EVIDENCE_EVENTS)]
    return big


def test_the_oldest_go_past_the_count():
    queue = HeldAlerts(max_count=3, max_bytes=1 << 30)
    assert queue.add([alert(i) for i in range(5)]) == [alert(0), alert(1)]
    assert [a["alert.id"] for a in queue] == ["a002", "a003", "a004"]
    assert queue.first() == alert(2) and len(queue) == 3


def test_the_oldest_go_past_the_size_and_the_size_follows_each_change():
    one = len(alert_bytes(alert(0)))
    queue = HeldAlerts(max_count=100, max_bytes=3 * one)
    assert queue.add([alert(i) for i in range(4)]) == [alert(0)]
    assert queue.bytes == 3 * one
    assert queue.popleft() == alert(1) and queue.bytes == 2 * one
    queue.clear()
    assert (len(queue), queue.bytes) == (0, 0)


def test_an_alert_larger_than_the_bound_alone_is_not_held_and_pushes_nothing_out():
    queue = HeldAlerts(max_count=100, max_bytes=1000)
    huge = large(0)
    assert queue.add([alert(1), huge, alert(2)]) == [huge]
    assert [a["alert.id"] for a in queue] == ["a001", "a002"]


def test_a_flood_of_low_alerts_does_not_push_out_a_critical_one():
    """Past a bound the lowest level goes first, its oldest first, as the spool lets go."""

    def at(n: int, level: str) -> dict:
        return alert(n) | {"rule.level": level}

    queue = HeldAlerts(max_count=4, max_bytes=1 << 30)
    dropped = queue.add([at(0, "low"), at(1, "critical"), at(2, "medium")])
    dropped += queue.add([at(n, "low") for n in range(3, 9)])
    assert [a["alert.id"] for a in queue] == ["a001", "a002", "a007", "a008"]
    assert [a["alert.id"] for a in dropped] == ["a000", "a003", "a004", "a005", "a006"]
    assert queue.first()["alert.id"] == "a001"  # sent in arrival order all the same
    assert queue.popleft()["alert.id"] == "a001" and len(queue) == 3


def test_large_alerts_on_a_full_disk_with_the_receiver_down_stay_within_the_memory_bound(
    disk,  # noqa: F811
    secret,  # noqa: F811
):
    """A real full tmpfs and no receiver: of 2 x 20 alerts of ~1.3 MB, what the destination
    holds stays under MAX_HELD_BYTES; the rest are dropped, oldest first, each counted."""
    size = len(alert_bytes(large(0)))
    assert size > 20 * ARGS  # as large as the builder makes them
    with outputs("http://127.0.0.1:9/hook", secret, disk) as out:
        disk.fill()
        dropped = 0
        for round_ in range(2):
            report = out.deliver([large(20 * round_ + i) for i in range(20)], timeout_s=0.1)
            (dest,) = report.destinations.values()
            dropped += dest.dropped
            assert "No space left on device" in dest.spool_error
        (lane,) = out._lanes
        kept = [a["alert.id"] for a in lane.unspooled]
        assert lane.unspooled.bytes <= held.MAX_HELD_BYTES
        assert len(kept) == held.MAX_HELD_BYTES // size
        assert kept == [f"a{n:03d}" for n in range(40 - len(kept), 40)]  # the newest
        assert dropped == 40 - len(kept)
        assert out.unspooled_ids() == set(kept)


@pytest.mark.parametrize("count", [1, 7])
def test_held_alerts_iterate_in_arrival_order(count):
    queue = HeldAlerts()
    queue.add([alert(i) for i in range(count)])
    assert [a["alert.id"] for a in queue] == [f"a{i:03d}" for i in range(count)]

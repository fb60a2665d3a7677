"""The durable spool: commit before send, order, bound and drop policy, crash leftovers."""

from __future__ import annotations

import os

import orjson
import pytest

from hpcsec.detector.core.errors import HpcsecError
from hpcsec.detector.outputs.delivery import OutputSet
from hpcsec.detector.outputs.protocol import DeliveryFailed
from hpcsec.detector.outputs.spool import Spool, SpoolError
from hpcsec.detector.outputs.spool_dir import destination_key
from hpcsec.detector.outputs.spool_notice import SPOOL_FULL_RULE_ID

DEST = "https://siem.example/hook"


def alert(n: int, level: str = "medium", pad: int = 0) -> dict:
    return {
        "alert.id": f"a{n:03d}",
        "rule.id": "r1",
        "rule.level": level,
        "count": 1,
        "events": [],
        "pad": "x" * pad,
    }


def size_of(a: dict) -> int:
    return len(orjson.dumps(a)) + 1  # one JSONL line


def drain_ids(spool: Spool) -> list[str]:
    ids = []
    while (entry := spool.next_entry()) is not None:
        ids.append(entry.alert_id)
        spool.remove(entry)
    return ids


def test_alerts_are_on_disk_in_order_and_survive_a_reopen(tmp_path):
    spool = Spool.open(tmp_path, DEST, max_bytes=1 << 20)
    spool.add_many([alert(i) for i in range(3)])
    spool.add_many([alert(i) for i in range(3, 5)])
    pending = tmp_path / destination_key(DEST) / "pending"
    segments = sorted(s for s in os.listdir(pending) if s.endswith(".jsonl"))
    assert len(segments) == 2
    assert sorted(os.listdir(pending)) == sorted(
        [*segments, *(s.replace(".jsonl", ".marks") for s in segments)]
    )
    assert [
        orjson.loads(line)["alert.id"] for line in (pending / segments[0]).read_bytes().splitlines()
    ] == ["a000", "a001", "a002"]
    assert (tmp_path / destination_key(DEST) / "destination").read_text() == DEST + "\n"
    entry = spool.next_entry()
    spool.remove(entry)  # a000 delivered: recorded in the segment's .marks
    spool.close()
    # a write torn by a crash stays in tmp/ and is not an accepted alert
    (tmp_path / destination_key(DEST) / "tmp" / "torn.jsonl").write_bytes(b'{"alert.id": "a')
    again = Spool.open(tmp_path, DEST, max_bytes=1 << 20)
    assert again.depth() == 4
    assert os.listdir(tmp_path / destination_key(DEST) / "tmp") == []
    assert drain_ids(again) == ["a001", "a002", "a003", "a004"]
    assert os.listdir(pending) == []  # fully settled segments are deleted
    assert again.bytes_used() == 0


def test_a_second_process_cannot_share_a_spool(tmp_path):
    first = Spool.open(tmp_path, DEST, max_bytes=1 << 20)
    with pytest.raises(
        SpoolError,
        match=rf"is in use by another hpcsec process \(pid "
        rf"{os.getpid()}\)",
    ) as info:
        Spool.open(tmp_path, DEST, max_bytes=1 << 20)
    assert isinstance(info.value, HpcsecError)
    first.close()
    Spool.open(tmp_path, DEST, max_bytes=1 << 20).close()  # the lock goes with its owner


def test_full_spool_evicts_lower_levels_first_and_says_so(tmp_path):
    one = size_of(alert(0, "informational"))
    spool = Spool.open(tmp_path, DEST, max_bytes=3 * one)
    assert (
        spool.add_many(
            [alert(0, "informational"), alert(1, "low"), alert(2, "informational")]
        ).dropped_ids
        == ()
    )
    admission = spool.add_many([alert(3, "high")])
    # the oldest of the lowest level goes first
    assert admission.dropped_ids == ("a000",)
    notice = admission.notice
    assert notice["rule.id"] == SPOOL_FULL_RULE_ID
    assert notice["rule.level"] == "high"
    assert notice["count"] == 1
    assert notice["hpcsec.spool.dropped_by_level"] == {"informational": 1}
    assert notice["hpcsec.spool.dropped_alert_ids"] == ["a000"]
    assert notice["hpcsec.spool.destination"] == DEST
    assert spool.bytes_used() <= 3 * one  # the notice does not count against the bound

    # an alert no higher than everything queued is refused, not queued
    second = spool.add_many([alert(4, "informational")])
    assert second.dropped_ids == ("a004",)
    assert second.notice["alert.id"] == notice["alert.id"]  # same episode, updated in place
    assert second.notice["count"] == 2
    assert second.notice["hpcsec.spool.dropped_by_level"] == {"informational": 2}
    assert spool.depth() == 4  # three alerts and one notice

    # the notice goes first; once delivered, the next drop starts a new episode
    entry = spool.next_entry()
    assert entry.alert_id == notice["alert.id"]
    assert entry.alert["count"] == 2
    spool.remove(entry)
    third = spool.add_many([alert(5, "informational")])
    assert third.notice["alert.id"] != notice["alert.id"]
    assert third.notice["count"] == 1
    assert drain_ids(spool) == [third.notice["alert.id"], "a001", "a002", "a003"]


def test_notice_survives_a_restart_and_keeps_counting(tmp_path):
    one = size_of(alert(0, "high"))
    spool = Spool.open(tmp_path, DEST, max_bytes=one)
    spool.add_many([alert(0, "high")])
    first = spool.add_many([alert(1, "high")]).notice
    spool.close()
    spool = Spool.open(tmp_path, DEST, max_bytes=one)
    later = spool.add_many([alert(2, "low")]).notice
    assert later["alert.id"] == first["alert.id"]
    assert later["count"] == 2
    assert later["hpcsec.spool.dropped_alert_ids"] == ["a001", "a002"]


def test_unreadable_spool_line_is_moved_aside_not_lost(tmp_path):
    spool = Spool.open(tmp_path, DEST, max_bytes=1 << 20)
    spool.add_many([alert(0), alert(1)])
    spool.close()
    pending = tmp_path / destination_key(DEST) / "pending"
    (segment,) = (s for s in os.listdir(pending) if s.endswith(".jsonl"))
    lines = (pending / segment).read_bytes().splitlines(keepends=True)
    (pending / segment).write_bytes(b"not json\n" + lines[1])
    spool = Spool.open(tmp_path, DEST, max_bytes=1 << 20)
    assert drain_ids(spool) == ["a001"]
    failed = tmp_path / destination_key(DEST) / "failed"
    stem = segment.removesuffix(".jsonl")
    assert (failed / f"{stem}-0.json").read_bytes() == b"not json\n"
    assert (failed / f"{stem}-0.json.reason").read_text().startswith("unreadable spool line")
    assert spool.corrupt == 1


class Receiver:
    """An in-test destination that can be switched off."""

    durable = True

    def __init__(self, name: str):
        self.name = name
        self.up = True
        self.got: list[str] = []
        self.refuse: set[str] = set()

    def send(self, a: dict) -> None:
        if not self.up:
            raise DeliveryFailed("connection refused")
        if a["alert.id"] in self.refuse:
            raise DeliveryFailed("HTTP 400 Bad Request", permanent=True)
        self.got.append(a["alert.id"])

    def close(self) -> None:
        pass


def test_output_set_keeps_what_it_cannot_deliver_and_flushes_it_later(tmp_path):
    healthy, down = Receiver("syslog+tcp://a:514"), Receiver("https://b/hook")
    down.up = False
    outputs = OutputSet([healthy, down], str(tmp_path), 1 << 20)
    report = outputs.deliver([alert(i) for i in range(3)], timeout_s=1)
    assert healthy.got == ["a000", "a001", "a002"]
    assert report.destinations["syslog+tcp://a:514"].delivered == 3
    assert report.destinations["https://b/hook"].pending == 3
    assert report.destinations["https://b/hook"].last_error == "connection refused"
    assert report.problems() == [
        f"https://b/hook: 3 alert(s) not delivered yet, kept in the spool {tmp_path} "
        "(connection refused)"
    ]
    assert not report.complete
    assert sorted((o.alert_id, o.destination, o.state) for o in report.outcomes) == [
        ("a000", "https://b/hook", "pending"),
        ("a000", "syslog+tcp://a:514", "delivered"),
        ("a001", "https://b/hook", "pending"),
        ("a001", "syslog+tcp://a:514", "delivered"),
        ("a002", "https://b/hook", "pending"),
        ("a002", "syslog+tcp://a:514", "delivered"),
    ]
    outputs.close()

    down.up = True
    down.refuse = {"a001"}
    again = OutputSet([down], str(tmp_path), 1 << 20)
    report = again.flush(timeout_s=5)
    assert down.got == ["a000", "a002"]
    d = report.destinations["https://b/hook"]
    assert (d.delivered, d.pending, d.failed) == (2, 0, 1)
    assert [(o.alert_id, o.state) for o in report.outcomes] == [
        ("a000", "delivered"),
        ("a001", "failed"),
        ("a002", "delivered"),
    ]
    again.close()


def test_output_set_reports_drops_and_the_notice(tmp_path):
    down = Receiver("https://b/hook")
    down.up = False
    one = size_of(alert(0, "low"))
    outputs = OutputSet([down], str(tmp_path), 2 * one)
    report = outputs.deliver([alert(i, "low") for i in range(3)], timeout_s=0)
    d = report.destinations["https://b/hook"]
    assert (d.pending, d.dropped) == (3, 1)  # two alerts and the notice wait
    (notice,) = report.notices
    assert notice["hpcsec.spool.dropped_alert_ids"] == ["a002"]
    assert ("a002", "dropped") in [(o.alert_id, o.state) for o in report.outcomes]
    assert report.problems()[-1] == "https://b/hook: 1 alert(s) dropped because the spool is full"
    down.up = True
    outputs.flush(timeout_s=5)
    assert down.got == [notice["alert.id"], "a000", "a001"]
    outputs.close()


def test_an_alert_with_bytes_that_are_not_utf8_is_spooled_with_escapes(tmp_path):
    # os.readlink decodes a non-UTF-8 file name with lone surrogates, which JSON cannot hold
    spool = Spool.open(tmp_path, DEST, max_bytes=1 << 20)
    odd = {**alert(0), "file.path": "/data/\udcff.bin", "process.pid": 2**70}
    assert spool.add_many([odd, alert(1)]).dropped_ids == ()
    entry = spool.next_entry()
    assert entry.alert["file.path"] == "/data/\\xff.bin"
    assert entry.alert["process.pid"] == str(2**70)
    spool.remove(entry)
    assert drain_ids(spool) == ["a001"]


def test_a_slow_receiver_keeps_the_rest_spooled_and_the_report_says_why(tmp_path):
    import time

    class Slow(Receiver):
        def send(self, a: dict) -> None:
            time.sleep(0.2)
            super().send(a)

    slow = Slow("https://b/hook")
    with OutputSet([slow], str(tmp_path), 1 << 20) as outputs:
        report = outputs.deliver([alert(i) for i in range(10)], timeout_s=0.3)
        d = report.destinations["https://b/hook"]
        assert 1 <= d.delivered < 10 and d.delivered + d.pending == 10
        assert report.problems() == [
            f"https://b/hook: {d.pending} alert(s) not delivered yet, kept in the spool "
            f"{tmp_path} (time ran out before the receiver took them)"
        ]
        assert outputs.flush(timeout_s=30).destinations["https://b/hook"].delivered == d.pending
    assert slow.got == [f"a{i:03d}" for i in range(10)]

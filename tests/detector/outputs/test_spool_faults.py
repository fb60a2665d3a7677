"""The spool on a full disk (a real 64 KiB tmpfs): it never crashes, loses or duplicates.

What cannot be spooled is sent directly and counted; a delivery is recorded in place, so a
restart does not send it again; an unreadable line is counted and reported, never fatal."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from hpcsec.detector.cli.main import main
from hpcsec.detector.config.site import SiteConfig
from hpcsec.detector.outputs.registry import open_outputs
from hpcsec.detector.outputs.spool import Spool
from hpcsec.detector.outputs.spool_dir import destination_key
from tests.detector.outputs.test_output_webhook import SECRET, Receiver, alert
from tests.rule_texts import MINER_RULE
from tests.tinydisk import TinyDisk, tiny_disk


@pytest.fixture
def disk(tmp_path):
    with tiny_disk(tmp_path / "disk") as d:
        yield d


@pytest.fixture
def secret(tmp_path):
    path = tmp_path / "secret"
    path.write_bytes(SECRET + b"\n")
    return str(path)


def outputs(url: str, secret: str, disk: TinyDisk):
    return open_outputs(
        [url], secret_file=secret, spool_dir=str(disk.path / "spool"), config=SiteConfig()
    )


def test_full_disk_sends_directly_and_a_restart_sends_nothing_twice(disk, secret):
    receiver = Receiver().start()
    try:
        with outputs(receiver.url, secret, disk) as out:
            disk.fill()
            report = out.deliver([alert(i) for i in range(10)], timeout_s=5)
            (dest,) = report.destinations.values()
            assert (dest.delivered, dest.unspooled, dest.pending) == (10, 10, 0)
            assert "No space left on device" in dest.spool_error
            assert any("could not be spooled" in line for line in report.problems())
            disk.free()
            report = out.deliver([alert(i, "b") for i in range(5)], timeout_s=5)
            assert [d.unspooled for d in report.destinations.values()] == [0]
        with outputs(receiver.url, secret, disk) as again:
            assert again.flush(timeout_s=1).outcomes == []
        assert receiver.ids() == Counter(
            [f"a{i:03d}" for i in range(10)] + [f"b{i:03d}" for i in range(5)]
        )
    finally:
        receiver.stop()


def test_full_disk_with_the_receiver_down_holds_alerts_until_it_is_back(disk, secret):
    receiver = Receiver().start()
    port = receiver.port
    receiver.stop()
    with outputs(receiver.url, secret, disk) as out:
        disk.fill()
        report = out.deliver([alert(i) for i in range(10)], timeout_s=0.2)
        assert [d.pending for d in report.destinations.values()] == [10]
        assert list(out.spool_depth().values()) == [10]
        disk.free()  # the held alerts go back to disk: a crash now loses none of them
        receiver = Receiver(port).start()
        try:
            out.flush(timeout_s=5)
            assert list(out.spool_depth().values()) == [0]
        finally:
            receiver.stop()
    assert receiver.ids() == Counter(f"a{i:03d}" for i in range(10))


def test_a_delivery_on_a_full_disk_is_recorded_and_not_sent_again(disk):
    spool = Spool.open(disk.path, "https://siem.example/hook", max_bytes=1 << 20)
    spool.add_many([alert(i) for i in range(3)])
    disk.fill()
    for _ in range(2):  # delivered while the disk is full
        spool.remove(spool.next_entry())
    spool.close()  # a crash or restart now
    again = Spool.open(disk.path, "https://siem.example/hook", max_bytes=1 << 20)
    entry = again.next_entry()
    assert (again.depth(), entry.alert_id) == (1, "a002")
    again.close()


def test_a_corrupt_spool_line_is_counted_and_reported(tmp_path, secret):
    receiver = Receiver().start()
    try:
        spool_dir = tmp_path / "spool"
        with open_outputs(
            [receiver.url], secret_file=secret, spool_dir=str(spool_dir), config=SiteConfig()
        ) as out:
            (name,) = out.names  # the URL without its secrets
        spool = Spool.open(spool_dir, name, max_bytes=1 << 20)
        spool.add_many([alert(0), alert(1)])
        spool.close()
        pending = spool_dir / destination_key(name) / "pending"
        (segment,) = pending.glob("*.jsonl")
        segment.write_bytes(b"\xff{not json\n" + segment.read_bytes().splitlines(True)[1])
        with open_outputs(
            [receiver.url], secret_file=secret, spool_dir=str(spool_dir), config=SiteConfig()
        ) as out:
            report = out.flush(timeout_s=5)
        assert [d.corrupt for d in report.destinations.values()] == [1]
        assert any("unreadable spool line" in line for line in report.problems())
        assert receiver.ids() == Counter(["a001"])
    finally:
        receiver.stop()


def test_scan_on_a_full_disk_delivers_and_exits_1_not_3(disk, secret, tmp_path, capsys):
    rules = tmp_path / "gpu_hijack.yml"
    rules.write_text(MINER_RULE)
    events = tmp_path / "e.jsonl"
    events.write_text(
        "".join(
            json.dumps(
                {
                    "@timestamp": "2026-11-30T01:00:00Z",
                    "event.category": "process",
                    "host.name": "n1",
                    "process.name": "xmrig",
                    "process.pid": 7 + i,
                    "user.name": f"mallory{i}",
                }
            )
            + "\n"
            for i in range(10)
        )
    )
    receiver = Receiver().start()
    args = [
        "scan",
        "--events",
        str(events),
        "--no-default-rules",
        "--rules",
        str(rules),
        "--output",
        receiver.url,
        "--webhook-secret-file",
        secret,
        "--spool",
        str(disk.path / "spool"),
    ]
    try:
        assert main(args) == 1  # creates the spool
        first = receiver.ids()
        assert len(first) == 10
        disk.fill()
        for _ in range(3):  # reruns on a full disk: each sends its alerts, none twice
            assert main(args) == 1
        assert "could not be spooled, sent directly" in capsys.readouterr().err
        disk.free()
        assert main(args) == 1
    finally:
        receiver.stop()
    assert set(receiver.ids()) == set(first)
    assert set(receiver.ids().values()) == {5}  # once per scan: never a leftover sent again

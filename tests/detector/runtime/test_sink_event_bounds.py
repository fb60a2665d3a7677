"""The events the agent keeps for its store are bounded by their size, not only by their
count: a node's users choose how large their events are (300 sleeping processes with 64 KiB
command lines made 38 MB of events per sample, and the agent grew to gigabytes within the
minute it waited to write them). Against a real journal and a real full tmpfs."""

from __future__ import annotations

import json
import time
from pathlib import Path

from hpcsec.detector.core.schema import new_event, rfc3339
from hpcsec.detector.runtime import sink as sink_module
from hpcsec.detector.runtime.metrics import AgentMetrics
from hpcsec.detector.runtime.sink import AlertSink
from hpcsec.detector.store.alert_store import Store
from hpcsec.detector.store.journal import JournalWriter, journal_dir
from tests.tinydisk import tiny_disk

COMMAND_LINE = "x" * 64 * 1024


def sleepers(first: int, n: int) -> list[dict]:
    """`present` events of processes with 64 KiB command lines, as alice's sleepers make."""
    return [
        new_event(
            "process",
            "present",
            "process",
            "gpu-007",
            rfc3339(),
            {"process.pid": pid, "process.command_line": COMMAND_LINE},
        )
        for pid in range(first, first + n)
    ]


def segments(store: Path) -> int:
    return len(list(journal_dir(store).iterdir()))


def test_large_events_are_written_as_soon_as_4_mib_wait_not_a_minute_later(tmp_path):
    store = tmp_path / "store.duckdb"
    sink = AlertSink(None, JournalWriter(store), AgentMetrics())
    sink.keep_events(sleepers(1, 20))  # 1.3 MiB: waits for the minute
    sink.tick(time.monotonic())
    assert segments(store) == 0
    sink.keep_events(sleepers(21, 50))  # past 4 MiB in all: written at the next tick
    sink.tick(time.monotonic())
    assert segments(store) == 1 and sink._event_lines == [] and sink._event_bytes == 0
    with Store(store, read_only=True) as db:
        assert db.count("events") == 70


def test_while_the_store_cannot_be_written_the_newest_16_mib_are_kept_the_rest_counted(
    tmp_path,
):
    with tiny_disk(tmp_path / "disk", size="64m") as disk:
        store = disk.path / "store.duckdb"
        metrics = AgentMetrics()
        sink = AlertSink(None, JournalWriter(store), metrics)
        disk.fill()
        for first in range(1, 1001, 100):  # 1,000 events, 64 MiB of JSON: four times the bound
            sink.keep_events(sleepers(first, 100))
            sink.tick(time.monotonic())  # each write fails: ENOSPC
        assert sink.store_errors >= 9
        assert sink._event_bytes <= sink_module.MAX_BUFFERED_BYTES
        kept = len(sink._event_lines)
        assert 200 < kept < 260 and sink.events_dropped == 1000 - kept
        assert metrics.store_events_dropped._value.get() == 1000 - kept
        faults = [message for _, _, message, _ in sink.take_health()]
        assert any("event(s) let go so far" in m for m in faults)
        disk.free()
        sink.flush_store()
        with Store(store, read_only=True) as db, db._connect() as con:  # the newest, once
            docs = con.execute("SELECT doc FROM events").fetchall()
    pids = sorted(json.loads(doc)["process.pid"] for (doc,) in docs)
    assert pids == list(range(1001 - kept, 1001))

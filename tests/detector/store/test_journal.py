"""The store's journal: segments the agent appends, applied in order by the store, once."""

from __future__ import annotations

import os
import shutil
import stat
from datetime import UTC, datetime, timedelta

import pytest

from hpcsec.detector.store.alert_store import AlertQuery, Store
from hpcsec.detector.store.journal import (
    JournalWriter,
    StoreError,
    encode_records,
    journal_dir,
)


def stamp(ago: timedelta = timedelta(0)) -> str:
    return (datetime.now(UTC) - ago).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def event(n: int, ago: timedelta = timedelta(0)) -> dict:
    return {"event.id": f"e{n}", "@timestamp": stamp(ago), "event.category": "process"}


def alert(aid: str, count: int = 1) -> dict:
    return {"alert.id": aid, "@timestamp": stamp(), "rule.id": "r", "count": count}


def test_segments_are_private_and_applied_in_order_once(tmp_path):
    path = tmp_path / "alerts.duckdb"
    writer = JournalWriter(path)
    writer.append(
        encode_records(
            [event(1), event(2)],
            [([alert("a1")], "silenced", "quiet hours")],
            [("a1", "webhook", "pending", "refused")],
        )
    )
    writer.append(  # dedup grew the count; the delivery went through: the later record wins
        encode_records(
            [event(2)], [([alert("a1", 3)], "sent", "")], [("a1", "webhook", "delivered", "")]
        )
    )
    jdir = journal_dir(path)
    assert stat.S_IMODE(jdir.stat().st_mode) == 0o700
    assert [stat.S_IMODE(p.stat().st_mode) for p in sorted(jdir.iterdir())] == [0o600, 0o600]
    with Store(path, read_only=True) as store:
        (got,) = store.query_alerts(AlertQuery())
        assert (got["count"], got["hpcsec.disposition"]) == (3, "sent")
        assert got["hpcsec.deliveries"] == {"webhook": "delivered"}
        assert store.count("events") == 2
    assert list(jdir.iterdir()) == []


def test_a_crash_mid_segment_loses_nothing_committed_and_applies_nothing_twice(tmp_path):
    path = tmp_path / "alerts.duckdb"
    writer = JournalWriter(path)
    first = writer.append(encode_records([event(1)], [([alert("a1", 2)], "sent", "")], []))
    jdir = journal_dir(path)
    kept = tmp_path / "kept"
    shutil.copy(jdir / str(first), kept)
    # A writer killed while writing its next segment leaves its temp file, cut mid-line.
    partial = encode_records([event(9)], [([alert("a9")], "sent", "")], [])
    (jdir / ".tmp-999-2").write_bytes(partial[: len(partial) // 2])
    with Store(path) as store:
        assert (store.count("events"), store.count("alerts")) == (1, 1)
    assert [p.name for p in jdir.iterdir()] == [".tmp-999-2"]  # not a segment: left alone
    # The applier died after its commit, before its delete: the segment comes back.
    shutil.copy(kept, jdir / str(first))
    with Store(path, read_only=True) as store:
        (got,) = store.query_alerts(AlertQuery())
        assert (store.count("events"), store.count("alerts"), got["count"]) == (1, 1, 2)
    JournalWriter(path).close()  # the next agent start removes the dead writer's temp file
    assert list(jdir.iterdir()) == []


def test_the_next_writer_continues_after_unapplied_segments(tmp_path):
    path = tmp_path / "alerts.duckdb"
    JournalWriter(path).append(encode_records([], [([alert("a1")], "silenced", "x")], []))
    JournalWriter(path).append(encode_records([], [([alert("a1", 5)], "sent", "")], []))
    with Store(path, read_only=True) as store:
        (got,) = store.query_alerts(AlertQuery())
        assert (got["count"], got["hpcsec.disposition"]) == (5, "sent")


def test_retention_is_applied_with_the_segments(tmp_path):
    path = tmp_path / "alerts.duckdb"
    JournalWriter(path).append(
        encode_records([event(1, timedelta(days=40)), event(2, timedelta(days=1))], [], [])
    )
    with Store(path, retention_days=30) as store:
        assert store.count("events") == 1


def test_damaged_records_are_skipped_not_fatal(tmp_path):
    path = tmp_path / "alerts.duckdb"
    writer = JournalWriter(path)
    name = writer.append(encode_records([event(1)], [], []))
    seg = journal_dir(path) / str(name)
    seg.write_bytes(
        seg.read_bytes() + b'{"not": "a record"}\n["a", "bogus", "", "", {}]\n["e"]\n\xff\xfe\n'
    )
    with Store(path) as store:
        assert (store.count("events"), store.count("alerts")) == (1, 0)


@pytest.mark.parametrize("problem", ["symlink", "open_mode"])
def test_a_journal_directory_that_is_not_private_is_refused(tmp_path, problem):
    path = tmp_path / "alerts.duckdb"
    jdir = journal_dir(path)
    if problem == "symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        jdir.symlink_to(tmp_path / "elsewhere")
    else:
        jdir.mkdir()
        jdir.chmod(0o755)
    with pytest.raises(StoreError, match="store journal"):
        JournalWriter(path)
    assert not os.path.exists(tmp_path / "elsewhere" / "00000000000000000001.jsonl")

"""The alert store and the agent's journal on a full disk (a real tmpfs): a failed write is a
StoreError the agent counts and retries, never a DuckDB exception that ends the process, and
nothing written before is lost or applied twice."""

from __future__ import annotations

import pytest

from hpcsec.detector.store.alert_store import Store, StoreError
from hpcsec.detector.store.journal import JournalWriter, encode_records, journal_dir
from tests.tinydisk import tiny_disk


def alert(n: int) -> dict:
    return {"alert.id": f"a{n}", "rule.id": "r", "rule.level": "high", "alert.summary": "x" * 1000}


def test_a_full_disk_is_a_store_error_and_the_rows_go_in_once_freed(tmp_path):
    with tiny_disk(tmp_path / "disk", size="2m") as disk:
        path = disk.path / "alerts.duckdb"
        Store(path)  # created while there is room
        disk.fill()
        store = Store(path, lock_wait_s=0.1)
        with pytest.raises(StoreError, match="cannot write to alert store"):
            store.insert_alerts([alert(i) for i in range(100)])
        disk.free()
        assert store.insert_alerts([alert(i) for i in range(100)]) == 100
        assert store.count("alerts") == 100


def test_a_full_disk_leaves_no_journal_segment_and_the_retry_goes_in_once(tmp_path):
    """The agent's side: a segment that cannot be written leaves nothing behind (no segment,
    no temp file); the agent keeps the records, and once there is room they are applied once."""
    with tiny_disk(tmp_path / "disk", size="2m") as disk:
        path = disk.path / "alerts.duckdb"
        writer = JournalWriter(path)
        data = encode_records([], [([alert(i) for i in range(100)], "sent", "")], [])
        disk.fill()
        with pytest.raises(StoreError, match="cannot write to store journal"):
            writer.append(data)
        assert list(journal_dir(path).iterdir()) == []
        disk.free()
        writer.append(data)
        with Store(path, read_only=True) as store:
            assert store.count("alerts") == 100


def test_a_full_disk_while_applying_keeps_the_segments_for_the_next_open(tmp_path):
    with tiny_disk(tmp_path / "disk", size="4m") as disk:
        path = disk.path / "alerts.duckdb"
        Store(path).close()  # created while there is room
        writer = JournalWriter(path)
        for n in range(3):
            writer.append(
                encode_records([], [([alert(100 * n + i) for i in range(100)], "sent", "")], [])
            )
        disk.fill()
        with pytest.raises(StoreError):
            Store(path, lock_wait_s=0.1)
        assert len(list(journal_dir(path).iterdir())) >= 1  # what did not go in is still there
        disk.free()
        with Store(path, read_only=True) as store:
            assert store.count("alerts") == 300
        assert list(journal_dir(path).iterdir()) == []

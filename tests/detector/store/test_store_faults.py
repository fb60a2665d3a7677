"""The alert store on a full disk (a real tmpfs): a failed write is a StoreError the agent
counts and retries, never a DuckDB exception that ends the process."""

from __future__ import annotations

import pytest

from hpcsec.detector.store.alert_store import Store, StoreError
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

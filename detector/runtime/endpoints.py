"""Where alerts end up: the one place the runtime opens outputs and the alert store.

The runtime imports the outputs package here and nowhere else, so moving the output registry
or the delivery types is a change to this file only.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from hpcsec.detector.config.site import SiteConfig
from hpcsec.detector.outputs.delivery import (
    DeliveryOutcome,
    DeliveryReport,
    DestinationReport,
    OutputSet,
)
from hpcsec.detector.outputs.registry import open_outputs
from hpcsec.detector.store.journal import JournalWriter

if TYPE_CHECKING:  # duckdb is imported only by commands that open a store (start-up time)
    from hpcsec.detector.store.alert_store import Store

__all__ = [
    "DeliveryOutcome",
    "DeliveryReport",
    "DestinationReport",
    "OutputSet",
    "file_stamp",
    "open_alert_outputs",
    "open_store",
    "open_store_journal",
]


def open_alert_outputs(
    urls: Sequence[str],
    *,
    secret_file: str | None,
    spool_dir: str | None,
    config: SiteConfig,
    fallback: str | None = None,
    private_secret: bool = False,
) -> OutputSet | None:
    """The OutputSet for `urls` (command line first, else the config's outputs), opened before
    anything runs so a bad URL or secret fails at once. With no URL at all: `fallback`
    (the agent's stdout, the journal under systemd), or None (the scan prints alerts)."""
    chosen = list(urls or config.outputs or ([fallback] if fallback else []))
    if not chosen:
        return None
    return open_outputs(
        chosen,
        secret_file=secret_file,
        spool_dir=spool_dir,
        config=config,
        private_secret=private_secret,
    )


def open_store(path: str | None, retention_days: int, lock_wait_s: float = 5.0) -> Store | None:
    """The DuckDB alert store at `path`, or None when no store is configured."""
    if not path:
        return None
    from hpcsec.detector.store.alert_store import Store  # see TYPE_CHECKING above

    return Store(path, retention_days=retention_days, lock_wait_s=lock_wait_s)


def open_store_journal(path: str | None, retention_days: int) -> JournalWriter | None:
    """The agent's writer for the store at `path` (its journal; no DuckDB in the agent), or
    None when no store is configured."""
    if not path:
        return None
    return JournalWriter(path, retention_days=retention_days)


def file_stamp(path: str | None) -> tuple[object, ...]:
    """Identity of a file's content for "did it change": a rotated secret reopens outputs."""
    if not path:
        return (None,)
    try:
        st = os.stat(path)
    except OSError:
        return (path, None)
    return (path, st.st_ino, st.st_mtime_ns, st.st_size)

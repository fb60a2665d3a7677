"""The `spool full` notice: one alert per episode that counts what a full spool dropped.

It is an alert like any other (so it reaches the same receivers and the store), kept at the
front of its destination's queue and rewritten in place while it waits.
"""

from __future__ import annotations

import hashlib
import socket
import time
from collections.abc import Mapping, Sequence
from typing import Any

from hpcsec.detector.core.schema import LEVELS

SPOOL_FULL_RULE_ID = "hpcsec-spool-full"
MAX_IDS_IN_NOTICE = 100


def new_notice(destination: str, now: str) -> dict[str, Any]:
    """A notice for a new episode, raised at `now`: nothing counted yet."""
    episode = f"{destination}\x1f{time.time_ns()}"
    return {
        "alert.id": hashlib.sha256(episode.encode()).hexdigest()[:32],
        "@timestamp": now,
        "rule.id": SPOOL_FULL_RULE_ID,
        "rule.title": "Alert spool full: alerts were dropped",
        "rule.level": "high",
        "rule.tags": [],
        "rule.vector": "hpcsec",
        "host.name": socket.gethostname(),
        "events": [],
        "count": 0,
        "alert.first_seen": now,
        "hpcsec.spool.destination": destination,
        "hpcsec.spool.dropped_by_level": {},
        "hpcsec.spool.dropped_alert_ids": [],
    }


def with_drops(
    notice: Mapping[str, Any],
    dropped: Sequence[tuple[str, int]],
    *,
    destination: str,
    max_bytes: int,
    now: str,
) -> dict[str, Any]:
    """`notice` (not changed) with `dropped` (alert id, level index) counted in."""
    by_level = dict(notice["hpcsec.spool.dropped_by_level"])
    ids = list(notice["hpcsec.spool.dropped_alert_ids"])
    for alert_id, level in dropped:
        by_level[LEVELS[level]] = by_level.get(LEVELS[level], 0) + 1
        if len(ids) < MAX_IDS_IN_NOTICE:
            ids.append(alert_id)
    total = notice["count"] + len(dropped)
    return {
        **notice,
        "count": total,
        "alert.last_seen": now,
        "hpcsec.spool.dropped_by_level": by_level,
        "hpcsec.spool.dropped_alert_ids": ids,
        "hpcsec.spool.max_bytes": max_bytes,
        "alert.summary": f"spool for {destination} is full "
        f"({max_bytes} bytes): {total} alert(s) dropped "
        f"({', '.join(f'{k} {v}' for k, v in by_level.items())}); "
        "they are in the alert store",
    }

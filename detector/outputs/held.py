"""Alerts held in memory while a destination's spool cannot take them (its disk is full).

They wait there, are sent directly and go back to disk once it takes them (delivery.py). A
full disk is something a node's user can bring about (the spool may share a filesystem with
/tmp or /var), and an alert can be large: up to MAX_EVIDENCE_EVENTS events, each with a
command line of up to 64 KiB (465 KB of JSON when its bytes are control characters). Bounded
by count alone, 10,000 such alerts were gigabytes, and the agent's unit allows it 256 MB. So
they are bounded by their size too (their JSON, as the spool would write it). Past either
bound an alert goes as the spool would let it go: the lowest level first, the oldest of that
level first (spool.eviction_rank), so a flood of low alerts cannot push out a critical one.
An alert larger than the whole size bound is not held at all (and pushes nothing out).
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterable, Iterator

from hpcsec.detector.core.fields import LEVELS
from hpcsec.detector.outputs.alertjson import alert_bytes
from hpcsec.detector.outputs.protocol import Alert
from hpcsec.detector.outputs.spool import eviction_rank

MAX_HELD = 10_000  # alerts per destination held in memory while the spool cannot be written
# and at most this much of their JSON: held as dicts they take about four times as much,
# ~16 MB per destination, within the agent's 80 MB budget with the two a node usually has
MAX_HELD_BYTES = 4 * 2**20

_Entry = tuple[int, Alert, int]  # (arrival number, alert, size of its JSON)


class HeldAlerts:
    """Alerts in arrival order (`first`, `popleft`, iteration), within `max_count` and
    `max_bytes`, let go by level and age when past either."""

    def __init__(self, max_count: int = MAX_HELD, max_bytes: int = MAX_HELD_BYTES):
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.bytes = 0
        self._count = 0
        self._arrived = 0
        self._by_rank: list[deque[_Entry]] = [deque() for _ in LEVELS]

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[Alert]:
        return (alert for _, alert, _ in heapq.merge(*self._by_rank, key=lambda e: e[0]))

    def add(self, alerts: Iterable[Alert]) -> list[Alert]:
        """Hold `alerts` after the others; returns those let go to stay within the bounds
        (and any too large to hold at all)."""
        dropped: list[Alert] = []
        for alert in alerts:
            size = len(alert_bytes(alert))
            if size > self.max_bytes:
                dropped.append(alert)
                continue
            self._arrived += 1
            self._by_rank[eviction_rank(alert)].append((self._arrived, alert, size))
            self._count += 1
            self.bytes += size
            while self._count > self.max_count or self.bytes > self.max_bytes:
                lowest = next(q for q in self._by_rank if q)
                dropped.append(self._taken(lowest))
        return dropped

    def first(self) -> Alert:
        return self._oldest()[0][1]

    def popleft(self) -> Alert:
        return self._taken(self._oldest()[1])

    def clear(self) -> None:
        for queue in self._by_rank:
            queue.clear()
        self._count = self.bytes = 0

    def _oldest(self) -> tuple[_Entry, deque[_Entry]]:
        return min(((q[0], q) for q in self._by_rank if q), key=lambda pair: pair[0][0])

    def _taken(self, queue: deque[_Entry]) -> Alert:
        _, alert, size = queue.popleft()
        self._count -= 1
        self.bytes -= size
        return alert

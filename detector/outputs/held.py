"""Alerts held in memory while a destination's spool cannot take them (its disk is full).

They wait there, are sent directly and go back to disk once it takes them (delivery.py). A
full disk is something a node's user can bring about (the spool may share a filesystem with
/tmp or /var), and an alert can be large: up to MAX_EVIDENCE_EVENTS events, each with a
command line of up to 64 KiB, about 1.3 MB. Bounded by count alone, 10,000 such alerts
would be 13 GB, and the agent's unit allows it 256 MB. So they are bounded by their size too
(their JSON, as the spool would write it): past either bound the oldest go, each counted
as dropped by the caller.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator

from hpcsec.detector.outputs.alertjson import alert_bytes
from hpcsec.detector.outputs.protocol import Alert

MAX_HELD = 10_000  # alerts per destination held in memory while the spool cannot be written
# and at most this much of their JSON: held as dicts they take about four times as much,
# ~16 MB per destination, within the agent's 80 MB budget with the two a node usually has
MAX_HELD_BYTES = 4 * 2**20


class HeldAlerts:
    """Alerts in arrival order, with the size of each, within `max_count` and `max_bytes`."""

    def __init__(self, max_count: int = MAX_HELD, max_bytes: int = MAX_HELD_BYTES):
        self.max_count = max_count
        self.max_bytes = max_bytes
        self.bytes = 0
        self._held: deque[tuple[Alert, int]] = deque()

    def __len__(self) -> int:
        return len(self._held)

    def __iter__(self) -> Iterator[Alert]:
        return (alert for alert, _ in self._held)

    def add(self, alerts: Iterable[Alert]) -> list[Alert]:
        """Hold `alerts` after the others; returns those let go to stay within the bounds,
        oldest first (an alert larger than `max_bytes` alone is let go at once)."""
        for alert in alerts:
            size = len(alert_bytes(alert))
            self._held.append((alert, size))
            self.bytes += size
        dropped: list[Alert] = []
        while self._held and (len(self._held) > self.max_count or self.bytes > self.max_bytes):
            dropped.append(self.popleft())
        return dropped

    def first(self) -> Alert:
        return self._held[0][0]

    def popleft(self) -> Alert:
        alert, size = self._held.popleft()
        self.bytes -= size
        return alert

    def clear(self) -> None:
        self._held.clear()
        self.bytes = 0

"""Dedup for a process that never ends: the alert builder's state, dropped window by window."""

from __future__ import annotations

import time
from collections.abc import Callable

from hpcsec.detector.alerts.builder import AlertBuilder
from hpcsec.detector.alerts.model import Alert
from hpcsec.detector.core.schema import parse_time
from hpcsec.detector.engine.evaluate import Match


class WindowedDedup:
    """The AlertBuilder of a process that never ends: dedup state is dropped window by window.

    Dedup folds matches per window of event time (`dedup_window_s`), and alert ids are per
    window, so an ended window's open alerts can only grow by late matches. At each window
    boundary the builder becomes `previous` (which still takes matches whose event time is in
    an earlier window: a sample that straddled the boundary) and a fresh one takes the rest;
    the one before is forgotten. Memory: two windows of open alerts. A run that never calls
    `rotate` (a scan) keeps every alert open: that is the scan's dedup.
    """

    def __init__(self, window_s: int, clock: Callable[[], float] = time.time, dedup: bool = True):
        self.window_s = max(int(window_s), 1)
        self.dedup = dedup
        self._clock = clock
        self.builder = self._new_builder()
        self.previous: AlertBuilder | None = None
        self.window = self._window_of(self._clock())

    def _new_builder(self) -> AlertBuilder:
        return AlertBuilder(dedup=self.dedup, window_s=self.window_s)

    def _window_of(self, epoch: float) -> int:
        return int(epoch // self.window_s)

    def rotate(self) -> list[Alert]:
        """Start a new window when the clock passed a boundary; returns the forgotten
        builder's alerts (their final values, for the store)."""
        window = self._window_of(self._clock())
        if window <= self.window:
            return []
        forgotten = self.previous.alerts() if self.previous is not None else []
        self.previous = self.builder
        self.builder = self._new_builder()
        self.window = window
        return forgotten

    def _late(self, match: Match) -> bool:
        if match.window_start is not None:  # correlations: ids by their own window
            return False
        try:
            when = parse_time(str(match.events[0].get("@timestamp"))).timestamp()
        except ValueError:
            return False
        return self._window_of(when) < self.window

    def add(self, matches: list[Match]) -> list[Alert]:
        """Fold matches in; returns the new alerts."""
        if self.previous is None:
            return self.builder.add(matches)
        late = [m for m in matches if self._late(m)]
        if not late:
            return self.builder.add(matches)
        current = [m for m in matches if not self._late(m)]
        return self.previous.add(late) + self.builder.add(current)

    def take_grown(self) -> list[Alert]:
        """Current values of the open alerts that grew since the last call, oldest first."""
        earlier = self.previous.take_grown() if self.previous is not None else []
        return earlier + self.builder.take_grown()

    def alerts(self) -> list[Alert]:
        """The current value of every alert still open, oldest window first."""
        return (self.previous.alerts() if self.previous is not None else []) + self.builder.alerts()

"""When to start the fanotify responder again after it died.

A dead responder leaves the agent blind to every open of a protected file, so it is started
again at once, then after growing pauses: the first restart of a minute waits
`FIRST_DELAY_S`, each further one twice as long, and at most `MAX_PER_MINUTE` restarts are
made in any minute. A responder that cannot live (a kernel refusing fanotify, a crash at each
start) thus costs a few process starts a minute, never a busy loop on a node under attack.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

MAX_PER_MINUTE = 5
FIRST_DELAY_S = 0.1
MAX_DELAY_S = 30.0
WINDOW_S = 60.0


class RestartPolicy:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.clock = clock
        self._starts: deque[float] = deque()  # restart attempts within the last minute
        self.due_at: float | None = None  # when the next attempt may be made; None: none due

    def lost(self) -> None:
        """The responder is gone: schedule the next attempt."""
        now = self.clock()
        while self._starts and self._starts[0] <= now - WINDOW_S:
            self._starts.popleft()
        recent = len(self._starts)
        delay = min(FIRST_DELAY_S * 2**recent, MAX_DELAY_S)
        if recent >= MAX_PER_MINUTE:  # wait until the oldest attempt leaves the minute
            delay = max(delay, self._starts[0] + WINDOW_S - now)
        self.due_at = now + delay

    def wait_ms(self) -> int:
        """How long the reader may sleep before the next attempt (-1: none is due)."""
        if self.due_at is None:
            return -1
        return max(0, int((self.due_at - self.clock()) * 1000) + 1)

    def take(self) -> bool:
        """True (and counted) when an attempt is due now."""
        now = self.clock()
        if self.due_at is None or now < self.due_at:
            return False
        self.due_at = None
        self._starts.append(now)
        return True

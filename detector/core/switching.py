"""Quick thread switches while a thread that waits on I/O must not wait for one that computes.

A process pool's tasks and results pass through threads of the calling process (the pool's
manager thread, its queue's feeder thread), each needing the GIL several times per task: to
pickle, after each write or read of a pipe (a result larger than the pipe's 64 KiB takes
several), to hand the result over. While the caller's main thread computes in Python, each of
those waits out the interpreter's switch interval (5 ms by default) before it gets the GIL,
and a worker whose result cannot be written meanwhile sits idle (a cold rule load through a
pool left its worker idle most of the time). With a 0.5 ms interval the pool's threads get
their turn at once and the worker does its share; a thread that holds the GIL is asked to let
go only when another one waits. That is not free for a thread that computes while the pool's
threads are busy: a rule load's caller parsed 40% slower so, and a cold rule load now shares
its files with its workers without a pool (engine/coldpool.py).

The agent's file-access watch keeps them quick while it runs (sensors/file_access/fanwatch.py):
an open of a protected file waits for its reader thread, which at 5 ms a turn took 16 ms at
the median while another thread of the agent computed (bench/file_access.py).
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator

QUICK_SWITCH_S = 0.0005


class _Interval:
    """The switch interval shortened while any user needs it, put back after the last one
    (users in several threads at once)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0
        self.saved: float | None = None  # the interval to put back, when it was changed

    def enter(self) -> None:
        with self.lock:
            if self.users == 0 and sys.getswitchinterval() > QUICK_SWITCH_S:
                # left alone when shorter already: the interpreter keeps whole microseconds,
                # and setting what it reads back can shorten it by one
                self.saved = sys.getswitchinterval()
                sys.setswitchinterval(QUICK_SWITCH_S)
            self.users += 1

    def leave(self) -> None:
        with self.lock:
            self.users -= 1
            if self.users == 0 and self.saved is not None:
                sys.setswitchinterval(self.saved)
                self.saved = None


_INTERVAL = _Interval()


@contextlib.contextmanager
def quick_thread_switches() -> Iterator[None]:
    """The switch interval at most QUICK_SWITCH_S within the block, as it was after it."""
    _INTERVAL.enter()
    try:
        yield
    finally:
        _INTERVAL.leave()

"""Event-time order for correlations, whatever order the events arrive in.

Sensors, threads and nodes merge into one stream, so arrival order is never event order. The
engine does not feed a correlation as matches arrive: it holds them in a min-heap keyed by
event time (`@timestamp`) and hands them on, oldest first, once the watermark has passed them
by the allowed lateness. Each correlation then sees its events in event-time order, so every
arrival order of the same events (within the lateness) gives the same alerts.

- `lateness=None`: nothing is handed on before `drain()` (the end of the input): `scan` puts
  its whole input in order. Only matches of rules that feed correlations are held, not every
  event.
- `lateness=L`: held until the watermark is L seconds past them. The watermark is the newest
  event time seen, or the caller's clock when one is given (a live agent: an idle stream still
  moves time on, and an event stamped in the future cannot move it). A match older than what
  was already handed on is late: counted, never added.

Events with the same time are put in order by `event.id` (a hash of their fields), or by their
whole content when they have none, never by arrival. At most `max_pending` matches, and at
most `max_bytes` of their events (as JSON), are held; beyond either the oldest is handed on
early (counted as `forced`): memory stays bounded, by count and by size. A node's process
can make its events long (a command line of a million arguments is half a megabyte once the
sensor has condensed it): held by count alone, 200,000 of them would be a hundred gigabytes.

With `lateness=None` nothing is due before the end, so the matches are kept in arrival order and
sorted once by `drain()` (the same order the heap gives: the keys are unique): an input mostly in
time order sorts in about one comparison per match, where a heap costs a log-n sift per push and
pop. The list becomes a heap only if `max_pending` forces matches out early.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Callable, Iterator
from typing import Any

import orjson

Clock = Callable[[], float]
MAX_PENDING = 200_000  # matches held at most (the default of ReorderBuffer)
# their events' JSON at most: ~1 GB of Python dicts; 200,000 typical events are ~120 MiB
MAX_PENDING_BYTES = 256 * 2**20
# a live stream's (the agent's) at most: it holds matches for seconds, and the agent's whole
# memory budget is 80 MB. Held as dicts, events take about four times their JSON (16 MiB of
# 476-byte process events: 66 MB, by tracemalloc): this is ~16 MB of them. A burst past it
# goes on early; a match older than those is then late, counted and reported.
MAX_LIVE_BYTES = 4 * 2**20
UNSIZED = 4096  # the size counted for an event orjson cannot write (never from JSON input)


def tiebreak(event: dict[str, Any]) -> str:
    """A total order among events of one instant that does not depend on arrival."""
    ident = event.get("event.id")
    if ident.__class__ is str:
        return ident
    return json.dumps(event, sort_keys=True, default=repr, ensure_ascii=True)


def event_size(event: dict[str, Any]) -> int:
    """The length of `event` as JSON: what holding it costs, within a small factor (one C
    call; read only for the matches a correlation needs)."""
    try:
        return len(orjson.dumps(event))
    except (TypeError, orjson.JSONEncodeError):
        return UNSIZED


class ReorderBuffer:
    def __init__(
        self,
        lateness: float | None,
        clock: Clock | None = None,
        max_pending: int | None = None,
        max_bytes: int | None = None,
    ):
        self.lateness = lateness
        self.clock = clock
        self.max_pending = MAX_PENDING if max_pending is None else max_pending
        if max_bytes is None:
            max_bytes = MAX_PENDING_BYTES if lateness is None else MAX_LIVE_BYTES
        self.max_bytes = max_bytes
        self.bytes = 0  # the held events' sizes (event_size)
        self.watermark = float("-inf")  # newest event time seen (or the clock)
        self.released = float("-inf")  # event time up to which matches were handed on
        self.late = 0  # matches older than `released` when they arrived: not correlated
        self.forced = 0  # matches handed on early because `max_pending` were held
        self._heap: list[tuple[float, str, int, int, Any]] = []  # (time, tie, seq, size, _)
        # arrival order, sorted at drain (lateness None, until max_pending forces a heap)
        self._unordered = lateness is None
        self._seq = 0

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, t: float, event: dict[str, Any], payload: Any) -> bool:
        """Hold one match; False (and counted) when it is later than the allowance."""
        if t < self.released:
            self.late += 1
            return False
        if t > self.watermark and self.clock is None:
            self.watermark = t
        self._seq += 1
        size = event_size(event)
        self.bytes += size
        entry = (t, tiebreak(event), self._seq, size, payload)
        if self._unordered:
            self._heap.append(entry)
        else:
            heapq.heappush(self._heap, entry)
        return True

    def due(self) -> Iterator[tuple[float, Any]]:
        """(time, payload) of the matches the watermark has passed by the lateness, oldest
        first (and of the oldest beyond `max_pending`)."""
        heap = self._heap
        if self.clock is not None:
            self.watermark = max(self.watermark, self.clock())
        if self._unordered:
            if len(heap) <= self.max_pending and self.bytes <= self.max_bytes:
                return  # nothing is due before drain()
            heapq.heapify(heap)
            self._unordered = False
        edge = float("-inf") if self.lateness is None else self.watermark - self.lateness
        while heap and (
            heap[0][0] <= edge or len(heap) > self.max_pending or self.bytes > self.max_bytes
        ):
            if heap[0][0] > edge:
                self.forced += 1
            t, _, _, size, payload = heapq.heappop(heap)
            self.bytes -= size
            if t > self.released:
                self.released = t
            yield t, payload
        if edge > self.released:
            self.released = edge

    def drain(self) -> Iterator[tuple[float, Any]]:
        """Everything held, oldest first: the end of the input."""
        heap = self._heap
        if self._unordered:
            yield from self._drain_sorted()
            return
        while heap:
            t, _, _, size, payload = heapq.heappop(heap)
            self.bytes -= size
            if t > self.released:
                self.released = t
            yield t, payload

    def _drain_sorted(self) -> Iterator[tuple[float, Any]]:
        """drain() of the arrival-ordered list: sorted newest first once, then taken from the
        end, so that each match is let go once handed on, as heappop does."""
        heap = self._heap
        heap.sort(reverse=True)
        while heap:
            t, _, _, size, payload = heap.pop()
            self.bytes -= size
            if t > self.released:
                self.released = t
            yield t, payload

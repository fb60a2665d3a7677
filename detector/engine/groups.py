"""What a correlation keeps per group, and how events are keyed and timed for it.

correlate.py decides windows; this module holds the per-group containers it fills, the
group key read from an event, and event time (`@timestamp`) as seconds.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from hpcsec.detector.core.schema import rfc3339


@dataclass
class EngineStats:
    rule_hits: int = 0  # detection rule matches, including those that only feed correlations
    evicted_groups: int = 0  # correlation groups dropped because max_groups were open
    untimed_events: int = 0  # events without a readable @timestamp (correlations skip them)
    late_events: int = 0  # events too old for their group's window (see Correlation.feed)


@dataclass(frozen=True)
class Fired:
    """A correlation that fired: what the engine turns into a Match and feeds to chains."""

    key: tuple[Any, ...]
    events: tuple[dict[str, Any], ...]
    window_start: float
    time: float  # event time of the event that completed it
    value: float


class Group:
    """One group's window state. Tens of thousands of groups may be open, so only the
    container its correlation type needs is made; the others stay None."""

    __slots__ = (
        "buckets",
        "chain",
        "count",
        "last",
        "reached_at",
        "sample",
        "seen",
        "start",
        "times",
        "values",
    )

    def __init__(self, start: float, kind: str, sources: int, sample_size: int):
        self.start = start  # first event of the window (closing windows) or of the group
        self.last = start
        self.count = 0
        # the most recent events, as evidence of what made the group fire
        # (positional: deque parses a keyword argument at some cost, once per new group)
        self.sample: deque[tuple[float, dict[str, Any]]] = deque((), sample_size)  # noqa: RUF037
        # value_count: distinct value -> its last-seen time, in last-seen order
        self.values: dict[Any, float] | None = None
        # temporal: source rule -> its last-seen time
        self.seen: dict[int, float] | None = None
        # temporal_ordered: chain[i] = start of the latest in-order chain that reached rule i,
        # reached_at[i] = event time of that chain's step i
        self.chain: list[float | None] | None = None
        self.reached_at: list[float] | None = None
        # value_sum / value_avg: [start time, sum, count] per time bucket
        self.buckets: deque[list[float]] | None = None
        # event_count: times of the last events in the window
        self.times: deque[float] | None = None
        # one test per kind (a group is made for most events a correlation sees)
        if kind == "temporal":
            self.seen = {}
        elif kind == "value_count":
            self.values = {}
        elif kind == "event_count":
            self.times = deque()
        elif kind == "temporal_ordered":
            self.chain = [None] * sources
            self.reached_at = [float("inf")] * sources
        elif kind in ("value_sum", "value_avg"):
            self.buckets = deque()


def hashable(value: Any) -> Any:
    """Group keys and distinct values from JSON values (lists and objects included)."""
    if isinstance(value, list | tuple):
        return tuple(hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((str(k), hashable(v)) for k, v in value.items()))
    return value


def group_key(fields: tuple[str, ...]) -> Callable[[dict[str, Any]], tuple[Any, ...]]:
    """The event's group-by values (None where absent); one or two fields (the usual) without
    building a map object per event."""
    if len(fields) == 1:
        (first,) = fields
        return lambda event: (event.get(first),)
    if len(fields) == 2:
        first, second = fields
        return lambda event: (event.get(first), event.get(second))
    return lambda event: tuple(map(event.get, fields))


def epoch(timestamp: Any) -> float | None:
    """Event time in seconds, from an RFC 3339 `@timestamp`; None when it cannot be read."""
    if timestamp.__class__ is not str:
        return None
    try:
        moment = datetime.fromisoformat(timestamp)  # 3.11 reads a trailing Z itself
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def timestamp_text(seconds: float) -> str:
    return rfc3339(datetime.fromtimestamp(seconds, UTC))

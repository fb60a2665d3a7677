"""The reorder buffer's order and cost: held matches come out oldest first, ties by their
tiebreak and then arrival, the same with lateness None (sorted once at drain) as on a heap."""

from __future__ import annotations

import random
from typing import Any

import orjson

from hpcsec.detector.engine.reorder import (
    MAX_LIVE_BYTES,
    MAX_PENDING_BYTES,
    UNSIZED,
    ReorderBuffer,
    event_size,
)


class CountedTime(float):
    """An event time that counts the comparisons between two held matches' times (not
    those with the buffer's watermark, plain floats)."""

    compared = 0

    def __lt__(self, other: Any) -> bool:
        CountedTime.compared += other.__class__ is CountedTime
        return float(self) < float(other)

    def __gt__(self, other: Any) -> bool:
        CountedTime.compared += other.__class__ is CountedTime
        return float(self) > float(other)


def held(n: int, seed: int) -> list[tuple[float, dict[str, Any]]]:
    rng = random.Random(seed)
    # few distinct times: many ties, some with the same event.id, some with none
    out = []
    for i in range(n):
        event: dict[str, Any] = {"n": i}
        if i % 3:
            event["event.id"] = f"id-{rng.randrange(4)}"
        out.append((float(rng.randrange(20)), event))
    return out


def released(buffer: ReorderBuffer, matches: list[tuple[float, dict[str, Any]]]) -> list[int]:
    for t, event in matches:
        assert buffer.push(t, event, event["n"])
    out = [payload for _, payload in buffer.due()]
    return out + [payload for _, payload in buffer.drain()]


def test_lateness_none_releases_in_the_heap_order_ties_by_tiebreak_then_arrival():
    for seed in range(5):
        matches = held(300, seed)
        on_heap = released(ReorderBuffer(10_000.0), matches)  # nothing due: all at drain
        sorted_once = released(ReorderBuffer(None), matches)
        assert sorted_once == on_heap
        times = [t for t, _ in matches]
        assert [times[n] for n in sorted_once] == sorted(times)
        # same time, same event.id: in arrival order
        same = [n for n in sorted_once if times[n] == 0.0 and "event.id" in matches[n][1]]
        by_id: dict[str, list[int]] = {}
        for n in same:
            by_id.setdefault(matches[n][1]["event.id"], []).append(n)
        assert all(ns == sorted(ns) for ns in by_id.values())


def test_lateness_none_beyond_max_pending_forces_the_oldest_out_then_drains_in_order():
    matches = held(200, 7)
    buffer = ReorderBuffer(None, max_pending=50)
    for t, event in matches:
        buffer.push(t, event, event["n"])
    forced = [payload for _, payload in buffer.due()]
    assert len(forced) == 150 and buffer.forced == 150 and len(buffer) == 50
    reference = ReorderBuffer(10_000.0)
    expected = released(reference, matches)
    assert forced + [payload for _, payload in buffer.drain()] == expected


def test_held_events_are_bounded_by_their_size_as_well_as_their_count():
    """Long events go on early once their JSON passes max_bytes, oldest first, in the same
    order as when all are held; a hostile process's long command lines cannot fill memory."""
    rng = random.Random(3)
    matches = [
        (float(rng.randrange(50)), {"n": i, "cmd": "x" * rng.randrange(10, 5000)})
        for i in range(300)
    ]
    sizes = {e["n"]: event_size(e) for _, e in matches}
    buffer = ReorderBuffer(None, max_bytes=20_000)
    for t, event in matches:
        buffer.push(t, event, event["n"])
    assert buffer.bytes == sum(sizes.values())
    forced = [payload for _, payload in buffer.due()]
    held_now = sum(sizes.values()) - sum(sizes[n] for n in forced)
    assert buffer.bytes == held_now <= 20_000 < held_now + sizes[forced[-1]]
    assert buffer.forced == len(forced) and len(buffer) == 300 - len(forced)
    assert forced + [payload for _, payload in buffer.drain()] == released(
        ReorderBuffer(10_000.0), matches
    )
    assert buffer.bytes == 0


def test_a_live_stream_holds_less_and_sends_a_burst_on_early():
    """The agent (a lateness in seconds) holds at most MAX_LIVE_BYTES: a burst of long
    events within the allowance goes on early, oldest first, instead of filling memory."""
    assert ReorderBuffer(None).max_bytes == MAX_PENDING_BYTES
    buffer = ReorderBuffer(60.0)
    assert buffer.max_bytes == MAX_LIVE_BYTES < MAX_PENDING_BYTES
    long = "x" * 2**20
    for n in range(40):
        buffer.push(1000.0 + n, {"n": n, "cmd": long}, n)
    out = [payload for _, payload in buffer.due()]
    assert (
        out == list(range(len(out))) and buffer.forced == len(out) >= 40 - MAX_LIVE_BYTES // 2**20
    )
    assert buffer.bytes <= MAX_LIVE_BYTES


def test_the_size_of_an_event_is_its_json():
    event = {"process.command_line": "\x1b[31m" + "x" * 100, "n": 1, "l": [1, "a"]}
    assert event_size(event) == len(orjson.dumps(event))
    assert event_size({"odd": object()}) == UNSIZED  # nothing JSON input makes: not a crash


def test_time_ordered_input_costs_about_one_comparison_per_match_at_drain():
    """A scan's input is mostly in time order: held until the end, its matches are put in
    order in about n comparisons, not the n log n of a heap's pushes and pops."""
    n = 4096
    buffer = ReorderBuffer(None)
    CountedTime.compared = 0
    order = [payload for _, payload in released_counted(buffer, n)]
    assert order == list(range(n))
    assert CountedTime.compared < 3 * n  # on a heap: about 56,000


def released_counted(buffer: ReorderBuffer, n: int) -> list[tuple[float, int]]:
    for i in range(n):
        buffer.push(CountedTime(i), {"event.id": f"{i:08d}"}, i)
    list(buffer.due())
    return list(buffer.drain())

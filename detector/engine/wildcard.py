"""Sigma wildcard values (`*`, `?`) matched in time linear in the event value's length.

A regex built from the wildcards backtracks: `*/tmp/*/*/*.so` took 17 s on a 2,000-character
command line, and command lines are read up to 64 KiB from hostile nodes. Here the value is
cut at each `*` into segments of fixed length (literal characters and `?`). The first segment
must match at the start, the last at the end, and the ones between are found in order, each at
its leftmost place after the previous one. Taking the leftmost place is always right: every
segment has a fixed length, so the leftmost place leaves the longest rest of the value for the
segments after it. Segments are found with `str.find` on their literal pieces (Segment.find),
each piece scanning the value once: the work is the value's length times the size of the
rule's value, never more.
"""

from __future__ import annotations

from collections.abc import Iterable

from sigma.types import SpecialChars


class Segment:
    """Characters between two `*`: literal pieces at fixed offsets, `?` anywhere else."""

    __slots__ = ("length", "pieces")

    def __init__(self, chars: list[str | None]):  # None stands for `?`
        self.length = len(chars)
        pieces: list[tuple[int, str]] = []
        start = 0
        for i, char in enumerate([*chars, None]):
            if char is None:
                if i > start:
                    pieces.append((start, "".join(c for c in chars[start:i] if c is not None)))
                start = i + 1
        self.pieces = tuple(pieces)

    def at(self, text: str, i: int) -> bool:
        """Whether the segment matches `text` at position `i`."""
        if i < 0 or i + self.length > len(text):
            return False
        return all(text.startswith(piece, i + offset) for offset, piece in self.pieces)

    def find(self, text: str, low: int, high: int) -> int:
        """The leftmost position in [low, high - length] where the segment matches, or -1.

        Leapfrog over the pieces: each piece's next occurrence is searched for with
        `str.find` from the current candidate on, and the candidate jumps to the furthest one
        until all agree. Candidates only move forward and each piece's search resumes past its
        last find, so every piece scans the value at most once."""
        last = high - self.length
        if last < low:
            return -1
        pieces = self.pieces
        if not pieces:  # only `?`: any place of the right length
            return low
        next_start = [-1] * len(pieces)  # per piece: the candidate its last find gave
        candidate = low
        while True:
            for k, (offset, piece) in enumerate(pieces):
                start = next_start[k]
                if start < candidate:
                    found = text.find(piece, candidate + offset, last + offset + len(piece))
                    if found == -1:
                        return -1
                    start = next_start[k] = found - offset
                if start > candidate:
                    candidate = start
                    break
            else:
                return candidate


class Glob:
    """One Sigma wildcard value; `matches` tests a whole string (already case-folded where
    the rule is case-insensitive)."""

    __slots__ = ("head", "middle", "min_length", "tail")

    def __init__(self, parts: Iterable[str | SpecialChars]):
        segments: list[list[str | None]] = [[]]
        for part in parts:
            if part is SpecialChars.WILDCARD_MULTI:
                segments.append([])
            elif part is SpecialChars.WILDCARD_SINGLE:
                segments[-1].append(None)
            else:
                segments[-1].extend(str(part))
        compiled = [Segment(chars) for chars in segments]
        self.head = compiled[0]
        # without a `*` the head is the whole value and there is no tail
        self.tail = compiled[-1] if len(compiled) > 1 else None
        self.middle = tuple(compiled[1:-1])
        self.min_length = sum(segment.length for segment in compiled)

    def matches(self, text: str) -> bool:
        head, tail = self.head, self.tail
        if tail is None:
            return len(text) == head.length and head.at(text, 0)
        if len(text) < self.min_length or not head.at(text, 0):
            return False
        tail_start = len(text) - tail.length
        if not tail.at(text, tail_start):
            return False
        position = head.length
        for segment in self.middle:
            found = segment.find(text, position, tail_start)
            if found < 0:
                return False
            position = found + segment.length
        return True

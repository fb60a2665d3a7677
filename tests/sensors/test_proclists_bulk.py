"""The long command line condensed a chunk at a time, against the argument-at-a-time algorithm it
replaced (kept below, verbatim: `reference_cmdline_args`): the same arguments kept and counted
wherever the module's doc does not say otherwise, and where it does, what matters for the rules
still holds. And the work it takes does not grow with the number of arguments."""

from __future__ import annotations

import io
import random
import sys
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import pairwise
from typing import BinaryIO

import pytest

from hpcsec.sensors import cmdline_condense, proclists
from hpcsec.sensors.proclists import CUT

# -- the reference: proclists.py before it worked a chunk at a time (verbatim, renamed) ------

CHUNK = proclists.CHUNK
SCAN_MAX = proclists.SCAN_MAX
ENTRY_MAX = proclists.ENTRY_MAX
MARKER_ROOM = proclists.MARKER_ROOM
CMDLINE_MAX = cmdline_condense.CMDLINE_MAX
HEAD_MAX = cmdline_condense.HEAD_MAX
MIDDLE_MAX = cmdline_condense.MIDDLE_MAX
TAIL_MAX = cmdline_condense.TAIL_MAX
ARG_KEEP = cmdline_condense.ARG_KEEP


def _entries(stream: BinaryIO, keep_max: int) -> Iterator[tuple[bytes, int]]:
    """(first `keep_max` + 1 bytes, full length) of each NUL-terminated entry."""
    current = bytearray()
    length = 0
    read = 0
    while read < SCAN_MAX:
        chunk = stream.read(CHUNK)
        if not chunk:
            break
        read += len(chunk)
        start = 0
        while True:
            end = chunk.find(b"\0", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            room = keep_max + 1 - len(current)
            if room > 0:
                current += piece[:room]
            length += len(piece)
            if end < 0:
                break
            yield bytes(current), length
            current.clear()
            length = 0
            start = end + 1
    if length:
        yield bytes(current), length


def reference_environ_entries(
    stream: BinaryIO, names: Iterable[str], first_and_last: Iterable[str] = ()
) -> bytes:
    """The entries `NAME=value` of `names`, NUL-terminated: the first of each, as getenv
    reads it, and for the names in `first_and_last` the last one too when it differs (glibc's
    ld.so takes the last LD_PRELOAD, musl's the first: an allowed one must hide neither). An
    entry longer than ENTRY_MAX is cut with a CUT marker, never silently: a library behind
    16 KiB of `:` is not claimed to be absent."""
    prefixes = {name.encode() + b"=" for name in names}
    both = {name.encode() + b"=" for name in first_and_last} & prefixes
    first: dict[bytes, bytes] = {}
    last: dict[bytes, bytes] = {}
    for head, length in _entries(stream, ENTRY_MAX + MARKER_ROOM):
        key, sep, _ = head.partition(b"=")
        prefix = key + sep
        if prefix not in prefixes:
            continue
        if prefix not in first:
            first[prefix] = _cut_entry(head, length)
            if len(first) == len(prefixes) and not both:
                break
        elif prefix in both:
            last[prefix] = _cut_entry(head, length)
    kept = [first[p] for p in first]
    kept += [last[p] for p in first if p in last and last[p] != first[p]]
    return b"".join(entry + b"\0" for entry in kept)


def _cut_entry(head: bytes, length: int) -> bytes:
    """An environment entry within ENTRY_MAX, as it is, or cut with a marker; one cut already
    (a snapshot's record, read again) stays as it is."""
    if length <= ENTRY_MAX + MARKER_ROOM and CUT.search(head):
        return head
    return _cut_to(head, length, ENTRY_MAX)


def _cut(head: bytes, length: int) -> bytes:
    return _cut_to(head, length, ARG_KEEP)


def _cut_to(head: bytes, length: int, keep: int) -> bytes:
    """The first `keep` bytes of what was `length` long, and a CUT marker when it was longer."""
    if length <= keep:
        return head
    return head[:keep] + f"\u2026[hpcsec: cut {length - keep} bytes]".encode()


def _is_indicator(arg: bytes) -> bool:
    """What the rules test in a command line sits in flags (`--donate-level`, `-o`) and URLs
    (`stratum+tcp://`): such arguments are kept from the middle of a long command line."""
    return arg.startswith(b"-") or b"://" in arg


class ReferenceLiterals:
    """The texts the loaded rules look for in a command line (the engine's
    command_line_literals), found in one Aho-Corasick pass (C) over two consecutive
    arguments joined by a space, as the command line joins them, so that a literal of
    several words (` --algo rx/`) is found across them; ASCII letters are folded as the
    rules fold them."""

    def __init__(self, literals: Iterable[str]):
        import ahocorasick  # only a sensor given rules uses it (collect's start-up stays lean)

        self._automaton = ahocorasick.Automaton()
        for literal in {lit.strip() for lit in literals}:
            # as latin-1, a byte is one character: positions in the text are in bytes
            key = literal.lower().encode("utf-8", "surrogateescape").decode("latin-1")
            if key:
                self._automaton.add_word(key, (literal, len(key)))
        self.empty = not len(self._automaton)
        if not self.empty:
            self._automaton.make_automaton()

    def found(self, data: bytes) -> dict[str, tuple[int, int]]:
        """Each literal in `data`, with where it first is (in bytes)."""
        found: dict[str, tuple[int, int]] = {}
        if self.empty:
            return found
        for end, (literal, length) in self._automaton.iter(data.lower().decode("latin-1")):
            found.setdefault(literal, (end + 1 - length, end + 1))
        return found


EXCERPT_WHOLE = 256  # a longer argument holding a literal is kept as an excerpt around it
EXCERPT_CONTEXT = 32  # bytes kept on each side of the literal in an excerpt
COVER_MAX = 8 * 1024  # of MIDDLE_MAX, what arguments kept for the rules' literals may take


def _excerpt(arg: bytes, length: int, start: int, end: int) -> bytes:
    """`arg` (the first bytes of an argument `length` long) whole when short, else the bytes
    around [start, end) with a CUT marker for each side left out."""
    if length <= EXCERPT_WHOLE and len(arg) == length:
        return arg
    low, high = max(0, start - EXCERPT_CONTEXT), min(len(arg), end + EXCERPT_CONTEXT)
    before = f"\u2026[hpcsec: cut {low} bytes]".encode() if low else b""
    after = f"\u2026[hpcsec: cut {length - high} bytes]".encode() if high < length else b""
    return before + arg[low:high] + after


# An argument that left the tail, its fate decided when the next one leaves (a literal of
# several words may join them): as it would be kept (cut at ARG_KEEP), its first bytes uncut
# (where literals are looked for), its length, and the part of it a literal across its
# boundary with the one before needs (or None).
_Leaving = tuple[bytes, bytes, int, tuple[int, int] | None]


@dataclass
class _ReferenceCondensed:
    """A long command line's head, tail and middle indicators (see the module's doc).

    The middle keeps each indicator once, and a URL before a flag: 4,200 `-v` flags (or as
    many distinct ones) filled it and hid the pool URL after them. A URL takes the room of
    the oldest kept flags; only URLs past 12 KiB of other URLs are left out, and the marker
    counts them (`…, N with a URL]`).

    Given the rules' literals (`Literals`), an argument showing one that nothing kept shows
    yet comes first: it takes the room of flags and URLs, as an excerpt around the literal
    (COVER_MAX in all). Distinct flags or URLs can then no longer push out what a rule looks
    for; padding with the literals themselves only makes the rules fire. What the literals'
    room cannot take is counted in the marker (`…, N with a rule's text]`)."""

    head: list[bytes]
    literals: ReferenceLiterals | None = None
    head_size: int = 0
    middle_size: int = 0
    tail_size: int = 0
    cover_size: int = 0
    left_out: int = 0
    left_out_bytes: int = 0
    left_out_urls: int = 0
    left_out_literals: int = 0

    def __post_init__(self) -> None:
        self.middle: list[bytes | None] = []  # None: an indicator a URL or a literal displaced
        self.covers: set[int] = set()  # where in the middle the arguments kept for literals are
        self.middle_seen: set[bytes] = set()
        self.covered: set[str] = set()  # the literals what is kept shows
        self.head_longs: list[tuple[bytes, int]] = []  # the head's arguments cut at ARG_KEEP
        self.next_flag = 0  # where the oldest flag that may still be kept is, at the least
        self.next_url = 0  # the same for URLs (a literal's argument may displace one)
        self.tail: deque[_Leaving] = deque()
        self.leaving: _Leaving | None = None

    def add(self, whole: bytes, length: int) -> None:
        """The next argument: `whole` its first bytes (all of it unless it is longer than
        CMDLINE_MAX), `length` its length."""
        arg = _cut(whole, length)
        if self.head_size + len(arg) + 1 <= HEAD_MAX and not self.middle and not self.tail:
            self.head.append(arg)
            self.head_size += len(arg) + 1
            if self.literals is not None:
                self.covered.update(self.literals.found(arg))
                if length > ARG_KEEP:
                    self.head_longs.append((whole, length))
            return
        self._cover_head()  # the head is closed
        self.tail.append((arg, whole if self.literals is not None else b"", length, None))
        self.tail_size += len(arg) + 1
        while self.tail_size > TAIL_MAX:
            old = self.tail.popleft()
            self.tail_size -= len(old[0]) + 1
            self._left_tail(old)

    def _cover_head(self) -> None:
        """The literals past the cut of the head's long arguments that the head does not
        show, kept from each argument as an excerpt (around them all, else around each)."""
        for whole, length in self.head_longs:
            found = self.literals.found(whole) if self.literals is not None else {}
            own = {lit: span for lit, span in found.items() if lit not in self.covered}
            if not own or self._to_cover(_excerpt(whole, length, *_extent([*own.values()]))):
                self.covered.update(own)
                continue
            for literal, span in sorted(own.items(), key=lambda item: item[1][1] - item[1][0]):
                if literal not in self.covered and self._to_cover(_excerpt(whole, length, *span)):
                    self.covered.add(literal)
        self.head_longs = []

    def _left_tail(self, leaving: _Leaving) -> None:
        before, self.leaving = self.leaving, leaving
        if before is None:
            return
        if self.literals is None:
            self._keep_or_leave(before[0])
            return
        # one pass over both, joined: the literals of `before`, and those across the space
        left, right = _joinable(before), _joinable(leaving)
        own: dict[str, tuple[int, int]] = {}
        spans: list[tuple[int, int]] = [before[3]] if before[3] is not None else []
        across_end = 0
        for literal, (start, end) in self.literals.found(left + b" " + right).items():
            if literal in self.covered or start >= len(left):
                continue  # kept already, or all in the next one (looked for in its turn)
            if end <= len(left):
                own[literal] = (start, end)
            else:  # across the space: both are kept, next to each other in the middle
                spans.append((start, len(left)))
                across_end = max(across_end, end - len(left) - 1)
                self.covered.add(literal)
        if across_end:
            self.leaving = (*leaving[:3], (0, across_end))
        spans += own.values()
        if not spans:
            self._keep_or_leave(before[0])
        elif self._to_cover(_excerpt(before[1], before[2], *_extent(spans))):
            self.covered.update(own)
            self.middle_seen.add(before[0])
        else:
            self.left_out_literals += 1
            self._leave_out(before[0])

    def _keep_or_leave(self, arg: bytes) -> None:
        if _is_indicator(arg) and arg not in self.middle_seen:
            self._to_middle(arg)
        else:
            self._leave_out(arg)

    def _to_cover(self, entry: bytes) -> bool:
        """`entry` into the middle, before any flag or URL; False when the literals' room
        (COVER_MAX) is full."""
        size = len(entry) + 1
        if self.cover_size + size > COVER_MAX:
            return False
        while self.middle_size + size > MIDDLE_MAX and (
            self._drop_oldest(url=False) or self._drop_oldest(url=True)
        ):
            pass
        self.covers.add(len(self.middle))
        self.middle.append(entry)
        self.middle_size += size
        self.cover_size += size
        return True

    def _to_middle(self, arg: bytes) -> None:
        size = len(arg) + 1
        url = b"://" in arg
        while url and self.middle_size + size > MIDDLE_MAX and self._drop_oldest(url=False):
            pass
        if self.middle_size + size > MIDDLE_MAX:
            self._leave_out(arg)
            self.left_out_urls += url
            return
        self.middle.append(arg)
        self.middle_seen.add(arg)
        self.middle_size += size

    def _drop_oldest(self, url: bool) -> bool:
        """Leave out the oldest flag (or URL) kept in the middle; False when none is."""
        at = self.next_url if url else self.next_flag
        while at < len(self.middle):
            kept = self.middle[at]
            if kept is not None and at not in self.covers and (b"://" in kept) == url:
                self.middle[at] = None
                self.middle_size -= len(kept) + 1
                self._leave_out(kept)
                self.left_out_urls += url
                break
            at += 1
        if url:
            self.next_url = at
        else:
            self.next_flag = at
        return at < len(self.middle)

    def _leave_out(self, arg: bytes) -> None:
        self.left_out += 1
        self.left_out_bytes += len(arg)

    def args(self) -> list[bytes]:
        self._cover_head()  # a head that never closed
        if self.leaving is not None:  # the last to leave, next to the tail's first (kept)
            self._left_tail(self.tail[0] if self.tail else (b"", b"", 0, None))
            self.leaving = None
        gap: list[bytes] = []
        if self.left_out:
            plural = "s" if self.left_out != 1 else ""
            urls = f", {self.left_out_urls} with a URL" if self.left_out_urls else ""
            texts = (
                f", {self.left_out_literals} with a rule's text" if self.left_out_literals else ""
            )
            gap = [
                f"\u2026[hpcsec: {self.left_out} argument{plural} "
                f"({self.left_out_bytes} bytes) left out{urls}{texts}]".encode()
            ]
        middle = [arg for arg in self.middle if arg is not None]
        return [*self.head, *gap, *middle, *(arg for arg, *_ in self.tail)]


def _joinable(leaving: _Leaving) -> bytes:
    """What of an argument literals are looked for in: all of it when it was read whole, else
    its kept form (a literal past its CUT marker shows in no command line rules see)."""
    arg, whole, length, _ = leaving
    return whole if len(whole) == length else arg


def _extent(spans: list[tuple[int, int]]) -> tuple[int, int]:
    return min(start for start, _ in spans), max(end for _, end in spans)


def reference_cmdline_args(
    stream: BinaryIO, literals: ReferenceLiterals | None = None
) -> list[bytes]:
    """The arguments of a /proc/<pid>/cmdline stream, condensed when it exceeds CMDLINE_MAX."""
    whole: list[tuple[bytes, int]] = []
    total = 0
    condensed: _ReferenceCondensed | None = None
    for head, length in _entries(stream, CMDLINE_MAX):
        if condensed is None:
            whole.append((head, length))
            total += length + 1
            if total <= CMDLINE_MAX + 1:  # the last NUL is optional
                continue
            condensed = _ReferenceCondensed([], literals)
            for early, early_length in whole:
                condensed.add(early, early_length)
            whole = []
        else:
            condensed.add(head, length)
    return [head for head, _ in whole] if condensed is None else condensed.args()


# -- the reference, watched for what the module's doc says is done otherwise now -----------


class _Watched(_ReferenceCondensed):
    """The reference, noting the cases where the chunked algorithm is documented to differ:
    a flag or URL taken after one of its occurrences was refused and a URL displaced flags
    since (`retried`), a URL refused after displacing flags (`displaced for nothing`), a URL
    repeating a kept one or holding two `://` left out when no URL could enter (`counted by
    its ://`), a literal's argument with no room (`no room for a literal`); and the
    arguments kept for literals before the first of those."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.differs: set[str] = set()
        self.refused: dict[bytes, int] = {}  # indicator -> URLs displacing flags before
        self.displacing = 0
        self.covers_before_no_room: list[bytes] | None = None

    def _to_middle(self, arg: bytes) -> None:
        size_before, url = self.middle_size, b"://" in arg
        super()._to_middle(arg)
        kept = arg in self.middle_seen
        if url and self.middle_size - (len(arg) + 1 if kept else 0) < size_before:
            self.displacing += 1
            if not kept:
                self.differs.add("displaced for nothing")
        if kept and self.refused.get(arg, self.displacing) < self.displacing:
            self.differs.add("retried")
        if not kept:
            self.refused.setdefault(arg, self.displacing)

    def _keep_or_leave(self, arg: bytes) -> None:
        flags = sum(
            len(kept) + 1
            for at, kept in enumerate(self.middle)
            if kept is not None and at not in self.covers and b"://" not in kept
        )
        no_url_fits = MIDDLE_MAX - self.middle_size + flags < cmdline_condense.MIN_URL
        if no_url_fits and (arg in self.middle_seen or arg.count(b"://") > 1) and b"://" in arg:
            self.differs.add("counted by its ://")
        super()._keep_or_leave(arg)

    def _to_cover(self, entry: bytes) -> bool:
        if not super()._to_cover(entry):
            if self.covers_before_no_room is None:
                kept = [self.middle[at] for at in sorted(self.covers)]
                self.covers_before_no_room = [entry for entry in kept if entry is not None]
            self.differs.add("no room for a literal")
            return False
        return True


def watched_cmdline_args(data: bytes, literals: ReferenceLiterals | None) -> _Watched | None:
    """The reference condensing `data` (None when it fits): its arguments, and how the
    chunked algorithm may differ from it."""
    whole: list[tuple[bytes, int]] = []
    total = 0
    condensed: _Watched | None = None
    for head, length in _entries(io.BytesIO(data), CMDLINE_MAX):
        if condensed is None:
            whole.append((head, length))
            total += length + 1
            if total <= CMDLINE_MAX + 1:
                continue
            condensed = _Watched([], literals)
            for early, early_length in whole:
                condensed.add(early, early_length)
            whole = []
        else:
            condensed.add(head, length)
    return condensed


# -- random command lines, with small limits ---------------------------------------------------

SMALL = {
    "CMDLINE_MAX": 1200,
    "HEAD_MAX": 512,
    "MIDDLE_MAX": 192,
    "TAIL_MAX": 256,
    "ARG_KEEP": 64,
    "COVER_MAX": 128,
    "EXCERPT_WHOLE": 32,
    "EXCERPT_CONTEXT": 4,
}
CASES = 200
SOME = [" --algo rx/", "stratum+tcp://", "xmrig", "aws s3 ", "jupyter", "a b c"]
MANY = SOME + [f"lit{n:02d}" for n in range(12)]


@pytest.fixture
def small(monkeypatch):
    """Small limits, in the modules (proclists' chunks, cmdline_condense's limits) and in the
    reference alike: a few thousand arguments exercise what 64 MiB would (the chunk size is
    set per case)."""

    def limits(chunk: int, cover: int = SMALL["COVER_MAX"], **more: int) -> None:
        for module in (cmdline_condense, sys.modules[__name__]):
            for name, value in {**SMALL, "COVER_MAX": cover}.items():
                monkeypatch.setattr(module, name, value)
        for module in (proclists, sys.modules[__name__]):
            monkeypatch.setattr(module, "CHUNK", chunk)
        for name, value in more.items():
            monkeypatch.setattr(cmdline_condense, name, value)

    return limits


def command_line(rng: random.Random) -> bytes:
    """Tiny and long arguments, flags and URLs (distinct, repeated, long, several `://`),
    the literals (cased otherwise, inside long arguments, split over two arguments)."""
    flags = [b"-v", b"--x", b"-abc"] + [b"-f%d" % n for n in range(rng.randint(1, 60))]
    urls = [b"a://%d" % n for n in range(rng.randint(1, 60))]
    literal_args = [
        *(b"xmrig", b"XMRIG", b"--algo", b"rx/0", b"stratum+tcp://p:1", b"aws", b"s3", b"cp"),
        *(b"aws s3 cp", b"jupyter-lab", b"a", b"b", b"c", b"a b", b"b c", b"lit03", b"xlit07y"),
        *(b"--url=stratum+tcp://x", b"-jupyter", b"--ALGO", b"RX/"),
    ]
    weights = rng.choice([(20, 2, 1, 1), (8, 4, 1, 2), (3, 3, 2, 1), (2, 1, 4, 1), (2, 4, 1, 2)])
    args = []
    for _ in range(rng.choice([5, 100, 300, 1500])):
        kind = rng.choices(["pad", "flag", "url", "literal"], weights)[0]
        shape = rng.random()
        if kind == "pad":
            args.append(
                rng.choice([b"a", b"", b"pp", b"q" * rng.randint(1, 40)])
                if shape < 0.8
                else bytes(rng.choice(b"abcdef -:/") for _ in range(rng.randint(0, 12)))
            )
        elif kind == "flag":
            args.append(
                rng.choice(flags)
                if shape < 0.6
                else b"-" + bytes([rng.randint(97, 122)]) * rng.randint(1, 30)
                if shape < 0.9
                else b"-" + b"y" * rng.randint(60, 1500)  # cut at ARG_KEEP
            )
        elif kind == "url":
            args.append(
                rng.choice(urls)
                if shape < 0.6
                else b"u://%d" % rng.randint(0, 10 ** rng.randint(1, 6))
                if shape < 0.85
                else b"a://b://c" + b"d" * rng.randint(0, 5)
                if shape < 0.95
                else b"h://" + b"w" * rng.randint(60, 1500)
            )
        else:
            args.append(
                rng.choice(literal_args)
                if shape < 0.8
                else b"z" * rng.randint(55, 70) + rng.choice([b"xmrig", b"://", b"jupyter"])
                if shape < 0.9
                else b"m" * rng.randint(0, 30) + b"xmrig" + b"n" * rng.randint(0, 1500)
            )
    if rng.random() < 0.05:
        args.append(b"g" * rng.randint(1201, 3000))  # longer than CMDLINE_MAX
    data = b"".join(arg + b"\0" for arg in args)
    return data[:-1] if data and rng.random() < 0.2 else data


def condense(data: bytes, literals: cmdline_condense.Literals | None = None) -> list[bytes]:
    return cmdline_condense.cmdline_args(io.BytesIO(data), literals)


def joined(args: list[bytes]) -> bytes:
    return b"".join(arg + b"\0" for arg in args)


def plain_flag(arg: bytes) -> bool:
    return arg.startswith(b"-") and b"://" not in arg


# -- the same as the reference, or what the doc says instead ------------------------------


@pytest.mark.parametrize(
    ("literals", "few_keys"),
    [(None, 2), (SOME, 2), (SOME, 100), (MANY, 2), (MANY, 100)],
    ids=["no literals", "automaton", "finds", "many, automaton", "many, finds"],
)
def test_each_chunk_condensed_at_once_keeps_what_one_argument_at_a_time_kept(
    small, literals, few_keys
):
    """Random command lines, against the reference: equal but where the module's doc says
    otherwise; there, what differs is flags and the marker's counts alone (URLs and the
    arguments kept for literals are the same), or, once a literal's argument found no room,
    every literal kept before that is still kept; and always the result fits and is
    stable."""
    compared = 0
    for seed in range(CASES):
        rng = random.Random(seed)
        chunk, cover = rng.choice([7, 64, 100, 1024, 65536]), rng.choice([128, 128, 48])
        small(chunk, cover, FEW_KEYS=few_keys, WEIGH_BLOCK=4, PRUNE_MATCHES=rng.choice([0, 16]))
        data = command_line(rng)
        ours = cmdline_condense.Literals(literals) if literals else None
        kept = condense(data, ours)
        reference = watched_cmdline_args(data, ReferenceLiterals(literals) if literals else None)
        assert len(joined(kept)) <= SMALL["CMDLINE_MAX"] + 1, seed
        assert condense(joined(kept), ours) == kept, seed  # a snapshot replays the same
        if reference is None:
            assert kept == reference_cmdline_args(io.BytesIO(data)), seed
            continue
        expected = reference.args()
        if not reference.differs:
            assert kept == expected, seed
            compared += 1
        elif "no room for a literal" not in reference.differs:
            assert [a for a in kept if not plain_flag(a) and not cmdline_condense.GAP.match(a)] == [
                a for a in expected if not plain_flag(a) and not cmdline_condense.GAP.match(a)
            ], seed
        else:
            found = cmdline_condense.Literals(literals or []).found
            assert reference.covers_before_no_room is not None
            before = found(b" ".join(reference.covers_before_no_room))
            assert before.keys() <= found(b" ".join(kept)).keys(), seed
    assert compared >= CASES // 5  # floods are not all there is


def test_a_literal_of_two_words_is_found_wherever_chunks_and_the_tail_cut(small):
    """`--algo` and `rx/0` at every offset of a long command line: across a chunk's end, the
    tail's edge, or an argument cut by a chunk, the same as the reference."""
    literals, reference = cmdline_condense.Literals(SOME), ReferenceLiterals(SOME)
    for chunk in (7, 64, 100):
        small(chunk)
        for at in range(0, 700, 3):
            args = [b"p" * 9] * 40 + [b"-f%d" % n for n in range(60)] + [b"q"] * at
            data = joined([*args, b"--algo", b"rx/0", *[b"r" * 5] * 120])
            kept = condense(data, literals)
            assert kept == reference_cmdline_args(io.BytesIO(data), reference), (chunk, at)
            assert b" --algo rx/0 " in b" ".join(kept), (chunk, at)


@pytest.mark.parametrize("offset", [-7, -1, 0, 3])
def test_a_literal_of_two_words_across_a_64_kib_chunk_is_kept(offset):
    """At the real sizes: `--algo` ends a 64 KiB chunk (or one is cut in it), `rx/0` begins
    the next, behind 12 KiB of distinct flags."""
    flags = [f"-a{n:05d}".encode() for n in range(3000)]
    before = joined([b"./x", *[b"A" * 100] * 330, *flags])
    pad = proclists.CHUNK * 2 - len(before) - len(b"--algo\0") + offset
    data = before + joined([b"p" * (pad - 1), b"--algo", b"rx/0", *[b"B" * 100] * 200])
    assert data.index(b"--algo") + len(b"--algo\0") == proclists.CHUNK * 2 + offset
    kept = condense(data, cmdline_condense.Literals(SOME))
    assert b" --algo rx/0 " in b" ".join(kept)
    assert kept == reference_cmdline_args(io.BytesIO(data), ReferenceLiterals(SOME))


# -- the pieces ----------------------------------------------------------------------------------


def random_text(rng: random.Random, alphabet: bytes = b"ab-:/\0") -> bytes:
    text = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 300)))
    return text if text.endswith(b"\0") else text + b"\0"


def test_the_arguments_longer_than_arg_keep_are_all_found(monkeypatch):
    monkeypatch.setattr(cmdline_condense, "ARG_KEEP", 8)
    rng = random.Random(1)
    for _ in range(2000):
        text = joined([b"x" * rng.choice([0, 1, 7, 8, 9, 15, 16, 17, 40]) for _ in range(20)])
        naive, at = [], 0
        for arg in text.split(b"\0")[:-1]:
            if len(arg) > 8:
                naive.append((at, at + len(arg)))
            at += len(arg) + 1
        assert list(cmdline_condense._long_spans(text)) == naive, text


def test_flags_and_urls_are_found_where_they_are():
    rng = random.Random(2)
    for _ in range(3000):
        text = random_text(rng)
        args, at, starts = text.split(b"\0")[:-1], 0, []
        for arg in args:
            starts.append(at)
            at += len(arg) + 1
        flags = [(start, arg) for start, arg in zip(starts, args, strict=True) if arg[:1] == b"-"]
        urls = [(start, arg) for start, arg in zip(starts, args, strict=True) if b"://" in arg]
        assert list(zip(*cmdline_condense._flags_at(text), strict=True)) == flags, text
        assert list(zip(*cmdline_condense._urls(text), strict=True)) == urls, text
        for room in (1, 2, 3, 5, 64, 65, 4000):
            fitting = [arg for _, arg in flags if len(arg) < room]
            found = [arg for arg in cmdline_condense._flags(text, room) if len(arg) < room]
            assert list(dict.fromkeys(found)) == list(dict.fromkeys(fitting)), (text, room)


def test_entries_are_cut_out_of_any_chunking():
    rng = random.Random(3)
    for _ in range(500):
        data = joined([b"e" * rng.choice([0, 1, 5, 7, 8, 30]) for _ in range(rng.randint(0, 12))])
        data = data[: rng.randint(0, len(data))]
        cuts = sorted({0, len(data), *rng.sample(range(len(data) + 1), min(len(data), 6))})
        if rng.random() < 0.5:  # a chunk beginning with the NUL that ends an entry
            cuts = sorted({*cuts, *(at for at, byte in enumerate(data) if byte == 0)})
        chunks = [data[start:end] for start, end in pairwise(cuts)]
        entries = []
        for head, length, body in proclists.entry_blocks(chunks, 6):
            entries.append((head, length))
            entries += [(arg[:7], len(arg)) for arg in body.split(b"\0")[:-1]]
        assert entries == list(_entries(io.BytesIO(data), 6)), data


@pytest.mark.parametrize("few_keys", [2, 100])
def test_a_scan_finds_each_literal_not_kept_from_where_it_is_asked(monkeypatch, few_keys):
    monkeypatch.setattr(cmdline_condense, "FEW_KEYS", few_keys)
    literals = cmdline_condense.Literals(["xmrig", "aws s3"])
    text = b"a\0xmrig\0aws\0s3\0b\0xmrig\0"
    covered: set[str] = set()
    scan = cmdline_condense._Scan(literals, covered, text, None)
    assert scan.at(0) == 2  # xmrig
    assert scan.at(3) == 8  # aws, across to s3
    assert scan.at(9) == 17  # xmrig again: not kept yet
    covered.add("xmrig")
    assert scan.at(9) == -1
    assert cmdline_condense._Scan(literals, {"xmrig", "aws s3"}, text, None).at(0) == -1


def test_an_automaton_of_the_literals_not_kept_leaves_those_kept_out():
    literals = cmdline_condense.Literals(["xmrig", "aws s3"])
    automaton = literals.automaton({"xmrig"})
    text = b"xmrig\0aws\0s3\0"
    assert literals.starts(text, {"xmrig"}) == ([(6, "aws s3")], 1)
    assert literals.starts(text, {"xmrig"}, automaton) == ([(6, "aws s3")], 0)


# -- the work does not grow with the arguments ------------------------------------------------


@pytest.fixture
def calls(monkeypatch) -> Counter:
    """How often the condenser's steps taken in Python (per argument, or per chunk) run."""
    counted: Counter = Counter()

    def spy(owner: object, name: str) -> None:
        real = getattr(owner, name)

        def counting(*args, **kwargs):
            counted[name] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, counting)

    for name in ("_one", "_fits", "_enter", "_leave_out", "_segment", "_weigh_all"):
        spy(cmdline_condense._Condensed, name)
    for name in ("_urls", "_flags"):
        spy(cmdline_condense, name)
    spy(proclists, "_note_entry")
    return counted


REAL = [" --algo kawpow", " --algo rx/", " --donate-level", "stratum+tcp://", "aws s3 ", "jupyter"]


def chunks_of(data: bytes) -> int:
    return len(data) // proclists.CHUNK + 1


@pytest.mark.parametrize("literals", [None, REAL])
def test_padding_takes_no_python_step_per_argument(calls, literals):
    data = b"a\0" * 1_000_000
    condense(data, cmdline_condense.Literals(literals) if literals else None)
    assert calls["_one"] == calls["_fits"] == calls["_leave_out"] == 0
    assert calls["_segment"] <= chunks_of(data)


@pytest.mark.parametrize("literals", [None, REAL])
def test_a_flood_of_one_flag_is_weighed_once(calls, literals):
    kept = condense(b"-vv\0" * 500_000, cmdline_condense.Literals(literals) if literals else None)
    assert calls["_fits"] == calls["_enter"] == 1
    assert kept.count(b"-vv") == (cmdline_condense.HEAD_MAX + cmdline_condense.TAIL_MAX) // 4 + 1


@pytest.mark.parametrize(
    ("size", "entered"),
    [(6, cmdline_condense.MIDDLE_MAX // 7), (200, 121)],  # 3 bytes of room left, or 67
    ids=["short ones, little room", "long ones, more room than ROOM_SHORT"],
)
def test_distinct_flags_that_cannot_fit_are_passed_over_in_c(calls, size, entered):
    """Once the middle is full, distinct flags cost no Python step each: with little room
    left only short flags are made into objects, else those too long are skipped in C."""
    head = [b"A" * 100] * 330
    filler = [b"-%05d" % n + b"f" * 94 for n in range(121)] if size > 6 else []
    flags = (b"-%0*d" % (size - 1, n) for n in range(8_000_000 // size))
    data = joined([*head, *filler, *flags])
    made: list[int] = []  # the flags made into objects, per segment
    real = cmdline_condense._flags
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            cmdline_condense,
            "_flags",
            lambda *args: made.append(len(found := real(*args))) or found,
        )
        condense(data)
    assert calls["_enter"] == entered
    assert calls["_fits"] <= calls["_enter"] + chunks_of(data)
    if size < cmdline_condense.ROOM_SHORT:  # only the chunks filling the middle made them
        assert sum(made) <= 3 * proclists.CHUNK // size


def test_distinct_urls_that_cannot_fit_are_counted_unweighed(calls):
    """Once no URL can enter the middle, URLs are counted (`://`), not looked at."""
    urls = joined(b"a://%06d" % n for n in range(300_000))
    kept = condense(urls)
    assert calls["_enter"] == cmdline_condense.MIDDLE_MAX // 11
    assert calls["_urls"] + calls["_flags"] + calls["_weigh_all"] <= 2  # filling the middle
    (gap,) = [arg for arg in kept if cmdline_condense.GAP.match(arg)]
    left_out = 300_000 - sum(b"://" in arg for arg in kept)
    assert gap.endswith(f"left out, {left_out} with a URL]".encode())


@pytest.mark.parametrize("literals", [REAL, REAL + [f"literal {n}" for n in range(40)]])
def test_a_flood_of_one_literal_is_kept_once_and_then_costs_nothing(calls, monkeypatch, literals):
    """Once kept, a literal is no longer looked for: with few keys left, no find is made for
    it; with many, the automaton is made anew without it once its matches cost more."""
    wasted: list[int] = []
    real_starts = cmdline_condense.Literals.starts

    def starts(self, *args):
        found = real_starts(self, *args)
        wasted.append(found[1])
        return found

    monkeypatch.setattr(cmdline_condense.Literals, "starts", starts)
    ours = cmdline_condense.Literals(literals)
    flood = b"--donate-level=1\0" * 300_000
    kept = condense(joined([b"A" * 100] * 330) + flood, ours)  # the head shows none
    assert kept.count(b"--donate-level=1") == 1 + cmdline_condense.TAIL_MAX // 17
    assert calls["_one"] == 1
    assert sum(wasted) <= (cmdline_condense.PRUNE_MATCHES + 1) * len(ours.keys) + proclists.CHUNK
    assert wasted[-5:] == [0] * min(5, len(wasted))


# -- what the module's doc says differs from the reference ------------------------------------


def test_a_url_too_long_for_the_room_of_every_flag_leaves_them_kept():
    """The middle full of URLs and 1 KiB of flags: a 4 KiB URL cannot enter even in the room
    of every flag. The reference left them out all the same; they are kept now."""
    urls = [f"http://h{n:05d}.example/".encode() for n in range(440)]
    flags = [f"-b{n:04d}".encode() for n in range(160)]
    args = [b"./x", *[b"A" * 100] * 330, *urls, *flags, b"h://" + b"w" * 4200]
    data = joined([*args, *[b"B" * 100] * 200])
    assert set(flags) <= set(condense(data))
    assert not set(flags) & set(reference_cmdline_args(io.BytesIO(data)))


def test_past_the_literals_room_an_argument_showing_one_is_kept_as_a_url():
    """40 arguments of 255 bytes each showing a literal of their own fill the literals' 8 KiB;
    a pool URL after them (its literal not kept) was left out by the reference as a rule's
    text it had no room for. It is a URL, and is kept as one."""
    names = [f"lit{n:02d}x" for n in range(40)]
    ours, reference = (
        cmdline_condense.Literals([*names, "stratum+tcp://"]),
        ReferenceLiterals([*names, "stratum+tcp://"]),
    )
    fillers = [name.encode().ljust(255, b"f") for name in names]  # 32 fill 8 KiB
    args = [b"./x", *[b"A" * 100] * 330, *fillers, *[b"q" * 100] * 400]
    data = joined([*args, b"--url=stratum+tcp://pool:3333", *[b"B" * 100] * 200])
    assert b"--url=stratum+tcp://pool:3333" in condense(data, ours)
    assert b"--url=stratum+tcp://pool:3333" not in reference_cmdline_args(
        io.BytesIO(data), reference
    )


# -- environ -------------------------------------------------------------------------------------


def environ(rng: random.Random) -> bytes:
    names = [b"LD_PRELOAD", b"SLURM_JOB_ID", b"HOME", b"LD_PRELOADX", b"X"]
    entries = [
        rng.choice(names) + rng.choice([b"=", b"", b"=="]) + b"v" * rng.choice([0, 3, 40, 90])
        for _ in range(rng.randint(0, 60))
    ]
    return joined(entries)[: rng.choice([None, -1, -5])]


def test_environ_entries_are_those_the_reference_kept(monkeypatch):
    rng = random.Random(4)
    for _ in range(800):
        chunk = rng.choice([3, 8, 64, 65536])
        for module in (proclists, sys.modules[__name__]):
            monkeypatch.setattr(module, "CHUNK", chunk)
            monkeypatch.setattr(module, "ENTRY_MAX", 50)
            monkeypatch.setattr(module, "MARKER_ROOM", 30)
        data = environ(rng)
        for names, both in ((["LD_PRELOAD", "SLURM_JOB_ID"], ["LD_PRELOAD"]), (["HOME"], [])):
            expected = reference_environ_entries(io.BytesIO(data), names, both)
            assert proclists.environ_entries(io.BytesIO(data), names, both) == expected, data


def test_a_huge_environment_is_searched_not_split(calls):
    data = b"LD_PRELOAD=/a.so\0" + b"a\0" * 1_000_000 + b"LD_PRELOAD=/b.so\0HOME=/\0" * 2
    kept = proclists.environ_entries(io.BytesIO(data), ["LD_PRELOAD", "HOME"], ["LD_PRELOAD"])
    assert kept == b"LD_PRELOAD=/a.so\0HOME=/\0LD_PRELOAD=/b.so\0"
    assert calls["_note_entry"] <= 4 * chunks_of(data)

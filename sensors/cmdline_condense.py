"""A long command line (/proc/<pid>/cmdline) condensed to what the rules look for, in
bounded memory and CPU; the stream is read by sensors/proclists.py (`read_chunks`,
`entry_blocks`), whose doc says why it is read whole.

`cmdline` keeps every argument while the whole fits in `CMDLINE_MAX`; past that, a head, a
tail and, from the middle, the arguments that carry what rules look for (flags and URLs, and
the arguments showing the loaded rules' literals first), with one marker argument saying how
much was left out. Each kept argument is cut at `ARG_KEEP` bytes with a marker (a literal
past the cut of a head argument, shown nowhere in the head, is kept as an excerpt in the
middle, as one from the middle is). The condensed form fits `CMDLINE_MAX` and is stable:
condensing it again changes nothing, so a snapshot that records it replays to the same
event.

The sensor reads every process's command line at every sample, so its cost is the agent's:
32 million one-byte arguments (64 MiB, proclists.SCAN_MAX) cost 80 s of CPU when each went
through Python (120 s given the rules' literals). The command line is worked on a chunk at a
time instead: the bytes with C-speed primitives (`count`, `find`, `split`, regular
expressions, dictionaries, an Aho-Corasick pass), and Python only for what can change what
is kept: a flag or URL that fits the middle, an argument showing a literal not kept yet.
Those 32 million arguments cost 0.25 s (0.9 s with literals); the dearest floods, of one
flag repeated, about 100 ns an argument (one dictionary pass).

Where that differs from taking the arguments one by one (floods only; the tests compare the
two on random command lines):
- a flag or URL is weighed at its first occurrence not kept yet among the arguments a chunk
  makes leave the tail: one that did not fit is not weighed again at a later occurrence
  among them, even after a URL displacing flags freed more room than it took;
- a URL displaces flags only when it then fits (a URL too long for the room of every flag
  left them all out);
- once no URL can enter the middle (its room and the flags' under 4 bytes), URL arguments
  are not looked at: the marker's URL count is then that of their `://` (a URL repeating a
  kept one, or holding two, counted as left out too);
- an argument showing a rule's literal that the literals' room (COVER_MAX) cannot take is
  left out and counted (`, R with a rule's text]`) as before, but the rest of the chunk's
  arguments leaving the tail are condensed without the literals, and once that room cannot
  take the shortest literal not kept, literals are no longer looked for: their arguments
  are kept as flags or URLs when they are such (they were left out).
"""

from __future__ import annotations

import heapq
import re
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from functools import lru_cache
from itertools import accumulate, chain, compress, count, filterfalse, repeat
from operator import add, and_, contains, gt, itemgetter, methodcaller, or_, sub
from typing import Any, BinaryIO

from hpcsec.sensors.proclists import CUT_ANYWHERE, cut_to, entry_blocks, read_chunks

CMDLINE_MAX = 64 * 1024
HEAD_MAX = 32 * 1024
MIDDLE_MAX = 12 * 1024
TAIL_MAX = 16 * 1024
ARG_KEEP = 4 * 1024
# The marker argument standing for those left out is GAP (a cut one ends with proclists.CUT).
GAP = re.compile(
    rb"\A\xe2\x80\xa6\[hpcsec: \d+ arguments? \(\d+ bytes\) left out"
    rb"(?:, \d+ with a URL)?(?:, \d+ with a rule's text)?\]\Z"
)


def _cut(head: bytes, length: int) -> bytes:
    return cut_to(head, length, ARG_KEEP)


def _is_indicator(arg: bytes) -> bool:
    """What the rules test in a command line sits in flags (`--donate-level`, `-o`) and URLs
    (`stratum+tcp://`): such arguments are kept from the middle of a long command line."""
    return arg.startswith(b"-") or b"://" in arg


class Literals:
    """The texts the loaded rules look for in a command line (the engine's
    command_line_literals), found in one Aho-Corasick pass (C) over two consecutive
    arguments joined by a space, as the command line joins them, so that a literal of
    several words (` --algo rx/`) is found across them; ASCII letters are folded as the
    rules fold them.

    For the chunks of a long command line (NUL-separated) each literal of several words has
    variants, one per space, where that space is a NUL: a variant found is the literal across
    two consecutive arguments. A literal holding a NUL is dropped: no argument holds one."""

    def __init__(self, literals: Iterable[str]):
        self._words: list[tuple[str, tuple[str, int, bool]]] = []
        self.keys: list[tuple[bytes, str]] = []  # (key as bytes, its literal), variants too
        self.min_entry: dict[str, int] = {}  # the least room an argument kept for it takes
        for literal in {lit.strip() for lit in literals}:
            # as latin-1, a byte is one character: positions in the text are in bytes
            try:
                key = literal.lower().encode("utf-8", "surrogateescape").decode("latin-1")
            except UnicodeEncodeError:  # a lone surrogate no argument's bytes can show
                continue
            if not key or "\0" in key:
                continue
            spaces = [at for at, char in enumerate(key) if char == " "]
            variants = [key[:at] + "\0" + key[at + 1 :] for at in spaces]
            self._words.append((key, (literal, len(key), False)))
            self._words += [(variant, (literal, len(key), True)) for variant in variants]
            self.keys += [(word.encode("latin-1"), literal) for word in (key, *variants)]
            # across two arguments, the first holds at least the words before a space
            self.min_entry[literal] = min([len(key), *spaces]) + 1
        self._automaton = self.automaton(set())
        self.empty = not self._words

    def found(self, data: bytes) -> dict[str, tuple[int, int]]:
        """Each literal in `data`, with where it first is (in bytes)."""
        found: dict[str, tuple[int, int]] = {}
        if self.empty:
            return found
        for end, (literal, length, variant) in self._automaton.iter(data.lower().decode("latin-1")):
            if not variant:
                found.setdefault(literal, (end + 1 - length, end + 1))
        return found

    def automaton(self, covered: set[str]) -> Any:
        """An automaton of the literals (and variants) not in `covered`."""
        import ahocorasick  # only a sensor given rules uses it (collect's start-up stays lean)

        automaton = ahocorasick.Automaton()
        for word, value in self._words:
            if value[0] not in covered:
                automaton.add_word(word, value)
        if len(automaton):
            automaton.make_automaton()
        return automaton

    def starts(
        self, lowered: bytes, covered: set[str], automaton: Any = None
    ) -> tuple[list[tuple[int, str]], int]:
        """Where the literals (and variants) not in `covered` begin in `lowered`, in order:
        one pass (C) of `automaton` (by default, all literals'), the literals kept already
        dropped at C speed; and how many matches those were."""
        automaton = self._automaton if automaton is None else automaton
        matches = list(automaton.iter(lowered.decode("latin-1")))
        wanted = {value for _, value in self._words if value[0] not in covered}
        hits = list(compress(matches, map(wanted.__contains__, map(itemgetter(1), matches))))
        starts = sorted((end + 1 - length, literal) for end, (literal, length, _) in hits)
        return starts, len(matches) - len(hits)


EXCERPT_WHOLE = 256  # a longer argument holding a literal is kept as an excerpt around it
EXCERPT_CONTEXT = 32  # bytes kept on each side of the literal in an excerpt
COVER_MAX = 8 * 1024  # of MIDDLE_MAX, what arguments kept for the rules' literals may take
# Up to this many keys not kept yet, each is looked for with bytes.find: mostly 20 times as
# fast as an automaton pass, but on crafted text (`aws saws s…`) up to half as slow.
FEW_KEYS = 2
# an automaton of the literals not kept yet is made anew when those kept had this many
# matches per key since the last (each costs about what adding a key does)
PRUNE_MATCHES = 16
MIN_FLAG = 2  # the room the shortest flag (`-`) takes
MIN_URL = 4  # and the shortest URL (`://`)
ROOM_SHORT = 64  # with no more room than this, flags are found by a bounded expression
DENSE = 8  # one argument in this many a flag or URL: one dictionary pass over them all
WEIGH_BLOCK = 256  # flags and URLs compared to the room (in C) that many at a time


def excerpt(arg: bytes, length: int, start: int, end: int) -> bytes:
    """`arg` (the first bytes of an argument `length` long) whole when short, else the bytes
    around [start, end) with a CUT marker for each side left out."""
    if length <= EXCERPT_WHOLE and len(arg) == length:
        return arg
    low, high = max(0, start - EXCERPT_CONTEXT), min(len(arg), end + EXCERPT_CONTEXT)
    before = f"\u2026[hpcsec: cut {low} bytes]".encode() if low else b""
    after = f"\u2026[hpcsec: cut {length - high} bytes]".encode() if high < length else b""
    return before + arg[low:high] + after


def _extent(spans: list[tuple[int, int]]) -> tuple[int, int]:
    return min(start for start, _ in spans), max(end for _, end in spans)


def _long_spans(body: bytes) -> Iterator[tuple[int, int]]:
    """Where the arguments of `body` (NUL-terminated) longer than ARG_KEEP are: one rfind per
    ARG_KEEP bytes, or two, whatever the arguments."""
    at = 0
    while at + ARG_KEEP < len(body):
        nul = body.rfind(b"\0", at, at + ARG_KEEP + 1)
        if nul >= 0:
            at = nul + 1
            continue
        end = body.find(b"\0", at + ARG_KEEP)
        yield at, end
        at = end + 1


# An argument longer than ARG_KEEP past the head: where it starts (in the kept arguments
# past the head), its first bytes (all of it unless longer than CMDLINE_MAX) and its length.
_Long = tuple[int, bytes, int]


def _kept_block(head: bytes, length: int, body: bytes) -> tuple[bytes, list[_Long]]:
    """An argument (first bytes and length) and the raw complete ones after it, as kept: each
    cut at ARG_KEEP, NUL-terminated; and where those cut are, in the text returned."""
    first = _cut(head, length)
    parts = [first, b"\0"]
    longs = [(0, head, length)] if length > ARG_KEEP else []
    at = len(first) + 1
    done = 0
    for start, end in _long_spans(body):
        arg = body[start:end]
        kept = _cut(arg, len(arg))
        at += start - done
        longs.append((at, arg, len(arg)))
        parts += [body[done:start], kept, b"\0"]
        at += len(kept) + 1
        done = end + 1
    parts.append(body[done:])
    return b"".join(parts), longs


@lru_cache(maxsize=16)
def _flags_up_to(longest: int) -> re.Pattern[bytes]:
    """Flags (after a NUL) at most `longest` bytes long, a power of two: longer ones cannot
    enter the middle, and are not even made into objects; nor is a flag the same flag
    follows (a run of one flag gives its last)."""
    return re.compile(rb"\0(-[^\0]{0,%d})(?=\0)(?!\0\1\0)" % (longest - 1))


_MULTI_URL = re.compile(rb"://(?=[^\0]*?://)")  # a `://` with another after it, in one argument
_URL_ARG = re.compile(rb"\0([^\0]*?://[^\0]*)")


def _urls(text: bytes) -> tuple[list[int], list[bytes]]:
    """Where the arguments of `text` holding `://` start, and they, in order: from the pieces
    around each `://`, in a few C passes over them."""
    if _MULTI_URL.search(text):  # an argument with two: rare, by a regex
        found = list(_URL_ARG.finditer(b"\0" + text))
        return [match.start(1) - 1 for match in found], [match[1] for match in found]
    pieces = text.split(b"://")
    befores = list(map(itemgetter(2), map(methodcaller("rpartition", b"\0"), pieces[:-1])))
    afters = map(itemgetter(0), map(methodcaller("partition", b"\0"), pieces[1:]))
    ends = map(add, accumulate(map(len, pieces[:-1])), count(0, 3))
    return list(map(sub, ends, map(len, befores))), list(
        map(b"://".join, zip(befores, afters, strict=True))
    )


def _flags_at(text: bytes) -> tuple[list[int], list[bytes]]:
    """Where the flags of `text` start, and they, in order (C passes over the pieces)."""
    pieces = (b"\0" + text).split(b"\0-")
    starts = list(map(add, accumulate(map(len, pieces[:-1])), count(0, 2)))
    names = map(itemgetter(0), map(methodcaller("partition", b"\0"), pieces[1:]))
    return starts, list(map(b"-".__add__, names))


def _flags(text: bytes, room: int) -> list[bytes]:
    """The flags of `text` that may fit `room`, in order, each repeat but the first dropped
    at C speed: with little room, a regular expression makes only the short ones into
    objects (and of a run of one flag, its last); else the pieces between flags are split
    off and deduplicated, then made into flags."""
    if room < MIN_FLAG:
        return []
    if room <= ROOM_SHORT:
        return _flags_up_to(_power_of_two(room)).findall(b"\0" + text)
    pieces = dict.fromkeys((b"\0" + text).split(b"\0-")[1:])
    names = map(itemgetter(0), map(methodcaller("partition", b"\0"), pieces))
    return list(map(b"-".__add__, names))


def _has_url(args: Iterable[bytes]) -> Iterator[bool]:
    return map(contains, args, repeat(b"://"))


class _Scan:
    """Where, in a run of arguments (lowered, NUL-separated, the next argument after them),
    the next match of a literal not kept yet starts (or of a variant: a literal across two
    arguments). Few keys are each found with bytes.find, again only past the argument they
    were found in; many in one automaton pass."""

    def __init__(self, literals: Literals, covered: set[str], lowered: bytes, automaton: Any):
        self.covered = covered
        self.text = lowered
        self.keys = [(key, literal) for key, literal in literals.keys if literal not in covered]
        self.heap: list[tuple[int, int]] = []
        self.matches: list[tuple[int, str]] | None = None
        self.wasted = 0  # matches of literals kept already
        if len(self.keys) > FEW_KEYS:
            self.matches, self.wasted = literals.starts(lowered, covered, automaton)
            self.next = 0
            return
        for index, (key, _) in enumerate(self.keys):
            at = lowered.find(key)
            if at >= 0:
                self.heap.append((at, index))
        heapq.heapify(self.heap)

    def at(self, cursor: int) -> int:
        """The first match at or past `cursor` of a literal not kept yet; -1 when none."""
        if self.matches is not None:
            while self.next < len(self.matches):
                start, literal = self.matches[self.next]
                if start >= cursor and literal not in self.covered:
                    return start
                self.next += 1
            return -1
        while self.heap:
            start, index = self.heap[0]
            key, literal = self.keys[index]
            if literal in self.covered:
                heapq.heappop(self.heap)
            elif start < cursor:
                again = self.text.find(key, cursor)
                if again < 0:
                    heapq.heappop(self.heap)
                else:
                    heapq.heapreplace(self.heap, (again, index))
            else:
                return start
        return -1


class _Condensed:
    """A long command line's head, tail and middle indicators (see the module's doc).

    The middle keeps each indicator once, and a URL before a flag: 4,200 `-v` flags (or as
    many distinct ones) filled it and hid the pool URL after them. A URL takes the room of
    the oldest kept flags; only URLs past 12 KiB of other URLs are left out, and the marker
    counts them (`…, N with a URL]`).

    Given the rules' literals (`Literals`), an argument showing one that nothing kept shows
    yet comes first: it takes the room of flags and URLs, as an excerpt around the literal
    (COVER_MAX in all). Distinct flags or URLs can then no longer push out what a rule looks
    for; padding with the literals themselves only makes the rules fire. What the literals'
    room cannot take is counted in the marker (`…, N with a rule's text]`).

    Fed a chunk at a time (`add`): the arguments past the head are kept in `window`, as kept
    (cut at ARG_KEEP), NUL-separated; what the tail (the window's last TAIL_MAX bytes, whole
    arguments) leaves is a region, worked on at C speed (`_segment`) but for its arguments
    that show a literal not kept yet (`_one`, each in turn, with the argument after it).
    Within a segment, the flags and URLs not kept yet are weighed once each, in order; those
    that cannot fit the middle are passed over in C, or not even looked for."""

    def __init__(self, literals: Literals | None = None):
        self.literals = literals if literals is not None and not literals.empty else None
        self.head: list[bytes] = []
        self.head_size = 0
        self.head_open = True
        self.head_longs: list[tuple[bytes, int]] = []  # the head's arguments cut at ARG_KEEP
        self.window = b""  # the tail, NUL-terminated arguments as kept
        self.window_at = 0  # where the window starts, in the arguments past the head
        self.longs: deque[_Long] = deque()  # the window's arguments cut at ARG_KEEP
        self.middle: list[bytes | None] = []  # None: an indicator a URL or a literal displaced
        self.covers: set[int] = set()  # where in the middle the arguments kept for literals are
        self.middle_seen: set[bytes] = set()
        self.middle_size = 0
        self.flag_size = 0  # of the middle, what flags (which a URL may displace) take
        self.cover_size = 0
        self.covered: set[str] = set()  # the literals what is kept shows
        self.automaton: Any = None  # of the literals not kept (None: all, the literals')
        self.wasted = 0  # matches of literals kept already, since that automaton was made
        self.next_flag = 0  # where the oldest flag that may still be kept is, at the least
        self.next_url = 0  # the same for URLs (a literal's argument may displace one)
        self.carried: tuple[int, int] | None = None  # the next argument's part of a literal
        self.paused = False  # a literal found no room: the rest of the region goes without
        self.need = 0  # the least room an argument kept for a literal not kept yet takes
        self.need_for = -1  # how many literals were kept when `need` was reckoned
        self.left_out = 0
        self.left_out_bytes = 0
        self.left_out_urls = 0
        self.left_out_literals = 0

    # -- arguments in ------------------------------------------------------------------

    def add(self, head: bytes, length: int, body: bytes) -> None:
        """An argument (its first bytes: all of it unless longer than CMDLINE_MAX, and its
        length), then the complete ones after it, raw and NUL-terminated."""
        text, longs = _kept_block(head, length, body)
        if self.head_open:
            text, longs = self._fill_head(text, longs)
        if not text:
            return
        if self.literals is not None:
            at = self.window_at + len(self.window)
            self.longs.extend((at + start, whole, size) for start, whole, size in longs)
        self.window += text
        if len(self.window) <= TAIL_MAX:
            return
        # the tail: the last whole arguments within TAIL_MAX (kept size and NUL)
        cut = self.window.find(b"\0", len(self.window) - TAIL_MAX - 1) + 1
        region, self.window = self.window[:cut], self.window[cut:]
        self.window_at += cut
        self._leave(region, self.window_at - cut)

    def _fill_head(self, text: bytes, longs: list[_Long]) -> tuple[bytes, list[_Long]]:
        """The head takes the arguments while they fit HEAD_MAX; the first that does not
        closes it."""
        cut = text.rfind(b"\0", 0, max(0, HEAD_MAX - self.head_size)) + 1
        if cut:
            self.head += text[: cut - 1].split(b"\0")
            self.head_size += cut
            if self.literals is not None:
                self.covered.update(self.literals.found(text[:cut]))
                self.head_longs += [(whole, size) for at, whole, size in longs if at < cut]
        if cut < len(text):
            self.head_open = False
            self._cover_head()
        return text[cut:], [(at - cut, whole, size) for at, whole, size in longs if at >= cut]

    def _cover_head(self) -> None:
        """The literals past the cut of the head's long arguments that the head does not
        show, each argument's kept from it as an excerpt, first in the middle: a `bash -c`
        script of 70 KB hid `xmrig` past its first ARG_KEEP bytes."""
        for whole, length in self.head_longs:
            # its first bytes (all of it unless longer than CMDLINE_MAX): what the head's cut
            # form leaves out of them, not only what a rule could see across two arguments
            found = self.literals.found(whole) if self.literals else {}
            own = {lit: span for lit, span in found.items() if lit not in self.covered}
            if not own or self._to_cover(excerpt(whole, length, *_extent([*own.values()]))):
                self.covered.update(own)
                continue
            for literal, span in sorted(own.items(), key=lambda item: item[1][1] - item[1][0]):
                # far apart: an excerpt around each that still fits the literals' room
                if literal not in self.covered and self._to_cover(excerpt(whole, length, *span)):
                    self.covered.add(literal)
        self.head_longs = []

    # -- what leaves the tail ------------------------------------------------------------

    def _leave(self, region: bytes, region_at: int) -> None:
        if self.literals is None:
            self._segment(region)
            return
        self.paused = False
        done = 0
        while self.longs and self.longs[0][0] < region_at + len(region):
            start, whole, length = self.longs.popleft()
            start -= region_at
            self._run(region[done:start], _joinable(whole, length))
            end = region.find(b"\0", start)
            after = self._joinable_at(region, region_at, end + 1)
            self._single(region[start:end], whole, length, after)
            done = end + 1
        self._run(region[done:], self._joinable_at(region, region_at, len(region)))

    def _joinable_at(self, region: bytes, region_at: int, start: int) -> bytes:
        """The argument at `start` of the region (past it, the window's first) as literals are
        looked for in it."""
        if self.longs and self.longs[0][0] == region_at + start:
            return _joinable(*self.longs[0][1:])
        text, start = (region, start) if start < len(region) else (self.window, 0)
        return text[start : text.find(b"\0", start)]

    def _single(self, kept: bytes, whole: bytes, length: int, right: bytes) -> None:
        if self.carried is not None or self._searching():
            self._one(kept, whole, length, right)
        else:
            self._segment(kept + b"\0")

    def _run(self, text: bytes, after: bytes) -> None:
        """Arguments of ARG_KEEP bytes at most (as read: literals are looked for in them as
        kept), and the argument after them: those showing a literal not kept yet one by one,
        the others by segments."""
        scan = None
        if self.literals is not None and self._searching():
            lowered = text.lower() + after.lower()
            scan = _Scan(self.literals, self.covered, lowered, self.automaton)
            self.wasted += scan.wasted
            if self.wasted > PRUNE_MATCHES * len(self.literals.keys):
                self.automaton = self.literals.automaton(self.covered)
                self.wasted = 0
        done = 0
        while done < len(text):
            if self.carried is not None:
                start = done  # the rest of a literal across: this argument is kept too
            else:
                found = scan.at(done) if scan is not None else -1
                if not 0 <= found < len(text):
                    break
                start = text.rfind(b"\0", 0, found) + 1
            self._segment(text[done:start])
            end = text.find(b"\0", start)
            arg = text[start:end]
            nxt = text.find(b"\0", end + 1)
            self._one(arg, arg, len(arg), text[end + 1 : nxt] if nxt >= 0 else after)
            done = end + 1
            if scan is not None and not self._searching():
                scan = None
        self._segment(text[done:])

    def _searching(self) -> bool:
        """Whether literals are looked for: some not kept yet, and room for one of them."""
        if self.literals is None or self.paused:
            return False
        if self.need_for != len(self.covered):  # the literals kept only grow
            needs = self.literals.min_entry.items()
            left = (need for literal, need in needs if literal not in self.covered)
            self.need = min(left, default=COVER_MAX + 1)
            self.need_for = len(self.covered)
        return self.need <= COVER_MAX - self.cover_size

    def _one(self, kept: bytes, whole: bytes, length: int, right: bytes) -> None:
        """An argument, with the one after it (as literals are looked for in it): kept for the
        literals it shows that nothing kept shows yet, else as a flag or URL, else left out."""
        assert self.literals is not None
        carried, self.carried = self.carried, None
        left = _joinable(whole, length)
        own: dict[str, tuple[int, int]] = {}
        across: dict[str, tuple[int, int]] = {}  # literal -> its part here, and in the next
        for literal, (start, end) in self.literals.found(left + b" " + right).items():
            if literal in self.covered or start >= len(left):
                continue  # kept already, or all in the next one (looked for in its turn)
            if end <= len(left):
                own[literal] = (start, end)
            else:  # across the space: both are kept, next to each other in the middle
                across[literal] = (start, end - len(left) - 1)
        spans = [*([carried] if carried is not None else []), *own.values()]
        spans += [(start, len(left)) for start, _ in across.values()]
        if not spans:
            self._keep_or_leave(kept)
        elif self._to_cover(excerpt(whole, length, *_extent(spans))):
            self._covering(own, across)
            self.middle_seen.add(kept)
        elif not self._one_of(kept, whole, length, carried, own, across):
            # no room for even one: counted, and the rest of the region goes without literals
            self.left_out_literals += 1
            self._leave_out(kept)
            self.paused = True

    def _covering(
        self, own: dict[str, tuple[int, int]], across: dict[str, tuple[int, int]]
    ) -> None:
        """The literals an argument just kept shows (recorded only once it is kept: one
        left out must not stand for a later copy that would fit)."""
        self.covered.update(own)
        self.covered.update(across)
        if across:
            self.carried = (0, max(end for _, end in across.values()))

    def _one_of(
        self,
        kept: bytes,
        whole: bytes,
        length: int,
        carried: tuple[int, int] | None,
        own: dict[str, tuple[int, int]],
        across: dict[str, tuple[int, int]],
    ) -> bool:
        """The argument's literals far apart made an excerpt too large for the literals'
        room: an excerpt around one of them instead (the literal across from the one before
        first, as the one before was kept for it); False when none fits."""
        Spans = dict[str, tuple[int, int]]
        choices: list[tuple[tuple[int, int], Spans, Spans]]
        if carried is not None:
            choices = [(carried, {}, {})]
        else:
            choices = [((a, b), {lit: (a, b)}, {}) for lit, (a, b) in own.items()]
            choices += [
                ((a, len(_joinable(whole, length))), {}, {lit: (a, b)})
                for lit, (a, b) in across.items()
            ]
        for span, one_own, one_across in sorted(choices, key=lambda c: c[0][1] - c[0][0]):
            if self._to_cover(excerpt(whole, length, *span)):
                self._covering(one_own, one_across)
                self.middle_seen.add(kept)
                return True
        return False

    def _segment(self, text: bytes) -> None:
        """Arguments (as kept, NUL-terminated) showing no literal not kept yet: all counted
        as left out, then those flags and URLs that enter the middle taken back. What none
        of them can enter is not looked at; many of them take one dictionary pass over all
        the arguments (a flood of one flag costs no more); a few, passes over them alone."""
        if not text:
            return
        args = text.count(b"\0")
        self.left_out += args
        self.left_out_bytes += len(text) - args
        room = MIDDLE_MAX - self.middle_size
        url_room = room + self.flag_size  # a URL may take the room of every flag
        url_marks = text.count(b"://")
        urls_may = url_marks > 0 and url_room >= MIN_URL
        flags_may = (room >= MIN_FLAG or (urls_may and self.flag_size > 0)) and (
            text.startswith(b"-") or b"\0-" in text
        )
        if not urls_may:
            self.left_out_urls += url_marks  # none could enter: not looked at, counted so
            if flags_may:
                self._weigh(_flags(text, room))
            return
        flag_args = text.count(b"\0-") + text.startswith(b"-") if flags_may else 0
        if DENSE * (url_marks + flag_args) >= args:
            self._weigh_all(text)
            return
        url_at, urls = _urls(text)
        unseen = filterfalse(self.middle_seen.__contains__, urls)
        if flags_may and any(map(gt, repeat(url_room), map(len, unseen))):
            # a URL that may enter (and free room for flags after it): in their order
            flag_at, flags = _flags_at(text)
            pairs = chain(zip(flag_at, flags, strict=True), zip(url_at, urls, strict=True))
            self._weigh(list(map(itemgetter(1), sorted(pairs))))
        else:  # the flags alone, or the URLs alone, may change the middle
            self._weigh(_flags(text, room) if flags_may else urls)
        # a URL left out is counted unless it repeats one kept
        self.left_out_urls += len(urls) - sum(map(self.middle_seen.__contains__, urls))

    def _weigh_all(self, text: bytes) -> None:
        """Every argument of `text` counted in one dictionary pass (C), in their order: the
        flags and URLs among those distinct weighed."""
        counts = Counter(text.split(b"\0"))
        distinct = list(counts)
        indicator = map(or_, map(methodcaller("startswith", b"-"), distinct), _has_url(distinct))
        order = list(compress(distinct, indicator))
        self._weigh(order)
        urls = compress(order, _has_url(order))
        left = filterfalse(self.middle_seen.__contains__, urls)
        self.left_out_urls += sum(map(counts.__getitem__, left))

    def _weigh(self, order: list[bytes]) -> None:
        """The flags and URLs of a segment, in order: each not kept yet enters the middle if
        it fits (a URL in the room of the oldest flags); those that cannot are passed over in
        C, the sizes compared to the room as it was when the scan began and weighed again
        when it was less."""
        fresh = list(dict.fromkeys(filterfalse(self.middle_seen.__contains__, order)))
        sizes = list(map(len, fresh))
        is_url = list(_has_url(fresh))
        start = 0
        while start < len(fresh):
            room = MIDDLE_MAX - self.middle_size
            url_room = room + self.flag_size
            if room < MIN_FLAG and url_room < MIN_URL:
                return  # nothing fits any more
            stop = start + WEIGH_BLOCK
            block = sizes[start:stop]
            fits = map(
                or_,
                map(gt, repeat(room), block),
                map(and_, is_url[start:stop], map(gt, repeat(url_room), block)),
            )
            start = self._enter_fitting(fresh, compress(count(start), fits), stop)

    def _enter_fitting(self, fresh: list[bytes], fitting: Iterator[int], stop: int) -> int:
        """Those of `fresh` at `fitting` (found to fit the room as it was) that still fit
        enter the middle; where to scan on from: past one that no longer fits or a URL that
        freed room (displacing flags), else `stop`."""
        for at in fitting:
            arg = fresh[at]
            if not self._fits(arg):
                return at
            room = MIDDLE_MAX - self.middle_size
            self._enter(arg)
            self.left_out -= 1
            self.left_out_bytes -= len(arg)
            if MIDDLE_MAX - self.middle_size > room - len(arg) - 1:
                return at + 1
        return stop

    # -- the middle ------------------------------------------------------------------------

    def _keep_or_leave(self, arg: bytes) -> None:
        if not _is_indicator(arg) or arg in self.middle_seen:
            self._leave_out(arg)
        elif self._fits(arg):
            self._enter(arg)
        else:
            self._leave_out(arg)
            self.left_out_urls += b"://" in arg

    def _fits(self, arg: bytes) -> bool:
        """Whether `arg` fits the middle: in its room, or for a URL in that of every flag."""
        room = MIDDLE_MAX - self.middle_size + (self.flag_size if b"://" in arg else 0)
        return len(arg) < room

    def _enter(self, arg: bytes) -> None:
        size = len(arg) + 1
        url = b"://" in arg
        while url and self.middle_size + size > MIDDLE_MAX and self._drop_oldest(url=False):
            pass
        self.middle.append(arg)
        self.middle_seen.add(arg)
        self.middle_size += size
        self.flag_size += 0 if url else size

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

    def _drop_oldest(self, url: bool) -> bool:
        """Leave out the oldest flag (or URL) kept in the middle; False when none is."""
        at = self.next_url if url else self.next_flag
        while at < len(self.middle):
            kept = self.middle[at]
            if kept is not None and at not in self.covers and (b"://" in kept) == url:
                self.middle[at] = None
                self.middle_size -= len(kept) + 1
                self.flag_size -= 0 if url else len(kept) + 1
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
        self._cover_head()  # a head that never closed (a few long arguments) is done now
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
        return [*self.head, *gap, *middle, *self.window.split(b"\0")[:-1]]


def _power_of_two(room: int) -> int:
    """The least power of two at least `room`: few patterns are compiled."""
    return 1 << (room - 1).bit_length()


def _joinable(whole: bytes, length: int) -> bytes:
    """What of an argument literals are looked for in: all of it when it was read whole, else
    its kept form (a literal past its CUT marker shows in no command line rules see)."""
    return whole if len(whole) == length else _cut(whole, length)


def cmdline(stream: BinaryIO, literals: Literals | None = None) -> bytes:
    """A /proc/<pid>/cmdline stream, condensed when it exceeds CMDLINE_MAX (NUL-terminated
    arguments, as the kernel gives them); `literals`: the rules' (see _Condensed)."""
    return b"".join(arg + b"\0" for arg in cmdline_args(stream, literals))


def is_condensed(args: Iterable[bytes | str]) -> bool:
    """Whether an argument list has lost something: an argument cut (at its end, or around a
    rule's literal) or some left out."""
    for arg in args:
        raw = arg.encode("utf-8", "surrogateescape") if isinstance(arg, str) else arg
        if CUT_ANYWHERE.search(raw) or GAP.match(raw):
            return True
    return False


def cmdline_args(stream: BinaryIO, literals: Literals | None = None) -> list[bytes]:
    """The arguments of a /proc/<pid>/cmdline stream, condensed when it exceeds CMDLINE_MAX."""
    chunks = read_chunks(stream)
    early: list[bytes] = []
    for chunk in chunks:
        early.append(chunk)
        if sum(map(len, early)) > CMDLINE_MAX + 1:
            break
    else:
        data = b"".join(early)
        # each argument and its NUL (the last NUL is optional)
        if len(data) + (not data.endswith(b"\0")) <= CMDLINE_MAX + 1:
            args = data.split(b"\0")
            return args[:-1] if data.endswith(b"\0") or not data else args
    condensed = _Condensed(literals)
    for head, length, body in entry_blocks(chain(early, chunks), CMDLINE_MAX):
        condensed.add(head, length, body)
    return condensed.args()

"""NUL-separated /proc lists (cmdline, environ) read whole in bounded memory.

A process's owner decides how long its argv and environment are (up to the kernel's ARG_MAX,
megabytes with a large stack limit). Reading only a first block would let them hide what a
rule looks for behind 64 KiB of padding: `LD_PRELOAD=` after a 70 KB variable, `--url
stratum+tcp://…` after a 66 KB argument. So the whole file is streamed in chunks and only
what is needed is kept:

- environ: the entries of the variables asked for, each cut at `ENTRY_MAX`;
- cmdline: every argument while the whole fits in `CMDLINE_MAX`; past that, a head, a tail
  and, from the middle, the arguments that carry what rules look for (flags and URLs), with
  one marker argument saying how much was left out. Each kept argument is cut at `ARG_KEEP`
  bytes with a marker. The condensed form fits `CMDLINE_MAX` and is stable: condensing it
  again changes nothing, so a snapshot that records it replays to the same event.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

CHUNK = 64 * 1024
SCAN_MAX = 64 * 1024 * 1024  # past this (an absurd stack limit) the rest is not read
ENTRY_MAX = 16 * 1024  # an environment value we keep (LD_PRELOAD lists)
MARKER_ROOM = 64  # what a CUT marker adds to a kept entry, at most
CMDLINE_MAX = 64 * 1024
HEAD_MAX = 32 * 1024
MIDDLE_MAX = 12 * 1024
TAIL_MAX = 16 * 1024
ARG_KEEP = 4 * 1024
# The markers: a cut argument ends with CUT, an argument standing for those left out is GAP.
CUT_MARKER = rb"\xe2\x80\xa6\[hpcsec: cut \d+ bytes\]"
CUT = re.compile(CUT_MARKER + rb"\Z")
_CUT_ANYWHERE = re.compile(CUT_MARKER)
GAP = re.compile(
    rb"\A\xe2\x80\xa6\[hpcsec: \d+ arguments? \(\d+ bytes\) left out(?:, \d+ with a URL)?\]\Z"
)


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


def environ_entries(
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


def holds_cut(value: str) -> bool:
    """Whether event text (a kept argument or environment value) holds a CUT marker."""
    return _CUT_ANYWHERE.search(value.encode("utf-8", "surrogateescape")) is not None


def _is_indicator(arg: bytes) -> bool:
    """What the rules test in a command line sits in flags (`--donate-level`, `-o`) and URLs
    (`stratum+tcp://`): such arguments are kept from the middle of a long command line."""
    return arg.startswith(b"-") or b"://" in arg


@dataclass
class _Condensed:
    """A long command line's head, tail and middle indicators (see the module's doc).

    The middle keeps each indicator once, and a URL before a flag: 4,200 `-v` flags (or as
    many distinct ones) filled it and hid the pool URL after them. A URL takes the room of
    the oldest kept flags; only URLs past 12 KiB of other URLs are left out, and the marker
    counts them (`…, N with a URL]`), which no padding of flags can make."""

    head: list[bytes]
    head_size: int = 0
    middle_size: int = 0
    tail_size: int = 0
    left_out: int = 0
    left_out_bytes: int = 0
    left_out_urls: int = 0

    def __post_init__(self) -> None:
        self.middle: list[bytes | None] = []  # None: a flag a URL took the room of
        self.middle_seen: set[bytes] = set()
        self.next_flag = 0  # where the oldest flag that may still be kept is, at the least
        self.tail: deque[bytes] = deque()

    def add(self, arg: bytes, length: int) -> None:
        if self.head_size + len(arg) + 1 <= HEAD_MAX and not self.middle and not self.tail:
            self.head.append(arg)
            self.head_size += len(arg) + 1
            return
        self.tail.append(arg)
        self.tail_size += len(arg) + 1
        while self.tail_size > TAIL_MAX:
            old = self.tail.popleft()
            self.tail_size -= len(old) + 1
            if _is_indicator(old) and old not in self.middle_seen:
                self._to_middle(old)
            else:
                self._leave_out(old)

    def _to_middle(self, arg: bytes) -> None:
        size = len(arg) + 1
        url = b"://" in arg
        while url and self.middle_size + size > MIDDLE_MAX and self._drop_oldest_flag():
            pass
        if self.middle_size + size > MIDDLE_MAX:
            self._leave_out(arg)
            self.left_out_urls += url
            return
        self.middle.append(arg)
        self.middle_seen.add(arg)
        self.middle_size += size

    def _drop_oldest_flag(self) -> bool:
        """Leave out the oldest flag kept in the middle; False when none is."""
        while self.next_flag < len(self.middle):
            kept = self.middle[self.next_flag]
            if kept is not None and b"://" not in kept:
                self.middle[self.next_flag] = None
                self.middle_size -= len(kept) + 1
                self._leave_out(kept)
                return True
            self.next_flag += 1
        return False

    def _leave_out(self, arg: bytes) -> None:
        self.left_out += 1
        self.left_out_bytes += len(arg)

    def args(self) -> list[bytes]:
        gap: list[bytes] = []
        if self.left_out:
            plural = "s" if self.left_out != 1 else ""
            urls = f", {self.left_out_urls} with a URL" if self.left_out_urls else ""
            gap = [
                f"\u2026[hpcsec: {self.left_out} argument{plural} "
                f"({self.left_out_bytes} bytes) left out{urls}]".encode()
            ]
        middle = [arg for arg in self.middle if arg is not None]
        return [*self.head, *gap, *middle, *self.tail]


def cmdline(stream: BinaryIO) -> bytes:
    """A /proc/<pid>/cmdline stream, condensed when it exceeds CMDLINE_MAX (NUL-terminated
    arguments, as the kernel gives them)."""
    return b"".join(arg + b"\0" for arg in cmdline_args(stream))


def is_condensed(args: Iterable[bytes | str]) -> bool:
    """Whether an argument list has lost something: an argument cut or some left out."""
    for arg in args:
        raw = arg.encode("utf-8", "surrogateescape") if isinstance(arg, str) else arg
        if CUT.search(raw) or GAP.match(raw):
            return True
    return False


def cmdline_args(stream: BinaryIO) -> list[bytes]:
    """The arguments of a /proc/<pid>/cmdline stream, condensed when it exceeds CMDLINE_MAX."""
    whole: list[tuple[bytes, int]] = []
    total = 0
    condensed: _Condensed | None = None
    for head, length in _entries(stream, CMDLINE_MAX):
        if condensed is None:
            whole.append((head, length))
            total += length + 1
            if total <= CMDLINE_MAX + 1:  # the last NUL is optional
                continue
            condensed = _Condensed([])
            for early, early_length in whole:
                condensed.add(_cut(early, early_length), early_length)
            whole = []
        else:
            condensed.add(_cut(head, length), length)
    return [head for head, _ in whole] if condensed is None else condensed.args()

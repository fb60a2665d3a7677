"""NUL-separated /proc lists (cmdline, environ) read whole in bounded memory and CPU.

A process's owner decides how long its argv and environment are (up to the kernel's ARG_MAX,
megabytes with a large stack limit). Reading only a first block would let them hide what a
rule looks for behind 64 KiB of padding: `LD_PRELOAD=` after a 70 KB variable, `--url
stratum+tcp://…` after a 66 KB argument. So the whole file is streamed in chunks and only
what is needed is kept:

- environ: the entries of the variables asked for, each cut at `ENTRY_MAX`;
- cmdline: its arguments, condensed when long (sensors/cmdline_condense.py, which reads the
  stream with `read_chunks` and `entry_blocks` and cuts an argument with `cut_to`).

The sensor reads every process's lists at every sample, so their cost is the agent's: both
lists are worked on a chunk at a time, the bytes with C-speed primitives and Python only for
what can change what is kept; here, an environment entry asked for (each chunk is searched
for the names, not split into its entries). Past SCAN_MAX the rest of a list is not read.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import BinaryIO

CHUNK = 64 * 1024
SCAN_MAX = 64 * 1024 * 1024  # past this (an absurd stack limit) the rest is not read
ENTRY_MAX = 16 * 1024  # an environment value we keep (LD_PRELOAD lists)
MARKER_ROOM = 64  # what a CUT marker adds to a kept entry, at most
# The markers: a cut argument (or environment entry) ends with CUT; the one argument
# standing for those left out of a long command line is cmdline_condense.GAP.
CUT_MARKER = rb"\xe2\x80\xa6\[hpcsec: cut \d+ bytes\]"
CUT = re.compile(CUT_MARKER + rb"\Z")
CUT_ANYWHERE = re.compile(CUT_MARKER)


def read_chunks(stream: BinaryIO) -> Iterator[bytes]:
    read = 0
    while read < SCAN_MAX:
        chunk = stream.read(CHUNK)
        if not chunk:
            return
        read += len(chunk)
        yield chunk


def entry_blocks(chunks: Iterable[bytes], keep_max: int) -> Iterator[tuple[bytes, int, bytes]]:
    """Per chunk that ends an entry: that entry (begun chunks before, maybe) as its first
    `keep_max` + 1 bytes and its length, then the chunk's next complete entries, raw and
    NUL-terminated; last, an unterminated entry the same way (with no entries after it)."""
    current = bytearray()
    length = 0
    for chunk in chunks:
        first = chunk.find(b"\0")
        end = len(chunk) if first < 0 else first
        if len(current) <= keep_max:
            current += chunk[: min(end, keep_max + 1 - len(current))]
        length += end
        if first < 0:
            continue
        last = chunk.rfind(b"\0")
        yield bytes(current), length, chunk[first + 1 : last + 1]
        current = bytearray(chunk[last + 1 : last + 2 + keep_max])
        length = len(chunk) - last - 1
    if length:
        yield bytes(current), length, b""


def _entry_at(body: bytes, start: int, keep_max: int) -> tuple[bytes, int]:
    end = body.find(b"\0", start)
    return body[start : min(end, start + keep_max + 1)], end - start


def _starts(body: bytes, prefix: bytes) -> tuple[int, int] | None:
    """Where the first and the last entry of `body` that begin with `prefix` begin."""
    first = 0 if body.startswith(prefix) else body.find(b"\0" + prefix) + 1
    if not first and not body.startswith(prefix):
        return None
    return first, max(first, body.rfind(b"\0" + prefix) + 1)


def environ_entries(
    stream: BinaryIO, names: Iterable[str], first_and_last: Iterable[str] = ()
) -> bytes:
    """The entries `NAME=value` of `names`, NUL-terminated: the first of each, as getenv
    reads it, and for the names in `first_and_last` the last one too when it differs (glibc's
    ld.so takes the last LD_PRELOAD, musl's the first: an allowed one must hide neither). An
    entry longer than ENTRY_MAX is cut with a CUT marker, never silently: a library behind
    16 KiB of `:` is not claimed to be absent. Each chunk is searched for the names (C),
    not split into its entries: 32 million one-byte entries are no cost."""
    prefixes = {name.encode() + b"=" for name in names}
    both = {name.encode() + b"=" for name in first_and_last} & prefixes
    first: dict[bytes, bytes] = {}
    last: dict[bytes, bytes] = {}
    keep_max = ENTRY_MAX + MARKER_ROOM
    for head, length, body in entry_blocks(read_chunks(stream), keep_max):
        key, sep, _ = head.partition(b"=")
        _note_entry(key + sep, _cut_entry(head, length), prefixes, both, first, last)
        found: list[tuple[int, bytes]] = []
        for prefix in prefixes:
            where = _starts(body, prefix) if prefix not in first or prefix in both else None
            if where is None:
                continue
            if prefix not in first:
                found.append((where[0], prefix))
            if prefix in both and (prefix in first or where[1] != where[0]):
                found.append((where[1], prefix))  # only the last of a chunk may be the last
        for start, prefix in sorted(found):  # in their order: the first dict's order is theirs
            entry = _cut_entry(*_entry_at(body, start, keep_max))
            _note_entry(prefix, entry, prefixes, both, first, last)
        if len(first) == len(prefixes) and not both:
            break
    kept = [first[p] for p in first]
    kept += [last[p] for p in first if p in last and last[p] != first[p]]
    return b"".join(entry + b"\0" for entry in kept)


def _note_entry(
    prefix: bytes,
    entry: bytes,
    prefixes: set[bytes],
    both: set[bytes],
    first: dict[bytes, bytes],
    last: dict[bytes, bytes],
) -> None:
    if prefix not in prefixes:
        return
    if prefix not in first:
        first[prefix] = entry
    elif prefix in both:
        last[prefix] = entry


def _cut_entry(head: bytes, length: int) -> bytes:
    """An environment entry within ENTRY_MAX, as it is, or cut with a marker; one cut already
    (a snapshot's record, read again) stays as it is."""
    if length <= ENTRY_MAX + MARKER_ROOM and CUT.search(head):
        return head
    return cut_to(head, length, ENTRY_MAX)


def cut_to(head: bytes, length: int, keep: int) -> bytes:
    """The first `keep` bytes of what was `length` long, and a CUT marker when it was longer."""
    if length <= keep:
        return head
    return head[:keep] + f"\u2026[hpcsec: cut {length - keep} bytes]".encode()


def holds_cut(value: str) -> bool:
    """Whether event text (a kept argument or environment value) holds a CUT marker."""
    return CUT_ANYWHERE.search(value.encode("utf-8", "surrogateescape")) is not None

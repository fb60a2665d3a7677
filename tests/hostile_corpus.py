"""One corpus of hostile strings for every parser, renderer and output: what the users of a
node can put in a command line, a file name, an environment value, a job name or a firmware
string. Tests parametrize over `CORPUS` so each (item, surface) pair is its own test id."""

from __future__ import annotations

import os

FORGED_SYSLOG = "\n<13>1 2026-11-30T01:00:00Z gpu-017 app - - - forged"

# id -> the bytes a node user writes
CORPUS: dict[str, bytes] = {
    "markup-close": b"python3 train.py [/x]",
    "markup-hide": b"[black on black]hidden[/]",
    "markup-link": b"[link=file:///etc/shadow]click[/link]",
    "ansi-clear": b"x\x1b[2Jy",
    "osc-title": b"x\x1b]0;pwned\x07y",
    "crlf-forged-syslog": b"x\r" + FORGED_SYSLOG.encode(),
    "sd-cef-specials": b'x] " \\ = | y',
    "bidi": "x\u202egnp.exe\u2066y".encode(),
    "zero-width": "x\u200by\ufeff".encode(),
    "nul": b"x\x00y",
    "c1-csi": "x\u009b31my".encode(),
    "invalid-utf8": b"x\xff\xfey",
    "one-megabyte": b"M" * 1_000_000,
}
IDS = list(CORPUS)

# Characters no human-facing output or SIEM body may carry raw (newline is the renderers'
# own layout; node text with a newline is checked to arrive escaped).
_CONTROLS = (*range(0x09), *range(0x0B, 0x20), 0x7F, *range(0x80, 0xA0))
RAW = (*(chr(c) for c in _CONTROLS), "\u200b", "\u200e", "\u202e", "\u2066", "\ufeff")


def as_text(raw: bytes) -> str:
    """How a sensor reads the item at the edge (lossless: surrogateescape)."""
    return os.fsdecode(raw)


def escaped(raw: bytes) -> str:
    """The item as events carry it: invalid bytes as `\\xff`, everything else as is."""
    return raw.decode("utf-8", "backslashreplace")


def file_name(raw: bytes) -> bytes:
    """The item as one file name: no NUL or slash, at most 255 bytes (the kernel's limits)."""
    return raw.replace(b"\0", b"").replace(b"/", b"_")[:255] or b"_"


def raw_controls(text: str) -> list[str]:
    return [repr(c) for c in RAW if c in text]


def surrogates(text: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in text)


def assert_inert(text: str) -> None:
    """Nothing a terminal or SIEM would obey, and nothing that is not real text."""
    found = raw_controls(text)
    assert not found, f"raw {found} in output"
    assert not surrogates(text), "a lone surrogate reached the output"

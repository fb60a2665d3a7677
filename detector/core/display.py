"""Node text made safe to show to a person: `visible(s)`.

Everything a node reports (user names, command lines, paths, host names) is written by the
people hpcsec watches. Shown raw, a control byte drives the reader's terminal (`ESC [2J`
clears it, `ESC ]0;…BEL` sets its title, OSC 8 plants a link), a CR or LF forges another
line of a report or log, and a bidi override or an invisible character makes the text read
differently from what it is (`gpt.exe` shown for `exe.tpg`). `visible` keeps every character
a person can see and shows the others as escapes, so what is read is what was there:

- C0 controls, DEL and C1 controls: `\\xNN`
- bidi controls, zero-width and other invisible format characters, line and paragraph
  separators, the byte order mark and tag characters: `\\uNNNN` (`\\UNNNNNNNN` above U+FFFF)
- lone surrogates: `\\xNN` for the bytes `surrogateescape` carries (U+DC80..U+DCFF), so an
  undecodable byte reads the same as in the events, `\\uNNNN` for any other

Backslashes are kept as they are: events already carry undecodable bytes as `\\xNN` text, and
doubling backslashes would show those differently from the events themselves.
"""

from __future__ import annotations

import functools
import re
from urllib.parse import urlsplit  # pathlib imports it: free

# Explicit ranges rather than a table built from unicodedata at import: the Slurm prolog
# imports this and runs before every job. C0 controls are added below: JSON escapes those
# itself and has line breaks of its own between tokens.
_INVISIBLE_IN_JSON = (
    "\x7f-\x9f"  # DEL, C1
    "\xad"  # soft hyphen
    "\u034f"  # combining grapheme joiner
    "\u0600-\u0605\u06dd\u070f\u0890\u0891\u08e2"  # Arabic/Syriac marks: format characters
    "\u061c"  # Arabic letter mark (bidi)
    "\u115f\u1160\u3164\uffa0"  # Hangul fillers: blank glyphs
    "\u180e"  # Mongolian vowel separator
    "\u200b-\u200f"  # zero width space/non-joiner/joiner, LRM, RLM
    "\u2028-\u202e"  # line/paragraph separator, bidi embeddings and overrides
    "\u2060-\u206f"  # word joiner, invisible operators, bidi isolates, deprecated formats
    "\ufe00-\ufe0f"  # variation selectors
    "\ufeff"  # byte order mark / zero width no-break space
    "\ufff9-\ufffb"  # interlinear annotation
    "\ud800-\udfff"  # lone surrogates (surrogateescape bytes and broken UTF-16)
    "\U000110bd\U000110cd"  # Kaithi number signs: format characters
    "\U00013430-\U0001343f"  # Egyptian hieroglyph format controls: invisible joiners
    "\U0001bca0-\U0001bca3"  # shorthand format controls: invisible
    "\U0001d173-\U0001d17a"  # musical formatting
    "\U000e0000-\U000e007f"  # tag characters: invisible ASCII look-alikes
    "\U000e0100-\U000e01ef"  # variation selectors supplement
)
_INVISIBLE = f"[\x00-\x1f{_INVISIBLE_IN_JSON}]"
_INVISIBLE_JSON = f"[{_INVISIBLE_IN_JSON}]"


@functools.cache
def _compiled(pattern: str) -> re.Pattern[str]:
    """The classes above compiled when first needed: each is a few milliseconds of a short
    command's start-up (the compiler builds a map of the Basic Multilingual Plane)."""
    return re.compile(pattern)


def _escape(match: re.Match[str]) -> str:
    code = ord(match[0])
    if code < 0x100:
        return f"\\x{code:02x}"
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8, carried by surrogateescape
        return f"\\x{code - 0xDC00:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def visible(value: object) -> str:
    """`value` as text whose every character shows: controls and invisible characters escaped."""
    text = value if isinstance(value, str) else str(value)
    if text.isascii() and text.isprintable():  # no C0 control, no DEL: nothing to escape
        return text
    return _compiled(_INVISIBLE).sub(_escape, text)


def _json_escape(match: re.Match[str]) -> str:
    code = ord(match[0])
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    code -= 0x10000  # a UTF-16 surrogate pair, as JSON writes characters above U+FFFF
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def visible_json(encoded: bytes) -> bytes:
    """JSON text (UTF-8) with DEL, C1 controls and invisible characters written as `\\uNNNN`
    escapes: the same JSON value, but nothing in it drives or hides from a terminal. (JSON
    encoders already escape C0 controls.) Such characters only occur inside JSON strings, so
    replacing them anywhere in the text is safe."""
    text = encoded.decode("utf-8", "surrogateescape")
    if text.isascii() and "\x7f" not in text:  # the usual case, without a regex pass
        return encoded
    return _compiled(_INVISIBLE_JSON).sub(_json_escape, text).encode("utf-8", "surrogateescape")


_SCHEME = re.compile(r"[a-z][a-z0-9+.-]{0,15}")
_DEFAULT_PORTS = {"http": 80, "https": 443}


def redacted_url(url: str) -> str:
    """`url` as scheme, host and port plus a short hash of the whole URL, for every place a
    person or a metrics system sees it: webhook URLs carry tokens in their path (Slack-style)
    or query. `https://hooks.example/T0/B0/XXX?token=…` -> `https://hooks.example:443#1a2b3c`.
    The hash tells two URLs of one host apart without showing either. Malformed URLs (a
    mistyped scheme) lose everything but what is recognisably a scheme and a host."""
    import hashlib  # here, not at the top: every command imports this module for `visible`

    if url == "-":
        return url
    digest = hashlib.sha256(url.encode("utf-8", "surrogateescape")).hexdigest()[:6]
    scheme_text, sep, _ = url.partition(":")
    scheme = scheme_text.lower() if sep and _SCHEME.fullmatch(scheme_text.lower()) else "?"
    try:
        parts = urlsplit(url)
        host, port = parts.hostname or "", parts.port
    except ValueError:  # a port that is not a number, a broken IPv6 literal
        host, port = "", None
    port = port if port is not None else _DEFAULT_PORTS.get(scheme)
    where = f"[{host}]" if ":" in host else host
    if port is not None:
        where += f":{port}"
    return visible(f"{scheme}://{where}#{digest}")

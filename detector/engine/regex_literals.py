"""A literal every match of a `|re` pattern contains, so that the literal index (index.py) can
skip a regex rule for the events that do not show it.

The pattern is read with Python's own regex parser (`re._parser`), which gives its syntax tree
without compiling it; the rule itself always runs on RE2 (regex.py). Only what both dialects
read alike is used, and anything unsure gives no literal (the rule then runs for every event,
as before):

- literals are taken from the top-level concatenation only, through plain groups and through
  the body of a repeat that must occur at least once; never from an alternation, an optional
  or zero-repeat part, a class, or a look-around;
- a pattern Python cannot parse gives none (RE2-only syntax such as `\\pL`, `\\Q...\\E`, a flag
  group that is not at the start), and so does one with `[:`, where RE2 reads a POSIX class
  (`[[:alpha:]]`) that Python would read as a class followed by a literal `]`.

The index looks the literal up in `text.lower()`. A run of ASCII characters found in a text
is found, lower-cased, in the lower-cased text, so a case-sensitive literal is kept as long as
it is ASCII. Under `(?i)` RE2 matches by Unicode simple case folding, where an ASCII letter can
match a non-ASCII one: `k` matches U+212A KELVIN SIGN (which `str.lower` turns into `k`: safe)
and `s` matches U+017F LONG S (which `str.lower` leaves as it is: a text with U+017F would not
show the literal `s`). A case-insensitive literal is therefore cut at every `s`.
"""

from __future__ import annotations

import re
import warnings

# `re._parser` is CPython's (3.11+) regex parser; `sre_parse`, its old name, warns.
from re import _constants as sre  # type: ignore[attr-defined]
from re import _parser as sre_parser  # type: ignore[attr-defined]
from typing import Any

# letters RE2's case folding maps to a character `str.lower` does not map back to them
UNSAFE_FOLDED = frozenset("s")
_REPEATS = (sre.MAX_REPEAT, sre.MIN_REPEAT, getattr(sre, "POSSESSIVE_REPEAT", sre.MAX_REPEAT))


def required_literal(pattern: str, ignorecase: bool = False) -> str:
    """The longest case-folded (`str.lower`) literal found in `text.lower()` whenever RE2 finds
    `pattern` in `text`; "" when none is known. `ignorecase` is Sigma's `|i`."""
    if "[:" in pattern:
        return ""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "possible nested set" and the like
            tree = sre_parser.parse(pattern)
    except (re.error, RecursionError, OverflowError, ValueError):
        return ""
    folded = ignorecase or bool(tree.state.flags & sre.SRE_FLAG_IGNORECASE)
    runs: list[str] = []
    tail = _collect(tree, folded, [], runs)
    runs.append("".join(tail))
    return max(runs, key=len)


def _collect(items: Any, folded: bool, run: list[str], runs: list[str]) -> list[str]:
    """Walk a sequence: extend `run` (the literal being read) with each character that is
    certainly next in every match; close it into `runs` at anything else. Returns the run
    still open at the end of the sequence."""
    for op, arg in items:
        if op is sre.LITERAL:
            char = _fold(chr(arg), folded)
            if char is not None:
                run.append(char)
                continue
        elif op is sre.SUBPATTERN:
            _group, add, remove, body = arg
            inner = (folded or bool(add & sre.SRE_FLAG_IGNORECASE)) and not (
                remove & sre.SRE_FLAG_IGNORECASE
            )
            run = _collect(body, inner, run, runs)
            continue
        elif op in _REPEATS and arg[0] >= 1:
            runs.append("".join(run))
            runs.append("".join(_collect(arg[2], folded, [], runs)))
            run = []
            continue
        runs.append("".join(run))
        run = []
    return run


def _fold(char: str, folded: bool) -> str | None:
    """The character as `str.lower` writes it in the text the index reads, or None when a
    match need not contain that."""
    if not char.isascii():
        return None
    lower = char.lower()
    if folded and lower in UNSAFE_FOLDED:
        return None
    return lower

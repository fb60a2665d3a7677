"""A literal every match of a `|re` pattern contains, so that the literal index (index.py) can
skip a regex rule for the events that do not show it.

The pattern is read with Python's own regex parser (`re._parser`), which gives its syntax tree
without compiling it; the rule itself always runs on RE2 (regex.py). Only what both dialects
read alike is used, and anything unsure gives no literal (the rule then runs for every event,
as before):

- literals are taken from the top-level concatenation only, through plain groups and through
  the body of a repeat that must occur at least once; never from an optional or zero-repeat
  part, a class, or a look-around; an alternation gives a set of literals, one of each of its
  branches, when every branch has one;
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
# A literal shorter than this shows in most values: it is not worth a key.
MIN_LITERAL = 3
_REPEATS = (sre.MAX_REPEAT, sre.MIN_REPEAT, getattr(sre, "POSSESSIVE_REPEAT", sre.MAX_REPEAT))
Option = frozenset[str]  # literals every match contains one of


def required_literals(pattern: str, ignorecase: bool = False) -> Option:
    """Case-folded (`str.lower`) literals of at least MIN_LITERAL characters, one of which is
    in `text.lower()` whenever RE2 finds `pattern` in `text`: the longest literal of the
    pattern, or else one literal of each branch of an alternation; empty when none is known.
    `ignorecase` is Sigma's `|i`."""
    if "[:" in pattern:
        return frozenset()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "possible nested set" and the like
            tree = sre_parser.parse(pattern)
    except (re.error, RecursionError, OverflowError, ValueError):
        return frozenset()
    return _best(_options(tree, ignorecase or bool(tree.state.flags & sre.SRE_FLAG_IGNORECASE)))


def _best(options: list[Option]) -> Option:
    """The option that prunes most: the fewest literals, then the longest shortest one."""
    usable = [o for o in options if o and min(map(len, o)) >= MIN_LITERAL]
    return min(usable, key=lambda o: (len(o), -min(map(len, o))), default=frozenset())


def _options(items: Any, folded: bool) -> list[Option]:
    options: list[Option] = []
    tail = _collect(items, folded, [], options)
    options.append(frozenset({"".join(tail)}))
    return options


def _collect(items: Any, folded: bool, run: list[str], options: list[Option]) -> list[str]:
    """Walk a sequence: extend `run` (the literal being read) with each character that is
    certainly next in every match; close it into `options` at anything else, and add there
    what a required group, repeat or alternation needs. Returns the run still open at the end
    of the sequence."""
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
            run = _collect(body, inner, run, options)
            continue
        elif op in _REPEATS and arg[0] >= 1:
            options += _options(arg[2], folded)
        elif op is sre.BRANCH:
            branches = [_best(_options(branch, folded)) for branch in arg[1]]
            if all(branches):
                options.append(frozenset().union(*branches))
        options.append(frozenset({"".join(run)}))
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

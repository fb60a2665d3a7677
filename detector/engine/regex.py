"""`|re` values on RE2: matching time linear in the event value's length, whatever the pattern.

Python's `re` backtracks: `^(\\w+\\s?)*$` took 22.9 s on 29 characters. RE2 never backtracks,
and so cannot run backreferences (`\\1`) or look-around (`(?=`, `(?!`, `(?<=`, `(?<!`): a rule
using them is a load error (docs/rule-authoring.md), never a slow rule. Sigma's flags become
RE2's inline flags: `|i` case-insensitive, `|m` `^`/`$` at line breaks, `|s` `.` matches a
newline.

A pattern is searched through RE2's own `Match` on the text's UTF-8 bytes (`finds`), without
the wrapper's match object: a rule only needs whether it matched. A lone surrogate (a file name
that was not UTF-8, decoded with `surrogateescape`) is encoded as its three bytes, which RE2
reads as one character that no literal matches: never an encoding error.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import re2
from sigma.types import SigmaRegularExpression, SigmaRegularExpressionFlag

INLINE_FLAGS = {
    SigmaRegularExpressionFlag.IGNORECASE: "i",
    SigmaRegularExpressionFlag.MULTILINE: "m",
    SigmaRegularExpressionFlag.DOTALL: "s",
}
_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # a bad pattern is our rule error, not a line on stderr
_UNANCHORED = re2._re2.RE2.Anchor.UNANCHORED  # Sigma regexes search; they are not anchored


class Searcher(Protocol):
    """A compiled pattern: RE2's, or anything with the same `search`."""

    def search(self, text: str) -> object | None: ...


class UnsupportedRegex(ValueError):
    """A `|re` pattern RE2 cannot run."""


def flagged_pattern(value: SigmaRegularExpression) -> str:
    """The value's pattern with its Sigma flags as RE2 inline flags."""
    pattern = str(value.regexp)
    flags = "".join(sorted(INLINE_FLAGS[flag] for flag in value.flags))
    return f"(?{flags}){pattern}" if flags else pattern


def compile_regex(value: SigmaRegularExpression) -> Searcher:
    """The value's pattern with its Sigma flags, compiled by RE2."""
    pattern = str(value.regexp)
    try:
        searcher: Searcher = re2.compile(flagged_pattern(value), _OPTIONS)
    except re2.error as exc:
        reason = exc.args[0] if exc.args else exc
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise UnsupportedRegex(
            f"regular expression {pattern!r} cannot run on RE2, the engine's linear-time "
            f"matcher ({reason}); backreferences and look-around are not supported: rewrite "
            "the pattern without them"
        ) from None
    return searcher


def finds(searcher: Searcher) -> Callable[[str], bool]:
    """Whether the pattern occurs in a text."""
    raw = getattr(searcher, "_regexp", None)  # the compiled RE2 behind google-re2's wrapper
    if raw is None:
        return lambda text: searcher.search(text) is not None
    match = raw.Match

    def found(text: str) -> bool:
        data = text.encode("utf-8", "surrogatepass")
        return match(_UNANCHORED, data, 0, len(data))[0][0] != -1

    return found


class PatternSet:
    """Which of several patterns (flagged_pattern's) occur in a text, found in one pass of an
    RE2 Set over its UTF-8 bytes (as `finds` reads them) rather than one search each.

    The set also holds the empty pattern, found in every text: an answer without it means
    RE2 gave up on the text (its automaton out of memory), and each pattern is then searched
    on its own, so the answer is never short of a pattern. So it is, for every text, when the
    set does not compile (too large for RE2's memory budget)."""

    def __init__(self, patterns: Sequence[str]):
        self.size = len(patterns)
        self._each = [finds(re2.compile(p, _OPTIONS)) for p in patterns]
        self._match: Callable[[bytes], list[int]] | None = None
        regex_set = re2._re2.Set(_UNANCHORED, _OPTIONS)
        added = [regex_set.Add(p.encode("utf-8")) for p in ("", *patterns)]
        # matching on a set that did not compile crashes RE2: such a set is never used
        if added == list(range(len(added))) and regex_set.Compile():
            self._match = regex_set.Match

    @property
    def one_pass(self) -> bool:
        """Whether the patterns are searched together (the set compiled)."""
        return self._match is not None

    def found(self, text: str) -> list[int]:
        """The positions of the patterns that occur in `text`."""
        if self._match is not None:
            hits = self._match(text.encode("utf-8", "surrogatepass"))
            if hits:  # the empty pattern, 0, is always among them
                return [hit - 1 for hit in hits if hit]
        return [n for n, each in enumerate(self._each) if each(text)]

"""Typed pySigma values -> tests of one event value.

The compiler (compile.py) inlines the common string shapes as plain string operations; these
functions classify a value into its shape and build the test every other value (and every
value found in an unusual form, e.g. a number where a string was expected) goes through.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from sigma.types import (
    Placeholder,
    SigmaBool,
    SigmaCasedString,
    SigmaCIDRExpression,
    SigmaCompareExpression,
    SigmaExpansion,
    SigmaNumber,
    SigmaRegularExpression,
    SigmaString,
    SigmaTimestampPart,
    SpecialChars,
)

from hpcsec.detector.engine import matchers as m
from hpcsec.detector.engine.regex import UnsupportedRegex, compile_regex
from hpcsec.detector.engine.wildcard import Glob

# string shapes remembered (string_shape): SigmaHQ's 3,754 rules hold some 100,000 strings
SHAPES_REMEMBERED = 1 << 16


class UnsupportedValue(ValueError):
    """A value type the engine cannot evaluate (the caller turns it into a RuleError)."""


def string_shape(value: SigmaString, lower: bool) -> tuple[str, Any]:
    """Classify a Sigma string: ('eq'|'contains'|'startswith'|'endswith'|'any', text) or
    ('glob', Glob) for wildcards elsewhere (matched without backtracking, see wildcard.py).
    `lower` folds the constant's case. Remembered by the string's parts: compiling a value
    asks for its shape three or four times (its code, its fallback, its index keys)."""
    try:
        return _shape_of(tuple(value.s), lower)
    except TypeError:  # a placeholder part (unhashable): refused below
        return _string_shape(value.s, lower)


@functools.lru_cache(maxsize=SHAPES_REMEMBERED)
def _shape_of(parts: tuple[Any, ...], lower: bool) -> tuple[str, Any]:
    return _string_shape(parts, lower)


def _string_shape(value_parts: Sequence[Any], lower: bool) -> tuple[str, Any]:
    parts: list[Any] = []
    multi = SpecialChars.WILDCARD_MULTI
    for part in value_parts:
        if isinstance(part, Placeholder):
            raise UnsupportedValue(f"unfilled placeholder %{part.name}%")
        if part is multi and parts and parts[-1] is multi:
            continue  # `**` is `*`: two in a row were read as a literal around nothing
        parts.append(part.lower() if lower and isinstance(part, str) else part)
    texts = [p for p in parts if isinstance(p, str)]
    specials = [p for p in parts if isinstance(p, SpecialChars)]
    if not specials:
        return "eq", "".join(texts)
    if all(p is multi for p in specials):
        if len(parts) == 1:
            return "any", ""
        if len(parts) == 2:
            return ("startswith", parts[0]) if parts[1] is multi else ("endswith", parts[1])
        if len(parts) == 3 and parts[0] is multi and parts[2] is multi:
            return "contains", parts[1]
    return "glob", Glob(parts)


def string_test(shape: tuple[str, Any]) -> Callable[[str], bool]:
    """The shape as a function of an (already case-folded) string."""
    kind, const = shape
    if kind == "eq":
        return const.__eq__
    if kind == "contains":
        return lambda s: const in s
    if kind == "startswith":
        return lambda s: s.startswith(const)
    if kind == "endswith":
        return lambda s: s.endswith(const)
    if kind == "any":
        return lambda s: True
    return const.matches


def scalar_matcher(value: Any) -> Callable[[Any], bool]:
    """Match one non-None, non-list event value against one typed Sigma value."""
    if isinstance(value, SigmaCasedString):
        return m.on_text(string_test(string_shape(value, lower=False)), fold=False)
    if isinstance(value, SigmaString):
        return m.on_text(string_test(string_shape(value, lower=True)), fold=True)
    if isinstance(value, SigmaTimestampPart):
        return m.time_part(value.timestamp_part.name.lower(), value.number)
    if isinstance(value, SigmaNumber):
        return m.number_equals(value.number)
    if isinstance(value, SigmaBool):
        return m.bool_equals(value.boolean)
    if isinstance(value, SigmaRegularExpression):
        if value.regexp.contains_placeholder():
            raise UnsupportedValue(f"unfilled placeholder in regular expression {value.regexp}")
        try:
            return m.regex(compile_regex(value))
        except UnsupportedRegex as exc:
            raise UnsupportedValue(str(exc)) from None
    if isinstance(value, SigmaCIDRExpression):
        return m.cidr(value.network)
    if isinstance(value, SigmaCompareExpression):
        if isinstance(value.number, SigmaTimestampPart):  # e.g. |hour|gte
            part = value.number.timestamp_part.name.lower()
            return m.time_part(part, value.number.number, value.op.name)
        return m.compare(value.op.name, value.number.number)
    raise UnsupportedValue(f"value type {type(value).__name__} is not supported")


def keyword_value(value: Any) -> Any:
    """The value a field-less (keyword) value tests each event value with: a string becomes a
    substring search (wildcards at both ends unless it has its own), a number its spelling;
    expansions are OR-ed values (see scalar_keyword), anything else is tested as it is."""
    if isinstance(value, SigmaString):
        if not value.startswith(SpecialChars.WILDCARD_MULTI):
            value = SpecialChars.WILDCARD_MULTI + value
        if not value.endswith(SpecialChars.WILDCARD_MULTI):
            value = value + SpecialChars.WILDCARD_MULTI
        return value
    if isinstance(value, SigmaNumber):
        return keyword_value(SigmaString.from_str(str(value.number)))
    return value


def scalar_keyword(value: Any) -> Callable[[Any], bool]:
    """A field-less (keyword) value: a substring search unless the rule anchors it with
    wildcards of its own, case-insensitive like every Sigma string."""
    if isinstance(value, SigmaExpansion):
        tests = [scalar_keyword(v) for v in value.values]
        return lambda v: any(t(v) for t in tests)
    return scalar_matcher(keyword_value(value))

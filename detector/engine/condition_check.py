"""Whether pySigma will parse a rule's condition, known without parsing it again.

A load checks every condition (parse.condition_errors) because pySigma parses them only at
conversion. `SigmaCondition.parse()` deep-copies pySigma's cached parse tree of the condition
text and rewrites the copy against the rule's detections: about 0.14 ms of a SigmaHQ file's
1.1 ms cold parse (`bench rule_load --phases`), spent to learn that nothing failed, and thrown
away (the compiler parses the condition again when it builds the rule).

`parses_cleanly` reads the same cached tree without copying or changing it and answers True
only where pySigma's parse cannot fail: every place its parse raises is a case answered False
here (a pipe, a syntax error, an operand pyparsing left wrapped, a detection not defined, a
selector that names none, a keyword list with no value, operators nested too deep for its
recursion), as is any node or detection of a kind not named below. False means only "parse
it to see": the caller then runs pySigma's parse, whose error is the one reported.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

from sigma import conditions
from sigma.conditions import (
    ConditionAND,
    ConditionIdentifier,
    ConditionNOT,
    ConditionOR,
    ConditionSelector,
    SigmaCondition,
)
from sigma.rule.detection import SigmaDetection, SigmaDetectionItem, SigmaDetections

OPERATORS = (ConditionAND, ConditionOR, ConditionNOT)
# pySigma's parse copies and rewrites the tree recursively: about 170 nested operators exhaust
# Python's stack there. A tree deeper than this is left to it (SigmaHQ's deepest has 5).
MAX_DEPTH = 32
# pySigma's parse of a condition text, before its rewriting against detections (pySigma
# >= 1.0); without it, every condition is parsed by pySigma itself. pySigma caches 256 texts;
# SigmaHQ's rules have about 400, so this keeps its own cache, as large as a rule set's.
_parse_text = getattr(conditions, "_parse_condition_string", None)
_parsed_text = None if _parse_text is None else lru_cache(maxsize=8192)(_parse_text)


def parses_cleanly(condition: SigmaCondition) -> bool:
    """True when `condition.parse()` is certain to succeed (see the module's docstring)."""
    text = condition.condition
    if _parsed_text is None or not isinstance(text, str) or "|" in text:
        return False
    try:
        tree = _parsed_text(text)  # shared by every rule with this text: read, never changed
    except Exception:  # a syntax error, or nesting too deep: pySigma's parse will say which
        return False
    detections = condition.detections
    if not isinstance(detections, SigmaDetections):
        return False
    named: set[str] = set()
    stack: list[tuple[Any, int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        kind = type(node)
        if kind in OPERATORS:
            if not isinstance(node.args, list) or depth >= MAX_DEPTH:
                return False
            stack.extend((arg, depth + 1) for arg in node.args if arg is not None)
        elif kind is ConditionIdentifier:
            named.add(node.identifier)
        elif kind is ConditionSelector:
            chosen = node.resolve_referenced_detections(detections)
            if not chosen:
                return False
            named.update(identifier.identifier for identifier in chosen)
        else:  # a ParseResults left wrapped, or a node this check does not know
            return False
    return all(_bound(detections.detections.get(name)) for name in named)


def _bound(detection: object) -> bool:
    """A defined detection whose every keyword item has a value (pySigma refuses a keyword
    list with none: "Null value must be bound to a field")."""
    if type(detection) is not SigmaDetection:
        return False
    stack: list[Any] = [detection]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is SigmaDetection:
            stack.extend(item.detection_items)
        elif kind is SigmaDetectionItem:
            if item.field is None and len(item.value) == 0:
                return False
        else:
            return False
    return True


def unnamed_selectors(condition: SigmaCondition) -> list[str]:
    """The selectors of a condition (`1 of filter_*`) that name no detection of its rule.

    pySigma takes them as an empty `or` (never true) or `and`, and a backend converts the
    rule without them: `selection and 1 of nothing_*` became a query of its logsource alone,
    matching every event of the category, while the engine never matched it. Such a
    condition is the rule author's slip (a renamed selection), so the load refuses it."""
    text = condition.condition
    detections = condition.detections
    if _parsed_text is None or not isinstance(text, str) or "|" in text:
        return []
    if not isinstance(detections, SigmaDetections):
        return []
    try:
        tree = _parsed_text(text)
    except Exception:  # a syntax error: reported by pySigma's parse
        return []
    unnamed: list[str] = []
    stack: list[Any] = [tree]
    while stack:
        node = stack.pop()
        if type(node) in OPERATORS and isinstance(node.args, list):
            stack.extend(arg for arg in node.args if arg is not None)
        elif type(node) is ConditionSelector and not node.resolve_referenced_detections(detections):
            unnamed.append(f"{node.args[0]} of {node.pattern}")
    return unnamed

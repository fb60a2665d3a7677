"""The texts the detection rules look for in a process's command line, for the process
sensor to keep when it condenses a long one (sensors/cmdline_condense.py).

A process's owner writes its argv, and past 64 KiB the sensor keeps a head, a tail and some
of the middle. Whatever rule-blind choice it makes for the middle, padding can push an
indicator out of it (12 KiB of distinct flags before `--donate-level`). Given these literals
it keeps, first, the arguments that show one not yet kept: padding with the indicators
themselves then only makes the rules fire.

Only literals a rule needs to be true count: those under no NOT, so the text of a filter
(`not filter`) is never kept for its own sake, where flooding with it could push out what
a selection looks for. Each literal is the one the literal index would look for
(index.leaf_keys: for a wildcard value its most selective piece, for a regular expression a
literal every match shows); a value with none (a bare `*`, a cased string, a regex without a
literal) gives nothing, and the sensor then keeps flags and URLs as it would without rules.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sigma.conditions import (
    ConditionAND,
    ConditionFieldEqualsValueExpression,
    ConditionOR,
    ConditionValueExpression,
)

from hpcsec.detector.engine.header import COMMAND_LINE_FIELDS
from hpcsec.detector.engine.index import keyword_keys, leaf_keys

# Shorter literals (`-o`, `rx`) show in most arguments: keeping each argument that shows one
# would keep the padding itself.
MIN_LITERAL = 3


def command_line_literals(trees: Iterable[Any]) -> frozenset[str]:
    """The case-folded literals of the command-line tests in `trees` (condition trees of
    detection rules, filters applied) that are under no NOT."""
    found: set[str] = set()
    for tree in trees:
        stack = [tree]
        while stack:
            node = stack.pop()
            if isinstance(node, ConditionAND | ConditionOR):
                stack.extend(node.args)
            elif isinstance(node, ConditionFieldEqualsValueExpression):
                if node.field in COMMAND_LINE_FIELDS:
                    found.update(_literals(leaf_keys(node.field, node.value)))
            elif isinstance(node, ConditionValueExpression):  # a keyword searches them too
                found.update(_literals(keyword_keys(node.value)))
            # a NOT: its literals are what must be absent
    return frozenset(literal for literal in found if len(literal.strip()) >= MIN_LITERAL)


def _literals(keys: frozenset[tuple[str, str, str]] | None) -> list[str]:
    return [literal for _, kind, literal in keys or () if kind != "re"]

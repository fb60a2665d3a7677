"""Which rules of a category an event can match, found from the literals rules cannot match
without, so that an event meets only those rules instead of every rule of its category.

For each rule a set of *required keys* is read off its condition tree: (field, kind, literal)
such that the rule cannot be true for an event unless one of the keys is found in the event
(kind `eq`: the field's case-folded text equals the literal; `contains`, `startswith`,
`endswith`: the literal occurs there; `re`: the field's text has a match of the pattern). An AND
needs only one of its parts' keys, an OR needs every branch's (their union). A regex gives a
`contains` key of a literal every match contains (regex_literals.py), or, without one, an `re`
key of its own pattern: the index searches all such patterns of a field in one pass
(regex.PatternSet). A keyword (a value without a field) gives keys of the field `ANY_FIELD`,
looked up in every value the keyword searches (matchers.searched_by_keywords). A NOT, a number
or anything else gives no key, so a rule whose condition is not provably false without its keys
is never pruned: it stays on the compiled path of its category (compile.py) and runs for every
event, as before. A rule may have two such key sets (required_groups: two AND-ed parts, each
needed): it is a candidate only when the event shows a key of each, so a literal that most
values show (`\\program files`) does not make it run for most events. The index only ever
removes rules whose condition is false for the event;
the rules it keeps are then evaluated by their own compiled code, so what matches is exactly
what the category's function would have matched. How an event is probed: literal_index.py.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from sigma.conditions import (
    ConditionAND,
    ConditionFieldEqualsValueExpression,
    ConditionOR,
    ConditionValueExpression,
)
from sigma.rule import SigmaDetection, SigmaDetectionItem, SigmaRule
from sigma.types import (
    SigmaCasedString,
    SigmaExpansion,
    SigmaRegularExpression,
    SigmaRegularExpressionFlag,
    SigmaString,
)

from hpcsec.detector.engine.compile import CategoryCompiler, Predicate
from hpcsec.detector.engine.literal_index import AFFIXES, ANY_FIELD, Key, LiteralIndex
from hpcsec.detector.engine.regex import UnsupportedRegex, compile_regex, flagged_pattern
from hpcsec.detector.engine.regex_literals import required_literals
from hpcsec.detector.engine.ruleset import LoadedRule
from hpcsec.detector.engine.values import UnsupportedValue, keyword_value, string_shape
from hpcsec.detector.engine.wildcard import Glob

# Below this many rules a category's one generated function (which fetches each field once
# for all its rules) is faster than probing the index for every event.
INDEX_MIN_RULES = 64
# A keyword value (tested on every field of the event) or a regex (an RE2 search) costs about
# what this many plain rules cost: it counts as many towards INDEX_MIN_RULES.
COSTLY_VALUE_WEIGHT = 16
# A plain rule tests a few values (about 40 ns each, compiled); past this many, a rule's values
# count as one rule for each this many of them: ten SigmaHQ driver-load rules hold 5,700 hashes
# and names, 216 us an event on the compiled path, far more than 64 rules of a few values each.
PLAIN_VALUES_PER_RULE = 4


def required_keys(node: Any) -> frozenset[Key] | None:
    """Keys one of which the event must show for `node` to be true; None when there is no
    such set (the node may be true without any literal the index can see)."""
    if node is None:  # an empty detection: never true, so never a candidate
        return frozenset()
    if isinstance(node, ConditionAND):
        return best_of(required_keys(a) for a in node.args)
    if isinstance(node, ConditionOR):
        return union_of(required_keys(arg) for arg in node.args)
    if isinstance(node, ConditionFieldEqualsValueExpression):
        return leaf_keys(node.field, node.value)
    if isinstance(node, ConditionValueExpression):
        return keyword_keys(node.value)
    return None  # NOT: true without any literal of its own


# The key sets of a rule the event must show all of: the second prunes the rules whose
# cheapest set most values show, at the cost of looking up its keys too.
MAX_GROUPS = 2
# key_cost of a pattern (1.0) or of an extension or punctuation literal (0.5 or 1.0)
COMMON_KEY_COST = 0.25


def required_groups(node: Any) -> list[frozenset[Key]]:
    """Key sets (each one of required_keys') the event must show a key of each of for `node`
    to be true, the most selective first, at most MAX_GROUPS; [] when there is none."""
    if isinstance(node, ConditionAND):
        return cheapest([group for arg in node.args for group in required_groups(arg)])
    if isinstance(node, ConditionOR):
        # (A1 and A2) or (B1 and B2) needs (A1 or B1) and (A2 or B2): each group, branch-wise
        branches = [required_groups(arg) for arg in node.args]
        if not branches or not all(branches):
            return [] if branches else [frozenset()]
        width = max(map(len, branches))
        return cheapest(
            [frozenset().union(*(b[min(n, len(b) - 1)] for b in branches)) for n in range(width)]
        )
    keys = required_keys(node)
    return [] if keys is None else [keys]


def cheapest(groups: list[frozenset[Key]]) -> list[frozenset[Key]]:
    """The MAX_GROUPS distinct groups that prune most, the most selective first."""
    return sorted(set(groups), key=lambda g: (keys_cost(g), sorted(g)))[:MAX_GROUPS]


def keyword_keys(value: Any) -> frozenset[Key] | None:
    """The keys of a keyword: those of the value it tests each searched event value with."""
    if isinstance(value, SigmaExpansion):
        return union_of(keyword_keys(each) for each in value.values)
    return leaf_keys(ANY_FIELD, keyword_value(value))


def union_of(options: Iterable[frozenset[Key] | None]) -> frozenset[Key] | None:
    """The keys of OR-ed parts: every part's, or None when one part has none."""
    union: set[Key] = set()
    for keys in options:
        if keys is None:
            return None
        union |= keys
    return frozenset(union)


def best_of(options: Iterable[frozenset[Key] | None]) -> frozenset[Key] | None:
    """Of the key sets of AND-ed parts (each alone is required), the one that prunes most."""
    best: frozenset[Key] | None = None
    for keys in options:
        if keys is not None and (best is None or keys_cost(keys) < keys_cost(best)):
            best = keys
    return best


# A literal that is only a file extension (`.exe`) or has no letter or digit (`\`, `:\`)
# shows in most values of a path or command line, whatever its length.
_COMMON = re.compile(r"\.[a-z0-9]{1,4}|[^a-z0-9]*")


def keys_cost(keys: frozenset[Key]) -> float:
    """About how often an event shows one of the keys: an exact value seldom, a literal the
    less often the longer it is, at an end less often than anywhere."""
    return sum(key_cost(kind, literal) for _, kind, literal in keys)


@functools.lru_cache(maxsize=1 << 16)  # asked again at every level of every rule's tree
def key_cost(kind: str, literal: str) -> float:
    if kind == "eq":
        return 0.001
    if kind == "re":  # a pattern without a literal: assume it matches as often as a letter
        return 1.0
    length = 1 if _COMMON.fullmatch(literal) else max(len(literal), 1)
    return (1.0 if kind == "contains" else 0.5) / (length * length)


def leaf_keys(field: str, value: Any) -> frozenset[Key] | None:
    if isinstance(value, SigmaExpansion):  # windash, base64offset: OR-ed values
        return union_of(leaf_keys(field, each) for each in value.values)
    if isinstance(value, SigmaRegularExpression):
        return regex_keys(field, value)
    # a cased string is compared unfolded: folding a literal is not always a substring of the
    # folded text (final sigma), so it stays on the compiled path
    if type(value) is not SigmaString or value.contains_placeholder():
        return None
    assert not isinstance(value, SigmaCasedString)
    try:
        kind, const = string_shape(value, lower=True)
    except UnsupportedValue:
        return None
    if kind == "eq":
        return frozenset({(field, "eq", const)})
    if kind in AFFIXES:
        return frozenset({(field, kind, const)}) if const else None
    if kind == "glob":
        keys = [frozenset({(field, k, piece)}) for k, piece in glob_literals(const)]
        return min(keys, key=keys_cost, default=None)
    return None  # `*`: any value


def regex_keys(field: str, value: SigmaRegularExpression) -> frozenset[Key] | None:
    if value.regexp.contains_placeholder():
        return None
    ignorecase = SigmaRegularExpressionFlag.IGNORECASE in value.flags
    literals = required_literals(str(value.regexp), ignorecase)
    if literals:
        return frozenset((field, "contains", literal) for literal in literals)
    try:
        compile_regex(value)  # the rule's own compile step says why it cannot run
    except UnsupportedRegex:
        return None
    return frozenset({(field, "re", flagged_pattern(value))})


def glob_literals(glob: Glob) -> list[tuple[str, str]]:
    """(kind, literal) pairs each of which every text the wildcard value matches shows: each
    literal piece anywhere, the head's first piece as a prefix and the tail's last as a
    suffix."""
    segments = [glob.head, *glob.middle, *([glob.tail] if glob.tail else [])]
    found = [("contains", piece) for segment in segments for _, piece in segment.pieces]
    if glob.head.pieces and glob.head.pieces[0][0] == 0:
        found.append(("startswith", glob.head.pieces[0][1]))
    last = glob.tail or glob.head
    if last.pieces:
        offset, piece = last.pieces[-1]
        if offset + len(piece) == last.length:
            found.append(("endswith", piece))
    return [(kind, literal) for kind, literal in found if literal]


def indexed_predicate(
    index: LiteralIndex,
    tests: Sequence[Callable[[dict[str, Any]], bool]],
    positions: Sequence[int],
    fallback: Predicate | None,
    fallback_positions: Sequence[int],
    paired: frozenset[int] = frozenset(),
) -> Predicate:
    """A category's match function: the rules without keys through their compiled function,
    the indexed ones only when the index names them (keyed rule `i` by its first group, and
    by its second, when in `paired`, as `i + len(tests)`); hits in rule order."""
    candidates = index.candidates
    positions = tuple(positions)
    fallback_positions = tuple(fallback_positions)
    tests = tuple(tests)
    count = len(tests)

    def match(event: dict[str, Any]) -> tuple[int, ...]:
        found = candidates(event)
        hits = [
            positions[i]
            for i in found
            if i < count and (i not in paired or i + count in found) and tests[i](event)
        ]
        if fallback is not None:
            hits += [fallback_positions[i] for i in fallback(event)]
        if not hits:
            return ()
        hits.sort()
        return tuple(hits)

    return match


class CategoryBuilder:
    """The rules of one category -> its match function: with `indexed`, the rules with
    required keys each get a function of their own behind the index, the others share the
    category's generated function (compile.py); without, all of them share it."""

    def __init__(self, name: str, indexed: bool, code_cache: Path | None = None):
        self.name = name
        self.indexed = indexed
        self.plain = CategoryCompiler(code_cache)
        self.plain_positions: list[int] = []
        self.keyed = CategoryCompiler(code_cache)
        self.keyed_positions: list[int] = []
        self.groups: list[list[frozenset[Key]]] = []
        self.count = 0

    def add(self, conditions: Sequence[Any]) -> None:
        """One rule as the condition trees that must all hold (see CategoryCompiler.add_rule)."""
        position, self.count = self.count, self.count + 1
        groups = cheapest([g for c in conditions for g in required_groups(c)])
        if not self.indexed or not groups:
            self.plain.add_rule(conditions)
            self.plain_positions.append(position)
        else:
            self.keyed.add_rule(conditions)
            self.keyed_positions.append(position)
            self.groups.append(groups)

    def build(self) -> Predicate:
        plain = self.plain.build(self.name) if self.plain_positions else None
        if not self.keyed_positions:
            assert plain is not None
            return plain
        tests = self.keyed.build_each(self.name + "_rule")
        seconds = self.second_groups()
        paired = frozenset(n for n, second in enumerate(seconds) if second is not None)
        keys = [groups[0] for groups in self.groups]
        keys += [second or frozenset() for second in seconds]
        return indexed_predicate(
            LiteralIndex(keys), tests, self.keyed_positions, plain, self.plain_positions, paired
        )

    def second_groups(self) -> list[frozenset[Key] | None]:
        """Each keyed rule's second group, kept only when its fields are probed anyway for
        the first groups (a field probed for it alone would cost every event a lookup) and
        none of its keys is a pattern or a literal most values show (`.exe`, `\\`): searched
        in every new text, it would cost more than the rule's own test it saves."""
        probed = {field for groups in self.groups for field, _, _ in groups[0]}
        seconds: list[frozenset[Key] | None] = []
        for groups in self.groups:
            second = groups[1] if len(groups) > 1 else None
            keep = second is not None and all(
                f in probed and key_cost(k, literal) < COMMON_KEY_COST for f, k, literal in second
            )
            seconds.append(second if keep else None)
        return seconds


def category_weight(rules: Sequence[LoadedRule]) -> int:
    """The rules of a category counted by their cost per event: the category goes through the
    index when this reaches the engine's `index_min`."""
    total = 0
    for rule in rules:
        costly, plain = rule_values(rule)
        total += max(1, COSTLY_VALUE_WEIGHT * costly + plain // PLAIN_VALUES_PER_RULE)
    return total


def rule_values(rule: LoadedRule) -> tuple[int, int]:
    """How many keyword and regex values a detection rule has, and how many other values."""
    sigma = rule.sigma
    if not isinstance(sigma, SigmaRule):
        return 0, 0
    costly = plain = 0
    for detection in sigma.detection.detections.values():
        more_costly, more_plain = _values(detection)
        costly += more_costly
        plain += more_plain
    return costly, plain


def _values(detection: SigmaDetection) -> tuple[int, int]:
    costly = plain = 0
    for item in detection.detection_items:
        if isinstance(item, SigmaDetection):
            more_costly, more_plain = _values(item)
            costly += more_costly
            plain += more_plain
        elif isinstance(item, SigmaDetectionItem):
            for value in item.value:
                if item.field is None or isinstance(value, SigmaRegularExpression):
                    costly += 1
                else:
                    plain += 1
    return costly, plain

"""Which rules of a category an event can match, found from the literals rules cannot match
without, so that an event meets only those rules instead of every rule of its category.

For each rule a set of *required keys* is read off its condition tree: (field, kind, literal)
such that the rule cannot be true for an event unless one of the keys is found in the event
(kind `eq`: the field's case-folded text equals the literal; `contains`, `startswith`,
`endswith`: the literal occurs there). An AND needs only one of its parts' keys, an OR needs
every branch's (their union). A regex gives a `contains` key of a literal every match contains
(regex_literals.py); a keyword (a value without a field) gives keys of the field `ANY_FIELD`,
looked up in every value the keyword searches (matchers.searched_by_keywords). A NOT, a number
or anything else gives no key, so a rule whose condition is not provably false without its keys
is never pruned: it stays on the compiled path of its category (compile.py) and runs for every
event, as before. The index
only ever removes rules whose condition is false for the event; the rules it keeps are then
evaluated by their own compiled code, so what matches is exactly what the category's function
would have matched.

Per event, each indexed field is read once: its value (each element of a list; numbers and
booleans by their JSON spelling, as the string tests read them) is case-folded, looked up in one
hash table of all the rules' `eq` literals for that field, and scanned once by one Aho-Corasick
automaton holding all their `contains`/`startswith`/`endswith` literals (pyahocorasick, C).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import ahocorasick
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

from hpcsec.detector.engine import matchers as m
from hpcsec.detector.engine.compile import CategoryCompiler, Predicate
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

Key = tuple[str, str, str]  # (field, eq|contains|startswith|endswith, case-folded literal)
AFFIXES = ("contains", "startswith", "endswith")
# The field of a keyword's keys: any field keywords search. No rule field has a control
# character (rule files with one are refused), so no field of an event is named this.
ANY_FIELD = "\x00keywords"


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


def key_cost(kind: str, literal: str) -> float:
    if kind == "eq":
        return 0.001
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
    return frozenset((field, "contains", literal) for literal in literals) or None


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


def probe_texts(value: Any) -> Sequence[str]:
    """The case-folded texts the string tests of compile.py compare for this event value."""
    if value.__class__ is str:
        return (value.lower(),)
    values = value if value.__class__ is list else (value,)
    texts = []
    for each in values:
        text = m.as_text(each) if each is not None else None
        if text is not None:
            texts.append(text.lower())
    return texts


# Up to this many substring literals, a field tests each with `in`; more go into one
# Aho-Corasick automaton, whose scan costs about a microsecond however few it holds.
FEW_LITERALS = 4


class FieldIndex:
    """The literals of one field: exact values in a dict, the rest in one automaton (a tuple
    when they are few)."""

    __slots__ = ("automaton", "exact", "few", "field")

    def __init__(self, field: str, keys: dict[tuple[str, str], set[int]]):
        self.field = field
        self.exact: dict[str, frozenset[int]] = {}
        affixes: dict[str, tuple[set[int], set[int], set[int]]] = {}
        for (kind, literal), rules in keys.items():
            if kind == "eq":
                self.exact[literal] = frozenset(rules)
            else:
                affixes.setdefault(literal, (set(), set(), set()))[AFFIXES.index(kind)].update(
                    rules
                )
        self.automaton: Any = None
        self.few: tuple[tuple[str, frozenset[int], frozenset[int], frozenset[int]], ...] = ()
        if 0 < len(affixes) <= FEW_LITERALS:
            self.few = tuple(
                (literal, frozenset(inside), frozenset(starts), frozenset(ends))
                for literal, (inside, starts, ends) in affixes.items()
            )
        elif affixes:
            self.automaton = ahocorasick.Automaton()
            for literal, (inside, starts, ends) in affixes.items():
                entry = (len(literal), frozenset(inside), frozenset(starts), frozenset(ends))
                self.automaton.add_word(literal, entry)
            self.automaton.make_automaton()

    def collect(self, text: str, found: set[int]) -> None:
        rules = self.exact.get(text)
        if rules:
            found |= rules
        for literal, inside, starts, ends in self.few:
            if literal in text:
                if inside:
                    found |= inside
                if starts and text.startswith(literal):
                    found |= starts
                if ends and text.endswith(literal):
                    found |= ends
        if self.automaton is None:
            return
        last = len(text) - 1
        for end, (length, inside, starts, ends) in self.automaton.iter(text):
            if inside:
                found |= inside
            if starts and end == length - 1:
                found |= starts
            if ends and end == last:
                found |= ends


# The fields whose lookup a LiteralIndex remembers (node field names are hostile: past this
# many, a name is looked up anew each time rather than remembered).
KNOWN_NAMES_MAX = 4096
_UNKNOWN = object()


class LiteralIndex:
    """Candidate rules (their positions in the category) of an event."""

    def __init__(self, rules: Sequence[frozenset[Key]]):
        by_field: dict[str, dict[tuple[str, str], set[int]]] = {}
        for position, keys in enumerate(rules):
            for field, kind, literal in keys:
                by_field.setdefault(field, {}).setdefault((kind, literal), set()).add(position)
        keywords = by_field.pop(ANY_FIELD, None)
        self.keywords = FieldIndex(ANY_FIELD, keywords) if keywords else None
        # A field keywords search is probed once, with its own literals and the keywords'
        # (merged); one they do not search (in some category: matchers.searched_by_keywords),
        # with its own (fields). Keywords search in a `slurm_job` event whatever they search
        # in another.
        self.fields = {
            f: FieldIndex(f, keys)
            for f, keys in by_field.items()
            if keywords is None or not m.searched_by_keywords(f, None)
        }
        self._merged = {
            f: FieldIndex(f, merged_keys(keys, keywords))
            for f, keys in by_field.items()
            if keywords is not None and m.searched_by_keywords(f, "slurm_job")
        }
        # name -> the FieldIndex its values are probed with (None: not probed), per whether
        # the event is a `slurm_job` one (keywords search its `slurm.*` fields)
        self._known: tuple[dict[str, FieldIndex | None], dict[str, FieldIndex | None]] = ({}, {})

    def probe_of(self, name: str, category: Any) -> FieldIndex | None:
        """What the values of the field `name` are probed with in an event of `category`:
        the field's literals, and the keywords' when keywords search it (matchers.keyword)."""
        if self.keywords is not None and m.searched_by_keywords(name, category):
            return self._merged.get(name, self.keywords)
        return self.fields.get(name)

    def candidates(self, event: dict[str, Any]) -> set[int]:
        """One pass over the event's fields (fewer than the index's, as a rule): each value is
        folded once and probed once, with what probe_of says (remembered per field name)."""
        found: set[int] = set()
        if self.keywords is None:
            category = None
            known = self._known[0]
        else:
            category = event.get("event.category")
            known = self._known[category == "slurm_job"]
        lookup = known.get
        index: Any
        for name, value in event.items():
            index = lookup(name, _UNKNOWN)
            if index is _UNKNOWN:
                index = self.probe_of(name, category)
                if len(known) < KNOWN_NAMES_MAX:
                    known[name] = index
            if index is None or value is None:
                continue
            if value.__class__ is str:
                index.collect(value.lower(), found)
            elif value.__class__ is not dict:  # keywords skip objects; no string test reads one
                for text in probe_texts(value):
                    index.collect(text, found)
        return found


def merged_keys(
    own: dict[tuple[str, str], set[int]], other: dict[tuple[str, str], set[int]]
) -> dict[tuple[str, str], set[int]]:
    merged = {key: set(rules) for key, rules in own.items()}
    for key, rules in other.items():
        merged.setdefault(key, set()).update(rules)
    return merged


def indexed_predicate(
    index: LiteralIndex,
    tests: Sequence[Callable[[dict[str, Any]], bool]],
    positions: Sequence[int],
    fallback: Predicate | None,
    fallback_positions: Sequence[int],
) -> Predicate:
    """A category's match function: the rules without keys through their compiled function,
    the indexed ones only when the index names them; hits in rule order."""
    candidates = index.candidates
    positions = tuple(positions)
    fallback_positions = tuple(fallback_positions)
    tests = tuple(tests)

    def match(event: dict[str, Any]) -> tuple[int, ...]:
        hits = [positions[i] for i in candidates(event) if tests[i](event)]
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

    def __init__(self, name: str, indexed: bool):
        self.name = name
        self.indexed = indexed
        self.plain = CategoryCompiler()
        self.plain_positions: list[int] = []
        self.keyed = CategoryCompiler()
        self.keyed_positions: list[int] = []
        self.keys: list[frozenset[Key]] = []
        self.count = 0

    def add(self, conditions: Sequence[Any]) -> None:
        """One rule as the condition trees that must all hold (see CategoryCompiler.add_rule)."""
        position, self.count = self.count, self.count + 1
        keys = best_of(map(required_keys, conditions)) if self.indexed else None
        if keys is None:
            self.plain.add_rule(conditions)
            self.plain_positions.append(position)
        else:
            self.keyed.add_rule(conditions)
            self.keyed_positions.append(position)
            self.keys.append(keys)

    def build(self) -> Predicate:
        plain = self.plain.build(self.name) if self.plain_positions else None
        if not self.keyed_positions:
            assert plain is not None
            return plain
        tests = self.keyed.build_each(self.name + "_rule")
        return indexed_predicate(
            LiteralIndex(self.keys), tests, self.keyed_positions, plain, self.plain_positions
        )


def category_weight(rules: Sequence[LoadedRule]) -> int:
    """The rules of a category counted by their cost per event: the category goes through the
    index when this reaches the engine's `index_min`."""
    return sum(max(1, COSTLY_VALUE_WEIGHT * costly_values(rule)) for rule in rules)


def costly_values(rule: LoadedRule) -> int:
    """How many keyword and regex values a detection rule has."""
    sigma = rule.sigma
    if not isinstance(sigma, SigmaRule):
        return 0
    return sum(_costly_values(d) for d in sigma.detection.detections.values())


def _costly_values(detection: SigmaDetection) -> int:
    count = 0
    for item in detection.detection_items:
        if isinstance(item, SigmaDetection):
            count += _costly_values(item)
        elif isinstance(item, SigmaDetectionItem):
            count += sum(
                item.field is None or isinstance(v, SigmaRegularExpression) for v in item.value
            )
    return count

"""pySigma condition trees -> one generated Python function per logsource category.

The engine sits on the agent's hot path, so a rule is not interpreted per event. Every detection
rule of a category is turned into one Python expression over local variables, and all of them go
into one generated function: each field the category's rules read is fetched from the event once
(and lower-cased once where a case-insensitive comparison needs it), constants are literals or
precompiled objects, and the common value shapes (equality, contains, startswith, endswith, set
membership) are plain string operations. Everything unusual (lists in events, numbers compared
with strings, CIDR, regexes, time parts, keywords) goes through a small closure built once
(values.py).

The tree is pySigma's own (`SigmaCondition.parse()`) with pySigma's typed values: nothing here
parses Sigma.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from sigma.conditions import (
    ConditionAND,
    ConditionFieldEqualsValueExpression,
    ConditionNOT,
    ConditionOR,
    ConditionValueExpression,
)
from sigma.types import (
    SigmaBool,
    SigmaCasedString,
    SigmaCompareExpression,
    SigmaExists,
    SigmaExpansion,
    SigmaFieldReference,
    SigmaNull,
    SigmaNumber,
    SigmaString,
    SigmaTimestampPart,
)

from hpcsec.detector.engine import matchers as m
from hpcsec.detector.engine.codecache import compiled
from hpcsec.detector.engine.condtree import conjuncts, necessary_fields, necessary_test
from hpcsec.detector.engine.values import (
    UnsupportedValue,
    scalar_keyword,
    scalar_matcher,
    string_shape,
)

Predicate = Callable[[dict[str, Any]], tuple[int, ...]]
# a test a rule cannot match without: (code, fields it reads, index of the conjunct it
# replaces, or None when it is implied by one rather than one itself)
PreCheck = tuple[str, frozenset[str], int | None]


def _affix_test(
    method: Callable[[str, tuple[str, ...]], bool], affixes: tuple[str, ...], text: str
) -> bool:
    return method(text, affixes)


GROUPED_SHAPES = ("eq", "startswith", "endswith", "contains")  # OR-ed per field, see or_terms


def _any_inside(literals: tuple[str, ...], text: str) -> bool:
    return any(map(text.__contains__, literals))


def _number_in(numbers: frozenset[Any], value: Any) -> bool:
    """Like OR-ed m.number_equals: numbers and numeric strings, never booleans."""
    found = m.as_number(value)
    return found is not None and found in numbers


class CategoryCompiler:
    """Collects the rules of one category and generates their shared match function."""

    def __init__(self, code_cache: Path | None = None) -> None:
        self.code_cache = code_cache  # where compiled code is kept (codecache.py), if anywhere
        self.fields: dict[str, int] = {}  # field -> variable number
        self.folded: set[int] = set()  # variables whose lower-case form is needed
        self.namespace: dict[str, Any] = {}
        # per rule: its conjuncts (code, fields read, tree) and the fields it cannot match
        # without
        self.rules: list[tuple[list[tuple[str, frozenset[str], Any]], list[str]]] = []
        self._used: set[str] = set()
        # (field, string type, its parts) -> (code, fields read): one string tested by
        # several rules is one expression, so that the same test reads the same
        self._leaves: dict[tuple[str, type, tuple[Any, ...]], tuple[str, frozenset[str]]] = {}

    def add_rule(self, conditions: Sequence[Any]) -> int:
        """Add one rule given as a list of condition trees that must all hold (its own
        condition OR-ed over its condition list, then each applied filter). Returns its index.
        The rule is kept as its conjuncts (code, fields read), in rule order."""
        parts = []
        for conjunct in (c for tree in conditions for c in conjuncts(tree)):
            code, fields = self.traced(conjunct)
            parts.append((code, fields, conjunct))
        necessary = [f for c in conditions for f in necessary_fields(c)]
        self.rules.append((parts or [("False", frozenset(), None)], necessary))
        return len(self.rules) - 1

    def traced(self, node: Any) -> tuple[str, frozenset[str]]:
        """The node's code and the fields it reads."""
        self._used = set()
        return f"({self.expr(node)})", frozenset(self._used)

    def build(self, name: str) -> Predicate:
        """One function for the category. Each rule is grouped under the first field it cannot
        match without (rule authors put the selective test first), so an event fetches and
        folds only the fields of the groups whose guard field it carries. Within a group, a
        rule first runs a test it cannot match without (its first conjunct, or for an OR the
        OR of each branch's first test) before fetching the rest of its fields: most events
        fail it."""
        groups: dict[str, list[int]] = {}  # guard field -> rules, in rule order
        unguarded: list[int] = []
        for i, (_, necessary) in enumerate(self.rules):
            if necessary:
                groups.setdefault(necessary[0], []).append(i)
            else:
                unguarded.append(i)
        top: set[str] = set().union(*(self.fields_of(i) for i in unguarded))
        # generate every test before emitting fetches: tests may need folded variables
        checks = {
            i: self.pre_check(i, top | {guard})
            for guard, members in groups.items()
            for i in members
        }
        lines = [f"def {name}(ev):", "    g = ev.get", "    r = ()"]
        self._fetch(lines, "    ", sorted(top))
        for i in unguarded:
            lines += [f"    if {self.code(i)}:", f"        r += ({i},)"]
        for guard, members in groups.items():
            self._emit_group(lines, guard, members, top, checks)
        lines.append("    return r")
        source = "\n".join(lines)
        code = compiled(source, f"<hpcsec rules {name}>", self.code_cache)
        exec(code, self.namespace)  # generated from typed pySigma values only, never from text
        fn = self.namespace[name]
        fn.source = source
        return fn

    def build_each(self, name: str) -> list[Callable[[dict[str, Any]], bool]]:
        """One function per rule, in rule order, for rules the literal index (index.py) runs
        only for the events that can match them; compiled together in one module."""
        lines: list[str] = []
        for i in range(len(self.rules)):
            lines += [f"def {name}_{i}(ev):", "    g = ev.get"]
            self._fetch(lines, "    ", sorted(self.fields_of(i)))
            lines.append(f"    return {self.code(i)}")
        source = "\n".join(lines)
        exec(compiled(source, f"<hpcsec rules {name}>", self.code_cache), self.namespace)
        return [self.namespace[f"{name}_{i}"] for i in range(len(self.rules))]

    def _emit_group(
        self,
        lines: list[str],
        guard: str,
        members: list[int],
        top: set[str],
        checks: dict[int, PreCheck | None],
    ) -> None:
        """The rules guarded by one field: run only when the event carries it."""
        n = self.fields[guard]
        if guard not in top:
            lines.append(f"    v{n} = g({guard!r})")
        lines.append(f"    if v{n} is not None:")
        if n in self.folded and guard not in top:
            lines.append(f"        l{n} = v{n}.lower() if v{n}.__class__ is str else None")
        known = top | {guard}
        header: set[str] = set()
        for i in members:
            check = checks[i]
            header |= self.fields_of(i) if check is None else check[1]
        self._fetch(lines, "        ", sorted(header - known))
        known |= header
        # A test reads only the fields fetched above, so rules with the same test (several
        # rules on one `event.action`, say) pass or fail it together: a field one of them has
        # fetched under it is there for the next ones, in rule order.
        fetched_under: dict[str, set[str]] = {}
        for i in members:
            check = checks[i]
            if check is None:
                lines += [f"        if {self.code(i)}:", f"            r += ({i},)"]
                continue
            test, _, skip = check
            lines.append(f"        if {test}:")
            fetched = fetched_under.setdefault(test, set())
            self._fetch(lines, "            ", sorted(self.fields_of(i) - known - fetched))
            fetched |= self.fields_of(i) - known
            rest = self.code(i, skip)
            if rest == "True":
                lines.append(f"            r += ({i},)")
                continue
            lines += [f"            if {rest}:", f"                r += ({i},)"]

    def fields_of(self, rule: int) -> set[str]:
        return set().union(*(part[1] for part in self.rules[rule][0]))

    def code(self, rule: int, skip: int | None = None) -> str:
        """The rule's conjuncts AND-ed, but for the one already tested."""
        parts = [part[0] for k, part in enumerate(self.rules[rule][0]) if k != skip]
        return " and ".join(parts) or "True"

    def pre_check(self, rule: int, known: set[str]) -> PreCheck | None:
        """(code, fields read, conjunct it replaces) of a test the rule cannot match without,
        reading `known` fields where the rule has one, when the rule reads other fields."""
        if self.fields_of(rule) <= known:
            return None
        options: list[PreCheck] = []
        for k, (code, fields, node) in enumerate(self.rules[rule][0]):
            needed = necessary_test(node)
            if needed is node and fields:
                options.append((code, fields, k))
            elif needed is not None:
                options.append((*self.traced(needed), None))
        for option in options:
            if option[1] <= known:
                return option
        return options[0] if options else None

    def _fetch(self, lines: list[str], indent: str, fields: list[str]) -> None:
        for field in fields:
            n = self.fields[field]
            lines.append(f"{indent}v{n} = g({field!r})")
            if n in self.folded:
                lines.append(f"{indent}l{n} = v{n}.lower() if v{n}.__class__ is str else None")

    # -- expressions ------------------------------------------------------------------------
    def const(self, obj: Any) -> str:
        name = f"k{len(self.namespace)}"
        self.namespace[name] = obj
        return name

    def var(self, field: str, folded: bool = False) -> str:
        n = self.fields.setdefault(field, len(self.fields))
        self._used.add(field)
        if folded:
            self.folded.add(n)
            return f"l{n}"
        return f"v{n}"

    def expr(self, node: Any) -> str:
        if node is None:  # pySigma drops empty detections to None
            return "False"
        if isinstance(node, ConditionAND):
            return "(" + " and ".join(self.expr(a) for a in node.args) + ")"
        if isinstance(node, ConditionOR):
            return "(" + " or ".join(self.or_terms(node.args)) + ")"
        if isinstance(node, ConditionNOT):
            return f"(not {self.expr(node.args[0])})"
        if isinstance(node, ConditionFieldEqualsValueExpression):
            return self.leaf(node.field, node.value)
        if isinstance(node, ConditionValueExpression):
            return f"{self.const(m.keyword(scalar_keyword(node.value)))}(ev)"
        raise UnsupportedValue(f"condition element {type(node).__name__} is not supported")

    def or_terms(self, args: Sequence[Any]) -> list[str]:
        """OR-ed plain equalities on one field (strings or numbers) become one set lookup
        (value lists), OR-ed prefixes or suffixes one `startswith`/`endswith` call with a
        tuple, OR-ed substrings one test of the field's text for each under one fallback."""
        # (field, shape) -> (constant, the expression it came from)
        by_field: dict[tuple[str, str], list[tuple[Any, Any]]] = {}
        others = []
        for arg in args:
            value = getattr(arg, "value", None)
            shape = (
                string_shape(value, lower=True)
                if isinstance(arg, ConditionFieldEqualsValueExpression)
                and type(value) is SigmaString
                and not value.contains_placeholder()
                else None
            )
            if shape is not None and shape[0] in GROUPED_SHAPES:
                by_field.setdefault((arg.field, shape[0]), []).append((shape[1], arg))
            elif (
                isinstance(arg, ConditionFieldEqualsValueExpression) and type(value) is SigmaNumber
            ):
                by_field.setdefault((arg.field, "number"), []).append((value.number, arg))
            else:
                others.append(self.expr(arg))
        terms = []
        for (field, kind), pairs in by_field.items():
            if len(pairs) == 1:
                terms.append(self.expr(pairs[0][1]))
                continue
            texts = [text for text, _ in pairs]
            if kind == "number":  # ints and floats hash alike: 3 == 3.0, as `==` has it
                members = frozenset(texts)
                raw = self.var(field)
                slow = self.const(m.lift(functools.partial(_number_in, members)))
                terms.append(
                    f"({raw} in {self.const(members)} if ({raw}.__class__ is int or "
                    f"{raw}.__class__ is float) else {raw} is not None and "
                    f"{slow}({raw}))"
                )
                continue
            folded, raw = self.var(field, folded=True), self.var(field)
            if kind == "eq":
                members = frozenset(texts)
                test, fast = members.__contains__, f"{folded} in {self.const(members)}"
            elif kind == "contains":
                # inline `in` tests under one check of the field and one fallback, not a
                # test and a fallback each: the code of SigmaHQ's lists of hashes and tool
                # names was most of what compiling its categories spent in Python's
                # compiler (an `in` runs faster inline than through any() or a regex, up
                # to some 60 literals)
                literals = tuple(dict.fromkeys(texts))
                test = functools.partial(_any_inside, literals)
                fast = "(" + " or ".join(f"{literal!r} in {folded}" for literal in literals) + ")"
            else:
                affixes = tuple(dict.fromkeys(texts))
                test = getattr(str, kind)  # str.startswith / str.endswith
                test = functools.partial(_affix_test, test, affixes)
                fast = f"{folded}.{kind}({self.const(affixes)})"
            slow = self.const(m.lift(m.on_text(test, fold=True)))
            terms.append(
                f"({fast} if {folded} is not None else {raw} is not None and {slow}({raw}))"
            )
        return terms + others

    def leaf(self, field: str, value: Any) -> str:
        """The code of one field's test; for a string (the usual test), the same code for
        the same string: its type (cased or not) and its parts (text and wildcards) are all
        that decide what it matches."""
        if type(value) not in (SigmaString, SigmaCasedString) or value.contains_placeholder():
            return self._leaf(field, value)
        key = (field, type(value), tuple(value.s))
        known = self._leaves.get(key)
        if known is None:
            outer, self._used = self._used, set()
            known = self._leaves[key] = (self._leaf(field, value), frozenset(self._used))
            self._used = outer
        self._used |= known[1]
        return known[0]

    def _leaf(self, field: str, value: Any) -> str:
        if isinstance(value, SigmaExpansion):  # base64offset, windash, ...: always OR-ed
            if not value.values:  # a placeholder with no value (prepare.py): no match
                self.var(field)  # still the field a guard may name (condtree.py)
                return "False"
            return "(" + " or ".join(self.leaf(field, v) for v in value.values) + ")"
        raw = self.var(field)
        if isinstance(value, SigmaNull):
            return f"({raw} is None)"
        if isinstance(value, SigmaExists):
            return f"({raw} is not None)" if value.exists else f"({raw} is None)"
        if isinstance(value, SigmaFieldReference):
            test = m.fieldref(value.starts_with, value.ends_with)
            return f"{self.const(test)}({raw}, {self.var(value.field)})"
        slow = self.const(m.lift(scalar_matcher(value)))
        if isinstance(value, SigmaString):
            cased = isinstance(value, SigmaCasedString)
            kind, const = string_shape(value, lower=not cased)
            subject = raw if cased else self.var(field, folded=True)
            if kind == "glob":  # a wildcard.Glob: linear, never a backtracking regex
                fast = f"{self.const(const.matches)}({subject})"
            else:
                fast = {
                    "eq": f"{subject} == {const!r}",
                    "contains": f"{const!r} in {subject}",
                    "startswith": f"{subject}.startswith({const!r})",
                    "endswith": f"{subject}.endswith({const!r})",
                    "any": "True",
                }[kind]
            guard = f"{raw}.__class__ is str" if cased else f"{subject} is not None"
            return f"(({fast}) if {guard} else {raw} is not None and {slow}({raw}))"
        if isinstance(value, SigmaBool):
            return (
                f"({raw} is {value.boolean} if {raw}.__class__ is bool "
                f"else {raw} is not None and {slow}({raw}))"
            )
        numeric = f"({raw}.__class__ is int or {raw}.__class__ is float)"
        if type(value) is SigmaNumber:
            return (
                f"({raw} == {value.number!r} if {numeric} else {raw} is not None and {slow}({raw}))"
            )
        if isinstance(value, SigmaCompareExpression) and not isinstance(
            value.number, SigmaTimestampPart
        ):
            op = {"LT": "<", "LTE": "<=", "GT": ">", "GTE": ">=", "NEQ": "!="}[value.op.name]
            return (
                f"({raw} {op} {value.number.number!r} if {numeric} "
                f"else {raw} is not None and {slow}({raw}))"
            )
        return f"({raw} is not None and {slow}({raw}))"

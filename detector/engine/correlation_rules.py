"""Correlation documents: the checks pySigma does not make, and references across files.

pySigma reads `condition: {gte: 2.5}` as 2, fails with Python's own words on `{gte: [1]}` or a
condition that is not a mapping, and names an unknown type without the known ones; these are
said here, at their line. Correlations may name rules of any loaded file, so references are
resolved once every file is read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sigma import exceptions as sx
from sigma.collection import SigmaCollection
from sigma.correlations import (
    SigmaCorrelationConditionOperator,
    SigmaCorrelationRule,
    SigmaCorrelationType,
    SigmaExtendedCorrelationCondition,
    SigmaRuleReference,
)

from hpcsec.detector.core.errors import RuleError, location
from hpcsec.detector.core.yamlsrc import YamlDocument
from hpcsec.detector.engine.ruleset import LoadedRule, RuleSet

Key = tuple[str | int, ...]
OPERATORS = tuple(SigmaCorrelationConditionOperator.operators())


def yaml_kind(value: Any) -> str:
    """A value's kind as a rule author wrote it in YAML."""
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if value is None:
        return "null"
    return "a list" if isinstance(value, list) else type(value).__name__


def _whole_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return True
    return isinstance(value, str) and value.strip().lstrip("+-").isdigit()


def document_errors(doc: YamlDocument) -> list[RuleError]:
    """What is wrong with a correlation document's `type` and `condition` before pySigma."""
    section = doc.data.get("correlation")
    if not isinstance(section, dict):
        return []  # pySigma reports a missing or odd section itself

    def error(message: str, *keys: str | int) -> RuleError:
        return RuleError(message, location(doc.path, doc.line_of("correlation", *keys)))

    kind = section.get("type")
    if kind is not None and str(kind).upper() not in SigmaCorrelationType.__members__:
        known = ", ".join(t.name.lower() for t in SigmaCorrelationType)
        return [error(f"unknown correlation type {kind!r} (known: {known})", "type")]
    if section.get("rules") == []:  # pySigma takes it: a correlation that counts nothing
        return [error("correlation names no rules: list the rules it correlates", "rules")]
    names = section.get("rules")
    odd = [
        (i, name)
        for i, name in enumerate(names if isinstance(names, list) else ())
        if isinstance(name, bool) or not isinstance(name, str | int)
    ]
    if odd:  # pySigma failed on them with an AttributeError (`[null]`, `[[x]]`)
        return [
            error(f"correlation rules are named by id or name, not {yaml_kind(n)}", "rules", i)
            for i, n in odd
        ]
    condition = section.get("condition")
    if condition is None or isinstance(condition, str):  # str: extended temporal condition
        return []
    if not isinstance(condition, dict):
        return [
            error(
                "correlation condition must be a mapping such as {gte: 10}, not "
                f"{yaml_kind(condition)}",
                "condition",
            )
        ]
    return [
        error(
            f"correlation condition {op}: {condition[op]!r} is not a whole number", "condition", op
        )
        for op in OPERATORS
        if op in condition and not _whole_number(condition[op])
    ]


def referenced_rules(corr: SigmaCorrelationRule) -> list[str]:
    """The rules an extended temporal condition (`a and not b`) names; other conditions name
    none (their rules are listed under `rules`)."""
    condition = corr.condition
    if isinstance(condition, SigmaExtendedCorrelationCondition):
        return list(condition.get_referenced_rules())
    return []


def references_of(rule: LoadedRule) -> tuple[Any, ...]:
    """The names a correlation refers to (its `rules`, or those of its extended condition, and
    its aliases' rules); () for another rule. The rule cache keeps them beside the header."""
    corr = rule.sigma
    if not isinstance(corr, SigmaCorrelationRule):
        return ()
    return tuple(ref.reference for ref, _ in _references(corr))


def _references(corr: SigmaCorrelationRule) -> list[tuple[SigmaRuleReference, Key]]:
    refs: list[tuple[SigmaRuleReference, Key]] = [
        (ref, ("correlation", "rules", i)) for i, ref in enumerate(corr.rules or [])
    ]
    if corr.rules is None:  # an extended temporal condition names the rules itself
        refs = [
            (SigmaRuleReference(name), ("correlation", "condition"))
            for name in referenced_rules(corr)
        ]
    for alias in corr.aliases:
        refs += [(ref, ("correlation", "aliases", alias.alias)) for ref in alias.mapping]
    return refs


def unknown_reference_errors(rule: LoadedRule, known: Callable[[Any], bool]) -> list[RuleError]:
    """An error at each name of the correlation `rule` for which `known` is false."""
    corr = rule.sigma
    assert isinstance(corr, SigmaCorrelationRule)
    return [
        RuleError(
            f"correlation names unknown rule {ref.reference!r}",
            location(rule.path, rule.line_of(*at)),
        )
        for ref, at in _references(corr)
        if not known(ref.reference)
    ]


def _in_collection(collection: SigmaCollection) -> Callable[[Any], bool]:
    def known(reference: Any) -> bool:
        try:
            collection[reference]
        except sx.SigmaRuleNotFoundError:
            return False
        return True

    return known


def resolve_correlations(ruleset: RuleSet) -> None:
    """Point each correlation at the rules it names (across all files), as pySigma does."""
    referable = [r for r in ruleset.rules if r.kind != "filter"]
    collection = SigmaCollection([r.sigma for r in referable], resolve_references=False)
    kept = []
    for rule in ruleset.rules:
        if rule.kind == "correlation":
            errors = unknown_reference_errors(rule, _in_collection(collection))
            if errors:
                ruleset.errors.extend(errors)
                continue
            assert isinstance(rule.sigma, SigmaCorrelationRule)
            rule.sigma.resolve_rule_references(collection)
        kept.append(rule)
    ruleset.rules = kept

"""What is decided across rule files, over the assembled set, at every load: a rule id or name
used twice (the first is kept), and correlation references to rules that are not loaded.

Both read rule headers and the names each correlation refers to (kept beside its header in the
rule cache), never the pySigma objects: a load from the rule cache stays free of pySigma's
parser. Only an error reads the rule again, for the line of what it is about.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from hpcsec.detector.core.errors import RuleError, location
from hpcsec.detector.engine.ruleset import BUNDLED, LoadedRule, RuleSet

References = tuple[Any, ...]  # the names a correlation refers to; () for other rules

_LOCAL_REUSE_HINT = (
    "; a local rule needs an id of its own: to silence a bundled rule, add a Sigma filter "
    "that names it; to change one, copy it under a new id and filter the bundled one out"
)


def drop_duplicate_ids(ruleset: RuleSet, references: list[References] | None = None) -> None:
    """Two documents with one id (or name) cannot both be referenced; keep the first.
    `references` (one per rule) is kept in step with the rules."""
    refs = references if references is not None else [()] * len(ruleset.rules)
    seen: dict[str, LoadedRule] = {}
    kept, kept_refs = [], []
    for rule, ref in zip(ruleset.rules, refs, strict=True):
        duplicate = None
        header = rule.header
        for key, what in ((header.sigma_id or None, "id"), (header.name, "name")):
            if key is None:
                continue
            first = seen.setdefault(f"{what}:{key}", rule)
            if first is not rule and duplicate is None:
                duplicate = RuleError(
                    f"duplicate rule {what} {key} (first at {first.path}:{first.line})"
                    + _LOCAL_REUSE_HINT * (first.origin == BUNDLED != rule.origin),
                    location(rule.path, rule.line_of(what)),
                )
        if duplicate is None:
            kept.append(rule)
            kept_refs.append(ref)
        else:
            ruleset.errors.append(duplicate)
    ruleset.rules = kept
    if references is not None:
        references[:] = kept_refs


class Referable:
    """The rules a correlation may name, looked up as pySigma's SigmaCollection does: a
    string by UUID when it reads as one, else by name; a number by position."""

    def __init__(self, rules: list[LoadedRule]):
        self.count = len(rules)
        self.ids = {UUID(r.header.sigma_id) for r in rules if r.header.sigma_id}
        self.names = {r.header.name for r in rules if r.header.name is not None}

    def known(self, ref: Any) -> bool:
        if isinstance(ref, str):
            try:
                return UUID(ref) in self.ids
            except ValueError:
                return ref in self.names
        if isinstance(ref, int):
            return -self.count <= ref < self.count
        return True  # SigmaCollection gives None for another type, without an error


def check_references(ruleset: RuleSet, references: list[References]) -> None:
    """Drop each correlation that names a rule not loaded, with an error at that name."""
    referable = Referable([r for r in ruleset.rules if r.kind != "filter"])
    kept = []
    for rule, refs in zip(ruleset.rules, references, strict=True):
        if rule.kind == "correlation" and not all(referable.known(ref) for ref in refs):
            ruleset.errors.extend(_reference_errors(rule, referable))
            continue
        kept.append(rule)
    ruleset.rules = kept


def _reference_errors(rule: LoadedRule, referable: Referable) -> list[RuleError]:
    """The errors of a correlation naming unknown rules, each at its line (the rule's object
    is read for them: only a rule set with such an error pays for pySigma here)."""
    from hpcsec.detector.engine import correlation_rules  # pySigma: on this error only

    return correlation_rules.unknown_reference_errors(rule, referable.known)

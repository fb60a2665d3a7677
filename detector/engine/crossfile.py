"""What is decided across rule files, over the assembled set, at every load: a rule id or name
used twice (the first is kept), and correlation references to rules that are not loaded.

Both read rule headers and the names each correlation refers to (kept beside its header in the
rule cache), never the pySigma objects: a load from the rule cache stays free of pySigma's
parser. Only an error reads the rule again, for the line of what it is about.
"""

from __future__ import annotations

from typing import Any

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


_HEX = frozenset("0123456789abcdefABCDEF")
# every ASCII character int(text, 16) may accept: hex digits, a sign, a 0x prefix, underscores
# between digits and (around the number) what str.isspace() calls a space
_INT16_ASCII = _HEX | frozenset("+-xX_ \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f")


def uuid_key(text: str) -> str | None:
    """`str(UUID(text))`, or None where `UUID(text)` refuses it: two texts name one rule when
    their keys are equal. Computed as UUID reads its text (the same prefixes, braces and
    hyphens dropped; then 32 digits) without importing `uuid` (with platform under it), which
    `rules list` and `config check` would import for this alone: a rule name is refused by
    its length or its letters, an id in ASCII hex is formatted here. Only what int() may read
    besides (underscores, signs, spaces, other scripts' digits) is left to UUID."""
    digits = text.replace("urn:", "").replace("uuid:", "").strip("{}").replace("-", "")
    if len(digits) != 32:
        return None
    if _HEX.issuperset(digits):
        d = digits.lower()
        return f"{d[:8]}-{d[8:12]}-{d[12:16]}-{d[16:20]}-{d[20:]}"
    if digits.isascii() and not _INT16_ASCII.issuperset(digits):
        return None  # int() refuses a character of it: so does UUID (a name of 32 letters)
    from uuid import UUID  # rare: see above

    try:
        return str(UUID(text))
    except ValueError:
        return None


class Referable:
    """The rules a correlation may name, looked up as pySigma's SigmaCollection does: a
    string by UUID when it reads as one, else by name; a number by position."""

    def __init__(self, rules: list[LoadedRule]):
        self.count = len(rules)
        self.ids = {uuid_key(r.header.sigma_id) for r in rules if r.header.sigma_id} - {None}
        self.names = {r.header.name for r in rules if r.header.name is not None}

    def known(self, ref: Any) -> bool:
        if isinstance(ref, str):
            key = uuid_key(ref)
            return key in self.ids if key is not None else ref in self.names
        if isinstance(ref, int):
            return -self.count <= ref < self.count
        return True  # SigmaCollection gives None for another type, without an error


def check_references(ruleset: RuleSet, references: list[References]) -> None:
    """Drop each correlation that names a rule not loaded, with an error at that name.
    `references` (one per rule) is kept in step with the rules."""
    referable = Referable([r for r in ruleset.rules if r.kind != "filter"])
    kept, kept_refs = [], []
    for rule, refs in zip(ruleset.rules, references, strict=True):
        if rule.kind == "correlation" and not all(referable.known(ref) for ref in refs):
            ruleset.errors.extend(_reference_errors(rule, referable))
            continue
        kept.append(rule)
        kept_refs.append(refs)
    ruleset.rules = kept
    references[:] = kept_refs


def _reference_errors(rule: LoadedRule, referable: Referable) -> list[RuleError]:
    """The errors of a correlation naming unknown rules, each at its line (the rule's object
    is read for them: only a rule set with such an error pays for pySigma here)."""
    from hpcsec.detector.engine import correlation_rules  # pySigma: on this error only

    return correlation_rules.unknown_reference_errors(rule, referable.known)


def drop_cycles(ruleset: RuleSet, references: list[References]) -> None:
    """Drop each correlation that refers to itself, directly or through other correlations,
    with an error at its `rules`: it would feed itself (the engine refuses such a set, and
    pySigma's conversion recurses without end on it), so the load says so, for every command
    alike. `references` (one per rule) is kept in step with the rules."""
    correlations = [r for r in ruleset.rules if r.kind == "correlation"]
    if not correlations:  # most rule sets: nothing to walk
        return
    referable = [r for r in ruleset.rules if r.kind != "filter"]
    by_key: dict[str, LoadedRule] = {}
    # only correlations can be in a cycle (ids and names are unique here: drop_duplicate_ids)
    for rule in correlations:  # as Referable looks names up: an id by its UUID, else a name
        header = rule.header
        if header.name is not None:
            by_key.setdefault(f"name:{header.name}", rule)
        key = uuid_key(header.sigma_id) if header.sigma_id else None
        if key is not None:
            by_key.setdefault(f"id:{key}", rule)

    def named(ref: Any) -> LoadedRule | None:
        if isinstance(ref, str):
            key = uuid_key(ref)
            return by_key.get(f"id:{key}" if key is not None else f"name:{ref}")
        if isinstance(ref, int) and -len(referable) <= ref < len(referable):
            return referable[ref]
        return None

    refers: dict[int, list[LoadedRule]] = {}
    for rule, refs in zip(ruleset.rules, references, strict=True):
        if rule.kind == "correlation":
            found = [named(ref) for ref in refs]
            refers[id(rule)] = [r for r in found if r is not None and r.kind == "correlation"]
    in_cycle: dict[int, list[LoadedRule]] = {}  # a rule of a cycle -> the cycle from it
    for rule in ruleset.rules:
        if rule.kind == "correlation" and id(rule) not in in_cycle:
            cycle = _cycle_from(rule, refers)
            if cycle is not None:
                in_cycle[id(rule)] = cycle
    if not in_cycle:
        return
    kept, kept_refs = [], []
    for rule, refs in zip(ruleset.rules, references, strict=True):
        cycle = in_cycle.get(id(rule))
        if cycle is None:
            kept.append(rule)
            kept_refs.append(refs)
            continue
        chain = " -> ".join(r.header.name or r.id for r in (*cycle, cycle[0]))
        ruleset.errors.append(
            RuleError(
                f"rule {rule.id}: correlation refers to itself through its rules ({chain}): "
                "it would count its own alerts",
                location(rule.path, rule.line_of("correlation", "rules")),
            )
        )
    ruleset.rules = kept
    references[:] = kept_refs


def _cycle_from(start: LoadedRule, refers: dict[int, list[LoadedRule]]) -> list[LoadedRule] | None:
    """The correlations of a cycle through `start` (from it, in reference order), if any:
    a walk that keeps its path, each rule expanded once."""
    path: list[LoadedRule] = [start]
    stack = [iter(refers.get(id(start), ()))]
    seen = {id(start)}
    while stack:
        nxt = next(stack[-1], None)
        if nxt is None:
            stack.pop()
            path.pop()
            continue
        if nxt is start:
            return list(path)
        if id(nxt) in seen:
            continue
        seen.add(id(nxt))
        path.append(nxt)
        stack.append(iter(refers.get(id(nxt), ())))
    return None

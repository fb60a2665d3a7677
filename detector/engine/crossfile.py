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

    @classmethod
    def of(cls, ruleset: RuleSet) -> Referable:
        """The rules of `ruleset` a correlation may name (not its filters), as they are now."""
        return cls([r for r in ruleset.rules if r.kind != "filter"])

    def __init__(self, rules: list[LoadedRule]):
        self.rules = rules
        self.ids: dict[str, LoadedRule] = {}
        self.names: dict[str, LoadedRule] = {}
        for rule in rules:  # the first of an id or name (drop_duplicate_ids keeps it alone)
            header = rule.header
            key = uuid_key(header.sigma_id) if header.sigma_id else None
            if key is not None:
                self.ids.setdefault(key, rule)
            if header.name is not None:
                self.names.setdefault(header.name, rule)

    def find(self, ref: Any) -> LoadedRule | None:
        """The rule `ref` names; None when none, or for a reference of another type."""
        if isinstance(ref, str):
            key = uuid_key(ref)
            return self.ids.get(key) if key is not None else self.names.get(ref)
        if isinstance(ref, int) and -len(self.rules) <= ref < len(self.rules):
            return self.rules[ref]
        return None

    def known(self, ref: Any) -> bool:
        # SigmaCollection gives None for another type, without an error
        return self.find(ref) is not None or not isinstance(ref, str | int)


def check_references(ruleset: RuleSet, references: list[References], referable: Referable) -> None:
    """Drop each correlation that names a rule not in `referable` (Referable.of the set),
    with an error at that name. `references` (one per rule) is kept in step with the rules."""
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


def drop_cycles(ruleset: RuleSet, references: list[References], referable: Referable) -> None:
    """Drop each correlation that refers to itself, directly or through other correlations,
    with an error at its `rules`: it would feed itself (the engine refuses such a set, and
    pySigma's conversion recurses without end on it), so the load says so, for every command
    alike. `referable`: the one the references were checked against, made before a
    correlation naming an unknown rule was dropped: a position counts the rules as pySigma
    does, and a drop must not shift it (`rules: [2]`, the correlation's own, named another
    rule or none). `references` (one per rule) is kept in step with the rules."""
    correlations = [r for r in ruleset.rules if r.kind == "correlation"]
    if not correlations:  # most rule sets: nothing to walk
        return
    refers: dict[int, list[LoadedRule]] = {}
    for rule, refs in zip(ruleset.rules, references, strict=True):
        if rule.kind == "correlation":
            found = [referable.find(ref) for ref in refs]
            refers[id(rule)] = [r for r in found if r is not None and r.kind == "correlation"]
    problems: dict[int, str] = {}  # a correlation dropped -> why
    for group in _cyclic_groups(correlations, refers):
        members = {id(r) for r in group}
        for rule in group:
            if len(group) <= CHAIN_NAMES:  # the way back named (a walk of the group each)
                how = f"through its rules ({_chain(rule, refers, members)})"
            else:
                how = f"through the rules of {len(group) - 1} correlations that refer to it"
            problems[id(rule)] = (
                f"correlation refers to itself {how}: it would count its own alerts"
            )

    if not problems:
        return
    # and what refers to a dropped one, at any remove: its rule is not loaded
    referrers: dict[int, list[LoadedRule]] = {}
    for rule in correlations:
        for target in refers.get(id(rule), ()):
            referrers.setdefault(id(target), []).append(rule)
    by_id = {id(r): r for r in correlations}
    todo = list(problems)
    while todo:
        target = by_id[todo.pop()]
        for rule in referrers.get(id(target), ()):
            if id(rule) not in problems:
                name = target.header.name or target.id
                problems[id(rule)] = f"correlation refers to {name!r}, which is not loaded"
                todo.append(id(rule))
    kept, kept_refs = [], []
    for rule, refs in zip(ruleset.rules, references, strict=True):
        problem = problems.get(id(rule))
        if problem is None:
            kept.append(rule)
            kept_refs.append(refs)
            continue
        ruleset.errors.append(
            RuleError(
                f"rule {rule.id}: {problem}",
                location(rule.path, rule.line_of("correlation", "rules")),
            )
        )
    ruleset.rules = kept
    references[:] = kept_refs


CHAIN_NAMES = 10  # names a cycle's message lists, at most


def _chain(rule: LoadedRule, refers: dict[int, list[LoadedRule]], members: set[int]) -> str:
    """`a -> b -> a`: a shortest way from `rule` back to itself within its cycle (a
    breadth-first walk: linear in the cycle), its names cut to CHAIN_NAMES."""
    came_from: dict[int, LoadedRule | None] = {}
    queue, end = [rule], None
    for node in queue:
        for nxt in refers.get(id(node), ()):
            if nxt is rule:
                end = node
                break
            if id(nxt) in members and id(nxt) not in came_from:
                came_from[id(nxt)] = node
                queue.append(nxt)
        if end is not None:
            break
    path = []
    back = end
    while back is not None and back is not rule:
        path.append(back)
        back = came_from.get(id(back))
    names = [r.header.name or r.id for r in (rule, *reversed(path), rule)]
    if len(names) > CHAIN_NAMES:
        names = [*names[: CHAIN_NAMES - 1], f"… {len(names) - CHAIN_NAMES} more", names[-1]]
    return " -> ".join(names)


def _cyclic_groups(
    nodes: list[LoadedRule], refers: dict[int, list[LoadedRule]]
) -> list[list[LoadedRule]]:
    """The groups of correlations that refer to one another (strongly connected, of two or
    more, or one that refers to itself): Tarjan's algorithm, without recursion, linear in
    the correlations and their references."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[LoadedRule] = []
    groups: list[list[LoadedRule]] = []
    for root in nodes:
        if id(root) in index:
            continue
        index[id(root)] = low[id(root)] = len(index)
        stack.append(root)
        on_stack.add(id(root))
        work = [(root, iter(refers.get(id(root), ())))]
        while work:
            node, targets = work[-1]
            for nxt in targets:
                if id(nxt) not in index:
                    index[id(nxt)] = low[id(nxt)] = len(index)
                    stack.append(nxt)
                    on_stack.add(id(nxt))
                    work.append((nxt, iter(refers.get(id(nxt), ()))))
                    break
                if id(nxt) in on_stack:
                    low[id(node)] = min(low[id(node)], index[id(nxt)])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[id(parent)] = min(low[id(parent)], low[id(node)])
                if low[id(node)] == index[id(node)]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(id(member))
                        group.append(member)
                        if member is node:
                            break
                    if len(group) > 1 or any(r is node for r in refers.get(id(node), ())):
                        groups.append(group)
    return groups

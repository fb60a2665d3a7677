"""`hpcsec rules check`: pySigma's validators plus ours, as findings with a file and a line."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, cast

from sigma.correlations import SigmaCorrelationRule
from sigma.filters import SigmaFilter
from sigma.rule.detection import SigmaDetectionItem
from sigma.types import SigmaFieldReference
from sigma.validators.base import (
    SigmaRuleValidator,
    SigmaValidationIssue,
    SigmaValidationIssueSeverity,
)

from hpcsec.detector.core import schema
from hpcsec.detector.engine.attributes import identity_problems
from hpcsec.detector.engine.context import RESPONSE_ATTRIBUTE, classify_tag, response_note
from hpcsec.detector.engine.loader import load_rules
from hpcsec.detector.engine.ruleset import LoadedRule, RuleSet
from hpcsec.detector.engine.ruletests import coverage_gaps, tests_file_for

ERROR, WARNING = "error", "warning"

# Installed pySigma validators we do not run, and why.
SKIPPED_VALIDATORS = {
    # Both download MITRE data from GitHub at first use; rules are checked on cluster nodes and
    # in CI without Internet access. attack_tag_findings below checks the shape of the tags.
    "attacktag": "needs MITRE ATT&CK data from the network",
    "d3_fendtag": "needs MITRE D3FEND data from the network",
    # SigmaHQ's naming convention for one-rule files; ours are one collection per threat vector.
    "filename_length": "SigmaHQ file naming convention",
}
# pySigma's namespace list predates MITRE ATLAS, the ATT&CK of attacks on ML systems.
EXTRA_TAG_NAMESPACES = ("atlas",)

ATTACK_TACTICS = frozenset(
    {
        "reconnaissance",
        "resource_development",
        "initial_access",
        "execution",
        "persistence",
        "privilege_escalation",
        "defense_evasion",
        "credential_access",
        "discovery",
        "lateral_movement",
        "collection",
        "command_and_control",
        "exfiltration",
        "impact",
    }
)
ATTACK_ID = re.compile(r"t\d{4}(\.\d{3})?|[gs]\d{4}")
ATLAS_ID = re.compile(r"aml\.t\d{4}(\.\d{3})?|aml\.ta\d{4}")


@dataclass(frozen=True)
class Finding:
    severity: str  # error | warning
    path: str
    line: int | None
    message: str
    code: str

    def __str__(self) -> str:
        where = self.path if self.line is None else f"{self.path}:{self.line}"
        return f"{where}: {self.severity}: {self.message} [{self.code}]"


def _at(rule: LoadedRule, severity: str, message: str, code: str, *keys: str | int) -> Finding:
    return Finding(severity, rule.path, rule.line_of(*keys), message, code)


def detection_keys(rule: LoadedRule) -> Iterable[tuple[tuple[str | int, ...], str]]:
    """(path, field name) of every `field|modifiers` key of a rule's or filter's detection."""
    section = "filter" if rule.kind == "filter" else "detection"
    skip = ("condition", "timeframe", "rules")
    for key in rule.key_lines:
        if len(key) >= 3 and key[0] == section and key[1] not in skip and isinstance(key[-1], str):
            yield key, key[-1].split("|", 1)[0]


def detection_items(detection: Any) -> Iterable[SigmaDetectionItem]:
    for item in getattr(detection, "detection_items", ()):
        if isinstance(item, SigmaDetectionItem):
            yield item
        else:
            yield from detection_items(item)


def fieldref_findings(rule: LoadedRule) -> list[Finding]:
    """`field|fieldref: other.field`: the value is a field name too."""
    detections = getattr(getattr(rule.sigma, "detection", None), "detections", None)
    if detections is None and isinstance(rule.sigma, SigmaFilter):
        detections = rule.sigma.filter.detections
    out = []
    for name, detection in (detections or {}).items():
        for item in detection_items(detection):
            for value in item.value:
                if isinstance(value, SigmaFieldReference) and not schema.is_known_field(
                    value.field
                ):
                    key = next(
                        (k for k, f in detection_keys(rule) if k[1] == name and f == item.field),
                        ("detection", name),
                    )
                    out.append(
                        _at(
                            rule,
                            WARNING,
                            f"unknown field {value.field!r} (not in docs/fields.md)",
                            "unknown-field",
                            *key,
                        )
                    )
    return out


def field_findings(rule: LoadedRule) -> list[Finding]:
    out = [
        _at(rule, WARNING, f"unknown field {name!r} (not in docs/fields.md)", "unknown-field", *key)
        for key, name in detection_keys(rule)
        if name and not schema.is_known_field(name)
    ]
    out += fieldref_findings(rule)
    corr = rule.sigma
    if isinstance(corr, SigmaCorrelationRule):
        aliases = {alias.alias for alias in corr.aliases}
        names: list[tuple[tuple[str, ...], str]] = [(("group-by",), f) for f in corr.group_by or []]
        fieldref = getattr(corr.condition, "fieldref", None)  # value_* conditions only
        for field_name in [fieldref] if isinstance(fieldref, str) else fieldref or []:
            names.append((("condition",), field_name))
        # an alias stands for one field of each rule it maps
        names += [
            (("aliases", alias.alias, ref.reference), f)
            for alias in corr.aliases
            for ref, f in alias.mapping.items()
        ]
        out += [
            _at(
                rule,
                WARNING,
                f"unknown field {name!r} (not in docs/fields.md)",
                "unknown-field",
                "correlation",
                *key,
            )
            for key, name in names
            if name not in aliases and not schema.is_known_field(name)
        ]
    return out


def logsource_findings(rule: LoadedRule) -> list[Finding]:
    logsource = getattr(rule.sigma, "logsource", None)
    if logsource is None:  # correlations take the log sources of their rules
        return []
    out = []
    if logsource.product != schema.PRODUCT:
        out.append(
            _at(
                rule,
                ERROR,
                f"logsource product must be {schema.PRODUCT!r}, not {logsource.product!r}",
                "logsource",
                "logsource",
                "product",
            )
        )
    if logsource.category is None:
        out.append(
            _at(
                rule,
                WARNING,
                "logsource has no category: the rule sees the events of "
                f"every category ({', '.join(schema.CATEGORIES)})",
                "logsource",
                "logsource",
            )
        )
    elif logsource.category not in schema.CATEGORIES:
        out.append(
            _at(
                rule,
                ERROR,
                f"unknown logsource category {logsource.category!r} "
                f"(known: {', '.join(schema.CATEGORIES)})",
                "logsource",
                "logsource",
                "category",
            )
        )
    return out


def tag_problem(tag: str) -> str | None:
    namespace, _, name = tag.partition(".")
    if namespace == "attack" and not (name in ATTACK_TACTICS or ATTACK_ID.fullmatch(name)):
        return f"malformed ATT&CK tag {tag!r} (attack.tNNNN, attack.tNNNN.NNN or attack.<tactic>)"
    if namespace == "atlas" and not ATLAS_ID.fullmatch(name):
        return f"malformed ATLAS tag {tag!r} (atlas.aml.tNNNN or atlas.aml.tNNNN.NNN)"
    return None


def tag_findings(rule: LoadedRule) -> list[Finding]:
    out = []
    for i, tag in enumerate(rule.sigma.tags or []):
        problem = tag_problem(str(tag))
        if problem:
            out.append(_at(rule, ERROR, problem, "attack-tag", "tags", i))
            continue
        found = classify_tag(str(tag))
        if found is not None and found[1]["name"] is None:
            message = f"tag {str(tag)!r} is not in the bundled technique table (shown without name)"
            out.append(_at(rule, WARNING, message, "unknown-technique", "tags", i))
    return out


def feeds_only(ruleset: RuleSet) -> set[str]:
    """Ids of the rules that never alert themselves: every correlation naming them says
    `generate: false` (Sigma's default), so only the correlation's alert reaches people."""
    generating: set[str] = set()
    referenced: set[str] = set()
    for rule in ruleset.rules:
        if not isinstance(rule.sigma, SigmaCorrelationRule):
            continue
        for ref in rule.sigma.rules or []:
            source = ruleset.find(ref.reference)
            if source is not None:
                referenced.add(source.id)
                if rule.sigma.generate:
                    generating.add(source.id)
    return referenced - generating


def response_findings(ruleset: RuleSet) -> list[Finding]:
    """An alert reaches an analyst with its rule's `response` note (what to check, how to
    contain it); a rule that alerts without one leaves them to guess."""
    silent = feeds_only(ruleset)
    return [
        _at(
            rule,
            WARNING,
            f"rule has no {RESPONSE_ATTRIBUTE} note (triage and containment for the analyst)",
            "missing-response",
        )
        for rule in ruleset.rules
        if rule.kind != "filter" and rule.id not in silent and response_note(rule.sigma) is None
    ]


def metadata_findings(rule: LoadedRule) -> list[Finding]:
    wanted = ("description",) if rule.kind == "filter" else ("description", "level", "tags")
    return [
        _at(rule, WARNING, f"rule has no {key}", f"missing-{key}")
        for key in wanted
        if not getattr(rule.sigma, key, None)
    ]


def test_findings(ruleset: RuleSet) -> list[Finding]:
    out = []
    for path in dict.fromkeys(ruleset.files):
        tests = tests_file_for(Path(path))
        if tests is not None and tests.suffix == ".yml":
            out.append(
                Finding(
                    ERROR,
                    str(tests),
                    None,
                    "name test events files *.yaml: Sigma tools read every *.yml as rules",
                    "tests-file-name",
                )
            )
    out += [_at(rule, WARNING, f"rule {gap}", "no-tests") for rule, gap in coverage_gaps(ruleset)]
    return out


def filter_findings(rule: LoadedRule, ruleset: RuleSet) -> list[Finding]:
    refs = rule.sigma.filter.rules if isinstance(rule.sigma, SigmaFilter) else "any"
    if isinstance(refs, str):
        return []
    return [
        _at(
            rule,
            WARNING,
            f"filter names unknown rule {ref.reference!r}",
            "filter-rule",
            "filter",
            "rules",
            i,
        )
        for i, ref in enumerate(refs)
        if ruleset.find(ref.reference) is None
    ]


def _issue_location(issue: SigmaValidationIssue, rule: LoadedRule) -> tuple[str | int, ...]:
    tag = getattr(issue, "tag", None)
    if tag is not None and tag in (rule.sigma.tags or []):
        return ("tags", rule.sigma.tags.index(tag))
    item = getattr(issue, "detection_item", None)
    if item is not None:
        for key, name in detection_keys(rule):
            if name == item.field:
                return key
    detection = getattr(issue, "detection_name", None) or getattr(issue, "detection", None)
    if isinstance(detection, str):
        return ("detection", detection)
    return ()


def _issue_details(issue: SigmaValidationIssue) -> str:
    details = []
    for f in fields(issue):
        if f.name == "rules":
            continue
        value = getattr(issue, f.name)
        if f.name == "detection_item":
            value = value.field or "keywords"
        details.append(f"{f.name}={value}")
    return f" ({', '.join(details)})" if details else ""


def _run_validators(ruleset: RuleSet) -> tuple[list[SigmaValidationIssue], list[Finding]]:
    """Every validator on every rule; a validator that crashes on a rule is that rule's error.

    pySigma accepts shapes its validators do not expect (`references: [{a: b}]` makes one
    raise TypeError), so each validator runs alone on each rule rather than all in one call.
    """
    # Plugin autodiscovery imports every installed backend and validator (a third of a second):
    # only `rules check` pays for it, not every command that loads rules.
    from sigma.plugins import InstalledSigmaPlugins
    from sigma.validation import SigmaValidator

    # pySigma annotates its validator registry with instances; it holds the classes
    installed = cast(
        "dict[str, type[SigmaRuleValidator]]", InstalledSigmaPlugins.autodiscover().validators
    )
    names = {cls: name for name, cls in installed.items()}
    validators = SigmaValidator(
        [cls for name, cls in installed.items() if name not in SKIPPED_VALIDATORS]
    ).validators
    issues: list[SigmaValidationIssue] = []
    crashes: list[Finding] = []
    for rule in ruleset.rules:
        sigma = rule.sigma
        if isinstance(sigma, SigmaFilter):
            continue
        for validator in validators:
            try:
                issues += validator.validate(sigma)
            except Exception as exc:  # reported as a finding, never a traceback
                crashes.append(
                    _at(
                        rule,
                        ERROR,
                        f"pySigma validator {names.get(type(validator))} "
                        f"cannot check this rule: {type(exc).__name__}: {exc}",
                        "sigma:validator-failed",
                    )
                )
    for validator in validators:
        try:
            issues += validator.finalize()
        except Exception:  # its per-rule failures are reported above
            continue
    return issues, crashes


def validator_findings(ruleset: RuleSet) -> list[Finding]:
    """pySigma's installed validators, minus SKIPPED_VALIDATORS, over rules and correlations."""
    issues, out = _run_validators(ruleset)
    by_object = {id(r.sigma): r for r in ruleset.rules}
    for issue in issues:
        tag = getattr(issue, "tag", None)
        if tag is not None and tag.namespace in EXTRA_TAG_NAMESPACES:
            continue
        severity = ERROR if issue.severity == SigmaValidationIssueSeverity.HIGH else WARNING
        code = "sigma:" + type(issue).__name__
        for sigma in issue.rules:
            rule = by_object.get(id(sigma))
            if rule is not None:
                out.append(
                    _at(
                        rule,
                        severity,
                        issue.description + _issue_details(issue),
                        code,
                        *_issue_location(issue, rule),
                    )
                )
    return out


def lint(ruleset: RuleSet) -> list[Finding]:
    """Every finding about a loaded ruleset (its load errors included), in file order."""
    out = [
        Finding(ERROR, e.location.path or "<input>", e.location.line, e.message, "load")
        if e.location
        else Finding(ERROR, "<input>", None, e.message, "load")
        for e in ruleset.errors
    ]
    for rule in ruleset.rules:
        out += logsource_findings(rule) + field_findings(rule) + tag_findings(rule)
        out += metadata_findings(rule) + filter_findings(rule, ruleset)
        out += [
            Finding(ERROR, rule.path, p.line, p.message, "alert-identity")
            for p in identity_problems(rule)
        ]
    out += validator_findings(ruleset) + test_findings(ruleset) + response_findings(ruleset)
    return sorted(set(out), key=lambda f: (f.path, f.line or 0, f.severity, f.message))


def check_paths(paths: Sequence[str | Path] | None) -> list[Finding]:
    return lint(load_rules(paths, collect_errors=True))

"""Sigma rule files -> RuleSet: pySigma parses every document; we add the file and the line.

pySigma says what is wrong but not where (its SigmaRuleLocation never carries a line). The YAML
is read with yamlsrc, which keeps the line of every key and list item, and each pySigma error
is pinned to what it is about: an unknown modifier to its key, a value that does not parse
(regex, CIDR, number) to that value, a condition error to `condition`, a missing section to the
document start. Detection items are parsed one by one for that, so a rule with three bad
values reports three lines. Correlation documents have checks of their own (correlation_rules).
"""

from __future__ import annotations

import copy
import importlib.resources
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sigma import exceptions as sx
from sigma.collection import deep_dict_update
from sigma.correlations import SigmaCorrelationRule
from sigma.exceptions import SigmaError, SigmaRuleLocation
from sigma.filters import SigmaFilter
from sigma.rule import SigmaRule
from sigma.rule.detection import SigmaDetectionItem, SigmaDetections

from hpcsec.detector.core.errors import HpcsecError, RuleError, location
from hpcsec.detector.core.yamlsrc import YamlDocument, load_documents
from hpcsec.detector.engine import correlation_rules, ruletests, thresholds
from hpcsec.detector.engine.ruleset import LoadedRule, RuleSet, SigmaItem

RULE_SUFFIXES = (".yml", ".yaml")
TESTS_DIR = "tests"  # beside the rule files: their test events, not rules
DETECTION_META_KEYS = ("condition", "timeframe")
Key = tuple[str | int, ...]
COMPARISON_TYPE_ERROR = re.compile(r"incompatible to value type of (?P<value>.+)$")
PYPARSING_AT = re.compile(
    r"(?:found (?P<found>.+?))?\s+\(at char \d+\), \(line:\d+, "
    r"col:(?P<column>\d+)\)"
)

# What part of a document each kind of pySigma error is about; subclasses before their bases.
ERROR_KEYS: tuple[tuple[type[SigmaError], Key], ...] = (
    (sx.SigmaRuleNotFoundError, ("correlation", "rules")),
    (sx.SigmaTimespanError, ("correlation", "timespan")),
    (sx.SigmaCorrelationTypeError, ("correlation", "type")),
    (sx.SigmaCorrelationConditionError, ("correlation", "condition")),
    (sx.SigmaCorrelationRuleError, ("correlation",)),
    (sx.SigmaFilterConditionError, ("filter", "condition")),
    (sx.SigmaFilterRuleReferenceError, ("filter", "rules")),
    (sx.SigmaFilterError, ("filter",)),
    (sx.SigmaConditionError, ("detection", "condition")),
    (sx.SigmaDetectionError, ("detection",)),
    (sx.SigmaLogsourceError, ("logsource",)),
    (sx.SigmaIdentifierError, ("id",)),
    (sx.SigmaTitleError, ("title",)),
    (sx.SigmaNameError, ("name",)),
    (sx.SigmaLevelError, ("level",)),
    (sx.SigmaStatusError, ("status",)),
    (sx.SigmaTagError, ("tags",)),
    (sx.SigmaDescriptionError, ("description",)),
    (sx.SigmaReferencesError, ("references",)),
    (sx.SigmaFieldsError, ("fields",)),
    (sx.SigmaFalsePositivesError, ("falsepositives",)),
    (sx.SigmaAuthorError, ("author",)),
    (sx.SigmaLicenseError, ("license",)),
    (sx.SigmaModifiedError, ("modified",)),
    (sx.SigmaDateError, ("date",)),
    (sx.SigmaRelatedError, ("related",)),
    (sx.SigmaScopeError, ("scope",)),
    (sx.SigmaTaxonomyError, ("taxonomy",)),
)


def bundled_rules_dir() -> Path:
    """The rules/ directory shipped inside the installed package."""
    return Path(str(importlib.resources.files("hpcsec.rules")))


def rule_files(paths: Sequence[str | Path], errors: list[RuleError]) -> list[Path]:
    """Files named by `paths`; directories give their *.yml/*.yaml, recursively, minus tests/."""
    files: list[Path] = []
    for given in paths:
        path = Path(given)
        if path.is_dir():
            found = sorted(
                p
                for p in path.rglob("*")
                if p.suffix in RULE_SUFFIXES
                and p.is_file()
                and not any(
                    part == TESTS_DIR or part.startswith(".")
                    for part in p.relative_to(path).parts[:-1]
                )
            )
            if not found:
                errors.append(
                    RuleError("no rule files (*.yml, *.yaml) in this directory", location(path))
                )
            files += found
        elif path.is_file():
            files.append(path)
        else:
            errors.append(RuleError("no such file or directory", location(path)))
    seen: set[Path] = set()  # a file named twice (as itself and in its directory) loads once
    return [f for f in files if not (f.resolve() in seen or seen.add(f.resolve()))]


def error_message(exc: BaseException) -> str:
    """pySigma's message without the " in <path>" it appends when it has a source."""
    return str(exc.args[0]) if exc.args else type(exc).__name__


def condition_syntax_message(message: str, condition: str) -> str:
    """pyparsing's grammar dump, said the way a rule author reads it."""
    found = PYPARSING_AT.search(message)
    if not found or not message.startswith(("Expected", "Unbalanced")):
        return message
    hint = "unbalanced parentheses, " if message.startswith("Unbalanced") else ""
    what = f"unexpected {found['found']}" if found["found"] else "syntax error"
    return f"condition syntax error in {condition!r}: {hint}{what} at column {found['column']}"


def detection_message(exc: SigmaError, at: Key) -> str:
    """pySigma's message, led by the `field|modifiers` key it is about."""
    message = error_message(exc)
    keys = [k for k in at[2:] if isinstance(k, str)]
    if not keys:
        return message
    modifiers = set(keys[-1].split("|")[1:])
    not_number = COMPARISON_TYPE_ERROR.search(message)
    if not_number and modifiers & {"gt", "gte", "lt", "lte"}:
        message = f"{not_number['value']} is not a number"
    return f"{keys[-1]}: {message}"


def key_for(exc: SigmaError, section: str) -> Key:
    for cls, key in ERROR_KEYS:
        if isinstance(exc, cls):
            if key[0] == "detection" and section == "filter":
                return ("filter", *key[1:])
            return key
    return ()


def _item_errors(key: str | None, value: Any, at: Key) -> list[tuple[SigmaError, Key]]:
    """Errors of one `field|modifiers: value(s)` item, each at the key or the bad value."""
    try:
        SigmaDetectionItem.from_mapping(key, value)
        return []
    except SigmaError as exc:
        error = exc
    except Exception:  # an odd shape; the error pySigma gives for the whole rule reports it
        return []
    about_key = isinstance(error, sx.SigmaModifierError) and not isinstance(
        error, sx.SigmaTypeError
    )
    if isinstance(value, list) and not about_key:
        bad_values = []
        for i, one in enumerate(value):
            try:
                SigmaDetectionItem.from_mapping(key, [one])
            except SigmaError as exc:
                bad_values.append((exc, (*at, i)))
            except Exception:
                continue
        if bad_values:
            return bad_values
    return [(error, at)]


def _definition_errors(definition: Any, at: Key) -> list[tuple[SigmaError, Key]]:
    if isinstance(definition, dict):
        return [e for k, v in definition.items() for e in _item_errors(str(k), v, (*at, k))]
    if isinstance(definition, list) and any(isinstance(d, dict) for d in definition):
        return [
            e
            for i, d in enumerate(definition)
            if isinstance(d, dict)
            for e in _definition_errors(d, (*at, i))
        ]
    return _item_errors(None, definition, at)


def detection_errors(section: Any, section_name: str) -> list[tuple[SigmaError, Key]]:
    """Parse each detection item alone so that each error gets its own key or value."""
    if not isinstance(section, dict):
        return []
    skip = (*DETECTION_META_KEYS, "rules") if section_name == "filter" else DETECTION_META_KEYS
    return [
        e
        for ident, definition in section.items()
        if ident not in skip
        for e in _definition_errors(definition, (section_name, ident))
    ]


def condition_errors(item: SigmaItem, doc: YamlDocument) -> list[RuleError]:
    """pySigma parses conditions lazily (at conversion); parse them now to report errors."""
    if isinstance(item, SigmaRule):
        detections, section = item.detection, "detection"
    elif isinstance(item, SigmaFilter):
        section = "filter"
        try:
            detections = SigmaDetections(item.filter.detections, list(item.filter.condition))
        except SigmaError as exc:
            return [RuleError(error_message(exc), location(doc.path, doc.line_of("filter")))]
    else:
        return []
    errors = []
    listed = isinstance(doc.data.get(section, {}).get("condition"), list)
    for i, condition in enumerate(detections.parsed_condition):
        try:
            condition.parse()
        except SigmaError as exc:
            at = (section, "condition", i) if listed else (section, "condition")
            message = condition_syntax_message(error_message(exc), condition.condition)
            errors.append(RuleError(message, location(doc.path, doc.line_of(*at))))
        except RecursionError:  # thousands of nested parentheses
            errors.append(
                RuleError(
                    "condition is nested too deeply",
                    location(doc.path, doc.line_of(section, "condition")),
                )
            )
        except Exception as exc:  # e.g. `condition: 5`, which pySigma does not expect
            errors.append(
                RuleError(
                    f"condition must be a string: {exc}",
                    location(doc.path, doc.line_of(section, "condition")),
                )
            )
    return errors


def logsource_errors(item: SigmaItem, doc: YamlDocument) -> list[RuleError]:
    """pySigma takes `category: [a, b]` or `{}`; routing needs one name (or none)."""
    logsource = getattr(item, "logsource", None)
    return [
        RuleError(
            f"logsource {key} must be one name, not a {type(value).__name__}",
            location(doc.path, doc.line_of("logsource", key)),
        )
        for key in ("product", "category", "service")
        if (value := getattr(logsource, key, None)) is not None and not isinstance(value, str)
    ]


def parse_document(doc: YamlDocument) -> tuple[SigmaItem | None, list[RuleError]]:
    """One Sigma document -> its pySigma object, or the errors that keep it from being one."""
    data = doc.data
    if "correlation" in data:
        cls: type[SigmaItem] = SigmaCorrelationRule
        section = "correlation"
    elif "filter" in data:
        cls, section = SigmaFilter, "filter"
    else:
        cls, section = SigmaRule, "detection"
    source = SigmaRuleLocation(Path(doc.path), doc.line)
    where = location(doc.path, doc.line)
    if section == "correlation" and (errors := correlation_rules.document_errors(doc)):
        return None, errors
    try:
        item = cls.from_dict(data, collect_errors=True, source=source)
    except SigmaError as exc:  # some errors are raised even when collecting
        return None, [
            RuleError(error_message(exc), location(doc.path, doc.line_of(*key_for(exc, section))))
        ]
    except RecursionError:
        return None, [RuleError("rule is nested too deeply", where)]
    except Exception as exc:  # pySigma handed a shape it does not expect (e.g. `detection: 5`)
        return None, [RuleError(f"not a valid Sigma {section} rule: {exc}", where)]
    if not item.errors:
        errors = logsource_errors(item, doc) + condition_errors(item, doc)
        return (None, errors) if errors else (item, [])
    located = detection_errors(data.get(section), section)
    messages = {error_message(e) for e, _ in located}
    errors = [
        RuleError(detection_message(e, at), location(doc.path, doc.line_of(*at)))
        for e, at in located
    ]
    errors += [
        RuleError(error_message(e), location(doc.path, doc.line_of(*key_for(e, section))))
        for e in item.errors
        if error_message(e) not in messages
    ]
    return None, list({str(e): e for e in errors}.values())


def merged(base: YamlDocument, over: YamlDocument, line: int) -> YamlDocument:
    """`over` deep-merged onto `base` (Sigma collection actions), keeping each key's own line."""
    data = deep_dict_update(copy.deepcopy(base.data), copy.deepcopy(over.data))
    data.pop("action", None)
    return YamlDocument(data, over.path, line, {**base.lines, **over.lines, (): line})


def rule_documents(docs: Iterable[YamlDocument]) -> tuple[list[YamlDocument], list[RuleError]]:
    """The rule documents of a file, with `action: global/reset/repeat` applied as pySigma does."""
    out: list[YamlDocument] = []
    errors: list[RuleError] = []
    global_doc: YamlDocument | None = None
    previous: YamlDocument | None = None
    for doc in docs:
        if doc.data is None:  # empty document, e.g. after a trailing `---`
            continue
        if not isinstance(doc.data, dict):
            errors.append(
                RuleError(
                    f"a Sigma document must be a mapping, not a {type(doc.data).__name__}",
                    location(doc.path, doc.line),
                )
            )
            continue
        action = doc.data.get("action")
        if action is None:
            if global_doc is not None and not {"correlation", "filter"} & doc.data.keys():
                doc = merged(doc, global_doc, doc.line)  # the global part wins, as in pySigma
            out.append(doc)
            previous = doc
        elif action == "global":
            global_doc = merged(YamlDocument({}, doc.path, doc.line), doc, doc.line)
            previous = global_doc
        elif action == "reset":
            global_doc = None
        elif action == "repeat":
            if previous is None:
                errors.append(
                    RuleError(
                        "`action: repeat` without a rule before it",
                        location(doc.path, doc.line_of("action")),
                    )
                )
                continue
            previous = merged(previous, doc, doc.line)
            out.append(previous)
        else:
            errors.append(
                RuleError(
                    f"unknown Sigma collection action {action!r} "
                    "(expected global, reset or repeat)",
                    location(doc.path, doc.line_of("action")),
                )
            )
    return out, errors


def load_file(
    path: Path, ruleset: RuleSet, threshold_values: Mapping[str, Any] | None = None
) -> None:
    """Add the rules of one file to `ruleset` (errors go to ruleset.errors).

    `threshold_values` (the site config's `thresholds`) replace the numbers the rules name
    in their `thresholds:` attribute, before pySigma sees them (detector/thresholds.py).
    """
    ruleset.files.append(str(path))
    try:
        docs, errors = rule_documents(load_documents(path))
    except HpcsecError as exc:
        ruleset.errors.append(RuleError(exc.message, exc.location))
        return
    except RecursionError:  # PyYAML composes nested collections recursively
        ruleset.errors.append(RuleError("YAML is nested too deeply", location(path)))
        return
    ruleset.errors.extend(errors)
    if not docs and not errors:
        ruleset.errors.append(RuleError("no rules", location(path, 1)))
    for doc in docs:
        ruleset.errors.extend(thresholds.apply(doc, threshold_values or {}))
        item, errors = parse_document(doc)
        ruleset.errors.extend(errors)
        if item is not None:
            ruleset.rules.append(LoadedRule(item, str(path), doc.line, path.stem, doc.lines))


def drop_duplicate_ids(ruleset: RuleSet) -> None:
    """Two documents with one id (or name) cannot both be referenced; keep the first."""
    seen: dict[str, LoadedRule] = {}
    kept = []
    for rule in ruleset.rules:
        duplicate = None
        for key, what in ((rule.sigma.id, "id"), (getattr(rule.sigma, "name", None), "name")):
            if key is None:
                continue
            first = seen.setdefault(f"{what}:{key}", rule)
            if first is not rule and duplicate is None:
                duplicate = RuleError(
                    f"duplicate rule {what} {key} (first at {first.path}:{first.line})",
                    location(rule.path, rule.line_of(what)),
                )
        if duplicate is None:
            kept.append(rule)
        else:
            ruleset.errors.append(duplicate)
    ruleset.rules = kept


def load_rules(
    paths: Sequence[str | Path] | None = None,
    *,
    collect_errors: bool = False,
    with_tests: bool = True,
    threshold_values: Mapping[str, Any] | None = None,
) -> RuleSet:
    """Rules (and their test events) from files and directories; None = the bundled rules.

    Raises the first RuleError, or with `collect_errors` returns every error in `.errors` next
    to the rules that did load. `with_tests=False` skips the test events: what scanning needs,
    so a slip in a tests file does not stop detection.
    """
    ruleset = RuleSet()
    files = rule_files([bundled_rules_dir()] if paths is None else paths, ruleset.errors)
    if ruleset.errors and not collect_errors:
        raise ruleset.errors[0]
    for path in files:
        load_file(path, ruleset, threshold_values)
    drop_duplicate_ids(ruleset)
    correlation_rules.resolve_correlations(ruleset)
    for path in files if with_tests else ():
        ruletests.load_tests_for(path, ruleset)
    if ruleset.errors and not collect_errors:
        raise ruleset.errors[0]
    return ruleset

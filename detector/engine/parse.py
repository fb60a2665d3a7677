"""One Sigma document -> its pySigma object, or errors that say where in the file.

pySigma says what is wrong but not where (its SigmaRuleLocation never carries a line). The YAML
is read with yamlsrc, which keeps the line of every key and list item, and each pySigma error
is pinned to what it is about: an unknown modifier to its key, a value that does not parse
(regex, CIDR, number) to that value, a condition error to `condition`, a missing section to the
document start. Detection items are parsed one by one for that, so a rule with three bad
values reports three lines. Correlation documents have checks of their own (correlation_rules).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sigma import exceptions as sx
from sigma.correlations import SigmaCorrelationRule
from sigma.exceptions import SigmaError, SigmaRuleLocation
from sigma.filters import SigmaFilter
from sigma.rule import SigmaRule
from sigma.rule.detection import SigmaDetectionItem, SigmaDetections
from sigma.types import SigmaRegularExpression

from hpcsec.detector.core.errors import RuleError, location
from hpcsec.detector.core.yamlsrc import YamlDocument
from hpcsec.detector.engine import correlation_rules
from hpcsec.detector.engine.condition_check import parses_cleanly, unnamed_selectors
from hpcsec.detector.engine.regex import UnsupportedRegex, compile_regex
from hpcsec.detector.engine.ruleset import SigmaItem

DETECTION_META_KEYS = ("condition", "timeframe")
EMPTY_DETECTION = "Detection is empty"  # pySigma's, for a mapping with nothing in it
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


def error_message(exc: BaseException) -> str:
    """pySigma's message without the " in <path>" it appends when it has a source, and with
    the objects it names by their repr (`<sigma.types.SigmaNull object at 0x7f…>`) named by
    their kind: an address says nothing to a rule author, and differs from one report of
    the same error to the next (which are then not known to be the same)."""
    message = str(exc.args[0]) if exc.args else type(exc).__name__
    return _OBJECT_REPR.sub(_kind_of_repr, message) if " object at 0x" in message else message


_OBJECT_REPR = re.compile(r"<sigma\.[\w.]*?\.?(Sigma\w+) object at 0x[0-9a-fA-F]+>")
_KINDS = {"SigmaNull": "null", "SigmaString": "text", "SigmaNumber": "a number"}


def _kind_of_repr(found: re.Match[str]) -> str:
    return _KINDS.get(found[1], found[1])


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


def _field_items(definition: Any, at: Key) -> Iterator[tuple[str | None, Any, Key]]:
    """(`field|modifiers` key or None for keywords, value(s), where) of a detection's items."""
    if isinstance(definition, dict):
        for key, value in definition.items():
            yield str(key), value, (*at, key)
    elif isinstance(definition, list) and any(isinstance(d, dict) for d in definition):
        for i, one in enumerate(definition):
            if isinstance(one, dict):
                yield from _field_items(one, (*at, i))
    else:
        yield None, definition, at


def _definition_errors(definition: Any, at: Key) -> list[tuple[SigmaError, Key]]:
    items = _field_items(definition, at)
    return [e for key, value, where in items for e in _item_errors(key, value, where)]


def _detections(section: Any, section_name: str) -> Iterator[tuple[Any, Any]]:
    """(identifier, definition) of each detection of a rule's `detection` or a filter's
    `filter` section (a mapping; its `condition`, and a filter's `rules`, are not ones)."""
    if not isinstance(section, dict):
        return
    skip = (*DETECTION_META_KEYS, "rules") if section_name == "filter" else DETECTION_META_KEYS
    for ident, definition in section.items():
        if ident not in skip:
            yield ident, definition


def detection_errors(section: Any, section_name: str) -> list[tuple[SigmaError, Key]]:
    """Parse each detection item alone so that each error gets its own key or value."""
    return [
        e
        for ident, definition in _detections(section, section_name)
        for e in _definition_errors(definition, (section_name, ident))
    ]


def _regex_problem(key: str, value: Any) -> str | None:
    """Why RE2 cannot run the `|re` value, if it cannot (placeholders are checked once filled)."""
    try:
        item = SigmaDetectionItem.from_mapping(key, [value])
    except Exception:  # reported by the parse already
        return None
    for parsed in item.value:
        if isinstance(parsed, SigmaRegularExpression) and not parsed.regexp.contains_placeholder():
            try:
                compile_regex(parsed)
            except UnsupportedRegex as exc:
                return str(exc)
    return None


def shape_errors(doc: YamlDocument, section_name: str) -> list[RuleError]:
    """Keys pySigma reads as text that YAML read as something else (`id: 12345`, a field
    named `5:`): pySigma fails on them with a Python error about the whole rule (`'int'
    object has no attribute 'split'`), so each is said here, at its line."""
    errors = []
    rule_id = doc.data.get("id")
    if rule_id is not None and not isinstance(rule_id, str):
        message = f"id must be text (a UUID), not {correlation_rules.yaml_kind(rule_id)}"
        errors.append(RuleError(message, location(doc.path, doc.line_of("id"))))
    section = doc.data.get(section_name) if section_name != "correlation" else None
    for ident, definition in _detections(section, section_name):
        if not isinstance(ident, str):
            message = f"detection name must be text, not {correlation_rules.yaml_kind(ident)}"
            errors.append(RuleError(message, location(doc.path, doc.line_of(section_name, ident))))
            continue
        maps: list[tuple[dict[Any, Any], tuple[int, ...]]] = (
            [(definition, ())] if isinstance(definition, dict) else []
        )
        if isinstance(definition, list):
            maps = [(one, (i,)) for i, one in enumerate(definition) if isinstance(one, dict)]
        for mapping, at in maps:
            for key in mapping:
                if not isinstance(key, str):
                    kind = correlation_rules.yaml_kind(key)
                    line = doc.line_of(section_name, ident, *at, key)
                    message = f"field name must be text, not {kind} ({key!r})"
                    errors.append(RuleError(message, location(doc.path, line)))
    return errors


def empty_detection_errors(doc: YamlDocument, section_name: str) -> list[RuleError]:
    """Detections with nothing under them (`selection:` alone, `[]`, `{}`): pySigma takes
    them, but they test nothing the engine can evaluate (nor a query express), so the rule
    is refused at the detection's line rather than when it is compiled."""
    errors = []
    for ident, definition in _detections(doc.data.get(section_name), section_name):
        if definition in (None, [], {}):
            message = (
                f"detection {ident!r} is empty: give it field: value pairs or a list of values"
            )
            errors.append(RuleError(message, location(doc.path, doc.line_of(section_name, ident))))
        elif isinstance(definition, list) and {} in definition:  # `- {}`: a mapping of nothing
            i = definition.index({})
            message = f"detection {ident!r} lists an empty mapping: give it field: value pairs"
            errors.append(
                RuleError(message, location(doc.path, doc.line_of(section_name, ident, i)))
            )
        elif isinstance(definition, list) and None in definition:  # a keyword that is null
            i = definition.index(None)
            message = f"detection {ident!r} lists null: a value without a field cannot be null"
            errors.append(
                RuleError(message, location(doc.path, doc.line_of(section_name, ident, i)))
            )
        else:  # `field: []`: pySigma reads "no value" as a test that the field is absent
            for key, value, at in _field_items(definition, (section_name, ident)):
                if key is not None and value == []:
                    message = (
                        f"{key}: an empty list of values; list one or more (null tests that "
                        "the field is absent)"
                    )
                    errors.append(RuleError(message, location(doc.path, doc.line_of(*at))))
    return errors


def regex_errors(doc: YamlDocument, section_name: str) -> list[RuleError]:
    """`|re` values RE2 cannot run, each at its value: the rule must not load, rather than
    load and never match or fall back to a matcher that backtracks."""
    errors = []
    for ident, definition in _detections(doc.data.get(section_name), section_name):
        for key, value, at in _field_items(definition, (section_name, ident)):
            if key is None or "re" not in key.split("|")[1:]:
                continue
            listed = isinstance(value, list)
            for i, one in enumerate(value if listed else [value]):
                if isinstance(one, str):
                    problem = _regex_problem(key, one)
                else:  # `|re: 5`: pySigma keeps the number as the "pattern"
                    kind = correlation_rules.yaml_kind(one) if one is not None else "null"
                    problem = f"|re needs a regular expression (text), not {kind}"
                if problem is not None:
                    line = doc.line_of(*at, i) if listed else doc.line_of(*at)
                    message = f"{key}: {problem}; the rule is not loaded"
                    errors.append(RuleError(message, location(doc.path, line)))
    return errors


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
        if parses_cleanly(condition):  # known without parsing it again (condition_check.py)
            continue  # (which it is not with a selector that names no detection)
        at = (section, "condition", i) if listed else (section, "condition")
        errors += [
            RuleError(
                f"condition selector '{selector}' names no detection of the rule",
                location(doc.path, doc.line_of(*at)),
            )
            for selector in unnamed_selectors(condition)
        ]
        try:
            condition.parse()
        except SigmaError as exc:
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
    if errors := shape_errors(doc, section):
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
        if section != "correlation":
            errors += empty_detection_errors(doc, section) + regex_errors(doc, section)
        return (None, errors) if errors else (item, [])
    return None, located_errors(item, doc, section)


def located_errors(item: SigmaItem, doc: YamlDocument, section: str) -> list[RuleError]:
    """The errors pySigma collected, each at the line of what it is about where we can tell."""
    located = detection_errors(doc.data.get(section), section)
    messages = {error_message(e) for e, _ in located}
    errors = [
        RuleError(detection_message(e, at), location(doc.path, doc.line_of(*at)))
        for e, at in located
    ]
    if section != "correlation" and (empty := empty_detection_errors(doc, section)):
        # pySigma's "Detection is empty" (`selection: {}`) names no detection, and would be
        # said at the `detection:` line: each empty one is said at its own line instead
        errors += empty
        messages.add(EMPTY_DETECTION)
    errors += [
        RuleError(error_message(e), location(doc.path, doc.line_of(*key_for(e, section))))
        for e in item.errors
        if error_message(e) not in messages
    ]
    return list({str(e): e for e in errors}.values())

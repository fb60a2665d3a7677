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
from pathlib import Path
from typing import Any

from sigma import exceptions as sx
from sigma.correlations import SigmaCorrelationRule
from sigma.exceptions import SigmaError, SigmaRuleLocation
from sigma.filters import SigmaFilter
from sigma.rule import SigmaRule
from sigma.rule.detection import SigmaDetectionItem, SigmaDetections

from hpcsec.detector.core.errors import RuleError, location
from hpcsec.detector.core.yamlsrc import YamlDocument
from hpcsec.detector.engine import correlation_rules
from hpcsec.detector.engine.ruleset import SigmaItem

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

"""A rule's header (ruleset.RuleHeader) from its pySigma object: what `rules list`, `config
check`, routing and correlation references read, kept apart so that they need no pySigma."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from sigma.correlations import SigmaCorrelationRule
from sigma.filters import SigmaFilter
from sigma.rule import SigmaDetection, SigmaDetectionItem, SigmaRule
from sigma.types import Placeholder, SigmaRegularExpression

from hpcsec.detector.engine.context import RESPONSE_ATTRIBUTE
from hpcsec.detector.engine.ruleset import RuleHeader, SigmaItem
from hpcsec.detector.engine.thresholds import ATTRIBUTE as THRESHOLDS_ATTRIBUTE


def _items(detection: SigmaDetection) -> Iterator[SigmaDetectionItem]:
    for item in detection.detection_items:
        if isinstance(item, SigmaDetection):
            yield from _items(item)
        else:
            yield item


# The fields whose values are a process's arguments (one string, or one per argument).
COMMAND_LINE_FIELDS = frozenset({"process.command_line", "process.args"})


def reads_command_line(rule: SigmaRule) -> bool:
    """Whether a rule tests a command-line field or has keywords (which search every field):
    the rules whose literals the process sensor keeps (cmdline_literals.py), known from the
    header without reading the rule's pySigma object again."""
    return any(
        item.field is None or item.field in COMMAND_LINE_FIELDS
        for detection in rule.detection.detections.values()
        for item in _items(detection)
    )


def placeholder_fields(rule: SigmaRule) -> dict[str, set[str]]:
    """Placeholder name -> the fields it is tested against in `rule`."""
    out: dict[str, set[str]] = {}
    for detection in rule.detection.detections.values():
        for item in _items(detection):
            for value in item.value:
                parts = (
                    value.regexp.s
                    if isinstance(value, SigmaRegularExpression)
                    else getattr(value, "s", ())
                )
                for part in parts:
                    if isinstance(part, Placeholder):
                        out.setdefault(part.name, set()).add(item.field or "")
    return out


def _word(value: Any) -> str:
    """pySigma enums (level, status) as the words rule files use."""
    if value is None:
        return ""
    return str(getattr(value, "name", value)).lower()


def _texts(value: Any) -> tuple[str, ...]:
    if not value:
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(str(v) for v in value if v is not None)


def _kind(sigma: SigmaItem) -> str:
    if isinstance(sigma, SigmaCorrelationRule):
        return "correlation"
    if isinstance(sigma, SigmaFilter):
        return "filter"
    return "detection"


def _kept_attributes(sigma: SigmaItem) -> dict[str, Any]:
    """The custom attributes read without the rule: its response note and threshold names."""
    attrs = getattr(sigma, "custom_attributes", None) or {}
    kept: dict[str, Any] = {}
    if isinstance(attrs.get(RESPONSE_ATTRIBUTE), str):
        kept[RESPONSE_ATTRIBUTE] = attrs[RESPONSE_ATTRIBUTE]
    declared = attrs.get(THRESHOLDS_ATTRIBUTE)
    if isinstance(declared, dict):
        kept[THRESHOLDS_ATTRIBUTE] = {str(name): None for name in declared}
    return kept


def header_of(sigma: SigmaItem) -> RuleHeader:
    name = getattr(sigma, "name", None)
    logsource = getattr(sigma, "logsource", None)
    fields = placeholder_fields(sigma) if isinstance(sigma, SigmaRule) else {}
    return RuleHeader(
        id=str(sigma.id) if sigma.id else (name or sigma.title),
        name=name,
        sigma_id=str(sigma.id or ""),
        title=sigma.title,
        kind=_kind(sigma),
        product=getattr(logsource, "product", None),
        category=getattr(logsource, "category", None),
        service=getattr(logsource, "service", None),
        level=_word(getattr(sigma, "level", None)),
        status=_word(getattr(sigma, "status", None)),
        tags=tuple(str(t) for t in (getattr(sigma, "tags", None) or [])),
        description=getattr(sigma, "description", None),
        falsepositives=_texts(getattr(sigma, "falsepositives", None)),
        references=_texts(getattr(sigma, "references", None)),
        custom_attributes=_kept_attributes(sigma),
        placeholder_fields={k: tuple(sorted(v)) for k, v in fields.items()},
        reads_command_line=isinstance(sigma, SigmaRule) and reads_command_line(sigma),
    )

"""A detection rule made ready to compile: its `|expand` placeholders filled with the site's
values (by pySigma's own transformation), and the Sigma filters that apply to it."""

from __future__ import annotations

import copy
from typing import Any

from sigma.exceptions import SigmaError
from sigma.filters import SigmaFilter
from sigma.rule import SigmaDetection, SigmaRule
from sigma.types import Placeholder, SigmaExpansion, SigmaRegularExpression

from hpcsec.detector.core.errors import RuleError, location
from hpcsec.detector.core.log import get_logger
from hpcsec.detector.engine.ruleset import LoadedRule

logger = get_logger(__name__)


def rule_error(rule: LoadedRule, message: str) -> RuleError:
    return RuleError(f"rule {rule.id}: {message}", location(rule.path, rule.line))


def placeholder_names(rule: SigmaRule) -> set[str]:
    names: set[str] = set()

    def walk(detection: SigmaDetection) -> None:
        for item in detection.detection_items:
            if isinstance(item, SigmaDetection):
                walk(item)
                continue
            for value in item.value:
                names.update(_placeholders_in(value))

    for detection in rule.detection.detections.values():
        walk(detection)
    return names


def filter_condition(filter_rule: LoadedRule, values: dict[str, list]) -> Any:
    """A filter's condition tree, its placeholders filled like a rule's."""
    sigma_filter = filter_rule.sigma
    assert isinstance(sigma_filter, SigmaFilter)
    # pySigma pipelines transform rules: carry the filter's detections in a stand-in rule
    stand_in = SigmaRule(
        title=sigma_filter.title,
        logsource=sigma_filter.logsource,
        detection=copy.deepcopy(sigma_filter.filter),
    )
    filled = fill_placeholders(filter_rule, values, stand_in)
    return filled.detection.parsed_condition[0].parse()


def fill_placeholders(
    rule: LoadedRule, values: dict[str, list], sigma: SigmaRule | None = None
) -> SigmaRule:
    """`|expand` placeholders, filled by pySigma's own ValueListPlaceholderTransformation.

    A placeholder without a value (not in the site config, or an empty list) stands for no
    value at all: its values match nothing, the rule's other values still work, and a warning
    names the rule. One unset list must not stop the scan or the agent."""
    if sigma is None:
        assert isinstance(rule.sigma, SigmaRule)  # filters come with a stand-in rule
        sigma = rule.sigma
    names = placeholder_names(sigma)
    if not names:
        return sigma
    filled = copy.deepcopy(sigma)
    missing = sorted(name for name in names if not values.get(name))
    if missing:
        listed = ", ".join(f"%{name}%" for name in missing)
        logger.warning(
            "%s:%d: rule %s: placeholder %s has no value (placeholder values come from the "
            "site config): its values match nothing",
            rule.path,
            rule.line,
            rule.id,
            listed,
        )
        for detection in filled.detection.detections.values():
            _match_nothing(detection, set(missing))
        if not names - set(missing):
            return filled
    # Imported here, by the few rules with placeholders: the pipeline module pulls in jinja2,
    # which commands that only list or load rules should not pay for at start-up.
    from sigma.processing.pipeline import ProcessingItem, ProcessingPipeline
    from sigma.processing.transformations import ValueListPlaceholderTransformation

    pipeline = ProcessingPipeline(
        items=[ProcessingItem(ValueListPlaceholderTransformation(), identifier="hpcsec-expand")],
        vars=dict(values),
    )
    try:
        pipeline.apply(filled)
    except SigmaError as e:
        raise rule_error(rule, str(e)) from e
    return filled


def _placeholders_in(value: Any) -> set[str]:
    parts = value.regexp.s if isinstance(value, SigmaRegularExpression) else getattr(value, "s", ())
    return {p.name for p in parts if isinstance(p, Placeholder)}


def _match_nothing(detection: SigmaDetection, missing: set[str]) -> None:
    """Each value naming a missing placeholder becomes an expansion to no value: false."""
    for item in detection.detection_items:
        if isinstance(item, SigmaDetection):
            _match_nothing(item, missing)
            continue
        item.value = [
            SigmaExpansion([]) if _placeholders_in(value) & missing else value
            for value in item.value
        ]


def filter_applies(filter_rule: LoadedRule, rule: LoadedRule) -> bool:
    sigma_filter = filter_rule.sigma
    assert isinstance(sigma_filter, SigmaFilter) and isinstance(rule.sigma, SigmaRule)
    if rule.sigma.logsource not in sigma_filter.logsource:
        return False
    refs = sigma_filter.filter.rules
    if isinstance(refs, str):
        return refs.lower() == "any"
    names = {rule.id, getattr(rule.sigma, "name", None), str(rule.sigma.id or "")}
    return any(ref.reference in names for ref in refs)

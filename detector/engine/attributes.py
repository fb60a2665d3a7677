"""Checks of hpcsec's own rule attributes (beside Sigma's), for `hpcsec rules check`.

`alert_identity:` names the event fields that make two matches of a detection rule distinct
alerts (detector/alerts/identity.py). The alert builder falls back to the default identity
when the value is malformed, so a typo would silently fold distinct actions into one alert
(or split repeats): here a malformed value is an error with its file and line.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpcsec.detector.core import schema
from hpcsec.detector.engine.ruleset import LoadedRule

IDENTITY_ATTRIBUTE = "alert_identity"  # the name detector/alerts/identity.py reads


@dataclass(frozen=True)
class AttributeProblem:
    message: str
    line: int


def identity_problems(rule: LoadedRule) -> list[AttributeProblem]:
    """What is wrong with the rule's `alert_identity:` (nothing when it has none)."""
    attributes = getattr(rule.sigma, "custom_attributes", None) or {}
    if IDENTITY_ATTRIBUTE not in attributes:
        return []
    raw = attributes[IDENTITY_ATTRIBUTE]
    line = rule.line_of(IDENTITY_ATTRIBUTE)
    if rule.kind != "detection":
        return [
            AttributeProblem(
                f"{IDENTITY_ATTRIBUTE} applies to detection rules only "
                "(a correlation's identity is its group-by)",
                line,
            )
        ]
    if not isinstance(raw, list):
        return [
            AttributeProblem(
                f"{IDENTITY_ATTRIBUTE} must be a list of event field names, "
                f"not {type(raw).__name__}",
                line,
            )
        ]
    problems = []
    for i, name in enumerate(raw):
        at = rule.line_of(IDENTITY_ATTRIBUTE, i)
        if not isinstance(name, str) or not name:
            problems.append(
                AttributeProblem(
                    f"{IDENTITY_ATTRIBUTE}[{i}] must be a field name, not {name!r}", at
                )
            )
        elif not schema.is_known_field(name):
            problems.append(
                AttributeProblem(
                    f"{IDENTITY_ATTRIBUTE}[{i}]: unknown field {name!r} (not in docs/fields.md)",
                    at,
                )
            )
    return problems

"""Named thresholds: a site tunes a rule's numbers from its config, without editing the rule.

Sigma placeholders (`|expand`) only carry strings, and pySigma refuses them beside `gt`/`gte`
and in correlation conditions, so numbers get their own mechanism. A rule names each of its
tunable numbers in a `thresholds:` attribute (a custom attribute any Sigma tool ignores),
mapping a name to the YAML path of the number:

    thresholds:
      rdma_read_requests_per_s: [detection, selection, "rdma.per_s.hw.rx_read_requests|gte"]
      rkey_errors_per_minute: [correlation, condition, gte]

The number in the rule stays the default, so the file is plain Sigma that `sigma check` and
SIEM conversions read as is; the site config's `thresholds: {name: number}` replaces it when
the rules are loaded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from hpcsec.detector.core.errors import RuleError, location
from hpcsec.detector.core.yamldoc import YamlDocument
from hpcsec.detector.engine.ruleset import LoadedRule

ATTRIBUTE = "thresholds"


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def declared(doc: YamlDocument) -> tuple[dict[str, tuple[str | int, ...]], list[RuleError]]:
    """The rule's threshold names and paths, with an error for each malformed declaration."""
    data = doc.data if isinstance(doc.data, dict) else {}
    raw = data.get(ATTRIBUTE)
    if raw is None:
        return {}, []
    where = location(doc.path, doc.line_of(ATTRIBUTE))
    if not isinstance(raw, dict):
        return {}, [RuleError("thresholds must map names to paths", where)]
    paths: dict[str, tuple[str | int, ...]] = {}
    errors: list[RuleError] = []
    for name, path in raw.items():
        at = location(doc.path, doc.line_of(ATTRIBUTE, name))
        if (
            not isinstance(path, list)
            or not path
            or not all(isinstance(p, (str, int)) and not isinstance(p, bool) for p in path)
        ):
            errors.append(
                RuleError(
                    f"threshold {name!r}: the path must be a list of keys, "
                    "e.g. [detection, selection, 'field|gte']",
                    at,
                )
            )
            continue
        node: Any = data
        for key in path:
            node = (
                node.get(key)
                if isinstance(node, dict)
                else (
                    node[key]
                    if isinstance(node, list)
                    and isinstance(key, int)
                    and -len(node) <= key < len(node)
                    else None
                )
            )
            if node is None:
                break
        if not _is_number(node):
            what = "nothing" if node is None else repr(node)
            errors.append(
                RuleError(f"threshold {name!r}: {list(path)} points at {what}, not a number", at)
            )
            continue
        paths[str(name)] = tuple(path)
    return paths, errors


def apply(doc: YamlDocument, values: Mapping[str, Any]) -> list[RuleError]:
    """Replace the declared numbers that `values` names, in place; errors for bad ones."""
    paths, errors = declared(doc)
    for name, path in paths.items():
        if name not in values:
            continue
        value = values[name]
        if not _is_number(value):
            errors.append(
                RuleError(
                    f"threshold {name!r}: the config gives {value!r}, not a number",
                    location(doc.path, doc.line_of(*path)),
                )
            )
            continue
        node = doc.data
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return errors


def names_used(rule: LoadedRule) -> set[str]:
    """The threshold names `rule` declares, and its placeholders (from its header: no pySigma
    is needed for a cached rule set)."""
    declared_names = rule.header.custom_attributes.get(ATTRIBUTE) or {}
    return {str(name) for name in declared_names} | set(rule.header.placeholder_fields)


def unused(values: Mapping[str, Any], rules: Sequence[LoadedRule]) -> list[str]:
    """Config threshold names no loaded rule declares or uses as a placeholder (typos)."""
    known: set[str] = set()
    for rule in rules:
        known |= names_used(rule)
    return sorted(name for name in values if name not in known)

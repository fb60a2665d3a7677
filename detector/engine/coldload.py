"""The cold path of loader.load_rules: each rule file's documents (collection.py) parsed by
pySigma with errors at their line (parse.py), duplicates dropped, correlation references
resolved across files, and the test events beside them (ruletests.py)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hpcsec.detector.core.errors import HpcsecError, RuleError, location
from hpcsec.detector.core.yamlsrc import load_documents
from hpcsec.detector.engine import correlation_rules, ruletests, thresholds
from hpcsec.detector.engine.collection import rule_documents
from hpcsec.detector.engine.parse import parse_document
from hpcsec.detector.engine.ruleset import BUNDLED, LoadedRule, RuleSet


def parse_files(
    ruleset: RuleSet,
    sources: Mapping[Path, str],
    threshold_values: Mapping[str, Any] | None,
    with_tests: bool,
) -> None:
    """Add the rules of `sources` (file -> origin) to `ruleset`, errors to ruleset.errors."""
    for path, origin in sources.items():
        load_file(path, ruleset, threshold_values, origin)
    drop_duplicate_ids(ruleset)
    correlation_rules.resolve_correlations(ruleset)
    for path in sources if with_tests else ():
        ruletests.load_tests_for(path, ruleset)


def load_file(
    path: Path,
    ruleset: RuleSet,
    threshold_values: Mapping[str, Any] | None = None,
    origin: str = "",
) -> None:
    """Add the rules of one file to `ruleset` (errors go to ruleset.errors).

    `threshold_values` (the site config's `thresholds`) replace the numbers the rules name
    in their `thresholds:` attribute, before pySigma sees them (detector/thresholds.py).
    `origin`: where the rules came from (`bundled` or the path given), for `rules list`.
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
            ruleset.rules.append(
                LoadedRule(item, str(path), doc.line, path.stem, doc.lines, origin)
            )


_LOCAL_REUSE_HINT = (
    "; a local rule needs an id of its own: to silence a bundled rule, add a Sigma filter "
    "that names it; to change one, copy it under a new id and filter the bundled one out"
)


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
                    f"duplicate rule {what} {key} (first at {first.path}:{first.line})"
                    + _LOCAL_REUSE_HINT * (first.origin == BUNDLED != rule.origin),
                    location(rule.path, rule.line_of(what)),
                )
        if duplicate is None:
            kept.append(rule)
        else:
            ruleset.errors.append(duplicate)
    ruleset.rules = kept

"""Sigma rule files -> RuleSet: the files named, their documents (collection.py), each parsed
by pySigma with errors at their line (parse.py), duplicates dropped, correlation references
resolved across files, and the test events beside them (ruletests.py)."""

from __future__ import annotations

import importlib.resources
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from hpcsec.detector.core.errors import HpcsecError, RuleError, location
from hpcsec.detector.core.yamlsrc import load_documents
from hpcsec.detector.engine import correlation_rules, rulecache, ruletests, thresholds
from hpcsec.detector.engine.collection import rule_documents
from hpcsec.detector.engine.parse import parse_document
from hpcsec.detector.engine.ruleset import LoadedRule, RuleSet

RULE_SUFFIXES = (".yml", ".yaml")
TESTS_DIR = "tests"  # beside the rule files: their test events, not rules


def bundled_rules_dir() -> Path:
    """The rules/ directory shipped inside the installed package."""
    return Path(str(importlib.resources.files("hpcsec.rules")))


BUNDLED = "bundled"  # the origin of the rules shipped with hpcsec


def _files_under(path: Path, errors: list[RuleError]) -> list[Path]:
    """The rule files `path` names: itself, or a directory's *.yml/*.yaml, recursively,
    minus tests/ and hidden directories."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        errors.append(RuleError("no such file or directory", location(path)))
        return []
    found = sorted(
        p
        for p in path.rglob("*")
        if p.suffix in RULE_SUFFIXES
        and p.is_file()
        and not any(
            part == TESTS_DIR or part.startswith(".") for part in p.relative_to(path).parts[:-1]
        )
    )
    if not found:
        errors.append(RuleError("no rule files (*.yml, *.yaml) in this directory", location(path)))
    return found


def rule_sources(paths: Sequence[str | Path], errors: list[RuleError]) -> dict[Path, str]:
    """Each rule file named by `paths`, with its origin: `bundled` for the rules shipped with
    hpcsec, else the path given. A file named twice (as itself, in its directory, or by the
    site config and the command line) loads once, with the origin that named it first."""
    bundled = bundled_rules_dir().resolve()
    sources: dict[Path, tuple[Path, str]] = {}
    for given in paths:
        origin = BUNDLED if Path(given).resolve() == bundled else str(given)
        for file in _files_under(Path(given), errors):
            sources.setdefault(file.resolve(), (file, origin))
    return dict(sources.values())


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


def load_rules(
    paths: Sequence[str | Path] | None = None,
    *,
    collect_errors: bool = False,
    with_tests: bool = True,
    threshold_values: Mapping[str, Any] | None = None,
    cache: Path | None = None,
) -> RuleSet:
    """Rules (and their test events) from files and directories; None = the bundled rules.

    Raises the first RuleError, or with `collect_errors` returns every error in `.errors` next
    to the rules that did load. `with_tests=False` skips the test events: what scanning needs,
    so a slip in a tests file does not stop detection. `cache`: a directory where rule sets
    that loaded without error are kept by content hash (rulecache.py).
    """
    ruleset = RuleSet()
    sources = rule_sources([bundled_rules_dir()] if paths is None else paths, ruleset.errors)
    if ruleset.errors and not collect_errors:
        raise ruleset.errors[0]
    files = list(sources)
    key = None
    if cache is not None and not ruleset.errors:
        # where each file came from is part of the rule set (`rules list` shows it)
        origins = [f"{path}={sources[path]}" for path in files]
        key = rulecache.cache_key(files, {**(threshold_values or {}), "": origins}, with_tests)
        cached = rulecache.read(cache, key) if key else None
        if cached is not None:
            return cached
    for path in files:
        load_file(path, ruleset, threshold_values, sources[path])
    drop_duplicate_ids(ruleset)
    correlation_rules.resolve_correlations(ruleset)
    for path in files if with_tests else ():
        ruletests.load_tests_for(path, ruleset)
    if ruleset.errors and not collect_errors:
        raise ruleset.errors[0]
    if cache is not None and key is not None and not ruleset.errors:
        rulecache.write(cache, key, ruleset)
    return ruleset

"""The pySigma processing pipeline `hpcsec rules convert` applies before any backend.

Our events already use ECS names where ECS has one, so most fields pass through unchanged. What
a SIEM query needs that our engine gets elsewhere:
- the log source: our engine routes events by `event.category`; in a SIEM index that holds every
  hpcsec event, the query itself must say `event.category: <logsource category>`;
- placeholder values: `%name%` with `|expand` are filled from the site config (thresholds and
  named lists), or, for lists the SIEM keeps itself, replaced by a lookup expression;
- field names the target spells differently: `fields` (fieldmaps.py) renames ours to ECS or
  Splunk CIM, and a pySigma pipeline given with `-p` renames further (it runs after ours).

A rule the backend cannot express (Lucene has no correlations, Splunk no ordered temporal
ones) is skipped with its reason (`Conversion.skipped`); the others still convert.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import yaml
from sigma.collection import SigmaCollection
from sigma.correlations import SigmaCorrelationRule
from sigma.exceptions import SigmaError, SigmaPipelineNotFoundError
from sigma.rule import SigmaRule

if TYPE_CHECKING:  # pySigma's conversion, processing and plugin modules (jinja2 under them)
    # are imported where a conversion needs them, so commands that only load rules start
    # quickly (tests/detector/cli/test_startup_imports.py)
    from sigma.conversion.base import Backend
    from sigma.plugins import InstalledSigmaPlugins
    from sigma.processing.pipeline import ProcessingItem, ProcessingPipeline

from hpcsec.detector.core.errors import RuleError, SourceLocation, UsageError, location
from hpcsec.detector.core.schema import CATEGORIES, PRODUCT
from hpcsec.detector.engine.fieldmaps import (
    DEFAULT_FIELD_MAP,
    FIELD_MAPS,
    HPCSEC,
    TARGET_EXTRAS,
    FieldMap,
)
from hpcsec.detector.engine.prepare import placeholder_names
from hpcsec.detector.engine.ruleset import RuleSet

# Runs before pipelines given with -p (pySigma orders pipelines by priority, lowest first), so
# a site's own mapping sees our field names.
PIPELINE_PRIORITY = 10

# Backend options by target: the SQLite backend's correlations need the event time column.
TARGET_OPTIONS: dict[str, dict[str, Any]] = {
    "sqlite": {"timestamp_field": "@timestamp", "table": "events"},
}


def placeholder_values(values: dict[str, list[Any]]) -> dict[str, list[str | int | float]]:
    """pySigma takes strings and numbers as placeholder values; booleans become text."""
    out: dict[str, list[str | int | float]] = {}
    for name, items in values.items():
        out[name] = [
            str(v).lower()
            if isinstance(v, bool)
            else v
            if isinstance(v, (str, int, float))
            else str(v)
            for v in items
        ]
    return out


def _field_items(fields: FieldMap) -> list[ProcessingItem]:
    """The renaming to `fields`, then one log source -> category condition per category."""
    from sigma.processing.conditions import LogsourceCondition
    from sigma.processing.pipeline import ProcessingItem
    from sigma.processing.transformations import (
        AddConditionTransformation,
        FieldMappingTransformation,
    )

    items = []
    if fields.fields:  # before the log source condition: that one is already in `fields`' names
        items.append(
            ProcessingItem(
                identifier=f"hpcsec_fields_{fields.name}",
                # pySigma's annotation admits None keys (keyword items); ours are names
                transformation=FieldMappingTransformation(
                    cast("dict[str | None, str | list[str]]", dict(fields.fields))
                ),
            )
        )
    items += [
        ProcessingItem(
            identifier=f"hpcsec_logsource_{category}",
            transformation=AddConditionTransformation(
                {fields.category_field: fields.category(category)}
            ),
            rule_conditions=[LogsourceCondition(product=PRODUCT, category=category)],
        )
        for category in CATEGORIES
    ]
    return items


def hpcsec_pipeline(
    placeholders: dict[str, list[Any]] | None = None,
    placeholder_expression: str | None = None,
    fields: FieldMap = HPCSEC,
) -> ProcessingPipeline:
    """Log source -> category condition, fields renamed to `fields`, placeholders filled.

    `placeholder_expression` (pySigma's QueryExpressionPlaceholderTransformation, with `{field}`
    and `{id}`) replaces the placeholders that have no value; without it they are an error.
    """
    from sigma.processing.pipeline import ProcessingItem, ProcessingPipeline
    from sigma.processing.transformations import (
        QueryExpressionPlaceholderTransformation,
        ValueListPlaceholderTransformation,
    )

    items = _field_items(fields)
    values = placeholder_values(placeholders or {})
    if values:
        items.append(
            ProcessingItem(
                identifier="hpcsec_placeholder_values",
                transformation=ValueListPlaceholderTransformation(include=sorted(values)),
            )
        )
    if placeholder_expression:
        items.append(
            ProcessingItem(
                identifier="hpcsec_placeholder_lookups",
                transformation=QueryExpressionPlaceholderTransformation(
                    expression=placeholder_expression
                ),
            )
        )
    return ProcessingPipeline(
        name=f"hpcsec field mapping ({fields.name})",
        priority=PIPELINE_PRIORITY,
        items=items,
        vars=values,
    )


def require_placeholder_values(ruleset: RuleSet, values: dict[str, list[Any]]) -> None:
    """A placeholder without a value is the site config's gap: say so at the rule's line."""
    for rule in ruleset.rules:
        if not isinstance(rule.sigma, SigmaRule):
            continue
        missing = sorted(placeholder_names(rule.sigma) - values.keys())
        if missing:
            expand_keys = [
                k for k in rule.key_lines if k[:1] == ("detection",) and "|expand" in str(k[-1])
            ]
            line = rule.line_of(*expand_keys[0]) if expand_keys else rule.line
            raise RuleError(
                f"placeholder {', '.join(f'%{m}%' for m in missing)} has no value: set it in "
                "the site config (lists or thresholds, --config) or give "
                "--placeholder-expression",
                location(rule.path, line),
            )


def site_pipelines(
    plugins: InstalledSigmaPlugins, specs: Sequence[str], target: str
) -> ProcessingPipeline:
    """The -p pipelines (installed names or YAML files), each checked alone to name it."""
    resolver = plugins.get_pipeline_resolver()
    for spec in specs:
        try:
            resolver.resolve([spec], target)
        except SigmaPipelineNotFoundError:
            raise UsageError(
                f"pipeline {spec!r} is neither an installed pySigma pipeline "
                f"({', '.join(sorted(plugins.pipelines)) or 'none installed'}) "
                "nor a YAML file"
            ) from None
        except SigmaError as exc:
            raise UsageError(f"pipeline {spec!r}: {exc.args[0] if exc.args else exc}") from None
        except (
            OSError,
            yaml.YAMLError,
            AttributeError,
            KeyError,
            TypeError,
            ValueError,
        ) as exc:  # pySigma reads a file's shape without checking it
            raise UsageError(
                f"pipeline {spec!r} is not a pySigma pipeline: {type(exc).__name__}: {exc}"
            ) from None
    return resolver.resolve(list(specs), target)


@dataclass(frozen=True)
class SkippedRule:
    """A rule the backend could not convert, and why (the backend's words)."""

    title: str
    rule_id: str
    where: SourceLocation | None
    reason: str

    def __str__(self) -> str:
        prefix = f"{self.where}: " if self.where else ""
        return f"{prefix}rule {self.rule_id} ({self.title}) not converted: {self.reason}"


@dataclass
class Conversion:
    queries: list[Any] = field(default_factory=list)
    skipped: list[SkippedRule] = field(default_factory=list)


def missing_backend_message(target: str, installed: Sequence[str]) -> str:
    """What to install for `target`: the pip extra where hpcsec has one for it."""
    extra = TARGET_EXTRAS.get(target)
    hint = f": pip install 'hpcsec[{extra}]'" if extra else ""
    return (
        f"unknown target {target!r} (installed pySigma backends: "
        f"{', '.join(sorted(installed)) or 'none'}){hint}"
    )


def field_map(target: str, name: str | None) -> FieldMap:
    """The schema named `name`, or the one `target`'s SIEM usually holds."""
    chosen = name or DEFAULT_FIELD_MAP.get(target, HPCSEC.name)
    if chosen not in FIELD_MAPS:
        raise UsageError(f"unknown field names {chosen!r} (one of: {', '.join(FIELD_MAPS)})")
    return FIELD_MAPS[chosen]


# pySigma appends where it was to a backend's message: our warning says that itself.
_WHILE_SUFFIX = re.compile(r"\s*\(while [a-z ]+ rule [^()]*\)\s*$")


def _reason(error: BaseException) -> str:
    text = str(error.args[0]) if error.args else type(error).__name__
    return _WHILE_SUFFIX.sub("", text) or type(error).__name__


def _convert_one(backend: Backend, rule: Any, output_format: str) -> list[Any]:
    if isinstance(rule, SigmaCorrelationRule):
        return list(backend.convert_correlation_rule(rule, output_format))
    return list(backend.convert_rule(rule, output_format))


def _unconverted_bases(rule: Any, not_converted: set[int]) -> list[str]:
    """Names of the rules a correlation builds on that were skipped before it."""
    if not isinstance(rule, SigmaCorrelationRule):
        return []
    return [
        str(ref.rule.name or ref.rule.id)
        for ref in rule.rules or ()
        if id(ref.rule) in not_converted
    ]


def _convert_each(
    backend: Backend, collection: SigmaCollection, output_format: str, ruleset: RuleSet
) -> Conversion:
    """Rule by rule, so that one the backend cannot express is skipped, not the whole set.

    pySigma's own `convert` stops at the first NotImplementedError (a correlation type the
    backend lacks); SigmaErrors it collects in `backend.errors` (collect_errors)."""
    by_id = {str(r.sigma.id or r.sigma.title): r for r in ruleset.rules}
    result = Conversion()

    def skip(rule: Any, error: BaseException) -> None:
        loaded = by_id.get(str(rule.id or rule.title))
        where = location(loaded.path, loaded.line) if loaded else None
        rule_id = loaded.id if loaded else str(rule.id or "")
        result.skipped.append(SkippedRule(str(rule.title), rule_id, where, _reason(error)))

    backend.init_processing_pipeline(output_format)
    collection.resolve_rule_references()
    not_converted: set[int] = set()
    for rule in collection.rules:
        known_errors = len(backend.errors)
        missing = _unconverted_bases(rule, not_converted)
        if missing:  # pySigma would only say "Conversion result not available"
            skip(rule, NotImplementedError(f"its rule(s) {', '.join(missing)} were not converted"))
            not_converted.add(id(rule))
            continue
        try:
            queries = _convert_one(backend, rule, output_format)
        except (SigmaError, NotImplementedError) as exc:
            skip(rule, exc)
            not_converted.add(id(rule))
            continue
        if len(backend.errors) > known_errors:
            skip(rule, backend.errors[known_errors][1])
            not_converted.add(id(rule))
            continue
        result.queries += queries
    finalized = backend.finalize(result.queries, output_format)
    result.queries = list(finalized) if isinstance(finalized, list) else [finalized]
    return result


def convert_ruleset(
    ruleset: RuleSet,
    target: str,
    *,
    pipelines: Sequence[str] = (),
    placeholders: dict[str, list[Any]] | None = None,
    backend_options: dict[str, Any] | None = None,
    output_format: str = "default",
    placeholder_expression: str | None = None,
    fields: str | None = None,
) -> Conversion:
    """Queries for `target` (an installed pySigma backend), our pipeline applied first; the
    rules it cannot express are in `skipped`."""
    from sigma.plugins import InstalledSigmaPlugins

    plugins = InstalledSigmaPlugins.autodiscover()
    # pySigma annotates its backend registry with instances; it holds the classes
    backend_class = cast("type[Backend] | None", plugins.backends.get(target))
    if backend_class is None:
        raise UsageError(missing_backend_message(target, list(plugins.backends)))
    pipeline = hpcsec_pipeline(
        placeholders,
        placeholder_expression=placeholder_expression,
        fields=field_map(target, fields),
    )
    if pipelines:
        pipeline = pipeline + site_pipelines(plugins, pipelines, target)
    try:
        options = {**TARGET_OPTIONS.get(target, {}), **(backend_options or {})}
        backend = backend_class(processing_pipeline=pipeline, collect_errors=True, **options)
    except SigmaError as exc:
        raise UsageError(str(exc.args[0]) if exc.args else type(exc).__name__) from None
    except (TypeError, ValueError) as exc:
        raise UsageError(f"backend {target!r}: {exc}") from None
    if not placeholder_expression:
        require_placeholder_values(ruleset, placeholders or {})
    # Backends and filters change rules in place; convert copies and keep the loaded ruleset.
    copies = copy.deepcopy([r.sigma for r in ruleset.rules])
    collection = SigmaCollection(copies)  # applies filters, resolves correlation references
    try:
        return _convert_each(backend, collection, output_format, ruleset)
    except SigmaError as exc:
        raise UsageError(f"{target}: {exc.args[0] if exc.args else exc}") from None
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        # a -p pipeline with a well-formed shape but wrong values (`mapping: 5`) fails only here
        raise UsageError(f"{target}: cannot apply the processing pipelines: {exc}") from None

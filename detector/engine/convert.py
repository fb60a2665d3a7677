"""The pySigma processing pipeline `hpcsec rules convert` applies before any backend.

Our events already use ECS names where ECS has one, so most fields pass through unchanged. What
a SIEM query needs that our engine gets elsewhere:
- the log source: our engine routes events by `event.category`; in a SIEM index that holds every
  hpcsec event, the query itself must say `event.category: <logsource category>`;
- placeholder values: `%name%` with `|expand` are filled from the site config (thresholds and
  named lists), or, for lists the SIEM keeps itself, replaced by a lookup expression;
- field names the target spells differently: a pySigma pipeline given with `-p` renames them
  (it runs after ours).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

import yaml
from sigma.collection import SigmaCollection
from sigma.exceptions import SigmaError, SigmaPipelineNotFoundError
from sigma.rule import SigmaRule

from hpcsec.detector.core.errors import RuleError, UsageError, location
from hpcsec.detector.core.schema import CATEGORIES, PRODUCT
from hpcsec.detector.engine.prepare import placeholder_names
from hpcsec.detector.engine.ruleset import RuleSet

if TYPE_CHECKING:
    from sigma.conversion.base import Backend
    from sigma.plugins import InstalledSigmaPlugins
    from sigma.processing.pipeline import ProcessingPipeline

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


def hpcsec_pipeline(
    placeholders: dict[str, list[Any]] | None = None,
    placeholder_expression: str | None = None,
) -> ProcessingPipeline:
    """Log source -> `event.category` condition, placeholders filled.

    `placeholder_expression` (pySigma's QueryExpressionPlaceholderTransformation, with `{field}`
    and `{id}`) replaces the placeholders that have no value; without it they are an error.
    """
    # pySigma's processing and plugin modules (and jinja2 under them) are imported where a
    # conversion needs them, so that commands that only load rules start quickly.
    from sigma.processing.conditions import LogsourceCondition
    from sigma.processing.pipeline import ProcessingItem, ProcessingPipeline
    from sigma.processing.transformations import (
        AddConditionTransformation,
        QueryExpressionPlaceholderTransformation,
        ValueListPlaceholderTransformation,
    )

    items = [
        ProcessingItem(
            identifier=f"hpcsec_logsource_{category}",
            transformation=AddConditionTransformation({"event.category": category}),
            rule_conditions=[LogsourceCondition(product=PRODUCT, category=category)],
        )
        for category in CATEGORIES
    ]
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
        name="hpcsec field mapping", priority=PIPELINE_PRIORITY, items=items, vars=values
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


def convert_rules(
    ruleset: RuleSet,
    target: str,
    *,
    pipelines: Sequence[str] = (),
    placeholders: dict[str, list[Any]] | None = None,
    backend_options: dict[str, Any] | None = None,
    output_format: str = "default",
    placeholder_expression: str | None = None,
) -> list[Any]:
    """Queries for `target` (an installed pySigma backend), our pipeline applied first."""
    from sigma.plugins import InstalledSigmaPlugins

    plugins = InstalledSigmaPlugins.autodiscover()
    # pySigma annotates its backend registry with instances; it holds the classes
    backend_class = cast("type[Backend] | None", plugins.backends.get(target))
    if backend_class is None:
        raise UsageError(
            f"unknown target {target!r} (installed pySigma backends: "
            f"{', '.join(sorted(plugins.backends)) or 'none'})"
        )
    pipeline = hpcsec_pipeline(placeholders, placeholder_expression=placeholder_expression)
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
        queries = backend.convert(collection, output_format)
    except SigmaError as exc:
        raise UsageError(f"{target}: {exc.args[0] if exc.args else exc}") from None
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        # a -p pipeline with a well-formed shape but wrong values (`mapping: 5`) fails only here
        raise UsageError(f"{target}: cannot apply the processing pipelines: {exc}") from None
    by_id = {str(r.sigma.id or r.sigma.title): r for r in ruleset.rules}
    for rule, error in backend.errors:
        loaded = by_id.get(str(rule.id or rule.title))
        where = location(loaded.path, loaded.line) if loaded else None
        message = str(error.args[0]) if error.args else type(error).__name__
        raise RuleError(f"cannot convert rule {rule.title!r} to {target}: {message}", where)
    return list(queries) if isinstance(queries, list) else [queries]

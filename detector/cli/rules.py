"""`hpcsec rules list|check|test|convert`: tools for rule authors."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from hpcsec.detector.cli.common import add_config_and_rules
from hpcsec.detector.core.display import visible
from hpcsec.detector.core.errors import UsageError
from hpcsec.detector.engine import rulecache
from hpcsec.detector.engine.context import rule_context, technique_label
from hpcsec.detector.engine.loader import load_rules, rule_paths_for
from hpcsec.detector.engine.ruleset import LoadedRule

# `rules list` reads the rule cache's headers and must not pay for pySigma's parser: the
# actions that need it (show, check, test, convert) import their modules when they run. The
# site config's parser (config.site) likewise: `rules list` without --config has no config.

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# the names of engine/fieldmaps.FIELD_MAPS (a test checks they agree), written out so that every
# `rules` action does not import the tables (and a dataclass) for --fields' choices
FIELD_MAP_NAMES = ("hpcsec", "ecs", "cim")


def _add_paths(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="rule file or directory (default: the bundled rules)",
    )


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rules", help="list, check, test and convert Sigma rules")
    actions = p.add_subparsers(dest="rules_action", metavar="ACTION", required=True)

    ls = actions.add_parser(
        "list", help="list rules: id, title, level, vector, status, origin, file"
    )
    ls.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="list only this rule file or directory (default: what scan and the agent run: "
        "the bundled rules, the config's `rules:` and --rules)",
    )
    add_config_and_rules(ls)
    ls.add_argument("--format", choices=("table", "json"), default="table")
    ls.set_defaults(func=run_list)

    show = actions.add_parser(
        "show",
        help="one rule's card: description, techniques, false positives, response, logic",
    )
    show.add_argument("rule", metavar="ID|TITLE", help="rule id, title, or part of one title")
    show.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        help="look only in this rule file or directory (default: what scan and the agent run)",
    )
    add_config_and_rules(show)
    show.set_defaults(func=run_show)

    check = actions.add_parser("check", help="validate rules: pySigma validators and ours")
    _add_paths(check)
    check.add_argument("--strict", action="store_true", help="warnings fail too (exit 2)")
    check.set_defaults(func=run_check)

    test = actions.add_parser("test", help="run every rule's test events through the engine")
    _add_paths(test)
    test.add_argument(
        "--config", metavar="FILE", help="site config whose thresholds and lists fill placeholders"
    )
    test.set_defaults(func=run_test)
    _register_convert(actions)


def _register_convert(actions: argparse._SubParsersAction) -> None:
    convert = actions.add_parser(
        "convert",
        help="convert rules to a SIEM query language through an installed pySigma backend",
    )
    _add_paths(convert)
    convert.add_argument(
        "-t",
        "--target",
        required=True,
        help="pySigma backend: sqlite, splunk (pip install 'hpcsec[splunk]'), lucene, esql, "
        "eql (pip install 'hpcsec[elasticsearch]'); see `sigma list targets`",
    )
    convert.add_argument(
        "--fields",
        choices=FIELD_MAP_NAMES,
        help="field names of the SIEM's events (default: cim for splunk, ecs for the Elastic "
        "targets, hpcsec otherwise; docs/integrations.md)",
    )
    convert.add_argument(
        "-p",
        "--pipeline",
        action="append",
        default=[],
        metavar="PIPELINE",
        help="extra pySigma pipeline: installed name or YAML file (repeatable)",
    )
    convert.add_argument(
        "-f",
        "--output-format",
        default="default",
        metavar="FORMAT",
        help="backend output format (default: default)",
    )
    convert.add_argument(
        "-O",
        "--backend-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="backend option (repeatable)",
    )
    convert.add_argument(
        "--config", metavar="FILE", help="site config whose thresholds and lists fill placeholders"
    )
    convert.add_argument(
        "--placeholder-expression",
        metavar="EXPR",
        help="query for placeholders without a value, with {field} and {id}, "
        'e.g. "{field} IN (SELECT value FROM {id})"',
    )
    convert.set_defaults(func=run_convert)


def _paths(args: argparse.Namespace) -> list[str] | None:
    return args.paths or None


def _text(value: Any) -> str:
    """pySigma enums (level, status) as the words rule files use."""
    if value is None:
        return ""
    return str(getattr(value, "name", value)).lower()


def rule_row(rule: LoadedRule) -> dict[str, Any]:
    header = rule.header  # all a row shows: a cached rule is listed without its pySigma object
    ctx = rule_context(header)
    return {
        "id": rule.id,
        "title": header.title,
        "level": header.level,
        "vector": rule.vector,
        "status": header.status,
        "kind": rule.kind,
        "origin": rule.origin,
        "file": f"{rule.path}:{rule.line}",
        "description": ctx["rule.description"],
        "falsepositives": ctx["rule.falsepositives"],
        "references": ctx["rule.references"],
        "response": ctx["rule.response"],
        "tags": list(header.tags),
        "techniques": ctx["rule.techniques"],
        "tactics": ctx["rule.tactics"],
    }


def compact_techniques(row: dict[str, Any]) -> str:
    """`T1496 Resource Hijacking, AML.T0034 Cost Harvesting` for a table cell."""
    return ", ".join(technique_label(t) for t in row["techniques"]) or "-"


def _listed_paths(args: argparse.Namespace) -> list[str]:
    """PATHs alone (an author's view of those files), else what scan and the agent load."""
    if args.paths:
        if args.rules or args.no_default_rules or args.config:
            raise UsageError(
                f"rules {args.rules_action}: give PATH, or --config/--rules/--no-default-rules"
            )
        return list(args.paths)
    if args.config is None:  # the bundled rules and --rules: no config parser to import
        return rule_paths_for(None, args.rules, default_rules=not args.no_default_rules)
    from hpcsec.detector.config.site import load_config  # a config given: its parser

    config = load_config(args.config)
    return rule_paths_for(config, args.rules, default_rules=not args.no_default_rules)


def run_list(args: argparse.Namespace) -> int:
    ruleset = load_rules(_listed_paths(args), with_tests=False, cache=rulecache.default_dir())
    rows = [rule_row(r) for r in ruleset.rules]
    if args.format == "json":
        import orjson  # here, not at the top: its import is a tenth of a table listing's time

        sys.stdout.write(orjson.dumps(rows, option=orjson.OPT_INDENT_2).decode() + "\n")
        return EXIT_OK
    columns = ("id", "title", "level", "vector", "status", "origin", "file", "techniques")
    # titles and paths come from rule files, which may be a contributor's: shown, not obeyed
    shown = [
        {c: visible(compact_techniques(row) if c == "techniques" else row[c]) for c in columns}
        for row in rows
    ]
    widths = {c: max([len(c), *(len(row[c]) for row in shown)]) for c in columns}
    for row in [{c: c.upper() for c in columns}, *shown]:
        print("  ".join(row[c].ljust(widths[c]) for c in columns).rstrip())
    return EXIT_OK


def run_show(args: argparse.Namespace) -> int:
    from hpcsec.detector.cli.rulecard import find_rule, render_card

    ruleset = load_rules(_listed_paths(args))
    print(render_card(ruleset, find_rule(ruleset, args.rule)))
    return EXIT_OK


def run_check(args: argparse.Namespace) -> int:
    from hpcsec.detector.engine.lint import ERROR, WARNING, check_paths

    findings = check_paths(_paths(args))
    for finding in findings:
        print(visible(finding))
    errors = sum(f.severity == ERROR for f in findings)
    warnings = sum(f.severity == WARNING for f in findings)
    print(f"{errors} error(s), {warnings} warning(s)", file=sys.stderr)
    return EXIT_USAGE if errors or (args.strict and warnings) else EXIT_OK


def run_test(args: argparse.Namespace) -> int:
    from hpcsec.detector.config.site import load_config
    from hpcsec.detector.engine.ruletests import coverage_gaps, run_tests

    ruleset = load_rules(_paths(args))
    placeholders = load_config(args.config).placeholders()
    passed, failures = run_tests(ruleset, placeholders)
    gaps = coverage_gaps(ruleset)
    for failure in failures:
        print(f"FAIL {visible(failure)}")
    for rule, gap in gaps:
        where = visible(f"{rule.path}:{rule.line}: rule {rule.id} ({rule.title}) {gap}")
        print(f"FAIL {where}")
    untested = len({id(rule) for rule, _ in gaps})
    print(
        f"{passed} passed, {len(failures)} failed, {untested} rule(s) missing test events",
        file=sys.stderr,
    )
    return EXIT_FAILED if failures or gaps else EXIT_OK


def _backend_options(pairs: list[str]) -> dict[str, str]:
    options = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"backend option {pair!r} is not KEY=VALUE")
        options[key] = value
    return options


def run_convert(args: argparse.Namespace) -> int:
    from hpcsec.detector.config.site import load_config
    from hpcsec.detector.engine.convert import convert_ruleset

    config = load_config(args.config)
    ruleset = load_rules(_paths(args), with_tests=False, threshold_values=config.thresholds)
    conversion = convert_ruleset(
        ruleset,
        args.target,
        pipelines=args.pipeline,
        placeholders=config.placeholders(),
        backend_options=_backend_options(args.backend_option),
        output_format=args.output_format,
        placeholder_expression=args.placeholder_expression,
        fields=args.fields,
    )
    # like sigma-cli's --skip-unsupported: what the backend cannot express is named, one
    # line per rule, and the rest is converted
    for skipped in conversion.skipped:
        print(f"hpcsec: warning: {visible(skipped)}", file=sys.stderr)
    import orjson  # see run_list

    for query in conversion.queries:
        print(query if isinstance(query, str) else orjson.dumps(query).decode())
    if conversion.skipped:
        print(f"{len(conversion.skipped)} rule(s) not converted to {args.target}", file=sys.stderr)
    return EXIT_OK if conversion.queries else EXIT_FAILED

"""`hpcsec rules show ID|TITLE`: one rule's card, everything an analyst reads before acting."""

from __future__ import annotations

import textwrap
from typing import Any

import yaml

from hpcsec.detector.core.display import visible
from hpcsec.detector.core.errors import UsageError
from hpcsec.detector.engine.context import rule_context, technique_label
from hpcsec.detector.engine.ruleset import LoadedRule, RuleSet

WIDTH = 96


def find_rule(ruleset: RuleSet, ref: str) -> LoadedRule:
    """A rule by exact id, exact title, or a case-insensitive part of one title; a part that
    names several rules is an error that lists them."""
    wanted = ref.strip().lower()
    rules = [r for r in ruleset.rules if r.kind != "filter"]
    for rule in rules:
        if rule.id.lower() == wanted or str(rule.sigma.title).lower() == wanted:
            return rule
    hits = [r for r in rules if wanted and wanted in str(r.sigma.title).lower()]
    if len(hits) == 1:
        return hits[0]
    if not hits:
        raise UsageError(f"no rule with id or title {ref!r} (see `hpcsec rules list`)")
    names = "; ".join(f"{r.id} ({r.sigma.title})" for r in hits[:10])
    raise UsageError(f"{ref!r} names {len(hits)} rules: {names}")


def _text(value: Any) -> str:
    if value is None:
        return ""
    return str(getattr(value, "name", value)).lower()


def _wrapped(text: str, indent: str = "  ") -> list[str]:
    """Each line of `text` wrapped at WIDTH (a description's lines are its paragraphs)."""
    out = []
    for paragraph in str(text).strip().splitlines():
        out += textwrap.wrap(paragraph, WIDTH, initial_indent=indent, subsequent_indent=indent)
    return out or [indent]


def _logic(rule: LoadedRule) -> tuple[str, str]:
    """The rule's detection (or correlation) as YAML, with thresholds applied."""
    doc = rule.sigma.to_dict()
    for key in ("detection", "correlation", "filter"):
        if key in doc:
            text = yaml.safe_dump(
                {key: doc[key]}, sort_keys=False, default_flow_style=False, allow_unicode=True
            )
            return key, text
    return "detection", ""


def test_event_count(ruleset: RuleSet, rule: LoadedRule) -> int:
    count = 0
    for test in ruleset.tests:
        if test.rule_id == rule.id or test.rule_id == getattr(rule.sigma, "name", None):
            count += len(test.match) + len(test.nomatch)
            count += sum(len(seq.events) for seq in test.sequences)
    return count


def card_lines(ruleset: RuleSet, rule: LoadedRule) -> list[str]:
    sigma = rule.sigma
    ctx = rule_context(sigma)
    lines = [
        f"{sigma.title}",
        f"  id: {rule.id}",
        f"  level: {_text(getattr(sigma, 'level', None)) or '-'}   vector: {rule.vector}   "
        f"status: {_text(getattr(sigma, 'status', None)) or '-'}   kind: {rule.kind}",
        f"  file: {rule.path}:{rule.line}",
        "",
        "description:",
        *_wrapped(ctx["rule.description"] or "-"),
        "",
        "techniques:",
    ]
    lines += [f"  {technique_label(t)}" for t in ctx["rule.techniques"]] or ["  -"]
    if ctx["rule.tactics"]:
        lines += ["tactics:", "  " + ", ".join(technique_label(t) for t in ctx["rule.tactics"])]
    lines += ["", "false positives:"]
    lines += [f"  - {fp}" for fp in ctx["rule.falsepositives"]] or ["  -"]
    lines += ["", "references:"]
    lines += [f"  - {ref}" for ref in ctx["rule.references"]] or ["  -"]
    lines += ["", "response:", *_wrapped(ctx["rule.response"] or "-"), ""]
    _, logic = _logic(rule)
    lines += logic.rstrip("\n").splitlines()
    lines += ["", f"test events: {test_event_count(ruleset, rule)}"]
    return lines


def render_card(ruleset: RuleSet, rule: LoadedRule) -> str:
    # every value comes from a rule file, which may be a contributor's: shown, not obeyed
    return "\n".join(visible(line) for line in card_lines(ruleset, rule))

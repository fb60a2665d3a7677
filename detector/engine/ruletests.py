"""Rule test events: reading rules/tests/<vector>.yml and running them through the engine.

The format is in docs/rule-authoring.md. In short, a tests file is a list of entries:

    - rule: <rule id or name>
      match: [{event}, ...]      # each event alone must fire the rule
      nomatch: [{event}, ...]    # no event alone may fire it
    - rule: <correlation id or name>
      expect: match              # or nomatch
      events: [{event}, ...]     # fed in order to one fresh engine

plus, optionally, a document `placeholders: {name: [values]}` for the rules' `|expand` values.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from hpcsec.detector.core.errors import HpcsecError, RuleError, location
from hpcsec.detector.core.schema import rfc3339
from hpcsec.detector.core.yamlsrc import YamlDocument, load_documents
from hpcsec.detector.engine.ruleset import EventSequence, LoadedRule, RuleSet, RuleTest

# `.yaml`, not `.yml`: Sigma tools read every *.yml below a directory as rules.
TEST_SUFFIXES = (".yaml", ".yml")
ENTRY_KEYS = ("rule", "description", "match", "nomatch", "events", "expect")
Key = tuple[str | int, ...]


def tests_file_for(rule_file: Path) -> Path | None:
    for suffix in TEST_SUFFIXES:
        candidate = rule_file.parent / "tests" / (rule_file.stem + suffix)
        if candidate.is_file():
            return candidate
    return None


def _scalar(value: Any) -> Any:
    # YAML reads an unquoted 2026-11-30T01:00:00Z as a datetime; events carry RFC 3339 text.
    if isinstance(value, datetime):
        return rfc3339(value if value.tzinfo else value.replace(tzinfo=UTC))
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, list):
        return [_scalar(v) for v in value]
    return value


def flat_event(value: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Events are flat dicts with dotted names; a nested mapping is read as those names."""
    out: dict[str, Any] = {}
    for key, item in value.items():
        name = f"{prefix}{key}"
        if isinstance(item, dict):
            out.update(flat_event(item, f"{name}."))
        else:
            out[name] = _scalar(item)
    return out


class _EntryReader:
    def __init__(self, doc: YamlDocument, at: Key, ruleset: RuleSet):
        self.doc, self.at, self.ruleset = doc, at, ruleset

    def fail(self, message: str, *keys: str | int) -> RuleError:
        return RuleError(message, location(self.doc.path, self.doc.line_of(*self.at, *keys)))

    def events(self, value: Any, key: str, rule: LoadedRule) -> tuple[list[dict], list[int]]:
        if isinstance(value, dict):
            value, lines = [value], [self.doc.line_of(*self.at, key)]
        elif isinstance(value, list):
            lines = [self.doc.line_of(*self.at, key, i) for i in range(len(value))]
        else:
            raise self.fail(f"{key} must be a list of events (mappings)", key)
        events = []
        for i, event in enumerate(value):
            if not isinstance(event, dict):
                raise self.fail(f"{key}[{i}] must be an event (a mapping of field: value)", key, i)
            event = flat_event(event)
            category = getattr(getattr(rule.sigma, "logsource", None), "category", None)
            if rule.kind == "detection" and category and "event.category" not in event:
                event["event.category"] = category  # the rule's own category, to save typing
            elif "event.category" not in event:  # it could reach no rule: a test that cannot fail
                raise self.fail(
                    f"{key}[{i}] needs event.category: a correlation's events reach "
                    "the rules whose logsource category they have",
                    key,
                    i,
                )
            events.append(event)
        return events, lines

    def read(self, entry: Any, placeholders: dict[str, list[Any]]) -> RuleTest:
        if not isinstance(entry, dict):
            raise self.fail("a test entry must be a mapping with `rule:` and test events")
        for key in entry:
            if key not in ENTRY_KEYS:
                raise self.fail(
                    f"unknown key {key!r} (expected one of: {', '.join(ENTRY_KEYS)})", key
                )
        ref = entry.get("rule")
        if not isinstance(ref, str) or not ref:
            raise self.fail("a test entry needs `rule:` (the id or name of a rule)")
        rule = self.ruleset.find(ref)
        if rule is None:
            raise self.fail(f"test names unknown rule {ref!r}", "rule")
        if rule.kind == "filter":
            raise self.fail(f"{ref!r} is a filter: test the rules it applies to", "rule")
        line = self.doc.line_of(*self.at)
        if "events" in entry or "expect" in entry:
            if "match" in entry or "nomatch" in entry:
                raise self.fail("use either match/nomatch or events with expect, not both")
            expect = entry.get("expect")
            if expect not in ("match", "nomatch"):
                raise self.fail("expect must be match or nomatch", "expect")
            events, _ = self.events(entry.get("events"), "events", rule)
            if not events:
                raise self.fail("events is empty", "events")
            sequence = EventSequence(
                tuple(events), expect == "match", self.doc.line_of(*self.at, "events")
            )
            return RuleTest(
                rule.id,
                (),
                (),
                self.doc.path,
                line,
                sequences=(sequence,),
                placeholders=placeholders,
            )
        if "match" not in entry and "nomatch" not in entry:
            raise self.fail("a test entry needs match and/or nomatch events")
        match, match_lines = self.events(entry.get("match", []), "match", rule)
        nomatch, nomatch_lines = self.events(entry.get("nomatch", []), "nomatch", rule)
        return RuleTest(
            rule.id,
            tuple(match),
            tuple(nomatch),
            self.doc.path,
            line,
            tuple(match_lines),
            tuple(nomatch_lines),
            placeholders=placeholders,
        )


def _placeholders(doc: YamlDocument) -> dict[str, list[Any]]:
    values = doc.data["placeholders"]
    if not isinstance(values, dict):
        raise RuleError(
            "placeholders must map names to lists of values",
            location(doc.path, doc.line_of("placeholders")),
        )
    return {
        str(k): [_scalar(x) for x in (v if isinstance(v, list) else [v])] for k, v in values.items()
    }


def load_tests(path: Path, ruleset: RuleSet) -> list[RuleTest]:
    """The tests of one tests file; RuleError (with file and line) for anything malformed."""
    docs = [d for d in load_documents(path) if d.data is not None]
    placeholders: dict[str, list[Any]] = {}
    entries: list[tuple[YamlDocument, Key, Any]] = []
    for doc in docs:
        if isinstance(doc.data, dict) and set(doc.data) == {"placeholders"}:
            placeholders.update(_placeholders(doc))
        elif isinstance(doc.data, list):
            entries += [(doc, (i,), entry) for i, entry in enumerate(doc.data)]
        else:
            entries.append((doc, (), doc.data))
    return [_EntryReader(doc, at, ruleset).read(entry, placeholders) for doc, at, entry in entries]


def load_tests_for(rule_file: Path, ruleset: RuleSet) -> None:
    """Add the tests of `rule_file`'s sibling tests file, if any, to `ruleset`."""
    path = tests_file_for(rule_file)
    if path is None:
        return
    try:
        ruleset.tests.extend(load_tests(path, ruleset))
    except HpcsecError as exc:
        ruleset.errors.append(RuleError(exc.message, exc.location))
    except RecursionError:  # PyYAML composes nested collections recursively
        ruleset.errors.append(RuleError("YAML is nested too deeply", location(path)))


def coverage_gaps(ruleset: RuleSet) -> list[tuple[LoadedRule, str]]:
    """Rules without an event that must fire them or one that must not: (rule, what is missing).

    Filters are tested through the rules they apply to, so they need no tests of their own.
    """
    gaps = []
    for rule in ruleset.rules:
        if rule.kind == "filter":
            continue
        tests = [t for t in ruleset.tests if t.rule_id == rule.id]
        if not tests:
            gaps.append((rule, f"has no test events (tests/{rule.vector}.yaml)"))
            continue
        if not any(t.match or any(s.expect_match for s in t.sequences) for t in tests):
            gaps.append((rule, "has no test event that must fire it"))
        if not any(t.nomatch or any(not s.expect_match for s in t.sequences) for t in tests):
            gaps.append((rule, "has no test event that must not fire it"))
    return gaps


@dataclass(frozen=True)
class TestFailure:
    rule: LoadedRule
    path: str
    line: int
    events: tuple[dict[str, Any], ...]
    expected_match: bool

    def __str__(self) -> str:
        want = "should fire" if self.expected_match else "should not fire"
        shown = self.events[0] if len(self.events) == 1 else list(self.events)
        what = "event" if len(self.events) == 1 else f"sequence of {len(self.events)} events"
        return (
            f"{self.path}:{self.line}: rule {self.rule.id} ({self.rule.sigma.title}) "
            f"{want} on {what} {json.dumps(shown, separators=(',', ':'), default=str)}"
        )


def rules_for(rule: LoadedRule, ruleset: RuleSet) -> RuleSet:
    """The rule under test, the rules a correlation builds on, and the filters: nothing else."""
    wanted = {id(rule.sigma)}
    pending = [rule.sigma]
    while pending:
        for ref in getattr(pending.pop(), "referenced_rules", []):
            if id(ref.rule) not in wanted:
                wanted.add(id(ref.rule))
                pending.append(ref.rule)
    return RuleSet(rules=[r for r in ruleset.rules if id(r.sigma) in wanted or r.kind == "filter"])


EngineFactory = Callable[[RuleSet, dict[str, list[Any]] | None], Any]


def run_tests(
    ruleset: RuleSet,
    placeholders: dict[str, list[Any]] | None = None,
    engine_factory: EngineFactory | None = None,
) -> tuple[int, list[TestFailure]]:
    """Run every test case through a fresh engine; (cases passed, failures)."""
    if engine_factory is None:
        from hpcsec.detector.engine.evaluate import Engine

        engine_factory = Engine
    by_id = ruleset.by_id()
    passed, failures = 0, []
    for test in ruleset.tests:
        rule = by_id[test.rule_id]
        subset = rules_for(rule, ruleset)
        values = {**(placeholders or {}), **test.placeholders}
        # a RuleTest built in code may carry no event lines: the entry's line stands in
        match_lines = test.match_lines or (test.line,) * len(test.match)
        nomatch_lines = test.nomatch_lines or (test.line,) * len(test.nomatch)
        cases: Iterable[tuple[tuple[dict, ...], bool, int]] = [
            *(((e,), True, ln) for e, ln in zip(test.match, match_lines, strict=True)),
            *(((e,), False, ln) for e, ln in zip(test.nomatch, nomatch_lines, strict=True)),
            *((s.events, s.expect_match, s.line) for s in test.sequences),
        ]
        for events, expect, line in cases:
            engine = engine_factory(subset, values)
            matches = engine.evaluate([dict(e) for e in events])
            flush = getattr(engine, "flush", None)  # end of input closes correlation windows
            if flush is not None:
                matches += flush()
            fired = any(m.rule.id == rule.id for m in matches)
            if fired == expect:
                passed += 1
            else:
                failures.append(TestFailure(rule, test.path, line, events, expect))
    return passed, failures

"""Wildcard and `|re` values match in time linear in the event value (issue 12): wildcards by
wildcard.Glob, never a backtracking regex; regexes on RE2, whose unsupported syntax is a load
error. Work is bounded by counting string operations, never by a clock."""

from __future__ import annotations

import random
import re
from typing import Any

import pytest
from sigma.collection import SigmaCollection
from sigma.types import SigmaString, SpecialChars

from hpcsec.detector.core.errors import RuleError
from hpcsec.detector.engine.evaluate import Engine
from hpcsec.detector.engine.lint import check_paths
from hpcsec.detector.engine.loader import load_rules
from hpcsec.detector.engine.ruleset import LoadedRule, RuleSet
from hpcsec.detector.engine.wildcard import Glob

HEADER = """title: t
id: 6f1b2a0e-0000-4000-8000-000000000001
logsource: {product: hpc, category: process}
level: high
detection:
"""
LIMIT = 64 * 1024  # command lines are read up to 64 KiB


class CountingText(str):
    """A string that counts the searches made on it."""

    calls = 0

    def find(self, *args: Any) -> int:  # type: ignore[override]
        CountingText.calls += 1
        return super().find(*args)

    def startswith(self, *args: Any) -> bool:  # type: ignore[override]
        CountingText.calls += 1
        return super().startswith(*args)


def glob(value: str) -> Glob:
    return Glob(SigmaString(value).s)


def searches(pattern: Glob, text: str) -> tuple[bool, int]:
    CountingText.calls = 0
    return pattern.matches(CountingText(text)), CountingText.calls


def reference(value: str) -> re.Pattern[str]:
    """What the engine used to do: the wildcards as a regex (correct, but it backtracks)."""
    parts = SigmaString(value).s
    return re.compile(
        "".join(
            re.escape(p)
            if isinstance(p, str)
            else (".*" if p is SpecialChars.WILDCARD_MULTI else ".")
            for p in parts
        ),
        re.DOTALL,
    )


def test_glob_agrees_with_the_regex_it_replaces():
    rng = random.Random(12)
    alphabet = "ab/."
    for _ in range(3000):
        value = "".join(rng.choice(alphabet + "*?") for _ in range(rng.randint(0, 7)))
        pattern, expected = glob(value), reference(value)
        for _ in range(8):
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 10)))
            assert pattern.matches(text) == (expected.fullmatch(text) is not None), (value, text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("/tmp/" + "/" * (LIMIT - 5), False),  # every `*` could stretch anywhere
        ("/tmp/a/b/" + "x.s" * ((LIMIT - 9) // 3), False),  # the suffix almost matches
        ("/" * LIMIT + ".so", False),
        ("/tmp/" + "/" * (LIMIT - 8) + ".so", True),
    ],
)
def test_pathological_wildcards_on_64k_take_a_few_searches(text, expected):
    matched, calls = searches(glob("*/tmp/*/*/*.so"), text)
    assert matched is expected
    assert calls <= 8  # one search per segment: no retry from later positions


@pytest.mark.parametrize(
    ("value", "text"),
    [("*a?a?a?b*", "a" * LIMIT), ("*a?b*", "ab" * (LIMIT // 2)), ("*?a?b?*", "ba" * (LIMIT // 2))],
)
def test_question_marks_cost_at_most_one_search_per_character(value, text):
    matched, calls = searches(glob(value), text)
    assert not matched
    assert calls <= LIMIT + 4  # candidates only move forward: no position is tried twice


def engine_for(detection: str) -> Engine:
    rules = SigmaCollection.from_yaml(HEADER + detection).rules
    return Engine(RuleSet([LoadedRule(r, "<test>", 1, "test") for r in rules]))


def fires(engine: Engine, command_line: str) -> bool:
    event = {"event.category": "process", "process.command_line": command_line}
    return bool(engine.evaluate([event]))


def test_no_backtracking_regex_is_compiled_for_wildcards():
    engine = engine_for("  sel:\n    process.command_line: '*/tmp/*/*/*.so'\n  condition: sel\n")
    function = engine._by_category["process"][0]
    namespace = function.__globals__
    assert not [v for v in namespace.values() if isinstance(v, re.Pattern)]
    assert fires(engine, "LD_PRELOAD=/TMP/x/y/evil.SO")
    assert not fires(engine, "/tmp/x/evil.so")
    assert not fires(engine, "/tmp/" + "/" * (LIMIT - 5))


def test_catastrophic_regex_runs_on_re2():
    engine = engine_for("  sel:\n    process.command_line|re: '^(\\w+\\s?)*$'\n  condition: sel\n")
    assert not fires(engine, "a" * (LIMIT - 1) + "!")
    assert fires(engine, "aaa bbb ccc")


@pytest.mark.parametrize(
    ("modifiers", "pattern", "yes", "no"),
    [
        ("|re|i", "^x[mn]rig$", "XMRig", "xmrig2"),
        ("|re|m", "^fail$", "ok\nfail\nok", "failed"),
        ("|re|s", "a.b", "a\nb", "ab"),
        ("|re", "a.b", "xa-bx", "a\nb"),
        ("|re|i|m", "^FAIL$", "ok\nfail", "failure"),
    ],
)
def test_regex_flags_on_re2(modifiers, pattern, yes, no):
    engine = engine_for(
        f"  sel:\n    process.command_line{modifiers}: '{pattern}'\n  condition: sel\n"
    )
    assert fires(engine, yes)
    assert not fires(engine, no)


@pytest.mark.parametrize(
    ("pattern", "reason"),
    [
        ("(a)\\1", "invalid escape sequence"),
        ("foo(?=bar)", "invalid perl operator: (?="),
        ("(?<!x)y", "invalid perl operator: (?<!"),
    ],
)
def test_regex_re2_cannot_run_is_a_load_error_at_its_line(tmp_path, pattern, reason):
    path = tmp_path / "bad.yml"
    path.write_text(
        HEADER
        + "  sel:\n    process.name: x\n  other:\n    process.command_line|re:\n"
        + f"      - 'fine'\n      - '{pattern}'\n  condition: sel or other\n"
    )
    with pytest.raises(RuleError) as raised:
        load_rules([path], with_tests=False)
    message = str(raised.value)
    assert f"{path}:11" in message
    assert reason in message and "not loaded" in message
    findings = [f for f in check_paths([path]) if f.severity == "error"]
    assert [(f.line, f.code) for f in findings] == [(11, "load")]
    assert "RE2" in findings[0].message

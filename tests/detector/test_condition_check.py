"""condition_check.parses_cleanly: a load skips pySigma's parse of a condition only where that
parse cannot fail, so every condition error is still found and reported at its line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sigma.conditions import SigmaCondition
from sigma.rule import SigmaRule

from hpcsec.detector.engine.condition_check import parses_cleanly
from hpcsec.detector.engine.loader import bundled_rules_dir, load_rules

SIGMAHQ = Path(__file__).resolve().parent.parent / "data" / "sigmahq"

# (detections, condition) that pySigma parses
GOOD: list[tuple[dict[str, Any], Any]] = [
    ({"sel": {"a": "x"}, "other": {"b": "y"}}, "sel and not other"),
    ({"sel_1": {"a": "x"}, "sel_2": {"b": "y"}}, "1 of sel_* and all of them"),
    ({"_sel": {"a": "x"}}, "1 of _*"),
    ({"a": {"a": "x"}, "b": {"b": "x"}}, "((a) and (not (b)))"),
    ({"kw": None, "sel": {"a": "x"}}, "kw or sel"),
    ({"sel": {"a": None}}, "sel"),
    ({"a": {"a": "x"}, "b": {"b": []}}, "a"),  # the keyword list with no value is not used
    ({"kw": ["x", "y"]}, "kw"),
]
# (detections, condition) whose parse fails, and what pySigma says
BAD: list[tuple[dict[str, Any], Any, str]] = [
    ({"sel": {"a": "x"}}, "sel and nope", "Detection 'nope' not defined"),
    ({"sel": {"a": "x"}}, "sel | count() > 5", "pipe syntax"),
    ({"sel": {"a": "x"}}, "sel and", "Expected"),
    ({"a": {"a": "x"}}, "a and b-c", "Detection 'b-c' not defined"),
    ({"kw": [], "sel": {"a": "x"}}, "kw or sel", "Null value must be bound to a field"),
    ({"a": {"a": "x"}}, 5, "not iterable"),
]


def conditions_of(detections: dict[str, Any], condition: Any) -> list[SigmaCondition]:
    document = {
        "title": "t",
        "logsource": {"category": "process"},
        "detection": {**detections, "condition": condition},
    }
    rule = SigmaRule.from_dict(document, collect_errors=True)
    assert not rule.errors
    return list(rule.detection.parsed_condition)


@pytest.mark.parametrize(("detections", "condition"), GOOD)
def test_a_condition_that_parses_is_known_to(detections: dict[str, Any], condition: Any) -> None:
    for one in conditions_of(detections, condition):
        assert parses_cleanly(one)
        one.parse()


@pytest.mark.parametrize(("detections", "condition", "error"), BAD)
def test_a_condition_that_fails_is_left_to_pysigma(
    detections: dict[str, Any], condition: Any, error: str
) -> None:
    for one in conditions_of(detections, condition):
        assert not parses_cleanly(one)
        with pytest.raises(Exception, match=error):
            one.parse()


def test_a_selector_naming_no_detection_is_left_to_pysigma() -> None:
    # pySigma parses it (to nothing); the check does not follow it that far
    (one,) = conditions_of({"sel": {"a": "x"}}, "1 of filter_*")
    assert not parses_cleanly(one)
    one.parse()


def test_real_rules_conditions_are_known_without_a_parse() -> None:
    """Every condition of the bundled rules and the SigmaHQ samples is known to parse (so a
    load skips pySigma's parse for them), and pySigma agrees."""
    rules = load_rules([bundled_rules_dir(), SIGMAHQ], with_tests=False).rules
    conditions = [
        condition
        for rule in rules
        if isinstance(rule.sigma, SigmaRule)
        for condition in rule.sigma.detection.parsed_condition
    ]
    assert len(conditions) > 50
    for condition in conditions:
        assert parses_cleanly(condition), condition.condition
        condition.parse()


def test_a_load_does_not_parse_a_clean_condition(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    parsed: list[str] = []
    real = SigmaCondition.parse

    def counted(self: SigmaCondition, postprocess: bool = True) -> Any:
        parsed.append(self.condition)
        return real(self, postprocess)

    monkeypatch.setattr(SigmaCondition, "parse", counted)
    (tmp_path / "ok.yml").write_text(
        "title: ok\nlogsource: {category: process}\n"
        "detection:\n  sel: {a: x}\n  other: {b: y}\n  condition: sel and not other\n"
    )
    (tmp_path / "bad.yml").write_text(
        "title: bad\nlogsource: {category: process}\n"
        "detection:\n  sel: {a: x}\n  condition: sel and nope\n"
    )
    ruleset = load_rules([tmp_path], with_tests=False, collect_errors=True)
    assert parsed == ["sel and nope"]
    assert [rule.title for rule in ruleset.rules] == ["ok"]
    (error,) = ruleset.errors
    assert "Detection 'nope' not defined" in error.message
    assert error.location is not None
    assert (Path(error.location.path).name, error.location.line) == ("bad.yml", 5)


@pytest.mark.parametrize(
    "condition",
    ["not " * 170 + "sel", "not " * 200 + "sel", "(sel and " * 200 + "sel" + ")" * 200],
)
def test_a_condition_nested_past_pysigmas_recursion_is_left_to_it(
    condition: str, tmp_path: Path
) -> None:
    """pySigma's parse recurses; the check does not: a tree that deep is not vouched for, and
    the load reports it at the condition's line as before."""
    (one,) = conditions_of({"sel": {"a": "x"}}, condition)
    assert not parses_cleanly(one)
    with pytest.raises(RecursionError):
        one.parse()
    (tmp_path / "deep.yml").write_text(
        "title: deep\nlogsource: {category: process}\n"
        f"detection:\n  sel: {{a: x}}\n  condition: {condition}\n"
    )
    ruleset = load_rules([tmp_path], with_tests=False, collect_errors=True)
    assert ruleset.rules == []
    (error,) = ruleset.errors
    assert error.message == "condition is nested too deeply"
    assert error.location is not None and error.location.line == 5

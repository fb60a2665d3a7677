"""Rules that pySigma takes but that cannot work as written are refused at load, at their
line, alike in every command (`rules check`, `scan`, `rules convert`), with and without the
rule cache: before, some crashed every command, passed `rules check` and failed `scan`, or
converted into a query that means something else."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcsec.detector.cli.main import main
from hpcsec.detector.engine.evaluate import Engine
from hpcsec.detector.engine.loader import load_rules

HEAD = "title: {name}\nname: {name}\nid: {uid}\nstatus: experimental\nlevel: high\n"
PROCESS = "logsource: {product: hpc, category: process}\n"


def rule(name: str, n: int, body: str) -> str:
    return HEAD.format(name=name, uid=f"00000000-0000-4000-8000-{n:012d}") + body


def correlation(name: str, n: int, refers: str) -> str:
    return rule(
        name,
        n,
        f"correlation:\n  type: event_count\n  rules: {refers}\n  group-by: [host.name]\n"
        "  timespan: 1m\n  condition: {gte: 3}\n",
    )


def errors_of(tmp_path: Path, text: str, cache: bool = False) -> list[tuple[int | None, str]]:
    path = tmp_path / "r.yml"
    path.write_text(text)
    ruleset = load_rules(
        [path], collect_errors=True, with_tests=False, cache=tmp_path / "c" if cache else None
    )
    return [(e.location.line if e.location else None, e.message) for e in ruleset.errors]


@pytest.mark.parametrize(
    ("value", "kind"), [("5", "a number"), ("true", "true/false"), ("null", "null")]
)
def test_a_regex_that_is_not_text_is_an_error_at_its_line(tmp_path, value, kind):
    # `|re: 5` crashed every command (AttributeError in the RE2 check)
    body = PROCESS + f"detection:\n  sel:\n    process.pid|re: {value}\n  condition: sel\n"
    assert errors_of(tmp_path, rule("r", 1, body)) == [
        (
            9,
            f"process.pid|re: |re needs a regular expression (text), not {kind}; "
            "the rule is not loaded",
        )
    ]


def test_each_regex_of_a_list_that_is_not_text_is_an_error_at_its_line(tmp_path):
    body = (
        PROCESS
        + "detection:\n  sel:\n    process.name|re:\n      - a.*\n      - [1, a]\n      - 7\n"
        "  condition: sel\n"
    )
    assert [line for line, _ in errors_of(tmp_path, rule("r", 1, body))] == [11, 12]


EMPTY = "detection 'selection' is empty: give it field: value pairs or a list of values"
EMPTY_MAPPING = "detection 'selection' lists an empty mapping: give it field: value pairs"


@pytest.mark.parametrize(
    ("definition", "expected"),
    [
        ("", (8, EMPTY)),
        (" []", (8, EMPTY)),
        (" {}", (8, EMPTY)),
        ("\n    - process.name: a\n    - {}", (10, EMPTY_MAPPING)),
    ],
)
@pytest.mark.parametrize("cache", [False, True])
def test_an_empty_detection_is_an_error_at_its_line(tmp_path, definition, expected, cache):
    # `selection:` alone passed `rules check` and then stopped `scan` (SigmaNull, at line 1);
    # `selection: {}` was pySigma's "Detection is empty" at the `detection:` line (7)
    body = PROCESS + f"detection:\n  selection:{definition}\n  condition: selection\n"
    for _ in range(2 if cache else 1):  # with the cache: written, then read
        assert expected in errors_of(tmp_path, rule("r", 1, body), cache)


def test_an_empty_mapping_is_said_at_its_line_with_the_rule_s_other_errors(tmp_path):
    # the error pySigma collects for `{}` named the `filter:` (or `detection:`) line, and
    # came with the rule's other errors, which must still be said
    text = rule(
        "f",
        1,
        PROCESS + "filter:\n  rules: [r]\n  selection: {}\n  bad:\n    user.name|nosuch: x\n"
        "  condition: not selection and not bad\n",
    )
    assert errors_of(tmp_path, text) == [
        (11, "user.name|nosuch: Unknown modifier 'nosuch'"),
        (9, EMPTY),
    ]


def test_rules_check_names_the_line_of_an_empty_mapping_and_exits_2(tmp_path, capsys):
    path = tmp_path / "r.yml"
    path.write_text(rule("r", 1, PROCESS + "detection:\n  selection: {}\n  condition: selection\n"))
    assert main(["rules", "check", str(path)]) == 2
    captured = capsys.readouterr()
    said = captured.err + captured.out
    assert f"{path}:8: error: {EMPTY}" in said
    assert "Detection is empty" not in said and "Traceback" not in said


def test_a_null_keyword_is_an_error_at_its_line(tmp_path):
    body = PROCESS + "detection:\n  keywords: [a, null]\n  condition: keywords\n"
    assert errors_of(tmp_path, rule("r", 1, body)) == [
        (8, "detection 'keywords' lists null: a value without a field cannot be null")
    ]


def test_a_null_field_value_is_still_a_test_that_the_field_is_null(tmp_path):
    body = (
        PROCESS + "detection:\n  sel:\n    - process.name: null\n    - process.args: [null]\n"
        "  condition: sel\n"
    )
    assert errors_of(tmp_path, rule("r", 1, body)) == []


def test_a_correlation_of_no_rules_is_an_error_at_its_rules(tmp_path):
    assert errors_of(tmp_path, correlation("c", 1, "[]")) == [
        (8, "correlation names no rules: list the rules it correlates")
    ]


def test_a_lone_surrogate_escape_is_an_error_at_its_line(tmp_path):
    # `rules convert` crashed printing it (no UTF-8 output carries one); no event holds one
    body = PROCESS + 'detection:\n  sel:\n    process.name: "xm\\ud800rig"\n  condition: sel\n'
    assert errors_of(tmp_path, rule("r", 1, body)) == [
        (9, "YAML text holds a lone surrogate (\\ud800), which is not Unicode text")
    ]


CYCLE = (
    correlation("ca", 1, "[cb]")
    + "---\n"
    + correlation("cb", 2, "[ca]")
    + "---\n"
    + correlation("self", 3, "[self]")
    + "---\n"
    + rule("miner", 4, PROCESS + "detection:\n  sel:\n    process.name: xmrig\n  condition: sel\n")
    + "---\n"
    + correlation("fine", 5, "[miner]")
)


@pytest.mark.parametrize("cache", [False, True])
def test_a_correlation_that_refers_to_itself_is_an_error_at_its_rules(tmp_path, cache):
    # `rules check` passed such a set, `scan` refused it, `rules convert` recursed to a crash
    for _ in range(2 if cache else 1):  # with the cache: written, then read
        found = errors_of(tmp_path, CYCLE, cache)
        assert found == [
            (
                8,
                "rule 00000000-0000-4000-8000-000000000001: correlation refers to itself "
                "through its rules (ca -> cb -> ca): it would count its own alerts",
            ),
            (
                20,
                "rule 00000000-0000-4000-8000-000000000002: correlation refers to itself "
                "through its rules (cb -> ca -> cb): it would count its own alerts",
            ),
            (
                32,
                "rule 00000000-0000-4000-8000-000000000003: correlation refers to itself "
                "through its rules (self -> self): it would count its own alerts",
            ),
        ]
    ruleset = load_rules([tmp_path / "r.yml"], collect_errors=True, with_tests=False)
    assert [r.name for r in ruleset.rules] == ["miner", "fine"]


SEL = "detection:\n  sel:\n    process.name: xmrig\n  condition: sel\n"


@pytest.mark.parametrize("itself", ["[selfpos]", "[2]"])
@pytest.mark.parametrize("cache", [False, True])
def test_a_self_reference_after_a_dropped_correlation_is_said_as_one(tmp_path, cache, itself):
    # by position, the correlation named itself as the set was checked (before `gone` was
    # dropped): the cycle check counted without `gone`, found another rule (or none) there,
    # kept it, and the engine then refused the whole set ("unknown rule '2'")
    text = "---\n".join(
        [
            rule("miner", 4, PROCESS + SEL),
            correlation("gone", 1, "[nope]"),
            correlation("selfpos", 2, itself),
            correlation("fine", 3, "[miner]"),
        ]
    )
    for _ in range(2 if cache else 1):  # with the cache: written, then read
        assert errors_of(tmp_path, text, cache) == [
            (19, "correlation names unknown rule 'nope'"),
            (
                31,
                "rule 00000000-0000-4000-8000-000000000002: correlation refers to itself "
                "through its rules (selfpos -> selfpos): it would count its own alerts",
            ),
        ]
    ruleset = load_rules([tmp_path / "r.yml"], collect_errors=True, with_tests=False)
    assert [r.name for r in ruleset.rules] == ["miner", "fine"]
    assert len(Engine(ruleset).correlations) == 1


@pytest.mark.parametrize("command", [["rules", "check"], ["rules", "convert", "-t", "sqlite"]])
def test_every_command_refuses_a_correlation_cycle_with_exit_2(tmp_path, capsys, command):
    path = tmp_path / "r.yml"
    path.write_text(CYCLE)
    assert main([*command, str(path)]) == 2
    captured = capsys.readouterr()
    said = captured.err + captured.out
    assert "correlation refers to itself through its rules (ca -> cb -> ca)" in said
    assert "internal error" not in said and "Traceback" not in said


@pytest.mark.parametrize("quantifier", ["1", "all"])
def test_a_selector_that_names_no_detection_is_an_error_at_the_condition(tmp_path, quantifier):
    # `rules check` said so (pySigma's validator) while `scan` loaded the rule, which never
    # matched, and `rules convert` dropped the selector: a query matching every process event
    body = (
        PROCESS
        + "detection:\n  selection:\n    process.name: xmrig\n  filter_a:\n    user.name: root\n"
        + f"  condition: selection and not {quantifier} of filter_* and {quantifier} of fitler_*\n"
    )
    assert errors_of(tmp_path, rule("r", 1, body)) == [
        (12, f"condition selector '{quantifier} of fitler_*' names no detection of the rule")
    ]
    path = tmp_path / "r.yml"
    assert main(["rules", "convert", "-t", "sqlite", str(path)]) == 2


def test_selectors_that_name_detections_load(tmp_path):
    body = (
        PROCESS
        + "detection:\n  sel_a:\n    process.name: a\n  sel_b:\n    process.name: b\n"
        + "  condition: 1 of sel_* and all of them\n"
    )
    assert errors_of(tmp_path, rule("r", 1, body)) == []


def test_keys_yaml_reads_as_numbers_are_errors_at_their_lines(tmp_path):
    # pySigma failed on them with "'int' object has no attribute 'split'", at line 1
    text = (
        "title: t\nname: t\nid: 12345\n"
        + PROCESS
        + "detection:\n  sel:\n    5: xmrig\n    process.name: a\n  sel2:\n    - 7: b\n"
        + "  condition: sel or sel2\n"
    )
    assert errors_of(tmp_path, text) == [
        (3, "id must be text (a UUID), not a number"),
        (7, "field name must be text, not a number (5)"),
        (10, "field name must be text, not a number (7)"),
    ]


def test_an_empty_list_of_values_is_an_error_at_its_line(tmp_path):
    # pySigma read it as a test that the field is absent, which no author means by `[]`
    body = (
        PROCESS
        + "detection:\n  sel:\n    process.name: []\n  sel2:\n    - user.name: []\n"
        + "  condition: sel or sel2\n"
    )
    message = ": an empty list of values; list one or more (null tests that the field is absent)"
    assert errors_of(tmp_path, rule("r", 1, body)) == [
        (9, "process.name" + message),
        (11, "user.name" + message),
    ]


def test_a_value_pysigma_refuses_is_named_by_its_kind_once_at_its_line(tmp_path):
    # pySigma names the value by its repr (`<sigma.types.SigmaNull object at 0x7f…>`): the
    # same error read as two (line 1 and the value's) and said nothing to the author
    body = PROCESS + "detection:\n  sel:\n    process.command_line|base64: null\n  condition: sel\n"
    assert errors_of(tmp_path, rule("r", 1, body)) == [
        (
            9,
            "process.command_line|base64: Modifier SigmaBase64Modifier incompatible to value "
            "type of 'null'",
        )
    ]


def test_what_refers_to_a_cycle_is_dropped_too_and_a_long_cycle_is_named_in_short(tmp_path):
    # a correlation on a refused one was kept and said nothing (its rule is not loaded);
    # a cycle of thousands named its whole chain in each of its thousands of errors
    docs = [correlation(f"c{i}", i, f"[c{(i + 1) % 30}]") for i in range(30)]
    docs += [correlation("outside", 99, "[c0]"), correlation("further", 98, "[outside]")]
    found = errors_of(tmp_path, "---\n".join(docs))
    assert len(found) == 32
    assert found[0][1] == (
        "rule 00000000-0000-4000-8000-000000000000: correlation refers to itself through the "
        "rules of 29 correlations that refer to it: it would count its own alerts"
    )
    assert found[-2:] == [
        (
            8 + 12 * 30,
            "rule 00000000-0000-4000-8000-000000000099: correlation refers to 'c0', "
            "which is not loaded",
        ),
        (
            8 + 12 * 31,
            "rule 00000000-0000-4000-8000-000000000098: correlation refers to "
            "'outside', which is not loaded",
        ),
    ]


@pytest.mark.parametrize(("rules", "kind"), [("[null]", "null"), ("[[x]]", "a list")])
def test_a_correlation_naming_a_rule_by_something_else_is_an_error(tmp_path, rules, kind):
    # pySigma raised AttributeError: every command without the rule cache crashed
    for cache in (False, True):
        assert errors_of(tmp_path, correlation("c", 1, rules), cache) == [
            (8, f"correlation rules are named by id or name, not {kind}")
        ]


def test_a_surrogate_pair_written_as_two_escapes_is_the_character_it_stands_for(tmp_path):
    body = PROCESS + 'detection:\n  sel:\n    process.name: "x\\ud83d\\ude00y"\n  condition: sel\n'
    path = tmp_path / "r.yml"
    path.write_text(rule("r", 1, body))
    ruleset = load_rules([path], collect_errors=True, with_tests=False)
    assert ruleset.errors == []
    detection = ruleset.rules[0].sigma.detection.detections["sel"]
    assert str(detection.detection_items[0].value[0]) == "x\U0001f600y"

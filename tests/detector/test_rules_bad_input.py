"""Malformed rule files: one error naming the file and line, exit 2, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hpcsec.detector.cli.main import main
from hpcsec.detector.core.errors import RuleError
from hpcsec.detector.engine.lint import check_paths
from hpcsec.detector.engine.loader import load_rules

BAD = Path(__file__).resolve().parents[2] / "fixtures" / "rules" / "bad"

# file (under fixtures/rules/bad), line, message
CASES = [
    ("yaml_syntax.yml", 11, "YAML syntax error: expected ',' or ']', but got ':'"),
    ("tab.yml", 10, "YAML syntax error: tab character where YAML expects spaces"),
    ("unknown_modifier.yml", 11, "process.command_line|contians: Unknown modifier 'contians'"),
    (
        "bad_regex.yml",
        12,
        "process.command_line|re: Regular expression 'stratum\\+tcp://(pool' is invalid: "
        "missing ), unterminated subpattern at position 15",
    ),
    (
        "bad_cidr.yml",
        10,
        "destination.ip|cidr: Invalid CIDR expression: '10.0.0.0/33' does not appear to be an "
        "IPv4 or IPv6 network",
    ),
    ("not_a_number.yml", 11, "file.size|gt: 'abc' is not a number"),
    ("undefined_identifier.yml", 11, "Detection 'allowlist' not defined in detections"),
    (
        "condition_syntax.yml",
        11,
        "condition syntax error in 'selection and (': unexpected end of text at column 16",
    ),
    ("missing_logsource.yml", 1, "Sigma rule must have a log source"),
    ("missing_detection.yml", 1, "Sigma rule must have a detection definitions"),
    ("unknown_correlation_rule.yml", 21, "correlation names unknown rule 'no_such_rule'"),
    ("empty.yml", 1, "no rules"),
    ("only_comments.yml", 1, "no rules"),
    ("non_utf8.yml", 10, "not UTF-8: byte 0xe9 at offset 222"),
    ("alias_bomb.yml", 3, "YAML aliases (*name) are not allowed"),
]

COLUMNS = {"yaml_syntax.yml": 12, "tab.yml": 1}  # YAML syntax errors also know the column


@pytest.mark.parametrize(("name", "line", "message"), CASES, ids=[c[0] for c in CASES])
def test_load_error_names_file_and_line(name, line, message):
    path = BAD / name
    with pytest.raises(RuleError) as caught:
        load_rules([path])
    assert caught.value.message == message
    assert caught.value.location.path == str(path)
    assert caught.value.location.line == line


@pytest.mark.parametrize(("name", "line", "message"), CASES, ids=[c[0] for c in CASES])
def test_cli_prints_one_line_and_exits_2(name, line, message, capsys):
    assert main(["rules", "list", str(BAD / name)]) == 2
    out, err = capsys.readouterr()
    column = f":{COLUMNS[name]}" if name in COLUMNS else ""
    assert out == ""
    assert err == f"hpcsec: error: {BAD / name}:{line}{column}: {message}\n"


def test_duplicate_ids_name_both_files(capsys):
    with pytest.raises(RuleError) as caught:
        load_rules([BAD / "duplicate"])
    first, second = BAD / "duplicate" / "dup_a.yml", BAD / "duplicate" / "dup_b.yml"
    assert str(caught.value) == (
        f"{second}:2: duplicate rule id 1f0e0d0c-0000-4000-8000-00000000000e (first at {first}:1)"
    )
    assert main(["rules", "list", str(BAD / "duplicate")]) == 2
    assert capsys.readouterr().err == f"hpcsec: error: {caught.value}\n"


def test_every_problem_of_every_file_in_one_run():
    findings = [f for f in check_paths([BAD]) if f.severity == "error"]
    got = {(Path(f.path).name, f.line) for f in findings}
    assert got == {(name, line) for name, line, _ in CASES} | {("dup_b.yml", 2)}
    assert all(f.code == "load" for f in findings)


def test_several_errors_in_one_rule_each_on_its_line(tmp_path):
    path = tmp_path / "many.yml"
    path.write_text(
        "title: Many problems\n"
        "id: 1f0e0d0c-0000-4000-8000-0000000000f1\n"
        "logsource: {product: hpc, category: process}\n"
        "detection:\n"
        "  selection:\n"
        "    process.name|startwith: x\n"  # 6: unknown modifier
        "    source.ip|cidr:\n"
        "      - 10.0.0.0/8\n"
        "      - 300.0.0.0/8\n"  # 9: bad CIDR
        "    file.size|lte: [1, many]\n"  # 10: not a number
        "  condition: selection\n"
    )
    ruleset = load_rules([path], collect_errors=True)
    assert [(e.location.line, e.message) for e in ruleset.errors] == [
        (6, "process.name|startwith: Unknown modifier 'startwith'"),
        (
            9,
            "source.ip|cidr: Invalid CIDR expression: '300.0.0.0/8' does not appear to be an "
            "IPv4 or IPv6 network",
        ),
        (10, "file.size|lte: 'many' is not a number"),
    ]
    assert ruleset.rules == []


def test_condition_list_error_names_its_item(tmp_path):
    path = tmp_path / "conds.yml"
    path.write_text(
        "title: Two conditions\n"
        "logsource: {product: hpc, category: process}\n"
        "detection:\n"
        "  selection:\n"
        "    process.name: x\n"
        "  condition:\n"
        "    - selection\n"
        "    - selection or\n"
    )
    with pytest.raises(RuleError) as caught:
        load_rules([path])
    assert str(caught.value) == (
        f"{path}:8: condition syntax error in 'selection or': unexpected end of text at column 13"
    )


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("- just\n- a list\n", 1, "a Sigma document must be a mapping, not a list"),
        (
            "title: x\naction: include\n",
            2,
            "unknown Sigma collection action 'include' (expected global, reset or repeat)",
        ),
        ("action: repeat\ntitle: x\n", 1, "`action: repeat` without a rule before it"),
        (
            "title: x\nlogsource: {product: hpc, category: process}\n"
            "detection: {sel: {a: x}, condition: 5}\n",
            3,
            "condition must be a string: argument of type 'int' is not iterable",
        ),
        (
            "title: x\ncorrelation:\n  type: event_cnt\n  rules: [a]\n",
            3,
            "unknown correlation type 'event_cnt' (known: event_count, value_count, temporal, "
            "temporal_ordered, value_sum, value_avg, value_percentile, value_median)",
        ),
        (
            "title: x\nlogsource:\n  product: hpc\n  category: []\n"
            "detection: {sel: {a: x}, condition: sel}\n",
            4,
            "logsource category must be one name, not a list",
        ),
        (
            "title: x\nlogsource: {product: hpc, category: process, service: {}}\n"
            "detection: {sel: {a: x}, condition: sel}\n",
            2,
            "logsource service must be one name, not a dict",
        ),
        (
            "title: x\ncorrelation:\n  type: event_count\n  rules: [a]\n  timespan: 5m\n"
            "  condition:\n    gte: 2.5\n",
            7,
            "correlation condition gte: 2.5 is not a whole number",
        ),
        (
            "title: x\ncorrelation:\n  type: value_sum\n  rules: [a]\n  timespan: 5m\n"
            "  condition: {field: file.size, lt: [1]}\n",
            6,
            "correlation condition lt: [1] is not a whole number",
        ),
        (
            "title: x\ncorrelation:\n  type: event_count\n  rules: [a]\n  timespan: 5m\n"
            "  condition: 5\n",
            6,
            "correlation condition must be a mapping such as {gte: 10}, not a number",
        ),
        (
            "title: x\ncorrelation:\n  type: event_count\n  rules: [a]\n  timespan: 5 minutes\n"
            "  condition: {gte: 2}\n",
            5,
            "Timespan '5 minutes' is invalid.",
        ),
    ],
)
def test_odd_documents(tmp_path, text, line, message):
    path = tmp_path / "odd.yml"
    path.write_text(text)
    with pytest.raises(RuleError) as caught:
        load_rules([path])
    assert (caught.value.location.line, caught.value.message) == (line, message)


def test_deeply_nested_yaml_is_an_error_not_a_crash(tmp_path):
    path = tmp_path / "deep.yml"
    depth = 20_000
    path.write_text(
        "title: deep\nlogsource: {product: hpc, category: process}\n"
        "detection:\n  sel:\n    process.name: "
        + "[" * depth
        + "x"
        + "]" * depth
        + "\n  condition: sel\n"
    )
    with pytest.raises(RuleError) as caught:
        load_rules([path])
    assert str(caught.value) == f"{path}:5: YAML nesting is too deep"


def test_missing_path(tmp_path):
    with pytest.raises(RuleError) as caught:
        load_rules([tmp_path / "nope.yml"])
    assert str(caught.value) == f"{tmp_path / 'nope.yml'}: no such file or directory"


def test_real_process_has_no_traceback():
    """The installed entry point, as a user runs it, over the whole bad directory."""
    for args in (["rules", "list", str(BAD / "bad_regex.yml")], ["rules", "check", str(BAD)]):
        done = subprocess.run(
            [sys.executable, "-m", "hpcsec.detector", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2
        assert "Traceback" not in done.stderr + done.stdout
    assert done.stderr.strip().endswith("error(s), 7 warning(s)")  # 2 missing-response
    assert done.stdout.count(": error: ") == len(CASES) + 1

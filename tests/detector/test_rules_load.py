"""Loading Sigma rule files and their test events into a RuleSet."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest
from sigma.correlations import SigmaCorrelationRule
from sigma.filters import SigmaFilter
from sigma.rule import SigmaRule

from hpcsec.detector.core.errors import RuleError
from hpcsec.detector.engine.loader import bundled_rules_dir, load_rules
from hpcsec.detector.engine.ruleset import EventSequence

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "rules"
VALID = FIXTURES / "valid"

MINER = "0b7e51a4-6d43-4a43-8f1a-6c2f3c3d8a01"
NO_JOB = "3c1f9c6e-2a7b-4b0e-9f5d-7d7f1e2a3b02"
BURN_IN = "8e2d4f10-5b6c-4d7e-8f90-a1b2c3d4e503"
REPEATED = "5f6a7b8c-9d0e-4f1a-8b2c-3d4e5f6a7b04"


def rule_text(title: str, uid: str, field: str = "process.name", value: str = "x") -> str:
    return (
        f"title: {title}\nid: {uid}\nlogsource: {{product: hpc, category: process}}\n"
        f"detection:\n  selection:\n    {field}: {value}\n  condition: selection\n"
    )


def test_valid_collection():
    ruleset = load_rules([VALID])
    assert ruleset.errors == []
    assert ruleset.files == [str(VALID / "sample.yml")]
    assert [(r.id, r.kind, r.line, r.vector) for r in ruleset.rules] == [
        (MINER, "detection", 1, "sample"),
        (NO_JOB, "detection", 26, "sample"),
        (BURN_IN, "filter", 48, "sample"),
        (REPEATED, "correlation", 65, "sample"),
    ]
    kinds = [type(r.sigma) for r in ruleset.rules]
    assert kinds == [SigmaRule, SigmaRule, SigmaFilter, SigmaCorrelationRule]
    assert all(r.path == str(VALID / "sample.yml") for r in ruleset.rules)
    # lines of keys are kept for tools that point into a rule
    assert ruleset.rules[0].line_of("detection", "selection_cmdline") == 21
    assert ruleset.rules[0].line_of("tags", 1) == 12


def test_correlation_points_at_the_rules_it_names():
    ruleset = load_rules([VALID])
    by_id = ruleset.by_id()
    refs = by_id[REPEATED].sigma.referenced_rules
    assert [ref.rule for ref in refs] == [by_id[NO_JOB].sigma]
    assert ruleset.find("gpu_process_without_job") is by_id[NO_JOB]


def test_test_events_are_loaded_with_their_lines():
    tests = load_rules([VALID]).tests
    path = str(VALID / "tests" / "sample.yaml")
    assert [(t.rule_id, t.path, t.line) for t in tests] == [
        (MINER, path, 1),
        (NO_JOB, path, 7),
        (REPEATED, path, 14),
        (REPEATED, path, 20),
    ]
    miner = tests[0]
    assert miner.match_lines == (3, 4) and miner.nomatch_lines == (6,)
    # an event without event.category gets the rule's category
    assert miner.match[0] == {
        "process.name": "xmrig",
        "user.name": "alice",
        "event.category": "gpu_process",
    }
    assert tests[1].nomatch[1]["process.is_gpu_service"] is True
    repeated = tests[2]
    assert repeated.match == () and repeated.nomatch == ()
    (sequence,) = repeated.sequences
    assert isinstance(sequence, EventSequence)
    assert sequence.expect_match is True and sequence.line == 16
    # an unquoted YAML time is read as the RFC 3339 text JSONL events carry
    assert [e["@timestamp"] for e in sequence.events] == [
        "2026-11-30T01:00:00.000Z",
        "2026-11-30T01:01:00.000Z",
        "2026-11-30T01:02:00.000Z",
    ]
    assert tests[3].sequences[0].expect_match is False


def test_bundled_rules_are_the_packaged_rules_directory():
    directory = bundled_rules_dir()
    assert (directory / "__init__.py").is_file()
    if not list(directory.glob("*.yml")):
        pytest.skip("no bundled rulesets yet")
    ruleset = load_rules(None)
    assert ruleset.rules
    assert {Path(f).parent for f in ruleset.files} == {directory}
    assert {r.vector for r in ruleset.rules} == {p.stem for p in directory.glob("*.yml")}


def test_directories_recurse_but_skip_tests_and_hidden(tmp_path):
    (tmp_path / "site" / "extra").mkdir(parents=True)
    (tmp_path / "tests").mkdir()
    (tmp_path / ".git").mkdir()
    (tmp_path / "a.yml").write_text(rule_text("A", "1f0e0d0c-0000-4000-8000-0000000000a1"))
    (tmp_path / "site" / "extra" / "b.yaml").write_text(
        rule_text("B", "1f0e0d0c-0000-4000-8000-0000000000a2")
    )
    (tmp_path / "tests" / "a.yaml").write_text("- rule: A-not-a-rule\n")
    (tmp_path / ".git" / "c.yml").write_text(": not yaml [")
    (tmp_path / "notes.txt").write_text("not a rule")
    with pytest.raises(RuleError) as caught:
        load_rules([tmp_path])
    # the tests file was read as tests (its rule reference is wrong), never as rules
    assert (
        str(caught.value) == f"{tmp_path / 'tests' / 'a.yaml'}:1: test names unknown rule "
        "'A-not-a-rule'"
    )
    (tmp_path / "tests" / "a.yaml").unlink()
    ruleset = load_rules([tmp_path])
    assert [(Path(r.path).name, r.vector) for r in ruleset.rules] == [
        ("a.yml", "a"),
        ("b.yaml", "b"),
    ]


def test_a_rule_directory_nested_deeper_than_the_recursion_limit_loads(tmp_path):
    levels = [tmp_path]
    for _ in range(sys.getrecursionlimit() + 100):  # mkdir(parents=True) recurses itself
        levels.append(levels[-1] / "d")
        levels[-1].mkdir()
    (levels[-1] / "a.yml").write_text(rule_text("A", "1f0e0d0c-0000-4000-8000-0000000000a3"))
    (tmp_path / "b.yml").write_text(rule_text("B", "1f0e0d0c-0000-4000-8000-0000000000a4"))
    try:
        ruleset = load_rules([tmp_path])
        assert sorted(Path(r.path).name for r in ruleset.rules) == ["a.yml", "b.yml"]
    finally:  # so does shutil.rmtree, which pytest would clean this up with
        (levels[-1] / "a.yml").unlink()
        for level in reversed(levels[1:]):
            level.rmdir()


def test_empty_directory(tmp_path):
    with pytest.raises(RuleError) as caught:
        load_rules([tmp_path])
    assert str(caught.value) == f"{tmp_path}: no rule files (*.yml, *.yaml) in this directory"


def test_collection_actions_merge_like_pysigma_and_keep_lines(tmp_path):
    path = tmp_path / "actions.yml"
    path.write_text(
        "action: global\n"  # 1
        "logsource: {product: hpc, category: process}\n"  # 2
        "level: high\n"  # 3
        "---\n"
        "title: First\n"  # 5
        "detection:\n"
        "  selection: {process.name: a}\n"
        "  condition: selection\n"
        "---\n"
        "action: repeat\n"  # 10
        "title: Second\n"
        "---\n"
        "action: reset\n"  # 13
        "---\n"
        "title: Third\n"  # 15
        "logsource: {product: hpc, category: gpu_process}\n"
        "detection:\n"
        "  selection: {process.name: c}\n"
        "  condition: selection\n"
    )
    ruleset = load_rules([path])
    assert [
        (
            r.sigma.title,
            r.line,
            r.sigma.level.name if r.sigma.level else None,
            r.sigma.logsource.category,
        )
        for r in ruleset.rules
    ] == [
        ("First", 5, "HIGH", "process"),
        ("Second", 10, "HIGH", "process"),
        ("Third", 15, None, "gpu_process"),
    ]
    assert ruleset.rules[0].line_of("logsource") == 2  # from the global document


def test_error_in_global_part_points_at_the_global_document(tmp_path):
    path = tmp_path / "global.yml"
    path.write_text(
        "action: global\nlogsource: {product: hpc, category: process}\n"
        "detection:\n  filter_x:\n    process.name|nomod: x\n---\n"
        "title: Uses it\ndetection:\n  selection: {process.name: a}\n"
        "  condition: selection and not filter_x\n"
    )
    with pytest.raises(RuleError) as caught:
        load_rules([path])
    assert str(caught.value) == f"{path}:5: process.name|nomod: Unknown modifier 'nomod'"


@pytest.mark.parametrize(
    ("tests_text", "line", "message"),
    [
        ("- rule: nope\n  match: [{a: b}]\n", 1, "test names unknown rule 'nope'"),
        (
            "- rule: First\n  match: [{a: b}]\n  matches: []\n",
            3,
            "unknown key 'matches' (expected one of: rule, description, match, nomatch, events, "
            "expect)",
        ),
        (
            "- rule: first_rule\n  expect: fire\n  events: [{a: b}]\n",
            2,
            "expect must be match or nomatch",
        ),
        (
            "- rule: first_rule\n  match: [{a: b}]\n  events: [{a: b}]\n  expect: match\n",
            1,
            "use either match/nomatch or events with expect, not both",
        ),
        (
            "- rule: first_rule\n  match:\n    - {a: b}\n    - just text\n",
            4,
            "match[1] must be an event (a mapping of field: value)",
        ),
        (
            "- rule: first_rule\n  description: nothing to run\n",
            1,
            "a test entry needs match and/or nomatch events",
        ),
        (
            "- rule: first_rule\n  match: [{a: b}]\n- 42\n",
            3,
            "a test entry must be a mapping with `rule:` and test events",
        ),
        (
            "- rule: first_rule_twice\n  expect: nomatch\n  events:\n"
            "    - {event.category: process, process.name: x}\n    - {process.name: x}\n",
            5,
            "events[1] needs event.category: a correlation's events reach the rules whose "
            "logsource category they have",
        ),
    ],
)
def test_malformed_tests_file(tmp_path, tests_text, line, message):
    (tmp_path / "tests").mkdir()
    (tmp_path / "v.yml").write_text(
        rule_text("First", "1f0e0d0c-0000-4000-8000-0000000000b1") + "name: first_rule\n---\n"
        "title: Twice\nname: first_rule_twice\ncorrelation:\n  type: event_count\n"
        "  rules: [first_rule]\n  group-by: [host.name]\n  timespan: 1m\n"
        "  condition: {gte: 2}\n"
    )
    (tmp_path / "tests" / "v.yaml").write_text(tests_text)
    with pytest.raises(RuleError) as caught:
        load_rules([tmp_path / "v.yml"])
    assert str(caught.value) == f"{tmp_path / 'tests' / 'v.yaml'}:{line}: {message}"


def test_tests_file_placeholders_and_nested_events(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "v.yml").write_text(
        rule_text(
            "First", "1f0e0d0c-0000-4000-8000-0000000000c1", "process.name|expand", "'%tools%'"
        )
    )
    (tmp_path / "tests" / "v.yaml").write_text(
        "placeholders:\n  tools: [rsync, scp]\n  limit: 5\n---\n"
        "rule: 1f0e0d0c-0000-4000-8000-0000000000c1\n"
        "match:\n  - process: {name: scp, pid: 7}\n"
    )
    (test,) = load_rules([tmp_path]).tests
    assert test.placeholders == {"tools": ["rsync", "scp"], "limit": [5]}
    assert test.match == ({"process.name": "scp", "process.pid": 7, "event.category": "process"},)


def test_tests_file_named_yml_is_still_read(tmp_path):
    shutil.copy(VALID / "sample.yml", tmp_path / "sample.yml")
    (tmp_path / "tests").mkdir()
    shutil.copy(VALID / "tests" / "sample.yaml", tmp_path / "tests" / "sample.yml")
    assert len(load_rules([tmp_path / "sample.yml"]).tests) == 4


def test_a_file_named_twice_loads_once():
    ruleset = load_rules([VALID, VALID / "sample.yml"])
    assert ruleset.files == [str(VALID / "sample.yml")]
    assert len(ruleset.rules) == 4 and len(ruleset.tests) == 4


def test_scanning_can_skip_the_test_events(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "v.yml").write_text(rule_text("First", "1f0e0d0c-0000-4000-8000-0000000000b9"))
    (tmp_path / "tests" / "v.yaml").write_text("- rule: nope\n  match: [{a: b}]\n")
    with pytest.raises(RuleError, match="test names unknown rule 'nope'"):
        load_rules([tmp_path])
    ruleset = load_rules([tmp_path], with_tests=False)
    assert [r.sigma.title for r in ruleset.rules] == ["First"] and ruleset.tests == []

"""The six bundled rulesets: they load, read well for analysts, and their test events pass."""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
from sigma.correlations import SigmaCorrelationRule

from hpcsec.detector.cli.main import main
from hpcsec.detector.config.site import SiteConfig, load_config
from hpcsec.detector.engine.lint import check_paths
from hpcsec.detector.engine.loader import load_rules
from hpcsec.detector.engine.ruleset import RuleSet, RuleTest
from hpcsec.detector.engine.ruletests import run_tests

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "rules"
VECTORS = (
    "rdma_abuse",
    "gpu_hijack",
    "model_theft",
    "data_poisoning",
    "firmware_drift",
    "isolation_escape",
    "self_health",
    "cluster",  # cross-node rules for the hub (docs/cluster.md)
)
TAG = re.compile(r"(attack\.(t\d{4}(\.\d{3})?|[a-z_]+)|atlas\.aml\.t\d{4}(\.\d{3})?)")


@pytest.fixture(scope="module")
def ruleset() -> RuleSet:
    return load_rules([RULES])


def alerting(ruleset: RuleSet, vector: str):
    """Rules of a vector that alert: correlations, and detections no correlation consumes
    (or consumed by one with `generate: true`)."""
    consumed: set[str] = set()
    for rule in ruleset.rules:
        corr = rule.sigma
        if isinstance(corr, SigmaCorrelationRule) and not corr.generate:
            consumed |= {ref.reference for ref in corr.rules}
    return [
        r
        for r in ruleset.rules
        if r.vector == vector and r.id not in consumed and (r.sigma.name or "") not in consumed
    ]


def test_the_bundled_rulesets_and_nothing_else():
    assert sorted(p.stem for p in RULES.glob("*.yml")) == sorted(VECTORS)
    assert sorted(p.name for p in (RULES / "tests").glob("*.yaml")) == sorted(
        f"{v}.yaml" for v in VECTORS
    )


def test_rulesets_load_without_errors_and_check_clean():
    loaded = load_rules([RULES], collect_errors=True)
    assert loaded.errors == []
    assert [str(f) for f in check_paths([RULES])] == []


@pytest.mark.parametrize("vector", VECTORS)
def test_each_vector_has_four_alerting_rules_and_a_correlation(ruleset, vector):
    rules = alerting(ruleset, vector)
    assert len(rules) >= 4, [r.sigma.title for r in rules]
    assert any(r.kind == "correlation" for r in rules)
    assert all(r.vector == vector for r in ruleset.rules if Path(r.path).stem == vector)


@pytest.mark.parametrize("vector", VECTORS)
def test_rules_carry_analyst_metadata(ruleset, vector):
    alerts = {r.id for r in alerting(ruleset, vector)}
    for rule in (r for r in ruleset.rules if r.vector == vector):
        s = rule.sigma
        where = f"{rule.path}:{rule.line} {s.title}"
        assert s.title and len(s.title) <= 80, where
        assert uuid.UUID(str(s.id)).version == 4, where
        assert s.status is not None and s.level is not None, where
        # intent plus tuning advice: a real paragraph, not a one-liner (base rules that only
        # feed correlations say what they select and that they do not alert)
        assert s.description and len(s.description.split()) >= (25 if rule.id in alerts else 12), (
            where
        )
        assert s.references and all(str(r).startswith("https://") for r in s.references), where
        assert s.author == "hpcsec project" and s.date is not None, where
        assert s.falsepositives, where
        tags = [str(t) for t in s.tags]
        assert tags and all(TAG.fullmatch(t) for t in tags), (where, tags)
        assert any(re.fullmatch(r"attack\.t\d{4}(\.\d{3})?", t) for t in tags), where


def test_rule_ids_are_unique_across_rulesets(ruleset):
    ids = [r.id for r in ruleset.rules]
    assert len(ids) == len(set(ids))


def test_every_rule_has_matching_and_non_matching_test_events(ruleset):
    by_rule: dict[str, list[RuleTest]] = {}
    for test in ruleset.tests:
        by_rule.setdefault(test.rule_id, []).append(test)
    for rule in ruleset.rules:
        tests = by_rule.get(rule.id, [])
        where = f"{rule.path}:{rule.line} {rule.sigma.title}"
        if rule.kind == "correlation":
            expects = {s.expect_match for t in tests for s in t.sequences}
            assert expects == {True, False}, where
        else:
            assert any(t.match for t in tests) and any(t.nomatch for t in tests), where


def test_rule_tests_pass_with_the_default_placeholders(ruleset):
    passed, failures = run_tests(ruleset, SiteConfig().placeholders())
    assert failures == []
    assert passed >= 6 * 4 * 2


def test_rule_tests_can_fail(ruleset):
    """A match event turned into a non-matching one must be reported as a failure."""
    test = next(t for t in ruleset.tests if t.rule_id == "494c85a1-d78e-43c8-9518-d117a318f4cd")
    broken = RuleTest(
        test.rule_id,
        ({**test.match[0], "gpu.ecc_mode": 1},),
        (),
        test.path,
        test.line,
        match_lines=(test.match_lines[0],),
    )
    passed, failures = run_tests(
        RuleSet(rules=ruleset.rules, tests=[broken]), SiteConfig().placeholders()
    )
    assert (passed, len(failures)) == (0, 1)


def test_rules_test_command_passes_with_the_example_config(capsys):
    assert (
        main(["rules", "test", str(RULES), "--config", str(ROOT / "examples" / "site-config.yml")])
        == 0
    )
    assert "0 failed" in capsys.readouterr().err


def test_site_lists_reach_the_rules(ruleset):
    """`copy_tools` from the site config replaces the default list in the copy-tool rule."""
    from hpcsec.detector.engine.evaluate import Engine

    rule = ruleset.find("2bfe7e5b-9535-4165-b5f8-2deff1e79153")
    event = {
        "event.category": "file_access",
        "@timestamp": "2026-11-30T01:00:00Z",
        "host.name": "gpu-017",
        "event.action": "read",
        "process.name": "bbcp",
        "hpcsec.asset.kind": "model",
        "file.path": "/lustre/models/m/w.safetensors",
    }
    subset = RuleSet(rules=[rule])
    default = Engine(subset, SiteConfig().placeholders())
    assert default.evaluate([dict(event)]) == []
    site = SiteConfig(lists={"copy_tools": ("bbcp",)})
    assert [m.rule.id for m in Engine(subset, site.placeholders()).evaluate([dict(event)])] == [
        rule.id
    ]


def test_example_config_placeholders_cover_every_rule(ruleset):
    from hpcsec.detector.engine.evaluate import Engine

    # building the engine fills every placeholder; a missing one is a RuleError
    Engine(ruleset, load_config(ROOT / "examples" / "site-config.yml").placeholders())

"""`hpcsec rules convert` to Splunk and Elastic with the real pySigma backends: every bundled
rule either converts or is skipped with one warning line that names it and says why."""

from __future__ import annotations

import re

import pytest

from hpcsec.detector.cli.main import main
from hpcsec.detector.config.site import load_config
from hpcsec.detector.engine.convert import convert_ruleset, missing_backend_message
from hpcsec.detector.engine.fieldmaps import CIM, ECS
from hpcsec.detector.engine.loader import load_rules

WARNING = re.compile(
    r"^hpcsec: warning: (?P<path>\S+):(?P<line>\d+): rule (?P<id>[0-9a-f-]{36}) "
    r"\((?P<title>.+)\) not converted: (?P<reason>\S.*)$"
)
SIEM_TARGETS = ("splunk", "lucene", "esql")


def bundled_rule_ids() -> set[str]:
    return {r.id for r in load_rules(None, with_tests=False).rules}


@pytest.mark.parametrize("target", SIEM_TARGETS)
def test_every_bundled_rule_converts_or_is_named_as_skipped(capsys, target):
    code = main(["rules", "convert", "-t", target])
    out, err = capsys.readouterr()
    assert code == 0
    assert "Traceback" not in err
    lines = err.splitlines()
    *warnings, summary = lines
    skipped = [WARNING.match(line) for line in warnings]
    assert all(skipped), warnings
    assert summary == f"{len(warnings)} rule(s) not converted to {target}"
    assert out.strip() and all(q.strip() for q in out.split("\n\n"))
    ruleset = load_rules(None, with_tests=False)
    conversion = convert_ruleset(ruleset, target, placeholders=_defaults())
    assert [str(s) for s in conversion.skipped] == [line.split(": ", 2)[2] for line in warnings]
    # every rule is accounted for: converted (detection rules with a query of their own, or a
    # correlation's base carried in its query) or skipped with a reason
    skipped_ids = {m["id"] for m in skipped if m}
    assert skipped_ids < bundled_rule_ids()
    assert all(q and isinstance(q, str) for q in conversion.queries)


def _defaults() -> dict:
    return load_config(None).placeholders()


def test_correlations_the_backend_lacks_are_skipped_with_the_reason(capsys):
    main(["rules", "convert", "-t", "splunk"])
    _, err = capsys.readouterr()
    reasons = {m["title"]: m["reason"] for m in map(WARNING.match, err.splitlines()) if m}
    assert reasons["RDMA rkey probing (remote access errors per minute)"] == (
        "Correlation type 'value_sum' is not supported by backend."
    )
    assert "temporal_ordered" in reasons["Model weights read, then a connection out of the cluster"]


def test_correlation_over_a_skipped_base_names_the_base(capsys):
    main(["rules", "convert", "-t", "eql"])
    _, err = capsys.readouterr()
    reasons = {m["title"]: m["reason"] for m in map(WARNING.match, err.splitlines()) if m}
    assert reasons["Burst of modifications to a protected dataset"] == (
        "its rule(s) dataset_modified_not_ingest were not converted"
    )


def test_splunk_queries_use_cim_names_and_the_sourcetype(capsys):
    assert main(["rules", "convert", "-t", "splunk"]) == 0
    out, _ = capsys.readouterr()
    miner = next(q for q in out.splitlines() if "xmrig" in q)
    assert re.match(r'sourcetype="hpcsec:(gpu_)?process" ', miner)
    assert "process_name IN (" in miner and "process.name" not in miner
    assert CIM.field("process.command_line") == "process"


def test_elastic_queries_use_ecs_names_and_the_dataset(capsys):
    assert main(["rules", "convert", "-t", "lucene"]) == 0
    out, _ = capsys.readouterr()
    assert "event.category" not in out
    miner = next(q for q in out.splitlines() if "xmrig" in q)
    assert re.match(r"event\.dataset:hpcsec\.(gpu_)?process AND ", miner)
    assert "process.name:" in miner
    assert ECS.field("user.is_admin") == "hpcsec.user.is_admin"
    assert "user.is_admin" not in out.replace("hpcsec.user.is_admin", "")


def test_fields_option_keeps_hpcsec_names(capsys):
    assert main(["rules", "convert", "-t", "splunk", "--fields", "hpcsec"]) == 0
    out, _ = capsys.readouterr()
    assert 'event.category="gpu_process"' in out and "process_name" not in out


def test_nothing_converted_exits_1(capsys, tmp_path):
    rule = tmp_path / "ordered.yml"
    rule.write_text(
        "title: a\nname: a\nid: 0a3e6d1e-8e5f-4a52-9d0b-0f4b8f1f0d01\n"
        "logsource: {product: hpc, category: process}\n"
        "detection: {sel: {process.name: x}, condition: sel}\n---\n"
        "title: b\nid: 0a3e6d1e-8e5f-4a52-9d0b-0f4b8f1f0d02\n"
        "correlation: {type: value_sum, rules: [a], group-by: [host.name], timespan: 1m,\n"
        "  condition: {field: file.size, gte: 10}}\n"
    )
    code = main(["rules", "convert", "-t", "lucene", str(rule)])
    out, err = capsys.readouterr()
    # rule a is the correlation's base (no query of its own), b cannot be expressed
    assert (code, out) == (1, "")
    assert "not converted: Backend does not support correlation rules." in err


@pytest.mark.parametrize(
    ("target", "extra"),
    [("splunk", "splunk"), ("esql", "elasticsearch"), ("lucene", "elasticsearch")],
)
def test_missing_backend_names_the_pip_extra(target, extra):
    message = missing_backend_message(target, ["sqlite"])
    assert message == (
        f"unknown target {target!r} (installed pySigma backends: sqlite): "
        f"pip install 'hpcsec[{extra}]'"
    )
    assert missing_backend_message("nosuch", []).endswith("(installed pySigma backends: none)")

"""`hpcsec rules list|check|test`, and `sigma check` (sigma-cli) on our rule files."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hpcsec.detector.cli.main import main
from hpcsec.detector.engine.loader import bundled_rules_dir, load_rules
from hpcsec.detector.engine.ruletests import run_tests

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "rules"
VALID, LINT, FAILING = FIXTURES / "valid", FIXTURES / "lint", FIXTURES / "failing"
# sigma-cli is a dependency of hpcsec: its `sigma` script sits beside this Python's.
SIGMA_CLI = Path(sys.executable).parent / "sigma"


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["rules", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_list_table(capsys):
    code, out, err = run(capsys, "list", str(VALID))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == [
        "ID",
        "TITLE",
        "LEVEL",
        "VECTOR",
        "STATUS",
        "ORIGIN",
        "FILE",
        "TECHNIQUES",
    ]
    assert lines[1].split()[0] == "0b7e51a4-6d43-4a43-8f1a-6c2f3c3d8a01"
    assert lines[1].split()[-8:] == [
        "high",
        "sample",
        "test",
        str(VALID),
        f"{VALID / 'sample.yml'}:1",
        "T1496",
        "Resource",
        "Hijacking",
    ]
    assert len(lines) == 5


def test_list_json(capsys):
    code, out, _ = run(capsys, "list", "--format", "json", str(VALID))
    assert code == 0
    rows = json.loads(out)
    assert rows[3] == {
        "id": "5f6a7b8c-9d0e-4f1a-8b2c-3d4e5f6a7b04",
        "title": "Repeated GPU processes outside jobs on one host",
        "level": "high",
        "vector": "sample",
        "status": "experimental",
        "kind": "correlation",
        "origin": str(VALID),
        "file": f"{VALID / 'sample.yml'}:65",
        "description": rows[3]["description"],
        "falsepositives": rows[3]["falsepositives"],
        "references": [],
        "response": "Kill the process and hold the job.",
        "tags": ["attack.execution"],
        "techniques": [],
        "tactics": [{"id": "TA0002", "name": "Execution"}],
    }
    assert rows[3]["description"].strip()
    assert [r["kind"] for r in rows] == ["detection", "detection", "filter", "correlation"]


def test_check_clean_rules(capsys):
    assert run(capsys, "check", "--strict", str(VALID)) == (0, "", "0 error(s), 0 warning(s)\n")


def test_check_reports_our_findings_with_lines(capsys):
    code, out, err = run(capsys, "check", str(LINT))
    rules, tests = LINT / "lintme.yml", LINT / "tests" / "lintme.yml"
    assert code == 2
    assert out.splitlines() == [
        f"{rules}:1: warning: rule has no description [missing-description]",
        f"{rules}:1: warning: rule has no response note (triage and containment for the "
        "analyst) [missing-response]",
        f"{rules}:1: warning: rule has no test event that must not fire it [no-tests]",
        f"{rules}:6: error: malformed ATT&CK tag 'attack.t12' (attack.tNNNN, attack.tNNNN.NNN "
        "or attack.<tactic>) [attack-tag]",
        f"{rules}:7: error: malformed ATLAS tag 'atlas.aml.x' (atlas.aml.tNNNN or "
        "atlas.aml.tNNNN.NNN) [attack-tag]",
        f"{rules}:10: error: logsource product must be 'hpc', not 'linux' [logsource]",
        f"{rules}:14: warning: unknown field 'proc.nme' (not in docs/fields.md) [unknown-field]",
        f"{rules}:18: warning: rule has no level [missing-level]",
        f"{rules}:18: warning: rule has no response note (triage and containment for the "
        "analyst) [missing-response]",
        f"{rules}:18: warning: rule has no tags [missing-tags]",
        f"{rules}:18: warning: rule has no test events (tests/lintme.yaml) [no-tests]",
        f"{rules}:24: error: unknown logsource category 'gpus' (known: rdma_counters, rdma_qp, "
        "roce_flow, gpu_device, gpu_process, firmware, file_access, process, network_socket, "
        "slurm_job, sensor_status) [logsource]",
        f"{rules}:39: warning: filter names unknown rule 'not_loaded_here' [filter-rule]",
        f"{tests}: error: name test events files *.yaml: Sigma tools read every *.yml as rules "
        "[tests-file-name]",
    ]
    assert err == "5 error(s), 9 warning(s)\n"


def test_check_runs_pysigma_validators(tmp_path, capsys):
    path = tmp_path / "dangling.yml"
    path.write_text(
        "title: Dangling detection\nid: 1f0e0d0c-0000-4000-8000-0000000000d1\nstatus: test\n"
        "description: d\ntags: [attack.execution, attack.execution]\nlevel: low\n"
        "logsource: {product: hpc, category: process}\n"
        "detection:\n  selection:\n    process.name: x\n  unused:\n    process.name: y\n"
        "  condition: selection\n"
    )
    code, out, _ = run(capsys, "check", str(path))
    assert code == 2  # a dangling detection is a high-severity pySigma issue
    assert (
        f"{path}:11: error: Rule defines detection that is not referenced from condition "
        "(detection_name=unused) [sigma:DanglingDetectionIssue]" in out.splitlines()
    )
    assert (
        f"{path}:5: warning: The same tag appears multiple times (tag=attack.execution) "
        "[sigma:DuplicateTagIssue]" in out.splitlines()
    )


def test_warnings_fail_only_with_strict(tmp_path, capsys):
    shutil.copy(VALID / "sample.yml", tmp_path / "sample.yml")  # without its tests: warnings
    code, out, err = run(capsys, "check", str(tmp_path))
    assert code == 0 and err == "0 error(s), 3 warning(s)\n"
    assert out.count("[no-tests]") == 3  # detections and the correlation, not the filter
    assert run(capsys, "check", "--strict", str(tmp_path))[0] == 2


def test_rules_test_passes_on_valid_rules(capsys):
    assert run(capsys, "test", str(VALID)) == (
        0,
        "",
        "9 passed, 0 failed, 0 rule(s) missing test events\n",
    )


def test_rules_test_names_rule_file_line_and_event(capsys):
    code, out, err = run(capsys, "test", str(FAILING))
    tests = FAILING / "tests" / "failing.yaml"
    assert code == 1
    assert out.splitlines() == [
        f"FAIL {tests}:4: rule 9b000000-0000-4000-8000-000000000001 (Copy tool reads a model) "
        'should fire on event {"process.name":"cp","hpcsec.asset.kind":"model",'
        '"event.category":"file_access"}',
        f"FAIL {tests}:6: rule 9b000000-0000-4000-8000-000000000001 (Copy tool reads a model) "
        'should not fire on event {"process.name":"scp","hpcsec.asset.kind":"model",'
        '"event.category":"file_access"}',
        f"FAIL {FAILING / 'failing.yml'}:20: rule 9b000000-0000-4000-8000-000000000002 (Rule "
        "nobody tested) has no test events (tests/failing.yaml)",
        f"FAIL {FAILING / 'failing.yml'}:35: rule 9b000000-0000-4000-8000-000000000003 (Rule "
        "tested only with events that fire it) has no test event that must not fire it",
    ]
    assert err == "3 passed, 2 failed, 2 rule(s) missing test events\n"


def test_correlation_sequences_run_in_one_engine():
    ruleset = load_rules([VALID])
    ruleset.tests = [t for t in ruleset.tests if t.sequences]
    passed, failures = run_tests(ruleset)
    assert (passed, failures) == (2, [])


def test_filter_is_part_of_each_test(tmp_path):
    """The burn-in filter is what keeps the third nomatch event quiet: without it, it fires."""
    text = (VALID / "sample.yml").read_text()
    (tmp_path / "tests").mkdir()
    (tmp_path / "sample.yml").write_text(text.split("---\ntitle: Ignore")[0])
    (tmp_path / "tests" / "sample.yaml").write_text(
        (VALID / "tests" / "sample.yaml")
        .read_text()
        .split("- rule: gpu_process_without_job_repeated")[0]
    )
    passed, failures = run_tests(load_rules([tmp_path]))
    assert passed == 6
    assert [(f.line, f.expected_match, f.events[0]["process.name"]) for f in failures] == [
        (13, False, "gpu-burn")
    ]


def sigma_check(directory: Path) -> subprocess.CompletedProcess:
    assert SIGMA_CLI.exists(), f"sigma-cli is not installed ({SIGMA_CLI})"
    # attacktag and d3_fendtag download MITRE data at first use; tests run offline.
    return subprocess.run(
        [
            str(SIGMA_CLI),
            "check",
            "--exclude",
            "attacktag",
            "--exclude",
            "d3_fendtag",
            str(directory),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_sigma_cli_reads_our_files_as_plain_sigma():
    done = sigma_check(VALID)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Found 0 errors, 0 condition errors" in done.stdout


def test_sigma_check_passes_on_bundled_rules():
    rules = bundled_rules_dir()
    if not list(rules.glob("*.yml")):
        pytest.skip("no bundled rulesets yet")
    done = sigma_check(rules)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Found 0 errors, 0 condition errors" in done.stdout


def test_runner_takes_tests_built_in_code():
    from hpcsec.detector.engine.ruleset import RuleTest

    ruleset = load_rules([VALID])
    miner = "0b7e51a4-6d43-4a43-8f1a-6c2f3c3d8a01"
    ruleset.tests = [
        RuleTest(
            miner, ({"event.category": "gpu_process", "process.name": "ls"},), (), "made-in-code", 7
        )
    ]
    passed, (failure,) = run_tests(ruleset)
    assert passed == 0
    assert str(failure).startswith(
        f"made-in-code:7: rule {miner} (Crypto miner running on a "
        'GPU) should fire on event {"event.category":"gpu_process"'
    )


def test_check_knows_field_names_in_values_and_aliases(tmp_path, capsys):
    path = tmp_path / "refs.yml"
    path.write_text(
        "title: Reads as someone else\nid: 1f0e0d0c-0000-4000-8000-0000000000e1\n"
        "name: reads_as_other\nstatus: test\ndescription: d\ntags: [attack.collection]\n"
        "level: low\nlogsource: {product: hpc, category: file_access}\n"
        "detection:\n  selection:\n    user.name|fieldref|neq: slurm.job.usr\n"  # 11
        "  condition: selection\n"
        "---\n"
        "title: Many reads\nid: 1f0e0d0c-0000-4000-8000-0000000000e2\nstatus: test\n"
        "description: d\ntags: [attack.collection]\nlevel: low\n"
        "correlation:\n  type: event_count\n  rules: [reads_as_other]\n"
        "  aliases:\n    who:\n      reads_as_other: usr.name\n"  # 25
        "  group-by: [who, hst.name]\n  timespan: 1h\n  condition: {gte: 2}\n"
    )  # 26
    code, out, _ = run(capsys, "check", str(path))
    assert code == 0
    assert [line for line in out.splitlines() if "[unknown-field]" in line] == [
        f"{path}:11: warning: unknown field 'slurm.job.usr' (not in docs/fields.md) "
        "[unknown-field]",
        f"{path}:25: warning: unknown field 'usr.name' (not in docs/fields.md) [unknown-field]",
        f"{path}:26: warning: unknown field 'hst.name' (not in docs/fields.md) [unknown-field]",
    ]


def test_validator_that_cannot_read_a_rule_is_a_finding_not_a_crash(tmp_path, capsys):
    path = tmp_path / "odd.yml"
    path.write_text(
        "title: Odd references\nid: 1f0e0d0c-0000-4000-8000-0000000000f7\nstatus: test\n"
        "description: d\ntags: [attack.execution]\nlevel: low\n"
        "references:\n  - {url: https://example.org}\n"
        "logsource: {product: hpc, category: process}\n"
        "detection:\n  selection:\n    process.name: x\n  condition: selection\n"
    )
    code, out, _ = run(capsys, "check", str(path))
    assert code == 2
    assert (
        f"{path}:1: error: pySigma validator duplicate_references cannot check this rule: "
        "TypeError: unhashable type: 'dict' [sigma:validator-failed]" in out.splitlines()
    )


def test_failure_shows_events_json_cannot_hold_in_64_bits(tmp_path, capsys):
    (tmp_path / "tests").mkdir()
    (tmp_path / "big.yml").write_text(
        "title: Big file\nid: 1f0e0d0c-0000-4000-8000-0000000000c9\n"
        "logsource: {product: hpc, category: file_access}\n"
        "detection:\n  sel: {file.size|gt: 5}\n  condition: sel\n"
    )
    (tmp_path / "tests" / "big.yaml").write_text(
        "- rule: 1f0e0d0c-0000-4000-8000-0000000000c9\n  match: [{file.size: 6}]\n"
        "  nomatch:\n    - {file.size: 99999999999999999999999999}\n"
    )
    code, out, err = run(capsys, "test", str(tmp_path))
    assert (code, err) == (1, "1 passed, 1 failed, 0 rule(s) missing test events\n")
    assert out == (
        f"FAIL {tmp_path / 'tests' / 'big.yaml'}:4: rule 1f0e0d0c-0000-4000-8000-"
        "0000000000c9 (Big file) should not fire on event "
        '{"file.size":99999999999999999999999999,"event.category":"file_access"}\n'
    )


def test_check_rule_without_category(tmp_path, capsys):
    path = tmp_path / "nocat.yml"
    path.write_text(
        "title: No category\nid: 1f0e0d0c-0000-4000-8000-0000000000f8\n"
        "logsource:\n  product: hpc\n"
        "detection:\n  sel: {process.name: x}\n  condition: sel\n"
    )
    code, out, _ = run(capsys, "check", str(path))
    assert code == 0
    assert (
        f"{path}:3: warning: logsource has no category: the rule sees the events of every "
        "category (rdma_counters, " in out
    )

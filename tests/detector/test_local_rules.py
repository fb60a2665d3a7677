"""Local rules add to the bundled ones: `--rules`, the config's `rules:`, `--no-default-rules`,
a site filter on a bundled rule, ids reused, and `rules list` naming where each rule came from.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpcsec.detector.cli.main import main
from hpcsec.detector.config.site import load_config
from hpcsec.detector.engine.loader import bundled_rules_dir
from hpcsec.detector.runtime.agent_settings import AgentSettings, load_generation

# a bundled rule: "GPU process outside any Slurm job"
BUNDLED_ID = "761aedd6-bf44-46ef-8eb3-9259427d5ab7"
LOCAL_ID = "2f0c3a51-7d1e-4c59-9a43-6b8e1d0f5a01"

LOCAL_RULE = f"""\
title: Site-only rule on GPU processes of the benchmark account
id: {LOCAL_ID}
status: test
description: A site's own rule, beside the bundled ones.
author: site
date: 2026-11-30
logsource:
  product: hpc
  category: gpu_process
detection:
  selection:
    user.name: benchmark
  condition: selection
level: medium
"""

# the site's burn-in node: no alert for GPU work outside jobs there, and only there
SITE_FILTER = f"""\
title: GPU work outside jobs is expected on the burn-in node
id: 6a1d2e3f-4b5c-4d6e-8f70-81a2b3c4d5e6
status: test
description: gpu-017 runs the nightly burn-in outside Slurm.
author: site
date: 2026-11-30
logsource:
  product: hpc
  category: gpu_process
filter:
  rules:
    - {BUNDLED_ID}
  selection:
    host.name: gpu-017
  condition: not selection
"""


def _gpu_event(host: str, user: str, pid: int) -> dict:
    return {
        "event.category": "gpu_process",
        "event.kind": "event",
        "@timestamp": "2026-11-30T01:00:00Z",
        "host.name": host,
        "process.pid": pid,
        "process.name": "python3",
        "user.name": user,
        "gpu.index": 5,
        "gpu.allocated_to_job": False,
        "process.is_gpu_service": False,
    }


@pytest.fixture
def events(tmp_path: Path) -> Path:
    path = tmp_path / "events.jsonl"
    lines = [
        _gpu_event("gpu-017", "mallory", 51000),
        _gpu_event("gpu-018", "mallory", 51001),
        _gpu_event("gpu-018", "benchmark", 51002),
    ]
    path.write_text("".join(json.dumps(e) + "\n" for e in lines))
    return path


def scan(capsys, events: Path, *args: str) -> tuple[int, list[tuple[str, str]], str]:
    rc = main(["scan", "--events", str(events), "--format", "json", "--no-dedup", *args])
    out, err = capsys.readouterr()
    alerts = json.loads(out) if out.strip() else []
    return rc, sorted((a["rule.id"], a["host.name"]) for a in alerts), err


def test_local_rules_add_to_the_bundled_ones(tmp_path: Path, events: Path, capsys):
    local = tmp_path / "local.yml"
    local.write_text(LOCAL_RULE)
    rc, alerts, _ = scan(capsys, events, "--rules", str(local))
    assert rc == 1
    assert (BUNDLED_ID, "gpu-017") in alerts
    assert (BUNDLED_ID, "gpu-018") in alerts
    assert (LOCAL_ID, "gpu-018") in alerts


def test_no_default_rules_runs_only_the_local_ones(tmp_path: Path, events: Path, capsys):
    local = tmp_path / "local.yml"
    local.write_text(LOCAL_RULE)
    rc, alerts, _ = scan(capsys, events, "--no-default-rules", "--rules", str(local))
    assert (rc, alerts) == (1, [(LOCAL_ID, "gpu-018")])


def test_no_default_rules_without_any_rules_is_a_usage_error(events: Path, capsys):
    assert main(["scan", "--events", str(events), "--no-default-rules"]) == 2
    assert "--no-default-rules needs rules" in capsys.readouterr().err


def test_a_site_filter_silences_a_bundled_rule_for_one_host(tmp_path: Path, events: Path, capsys):
    _, before, _ = scan(capsys, events)
    assert [h for rule, h in before if rule == BUNDLED_ID] == ["gpu-017", "gpu-018", "gpu-018"]
    site = tmp_path / "site-filters.yml"
    site.write_text(SITE_FILTER)
    _, after, _ = scan(capsys, events, "--rules", str(site))
    assert [h for rule, h in after if rule == BUNDLED_ID] == ["gpu-018", "gpu-018"]


def test_config_rules_are_relative_to_the_config_file(
    tmp_path: Path, events: Path, capsys, monkeypatch
):
    site = tmp_path / "etc" / "hpcsec"
    (site / "rules.d").mkdir(parents=True)
    (site / "rules.d" / "local.yml").write_text(LOCAL_RULE)
    (site / "filters.yml").write_text(SITE_FILTER)
    config = site / "site.yml"
    config.write_text("rules: [rules.d, filters.yml]\n")
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert load_config(config).rule_paths == (str(site / "rules.d"), str(site / "filters.yml"))
    rc, alerts, _ = scan(capsys, events, "--config", str(config))
    assert rc == 1
    assert (LOCAL_ID, "gpu-018") in alerts
    assert (BUNDLED_ID, "gpu-017") not in alerts
    assert (BUNDLED_ID, "gpu-018") in alerts


def test_config_rules_must_be_paths(tmp_path: Path, capsys):
    config = tmp_path / "site.yml"
    config.write_text("node_class: x\nrules: {local: 1}\n")
    assert main(["config", "check", str(config)]) == 2
    assert f"{config}:2: rules must be a list of strings" in capsys.readouterr().err


def test_a_file_named_by_the_config_and_the_command_line_loads_once(
    tmp_path: Path, events: Path, capsys
):
    via_dir = tmp_path / "rules.d"
    via_dir.mkdir()
    local = via_dir / "local.yml"
    local.write_text(LOCAL_RULE)
    config = tmp_path / "site.yml"
    config.write_text("rules: [rules.d/local.yml]\n")  # the same file, three ways
    rc, alerts, err = scan(
        capsys, events, "--config", str(config), "--rules", str(local), "--rules", str(via_dir)
    )
    assert rc == 1, err
    assert alerts.count((LOCAL_ID, "gpu-018")) == 1


def test_a_local_rule_reusing_a_bundled_id_is_an_error_naming_both(
    tmp_path: Path, events: Path, capsys
):
    local = tmp_path / "local.yml"
    local.write_text(LOCAL_RULE.replace(LOCAL_ID, BUNDLED_ID))
    assert main(["scan", "--events", str(events), "--rules", str(local)]) == 2
    err = capsys.readouterr().err
    bundled_file = bundled_rules_dir() / "gpu_hijack.yml"
    assert f"{local}:2: duplicate rule id {BUNDLED_ID} (first at {bundled_file}:3)" in err
    assert "a local rule needs an id of its own" in err


def _listed(capsys, *args: str) -> list[dict]:
    assert main(["rules", "list", "--format", "json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_rules_list_names_where_each_rule_came_from(tmp_path: Path, capsys):
    local = tmp_path / "local.yml"
    local.write_text(LOCAL_RULE)
    filters = tmp_path / "filters.yml"
    filters.write_text(SITE_FILTER)
    config = tmp_path / "site.yml"
    config.write_text("rules: [filters.yml]\n")
    rows = _listed(capsys, "--config", str(config), "--rules", str(local))
    origins = {r["id"]: r["origin"] for r in rows}
    assert origins[BUNDLED_ID] == "bundled"
    assert origins[LOCAL_ID] == str(local)
    assert origins["6a1d2e3f-4b5c-4d6e-8f70-81a2b3c4d5e6"] == str(filters)
    assert {r["origin"] for r in rows} == {"bundled", str(local), str(filters)}
    # the table has the same column
    assert main(["rules", "list", "--rules", str(local)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[5] == "ORIGIN"
    (local_row,) = [line for line in table if line.startswith(LOCAL_ID)]
    assert local_row.split()[-3:-1] == [str(local), f"{local}:1"]  # then its techniques
    # PATH alone lists only that path (an author's command), as `check` and `test` do
    assert [r["id"] for r in _listed(capsys, str(local))] == [LOCAL_ID]
    assert main(["rules", "list", str(local), "--rules", str(local)]) == 2


def test_rules_check_and_test_are_about_the_path_given(tmp_path: Path, capsys):
    local = tmp_path / "local.yml"
    local.write_text(LOCAL_RULE.replace("status: test", "status: test\nname: site_benchmark"))
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "local.yaml").write_text(
        "- rule: site_benchmark\n"
        "  match:\n"
        "    - {event.category: gpu_process, user.name: benchmark}\n"
        "  nomatch:\n"
        "    - {event.category: gpu_process, user.name: alice}\n"
    )
    assert main(["rules", "test", str(tmp_path)]) == 0
    assert capsys.readouterr().err == "2 passed, 0 failed, 0 rule(s) missing test events\n"


def test_agent_reload_keeps_bundled_and_rereads_local_rules(tmp_path: Path):
    local = tmp_path / "local.yml"
    local.write_text(LOCAL_RULE)
    config = tmp_path / "site.yml"
    config.write_text("{}\n")
    settings = AgentSettings(config_path=str(config), rule_paths=(str(local),))
    ids = {r.id: r.origin for r in load_generation(settings).pipeline.ruleset.rules}
    assert (ids[BUNDLED_ID], ids[LOCAL_ID]) == ("bundled", str(local))
    # a SIGHUP reload reads the config's `rules:` and the local files again
    filters = tmp_path / "filters.yml"
    filters.write_text(SITE_FILTER)
    config.write_text("rules: [filters.yml]\n")
    reloaded = {r.id: r.origin for r in load_generation(settings).pipeline.ruleset.rules}
    assert reloaded["6a1d2e3f-4b5c-4d6e-8f70-81a2b3c4d5e6"] == str(filters)
    assert reloaded[BUNDLED_ID] == "bundled"
    only_local = AgentSettings(rule_paths=(str(local),), default_rules=False)
    assert [r.id for r in load_generation(only_local).pipeline.ruleset.rules] == [LOCAL_ID]

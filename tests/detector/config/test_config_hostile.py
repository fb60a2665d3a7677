"""Config values that would silently change policy are errors with their file and line:
NaN/Inf and out-of-range numbers, misspelled list and threshold names, list entries that can
never match."""

from __future__ import annotations

import pytest

from hpcsec.detector.cli.main import main
from hpcsec.detector.config.site import load_config
from hpcsec.detector.core.errors import ConfigError
from hpcsec.detector.engine.loader import bundled_rules_dir

BUNDLED = bundled_rules_dir()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("thresholds:\n  weight_files_per_user_10m: .nan\n", "must be a finite number, not nan"),
        ("thresholds:\n  weight_files_per_user_10m: .inf\n", "must be a finite number, not inf"),
        ("thresholds:\n  weight_files_per_user_10m: -1\n", "must be at least 0"),
        ("thresholds:\n  weight_files_per_user_10m: 1.0e+300\n", "must be at most"),
        ("dedup_window_s: .inf\n", "dedup_window_s must be a finite number"),
        ("dedup_window_s: 1000000000000000000000000000000\n", "dedup_window_s must be at most"),
        ("rate_limit_per_rule: .nan\n", "rate_limit_per_rule must be a finite number"),
        ("spool:\n  max_bytes: .inf\n", "spool.max_bytes must be a finite number"),
        ("spool:\n  max_bytes: 1.0e+300\n", "spool.max_bytes must be at most"),
        ("store:\n  retention_days: -.inf\n", "store.retention_days must be a finite number"),
        ("agent:\n  interval_s: .nan\n", "agent.interval_s must be a finite number"),
    ],
)
def test_non_finite_and_out_of_range_numbers_are_errors_at_their_line(tmp_path, text, message):
    path = tmp_path / "site.yml"
    path.write_text("# site\n" + text)
    with pytest.raises(ConfigError, match=message) as info:
        load_config(path)
    assert info.value.location.line == text.count("\n") + 1  # the value's own line


def check(tmp_path, capsys, text: str) -> tuple[int, str]:
    path = tmp_path / "site.yml"
    path.write_text(text)
    code = main(["config", "check", str(path)])
    return code, capsys.readouterr().err.replace(str(path), "site.yml")


def test_config_check_reports_nan_with_its_line(tmp_path, capsys):
    code, err = check(tmp_path, capsys, "thresholds:\n  weight_files_per_user_10m: .nan\n")
    assert (code, err) == (
        2,
        "hpcsec: error: site.yml:2: thresholds.weight_files_per_user_10m must be a finite "
        "number, not nan\n",
    )


def test_misspelled_list_and_threshold_names_are_errors_with_the_closest_name(tmp_path, capsys):
    code, err = check(
        tmp_path,
        capsys,
        "lists:\n  miner_name: [xmrig]\nthresholds:\n  weight_files_per_user_10n: 8\n",
    )
    assert code == 2
    assert sorted(err.splitlines()) == [
        "hpcsec: error: site.yml:2: lists.miner_name is not used by any loaded rule "
        "(did you mean 'miner_names'?)",
        "hpcsec: error: site.yml:4: thresholds.weight_files_per_user_10n is not used by any "
        "loaded rule (did you mean 'weight_files_per_user_10m'?)",
    ]


def test_a_list_the_enrichment_reads_is_known(tmp_path, capsys):
    code, _ = check(tmp_path, capsys, "lists:\n  ld_preload_allowed: [/opt/x/lib/libx.so]\n")
    assert code == 0


def test_an_entry_longer_than_comm_in_a_list_compared_with_process_name_is_an_error(
    tmp_path, capsys
):
    # a local rule that reads a list against `process.name` alone (the bundled rules read
    # `process.executable_name` as well)
    local = tmp_path / "local.yml"
    local.write_text(
        "title: t\nid: 00000000-0000-4000-8000-000000000001\nstatus: experimental\n"
        "level: low\nlogsource: {product: hpc, category: process}\ndetection:\n"
        "  sel:\n    process.name|expand: '%slurm_daemons%'\n  condition: sel\n"
    )
    site = tmp_path / "site.yml"
    site.write_text("lists:\n  slurm_daemons: [slurmd, my-long-slurm-daemon]\n")
    code = main(["config", "check", "--rules", str(local), "--rules", str(BUNDLED), str(site)])
    err = capsys.readouterr().err
    assert code == 2
    assert "lists.slurm_daemons: 'my-long-slurm-daemon' can never match" in err
    assert "('my-long-slurm-d')" in err
    # the bundled rules alone read it against the executable's name: a long one is fine
    text = "lists:\n  slurm_daemons: [slurmd, my-long-slurm-daemon]\n"
    assert check(tmp_path, capsys, text)[0] == 0


def test_a_long_name_in_a_list_also_matched_on_the_executable_is_fine(tmp_path, capsys):
    code, _ = check(tmp_path, capsys, "lists:\n  flash_tools: [nvidia-smi-flash, flint]\n")
    assert code == 0


def test_scan_refuses_a_misspelled_list(tmp_path, capsys):
    path = tmp_path / "site.yml"
    path.write_text("lists:\n  copy_tool: [scp]\n")
    events = tmp_path / "e.jsonl"
    events.write_text("")
    assert main(["scan", "--events", str(events), "--config", str(path)]) == 2
    assert "lists.copy_tool is not used by any loaded rule (did you mean 'copy_tools'?)" in (
        capsys.readouterr().err
    )

"""`hpcsec config check`: valid configs say ok, invalid ones name file, line and problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcsec.detector.cli.main import main
from hpcsec.detector.config.site import DEFAULT_LISTS, load_config

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "site-config.yml"


def check(capsys, path) -> tuple[int, str, str]:
    rc = main(["config", "check", str(path)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_example_config_is_valid(capsys):
    assert check(capsys, EXAMPLE) == (0, "ok\n", "")


def test_example_config_content():
    config = load_config(EXAMPLE)
    assert config.node_class == "h100-8x"
    assert {a.kind for a in config.assets} == {"model", "dataset", "checkpoint", "secret"}
    assert config.admins.users == ("adm-carol",)
    assert config.firmware.baseline("h100-8x", "hca") == "28.39.1002"
    assert config.firmware.is_vulnerable("hca", "28.33.2028")


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        (
            "node_class: h100-8x\nassets:\n  - name: m\n    kind: weights\n    paths: [/m/**]\n",
            4,
            "asset 'm': kind must be one of model, dataset, checkpoint, secret, not 'weights'",
        ),
        (
            "assets:\n  - name: m\n    kind: model\n    paths: [relative/**]\n",
            4,
            "asset 'm': paths must be absolute path globs",
        ),
        (
            "maintenance:\n  - start: 2026-12-01T06:00:00Z\n    end: 2026-12-01T02:00:00Z\n",
            2,
            "maintenance window ends before it starts",
        ),
        (
            "maintenance:\n  - start: tomorrow\n    end: 2026-12-01T02:00:00Z\n",
            2,
            "maintenance.0.start: not an RFC 3339 time: 'tomorrow'",
        ),
        (
            "maintenance:\n  - start: 2026-12-01T02:00:00Z\n    end: 2026-12-01T06:00:00Z\n"
            "    hosts: ['gpu[010-001]']\n",
            4,
            None,
        ),
        ("maintenance: {start: 2026-12-01T02:00:00Z}\n", 1, "maintenance must be a list"),
        (
            "firmware:\n  baselines:\n    h100-8x:\n      gpu_vbois: '96.00'\n",
            4,
            "unknown key 'gpu_vbois' (expected one of: gpu_vbios, gpu_inforom_image, "
            "gpu_inforom_oem, gpu_inforom_ecc, gpu_inforom_power, gpu_gsp, gpu_driver, hca, nic, "
            "bios)",
        ),
        (
            "firmware:\n  vulnerable:\n    hca: 28\n",
            3,
            "firmware.vulnerable.hca must be a list of strings",
        ),
        (
            "node_class: a100-4x\nfirmware:\n  baselines:\n    h100-8x: {hca: '28.39.1002'}\n",
            1,
            "node_class 'a100-4x' has no entry in firmware.baselines (known: h100-8x)",
        ),
        (
            "lists:\n  copy_tools: []\n",
            2,
            "lists.copy_tools must not be empty (remove it to use the default)",
        ),
        (
            "thresholds:\n  rkey_errors: many\n",
            2,
            "thresholds.rkey_errors must be a number, not 'many'",
        ),
        (
            "admins: {users: [a], groups: [b]}\n",
            1,
            "unknown key 'groups' (expected one of: users, accounts)",
        ),
        ("gpu_servics: [nv-hostengine]\n", 1, "unknown key 'gpu_servics'"),
        (
            "assets:\n  - name: m\n    kind: model\n    paths: [/m/**]\n"
            "  - name: m\n    kind: model\n    paths: [/n/**]\n",
            5,
            "duplicate asset name 'm'",
        ),
        ("admins:\n  users: [a]\n  users: [b]\n", 3, "duplicate key 'users'"),
        (
            "admins:\n\tusers: [a]\n",
            2,
            "YAML syntax error: tab character where YAML expects spaces",
        ),
    ],
)
def test_invalid_configs_name_file_line_and_problem(tmp_path, capsys, text, line, message):
    path = tmp_path / "site.yml"
    path.write_text(text)
    rc, out, err = check(capsys, path)
    assert rc == 2
    assert out == ""
    prefix = f"hpcsec: error: {path}:{line}"
    assert err.startswith(prefix), err
    if message is not None:
        assert message in err, err


def test_missing_file_is_a_usage_error(tmp_path, capsys):
    rc, out, err = check(capsys, tmp_path / "absent.yml")
    assert (rc, out) == (2, "")
    assert err == (
        f"hpcsec: error: {tmp_path / 'absent.yml'}: cannot read: No such file or directory\n"
    )


def test_show_merges_site_lists_over_defaults(tmp_path, capsys):
    import json

    path = tmp_path / "site.yml"
    path.write_text("lists:\n  copy_tools: [rsync]\ngpu_services: [nv-hostengine]\n")
    assert main(["config", "show", str(path)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["placeholders"]["copy_tools"] == ["rsync"]
    assert shown["placeholders"]["miner_names"] == list(DEFAULT_LISTS["miner_names"])
    assert shown["placeholders"]["gpu_services"] == ["nv-hostengine"]


def test_every_default_list_is_non_empty():
    assert DEFAULT_LISTS and all(DEFAULT_LISTS.values())


def test_numbers_that_would_silently_change_policy_are_refused(tmp_path):
    import pytest

    from hpcsec.detector.config.site import load_config
    from hpcsec.detector.core.errors import ConfigError

    cases = {
        "dedup_window_s: -5\n": "site.yml:1: dedup_window_s must be at least 1, not -5",
        "node_class: x\nfirmware:\n  baselines:\n    x: {bios: 2.10}\n": (
            "site.yml:4: firmware.baselines.x.bios: quote the version (2.1 was read as a "
            "number, which drops trailing zeros)"
        ),
        "store: {retention_days: 0}\n": "site.yml:1: store.retention_days must be at least 1",
    }
    for text, message in cases.items():
        path = tmp_path / "site.yml"
        path.write_text(text)
        with pytest.raises(ConfigError) as caught:
            load_config(path)
        assert str(caught.value).startswith(f"{tmp_path}/{message}")


@pytest.mark.parametrize(
    "start",
    ["2026-12-01T03:00:00+01:00", "'2026-12-01T03:00:00+01:00'", "2026-12-01 02:00:00"],
)
def test_maintenance_times_are_utc_however_they_are_written(tmp_path, start):
    """YAML reads an unquoted time as a datetime (naive without an offset), a quoted one as
    text: all three spellings are the same instant, in UTC."""
    path = tmp_path / "site.yml"
    path.write_text(f"maintenance:\n  - start: {start}\n    end: 2026-12-01T06:00:00Z\n")
    window = load_config(path).maintenance[0]
    assert window.start.isoformat() == "2026-12-01T02:00:00+00:00"
    assert window.end.isoformat() == "2026-12-01T06:00:00+00:00"

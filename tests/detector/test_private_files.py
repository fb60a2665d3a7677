"""Everything hpcsec writes is private and ours: store, export, spool, snapshot, hook state.

Run with umask 022, and against alice (unprivileged) planting directories and symlinks in a
shared sticky directory before root runs hpcsec."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import duckdb
import pytest

from hpcsec.detector.outputs.spool import Spool, SpoolError
from hpcsec.detector.slurm import hooks
from hpcsec.detector.store.alert_store import Store, StoreError
from hpcsec.sensors.snapshot import SnapshotWriter
from tests.hostile_fs import as_root, as_user, assert_private_tree, mode, umask

DEST = "https://siem.example/hook"
ALERT = {"alert.id": "a1", "rule.id": "r", "rule.level": "high", "process.command_line": "x"}


def hpcsec(*args: str) -> subprocess.CompletedProcess:
    with umask(0o022):  # inherited by the child
        return subprocess.run(
            [sys.executable, "-m", "hpcsec.detector.cli.main", *args],
            capture_output=True,
            text=True,
            timeout=120,
        )


# -- DuckDB store and Parquet export ---------------------------------------------------------


def test_scan_store_is_0600_whatever_the_umask(tmp_path):
    store = tmp_path / "alerts.duckdb"
    run = hpcsec("scan", "--demo", "--store", str(store), "--format", "json")
    assert run.returncode == 1, run.stderr  # the demo raises alerts
    assert {p.name: mode(p) for p in tmp_path.iterdir()} == {"alerts.duckdb": 0o600}


def test_store_created_by_the_library_is_0600_whatever_the_umask(tmp_path):
    with umask(0o022), Store(tmp_path / "s.duckdb") as store:
        store.insert_alerts([ALERT])
    assert mode(tmp_path / "s.duckdb") == 0o600


@as_root
def test_a_store_symlinked_to_a_victim_is_refused(shared, victim):
    as_user("alice", "ln", "-s", str(victim), str(shared / "alerts.duckdb"))
    with pytest.raises(StoreError, match="not a regular file"):
        Store(shared / "alerts.duckdb")
    assert victim.read_text() == "root's file\n"


@as_root
def test_a_store_file_of_another_user_is_refused(shared):
    as_user("alice", "touch", str(shared / "alerts.duckdb"))
    run = hpcsec("scan", "--demo", "--store", str(shared / "alerts.duckdb"))
    assert run.returncode == 2, run.stderr
    assert "belongs to uid 1001" in run.stderr


@as_root
def test_export_is_0600_and_never_writes_through_a_symlink(shared, victim, tmp_path):
    with Store(tmp_path / "s.duckdb") as store:
        store.insert_events([{"event.id": "e1", "@timestamp": "2026-11-30T00:00:00Z"}])
        as_user("alice", "ln", "-s", str(victim), str(shared / "ev.parquet"))
        with umask(0o022):
            assert store.export_events(shared / "ev.parquet") == 1
    assert victim.read_text() == "root's file\n"
    assert not (shared / "ev.parquet").is_symlink()  # the link itself was replaced
    assert mode(shared / "ev.parquet") == 0o600
    rows = duckdb.connect().execute(f"SELECT count(*) FROM '{shared / 'ev.parquet'}'")
    assert rows.fetchone() == (1,)


# -- spool -----------------------------------------------------------------------------------


def test_spool_files_and_directories_are_private_whatever_the_umask(tmp_path):
    with umask(0o022):
        spool = Spool.open(tmp_path / "spool", DEST, max_bytes=1 << 20)
        spool.add_many([ALERT, {**ALERT, "alert.id": "a2"}])
        spool.remove(spool.next_entry())  # settles the entry in the segment's .marks file
        spool.close()
    names = {p.name for p in (tmp_path / "spool").rglob("*")}
    assert {"destination", "lock", "pending"} <= names
    assert any(n.endswith(".marks") for n in names)
    assert_private_tree(tmp_path / "spool")


@as_root
def test_a_spool_directory_another_user_made_is_refused(shared):
    """alice made it first: root would deliver what she plants there, signed."""
    as_user("alice", "mkdir", "-m", "0777", str(shared / "spool"))
    with pytest.raises(SpoolError, match="belongs to alice"):
        Spool.open(shared / "spool", DEST, max_bytes=1 << 20)
    assert os.listdir(shared / "spool") == []


@as_root
def test_scan_with_a_spool_another_user_made_exits_2(shared):
    as_user("alice", "mkdir", str(shared / "spool"))
    syslog = "syslog+udp://127.0.0.1:9"
    run = hpcsec("scan", "--demo", "--output", syslog, "--spool", str(shared / "spool"))
    assert run.returncode == 2, run.stderr
    assert "belongs to alice" in run.stderr and "Traceback" not in run.stderr


# -- snapshot --------------------------------------------------------------------------------


def test_snapshot_is_private_whatever_the_umask(tmp_path):
    run = hpcsec("collect", "--sensor", "process", "--snapshot", str(tmp_path / "snap"))
    assert run.returncode == 0, run.stderr
    assert json.loads((tmp_path / "snap" / "meta.json").read_text())["samples"] == 1
    assert (tmp_path / "snap" / "0" / "proc").is_dir()
    assert_private_tree(tmp_path / "snap")


@as_root
def test_an_empty_snapshot_directory_of_another_user_is_refused(shared):
    as_user("alice", "mkdir", "-m", "0755", str(shared / "snap"))
    run = hpcsec("collect", "--sensor", "process", "--snapshot", str(shared / "snap"))
    assert run.returncode == 2, run.stderr
    assert "belongs to alice" in run.stderr
    assert os.listdir(shared / "snap") == []


def test_the_recorder_never_writes_through_a_recorded_link(tmp_path, victim):
    """proc/<pid>/root -> / is recorded as a link; a file below it must not land in /."""
    writer = SnapshotWriter(tmp_path / "s", "h")
    writer.begin_sample()
    writer.record_link("proc", "7/root", str(victim.parent))
    writer.record_file("proc", "7/root/planted", b"x")
    writer.finish()
    assert not (victim.parent / "planted").exists()


# -- Slurm hook state ------------------------------------------------------------------------

ENV = {"SLURM_JOB_ID": "5", "SLURM_JOB_UID": "1001", "SLURM_JOB_USER": "alice"}


def hook_settings(state_dir, tmp_path) -> hooks.HookSettings:
    (tmp_path / "proc").mkdir(exist_ok=True)
    (tmp_path / "etc").mkdir(exist_ok=True)
    return hooks.HookSettings(
        hook="prolog",
        state_dir=str(state_dir),
        procfs_root=str(tmp_path / "proc"),
        etc_root=str(tmp_path / "etc"),
        host_name="gpu017",
        nvml_json=str(tmp_path / "nvml.json"),
    )


def test_hook_state_is_private_whatever_the_umask(tmp_path):
    (tmp_path / "nvml.json").write_text('{"devices": []}')
    with umask(0o022):
        hooks.run_hook(hook_settings(tmp_path / "state", tmp_path), ENV)
    assert (tmp_path / "state" / "jobs" / "5.json").is_file()
    assert_private_tree(tmp_path / "state")


@as_root
def test_hook_state_dir_of_another_user_is_refused_and_the_job_still_runs(shared, tmp_path, capsys):
    as_user("alice", "mkdir", str(shared / "state"))
    hooks.run_hook(hook_settings(shared / "state", tmp_path), ENV)  # never raises
    assert "belongs to alice" in capsys.readouterr().err
    assert os.listdir(shared / "state") == []

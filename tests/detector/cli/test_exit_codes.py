"""Exit codes of every sub-command when something breaks: a crash is never 1 ("alerts"),
a sensor module that cannot be imported is an unavailable source, and the Slurm hooks exit 0
whatever happens (a failing prolog or epilog drains the node)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest


def hpcsec(tmp_path: Path, *args: str, broken: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    """Run the command line with the modules `broken` made impossible to import."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(
        "import sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in broken)
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    return subprocess.run(
        [sys.executable, "-m", "hpcsec.detector.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=tmp_path,
    )


def statuses(stdout: str) -> dict[str, str]:
    out = {}
    for line in stdout.splitlines():
        event = json.loads(line)
        if event["event.category"] == "sensor_status":
            out[event["hpcsec.sensor"]] = event["event.action"]
    return out


SOCKETS = "hpcsec.sensors.sockets"


def test_collect_reports_a_sensor_that_cannot_be_imported_as_unavailable(tmp_path):
    run = hpcsec(tmp_path, "collect", "--sensor", "sockets", "--sensor", "process", "--raw",
                 broken=(SOCKETS,))  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert statuses(run.stdout) == {"sockets": "unavailable", "process": "ok"}


def test_collect_snapshot_records_despite_a_sensor_that_cannot_be_imported(tmp_path):
    snap = tmp_path / "snap"
    run = hpcsec(tmp_path, "collect", "--sensor", "sockets", "--sensor", "process",
                 "--snapshot", str(snap), broken=(SOCKETS,))  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "cannot load the sensor" in run.stdout + run.stderr
    assert (snap / "meta.json").is_file()


def test_scan_runs_the_other_sensors_when_one_cannot_be_imported(tmp_path):
    run = hpcsec(tmp_path, "scan", "--sensor", "sockets", "--sensor", "process",
                 "--format", "json", broken=(SOCKETS,))  # fmt: skip
    assert run.returncode in (0, 1), run.stderr  # alerts or none: never a crash
    assert "hpcsec: sensor sockets: unavailable" in run.stderr
    assert "unavailable: cannot load the sensor: ModuleNotFoundError" in run.stderr
    assert "hpcsec: sensor process: ok" in run.stderr


def test_a_crash_in_scan_exits_3_never_1(tmp_path):
    run = hpcsec(tmp_path, "scan", "--demo", broken=("hpcsec.detector.engine.evaluate",))
    assert run.returncode == 3
    assert run.stderr.splitlines()[-1].startswith("hpcsec: internal error: ")


@pytest.mark.parametrize("hook", ["prolog", "epilog"])
def test_slurm_hooks_exit_0_on_bad_arguments(tmp_path, hook):
    run = hpcsec(tmp_path, "slurm", hook, "--no-such-option")
    assert run.returncode == 0
    assert "unrecognized arguments: --no-such-option" in run.stderr


@pytest.mark.parametrize("hook", ["prolog", "epilog"])
def test_slurm_hooks_exit_0_when_their_module_cannot_be_imported(tmp_path, hook):
    run = hpcsec(tmp_path, "slurm", hook, broken=("hpcsec.detector.slurm.hooks",))
    assert run.returncode == 0
    assert "internal error" in run.stderr


def test_slurm_hook_help_still_exits_0(tmp_path):
    assert hpcsec(tmp_path, "slurm", "prolog", "--help").returncode == 0


def test_collect_refuses_rules_with_a_snapshot_it_replays(tmp_path):
    """What a snapshot kept of a command line was decided when it was recorded: --rules
    would change nothing, so it is refused rather than ignored."""
    run = hpcsec(tmp_path, "collect", "--from-snapshot", str(tmp_path), "--rules", "x.yml")
    assert run.returncode == 2
    assert "--rules goes with a live collect" in run.stderr

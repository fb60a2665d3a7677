"""Shared fixtures. `slurm_cluster`: one real Slurm cluster for the whole test session.

The suite runs in parallel (pytest-xdist, `make test`): every test that needs the cluster
is sent to one worker (`xdist_group`, with `--dist loadgroup`), so a run starts one cluster
and its jobs never compete with another worker's.
"""

from __future__ import annotations

import shutil

import pytest
import slurm_harness

SLURM_GROUP = "slurm-cluster"
# Fixtures of a node user attacking the places hpcsec writes (shared, victim).
pytest_plugins = ["tests.hostile_fs"]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "slurm_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.xdist_group(SLURM_GROUP))


@pytest.fixture(autouse=True)
def private_state_home(tmp_path_factory, monkeypatch):
    """State files (the crash log, a default spool) under the test session's tmp directory,
    never in the home of the user running the tests; subprocesses inherit it."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.getbasetemp() / "state"))


@pytest.fixture(scope="session")
def slurm_cluster():
    """A running single-host Slurm (munged, slurmctld, slurmd) with fake GPUs and the hpcsec
    prolog/epilog configured; skipped when not root or Slurm is not installed (installs
    nothing). Stops exactly the daemons it started."""
    reason = slurm_harness.unavailable_reason()
    if reason:
        pytest.skip(reason)
    slurm_harness.ensure_users()
    cluster = slurm_harness.SlurmCluster.create()
    try:
        cluster.start()
    except Exception:
        cluster.stop()
        raise
    yield cluster
    cluster.stop()
    shutil.rmtree(cluster.kit_dir, ignore_errors=True)

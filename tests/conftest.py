"""Shared fixtures. `slurm_cluster`: one real Slurm cluster for the whole test session."""

from __future__ import annotations

import shutil

import pytest
import slurm_harness


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

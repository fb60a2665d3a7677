"""`hpcsec agent` with the bundled rules on a real Slurm (tests/slurm_harness.py): batch jobs
of alice and bob start after the agent's first job list and end while it runs; their batch
scripts and steps are never "outside any Slurm job", while a process of a user with no job on
the node is."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from tests.detector.runtime.agent_harness import wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.root]

OUTSIDE_ANY_JOB = "9dba2bf4-de8f-4cf6-9a79-ce4e0b5e5454"  # isolation_escape, bundled


def alerts(path: Path) -> list[dict]:
    """The alerts written so far: the agent may be mid-line, so only complete lines."""
    if not path.exists():
        return []
    complete = path.read_bytes().rpartition(b"\n")[0]
    return [orjson.loads(line) for line in complete.splitlines() if line.strip()]


def outside_job(path: Path, pids: set[int]) -> list[dict]:
    return [
        a for a in alerts(path) if a["rule.id"] == OUTSIDE_ANY_JOB and a.get("process.pid") in pids
    ]


@pytest.fixture
def agent(slurm_cluster, tmp_path: Path):
    """The agent on this node's /proc with the bundled rules, reaching the test's Slurm and
    reading its prolog/epilog records; alerts go to a JSONL file."""
    out = tmp_path / "alerts.jsonl"
    config = tmp_path / "site.yml"
    config.write_text("dedup_window_s: 1\n")
    log = tmp_path / "agent.log"
    env = {**slurm_cluster.env, "HPCSEC_STATE_DIR": str(slurm_cluster.state_dir)}
    argv = [
        *(sys.executable, "-m", "hpcsec.detector", "agent", "--config", str(config)),
        *("--sensor", "process", "--interval", "0.5", "--metrics-address", "127.0.0.1:0"),
        *("--spool", str(tmp_path / "spool"), "--output", f"file://{out}"),
    ]
    with open(log, "wb") as sink:
        proc = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT, env=env)
    try:
        wait_for(lambda: "metrics at http://" in log.read_text(), "the agent to start")
        yield out, log
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def job_pids(cluster, job_ids: list[str], until: float) -> set[int]:
    """Every pid `scontrol listpids` names for the jobs (batch script and steps), polled until
    the jobs are gone or `until`."""
    seen: set[int] = set()
    while time.monotonic() < until:
        now = {pid for job in job_ids for pid in cluster.pids(job)}
        seen |= now
        if not now and seen:
            break
        time.sleep(0.2)
    return seen


def stop_marked(marker: str) -> None:
    """End the process this test started as bob, found by its marked argv[0]."""
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes().startswith(
                marker.encode()
            ):
                os.kill(int(entry.name), signal.SIGKILL)
        except OSError:
            pass


def from_marker(alert: dict, marker: str) -> bool:
    lines = [alert.get("process.command_line")] + [
        e.get("process.command_line") for e in alert.get("events", ())
    ]
    return any(marker in (line or "") for line in lines)


def test_job_scripts_and_steps_raise_nothing_a_user_without_job_does(slurm_cluster, agent):
    out, log = agent
    time.sleep(1.5)  # the agent has fetched its first job list: the jobs below are newer
    script = "sleep 2; srun sleep 3; sleep 1"
    jobs = [
        slurm_cluster.sbatch(user, "-J", "agent-live", "--wrap", script)
        for user in ("alice", "bob")
    ]
    pids = job_pids(slurm_cluster, jobs, until=time.monotonic() + 40)
    assert len(pids) >= 4, "the jobs' scripts and steps never ran"
    time.sleep(1.5)  # the last samples of the jobs' processes are evaluated and written
    assert outside_job(out, pids) == [], log.read_text()
    # bob has no job any more: a process of his outside Slurm is what the rule is for
    marker = f"hpcsec-live-{os.getpid()}"
    shell = subprocess.Popen(
        ["runuser", "-u", "bob", "--", "bash", "-c", f"exec -a {marker} sleep 30"], cwd="/tmp"
    )
    try:
        found = wait_for(
            lambda: [
                a for a in alerts(out) if a["rule.id"] == OUTSIDE_ANY_JOB and from_marker(a, marker)
            ],
            "the alert on bob's process outside any job",
            timeout=30,
        )
    finally:
        stop_marked(marker)
        shell.wait(timeout=10)
    assert (found[0]["user.name"], found[0]["rule.title"]) == (
        "bob",
        "Process of a regular user outside any Slurm job",
    )

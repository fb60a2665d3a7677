"""Against a real Slurm (tests/slurm_harness.py): jobs of unprivileged users with fake GPUs."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcsec.detector.config.site import SiteConfig, load_config
from hpcsec.detector.core.schema import new_event
from hpcsec.detector.enrich.enricher import Enricher
from hpcsec.detector.enrich.view import capture_view
from hpcsec.detector.runtime import registry
from hpcsec.detector.runtime.node import live_context
from hpcsec.detector.slurm.jobs import (
    CONTROLLER_TTL_FACTOR,
    STATE_KEY,
    JobContext,
    SlurmCommands,
)
from hpcsec.detector.slurm.parse import parse_listpids
from hpcsec.detector.slurm.sensor import SlurmJobsSensor
from hpcsec.sensors.base import run_sensor

pytestmark = [pytest.mark.slurm, pytest.mark.root]


def context(cluster, **options):
    ctx = live_context(load_config(None), host_name=cluster.node, options=options)
    ctx.state[STATE_KEY] = JobContext(SlurmCommands(env={"SLURM_CONF": str(cluster.conf)}), ttl_s=0)
    return ctx


def uid_of(pid: int) -> int:
    return os.stat(f"/proc/{pid}").st_uid


def kill_if(pid: int, uid: int, marker: str) -> None:
    """Stop a process this test started (by pid, after checking it is still ours)."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        if uid_of(pid) == uid and marker in cmdline:
            os.kill(pid, 9)
    except (OSError, ValueError):
        pass


@pytest.fixture(scope="module")
def work(slurm_cluster):
    work = slurm_cluster.kit_dir / "work"
    work.mkdir(mode=0o1777, exist_ok=True)
    work.chmod(0o1777)
    weights = slurm_cluster.kit_dir / "weights" / "llama-70b"
    weights.mkdir(parents=True, exist_ok=True)
    (weights / "model.safetensors").write_bytes(b"\0" * 4096)
    os.chmod(weights / "model.safetensors", 0o644)
    return work


@pytest.fixture(scope="module")
def two_jobs(slurm_cluster, work):
    """alice: 2 GPUs, account llm-core, holding a weights file open; bob: 1 GPU."""
    weights = slurm_cluster.kit_dir / "weights" / "llama-70b" / "model.safetensors"
    alice = slurm_cluster.sbatch(
        "alice",
        "--gres=gpu:2",
        "-A",
        "llm-core",
        "-J",
        "train",
        "--wrap",
        f"echo $SLURM_JOB_GPUS > {work}/$SLURM_JOB_ID.gpus; exec 3< {weights}; sleep 60",
    )
    bob = slurm_cluster.sbatch(
        "bob",
        "--gres=gpu:1",
        "--wrap",
        f"echo $SLURM_JOB_GPUS > {work}/$SLURM_JOB_ID.gpus; sleep 60",
    )
    jobs = {}
    for user, job_id in (("alice", alice), ("bob", bob)):
        slurm_cluster.wait_state(job_id, ("RUNNING",))
        pids = slurm_cluster.wait_pids(job_id)
        gpus_file = work / f"{job_id}.gpus"
        slurm_cluster.wait_hook_event(job_id, "prolog")
        for _ in range(50):
            if gpus_file.exists() and gpus_file.read_text().strip():
                break
            subprocess.run(["sleep", "0.1"])
        gpus = [int(g) for g in gpus_file.read_text().split(",")]
        jobs[user] = {"id": job_id, "pids": pids, "gpus": gpus}
    yield jobs
    slurm_cluster.run(["scancel", alice, bob], check=False)


def test_pid_to_job_with_fields_and_gpus(slurm_cluster, two_jobs):
    ctx = context(slurm_cluster)
    jc = ctx.state[STATE_KEY]
    jc.refresh(ctx)
    assert jc.reachable is True
    alice, bob = two_jobs["alice"], two_jobs["bob"]
    assert len(alice["gpus"]) == 2 and len(bob["gpus"]) == 1
    assert not set(alice["gpus"]) & set(bob["gpus"])
    for pid in alice["pids"]:
        fields = jc.fields_for_pid(ctx, pid)
        start = fields.pop("slurm.job.start")
        assert start.endswith("Z")
        assert fields == {
            "slurm.job.id": alice["id"],
            "slurm.job.user": "alice",
            "slurm.job.account": "llm-core",
            "slurm.job.partition": "debug",
            "slurm.job.nodes": [slurm_cluster.node],
            "slurm.job.gpus": alice["gpus"],
            "slurm.job.state": "RUNNING",
            "slurm.job.name": "train",
            "slurm.job.step": "batch",
            "slurm.job.id_source": "listpids",
        }
    for pid in bob["pids"]:
        fields = jc.fields_for_pid(ctx, pid)
        assert (fields["slurm.job.id"], fields["slurm.job.user"], fields["slurm.job.gpus"]) == (
            bob["id"],
            "bob",
            bob["gpus"],
        )
        assert "slurm.job.account" not in fields  # no account given, no accounting
    assert jc.fields_for_pid(ctx, os.getpid()) == {}


def test_prolog_recorded_the_allocation(slurm_cluster, two_jobs):
    alice = two_jobs["alice"]
    [prolog] = slurm_cluster.wait_hook_event(alice["id"], "prolog")
    assert (
        prolog["slurm.job.user"],
        prolog["user.id"],
        prolog["slurm.job.gpus"],
        prolog["slurm.job.account"],
        prolog["slurm.job.partition"],
    ) == ("alice", uid_of(next(iter(alice["pids"]))), alice["gpus"], "llm-core", "debug")
    assert (slurm_cluster.state_dir / "jobs" / f"{alice['id']}.json").exists()


def test_environ_claims(slurm_cluster, two_jobs):
    alice_job = two_jobs["alice"]["id"]
    procs = [
        subprocess.Popen(
            [
                "setpriv",
                f"--reuid={user}",
                f"--regid={user}",
                "--init-groups",
                "env",
                f"SLURM_JOB_ID={alice_job}",
                "sleep",
                "29",
            ]
        )
        for user in ("alice", "bob")
    ]
    try:
        ctx = context(slurm_cluster)
        jc = ctx.state[STATE_KEY]
        jc.refresh(ctx)
        own, forged = procs
        deadline = time.monotonic() + 30
        # until env has exec'd sleep (setpriv's and env's own command lines name it too)
        while not all(
            Path(f"/proc/{p.pid}/cmdline").read_bytes().startswith(b"sleep\0") for p in procs
        ):
            assert time.monotonic() < deadline, "setpriv and env did not exec sleep"
            time.sleep(0.05)
        fields = jc.fields_for_pid(ctx, own.pid)
        assert (fields["slurm.job.id"], fields["slurm.job.id_source"]) == (alice_job, "environ")
        assert jc.fields_for_pid(ctx, forged.pid) == {}  # bob cannot borrow alice's job
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_slurm_jobs_sensor_live(slurm_cluster, two_jobs):
    ctx = context(slurm_cluster, slurm_state_dir=str(slurm_cluster.state_dir))
    run = run_sensor(registry.by_name()["slurm_jobs"], SlurmJobsSensor(), ctx)
    assert run.ok
    present = {e["slurm.job.id"]: e for e in run.events if e["event.action"] == "present"}
    for user in ("alice", "bob"):
        event = present[two_jobs[user]["id"]]
        assert event["slurm.node.users"] == ["alice", "bob"]
        assert event["slurm.job.gpus"] == two_jobs[user]["gpus"]
    prologs = {e["slurm.job.id"] for e in run.events if e["event.action"] == "prolog"}
    assert {two_jobs["alice"]["id"], two_jobs["bob"]["id"]} <= prologs


def enrich(events: list, ctx) -> list:
    """As the agent does: capture the node with the events, then enrich from the view."""
    view = capture_view(ctx, events)
    out = Enricher(SiteConfig()).enrich(events, view)
    out.extend(view.status_events())  # as the runtime adds them, once per capture
    return out


def test_file_access_of_alices_job_carries_her_job(slurm_cluster, two_jobs):
    """End to end: fd walk of the file_access sensor, then Slurm enrichment."""
    weights = slurm_cluster.kit_dir / "weights"
    ctx = context(slurm_cluster, watch=[str(weights)])
    run = run_sensor(
        registry.by_name()["file_access"], registry.by_name()["file_access"].factory(), ctx
    )
    assert run.ok, run.status["message"]
    events = enrich(run.events, ctx)
    alice = two_jobs["alice"]
    hits = [e for e in events if e.get("process.pid") in alice["pids"]]
    assert hits, events
    for event in hits:
        assert event["file.path"] == str(weights / "llama-70b" / "model.safetensors")
        assert (
            event["user.name"],
            event["slurm.job.id"],
            event["slurm.job.account"],
            event["slurm.job.partition"],
            event["slurm.job.user"],
        ) == ("alice", alice["id"], "llm-core", "debug", "alice")


def test_epilog_reports_lingering_process(slurm_cluster, two_jobs):
    """A process that escapes its job (setsid) outlives it; the epilog names it, and not
    the processes of alice's other, still running, job. (The epilog looks at the whole host:
    where another test cluster runs alice's jobs too, it rightly reports those as well, so the
    escapee is picked by its own command line.)"""
    marker = f"sleep 171.{os.getpid()}"  # GNU sleep takes a fraction: unique on the host
    job = slurm_cluster.sbatch(
        "alice", "--wrap", f"setsid nohup {marker} >/dev/null 2>&1 </dev/null & sleep 1"
    )
    alice_uid = uid_of(next(iter(two_jobs["alice"]["pids"])))
    try:
        [epilog] = slurm_cluster.wait_hook_event(job, "epilog", timeout=60)
        findings = slurm_cluster.wait_hook_event(job, "epilog_findings")
        assert "hpcsec.findings" not in epilog
        count = int(epilog["message"].split()[0])
        assert epilog["message"] == f"{count} findings: lingering_process"
        ours = [f for f in findings if f["process.command_line"] == marker]
        assert [
            (f["process.name"], f["user.name"], f["hpcsec.findings"], f["process.env.SLURM_JOB_ID"])
            for f in ours
        ] == [("sleep", "alice", ["lingering_process"], job)]
        listed = {pid for j in (two_jobs["alice"]["id"], job) for pid in slurm_cluster.pids(j)}
        assert not {f["process.pid"] for f in findings} & (listed | set(two_jobs["alice"]["pids"]))
        assert not (slurm_cluster.state_dir / "jobs" / f"{job}.json").exists()
        [prolog] = slurm_cluster.wait_hook_event(job, "prolog")
        assert epilog["slurm.job.start"] == prolog["slurm.job.start"]
    finally:
        for event in slurm_cluster.hook_events():
            if event.get("slurm.job.id") == job and "process.pid" in event:
                kill_if(event["process.pid"], alice_uid, marker)


def test_unreachable_slurm_is_one_status(tmp_path, slurm_cluster):
    ctx = context(slurm_cluster)
    jc = JobContext(SlurmCommands(timeout_s=1, env={"SLURM_CONF": str(tmp_path / "none")}), ttl_s=0)
    ctx.state[STATE_KEY] = jc
    batches = [
        enrich(
            [
                new_event(
                    "process",
                    "sample",
                    "process",
                    "vm",
                    ctx.timestamp,
                    {"process.pid": os.getpid()},
                )
            ],
            ctx,
        )
        for _ in range(2)
    ]
    assert [[e["event.category"] for e in b] for b in batches] == [
        ["process", "sensor_status"],
        ["process"],
    ]
    # without a config, the Slurm commands either fail or hang looking for one: both are
    # bounded (the node's listpids is asked first)
    assert re.match(
        r"Slurm unreachable, events carry no job: scontrol listpids "
        r"(exited 1: .+|timed out after 1s)$",
        batches[0][1]["message"],
    )


def test_snapshot_replays_the_slurm_inputs(slurm_cluster, two_jobs, tmp_path):
    """`collect --snapshot` keeps squeue/listpids output; replaying it needs no Slurm."""
    snap = tmp_path / "snap"
    hpcsec = [
        sys.executable,
        "-m",
        "hpcsec.detector.cli.main",
        "collect",
        "--sensor",
        "slurm_jobs",
        "--host-name",
        slurm_cluster.node,
    ]
    live = subprocess.run(
        [*hpcsec, "--snapshot", str(snap)],
        env=slurm_cluster.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert live.returncode == 0, live.stderr
    sample = snap / "0"
    assert {"slurm-jobs.json", "slurm-listpids.txt"} <= {p.name for p in sample.iterdir()}
    replay = subprocess.run(
        [*hpcsec, "--from-snapshot", str(snap)],
        env={**slurm_cluster.env, "SLURM_CONF": "/nonexistent"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert replay.returncode == 0, replay.stderr
    events = [json.loads(line) for line in replay.stdout.splitlines()]
    present = {
        e["slurm.job.id"]: e["slurm.job.user"] for e in events if e["event.action"] == "present"
    }
    assert present[two_jobs["alice"]["id"]] == "alice"
    assert present[two_jobs["bob"]["id"]] == "bob"


def site_config(path: Path, weights: Path) -> Path:
    path.write_text(
        "assets:\n"
        "  - name: llama-70b\n"
        "    kind: model\n"
        f'    paths: ["{weights}/llama-70b/**"]\n'
        "    readers: {accounts: [llm-core]}\n"
    )
    return path


def hpcsec(cluster, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hpcsec.detector.cli.main", *argv],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_cli_collect_attributes_readers_that_exit_at_once(slurm_cluster, work, tmp_path):
    """`hpcsec collect --sensor file_access --duration` (fanotify) while alice's job reads the
    weights with `cat`s that exit right away: by enrichment every reader is gone, and each
    event still carries her job (found through the job script that started the reader)."""
    weights = slurm_cluster.kit_dir / "weights"
    model = weights / "llama-70b" / "model.safetensors"
    job = slurm_cluster.sbatch(
        "alice",
        "-A",
        "llm-core",
        "-J",
        "reader",
        "--wrap",
        f"while :; do cat {model} >/dev/null; sleep 0.1; done",
    )
    try:
        slurm_cluster.wait_state(job, ("RUNNING",))
        script = slurm_cluster.wait_pids(job)
        out = hpcsec(
            slurm_cluster,
            "collect",
            "--sensor",
            "file_access",
            "--config",
            str(site_config(tmp_path / "site.yml", weights)),
            "--duration",
            "1.5",
            "--host-name",
            slurm_cluster.node,
        )
        assert out.returncode == 0, out.stderr
        events = [json.loads(line) for line in out.stdout.splitlines()]
        reads = [
            e
            for e in events
            if e["event.category"] == "file_access" and e.get("process.name") == "cat"
        ]
        assert reads, out.stdout + out.stderr
        # the readers had exited when collect enriched their events (a reused pid aside)
        assert any(not Path(f"/proc/{e['process.pid']}").exists() for e in reads)
        for event in reads:
            assert event["process.pid"] not in script  # a reader, not the script listpids saw
            assert (
                event["file.path"],
                event["user.name"],
                event["slurm.job.id"],
                event["slurm.job.user"],
                event["slurm.job.account"],
                event["slurm.job.partition"],
                event["slurm.job.id_source"],
                event["slurm.job.step"],
                event["hpcsec.asset.name"],
                event["hpcsec.asset.read_allowed"],
            ) == (
                str(model),
                "alice",
                job,
                "alice",
                "llm-core",
                "debug",
                "listpids",
                "batch",
                "llama-70b",
                True,
            )
    finally:
        slurm_cluster.run(["scancel", job], check=False)


def test_cli_scan_alerts_with_the_readers_job(slurm_cluster, two_jobs, work, tmp_path):
    """`hpcsec scan` on the live node: bob's job (no llm-core account) holds the weights open
    -> an alert naming bob's job; alice's job (llm-core) reads them too, and is allowed."""
    weights = slurm_cluster.kit_dir / "weights"
    model = weights / "llama-70b" / "model.safetensors"
    job = slurm_cluster.sbatch("bob", "-J", "exfil", "--wrap", f"exec 3< {model}; sleep 60")
    try:
        slurm_cluster.wait_state(job, ("RUNNING",))
        slurm_cluster.wait_pids(job)
        out = hpcsec(
            slurm_cluster,
            "scan",
            "--sensor",
            "file_access",
            "--config",
            str(site_config(tmp_path / "site.yml", weights)),
            "--format",
            "json",
            "--no-dedup",
        )
        assert out.returncode == 1, out.stderr
        alerts = json.loads(out.stdout)
        denied = [
            a
            for a in alerts
            if a["rule.title"] == "Model weights read by an account not allowed for that model"
        ]
        # the job script holds the descriptor and hands it down to sleep
        assert sorted(
            (a["slurm.job.id"], a["slurm.job.user"], a["user.name"], a["process.name"])
            for a in denied
        ) == [(job, "bob", "bob", "sleep"), (job, "bob", "bob", "slurm_script")]
        assert not any(a.get("slurm.job.id") == two_jobs["alice"]["id"] for a in denied)
    finally:
        slurm_cluster.run(["scancel", job], check=False)


def test_srun_step_gets_its_job_step_and_gpu(slurm_cluster, two_jobs):
    """An interactive `srun --gres=gpu:1` of bob: its task is step 0 of its own job."""
    srun = subprocess.Popen(
        ["runuser", "-u", "bob", "--", "srun", "--gres=gpu:1", "-J", "interactive", "sleep", "37"],
        env=slurm_cluster.env,
        cwd="/tmp",
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        job = ""
        for _ in range(150):
            job = slurm_cluster.run(
                ["squeue", "-h", "-u", "bob", "-n", "interactive", "-o", "%i"]
            ).stdout.strip()
            if job:
                break
            subprocess.run(["sleep", "0.2"])
        assert job, "srun job never showed in squeue"
        pids = slurm_cluster.wait_pids(job, step="0")
        # listpids also names step helpers that may exit while we look: read each once
        [task] = [p for p, step in pids.items() if step == "0" and _comm(p) == "sleep"]
        ctx = context(slurm_cluster)
        jc = ctx.state[STATE_KEY]
        jc.refresh(ctx)
        fields = jc.fields_for_pid(ctx, task)
        assert (
            fields["slurm.job.id"],
            fields["slurm.job.user"],
            fields["slurm.job.name"],
            fields["slurm.job.step"],
            fields["slurm.job.id_source"],
        ) == (job, "bob", "interactive", "0", "listpids")
        [gpu] = fields["slurm.job.gpus"]
        taken = set(two_jobs["alice"]["gpus"]) | set(two_jobs["bob"]["gpus"])
        assert gpu not in taken and 0 <= gpu < slurm_cluster.fake_gpus
    finally:
        srun.kill()
        srun.wait()
        if job:
            slurm_cluster.run(["scancel", job], check=False)


def test_cache_refreshed_by_job_start_and_end(slurm_cluster, two_jobs):
    """A long TTL: the job table is still re-read when the prolog/epilog record a job."""
    ctx = context(slurm_cluster)
    jc = JobContext(
        SlurmCommands(env={"SLURM_CONF": str(slurm_cluster.conf)}),
        ttl_s=3600,
        events_file=str(slurm_cluster.state_dir / "slurm-events.jsonl"),
    )
    jc.refresh(ctx)
    before = jc.refreshes
    job = slurm_cluster.sbatch("alice", "-J", "late", "--wrap", "sleep 45")
    try:
        slurm_cluster.wait_state(job, ("RUNNING",))
        pids = slurm_cluster.wait_pids(job)
        slurm_cluster.wait_hook_event(job, "prolog")
        jc.refresh(ctx)
        assert jc.refreshes == before + 1
        assert {jc.fields_for_pid(ctx, pid).get("slurm.job.name") for pid in pids} == {"late"}
        assert job in [j.job_id for j in jc.jobs_on(slurm_cluster.node)]
    finally:
        slurm_cluster.run(["scancel", job], check=False)
    slurm_cluster.wait_hook_event(job, "epilog")
    jc.refresh(ctx)
    assert jc.refreshes == before + 2
    # the epilog runs while the job completes: it may still say so, never RUNNING
    assert jc.job(job).state in ("COMPLETING", "CANCELLED")


def _comm(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:  # exited between listpids and now
        return None


def listed_here(jc: JobContext) -> set[str]:
    """The jobs `scontrol listpids` names on this node."""
    return {pid.job_id for pid in parse_listpids(jc.commands.listpids()).pids.values()}


def test_the_controller_is_asked_again_when_this_nodes_jobs_change(slurm_cluster, two_jobs):
    """Against slurmctld: a node whose jobs all run, as listpids lists them, reuses the
    controller's last answer for up to CONTROLLER_TTL_FACTOR TTLs; a job starting or ending
    here is asked about (docs/slurm.md, Controller load)."""
    asked: list[float] = []
    now = [1000.0]

    class Counted(SlurmCommands):
        def jobs_json(self) -> str:
            asked.append(now[0])
            return super().jobs_json()

    jc = JobContext(
        Counted(env={"SLURM_CONF": str(slurm_cluster.conf)}), ttl_s=30, clock=lambda: now[0]
    )
    ctx = context(slurm_cluster)

    def after_ttls(count: int) -> int:
        """Refresh once per TTL, `count` times: how many times the controller was asked."""
        before = len(asked)
        for _ in range(count):
            now[0] += jc.ttl_s
            jc.refresh(ctx)
        return len(asked) - before

    job = slurm_cluster.sbatch("bob", "-J", "steady", "--wrap", "sleep 120")
    try:
        slurm_cluster.wait_state(job, ("RUNNING",))
        slurm_cluster.wait_pids(job)
        assert after_ttls(1) == 1 and jc.job(job).state == "RUNNING"
        # every job here running and listed: not asked at each of 5 TTLs (at most twice:
        # the other tests' two jobs may end meanwhile)
        assert after_ttls(5) <= 2
        # the answer's age is bounded: asked again within CONTROLLER_TTL_FACTOR TTLs
        assert after_ttls(CONTROLLER_TTL_FACTOR) >= 1
        started = slurm_cluster.sbatch("alice", "-J", "new", "--wrap", "sleep 120")
        try:
            slurm_cluster.wait_state(started, ("RUNNING",))
            slurm_cluster.wait_pids(started)
            deadline = time.monotonic() + 30
            while started not in listed_here(jc) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert after_ttls(1) == 1  # listpids names a job the last answer did not place here
            assert jc.job(started).state == "RUNNING"
        finally:
            slurm_cluster.run(["scancel", started], check=False)
        # until the node's listpids (what the refresh reads) no longer names it: its
        # processes are gone (`scontrol listpids JOB` may stop answering before that)
        deadline = time.monotonic() + 30
        while started in listed_here(jc) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert started not in listed_here(jc)
        assert after_ttls(1) == 1  # its processes are gone from listpids: asked
        assert jc.job(started).state != "RUNNING"
    finally:
        slurm_cluster.run(["scancel", job], check=False)

import json
from pathlib import Path

from hpcsec.detector.config.site import SiteConfig
from hpcsec.detector.core.schema import new_event
from hpcsec.detector.engine.evaluate import Engine
from hpcsec.detector.engine.loader import load_rules
from hpcsec.detector.enrich.enricher import Enricher
from hpcsec.detector.enrich.view import capture_view
from hpcsec.detector.slurm.jobs import STATE_KEY, JobContext, SlurmUnreachable
from hpcsec.sensors.base import FsRoot, SensorContext

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "slurm"
REPLAY = {
    "slurm-jobs.json": (FIX / "squeue-22.05.json").read_text(),
    "slurm-listpids.txt": (FIX / "listpids-1.txt").read_text() + "30001 3 batch 0 0\n",
}
TS = "2026-11-30T01:33:00.000Z"


def ctx_for(root: Path, replay=REPLAY) -> SensorContext:
    (root / "proc").mkdir(exist_ok=True)
    return SensorContext(
        "vm",
        FsRoot("sys", root),
        FsRoot("proc", root / "proc"),
        FsRoot("etc", root),
        timestamp=TS,
        replay_inputs=replay,
    )


def enrich(events: list[dict], ctx: SensorContext, jobs: JobContext | None = None) -> list[dict]:
    """Capture the node where the events were read, then enrich from that view alone."""
    ctx.state.setdefault(STATE_KEY, jobs or JobContext())
    view = capture_view(ctx, events)
    out = Enricher(SiteConfig()).enrich(events, view)
    out.extend(view.status_events())  # as the runtime adds them, once per capture
    return out


def gpu_event(pid: int, index: int) -> dict:
    return new_event(
        "gpu_process", "sample", "gpu", "vm", TS, {"process.pid": pid, "gpu.index": index}
    )


def test_events_get_their_jobs_fields(tmp_path):
    ctx = ctx_for(tmp_path)
    events = [
        new_event(
            "file_access",
            "open",
            "file_access",
            "vm",
            TS,
            {"process.pid": 19315, "file.path": "/models/x"},
        ),
        new_event("rdma_qp", "sample", "rdma_qp", "vm", TS, {"process.pid": 30001}),
        new_event("process", "sample", "process", "vm", TS, {"process.pid": 4242}),
        new_event("firmware", "sample", "firmware", "vm", TS, {"firmware.component": "bios"}),
    ]
    out = enrich(events, ctx)
    assert out is events and len(out) == 4
    assert {k: v for k, v in out[0].items() if k.startswith("slurm.")} == {
        "slurm.job.id": "1",
        "slurm.job.user": "alice",
        "slurm.job.partition": "debug",
        "slurm.job.nodes": ["vm"],
        "slurm.job.gpus": [0, 1],
        "slurm.job.state": "RUNNING",
        "slurm.job.start": "2026-11-30T01:32:33.000Z",
        "slurm.job.name": "wrap",
        "slurm.job.id_source": "listpids",
        "slurm.job.step": "0",
    }
    assert (out[1]["slurm.job.id"], out[1]["slurm.job.user"]) == ("3", "bob")
    assert "slurm.job.id" not in out[2]  # no job: no field at all (rules test null)
    assert not any(k.startswith("slurm.") for k in out[3])


def test_gpu_allocated_to_job(tmp_path):
    ctx = ctx_for(tmp_path)
    events = [gpu_event(19315, 1), gpu_event(19315, 2), gpu_event(30001, 2), gpu_event(4242, 0)]
    enrich(events, ctx)
    assert [e["gpu.allocated_to_job"] for e in events] == [True, False, True, False]


def test_gpu_allocation_unknown_is_left_out(tmp_path):
    jobs = '{"jobs": [{"job_id": 1, "nodes": "vm", "job_state": "RUNNING"}]}'
    ctx = ctx_for(
        tmp_path, {"slurm-jobs.json": jobs, "slurm-listpids.txt": "PID JOBID STEPID\n19315 1 0\n"}
    )
    [event] = enrich([gpu_event(19315, 0)], ctx)
    assert event["slurm.job.id"] == "1" and "gpu.allocated_to_job" not in event


def test_hook_events_keep_their_job(tmp_path):
    ctx = ctx_for(tmp_path)
    event = new_event(
        "slurm_job",
        "epilog_findings",
        "slurm_epilog",
        "vm",
        TS,
        {"process.pid": 19315, "slurm.job.id": "9"},
    )
    enrich([event], ctx)
    assert event["slurm.job.id"] == "9" and "slurm.job.user" not in event


class DownCommands:
    def available(self):
        return True

    def jobs_json(self):
        raise SlurmUnreachable(
            "squeue --json exited 1: slurm_load_jobs error: "
            "Unable to contact slurm controller (connect failure)"
        )

    listpids = jobs_detail = jobs_json


def test_slurm_down_events_flow_with_one_status(tmp_path):
    ctx = ctx_for(tmp_path, replay=None)
    jobs = JobContext(DownCommands(), ttl_s=0)
    first = enrich([gpu_event(19315, 0)], ctx, jobs)
    second = enrich([gpu_event(19315, 0)], ctx, jobs)
    assert [e["event.category"] for e in first] == ["gpu_process", "sensor_status"]
    assert first[1]["message"].endswith("Unable to contact slurm controller (connect failure)")
    assert [e["event.category"] for e in second] == ["gpu_process"]
    # unknown is not "no": neither a job nor "not in its allocation" is concluded
    assert "slurm.job.id" not in second[0] and "gpu.allocated_to_job" not in second[0]


def test_slurm_down_raises_the_bundled_self_health_alert_once(tmp_path):
    """The status the job context emits is what the bundled self-health rule matches."""
    ctx = ctx_for(tmp_path, replay=None)
    jobs = JobContext(DownCommands(), ttl_s=0)
    engine = Engine(load_rules(None, with_tests=False), placeholders=SiteConfig().placeholders())
    matches = [
        m for _ in range(3) for m in engine.evaluate(enrich([gpu_event(19315, 0)], ctx, jobs))
    ]
    titles = [m.rule.sigma.title for m in [*matches, *engine.flush()]]
    assert titles.count("Slurm unreachable from the node") == 1
    assert not any("outside" in t for t in titles)  # unknown is not "no job"


def test_process_gone_uses_what_the_sensor_saw(tmp_path):
    ctx = ctx_for(tmp_path)
    cgroup = "6:freezer:/slurm_vm/uid_1002/job_3/step_0\n0::/"
    events = [
        new_event(
            "file_access",
            "read",
            "file_access",
            "vm",
            TS,
            {"process.pid": 5001, "process.cgroup": cgroup},
        ),
        new_event(
            "file_access",
            "read",
            "file_access",
            "vm",
            TS,
            {"process.pid": 5002, "process.env.SLURM_JOB_ID": "1", "user.id": 1001},
        ),
        new_event(
            "file_access",
            "read",
            "file_access",
            "vm",
            TS,
            {"process.pid": 5003, "process.env.SLURM_JOB_ID": "1", "user.id": 1002},
        ),
    ]
    enrich(events, ctx)
    assert [(e.get("slurm.job.id"), e.get("slurm.job.id_source")) for e in events] == [
        ("3", "cgroup"),
        ("1", "environ"),
        (None, None),
    ]


def node_events() -> list[dict]:
    return [
        new_event("rdma_counters", "sample", "rdma_counters", "vm", TS, {"rdma.device": "mlx5_0"}),
        new_event("gpu_device", "sample", "gpu", "vm", TS, {"gpu.index": 0}),
        new_event("firmware", "sample", "firmware", "vm", TS, {"firmware.component": "bios"}),
    ]


def test_node_events_get_the_running_job_count(tmp_path):
    events = enrich(node_events(), ctx_for(tmp_path))
    # squeue-22.05.json: jobs 1 (alice) and 3 (bob) RUNNING on vm, others pending or done
    assert [e.get("slurm.node.job_count") for e in events] == [2, 2, None]
    idle = '{"jobs": [{"job_id": 1, "nodes": "vm", "job_state": "COMPLETED"}]}'
    events = enrich(node_events(), ctx_for(tmp_path, {"slurm-jobs.json": idle}))
    assert [e.get("slurm.node.job_count") for e in events] == [0, 0, None]


def test_node_job_count_left_out_while_slurm_is_down(tmp_path):
    ctx = ctx_for(tmp_path, replay=None)
    events = enrich(node_events(), ctx, JobContext(DownCommands(), ttl_s=0))
    assert [e["event.category"] for e in events] == [
        "rdma_counters",
        "gpu_device",
        "firmware",
        "sensor_status",
    ]
    assert not any("slurm.node.job_count" in e for e in events)


def test_user_has_job_on_node(tmp_path):
    """squeue-22.05.json: alice (1001) and bob (1002) have running jobs on vm."""

    def proc(uid, name):
        return new_event(
            "process",
            "present",
            "process",
            "vm",
            TS,
            {"process.pid": 4242, "user.id": uid, "user.name": name},
        )

    events = [
        proc(1001, "alice"),
        proc(1003, "carol"),
        proc(0, "root"),
        new_event(
            "file_access", "open", "file_access", "vm", TS, {"user.name": "bob", "file.path": "/x"}
        ),
        new_event("firmware", "sample", "firmware", "vm", TS, {"firmware.device": "x"}),
    ]
    enrich(events, ctx_for(tmp_path))
    assert [e.get("slurm.node.user_has_job") for e in events] == [True, False, False, True, None]
    assert "slurm.job.id" not in events[0]  # alice has a job here, this process is not in it


NEW_JOB = {
    "job_id": 7,
    "user_name": "alice",
    "user_id": 1001,
    "nodes": "vm",
    "job_state": "RUNNING",
    "start_time": 1796002353,
}


class StartingJobCommands:
    """Slurm whose job list gains job 7 (alice) from the second fetch on; counts fetches."""

    def __init__(self):
        self.fetches = 0
        self.listed = 0

    def available(self):
        return True

    def jobs_json(self):
        self.fetches += 1
        jobs = [NEW_JOB] if self.fetches > 1 else []
        return json.dumps({"jobs": jobs})

    def listpids(self):  # asked first at each refresh
        self.listed += 1
        return "PID JOBID STEPID\n7001 7 batch\n" if self.listed > 1 else ""

    def jobs_detail(self):
        return ""


def claiming(pid: int, job_id: str, uid: int = 1001, name: str = "alice") -> dict:
    fields = {"process.pid": pid, "user.id": uid, "user.name": name}
    fields["process.env.SLURM_JOB_ID"] = job_id
    return new_event("process", "present", "process", "vm", TS, fields)


def test_a_job_newer_than_the_cache_is_fetched_at_once(tmp_path):
    """The batch script of a job that started after the last fetch names its job only in its
    environment (no Slurm cgroup, not in the cached listpids): the table is fetched again."""
    ctx, now = ctx_for(tmp_path, replay=None), [0.0]
    commands = StartingJobCommands()
    jobs = JobContext(commands, ttl_s=30, clock=lambda: now[0])
    enrich([], ctx, jobs)
    jobs.refresh(ctx)  # the sample before the job started
    now[0] = 5.0
    [event] = enrich([claiming(7001, "7")], ctx, jobs)
    assert commands.fetches == 2
    assert (event["slurm.job.id"], event["slurm.job.id_source"]) == ("7", "listpids")
    assert event["slurm.node.user_has_job"] is True


def test_a_claimed_job_stays_undecided_until_a_fresh_list(tmp_path):
    ctx, now = ctx_for(tmp_path, replay=None), [0.0]
    commands = StartingJobCommands()
    jobs = JobContext(commands, ttl_s=30, clock=lambda: now[0])
    jobs.refresh(ctx)
    now[0] = 0.2  # the list was fetched a moment ago: no second fetch yet (rate limit)
    [event] = enrich([claiming(7001, "7")], ctx, jobs)
    assert commands.fetches == 1
    assert "slurm.job.id" not in event and "slurm.node.user_has_job" not in event
    now[0] = 2.0  # the next sample may fetch again, and the job is there
    [event] = enrich([claiming(7001, "7")], ctx, jobs)
    assert commands.fetches == 2 and event["slurm.job.id"] == "7"


def test_a_forged_job_id_is_decided_by_one_fresh_list(tmp_path):
    ctx, now = ctx_for(tmp_path, replay=None), [0.0]
    commands = StartingJobCommands()
    jobs = JobContext(commands, ttl_s=30, clock=lambda: now[0])
    jobs.refresh(ctx)
    now[0] = 5.0
    [event] = enrich([claiming(6666, "99999", 1003, "mallory")], ctx, jobs)
    assert commands.fetches == 2
    assert "slurm.job.id" not in event and event["slurm.node.user_has_job"] is False
    now[0] = 10.0  # the same forged claim again: no more fetches for it
    [again] = enrich([claiming(6666, "99999", 1003, "mallory")], ctx, jobs)
    assert commands.fetches == 2 and again["slurm.node.user_has_job"] is False


def test_gpu_process_outside_jobs_decided_only_with_a_job_list(tmp_path):
    ctx, now = ctx_for(tmp_path, replay=None), [0.0]
    jobs = JobContext(StartingJobCommands(), ttl_s=30, clock=lambda: now[0])
    [event] = enrich([gpu_event(4242, 0)], ctx, jobs)
    assert "slurm.job.id" not in event and event["gpu.allocated_to_job"] is False


def test_a_listed_pid_taken_by_another_users_process_is_not_in_the_job(tmp_path):
    """listpids is cached between refreshes: a job's pid that exited may be taken by another
    user's process (cycling through pids), which must not join the victim's job, GPUs and
    all. The listed pid, or the listed ancestor, must run as the job's owner (or root)."""
    ctx = ctx_for(tmp_path)

    def status(pid: int, uid: int, ppid: int = 1) -> None:
        (tmp_path / "proc" / str(pid)).mkdir(parents=True)
        (tmp_path / "proc" / str(pid) / "status").write_text(
            f"Name:\tx\nPPid:\t{ppid}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
        )

    status(30001, 1003)  # job 3 (bob, 1002) listed it; carol's process has it now
    status(19315, 1001)  # job 1 (alice, 1001): still alice's
    status(19211, 1003)  # job 1's batch step pid, taken by carol ...
    status(4343, 1003, ppid=19211)  # ... whose child would inherit the job through it
    status(19212, 0)  # root in alice's job (a setuid-root helper keeps its real uid; sudo)

    def read(pid: int, **seen) -> dict:
        return new_event("process", "sample", "process", "vm", TS, {"process.pid": pid, **seen})

    events = [read(30001), read(19315), read(4343), read(19212), read(30001, **{"user.id": 1002})]
    enrich(events, ctx)
    assert [e.get("slurm.job.id") for e in events] == [None, "1", None, "1", "3"]


def test_a_child_of_another_user_under_a_listed_pid_gone_since_is_not_in_the_job(tmp_path):
    """carol's process took job 1's freed pid 19211, forked a reader of a model and exited:
    the reader's event names 19211 as its parent and carol's uid; the parent is gone (its
    uid unknown), so its uid could not refuse it. The process's own uid must be the owner's
    (or root's) too."""
    ctx = ctx_for(tmp_path)
    child = {"process.pid": 4343, "process.parent.pid": 19211, "file.path": "/models/x"}
    events = [
        new_event("file_access", "open", "file_access", "vm", TS, {**child, "user.id": 1003}),
        new_event("file_access", "open", "file_access", "vm", TS, {**child, "user.id": 1001}),
        new_event("file_access", "open", "file_access", "vm", TS, dict(child)),  # uid unknown
    ]
    enrich(events, ctx)
    assert [e.get("slurm.job.id") for e in events] == [None, "1", "1"]

import json
import os
from pathlib import Path

import pytest

from hpcsec.detector.slurm.jobs import (
    CONTROLLER_TTL_FACTOR,
    STATE_KEY,
    JobContext,
    SlurmCommands,
    SlurmUnreachable,
    build_table,
    job_context,
)
from hpcsec.detector.slurm.parse import PidJob
from hpcsec.sensors.base import FsRoot, SensorContext

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "slurm"
JOBS_22 = (FIX / "squeue-22.05.json").read_text()
LISTPIDS_1 = (FIX / "listpids-1.txt").read_text()
# jobs 1 and 3 have processes here: every job the 22.05 fixture runs on `vm`
LISTPIDS_13 = LISTPIDS_1 + "20000    3        batch    0       0\n"


def make_proc(
    root: Path,
    pid: int,
    uid: int,
    cgroup: str = "0::/\n",
    environ: bytes = b"PATH=/bin\0",
    ppid: int = 1,
) -> None:
    d = root / "proc" / str(pid)
    d.mkdir(parents=True)
    (d / "status").write_text(
        f"Name:\tsleep\nState:\tS (sleeping)\nPid:\t{pid}\nPPid:\t{ppid}\n"
        f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
    )
    (d / "cgroup").write_text(cgroup)
    (d / "environ").write_bytes(environ)


def make_ctx(root: Path, replay: dict | None = None, host: str = "vm") -> SensorContext:
    (root / "proc").mkdir(exist_ok=True)
    return SensorContext(
        host,
        FsRoot("sys", root / "sys"),
        FsRoot("proc", root / "proc"),
        FsRoot("etc", root / "etc"),
        timestamp="2026-11-30T01:33:00.000Z",
        replay_inputs=replay,
    )


class FakeCommands(SlurmCommands):
    """Serves fixture text as if Slurm printed it; counts the calls."""

    def __init__(self, jobs=JOBS_22, listpids=LISTPIDS_1, detail="", fail=None):
        object.__setattr__(self, "outputs", {"jobs": jobs, "listpids": listpids, "detail": detail})
        object.__setattr__(self, "fail", fail)
        object.__setattr__(self, "calls", [])

    def available(self) -> bool:
        return True

    def _out(self, name: str) -> str:
        self.calls.append(name)
        if self.fail:
            raise SlurmUnreachable(self.fail)
        return self.outputs[name]

    def jobs_json(self) -> str:
        return self._out("jobs")

    def listpids(self) -> str:
        return self._out("listpids")

    def jobs_detail(self) -> str:
        return self._out("detail")


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Recorder:
    def __init__(self):
        self.inputs = []

    def record_file(self, root, rel, data):
        pass

    def record_link(self, root, rel, target):
        pass

    def record_input(self, name, data):
        self.inputs.append(name)


REPLAY = {"slurm-jobs.json": JOBS_22, "slurm-listpids.txt": LISTPIDS_1}


def test_replay_listpids_gives_job_fields(tmp_path):
    make_proc(tmp_path, 19315, 1001)
    ctx = make_ctx(tmp_path, REPLAY)
    jc = JobContext(FakeCommands())
    jc.refresh(ctx)
    assert jc.fields_for_pid(ctx, 19315) == {
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
    assert jc.commands.calls == []  # replay never asks Slurm


def test_cgroup_wins_over_listpids_and_environ(tmp_path):
    make_proc(
        tmp_path,
        19315,
        1002,
        cgroup="6:freezer:/slurm_vm/uid_1002/job_3/step_batch\n0::/\n",
        environ=b"SLURM_JOB_ID=1\0",
    )
    ctx = make_ctx(tmp_path, REPLAY)
    jc = JobContext()
    jc.refresh(ctx)
    assert jc.pid_job(ctx, 19315) == PidJob("3", "batch", "cgroup")
    fields = jc.fields_for_pid(ctx, 19315)
    assert (fields["slurm.job.user"], fields["slurm.job.gpus"]) == ("bob", [2, 3])


def test_environ_is_last_and_only_for_the_jobs_owner(tmp_path):
    make_proc(tmp_path, 500, 1001, environ=b"SLURM_JOB_ID=1\0SLURM_STEP_ID=0\0")
    make_proc(tmp_path, 501, 1002, environ=b"SLURM_JOB_ID=1\0")  # bob claims alice's job
    make_proc(tmp_path, 502, 1001, environ=b"SLURM_JOB_ID=99\0")  # no such job
    make_proc(tmp_path, 503, 1001)
    ctx = make_ctx(tmp_path, REPLAY)
    jc = JobContext()
    jc.refresh(ctx)
    assert jc.pid_job(ctx, 500) == PidJob("1", "0", "environ")
    assert jc.fields_for_pid(ctx, 500)["slurm.job.id_source"] == "environ"
    assert jc.pid_job(ctx, 500, use_environ=False) is None
    for pid in (501, 502, 503, 404):
        assert jc.fields_for_pid(ctx, pid) == {}


def test_unlisted_process_takes_the_job_of_its_listed_ancestor(tmp_path):
    """listpids ran before these started: a reader the job script spawned is found through
    its parent (live, or as the sensor saw it once the reader has exited)."""
    make_proc(tmp_path, 800, 1001, ppid=19211)  # child of job 1's batch script
    make_proc(tmp_path, 803, 1001, ppid=804)
    make_proc(tmp_path, 804, 1001, ppid=19212)  # grandchild
    make_proc(tmp_path, 805, 1001, ppid=1)  # left its job: re-parented to init
    make_proc(tmp_path, 806, 1001, ppid=806 + 1)
    make_proc(tmp_path, 807, 1001, ppid=806)  # a loop never ends the walk badly
    ctx = make_ctx(tmp_path, REPLAY)
    jc = JobContext()
    jc.refresh(ctx)
    assert jc.pid_job(ctx, 800) == PidJob("1", "batch", "listpids")
    assert jc.pid_job(ctx, 803) == PidJob("1", "batch", "listpids")
    assert jc.pid_job(ctx, 801, seen={"process.parent.pid": 19211}) == PidJob(
        "1", "batch", "listpids"
    )  # exited: its parent as captured
    for pid in (805, 806, 404):
        assert jc.pid_job(ctx, pid) is None


def test_no_ancestor_walk_without_listpids(tmp_path):
    make_proc(tmp_path, 800, 1001, ppid=19211)
    ctx = make_ctx(tmp_path, {"slurm-jobs.json": JOBS_22})
    jc = JobContext()
    jc.refresh(ctx)
    assert jc.pid_job(ctx, 800) is None


def test_what_the_sensor_saw_wins_over_proc_now(tmp_path):
    """The pid was reused after the access: /proc now describes another process."""
    make_proc(
        tmp_path,
        900,
        1002,
        cgroup="0::/system.slice/slurmstepd.scope/job_3/step_0\n",
        environ=b"SLURM_JOB_ID=3\0",
    )
    ctx = make_ctx(tmp_path, REPLAY)
    jc = JobContext()
    jc.refresh(ctx)
    seen_cgroup = {"process.cgroup": "0::/system.slice/slurmstepd.scope/job_1/step_batch"}
    assert jc.pid_job(ctx, 900, seen=seen_cgroup) == PidJob("1", "batch", "cgroup")
    seen_env = {
        "process.cgroup": "0::/user.slice",
        "process.env.SLURM_JOB_ID": "1",
        "user.id": 1001,
    }
    assert jc.pid_job(ctx, 900, seen=seen_env) == PidJob("1", None, "environ")
    assert jc.pid_job(ctx, 900, seen={"process.cgroup": "0::/user.slice"}) == PidJob(
        "3", None, "environ"
    )  # nothing captured from environ: /proc is all we have


def test_job_unknown_to_the_table_still_named(tmp_path):
    make_proc(tmp_path, 700, 1001, cgroup="0::/system.slice/slurmstepd.scope/job_77/step_0\n")
    ctx = make_ctx(tmp_path, REPLAY)
    jc = JobContext()
    jc.refresh(ctx)
    assert jc.fields_for_pid(ctx, 700) == {
        "slurm.job.id": "77",
        "slurm.job.id_source": "cgroup",
        "slurm.job.step": "0",
    }


def test_ttl_cache_and_recording(tmp_path):
    clock, rec = Clock(), Recorder()
    cmds = FakeCommands(listpids=LISTPIDS_13)
    jc = JobContext(cmds, ttl_s=30, clock=clock)
    ctx = make_ctx(tmp_path)
    ctx.recorder = rec
    jc.refresh(ctx)
    assert cmds.calls == ["listpids", "jobs"]  # 22.05 JSON has gres_detail: no detail call
    clock.now += 29
    jc.refresh(ctx)
    assert cmds.calls == ["listpids", "jobs"]
    # every sample of a snapshot gets the inputs, cached or not
    assert rec.inputs == ["slurm-listpids.txt", "slurm-jobs.json"] * 2
    clock.now += 1
    jc.refresh(ctx)
    # the node is asked again; its jobs are the same, so the controller is not
    assert cmds.calls == ["listpids", "jobs", "listpids"]
    assert rec.inputs[-2:] == ["slurm-listpids.txt", "slurm-jobs.json"]
    jc.invalidate()  # a job started or ended
    jc.refresh(ctx)
    assert cmds.calls == ["listpids", "jobs", "listpids", "listpids", "jobs"]
    assert jc.refreshes == 3
    assert [j.job_id for j in jc.jobs_on("vm")] == ["1", "3"]
    assert jc.take_status() == []


def _job_state(jobs_json: str, job_id: int, state: str) -> str:
    doc = json.loads(jobs_json)
    for job in doc["jobs"]:
        if job["job_id"] == job_id:
            job["job_state"] = state
    return json.dumps(doc)


def test_the_controller_is_asked_when_this_nodes_jobs_change_or_its_answer_is_old(tmp_path):
    """Every node's agent asking `squeue --json` (every job of the cluster) every TTL loads
    the controller: its answer is used again while it says this node's jobs are RUNNING and
    they are the ones listpids lists, up to CONTROLLER_TTL_FACTOR TTLs."""
    clock = Clock()
    cmds = FakeCommands(listpids=LISTPIDS_13)
    jc = JobContext(cmds, ttl_s=30, clock=clock)
    ctx = make_ctx(tmp_path)

    def asked_after_a_ttl() -> bool:
        clock.now += 30
        before = cmds.calls.count("jobs")
        jc.refresh(ctx)
        assert cmds.calls[-1 - (cmds.calls.count("jobs") - before)] == "listpids"
        return cmds.calls.count("jobs") > before

    jc.refresh(ctx)
    assert [asked_after_a_ttl() for _ in range(CONTROLLER_TTL_FACTOR)] == [False] * 9 + [True]
    # job 3 ends: its steps are gone from listpids, it is COMPLETING while its epilogs run
    cmds.outputs["listpids"] = LISTPIDS_1
    cmds.outputs["jobs"] = _job_state(JOBS_22, 3, "COMPLETING")
    assert asked_after_a_ttl()
    assert asked_after_a_ttl()  # still completing here: asked at each TTL
    assert [j.state for j in jc.jobs_on("vm")] == ["RUNNING", "COMPLETING"]
    cmds.outputs["jobs"] = _job_state(JOBS_22, 3, "COMPLETED")
    assert asked_after_a_ttl()
    assert jc.job("3").state == "COMPLETED"
    assert not asked_after_a_ttl()  # settled again
    # a job listpids lists and the controller's answer lacks (new): asked
    cmds.outputs["listpids"] = LISTPIDS_13 + "20001    9        batch    0       0\n"
    assert asked_after_a_ttl()
    assert asked_after_a_ttl()


def test_a_job_here_without_a_process_here_is_asked_about_at_each_ttl(tmp_path):
    """A multi-node job between its steps has no process on this node: the controller's
    answer cannot be checked against listpids, so it is asked at each TTL, as before."""
    clock = Clock()
    cmds = FakeCommands(listpids=LISTPIDS_1)  # jobs 1 and 3 run on `vm`; 3 has no pid here
    jc = JobContext(cmds, ttl_s=30, clock=clock)
    ctx = make_ctx(tmp_path)
    for _ in range(3):
        jc.refresh(ctx)
        clock.now += 30
    assert cmds.calls == ["listpids", "jobs"] * 3


def test_a_job_start_or_end_or_an_unknown_claim_asks_the_controller(tmp_path):
    """What forces a refresh (the hooks' events file, invalidate, a process naming a job
    the table lacks) asks the controller too, even when listpids did not change; so does
    the refresh after one that failed."""
    clock = Clock()
    events = tmp_path / "slurm-events.jsonl"
    cmds = FakeCommands(listpids=LISTPIDS_13)
    jc = JobContext(cmds, ttl_s=30, events_file=str(events), clock=clock)
    ctx = make_ctx(tmp_path)
    jc.refresh(ctx)
    events.write_text('{"event.category": "slurm_job"}\n')  # an epilog ran
    clock.now += 30  # and the TTL is over: the events file still counts
    jc.refresh(ctx)
    assert cmds.calls.count("jobs") == 2
    jc.invalidate()
    jc.refresh(ctx)
    assert cmds.calls.count("jobs") == 3
    clock.now += 5
    jc.refresh(ctx, force=True)  # a process names a job the table lacks
    assert cmds.calls.count("jobs") == 4
    object.__setattr__(cmds, "fail", "squeue --json timed out after 3s")
    clock.now += 30
    jc.refresh(ctx)
    object.__setattr__(cmds, "fail", None)
    clock.now += 30
    jc.refresh(ctx)
    assert cmds.calls[-2:] == ["listpids", "jobs"]


def test_events_file_change_refreshes(tmp_path):
    clock = Clock()
    events = tmp_path / "slurm-events.jsonl"
    jc = JobContext(FakeCommands(), ttl_s=300, events_file=str(events), clock=clock)
    ctx = make_ctx(tmp_path)
    jc.refresh(ctx)
    jc.refresh(ctx)
    assert jc.refreshes == 1
    events.write_text('{"event.category": "slurm_job"}\n')
    jc.refresh(ctx)
    assert jc.refreshes == 2
    jc.refresh(ctx)
    assert jc.refreshes == 2
    os.utime(events, (1, 1))
    jc.refresh(ctx)
    assert jc.refreshes == 3


def test_unreachable_gives_one_status_then_recovery(tmp_path):
    clock = Clock()
    cmds = FakeCommands(fail="squeue --json timed out after 3s")
    jc = JobContext(cmds, ttl_s=30, clock=clock)
    make_proc(tmp_path, 19315, 1001, environ=b"SLURM_JOB_ID=1\0")
    ctx = make_ctx(tmp_path)
    jc.refresh(ctx)
    status = jc.take_status()
    assert [
        (s["event.category"], s["event.action"], s["hpcsec.sensor"], s["message"]) for s in status
    ] == [
        (
            "sensor_status",
            "unavailable",
            "slurm_context",
            "Slurm unreachable, events carry no job: squeue --json timed out after 3s",
        )
    ]
    assert jc.fields_for_pid(ctx, 19315) == {}
    for _ in range(3):
        clock.now += 31
        jc.refresh(ctx)
        jc.refresh(ctx)  # within the TTL: not retried
    assert cmds.calls == ["listpids"] * 4  # the node is asked first
    assert jc.take_status() == []
    object.__setattr__(cmds, "fail", None)
    clock.now += 31
    jc.refresh(ctx)
    assert [s["message"] for s in jc.take_status()] == ["Slurm reachable again"]
    assert jc.fields_for_pid(ctx, 19315)["slurm.job.id"] == "1"


def test_detail_fetched_when_json_lacks_gres_detail(tmp_path):
    jobs = (
        '{"jobs": [{"job_id": 1, "nodes": "vm", "job_state": "RUNNING", '
        '"user_name": "alice", "user_id": 1001}]}'
    )
    detail = (FIX / "show-job-d-1.txt").read_text()
    cmds = FakeCommands(jobs=jobs, detail=detail)
    jc = JobContext(cmds)
    jc.refresh(make_ctx(tmp_path))
    assert cmds.calls == ["listpids", "jobs", "detail"]
    assert jc.job("1").gpus_on("vm") == (0, 1)


def test_parse_problems_become_one_error_status(tmp_path):
    jc = JobContext(FakeCommands(jobs="not json", listpids="PID JOBID\nbad line\n"))
    jc.refresh(make_ctx(tmp_path))
    [status] = jc.take_status()
    assert status["event.action"] == "malformed"
    assert len(status["hpcsec.parse_errors"]) == 2
    assert status["message"].startswith("2 Slurm records skipped: job JSON is not JSON: ")
    assert status["message"].endswith("; listpids line 2: 'bad line'")


def test_build_table_merges_detail_only_where_json_has_none():
    table = build_table(
        {
            "slurm-jobs.json": JOBS_22,
            "slurm-jobs-detail.txt": "JobId=1 x\n     Nodes=vm CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:3)\n",
        }
    )
    assert table.jobs["1"].gpus_on("vm") == (0, 1)  # the JSON's own gres_detail is kept


def test_job_context_is_shared_through_state(tmp_path):
    ctx = make_ctx(tmp_path)
    ctx.options.update(slurm_ttl_s=5, slurm_timeout_s=0.5, slurm_state_dir=str(tmp_path))
    jc = job_context(ctx)
    assert job_context(ctx) is jc and ctx.state[STATE_KEY] is jc
    assert (jc.ttl_s, jc.commands.timeout_s) == (5.0, 0.5)
    assert jc.events_file == str(tmp_path / "slurm-events.jsonl")


def test_real_commands_fail_fast():
    cmds = SlurmCommands(timeout_s=0.2)
    with pytest.raises(SlurmUnreachable, match=r"^hpcsec-no-such-binary not found$"):
        cmds._run(["hpcsec-no-such-binary"])
    with pytest.raises(SlurmUnreachable, match=r"^sleep 5 timed out after 0\.2s$"):
        cmds._run(["sleep", "5"])
    with pytest.raises(SlurmUnreachable, match=r"^false exited 1: no output$"):
        cmds._run(["false"])


def fake_scontrol(tmp_path, monkeypatch, stdout: str, stderr: str, code: int) -> SlurmCommands:
    """`scontrol` that writes what it is given (as a real one run by SlurmCommands would)."""
    (tmp_path / "out").write_text(stdout)
    (tmp_path / "err").write_text(stderr)
    script = tmp_path / "scontrol"
    script.write_text(f"#!/bin/sh\ncat {tmp_path}/out\ncat {tmp_path}/err >&2\nexit {code}\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    return SlurmCommands()


LISTED = "PID      JOBID    STEPID   LOCALID GLOBALID\n19315    1        0        0       0\n"


def test_listpids_keeps_what_it_listed_when_a_step_ended_meanwhile(tmp_path, monkeypatch):
    # every job that ends during a refresh did this: exit 1 and "StepId=11.batch does not
    # exist on this node." (its stepd gone), which made the whole table unreachable (and
    # a user ending tiny jobs in a loop could keep the node's view of Slurm down)
    gone = (
        "StepId=11.batch does not exist on this node.\nStepId=12.0 does not exist on this node.\n"
    )
    commands = fake_scontrol(tmp_path, monkeypatch, LISTED, gone, 1)
    assert commands.listpids() == LISTED
    commands = fake_scontrol(tmp_path, monkeypatch, "", "No job steps exist on this node.\n", 1)
    assert commands.listpids() == ""


@pytest.mark.parametrize(
    ("stdout", "stderr"),
    [
        (LISTED, "slurm_load_ctl_conf error: Unable to contact slurm controller\n"),
        (LISTED, "StepId=11.batch does not exist on this node.\nsomething else failed\n"),
        ("", "StepId=11.batch does not exist on this node.\n"),
        (LISTED, ""),
    ],
)
def test_listpids_failing_otherwise_is_still_unreachable(tmp_path, monkeypatch, stdout, stderr):
    commands = fake_scontrol(tmp_path, monkeypatch, stdout, stderr, 1)
    with pytest.raises(SlurmUnreachable):
        commands.listpids()

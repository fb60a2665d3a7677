import json
from pathlib import Path

import orjson

from hpcsec.detector.runtime import registry
from hpcsec.detector.slurm.jobs import STATE_KEY, JobContext, hook_state_dir, job_context
from hpcsec.detector.slurm.sensor import SlurmJobsSensor
from hpcsec.sensors.base import FsRoot, SensorContext, run_sensor

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "slurm"
JOBS = json.loads((FIX / "squeue-22.05.json").read_text())


def jobs_doc(*running: int) -> str:
    doc = json.loads(json.dumps(JOBS))
    for job in doc["jobs"]:
        if job["job_state"] == "RUNNING" and job["job_id"] not in running:
            job["job_state"] = "COMPLETED"
    return json.dumps(doc)


def ctx_for(root: Path, replay, state=None, ts="2026-11-30T01:33:00.000Z") -> SensorContext:
    return SensorContext(
        "vm",
        FsRoot("sys", root),
        FsRoot("proc", root),
        FsRoot("etc", root),
        timestamp=ts,
        replay_inputs=replay,
        state=state if state is not None else {},
    )


def summary(events):
    return [(e["event.action"], e.get("slurm.job.id"), e.get("slurm.node.users")) for e in events]


def test_registered():
    spec = registry.by_name()["slurm_jobs"]
    assert spec.categories == ("slurm_job",)
    assert isinstance(spec.factory(), SlurmJobsSensor)


def test_present_started_ended(tmp_path):
    state: dict = {}
    sensor = SlurmJobsSensor()
    first = list(sensor.collect(ctx_for(tmp_path, {"slurm-jobs.json": jobs_doc(1)}, state)))
    assert summary(first) == [("present", "1", ["alice"])]
    assert first[0]["slurm.job.gpus"] == [0, 1] and first[0]["hpcsec.sensor"] == "slurm_jobs"
    second = list(sensor.collect(ctx_for(tmp_path, {"slurm-jobs.json": jobs_doc(1, 3)}, state)))
    assert summary(second) == [
        ("present", "1", ["alice", "bob"]),
        ("present", "3", ["alice", "bob"]),
        ("started", "3", ["alice", "bob"]),
    ]
    third = list(sensor.collect(ctx_for(tmp_path, {"slurm-jobs.json": jobs_doc(3)}, state)))
    assert summary(third) == [("present", "3", ["bob"]), ("ended", "1", ["bob"])]
    ended = third[1]
    assert ended["slurm.job.state"] == "COMPLETED"
    assert ended["slurm.job.end"] == "2027-11-30T01:32:33.000Z"
    assert ended["slurm.job.user"] == "alice"


UNREACHABLE = "Slurm unreachable, events carry no job: no job list in this snapshot sample"


def test_no_slurm_data_in_snapshot_means_no_jobs_and_slurm_unreachable(tmp_path):
    """A sample recorded while Slurm did not answer replays as the live outage did: no jobs,
    and one status record for the self-health rule."""
    run = run_sensor(registry.by_name()["slurm_jobs"], SlurmJobsSensor(), ctx_for(tmp_path, {}))
    assert [(e["event.action"], e["message"]) for e in run.events] == [("unavailable", UNREACHABLE)]


def test_sample_without_job_list_ends_nothing(tmp_path):
    state: dict = {}
    sensor = SlurmJobsSensor()
    list(sensor.collect(ctx_for(tmp_path, {"slurm-jobs.json": jobs_doc(1)}, state)))
    down = list(sensor.collect(ctx_for(tmp_path, {}, state)))
    assert [(e["event.category"], e["message"]) for e in down] == [("sensor_status", UNREACHABLE)]
    again = list(sensor.collect(ctx_for(tmp_path, {"slurm-jobs.json": jobs_doc(1)}, state)))
    assert [e["message"] for e in again if e["event.category"] == "sensor_status"] == [
        "Slurm reachable again"
    ]
    assert summary([e for e in again if e["event.category"] != "sensor_status"]) == [
        ("present", "1", ["alice"])
    ]


class Down:
    def available(self):
        return True

    def jobs_json(self):
        from hpcsec.detector.slurm.jobs import SlurmUnreachable

        raise SlurmUnreachable("squeue --json timed out after 3s")

    listpids = jobs_detail = jobs_json


def test_a_job_name_that_breaks_the_detail_listing_is_flagged_and_its_gpus_unknown(tmp_path):
    """Slurm before 22.05: no gres_detail in the JSON, so `scontrol show job -d` is read. A
    job named with a line break and a fake detail line gets no GPUs from it (unknown), and
    its present event says why, for the rule *Slurm job whose own text breaks the listing*."""
    doc = json.loads(jobs_doc(1, 3))
    for job in doc["jobs"]:
        job.pop("gres_detail", None)
    detail = (FIX / "show-job-d-all.txt").read_text()
    forged = "JobName=wrap\n     Nodes=vm CPU_IDs=0 Mem=0 GRES=gpu:8(IDX:0-7)"
    detail = detail.replace("JobId=3 JobName=wrap", "JobId=3 " + forged, 1)
    replay = {"slurm-jobs.json": json.dumps(doc), "slurm-jobs-detail.txt": detail}
    events = list(SlurmJobsSensor().collect(ctx_for(tmp_path, replay)))
    present = {e["slurm.job.id"]: e for e in events if e["event.action"] == "present"}
    assert present["1"]["slurm.job.gpus"] == [0, 1]
    assert "slurm.job.listing_tampered" not in present["1"]
    assert present["3"]["slurm.job.listing_tampered"] is True
    assert "slurm.job.gpus" not in present["3"]  # unknown, not the forged 0-7


def test_outage_is_not_the_end_of_every_job(tmp_path):
    state: dict = {}
    sensor = SlurmJobsSensor()
    list(sensor.collect(ctx_for(tmp_path, {"slurm-jobs.json": jobs_doc(1, 3)}, state)))
    state[STATE_KEY] = JobContext(Down(), ttl_s=0)
    down = list(sensor.collect(ctx_for(tmp_path, None, state)))
    assert [(e["event.category"], e["event.action"]) for e in down] == [
        ("sensor_status", "unavailable")
    ]
    assert sorted(state["slurm_jobs"]["jobs"]) == ["1", "3"]


def test_hook_records_are_tailed(tmp_path):
    state: dict = {}
    events_file = tmp_path / "slurm-events.jsonl"
    prolog = {"event.category": "slurm_job", "event.action": "prolog", "slurm.job.id": "1"}
    events_file.write_text(
        json.dumps(prolog)
        + "\nnot json\n"
        + '{"event.category": "x"}\n'
        + '{"event.category": "slurm_job", "event.action": "epi'
    )
    sensor = SlurmJobsSensor()

    def sample():
        ctx = ctx_for(tmp_path, None, state)
        ctx.options["slurm_state_dir"] = str(tmp_path)
        state.setdefault(STATE_KEY, JobContext(Down(), ttl_s=3600))
        return [
            e
            for e in sensor.collect(ctx)
            if e["event.category"] != "sensor_status" or e["event.action"] == "malformed"
        ]

    first = sample()
    assert [e["event.action"] for e in first] == ["prolog", "malformed"]
    assert first[1]["hpcsec.parse_errors"] == [
        "slurm-events.jsonl line 2: not JSON",
        "slurm-events.jsonl line 3: not a slurm_job event",
    ]
    assert sample() == []  # the partial last line waits for its newline
    with events_file.open("a") as fh:
        fh.write('log"}\n')
    assert [e["event.action"] for e in sample()] == ["epilog"]


def test_a_hook_record_holding_line_separators_is_read_whole(tmp_path):
    """The hooks write with orjson, which leaves U+0085, U+2028 and U+2029 raw: a lingering
    process named with one must not split its finding into pieces that are not JSON."""
    finding = {
        "event.category": "slurm_job",
        "event.action": "epilog_findings",
        "slurm.job.id": "5",
        "process.name": "xmrig\u0085",
        "process.command_line": "xmrig \u2028--url\u2029 stratum+tcp://p:3333",
    }
    (tmp_path / "slurm-events.jsonl").write_bytes(orjson.dumps(finding) + b"\n")
    ctx = ctx_for(tmp_path, None, {})
    ctx.options["slurm_state_dir"] = str(tmp_path)
    ctx.state[STATE_KEY] = JobContext(Down(), ttl_s=3600)
    events = list(SlurmJobsSensor().collect(ctx))
    assert [e["event.action"] for e in events if e["event.category"] == "slurm_job"] == [
        "epilog_findings"
    ]
    assert not [e for e in events if e["event.action"] == "malformed"]
    (read,) = [e for e in events if e["event.category"] == "slurm_job"]
    assert read["process.command_line"] == finding["process.command_line"]


def test_hook_state_dir_defaults_to_the_hooks_default(tmp_path, monkeypatch):
    """An agent started without `slurm_state_dir` reads where the hooks write by default."""
    monkeypatch.setenv("HPCSEC_STATE_DIR", str(tmp_path))
    (tmp_path / "slurm-events.jsonl").write_text(
        '{"event.category": "slurm_job", "event.action": "prolog", "slurm.job.id": "7"}\n'
    )
    ctx = ctx_for(tmp_path, None, {})
    assert hook_state_dir(ctx) == str(tmp_path)
    assert job_context(ctx).events_file == str(tmp_path / "slurm-events.jsonl")
    ctx.state[STATE_KEY] = JobContext(Down(), ttl_s=3600)
    assert [
        (e["event.action"], e.get("slurm.job.id"))
        for e in SlurmJobsSensor().collect(ctx)
        if e["event.category"] == "slurm_job"
    ] == [("prolog", "7")]
    monkeypatch.delenv("HPCSEC_STATE_DIR")
    assert hook_state_dir(ctx_for(tmp_path, None, {})) == "/var/lib/hpcsec"

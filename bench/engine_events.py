"""Deterministic benchmark events: a realistic mix of categories and fields, plus events built
from the rules themselves so that about 1% of the stream matches something."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from sigma.conditions import (
    ConditionAND,
    ConditionFieldEqualsValueExpression,
    ConditionNOT,
    ConditionOR,
)
from sigma.types import (
    SigmaBool,
    SigmaCIDRExpression,
    SigmaCompareExpression,
    SigmaExists,
    SigmaExpansion,
    SigmaNumber,
    SigmaString,
    SpecialChars,
)

from hpcsec.detector.engine.evaluate import Engine

START = datetime(2026, 12, 1, tzinfo=UTC)
# share of each category in a busy GPU node's stream
MIX = {
    "process": 30,
    "file_access": 25,
    "gpu_process": 10,
    "network_socket": 12,
    "rdma_counters": 8,
    "roce_flow": 6,
    "gpu_device": 3,
    "firmware": 2,
    "rdma_qp": 3,
    "slurm_job": 1,
}
USERS = [f"u{n:04d}" for n in range(200)]
PROGRAMS = ["python3", "torchrun", "bash", "srun", "nccl-tests", "sleep", "sshd", "ls", "cat"]
PATHS = [
    "/lustre/datasets/imagenet/train/n{n:08d}.tar",
    "/home/{user}/run/log.txt",
    "/scratch/{user}/ckpt/step{n}.pt",
    "/lustre/models/llama-70b/shard-{n:05d}.safetensors",
]


def _common(rng: random.Random, category: str, n: int, host: str) -> dict[str, Any]:
    return {
        "@timestamp": (START + timedelta(milliseconds=n * 3)).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3]
        + "Z",
        "event.id": f"{n:012x}",
        "event.kind": "event",
        "event.category": category,
        "host.name": host,
        "hpcsec.sensor": category,
        "hpcsec.in_maintenance": False,
    }


def _process(rng: random.Random, host: int) -> tuple[int, str, int, str, int]:
    """Sensors sample the same long-running processes again and again: each node runs a
    few dozen (pid, user, job, program), drawn from a per-node pool."""
    slot = rng.randrange(32)
    owner = random.Random(host * 1000 + slot % 8)  # one job (and user) per GPU
    local = random.Random(host * 1000 + 100 + slot)
    return (
        local.randrange(1000, 4_000_000),
        owner.choice(USERS),
        owner.randrange(100000, 200000),
        local.choice(PROGRAMS),
        slot % 8,
    )


def _background(rng: random.Random, category: str, n: int) -> dict[str, Any]:
    host_index = rng.randrange(1, 129)
    host = f"gpu{host_index:03d}"
    ev = _common(rng, category, n, host)
    pid, user, job, prog, gpu = _process(rng, host_index)
    if category in ("process", "file_access", "gpu_process", "network_socket", "rdma_qp"):
        ev.update(
            {
                "process.pid": pid,
                "process.name": prog,
                "process.executable": f"/usr/bin/{prog}",
                "process.command_line": f"{prog} --rank {rng.randrange(64)} --cfg run.yaml",
                "user.name": user,
                "user.id": 1000 + USERS.index(user),
                "user.is_admin": False,
                "user.is_system": False,
                "process.is_gpu_service": False,
                "slurm.job.id": job,
                "slurm.job.user": user,
                "slurm.job.state": "RUNNING",
                "slurm.job.gpus": [0, 1, 2, 3],
            }
        )
    if category == "process":
        ev["event.action"] = "sample"
    elif category == "file_access":
        path = rng.choice(PATHS).format(n=rng.randrange(99999), user=user)
        ev.update(
            {
                "event.action": rng.choice(["open", "read", "close_write"]),
                "file.path": path,
                "file.extension": path.rsplit(".", 1)[-1],
                "file.size": rng.randrange(1 << 30),
            }
        )
    elif category == "gpu_process":
        index = gpu
        ev.update(
            {
                "event.action": "sample",
                "gpu.index": index,
                "gpu.uuid": f"GPU-{host}-{index}",
                "gpu.allocated_to_job": True,
                "gpu.mig_mode": 0,
                "gpu.memory_used_bytes": rng.randrange(1 << 36),
            }
        )
    elif category == "network_socket":
        ev.update(
            {
                "event.action": "sample",
                "network.state": "ESTABLISHED",
                "source.ip": f"10.1.{rng.randrange(256)}.{rng.randrange(256)}",
                "destination.ip": f"10.1.{rng.randrange(256)}.{rng.randrange(256)}",
                "destination.port": rng.choice([22, 443, 29500, 6817]),
                "destination.is_job_node": True,
            }
        )
    elif category == "rdma_counters":
        ev.update(
            {
                "event.action": "sample",
                "rdma.device": f"mlx5_{rng.randrange(8)}",
                "rdma.port": 1,
                "rdma.per_s.port_xmit_data": rng.randrange(10**9),
                "rdma.per_s.port_rcv_data": rng.randrange(10**9),
                "rdma.delta.hw.req_remote_access_errors": 0,
                "slurm.node.job_count": 1,
            }
        )
    elif category == "roce_flow":
        ev.update(
            {
                "event.action": "flow",
                "source.ip": f"10.2.0.{rng.randrange(256)}",
                "destination.ip": f"10.2.1.{rng.randrange(256)}",
                "network.bytes": rng.randrange(10**6),
                "rdma.flow.rkeys": 1,
                "rdma.flow.write_bytes": rng.randrange(10**5),
                "destination.is_job_node": True,
            }
        )
    elif category == "gpu_device":
        ev.update({"event.action": "sample", "gpu.index": rng.randrange(8), "gpu.ecc_mode": 1})
    elif category == "firmware":
        ev.update(
            {
                "event.action": "inventory",
                "firmware.component": "hca",
                "firmware.device": "mlx5_0",
                "firmware.version": "28.39.1002",
                "firmware.drift": False,
                "firmware.known_vulnerable": False,
                "firmware.changed": False,
            }
        )
    elif category == "rdma_qp":
        ev.update({"event.action": "sample", "rdma.qp.type": "RC", "rdma.qp.kernel": False})
    else:
        ev.update({"event.action": "present", "slurm.job.id": job, "slurm.job.user": user})
    return ev


def _witness(node: Any, out: dict[str, Any]) -> None:
    """Field values that satisfy the positive part of a condition tree (first OR branch)."""
    if isinstance(node, ConditionAND):
        for arg in node.args:
            _witness(arg, out)
    elif isinstance(node, ConditionOR) and node.args:
        _witness(node.args[0], out)
    elif isinstance(node, ConditionFieldEqualsValueExpression):
        value = node.value
        if isinstance(value, SigmaExpansion):
            value = value.values[0]
        if isinstance(value, SigmaString):
            out[node.field] = "".join(
                p if isinstance(p, str) else ("x" if p is SpecialChars.WILDCARD_MULTI else "y")
                for p in value.s
            )
        elif isinstance(value, SigmaBool):
            out[node.field] = value.boolean
        elif isinstance(value, SigmaNumber):
            out[node.field] = value.number
        elif isinstance(value, SigmaCompareExpression):
            out[node.field] = value.number.number + (1 if value.op.name in ("GT", "GTE") else -1)
        elif isinstance(value, SigmaExists) and value.exists:
            out[node.field] = "x"
        elif isinstance(value, SigmaCIDRExpression):
            out[node.field] = str(next(iter(value.network.hosts()), value.network.network_address))
    elif isinstance(node, ConditionNOT):
        pass


def attack_events(engine: Engine) -> list[dict[str, Any]]:
    """One event per detection rule that the witness heuristic can satisfy (checked)."""
    found = []
    rng = random.Random(7)
    for rule in engine.rules:
        if rule.kind != "detection":
            continue
        category = rule.sigma.logsource.category
        for condition in rule.sigma.detection.parsed_condition:
            event = _background(rng, category, 0)
            _witness(condition.parse(), event)
            if any(m.rule is rule for m in engine.evaluate([event])):
                found.append(event)
                break
    return found


def generate(n: int, attacks: list[dict[str, Any]], seed: int = 1) -> Iterator[dict[str, Any]]:
    rng = random.Random(seed)
    categories = [c for c, weight in MIX.items() for _ in range(weight)]
    for i in range(n):
        if attacks and rng.random() < 0.01:
            event = dict(rng.choice(attacks))
            event.update(_common(rng, event["event.category"], i, event.get("host.name", "gpu001")))
            yield event
        else:
            yield _background(rng, rng.choice(categories), i)

"""A small model of one GPU node, written out as a node snapshot (docs/architecture.md).

tools/build_scenarios.py describes scenarios with these classes; `write_snapshot` turns one
into `DIR/meta.json` and `DIR/<n>/…` in the kernel and tool layouts the sensors read. Every
value is derived from the description (GPU UUIDs and serials are hashes of host and index),
so the output is byte-for-byte reproducible.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from squeue_template import squeue_job

from hpcsec.detector.core.hostlist import expand

GPU_BUS_IDS = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")  # an HGX H100 8-GPU board
HCA_BUS_IDS = ("1b", "3c", "9c", "bc")
HCAS = tuple(f"mlx5_{i}" for i in range(4))
USERS = (
    ("root", 0),
    ("daemon", 1),
    ("munge", 105),
    ("nvidia-persistenced", 119),
    ("slurm", 64030),
    ("adm-carol", 1500),
    ("svc-publish", 1900),
    ("svc-data", 1901),
    ("alice", 2001),
    ("bob", 2002),
    ("mallory", 2003),
)
UID = dict(USERS)
# Counters an mlx5 port exposes that the rules read, with their sysfs directory.
PORT_COUNTERS = (
    "port_xmit_data",
    "port_rcv_data",
    "port_xmit_packets",
    "port_rcv_packets",
    "symbol_error",
    "port_rcv_errors",
)
HW_COUNTERS = (
    "rx_write_requests",
    "rx_read_requests",
    "rx_atomic_requests",
    "resp_remote_access_errors",
    "req_remote_access_errors",
    "out_of_sequence",
    "local_ack_timeout_err",
    "duplicate_request",
)
WORD_COUNTERS = ("port_xmit_data", "port_rcv_data")  # sysfs counts 4-octet words


def epoch(ts: str) -> int:
    return int(datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp())


def digest(*parts: object, size: int = 16) -> str:
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()[:size]


def gpu_uuid(host: str, index: int) -> str:
    h = digest("gpu", host, index, size=32)
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


@dataclass
class Job:
    id: int
    user: str
    account: str
    nodes: str  # hostlist expression, e.g. "gpu-[017-018]"
    gpus: str  # GRES detail per node, e.g. "gpu:8(IDX:0-7)"
    name: str = "train"
    partition: str = "gpu"
    state: str = "RUNNING"
    start: str = "2026-11-30T00:00:00Z"
    end: str | None = None


@dataclass
class Proc:
    pid: int
    user: str
    argv: list[str]
    job: int | None = None  # the Slurm job whose cgroup holds the process
    step: str = "0"
    comm: str | None = None  # default: basename of argv[0], truncated like the kernel's
    ppid: int = 1
    env: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return (self.comm or self.argv[0].rsplit("/", 1)[-1])[:15]


@dataclass
class GpuProc:
    gpu: int
    pid: int
    memory_bytes: int = 40 << 30


@dataclass
class Qp:
    device: str
    lqpn: int
    pid: int | None  # None: a kernel QP
    comm: str
    qp_type: str = "RC"
    state: str = "RTS"
    rqpn: int | None = None


@dataclass
class Sock:
    pid: int
    source: tuple[str, int]
    destination: tuple[str, int] = ("0.0.0.0", 0)
    state: str = "ESTABLISHED"
    transport: str = "tcp"


@dataclass
class FileAccess:
    pid: int
    path: str
    actions: list[str]
    count: int = 1
    size: int | None = None
    target: str | None = None
    at: str | None = None  # default: the sample's time


@dataclass
class Sample:
    time: str
    procs: list[Proc] = field(default_factory=list)
    jobs: list[Job] = field(default_factory=list)
    gpu_procs: list[GpuProc] = field(default_factory=list)
    qps: list[Qp] = field(default_factory=list)
    sockets: list[Sock] = field(default_factory=list)
    files: list[FileAccess] = field(default_factory=list)
    # per HCA: counter name -> increase per second since the previous sample
    rdma_rates: dict[str, dict[str, float]] = field(default_factory=dict)
    hca_fw: dict[str, str] = field(default_factory=dict)  # overrides of the node's versions
    vbios: dict[int, str] = field(default_factory=dict)
    ecc_off: tuple[int, ...] = ()
    slurm_events: list[dict[str, Any]] = field(default_factory=list)  # prolog/epilog records
    slurm_down: bool = False  # Slurm did not answer: no job list, no listpids


@dataclass
class Node:
    host: str
    ip: str
    hca_fw: str = "28.39.1002"
    vbios: str = "96.00.99.00.01"
    driver: str = "550.127.05"
    bios: str = "2.3.1"


@dataclass
class Scenario:
    name: str
    summary: str
    node: Node
    samples: list[Sample]
    expected: list[dict[str, Any]]  # rule, and the host/job/user/gpu the alert must name
    config: str = "site-config.yml"  # the example config, or a scenario-specific text
    exclusive: bool = False  # no rule but the expected ones may fire


# ----------------------------------------------------------------------------- writers


def _write(path: Path, data: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    path.write_bytes(data)


def _dump(value: Any) -> str:
    return json.dumps(value, indent=1, sort_keys=False) + "\n"


STATUS = (
    "Name:\t{name}\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t{pid}\nNgid:\t0\n"
    "Pid:\t{pid}\nPPid:\t{ppid}\nTracerPid:\t0\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n"
    "Gid:\t{uid}\t{uid}\t{uid}\t{uid}\nFDSize:\t64\nThreads:\t{threads}\n"
)


def _cgroup(proc: Proc) -> str:
    if proc.job is not None:
        return f"0::/system.slice/slurmstepd.scope/job_{proc.job}/step_{proc.step}/user/task_0\n"
    if UID[proc.user] < 1000:
        return f"0::/system.slice/{proc.name}.service\n"
    return f"0::/user.slice/user-{UID[proc.user]}.slice/session-{proc.pid % 97}.scope\n"


def write_proc(root: Path, proc: Proc) -> None:
    base = root / "proc" / str(proc.pid)
    uid = UID[proc.user]
    _write(
        base / "status",
        STATUS.format(
            name=proc.name, pid=proc.pid, ppid=proc.ppid, uid=uid, threads=8 if proc.job else 1
        ),
    )
    _write(base / "comm", proc.name + "\n")
    _write(base / "cmdline", "\0".join(proc.argv) + "\0")
    _write(base / "cgroup", _cgroup(proc))
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": f"/home/{proc.user}", "USER": proc.user}
    if proc.job is not None:
        env.update({"SLURM_JOB_ID": str(proc.job), "SLURM_STEP_ID": proc.step})
    env.update(proc.env)
    _write(base / "environ", "".join(f"{k}={v}\0" for k, v in env.items()))


def write_etc(root: Path) -> None:
    _write(
        root / "etc" / "passwd",
        "".join(
            f"{n}:x:{u}:{u}:{n}:{'/root' if u == 0 else '/home/' + n}:/bin/bash\n" for n, u in USERS
        ),
    )
    _write(root / "etc" / "group", "".join(f"{n}:x:{u}:\n" for n, u in USERS))
    # the cluster's names: the enrichment tells a job's peers from other addresses by them
    _write(
        root / "etc" / "hosts",
        "127.0.0.1 localhost\n"
        + "".join(f"10.30.0.{n} gpu-{n:03d}.cluster gpu-{n:03d}\n" for n in range(1, 33))
        + "10.30.9.10 login-1.cluster login-1\n10.30.9.250 dtn-1.cluster dtn-1\n",
    )


def write_infiniband(root: Path, node: Node, sample: Sample, totals: dict) -> None:
    for i, dev in enumerate(HCAS):
        base = root / "sys" / "class" / "infiniband" / dev
        _write(base / "fw_ver", sample.hca_fw.get(dev, node.hca_fw) + "\n")
        _write(base / "board_id", "MT_0000000838\n")
        _write(base / "hca_type", "MT4129\n")
        _write(base / "node_guid", f"a088:c203:00{digest(node.host, dev, size=2)}:{i:04x}\n")
        port = base / "ports" / "1"
        _write(port / "link_layer", "InfiniBand\n")
        _write(port / "state", "4: ACTIVE\n")
        _write(port / "phys_state", "5: LinkUp\n")
        _write(port / "rate", "400 Gb/sec (4X NDR)\n")
        for name in PORT_COUNTERS:
            value = totals[dev][name]
            _write(port / "counters" / name, f"{value // 4 if name in WORD_COUNTERS else value}\n")
        for name in HW_COUNTERS:
            _write(port / "hw_counters" / name, f"{totals[dev][name]}\n")


def write_dmi(root: Path, node: Node) -> None:
    base = root / "sys" / "class" / "dmi" / "id"
    for name, value in (
        ("bios_version", node.bios),
        ("bios_vendor", "American Megatrends International, LLC."),
        ("bios_date", "05/17/2026"),
        ("board_name", "HGX H100 8-GPU"),
        ("product_name", "GPU Server G593"),
    ):
        _write(base / name, value + "\n")


def nvml_json(node: Node, sample: Sample) -> dict[str, Any]:
    devices = []
    for index in range(8):
        procs = [
            {
                "pid": p.pid,
                "type": "compute",
                "used_gpu_memory_bytes": p.memory_bytes,
                "gpu_instance_id": None,
                "compute_instance_id": None,
            }
            for p in sample.gpu_procs
            if p.gpu == index
        ]
        devices.append(
            {
                "index": index,
                "uuid": gpu_uuid(node.host, index),
                "serial": str(
                    1650923000000 + int(digest("serial", node.host, index, size=6), 16) % 1000000
                ),
                "name": "NVIDIA H100 80GB HBM3",
                "pci_bus_id": f"00000000:{GPU_BUS_IDS[index]}:00.0",
                "minor": index,
                "mig_mode": 0,
                "ecc_mode": 0 if index in sample.ecc_off else 1,
                "memory_total_bytes": 85520809984,
                "memory_used_bytes": sum(p["used_gpu_memory_bytes"] for p in procs),
                "utilization_gpu_percent": 97 if procs else 0,
                "vbios_version": sample.vbios.get(index, node.vbios),
                "inforom": {"image": "G520.0200.00.05", "oem": "2.1", "ecc": "7.16", "power": None},
                "gsp_firmware_version": node.driver,
                "processes": procs,
            }
        )
    return {"driver_version": node.driver, "cuda_driver_version": 12040, "devices": devices}


def qp_json(sample: Sample) -> list[dict[str, Any]]:
    out = []
    for qp in sample.qps:
        rec: dict[str, Any] = {
            "ifindex": HCAS.index(qp.device) + 2,
            "ifname": qp.device,
            "port": 1,
            "lqpn": qp.lqpn,
        }
        if qp.rqpn is not None:
            rec["rqpn"] = qp.rqpn
        rec.update(
            {
                "type": qp.qp_type,
                "state": qp.state,
                "sq-psn": qp.lqpn * 7 % 16777216,
                "path-mig-state": "MIGRATED",
                "pdn": 3,
            }
        )
        if qp.pid is not None:
            rec["pid"] = qp.pid
        rec["comm"] = qp.comm
        out.append(rec)
    return out


def squeue_json(sample: Sample) -> dict[str, Any]:
    jobs = [
        squeue_job(
            job_id=j.id,
            user_name=j.user,
            user_id=UID[j.user],
            account=j.account,
            name=j.name,
            partition=j.partition,
            nodes=j.nodes,
            gres_detail=[j.gpus] * len(expand(j.nodes)),
            job_state=j.state,
            start_time=epoch(j.start),
            end_time=epoch(j.end) if j.end else epoch(j.start) + 86400,
        )
        for j in sample.jobs
    ]
    return {
        "meta": {
            "plugin": {"type": "openapi/v0.0.38", "name": "Slurm OpenAPI v0.0.38"},
            "Slurm": {"version": {"major": 22, "micro": 8, "minor": 5}, "release": "22.05.8"},
        },
        "errors": [],
        "jobs": jobs,
    }


def listpids(sample: Sample) -> str:
    rows = ["PID      JOBID    STEPID   LOCALID GLOBALID"]
    rows += [
        f"{p.pid:<8} {p.job:<8} {p.step:<8} 0       0" for p in sample.procs if p.job is not None
    ]
    return "\n".join(rows) + "\n"


def sockets_json(sample: Sample) -> list[dict[str, Any]]:
    return [
        {
            "transport": s.transport,
            "state": s.state,
            "source.ip": s.source[0],
            "source.port": s.source[1],
            "destination.ip": s.destination[0],
            "destination.port": s.destination[1],
            "inode": 880000 + i,
            "pid": s.pid,
        }
        for i, s in enumerate(sample.sockets)
    ]


def file_events(sample: Sample) -> str:
    lines = []
    for f in sample.files:
        rec: dict[str, Any] = {
            "time": f.at or sample.time,
            "pid": f.pid,
            "path": f.path,
            "actions": f.actions,
            "count": f.count,
        }
        if f.size is not None:
            rec["size"] = f.size
        if f.target is not None:
            rec["target"] = f.target
        lines.append(json.dumps(rec, separators=(",", ":")))
    return "".join(line + "\n" for line in lines)


def write_snapshot(scenario: Scenario, directory: Path) -> None:
    node = scenario.node
    totals = {
        dev: {name: 1_000_000 + 1000 * i for name in PORT_COUNTERS} | dict.fromkeys(HW_COUNTERS, 0)
        for i, dev in enumerate(HCAS)
    }
    previous: str | None = None
    for n, sample in enumerate(scenario.samples):
        root = directory / str(n)
        if previous is not None:
            seconds = epoch(sample.time) - epoch(previous)
            for dev, rates in sample.rdma_rates.items():
                for name, per_s in rates.items():
                    totals[dev][name] += int(per_s * seconds)
        previous = sample.time
        _write(root / "time", sample.time + "\n")
        write_etc(root)
        for proc in sample.procs:
            write_proc(root, proc)
        write_infiniband(root, node, sample, totals)
        write_dmi(root, node)
        _write(root / "nvml.json", _dump(nvml_json(node, sample)))
        # the management NIC, as the ETHTOOL_GDRVINFO ioctl reports it (sensors/firmware.py)
        _write(
            root / "ethtool-drvinfo.json",
            _dump(
                {
                    "eno1": {
                        "driver": "i40e",
                        "version": "6.1.0-27-amd64",
                        "fw_version": "9.20 0x8000d95e 1.3429.0",
                        "bus_info": "0000:c1:00.0",
                    }
                }
            ),
        )
        _write(root / "rdma-res-qp.json", json.dumps(qp_json(sample)) + "\n")
        if not sample.slurm_down:
            _write(root / "slurm-jobs.json", _dump(squeue_json(sample)))
            _write(root / "slurm-listpids.txt", listpids(sample))
        _write(root / "sockets.json", _dump(sockets_json(sample)))
        _write(root / "file-events.jsonl", file_events(sample))
        if sample.slurm_events:
            _write(
                root / "slurm-events.jsonl",
                "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in sample.slurm_events),
            )
    _write(
        directory / "meta.json",
        _dump({"hpcsec.snapshot": 1, "host.name": node.host, "samples": len(scenario.samples)}),
    )

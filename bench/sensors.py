"""One sampling cycle of every sampled sensor on an 8-GPU, 4-HCA fixture node: CPU time.

`python -m bench.sensors [--cycles N] [--sensor NAME]...`

The node: the fake NVML of tests/fakes (8 x H100, 12 GPU processes, MIG on one GPU) behind the
real pynvml wrapper, the 4-HCA sysfs tree of fixtures/sysfs (ports, counters, hw_counters)
joined with the DMI and network trees of fixtures/sysfs-node, the GPU processes' /proc
entries and passwd of fixtures/nvml, and saved command outputs for what would run a tool
(`rdma -j res show qp`, `ethtool -i`). Every default-enabled sensor of sensors/registry.py
runs except the streaming file-access sensor; sensors that need this machine (sock_diag)
read it for real. Cycles after the first have the previous sample's state, as in the agent,
so counter deltas and firmware changes are computed.

Figures are CPU seconds of this process (time.process_time) per cycle, median and 95th
percentile, per sensor and in total, against the 20 ms target. The fake NVML answers from
Python; a real driver adds its own ioctl time on top of the wrapper and parsing cost here.
The roce sensor reads a capture rather than sampling: its figure is CPU time per packet of a
generated mirror-port pcap.

The sockets figure (`--held-fds N`, live: sock_diag and this machine's /proc) is the cost of
one sockets sample while processes hold N descriptors (opened in child processes, each up to
the descriptor limit): a new sensor every sample (every descriptor link read, as before the
owner cache) against one sensor kept across samples (the agent's), in the same run.

The rdma_qp figure (`--qps N`, live through a fake `rdma` on PATH that prints N QPs of one
process) is the CPU time and peak RSS growth of one sample, each in a fresh child process:
the sensor (the output read as it arrives, only what it lists kept) against the same output
read whole as before (captured, `json.loads`, a QueuePair per record, then bounded), in the
same run.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hpcsec.detector.core.schema import rfc3339
from hpcsec.detector.runtime import registry
from hpcsec.detector.runtime.sensorset import BudgetedSensors, fork_context
from hpcsec.sensors.base import FsRoot, SensorContext, SensorSpec, run_sensor
from hpcsec.sensors.snapshot import close_sensor
from hpcsec.sensors.sockets import SocketSensor
from tests.fakes.nvml import h100_node, installed

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "fixtures"
TARGET_MS = 20.0
STREAMING = {"file_access"}  # not a sampled sensor: it watches for --duration
# the fabric and hardware sensors (the 20 ms target is theirs); the rest is shown beside them
HARDWARE = {"rdma_counters", "rdma_qp", "roce_flow", "gpu_device", "gpu_process", "firmware"}
CANNED = {  # raw input name -> saved output of the tool that would run
    "rdma-res-qp.json": FIXTURES / "rdma" / "res-qp.json",
    "ethtool-drvinfo.json": FIXTURES / "firmware" / "ethtool-drvinfo.json",
}


class CannedContext(SensorContext):
    """Live sample, except that tool outputs come from saved files (no fork/exec here)."""

    canned: dict[str, str] = {}

    def raw_input(self, name, live):
        if name in self.canned:
            return self.canned[name]
        return super().raw_input(name, live)

    def raw_chunks(self, name, live):
        if name in self.canned:
            return iter((self.canned[name],))
        return super().raw_chunks(name, live)


def node_root(tmp: Path) -> Path:
    """A sysfs root joining the 4-HCA counters tree with the node's DMI and network trees."""
    hcas = FIXTURES / "sysfs" / "h100-4hca" / "sample0" / "class" / "infiniband"
    if not hcas.is_dir():
        hcas = FIXTURES / "sysfs-node" / "class" / "infiniband"
    sys_root = tmp / "sys"
    (sys_root / "class").mkdir(parents=True)
    (sys_root / "class" / "infiniband").symlink_to(hcas)
    for sub in ("dmi", "net"):
        (sys_root / "class" / sub).symlink_to(FIXTURES / "sysfs-node" / "class" / sub)
    return sys_root


def context(sys_root: Path, state: dict[str, Any], canned: dict[str, str]) -> SensorContext:
    ctx = CannedContext(
        "gpu-017",
        FsRoot("sys", sys_root),
        FsRoot("proc", FIXTURES / "nvml" / "proc"),
        FsRoot("etc", FIXTURES / "nvml" / "etc"),
        timestamp=rfc3339(),
        state=state,
    )
    ctx.canned = canned
    return ctx


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def roce_capture(path: Path, packets: int) -> None:
    """A mirror-port capture: 16 flows of RDMA WRITEs with their ACKs and some READs."""
    from scapy.contrib.roce import AETH, BTH
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import Ether
    from scapy.packet import Raw
    from scapy.utils import PcapWriter

    from hpcsec.sensors.rdma.roce_headers import RETH

    t0 = 1796000400.0
    with PcapWriter(str(path), sync=False) as writer:
        for n in range(packets):
            flow = n % 16
            ip = IP(src=f"10.0.0.{flow + 1}", dst=f"10.0.1.{flow + 1}")
            head = (
                Ether(src="02:00:00:00:00:01", dst="02:00:00:00:00:02")
                / ip
                / UDP(sport=49152 + flow, dport=4791)
            )
            if n % 4 == 3:
                frame = head / BTH(opcode=0x11, dqpn=0x200 + flow) / AETH(syndrome=0x1F)
            elif n % 8 == 2:
                frame = (
                    head / BTH(opcode=0x0C, dqpn=0x100 + flow) / RETH(rkey=n % 97, dma_length=65536)
                )
            else:
                frame = (
                    head
                    / BTH(opcode=0x0A, dqpn=0x100 + flow)
                    / RETH(rkey=n % 89, dma_length=4096)
                    / Raw(b"\0" * 1024)
                )
            frame.time = t0 + n * 1e-4
            writer.write(frame)


def roce_figure(packets: int) -> None:
    """CPU time of the roce sensor per captured packet (read, dissect, fold into flows)."""
    from hpcsec.sensors.rdma.roce import FlowAggregator, read_pcap

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mirror.pcap"
        roce_capture(path, packets)
        runs = []
        for _ in range(3):
            aggregator = FlowAggregator()
            start = time.process_time()
            read_pcap(str(path), aggregator)
            runs.append(time.process_time() - start)
    best = min(runs)
    print(
        f"roce (capture): {packets} packets, {len(aggregator.flows)} flows: "
        f"{best / packets * 1e6:.1f} us CPU per packet, {packets / best:,.0f} packets/s "
        f"(best of 3)"
    )


HOLDER = (
    "import os, resource, sys\n"
    "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
    "resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))\n"
    "held = [os.open('/dev/null', os.O_RDONLY) for _ in range(int(sys.argv[1]))]\n"
    "print('ready', flush=True)\n"
    "sys.stdin.read()\n"
)


def hold_descriptors(total: int) -> list[subprocess.Popen]:
    """Child processes holding `total` descriptors between them, each up to the limit."""
    per_child = max(resource.getrlimit(resource.RLIMIT_NOFILE)[1] - 64, 1)
    children = []
    while total > 0:
        count = min(total, per_child)
        child = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(count)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        children.append(child)
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        total -= count
    return children


def sockets_figure(held: int, samples: int = 5) -> None:
    """CPU time of one live sockets sample with `held` descriptors open: full walk vs cache."""
    live = SensorContext(
        "live", FsRoot("sys", "/sys"), FsRoot("proc", "/proc"), FsRoot("etc", "/etc")
    )
    children = hold_descriptors(held)
    try:
        kept = SocketSensor()
        list(kept.collect(live))  # its first sample walks everything, as a new sensor does
        costs: dict[str, list[float]] = {"full walk": [], "cached": []}
        for _ in range(samples):
            for label, sensor in (("full walk", SocketSensor()), ("cached", kept)):
                start = time.process_time()
                list(sensor.collect(live))
                costs[label].append(time.process_time() - start)
    finally:
        for child in children:
            child.kill()
            child.wait()
    full, cached = (statistics.median(costs[k]) for k in ("full walk", "cached"))
    print(
        f"sockets (live): {held:,} descriptors held in {len(children)} processes, median of "
        f"{samples} samples: full walk {full * 1e3:.1f} ms CPU, cached {cached * 1e3:.1f} ms "
        f"({full / max(cached, 1e-9):.0f} x less)"
    )


# `rdma -j res show qp` for argv[1] QPs of one process, written as it is generated
QP_GENERATOR = """
import sys
qps = int(sys.argv[1])
record = (
    '{"ifindex":0,"ifname":"mlx5_0","port":1,"lqpn":%d,"rqpn":%d,"type":"RC","state":"RTS",'
    '"rq-psn":13310071,"sq-psn":10442381,"path-mig-state":"MIGRATED","pdn":9,"pid":41000,'
    '"comm":"python3"}'
)
sys.stdout.write("[")
for start in range(0, qps, 4096):
    block = ",".join(record % (q, q + 1) for q in range(start, min(start + 4096, qps)))
    sys.stdout.write(("," if start else "") + block)
sys.stdout.write("]\\n")
"""
QP_SAMPLE = {  # one sample, `sample()` returning what it lists
    "the sensor": """
from hpcsec.sensors.base import FsRoot, SensorContext
from hpcsec.sensors.rdma.qp import RdmaQpSensor
root = FsRoot("sys", "/nonexistent")
def sample():
    return RdmaQpSensor().collect(SensorContext("bench", root, root, root))
""",
    "read whole": """
import json, subprocess
from hpcsec.sensors.rdma.qp import COMMAND, bounded, qp_from_record
def sample():
    text = subprocess.run(
        COMMAND, capture_output=True, encoding="utf-8", errors="surrogateescape", check=True
    ).stdout
    return bounded([qp_from_record(r) for r in json.loads(text, strict=False)])[0]
""",
}
QP_MEASURE = """
import resource, time
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.process_time()
listed = len(sample())
cpu = time.process_time() - start
print(cpu, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before, listed)
"""


def qp_figure(qps: int) -> None:
    """One live rdma_qp sample of `qps` QPs of one process: the sensor against the output
    read whole, each in a fresh child (CPU time and peak RSS growth of that child)."""
    with tempfile.TemporaryDirectory() as tmp:
        generator = Path(tmp) / "generate_qps.py"
        generator.write_text(QP_GENERATOR)
        tool = Path(tmp) / "rdma"
        tool.write_text(f"#!/bin/sh\nexec {sys.executable} {generator} {qps}\n")
        tool.chmod(0o700)
        env = {**os.environ, "PATH": f"{tmp}{os.pathsep}{os.environ.get('PATH', '')}"}
        figures = {}
        for label, setup in QP_SAMPLE.items():
            done = subprocess.run(
                [sys.executable, "-c", setup + QP_MEASURE],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            cpu, rss_kib, listed = done.stdout.split()
            figures[label] = (float(cpu), int(rss_kib) / 1024, int(listed))
    (cpu, rss, listed), (whole_cpu, whole_rss, _) = figures.values()
    print(
        f"rdma_qp (live, fake `rdma`): {qps:,} QPs of one process, {listed} listed, one "
        f"sample: {cpu:.2f} s CPU, peak RSS +{rss:.0f} MB; read whole as before "
        f"{whole_cpu:.2f} s, +{whole_rss:.0f} MB ({whole_cpu / max(cpu, 1e-9):.1f} x the CPU, "
        f"{whole_rss / max(rss, 1.0):.0f} x the memory growth, floor 1 MB)"
    )


def threaded_figure(
    specs: list[SensorSpec], sys_root: Path, canned: dict[str, str], cycles: int
) -> None:
    """CPU time of a cycle as the agent samples (BudgetedSensors: every sensor in its own
    thread, each started when the one before has its run) against the same sensors run in
    turn in one thread, alternating in the same run: what the threads' hand-overs cost."""
    # fork_context copies the context field by field: the class keeps the canned outputs
    CannedContext.canned = canned
    threaded = BudgetedSensors(specs)
    in_turn = [(spec, spec.factory()) for spec in specs]
    states: dict[str, dict[str, Any]] = {"threads": {}, "in turn": {}}
    costs: dict[str, list[float]] = {"threads": [], "in turn": []}
    try:
        for cycle in range(cycles + 1):
            for label, state in states.items():
                ctx = context(sys_root, state, canned)
                start = time.process_time()
                if label == "threads":
                    threaded.sample(ctx, lambda name: 60.0)
                else:
                    for spec, sensor in in_turn:
                        run_sensor(spec, sensor, fork_context(ctx))
                if cycle:
                    costs[label].append(time.process_time() - start)
                time.sleep(0.001)  # distinct sample times
    finally:
        threaded.close()
        for _, sensor in in_turn:
            close_sensor(sensor)
        CannedContext.canned = {}
    together, alone = (statistics.median(costs[k]) for k in ("threads", "in turn"))
    print(
        f"as the agent samples (a thread per sensor, {cycles} cycles): {together * 1e3:.3f} ms "
        f"CPU a cycle, against {alone * 1e3:.3f} ms for the same sensors in turn "
        f"({together / max(alone, 1e-9):.2f} x)"
    )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sensors", description=__doc__)
    parser.add_argument("--cycles", type=int, default=200)
    parser.add_argument("--sensor", action="append", metavar="NAME")
    parser.add_argument(
        "--roce-packets",
        type=int,
        default=5000,
        metavar="N",
        help="packets of the RoCE capture figure (0: skip it)",
    )
    parser.add_argument(
        "--qps",
        type=int,
        default=200_000,
        metavar="N",
        help="QPs of one process in the rdma_qp figure (0: skip it)",
    )
    parser.add_argument(
        "--held-fds",
        type=int,
        default=200_000,
        metavar="N",
        help="descriptors held during the sockets figure (0: skip it)",
    )
    args = parser.parse_args(argv)
    specs = [s for s in registry.select(args.sensor) if args.sensor or s.name not in STREAMING]
    canned = {name: path.read_text() for name, path in CANNED.items() if path.exists()}
    per_sensor: dict[str, list[float]] = {s.name: [] for s in specs}
    totals: list[float] = []
    hardware_totals: list[float] = []
    hardware = {s.name for s in specs if HARDWARE.intersection(s.categories)}
    statuses: dict[str, str] = {}
    events_per_cycle = 0
    with tempfile.TemporaryDirectory() as tmp, installed(h100_node()):
        sys_root = node_root(Path(tmp))
        sensors = [(spec, spec.factory()) for spec in specs]
        state: dict[str, Any] = {}
        wall = time.perf_counter()
        try:
            for cycle in range(args.cycles + 1):
                ctx = context(sys_root, state, canned)
                time.sleep(0.001)  # distinct sample times, as in the agent
                ctx.timestamp = rfc3339()
                start = time.process_time()
                events, hardware_time = 0, 0.0
                for spec, sensor in sensors:
                    before = time.process_time()
                    run = run_sensor(spec, sensor, ctx)
                    spent = time.process_time() - before
                    if cycle:  # cycle 0 warms up (imports, NVML init, first sample state)
                        per_sensor[spec.name].append(spent)
                    if spec.name in hardware:
                        hardware_time += spent
                    statuses[spec.name] = (
                        f"{run.status['event.action']}: {run.status.get('message', '')}"
                    )
                    events += len(run.events)
                if cycle:
                    totals.append(time.process_time() - start)
                    hardware_totals.append(hardware_time)
                events_per_cycle = events
        finally:
            for _, sensor in sensors:
                close_sensor(sensor)
        wall = time.perf_counter() - wall
        threaded_figure(specs, sys_root, canned, max(args.cycles // 4, 5))
    print(
        f"sensors: one sampling cycle on the 8-GPU, 4-HCA fixture node, {args.cycles} cycles "
        f"(CPU time of this process, ms)"
    )
    print(f"{'sensor':14} {'median':>8} {'p95':>8}  status")
    for name, values in per_sensor.items():
        print(
            f"{name:14} {statistics.median(values) * 1e3:8.3f} "
            f"{percentile(values, 0.95) * 1e3:8.3f}  {statuses[name][:70]}"
        )
    print(
        f"{'all sensors':14} {statistics.median(totals) * 1e3:8.3f} "
        f"{percentile(totals, 0.95) * 1e3:8.3f}  {events_per_cycle} events per cycle"
    )
    if hardware:
        median_ms = statistics.median(hardware_totals) * 1e3
        print(
            f"{'hardware':14} {median_ms:8.3f} {percentile(hardware_totals, 0.95) * 1e3:8.3f}"
            f"  {', '.join(sorted(hardware))}"
        )
        print(
            f"target {TARGET_MS:.0f} ms for the hardware sensors: median cycle is "
            f"{median_ms / TARGET_MS:.2f} x the target "
            f"({'met' if median_ms <= TARGET_MS else 'MISSED'})"
        )
    print(f"wall {wall:.1f} s for {args.cycles + 1} cycles")
    if args.roce_packets > 0:
        roce_figure(args.roce_packets)
    if args.held_fds > 0:
        sockets_figure(args.held_fds)
    if args.qps > 0:
        qp_figure(args.qps)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

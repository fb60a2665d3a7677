"""The explicit list of event sources, by name. Add a sensor here; nothing registers on import.

It lives in the runtime, above both `hpcsec.sensors` (node sources) and `detector.slurm`
(the Slurm job source), and names each module by its full path so only the sensors a
command selects are imported.
"""

from __future__ import annotations

from importlib import import_module

from hpcsec.sensors.base import SensorSpec

# Filled in as sensors land; each entry points at the module that implements the source.
SENSORS: tuple[SensorSpec, ...] = (
    SensorSpec(
        "process",
        lambda: _load("hpcsec.sensors.process", "ProcessSensor"),
        "processes from /proc: command line, user, cgroup, selected environment",
        categories=("process",),
        command_lines=True,
    ),
    SensorSpec(
        "sockets",
        lambda: _load("hpcsec.sensors.sockets", "SocketSensor"),
        "TCP/UDP sockets (sock_diag) with the owning process",
        categories=("network_socket",),
        command_lines=True,
    ),
    SensorSpec(
        "file_access",
        lambda: _load("hpcsec.sensors.file_access.sensor", "FileAccessSensor"),
        "accesses to protected paths: fanotify stream (--duration) or open files",
        categories=("file_access",),
        command_lines=True,
    ),
    SensorSpec(
        "slurm_jobs",
        lambda: _load("hpcsec.detector.slurm.sensor", "SlurmJobsSensor"),
        "Slurm jobs and users on this node, job start/end, prolog/epilog records",
        categories=("slurm_job",),
    ),
    SensorSpec(
        "gpu",
        lambda: _load("hpcsec.sensors.gpu.nvml", "GpuSensor"),
        "GPUs and the processes on them, from NVML (nvml.json)",
        categories=("gpu_device", "gpu_process"),
        command_lines=True,
    ),
    SensorSpec(
        "firmware",
        lambda: _load("hpcsec.sensors.firmware", "FirmwareSensor"),
        "firmware inventory: GPU VBIOS/InfoROM/GSP, driver, HCA, NIC, BIOS",
        categories=("firmware",),
    ),
    SensorSpec(
        "rdma_counters",
        lambda: _load("hpcsec.sensors.rdma.counters", "RdmaCountersSensor"),
        "InfiniBand/RoCE port counters and hw_counters from sysfs, with deltas",
        categories=("rdma_counters",),
    ),
    SensorSpec(
        "rdma_qp",
        lambda: _load("hpcsec.sensors.rdma.qp", "RdmaQpSensor"),
        "RDMA queue pairs and their owners from `rdma -j res show qp`",
        categories=("rdma_qp",),
        command_lines=True,  # enrichment reads the process of a QP's pid
    ),
    SensorSpec(
        "roce",
        lambda: _load("hpcsec.sensors.rdma.roce", "RoceSensor"),
        "RoCE v2 flows from a capture (--pcap FILE or --interface IFACE)",
        default_enabled=False,
        categories=("roce_flow",),
    ),
)


def _load(module: str, cls: str):
    """Import a sensor module only when the sensor is used (pyroute2, pynvml are heavy)."""
    return getattr(import_module(module), cls)()


def by_name() -> dict[str, SensorSpec]:
    return {spec.name: spec for spec in SENSORS}


def select(names: list[str] | None) -> list[SensorSpec]:
    """The named sensors (KeyError with the unknown name), or the default-enabled ones."""
    table = by_name()
    if not names:
        return [s for s in SENSORS if s.default_enabled]
    unknown = [n for n in names if n not in table]
    if unknown:
        raise KeyError(", ".join(unknown))
    return [table[n] for n in names]

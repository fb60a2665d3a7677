"""GPUs and the processes on them, from nvml.json (live NVML or a snapshot's stored dump).

One `gpu_device` event per GPU and one `gpu_process` event per process and GPU (a process on
two GPUs gives two events; a process in both the compute and the graphics list, two as
well). The process's name and user come from ctx.proc and the node's passwd; which Slurm job
it belongs to, and who else uses the GPU, is added at enrichment.

Malformed dumps are not trusted blindly: a device or process entry with a missing or
mistyped key is dropped or gets null for that key, and the sensor reports how many in a
`malformed` status record, so a hand-edited or truncated snapshot cannot crash a scan.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from hpcsec.detector.core.schema import Event, new_event
from hpcsec.sensors.base import SensorContext, SensorUnavailable
from hpcsec.sensors.gpu import nvml_dump
from hpcsec.sensors.gpu.nvml_dump import NVML_JSON, nvml_json
from hpcsec.sensors.procinfo import process_fields

PROCESS_TYPES = ("compute", "graphics", "mps")
INFOROM_OBJECTS = ("image", "oem", "ecc", "power")
_BUS_ID = re.compile(r"([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])\Z")


class NvmlFormatError(Exception):
    """nvml.json is not the documented shape at all (not JSON, no device list)."""


def sysfs_bus_id(nvml_bus_id: str | None) -> str | None:
    """NVML's `00000000:1A:00.0` as sysfs writes it, `0000:1a:00.0`; None if not a bus id."""
    match = _BUS_ID.match((nvml_bus_id or "").strip())
    if match is None:
        return None
    domain, bus, device, function = match.groups()
    return f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}.{function}"


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    type: str
    used_gpu_memory_bytes: int | None
    gpu_instance_id: int | None
    compute_instance_id: int | None


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str | None
    serial: str | None
    name: str | None
    pci_bus_id: str | None  # sysfs form
    minor: int | None
    mig_mode: int | None
    ecc_mode: int | None
    memory_total_bytes: int | None
    memory_used_bytes: int | None
    utilization_percent: int | None
    vbios_version: str | None
    inforom: dict[str, str | None]  # image, oem, ecc, power
    gsp_firmware_version: str | None
    processes: tuple[GpuProcess, ...]


@dataclass(frozen=True)
class NvmlReport:
    driver_version: str | None
    cuda_driver_version: int | None
    gpus: tuple[Gpu, ...]
    problems: tuple[str, ...]  # what was dropped or nulled, one line each


class _Checker:
    """Typed reads of the JSON values that note, rather than raise on, a wrong type."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def value(self, obj: dict, key: str, kind: type, where: str) -> Any:
        value = obj.get(key)
        if value is None:
            return None
        if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            self.problems.append(f"{where}.{key}: expected an integer, got {value!r:.40}")
            return None
        if kind is str and not isinstance(value, str):
            self.problems.append(f"{where}.{key}: expected a string, got {value!r:.40}")
            return None
        return value

    def process(self, raw: Any, where: str) -> GpuProcess | None:
        if not isinstance(raw, dict):
            self.problems.append(f"{where}: expected an object, dropped")
            return None
        pid = self.value(raw, "pid", int, where)
        kind = raw.get("type")
        if pid is None or pid <= 0 or kind not in PROCESS_TYPES:
            self.problems.append(f"{where}: needs a pid and a type in {PROCESS_TYPES}, dropped")
            return None
        return GpuProcess(
            pid,
            kind,
            self.value(raw, "used_gpu_memory_bytes", int, where),
            self.value(raw, "gpu_instance_id", int, where),
            self.value(raw, "compute_instance_id", int, where),
        )

    def gpu(self, raw: Any, where: str) -> Gpu | None:
        if not isinstance(raw, dict):
            self.problems.append(f"{where}: expected an object, dropped")
            return None
        index = self.value(raw, "index", int, where)
        if index is None:
            self.problems.append(f"{where}: no index, dropped")
            return None
        inforom = raw.get("inforom")
        if not isinstance(inforom, dict):
            if inforom is not None:
                self.problems.append(f"{where}.inforom: expected an object")
            inforom = {}
        processes = raw.get("processes")
        if not isinstance(processes, list):
            if processes is not None:
                self.problems.append(f"{where}.processes: expected a list")
            processes = []
        bus_id = self.value(raw, "pci_bus_id", str, where)
        if bus_id is not None and sysfs_bus_id(bus_id) is None:
            self.problems.append(f"{where}.pci_bus_id: not a PCI address: {bus_id!r:.40}")
        procs = (self.process(p, f"{where}.processes[{i}]") for i, p in enumerate(processes))
        return Gpu(
            index=index,
            uuid=self.value(raw, "uuid", str, where),
            serial=self.value(raw, "serial", str, where),
            name=self.value(raw, "name", str, where),
            pci_bus_id=sysfs_bus_id(bus_id),
            minor=self.value(raw, "minor", int, where),
            mig_mode=self.value(raw, "mig_mode", int, where),
            ecc_mode=self.value(raw, "ecc_mode", int, where),
            memory_total_bytes=self.value(raw, "memory_total_bytes", int, where),
            memory_used_bytes=self.value(raw, "memory_used_bytes", int, where),
            utilization_percent=self.value(raw, "utilization_gpu_percent", int, where),
            vbios_version=self.value(raw, "vbios_version", str, where),
            inforom={k: self.value(inforom, k, str, f"{where}.inforom") for k in INFOROM_OBJECTS},
            gsp_firmware_version=self.value(raw, "gsp_firmware_version", str, where),
            processes=tuple(p for p in procs if p is not None),
        )


def parse_nvml(text: str) -> NvmlReport:
    """nvml.json text -> NvmlReport; NvmlFormatError when it is not the documented shape."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise NvmlFormatError(f"{NVML_JSON}: not JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("devices"), list):
        raise NvmlFormatError(f"{NVML_JSON}: expected an object with a 'devices' list")
    check = _Checker()
    gpus = (check.gpu(raw, f"devices[{i}]") for i, raw in enumerate(doc["devices"]))
    return NvmlReport(
        driver_version=check.value(doc, "driver_version", str, "nvml"),
        cuda_driver_version=check.value(doc, "cuda_driver_version", int, "nvml"),
        gpus=tuple(g for g in gpus if g is not None),
        problems=tuple(check.problems),
    )


def read_nvml(ctx: SensorContext) -> NvmlReport:
    """This sample's NVML report; SensorUnavailable when NVML (or the snapshot file) is absent."""
    text = nvml_json(ctx)
    if text is None:
        raise SensorUnavailable(f"no {NVML_JSON} in this snapshot sample")
    return parse_nvml(text)


def device_event(ctx: SensorContext, sensor: str, report: NvmlReport, gpu: Gpu) -> Event:
    return new_event(
        "gpu_device",
        "sample",
        sensor,
        ctx.host_name,
        ctx.timestamp,
        {
            "gpu.index": gpu.index,
            "gpu.uuid": gpu.uuid,
            "gpu.serial": gpu.serial,
            "gpu.name": gpu.name,
            "gpu.pci_bus_id": gpu.pci_bus_id,
            "gpu.minor": gpu.minor,
            "gpu.mig_mode": gpu.mig_mode,
            "gpu.ecc_mode": gpu.ecc_mode,
            "gpu.memory_total_bytes": gpu.memory_total_bytes,
            "gpu.memory_used_bytes": gpu.memory_used_bytes,
            "gpu.utilization_percent": gpu.utilization_percent,
            "gpu.driver_version": report.driver_version,
            "gpu.process_count": len(gpu.processes),
            "gpu.process_users": [],  # filled at enrichment, from the gpu_process events
        },
    )


def process_event(ctx: SensorContext, sensor: str, gpu: Gpu, proc: GpuProcess) -> Event:
    return new_event(
        "gpu_process",
        "sample",
        sensor,
        ctx.host_name,
        ctx.timestamp,
        {
            "process.pid": proc.pid,
            **process_fields(ctx, proc.pid),
            "gpu.index": gpu.index,
            "gpu.uuid": gpu.uuid,
            "gpu.pci_bus_id": gpu.pci_bus_id,
            "gpu.mig_mode": gpu.mig_mode,
            "gpu.memory_used_bytes": proc.used_gpu_memory_bytes,
            "gpu.process_type": proc.type,
            "gpu.instance_id": proc.gpu_instance_id,
            "gpu.compute_instance_id": proc.compute_instance_id,
        },
    )


class GpuSensor:
    name = "gpu"

    def collect(self, ctx: SensorContext) -> Iterator[Event]:
        report = read_nvml(ctx)
        for gpu in report.gpus:
            yield device_event(ctx, self.name, report, gpu)
            for proc in gpu.processes:
                yield process_event(ctx, self.name, gpu, proc)
        if report.problems:
            yield malformed_status(ctx, self.name, report)

    def close(self) -> None:
        nvml_dump.close()


def malformed_status(ctx: SensorContext, sensor: str, report: NvmlReport) -> Event:
    return ctx.status(
        sensor,
        "malformed",
        f"{NVML_JSON}: {len(report.problems)} malformed entries: " + "; ".join(report.problems[:5]),
        **{"hpcsec.parse_errors": list(report.problems)},
    )

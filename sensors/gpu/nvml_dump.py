"""Ask NVML (through nvidia-ml-py, imported as `pynvml`) what the GPUs are and who uses them.

The result is the `nvml.json` raw input of a node snapshot (its shape is a contract, see
docs/architecture.md, "Node snapshot"): plain JSON, so a replayed snapshot runs exactly the
parsing code a live sample runs (sensors/gpu/nvml.py, sensors/firmware.py). Only NVML itself
being absent (no library, no driver) is fatal; a call a GPU does not support (InfoROM power
object on H100, GSP on older boards) or that fails for one device gives `null` for that field,
never an exception.

NVML stays initialised between samples: `nvmlInit` walks every GPU and costs tens to hundreds
of milliseconds without the persistence daemon, far more than the sample itself.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Callable
from typing import Any

import orjson

from hpcsec.detector.core.text import from_node_bytes
from hpcsec.sensors.base import SensorContext, SensorUnavailable

NVML_JSON = "nvml.json"

# Process lists by the type name used in nvml.json, with the pynvml wrappers to try in order
# (the _v3 entry points exist from driver R510; older drivers only have _v2).
PROCESS_LISTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "compute",
        ("nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2"),
    ),
    (
        "graphics",
        ("nvmlDeviceGetGraphicsRunningProcesses_v3", "nvmlDeviceGetGraphicsRunningProcesses_v2"),
    ),
    (
        "mps",
        (
            "nvmlDeviceGetMPSComputeRunningProcesses_v3",
            "nvmlDeviceGetMPSComputeRunningProcesses_v2",
        ),
    ),
)

# Instance ids NVML reports for a process outside MIG (NVML_VALUE_NOT_AVAILABLE as c_uint).
NO_INSTANCE = 0xFFFFFFFF

_lock = threading.Lock()
_initialised = False


def _text(value: Any) -> str:
    return from_node_bytes(value) if isinstance(value, bytes) else str(value)


def _init(pynvml: Any) -> None:
    global _initialised
    if _initialised:
        return
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        raise SensorUnavailable(
            "NVML library not found (libnvidia-ml.so.1): no NVIDIA driver installed on this node"
        ) from None
    except pynvml.NVMLError_DriverNotLoaded:
        raise SensorUnavailable("NVIDIA driver not loaded (NVML: Driver Not Loaded)") from None
    except pynvml.NVMLError as exc:
        raise SensorUnavailable(f"NVML initialisation failed: {exc}") from None
    _initialised = True


def close() -> None:
    """Shut NVML down (the next dump initialises it again)."""
    global _initialised
    with _lock:
        if not _initialised:
            return
        import pynvml

        _initialised = False
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()


def _optional(pynvml: Any, call: Callable[[], Any]) -> Any:
    """The value of one NVML query, or None when this GPU cannot answer it.

    The wrapper decodes strings strictly: a corrupted InfoROM's serial is not UTF-8.
    """
    try:
        return call()
    except (pynvml.NVMLError, UnicodeDecodeError):
        return None


def _first_of(pynvml: Any, names: tuple[str, ...], handle: Any) -> list[Any] | None:
    for name in names:
        wrapper = getattr(pynvml, name, None)
        if wrapper is None:  # nvidia-ml-py 12.x has no _v2 wrappers
            continue
        try:
            return wrapper(handle)
        except pynvml.NVMLError_FunctionNotFound:
            continue
        except pynvml.NVMLError:
            return None
    return None


def _instance(value: Any) -> int | None:
    return None if value is None or value == NO_INSTANCE else int(value)


def _processes(pynvml: Any, handle: Any) -> list[dict[str, Any]]:
    # On a MIG-enabled GPU the parent handle lists the processes of every instance (with
    # their instance ids) only to root; others get NO_PERMISSION, hence an empty list.
    out = []
    for type_name, wrappers in PROCESS_LISTS:
        for info in _first_of(pynvml, wrappers, handle) or ():
            # the wrapper already maps NVML_VALUE_NOT_AVAILABLE memory to None
            out.append(
                {
                    "pid": int(info.pid),
                    "type": type_name,
                    "used_gpu_memory_bytes": info.usedGpuMemory,
                    "gpu_instance_id": _instance(info.gpuInstanceId),
                    "compute_instance_id": _instance(info.computeInstanceId),
                }
            )
    return out


def _first(pair: list[int] | None) -> int | None:
    return None if pair is None else int(pair[0])


def _gsp_version(pynvml: Any, handle: Any) -> bytes:
    """GSP firmware version into a buffer of our own: nvidia-ml-py 12.x requires the buffer
    argument and returns only the status, 13.x allocates one when none is given."""
    buffer = ctypes.create_string_buffer(pynvml.NVML_GSP_FIRMWARE_VERSION_BUF_SIZE)
    pynvml.nvmlDeviceGetGspFirmwareVersion(handle, buffer)
    return buffer.value


def _device(pynvml: Any, index: int) -> dict[str, Any]:
    device: dict[str, Any] = {"index": index}
    handle = _optional(pynvml, lambda: pynvml.nvmlDeviceGetHandleByIndex(index))

    def ask(call: Callable[[Any], Any]) -> Any:
        return None if handle is None else _optional(pynvml, lambda: call(handle))

    def text(call: Callable[[Any], Any]) -> str | None:
        value = ask(call)  # an empty answer (GSP off on some drivers) is no answer
        return _text(value).strip() or None if value is not None else None

    pci = ask(pynvml.nvmlDeviceGetPciInfo)
    memory = ask(pynvml.nvmlDeviceGetMemoryInfo)
    utilization = ask(pynvml.nvmlDeviceGetUtilizationRates)
    device.update(
        {
            "uuid": text(pynvml.nvmlDeviceGetUUID),
            "serial": text(pynvml.nvmlDeviceGetSerial),
            "name": text(pynvml.nvmlDeviceGetName),
            "pci_bus_id": None if pci is None else _text(pci.busId),
            "minor": ask(pynvml.nvmlDeviceGetMinorNumber),
            "mig_mode": _first(ask(pynvml.nvmlDeviceGetMigMode)),
            "ecc_mode": _first(ask(pynvml.nvmlDeviceGetEccMode)),
            "memory_total_bytes": None if memory is None else int(memory.total),
            "memory_used_bytes": None if memory is None else int(memory.used),
            "utilization_gpu_percent": None if utilization is None else int(utilization.gpu),
            "vbios_version": text(pynvml.nvmlDeviceGetVbiosVersion),
            "inforom": {
                "image": text(pynvml.nvmlDeviceGetInforomImageVersion),
                "oem": text(
                    lambda h: pynvml.nvmlDeviceGetInforomVersion(h, pynvml.NVML_INFOROM_OEM)
                ),
                "ecc": text(
                    lambda h: pynvml.nvmlDeviceGetInforomVersion(h, pynvml.NVML_INFOROM_ECC)
                ),
                "power": text(
                    lambda h: pynvml.nvmlDeviceGetInforomVersion(h, pynvml.NVML_INFOROM_POWER)
                ),
            },
            "gsp_firmware_version": text(lambda h: _gsp_version(pynvml, h)),
            "processes": [] if handle is None else _processes(pynvml, handle),
        }
    )
    return device


def snapshot() -> dict[str, Any]:
    """What NVML reports now, as the nvml.json dict; SensorUnavailable when NVML is absent."""
    import pynvml

    with _lock:
        _init(pynvml)
        try:
            count = pynvml.nvmlDeviceGetCount()
        except pynvml.NVMLError as exc:
            raise SensorUnavailable(f"NVML cannot count the GPUs: {exc}") from None
        return {
            "driver_version": _optional(pynvml, lambda: _text(pynvml.nvmlSystemGetDriverVersion())),
            "cuda_driver_version": _optional(pynvml, pynvml.nvmlSystemGetCudaDriverVersion),
            "devices": [_device(pynvml, i) for i in range(count)],
        }


def dump() -> str:
    """`snapshot()` as the text of nvml.json (indented: snapshots are read by people too)."""
    return orjson.dumps(snapshot(), option=orjson.OPT_INDENT_2).decode()


def nvml_json(ctx: SensorContext) -> str | None:
    """nvml.json for this sample: asked of NVML once, whichever sensors read it.

    The gpu and firmware sensors both read it; keyed by the sample's timestamp in ctx.state so
    one sample queries NVML (and records the snapshot file) once.
    """
    cached = ctx.state.get(NVML_JSON)
    if cached is not None and cached[0] == ctx.timestamp:
        return cached[1]
    text = ctx.raw_input(NVML_JSON, dump)
    ctx.state[NVML_JSON] = (ctx.timestamp, text)
    return text

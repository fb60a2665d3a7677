"""A fake NVML C library under the real nvidia-ml-py wrapper.

pynvml loads libnvidia-ml.so.1 in `_LoadNvmlLibrary` and looks every C function up through
`_nvmlGetFunctionPointer(name)`. `installed(fake)` replaces those two, and nothing else, so the
wrapper's own code runs: it builds the same ctypes buffers and structs, passes them by
reference, and checks return codes as it does against the driver. The fake functions are
ctypes callbacks (CFUNCTYPE) with the C signatures, so arguments are marshalled by ctypes as
for the real library, and they answer through the pointers they are given: buffers sized by
the caller (NVML_ERROR_INSUFFICIENT_SIZE when too small), the count-then-fill protocol of the
running-process lists, NVML_VALUE_NOT_AVAILABLE memory and 0xFFFFFFFF instance ids outside MIG.

`h100_node()` describes an 8-GPU H100 node; tests and the bench change copies of it.
"""

from __future__ import annotations

import contextlib
import ctypes
from collections.abc import Callable, Iterator
from ctypes import CFUNCTYPE, POINTER, c_int, c_uint, c_void_p
from dataclasses import dataclass, field, replace

import pynvml

from hpcsec.sensors.gpu import nvml_dump

NOT_AVAILABLE_U64 = pynvml.NVML_VALUE_NOT_AVAILABLE_ulonglong.value
NOT_AVAILABLE_U32 = pynvml.NVML_VALUE_NOT_AVAILABLE_uint.value
HANDLE_BASE = 0x5A000  # device handles are opaque pointers; ours encode the index
# the process-list entry (pid, usedGpuMemory, gpuInstanceId, computeInstanceId); nvidia-ml-py
# 12.x names it c_nvmlProcessInfo_v2_t, 13.x adds the _v3_t name for the same layout
PROCESS_INFO = getattr(pynvml, "c_nvmlProcessInfo_v3_t", pynvml.c_nvmlProcessInfo_v2_t)


@dataclass(frozen=True)
class FakeProcess:
    pid: int
    used_memory: int | None  # None: NVML_VALUE_NOT_AVAILABLE
    gpu_instance_id: int | None = None  # None outside MIG (NVML reports 0xFFFFFFFF)
    compute_instance_id: int | None = None


@dataclass(frozen=True)
class FakeGpu:
    uuid: str
    serial: str | bytes  # bytes: what a corrupted InfoROM hands back
    bus_id: str  # NVML form, e.g. 00000000:18:00.0
    minor: int
    name: str = "NVIDIA H100 80GB HBM3"
    pci_device_id: int = 0x233010DE
    pci_subsystem_id: int = 0x16C110DE
    mig_mode: int = 0
    ecc_mode: int = 1
    memory_total: int = 85520809984
    memory_used: int = 568852480
    utilization: int = 0
    vbios: str = "96.00.99.00.01"
    inforom_image: str = "G520.0200.00.05"
    # by NVML_INFOROM_OEM / ECC / POWER; None: NVML_ERROR_NOT_SUPPORTED (power on H100)
    inforom: tuple[str | None, str | None, str | None] = ("2.1", "7.16", None)
    gsp: str | None = "550.127.05"
    compute: tuple[FakeProcess, ...] = ()
    graphics: tuple[FakeProcess, ...] = ()
    mps: tuple[FakeProcess, ...] = ()
    # C function name -> NVML error code it returns for this GPU
    errors: dict[str, int] = field(default_factory=dict)


@dataclass
class FakeNvml:
    gpus: list[FakeGpu]
    driver_version: str = "550.127.05"
    cuda_driver_version: int = 12040
    library_missing: bool = False
    init_error: int | None = None  # e.g. NVML_ERROR_DRIVER_NOT_LOADED
    has_v3_process_lists: bool = True  # drivers before R510 only have the _v2 entry points
    # (function, count passed in, count passed back, return code) of every process-list call
    process_calls: list[tuple[str, int, int, int]] = field(default_factory=list)
    initialised: int = 0

    def functions(self) -> dict[str, Callable]:
        return _c_functions(self)


def _write_string(buf: int, length: int, value: str | bytes) -> int:
    data = (value if isinstance(value, bytes) else value.encode()) + b"\0"
    if len(data) > length:
        return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
    ctypes.memmove(buf, data, len(data))
    return pynvml.NVML_SUCCESS


def _c_functions(fake: FakeNvml) -> dict[str, Callable]:
    ok = pynvml.NVML_SUCCESS
    handle_t = c_void_p

    def gpu_of(handle: int | None, function: str) -> tuple[FakeGpu | None, int]:
        if not fake.initialised:
            return None, pynvml.NVML_ERROR_UNINITIALIZED
        index = (handle or 0) - HANDLE_BASE
        if not 0 <= index < len(fake.gpus):
            return None, pynvml.NVML_ERROR_INVALID_ARGUMENT
        gpu = fake.gpus[index]
        if function in gpu.errors:
            return None, gpu.errors[function]
        return gpu, ok

    table: dict[str, Callable] = {}

    def c(name: str, *argtypes):
        def register(fn: Callable) -> Callable:
            table[name] = CFUNCTYPE(c_int, *argtypes)(fn)
            return fn

        return register

    @c("nvmlInitWithFlags", c_uint)
    def init(flags):
        if fake.init_error is not None:
            return fake.init_error
        fake.initialised += 1
        return ok

    @c("nvmlShutdown")
    def shutdown():
        if not fake.initialised:
            return pynvml.NVML_ERROR_UNINITIALIZED
        fake.initialised -= 1
        return ok

    @c("nvmlSystemGetDriverVersion", c_void_p, c_uint)
    def driver_version(buf, length):
        if not fake.initialised:
            return pynvml.NVML_ERROR_UNINITIALIZED
        return _write_string(buf, length, fake.driver_version)

    @c("nvmlSystemGetCudaDriverVersion", POINTER(c_int))
    def cuda_version(out):
        out[0] = fake.cuda_driver_version
        return ok if fake.initialised else pynvml.NVML_ERROR_UNINITIALIZED

    @c("nvmlDeviceGetCount_v2", POINTER(c_uint))
    def count(out):
        if not fake.initialised:
            return pynvml.NVML_ERROR_UNINITIALIZED
        out[0] = len(fake.gpus)
        return ok

    @c("nvmlDeviceGetHandleByIndex_v2", c_uint, POINTER(pynvml.c_nvmlDevice_t))
    def handle_by_index(index, out):
        if not fake.initialised:
            return pynvml.NVML_ERROR_UNINITIALIZED
        if index >= len(fake.gpus):
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        out[0] = ctypes.cast(c_void_p(HANDLE_BASE + index), pynvml.c_nvmlDevice_t)
        return ok

    def string_getter(name: str, value_of: Callable[[FakeGpu], str | None]) -> None:
        @c(name, handle_t, c_void_p, c_uint)
        def getter(handle, buf, length):
            gpu, rc = gpu_of(handle, name)
            if gpu is None:
                return rc
            value = value_of(gpu)
            if value is None:
                return pynvml.NVML_ERROR_NOT_SUPPORTED
            return _write_string(buf, length, value)

    string_getter("nvmlDeviceGetUUID", lambda g: g.uuid)
    string_getter("nvmlDeviceGetSerial", lambda g: g.serial)
    string_getter("nvmlDeviceGetName", lambda g: g.name)
    string_getter("nvmlDeviceGetVbiosVersion", lambda g: g.vbios)
    string_getter("nvmlDeviceGetInforomImageVersion", lambda g: g.inforom_image)

    @c("nvmlDeviceGetInforomVersion", handle_t, c_uint, c_void_p, c_uint)
    def inforom_version(handle, obj, buf, length):
        gpu, rc = gpu_of(handle, "nvmlDeviceGetInforomVersion")
        if gpu is None:
            return rc
        if obj >= len(gpu.inforom):
            return pynvml.NVML_ERROR_INVALID_ARGUMENT
        value = gpu.inforom[obj]
        if value is None:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        return _write_string(buf, length, value)

    @c("nvmlDeviceGetGspFirmwareVersion", handle_t, c_void_p)
    def gsp_version(handle, buf):
        gpu, rc = gpu_of(handle, "nvmlDeviceGetGspFirmwareVersion")
        if gpu is None:
            return rc
        if gpu.gsp is None:
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        return _write_string(buf, pynvml.NVML_GSP_FIRMWARE_VERSION_BUF_SIZE, gpu.gsp)

    @c("nvmlDeviceGetPciInfo_v3", handle_t, POINTER(pynvml.nvmlPciInfo_t))
    def pci_info(handle, out):
        gpu, rc = gpu_of(handle, "nvmlDeviceGetPciInfo_v3")
        if gpu is None:
            return rc
        domain, bus, rest = gpu.bus_id.split(":")
        info = out[0]
        info.busIdLegacy = gpu.bus_id[4:].encode()  # the old 16-byte field: 0000:18:00.0
        info.busId = gpu.bus_id.encode()
        info.domain, info.bus = int(domain, 16), int(bus, 16)
        info.device = int(rest.split(".")[0], 16)
        info.pciDeviceId, info.pciSubSystemId = gpu.pci_device_id, gpu.pci_subsystem_id
        return ok

    def uint_pair_getter(name: str, value_of: Callable[[FakeGpu], tuple[int, ...]]) -> None:
        @c(name, handle_t, POINTER(c_uint), POINTER(c_uint))
        def getter(handle, current, pending):
            gpu, rc = gpu_of(handle, name)
            if gpu is None:
                return rc
            current[0], pending[0] = value_of(gpu)
            return ok

    uint_pair_getter("nvmlDeviceGetMigMode", lambda g: (g.mig_mode, g.mig_mode))
    uint_pair_getter("nvmlDeviceGetEccMode", lambda g: (g.ecc_mode, g.ecc_mode))

    @c("nvmlDeviceGetMinorNumber", handle_t, POINTER(c_uint))
    def minor(handle, out):
        gpu, rc = gpu_of(handle, "nvmlDeviceGetMinorNumber")
        if gpu is None:
            return rc
        out[0] = gpu.minor
        return ok

    @c("nvmlDeviceGetMemoryInfo", handle_t, POINTER(pynvml.c_nvmlMemory_t))
    def memory(handle, out):
        gpu, rc = gpu_of(handle, "nvmlDeviceGetMemoryInfo")
        if gpu is None:
            return rc
        out[0].total, out[0].used = gpu.memory_total, gpu.memory_used
        out[0].free = gpu.memory_total - gpu.memory_used
        return ok

    @c("nvmlDeviceGetUtilizationRates", handle_t, POINTER(pynvml.c_nvmlUtilization_t))
    def utilization(handle, out):
        gpu, rc = gpu_of(handle, "nvmlDeviceGetUtilizationRates")
        if gpu is None:
            return rc
        if gpu.mig_mode:  # NVML does not report utilisation of a MIG-enabled GPU
            return pynvml.NVML_ERROR_NOT_SUPPORTED
        out[0].gpu, out[0].memory = gpu.utilization, gpu.utilization // 2
        return ok

    def process_list(name: str, processes_of: Callable[[FakeGpu], tuple[FakeProcess, ...]]):
        @c(name, handle_t, POINTER(c_uint), c_void_p)
        def getter(handle, count, infos):
            asked = count[0]
            gpu, rc = gpu_of(handle, name)
            if gpu is not None:
                procs = processes_of(gpu)
                if not procs:
                    count[0], rc = 0, ok
                elif infos is None or asked < len(procs):
                    count[0], rc = len(procs), pynvml.NVML_ERROR_INSUFFICIENT_SIZE
                else:
                    array = (PROCESS_INFO * asked).from_address(infos)
                    for slot, proc in zip(array, procs, strict=False):
                        slot.pid = proc.pid
                        slot.usedGpuMemory = (
                            NOT_AVAILABLE_U64 if proc.used_memory is None else proc.used_memory
                        )
                        slot.gpuInstanceId = _or_na(proc.gpu_instance_id)
                        slot.computeInstanceId = _or_na(proc.compute_instance_id)
                    count[0], rc = len(procs), ok
            fake.process_calls.append((name, asked, count[0], rc))
            return rc

    versions = ("_v3", "_v2") if fake.has_v3_process_lists else ("_v2",)
    for version in versions:
        process_list(f"nvmlDeviceGetComputeRunningProcesses{version}", lambda g: g.compute)
        process_list(f"nvmlDeviceGetGraphicsRunningProcesses{version}", lambda g: g.graphics)
        process_list(f"nvmlDeviceGetMPSComputeRunningProcesses{version}", lambda g: g.mps)
    return table


def _or_na(value: int | None) -> int:
    return NOT_AVAILABLE_U32 if value is None else value


class _FakeLibrary:
    """What pynvml.nvmlLib holds while the fake is installed (the CDLL stand-in)."""

    def __init__(self, fake: FakeNvml):
        self.functions = fake.functions()
        # nvmlErrorString is declared with restype c_char_p by pynvml; pynvml only calls it
        # for codes it has no text for, which the fake never returns.


@contextlib.contextmanager
def installed(fake: FakeNvml) -> Iterator[FakeNvml]:
    """pynvml talks to `fake` inside the block; the real loader is back afterwards."""
    saved = (
        pynvml._LoadNvmlLibrary,
        pynvml._nvmlGetFunctionPointer,
        pynvml.nvmlLib,
        dict(pynvml._nvmlGetFunctionPointer_cache),
    )
    library = _FakeLibrary(fake)

    def load() -> None:
        if fake.library_missing:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
        pynvml.nvmlLib = library

    def function_pointer(name: str) -> Callable:
        if pynvml.nvmlLib is not library:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        try:
            return library.functions[name]
        except KeyError:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND) from None

    nvml_dump.close()  # forget any NVML session opened before the fake
    pynvml._LoadNvmlLibrary, pynvml._nvmlGetFunctionPointer = load, function_pointer
    pynvml.nvmlLib = None
    pynvml._nvmlGetFunctionPointer_cache.clear()
    try:
        yield fake
    finally:
        nvml_dump.close()
        pynvml._LoadNvmlLibrary, pynvml._nvmlGetFunctionPointer, pynvml.nvmlLib = saved[:3]
        pynvml._nvmlGetFunctionPointer_cache.clear()
        pynvml._nvmlGetFunctionPointer_cache.update(saved[3])


# --- an 8-GPU H100 node (HGX H100 bus ids; minors are not in index order, as on DGX) ------

BUS_IDS = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")
MINORS = (2, 3, 0, 1, 6, 7, 4, 5)
UUIDS = (
    "GPU-3a4b5c6d-0e1f-4a2b-8c3d-4e5f6a7b8c90",
    "GPU-7f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0",
    "GPU-0c9b8a7f-6e5d-4c3b-9a2f-1e0d9c8b7a65",
    "GPU-d1c2b3a4-9584-4736-a251-f4e3d2c1b0a9",
    "GPU-5e6f7a8b-9c0d-4e1f-a2b3-c4d5e6f7a8b9",
    "GPU-a0b1c2d3-e4f5-4061-b2c3-d4e5f6071829",
    "GPU-1f2e3d4c-5b6a-4798-a6b5-c4d3e2f1a0b9",
    "GPU-9d8c7b6a-5f4e-4d3c-b2a1-0f9e8d7c6b5a",
)
SERIALS = tuple(
    f"16549230{n:05d}" for n in (10841, 10857, 10862, 10903, 11015, 11022, 11040, 11067)
)
GIB = 1 << 30


def h100_node() -> FakeNvml:
    """8 x H100 SXM: training on GPUs 0-2 and 4, MIG on 3, graphics on 5, MPS on 6, a miner on 7.

    GPU 3 runs MIG with two instances (NVML reports no utilisation there, and one process's
    memory as not available); GPU 5 has ECC turned off.
    """
    gpus = [
        FakeGpu(
            uuid=UUIDS[i], serial=SERIALS[i], bus_id=f"00000000:{BUS_IDS[i]}:00.0", minor=MINORS[i]
        )
        for i in range(8)
    ]
    gpus[0] = replace(
        gpus[0], memory_used=62 * GIB, utilization=97, compute=(FakeProcess(41000, 61 * GIB),)
    )
    gpus[1] = replace(
        gpus[1], memory_used=62 * GIB, utilization=96, compute=(FakeProcess(41001, 61 * GIB),)
    )
    gpus[2] = replace(
        gpus[2],
        memory_used=40 * GIB,
        utilization=88,
        compute=(FakeProcess(41002, 20 * GIB), FakeProcess(41003, 19 * GIB)),
    )
    gpus[3] = replace(
        gpus[3],
        mig_mode=1,
        memory_used=30 * GIB,
        compute=(
            FakeProcess(42000, 9 * GIB, gpu_instance_id=1, compute_instance_id=0),
            FakeProcess(42001, None, gpu_instance_id=2, compute_instance_id=0),
        ),
    )
    gpus[4] = replace(
        gpus[4], memory_used=21 * GIB, utilization=55, compute=(FakeProcess(41002, 20 * GIB),)
    )
    gpus[5] = replace(
        gpus[5],
        ecc_mode=0,
        memory_used=3 * GIB,
        utilization=12,
        graphics=(FakeProcess(43000, 2 * GIB),),
    )
    gpus[6] = replace(
        gpus[6],
        memory_used=12 * GIB,
        utilization=40,
        compute=(FakeProcess(44000, 32 * (1 << 20)),),
        mps=(FakeProcess(44100, 5 * GIB), FakeProcess(44101, 6 * GIB)),
    )
    gpus[7] = replace(
        gpus[7], memory_used=8 * GIB, utilization=100, compute=(FakeProcess(45000, 7 * GIB),)
    )
    return FakeNvml(gpus)

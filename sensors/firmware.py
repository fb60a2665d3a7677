"""Firmware inventory — category `firmware`, action `inventory`, one event per component and device.

Sources (each optional; the sensor is unavailable only when none answers):
- GPUs, from nvml.json (the dump the gpu sensor reads too): VBIOS, the InfoROM image and its
  OEM/ECC/power objects, GSP firmware, and the driver (device `system`).
- HCAs, from `class/infiniband/<dev>/fw_ver`, with `board_id` (the PSID: which vendor image
  the card runs) and `hca_type`.
- NICs, through the ethtool ioctl (SIOCETHTOOL, ETHTOOL_GDRVINFO) on every interface that has a
  `class/net/<if>/device` link (virtual interfaces have none); recorded as the raw input
  `ethtool-drvinfo.json`, `{ifname: {driver, version, fw_version, bus_info}}`. The ioctl needs
  no privilege and no ethtool binary, unlike `devlink dev info`, and covers non-Mellanox NICs.
- BIOS, from `class/dmi/id` (version, vendor, date; board and product names as extra fields).

The sensor reports versions as read; with the previous sample (ctx.state), `firmware.changed`.
Comparing them with the site's golden and vulnerable versions is site policy, decided at
enrichment (`firmware.baseline_version`, `firmware.drift`, `firmware.known_vulnerable`).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import re
import socket
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from hpcsec.detector.core.schema import Event, new_event
from hpcsec.sensors.base import SensorContext, SensorUnavailable
from hpcsec.sensors.gpu import nvml_dump
from hpcsec.sensors.gpu.nvml import NvmlFormatError, NvmlReport, read_nvml

DRVINFO_JSON = "ethtool-drvinfo.json"
INFOROM_COMPONENTS = (
    ("image", "gpu_inforom_image"),
    ("oem", "gpu_inforom_oem"),
    ("ecc", "gpu_inforom_ecc"),
    ("power", "gpu_inforom_power"),
)
DMI_EXTRA = (
    ("bios_vendor", "firmware.vendor"),
    ("bios_date", "firmware.release_date"),
    ("board_name", "firmware.board_name"),
    ("product_name", "firmware.product_name"),
)
# mlx5 reports "28.39.1002 (MT_0000000838)": the version, then the PSID
_VERSION_AND_PSID = re.compile(r"(\S+) \(([A-Za-z0-9_]+)\)\Z")


@dataclass(frozen=True)
class FirmwareItem:
    component: str  # one of schema.FIRMWARE_COMPONENTS
    device: str
    version: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.component}/{self.device}"


# --- GPUs ------------------------------------------------------------------------------------


def gpu_items(report: NvmlReport) -> list[FirmwareItem]:
    items = []
    for gpu in report.gpus:
        device = gpu.uuid or gpu.pci_bus_id or f"gpu{gpu.index}"
        extra = {
            "gpu.index": gpu.index,
            "gpu.uuid": gpu.uuid,
            "gpu.name": gpu.name,
            "gpu.pci_bus_id": gpu.pci_bus_id,
        }
        versions = [("gpu_vbios", gpu.vbios_version)]
        versions += [(component, gpu.inforom.get(obj)) for obj, component in INFOROM_COMPONENTS]
        versions.append(("gpu_gsp", gpu.gsp_firmware_version))
        items += [
            FirmwareItem(component, device, version, extra)
            for component, version in versions
            if version
        ]
    if report.driver_version:
        items.append(FirmwareItem("gpu_driver", "system", report.driver_version))
    return items


# --- HCAs ------------------------------------------------------------------------------------


def hca_items(ctx: SensorContext) -> list[FirmwareItem]:
    items = []
    for dev in ctx.sys.listdir("class/infiniband"):
        version = (ctx.sys.read_text(f"class/infiniband/{dev}/fw_ver", 256) or "").strip()
        if not version:
            continue
        board_id = (ctx.sys.read_text(f"class/infiniband/{dev}/board_id", 256) or "").strip()
        hca_type = (ctx.sys.read_text(f"class/infiniband/{dev}/hca_type", 256) or "").strip()
        items.append(
            FirmwareItem(
                "hca",
                dev,
                version,
                {
                    "rdma.device": dev,
                    "firmware.board_id": board_id or None,
                    "rdma.hca_type": hca_type or None,
                },
            )
        )
    return items


# --- NICs: the ethtool ioctl -----------------------------------------------------------------

SIOCETHTOOL = 0x8946
ETHTOOL_GDRVINFO = 0x00000003
IFNAMSIZ = 16
IFREQ_SIZE = 40  # struct ifreq on 64-bit Linux: name[16] + a 24-byte union


class EthtoolDrvinfo(ctypes.Structure):
    """struct ethtool_drvinfo (linux/ethtool.h)."""

    _fields_ = [
        ("cmd", ctypes.c_uint32),
        ("driver", ctypes.c_char * 32),
        ("version", ctypes.c_char * 32),
        ("fw_version", ctypes.c_char * 32),
        ("bus_info", ctypes.c_char * 32),
        ("erom_version", ctypes.c_char * 32),
        ("reserved2", ctypes.c_char * 12),
        ("n_priv_flags", ctypes.c_uint32),
        ("n_stats", ctypes.c_uint32),
        ("testinfo_len", ctypes.c_uint32),
        ("eedump_len", ctypes.c_uint32),
        ("regdump_len", ctypes.c_uint32),
    ]


def ethtool_drvinfo(ifname: str) -> dict[str, str]:
    """`ethtool -i IFNAME` through the ioctl; OSError when the interface cannot answer."""
    name = ifname.encode()
    if not name or len(name) >= IFNAMSIZ:
        raise OSError(f"invalid interface name {ifname!r}")
    info = EthtoolDrvinfo(cmd=ETHTOOL_GDRVINFO)
    # ifr_data points at our struct: the kernel fills it in place
    ifreq = struct.pack(f"{IFNAMSIZ}sP", name, ctypes.addressof(info)).ljust(IFREQ_SIZE, b"\0")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        fcntl.ioctl(sock.fileno(), SIOCETHTOOL, ifreq)
    return {
        key: getattr(info, key).decode("utf-8", "replace")
        for key in ("driver", "version", "fw_version", "bus_info")
    }


def physical_interfaces(ctx: SensorContext) -> list[str]:
    """Interfaces backed by a device (readlink records the link into a snapshot)."""
    return [
        ifname
        for ifname in ctx.sys.listdir("class/net")
        if ctx.sys.readlink(f"class/net/{ifname}/device") is not None
    ]


def drvinfo_json(ctx: SensorContext, query: Callable[[str], dict[str, str]]) -> str:
    out: dict[str, dict[str, str]] = {}
    for ifname in physical_interfaces(ctx):
        try:
            out[ifname] = query(ifname)
        except OSError as exc:
            out[ifname] = {"error": exc.strerror or str(exc)}
    return json.dumps(out, indent=1, sort_keys=True)


def nic_items(text: str) -> tuple[list[FirmwareItem], list[str]]:
    """Items from ethtool-drvinfo.json, and what could not be used."""
    try:
        doc = json.loads(text)
    except ValueError as exc:
        return [], [f"{DRVINFO_JSON}: not JSON: {exc}"]
    if not isinstance(doc, dict):
        return [], [f"{DRVINFO_JSON}: expected an object of interfaces"]
    items, problems = [], []
    for ifname, info in sorted(doc.items()):
        if not isinstance(info, dict) or "error" in info:
            reason = info.get("error") if isinstance(info, dict) else "not an object"
            problems.append(f"{DRVINFO_JSON}: {ifname}: {reason}")
            continue
        version = info.get("fw_version")
        if not isinstance(version, str) or not version.strip() or version.strip() == "N/A":
            continue  # virtio, veth-like drivers have no firmware
        version, board_id = version.strip(), None
        match = _VERSION_AND_PSID.match(version)
        if match:
            version, board_id = match.groups()
        driver = info.get("driver")
        items.append(
            FirmwareItem(
                "nic",
                ifname,
                version,
                {
                    "firmware.driver": driver if isinstance(driver, str) and driver else None,
                    "firmware.board_id": board_id,
                },
            )
        )
    return items, problems


# --- BIOS ------------------------------------------------------------------------------------


def bios_items(ctx: SensorContext) -> list[FirmwareItem]:
    def dmi(name: str) -> str | None:
        value = (ctx.sys.read_text(f"class/dmi/id/{name}", 256) or "").strip()
        return value or None

    version = dmi("bios_version")
    if version is None:
        return []
    return [
        FirmwareItem("bios", "system", version, {name: dmi(source) for source, name in DMI_EXTRA})
    ]


# --- the sensor ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Inventory:
    items: list[FirmwareItem]
    notes: list[str]  # a source that could not be read: reported with the items
    empty: list[str]  # a source that was read and holds no firmware version (no HCA, …)


def inventory(ctx: SensorContext, query: Callable[[str], dict[str, str]]) -> Inventory:
    """Every firmware item of the node, and what each source that gave none said."""
    items: list[FirmwareItem] = []
    notes: list[str] = []
    empty: list[str] = []
    try:
        report = read_nvml(ctx)
        items += gpu_items(report)
        notes += [f"nvml.json: {p}" for p in report.problems]
        if not report.gpus:
            empty.append("NVML lists no GPU")
    except SensorUnavailable as exc:
        notes.append(f"GPU firmware not read: {exc}")
    except NvmlFormatError as exc:
        notes.append(str(exc))
    hcas = hca_items(ctx)
    if not hcas:
        empty.append(f"no HCA fw_ver under {ctx.sys.path / 'class/infiniband'}")
    text = ctx.raw_input(DRVINFO_JSON, lambda: drvinfo_json(ctx, query))
    nics: list[FirmwareItem] = []
    if text is None:
        notes.append(f"NIC firmware not read: no {DRVINFO_JSON} in this sample")
    else:
        nics, problems = nic_items(text)
        notes += problems
        if not nics:
            empty.append(f"no NIC reports a firmware version ({_interfaces_asked(text)})")
    bios = bios_items(ctx)
    if not bios:
        empty.append(f"no bios_version under {ctx.sys.path / 'class/dmi/id'}")
    return Inventory(items + hcas + nics + bios, notes, empty)


def _interfaces_asked(text: str) -> str:
    with contextlib.suppress(ValueError, TypeError):
        names = sorted(json.loads(text))
        return "asked: " + ", ".join(names) if names else "no interface with a device"
    return DRVINFO_JSON


class FirmwareSensor:
    name = "firmware"

    def __init__(self, query: Callable[[str], dict[str, str]] | None = None):
        self.query = query  # the ethtool query (default: the ioctl); tests give canned answers

    def collect(self, ctx: SensorContext) -> Iterator[Event]:
        found = inventory(ctx, self.query or ethtool_drvinfo)
        items, notes = found.items, found.notes
        if not items:
            raise SensorUnavailable(
                "no firmware source answered: " + "; ".join(notes + found.empty)
            )
        previous: dict[str, str] = ctx.state.get(self.name) or {}
        current: dict[str, str] = {}
        for item in items:
            current[item.key] = item.version
            fields = {
                "firmware.component": item.component,
                "firmware.device": item.device,
                "firmware.version": item.version,
                **item.extra,
            }
            if item.key in previous:
                fields["firmware.previous_version"] = previous[item.key]
                fields["firmware.changed"] = previous[item.key] != item.version
            yield new_event(
                "firmware", "inventory", self.name, ctx.host_name, ctx.timestamp, fields
            )
        ctx.state[self.name] = current
        for note in notes:
            yield ctx.status(self.name, "degraded", note)

    def close(self) -> None:
        nvml_dump.close()  # when this sensor was the one that initialised NVML

"""RDMA port counters from sysfs: one `rdma_counters` event per device and port.

Reads `class/infiniband/<dev>/{fw_ver,board_id,hca_type,node_guid}` and
`class/infiniband/<dev>/ports/<n>/{link_layer,state,phys_state,rate}` plus every file in the
port's `counters/`, `counters_ext/` and `hw_counters/` directories, the way prometheus/procfs
and node_exporter do (and agreeing with the values their own fixtures assert).

Field names:
- `rdma.counters.<file>`, `rdma.counters_ext.<file>`, `rdma.hw_counters.<file>`: the value.
  The IBA data counters (`counters/port_{xmit,rcv}_data` and the legacy
  `counters_ext/port_{xmit,rcv}_data_64`) count 4-octet words and are reported in bytes.
- With a previous sample (kept in `ctx.state["rdma_counters"]`): `rdma.delta.<name>`,
  `rdma.per_s.<name>` and `rdma.interval_s`, where `<name>` is the file name for `counters/`,
  `ext.<file>` for `counters_ext/` and `hw.<file>` for `hw_counters/`. A counter lower than
  before (driver reload, counter reset) is listed in `rdma.reset` and gets no delta.
- Values that do not parse are skipped and named in `hpcsec.parse_errors` (sysfs-relative
  paths); `N/A (no PMA)` (no performance-management agent, e.g. i40iw) is simply absent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from hpcsec.detector.core.schema import Event, new_event, parse_time
from hpcsec.sensors.base import FsRoot, SensorContext, SensorUnavailable

NAME = "rdma_counters"
IB_CLASS = "class/infiniband"
DEVICE_STRINGS = ("fw_ver", "board_id", "hca_type", "node_guid")
# (directory, event field prefix, delta name prefix)
COUNTER_DIRS = (
    ("counters", "rdma.counters.", ""),
    ("counters_ext", "rdma.counters_ext.", "ext."),
    ("hw_counters", "rdma.hw_counters.", "hw."),
)
# IBA PortXmitData/PortRcvData count 32-bit words; procfs and node_exporter multiply by 4.
WORD_COUNTERS = frozenset(
    {
        ("counters", "port_xmit_data"),
        ("counters", "port_rcv_data"),
        ("counters_ext", "port_xmit_data_64"),
        ("counters_ext", "port_rcv_data_64"),
    }
)
NOT_AVAILABLE = "N/A"  # "N/A (no PMA)": the device has no performance-management agent
U64_MAX = (1 << 64) - 1
BYTES_PER_GBIT = 125_000_000
SYSFS_PAGE = 4096  # a sysfs attribute is at most one page; a smaller read buffer is cheaper


def parse_rate(text: str) -> int | None:
    """`25 Gb/sec (1X EDR)` -> 3125000000 bytes/s (first token in Gb/s); None if malformed.

    The kernel prints rates in steps of 0.5 Gb/s, so float arithmetic is exact here.
    """
    tokens = text.split()
    if not tokens:
        return None
    try:
        gbit = float(tokens[0])
    except ValueError:
        return None
    if not math.isfinite(gbit) or gbit < 0:
        return None
    return int(gbit * BYTES_PER_GBIT)


def parse_state(text: str) -> tuple[int, str] | None:
    """`4: ACTIVE` -> (4, "ACTIVE"); None if malformed."""
    number, sep, name = text.partition(":")
    number, name = number.strip(), name.strip()
    if not sep or not name or not (number.isascii() and number.isdigit()):
        return None
    return int(number), name


def parse_counter(text: str) -> int | None:
    """A sysfs counter as an unsigned 64-bit integer; None if malformed."""
    value = text.strip()
    if not (value.isascii() and value.isdigit()):
        return None
    number = int(value)
    return number if number <= U64_MAX else None


@dataclass(frozen=True)
class PortSample:
    """What one port showed at one sample."""

    device: str
    port: int
    fields: dict[str, Any]  # event fields: identity, attributes and counter values
    values: dict[str, int]  # delta name -> counter value (bytes for data counters)
    parse_errors: tuple[str, ...]

    @property
    def key(self) -> str:
        return f"{self.device}/{self.port}"


class _Reader:
    """Reads one device's files, remembering which ones did not parse."""

    def __init__(self, root: FsRoot, base: str):
        self.root = root
        self.base = base
        self.errors: list[str] = []

    def text(self, rel: str) -> str | None:
        data = self.root.read_text(f"{self.base}/{rel}", SYSFS_PAGE)
        return None if data is None else data.strip()

    def parsed(self, rel: str, parse):
        text = self.text(rel)
        if text is None:
            return None
        value = parse(text)
        if value is None:
            self.errors.append(f"{self.base}/{rel}")
        return value


def device_fields(root: FsRoot, device: str) -> dict[str, str]:
    """rdma.fw_ver, rdma.board_id, rdma.hca_type, rdma.node_guid (absent files left out)."""
    reader = _Reader(root, f"{IB_CLASS}/{device}")
    out = {}
    for name in DEVICE_STRINGS:
        value = reader.text(name)
        if value:
            out[f"rdma.{name}"] = value
    return out


def read_port(root: FsRoot, device: str, port: int, device_info: dict[str, str]) -> PortSample:
    reader = _Reader(root, f"{IB_CLASS}/{device}/ports/{port}")
    fields: dict[str, Any] = {"rdma.device": device, "rdma.port": port}
    link_layer = reader.text("link_layer")
    if link_layer:
        fields["rdma.link_layer"] = link_layer
    for name in ("state", "phys_state"):
        state = reader.parsed(name, parse_state)
        if state is not None:
            fields[f"rdma.{name}_id"], fields[f"rdma.{name}"] = state
    rate = reader.parsed("rate", parse_rate)
    if rate is not None:
        fields["rdma.rate_bytes_per_s"] = rate
    fields.update(device_info)
    values: dict[str, int] = {}
    for directory, field_prefix, delta_prefix in COUNTER_DIRS:
        for name in root.listdir(f"{reader.base}/{directory}"):
            text = reader.text(f"{directory}/{name}")
            if text is None:  # listed, yet not read (EIO from a failing firmware query)
                reader.errors.append(f"{reader.base}/{directory}/{name} (unreadable)")
                continue
            if text.startswith(NOT_AVAILABLE):
                continue
            value = parse_counter(text)
            if value is None:
                reader.errors.append(f"{reader.base}/{directory}/{name}")
                continue
            if (directory, name) in WORD_COUNTERS:
                value *= 4
            fields[field_prefix + name] = value
            values[delta_prefix + name] = value
    if reader.errors:
        fields["hpcsec.parse_errors"] = sorted(reader.errors)
    return PortSample(device, port, fields, values, tuple(sorted(reader.errors)))


def read_ports(root: FsRoot) -> list[PortSample]:
    """Every port of every RDMA device under `root`, in device then port order."""
    devices = root.listdir(IB_CLASS)
    if not devices:
        raise SensorUnavailable(f"no RDMA devices under {root.path / IB_CLASS}")
    samples = []
    for device in devices:
        info = device_fields(root, device)
        ports = root.listdir(f"{IB_CLASS}/{device}/ports")
        for port in sorted(int(p) for p in ports if p.isascii() and p.isdigit()):
            samples.append(read_port(root, device, port, info))
    if not samples:
        # Every RDMA device has at least one port; a tree without any (a partial copy, a
        # firmware-only inventory) has no counters to report, which "ok, 0 events" would hide.
        raise SensorUnavailable(
            f"RDMA devices under {root.path / IB_CLASS} have no ports ({', '.join(devices)})"
        )
    return samples


def delta_fields(
    previous: dict[str, int], current: dict[str, int], interval_s: float
) -> dict[str, Any]:
    """rdma.delta.*, rdma.per_s.*, rdma.interval_s and rdma.reset between two samples.

    A counter that went backwards was reset (or wrapped): it is listed in `rdma.reset`
    and gets no delta, so a reset never shows up as a negative or enormous rate.
    """
    out: dict[str, Any] = {"rdma.interval_s": interval_s}
    resets = []
    for name, value in current.items():
        before = previous.get(name)
        if before is None:
            continue
        if value < before:
            resets.append(name)
            continue
        delta = value - before
        out[f"rdma.delta.{name}"] = delta
        if interval_s > 0:
            out[f"rdma.per_s.{name}"] = delta / interval_s
    if resets:
        out["rdma.reset"] = sorted(resets)
    return out


def _epoch(timestamp: str) -> float | None:
    try:
        return parse_time(timestamp).timestamp()
    except ValueError:
        return None


class RdmaCountersSensor:
    name = NAME

    def collect(self, ctx: SensorContext) -> list[Event]:
        samples = read_ports(ctx.sys)
        now = _epoch(ctx.timestamp)
        previous = ctx.state.get(NAME) or {}
        before_time = previous.get("time")
        before_ports = previous.get("ports", {})
        events = []
        for sample in samples:
            fields = dict(sample.fields)
            before = before_ports.get(sample.key)
            if before is not None and now is not None and before_time is not None:
                fields.update(delta_fields(before, sample.values, now - before_time))
            events.append(
                new_event("rdma_counters", "sample", NAME, ctx.host_name, ctx.timestamp, fields)
            )
        ctx.state[NAME] = {"time": now, "ports": {s.key: s.values for s in samples}}
        return events

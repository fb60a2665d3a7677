"""RoCE v2 flows from a capture: one `roce_flow` event per (source.ip, destination.ip,
rdma.qp.dqpn) and interval of packet time.

Reads a pcap/pcapng file (`--pcap FILE`) or sniffs an interface, typically a mirror port
(`--interface IFACE`, for `--duration` seconds, 10 by default). RoCE v2 is UDP to port 4791
carrying an InfiniBand BTH; the RETH of RDMA WRITE FIRST/ONLY and READ REQUEST packets gives
the rkey and length of each remote access (see roce_headers). Intervals are aligned to
multiples of `--flow-interval` seconds (10 by default) of packet time, and an event's
@timestamp is the start of its interval, so a replayed capture gives the same events.

Malformed packets never stop the capture: a RoCE packet too short for its BTH cannot be
tied to a flow and is reported by a `dropped` status record; a packet whose BTH names an
extension header that is missing or cut short is counted in its flow and named in the
flow's `hpcsec.parse_errors`. This sensor is capture-based: node snapshots hold no packets.
"""

from __future__ import annotations

import contextlib
import math
import socket
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from scapy.contrib.roce import AETH, BTH
from scapy.error import Scapy_Exception
from scapy.layers.inet import IP, UDP
from scapy.layers.inet6 import IPv6
from scapy.packet import Packet
from scapy.utils import PcapReader

from hpcsec.detector.core.log import get_logger
from hpcsec.detector.core.schema import Event, new_event, rfc3339
from hpcsec.sensors.base import SensorContext, SensorUnavailable
from hpcsec.sensors.rdma import roce_filter
from hpcsec.sensors.rdma.roce_headers import (
    ACK_OPS,
    ATOMIC_OPS,
    NAK_SYNDROME,
    OPERATION_MASK,
    READ_REQUEST_OP,
    RETH,
    SEND_OPS,
    TRANSPORT_MASK,
    VALID_OPS,
    WRITE_REQUEST_OPS,
    AtomicETH,
    required_header,
)

NAME = "roce"
ROCE_V2_PORT = roce_filter.ROCE_V2_PORT  # IANA's port for RoCEv2
DEFAULT_INTERVAL_S = 10.0
DEFAULT_DURATION_S = 10.0
MAX_REPORTED_ERRORS = 20
# A capture's flows and a flow's distinct rkeys are kept up to these bounds: datagrams to
# port 4791 with random QPs and rkeys need no privilege. Packets of flows past the bound
# are counted in a `dropped` status.
MAX_FLOWS = 50_000
MAX_RKEYS = 4_096
LOOPBACK = "lo"

logger = get_logger(__name__)
SOL_PACKET, PACKET_IGNORE_OUTGOING = 263, 23  # linux/socket.h, linux/if_packet.h


class CaptureError(Exception):
    """The capture cannot be read at all (missing file, not a capture, no interface)."""


@dataclass
class FlowCounts:
    packets: int = 0
    bytes: int = 0
    write_requests: int = 0
    write_bytes: int = 0
    read_requests: int = 0
    read_bytes: int = 0
    atomic_requests: int = 0
    sends: int = 0
    acks: int = 0
    naks: int = 0
    rkeys: set[int] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    error_count: int = 0


FlowKey = tuple[float, str, str, int]  # interval start, source, destination, dqpn


def _add_rkey(counts: FlowCounts, rkey: int) -> None:
    """Distinct rkeys of a flow, up to MAX_RKEYS (a probe of random rkeys is past any
    rule's threshold long before; the count stays at the bound)."""
    if len(counts.rkeys) < MAX_RKEYS:
        counts.rkeys.add(rkey)


# capture times an event can carry (RFC 3339 years 1970..9999)
FIRST_S = 0.0
LAST_S = datetime(9999, 1, 1, tzinfo=UTC).timestamp()


class FlowAggregator:
    """Folds packets into per-flow, per-interval counts."""

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S):
        if not interval_s > 0:
            raise ValueError(f"flow interval must be positive, got {interval_s!r}")
        self.interval_s = interval_s
        self.flows: dict[FlowKey, FlowCounts] = {}
        self.untracked_packets = 0  # of flows past MAX_FLOWS
        self.packets_seen = 0
        self.unattributed: list[str] = []
        self.unattributed_count = 0

    def add(self, packet: Packet) -> None:
        """One captured frame; frames that are not RoCE v2 are ignored. A frame that cannot
        be read is counted and named (`unattributed`), and the capture goes on: any user can
        send the port a datagram (one IPv6 fragment of it ended a whole capture)."""
        self.packets_seen += 1
        try:
            self._add(packet)
        except Exception as exc:  # scapy dissects what a sender made: anything may be odd
            self._unreadable(f"cannot be read ({type(exc).__name__})")

    def _unreadable(self, why: str) -> None:
        self.unattributed_count += 1
        if len(self.unattributed) < MAX_REPORTED_ERRORS:
            self.unattributed.append(f"packet {self.packets_seen}: {why}")

    def _add(self, packet: Packet) -> None:
        udp = packet.getlayer(UDP)
        if udp is None or udp.dport != ROCE_V2_PORT or udp.underlayer is None:
            return
        bth = udp.getlayer(BTH)
        if bth is None:
            self._unreadable("too short for a BTH")
            return
        ip: Packet | None = udp.underlayer
        while ip is not None and not isinstance(ip, IP | IPv6):  # IPv6 extension headers
            ip = ip.underlayer
        if ip is None:
            self._unreadable("UDP to the RoCE port without an IP header")
            return
        moment = float(packet.time)
        if not FIRST_S <= moment < LAST_S:  # the capture tool's (pcapng's: any 64 bits)
            self._unreadable(f"capture time {moment!r} out of range")
            return
        start = math.floor(moment / self.interval_s) * self.interval_s
        key = (start, str(ip.src), str(ip.dst), int(bth.dqpn))
        counts = self.flows.get(key)
        if counts is None:
            if len(self.flows) >= MAX_FLOWS:  # random QPs or addresses: memory stays bounded
                self.untracked_packets += 1
                return
            counts = self.flows[key] = FlowCounts()
        counts.packets += 1
        counts.bytes += getattr(packet, "wirelen", None) or len(packet)
        self._count_operation(counts, bth)

    def _count_operation(self, counts: FlowCounts, bth: Packet) -> None:
        opcode = int(bth.opcode)
        transport, operation = opcode & TRANSPORT_MASK, opcode & OPERATION_MASK
        if operation not in VALID_OPS.get(transport, ()):
            return  # CNP, RD, vendor-specific or newer opcodes: packets and bytes only
        needed = required_header(opcode)
        if needed is not None and bth.getlayer(needed) is None:
            counts.error_count += 1
            if len(counts.errors) < MAX_REPORTED_ERRORS:
                counts.errors.append(
                    f"packet {self.packets_seen}: opcode {opcode:#04x} without a whole "
                    f"{needed.__name__}"
                )
            return
        if operation in WRITE_REQUEST_OPS:
            reth = bth[RETH]
            counts.write_requests += 1
            counts.write_bytes += int(reth.dma_length)
            _add_rkey(counts, int(reth.rkey))
        elif operation == READ_REQUEST_OP:
            reth = bth[RETH]
            counts.read_requests += 1
            counts.read_bytes += int(reth.dma_length)
            _add_rkey(counts, int(reth.rkey))
        elif operation in ATOMIC_OPS:
            counts.atomic_requests += 1
            _add_rkey(counts, int(bth[AtomicETH].rkey))
        elif operation in SEND_OPS:
            counts.sends += 1
        elif operation in ACK_OPS:
            counts.acks += 1
            if int(bth[AETH].syndrome) >> 5 == NAK_SYNDROME:
                counts.naks += 1

    def events(self, ctx: SensorContext) -> list[Event]:
        out = []
        for key in sorted(self.flows):
            start, source, destination, dqpn = key
            c = self.flows[key]
            fields: dict[str, Any] = {
                "source.ip": source,
                "destination.ip": destination,
                "destination.port": ROCE_V2_PORT,
                "network.transport": "udp",
                "rdma.qp.dqpn": dqpn,
                "network.packets": c.packets,
                "network.bytes": c.bytes,
                "rdma.flow.write_requests": c.write_requests,
                "rdma.flow.write_bytes": c.write_bytes,
                "rdma.flow.read_requests": c.read_requests,
                "rdma.flow.read_bytes": c.read_bytes,
                "rdma.flow.atomic_requests": c.atomic_requests,
                "rdma.flow.sends": c.sends,
                "rdma.flow.acks": c.acks,
                "rdma.flow.naks": c.naks,
                "rdma.flow.rkeys": len(c.rkeys),
                "rdma.flow.interval_s": self.interval_s,
            }
            if c.errors:
                fields["hpcsec.parse_errors"] = list(c.errors)
            timestamp = rfc3339(datetime.fromtimestamp(start, UTC))
            out.append(new_event("roce_flow", "flow", NAME, ctx.host_name, timestamp, fields))
        return out


def read_pcap(path: str, aggregator: FlowAggregator) -> None:
    try:
        with PcapReader(path) as reader:
            for packet in reader:
                aggregator.add(packet)
    except OSError as exc:
        raise CaptureError(f"cannot read capture {path}: {exc.strerror or exc}") from None
    except Scapy_Exception as exc:
        raise CaptureError(f"{path}: not a pcap or pcapng capture ({exc})") from None


def _is_roce(packet: Packet) -> bool:
    udp = packet.getlayer(UDP)
    return udp is not None and udp.dport == ROCE_V2_PORT


def _listen(interface: str, link_type: int | None):
    """A PF_PACKET socket on `interface`. On loopback every packet passes twice (leaving and
    arriving); like libpcap, keep only the arriving copy. On an Ethernet link (`link_type`,
    from /sys/class/net/<if>/type) the kernel drops what cannot be RoCE (roce_filter.py)."""
    from scapy.config import conf

    sock = conf.L2listen(iface=interface)
    if interface == LOOPBACK:
        with contextlib.suppress(OSError):  # PACKET_IGNORE_OUTGOING needs Linux 4.20
            sock.ins.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
    if link_type in roce_filter.ETHERNET_TYPES:
        try:
            roce_filter.attach(sock.ins)
        except OSError as exc:
            logger.warning(
                "roce: the kernel refused the packet filter on %s (%s): every frame is "
                "checked in Python, and a busy port may drop packets",
                interface,
                exc.strerror or exc,
            )
    else:
        logger.warning(
            "roce: %s is not an Ethernet link (type %s): every frame is checked in Python",
            interface,
            link_type,
        )
    return sock


def sniff_interface(
    interface: str,
    duration_s: float,
    aggregator: FlowAggregator,
    link_type: int | None = 1,
) -> None:
    """Sniff for `duration_s` seconds. The kernel keeps what may be RoCE (roce_filter.py, on
    an Ethernet `link_type`), and `_is_roce` decides in Python."""
    from scapy.sendrecv import sniff

    try:
        socket.if_nametoindex(interface)
    except OSError:
        raise CaptureError(f"cannot sniff {interface}: no such network interface") from None
    try:
        sock = _listen(interface, link_type)
    except PermissionError:
        raise SensorUnavailable(f"sniffing {interface} needs root or CAP_NET_RAW") from None
    except OSError as exc:
        raise CaptureError(f"cannot sniff {interface}: {exc.strerror or exc}") from None
    try:
        sniff(
            opened_socket=sock,
            timeout=duration_s,
            store=False,
            prn=aggregator.add,
            lfilter=_is_roce,
        )
    finally:
        sock.close()


class RoceSensor:
    name = NAME

    def collect(self, ctx: SensorContext) -> list[Event]:
        if ctx.replaying:
            raise SensorUnavailable("capture-based: node snapshots hold no packets")
        pcap, interface = ctx.options.get("pcap"), ctx.options.get("interface")
        if not pcap and not interface:
            raise SensorUnavailable(
                "reads a capture: give --pcap FILE or --interface IFACE (snapshots hold no packets)"
            )
        aggregator = FlowAggregator(float(ctx.options.get("flow_interval") or DEFAULT_INTERVAL_S))
        if pcap:
            read_pcap(str(pcap), aggregator)
        else:
            duration = ctx.options.get("duration")
            link = (ctx.sys.read_text(f"class/net/{interface}/type") or "").strip()
            sniff_interface(
                str(interface),
                float(DEFAULT_DURATION_S if duration is None else duration),
                aggregator,
                int(link) if link.isdigit() else None,
            )
        events = aggregator.events(ctx)
        if aggregator.untracked_packets:
            events.append(
                ctx.status(
                    NAME,
                    "dropped",
                    f"{aggregator.untracked_packets} RoCE packets of flows past the "
                    f"{MAX_FLOWS} flows a capture keeps",
                    **{"hpcsec.dropped": aggregator.untracked_packets},
                )
            )
        if aggregator.unattributed_count:
            events.append(
                ctx.status(
                    NAME,
                    "dropped",
                    f"{aggregator.unattributed_count} RoCE packets not read (too short for a "
                    "BTH, no IP header or time, or malformed)",
                    **{"hpcsec.parse_errors": list(aggregator.unattributed)},
                )
            )
        return events

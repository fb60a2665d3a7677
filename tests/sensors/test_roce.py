"""roce: RoCE v2 flows from pcaps built with scapy (known counts), RETH decoding, bad packets."""

import json
import logging
import os
import random
import socket
import threading

import pytest
from scapy.contrib.roce import AETH, BTH
from scapy.layers.inet import IP, TCP, UDP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import Ether
from scapy.packet import Raw
from scapy.utils import wrpcap

from hpcsec.detector.cli import main as cli
from hpcsec.detector.runtime.registry import by_name
from hpcsec.sensors.base import FsRoot, SensorContext, SensorUnavailable, run_sensor
from hpcsec.sensors.rdma import roce
from hpcsec.sensors.rdma.roce import CaptureError, FlowAggregator, RoceSensor, read_pcap
from hpcsec.sensors.rdma.roce_headers import DETH, RETH, XRCETH, AtomicETH

T0 = 1796000400.0  # 2026-11-30T01:00:00Z, the start of an interval
A, B = "10.0.0.1", "10.0.0.2"
# Explicit MACs: scapy would otherwise resolve them (ARP/ND) while building frames.
MACS = {"src": "02:00:0a:00:00:01", "dst": "02:00:0a:00:00:02"}


def _frame(src, dst, opcode, dqpn, *ext, t=T0, payload=b""):
    ip = IPv6(src=src, dst=dst) if ":" in src else IP(src=src, dst=dst)
    packet = Ether(**MACS) / ip / UDP(sport=49152, dport=4791) / BTH(opcode=opcode, dqpn=dqpn)
    for header in ext:
        packet = packet / header
    if payload:
        packet = packet / Raw(payload)
    packet.time = t
    return packet


def _ctx(tmp_path, **options):
    root = FsRoot("sys", tmp_path)
    return SensorContext(
        "gpu-017", root, root, root, timestamp="2026-11-30T02:00:00.000Z", options=options
    )


def _flows(tmp_path, packets, **options):
    path = tmp_path / "capture.pcap"
    wrpcap(str(path), packets)
    events = RoceSensor().collect(_ctx(tmp_path, pcap=str(path), **options))
    return events, {
        (e.get("source.ip"), e.get("destination.ip"), e.get("rdma.qp.dqpn"), e["@timestamp"]): e
        for e in events
    }


def _counts(event):
    return {
        k: v
        for k, v in event.items()
        if k.startswith(("network.", "rdma.flow.")) or k == "hpcsec.parse_errors"
    }


def _expected(packets, **counts):
    base = {
        "network.packets": len(packets),
        "network.bytes": sum(len(p) for p in packets),
        "network.transport": "udp",
        "rdma.flow.interval_s": 10.0,
    }
    for name in (
        "write_requests",
        "write_bytes",
        "read_requests",
        "read_bytes",
        "atomic_requests",
        "sends",
        "acks",
        "naks",
        "rkeys",
    ):
        base[f"rdma.flow.{name}"] = counts.pop(name, 0)
    base.update(counts)
    return base


REQUESTS = [  # A -> B, QP 0x1234: a WRITE of 8 KiB in four packets, and one of everything
    _frame(
        A,
        B,
        0x06,
        0x1234,
        RETH(va=0x7F0000000000, rkey=0x100, dma_length=8192),
        payload=b"w" * 1024,
    ),
    _frame(A, B, 0x07, 0x1234, payload=b"w" * 1024),
    _frame(A, B, 0x07, 0x1234, payload=b"w" * 1024, t=T0 + 1),
    _frame(A, B, 0x08, 0x1234, payload=b"w" * 1024, t=T0 + 2),
    _frame(A, B, 0x0A, 0x1234, RETH(rkey=0x100, dma_length=512), payload=b"o" * 512),
    _frame(A, B, 0x0B, 0x1234, RETH(rkey=0x200, dma_length=64), payload=b"\0\0\0\7" + b"i" * 64),
    _frame(A, B, 0x0C, 0x1234, RETH(rkey=0x300, dma_length=65536)),
    _frame(A, B, 0x14, 0x1234, AtomicETH(rkey=0x400, swap_add=1)),
    _frame(A, B, 0x13, 0x1234, AtomicETH(rkey=0x400, swap_add=2, compare=1)),
    _frame(A, B, 0x04, 0x1234, payload=b"s" * 100),
    _frame(A, B, 0x00, 0x1234, payload=b"s" * 1024),
    _frame(A, B, 0x03, 0x1234, payload=b"\0\0\0\1" + b"s" * 10, t=T0 + 9.999),
]
RESPONSES = [  # B -> A, QP 0x5678
    _frame(B, A, 0x11, 0x5678, AETH(syndrome=0x1F, msn=1)),
    _frame(B, A, 0x11, 0x5678, AETH(syndrome=0x1F, msn=2)),
    _frame(B, A, 0x11, 0x5678, AETH(syndrome=0x62, msn=2)),  # NAK: remote access error
    _frame(B, A, 0x11, 0x5678, AETH(syndrome=0x20, msn=2)),  # RNR NAK: not a NAK
    _frame(B, A, 0x12, 0x5678, AETH(syndrome=0x1F, msn=3), payload=b"\0" * 8),
    _frame(B, A, 0x10, 0x5678, AETH(syndrome=0x1F, msn=4), payload=b"r" * 256),
]


def test_rc_requests_and_responses_are_counted_exactly(tmp_path):
    events, flows = _flows(tmp_path, REQUESTS + RESPONSES)
    assert len(events) == 2
    start = "2026-11-30T01:00:00.000Z"
    request = flows[(A, B, 0x1234, start)]
    assert _counts(request) == _expected(
        REQUESTS,
        write_requests=3,
        write_bytes=8192 + 512 + 64,
        read_requests=1,
        read_bytes=65536,
        atomic_requests=2,
        sends=3,
        rkeys=4,
    )
    assert request["event.category"] == "roce_flow"
    assert request["event.action"] == "flow"
    assert request["destination.port"] == 4791
    response = flows[(B, A, 0x5678, start)]
    assert _counts(response) == _expected(RESPONSES, acks=5, naks=1)


def test_uc_xrc_ud_ipv6_and_cnp(tmp_path):
    uc = [
        _frame(A, B, 0x26, 77, RETH(rkey=0x900, dma_length=4096), payload=b"u" * 1024),
        _frame(A, B, 0x24, 77, payload=b"u" * 8),
    ]
    xrc = [
        _frame(A, B, 0xAA, 78, XRCETH(xrcsrq=5), RETH(rkey=0xA00, dma_length=128)),
        _frame(A, B, 0xAC, 78, XRCETH(xrcsrq=5), RETH(rkey=0xA01, dma_length=256)),
        _frame(A, B, 0xB4, 78, XRCETH(xrcsrq=5), AtomicETH(rkey=0xA00)),
        _frame(A, B, 0xA4, 78, XRCETH(xrcsrq=5), payload=b"x" * 30),
        _frame(B, A, 0xB1, 79, AETH(syndrome=0x1F)),
    ]
    ud = [_frame(A, B, 0x64, 1, DETH(qkey=0x80010000, srcqp=1), payload=b"m" * 256)]
    v6 = [
        _frame(
            "fd00::1", "fd00::2", 0x0A, 80, RETH(rkey=7, dma_length=1 << 20), payload=b"6" * 900
        ),
        _frame("fd00::1", "fd00::2", 0x81, 80, payload=b"\0" * 16),
    ]  # CNP
    events, flows = _flows(tmp_path, uc + xrc + ud + v6)
    start = "2026-11-30T01:00:00.000Z"
    assert len(events) == 5
    assert _counts(flows[(A, B, 77, start)]) == _expected(
        uc, write_requests=1, write_bytes=4096, sends=1, rkeys=1
    )
    assert _counts(flows[(A, B, 78, start)]) == _expected(
        xrc[:4],
        write_requests=1,
        write_bytes=128,
        read_requests=1,
        read_bytes=256,
        atomic_requests=1,
        sends=1,
        rkeys=2,
    )
    assert _counts(flows[(B, A, 79, start)]) == _expected(xrc[4:], acks=1)
    assert _counts(flows[(A, B, 1, start)]) == _expected(ud, sends=1)
    assert _counts(flows[("fd00::1", "fd00::2", 80, start)]) == _expected(
        v6, write_requests=1, write_bytes=1 << 20, rkeys=1
    )


def test_intervals_are_packet_time_and_aligned(tmp_path):
    packets = [
        _frame(A, B, 0x0A, 9, RETH(rkey=1, dma_length=10), t=T0 + 3),
        _frame(A, B, 0x0A, 9, RETH(rkey=2, dma_length=20), t=T0 + 9.5),
        _frame(A, B, 0x0A, 9, RETH(rkey=3, dma_length=40), t=T0 + 10.0),
        _frame(A, B, 0x0A, 9, RETH(rkey=3, dma_length=80), t=T0 + 31),
    ]
    events, _ = _flows(tmp_path, packets)
    assert [
        (e["@timestamp"], e["rdma.flow.write_bytes"], e["rdma.flow.rkeys"]) for e in events
    ] == [
        ("2026-11-30T01:00:00.000Z", 30, 2),
        ("2026-11-30T01:00:10.000Z", 40, 1),
        ("2026-11-30T01:00:30.000Z", 80, 1),
    ]
    events, _ = _flows(tmp_path, packets, flow_interval=60)
    assert [
        (e["@timestamp"], e["rdma.flow.write_requests"], e["rdma.flow.interval_s"]) for e in events
    ] == [("2026-11-30T01:00:00.000Z", 4, 60.0)]


def test_non_roce_traffic_is_ignored(tmp_path):
    other = [
        Ether(**MACS) / IP(src=A, dst=B) / UDP(dport=53) / Raw(b"q" * 40),
        Ether(**MACS) / IP(src=A, dst=B) / TCP(dport=4791) / Raw(b"t" * 40),
        Ether(**MACS) / IP(src=A, dst=B) / UDP(sport=4791, dport=50000) / Raw(b"z" * 40),
    ]
    events, _ = _flows(tmp_path, other)
    assert events == []


def test_truncated_and_short_packets_are_counted_not_fatal(tmp_path):
    good = _frame(A, B, 0x0A, 5, RETH(rkey=1, dma_length=64), payload=b"g" * 64)
    cut_reth = (
        Ether(**MACS)
        / IP(src=A, dst=B)
        / UDP(sport=1, dport=4791)
        / Raw(bytes(BTH(opcode=0x0A, dqpn=5, icrc=0))[:12] + b"\1" * 10)
    )
    cut_aeth = (
        Ether(**MACS)
        / IP(src=A, dst=B)
        / UDP(sport=1, dport=4791)
        / Raw(bytes(BTH(opcode=0x11, dqpn=5, icrc=0))[:12] + b"\1" * 6)
    )
    runt = Ether(**MACS) / IP(src=A, dst=B) / UDP(sport=1, dport=4791) / Raw(b"\x0a\0\0")
    for p in (cut_reth, cut_aeth, runt):
        p.time = T0
    events = _flows(tmp_path, [good, cut_reth, runt, cut_aeth])[0]
    flow, status = events
    assert flow["network.packets"] == 3
    assert flow["rdma.flow.write_requests"] == 1
    assert flow["rdma.flow.acks"] == 0
    assert flow["hpcsec.parse_errors"] == [
        "packet 2: opcode 0x0a without a whole RETH",
        "packet 4: opcode 0x11 without a whole AETH",
    ]
    assert status["event.category"] == "sensor_status"
    assert status["event.action"] == "dropped"
    assert status["message"] == (
        "1 RoCE packets not read (too short for a BTH, no IP header or time, or malformed)"
    )
    assert status["hpcsec.parse_errors"] == ["packet 3: too short for a BTH"]


def test_truncated_pcap_file_keeps_the_whole_records(tmp_path):
    path = tmp_path / "cut.pcap"
    wrpcap(str(path), REQUESTS[:3])
    path.write_bytes(path.read_bytes()[:-100])  # the capture stopped mid-record
    events = RoceSensor().collect(_ctx(tmp_path, pcap=str(path)))
    assert events[0]["network.packets"] == 3
    assert events[0]["network.bytes"] == sum(len(p) for p in REQUESTS[:3])  # wire length


def test_missing_options_and_bad_files(tmp_path):
    with pytest.raises(SensorUnavailable, match=r"give --pcap FILE or --interface IFACE"):
        RoceSensor().collect(_ctx(tmp_path))
    with pytest.raises(CaptureError, match=r"^cannot read capture .*/nope.pcap: No such file"):
        read_pcap(str(tmp_path / "nope.pcap"), FlowAggregator())
    junk = tmp_path / "junk.pcap"
    junk.write_bytes(b"this is not a capture file at all")
    run = run_sensor(by_name()["roce"], RoceSensor(), _ctx(tmp_path, pcap=str(junk)))
    assert run.status["event.action"] == "error"
    assert run.status["message"].startswith(f"CaptureError: {junk}: not a pcap or pcapng capture")
    with pytest.raises(ValueError, match="flow interval must be positive, got 0"):
        FlowAggregator(0)
    with pytest.raises(CaptureError, match=r"^cannot sniff hpcsec-none0: no such network "):
        RoceSensor().collect(_ctx(tmp_path, interface="hpcsec-none0", duration=0.1))
    replaying = _ctx(tmp_path, pcap=str(junk))
    replaying.replay_inputs = {}
    with pytest.raises(SensorUnavailable, match=r"^capture-based: node snapshots hold no packets$"):
        RoceSensor().collect(replaying)


def test_registry_entry_is_opt_in():
    spec = by_name()["roce"]
    assert spec.default_enabled is False
    assert spec.categories == ("roce_flow",)


@pytest.mark.skipif(os.geteuid() != 0, reason="sniffing needs root (CI runs as root)")
def test_sniffing_loopback_sees_roce_datagrams(tmp_path, caplog, sniffer_open):
    """Only this test's datagrams are counted: anything else on the machine may send to the
    RoCE port on `lo` meanwhile (another test run, another worker), so ours come from a
    source address and QP of their own. The link's type comes from the sysfs root: loopback,
    so the kernel filter is attached (a warning would say otherwise)."""
    (tmp_path / "class/net/lo").mkdir(parents=True)
    (tmp_path / "class/net/lo/type").write_text("772\n")  # ARPHRD_LOOPBACK
    source = f"127.{random.randrange(1, 255)}.{random.randrange(1, 255)}.{random.randrange(2, 255)}"
    dqpn = random.randrange(0x100, 0xFFFFFF)
    bth = bytes(BTH(opcode=0x0A, dqpn=dqpn, icrc=0) / RETH(rkey=0x77, dma_length=4096))

    def send_later():
        if not sniffer_open.wait(60):
            return  # the sniff never started: the test fails on what it did not see
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((source, 0))
            for _ in range(3):
                s.sendto(bth + b"\0\0\0\0", ("127.0.0.1", 4791))

    sender = threading.Thread(target=send_later)
    sender.start()
    with caplog.at_level(logging.WARNING):
        events = RoceSensor().collect(_ctx(tmp_path, interface="lo", duration=2.0))
    sender.join()
    assert "roce:" not in caplog.text
    flows = [
        e
        for e in events
        if e["event.category"] == "roce_flow"
        and e["source.ip"] == source
        and e["rdma.qp.dqpn"] == dqpn
    ]
    assert sum(e["network.packets"] for e in flows) == 3
    assert {e["destination.ip"] for e in flows} == {"127.0.0.1"}
    assert sum(e["rdma.flow.write_bytes"] for e in flows) == 3 * 4096


def test_reth_and_atomic_eth_are_dissected_from_wire_bytes():
    wire = bytes(REQUESTS[0])  # WRITE FIRST, as it would come off a capture
    frame = Ether(wire)
    assert frame[BTH].opcode == 0x06 and frame[BTH].dqpn == 0x1234
    reth = frame[RETH]
    assert (reth.va, reth.rkey, reth.dma_length) == (0x7F0000000000, 0x100, 8192)
    assert bytes(reth.payload)[:4] == b"wwww"  # payload follows the 16-byte RETH
    read = Ether(bytes(REQUESTS[6]))[RETH]
    assert (read.rkey, read.dma_length) == (0x300, 65536)
    atomic = Ether(bytes(REQUESTS[8]))[AtomicETH]
    assert (atomic.rkey, atomic.swap_add, atomic.compare) == (0x400, 2, 1)
    assert RETH not in Ether(bytes(REQUESTS[1]))  # WRITE MIDDLE carries no RETH


def test_collect_cli_reads_a_pcap(tmp_path, capsys):
    path = tmp_path / "mirror.pcap"
    wrpcap(str(path), REQUESTS + RESPONSES)
    assert (
        cli.main(
            [
                "collect",
                "--sensor",
                "roce",
                "--raw",
                "--pcap",
                str(path),
                "--sysfs-root",
                str(tmp_path),
            ]
        )
        == 0
    )
    out, err = capsys.readouterr()
    assert err == "hpcsec: sensor roce: ok: 2 events\n"
    records = [json.loads(line) for line in out.splitlines()]
    assert [
        (r["event.category"], r.get("rdma.qp.dqpn"), r.get("rdma.flow.read_bytes")) for r in records
    ] == [("roce_flow", 0x1234, 65536), ("roce_flow", 0x5678, 0), ("sensor_status", None, None)]


def test_collect_cli_without_a_capture_is_a_status_and_bad_arguments_exit_2(tmp_path, capsys):
    assert cli.main(["collect", "--sensor", "roce", "--raw"]) == 0
    out, err = capsys.readouterr()
    assert err == (
        "hpcsec: sensor roce: unavailable: reads a capture: give --pcap FILE or "
        "--interface IFACE (snapshots hold no packets)\n"
    )
    assert json.loads(out)["event.action"] == "unavailable"
    for argv, message in (
        (["--pcap", str(tmp_path / "none.pcap")], f"--pcap {tmp_path}/none.pcap: no such file"),
        (["--pcap", __file__, "--interface", "lo"], "--pcap and --interface exclude each other"),
        (
            ["--interface", "lo", "--flow-interval", "0"],
            "--flow-interval must be a positive number of seconds, got 0",
        ),
        (
            ["--interface", "lo", "--duration", "-1"],
            "--duration must be zero or more seconds, got -1",
        ),
        (["--interface", "hpcsec-none0"], "--interface hpcsec-none0: no such network interface"),
    ):
        assert cli.main(["collect", "--sensor", "roce", *argv]) == 2
        assert capsys.readouterr() == ("", f"hpcsec: error: {message}\n")


def test_scan_evaluates_the_rules_on_a_capture(tmp_path, capsys):
    """`hpcsec scan --pcap`: a peer probing 80 rkeys of this node raises the rkey rule."""
    probe = [
        _frame(
            A,
            B,
            0x0C,
            0x4321,
            RETH(va=0x7F0000000000, rkey=0x1000 + i, dma_length=64),
            t=T0 + i * 0.01,
        )
        for i in range(80)
    ]
    path = tmp_path / "probe.pcap"
    wrpcap(str(path), probe)
    rc = cli.main(
        [
            "scan",
            "--sensor",
            "roce",
            "--pcap",
            str(path),
            "--sysfs-root",
            str(tmp_path),
            "--format",
            "json",
        ]
    )
    out, err = capsys.readouterr()
    assert rc == 1, err
    alerts = json.loads(out)
    assert "RoCE flow touching many distinct rkeys" in {a["rule.title"] for a in alerts}
    assert "hpcsec: sensor roce: ok: 1 events" in err
    assert cli.main(["scan", "--pcap", str(path), "--events", str(path)]) == 2


def test_flows_and_rkeys_are_bounded_and_the_rest_counted(tmp_path, monkeypatch):
    """Datagrams to 4791 with random QPs and rkeys need no privilege: past the bounds the
    capture keeps no more flows (their packets are counted in a `dropped` status) and a
    flow's rkey count stays at its bound."""
    monkeypatch.setattr(roce, "MAX_FLOWS", 3)
    monkeypatch.setattr(roce, "MAX_RKEYS", 2)

    def write(dqpn: int, rkey: int):
        frame = Ether() / IP(src="10.0.0.1", dst="10.0.0.2") / UDP(sport=5000, dport=4791)
        return frame / BTH(opcode=0x0A, dqpn=dqpn) / RETH(rkey=rkey, dma_length=64) / Raw(b"x")

    packets = [write(dqpn, rkey) for dqpn in (1, 2, 3, 4, 5) for rkey in (7, 8, 9)]
    for i, packet in enumerate(packets):
        packet.time = 1_764_464_400 + i * 0.001
    events, keyed = _flows(tmp_path, packets)
    flows = {k: e for k, e in keyed.items() if e["event.category"] == "roce_flow"}
    assert sorted(key[2] for key in flows) == [1, 2, 3]
    assert {e["rdma.flow.rkeys"] for e in flows.values()} == {2}
    assert {e["network.packets"] for e in flows.values()} == {3}
    (dropped,) = [e for e in events if e["event.action"] == "dropped"]
    assert dropped["hpcsec.dropped"] == 6 and "past the 3 flows" in dropped["message"]


def test_ipv6_extension_headers_before_udp_neither_end_the_capture_nor_lose_the_flow(tmp_path):
    """Any user can send the RoCE port an IPv6 datagram larger than the MTU: the kernel's
    first fragment carries a fragment header between IPv6 and UDP, and reading the addresses
    from that header ended the whole capture (every flow lost; a live sniff stopped)."""
    from scapy.layers.inet6 import IPv6ExtHdrFragment, IPv6ExtHdrHopByHop, IPv6ExtHdrRouting

    good = _frame(A, B, 0x0A, 5, RETH(rkey=1, dma_length=64), payload=b"g" * 64)
    odd = []
    for header in (IPv6ExtHdrFragment(m=1, id=7), IPv6ExtHdrHopByHop(), IPv6ExtHdrRouting()):
        packet = (
            Ether(**MACS)
            / IPv6(src="fd00::1", dst="fd00::2")
            / header
            / UDP(sport=1, dport=4791)
            / BTH(opcode=0x04, dqpn=9)
            / Raw(b"x" * 32)
        )
        packet.time = T0
        odd.append(packet)
    events, flows = _flows(tmp_path, [good, *odd, good])
    assert flows[(A, B, 5, "2026-11-30T01:00:00.000Z")]["network.packets"] == 2
    assert flows[("fd00::1", "fd00::2", 9, "2026-11-30T01:00:00.000Z")]["rdma.flow.sends"] == 3
    assert not [e for e in events if e["event.category"] == "sensor_status"]


def test_a_packet_that_cannot_be_read_is_counted_and_the_capture_goes_on():
    from struct import error as struct_error

    class Odd:  # whatever scapy's dissection may raise on a sender's bytes
        time = T0

        def getlayer(self, _layer):
            raise struct_error("unpack requires a buffer of 4 bytes")

    aggregator = FlowAggregator()
    # a pcapng time no event can carry (its 64 bits), one before the epoch, an odd packet
    for packet in (_frame(A, B, 0x04, 6, t=2.0**64), _frame(A, B, 0x04, 6, t=-5.0), Odd()):
        aggregator.add(packet)
    aggregator.add(_frame(A, B, 0x04, 5))
    assert aggregator.unattributed == [
        "packet 1: capture time 1.8446744073709552e+19 out of range",
        "packet 2: capture time -5.0 out of range",
        "packet 3: cannot be read (error)",
    ]
    assert [key[1:] for key in aggregator.flows] == [(A, B, 5)]

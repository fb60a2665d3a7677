"""The RoCE sniffer's kernel filter (sensors/rdma/roce_filter.py), run by the real kernel on a
packet socket on `lo`: datagrams to port 4791 pass whatever their IPv4 header's length, over
IPv4 and IPv6; other UDP and TCP are dropped; and on a link without the filter the sensor
says so and still reads RoCE datagrams."""

from __future__ import annotations

import logging
import os
import random
import select
import socket
import threading
import time
import uuid

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Dot1Q, Ether

from hpcsec.sensors.rdma import roce_filter
from hpcsec.sensors.rdma.roce import FlowAggregator, sniff_interface

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="packet sockets need root")

ETH_P_ALL = 0x0003
PACKET_IGNORE_OUTGOING = 23
IP_OPTIONS = 4


def filtered_socket() -> socket.socket:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.bind(("lo", 0))
    sock.setsockopt(263, PACKET_IGNORE_OUTGOING, 1)  # SOL_PACKET: each frame once
    roce_filter.attach(sock)
    # frames queued between the socket's creation and the filter did not pass through it
    sock.setblocking(False)
    while select.select([sock], [], [], 0)[0]:
        sock.recv(65536)
    return sock


def frames_with(sock: socket.socket, markers: list[bytes], wait_s: float = 1.5) -> set[bytes]:
    """The markers found in the frames the socket receives within `wait_s`."""
    seen: set[bytes] = set()
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if select.select([sock], [], [], 0.05)[0]:
            frame = sock.recv(65536)
            seen.update(m for m in markers if m in frame)
    return seen


def send_udp(family: int, destination: tuple, payload: bytes, options: bytes = b"") -> None:
    with socket.socket(family, socket.SOCK_DGRAM) as udp:
        if options:
            udp.setsockopt(socket.IPPROTO_IP, IP_OPTIONS, options)
        udp.sendto(payload, destination)


def test_the_kernel_passes_roce_datagrams_only():
    marks = {
        name: f"hpcsec-{name}-{uuid.uuid4().hex}".encode()
        for name in (
            "v4",
            "v4-options",
            "v6",
            "v4-other-port",
            "v6-other-port",
            "tcp",
            "gre",
            "vlan",
            "vlan-other-port",
            "llc",
            "arp",
        )
    }
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))  # a port of our own for the other-port datagrams
    other_port = receiver.getsockname()[1]
    listener = socket.create_server(("127.0.0.1", 0))
    sock = filtered_socket()
    try:
        send_udp(socket.AF_INET, ("127.0.0.1", 4791), marks["v4"])
        # NOP, NOP, NOP, end of options: a 24-byte IPv4 header, the UDP header 4 bytes on
        send_udp(socket.AF_INET, ("127.0.0.1", 4791), marks["v4-options"], b"\x01\x01\x01\x00")
        send_udp(socket.AF_INET6, ("::1", 4791), marks["v6"])
        send_udp(socket.AF_INET, ("127.0.0.1", other_port), marks["v4-other-port"])
        send_udp(socket.AF_INET6, ("::1", other_port), marks["v6-other-port"])
        # a GRE packet (as an ERSPAN mirror sends): for scapy to open; 802.1Q-tagged frames
        # (Linux strips the tag before packet sockets see them, as VLAN offload does)
        with socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_GRE) as gre:
            gre.sendto(bytes(4) + marks["gre"], ("127.0.0.1", 0))
        with socket.socket(socket.AF_PACKET, socket.SOCK_RAW) as raw:
            raw.bind(("lo", 0))
            for port, mark in ((4791, marks["vlan"]), (other_port, marks["vlan-other-port"])):
                tagged = Ether() / Dot1Q(vlan=5) / IP(dst="127.0.0.1") / UDP(dport=port) / mark
                raw.send(bytes(tagged))
            # 802.3: a length where the EtherType would be (LLC, SNAP): for scapy to open
            llc = b"\xaa\xaa\x03" + marks["llc"]
            raw.send(bytes(12) + len(llc).to_bytes(2, "big") + llc)
            raw.send(bytes(12) + b"\x08\x06" + marks["arp"])  # ARP: dropped
        with socket.create_connection(listener.getsockname()) as tcp:
            tcp.sendall(marks["tcp"])
            peer, _ = listener.accept()
            peer.recv(1024)
            peer.close()
        seen = frames_with(sock, list(marks.values()))
    finally:
        sock.close()
        receiver.close()
        listener.close()
    assert seen == {marks[name] for name in ("v4", "v4-options", "v6", "gre", "vlan", "llc")}


def test_the_program_jumps_forward_within_range():
    program = roce_filter.assemble()
    assert program[-2:] == [(0x06, 0, 0, 0x40000), (0x06, 0, 0, 0)]  # pass, drop
    for i, (code, jt, jf, _k) in enumerate(program):
        if code & 0x07 == 0x05:  # a jump: both targets inside the program
            assert i + 1 + max(jt, jf) < len(program)


def test_a_link_without_the_filter_is_said_and_still_read(caplog, sniffer_open):
    """Not Ethernet (no /sys type, or another): the frames are checked in Python only."""
    source = f"127.{random.randrange(1, 255)}.{random.randrange(1, 255)}.{random.randrange(2, 255)}"
    aggregator = FlowAggregator()

    def send_later() -> None:
        if not sniffer_open.wait(60):
            return  # the sniff never started: the test fails on what it did not see
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind((source, 0))
            # BTH: RDMA WRITE ONLY to QP 0x123456, then a 16-byte RETH and the ICRC
            bth = bytes([0x0A, 0, 0xFF, 0xFF, 0, 0x12, 0x34, 0x56, 0, 0, 0, 1])
            reth = bytes(8) + (0x77).to_bytes(4, "big") + (4096).to_bytes(4, "big")
            s.sendto(bth + reth + bytes(4), ("127.0.0.1", 4791))

    sender = threading.Thread(target=send_later)
    sender.start()
    with caplog.at_level(logging.WARNING):
        sniff_interface("lo", 2.0, aggregator, link_type=None)
    sender.join()
    assert "lo is not an Ethernet link" in caplog.text
    flows = [key for key in aggregator.flows if source in str(key)]
    assert flows

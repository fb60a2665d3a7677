"""A kernel-side filter for the RoCE sniffer: classic BPF attached to its packet socket.

Without one, every frame of a busy mirror port is copied to the socket and decoded by scapy
in Python, and RoCE datagrams are dropped when the socket's buffer fills with the rest.
libpcap or tcpdump would compile a filter expression, but compute nodes often lack both, so
the program is written here, for Ethernet frames. It only drops frames that the Python check
(`roce._is_roce`: the first UDP header's destination port is 4791) would drop too:

- IPv4: UDP to port 4791 passes (any header length); other UDP, TCP, ICMP and later
  fragments (no UDP header of their own) are dropped; tunnels (IP-in-IP, IPv6-in-IPv4, GRE)
  pass, for scapy to open (GRE carrying IP or Ethernet; it does not decode ERSPAN's own
  header, so a mirror that sends ERSPAN is not read through);
- IPv6: UDP to port 4791 passes, other UDP, TCP and ICMPv6 are dropped; extension headers
  and tunnels pass;
- a VLAN tag: Linux strips one before packet sockets see the frame (as VLAN offload
  does), so it is filtered as untagged; a frame still tagged (the inner tag of 802.1ad
  QinQ) passes, its headers being further on;
- 802.3 frames (a length, 1500 or less, where the EtherType would be: LLC and SNAP) pass;
- other EtherTypes (ARP, LLDP…) are dropped.
"""

from __future__ import annotations

import ctypes
import socket

ROCE_V2_PORT = 4791
SO_ATTACH_FILTER = 26  # asm-generic/socket.h
ETHERNET_TYPES = {1, 772}  # ARPHRD_ETHER, ARPHRD_LOOPBACK (an Ethernet header of zeros)
_KEEP = 0x40000  # bytes of a passing frame handed to the socket (more than any MTU)

# classic BPF opcodes (linux/filter.h)
_LDH_ABS, _LDB_ABS, _LDH_IND, _LDXB_MSH = 0x28, 0x30, 0x48, 0xB1
_JEQ, _JGT, _JSET, _RET = 0x15, 0x25, 0x45, 0x06
_ETH = 14  # Ethernet header
_IP6 = 40  # IPv6 fixed header

_PASS, _DROP = "pass", "drop"
# (label, opcode, k, jump if true, jump if false): a jump names a label; None falls through
_PROGRAM: list[tuple[str | None, int, int, str | None, str | None]] = [
    (None, _LDH_ABS, 12, None, None),  # EtherType
    (None, _JGT, 1500, None, _PASS),  # else an 802.3 length: LLC or SNAP, for scapy
    (None, _JEQ, 0x0800, "ipv4", None),
    (None, _JEQ, 0x86DD, "ipv6", None),
    (None, _JEQ, 0x8100, _PASS, None),
    (None, _JEQ, 0x88A8, _PASS, _DROP),
    ("ipv4", _LDB_ABS, _ETH + 9, None, None),  # protocol
    (None, _JEQ, socket.IPPROTO_UDP, "udp4", None),
    (None, _JEQ, 4, _PASS, None),  # IP-in-IP
    (None, _JEQ, 41, _PASS, None),  # IPv6-in-IPv4
    (None, _JEQ, 47, _PASS, _DROP),  # GRE (ERSPAN)
    ("udp4", _LDH_ABS, _ETH + 6, None, None),  # flags and fragment offset
    (None, _JSET, 0x1FFF, _DROP, None),  # a later fragment: no UDP header
    (None, _LDXB_MSH, _ETH, None, None),  # X = the IPv4 header's length
    (None, _LDH_IND, _ETH + 2, None, None),  # UDP destination port
    (None, _JEQ, ROCE_V2_PORT, _PASS, _DROP),
    ("ipv6", _LDB_ABS, _ETH + 6, None, None),  # next header
    (None, _JEQ, socket.IPPROTO_UDP, "udp6", None),
    (None, _JEQ, socket.IPPROTO_TCP, _DROP, None),
    (None, _JEQ, 58, _DROP, _PASS),  # ICMPv6; extension headers and tunnels pass
    ("udp6", _LDH_ABS, _ETH + _IP6 + 2, None, None),  # UDP destination port
    (None, _JEQ, ROCE_V2_PORT, _PASS, _DROP),
    (_PASS, _RET, _KEEP, None, None),
    (_DROP, _RET, 0, None, None),
]


class _Instruction(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_uint16),
        ("jt", ctypes.c_uint8),
        ("jf", ctypes.c_uint8),
        ("k", ctypes.c_uint32),
    ]


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(_Instruction))]


def assemble() -> list[tuple[int, int, int, int]]:
    """The program as (code, jt, jf, k), its labels resolved to forward offsets."""
    where = {label: i for i, (label, *_rest) in enumerate(_PROGRAM) if label is not None}

    def offset(i: int, target: str | None) -> int:
        if target is None:
            return 0
        jump = where[target] - (i + 1)
        if not 0 <= jump <= 255:
            raise ValueError(f"BPF jump to {target} from {i} out of range")
        return jump

    return [
        (code, offset(i, jt), offset(i, jf), k)
        for i, (_label, code, k, jt, jf) in enumerate(_PROGRAM)
    ]


def attach(sock: socket.socket) -> None:
    """Attach the filter to `sock`, a packet socket on an Ethernet or loopback interface.
    Raises OSError when the kernel refuses it."""
    program = assemble()
    instructions = (_Instruction * len(program))(*(_Instruction(*i) for i in program))
    fprog = _Program(len(program), instructions)
    # the kernel copies the instructions during the call; `instructions` lives until then
    sock.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER, bytes(fprog))

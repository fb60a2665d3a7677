"""InfiniBand transport extension headers that scapy's RoCE v2 support lacks.

scapy.contrib.roce dissects the Base Transport Header (BTH) and, for ACKs, the AETH. The
headers that say *what* a request touches are missing: the RDMA Extended Transport Header
(RETH: virtual address, rkey, DMA length) of RDMA WRITE and READ requests, and the
AtomicETH of atomics. Binding them here lets the flow sensor read rkeys and lengths.

Header order after the BTH (IBA vol. 1, 9.2 and 9.3; XRC: annex A14):
    RC/UC  WRITE FIRST, WRITE ONLY (+ImmDt), READ REQUEST      BTH RETH
    RC     COMPARE SWAP, FETCH ADD                             BTH AtomicETH
    RC     READ RESPONSE FIRST/LAST/ONLY, ACK, ATOMIC ACK      BTH AETH
    XRC    requests                                            BTH XRCETH (RETH | AtomicETH)
    UD     SEND ONLY (+ImmDt)                                  BTH DETH
RD (reliable datagram) is not implemented by any RoCE device; its packets are counted by
opcode only.
"""

from __future__ import annotations

from scapy.contrib.roce import AETH, BTH
from scapy.fields import BitField, IntField, XByteField, XIntField, XLongField
from scapy.packet import Packet, bind_layers

# Transport bits (the opcode's top three) and operations (its low five).
RC, UC, RD, UD, CNP, XRC = 0x00, 0x20, 0x40, 0x60, 0x80, 0xA0
TRANSPORT_MASK, OPERATION_MASK = 0xE0, 0x1F

SEND_OPS = frozenset({0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x16, 0x17})
WRITE_REQUEST_OPS = frozenset({0x06, 0x0A, 0x0B})  # FIRST, ONLY, ONLY WITH IMMEDIATE
READ_REQUEST_OP = 0x0C
ATOMIC_OPS = frozenset({0x13, 0x14})  # COMPARE SWAP, FETCH ADD
ACK_OPS = frozenset({0x11, 0x12})  # ACKNOWLEDGE, ATOMIC ACKNOWLEDGE
AETH_OPS = frozenset({0x0D, 0x0F, 0x10}) | ACK_OPS  # read responses carry one too
RETH_OPS = WRITE_REQUEST_OPS | {READ_REQUEST_OP}
# Operations each transport defines (UC has no reads, atomics or acks; UD only sends).
VALID_OPS = {
    RC: frozenset(range(0x00, 0x15)) | {0x16, 0x17},
    UC: frozenset(range(0x00, 0x0C)),
    UD: frozenset({0x04, 0x05}),
    XRC: frozenset(range(0x00, 0x15)) | {0x16, 0x17},
}
NAK_SYNDROME = 0b11  # AETH syndrome bits 6..5: 00 ACK, 01 RNR NAK, 11 NAK


class RETH(Packet):
    """RDMA Extended Transport Header: where a WRITE or READ lands, and how much."""

    name = "RETH"
    fields_desc = [XLongField("va", 0), XIntField("rkey", 0), IntField("dma_length", 0)]


class AtomicETH(Packet):
    """Atomic Extended Transport Header of COMPARE SWAP and FETCH ADD."""

    name = "AtomicETH"
    fields_desc = [
        XLongField("va", 0),
        XIntField("rkey", 0),
        XLongField("swap_add", 0),
        XLongField("compare", 0),
    ]


class DETH(Packet):
    """Datagram Extended Transport Header (UD): queue key and source QP."""

    name = "DETH"
    fields_desc = [XIntField("qkey", 0), XByteField("reserved", 0), BitField("srcqp", 0, 24)]


def _bth_opcode(layer: Packet) -> int | None:
    under = layer.underlayer
    while under is not None and not isinstance(under, BTH):
        under = under.underlayer
    return None if under is None else under.opcode


class XRCETH(Packet):
    """XRC Extended Transport Header: the target shared receive queue; precedes RETH."""

    name = "XRCETH"
    fields_desc = [XByteField("reserved", 0), BitField("xrcsrq", 0, 24)]

    def guess_payload_class(self, payload: bytes):
        opcode = _bth_opcode(self)
        operation = None if opcode is None else opcode & OPERATION_MASK
        if operation in RETH_OPS:
            return RETH
        if operation in ATOMIC_OPS:
            return AtomicETH
        return super().guess_payload_class(payload)


def _bind() -> None:
    for transport in (RC, UC):
        for operation in RETH_OPS & VALID_OPS[transport]:
            bind_layers(BTH, RETH, opcode=transport | operation)
    for operation in ATOMIC_OPS:
        bind_layers(BTH, AtomicETH, opcode=RC | operation)
    for operation in VALID_OPS[XRC]:
        if operation not in AETH_OPS and operation not in {0x0E}:  # requests only
            bind_layers(BTH, XRCETH, opcode=XRC | operation)
    for transport in (RC, XRC):
        for operation in AETH_OPS:
            if (transport, operation) != (RC, 0x11):  # scapy binds RC ACKNOWLEDGE itself
                bind_layers(BTH, AETH, opcode=transport | operation)
    for operation in VALID_OPS[UD]:
        bind_layers(BTH, DETH, opcode=UD | operation)


_bind()


def required_header(opcode: int) -> type[Packet] | None:
    """The extension header a well-formed packet with this opcode must carry, if any."""
    transport, operation = opcode & TRANSPORT_MASK, opcode & OPERATION_MASK
    if operation not in VALID_OPS.get(transport, ()):
        return None
    if transport == XRC and operation not in AETH_OPS and operation != 0x0E:
        return RETH if operation in RETH_OPS else (AtomicETH if operation in ATOMIC_OPS else XRCETH)
    if operation in RETH_OPS:
        return RETH
    if operation in ATOMIC_OPS:
        return AtomicETH
    if operation in AETH_OPS:
        return AETH
    if transport == UD:
        return DETH
    return None

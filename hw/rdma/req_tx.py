# Ref: docs/roce-layouts.md §2 (BTH: AckReq), §3 (opcodes FIRST / MIDDLE / LAST / ONLY),
#      §6.3 (a READ request is one packet), §6.5 (the requester asks for an ACK on the last
#      packet of a message); hw/rdma/txpath.py (TxReq).
"""The requester's packetizer: request packet ``index`` of a send-queue entry, as a TxReq.

The control FSM (:class:`~hw.rdma.req_control.RequesterControl`) presents the entry at its QP's
``txp`` pointer and the number of its packets already sent; this unit derives the packet
(opcode of the operation and position, PSN ``first_psn + index``, payload address and length
of the PMTU segment, RETH / ImmDt / IETH of the work request) combinationally, and holds one
packet in its output register towards :class:`~hw.rdma.txpath.TxPath`: ``load`` takes it
when ``busy`` is low. ``msg_end``: the packet is the entry's last request packet (a READ has
one).
"""

from amaranth import Const, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from hw.headers import BthOpcode
from hw.iface import QP_INDEX_BITS, WrOp
from hw.rdma.req_sq import SqEntry
from hw.rdma.txpath import TxReq

__all__ = ["packet_port", "RequestPacketizer"]

B = BthOpcode
#: Opcodes of the packets of a message: (only, first, middle, last); a READ is one request.
_OPCODES = {
    WrOp.SEND: (B.SEND_ONLY, B.SEND_FIRST, B.SEND_MIDDLE, B.SEND_LAST),
    WrOp.SEND_INV: (B.SEND_ONLY_INV, B.SEND_FIRST, B.SEND_MIDDLE, B.SEND_LAST_INV),
    WrOp.WRITE: (B.WRITE_ONLY, B.WRITE_FIRST, B.WRITE_MIDDLE, B.WRITE_LAST),
    WrOp.WRITE_IMM: (B.WRITE_ONLY_IMM, B.WRITE_FIRST, B.WRITE_MIDDLE, B.WRITE_LAST_IMM),
}


def packet_port():
    """The control FSM's port on :class:`RequestPacketizer`, seen from the FSM."""
    return wiring.Signature({
        "entry": Out(SqEntry), "index": Out(24),    # packet `index` of the entry
        "qp": Out(QP_INDEX_BITS), "pmtu_log2": Out(4),
        "msg_end": In(1),                           # it is the entry's last request packet
        "load": Out(1),                             # into the output register (not busy)
        "busy": In(1),                              # the output register holds a packet
    })


class RequestPacketizer(wiring.Component):
    """Ports: ``ctl`` In(:func:`packet_port`); ``tx`` Out(stream of TxReq)."""

    def __init__(self):
        super().__init__({"ctl": In(packet_port()), "tx": Out(stream.Signature(TxReq))})

    def elaborate(self, platform):
        m = Module()
        c = self.ctl
        t, k, pmtu_log2 = c.entry, c.index, c.pmtu_log2
        off = Signal(32)
        m.d.comb += off.eq(k << pmtu_log2)
        remain = Signal(32)
        m.d.comb += remain.eq(t.length - off)
        pmtu_bytes = Signal(13)
        m.d.comb += pmtu_bytes.eq(Const(1, 13) << pmtu_log2)
        seg = Mux(remain > pmtu_bytes, pmtu_bytes, remain)
        single = t.npkts == 1
        is_first = k == 0
        is_last = k == t.npkts - 1
        opcode = Signal(8)

        def pick(only, first, middle, last):
            return Mux(single, only.value, Mux(is_first, first.value,
                                               Mux(is_last, last.value, middle.value)))
        with m.Switch(t.op):
            for op, codes in _OPCODES.items():
                with m.Case(op):
                    m.d.comb += opcode.eq(pick(*codes))
            with m.Default():
                m.d.comb += opcode.eq(B.READ_REQUEST.value)
        is_read_t = t.op == WrOp.READ
        pkt = Signal(TxReq)
        m.d.comb += [
            pkt.qp.eq(c.qp), pkt.opcode.eq(opcode), pkt.psn.eq(t.first_psn + k),
            pkt.ackreq.eq(is_last | is_read_t),
            pkt.reth.va.eq(t.va), pkt.reth.rkey.eq(t.rkey), pkt.reth.dma_length.eq(t.length),
            pkt.imm.imm.eq(t.imm), pkt.ieth.rkey.eq(t.inv_rkey),
            pkt.laddr.eq(t.laddr + off),
            pkt.length.eq(Mux(is_read_t, 0, seg)),
            c.msg_end.eq(is_last | is_read_t),
        ]

        # ---- output register -----------------------------------------------------------------
        txv = Signal()
        txr = Signal(TxReq)
        m.d.comb += [self.tx.valid.eq(txv), self.tx.p.eq(txr), c.busy.eq(txv)]
        with m.If(self.tx.valid & self.tx.ready):
            m.d.sync += txv.eq(0)
        with m.If(c.load):
            m.d.sync += [txv.eq(1), txr.eq(pkt)]
        return m

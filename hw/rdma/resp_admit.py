# Ref: roce-layouts.md §1.6 (what rxe checks on receive: QPN, QP state, source address,
#      rxe ``check_addr``), §3 (request opcodes); hw/iface.py (QpRespCfg, QpState, qp_index_of).
"""Admission of the RC responder: header register, QP lookup, per-packet filters.

:class:`RespAdmit` owns the header of the packet in hand (taken from the parser, held until the
packet is finished), its QP index and the QP's configuration (latched), and the checks that
need no QP context: known request opcode, not malformed, QPN known, QP in RTR/RTS, IPv4 source
= the QP's ``peer_ip``. The QP's row is read from the responder's copy of the QP table
(registered read port ``cfg``) at ``qp_index_of(dest_qp)`` in the cycle the header is taken, so
it is there for the checks in the next cycle (LOOKUP): no cycle is added. A refused packet is
counted and handed to the sequencer to be drained (``drop``); an admitted one waits until its
QP's context is not being reset and is then handed over (``start``). The next header is taken when the sequencer says ``done``.
"""

from amaranth import Module, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from hw.iface import QP_INDEX_BITS, QpReadSignature, QpRespCfg, QpState, qp_index_of
from hw.rdma.qp import qp_match
from hw.rdma.resp_common import Counts
from hw.rdma.roce_hdr import RoceRxHeader

__all__ = ["RespAdmit", "AdmitCtl"]

#: Hand-over of a packet, seen from RespAdmit.
AdmitCtl = wiring.Signature({
    "start": Out(1),        # admitted: load QP ``qi``'s context and execute
    "drop": Out(1),         # refused: drain its payload, touch no context
    "done": In(1),          # the sequencer has finished the packet
})


class RespAdmit(wiring.Component):
    """Header register, QP lookup and admission checks (see the module docstring).

    Ports
    -----
    hdr : In(stream of RoceRxHeader)
    cfg : Out(QpReadSignature(QpRespCfg))   the responder's copy of the QP table
    request : In(1)             ``h``'s opcode is a request (RequestDecoder)
    ctx_busy : In(1)            QP ``qi``'s context is waiting for its reset
    h : Out(RoceRxHeader), qi : Out(QP_INDEX_BITS), qcfg : Out(QpRespCfg)   registers
    taken : Out(1)              strobe: a header is taken (payload tracking restarts)
    ctl : Out(AdmitCtl)
    inc : Out(Counts)           cnt_packets and the refusal counters
    """

    def __init__(self, n_qp):
        self.n_qp = n_qp
        super().__init__({
            "hdr": In(stream.Signature(RoceRxHeader)),
            "cfg": Out(QpReadSignature(QpRespCfg)),
            "request": In(1), "ctx_busy": In(1),
            "h": Out(RoceRxHeader), "qi": Out(QP_INDEX_BITS), "qcfg": Out(QpRespCfg),
            "taken": Out(1),
            "ctl": Out(AdmitCtl),
            "inc": Out(Counts),
        })

    def elaborate(self, platform):
        m = Module()
        nq, h, inc = self.n_qp, self.h, self.inc
        # The row is read at the index of the parser's header: in IDLE that is the header being
        # taken, so in LOOKUP `row` is its QP's row.
        idx = Signal(QP_INDEX_BITS)
        row = self.cfg.data
        m.d.comb += [self.cfg.addr.eq(qp_index_of(self.hdr.p.bth.dest_qp)),
                     idx.eq(qp_index_of(h.bth.dest_qp))]
        # An index beyond the table would read a row modulo its depth.
        hit = qp_match(row, h.bth.dest_qp) & (idx < nq)
        m.d.comb += inc.eq(0)               # every bit driven (only some are counted here)

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.hdr.ready.eq(1)
                with m.If(self.hdr.valid):
                    m.d.comb += [self.taken.eq(1), inc.cnt_packets.eq(1)]
                    m.d.sync += h.eq(self.hdr.p)
                    m.next = "LOOKUP"
            with m.State("LOOKUP"):
                m.d.sync += [self.qi.eq(idx), self.qcfg.eq(row)]
                m.next = "BUSY"
                with m.If(~h.known_opcode | h.malformed | ~self.request):
                    m.d.comb += [inc.cnt_bad_opcode.eq(1), self.ctl.drop.eq(1)]
                with m.Elif(~hit):
                    m.d.comb += [inc.cnt_unknown_qp.eq(1), self.ctl.drop.eq(1)]
                with m.Elif((row.state != QpState.RTR) & (row.state != QpState.RTS)):
                    m.d.comb += [inc.cnt_bad_state.eq(1), self.ctl.drop.eq(1)]
                with m.Elif(row.peer_ip != h.meta.src_ip):
                    m.d.comb += [inc.cnt_src_mismatch.eq(1), self.ctl.drop.eq(1)]
                with m.Else():
                    m.next = "CTX"
            with m.State("CTX"):
                with m.If(~self.ctx_busy):
                    m.d.comb += self.ctl.start.eq(1)
                    m.next = "BUSY"
            with m.State("BUSY"):
                with m.If(self.ctl.done):
                    m.next = "IDLE"
        return m

# Ref: roce-layouts.md §3 (ACKNOWLEDGE, ATOMIC ACKNOWLEDGE, RDMA READ Response
#      First/Middle/Last/Only), §4.2 (AETH), §4.4 (AtomicAckETH), §6.3-§6.4 (a READ takes
#      max(1, ceil(len / PMTU)) PSNs), §6.6 (a duplicate READ is answered from its own PSN).
"""What the RC responder sends: the :data:`~hw.rdma.resp_common.RespTx` records.

:class:`ResponseGen` owns the responder's ``tx`` output register, the one answer staged for it
(an ACK, a NAK or an ATOMIC ACKNOWLEDGE, built from what the sequencer stages) and the cursor of
the READ being answered (next PSN, target-memory address, octets left, first or not), which it
cuts into PMTU-sized READ responses, one record each. The TX path reads a READ response's
payload from target memory itself.
"""

from amaranth import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from hw.headers import AethSyndrome, BthOpcode
from hw.iface import ADDR_BITS, QP_INDEX_BITS
from hw.rdma.resp_common import RespTx

__all__ = ["ResponseGen", "TxCtl"]

O = BthOpcode

#: Output control, seen from the sequencer.
TxCtl = wiring.Signature({
    # Stage an answer (sent on ``emit``); ``orig_we``: an ATOMIC ACKNOWLEDGE's original value.
    "stage": Out(1), "opcode": Out(8), "psn": Out(24), "syndrome": Out(8), "msn": Out(24),
    "orig_we": Out(1), "orig": Out(64),
    "emit": Out(1), "sent": In(1),      # send the staged answer; it is taken this cycle
    # READ responses: ``begin`` (from PSN ``psn``, ``length`` octets of the request), the first
    # response's address (``set_laddr``), then ``respond`` until ``read_done``.
    "begin": Out(1), "set_laddr": Out(1), "laddr": Out(ADDR_BITS),
    "respond": Out(1), "read_done": In(1),
    "npsn": In(25),                     # PSNs the READ takes: max(1, ceil(length / PMTU))
})


class ResponseGen(wiring.Component):
    """The answer register and the READ response generator (see the module docstring).

    Ports
    -----
    qi : In(QP_INDEX_BITS)              QP of every record
    qp_msn : In(24)                     the QP's MSN (READ responses carry it)
    psn : In(24), length : In(32)       the READ request's PSN and DMA length
    pmtu : In(14), pmtu_log2 : In(4)
    ctl : In(TxCtl)
    tx : Out(stream of RespTx)          a register
    """

    def __init__(self):
        super().__init__({
            "qi": In(QP_INDEX_BITS), "qp_msn": In(24),
            "psn": In(24), "length": In(32), "pmtu": In(14), "pmtu_log2": In(4),
            "ctl": In(TxCtl),
            "tx": Out(stream.Signature(RespTx)),
        })

    def elaborate(self, platform):
        m = Module()
        ctl, tx, pmtu, length = self.ctl, self.tx, self.pmtu, self.length
        aeth_ack = AethSyndrome.ACK.value

        pend = Signal(RespTx)               # the staged answer
        with m.If(ctl.stage):
            m.d.sync += [pend.qp.eq(self.qi), pend.opcode.eq(ctl.opcode), pend.psn.eq(ctl.psn),
                         pend.aeth.syndrome.eq(ctl.syndrome), pend.aeth.msn.eq(ctl.msn),
                         pend.length.eq(0)]
            with m.If(ctl.orig_we):
                m.d.sync += pend.atomic_ack.orig_data.eq(ctl.orig)

        with m.If(tx.ready):
            m.d.sync += tx.valid.eq(0)
        tx_free = ~tx.valid | tx.ready
        m.d.comb += ctl.sent.eq(ctl.emit & tx_free)
        with m.If(ctl.sent):
            m.d.sync += [tx.valid.eq(1), tx.p.eq(pend)]

        # READ response cursor.
        rd_psn = Signal(24)
        rd_laddr = Signal(ADDR_BITS)
        rd_rem = Signal(32)
        rd_first = Signal()
        m.d.comb += ctl.npsn.eq(Mux(length == 0, 1, (length + pmtu - 1) >> self.pmtu_log2))
        with m.If(ctl.set_laddr):
            m.d.sync += rd_laddr.eq(ctl.laddr)
        with m.If(ctl.begin):
            m.d.sync += [rd_psn.eq(self.psn), rd_rem.eq(length), rd_first.eq(1)]

        seg_last = rd_rem <= pmtu
        seg = Mux(seg_last, rd_rem, pmtu)
        opc = Mux(rd_first, Mux(seg_last, O.READ_RESPONSE_ONLY.value, O.READ_RESPONSE_FIRST.value),
                  Mux(seg_last, O.READ_RESPONSE_LAST.value, O.READ_RESPONSE_MIDDLE.value))
        with m.If(ctl.respond & tx_free):
            m.d.comb += ctl.read_done.eq(seg_last)
            m.d.sync += [tx.valid.eq(1), tx.p.qp.eq(self.qi), tx.p.opcode.eq(opc),
                         tx.p.psn.eq(rd_psn), tx.p.aeth.syndrome.eq(aeth_ack),
                         tx.p.aeth.msn.eq(self.qp_msn), tx.p.laddr.eq(rd_laddr),
                         tx.p.length.eq(seg), tx.p.atomic_ack.orig_data.eq(0),
                         rd_first.eq(0), rd_psn.eq(rd_psn + 1),
                         rd_laddr.eq(rd_laddr + seg), rd_rem.eq(rd_rem - seg)]
        return m

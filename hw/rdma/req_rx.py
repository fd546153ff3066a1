# Ref: docs/roce-layouts.md §3 (response opcodes), §4.2 (AETH syndrome), §6.5 (an ACK of PSN p
#      acknowledges p, a NAK of PSN p everything before p); hw/rdma/roce_hdr.py (RoceRxHeader).
"""The requester's receive side: response headers in, READ response payloads to memory.

A response header (from :class:`~hw.rdma.requester.RespDemux`) is taken into a holding register
while the intake's copy of the QP table (registered read port ``cfg``, QpTable.intake) reads the
row at ``qp_index_of(dest_qp)``. The next cycle compares the header with that row into flops,
and from the cycle after (the second after the header arrived) the control FSM sees it
(``valid``): ``hit`` (the row's ``local_qpn`` is the destination QPN, and the QP was ready to
send in the cycle before: ``rts`` is registered too, and the FSM takes a header only when it
did not act in that cycle) and ``hit_src`` (its ``peer_ip`` is the header's source address);
``qp`` is the header's QP index, for the FSM to address the QP's record in the cycle it takes
the header. The next header is taken the cycle after ``take``. When the control FSM
takes the header (``take``), the fields it works on are latched in ``rec``, with the QP index
and ``limit``, the last PSN the response acknowledges (its PSN for an ACK, the PSN before it
for a NAK or a READ response).

The payload that follows a header goes either to the :class:`~hw.lib.dma.DmaWriter` (``write``,
after ``write_start`` gave the writer its address) or nowhere (``discard``); ``payload_end``
marks its last beat, ``writer_idle`` that every write has reached the bus.
"""

from amaranth import Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.headers import BthOpcode
from hw.iface import (ADDR_BITS, MemBusSignature, QP_INDEX_BITS, QpIntakeCfg, QpReadSignature,
                      qp_index_of)
from hw.lib.dma import DmaWriter
from hw.lib.stream import PacketStream
from hw.rdma.req_sq import qp_bits
from hw.rdma.roce_hdr import RoceRxHeader

__all__ = ["resp_record", "rx_port", "ResponseIntake"]


def resp_record(n_qp):
    """The fields of a taken response header that the control FSM works on."""
    return data.StructLayout({"op": 8, "psn": 24, "syn": 8, "plen": 16, "qp": qp_bits(n_qp),
                              "limit": 24})


def rx_port(n_qp):
    """The control FSM's port on :class:`ResponseIntake`, seen from the FSM."""
    return wiring.Signature({
        "valid": In(1), "hit": In(1), "hit_src": In(1), "has_payload": In(1),
        "qp": In(qp_bits(n_qp)),                # the held header's QP index (`rec.qp` at take)
        "take": Out(1),                         # accept the header, latch `rec`
        "rec": In(resp_record(n_qp)),
        "write_start": Out(1), "write_addr": Out(ADDR_BITS),
        "write": Out(1), "discard": Out(1),     # where the payload goes
        "payload_end": In(1), "writer_idle": In(1),
    })


class ResponseIntake(wiring.Component):
    """Ports
    -----
    rsp_hdr, rsp_payload : In   responses, from :class:`~hw.rdma.requester.RespDemux`
    mem : Out(MemBusSignature())   READ response data
    cfg : Out(QpReadSignature(QpIntakeCfg))   the intake's copy of the QP table
    rts : In(n_qp)   QP i is ready to send
    ctl : In(:func:`rx_port`)
    """

    def __init__(self, width, n_qp):
        self._width, self._n_qp = width, n_qp
        super().__init__({
            "rsp_hdr": In(stream.Signature(RoceRxHeader)),
            "rsp_payload": In(PacketStream(width)),
            "mem": Out(MemBusSignature()),
            "cfg": Out(QpReadSignature(QpIntakeCfg)), "rts": In(n_qp),
            "ctl": In(rx_port(n_qp)),
        })

    def elaborate(self, platform):
        m = Module()
        c, pl = self.ctl, self.rsp_payload
        # The header waits one cycle in `rh` while its QP's row is read (at the index of the
        # incoming header when taken, of `rh` while held): one QPN and one address compare.
        rh = Signal(RoceRxHeader)
        held = Signal()
        m.d.comb += [self.rsp_hdr.ready.eq(~held),
                     self.cfg.addr.eq(qp_index_of(Mux(held, rh.bth.dest_qp,
                                                      self.rsp_hdr.p.bth.dest_qp)))]
        with m.If(~held):
            m.d.sync += [rh.eq(self.rsp_hdr.p), held.eq(self.rsp_hdr.valid)]
        with m.If(c.take):
            m.d.sync += held.eq(0)
        hit_qp = Signal(qp_bits(self._n_qp))
        index = Signal(QP_INDEX_BITS)
        m.d.comb += [index.eq(qp_index_of(rh.bth.dest_qp)), hit_qp.eq(index), c.qp.eq(hit_qp)]
        # The row's compares and the QP's ready-to-send bit end in flops, and the FSM sees the
        # header the cycle after they are taken (``aged``). Combinational, the row's data ran
        # through both compares, the FSM's choice and the record addresses in one cycle (28.2
        # ns, the core clock's critical path on ECPIX-5 at seed 3, clean-clone CI of e170252),
        # and then the header's QP index through the 64-to-1 ``rts`` mux (27.4 ns, CI of
        # 89ac31b). ``rts_ok`` is a cycle old: the FSM may stop the QP in a step, so it takes
        # a header only in its second idle cycle in a row (RequesterControl's ``fresh``).
        row = self.cfg.data
        qpn_ok, src_ok, rts_ok, aged = Signal(), Signal(), Signal(), Signal()
        m.d.sync += [qpn_ok.eq(rh.bth.dest_qp == row.local_qpn),
                     src_ok.eq(rh.meta.src_ip == row.peer_ip),
                     rts_ok.eq(self.rts.bit_select(index, 1)),
                     aged.eq(held & ~c.take)]
        m.d.comb += [c.hit.eq(qpn_ok & rts_ok), c.hit_src.eq(src_ok)]
        is_ack = (rh.bth.opcode == BthOpcode.ACKNOWLEDGE.value) | \
                 (rh.bth.opcode == BthOpcode.ATOMIC_ACKNOWLEDGE.value)
        plain_ack = is_ack & (rh.aeth.syndrome[5:8] == 0)
        m.d.comb += [c.valid.eq(held & aged), c.has_payload.eq(rh.payload_len != 0)]
        with m.If(c.take):
            m.d.sync += [c.rec.op.eq(rh.bth.opcode), c.rec.psn.eq(rh.bth.psn),
                         c.rec.syn.eq(rh.aeth.syndrome), c.rec.plen.eq(rh.payload_len),
                         c.rec.qp.eq(hit_qp),
                         c.rec.limit.eq(Mux(plain_ack, rh.bth.psn, rh.bth.psn - 1))]

        m.submodules.writer = writer = DmaWriter(self._width)
        wiring.connect(m, writer.mem, wiring.flipped(self.mem))
        m.d.comb += [writer.cmd.valid.eq(c.write_start), writer.cmd.p.addr.eq(c.write_addr),
                     c.writer_idle.eq(writer.idle),
                     c.payload_end.eq(pl.valid & pl.ready & pl.p.last)]
        with m.If(c.write):
            m.d.comb += [writer.i.valid.eq(pl.valid), writer.i.p.eq(pl.p),
                         pl.ready.eq(writer.i.ready)]
        with m.If(c.discard):
            m.d.comb += pl.ready.eq(1)
        return m

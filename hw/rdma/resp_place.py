# Ref: roce-layouts.md §3 (SEND/WRITE opcodes, RQ WQE consumption, Immediate, Invalidate),
#      §4.1 (RETH: the WRITE cursor), §4.5 (ImmDt, IETH); hw/iface.py (RecvNotify, MemReq).
"""Payload placement of the RC responder: SEND receive buffers and RDMA WRITE.

:class:`PayloadPlacer` owns the packet payload stream and everything between it and target
memory: the placement part of the QP context (:data:`~hw.rdma.resp_common.PlaceCtx`: the SEND
in progress with its receive buffer and offset, the next receive buffer, the WRITE cursor), the
:class:`~hw.lib.dma.WordWriter`, the :data:`RecvNotify` register and the invalidation of a
SEND with Invalidate. It also discards the payload of a packet that is not executed (``drain``).

A placement (``start``) checks the packet against its buffer (SEND: receive buffer size; WRITE:
the cursor), writes the payload, waits until every write has been accepted by the bus, then
completes the message (notify, invalidate) and says ``done``; a packet that does not fit, or an
Invalidate of an unknown R_Key, says ``fatal`` instead (a fatal NAK: the SEND/WRITE message in
progress ends, nothing else changes).
"""

from amaranth import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from hw.iface import (ADDR_BITS, MSG_HEAD_OCTETS, QP_INDEX_BITS, MemReq, MsgHead, QpRespCfg,
                      RecvNotify)
from hw.lib.dma import WordWriter
from hw.lib.octets import HeaderCapture
from hw.lib.stream import PacketStream
from hw.rdma.resp_common import PlaceCtx, ReqKind
from hw.rdma.roce_hdr import RoceRxHeader

__all__ = ["PayloadPlacer", "PlaceCtl"]

#: Placement control, seen from the sequencer.
PlaceCtl = wiring.Signature({
    "start": Out(1),                    # place this packet's payload (a SEND or a WRITE)
    "cursor": Out(1),                   # with start: set the WRITE cursor first, to
    "laddr": Out(ADDR_BITS), "length": Out(32),  # ... this address and length
    "abort": Out(1),                    # a fatal NAK of the sequencer's: ends the message
    "drain": Out(1),                    # discard the rest of the payload
    "fatal": In(1),                     # strobe: does not fit / Invalidate failed (fatal NAK)
    "done": In(1),                      # strobe: written and completed
    "drained": In(1),                   # with drain: the payload is gone by the end of cycle
})


class PayloadPlacer(wiring.Component):
    """SEND/WRITE payload into target memory (see the module docstring).

    Ports
    -----
    payload : In(PacketStream(width))
    o : Out(stream of MemReq)           the writes
    notify : Out(stream of RecvNotify)
    notify_head : Out(MsgHead)          with ``notify``: a SEND Only's first octets
    mr_inv_valid : Out(1), mr_inv_found : In(1)    to MrTable (the R_Key is the header's IETH)
    h : In(RoceRxHeader), kind : In(ReqKind), qi : In(QP_INDEX_BITS), qcfg : In(QpRespCfg)
        the packet in hand
    begin : In(1), empty : In(1)        a header is taken; ``empty``: it has no payload
    load : In(1), ctx_in : In(PlaceCtx)  load the working context (the QP's stored one)
    ctx : Out(PlaceCtx)                 working context (stored again on the sequencer's commit)
    consume : Out(1)                    strobe: one receive buffer of QP ``qi`` is taken
    ctl : In(PlaceCtl)
    """

    def __init__(self, width):
        self.width = width
        super().__init__({
            "payload": In(PacketStream(width)),
            "o": Out(stream.Signature(MemReq)),
            "notify": Out(stream.Signature(RecvNotify)), "notify_head": Out(MsgHead),
            "mr_inv_valid": Out(1), "mr_inv_found": In(1),
            "h": In(RoceRxHeader), "kind": In(ReqKind), "qi": In(QP_INDEX_BITS),
            "qcfg": In(QpRespCfg),
            "begin": In(1), "empty": In(1),
            "load": In(1), "ctx_in": In(PlaceCtx), "ctx": Out(PlaceCtx),
            "consume": Out(1),
            "ctl": In(PlaceCtl),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.writer = wr = WordWriter(self.width)
        h, k, cfg, ctx, ctl = self.h, self.kind, self.qcfg, self.ctx, self.ctl
        n = h.payload_len
        pay = self.payload
        pay_done = Signal()                 # payload of this packet consumed (or none)
        with m.If(self.begin):
            m.d.sync += pay_done.eq(self.empty)

        # Payload routing: into the writer while placing, discarded on ``drain``.
        wiring.connect(m, wr.o, wiring.flipped(self.o))
        to_writer = Signal()
        m.d.comb += [wr.i.p.eq(pay.p), ctl.drained.eq(pay_done | (pay.valid & pay.p.last))]
        with m.If(to_writer):
            m.d.comb += [wr.i.valid.eq(pay.valid), pay.ready.eq(wr.i.ready)]
        with m.If(ctl.drain):
            m.d.comb += pay.ready.eq(~pay_done)

        nt = self.notify
        with m.If(nt.ready):
            m.d.sync += nt.valid.eq(0)

        # The message's first octets as they go to memory (a packet's payload from octet 0,
        # dense): handed on with the RecvNotify of a SEND Only (``notify_head``), so that the
        # consumer need not read them back. Cleared when a packet is taken (``clear_due``):
        # octets past a short message's end read 0. ``notify_head.octets`` are these
        # flip-flops themselves (no copy): they stay as they are while a notify waits
        # (``hold``, from the cycle that raises it), and the clear waits for it. A packet that
        # brings payload before its clear, or while a notify waits, is ``spoiled``: its notify
        # goes without a head (``ok`` 0) and the consumer reads the receive buffer. (With the
        # target's RecvNotify FIFO as deep as the receive buffers a notify waits one cycle.)
        nl = self.width // 8
        hpos = Signal(range(MSG_HEAD_OCTETS + nl + 1))
        noting = Signal()                   # this cycle raises ``notify``
        hold = nt.valid | noting
        clear_due, spoiled = Signal(), Signal()
        hfire = pay.valid & pay.ready & to_writer
        head = HeaderCapture(MSG_HEAD_OCTETS, self.width, "msg_head").add(
            m, hpos, pay.p.data, hfire & ~hold & ~clear_due)
        with m.If(self.begin):
            m.d.sync += [clear_due.eq(1), spoiled.eq(0)]
        with m.If(clear_due):
            with m.If(hfire):
                m.d.sync += spoiled.eq(1)
            with m.If(~hold):
                m.d.sync += [clear_due.eq(0), hpos.eq(0)] + [r.eq(0) for r in head.reg]
        with m.Elif(hfire & (hpos < MSG_HEAD_OCTETS)):
            with m.If(hold):
                m.d.sync += spoiled.eq(1)
            with m.Else():
                m.d.sync += hpos.eq(hpos + nl)
        m.d.comb += self.notify_head.octets.eq(head.value(0, MSG_HEAD_OCTETS, now=False))

        with m.If(self.load):
            m.d.sync += ctx.eq(self.ctx_in)
        with m.If(ctl.start & ctl.cursor):
            m.d.sync += [ctx.wr_laddr.eq(ctl.laddr), ctx.wr_rem.eq(ctl.length)]

        # The checks, each one flat expression: the sequencer acts on ``fatal`` and ``done`` in
        # the same cycle.
        last_pkt = k.last | k.only
        buf_size = Signal(17)               # RecvNotify.length is 16 bits: cap at 64 KiB
        m.d.comb += buf_size.eq(Mux(cfg.recv_size_log2 > 16, 1 << 16, 1 << cfg.recv_size_log2))
        start_off = Mux(k.first_only, 0, ctx.send_off)
        too_long = Mux(k.send, start_off + n > buf_size,
                       (n > ctx.wr_rem) | (last_pkt & (n != ctx.wr_rem)))
        needs_note = last_pkt & (k.send | k.imm)
        note_busy = needs_note & nt.valid & ~nt.ready   # nothing happens, no invalidate either
        inv_bad = last_pkt & k.inv & ~self.mr_inv_found
        buf_addr = cfg.recv_base + (ctx.head << cfg.recv_size_log2)     # next receive buffer
        next_head = Mux(ctx.head + 1 >= cfg.recv_count, 0, ctx.head + 1)
        with m.FSM() as fsm:
            with m.State("IDLE"):
                with m.If(ctl.start):
                    m.next = "CHECK"

            with m.State("CHECK"):
                with m.If(too_long):
                    m.next = "IDLE"
                with m.Elif(k.send):
                    addr = Signal(ADDR_BITS)
                    with m.If(k.first_only):
                        m.d.comb += [self.consume.eq(1), addr.eq(buf_addr)]
                        m.d.sync += [ctx.send_addr.eq(addr), ctx.head.eq(next_head)]
                    with m.Else():
                        m.d.comb += addr.eq(ctx.send_addr + ctx.send_off)
                    m.d.comb += [wr.start.eq(1), wr.addr.eq(addr)]
                    m.d.sync += [ctx.send_off.eq(start_off + n), ctx.in_send.eq(~last_pkt)]
                    m.next = "DATA"
                with m.Else():                  # RDMA WRITE
                    m.d.comb += [wr.start.eq(1), wr.addr.eq(ctx.wr_laddr)]
                    m.d.sync += [ctx.wr_laddr.eq(ctx.wr_laddr + n),
                                 ctx.wr_rem.eq(ctx.wr_rem - n), ctx.in_write.eq(~last_pkt)]
                    with m.If(k.imm):
                        m.d.comb += self.consume.eq(1)
                        m.d.sync += [ctx.send_addr.eq(buf_addr), ctx.send_off.eq(0),
                                     ctx.head.eq(next_head)]
                    m.next = "DATA"

            with m.State("DATA"):
                with m.If(~pay_done):
                    m.d.comb += to_writer.eq(1)
                    with m.If(pay.valid & pay.ready & pay.p.last):
                        m.d.sync += pay_done.eq(1)
                with m.Elif(wr.idle):
                    m.next = "EXECUTED"

            with m.State("EXECUTED"):
                # Every write of this packet has been accepted: complete the packet.
                with m.If(~note_busy):
                    m.next = "IDLE"
                    with m.If(~inv_bad & needs_note):
                        m.d.comb += noting.eq(1)
                        m.d.sync += self.notify_head.ok.eq(k.send & k.only & ~spoiled &
                                                          ~clear_due)
                        m.d.sync += [nt.valid.eq(1), nt.p.qp.eq(self.qi),
                                     nt.p.addr.eq(ctx.send_addr),
                                     nt.p.length.eq(Mux(k.send, ctx.send_off, 0)),
                                     nt.p.has_imm.eq(k.imm), nt.p.imm.eq(h.imm.imm),
                                     nt.p.has_inv.eq(k.inv), nt.p.inv_rkey.eq(h.ieth.rkey)]

        executed = fsm.ongoing("EXECUTED") & ~note_busy
        m.d.comb += [ctl.fatal.eq((fsm.ongoing("CHECK") & too_long) | (executed & inv_bad)),
                     ctl.done.eq(executed & ~inv_bad),
                     self.mr_inv_valid.eq(last_pkt & k.inv & self.mr_inv_found & executed)]
        # A fatal NAK (ours or the sequencer's) ends the SEND/WRITE message in progress.
        with m.If(ctl.fatal | ctl.abort):
            m.d.sync += [ctx.in_send.eq(0), ctx.in_write.eq(0)]
        return m

# Ref: roce-layouts.md §3 (opcodes), §6.1 (24-bit PSN arithmetic), §6.3 (PSNs consumed), §6.5
#      (ACK coalescing, NAKs, requester reaction), §6.7 (timer, retry_cnt/rnr_retry, 7 = infinite);
#      IBTA Vol. 1 §9.7.5.2.8 (RNR timer table); hw/iface.py (WorkRequest, WorkCompletion).
"""RC requester: work requests in, RoCE request packets out, completions back.

Structure: a control FSM and the units on its ports (``hw/rdma/req_*.py``)::

    wr --> RequesterControl --> wc (through a 4-entry FIFO), error_event, cnt_* (event strobes)
             | sq     SendQueues (req_sq): per-QP records, send-queue memory, PSN assignment,
             |        host loads; status --> SqScheduler
             | pick   SqScheduler (req_sq): expired timer / flush / round-robin candidates
             | timer  RetryTimers (req_timers): ACK timeout or RNR wait per QP;
             |        zero --> SqScheduler
             | pk     RequestPacketizer (req_tx): TxReq of the txp entry --> tx (TxPath)
             | rx     ResponseIntake (req_rx): rsp_hdr QP match and latch; rsp_payload -->
                      DmaWriter --> mem (READ response data), or dropped

One control FSM (:class:`~hw.rdma.req_control.RequesterControl`) does everything that touches
per-QP state, one step at a time, in priority order: a response header, an expired timer, a
flush completion of a QP in error, a new work request, the next request packet (why one FSM,
and the 2 or 3 cycles of a step: see :mod:`hw.rdma.req_control`).

PSNs are assigned when a work request is queued: ``first_psn = alloc_psn``, ``alloc_psn +=
npkts`` with ``npkts = max(1, ceil(length / PMTU))`` for every operation (a READ is one request
packet but consumes the PSNs of its responses, §6.3). Per QP the queue holds three pointers:
``head`` (oldest WR not completed), ``txp`` (WR being sent; ``tx_pkt`` packets of it sent) and
``tail``; ``head_done`` counts the packets of the head WR already acknowledged (or, for a READ,
the responses already written to memory). The oldest unacknowledged PSN is
``entry[head].first_psn + head_done``.

Simplifications (documented, checked by tests where they matter):

- go-back-N re-sends a READ request whole (its early responses then arrive as duplicates and are
  dropped), not from the first missing response;
- an ACK never completes a READ (only its responses do); an ACK that jumps over an unanswered
  READ is left for the retransmission timer (rxe retries at once);
- ATOMIC ACKNOWLEDGE is processed as an ACK of its PSN (this requester issues no atomics);
- source check (as rxe): a response whose IPv4 source address is not its QP's ``peer_ip`` is
  dropped (payload discarded) and counted in ``cnt_src_mismatch``; it completes, advances or
  restarts nothing. The UDP source port and the source MAC are not checked;
- the per-QP records and the send queue (n_qp × depth entries) are memories with registered
  read ports, block RAM or LUT RAM; only 7 bits per QP stay in flip-flops
  (:mod:`hw.rdma.req_sq`).
"""

from amaranth import Module, Mux, Shape, Signal
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.headers import BthOpcode
from hw.iface import (QP_INDEX_BITS, MemBusSignature, QpConfig, QpIntakeCfg, QpReadSignature,
                      ReqCfg, WorkCompletion, WorkRequest)
from hw.lib.stream import PacketStream
from hw.rdma.req_control import ReqEvents, RequesterControl
from hw.rdma.req_rx import ResponseIntake
from hw.rdma.req_sq import SendQueues, SqScheduler
from hw.rdma.req_timers import RNR_TIMER_MS, RetryTimers, ack_timeout_cycles, rnr_timer_cycles
from hw.rdma.req_tx import RequestPacketizer
from hw.rdma.roce_hdr import RoceRxHeader
from hw.rdma.txpath import TxReq

__all__ = ["RespDemux", "Requester", "ack_timeout_cycles", "rnr_timer_cycles",
           "RNR_TIMER_MS", "is_response_opcode"]


def is_response_opcode(op):
    """Opcodes the requester consumes: READ responses, ACKNOWLEDGE, ATOMIC ACKNOWLEDGE."""
    return (op >= BthOpcode.READ_RESPONSE_FIRST.value) & (op <= BthOpcode.ATOMIC_ACKNOWLEDGE.value)


class RespDemux(wiring.Component):
    """Route RoceRxParser output by opcode: 0x0D-0x12 to the requester, the rest to the responder.

    A packet's payload (present iff ``payload_len`` != 0) follows its header to the same side.

    Ports
    -----
    hdr, payload : In    from RoceRxParser
    req_hdr, req_payload : Out   responses (to :class:`Requester`)
    resp_hdr, resp_payload : Out   requests (to the responder)
    """

    def __init__(self, width):
        hs, ps = stream.Signature(RoceRxHeader), PacketStream(width)
        super().__init__({"hdr": In(hs), "payload": In(ps),
                          "req_hdr": Out(hs), "req_payload": Out(ps),
                          "resp_hdr": Out(hs), "resp_payload": Out(ps)})

    def elaborate(self, platform):
        m = Module()
        to_req = Signal()
        # Malformed responses go to the responder, which drops and counts them.
        m.d.comb += to_req.eq(is_response_opcode(self.hdr.p.bth.opcode) & ~self.hdr.p.malformed)
        sel = Signal()
        for o in (self.req_hdr, self.resp_hdr):
            m.d.comb += o.p.eq(self.hdr.p)
        for o in (self.req_payload, self.resp_payload):
            m.d.comb += o.p.eq(self.payload.p)
        with m.FSM():
            with m.State("HDR"):
                m.d.comb += [self.req_hdr.valid.eq(self.hdr.valid & to_req),
                             self.resp_hdr.valid.eq(self.hdr.valid & ~to_req),
                             self.hdr.ready.eq(Mux(to_req, self.req_hdr.ready,
                                                   self.resp_hdr.ready))]
                with m.If(self.hdr.valid & self.hdr.ready & (self.hdr.p.payload_len != 0)):
                    m.d.sync += sel.eq(to_req)
                    m.next = "PAYLOAD"
            with m.State("PAYLOAD"):
                m.d.comb += [self.req_payload.valid.eq(self.payload.valid & sel),
                             self.resp_payload.valid.eq(self.payload.valid & ~sel),
                             self.payload.ready.eq(Mux(sel, self.req_payload.ready,
                                                       self.resp_payload.ready))]
                with m.If(self.payload.valid & self.payload.ready & self.payload.p.last):
                    m.next = "HDR"
        return m


class Requester(wiring.Component):
    """RC requester for ``n_qp`` QPs.

    Parameters
    ----------
    width : int
        payload datapath width (8 .. 64 bits).
    n_qp : int
        QPs (indices 0 .. n_qp-1 of the QP table).
    sq_depth : int
        send-queue entries per QP (power of two).
    clk_hz : float
        clock frequency, for the ACK timeout and RNR timers.
    timer_scale : int
        divides every timer (simulation: make 4.096 us * 2**timeout a few hundred cycles).

    Ports
    -----
    wr : In(stream of WorkRequest)
    wc : Out(stream of WorkCompletion)   one per WR, in order per QP
    cfg : Out(QpReadSignature(ReqCfg))   the control FSM's copy (QpTable.req), read at its QP
    intake : Out(QpReadSignature(QpIntakeCfg))   the response intake's copy (QpTable.intake)
    load_valid : In(1), load_qp : In(QP_INDEX_BITS), load_row : In(QpConfig)
        QpTable's load event: the host wrote QP ``load_qp``'s state (RTS starts the send queue
        at ``sq_psn``; ERROR flushes it; any other state stops it)
    tx : Out(stream of TxReq)   -> TxPath source
    rsp_hdr, rsp_payload : In   responses, from :class:`RespDemux`
    mem : Out(MemBusSignature())   READ response data
    error_event : Out(1)   one-cycle strobe: QP ``error_qp`` went to error
    error_qp : Out(QP_INDEX_BITS)
    qp_error : Out(n_qp)   QP i is in error
    cnt_timeouts, cnt_seq_naks, cnt_rnr_naks, cnt_retransmits, cnt_stale : Out(32)
    cnt_src_mismatch : Out(32)   responses dropped: source address is not the QP's peer_ip
    """

    def __init__(self, width, n_qp, sq_depth=8, clk_hz=125e6, timer_scale=1):
        if sq_depth & (sq_depth - 1):
            raise ValueError("sq_depth must be a power of two")
        self._width = width
        self._n_qp = n_qp
        self._depth = sq_depth
        self._clk_hz = clk_hz
        self._scale = timer_scale
        super().__init__({
            "wr": In(stream.Signature(WorkRequest)),
            "wc": Out(stream.Signature(WorkCompletion)),
            "cfg": Out(QpReadSignature(ReqCfg)),
            "intake": Out(QpReadSignature(QpIntakeCfg)),
            "load_valid": In(1), "load_qp": In(QP_INDEX_BITS), "load_row": In(QpConfig),
            "tx": Out(stream.Signature(TxReq)),
            "rsp_hdr": In(stream.Signature(RoceRxHeader)),
            "rsp_payload": In(PacketStream(width)),
            "mem": Out(MemBusSignature()),
            "error_event": Out(1), "error_qp": Out(QP_INDEX_BITS), "qp_error": Out(n_qp),
            "cnt_timeouts": Out(32), "cnt_seq_naks": Out(32), "cnt_rnr_naks": Out(32),
            "cnt_retransmits": Out(32), "cnt_stale": Out(32), "cnt_src_mismatch": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        nq, depth = self._n_qp, self._depth
        sm = m.submodules
        sm.ctl = ctl = RequesterControl(nq, depth)
        sm.sq = sq = SendQueues(nq, depth)
        sm.pick = pick = SqScheduler(nq)
        sm.timers = timers = RetryTimers(nq, self._clk_hz, self._scale)
        sm.pk = pk = RequestPacketizer()
        sm.rx = rx = ResponseIntake(self._width, nq)
        sm.wcq = wcq = fifo.SyncFIFOBuffered(width=Shape.cast(WorkCompletion).width, depth=4)

        # The control FSM's ports on its units.
        for port, unit in ((ctl.sq, sq.port), (ctl.pick, pick.ctl), (ctl.timer, timers.ctl),
                           (ctl.rx, rx.ctl), (ctl.pk, pk.ctl)):
            wiring.connect(m, port, unit)
        wiring.connect(m, sq.status, pick.status)
        wiring.connect(m, wiring.flipped(self.wr), ctl.wr)
        wiring.connect(m, pk.tx, wiring.flipped(self.tx))
        wiring.connect(m, wiring.flipped(self.rsp_hdr), rx.rsp_hdr)
        wiring.connect(m, wiring.flipped(self.rsp_payload), rx.rsp_payload)
        wiring.connect(m, rx.mem, wiring.flipped(self.mem))
        wiring.connect(m, wiring.flipped(self.intake), rx.cfg)
        wiring.connect(m, wiring.flipped(self.cfg), ctl.cfg)
        m.d.comb += [sq.load_valid.eq(self.load_valid), sq.load_qp.eq(self.load_qp),
                     sq.load_row.eq(self.load_row), self.qp_error.eq(sq.qp_error),
                     rx.rts.eq(sq.rts),
                     pick.zero.eq(timers.zero),
                     self.error_event.eq(ctl.error_event), self.error_qp.eq(ctl.error_qp)]

        # ---- completions: the control FSM puts them only when the FIFO has room --------------
        m.d.comb += [wcq.w_en.eq(ctl.wc.valid), wcq.w_data.eq(ctl.wc.p),
                     ctl.wc.ready.eq(wcq.w_rdy),
                     self.wc.valid.eq(wcq.r_rdy), self.wc.p.eq(wcq.r_data),
                     wcq.r_en.eq(self.wc.ready)]

        # ---- counters ---------------------------------------------------------------------------
        for name, _ in ReqEvents:
            cnt = getattr(self, f"cnt_{name}")
            with m.If(getattr(ctl.event, name)):
                m.d.sync += cnt.eq(cnt + 1)
        return m

# Ref: roce-layouts.md §3 (opcodes), §6.1 (24-bit PSN arithmetic), §6.3 (PSNs consumed), §6.5
#      (ACK coalescing, NAKs, requester reaction), §6.7 (timer, retry_cnt/rnr_retry, 7 = infinite);
#      IBTA Vol. 1 §9.7.5.2.8 (RNR timer table); hw/iface.py (WorkRequest, WorkCompletion).
"""RC requester: work requests in, RoCE request packets out, completions back.

Structure::

    WorkRequest --> per-QP send queue --(TxReq)--> TxPath --> RoceTxBuilder --> wire
                         ^   |
    RespDemux --> hdr ---+   +--> WorkCompletion (FIFO), error_event
              --> payload ---> DmaWriter --> MemBus (READ response data into target memory)

One control FSM does everything that touches per-QP state, one thing per cycle, in priority
order: a response header, an expired timer, a flush completion of a QP in error, a new work
request, the next request packet. Why one FSM: every step reads and writes the same per-QP
record (queue pointers, PSN counters, retry counters); serialising them avoids any hazard, and
none of them is on the octet datapath (payloads move through TxPath and DmaWriter at one beat
per cycle), so a few cycles per packet cost nothing at line rate.

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
- the send queue is one memory of n_qp × depth entries with two asynchronous read ports (the
  head and txp entries of the FSM's QP) and one write port: LUT RAM on the ECP5
  (TRELLIS_DPR16X4, one copy per read port). It was registers until 2026-11-30: 10.9k
  flip-flops and two 32-to-1 multiplexers of 280 bits at 4 QPs x 8 entries, the largest
  single block of the ECPIX-5 build and the densest routing.
"""

from amaranth import *
from amaranth.lib import data, fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.headers import BthOpcode
from hw.iface import (ADDR_BITS, QP_INDEX_BITS, MemBusSignature, QpConfig, QpState,
                          WcStatus, WorkCompletion, WorkRequest, WrOp)
from hw.rdma.roce_hdr import RoceRxHeader
from hw.lib.dma import DmaWriter
from hw.lib.stream import PacketStream
from hw.rdma.txpath import TxReq, select_cfg

__all__ = ["RespDemux", "Requester", "ack_timeout_cycles", "rnr_timer_cycles",
           "RNR_TIMER_MS", "is_response_opcode"]

#: IBTA RNR NAK timer field (AETH syndrome bits 4:0) -> minimum delay in milliseconds.
RNR_TIMER_MS = [655.36, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12, 0.16, 0.24, 0.32, 0.48, 0.64,
                0.96, 1.28, 1.92, 2.56, 3.84, 5.12, 7.68, 10.24, 15.36, 20.48, 30.72, 40.96,
                61.44, 81.92, 122.88, 163.84, 245.76, 327.68, 491.52]


def ack_timeout_cycles(code, clk_hz, timer_scale=1):
    """Clock cycles of the local ACK timeout 4.096 us * 2**code (code 0 = no timeout: 0)."""
    if code == 0:
        return 0
    return max(1, round(4.096e-6 * 2 ** code * clk_hz / timer_scale))


def rnr_timer_cycles(code, clk_hz, timer_scale=1):
    """Clock cycles of the RNR NAK timer code (IBTA table)."""
    return max(1, round(RNR_TIMER_MS[code] * 1e-3 * clk_hz / timer_scale))


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
            with m.State("Hdr"):
                m.d.comb += [self.req_hdr.valid.eq(self.hdr.valid & to_req),
                             self.resp_hdr.valid.eq(self.hdr.valid & ~to_req),
                             self.hdr.ready.eq(Mux(to_req, self.req_hdr.ready,
                                                   self.resp_hdr.ready))]
                with m.If(self.hdr.valid & self.hdr.ready & (self.hdr.p.payload_len != 0)):
                    m.d.sync += sel.eq(to_req)
                    m.next = "Payload"
            with m.State("Payload"):
                m.d.comb += [self.req_payload.valid.eq(self.payload.valid & sel),
                             self.resp_payload.valid.eq(self.payload.valid & ~sel),
                             self.payload.ready.eq(Mux(sel, self.req_payload.ready,
                                                       self.resp_payload.ready))]
                with m.If(self.payload.valid & self.payload.ready & self.payload.p.last):
                    m.next = "Hdr"
        return m


#: One send-queue entry: the work request (without its QP) plus its PSN range.
SqEntry = data.StructLayout({
    "wr_id": 16, "op": WrOp, "rkey": 32, "va": 64, "length": 32, "laddr": ADDR_BITS,
    "imm": 32, "inv_rkey": 32,
    "first_psn": 24, "npkts": 24,
})


class QSt:
    """Requester-side QP states (not the host's QpState)."""
    OFF, RTS, ERR = 0, 1, 2


def _qstate_layout(depth):
    ptr = range(2 * depth)
    return data.StructLayout({
        "st": 2, "head": ptr, "txp": ptr, "tail": ptr,
        "tx_pkt": 24, "head_done": 24, "alloc_psn": 24,
        "retry_left": 3, "rnr_left": 3, "rnr_wait": 1, "timer_on": 1,
        "err_code": WcStatus,
    })


class _Timers(wiring.Component):
    """``n`` down-counters; ``set`` loads counter ``index`` with ``value``; ``zero[i]``."""

    def __init__(self, n, bits):
        self._n, self._bits = n, bits
        super().__init__({"set": In(1), "index": In(range(max(n, 2))), "value": In(bits),
                          "zero": Out(n)})

    def elaborate(self, platform):
        m = Module()
        for i in range(self._n):
            t = Signal(self._bits, name=f"timer{i}")
            m.d.comb += self.zero[i].eq(t == 0)
            with m.If(self.set & (self.index == i)):
                m.d.sync += t.eq(self.value)
            with m.Elif(t != 0):
                m.d.sync += t.eq(t - 1)
        return m


def _psn_lt(a, b):
    """a before b in 24-bit serial arithmetic (roce-layouts §6.1)."""
    return (a - b)[23]


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
    cfg : In(QpConfig).array(n_qp)
    load : In(n_qp)     bit i: the host wrote QP i's state (RTS starts the send queue at
                        ``sq_psn``; ERROR flushes it; any other state stops it)
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
            "cfg": In(QpConfig).array(n_qp),
            "load": In(n_qp),
            "tx": Out(stream.Signature(TxReq)),
            "rsp_hdr": In(stream.Signature(RoceRxHeader)),
            "rsp_payload": In(PacketStream(width)),
            "mem": Out(MemBusSignature()),
            "error_event": Out(1), "error_qp": Out(QP_INDEX_BITS), "qp_error": Out(n_qp),
            "cnt_timeouts": Out(32), "cnt_seq_naks": Out(32), "cnt_rnr_naks": Out(32),
            "cnt_retransmits": Out(32), "cnt_stale": Out(32), "cnt_src_mismatch": Out(32),
        })

    # ----------------------------------------------------------------------------------------
    def elaborate(self, platform):
        m = Module()
        nq, depth = self._n_qp, self._depth
        ib = max(1, (depth - 1).bit_length())
        qb = max(1, (nq - 1).bit_length())
        QState = _qstate_layout(depth)

        m.submodules.writer = writer = DmaWriter(self._width)
        wiring.connect(m, writer.mem, wiring.flipped(self.mem))
        m.submodules.wcq = wcq = fifo.SyncFIFOBuffered(width=Shape.cast(WorkCompletion).width,
                                                       depth=4)
        m.d.comb += [self.wc.valid.eq(wcq.r_rdy), self.wc.p.eq(wcq.r_data),
                     wcq.r_en.eq(self.wc.ready)]

        qs = [Signal(QState, name=f"qs{i}") for i in range(nq)]
        # Entry k of QP i at address (i << ib) | k.
        m.submodules.sq = sq = memory.Memory(shape=SqEntry, depth=nq << ib, init=[])
        for i in range(nq):
            m.d.comb += self.qp_error[i].eq(qs[i].st == QSt.ERR)

        # ---- the QP the FSM works on this cycle, its record, its head / txp entries -------
        cqp = Signal(qb)
        cur = Signal(QState)
        nxt = Signal(QState)
        commit = Signal()
        with m.Switch(cqp):
            for i in range(nq):
                with m.Case(i):
                    m.d.comb += cur.eq(qs[i])
        m.d.comb += nxt.eq(cur)
        cfg = select_cfg(m, self.cfg, cqp, "ccfg")

        def entry_at(ptr, name):
            port = sq.read_port(domain="comb")
            e = Signal(SqEntry, name=name)
            m.d.comb += [port.addr.eq(Cat(ptr[:ib], cqp)), e.eq(port.data)]
            return e
        h = entry_at(cur.head, "h_ent")
        t = entry_at(cur.txp, "t_ent")
        h_last = Signal(24)
        m.d.comb += h_last.eq(h.first_psn + h.npkts - 1)

        # Write-back of the FSM's QP record (load strobes below override it).
        with m.If(commit):
            with m.Switch(cqp):
                for i in range(nq):
                    with m.Case(i):
                        m.d.sync += qs[i].eq(nxt)

        # ---- timers (a submodule: they count every cycle, the FSM only sees them expire) ----
        m.submodules.timers = tm = _Timers(nq, 40)
        t_set, t_val = tm.set, tm.value
        m.d.comb += tm.index.eq(cqp)
        zero = tm.zero
        ack_cyc = Signal(40)
        with m.Switch(cfg.timeout):
            for c in range(32):
                with m.Case(c):
                    m.d.comb += ack_cyc.eq(ack_timeout_cycles(c, self._clk_hz, self._scale))
        expired = Signal(nq)
        for i in range(nq):
            m.d.comb += expired[i].eq(qs[i].timer_on & zero[i] & (qs[i].st == QSt.RTS))

        # ---- WC output -----------------------------------------------------------------------
        wc_put = Signal()
        wc_rec = Signal(WorkCompletion)
        m.d.comb += [wcq.w_en.eq(wc_put), wcq.w_data.eq(wc_rec), wc_rec.qp.eq(cqp)]
        wc_room = wcq.w_rdy

        # ---- TX output register ----------------------------------------------------------------
        txv = Signal()
        txr = Signal(TxReq)
        m.d.comb += [self.tx.valid.eq(txv), self.tx.p.eq(txr)]
        with m.If(self.tx.valid & self.tx.ready):
            m.d.sync += txv.eq(0)

        # ---- derived values of the current QP ------------------------------------------------
        pmtu_log2 = Signal(4)
        m.d.comb += pmtu_log2.eq(cfg.pmtu + 7)          # code 1 = 256 octets
        outstanding = Signal()          # of `cur`: something sent is not yet acknowledged
        m.d.comb += outstanding.eq((cur.head != cur.txp) | (cur.tx_pkt != cur.head_done))
        go_back_pkt = Mux(h.op == WrOp.READ, 0, cur.head_done)

        def reload_counters():
            m.d.comb += [nxt.retry_left.eq(cfg.retry_cnt), nxt.rnr_left.eq(cfg.rnr_retry)]

        def restart_timer(still_outstanding):
            # After progress: run again for what is still outstanding, else stop. A running
            # RNR wait keeps the timer.
            with m.If(~cur.rnr_wait):
                m.d.comb += [nxt.timer_on.eq(still_outstanding & (cfg.timeout != 0)),
                             t_set.eq(1), t_val.eq(ack_cyc)]

        def go_error(status):
            m.d.comb += [nxt.st.eq(QSt.ERR), nxt.err_code.eq(status), nxt.timer_on.eq(0),
                         nxt.rnr_wait.eq(0), self.error_event.eq(1), self.error_qp.eq(cqp)]

        # ---- response record latched by the FSM ----------------------------------------------
        r_op = Signal(8)
        r_psn = Signal(24)
        r_syn = Signal(8)
        r_plen = Signal(16)
        r_qp = Signal(qb)
        r_limit = Signal(24)        # PSNs up to here are acknowledged by this response
        progress = Signal()
        rh = self.rsp_hdr.p
        hit = Signal()
        hit_qp = Signal(qb)
        hit_src = Signal()          # the hit QP's peer_ip is the response's source address
        for i in range(nq):
            with m.If((rh.bth.dest_qp == self.cfg[i].local_qpn) & (qs[i].st == QSt.RTS)):
                m.d.comb += [hit.eq(1), hit_qp.eq(i),
                             hit_src.eq(rh.meta.src_ip == self.cfg[i].peer_ip)]
        is_ack = (rh.bth.opcode == BthOpcode.ACKNOWLEDGE.value) | \
                 (rh.bth.opcode == BthOpcode.ATOMIC_ACKNOWLEDGE.value)
        plain_ack = is_ack & (rh.aeth.syndrome[5:8] == 0)

        # ---- candidates for the idle FSM -----------------------------------------------------
        exp_any = Signal()
        exp_qp = Signal(qb)
        flush_any = Signal()
        flush_qp = Signal(qb)
        for i in reversed(range(nq)):
            with m.If(expired[i]):
                m.d.comb += [exp_any.eq(1), exp_qp.eq(i)]
            with m.If((qs[i].st == QSt.ERR) & (qs[i].head != qs[i].tail)):
                m.d.comb += [flush_any.eq(1), flush_qp.eq(i)]
        can_send = Signal(nq)
        for i in range(nq):
            m.d.comb += can_send[i].eq((qs[i].st == QSt.RTS) & ~qs[i].rnr_wait &
                                       (qs[i].txp != qs[i].tail))
        rr = Signal(qb)
        send_any = Signal()
        send_qp = Signal(qb)
        for off in reversed(range(1, nq + 1)):
            idx = Signal(qb, name=f"scand{off}")
            m.d.comb += idx.eq((rr + off) % nq)
            with m.Switch(idx):
                for i in range(nq):
                    with m.Case(i):
                        with m.If(can_send[i]):
                            m.d.comb += [send_any.eq(1), send_qp.eq(i)]
        wr_qp = Signal(qb)
        m.d.comb += wr_qp.eq(self.wr.p.qp)
        prefer_wr = Signal()

        # ---- packet builder for the txp entry of the current QP --------------------------------
        k = cur.tx_pkt
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
        B = BthOpcode

        def pick(only, first, middle, last):
            return Mux(single, only.value, Mux(is_first, first.value,
                                               Mux(is_last, last.value, middle.value)))
        with m.Switch(t.op):
            with m.Case(WrOp.SEND):
                m.d.comb += opcode.eq(pick(B.SEND_ONLY, B.SEND_FIRST, B.SEND_MIDDLE,
                                           B.SEND_LAST))
            with m.Case(WrOp.SEND_INV):
                m.d.comb += opcode.eq(pick(B.SEND_ONLY_INV, B.SEND_FIRST, B.SEND_MIDDLE,
                                           B.SEND_LAST_INV))
            with m.Case(WrOp.WRITE):
                m.d.comb += opcode.eq(pick(B.WRITE_ONLY, B.WRITE_FIRST, B.WRITE_MIDDLE,
                                           B.WRITE_LAST))
            with m.Case(WrOp.WRITE_IMM):
                m.d.comb += opcode.eq(pick(B.WRITE_ONLY_IMM, B.WRITE_FIRST, B.WRITE_MIDDLE,
                                           B.WRITE_LAST_IMM))
            with m.Default():
                m.d.comb += opcode.eq(B.READ_REQUEST.value)
        is_read_t = t.op == WrOp.READ
        pkt = Signal(TxReq)
        m.d.comb += [
            pkt.qp.eq(cqp), pkt.opcode.eq(opcode), pkt.psn.eq(t.first_psn + k),
            pkt.ackreq.eq(is_last | is_read_t),
            pkt.reth.va.eq(t.va), pkt.reth.rkey.eq(t.rkey), pkt.reth.dma_length.eq(t.length),
            pkt.imm.imm.eq(t.imm), pkt.ieth.rkey.eq(t.inv_rkey),
            pkt.laddr.eq(t.laddr + off),
            pkt.length.eq(Mux(is_read_t, 0, seg)),
        ]

        # ---- the FSM -----------------------------------------------------------------------------
        sq_index = Signal(ib)
        sq_write = Signal()
        sq_data = Signal(SqEntry)
        sq_wp = sq.write_port()
        m.d.comb += [sq_wp.addr.eq(Cat(sq_index, cqp)), sq_wp.data.eq(sq_data),
                     sq_wp.en.eq(sq_write)]

        with m.FSM(name="req"):
            with m.State("Idle"):
                with m.If(self.rsp_hdr.valid):
                    m.d.comb += self.rsp_hdr.ready.eq(1)
                    m.d.sync += [r_op.eq(rh.bth.opcode), r_psn.eq(rh.bth.psn),
                                 r_syn.eq(rh.aeth.syndrome), r_plen.eq(rh.payload_len),
                                 r_qp.eq(hit_qp), progress.eq(0),
                                 r_limit.eq(Mux(plain_ack, rh.bth.psn, rh.bth.psn - 1))]
                    with m.If(hit & hit_src):
                        m.next = "AckLoop"
                    with m.Elif(hit):
                        # Spoofed source: dropped before anything of the QP is looked at.
                        m.d.sync += self.cnt_src_mismatch.eq(self.cnt_src_mismatch + 1)
                        with m.If(rh.payload_len != 0):
                            m.next = "Discard"
                    with m.Else():
                        m.d.sync += self.cnt_stale.eq(self.cnt_stale + 1)
                        with m.If(rh.payload_len != 0):
                            m.next = "Discard"
                with m.Elif(exp_any):
                    m.d.comb += [cqp.eq(exp_qp), commit.eq(1), nxt.timer_on.eq(0)]
                    with m.If(cur.rnr_wait):
                        m.d.comb += nxt.rnr_wait.eq(0)
                    with m.Elif(outstanding):
                        m.d.sync += self.cnt_timeouts.eq(self.cnt_timeouts + 1)
                        with m.If(cur.retry_left == 0):
                            go_error(WcStatus.RETRY_EXCEEDED)
                        with m.Else():
                            with m.If(cur.retry_left != 7):
                                m.d.comb += nxt.retry_left.eq(cur.retry_left - 1)
                            m.d.comb += [nxt.txp.eq(cur.head), nxt.tx_pkt.eq(go_back_pkt)]
                            m.d.sync += self.cnt_retransmits.eq(self.cnt_retransmits + 1)
                with m.Elif(flush_any & wc_room):
                    m.d.comb += [cqp.eq(flush_qp), commit.eq(1), wc_put.eq(1),
                                 wc_rec.wr_id.eq(h.wr_id), wc_rec.status.eq(cur.err_code),
                                 nxt.err_code.eq(WcStatus.FLUSHED),
                                 nxt.head.eq(cur.head + 1), nxt.head_done.eq(0)]
                    with m.If(cur.head == cur.txp):
                        m.d.comb += [nxt.txp.eq(cur.head + 1), nxt.tx_pkt.eq(0)]
                with m.Elif(self.wr.valid & (prefer_wr | ~send_any | txv)):
                    m.d.comb += cqp.eq(wr_qp)
                    m.d.sync += prefer_wr.eq(0)
                    full = (cur.tail - cur.head)[:ib + 1] == depth
                    with m.If(cur.st == QSt.OFF):
                        # Not ready to send: complete as flushed at once.
                        with m.If(wc_room):
                            m.d.comb += [self.wr.ready.eq(1), wc_put.eq(1),
                                         wc_rec.wr_id.eq(self.wr.p.wr_id),
                                         wc_rec.status.eq(WcStatus.FLUSHED)]
                    with m.Elif(~full):
                        wl = self.wr.p.length
                        npk = Signal(24)
                        m.d.comb += npk.eq(Mux(wl == 0, 1,
                                               (wl + pmtu_bytes - 1) >> pmtu_log2))
                        m.d.comb += [self.wr.ready.eq(1), commit.eq(1),
                                     nxt.tail.eq(cur.tail + 1),
                                     nxt.alloc_psn.eq(cur.alloc_psn + npk),
                                     sq_write.eq(1), sq_index.eq(cur.tail[:ib])]
                        for name in ("wr_id", "op", "rkey", "va", "length", "laddr", "imm",
                                     "inv_rkey"):
                            m.d.comb += getattr(sq_data, name).eq(getattr(self.wr.p, name))
                        m.d.comb += [sq_data.first_psn.eq(cur.alloc_psn), sq_data.npkts.eq(npk)]
                with m.Elif(send_any & ~txv):
                    m.d.comb += [cqp.eq(send_qp), commit.eq(1)]
                    m.d.sync += [txv.eq(1), txr.eq(pkt), rr.eq(send_qp), prefer_wr.eq(1)]
                    with m.If(is_last | is_read_t):
                        m.d.comb += [nxt.txp.eq(cur.txp + 1), nxt.tx_pkt.eq(0)]
                    with m.Else():
                        m.d.comb += nxt.tx_pkt.eq(cur.tx_pkt + 1)
                    with m.If(~cur.timer_on & (cfg.timeout != 0)):
                        m.d.comb += [nxt.timer_on.eq(1), t_set.eq(1), t_val.eq(ack_cyc)]

            # Complete every non-READ message wholly at or before r_limit, one per cycle.
            with m.State("AckLoop"):
                m.d.comb += cqp.eq(r_qp)
                nonempty = cur.head != cur.tail
                sent_whole = cur.head != cur.txp
                lim_off = Signal(24)
                m.d.comb += lim_off.eq(r_limit - h.first_psn)
                with m.If(nonempty & (h.op != WrOp.READ) & sent_whole &
                          ~_psn_lt(r_limit, h_last)):
                    with m.If(wc_room):
                        m.d.comb += [commit.eq(1), wc_put.eq(1), wc_rec.wr_id.eq(h.wr_id),
                                     wc_rec.status.eq(WcStatus.OK),
                                     nxt.head.eq(cur.head + 1), nxt.head_done.eq(0)]
                        m.d.sync += progress.eq(1)
                with m.Else():
                    sent_pkts = Mux(sent_whole, h.npkts, cur.tx_pkt)
                    with m.If(nonempty & (h.op != WrOp.READ) & ~_psn_lt(r_limit, h.first_psn) &
                              (lim_off < sent_pkts) & (lim_off >= cur.head_done)):
                        m.d.comb += [commit.eq(1), nxt.head_done.eq(lim_off + 1)]
                        m.d.sync += progress.eq(1)
                    m.next = "Act"

            with m.State("Act"):
                m.d.comb += cqp.eq(r_qp)
                nonempty = cur.head != cur.tail
                in_head = nonempty & ~_psn_lt(r_psn, h.first_psn) & ~_psn_lt(h_last, r_psn)
                is_resp = (r_op >= BthOpcode.READ_RESPONSE_FIRST.value) & \
                          (r_op <= BthOpcode.READ_RESPONSE_ONLY.value)
                m.next = "Idle"
                with m.If(progress):
                    m.d.comb += commit.eq(1)
                    reload_counters()
                    restart_timer(outstanding)
                with m.If(is_resp):
                    ok = nonempty & (h.op == WrOp.READ) & (cur.head != cur.txp) & \
                         (r_psn == (h.first_psn + cur.head_done)[:24])
                    with m.If(ok):
                        with m.If(r_plen != 0):
                            m.d.comb += [writer.cmd.valid.eq(1),
                                         writer.cmd.p.addr.eq(
                                             h.laddr + (cur.head_done << pmtu_log2))]
                            m.next = "Write"       # the writer is idle here
                        with m.Else():
                            m.next = "ReadDone"
                    with m.Else():
                        m.d.sync += self.cnt_stale.eq(self.cnt_stale + 1)
                        with m.If(r_plen != 0):
                            m.next = "Discard"
                with m.Elif(r_syn[5:8] == 0):
                    # ACK (any credit field): all done in AckLoop.
                    with m.If(~progress):
                        m.d.sync += self.cnt_stale.eq(self.cnt_stale + 1)
                with m.Elif(~in_head | cur.rnr_wait):
                    # Not about the oldest WR, or a NAK provoked by packets sent before an RNR
                    # NAK that is already being waited out.
                    m.d.sync += self.cnt_stale.eq(self.cnt_stale + 1)
                with m.Elif(r_syn[5:8] == 0b001):
                    # RNR NAK: wait the NAK's timer, then go back to its PSN.
                    m.d.comb += commit.eq(1)
                    m.d.sync += self.cnt_rnr_naks.eq(self.cnt_rnr_naks + 1)
                    with m.If(cur.rnr_left == 0):
                        go_error(WcStatus.RNR_EXCEEDED)
                    with m.Else():
                        with m.If(cur.rnr_left != 7):
                            m.d.comb += nxt.rnr_left.eq(cur.rnr_left - 1)
                        m.d.comb += [nxt.txp.eq(cur.head), nxt.tx_pkt.eq(go_back_pkt),
                                     nxt.rnr_wait.eq(1), nxt.timer_on.eq(1), t_set.eq(1)]
                        with m.Switch(r_syn[:5]):
                            for c in range(32):
                                with m.Case(c):
                                    m.d.comb += t_val.eq(
                                        rnr_timer_cycles(c, self._clk_hz, self._scale))
                with m.Elif(r_syn == 0x60):
                    # PSN sequence error: everything before r_psn is acknowledged; resend.
                    m.d.comb += commit.eq(1)
                    m.d.sync += self.cnt_seq_naks.eq(self.cnt_seq_naks + 1)
                    with m.If(cur.retry_left == 0):
                        go_error(WcStatus.RETRY_EXCEEDED)
                    with m.Else():
                        with m.If(cur.retry_left != 7):
                            m.d.comb += nxt.retry_left.eq(cur.retry_left - 1)
                        m.d.comb += [nxt.txp.eq(cur.head), nxt.tx_pkt.eq(go_back_pkt),
                                     nxt.timer_on.eq(0)]
                        m.d.sync += self.cnt_retransmits.eq(self.cnt_retransmits + 1)
                with m.Elif(r_syn == 0x61):
                    m.d.comb += commit.eq(1)
                    go_error(WcStatus.REMOTE_INVALID)
                with m.Elif(r_syn == 0x62):
                    m.d.comb += commit.eq(1)
                    go_error(WcStatus.REMOTE_ACCESS)
                with m.Elif(r_syn == 0x63):
                    m.d.comb += commit.eq(1)
                    go_error(WcStatus.REMOTE_OP)

            with m.State("Write"):
                m.d.comb += [writer.i.valid.eq(self.rsp_payload.valid),
                             writer.i.p.eq(self.rsp_payload.p),
                             self.rsp_payload.ready.eq(writer.i.ready)]
                with m.If(self.rsp_payload.valid & self.rsp_payload.ready &
                          self.rsp_payload.p.last):
                    m.next = "WriteWait"
            with m.State("WriteWait"):
                with m.If(writer.idle):
                    m.next = "ReadDone"

            # One more response of the head READ is in memory.
            with m.State("ReadDone"):
                m.d.comb += cqp.eq(r_qp)
                with m.If(cur.head_done + 1 == h.npkts):
                    with m.If(wc_room):
                        m.d.comb += [commit.eq(1), wc_put.eq(1), wc_rec.wr_id.eq(h.wr_id),
                                     wc_rec.status.eq(WcStatus.OK),
                                     nxt.head.eq(cur.head + 1), nxt.head_done.eq(0)]
                        reload_counters()
                        restart_timer(((cur.head + 1)[:ib + 1] != cur.txp) | (cur.tx_pkt != 0))
                        m.next = "Idle"
                with m.Else():
                    m.d.comb += [commit.eq(1), nxt.head_done.eq(cur.head_done + 1)]
                    reload_counters()
                    restart_timer((cur.head != cur.txp) | (cur.tx_pkt != cur.head_done + 1))
                    m.next = "Idle"

            with m.State("Discard"):
                m.d.comb += self.rsp_payload.ready.eq(1)
                with m.If(self.rsp_payload.valid & self.rsp_payload.p.last):
                    m.next = "Idle"

        # ---- host loads a QP state (overrides the FSM's write-back) ----------------------------
        for i in range(nq):
            c = self.cfg[i]
            with m.If(self.load[i]):
                with m.If(c.state == QpState.RTS):
                    with m.If(qs[i].st != QSt.RTS):
                        m.d.sync += [qs[i].eq(0), qs[i].st.eq(QSt.RTS),
                                     qs[i].alloc_psn.eq(c.sq_psn),
                                     qs[i].retry_left.eq(c.retry_cnt),
                                     qs[i].rnr_left.eq(c.rnr_retry)]
                with m.Elif(c.state == QpState.ERROR):
                    m.d.sync += [qs[i].st.eq(QSt.ERR), qs[i].timer_on.eq(0),
                                 qs[i].rnr_wait.eq(0), qs[i].err_code.eq(WcStatus.FLUSHED)]
                with m.Else():
                    m.d.sync += qs[i].eq(0)
        return m

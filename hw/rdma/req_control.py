# Ref: docs/roce-layouts.md §6.1 (24-bit PSN arithmetic), §6.3 (PSNs consumed), §6.5 (ACK
#      coalescing, NAKs, requester reaction), §6.7 (timer, retry_cnt / rnr_retry, 7 = infinite);
#      hw/iface.py (WorkRequest, WorkCompletion).
"""The requester's control FSM: every step that reads or writes a QP's record.

One step at a time, chosen in priority order when idle: a response header, an expired timer, a
flush completion of a QP in error, a new work request, the next request packet. The record of
the QP it works on comes from :class:`~hw.rdma.req_sq.SendQueues` and goes back there;
candidates come from :class:`~hw.rdma.req_sq.SqScheduler`; responses from
:class:`~hw.rdma.req_rx.ResponseIntake`; packets leave through
:class:`~hw.rdma.req_tx.RequestPacketizer`; timers are loaded in
:class:`~hw.rdma.req_timers.RetryTimers`. This FSM owns the decisions: which messages a
response completes, the reaction to NAKs and timeouts (go back to the oldest unacknowledged
packet, count the retry down, or fail the QP), when the timer runs, and the work completions
(``wc``: valid only when ready, into the requester's completion FIFO). ``event`` strobes the
requester's counters.

Why one FSM: every step reads and writes the same per-QP record (queue pointers, PSN counters,
retry counters); serialising them avoids any hazard, and none of them is on the octet datapath
(payloads move through TxPath and the DmaWriter at one beat per cycle), so a few cycles per
packet cost nothing at line rate.

Steps and their cycles
----------------------
The records and the send-queue entries are in memories with registered read ports
(:mod:`hw.rdma.req_sq`), so a step first selects its QP (IDLE: ``sq.sel``, held in ``qp``
until the step ends), has the record a cycle later (READ; the QP's :data:`~hw.iface.ReqCfg`
from QpTable's ``req`` copy, addressed with it, too) and the entries the cycle after, where it
acts and writes back (``commit``):

- a work request: select, then push (2 cycles: a push needs the record only);
- an expired timer, a flush completion, a request packet: select, READ, act (3 cycles), and
  the idle cycle before the select, when the FSM comes from another step: the scheduler's
  candidates are registered and are used only in the second idle cycle in a row (so a packet
  after a packet takes 4 cycles);
- a response: select (take), READ, ACK_LOOP one cycle per message it completes and one more,
  ACT (k + 4 cycles for an ACK that completes k messages; it was k + 3 with the records in
  flip-flops), then the READ data path as before; like a candidate, a response is taken only
  in the second idle cycle in a row (the intake's ``hit`` is registered). ACK_LOOP and
  READ_DONE see the record and the head entry as written by their own previous cycle
  (transparent record port; entry addresses from the write-back).

The scheduler's candidate was taken in the idle cycle before the select, when this FSM changed
nothing; what may have changed since, and before the act, is what a host load changes (and a
timer's ``zero`` may rise, which only makes a pick late), so each act checks the state again
on ``cur``, whose ``st``, ``timer_on`` and ``rnr_wait`` are the flip-flops of this cycle. In the
cycle of a host load (``sq.busy``) the FSM does not act: the load has the record's write port,
and from the next cycle on ``cur`` is the loaded record.
"""

from contextlib import contextmanager

from amaranth import Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.headers import BthOpcode
from hw.iface import (QP_INDEX_BITS, QpReadSignature, ReqCfg, WcStatus, WorkCompletion,
                      WorkRequest, WrOp)
from hw.rdma.req_rx import rx_port
from hw.rdma.req_sq import QSt, index_bits, pick_port, sq_port
from hw.rdma.req_timers import timer_port
from hw.rdma.req_tx import packet_port

__all__ = ["ReqEvents", "RequesterControl"]

#: One-cycle strobes of the requester's counters (``cnt_<name>``).
ReqEvents = data.StructLayout({"timeouts": 1, "seq_naks": 1, "rnr_naks": 1, "retransmits": 1,
                               "stale": 1, "src_mismatch": 1})


def _psn_lt(a, b):
    """a before b in 24-bit serial arithmetic (roce-layouts §6.1)."""
    return (a - b)[23]


class _Step:
    """What the READ cycle after a select leads to."""
    ACK, EXPIRE, FLUSH, SEND = range(4)


class _RecordOps:
    """The updates of the selected QP's record that the control FSM's steps are made of.

    Each adds comb assignments to ``nxt`` and the ports in the current context, in statement
    order: a later assignment wins (an RNR NAK's timer load wins over ``restart_timer``).
    """

    def __init__(self, m, ctl, cfg, qp):
        self.m, self.ctl, self.cfg, self.qp = m, ctl, cfg, qp
        self.cur, self.nxt = ctl.sq.cur, ctl.sq.nxt
        # The packet to send again from: the oldest unacknowledged one (a READ goes whole).
        self.go_back_pkt = Mux(ctl.sq.head.op == WrOp.READ, 0, self.cur.head_done)

    def reload_counters(self):
        self.m.d.comb += [self.nxt.retry_left.eq(self.cfg.retry_cnt),
                          self.nxt.rnr_left.eq(self.cfg.rnr_retry)]

    def restart_timer(self, still_outstanding):
        """After progress: run again for what is still outstanding, else stop. A running RNR
        wait keeps the timer."""
        with self.m.If(~self.cur.rnr_wait):
            self.m.d.comb += [self.nxt.timer_on.eq(still_outstanding & (self.cfg.timeout != 0)),
                              self.ctl.timer.start_ack.eq(1)]

    def go_error(self, status):
        nxt, ctl = self.nxt, self.ctl
        self.m.d.comb += [nxt.st.eq(QSt.ERR), nxt.err_code.eq(status), nxt.timer_on.eq(0),
                          nxt.rnr_wait.eq(0), ctl.error_event.eq(1), ctl.error_qp.eq(self.qp)]

    @contextmanager
    def go_back(self, left, status):
        """Retry counter ``left`` of the record (7 = infinite): none left -> error; else one
        less, and send again from the oldest unacknowledged packet (plus the body's updates)."""
        m, cur, nxt = self.m, self.cur, self.nxt
        with m.If(getattr(cur, left) == 0):
            self.go_error(status)
        with m.Else():
            with m.If(getattr(cur, left) != 7):
                m.d.comb += getattr(nxt, left).eq(getattr(cur, left) - 1)
            m.d.comb += [nxt.txp.eq(cur.head), nxt.tx_pkt.eq(self.go_back_pkt)]
            yield

    def complete_head(self, status):
        """A work completion for the head entry; the next entry becomes the head."""
        cur, nxt, wc = self.cur, self.nxt, self.ctl.wc
        self.m.d.comb += [self.ctl.sq.commit.eq(1), wc.valid.eq(1),
                          wc.p.wr_id.eq(self.ctl.sq.head.wr_id), wc.p.status.eq(status),
                          nxt.head.eq(cur.head + 1), nxt.head_done.eq(0)]


class RequesterControl(wiring.Component):
    """Ports
    -----
    wr : In(stream of WorkRequest)
    wc : Out(stream of WorkCompletion)   ``valid`` only when ``ready``
    cfg : Out(QpReadSignature(ReqCfg))   the requester's copy of the QP table (QpTable.req),
        addressed with the record at ``sq.sel``: its row is there with ``cur``, a cycle after
        the select
    sq, pick, timer, rx, pk : Out   ports on the requester's units (see the module docstring)
    event : Out(:data:`ReqEvents`)
    error_event : Out(1), error_qp : Out(QP_INDEX_BITS)   one-cycle strobe: QP went to error
    """

    def __init__(self, n_qp, sq_depth):
        self._depth = sq_depth
        super().__init__({
            "wr": In(stream.Signature(WorkRequest)),
            "wc": Out(stream.Signature(WorkCompletion)),
            "cfg": Out(QpReadSignature(ReqCfg)),
            "sq": Out(sq_port(n_qp, sq_depth)), "pick": Out(pick_port(n_qp)),
            "timer": Out(timer_port(n_qp)), "rx": Out(rx_port(n_qp)), "pk": Out(packet_port()),
            "event": Out(ReqEvents), "error_event": Out(1), "error_qp": Out(QP_INDEX_BITS),
        })

    def elaborate(self, platform):
        m = Module()
        sq, pick, tmr, rx, pk, ev = self.sq, self.pick, self.timer, self.rx, self.pk, self.event
        cur, nxt, commit, h = sq.cur, sq.nxt, sq.commit, sq.head
        rec, wc = rx.rec, self.wc
        ptr_bits = index_bits(self._depth) + 1
        qp = Signal(len(sq.sel))        # the QP of the step in hand (held from its select)
        step = Signal(2)                # the step a READ cycle leads to
        m.d.comb += [sq.sel.eq(qp), nxt.eq(cur), wc.p.qp.eq(qp)]
        cfg = self.cfg.data
        m.d.comb += self.cfg.addr.eq(sq.sel)
        h_last = Signal(24)
        m.d.comb += h_last.eq(h.first_psn + h.npkts - 1)
        pmtu_log2 = Signal(4)
        m.d.comb += pmtu_log2.eq(cfg.pmtu + 7)          # code 1 = 256 octets
        m.d.comb += [sq.pmtu_log2.eq(pmtu_log2), sq.push_wr.eq(self.wr.p),
                     pk.entry.eq(sq.txp), pk.index.eq(cur.tx_pkt), pk.qp.eq(qp),
                     pk.pmtu_log2.eq(pmtu_log2),
                     tmr.index.eq(qp), tmr.ack_code.eq(cfg.timeout), tmr.rnr_code.eq(rec.syn[:5])]
        outstanding = Signal()          # of `cur`: something sent is not yet acknowledged
        m.d.comb += outstanding.eq((cur.head != cur.txp) | (cur.tx_pkt != cur.head_done))
        nonempty = Signal()
        m.d.comb += nonempty.eq(cur.head != cur.tail)
        progress = Signal()             # the response completed or acknowledged something

        ops = _RecordOps(m, self, cfg, qp)

        def select(q, then):
            """Address QP ``q``'s record now; act on it from the cycle after the READ cycle."""
            m.d.comb += sq.sel.eq(q)
            m.d.sync += [qp.eq(q), step.eq(then)]
            m.next = "READ"

        # The scheduler's candidates and the intake's ``hit`` are registered (a cycle old).
        # ``fresh``: this is the second idle cycle in a row, so no step has acted since they
        # were taken and they show every change of this FSM's own (a commit, a push, a timer
        # start, a QP stopped).
        fresh = Signal()
        m.d.sync += fresh.eq(0)
        exp_any, flush_any, send_any = (Signal(name=n) for n in ("exp_any", "flush_any",
                                                                  "send_any"))
        m.d.comb += [exp_any.eq(pick.exp_any & fresh), flush_any.eq(pick.flush_any & fresh),
                     send_any.eq(pick.send_any & fresh)]

        with m.FSM(name="req"):
            with m.State("IDLE"):
                m.d.sync += fresh.eq(1)
                with m.If(rx.valid & ~fresh):
                    pass                # its `hit` may predate this FSM's last step: wait
                with m.Elif(rx.valid):
                    m.d.comb += rx.take.eq(1)
                    m.d.sync += progress.eq(0)
                    with m.If(rx.hit & rx.hit_src):
                        select(rx.qp, _Step.ACK)
                    with m.Else():
                        # A spoofed source (dropped before anything of the QP is looked at) or
                        # no QP.
                        m.d.comb += [ev.src_mismatch.eq(rx.hit), ev.stale.eq(~rx.hit)]
                        with m.If(rx.has_payload):
                            m.next = "DISCARD"
                with m.Elif(exp_any):
                    select(pick.exp_qp, _Step.EXPIRE)
                with m.Elif(flush_any & wc.ready):
                    select(pick.flush_qp, _Step.FLUSH)
                # Without a fresh candidate a WR waits for one unless it is its turn anyway:
                # WR after WR would otherwise keep packets out.
                with m.Elif(self.wr.valid & (pick.prefer_wr | (fresh & ~pick.send_any) |
                                             pk.busy)):
                    # A push needs the record only: act in the next cycle.
                    m.d.comb += [sq.sel.eq(self.wr.p.qp), pick.wr_turn.eq(1)]
                    m.d.sync += qp.eq(self.wr.p.qp)
                    m.next = "WR"
                with m.Elif(send_any & ~pk.busy):
                    m.d.comb += pick.sent.eq(1)
                    select(pick.send_qp, _Step.SEND)

            # The record is here (`cur`), the entries are being read.
            with m.State("READ"):
                with m.Switch(step):
                    for then, state in ((_Step.ACK, "ACK_LOOP"), (_Step.EXPIRE, "EXPIRE"),
                                        (_Step.FLUSH, "FLUSH"), (_Step.SEND, "SEND")):
                        with m.Case(then):
                            m.next = state

            # Every state below that reads or writes the record waits while a host load is
            # written (sq.busy): then the record and entries it sees are the load's.
            with m.State("EXPIRE"):
                with m.If(~sq.busy):
                    m.next = "IDLE"
                    # Still running (a host load may have stopped the QP since the select).
                    with m.If(cur.timer_on & (cur.st == QSt.RTS)):
                        m.d.comb += [commit.eq(1), nxt.timer_on.eq(0)]
                        with m.If(cur.rnr_wait):
                            m.d.comb += nxt.rnr_wait.eq(0)
                        with m.Elif(outstanding):
                            m.d.comb += ev.timeouts.eq(1)
                            with ops.go_back("retry_left", WcStatus.RETRY_EXCEEDED):
                                m.d.comb += ev.retransmits.eq(1)

            with m.State("FLUSH"):
                with m.If(~sq.busy):
                    with m.If((cur.st == QSt.ERR) & nonempty):
                        with m.If(wc.ready):
                            ops.complete_head(cur.err_code)
                            m.d.comb += nxt.err_code.eq(WcStatus.FLUSHED)
                            with m.If(cur.head == cur.txp):
                                m.d.comb += [nxt.txp.eq(cur.head + 1), nxt.tx_pkt.eq(0)]
                            m.next = "IDLE"
                    with m.Else():
                        m.next = "IDLE"

            with m.State("WR"):
                with m.If(~sq.busy):
                    m.next = "IDLE"
                    with m.If(self.wr.valid & (self.wr.p.qp[:len(qp)] == qp)):
                        with m.If(cur.st == QSt.OFF):
                            # Not ready to send: complete as flushed at once.
                            with m.If(wc.ready):
                                m.d.comb += [self.wr.ready.eq(1), wc.valid.eq(1),
                                             wc.p.wr_id.eq(self.wr.p.wr_id),
                                             wc.p.status.eq(WcStatus.FLUSHED)]
                        with m.Elif(~sq.full):
                            m.d.comb += [self.wr.ready.eq(1), sq.push.eq(1)]

            with m.State("SEND"):
                with m.If(~sq.busy):
                    m.next = "IDLE"
                    with m.If((cur.st == QSt.RTS) & ~cur.rnr_wait & (cur.txp != cur.tail) &
                              ~pk.busy):
                        m.d.comb += [commit.eq(1), pk.load.eq(1)]
                        with m.If(pk.msg_end):
                            m.d.comb += [nxt.txp.eq(cur.txp + 1), nxt.tx_pkt.eq(0)]
                        with m.Else():
                            m.d.comb += nxt.tx_pkt.eq(cur.tx_pkt + 1)
                        with m.If(~cur.timer_on & (cfg.timeout != 0)):
                            m.d.comb += [nxt.timer_on.eq(1), tmr.start_ack.eq(1)]

            # Complete every non-READ message wholly at or before rec.limit, one per cycle (the
            # entry at the next head follows the write-back).
            with m.State("ACK_LOOP"):
                sent_whole = cur.head != cur.txp
                lim_off = Signal(24)
                m.d.comb += lim_off.eq(rec.limit - h.first_psn)
                with m.If(sq.busy):
                    pass
                with m.Elif(nonempty & (h.op != WrOp.READ) & sent_whole &
                            ~_psn_lt(rec.limit, h_last)):
                    with m.If(wc.ready):
                        ops.complete_head(WcStatus.OK)
                        m.d.sync += progress.eq(1)
                with m.Else():
                    sent_pkts = Mux(sent_whole, h.npkts, cur.tx_pkt)
                    with m.If(nonempty & (h.op != WrOp.READ) &
                              ~_psn_lt(rec.limit, h.first_psn) &
                              (lim_off < sent_pkts) & (lim_off >= cur.head_done)):
                        m.d.comb += [commit.eq(1), nxt.head_done.eq(lim_off + 1)]
                        m.d.sync += progress.eq(1)
                    m.next = "ACT"

            with m.State("ACT"):
                in_head = nonempty & ~_psn_lt(rec.psn, h.first_psn) & ~_psn_lt(h_last, rec.psn)
                is_resp = (rec.op >= BthOpcode.READ_RESPONSE_FIRST.value) & \
                          (rec.op <= BthOpcode.READ_RESPONSE_ONLY.value)
                syn = rec.syn
                with m.If(~sq.busy):
                    m.next = "IDLE"
                    with m.If(progress):
                        m.d.comb += commit.eq(1)
                        ops.reload_counters()
                        ops.restart_timer(outstanding)
                    with m.If(is_resp):
                        ok = nonempty & (h.op == WrOp.READ) & (cur.head != cur.txp) & \
                             (rec.psn == (h.first_psn + cur.head_done)[:24])
                        with m.If(ok):
                            with m.If(rec.plen != 0):
                                m.d.comb += [rx.write_start.eq(1),
                                             rx.write_addr.eq(h.laddr +
                                                              (cur.head_done << pmtu_log2))]
                                m.next = "WRITE"       # the writer is idle here
                            with m.Else():
                                m.next = "READ_DONE"
                        with m.Else():
                            m.d.comb += ev.stale.eq(1)
                            with m.If(rec.plen != 0):
                                m.next = "DISCARD"
                    with m.Elif(syn[5:8] == 0):
                        # ACK (any credit field): all done in ACK_LOOP.
                        m.d.comb += ev.stale.eq(~progress)
                    with m.Elif(~in_head | cur.rnr_wait | (cur.st != QSt.RTS)):
                        # Not about the oldest WR, or a NAK provoked by packets sent before an
                        # RNR NAK that is already being waited out, or the host stopped the QP
                        # since the header was taken.
                        m.d.comb += ev.stale.eq(1)
                    with m.Elif(syn[5:8] == 0b001):
                        # RNR NAK: wait the NAK's timer, then go back to its PSN.
                        m.d.comb += [commit.eq(1), ev.rnr_naks.eq(1)]
                        with ops.go_back("rnr_left", WcStatus.RNR_EXCEEDED):
                            m.d.comb += [nxt.rnr_wait.eq(1), nxt.timer_on.eq(1),
                                         tmr.start_rnr.eq(1)]
                    with m.Elif(syn == 0x60):
                        # PSN sequence error: everything before rec.psn is acknowledged; resend.
                        m.d.comb += [commit.eq(1), ev.seq_naks.eq(1)]
                        with ops.go_back("retry_left", WcStatus.RETRY_EXCEEDED):
                            m.d.comb += [nxt.timer_on.eq(0), ev.retransmits.eq(1)]
                    for code, status in ((0x61, WcStatus.REMOTE_INVALID),
                                         (0x62, WcStatus.REMOTE_ACCESS),
                                         (0x63, WcStatus.REMOTE_OP)):
                        with m.Elif(syn == code):
                            m.d.comb += commit.eq(1)
                            ops.go_error(status)

            with m.State("WRITE"):
                m.d.comb += rx.write.eq(1)
                with m.If(rx.payload_end):
                    m.next = "WRITE_WAIT"
            with m.State("WRITE_WAIT"):
                with m.If(rx.writer_idle):
                    m.next = "READ_DONE"

            # One more response of the head READ is in memory.
            with m.State("READ_DONE"):
                with m.If(sq.busy):
                    pass
                with m.Elif(~nonempty):
                    # The host rewrote the record while the payload was written.
                    m.next = "IDLE"
                with m.Elif(cur.head_done + 1 == h.npkts):
                    with m.If(wc.ready):
                        ops.complete_head(WcStatus.OK)
                        ops.reload_counters()
                        ops.restart_timer(((cur.head + 1)[:ptr_bits] != cur.txp) |
                                          (cur.tx_pkt != 0))
                        m.next = "IDLE"
                with m.Else():
                    m.d.comb += [commit.eq(1), nxt.head_done.eq(cur.head_done + 1)]
                    ops.reload_counters()
                    ops.restart_timer((cur.head != cur.txp) | (cur.tx_pkt != cur.head_done + 1))
                    m.next = "IDLE"

            with m.State("DISCARD"):
                m.d.comb += rx.discard.eq(1)
                with m.If(rx.payload_end):
                    m.next = "IDLE"
        return m

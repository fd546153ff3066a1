# Ref: docs/roce-layouts.md §6.1 (24-bit PSN arithmetic), §6.3 (PSNs consumed: a READ takes the
#      PSNs of its responses); hw/iface.py (QpConfig, QpState, WorkRequest).
"""The requester's send queues and the choice of the QP its control FSM serves next.

:class:`SendQueues` owns every per-QP record of the requester (queue pointers, PSN counters,
retry counters, timer and error state) and the send-queue memory. Its client, the control FSM
(:class:`~hw.rdma.req_control.RequesterControl`), selects one QP per cycle (``sel``), sees its
record (``cur``), the entries at its ``head`` and ``txp`` pointers and whether it is ``full``,
and may write the record back (``commit``, ``nxt``) or append a work request (``push``).
PSNs are assigned here, at the push (``first_psn = alloc_psn``, ``alloc_psn += npkts``; the
rules are in :mod:`hw.rdma.requester`). A host load of a QP's state (QpTable's load event:
``load_valid``, ``load_qp``, the row in ``load_row``) overrides the write-back.

The send queue is one memory of n_qp x depth entries (entry k of QP i at ``(i << ib) | k``) with
two asynchronous read ports (the head and txp entries of the selected QP) and one write port:
LUT RAM on the ECP5 (TRELLIS_DPR16X4, one copy per read port). It was registers until
2026-11-30: 10.9k flip-flops and two 32-to-1 multiplexers of 280 bits at 4 QPs x 8 entries,
the largest single block of the ECPIX-5 build and the densest routing.

:class:`SqScheduler` picks the QP for the idle FSM from the status vectors of
:class:`SendQueues` and the retry timers: the lowest QP whose timer expired, the lowest QP in
error with entries left to flush, and the next QP round robin with a packet to send; it also
keeps the turn between new work requests and packets (``prefer_wr``).
"""

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, memory, wiring
from amaranth.lib.wiring import In, Out

from hw.iface import ADDR_BITS, QP_INDEX_BITS, QpConfig, QpState, WcStatus, WorkRequest, WrOp

__all__ = ["SqEntry", "QSt", "qstate_layout", "qp_bits", "index_bits", "sq_port", "sq_status",
           "SendQueues", "pick_port", "SqScheduler"]

#: One send-queue entry: the work request (without its QP) plus its PSN range.
SqEntry = data.StructLayout({
    "wr_id": 16, "op": WrOp, "rkey": 32, "va": 64, "length": 32, "laddr": ADDR_BITS,
    "imm": 32, "inv_rkey": 32,
    "first_psn": 24, "npkts": 24,
})

#: The fields a push copies from the work request.
_WR_FIELDS = ("wr_id", "op", "rkey", "va", "length", "laddr", "imm", "inv_rkey")


class QSt:
    """Requester-side QP states (not the host's QpState)."""
    OFF, RTS, ERR = 0, 1, 2


def qstate_layout(depth):
    """The per-QP record. Pointers count modulo 2 * depth (full and empty differ)."""
    ptr = range(2 * depth)
    return data.StructLayout({
        "st": 2, "head": ptr, "txp": ptr, "tail": ptr,
        "tx_pkt": 24, "head_done": 24, "alloc_psn": 24,
        "retry_left": 3, "rnr_left": 3, "rnr_wait": 1, "timer_on": 1,
        "err_code": WcStatus,
    })


def qp_bits(n_qp):
    """Width of a QP index (at least 1)."""
    return max(1, (n_qp - 1).bit_length())


def index_bits(depth):
    """Width of an entry index within one QP's queue (at least 1)."""
    return max(1, (depth - 1).bit_length())


def sq_port(n_qp, depth):
    """The control FSM's port on :class:`SendQueues`, seen from the FSM (Out: driven by it)."""
    qstate = qstate_layout(depth)
    return wiring.Signature({
        "sel": Out(qp_bits(n_qp)),          # the QP worked on this cycle
        "cur": In(qstate), "head": In(SqEntry), "txp": In(SqEntry), "full": In(1),
        "commit": Out(1), "nxt": Out(qstate),
        "push": Out(1), "push_wr": Out(WorkRequest),
        "pmtu_log2": Out(4),                # of the selected QP (for npkts at a push)
    })


def sq_status(n_qp):
    """Per-QP bits of :class:`SendQueues` for :class:`SqScheduler`."""
    return wiring.Signature({
        "timing": Out(n_qp),        # timer on, QP ready to send (expired when the timer is 0)
        "flush": Out(n_qp),         # in error with entries left to complete as flushed
        "can_send": Out(n_qp),      # ready to send, no RNR wait, an entry not sent whole
    })


class SendQueues(wiring.Component):
    """Per-QP records and send-queue entries of ``n_qp`` QPs, ``depth`` entries each.

    Ports
    -----
    port : In(:func:`sq_port`)   the control FSM's access (see the module docstring)
    load_valid : In(1), load_qp : In(QP_INDEX_BITS), load_row : In(QpConfig)
        the host wrote QP ``load_qp``'s state (RTS starts the queue at ``sq_psn``; ERROR
        flushes it; any other state stops it)
    status : Out(:func:`sq_status`)
    rts : Out(n_qp)   QP i is ready to send (responses are accepted for it)
    qp_error : Out(n_qp)   QP i is in error
    """

    def __init__(self, n_qp, depth):
        if depth & (depth - 1):
            raise ValueError("depth must be a power of two")
        self._n_qp, self._depth = n_qp, depth
        super().__init__({
            "port": In(sq_port(n_qp, depth)),
            "load_valid": In(1), "load_qp": In(QP_INDEX_BITS), "load_row": In(QpConfig),
            "status": Out(sq_status(n_qp)), "rts": Out(n_qp), "qp_error": Out(n_qp),
        })

    def elaborate(self, platform):
        m = Module()
        nq, depth, p = self._n_qp, self._depth, self.port
        ib = index_bits(depth)
        qs = [Signal(qstate_layout(depth), name=f"qs{i}") for i in range(nq)]
        m.submodules.mem = sq = memory.Memory(shape=SqEntry, depth=nq << ib, init=[])
        for i in range(nq):
            rts, err = qs[i].st == QSt.RTS, qs[i].st == QSt.ERR
            m.d.comb += [self.qp_error[i].eq(err), self.rts[i].eq(rts),
                         self.status.timing[i].eq(qs[i].timer_on & rts),
                         self.status.flush[i].eq(err & (qs[i].head != qs[i].tail)),
                         self.status.can_send[i].eq(rts & ~qs[i].rnr_wait &
                                                    (qs[i].txp != qs[i].tail))]

        # ---- the selected QP: its record, its head / txp entries ------------------------------
        cur = p.cur
        with m.Switch(p.sel):
            for i in range(nq):
                with m.Case(i):
                    m.d.comb += cur.eq(qs[i])
        for ptr, entry in ((cur.head, p.head), (cur.txp, p.txp)):
            port = sq.read_port(domain="comb")
            m.d.comb += [port.addr.eq(Cat(ptr[:ib], p.sel)), entry.eq(port.data)]
        m.d.comb += p.full.eq((cur.tail - cur.head)[:ib + 1] == depth)

        # ---- push: the work request goes in at the tail with its PSNs ---------------------------
        wl = p.push_wr.length
        pmtu_bytes = Signal(13)
        npk = Signal(24)
        m.d.comb += [pmtu_bytes.eq(Const(1, 13) << p.pmtu_log2),
                     npk.eq(Mux(wl == 0, 1, (wl + pmtu_bytes - 1) >> p.pmtu_log2))]
        wp = sq.write_port()
        m.d.comb += [wp.addr.eq(Cat(cur.tail[:ib], p.sel)), wp.en.eq(p.push),
                     wp.data.first_psn.eq(cur.alloc_psn), wp.data.npkts.eq(npk)]
        for name in _WR_FIELDS:
            m.d.comb += getattr(wp.data, name).eq(getattr(p.push_wr, name))

        # ---- write-back of the selected QP's record (load strobes below override it) ----------
        wb = Signal(qstate_layout(depth))
        m.d.comb += wb.eq(p.nxt)
        with m.If(p.push):
            m.d.comb += [wb.tail.eq(cur.tail + 1), wb.alloc_psn.eq(cur.alloc_psn + npk)]
        with m.If(p.commit | p.push):
            with m.Switch(p.sel):
                for i in range(nq):
                    with m.Case(i):
                        m.d.sync += qs[i].eq(wb)

        # ---- host loads a QP state ---------------------------------------------------------------
        c = self.load_row
        for i in range(nq):
            with m.If(self.load_valid & (self.load_qp == i)):
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


def pick_port(n_qp):
    """The control FSM's port on :class:`SqScheduler`, seen from the FSM (Out: driven by it)."""
    qb = qp_bits(n_qp)
    return wiring.Signature({
        "exp_any": In(1), "exp_qp": In(qb),         # a QP's timer expired (lowest QP)
        "flush_any": In(1), "flush_qp": In(qb),     # a QP in error has entries (lowest QP)
        "send_any": In(1), "send_qp": In(qb),       # a QP can send (round robin)
        "prefer_wr": In(1),                         # a packet went last: a new WR's turn
        "sent": Out(1),                             # the FSM takes a packet of send_qp
        "wr_turn": Out(1),                          # the FSM looks at a new WR
    })


class SqScheduler(wiring.Component):
    """Candidates for the idle control FSM (see the module docstring).

    Ports
    -----
    status : In(:func:`sq_status`), zero : In(n_qp)   timer i is 0
    ctl : In(:func:`pick_port`)
    """

    def __init__(self, n_qp):
        self._n_qp = n_qp
        super().__init__({"status": In(sq_status(n_qp)), "zero": In(n_qp),
                          "ctl": In(pick_port(n_qp))})

    def elaborate(self, platform):
        m = Module()
        nq, c, st = self._n_qp, self.ctl, self.status
        expired = Signal(nq)
        m.d.comb += expired.eq(st.timing & self.zero)
        for i in reversed(range(nq)):
            with m.If(expired[i]):
                m.d.comb += [c.exp_any.eq(1), c.exp_qp.eq(i)]
            with m.If(st.flush[i]):
                m.d.comb += [c.flush_any.eq(1), c.flush_qp.eq(i)]
        rr = Signal(qp_bits(nq))
        for off in reversed(range(1, nq + 1)):
            idx = Signal(qp_bits(nq), name=f"scand{off}")
            m.d.comb += idx.eq((rr + off) % nq)
            with m.Switch(idx):
                for i in range(nq):
                    with m.Case(i):
                        with m.If(st.can_send[i]):
                            m.d.comb += [c.send_any.eq(1), c.send_qp.eq(i)]
        prefer_wr = Signal()
        m.d.comb += c.prefer_wr.eq(prefer_wr)
        with m.If(c.sent):
            m.d.sync += [rr.eq(c.send_qp), prefer_wr.eq(1)]
        with m.If(c.wr_turn):
            m.d.sync += prefer_wr.eq(0)
        return m

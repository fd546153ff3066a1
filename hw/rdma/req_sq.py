# Ref: docs/roce-layouts.md §6.1 (24-bit PSN arithmetic), §6.3 (PSNs consumed: a READ takes the
#      PSNs of its responses); hw/iface.py (QpConfig, QpState, WorkRequest).
"""The requester's send queues and the choice of the QP its control FSM serves next.

:class:`SendQueues` owns every per-QP record of the requester (queue pointers, PSN counters,
retry counters, timer and error state) and the send-queue memory. Its client, the control FSM
(:class:`~hw.rdma.req_control.RequesterControl`), addresses one QP (``sel``) and holds it for a
step: the record (``cur``) is the one at the ``sel`` of the previous cycle, the entries at its
``head`` and ``txp`` pointers (``head``, ``txp``) arrive a cycle after the record. The FSM may
write the record back (``commit``, ``nxt``) or append a work request (``push``). PSNs are
assigned here, at the push (``first_psn = alloc_psn``, ``alloc_psn += npkts``; the rules are
in :mod:`hw.rdma.requester`).

Records in a memory
-------------------
A record is split. Its 94 bits of pointers, PSN counters, retry counters and ``err_code``
(:func:`record_layout`) are one row per QP of a memory with one write port and a registered
read port at ``sel``, transparent to the write port: a write-back in cycle t is what a read in
cycle t or later returns. The bits the scheduler must see for every QP at once stay in
flip-flops, 7 per QP: ``st`` (2), ``rnr_wait``, ``timer_on``, ``unsent`` (``txp != tail``),
``nonempty`` (``head != tail``) and ``host_err`` (the host moved the QP to ERROR: its
``err_code`` reads FLUSHED); the write-back and every host load keep them exact. ``cur`` shows
the memory row with the flip-flop bits of QP ``sel`` as they are in this cycle.

Why: in flip-flops the records were read through an n_qp:1 multiplexer of ~98 bits and written
through a per-QP decode, and the send queue had two combinational read ports (LUT RAM, one copy
each, read through 32:1 multiplexers of 291 bits at 64 QPs). In synth_ecp5 of the Requester
alone at 64 QPs (hierarchy kept) this block took 41.5k LUT4, 6,272 flip-flops and 4,672
TRELLIS_DPR16X4, and the scheduler's priority chains 19.5k LUT4, of 68.5k for the requester:
LUT4 is what the ECP5 runs out of. With the records and entries in memories with registered
reads this block is 3.1k LUT4 and 21 DP16KD, the scheduler 0.6k, the requester 10.3k (flattened:
10,301 LUT4, 17 DP16KD). At 4 QPs the requester goes from 5,059 to 3,200 LUT4.

Send-queue entries
------------------
The send queue is one memory of n_qp x depth entries (entry k of QP i at ``(i << ib) | k``),
one write port (the push) and two registered read ports: the head and txp entries of QP
``sel``. Their addresses come from the record as it will be after this cycle's write-back
(``nxt.head`` / ``nxt.txp`` when the FSM writes, else ``cur``'s), so after a select the
entries follow the record one cycle behind it, and from then on every cycle, also right after
the FSM's own write-back (an ACK completes one message per cycle). A push writes the entry at
``tail``, which no read port addresses before the next step; they need no transparency.

Timing seen by the FSM: select QP q in cycle t (``sel = q``, held from then on); ``cur`` is
q's record in t+1, ``head`` / ``txp`` its entries in t+2 and later.

Only the record's read address follows ``sel`` in its own cycle. Everything else of the step
(the flip-flop bits in ``cur``, the write-back and push addresses, the entries' read
addresses) follows ``sel`` as it was in the previous cycle: the FSM holds ``sel`` from the
select on and neither commits nor pushes in a select cycle, so that is the same QP. The FSM's
choice of a QP (registered candidates and response flags through a priority and a multiplexer)
then no longer runs through the n_qp:1 selects of the flip-flop bits into the act logic and
the write-back in one cycle (18 LUT levels in the ECPIX-5 netlist of 89ac31b, the core clock's
deepest group by count).

Host loads
----------
A host load of a QP's state (QpTable's load event: ``load_valid``, ``load_qp``, the row in
``load_row``) wins over the FSM: RTS (from a state other than RTS) and any state other than
ERROR rewrite the whole row through the write port; ERROR changes only flip-flop bits (``st``,
``timer_on``, ``rnr_wait``, ``host_err``) and keeps the pointers for the flush. ``busy`` is
high in the cycle of the load event: the FSM neither commits nor pushes then (the load has
the write port; in the flip-flops the load's bits win), and from the next cycle on ``cur`` is
the loaded record (the read port is transparent). The entries it sees in that next cycle were
addressed from the record before the load; a rewritten record is empty with its timer off, and
no step uses an entry of an empty queue.

:class:`SqScheduler` picks the QP for the idle FSM from the status vectors of
:class:`SendQueues` and the retry timers: the lowest QP whose timer expired, the lowest QP in
error with entries left to flush, and the next QP round robin with a packet to send; it also
keeps the turn between new work requests and packets (``prefer_wr``). Each choice is a tree of
depth log2(n_qp) (:func:`hw.lib.priority.lowest_set`), not a chain of n_qp priority multiplexers.
"""

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, memory, wiring
from amaranth.lib.wiring import In, Out

from hw.iface import ADDR_BITS, QP_INDEX_BITS, QpConfig, QpState, WcStatus, WorkRequest, WrOp
from hw.lib.priority import lowest_set

__all__ = ["SqEntry", "QSt", "qstate_layout", "record_layout", "qp_bits", "index_bits",
           "sq_port", "sq_status", "SendQueues", "pick_port", "SqScheduler"]

#: One send-queue entry: the work request (without its QP) plus its PSN range.
SqEntry = data.StructLayout({
    "wr_id": 16, "op": WrOp, "rkey": 32, "va": 64, "length": 32, "laddr": ADDR_BITS,
    "imm": 32, "inv_rkey": 32,
    "first_psn": 24, "npkts": 24,
})

#: The fields a push copies from the work request.
_WR_FIELDS = ("wr_id", "op", "rkey", "va", "length", "laddr", "imm", "inv_rkey")

#: The fields of the record kept in flip-flops, not in the record memory.
_FF_FIELDS = ("st", "rnr_wait", "timer_on")


class QSt:
    """Requester-side QP states (not the host's QpState)."""
    OFF, RTS, ERR = 0, 1, 2


def qstate_layout(depth):
    """The per-QP record as the FSM sees it. Pointers count modulo 2 * depth (full and empty
    differ)."""
    ptr = range(2 * depth)
    return data.StructLayout({
        "st": 2, "head": ptr, "txp": ptr, "tail": ptr,
        "tx_pkt": 24, "head_done": 24, "alloc_psn": 24,
        "retry_left": 3, "rnr_left": 3, "rnr_wait": 1, "timer_on": 1,
        "err_code": WcStatus,
    })


def record_layout(depth):
    """The part of :func:`qstate_layout` in the record memory (all but ``st``, ``rnr_wait``,
    ``timer_on``): 94 bits at depth 8."""
    return data.StructLayout({name: f.shape for name, f in qstate_layout(depth)
                              if name not in _FF_FIELDS})


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
        "sel": Out(qp_bits(n_qp)),          # the QP addressed this cycle (held for a step)
        "cur": In(qstate),                  # its record: the row read at the previous `sel`
        "head": In(SqEntry), "txp": In(SqEntry),    # its entries: a cycle after `cur`
        "full": In(1),                      # of `cur`
        "busy": In(1),                      # a host load: neither commit nor push
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
        rlay = record_layout(depth)

        # ---- flip-flop bits of every QP --------------------------------------------------------
        st = [Signal(2, name=f"st{i}") for i in range(nq)]
        rnr_wait, timer_on, unsent, nonempty, host_err = (
            Signal(nq, name=n) for n in ("rnr_wait", "timer_on", "unsent", "nonempty",
                                         "host_err"))
        for i in range(nq):
            rts, err = st[i] == QSt.RTS, st[i] == QSt.ERR
            m.d.comb += [self.qp_error[i].eq(err), self.rts[i].eq(rts),
                         self.status.timing[i].eq(timer_on[i] & rts),
                         self.status.flush[i].eq(err & nonempty[i]),
                         self.status.can_send[i].eq(rts & ~rnr_wait[i] & unsent[i])]

        # ---- the selected QP: its record (memory row + flip-flop bits) --------------------------
        m.submodules.recs = recs = memory.Memory(shape=rlay, depth=nq, init=[])
        rwp = recs.write_port()
        rrd = recs.read_port(transparent_for=(rwp,))
        m.d.comb += rrd.addr.eq(p.sel)
        asel = Signal.like(p.sel)       # the step's QP: `sel` of the previous cycle (see above)
        m.d.sync += asel.eq(p.sel)
        cur = p.cur
        for name, _ in rlay:
            m.d.comb += getattr(cur, name).eq(getattr(rrd.data, name))
        sel_st = Signal(2)
        with m.Switch(asel):
            for i in range(nq):
                with m.Case(i):
                    m.d.comb += sel_st.eq(st[i])
        m.d.comb += [cur.st.eq(sel_st), cur.rnr_wait.eq(rnr_wait.bit_select(asel, 1)),
                     cur.timer_on.eq(timer_on.bit_select(asel, 1))]
        with m.If(host_err.bit_select(asel, 1)):
            m.d.comb += cur.err_code.eq(WcStatus.FLUSHED)
        m.d.comb += p.full.eq((cur.tail - cur.head)[:ib + 1] == depth)

        # ---- push: the work request goes in at the tail with its PSNs ---------------------------
        m.submodules.mem = sq = memory.Memory(shape=SqEntry, depth=nq << ib, init=[])
        wl = p.push_wr.length
        pmtu_bytes = Signal(13)
        npk = Signal(24)
        m.d.comb += [pmtu_bytes.eq(Const(1, 13) << p.pmtu_log2),
                     npk.eq(Mux(wl == 0, 1, (wl + pmtu_bytes - 1) >> p.pmtu_log2))]
        push = Signal()
        m.d.comb += push.eq(p.push & ~p.busy)
        wp = sq.write_port()
        m.d.comb += [wp.addr.eq(Cat(cur.tail[:ib], asel)), wp.en.eq(push),
                     wp.data.first_psn.eq(cur.alloc_psn), wp.data.npkts.eq(npk)]
        for name in _WR_FIELDS:
            m.d.comb += getattr(wp.data, name).eq(getattr(p.push_wr, name))

        # ---- write-back of the selected QP's record --------------------------------------------
        wb = Signal(qstate_layout(depth))
        write = Signal()
        m.d.comb += [wb.eq(p.nxt), write.eq((p.commit | p.push) & ~p.busy)]
        with m.If(push):
            m.d.comb += [wb.tail.eq(cur.tail + 1), wb.alloc_psn.eq(cur.alloc_psn + npk)]
        m.d.comb += [rwp.en.eq(write), rwp.addr.eq(asel)]
        for name, _ in rlay:
            m.d.comb += getattr(rwp.data, name).eq(getattr(wb, name))
        for i in range(nq):
            with m.If(write & (asel == i)):
                m.d.sync += [st[i].eq(wb.st), rnr_wait[i].eq(wb.rnr_wait),
                             timer_on[i].eq(wb.timer_on),
                             unsent[i].eq(wb.txp != wb.tail), nonempty[i].eq(wb.head != wb.tail)]

        # The entries of the record as it is after this cycle.
        for ptr, nptr, entry in ((cur.head, wb.head, p.head), (cur.txp, wb.txp, p.txp)):
            port = sq.read_port()
            m.d.comb += [port.addr.eq(Cat(Mux(write, nptr, ptr)[:ib], asel)),
                         entry.eq(port.data)]

        # ---- host loads a QP state (after the write-back: the load wins) -------------------------
        c = self.load_row
        m.d.comb += p.busy.eq(self.load_valid)
        was_rts = Signal()
        with m.Switch(self.load_qp):
            for i in range(nq):
                with m.Case(i):
                    m.d.comb += was_rts.eq(st[i] == QSt.RTS)
        is_rts, is_err = c.state == QpState.RTS, c.state == QpState.ERROR
        rewrite = Signal()              # the whole record: RTS from another state, or stopped
        m.d.comb += rewrite.eq(self.load_valid & (self.load_qp < nq) &
                               Mux(is_rts, ~was_rts, ~is_err))
        with m.If(rewrite):
            m.d.comb += [rwp.en.eq(1), rwp.addr.eq(self.load_qp), rwp.data.eq(0)]
            with m.If(is_rts):
                m.d.comb += [rwp.data.alloc_psn.eq(c.sq_psn), rwp.data.retry_left.eq(c.retry_cnt),
                             rwp.data.rnr_left.eq(c.rnr_retry)]
        for i in range(nq):
            with m.If(self.load_valid & (self.load_qp == i)):
                with m.If(rewrite):
                    m.d.sync += [st[i].eq(Mux(is_rts, QSt.RTS, QSt.OFF)), rnr_wait[i].eq(0),
                                 timer_on[i].eq(0), unsent[i].eq(0), nonempty[i].eq(0),
                                 host_err[i].eq(0)]
                with m.Elif(is_err):
                    m.d.sync += [st[i].eq(QSt.ERR), timer_on[i].eq(0), rnr_wait[i].eq(0),
                                 host_err[i].eq(1)]
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

    Round robin: the lowest QP above the last one sent (``sent``) that can send, else the
    lowest that can send (the last one sent comes last).

    Every candidate is registered: it shows the status and ``zero`` of the cycle before.

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
        exp_any, exp_qp = lowest_set(m, expired, "exp")
        flush_any, flush_qp = lowest_set(m, st.flush, "flush")
        rr = Signal(qp_bits(nq))
        above = Signal(nq)                      # QPs after the last one sent
        m.d.comb += above.eq(Cat(*[rr < i for i in range(nq)]))
        after_any, after_qp = lowest_set(m, st.can_send & above, "after")
        first_any, first_qp = lowest_set(m, st.can_send, "first")
        # The candidates from flops: the trees above end here, so a pick's QP reaches the
        # record and table addresses from a register. Combinational, the round robin's tree
        # ran on into the send queues' records in one cycle (25.7 ns, the core clock's
        # critical path on ECPIX-5 in trial ck3). They are a cycle old: the control FSM uses
        # them only in its second idle cycle in a row (``RequesterControl``), when nothing of
        # its own has changed since they were taken.
        m.d.sync += [c.exp_any.eq(exp_any), c.exp_qp.eq(exp_qp),
                     c.flush_any.eq(flush_any), c.flush_qp.eq(flush_qp),
                     c.send_any.eq(first_any), c.send_qp.eq(Mux(after_any, after_qp, first_qp))]
        prefer_wr = Signal()
        m.d.comb += c.prefer_wr.eq(prefer_wr)
        with m.If(c.sent):
            m.d.sync += [rr.eq(c.send_qp), prefer_wr.eq(1)]
        with m.If(c.wr_turn):
            m.d.sync += prefer_wr.eq(0)
        return m

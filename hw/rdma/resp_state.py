# Ref: roce-layouts.md §6.2 (ePSN from the QP's RQ PSN), §6.6 (duplicate READ/atomic: the
#      replay cache, rxe ``find_resource``); hw/iface.py (QpConfig, RecvRepost); hw/rdma/qp.py
#      (QpTable's load event).
"""Per-QP state of the RC responder, kept in memories between packets.

:class:`QpContextStore` owns the QP contexts (:data:`~hw.rdma.resp_common.QpCtx`: ePSN, MSN,
message state, receive-buffer and WRITE cursors), their reset when the host rewrites a QP, and
the receive-buffer credits. :class:`ReplayCache` owns the READ/atomic replay cache and the
resolution of a duplicate READ/atomic request against it (replay, cached answer or drop).

Both are memories with one write port and one registered read port, so that at 64 QPs they
map to block RAM (ECP5 DP16KD) rather than to LUT RAM with n_qp-to-1 multiplexers after it (and
before that, n_qp x (185 + K x 178) flip-flops: as registers they were the most congested logic
of the ECPIX-5 build). The read ports are transparent to the write port, so a read in the cycle
of a write returns the written value, as a flip-flop would the cycle after. Neither adds a cycle
to a packet: the context is read at the QP index of the header register while RespAdmit checks
the header (LOOKUP), and a replay-cache search presents entry k + 1 while it compares entry k.
"""

from amaranth import Cat, Module, Mux, Signal
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.iface import QP_INDEX_BITS, QpConfig, RecvRepost
from hw.lib.priority import lowest_set
from hw.rdma.resp_common import CacheEntry, QpCtx, SeqCtx

__all__ = ["QpContextStore", "ReplayCache", "CacheCtl"]


class QpContextStore(wiring.Component):
    """QP contexts and receive-buffer credits.

    A load event (QpTable: the host wrote QP ``load_qp``'s state; ``load_row`` is its row)
    resets the context (all zero but ePSN = the row's ``rq_psn`` and ``nak_armed``) through the
    memory's one write port: it waits for a cycle without a commit; ``busy`` is high while QP
    ``qi``'s reset waits.

    Receive-buffer credits: a load sets QP i's count to the row's ``recv_count``, a repost
    (``repost.p.qp``) adds one, a consume (at ``qi``) takes one, all modulo 2**9; a load wins
    over a repost or consume of the same QP in its cycle (they are not counted), a repost and a
    consume of one QP in one cycle cancel. ``credits`` shows QP ``qi``'s count of the cycle
    (the events of the cycle count from the next one); an index outside the table counts
    nothing and shows 0. The count is not kept but computed as ``base + reposted - consumed``
    (mod 2**9) from three 9-bit x n_qp memories with combinational read ports (LUT RAM, ECP5
    TRELLIS_DPR16X4), each with one write port and one writer: the repost event
    read-modify-writes ``reposted`` at its QP, the consume event ``consumed`` at ``qi``, and
    the load writes ``base := recv_count - reposted + consumed``, from those two memories read
    at ``load_qp``. A load thus leaves ``reposted`` and ``consumed`` as they are, and the sum is
    ``recv_count`` from the next cycle on, whatever their values; the same-QP repost or consume
    of the load's cycle is disabled (not written), which keeps those values the ones the load
    read. At 64 QPs this replaced 64 flip-flop counters (576 flip-flops, an adder per QP and a
    64:1 multiplexer) by 6 LUT RAM read ports (72 TRELLIS_DPR16X4), two incrementers and four
    9-bit adders (QpContextStore(64) synthesised: 2631 -> 1128 LUT4, 320 -> 20 CCU2C).
    Chosen over ``live`` flip-flops per QP that would mark ``reposted``/``consumed`` stale
    after a load (4 read ports, but 2 x n_qp flip-flops, their per-QP set/clear logic and
    three 64:1 bit multiplexers): that variant synthesised to 348 more LUT4 and 128 more
    flip-flops for 28 fewer TRELLIS_DPR16X4. Like the QP table and the context memory, the
    credit memories are not reset with the clock domain: after a reset a QP keeps its count
    until its next load (the flip-flop counters read 0).

    The ``rq_psn`` of a load is captured in a small memory (LUT RAM, written by the event, read
    combinationally when the reset is served) rather than read from the QP table then: several
    resets may wait behind commits, and the capture serves one in the cycle it is chosen, with
    no second read port on the QP table (and its extra cycle) and no n_qp x 24 flip-flops.

    The context memory has a registered read port: ``ctx`` shows, in cycle t + 1, QP
    ``rqi``'s context as of the end of cycle t (a write in cycle t included). The responder
    holds ``rqi`` at the packet's QP from its LOOKUP cycle on, and takes ``ctx`` at ``start``
    (CTX, one cycle or more later; ``busy`` then covers a reset written in the cycle before).

    Ports
    -----
    load_valid : In(1), load_qp : In(QP_INDEX_BITS), load_row : In(QpConfig)
    repost : In(stream of RecvRepost)     always ready
    rqi : In(QP_INDEX_BITS)               the QP whose context ``ctx`` shows the next cycle
    qi : In(QP_INDEX_BITS)                the QP that ``busy``, ``credits`` show, ``commit`` writes
    ctx : Out(QpCtx), busy : Out(1), credits : Out(9)
    consume : In(1)                       QP ``qi`` takes one receive buffer
    commit : In(1), wdata : In(QpCtx)     write QP ``qi``'s context
    """

    def __init__(self, n_qp):
        self.n_qp = n_qp
        super().__init__({
            "load_valid": In(1), "load_qp": In(QP_INDEX_BITS), "load_row": In(QpConfig),
            "repost": In(stream.Signature(RecvRepost)),
            "rqi": In(QP_INDEX_BITS), "qi": In(QP_INDEX_BITS),
            "ctx": Out(QpCtx), "busy": Out(1), "credits": Out(9),
            "consume": In(1),
            "commit": In(1), "wdata": In(QpCtx),
        })

    def elaborate(self, platform):
        m = Module()
        nq, qi = self.n_qp, self.qi
        m.submodules.mem = mem = memory.Memory(shape=QpCtx, depth=nq, init=[])
        reload = Signal(nq)
        load = Signal(nq)                   # one-hot of the load event
        m.d.comb += load.eq(self.load_valid << self.load_qp)
        m.submodules.epsn = epsn_mem = memory.Memory(shape=24, depth=nq, init=[])
        ewp = epsn_mem.write_port()
        m.d.comb += [ewp.en.eq(self.load_valid), ewp.addr.eq(self.load_qp),
                     ewp.data.eq(self.load_row.rq_psn)]

        # Credits: base + reposted - consumed (mod 2**9), each term in its own LUT RAM with
        # its one writer (see the class docstring).
        rq, lq = self.repost.p.qp, self.load_qp
        m.d.comb += self.repost.ready.eq(1)
        m.submodules.cbase = cbase = memory.Memory(shape=9, depth=nq, init=[])
        m.submodules.crepost = crepost = memory.Memory(shape=9, depth=nq, init=[])
        m.submodules.cconsume = cconsume = memory.Memory(shape=9, depth=nq, init=[])
        base_qi = cbase.read_port(domain="comb")
        rep_qi, rep_rq, rep_lq = (crepost.read_port(domain="comb") for _ in range(3))
        con_qi, con_lq = (cconsume.read_port(domain="comb") for _ in range(2))
        m.d.comb += [base_qi.addr.eq(qi), rep_qi.addr.eq(qi), rep_rq.addr.eq(rq),
                     rep_lq.addr.eq(lq), con_qi.addr.eq(qi), con_lq.addr.eq(lq)]
        if nq < 1 << QP_INDEX_BITS:         # an index outside the table counts nothing
            in_qi, in_rq, in_lq = qi < nq, rq < nq, lq < nq
        else:
            in_qi = in_rq = in_lq = 1
        bw, rw, cw = cbase.write_port(), crepost.write_port(), cconsume.write_port()
        m.d.comb += [
            bw.en.eq(self.load_valid & in_lq), bw.addr.eq(lq),
            bw.data.eq(self.load_row.recv_count - rep_lq.data + con_lq.data),
            # A load of the same QP in the same cycle wins: the event is not counted.
            rw.en.eq(self.repost.valid & in_rq & ~(self.load_valid & (lq == rq))),
            rw.addr.eq(rq), rw.data.eq(rep_rq.data + 1),
            cw.en.eq(self.consume & in_qi & ~(self.load_valid & (lq == qi))),
            cw.addr.eq(qi), cw.data.eq(con_qi.data + 1),
        ]
        credits = Signal(9)
        m.d.comb += credits.eq(base_qi.data + rep_qi.data - con_qi.data)

        wp = mem.write_port()
        # The reset to serve next (the lowest waiting QP) is picked a cycle ahead, into flops,
        # from the waiting set as it will be: combinational, the n_qp priority chain ran
        # through the ePSN read and the initial context into the write port (18 LUT levels in
        # the ECPIX-5 netlist of 89ac31b).
        reload_any = Signal()
        reload_i = Signal(range(nq))
        reload_next = Signal(nq)
        done_reload = Signal(nq)
        m.d.comb += reload_next.eq((reload & ~done_reload) | load)
        next_any, next_i = lowest_set(m, reload_next, "reload")
        m.d.sync += [reload.eq(reload_next), reload_any.eq(next_any), reload_i.eq(next_i)]
        init_epsn = Signal(24)
        erp = epsn_mem.read_port(domain="comb")
        m.d.comb += [erp.addr.eq(reload_i), init_epsn.eq(erp.data)]
        # Built as one value (a partly assigned comb Signal leaves the other bits undriven in
        # Icarus/Verilator).
        init_ctx = QpCtx.const({"seq": {"nak_armed": 1}}).as_value() | \
            (init_epsn << (QpCtx["seq"].offset + SeqCtx["epsn"].offset))
        with m.If(self.commit):
            m.d.comb += [wp.en.eq(1), wp.addr.eq(qi), wp.data.eq(self.wdata)]
        with m.Elif(reload_any):
            m.d.comb += [wp.en.eq(1), wp.addr.eq(reload_i), wp.data.eq(init_ctx),
                         done_reload.eq(1 << reload_i)]

        rp = mem.read_port(domain="sync", transparent_for=(wp,))
        m.d.comb += [rp.addr.eq(self.rqi), self.ctx.eq(rp.data),
                     self.busy.eq(reload.bit_select(qi, 1))]
        m.d.comb += self.credits.eq(Mux(in_qi, credits, 0))
        return m


#: Replay-cache control, seen from the sequencer.
CacheCtl = wiring.Signature({
    "we": Out(1), "wdata": Out(CacheEntry),     # write entry ``ptr`` of QP ``qi``
    "start": Out(1),                            # resolve the duplicate request in hand
    # Strobes, one of them once per search:
    "drop": In(1),                              # not in the cache, or not consistent with it
    "atomic": In(1), "orig": In(64),            # an atomic: answer with this original value
    "replay": In(1),                            # a READ: answer it again from its own PSN
})


class ReplayCache(wiring.Component):
    """READ/atomic replay cache, ``depth`` entries per QP, and the duplicate resolution.

    Entry valid bits are registers (a load clears a QP's entries at once). The entries are in
    a memory with a registered read port, addressed by ``qi`` and a search index ``k`` that is
    0 between searches: a search compares entry ``kd`` while entry ``k = kd + 1`` is read, so
    it still looks at one entry per cycle, lowest index first, and the first match is the
    answer (``qi`` must be stable for a cycle before ``start``; it is, from the packet's CTX
    cycle on): an atomic entry
    matches an atomic at its PSN, a READ entry a READ whose PSN is in ``psn .. psn + npsn - 1``.
    The next cycle checks the match: an atomic is answered with the cached original value; a
    READ is replayed only with the original's R_Key and with VA and length consistent with the
    original at that PSN (rxe ``duplicate_request``); anything else is dropped.

    Ports
    -----
    load : In(n_qp)
    qi : In(QP_INDEX_BITS), ptr : In(4)      the QP and its entry to write
    psn : In(24), read : In(1), atomic : In(1)   the duplicate request
    rkey : In(32), va : In(64), length : In(32), pmtu_log2 : In(4)   its RETH, the QP's PMTU
    ctl : In(CacheCtl)
    """

    def __init__(self, n_qp, depth):
        self.n_qp, self.depth = n_qp, depth
        super().__init__({
            "load": In(n_qp), "qi": In(QP_INDEX_BITS), "ptr": In(4),
            "psn": In(24), "read": In(1), "atomic": In(1),
            "rkey": In(32), "va": In(64), "length": In(32), "pmtu_log2": In(4),
            "ctl": In(CacheCtl),
        })

    def elaborate(self, platform):
        m = Module()
        nq, K, qi, ctl = self.n_qp, self.depth, self.qi, self.ctl
        kb = max(1, (K - 1).bit_length())
        m.submodules.mem = mem = memory.Memory(shape=CacheEntry, depth=nq << kb, init=[])
        cvalid = [Signal(K, name=f"cvalid{i}") for i in range(nq)]
        for i in range(nq):
            with m.If(self.load[i]):
                m.d.sync += cvalid[i].eq(0)
            with m.Elif(ctl.we & (qi == i)):
                m.d.sync += cvalid[i].eq(cvalid[i] | (1 << self.ptr))

        wp = mem.write_port()
        m.d.comb += [wp.en.eq(ctl.we), wp.addr.eq(Cat(self.ptr[:kb], qi)), wp.data.eq(ctl.wdata)]

        cur_cvalid = Signal(K)
        with m.Switch(qi):
            for i in range(nq):
                with m.Case(i):
                    m.d.comb += cur_cvalid.eq(cvalid[i])
        k = Signal(kb)                      # entry being read (0 between searches)
        kd = Signal(kb)                     # entry being compared (read in the cycle before)
        rp = mem.read_port(domain="sync")   # no read meets a write: writes come with new requests
        c = Signal(CacheEntry)
        m.d.comb += [rp.addr.eq(Cat(k, qi)), c.eq(rp.data),
                     c.valid.eq(cur_cvalid.bit_select(kd, 1))]
        k_next = k + 1 if K > 1 else k
        dk = Signal(24)
        m.d.comb += dk.eq(self.psn - c.psn)
        found = c.valid & Mux(c.atomic, self.atomic & (dk == 0), self.read & (dk < c.npsn))

        dup = Signal(CacheEntry)            # the matching entry
        dup_k = Signal(24)                  # PSN - its PSN
        off = Signal(64)                    # octets of the READ before this PSN
        m.d.comb += [off.eq(dup_k << self.pmtu_log2), ctl.orig.eq(dup.va)]
        with m.FSM():
            with m.State("IDLE"):               # entry 0 of QP qi is being read
                with m.If(ctl.start):
                    m.d.sync += [kd.eq(0), k.eq(k_next)]
                    m.next = "SEARCH"
            with m.State("SEARCH"):
                with m.If(found):
                    m.d.sync += [dup.eq(c), dup_k.eq(dk), k.eq(0)]
                    m.next = "CHECK"
                with m.Elif(kd == K - 1):
                    m.d.comb += ctl.drop.eq(1)
                    m.d.sync += k.eq(0)
                    m.next = "IDLE"
                with m.Else():
                    m.d.sync += [kd.eq(k), k.eq(k_next)]
            with m.State("CHECK"):
                with m.If(dup.atomic):
                    m.d.comb += ctl.atomic.eq(1)
                with m.Elif((self.rkey == dup.rkey) & (self.va == dup.va + off) &
                            (self.length == dup.length - off)):
                    m.d.comb += ctl.replay.eq(1)
                with m.Else():
                    m.d.comb += ctl.drop.eq(1)
                m.next = "IDLE"
        return m

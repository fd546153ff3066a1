# Ref: roce-layouts.md §6.1-§6.6 (PSN arithmetic, ePSN, MSN, ACK/NAK rules and syndromes,
#      duplicates), §4.1 (RETH), §4.2 (AETH), §4.4 (AtomicAckETH).
"""Sequencer of the RC responder: what an admitted packet does to its QP, and the answer.

:class:`RespSequencer` owns the sequencing part of the QP context
(:data:`~hw.rdma.resp_common.SeqCtx`: ePSN, MSN, NAK arming, the error mark, the ACK
coalescing count, the replay-cache pointer), the PSN check (execute / duplicate / ahead), the
MR lookup, the fatal NAKs (``qp_error``) and the choice of every answer (ACK coalescing, NAK
syndromes, MSNs). It has the answers sent by the :class:`~hw.rdma.resp_tx.ResponseGen`
(READ responses too), hands SEND/WRITE payload to the
:class:`~hw.rdma.resp_place.PayloadPlacer`, atomics to the
:class:`~hw.rdma.resp_atomic.AtomicUnit` and duplicate READ/atomic requests to the
:class:`~hw.rdma.resp_state.ReplayCache`, and writes the context back (``commit``) when the
packet is finished.
"""

from functools import partial

from amaranth import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.headers import AethSyndrome, BthOpcode
from hw.iface import ADDR_BITS, QP_INDEX_BITS
from hw.rdma.resp_admit import AdmitCtl
from hw.rdma.resp_atomic import AtomicCtl
from hw.rdma.resp_common import Counts, ReqKind, SeqCtx
from hw.rdma.resp_place import PlaceCtl
from hw.rdma.resp_state import CacheCtl
from hw.rdma.resp_tx import TxCtl
from hw.rdma.roce_hdr import RoceRxHeader

__all__ = ["RespSequencer"]

O = BthOpcode
S = AethSyndrome


class RespSequencer(wiring.Component):
    """Per-packet decisions of the responder (see the module docstring).

    Ports
    -----
    h : In(RoceRxHeader), kind : In(ReqKind), qi : In(QP_INDEX_BITS)   the packet in hand
    seq_bad, len_bad : In(1)        from RequestDecoder
    credits : In(9)                 receive buffers of QP ``qi``
    backlog : In(1)                 the MAC's receive buffer is half full: refuse new messages
    admit : In(AdmitCtl)
    ctx_in : In(SeqCtx)             QP ``qi``'s stored context (loaded on ``admit.start``)
    ctx : Out(SeqCtx), commit : Out(1)   working context; write it back now
    mr_ok : In(1), mr_laddr : In(ADDR_BITS)   the MR lookup's answer (asked in MR_ASK)
    out : Out(TxCtl), place : Out(PlaceCtl), cache : Out(CacheCtl), atomic : Out(AtomicCtl)
    qp_error : Out(1), qp_error_index : Out(QP_INDEX_BITS)
    inc : Out(Counts)
    """

    def __init__(self, *, cache_depth, ack_every, rnr_timer):
        self.cache_depth, self.ack_every, self.rnr_timer = cache_depth, ack_every, rnr_timer
        super().__init__({
            "h": In(RoceRxHeader), "kind": In(ReqKind), "qi": In(QP_INDEX_BITS),
            "seq_bad": In(1), "len_bad": In(1), "credits": In(9), "backlog": In(1),
            "admit": In(AdmitCtl),
            "ctx_in": In(SeqCtx), "ctx": Out(SeqCtx), "commit": Out(1),
            "mr_ok": In(1), "mr_laddr": In(ADDR_BITS),
            "out": Out(TxCtl), "place": Out(PlaceCtl), "cache": Out(CacheCtl),
            "atomic": Out(AtomicCtl),
            "qp_error": Out(1), "qp_error_index": Out(QP_INDEX_BITS),
            "inc": Out(Counts),
        })

    # Actions of the states (statements added to ``m`` under the current condition).

    def _count(self, m, *names):
        m.d.comb += [self.inc[name].eq(1) for name in names]

    def _answer(self, m, *counters, **fields):
        """Stage an answer (the default values of :meth:`elaborate` but ``fields``), count it,
        send it next (EMIT)."""
        m.d.comb += [self.out.stage.eq(1),
                     *(getattr(self.out, f).eq(v) for f, v in fields.items())]
        self._count(m, *counters)
        m.next = "EMIT"

    def _fatal(self, m, syndrome, *counters, placer=False):
        """NAK, QP into the error state (until the host reloads it); the message in progress
        ends (the placer ends it itself on its own ``fatal``)."""
        self._answer(m, *counters, syndrome=syndrome)
        m.d.sync += [self.ctx.err.eq(1), self.qp_error.eq(1), self.qp_error_index.eq(self.qi)]
        if not placer:
            m.d.comb += self.place.abort.eq(1)

    def _remember(self, m, npsn):
        """A new READ or atomic: MSN + 1, ePSN + ``npsn``, into the replay cache."""
        ctx, K = self.ctx, self.cache_depth
        m.d.sync += [ctx.msn.eq(ctx.msn + 1), ctx.epsn.eq(self.h.bth.psn + npsn),
                     ctx.cache_ptr.eq(Mux(ctx.cache_ptr + 1 >= K, 0, ctx.cache_ptr + 1))]
        m.d.comb += self.cache.we.eq(1)

    def elaborate(self, platform):
        m = Module()
        h, k, ctx = self.h, self.kind, self.ctx
        out, pl, ca, at = self.out, self.place, self.cache, self.atomic
        psn, reth = h.bth.psn, h.reth
        d = Signal(24)                      # (PSN - ePSN) mod 2**24
        new_read = Signal()                 # READ at ePSN (vs. a duplicate)
        m.d.comb += [d.eq(psn - ctx.epsn), self.inc.eq(0)]      # (every inc bit driven)
        m.d.sync += self.qp_error.eq(0)

        # Values the states below pass on, driven whether used or not (only the strobes are
        # conditional), so that they cost no multiplexer per state and no path from a state's
        # decision: an answer is an ACK of the request's PSN with the QP's MSN unless stated; a
        # new READ/atomic goes into the replay cache as itself; a WRITE, READ or atomic goes to
        # the address of the MR lookup (0 with no octets: the lookup is skipped).
        laddr = Mux(reth.dma_length == 0, 0, self.mr_laddr)
        m.d.comb += [out.opcode.eq(O.ACKNOWLEDGE.value), out.psn.eq(psn), out.msn.eq(ctx.msn),
                     out.syndrome.eq(S.ACK.value), out.orig.eq(at.orig),
                     ca.wdata.valid.eq(1), ca.wdata.atomic.eq(k.atomic), ca.wdata.psn.eq(psn),
                     ca.wdata.npsn.eq(out.npsn), ca.wdata.length.eq(reth.dma_length),
                     ca.wdata.rkey.eq(Mux(k.atomic, h.atomic_eth.rkey, reth.rkey)),
                     ca.wdata.va.eq(Mux(k.atomic, at.orig, reth.va)),
                     pl.laddr.eq(laddr), pl.length.eq(reth.dma_length),
                     out.laddr.eq(laddr), at.addr.eq(self.mr_laddr)]

        count = partial(self._count, m)
        answer = partial(self._answer, m)
        fatal = partial(self._fatal, m)
        remember = partial(self._remember, m)
        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.admit.start):
                    m.d.sync += ctx.eq(self.ctx_in)
                    m.next = "DECIDE"
                with m.Elif(self.admit.drop):
                    m.next = "DROP"

            with m.State("DECIDE"):
                with m.If(ctx.err):
                    count("cnt_bad_state")
                    m.next = "DROP"
                with m.Elif(d[23]):             # duplicate
                    count("cnt_duplicates")
                    with m.If(k.send | k.write):
                        answer("cnt_acks", psn=ctx.epsn - 1)
                    with m.Else():
                        m.d.comb += ca.start.eq(1)
                        m.next = "DUPLICATE"
                with m.Elif(d != 0):            # ahead
                    count("cnt_psn_ahead")
                    with m.If(ctx.nak_armed):
                        answer("cnt_seq_naks", psn=ctx.epsn, syndrome=S.NAK_PSN_SEQ_ERROR.value)
                        m.d.sync += ctx.nak_armed.eq(0)
                    with m.Else():
                        m.next = "DRAIN"
                with m.Else():
                    m.d.sync += ctx.nak_armed.eq(1)
                    with m.If(self.seq_bad | self.len_bad):
                        fatal(S.NAK_INVALID_REQUEST.value, "cnt_nak_invalid")
                    with m.Elif(k.needs_recv & (self.credits == 0)):
                        answer("cnt_rnr_naks", syndrome=S.RNR_NAK.value | self.rnr_timer)
                    with m.Elif(k.needs_recv & self.backlog):
                        # Frames arrive faster than the target drains them: a new message
                        # waits out the RNR timer at its requester rather than being lost
                        # to a full MAC buffer (the messages under way go on).
                        answer("cnt_rnr_naks", "cnt_rnr_backlog",
                               syndrome=S.RNR_NAK.value | self.rnr_timer)
                    with m.Elif(k.atomic & (h.atomic_eth.va[0:3] != 0)):
                        fatal(S.NAK_INVALID_REQUEST.value, "cnt_nak_invalid")
                    with m.Elif(k.write & k.first_only & (reth.dma_length != 0)):
                        m.next = "MR_ASK"
                    with m.Elif(k.send | k.write):
                        # A WRITE First/Only of no octets has an empty cursor.
                        m.d.comb += [pl.start.eq(1), pl.cursor.eq(k.write & k.first_only)]
                        m.next = "PLACE"
                    with m.Elif(k.read):
                        m.d.sync += new_read.eq(1)
                        with m.If(reth.dma_length == 0):
                            m.d.comb += out.set_laddr.eq(1)
                            m.next = "READ_NEW"
                        with m.Else():
                            m.next = "MR_ASK"
                    with m.Else():      # atomic
                        m.next = "MR_ASK"

            # ---- MR lookup (two register stages in MrTable; its inputs come from the header
            # register, stable from LOOKUP on, so MR_ANSWER sees the answer to this packet's)
            with m.State("MR_ASK"):
                m.next = "MR_ANSWER"
            with m.State("MR_ANSWER"):
                with m.If(~self.mr_ok):
                    with m.If(new_read | ~k.read):
                        fatal(S.NAK_REMOTE_ACCESS.value, "cnt_nak_access", "cnt_rkey_errors")
                    with m.Else():
                        m.next = "DRAIN"        # duplicate READ no longer allowed: drop
                with m.Elif(k.write):
                    m.d.comb += [pl.start.eq(1), pl.cursor.eq(1)]
                    m.next = "PLACE"
                with m.Elif(k.read):
                    m.d.comb += out.set_laddr.eq(1)
                    with m.If(new_read):
                        m.next = "READ_NEW"
                    with m.Else():
                        m.next = "READ_RESP"
                with m.Elif(self.mr_laddr[0:3] != 0):
                    fatal(S.NAK_INVALID_REQUEST.value, "cnt_nak_invalid")
                with m.Else():
                    m.d.comb += at.start.eq(1)
                    m.next = "ATOMIC"

            # ---- SEND / RDMA WRITE ---------------------------------------------------------
            with m.State("PLACE"):
                # (``fatal`` and ``done`` never together: two Ifs keep ``fatal`` off the ACK path.)
                with m.If(pl.fatal):
                    fatal(S.NAK_INVALID_REQUEST.value, "cnt_nak_invalid", placer=True)
                with m.If(pl.done):
                    new_msn = Signal(24)
                    since = Signal(9)
                    m.d.comb += [new_msn.eq(ctx.msn + (k.last | k.only)),
                                 since.eq(ctx.since_ack + 1)]
                    m.d.sync += [ctx.msn.eq(new_msn), ctx.epsn.eq(psn + 1)]
                    want_ack = h.bth.ackreq
                    if self.ack_every:
                        want_ack = want_ack | (since >= self.ack_every)
                    with m.If(want_ack):
                        answer("cnt_acks", msn=new_msn)
                        m.d.sync += ctx.since_ack.eq(0)
                    with m.Else():
                        m.d.sync += ctx.since_ack.eq(since)
                        m.next = "COMMIT"

            # ---- RDMA READ ------------------------------------------------------------------
            with m.State("READ_NEW"):
                # New READ: count it, advance ePSN, remember it; then send the responses.
                remember(out.npsn)
                m.d.comb += out.begin.eq(1)
                m.next = "READ_RESP"
            with m.State("READ_RESP"):
                m.d.comb += out.respond.eq(1)
                with m.If(out.read_done):
                    m.next = "DRAIN"

            # ---- duplicates of READ / atomic -------------------------------------------------
            with m.State("DUPLICATE"):
                with m.If(ca.atomic):
                    answer(opcode=O.ATOMIC_ACKNOWLEDGE.value, orig_we=1, orig=ca.orig)
                with m.Elif(ca.replay):
                    m.d.sync += new_read.eq(0)
                    m.d.comb += out.begin.eq(1)
                    with m.If(reth.dma_length == 0):
                        m.d.comb += out.set_laddr.eq(1)
                        m.next = "READ_RESP"
                    with m.Else():
                        m.next = "MR_ASK"
                with m.Elif(ca.drop):
                    m.next = "DRAIN"

            # ---- atomics --------------------------------------------------------------------
            with m.State("ATOMIC"):
                with m.If(at.done):
                    remember(1)
                    answer(opcode=O.ATOMIC_ACKNOWLEDGE.value, orig_we=1, msn=ctx.msn + 1)

            # ---- common tail ---------------------------------------------------------------
            with m.State("EMIT"):
                m.d.comb += out.emit.eq(1)
                with m.If(out.sent):
                    m.next = "DRAIN"
            with m.State("DRAIN"):
                m.d.comb += pl.drain.eq(1)
                with m.If(pl.drained):
                    m.next = "COMMIT"
            with m.State("COMMIT"):
                m.d.comb += [self.commit.eq(1), self.admit.done.eq(1)]
                m.next = "IDLE"
            with m.State("DROP"):               # no QP context touched
                m.d.comb += pl.drain.eq(1)
                with m.If(pl.drained):
                    m.d.comb += self.admit.done.eq(1)
                    m.next = "IDLE"
        return m

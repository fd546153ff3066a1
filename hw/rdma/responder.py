# Ref: roce-layouts.md §3 (opcodes, RQ WQE consumption), §4 (RETH, AETH syndromes, AtomicETH),
#      §6.1-§6.6 (PSN arithmetic, ePSN, MSN, ACK/NAK rules, duplicates); hw/iface.py
#      (RecvNotify/RecvRepost, QpConfig).
"""RC responder: executes RoCEv2 requests against target memory and answers them.

One packet at a time: the header record is taken, the QP found by its local QPN, the QP's
context (expected PSN, MSN, message state) loaded into a working register, the packet checked
and executed, the context written back. Packets to send (ACK, NAK, READ responses, ATOMIC
ACKNOWLEDGE) leave as :data:`RespTx` records, one per packet, to the TX path, which reads READ
response payload from target memory itself.

Rules (rxe behaviour as roce-layouts.md §6 describes it):

- PSN == ePSN executes. SEND payload goes to the QP's current receive buffer
  (``recv_base + index * 2**recv_size_log2``), which a SEND First/Only (or a WRITE with
  Immediate) takes; the last packet raises :data:`RecvNotify`. RDMA WRITE payload goes through
  the MR table to ``laddr``. READ requests produce max(1, ceil(len / PMTU)) responses (AETH on
  First/Last/Only) and advance ePSN by that many PSNs. Atomics read, modify and write the 64-bit
  little-endian word and answer with the original value.
- MSN counts completed messages (last packet of SEND/WRITE, each READ and atomic).
- ACK (syndrome 0x1F, PSN of the packet, current MSN) for a SEND/WRITE packet with AckReq, or
  after ``ack_every`` packets without one (0 = only on AckReq).
- PSN ahead of ePSN: NAK PSN sequence error (PSN = ePSN) once, then silence until a packet with
  PSN == ePSN re-arms it.
- PSN behind ePSN (duplicate): SEND/WRITE -> ACK with PSN ePSN - 1, not executed; READ ->
  found in the replay cache (same R_Key, VA/length consistent with the original at that PSN),
  re-read and re-sent from the duplicate's PSN; atomic -> ATOMIC ACKNOWLEDGE with the cached
  original value. Not in the cache: dropped. The cache (``cache_depth`` entries per QP, in a
  memory) is searched one entry per cycle, lowest entry index first.
- No receive buffer for a packet that needs one: RNR NAK (0x20 | ``rnr_timer``), PSN of the
  request, nothing changes.
- R_Key / range / rights failure: NAK 0x62; opcode sequence, length, misaligned atomic,
  unknown invalidate R_Key: NAK 0x61. Both are fatal: the responder marks the QP in error (its
  packets are dropped, ``qp_error`` strobes) until the host rewrites the QP's state (``load``).
- Unknown QPN, QP not in RTR/RTS, unknown/non-RC/response opcodes, malformed packets: dropped
  and counted.
- Source check (as rxe's ``check_addr``): a packet whose IPv4 source address (its RoCEv2
  source GID) is not the QP's ``peer_ip`` is dropped and counted (``cnt_src_mismatch``) before
  its PSN is looked at: never executed, never answered, nothing of the QP changes. The UDP
  source port (ECMP entropy) and the source MAC (a router's) are not checked.

Memory: payload octets are packed into aligned 8-octet words with byte strobes at one word per
cycle; a RecvNotify or a READ response record is only issued after every write of the
preceding packets has been accepted by the bus (so the consumer/TX path read what was written).
The atomic read and write are two separate bus requests: another master of the same
:class:`~hw.lib.membus.MemArbiter` may access the word in between (no bus lock exists).
"""

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.headers import AETH, AtomicAckETH, AethSyndrome, BthOpcode
from hw.lib.dma import WordWriter
from hw.lib.fetchadd import MaskedFetchAdd
from hw.iface import (ADDR_BITS, QP_INDEX_BITS, MemBusSignature, MemReq, QpConfig, QpState,
                    RecvNotify, RecvRepost)
from hw.rdma.qp import MrAccess, MrLookupSignature, qp_lookup
from hw.rdma.roce_hdr import RoceRxHeader
from hw.lib.stream import PacketStream

__all__ = ["RespTx", "Responder", "COUNTERS"]

#: One packet for the TX path to send (hw/rdma/txpath.py).
RespTx = data.StructLayout({
    "qp": QP_INDEX_BITS,
    "opcode": 8,
    "psn": 24,
    "aeth": AETH,
    "atomic_ack": AtomicAckETH,
    "laddr": ADDR_BITS,
    "length": 16,
})

#: Counter output ports, in the order a register bank should map them (offset 4 * index).
COUNTERS = ("cnt_packets", "cnt_acks", "cnt_seq_naks", "cnt_psn_ahead", "cnt_duplicates",
            "cnt_rkey_errors", "cnt_nak_invalid", "cnt_nak_access", "cnt_rnr_naks",
            "cnt_unknown_qp", "cnt_bad_state", "cnt_bad_opcode", "cnt_src_mismatch")

O = BthOpcode
_SEND = [O.SEND_FIRST, O.SEND_MIDDLE, O.SEND_LAST, O.SEND_LAST_IMM, O.SEND_ONLY,
         O.SEND_ONLY_IMM, O.SEND_LAST_INV, O.SEND_ONLY_INV]
_WRITE = [O.WRITE_FIRST, O.WRITE_MIDDLE, O.WRITE_LAST, O.WRITE_LAST_IMM, O.WRITE_ONLY,
          O.WRITE_ONLY_IMM]
_ATOMIC = [O.CMP_SWAP, O.FETCH_ADD]
_FIRST_ONLY = [O.SEND_FIRST, O.SEND_ONLY, O.SEND_ONLY_IMM, O.SEND_ONLY_INV, O.WRITE_FIRST,
               O.WRITE_ONLY, O.WRITE_ONLY_IMM, O.READ_REQUEST] + _ATOMIC
_MID_LAST_SEND = [O.SEND_MIDDLE, O.SEND_LAST, O.SEND_LAST_IMM, O.SEND_LAST_INV]
_MID_LAST_WRITE = [O.WRITE_MIDDLE, O.WRITE_LAST, O.WRITE_LAST_IMM]
_FULL = [O.SEND_FIRST, O.SEND_MIDDLE, O.WRITE_FIRST, O.WRITE_MIDDLE]       # payload == PMTU
_LAST = [O.SEND_LAST, O.SEND_LAST_IMM, O.SEND_LAST_INV, O.WRITE_LAST, O.WRITE_LAST_IMM]
_ONLY = [O.SEND_ONLY, O.SEND_ONLY_IMM, O.SEND_ONLY_INV, O.WRITE_ONLY, O.WRITE_ONLY_IMM]
_NEEDS_RECV = [O.SEND_FIRST, O.SEND_ONLY, O.SEND_ONLY_IMM, O.SEND_ONLY_INV, O.WRITE_LAST_IMM,
               O.WRITE_ONLY_IMM]
_HAS_IMM = [O.SEND_LAST_IMM, O.SEND_ONLY_IMM, O.WRITE_LAST_IMM, O.WRITE_ONLY_IMM]
_HAS_INV = [O.SEND_LAST_INV, O.SEND_ONLY_INV]
_REQUESTS = _SEND + _WRITE + _ATOMIC + [O.READ_REQUEST]

#: Per-QP dynamic state, loaded into a working register for the packet being processed.
QpCtx = data.StructLayout({
    "epsn": 24, "msn": 24, "nak_armed": 1, "err": 1,
    "in_send": 1, "in_write": 1,
    "wr_laddr": ADDR_BITS, "wr_rem": 32,          # RDMA WRITE cursor
    "send_addr": ADDR_BITS, "send_off": 17,       # receive buffer of the SEND in progress
    "head": 8,                                    # next receive buffer index
    "since_ack": 8,
    "cache_ptr": 4,
})

#: Replay-cache entry of a READ (psn .. psn + npsn - 1) or an atomic (npsn = 1; ``va`` holds
#: the original value).
CacheEntry = data.StructLayout({
    "valid": 1, "atomic": 1, "psn": 24, "npsn": 24, "rkey": 32, "va": 64, "length": 32,
})


def _op_in(op, ops):
    out = Const(0)
    for o in ops:
        out = out | (op == o.value)
    return out


class Responder(wiring.Component):
    """RC responder for ``n_qp`` queue pairs (see the module docstring).

    Parameters
    ----------
    width : int
        payload datapath width (8 .. 64).
    n_qp : int
    cache_depth : int
        READ/atomic replay-cache entries per QP (responder resources).
    ack_every : int
        send an ACK after this many SEND/WRITE packets without AckReq (0 = never).
    rnr_timer : int
        RNR timer code (0..31) in RNR NAKs.

    Ports
    -----
    hdr : In(stream of RoceRxHeader)      from RoceRxParser (request opcodes)
    payload : In(PacketStream(width))     from RoceRxParser
    cfg : In(QpConfig).array(n_qp), load : In(n_qp)   from QpTable
    mr : Out(MrLookupSignature)           to MrTable.lookup
    mr_inv_valid : Out(1), mr_inv_rkey : Out(32), mr_inv_found : In(1)   to MrTable
        (``mr_inv_found`` must not depend on ``mr_inv_valid``: it is checked first)
    mem : Out(MemBusSignature)
    tx : Out(stream of RespTx)            to the TX path
    notify : Out(stream of RecvNotify), repost : In(stream of RecvRepost)
    qp_error : Out(1), qp_error_index : Out(QP_INDEX_BITS)   strobe on a fatal NAK
    cnt_* : Out(32)                       see :data:`COUNTERS`
    """

    def __init__(self, width, n_qp, *, cache_depth=4, ack_every=0, rnr_timer=1):
        self.width, self.n_qp = width, n_qp
        self.cache_depth, self.ack_every, self.rnr_timer = cache_depth, ack_every, rnr_timer
        if not 1 <= cache_depth <= 16:
            raise ValueError("cache_depth must be 1..16")
        super().__init__({
            "hdr": In(stream.Signature(RoceRxHeader)),
            "payload": In(PacketStream(width)),
            "cfg": In(QpConfig).array(n_qp),
            "load": In(n_qp),
            "mr": Out(MrLookupSignature()),
            "mr_inv_valid": Out(1), "mr_inv_rkey": Out(32), "mr_inv_found": In(1),
            "mem": Out(MemBusSignature()),
            "tx": Out(stream.Signature(RespTx)),
            "notify": Out(stream.Signature(RecvNotify)),
            "repost": In(stream.Signature(RecvRepost)),
            "qp_error": Out(1), "qp_error_index": Out(QP_INDEX_BITS),
            **{name: Out(32) for name in COUNTERS},
        })

    def elaborate(self, platform):
        m = Module()
        nq, K = self.n_qp, self.cache_depth
        m.submodules.writer = wr = WordWriter(self.width)
        m.submodules.fadd = fadd = MaskedFetchAdd(64)

        h = Signal(RoceRxHeader)            # header of the packet being processed
        op = h.bth.opcode
        psn = h.bth.psn
        n = h.payload_len
        qi = Signal(QP_INDEX_BITS)
        ctx = Signal(QpCtx)
        cfg = Signal(QpConfig)              # configuration of QP qi (latched)
        pay_done = Signal()                 # payload of this packet consumed (or none)
        # Bit i: the packet's IPv4 source is QP i's peer_ip. Compared per QP when the header
        # is taken (IDLE, from the parser's output register) so that LOOKUP only selects one
        # bit by the QP index, as it selects the QP's state: no 32-bit n_qp-to-1 multiplexer
        # and no comparator after the QPN match on the LOOKUP path.
        src_ok = Signal(nq)

        # ---- per-QP state ---------------------------------------------------------------
        # The contexts and the replay cache are memories (LUT RAM on the ECP5: one write port,
        # asynchronous reads) rather than n_qp x (185 + K x 242) flip-flops behind n_qp-to-1
        # multiplexers: as registers they were the most congested logic of the ECPIX-5 build.
        kb = max(1, (K - 1).bit_length())
        m.submodules.ctxmem = ctxmem = memory.Memory(shape=QpCtx, depth=nq, init=[])
        m.submodules.cachemem = cachemem = memory.Memory(shape=CacheEntry, depth=nq << kb,
                                                         init=[])
        credits = [Signal(9, name=f"credits{i}") for i in range(nq)]
        cvalid = [Signal(K, name=f"cvalid{i}") for i in range(nq)]   # replay-cache valid bits
        consume = Signal()                  # take one receive buffer of QP qi
        commit = Signal()                   # write ctx back into QP qi's context
        cache_we = Signal()
        cache_new = Signal(CacheEntry)
        # A load (the host rewrote the QP) resets the context through the memory's one write
        # port: it waits in ``reload`` for a cycle without a commit; CTX waits for it.
        reload = Signal(nq)

        m.d.comb += self.repost.ready.eq(1)
        for i in range(nq):
            rp = self.repost.valid & (self.repost.p.qp == i)
            cn = consume & (qi == i)
            with m.If(self.load[i]):
                m.d.sync += [credits[i].eq(self.cfg[i].recv_count), cvalid[i].eq(0)]
            with m.Else():
                m.d.sync += credits[i].eq(credits[i] + rp - cn)
                with m.If(cache_we & (qi == i)):
                    m.d.sync += cvalid[i].eq(cvalid[i] | (1 << ctx.cache_ptr))

        ctx_wp = ctxmem.write_port()
        reload_i = Signal(range(nq))
        for i in reversed(range(nq)):
            with m.If(reload[i]):
                m.d.comb += reload_i.eq(i)
        init_epsn = Signal(24)
        with m.Switch(reload_i):
            for i in range(nq):
                with m.Case(i):
                    m.d.comb += init_epsn.eq(self.cfg[i].rq_psn)
        # All zero but ePSN (the QP's RQ PSN) and nak_armed; built as one value (a partly
        # assigned comb Signal leaves the other bits undriven in Icarus/Verilator).
        init_ctx = QpCtx.const({"nak_armed": 1}).as_value() | \
            (init_epsn << QpCtx["epsn"].offset)
        done_reload = Signal(nq)
        with m.If(commit):
            m.d.comb += [ctx_wp.en.eq(1), ctx_wp.addr.eq(qi), ctx_wp.data.eq(ctx)]
        with m.Elif(reload != 0):
            m.d.comb += [ctx_wp.en.eq(1), ctx_wp.addr.eq(reload_i), ctx_wp.data.eq(init_ctx),
                         done_reload.eq(1 << reload_i)]
        m.d.sync += reload.eq((reload & ~done_reload) | self.load)

        cache_wp = cachemem.write_port()
        m.d.comb += [cache_wp.en.eq(cache_we), cache_wp.addr.eq(Cat(ctx.cache_ptr[:kb], qi)),
                     cache_wp.data.eq(cache_new)]

        cur_credits = Signal(9)
        cur_cvalid = Signal(K)
        with m.Switch(qi):
            for i in range(nq):
                with m.Case(i):
                    m.d.comb += [cur_credits.eq(credits[i]), cur_cvalid.eq(cvalid[i])]
        ctx_rp = ctxmem.read_port(domain="comb")
        cur_slot = Signal(QpCtx)
        m.d.comb += [ctx_rp.addr.eq(qi), cur_slot.eq(ctx_rp.data)]
        srch_k = Signal(kb)                 # replay-cache entry being compared (DUP_SEARCH)
        cache_rp = cachemem.read_port(domain="comb")
        cur_entry = Signal(CacheEntry)
        m.d.comb += [cache_rp.addr.eq(Cat(srch_k, qi)), cur_entry.eq(cache_rp.data),
                     cur_entry.valid.eq(cur_cvalid.bit_select(srch_k, 1))]

        # ---- packet classification (from the latched header) ----------------------------
        is_send = _op_in(op, _SEND)
        is_write = _op_in(op, _WRITE)
        is_read = op == O.READ_REQUEST.value
        is_atomic = _op_in(op, _ATOMIC)
        is_request = _op_in(op, _REQUESTS)
        first_only = _op_in(op, _FIRST_ONLY)
        is_last = _op_in(op, _LAST)
        is_only = _op_in(op, _ONLY)
        has_imm = _op_in(op, _HAS_IMM)
        has_inv = _op_in(op, _HAS_INV)
        needs_recv = _op_in(op, _NEEDS_RECV)
        pmtu_log2 = Signal(4)
        m.d.comb += pmtu_log2.eq(cfg.pmtu + 7)
        pmtu = Signal(14)
        m.d.comb += pmtu.eq(1 << pmtu_log2)

        d = Signal(24)                      # (PSN - ePSN) mod 2**24
        m.d.comb += d.eq(psn - ctx.epsn)
        seq_bad = Mux(ctx.in_send, ~_op_in(op, _MID_LAST_SEND),
                      Mux(ctx.in_write, ~_op_in(op, _MID_LAST_WRITE), ~first_only))
        len_bad = (_op_in(op, _FULL) & (n != pmtu)) | \
            (is_last & ((n == 0) | (n > pmtu))) | (is_only & (n > pmtu))

        # ---- outputs held in registers ---------------------------------------------------
        tx = self.tx
        with m.If(tx.ready):
            m.d.sync += tx.valid.eq(0)
        tx_free = ~tx.valid | tx.ready
        nt = self.notify
        with m.If(nt.ready):
            m.d.sync += nt.valid.eq(0)
        m.d.sync += self.qp_error.eq(0)

        pend = Signal(RespTx)               # packet for the EMIT state

        def count(name):
            c = getattr(self, name)
            return c.eq(c + 1)

        def ack_pkt(p, syndrome, msn):
            return [pend.qp.eq(qi), pend.opcode.eq(O.ACKNOWLEDGE.value), pend.psn.eq(p),
                    pend.aeth.syndrome.eq(syndrome), pend.aeth.msn.eq(msn), pend.length.eq(0)]

        def fatal(syndrome, counter):
            return ack_pkt(psn, syndrome, ctx.msn) + [
                ctx.err.eq(1), ctx.in_send.eq(0), ctx.in_write.eq(0),
                self.qp_error.eq(1), self.qp_error_index.eq(qi), count(counter)]

        # Memory bus: the writer, except while the FSM runs an atomic.
        at_req = Signal(MemReq)
        at_valid = Signal()
        m.d.comb += [self.mem.req.p.eq(wr.o.p), self.mem.req.valid.eq(wr.o.valid),
                     wr.o.ready.eq(self.mem.req.ready)]
        with m.If(at_valid):
            m.d.comb += [self.mem.req.p.eq(at_req), self.mem.req.valid.eq(1),
                         wr.o.ready.eq(0)]

        # Payload routing: into the writer in the data states, discarded in DRAIN.
        to_writer = Signal()
        m.d.comb += [wr.i.p.eq(self.payload.p)]
        with m.If(to_writer):
            m.d.comb += [wr.i.valid.eq(self.payload.valid),
                         self.payload.ready.eq(wr.i.ready)]

        # READ response generator registers.
        rd_psn = Signal(24)
        rd_laddr = Signal(ADDR_BITS)
        rd_rem = Signal(32)
        rd_first = Signal()
        rd_len = Signal(32)                 # DMA length of the READ being answered
        orig = Signal(64)
        dup = Signal(CacheEntry)
        dup_k = Signal(24)
        new_read = Signal()                 # READ at ePSN (vs. a duplicate)

        idx, hit = qp_lookup(m, self.cfg, h.bth.dest_qp)
        cfg_sel = Signal(QpConfig)
        with m.Switch(idx):
            for i in range(nq):
                with m.Case(i):
                    m.d.comb += cfg_sel.eq(self.cfg[i])

        reth = h.reth
        aeth_ack = AethSyndrome.ACK.value
        m.d.comb += self.mr_inv_rkey.eq(h.ieth.rkey)       # probed by mr_inv_found

        # MR lookup inputs: from the latched header (stable from LOOKUP on).
        mr = self.mr
        m.d.comb += [mr.qp.eq(qi)]
        with m.If(is_atomic):
            m.d.comb += [mr.rkey.eq(h.atomic_eth.rkey), mr.va.eq(h.atomic_eth.va),
                         mr.length.eq(8), mr.access.eq(MrAccess.ATOMIC)]
        with m.Else():
            m.d.comb += [mr.rkey.eq(reth.rkey), mr.va.eq(reth.va),
                         mr.length.eq(reth.dma_length),
                         mr.access.eq(Mux(is_read, MrAccess.READ, MrAccess.WRITE))]
        npsn = Signal(25)
        m.d.comb += npsn.eq(Mux(rd_len == 0, 1, (rd_len + pmtu - 1) >> pmtu_log2))

        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.hdr.ready.eq(1)
                with m.If(self.hdr.valid):
                    m.d.sync += [h.eq(self.hdr.p), count("cnt_packets"),
                                 pay_done.eq(self.hdr.p.payload_len == 0),
                                 src_ok.eq(Cat(self.cfg[i].peer_ip == self.hdr.p.meta.src_ip
                                               for i in range(nq)))]
                    m.next = "LOOKUP"

            with m.State("LOOKUP"):
                m.d.sync += [qi.eq(idx), cfg.eq(cfg_sel)]
                bad_op = ~h.known_opcode | h.malformed | ~is_request
                with m.If(bad_op):
                    m.d.sync += count("cnt_bad_opcode")
                    m.next = "DRAIN_ONLY"
                with m.Elif(~hit):
                    m.d.sync += count("cnt_unknown_qp")
                    m.next = "DRAIN_ONLY"
                with m.Elif((cfg_sel.state != QpState.RTR) & (cfg_sel.state != QpState.RTS)):
                    m.d.sync += count("cnt_bad_state")
                    m.next = "DRAIN_ONLY"
                with m.Elif(~src_ok.bit_select(idx, 1)):
                    m.d.sync += count("cnt_src_mismatch")
                    m.next = "DRAIN_ONLY"
                with m.Else():
                    m.next = "CTX"

            with m.State("CTX"):
                with m.If(~reload.bit_select(qi, 1)):
                    m.d.sync += ctx.eq(cur_slot)
                    m.next = "DECIDE"

            with m.State("DECIDE"):
                with m.If(ctx.err):
                    m.d.sync += count("cnt_bad_state")
                    m.next = "DRAIN_ONLY"
                with m.Elif(d[23]):
                    # Duplicate.
                    m.d.sync += count("cnt_duplicates")
                    with m.If(is_send | is_write):
                        m.d.sync += [*ack_pkt(ctx.epsn - 1, aeth_ack, ctx.msn),
                                     count("cnt_acks")]
                        m.next = "EMIT"
                    with m.Else():
                        m.d.sync += srch_k.eq(0)
                        m.next = "DUP_SEARCH"
                with m.Elif(d != 0):
                    m.d.sync += count("cnt_psn_ahead")
                    with m.If(ctx.nak_armed):
                        m.d.sync += [*ack_pkt(ctx.epsn, AethSyndrome.NAK_PSN_SEQ_ERROR.value,
                                              ctx.msn),
                                     ctx.nak_armed.eq(0), count("cnt_seq_naks")]
                        m.next = "EMIT"
                    with m.Else():
                        m.next = "DRAIN"
                with m.Else():
                    m.d.sync += ctx.nak_armed.eq(1)
                    with m.If(seq_bad | len_bad):
                        m.d.sync += fatal(AethSyndrome.NAK_INVALID_REQUEST.value,
                                          "cnt_nak_invalid")
                        m.next = "EMIT"
                    with m.Elif(needs_recv & (cur_credits == 0)):
                        m.d.sync += [*ack_pkt(psn, AethSyndrome.RNR_NAK.value | self.rnr_timer,
                                              ctx.msn),
                                     count("cnt_rnr_naks")]
                        m.next = "EMIT"
                    with m.Elif(is_atomic & (h.atomic_eth.va[0:3] != 0)):
                        m.d.sync += fatal(AethSyndrome.NAK_INVALID_REQUEST.value,
                                          "cnt_nak_invalid")
                        m.next = "EMIT"
                    with m.Elif(is_send):
                        m.next = "SEND"
                    with m.Elif(is_write & first_only & (reth.dma_length != 0)):
                        m.next = "MR_ASK"
                    with m.Elif(is_write & first_only):
                        m.d.sync += [ctx.wr_rem.eq(0), ctx.wr_laddr.eq(0)]
                        m.next = "WRITE"
                    with m.Elif(is_write):
                        m.next = "WRITE"
                    with m.Elif(is_read):
                        m.d.sync += [new_read.eq(1), rd_len.eq(reth.dma_length)]
                        with m.If(reth.dma_length == 0):
                            m.d.sync += rd_laddr.eq(0)
                            m.next = "READ_NEW"
                        with m.Else():
                            m.next = "MR_ASK"
                    with m.Else():      # atomic
                        m.next = "MR_ASK"

            # ---- MR lookup (one register stage in MrTable) -------------------------------
            with m.State("MR_ASK"):
                m.next = "MR_ANSWER"
            with m.State("MR_ANSWER"):
                with m.If(~mr.ok):
                    with m.If(new_read | ~is_read):
                        m.d.sync += [*fatal(AethSyndrome.NAK_REMOTE_ACCESS.value,
                                            "cnt_nak_access"), count("cnt_rkey_errors")]
                        m.next = "EMIT"
                    with m.Else():
                        m.next = "DRAIN"        # duplicate READ no longer allowed: drop
                with m.Elif(is_write):
                    m.d.sync += [ctx.wr_laddr.eq(mr.laddr), ctx.wr_rem.eq(reth.dma_length)]
                    m.next = "WRITE"
                with m.Elif(is_read):
                    m.d.sync += rd_laddr.eq(mr.laddr)
                    with m.If(new_read):
                        m.next = "READ_NEW"
                    with m.Else():
                        m.next = "READ_RESP"
                with m.Else():
                    with m.If(mr.laddr[0:3] != 0):
                        m.d.sync += fatal(AethSyndrome.NAK_INVALID_REQUEST.value,
                                          "cnt_nak_invalid")
                        m.next = "EMIT"
                    with m.Else():
                        m.d.sync += rd_laddr.eq(mr.laddr)
                        m.next = "AT_RD"

            # ---- SEND -------------------------------------------------------------------
            with m.State("SEND"):
                buf_size = Signal(17)           # RecvNotify.length is 16 bits: cap at 64 KiB
                m.d.comb += buf_size.eq(Mux(cfg.recv_size_log2 > 16, 1 << 16,
                                            1 << cfg.recv_size_log2))
                start_off = Mux(first_only, 0, ctx.send_off)
                with m.If(start_off + n > buf_size):
                    m.d.sync += fatal(AethSyndrome.NAK_INVALID_REQUEST.value, "cnt_nak_invalid")
                    m.next = "EMIT"
                with m.Else():
                    addr = Signal(ADDR_BITS)
                    with m.If(first_only):
                        m.d.comb += [consume.eq(1),
                                     addr.eq(cfg.recv_base + (ctx.head << cfg.recv_size_log2))]
                        m.d.sync += [ctx.send_addr.eq(addr),
                                     ctx.head.eq(Mux(ctx.head + 1 >= cfg.recv_count, 0,
                                                     ctx.head + 1))]
                    with m.Else():
                        m.d.comb += addr.eq(ctx.send_addr + ctx.send_off)
                    m.d.comb += [wr.start.eq(1), wr.addr.eq(addr)]
                    m.d.sync += [ctx.send_off.eq(start_off + n),
                                 ctx.in_send.eq(~(is_last | is_only))]
                    m.next = "DATA"

            # ---- RDMA WRITE ---------------------------------------------------------------
            with m.State("WRITE"):
                last_pkt = is_last | is_only
                with m.If((n > ctx.wr_rem) | (last_pkt & (n != ctx.wr_rem))):
                    m.d.sync += fatal(AethSyndrome.NAK_INVALID_REQUEST.value, "cnt_nak_invalid")
                    m.next = "EMIT"
                with m.Else():
                    m.d.comb += [wr.start.eq(1), wr.addr.eq(ctx.wr_laddr)]
                    m.d.sync += [ctx.wr_laddr.eq(ctx.wr_laddr + n), ctx.wr_rem.eq(ctx.wr_rem - n),
                                 ctx.in_write.eq(~last_pkt)]
                    with m.If(has_imm):
                        m.d.comb += consume.eq(1)
                        m.d.sync += [
                            ctx.send_addr.eq(cfg.recv_base + (ctx.head << cfg.recv_size_log2)),
                            ctx.send_off.eq(0),
                            ctx.head.eq(Mux(ctx.head + 1 >= cfg.recv_count, 0, ctx.head + 1))]
                    m.next = "DATA"

            with m.State("DATA"):
                with m.If(~pay_done):
                    m.d.comb += to_writer.eq(1)
                    with m.If(self.payload.valid & self.payload.ready & self.payload.p.last):
                        m.d.sync += pay_done.eq(1)
                with m.Elif(wr.idle):
                    m.next = "EXECUTED"

            with m.State("EXECUTED"):
                # Every write of this packet has been accepted: complete the packet. Nothing
                # happens (no invalidate either) while the notify register is still full.
                done_msg = is_last | is_only
                needs_note = done_msg & (is_send | has_imm)
                with m.If(needs_note & nt.valid & ~nt.ready):
                    pass
                with m.Elif(done_msg & has_inv & ~self.mr_inv_found):
                    m.d.sync += fatal(AethSyndrome.NAK_INVALID_REQUEST.value, "cnt_nak_invalid")
                    m.next = "EMIT"
                with m.Else():
                    with m.If(done_msg & has_inv):
                        m.d.comb += self.mr_inv_valid.eq(1)
                    with m.If(needs_note):
                        m.d.sync += [nt.valid.eq(1), nt.p.qp.eq(qi), nt.p.addr.eq(ctx.send_addr),
                                     nt.p.length.eq(Mux(is_send, ctx.send_off, 0)),
                                     nt.p.has_imm.eq(has_imm), nt.p.imm.eq(h.imm.imm),
                                     nt.p.has_inv.eq(has_inv), nt.p.inv_rkey.eq(h.ieth.rkey)]
                    new_msn = Signal(24)
                    m.d.comb += new_msn.eq(ctx.msn + done_msg)
                    since = Signal(9)
                    m.d.comb += since.eq(ctx.since_ack + 1)
                    m.d.sync += [ctx.msn.eq(new_msn), ctx.epsn.eq(psn + 1)]
                    want_ack = h.bth.ackreq
                    if self.ack_every:
                        want_ack = want_ack | (since >= self.ack_every)
                    with m.If(want_ack):
                        m.d.sync += [*ack_pkt(psn, aeth_ack, new_msn), ctx.since_ack.eq(0),
                                     count("cnt_acks")]
                        m.next = "EMIT"
                    with m.Else():
                        m.d.sync += ctx.since_ack.eq(since)
                        m.next = "COMMIT"

            # ---- RDMA READ ------------------------------------------------------------------
            with m.State("READ_NEW"):
                # New READ: count it, advance ePSN, remember it; then send the responses.
                new_msn = ctx.msn + 1
                m.d.sync += [ctx.msn.eq(new_msn), ctx.epsn.eq(psn + npsn),
                             ctx.cache_ptr.eq(Mux(ctx.cache_ptr + 1 >= K, 0, ctx.cache_ptr + 1)),
                             rd_psn.eq(psn), rd_rem.eq(rd_len), rd_first.eq(1)]
                m.d.comb += [cache_we.eq(1), cache_new.valid.eq(1), cache_new.atomic.eq(0),
                             cache_new.psn.eq(psn), cache_new.npsn.eq(npsn),
                             cache_new.rkey.eq(reth.rkey), cache_new.va.eq(reth.va),
                             cache_new.length.eq(reth.dma_length)]
                m.next = "READ_RESP"
            with m.State("READ_RESP"):
                seg_last = rd_rem <= pmtu
                seg = Mux(seg_last, rd_rem, pmtu)
                opc = Mux(rd_first, Mux(seg_last, O.READ_RESPONSE_ONLY.value,
                                        O.READ_RESPONSE_FIRST.value),
                          Mux(seg_last, O.READ_RESPONSE_LAST.value, O.READ_RESPONSE_MIDDLE.value))
                with m.If(tx_free):
                    m.d.sync += [tx.valid.eq(1), tx.p.qp.eq(qi), tx.p.opcode.eq(opc),
                                 tx.p.psn.eq(rd_psn), tx.p.aeth.syndrome.eq(aeth_ack),
                                 tx.p.aeth.msn.eq(ctx.msn), tx.p.laddr.eq(rd_laddr),
                                 tx.p.length.eq(seg), tx.p.atomic_ack.orig_data.eq(0),
                                 rd_first.eq(0), rd_psn.eq(rd_psn + 1),
                                 rd_laddr.eq(rd_laddr + seg), rd_rem.eq(rd_rem - seg)]
                    with m.If(seg_last):
                        m.next = "DRAIN"

            # ---- duplicates of READ / atomic -------------------------------------------------
            with m.State("DUP_SEARCH"):
                # One entry per cycle, lowest index first (the first match is the answer).
                c = cur_entry
                dk = Signal(24)
                m.d.comb += dk.eq(psn - c.psn)
                match = c.valid & Mux(c.atomic, is_atomic & (dk == 0), is_read & (dk < c.npsn))
                with m.If(match):
                    m.d.sync += [dup.eq(c), dup_k.eq(dk)]
                    m.next = "DUP_CHECK"
                with m.Elif(srch_k == K - 1):
                    m.next = "DRAIN"
                with m.Else():
                    m.d.sync += srch_k.eq(srch_k + 1)
            with m.State("DUP_CHECK"):
                off = Signal(64)
                m.d.comb += off.eq(dup_k << pmtu_log2)
                with m.If(dup.atomic):
                    m.d.sync += [pend.qp.eq(qi), pend.opcode.eq(O.ATOMIC_ACKNOWLEDGE.value),
                                 pend.psn.eq(psn), pend.aeth.syndrome.eq(aeth_ack),
                                 pend.aeth.msn.eq(ctx.msn), pend.atomic_ack.orig_data.eq(dup.va),
                                 pend.length.eq(0)]
                    m.next = "EMIT"
                with m.Elif((reth.rkey == dup.rkey) & (reth.va == dup.va + off) &
                            (reth.dma_length == dup.length - off)):
                    m.d.sync += [new_read.eq(0), rd_len.eq(reth.dma_length),
                                 rd_psn.eq(psn), rd_rem.eq(reth.dma_length), rd_first.eq(1)]
                    with m.If(reth.dma_length == 0):
                        m.d.sync += rd_laddr.eq(0)
                        m.next = "READ_RESP"
                    with m.Else():
                        m.next = "MR_ASK"
                with m.Else():
                    m.next = "DRAIN"

            # ---- atomics --------------------------------------------------------------------
            with m.State("AT_RD"):
                m.d.comb += [at_valid.eq(1), at_req.addr.eq(rd_laddr), at_req.we.eq(0)]
                with m.If(self.mem.req.ready):
                    m.next = "AT_WAIT"
            with m.State("AT_WAIT"):
                m.d.comb += self.mem.rsp.ready.eq(1)
                with m.If(self.mem.rsp.valid):
                    m.d.sync += orig.eq(self.mem.rsp.p.rdata)
                    m.next = "AT_WR"
            with m.State("AT_WR"):
                ae = h.atomic_eth
                m.d.comb += [fadd.old.eq(orig), fadd.add.eq(ae.swap_add), fadd.mask.eq(0)]
                new = Mux(op == O.FETCH_ADD.value, fadd.new,
                          Mux(orig == ae.compare, ae.swap_add, orig))
                m.d.comb += [at_valid.eq(1), at_req.addr.eq(rd_laddr), at_req.we.eq(1),
                             at_req.wdata.eq(new), at_req.wstrb.eq(0xFF)]
                with m.If(self.mem.req.ready):
                    new_msn = ctx.msn + 1
                    m.d.sync += [ctx.msn.eq(new_msn), ctx.epsn.eq(psn + 1),
                                 ctx.cache_ptr.eq(Mux(ctx.cache_ptr + 1 >= K, 0,
                                                      ctx.cache_ptr + 1)),
                                 pend.qp.eq(qi), pend.opcode.eq(O.ATOMIC_ACKNOWLEDGE.value),
                                 pend.psn.eq(psn), pend.aeth.syndrome.eq(aeth_ack),
                                 pend.aeth.msn.eq(new_msn), pend.atomic_ack.orig_data.eq(orig),
                                 pend.length.eq(0)]
                    m.d.comb += [cache_we.eq(1), cache_new.valid.eq(1), cache_new.atomic.eq(1),
                                 cache_new.psn.eq(psn), cache_new.npsn.eq(1),
                                 cache_new.rkey.eq(ae.rkey), cache_new.va.eq(orig)]
                    m.next = "EMIT"

            # ---- common tail ---------------------------------------------------------------
            with m.State("EMIT"):
                with m.If(tx_free):
                    m.d.sync += [tx.valid.eq(1), tx.p.eq(pend)]
                    m.next = "DRAIN"
            with m.State("DRAIN"):
                m.d.comb += self.payload.ready.eq(~pay_done)
                with m.If(pay_done | (self.payload.valid & self.payload.p.last)):
                    m.d.sync += pay_done.eq(1)
                    m.next = "COMMIT"
            with m.State("COMMIT"):
                m.d.comb += commit.eq(1)
                m.next = "IDLE"
            with m.State("DRAIN_ONLY"):         # no QP context touched
                m.d.comb += self.payload.ready.eq(~pay_done)
                with m.If(pay_done | (self.payload.valid & self.payload.p.last)):
                    m.next = "IDLE"
        return m

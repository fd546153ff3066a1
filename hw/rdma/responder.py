# Ref: roce-layouts.md §3 (opcodes, RQ WQE consumption), §4 (RETH, AETH syndromes, AtomicETH),
#      §6.1-§6.6 (PSN arithmetic, ePSN, MSN, ACK/NAK rules, duplicates); hw/iface.py
#      (RecvNotify/RecvRepost, QpConfig); the blocks: hw/rdma/resp_*.py.
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
  request, nothing changes. The same for the first packet of a new SEND while ``rx_backlog``
  says the MAC's receive buffer is half full (``cnt_rnr_backlog`` counts these as well):
  admission control, so that a requester with many messages outstanding waits out the RNR
  timer instead of losing frames to a full buffer and its ACK timeout.
- R_Key / range / rights failure: NAK 0x62; opcode sequence, length, misaligned atomic,
  unknown invalidate R_Key: NAK 0x61. Both are fatal: the responder marks the QP in error (its
  packets are dropped, ``qp_error`` strobes) until the host rewrites the QP's state (the QP
  table's load event).
- Unknown QPN, QP not in RTR/RTS, unknown/non-RC/response opcodes, malformed packets: dropped
  and counted.
- Source check (as rxe's ``check_addr``): a packet whose IPv4 source address (its RoCEv2
  source GID) is not the QP's ``peer_ip`` is dropped and counted (``cnt_src_mismatch``) before
  its PSN is looked at: never executed, never answered, nothing of the QP changes. The UDP
  source port (ECMP entropy) and the source MAC (a router's) are not checked.

Memory: payload octets are packed into aligned 8-octet words with byte strobes at one word per
cycle; a RecvNotify or a READ response record is only issued after every write of the
preceding packets has been accepted by the bus (so the consumer/TX path read what was written).
The atomic read and write are two separate bus requests; the read locks the bus
(``MemReq.lock``), so no other master of a :class:`~hw.lib.membus.MemArbiter` that lists the
responder in ``locking`` reaches memory between them (the target's does: the KBTP engine
FetchAdds a DIRECT_ALLOC partition's Head that the initiator FetchAdds too).

Blocks (each owns what its docstring says; this module wires them):

- :class:`~hw.rdma.resp_admit.RespAdmit`: header register, QP lookup, admission checks;
- :class:`~hw.rdma.resp_common.RequestDecoder`: opcode class, sequence and length checks;
- :class:`~hw.rdma.resp_state.QpContextStore`: QP contexts, their reset, receive credits;
- :class:`~hw.rdma.resp_state.ReplayCache`: READ/atomic replay cache, duplicate resolution;
- :class:`~hw.rdma.resp_exec.RespSequencer`: PSN/MSN checks, MR lookup, the choice of every
  answer, the context write-back;
- :class:`~hw.rdma.resp_tx.ResponseGen`: the RespTx register, the staged ACK/NAK/ATOMIC
  ACKNOWLEDGE, READ response cursor and segmentation;
- :class:`~hw.rdma.resp_place.PayloadPlacer`: SEND receive buffers, WRITE cursor, the payload
  writer, RecvNotify, Invalidate;
- :class:`~hw.rdma.resp_atomic.AtomicUnit`: the atomic read-modify-write.

A packet takes IDLE -> LOOKUP (RespAdmit) -> CTX (context reset done) -> DECIDE (sequencer)
and on from there, one packet at a time; the cycle counts are those of the single FSM these
blocks were cut from.
"""

from amaranth import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from hw.iface import (QP_INDEX_BITS, MemBusSignature, MsgHead, QpConfig, QpReadSignature,
                      QpRespCfg, RecvNotify, RecvRepost, qp_index_of)
from hw.lib.stream import PacketStream
from hw.rdma.qp import MrAccess, MrLookupSignature
from hw.rdma.resp_admit import RespAdmit
from hw.rdma.resp_atomic import AtomicUnit
from hw.rdma.resp_common import COUNTERS, RequestDecoder, RespTx
from hw.rdma.resp_exec import RespSequencer
from hw.rdma.resp_place import PayloadPlacer
from hw.rdma.resp_state import QpContextStore, ReplayCache
from hw.rdma.resp_tx import ResponseGen
from hw.rdma.roce_hdr import RoceRxHeader

__all__ = ["RespTx", "Responder", "COUNTERS"]


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
    cfg : Out(QpReadSignature(QpRespCfg))   the responder's copy of the QP table (QpTable.resp)
    load_valid : In(1), load_qp : In(QP_INDEX_BITS), load_row : In(QpConfig)   QpTable's load
        event (the host wrote QP ``load_qp``'s state)
    mr : Out(MrLookupSignature)           to MrTable.lookup
    mr_inv_valid : Out(1), mr_inv_rkey : Out(32), mr_inv_found : In(1)   to MrTable
        (``mr_inv_found`` must not depend on ``mr_inv_valid``: it is checked first)
    mem : Out(MemBusSignature)
    tx : Out(stream of RespTx)            to the TX path
    notify : Out(stream of RecvNotify), repost : In(stream of RecvRepost)
    notify_head : Out(MsgHead)            with ``notify``: a SEND Only's first octets, on chip
    qp_error : Out(1), qp_error_index : Out(QP_INDEX_BITS)   strobe on a fatal NAK
    rx_backlog : In(1)                    the MAC's receive buffer is half full (GmiiMac)
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
            "cfg": Out(QpReadSignature(QpRespCfg)),
            "load_valid": In(1), "load_qp": In(QP_INDEX_BITS), "load_row": In(QpConfig),
            "mr": Out(MrLookupSignature()),
            "mr_inv_valid": Out(1), "mr_inv_rkey": Out(32), "mr_inv_found": In(1),
            "mem": Out(MemBusSignature()),
            "tx": Out(stream.Signature(RespTx)),
            "notify": Out(stream.Signature(RecvNotify)), "notify_head": Out(MsgHead),
            "repost": In(stream.Signature(RecvRepost)),
            "qp_error": Out(1), "qp_error_index": Out(QP_INDEX_BITS),
            "rx_backlog": In(1),
            **{name: Out(32) for name in COUNTERS},
        })

    def elaborate(self, platform):
        m = Module()
        nq = self.n_qp
        m.submodules.admit = admit = RespAdmit(nq)
        m.submodules.decode = dec = RequestDecoder()
        m.submodules.store = store = QpContextStore(nq)
        m.submodules.cache = cache = ReplayCache(nq, self.cache_depth)
        m.submodules.seq = seq = RespSequencer(cache_depth=self.cache_depth,
                                               ack_every=self.ack_every, rnr_timer=self.rnr_timer)
        m.submodules.place = pl = PayloadPlacer(self.width)
        m.submodules.out = out = ResponseGen()
        m.submodules.atomic = at = AtomicUnit()
        h, k, qi, qcfg = admit.h, dec.kind, admit.qi, admit.qcfg

        # The packet in hand: header register, QP, class.
        wiring.connect(m, wiring.flipped(self.hdr), admit.hdr)
        wiring.connect(m, wiring.flipped(self.cfg), admit.cfg)
        m.d.comb += [admit.request.eq(k.request), admit.ctx_busy.eq(store.busy),
                     dec.op.eq(h.bth.opcode), dec.n.eq(h.payload_len), dec.pmtu_code.eq(qcfg.pmtu),
                     dec.in_send.eq(pl.ctx.in_send), dec.in_write.eq(pl.ctx.in_write)]
        wiring.connect(m, admit.ctl, seq.admit)

        # Per-QP state.
        wiring.connect(m, wiring.flipped(self.repost), store.repost)
        load = Signal(nq)                   # one-hot: QP i's state was written
        m.d.comb += load.eq(self.load_valid << self.load_qp)
        m.d.comb += [store.load_valid.eq(self.load_valid), store.load_qp.eq(self.load_qp),
                     store.load_row.eq(self.load_row), store.qi.eq(qi),
                     # the header register's QP from LOOKUP on: its context is ready at CTX
                     store.rqi.eq(qp_index_of(h.bth.dest_qp)),
                     store.consume.eq(pl.consume),
                     store.commit.eq(seq.commit), store.wdata.seq.eq(seq.ctx),
                     store.wdata.place.eq(pl.ctx),
                     cache.load.eq(load), cache.qi.eq(qi), cache.ptr.eq(seq.ctx.cache_ptr),
                     cache.psn.eq(h.bth.psn), cache.read.eq(k.read), cache.atomic.eq(k.atomic),
                     cache.rkey.eq(h.reth.rkey), cache.va.eq(h.reth.va),
                     cache.length.eq(h.reth.dma_length), cache.pmtu_log2.eq(dec.pmtu_log2)]
        wiring.connect(m, seq.cache, cache.ctl)

        # Sequencer.
        m.d.comb += [seq.h.eq(h), seq.kind.eq(k), seq.qi.eq(qi), seq.seq_bad.eq(dec.seq_bad),
                     seq.len_bad.eq(dec.len_bad), seq.credits.eq(store.credits),
                     seq.backlog.eq(self.rx_backlog),
                     seq.ctx_in.eq(store.ctx.seq), seq.mr_ok.eq(self.mr.ok),
                     seq.mr_laddr.eq(self.mr.laddr),
                     self.qp_error.eq(seq.qp_error), self.qp_error_index.eq(seq.qp_error_index)]
        wiring.connect(m, seq.out, out.ctl)
        wiring.connect(m, out.tx, wiring.flipped(self.tx))
        m.d.comb += [out.qi.eq(qi), out.qp_msn.eq(seq.ctx.msn), out.psn.eq(h.bth.psn),
                     out.length.eq(h.reth.dma_length),
                     out.pmtu.eq(dec.pmtu), out.pmtu_log2.eq(dec.pmtu_log2)]

        # Payload placement and atomics.
        wiring.connect(m, seq.place, pl.ctl)
        wiring.connect(m, wiring.flipped(self.payload), pl.payload)
        wiring.connect(m, pl.notify, wiring.flipped(self.notify))
        m.d.comb += self.notify_head.eq(pl.notify_head)
        m.d.comb += [pl.h.eq(h), pl.kind.eq(k), pl.qi.eq(qi), pl.qcfg.eq(qcfg),
                     pl.begin.eq(admit.taken), pl.empty.eq(self.hdr.p.payload_len == 0),
                     pl.load.eq(admit.ctl.start), pl.ctx_in.eq(store.ctx.place),
                     self.mr_inv_valid.eq(pl.mr_inv_valid), pl.mr_inv_found.eq(self.mr_inv_found),
                     self.mr_inv_rkey.eq(h.ieth.rkey)]          # probed by mr_inv_found
        wiring.connect(m, seq.atomic, at.ctl)
        m.d.comb += [at.fetch_add.eq(k.fetch_add), at.compare.eq(h.atomic_eth.compare),
                     at.swap_add.eq(h.atomic_eth.swap_add)]

        # Memory bus: the payload writes, except while an atomic runs.
        mem, wr, ab = self.mem, pl.o, at.mem
        m.d.comb += [mem.req.p.eq(wr.p), mem.req.valid.eq(wr.valid), wr.ready.eq(mem.req.ready),
                     ab.req.ready.eq(mem.req.ready), ab.rsp.p.eq(mem.rsp.p),
                     ab.rsp.valid.eq(mem.rsp.valid), mem.rsp.ready.eq(ab.rsp.ready)]
        with m.If(ab.req.valid):
            m.d.comb += [mem.req.p.eq(ab.req.p), mem.req.valid.eq(1), wr.ready.eq(0)]

        # MR lookup inputs: from the header register (stable from LOOKUP on).
        mr = self.mr
        m.d.comb += mr.qp.eq(qi)
        with m.If(k.atomic):
            m.d.comb += [mr.rkey.eq(h.atomic_eth.rkey), mr.va.eq(h.atomic_eth.va),
                         mr.length.eq(8), mr.access.eq(MrAccess.ATOMIC)]
        with m.Else():
            m.d.comb += [mr.rkey.eq(h.reth.rkey), mr.va.eq(h.reth.va),
                         mr.length.eq(h.reth.dma_length),
                         mr.access.eq(Mux(k.read, MrAccess.READ, MrAccess.WRITE))]

        for name in COUNTERS:
            c = getattr(self, name)
            with m.If(admit.inc[name] | seq.inc[name]):
                m.d.sync += c.eq(c + 1)
        return m

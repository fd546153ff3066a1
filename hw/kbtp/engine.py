# Ref: draft KBTP §Block Table, §Free-Block Ring, §Allocation Quotas, §Operations (Block Load,
#      Block Mapped Store, Block Unmapped Store), §Completion, §Target Execution Model;
#      docs/layouts.md; model/target.py "Readings of the draft"; host/codec.py (strictness).
"""The KBTP engine: LOAD, STORE and ALLOC_STORE executed in gateware.

The responder has written a SEND message into a receive buffer and tells us with a
:data:`~hw.iface.RecvNotify` beat. The engine reads the message over its own memory-bus master
and either runs it (fast path: LOAD, STORE, ALLOC_STORE of a QP whose session the host driver has
configured here) or pushes the notify beat unchanged into ``hostq`` (slow path: HELLO, FREE, BIND,
GOODBYE, anything else, any QP without a session, messages shorter than the common header). For
slow-path messages the host returns the receive buffer itself.

Fast path, in the golden model's order (model/target.py Readings 6-10)::

    read message (7 words) -> decode (codec strictness: MALFORMED / TOO_LARGE)
    -> handle range -> table entry -> Block Size -> Generation -> VALID/SEALED/ALREADY_BOUND
    -> [ALLOC_STORE: quota, ring empty, masked FetchAdd on Head, slot poll, consume]
    -> data (RDMA WRITE to the initiator | inline copy | RDMA READ into the block)
    -> entry update (Data Length + Block Offset before Flags + Generation)
    -> completion (COMPLETION Send / Send with Invalidate, or record by WRITE_IMM)
    -> RecvRepost

v1 is serial: one request at a time, all QPs. Why: the draft requires in-order processing per
connection, and one ring allocator (hw/kbtp/ring_alloc.py, started by this FSM) makes the ring
counters atomic for free (every counter update, the host's included, goes through it, so Head
FetchAdds and Tail FetchAdds serialise without locking the memory arbiter). The cost is that a
request waiting for a WorkCompletion (an RDMA round trip) blocks every QP;
tests/test_kbtp_engine.py prints the per-request cycle counts.

Ring rules (model/ring.py; all in the ring allocator): an allocation re-reads its slot until
Sequence == ticket and Block Offset != all ones, then writes all ones into the Block Offset. A
free (host command FREE_BLOCK, or the engine returning a block after a failed RDMA READ) takes a
Tail ticket u and writes the slot only when it is consumed AND its Sequence == u - N
(model/ring.py ``slot_free_for``: the draft's "consumed" alone loses blocks under concurrent
frees), Block Offset first, then Sequence. A free that cannot write yet is deferred (one
deferred free at a time; the command register reads busy) and retried whenever the engine is
idle or polling a slot. The allocator owns the memory bus while this FSM is idle or waits for it.

Assumptions (v1): receive buffers, scratch buffers, table, ring and pool blocks are 8-octet
aligned; Block Size is a multiple of 8; no ADDR_LE (sessions negotiating it must stay on the slow
path); Head/Tail counters little-endian (the model's counter order); one shared ring (no
DIRECT_ALLOC partitions on the fast path).

What the host keeps doing (and must do as the golden model does): messages shorter than the
24-octet header (the model answers MALFORMED, echoing what arrived); RANGE[i] must say "owned"
for every range of an active *or retained* session, and ``n_ranges`` must cover
TABLE_COUNT >> RANGE_LOG2 (handles in uncovered ranges are refused with INVALID_HANDLE); USAGE
must be lowered by the host when its FREE completes (and raised by BIND). The per-QP SCRATCH
buffer is reused by the next request of the QP only after the WorkCompletion of the previous
completion Send, which the engine waits for.

Register map (``Space.REG``, byte offsets from ``base`` = REG_KBTP; 32-bit registers)
-----------------------------------------------------------------------------------
===========  ====  ===========================================================================
offset       acc   meaning
===========  ====  ===========================================================================
0x000        R     ID 0x4B425445 ("KBTE")
0x004        RW    CTRL: bit 0 enable fast path (0: everything goes to hostq), bit 1 masked
                   counters (1: draft Add Data/Mask; 0: InfiniBand unmasked, slot = 16*(t mod N))
0x008        RW    TABLE_BASE: address of the entry of Table Base Handle
0x00C/0x010  RW    TABLE_BASE_HANDLE low / high
0x014        RW    TABLE_COUNT: number of entries
0x018        RW    POOL_BASE: address of the block whose Block Offset is POOL_TO_BASE
0x01C/0x020  RW    POOL_TO_BASE low / high
0x024        RW    BLOCK_SIZE
0x028        RW    RING_BASE: address of shared ring slot 0
0x02C        RW    RING_ORDER n (N = 2**n)
0x030        RW    HEAD_ADDR
0x034        RW    TAIL_ADDR
0x038        RW    MAX_INLINE
0x03C        RW    RANGE_LOG2: log2 of the handles per initiator range (LOAD authorization)
0x040+4*i    RW    RANGE[i], i < n_ranges: bit 8 owned, bits 7..0 trust domain of the owner
0x080        W     CMD: 1 TAIL_FETCHADD (result in 0x08C/0x090), 2 FREE_BLOCK (Block Offset in
                   0x084/0x088); R: bit 0 busy (command pending or free deferred), bit 1 deferred
0x084/0x088  RW    CMD_ARG low / high (Block Offset for FREE_BLOCK)
0x08C/0x090  R     CMD_RESULT low / high: counter value before the last Tail FetchAdd
0x0A0        R     STALL_CYCLES: cycles spent re-reading ring slots (total)
0x0A4        R     LAST_LATENCY: cycles from RecvNotify accepted to the first WorkRequest out
0x0A8        R     LAST_CYCLES: cycles from RecvNotify accepted to RecvRepost of the last request
0x0AC        R     RING_OCCUPANCY: Tail ticket - Head ticket at the last ALLOC_STORE check
0x0B0        R     HOSTQ_COUNT: messages pushed to the slow path
0x100+4*k    R     COUNT[k], k = 16 * op + status; op 0 LOAD, 1 STORE, 2 ALLOC_STORE
0x200+0x40*q RW    QP q (q < n_qp): +0x00 SESSION (bit 0 valid, bit 1 RECORD_COMPLETION granted,
                   bits 15..8 trust domain), +0x04/+0x08 HANDLE_BASE low/high, +0x0C
                   HANDLE_COUNT, +0x10 QUOTA, +0x14 USAGE (bound + pending; the host adjusts it
                   on FREE/BIND), +0x18 SCRATCH (40-octet buffer for COMPLETION / record)
===========  ====  ===========================================================================
"""

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import fifo, memory, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.headers import (CommonHeader, CompletionBody, CompletionDescriptor, CompletionRecord,
                        DataDescriptor, EntryFlags, Opcode, ReqFlags, Status, TableEntry,
                        KBTP_VERSION)
from hw.headers import ALLOWED_FLAGS

from hw.iface import (ADDR_BITS, HostBusSignature, MemBusSignature, QP_INDEX_BITS, REG_KBTP,
                     RecvNotify, RecvRepost, Space, WcStatus, WorkCompletion, WorkRequest, WrOp)
from hw.lib.membus import be_field as _be, bswap64, read_words
from hw.kbtp.ring_alloc import Cmd, RingAllocator, RingOp

__all__ = ["KbtpEngine", "ENGINE_ID", "FAST_OPS", "Cmd", "reg"]

ENGINE_ID = 0x4B425445
#: Fast-path opcodes, in counter order (op index 0, 1, 2).
FAST_OPS = (Opcode.LOAD, Opcode.STORE, Opcode.ALLOC_STORE)
MSG_WORDS = 7           # header 24 + Data Descriptor 16 + Completion Descriptor 16 = 56 octets


#: Register offsets (relative to the window base), for drivers and tests.
reg = dict(ID=0x000, CTRL=0x004, TABLE_BASE=0x008, TABLE_BASE_HANDLE_LO=0x00C,
           TABLE_BASE_HANDLE_HI=0x010, TABLE_COUNT=0x014, POOL_BASE=0x018, POOL_TO_BASE_LO=0x01C,
           POOL_TO_BASE_HI=0x020, BLOCK_SIZE=0x024, RING_BASE=0x028, RING_ORDER=0x02C,
           HEAD_ADDR=0x030, TAIL_ADDR=0x034, MAX_INLINE=0x038, RANGE_LOG2=0x03C, RANGE=0x040,
           CMD=0x080, CMD_ARG_LO=0x084, CMD_ARG_HI=0x088, CMD_RESULT_LO=0x08C,
           CMD_RESULT_HI=0x090, STALL_CYCLES=0x0A0, LAST_LATENCY=0x0A4, LAST_CYCLES=0x0A8,
           RING_OCCUPANCY=0x0AC, HOSTQ_COUNT=0x0B0, COUNT=0x100, QP=0x200, QP_STRIDE=0x40,
           QP_SESSION=0x00, QP_HANDLE_BASE_LO=0x04, QP_HANDLE_BASE_HI=0x08,
           QP_HANDLE_COUNT=0x0C, QP_QUOTA=0x10, QP_USAGE=0x14, QP_SCRATCH=0x18)


class KbtpEngine(wiring.Component):
    """KBTP fast-path engine (see the module docstring for behaviour and register map).

    Parameters
    ----------
    n_qp : int
        QPs with a session context (at most 2**QP_INDEX_BITS).
    n_ranges : int
        Handle ranges in the LOAD authorization table.
    base : int
        Byte address of the register window.

    Ports
    -----
    notify : In(stream.Signature(RecvNotify))
    repost : Out(stream.Signature(RecvRepost))
    hostq : Out(stream.Signature(RecvNotify))     slow-path messages, as notified
    wr : Out(stream.Signature(WorkRequest))
    wc : In(stream.Signature(WorkCompletion))
    mem : Out(MemBusSignature())
    bus : In(HostBusSignature())
    host_done : In(1), host_done_qp : In(QP_INDEX_BITS)
        one-cycle strobe: the host returned a receive buffer of QP ``host_done_qp`` (its
        RecvRepost), i.e. it has finished a message the engine forwarded to it.

    Per-connection order: a message of a QP that still has a message at the host is not taken
    until the host has finished it (``host_done``), so "FREE h; ALLOC_STORE h" on one
    connection can never run in the other order, and the host's USAGE update after a FREE
    cannot race an allocation of the same QP. Other QPs wait too (the engine is serial).
    """

    #: The ring allocator's class (a mutant's, for tests/test_formal_ring.py's negative tests).
    ring_cls = RingAllocator

    def __init__(self, n_qp=1 << QP_INDEX_BITS, n_ranges=16, base=REG_KBTP):
        self.n_qp = n_qp
        self.n_ranges = n_ranges
        self.base = base
        super().__init__({
            "notify": In(stream.Signature(RecvNotify)),
            "repost": Out(stream.Signature(RecvRepost)),
            "hostq": Out(stream.Signature(RecvNotify)),
            "wr": Out(stream.Signature(WorkRequest)),
            "wc": In(stream.Signature(WorkCompletion)),
            "mem": Out(MemBusSignature()),
            "bus": In(HostBusSignature()),
            "host_done": In(1), "host_done_qp": In(QP_INDEX_BITS),
        })

    # ------------------------------------------------------------------------------------------
    def elaborate(self, platform):
        m = Module()
        req, rsp = self.mem.req, self.mem.rsp

        # ---------------------------------------------------------------- configuration
        ctrl = Signal(2, init=0b10)
        table_base = Signal(ADDR_BITS)
        tbh = Signal(64)
        table_count = Signal(32)
        pool_base = Signal(ADDR_BITS)
        pool_to = Signal(64)
        block_size = Signal(32)
        ring_base = Signal(ADDR_BITS)
        ring_order = Signal(5)
        head_addr = Signal(ADDR_BITS)
        tail_addr = Signal(ADDR_BITS)
        max_inline = Signal(32)
        range_log2 = Signal(6)
        ranges = Array(Signal(9, name=f"range{i}") for i in range(self.n_ranges))
        nq = self.n_qp
        s_valid = Array(Signal(name=f"s_valid{q}") for q in range(nq))
        s_record = Array(Signal(name=f"s_record{q}") for q in range(nq))
        s_domain = Array(Signal(8, name=f"s_domain{q}") for q in range(nq))
        # The session words HBASE low/high, HCOUNT, QUOTA and SCRATCH live in a memory (LUT RAM
        # on the ECP5, one row per QP) read at the request's QP, instead of n_qp x 160
        # flip-flops behind QP multiplexers; USAGE, which the FSM also writes, stays registers.
        # Reset does not clear them (the host writes a session before it sets its VALID bit).
        S_OFF = (0x04, 0x08, 0x0C, 0x10, 0x18)
        m.submodules.sessions = sessions = memory.Memory(shape=32 * len(S_OFF), depth=nq,
                                                         init=[])
        sess_rp = sessions.read_port(domain="comb")    # the request's QP (addressed below)
        sess_bus = sessions.read_port(domain="comb")   # host reads
        sess_wp = sessions.write_port(granularity=32)  # host writes, one word at a time
        s_word = [sess_rp.data[32 * w:32 * (w + 1)] for w in range(len(S_OFF))]
        s_hbase, s_hcount, s_quota = Cat(s_word[0], s_word[1]), s_word[2], s_word[3]
        s_usage = Array(Signal(32, name=f"s_usage{q}") for q in range(nq))
        s_scratch = s_word[4][:ADDR_BITS]

        # ---------------------------------------------------------------- statistics
        # COUNT[k] in a memory (LUT RAM on the ECP5: 48 x 32 flip-flops behind a 48-to-1
        # multiplexer were some of the most congested logic of the ECPIX-5 build). Reset clears
        # it as it cleared the registers: ``cnt_clear`` sweeps every entry before DONE counts.
        m.submodules.counts = counts = memory.Memory(shape=32, depth=64, init=[])
        cnt_clear = Signal(range(65), init=64)     # entries still to clear after reset
        cnt_wp = counts.write_port()
        cnt_rp = counts.read_port(domain="comb")    # DONE's read-modify-write
        cnt_bus = counts.read_port(domain="comb")   # host reads of COUNT[k]
        with m.If(cnt_clear != 0):
            m.d.comb += [cnt_wp.en.eq(1), cnt_wp.addr.eq(cnt_clear - 1), cnt_wp.data.eq(0)]
            m.d.sync += cnt_clear.eq(cnt_clear - 1)
        stall_cycles = Signal(32)
        last_latency = Signal(32)
        last_cycles = Signal(32)
        occupancy = Signal(32)      # (the ring allocator's, at its last ALLOC)
        hostq_count = Signal(32)
        lat = Signal(32)            # running cycle count of the current request
        lat_open = Signal()         # no WorkRequest out yet for this request

        # ---------------------------------------------------------------- host commands
        cmd_pending = Signal()
        cmd_kind = Signal(2)
        cmd_arg = Signal(64)
        # The ring allocator (hw/kbtp/ring_alloc.py) does every ring access: ALLOC, RETURN and
        # the host commands; it owns the memory bus while this FSM waits for it or is idle.
        m.submodules.ring = ring = self.ring_cls()
        cmd_result = ring.cmd_result
        deferred = ring.deferred

        # ---------------------------------------------------------------- register bus
        bus = self.bus
        rel = Signal(32)
        m.d.comb += rel.eq(bus.addr - self.base)
        in_win = (bus.space == Space.REG) & (bus.addr >= self.base) & \
            (bus.addr < self.base + 0x1000)
        regs = {}                   # offset -> (read value, write target or None)

        def rw(off, sig):
            regs[off] = (sig, sig)

        def ro(off, val):
            regs[off] = (val, None)

        ro(0x000, Const(ENGINE_ID, 32))
        rw(0x004, ctrl)
        rw(0x008, table_base)
        rw(0x00C, tbh[:32])
        rw(0x010, tbh[32:])
        rw(0x014, table_count)
        rw(0x018, pool_base)
        rw(0x01C, pool_to[:32])
        rw(0x020, pool_to[32:])
        rw(0x024, block_size)
        rw(0x028, ring_base)
        rw(0x02C, ring_order)
        rw(0x030, head_addr)
        rw(0x034, tail_addr)
        rw(0x038, max_inline)
        rw(0x03C, range_log2)
        for i in range(self.n_ranges):
            rw(0x040 + 4 * i, ranges[i])
        rw(0x084, cmd_arg[:32])
        rw(0x088, cmd_arg[32:])
        ro(0x08C, cmd_result[:32])
        ro(0x090, cmd_result[32:])
        ro(0x0A0, stall_cycles)
        ro(0x0A4, last_latency)
        ro(0x0A8, last_cycles)
        ro(0x0AC, occupancy)
        ro(0x0B0, hostq_count)
        for q in range(nq):
            b = 0x200 + 0x40 * q
            regs[b + 0x00] = (Cat(s_valid[q], s_record[q], Const(0, 6), s_domain[q]), None)
            rw(b + 0x14, s_usage[q])

        # The FSM also writes s_usage; a host write wins in the same cycle (sync order below).
        with m.If(in_win & (bus.re | bus.we)):
            m.d.comb += [bus.ack.eq(1), bus.err.eq(1)]
            with m.Switch(rel):
                for off, (rval, wsig) in regs.items():
                    with m.Case(off):
                        m.d.comb += bus.err.eq(0)
                        with m.If(bus.re):
                            m.d.comb += bus.rdata.eq(rval)
                        if wsig is not None:
                            with m.If(bus.we):
                                m.d.sync += wsig.eq(bus.wdata)
                for w, o in enumerate(S_OFF):
                    with m.Case(*(0x200 + 0x40 * q + o for q in range(nq))):
                        sq = rel[6:12] - 0x200 // 0x40
                        m.d.comb += [bus.err.eq(0), sess_bus.addr.eq(sq),
                                     bus.rdata.eq(sess_bus.data[32 * w:32 * (w + 1)])]
                        with m.If(bus.we):
                            m.d.comb += [sess_wp.en.eq(1 << w), sess_wp.addr.eq(sq),
                                         sess_wp.data.eq(bus.wdata.replicate(len(S_OFF)))]
                with m.Case(*range(0x100, 0x100 + 4 * 48, 4)):
                    m.d.comb += [bus.err.eq(0), cnt_bus.addr.eq(rel[2:8]),
                                 bus.rdata.eq(cnt_bus.data)]
                with m.Case(0x080):
                    m.d.comb += [bus.err.eq(0),
                                 bus.rdata.eq(Cat(cmd_pending | deferred, deferred))]
                    with m.If(bus.we & ~cmd_pending & ~deferred &
                              ((bus.wdata == Cmd.TAIL_FETCHADD) | (bus.wdata == Cmd.FREE_BLOCK))):
                        m.d.sync += [cmd_pending.eq(1), cmd_kind.eq(bus.wdata[:2])]
        for q in range(nq):
            b = 0x200 + 0x40 * q
            with m.If(in_win & bus.we & (rel == b)):
                m.d.sync += [s_valid[q].eq(bus.wdata[0]), s_record[q].eq(bus.wdata[1]),
                             s_domain[q].eq(bus.wdata[8:16])]

        # ---------------------------------------------------------------- request context
        MSG_BYTES = 8 * MSG_WORDS
        cur = Signal(RecvNotify)
        msg = Signal(8 * MSG_BYTES)
        rbuf = Signal(8 * MSG_BYTES)     # read routine shift register (big-endian octets)

        def mf(struct, name, base=0):
            return _be(msg, MSG_BYTES, struct, name, base)

        version = mf(CommonHeader, "version")
        opcode = mf(CommonHeader, "opcode")
        flags = mf(CommonHeader, "flags")
        request_id = mf(CommonHeader, "request_id")
        handle = mf(CommonHeader, "handle")
        req_gen = mf(CommonHeader, "generation")
        req_status = mf(CommonHeader, "status")
        DD = CommonHeader.SIZE
        CD = DD + DataDescriptor.SIZE
        dd_stag = mf(DataDescriptor, "stag", DD)
        dd_to = mf(DataDescriptor, "tagged_offset", DD)
        dd_len = mf(DataDescriptor, "length", DD)
        cd_stag = mf(CompletionDescriptor, "stag", CD)
        cd_to = mf(CompletionDescriptor, "tagged_offset", CD)
        cd_res = mf(CompletionDescriptor, "reserved", CD)

        qp = cur.qp
        m.d.comb += sess_rp.addr.eq(qp)
        ln = cur.length
        f_inline = (flags & ReqFlags.INLINE.value) != 0
        f_seal = (flags & ReqFlags.SEAL.value) != 0
        f_record = (flags & ReqFlags.RECORD.value) != 0
        f_inval = (flags & ReqFlags.INVALIDATE.value) != 0
        f_unsealed = (flags & ReqFlags.ALLOW_UNSEALED.value) != 0
        is_load = opcode == Opcode.LOAD.value
        is_store = opcode == Opcode.STORE.value
        is_alloc = opcode == Opcode.ALLOC_STORE.value
        is_fast = is_load | is_store | is_alloc
        op_idx = Signal(2)
        m.d.comb += op_idx.eq(Mux(is_load, 0, Mux(is_store, 1, 2)))

        # Decode (host/codec.py strictness). Every check but Max Inline answers MALFORMED.
        pos = Signal(16)
        m.d.comb += pos.eq(Mux(f_record, CD + CompletionDescriptor.SIZE, CD))
        allowed = Signal(16)        # 16 bits wide so that ~allowed covers every flag bit
        m.d.comb += allowed.eq(Mux(is_load, ALLOWED_FLAGS[Opcode.LOAD],
                                   Mux(is_store, ALLOWED_FLAGS[Opcode.STORE],
                                       ALLOWED_FLAGS[Opcode.ALLOC_STORE])))
        inline_len = Signal(16)
        m.d.comb += inline_len.eq(ln - pos)
        mal = Signal()
        too_large_inline = Signal()
        m.d.comb += [
            mal.eq((version != KBTP_VERSION)
                   | ((flags & ~allowed) != 0)
                   | (~is_load & f_inline & f_inval)
                   | (req_status != 0)
                   | (ln < pos)
                   | (f_record & (cd_res != 0))
                   | ((is_load | ~f_inline) & (ln != pos))
                   | (~is_load & f_inline & ((dd_stag != 0) | (dd_to != 0)
                                             | (inline_len != dd_len)))),
            too_large_inline.eq(~is_load & f_inline & (inline_len > max_inline)),
        ]

        # Authorization.
        hidx = Signal(64)
        m.d.comb += hidx.eq(handle - tbh)
        in_table = (handle >= tbh) & (hidx < table_count)
        rng = Signal(9)
        m.d.comb += rng.eq(ranges[(hidx >> range_log2)[:max(1, (self.n_ranges - 1).bit_length())]])
        rng_ok = (hidx >> range_log2) < self.n_ranges
        readable = in_table & rng_ok & (~rng[8] | (rng[:8] == s_domain[qp]))
        hrel = Signal(64)
        m.d.comb += hrel.eq(handle - s_hbase)
        owns = (handle >= s_hbase) & (hrel < s_hcount)
        entry_addr = Signal(ADDR_BITS)
        m.d.comb += entry_addr.eq(table_base + (hidx << 4)[:ADDR_BITS])

        # Table entry (rbuf low 16 octets after a 2-word read).
        ent = Signal(128)
        e_flags = _be(ent, 16, TableEntry, "flags")
        e_gen = _be(ent, 16, TableEntry, "generation")
        e_dlen = _be(ent, 16, TableEntry, "data_length")
        e_boff = _be(ent, 16, TableEntry, "block_offset")
        e_valid = (e_flags & EntryFlags.VALID.value) != 0
        e_sealed = (e_flags & EntryFlags.SEALED.value) != 0
        stale = (req_gen != 0) & (req_gen != e_gen)
        next_gen = Signal(16)
        m.d.comb += next_gen.eq(Mux(e_gen == 0xFFFF, 1, e_gen + 1))

        # Result of the request.
        st = Signal(16)             # status
        out_gen = Signal(16)
        out_dlen = Signal(32)
        out_boff = Signal(64)
        raw = Signal()              # decode-level error: no invalidate, no record
        boff = Signal(64)           # block of this request
        baddr = Signal(ADDR_BITS)
        m.d.comb += baddr.eq(pool_base + (boff - pool_to)[:ADDR_BITS])

        # Ring (configuration and host commands go to the ring allocator).
        m.d.comb += [ring.ring_base.eq(ring_base), ring.ring_order.eq(ring_order),
                     ring.head_addr.eq(head_addr), ring.tail_addr.eq(tail_addr),
                     ring.masked.eq(ctrl[1]), ring.cmd_valid.eq(cmd_pending),
                     ring.cmd_kind.eq(cmd_kind), ring.cmd_arg.eq(cmd_arg),
                     ring.block_in.eq(boff), occupancy.eq(ring.occupancy)]
        with m.If(ring.cmd_ack):
            m.d.sync += cmd_pending.eq(0)
        with m.If(ring.stall):
            m.d.sync += stall_cycles.eq(stall_cycles + 1)

        # ---------------------------------------------------------------- read routine
        rd_addr = Signal(ADDR_BITS)
        rd_issue = Signal(4)        # words still to request
        rd_wait = Signal(4)         # responses still to come
        RET = ["DECODE", "ENTRY_CHK"]
        rd_ret = Signal(range(len(RET)))

        def read(addr, words, ret):
            return [rd_addr.eq(addr), rd_issue.eq(words), rd_wait.eq(words),
                    rd_ret.eq(RET.index(ret))]

        # ---------------------------------------------------------------- word-write routine
        wbuf = Signal(320)          # big-endian octets to write, octet 0 first
        w_addr = Signal(ADDR_BITS)
        w_left = Signal(3)
        WRET = ["WR_SEND", "WR_REC"]
        w_ret = Signal(range(len(WRET)))

        # ---------------------------------------------------------------- WR / WC routine
        wrq = Signal(WorkRequest)
        wr_id = Signal(16)
        wc_ok = Signal()
        CRET = ["LOAD_DONE", "STORE_GOT", "ALLOC_GOT", "REC_DONE", "SEND_DONE"]
        c_ret = Signal(range(len(CRET)))

        # ---------------------------------------------------------------- copy routine
        cp_src = Signal(ADDR_BITS)
        cp_dst = Signal(ADDR_BITS)
        cp_words = Signal(16)
        cp_rd = Signal(16)
        cp_wr = Signal(16)
        cp_rem = Signal(3)
        m.submodules.cpf = cpf = fifo.SyncFIFOBuffered(width=64, depth=8)

        # The latency counters run for every request.
        with m.If(lat_open | (lat != 0)):
            m.d.sync += lat.eq(lat + 1)
        with m.If(self.wr.valid & self.wr.ready & lat_open):
            m.d.sync += [last_latency.eq(lat), lat_open.eq(0)]

        def finish(status, gen=None, dlen=0, bo=0, is_raw=False):
            return [st.eq(status), out_gen.eq(0 if gen is None else gen), out_dlen.eq(dlen),
                    out_boff.eq(bo), raw.eq(is_raw)]

        m.d.comb += [self.wr.payload.eq(wrq), self.wr.payload.qp.eq(qp),
                     self.wr.payload.wr_id.eq(wr_id)]

        # Messages forwarded to the host and not yet finished there, per QP.
        at_host = [Signal(range(64), name=f"at_host{q}") for q in range(nq)]
        at_host_a = Array(at_host)
        to_host = Signal()
        for q in range(nq):
            up = to_host & (qp == q)
            down = self.host_done & (self.host_done_qp == q)
            with m.If(up & ~down):
                m.d.sync += at_host[q].eq(at_host[q] + 1)
            with m.Elif(down & ~up & (at_host[q] != 0)):
                m.d.sync += at_host[q].eq(at_host[q] - 1)
        n_qp_bits = max(1, (nq - 1).bit_length())
        notify_free = Signal()
        m.d.comb += notify_free.eq(at_host_a[self.notify.payload.qp[:n_qp_bits]] == 0)

        def ring_start(state, op, then):
            """A state that starts a ring allocator operation (ALLOC, RETURN) and waits for
            the allocator to take it (it may still be serving a host command)."""
            with m.State(state):
                m.d.comb += [ring.start.eq(1), ring.op.eq(op), ring.grant.eq(1)]
                with m.If(ring.ack):
                    m.next = then

        with m.FSM() as fsm:
            with m.State("IDLE"):
                # Host commands first, then a message, then a deferred free's retry (the ring
                # allocator takes the commands and the retry when granted).
                with m.If(~cmd_pending & ring.idle & self.notify.valid & notify_free):
                    m.d.comb += self.notify.ready.eq(1)
                    m.d.sync += [cur.eq(self.notify.payload), lat.eq(0), lat_open.eq(1)]
                    m.next = "NOTIFIED"
                with m.Else():
                    m.d.comb += ring.grant.eq(1)

            with m.State("NOTIFIED"):
                with m.If(~ctrl[0] | ~s_valid[qp] | (ln < CommonHeader.SIZE)):
                    m.next = "HOSTQ"
                with m.Else():
                    m.d.sync += read(cur.addr, MSG_WORDS, "DECODE")
                    m.next = "READ"

            with m.State("HOSTQ"):
                m.d.comb += [self.hostq.valid.eq(1), self.hostq.payload.eq(cur)]
                with m.If(self.hostq.ready):
                    m.d.comb += to_host.eq(1)
                    m.d.sync += [hostq_count.eq(hostq_count + 1), lat_open.eq(0), lat.eq(0)]
                    m.next = "IDLE"

            with m.State("READ"):
                read_words(m, self.mem, rd_addr, rd_issue, rd_wait, rbuf, rd_ret, RET)

            with m.State("DECODE"):
                m.d.sync += msg.eq(rbuf)
                m.next = "DISPATCH"

            with m.State("DISPATCH"):
                with m.If(~is_fast):
                    m.next = "HOSTQ"
                with m.Elif(mal):
                    m.d.sync += finish(Status.MALFORMED.value, is_raw=True)
                    m.next = "COMPLETE"
                with m.Elif(too_large_inline):
                    m.d.sync += finish(Status.TOO_LARGE.value, is_raw=True)
                    m.next = "COMPLETE"
                with m.Elif(f_record & f_inval & s_record[qp]):
                    # A Write with Immediate cannot invalidate (model Readings 9).
                    m.d.sync += finish(Status.MALFORMED.value, is_raw=True)
                    m.next = "COMPLETE"
                with m.Elif(Mux(is_load, ~readable, ~owns)):
                    m.d.sync += finish(Status.INVALID_HANDLE.value)
                    m.next = "COMPLETE"
                with m.Else():
                    m.d.sync += read(entry_addr, 2, "ENTRY_CHK")
                    m.next = "READ"

            with m.State("ENTRY_CHK"):
                m.d.sync += [ent.eq(rbuf[:128]), boff.eq(_be(rbuf[:128], 16, TableEntry,
                                                             "block_offset"))]
                m.next = "ENTRY_CHK2"

            with m.State("ENTRY_CHK2"):
                g = e_gen
                with m.If(is_load):
                    with m.If(stale):
                        m.d.sync += finish(Status.STALE_GENERATION.value, g)
                        m.next = "COMPLETE"
                    with m.Elif(~e_valid):
                        m.d.sync += finish(Status.NOT_VALID.value, g)
                        m.next = "COMPLETE"
                    with m.Elif(~e_sealed & ~f_unsealed):
                        m.d.sync += finish(Status.NOT_SEALED.value, g)
                        m.next = "COMPLETE"
                    with m.Elif(e_dlen > dd_len):
                        m.d.sync += finish(Status.TOO_LARGE.value, g)
                        m.next = "COMPLETE"
                    with m.Elif(e_dlen == 0):
                        m.d.sync += finish(Status.OK.value, g, 0, e_boff)
                        m.next = "COMPLETE"
                    with m.Else():
                        m.d.sync += [wrq.op.eq(WrOp.WRITE), wrq.rkey.eq(dd_stag),
                                     wrq.va.eq(dd_to), wrq.length.eq(e_dlen),
                                     wrq.laddr.eq(baddr), c_ret.eq(CRET.index("LOAD_DONE"))]
                        m.next = "WR_ISSUE"
                with m.Else():
                    with m.If(dd_len > block_size):
                        m.d.sync += finish(Status.TOO_LARGE.value, g)
                        m.next = "COMPLETE"
                    with m.Elif(stale):
                        m.d.sync += finish(Status.STALE_GENERATION.value, g)
                        m.next = "COMPLETE"
                    with m.Elif(is_store & ~e_valid):
                        m.d.sync += finish(Status.NOT_VALID.value, g)
                        m.next = "COMPLETE"
                    with m.Elif(is_store & e_sealed):
                        m.d.sync += finish(Status.SEALED.value, g)
                        m.next = "COMPLETE"
                    with m.Elif(is_store):
                        m.next = "OBTAIN"
                    with m.Elif(e_valid):
                        m.d.sync += finish(Status.ALREADY_BOUND.value, g)
                        m.next = "COMPLETE"
                    with m.Elif(s_usage[qp] >= s_quota):
                        m.d.sync += finish(Status.NO_SPACE.value, g)
                        m.next = "COMPLETE"
                    with m.Else():
                        m.next = "RING_ALLOC"

            # -------- ALLOC_STORE: the ring allocator takes a block (or finds the ring empty)
            ring_start("RING_ALLOC", RingOp.ALLOC, "RING_ALLOC_WAIT")

            with m.State("RING_ALLOC_WAIT"):
                m.d.comb += ring.grant.eq(1)
                with m.If(ring.done):
                    with m.If(ring.empty):
                        m.d.sync += finish(Status.NO_SPACE.value, e_gen)
                        m.next = "COMPLETE"
                    with m.Else():
                        m.d.sync += [boff.eq(ring.block), s_usage[qp].eq(s_usage[qp] + 1)]
                        m.next = "OBTAIN"

            # -------- STORE / ALLOC_STORE: get the data into the block
            with m.State("OBTAIN"):
                with m.If(dd_len == 0):
                    m.next = "AFTER_DATA"
                with m.Elif(f_inline):
                    m.d.sync += [cp_src.eq(cur.addr + pos), cp_dst.eq(baddr),
                                 cp_words.eq((dd_len + 7) >> 3), cp_rd.eq(0), cp_wr.eq(0),
                                 cp_rem.eq(dd_len[:3])]
                    m.next = "COPY"
                with m.Else():
                    m.d.sync += [wrq.op.eq(WrOp.READ), wrq.rkey.eq(dd_stag), wrq.va.eq(dd_to),
                                 wrq.length.eq(dd_len), wrq.laddr.eq(baddr),
                                 c_ret.eq(Mux(is_store, CRET.index("STORE_GOT"),
                                              CRET.index("ALLOC_GOT")))]
                    m.next = "WR_ISSUE"

            with m.State("AFTER_DATA"):
                m.next = "STORE_ENTRY"
                with m.If(is_alloc):
                    m.next = "ALLOC_ENTRY"

            with m.State("COPY"):
                words_left_rd = cp_rd != cp_words
                inflight = cp_rd - cp_wr
                last = cp_wr == cp_words - 1
                strb = Mux(last & (cp_rem != 0), (Const(1, 9) << cp_rem) - 1, 0xFF)
                m.d.comb += [rsp.ready.eq(cpf.w_rdy), cpf.w_en.eq(rsp.valid),
                             cpf.w_data.eq(rsp.payload.rdata)]
                with m.If(cpf.r_rdy):
                    m.d.comb += [req.valid.eq(1), req.payload.we.eq(1),
                                 req.payload.addr.eq(cp_dst + (cp_wr << 3)),
                                 req.payload.wdata.eq(cpf.r_data), req.payload.wstrb.eq(strb),
                                 cpf.r_en.eq(req.ready)]
                    with m.If(req.ready):
                        m.d.sync += cp_wr.eq(cp_wr + 1)
                        with m.If(last):
                            m.next = "AFTER_DATA"
                with m.Elif(words_left_rd & (inflight < 8)):
                    m.d.comb += [req.valid.eq(1), req.payload.we.eq(0),
                                 req.payload.addr.eq(cp_src + (cp_rd << 3))]
                    with m.If(req.ready):
                        m.d.sync += cp_rd.eq(cp_rd + 1)

            with m.State("STORE_ENTRY"):
                # Data Length (entry octets 4..7), then SEALED if asked (octets 0..1).
                m.d.comb += [req.valid.eq(1), req.payload.addr.eq(entry_addr),
                             req.payload.we.eq(1),
                             req.payload.wdata.eq(bswap64(Cat(dd_len, Const(0, 32)))),
                             req.payload.wstrb.eq(0xF0)]
                with m.If(req.ready):
                    m.next = "STORE_SEAL"
                    with m.If(~f_seal):
                        m.d.sync += finish(Status.OK.value, e_gen, dd_len, boff)
                        m.next = "COMPLETE"

            with m.State("STORE_SEAL"):
                m.d.comb += [req.valid.eq(1), req.payload.addr.eq(entry_addr),
                             req.payload.we.eq(1),
                             req.payload.wdata.eq(bswap64(
                                 Cat(Const(0, 48), e_flags | EntryFlags.SEALED.value))),
                             req.payload.wstrb.eq(0x03)]
                with m.If(req.ready):
                    m.d.sync += finish(Status.OK.value, e_gen, dd_len, boff)
                    m.next = "COMPLETE"

            # Entry bind: Data Length + Block Offset before Flags + Generation.
            with m.State("ALLOC_ENTRY"):
                m.d.comb += [req.valid.eq(1), req.payload.addr.eq(entry_addr),
                             req.payload.we.eq(1),
                             req.payload.wdata.eq(bswap64(Cat(dd_len, Const(0, 32)))),
                             req.payload.wstrb.eq(0xF0)]
                with m.If(req.ready):
                    m.next = "ALLOC_ENTRY_BO"

            with m.State("ALLOC_ENTRY_BO"):
                m.d.comb += [req.valid.eq(1), req.payload.addr.eq(entry_addr + 8),
                             req.payload.we.eq(1), req.payload.wdata.eq(bswap64(boff)),
                             req.payload.wstrb.eq(0xFF)]
                with m.If(req.ready):
                    m.next = "ALLOC_ENTRY_FG"

            with m.State("ALLOC_ENTRY_FG"):
                nflags = Signal(16)
                m.d.comb += nflags.eq(Mux(f_seal, EntryFlags.VALID.value | EntryFlags.SEALED.value,
                                          EntryFlags.VALID.value))
                m.d.comb += [req.valid.eq(1), req.payload.addr.eq(entry_addr),
                             req.payload.we.eq(1),
                             req.payload.wdata.eq(bswap64(Cat(Const(0, 32), next_gen,
                                                               nflags))),
                             req.payload.wstrb.eq(0x0F)]
                with m.If(req.ready):
                    m.d.sync += finish(Status.OK.value, next_gen, dd_len, boff)
                    m.next = "COMPLETE"

            # -------- WorkRequest out, WorkCompletion back
            with m.State("WR_ISSUE"):
                m.d.comb += self.wr.valid.eq(1)
                with m.If(self.wr.ready):
                    m.next = "WC_WAIT"

            with m.State("WC_WAIT"):
                m.d.comb += self.wc.ready.eq(1)
                with m.If(self.wc.valid):
                    m.d.sync += [wc_ok.eq(self.wc.payload.status == WcStatus.OK),
                                 wr_id.eq(wr_id + 1)]
                    with m.Switch(c_ret):
                        for i, name in enumerate(CRET):
                            with m.Case(i):
                                m.next = name

            with m.State("LOAD_DONE"):
                with m.If(wc_ok):
                    m.d.sync += finish(Status.OK.value, e_gen, e_dlen, e_boff)
                with m.Else():
                    m.d.sync += finish(Status.INTERNAL.value, e_gen)
                m.next = "COMPLETE"

            with m.State("STORE_GOT"):
                with m.If(wc_ok):
                    m.next = "STORE_ENTRY"
                with m.Else():
                    m.d.sync += finish(Status.INTERNAL.value, e_gen)
                    m.next = "COMPLETE"

            with m.State("ALLOC_GOT"):
                with m.If(wc_ok):
                    m.next = "ALLOC_ENTRY"
                with m.Else():
                    # The model returns the block to the ring (Readings 10): the ring allocator
                    # writes it into its slot before we complete.
                    m.next = "RING_RETURN"

            ring_start("RING_RETURN", RingOp.RETURN, "RING_RETURN_WAIT")

            with m.State("RING_RETURN_WAIT"):
                m.d.comb += ring.grant.eq(1)
                with m.If(ring.done):
                    m.d.sync += [s_usage[qp].eq(s_usage[qp] - 1),
                                 finish(Status.INTERNAL.value, e_gen)]
                    m.next = "COMPLETE"

            # -------- completion: record by WRITE_IMM, else COMPLETION Send
            with m.State("COMPLETE"):
                with m.If(~raw & f_record & s_record[qp]):
                    R = CompletionRecord
                    rec = Signal(8 * R.SIZE)
                    m.d.comb += [_be(rec, R.SIZE, R, "request_id").eq(request_id),
                                 _be(rec, R.SIZE, R, "status").eq(st),
                                 _be(rec, R.SIZE, R, "generation").eq(out_gen),
                                 _be(rec, R.SIZE, R, "data_length").eq(out_dlen),
                                 _be(rec, R.SIZE, R, "block_offset").eq(out_boff)]
                    m.d.sync += [wbuf.eq(Cat(Const(0, 320 - 8 * R.SIZE), rec)),
                                 w_addr.eq(s_scratch), w_left.eq(R.SIZE // 8),
                                 w_ret.eq(WRET.index("WR_REC"))]
                    m.next = "WRITE_WORDS"
                with m.Else():
                    m.next = "SEND_BUILD"

            with m.State("SEND_BUILD"):
                H, B = CommonHeader, CompletionBody
                T = H.SIZE + B.SIZE
                cm = Signal(8 * T)
                m.d.comb += [_be(cm, T, H, "version").eq(KBTP_VERSION),
                             _be(cm, T, H, "opcode").eq(Opcode.COMPLETION.value),
                             _be(cm, T, H, "request_id").eq(request_id),
                             _be(cm, T, H, "handle").eq(handle),
                             _be(cm, T, H, "generation").eq(out_gen),
                             _be(cm, T, H, "status").eq(st),
                             _be(cm, T, B, "data_length", H.SIZE).eq(out_dlen),
                             _be(cm, T, B, "block_offset", H.SIZE).eq(out_boff)]
                m.d.sync += [wbuf.eq(cm), w_addr.eq(s_scratch), w_left.eq(T // 8),
                             w_ret.eq(WRET.index("WR_SEND"))]
                m.next = "WRITE_WORDS"

            with m.State("WRITE_WORDS"):
                m.d.comb += [req.valid.eq(1), req.payload.addr.eq(w_addr), req.payload.we.eq(1),
                             req.payload.wdata.eq(bswap64(wbuf[-64:])),
                             req.payload.wstrb.eq(0xFF)]
                with m.If(req.ready):
                    m.d.sync += [wbuf.eq(Cat(Const(0, 64), wbuf[:-64])), w_addr.eq(w_addr + 8),
                                 w_left.eq(w_left - 1)]
                    with m.If(w_left == 1):
                        with m.Switch(w_ret):
                            for i, name in enumerate(WRET):
                                with m.Case(i):
                                    m.next = name

            with m.State("WR_REC"):
                m.d.sync += [wrq.op.eq(WrOp.WRITE_IMM), wrq.rkey.eq(cd_stag), wrq.va.eq(cd_to),
                             wrq.length.eq(CompletionRecord.SIZE),
                             wrq.laddr.eq(s_scratch), wrq.imm.eq(request_id[:32]),
                             c_ret.eq(CRET.index("REC_DONE"))]
                m.next = "WR_ISSUE"

            with m.State("REC_DONE"):
                # A failed record write falls back to a COMPLETION Send (model Readings 10).
                m.next = "SEND_BUILD"
                with m.If(wc_ok):
                    m.next = "DONE"

            with m.State("WR_SEND"):
                inv = ~raw & f_inval
                m.d.sync += [wrq.op.eq(Mux(inv, WrOp.SEND_INV, WrOp.SEND)),
                             wrq.inv_rkey.eq(Mux(inv, dd_stag, 0)), wrq.rkey.eq(0), wrq.va.eq(0),
                             wrq.length.eq(CommonHeader.SIZE + CompletionBody.SIZE),
                             wrq.laddr.eq(s_scratch), c_ret.eq(CRET.index("SEND_DONE"))]
                m.next = "WR_ISSUE"

            with m.State("SEND_DONE"):
                m.next = "DONE"

            with m.State("DONE"):
                k = Signal(6)
                m.d.comb += k.eq(Cat(st[:4], op_idx))
                m.d.comb += [self.repost.valid.eq(cnt_clear == 0),
                             self.repost.payload.qp.eq(qp), cnt_rp.addr.eq(k)]
                with m.If(self.repost.valid & self.repost.ready):
                    m.d.comb += [cnt_wp.en.eq(1), cnt_wp.addr.eq(k),
                                 cnt_wp.data.eq(cnt_rp.data + 1)]
                    m.d.sync += [last_cycles.eq(lat),
                                 lat.eq(0), lat_open.eq(0)]
                    m.next = "IDLE"

        # The memory bus belongs to the ring allocator while this FSM is idle or waits for it
        # (no access of either is in flight when it changes hands: both finish their reads
        # before leaving those states, and the FSM leaves IDLE only when the allocator is idle).
        ring_owns = (fsm.ongoing("IDLE") | fsm.ongoing("RING_ALLOC") |
                     fsm.ongoing("RING_ALLOC_WAIT") | fsm.ongoing("RING_RETURN") |
                     fsm.ongoing("RING_RETURN_WAIT"))
        m.d.comb += ring.mem.rsp.payload.eq(rsp.payload)
        with m.If(ring_owns):
            m.d.comb += [req.valid.eq(ring.mem.req.valid), req.payload.eq(ring.mem.req.payload),
                         ring.mem.req.ready.eq(req.ready), ring.mem.rsp.valid.eq(rsp.valid),
                         rsp.ready.eq(ring.mem.rsp.ready)]

        # Host register writes take precedence over the FSM's usage updates (written last).
        for q in range(nq):
            with m.If(in_win & bus.we & (rel == 0x200 + 0x40 * q + 0x14)):
                m.d.sync += s_usage[q].eq(bus.wdata)
        return m

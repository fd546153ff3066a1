# Ref: draft KBTP §Block Table (entry layout; "Data Length + Block Offset before Flags +
#      Generation"), §Block Mapped Store / §Block Unmapped Store (inline data), §Completion;
#      docs/layouts.md; hw/iface.py (memory bus, WorkRequest / WorkCompletion).
"""The KBTP engine's data movement: small units, each started by the engine's FSM with a
one-cycle ``start`` and reporting the end with a one-cycle ``done``.

* :class:`WordReader`: reads up to ``max_words`` 8-octet words (the message, a table entry).
* :class:`InlineCopy`: copies an inline payload from the receive buffer into a block.
* :class:`EntryWriter`: the table entry update of a STORE or an ALLOC_STORE, in the draft's
  order.
* :class:`BufferWriter`: writes a buffer of words (a COMPLETION or a record into SCRATCH).
* :class:`WorkIssuer`: WorkRequests out, their WorkCompletions back (waited for or not).
* :class:`LoadLocks`: the blocks LOADs are still sending.

Each memory master leaves ``mem.req.valid`` low while idle and answers whatever response it is
shown: the engine connects a master to its bus only in the states that run it.
"""

from amaranth.hdl import Array, Cat, Const, Module, Mux, Signal
from amaranth.lib import fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.headers import EntryFlags
from hw.iface import ADDR_BITS, MemBusSignature, WcStatus, WorkCompletion, WorkRequest, WrOp
from hw.lib.membus import bswap64

__all__ = ["WordReader", "InlineCopy", "EntryWriter", "BufferWriter", "WorkIssuer", "LoadLocks",
           "WR_SYNC", "WR_SCRATCH", "WR_LOCK", "LOCK_BITS", "WR_CTX", "CTX_BITS", "WR_CHUNK",
           "READ_BYTES_BITS", "READ_DEPTH", "READ_DEPTH_BITS", "read_chunk_for"]


def _write(m, req, addr, wdata, wstrb):
    """Comb statements of a word write request."""
    m.d.comb += [req.valid.eq(1), req.payload.addr.eq(addr), req.payload.we.eq(1),
                 req.payload.wdata.eq(wdata), req.payload.wstrb.eq(wstrb)]


class WordReader(wiring.Component):
    """Read ``words`` words from ``addr`` on; ``data`` is what was read, big-endian octets (the
    last word in the low 64 bits), valid from the cycle after ``done``.

    Ports
    -----
    start : In(1), addr : In(ADDR_BITS), words : In(range(max_words + 1))
    done : Out(1)       with the last response
    data : Out(64 * max_words)
    mem : Out(MemBusSignature())
    """

    def __init__(self, max_words):
        super().__init__({"start": In(1), "addr": In(ADDR_BITS),
                          "words": In(range(max_words + 1)), "done": Out(1),
                          "data": Out(64 * max_words), "mem": Out(MemBusSignature())})

    def elaborate(self, platform):
        m = Module()
        req, rsp = self.mem.req, self.mem.rsp
        addr = Signal(ADDR_BITS)
        issue = Signal.like(self.words)     # words still to request
        wait = Signal.like(self.words)      # responses still to come
        with m.If(self.start):
            m.d.sync += [addr.eq(self.addr), issue.eq(self.words), wait.eq(self.words)]
        m.d.comb += [req.valid.eq(issue != 0), req.payload.addr.eq(addr), req.payload.we.eq(0),
                     rsp.ready.eq(1)]
        with m.If(req.valid & req.ready):
            m.d.sync += [issue.eq(issue - 1), addr.eq(addr + 8)]
        with m.If(rsp.valid):
            m.d.sync += [self.data.eq(Cat(bswap64(rsp.payload.rdata), self.data[:-64])),
                         wait.eq(wait - 1)]
            m.d.comb += self.done.eq(wait == 1)
        return m


class InlineCopy(wiring.Component):
    """Copy ``length`` octets (> 0) from word address ``src`` to word address ``dst`` in bursts
    of ``burst`` words: up to ``burst`` reads, then the writes of the words they returned, and
    again; the last word's octets past the end are not written.

    Why bursts and not one write as soon as each word is back: in DRAM (boards/dram.py, the
    pool in DDR3) the receive buffer and the block may be two rows of one bank, and alternating
    single reads and writes then opens a row for every word; a burst opens each row once per
    ``burst`` words. In block RAM both orders move one word every two cycles. Each burst waits
    once for the read latency (18 core cycles for the ECPIX-5 DDR3 at 41.67 MHz). Where the
    memory's command rate sets the pace that wait matters little: 4 KiB in the DDR3 model
    (LiteDRAM's rate, boards/dram.py) takes 2,146 core cycles in bursts of 16 when the receive
    buffer and the block share a bank, 1,966 when they do not; in block RAM 1,024, a word every
    two cycles (tests/hw/lib/test_dram_stream.py). A variant that reads a burst of 32 ahead of
    its writes (2026-12-07) took 2,031 and 1,972: not worth a new netlist on the board.

    Ports
    -----
    start : In(1), src, dst : In(ADDR_BITS), length : In(32)
    done : Out(1)       with the last write
    busy : Out(1)       from the cycle after ``start`` to the cycle after ``done``
    mem : Out(MemBusSignature())
    """

    def __init__(self, burst=16):
        self.burst = burst
        super().__init__({"start": In(1), "src": In(ADDR_BITS), "dst": In(ADDR_BITS),
                          "length": In(32), "done": Out(1), "busy": Out(1),
                          "mem": Out(MemBusSignature())})

    def elaborate(self, platform):
        m = Module()
        req, rsp = self.mem.req, self.mem.rsp
        m.submodules.fifo = cpf = fifo.SyncFIFOBuffered(width=64, depth=self.burst)
        busy = self.busy
        reading = Signal()          # the read half of a burst (else its write half)
        src = Signal(ADDR_BITS)
        dst = Signal(ADDR_BITS)
        words = Signal(16)
        rd = Signal(16)             # words read
        wr = Signal(16)             # words written
        rem = Signal(3)             # octets of the last word, 0: all 8
        with m.If(self.start):
            m.d.sync += [busy.eq(1), reading.eq(1), src.eq(self.src), dst.eq(self.dst),
                         words.eq((self.length + 7) >> 3), rd.eq(0), wr.eq(0),
                         rem.eq(self.length[:3])]
        last = wr == words - 1
        strb = Mux(last & (rem != 0), (Const(1, 9) << rem) - 1, 0xFF)
        with m.If(busy):
            m.d.comb += [rsp.ready.eq(cpf.w_rdy), cpf.w_en.eq(rsp.valid),
                         cpf.w_data.eq(rsp.payload.rdata)]
            with m.If(reading):
                # There is always a word to read here (a copy has one; a burst ends with the
                # last word read).
                m.d.comb += [req.valid.eq(1), req.payload.we.eq(0),
                             req.payload.addr.eq(src + (rd << 3))]
                with m.If(req.ready):
                    m.d.sync += rd.eq(rd + 1)
                    with m.If((rd + 1 == words) | (rd + 1 - wr == self.burst)):
                        m.d.sync += reading.eq(0)
            with m.Elif(cpf.r_rdy):
                _write(m, req, dst + (wr << 3), cpf.r_data, strb)
                m.d.comb += cpf.r_en.eq(req.ready)
                with m.If(req.ready):
                    m.d.sync += wr.eq(wr + 1)
                    with m.If(last):
                        m.d.sync += busy.eq(0)
                        m.d.comb += self.done.eq(1)
                    with m.Elif(wr + 1 == rd):
                        m.d.sync += reading.eq(1)       # the burst is written: read on
        return m


class EntryWriter(wiring.Component):
    """Write the table entry at ``addr`` after the data of a STORE (Data Length, then SEALED if
    ``seal``) or of an ALLOC_STORE (``alloc``: Data Length and Block Offset, then Flags VALID
    (+ SEALED) and Generation ``next_gen``). The inputs are held from ``start`` to ``done``.

    Ports
    -----
    start : In(1), alloc : In(1), seal : In(1), addr : In(ADDR_BITS)
    dlen : In(32), boff : In(64), flags : In(16) (the entry's), next_gen : In(16)
    le : In(1)          ADDR_LE structures: the Block Offset goes little-endian
    done : Out(1)       with the last write
    mem : Out(MemBusSignature())
    """

    def __init__(self):
        super().__init__({"start": In(1), "alloc": In(1), "seal": In(1),
                          "addr": In(ADDR_BITS), "dlen": In(32), "boff": In(64),
                          "flags": In(16), "next_gen": In(16), "le": In(1), "done": Out(1),
                          "mem": Out(MemBusSignature())})

    def elaborate(self, platform):
        m = Module()
        req, addr = self.mem.req, self.addr
        with m.FSM():
            with m.State("IDLE"):
                with m.If(self.start):
                    m.next = "DATA_LENGTH"

            with m.State("DATA_LENGTH"):        # entry octets 4..7
                _write(m, req, addr, bswap64(Cat(self.dlen, Const(0, 32))), 0xF0)
                with m.If(req.ready):
                    with m.If(self.alloc):
                        m.next = "BLOCK_OFFSET"
                    with m.Elif(self.seal):
                        m.next = "SEAL"
                    with m.Else():
                        m.d.comb += self.done.eq(1)
                        m.next = "IDLE"

            with m.State("SEAL"):               # entry octets 0..1
                _write(m, req, addr, bswap64(Cat(Const(0, 48),
                                                 self.flags | EntryFlags.SEALED.value)), 0x03)
                with m.If(req.ready):
                    m.d.comb += self.done.eq(1)
                    m.next = "IDLE"

            with m.State("BLOCK_OFFSET"):
                _write(m, req, addr + 8, Mux(self.le, self.boff, bswap64(self.boff)), 0xFF)
                with m.If(req.ready):
                    m.next = "FLAGS_GENERATION"

            with m.State("FLAGS_GENERATION"):   # entry octets 0..3, last
                nflags = Signal(16)
                m.d.comb += nflags.eq(Mux(self.seal,
                                          EntryFlags.VALID.value | EntryFlags.SEALED.value,
                                          EntryFlags.VALID.value))
                _write(m, req, addr, bswap64(Cat(Const(0, 32), self.next_gen, nflags)), 0x0F)
                with m.If(req.ready):
                    m.d.comb += self.done.eq(1)
                    m.next = "IDLE"
        return m


class BufferWriter(wiring.Component):
    """Write the first ``words`` words of ``data`` (big-endian octets, octet 0 on top) to
    ``addr`` on, one word per cycle the bus allows. ``data`` is taken at ``start``.

    Ports
    -----
    start : In(1), addr : In(ADDR_BITS), words : In(range(max_words + 1))
    data : In(64 * max_words)
    done : Out(1)       with the last write
    mem : Out(MemBusSignature())
    """

    def __init__(self, max_words):
        super().__init__({"start": In(1), "addr": In(ADDR_BITS),
                          "words": In(range(max_words + 1)), "data": In(64 * max_words),
                          "done": Out(1), "mem": Out(MemBusSignature())})

    def elaborate(self, platform):
        m = Module()
        req = self.mem.req
        buf = Signal.like(self.data)
        addr = Signal(ADDR_BITS)
        left = Signal.like(self.words)
        fire = Signal()
        with m.If(left != 0):
            _write(m, req, addr, bswap64(buf[-64:]), 0xFF)
            m.d.comb += [fire.eq(req.ready), self.done.eq(req.ready & (left == 1))]
        # (one load-or-shift mux in front of the buffer)
        with m.If(self.start | fire):
            m.d.sync += buf.eq(Mux(self.start, self.data, Cat(Const(0, 64), buf[:-64])))
        with m.If(self.start):
            m.d.sync += [addr.eq(self.addr), left.eq(self.words)]
        with m.Elif(fire):
            m.d.sync += [addr.eq(addr + 8), left.eq(left - 1)]
        return m


#: Tags in a WorkRequest's ``wr_id`` (bit 15 is the target's: host work requests,
#: hw/target/target.py). They say what its WorkCompletion does when it comes back.
WR_SYNC = 1 << 14       # the issuer waits for it (a record: a failed one falls back to a Send)
WR_SCRATCH = 1 << 13    # it carries a SCRATCH slot of its QP: the completion frees the oldest
WR_LOCK = 1 << 12       # a LOAD's WRITE: the completion frees LoadLocks entry wr_id[:LOCK_BITS]
WR_CTX = 1 << 11        # a store's RDMA READ: the completion resolves request context wr_id[:CTX_BITS]
WR_CHUNK = 1 << 10      # a part of a store's RDMA READ other than its last (WorkIssuer): no tag
LOCK_BITS = 4
CTX_BITS = 3
#: Width of the count of READ data octets out (2**CTX_BITS READs of up to 2**32 - 1).
READ_BYTES_BITS = 32 + CTX_BITS
#: Width of WorkIssuer's count of READ requests out.
READ_DEPTH_BITS = 5
#: READ requests the engine keeps out at once (WorkIssuer ``read_depth``): what the target's CM
#: asks of every initiator's responder resources (host/cm.py CmServer). 8, as many as the
#: engine's request contexts (hw/kbtp/context.py), so small READ-stores overlap as before; the
#: window already kept large ones to 6 parts of 4 KiB (ECPIX-5) or 16 KiB (10 Gb/s). Before it,
#: up to 14 could be out. The initiator here (host/initiator.py, on rxe) offers 16.
READ_DEPTH = 8


class WorkIssuer(wiring.Component):
    """Send the WorkRequest given on ``cmd`` (its ``qp`` is replaced by the port ``qp``; its
    ``wr_id`` carries the tags above); for a ``WR_SYNC`` request wait for its WorkCompletion,
    for any other report ``done`` (with ``ok``) as soon as the requester has taken it.

    Why asynchronous: on one RC QP the initiator sees the WRITE of a LOAD before the Send that
    follows it, and the engine needs no result of either, so neither blocks the next request
    (issue 20). WorkCompletions are taken whenever they come (every state); those of requests
    nobody waits for free what their tags name (``release_*``) and count failures
    (``async_err``).

    The READ window (``read_window`` > 0). A store's RDMA READ (``WR_CTX``) goes out in parts
    of at most ``read_chunk`` octets, each its own READ request, in order, and a part goes only
    while the data octets of the READ parts whose WorkCompletions have not come back
    (``read_bytes``) and its own fit the window (or none is out). Every part but the last is
    tagged ``WR_CHUNK`` (its WorkCompletion only returns its octets to the window); the last
    carries the READ's own ``wr_id``, so the context is resolved when the whole READ has
    landed (one RC QP completes in order, and after a failed part the QP flushes the rest:
    the last part then fails too). ``done`` comes when the last part is taken.

    Why parts: the window keeps the READ responses out no larger than the MAC's receive
    buffer holds. With whole READs, a READ larger than half the window went out alone, and the
    next one only after the last response of the one before had passed the receive path's
    store-and-forward stages (the MAC's buffer, the ICRC check): a gap on the wire of about two
    response packets, which made READ-stores of 16 KiB at path MTU 4096 11.7 % slower than at
    MTU 1024 on the ECPIX-5 (25.8 % at width 8; issue 21). With parts of a quarter of the
    window, the window always holds the next parts while a part's last packet drains.
    (Every part is one more READ request to the initiator, on the direction a READ-store
    hardly uses, and one more of its responder resources while out.)

    The READ depth (``read_depth`` > 0, with a window). At most that many READ requests (parts
    or whole READs) are out at once: the initiator's responder resources, which the target's CM
    holds every connection to at least (host/cm.py; the REP's initiator depth). A responder
    facing more READs than it has resources for may answer with a NAK (Invalid Request), which
    ends the connection: a requester keeps within the responder resources the connection
    negotiated.

    Parameters
    ----------
    read_window : int
        0: no window and no parts; else the data octets of READs out at once.
    read_chunk : int or None
        Octets of a READ part (a power of two); None: the largest power of two at most a
        quarter of ``read_window``.
    read_depth : int
        READ requests out at once (0: no limit); only with a window.

    Ports
    -----
    cmd : In(stream.Signature(WorkRequest))     taken when idle
    qp : In(QP_INDEX_BITS)
    wr : Out(stream.Signature(WorkRequest)), wc : In(stream.Signature(WorkCompletion))
    done : Out(1)       the WorkCompletion of a WR_SYNC request, or the hand-over of another
                        (of a READ: of its last part); ``ok``: its status was OK (held until
                        the next)
    issued : Out(1)     the requester took the request shown on ``wr``
    release_lock : Out(1), lock_idx : Out(LOCK_BITS)
    release_scratch : Out(1), release_qp : Out(QP_INDEX_BITS)
    release_ctx : Out(1), ctx_idx : Out(CTX_BITS), ctx_ok : Out(1)
                        the WorkCompletion of a store's READ (``WR_CTX``) and its status: the
                        engine's back stage waits for it, not the issuer
    async_err : Out(1)  a WorkCompletion nobody waits for failed (a READ part's does not
                        count: the READ's last part fails with it)
    read_bytes : Out(READ_BYTES_BITS)   data octets of the READ parts out (0 with no window)
    reads_out : Out(READ_DEPTH_BITS)    READ requests out (parts or whole; 0 with no window)
    """

    def __init__(self, read_window=0, read_chunk=None, read_depth=0):
        if read_window and read_chunk is None:
            read_chunk = read_chunk_for(read_window)
        if read_window and (read_chunk < 1 or read_chunk & (read_chunk - 1)):
            raise ValueError(f"read_chunk must be a power of two, not {read_chunk}")
        if not 0 <= read_depth < 1 << READ_DEPTH_BITS:
            raise ValueError(f"read_depth {read_depth} is not within "
                             f"0..{(1 << READ_DEPTH_BITS) - 1}")
        self.read_window, self.read_chunk, self.read_depth = read_window, read_chunk, read_depth
        qp = WorkRequest.members["qp"]
        super().__init__({"cmd": In(stream.Signature(WorkRequest)), "qp": In(qp),
                          "wr": Out(stream.Signature(WorkRequest)),
                          "wc": In(stream.Signature(WorkCompletion)),
                          "done": Out(1), "ok": Out(1), "issued": Out(1),
                          "release_lock": Out(1), "lock_idx": Out(LOCK_BITS),
                          "release_scratch": Out(1), "release_qp": Out(qp),
                          "release_ctx": Out(1), "ctx_idx": Out(CTX_BITS), "ctx_ok": Out(1),
                          "async_err": Out(1), "read_bytes": Out(READ_BYTES_BITS),
                          "reads_out": Out(READ_DEPTH_BITS)})

    def elaborate(self, platform):
        m = Module()
        wrq = Signal(WorkRequest)
        m.d.comb += [self.wr.payload.eq(wrq), self.wr.payload.qp.eq(self.qp)]
        wc, tag = self.wc.payload, self.wc.payload.wr_id
        good = wc.status == WcStatus.OK
        sync = tag & WR_SYNC != 0
        ctx = tag & WR_CTX != 0
        part = tag & WR_CHUNK != 0
        m.d.comb += [self.wc.ready.eq(1),
                     self.release_lock.eq(self.wc.valid & (tag & WR_LOCK != 0)),
                     self.lock_idx.eq(tag[:LOCK_BITS]),
                     self.release_scratch.eq(self.wc.valid & (tag & WR_SCRATCH != 0)),
                     self.release_qp.eq(wc.qp),
                     self.release_ctx.eq(self.wc.valid & ctx), self.ctx_idx.eq(tag[:CTX_BITS]),
                     self.ctx_ok.eq(good),
                     self.async_err.eq(self.wc.valid & ~sync & ~ctx & ~part & ~good)]
        fire = self.wr.valid & self.wr.ready
        windowed = bool(self.read_window)
        if windowed:
            C, win = self.read_chunk, self.read_window
            rest = Signal(32)           # octets of the READ after the part in ``wrq``
            last_id = Signal.like(wrq.wr_id)
            # The last part's octets per context, to return them at its WorkCompletion.
            lastlen = Array(Signal(range(C + 1), name=f"lastlen{i}")
                            for i in range(1 << CTX_BITS))
            add = Mux(fire & (wrq.op == WrOp.READ), wrq.length, 0)
            sub = Mux(self.wc.valid & ctx, lastlen[tag[:CTX_BITS]],
                      Mux(self.wc.valid & part, C, 0))
            m.d.sync += self.read_bytes.eq(self.read_bytes + add - sub)
            # READ requests out: one more per READ handed over, one less per WorkCompletion of
            # a part or of a READ's last part (or whole READ).
            up = fire & (wrq.op == WrOp.READ)
            down = self.wc.valid & (ctx | part)
            with m.If(up & ~down):
                m.d.sync += self.reads_out.eq(self.reads_out + 1)
            with m.Elif(down & ~up):
                m.d.sync += self.reads_out.eq(self.reads_out - 1)
            # Whether the part in ``wrq`` fits, from registers (a cycle in state FIT).
            fits = Signal()
            deep = (self.reads_out < self.read_depth) if self.read_depth else C(1)
            m.d.sync += fits.eq(((self.read_bytes == 0) |
                                 (self.read_bytes + wrq.length <= win)) & deep)

            def next_part(m, length, wr_id):
                """Put the first ``C`` octets of ``length`` in ``wrq`` (the rest in ``rest``)."""
                big = length > C
                m.d.sync += [wrq.length.eq(Mux(big, C, length)), rest.eq(Mux(big, length - C, 0)),
                             wrq.wr_id.eq(Mux(big, WR_CHUNK, wr_id))]
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += self.cmd.ready.eq(1)
                with m.If(self.cmd.valid):
                    # (imm and inv_rkey are taken only from the ops that carry them; the others
                    # leave them as they were, as the transport ignores them there)
                    p = self.cmd.payload
                    m.d.sync += [wrq[f].eq(p[f])
                                 for f in ("wr_id", "op", "rkey", "va", "length", "laddr")]
                    with m.If(p.op == WrOp.WRITE_IMM):
                        m.d.sync += wrq.imm.eq(p.imm)
                    with m.If((p.op == WrOp.SEND) | (p.op == WrOp.SEND_INV)):
                        m.d.sync += wrq.inv_rkey.eq(p.inv_rkey)
                    if windowed:
                        with m.If(p.op == WrOp.READ):
                            next_part(m, p.length, p.wr_id)
                            m.d.sync += last_id.eq(p.wr_id)
                            m.next = "FIT"
                        with m.Else():
                            m.next = "ISSUE"
                    else:
                        m.next = "ISSUE"
            with m.State("ISSUE"):
                m.d.comb += self.wr.valid.eq(1)
                with m.If(self.wr.ready):
                    m.d.comb += self.issued.eq(1)
                    with m.If(wrq.wr_id & WR_SYNC != 0):
                        m.next = "WAIT"
                    with m.Else():
                        m.d.comb += self.done.eq(1)
                        m.d.sync += self.ok.eq(1)
                        m.next = "IDLE"
            with m.State("WAIT"):
                with m.If(self.wc.valid & sync):
                    m.d.sync += self.ok.eq(good)
                    m.d.comb += self.done.eq(1)
                    m.next = "IDLE"
            if windowed:
                # A READ part: ``fits`` is computed in FIT (WorkCompletions only lower
                # read_bytes, so it still holds in PART).
                with m.State("FIT"):
                    m.next = "FIT_WAIT"
                with m.State("FIT_WAIT"):
                    with m.If(fits):
                        m.next = "PART"
                with m.State("PART"):
                    m.d.comb += self.wr.valid.eq(1)
                    with m.If(self.wr.ready):
                        m.d.comb += self.issued.eq(1)
                        with m.If(rest == 0):
                            m.d.comb += self.done.eq(1)
                            m.d.sync += [self.ok.eq(1),
                                         lastlen[wrq.wr_id[:CTX_BITS]].eq(wrq.length)]
                            m.next = "IDLE"
                        with m.Else():
                            m.d.sync += [wrq.va.eq(wrq.va + wrq.length),
                                         wrq.laddr.eq(wrq.laddr + wrq.length)]
                            next_part(m, rest, last_id)
                            m.next = "FIT"
        return m


def read_chunk_for(read_window):
    """The octets of a READ part for a window (WorkIssuer): the largest power of two at most a
    quarter of it (at least 1)."""
    return 1 << max(0, (read_window // 4).bit_length() - 1)


class LoadLocks(wiring.Component):
    """The blocks that LOADs are still sending: an RDMA WRITE reads its source when it is sent
    and again when it is retransmitted, until its WorkCompletion. A STORE or ALLOC_STORE into
    such a block waits (``hit``) until the WRITE has completed, so a LOAD sends the data its
    place in the connection's order saw, and a block freed and allocated again is not
    overwritten under a WRITE still on its way (issue 20, the handle hazards).

    ``n`` entries of (valid, block address); a new LOAD waits for a free one (``avail``).

    Ports
    -----
    take : In(1), take_idx : In(LOCK_BITS), take_addr : In(ADDR_BITS)
    release : In(1), release_idx : In(LOCK_BITS)
    free_idx : Out(LOCK_BITS), avail : Out(1)   the lowest free entry
    probe : In(ADDR_BITS), hit : Out(1)         some LOAD still reads the block at ``probe``
    """

    def __init__(self, n=8):
        assert 1 <= n <= 1 << LOCK_BITS
        self.n = n
        super().__init__({"take": In(1), "take_idx": In(LOCK_BITS), "take_addr": In(ADDR_BITS),
                          "release": In(1), "release_idx": In(LOCK_BITS),
                          "free_idx": Out(LOCK_BITS), "avail": Out(1),
                          "probe": In(ADDR_BITS), "hit": Out(1)})

    def elaborate(self, platform):
        m = Module()
        valid = Signal(self.n)
        addrs = [Signal(ADDR_BITS, name=f"lock_addr{i}") for i in range(self.n)]
        for i in range(self.n):
            with m.If(self.take & (self.take_idx == i)):
                m.d.sync += [valid[i].eq(1), addrs[i].eq(self.take_addr)]
            with m.Elif(self.release & (self.release_idx == i)):
                m.d.sync += valid[i].eq(0)
        for i in reversed(range(self.n)):
            with m.If(~valid[i]):
                m.d.comb += self.free_idx.eq(i)
        m.d.comb += [self.avail.eq(~valid.all()),
                     self.hit.eq(Cat(valid[i] & (addrs[i] == self.probe)
                                     for i in range(self.n)).any())]
        return m

# Ref: draft KBTP §Block Table, §Free-Block Ring, §Allocation Quotas, §Operations (Block Load,
#      Block Mapped Store, Block Unmapped Store), §Completion, §Target Execution Model;
#      docs/layouts.md; model/target.py "Readings of the draft"; host/codec.py (strictness).
"""The KBTP engine: LOAD, STORE and ALLOC_STORE executed in gateware.

The responder has written a SEND message into a receive buffer and tells us with a
:data:`~hw.iface.RecvNotify` beat. The engine takes the message's first 56 octets from the
responder's on-chip copy when one comes with the notify (a SEND Only, ``notify_head_ok`` and
``head``: hw/iface.py MsgHead; hw/target/target.py's HEAD_DEPTH FIFO), else reads them over its
own memory-bus master (7 words; on the ECPIX-5 a DDR3 read of some 20 core cycles, which the
copy saves), and either runs it (fast path: LOAD, STORE, ALLOC_STORE of a QP whose session
the host driver has configured here) or pushes the notify beat unchanged into ``hostq``
(slow path: HELLO, FREE, BIND, GOODBYE, anything else, any QP without a session, messages
shorter than the common header). For slow-path messages the host returns the receive buffer
itself.

Fast path, in the golden model's order (model/target.py Readings 6-10)::

    FRONT: the message's 7 words (on chip, or read)
      -> decode (codec strictness: MALFORMED / TOO_LARGE)
      -> handle range -> table entry -> Block Size -> Generation -> VALID/SEALED/ALREADY_BOUND
      -> [ALLOC_STORE: quota, ring empty, masked FetchAdd on Head, slot poll, consume]
      -> data: RDMA WRITE to the initiator (LOAD) | inline copy, started | RDMA READ into the
         block, handed to the requester -> a context into the queue
    BACK, in the order the front took them:
      [READ: its WorkCompletion | inline: the copy's last word] -> entry update (Data Length
      + Block Offset before Flags + Generation) -> completion (COMPLETION Send / Send with
      Invalidate, or record by WRITE_IMM) -> RecvRepost

Two stages (issue 20), each an FSM, joined by a queue of CTX_DEPTH request contexts
(hw/kbtp/context.py). The front takes one request at a time, all QPs, and never waits for the
network: a LOAD's WRITE and a store's READ are handed to the requester and the front takes the
next message. Nor does it wait for an inline store's copy: the copy (InlineCopy, on a bus
master of its own, one copy at a time) moves the data while the front takes the next message,
decodes it, reads its entry and allocates its block; the back updates the entry when the copy
has written its last word (on the ECPIX-5's DDR3 a 64-octet copy is 8 reads, a round trip
of 18 core cycles when idle, 8 writes: some 35 core cycles the front no longer waits for).
The back waits only where the draft needs a result: a store's RDMA READ before
its entry update and COMPLETION, and the record's WRITE_IMM (a failed one falls back to a
Send). It finishes requests in the front's order, so each connection's COMPLETIONs leave in
its request order ("A target processes the requests of one connection in order"; one queue for
all QPs, so a QP's COMPLETION also waits behind an earlier READ of another QP). One ring
allocator (hw/kbtp/ring_alloc.py), started by the front (ALLOC) and the back (RETURN), makes the
ring counters atomic for free: every counter update, the host's included, goes through it.
An ALLOC_STORE on the shared ring starts its allocation beside its table entry's read
(speculative: the allocator reads Tail, Head and the slot it predicts, then waits for the entry
check's go or cancel), so the front waits for one DDR3 round trip where it waited for three.

What a request in the queue has not done yet, the front must not see undone (the hazards,
tests/hw/kbtp/test_engine_pipeline.py):

* a table entry a queued STORE / ALLOC_STORE will write is not read until it is written (a
  LOAD after a STORE of the same handle sees the stored block), except past a STORE without
  SEAL where no later answer depends on it (hw/kbtp/context.py says when; an inline STORE
  passes such a STORE whose data is copied too, since the copies run one at a time in order);
* an ALLOC_STORE that finds the ring empty or its quota used up waits while an earlier
  ALLOC_STORE's READ may still fail and give its block and quota back (model Readings 10);
* a slow-path message goes to the host only when the queue is empty (its connection's order;
  a FREE of a block a READ still fills).

What the transport still reads stays put until its WorkCompletion (``_in_flight``): each
completion has its own SCRATCH slot (SCRATCH_SLOTS per QP), and a STORE or ALLOC_STORE into a
block a LOAD is still sending waits (hw/kbtp/movers.py LoadLocks; tests/hw/kbtp/
test_engine_hazards.py). tests/hw/kbtp/test_kbtp_engine.py prints the per-request cycle counts.

Ring rules (model/ring.py; all in the ring allocator): an allocation re-reads its slot until
Sequence == ticket and Block Offset != all ones, then writes all ones into the Block Offset. A
free (host command FREE_BLOCK, a free queued in FREE_PUSH, which the register bank runs as a
FREE_BLOCK, or the engine returning a block after a failed RDMA READ) takes a
Tail ticket u and writes the slot only when it is consumed AND its Sequence == u - N
(model/ring.py ``slot_free_for``: the draft's "consumed" alone loses blocks under concurrent
frees), Block Offset first, then Sequence. A free that cannot write yet is deferred (one
deferred free at a time; the command register reads busy) and retried whenever the engine is
idle or polling a slot. The allocator has a memory-bus master of its own; it starts host
commands while the front is idle or waits for it, and while the back returns a block. Host
commands, queued frees included, go before a message waiting in the front's IDLE: a burst of queued
frees that do not defer delays the next message by their run (about 15 cycles each).

ADDR_LE: CTRL bit 2 says the structures' Block Offsets (table entries, ring slots) are
little-endian (the target's ``addr_le``); a session's bit 2 that its requests' Block Handle and
Data / Completion Descriptor fields are (host/codec.py lists them). COMPLETIONs and records stay
big-endian (codec Readings).

Assumptions: receive buffers, scratch buffers, table, ring and pool blocks are 8-octet
aligned; Block Size is a multiple of 8; Head/Tail counters little-endian (the model's counter
order); Block Offsets below 2**62 (a free names its ring in bits 63..62).

Rings (issue 20 item 3): the shared ring and up to three DIRECT_ALLOC partition rings. A
session's QP_SESSION bits 5..4 name the ring its ALLOC_STOREs take blocks from (0 the shared
ring, with the QUOTA check and USAGE; p + 1 partition p, whose ring is the quota). The request
context keeps the ring, so a failed READ's block goes back to the ring it came from; a host
free names its ring in its argument. The partition Head is FetchAdded by its initiator's RDMA
atomics as well: the ring allocator locks its read of it up to its write (hw/kbtp/ring_alloc.py).

What the host keeps doing (and must do as the golden model does): messages shorter than the
24-octet header (the model answers MALFORMED, echoing what arrived); RANGE[i] must say "owned"
for every range of an active *or retained* session, and ``n_ranges`` must cover
TABLE_COUNT >> RANGE_LOG2 (handles in uncovered ranges are refused with INVALID_HANDLE); USAGE
must be lowered by the host when its FREE completes (and raised by BIND). A QP's SCRATCH area
holds SCRATCH_SLOTS buffers of SLOT_SIZE octets (hw/kbtp/regmap.py).

Register map: docs/registers.md, rendered from the table in hw/kbtp/regmap.py (which also gives
:data:`reg`, the offsets drivers use, and the register bank's decode, hw/kbtp/engine_regs.py).

The blocks (issue 19): hw/kbtp/engine_regs.py (registers, sessions, statistics, host commands),
hw/kbtp/decode.py (message fields, decode checks, authorization, entry checks),
hw/kbtp/movers.py (word reads, inline copy, entry update, WorkRequest / WorkCompletion),
hw/kbtp/completion.py (COMPLETION Send or record), hw/kbtp/ring_alloc.py (the ring),
hw/kbtp/context.py (the queue between the stages). This file sequences them: two FSMs, each
state starting a block or waiting for its ``done``, each stage's memory-bus master given to
the block that runs, and a MemArbiter of the front's, the back's and the ring allocator's.
"""

from types import SimpleNamespace

from amaranth.hdl import Cat, Module, Mux, Signal
from amaranth.lib import memory, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.headers import CommonHeader, Opcode, Status
from hw.iface import (ADDR_BITS, MSG_HEAD_OCTETS, HostBusSignature, MemBusSignature,
                      QP_INDEX_BITS, REG_KBTP, RecvNotify, RecvRepost, WorkCompletion,
                      WorkRequest, WrOp)
from hw.lib.membus import MemArbiter
from hw.kbtp.completion import Completion
from hw.kbtp.context import CTX, CTX_DEPTH, ContextQueue, Ctx
from hw.kbtp.decode import MSG_WORDS, RESULT, Dispatch, EntryNext, RequestDecoder, entry_boff
from hw.kbtp.engine_regs import EngineRegs
from hw.kbtp.movers import (READ_DEPTH, WR_CTX, WR_LOCK, WR_SCRATCH, EntryWriter, InlineCopy,
                            LoadLocks, WordReader, WorkIssuer)
from hw.kbtp.regmap import ENGINE_ID, ENGINE_PARTS, SCRATCH_SLOTS, SLOT_SIZE, reg
from hw.kbtp.ring_alloc import Cmd, RingAllocator, RingOp

__all__ = ["KbtpEngine", "ENGINE_ID", "FAST_OPS", "Cmd", "reg", "SCRATCH_SLOTS", "SLOT_SIZE",
           "read_window_for", "ranges_for"]

assert 8 * MSG_WORDS <= MSG_HEAD_OCTETS, "the responder's on-chip head holds a request's octets"

#: Fast-path opcodes, in counter order (op index 0, 1, 2).
FAST_OPS = (Opcode.LOAD, Opcode.STORE, Opcode.ALLOC_STORE)


def ranges_for(n_qp, n_ranges=None):
    """The RANGE registers of an engine of ``n_qp`` QPs: ``n_ranges`` when given, else (for
    KbtpEngine, KbtpTarget and the host driver alike) a range per QP, at least 16. (A config
    with more handle ranges than the engine checks keeps every request on the host:
    host/driver.py ``fast_ok``.)"""
    return max(16, n_qp) if n_ranges is None else n_ranges


class KbtpEngine(wiring.Component):
    """KBTP fast-path engine (see the module docstring for behaviour, docs/registers.md for the
    register map).

    Parameters
    ----------
    n_qp : int
        QPs with a session context (at most, and by default, 2**QP_INDEX_BITS; the per-QP
        state is in memories, a row per QP).
    n_ranges : int or None
        Handle ranges in the LOAD authorization table (RANGE registers); None:
        :func:`ranges_for` ``n_qp``.
    base : int
        Byte address of the register window.
    read_window : int
        Data octets of RDMA READs the engine keeps out at once (0: no limit). A store's READ
        goes out in parts of at most a quarter of the window, each only while it fits with
        the parts still out (:class:`~hw.kbtp.movers.WorkIssuer`). The responses of the READs
        out land in the MAC's receive buffer faster than a core at line rate may drain it;
        with no more out than the buffer holds (:func:`read_window_for`), none is dropped for
        want of room (a dropped response waits for the QP's retransmission timer).
    read_depth : int
        RDMA READ requests (parts or whole) the engine keeps out at once, with a window
        (:data:`~hw.kbtp.movers.READ_DEPTH` by default; 0: no limit): within the responder
        resources the target's CM requires of every initiator (host/cm.py).

    Ports
    -----
    notify : In(stream.Signature(RecvNotify))
    notify_head_ok : In(1)
        With ``notify``'s payload: its message's first octets wait on ``head`` (the
        responder's on-chip copy, hw/iface.py MsgHead); 0 (unconnected): read them from the
        receive buffer.
    head : In(stream.Signature(8 * MSG_HEAD_OCTETS))
        Those octets, big-endian, one entry per notify with ``notify_head_ok``, taken with it.
    repost : Out(stream.Signature(RecvRepost))
    hostq : Out(stream.Signature(RecvNotify))     slow-path messages, as notified
    wr : Out(stream.Signature(WorkRequest))
    wc : In(stream.Signature(WorkCompletion))
    mem : Out(MemBusSignature())
    bus : In(HostBusSignature())
    host_done : In(1), host_done_qp : In(QP_INDEX_BITS)
        one-cycle strobe: the host returned a receive buffer of QP ``host_done_qp`` (its
        RecvRepost), i.e. it has finished a message the engine forwarded to it.
    busy : Out(1)
        a request is in the front, in the context queue or in the back: an answer may follow.

    Per-connection order: a message of a QP that still has a message at the host is not taken
    until the host has finished it (``host_done``), so "FREE h; ALLOC_STORE h" on one
    connection can never run in the other order, and the host's USAGE update after a FREE
    cannot race an allocation of the same QP. Other QPs wait too (the front is serial).
    """

    #: The ring allocator's class (a mutant's, for the negative tests of
    #: tests/hw/kbtp/test_formal_ring.py).
    ring_cls = RingAllocator

    def __init__(self, n_qp=1 << QP_INDEX_BITS, n_ranges=None, base=REG_KBTP, read_window=0,
                 read_depth=READ_DEPTH):
        self.n_qp = n_qp
        self.read_window, self.read_depth = read_window, read_depth
        self.n_ranges = ranges_for(n_qp, n_ranges)
        self.base = base
        #: (not a port) the ring allocator takes a RETURN this cycle: for the ghost checks of
        #: tests/hw/kbtp/test_formal_ring.py, which must tell the return's Tail FetchAdd
        #: from a host command's.
        self.returning = Signal()
        super().__init__({
            "notify": In(stream.Signature(RecvNotify)),
            "notify_head_ok": In(1),
            "head": In(stream.Signature(8 * MSG_HEAD_OCTETS)),
            "repost": Out(stream.Signature(RecvRepost)),
            "hostq": Out(stream.Signature(RecvNotify)),
            "wr": Out(stream.Signature(WorkRequest)),
            "wc": In(stream.Signature(WorkCompletion)),
            "mem": Out(MemBusSignature()),
            "bus": In(HostBusSignature()),
            "host_done": In(1), "host_done_qp": In(QP_INDEX_BITS),
            "busy": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        u = self._blocks(m)
        regs, dec, reader, issuer, cpl, ring = u.regs, u.dec, u.reader, u.issuer, u.cpl, u.ring
        cfg, sess, req, ent, cur, res, q = regs.cfg, regs.session, dec.req, dec.entry, u.cur, \
            u.res, u.q
        st = _Steps(m, u, u.front_bus, (reader,))
        run, finish, read = st.run, st.finish, st.read
        kind = u.kind
        # (the session lookup is registered: it follows the QP ``cur`` holds next cycle)
        m.d.comb += regs.qp_next.eq(cur.qp)
        head_ok = Signal()                  # ``cur``'s first octets came on chip, into ``u.msg``

        # ================= front: take, decode, check, allocate, move or issue the data
        with m.FSM(name="front") as front_fsm:
            with m.State("IDLE"):
                # Host commands first, then a message (with a free context slot), then a deferred
                # free's retry (the ring allocator takes the commands and the retry when
                # granted).
                with m.If(~regs.cmd_valid & ring.idle & self.notify.valid & u.notify_free &
                          ~q.full & (~self.notify_head_ok | self.head.valid)):
                    m.d.comb += [self.notify.ready.eq(1), regs.started.eq(1),
                                 regs.qp_next.eq(self.notify.payload.qp),
                                 self.head.ready.eq(self.notify_head_ok)]
                    m.d.sync += [cur.eq(self.notify.payload), head_ok.eq(self.notify_head_ok)]
                    # The responder's copy of the message's first octets goes straight into
                    # the decoder's register (no copy of it held here: 448 flip-flops fewer).
                    with m.If(self.notify_head_ok):
                        m.d.sync += u.msg.eq(self.head.payload[-64 * MSG_WORDS:])
                    m.next = "NOTIFIED"
                with m.Else():
                    m.d.comb += u.f_grant.eq(1)

            with m.State("NOTIFIED"):
                with m.If(~cfg.ctrl[0] | ~sess.valid | (cur.length < CommonHeader.SIZE)):
                    m.next = "HOSTQ"
                with m.Elif(head_ok):
                    # ``u.msg`` holds the responder's copy since the take: no read back.
                    m.next = "CHECK"
                with m.Else():
                    read(cur.addr, MSG_WORDS)
                    m.next = "READ_MSG"

            with m.State("HOSTQ"):
                # The host sees a message only when every request taken before it is finished
                # (its connection's order; a FREE of a block a pending READ still fills).
                with m.If(q.empty):
                    m.d.comb += [self.hostq.valid.eq(1), self.hostq.payload.eq(cur)]
                    with m.If(self.hostq.ready):
                        m.d.comb += regs.to_host.eq(1)
                        m.next = "IDLE"

            run("READ_MSG", reader, "DECODE")
            with m.State("DECODE"):
                m.d.sync += u.msg.eq(reader.data)
                m.next = "CHECK"

            # The decoder's answer into flops (``u.disp``, ``u.d_res``, ``u.eaddr``): its 64-bit
            # handle arithmetic, the range lookup and the first-answer rules end here instead of
            # running on into the dispatch, the context and the hazard probe (26.3 ns, the core
            # clock's longest path on ECPIX-5 at seed 3 after the requester's were cut).
            with m.State("CHECK"):
                m.d.sync += [u.disp.eq(dec.dispatch), u.d_res.eq(dec.d_result),
                             u.eaddr.eq(dec.entry_addr)]
                m.next = "DISPATCH"

            with m.State("DISPATCH"):
                with m.Switch(u.disp):
                    with m.Case(Dispatch.HOSTQ):
                        m.next = "HOSTQ"
                    with m.Case(Dispatch.COMPLETE):
                        m.d.sync += [res.eq(u.d_res), kind.eq(Ctx.RESULT)]
                        m.next = "PUSH"
                    with m.Case(Dispatch.READ_ENTRY):
                        # (an entry that a request still in the pipeline will write: wait)
                        with m.If(~q.entry_hit):
                            read(u.eaddr, 2)
                            # An ALLOC_STORE on the shared ring: the ring allocator reads Tail
                            # and Head beside the entry read, if it is idle, and waits for
                            # the entry check's verdict (ENTRY_CHK2) before it writes.
                            with m.If(req.is_alloc & (sess.ring == 0)):
                                m.d.comb += [u.f_ring_start.eq(1), ring.spec.eq(1)]
                                m.d.sync += u.spec_on.eq(ring.ack & ~u.ring_sel_back)
                            m.next = "READ_ENTRY"

            run("READ_ENTRY", reader, "ENTRY_CHK")
            with m.State("ENTRY_CHK"):
                m.d.sync += [u.ent_raw.eq(reader.data[:128]),
                             u.boff.eq(entry_boff(reader.data[:128], cfg.ctrl[2]))]
                m.next = "ENTRY_CHK2"

            with m.State("ENTRY_CHK2"):
                # The speculative allocation's verdict: on only if this request allocates now
                # (every other answer, a wait for an earlier READ included, cancels it: the back
                # may need the ring allocator to return that READ's block).
                with m.If(u.spec_on):
                    m.d.sync += u.spec_on.eq(0)
                    with m.If(dec.entry_next == EntryNext.RING_ALLOC):
                        m.d.comb += ring.go.eq(1)
                    with m.Else():
                        m.d.comb += ring.cancel.eq(1)
                with m.Switch(dec.entry_next):
                    with m.Case(EntryNext.COMPLETE):
                        # An ALLOC_STORE over quota (NO_SPACE) while an earlier one's READ may still fail
                        # and give its block back waits for it (the serial order's answer).
                        with m.If(~(req.is_alloc & q.alloc_pending &
                                    (dec.e_result.status == Status.NO_SPACE.value))):
                            m.d.sync += [res.eq(dec.e_result), kind.eq(Ctx.RESULT)]
                            m.next = "PUSH"
                    with m.Case(EntryNext.LOAD_WRITE):
                        # (a LoadLocks entry for the block it sends; all taken: wait)
                        with m.If(u.locks.avail):
                            m.d.comb += u.f_cmd_valid.eq(1)
                            with m.If(u.f_cmd_ready):
                                m.next = "DATA_WR"
                    with m.Case(EntryNext.OBTAIN):
                        m.next = "OBTAIN"
                    with m.Case(EntryNext.RING_ALLOC):
                        with m.If(u.spec_on):
                            m.next = "RING_ALLOC_WAIT"
                        with m.Else():
                            m.next = "RING_ALLOC"

            # -------- ALLOC_STORE: the ring allocator takes a block (or finds the ring empty)
            with m.State("RING_ALLOC"):
                m.d.comb += [u.f_ring_start.eq(1), u.f_grant.eq(1)]
                with m.If(ring.ack & ~u.ring_sel_back):
                    m.next = "RING_ALLOC_WAIT"
            with m.State("RING_ALLOC_WAIT"):
                m.d.comb += u.f_grant.eq(1)
                with m.If(ring.done & ~u.ring_back):
                    with m.If(ring.empty & q.alloc_pending):
                        m.next = "RING_RETRY"       # an earlier READ may fail: its block
                    with m.Elif(ring.empty):
                        m.d.sync += [*finish(Status.NO_SPACE, ent.gen), kind.eq(Ctx.RESULT)]
                        m.next = "PUSH"
                    with m.Else():
                        m.d.sync += u.boff.eq(ring.block)
                        # (a partition's allocations are not USAGE: its ring is the quota)
                        m.d.comb += regs.usage_inc.eq(sess.ring == 0)
                        m.next = "OBTAIN"
            with m.State("RING_RETRY"):
                with m.If(~q.alloc_pending):
                    m.next = "RING_ALLOC"

            # -------- STORE / ALLOC_STORE: get the data into the block
            with m.State("OBTAIN"):
                with m.If(u.locks.hit):
                    pass        # a LOAD's WRITE still reads this block: wait for its completion
                with m.Elif(req.dd_len == 0):
                    m.d.sync += kind.eq(Ctx.ENTRY)
                    m.next = "PUSH"
                with m.Elif(req.inline):
                    # The copy runs on its own bus master beside the next request; the back
                    # updates the entry when it has written its last word (one copy at a time).
                    with m.If(~u.copy.busy):
                        m.d.comb += u.copy.start.eq(1)
                        m.d.sync += [u.copy_idx.eq(q.push_idx), kind.eq(Ctx.COPY)]
                        m.next = "PUSH"
                with m.Else():
                    # The RDMA READ: the back stage waits for its WorkCompletion, not us (the
                    # issuer sends it in parts that fit the READ window).
                    m.d.comb += u.f_cmd_valid.eq(1)
                    with m.If(u.f_cmd_ready):
                        m.next = "DATA_WR"

            # -------- the RDMA WRITE (LOAD) or READ (STORE, ALLOC_STORE) handed over
            with m.State("DATA_WR"):
                with m.If(issuer.done & ~u.issuer_back):
                    with m.If(req.is_load):
                        m.d.sync += [*finish(Status.OK, ent.gen, ent.dlen, ent.boff),
                                     kind.eq(Ctx.RESULT)]
                    with m.Else():
                        m.d.sync += kind.eq(Ctx.READ)
                    m.next = "PUSH"

            with m.State("PUSH"):
                m.d.comb += q.push.eq(1)
                m.next = "IDLE"

        # ================= back: in request order, the READ's result, entry, completion
        h, bres = u.head, u.bres
        bst = _Steps(m, u, u.back_bus, (u.entry, cpl))
        with m.FSM(name="back") as back_fsm:
            with m.State("IDLE"):
                with m.If(q.head_valid):
                    m.d.sync += h.eq(q.head_rd)
                    m.next = "HEAD"

            with m.State("HEAD"):
                with m.Switch(h.kind):
                    with m.Case(Ctx.RESULT):
                        m.d.sync += bres.eq(h.res)
                        m.next = "COMPLETE"
                    with m.Case(Ctx.ENTRY):
                        m.d.comb += u.entry.start.eq(1)
                        m.next = "ENTRY_UPDATE"
                    with m.Case(Ctx.COPY):
                        with m.If(q.head_done):
                            m.d.comb += u.entry.start.eq(1)
                            m.next = "ENTRY_UPDATE"
                    with m.Case(Ctx.READ):
                        with m.If(q.head_done & q.head_ok):
                            m.d.comb += u.entry.start.eq(1)
                            m.next = "ENTRY_UPDATE"
                        with m.Elif(q.head_done & h.req.is_alloc):
                            # The model returns the block to the ring (Readings 10): the ring
                            # allocator writes it into its slot before we complete.
                            m.next = "RING_RETURN"
                        with m.Elif(q.head_done):
                            m.d.sync += bst.finish(Status.INTERNAL, h.gen, res=bres)
                            m.next = "COMPLETE"

            # Entry update: Data Length (+ Block Offset) before Flags + Generation.
            bst.run("ENTRY_UPDATE", u.entry, "COMPLETE",
                    *bst.finish(Status.OK, Mux(h.req.is_alloc, h.next_gen, h.gen), h.req.dd_len,
                                h.boff, res=bres))

            with m.State("RING_RETURN"):
                m.d.comb += [u.b_ring_start.eq(1), u.b_grant.eq(1)]
                with m.If(ring.ack & u.ring_sel_back):
                    m.next = "RING_RETURN_WAIT"
            with m.State("RING_RETURN_WAIT"):
                m.d.comb += u.b_grant.eq(1)
                with m.If(ring.done & u.ring_back):
                    m.d.comb += regs.usage_dec.eq(h.ring == 0)
                    m.d.sync += bst.finish(Status.INTERNAL, h.gen, res=bres)
                    m.next = "COMPLETE"

            # -------- completion: record by WRITE_IMM, else COMPLETION Send
            with m.State("COMPLETE"):
                with m.If(u.slot_free):
                    m.d.comb += cpl.start.eq(1)
                    m.next = "COMPLETING"

            with m.State("COMPLETING"):
                bst.bus_to(cpl)
                with m.If(cpl.done):
                    m.next = "DONE"

            with m.State("DONE"):
                m.d.comb += [self.repost.valid.eq(regs.count_ready),
                             self.repost.payload.qp.eq(h.qp)]
                with m.If(self.repost.valid & self.repost.ready):
                    m.d.comb += [regs.finished.eq(1), q.pop.eq(1)]
                    m.next = "IDLE"
        # A request in hand, queued or being finished: an answer may still come (the target's
        # AckHold keeps a transport ACK back meanwhile).
        m.d.comb += self.busy.eq(~front_fsm.ongoing("IDLE") | ~q.empty |
                                 ~back_fsm.ongoing("IDLE"))
        return m

    def _blocks(self, m):
        """The blocks, the request's registers, and the wiring that does not depend on the
        FSMs' states."""
        sm = m.submodules
        sm.regs = regs = EngineRegs(self.n_qp, self.n_ranges, self.base)
        sm.dec = dec = RequestDecoder(self.n_ranges)
        sm.reader = reader = WordReader(MSG_WORDS)
        sm.copy = copy = InlineCopy()
        sm.entry = entry = EntryWriter()
        sm.issuer = issuer = WorkIssuer(self.read_window, read_depth=self.read_depth)
        sm.cpl = cpl = Completion()
        # The ring allocator (hw/kbtp/ring_alloc.py) does every ring access: ALLOC (front),
        # RETURN (back) and the host commands, on a memory-bus master of its own.
        sm.ring = ring = self.ring_cls()
        sm.q = q = ContextQueue(CTX_DEPTH)
        # Four masters: the front's units, the back's units, the ring allocator (which locks
        # its read of a partition Head up to its write: the arbiter passes the lock on), the
        # inline copy (beside the front's next request).
        sm.arb = arb = MemArbiter(4, locking=(2,))
        wiring.connect(m, wiring.flipped(self.mem), arb.bus)
        wiring.connect(m, ring.mem, arb.masters[2])
        wiring.connect(m, copy.mem, arb.masters[3])
        wiring.connect(m, wiring.flipped(self.bus), regs.bus)
        wiring.connect(m, wiring.flipped(self.wr), issuer.wr)
        wiring.connect(m, wiring.flipped(self.wc), issuer.wc)
        cfg, sess, req, ent = regs.cfg, regs.session, dec.req, dec.entry

        # The front's request: its RecvNotify, message, table entry, block and result; the
        # back's: the head context and its result.
        u = SimpleNamespace(regs=regs, dec=dec, reader=reader, copy=copy, entry=entry,
                            issuer=issuer, cpl=cpl, ring=ring, q=q,
                            front_bus=arb.masters[0], back_bus=arb.masters[1],
                            cur=Signal(RecvNotify), msg=Signal(len(dec.msg)),
                            ent_raw=Signal(128), boff=Signal(64), res=Signal(RESULT),
                            kind=Signal(Ctx), bres=Signal(RESULT), head=Signal(CTX),
                            f_grant=Signal(), b_grant=Signal(),
                            f_ring_start=Signal(), b_ring_start=Signal(),
                            ring_sel_back=Signal(), ring_back=Signal(),
                            f_cmd_valid=Signal(), f_cmd_ready=Signal(), issuer_back=Signal(),
                            disp=Signal(Dispatch), d_res=Signal(RESULT),
                            eaddr=Signal(ADDR_BITS),
                            copy_idx=Signal(range(CTX_DEPTH)),
                            spec_on=Signal())
        qp, baddr, h = u.cur.qp, Signal(ADDR_BITS), u.head
        m.d.comb += [
            baddr.eq(cfg.pool_base + (u.boff - cfg.pool_to_base)[:ADDR_BITS]),
            regs.qp.eq(qp), regs.dec_qp.eq(h.qp), regs.range_idx.eq(dec.range_idx),
            regs.count_k.eq(Cat(u.bres.status[:4], h.req.op_idx)),
            regs.wr_fire.eq(self.wr.valid & self.wr.ready),
            dec.msg.eq(u.msg), dec.length.eq(u.cur.length), dec.cfg.eq(cfg),
            dec.session.eq(sess), dec.range.eq(regs.range), dec.ent.eq(u.ent_raw),
            copy.src.eq(u.cur.addr + req.pos), copy.dst.eq(baddr), copy.length.eq(req.dd_len),
            entry.alloc.eq(h.req.is_alloc), entry.seal.eq(h.req.seal), entry.addr.eq(h.entry_addr),
            entry.dlen.eq(h.req.dd_len), entry.boff.eq(h.boff), entry.flags.eq(h.flags),
            entry.next_gen.eq(h.next_gen), entry.le.eq(cfg.ctrl[2]),
            cpl.req.eq(h.req), cpl.result.eq(u.bres), cpl.granted.eq(h.granted),
            cpl.wr_done.eq(issuer.done & u.issuer_back), cpl.wr_ok.eq(issuer.ok),
        ]
        # The context the front pushes (state PUSH), and the entry it is about to read.
        pc = q.push_ctx
        m.d.comb += [pc.kind.eq(u.kind), pc.qp.eq(qp), pc.req.eq(req), pc.res.eq(u.res),
                     pc.entry_addr.eq(u.eaddr), pc.flags.eq(ent.flags),
                     pc.gen.eq(ent.gen), pc.next_gen.eq(ent.next_gen), pc.boff.eq(u.boff),
                     pc.granted.eq(sess.record), pc.scratch.eq(sess.scratch),
                     pc.ring.eq(sess.ring),
                     q.probe.eq(u.eaddr), q.probe_qp.eq(qp),
                     q.pass_any.eq(req.is_load | req.is_alloc),
                     q.pass_same_qp.eq(req.is_store & ~req.inline & (req.dd_len != 0)),
                     q.pass_ordered.eq(req.is_store & req.inline & (req.dd_len != 0)),
                     q.wc.eq(issuer.release_ctx), q.wc_idx.eq(issuer.ctx_idx),
                     q.wc_ok.eq(issuer.ctx_ok),
                     q.copied.eq(copy.done), q.copied_idx.eq(u.copy_idx)]
        self._in_flight(m, u, baddr)
        # The WorkIssuer: the front's data transfer (LOAD writes the block to the initiator,
        # STORE and ALLOC_STORE read the initiator's data into it), or the back's completion
        # (its WorkRequest first: the back drains the pipeline).
        data_wr, back_wr = Signal(WorkRequest), cpl.wr
        sel_back = back_wr.valid
        m.d.comb += [data_wr.wr_id.eq(Mux(req.is_load, WR_LOCK | u.locks.free_idx,
                                          WR_CTX | q.push_idx)),
                     data_wr.op.eq(Mux(req.is_load, WrOp.WRITE, WrOp.READ)),
                     data_wr.rkey.eq(req.dd_stag), data_wr.va.eq(req.dd_to),
                     data_wr.length.eq(Mux(req.is_load, ent.dlen, req.dd_len)),
                     data_wr.laddr.eq(baddr),
                     issuer.cmd.valid.eq(back_wr.valid | u.f_cmd_valid),
                     issuer.cmd.payload.eq(Mux(sel_back, back_wr.payload, data_wr)),
                     back_wr.ready.eq(issuer.cmd.ready),
                     u.f_cmd_ready.eq(issuer.cmd.ready & ~sel_back),
                     issuer.qp.eq(Mux(u.issuer_back, h.qp, qp))]
        with m.If(issuer.cmd.valid & issuer.cmd.ready):
            m.d.sync += u.issuer_back.eq(sel_back)
        # Ring: configuration and host commands go to the ring allocator, its state to the
        # registers; ALLOC from the front, RETURN from the back (first: it drains).
        m.d.comb += [u.ring_sel_back.eq(u.b_ring_start),
                     ring.start.eq(u.f_ring_start | u.b_ring_start),
                     ring.op.eq(Mux(u.b_ring_start, RingOp.RETURN, RingOp.ALLOC)),
                     ring.ring.eq(Mux(u.b_ring_start, h.ring, sess.ring)),
                     ring.block_in.eq(Mux(u.b_ring_start, h.boff, u.boff)),
                     ring.grant.eq(u.f_grant | u.b_grant)]
        with m.If(ring.ack):
            m.d.sync += u.ring_back.eq(u.b_ring_start)
        m.d.comb += self.returning.eq(ring.ack & u.b_ring_start)
        m.d.comb += [ring.ring_base.eq(cfg.ring_base), ring.ring_order.eq(cfg.ring_order),
                     ring.head_addr.eq(cfg.head_addr), ring.tail_addr.eq(cfg.tail_addr),
                     ring.masked.eq(cfg.ctrl[1]), ring.le.eq(cfg.ctrl[2]),
                     ring.part_order.eq(cfg.part_order),
                     *(ring.parts[p][k].eq(cfg[f"part{p}_{k}"])
                       for p in range(ENGINE_PARTS) for k in ("ring", "head", "tail")),
                     ring.cmd_valid.eq(regs.cmd_valid), ring.cmd_ring.eq(regs.cmd_ring),
                     ring.cmd_kind.eq(regs.cmd_kind), ring.cmd_arg.eq(regs.cmd_arg),
                     regs.cmd_ack.eq(ring.cmd_ack),
                     regs.deferred.eq(ring.deferred), regs.cmd_result.eq(ring.cmd_result),
                     regs.occupancy.eq(ring.occupancy), regs.stall.eq(ring.stall)]
        u.notify_free = self._host_order(m, qp, regs.to_host)
        return u

    def _in_flight(self, m, u, baddr):
        """What the engine has on the wire without waiting for it: the blocks of LOADs
        (LoadLocks) and the SCRATCH slots of completions, per QP a ring of SCRATCH_SLOTS taken
        in issue order and freed in completion order (one RC QP completes in order)."""
        issuer, wr, h = u.issuer, self.wr.payload, u.head
        m.submodules.locks = u.locks = locks = LoadLocks()
        m.d.comb += [locks.take.eq(issuer.issued & (wr.wr_id & WR_LOCK != 0)),
                     locks.take_idx.eq(wr.wr_id), locks.take_addr.eq(wr.laddr),
                     locks.release.eq(issuer.release_lock), locks.release_idx.eq(issuer.lock_idx),
                     locks.probe.eq(baddr)]
        # Two counters per QP, mod 2 * SCRATCH_SLOTS, each in a memory of its own with one
        # writer (taken: the issuer at the WorkRequest's QP; freed: its WorkCompletion's QP),
        # updated through a combinational read at that QP; the back reads both at its head's
        # QP, registered: ``h`` holds its QP from HEAD on, and COMPLETE comes after HEAD.
        k = SCRATCH_SLOTS
        take = issuer.issued & (wr.wr_id & WR_SCRATCH != 0)
        t, f = (self._counter(m, name, range(2 * k), (at, up), h.qp)[0]
                for name, at, up in (("slots_taken", wr.qp, take),
                                     ("slots_freed", issuer.release_qp, issuer.release_scratch)))
        slot = Signal(range(k))
        u.slot_free = Signal()
        m.d.comb += [slot.eq(Mux(t >= k, t - k, t)),
                     u.slot_free.eq((t != f + k) & (t + k != f)),
                     u.cpl.scratch.eq(h.scratch + slot * SLOT_SIZE)]

    def _counter(self, m, name, shape, update, *reads, comb=False, guard=None):
        """A counter per QP (of ``shape``: bits, or a range it wraps in) in a memory with one
        writer: ``update`` = (QP, increment) adds one at that QP when increment (and
        ``guard``, a function of the value read at that QP, holds). Returns its values at the
        QPs ``reads``, registered (the address must be stable a cycle before the value is
        used) or, if ``comb``, combinational; each read is a copy of the memory (LUT RAM)."""
        nq = self.n_qp
        mem = m.submodules[name] = memory.Memory(shape=shape, depth=nq, init=[])
        wp = mem.write_port()
        rmw = mem.read_port(domain="comb")
        at, up = update
        ok = up if guard is None else up & guard(rmw.data)
        if nq < 1 << len(at):
            ok &= at < nq           # (no QP of that number: nothing, as before)
        nxt = rmw.data + 1
        if isinstance(shape, range):
            nxt = Mux(rmw.data == shape.stop - 1, 0, nxt)
        m.d.comb += [rmw.addr.eq(at), wp.addr.eq(at), wp.en.eq(ok), wp.data.eq(nxt)]
        out = []
        for addr in reads:
            rp = mem.read_port(domain="comb") if comb else \
                mem.read_port(domain="sync", transparent_for=(wp,))
            m.d.comb += rp.addr.eq(addr)
            out.append(rp.data)
        return out

    def _host_order(self, m, qp, to_host):
        """Messages forwarded to the host and not yet finished there, per QP; returns "the QP
        of the RecvNotify offered now has none"."""
        # Messages forwarded (``sent``, up at the request's QP) and finished (``done``, up at
        # ``host_done_qp``), two counters mod 64 per QP, each with one writer; their difference
        # is the count at the host. ``done`` does not pass ``sent`` (a host_done of a QP with
        # none at the host, one in the cycle of its own forward aside, changes nothing).
        hq = self.host_done_qp
        sent_n, sent_hq = self._counter(m, "hostq_sent", 6, (qp, to_host),
                                        self.notify.payload.qp, hq, comb=True)
        up_same = to_host & (qp == hq)
        done_n, = self._counter(m, "hostq_done", 6, (hq, self.host_done),
                                self.notify.payload.qp, comb=True,
                                guard=lambda done: (sent_hq != done) | up_same)
        notify_free = Signal()
        m.d.comb += notify_free.eq(sent_n == done_n)
        return notify_free


def read_window_for(rx_buffer, pmtu=1024, frame_overhead=70):
    """The READ window (data octets) that a MAC receive buffer of ``rx_buffer`` octets holds:
    the buffer less one largest frame of other traffic (a path-MTU-4096 SEND, 4096 + 82
    octets), each ``pmtu`` octets of response data taking ``frame_overhead`` more (Ethernet,
    IPv4, UDP, BTH, AETH, ICRC, FCS: 66, rounded up). ``pmtu`` 1024: the smallest path MTU the
    bench and the board use; a smaller one needs a smaller window."""
    room = rx_buffer - (4096 + 82)
    return max(0, room * pmtu // (pmtu + frame_overhead))


class _Steps:
    """A stage's building blocks: the stage's memory-bus master handed to the unit a state
    runs, states that wait for a unit, the request's result."""

    def __init__(self, m, u, port, units):
        self.m, self.u, self.port = m, u, port
        for unit in units:
            m.d.comb += unit.mem.rsp.payload.eq(port.rsp.payload)

    def bus_to(self, unit):
        """The stage's bus belongs to ``unit`` in this state. (None of the units has an access
        in flight when the bus changes hands: each finishes its reads first.)"""
        req, rsp = self.port.req, self.port.rsp
        self.m.d.comb += [req.valid.eq(unit.mem.req.valid), req.payload.eq(unit.mem.req.payload),
                          unit.mem.req.ready.eq(req.ready), unit.mem.rsp.valid.eq(rsp.valid),
                          rsp.ready.eq(unit.mem.rsp.ready)]

    def run(self, state, unit, then, *sync):
        """A state that gives the bus to ``unit`` until it is done, then goes to ``then``."""
        m = self.m
        with m.State(state):
            self.bus_to(unit)
            with m.If(unit.done):
                m.d.sync += sync
                m.next = then

    def read(self, addr, words):
        """Start the word reader."""
        r = self.u.reader
        self.m.d.comb += [r.start.eq(1), r.addr.eq(addr), r.words.eq(words)]

    def finish(self, status, gen=0, dlen=0, bo=0, res=None):
        """A request's result (not a decode-level error): the front's, or ``res``."""
        res = self.u.res if res is None else res
        return [res.status.eq(status.value), res.gen.eq(gen), res.dlen.eq(dlen),
                res.boff.eq(bo), res.raw.eq(0)]

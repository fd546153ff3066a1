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

The FSM takes one request at a time, all QPs. Why: the draft requires in-order processing per
connection, and one ring allocator (hw/kbtp/ring_alloc.py, started by this FSM) makes the ring
counters atomic for free (every counter update, the host's included, goes through it, so Head
FetchAdds and Tail FetchAdds serialise without locking the memory arbiter).

It waits for a WorkCompletion only where the draft needs the result (issue 20): the RDMA READ
of a store's data (before the entry update and the COMPLETION) and the record's WRITE_IMM (a
failed one falls back to a Send). A LOAD's WRITE and a COMPLETION Send go to the requester and
the next request is taken at once: on one RC QP the initiator sees the WRITE before the Send
behind it. What they still read stays put until their WorkCompletions (``_in_flight``): each
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
idle or polling a slot. The allocator owns the memory bus while this FSM is idle or waits for it.
Host commands, queued frees included, go before a message waiting in IDLE: a burst of queued
frees that do not defer delays the next message by their run (about 15 cycles each).

ADDR_LE: CTRL bit 2 says the structures' Block Offsets (table entries, ring slots) are
little-endian (the target's ``addr_le``); a session's bit 2 that its requests' Block Handle and
Data / Completion Descriptor fields are (host/codec.py lists them). COMPLETIONs and records stay
big-endian (codec Readings).

Assumptions: receive buffers, scratch buffers, table, ring and pool blocks are 8-octet
aligned; Block Size is a multiple of 8; Head/Tail counters little-endian (the model's counter
order); one shared ring (no DIRECT_ALLOC partitions on the fast path).

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
hw/kbtp/completion.py (COMPLETION Send or record), hw/kbtp/ring_alloc.py (the ring). This file
sequences them: one FSM, each state starting a block or waiting for its ``done``, and the
memory bus given to the block that runs.
"""

from types import SimpleNamespace

from amaranth.hdl import Array, Cat, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from hw.headers import CommonHeader, Opcode, Status
from hw.iface import (ADDR_BITS, HostBusSignature, MemBusSignature, QP_INDEX_BITS, REG_KBTP,
                      RecvNotify, RecvRepost, WorkCompletion, WorkRequest, WrOp)
from hw.kbtp.completion import Completion
from hw.kbtp.decode import MSG_WORDS, RESULT, Dispatch, EntryNext, RequestDecoder, entry_boff
from hw.kbtp.engine_regs import EngineRegs
from hw.kbtp.movers import (WR_LOCK, WR_SCRATCH, WR_SYNC, EntryWriter, InlineCopy, LoadLocks,
                            WordReader, WorkIssuer)
from hw.kbtp.regmap import ENGINE_ID, SCRATCH_SLOTS, SLOT_SIZE, reg
from hw.kbtp.ring_alloc import Cmd, RingAllocator, RingOp

__all__ = ["KbtpEngine", "ENGINE_ID", "FAST_OPS", "Cmd", "reg", "SCRATCH_SLOTS", "SLOT_SIZE"]

#: Fast-path opcodes, in counter order (op index 0, 1, 2).
FAST_OPS = (Opcode.LOAD, Opcode.STORE, Opcode.ALLOC_STORE)


class KbtpEngine(wiring.Component):
    """KBTP fast-path engine (see the module docstring for behaviour, docs/registers.md for the
    register map).

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

    #: The ring allocator's class (a mutant's, for the negative tests of
    #: tests/hw/kbtp/test_formal_ring.py).
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

    def elaborate(self, platform):
        m = Module()
        u = self._blocks(m)
        regs, dec, reader, issuer, cpl, ring = u.regs, u.dec, u.reader, u.issuer, u.cpl, u.ring
        cfg, sess, req, ent, cur, res = regs.cfg, regs.session, dec.req, dec.entry, u.cur, u.res
        st = _Steps(m, u, self.mem)
        bus_to, run, finish, ring_op, read = st.bus_to, st.run, st.finish, st.ring_op, st.read

        with m.FSM():
            with m.State("IDLE"):
                # Host commands first, then a message, then a deferred free's retry (the ring
                # allocator takes the commands and the retry when granted, with the bus).
                bus_to(ring)
                with m.If(~regs.cmd_valid & ring.idle & self.notify.valid & u.notify_free):
                    m.d.comb += [self.notify.ready.eq(1), regs.started.eq(1)]
                    m.d.sync += cur.eq(self.notify.payload)
                    m.next = "NOTIFIED"
                with m.Else():
                    m.d.comb += ring.grant.eq(1)

            with m.State("NOTIFIED"):
                with m.If(~cfg.ctrl[0] | ~sess.valid | (cur.length < CommonHeader.SIZE)):
                    m.next = "HOSTQ"
                with m.Else():
                    read(cur.addr, MSG_WORDS)
                    m.next = "READ_MSG"

            with m.State("HOSTQ"):
                m.d.comb += [self.hostq.valid.eq(1), self.hostq.payload.eq(cur)]
                with m.If(self.hostq.ready):
                    m.d.comb += regs.to_host.eq(1)
                    m.next = "IDLE"

            run("READ_MSG", reader, "DECODE")
            with m.State("DECODE"):
                m.d.sync += u.msg.eq(reader.data)
                m.next = "DISPATCH"

            with m.State("DISPATCH"):
                with m.Switch(dec.dispatch):
                    with m.Case(Dispatch.HOSTQ):
                        m.next = "HOSTQ"
                    with m.Case(Dispatch.COMPLETE):
                        m.d.sync += res.eq(dec.d_result)
                        m.next = "COMPLETE"
                    with m.Case(Dispatch.READ_ENTRY):
                        read(dec.entry_addr, 2)
                        m.next = "READ_ENTRY"

            run("READ_ENTRY", reader, "ENTRY_CHK")
            with m.State("ENTRY_CHK"):
                m.d.sync += [u.ent_raw.eq(reader.data[:128]),
                             u.boff.eq(entry_boff(reader.data[:128], cfg.ctrl[2]))]
                m.next = "ENTRY_CHK2"

            with m.State("ENTRY_CHK2"):
                with m.Switch(dec.entry_next):
                    with m.Case(EntryNext.COMPLETE):
                        m.d.sync += res.eq(dec.e_result)
                        m.next = "COMPLETE"
                    with m.Case(EntryNext.LOAD_WRITE):
                        # (a LoadLocks entry for the block it sends; all taken: wait)
                        with m.If(u.locks.avail):
                            m.d.comb += issuer.cmd.valid.eq(1)
                            m.next = "DATA_WC"
                    with m.Case(EntryNext.OBTAIN):
                        m.next = "OBTAIN"
                    with m.Case(EntryNext.RING_ALLOC):
                        m.next = "RING_ALLOC"

            # -------- ALLOC_STORE: the ring allocator takes a block (or finds the ring empty)
            def allocated():
                with m.If(ring.empty):
                    m.d.sync += finish(Status.NO_SPACE, ent.gen)
                    m.next = "COMPLETE"
                with m.Else():
                    m.d.sync += u.boff.eq(ring.block)
                    m.d.comb += regs.usage_inc.eq(1)
                    m.next = "OBTAIN"
            ring_op("RING_ALLOC", RingOp.ALLOC, "RING_ALLOC_WAIT", allocated)

            # -------- STORE / ALLOC_STORE: get the data into the block
            with m.State("OBTAIN"):
                with m.If(u.locks.hit):
                    pass        # a LOAD's WRITE still reads this block: wait for its completion
                with m.Elif(req.dd_len == 0):
                    m.next = "AFTER_DATA"
                with m.Elif(req.inline):
                    m.d.comb += u.copy.start.eq(1)
                    m.next = "COPY"
                with m.Else():
                    m.d.comb += issuer.cmd.valid.eq(1)
                    m.next = "DATA_WC"

            run("COPY", u.copy, "AFTER_DATA")
            with m.State("AFTER_DATA"):
                m.d.comb += u.entry.start.eq(1)
                m.next = "ENTRY_UPDATE"

            # -------- the RDMA WRITE (LOAD) or READ (STORE, ALLOC_STORE) of the data
            with m.State("DATA_WC"):
                with m.If(issuer.done):
                    m.next = "DATA_GOT"

            with m.State("DATA_GOT"):
                m.next = "COMPLETE"
                with m.If(req.is_load & issuer.ok):
                    m.d.sync += finish(Status.OK, ent.gen, ent.dlen, ent.boff)
                with m.Elif(issuer.ok):
                    m.d.comb += u.entry.start.eq(1)
                    m.next = "ENTRY_UPDATE"
                with m.Elif(req.is_alloc):
                    # The model returns the block to the ring (Readings 10): the ring allocator
                    # writes it into its slot before we complete.
                    m.next = "RING_RETURN"
                with m.Else():
                    m.d.sync += finish(Status.INTERNAL, ent.gen)

            # Entry update: Data Length (+ Block Offset) before Flags + Generation.
            run("ENTRY_UPDATE", u.entry, "COMPLETE",
                *finish(Status.OK, Mux(req.is_alloc, ent.next_gen, ent.gen), req.dd_len, u.boff))

            def returned():
                m.d.comb += regs.usage_dec.eq(1)
                m.d.sync += finish(Status.INTERNAL, ent.gen)
                m.next = "COMPLETE"
            ring_op("RING_RETURN", RingOp.RETURN, "RING_RETURN_WAIT", returned)

            # -------- completion: record by WRITE_IMM, else COMPLETION Send
            with m.State("COMPLETE"):
                with m.If(u.slot_free):
                    m.d.comb += cpl.start.eq(1)
                    m.next = "COMPLETING"

            with m.State("COMPLETING"):
                m.d.comb += [issuer.cmd.valid.eq(cpl.wr.valid),
                             issuer.cmd.payload.eq(cpl.wr.payload),
                             cpl.wr.ready.eq(issuer.cmd.ready)]
                bus_to(cpl)
                with m.If(cpl.done):
                    m.next = "DONE"

            with m.State("DONE"):
                m.d.comb += [self.repost.valid.eq(regs.count_ready),
                             self.repost.payload.qp.eq(cur.qp)]
                with m.If(self.repost.valid & self.repost.ready):
                    m.d.comb += regs.finished.eq(1)
                    m.next = "IDLE"
        return m

    def _blocks(self, m):
        """The blocks, the request's registers, and the wiring that does not depend on the
        FSM's state."""
        sm = m.submodules
        sm.regs = regs = EngineRegs(self.n_qp, self.n_ranges, self.base)
        sm.dec = dec = RequestDecoder(self.n_ranges)
        sm.reader = reader = WordReader(MSG_WORDS)
        sm.copy = copy = InlineCopy()
        sm.entry = entry = EntryWriter()
        sm.issuer = issuer = WorkIssuer()
        sm.cpl = cpl = Completion()
        # The ring allocator (hw/kbtp/ring_alloc.py) does every ring access: ALLOC, RETURN and
        # the host commands; it owns the memory bus while the FSM waits for it or is idle.
        sm.ring = ring = self.ring_cls()
        wiring.connect(m, wiring.flipped(self.bus), regs.bus)
        wiring.connect(m, wiring.flipped(self.wr), issuer.wr)
        wiring.connect(m, wiring.flipped(self.wc), issuer.wc)
        cfg, sess, req, ent = regs.cfg, regs.session, dec.req, dec.entry

        # The request: its RecvNotify, message, table entry, block and result.
        u = SimpleNamespace(regs=regs, dec=dec, reader=reader, copy=copy, entry=entry,
                            issuer=issuer, cpl=cpl, ring=ring,
                            cur=Signal(RecvNotify), msg=Signal(len(dec.msg)),
                            ent_raw=Signal(128), boff=Signal(64), res=Signal(RESULT))
        qp, baddr = u.cur.qp, Signal(ADDR_BITS)
        m.d.comb += [
            baddr.eq(cfg.pool_base + (u.boff - cfg.pool_to_base)[:ADDR_BITS]),
            regs.qp.eq(qp), regs.range_idx.eq(dec.range_idx),
            regs.count_k.eq(Cat(u.res.status[:4], req.op_idx)),
            regs.wr_fire.eq(self.wr.valid & self.wr.ready),
            dec.msg.eq(u.msg), dec.length.eq(u.cur.length), dec.cfg.eq(cfg),
            dec.session.eq(sess), dec.range.eq(regs.range), dec.ent.eq(u.ent_raw),
            copy.src.eq(u.cur.addr + req.pos), copy.dst.eq(baddr), copy.length.eq(req.dd_len),
            entry.alloc.eq(req.is_alloc), entry.seal.eq(req.seal), entry.addr.eq(dec.entry_addr),
            entry.dlen.eq(req.dd_len), entry.boff.eq(u.boff), entry.flags.eq(ent.flags),
            entry.next_gen.eq(ent.next_gen), entry.le.eq(cfg.ctrl[2]),
            cpl.req.eq(req), cpl.result.eq(u.res), cpl.granted.eq(sess.record),
            cpl.wr_done.eq(issuer.done), cpl.wr_ok.eq(issuer.ok),
        ]
        self._in_flight(m, u, baddr)
        # The RDMA transfer of the data (the completion's WorkRequest goes through the issuer
        # too, in state COMPLETING): LOAD writes the block to the initiator, STORE and
        # ALLOC_STORE read the initiator's data into it.
        data_wr = issuer.cmd.payload
        m.d.comb += data_wr.wr_id.eq(Mux(req.is_load, WR_LOCK | u.locks.free_idx, WR_SYNC))
        m.d.comb += [issuer.qp.eq(qp), data_wr.op.eq(Mux(req.is_load, WrOp.WRITE, WrOp.READ)),
                     data_wr.rkey.eq(req.dd_stag), data_wr.va.eq(req.dd_to),
                     data_wr.length.eq(Mux(req.is_load, ent.dlen, req.dd_len)),
                     data_wr.laddr.eq(baddr)]
        # Ring: configuration and host commands go to the ring allocator, its state to the
        # registers.
        m.d.comb += [ring.ring_base.eq(cfg.ring_base), ring.ring_order.eq(cfg.ring_order),
                     ring.head_addr.eq(cfg.head_addr), ring.tail_addr.eq(cfg.tail_addr),
                     ring.masked.eq(cfg.ctrl[1]), ring.le.eq(cfg.ctrl[2]),
                     ring.cmd_valid.eq(regs.cmd_valid),
                     ring.cmd_kind.eq(regs.cmd_kind), ring.cmd_arg.eq(regs.cmd_arg),
                     ring.block_in.eq(u.boff), regs.cmd_ack.eq(ring.cmd_ack),
                     regs.deferred.eq(ring.deferred), regs.cmd_result.eq(ring.cmd_result),
                     regs.occupancy.eq(ring.occupancy), regs.stall.eq(ring.stall)]
        u.notify_free = self._host_order(m, qp, regs.to_host)
        return u

    def _in_flight(self, m, u, baddr):
        """What the engine has on the wire without waiting for it: the blocks of LOADs
        (LoadLocks) and the SCRATCH slots of completions, per QP a ring of SCRATCH_SLOTS taken
        in issue order and freed in completion order (one RC QP completes in order)."""
        issuer, wr = u.issuer, self.wr.payload
        m.submodules.locks = u.locks = locks = LoadLocks()
        m.d.comb += [locks.take.eq(issuer.issued & (wr.wr_id & WR_LOCK != 0)),
                     locks.take_idx.eq(wr.wr_id), locks.take_addr.eq(wr.laddr),
                     locks.release.eq(issuer.release_lock), locks.release_idx.eq(issuer.lock_idx),
                     locks.probe.eq(baddr)]
        k = SCRATCH_SLOTS
        taken = [Signal(range(2 * k), name=f"slots_taken{q}") for q in range(self.n_qp)]
        freed = [Signal(range(2 * k), name=f"slots_freed{q}") for q in range(self.n_qp)]
        take = issuer.issued & (wr.wr_id & WR_SCRATCH != 0)
        for q in range(self.n_qp):
            with m.If(take & (u.cur.qp == q)):
                m.d.sync += taken[q].eq(Mux(taken[q] == 2 * k - 1, 0, taken[q] + 1))
            with m.If(issuer.release_scratch & (issuer.release_qp == q)):
                m.d.sync += freed[q].eq(Mux(freed[q] == 2 * k - 1, 0, freed[q] + 1))
        n_qp_bits = max(1, (self.n_qp - 1).bit_length())
        t, f = Array(taken)[u.cur.qp[:n_qp_bits]], Array(freed)[u.cur.qp[:n_qp_bits]]
        slot = Signal(range(k))
        u.slot_free = Signal()
        m.d.comb += [slot.eq(Mux(t >= k, t - k, t)),
                     u.slot_free.eq((t != f + k) & (t + k != f)),
                     u.cpl.scratch.eq(u.regs.session.scratch + slot * SLOT_SIZE)]

    def _host_order(self, m, qp, to_host):
        """Messages forwarded to the host and not yet finished there, per QP; returns "the QP
        of the RecvNotify offered now has none"."""
        at_host = [Signal(range(64), name=f"at_host{q}") for q in range(self.n_qp)]
        for q in range(self.n_qp):
            up = to_host & (qp == q)
            down = self.host_done & (self.host_done_qp == q)
            with m.If(up & ~down):
                m.d.sync += at_host[q].eq(at_host[q] + 1)
            with m.Elif(down & ~up & (at_host[q] != 0)):
                m.d.sync += at_host[q].eq(at_host[q] - 1)
        notify_free = Signal()
        n_qp_bits = max(1, (self.n_qp - 1).bit_length())
        m.d.comb += notify_free.eq(Array(at_host)[self.notify.payload.qp[:n_qp_bits]] == 0)
        return notify_free


class _Steps:
    """The engine FSM's building blocks: the memory bus handed to the block a state runs, states
    that wait for a block, the request's result."""

    def __init__(self, m, u, mem):
        self.m, self.u, self.mem = m, u, mem
        for unit in (u.reader, u.copy, u.entry, u.cpl, u.ring):
            m.d.comb += unit.mem.rsp.payload.eq(mem.rsp.payload)

    def bus_to(self, unit):
        """The memory bus belongs to ``unit`` in this state. (None of the units has an access
        in flight when the bus changes hands: each finishes its reads first.)"""
        req, rsp = self.mem.req, self.mem.rsp
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

    def finish(self, status, gen=0, dlen=0, bo=0):
        """The request's result (not a decode-level error)."""
        res = self.u.res
        return [res.status.eq(status.value), res.gen.eq(gen), res.dlen.eq(dlen),
                res.boff.eq(bo), res.raw.eq(0)]

    def ring_op(self, state, op, wait, done):
        """A state that starts a ring allocator operation (ALLOC, RETURN) when the allocator
        takes it (it may still be serving a host command), and one that waits for its end (the
        allocator owns the memory bus in both), then runs ``done()``."""
        m, ring = self.m, self.u.ring
        with m.State(state):
            self.bus_to(ring)
            m.d.comb += [ring.start.eq(1), ring.op.eq(op), ring.grant.eq(1)]
            with m.If(ring.ack):
                m.next = wait
        with m.State(wait):
            self.bus_to(ring)
            m.d.comb += ring.grant.eq(1)
            with m.If(ring.done):
                done()

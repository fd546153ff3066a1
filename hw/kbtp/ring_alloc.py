# Ref: draft KBTP §Free-Block Ring (Head/Tail counters, masked FetchAdd Add Data/Add Mask, Ring
#      Slot Sequence + Block Offset, all ones = consumed, "Block Offset before Sequence"),
#      §Block Unmapped Store (allocation), §Block Free; docs/layouts.md (Ring Slot,
#      counter layout); model/ring.py (slot_free_for: the strict free check).
"""The ring allocator: every access of the KBTP engine to the free-block rings.

One unit behind one memory-bus master, so that the ring's rules live in one place that can be
proven on its own: tests/hw/kbtp/test_formal_ring.py model-checks this unit (bounded, every
input free, from every idle image of a 2-slot ring; on a one-cycle RAM an allocation from idle
is done 12 cycles after its start, 11 with its slot predicted, 14 before the Tail and Head reads
were issued together; inside the engine it comes after the message's decode and table check),
and checks the engine around it with the same ghost checks in simulation.

Rings
-----
Ring 0 is the shared ring; rings 1..3 are DIRECT_ALLOC partitions 0..2 (draft §Allocation
Quotas: "the target instead gives each initiator its own ring and Head counter over a partition
of the pool"). An operation names its ring (``ring``, with ``start``), a host command in
``cmd_ring`` (the top bits of its argument, hw/kbtp/engine_regs.py ``RING_SHIFT``). What differs
on a partition ring:

* its initiator takes tickets on the same Head by RDMA FetchAdd: the allocation's read of Head
  is a locked memory read (``MemReq.lock``; the arbiters keep the bus with us up to our next
  request, the Head's write), and an empty ring writes Head back unchanged to end the lock;
* "empty" also covers Head past Tail (the initiator took more tickets than the ring holds);
* a slot that shows our ticket consumed by someone else (the host's BIND of our ticket by an
  initiator that did not take it, or its reclamation after a Ticket Timeout) ends the
  allocation as ``empty`` (NO_SPACE) instead of polling for ever.

The formal check (tests/hw/kbtp/test_formal_ring.py) covers the shared ring (``ring`` 0, the
partition ports at 0); tests/hw/kbtp/test_ring_partitions.py simulates the partition rings
against a concurrent locking FetchAdd master.

Operations
----------
ALLOC (``start`` with ``op`` = :attr:`RingOp.ALLOC`)
    Read Tail and Head (both requested before the first answer); if Tail ticket == Head
    ticket the ring is empty (``empty``, the engine answers NO_SPACE); else masked FetchAdd on
    Head (the old value's ticket t is ours),
    then re-read slot t mod N until its Sequence == t and its Block Offset is not all ones,
    take the Block Offset (``block``) and write all ones into it (consume). While the slot
    waits for its free, pending host commands and a deferred free are served from the poll.
    *Speculative* (``spec`` with ``start``; the shared ring only): the engine starts it beside
    its read of the request's table entry, before it knows whether the request allocates. The
    unit reads Tail and Head and waits for ``go`` (on as above) or ``cancel`` (back to idle,
    nothing written). Nothing else writes the shared ring's Head and Tail meanwhile: every
    update of them is this unit's (the same reason its Head read needs no lock there).
RETURN (``op`` = :attr:`RingOp.RETURN`, ``block_in``, ``ring``)
    A block the engine took and could not fill (its RDMA READ failed) goes back to the ring it
    came from (model/target.py Readings 10): first the deferred free, if any, is finished (its
    block kept apart from ``block_in`` meanwhile); then a free of ``block_in`` (below),
    finished before ``done``. (A deferred free on a partition ring waits for its initiator's
    BIND, or the host's reclamation of the ticket: the RETURN waits with it.)
Host commands (``cmd_valid`` / ``cmd_kind`` / ``cmd_arg``, served when ``grant`` is high and the
unit is idle, or from an allocation's slot poll)
    TAIL_FETCHADD: masked FetchAdd on Tail, old value in ``cmd_result`` (the host frees that
    ticket's slot itself). FREE_BLOCK: the same FetchAdd for ticket u, then the strict free
    check: the slot u mod N is written only when it is consumed AND its Sequence == u - N
    (model/ring.py ``slot_free_for``; the draft's "consumed" alone loses blocks under
    concurrent frees), Block Offset first, then Sequence. A free that cannot write yet is
    *deferred* (``deferred``; one at a time) and retried whenever the unit is idle and granted,
    or polling a slot.

Ports
-----
ring_base, head_addr, tail_addr : In(ADDR_BITS); ring_order : In(5); masked : In(1); le : In(1)
    Configuration of the shared ring (engine registers). ``masked`` 1: the draft's Add Data /
    Add Mask; 0: InfiniBand unmasked FetchAdd, slot = 16 * (ticket mod N). ``le``: ADDR_LE
    structures, the slots' Block Offsets are little-endian.
parts : In(PART_CFG).array(ENGINE_PARTS); part_order : In(5)
    The partition rings (PART<p>_RING / _HEAD / _TAIL, PART_ORDER).
start : In(1), op : In(RingOp), ring : In(RING_BITS), block_in : In(64)
    Operation request and its ring, held until ``ack``.
spec : In(1)
    With ``start``: the ALLOC is speculative (ignored for RETURN and partition rings).
go : In(1), cancel : In(1)
    One-cycle strobes, one of them once per speculative ALLOC, any cycle after its ``ack``:
    carry it out / drop it (no ``done`` then).
ack : Out(1)
    The request is taken this cycle (the unit was idle).
done : Out(1)
    One-cycle strobe: the operation has finished; ``empty`` and ``block`` are its result.
empty : Out(1), block : Out(64), occupancy : Out(32)
    ALLOC result: ring empty / the block taken; Tail - Head at the last ALLOC's check.
stall : Out(1)
    One-cycle strobe per re-read of a slot that does not hold its ticket's block yet.
grant : In(1)
    The unit may start host-command work from idle now (the engine is idle and not taking a
    message this cycle).
idle : Out(1)
    The unit is idle (no operation, no memory access in flight).
cmd_valid : In(1), cmd_kind : In(2), cmd_arg : In(64), cmd_ring : In(RING_BITS)
    A host command (:class:`Cmd`) on ring ``cmd_ring``, held until ``cmd_ack``.
cmd_ack : Out(1), cmd_result : Out(64)
    One-cycle strobe when the command's Tail FetchAdd is written; the counter value before it.
deferred : Out(1)
    A free holds its Tail ticket and waits for its slot.
mem : Out(MemBusSignature())
"""


from types import SimpleNamespace

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, enum, wiring
from amaranth.lib.wiring import In, Out

from hw.headers import RING_ADD_DATA, RING_ADD_DATA_UNMASKED, SLOT_EMPTY, RingSlot

from hw.lib.fetchadd import masked_add_value
from hw.iface import ADDR_BITS, MemBusSignature
from hw.lib.membus import be_field, bswap64, read_words
from hw.kbtp.regmap import ENGINE_PARTS, RING_BITS

__all__ = ["RingAllocator", "RingOp", "Cmd", "PART_CFG"]

#: A DIRECT_ALLOC partition's ring (engine registers PART<p>_RING / _HEAD / _TAIL).
PART_CFG = data.StructLayout({"ring": ADDR_BITS, "head": ADDR_BITS, "tail": ADDR_BITS})


class RingOp(enum.Enum, shape=1):
    ALLOC = 0
    RETURN = 1


class Cmd:
    """Host command codes (the engine's CMD register)."""
    TAIL_FETCHADD = 1
    FREE_BLOCK = 2


class RingAllocator(wiring.Component):
    """Free-block ring allocator (see the module docstring)."""

    def __init__(self):
        super().__init__({
            "ring_base": In(ADDR_BITS), "ring_order": In(5), "head_addr": In(ADDR_BITS),
            "tail_addr": In(ADDR_BITS), "masked": In(1),
            "parts": In(PART_CFG).array(ENGINE_PARTS), "part_order": In(5),
            "start": In(1), "op": In(RingOp), "ring": In(RING_BITS), "block_in": In(64),
            "spec": In(1), "go": In(1), "cancel": In(1),
            "le": In(1),
            "ack": Out(1), "done": Out(1), "empty": Out(1), "block": Out(64),
            "occupancy": Out(32), "stall": Out(1),
            "grant": In(1), "idle": Out(1),
            "cmd_valid": In(1), "cmd_kind": In(2), "cmd_arg": In(64), "cmd_ring": In(RING_BITS),
            "cmd_ack": Out(1), "cmd_result": Out(64), "deferred": Out(1),
            "mem": Out(MemBusSignature()),
        })

    def elaborate(self, platform):
        m = Module()
        req = self.mem.req
        EMPTY = SLOT_EMPTY

        # The rings: 0 the shared ring, p + 1 partition p. Each routine keeps the number of its
        # ring in a flop (``a_ring`` the allocation's or the return's, ``f_ring`` the free's,
        # ``c_ring`` the ring whose counter the FetchAdd arithmetic is on now), and the
        # addresses follow from it through a multiplexer of configuration registers.
        a_ring, f_ring, c_ring = (Signal(RING_BITS, name=n) for n in ("a_ring", "f_ring", "c_ring"))

        def ring_cfg(r, name):
            c = SimpleNamespace(**{k: Signal(ADDR_BITS, name=f"{name}_{k}")
                                   for k in ("base", "head", "tail")},
                                order=Signal(5, name=f"{name}_order"))
            with m.Switch(r):
                with m.Case(0):
                    m.d.comb += [c.base.eq(self.ring_base), c.head.eq(self.head_addr),
                                 c.tail.eq(self.tail_addr), c.order.eq(self.ring_order)]
                for p in range(ENGINE_PARTS):
                    with m.Case(p + 1):
                        pc = self.parts[p]
                        m.d.comb += [c.base.eq(pc.ring), c.head.eq(pc.head),
                                     c.tail.eq(pc.tail), c.order.eq(self.part_order)]
            return c
        ar, fr, cr = ring_cfg(a_ring, "a"), ring_cfg(f_ring, "f"), ring_cfg(c_ring, "c")
        a_part = Signal()           # the allocation is on a partition ring
        m.d.comb += a_part.eq(a_ring != 0)

        n_slots = Signal(33)
        m.d.comb += n_slots.eq(1 << cr.order)
        # Add Data / Add Mask as 64-bit signals (as a plain expression the mask is 127 bits
        # wide: a 64-bit constant shifted by up to 35).
        add_data = Signal(64)
        add_mask = Signal(64)
        m.d.comb += [add_data.eq(Mux(self.masked, RING_ADD_DATA, RING_ADD_DATA_UNMASKED)),
                     add_mask.eq(Mux(self.masked, (1 << 63) | (1 << 31) |
                                     (Const(1, 64) << (cr.order + 3))[:64], 0))]
        ctr = Signal(64)            # counter value read (little-endian memory = value)
        ctr_new = Signal(64)
        rbuf = Signal(256)          # the read routine's buffer (big-endian octets)
        m.d.comb += ctr.eq(bswap64(rbuf[:64]))     # the last counter read
        m.d.comb += ctr_new.eq(masked_add_value(ctr, add_data, add_mask, 64))
        ctr_ticket = ctr[32:]
        ctr_off = Signal(32)
        m.d.comb += ctr_off.eq(Mux(self.masked, ctr[:32] & ((n_slots << 4) - 1),
                                   (ctr_ticket & (n_slots - 1)) << 4))
        tail_ticket = Signal(32)
        ticket = Signal(32)         # the allocation's Head ticket
        slot_off = Signal(32)       # ... and its slot's offset

        # Read routine: up to 4 words into rbuf (the last in its low 64 bits), from rd_addr,
        # then rd_next, rd_next2, rd_next3 (consecutive words for a slot; for an allocation
        # Tail then Head, after its predicted slot's two words if any: all of them wait for
        # one read latency together, not one each; a DDR3 read is some 18 core cycles at the
        # ECPIX-5's core clock, more behind the other masters' traffic).
        rd_addr, rd_next, rd_next2, rd_next3 = (Signal(ADDR_BITS, name=n) for n in
                                                ("rd_addr", "rd_next", "rd_next2", "rd_next3"))
        rd_issue = Signal(3)        # words still to request
        rd_wait = Signal(3)         # responses still to come
        RET = ["A_HEAD_CHK", "A_SLOT_CHK", "FR_TAIL_W", "FR_SLOT_CHK"]
        rd_ret = Signal(range(len(RET)))
        rd_lock = Signal()          # the last word is a partition Head's, locked up to its write

        def read(addr, words, ret, lock=0, then=()):
            # (consecutive words: rd_next = addr + 8; the later ones are not used then)
            nxt = list(then) + [addr + 8] * (3 - len(then))
            return [rd_addr.eq(addr), rd_next.eq(nxt[0]), rd_next2.eq(nxt[1]),
                    rd_next3.eq(nxt[2]), rd_issue.eq(words), rd_wait.eq(words),
                    rd_ret.eq(RET.index(ret)), rd_lock.eq(lock)]

        # The shared ring's next slot, predicted: the slot after the one the last allocation
        # took (its ticket + 1) is read with Tail and Head; when Head shows that ticket (nothing
        # else writes the shared Head), the allocation polls that read instead of reading the
        # slot after its Head write. Reading a slot before holding its ticket is safe: a slot
        # that shows ticket t's block keeps it until the holder of t consumes it (a free of the
        # same slot waits for that), and one that does not yet is polled again.
        pred_v = Signal()           # a prediction exists (an allocation of the shared ring ran)
        pred_off = Signal(32)       # its slot offset
        pred_rd = Signal()          # this allocation read the predicted slot ...
        pred_at = Signal(ADDR_BITS)     # ... at this address (rbuf[128:256])
        slot_at = Signal(ADDR_BITS)
        m.d.comb += slot_at.eq(ar.base + ctr_off)

        sl_seq = be_field(rbuf[:128], 16, RingSlot, "sequence")
        sl_boff = Signal(64)     # (little-endian with ADDR_LE structures)
        m.d.comb += sl_boff.eq(Mux(self.le,
                                   bswap64(be_field(rbuf[:128], 16, RingSlot, "block_offset")),
                                   be_field(rbuf[:128], 16, RingSlot, "block_offset")))

        # Free routine state.
        fr_cmd = Signal()           # the free is a host command (else a RETURN)
        fr_block = Signal(64)       # block being freed
        ret_block = Signal(64)      # the RETURN's block, until the deferred free is done
        fr_u = Signal(32)           # its Tail ticket
        fr_o = Signal(32)           # its slot offset
        FRET = ["IDLE", "A_SLOT_RD", "R_WAIT", "R_DONE"]
        f_ret = Signal(range(len(FRET)))

        def take_cmd(ret):
            """Serve the host command: Tail FetchAdd first (its read in FR_TAIL_RD, from the
            ring number in a flop)."""
            return [fr_cmd.eq(1), fr_block.eq(self.cmd_arg), f_ret.eq(FRET.index(ret)),
                    f_ring.eq(self.cmd_ring), c_ring.eq(self.cmd_ring)]

        def retry(ret):
            """Retry the deferred free: re-read its slot."""
            return [f_ret.eq(FRET.index(ret)), c_ring.eq(f_ring),
                    *read(fr.base + fr_o, 2, "FR_SLOT_CHK")]

        block_r = Signal(64)
        empty_r = Signal()
        occ_r = Signal(32)
        res_r = Signal(64)
        deferred = Signal()
        m.d.comb += [self.block.eq(block_r), self.empty.eq(empty_r), self.occupancy.eq(occ_r),
                     self.cmd_result.eq(res_r), self.deferred.eq(deferred)]

        # A speculative allocation (``spec`` with ``start``, shared ring only) reads Tail and
        # Head and then waits for the engine's verdict: ``go`` (the request passed its checks:
        # on as any allocation) or ``cancel`` (it did not: back to IDLE, nothing written).
        # Either may come at any time after ``ack``; ``held`` remembers it. The checks below
        # read the verdict from its flops only, a cycle after it comes: the engine's checks
        # that decide it (the context queue's, the session registers) then end at those
        # flops instead of running on through the Head write's request into the memory
        # arbiters (the ECPIX-5 core clock's critical path at seed 3, 26.8 ns).
        held, v_go, v_cancel = Signal(), Signal(), Signal()
        with m.If(self.go):
            m.d.sync += v_go.eq(1)
        with m.If(self.cancel):
            m.d.sync += v_cancel.eq(1)
        with m.FSM(name="ring"):
            with m.State("IDLE"):
                m.d.comb += self.idle.eq(1)
                with m.If(self.start):
                    m.d.comb += self.ack.eq(1)
                    m.d.sync += [a_ring.eq(self.ring), c_ring.eq(self.ring),
                                 held.eq(self.spec & (self.op == RingOp.ALLOC) &
                                         (self.ring == 0)),
                                 v_go.eq(0), v_cancel.eq(0)]
                    with m.If(self.op == RingOp.ALLOC):
                        m.next = "A_TAIL_RD"
                    with m.Else():
                        # (not into fr_block yet: a deferred free's block is there)
                        m.d.sync += ret_block.eq(self.block_in)
                        m.next = "R_WAIT"
                with m.Elif(self.grant & self.cmd_valid):
                    m.d.sync += take_cmd("IDLE")
                    m.next = "FR_TAIL_RD"
                with m.Elif(self.grant & deferred):
                    m.d.sync += retry("IDLE")
                    m.next = "READ"

            with m.State("READ"):
                # (the lock is the last word's: an allocation's Tail read is not locked)
                m.d.comb += req.payload.lock.eq(rd_lock & (rd_issue == 1))
                read_words(m, self.mem, rd_addr, rd_issue, rd_wait, rbuf, rd_ret, RET,
                           next_addr=rd_next)
                with m.If(req.valid & req.ready):
                    m.d.sync += [rd_next.eq(rd_next2), rd_next2.eq(rd_next3)]

            # -------- ALLOC: ring-empty check, masked FetchAdd on Head, slot poll, consume
            with m.State("A_TAIL_RD"):
                # Tail, then Head, both requested before the first answer (the bus keeps
                # their order). A partition's Head is FetchAdded by its initiator too (RDMA
                # atomics, whose read and write the responder locks): our read of it is
                # locked up to our write, so that no FetchAdd falls between them.
                # On the shared ring with a prediction, the predicted slot's two words first.
                with m.If(pred_v & ~a_part):
                    m.d.sync += [read(ar.base + pred_off, 4, "A_HEAD_CHK",
                                      then=(ar.base + pred_off + 8, ar.tail, ar.head)),
                                 pred_rd.eq(1), pred_at.eq(ar.base + pred_off)]
                with m.Else():
                    m.d.sync += [read(ar.tail, 2, "A_HEAD_CHK", lock=a_part, then=(ar.head,)),
                                 pred_rd.eq(0)]
                m.next = "READ"

            with m.State("A_HEAD_CHK"):
                # (rbuf: Tail in the high word, Head, ``ctr``, in the low one)
                # Empty: no ticket left before Tail. On a partition ring the initiator may
                # have taken more tickets than the ring holds (Head past Tail): empty too.
                occ = Signal(32)
                m.d.comb += [tail_ticket.eq(bswap64(rbuf[64:128])[32:]),
                             occ.eq(tail_ticket - ctr_ticket)]
                with m.If(held & v_cancel):
                    # (the shared ring: no lock to end; Tail and Head were only read)
                    m.d.sync += held.eq(0)
                    m.next = "IDLE"
                with m.Elif(held & ~v_go):
                    pass                    # the verdict is not in yet
                with m.Elif((occ == 0) | occ[31]):
                    m.d.sync += [occ_r.eq(occ), held.eq(0), empty_r.eq(1)]
                    with m.If(a_part):
                        m.next = "A_UNLOCK"
                    with m.Else():
                        m.next = "DONE"
                with m.Else():
                    m.d.comb += [req.valid.eq(1), req.payload.addr.eq(ar.head),
                                 req.payload.we.eq(1), req.payload.wdata.eq(ctr_new),
                                 req.payload.wstrb.eq(0xFF)]
                    with m.If(req.ready):
                        m.d.sync += [ticket.eq(ctr_ticket), slot_off.eq(ctr_off),
                                     empty_r.eq(0), occ_r.eq(occ), held.eq(0)]
                        with m.If(~a_part):
                            # the next allocation's slot: ticket + 1 (mod N, in octets)
                            m.d.sync += [pred_v.eq(1),
                                         pred_off.eq((ctr_off + 16) & ((n_slots << 4) - 1))]
                        with m.If(pred_rd & (slot_at == pred_at)):
                            # the predicted slot is ours: its words are already here
                            m.d.sync += rbuf[:128].eq(rbuf[128:])
                            m.next = "A_SLOT_CHK"
                        with m.Else():
                            m.d.sync += read(slot_at, 2, "A_SLOT_CHK")
                            m.next = "READ"

            with m.State("A_UNLOCK"):
                # The locked read's write: the Head as it was (the lock ends with it).
                m.d.comb += [req.valid.eq(1), req.payload.addr.eq(ar.head),
                             req.payload.we.eq(1), req.payload.wdata.eq(ctr),
                             req.payload.wstrb.eq(0xFF)]
                with m.If(req.ready):
                    m.next = "DONE"

            with m.State("A_SLOT_RD"):
                m.d.sync += read(ar.base + slot_off, 2, "A_SLOT_CHK")
                m.next = "READ"

            with m.State("A_SLOT_CHK"):
                with m.If((sl_seq == ticket) & (sl_boff != EMPTY)):
                    m.d.sync += block_r.eq(sl_boff)
                    m.next = "A_CONSUME"
                with m.Elif(a_part & (sl_seq == ticket)):
                    # Consumed by someone else: on a partition ring, the host's BIND of our
                    # ticket by an initiator that did not take it (a protocol violation, in
                    # its own partition). NO_SPACE rather than polling for ever.
                    m.d.sync += empty_r.eq(1)
                    m.next = "DONE"
                with m.Else():
                    # The slot still awaits the free of this ticket: poll, serving host frees.
                    m.d.comb += self.stall.eq(1)
                    with m.If(self.cmd_valid):
                        m.d.sync += take_cmd("A_SLOT_RD")
                        m.next = "FR_TAIL_RD"
                    with m.Elif(deferred):
                        m.d.sync += retry("A_SLOT_RD")
                        m.next = "READ"
                    with m.Else():
                        m.d.sync += read(ar.base + slot_off, 2, "A_SLOT_CHK")
                        m.next = "READ"

            with m.State("A_CONSUME"):
                m.d.comb += [req.valid.eq(1), req.payload.addr.eq(ar.base + slot_off + 8),
                             req.payload.we.eq(1), req.payload.wdata.eq(EMPTY),
                             req.payload.wstrb.eq(0xFF)]
                with m.If(req.ready):
                    m.next = "DONE"

            with m.State("DONE"):
                m.d.comb += self.done.eq(1)
                m.next = "IDLE"

            # -------- RETURN: finish the deferred free first (one at a time), then free ours
            with m.State("R_WAIT"):
                with m.If(deferred):
                    m.d.sync += retry("R_WAIT")
                    m.next = "READ"
                with m.Else():
                    m.d.sync += [fr_cmd.eq(0), f_ret.eq(FRET.index("R_DONE")),
                                 fr_block.eq(ret_block), f_ring.eq(a_ring), c_ring.eq(a_ring)]
                    m.next = "FR_TAIL_RD"

            with m.State("R_DONE"):
                with m.If(deferred):
                    # Write the returned block before completing.
                    m.d.sync += retry("R_DONE")
                    m.next = "READ"
                with m.Else():
                    m.next = "DONE"

            # -------- frees: Tail FetchAdd, then the strict slot check (model/ring.py)
            with m.State("FR_TAIL_RD"):
                m.d.sync += read(fr.tail, 1, "FR_TAIL_W")
                m.next = "READ"

            with m.State("FR_TAIL_W"):
                m.d.comb += [req.valid.eq(1), req.payload.addr.eq(fr.tail),
                             req.payload.we.eq(1), req.payload.wdata.eq(ctr_new),
                             req.payload.wstrb.eq(0xFF)]
                with m.If(req.ready):
                    m.d.sync += [fr_u.eq(ctr_ticket), fr_o.eq(ctr_off)]
                    with m.If(fr_cmd):
                        m.d.comb += self.cmd_ack.eq(1)
                        m.d.sync += res_r.eq(ctr)
                    with m.If(fr_cmd & (self.cmd_kind == Cmd.TAIL_FETCHADD)):
                        m.next = "FR_RET"
                    with m.Else():
                        m.d.sync += [deferred.eq(1),
                                     read(fr.base + ctr_off, 2, "FR_SLOT_CHK")]
                        m.next = "READ"

            with m.State("FR_SLOT_CHK"):
                with m.If((sl_boff == EMPTY) & (sl_seq == (fr_u - n_slots[:32])[:32])):
                    m.next = "FR_W_BO"
                with m.Else():
                    m.next = "FR_RET"

            with m.State("FR_W_BO"):
                m.d.comb += [req.valid.eq(1), req.payload.addr.eq(fr.base + fr_o + 8),
                             req.payload.we.eq(1), req.payload.wdata.eq(Mux(self.le, fr_block, bswap64(fr_block))),
                             req.payload.wstrb.eq(0xFF)]
                with m.If(req.ready):
                    m.next = "FR_W_SEQ"

            with m.State("FR_W_SEQ"):
                m.d.comb += [req.valid.eq(1), req.payload.addr.eq(fr.base + fr_o),
                             req.payload.we.eq(1),
                             req.payload.wdata.eq(bswap64(Cat(Const(0, 32), fr_u))),
                             req.payload.wstrb.eq(0x0F)]
                with m.If(req.ready):
                    m.d.sync += deferred.eq(0)
                    m.next = "FR_RET"

            with m.State("FR_RET"):
                with m.Switch(f_ret):
                    for i, name in enumerate(FRET):
                        with m.Case(i):
                            m.next = name
        return m

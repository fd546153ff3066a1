# Ref: draft KBTP §Free-Block Ring (masked FetchAdd on Head/Tail, Ring Slot Sequence + Block
#      Offset, all ones = consumed, deferred free), §Allocation Quotas: DIRECT_ALLOC partitions
#      (the initiator FetchAdds its partition's Head); hw/kbtp/ring_alloc.py (rings 1..3 =
#      partitions 0..2, locked Head read, A_UNLOCK, RETURN while a free is deferred).
"""The ring allocator's DIRECT_ALLOC partition rings, in simulation against the golden model.

Harness: :class:`~hw.kbtp.ring_alloc.RingAllocator` (master 0) and an "initiator" master 1 (the
testbench, playing the responder's AtomicUnit: a read of a partition Head with ``lock`` = 1,
then, after a gap, the write of its FetchAdd'ed value with ``lock`` = 0) behind
``MemArbiter(2, locking=(0, 1))`` in front of a :class:`~hw.lib.membus.MemRam`. The shared ring
(ring 0) and the partition rings (rings 1..3) sit at distinct addresses; their images are built
with model/ring.py :class:`RingImage` (``initialize``: the host driver's init image, tickets
0..F-1 filled, masked counters little-endian, Block Offsets big-endian).

Oracle: the same :class:`RingImage` objects, on a bytearray, run the same operations (``allocate``,
``take_ticket``, ``free``, ``consume``) in the order the hardware did them; the whole RAM is
compared with that image at the end of every test (so rings an operation must not touch are
checked too). Besides: tickets and blocks the allocator reports, the allocator's own bus
writes (snooped), and completion within cycle bounds (no hang, the lock released).

* test_partition_alloc_and_initiator_fetchadd_share_the_head: K allocations on partition 0's
  ring and M initiator FetchAdds on its Head, interleaved with random gaps (several seeds):
  Head ends at K + M, the tickets are disjoint and cover 0..K+M-1, each allocation got its
  ticket's block. The same schedules with ``MemArbiter(2, locking=())`` lose updates.
* test_partition_empty_when_head_passed_tail: Head == Tail and Head past Tail (the initiator
  took more tickets than the ring holds): the ALLOC answers empty, Head is unchanged, the lock
  is released (the initiator's next FetchAdd and a shared-ring ALLOC complete).
* test_frees_name_their_ring: FREE_BLOCK with cmd_ring 0, 1, 2 and a RETURN with ring 2 land in
  their own rings, nothing else changes.
* test_return_while_a_free_is_deferred: a RETURN (same ring, the shared ring, another
  partition) started while a FREE_BLOCK is deferred: both blocks end up in the ring, once.
* test_partition_ticket_consumed_by_another_answers_empty: an ALLOC whose ticket's slot the
  host consumed (a BIND by an initiator that did not take the ticket) answers empty.

Each test was checked against mutants of the allocator built in memory (lock bit dropped,
A_UNLOCK skipped, Head-past-Tail check dropped, cmd_ring / RETURN ring ignored, the RETURN
overwriting the deferred free's block, RETURN done before its own free, the consumed-ticket
check dropped): every one fails at least one test here.
"""

import random

import pytest
from amaranth.hdl import Elaboratable, Module
from amaranth.lib import wiring
from amaranth.sim import Simulator

from hw.headers import RING_ADD_DATA, SLOT_EMPTY, ring_add_mask
from hw.kbtp.ring_alloc import Cmd, RingAllocator, RingOp
from hw.lib.membus import MemArbiter, MemRam
from model.ring import SLOT_SIZE, RingImage, masked_fetch_add

# ------------------------------------------------------------------------------------------------
# Memory plan (byte addresses): counters first, then the slots of the four rings.
# ------------------------------------------------------------------------------------------------
SHARED_ORDER = 2
RAM_WORDS = 64                          # 512 octets
SHARED = dict(head=0x000, tail=0x008, base=0x040)
PARTS = [dict(head=0x010 + 0x10 * p, tail=0x018 + 0x10 * p, base=0x080 + 0x80 * p)
         for p in range(3)]             # room for order 3 (8 slots x 16 octets) each
RING_CFG = [SHARED, *PARTS]             # ring r: 0 shared, p + 1 partition p
LIMIT = 3000                            # cycles any wait may take before the test fails


def block_of(ring, k):
    """The k-th initial free block of ring ``ring`` (distinct across rings)."""
    return 0x100000 * (ring + 1) + 0x1000 * k


class World:
    """The four ring images on one bytearray (the golden model), and the RAM's init words."""

    def __init__(self, part_order, fill, masked=True):
        """``fill[r]``: initial free blocks of ring r (tickets 0..fill[r]-1 filled)."""
        self.part_order = part_order
        self.mem = bytearray(8 * RAM_WORDS)
        self.rings = []
        for r, c in enumerate(RING_CFG):
            order = SHARED_ORDER if r == 0 else part_order
            ring = RingImage(self.mem, c["base"], order, c["head"], c["tail"], masked=masked)
            ring.initialize([block_of(r, k) for k in range(fill[r])])
            self.rings.append(ring)

    def words(self):
        return MemRam.words_from_bytes(self.mem)


class Top(Elaboratable):
    def __init__(self, world, locking=(0, 1)):
        self.ra = RingAllocator()
        self.arb = MemArbiter(2, outstanding=4, locking=locking)
        self.ram = MemRam(RAM_WORDS, init=world.words())
        self.init = self.arb.masters[1]         # the initiator's port (the responder's atomics)

    def elaborate(self, platform):
        m = Module()
        m.submodules.ra, m.submodules.arb, m.submodules.ram = self.ra, self.arb, self.ram
        wiring.connect(m, self.ra.mem, self.arb.masters[0])
        wiring.connect(m, self.arb.bus, self.ram.bus)
        return m


def configure(ctx, top, world, masked=True):
    ra = top.ra
    ctx.set(ra.ring_base, SHARED["base"])
    ctx.set(ra.head_addr, SHARED["head"])
    ctx.set(ra.tail_addr, SHARED["tail"])
    ctx.set(ra.ring_order, SHARED_ORDER)
    for p, c in enumerate(PARTS):
        ctx.set(ra.parts[p].ring, c["base"])
        ctx.set(ra.parts[p].head, c["head"])
        ctx.set(ra.parts[p].tail, c["tail"])
    ctx.set(ra.part_order, world.part_order)
    ctx.set(ra.masked, int(masked))
    ctx.set(ra.le, 0)
    ctx.set(ra.grant, 1)


def ram_image(ctx, top):
    return b"".join(ctx.get(top.ram.mem.data[i]).to_bytes(8, "little") for i in range(RAM_WORDS))


def assert_image(ctx, top, world):
    got, want = ram_image(ctx, top), bytes(world.mem)
    diff = [f"{a:#05x}: ram {got[a:a + 8].hex()} model {want[a:a + 8].hex()}"
            for a in range(0, len(got), 8) if got[a:a + 8] != want[a:a + 8]]
    assert not diff, "RAM differs from the golden model:\n  " + "\n  ".join(diff)


def run(top, benches, background=()):
    """Simulate until every bench returns (each one bounds its own waits)."""
    sim = Simulator(top)
    sim.add_clock(1e-8)
    for b in background:
        sim.add_testbench(b, background=True)
    for b in benches:
        sim.add_testbench(b)
    sim.run()


async def until(ctx, sig, what, limit=LIMIT):
    """Tick until ``sig`` is 1 (sampled at an edge), at most ``limit`` cycles."""
    for _ in range(limit):
        *_, v = await ctx.tick().sample(sig)
        if v:
            return
    raise AssertionError(f"{what}: not within {limit} cycles")


# ------------------------------------------------------------------------------------------------
# The allocator's operations and host commands, and the initiator's FetchAdd
# ------------------------------------------------------------------------------------------------

async def ra_op(ctx, ra, op, ring, block=0, what=""):
    """One operation (held until ``ack``, then waited for ``done``): returns (empty, block)."""
    ctx.set(ra.start, 1)
    ctx.set(ra.op, op)
    ctx.set(ra.ring, ring)
    ctx.set(ra.block_in, block)
    await until(ctx, ra.ack, f"{what or op} on ring {ring}: ack")
    ctx.set(ra.start, 0)
    for _ in range(LIMIT):
        *_, done, empty, blk = await ctx.tick().sample(ra.done, ra.empty, ra.block)
        if done:
            return empty, blk
    raise AssertionError(f"{what or op} on ring {ring}: no done within {LIMIT} cycles")


async def host_cmd(ctx, ra, kind, arg, ring):
    """A host command (held until ``cmd_ack``); returns ``cmd_result`` (the Tail before)."""
    ctx.set(ra.cmd_kind, kind)
    ctx.set(ra.cmd_arg, arg)
    ctx.set(ra.cmd_ring, ring)
    ctx.set(ra.cmd_valid, 1)
    await until(ctx, ra.cmd_ack, f"command {kind} on ring {ring}: ack")
    ctx.set(ra.cmd_valid, 0)
    return ctx.get(ra.cmd_result)


async def put(ctx, port, beat, what, limit=LIMIT):
    """One request on the initiator's port, at most ``limit`` cycles of waiting for the grant."""
    ctx.set(port.req.payload, beat)
    ctx.set(port.req.valid, 1)
    await until(ctx, port.req.ready, what, limit)
    ctx.set(port.req.valid, 0)


async def get(ctx, port, what, limit=LIMIT):
    ctx.set(port.rsp.ready, 1)
    for _ in range(limit):
        *_, v, p = await ctx.tick().sample(port.rsp.valid, port.rsp.payload)
        if v:
            ctx.set(port.rsp.ready, 0)
            return p.rdata
    raise AssertionError(f"{what}: no response within {limit} cycles")


async def initiator_fetch_add(ctx, port, addr, order, gap=0, lock=1, limit=LIMIT, window=None):
    """The responder's AtomicUnit: read Head (``lock``), ``gap`` cycles of modify, write the
    masked FetchAdd (draft Add Data / Add Mask) with lock 0. Returns the old value. Each wait
    for the bus is bounded by ``limit`` cycles. ``window[0]`` (if given) is True from the
    read's acceptance to the write's."""
    await put(ctx, port, {"addr": addr, "we": 0, "lock": lock}, "initiator Head read", limit)
    if window:
        window[0] = True
    old = await get(ctx, port, "initiator Head read", limit)
    if gap:
        await ctx.tick().repeat(gap)
    new = masked_fetch_add(old, RING_ADD_DATA, ring_add_mask(order))
    await put(ctx, port, {"addr": addr, "we": 1, "lock": 0, "wdata": new, "wstrb": 0xFF},
              "initiator Head write", limit)
    if window:
        window[0] = False
    return old


async def initiator_write(ctx, port, addr, wdata, wstrb=0xFF):
    await put(ctx, port, {"addr": addr, "we": 1, "lock": 0, "wdata": wdata, "wstrb": wstrb},
              f"initiator write {addr:#x}")


def snooper(top, log, held=None, window=None):
    """Background bench: every request the allocator hands to the arbiter, as
    (cycle, we, addr, wdata, wstrb, lock); and in ``held`` the cycles its request waited while
    ``window[0]`` (the initiator between its Head read and write) was True."""
    req = top.ra.mem.req

    async def bench(ctx):
        cyc = 0
        while True:
            *_, v, r, p = await ctx.tick().sample(req.valid, req.ready, req.payload)
            if v and r:
                log.append((cyc, p.we, p.addr, p.wdata, p.wstrb, p.lock))
            elif v and held is not None and window[0]:
                held.append(cyc)
            cyc += 1
    return bench


# ------------------------------------------------------------------------------------------------
# 1. Allocator and initiator on one partition Head
# ------------------------------------------------------------------------------------------------

K, M = 4, 4             # allocations, initiator FetchAdds: K + M = N = 8 filled tickets
SEEDS = (1, 2, 3)


def share_the_head(seed, locking):
    """One run; returns (head_value, alloc results [(empty, block)], initiator tickets,
    allocator log, world, final RAM image, cycles the allocator waited in the initiator's
    read-to-write window)."""
    order = 3
    world = World(order, fill=[4, K + M, 8, 8])
    top = Top(world, locking)
    p0 = PARTS[0]
    got, init_tickets, log, out = [], [], [], {}
    finished, held, window = [], [], [False]

    async def allocator(ctx):
        configure(ctx, top, world)
        r = random.Random(seed)
        for k in range(K):
            gap = r.choice([0, 0, 1, 3, 6])
            if gap:
                await ctx.tick().repeat(gap)
            empty, blk = await ra_op(ctx, top.ra, RingOp.ALLOC, 1, what=f"ALLOC {k}")
            got.append((empty, blk))
        finished.append("allocator")

    async def initiator(ctx):
        r = random.Random(1000 + seed)
        for _ in range(M):
            gap = r.choice([1, 2, 3, 5, 8])
            await ctx.tick().repeat(gap)
            old = await initiator_fetch_add(ctx, top.init, p0["head"], order,
                                            gap=r.choice([0, 1, 3, 6, 10]), window=window)
            init_tickets.append(old >> 32)
        finished.append("initiator")

    async def check(ctx):
        for _ in range(LIMIT):
            await ctx.tick()
            if len(finished) == 2:
                break
        else:
            raise AssertionError(f"seed {seed}, locking {locking}: hung ({finished} done)")
        await ctx.tick().repeat(4)
        out["head"] = ctx.get(top.ram.mem.data[p0["head"] // 8])
        out["image"] = ram_image(ctx, top)

    run(top, [allocator, initiator, check], [snooper(top, log, held, window)])
    return out["head"], got, init_tickets, log, world, out["image"], len(held)


def test_partition_alloc_and_initiator_fetchadd_share_the_head():
    p0, N = PARTS[0], 1 << 3
    heads, held = {}, {}
    for seed in SEEDS:
        head, got, init_tickets, log, world, image, held[seed] = share_the_head(seed, (0, 1))
        heads[("lock", seed)] = head >> 32
        # The allocator's tickets: from its own Head writes (new value = ticket + 1) ...
        head_w = [(c, wd) for c, we, a, wd, _, _ in log if we and a == p0["head"]]
        a_tickets = [(wd >> 32) - 1 for _, wd in head_w]
        assert len(a_tickets) == K, (seed, head_w)
        # ... each read with lock = 1 right before (the read-modify-write under the lock).
        for c, wd in head_w:
            rd = [e for e in log if e[0] < c and not e[1] and e[2] == p0["head"]]
            assert rd and rd[-1][5] == 1, f"seed {seed}: Head read before cycle {c} not locked"
        assert all(not e for e, _ in got), f"seed {seed}: an ALLOC answered empty: {got}"
        # Every block the allocator got is the block its ticket's slot held (the init image),
        # and the slot it consumed is that ticket's.
        blocks = [b for _, b in got]
        assert blocks == [block_of(1, t) for t in a_tickets], (seed, a_tickets, blocks)
        consumes = [a for _, we, a, wd, _, _ in log if we and wd == SLOT_EMPTY]
        assert consumes == [p0["base"] + SLOT_SIZE * (t % N) + 8 for t in a_tickets]
        # Disjoint, and together 0..K+M-1; Head == K + M (Slot Offset wrapped to 0).
        assert not set(a_tickets) & set(init_tickets), (seed, a_tickets, init_tickets)
        assert sorted(a_tickets + init_tickets) == list(range(K + M)), \
            (seed, a_tickets, init_tickets)
        assert head == (K + M) << 32 | (SLOT_SIZE * ((K + M) % N)), f"{head:#x}"
        # The golden model, in ticket order: allocate() for the allocator's, take_ticket() for
        # the initiator's; then the whole image.
        ring = world.rings[1]
        for t in range(K + M):
            if t in a_tickets:
                tm, _, bm = ring.allocate()
                assert (tm, bm) == (t, blocks[a_tickets.index(t)])
            else:
                assert ring.take_ticket()[0] == t
        assert image == bytes(world.mem), f"seed {seed}: RAM differs from the golden model"

    for seed in SEEDS:
        heads[("no lock", seed)] = share_the_head(seed, ())[0] >> 32
    print(f"\npartition Head ticket after {K} ALLOCs + {M} initiator FetchAdds (want {K + M}): "
          + ", ".join(f"seed {s}: {heads[('lock', s)]} with the lock (allocator held "
                      f"{held[s]} cycles by it) / {heads[('no lock', s)]} without"
                      for s in SEEDS))
    assert all(heads[("lock", s)] == K + M for s in SEEDS)
    # The schedules do collide: the allocator asked for the bus inside the initiator's
    # read-to-write window and was held off.
    assert sum(held.values()) > 0, held
    # Without the lock the same schedules lose updates (the allocator's read-modify-write
    # lands in the initiator's read-to-write gap, or the other way round).
    assert all(heads[("no lock", s)] < K + M for s in SEEDS), heads


# ------------------------------------------------------------------------------------------------
# 2. Head at / past Tail
# ------------------------------------------------------------------------------------------------

def test_partition_empty_when_head_passed_tail():
    order, F = 2, 3
    world = World(order, fill=[4, F, 4, 4])
    top = Top(world)
    p0, ring, log = PARTS[0], world.rings[1], []
    head_word = p0["head"] // 8

    async def bench(ctx):
        configure(ctx, top, world)
        for _ in range(F):          # the initiator takes every ticket: Head == Tail
            old = await initiator_fetch_add(ctx, top.init, p0["head"], order, gap=1)
            assert old >> 32 == ring.take_ticket()[0]
        # ALLOC at Head == Tail, Tail + 1, Tail + 3 (the initiator's FetchAdds between them):
        # each one must answer empty.
        for what, then in (("Head == Tail", 1), ("Head past Tail by 1", 2),
                           ("Head past Tail by 3", 0)):
            await ctx.tick().repeat(2)
            before = ctx.get(top.ram.mem.data[head_word])
            n0 = len(log)
            empty, _ = await ra_op(ctx, top.ra, RingOp.ALLOC, 1, what=what)
            assert empty, f"{what}: ALLOC not empty (Head {before >> 32}, Tail {F})"
            assert ctx.get(top.ram.mem.data[head_word]) == before, f"{what}: Head changed"
            # The allocator wrote nothing but the locked read's closing write of Head as it was.
            reads = [e for e in log[n0:] if not e[1] and e[2] == p0["head"]]
            assert len(reads) == 1 and reads[0][5] == 1, f"{what}: Head reads {reads}"
            writes = [(a, wd) for _, we, a, wd, _, _ in log[n0:] if we]
            assert writes == [(p0["head"], before)], f"{what}: allocator writes {writes}"
            # The lock is released: the initiator's next FetchAdd is granted at once.
            for _ in range(then):
                old = await initiator_fetch_add(ctx, top.init, p0["head"], order, limit=12)
                assert old >> 32 == ring.take_ticket()[0]
        # The shared ring still allocates.
        empty, blk = await ra_op(ctx, top.ra, RingOp.ALLOC, 0, what="shared ALLOC")
        _, _, bm = world.rings[0].allocate()
        assert (empty, blk) == (0, bm) == (0, block_of(0, 0))
        old = await initiator_fetch_add(ctx, top.init, p0["head"], order, limit=12)
        assert old >> 32 == ring.take_ticket()[0] == F + 3
        await ctx.tick().repeat(3)
        assert_image(ctx, top, world)

    run(top, [bench], [snooper(top, log)])


# ------------------------------------------------------------------------------------------------
# 3. Frees go to the ring they name
# ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("masked", [True, False], ids=["masked", "unmasked"])
def test_frees_name_their_ring(masked):
    world = World(2, fill=[2, 2, 1, 3], masked=masked)
    top = Top(world)
    frees = [(0, 0xA00000), (1, 0xA10000), (2, 0xA20000), (1, 0xA11000), (0, 0xA01000)]

    async def bench(ctx):
        configure(ctx, top, world, masked)
        ra = top.ra
        for ring, blk in frees:
            res = await host_cmd(ctx, ra, Cmd.FREE_BLOCK, blk, ring)
            st, u, _ = world.rings[ring].free(blk)
            assert st == "written" and res >> 32 == u, (ring, blk, st, u, res)
            await until(ctx, ra.idle, f"FREE_BLOCK {blk:#x} on ring {ring}: back to idle")
            assert not ctx.get(ra.deferred), f"FREE_BLOCK {blk:#x} on ring {ring} deferred"
        await ctx.tick().repeat(3)
        assert_image(ctx, top, world)
        # A RETURN on ring 2 (partition 1) goes to partition 1's ring.
        await ra_op(ctx, ra, RingOp.RETURN, 2, block=0xB20000, what="RETURN")
        assert world.rings[2].free(0xB20000)[0] == "written"
        await ctx.tick().repeat(3)
        assert_image(ctx, top, world)
        # The allocator reads every freed block back from its ring, in ticket order.
        for ring, n in ((2, 3), (1, 4)):
            for _ in range(n):
                empty, blk = await ra_op(ctx, ra, RingOp.ALLOC, ring, what="ALLOC")
                _, _, bm = world.rings[ring].allocate()
                assert (empty, blk) == (0, bm), (ring, blk, bm)
            empty, _ = await ra_op(ctx, ra, RingOp.ALLOC, ring, what="ALLOC (empty)")
            assert empty
        await ctx.tick().repeat(3)
        assert_image(ctx, top, world)

    run(top, [bench])


# ------------------------------------------------------------------------------------------------
# 4. A RETURN while a free is deferred
# ------------------------------------------------------------------------------------------------

def slot_blocks(image, world):
    """Every Block Offset (not all ones) in every slot of every ring: {block: [addresses]}."""
    found = {}
    for r, c in enumerate(RING_CFG):
        for s in range(world.rings[r].N):
            a = c["base"] + SLOT_SIZE * s + 8
            bo = int.from_bytes(image[a:a + 8], "big")
            if bo != SLOT_EMPTY:
                found.setdefault(bo, []).append(a)
    return found


@pytest.mark.parametrize("ret_ring", [1, 0, 2], ids=["same-ring", "shared-ring", "other-partition"])
def test_return_while_a_free_is_deferred(ret_ring):
    order, N = 2, 4
    world = World(order, fill=[2, N, 2, 4])
    top = Top(world)
    p0, r1 = PARTS[0], world.rings[1]
    X, Y = 0xD00000, 0xE00000

    async def no_done(ctx, cycles, what):
        for _ in range(cycles):
            *_, done = await ctx.tick().sample(top.ra.done)
            assert not done, f"RETURN done {what}"

    async def bench(ctx):
        ra = top.ra
        configure(ctx, top, world)
        # The initiator takes tickets 0..3 and does not consume their slots (yet).
        for _ in range(N):
            old = await initiator_fetch_add(ctx, top.init, p0["head"], order)
            assert old >> 32 == r1.take_ticket()[0]
        # FREE_BLOCK X into partition 0: Tail ticket 4, slot 0 still holds ticket 0's block.
        res = await host_cmd(ctx, ra, Cmd.FREE_BLOCK, X, 1)
        assert r1.free(X) == ("deferred", N, 0) and res >> 32 == N
        await until(ctx, ra.idle, "FREE_BLOCK: idle")
        await ctx.tick().repeat(10)
        assert ctx.get(ra.deferred), "the free of X is not deferred"
        # The RETURN of Y, while X waits.
        ctx.set(ra.start, 1)
        ctx.set(ra.op, RingOp.RETURN)
        ctx.set(ra.ring, ret_ring)
        ctx.set(ra.block_in, Y)
        await until(ctx, ra.ack, "RETURN: ack")
        ctx.set(ra.start, 0)
        await no_done(ctx, 60, "before the deferred free's slot was consumed")
        assert ctx.get(ra.deferred)
        assert_image(ctx, top, world)           # nothing written yet: X waits, Y waits for X
        # The host's BIND of ticket 0 consumes slot 0: X goes in (its own block, not Y).
        await initiator_write(ctx, top.init, p0["base"] + 8, SLOT_EMPTY)
        assert r1.consume(0) == [(N, X)]
        if ret_ring == 1:
            # Y's own free: Tail ticket 5, slot 1 holds ticket 1's block: deferred in turn;
            # the RETURN completes only once it is written.
            assert r1.free(Y) == ("deferred", N + 1, SLOT_SIZE)
            await no_done(ctx, 60, "before its own block's slot was consumed")
            assert ctx.get(ra.deferred)
            assert_image(ctx, top, world)       # X in slot 0 with Sequence 4; Tail 6
            await initiator_write(ctx, top.init, p0["base"] + SLOT_SIZE + 8, SLOT_EMPTY)
            assert r1.consume(SLOT_SIZE) == [(N + 1, Y)]
        else:
            assert world.rings[ret_ring].free(Y)[0] == "written"
        await until(ctx, ra.done, "RETURN: done")
        await ctx.tick().repeat(3)
        assert not ctx.get(ra.deferred)
        assert_image(ctx, top, world)
        found = slot_blocks(ram_image(ctx, top), world)
        assert len(found[X]) == 1 and len(found[Y]) == 1, \
            {hex(b): [hex(a) for a in v] for b, v in found.items() if b in (X, Y)}
        assert all(len(v) == 1 for v in found.values()), found

    run(top, [bench])


# ------------------------------------------------------------------------------------------------
# 5. A partition ticket whose slot someone else consumed
# ------------------------------------------------------------------------------------------------

def test_partition_ticket_consumed_by_another_answers_empty():
    """The host consumes slot 0 (a BIND of ticket 0 by an initiator that did not take it): the
    ALLOC that takes ticket 0 finds it consumed and answers empty instead of polling for ever;
    the next ALLOC gets ticket 1's block."""
    order = 2
    world = World(order, fill=[4, 4, 4, 4])
    top = Top(world)
    p0, ring = PARTS[0], world.rings[1]

    async def bench(ctx):
        configure(ctx, top, world)
        await initiator_write(ctx, top.init, p0["base"] + 8, SLOT_EMPTY)
        ring.write_block_offset(0, SLOT_EMPTY)
        empty, _ = await ra_op(ctx, top.ra, RingOp.ALLOC, 1, what="ALLOC of a consumed ticket")
        assert empty
        assert ring.take_ticket()[0] == 0          # the ticket is spent (Head advanced)
        empty, blk = await ra_op(ctx, top.ra, RingOp.ALLOC, 1, what="next ALLOC")
        _, _, bm = ring.allocate()
        assert (empty, blk) == (0, bm) == (0, block_of(1, 1))
        await ctx.tick().repeat(3)
        assert_image(ctx, top, world)

    run(top, [bench])

# Ref: draft KBTP §Free-Block Ring (Tail FetchAdd, free, deferred free); model/ring.py (the
#      golden ring: RingImage.free / allocate / consume); hw/kbtp/engine_regs.py (the free
#      queue); hw/kbtp/regmap.py FREE_PUSH, FREE_QUEUE, FREE_REFUSED; issue 23.
"""The engine's free queue (FREE_PUSH) against the golden ring model.

The oracle is model/ring.py's :class:`~model.ring.RingImage` (and, where the engine allocates,
:class:`~model.target.TargetModel`) run on the same memory image as the engine's RAM, doing the
same frees in the same order; the engine's RAM is compared with the model's image byte for byte
(Head, Tail, table, ring, pool).

* test_queued_frees_equal_model_and_commands: 20 Block Offsets pushed in one burst of register
  writes (no polling) give the ring the model gives, and the ring 20 CMD FREE_BLOCKs give.
* test_queued_free_deferred: a queued free whose slot is not consumed is deferred, the one
  behind it waits (Tail not taken), both complete as the engine's allocations consume.
* test_full_queue_refuses: a push into the full queue answers ``err``, counts in FREE_REFUSED,
  changes nothing; the 33 frees queued before it all land, in push order.
* test_free_rate: cycles from the first host write to the last slot written, 16 frees queued vs
  16 CMD FREE_BLOCKs with a CMD read until not busy between them (printed).
"""

import random

from amaranth.sim import Simulator

from host import codec
from hw.headers import SLOT_EMPTY
from hw.iface import REG_KBTP, Space
from hw.kbtp.engine import Cmd, reg
from hw.kbtp.regmap import FREE_DEPTH
from model.target import InitiatorMemory
from sim.hostbus import bus_access
from tests.hw.kbtp.test_kbtp_engine import (RAM_BYTES, Top, Transport, compare_image, configure,
                                            hello, make_model, ram_read, reg_read, reg_write)
from tests.hw.kbtp.test_kbtp_engine_ring import (checked_alloc, host_command, host_mem_write,
                                                 run_throttled, wait_cmd_idle, write_slot)

BS = 256
POOL_TO_BASE = 0x1234_0000_0000         # Block Offsets with a high word (FREE_PUSH_HI matters)


def setup(n_consumed, **over):
    """Golden model with one session, and ``n_consumed`` allocations done on its shared ring
    (tickets 0..n_consumed-1); the engine's RAM starts as the model's image."""
    kw = dict(block_size=BS, num_blocks=32, pool_to_base=POOL_TO_BASE, quota_per_initiator=4)
    kw.update(over)
    model = make_model(**kw)
    model.connect("y")
    hello(model, "y", 1)
    taken = [model.shared_ring.allocate()[2] for _ in range(n_consumed)]
    top = Top(bytes(model.mem) + bytes(RAM_BYTES - len(model.mem)))
    return model, top, taken


def slot(ctx, top, model, ticket):
    lay = model.lay
    return codec.decode_slot(ram_read(ctx, top.ram, lay["ring"] + 16 * (ticket % lay["ring_n"]),
                                      16), strict=False)


def counter(ctx, top, model, which):
    return int.from_bytes(ram_read(ctx, top.ram, model.lay[which], 8), "little")


async def push(ctx, bus, boff):
    """FREE_PUSH: low word, then the high word (which queues it). Returns the bus's err."""
    await reg_write(ctx, bus, reg["FREE_PUSH_LO"], boff & 0xFFFFFFFF)
    _, err = await bus_access(ctx, bus, Space.REG, REG_KBTP + reg["FREE_PUSH_HI"], 1, boff >> 32,
                              limit=1)
    return err


async def free_queue(ctx, bus):
    """FREE_QUEUE as (waiting, space)."""
    v = await reg_read(ctx, bus, reg["FREE_QUEUE"])
    return v & 0xFFFF, v >> 16


def cycle_counter(st):
    async def count(ctx):
        while True:
            await ctx.tick()
            st["cycle"] += 1
    return count


def run_frees(n, mode):
    """``n`` frees of the blocks of tickets 0..n-1 (shuffled) on a ring of 32 slots whose
    slots 0..n-1 are consumed: ``mode`` "queue" (a burst of FREE_PUSH writes) or "cmd" (CMD_ARG,
    CMD = FREE_BLOCK, CMD read until not busy, for each). Returns (model, ring image, cycles
    from the first host write to the last slot written)."""
    model, top, taken = setup(n)
    blocks = taken[:]
    random.Random(n).shuffle(blocks)
    ring = model.shared_ring
    t0 = ring.counter_fields("tail")[0]
    st = {"cycle": 0}
    eng = top.eng

    async def bench(ctx):
        await configure(ctx, eng, model, ["y"])
        start = st["cycle"]
        if mode == "queue":
            for b in blocks:
                assert not await push(ctx, eng.bus, b)
        else:
            for b in blocks:
                await host_command(ctx, eng.bus, Cmd.FREE_BLOCK, b)
                await wait_cmd_idle(ctx, eng.bus)
        last = t0 + n - 1
        for _ in range(2000):
            if slot(ctx, top, model, last) == (last, blocks[-1]):
                break
            await ctx.tick()
        st["cycles"] = st["cycle"] - start
        await wait_cmd_idle(ctx, eng.bus)
        assert await free_queue(ctx, eng.bus) == (0, FREE_DEPTH)
        assert await reg_read(ctx, eng.bus, reg["FREE_REFUSED"]) == 0
        for b in blocks:                            # the oracle: the same frees, in order
            assert ring.free(b)[0] == "written"
        compare_image(ctx, top.ram, model)
        lay = model.lay
        st["image"] = [ram_read(ctx, top.ram, a, k) for a, k in
                       ((lay["head"], 8), (lay["tail"], 8), (lay["ring"], 16 * lay["ring_n"]))]

    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.add_testbench(cycle_counter(st), background=True)
    sim.run()
    return model, st["image"], st["cycles"]


def test_queued_frees_equal_model_and_commands():
    _, queued, _ = run_frees(20, "queue")
    _, by_cmd, _ = run_frees(20, "cmd")
    assert queued == by_cmd


def test_free_rate():
    _, _, c_queue = run_frees(16, "queue")
    _, _, c_cmd = run_frees(16, "cmd")
    print(f"\n16 frees, first host write -> last slot written (KbtpEngine n_qp=4, 64-bit memory "
          f"bus, no back-pressure): FREE_PUSH burst {c_queue} cycles, 1 link datagram; CMD "
          f"FREE_BLOCK + CMD reads {c_cmd} cycles, 16 link round trips (a 1-cycle host bus "
          f"here: the link's round trips come on top)")
    assert c_queue < c_cmd


def test_queued_free_deferred():
    # Ring of N = 4, every slot consumed (tickets 0..3). The host frees two blocks itself
    # (TAIL_FETCHADD: tickets 4 and 5, slots written late), then pushes four frees: b2, b3
    # (tickets 6, 7: written at once), X (ticket 8, slot 0: consumed but Sequence 0, not 4 ->
    # deferred) and Y, which must wait in the queue behind X without taking its ticket.
    model, top, b = setup(4, num_blocks=4, quota_per_initiator=4)
    ring = model.shared_ring
    s = model.session_of("y")
    tr = Transport(top, [InitiatorMemory()])
    eng = top.eng
    x, y = POOL_TO_BASE + 0x77 * BS, POOL_TO_BASE + 0x78 * BS    # never allocated here
    out = {}

    async def alloc(ctx, i, rid):
        return await checked_alloc(ctx, tr, model, s.handle_base + i, rid)

    async def bench(ctx):
        await configure(ctx, eng, model, ["y"])
        for t in (4, 5):
            await host_command(ctx, eng.bus, Cmd.TAIL_FETCHADD)
            await wait_cmd_idle(ctx, eng.bus)
            assert ring.fetch_add_counter("tail")[0] == t
        for v in (b[2], b[3], x, y):
            assert not await push(ctx, eng.bus, v)
        for v, how in ((b[2], "written"), (b[3], "written"), (x, "deferred"), (y, "deferred")):
            assert ring.free(v)[0] == how
        await ctx.tick().repeat(200)
        out["x_deferred"] = (await reg_read(ctx, eng.bus, reg["CMD"]),
                             await free_queue(ctx, eng.bus),
                             counter(ctx, top, model, "tail") >> 32,
                             [slot(ctx, top, model, t) for t in range(4)])
        # The host's late free of ticket 4 (b0): slot 0 holds it, not consumed: X still waits.
        await write_slot(ctx, top, model, 4, b[0])
        ring.write_block_offset(0, b[0])
        ring.write_sequence(0, 4)
        await ctx.tick().repeat(100)
        out["t4_written"] = (await reg_read(ctx, eng.bus, reg["CMD"]), slot(ctx, top, model, 8))
        # The engine allocates ticket 4 (b0, consuming slot 0): X writes slot 0, then Y takes
        # ticket 9 (slot 1: Sequence 1, not 5) and is deferred in turn.
        assert (await alloc(ctx, 0, 1)).block_offset == b[0]
        await ctx.tick().repeat(100)
        out["x_done"] = (await reg_read(ctx, eng.bus, reg["CMD"]),
                         await free_queue(ctx, eng.bus),
                         counter(ctx, top, model, "tail") >> 32, slot(ctx, top, model, 8))
        await write_slot(ctx, top, model, 5, b[1])
        ring.write_block_offset(16, b[1])
        ring.write_sequence(16, 5)
        assert (await alloc(ctx, 1, 2)).block_offset == b[1]
        await wait_cmd_idle(ctx, eng.bus)
        out["y_done"] = slot(ctx, top, model, 9)
        compare_image(ctx, top.ram, model)

    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    cmd, fq, tail, slots = out["x_deferred"]
    assert cmd == 0b11                                  # busy, a free deferred
    assert fq == (1, FREE_DEPTH - 1)                    # Y waits
    assert tail == 9                                    # ... without its Tail ticket
    assert slots == [(0, SLOT_EMPTY), (1, SLOT_EMPTY), (6, b[2]), (7, b[3])]
    assert out["t4_written"] == (0b11, (4, b[0]))
    assert out["x_done"] == (0b11, (0, FREE_DEPTH), 10, (8, x))
    assert out["y_done"] == (9, y)


def test_full_queue_refuses():
    # Ring of N = 4 holding its 4 blocks (nothing consumed): V0 takes ticket 4 and is deferred
    # on slot 0, V1..V32 fill the queue, V33 is refused. Then an allocator on a second bus port
    # consumes tickets 0..32 one by one, as the engine's allocations would: every queued free
    # lands, in push order, and V33 nowhere. Memory back-pressure in 40% of the cycles.
    model, top, _ = setup(0, num_blocks=4, quota_per_initiator=4)
    ring = model.shared_ring
    b = [blk for _, blk in ring.slots()]                # the ring's 4 blocks, tickets 0..3
    eng = top.eng
    lay = model.lay
    vals = [POOL_TO_BASE + (0x100 + 3 * k) * BS for k in range(FREE_DEPTH + 2)]
    out = {}

    async def bench(ctx):
        await configure(ctx, eng, model, ["y"])
        assert await free_queue(ctx, eng.bus) == (0, FREE_DEPTH)
        assert not await push(ctx, eng.bus, vals[0])
        for _ in range(500):
            if await reg_read(ctx, eng.bus, reg["CMD"]) == 0b11:
                break
        assert await free_queue(ctx, eng.bus) == (0, FREE_DEPTH)
        for k in range(1, FREE_DEPTH + 1):
            assert not await push(ctx, eng.bus, vals[k])
            assert await free_queue(ctx, eng.bus) == (k, FREE_DEPTH - k)
        for v in vals[:FREE_DEPTH + 1]:
            ring.free(v)
        await ctx.tick().repeat(50)
        before = [ram_read(ctx, top.ram, lay[k], n) for k, n in
                  (("head", 8), ("tail", 8), ("ring", 16 * lay["ring_n"]))]
        out["refused"] = [await push(ctx, eng.bus, vals[-1]) for _ in range(2)]
        await ctx.tick().repeat(50)
        out["after"] = (await free_queue(ctx, eng.bus),
                        await reg_read(ctx, eng.bus, reg["FREE_REFUSED"]),
                        await reg_read(ctx, eng.bus, reg["CMD"]),
                        [ram_read(ctx, top.ram, lay[k], n) for k, n in
                         (("head", 8), ("tail", 8), ("ring", 16 * lay["ring_n"]))] == before)
        # Drain: allocate tickets 0..32 (what the engine's ALLOC does to the ring, through the
        # second port; the engine itself does not allocate here).
        port = top.arb.masters[1]
        got, want = [], []
        for t in range(FREE_DEPTH + 1):
            _, o, blk = ring.allocate()                 # the model (it does its deferred free)
            want.append(blk)
            for _ in range(2000):
                seq, bo = slot(ctx, top, model, t)
                if seq == t and bo != SLOT_EMPTY:
                    break
                await ctx.tick()
            else:
                raise AssertionError(f"ticket {t}: slot never filled")
            got.append(bo)
            await host_mem_write(ctx, port, lay["ring"] + o + 8, SLOT_EMPTY)
            await host_mem_write(ctx, port, lay["head"], ring.read_counter("head"))
        out["allocated"] = (got, want)
        await wait_cmd_idle(ctx, eng.bus, limit=5000)
        out["end"] = (await free_queue(ctx, eng.bus),
                      await reg_read(ctx, eng.bus, reg["FREE_REFUSED"]))
        compare_image(ctx, top.ram, model)

    run_throttled(top, bench, seed=3)
    assert out["refused"] == [1, 1]
    assert out["after"] == ((FREE_DEPTH, 0), 2, 0b11, True)
    got, want = out["allocated"]
    assert got == want == b + vals[:FREE_DEPTH + 1 - 4]
    assert vals[-1] not in got
    assert out["end"] == ((0, FREE_DEPTH), 2)

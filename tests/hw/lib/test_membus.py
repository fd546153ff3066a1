# Ref: hw/iface.py (MemBusSignature), hw/lib/membus.py.
"""MemRam and MemArbiter in Amaranth's simulator: random masters against a Python dict memory.

Each master writes only its own region and reads its region and a shared read-only region, so the
value every read must return is known when it is issued, whatever the arbitration order.
"""

import random

import pytest
from amaranth.sim import Simulator

from hw.lib.membus import MemArbiter
from sim.hdl import on_ram, stream_get, stream_put

WORDS = 256
SHARED = range(0, 64)           # read-only words, initialised


@pytest.mark.parametrize("n,idle,bp", [(1, 0.0, 0.0), (3, 0.0, 0.0), (3, 0.3, 0.4), (4, 0.5, 0.0)])
def test_random_masters(n, idle, bp):
    rng = random.Random(n * 100 + int(idle * 10) + int(bp * 10))
    init = [rng.getrandbits(64) for _ in range(WORDS)]
    top = on_ram(MemArbiter(n, outstanding=4), "bus", WORDS, init)
    mem = dict(enumerate(init))
    expected = [[] for _ in range(n)]
    done = [0] * n
    issued = [False] * n
    ops = 120

    def region(i):
        size = (WORDS - 64) // n
        return range(64 + i * size, 64 + (i + 1) * size)

    async def master(ctx, i):
        port = top.master.masters[i]
        r = random.Random(i)
        beats = []
        for _ in range(ops):
            if r.random() < 0.5:
                w = r.choice(region(i))
                data, strb = r.getrandbits(64), r.getrandbits(8)
                old = mem[w]
                mask = sum(0xFF << (8 * k) for k in range(8) if strb >> k & 1)
                mem[w] = (old & ~mask) | (data & mask)
                beats.append({"addr": w * 8, "we": 1, "wdata": data, "wstrb": strb})
            else:
                w = r.choice(list(region(i)) + list(SHARED))
                expected[i].append(mem[w])
                beats.append({"addr": w * 8, "we": 0, "wdata": 0, "wstrb": 0})
            await stream_put(ctx, port.req, beats[-1:], idle=idle, rng=r)
        issued[i] = True

    async def collector(ctx, i):
        port = top.master.masters[i]
        r = random.Random(1000 + i)
        k = 0
        while True:
            while len(expected[i]) <= k:
                if issued[i]:
                    return
                await ctx.tick()
            got = await stream_get(ctx, port.rsp, backpressure=bp, rng=r)
            assert got.rdata == expected[i][k], f"master {i} read {k}"
            k += 1
            done[i] = k

    sim = Simulator(top)
    sim.add_clock(1e-8)
    def bind(fn, i):
        async def tb(ctx):
            await fn(ctx, i)
        return tb

    for i in range(n):
        sim.add_testbench(bind(master, i))
        sim.add_testbench(bind(collector, i), background=True)

    async def finish(ctx):
        for _ in range(20000):
            await ctx.tick()
            if all(issued) and all(done[i] == len(expected[i]) for i in range(n)):
                break
        else:
            raise AssertionError(f"bus hung: issued {issued}, reads checked {done}")
        for _ in range(10):
            await ctx.tick()
        # Read back the whole RAM through the memory itself.
        for w in range(WORDS):
            assert ctx.get(top.ram.mem.data[w]) == mem[w], f"word {w}"
    sim.add_testbench(finish)
    sim.run()
    assert all(done[i] == len(expected[i]) > 0 for i in range(n))


@pytest.mark.parametrize("n", [1, 3])
def test_back_to_back_reads_one_word_per_cycle(n):
    """A master streaming reads with its response side always ready gets one word per cycle."""
    init = list(range(WORDS))
    top = on_ram(MemArbiter(n, outstanding=4), "bus", WORDS, init)
    count = 64
    got, cycles = [], []

    async def reader(ctx):
        port = top.master.masters[0]
        ctx.set(port.rsp.ready, 1)
        issued, t = 0, 0
        while len(got) < count:
            ctx.set(port.req.payload, {"addr": 8 * issued, "we": 0})
            ctx.set(port.req.valid, issued < count)
            # Sample the handshakes at this clock edge.
            res = await ctx.tick().sample(port.req.valid, port.req.ready, port.rsp.valid,
                                          port.rsp.payload.rdata)
            req_v, req_r, rsp_v, data = res[-4:]
            issued += int(bool(req_v and req_r))
            if rsp_v:
                got.append(data)
            t += 1
        cycles.append(t)

    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(reader)
    sim.run()
    assert got == init[:count]
    print(f"{count} reads through a {n}-port arbiter: {cycles[0]} cycles")
    assert cycles[0] <= count + 3


@pytest.mark.parametrize("urgent", [(0,), ()])
def test_urgent_master_goes_first(urgent):
    """Masters 1 and 2 stream writes (each would keep its grant for ``hold`` = 16 in a row);
    master 0, urgent, asks now and then: it is granted the cycle after it asks (the grant is a
    flop), every time. Without ``urgent`` (the plain round robin with its hold) it waits
    behind the stream's run."""
    top = on_ram(MemArbiter(3, outstanding=4, urgent=urgent), "bus", WORDS, [0] * WORDS)
    waits = []

    async def streamer(ctx, i):
        port = top.master.masters[i]
        k = 0
        ctx.set(port.req.valid, 1)
        while True:
            ctx.set(port.req.payload, {"addr": 8 * (64 + 64 * (i - 1) + k % 64), "we": 1,
                                       "wdata": k, "wstrb": 0xFF})
            _, _, ok = await ctx.tick().sample(port.req.ready)
            k += int(bool(ok))

    async def urgent_master(ctx):
        port = top.master.masters[0]
        for n in range(12):
            await ctx.tick().repeat(5 + 3 * n)
            ctx.set(port.req.payload, {"addr": 8 * n, "we": 1, "wdata": n, "wstrb": 0xFF})
            ctx.set(port.req.valid, 1)
            w = 0
            while not ctx.get(port.req.ready):
                await ctx.tick()
                w += 1
            await ctx.tick()
            ctx.set(port.req.valid, 0)
            waits.append(w)

    sim = Simulator(top)
    sim.add_clock(1e-8)
    for i in (1, 2):
        async def stream_i(ctx, i=i):
            await streamer(ctx, i)
        sim.add_process(stream_i)
    sim.add_testbench(urgent_master)
    sim.run_until(8e-6)
    assert len(waits) == 12
    if urgent:
        assert waits == [1] * 12, waits
    else:
        assert max(waits) > 1, waits


def test_no_path_between_masters():
    """The grant is a flop: in any cycle, what one master offers (valid, address, write) does
    not move another master's ready. Random requests, checked before the clock edge against
    the readies seen before they were offered. (A read's own ready also waits for room in the
    route FIFO; here the RAM answers the next cycle and the FIFO never fills.)"""
    import random
    rng = random.Random(7)
    top = on_ram(MemArbiter(4, outstanding=4, urgent=(0,)), "bus", WORDS, [0] * WORDS)
    seen = []

    async def bench(ctx):
        ports = top.master.masters
        for p in ports:
            ctx.set(p.rsp.ready, 1)
        for _ in range(300):
            before = [ctx.get(p.req.ready) for p in ports]
            for p in ports:
                ctx.set(p.req.payload, {"addr": 8 * rng.randrange(WORDS), "we": rng.random() < .5,
                                        "wdata": rng.getrandbits(64), "wstrb": 0xFF})
                ctx.set(p.req.valid, rng.random() < .6)
            after = [ctx.get(p.req.ready) for p in ports]
            assert after == before
            seen.append(sum(after))
            await ctx.tick()

    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert max(seen) == 1 and sum(seen) > 100      # one grant a cycle, and it moves


def test_locked_read_modify_write_loses_no_update():
    """Four masters add 1 to one word, 40 times each, by a read with ``lock`` = 1 and a write
    of the value read + 1: master 0 urgent and masters 1 on an outer arbiter, two more behind
    an inner arbiter on the outer one's port 2 (which passes the lock on). With the lock every
    update lands (160); with ``lock`` = 0 on the reads the same run loses updates, as the
    responder's atomics and the ring allocator did against each other."""
    from amaranth import Module
    from amaranth.lib import wiring

    from hw.lib.membus import MemRam

    class Top(wiring.Component):
        def __init__(self):
            self.outer = MemArbiter(3, outstanding=4, urgent=(0,), locking=(0, 1, 2))
            self.inner = MemArbiter(2, outstanding=4, locking=(0, 1))
            self.ram = MemRam(WORDS, init=[0] * WORDS)
            self.ports = [*self.outer.masters[:2], *self.inner.masters]
            super().__init__({})

        def elaborate(self, platform):
            m = Module()
            m.submodules.outer, m.submodules.inner = self.outer, self.inner
            m.submodules.ram = self.ram
            wiring.connect(m, self.inner.bus, self.outer.masters[2])
            wiring.connect(m, self.outer.bus, self.ram.bus)
            return m

    word, times = 5, 40

    def run(lock):
        top = Top()
        finished = []

        async def master(ctx, i):
            port, r = top.ports[i], random.Random(10 + i)
            for _ in range(times):
                await ctx.tick().repeat(r.choice([1, 1, 2, 3, 5, 8]))
                await stream_put(ctx, port.req, [{"addr": 8 * word, "we": 0, "lock": lock}])
                got = await stream_get(ctx, port.rsp)
                if r.random() < 0.5:
                    await ctx.tick().repeat(r.randrange(1, 4))      # a slow modify
                await stream_put(ctx, port.req, [{"addr": 8 * word, "we": 1, "lock": 0,
                                                  "wdata": got.rdata + 1, "wstrb": 0xFF}])
            finished.append(i)

        sim = Simulator(top)
        sim.add_clock(1e-8)
        for i in range(4):
            async def tb(ctx, i=i):
                await master(ctx, i)
            sim.add_testbench(tb)
        result = []

        async def check(ctx):
            for _ in range(20000):
                await ctx.tick()
                if len(finished) == 4:
                    break
            else:
                raise AssertionError(f"bus hung: finished {finished}")
            await ctx.tick().repeat(4)
            result.append(ctx.get(top.ram.mem.data[word]))
        sim.add_testbench(check)
        sim.run()
        return result[0]

    locked, unlocked = run(1), run(0)
    print(f"4 masters x {times} increments: {locked} with the lock, {unlocked} without")
    assert locked == 4 * times
    assert unlocked < 4 * times

# Ref: hw/iface.py (MemBusSignature: in-order responses, a write visible to every later
#      request); hw/lib/membus.py (MemSplit); boards/dram.py (DramModel, ECPIX5_DDR3).
"""MemSplit between a block-RAM window (MemRam, answers the next cycle) and the DDR3 timing
model (DramModel with the ECPIX-5's figures: 12 core cycles a read, row misses, refresh), in
Amaranth's simulator.

Oracle: a Python dict of the whole address space updated as each request is accepted; every
read must return the dict's value at its acceptance, in request order, whichever side it went
to; at the end both memories' arrays must hold the dict's words at the right places."""

import random

import pytest
from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In
from amaranth.sim import Simulator

from boards.dram import ECPIX5_DDR3, DramModel
from hw.iface import MemBusSignature
from hw.lib.membus import MemRam, MemSplit
from sim.hdl import stream_get, stream_put

SLOW_WORDS = 1024
WIN_WORDS = 128
WIN_BASE = 4096             # byte address: words 512..639 of the space are the window


class Top(wiring.Component):
    def __init__(self):
        self.split = MemSplit(WIN_BASE, WIN_WORDS)
        self.fast = MemRam(WIN_WORDS)
        self.slow = DramModel(SLOW_WORDS, ECPIX5_DDR3.cycles(25e6))
        super().__init__({"bus": In(MemBusSignature())})

    def elaborate(self, platform):
        m = Module()
        m.submodules.split, m.submodules.fast, m.submodules.slow = self.split, self.fast, self.slow
        wiring.connect(m, wiring.flipped(self.bus), self.split.bus)
        wiring.connect(m, self.split.fast, self.fast.bus)
        wiring.connect(m, self.split.slow, self.slow.bus)
        return m



def _in_window(w):
    return WIN_BASE // 8 <= w < WIN_BASE // 8 + WIN_WORDS


@pytest.mark.parametrize("seed,idle,bp", [(1, 0.0, 0.0), (2, 0.3, 0.4), (3, 0.0, 0.6)])
def test_random_traffic_both_sides_in_order(seed, idle, bp):
    rng = random.Random(seed)
    top = Top()
    mem = {}
    expected, got = [], []
    words = [w for w in range(SLOW_WORDS) if not _in_window(w)][:256] + \
        [WIN_BASE // 8 + k for k in range(WIN_WORDS)]
    ops = 1500
    state = {"issued": False}

    async def master(ctx):
        port = top.bus.req
        for _ in range(ops):
            w = rng.choice(words)
            if rng.random() < 0.5:
                data, strb = rng.getrandbits(64), rng.getrandbits(8)
                beat = {"addr": 8 * w, "we": 1, "wdata": data, "wstrb": strb}
            else:
                beat = {"addr": 8 * w, "we": 0, "wdata": 0, "wstrb": 0}
            await stream_put(ctx, port, [beat], idle=idle, rng=rng)
            # accepted at the last edge: the oracle takes it in the same order
            if beat["we"]:
                mask = sum(0xFF << (8 * k) for k in range(8) if beat["wstrb"] >> k & 1)
                mem[w] = (mem.get(w, 0) & ~mask) | (beat["wdata"] & mask)
            else:
                expected.append((w, mem.get(w, 0)))
        state["issued"] = True

    async def collector(ctx):
        r = random.Random(seed + 100)
        while True:
            while len(got) >= len(expected):
                if state["issued"]:
                    return
                await ctx.tick()
            p = await stream_get(ctx, top.bus.rsp, backpressure=bp, rng=r)
            got.append(p.rdata)

    async def finish(ctx):
        for t in range(40_000):
            await ctx.tick()
            if state["issued"] and len(got) == len(expected):
                break
        else:
            raise AssertionError(f"hung: {len(got)} of {len(expected)} reads answered")
        print(f"\nMemSplit seed {seed}: {ops} requests, {len(expected)} reads, {t} cycles")
        for _ in range(40):
            await ctx.tick()
        assert len(got) == len(expected)
        for k, ((w, want), have) in enumerate(zip(expected, got)):
            assert have == want, f"read {k} of word {w} ({'window' if _in_window(w) else 'DRAM'})"
        for w, v in mem.items():
            if _in_window(w):
                assert ctx.get(top.fast.mem.data[w - WIN_BASE // 8]) == v, w
            else:
                assert ctx.get(top.slow.mem.data[w]) == v, w

    sim = Simulator(top)
    sim.add_clock(4e-8)
    sim.add_testbench(master)
    sim.add_testbench(collector, background=True)
    sim.add_testbench(finish)
    sim.run()
    sides = {_in_window(w) for w, _ in expected}
    assert sides == {True, False} and len(expected) > 500


def test_window_streams_one_word_per_cycle_and_dram_reads_pipeline():
    """64 reads in the window, response side always ready: one word per cycle; 64 reads of
    the DRAM: the split's FIFO (32) covers the model's latency, so they stream too."""
    top = Top()
    out = {}

    async def reader(ctx, base, name):
        req, rsp = top.bus.req, top.bus.rsp
        ctx.set(rsp.ready, 1)
        issued, got, t = 0, 0, 0
        while got < 64:
            ctx.set(req.payload, {"addr": base + 8 * issued, "we": 0})
            ctx.set(req.valid, issued < 64)
            rv, rr, sv = (await ctx.tick().sample(req.valid, req.ready, rsp.valid))[-3:]
            issued += int(bool(rv and rr))
            got += int(bool(sv))
            t += 1
        ctx.set(req.valid, 0)
        out[name] = t

    async def main(ctx):
        await reader(ctx, WIN_BASE, "window")
        await reader(ctx, 0, "dram")

    sim = Simulator(top)
    sim.add_clock(4e-8)
    sim.add_testbench(main)
    sim.run()
    c = ECPIX5_DDR3.cycles(25e6)
    print(f"\n64 reads through MemSplit: window {out['window']} cycles, DDR3 model "
          f"{out['dram']} cycles (hit latency {c.hit})")
    assert out["window"] <= 64 + 3
    assert out["dram"] <= 64 + c.hit + c.miss + c.rfc + 8

# Ref: boards/dram.py (DramModel: the rules in its docstring); hw/iface.py MemBusSignature.
"""The DRAM timing model: every read returns what the bus's order rule says (a dict of words
is the oracle), and each timing rule (hit latency, row miss, one read per cycle in a row,
refresh) shows in exact cycle counts."""

import random

import pytest
from amaranth.sim import Simulator

from boards.dram import ECPIX5_DDR3, DramCycles, DramModel, dram_address
from tests.boards.bus_traffic import random_traffic, stream_cycles

T = DramCycles(hit=5, miss=3, refi=200, rfc=9)


def _run(dut, *benches):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    for b in benches:
        sim.add_testbench(b)
    sim.run()


@pytest.mark.parametrize("seed", [1, 2])
def test_dram_model_data_follows_the_bus_order(seed):
    """Random reads and byte-masked writes over several banks and rows, with the reader
    stalling at random and refreshes every 60 cycles: every read returns the word the writes
    accepted before it made."""
    depth = 4096                                   # 32 KiB: 16 pages, two rows of each bank
    dut = DramModel(depth, DramCycles(hit=4, miss=2, refi=60, rfc=5), credits=6)

    def addr_of(rng):
        addr = rng.randrange(depth) * 8
        return addr, addr // 8
    expected, got = random_traffic(dut, random.Random(seed), 800, addr_of)
    assert len(expected) > 300
    assert got == expected


def _trace(dut, addrs, cycles_max=400):
    """Offer reads of ``addrs`` back to back from cycle 0 (rsp.ready high): the cycles each
    was accepted and answered, and the model's miss and refresh counts."""
    acc, ans = [], []
    out = {}

    async def bench(ctx):
        req, rsp = dut.bus.req, dut.bus.rsp
        ctx.set(rsp.ready, 1)
        n = 0
        for t in range(cycles_max):
            ctx.set(req.valid, n < len(addrs))
            if n < len(addrs):
                ctx.set(req.payload, {"addr": addrs[n], "we": 0, "wdata": 0, "wstrb": 0})
            if n < len(addrs) and ctx.get(req.ready):
                acc.append(t)
                n += 1
            if ctx.get(rsp.valid):
                ans.append(t)
            await ctx.tick()
        out["miss"] = ctx.get(dut.n_miss)
        out["refresh"] = ctx.get(dut.n_refresh)

    _run(dut, bench)
    return acc, ans, out


def test_dram_model_hit_miss_and_streaming():
    """A closed bank costs `miss` more; then 40 reads of the open page come one per cycle,
    each `hit` cycles after it was taken."""
    dut = DramModel(1024, T, credits=8)
    acc, ans, out = _trace(dut, [8 * k for k in range(41)], cycles_max=120)
    assert ans[0] - acc[0] == T.hit + T.miss                 # first: the row opens
    assert acc[1] - acc[0] == 1 + T.miss                     # the port waited for it
    assert [b - a for a, b in zip(acc[1:], ans[1:])] == [T.hit] * 40
    assert ans[-1] - ans[1] == 39                            # no bubble in 40 row hits
    assert out["miss"] == 1


def test_dram_model_bank_conflict_and_other_banks():
    """Two rows of one bank alternating: every read opens its row. Pages of different banks
    each open once and then stay open."""
    conflict = [0, 2048 * 8, 0, 2048 * 8]                    # bank 0, rows 0 and 1
    assert {dram_address(a) for a in conflict} == {(0, 0), (0, 1)}
    acc, ans, out = _trace(DramModel(1 << 16, T), conflict)
    assert [b - a for a, b in zip(acc, ans)] == [T.hit + T.miss] * 4
    assert [b - a for a, b in zip(acc, acc[1:])] == [1 + T.miss] * 3
    assert out["miss"] == 4
    banks = [2048 * b for b in range(8)] * 2                 # each bank's row 0, twice
    acc, ans, out = _trace(DramModel(1 << 16, T), banks)
    assert out["miss"] == 8
    assert [b - a for a, b in zip(acc[8:], ans[8:])] == [T.hit] * 8


def test_dram_model_refresh_stops_the_port_and_closes_rows():
    """Reads of one open page offered without a break: the port takes none for `rfc` cycles
    every `refi`, and the first read after each refresh opens its row again."""
    dut = DramModel(1024, T, credits=8)
    n = 900
    acc, ans, out = _trace(dut, [8 * (k % 64) for k in range(n)], cycles_max=1000)
    gaps = [(a, b - a) for a, b in zip(acc, acc[1:]) if b - a > 1]
    # The first gap is the first row opening. Then per refresh (due in cycles refi - 1,
    # 2 refi - 1, ...): the port stops for rfc cycles, and the first read after it opens
    # the row again.
    assert gaps[0] == (0, 1 + T.miss)
    refreshes = len(gaps[1:]) // 2
    assert refreshes == 4 and len(gaps) == 1 + 2 * refreshes
    for k in range(1, refreshes + 1):
        assert gaps[2 * k - 1] == (k * T.refi - 1, 1 + T.rfc)
        assert gaps[2 * k] == (k * T.refi + T.rfc, 1 + T.miss)
    assert out["refresh"] == 1000 // T.refi
    assert out["miss"] == 1 + refreshes
    assert len(ans) == n


@pytest.mark.parametrize("we", [0, 1], ids=["reads", "writes"])
def test_dram_model_command_rate(we):
    """A core cycle of 6 units, a read of 10 and a write of 12 (the controller's 2 and 12/5
    cycles at 6/5 controller cycles a core cycle): 60 requests to one open row are taken 3 in
    every 5 cycles (reads) or 1 in every 2 (writes), the gaps exactly what the owed units
    give; the default costs take one a cycle."""
    rate = DramCycles(hit=5, miss=3, refi=10000, rfc=9, tick=6, read_cost=10, write_cost=12)
    dut = DramModel(1024, rate, credits=16)
    reqs = [(8 * k, we, k, 0xFF) for k in range(60)]
    acc = []

    async def bench(ctx):
        req, rsp = dut.bus.req, dut.bus.rsp
        ctx.set(rsp.ready, 1)
        for t in range(200):
            ctx.set(req.valid, bool(reqs))
            if reqs:
                a, w, d, s = reqs[0]
                ctx.set(req.payload, {"addr": a, "we": w, "wdata": d, "wstrb": s})
                if ctx.get(req.ready):
                    acc.append(t)
                    reqs.pop(0)
            await ctx.tick()
    _run(dut, bench)
    assert len(acc) == 60
    steady = acc[1:]                    # after the first request's row opening
    gaps = [b - a for a, b in zip(steady, steady[1:])]
    # Owed units after each request: the gaps follow from the arithmetic, not the gateware.
    owed, want = 0, []
    cost = 12 if we else 10
    for _ in range(len(gaps)):
        owed += cost
        g = 0
        while True:
            owed = max(0, owed - 6)
            g += 1
            if owed < 6:
                break
        want.append(g)
    assert gaps == want
    span = steady[-1] - steady[0]
    assert abs(span - (len(steady) - 1) * cost / 6) < 2, span
    fast = DramModel(1024, T, credits=16)
    assert stream_cycles(fast, [(8 * k, we, k, 0xFF) for k in range(60)]) <= 60 + T.hit + \
        T.miss + 2


def test_ecpix5_ddr3_in_core_cycles():
    """The board's figures in core clocks. At 25 MHz (the core clock until 2026-12-05, one
    core cycle per 2 of LiteDRAM's 50 MHz): a hit's 16 controller cycles are 8 core cycles,
    plus 4 of crossing; a miss's 5 are 3; a refresh every 391 (195 core cycles) stops the port
    for 24 (12). At 31.25 MHz: 14, 3, 244, 15; at 41.67 MHz (boards/cores.py CORE_FREQ): 18, 4,
    325, 20 (the hit and the miss are what tests/boards/test_litedram.py measures through
    LiteDRAM: 14 and 17 at 31.25 MHz, 18 and 22 at 41.67).

    The command rate (2 controller cycles a read, 9/4 a write): at 25 MHz a core cycle is 2
    controller cycles (tick 8 of units of 1/4), a read 8 units, a write 9; at 31.25 MHz 8/5
    (tick 32 of units of 1/20), a read 40, a write 45; at 41.67 MHz 6/5 (tick 24 of units of
    1/20), a read 40, a write 45."""
    c = ECPIX5_DDR3.cycles(25e6)
    assert c == DramCycles(hit=12, miss=3, refi=195, rfc=12, tick=8, read_cost=8, write_cost=9)
    assert ECPIX5_DDR3.cycles(31.25e6) == DramCycles(hit=14, miss=3, refi=244, rfc=15,
                                                     tick=32, read_cost=40, write_cost=45)
    assert ECPIX5_DDR3.cycles(625e6 / 15) == DramCycles(hit=18, miss=4, refi=325, rfc=20,
                                                        tick=24, read_cost=40, write_cost=45)
    with pytest.raises(ValueError):
        DramCycles(hit=2, miss=0, refi=10, rfc=1)

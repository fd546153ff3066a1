# Ref: issue 22 items 1-2; boards/litedram_bridge.py (sequencer, bridge, core wrapper);
#      boards/litedram_gen.py (the simulation core: LiteDRAM's controller on SDRAMPHYModel);
#      hw/iface.py MemBusSignature (in-order responses; a write visible to every later request);
#      boards/dram.py ECPIX5_DDR3 (the timing model these figures check).
"""cocotb bench: the target's memory bus through :class:`boards.litedram_bridge.LiteDramCore` into
LiteDRAM's own controller on its SDRAM PHY model (run by tests/boards/test_litedram.py).

Clocks as on the ECPIX-5: the target's core clock on ``clk`` (boards/cores.py CORE_FREQ, its period
``core_ps`` from the test), the controller's sys clock at 50 MHz on ``dram_clk``.

The oracle is a word dictionary updated when a request is accepted (the bus's order rule), and
LiteDRAM itself: nothing reaches the memory model unless the init program has run to
``init_done`` (the core is generated with ``block_until_ready``).
"""

import json
import random

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ReadOnly, RisingEdge

from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from boards.litedram_bridge import LiteDramCore
from hw.iface import MemBusSignature
from sim.hdl import get_params

DRAM_PS = 20_000        # 50 MHz


class LiteDramHarness(wiring.Component):
    """:class:`LiteDramCore` with its controller clock as a top-level input."""

    def __init__(self, directory):
        self._dir = directory
        super().__init__({"bus": In(MemBusSignature()), "dram_clk": In(1),
                          "init_done": Out(1), "init_error": Out(1), "init_step": Out(8)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.ld = ld = LiteDramCore(self._dir, clk=self.dram_clk)
        wiring.connect(m, wiring.flipped(self.bus), ld.bus)
        m.d.comb += [self.init_done.eq(ld.init_done), self.init_error.eq(ld.init_error),
                     self.init_step.eq(ld.init_step)]
        return m


def _pack(addr, we, wdata, wstrb):
    return addr | (we << 32) | (wdata << 33) | (wstrb << 97)


class Bus:
    """Drives ``bus.req`` from a queue and collects ``bus.rsp`` with random stalls, checking
    every read against the word model as it stood when the read was accepted."""

    def __init__(self, dut, rng, words):
        self.dut, self.rng, self.words = dut, rng, words
        self.cycle = 0
        self.expect = []            # (expected word, accept cycle)
        self.latencies = []
        self.reads = self.writes = 0
        self.stall = 0.0            # probability of rsp.ready low in a cycle
        self.history = []           # (cycle, addr, we, wdata, wstrb) of accepted requests

    async def clock(self):
        while True:
            await RisingEdge(self.dut.clk)
            self.cycle += 1

    async def run(self, requests, gap=0.0):
        dut, rng = self.dut, self.rng
        pending = list(requests)
        dut.bus__rsp__ready.value = 1
        while pending or self.expect:
            valid = bool(pending) and rng.random() >= gap
            if valid:
                addr, we, wdata, wstrb = pending[0]
                dut.bus__req__payload.value = _pack(addr, we, wdata, wstrb)
            dut.bus__req__valid.value = int(valid)
            ready = rng.random() >= self.stall
            dut.bus__rsp__ready.value = int(ready)
            await ReadOnly()
            if valid and dut.bus__req__ready.value:
                addr, we, wdata, wstrb = pending.pop(0)
                self.history.append((self.cycle, addr, we, wdata, wstrb))
                old = self.words.get(addr, 0)
                if we:
                    mask = sum(0xFF << (8 * k) for k in range(8) if wstrb >> k & 1)
                    self.words[addr] = (old & ~mask) | (wdata & mask)
                    self.writes += 1
                else:
                    self.expect.append((old, self.cycle, addr))
                    self.reads += 1
            if ready and dut.bus__rsp__valid.value:
                assert self.expect, "a response no read asked for"
                want, t0, addr = self.expect.pop(0)
                got = int(dut.bus__rsp__payload.value)
                if got != want:
                    past = [h for h in self.history if h[1] == addr][-6:]
                    raise AssertionError(
                        f"read of {addr:#x} accepted in cycle {t0}: {got:#018x}, expected "
                        f"{want:#018x}; requests to it: "
                        + "; ".join(f"c{c} {'W' if w else 'R'} {d:#x}/{s:#04x}"
                                    for c, _, w, d, s in past))
                self.latencies.append(self.cycle - t0)
            await RisingEdge(dut.clk)
        dut.bus__req__valid.value = 0


async def _start(dut):
    cocotb.start_soon(Clock(dut.clk, get_params()["core_ps"], unit="ps").start())
    cocotb.start_soon(Clock(dut.dram_clk, DRAM_PS, unit="ps").start())
    dut.bus__req__valid.value = 0
    dut.bus__rsp__ready.value = 1
    dut.rst.value = 1
    for _ in range(4):
        await RisingEdge(dut.clk)
    dut.rst.value = 0
    cycles = 0
    while not dut.init_done.value:
        assert not dut.init_error.value, f"init error at step {int(dut.init_step.value)}"
        await RisingEdge(dut.clk)
        cycles += 1
        assert cycles < 2e9 / get_params()["core_ps"], f"no init_done after 2 ms: {cycles} core cycles (step " \
                                f"{int(dut.init_step.value)})"
    return cycles


@cocotb.test()
async def init_then_random_traffic(dut):
    """The init program reaches init_done; then random reads and writes with partial strobes,
    request gaps and response stalls over the whole model (1 MiB) and over a few rows (bank
    conflicts), every read matched to the word model."""
    p = get_params()
    rng = random.Random(p.get("seed", 1))
    init_cycles = await _start(dut)
    bus = Bus(dut, rng, {})
    cocotb.start_soon(bus.clock())
    size = p["storage_bytes"]
    hot = [rng.randrange(size // 8) * 8 for _ in range(24)]
    reqs = []
    for i in range(p.get("ops", 3000)):
        addr = rng.choice(hot) if rng.random() < 0.5 else rng.randrange(size // 8) * 8
        we = rng.random() < 0.5
        reqs.append((addr, int(we), rng.getrandbits(64), rng.getrandbits(8) if we else 0))
    bus.stall = 0.2
    await bus.run(reqs, gap=0.2)
    assert bus.reads and bus.writes
    # Timing on an idle bus: 40 reads of one open row, 40 that each open another row of the
    # same bank (a row miss), 20 idle cycles apart; min / median / max in core cycles.
    bus.stall = 0.0
    await bus.run([(64, 1, 0x1122334455667788, 0xFF)])
    lat = {}
    for kind, addrs in (("hit", [64 + 8 * (i % 8) for i in range(40)]),
                        ("miss", [64 + 2048 * 8 * (i + 1) for i in range(40)])):
        got = []
        for addr in addrs:
            for _ in range(20):
                await RisingEdge(dut.clk)
            bus.latencies = []
            await bus.run([(addr % size, 0, 0, 0)])
            got.append(bus.latencies[0])
        got.sort()
        lat[kind] = [got[0], got[len(got) // 2], got[-1]]
    # Streaming: 256 sequential reads, then 256 sequential writes, back to back.
    t0 = bus.cycle
    await bus.run([(4096 + 8 * i, 0, 0, 0) for i in range(256)])
    read_cycles = bus.cycle - t0
    t0 = bus.cycle
    await bus.run([(8192 + 8 * i, 1, i, 0xFF) for i in range(256)])
    await bus.run([(8192, 0, 0, 0)])
    write_cycles = bus.cycle - t0
    out = {"init_core_cycles": init_cycles, "reads": bus.reads, "writes": bus.writes,
           "read_latency_hit": lat["hit"], "read_latency_miss": lat["miss"],
           "stream_read_cycles_256": read_cycles, "stream_write_cycles_256": write_cycles}
    with open("litedram.json", "w") as f:
        json.dump(out, f)


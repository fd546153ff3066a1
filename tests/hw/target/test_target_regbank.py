# Ref: hw/target/regbank.py (host decoder, REG_TOP, MEM port, queues); hw/iface.py layouts.
"""Host-side blocks of the target top in Amaranth's simulator.

Oracles: Amaranth's own layout views of the queue streams (field by field against the values
the host packed), MemRam contents read with ``ctx.get``, and brute-force expectations of which
addresses answer ``err``.
"""

import random

import pytest
from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In
from amaranth.sim import Simulator

from hw.iface import (HostBusSignature, REG_TOP, RecvNotify, Space, WorkCompletion, WorkRequest,
                     WrOp)
from hw.lib.membus import MemRam
from hw.target.regbank import (Q_NOTIFY, Q_REPOST, Q_WC, Q_WR, TARGET_ID, TOP_COUNTER_BASE,
                            HostDecoder, HostMemPort, HostQueues, TopRegs)
from sim.hostbus import bus_access as access
from host.port import pack_record, record_words

WORDS = 64


class Dut(wiring.Component):
    def __init__(self):
        super().__init__({"host": In(HostBusSignature())})
        self.top = TopRegs(3, own_mac=0x0200_0000_0001, own_ip=0x0A000001)
        self.mp = HostMemPort(WORDS * 8)
        self.q = HostQueues(depth=4)
        self.ram = MemRam(WORDS)
        self.dec = HostDecoder([[(Space.REG, REG_TOP, 0x100)], [(Space.MEM, 0, 1 << 32)],
                                [(Space.QUEUE, 0, 4)]])

    def elaborate(self, platform):
        m = Module()
        for n in ("top", "mp", "q", "ram", "dec"):
            m.submodules[n] = getattr(self, n)
        wiring.connect(m, wiring.flipped(self.host), self.dec.host)
        for k, s in enumerate((self.top.bus, self.mp.bus, self.q.bus)):
            wiring.connect(m, self.dec.slaves[k], s)
        wiring.connect(m, self.mp.mem, self.ram.bus)
        for k in range(3):
            m.d.comb += self.top.counters[k].eq(0x100 + k)
        return m




def run(tb):
    dut = Dut()
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    async def bench(ctx):
        await tb(ctx, dut)
    sim.add_testbench(bench)
    sim.run()


def test_top_regs_and_decode():
    async def tb(ctx, dut):
        h = dut.host
        assert await access(ctx, h, Space.REG, REG_TOP, 0) == (TARGET_ID, 0)
        assert (await access(ctx, h, Space.REG, REG_TOP + 4, 0))[0] == 0x0200
        assert (await access(ctx, h, Space.REG, REG_TOP + 8, 0))[0] == 1
        await access(ctx, h, Space.REG, REG_TOP + 0xC, 1, 0x0A000063)
        assert ctx.get(dut.top.own_ip) == 0x0A000063
        await access(ctx, h, Space.REG, REG_TOP + 4, 1, 0x1234)
        assert ctx.get(dut.top.own_mac) == 0x1234_0000_0001
        for k in range(3):
            assert await access(ctx, h, Space.REG, REG_TOP + TOP_COUNTER_BASE + 4 * k, 0) == \
                (0x100 + k, 0)
        # Read-only and unmapped registers, unmapped windows, unmapped queues: err.
        assert (await access(ctx, h, Space.REG, REG_TOP, 1, 5))[1] == 1
        assert (await access(ctx, h, Space.REG, REG_TOP + TOP_COUNTER_BASE, 1, 5))[1] == 1
        assert (await access(ctx, h, Space.REG, REG_TOP + 0x30, 0))[1] == 1
        assert (await access(ctx, h, Space.REG, 0x5000, 0))[1] == 1
        assert (await access(ctx, h, Space.QUEUE, 7, 0))[1] == 1
    run(tb)


def test_mem_port():
    rng = random.Random(3)
    model = bytearray(WORDS * 8)

    async def tb(ctx, dut):
        h = dut.host
        for _ in range(80):
            a = rng.randrange(WORDS * 2) * 4
            if rng.random() < 0.5:
                v = rng.getrandbits(32)
                assert (await access(ctx, h, Space.MEM, a, 1, v))[1] == 0
                model[a:a + 4] = v.to_bytes(4, "little")
            else:
                r, e = await access(ctx, h, Space.MEM, a, 0)
                assert e == 0 and r == int.from_bytes(model[a:a + 4], "little")
        for i in range(WORDS):
            assert ctx.get(dut.ram.mem.data[i]) == int.from_bytes(model[8 * i:8 * i + 8],
                                                                  "little")
        assert (await access(ctx, h, Space.MEM, WORDS * 8, 0))[1] == 1     # beyond memory
        assert (await access(ctx, h, Space.MEM, 6, 1, 1))[1] == 1          # misaligned
    run(tb)


def test_queues():
    rng = random.Random(4)
    wrs = [dict(qp=rng.randrange(16), wr_id=rng.getrandbits(16), op=rng.choice(list(WrOp)),
                rkey=rng.getrandbits(32), va=rng.getrandbits(64), length=rng.getrandbits(32),
                laddr=rng.getrandbits(32), imm=rng.getrandbits(32), inv_rkey=rng.getrandbits(32))
           for _ in range(6)]
    notes = [dict(qp=rng.randrange(16), addr=rng.getrandbits(32), length=rng.getrandbits(16),
                  has_imm=1, imm=rng.getrandbits(32), has_inv=0, inv_rkey=rng.getrandbits(32))
             for _ in range(3)]

    async def tb(ctx, dut):
        h, q = dut.host, dut.q
        # Pop on empty: err. Push of 4 WRs fills the FIFO (depth 4, nobody reading), 5th: err.
        assert (await access(ctx, h, Space.QUEUE, Q_WC, 0))[1] == 1
        assert (await access(ctx, h, Space.QUEUE, Q_NOTIFY, 0))[1] == 1
        for n, w in enumerate(wrs[:5]):
            v = pack_record(WorkRequest, **w)
            errs = [(await access(ctx, h, Space.QUEUE, Q_WR, 1, (v >> 32 * k) & 0xFFFFFFFF))[1]
                    for k in range(record_words(WorkRequest))]
            assert errs == [0] * (len(errs) - 1) + [int(n == 4)]
        # Drain: Amaranth's view of the stream payload vs the values pushed.
        for w in wrs[:4]:
            assert ctx.get(q.wr.valid)
            p = ctx.get(q.wr.payload)
            for k, v in w.items():
                assert getattr(p, k) == v, (k, getattr(p, k), v)
            ctx.set(q.wr.ready, 1)
            await ctx.tick()
            ctx.set(q.wr.ready, 0)
        assert not ctx.get(q.wr.valid)
        # Notifications and completions from the gateware side pop as packed words.
        for nt in notes:
            ctx.set(q.notify.payload, nt)
            ctx.set(q.notify.valid, 1)
            await ctx.tick()
        ctx.set(q.notify.valid, 0)
        ctx.set(q.wc.payload, dict(qp=5, wr_id=0xBEEF, status=3))
        ctx.set(q.wc.valid, 1)
        await ctx.tick()
        ctx.set(q.wc.valid, 0)
        for nt in notes:
            words = [await access(ctx, h, Space.QUEUE, Q_NOTIFY, 0)
                     for _ in range(record_words(RecvNotify))]
            assert all(e == 0 for _, e in words)
            v = sum(r << 32 * k for k, (r, _) in enumerate(words))
            assert v == pack_record(RecvNotify, **nt)
        assert (await access(ctx, h, Space.QUEUE, Q_NOTIFY, 0))[1] == 1
        r, e = await access(ctx, h, Space.QUEUE, Q_WC, 0)
        assert e == 0 and r == pack_record(WorkCompletion, qp=5, wr_id=0xBEEF, status=3)
        assert r == 5 | 0xBEEF << 6 | 3 << 22        # the layout's order, by hand (qp: 6 bits)
        await access(ctx, h, Space.QUEUE, Q_REPOST, 1, 9)
        await ctx.tick().repeat(3)          # FIFO read latency
        assert ctx.get(q.repost.valid) and ctx.get(q.repost.payload.qp) == 9
    run(tb)


@pytest.mark.parametrize("width", [8, 64])
def test_target_elaborates(width):
    """The whole top converts to RTLIL (all blocks wired, no driver conflicts)."""
    from amaranth.back import rtlil
    from hw.target.target import KbtpTarget
    assert "module" in rtlil.convert(KbtpTarget(width, n_qp=2, mem_words=256))

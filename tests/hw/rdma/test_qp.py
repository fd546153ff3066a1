# Ref: hw/rdma/qp.py (register maps in its docstring); hw/iface.py (QpConfig, MrEntry,
#      REG_QP, REG_MR); hw/target/hostlink.py (HostBusSignature handshake).
"""QP and MR tables: host-bus register read-back, the load strobe, decode errors, QPN lookup
and the MR lookup against a brute-force Python reference on random tables and queries."""

import random

from amaranth import Module, Signal
from amaranth.sim import Simulator

from hw.iface import QP_INDEX_BITS, QPN_BASE, REG_MR, REG_QP, REG_TRANSPORT, Space
from hw.rdma.qp import (MR_STRIDE, QP_STRIDE, CounterBank, MrAccess, MrError, MrTable,
                       QpTable)
from tests.hw.rdma.responder_bench import bus_access, mr_words

#: Independent restatement of the QP register widths (docstring of hw/rdma/qp.py).
QP_WIDTHS = {0x00: 3, 0x04: 24, 0x08: 24, 0x0C: 16, 0x10: 32, 0x14: 32, 0x18: 16, 0x1C: 3,
             0x20: 24, 0x24: 24, 0x28: 5, 0x2C: 3, 0x30: 3, 0x34: 32, 0x38: 8, 0x3C: 5}


def simulate(dut, bench):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


async def no_answer(ctx, bus, addr, space=Space.REG):
    """An access outside the table's window must not be answered."""
    ctx.set(bus.addr, addr)
    ctx.set(bus.space, space)
    ctx.set(bus.re, 1)
    for _ in range(3):
        assert not ctx.get(bus.ack)
        await ctx.tick()
    ctx.set(bus.re, 0)


def test_qp_registers_load_lookup():
    n = 4
    dut = QpTable(n)
    rng = random.Random(1)

    async def bench(ctx):
        bus = dut.bus
        vals = {}
        for i in range(n):
            for off in QP_WIDTHS:
                if off == 0x00:
                    continue
                v = rng.getrandbits(32)
                vals[i, off] = v & ((1 << QP_WIDTHS[off]) - 1)
                _, err = await bus_access(ctx, bus, REG_QP + QP_STRIDE * i + off, v)
                assert not err
                assert ctx.get(dut.load) == 0
        # Writing a state raises load[i] for exactly one cycle.
        for i in range(n):
            ctx.set(bus.addr, REG_QP + QP_STRIDE * i)
            ctx.set(bus.space, Space.REG)
            ctx.set(bus.wdata, 3 if i != 2 else 0)
            ctx.set(bus.we, 1)
            assert ctx.get(bus.ack)
            await ctx.tick()
            ctx.set(bus.we, 0)
            assert ctx.get(dut.load) == 1 << i
            await ctx.tick()
            assert ctx.get(dut.load) == 0
            vals[i, 0x00] = 3 if i != 2 else 0
        for (i, off), v in vals.items():
            rd, err = await bus_access(ctx, bus, REG_QP + QP_STRIDE * i + off)
            assert not err and rd == v, (i, hex(off), hex(rd), hex(v))
        # The cfg port carries the same values (peer MAC assembled from two words).
        for i in range(n):
            cfg = dut.cfg[i]
            assert ctx.get(cfg.peer_mac) == vals[i, 0x0C] << 32 | vals[i, 0x10]
            assert ctx.get(cfg.local_qpn) == vals[i, 0x04]
            assert ctx.get(cfg.recv_base) == vals[i, 0x34]
            assert ctx.get(cfg.rq_psn) == vals[i, 0x20]
        # Decode: holes inside the window are refused, outside the window nothing answers.
        for addr in (REG_QP + 0x40, REG_QP + QP_STRIDE * 3 + 0x80, REG_QP + 0x02 + 0x100):
            _, err = await bus_access(ctx, bus, addr)
            assert err, hex(addr)
        await no_answer(ctx, bus, REG_QP + QP_STRIDE * n)
        await no_answer(ctx, bus, REG_QP - 4)
        await no_answer(ctx, bus, REG_QP, Space.MEM)
        # Lookup by local QPN: the index is (qpn - QPN_BASE) mod 2**QP_INDEX_BITS (hw/iface.py),
        # a hit when that entry holds the QPN and is not in RESET. Oracle: the rule in Python
        # over the values written. QP 1 gets its own generation-0 QPN, QP 3 one of generation
        # 5, QP 0 a QPN of another index (never found), QP 2 is in RESET.
        stride = 1 << QP_INDEX_BITS
        for i, q in ((1, QPN_BASE + 1), (3, QPN_BASE + 3 + 5 * stride), (0, QPN_BASE + 2),
                     (2, QPN_BASE + 2)):
            await bus_access(ctx, bus, REG_QP + QP_STRIDE * i + 0x04, q)
            vals[i, 0x04] = q
        qpns = [vals[i, 0x04] for i in range(n)]
        states = [vals[i, 0x00] for i in range(n)]
        probes = set(qpns) | {QPN_BASE + 3, QPN_BASE + 3 + 4 * stride, QPN_BASE + n,
                              QPN_BASE - 1, 0, 0x123456}
        hits = 0
        for q in sorted(probes):
            ctx.set(dut.lookup_qpn, q)
            i = (q - QPN_BASE) % stride
            want = i if i < n and qpns[i] == q and states[i] != 0 else None
            assert ctx.get(dut.lookup_hit) == (want is not None), hex(q)
            if want is not None:
                assert ctx.get(dut.lookup_index) == want
                hits += 1
        assert hits == 2            # QP 1 and QP 3; QP 0's QPN is QP 2's, and QP 2 is in RESET

    simulate(dut, bench)


def mr_reference(entries, rkey, va, length, qp, access):
    """Brute force: (ok, laddr, error) for a lookup, straight from the MrTable rules."""
    for e in entries:
        if e["valid"] and e["rkey"] == rkey and e["qp_mask"] >> qp & 1:
            break
    else:
        return False, None, MrError.BAD_KEY
    if not (va >= e["va"] and va + length <= e["va"] + e["length"]):
        return False, None, MrError.RANGE
    right = {MrAccess.READ: e["read"], MrAccess.WRITE: e["write"],
             MrAccess.ATOMIC: e["atomic"]}[access]
    if not right:
        return False, None, MrError.RIGHTS
    return True, (e["laddr"] + va - e["va"]) & 0xFFFFFFFF, MrError.NONE


def test_mr_lookup_brute_force():
    n = 6
    dut = MrTable(n)
    rng = random.Random(2)
    keys = [rng.getrandbits(32) for _ in range(4)]
    entries = []
    for j in range(n):
        entries.append(dict(valid=rng.random() < 0.85, read=rng.getrandbits(1),
                            write=rng.getrandbits(1), atomic=rng.getrandbits(1),
                            qp_mask=rng.getrandbits(16), rkey=rng.choice(keys),
                            va=rng.choice([0, rng.getrandbits(64) & ~0xFFFF,
                                           (1 << 64) - 0x10000]),
                            length=rng.choice([0, 8, 4096, rng.getrandbits(20)]),
                            laddr=rng.getrandbits(32)))

    async def bench(ctx):
        for j, e in enumerate(entries):
            words = mr_words(**e)
            for off, v in words.items():
                _, err = await bus_access(ctx, dut.bus, REG_MR + MR_STRIDE * j + off, v)
                assert not err
            for off, v in words.items():
                rd, _ = await bus_access(ctx, dut.bus, REG_MR + MR_STRIDE * j + off)
                assert rd == v
        lk = dut.lookup
        seen = {e: 0 for e in MrError}
        for _ in range(1500):
            e = rng.choice(entries)
            rkey = e["rkey"] if rng.random() < 0.9 else rng.getrandbits(32)
            edge = rng.choice([0, 1, -1, e["length"], e["length"] - 8, e["length"] + 1,
                               rng.getrandbits(12)])
            va = (e["va"] + edge) % (1 << 64)
            length = rng.choice([0, 1, 8, 256, e["length"], rng.getrandbits(13)])
            qp = rng.randrange(16)
            access = rng.choice(list(MrAccess))
            for sig, v in ((lk.rkey, rkey), (lk.va, va), (lk.length, length), (lk.qp, qp),
                           (lk.access, access)):
                ctx.set(sig, v)
            await ctx.tick()
            ok, laddr, err = mr_reference(entries, rkey, va, length, qp, access)
            assert ctx.get(lk.error) == err, (hex(rkey), hex(va), length, qp, access)
            assert ctx.get(lk.ok) == ok
            if ok:
                assert ctx.get(lk.laddr) == laddr
            seen[err] += 1
        assert all(seen.values()), seen       # every outcome was exercised
        # Invalidate: every valid entry with that R_Key loses ``valid``.
        k = entries[0]["rkey"]
        ctx.set(dut.inv_rkey, k)
        ctx.set(dut.inv_valid, 1)
        assert ctx.get(dut.inv_found) == any(e["valid"] and e["rkey"] == k for e in entries)
        await ctx.tick()
        ctx.set(dut.inv_valid, 0)
        for j, e in enumerate(entries):
            ctl, _ = await bus_access(ctx, dut.bus, REG_MR + MR_STRIDE * j)
            assert ctl & 1 == (e["valid"] and e["rkey"] != k)
        assert not ctx.get(dut.inv_found)

    simulate(dut, bench)


def test_counter_bank():
    dut = CounterBank(5, base=REG_TRANSPORT + 0x100)
    rng = random.Random(3)

    async def bench(ctx):
        vals = [rng.getrandbits(32) for _ in range(5)]
        for k, v in enumerate(vals):
            ctx.set(dut.counters[k], v)
        for k, v in enumerate(vals):
            rd, err = await bus_access(ctx, dut.bus, REG_TRANSPORT + 0x100 + 4 * k)
            assert (rd, err) == (v, 0)
        _, err = await bus_access(ctx, dut.bus, REG_TRANSPORT + 0x100, 1)
        assert err
        await no_answer(ctx, dut.bus, REG_TRANSPORT + 0x100 + 20)
        await no_answer(ctx, dut.bus, REG_TRANSPORT + 0xFC)

    top = Module()                  # the bank is purely combinational: give the sim a clock
    top.submodules.dut = dut
    tick = Signal()
    top.d.sync += tick.eq(~tick)
    simulate(top, bench)

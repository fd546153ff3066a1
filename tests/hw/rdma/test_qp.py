# Ref: hw/rdma/qp.py (register maps in its docstring); hw/iface.py (QpConfig, MrEntry,
#      REG_QP, REG_MR); hw/target/hostlink.py (HostBusSignature handshake).
"""QP and MR tables: host-bus register read-back, the load event, the reader copies, decode
errors, the QPN index rule and the MR lookup against a brute-force Python reference on random
tables and queries."""

import random

import pytest
from amaranth import Elaboratable, Module, Signal
from amaranth.back import rtlil
from amaranth.lib import wiring
from amaranth.sim import Simulator

from hw.iface import (QP_INDEX_BITS, QPN_BASE, QPN_BITS, REG_MR, REG_QP, REG_TRANSPORT, Space,
                      qp_index_of)
from hw.rdma.qp import (MR_STRIDE, QP_REGS, QP_STRIDE, CounterBank, MrAccess, MrError, MrTable,
                       QpTable, qp_match)
from hw.rdma.requester import Requester
from hw.rdma.responder import Responder
from hw.rdma.txpath import TxPath
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


class QpBench(Elaboratable):
    """QpTable plus the responder's use of its ``resp`` port (hw/rdma/resp_admit.py): the row
    is read at ``qp_index_of(qpn)``, and one cycle later ``hit`` says whether it is QPN
    ``qpn``'s QP (:func:`qp_match`, and an index inside the table)."""

    def __init__(self, n):
        self.n, self.qpt = n, QpTable(n)
        self.qpn, self.hit = Signal(QPN_BITS), Signal()

    def elaborate(self, platform):
        m = Module()
        m.submodules.qpt = qpt = self.qpt
        qpn_q = Signal(QPN_BITS)
        m.d.sync += qpn_q.eq(self.qpn)
        m.d.comb += [qpt.resp.addr.eq(qp_index_of(self.qpn)),
                     self.hit.eq(qp_match(qpt.resp.data, qpn_q) & (qp_index_of(qpn_q) < self.n))]
        return m


def row_of(vals, i):
    """QP i's QpConfig field values from its register words."""
    row = {}
    for off, (path, lo, bits) in QP_REGS.items():
        row[path] = row.get(path, 0) | vals[i, off] << lo
    return row


@pytest.mark.parametrize("n", [4, 64])
def test_qp_registers_load_ports(n):
    """Every word of every QP written and read back; a state write raises one load event with
    the written row; each reader copy (the requester's ``req`` too) shows the row; a reader port
    gives the row one cycle after its address, the old row in the cycle after a write of it
    and the new one from the next; decode errors; the QPN index rule through the responder's
    port."""
    bench_top = QpBench(n)
    dut = bench_top.qpt
    rng = random.Random(n)

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
                assert ctx.get(dut.load_valid) == 0
        # Writing a state raises the load event for exactly one cycle, after the ack, with the
        # QP index and the whole merged row.
        for i in range(n):
            st = 3 if i % 4 != 2 else 0
            vals[i, 0x00] = st
            ctx.set(bus.addr, REG_QP + QP_STRIDE * i)
            ctx.set(bus.space, Space.REG)
            ctx.set(bus.wdata, st)
            ctx.set(bus.we, 1)
            for _ in range(3):
                if ctx.get(bus.ack):
                    break
                assert ctx.get(dut.load_valid) == 0
                await ctx.tick()
            assert ctx.get(bus.ack) and not ctx.get(bus.err)
            await ctx.tick()
            ctx.set(bus.we, 0)
            assert ctx.get(dut.load_valid) == 1 and ctx.get(dut.load_qp) == i
            row = ctx.get(dut.load_row)
            for path, v in row_of(vals, i).items():
                got = getattr(row, path)
                assert (got.value if hasattr(got, "value") else got) == v, (i, path)
            await ctx.tick()
            assert ctx.get(dut.load_valid) == 0
        for (i, off), v in vals.items():
            rd, err = await bus_access(ctx, bus, REG_QP + QP_STRIDE * i + off)
            assert not err and rd == v, (i, hex(off), hex(rd), hex(v))
        # Every reader copy, one cycle after its address.
        for i in range(n):
            want = row_of(vals, i)
            for name in ("intake", "tx", "req"):
                ctx.set(getattr(dut, name).addr, i)
            ctx.set(bench_top.qpn, QPN_BASE + i)          # the bench addresses `resp`
            await ctx.tick()
            for name, layout in QpTable.COPIES.items():
                data = ctx.get(getattr(dut, name).data)
                for path, _ in layout:
                    got = getattr(data, path)
                    assert (got.value if hasattr(got, "value") else got) == want[path], \
                        (i, name, path)
        # A write then a read of the same row: the port addressing it in the write cycle gets
        # the old row one cycle later, the new row from the cycle after.
        i = n - 1
        ctx.set(dut.tx.addr, i)
        ctx.set(bus.addr, REG_QP + QP_STRIDE * i + 0x08)
        ctx.set(bus.wdata, 0xABCDEF)
        ctx.set(bus.we, 1)
        while not ctx.get(bus.ack):
            await ctx.tick()
        await ctx.tick()
        ctx.set(bus.we, 0)
        assert ctx.get(dut.tx.data.remote_qpn) == vals[i, 0x08]
        await ctx.tick()
        assert ctx.get(dut.tx.data.remote_qpn) == 0xABCDEF
        vals[i, 0x08] = 0xABCDEF
        # Decode: every aligned word of the window is a register (16 words, stride 0x40);
        # unaligned addresses are refused, outside the window nothing answers.
        assert QP_STRIDE == 4 * len(QP_REGS) and REG_QP + QP_STRIDE * 64 <= REG_MR
        for addr in (REG_QP + 0x01, REG_QP + QP_STRIDE * 3 + 0x22, REG_QP + 0x03 + QP_STRIDE,
                     REG_QP + QP_STRIDE * (n - 1) + 0x3E):
            _, err = await bus_access(ctx, bus, addr)
            assert err, hex(addr)
        await no_answer(ctx, bus, REG_QP + QP_STRIDE * n)
        await no_answer(ctx, bus, REG_QP - 4)
        await no_answer(ctx, bus, REG_QP, Space.MEM)
        # The QPN rule: the index is (qpn - QPN_BASE) mod 2**QP_INDEX_BITS (hw/iface.py), a
        # hit when that row holds the QPN and is not in RESET. Oracle: the rule in Python over
        # the values written. QP 1 gets its own generation-0 QPN, QP 3 one of generation 5,
        # QP 0 a QPN of another index (never found), QP 2 is in RESET.
        stride = 1 << QP_INDEX_BITS
        for i, q in ((1, QPN_BASE + 1), (3, QPN_BASE + 3 + 5 * stride), (0, QPN_BASE + 2),
                     (2, QPN_BASE + 2)):
            await bus_access(ctx, bus, REG_QP + QP_STRIDE * i + 0x04, q)
            vals[i, 0x04] = q
        qpns = [vals[i, 0x04] for i in range(n)]
        states = [vals[i, 0x00] for i in range(n)]
        probes = set(qpns[:4]) | {QPN_BASE + 3, QPN_BASE + 3 + 4 * stride, QPN_BASE + n,
                                  QPN_BASE + 4, QPN_BASE - 1, 0, 0x123456}
        hits = 0
        for q in sorted(probes):
            ctx.set(bench_top.qpn, q)
            await ctx.tick()
            i = (q - QPN_BASE) % stride
            want = i < n and qpns[i] == q and states[i] != 0
            assert ctx.get(bench_top.hit) == want, hex(q)
            hits += want
        assert hits >= 2            # QP 1 and QP 3; QP 0's QPN is QP 2's, and QP 2 is in RESET

    simulate(bench_top, bench)


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
                            qp_mask=rng.getrandbits(64), rkey=rng.choice(keys),
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
            qp = rng.randrange(64)
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


class QpReaders(wiring.Component):
    """QpTable wired to its readers as in hw/target/target.py."""

    def __init__(self, n):
        self.n = n
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.submodules.qpt = qpt = QpTable(self.n)
        m.submodules.resp = resp = Responder(8, self.n)
        m.submodules.req = req = Requester(8, self.n)
        m.submodules.txp = txp = TxPath(8, 2, self.n)
        wiring.connect(m, resp.cfg, qpt.resp)
        wiring.connect(m, req.intake, qpt.intake)
        wiring.connect(m, req.cfg, qpt.req)
        wiring.connect(m, txp.cfg, qpt.tx)
        for unit in (resp, req):
            m.d.comb += [unit.load_valid.eq(qpt.load_valid), unit.load_qp.eq(qpt.load_qp),
                         unit.load_row.eq(qpt.load_row)]
        return m


@pytest.mark.parametrize("n", [4, 64])
def test_qp_readers_elaborate(n):
    """The QP table and its readers (responder, requester, TX path) elaborate at 4 and 64 QPs."""
    assert "module" in rtlil.convert(QpReaders(n))

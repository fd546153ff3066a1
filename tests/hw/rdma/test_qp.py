# Ref: hw/rdma/qp.py (register maps in its docstring); hw/iface.py (QpConfig, MrEntry,
#      REG_QP, REG_MR); hw/target/hostlink.py (HostBusSignature handshake).
"""QP and MR tables: host-bus register read-back, the load event, the reader copies, decode
errors, the QPN index rule and the MR lookup against a brute-force Python reference on random
tables and queries; named MR precedence cases, invalidate against same-cycle host writes, and
the MR table cycle by cycle against a model under back-to-back host accesses."""

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
from tests.hw.rdma.responder_bench import bus_access, mr_words, write_mr

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


def mr_match(entries, rkey, va, length, qp, access):
    """The lookup's first stage: the index of the first valid region with R_Key ``rkey`` and
    QP ``qp``'s mask bit, or None."""
    for j, e in enumerate(entries):
        if e["valid"] and e["rkey"] == rkey and e["qp_mask"] >> qp & 1:
            return j
    return None


def mr_reference(entries, rkey, va, length, qp, access, *, match_in=None):
    """Brute force: (ok, laddr, error) for a lookup, straight from the MrTable rules. The key
    match runs over ``match_in`` when given (MrTable's first stage sees the table a cycle
    before its second reads the region's words), else over ``entries`` too."""
    j = mr_match(entries if match_in is None else match_in, rkey, va, length, qp, access)
    if j is None:
        return False, None, MrError.BAD_KEY
    e = entries[j]
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
            await ctx.tick().repeat(2)
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


MASK64 = (1 << 64) - 1


def mr_expected_words(n_qp, words):
    """What MR register words read back after ``words`` ({offset: value}) were written to a
    table of ``n_qp`` QPs: each field's width (module docstring), qp_mask bits of QPs beyond
    ``n_qp`` read 0."""
    width = {0x00: 4, 0x04: min(32, n_qp), 0x08: 32, 0x0C: 32, 0x10: 32, 0x14: 32, 0x18: 32,
             0x1C: max(0, min(32, n_qp - 32))}
    return {off: v & ((1 << width[off]) - 1) for off, v in words.items()}


async def mr_lookup(ctx, lk, rkey, va, length, qp, access):
    """One lookup: inputs in cycles t and t + 1, (ok, laddr, error) read in cycle t + 2."""
    for sig, v in ((lk.rkey, rkey), (lk.va, va), (lk.length, length), (lk.qp, qp),
                   (lk.access, access)):
        ctx.set(sig, v)
    await ctx.tick().repeat(2)
    return ctx.get(lk.ok), ctx.get(lk.laddr), ctx.get(lk.error)


@pytest.mark.parametrize("n_mr,n_qp", [(1, 1), (3, 4), (8, 40), (8, 64)])
def test_mr_registers(n_mr, n_qp):
    """Every word of every region written with random values and read back at its field's
    width (qp_mask bits beyond ``n_qp`` read 0, in both mask words); decode errors (unaligned,
    the words 0x20..0x3C of each stride); silence (no ack, err or rdata) outside the window."""
    dut = MrTable(n_mr, n_qp=n_qp)
    rng = random.Random(n_mr * 100 + n_qp)

    async def bench(ctx):
        bus = dut.bus
        written = {}
        for j in range(n_mr):
            for off in range(0, 0x20, 4):
                v = rng.getrandbits(32) | 0xF       # every QP bit of the mask words set
                written[j, off] = v
                _, err = await bus_access(ctx, bus, REG_MR + MR_STRIDE * j + off, v)
                assert not err
        for j in range(n_mr):
            want = mr_expected_words(n_qp, {off: written[j, off] for off in range(0, 0x20, 4)})
            for off, v in want.items():
                rd, err = await bus_access(ctx, bus, REG_MR + MR_STRIDE * j + off)
                assert (rd, err) == (v, 0), (j, hex(off), hex(rd), hex(v))
        for addr in (REG_MR + 0x01, REG_MR + 0x20, REG_MR + 0x3C, REG_MR + 0x1E,
                     REG_MR + MR_STRIDE * (n_mr - 1) + 0x24, REG_MR + MR_STRIDE * n_mr - 1):
            for wdata in (None, 0xFFFFFFFF):
                rd, err = await bus_access(ctx, bus, addr, wdata)
                assert err and rd == 0, hex(addr)
        for addr, space in ((REG_MR + MR_STRIDE * n_mr, Space.REG), (REG_MR - 4, Space.REG),
                            (REG_MR, Space.MEM), (REG_MR + 0x08, Space.QUEUE)):
            ctx.set(bus.addr, addr)
            ctx.set(bus.space, space)
            ctx.set(bus.re, 1)
            for _ in range(2):
                assert (ctx.get(bus.ack), ctx.get(bus.err), ctx.get(bus.rdata)) == (0, 0, 0)
                await ctx.tick()
            ctx.set(bus.re, 0)
        # The refused writes changed nothing.
        for j in range(n_mr):
            want = mr_expected_words(n_qp, {off: written[j, off] for off in range(0, 0x20, 4)})
            for off, v in want.items():
                rd, _ = await bus_access(ctx, bus, REG_MR + MR_STRIDE * j + off)
                assert rd == v, (j, hex(off))

    simulate(dut, bench)


def test_mr_lookup_precedence():
    """Named cases the random test may miss, each against the reference and a stated answer:
    two regions with one R_Key (the lower index wins even when the higher would pass the
    range or rights check; a region whose qp_mask lacks the QP is skipped), QP 63's mask bit,
    an invalid region never matches, a region ending exactly at 2**64."""
    dut = MrTable(5, n_qp=64)
    K, K2 = 0x1234_5678, 0x9ABC_DEF0
    top = (1 << 64) - 0x100
    entries = [
        dict(valid=1, read=1, write=0, atomic=0, qp_mask=1 << 63, rkey=K, va=0x1000,
             length=0x100, laddr=0x10_0000),
        dict(valid=1, read=1, write=1, atomic=0, qp_mask=MASK64, rkey=K, va=0x2000,
             length=0x100, laddr=0x20_0000),
        dict(valid=0, read=1, write=1, atomic=1, qp_mask=MASK64, rkey=K2, va=0x3000,
             length=0x100, laddr=0x30_0000),
        dict(valid=1, read=1, write=1, atomic=1, qp_mask=(1 << 63) | 1, rkey=K2, va=top,
             length=0x100, laddr=0xFFFF_FF80),
        dict(valid=1, read=1, write=1, atomic=1, qp_mask=MASK64 >> 1, rkey=K2, va=0,
             length=0xFFFF_FFFF, laddr=0x4000_0000),
    ]
    R, W, A = MrAccess.READ, MrAccess.WRITE, MrAccess.ATOMIC
    ok = MrError.NONE
    cases = [  # (rkey, va, length, qp, access) -> (error, laddr when ok)
        ((K, 0x1000, 0x100, 63, R), (ok, 0x10_0000)),       # region 0: only QP 63
        ((K, 0x10F8, 8, 63, R), (ok, 0x10_00F8)),
        ((K, 0x2000, 8, 63, R), (MrError.RANGE, None)),      # region 0 wins, out of its range
        ((K, 0x1000, 8, 63, W), (MrError.RIGHTS, None)),     # region 0 wins, no write right
        ((K, 0x2000, 8, 62, W), (ok, 0x20_0000)),            # QP 62: region 0 skipped
        ((K, 0x1000, 8, 62, R), (MrError.RANGE, None)),      # ... so region 1's range
        ((K, 0x2000, 8, 0, R), (ok, 0x20_0000)),
        ((K2, 0x3000, 8, 5, R), (ok, 0x4000_3000)),          # region 2 invalid: region 4
        ((K2, 0x3000, 8, 63, R), (MrError.RANGE, None)),     # QP 63: region 3, not 4
        ((K2, top, 0x100, 63, A), (ok, 0xFFFF_FF80)),        # region 3 ends at 2**64
        ((K2, top + 0xF8, 8, 63, W), (ok, 0x0000_0078)),     # laddr wraps at 2**32
        ((K2, MASK64, 1, 0, R), (ok, 0x0000_007F)),
        ((K2, MASK64, 0, 0, R), (ok, 0x0000_007F)),
        ((K2, MASK64, 2, 0, R), (MrError.RANGE, None)),      # would end at 2**64 + 1
        ((K2, top + 1, 0x100, 0, R), (MrError.RANGE, None)),
        ((K2, top - 1, 1, 0, R), (MrError.RANGE, None)),     # one below the region
        ((K2, 0, 0, 0, R), (MrError.RANGE, None)),           # QP 0: region 3 wins over 4
        ((K2, 0, 0, 1, R), (ok, 0x4000_0000)),               # QP 1: region 4
        ((K2, 0xFFFF_FFFF, 0, 1, R), (ok, 0x3FFF_FFFF)),
        ((K2, 0xFFFF_FFFF, 1, 1, R), (MrError.RANGE, None)),
        ((K2, 0, 8, 63, R), (MrError.RANGE, None)),          # region 4 lacks QP 63
        ((K2 ^ 1, top, 8, 63, R), (MrError.BAD_KEY, None)),
        ((K, 0x1000, 8, 1, A), (MrError.RANGE, None)),       # error precedence: RANGE first
        ((K, 0x2000, 8, 1, A), (MrError.RIGHTS, None)),
    ]

    async def bench(ctx):
        for j, e in enumerate(entries):
            await write_mr(ctx, dut.bus, j, **e)
        for (rkey, va, length, qp, access), (err, laddr) in cases:
            got = await mr_lookup(ctx, dut.lookup, rkey, va, length, qp, access)
            ref = mr_reference(entries, rkey, va, length, qp, access)
            assert ref[0] == (err == ok) and ref[2] == err and (laddr is None or
                                                                 ref[1] == laddr), \
                (hex(rkey), hex(va), length, qp, access, ref)
            want = (err == ok, laddr, err)
            assert (got if err == ok else (got[0], None, got[2])) == want, \
                (hex(rkey), hex(va), length, qp, access, got)

    simulate(dut, bench)


def test_mr_invalidate_with_host_write():
    """Invalidate against a same-cycle host write: a control write to a region being
    invalidated keeps its rights but loses ``valid``; the compare uses the R_Key and ``valid``
    of before the cycle (a same-cycle R_Key write neither escapes nor joins the invalidate, a
    same-cycle ``valid`` write to an invalid region holds); ``inv_found`` follows the table
    whether ``inv_valid`` is high or not; a lookup in the invalidate's cycle still finds the
    region."""
    dut = MrTable(4, n_qp=4)
    K, K2, K3 = 0x1111_0001, 0x2222_0002, 0x3333_0003
    base = dict(qp_mask=0xF, va=0x1000, length=0x1000, laddr=0x8000)

    async def control(ctx, j):
        rd, err = await bus_access(ctx, dut.bus, REG_MR + MR_STRIDE * j)
        assert not err
        return rd

    async def cycle(ctx, inv_rkey, j, off, wdata):
        """Host write of (j, off) and an invalidate of ``inv_rkey`` in one cycle."""
        bus = dut.bus
        ctx.set(bus.space, Space.REG)
        ctx.set(bus.addr, REG_MR + MR_STRIDE * j + off)
        ctx.set(bus.wdata, wdata)
        ctx.set(bus.we, 1)
        ctx.set(dut.inv_rkey, inv_rkey)
        ctx.set(dut.inv_valid, 1)
        assert ctx.get(bus.ack) and not ctx.get(bus.err)
        await ctx.tick()
        ctx.set(bus.we, 0)
        ctx.set(dut.inv_valid, 0)

    async def bench(ctx):
        for j, (valid, rkey) in enumerate(((1, K), (1, K), (1, K2), (0, K))):
            await write_mr(ctx, dut.bus, j, valid=valid, read=1, write=0, atomic=0, rkey=rkey,
                           **base)
        # inv_found: combinational, with inv_valid low, and following the table.
        for rkey, want in ((K, 1), (K2, 1), (K3, 0)):
            ctx.set(dut.inv_rkey, rkey)
            assert ctx.get(dut.inv_found) == want
        # Lookup in the invalidate's cycle: found (table of before the cycle), then not.
        lk = dut.lookup
        for sig, v in ((lk.rkey, K), (lk.va, 0x1000), (lk.length, 8), (lk.qp, 2),
                       (lk.access, MrAccess.READ)):
            ctx.set(sig, v)
        # Invalidate K while region 0's control is written valid + read + write and region
        # 3 (invalid, R_Key K) is not touched.
        await cycle(ctx, K, 0, 0x00, 0b0111)
        await ctx.tick()                            # the second stage (rights as written)
        assert ctx.get(lk.ok) and ctx.get(lk.laddr) == 0x8000
        assert await control(ctx, 0) == 0b0110     # rights written, valid cleared
        assert await control(ctx, 1) == 0b0010     # invalidated too
        assert await control(ctx, 2) == 0b0011     # other R_Key: untouched
        assert await control(ctx, 3) == 0b0010
        assert ctx.get(lk.error) == MrError.BAD_KEY and not ctx.get(lk.ok)
        ctx.set(dut.inv_rkey, K)
        assert not ctx.get(dut.inv_found)
        # Region 3 (invalid, R_Key K) written valid in an invalidate of K: not a hit, so valid.
        await cycle(ctx, K, 3, 0x00, 0b0011)
        assert await control(ctx, 3) == 0b0011
        ctx.set(dut.inv_rkey, K)
        assert ctx.get(dut.inv_found)
        # Region 2 (K2) gets R_Key K3 in the cycle of an invalidate of K2: invalidated (old
        # R_Key) and holds K3.
        await cycle(ctx, K2, 2, 0x08, K3)
        assert await control(ctx, 2) == 0b0010
        rd, _ = await bus_access(ctx, dut.bus, REG_MR + MR_STRIDE * 2 + 0x08)
        assert rd == K3
        # Region 0 (invalid now) gets R_Key K3 in the cycle of an invalidate of K3: region 2
        # holds K3 but is invalid, region 0's old key is K: nothing changes but the key.
        await bus_access(ctx, dut.bus, REG_MR, 0b0011)
        await cycle(ctx, K3, 0, 0x08, K3)
        assert await control(ctx, 0) == 0b0011
        ctx.set(dut.inv_rkey, K3)
        assert ctx.get(dut.inv_found)
        # A plain invalidate (no host access) clears every valid region with the key.
        ctx.set(dut.inv_valid, 1)
        await ctx.tick()
        ctx.set(dut.inv_valid, 0)
        assert [await control(ctx, j) & 1 for j in range(4)] == [0, 0, 0, 1]
        assert not ctx.get(dut.inv_found)

    simulate(dut, bench)


@pytest.mark.parametrize("n_qp", [4, 20, 40])
def test_mr_qp_beyond_table(n_qp):
    """A QP index past ``n_qp`` has no mask bit, even when the host set every bit of both
    mask words; the last QP has its bit."""
    dut = MrTable(2, n_qp=n_qp)

    async def bench(ctx):
        await write_mr(ctx, dut.bus, 1, valid=1, read=1, write=0, atomic=0, qp_mask=MASK64,
                       rkey=5, va=0, length=64, laddr=0x100)
        for _ in range(8):                              # let any copy in the table settle
            await ctx.tick()
        for qp in range(64):
            got = await mr_lookup(ctx, dut.lookup, 5, 8, 8, qp, MrAccess.READ)
            want = (1, 0x108, MrError.NONE) if qp < n_qp else (0, got[1], MrError.BAD_KEY)
            assert got == want, qp

    simulate(dut, bench)


@pytest.mark.parametrize("n_qp", [4, 40, 64])
def test_mr_cycle_by_cycle(n_qp):
    """Lookups every cycle, host reads and writes back to back (often of the mask words, which
    the table may make wait) and invalidates, against a Python model of the table updated at
    each acknowledged write: each lookup's answer is the reference over the table of the cycle
    its inputs were sampled in for the key match, and over the table of the next cycle for the
    region's words (the second stage); inv_found and every read agree with the model in their
    own cycle."""
    n = 3
    dut = MrTable(n, n_qp=n_qp)
    rng = random.Random(7 + n_qp)
    keys = [0x11, 0x22, 0x33]
    table = [dict(valid=0, read=0, write=0, atomic=0, qp_mask=0, rkey=0, va=0, length=0,
                  laddr=0) for _ in range(n)]
    words = [{off: 0 for off in range(0, 0x20, 4)} for _ in range(n)]
    qmask = (1 << n_qp) - 1

    def write(j, off, v):
        e = table[j]
        words[j][off] = mr_expected_words(n_qp, {off: v})[off]
        if off == 0x00:
            e.update(valid=v & 1, read=v >> 1 & 1, write=v >> 2 & 1, atomic=v >> 3 & 1)
        elif off in (0x04, 0x1C):
            sh = 0 if off == 0x04 else 32
            e["qp_mask"] = (e["qp_mask"] & ~(0xFFFFFFFF << sh) | v << sh) & qmask
        elif off == 0x08:
            e["rkey"] = v
        elif off in (0x0C, 0x10):
            sh = 32 if off == 0x0C else 0
            e["va"] = e["va"] & ~(0xFFFFFFFF << sh) | v << sh
        else:
            e["length" if off == 0x14 else "laddr"] = v

    def wdata(j, off):
        if off == 0x00:
            return rng.getrandbits(4) | 1 if rng.random() < 0.8 else rng.getrandbits(32)
        if off in (0x04, 0x1C):
            return rng.choice([0xFFFFFFFF, 0, rng.getrandbits(32)])
        if off == 0x08:
            return rng.choice(keys)
        if off == 0x0C:
            return rng.choice([0, 0, 0xFFFFFFFF])
        if off == 0x10:
            return rng.choice([0x1000 * j, 0xFFFFF000])
        if off == 0x14:
            return rng.choice([0x1000, 0x800, 0])
        return rng.getrandbits(32)

    async def bench(ctx):
        bus, lk = dut.bus, dut.lookup
        req = None                          # (j, off, wdata or None for a read, cycles waited)
        seen = {e: 0 for e in MrError}
        prev = None                         # the previous cycle's lookup and its key match table
        for cycle in range(4000):
            # Inputs of this cycle.
            if req is None and rng.random() < 0.7:
                j, off = rng.randrange(n), rng.choice([0x04, 0x1C, 0x04, 0x1C] +
                                                      list(range(0, 0x20, 4)))
                req = (j, off, wdata(j, off) if rng.random() < 0.8 else None, 0)
                ctx.set(bus.space, Space.REG)
                ctx.set(bus.addr, REG_MR + MR_STRIDE * j + off)
                ctx.set(bus.wdata, req[2] or 0)
                ctx.set(bus.we, req[2] is not None)
                ctx.set(bus.re, req[2] is None)
            e = rng.choice(table)
            qps = [q for q in range(n_qp) if e["qp_mask"] >> q & 1]
            look = (e["rkey"] if rng.random() < 0.8 else rng.choice(keys),
                    (e["va"] + rng.choice([0, 8, 0xFF8, 0x1000, -8])) % (1 << 64),
                    rng.choice([0, 8, 9]),
                    rng.choice(qps) if qps and rng.random() < 0.7 else rng.randrange(n_qp),
                    rng.choice(list(MrAccess)))
            for sig, v in zip((lk.rkey, lk.va, lk.length, lk.qp, lk.access), look):
                ctx.set(sig, v)
            inv = rng.random() < 0.02
            inv_key = rng.choice(keys)
            ctx.set(dut.inv_rkey, inv_key)
            ctx.set(dut.inv_valid, inv)
            # Combinational answers of this cycle.
            hits = [x["valid"] and x["rkey"] == inv_key for x in table]
            assert ctx.get(dut.inv_found) == any(hits), cycle
            # The previous cycle's lookup: its key match over that cycle's table, the region's
            # words of this one.
            want = prev and mr_reference(table, *prev[0], match_in=prev[1])
            prev = (look, [dict(x) for x in table])
            acked = None
            if req is not None:
                if ctx.get(bus.ack):
                    assert not ctx.get(bus.err)
                    j, off, v, _ = req
                    if v is None:
                        rd = ctx.get(bus.rdata)
                        exp = words[j][off] if off else words[j][0] & ~1 | table[j]["valid"]
                        assert rd == exp, (cycle, j, hex(off), hex(rd), hex(exp))
                    else:
                        acked = (j, off, v)
                    req = None
                else:
                    req = req[:3] + (req[3] + 1,)
                    assert req[3] < 9, "no ack"
            await ctx.tick()
            ctx.set(bus.we, 0)
            ctx.set(bus.re, 0)
            if req is not None:                         # still waiting: hold the request
                ctx.set(bus.we, req[2] is not None)
                ctx.set(bus.re, req[2] is None)
            # The lookup of the previous cycle, answered now.
            if want:
                ok, laddr, err = want
                assert ctx.get(lk.error) == err, (cycle, look)
                assert ctx.get(lk.ok) == ok
                if ok:
                    assert ctx.get(lk.laddr) == laddr
                seen[err] += 1
            # The table after the edge: the write, then the invalidate (of the old table).
            if acked:
                write(*acked)
            if inv:
                for x, hit in zip(table, hits):
                    if hit:
                        x["valid"] = 0
        assert all(seen.values()), seen

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

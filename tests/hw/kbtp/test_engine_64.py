# Ref: hw/kbtp/engine.py (per-QP state: sessions, SCRATCH slot rings, host order);
#      hw/kbtp/engine_regs.py (sessions memory, USAGE's one writer); hw/kbtp/regmap.py;
#      hw/iface.py QP_INDEX_BITS; model/target.py (golden model); issue 22 (64 QPs).
"""The engine at 2**QP_INDEX_BITS = 64 QPs: sessions on QPs 0, 37 and 63 against the golden
model, USAGE and the host order kept per QP, and the register bank's USAGE updates (one write
port: a host access in the cycle of an engine update is answered a cycle later)."""

from amaranth.sim import Simulator

from hw.headers import Opcode
from hw.iface import QP_INDEX_BITS, REG_KBTP, Space
from hw.kbtp.engine import FAST_OPS, reg
from hw.kbtp.engine_regs import EngineRegs
from sim.hdl import stream_get
from sim.workload import build
from tests.hw.kbtp.test_kbtp_engine import (RAM_BYTES, RECV_BASE, Top, configure, hello,
                                            make_model, ram_write, reg_read, run_mix)

N_QP = 1 << QP_INDEX_BITS
QPS = (0, 37, 63)


def _usage(q):
    return reg["QP"] + reg["QP_STRIDE"] * q + reg["QP_USAGE"]


def test_64_qps_against_model():
    """Three sessions on QPs 0, 37 and 63 of a 64-QP engine: every request as the model does
    it; at the end each QP's USAGE is its session's, and the QPs without a session read 0."""
    async def after(ctx, top, model, conns):
        for i, c in enumerate(conns):
            want = model.usage(model.session_of(c).initiator_id)
            assert await reg_read(ctx, top.eng.bus, _usage(QPS[i])) == want, QPS[i]
        for q in (1, 36, 38, 62):
            assert await reg_read(ctx, top.eng.bus, _usage(q)) == 0, q

    # (quota 2: ALLOC_STOREs meet their QP's quota)
    stats = run_mix(5, 100, mem_bp=0.2, wr_bp=0.2, n_qp=N_QP, qps=QPS, after=after,
                    quota_per_initiator=2)
    c = stats["counters"]
    print(f"\n64 QPs, sessions on {QPS}: {sorted(c.items())}; cycles per request: min "
          f"{min(stats['cycles'])}, mean {sum(stats['cycles']) / stats['n']:.1f}, max "
          f"{max(stats['cycles'])}")
    for op in FAST_OPS:
        assert c.get((op.name, "OK"), 0) > 0, op
    assert c.get(("ALLOC_STORE", "NO_SPACE"), 0) > 0


def test_host_order_per_qp_at_64():
    """A message at the host holds back its own QP's next message only: QP 37's waits for
    QP 37's host_done (another QP's host_done, even one with nothing at the host, does not
    release it, nor count below zero), while QP 0 and 63 go on."""
    model = make_model()
    conns = ["a", "b", "c"]
    for i, c in enumerate(conns):
        model.connect(c)
        hello(model, c, i + 1)
    top = Top(bytes(model.mem) + bytes(RAM_BYTES - len(model.mem)), n_qp=N_QP)
    eng = top.eng
    h = model.session_of("b").handle_base
    free = build(Opcode.FREE, handle=h)[:24]        # slow path
    seen = []

    async def offer(ctx, q, raw, cycles=30):
        """Offer a message of QP q; True if the engine takes it within ``cycles``."""
        addr = RECV_BASE + 1024 * QPS.index(q)
        ram_write(ctx, top.ram, addr, raw)
        ctx.set(eng.notify.payload, {"qp": q, "addr": addr, "length": len(raw)})
        ctx.set(eng.notify.valid, 1)
        for _ in range(cycles):
            _, _, ready = await ctx.tick().sample(eng.notify.ready)
            if ready:
                ctx.set(eng.notify.valid, 0)
                return True
        ctx.set(eng.notify.valid, 0)
        return False

    async def host_done(ctx, q):
        ctx.set(eng.host_done_qp, q)
        ctx.set(eng.host_done, 1)
        await ctx.tick()
        ctx.set(eng.host_done, 0)

    async def bench(ctx):
        await configure(ctx, eng, model, conns, QPS)
        for _ in range(70):                         # the COUNT memory's sweep
            await ctx.tick()
        await host_done(ctx, 63)                    # nothing at the host for 63: no change
        assert await offer(ctx, 37, free)
        seen.append((await stream_get(ctx, eng.hostq)).qp)
        assert not await offer(ctx, 37, free)       # QP 37 has one at the host
        await host_done(ctx, 63)
        await host_done(ctx, 0)
        assert not await offer(ctx, 37, free)
        assert await offer(ctx, 63, free)           # other QPs go on
        seen.append((await stream_get(ctx, eng.hostq)).qp)
        await host_done(ctx, 37)
        assert await offer(ctx, 37, free)
        seen.append((await stream_get(ctx, eng.hostq)).qp)
        assert not await offer(ctx, 63, free)       # 63's first is still at the host
        assert not await offer(ctx, 37, free)
        await host_done(ctx, 63)
        assert await offer(ctx, 63, free)
        seen.append((await stream_get(ctx, eng.hostq)).qp)
        assert await offer(ctx, 0, free)
        seen.append((await stream_get(ctx, eng.hostq)).qp)

    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert seen == [37, 63, 37, 63, 0]


def test_usage_updates_at_64():
    """USAGE per QP in the sessions memory: the engine's +1 (at ``qp``) and -1 (at ``dec_qp``)
    on QPs 0, 37 and 63; a host write of another QP's USAGE in the cycle of an update is
    answered a cycle later and both land; of the same QP, the host's value wins; after reset
    SESSION and USAGE read 0 until written, and the session shown at ``qp_next`` follows."""
    dut = EngineRegs(N_QP, 4, REG_KBTP)

    async def access(ctx, off, value=None):
        """(rdata, cycles to the answer)."""
        ctx.set(dut.bus.addr, REG_KBTP + off)
        ctx.set(dut.bus.space, Space.REG)
        ctx.set(dut.bus.wdata, value or 0)
        ctx.set(dut.bus.we if value is not None else dut.bus.re, 1)
        for n in range(1, 4):
            ack, err, rdata = ctx.get(dut.bus.ack), ctx.get(dut.bus.err), ctx.get(dut.bus.rdata)
            await ctx.tick()
            if ack:
                assert not err
                ctx.set(dut.bus.we, 0)
                ctx.set(dut.bus.re, 0)
                return rdata, n
        raise AssertionError("no answer")

    async def engine(ctx, inc=None, dec=None):
        """An engine USAGE update this cycle (settles comb signals; the caller ticks)."""
        ctx.set(dut.usage_inc, inc is not None)
        ctx.set(dut.usage_dec, dec is not None)
        if inc is not None:
            ctx.set(dut.qp, inc)
        if dec is not None:
            ctx.set(dut.dec_qp, dec)

    async def bench(ctx):
        for q in (0, 37, 63):
            assert (await access(ctx, _usage(q)))[0] == 0
            sess = reg["QP"] + reg["QP_STRIDE"] * q
            assert (await access(ctx, sess))[0] == 0
        for i, q in enumerate((0, 37, 63)):
            sess = reg["QP"] + reg["QP_STRIDE"] * q
            await access(ctx, sess + reg["QP_QUOTA"], 100 + q)
            await access(ctx, sess + reg["QP_SESSION"], 1 | i << 8)
            await access(ctx, _usage(q), 10 * i)
        # the engine's updates, one per cycle
        for inc, dec in ((0, None), (None, 37), (63, None), (63, None), (None, 0), (37, None)):
            await engine(ctx, inc, dec)
            await ctx.tick()
        await engine(ctx)
        got = [(await access(ctx, _usage(q)))[0] for q in (0, 37, 63)]
        assert got == [0, 10, 22]
        # a host write of 37's USAGE in the cycle of 63's +1: answered a cycle later, both land
        await engine(ctx, inc=63)
        ctx.set(dut.bus.addr, REG_KBTP + _usage(37))
        ctx.set(dut.bus.space, Space.REG)
        ctx.set(dut.bus.wdata, 5)
        ctx.set(dut.bus.we, 1)
        assert not ctx.get(dut.bus.ack)
        await ctx.tick()
        await engine(ctx)
        assert ctx.get(dut.bus.ack) and not ctx.get(dut.bus.err)
        await ctx.tick()
        ctx.set(dut.bus.we, 0)
        assert [(await access(ctx, _usage(q)))[0] for q in (37, 63)] == [5, 23]
        # the same QP: the host's value wins
        await engine(ctx, dec=0)
        ctx.set(dut.bus.addr, REG_KBTP + _usage(0))
        ctx.set(dut.bus.wdata, 7)
        ctx.set(dut.bus.we, 1)
        await ctx.tick()
        await engine(ctx)
        await ctx.tick()
        ctx.set(dut.bus.we, 0)
        assert (await access(ctx, _usage(0)))[0] == 7
        # the request's session, registered at qp_next
        for i, q in enumerate((0, 37, 63)):
            ctx.set(dut.qp_next, q)
            await ctx.tick()
            s = ctx.get(dut.session)
            assert (s.valid, s.domain, s.quota, s.usage) == (1, i, 100 + q, (7, 5, 23)[i])
        ctx.set(dut.qp_next, 1)                     # never written since reset
        await ctx.tick()
        assert ctx.get(dut.session.valid) == 0

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()

# Ref: hw/rdma/req_timers.py (the contract of ``zero``); docs/roce-layouts.md §6.7 (ACK timeout,
#      RNR NAK timer).
"""RetryTimers in the Amaranth simulator against a plain Python reference of its contract.

The reference is the old down-counter: a start of QP i at cycle k with ``cycles`` (the RNR
timer when both starts are asked for) reads expired from cycle T = k+1+cycles on. The memory
version may see it late, by at most n_qp+1 cycles, never early: ``zero[i]`` is 0 from k+1 to
T-1, 1 from T+n_qp+1 on, rises once and stays up until the next start; 1 at k+1 for 0 cycles
(ACK code 0), all 1 from reset to the first start.

The sweep reads QP c % n_qp at cycle c (reset at cycle 0). The phase tests start a QP at every
residue of the cycle modulo n_qp, so one start lands on the cycle the sweep reads that QP (a
read port not transparent to the write port sets ``zero`` from the old deadline), and one has
the sweep compare that QP on the cycle before its deadline (a deadline one cycle early sets
``zero`` early); neither depends on the phase being the one stated.
"""

import random

import pytest
from amaranth.sim import Simulator

from hw.rdma.req_timers import (RetryTimers, ack_timeout_cycles, rnr_timer_cycles, timer_bits)

CLK_HZ = 25e6
SCALE = 1 << 20        # ACK code c: 102.4 * 2**c / 2**20 cycles (codes 1..21: 1..205); RNR: 1..16
WRAP_SCALE = 1 << 30   # every timer 205 cycles or less: ``now`` wraps every 512 or 1024 cycles
N_QPS = [1, 4, 64]


def cycles_of(ack_code, rnr_code, start_ack, start_rnr, scale):
    if start_rnr:
        return rnr_timer_cycles(rnr_code, CLK_HZ, scale)
    return ack_timeout_cycles(ack_code, CLK_HZ, scale)


class Reference:
    """What ``zero`` may be at each cycle, from the starts seen so far."""

    def __init__(self, n_qp):
        self.n_qp, self.late = n_qp, n_qp + 1
        self.started = [None] * n_qp        # (cycle, cycles) of the last start
        self.prev = [1] * n_qp
        self.lateness = []                  # rise cycle - T, per rise

    def start(self, cycle, qp, cycles):
        self.started[qp] = (cycle, cycles)

    def check(self, cycle, zero):
        for i in range(self.n_qp):
            z = zero >> i & 1
            if self.started[i] is None:
                assert z, f"QP {i}: zero low at cycle {cycle} before any start"
                continue
            k, cyc = self.started[i]
            t = k + 1 + cyc
            where = f"QP {i} started at {k} for {cyc} cycles (T = {t}), cycle {cycle}"
            assert not (z and cycle < t), f"{where}: zero early"
            assert z or cycle < t + self.late, f"{where}: zero still low, {self.late} cycles late"
            if cyc == 0 and cycle == t:
                assert z, f"{where}: 0 cycles, zero not at once"
            if self.prev[i] and not z:
                assert k == cycle - 1, f"{where}: zero fell without a start"
            if z and not self.prev[i]:
                self.lateness.append(cycle - t)
            self.prev[i] = z


class Harness:
    """One cycle per :meth:`step`: check ``zero`` against the reference, drive ``ctl``, tick."""

    def __init__(self, ctx, dut, n_qp, scale, rng):
        self.ctx, self.dut, self.n_qp, self.scale, self.rng = ctx, dut, n_qp, scale, rng
        self.ref, self.cycle = Reference(n_qp), 0

    def zero(self, qp):
        return self.ctx.get(self.dut.zero) >> qp & 1

    async def step(self, qp=None, ack=None, rnr=None):
        ctx, c, rng = self.ctx, self.dut.ctl, self.rng
        self.ref.check(self.cycle, ctx.get(self.dut.zero))
        # Idle cycles drive random index and codes: only a start may act on them.
        ctx.set(c.index, rng.randrange(self.n_qp) if qp is None else qp)
        ctx.set(c.ack_code, rng.randrange(32) if ack is None else ack)
        ctx.set(c.rnr_code, rng.randrange(32) if rnr is None else rnr)
        ctx.set(c.start_ack, ack is not None)
        ctx.set(c.start_rnr, rnr is not None)
        if qp is not None:
            cyc = cycles_of(ctx.get(c.ack_code), ctx.get(c.rnr_code), ack is not None,
                            rnr is not None, self.scale)
            self.ref.start(self.cycle, qp, cyc)
        await ctx.tick()
        self.cycle += 1

    async def idle(self, n):
        for _ in range(n):
            await self.step()

    async def until_zero(self, qp):
        while not self.zero(qp):
            await self.step()

    async def to_residue(self, r):
        """Idle until the cycle number is r modulo n_qp."""
        await self.idle((r - self.cycle) % self.n_qp)


def run(n_qp, scale, bench, seed=0):
    dut = RetryTimers(n_qp, CLK_HZ, scale)
    rng = random.Random(seed)
    h = {}

    async def tb(ctx):
        h["h"] = Harness(ctx, dut, n_qp, scale, rng)
        await bench(h["h"])
        ref = h["h"].ref                    # run on until every started timer must have risen
        end = max((k + 1 + cyc + ref.late for k, cyc in filter(None, ref.started)), default=0)
        await h["h"].idle(max(0, end + 1 - h["h"].cycle))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    return h["h"].ref


def ack_code_for(cycles, scale=SCALE):
    """The ACK code whose timeout is closest to ``cycles`` (at least 1 cycle)."""
    return min(range(1, 32), key=lambda c: abs(ack_timeout_cycles(c, CLK_HZ, scale) - cycles))


def test_width_rule():
    """The width holds the longest timer plus the sweep's lateness with a sign bit; 40 bits at
    125 MHz could not (ACK code 31 is 2**40 cycles)."""
    assert ack_timeout_cycles(31, 125e6) == 1 << 40
    for clk, scale in ((25e6, 1), (125e6, 1), (CLK_HZ, SCALE), (CLK_HZ, WRAP_SCALE)):
        longest = max(max(ack_timeout_cycles(c, clk, scale), rnr_timer_cycles(c, clk, scale))
                      for c in range(32))
        for n in N_QPS:
            w = timer_bits(n, clk, scale)
            assert longest + n + 1 < 1 << (w - 1)
    assert timer_bits(64, 25e6) == 39 and timer_bits(64, 125e6) == 42


@pytest.mark.parametrize("n_qp", N_QPS)
def test_reset_and_code_zero(n_qp):
    """All expired from reset to the first start; ACK code 0 expires at once (the cycle after
    the start, as a counter loaded with 0), and a running timer restarted with code 0 too."""
    async def bench(h):
        await h.idle(n_qp + 5)
        for qp in range(n_qp):
            await h.step(qp, ack=0)
        assert h.ctx.get(h.dut.zero) == (1 << n_qp) - 1
        await h.step(n_qp - 1, ack=ack_code_for(100))
        await h.idle(3)
        assert not h.zero(n_qp - 1)
        await h.step(n_qp - 1, ack=0)
        assert h.zero(n_qp - 1)
        await h.step(0, ack=ack_code_for(3), rnr=0)        # RNR wins: 16 cycles, not 3
        await h.idle(10)
        assert not h.zero(0)
    run(n_qp, SCALE, bench)


@pytest.mark.parametrize("n_qp", N_QPS)
def test_sticky_across_wrap(n_qp):
    """An expired timer, and one never started, stay expired while ``now`` wraps twice (their
    deadlines then read as in the future), until the next start."""
    async def bench(h):
        await h.step(0, ack=ack_code_for(100, WRAP_SCALE))
        await h.until_zero(0)
        await h.idle(2 << h.dut.width)
        await h.step(0, ack=ack_code_for(50, WRAP_SCALE))
        await h.idle(10)
        assert not h.zero(0)
    run(n_qp, WRAP_SCALE, bench)


@pytest.mark.parametrize("n_qp", N_QPS)
def test_phase_restart_expired(n_qp):
    """Restart an expired QP (its old deadline in the past) at every residue of the sweep,
    including the cycle the sweep reads it: ``zero`` must not rise from the old deadline. Each
    restart runs to expiry, which one residue has compared on the cycle before its deadline."""
    async def bench(h):
        for qp in sorted({0, n_qp - 1}):
            for r in range(n_qp):
                await h.step(qp, ack=ack_code_for(2))          # stale deadline, soon past
                await h.until_zero(qp)
                await h.idle(h.rng.randrange(3))
                await h.to_residue(qp + r)
                await h.step(qp, ack=ack_code_for(6))
                await h.until_zero(qp)
    ref = run(n_qp, SCALE, bench)
    assert 0 in ref.lateness and max(ref.lateness) >= n_qp - 1


@pytest.mark.parametrize("n_qp", N_QPS)
def test_phase_restart_running(n_qp):
    """Restart a running QP one or two cycles before it would expire, at every residue of the
    sweep (RNR over ACK, ACK over RNR): the old deadline is reached at the restart."""
    async def bench(h):
        for qp in sorted({0, n_qp - 1}):
            for r in range(n_qp):
                for before in (1, 2):
                    first = {"rnr": 0} if before == 1 else {"ack": ack_code_for(8)}
                    again = {"ack": ack_code_for(8)} if before == 1 else {"rnr": 0}
                    old = cycles_of(first.get("ack"), first.get("rnr"), "ack" in first,
                                    "rnr" in first, SCALE)
                    await h.to_residue(qp + r - (old - before))
                    await h.step(qp, **first)
                    await h.idle(old - before - 1)
                    await h.step(qp, **again)                  # at qp + r modulo n_qp
                    await h.until_zero(qp)
    ref = run(n_qp, SCALE, bench)
    assert 0 in ref.lateness


@pytest.mark.parametrize("scale", [SCALE, WRAP_SCALE], ids=["short", "wrap"])
@pytest.mark.parametrize("n_qp", N_QPS)
def test_random(n_qp, scale):
    """Random starts over several QPs (ACK, RNR, both; all codes), restarts while running and
    on the cycle ``zero`` rises. With WRAP_SCALE the counter wraps every few hundred cycles and
    ACK code 31 is as long as the width allows."""
    cycles = {1: 4000, 4: 6000, 64: 12000}[n_qp]
    ack_codes = range(0, 22) if scale == SCALE else range(20, 32)

    async def bench(h):
        rng = h.rng
        qps = list(range(n_qp)) if n_qp <= 8 else rng.sample(range(n_qp), 12) + [0, n_qp - 1]
        while h.cycle < cycles:
            risen = [q for q in qps if h.zero(q) and h.ref.started[q] is not None
                     and h.ref.started[q][0] < h.cycle - 1]
            if risen and rng.random() < 0.5:
                qp = rng.choice(risen)
            elif rng.random() < 0.15:
                qp = rng.choice(qps)
            else:
                await h.step()
                continue
            kind = rng.random()
            ack = rng.choice(ack_codes) if kind < 0.7 else None
            rnr = rng.randrange(32) if kind >= 0.5 else None
            await h.step(qp, ack=ack, rnr=rnr)
    ref = run(n_qp, scale, bench, seed=n_qp)
    assert len(ref.lateness) > 100 and 0 in ref.lateness

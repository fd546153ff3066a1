# Ref: hw/rdma/resp_state.py (QpContextStore: receive-buffer credits); hw/iface.py (QpConfig
#      recv_count, RecvRepost); hw/rdma/qp.py (QpTable's load event).
"""QpContextStore's receive-buffer credits against a Python reference model, at 4 and 64 QPs:
random loads, reposts and consumes, the same QP hit by two or three of them in one cycle, and
counts that wrap modulo 2**9 both ways. ``credits`` at ``qi`` is compared every cycle.

The model is the rule the store documents (and the flip-flop counters it replaced kept): a
load sets the QP's count to the row's ``recv_count`` and wins over a repost or consume of the
same QP in that cycle; otherwise the count moves by ``+ repost - consume`` modulo 2**9. An
index outside the table (``n_qp`` 4) counts nothing and reads 0."""

import random

import pytest
from amaranth.sim import Simulator

from hw.iface import QP_INDEX_BITS
from hw.rdma.resp_state import QpContextStore

MOD = 1 << 9


class CreditModel:
    """Reference: one count per QP, modulo 2**9; records which corner cases a run met."""

    def __init__(self, n_qp):
        self.n_qp, self.c = n_qp, [0] * n_qp
        self.seen = {"wrap_up": 0, "wrap_down": 0, "load+repost": 0, "load+consume": 0,
                     "repost+consume": 0, "load+repost+consume": 0}

    def read(self, qi):
        return self.c[qi] if qi < self.n_qp else 0

    def step(self, load, load_qp, recv_count, repost, repost_qp, consume, qi):
        same_lr = load and repost and load_qp == repost_qp < self.n_qp
        same_lc = load and consume and load_qp == qi < self.n_qp
        same_rc = repost and consume and repost_qp == qi < self.n_qp
        self.seen["load+repost"] += same_lr
        self.seen["load+consume"] += same_lc
        self.seen["repost+consume"] += same_rc
        self.seen["load+repost+consume"] += same_lr and same_lc
        delta = [0] * self.n_qp
        if repost and repost_qp < self.n_qp:
            delta[repost_qp] += 1
        if consume and qi < self.n_qp:
            delta[qi] -= 1
        for i in range(self.n_qp):
            if load and load_qp == i:
                self.c[i] = recv_count
                continue
            raw = self.c[i] + delta[i]
            self.seen["wrap_up"] += raw == MOD
            self.seen["wrap_down"] += raw == -1
            self.c[i] = raw % MOD


def stimulus(rng, n_qp, cycles):
    """Per cycle (load, load_qp, recv_count, repost, repost_qp, consume, qi), in phases: a mix,
    floods of reposts and drains of consumes on a few QPs (so counts wrap both ways), and
    bursts of same-QP coincidences."""
    out_of_table = n_qp < 1 << QP_INDEX_BITS
    t = 0
    while t < cycles:
        mode = rng.choice(["mix", "flood", "drain", "collide"])
        focus = rng.sample(range(n_qp), min(2, n_qp))
        p_load = {"mix": 0.1, "flood": 0.002, "drain": 0.002, "collide": 0.4}[mode]
        p_rep = {"mix": 0.5, "flood": 0.95, "drain": 0.1, "collide": 0.7}[mode]
        p_con = {"mix": 0.5, "flood": 0.1, "drain": 0.95, "collide": 0.7}[mode]
        length = rng.randrange(200, 1200) if mode in ("flood", "drain") else rng.randrange(20, 200)

        def pick():
            if out_of_table and rng.random() < 0.03:
                return rng.randrange(n_qp, 1 << QP_INDEX_BITS)
            return rng.choice(focus) if rng.random() < 0.8 else rng.randrange(n_qp)

        for _ in range(min(length, cycles - t)):
            qi = pick()
            if mode == "collide":
                repost_qp = load_qp = qi if rng.random() < 0.7 else pick()
            else:
                repost_qp, load_qp = pick(), rng.randrange(n_qp)
            load_qp = min(load_qp, n_qp - 1)    # QpTable only loads QPs of its table
            yield (rng.random() < p_load, load_qp, rng.randrange(256),
                   rng.random() < p_rep, repost_qp, rng.random() < p_con, qi)
            t += 1


@pytest.mark.parametrize("n_qp, cycles", [(4, 12000), (64, 12000)])
def test_credits_against_model(n_qp, cycles):
    dut = QpContextStore(n_qp)
    model = CreditModel(n_qp)
    rng = random.Random(n_qp)
    checked = [0]

    async def bench(ctx):
        for load, lq, rc, rep, rq, con, qi in stimulus(rng, n_qp, cycles):
            ctx.set(dut.load_valid, load)
            ctx.set(dut.load_qp, lq)
            ctx.set(dut.load_row.recv_count, rc)
            ctx.set(dut.repost.valid, rep)
            ctx.set(dut.repost.p.qp, rq)
            ctx.set(dut.consume, con)
            ctx.set(dut.qi, qi)
            assert ctx.get(dut.repost.ready)
            got, want = ctx.get(dut.credits), model.read(qi)
            assert got == want, f"cycle {checked[0]}: QP {qi} credits {got}, model {want}"
            checked[0] += 1
            model.step(load, lq, rc, rep, rq, con, qi)
            await ctx.tick()
        # Every QP's count once more, after the last events.
        ctx.set(dut.load_valid, 0)
        ctx.set(dut.repost.valid, 0)
        ctx.set(dut.consume, 0)
        for i in range(n_qp):
            ctx.set(dut.qi, i)
            assert ctx.get(dut.credits) == model.read(i), f"end: QP {i}"

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert checked[0] == cycles
    # The run met every corner the test is about.
    assert all(model.seen.values()), model.seen

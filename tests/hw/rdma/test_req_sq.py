# Ref: hw/rdma/req_sq.py (SqScheduler: lowest expired, lowest flush, round robin after the last
#      QP sent, the turn of new work requests).
"""SqScheduler against a Python model of its policy, written as the priority chains it had
before its trees (lowest_set): random status vectors, timers and strobes, every cycle; the
candidates are registered, so each cycle's ports are checked against the previous cycle's
inputs."""

import random

import pytest

from hw.rdma.req_sq import SqScheduler
from sim.hdl import run_sim


def model_pick(n, timing, zero, flush, can_send, rr):
    """(exp_any, exp_qp, flush_any, flush_qp, send_any, send_qp) as the chains chose them."""
    exp = [i for i in range(n) if timing >> i & 1 and zero >> i & 1]
    fl = [i for i in range(n) if flush >> i & 1]
    send = [q for q in ((rr + off) % n for off in range(1, n + 1)) if can_send >> q & 1]
    return (bool(exp), exp[0] if exp else None, bool(fl), fl[0] if fl else None,
            bool(send), send[0] if send else None)


@pytest.mark.parametrize("n", [1, 4, 5, 64])
def test_scheduler_policy(n):
    dut = SqScheduler(n)
    rng = random.Random(n)
    full = (1 << n) - 1

    def sparse():
        """Mostly a few bits, sometimes none or all."""
        r = rng.random()
        if r < 0.1:
            return 0
        if r < 0.15:
            return full
        return sum(1 << rng.randrange(n) for _ in range(rng.randrange(1, 4)))

    async def main(ctx):
        # The candidates are registered: what the ports show in a cycle is the model's pick
        # of the previous cycle's status, timers and round-robin pointer.
        rr, prefer, expect = 0, 0, None
        for _ in range(600):
            c = dut.ctl
            assert ctx.get(c.prefer_wr) == prefer
            if expect is None:
                assert not (ctx.get(c.exp_any) or ctx.get(c.flush_any) or ctx.get(c.send_any))
                sa = False
            else:
                ea, eq, fa, fq, sa, sq = expect
                assert ctx.get(c.exp_any) == ea and ctx.get(c.flush_any) == fa
                assert ctx.get(c.send_any) == sa
                if ea:
                    assert ctx.get(c.exp_qp) == eq
                if fa:
                    assert ctx.get(c.flush_qp) == fq
                if sa:
                    assert ctx.get(c.send_qp) == sq, (expect, rr)
            timing, zero, flush, can_send = sparse(), sparse() | rng.getrandbits(n), sparse(), \
                sparse()
            sent, turn = rng.random() < 0.3, rng.random() < 0.3
            ctx.set(dut.status.timing, timing)
            ctx.set(dut.zero, zero)
            ctx.set(dut.status.flush, flush)
            ctx.set(dut.status.can_send, can_send)
            expect = model_pick(n, timing, zero, flush, can_send, rr)
            sent = sent and sa
            ctx.set(c.sent, sent)
            ctx.set(c.wr_turn, turn)
            await ctx.tick()
            if sent:
                rr, prefer = sq, 1
            if turn:
                prefer = 0

    run_sim(dut, main)

# Ref: hw/kbtp/movers.py MessagePrefetch and WordReader; hw/kbtp/engine.py (the front takes the
#      message with its notify); hw/iface.py RecvNotify.
"""MessagePrefetch against a MemRam holding known words: it takes a notify at once, reads the
first words of that message, and offers notify and message together; it holds them (and takes
no other notify) until they are taken; ``age`` counts the cycles since its take."""

import random

from hw.kbtp.movers import MessagePrefetch
from sim.hdl import on_ram, run_sim

WORDS = 512
N = 7                       # MSG_WORDS


def expected(init, addr):
    """WordReader's ``data`` of N words from byte address ``addr``: the message's octets,
    first octet in the high bits (each memory word holds its octets little-endian)."""
    octets = b"".join(init[addr // 8 + k].to_bytes(8, "little") for k in range(N))
    return int.from_bytes(octets, "big")


def test_prefetch_reads_ahead_and_holds():
    rng = random.Random(5)
    init = [rng.getrandbits(64) for _ in range(WORDS)]
    top = on_ram(MessagePrefetch(N), "mem", WORDS, init)
    pf = top.master
    notes = [{"qp": 3, "addr": 0x400, "length": 56}, {"qp": 61, "addr": 0x800, "length": 200},
             {"qp": 0, "addr": 0x0, "length": 24}]
    got = []

    async def main(ctx):
        ctx.set(pf.o.ready, 0)
        for k, n in enumerate(notes):
            ctx.set(pf.i.payload, n)
            ctx.set(pf.i.valid, 1)
            waited = 0
            while True:
                _, _, taken = await ctx.tick().sample(pf.i.ready)
                if taken:
                    break
                waited += 1
                assert waited < 200, "the notify was never taken"
            ctx.set(pf.i.valid, 0)
            t_take = 0
            # the message and the notify come together, N reads later
            while not ctx.get(pf.o.valid):
                await ctx.tick()
                t_take += 1
                assert t_take < 100, "no message"
            assert t_take >= N, t_take
            o = ctx.get(pf.o.payload)
            assert (o.qp, o.addr, o.length) == (n["qp"], n["addr"], n["length"])
            assert ctx.get(pf.msg) == expected(init, n["addr"]), k
            assert ctx.get(pf.age) == t_take + 1, (ctx.get(pf.age), t_take)
            if k + 1 < len(notes):
                # held: a second notify is not taken while the first waits for the front
                ctx.set(pf.i.payload, notes[k + 1])
                ctx.set(pf.i.valid, 1)
                for _ in range(40):
                    _, _, taken = await ctx.tick().sample(pf.i.ready)
                    assert not taken, "a notify was taken while the message before waited"
                    assert ctx.get(pf.o.valid) and ctx.get(pf.msg) == expected(init, n["addr"])
                ctx.set(pf.i.valid, 0)
            ctx.set(pf.o.ready, 1)
            await ctx.tick()
            ctx.set(pf.o.ready, 0)
            got.append(n["qp"])

    run_sim(top, main)
    assert got == [3, 61, 0]

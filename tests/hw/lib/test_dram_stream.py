# Ref: hw/iface.py (MemBusSignature: split transactions, in-order responses); hw/lib/membus.py
#      (MemArbiter outstanding); hw/lib/dma.py (DmaReader.DEPTH); hw/kbtp/movers.py (InlineCopy
#      burst); boards/dram.py (DramModel, ECPIX5_DDR3); issue 22 ("the figures include what DRAM
#      costs"; make bench on the DRAM configuration).
"""The two movers a 4 KiB block goes through, on the ECPIX-5's DDR3 timing model behind the
target's arbiter, in Amaranth's simulator: a LOAD's DmaReader (memory -> TX stream) and a STORE
inline's InlineCopy (receive buffer -> block).

Oracle: the words the testbench put into the DRAM model's array; every octet out of the reader
and every word of the copied block must be those. The cycle figures are printed (``-s``) and
bounded: the DDR3 answers a read 18 core cycles after it takes it (at 41.67 MHz) and takes a
read every 5/3 core cycles (its command rate, boards/dram.py), so a mover streams at that rate
only with more than 11 reads in flight through every stage. With 8 in flight (what block RAM
needs, and what the target built with until the ECPIX-5 build with 32 routed) the same LOAD
takes over 1.5 times as long, and the bound fails.

The target builds with 32 in flight in the arbiter and 32 words in DmaReader (the ``shipped``
LOAD case meets the bound with them). The arbiter's hold of 16 is the default too. InlineCopy's
bursts of 16 are too: the copy cases check that a word costs a read and a write at the DDR3's
command rate and little more, with the source and the block in one bank and in two, and that
bursts of 64 (a parameter only) open fewer rows.
"""

import inspect

import pytest
from amaranth import Module
from amaranth.lib import wiring
from amaranth.sim import Simulator

from boards.cores import CORE_FREQ
from boards.dram import ECPIX5_DDR3, DramModel
from hw.kbtp.movers import InlineCopy
from hw.lib.dma import DmaReader
from hw.lib.membus import MemArbiter

DEPTH = 1 << 15             # words of DRAM model
CORE_HZ = CORE_FREQ         # the ECPIX-5 core clock
LENGTH = 4096
#: The arbiter's default reads in flight and hold (what the target builds).
ARBITER_DEFAULT = inspect.signature(MemArbiter).parameters["outstanding"].default
HOLD_DEFAULT = inspect.signature(MemArbiter).parameters["hold"].default
BURST_DEFAULT = inspect.signature(InlineCopy).parameters["burst"].default
#: The sizes that cover the DDR3's read latency (reads in flight, DmaReader words, InlineCopy
#: burst, arbiter hold).
DEEP = {"outstanding": 32, "depth": 32, "burst": 64, "hold": 16}


def _word(i):
    return (i * 0x9E3779B97F4A7C15 + 0x1234) & ((1 << 64) - 1)


def _top(mover, outstanding):
    """``mover`` on master 0 of a 5-master arbiter (the target's) onto the DDR3 model."""
    m = Module()
    m.submodules.dram = dram = DramModel(DEPTH, ECPIX5_DDR3.cycles(CORE_HZ))
    m.submodules.arb = arb = MemArbiter(5, outstanding=outstanding)
    m.submodules.mover = mover
    wiring.connect(m, mover.mem, arb.masters[0])
    for i in range(1, 5):
        m.d.comb += arb.masters[i].rsp.ready.eq(1)      # idle masters
    wiring.connect(m, arb.bus, dram.bus)
    return m, dram


def _fill(ctx, dram, lo, n):
    for i in range(lo, lo + n):
        ctx.set(dram.mem.data[i], _word(i))


def _run(m, tb):
    sim = Simulator(m)
    sim.add_clock(1 / CORE_HZ)
    sim.add_testbench(tb)
    sim.run()


def load_cycles(depth, outstanding, addr=0x10003):
    """DmaReader of ``LENGTH`` octets from ``addr`` (unaligned): cycles from the command to the
    last beat, and whether the octets were right."""
    rd = DmaReader(64, depth=depth)
    m, dram = _top(rd, outstanding)
    res = {}

    async def tb(ctx):
        _fill(ctx, dram, addr // 8, LENGTH // 8 + 2)
        await ctx.tick().repeat(4)
        ctx.set(rd.cmd.valid, 1)
        ctx.set(rd.cmd.p.addr, addr)
        ctx.set(rd.cmd.p.length, LENGTH)
        await ctx.tick()
        ctx.set(rd.cmd.valid, 0)
        ctx.set(rd.o.ready, 1)
        out, n = bytearray(), 1
        while True:
            await ctx.delay(1e-12)      # settle: the beat of this cycle
            if ctx.get(rd.o.valid):
                keep = ctx.get(rd.o.p.keep)
                data = ctx.get(rd.o.p.data).to_bytes(8, "little")
                out += bytes(data[k] for k in range(8) if keep >> k & 1)
                if ctx.get(rd.o.p.last):
                    break
            await ctx.tick()
            n += 1
            assert n < 20 * LENGTH, "DmaReader hung"
        image = b"".join(_word(i).to_bytes(8, "little") for i in range(addr // 8, addr // 8 + LENGTH // 8 + 2))
        res["cycles"], res["ok"] = n, bytes(out) == image[addr % 8:addr % 8 + LENGTH]
    _run(m, tb)
    return res["cycles"], res["ok"]


async def _start_copy(ctx, cp, src, dst, length):
    """Start ``cp`` on ``length`` octets (one cycle of ``start``)."""
    ctx.set(cp.src, src)
    ctx.set(cp.dst, dst)
    ctx.set(cp.length, length)
    ctx.set(cp.start, 1)
    await ctx.tick()
    ctx.set(cp.start, 0)


async def _copy(ctx, cp, src, dst, length, limit):
    """Start ``cp`` on ``length`` octets and tick until its ``done``; the cycles from the start
    to ``done``, the copy idle afterwards."""
    await _start_copy(ctx, cp, src, dst, length)
    n = 1
    while not ctx.get(cp.done):
        await ctx.tick()
        n += 1
        assert n < limit, "InlineCopy hung"
    await ctx.tick()
    assert not ctx.get(cp.busy)
    return n


def copy_cycles(burst, outstanding, src=0x8000, dst=0x20000):
    """InlineCopy of ``LENGTH`` octets: cycles from start to done, and whether the block holds
    the source words."""
    cp = InlineCopy(burst=burst)
    m, dram = _top(cp, outstanding)
    res = {}

    async def tb(ctx):
        _fill(ctx, dram, src // 8, LENGTH // 8)
        await ctx.tick().repeat(4)
        res["cycles"] = await _copy(ctx, cp, src, dst, LENGTH, 20 * LENGTH)
        res["ok"] = all(ctx.get(dram.mem.data[dst // 8 + k]) == _word(src // 8 + k)
                        for k in range(LENGTH // 8))
    _run(m, tb)
    return res["cycles"], res["ok"]


T = ECPIX5_DDR3.cycles(CORE_HZ)
WORDS = LENGTH // 8
# One word per read the port takes (the DDR3's command rate: 5/3 core cycles at 41.67 MHz),
# stretched by the refreshes (a stall of `rfc` every `refi` cycles), plus the first read's
# latency, a row opened every 2 KiB and a few cycles of pipeline.
LOAD_BOUND = int(WORDS * T.per_request(0) * (1 + T.rfc / T.refi)) + T.hit + 3 * T.miss + 16


def copy_bound(burst, same_bank):
    """Core cycles InlineCopy of ``LENGTH`` octets may take: a read and a write a word, each at
    the DDR3's command rate; per burst, two rows opened when the source and the block share a
    bank, and what of the wait for the burst's first read its reads' own command time does not
    cover; each refresh's stall and the two rows it closes; the first read's latency."""
    per_burst = (2 * T.miss if same_bank else 0) + max(0, T.hit - burst * T.per_request(0))
    return int(((T.per_request(0) + T.per_request(1)) * WORDS + WORDS // burst * per_burst)
               * (1 + (T.rfc + 2 * T.miss) / T.refi)) + T.hit + 16


#: What the arbiter and the reader were sized for block RAM (and what the ECPIX-5 built with
#: before 32 in flight routed): 8 reads in flight, 8 words buffered.
BRAM_SIZED = {"outstanding": 8, "depth": 8}


@pytest.mark.parametrize("shipped", [True, False], ids=["shipped", "bram-sized"])
def test_load_streams_a_block_from_ddr3(shipped):
    """The shipped sizes stream a block as fast as twice their depth and reads in flight do:
    they cover the DDR3's read latency; the sizes that suffice for block RAM do not, and take
    longer than one word per cycle less refreshes (LOAD_BOUND).

    (At the 41.67 MHz core clock the DDR3 takes a read every 5/3 core cycles, LiteDRAM's
    rate, since 2026-12-07 in the model too: 932 core cycles, 4.39 octets per core cycle,
    1.46 Gb/s, against a LOAD_BOUND of 952; twice the depth and the reads in flight take the
    same. Before, the model took a read every core cycle at any clock: 664 cycles.)"""
    depth, outstanding = (DmaReader.DEPTH, ARBITER_DEFAULT) if shipped else \
        (BRAM_SIZED["depth"], BRAM_SIZED["outstanding"])
    n, ok = load_cycles(depth, outstanding)
    print(f"DmaReader 4 KiB from DDR3: depth {depth}, arbiter {outstanding} in flight: {n} core "
          f"cycles = {n / CORE_HZ * 1e6:.2f} us, {LENGTH / n:.2f} octets/cycle "
          f"({LENGTH * 8 * CORE_HZ / n / 1e9:.2f} Gb/s at {CORE_HZ / 1e6:g} MHz)")
    assert ok
    if shipped:
        deeper, ok2 = load_cycles(2 * depth, 2 * outstanding)
        print(f"  twice as deep ({2 * depth} words, {2 * outstanding} in flight): {deeper}")
        assert ok2 and n <= deeper, (n, deeper)
        # and no worse than 1.2 x one word per cycle less refreshes
        assert n <= 1.2 * LOAD_BOUND, (n, LOAD_BOUND)
    else:
        assert n > LOAD_BOUND, (n, LOAD_BOUND)


@pytest.mark.parametrize("same_bank", [True, False], ids=["one-bank", "two-banks"])
def test_inline_copy_of_a_block_in_ddr3(same_bank):
    """The shipped copy moves a word in a read and a write at the DDR3's command rate, plus its
    share of row openings and refreshes (copy_bound). Where the receive buffer and the block
    share a bank, longer bursts open fewer rows: 64 words beat the shipped 16."""
    src = 0x8000 if same_bank else 0x8000 + 3 * 2048        # bank 0, or bank 3
    n, ok = copy_cycles(BURST_DEFAULT, ARBITER_DEFAULT, src=src)
    bound = copy_bound(BURST_DEFAULT, same_bank)
    print(f"InlineCopy 4 KiB in DDR3 ({'one bank' if same_bank else 'two banks'}): burst "
          f"{BURST_DEFAULT}, arbiter {ARBITER_DEFAULT} in flight: {n} core cycles = "
          f"{n / CORE_HZ * 1e6:.2f} us, {LENGTH / n:.2f} octets/cycle; bound {bound}")
    assert ok
    assert n <= bound, (n, bound)
    if same_bank:
        deep, ok2 = copy_cycles(DEEP["burst"], DEEP["outstanding"], src=src)
        print(f"  burst {DEEP['burst']}: {deep}")
        assert ok2 and deep < n, (deep, n)


@pytest.mark.parametrize("length,src,dst", [(1, 0x8000, 0x20000), (7, 0x8008, 0x20008),
                                            (8, 0x8000, 0x20000), (9, 0x8000, 0x20010),
                                            (255, 0x8000, 0x20000), (513, 0x8800, 0x21000),
                                            (1000, 0x8000, 0x20000)])
def test_inline_copy_lengths(length, src, dst):
    """Any length: every whole word and the last word's first ``length % 8`` octets are the
    source's; the octets past the end and the words around the block keep what they held."""
    cp = InlineCopy()
    m, dram = _top(cp, ARBITER_DEFAULT)
    words = (length + 7) // 8
    old = 0x5A5A5A5A5A5A5A5A
    res = {}

    async def tb(ctx):
        _fill(ctx, dram, src // 8, words)
        for k in range(-1, words + 1):
            ctx.set(dram.mem.data[dst // 8 + k], old)
        await ctx.tick().repeat(4)
        await _copy(ctx, cp, src, dst, length, 200 + 20 * words)
        res["got"] = [ctx.get(dram.mem.data[dst // 8 + k]) for k in range(-1, words + 1)]
    _run(m, tb)
    want = [old] + [_word(src // 8 + k) for k in range(words)] + [old]
    tail = length % 8
    if tail:            # octets tail..7 of the last word (little-endian lanes) are not written
        keep = (1 << 8 * tail) - 1
        want[words] = (want[words] & keep) | (old & ~keep & ((1 << 64) - 1))
    assert res["got"] == want


def contended_copy(hold, src=0x8000, dst=0x20000, fill=0x30000):
    """InlineCopy of ``LENGTH`` octets (master 1) while master 0 writes ``LENGTH`` octets at
    ``fill`` word by word (the responder filling the next receive buffer), both behind one
    arbiter of ``hold``: cycles until both are done, row misses, and whether both landed."""
    m = Module()
    m.submodules.dram = dram = DramModel(DEPTH, T)
    m.submodules.arb = arb = MemArbiter(5, outstanding=DEEP["outstanding"], hold=hold)
    m.submodules.cp = cp = InlineCopy(burst=DEEP["burst"])
    wiring.connect(m, cp.mem, arb.masters[1])
    for i in range(2, 5):
        m.d.comb += arb.masters[i].rsp.ready.eq(1)
    wiring.connect(m, arb.bus, dram.bus)
    wr = arb.masters[0]
    res = {}

    async def tb(ctx):
        _fill(ctx, dram, src // 8, WORDS)
        await ctx.tick().repeat(4)
        await _start_copy(ctx, cp, src, dst, LENGTH)
        n, k, copied = 1, 0, False
        while not (copied and k == WORDS):
            if k < WORDS:
                ctx.set(wr.req.valid, 1)
                ctx.set(wr.req.p.we, 1)
                ctx.set(wr.req.p.wstrb, 0xFF)
                ctx.set(wr.req.p.addr, fill + 8 * k)
                ctx.set(wr.req.p.wdata, _word(k) ^ 0xFFFF)
            else:
                ctx.set(wr.req.valid, 0)
            await ctx.delay(1e-12)
            accepted = ctx.get(wr.req.valid) and ctx.get(wr.req.ready)
            copied |= bool(ctx.get(cp.done))
            await ctx.tick()
            k += accepted
            n += 1
            assert n < 20 * LENGTH, "hung"
        ctx.set(wr.req.valid, 0)
        await ctx.tick()
        res["cycles"], res["miss"] = n, ctx.get(dram.n_miss)
        res["ok"] = all(ctx.get(dram.mem.data[dst // 8 + j]) == _word(src // 8 + j) and
                        ctx.get(dram.mem.data[fill // 8 + j]) == _word(j) ^ 0xFFFF
                        for j in range(WORDS))
    _run(m, tb)
    return res["cycles"], res["miss"], res["ok"]


def test_arbiter_hold_keeps_rows_open():
    """Two masters streaming to different rows of one bank: a hold of 16 (a master keeps the
    bus for up to 16 requests in a row) opens far fewer rows than one request each in turn
    (hold 1, plain round robin), and the pair finishes sooner. 16 is what the target builds."""
    hold = DEEP["hold"]
    assert HOLD_DEFAULT == hold
    n1, miss1, ok1 = contended_copy(1)
    n16, miss16, ok16 = contended_copy(hold)
    print(f"copy 4 KiB beside 4 KiB of writes, DDR3: hold 1: {n1} cycles, {miss1} rows opened; "
          f"hold {hold}: {n16} cycles, {miss16} rows opened")
    assert ok1 and ok16
    assert miss16 * 4 < miss1, (miss16, miss1)
    assert n16 < 0.85 * n1, (n16, n1)

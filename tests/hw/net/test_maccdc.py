# Ref: MAC at 125 MHz, core on its own clock; IEEE 802.3 §3.1.1, §4.2.3.3
#      (frame, FCS, 60-octet minimum); hw/net/maccdc.py; hw/target/target.py (mac=False).
"""MacCdc: GMII at 125 MHz on one side, 64-bit frame streams on a 25 MHz clock on the other.

Oracles: the frames put in, their FCS from ``zlib.crc32`` (not the gateware's
``amaranth.lib.crc``), the number of frames deliberately corrupted, and the wire time of
back-to-back frames (the core clock must keep up with the line).
"""

import random

import pytest
from amaranth import ClockDomain, Module
from amaranth.sim import Simulator

from hw.net.maccdc import MAC_COUNTER_NAMES, MacCdc
from sim.hdl import frame_get, gmii_drive, gmii_wire, packet_get, packet_put, run_until_done

GMII_PERIOD = 8e-9
CORE_PERIOD = 40e-9          # 625 MHz / 25, boards.cores.CORE_FREQ
CNT = {name: k for k, name in enumerate(MAC_COUNTER_NAMES)}


def make(width=64, rx_cut_through=False):
    # The user side is "sync" here so that the stream helpers' ctx.tick() is the core clock.
    dut = MacCdc(width, mac_domain="gmii", core_domain="sync", rx_depth=4096, tx_depth=2048,
                 rx_cut_through=rx_cut_through)
    m = Module()
    m.submodules.dut = dut
    m.domains.sync = ClockDomain()
    m.domains.gmii = ClockDomain()
    sim = Simulator(m)
    sim.add_clock(CORE_PERIOD, domain="sync")
    sim.add_clock(GMII_PERIOD, domain="gmii")
    return dut, sim


@pytest.mark.parametrize("cut", [False, True])
def test_rx_frames_cross_and_bad_ones_are_counted(cut):
    """Store-and-forward the bad frame is dropped; cut-through (the ECPIX-5 core's) it crosses
    with ``err`` on its last beat. Counted the same."""
    rng = random.Random(1)
    dut, sim = make(rx_cut_through=cut)
    pkts = [rng.randbytes(n) for n in (60, 61, 64, 67, 100, 333, 1514)]
    got = []
    bad_frame = []

    async def gmii(ctx):
        for k, p in enumerate(pkts):
            await gmii_drive(ctx, dut, gmii_wire(p), domain="gmii")
            if k == 2:
                bad = bytearray(gmii_wire(p))
                bad[20] ^= 0x10
                bad_frame.append(bytes(bad[8:-4]))
                await gmii_drive(ctx, dut, bad, domain="gmii")

    async def core(ctx):
        for k in range(len(pkts) + cut):
            if cut:
                got.append(await frame_get(ctx, dut.rx, 64, backpressure=0.3, rng=rng))
            else:
                got.append(await packet_get(ctx, dut.rx, 64, backpressure=0.3, rng=rng))
        await ctx.tick().repeat(10)
        assert ctx.get(dut.counters[CNT["rx_frames_ok"]]) == len(pkts)
        assert ctx.get(dut.counters[CNT["rx_fcs_errors"]]) == 1
        assert ctx.get(dut.counters[CNT["rx_overflows"]]) == 0

    run_until_done(sim, [gmii, core], limit=1e-3)
    if cut:
        assert got == [(p, 0) for p in pkts[:3]] + [(bad_frame[0], 1)] + \
            [(p, 0) for p in pkts[3:]]
    else:
        assert got == pkts


def test_tx_frames_cross_with_fcs():
    rng = random.Random(2)
    dut, sim = make()
    pkts = [rng.randbytes(n) for n in (1, 59, 60, 64, 65, 200, 1514)]
    wire = []

    async def core(ctx):
        for p in pkts:
            await packet_put(ctx, dut.tx, p, 64, idle=0.2, rng=rng)

    async def gmii(ctx):
        for _ in pkts:
            octets = []
            while not ctx.get(dut.tx_en):
                await ctx.tick("gmii")
            while ctx.get(dut.tx_en):
                assert not ctx.get(dut.tx_er)
                octets.append(ctx.get(dut.txd))
                await ctx.tick("gmii")
            wire.append(bytes(octets))

    async def count(ctx):
        while len(wire) < len(pkts):
            await ctx.tick()
        await ctx.tick().repeat(10)
        assert ctx.get(dut.counters[CNT["tx_frames"]]) == len(pkts)
        assert ctx.get(dut.counters[CNT["tx_underruns"]]) == 0

    run_until_done(sim, [core, gmii, count], limit=2e-3)
    assert wire == [gmii_wire(p) for p in pkts]


def test_core_clock_keeps_up_with_line_rate():
    """Back-to-back frames at the minimum gap, read as fast as the core clock allows: the
    MAC's buffer never overflows and the last frame leaves the core side soon after its end on
    the wire (the 25 MHz x 64-bit side is faster than 1 Gb/s)."""
    rng = random.Random(3)
    dut, sim = make()
    pkts = [rng.randbytes(n) for n in (1514, 60, 61, 1000, 64, 1514)]
    got = []

    async def gmii(ctx):
        for p in pkts:
            await gmii_drive(ctx, dut, gmii_wire(p), ifg=12, domain="gmii")

    async def core(ctx):
        for _ in pkts:
            got.append(await packet_get(ctx, dut.rx, 64))
        assert ctx.get(dut.counters[CNT["rx_overflows"]]) == 0

    octets = sum(len(gmii_wire(p)) + 12 for p in pkts)
    # Wire time, plus the MAC's store-and-forward of the last frame (it is checked against its
    # FCS before the first octet leaves: one frame time at 8 bits per GMII cycle), plus a few
    # core cycles of crossing latency. A core side slower than the line would fall behind by
    # a growing amount over the back-to-back frames and miss this bound.
    run_until_done(sim, [gmii, core],
                   limit=(octets + len(pkts[-1]) + 16) * GMII_PERIOD + 40 * CORE_PERIOD)
    assert got == pkts

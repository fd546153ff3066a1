# Ref: IEEE 802.3 §3.1.1, §4.2.3.3, §4.4.2; hw/lib/stream.py; hw/lib/width.py; hw/lib/fifo.py;
#      hw/net/mac.py.
"""Amaranth-simulator unit tests: width converters, packet FIFO, GMII transmitter/receiver.

Oracles: the bytes put in (converters, FIFO), a Python model of the Ethernet frame on the wire
whose FCS comes from ``zlib.crc32`` (a different CRC implementation from the gateware's
``amaranth.lib.crc``), and the counts of frames deliberately corrupted.
"""

import random
import zlib

import pytest
from amaranth import Elaboratable, Fragment, Module
from amaranth.lib import data

from hw.net.mac import GmiiRx, GmiiTx, GmiiMac
from hw.lib.fifo import PacketFifo
from hw.lib.width import StreamDownsizer, StreamUpsizer
from sim.hdl import (beats_to_packet, frame_get, gmii_drive, gmii_wire, packet_get, packet_put,
                     packet_to_beats, run_bounded, stream_get, stream_put)

CLK = 8e-9


def run(dut, *benches, background=(), max_cycles=50_000):
    run_bounded(dut, *benches, background=background, clk=CLK, max_cycles=max_cycles)


def random_packets(rng, count, lo, hi):
    return [rng.randbytes(rng.randint(lo, hi)) for _ in range(count)]


# ---------------------------------------------------------------------------------------------
# Width converters
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind,iw,ow", [
    ("up", 8, 64), ("up", 8, 32), ("up", 16, 64), ("up", 8, 8),
    ("down", 64, 8), ("down", 32, 8), ("down", 64, 16), ("down", 8, 8),
])
@pytest.mark.parametrize("idle,bp", [(0.0, 0.0), (0.4, 0.0), (0.0, 0.4), (0.5, 0.5)])
def test_sizer_random(kind, iw, ow, idle, bp):
    rng = random.Random(hash((kind, iw, ow, idle, bp)) & 0xFFFF)
    dut = StreamUpsizer(iw, ow) if kind == "up" else StreamDownsizer(iw, ow)
    # Lengths around the beat boundaries of both widths, plus random ones.
    pkts = [rng.randbytes(n) for n in (1, 2, 7, 8, 9, 15, 16, 17)]
    pkts += random_packets(rng, 12, 1, 70)
    got = []

    async def producer(ctx):
        for p in pkts:
            await packet_put(ctx, dut.i, p, iw, idle=idle, rng=rng)

    async def consumer(ctx):
        for _ in pkts:
            got.append(await packet_get(ctx, dut.o, ow, backpressure=bp, rng=rng))

    run(dut, producer, consumer)
    assert got == pkts


@pytest.mark.parametrize("kind,iw,ow", [("up", 8, 64), ("down", 64, 8), ("up", 8, 32),
                                         ("down", 32, 8)])
def test_sizer_full_throughput(kind, iw, ow):
    """With no idles and no back-pressure, the narrow side moves one beat every cycle."""
    rng = random.Random(7)
    dut = StreamUpsizer(iw, ow) if kind == "up" else StreamDownsizer(iw, ow)
    pkts = random_packets(rng, 10, 1, 100)
    narrow = min(iw, ow)
    narrow_beats = sum(-(-len(p) // (narrow // 8)) for p in pkts)
    narrow_port = dut.i if kind == "up" else dut.o
    stats = {"cycles": 0, "beats": 0, "first": None, "last": None}

    async def producer(ctx):
        beats = [b for p in pkts for b in packet_to_beats(p, iw)]
        await stream_put(ctx, dut.i, beats)

    async def consumer(ctx):
        for _ in pkts:
            await packet_get(ctx, dut.o, ow)

    async def monitor(ctx):
        # Sampled just before each edge: the transfer that edge performs.
        async for _, _, valid, ready in ctx.tick().sample(narrow_port.valid, narrow_port.ready):
            stats["cycles"] += 1
            if valid and ready:
                stats["beats"] += 1
                stats["first"] = stats["first"] or stats["cycles"]
                stats["last"] = stats["cycles"]

    run(dut, producer, consumer, background=[monitor])
    assert stats["beats"] == narrow_beats
    # Every cycle between the first and last narrow transfer carries one.
    assert stats["last"] - stats["first"] + 1 == narrow_beats


# ---------------------------------------------------------------------------------------------
# Packet FIFO
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("registered_ready", [False, True])
@pytest.mark.parametrize("bp", [0.0, 0.5])
def test_packet_fifo_commit_discard(bp, registered_ready):
    rng = random.Random(11 + int(bp * 10))
    dut = PacketFifo(8, 64, registered_ready=registered_ready)
    pkts = random_packets(rng, 40, 1, 40)
    keep = [rng.random() < 0.6 for _ in pkts]
    got = []

    async def writer(ctx):
        for p, k in zip(pkts, keep):
            beats = packet_to_beats(p, 8)
            for i, b in enumerate(beats):
                while rng.random() < 0.2:
                    ctx.set(dut.w.valid, 0)
                    await ctx.tick()
                ctx.set(dut.w.payload, b)
                ctx.set(dut.w.valid, 1)
                final = i == len(beats) - 1
                ctx.set(dut.w_commit, final and k)
                ctx.set(dut.w_discard, final and not k)
                await ctx.tick().until(dut.w.ready)
                ctx.set(dut.w_commit, 0)
                ctx.set(dut.w_discard, 0)
            ctx.set(dut.w.valid, 0)

    async def reader(ctx):
        for _ in range(sum(keep)):
            got.append(await packet_get(ctx, dut.r, 8, backpressure=bp, rng=rng))

    run(dut, writer, reader)
    assert got == [p for p, k in zip(pkts, keep) if k]


@pytest.mark.parametrize("registered_ready", [False, True])
@pytest.mark.parametrize("depth", [16, 12])
def test_packet_fifo_hides_uncommitted_and_fills(registered_ready, depth):
    """Nothing uncommitted is visible; ready falls exactly at depth (a power of two or not);
    ``level`` counts every beat held; discard frees the space (with ``registered_ready`` one
    cycle later)."""
    dut = PacketFifo(8, depth, registered_ready=registered_ready)

    async def bench(ctx):
        ctx.set(dut.r.ready, 0)
        ctx.set(dut.w.valid, 1)
        written = 0
        for i in range(20):
            ctx.set(dut.w.payload, {"data": i, "keep": 1, "last": 0})
            ready = ctx.get(dut.w.ready)
            await ctx.tick()
            written += ready
            assert not ctx.get(dut.r.valid)
            assert ctx.get(dut.level) == written
        assert written == depth and not ctx.get(dut.w.ready)
        ctx.set(dut.w.valid, 0)
        ctx.set(dut.w_discard, 1)
        await ctx.tick()
        ctx.set(dut.w_discard, 0)
        assert ctx.get(dut.level) == 0
        if registered_ready:
            assert not ctx.get(dut.w.ready)         # the flop still holds "full"
            await ctx.tick()
        assert ctx.get(dut.w.ready)
        await packet_put(ctx, dut.w, b"\xaa\xbb", 8)
        await ctx.tick().repeat(3)
        assert not ctx.get(dut.r.valid)            # written, not committed
        ctx.set(dut.w_commit, 1)
        await ctx.tick()
        ctx.set(dut.w_commit, 0)
        assert ctx.get(dut.level) == 2
        assert await packet_get(ctx, dut.r, 8) == b"\xaa\xbb"
        assert ctx.get(dut.level) == 0

    run(dut, bench)


@pytest.mark.parametrize("depth", [16, 12])
@pytest.mark.parametrize("bp", [0.0, 0.5])
def test_packet_fifo_side_data_and_oversize(depth, bp):
    """With ``side`` and ``drop_oversize`` (the ICRC check's buffer): a packet commits or
    discards on its last beat, its side data comes out with every beat of it, and a packet
    longer than ``depth`` is taken in full, dropped and counted, while the shorter ones around
    it pass (a full memory holding committed packets stalls the writer instead)."""
    rng = random.Random(depth + int(bp * 10))
    side = data.StructLayout({"n": 8, "tag": 5})
    dut = PacketFifo(8, depth, side=side, max_packets=4, drop_oversize=True)
    pkts = [rng.randbytes(rng.choice([1, 2, depth - 1, depth, depth + 1, 2 * depth + 3,
                                      rng.randint(1, depth)])) for _ in range(40)]
    good = [rng.random() < 0.7 for _ in pkts]
    expect = [(n, p) for n, (p, g) in enumerate(zip(pkts, good)) if g and len(p) <= depth]
    got = []

    async def writer(ctx):
        for n, (p, g) in enumerate(zip(pkts, good)):
            for b in packet_to_beats(p, 8):
                ctx.set(dut.w.payload, {**b, "side": {"n": n, "tag": n % 32}})
                ctx.set(dut.w.valid, 1)
                while True:
                    # commit/discard go with the handshake of the last beat
                    taken = ctx.get(dut.w.ready)
                    ctx.set(dut.w_commit, taken and b["last"] and g)
                    ctx.set(dut.w_discard, taken and b["last"] and not g)
                    await ctx.tick()
                    if taken:
                        break
        ctx.set(dut.w.valid, 0)
        ctx.set(dut.w_commit, 0)
        ctx.set(dut.w_discard, 0)

    async def reader(ctx):
        for _ in expect:
            beats, sides = [], set()
            while True:
                p = await stream_get(ctx, dut.r, backpressure=bp, rng=rng)
                beats.append({"data": p.data, "keep": p.keep, "last": p.last})
                sides.add((p.side.n, p.side.tag))
                if p.last:
                    break
            (n, tag), = sides
            assert tag == n % 32
            got.append((n, beats_to_packet(beats, 8)))
        await ctx.tick().repeat(20)
        assert not ctx.get(dut.r.valid)
        assert ctx.get(dut.cnt_overflow) == sum(len(p) > depth for p in pkts)

    run(dut, writer, reader)
    assert got == expect


# ---------------------------------------------------------------------------------------------
# GMII transmitter
# ---------------------------------------------------------------------------------------------

def test_gmii_tx_wire_format():
    """Octets on the wire match the model; IFG >= 12; tx_er never set; counters."""
    rng = random.Random(3)
    dut = GmiiTx()
    pkts = [rng.randbytes(n) for n in (1, 14, 59, 60, 61, 100)]
    frames, gaps, cur, gap = [], [], bytearray(), None

    async def producer(ctx):
        for p in pkts:
            await packet_put(ctx, dut.i, p, 8)

    async def monitor(ctx):
        nonlocal cur, gap
        async for _ in ctx.tick():
            assert not ctx.get(dut.tx_er)
            if ctx.get(dut.tx_en):
                if gap is not None and not cur:
                    gaps.append(gap)
                cur.append(ctx.get(dut.txd))
                gap = None
            else:
                if cur:
                    frames.append(bytes(cur))
                    cur = bytearray()
                    gap = 0
                if gap is not None:
                    gap += 1

    async def waiter(ctx):
        while len(frames) < len(pkts):
            await ctx.tick()
        assert ctx.get(dut.frames) == len(pkts)
        assert ctx.get(dut.underruns) == 0

    run(dut, producer, waiter, background=[monitor])
    assert frames == [gmii_wire(p) for p in pkts]
    assert min(gaps) == 12   # back to back frames: exactly the minimum gap


def test_gmii_tx_underrun_sets_tx_er():
    dut = GmiiTx()
    seen = {"er": 0}

    async def producer(ctx):
        beats = packet_to_beats(bytes(range(80)), 8)
        await stream_put(ctx, dut.i, beats[:30])
        await ctx.tick().repeat(5)              # input dry mid-frame
        await stream_put(ctx, dut.i, beats[30:])
        await ctx.tick().repeat(30)
        assert ctx.get(dut.underruns) == 1 and ctx.get(dut.frames) == 1

    async def monitor(ctx):
        async for _ in ctx.tick():
            seen["er"] += ctx.get(dut.tx_er)

    run(dut, producer, background=[monitor])
    assert seen["er"] >= 5


# ---------------------------------------------------------------------------------------------
# GMII receiver
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("width", [8, 64])
def test_gmii_rx_good_and_bad_frames(width):
    rng = random.Random(5)
    dut = GmiiRx(depth=256, width=width)
    good = [rng.randbytes(n) for n in (60, 61, 64, 100)]
    got = []

    def bad_fcs(p):
        f = bytearray(gmii_wire(p))
        f[8 + rng.randrange(len(f) - 8)] ^= 1 << rng.randrange(8)   # after preamble/SFD
        return bytes(f)

    def runt(n):
        # A well-formed frame (good FCS) that is too short: n data octets + FCS < 64.
        body = rng.randbytes(n)
        return bytes([0x55] * 7 + [0xD5]) + body + zlib.crc32(body).to_bytes(4, "little")

    async def bench(ctx):
        await gmii_drive(ctx, dut, gmii_wire(good[0]))
        await gmii_drive(ctx, dut, bad_fcs(good[1]))                  # fcs error
        await gmii_drive(ctx, dut, gmii_wire(good[1]))
        await gmii_drive(ctx, dut, runt(59))                          # runt (63 octets)
        await gmii_drive(ctx, dut, runt(3))                           # runt (7 octets)
        await gmii_drive(ctx, dut, gmii_wire(good[2]), er_at=30)     # rx_er
        await gmii_drive(ctx, dut, gmii_wire(good[2])[6:])           # short preamble: ok
        await gmii_drive(ctx, dut, bytes([0x55] * 3 + [0x12] + [0] * 70))   # no SFD: ignored
        await gmii_drive(ctx, dut, gmii_wire(good[3]), ifg=1)        # minimal gap still ok
        await gmii_drive(ctx, dut, gmii_wire(good[3])[7:])           # SFD only: ok
        await ctx.tick().repeat(5)
        assert ctx.get(dut.frames_ok) == 5
        assert ctx.get(dut.fcs_errors) == 1
        assert ctx.get(dut.runts) == 2
        assert ctx.get(dut.rx_errors) == 1
        assert ctx.get(dut.overflows) == 0

    async def consumer(ctx):
        for _ in range(5):
            got.append(await packet_get(ctx, dut.o, width))

    run(dut, bench, consumer)
    assert got == [good[0], good[1], good[2], good[3], good[3]]


@pytest.mark.parametrize("width", [8, 64])
def test_gmii_rx_overflow_drops_whole_frames(width):
    """A stalled reader: frames that do not fit are dropped and counted, the rest kept intact."""
    rng = random.Random(9)
    dut = GmiiRx(depth=256, width=width)
    pkts = [rng.randbytes(100) for _ in range(4)]
    got = []

    async def bench(ctx):
        for p in pkts:
            await gmii_drive(ctx, dut, gmii_wire(p))
        await gmii_drive(ctx, dut, gmii_wire(rng.randbytes(300)))   # longer than the buffer
        # 256 octets hold two 100-octet frames; the 3rd and 4th did not fit.
        assert ctx.get(dut.frames_ok) == 2 and ctx.get(dut.overflows) == 3
        for _ in range(2):
            got.append(await packet_get(ctx, dut.o, width))
        await gmii_drive(ctx, dut, gmii_wire(pkts[3]))
        got.append(await packet_get(ctx, dut.o, width))
        assert ctx.get(dut.frames_ok) == 3

    run(dut, bench)
    assert got == [pkts[0], pkts[1], pkts[3]]


@pytest.mark.parametrize("width", [8, 64])
def test_gmii_rx_drains_a_word_a_cycle(width):
    """Store-and-forward costs the verdict, not a frame's length: once a good frame's FCS is
    in, it leaves the buffer at ``width / 8`` octets a cycle (issue 21: the MAC receive
    buffer's share of the request-to-answer latency). Frames of every length modulo 8 go
    through intact; the cycles from the frame's end on the wire (rx_dv low) to its last beat
    on ``o`` are printed and must be the word count plus a fixed pipeline, the same at every
    length."""
    rng = random.Random(21)
    dut = GmiiRx(depth=512, width=width)
    lanes = width // 8
    lens = [60, 61, 62, 63, 64, 65, 66, 67, 98, 100]
    pkts = [rng.randbytes(n) for n in lens]
    got, lag = [], []

    async def bench(ctx):
        for p in pkts:
            await gmii_drive(ctx, dut, gmii_wire(p), ifg=1)
            end = 0
            beats = []
            ctx.set(dut.o.ready, 1)
            while True:
                await ctx.tick()
                end += 1
                if ctx.get(dut.o.valid):
                    pl = ctx.get(dut.o.payload)
                    beats.append({"data": pl.data, "keep": pl.keep, "last": pl.last})
                    if pl.last:
                        break
            ctx.set(dut.o.ready, 0)
            got.append(beats_to_packet(beats, width))
            lag.append(end - len(beats))

    run(dut, bench)
    assert got == pkts
    words = [-(-n // lanes) for n in lens]
    print(f"\nwidth {width}: frame octets {lens}; words {words}; cycles from rx_dv low to "
          f"the last beat, less the words: {lag}")
    # The same fixed pipeline (input register, delay line, write stage, verdict, FIFO read
    # latency) whatever the length: the drain itself is one word a cycle.
    assert len(set(lag)) == 1 and lag[0] <= 6, lag


# ---------------------------------------------------------------------------------------------
# GMII receiver, cut-through (issue 21: the receive commit point is downstream)
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("width", [8, 64])
def test_gmii_rx_cut_through_marks_bad_frames_at_their_last_beat(width):
    """Every frame of five octets or more is passed on; the bad ones (bad FCS, runt, rx_er)
    carry ``err`` on their last beat, the good ones do not, and the counters are those of the
    store-and-forward receiver for the same frames."""
    rng = random.Random(5)
    dut = GmiiRx(depth=256, width=width, cut_through=True)
    good = [rng.randbytes(n) for n in (60, 61, 64, 100)]
    flip = {}

    def bad_fcs(p):
        f = bytearray(gmii_wire(p))
        k = 8 + rng.randrange(len(f) - 8 - 4)                  # a data octet, not the FCS
        f[k] ^= 1 << rng.randrange(8)
        flip["frame"] = bytes(f[8:-4])
        return bytes(f)

    def runt(n):
        body = rng.randbytes(n)
        flip.setdefault("runts", []).append(body)
        return bytes([0x55] * 7 + [0xD5]) + body + zlib.crc32(body).to_bytes(4, "little")

    async def bench(ctx):
        await gmii_drive(ctx, dut, gmii_wire(good[0]))
        await gmii_drive(ctx, dut, bad_fcs(good[1]))
        await gmii_drive(ctx, dut, gmii_wire(good[1]))
        await gmii_drive(ctx, dut, runt(59))
        await gmii_drive(ctx, dut, runt(3))
        await gmii_drive(ctx, dut, gmii_wire(good[2]), er_at=30)
        await gmii_drive(ctx, dut, gmii_wire(good[3]), ifg=1)
        await ctx.tick().repeat(5)
        assert ctx.get(dut.frames_ok) == 3
        assert ctx.get(dut.fcs_errors) == 1
        assert ctx.get(dut.runts) == 2
        assert ctx.get(dut.rx_errors) == 1
        assert ctx.get(dut.overflows) == 0

    got = []

    async def consumer(ctx):
        for _ in range(7):
            data, err = await frame_get(ctx, dut.o, width)
            got.append((data, err))

    run(dut, bench, consumer)
    assert got == [(good[0], 0), (flip["frame"], 1), (good[1], 0), (flip["runts"][0], 1),
                   (flip["runts"][1], 1), (good[2], 1), (good[3], 0)]


@pytest.mark.parametrize("width", [8, 64])
def test_gmii_rx_cut_through_passes_octets_before_the_end(width):
    """Cut-through, a frame's first beat leaves while its octets still arrive, and its last
    beat (with the verdict) a fixed few cycles after rx_dv falls, whatever its length; store-
    and-forward, the last beat comes a frame's words later. Printed per length."""
    rng = random.Random(22)
    lanes = width // 8
    lens = [60, 61, 67, 100, 300]
    lags = {}
    for cut in (True, False):
        dut = GmiiRx(depth=1024, width=width, cut_through=cut)
        st = {"first": [], "last": [], "end": [], "cycle": 0, "dv": 0, "got": []}

        async def clock(ctx, st=st, dut=dut):
            beats = []
            ctx.set(dut.o.ready, 1)
            async for _, _, valid, p, dv in ctx.tick().sample(dut.o.valid, dut.o.payload,
                                                             dut.rx_dv):
                st["cycle"] += 1
                if st["dv"] and not dv:
                    st["end"].append(st["cycle"])
                st["dv"] = dv
                if valid:
                    if not beats:
                        st["first"].append(st["cycle"])
                    beats.append({"data": p.data, "keep": p.keep, "last": p.last})
                    if p.last:
                        st["last"].append(st["cycle"])
                        st["got"].append((beats_to_packet(beats, width),
                                          p.err if cut else 0))
                        beats = []

        pkts = [rng.randbytes(n) for n in lens]

        async def bench(ctx, pkts=pkts, dut=dut, st=st):
            for p in pkts:
                await gmii_drive(ctx, dut, gmii_wire(p), ifg=12)
                await ctx.tick().repeat(-(-len(p) // lanes) + 10)
            assert st["got"] == [(p, 0) for p in pkts]

        run(dut, bench, background=[clock])
        lags[cut] = [lt - e for lt, e in zip(st["last"], st["end"])]
        if cut:
            # The first beat left before the frame's last octet arrived.
            assert all(f < e for f, e in zip(st["first"], st["end"])), (st["first"], st["end"])
    print(f"\nwidth {width}: frame octets {lens}; cycles from rx_dv low to the last beat: "
          f"cut-through {lags[True]}, store-and-forward {lags[False]}")
    assert len(set(lags[True])) == 1 and lags[True][0] <= 4, lags
    words = [-(-n // lanes) for n in lens]
    assert [s - c for s, c in zip(lags[False], lags[True])] == [w - 1 for w in words] or \
        all(s >= c + w - 1 for s, c, w in zip(lags[False], lags[True], words)), lags


@pytest.mark.parametrize("width", [8, 64])
def test_gmii_rx_cut_through_overflow_cuts_and_closes(width):
    """A stalled reader: a frame that finds the buffer full is cut, and the reader gets its
    last beat with ``err`` once there is room; a frame that starts before then is dropped whole;
    both are counted as overflows; the frames before and after arrive intact."""
    rng = random.Random(9)
    dut = GmiiRx(depth=256, width=width, cut_through=True)
    pkts = [rng.randbytes(100) for _ in range(5)]
    got = []

    async def bench(ctx):
        ctx.set(dut.o.ready, 0)
        for p in pkts[:4]:
            await gmii_drive(ctx, dut, gmii_wire(p))
        # 256 octets: two frames, then the third is cut; the fourth starts while the cut
        # frame's close is still owed (the buffer is full).
        assert ctx.get(dut.frames_ok) == 2 and ctx.get(dut.overflows) == 2
        for _ in range(3):
            data, err = await frame_get(ctx, dut.o, width)
            got.append((data, err))
        await gmii_drive(ctx, dut, gmii_wire(pkts[4]))
        data, err = await frame_get(ctx, dut.o, width)
        got.append((data, err))
        assert ctx.get(dut.frames_ok) == 3

    run(dut, bench)
    assert got[:2] == [(pkts[0], 0), (pkts[1], 0)]
    cut_data, cut_err = got[2]
    assert cut_err == 1 and pkts[2].startswith(cut_data[:-1]) and len(cut_data) < 100
    assert got[3] == (pkts[4], 0)


# ---------------------------------------------------------------------------------------------
# TX -> RX loop, and the whole MAC at several widths
# ---------------------------------------------------------------------------------------------

class _Loop(Elaboratable):
    def __init__(self, width, tx_start=None, depth=512):
        self.mac = GmiiMac(width, rx_depth=depth, tx_depth=depth, tx_start=tx_start)

    def elaborate(self, platform):
        m = Module()
        m.submodules.mac = mac = self.mac
        m.d.comb += [mac.rxd.eq(mac.txd), mac.rx_dv.eq(mac.tx_en), mac.rx_er.eq(mac.tx_er)]
        return m


def test_gmii_tx_rx_loop():
    rng = random.Random(13)
    tx, rx = GmiiTx(), GmiiRx(depth=512)
    m = Module()
    m.submodules.tx, m.submodules.rx = tx, rx
    m.d.comb += [rx.rxd.eq(tx.txd), rx.rx_dv.eq(tx.tx_en), rx.rx_er.eq(tx.tx_er)]
    pkts = random_packets(rng, 8, 1, 120)
    got = []

    async def producer(ctx):
        for p in pkts:
            await packet_put(ctx, tx.i, p, 8)

    async def consumer(ctx):
        for _ in pkts:
            got.append(await packet_get(ctx, rx.o, 8))
        assert ctx.get(rx.frames_ok) == len(pkts)

    run(m, producer, consumer)
    assert got == [p + bytes(max(0, 60 - len(p))) for p in pkts]


@pytest.mark.parametrize("width", [8, 16, 64])
def test_gmii_mac_loop(width):
    rng = random.Random(width)
    top = _Loop(width)
    mac = top.mac
    pkts = random_packets(rng, 6, 1, 130)
    got = []

    async def producer(ctx):
        for p in pkts:
            await packet_put(ctx, mac.tx, p, width, idle=0.3, rng=rng)

    async def consumer(ctx):
        for _ in pkts:
            got.append(await packet_get(ctx, mac.rx, width, backpressure=0.3, rng=rng))
        assert ctx.get(mac.rx_frames_ok) == len(pkts)
        assert ctx.get(mac.tx_underruns) == 0

    run(top, producer, consumer)
    assert got == [p + bytes(max(0, 60 - len(p))) for p in pkts]


def _cut_through_run(width, tx_start, frames, *, stall_at=None, stall=0):
    """Loop a :class:`GmiiMac` with ``tx_start`` on itself and send ``frames`` (bytes), each
    once the wire is idle, one beat a cycle, except a pause of ``stall`` cycles before beat
    ``stall_at`` of the first frame. Returns, per frame, the cycle its octet ``tx_start``
    (1-based) and its last beat went in, the cycle its preamble started on the wire, the frames
    received, the counters, and the cycles ``tx_er`` was high."""
    top = _Loop(width, tx_start=tx_start, depth=2048)
    mac = top.mac
    lanes = width // 8
    st = {"cycle": 0, "starts": [], "er": 0, "was_en": 0, "put": [], "got": []}

    async def clock(ctx):
        async for _ in ctx.tick():
            st["cycle"] += 1
            en = ctx.get(mac.tx_en)
            if en and not st["was_en"]:
                st["starts"].append(st["cycle"])
            st["was_en"] = en
            st["er"] += ctx.get(mac.tx_er)

    async def producer(ctx):
        for k, f in enumerate(frames):
            # each frame on an idle wire: the one before has gone, gap included
            while len(st["starts"]) < k or ctx.get(mac.tx_en):
                await ctx.tick()
            await ctx.tick().repeat(16)
            beats = packet_to_beats(f, width)
            mark = at_last = None
            for j, b in enumerate(beats):
                if k == 0 and j == stall_at:
                    await ctx.tick().repeat(stall)
                await stream_put(ctx, mac.tx, [b])
                if mark is None and (j + 1) * lanes >= min(tx_start or len(f), len(f)):
                    mark = st["cycle"]
                at_last = st["cycle"]
            st["put"].append((mark, at_last))

    async def consumer(ctx):
        ctx.set(mac.rx.ready, 1)
        beats = []
        async for _, _, valid, p in ctx.tick().sample(mac.rx.valid, mac.rx.payload):
            if valid:
                beats.append({"data": p.data, "keep": p.keep, "last": p.last})
                if p.last:
                    st["got"].append(beats_to_packet(beats, width))
                    beats = []

    async def waiter(ctx):
        while len(st["starts"]) < len(frames) or ctx.get(mac.tx_en):
            await ctx.tick()
        await ctx.tick().repeat(20)
        ok = ctx.get(mac.rx_frames_ok)
        while len(st["got"]) < ok:
            await ctx.tick()
        st["counters"] = {n: ctx.get(getattr(mac, n)) for n in
                          ("tx_frames", "tx_underruns", "rx_frames_ok", "rx_errors")}

    run(top, producer, waiter, background=[clock, consumer])
    return st


@pytest.mark.parametrize("width", [8, 64])
def test_gmii_mac_cut_through_starts_before_the_frame_is_in(width):
    """Cut-through transmit (issue 21): a frame starts on the wire once ``tx_start`` of its
    octets are in the MAC's buffer, before its last beat arrives; a frame shorter than that
    starts once it is all in. Store-and-forward (``tx_start=None``) waits for the last beat.
    The frames arrive whole and in order (a GmiiRx behind the wire, its FCS check against
    the transmitter's), and nothing underruns: at width 8 the source gives one octet a
    cycle, the wire's own rate."""
    rng = random.Random(21 + width)
    frames = [rng.randbytes(n) for n in (600, 40, 1500, 100)]
    for tx_start in (64, None):
        st = _cut_through_run(width, tx_start, frames)
        print(f"width {width} tx_start {tx_start}: (octet tx_start in, last in) {st['put']}, "
              f"preambles at {st['starts']}, counters {st['counters']}")
        assert st["got"] == [f + bytes(max(0, 60 - len(f))) for f in frames]
        assert st["counters"]["tx_underruns"] == 0 and st["er"] == 0
        assert st["counters"]["rx_frames_ok"] == len(frames)
        for k, ((mark, last), start, f) in enumerate(zip(st['put'], st['starts'], frames)):
            assert start > mark
            lanes = width // 8
            if tx_start is not None and len(f) // lanes > tx_start // lanes + 9:
                assert start < last, (f"a {len(f)}-octet frame started at {start}, after its "
                                      f"last beat ({last})")
                # the FIFO's registered count, the registered start, the up to 3 beats of
                # the frame ahead of that count, the transmitter's Idle
                assert start - mark <= 6 + 3, (start, mark)
            else:
                assert start > last


@pytest.mark.parametrize("width", [8, 64])
def test_gmii_mac_cut_through_underrun_is_dropped_and_counted(width):
    """A source that falls further behind than the start threshold and the preamble allow
    underruns the cut-through transmitter: the rest of the frame goes with ``tx_er``, a
    receiver drops it (``rx_errors``), ``tx_underruns`` counts it, and the next frame is sent
    whole. A pause the slack covers does no harm."""
    rng = random.Random(7 + width)
    frames = [rng.randbytes(300), rng.randbytes(80)]
    lanes = width // 8
    st = _cut_through_run(width, 32, frames, stall_at=64 // lanes, stall=400)
    assert st["counters"]["tx_underruns"] == 1 and st["er"] > 0
    assert st["counters"]["rx_errors"] == 1 and st["counters"]["rx_frames_ok"] == 1
    assert st["got"] == [frames[1]]
    # 8 cycles of pause, with 32 octets and the preamble ahead: no harm
    st = _cut_through_run(width, 32, frames, stall_at=48 // lanes, stall=8)
    assert st["counters"]["tx_underruns"] == 0 and st["er"] == 0
    assert st["got"] == frames


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_rejects_bad_parameters():
    with pytest.raises(ValueError):
        PacketFifo(8, 1)
    with pytest.raises(ValueError):
        PacketFifo(8, 16, registered_ready=True, drop_oversize=True)
    with pytest.raises(ValueError):
        StreamUpsizer(16, 24)
    with pytest.raises(ValueError):
        GmiiMac(12)
    with pytest.raises(ValueError):
        GmiiMac(8, tx_depth=512, tx_start=513)
    with pytest.raises(ValueError):
        PacketFifo(8, 16, mark=17)
    mac = GmiiMac(32)
    assert mac.signature.members["rx"].signature.members["payload"].shape.size == 32 + 4 + 1
    Fragment.get(mac, None)         # elaborates at a width the other tests do not use

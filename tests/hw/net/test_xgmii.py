# Ref: IEEE 802.3 §3.1.1, §4.2.3.3, §4.4.2, clause 46 (XGMII, §46.3.1.4 DIC); hw/net/xgmii.py;
#      hw/lib/stream.py; sim/hdl.py.
"""Amaranth-simulator unit tests of the XGMII MAC (hw/net/xgmii.py).

Oracles: scapy for the frame bytes, ``zlib.crc32`` for the FCS (not the gateware's
``amaranth.lib.crc``), a Python XGMII encoder/decoder written here from clause 46 (it places
/S/ in lane 0 or 4 after a given minimum gap), and the counts of frames deliberately corrupted.
"""

import random
import zlib

import pytest
from amaranth import Fragment, Module, Shape

from hw.net.xgmii import (ERROR, IDLE, START, TERMINATE, XgmiiMac, XgmiiRx, XgmiiTx)
import hw.net.xgmii as xgmii
from sim.hdl import frame_get, packet_put, run_bounded, split_packets, stream_collect
from tests.hw.net.frames import random_frame

CLK = 6.4e-9
IDLE_WORD = (int.from_bytes(bytes([IDLE] * 8), "little"), 0xFF)


def run(dut, *benches, background=(), max_cycles=50_000):
    run_bounded(dut, *benches, background=background, clk=CLK, max_cycles=max_cycles)



def with_fcs(frame):
    return bytes(frame) + zlib.crc32(frame).to_bytes(4, "little")


# ---------------------------------------------------------------------------------------------
# XGMII model: a list of (octet, is_control) <-> 64-bit words (lane 0 first)
# ---------------------------------------------------------------------------------------------

def xgmii_frame(body):
    """/S/, preamble, SFD, ``body`` (bytes, or (octet, ctrl) pairs for injected controls), /T/."""
    items = body if body and isinstance(body[0], tuple) else [(b, 0) for b in body]
    return [(START, 1)] + [(0x55, 0)] * 6 + [(0xD5, 0)] + list(items) + [(TERMINATE, 1)]


def xgmii_encode(frames, ifg=5, lead=8):
    """Octets of ``frames`` (lists from :func:`xgmii_frame`) on an XGMII: ``lead`` idles, then
    each frame with /S/ at the first lane-0/4 position at least ``ifg`` octets (/T/ counted)
    after the previous /T/. ``ifg`` may be a callable(i) giving it per gap. Returns the words
    and the /S/ lanes."""
    octets = [(IDLE, 1)] * lead
    lanes = []
    for i, f in enumerate(frames):
        if i:
            gap = ifg(i) if callable(ifg) else ifg
            octets += [(IDLE, 1)] * (gap - 1)
        while len(octets) % 4:
            octets.append((IDLE, 1))
        lanes.append(len(octets) % 8)
        octets += f
    octets += [(IDLE, 1)] * (16 + (-len(octets)) % 8)
    words = []
    for w in range(0, len(octets), 8):
        chunk = octets[w:w + 8]
        words.append((sum(o << (8 * i) for i, (o, _) in enumerate(chunk)),
                       sum(c << i for i, (_, c) in enumerate(chunk))))
    return words, lanes


def xgmii_decode(words):
    """Frames on an XGMII: a list of (position of /S/, octets after /S/ up to the next control
    character, that character, its position)."""
    octets = [((d >> (8 * i)) & 0xFF, (c >> i) & 1) for d, c in words for i in range(8)]
    frames, cur = [], None
    for pos, (o, c) in enumerate(octets):
        if cur is None:
            if c and o == START:
                cur = (pos, bytearray())
            else:
                assert c and o == IDLE, f"octet {o:#x} ctrl {c} at {pos} outside a frame"
        elif c:
            frames.append((cur[0], bytes(cur[1]), o, pos))
            cur = None
        else:
            cur[1].append(o)
    assert cur is None, "wire ended inside a frame"
    return frames


async def drive_words(ctx, dut, words):
    for d, c in words:
        ctx.set(dut.rxd, d)
        ctx.set(dut.rxc, c)
        await ctx.tick()
    ctx.set(dut.rxd, IDLE_WORD[0])
    ctx.set(dut.rxc, IDLE_WORD[1])


def counters(ctx, dut):
    return {n: ctx.get(getattr(dut, n)) for n in
            ("frames_ok", "fcs_errors", "runts", "rx_errors", "overflows")}


def rx_run(frames_octets, *, ifg=5, depth=512, backpressure=0.0, rng=None, settle=200,
           cut=False):
    """Drive the frames into an XgmiiRx; return the packets it delivered, its counters, and the
    /S/ lanes used. ``cut``: the receiver cuts through, and the packets are ``(octets, err)``."""
    dut = XgmiiRx(depth, cut_through=cut)
    words, lanes = xgmii_encode(frames_octets, ifg)
    out, result = [], {}

    async def bench(ctx):
        ctx.set(dut.rxd, IDLE_WORD[0])
        ctx.set(dut.rxc, IDLE_WORD[1])
        await drive_words(ctx, dut, words)
        await ctx.tick().repeat(settle)
        result.update(counters(ctx, dut))

    async def sink(ctx):
        await stream_collect(ctx, dut.o, out, backpressure=backpressure, rng=rng)

    run(dut, bench, background=[sink], max_cycles=len(words) + settle + 100)
    if cut:
        ends = [p.err for p in out if p.last]
        assert not any(p.err for p in out if not p.last)
        return [(p, e) for (p, _), e in zip(split_packets(out, 64), ends)], result, lanes
    return [p for p, _ in split_packets(out, 64)], result, lanes


# ---------------------------------------------------------------------------------------------
# Receiver
# ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cut", [False, True])
@pytest.mark.parametrize("ifg", [5, 12])
def test_rx_every_length_both_lanes(ifg, cut):
    """Frames of 60..200 octets (+ FCS: every residue mod 8), back to back at the given minimum
    gap (5: the shortest a receiver may see, /T/ in lane 3 -> /S/ in lane 0 and /T/ in lane
    7 -> /S/ in lane 4; 12 rounded up to lane 0/4), all delivered byte for byte."""
    rng = random.Random(ifg)
    lengths = list(range(60, 201))
    rng.shuffle(lengths)                        # every (start lane, length) pair mixes
    good = [random_frame(rng, n) for n in lengths]
    got, cnt, lanes = rx_run([xgmii_frame(with_fcs(f)) for f in good], ifg=ifg, depth=2048,
                             cut=cut)
    if cut:
        assert not any(e for _, e in got)
        got = [p for p, _ in got]
    assert set(lanes) == {0, 4}
    # Every change of start lane happens, both ways and not.
    pairs = set(zip(lanes, lanes[1:]))
    assert pairs == {(0, 0), (0, 4), (4, 0), (4, 4)}
    assert got == good
    assert cnt == {"frames_ok": len(good), "fcs_errors": 0, "runts": 0, "rx_errors": 0,
                   "overflows": 0}


def test_rx_five_octet_gaps():
    """The two 5-octet gaps of a 64-bit XGMII, each after every lane of /S/ before it."""
    rng = random.Random(55)
    frames, octets = [], []
    # Lengths = 8q + 7 (FCS included 8q + 3) put /T/ 3 lanes after /S/'s: the next /S/ 5 octets
    # on is in the same lane; 8q + 3 puts it 7 lanes after: the next /S/ changes lane.
    for n in [63, 67, 71, 67, 67, 75, 131, 1515, 63, 1511, 67, 63]:
        f = random_frame(rng, n)
        frames.append(f)
        octets.append(xgmii_frame(with_fcs(f)))
    words, lanes = xgmii_encode(octets, 5)
    assert set(zip(lanes, lanes[1:])) == {(0, 0), (0, 4), (4, 0), (4, 4)}
    # Check the placement: /T/ then /S/ exactly 5 octets later, every time.
    dec = xgmii_decode(words)
    assert all(b[0] - a[3] == 5 for a, b in zip(dec, dec[1:]))
    got, cnt, _ = rx_run(octets, ifg=5, depth=1024)
    assert got == frames
    assert cnt["frames_ok"] == len(frames)


@pytest.mark.parametrize("cut", [False, True])
def test_rx_bad_frames_dropped_and_counted(cut):
    """Store-and-forward, bad frames are dropped; cut-through, those of which any octet was
    passed on end with ``err`` (the others leave nothing). Counted the same either way."""
    rng = random.Random(5)
    good = [random_frame(rng, n) for n in (60, 61, 100, 64, 150, 67, 90, 200)]
    plan = []                       # (octets, kind)

    def add_good(f):
        plan.append((xgmii_frame(with_fcs(f)), "good"))

    def bit_flip(f, lo):
        w = bytearray(with_fcs(f))
        w[rng.randrange(lo, len(w))] ^= 1 << rng.randrange(8)
        return bytes(w)

    for i, f in enumerate(good):
        add_good(f)
        kind = ["fcs", "fcs_last", "runt63", "runt_tiny", "err", "ctrl", "fcs", "err_last"][i]
        g = random_frame(rng, rng.randint(60, 130))
        if kind == "fcs":
            plan.append((xgmii_frame(bit_flip(g, 0)), "fcs"))
        elif kind == "fcs_last":
            w = bytearray(with_fcs(g))
            w[-1] ^= 0x80                           # only the FCS's last octet
            plan.append((xgmii_frame(bytes(w)), "fcs"))
        elif kind == "runt63":
            plan.append((xgmii_frame(with_fcs(g[:59])), "runt"))
        elif kind == "runt_tiny":
            plan.append((xgmii_frame(with_fcs(g[:1])), "runt"))
        elif kind in ("err", "ctrl", "err_last"):
            items = [(b, 0) for b in with_fcs(g)]
            k = len(items) - 1 if kind == "err_last" else rng.randrange(len(items))
            items[k] = (ERROR, 1) if kind != "ctrl" else (IDLE, 1)
            plan.append((xgmii_frame(items), "rx_er"))
    # A frame without a valid preamble is no frame at all: ignored, not counted.
    bad_pre = xgmii_frame(with_fcs(good[0]))
    bad_pre[3] = (0x54, 0)
    plan.insert(5, (bad_pre, "ignored"))
    add_good(good[0])

    got, cnt, _ = rx_run([o for o, _ in plan], ifg=5, depth=1024, cut=cut)
    kinds = [k for _, k in plan]
    if cut:
        n_err = sum(e for _, e in got)
        n_bad = len([k for k in kinds if k not in ("good", "ignored")])
        # every FCS error and runt has octets to pass on; an error word may end a frame
        # before its first data word
        assert kinds.count("fcs") + kinds.count("runt") <= n_err <= n_bad, (n_err, n_bad)
        got = [p for p, e in got if not e]
    assert got == [f for f in good] + [good[0]]
    assert cnt == {"frames_ok": kinds.count("good"), "fcs_errors": kinds.count("fcs"),
                   "runts": kinds.count("runt"), "rx_errors": kinds.count("rx_er"),
                   "overflows": 0}


def test_rx_backpressure():
    rng = random.Random(21)
    good = [random_frame(rng, rng.randint(60, 400)) for _ in range(20)]
    got, cnt, _ = rx_run([xgmii_frame(with_fcs(f)) for f in good], ifg=lambda i: 5 + i % 8,
                         depth=2048, backpressure=0.5, rng=rng, settle=1500)
    assert got == good
    assert cnt["frames_ok"] == len(good) and cnt["overflows"] == 0


def test_rx_overflow_and_backlog():
    """A stalled reader: frames that do not fit are dropped whole and counted; ``backlog`` rises
    at half the buffer; frames sent once there is room again arrive intact."""
    rng = random.Random(9)
    dut = XgmiiRx(depth=32)                     # 256 octets
    pkts = [random_frame(rng, 100) for _ in range(4)]
    big = random_frame(rng, 300)
    got = []

    async def bench(ctx):
        from sim.hdl import packet_get
        ctx.set(dut.o.ready, 0)
        words, _ = xgmii_encode([xgmii_frame(with_fcs(p)) for p in pkts + [big]])
        await drive_words(ctx, dut, words)
        await ctx.tick().repeat(5)
        c = counters(ctx, dut)
        # 32 beats hold two 100-octet frames (13 beats each); the 3rd and 4th and the 300-octet
        # one did not fit.
        assert c["frames_ok"] == 2 and c["overflows"] == 3, c
        assert ctx.get(dut.backlog)             # 26 beats >= 16
        for _ in range(2):
            got.append(await packet_get(ctx, dut.o, 64))
        await ctx.tick().repeat(2)
        assert not ctx.get(dut.backlog)
        words, _ = xgmii_encode([xgmii_frame(with_fcs(pkts[3]))])
        await drive_words(ctx, dut, words)
        await ctx.tick().repeat(5)
        got.append(await packet_get(ctx, dut.o, 64))
        assert counters(ctx, dut)["frames_ok"] == 3

    run(dut, bench, max_cycles=2000)
    assert got == [pkts[0], pkts[1], pkts[3]]


def test_rx_cut_through_overflow_cuts_and_closes():
    """Cut-through, a stalled reader: the frame that finds the buffer full is cut and its last
    beat, with ``err``, is written once there is room; the frames that start before then are
    dropped whole; all are counted as overflows, and the frames before and after arrive
    intact."""
    rng = random.Random(9)
    dut = XgmiiRx(depth=32, cut_through=True)   # 256 octets
    pkts = [random_frame(rng, 100) for _ in range(4)]
    big = random_frame(rng, 300)
    got = []

    async def bench(ctx):
        ctx.set(dut.o.ready, 0)
        words, _ = xgmii_encode([xgmii_frame(with_fcs(p)) for p in pkts + [big]])
        await drive_words(ctx, dut, words)
        await ctx.tick().repeat(5)
        c = counters(ctx, dut)
        assert c["frames_ok"] == 2 and c["overflows"] == 3, c
        for _ in range(3):
            got.append(await frame_get(ctx, dut.o, 64))
        words, _ = xgmii_encode([xgmii_frame(with_fcs(pkts[3]))])
        await drive_words(ctx, dut, words)
        got.append(await frame_get(ctx, dut.o, 64))
        assert counters(ctx, dut)["frames_ok"] == 3

    run(dut, bench, max_cycles=2000)
    assert got[:2] == [(pkts[0], 0), (pkts[1], 0)]
    cut_data, cut_err = got[2]
    assert cut_err == 1 and len(cut_data) < 100 and pkts[2].startswith(cut_data[:-1])
    assert got[3] == (pkts[3], 0)


# ---------------------------------------------------------------------------------------------
# Transmitter
# ---------------------------------------------------------------------------------------------

def check_wire(words, pkts):
    """The frames on the wire are the packets, padded, with zlib's FCS; /S/ in lane 0 or 4.
    Returns the /S/ positions and the gaps (/T/ to /S/, /T/ counted)."""
    dec = xgmii_decode(words)
    assert len(dec) == len(pkts)
    for (start, body, end, _), p in zip(dec, pkts):
        assert start % 4 == 0, "/S/ not in lane 0 or 4"
        assert end == TERMINATE
        padded = p + bytes(max(0, 60 - len(p)))
        assert body == bytes([0x55] * 6 + [0xD5]) + with_fcs(padded), f"frame of {len(p)}"
    gaps = [b[0] - a[3] for a, b in zip(dec, dec[1:])]
    return [d[0] for d in dec], gaps


@pytest.mark.parametrize("lengths", ["short", "mixed"])
def test_tx_wire_format_and_dic(lengths):
    """Frames back to back: byte-exact frames (padding, FCS), /S/ in both lanes, every gap
    9..15 octets, 12 on average (deficit idle count), i.e. each frame takes (L + 8 + 12) / 8
    cycles on average (L with FCS, padded). Short frames through XgmiiMac (its FIFO keeps
    ahead of the wire); frames up to 1514 octets into XgmiiTx itself (through the MAC, a long
    frame after a short one waits to be stored whole, which is no fault of the gap logic)."""
    rng = random.Random(lengths)
    if lengths == "short":
        pkts = [rng.randbytes(n) for n in list(range(1, 80)) + list(range(1, 30))]
    else:
        pkts = [random_frame(rng, rng.choice([rng.randint(14, 200), rng.randint(14, 1514)]))
                for _ in range(40)]
    if lengths == "short":
        dut = XgmiiMac(rx_depth=2048, tx_depth=4096)
        i, txd, txc, frames, underruns = (dut.tx, dut.xgmii_txd, dut.xgmii_txc, dut.tx_frames,
                                          dut.tx_underruns)
    else:
        dut = XgmiiTx()
        i, txd, txc, frames, underruns = dut.i, dut.txd, dut.txc, dut.frames, dut.underruns
    words = []

    async def producer(ctx):
        for p in pkts:
            await packet_put(ctx, i, p, 64)

    async def monitor(ctx):
        async for _, _, d, c in ctx.tick().sample(txd, txc):
            words.append((d, c))

    async def waiter(ctx):
        while ctx.get(frames) < len(pkts):
            await ctx.tick()
        await ctx.tick().repeat(20)
        assert ctx.get(underruns) == 0

    run(dut, producer, waiter, background=[monitor], max_cycles=20_000)
    starts, gaps = check_wire(words, pkts)
    assert {s % 8 for s in starts} == {0, 4}
    assert 9 <= min(gaps) and max(gaps) <= 15, (min(gaps), max(gaps))
    # Average 12: the deficit (0..3 octets) is all that can be left over.
    n = len(gaps)
    assert abs(sum(gaps) - 12 * n) <= 3, sum(gaps) / n
    span = (starts[-1] - starts[0]) / 8
    model = sum(max(60, len(p)) + 4 + 8 + 12 for p in pkts[:-1]) / 8
    print(f"\n{type(dut).__name__} {lengths}: {span / n:.4f} cycles/frame, model {model / n:.4f}, "
          f"gaps {min(gaps)}..{max(gaps)} avg {sum(gaps) / n:.4f}")
    assert abs(span - model) <= 3 / 8


@pytest.mark.parametrize("tx_start", [64, None])
def test_tx_cut_through(tx_start):
    """XgmiiMac with a cut-through start (issue 21): frames of 1,500 octets put in at the
    line's word rate start on the wire (/S/) once 64 octets of them are in, before their last
    word; store-and-forward (None), after it. The frames on the wire are byte-exact (zlib's
    FCS), the gaps are the DIC's, and nothing underruns."""
    rng = random.Random(1500)
    pkts = [random_frame(rng, n) for n in (1500, 1500, 300, 1500)]
    dut = XgmiiMac(rx_depth=2048, tx_depth=4096, tx_start=tx_start)
    words, put = [], []

    async def producer(ctx):
        from sim.hdl import packet_to_beats, stream_put
        for p in pkts:
            beats = packet_to_beats(p, 64)
            await stream_put(ctx, dut.tx, beats[:8])
            mark = len(words)
            await stream_put(ctx, dut.tx, beats[8:])
            put.append((mark, len(words)))
            await ctx.tick().repeat(300)            # an idle wire before the next frame

    async def monitor(ctx):
        async for _, _, d, c in ctx.tick().sample(dut.xgmii_txd, dut.xgmii_txc):
            words.append((d, c))

    async def waiter(ctx):
        while ctx.get(dut.tx_frames) < len(pkts):
            await ctx.tick()
        await ctx.tick().repeat(20)
        assert ctx.get(dut.tx_underruns) == 0

    run(dut, producer, waiter, background=[monitor], max_cycles=20_000)
    starts, gaps = check_wire(words, pkts)
    s_cycles = [s // 8 for s in starts]
    print(f"\ntx_start {tx_start}: (64 octets in, last in) {put}, /S/ at {s_cycles}")
    for (mark, last), s, p in zip(put, s_cycles, pkts):
        if tx_start is None:
            assert s > last
        else:
            # 9 measured: the FIFO's registered count, its read register, the slice and the
            # transmitter's output stages (store-and-forward: 7 after the last word)
            assert mark < s <= mark + 10, (mark, s)
            assert len(p) < 300 or s < last


def test_tx_underrun_sends_error():
    """XgmiiTx alone, its input dry mid-frame: /E/ words go out, the frame is counted as an
    underrun, and an XgmiiRx listening drops it as rx_errors (the next frame passes)."""
    tx, rx = XgmiiTx(), XgmiiRx(depth=256)
    m = Module()
    m.submodules.tx, m.submodules.rx = tx, rx
    m.d.comb += [rx.rxd.eq(tx.txd), rx.rxc.eq(tx.txc)]
    data = bytes(range(120))
    seen = {"err": 0}
    out = []

    async def producer(ctx):
        from sim.hdl import packet_to_beats, stream_put
        beats = packet_to_beats(data, 64)
        await stream_put(ctx, tx.i, beats[:6])
        await ctx.tick().repeat(4)              # dry mid-frame
        await stream_put(ctx, tx.i, beats[6:])
        await packet_put(ctx, tx.i, data[:70], 64)
        await ctx.tick().repeat(60)
        assert ctx.get(tx.underruns) == 1 and ctx.get(tx.frames) == 2
        assert ctx.get(rx.rx_errors) == 1 and ctx.get(rx.frames_ok) == 1

    async def monitor(ctx):
        async for _, _, d, c in ctx.tick().sample(tx.txd, tx.txc):
            seen["err"] += sum(((c >> i) & 1) and ((d >> 8 * i) & 0xFF) == ERROR
                               for i in range(8))

    async def sink(ctx):
        await stream_collect(ctx, rx.o, out)

    run(m, producer, background=[monitor, sink], max_cycles=2000)
    assert seen["err"] >= 4 * 8
    assert [p for p, _ in split_packets(out, 64)] == [data[:70]]


def test_mac_loop():
    """XgmiiMac with its XGMII looped: frames of 1..300 octets with idles on tx and
    back-pressure on rx come back padded to 60."""
    rng = random.Random(13)
    mac = XgmiiMac(rx_depth=4096, tx_depth=4096)
    m = Module()
    m.submodules.mac = mac
    m.d.comb += [mac.xgmii_rxd.eq(mac.xgmii_txd), mac.xgmii_rxc.eq(mac.xgmii_txc)]
    pkts = [rng.randbytes(rng.randint(1, 300)) for _ in range(25)]
    out = []

    async def producer(ctx):
        for p in pkts:
            await packet_put(ctx, mac.tx, p, 64, idle=0.3, rng=rng)
        while ctx.get(mac.rx_frames_ok) < len(pkts):
            await ctx.tick()
        await ctx.tick().repeat(100)
        assert ctx.get(mac.tx_underruns) == 0 and ctx.get(mac.rx_fcs_errors) == 0

    async def sink(ctx):
        await stream_collect(ctx, mac.rx, out, backpressure=0.3, rng=rng)

    run(m, producer, background=[sink], max_cycles=10_000)
    assert [p for p, _ in split_packets(out, 64)] == [p + bytes(max(0, 60 - len(p)))
                                                      for p in pkts]


# ---------------------------------------------------------------------------------------------
# Interface
# ---------------------------------------------------------------------------------------------

@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")
def test_interface():
    assert sorted(xgmii.__all__) == sorted(["XgmiiRx", "XgmiiTx", "XgmiiMac", "IDLE", "START",
                                            "TERMINATE", "ERROR"])
    assert (IDLE, START, TERMINATE, ERROR) == (0x07, 0xFB, 0xFD, 0xFE)
    with pytest.raises(ValueError):
        XgmiiMac(32)
    mac = XgmiiMac()
    members = mac.signature.members
    widths = {"xgmii_rxd": 64, "xgmii_rxc": 8, "xgmii_txd": 64, "xgmii_txc": 8,
              "rx_backlog": 1}
    widths.update({n: 32 for n in ("rx_frames_ok", "rx_fcs_errors", "rx_runts", "rx_errors",
                                   "rx_overflows", "tx_frames", "tx_underruns")})
    for name, w in widths.items():
        assert Shape.cast(members[name].shape).width == w, name
    assert members["xgmii_rxd"].flow.name == "In" and members["xgmii_txd"].flow.name == "Out"
    assert members["rx"].flow.name == "Out" and members["tx"].flow.name == "In"
    assert members["rx"].signature.members["payload"].shape.size == 64 + 8 + 1
    assert set(members) == set(widths) | {"rx", "tx"}
    Fragment.get(mac, None)

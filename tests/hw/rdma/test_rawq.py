# Ref: hw/rdma/rawq.py (queue word formats); roce-layouts.md §7 (CM on QP1).
"""Raw frame queues, QP1 filter and transmit mux in the Amaranth simulator.

Oracles: the frames themselves (scapy-built, or the rdma_cm CM REQ of the rping capture) and
byte-for-byte comparison; queue words are decoded here by hand from the documented format.
"""

import random

import pytest
from amaranth.sim import Simulator
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw
from scapy.utils import rdpcap

from hw.iface import Space
from hw.lib.stream import FrameMux
from hw.rdma.rawq import QpFilter, Q_RAW_RX, Q_RAW_TX, RawQueues
from sim.hostbus import bus_access as access
from sim.paths import DATA_DIR
from sim.hdl import packet_put, packet_to_beats, split_packets, stream_collect, stream_put
from sim.scapy_roce import pcap_roce_frames, roce_frame, roce_rx_beats

MAC, IPV4 = 0x525400000001, 0x0A000001       # the rping capture's first guest
RPING = DATA_DIR / "rxe-two-guests-pingpong-rping.pcap"


def cm_frames():
    """QP1 (CM) frames of the rdma_cm capture: REQ, REP, RTU, DREQ, DREP."""
    out = []
    for p in rdpcap(str(RPING)):
        r = bytes(p)
        if len(r) > 50 and r[12:14] == b"\x08\x00" and r[36:38] == b"\x12\xb7" \
                and r[47:50] == b"\x00\x00\x01":
            out.append(r)
    return out


def cm_req():
    f = cm_frames()[0]
    assert f[42 + 12 + 8 + 16:42 + 12 + 8 + 18] == b"\x00\x10"   # MAD attribute REQ
    assert f[:6] == MAC.to_bytes(6, "big")
    return f


def rc_frame(payload=b"x" * 40, dqpn=0x11):
    return bytes(roce_frame(0x04, payload, bth={"dqpn": dqpn}, dst_mac="52:54:00:00:00:01",
                            src_mac="52:54:00:00:00:02", dst_ip="10.0.0.1", src_ip="10.0.0.2"))


def run(dut, bench, bgs=()):
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    for b in bgs:
        sim.add_testbench(b, background=True)
    sim.add_testbench(bench)
    sim.run()




async def pop_frame(ctx, bus):
    """One frame from Q_RAW_RX, or None (decoded from the documented format)."""
    n, err = await access(ctx, bus, Space.QUEUE, Q_RAW_RX, 0)
    if err:
        return None
    out = b""
    for _ in range((n + 3) // 4):
        w, err = await access(ctx, bus, Space.QUEUE, Q_RAW_RX, 0)
        assert not err
        out += w.to_bytes(4, "little")
    return out[:n & 0xFFFF]


async def push_frame(ctx, bus, frame):
    """Push a frame on Q_RAW_TX; returns the err bit of every word."""
    errs = [(await access(ctx, bus, Space.QUEUE, Q_RAW_TX, 1, len(frame)))[1]]
    raw = frame + bytes(-len(frame) % 4)
    for k in range(0, len(raw), 4):
        errs.append((await access(ctx, bus, Space.QUEUE, Q_RAW_TX, 1,
                                  int.from_bytes(raw[k:k + 4], "little")))[1])
    return errs


async def tap_frame(ctx, tap, frame, width, rng=None):
    """Beats on the tap as the MAC delivers them (random gaps between beats, with ``rng``);
    the tap is always ready."""
    await packet_put(ctx, tap, frame, width, idle=0.3 if rng else 0.0, rng=rng)
    await ctx.tick().repeat(4)          # inter-frame gap; the length FIFO's read latency


@pytest.mark.parametrize("width", [8, 64])
def test_rx_queue_keeps_cm_frames_only(width):
    """CM frames (and only those) arrive intact, ICRC included; others leave no trace."""
    dut = RawQueues(width)
    rng = random.Random(width)
    req = cm_req()
    other_mac = b"\x02\x00\x00\x00\x00\x09" + req[6:]
    rc = rc_frame()
    udp = bytes(Ether(dst="52:54:00:00:00:01") / IP(dst="10.0.0.1") / UDP(dport=4792)
                / Raw(b"\x00" * 12 + b"\x00\x00\x01" + b"z" * 20))
    short = req[:49]
    padded = bytes(roce_frame(0x64, b"m" * 4, bth={"dqpn": 1}, dst_mac="52:54:00:00:00:01",
                              dst_ip="10.0.0.1")) + b"\x00" * 6

    async def bench(ctx):
        ctx.set(dut.own_mac, MAC)
        ctx.set(dut.own_ip, IPV4)
        for f in (rc, req, other_mac, udp, short, padded, rc, req):
            await tap_frame(ctx, dut.tap, f, width, rng)
        got = []
        while (f := await pop_frame(ctx, dut.bus)) is not None:
            got.append(f)
        assert got == [req, padded, req]
        assert ctx.get(dut.cnt_rx_frames) == 3 and ctx.get(dut.cnt_rx_drops) == 0
        # a write to the pop queue is refused
        assert (await access(ctx, dut.bus, Space.QUEUE, Q_RAW_RX, 1, 5))[1] == 1
    run(dut, bench)


@pytest.mark.parametrize("width", [8, 64])
def test_rx_queue_skips_frames_the_mac_found_bad(width):
    """A CM frame whose last beat carries ``err`` (the cut-through MAC's bad-FCS verdict) is
    neither queued nor counted as a queue drop; the same frame good is queued after it."""
    dut = RawQueues(width)
    req = cm_req()

    async def bench(ctx):
        ctx.set(dut.own_mac, MAC)
        ctx.set(dut.own_ip, IPV4)
        beats = packet_to_beats(req, width)
        beats[-1] = {**beats[-1], "err": 1}
        await stream_put(ctx, dut.tap, beats)
        await ctx.tick().repeat(4)
        await tap_frame(ctx, dut.tap, req, width)
        assert await pop_frame(ctx, dut.bus) == req
        assert await pop_frame(ctx, dut.bus) is None
        assert ctx.get(dut.cnt_rx_frames) == 1 and ctx.get(dut.cnt_rx_drops) == 0
    run(dut, bench)


@pytest.mark.parametrize("width", [8, 64])
def test_rx_queue_full_drops_and_counts(width):
    """512 octets hold one 322-octet REQ: the next two are dropped and counted, the queue
    keeps working once read."""
    dut = RawQueues(width, rx_octets=512, rx_frames=4)
    req = cm_req()
    frames = cm_frames()

    async def bench(ctx):
        ctx.set(dut.own_mac, MAC)
        ctx.set(dut.own_ip, IPV4)
        for _ in range(3):
            await tap_frame(ctx, dut.tap, req, width)
        assert ctx.get(dut.cnt_rx_frames) == 1 and ctx.get(dut.cnt_rx_drops) == 2
        assert await pop_frame(ctx, dut.bus) == req
        assert await pop_frame(ctx, dut.bus) is None
        # frame-count limit: 4 small frames fit, the fifth does not
        small = bytes(roce_frame(0x64, b"q", bth={"dqpn": 1}, dst_mac="52:54:00:00:00:01",
                                 dst_ip="10.0.0.1"))
        for _ in range(5):
            await tap_frame(ctx, dut.tap, small, width)
        assert ctx.get(dut.cnt_rx_drops) == 3
        for _ in range(4):
            assert await pop_frame(ctx, dut.bus) == small
        assert await pop_frame(ctx, dut.bus) is None
        # the other CM messages of the capture that are addressed to us
        mine = [f for f in frames if f[:6] == MAC.to_bytes(6, "big")]
        for f in mine[:1]:
            await tap_frame(ctx, dut.tap, f, width)
            assert await pop_frame(ctx, dut.bus) == f
    run(dut, bench)


@pytest.mark.parametrize("width", [8, 64])
def test_tx_queue_frames_leave_intact(width):
    """Host-pushed frames of every length mod 8 come out unchanged, under back-pressure; an
    oversize length and a full queue are refused and counted."""
    dut = RawQueues(width, tx_octets=512)
    rng = random.Random(3)
    frames = [cm_req()[:300]] + [bytes(rng.randrange(256) for _ in range(n))
                                 for n in (60, 61, 62, 63, 64, 65, 66, 67, 1)]
    out = []

    async def bench(ctx):
        free, err = await access(ctx, dut.bus, Space.QUEUE, Q_RAW_TX, 0)
        assert (free, err) == (512, 0)
        for f in frames:
            # the documented way: push only what the free room holds
            while (await access(ctx, dut.bus, Space.QUEUE, Q_RAW_TX, 0))[0] < len(f):
                await ctx.tick().repeat(8)
            errs = await push_frame(ctx, dut.bus, f)
            assert not any(errs)
        for _ in range(2000):
            if len([b for b in out if b.last]) == len(frames):
                break
            await ctx.tick()
        got = [p for p, _ in split_packets(out, width)]
        assert got == frames
        assert ctx.get(dut.cnt_tx_frames) == len(frames)
        # length 0 and above the queue size: refused at the length word
        assert (await access(ctx, dut.bus, Space.QUEUE, Q_RAW_TX, 1, 0))[1] == 1
        assert (await access(ctx, dut.bus, Space.QUEUE, Q_RAW_TX, 1, 513))[1] == 1

    async def collect(ctx):
        await stream_collect(ctx, dut.tx, out, backpressure=0.3, rng=rng)
    run(dut, bench, [collect])


@pytest.mark.parametrize("width", [8, 64])
def test_tx_queue_full(width):
    """With the output stalled, the second 300-octet frame does not fit in 512 octets: its
    last word answers err, the drop is counted, the first frame still leaves intact."""
    dut = RawQueues(width, tx_octets=512)
    f1, f2 = bytes(range(200)) + bytes(100), bytes(300)
    out = []

    async def bench(ctx):
        ctx.set(dut.tx.ready, 0)
        assert not any(await push_frame(ctx, dut.bus, f1))
        free, _ = await access(ctx, dut.bus, Space.QUEUE, Q_RAW_TX, 0)
        assert free < 300
        errs = await push_frame(ctx, dut.bus, f2)
        assert errs[-1] == 1 and not any(errs[:-1])
        assert ctx.get(dut.cnt_tx_drops) == 1
        ctx.set(dut.tx.ready, 1)
        for _ in range(400):
            if ctx.get(dut.tx.valid):
                out.append(ctx.get(dut.tx.payload))
            await ctx.tick()
        assert [p for p, _ in split_packets(out, width)] == [f1]
        assert ctx.get(dut.cnt_tx_frames) == 1
    run(dut, bench)


@pytest.mark.parametrize("width", [8, 64])
def test_qp_filter(width):
    """QP1 packets vanish, RC packets (capture + scapy) pass unchanged with their metadata,
    under idles and back-pressure."""
    dut = QpFilter(width)
    rng = random.Random(11)
    rc = pcap_roce_frames()[:6] + [rc_frame(b"y" * 3)]
    req = cm_req()
    seq = [rc[0], req, rc[1], rc[2], req, req, rc[3], rc[4], rc[5], req, rc[6]]
    out = []

    async def bench(ctx):
        beats = [b for f in seq for b in roce_rx_beats(f, width)]
        await stream_put(ctx, dut.i, beats, idle=0.3, rng=rng)
        for _ in range(300):
            await ctx.tick()
        pk = split_packets(out, width)
        want = [f for f in seq if f is not req]
        assert [p for p, _ in pk] == [roce_body(f) for f in want]
        for (_, first), f in zip(pk, want):
            assert first.meta.udp_src_port == int.from_bytes(f[34:36], "big")
        assert ctx.get(dut.cnt_dropped) == 4

    async def collect(ctx):
        await stream_collect(ctx, dut.o, out, backpressure=0.3, rng=rng)
    run(dut, bench, [collect])


def roce_body(f):
    ulen = int.from_bytes(f[38:40], "big")
    return f[42:42 + ulen - 8]


@pytest.mark.parametrize("width", [8, 64])
def test_frame_mux_whole_frames(width):
    """Two busy sources: every output frame is one input frame, whole; both get through."""
    dut = FrameMux(width)
    rng = random.Random(5)
    a = [bytes([0xA0 + k]) * (20 + 7 * k) for k in range(6)]
    b = [bytes([0xB0 + k]) * (61 + 3 * k) for k in range(6)]
    out = []

    def beats(fs):
        return [beat for f in fs for beat in packet_to_beats(f, width)]

    async def put_a(ctx):
        await stream_put(ctx, dut.i[0], beats(a), idle=0.2, rng=random.Random(1))

    async def put_b(ctx):
        await stream_put(ctx, dut.i[1], beats(b), idle=0.2, rng=random.Random(2))

    async def bench(ctx):
        for _ in range(2500):
            await ctx.tick()
        got = [p for p, _ in split_packets(out, width)]
        assert sorted(got) == sorted(a + b)
        assert [g for g in got if g in a] == a and [g for g in got if g in b] == b

    async def collect(ctx):
        await stream_collect(ctx, dut.o, out, backpressure=0.2, rng=rng)
    run(dut, bench, [put_a, put_b, collect])

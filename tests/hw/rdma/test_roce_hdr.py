# Ref: roce-layouts.md §2-§4 (BTH, opcodes, extended headers, PadCnt), §5 (ICRC); the C2 capture.
"""RoceRxParser / RoceTxBuilder against scapy, and the whole receive / transmit chain."""

import pytest
from amaranth import Module
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from hw.net.icrc import IcrcCheck, IcrcInsert
from hw.net.ip import EthIpRx, EthIpTx
from hw.rdma.roce_hdr import RoceRxHeader, RoceRxParser, RoceTxBuilder, RoceTxHeader
from hw.lib.stream import FrameStream, PacketStream
from sim.hdl import packet_to_beats, run_sim, run_through, split_packets, stream_collect, stream_put
from sim.scapy_roce import (EXT_NAME, OPCODE_EXTS, dissect_roce, icrc_of, pcap_roce_frames,
                            random_ext_fields, roce_frame, roce_rx_beats, rx_meta_of, seeded)

SPEEDS = [(0.0, 0.0), (0.3, 0.3)]
#: scapy BTH field name -> gateware record field name.
BTH_NAMES = {"opcode": "opcode", "solicited": "se", "migreq": "migreq", "padcount": "padcnt",
             "version": "tver", "pkey": "pkey", "fecn": "fecn", "becn": "becn",
             "resv6": "resv6", "dqpn": "dest_qp", "ackreq": "ackreq", "resv7": "resv7",
             "psn": "psn"}
ALL_EXTS = sorted(EXT_NAME.values())
#: IBA 9.4: opcodes made of headers only (READ request, CmpSwap, FetchAdd, ACK, Atomic ACK).
HEADERS_ONLY = {0x0C, 0x11, 0x12, 0x13, 0x14}


def random_bth(rng):
    return {"solicited": rng.getrandbits(1), "migreq": rng.getrandbits(1),
            "pkey": rng.getrandbits(16), "fecn": rng.getrandbits(1), "becn": rng.getrandbits(1),
            "dqpn": rng.getrandbits(24), "ackreq": rng.getrandbits(1),
            "psn": rng.getrandbits(24)}


def every_opcode_frames(rng, reps=1):
    """scapy frames for every opcode of §3, random fields, payload lengths with every pad."""
    frames = []
    for _ in range(reps):
        for op in sorted(OPCODE_EXTS):
            n = 0 if op in HEADERS_ONLY else rng.choice([0, 1, 2, 3, 4, 13])
            payload = bytes(rng.getrandbits(8) for _ in range(n))
            ext = {cls: random_ext_fields(cls, rng) for cls in OPCODE_EXTS[op]}
            frames.append(bytes(roce_frame(op, payload, ext=ext, bth=random_bth(rng))))
    return frames


def _check_record(rec, raw):
    """A parser record equals scapy's dissection of BTH .. ICRC octets ``raw``."""
    bth, exts, payload, _ = dissect_roce(raw)
    for sname, gname in BTH_NAMES.items():
        assert int(getattr(rec.bth, gname)) == bth[sname], gname
    assert rec.known_opcode == 1 and rec.malformed == 0
    for name in ALL_EXTS:
        assert int(getattr(rec, f"has_{name}")) == (name in exts), name
        for f, v in exts.get(name, {}).items():
            assert int(getattr(getattr(rec, name), f)) == v, (name, f)
    assert rec.payload_len == len(payload)
    return payload


def _parse(width, items, idle, stall):
    rng = seeded(width + len(items))
    dut = RoceRxParser(width)
    out, cnt = run_through(dut, [b for beats in items for b in beats],
                           {"hdr": dut.hdr, "payload": dut.payload}, settle=100, idle=idle,
                           stall=stall, rng=rng, counters=("packets", "bad_opcode", "malformed"))
    return out["hdr"], [p for p, _ in split_packets(out["payload"], width)], cnt


@pytest.mark.parametrize("width", [8, 64])
@pytest.mark.parametrize("idle,stall", SPEEDS)
def test_rx_parser(width, idle, stall):
    rng = seeded(11 + width)
    frames = every_opcode_frames(rng) + pcap_roce_frames()
    items = [roce_rx_beats(f, width) for f in frames]
    # Unknown / reserved opcodes: flagged, no payload.
    bad_ops = [0x15, 0x18, 0x2A, 0x81]
    for op in bad_ops:
        f = bytes(roce_frame(op, b"abcdefgh"))
        items.append(roce_rx_beats(f, width))
    # Malformed: a WRITE Only whose UDP length leaves no room for its RETH.
    f = bytes(roce_frame(0x04, b"wxyz"))
    meta = dict(rx_meta_of(f), udp_length=8 + 12 + 4 + 4)
    body = f[42:42 + 20]
    body = bytes([0x0A]) + body[1:]
    items.append([dict(beat, meta=meta) for beat in packet_to_beats(body, width)])
    # Malformed: headers-only opcodes (ACKNOWLEDGE, READ request) followed by payload octets:
    # flagged, their payload not forwarded (nothing downstream would drain it).
    extra = [bytes(roce_frame(op, bytes(range(64)))) for op in (0x11, 0x0C)]
    items += [roce_rx_beats(f, width) for f in extra]
    # ... and the parser goes on: a good packet after them.
    items.append(roce_rx_beats(frames[0], width))
    hdrs, pays, cnt = _parse(width, items, idle, stall)
    assert len(hdrs) == len(items)
    for rec, op in zip(hdrs[-3:-1], (0x11, 0x0C)):
        assert (rec.bth.opcode, rec.malformed, rec.payload_len) == (op, 1, 0)
    first_pay = _check_record(hdrs[-1], frames[0][42:])
    hdrs = hdrs[:-3]
    expect_pay = []
    for rec, f in zip(hdrs, frames):
        p = _check_record(rec, f[42:])
        assert {k: int(getattr(rec.meta, k)) for k in rx_meta_of(f)} == rx_meta_of(f)
        if p:
            expect_pay.append(p)
    for rec, op in zip(hdrs[len(frames):], bad_ops):
        assert rec.known_opcode == 0 and rec.bth.opcode == op and rec.payload_len == 0
    assert hdrs[-1].malformed == 1 and hdrs[-1].known_opcode == 1
    assert pays == expect_pay + ([first_pay] if first_pay else [])
    assert cnt == {"packets": len(items), "bad_opcode": len(bad_ops), "malformed": 3}


def _tx_jobs(rng, n):
    jobs = []
    for k in range(n):
        op = 0x15 if k == 3 else rng.choice(sorted(OPCODE_EXTS))     # 0x15: reserved
        payload = bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 1, 2, 3, 7, 16, 30])))
        bth = random_bth(rng)
        rec = {"bth": {BTH_NAMES[s]: v for s, v in bth.items()} | {"opcode": op,
                                                                      "padcnt": 3, "tver": 0}}
        for cls in OPCODE_EXTS.get(op, ()):
            rec[EXT_NAME[cls]] = random_ext_fields(cls, rng)
        # Fields of headers the opcode does not carry must be ignored: fill some.
        rec.setdefault("imm", {"imm": 0xDEADBEEF})
        rec["payload_len"] = len(payload)
        rec["meta"] = {"dst_mac": 0x02AABBCCDDEE, "dst_ip": 0x0A000002,
                       "udp_src_port": rng.randrange(0xC000, 1 << 16), "length": 0,
                       "ip_id": rng.getrandbits(16), "tos": 0}
        jobs.append((op, bth, rec, payload))
    return jobs


@pytest.mark.parametrize("width", [8, 64])
@pytest.mark.parametrize("idle,stall", SPEEDS)
def test_tx_builder(width, idle, stall):
    rng = seeded(500 + width + int(idle * 10))
    jobs = _tx_jobs(rng, 14)
    dut = RoceTxBuilder(width)
    out, cnt = [], {}

    async def feed_payload(ctx):
        beats = [beat for _, _, _, p in jobs if p for beat in packet_to_beats(p, width)]
        await stream_put(ctx, dut.payload, beats, idle=idle, rng=rng)

    async def main(ctx):
        await stream_put(ctx, dut.hdr, [rec for _, _, rec, _ in jobs], idle=idle, rng=rng)
        await ctx.tick().repeat(300)
        cnt["packets"] = ctx.get(dut.cnt_packets)
        cnt["bad"] = ctx.get(dut.cnt_bad_opcode)

    async def sink(ctx):
        await stream_collect(ctx, dut.o, out, backpressure=stall, rng=rng)

    run_sim(dut, main, [feed_payload, sink])
    got = split_packets(out, width)
    assert len(got) == len(jobs)
    assert cnt == {"packets": len(jobs), "bad": 1}
    for (pkt, first), (op, bth, rec, payload) in zip(got, jobs):
        assert first.meta.length == len(pkt) + 4
        if op not in OPCODE_EXTS:
            assert pkt[0] == op and len(pkt) == 12 + len(payload) + (-len(payload)) % 4
            continue
        # scapy dissects what we built (ICRC slot appended as 4 dummy octets).
        fields, exts, pay, _ = dissect_roce(pkt + b"\0\0\0\0")
        for s, v in bth.items():
            assert fields[s] == v, s
        assert fields["opcode"] == op and fields["padcount"] == (-len(payload)) % 4
        assert pay == payload
        assert pkt[len(pkt) - fields["padcount"]:] == bytes(fields["padcount"])
        assert set(exts) == {EXT_NAME[c] for c in OPCODE_EXTS[op]}
        for name, vals in exts.items():
            assert vals == rec[name], name


class _TxChain(wiring.Component):
    """RoceTxBuilder -> IcrcInsert -> EthIpTx."""

    def __init__(self, width):
        self._w = width
        super().__init__({"hdr": In(stream.Signature(RoceTxHeader)),
                          "payload": In(PacketStream(width)), "o": Out(PacketStream(width)),
                          "own_ip": In(32), "own_mac": In(48)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.b = b = RoceTxBuilder(self._w)
        m.submodules.c = c = IcrcInsert(self._w)
        m.submodules.e = e = EthIpTx(self._w)
        wiring.connect(m, wiring.flipped(self.hdr), b.hdr)
        wiring.connect(m, wiring.flipped(self.payload), b.payload)
        wiring.connect(m, b.o, c.i)
        wiring.connect(m, c.o, e.roce)
        wiring.connect(m, e.o, wiring.flipped(self.o))
        m.d.comb += [c.own_ip.eq(self.own_ip), e.own_ip.eq(self.own_ip),
                     e.own_mac.eq(self.own_mac), e.arp.valid.eq(0)]
        return m


@pytest.mark.parametrize("width", [8, 64])
def test_tx_chain_scapy(width):
    """Built frames re-parsed by scapy: fields equal, scapy's ICRC equals ours, IPv4 csum ok."""
    rng = seeded(900 + width)
    jobs = [j for j in _tx_jobs(rng, 10) if j[0] in OPCODE_EXTS]
    dut = _TxChain(width)
    idle, stall = 0.2, 0.2
    out = []

    async def feed_payload(ctx):
        beats = [beat for _, _, _, p in jobs if p for beat in packet_to_beats(p, width)]
        await stream_put(ctx, dut.payload, beats, idle=idle, rng=rng)

    async def main(ctx):
        ctx.set(dut.own_ip, 0x0A000001)
        ctx.set(dut.own_mac, 0x525400000001)
        await stream_put(ctx, dut.hdr, [rec for _, _, rec, _ in jobs], idle=idle, rng=rng)
        await ctx.tick().repeat(600 if width == 8 else 200)

    async def sink(ctx):
        await stream_collect(ctx, dut.o, out, backpressure=stall, rng=rng)

    run_sim(dut, main, [feed_payload, sink])
    got = [p for p, _ in split_packets(out, width)]
    assert len(got) == len(jobs)
    for f, (op, bth, rec, payload) in zip(got, jobs):
        e = Ether(f)
        assert e.dst == "02:aa:bb:cc:dd:ee" and e[IP].src == "10.0.0.1"
        ip2 = IP(f[14:34])
        del ip2.chksum
        assert IP(bytes(ip2)).chksum == e[IP].chksum
        assert e[UDP].len == len(f) - 34 and e[UDP].dport == 4791
        assert icrc_of(f) == f[-4:]
        fields, exts, pay, _ = dissect_roce(f[42:])
        assert fields["opcode"] == op and fields["psn"] == bth["psn"] and pay == payload


class _RxChain(wiring.Component):
    """EthIpRx -> IcrcCheck -> RoceRxParser."""

    def __init__(self, width):
        self._w = width
        super().__init__({"i": In(FrameStream(width)),
                          "hdr": Out(stream.Signature(RoceRxHeader)),
                          "payload": Out(PacketStream(width)),
                          "own_ip": In(32), "own_mac": In(48), "icrc_bad": Out(32)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.r = r = EthIpRx(self._w)
        m.submodules.c = c = IcrcCheck(self._w, depth=2048 if self._w == 8 else 256)
        m.submodules.p = p = RoceRxParser(self._w)
        wiring.connect(m, wiring.flipped(self.i), r.i)
        wiring.connect(m, r.roce, c.i)
        wiring.connect(m, c.o, p.i)
        wiring.connect(m, p.hdr, wiring.flipped(self.hdr))
        wiring.connect(m, p.payload, wiring.flipped(self.payload))
        m.d.comb += [r.own_ip.eq(self.own_ip), r.own_mac.eq(self.own_mac),
                     r.arp.ready.eq(1), self.icrc_bad.eq(c.cnt_bad)]
        return m


@pytest.mark.parametrize("width", [8, 64])
def test_rx_chain_pcap(width):
    """The 17 captured frames through EthIpRx -> IcrcCheck -> RoceRxParser (both directions),
    with one corrupted copy of each dropped by the ICRC check."""
    frames = pcap_roce_frames()
    for own_ip, own_mac in ((0x0A000001, 0x525400000001), (0x0A000002, 0x525400000002)):
        mine = [f for f in frames if int.from_bytes(f[30:34], "big") == own_ip]
        rng = seeded(own_ip + width)
        dut = _RxChain(width)
        idle, stall = 0.2, 0.2
        hdrs, pays, res = [], [], {}
        feed = []
        for f in mine:
            feed.append(f)
            bad = bytearray(f)
            # Any covered octet: frame octet 46 (BTH octet 4) is masked from the ICRC.
            bad[rng.choice([p for p in range(42, len(f)) if p != 46])] ^= 0x80
            feed.append(bytes(bad) + bytes(rng.choice([0, 6])))     # plus Ethernet padding

        async def main(ctx):
            ctx.set(dut.own_ip, own_ip)
            ctx.set(dut.own_mac, own_mac)
            beats = [beat for f in feed for beat in packet_to_beats(f, width)]
            await stream_put(ctx, dut.i, beats, idle=idle, rng=rng)
            await ctx.tick().repeat(1500 if width == 8 else 300)
            res["bad"] = ctx.get(dut.icrc_bad)

        async def sink_h(ctx):
            await stream_collect(ctx, dut.hdr, hdrs, backpressure=stall, rng=rng)

        async def sink_p(ctx):
            await stream_collect(ctx, dut.payload, pays, backpressure=stall, rng=rng)

        run_sim(dut, main, [sink_h, sink_p])
        assert res["bad"] == len(mine)
        assert len(hdrs) == len(mine)
        expect = [p for rec, f in zip(hdrs, mine) if (p := _check_record(rec, f[42:]))]
        assert [p for p, _ in split_packets(pays, width)] == expect

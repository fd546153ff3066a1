# Ref: roce-layouts.md §5 (ICRC coverage, masks, byte order); tests/data C2 capture (17 RoCEv2
#      frames sent by Linux rxe and by the hand-written peer).
"""IcrcCheck / IcrcInsert against scapy's ICRC (BTH.compute_icrc) and zlib, widths 8 and 64."""

import pytest
from scapy.layers.inet import IP, UDP

from hw.net.icrc import IcrcCheck, IcrcInsert, ICRC_PREFIX_STATE
from sim.hdl import packet_to_beats, run_through, split_packets
from sim.scapy_roce import (OPCODE_EXTS, icrc_of, pcap_roce_frames, random_ext_fields,
                            roce_frame, roce_rx_beats, rx_meta_of, seeded, zlib_icrc)

SPEEDS = [(0.0, 0.0), (0.3, 0.3)]
OWN_IP_S = "10.0.0.1"
OWN_IP = 0x0A000001


def test_prefix_constant_matches_zlib():
    # The register after 8 x 0xFF, inverted and reflected, is zlib's CRC of those octets.
    import zlib
    refl = int(f"{ICRC_PREFIX_STATE:032b}"[::-1], 2)
    assert refl ^ 0xFFFFFFFF == zlib.crc32(b"\xff" * 8)
    assert refl == 0xDEBB20E3          # the seed named in roce-layouts.md §5.2


def _check_run(width, items, idle, stall, depth=None):
    """Feed (beats) lists to IcrcCheck; return (output packets, counters)."""
    rng = seeded(width + int(idle * 10) + len(items))
    dut = IcrcCheck(width, depth=depth or (2048 if width == 8 else 256))
    got, cnt = run_through(dut, [b for beats in items for b in beats], {"o": dut.o},
                           settle=300 if width == 64 else 1500, idle=idle, stall=stall, rng=rng,
                           counters=("ok", "bad", "overflow"))
    return split_packets(got["o"], width), cnt


@pytest.mark.parametrize("width", [8, 64])
@pytest.mark.parametrize("idle,stall", SPEEDS)
def test_icrc_check_pcap(width, idle, stall):
    """All 17 captured frames pass; one corrupted octet fails; masked fields do not matter."""
    frames = pcap_roce_frames()
    assert len(frames) == 17
    rng = seeded(5)
    items, expect = [], []
    for k, f in enumerate(frames):
        meta = rx_meta_of(f)
        items.append(roce_rx_beats(f, width, meta))
        expect.append((f[42:42 + meta["udp_length"] - 8], meta))
        # Corrupt one covered octet (anywhere from the BTH to the ICRC, not BTH octet 4).
        body = bytearray(f)
        at = rng.choice([p for p in range(42, len(f)) if p != 46])
        body[at] ^= 1 << rng.randrange(8)
        items.append(roce_rx_beats(bytes(body), width, meta))
        if k % 4 == 0:
            # Masked fields: TTL, TOS (sideband) and BTH octet 4 (FECN/BECN) change, ICRC holds.
            m2 = dict(meta, ttl=meta["ttl"] ^ 0x3F, tos=0xB8)
            body = bytearray(f)
            body[46] ^= 0xC0
            items.append(roce_rx_beats(bytes(body), width, m2))
            expect.append((bytes(body[42:42 + meta["udp_length"] - 8]), m2))
        if k % 4 == 1:
            # The IPv4 identification is covered (§5.4): a new ID breaks the ICRC.
            items.append(roce_rx_beats(f, width, dict(meta, ip_id=meta["ip_id"] ^ 1)))
    got, cnt = _check_run(width, items, idle, stall)
    n_bad = len(items) - len(expect)
    assert [p for p, _ in got] == [p for p, _ in expect]
    for (_, first), (_, meta) in zip(got, expect):
        assert {k: int(getattr(first.meta, k)) for k in meta} == meta
    assert cnt == {"ok": len(expect), "bad": n_bad, "overflow": 0}


@pytest.mark.parametrize("width", [8, 64])
@pytest.mark.parametrize("idle,stall", SPEEDS)
def test_icrc_check_drops_packets_shorter_than_udp_length(width, idle, stall):
    """A frame cut short whose last four octets are the ICRC of what is left (IPv4 and UDP
    lengths still those of the whole packet) is dropped, and counted neither ok nor bad (EthIpRx
    counts it as truncated). Found by tools/fuzz.py: a WRITE First cut inside its RETH stopped
    the receive path. Cuts inside the BTH, inside the extended headers and inside the payload."""
    frames = [f for f in pcap_roce_frames() if len(f) - 42 > 40]
    rng = seeded(9)
    items, expect = [], []
    for k, f in enumerate(frames[:6]):
        meta = rx_meta_of(f)
        full = f[:42 + meta["udp_length"] - 8]
        for cut in (42 + 8, 42 + 12 + rng.randrange(1, 12), len(full) - 4 - rng.randrange(1, 9)):
            short = full[:cut]
            forged = short + zlib_icrc(short[14:])
            assert len(forged) - 42 < meta["udp_length"] - 8
            items.append(roce_rx_beats(forged, width, meta))
        items.append(roce_rx_beats(f, width, meta))          # the whole packet still passes
        expect.append(f[42:42 + meta["udp_length"] - 8])
    got, cnt = _check_run(width, items, idle, stall)
    assert [p for p, _ in got] == expect
    assert cnt == {"ok": len(expect), "bad": 0, "overflow": 0}


@pytest.mark.parametrize("width", [8, 64])
@pytest.mark.parametrize("idle,stall", SPEEDS)
def test_icrc_check_is_the_commit_point(width, idle, stall):
    """A packet whose frame the MAC found bad (``err`` on its last beat, issue 21's cut-through
    receive) is dropped although its ICRC is good, counted neither ok nor bad (the MAC counts
    it), and the next packet passes; nothing of it reaches the output."""
    frames = pcap_roce_frames()
    items, expect = [], []
    for k, f in enumerate(frames):
        meta = rx_meta_of(f)
        beats = roce_rx_beats(f, width, meta)
        if k % 3 == 1:
            beats[-1] = {**beats[-1], "err": 1}
        else:
            expect.append(f[42:42 + meta["udp_length"] - 8])
        items.append(beats)
    got, cnt = _check_run(width, items, idle, stall)
    assert [p for p, _ in got] == expect
    assert cnt == {"ok": len(expect), "bad": 0, "overflow": 0}
    assert len(expect) < len(frames)


@pytest.mark.parametrize("width", [8, 64])
def test_icrc_check_every_last_beat_length(width):
    """Packets of every length mod 8 (PadCnt 0, so not a multiple of 4: the last beat at width
    64 holds 1..8 octets), each with scapy's ICRC, and a copy with one octet flipped. A RoCE
    packet is always a multiple of 4 octets, so the pcap and random tests above only give the
    CRC unit last beats of 4 or 8 octets; these give it the others."""
    rng = seeded(5 + width)
    items, expect = [], []
    for size in range(0, 24):
        payload = bytes(rng.getrandbits(8) for _ in range(size))
        f = bytes(roce_frame(0x04, payload, pad=0, ip_id=rng.getrandbits(16)))
        assert zlib_icrc(f[14:-4]) == f[-4:]
        items.append(roce_rx_beats(f, width))
        expect.append(f[42:])
        bad = bytearray(f)
        bad[rng.randrange(54, len(f))] ^= 1 << rng.randrange(8)
        items.append(roce_rx_beats(bytes(bad), width))
    got, cnt = _check_run(width, items, 0.2, 0.2)
    assert [p for p, _ in got] == expect
    assert cnt == {"ok": len(expect), "bad": len(expect), "overflow": 0}


@pytest.mark.parametrize("width", [8, 64])
def test_icrc_check_random_and_overflow(width):
    """Random scapy-built packets of every opcode; one larger than the buffer is dropped."""
    rng = seeded(77 + width)
    depth = 128 if width == 8 else 16           # 128 octets of buffer either way
    items, expect = [], []
    for k in range(12):
        op = rng.choice(sorted(OPCODE_EXTS))
        size = 300 if k == 5 else rng.randrange(0, 40)
        payload = bytes(rng.getrandbits(8) for _ in range(size))
        ext = {cls: random_ext_fields(cls, rng) for cls in OPCODE_EXTS[op]}
        f = bytes(roce_frame(op, payload, ext=ext, ip_id=rng.getrandbits(16),
                             ttl=rng.randrange(1, 256), sport=rng.randrange(0xC000, 1 << 16)))
        assert zlib_icrc(f[14:-4]) == f[-4:]      # scapy and the page's recipe agree
        meta = rx_meta_of(f)
        items.append(roce_rx_beats(f, width, meta))
        if k != 5:
            expect.append((f[42:], meta))
    got, cnt = _check_run(width, items, 0.2, 0.2, depth=depth)
    assert [p for p, _ in got] == [p for p, _ in expect]
    # Each packet leaves with its own metadata (the side data is taken a cycle after its last
    # beat, when the next packet's may already wait at the input).
    for (_, first), (_, meta) in zip(got, expect):
        assert {k: int(getattr(first.meta, k)) for k in meta} == meta
    assert cnt == {"ok": 12, "bad": 0, "overflow": 1}


@pytest.mark.parametrize("width", [8, 64])
@pytest.mark.parametrize("idle,stall", SPEEDS)
def test_icrc_insert(width, idle, stall):
    """Appended ICRC equals scapy's for the frame EthIpTx will send around the packet."""
    rng = seeded(300 + width + int(idle * 10))
    dut = IcrcInsert(width)
    jobs = []
    for _ in range(10):
        op = rng.choice(sorted(OPCODE_EXTS))
        payload = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 45)))
        ext = {cls: random_ext_fields(cls, rng) for cls in OPCODE_EXTS[op]}
        ref = roce_frame(op, payload, ext=ext, src_ip=OWN_IP_S, dst_ip="10.1.2.3",
                         ip_id=rng.getrandbits(16), sport=rng.randrange(0xC000, 1 << 16),
                         tos=rng.getrandbits(8), bth={"fecn": rng.getrandbits(1),
                                                      "psn": rng.getrandbits(24)})
        f = bytes(ref)
        body = f[42:-4]
        meta = {"dst_mac": 0x020000000003, "dst_ip": 0x0A010203,
                "udp_src_port": ref[UDP].sport, "length": len(body) + 4,
                "ip_id": ref[IP].id, "tos": ref[IP].tos}
        jobs.append((body, meta, f))
    beats = [dict(beat, meta=meta)
             for body, meta, _ in jobs for beat in packet_to_beats(body, width)]
    out, _ = run_through(dut, beats, {"o": dut.o}, settle=200, idle=idle, stall=stall, rng=rng,
                         setup=[(dut.own_ip, OWN_IP)])
    got = split_packets(out["o"], width)
    assert len(got) == len(jobs)
    for (pkt, first), (body, meta, f) in zip(got, jobs):
        assert pkt[:-4] == body
        assert pkt[-4:] == icrc_of(f) == f[-4:]
        assert {k: int(getattr(first.meta, k)) for k in meta} == meta


@pytest.mark.parametrize("width", [8, 64])
def test_icrc_insert_every_last_beat_length(width):
    """The ICRC of packets of every length mod 8, not only the multiples of 4 that the IBTA pad
    gives: at width 64 the last beat then holds 1 to 8 octets, and IcrcInsert undoes each
    number of zero octets the CRC was fed past them (crc32_unpad: Z**-1, Z**-2 and Z**-4).
    Oracle: scapy's ICRC of the frame, its BTH announcing no pad."""
    rng = seeded(700 + width)
    op = next(o for o in sorted(OPCODE_EXTS) if not OPCODE_EXTS[o])
    jobs = []
    for n in range(16):
        payload = bytes(rng.getrandbits(8) for _ in range(n))
        ref = roce_frame(op, payload, src_ip=OWN_IP_S, dst_ip="10.1.2.3", pad=0,
                         ip_id=rng.getrandbits(16), sport=rng.randrange(0xC000, 1 << 16),
                         bth={"psn": rng.getrandbits(24)})
        f = bytes(ref)
        body = f[42:-4]
        assert len(body) == 12 + n
        meta = {"dst_mac": 0x020000000003, "dst_ip": 0x0A010203,
                "udp_src_port": ref[UDP].sport, "length": len(body) + 4,
                "ip_id": ref[IP].id, "tos": ref[IP].tos}
        jobs.append((body, meta, f))
    dut = IcrcInsert(width)
    beats = [dict(beat, meta=meta)
             for body, meta, _ in jobs for beat in packet_to_beats(body, width)]
    out, _ = run_through(dut, beats, {"o": dut.o}, settle=200, idle=0.2, stall=0.2, rng=rng,
                         setup=[(dut.own_ip, OWN_IP)])
    got = split_packets(out["o"], width)
    assert len(got) == len(jobs)
    for (pkt, _), (body, meta, f) in zip(got, jobs):
        assert pkt[:-4] == body
        assert pkt[-4:] == icrc_of(f) == f[-4:], (len(body), pkt[-4:].hex(), f[-4:].hex())

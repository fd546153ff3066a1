# Ref: roce-layouts.md §1 (Ethernet/IPv4/UDP for RoCEv2), §8 (ARP); drop reasons.
"""EthIpRx / EthIpTx against scapy-built and scapy-parsed frames, widths 8 and 64."""

import pytest
from scapy.layers.inet import IP, UDP, TCP, ICMP
from scapy.layers.inet6 import IPv6
from scapy.layers.l2 import ARP, Ether
from scapy.packet import Raw

from hw.net.ip import EthIpRx, EthIpTx
from sim.hdl import packet_to_beats, run_sim, run_through, split_packets, stream_collect, stream_put
from sim.scapy_roce import OPCODE_EXTS, random_ext_fields, roce_frame, seeded

OWN_MAC, OWN_MAC_S = 0x525400000001, "52:54:00:00:00:01"
OWN_IP, OWN_IP_S = 0x0A000001, "10.0.0.1"
PEER_MAC_S, PEER_IP_S = "52:54:00:00:00:02", "10.0.0.2"
SPEEDS = [(0.0, 0.0), (0.3, 0.3)]


def _mac(s):
    return int(s.replace(":", ""), 16)


def _ip(s):
    return int.from_bytes(bytes(int(x) for x in s.split(".")), "big")


def reference_class(frame):
    """Where a frame must go, decided with scapy from the drop rules of hw/net/ip.py (first failure wins)."""
    if len(frame) < 42:
        return "short"
    eth = Ether(frame)
    dst = eth.dst.lower()
    if eth.type == 0x0806:
        return "arp" if dst in (OWN_MAC_S, "ff:ff:ff:ff:ff:ff") else "mac"
    if eth.type != 0x0800:
        return "ethertype"
    if dst != OWN_MAC_S:
        return "mac"
    raw_ip = frame[14:34]
    if raw_ip[0] != 0x45 or (raw_ip[6] & 0x20) or (int.from_bytes(raw_ip[6:8], "big") & 0x1FFF):
        return "ip_format"
    s = sum(int.from_bytes(raw_ip[k:k + 2], "big") for k in range(0, 20, 2))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    if s != 0xFFFF:
        return "checksum"
    ip = eth[IP]
    if ip.dst != OWN_IP_S:
        return "ip"
    if ip.proto != 17:
        return "not_udp"
    udp_raw = frame[34:42]
    if int.from_bytes(udp_raw[2:4], "big") != 4791:
        return "port"
    ulen = int.from_bytes(udp_raw[4:6], "big")
    if ulen < 24 or ip.len != ulen + 20:
        return "length"
    return "roce"


def make_frames(rng, n):
    """A random mix of good RoCE frames, ARP, and every kind of frame that must be dropped."""
    frames = []
    kinds = ["roce", "roce", "roce", "roce_pad", "arp", "arp_unicast", "arp_other_mac",
             "mac", "ip", "checksum", "port", "tcp", "icmp", "ipv6", "frag", "options",
             "short", "truncated", "badlen"]
    for _ in range(n):
        kind = rng.choice(kinds)
        op = rng.choice(sorted(OPCODE_EXTS))
        payload = bytes(rng.getrandbits(8) for _ in range(rng.choice([0, 1, 5, 16, 37])))
        ext = {cls: random_ext_fields(cls, rng) for cls in OPCODE_EXTS[op]}
        kw = dict(dst_mac=OWN_MAC_S, src_mac=PEER_MAC_S, dst_ip=OWN_IP_S, src_ip=PEER_IP_S,
                  sport=rng.randrange(0xC000, 0x10000), ip_id=rng.getrandbits(16),
                  ttl=rng.randrange(1, 256), tos=rng.getrandbits(8))
        if kind == "mac":
            kw["dst_mac"] = "52:54:00:00:00:09"
        if kind == "ip":
            kw["dst_ip"] = "10.0.0.9"
        pkt = roce_frame(op, payload, ext=ext, **kw)
        if kind == "frag":
            pkt[IP].flags = "MF"
        f = bytes(pkt)
        if kind == "roce_pad":
            f = f + bytes(max(0, 60 - len(f)) + rng.choice([0, 3]))
        elif kind == "checksum":
            f = f[:24] + bytes([f[24] ^ 0x10]) + f[25:]
        elif kind == "port":
            p2 = pkt.copy()
            p2[UDP].dport = 4792
            f = bytes(p2)
        elif kind == "tcp":
            f = bytes(Ether(dst=OWN_MAC_S, src=PEER_MAC_S) / IP(dst=OWN_IP_S, src=PEER_IP_S)
                      / TCP(dport=4791) / Raw(payload))
        elif kind == "icmp":
            f = bytes(Ether(dst=OWN_MAC_S, src=PEER_MAC_S) / IP(dst=OWN_IP_S, src=PEER_IP_S)
                      / ICMP() / Raw(payload + bytes(20)))
        elif kind == "ipv6":
            f = bytes(Ether(dst=OWN_MAC_S, src=PEER_MAC_S) / IPv6() / UDP(dport=4791)
                      / Raw(payload + bytes(30)))
        elif kind == "options":
            f = bytes(Ether(dst=OWN_MAC_S, src=PEER_MAC_S)
                      / IP(dst=OWN_IP_S, src=PEER_IP_S, options=b"\x01\x01\x01\x00")
                      / UDP(dport=4791, chksum=0) / Raw(payload + bytes(30)))
        elif kind.startswith("arp"):
            edst = {"arp": "ff:ff:ff:ff:ff:ff", "arp_unicast": OWN_MAC_S,
                    "arp_other_mac": "52:54:00:00:00:07"}[kind]
            f = bytes(Ether(dst=edst, src=PEER_MAC_S) /
                      ARP(op=1, hwsrc=PEER_MAC_S, psrc=PEER_IP_S, pdst=OWN_IP_S))
            if rng.random() < 0.5:
                f += bytes(18)          # padded to 60 octets as on a real link
        elif kind == "short":
            f = f[:rng.randrange(1, 42)]
        elif kind == "truncated":
            f = f[:rng.randrange(42, len(f))] if len(f) > 43 else f[:42]
        elif kind == "badlen":
            # IPv4 total length disagrees with the UDP length (checksum made valid again).
            f = f[:16] + (int.from_bytes(f[16:18], "big") + 4).to_bytes(2, "big") + f[18:]
            f = f[:14] + _fix_csum(f[14:34]) + f[34:]
        frames.append((kind, f))
    return frames


def _fix_csum(iph):
    b = bytearray(iph)
    b[10:12] = b"\0\0"
    s = sum(int.from_bytes(b[k:k + 2], "big") for k in range(0, 20, 2))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    b[10:12] = (~s & 0xFFFF).to_bytes(2, "big")
    return bytes(b)


@pytest.mark.parametrize("width", [8, 64])
@pytest.mark.parametrize("idle,stall", SPEEDS)
def test_eth_ip_rx(width, idle, stall):
    rng = seeded(width * 7 + int(idle * 10))
    frames = make_frames(rng, 60 if width == 64 else 40)
    dut = EthIpRx(width)
    # A quarter of the frames come first with ``err`` on their last beat (a cut-through MAC's
    # verdict: bad FCS), then as they are: a RoCE packet carries it on its own last beat, an
    # ARP frame is not answered, and none of them is counted.
    doubled, bad = [], []
    for kf in frames:
        if rng.random() < 0.25:
            doubled.append(kf)
            bad.append(True)
        doubled.append(kf)
        bad.append(False)
    frames = doubled
    beats = []
    for (_, f), b in zip(frames, bad):
        fb = packet_to_beats(f, width)
        fb[-1] = {**fb[-1], "err": int(b)}
        beats += fb
    out, counters = run_through(dut, beats, {"roce": dut.roce, "arp": dut.arp}, settle=200,
                                idle=idle, stall=stall, rng=rng, counters=dut.COUNTERS,
                                setup=[(dut.own_mac, OWN_MAC), (dut.own_ip, OWN_IP)])
    roce_out, arp_out = out["roce"], out["arp"]

    expect_roce, expect_arp, expect_cnt = [], [], {c: 0 for c in EthIpRx.COUNTERS}
    expect_err = []
    for (kind, f), b in zip(frames, bad):
        cls = reference_class(f)
        expect_cnt[cls] += not b
        if cls == "roce":
            ulen = int.from_bytes(f[38:40], "big")
            expect_roce.append(f[42:42 + ulen - 8])
            expect_err.append(int(b))
            if len(f) < 42 + ulen - 8:
                expect_cnt["truncated"] += not b
        elif cls == "arp" and not b:
            expect_arp.append(f[:42])
        if kind != "truncated":
            assert cls == kind.split("_")[0] or kind in ("roce_pad", "arp_unicast",
                                                         "arp_other_mac", "tcp", "icmp",
                                                         "ipv6", "frag", "options", "badlen"), \
                (kind, cls)
    got_roce = split_packets(roce_out, width)
    assert [p for p, _ in got_roce] == expect_roce
    assert [p.err for p in roce_out if p.last] == expect_err and 0 < sum(expect_err)
    assert not any(p.err for p in roce_out if not p.last)
    assert [p for p, _ in split_packets(arp_out, width)] == expect_arp
    assert counters == expect_cnt
    # Sideband metadata equals scapy's reading of the same frames.
    good = [f for _, f in frames if reference_class(f) == "roce"]
    for (pkt, first), f in zip(got_roce, good):
        e = Ether(f)
        meta = first.meta
        assert meta.src_mac == _mac(e.src)
        assert meta.src_ip == _ip(e[IP].src) and meta.dst_ip == _ip(e[IP].dst)
        assert meta.ip_id == e[IP].id and meta.tos == e[IP].tos and meta.ttl == e[IP].ttl
        assert meta.ip_flags == int(e[IP].flags)
        assert meta.udp_src_port == e[UDP].sport and meta.udp_length == e[UDP].len
    # Every drop reason was exercised at least once (the mix is random, the seed fixed).
    for c in ("roce", "arp", "mac", "ip", "checksum", "port", "not_udp", "ethertype",
              "ip_format", "short"):
        assert expect_cnt[c] > 0, c


@pytest.mark.parametrize("width", [8, 64])
@pytest.mark.parametrize("idle,stall", SPEEDS)
def test_eth_ip_tx(width, idle, stall):
    rng = seeded(100 + width + int(idle * 10))
    dut = EthIpTx(width)
    jobs = []
    for k in range(14):
        if rng.random() < 0.3:
            f = bytes(Ether(dst=PEER_MAC_S, src=OWN_MAC_S) /
                      ARP(op=2, hwsrc=OWN_MAC_S, psrc=OWN_IP_S, hwdst=PEER_MAC_S,
                          pdst=PEER_IP_S))
            jobs.append(("arp", f, None))
        else:
            body = bytes(rng.getrandbits(8) for _ in range(rng.randrange(16, 90)))
            meta = {"dst_mac": rng.getrandbits(48) & ~(1 << 40), "dst_ip": rng.getrandbits(32),
                    "udp_src_port": rng.randrange(0xC000, 0x10000), "length": len(body),
                    "ip_id": rng.getrandbits(16), "tos": rng.getrandbits(8)}
            jobs.append(("roce", body, meta))
    out = []

    async def feed_roce(ctx):
        beats = []
        for kind, b, meta in jobs:
            if kind == "roce":
                beats += [dict(beat, meta=meta) for beat in packet_to_beats(b, width)]
        await stream_put(ctx, dut.roce, beats, idle=idle, rng=rng)

    async def main(ctx):
        ctx.set(dut.own_mac, OWN_MAC)
        ctx.set(dut.own_ip, OWN_IP)
        beats = [beat
                 for kind, f, _ in jobs if kind == "arp" for beat in packet_to_beats(f, width)]
        await stream_put(ctx, dut.arp, beats, idle=idle, rng=rng)
        await ctx.tick().repeat(1500 if width == 8 else 400)
        assert ctx.get(dut.cnt_arp) == sum(1 for j in jobs if j[0] == "arp")
        assert ctx.get(dut.cnt_roce) == sum(1 for j in jobs if j[0] == "roce")

    async def sink(ctx):
        await stream_collect(ctx, dut.o, out, backpressure=stall, rng=rng)

    run_sim(dut, main, [feed_roce, sink])
    frames = [p for p, _ in split_packets(out, width)]
    # Arbitration may reorder ARP against RoCE; each kind stays in order.
    got_arp = [f for f in frames if f[12:14] == b"\x08\x06"]
    got_roce = [f for f in frames if f[12:14] == b"\x08\x00"]
    assert got_arp == [f for kind, f, _ in jobs if kind == "arp"]
    roce_jobs = [(b, m) for kind, b, m in jobs if kind == "roce"]
    assert len(got_roce) == len(roce_jobs)
    for f, (body, meta) in zip(got_roce, roce_jobs):
        e = Ether(f)
        assert _mac(e.dst) == meta["dst_mac"] and e.src == OWN_MAC_S and e.type == 0x0800
        ip = e[IP]
        assert ip.version == 4 and ip.ihl == 5 and ip.tos == meta["tos"]
        assert ip.len == 20 + 8 + len(body) and ip.id == meta["ip_id"]
        assert ip.flags == "DF" and ip.frag == 0 and ip.ttl == 64 and ip.proto == 17
        assert ip.src == OWN_IP_S and _ip(ip.dst) == meta["dst_ip"]
        # scapy recomputes the checksum when the field is deleted: must equal ours.
        ip2 = IP(bytes(ip)[:20])
        del ip2.chksum
        assert IP(bytes(ip2)).chksum == ip.chksum
        udp = e[UDP]
        assert udp.sport == meta["udp_src_port"] and udp.dport == 4791
        assert udp.len == 8 + len(body) and udp.chksum == 0
        assert f[42:] == body

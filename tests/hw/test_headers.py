# Ref: docs/layouts.md (KBTP offsets); docs/roce-layouts.md §1-§4 (RoCEv2 headers).
"""Every layout of hw/headers.py against an oracle that does not share its code: scapy's packet bytes
for the network headers, struct.pack of the offsets in layouts.md for the KBTP structures, and the
draft's own example bytes."""

import random
import struct

import pytest
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import ARP, Ether
from scapy.contrib.roce import AETH as SAETH, BTH as SBTH

from hw import headers as H

rng = random.Random(1234)


def r(bits):
    return rng.getrandbits(bits)


def test_ethernet_matches_scapy():
    raw = bytes(Ether(dst="02:4b:42:54:50:01", src="52:54:00:12:34:56", type=0x0800))[:14]
    f = H.unpack(H.EthernetHeader, raw)
    assert f == {"dst": 0x024B42545001, "src": 0x525400123456, "ethertype": 0x0800}
    assert H.pack(H.EthernetHeader, **f) == raw


def test_arp_matches_scapy():
    raw = bytes(ARP(op=1, hwsrc="52:54:00:12:34:56", psrc="10.0.0.1", pdst="10.0.0.2"))
    f = H.unpack(H.ArpPacket, raw)
    assert (f["htype"], f["ptype"], f["hlen"], f["plen"], f["oper"]) == (1, 0x0800, 6, 4, 1)
    assert f["spa"] == 0x0A000001 and f["tpa"] == 0x0A000002 and f["sha"] == 0x525400123456
    assert H.pack(H.ArpPacket, **f) == raw


@pytest.mark.parametrize("seed", range(20))
def test_ipv4_udp_match_scapy(seed):
    rng.seed(seed)
    ip = IP(src=f"10.0.{r(8)}.{r(8)}", dst="10.0.0.2", tos=r(8), ttl=r(8), id=r(16), flags="DF",
            frag=0, proto=17)
    raw = bytes(ip / UDP(sport=0xC000 | r(14), dport=4791) / bytes(r(8) for _ in range(rng.randrange(40))))
    f = H.unpack(H.IPv4Header, raw)
    sip = IP(raw)
    assert f["version"] == 4 and f["ihl"] == 5 and f["flags"] == 2 and f["fragment_offset"] == 0
    assert f["tos"] == sip.tos and f["ttl"] == sip.ttl and f["identification"] == sip.id
    assert f["total_length"] == sip.len and f["checksum"] == sip.chksum
    assert H.pack(H.IPv4Header, **f) == raw[:20]
    u = H.unpack(H.UDPHeader, raw, 20)
    assert (u["src_port"], u["dst_port"], u["length"]) == (sip[UDP].sport, 4791, sip[UDP].len)


@pytest.mark.parametrize("seed", range(20))
def test_bth_aeth_match_scapy(seed):
    rng.seed(seed)
    vals = dict(opcode=r(8), solicited=r(1), migreq=r(1), padcount=r(2), version=r(4),
                pkey=r(16), fecn=r(1), becn=r(1), dqpn=r(24), ackreq=r(1), psn=r(24))
    raw = bytes(SBTH(**vals))[:12]
    f = H.unpack(H.BTH, raw)
    assert f["opcode"] == vals["opcode"] and f["se"] == vals["solicited"]
    assert f["migreq"] == vals["migreq"] and f["padcnt"] == vals["padcount"]
    assert f["tver"] == vals["version"] and f["pkey"] == vals["pkey"]
    assert f["fecn"] == vals["fecn"] and f["becn"] == vals["becn"]
    assert f["dest_qp"] == vals["dqpn"] and f["ackreq"] == vals["ackreq"] and f["psn"] == vals["psn"]
    assert H.pack(H.BTH, **f) == raw
    syn, msn = r(8), r(24)
    araw = bytes(SAETH(syndrome=syn, msn=msn))[:4]
    assert H.unpack(H.AETH, araw) == {"syndrome": syn, "msn": msn}


def test_captured_bth_example():
    # roce-layouts.md §2: C1#1068 BTH, RC SEND Only, DestQP 0x13, AckReq, PSN 0x785BBA.
    f = H.unpack(H.BTH, bytes.fromhex("0400ffff0000001380785bba"))
    assert f["opcode"] == H.BthOpcode.SEND_ONLY.value and f["pkey"] == 0xFFFF
    assert f["dest_qp"] == 0x13 and f["ackreq"] == 1 and f["psn"] == 0x785BBA


def test_extended_headers_against_layout_tables():
    # Offsets from roce-layouts.md §4, written out with struct as an independent oracle.
    va, rkey, ln = r(64), r(32), r(32)
    assert H.pack(H.RETH, va=va, rkey=rkey, dma_length=ln) == struct.pack(">QII", va, rkey, ln)
    sa, cmp = r(64), r(64)
    assert H.pack(H.AtomicETH, va=va, rkey=rkey, swap_add=sa, compare=cmp) == \
        struct.pack(">QIQQ", va, rkey, sa, cmp)
    assert H.pack(H.AtomicAckETH, orig_data=sa) == struct.pack(">Q", sa)
    assert H.pack(H.DETH, qkey=0x80010000, src_qp=1) == bytes.fromhex("8001000000000001")
    assert H.pack(H.ImmDt, imm=rkey) == H.pack(H.IETH, rkey=rkey) == struct.pack(">I", rkey)
    sizes = {H.RETH: 16, H.AETH: 4, H.AtomicETH: 28, H.AtomicAckETH: 8, H.ImmDt: 4, H.IETH: 4,
             H.DETH: 8, H.BTH: 12, H.IPv4Header: 20, H.UDPHeader: 8, H.EthernetHeader: 14,
             H.ArpPacket: 28}
    for s, n in sizes.items():
        assert H.size_of(s) == n, s.__name__


def test_kbtp_structures_against_layouts_md():
    v = [r(64) for _ in range(8)]
    cases = [
        (H.CommonHeader, dict(version=1, opcode=0x12, flags=v[0] & 0xFFFF, request_id=v[1], handle=v[2],
                              generation=v[3] & 0xFFFF, status=v[4] & 0xFFFF),
         struct.pack(">BBHQQHH", 1, 0x12, v[0] & 0xFFFF, v[1], v[2], v[3] & 0xFFFF, v[4] & 0xFFFF)),
        (H.DataDescriptor, dict(stag=v[0] >> 32, tagged_offset=v[1], length=v[2] >> 32),
         struct.pack(">IQI", v[0] >> 32, v[1], v[2] >> 32)),
        (H.HelloBody, dict(requested_features=3, completion_credits=16, initiator_id=(v[0] << 64) | v[1]),
         struct.pack(">HHQQ", 3, 16, v[0], v[1])),
        (H.HelloAckBody, dict(features=1, request_credits=8, block_size=32768, max_inline=4096,
                              allocation_quota=64, handle_base=v[0], handle_count=1024,
                              ticket_timeout_ms=500),
         struct.pack(">HHIIIQII", 1, 8, 32768, 4096, 64, v[0], 1024, 500)),
        (H.BindBody, dict(ticket=7, data_length=8, block_offset=v[0]), struct.pack(">IIQ", 7, 8, v[0])),
        (H.CompletionBody, dict(data_length=8, block_offset=0x150000),
         struct.pack(">IIQ", 8, 0, 0x150000)),
        (H.TableEntry, dict(flags=3, generation=5, data_length=8, block_offset=v[1]),
         struct.pack(">HHIQ", 3, 5, 8, v[1])),
        (H.RingSlot, dict(sequence=4, block_offset=H.SLOT_EMPTY), struct.pack(">IIQ", 4, 0, 2**64 - 1)),
        (H.CompletionRecord, dict(request_id=v[0], status=9, generation=2, data_length=64,
                                  block_offset=v[1]),
         struct.pack(">QHHIQ", v[0], 9, 2, 64, v[1])),
    ]
    for s, fields, expect in cases:
        assert H.pack(s, **fields) == expect, s.__name__
        assert {k: w for k, w in H.unpack(s, expect).items() if k in fields} == fields


def test_draft_alloc_store_example_header():
    raw = bytes.fromhex("011200010000000000000007000000000000400100000000")
    f = H.unpack(H.CommonHeader, raw)
    assert H.Opcode(f["opcode"]) is H.Opcode.ALLOC_STORE and H.ReqFlags(f["flags"]) is H.ReqFlags.INLINE
    assert f["request_id"] == 7 and f["handle"] == 0x4001


def test_gateware_view_equals_host_packing():
    # The gateware reads a header as a Struct view over the big-endian load; its const must be
    # the same integer the host's pack() produces.
    fields = dict(opcode=0x0A, se=1, padcnt=3, pkey=0xFFFF, dest_qp=0x123456, ackreq=1, psn=0xABCDEF)
    const = H.BTH.const(fields).as_value().value
    assert const == int.from_bytes(H.pack(H.BTH, **fields), "big")


def test_ring_mask_and_errors():
    assert H.ring_add_mask(2) == 0x8000000080000020  # the draft's N = 4 example
    with pytest.raises(ValueError):
        H.ring_add_mask(28)
    with pytest.raises(ValueError, match="does not fit"):
        H.pack(H.BTH, psn=1 << 24)
    with pytest.raises(KeyError):
        H.pack(H.BTH, nonsense=1)
    with pytest.raises(ValueError, match="needs 12 octets"):
        H.unpack(H.BTH, b"\x00" * 11)

# Ref: docs/roce-layouts.md §1 (Ethernet/IPv4/UDP framing), §2-§4 (BTH and extended
#      headers), §5 (ICRC), §8 (ARP); RFC 791/768 (checksums), RFC 826 (ARP).
"""RoCEv2 framing for the Python RC endpoint: build and parse whole Ethernet frames.

Every header is packed and unpacked with :mod:`hw.headers` (``pack`` / ``unpack``), so no
offset table is restated here. Frames are Ethernet II without FCS, exactly what the QEMU
socket and the cycle-driven simulation exchange.
"""

import enum
import ipaddress
import struct
import zlib
from dataclasses import dataclass, field

from hw.headers import (
    AETH, BTH, DETH, ETHERTYPE_ARP, ETHERTYPE_IPV4, EXT_HEADERS, IETH, ROCE_UDP_PORT, RETH,
    ArpPacket, AtomicAckETH, AtomicETH, BthOpcode, EthernetHeader, ImmDt, IPv4Header, UDPHeader,
    pack, unpack,
)

__all__ = [
    "PMTU_CODES", "QPState", "rxe_udp_sport",
    "mac_bytes", "mac_str", "ip_int", "ip_str", "ipv4_checksum", "icrc", "build_roce",
    "build_arp", "parse_frame", "RocePacket", "ArpInfo", "FrameError", "BROADCAST_MAC",
    "PSN_MASK", "psn_diff", "EXT_NAMES",
]

BROADCAST_MAC = b"\xff" * 6
PSN_MASK = 0xFFFFFF
_ICRC_PREFIX = b"\xff" * 8
_EXT_BY_OPCODE = {op.value: hdrs for op, hdrs in EXT_HEADERS.items()}
#: short names under which parsed extended headers appear in :attr:`RocePacket.ext`
EXT_NAMES = {RETH: "reth", AETH: "aeth", AtomicETH: "atomic", AtomicAckETH: "atomic_ack",
             ImmDt: "imm", IETH: "ieth", DETH: "deth"}


class FrameError(ValueError):
    """A frame this endpoint must drop; ``kind`` names the counter it is charged to."""

    def __init__(self, kind, msg=""):
        super().__init__(f"{kind}: {msg}" if msg else kind)
        self.kind = kind


def mac_bytes(mac):
    """``b'\\x52...'`` or ``'52:54:00:00:00:01'`` -> 6 octets."""
    if isinstance(mac, (bytes, bytearray)):
        if len(mac) != 6:
            raise ValueError("MAC must be 6 octets")
        return bytes(mac)
    return bytes(int(x, 16) for x in mac.replace("-", ":").split(":"))


def mac_str(mac):
    return ":".join(f"{b:02x}" for b in mac)


def ip_int(ip):
    """Dotted quad, int or 4 octets -> 32-bit int."""
    if isinstance(ip, int):
        return ip
    if isinstance(ip, (bytes, bytearray)):
        return int.from_bytes(ip, "big")
    return int(ipaddress.IPv4Address(ip))


def ip_str(ip):
    return str(ipaddress.IPv4Address(ip_int(ip)))


def psn_diff(a, b):
    """Signed 24-bit distance a - b (roce-layouts.md §6.1): > 0 means a is after b."""
    d = (a - b) & PSN_MASK
    return d - (1 << 24) if d & 0x800000 else d


def _ones_sum(data):
    if len(data) % 2:
        data += b"\x00"
    s = sum(struct.unpack(f">{len(data) // 2}H", data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return s


def ipv4_checksum(header):
    """RFC 791 header checksum of ``header`` (checksum field included as it is)."""
    return ~_ones_sum(bytes(header)) & 0xFFFF


def _udp_checksum_ok(ip_hdr, udp):
    pseudo = ip_hdr[12:20] + bytes([0, 17]) + struct.pack(">H", len(udp))
    return _ones_sum(pseudo + bytes(udp)) == 0xFFFF


def icrc(ip_to_pad):
    """ICRC octets for ``ip_to_pad`` = IPv4 header .. pad, the ICRC itself excluded (§5).

    The variant fields (TOS, TTL, IP checksum, UDP checksum, BTH octet 4) are replaced by
    ones and 8 octets of ones stand in for the LRH; the CRC goes on the wire LSB first.
    """
    m = bytearray(ip_to_pad)
    m[1] = 0xFF
    m[8] = 0xFF
    m[10:12] = b"\xff\xff"
    m[26:28] = b"\xff\xff"
    m[32] = 0xFF
    return struct.pack("<I", zlib.crc32(_ICRC_PREFIX + bytes(m)) & 0xFFFFFFFF)


def build_roce(src_mac, dst_mac, src_ip, dst_ip, sport, *, opcode, dest_qp, psn, ackreq=0,
               ext=b"", payload=b"", ip_id=0, tos=0, ttl=64, pkey=0xFFFF, se=0):
    """Build one RoCEv2 frame (Ethernet .. ICRC) with pad octets and both checksums.

    ``ext`` is the already-packed extended headers in wire order.
    """
    payload = bytes(payload)
    pad = (-len(payload)) % 4
    bth = pack(BTH, opcode=int(opcode), se=se, padcnt=pad, pkey=pkey, dest_qp=dest_qp,
               ackreq=1 if ackreq else 0, psn=psn & PSN_MASK)
    l4 = bth + ext + payload + b"\x00" * pad
    udp_len = 8 + len(l4) + 4
    udp = pack(UDPHeader, src_port=sport, dst_port=ROCE_UDP_PORT, length=udp_len, checksum=0)
    ip = bytearray(pack(IPv4Header, version=4, ihl=5, tos=tos, total_length=20 + udp_len,
                        identification=ip_id & 0xFFFF, flags=0b010, ttl=ttl, protocol=17,
                        src=ip_int(src_ip), dst=ip_int(dst_ip)))
    ip[10:12] = struct.pack(">H", ipv4_checksum(ip))
    body = bytes(ip) + udp + l4
    eth = pack(EthernetHeader, dst=int.from_bytes(dst_mac, "big"),
               src=int.from_bytes(src_mac, "big"), ethertype=ETHERTYPE_IPV4)
    return eth + body + icrc(body)


def build_arp(oper, src_mac, src_ip, target_mac, target_ip, eth_dst):
    """ARP request (oper 1) or reply (oper 2), 42 octets, no padding (as captured, §8)."""
    eth = pack(EthernetHeader, dst=int.from_bytes(eth_dst, "big"),
               src=int.from_bytes(src_mac, "big"), ethertype=ETHERTYPE_ARP)
    arp = pack(ArpPacket, htype=1, ptype=ETHERTYPE_IPV4, hlen=6, plen=4, oper=oper,
               sha=int.from_bytes(src_mac, "big"), spa=ip_int(src_ip),
               tha=int.from_bytes(target_mac, "big"), tpa=ip_int(target_ip))
    return eth + arp


@dataclass
class ArpInfo:
    oper: int
    sender_mac: bytes
    sender_ip: int
    target_mac: bytes
    target_ip: int


@dataclass
class RocePacket:
    """One parsed RoCEv2 packet; ``ext`` maps EXT_NAMES to the unpacked header dicts."""
    eth_dst: bytes
    eth_src: bytes
    src_ip: int
    dst_ip: int
    ip_id: int
    tos: int
    ttl: int
    sport: int
    opcode: int
    bth: dict
    ext: dict = field(default_factory=dict)
    payload: bytes = b""

    @property
    def psn(self):
        return self.bth["psn"]

    @property
    def dest_qp(self):
        return self.bth["dest_qp"]

    @property
    def ackreq(self):
        return self.bth["ackreq"]


def parse_frame(frame):
    """Parse an Ethernet frame (no FCS) -> ``('arp', ArpInfo)``, ``('roce', RocePacket)``
    or ``('other', None)``; raises :class:`FrameError` for a frame to drop and count.

    The ICRC is located from the UDP length, never from the frame end (§1.1), so Ethernet
    padding is tolerated.
    """
    frame = bytes(frame)
    if len(frame) < 14:
        raise FrameError("runt")
    eth = unpack(EthernetHeader, frame)
    dst, src = eth["dst"].to_bytes(6, "big"), eth["src"].to_bytes(6, "big")
    if eth["ethertype"] == ETHERTYPE_ARP:
        if len(frame) < 42:
            raise FrameError("runt")
        a = unpack(ArpPacket, frame, 14)
        if a["htype"] != 1 or a["ptype"] != ETHERTYPE_IPV4 or a["hlen"] != 6 or a["plen"] != 4:
            return "other", None
        return "arp", ArpInfo(a["oper"], a["sha"].to_bytes(6, "big"), a["spa"],
                              a["tha"].to_bytes(6, "big"), a["tpa"])
    if eth["ethertype"] != ETHERTYPE_IPV4 or len(frame) < 34:
        return "other", None
    iph = unpack(IPv4Header, frame, 14)
    if iph["version"] != 4 or iph["ihl"] != 5:
        return "other", None
    if ipv4_checksum(frame[14:34]) != 0:
        raise FrameError("ip_checksum")
    if iph["protocol"] != 17 or iph["flags"] & 1 or iph["fragment_offset"]:
        return "other", None
    tot = iph["total_length"]
    if tot < 28 or 14 + tot > len(frame):
        raise FrameError("length")
    udp = unpack(UDPHeader, frame, 34)
    if udp["dst_port"] != ROCE_UDP_PORT:
        return "other", None
    ulen = udp["length"]
    if ulen != tot - 20 or ulen < 8 + 12 + 4:
        raise FrameError("length")
    if udp["checksum"] and not _udp_checksum_ok(frame[14:34], frame[34:34 + ulen]):
        raise FrameError("udp_checksum")
    body = frame[14:14 + tot]
    if icrc(body[:-4]) != body[-4:]:
        raise FrameError("icrc")
    bth = unpack(BTH, body, 28)
    if bth["tver"] != 0:
        raise FrameError("bth", "TVer")
    op = bth["opcode"]
    hdrs = _EXT_BY_OPCODE.get(op)
    if hdrs is None:
        raise FrameError("opcode", f"{op:#x}")
    off, ext = 40, {}
    for h in hdrs:
        if off + h.SIZE > tot - 4:
            raise FrameError("length")
        ext[EXT_NAMES[h]] = unpack(h, body, off)
        off += h.SIZE
    pay_end = tot - 4 - bth["padcnt"]
    if pay_end < off:
        raise FrameError("length")
    return "roce", RocePacket(dst, src, iph["src"], iph["dst"], iph["identification"],
                              iph["tos"], iph["ttl"], udp["src_port"], op, bth, ext,
                              body[off:pay_end])


def opcode_name(op):
    try:
        return BthOpcode(op).name
    except ValueError:
        return f"{op:#04x}"


# Shared by the RC endpoint (roce/rc.py) and the CM (roce/cm.py).

#: CM / verbs MTU code -> PMTU in octets (§1.5)
PMTU_CODES = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}


def rxe_udp_sport(qpn_a, qpn_b, flow_label=0):
    """UDP source port rxe derives for an RC QP (§1.4): from the flow label, or when it is 0
    from a symmetric hash of the two QPNs."""
    if not flow_label:
        v = (qpn_a * qpn_b) & ((1 << 64) - 1)
        v ^= v >> 20
        v ^= v >> 40
        flow_label = v & 0xFFFFF
    return 0xC000 | ((flow_label & 0x3FFF) ^ (flow_label >> 14))


class QPState(enum.Enum):
    RESET = "RESET"
    INIT = "INIT"
    RTR = "RTR"
    RTS = "RTS"
    ERROR = "ERROR"

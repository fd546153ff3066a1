# Ref: roce-layouts.md §2-§4 (field layouts restated here on purpose, NOT from hw/headers.py, so
#      that tests have an oracle independent of the gateware's layouts); scapy.contrib.roce.
"""Test helpers shared by the network tests (others may reuse them).

- scapy layers missing from ``scapy.contrib.roce``: RETH, AtomicETH, AtomicAckETH, ImmDt, IETH,
  DETH (AETH and BTH come from scapy itself, which also computes the ICRC);
- :data:`OPCODE_EXTS`: the extended headers after the BTH per opcode (roce-layouts.md §3);
- :func:`roce_frame` to build complete Ether/IPv4/UDP/BTH/... frames, :func:`dissect_roce` to
  split BTH .. ICRC bytes with the scapy layers;
- captured frames (:func:`pcap_roce_frames`) and their receive sideband (:func:`rx_meta_of`,
  :func:`roce_rx_beats`).

The Amaranth-simulator stream helpers (beats, idles, back-pressure) are :mod:`sim.hdl`'s.
"""

import random

from scapy.fields import BitField, ByteField, IntField, XIntField, XLongField
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Packet, Raw
from scapy.contrib.roce import BTH, AETH

from roce.frames import icrc as zlib_icrc     # roce-layouts.md §5 recipe (masks, then zlib)
from sim.hdl import packet_to_beats
from sim.paths import DATA_DIR

__all__ = ["RETH", "AETH", "AtomicETH", "AtomicAckETH", "ImmDt", "IETH", "DETH", "BTH",
           "OPCODE_EXTS", "roce_frame", "dissect_roce", "icrc_of", "zlib_icrc", "seeded",
           "random_ext_fields", "EXT_NAME", "pcap_roce_frames", "rx_meta_of", "roce_rx_beats"]


class RETH(Packet):
    name = "RETH"
    fields_desc = [XLongField("va", 0), XIntField("rkey", 0), IntField("dma_length", 0)]


class AtomicETH(Packet):
    name = "AtomicETH"
    fields_desc = [XLongField("va", 0), XIntField("rkey", 0), XLongField("swap_add", 0),
                   XLongField("compare", 0)]


class AtomicAckETH(Packet):
    name = "AtomicAckETH"
    fields_desc = [XLongField("orig_data", 0)]


class ImmDt(Packet):
    name = "ImmDt"
    fields_desc = [XIntField("imm", 0)]


class IETH(Packet):
    name = "IETH"
    fields_desc = [XIntField("rkey", 0)]


class DETH(Packet):
    name = "DETH"
    fields_desc = [XIntField("qkey", 0), ByteField("reserved", 0), BitField("src_qp", 0, 24)]


for _cls in (RETH, AtomicETH, AtomicAckETH, ImmDt, IETH, DETH):
    # Nothing is bound after these layers: what follows is payload (+ pad).
    _cls.guess_payload_class = lambda self, payload: Raw

#: roce-layouts.md §3: headers after the BTH, in order.
OPCODE_EXTS = {
    0x00: (), 0x01: (), 0x02: (), 0x03: (ImmDt,), 0x04: (), 0x05: (ImmDt,),
    0x06: (RETH,), 0x07: (), 0x08: (), 0x09: (ImmDt,), 0x0A: (RETH,), 0x0B: (RETH, ImmDt),
    0x0C: (RETH,), 0x0D: (AETH,), 0x0E: (), 0x0F: (AETH,), 0x10: (AETH,), 0x11: (AETH,),
    0x12: (AETH, AtomicAckETH), 0x13: (AtomicETH,), 0x14: (AtomicETH,),
    0x16: (IETH,), 0x17: (IETH,), 0x64: (DETH,), 0x65: (DETH, ImmDt),
}

#: Header field names per scapy layer, as the gateware records name them.
EXT_NAME = {RETH: "reth", AETH: "aeth", AtomicETH: "atomic_eth", AtomicAckETH: "atomic_ack",
            ImmDt: "imm", IETH: "ieth", DETH: "deth"}


def random_ext_fields(cls, rng):
    """Random field values for one extended header layer."""
    out = {}
    for f in cls.fields_desc:
        bits = f.size if isinstance(f, BitField) else f.sz * 8
        out[f.name] = rng.getrandbits(bits)
    return out


def roce_frame(opcode, payload=b"", *, ext=None, bth=None, src_mac="52:54:00:00:00:02",
               dst_mac="52:54:00:00:00:01", src_ip="10.0.0.2", dst_ip="10.0.0.1",
               sport=55996, ip_id=0, ttl=64, tos=0, flags="DF", pad=None):
    """A complete RoCEv2 frame built by scapy (scapy computes IPv4 checksum and ICRC).

    ``ext`` maps layer class -> field dict; ``pad`` defaults to (-len(payload)) % 4 zero
    octets, announced in BTH PadCnt.
    """
    ext = ext or {}
    padn = (-len(payload)) % 4 if pad is None else pad
    bth_fields = {"opcode": opcode, "padcount": padn, "pkey": 0xFFFF, "dqpn": 0x11, "psn": 0}
    bth_fields.update(bth or {})
    p = BTH(**bth_fields)
    for cls in OPCODE_EXTS.get(opcode, ()):
        p = p / cls(**ext.get(cls, {}))
    body = payload + b"\x00" * padn
    if body:
        p = p / Raw(body)
    return (Ether(src=src_mac, dst=dst_mac) /
            IP(src=src_ip, dst=dst_ip, id=ip_id, ttl=ttl, tos=tos, flags=flags) /
            UDP(sport=sport, dport=4791, chksum=0) / p)


def dissect_roce(raw):
    """Split BTH .. ICRC octets with scapy: ``(bth_fields, {name: fields}, payload, icrc)``.

    ``payload`` excludes the pad announced in PadCnt and the ICRC.
    """
    raw = bytes(raw)
    bth = BTH(raw)
    fields = {k: bth.getfieldval(k) for k in ("opcode", "solicited", "migreq", "padcount",
                                                "version", "pkey", "fecn", "becn", "resv6",
                                                "dqpn", "ackreq", "resv7", "psn")}
    off, exts = 12, {}
    for cls in OPCODE_EXTS[fields["opcode"]]:
        size = len(cls())
        layer = cls(raw[off:off + size])
        exts[EXT_NAME[cls]] = {f.name: layer.getfieldval(f.name) for f in cls.fields_desc}
        off += size
    end = len(raw) - 4 - fields["padcount"]
    return fields, exts, raw[off:end], raw[-4:]


def icrc_of(frame):
    """ICRC octets recomputed by scapy for an Ether/IP/UDP/BTH frame given as bytes."""
    pkt = Ether(frame)
    b = pkt[BTH]
    return b.compute_icrc(None)


def seeded(seed):
    return random.Random(seed)


PCAP_C2 = str(DATA_DIR / "rxe-vs-host-peer-send-write-read-atomic.pcap")


def pcap_roce_frames(path=PCAP_C2):
    """The RoCEv2 frames (UDP port 4791) of a capture, as bytes."""
    from scapy.utils import rdpcap
    out = []
    for p in rdpcap(path):
        raw = bytes(p)
        if len(raw) >= 42 and raw[12:14] == b"\x08\x00" and raw[36:38] == b"\x12\xb7":
            out.append(raw)
    return out


def rx_meta_of(frame):
    """The receive sideband (``RoceRxMeta`` fields) of a frame, read with scapy."""
    e = Ether(frame)
    ip, udp = e[IP], e[UDP]

    def ip4(s):
        return int.from_bytes(bytes(int(x) for x in s.split(".")), "big")
    return {"src_mac": int(e.src.replace(":", ""), 16), "src_ip": ip4(ip.src),
            "dst_ip": ip4(ip.dst), "ip_id": ip.id, "ip_flags": int(ip.flags), "tos": ip.tos,
            "ttl": ip.ttl, "udp_src_port": udp.sport, "udp_length": udp.len}


def roce_rx_beats(frame, width, meta=None):
    """Beats of BTH .. ICRC of a frame (as EthIpRx emits them), metadata on every beat."""
    meta = meta or rx_meta_of(frame)
    body = frame[42:42 + meta["udp_length"] - 8]
    return [dict(b, meta=meta) for b in packet_to_beats(body, width)]

# Ref: IEEE 802.3 §3.1.1 (frame layout); scapy (the oracle for frame bytes).
"""Random Ethernet frames built by scapy, shared by the GMII and XGMII MAC benches."""

from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw

__all__ = ["random_frame"]


def random_frame(rng, length):
    """An Ethernet frame of ``length`` octets (no FCS) built by scapy: IPv4/UDP from 42 octets
    on, else a bare frame of an experimental EtherType (0x88B5)."""
    mac = lambda: ":".join(f"{rng.getrandbits(8) & (0xFE if i == 0 else 0xFF):02x}"
                           for i in range(6))
    if length >= 42:
        ip = lambda: ".".join(str(rng.randrange(1, 255)) for _ in range(4))
        pkt = (Ether(dst=mac(), src=mac()) / IP(src=ip(), dst=ip(), id=rng.getrandbits(16))
               / UDP(sport=rng.getrandbits(16), dport=rng.getrandbits(16))
               / Raw(rng.randbytes(length - 42)))
    else:
        pkt = Ether(dst=mac(), src=mac(), type=0x88B5) / Raw(rng.randbytes(length - 14))
    raw = bytes(pkt)
    assert len(raw) == length
    return raw

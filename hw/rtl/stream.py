# Ref: amaranth.lib.stream (Amaranth 0.5 docs, stdlib/stream.rst); house style shared/notes/style.md.
"""Packet streams used between every gateware block.

Amaranth 0.5 streams carry no framing, so the framing lives in the payload:

- ``data``: ``width`` bits, ``width // 8`` octet lanes. Lane 0 (``data[0:8]``) is the octet that
  is first on the wire, lane 1 the next, and so on (AXI-Stream lane order).
- ``keep``: one bit per lane. Every beat but the last of a packet has all lanes valid; the
  last beat has lanes ``0 .. k-1`` valid (contiguous from lane 0).
- ``last``: set on the final beat of a packet.

Blocks that parse headers load the octets MSB first (big-endian) so that the layouts of
:mod:`hw.headers` apply directly to the loaded value.
"""

from amaranth.lib import data, stream

__all__ = ["packet_layout", "PacketStream"]


def packet_layout(width):
    if width % 8 or width <= 0:
        raise ValueError(f"datapath width {width} is not a positive multiple of 8")
    return data.StructLayout({"data": width, "keep": width // 8, "last": 1})


def PacketStream(width):
    """``stream.Signature`` of a packet stream ``width`` bits wide (8, 16, 32, 64, ...)."""
    return stream.Signature(packet_layout(width))

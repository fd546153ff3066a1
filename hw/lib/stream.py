# Ref: amaranth.lib.stream (Amaranth 0.5 docs, stdlib/stream.rst); docs/style.md.
"""Packet streams used between every gateware block.

Amaranth 0.5 streams carry no framing, so the framing lives in the payload:

- ``data``: ``width`` bits, ``width // 8`` octet lanes. Lane 0 (``data[0:8]``) is the octet that
  is first on the wire, lane 1 the next, and so on (AXI-Stream lane order).
- ``keep``: one bit per lane. Every beat but the last of a packet has all lanes valid; the
  last beat has lanes ``0 .. k-1`` valid (contiguous from lane 0).
- ``last``: set on the final beat of a packet.

A received frame may be passed on before its end is checked (the MAC's cut-through receive,
issue 21): a :func:`FrameStream` adds ``err``, meaningful on the last beat only. A consumer
takes no action a frame with ``err`` could cause (it drops the frame; what it already passed on
carries the verdict on, as :class:`hw.net.ip.EthIpRx` does with the RoCE packet's own ``err``).

Blocks that parse headers load the octets MSB first (big-endian) so that the layouts of
:mod:`hw.headers` apply directly to the loaded value.
"""

from amaranth.hdl import Const, Module, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = ["packet_layout", "PacketStream", "frame_layout", "FrameStream", "frame_from_packets",
           "keep_count", "RecordMerge", "RegisterSlice",
           "FrameMux"]


def packet_layout(width):
    if width % 8 or width <= 0:
        raise ValueError(f"datapath width {width} is not a positive multiple of 8")
    return data.StructLayout({"data": width, "keep": width // 8, "last": 1})


def PacketStream(width):
    """``stream.Signature`` of a packet stream ``width`` bits wide (8, 16, 32, 64, ...)."""
    return stream.Signature(packet_layout(width))


def frame_layout(width):
    """A received frame's beat: :func:`packet_layout` and ``err`` (on the last beat: drop the
    frame, its FCS or length was bad or it overflowed the MAC's buffer)."""
    return data.StructLayout({**dict(packet_layout(width).members), "err": 1})


def FrameStream(width):
    """``stream.Signature`` of received frames (:func:`frame_layout`), ``width`` bits wide."""
    return stream.Signature(frame_layout(width))


def frame_from_packets(m, src, dst):
    """Connect ``src``, a :func:`PacketStream` of frames a MAC has already checked whole
    (store-and-forward), to ``dst``, a :func:`FrameStream`: ``err`` is 0."""
    m.d.comb += [dst.valid.eq(src.valid), src.ready.eq(dst.ready),
                 dst.p.data.eq(src.p.data), dst.p.keep.eq(src.p.keep),
                 dst.p.last.eq(src.p.last), dst.p.err.eq(0)]


def keep_count(keep):
    """Number of valid lanes of a ``keep`` mask (contiguous from lane 0, as on every beat), as a
    value of ``range(len(keep) + 1)``."""
    return sum((keep[j] for j in range(len(keep))), Const(0, range(len(keep) + 1)))


class RecordMerge(wiring.Component):
    """Round-robin merge of ``n`` streams of one-beat records into one.

    amaranth.lib.stream has no arbiter, hence this one. Each record is one beat, so the choice
    can change every cycle; the output register makes every output a flop (one record per cycle
    sustained when the consumer is always ready). ``tag`` (optional) names a field of the layout
    whose most significant bit is overwritten with the source index (``n == 2``): the KBTP target
    uses it to send each WorkCompletion back to whoever posted the WorkRequest.

    Ports
    -----
    i : In(stream.Signature(layout)).array(n)
    o : Out(stream.Signature(layout))
    """

    def __init__(self, layout, n=2, *, tag=None):
        self.layout, self.n, self.tag = layout, n, tag
        if tag is not None and n != 2:
            raise ValueError("tagging needs exactly two sources")
        super().__init__({"i": In(stream.Signature(layout)).array(n),
                          "o": Out(stream.Signature(layout))})

    def elaborate(self, platform):
        m = Module()
        n = self.n
        last = Signal(range(n))
        pick = Signal(range(n))
        found = Signal()
        # Search order: last+1, last+2, ..., last (round robin).
        for k in reversed(range(n)):
            for j in range(n):
                with m.If((last == j) & self.i[(j + 1 + k) % n].valid):
                    m.d.comb += [pick.eq((j + 1 + k) % n), found.eq(1)]
        take = Signal()
        m.d.comb += take.eq(found & (~self.o.valid | self.o.ready))
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += self.o.valid.eq(0)
        for j in range(n):
            m.d.comb += self.i[j].ready.eq(take & (pick == j))
            with m.If(take & (pick == j)):
                m.d.sync += [self.o.payload.eq(self.i[j].payload), self.o.valid.eq(1),
                             last.eq(j)]
                if self.tag is not None:
                    field = getattr(self.o.payload, self.tag)
                    m.d.sync += field[-1].eq(j)
        return m


class RegisterSlice(wiring.Component):
    """A full-throughput register stage (skid buffer) for a :func:`PacketStream`.

    Every output and ``i.ready`` come straight from flops, so a long combinational path on one
    side (e.g. a FIFO's block-RAM read data decoded by a header parser) no longer adds up with
    the other side's. Latency one cycle; one beat per cycle sustained.

    Ports
    -----
    i : In(PacketStream(width)), o : Out(PacketStream(width))
        or, with ``signature`` (any :class:`amaranth.lib.stream.Signature`, e.g. a stream of
        :func:`hw.net.ip.roce_rx_layout` with its metadata), streams of that signature.
    """

    def __init__(self, width=None, *, signature=None):
        sig = signature if signature is not None else PacketStream(width)
        super().__init__({"i": In(sig), "o": Out(sig)})

    def elaborate(self, platform):
        m = Module()
        skid = Signal.like(self.i.payload)
        skid_valid = Signal()
        m.d.comb += self.i.ready.eq(~skid_valid)
        with m.If(self.o.ready | ~self.o.valid):
            with m.If(skid_valid):
                m.d.sync += [self.o.payload.eq(skid), self.o.valid.eq(1), skid_valid.eq(0)]
            with m.Else():
                m.d.sync += [self.o.payload.eq(self.i.payload), self.o.valid.eq(self.i.valid)]
        with m.Elif(self.i.valid & ~skid_valid):
            # Output stalled: park the beat the input offered (ready was high) in the skid.
            m.d.sync += [skid.eq(self.i.payload), skid_valid.eq(1)]
        return m


class FrameMux(wiring.Component):
    """Merge ``n`` packet streams into one, a whole packet at a time, round robin.

    Ports
    -----
    i : In(PacketStream(width)).array(n)
    o : Out(PacketStream(width))
    """

    def __init__(self, width, n=2):
        self.n = n
        super().__init__({"i": In(PacketStream(width)).array(n), "o": Out(PacketStream(width))})

    def elaborate(self, platform):
        m = Module()
        n = self.n
        busy = Signal()
        sel = Signal(range(n))
        prev = Signal(range(n))              # source of the last packet: lowest priority next
        cur = Signal(range(n))
        with m.If(busy):
            m.d.comb += cur.eq(sel)
        with m.Else():
            # First valid source after ``prev`` in round-robin order.
            m.d.comb += cur.eq(prev)
            for off in reversed(range(1, n + 1)):
                j = Signal(range(n), name=f"rr{off}")
                m.d.comb += j.eq((prev + off) % n)
                for s in range(n):
                    with m.If((j == s) & self.i[s].valid):
                        m.d.comb += cur.eq(s)
        for s in range(n):
            with m.If(cur == s):
                m.d.comb += [self.o.valid.eq(self.i[s].valid), self.o.payload.eq(self.i[s].payload),
                             self.i[s].ready.eq(self.o.ready)]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += [busy.eq(~self.o.p.last), sel.eq(cur)]
            with m.If(self.o.p.last):
                m.d.sync += prev.eq(cur)
        return m

# Ref: docs/style.md (streams: lane 0 is the first octet on the wire); hw/lib/stream.py
#      (PacketStream); issue 19 (general blocks in hw/lib).
"""Width-generic octet helpers every network block shares: octet slicing of a beat, header
capture over a stream, and :class:`OctetPacker`, the one realignment engine used wherever octets
are stripped, prepended or appended in a :func:`~hw.lib.stream.PacketStream`.

Conventions (see :mod:`hw.lib.stream`): lane 0 of ``data`` is the first octet on the wire.
A header value is the big-endian load of its octets, so the layouts of :mod:`hw.headers` apply.
"""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.lib.stream import keep_count, packet_layout

__all__ = ["octets_be", "be_value", "lanes", "lane_region", "HeaderCapture", "OctetPacker"]


# --------------------------------------------------------------------------------------------
# Octet helpers
# --------------------------------------------------------------------------------------------

def octets_be(value, n):
    """Octets of a big-endian ``n``-octet value, in wire order (first octet first)."""
    return [value[(n - 1 - p) * 8:(n - p) * 8] for p in range(n)]


def be_value(octets):
    """Big-endian value of octets given in wire order (inverse of :func:`octets_be`)."""
    return Cat(*reversed(octets))


def lanes(bits, n_lanes):
    """The ``n_lanes`` octets of a beat, lane 0 (first on the wire) first."""
    return [bits[i * 8:(i + 1) * 8] for i in range(n_lanes)]


def _signed(v):
    """Zero-extend a value by one bit and read it as signed, so that differences are signed."""
    v = Value.cast(v)
    return Cat(v, Const(0, 1)).as_signed()


def lane_region(m, pos, start, end, n_lanes, name):
    """Lanes of the beat at octet position ``pos`` that fall into octets ``[start, end)``.

    Returns ``(lo, n, reaches_end)``: the first lane inside the region, the number of lanes
    inside it, and whether the region ends inside (or exactly at the end of) this beat.
    ``start``/``end`` may be constants or signals; all arithmetic is on wide signed values so
    that beats wholly before or after the region give ``n = 0``.
    """
    w = 20
    rel_s = Signal(signed(w), name=f"{name}_rs")
    rel_e = Signal(signed(w), name=f"{name}_re")
    lo = Signal(range(n_lanes + 1), name=f"{name}_lo")
    hi = Signal(range(n_lanes + 1), name=f"{name}_hi")
    n = Signal(range(n_lanes + 1), name=f"{name}_n")
    reaches = Signal(name=f"{name}_end")
    m.d.comb += [
        rel_s.eq(_signed(start) - _signed(pos)),
        rel_e.eq(_signed(end) - _signed(pos)),
        lo.eq(Mux(rel_s <= 0, 0, Mux(rel_s >= n_lanes, n_lanes, rel_s))),
        hi.eq(Mux(rel_e <= 0, 0, Mux(rel_e >= n_lanes, n_lanes, rel_e))),
        n.eq(Mux(hi > lo, hi - lo, 0)),
        reaches.eq(rel_e <= n_lanes),
    ]
    return lo, n, reaches


class HeaderCapture:
    """Capture the first ``n`` octets of a packet from a stream, beat by beat.

    Not a component: call :meth:`add` inside the owner's ``elaborate``. ``pos`` is the octet
    position of lane 0 of the current beat and ``fire`` the beat's handshake.

    Attributes after :meth:`add`
    ----------------------------
    reg : list of Signal(8)
        Octets captured by earlier beats (registered).
    now : list of Value
        Octets as seen including the current beat: the header is complete in the beat that
        carries its last octet, without waiting a cycle.
    """

    def __init__(self, n, width, name="hdr"):
        self.n = n
        self.width = width
        self.name = name

    def add(self, m, pos, beat_data, fire):
        n_lanes = self.width // 8
        self.reg = [Signal(8, name=f"{self.name}{p}") for p in range(self.n)]
        self.now = []
        beat = lanes(beat_data, n_lanes)
        for p in range(self.n):
            here = pos == (p // n_lanes) * n_lanes
            with m.If(fire & here):
                m.d.sync += self.reg[p].eq(beat[p % n_lanes])
            self.now.append(Mux(here, beat[p % n_lanes], self.reg[p]))
        return self

    def value(self, start, size, *, now=True):
        """Big-endian value of octets ``[start, start + size)``."""
        src = self.now if now else self.reg
        return be_value(src[start:start + size])


# --------------------------------------------------------------------------------------------
# OctetPacker: the one realignment engine
# --------------------------------------------------------------------------------------------

class OctetPacker(wiring.Component):
    """Compact octets from arbitrary lane windows into a dense :func:`PacketStream`.

    Each input beat names a contiguous window of its lanes (``lo`` .. ``lo + n - 1``) whose
    octets follow, in order, the octets already buffered. The output is dense: every beat full
    but the last of a packet. Stripping a header, prepending or appending octets and trimming
    to a length are all "choose the window per beat" in the producer; this block does the
    variable shift. Throughput is one beat per cycle.

    A packet whose windows hold no octet at all produces no output (empty packets vanish).

    Parameters
    ----------
    width : int
        Datapath width in bits (multiple of 8).
    side : shape or None
        Optional side data (e.g. metadata) carried along; the value of the most recently
        accepted input beat is presented with every output beat of the packet.

    Ports
    -----
    i : In(stream) with payload ``{data, lo, n, last[, side]}``
    o : Out(stream) with payload ``{data, keep, last[, side]}``
    """

    def __init__(self, width, side=None):
        self._width = width
        self._lanes = width // 8
        self._side = side
        in_fields = {"data": width, "lo": range(self._lanes + 1), "n": range(self._lanes + 1),
                     "last": 1}
        out_fields = dict(packet_layout(width).members)
        if side is not None:
            in_fields["side"] = side
            out_fields["side"] = side
        super().__init__({
            "i": In(stream.Signature(data.StructLayout(in_fields))),
            "o": Out(stream.Signature(data.StructLayout(out_fields))),
        })

    def forward(self, m, s, *, last=None, side=None):
        """Pass the packet stream ``s`` into ``i`` beat for beat: the kept lanes of each beat,
        from lane 0. Comb statements of the parent module ``m``, under its current conditions
        (e.g. the FSM state that forwards ``s``). ``last`` replaces ``s.p.last``; ``side`` sets
        the side data."""
        m.d.comb += [
            self.i.valid.eq(s.valid),
            self.i.p.data.eq(s.p.data),
            self.i.p.lo.eq(0),
            self.i.p.n.eq(keep_count(s.p.keep)),
            self.i.p.last.eq(s.p.last if last is None else last),
            s.ready.eq(self.i.ready),
        ]
        if side is not None:
            m.d.comb += self.i.p.side.eq(side)

    def elaborate(self, platform):
        m = Module()
        w, nl = self._width, self._lanes
        buf = Signal(2 * w)
        cnt = Signal(range(2 * nl + 1))
        pend = Signal()     # the packet's last input beat is buffered: flush, accept nothing

        full = cnt >= nl
        m.d.comb += [
            self.o.valid.eq(full | (pend & (cnt != 0))),
            self.o.p.data.eq(buf[:w]),
            self.o.p.keep.eq(Cat(*[cnt > j for j in range(nl)])),
            self.o.p.last.eq(pend & (cnt <= nl)),
        ]
        if self._side is not None:
            side_r = Signal(self._side)
            m.d.comb += self.o.p.side.eq(side_r)

        o_fire = self.o.valid & self.o.ready
        buf1 = Signal(2 * w)
        cnt1 = Signal(range(2 * nl + 1))
        pend1 = Signal()
        with m.If(o_fire & self.o.p.last):
            m.d.comb += [buf1.eq(0), cnt1.eq(0)]
        with m.Elif(o_fire):
            m.d.comb += [buf1.eq(buf >> w), cnt1.eq(cnt - nl)]
        with m.Else():
            m.d.comb += [buf1.eq(buf), cnt1.eq(cnt)]
        # An input "last" with nothing buffered is an empty packet: drop the flag at once.
        m.d.comb += pend1.eq(pend & ~(o_fire & self.o.p.last) & (cnt != 0))
        m.d.comb += self.i.ready.eq(~pend1 & (cnt1 < nl))

        i_fire = self.i.valid & self.i.ready
        mask = Cat(*[Mux(self.i.p.n > j, 0xFF, 0x00) for j in range(nl)])
        window = (self.i.p.data >> (self.i.p.lo * 8))[:w] & mask
        shifted = (window << (cnt1 * 8))[:2 * w]
        with m.If(i_fire):
            m.d.sync += [buf.eq(buf1 | shifted), cnt.eq(cnt1 + self.i.p.n),
                         pend.eq(self.i.p.last)]
            if self._side is not None:
                m.d.sync += side_r.eq(self.i.p.side)
        with m.Else():
            m.d.sync += [buf.eq(buf1), cnt.eq(cnt1), pend.eq(pend1)]
        return m

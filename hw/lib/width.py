# Ref: hw/lib/stream.py (PacketStream lanes/keep/last); amaranth docs stdlib/stream.rst.
"""Packet stream width converters (the packet FIFO is :class:`hw.lib.fifo.PacketFifo`).

- :class:`StreamUpsizer` joins ``n`` narrow beats into one wide beat (8 -> 64 etc.).
- :class:`StreamDownsizer` splits a wide beat into narrow beats (64 -> 8 etc.).

Both keep one beat per cycle on either side when the other side keeps up.
"""

from amaranth import Array, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.lib.stream import PacketStream, packet_layout

__all__ = ["StreamUpsizer", "StreamDownsizer"]


class _Sizer(wiring.Component):
    """What both converters share: the ports, the width check, and 1:1 as a plain connection;
    a subclass builds the conversion in ``_convert(m)``."""

    def __init__(self, i_width, o_width, narrow, wide):
        if wide % narrow or wide < narrow:
            raise ValueError(f"width {wide} is not a multiple of {narrow}")
        self._n = wide // narrow
        self._iw, self._ow = i_width, o_width
        super().__init__({"i": In(PacketStream(i_width)), "o": Out(PacketStream(o_width))})

    def elaborate(self, platform):
        m = Module()
        if self._n == 1:
            wiring.connect(m, wiring.flipped(self.i), wiring.flipped(self.o))
        else:
            self._convert(m)
        return m


class StreamUpsizer(_Sizer):
    """``PacketStream(i_width)`` -> ``PacketStream(o_width)``, ``o_width = n * i_width``.

    Narrow beat ``j`` of a group lands in chunk ``j`` of the wide beat (lane order kept). A wide
    beat leaves when all ``n`` chunks are filled or on ``last``; its keep is the concatenation of
    the narrow keeps (zero for unfilled chunks), so a partial last beat stays contiguous.

    The assembling register doubles as the output register: a new narrow beat is accepted in
    the same cycle the finished wide beat leaves, so the narrow side runs at one beat per cycle.

    Parameters
    ----------
    i_width, o_width : int
        Narrow and wide data widths in bits (multiples of 8; ``o_width % i_width == 0``).

    Ports
    -----
    i : In(PacketStream(i_width))
    o : Out(PacketStream(o_width))
    """

    def __init__(self, i_width=8, o_width=64):
        super().__init__(i_width, o_width, i_width, o_width)

    def _convert(self, m):
        n, iw, ilanes = self._n, self._iw, self._iw // 8
        data_ = Signal(self._ow)
        keep = Signal(self._ow // 8)
        last = Signal()
        full = Signal()                     # wide beat complete (o.valid)
        idx = Signal(range(n))              # next chunk to fill

        m.d.comb += [
            self.o.valid.eq(full),
            self.o.payload.data.eq(data_),
            self.o.payload.keep.eq(keep),
            self.o.payload.last.eq(last),
            self.i.ready.eq(~full | self.o.ready),
        ]

        with m.If(self.o.valid & self.o.ready):
            m.d.sync += full.eq(0)

        with m.If(self.i.valid & self.i.ready):
            # Starting a new wide beat (idx == 0) clears the stale chunks of the previous one.
            for j in range(n):
                with m.If(idx == j):
                    m.d.sync += [
                        data_[j * iw:(j + 1) * iw].eq(self.i.payload.data),
                        keep[j * ilanes:(j + 1) * ilanes].eq(self.i.payload.keep),
                    ]
                    if j == 0:
                        m.d.sync += keep[ilanes:].eq(0)
            m.d.sync += last.eq(self.i.payload.last)
            with m.If(self.i.payload.last | (idx == n - 1)):
                m.d.sync += [full.eq(1), idx.eq(0)]
            with m.Else():
                m.d.sync += idx.eq(idx + 1)


class StreamDownsizer(_Sizer):
    """``PacketStream(i_width)`` -> ``PacketStream(o_width)``, ``i_width = n * o_width``.

    A wide beat is held and its chunks leave one per cycle, lowest lane first; the chunk holding
    the highest kept lane of a ``last`` beat carries ``last`` and the chunks above it are skipped.
    The next wide beat is taken in the same cycle as the final chunk of the held one, so the
    narrow side runs at one beat per cycle.

    Parameters
    ----------
    i_width, o_width : int
        Wide and narrow data widths in bits.

    Ports
    -----
    i : In(PacketStream(i_width))
    o : Out(PacketStream(o_width))
    """

    def __init__(self, i_width=64, o_width=8):
        super().__init__(i_width, o_width, o_width, i_width)

    def _convert(self, m):
        n, ow, olanes = self._n, self._ow, self._ow // 8
        held = Signal(packet_layout(self._iw))
        have = Signal()
        idx = Signal(range(n))
        # Index of the final chunk of the held beat: n-1, or the highest chunk with a kept lane.
        final_idx = Signal(range(n))
        with m.If(held.last):
            for j in range(n):
                with m.If(held.keep[j * olanes:(j + 1) * olanes].any()):
                    m.d.comb += final_idx.eq(j)
        with m.Else():
            m.d.comb += final_idx.eq(n - 1)
        at_final = Signal()
        m.d.comb += at_final.eq(idx == final_idx)

        chunks_d = [held.data[j * ow:(j + 1) * ow] for j in range(n)]
        chunks_k = [held.keep[j * olanes:(j + 1) * olanes] for j in range(n)]
        m.d.comb += [
            self.o.valid.eq(have),
            self.o.payload.data.eq(Array(chunks_d)[idx]),
            self.o.payload.keep.eq(Array(chunks_k)[idx]),
            self.o.payload.last.eq(held.last & at_final),
            self.i.ready.eq(~have | (self.o.ready & at_final)),
        ]

        with m.If(self.o.valid & self.o.ready):
            with m.If(at_final):
                m.d.sync += [have.eq(0), idx.eq(0)]
            with m.Else():
                m.d.sync += idx.eq(idx + 1)
        with m.If(self.i.valid & self.i.ready):
            m.d.sync += [held.eq(self.i.payload), have.eq(1), idx.eq(0)]

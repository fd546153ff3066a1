# Ref: hw/lib/stream.py (PacketStream lanes/keep/last); amaranth docs stdlib/stream.rst,
#      stdlib/memory.rst; IEEE 802.3 §4.2.9 (a receiver discards frames with a bad FCS).
"""Packet stream width converters and a packet FIFO with commit/discard.

- :class:`StreamUpsizer` joins ``n`` narrow beats into one wide beat (8 -> 64 etc.).
- :class:`StreamDownsizer` splits a wide beat into narrow beats (64 -> 8 etc.).
- :class:`PacketFifo` stores packets and only lets the reader see a packet once the writer has
  committed it; a discarded packet vanishes. This is how "drop this frame" works on a stream
  that cannot retract beats (the MAC receiver decides after the FCS, i.e. after the last beat).

All of them keep one beat per cycle on either side when the other side keeps up.
"""

from amaranth import *
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hw.lib.stream import PacketStream, packet_layout

__all__ = ["StreamUpsizer", "StreamDownsizer", "PacketFifo"]


def _check_ratio(narrow, wide):
    if wide % narrow or wide < narrow:
        raise ValueError(f"width {wide} is not a multiple of {narrow}")
    return wide // narrow


class StreamUpsizer(wiring.Component):
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
        self._n = _check_ratio(i_width, o_width)
        self._iw, self._ow = i_width, o_width
        super().__init__({"i": In(PacketStream(i_width)), "o": Out(PacketStream(o_width))})

    def elaborate(self, platform):
        m = Module()
        n, iw, ilanes = self._n, self._iw, self._iw // 8

        if n == 1:
            wiring.connect(m, wiring.flipped(self.i), wiring.flipped(self.o))
            return m

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
        return m


class StreamDownsizer(wiring.Component):
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
        self._n = _check_ratio(o_width, i_width)
        self._iw, self._ow = i_width, o_width
        super().__init__({"i": In(PacketStream(i_width)), "o": Out(PacketStream(o_width))})

    def elaborate(self, platform):
        m = Module()
        n, ow, olanes = self._n, self._ow, self._ow // 8

        if n == 1:
            wiring.connect(m, wiring.flipped(self.i), wiring.flipped(self.o))
            return m

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
        return m


class PacketFifo(wiring.Component):
    """Packet FIFO whose reader only sees committed packets.

    The writer pushes beats on ``w``; on any cycle it may strobe ``w_commit`` (publish every beat
    written since the previous commit/discard, *including* a beat written in the same cycle) or
    ``w_discard`` (forget them, likewise). The reader sees committed beats only, in order. With
    ``w_commit`` tied to ``w.valid & w.payload.last`` it is a store-and-forward FIFO.

    ``w.ready`` is low when the memory is full; a writer that cannot stall (a MAC receiver)
    must then discard the packet. A packet longer than ``depth`` beats can never be committed:
    the writer must discard it (a writer that waits for ``ready`` would wait forever).

    Parameters
    ----------
    width : int
        Data width of the packet streams.
    depth : int
        Capacity in beats, a power of two.
    registered_ready : bool
        ``w.ready`` from a flop: low from the cycle after the FIFO held ``depth - 1`` beats or
        more (a writer adds at most one beat per cycle, so that is never too late; a writer
        that keeps writing still fills all ``depth`` beats). ``w.ready`` may then rise one cycle
        after a read makes room. Cuts the path from the pointers through ``w.ready`` and the
        writer's decision back into the write pointer (the GMII receiver's, at 125 MHz).

    Ports
    -----
    w : In(PacketStream(width))
    w_commit, w_discard : In(1)
    r : Out(PacketStream(width))
    level : Out(range(depth + 1))
        Beats held (committed or not, including the one in the output register).
    """

    def __init__(self, width, depth, *, registered_ready=False):
        if depth < 2 or depth & (depth - 1):
            raise ValueError(f"depth {depth} is not a power of two >= 2")
        self._width, self._depth = width, depth
        self._registered_ready = registered_ready
        super().__init__({
            "w": In(PacketStream(width)),
            "w_commit": In(1),
            "w_discard": In(1),
            "r": Out(PacketStream(width)),
            "level": Out(range(depth + 2)),
        })

    def elaborate(self, platform):
        m = Module()
        depth, abits = self._depth, (self._depth - 1).bit_length()
        layout = packet_layout(self._width)

        m.submodules.mem = mem = Memory(shape=layout, depth=depth, init=[])
        wp_ = mem.write_port()
        rp_ = mem.read_port(domain="sync")

        # Pointers carry one extra bit so that full and empty differ.
        wp = Signal(abits + 1)       # next write (speculative, uncommitted beats before it)
        cp = Signal(abits + 1)       # end of committed beats
        rp = Signal(abits + 1)       # next beat to move into the output register
        out_valid = Signal()

        used = Signal(abits + 1)
        m.d.comb += used.eq(wp - rp)
        m.d.comb += self.level.eq(used + out_valid)

        # Full (wp - rp == depth) as an equality test of the address bits and a differing wrap
        # bit: a few LUT levels, where the subtraction's carry chain plus the pointer increment
        # made the GMII receiver's 125 MHz critical path (24 levels, 7.1 ns on ECPIX-5).
        full = Signal()
        if self._registered_ready:
            m.d.sync += full.eq(used >= depth - 1)
        else:
            m.d.comb += full.eq((wp[:abits] == rp[:abits]) & (wp[abits] != rp[abits]))
        write = Signal()
        m.d.comb += [
            self.w.ready.eq(~full),
            write.eq(self.w.valid & self.w.ready),
            wp_.addr.eq(wp[:abits]),
            wp_.data.eq(self.w.payload),
            wp_.en.eq(write),
        ]
        wp_next = Signal(abits + 1)
        m.d.comb += wp_next.eq(wp + write)
        with m.If(self.w_discard):
            m.d.sync += wp.eq(cp)
        with m.Else():
            m.d.sync += wp.eq(wp_next)
            with m.If(self.w_commit):
                m.d.sync += cp.eq(wp_next)

        # Output register = the memory's synchronous read port (plus its valid bit). It may load
        # whenever it is empty or being emptied; only committed beats (rp != cp) are loaded, and
        # those are never being written, so no read-during-write case arises.
        load = Signal()
        m.d.comb += [
            load.eq(~out_valid | self.r.ready),
            rp_.addr.eq(rp[:abits]),
            rp_.en.eq(load),
            self.r.valid.eq(out_valid),
            self.r.payload.eq(rp_.data),
        ]
        with m.If(load):
            m.d.sync += out_valid.eq(rp != cp)
            with m.If(rp != cp):
                m.d.sync += rp.eq(rp + 1)
        return m

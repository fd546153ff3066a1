# Ref: hw/lib/stream.py (PacketStream lanes/keep/last); amaranth docs stdlib/memory.rst,
#      stdlib/fifo.rst; IEEE 802.3 §4.2.9 (a receiver discards frames with a bad FCS);
#      roce-layouts.md §5 (the ICRC check decides after a packet's last beat).
"""Packet FIFO with commit/discard: the reader only sees packets the writer has committed.

This is how "drop this packet" works on a stream that cannot retract beats: the MAC receiver
decides after the FCS, the ICRC check after the ICRC, i.e. both after the last beat. The same
block serves every such writer (the GMII receiver, the MAC's store-and-forward transmit
buffer, the raw frame queues, the QP1 filter, the ICRC check); what differs between them is a
parameter:

- ``side``: per-packet side data (the ICRC check's RoCE metadata), kept in a small FIFO of
  ``max_packets`` entries next to the beats, instead of widening every stored beat;
- ``drop_oversize``: a packet that can never fit is taken in full and dropped (counted),
  rather than stalling a writer that waits for ``ready`` forever;
- ``registered_ready``: ``w.ready`` from a flop (the GMII receiver's 125 MHz path);
- ``err``: beats carry :func:`~hw.lib.stream.frame_layout`'s ``err`` bit (the GMII receiver in
  cut-through, which publishes every beat at once and gives a frame's verdict on its last).
"""

from amaranth import C, Cat, Const, Module, Mux, Shape, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hw.lib.stream import frame_layout, packet_layout

__all__ = ["PacketFifo"]


class PacketFifo(wiring.Component):
    """Packet FIFO whose reader only sees committed packets.

    The writer pushes beats on ``w``; on any cycle it may strobe ``w_commit`` (publish every beat
    written since the previous commit/discard, *including* a beat written in the same cycle) or
    ``w_discard`` (forget them, likewise). The reader sees committed beats only, in order. With
    ``w_commit`` tied to ``w.valid & w.ready & w.payload.last`` it is a store-and-forward FIFO.

    ``w.ready`` is low when the memory is full; a writer that cannot stall (a MAC receiver)
    must then discard the packet. A packet longer than ``depth`` beats can never be committed:
    the writer must discard it (a writer that waits for ``ready`` would wait forever), unless
    ``drop_oversize`` does that for it.

    Parameters
    ----------
    width : int
        Data width of the packet streams.
    depth : int
        Capacity in beats (>= 2). A power of two keeps the pointer arithmetic to plain
        counters; any other depth (the ICRC check holds two of the largest packets, e.g. 1040
        beats at width 64) wraps the pointers explicitly.
    registered_ready : bool
        ``w.ready`` from a flop: low from the cycle after the FIFO held ``depth - 1`` beats or
        more (a writer adds at most one beat per cycle, so that is never too late; a writer
        that keeps writing still fills all ``depth`` beats). ``w.ready`` may then rise one cycle
        after a read makes room. Cuts the path from the pointers through ``w.ready`` and the
        writer's decision back into the write pointer (the GMII receiver's, at 125 MHz).
    err : bool
        The streams are of :func:`~hw.lib.stream.frame_layout` (``err`` stored with each beat).
    side : shape or None
        Per-packet side data: ``w.payload.side`` is stored when ``w_commit`` publishes a packet
        and shown on ``r.payload.side`` with every beat of it. The writer then commits once
        per packet, in the cycle its last beat is written (or later); a packet is read out
        when both its beats and its side data are there.
    max_packets : int
        With ``side``: packets stored at once (depth of the side-data FIFO); the writer is
        stalled while that many wait.
    drop_oversize : bool
        A packet that fills the whole memory (nothing committed left to drain: it can never
        fit) is taken to its last beat, not stored, and counted in ``cnt_overflow``; a commit
        of it is ignored. While committed packets still drain, a full memory stalls the writer
        as usual. The writer must mark packet ends with ``w.payload.last``. Not with
        ``registered_ready``.

    Ports
    -----
    w : In(stream of packet_layout(width) [+ "err"] [+ "side"])
    w_commit, w_discard : In(1)
    r : Out(stream of packet_layout(width) [+ "err"] [+ "side"])
    level : Out(range(depth + 2))
        Beats held (committed or not, including the one in the output register).
    half : Out(1)
        Registered: the memory holds ``depth // 2`` beats or more (from the same difference
        of pointers as the registered full flag, no adder of its own).
    at_mark : Out(1)
        Only with ``mark``: registered, the memory holds ``mark`` beats or more (the MAC's
        cut-through transmit start, hw/net/mac.py).
    cnt_overflow : Out(32)
        Only with ``drop_oversize``: packets dropped because they did not fit.
    w_lost : Out(1)
        Only with ``drop_oversize``: the beat taken this cycle belongs to a packet being
        dropped (for a writer that commits after the last beat: it must not commit that one).
    """

    def __init__(self, width, depth, *, registered_ready=False, side=None, max_packets=8,
                 drop_oversize=False, mark=None, err=False):
        if depth < 2:
            raise ValueError(f"depth {depth} is less than 2")
        if drop_oversize and registered_ready:
            raise ValueError("drop_oversize needs the combinational w.ready")
        self._width, self._depth = width, depth
        self._registered_ready = registered_ready
        self._side, self._max_packets = side, max_packets
        self._drop_oversize = drop_oversize
        if mark is not None and not 1 <= mark <= depth:
            raise ValueError(f"mark {mark} is not within 1..{depth} beats")
        self._mark = mark
        self._err = err
        self._beat = layout = frame_layout(width) if err else packet_layout(width)
        if side is not None:
            layout = data.StructLayout({**dict(layout.members), "side": side})
        ports = {
            "w": In(stream.Signature(layout)),
            "w_commit": In(1),
            "w_discard": In(1),
            "r": Out(stream.Signature(layout)),
            "level": Out(range(depth + 2)),
            "half": Out(1),
        }
        if mark is not None:
            ports["at_mark"] = Out(1)
        if drop_oversize:
            ports["cnt_overflow"] = Out(32)
            ports["w_lost"] = Out(1)
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        depth, abits = self._depth, (self._depth - 1).bit_length()
        pow2 = not depth & (depth - 1)

        m.submodules.mem = mem = Memory(shape=self._beat, depth=depth, init=[])
        wp_ = mem.write_port()
        rp_ = mem.read_port(domain="sync")

        # Pointers: the memory address in the low bits and a lap bit above it, so that full and
        # empty differ. At a power-of-two depth the address simply carries into the lap bit.
        wp = Signal(abits + 1)       # next write (speculative, uncommitted beats before it)
        cp = Signal(abits + 1)       # end of committed beats
        rp = Signal(abits + 1)       # next beat to move into the output register
        out_valid = Signal()

        def advance(p, en):
            if pow2:
                return p + en
            wrap = Cat(Const(0, abits), ~p[abits])
            return Mux(en, Mux(p[:abits] == depth - 1, wrap, p + 1), p)

        used = Signal(range(depth + 1))
        if pow2:
            m.d.comb += used.eq(wp - rp)
        else:
            m.d.comb += used.eq(Mux(wp[abits] != rp[abits], depth, 0) + wp[:abits] - rp[:abits])
        m.d.comb += self.level.eq(used + out_valid)
        m.d.sync += self.half.eq(used >= depth // 2)
        if self._mark is not None:
            m.d.sync += self.at_mark.eq(used >= self._mark)

        # Full (used == depth) as an equality test of the address bits and a differing lap
        # bit: a few LUT levels, where the subtraction's carry chain plus the pointer increment
        # made the GMII receiver's 125 MHz critical path (24 levels, 7.1 ns on ECPIX-5).
        full_now = Signal()
        m.d.comb += full_now.eq((wp[:abits] == rp[:abits]) & (wp[abits] != rp[abits]))
        full = Signal()
        if self._registered_ready:
            m.d.sync += full.eq(used >= depth - 1)
        else:
            m.d.comb += full.eq(full_now)

        if self._side is not None:
            m.submodules.sides = sides = fifo.SyncFIFOBuffered(
                width=Shape.cast(self._side).width, depth=self._max_packets)
            side_room = sides.w_rdy
        else:
            side_room = C(1)

        accept = Signal()            # a beat is taken from the writer
        lost = Signal()              # ... and it belongs to a packet being dropped
        write = Signal()             # ... and it goes into the memory
        if self._drop_oversize:
            dropping = Signal()      # the current packet overflowed: take the rest, store none
            # Full with nothing committed: the memory holds only the current packet, which
            # therefore cannot fit.
            stuck = Signal()
            m.d.comb += [
                stuck.eq(full_now & (cp == rp)),
                self.w.ready.eq((~full | stuck | dropping) & side_room),
                accept.eq(self.w.valid & self.w.ready),
                lost.eq(accept & (stuck | dropping)),
                write.eq(accept & ~full & ~dropping),
                self.w_lost.eq(lost),
            ]
            with m.If(accept & self.w.payload.last):
                m.d.sync += dropping.eq(0)
                with m.If(lost):
                    m.d.sync += self.cnt_overflow.eq(self.cnt_overflow + 1)
            with m.Elif(lost):
                m.d.sync += dropping.eq(1)
        else:
            m.d.comb += [
                self.w.ready.eq(~full & side_room),
                accept.eq(self.w.valid & self.w.ready),
                write.eq(accept),
            ]
        m.d.comb += [
            wp_.addr.eq(wp[:abits]),
            wp_.data.eq(Cat(self.w.payload.data, self.w.payload.keep, self.w.payload.last,
                            *([self.w.payload.err] if self._err else []))),
            wp_.en.eq(write),
        ]
        wp_next = Signal(abits + 1)
        m.d.comb += wp_next.eq(advance(wp, write))
        commit = Signal()
        m.d.comb += commit.eq(self.w_commit & ~self.w_discard & ~lost)
        with m.If(self.w_discard | lost):
            m.d.sync += wp.eq(cp)
        with m.Else():
            m.d.sync += wp.eq(wp_next)
            with m.If(commit):
                m.d.sync += cp.eq(wp_next)

        # Output register = the memory's synchronous read port (plus its valid bit). It may load
        # whenever it is empty or being emptied; only committed beats (rp != cp) are loaded, and
        # those are never being written, so no read-during-write case arises.
        load = Signal()
        m.d.comb += [
            load.eq(~out_valid | (self.r.ready & self.r.valid)),
            rp_.addr.eq(rp[:abits]),
            rp_.en.eq(load),
            self.r.payload.data.eq(rp_.data.data),
            self.r.payload.keep.eq(rp_.data.keep),
            self.r.payload.last.eq(rp_.data.last),
        ]
        if self._err:
            m.d.comb += self.r.payload.err.eq(rp_.data.err)
        if self._side is not None:
            m.d.comb += [
                sides.w_en.eq(commit),
                sides.w_data.eq(self.w.payload.side),
                self.r.valid.eq(out_valid & sides.r_rdy),
                self.r.payload.side.eq(sides.r_data),
                sides.r_en.eq(self.r.valid & self.r.ready & self.r.payload.last),
            ]
        else:
            m.d.comb += self.r.valid.eq(out_valid)
        with m.If(load):
            m.d.sync += out_valid.eq(rp != cp)
            with m.If(rp != cp):
                m.d.sync += rp.eq(advance(rp, 1))
        return m

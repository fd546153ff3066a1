# Ref: roce-layouts.md §7 (CM MADs on QP1: UD SEND Only + DETH), §1 (Ethernet/IPv4/UDP framing);
#      hw/target/hostlink.py (HostBusSignature, Space.QUEUE); hw/target/regbank.py (queue conventions);
#      issue 5 item 2: QP1 frames through the host slow path.
"""Raw frame queues: the slow path for frames the RC gateware must not take (QP1 / CM).

Pieces
------
:class:`RawQueues`
    ``Space.QUEUE`` queues :data:`Q_RAW_RX` (pop) and :data:`Q_RAW_TX` (push), 32-bit words.

    * RX: watches every frame the MAC delivers (a tap: it never stalls the receive path). A frame
      is kept when it is IPv4 to our MAC and IP, UDP destination port 4791 and its BTH Dest QP is
      1 (GSI); the whole frame is stored, Ethernet header through ICRC (Ethernet padding
      included: the host finds the ICRC from the UDP length), no FCS. Storage is a bounded FIFO
      of octets plus a FIFO of frame lengths; a frame that does not fit in either is dropped and
      counted (``cnt_rx_drops``).
    * TX: the host pushes a complete Ethernet frame without FCS (IP checksum and ICRC already
      computed); once its last word is in, the frame is released towards the MAC
      (:class:`FrameMux` puts it between two frames of the RC transmit path).
:class:`FrameMux`
    Two packet streams into one, switching only between frames (round robin).
:class:`QpFilter`
    Drops RoCE packets (BTH first, :func:`~hw.net.ip.roce_rx_layout`) whose Dest QP is 1, so that
    CM datagrams do not reach the RC responder; counts them.

Host word formats
-----------------
Octets are packed into 32-bit words little-endian: octet ``4k + j`` of the frame is bits
``8j+7 .. 8j`` of data word ``k`` (lane 0 first, as in every stream of the design).

``Q_RAW_RX`` (pop)
    read 0: the length word, bits 15..0 = frame length ``L`` in octets; ``err`` when no frame is
    queued. Then ``ceil(L/4)`` data words; the unused octets of the last word read as zero or
    stale, ignore them. A data read waits (no ``ack``) until the word is available, which is at
    most a cycle. A write is answered with ``err``.
``Q_RAW_TX`` (push)
    write 0: the length word, bits 15..0 = ``L`` (1 .. ``max_tx_octets``), else ``err`` and
    nothing starts. Then ``ceil(L/4)`` data words; the last one is answered with ``err`` when the
    frame did not fit in the queue (it is then dropped and counted in ``cnt_tx_drops``). A read
    returns the free room in octets (no ``err``): a host that pushes only frames no longer than
    that never loses one.
"""

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.headers import ETHERTYPE_IPV4, ROCE_UDP_PORT
from hw.iface import HostBusSignature, Space
from hw.lib.octets import HeaderCapture
from hw.net.ip import roce_rx_layout
from hw.lib.fifo import PacketFifo
from hw.lib.stream import FrameStream, PacketStream, keep_count
from hw.lib.width import StreamDownsizer

__all__ = ["RawQueues", "QpFilter", "Q_RAW_RX", "Q_RAW_TX", "GSI_QPN"]

#: Queue numbers in ``Space.QUEUE`` (after the four record queues of :mod:`hw.target.regbank`).
Q_RAW_RX, Q_RAW_TX = 4, 5
GSI_QPN = 1
#: Frame octets before the end of the BTH Dest QP field (14 + 20 + 8 + 8).
_NEED = 50
_IP_PROTO_UDP = 17


class RawQueues(wiring.Component):
    """Host RX/TX frame queues (see the module docstring).

    Parameters
    ----------
    width : int
        Datapath width of the tap and of ``tx``.
    rx_octets, tx_octets : int
        Storage of each direction in octets (powers of two, >= 64).
    rx_frames : int
        Frames the RX queue can hold at most (length FIFO depth).

    Ports
    -----
    tap : In(FrameStream(width))
        Every beat that moves on the receive stream (``valid`` = the beat's handshake); ``ready``
        is driven 1 and must be ignored by the caller. A frame with ``err`` on its last beat
        is not queued.
    tx : Out(PacketStream(width))
        Host frames towards the MAC.
    bus : In(HostBusSignature)
        Only accesses to ``Space.QUEUE`` queues :data:`Q_RAW_RX` / :data:`Q_RAW_TX` reach it.
    own_mac, own_ip : In
    cnt_rx_frames, cnt_rx_drops, cnt_tx_frames, cnt_tx_drops : Out(32)
    """

    def __init__(self, width=8, *, rx_octets=4096, tx_octets=4096, rx_frames=16):
        self.width = width
        #: storage word: at least 32 bits (one host word), at least one beat
        self.sw = max(32, width)
        for n in (rx_octets, tx_octets):
            if n < 64 or n & (n - 1):
                raise ValueError("queue sizes must be powers of two >= 64")
        self.rx_octets, self.tx_octets, self.rx_frames = rx_octets, tx_octets, rx_frames
        self.max_tx_octets = tx_octets
        super().__init__({
            "tap": In(FrameStream(width)), "tx": Out(PacketStream(width)),
            "bus": In(HostBusSignature()), "own_mac": In(48), "own_ip": In(32),
            "cnt_rx_frames": Out(32), "cnt_rx_drops": Out(32),
            "cnt_tx_frames": Out(32), "cnt_tx_drops": Out(32),
        })

    # ------------------------------------------------------------------------------------------
    def _rx(self, m):
        w, sw, nl = self.width, self.sw, self.width // 8
        k = sw // w                          # beats per storage word
        nw = sw // 32                        # host words per storage word
        t, b = self.tap, self.bus
        m.d.comb += t.ready.eq(1)
        m.submodules.rx_data = fd = PacketFifo(sw, self.rx_octets * 8 // sw)
        m.submodules.rx_len = fl = fifo.SyncFIFOBuffered(width=16, depth=self.rx_frames)

        # ---- write side: classify and store every frame, commit the QP1 ones --------------
        pos = Signal(17)
        fire = t.valid
        cap = HeaderCapture(_NEED, w, "rawh").add(m, pos, t.p.data, fire)
        v = cap.value
        end = pos + keep_count(t.p.keep)
        match = Signal()
        m.d.comb += match.eq(
            (end >= _NEED)
            & (v(0, 6) == self.own_mac) & (v(12, 2) == ETHERTYPE_IPV4)
            & (v(14, 1) == 0x45) & (v(23, 1) == _IP_PROTO_UDP) & (v(30, 4) == self.own_ip)
            & (v(36, 2) == ROCE_UDP_PORT) & (v(47, 3) == GSI_QPN))

        sidx = Signal(range(k))
        acc = Signal(sw)
        entry = Signal(sw)
        ovf = Signal()                       # a beat of this frame found the FIFO full
        slots = [acc[j * w:(j + 1) * w] for j in range(k)]
        m.d.comb += entry.eq(Cat(*[Mux(sidx == j, t.p.data, slots[j]) for j in range(k)]))
        put = fire & ((sidx == k - 1) | t.p.last)
        m.d.comb += [fd.w.valid.eq(put), fd.w.p.data.eq(entry), fd.w.p.keep.eq(-1),
                     fd.w.p.last.eq(t.p.last)]
        lost = put & ~fd.w.ready
        keep_it = match & ~ovf & ~lost & fl.w_rdy & ~t.p.err
        with m.If(fire):
            m.d.sync += pos.eq(Mux(t.p.last, 0, Mux(pos >= (1 << 16), pos, pos + nl)))
            if k > 1:
                with m.If(put):
                    m.d.sync += [sidx.eq(0), acc.eq(0)]
                with m.Else():
                    m.d.sync += [sidx.eq(sidx + 1), acc.eq(entry)]
            with m.If(lost):
                m.d.sync += ovf.eq(1)
            with m.If(t.p.last):
                m.d.sync += ovf.eq(0)
                m.d.comb += [fd.w_commit.eq(keep_it), fd.w_discard.eq(~keep_it),
                             fl.w_en.eq(keep_it), fl.w_data.eq(end)]
                with m.If(keep_it):
                    m.d.sync += self.cnt_rx_frames.eq(self.cnt_rx_frames + 1)
                with m.Elif(match & ~t.p.err):
                    # (A bad frame is the MAC's to count.)
                    m.d.sync += self.cnt_rx_drops.eq(self.cnt_rx_drops + 1)

        # ---- read side -------------------------------------------------------------------
        rem = Signal(15)                     # data words of the current frame still to read
        widx = Signal(range(nw))
        sel = (b.space == Space.QUEUE) & (b.addr == Q_RAW_RX)
        with m.If(sel & b.we):
            m.d.comb += [b.ack.eq(1), b.err.eq(1)]
        with m.If(sel & b.re):
            with m.If(rem == 0):
                m.d.comb += [b.ack.eq(1), b.err.eq(~fl.r_rdy), b.rdata.eq(fl.r_data),
                             fl.r_en.eq(1)]
                with m.If(fl.r_rdy):
                    m.d.sync += [rem.eq((fl.r_data + 3) >> 2), widx.eq(0)]
            with m.Elif(fd.r.valid):
                m.d.comb += [b.ack.eq(1), b.rdata.eq(fd.r.p.data.word_select(widx, 32))]
                m.d.sync += rem.eq(rem - 1)
                with m.If((widx == nw - 1) | (rem == 1)):
                    m.d.comb += fd.r.ready.eq(1)
                    m.d.sync += widx.eq(0)
                with m.Else():
                    m.d.sync += widx.eq(widx + 1)

    # ------------------------------------------------------------------------------------------
    def _tx(self, m):
        w, sw = self.width, self.sw
        so = sw // 8                          # octets per storage word
        nw = sw // 32
        b = self.bus
        depth = self.tx_octets // so
        m.submodules.tx_data = fd = PacketFifo(sw, depth)
        if sw > w:
            m.submodules.tx_down = down = StreamDownsizer(sw, w)
            wiring.connect(m, fd.r, down.i)
            wiring.connect(m, down.o, wiring.flipped(self.tx))
        else:
            wiring.connect(m, fd.r, wiring.flipped(self.tx))
        with m.If(self.tx.valid & self.tx.ready & self.tx.p.last):
            m.d.sync += self.cnt_tx_frames.eq(self.cnt_tx_frames + 1)

        left = Signal(16)                    # octets of the frame not yet in a storage word
        rem = Signal(15)                     # host words still expected
        widx = Signal(range(nw))
        acc = Signal(sw)
        dropped = Signal()
        sel = (b.space == Space.QUEUE) & (b.addr == Q_RAW_TX)
        with m.If(sel & b.re):
            free = Signal(range(depth + 2))
            m.d.comb += [free.eq(Mux(fd.level >= depth, 0, depth - fd.level)),
                         b.ack.eq(1), b.rdata.eq(free * so)]
        word = Cat(*[Mux(widx == j, b.wdata, acc[32 * j:32 * (j + 1)]) for j in range(nw)])
        keep = Signal(so)
        with m.If(left >= so):
            m.d.comb += keep.eq(-1)
        with m.Else():
            m.d.comb += keep.eq((Const(1, so + 1) << left[:6]) - 1)
        with m.If(sel & b.we):
            m.d.comb += b.ack.eq(1)
            with m.If(rem == 0):
                length = b.wdata[:16]
                bad = (length == 0) | (length > self.max_tx_octets)
                m.d.comb += b.err.eq(bad)
                with m.If(~bad):
                    m.d.sync += [rem.eq((length + 3) >> 2), left.eq(length), widx.eq(0),
                                 acc.eq(0), dropped.eq(0)]
            with m.Else():
                put = (widx == nw - 1) | (rem == 1)
                last = rem == 1
                m.d.comb += [fd.w.valid.eq(put), fd.w.p.data.eq(word), fd.w.p.keep.eq(keep),
                             fd.w.p.last.eq(last)]
                lost = dropped | (put & ~fd.w.ready)
                m.d.sync += rem.eq(rem - 1)
                with m.If(put):
                    m.d.sync += [widx.eq(0), acc.eq(0), left.eq(left - so)]
                    with m.If(~fd.w.ready):
                        m.d.sync += dropped.eq(1)
                with m.Else():
                    m.d.sync += [widx.eq(widx + 1), acc.eq(word)]
                with m.If(last):
                    m.d.comb += [b.err.eq(lost), fd.w_commit.eq(~lost), fd.w_discard.eq(lost)]
                    with m.If(lost):
                        m.d.sync += self.cnt_tx_drops.eq(self.cnt_tx_drops + 1)

    def elaborate(self, platform):
        m = Module()
        self._rx(m)
        self._tx(m)
        return m


class QpFilter(wiring.Component):
    """Drop RoCE packets whose BTH Dest QP is :data:`GSI_QPN`; everything else passes in order.

    The Dest QP is known at octet 8 of the packet, so up to ``ceil(8 / lanes)`` beats are held
    in a small commit FIFO until the decision (a packet that passes is then cut through).

    Ports
    -----
    i : In(stream of roce_rx_layout(width)); o : Out(same); cnt_dropped : Out(32)
    """

    def __init__(self, width, depth=16):
        self.width, self.depth = width, depth
        lay = roce_rx_layout(width)
        super().__init__({"i": In(stream.Signature(lay)), "o": Out(stream.Signature(lay)),
                          "cnt_dropped": Out(32)})

    def elaborate(self, platform):
        m = Module()
        w, nl = self.width, self.width // 8
        meta_bits = data.Layout.cast(self.i.p.meta.shape()).size
        extra = (meta_bits + 1 + 7) // 8 * 8
        # A PacketFifo as wide as data + metadata + ``err``: its commit/discard is what the
        # filter needs.
        m.submodules.f = f = PacketFifo(w + extra, self.depth)
        i, o = self.i, self.o
        fire = i.valid & i.ready
        pos = Signal(17)
        cap = HeaderCapture(8, w, "qpf").add(m, pos, i.p.data, fire)
        decide = pos == (7 // nl) * nl
        HDR, PASS, DROP = 0, 1, 2
        mode = Signal(2)
        drop_now = decide & (cap.value(5, 3) == GSI_QPN)
        m.d.comb += [
            f.w.p.data.eq(Cat(i.p.data, i.p.meta, i.p.err)), f.w.p.keep.eq(i.p.keep),
            f.w.p.last.eq(i.p.last),
            f.w.valid.eq(i.valid & (mode != DROP) & ~((mode == HDR) & drop_now)),
            i.ready.eq((mode == DROP) | f.w.ready),
            o.valid.eq(f.r.valid), o.p.data.eq(f.r.p.data[:w]),
            o.p.meta.eq(f.r.p.data[w:w + meta_bits]), o.p.err.eq(f.r.p.data[w + meta_bits]),
            o.p.keep.eq(f.r.p.keep[:nl]),
            o.p.last.eq(f.r.p.last), f.r.ready.eq(o.ready),
        ]
        with m.If(fire):
            m.d.sync += pos.eq(Mux(i.p.last, 0, Mux(pos >= (1 << 16), pos, pos + nl)))
            with m.If(mode == HDR):
                with m.If(drop_now):
                    m.d.comb += f.w_discard.eq(1)
                    m.d.sync += self.cnt_dropped.eq(self.cnt_dropped + 1)
                    m.d.sync += mode.eq(Mux(i.p.last, HDR, DROP))
                with m.Elif(decide | i.p.last):
                    m.d.comb += f.w_commit.eq(1)
                    m.d.sync += mode.eq(Mux(i.p.last, HDR, PASS))
            with m.Elif(mode == PASS):
                m.d.comb += f.w_commit.eq(1)
                with m.If(i.p.last):
                    m.d.sync += mode.eq(HDR)
            with m.Else():
                with m.If(i.p.last):
                    m.d.sync += mode.eq(HDR)
        return m

# Ref: hw/iface.py (memory bus: split transactions, in-order responses, one word per beat);
#      hw/lib/stream.py (PacketStream); issue 19 (general blocks in hw/lib).
"""Movers between packet streams and target memory: :class:`DmaReader` (memory -> stream, for
the TX path), :class:`DmaWriter` (stream -> memory, for READ responses) and :class:`WordWriter`
(stream -> memory at any octet alignment, for the responder's receive buffers)."""

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.iface import ADDR_BITS, MemBusSignature, MemReq
from hw.lib.stream import PacketStream, keep_count

__all__ = ["DmaReadCmd", "DmaReader", "DmaWriter", "WordWriter"]


DmaReadCmd = data.StructLayout({"addr": ADDR_BITS, "length": 16})


class DmaReader(wiring.Component):
    """Read ``length`` octets at any byte address into one packet of ``PacketStream(width)``.

    Reads are issued one word per cycle while the response buffer has room (at most ``depth``
    in flight or buffered); a gearbox drops the octets before ``addr`` in the first word and
    after the end in the last one and re-slices the words into ``width``-bit beats.

    Ports
    -----
    cmd : In(stream of :data:`DmaReadCmd`)  (``length`` > 0)
    o : Out(PacketStream(width))
    mem : Out(MemBusSignature())
    """

    #: Words in flight or buffered. To stream one word per cycle the reader needs as many as
    #: the memory's read latency in core cycles plus the arbiter's stages: the ECPIX-5 DDR3
    #: answers a row hit in 12 core cycles and a refresh stalls it 12 more (boards/dram.py
    #: ECPIX5_DDR3), so 8 (what block RAM needs) let a LOAD send 8 words per ~14 cycles and
    #: 32 stream (tests/hw/lib/test_dram_stream.py: 4 KiB in 1,050 core cycles with 8, 567
    #: with 32). The ECPIX-5 build with 32 here and in MemArbiter routes and meets timing.
    DEPTH = 32

    def __init__(self, width, depth=DEPTH):
        if width % 8 or not 8 <= width <= 64:
            raise ValueError("DmaReader supports widths of 8 to 64 bits")
        self._width = width
        self._depth = depth
        super().__init__({
            "cmd": In(stream.Signature(DmaReadCmd)),
            "o": Out(PacketStream(width)),
            "mem": Out(MemBusSignature()),
        })

    def elaborate(self, platform):
        m = Module()
        w, nl, depth = self._width, self._width // 8, self._depth
        m.submodules.rbuf = rbuf = fifo.SyncFIFOBuffered(width=64, depth=depth)

        busy = Signal()
        addr = Signal(ADDR_BITS)
        words = Signal(16)          # words still to request
        inflight = Signal(range(depth + 1))   # requested, not yet popped from rbuf
        remain = Signal(17)         # octets still to pop
        first = Signal()            # next popped word is the first one
        ending = Signal()           # the last word is in the gearbox

        # Command: the whole span of aligned words that covers [addr, addr + length).
        with m.If(~busy):
            m.d.comb += self.cmd.ready.eq(1)
            with m.If(self.cmd.valid):
                a, n = self.cmd.p.addr, self.cmd.p.length
                m.d.sync += [busy.eq(1), addr.eq(a), remain.eq(n), first.eq(1),
                             words.eq((a[:3] + n + 7) >> 3), ending.eq(0)]

        # Issue reads.
        req = self.mem.req
        m.d.comb += [req.p.addr.eq(Cat(Const(0, 3), addr[3:])), req.p.we.eq(0),
                     req.valid.eq(busy & (words != 0) & (inflight < depth))]
        issued = req.valid & req.ready
        with m.If(issued):
            m.d.sync += [addr.eq(addr + 8), words.eq(words - 1)]
        m.d.comb += [rbuf.w_data.eq(self.mem.rsp.p.rdata), rbuf.w_en.eq(self.mem.rsp.valid),
                     self.mem.rsp.ready.eq(1)]     # room is guaranteed by `inflight`

        # Gearbox: `cnt` valid octets at the bottom of `buf`, the rest zero.
        nb = 16 + nl
        buf = Signal(8 * nb)
        cnt = Signal(range(nb + 1))
        out_n = Signal(range(nl + 1))
        o = self.o
        m.d.comb += [
            o.valid.eq(busy & ((cnt >= nl) | (ending & (cnt != 0)))),
            o.p.data.eq(buf[:w]),
            o.p.last.eq(ending & (cnt <= nl)),
        ]
        for j in range(nl):
            m.d.comb += o.p.keep[j].eq(cnt > j)
        with m.If(o.valid & o.ready):
            m.d.comb += out_n.eq(Mux(cnt >= nl, nl, cnt))

        # The first word starts at the command's offset within its word; the others at 0.
        addr_lo = Signal(3)
        with m.If(~busy & self.cmd.valid):
            m.d.sync += addr_lo.eq(self.cmd.p.addr[:3])
        lo = Signal(3)
        n = Signal(4)
        m.d.comb += lo.eq(Mux(first, addr_lo, 0))
        avail = Signal(4)
        m.d.comb += [avail.eq(8 - lo), n.eq(Mux(remain < avail, remain, avail))]
        take = Signal()
        m.d.comb += take.eq(busy & rbuf.r_rdy & ~ending & (cnt <= nb - 8))
        m.d.comb += rbuf.r_en.eq(take)

        word = Signal(64)
        m.d.comb += word.eq((rbuf.r_data >> (lo * 8)) & ((Const(1, 65) << (n * 8)) - 1)[:64])
        kept = Signal(8 * nb)
        m.d.comb += kept.eq(buf >> (out_n * 8))
        ins = Signal(8 * nb)
        base = Signal(range(nb + 1))        # where the new octets go once out_n have left
        m.d.comb += [base.eq(cnt - out_n), ins.eq((word << (base * 8))[:8 * nb])]
        m.d.sync += [buf.eq(kept | Mux(take, ins, 0)),
                     cnt.eq(cnt - out_n + Mux(take, n, 0))]
        with m.If(take):
            m.d.sync += [first.eq(0), remain.eq(remain - n)]
            with m.If(remain <= avail):
                m.d.sync += ending.eq(1)
        m.d.sync += inflight.eq(inflight + issued - take)
        with m.If(o.valid & o.ready & o.p.last):
            m.d.sync += [busy.eq(0), ending.eq(0), cnt.eq(0), buf.eq(0)]
        return m


class DmaWriter(wiring.Component):
    """Write one packet of ``PacketStream(width)`` to target memory from byte address ``addr``.

    Octets are collected into aligned 8-octet words and written with byte strobes, one word per
    cycle when the bus allows. ``idle`` is high when no packet is in progress and every write
    has been accepted by the bus.

    Ports
    -----
    cmd : In(stream of {addr})
    i : In(PacketStream(width))
    mem : Out(MemBusSignature())
    idle : Out(1)
    """

    def __init__(self, width):
        if width % 8 or not 8 <= width <= 64:
            raise ValueError("DmaWriter supports widths of 8 to 64 bits")
        self._width = width
        super().__init__({
            "cmd": In(stream.Signature(data.StructLayout({"addr": ADDR_BITS}))),
            "i": In(PacketStream(width)),
            "mem": Out(MemBusSignature()),
            "idle": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        nl = self._width // 8
        waddr = Signal(ADDR_BITS - 3)       # word address of buf[0:64]
        pos = Signal(3)                     # next octet goes to lane `pos` of that word
        buf = Signal(128)
        strb = Signal(16)
        n = Signal(range(nl + 1))
        m.d.comb += n.eq(keep_count(self.i.p.keep))
        comb_data = Signal(128)
        comb_strb = Signal(16)
        total = Signal(5)
        m.d.comb += [
            comb_data.eq(buf | (self.i.p.data << (pos * 8))[:128]),
            comb_strb.eq(strb | ((Const(1, 17) << n) - 1)[:16] << pos),
            total.eq(pos + n),
        ]
        req = self.mem.req
        # `we` is set in the states that write, next to wdata: a lone constant comb assignment
        # to one field becomes an `always @*` block that Verilog simulators never run.
        m.d.comb += [req.p.addr.eq(Cat(Const(0, 3), waddr)), self.mem.rsp.ready.eq(1)]
        with m.FSM():
            with m.State("IDLE"):
                m.d.comb += [self.cmd.ready.eq(1), self.idle.eq(1)]
                with m.If(self.cmd.valid):
                    m.d.sync += [waddr.eq(self.cmd.p.addr[3:]), pos.eq(self.cmd.p.addr[:3]),
                                 buf.eq(0), strb.eq(0)]
                    m.next = "RUN"
            with m.State("RUN"):
                emit = (total >= 8) | self.i.p.last
                m.d.comb += [req.valid.eq(self.i.valid & emit), req.p.we.eq(1), req.p.lock.eq(0),
                             req.p.wdata.eq(comb_data[:64]), req.p.wstrb.eq(comb_strb[:8]),
                             self.i.ready.eq(~emit | req.ready)]
                with m.If(self.i.valid & self.i.ready):
                    with m.If(total >= 8):
                        m.d.sync += [buf.eq(comb_data[64:]), strb.eq(comb_strb[8:]),
                                     pos.eq(total - 8), waddr.eq(waddr + 1)]
                    with m.Else():
                        m.d.sync += [buf.eq(comb_data), strb.eq(comb_strb), pos.eq(total)]
                    with m.If(self.i.p.last):
                        with m.If(total > 8):
                            m.next = "FLUSH"
                        with m.Else():
                            m.next = "IDLE"
            with m.State("FLUSH"):
                m.d.comb += [req.valid.eq(1), req.p.we.eq(1), req.p.lock.eq(0),
                             req.p.wdata.eq(buf[:64]),
                             req.p.wstrb.eq(strb[:8])]
                with m.If(req.ready):
                    m.next = "IDLE"
        return m


class WordWriter(wiring.Component):
    """Octet stream -> aligned 8-octet memory writes with byte strobes, any start address.

    ``start`` (one cycle, while idle) sets the address of the next octet. Then each beat of
    ``i`` is merged into a two-word window; a word is written as soon as it is complete (or at
    the packet's last beat), so a full-width stream runs at one word per cycle.

    Ports
    -----
    start : In(1), addr : In(ADDR_BITS)
    i : In(PacketStream(width))
    o : Out(stream of MemReq)     writes only
    idle : Out(1)                 nothing buffered and no write waiting
    """

    def __init__(self, width):
        if width > 64:
            raise ValueError("WordWriter handles datapaths up to 64 bits")
        self.width = width
        super().__init__({
            "start": In(1), "addr": In(ADDR_BITS),
            "i": In(PacketStream(width)),
            "o": Out(stream.Signature(MemReq)),
            "idle": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        nl = self.width // 8
        a = Signal(ADDR_BITS)           # address of the next octet; window word 0 = a & ~7
        buf = Signal(128)
        mask = Signal(16)
        flush = Signal()                # window word 1 still holds octets after a last beat
        o = self.o
        pos = a[0:3]
        n = Signal(range(nl + 1))
        m.d.comb += n.eq(keep_count(self.i.p.keep))
        sh_data = Signal(128)
        sh_mask = Signal(16)
        m.d.comb += [sh_data.eq(self.i.p.data << (pos * 8)),
                     sh_mask.eq(self.i.p.keep << pos)]
        nb = buf | sh_data
        nm = mask | sh_mask

        with m.If(o.ready):
            m.d.sync += o.valid.eq(0)
        m.d.comb += [o.p.we.eq(1),
                     self.i.ready.eq((~o.valid | o.ready) & ~flush),
                     self.idle.eq(~o.valid & ~flush & (mask == 0))]
        with m.If(self.start):
            m.d.sync += [a.eq(self.addr), buf.eq(0), mask.eq(0), flush.eq(0)]
        with m.Elif(flush & (~o.valid | o.ready)):
            m.d.sync += [o.valid.eq(1), o.p.addr.eq(Cat(Const(0, 3), a[3:])),
                         o.p.wdata.eq(buf[:64]), o.p.wstrb.eq(mask[:8]),
                         buf.eq(0), mask.eq(0), flush.eq(0)]
        with m.Elif(self.i.valid & self.i.ready):
            m.d.sync += a.eq(a + n)
            with m.If((pos + n >= 8) | self.i.p.last):
                m.d.sync += [o.valid.eq(nm[:8] != 0), o.p.addr.eq(Cat(Const(0, 3), a[3:])),
                             o.p.wdata.eq(nb[:64]), o.p.wstrb.eq(nm[:8]),
                             buf.eq(nb[64:]), mask.eq(nm[8:]),
                             flush.eq(self.i.p.last & (nm[8:] != 0))]
            with m.Else():
                m.d.sync += [buf.eq(nb), mask.eq(nm)]
        return m

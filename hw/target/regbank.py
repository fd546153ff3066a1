# Ref: hw/iface.py (REG_TOP, REG_QP, REG_MR, REG_TRANSPORT, REG_KBTP; RecvNotify,
#      RecvRepost, WorkRequest, WorkCompletion); hw/target/hostlink.py (HostBusSignature, Space).
"""Host bus decoding for :class:`hw.target.target.KbtpTarget`.

Pieces
------
:class:`HostDecoder`
    One master port, ``n`` slave ports, each slave owning a list of ``(space, base, size)``
    windows. A request goes to the one slave whose window holds its address; an address no
    window holds is answered at once with ``ack`` + ``err``. Only the chosen slave sees
    ``re``/``we``, so slaves need not be silent outside their windows.
:class:`TopRegs`
    The ``REG_TOP`` window (map in :data:`TOP_REGS` + counters from ``TOP_COUNTER_BASE``).
:class:`HostMemPort`
    ``Space.MEM``: 32-bit accesses to target memory through a :class:`MemBusSignature` master
    (a write is one masked word write; a read is one word read, the wanted half returned).
:class:`HostQueues`
    ``Space.QUEUE``: queue ``q`` (the address) moves one record as several 32-bit words, least
    significant word first (a record's bits are its ``data.Layout`` packed value). Pop queues
    answer ``err`` when empty (on the first word of a record); push queues answer ``err`` when
    full (on the last word; the record is then dropped). Queue numbers: :data:`Q_NOTIFY` (pop
    RecvNotify, 4 words), :data:`Q_WR` (push WorkRequest, 8 words), :data:`Q_WC` (pop
    WorkCompletion, 1 word), :data:`Q_REPOST` (push RecvRepost, 1 word).

    Queues 4 and 5 are not records but whole Ethernet frames, served by
    :class:`hw.rdma.rawq.RawQueues` (its own decoder window): :data:`Q_RAW_RX` (pop: a length
    word, then the frame's octets four per word, little-endian) and :data:`Q_RAW_TX` (push: the
    same format; a read returns the free room in octets). Word formats in :mod:`hw.rdma.rawq`.
"""

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.iface import (HostBusSignature, MemBusSignature, REG_TOP, RecvNotify, RecvRepost, Space,
                     WorkCompletion, WorkRequest)
from hw.rdma.rawq import Q_RAW_RX, Q_RAW_TX

__all__ = ["HostDecoder", "TopRegs", "HostMemPort", "HostQueues", "TARGET_ID", "TOP_REGS",
           "TOP_COUNTER_BASE", "Q_NOTIFY", "Q_WR", "Q_WC", "Q_REPOST", "QUEUES", "record_words",
           "Q_RAW_RX", "Q_RAW_TX"]

#: REG_TOP + 0x00 reads this ("KBTT": KBTP target).
TARGET_ID = 0x4B425454
#: REG_TOP word offsets of the configuration registers.
TOP_REGS = {"id": 0x00, "own_mac_hi": 0x04, "own_mac_lo": 0x08, "own_ip": 0x0C}
#: Counter k of the top is at REG_TOP + TOP_COUNTER_BASE + 4 * k (read-only).
TOP_COUNTER_BASE = 0x40

Q_NOTIFY, Q_WR, Q_WC, Q_REPOST = 0, 1, 2, 3
#: queue number -> (layout, direction as seen by the host).
QUEUES = {Q_NOTIFY: (RecvNotify, "pop"), Q_WR: (WorkRequest, "push"),
          Q_WC: (WorkCompletion, "pop"), Q_REPOST: (RecvRepost, "push")}


def record_words(layout):
    """Number of 32-bit host words one record of ``layout`` takes."""
    return (data.Layout.cast(layout).size + 31) // 32


class HostDecoder(wiring.Component):
    """Route a host bus to ``len(windows)`` slaves by address window.

    Parameters
    ----------
    windows : list of list of (Space, base, size)
        ``windows[k]`` are the windows of slave ``k`` (byte addresses; for ``Space.QUEUE`` the
        queue numbers).

    Ports
    -----
    host : In(HostBusSignature)
    slaves : Out(HostBusSignature).array(n)
    """

    def __init__(self, windows):
        self._windows = windows
        super().__init__({"host": In(HostBusSignature()),
                          "slaves": Out(HostBusSignature()).array(len(windows))})

    def elaborate(self, platform):
        m = Module()
        h = self.host
        hit_any = Signal()
        for k, wins in enumerate(self._windows):
            s = self.slaves[k]
            hit = Signal(name=f"hit{k}")
            for space, base, size in wins:
                with m.If((h.space == space) & (h.addr >= base) & (h.addr < base + size)):
                    m.d.comb += hit.eq(1)
            m.d.comb += [s.addr.eq(h.addr), s.space.eq(h.space), s.wdata.eq(h.wdata),
                         s.re.eq(h.re & hit), s.we.eq(h.we & hit)]
            with m.If(hit):
                m.d.comb += [hit_any.eq(1), h.ack.eq(s.ack), h.err.eq(s.err),
                             h.rdata.eq(s.rdata)]
        with m.If(~hit_any & (h.re | h.we)):
            m.d.comb += [h.ack.eq(1), h.err.eq(1)]
        return m


class TopRegs(wiring.Component):
    """``REG_TOP``: ID (ro), own MAC (rw, two words), own IP (rw), counters (ro).

    Ports
    -----
    bus : In(HostBusSignature)   (only accesses inside the window reach it)
    own_mac : Out(48), own_ip : Out(32)
    counters : In(32).array(n_counters)
    """

    def __init__(self, n_counters, *, own_mac=0, own_ip=0):
        self.n_counters = n_counters
        super().__init__({"bus": In(HostBusSignature()),
                          "own_mac": Out(48, init=own_mac), "own_ip": Out(32, init=own_ip),
                          "counters": In(32).array(n_counters)})

    def elaborate(self, platform):
        m = Module()
        b = self.bus
        rel = Signal(32)
        m.d.comb += rel.eq(b.addr - REG_TOP)
        with m.If(b.re | b.we):
            m.d.comb += [b.ack.eq(1), b.err.eq(1)]
            with m.If(rel == TOP_REGS["id"]):
                m.d.comb += [b.err.eq(b.we), b.rdata.eq(TARGET_ID)]
            with m.Elif(rel == TOP_REGS["own_mac_hi"]):
                m.d.comb += [b.err.eq(0), b.rdata.eq(self.own_mac[32:])]
                with m.If(b.we):
                    m.d.sync += self.own_mac[32:].eq(b.wdata[:16])
            with m.Elif(rel == TOP_REGS["own_mac_lo"]):
                m.d.comb += [b.err.eq(0), b.rdata.eq(self.own_mac[:32])]
                with m.If(b.we):
                    m.d.sync += self.own_mac[:32].eq(b.wdata)
            with m.Elif(rel == TOP_REGS["own_ip"]):
                m.d.comb += [b.err.eq(0), b.rdata.eq(self.own_ip)]
                with m.If(b.we):
                    m.d.sync += self.own_ip.eq(b.wdata)
            for k in range(self.n_counters):
                with m.Elif(rel == TOP_COUNTER_BASE + 4 * k):
                    m.d.comb += [b.err.eq(b.we), b.rdata.eq(self.counters[k])]
        return m


class HostMemPort(wiring.Component):
    """``Space.MEM`` -> target memory: 32-bit word accesses, ``mem_bytes`` octets.

    Ports
    -----
    bus : In(HostBusSignature)
    mem : Out(MemBusSignature)
    """

    def __init__(self, mem_bytes):
        self.mem_bytes = mem_bytes
        super().__init__({"bus": In(HostBusSignature()), "mem": Out(MemBusSignature())})

    def elaborate(self, platform):
        m = Module()
        b, mem = self.bus, self.mem
        hi = b.addr[2]          # which half of the 8-octet word
        bad = (b.addr[:2] != 0) | (b.addr >= self.mem_bytes)
        m.d.comb += [mem.req.p.addr.eq(Cat(Const(0, 3), b.addr[3:])),
                     mem.req.p.wdata.eq(Cat(b.wdata, b.wdata)),
                     mem.req.p.wstrb.eq(Mux(hi, 0xF0, 0x0F)),
                     mem.req.p.we.eq(b.we)]
        with m.FSM():
            with m.State("IDLE"):
                with m.If((b.re | b.we) & bad):
                    m.d.comb += [b.ack.eq(1), b.err.eq(1)]
                with m.Elif(b.we):
                    m.d.comb += [mem.req.valid.eq(1), b.ack.eq(mem.req.ready)]
                with m.Elif(b.re):
                    m.d.comb += mem.req.valid.eq(1)
                    with m.If(mem.req.ready):
                        m.next = "WAIT"
            with m.State("WAIT"):
                m.d.comb += mem.rsp.ready.eq(1)
                with m.If(mem.rsp.valid):
                    m.d.comb += [b.ack.eq(1),
                                 b.rdata.eq(Mux(hi, mem.rsp.p.rdata[32:], mem.rsp.p.rdata[:32]))]
                    m.next = "IDLE"
        return m


class HostQueues(wiring.Component):
    """``Space.QUEUE``: the four host queues (see the module docstring).

    Ports
    -----
    bus : In(HostBusSignature)
    notify : In(stream of RecvNotify)       responder -> host (pop queue Q_NOTIFY)
    wr : Out(stream of WorkRequest)         host -> requester (push queue Q_WR)
    wc : In(stream of WorkCompletion)       requester -> host (pop queue Q_WC)
    repost : Out(stream of RecvRepost)      host -> responder (push queue Q_REPOST)
    """

    def __init__(self, depth=16):
        self.depth = depth
        super().__init__({"bus": In(HostBusSignature()),
                          "notify": In(stream.Signature(RecvNotify)),
                          "wr": Out(stream.Signature(WorkRequest)),
                          "wc": In(stream.Signature(WorkCompletion)),
                          "repost": Out(stream.Signature(RecvRepost))})

    def _queue(self, m, q, layout):
        """Queue ``q``'s FIFO of ``layout`` records, its word count and word index."""
        n = record_words(layout)
        size = data.Layout.cast(layout).size
        f = fifo.SyncFIFOBuffered(width=size, depth=self.depth)
        m.submodules[f"q{q}"] = f
        return n, size, f, Signal(range(n), name=f"q{q}_idx")

    def _pop(self, m, q, port, layout):
        b = self.bus
        n, size, f, idx = self._queue(m, q, layout)
        m.d.comb += [f.w_data.eq(port.payload.as_value()), f.w_en.eq(port.valid),
                     port.ready.eq(f.w_rdy)]
        padded = Cat(f.r_data, Const(0, 32 * n - size))
        with m.If((b.space == Space.QUEUE) & (b.addr == q) & b.re):
            m.d.comb += [b.ack.eq(1), b.err.eq(~f.r_rdy),
                         b.rdata.eq(padded.word_select(idx, 32))]
            with m.If(f.r_rdy):
                with m.If(idx == n - 1):
                    m.d.comb += f.r_en.eq(1)
                    m.d.sync += idx.eq(0)
                with m.Else():
                    m.d.sync += idx.eq(idx + 1)
        with m.If((b.space == Space.QUEUE) & (b.addr == q) & b.we):
            m.d.comb += [b.ack.eq(1), b.err.eq(1)]

    def _push(self, m, q, port, layout):
        b = self.bus
        n, size, f, idx = self._queue(m, q, layout)
        m.d.comb += [port.payload.eq(f.r_data), port.valid.eq(f.r_rdy), f.r_en.eq(port.ready)]
        acc = Signal(32 * n, name=f"q{q}_acc")
        # Words arrive least significant first: shift right, the newest word on top.
        m.d.comb += f.w_data.eq(Cat(acc[32:], b.wdata)[:size])
        with m.If((b.space == Space.QUEUE) & (b.addr == q) & b.we):
            m.d.comb += b.ack.eq(1)
            with m.If(idx == n - 1):
                m.d.comb += [b.err.eq(~f.w_rdy), f.w_en.eq(1)]
                m.d.sync += idx.eq(0)
            with m.Else():
                m.d.sync += [idx.eq(idx + 1), acc.eq(Cat(acc[32:], b.wdata))]
        with m.If((b.space == Space.QUEUE) & (b.addr == q) & b.re):
            m.d.comb += [b.ack.eq(1), b.err.eq(1)]

    def elaborate(self, platform):
        m = Module()
        self._pop(m, Q_NOTIFY, self.notify, RecvNotify)
        self._push(m, Q_WR, self.wr, WorkRequest)
        self._pop(m, Q_WC, self.wc, WorkCompletion)
        self._push(m, Q_REPOST, self.repost, RecvRepost)
        return m

# Ref: issue 6: MAC at 125 MHz, the rest in its own `core` domain.
#      hw/net/mac.py GmiiMac; hw/lib/width.py sizers; amaranth docs stdlib/fifo.rst (AsyncFIFO),
#      stdlib/cdc.rst (PulseSynchronizer); hw/target/target.py MAC_COUNTERS.
"""A GMII MAC in the GMII clock domain with its frame streams in another (core) domain.

::

    GMII (mac, 125 MHz) -> GmiiMac(w).rx -> slice -> AsyncFIFO -> rx (core)
    GMII <- GmiiMac(w).tx <- slice <- AsyncFIFO <- tx (core)
    (slice: RegisterSlice, a skid buffer that cuts the valid/data and ready paths)
    MAC counters: each change is a pulse, carried by a PulseSynchronizer, counted again in core.
    rx_backlog (the MAC's receive buffer half full): a level, through an FFSynchronizer.

The MAC keeps its own frame buffers (store-and-forward, bad frames are dropped there; with
``rx_cut_through`` a frame crosses as it arrives and its last beat carries the verdict;
transmission starts once a whole frame is buffered, or ``tx_start`` octets of it with a
cut-through start), so the asynchronous FIFOs only have to absorb the clock ratio: at ``w = 64`` the MAC side offers at
most one wide beat per 8 of its cycles at line
rate, which a core clock above 125/8 MHz drains.

Both frame buffers are ``w`` bits wide (:class:`~hw.net.mac.GmiiMac` at ``w``: the receiver
packs octets into words before its buffer, the transmitter's downsizer comes after its
buffer). Earlier the MAC here was 8 bits wide with the sizers outside it, so each buffer
passed one octet per 125 MHz cycle: a received frame left its buffer at 1 octet / 8 ns after
its last octet, and a frame to send filled its buffer at that rate before its first octet went
out, a frame's length in cycles twice over (issue 21: the store-and-forward stages).
"""

from amaranth import DomainRenamer, Module, Signal
from amaranth.lib import cdc, data, fifo, wiring
from amaranth.lib.wiring import In, Out

from hw.net.mac import GmiiMac
from hw.lib.stream import FrameStream, PacketStream, RegisterSlice

__all__ = ["MacCdc", "MAC_COUNTER_NAMES"]

#: GmiiMac counter ports, in the order of ``hw.target.target.MAC_COUNTERS``.
MAC_COUNTER_NAMES = ("rx_frames_ok", "rx_fcs_errors", "rx_runts", "rx_errors", "rx_overflows",
                     "tx_frames", "tx_underruns")


class MacCdc(wiring.Component):
    """:class:`~hw.net.mac.GmiiMac` (``width`` bits) in ``mac_domain``, user side in
    ``core_domain``.

    Parameters
    ----------
    width : int
        User-side data width (multiple of 8).
    mac_domain, core_domain : str
        Clock domains of the GMII side and of the user side.
    fifo_depth : int
        Depth in wide beats of each asynchronous FIFO (power of two).
    rx_depth, tx_depth : int
        The MAC's frame buffers in octets (see :class:`~hw.net.mac.GmiiMac`).
    tx_start : int or None
        The MAC's cut-through transmit start (:class:`~hw.net.mac.GmiiMac` ``tx_start``).
    rx_cut_through : bool
        The MAC's cut-through receive (:class:`~hw.net.mac.GmiiMac` ``rx_cut_through``): a
        frame crosses as it comes, its verdict (``err``) on its last beat.

    Ports
    -----
    rxd, rx_dv, rx_er : In; txd, tx_en, tx_er : Out
        GMII, in ``mac_domain``.
    rx : Out(PacketStream(width)) (Out(FrameStream(width)) with ``rx_cut_through``),
    tx : In(PacketStream(width))
        Frames without FCS, in ``core_domain``.
    rx_backlog : Out(1)
        The MAC's receive buffer holds half its depth or more (GmiiMac ``rx_backlog``), in
        ``core_domain``, two core cycles late (a level that lasts at least a frame).
    counters : Out(32).array(7)
        The MAC's counters (:data:`MAC_COUNTER_NAMES`) recounted in ``core_domain``. Events of
        one counter closer than a few core cycles may count once; the MAC's events are a frame
        apart (at least 64 octet times), so this only matters for a core clock below ~25 %
        of the MAC's.
    """

    def __init__(self, width=64, *, mac_domain="sync", core_domain="core", fifo_depth=16,
                 rx_depth=2048, tx_depth=2048, tx_start=None, rx_cut_through=False):
        self._w, self._md, self._cd = width, mac_domain, core_domain
        self._fifo_depth, self._rx_depth, self._tx_depth = fifo_depth, rx_depth, tx_depth
        self._tx_start, self._rx_cut = tx_start, rx_cut_through
        rx_sig = FrameStream(width) if rx_cut_through else PacketStream(width)
        super().__init__({
            "rxd": In(8), "rx_dv": In(1), "rx_er": In(1),
            "txd": Out(8), "tx_en": Out(1), "tx_er": Out(1),
            "rx": Out(rx_sig), "tx": In(PacketStream(width)),
            "counters": Out(32).array(len(MAC_COUNTER_NAMES)),
            "rx_backlog": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        w, md, cd = self._w, self._md, self._cd
        rename = DomainRenamer({"sync": md})
        m.submodules.mac = mac = rename(GmiiMac(w, rx_depth=self._rx_depth,
                                                tx_depth=self._tx_depth,
                                                tx_start=self._tx_start,
                                                rx_cut_through=self._rx_cut))
        bits = data.Layout.cast(self.rx.payload.shape()).size
        m.submodules.rx_fifo = rxf = fifo.AsyncFIFO(width=bits, depth=self._fifo_depth,
                                                    w_domain=md, r_domain=cd)
        m.submodules.tx_fifo = txf = fifo.AsyncFIFO(width=bits, depth=self._fifo_depth,
                                                    w_domain=cd, r_domain=md)

        m.d.comb += [mac.rxd.eq(self.rxd), mac.rx_dv.eq(self.rx_dv), mac.rx_er.eq(self.rx_er),
                     self.txd.eq(mac.txd), self.tx_en.eq(mac.tx_en), self.tx_er.eq(mac.tx_er)]

        # Register slices (skid buffers) between the MAC and the asynchronous FIFOs, in the MAC
        # domain: the receive side starts from the MAC buffer's block-RAM read data, and on the
        # transmit side the MAC FIFO's ready would chain into the async FIFO's read enable,
        # pointer and storage read (9 levels, 9.0 ns placed on ECPIX-5 with the sizers that
        # sat here before, board core ``mac-cdc``).
        m.submodules.rx_slice = rx_slice = rename(RegisterSlice(signature=mac.rx.signature))
        m.submodules.tx_slice = tx_slice = rename(RegisterSlice(w))

        # Receive: MAC -> slice -> async FIFO -> rx.
        wiring.connect(m, mac.rx, rx_slice.i)
        m.d.comb += [rxf.w_data.eq(rx_slice.o.payload.as_value()), rxf.w_en.eq(rx_slice.o.valid),
                     rx_slice.o.ready.eq(rxf.w_rdy),
                     self.rx.payload.eq(rxf.r_data), self.rx.valid.eq(rxf.r_rdy),
                     rxf.r_en.eq(self.rx.ready)]
        # Transmit: tx -> async FIFO -> slice -> MAC.
        m.d.comb += [txf.w_data.eq(self.tx.payload.as_value()), txf.w_en.eq(self.tx.valid),
                     self.tx.ready.eq(txf.w_rdy),
                     tx_slice.i.payload.eq(txf.r_data), tx_slice.i.valid.eq(txf.r_rdy),
                     txf.r_en.eq(tx_slice.i.ready)]
        wiring.connect(m, tx_slice.o, mac.tx)

        m.submodules.backlog_sync = cdc.FFSynchronizer(mac.rx_backlog, self.rx_backlog,
                                                       o_domain=cd)

        # Counters: the MAC's counters step by one, so a toggle of bit 0 is an event; events
        # cross as pulses.
        for k, name in enumerate(MAC_COUNTER_NAMES):
            src = getattr(mac, name)
            prev = Signal(name=f"{name}_prev")
            event = Signal(name=f"{name}_event")
            m.d[md] += [prev.eq(src[0]), event.eq(src[0] != prev)]
            m.submodules[f"ps_{name}"] = ps = cdc.PulseSynchronizer(md, cd)
            m.d.comb += ps.i.eq(event)
            with m.If(ps.o):
                m.d[cd] += self.counters[k].eq(self.counters[k] + 1)
        return m

# Ref: hw/net/rgmii.py GmiiSignature; hw/target/hostlink.py HostBusSignature;
#      hw/target/target.py KbtpTarget; hw/net/mac.py GmiiMac; hw/net/arp.py ArpResponder.
"""The contract between the board layer and the core it hosts, plus stand-in cores.

A *core factory* is any callable ``factory(memory: BoardMemoryConfig) -> wiring.Component``
whose component has at least these members (the :class:`CoreSignature`)::

    gmii : Out(GmiiSignature())    # the core is the MAC side of GMII, in ``sync`` (125 MHz)
    bus  : In(HostBusSignature())  # the host link is the master; the core is the target

and optionally ``leds : Out(2)``. GMII runs in the ``sync`` domain that the board provides
(125 MHz from the board's oscillator through a PLL). A core with ``core_freq`` (Hz) and
``core_domain`` attributes gets that domain from another PLL output, and its ``bus`` (with
the host link) runs there; otherwise everything is in ``sync``. The full KBTP core
(:class:`KbtpCore`, name ``kbtp``) is the default; the stand-in cores ``mac-loopback`` and
``mac-arp`` stay for bring-up of a board (PHY, host link) without the RoCE path.
"""

from amaranth import Cat, Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.headers import BTH, RETH, EthernetHeader, ImmDt, IPv4Header, UDPHeader
from hw.iface import HostBusSignature
from hw.lib.stream import RegisterSlice, frame_from_packets
from hw.net.rgmii import GmiiSignature
from hw.target.hostlink import HostBusDemoTarget
from hw.target.udplink import HostBusRegister


__all__ = ["CoreSignature", "check_core", "HostBusRegister", "MacLoopbackCore", "MacArpCore",
           "MacCdcLoopbackCore", "KbtpCore", "KbtpCore1", "CORE_FREQ", "CORES", "DEFAULT_IP",
           "DEFAULT_MAC", "SHIPPED_QPS", "default_core_name", "kbtp_mem_words"]

#: Clock of the kbtp core's ``core`` domain: 625 MHz (the PLL's VCO for 125 MHz from 100 MHz)
#: divided by 15: 41.67 MHz, three GMII cycles per core cycle. At width 64 that is 2.67 Gb/s of
#: datapath (and of memory bus) for the 1 Gb/s line. (25 MHz until 2026-12-05; 31.25 MHz, four
#: GMII cycles, until 2026-12-06: the netlist of a0789ac reached 43.89 MHz at 31.25 (seed 3)
#: and 43.57 (seed 5). A STORE inline crosses the core's memory bus three times (the responder
#: writes the Send into its receive buffer, the engine reads it back and writes the block), so
#: at 31.25 MHz a 4 KiB STORE inline ran at 0.596 of the line (issue 20). An earlier netlist met
#: 41.67 MHz at seed 3 but was not shipped for the suite's time, stop 49's note.)
CORE_FREQ = 625e6 / 15

#: QPs of the kbtp core with its memory in the board's DRAM: 64, as issue 22 item 3 asks (64
#: rdma_cm connections at once; their per-QP state is in memories: docs/architecture.md "Where
#: per-QP state lives"). The ECPIX-5 build at 64 met timing on every clock at seed 1 (2026-12-04:
#: GMII 137.36 MHz, +0.720 ns; core 33.09 MHz; LiteDRAM 63.02 MHz; LUT4 64,479 of 83,640, EBR 96).
#: Its GMII path is the MAC receive buffer's address register fanning out to its 16 EBRs (7.28 ns,
#: all routing). The block-RAM variant keeps 4 QPs (its pool is 128 KiB).
SHIPPED_QPS = 64

#: Settings of the stand-in cores at reset (host-link scratch registers 0..2 change them).
DEFAULT_IP = 0xC0A80132                # 192.168.1.50
DEFAULT_MAC = 0x024B42545001           # 02:4b:42:54:50:01, locally administered


class CoreSignature(wiring.Signature):
    """The members every core offers the board (see the module docstring)."""

    def __init__(self):
        super().__init__({"gmii": Out(GmiiSignature()), "bus": In(HostBusSignature())})


def check_core(core):
    """Raise ``TypeError`` naming what is missing when ``core`` does not fit the board."""
    members = core.signature.members
    for name, member in CoreSignature().members.items():
        if name not in members:
            raise TypeError(f"core {core!r} has no {name!r} member (see boards.cores)")
        got = members[name]
        if not (got.is_signature and got.flow == member.flow
                and got.signature.members == member.signature.members):
            raise TypeError(f"core {core!r} member {name!r} is {got!r}, "
                            f"expected {member!r}")


class _StandInCore(wiring.Component):
    """Shared part of the stand-in cores: GmiiMac(8) + the demo bus target."""

    def __init__(self, memory):
        self.memory = memory
        super().__init__({"gmii": Out(GmiiSignature()), "bus": In(HostBusSignature()),
                          "leds": Out(2)})

    def _mac_and_target(self, m, extra_counters=()):
        from hw.net.mac import GmiiMac

        mem = self.memory
        m.submodules.mac = mac = GmiiMac(8, rx_depth=mem.mac_fifo_bytes,
                                         tx_depth=mem.mac_fifo_bytes)
        counters = [mac.rx_frames_ok, mac.rx_fcs_errors, mac.tx_frames, mac.rx_overflows,
                    *extra_counters]
        m.submodules.target = target = HostBusDemoTarget(
            mem_words=mem.demo_mem_words, n_counters=len(counters),
            scratch_init=(DEFAULT_IP, DEFAULT_MAC >> 16, DEFAULT_MAC & 0xFFFF, 0))
        wiring.connect(m, wiring.flipped(self.bus), target.bus)
        for sig, value in zip(target.counters, counters):
            m.d.comb += sig.eq(value)
        m.d.comb += [
            mac.rxd.eq(self.gmii.rxd), mac.rx_dv.eq(self.gmii.rx_dv),
            mac.rx_er.eq(self.gmii.rx_er),
            self.gmii.txd.eq(mac.txd), self.gmii.tx_en.eq(mac.tx_en),
            self.gmii.tx_er.eq(mac.tx_er),
            self.leds.eq(Cat(self.gmii.rx_dv, self.gmii.tx_en)),
        ]
        return mac, target


class MacLoopbackCore(_StandInCore):
    """Every good frame received is sent back unchanged (MAC in loopback).

    Host-link map: :class:`~hw.target.hostlink.HostBusDemoTarget` with counters
    0 rx frames ok, 1 rx FCS errors, 2 tx frames, 3 rx overflows.
    """

    def elaborate(self, platform):
        m = Module()
        mac, _ = self._mac_and_target(m)
        m.submodules.rx_slice = rx_slice = RegisterSlice(8)
        wiring.connect(m, mac.rx, rx_slice.i)
        wiring.connect(m, rx_slice.o, mac.tx)
        return m


class MacArpCore(_StandInCore):
    """MAC + ARP responder: answers ARP requests for our IPv4 address, drops the rest.

    Own IPv4 address = scratch register 0, own MAC = scratch 1 (high 32 bits) : scratch 2
    (low 16 bits); reset values :data:`DEFAULT_IP`, :data:`DEFAULT_MAC`. Counters 0-3 as in
    :class:`MacLoopbackCore`, 4 ARP requests answered, 5 ARP frames ignored.
    """

    def elaborate(self, platform):
        from hw.net.arp import ArpResponder

        m = Module()
        m.submodules.arp = arp = ArpResponder(8)
        mac, target = self._mac_and_target(m, (arp.cnt_answered, arp.cnt_ignored))
        # Register stages on both sides of the responder: the MAC's receive FIFO hands out
        # block-RAM read data unregistered, and the responder decodes it combinationally.
        m.submodules.rx_slice = rx_slice = RegisterSlice(8)
        m.submodules.tx_slice = tx_slice = RegisterSlice(8)
        wiring.connect(m, mac.rx, rx_slice.i)
        wiring.connect(m, rx_slice.o, arp.i)
        wiring.connect(m, arp.o, tx_slice.i)
        wiring.connect(m, tx_slice.o, mac.tx)
        m.d.comb += [arp.own_ip.eq(target.scratch[0]),
                     arp.own_mac.eq(Cat(target.scratch[2][:16], target.scratch[1]))]
        return m


def _board_ram(mem_words, pipelined, dram=None, core_freq=None, litedram=False,
               litedram_core=None):
    """The target memory of a board core: :class:`boards.ram.PipelinedRam` (same bus contract
    as the target's one-cycle ``MemRam``), None for the target's own, or with ``dram`` (a
    :class:`boards.dram.DramTiming`) the DRAM timing model :class:`boards.dram.DramModel` at
    ``core_freq`` (simulation only: it stands where the DRAM controller will)."""
    if litedram:
        # The board's DDR3 through LiteDRAM (boards/litedram_bridge.py); its clock input is the
        # board's oscillator (BoardTop's ``osc`` domain, for cores with ``needs_osc``).
        from amaranth import ClockSignal
        from .litedram_bridge import BOARD_CORE, LiteDramCore
        return LiteDramCore(litedram_core or BOARD_CORE, clk=ClockSignal("osc"), pads="ddr3")
    if dram is not None:
        from .dram import DramModel
        return DramModel(mem_words, dram.cycles(core_freq), external_storage=True)
    from .ram import PipelinedRam
    return PipelinedRam(mem_words) if pipelined else None


def kbtp_mem_words(memory):
    """Target memory of the kbtp core in 8-octet words: the board's pool."""
    return memory.pool_bytes // 8


class KbtpCore1(wiring.Component):
    """The full target in one clock domain (``sync``, 125 MHz): core ``kbtp-1clk``.

    (Misses 125 MHz by far: ~27 MHz at width 8. Kept for comparison; :class:`KbtpCore` is the
    board default.)

    ``KbtpTarget(width=8, n_qp=4, n_mr=4, mem_words=kbtp_mem_words(memory), own_mac=DEFAULT_MAC,
    own_ip=DEFAULT_IP, engine=True)``. Flops sit
    on the GMII pins' side (the RGMII converter's flops are in another corner of the die), on
    the host bus (:class:`HostBusRegister`), and in the target memory (``pipelined_ram``). Host map: that of :mod:`hw.target.target`.
    ``leds``: 0 a frame is being received, 1 a frame is being sent.

    Parameters
    ----------
    memory : BoardMemoryConfig
    pipelined_ram : bool
        Replace the target's ``MemRam`` with :class:`boards.ram.PipelinedRam` (timing).
    **overrides
        Extra / replacement ``KbtpTarget`` keyword arguments (e.g. ``mem_words``).
    """

    def __init__(self, memory, *, pipelined_ram=True, **overrides):
        from hw.target.target import KbtpTarget

        self.memory = memory
        kwargs = dict(width=8, n_qp=4, n_mr=4, mem_words=kbtp_mem_words(memory),
                      own_mac=DEFAULT_MAC, own_ip=DEFAULT_IP, engine=True)
        kwargs.update(overrides)
        self.target_kwargs = kwargs
        # A pipelined, banked RAM (boards/ram.py) instead of the target's one-cycle MemRam: at
        # pool size its block-RAM output multiplexer alone takes most of a 125 MHz cycle.
        self.target = KbtpTarget(**kwargs, ram=_board_ram(kwargs["mem_words"], pipelined_ram))
        super().__init__({"gmii": Out(GmiiSignature()), "bus": In(HostBusSignature()),
                          "leds": Out(2)})

    def elaborate(self, platform):
        m = Module()
        m.submodules.target = t = self.target
        m.submodules.bus_reg = bus_reg = HostBusRegister()
        wiring.connect(m, wiring.flipped(self.bus), bus_reg.up)
        wiring.connect(m, bus_reg.down, t.host)
        g = self.gmii
        m.d.sync += [t.rxd.eq(g.rxd), t.rx_dv.eq(g.rx_dv), t.rx_er.eq(g.rx_er),
                     g.txd.eq(t.txd), g.tx_en.eq(t.tx_en), g.tx_er.eq(t.tx_er)]
        m.d.comb += self.leds.eq(Cat(g.rx_dv, g.tx_en))
        return m


def _gmii_flopped(m, gmii, mac, leds):
    """GMII between the board and a :class:`~hw.net.maccdc.MacCdc`, one flop each way on the
    pins' side (the RGMII converter's flops are in another corner); LEDs show rx_dv / tx_en."""
    m.d.sync += [mac.rxd.eq(gmii.rxd), mac.rx_dv.eq(gmii.rx_dv), mac.rx_er.eq(gmii.rx_er),
                 gmii.txd.eq(mac.txd), gmii.tx_en.eq(mac.tx_en), gmii.tx_er.eq(mac.tx_er)]
    m.d.comb += leds.eq(Cat(gmii.rx_dv, gmii.tx_en))


#: The board core's MAC transmit start (KbtpTarget ``mac_tx_start``, GmiiMac ``tx_start``), in
#: octets: the largest frame the target sends, so that every frame starts on the wire only once
#: it is wholly in the MAC's transmit buffer (8 KiB: one such frame and 96 % of the next; a
#: frame fits once the one before it has drained). The DDR3 cannot keep a
#: frame's source at the line's rate. Through the LiteDRAM bridge each 64-bit word is a BL8
#: command of its own, a read 40/24 and a write 45/24 core cycles at 41.67 MHz
#: (boards/dram.py DramTiming): sending at line rate (a word per 2.67 core cycles) takes 62 %
#: of the DDR3's commands, receiving at line rate, whose placement goes first (MemArbiter
#: ``urgent``), 70 %, refresh 7 % more. Under full-duplex load a frame's source may fall to a
#: third of the line's rate, and a frame started early runs dry on the wire (an underrun: the
#: frame is lost and waits for the transport's retransmission). The 5 %-loss soak found one at
#: round 1,836 (a 256-octet WRITE started at 128 octets). A start at a fixed fraction of the
#: frame would have to be some two thirds of the largest one; the whole frame costs a LOAD of
#: 64 octets one frame's fill from the DDR3 beyond its first 128 octets (some 10 octets at
#: 1.6 octets per GMII cycle). With two words per command (a bridge that pairs them) the
#: DDR3 would keep up with the line both ways and a short start would be safe again.
#: Largest frame: Ethernet 14, IPv4 20, UDP 8, BTH 12, RETH 16, ImmDt 4, a path MTU of 4096,
#: ICRC 4 (an RDMA WRITE Only with Immediate), rounded up to whole words: 4,176.
BOARD_TX_START = -(-(EthernetHeader.SIZE + IPv4Header.SIZE + UDPHeader.SIZE + BTH.SIZE
                     + RETH.SIZE + ImmDt.SIZE + 4096 + 4) // 8) * 8   # (+ the ICRC)


class KbtpCore(wiring.Component):
    """The full target on its own clock: MAC at 125 MHz, everything after it in ``core``.

    ``KbtpTarget(width=64, n_qp=SHIPPED_QPS, n_mr=8, mem_words=kbtp_mem_words(memory), mac=False,
    clk_hz=core_freq, own_mac=DEFAULT_MAC, own_ip=DEFAULT_IP, engine=True, udp_link=True)`` in
    the ``core`` domain, the GMII MAC in ``sync`` (:class:`~hw.net.maccdc.MacCdc`: 8 <-> 64
    sizers and asynchronous FIFOs), the host bus (:class:`HostBusRegister`) in ``core``, target memory
    :class:`boards.ram.PipelinedRam`. The board top sees ``core_freq`` / ``core_domain`` and
    clocks ``core`` from a PLL output, with the host link in ``core`` too.

    Parameters
    ----------
    memory : BoardMemoryConfig
    core_freq : float
        Frequency of the ``core`` domain (must be the PLL's VCO over an integer).
    pipelined_ram : bool
    dram : boards.dram.DramTiming or None
        The target memory is the whole DRAM; in simulation :class:`boards.dram.DramModel` with
        these DRAM costs (issue 22: what the pool in DDR3 costs) instead of block RAM.
    litedram : bool
        On the board: the target memory is the DDR3 through LiteDRAM (needs ``dram`` for its
        size and ``make litedram``; the ECPIX-5's kbtp core, boards/ecpix5.py).
    litedram_core : path or None
        The generated LiteDRAM core (boards/litedram_gen.py); None: ``build/litedram``, the
        ECPIX-5's (the Versa's is ``build/litedram_versa``, boards/versa.py).
    **overrides
        Extra / replacement ``KbtpTarget`` keyword arguments.
    """

    core_domain = "core"

    def __init__(self, memory, *, core_freq=CORE_FREQ, pipelined_ram=True, dram=None,
                 litedram=False, litedram_core=None, **overrides):
        from hw.target.target import KbtpTarget

        self.memory = memory
        self.core_freq = core_freq
        self.needs_osc = litedram
        self.dram = dram if litedram else None     # the board's DRAM holds the target memory
        kwargs = self.target_kwargs_of(memory, core_freq=core_freq, dram=dram, **overrides)
        self.target_kwargs = {**kwargs, "core_freq_hz": round(core_freq)}
        self.target = KbtpTarget(**kwargs, ram=_board_ram(kwargs["mem_words"], pipelined_ram,
                                                          dram, core_freq, litedram,
                                                          litedram_core))
        members = {"gmii": Out(GmiiSignature()), "bus": In(HostBusSignature()),
                   "leds": Out(2)}
        if litedram:
            # DDR3 ready (initialised and levelled), DDR3 error (init or levelling failed).
            members["dram_status"] = Out(2)
        super().__init__(members)

    @staticmethod
    def target_kwargs_of(memory, *, core_freq=CORE_FREQ, pipelined_ram=True, dram=None,
                         **overrides):
        """The ``KbtpTarget`` keyword arguments of the core for ``memory`` (without building
        it: the simulation of the shipped core reads its figures from here). With ``dram``
        the target memory is the whole DRAM (``dram.size_bytes``)."""
        # 8 memory regions: a session with DIRECT_LOAD (table and pool) and two DIRECT_ALLOC
        # partitions (counters, ring, blocks each) needs 2 + 3 * 2 of them (host/driver.py);
        # with 4 the board could not serve the configuration kbtp-sim serve runs.
        mem_words = dram.size_bytes // 8 if dram is not None else kbtp_mem_words(memory)
        # SHIPPED_QPS with the DDR3 (issue 22 item 3 asks for 64). The block-RAM variant
        # keeps 4: its 128 KiB of memory hold the pool and no more receive buffers (each QP
        # has its own, RecvBuffers).
        n_qp = SHIPPED_QPS if dram is not None else 4
        # No ACK hold with the DDR3 (KbtpTarget ``ack_hold``): a LOAD's WRITE comes some 50
        # core cycles after its request's ACK (a table entry and the payload from the DDR3),
        # when the ACK's frame (94 octet times, 31 core cycles) has left; holding the ACK
        # would only delay it. The block-RAM variant answers within the hold.
        kwargs = dict(width=64, n_qp=n_qp, n_mr=8, mem_words=mem_words,
                      own_mac=DEFAULT_MAC, own_ip=DEFAULT_IP, clk_hz=core_freq, mac=False,
                      mac_rx_depth=memory.mac_rx_bytes, mac_tx_start=BOARD_TX_START,
                      engine=True, udp_link=True, **({"ack_hold": 0} if dram is not None else {}))
        kwargs.update(overrides)
        return kwargs

    def elaborate(self, platform):
        from amaranth import DomainRenamer

        from hw.net.maccdc import MacCdc

        m = Module()
        core = DomainRenamer({"sync": self.core_domain})
        t = self.target
        m.submodules.target = core(t)
        bus_reg = HostBusRegister()
        m.submodules.bus_reg = core(bus_reg)
        wiring.connect(m, wiring.flipped(self.bus), bus_reg.up)
        wiring.connect(m, bus_reg.down, t.host)
        m.submodules.maccdc = cdc = MacCdc(t.width, mac_domain="sync",
                                           core_domain=self.core_domain,
                                           rx_depth=self.memory.mac_rx_bytes,
                                           tx_depth=self.memory.mac_fifo_bytes,
                                           tx_start=t.mac_tx_start,
                                           rx_cut_through=t.mac_rx_cut_through)
        if t.mac_rx_cut_through:
            wiring.connect(m, cdc.rx, t.rx)
        else:
            frame_from_packets(m, cdc.rx, t.rx)
        wiring.connect(m, t.tx, cdc.tx)
        for k in range(len(cdc.counters)):
            m.d.comb += t.mac_counters[k].eq(cdc.counters[k])
        m.d.comb += t.mac_rx_backlog.eq(cdc.rx_backlog)
        _gmii_flopped(m, self.gmii, cdc, self.leds)
        if "dram_status" in self.signature.members:
            # Status only (LEDs): the controller's flags, each through a synchroniser.
            from amaranth.lib.cdc import FFSynchronizer
            ram = t.ram
            for bit, flag in enumerate((ram.ready, ram.init_error | ram.level_error)):
                m.submodules[f"dram_status{bit}"] = FFSynchronizer(
                    flag, self.dram_status[bit], o_domain=self.core_domain)
        return m


class MacCdcLoopbackCore(wiring.Component):
    """The kbtp core's 125 MHz side without the target: :class:`~hw.net.maccdc.MacCdc` at
    width 64 (GmiiMac, 8 <-> 64 sizers, asynchronous FIFOs) in ``sync``, and in ``core``
    (:data:`CORE_FREQ`, as :class:`KbtpCore`) every good frame is sent back through a
    :class:`RegisterSlice`. The host link and the demo bus target run in ``core``.

    This is the stand-in whose timing CI checks by place and route: its ``sync`` logic is the
    full core's, gate for gate, and it places and routes in minutes instead of an hour.
    Host-link map: :class:`~hw.target.hostlink.HostBusDemoTarget`, counters 0 rx frames ok,
    1 rx FCS errors, 2 tx frames, 3 rx overflows.
    """

    core_domain = "core"

    def __init__(self, memory, *, core_freq=CORE_FREQ, width=64):
        self.memory = memory
        self.core_freq = core_freq
        self.width = width
        super().__init__({"gmii": Out(GmiiSignature()), "bus": In(HostBusSignature()),
                          "leds": Out(2)})

    def elaborate(self, platform):
        from amaranth import DomainRenamer

        from hw.net.maccdc import MAC_COUNTER_NAMES, MacCdc

        m = Module()
        mem = self.memory
        core = DomainRenamer({"sync": self.core_domain})
        m.submodules.maccdc = cdc = MacCdc(self.width, mac_domain="sync",
                                           core_domain=self.core_domain,
                                           rx_depth=mem.mac_fifo_bytes,
                                           tx_depth=mem.mac_fifo_bytes)
        m.submodules.loop = loop = core(RegisterSlice(self.width))
        wiring.connect(m, cdc.rx, loop.i)
        wiring.connect(m, loop.o, cdc.tx)
        counters = [cdc.counters[MAC_COUNTER_NAMES.index(name)] for name in
                    ("rx_frames_ok", "rx_fcs_errors", "tx_frames", "rx_overflows")]
        m.submodules.target = target = core(HostBusDemoTarget(
            mem_words=mem.demo_mem_words, n_counters=len(counters),
            scratch_init=(DEFAULT_IP, DEFAULT_MAC >> 16, DEFAULT_MAC & 0xFFFF, 0)))
        wiring.connect(m, wiring.flipped(self.bus), target.bus)
        for sig, value in zip(target.counters, counters):
            m.d.comb += sig.eq(value)
        _gmii_flopped(m, self.gmii, cdc, self.leds)
        return m


#: name -> (factory, description)
CORES = {
    "kbtp": (KbtpCore, "the full target: KbtpTarget (RoCE transport + KBTP engine), width 64 "
                       "in its own core clock, MAC at 125 MHz; its memory the board's DRAM "
                       "where the board says so (ECPIX-5: 512 MB of DDR3 through LiteDRAM, "
                       "make litedram first), else a pool-sized block RAM"),
    "kbtp-bram": (lambda memory, **options: KbtpCore(memory, **options),
                  "the full target with its memory in block RAM (ECPIX-5: 128 KiB of pool; "
                  "its default until the DDR3 one)"),
    "kbtp-1clk": (KbtpCore1, "the full target at width 8, all in the 125 MHz sync domain "
                             "(does not meet timing)"),
    "mac-loopback": (MacLoopbackCore, "GMII MAC, received frames sent back; demo bus target"),
    "mac-arp": (MacArpCore, "GMII MAC + ARP responder (hw/net/arp.py); demo bus target"),
    "mac-cdc": (MacCdcLoopbackCore, "the kbtp core's 125 MHz side (MacCdc, width 64, core "
                                    "clock) with a frame loopback in the core domain"),
}


def default_core_name():
    """The core a board builds unless told otherwise: the full target, ``kbtp``. (A broken
    gateware module fails the build with its own error; no stand-in core is chosen silently.)"""
    return "kbtp"


def _kbtp_ddr3(memory, **options):
    """Core ``kbtp-ddr3``: :class:`KbtpCore` with the board's ``kbtp-ddr3`` options, which put
    the target memory in the board's DRAM through LiteDRAM (``litedram=True``)."""
    if not options.get("litedram"):
        raise ValueError("core kbtp-ddr3 needs the board's options for it (BoardSpec.core_options"
                         "['kbtp-ddr3'] with litedram=True); the ECPIX-5's kbtp is its DDR3 core")
    return KbtpCore(memory, **options)


CORES["kbtp-ddr3"] = (_kbtp_ddr3, "the full target with its memory in the board's DDR3 through "
                                  "LiteDRAM, with the board's options for it (Versa: width 8, "
                                  "128 MB, make litedram-versa; does not fit the 45F, see "
                                  "boards/versa.py); the ECPIX-5's kbtp is that already")

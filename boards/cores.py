# Ref: brief board.md (core as a parameter of the board layer); hw/rtl/rgmii.py GmiiSignature;
#      hw/rtl/hostlink.py HostBusSignature; hw/rtl/mac.py GmiiMac; hw/rtl/arp.py ArpResponder.
"""The contract between the board layer and the core it hosts, plus stand-in cores.

A *core factory* is any callable ``factory(memory: BoardMemoryConfig) -> wiring.Component``
whose component has at least these members (the :class:`CoreSignature`)::

    gmii : Out(GmiiSignature())    # the core is the MAC side of GMII, in ``sync`` (125 MHz)
    bus  : In(HostBusSignature())  # the host link is the master; the core is the target

and optionally ``leds : Out(2)``. Everything runs in the ``sync`` domain that the board
provides (125 MHz from the board's oscillator through a PLL). The full KBTP core registers
here under its own name; the board files do not change.
"""

from amaranth import Cat, Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.rtl.hostlink import HostBusDemoTarget, HostBusSignature
from hw.rtl.rgmii import GmiiSignature
from hw.rtl.stream import PacketStream

__all__ = ["CoreSignature", "check_core", "RegisterSlice", "MacLoopbackCore", "MacArpCore", "CORES",
           "DEFAULT_IP", "DEFAULT_MAC", "default_core_name"]

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


class RegisterSlice(wiring.Component):
    """A full-throughput register stage (skid buffer) for a :func:`PacketStream`.

    Every output and ``i.ready`` come straight from flops, so a long combinational path on one
    side (e.g. a FIFO's block-RAM read data decoded by a header parser) no longer adds up with
    the other side's. Latency one cycle; one beat per cycle sustained.

    Ports
    -----
    i : In(PacketStream(width)), o : Out(PacketStream(width))
    """

    def __init__(self, width):
        super().__init__({"i": In(PacketStream(width)), "o": Out(PacketStream(width))})

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


class _StandInCore(wiring.Component):
    """Shared part of the stand-in cores: GmiiMac(8) + the demo bus target."""

    def __init__(self, memory):
        self.memory = memory
        super().__init__({"gmii": Out(GmiiSignature()), "bus": In(HostBusSignature()),
                          "leds": Out(2)})

    def _mac_and_target(self, m, extra_counters=()):
        from hw.rtl.mac import GmiiMac

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

    Host-link map: :class:`~hw.rtl.hostlink.HostBusDemoTarget` with counters
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
        from hw.rtl.arp import ArpResponder

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


def _available(module):
    try:
        __import__(module)
        return True
    except Exception:       # a block still being written elsewhere: not offered
        return False


#: name -> (factory, description)
CORES = {
    "mac-loopback": (MacLoopbackCore, "GMII MAC, received frames sent back; demo bus target"),
    "mac-arp": (MacArpCore, "GMII MAC + ARP responder (hw/rtl/arp.py); demo bus target"),
}


def default_core_name():
    """The most complete core whose gateware is present: ``mac-arp`` if arp.py imports."""
    return "mac-arp" if _available("hw.rtl.arp") else "mac-loopback"

# Ref: issue 21 item 4 (10 Gb/s in simulation: the datapath at width 64 behind an XGMII MAC at
#      156.25 MHz); IEEE 802.3 clause 46 (XGMII); hw/net/xgmii.py (XgmiiMac);
#      hw/target/target.py (KbtpTarget with mac=False: the MAC's streams and counters as ports).
"""The KBTP target behind the 10 Gb/s MAC: :class:`XgmiiKbtpTarget`.

::

    XGMII rx (64 + 8 bits) -> XgmiiMac.rx ---> KbtpTarget(width 64, mac=False).rx
    XGMII tx <--------------- XgmiiMac.tx <--- KbtpTarget.tx
                              XgmiiMac counters -> KbtpTarget.mac_counters (REG_TOP)

Everything runs in one clock domain, ``sync``: the XGMII clock of 156.25 MHz, at which a 64-bit
datapath carries exactly the 10 Gb/s line. This is what a 10G board would build (the open
toolchains here place no 10G transceiver, so no board of boards/ does): ``sim.vltarget``
simulates it (configuration ``10g``), ``boards.xgmii10g`` reports its Fmax and area on the ECP5.

The target is :class:`~hw.target.target.KbtpTarget` unchanged, as the boards' cores use it with
their MAC outside (boards/cores.py KbtpCore); its ``mac_rx_depth`` sizes the MAC's receive
buffer here, as it bounds the engine's RDMA READ window.
"""

from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.lib.stream import frame_from_packets
from hw.iface import HostBusSignature
from hw.net.xgmii import XgmiiMac
from hw.target.target import MAC_COUNTERS, KbtpTarget

__all__ = ["XgmiiKbtpTarget"]


class XgmiiKbtpTarget(wiring.Component):
    """:class:`~hw.target.target.KbtpTarget` at width 64 behind :class:`~hw.net.xgmii.XgmiiMac`.

    Parameters
    ----------
    width : int
        64 (the XGMII MAC's user side); any other raises ValueError.
    mac_depth, mac_rx_depth : int
        Octets of the MAC's transmit and receive frame buffers (powers of two).
    mac_tx_start : int or None
        The MAC's cut-through start (:class:`~hw.net.xgmii.XgmiiMac` ``tx_start``). None, the
        default: store-and-forward. At 10 Gb/s the 64-bit memory bus at 156.25 MHz moves
        exactly the line's rate, and the receive path's writes come first (MemArbiter
        ``urgent``): a frame sent while packets come in cannot be fed at the line rate, and a
        cut-through one would underrun.
    **kwargs
        Every other :class:`~hw.target.target.KbtpTarget` argument (``mac`` excepted).

    Ports
    -----
    xgmii_rxd : In(64), xgmii_rxc : In(8); xgmii_txd : Out(64), xgmii_txc : Out(8)
        XGMII, 64-bit SDR (lane 0 the first octet; ``rxc`` / ``txc`` bit i: lane i is a
        control character).
    host : In(HostBusSignature)
    """

    def __init__(self, width=64, *, mac_depth=8192, mac_rx_depth=32768, mac_tx_start=None,
                 **kwargs):
        if width != 64:
            raise ValueError(f"the XGMII MAC's user side is 64 bits wide, not {width}")
        if "mac" in kwargs:
            raise ValueError("XgmiiKbtpTarget has its own MAC")
        self.mac_depth, self.mac_rx_depth = mac_depth, mac_rx_depth
        self.target = KbtpTarget(width, mac=False, mac_rx_depth=mac_rx_depth,
                                 mac_tx_start=mac_tx_start, **kwargs)
        super().__init__({"xgmii_rxd": In(64), "xgmii_rxc": In(8),
                          "xgmii_txd": Out(64), "xgmii_txc": Out(8),
                          "host": In(HostBusSignature())})

    def elaborate(self, platform):
        m = Module()
        m.submodules.mac = mac = XgmiiMac(64, rx_depth=self.mac_rx_depth,
                                          tx_depth=self.mac_depth,
                                          tx_start=self.target.mac_tx_start,
                                          rx_cut_through=self.target.mac_rx_cut_through)
        m.submodules.target = t = self.target
        m.d.comb += [mac.xgmii_rxd.eq(self.xgmii_rxd), mac.xgmii_rxc.eq(self.xgmii_rxc),
                     self.xgmii_txd.eq(mac.xgmii_txd), self.xgmii_txc.eq(mac.xgmii_txc)]
        if t.mac_rx_cut_through:
            wiring.connect(m, mac.rx, t.rx)
        else:
            frame_from_packets(m, mac.rx, t.rx)
        wiring.connect(m, t.tx, mac.tx)
        for k, name in enumerate(MAC_COUNTERS):
            m.d.comb += t.mac_counters[k].eq(getattr(mac, name))
        m.d.comb += t.mac_rx_backlog.eq(mac.rx_backlog)   # RNR on backlog (hw/rdma/resp_exec.py)
        wiring.connect(m, wiring.flipped(self.host), t.host)
        return m

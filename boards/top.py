# Ref: hw/net/rgmii.py (clock domains); boards/cores.py (core contract);
#      docs/toolchain.md (constrain clocks on the pin: add_clock_constraint(port.io, f)).
"""The board top: clocks, RGMII, host link over the USB-serial port, LEDs, and the core.

::

    clk100 pin --IB--> EHXPLLL --CLKOP 125 MHz--> sync (MAC side of the core, RGMII TX)
                              |-CLKOS 125 MHz, 90 deg--> eth_tx90 (forwarded tx_clk)
                              `-CLKOS2 core_freq--> core (core and host link; only for a core
                                                    with ``core_freq``, e.g. kbtp)
    rx_clk pin (PHY, 125 MHz) ---------------------> eth_rx (RGMII RX, into an elastic FIFO)
    uart rx/tx <--> HostLinkUart (bus master) <--> core.bus
    eth_rgmii <--> Rgmii <--GMII (sync)--> core.gmii

Resets: each domain's reset is asserted asynchronously (PLL not locked, or the board's reset
button) and released synchronously, then driven onto a global network through a ``DCCA``
(:meth:`BoardTop._global_reset`).

Clock constraints sit on pins: the oscillator (from the board resource) and the PHY's
``rx_clk`` (125 MHz); nextpnr derives the PLL outputs' constraints (CLKOS2's too, from the
FREQUENCY_PIN attributes boards/clocks.py writes).
"""

from amaranth import (Cat, ClockDomain, ClockSignal, Const, DomainRenamer, Elaboratable, Instance,
                      Module, ResetSignal, Signal)
from amaranth.lib import io, wiring
from amaranth.lib.cdc import ResetSynchronizer

from hw.target.hostlink import HostLinkUart
from hw.net.rgmii import Rgmii

from .clocks import Ecp5Pll
from .cores import check_core

__all__ = ["BoardTop", "RGMII_RX_FREQ"]

RGMII_RX_FREQ = 125e6


class BoardTop(Elaboratable):
    """Top level for one board.

    Parameters
    ----------
    spec : BoardSpec
    core_factory : callable
        ``core_factory(spec.memory)`` -> component fitting :class:`boards.cores.CoreSignature`.
    baud : int
        Host-link UART rate.
    """

    def __init__(self, spec, core_factory, *, baud=115200):
        self.spec = spec
        self.core = core_factory(spec.memory)
        check_core(self.core)
        self.baud = baud

    @staticmethod
    def _global_reset(m, domain, arst):
        """Reset of ``domain``: asserted asynchronously by ``arst``, released synchronously
        (:class:`ResetSynchronizer`, in a helper domain on the same clock), then distributed
        through a ``DCCA`` global buffer. In fabric routing the reset (thousands of LSR pins)
        took 7.7 ns to reach the far end of the 125 MHz MAC logic (ECPIX-5, core
        ``mac-cdc``); on a global network every pin sees the same short delay, and the fabric
        keeps its wires for the datapath. nextpnr does not promote resets by itself (only
        clocks), so the buffer is instantiated here.
        """
        gen = f"{domain}_rstgen"
        m.domains += ClockDomain(gen)
        m.d.comb += ClockSignal(gen).eq(ClockSignal(domain))
        m.submodules[f"rst_sync_{domain}"] = ResetSynchronizer(arst, domain=gen)
        m.submodules[f"rst_dcc_{domain}"] = Instance(
            "DCCA", i_CLKI=ResetSignal(gen), i_CE=Const(1), o_CLKO=ResetSignal(domain))

    def elaborate(self, platform):
        m = Module()
        spec = self.spec

        # ---- clocks and reset -------------------------------------------------------------
        clk_pin = platform.request(platform.default_clk, 0, dir="-")
        m.submodules.clk_buf = clk_buf = io.Buffer("i", clk_pin)
        # A core with its own clock (``core_freq``, ``core_domain``) gets the third output.
        core_freq = getattr(self.core, "core_freq", None)
        core_domain = getattr(self.core, "core_domain", "sync") if core_freq else "sync"
        link_freq = core_freq or spec.sys_freq
        m.submodules.pll = pll = Ecp5Pll(
            spec.osc_freq, spec.sys_freq,
            [(spec.sys_freq, 90)] + ([(core_freq, 0)] if core_freq else []))
        m.d.comb += pll.clk_in.eq(clk_buf.i)
        m.domains.sync = ClockDomain("sync")
        m.domains.eth_tx90 = ClockDomain("eth_tx90", reset_less=True)
        m.d.comb += [ClockSignal("sync").eq(pll.clk_out[0]),
                     ClockSignal("eth_tx90").eq(pll.clk_out[1])]
        m.submodules.rst_buf = rst_buf = io.Buffer(
            "i", platform.request(platform.default_rst, 0, dir="-"))
        arst = ~pll.locked | rst_buf.i
        self._global_reset(m, "sync", arst)
        if getattr(self.core, "needs_osc", False):
            # The oscillator itself, for a core that runs its own PLL from it (LiteDRAM's CRG).
            m.domains.osc = ClockDomain("osc", reset_less=True)
            m.d.comb += ClockSignal("osc").eq(clk_buf.i)
        if core_freq:
            m.domains += ClockDomain(core_domain)
            m.d.comb += ClockSignal(core_domain).eq(pll.clk_out[2])
            self._global_reset(m, core_domain, arst)

        # ---- Ethernet ---------------------------------------------------------------------
        eth = platform.request("eth_rgmii", spec.eth_index, dir="-")
        platform.add_clock_constraint(eth.rx_clk.io, RGMII_RX_FREQ)
        m.submodules.rgmii = rgmii = Rgmii(eth, tx_clock=spec.tx_clock,
                                           rx_delay_taps=spec.rx_delay_taps)

        # ---- host link and core -----------------------------------------------------------
        uart = platform.request("uart", 0, dir="-")
        m.submodules.uart_rx = uart_rx = io.Buffer("i", uart.rx)
        m.submodules.uart_tx = uart_tx = io.Buffer("o", uart.tx)
        link = HostLinkUart(self.baud, link_freq, max_words=spec.memory.hostlink_words)
        m.submodules.hostlink = DomainRenamer({"sync": core_domain})(link)
        m.d.comb += [link.rx.eq(uart_rx.i), uart_tx.o.eq(link.tx)]
        m.submodules.core = core = self.core
        wiring.connect(m, link.bus, core.bus)
        wiring.connect(m, rgmii.gmii, core.gmii)

        # ---- LEDs: heartbeat, PHY out of reset, and two core activity lines stretched ------
        heartbeat = Signal(27)
        m.d.sync += heartbeat.eq(heartbeat + 1)
        activity = core.leds if "leds" in core.signature.members else Signal(2)
        # Two flip-flops between the activity lines (flopped by the GMII pins) and the timers
        # (by the LED pins, across the die on the ECPIX-5): without them that one net was the
        # 125 MHz clock's critical path, 7.7 ns of routing of its 8.6 ns (nextpnr's static
        # placer, 2026-12-05). A blink 16 ns late is not seen.
        act_r = [Signal(2, name=f"activity_r{k}") for k in range(2)]
        m.d.sync += [act_r[0].eq(activity), act_r[1].eq(act_r[0])]
        activity = act_r[1]
        stretched = []
        for i in range(2):
            timer = Signal(23)      # ~67 ms at 125 MHz: visible blinks for single frames
            with m.If(activity[i]):
                m.d.sync += timer.eq((1 << 23) - 1)
            with m.Elif(timer != 0):
                m.d.sync += timer.eq(timer - 1)
            stretched.append(timer != 0)
        status = Cat(heartbeat[-1], rgmii.phy_ready, *stretched)
        leds = []
        for i, (res, num, sub) in enumerate(spec.led_resources[:4]):
            led = platform.request(res, num, dir="-")
            leds.append(led)
            m.submodules[f"led{i}"] = buf = io.Buffer("o", getattr(led, sub) if sub else led)
            m.d.comb += buf.o.eq(status[i])
        # A core with DRAM (``dram_status``: ready, error; in the core's clock) lights the first
        # LED's other colours where the LEDs have them (ECPIX-5's RGB LEDs): blue once the DDR3
        # is initialised and levelled, red if that failed.
        if "dram_status" in core.signature.members and spec.led_resources[0][2]:
            for colour, bit in (("b", 0), ("r", 1)):
                m.submodules[f"led0_{colour}"] = buf = io.Buffer("o", getattr(leds[0], colour))
                m.d.comb += buf.o.eq(core.dram_status[bit])
        return m

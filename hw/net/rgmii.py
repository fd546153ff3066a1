# Ref: RGMII v2.0 (HP, 2002) §3 (signal definitions: TXD[3:0]/TX_CTL on the rising edge,
#      TXD[7:4] and TX_EN xor TX_ER on the falling edge; same for RX), §3.3 (clock skew: the
#      receiver needs data held ~1.0-2.6 ns around the clock, added on the PCB, by the PHY's
#      internal delay, or by the FPGA); IEEE 802.3 §35.2 (GMII); Lattice FPGA-TN-02035
#      (ECP5 sysIO: IDDRX1F/ODDRX1F, DELAYG).
"""RGMII <-> GMII for ECP5, with the receive clock crossing into the core's clock.

Clocks
------
- ``eth_rx``: the PHY's receive clock (125 MHz at 1 Gb/s), created here from the ``rx_clk``
  pin. The DDR input registers run on it.
- ``sync``: the core's clock, 125 MHz, which the board derives from its oscillator with a PLL.
  The GMII side of :class:`Rgmii` and the transmit DDR registers are in ``sync``.
- ``eth_tx90`` (only with ``tx_clock="shifted"``): ``sync`` shifted by 90 degrees (2 ns), from
  the same PLL.

Only 1000BASE-T is handled (8 bits per clock on GMII); 10/100 Mb/s (4 bits per clock, 2.5/25 MHz)
and RGMII in-band status are not.

Clock/data skew (which side adds the ~2 ns)
-------------------------------------------
- Transmit, ``tx_clock="shifted"``: ``tx_clk`` is forwarded from ``eth_tx90`` through a DDR
  output register driving ``(1, 0)``, so its edges sit 90 degrees (2 ns) after the data edges;
  the PHY must *not* add its own TX delay. ``tx_clock="phy"``: ``tx_clk`` is forwarded from
  ``sync`` edge-aligned with the data and the PHY adds the delay (RGMII-ID / TXDLY strap).
- Receive, ``rx_delay_taps=0``: the PHY delays ``rx_clk`` (RXDLY strap), data is sampled as is.
  ``rx_delay_taps=N``: each data/ctl input goes through an ECP5 ``DELAYG`` of N taps (about
  25 ps each, so 80 taps ~ 2 ns) before its ``IDDRX1F``.

Board choices (:mod:`boards`): ECPIX-5 (RTL8211E, RX delay in the PHY): ``shifted`` / 0 taps.
Versa ECP5 (88E1512 in RGMII-ID mode, both delays in the PHY): ``phy`` / 0 taps. These follow
the delays LiteX-Boards' targets for the two boards use; they could not be checked on hardware
here. The DELAYG path is for boards whose PHY adds no RX delay.

Receive clock crossing
----------------------
The PHY clock and ``sync`` differ by up to +-100 ppm each, so :class:`RgmiiRxElastic` crosses
GMII through an ``AsyncFIFO`` as an elastic buffer: it stores the octets of a frame plus an
end-of-frame marker, and the ``sync`` side starts replaying a frame only once ``start_level``
octets are buffered (or the frame has ended), so a frame never runs dry at 200 ppm for any
frame up to ``start_level / 200e-6`` octets (20 000 for the default 4). If it ever does, the
rest of the frame is marked with ``rx_er`` (the MAC drops it) and ``rx_underruns`` counts it.
"""

from amaranth import Cat, ClockDomain, ClockSignal, Const, Instance, Module, Signal
from amaranth.lib import fifo, io, wiring
from amaranth.lib.cdc import ResetSynchronizer
from amaranth.lib.wiring import In, Out

__all__ = ["GmiiSignature", "RgmiiRxElastic", "Rgmii", "PlatformRgmiiIO", "rgmii_pin"]


class GmiiSignature(wiring.Signature):
    """GMII as seen from the MAC: ``txd``/``tx_en``/``tx_er`` out, ``rxd``/``rx_dv``/``rx_er`` in.

    All six are in one clock domain (the MAC's, 125 MHz).
    """

    def __init__(self):
        super().__init__({
            "txd": Out(8), "tx_en": Out(1), "tx_er": Out(1),
            "rxd": In(8), "rx_dv": In(1), "rx_er": In(1),
        })


def rgmii_pin(pins, name):
    """The subsignal ``name`` of an ``eth_rgmii`` resource, whichever spelling the board uses.

    amaranth-boards 0.0.21 names the control lines ``tx_ctrl``/``rx_ctrl`` on ECPIX-5 and on
    Versa ECP5 port 1, but ``tx_ctl``/``rx_ctl`` on Versa port 0.
    """
    for candidate in (name, name.replace("_ctl", "_ctrl"), name.replace("_ctrl", "_ctl")):
        if hasattr(pins, candidate):
            return getattr(pins, candidate)
    raise AttributeError(f"RGMII resource {pins!r} has no {name!r} (nor _ctl/_ctrl variant)")


class RgmiiRxElastic(wiring.Component):
    """GMII receive from the ``eth_rx`` domain to ``sync`` through an elastic AsyncFIFO.

    Ports
    -----
    i_rxd, i_rx_dv, i_rx_er : In   (``eth_rx`` domain)
    rxd, rx_dv, rx_er : Out        (``sync``; registered)
    underruns : Out(32)            (``sync``) frames cut short by an empty buffer
    overflows : Out(32)            (``eth_rx``) octets lost to a full buffer
    """

    i_rxd: In(8)
    i_rx_dv: In(1)
    i_rx_er: In(1)
    rxd: Out(8)
    rx_dv: Out(1)
    rx_er: Out(1)
    underruns: Out(32)
    overflows: Out(32)

    def __init__(self, *, depth=16, start_level=4, w_domain="eth_rx"):
        if start_level >= depth:
            raise ValueError(f"start_level {start_level} must be below depth {depth}")
        self.depth = depth
        self.start_level = start_level
        self.w_domain = w_domain
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        m.submodules.fifo = f = fifo.AsyncFIFO(width=10, depth=self.depth,
                                               r_domain="sync", w_domain=self.w_domain)
        wd = m.d[self.w_domain]

        # Write side: one entry per octet with rx_dv, then an end marker when rx_dv falls.
        prev_dv = Signal()
        wd += prev_dv.eq(self.i_rx_dv)
        end = prev_dv & ~self.i_rx_dv
        m.d.comb += [
            f.w_en.eq(self.i_rx_dv | end),
            f.w_data.eq(Cat(self.i_rxd, self.i_rx_er & self.i_rx_dv, end)),
        ]
        with m.If(f.w_en & ~f.w_rdy):
            wd += self.overflows.eq(self.overflows + 1)

        # Read side.
        r_data, r_er, r_end = f.r_data[:8], f.r_data[8], f.r_data[9]
        waited = Signal(range(2 * self.start_level + 1))
        m.d.sync += [self.rx_dv.eq(0), self.rx_er.eq(0)]
        with m.FSM(name="elastic"):
            with m.State("IDLE"):
                with m.If(f.r_rdy):
                    m.d.sync += waited.eq(waited + 1)
                with m.Else():
                    m.d.sync += waited.eq(0)
                # Enough octets buffered, or a short burst that has been sitting there (the
                # end marker of a tiny fragment may be all there is).
                with m.If((f.r_level >= self.start_level) | (waited == 2 * self.start_level)):
                    m.d.sync += waited.eq(0)
                    m.next = "FRAME"
            with m.State("FRAME"):
                m.d.comb += f.r_en.eq(1)
                with m.If(f.r_rdy):
                    with m.If(r_end):
                        m.next = "IDLE"
                    with m.Else():
                        m.d.sync += [self.rxd.eq(r_data), self.rx_dv.eq(1), self.rx_er.eq(r_er)]
                with m.Else():
                    # Ran dry inside a frame: poison it, then discard up to its end marker.
                    m.d.sync += [self.rx_dv.eq(1), self.rx_er.eq(1),
                                 self.underruns.eq(self.underruns + 1)]
                    m.next = "DISCARD"
            with m.State("DISCARD"):
                m.d.comb += f.r_en.eq(1)
                with m.If(f.r_rdy & r_end):
                    m.next = "IDLE"
        return m


class PlatformRgmiiIO:
    """Creates the I/O buffers of :class:`Rgmii` on a real platform (ECP5).

    Each method adds its buffer to ``m`` and returns the core-side signals. A simulation test
    passes an object with the same methods that models the DDR registers behaviourally.
    """

    def clock_in(self, m, name, pin):
        m.submodules[name] = buf = io.Buffer("i", pin)
        return buf.i

    def out(self, m, name, pin):
        m.submodules[name] = buf = io.Buffer("o", pin)
        return buf.o

    def ddr_out(self, m, name, pin, domain):
        m.submodules[name] = buf = io.DDRBuffer("o", pin, o_domain=domain)
        return buf.o[0], buf.o[1]

    def ddr_in(self, m, name, pin, domain, delay_taps=0):
        if not delay_taps:
            m.submodules[name] = buf = io.DDRBuffer("i", pin, i_domain=domain)
            return buf.i[0], buf.i[1]
        # IB -> DELAYG -> IDDRX1F by hand: lib.io has no input delay. Q0 is the rising-edge
        # sample, Q1 the following falling-edge sample, both updated on the next rising edge
        # (the same relation as io.DDRBuffer's i[0]/i[1] on ECP5).
        if any(pin.invert):
            raise ValueError(f"{name}: inverted pins are not supported with a delay")
        width = len(pin)
        q0, q1 = Signal(width, name=f"{name}_q0"), Signal(width, name=f"{name}_q1")
        for bit in range(width):
            pad = Signal(name=f"{name}_pad{bit}")
            dly = Signal(name=f"{name}_dly{bit}")
            m.submodules[f"{name}_ib{bit}"] = Instance("IB", i_I=pin.io[bit], o_O=pad)
            m.submodules[f"{name}_delay{bit}"] = Instance(
                "DELAYG", p_DEL_MODE="USER_DEFINED", p_DEL_VALUE=delay_taps,
                i_A=pad, o_Z=dly)
            m.submodules[f"{name}_iddr{bit}"] = Instance(
                "IDDRX1F", i_SCLK=ClockSignal(domain), i_RST=Const(0), i_D=dly,
                o_Q0=q0[bit], o_Q1=q1[bit])
        return q0, q1


class Rgmii(wiring.Component):
    """RGMII PHY interface for ECP5: DDR I/O, clocking and the receive clock crossing.

    Parameters
    ----------
    pins : object
        The ``eth_rgmii`` resource requested with ``dir="-"`` (``tx_clk``, ``tx_ctl``/``tx_ctrl``,
        ``tx_data``, ``rx_clk``, ``rx_ctl``/``rx_ctrl``, ``rx_data``, optional ``rst``).
    tx_clock : "shifted" or "phy"
        Who adds the transmit clock delay (see the module docstring).
    rx_delay_taps : int
        DELAYG taps on the receive data (0: the PHY delays ``rx_clk``).
    phy_reset_cycles : int
        ``sync`` cycles the PHY is held in reset after our own reset (0: leave ``rst`` alone).
    io_provider : object
        Builds the buffers; :class:`PlatformRgmiiIO` by default.

    Ports
    -----
    gmii : In(GmiiSignature())  the MAC side, in ``sync``
    rx_underruns : Out(32)      (``sync``), see :class:`RgmiiRxElastic`
    phy_ready : Out(1)          PHY reset released
    """

    gmii: In(GmiiSignature())
    rx_underruns: Out(32)
    phy_ready: Out(1)

    def __init__(self, pins, *, tx_clock="shifted", rx_delay_taps=0, phy_reset_cycles=1 << 21,
                 elastic_depth=16, io_provider=None):
        if tx_clock not in ("shifted", "phy"):
            raise ValueError(f"tx_clock {tx_clock!r} is neither 'shifted' nor 'phy'")
        if not 0 <= rx_delay_taps <= 127:
            raise ValueError(f"rx_delay_taps {rx_delay_taps} is not in 0..127 (DELAYG range)")
        self.pins = pins
        self.tx_clock = tx_clock
        self.rx_delay_taps = rx_delay_taps
        self.phy_reset_cycles = phy_reset_cycles
        self.elastic_depth = elastic_depth
        self.io = io_provider or PlatformRgmiiIO()
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        pins, iop = self.pins, self.io

        # ---- receive: PHY clock domain, DDR capture, elastic crossing into sync ------------
        m.domains.eth_rx = ClockDomain("eth_rx")
        m.d.comb += ClockSignal("eth_rx").eq(iop.clock_in(m, "rx_clk_buf", pins.rx_clk))
        # eth_rx leaves reset only once its clock runs; a missing PHY clock keeps it in reset.
        m.submodules.rx_rst = ResetSynchronizer(~self.phy_ready, domain="eth_rx")

        rxd0, rxd1 = iop.ddr_in(m, "rx_data_ddr", pins.rx_data, "eth_rx", self.rx_delay_taps)
        ctl0, ctl1 = iop.ddr_in(m, "rx_ctl_ddr", rgmii_pin(pins, "rx_ctl"), "eth_rx",
                                self.rx_delay_taps)
        m.submodules.elastic = el = RgmiiRxElastic(depth=self.elastic_depth)
        # Rising edge: RXD[3:0] and RX_DV; falling edge: RXD[7:4] and RX_DV xor RX_ER.
        m.d.eth_rx += [
            el.i_rxd.eq(Cat(rxd0, rxd1)),
            el.i_rx_dv.eq(ctl0),
            el.i_rx_er.eq(ctl0 ^ ctl1),
        ]
        m.d.comb += [
            self.gmii.rxd.eq(el.rxd), self.gmii.rx_dv.eq(el.rx_dv), self.gmii.rx_er.eq(el.rx_er),
            self.rx_underruns.eq(el.underruns),
        ]

        # ---- transmit: DDR launch in sync, clock forwarded edge-aligned or 90 deg later ----
        txd = Signal(8)
        tx_en = Signal()
        tx_er = Signal()
        m.d.sync += [txd.eq(self.gmii.txd), tx_en.eq(self.gmii.tx_en), tx_er.eq(self.gmii.tx_er)]
        d0, d1 = iop.ddr_out(m, "tx_data_ddr", pins.tx_data, "sync")
        c0, c1 = iop.ddr_out(m, "tx_ctl_ddr", rgmii_pin(pins, "tx_ctl"), "sync")
        m.d.comb += [d0.eq(txd[:4]), d1.eq(txd[4:]), c0.eq(tx_en), c1.eq(tx_en ^ tx_er)]
        clk_domain = "eth_tx90" if self.tx_clock == "shifted" else "sync"
        k0, k1 = iop.ddr_out(m, "tx_clk_ddr", pins.tx_clk, clk_domain)
        m.d.comb += [k0.eq(1), k1.eq(0)]

        # ---- PHY reset ---------------------------------------------------------------------
        if self.phy_reset_cycles and hasattr(pins, "rst"):
            timer = Signal(range(self.phy_reset_cycles + 1))
            with m.If(timer != self.phy_reset_cycles):
                m.d.sync += timer.eq(timer + 1)
            with m.Else():
                m.d.sync += self.phy_ready.eq(1)
            # The resource's PinsN makes rst active low on the board; here 1 = in reset.
            m.d.comb += iop.out(m, "phy_rst_buf", pins.rst).eq(~self.phy_ready)
        else:
            m.d.sync += self.phy_ready.eq(1)
        return m

# Ref: issue 21 item 4 ("report its Fmax and area on the ECP5 for comparison");
#      sim/vltarget.py XGMII_10G (the configuration the 10 Gb/s bench simulates);
#      hw/net/xgmii.py; boards/clocks.py (EHXPLLL), boards/build.py, boards/report.py.
"""Fmax and area of the 10 Gb/s configuration on the ECPIX-5's ECP5 (LFE5UM5G-85F), for
comparison: ``python -m boards.xgmii10g [--seed N] [--build-root DIR]`` (``make fmax-10g``).

The 10 Gb/s configuration (:data:`XGMII_10G`, simulated as :data:`sim.vltarget.XGMII_10G`) is
the one-clock target at width 64 behind the XGMII MAC, everything at 156.25 MHz. No board here
has a 10G PHY, and the ECP5's SERDES stop at 5 Gb/s (shared/notes/platform-facts.md), so this is
not a board build: the XGMII pins and the host bus have no package pins. Instead every input of
the target comes from one shift register filled from one pin (the UART's RX), and every output
is folded by XOR into one register on an LED, so that synthesis can remove nothing and no I/O
timing enters the figures. The PLL makes 156.25 MHz from the 100 MHz oscillator (VCO 625 MHz /
4); nextpnr checks the target against it.

What differs from the simulated configuration, and why: the target memory is
:data:`MEM_WORDS` words of block RAM (128 KiB), not the 4 MiB the bench's unit target has,
which no ECP5 holds (208 EBR of 2 KiB). A 10G board would put its pool in DRAM behind a
controller, as the ECPIX-5's kbtp core does.
"""

import argparse
import json
import sys
import time
from pathlib import Path

from amaranth import Cat, ClockDomain, ClockSignal, Elaboratable, Module, Signal
from amaranth.lib import io

from .clocks import Ecp5Pll
from .top import BoardTop

__all__ = ["XGMII_FREQ", "MAC_RX_10G", "XGMII_10G", "MEM_WORDS", "FMAX_KWARGS",
           "Xgmii10gFmaxTop", "build_10g", "main"]

#: XGMII clock: 10 Gb/s / 64 bits.
XGMII_FREQ = 156.25e6
#: The 10 Gb/s MAC's receive buffer: 128 KiB, four times the 1 Gb/s cores' 32 KiB. It bounds
#: the engine's RDMA READ window (hw/kbtp/engine.py read_window_for), and READ data at 10 Gb/s
#: needs ten times the octets in flight for the same round trip: with 32 KiB, STORE by READ of
#: 16 KiB blocks at path MTU 4096 ran one READ at a time (0.655 of the theoretical goodput;
#: 1.013 with 128 KiB), and 8 inline STOREs of 16 KiB outstanding overflowed it (the peer
#: resent 606 packets at MTU 1024; none with 128 KiB). 64 of the ECP5's 208 EBR.
MAC_RX_10G = 131072
#: The 10 Gb/s configuration's KbtpTarget arguments beside those of the unit target (which
#: :data:`sim.vltarget.XGMII_10G` adds: 4 QPs, 8 MRs, 4 MiB of memory): width 64 behind the
#: XGMII MAC (hw/target/xgmii_target.py XgmiiKbtpTarget), the requester's timers counting
#: 156.25 MHz cycles, and a MAC receive buffer of 128 KiB (:data:`MAC_RX_10G`).
XGMII_10G = {"width": 64, "mac": "xgmii", "clk_hz": XGMII_FREQ, "mac_rx_depth": MAC_RX_10G}
#: Target memory of the ECP5 build: 128 KiB of block RAM (the kbtp-bram core's pool size).
MEM_WORDS = 16384
#: KbtpTarget arguments of the ECP5 build: the simulated configuration's QPs and MRs
#: (tests/sim/test_vltarget_10g.py checks they agree), :data:`MEM_WORDS` of memory, and
#: timers in real time (the simulation scales them by 16 to run faster).
FMAX_KWARGS = {**XGMII_10G, "n_qp": 4, "n_mr": 8, "mem_words": MEM_WORDS}


class Xgmii10gFmaxTop(Elaboratable):
    """The 10 Gb/s KbtpTarget at 156.25 MHz with its ports on a shift register and an XOR."""

    def __init__(self, spec):
        from hw.target.xgmii_target import XgmiiKbtpTarget
        self.spec = spec
        kw = {k: v for k, v in FMAX_KWARGS.items() if k != "mac"}
        self.target = XgmiiKbtpTarget(kw.pop("width"), **kw)

    def elaborate(self, platform):
        m = Module()
        spec = self.spec
        clk_pin = platform.request(platform.default_clk, 0, dir="-")
        m.submodules.clk_buf = clk_buf = io.Buffer("i", clk_pin)
        m.submodules.pll = pll = Ecp5Pll(spec.osc_freq, XGMII_FREQ)
        m.d.comb += pll.clk_in.eq(clk_buf.i)
        m.domains.sync = ClockDomain("sync")
        m.d.comb += ClockSignal("sync").eq(pll.clk_out[0])
        m.submodules.rst_buf = rst_buf = io.Buffer(
            "i", platform.request(platform.default_rst, 0, dir="-"))
        BoardTop._global_reset(m, "sync", ~pll.locked | rst_buf.i)

        m.submodules.target = t = self.target
        uart = platform.request("uart", 0, dir="-")
        m.submodules.din = din = io.Buffer("i", uart.rx)
        ins = [t.xgmii_rxd, t.xgmii_rxc, t.host.space.as_value(), t.host.addr, t.host.wdata,
               t.host.we, t.host.re]
        outs = [t.xgmii_txd, t.xgmii_txc, t.host.rdata, t.host.ack, t.host.err]
        n_in = sum(len(s) for s in ins)
        sr = Signal(n_in)
        m.d.sync += sr.eq(Cat(din.i, sr[:-1]))
        m.d.comb += Cat(*ins).eq(sr)
        fold = Signal()
        m.d.sync += fold.eq(Cat(*outs).xor())
        res, num, sub = spec.led_resources[0]
        pin = platform.request(res, num, dir="-")
        m.submodules.led = led = io.Buffer("o", getattr(pin, sub) if sub else pin)
        m.d.comb += led.o.eq(fold)
        return m


def build_10g(*, board="ecpix5", build_root=None, seed=None):
    """Synthesise, place and route :class:`Xgmii10gFmaxTop`; the report dict (report.json)."""
    from . import BOARDS
    from .build import BUILD_ROOT, tool_env
    from .report import make_report
    spec = BOARDS[board]
    seed = spec.nextpnr_seed if seed is None else seed
    env = tool_env()
    out = Path(build_root or BUILD_ROOT) / f"{board}-10g"
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("nextpnr-report.json", "top.bit", "top.tim"):
        (out / stale).unlink(missing_ok=True)
    platform = spec.platform()
    t0 = time.monotonic()
    plan = platform.prepare(Xgmii10gFmaxTop(spec), name="top", nextpnr_opts=" ".join([
        "--timing-allow-fail", "--seed", str(seed), "--router", spec.nextpnr_router,
        "--report", "nextpnr-report.json", *spec.nextpnr_opts]))
    error = None
    try:
        plan.execute_local(str(out), env=env)
    except Exception as exc:        # the report says what was reached
        error = f"build failed: {exc}"
    report = make_report(out, board=board, core="kbtp-10g (XGMII, fmax only)",
                         device=f"{platform.device}-{platform.speed}{platform.package}",
                         build_time_s=time.monotonic() - t0)
    report.update(error=error, seed=seed, target_params=FMAX_KWARGS)
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    return report


def main(argv=None):
    from .build import print_report
    ap = argparse.ArgumentParser(prog="python -m boards.xgmii10g",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--build-root", default=None)
    a = ap.parse_args(argv)
    report = build_10g(build_root=a.build_root, seed=a.seed)
    print_report(report)
    return 0 if report.get("timing_met") and not report.get("error") else 1


if __name__ == "__main__":
    sys.exit(main())

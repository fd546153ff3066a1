# Ref: Lattice FPGA-TN-02200 (ECP5 sysCLOCK PLL: EHXPLLL, PFD 3.125-400 MHz, VCO 400-800 MHz,
#      output dividers 1-128, phase in VCO cycles (CPHASE) + eighths (FPHASE)); the parameter
#      conventions match what Project Trellis' ecppll emits (checked in tests/boards/test_board.py).
"""ECP5 PLL (EHXPLLL) with one primary and up to three phase-shifted secondary outputs."""

from amaranth import Instance, Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["pll_params", "Ecp5Pll"]

PFD_MIN, PFD_MAX = 3.125e6, 400e6
VCO_MIN, VCO_MAX = 400e6, 800e6


def pll_params(f_in, f_out, secondary=()):
    """Divider and phase settings for ``f_out`` on CLKOP plus ``secondary`` outputs.

    Parameters
    ----------
    f_in, f_out : float
        Input and primary output frequencies in Hz (CLKOP is also the feedback).
    secondary : sequence of (frequency, phase_degrees)
        Outputs CLKOS, CLKOS2, CLKOS3.

    Returns
    -------
    dict
        ``clki_div``, ``clkfb_div``, ``vco``, and ``outputs``: a list of
        ``(div, cphase, fphase, achieved_frequency)``, primary first.

    Raises
    ------
    ValueError
        When no setting reaches a frequency within 0.1 % or the phase is not reachable.
    """
    if len(secondary) > 3:
        raise ValueError(f"{len(secondary)} secondary outputs: EHXPLLL has 3")
    best = None
    for clki_div in range(1, 129):
        pfd = f_in / clki_div
        if not PFD_MIN <= pfd <= PFD_MAX:
            continue
        for clkfb_div in range(1, 81):
            fout = pfd * clkfb_div
            for op_div in range(1, 129):
                vco = fout * op_div
                if not VCO_MIN <= vco <= VCO_MAX:
                    continue
                err = abs(fout - f_out)
                # Prefer the smallest error, then a VCO near the middle of its range (as ecppll).
                key = (err, abs(vco - 600e6))
                if best is None or key < best[0]:
                    best = (key, clki_div, clkfb_div, op_div, vco, fout)
    if best is None or best[0][0] > 1e-3 * f_out:
        raise ValueError(f"no EHXPLLL setting gives {f_out / 1e6:g} MHz from {f_in / 1e6:g} MHz")
    _, clki_div, clkfb_div, op_div, vco, fout = best
    op_cphase = (op_div - 1) // 2          # ecppll's primary phase origin
    outputs = [(op_div, op_cphase, 0, fout)]
    for freq, phase in secondary:
        div = round(vco / freq)
        if not 1 <= div <= 128 or abs(vco / div - freq) > 1e-3 * freq:
            raise ValueError(f"secondary output {freq / 1e6:g} MHz is not VCO {vco / 1e6:g} MHz "
                             f"divided by an integer 1..128")
        # Phase in VCO cycles of this output: whole cycles go to CPHASE, eighths to FPHASE.
        steps = round(phase / 360 * div * 8)
        outputs.append((div, op_cphase + steps // 8, steps % 8, vco / div))
    return {"clki_div": clki_div, "clkfb_div": clkfb_div, "vco": vco, "outputs": outputs}


class Ecp5Pll(wiring.Component):
    """EHXPLLL instance.

    Ports
    -----
    clk_in : In(1)
    clk_out : Out(1).array(1 + len(secondary))   CLKOP, CLKOS, CLKOS2, CLKOS3
    locked : Out(1)
    """

    def __init__(self, f_in, f_out, secondary=()):
        self.f_in = f_in
        self.params = pll_params(f_in, f_out, secondary)
        self.frequencies = [o[3] for o in self.params["outputs"]]
        super().__init__({
            "clk_in": In(1),
            "clk_out": Out(1).array(len(self.params["outputs"])),
            "locked": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        p = self.params
        names = ["CLKOP", "CLKOS", "CLKOS2", "CLKOS3"]
        kw = {
            "p_PLLRST_ENA": "DISABLED", "p_INTFB_WAKE": "DISABLED",
            "p_STDBY_ENABLE": "DISABLED", "p_DPHASE_SOURCE": "DISABLED",
            "p_OUTDIVIDER_MUXA": "DIVA", "p_OUTDIVIDER_MUXB": "DIVB",
            "p_OUTDIVIDER_MUXC": "DIVC", "p_OUTDIVIDER_MUXD": "DIVD",
            "p_CLKI_DIV": p["clki_div"], "p_CLKFB_DIV": p["clkfb_div"],
            "p_FEEDBK_PATH": "CLKOP",
            "i_RST": 0, "i_STDBY": 0, "i_CLKI": self.clk_in,
            "i_CLKFB": self.clk_out[0],
            "i_PHASESEL0": 0, "i_PHASESEL1": 0, "i_PHASEDIR": 1, "i_PHASESTEP": 1,
            "i_PHASELOADREG": 1, "i_PLLWAKESYNC": 0, "i_ENCLKOP": 0,
            "o_LOCK": self.locked,
            # nextpnr derives the output clock constraints from these.
            "a_FREQUENCY_PIN_CLKI": f"{self.f_in / 1e6:g}",
            "a_ICP_CURRENT": "12", "a_LPF_RESISTOR": "8",
            "a_MFG_ENABLE_FILTEROPAMP": "1", "a_MFG_GMCREF_SEL": "2",
        }
        for name, (div, cphase, fphase, freq), out in zip(names, p["outputs"], self.clk_out):
            kw[f"p_{name}_ENABLE"] = "ENABLED"
            kw[f"p_{name}_DIV"] = div
            kw[f"p_{name}_CPHASE"] = cphase
            kw[f"p_{name}_FPHASE"] = fphase
            kw[f"o_{name}"] = out
            kw[f"a_FREQUENCY_PIN_{name}"] = f"{freq / 1e6:g}"
        m.submodules.pll = Instance("EHXPLLL", **kw)
        return m

# Ref: LiteDRAM standalone generator, litedram/gen.py (litedram 2024.12, class LiteDRAMCore,
#      https://github.com/enjoy-digital/litedram/blob/master/litedram/gen.py) and its examples
#      (examples/*.yml); LiteDRAM docs https://github.com/enjoy-digital/litedram (README, wiki
#      "LiteDRAM standalone core"); litedram/phy/ecp5ddrphy.py (ECP5DDRPHY, 1:2 rate, BL8 over
#      two sys cycles); litedram/phy/model.py (SDRAMPHYModel); litedram/modules.py
#      (MT41K256M16 = MT41J256M16: 8 banks x 32768 rows x 1024 columns x 16 bits = 512 MiB);
#      Micron MT41K256M16 datasheet "4Gb: x4, x8, x16 DDR3L SDRAM" (tRCD/tRP 13.75 ns,
#      tREFI 7.8 us, tRFC 260 ns for the 4Gb die; LiteDRAM's table gives tRFC as 208 tCK, 260 ns
#      at DDR3-1600 only, which at this board's 100 MHz DDR clock would be 2080 ns = 104 sys
#      cycles: MT41K256M16Ecpix5 gives it in ns);
#      LiteX ECPIX-5 target (litex_boards/targets/lambdaconcept_ecpix5.py: ECP5DDRPHY,
#      MT41K256M16, sys 75 MHz there; 50 MHz here, see SYS_CLK_FREQ); LiteX OrangeCrab target
#      (ECP5DDRPHY + DDR3 at sys 48 MHz); Lattice FPGA-TN-02035 (ECP5 high-speed I/O:
#      ECLKSYNCB, CLKDIVF, DDRDLLA).
"""Standalone LiteDRAM DDR3 controller for the ECPIX-5, as Verilog, from LiteDRAM's generator.

Runs in the LiteDRAM venv (migen/LiteX/LiteDRAM from PyPI: litedram 2024.12, litex 2024.12,
migen 0.10.0, PyYAML), never in the project's amaranth venv; run it as a file::

    /tmp/ldvenv/bin/python boards/litedram_gen.py --out build/litedram            # ECP5 core
    /tmp/ldvenv/bin/python boards/litedram_gen.py --out build/litedram_sim --sim  # model core
    /tmp/ldvenv/bin/python boards/litedram_gen.py --out build/litedram_versa --board versa

(``--board versa``: the Lattice ECP5 Versa's MT41K64M16, 128 MiB, 13 address pins, at the same
sys clock and port width; see :data:`BOARDS`. The default is the ECPIX-5.)

(``python -m boards.litedram_gen`` does not work there: ``boards/__init__.py`` imports the board
specs, hence amaranth_boards. The file imports nothing from the project.)

The core is ``litedram.gen.LiteDRAMCore`` (the class behind ``litedram_gen config.yml``) fed the
dict a YAML file would give; nothing here is hand-written controller glue.

ECP5 core (``litedram_core.v``, top ``litedram_core``)
    ECP5DDRPHY + MT41K256M16 (x16, 512 MiB), sys 50 MHz, controller at 1:2 rate, one native
    user port of 128 bits (one DDR3 BL8 burst of the x16 part per word). No CPU and no UART;
    LiteDRAMCore then exposes ``wb_ctrl_*`` (a 32-bit Wishbone slave onto the CSR bank) so
    that the user runs DDR3 initialisation and ECP5 read levelling itself (DFII software
    commands, ``ddrphy_rdly_dq_*``, ``ddrphy_burstdet_*``), then writes ``ddrctrl_init_done``
    (the user port is held off until then: ``block_until_ready``). The CSR map goes to
    ``csr.json`` / ``csr.csv``; the init sequence (mode registers) to
    ``software/include/generated/sdram_phy.h``.

    Clocking: the core contains its own CRG (``LiteDRAMECP5DDRPHYCRG``): ``clk`` (the board's
    100 MHz oscillator) -> power-on reset counter -> EHXPLLL: 100 MHz (sys2x_i) and 25 MHz
    (``init``) -> ECLKBRIDGECS -> ECLKSYNCB (``sys2x``, gated by the PHY's init FSM ``stop``)
    -> CLKDIVF /2 -> ``sys`` 50 MHz. ``rst`` resets the PLL; ``pll_locked`` reports it;
    ``user_clk`` / ``user_rst`` are sys's clock and reset, and every user port signal is in
    that domain.

Simulation core (``--sim``, top ``litedram_core``)
    Same controller on ``SDRAMPHYModel`` (LiteDRAMCore's own ``--sim`` path, SimPlatform and a
    plain CRG from ``clk``/``rst``), with two changes so that it times like the ECP5 build:
    the module is made at rate 1:2 (LiteDRAMCore's sim path would pick 1:4) and the model gets
    the ECP5DDRPHY's PhySettings (nphases 2, cl/cwl and read/write latencies of that PHY)
    instead of the Series-7-like defaults of ``litex.tools.litex_sim``. Storage: the model
    keeps a memory array of ``nrows`` rows per bank, so the size is set by the number of rows
    of the module (``--sim-mib``, default 1 MiB = 64 rows x 8 banks x 1024 columns x 2 octets;
    the DFI address stays 15 bits wide so A10, the precharge-all bit, exists). All timings
    stay MT41K256M16's. (SDRAMPHYModel sizes each bank's array for 4 columns per word, as at
    rate 1:4, so at 1:2 half of its entries stay unused: 1 MiB of storage is 8 x 16384 x 128
    bits of Verilog arrays.) As on the board, the user port is held until ``init_done``: the
    same init program runs in both (the model ignores the mode registers). ``wb_ctrl_*`` is
    there too.
    Verilator lints it clean of errors (``--lint-only -Wno-fatal``: COMBDLY and
    CASEINCOMPLETE warnings only, as in LiteX's own simulations).

Besides the Verilog, ``--out`` receives ``litedram_core.json``: the top's ports (name, width,
direction, group) and the clocks/resets, for the Amaranth wrapper; and ``init_program.json``:
the CSR writes (Wishbone word address, value, sys cycles to wait after it) that LiteX's BIOS
would make in ``sdram_init()`` (liblitedram/sdram.c) with the mode registers of LiteDRAM's own
``get_sdram_phy_init_sequence``: software control, the DDR3 init sequence, read-delay reset,
hardware control, ``init_done``. boards/litedram_bridge.py plays it from a ROM (no CPU here).
"""

import argparse
import json
import os
import re
import sys
import types

__all__ = ["core_config", "build"]

# LiteX builds this board at 75 MHz; there LiteDRAM's own logic (refresh timer -> bank
# machines -> their command FIFOs) placed and routed at 66 MHz beside the target (-1.8 ns at
# seed 1). 50 MHz is two controller cycles per 25 MHz core cycle; the 1:2 PHY moves one BL8
# burst (one 128-bit port word) per two, so one bus word per core cycle, what the bridge asks
# (a command per 64-bit word), less refresh (6 %). DDR clock 100 MHz (DLL-on DDR3
# is specified from 300 MHz; LiteX runs the ECP5 PHY below that on its boards, OrangeCrab at
# 96 MHz).
SYS_CLK_FREQ   = 50e6
INPUT_CLK_FREQ = 100e6      # ECPIX-5 oscillator
INIT_CLK_FREQ  = 25e6
DEVICE         = "LFE5UM5G-85F-8BG554I"


def ecpix5_module():
    """MT41K256M16 with tRFC in nanoseconds: LiteDRAM's table gives the 4Gb die's 260 ns as
    clocks of each speed grade (208 at DDR3-1600), which the controller counts at this board's
    far slower DDR clock, a refresh stalling the port 8 times longer than the part needs.
    Everything else is LiteDRAM's DDR3-1600 timing."""
    from litedram.modules import MT41K256M16, _SpeedgradeTimings
    sg = MT41K256M16.speedgrade_timings["1600"]

    class MT41K256M16Ecpix5(MT41K256M16):
        speedgrade_timings = {"default": _SpeedgradeTimings(
            tRP=sg.tRP, tRCD=sg.tRCD, tWR=sg.tWR, tRFC=(None, 260), tFAW=sg.tFAW, tRAS=sg.tRAS)}
    return MT41K256M16Ecpix5


def core_config(sim=False, board="ecpix5"):
    """The dict LiteDRAMCore takes (what ``yaml.load`` of a config file gives after
    ``litedram.gen.main``'s conversions)."""
    from litedram import phy
    b = BOARDS[board]
    return {
        "device":          b["device"],
        "cpu":             None,
        "memtype":         "DDR3",
        "sdram_module":    b["module"](),
        "sdram_module_nb": 2,           # x16 = two byte lanes
        "sdram_rank_nb":   1,
        "sdram_phy":       phy.ECP5DDRPHY,
        "cmd_delay":       0,
        "input_clk_freq":  INPUT_CLK_FREQ,
        "sys_clk_freq":    SYS_CLK_FREQ,
        "init_clk_freq":   INIT_CLK_FREQ,
        "user_ports": {
            # Held off until ddrctrl_init_done in simulation too: the init sequencer
            # (boards/litedram_bridge.py) must have run for the port to move.
            "0": {"type": "native", "block_until_ready": True},
        },
    }


def _sim_module(mib, board="ecpix5"):
    """The board's module timings (ECPIX-5: MT41K256M16) at rate 1:2 with ``mib`` MiB of rows
    (the model's storage)."""
    module = BOARDS[board]["module"]()
    addressbits = (module.nrows - 1).bit_length()       # the part's address pins
    rows = mib * 2**20 // (module.nbanks * module.ncols * 2)
    if rows < 2 or rows & (rows - 1):
        raise ValueError(f"--sim-mib {mib}: {rows} rows per bank is not a power of two >= 2")

    class MT41K256M16Sim(module):
        nrows = rows

        def __init__(self, clk_freq, rate, **kwargs):
            super().__init__(clk_freq, "1:2", **kwargs)    # the ECP5DDRPHY's rate
            self.geom_settings.addressbits = addressbits    # the part's A (ECPIX-5: A[14:0])

    return MT41K256M16Sim


def ecp5_phy_settings(sys_clk_freq=SYS_CLK_FREQ):
    """The PhySettings an ECP5DDRPHY for an x16 part at ``sys_clk_freq`` has (made by building
    one on dummy pads, so they cannot drift from the PHY's code)."""
    from migen import Record
    from litedram.phy.ecp5ddrphy import ECP5DDRPHY
    pads = Record([("a", 15), ("ba", 3), ("ras_n", 1), ("cas_n", 1), ("we_n", 1), ("cs_n", 1),
                   ("dm", 2), ("dq", 16), ("dqs_p", 2), ("clk_p", 1), ("cke", 1), ("odt", 1),
                   ("reset_n", 1)])
    return ECP5DDRPHY(pads, sys_clk_freq=sys_clk_freq).settings


def _drop_repeated_assigns(verilog):
    """migen writes some ``assign {a, b} = c;`` statements twice, word for word (this core:
    the 8 bank FIFOs' outputs and the DFI write data and mask, 12 statements). Yosys then
    reports "multiple conflicting drivers" for every bit; the two drivers are the same
    expression, so the second copy is dropped (the first kept in place). Returns the text and
    the number of lines dropped."""
    seen, out, dropped = set(), [], 0
    for line in verilog.splitlines(keepends=True):
        if line.startswith("assign "):
            if line in seen:
                dropped += 1
                continue
            seen.add(line)
        out.append(line)
    return "".join(out), dropped


def _ports(verilog, top):
    """(name, direction, width) of ``top``'s ports, from the generated Verilog header."""
    m = re.search(r"module\s+%s\s*\((.*?)\);" % re.escape(top), verilog, re.S)
    ports = []
    for line in m.group(1).splitlines():
        line = line.split("//")[0].strip().rstrip(",")
        pm = re.match(r"(input|output|inout)\s+(?:wire|reg)?\s*(?:\[(\d+):(\d+)\])?\s*(\w+)$",
                      line)
        if pm:
            d, hi, lo, name = pm.groups()
            # migen declares pads that feed a TRELLIS_IO's B as inputs; they are bidirectional.
            if re.search(r"\.B \(%s[\[)]" % name, verilog):
                d = "inout"
            ports.append((name, d, int(hi) - int(lo) + 1 if hi is not None else 1))
    return ports


def _group(name):
    for prefix, group in (("user_port_", "user_port"), ("wb_ctrl_", "wb_ctrl"),
                          ("ddram_", "ddram")):
        if name.startswith(prefix):
            return group
    return "control"


def build(out, sim=False, sim_mib=1, name="litedram_core", board="ecpix5"):
    from litex.build.lattice import LatticePlatform
    from litex.build.sim import SimPlatform
    from litex.soc.integration.builder import Builder
    from litedram import gen

    b = BOARDS[board]
    cfg = core_config(sim, board)
    if sim:
        cfg["sdram_module"] = _sim_module(sim_mib, board)
        settings = ecp5_phy_settings()
        # LiteDRAMCore's sim path imports get_sdram_phy_settings from litex.tools.litex_sim
        # at call time; that module also pulls in liteeth, which the core does not use.
        stub = types.ModuleType("litex.tools.litex_sim")
        stub.get_sdram_phy_settings = lambda **_: settings
        sys.modules["litex.tools.litex_sim"] = stub
        # SimPlatform's toolchain writes the Verilog and then sets up LiteX's own Verilator
        # harness (tapcfg, make); only the Verilog is wanted.
        from litex.build.sim import verilator
        verilator._generate_sim_variables = lambda *a, **k: None
        verilator._build_sim = lambda *a, **k: None
        platform = SimPlatform("", io=[])
    else:
        platform = LatticePlatform(cfg["device"], io=[], toolchain="trellis")

    os.makedirs(out, exist_ok=True)
    out = os.path.abspath(out)
    soc = gen.LiteDRAMCore(platform, cfg, integrated_rom_size=0)
    builder = Builder(soc, output_dir=out, compile_gateware=False, compile_software=False,
                      csr_json=os.path.join(out, "csr.json"),
                      csr_csv=os.path.join(out, "csr.csv"))
    builder.build(build_name=name, regular_comb=False, run=False)

    vfile = os.path.join(out, "gateware", name + ".v")
    with open(vfile) as f:
        verilog = f.read()
    verilog, dropped = _drop_repeated_assigns(verilog)
    with open(vfile, "w") as f:
        f.write(verilog)
    port = soc.sdram.crossbar.masters[0]
    desc = {
        "top": name,
        "verilog": os.path.relpath(vfile, out),
        "target": "SDRAMPHYModel (simulation)" if sim else "ECP5DDRPHY " + b["device"],
        "module": b["module_name"],
        "storage_bytes": (sim_mib * 2**20) if sim else b["storage_bytes"],
        "sys_clk_hz": SYS_CLK_FREQ,
        "user_port": {
            "data_width": port.data_width,
            "address_width": port.address_width,
            "address_unit_bytes": port.data_width // 8,
            "clock": "user_clk (sys)",
            "reset": "user_rst (sys, active high)",
        },
        "phy": {k: getattr(soc.sdram.controller.settings.phy, k) for k in
                ("nphases", "cl", "cwl", "read_latency", "write_latency", "dfi_databits")},
        "timing_sys_cycles": {k: v for k, v in
                              vars(soc.sdram.controller.settings.timing).items()
                              if isinstance(v, (int, type(None)))},
        "clocks": (
            {"clk": "input, sys clock (simulation CRG: sys = clk); no reset input: sys_rst "
                    "(= user_rst) is a power-on register, high for the first cycle",
             "sim_trace": "input, LiteX's Verilator trace enable, unused by the core: tie 0"}
            if sim else
            {"clk": f"input, {INPUT_CLK_FREQ/1e6:g} MHz board oscillator (PLL reference)",
             "rst": "input, active high, resets the PLL (and so sys/sys2x)",
             "pll_locked": "output",
             "sys2x": f"internal {2*SYS_CLK_FREQ/1e6:g} MHz ECLK (ECLKSYNCB), the PHY's DDR clock",
             "sys": f"internal {SYS_CLK_FREQ/1e6:g} MHz (CLKDIVF /2 of sys2x) = user_clk",
             "init": f"internal {INIT_CLK_FREQ/1e6:g} MHz (PLL), the PHY's init FSM"}),
        "ports": [{"name": n, "dir": d, "width": w, "group": _group(n)}
                  for n, d, w in _ports(verilog, name)],
    }
    with open(os.path.join(out, name + ".json"), "w") as f:
        json.dump(desc, f, indent=2)
    with open(os.path.join(out, "init_program.json"), "w") as f:
        json.dump({"sys_clk_hz": SYS_CLK_FREQ,
                   "steps": init_program(soc, os.path.join(out, "csr.csv"))}, f, indent=1)
    return desc


# liblitedram/sdram.c and the generated sdram_phy.h: DFII control and command bits.
DFII_CONTROL = {"SEL": 0x01, "CKE": 0x02, "ODT": 0x04, "RESET_N": 0x08}
DFII_COMMAND = {"CS": 0x01, "WE": 0x02, "CAS": 0x04, "RAS": 0x08, "WRDATA": 0x10, "RDDATA": 0x20}


def _bits(expr):
    """'DFII_COMMAND_RAS|DFII_COMMAND_CS' -> (is_control, value)."""
    value, control = 0, None
    for term in expr.split("|"):
        kind, name = re.fullmatch(r"DFII_(CONTROL|COMMAND)_(\w+)", term.strip()).groups()
        value |= (DFII_CONTROL if kind == "CONTROL" else DFII_COMMAND)[name]
        assert control in (None, kind == "CONTROL"), expr
        control = kind == "CONTROL"
    return control, value


def init_program(soc, csr_csv, read_delays=None):
    """The CSR writes of LiteX's ``sdram_init()`` for this core, as steps
    ``{"csr", "adr", "value", "wait", "comment"}`` (``adr``: Wishbone word address on
    ``wb_ctrl``; ``wait``: sys cycles after the write, the ``cdelay()`` of the C code, which
    LiteX counts in CPU loop turns of at least one cycle each).

    ``read_delays``: ``{module: (bitslip, delay)}`` to load into the ECP5DDRPHY's read path
    after the init sequence (what LiteX's read levelling would find); without it each
    module's delay and bitslip are reset to 0.
    """
    from litedram.init import get_sdram_phy_init_sequence
    csr = {}
    with open(csr_csv) as f:
        for line in f:
            parts = line.strip().split(",")
            if parts[0] == "csr_register":
                csr[parts[1]] = int(parts[2], 0)
    steps = []

    def w(name, value, wait=0, comment=""):
        steps.append({"csr": name, "adr": csr[name] >> 2, "value": value, "wait": wait,
                      "comment": comment})

    sw = DFII_CONTROL["CKE"] | DFII_CONTROL["ODT"] | DFII_CONTROL["RESET_N"]
    w("sdram_dfii_control", sw, comment="sdram_software_control_on")
    w("ddrctrl_init_done", 0)
    w("ddrctrl_init_error", 0)
    settings = soc.sdram.controller.settings
    seq, _ = get_sdram_phy_init_sequence(settings.phy, settings.timing)
    for comment, a, ba, cmd, delay in seq:
        w("sdram_dfii_pi0_address", a, comment=comment)
        w("sdram_dfii_pi0_baddress", ba)
        control, value = _bits(cmd)
        if control:
            w("sdram_dfii_control", value, delay)
        else:
            w("sdram_dfii_pi0_command", value)
            w("sdram_dfii_pi0_command_issue", 1, delay)
    if "ddrphy_dly_sel" in csr:
        nmodules = settings.phy.databits // 8
        for module in range(nmodules):
            bitslip, delay = (read_delays or {}).get(module, (0, 0))
            w("ddrphy_dly_sel", 1 << module, comment=f"read path of module {module}: "
              f"bitslip {bitslip}, delay {delay}")
            w("ddrphy_rdly_dq_rst", 1)
            w("ddrphy_rdly_dq_bitslip_rst", 1)
            for _ in range(bitslip):
                w("ddrphy_rdly_dq_bitslip", 1)
            for _ in range(delay):
                w("ddrphy_rdly_dq_inc", 1)
            w("ddrphy_dly_sel", 0)
    w("sdram_dfii_control", DFII_CONTROL["SEL"], comment="sdram_hardware_control_on")
    w("ddrctrl_init_done", 1)
    return steps


def main(argv=None):
    p = argparse.ArgumentParser(prog="boards/litedram_gen.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--sim", action="store_true", help="SDRAMPHYModel instead of ECP5DDRPHY")
    p.add_argument("--sim-mib", type=int, default=1, help="model storage in MiB (--sim)")
    p.add_argument("--name", default="litedram_core", help="Verilog top module name")
    p.add_argument("--board", default="ecpix5", choices=sorted(BOARDS),
                   help="the board's DDR3 part, pins' count and device (default ecpix5)")
    a = p.parse_args(argv)
    desc = build(a.out, sim=a.sim, sim_mib=a.sim_mib, name=a.name, board=a.board)
    for port in desc["ports"]:
        print(f"{port['dir']:6} {port['width']:4} {port['name']}")
    print(f"wrote {os.path.join(a.out, desc['verilog'])} and {a.name}.json", file=sys.stderr)



# ---- Lattice ECP5 Versa (LFE5UM-45F): 128 MB of DDR3L, one MT41K64M16 ----------------------
# Ref: LiteX-Boards litex_boards/targets/lattice_versa_ecp5.py (ECP5DDRPHY + MT41K64M16, sys
#      75 MHz there) and litex_boards/platforms/lattice_versa_ecp5.py (ddram: a[12:0], ba,
#      ras_n/cas_n/we_n/cs_n, dm[1:0], dq[15:0], dqs_p[1:0], clk_p, cke, odt, reset_n; SSTL135);
#      amaranth_boards.versa_ecp5 ``ddr3`` (the same pins, rst and cs included); Micron
#      "1Gb: x4, x8, x16 DDR3L SDRAM" (MT41K64M16: 8 banks x 8192 rows x 1024 columns x 16
#      bits = 128 MiB; tRFC 110 ns for the 1Gb die, tREFI 7.8 us).
VERSA_DEVICE = "LFE5UM-45F-8BG381C"


def versa_module():
    """MT41K64M16 with tRFC in nanoseconds (110 ns, the 1Gb die's), for the same reason as
    :func:`ecpix5_module`: LiteDRAM gives it in clocks of DDR3-1600 (128 tCK), which the
    controller would count at this 100 MHz DDR clock. Everything else is LiteDRAM's DDR3-1600
    timing of the part."""
    from litedram.modules import MT41K64M16, _SpeedgradeTimings
    sg = MT41K64M16.speedgrade_timings["1600"]

    class MT41K64M16Versa(MT41K64M16):
        speedgrade_timings = {"default": _SpeedgradeTimings(
            tRP=sg.tRP, tRCD=sg.tRCD, tWR=sg.tWR, tRFC=(None, 110), tFAW=sg.tFAW, tRAS=sg.tRAS)}
    return MT41K64M16Versa


#: Per board: the device LiteX is told, the DDR3 module (x16 on two byte lanes) and its size.
#: Both boards have a 100 MHz oscillator (INPUT_CLK_FREQ) and run the core at SYS_CLK_FREQ.
BOARDS = {
    "ecpix5": {"device": DEVICE, "module": ecpix5_module, "module_name": "MT41K256M16",
               "storage_bytes": 512 * 2**20},
    "versa": {"device": VERSA_DEVICE, "module": versa_module, "module_name": "MT41K64M16",
              "storage_bytes": 128 * 2**20},
}


if __name__ == "__main__":
    main()

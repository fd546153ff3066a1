# Ref: issue 22 items 1-2; boards/litedram_bridge.py; boards/litedram_gen.py; tests/boards/cocotb_litedram.py;
#      LiteX liblitedram/sdram.c sdram_init() and LiteDRAM's generated sdram_phy.h (the oracle
#      of the init program).
"""The LiteDRAM controller behind the target's memory bus.

* The init program the sequencer plays is the one LiteX's BIOS would run: compared write by
  write with the C header LiteDRAM generates for this core (``software/include/generated/
  sdram_phy.h``, its ``init_sequence()``), which our program is not made from.
* cocotb + Verilator: the sequencer, the bridge and LiteDRAM's controller on its SDRAM PHY model
  (``build/litedram_sim``, made by ``make litedram`` in its own venv): init, then random
  traffic checked word for word; the read latency and streaming figures printed beside the
  DDR3 timing model's (boards/dram.py ECPIX5_DDR3).
"""

import json
import re
import sys

import pytest

from boards.cores import CORE_FREQ
from boards.litedram_bridge import BOARD_CORE, SIM_CORE
from sim.hdl import run_cocotb
from tests.boards.litedram_cores import litedram_cores


@pytest.fixture(scope="module")
def cores():
    return litedram_cores()


def _c_init_writes(header):
    """(csr, value, wait) of ``init_sequence()`` in LiteDRAM's generated sdram_phy.h."""
    body = re.search(r"static inline void init_sequence\(void\)\s*\{(.*?)\n\}", header,
                     re.S).group(1)
    defines = {k: int(v, 0) for k, v in re.findall(r"#define (DFII_\w+) (0x[0-9a-fA-F]+)",
                                                    header)}

    def value(expr):
        return sum(defines[t.strip()] if t.strip() in defines else int(t, 0)
                   for t in expr.split("|"))

    out = []
    for line in body.splitlines():
        line = line.strip()
        if m := re.match(r"(\w+)_write\((.*)\);", line):
            out.append([m.group(1), value(m.group(2)), 0])
        elif m := re.match(r"command_p0\((.*)\);", line):
            out += [["sdram_dfii_pi0_command", value(m.group(1)), 0],
                    ["sdram_dfii_pi0_command_issue", 1, 0]]
        elif m := re.match(r"cdelay\((\d+)\);", line):
            out[-1][2] = int(m.group(1))
    return [tuple(x) for x in out]


@pytest.mark.parametrize("which", ["board", "sim"])
def test_init_program_is_litedrams_sequence(cores, which):
    desc, program = cores[which]
    steps = [(s["csr"], s["value"], s["wait"]) for s in program["steps"]]
    directory = BOARD_CORE if which == "board" else SIM_CORE
    header = (directory / "software/include/generated/sdram_phy.h").read_text()
    c = _c_init_writes(header)
    # LiteX's sdram_init(): software control, init_done/error cleared, the sequence, (read
    # levelling), hardware control, init_done.
    assert steps[:3] == [("sdram_dfii_control", 0x0E, 0), ("ddrctrl_init_done", 0, 0),
                         ("ddrctrl_init_error", 0, 0)]
    assert steps[3:3 + len(c)] == c, (steps[3:3 + len(c)], c)
    assert steps[-2:] == [("sdram_dfii_control", 0x01, 0), ("ddrctrl_init_done", 1, 0)]
    csr = desc["csr"]
    assert all(s["adr"] == csr[s["csr"]] >> 2 for s in program["steps"])
    middle = [s[0] for s in steps[3 + len(c):-2]]
    if which == "board":
        # The ECP5 PHY's read path of both byte lanes is reset (delay 0, bitslip 0).
        assert middle.count("ddrphy_rdly_dq_rst") == 2, middle
    else:
        assert middle == [], middle
    # JEDEC DDR3 power-up: RESET# high >= 500 us before CKE (the 'Release reset' wait).
    release = next(s for s in program["steps"] if s["csr"] == "sdram_dfii_control"
                   and s["value"] == 0x0C)
    assert release["wait"] / program["sys_clk_hz"] >= 500e-6, release


def test_bridge_on_litedram_controller(cores):
    from tests.boards.cocotb_litedram import LiteDramHarness
    from boards.dram import ECPIX5_DDR3
    desc, _ = cores["sim"]
    out = run_cocotb(lambda: LiteDramHarness(SIM_CORE), "litedram_bridge",
                     "tests.boards.cocotb_litedram",
                     params={"storage_bytes": desc["storage_bytes"], "ops": 3000, "seed": 1,
                             "core_ps": round(1e12 / CORE_FREQ)},
                     extra_sources=[desc["verilog_path"]])
    r = json.loads((out / "litedram.json").read_text())
    model = ECPIX5_DDR3.cycles(CORE_FREQ)
    print(f"\nLiteDRAM (SDRAMPHYModel, sys {desc['sys_clk_hz'] / 1e6:g} MHz) behind the bridge, "
          f"core clock {CORE_FREQ / 1e6:g} MHz: "
          f"init {r['init_core_cycles']} core cycles ({r['init_core_cycles'] / CORE_FREQ * 1e6:.1f} us); "
          f"{r['reads']} reads and {r['writes']} writes matched; read latency min/median/max, "
          f"open row {r['read_latency_hit']}, row miss {r['read_latency_miss']} core cycles "
          f"(timing model: hit {model.hit}, miss +{model.miss}); 256 reads streamed in "
          f"{r['stream_read_cycles_256']} cycles, 256 writes + 1 read in "
          f"{r['stream_write_cycles_256']}", file=sys.stderr)
    assert r["reads"] > 1000 and r["writes"] > 1000
    # The DDR3 timing model that the shipped DDR3 configuration simulates (boards/dram.py)
    # charges what LiteDRAM charges through this bridge: its median read latency of an open
    # row and of a row miss are the model's hit and hit + miss.
    assert r["read_latency_hit"][1] == model.hit, (r["read_latency_hit"], model)
    assert r["read_latency_miss"][1] == model.hit + model.miss, (r["read_latency_miss"], model)
    # And it streams at LiteDRAM's rate: the same 256 reads, and 256 writes and a read, take
    # the model as many core cycles as the controller, give or take one refresh (its stall and
    # the row it closes), which falls into the window or not by the phase of the refresh timer.
    from boards.dram import DramModel
    from tests.boards.bus_traffic import stream_cycles
    reads = stream_cycles(DramModel(1 << 15, model),
                          [(4096 + 8 * i, 0, 0, 0) for i in range(256)])
    writes = stream_cycles(DramModel(1 << 15, model),
                           [(8192 + 8 * i, 1, i, 0xFF) for i in range(256)] + [(8192, 0, 0, 0)])
    print(f"the timing model: 256 reads in {reads} cycles, 256 writes + 1 read in {writes}",
          file=sys.stderr)
    slack = model.rfc + model.miss
    assert abs(reads - r["stream_read_cycles_256"]) <= slack, (reads, r["stream_read_cycles_256"])
    assert abs(writes - r["stream_write_cycles_256"]) <= slack, \
        (writes, r["stream_write_cycles_256"])
    # init takes the program's waits, counted in controller cycles.
    program = json.loads((SIM_CORE / "init_program.json").read_text())
    waits = sum(s["wait"] for s in program["steps"])
    assert r["init_core_cycles"] >= waits * CORE_FREQ / program["sys_clk_hz"], (r, waits)

# Ref: tests/sim/cocotb_system.py (the bench); hw/target/target.py; host/driver.py; sim/hdl.py.
"""pytest runner of the system bench: KbtpTarget with the KBTP engine, 4 QPs, the host driver,
against the golden model (width 8; the same Verilator build as tests/hw/target/test_target_cocotb.py)."""

import json

import pytest

from sim.hdl import run_cocotb
from tests.hw.target.test_target_cocotb import make_target, params


@pytest.mark.parametrize("case", ["mixed_clean", "mixed_lossy", "direct", "latency"])
def test_system_cocotb(case):
    out = run_cocotb(lambda: make_target(8), "kbtp_target", "tests.sim.cocotb_system", params=params(8),
                     testcase=case)
    figs = out / "figures_system.json"
    r = json.loads(figs.read_text()) if figs.exists() else {}
    for k, v in sorted(r.items()):
        print(f"\nKbtpTarget system {case}: {k} = {v}")

# Ref: hw/target/target.py (the top); tests/hw/target/cocotb_target.py (the bench); sim/hdl.py (runner).
"""pytest runner of the KbtpTarget system bench over GMII, one Verilator build per width."""

import json
import os

import pytest

from hw.target.target import KbtpTarget
from sim.hdl import run_cocotb

MEM_WORDS = 16384           # 128 KiB: room for a 64 KiB WRITE/READ plus the small regions
TIMER_SCALE = 256


#: Extra simulator environment (the bench puts the checkout on its own path).
ENV = {}


N_QP = 4
N_MR = 8                    # the driver takes 2 + 3 per DIRECT_ALLOC partition (system bench)


def make_target(width):
    return KbtpTarget(width, n_qp=N_QP, mem_words=MEM_WORDS, n_mr=N_MR, timer_scale=TIMER_SCALE)


def params(width):
    """Build parameters; tests/sim/test_system_cocotb.py uses the same, so the two benches share
    one Verilator build per width (sim/hdl.py keys the build directory on them)."""
    return {"width": width, "n_qp": N_QP, "n_mr": N_MR, "mem_words": MEM_WORDS,
            "timer_scale": TIMER_SCALE}


KNOWN_BUGS = {}

# `make test` runs width 8 (its build is shared with tests/sim/test_system_cocotb.py); width 64 has
# its own Verilator build (~10 minutes on 2 cores) and runs with KBTP_TARGET_WIDTHS=8,64 (or
# `make test-wide`), which keeps CI inside its 90 minutes.
WIDTHS = [int(w) for w in os.environ.get("KBTP_TARGET_WIDTHS", "8").split(",")]
CASES = [pytest.param(w, case, marks=[pytest.mark.xfail(reason=KNOWN_BUGS[case], strict=True)]
                      if case in KNOWN_BUGS else [])
         for w in WIDTHS for case in ("negative", "clean", "lossy_1pct", "lossy_5pct",
                                            "retry_exhausted")]


@pytest.mark.parametrize("width,case", CASES)
def test_target_cocotb(width, case):
    out = run_cocotb(lambda: make_target(width), "kbtp_target", "tests.hw.target.cocotb_target",
                     params=params(width),
                     extra_env=ENV, testcase=case)
    figs = out / "figures.json"
    r = json.loads(figs.read_text()) if figs.exists() else {}
    for k, v in sorted(r.items()):
        print(f"\nKbtpTarget width {width} {case}: {k} = {v}")

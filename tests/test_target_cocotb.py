# Ref: hw/rtl/target.py (the top); tests/cocotb_target.py (the bench); sim/hdl.py (runner).
"""pytest runner of the KbtpTarget system bench over GMII, one Verilator build per width."""

import json

import pytest

from hw.rtl.target import KbtpTarget
from sim.hdl import run_cocotb

MEM_WORDS = 16384           # 128 KiB: room for a 64 KiB WRITE/READ plus the small regions
TIMER_SCALE = 256


#: Extra simulator environment (the bench puts the checkout on its own path).
ENV = {}


def make_target(width):
    return KbtpTarget(width, n_qp=2, mem_words=MEM_WORDS, n_mr=4, timer_scale=TIMER_SCALE)


@pytest.mark.parametrize("width", [8, 64])
def test_target_cocotb(width):
    out = run_cocotb(lambda: make_target(width), "kbtp_target", "cocotb_target",
                     params={"width": width, "mem_words": MEM_WORDS, "timer_scale": TIMER_SCALE},
                     extra_env=ENV)
    r = json.loads((out / "figures.json").read_text())
    for k, v in sorted(r.items()):
        print(f"\nKbtpTarget width {width}: {k} = {v}")
    assert r["width"] == width

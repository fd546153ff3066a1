# Ref: hw/net/mac.py; tests/hw/net/cocotb_mac.py (the bench); sim/hdl.py (runner); toolchain.md.
"""pytest runner of the cocotb GMII MAC loopback bench, one Verilator build per width."""

import json

import pytest

from tests.hw.net.cocotb_mac import MacLoopTop
from sim.hdl import run_cocotb


@pytest.mark.parametrize("width", [8, 64])
def test_mac_cocotb(width):
    out = run_cocotb(lambda: MacLoopTop(width), "mac_loop", "tests.hw.net.cocotb_mac",
                     params={"width": width})
    r = json.loads((out / "throughput.json").read_text())
    print(f"\nGmiiMac width {width}: {r['cycles_per_octet']:.5f} cycles/octet measured, "
          f"{r['theoretical_cycles_per_octet']:.5f} theoretical "
          f"({r['cycles_per_frame']:.1f} cycles per {r['frame_octets']}-octet frame, "
          f"min IFG {r['min_gap_cycles']:.0f}); internal stream "
          f"{r['internal_beats_per_cycle']:.4f} beats/cycle of {r['internal_octets_per_beat']} "
          f"octets")
    assert r["width"] == width

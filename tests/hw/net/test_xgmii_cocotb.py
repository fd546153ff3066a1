# Ref: hw/net/xgmii.py; tests/hw/net/cocotb_xgmii.py (the bench); sim/hdl.py (runner);
#      tests/hw/net/test_mac_cocotb.py (the GMII runner this one follows).
"""pytest runner of the cocotb XGMII MAC loopback bench (one Verilator build)."""

import json

from tests.hw.net.cocotb_xgmii import XgmiiLoopTop
from sim.hdl import run_cocotb


def test_xgmii_cocotb():
    out = run_cocotb(lambda: XgmiiLoopTop(), "xgmii_loop", "tests.hw.net.cocotb_xgmii",
                     params={"width": 64})
    results = json.loads((out / "throughput.json").read_text())
    print()
    for r in results:
        print(f"XgmiiMac {r['frames']} x {r['frame_octets']}-octet frames: "
              f"{r['theoretical']:.4f} cycles/frame "
              f"theoretical; XgmiiSource {r['source']:.4f}, MAC paced by it {r['paced']:.4f}, "
              f"MAC from its buffer {r['queued']:.4f} (gaps {r['queued_gap_min']:.0f}.."
              f"{r['queued_gap_max']:.0f} octets, /S/ lanes {r['queued_start_lanes']})")
    assert len(results) == 5

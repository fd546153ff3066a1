# Ref: Makefile (make litedram: LiteDRAM's venv from PyPI, then boards/litedram_gen.py);
#      boards/litedram_bridge.py (BOARD_CORE, SIM_CORE, load_core).
"""The generated LiteDRAM cores for tests: ``make litedram`` (make install runs it; up to date
here unless boards/litedram_gen.py changed). Fails under CI=true when it cannot be made, skips
elsewhere (no network for its venv)."""

import os
import subprocess

import pytest

from boards.litedram_bridge import BOARD_CORE, ROOT, SIM_CORE, load_core

__all__ = ["litedram_cores"]


def litedram_cores():
    """``{"board": (desc, program), "sim": (desc, program)}`` of the two generated cores."""
    r = subprocess.run(["make", "-C", str(ROOT), "litedram"], capture_output=True, text=True)
    if r.returncode:
        if os.environ.get("CI"):
            pytest.fail("make litedram failed:\n" + r.stdout[-2000:] + r.stderr[-2000:])
        pytest.skip("make litedram failed (no network for its venv?)")
    return {"board": load_core(BOARD_CORE), "sim": load_core(SIM_CORE)}

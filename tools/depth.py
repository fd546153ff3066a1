# Ref: yosys `synth_ecp5` JSON netlist (write_json: modules.<top>.cells / netnames, bit numbers);
#      ECP5 cell library (LUT4, PFUMX, L6MUX21, CCU2C, TRELLIS_FF, TRELLIS_DPR16X4, DP16KD).
"""Logic depth of every register input of a synthesised ECP5 netlist, worst first.

nextpnr reports one critical path per clock; a core that must gain a factor of two in Fmax has
dozens of long paths, and finding them one place-and-route at a time costs half an hour each.
This walks the netlist once (about a minute) and lists the deepest register inputs of one clock
domain, each with the register its path starts from, so several can be mended per build.

The depth is counted in LUT levels, the figure that tracks routed delay on the ECP5 (a routed path
costs about 0.7 ns per level here, most of it routing). Wide muxes (PFUMX, L6MUX21) add a
fraction of a level; a carry chain adds one level for its entry and a small step per cell. The
model is coarse on purpose: it ranks paths, nextpnr times them.

``python -m tools.depth build/ecpix5/top.json [--clock core] [--top 40] [--path N]``
"""

import argparse
import json
import re
import sys
from collections import defaultdict

#: combinational cell type -> (input ports, output ports, levels from any input to any output).
#: Other cells' outputs start paths; register, LUT RAM write and block RAM inputs end them.
_COMB = {
    "LUT4": ({"A", "B", "C", "D"}, {"Z"}, 1.0),
    "PFUMX": ({"ALUT", "BLUT", "C0"}, {"Z"}, 0.3),
    "L6MUX21": ({"D0", "D1", "SD"}, {"Z"}, 0.3),
}
_CARRY_STEP = 0.1


def _name_of_bits(netnames):
    """bit -> best net name (a visible name over a hidden one, shorter over longer)."""
    best = {}
    for name, info in netnames.items():
        hidden = info.get("hide_name", 0)
        for i, bit in enumerate(info["bits"]):
            if not isinstance(bit, int):
                continue
            label = name if len(info["bits"]) == 1 else f"{name}[{i}]"
            key = (hidden, len(label))
            if bit not in best or key < best[bit][0]:
                best[bit] = (key, label)
    return {bit: label for bit, (_, label) in best.items()}


def analyse(netlist, clock=None):
    mods = netlist["modules"]
    top = next(m for m in mods.values() if m.get("attributes", {}).get("top"))
    cells = top["cells"]
    names = _name_of_bits(top["netnames"])
    # driver: bit -> (cell, delay-from-inputs function)
    arcs = defaultdict(list)        # output bit -> [(input bit, levels)]
    start = {}                      # bit -> start label (register / RAM outputs, ports)
    ends = []                       # (cell name, port, bit, clock bit)
    for cname, cell in cells.items():
        ty, conn = cell["type"], cell["connections"]
        if ty in _COMB:
            ins, outs, lv = _COMB[ty]
            for o in outs:
                for ob in conn.get(o, []):
                    for i in ins:
                        for ib in conn.get(i, []):
                            if isinstance(ib, int):
                                arcs[ob].append((ib, lv))
        elif ty == "CCU2C":
            cin = conn.get("CIN", [None])[0]
            for half in "01":
                ins = [b for p in ("A", "B", "C", "D") for b in conn.get(p + half, [])
                       if isinstance(b, int)]
                for o in (conn.get("S" + half, []) + conn.get("COUT", [])):
                    for ib in ins:
                        arcs[o].append((ib, 1.0))
                    if isinstance(cin, int):
                        arcs[o].append((cin, _CARRY_STEP))
        elif ty == "TRELLIS_DPR16X4":
            for ob in conn.get("DO", []):
                for ib in conn.get("RAD", []):
                    if isinstance(ib, int):
                        arcs[ob].append((ib, 1.5))
            for p in ("DI", "WAD", "WRE"):
                for ib in conn.get(p, []):
                    ends.append((cname, p, ib, conn.get("WCK", [None])[0]))
        elif ty == "TRELLIS_FF":
            for ob in conn.get("Q", []):
                start[ob] = cname
            for p in ("DI", "CE", "LSR", "M"):
                for ib in conn.get(p, []):
                    ends.append((cname, p, ib, conn.get("CLK", [None])[0]))
        else:
            for p, d in cell.get("port_directions", {}).items():
                for b in conn.get(p, []):
                    if not isinstance(b, int):
                        continue
                    if d == "output":
                        start[b] = f"{cname} ({ty}.{p})"
                    elif ty in ("DP16KD", "MULT18X18D"):
                        ends.append((cname, p, b, None))
    depth, via = {}, {}
    sys.setrecursionlimit(100000)

    def arrival(bit):
        if bit in depth:
            return depth[bit]
        depth[bit] = 0.0           # loop guard
        best, arg = 0.0, None
        for ib, lv in arcs.get(bit, ()):
            d = arrival(ib) + lv
            if d > best:
                best, arg = d, ib
        depth[bit], via[bit] = best, arg
        return best

    clk_names = {}
    rows = []
    for cname, port, bit, clk in ends:
        if not isinstance(bit, int):
            continue
        cl = names.get(clk, str(clk)) if clk is not None else "-"
        clk_names[cl] = clk_names.get(cl, 0) + 1
        if clock and clock not in cl:
            continue
        rows.append((arrival(bit), cname, port, bit, cl))
    rows.sort(key=lambda r: -r[0])

    def path(bit):
        out = []
        while bit is not None:
            out.append(names.get(bit, f"${bit}"))
            nxt = via.get(bit)
            if nxt is None:
                out[-1] = start.get(bit, out[-1])
            bit = nxt
        return out[::-1]

    return rows, path, names, clk_names


def _group(label):
    """A register's name without bit index and yosys suffixes, to group the bits of one signal."""
    label = re.sub(r"\[\d+\]$", "", label)
    label = re.sub(r"_TRELLIS_FF_Q(_\d+)?$", "", label)
    return label


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m tools.depth", description=__doc__.splitlines()[0])
    ap.add_argument("netlist")
    ap.add_argument("--clock", default="core", help="substring of the clock net's name")
    ap.add_argument("--top", type=int, default=40, help="endpoint groups to list")
    ap.add_argument("--path", type=int, default=5, help="print the path of the N worst groups")
    args = ap.parse_args(argv)
    with open(args.netlist) as f:
        netlist = json.load(f)
    rows, path, names, clks = analyse(netlist, args.clock)
    if not rows:
        print("no endpoints on a clock matching", repr(args.clock), "; clocks:", clks)
        return 1
    seen = {}
    for d, cname, port, bit, cl in rows:
        g = _group(names.get(bit, cname)) if port != "DI" else _group(cname)
        if g not in seen:
            seen[g] = (d, cname, port, bit)
    print(f"{len(rows)} register inputs on {args.clock!r}; deepest {rows[0][0]:.1f} levels")
    groups = sorted(seen.items(), key=lambda kv: -kv[1][0])[:args.top]
    for k, (g, (d, cname, port, bit)) in enumerate(groups):
        p = path(bit)
        print(f"{d:5.1f}  {g}.{port}  <- {p[0]}")
    for g, (d, cname, port, bit) in groups[:args.path]:
        print(f"\n{d:.1f} levels to {g}.{port}:")
        for step in path(bit):
            print("   ", step)
    return 0


if __name__ == "__main__":
    sys.exit(main())

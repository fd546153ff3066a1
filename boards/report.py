# Ref: nextpnr --report JSON ("utilization": {bel type: {used, available}}, "fmax": {clock net:
#      {achieved, constraint}} in MHz) and its log lines "Max frequency for clock '...': X MHz
#      (PASS|FAIL at Y MHz)".
"""Timing / utilisation report of an ECP5 build, from nextpnr's JSON report or its log."""

import json
import re
from pathlib import Path

__all__ = ["parse_nextpnr_report", "parse_nextpnr_log", "critical_paths", "make_report",
           "format_report", "RESOURCE_NAMES"]

#: report name -> nextpnr bel type(s) (first one present wins)
RESOURCE_NAMES = {
    "LUT4": ("TRELLIS_COMB",),
    "FF": ("TRELLIS_FF",),
    "EBR": ("DP16KD",),
    "DSP": ("MULT18X18D",),
    "IO": ("TRELLIS_IO",),
    "PLL": ("EHXPLLL",),
}

_FMAX_RE = re.compile(r"Max frequency for clock\s+'([^']+)':\s+([0-9.]+) MHz\s+"
                      r"\((PASS|FAIL) at ([0-9.]+) MHz\)")
_UTIL_RE = re.compile(r"^\s*(?:Info:\s+)?\s*([A-Z0-9_]+):\s+(\d+)/\s*(\d+)\s+\d+%", re.M)


#: (substring of nextpnr's clock net name, clock domain of boards/top.py)
#: First match wins: the LiteDRAM core's clocks (its sys clock under either name nextpnr may
#: give the net, the bridge's ``dram_clk`` or the core's ``user_clk`` port; its CRG's init clock)
#: and the oscillator's buffer before the plain ``clk`` of ``sync``.
DOMAIN_HINTS = (("clk_out__2", "core"), ("core_clk", "core"), ("eth_rx", "eth_rx"),
                ("clk_out__1", "eth_tx90"), ("dram_clk", "dram"), ("user_clk", "dram"),
                ("crg_clkout1", "dram_init"),
                ("clk_buf.buf.i", "oscillator"), ("clk100", "oscillator"), ("$glbnet$clk", "sync"))


def _domain(name):
    for hint, domain in DOMAIN_HINTS:
        if hint in name:
            return domain
    return "?"


def _clock_entry(name, achieved, constraint):
    slack = 1e3 / constraint - 1e3 / achieved if achieved > 0 else float("-inf")
    return {"name": name, "domain": _domain(name), "constraint_mhz": round(constraint, 3),
            "achieved_mhz": round(achieved, 3), "slack_ns": round(slack, 3),
            "met": achieved >= constraint}


def parse_nextpnr_report(path):
    """``(clocks, utilization)`` from a ``nextpnr --report`` JSON file."""
    raw = json.loads(Path(path).read_text())
    clocks = [_clock_entry(name, v["achieved"], v["constraint"])
              for name, v in sorted(raw.get("fmax", {}).items())]
    util = {bel: (v["used"], v["available"]) for bel, v in raw.get("utilization", {}).items()}
    return clocks, util


def _block(cell):
    # nextpnr names packed cells after a net of the hierarchy (``core.target.req.x_LUT4_Z``):
    # the dotted prefix is the Amaranth submodule path.
    parts = cell.split(".")
    return ".".join(parts[:-1]) or "(top)"


def critical_paths(path):
    """One summary per clock's critical path in a ``nextpnr --report`` JSON file.

    Each: ``clock`` (launch edge), ``from_cell``, ``to_cell``, ``delay_ns``, ``logic_ns``,
    ``routing_ns``, ``levels`` (logic cells), and ``blocks``: the submodules the path runs
    through, in order (repeats merged).
    """
    raw = json.loads(Path(path).read_text())
    out = []
    for cp in raw.get("critical_paths", []):
        segs = cp.get("path", [])
        if not segs:
            continue
        blocks = []
        for seg in segs:
            for end in ("from", "to"):
                b = _block(seg[end]["cell"])
                if not blocks or blocks[-1] != b:
                    blocks.append(b)
        routing = sum(seg["delay"] for seg in segs if seg["type"] == "routing")
        total = sum(seg["delay"] for seg in segs)
        out.append({"clock": cp.get("from"), "to_clock": cp.get("to"),
                     "from_cell": segs[0]["from"]["cell"], "to_cell": segs[-1]["to"]["cell"],
                     "delay_ns": round(total, 3), "routing_ns": round(routing, 3),
                     "logic_ns": round(total - routing, 3),
                     "levels": sum(1 for seg in segs if seg["type"] == "logic"),
                     "blocks": blocks})
    return out


def parse_nextpnr_log(text):
    """``(clocks, utilization)`` from nextpnr's log; the last timing summary wins."""
    clocks = {}
    for name, achieved, _, constraint in _FMAX_RE.findall(text):
        clocks[name] = _clock_entry(name, float(achieved), float(constraint))
    util = {}
    for bel, used, avail in _UTIL_RE.findall(text):
        util[bel] = (int(used), int(avail))
    return sorted(clocks.values(), key=lambda c: c["name"]), util


def _resources(util):
    out = {}
    for name, bels in RESOURCE_NAMES.items():
        for bel in bels:
            if bel in util:
                used, avail = util[bel]
                out[name] = {"used": used, "available": avail}
                break
        else:
            out[name] = {"used": 0, "available": None}
    return out


def make_report(build_dir, *, board, core, device, build_time_s, memory=None):
    """Collect the report dict of the build in ``build_dir`` (``top.*`` files)."""
    build_dir = Path(build_dir)
    rep_json = build_dir / "nextpnr-report.json"
    log = build_dir / "top.tim"
    clocks, util = [], {}
    log_text = log.read_text(errors="replace") if log.exists() else ""
    # nextpnr writes its --report file, and "Program finished normally", only at the end of
    # the flow: without either, the Fmax figures are post-placement estimates (a run stopped
    # while routing), not timing.
    routed = rep_json.exists() or "Program finished normally" in log_text
    if rep_json.exists():
        clocks, util = parse_nextpnr_report(rep_json)
    if (not clocks or not util) and log.exists():
        lclocks, lutil = parse_nextpnr_log(log_text)
        clocks = clocks or lclocks
        util = util or lutil
    paths = critical_paths(rep_json) if rep_json.exists() else []
    bit = build_dir / "top.bit"
    report = {
        "board": board,
        "core": core,
        "device": device,
        "build_time_s": round(build_time_s, 1),
        "clocks": clocks,
        "resources": _resources(util),
        "bitstream": str(bit) if bit.exists() else None,
        "memory": memory,
        "critical_paths": paths,
    }
    report["routed"] = routed
    report["timing_met"] = routed and bool(clocks) and all(c["met"] for c in clocks)
    return report


def format_report(rep):
    lines = [f"board {rep['board']} ({rep['device']}), core {rep['core']}, "
             f"build time {rep['build_time_s']:.1f} s"
             + (f" (tools' CPU time {rep['tool_cpu_time_s']:.1f} s)"
                if rep.get("tool_cpu_time_s") is not None else "")
             + f", seed {rep.get('seed', '?')}"]
    if rep.get("core_params"):
        lines.append("  core: " + ", ".join(f"{k}={v:#x}" if k.startswith("own_") else
                                            f"{k}={v}" for k, v in rep["core_params"].items()))
    lines.append(f"  {'clock (domain)':<40} {'constraint':>11} {'Fmax':>11} {'slack':>10}")
    for c in rep["clocks"]:
        label = f"{c['name']} ({c.get('domain', '?')})"
        lines.append(f"  {label:<40} {c['constraint_mhz']:>7.2f} MHz {c['achieved_mhz']:>7.2f}"
                     f" MHz {c['slack_ns']:>+7.3f} ns  {'PASS' if c['met'] else 'FAIL'}")
    if not rep["clocks"]:
        lines.append("  (no clock timing found)")
    for name, r in rep["resources"].items():
        avail = r["available"]
        lines.append(f"  {name:<5} {r['used']:>6} / {avail if avail is not None else '-':>6}")
    if (rep.get("memory") or {}).get("dram"):
        mem = rep["memory"]
        lines.append(f"  memory: {mem['dram_bytes'] >> 20} MiB of DRAM ({mem['dram']}, "
                     f"controller clock {mem['dram_clock_mhz']:g} MHz): the kbtp core's target "
                     f"memory (pool, table, rings, buffers)")
    elif rep.get("memory"):
        mem = rep["memory"]
        lines.append(f"  memory config: pool {mem['pool_bytes'] // 1024} KiB "
                     f"({mem['pool_blocks']} x {mem['block_size']} B; the kbtp core's target "
                     f"memory), table {mem['table_entries']}, ring {mem['ring_slots']}, "
                     f"completions {mem['completion_slots']}: budget ~{mem['ebr_used']} of "
                     f"{mem['ebr_total']} EBR")
    for cp in rep.get("critical_paths") or []:
        if cp["clock"] != cp["to_clock"]:
            continue        # clock crossings / pads: in report.json only
        lines.append(f"  critical path {cp['clock']} -> {cp['to_clock']}: {cp['delay_ns']:.2f} ns "
                     f"({cp['logic_ns']:.2f} logic, {cp['routing_ns']:.2f} routing, "
                     f"{cp['levels']} levels)")
        lines.append(f"    {cp['from_cell']} -> {cp['to_cell']}")
        lines.append(f"    through {' > '.join(cp['blocks'])}")
    lines.append(f"  bitstream: {rep['bitstream'] or '(none)'}")
    if rep.get("stage") == "pack":
        lines.append("  timing: not analysed (synthesis + pack only)")
    elif not rep.get("routed", True):
        lines.append("  timing: NOT ROUTED (the Fmax above are post-placement estimates)")
    else:
        lines.append(f"  timing: {'MET on every clock' if rep['timing_met'] else 'NOT MET'}")
    return "\n".join(lines)

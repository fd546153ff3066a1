# Ref: issue 24 (the demo and kbtp-perf speak in target time); sim/serve_stats.py (records);
#      tests/e2e/demo.py (``STEP`` lines); draft KBTP §Operations.
"""Target time of guest steps, from a ``kbtp-sim serve --stats-file``.

Wall time in the guest is QEMU TCG plus the simulation (seconds per request); the target's
own time is what the ECPIX-5 core takes at its clocks (microseconds). A *step* is a set of
KBTP requests, named by their Request IDs; its target time is the *span* from the last octet
of its first request into the target to the first octet of its last COMPLETION out (GMII
cycles of 8 ns), which for one request is its ``cycles_completion``.
"""

import re

__all__ = ["parse_steps", "step_times", "records_by_rid", "span", "plot_steps", "WHICH_IS_WHICH"]

WHICH_IS_WHICH = ("wall time: QEMU TCG guest + simulation; target time: what the ECPIX-5 core "
                  "takes at its clocks (GMII 125 MHz = 8 ns/cycle, core 41.67 MHz = 24 ns/cycle)")

_STEP = re.compile(r"^STEP (\d+) rids=([\d,]*) wall_ms=([\d.]+) what=(.*)$")


def parse_steps(output):
    """``STEP`` lines of a guest's output -> list of dicts (n, rids, wall_ms, what)."""
    out = []
    for ln in output.splitlines():
        m = _STEP.match(ln.strip())
        if m:
            out.append({"n": int(m.group(1)),
                        "rids": [int(x) for x in m.group(2).split(",") if x],
                        "wall_ms": float(m.group(3)), "what": m.group(4).strip()})
    return out


def records_by_rid(stats, peer_qpn=None):
    """Completed records of the stats file by Request ID (the newest wins; GOODBYE, which has
    no reply, is left out), optionally of one initiator QP."""
    out = {}
    for r in stats.get("records", []):
        if r.get("completion_cycle") is None or r.get("request_id") is None:
            continue
        if peer_qpn is not None and r.get("peer_qpn") != peer_qpn:
            continue
        out[r["request_id"]] = r
    return out


def span(recs, ns_per_cycle=8.0):
    """(cycles, ns) from the first request's last octet in to the last COMPLETION's first octet
    out over ``recs`` (records of :mod:`sim.serve_stats`); None when empty."""
    if not recs:
        return None
    cyc = max(r["completion_cycle"] for r in recs) - min(r["rx_last_cycle"] for r in recs)
    return cyc, cyc * ns_per_cycle


def step_times(steps, stats):
    """Each step with ``target``: (cycles, ns) span of its requests, or None (no KBTP request,
    e.g. one-sided RDMA alone); ``records``: the matched records."""
    by = records_by_rid(stats)
    ns = stats.get("clocks", {}).get("ns_per_gmii_cycle", 8.0)
    out = []
    for s in steps:
        recs = [by[r] for r in s["rids"] if r in by]
        out.append(dict(s, records=recs, target=span(recs, ns)))
    return out


def plot_steps(timed, path, title="KBTP demo: target time per step"):
    """Horizontal bars of each step's target time (us) with its wall time (ms) on a second
    panel; a PNG at ``path`` (matplotlib, Agg)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [t for t in timed if t["target"] is not None]
    if not rows:
        return None
    labels = [t["what"][:48] for t in rows]
    tgt = [t["target"][1] / 1e3 for t in rows]
    wall = [t["wall_ms"] for t in rows]
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 0.42 * len(rows) + 1.6), sharey=True)
    y = range(len(rows))
    a.barh(y, tgt, color="tab:blue")
    a.set_yticks(list(y), labels, fontsize=8)
    a.invert_yaxis()
    a.set_xlabel("target time [us] (ECPIX-5 core at its clocks)")
    for k, v in enumerate(tgt):
        a.text(v, k, f" {v:.1f}", va="center", fontsize=7)
    b.barh(y, wall, color="tab:gray")
    b.set_xlabel("wall time [ms] (QEMU TCG guest + simulation)")
    for k, v in enumerate(wall):
        b.text(v, k, f" {v:.0f}", va="center", fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path

# Ref: issue 24 (kbtp-perf against the simulated target, wall time and target time);
#      host/perf.py; sim/serve_guest.py (run_e2e); sim/serve_stats.py (--stats-file records);
#      draft KBTP §Operations.
"""Run ``kbtp-perf`` in the soft-RoCE guest against ``kbtp-sim serve --stats-file``.

``python -m tools.perf_run [--ops load,store,alloc_store,free] [--sizes 64,4096] [--iters N]
[--depth D] [--conns C] [--mtu 1024|4096] [--backend gateware] [--out DIR]``

Boots the guest (:func:`sim.serve_guest.run_e2e`, gateware backend: the Verilated ECPIX-5
core), runs :mod:`host.perf` in it with ``--json``, and prints, per test, the guest's
perftest tables (wall time: QEMU TCG + simulation) and beside them the target's own figures
from the stats file, in board time at the board's clocks (GMII 125 MHz, 8 ns a cycle; core
41.67 MHz, 24 ns):

* per request, last request octet in -> first octet of its COMPLETION out: min, typical
  (median), average, max in usec, and the typical in GMII and core cycles; the first response
  (data WRITE, source READ or the COMPLETION);
* ``BW span``: octets / (board time from the first request in to the last COMPLETION out),
  as issue 24 defines it -- the simulated clock keeps running while the TCG guest prepares
  the next request, so this is bounded by the guest, not the target;
* ``BW busy``: octets / (board time in which at least one request was in the target): what
  the core sustains when requests arrive back to back at this depth.

The guest's tables and the target's are written to ``--out`` (default build/perf) as
``perf.log``, ``stats.json`` and ``perf.json`` (both views per test).
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

__all__ = ["main", "target_figures", "busy_cycles"]

TGT_HEAD = (" #bytes #requests  t_min[usec]  t_typical[usec]  t_avg[usec]  t_max[usec]  "
            "typ[GMII cyc]  typ[core cyc]  first_resp_typ[usec]  BW span[MB/sec]  "
            "BW busy[MB/sec]")


def busy_cycles(recs):
    """GMII cycles covered by the union of the records' [request in, COMPLETION out]."""
    iv = sorted((r["rx_last_cycle"], r["completion_cycle"]) for r in recs)
    total, cur_s, cur_e = 0, None, None
    for s, e in iv:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def target_figures(test, stats):
    """The target's view of one ``PERFJSON`` test: its timed requests' records (by initiator
    QPN and Request ID, of the test's operation), summarised in board time; None if none."""
    want = {(int(q), rid) for q, rids in test["rids"].items() for rid in rids}
    op = "BIND" if test["op"] == "DIRECT_ALLOC" else test["op"]
    recs = [r for r in stats["records"]
            if (r["peer_qpn"], r["request_id"]) in want and r["opcode"] == op
            and r["completion_cycle"] is not None]
    if not recs:
        return None
    clk = stats["clocks"]
    ns = clk["ns_per_gmii_cycle"]
    cyc = sorted(r["cycles_completion"] for r in recs)
    first = sorted(r["cycles_first"] for r in recs)
    octets = sum(r["length"] for r in recs) if op != "FREE" else test["bytes"] * len(recs)
    span = max(r["completion_cycle"] for r in recs) - min(r["rx_last_cycle"] for r in recs)
    busy = busy_cycles(recs)
    typ = statistics.median(cyc)
    return {"requests": len(recs), "bytes": test["bytes"],
            "t_min": cyc[0] * ns / 1e3, "t_typical": typ * ns / 1e3,
            "t_avg": statistics.fmean(cyc) * ns / 1e3, "t_max": cyc[-1] * ns / 1e3,
            "typ_gmii_cycles": typ, "typ_core_cycles": typ * ns / clk["ns_per_core_cycle"],
            "first_typical": statistics.median(first) * ns / 1e3,
            "span_cycles": span, "busy_cycles": busy, "octets": octets,
            "bw_span_MBps": octets / (span * ns * 1e-9) / 1e6 if span else 0.0,
            "bw_busy_MBps": octets / (busy * ns * 1e-9) / 1e6 if busy else 0.0,
            "statuses": sorted({r["status_name"] for r in recs})}


def tgt_row(t):
    return (f" {t['bytes']:<6} {t['requests']:<10} {t['t_min']:<12.2f} {t['t_typical']:<16.2f} "
            f"{t['t_avg']:<12.2f} {t['t_max']:<12.2f} {t['typ_gmii_cycles']:<14.0f} "
            f"{t['typ_core_cycles']:<14.0f} {t['first_typical']:<21.2f} "
            f"{t['bw_span_MBps']:<16.2f} {t['bw_busy_MBps']:.2f}")


def report(output, stats):
    """The guest's output with the target's table after each operation's tables; returns
    (text, list of {"guest": ..., "target": ...})."""
    tests = [json.loads(ln[len("PERFJSON "):]) for ln in output.splitlines()
             if ln.startswith("PERFJSON ")]
    lines, both = [], []
    by_op = {}
    ck = (stats or {}).get("clocks") or {"mac_hz": 125e6, "core_hz": 125e6 / 6}
    clocks = (f"clocks of the simulated target: GMII {ck['mac_hz'] / 1e6:g} MHz = "
              f"{1e9 / ck['mac_hz']:g} ns/cycle, core {ck['core_hz'] / 1e6:.2f} MHz = "
              f"{1e9 / ck['core_hz']:g} ns/cycle")
    for t in tests:
        f = target_figures(t, stats) if stats else None
        both.append({"guest": t, "target": f})
        by_op.setdefault(t["op"], []).append(f)
    cur = None
    out_lines = [ln for ln in output.splitlines() if not ln.startswith("PERFJSON ")]
    for k, ln in enumerate(out_lines):
        lines.append(ln)
        if ln.startswith("# ") and ln[2:].split(" ")[0] in by_op:
            cur = ln[2:].split(" ")[0]
        last_lat = (ln.startswith(" ") and cur is not None and
                    (k + 1 == len(out_lines) or not out_lines[k + 1].startswith(" ")))
        if last_lat and out_lines[k - 1 - len(by_op[cur]) + 1].startswith(" #bytes #iter"):
            lines.append(f"# {cur}: target time ({clocks}; request in -> COMPLETION out)")
            lines.append(TGT_HEAD)
            for f in by_op[cur]:
                lines.append(tgt_row(f) if f else " (no target records)")
            cur = None
    return "\n".join(lines), both


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m tools.perf_run")
    p.add_argument("--ops", default="load,store,alloc_store,free")
    p.add_argument("--sizes", default="64,4096")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--depth", type=int, default=1)
    p.add_argument("--conns", type=int, default=1)
    p.add_argument("--mtu", type=int, choices=(1024, 4096), default=1024,
                   help="RoCE path MTU: the guest's interface MTU is set to 1500 / 9000")
    p.add_argument("--out", default="build/perf")
    p.add_argument("--timeout", type=float, default=3600)
    p.add_argument("--hw", choices=("ecpix5", "unit"), default="ecpix5",
                   help="the target kbtp-sim serve simulates: the ECPIX-5 core (default; 4 KiB "
                        "blocks in its 128 KiB) or the one-clock unit-test target (4 MiB: "
                        "64 KiB blocks; not what a board builds)")
    a = p.parse_args(argv)

    from sim.guest.run import GuestError
    from sim.serve_guest import run_e2e
    from tools.target_time import WHICH_IS_WHICH
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stats_file = out / "stats.json"
    stats_file.unlink(missing_ok=True)
    args = ["--ops", a.ops, "--sizes", a.sizes, "--iters", str(a.iters), "--depth",
            str(a.depth), "--conns", str(a.conns), "--mtu", str(a.mtu), "--json"]
    which = ("Verilated ECPIX-5 core" if a.hw == "ecpix5" else
             "Verilated one-clock unit-test target, NOT a board's configuration")
    # The unit target has the memory for the large configuration (64 KiB blocks).
    config = {} if a.hw == "ecpix5" else {"block_size": 65536, "num_blocks": 64,
                                          "direct_quota": 8, "quota_per_initiator": 16}
    print(f"[host] kbtp-perf {' '.join(args)} in the soft-RoCE guest against kbtp-sim serve "
          f"({which}); booting the guest (TCG)", flush=True)
    t0 = time.monotonic()
    try:
        r = run_e2e("perf.py", args, mtu=1500 if a.mtu == 1024 else 9000, timeout_s=a.timeout,
                    backend="gateware", stats_file=stats_file, hw=a.hw, config=config)
    except (GuestError, RuntimeError) as exc:
        print(f"[host] failed: {exc}", file=sys.stderr)
        return 1
    stats = json.loads(stats_file.read_text()) if stats_file.exists() else None
    text, both = report(r.output, stats)
    print(text)
    print(f"[host] {WHICH_IS_WHICH}" if a.hw == "ecpix5" else
          "[host] wall time: QEMU TCG guest + simulation; target time: what the one-clock "
          "unit-test target takes at its clocks (GMII and core 125 MHz): not a board's figures")
    print(f"[host] guest boot {r.guest.boot_s:.1f} s, whole run {time.monotonic() - t0:.1f} s; "
          f"guest exit {r.exit_code}")
    (out / "perf.log").write_text(text + "\n")
    (out / "perf.json").write_text(json.dumps(both, indent=1))
    return 0 if r.exit_code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

# Ref: make demo; docs/softroce-vm.md
"""``make demo``: ``kbtp-sim serve`` + the soft-RoCE guest running ``tests/e2e/demo.py``.

Prints the guest's log (what moved, where, how long) as it runs, then the target's side: the
requests it served, RDMA traffic, frames, and per-operation counters (the gateware's engine and
host driver, or the model's). With the gateware, the target's own time per step too (issue 24):
``kbtp-sim serve --stats-file`` gives the board time of every request (sim/serve_stats.py), the
guest's ``STEP`` lines name each step's Request IDs; the log, the stats and a PNG of the target
time per step go to ``--out`` (default build/demo).
``python -m tools.serve_demo [--backend gateware|model] [--mtu 1500|9000] [--drop F] [--pcap FILE]
[--target-log] [--out DIR]``.
"""

import argparse
import sys
import time


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m tools.serve_demo")
    p.add_argument("--mtu", type=int, default=1500, help="guest MTU (9000 -> RoCE MTU 4096)")
    p.add_argument("--drop", type=float, default=0.0, help="frame loss at the target")
    p.add_argument("--pcap", help="capture both directions here")
    p.add_argument("--target-log", action="store_true", help="also print the target's log")
    p.add_argument("--backend", choices=("gateware", "model"), default="gateware",
                   help="the Verilated gateware (first run builds it) or the golden model")
    p.add_argument("--out", default="build/demo",
                   help="gateware: demo log, stats file and target-time PNG here")
    a = p.parse_args(argv)
    from pathlib import Path
    out = Path(a.out)
    stats_file = None
    if a.backend == "gateware":
        out.mkdir(parents=True, exist_ok=True)
        stats_file = out / "stats.json"
        stats_file.unlink(missing_ok=True)

    from sim.guest.run import GuestError
    from sim.serve_guest import run_e2e

    what = {"model": "kbtp-sim serve --model (golden model behind a Python RoCEv2 RC endpoint)",
            "gateware": "kbtp-sim serve (Verilated KbtpTarget gateware + host driver + CM)"}
    print("[host] KBTP end-to-end demo: Linux soft-RoCE initiator (QEMU guest, pyverbs) <-> "
          + what[a.backend])
    print(f"[host] booting the guest (TCG; this takes a while), MTU {a.mtu}, loss {a.drop}",
          flush=True)
    t0 = time.monotonic()
    try:
        r = run_e2e("demo.py", mtu=a.mtu, drop=a.drop, pcap=a.pcap, timeout_s=900,
                    log_stream=sys.stdout if a.target_log else None, backend=a.backend,
                    stats_file=stats_file)
    except (GuestError, RuntimeError) as exc:
        print(f"[host] failed: {exc}", file=sys.stderr)
        return 1
    print("\n".join(ln for ln in r.output.rstrip().splitlines() if not ln.startswith("STEP ")))
    print(f"[host] guest boot {r.guest.boot_s:.1f} s, whole run {time.monotonic() - t0:.1f} s")
    if a.backend == "model":
        g = r.glue
        print(f"[host] target served {g['requests']} requests: {g['reads']} RDMA READs "
              f"({g['read_bytes']} octets), {g['writes']} RDMA WRITEs ({g['write_bytes']} "
              f"octets), {g['sends']} SENDs; frames in {r.frames['rx']}, out {r.frames['tx']}, "
              f"dropped {r.frames['dropped']}; retransmissions "
              f"{r.ep_counters['retransmissions']}")
    else:
        c = r.ep_counters
        if a.target_log:
            for ln in r.log:
                print(f"[target] {ln}")
        print(f"[host] target frames in {c.get('mac.rx_frames_ok', 0)}, out "
              f"{c.get('mac.tx_frames', 0)} (UDP: in {r.frames.get('rx')}, out "
              f"{r.frames.get('tx')}, dropped {r.frames.get('dropped')}); ICRC ok "
              f"{c.get('icrc.cnt_ok', 0)}, bad {c.get('icrc.cnt_bad', 0)}; retransmissions "
              f"{c.get('req.cnt_retransmits', 0)}; host driver actions "
              f"{r.driver.get('host_actions')}; "
              + "; ".join(f"{ln}" for ln in r.log if ln.startswith("frames ")))
    counts = ", ".join(f"{op} {st}: {n}" for (op, st), n in sorted(r.statuses().items()))
    print(f"[host] {'model' if a.backend == 'model' else 'engine + driver'} counters: {counts}")
    if stats_file is not None and stats_file.exists():
        _target_time(r.output, stats_file, out)
    if a.pcap:
        print(f"[host] capture: {a.pcap} (tshark -r {a.pcap} --disable-protocol rpcordma)")
    print(f"[host] demo {'PASSED' if r.exit_code == 0 else 'FAILED'}")
    return 0 if r.exit_code == 0 else 1


def _target_time(output, stats_file, out):
    """Per demo step: the guest's wall time beside the target's time at the board's clocks."""
    import json

    from tools.target_time import WHICH_IS_WHICH, parse_steps, plot_steps, step_times
    stats = json.loads(stats_file.read_text())
    timed = step_times(parse_steps(output), stats)
    (out / "demo.log").write_text(output)
    print(f"[host] target time per step ({WHICH_IS_WHICH}):")
    for t in timed:
        if t["target"] is None:
            tt = "(no KBTP request: one-sided RDMA or none timed)"
        else:
            cyc, ns = t["target"]
            first = min(r["ns_first"] for r in t["records"])
            core = ns / stats["clocks"]["ns_per_core_cycle"]
            tt = (f"target {ns / 1e3:9.2f} us ({cyc} GMII cycles, {core:.0f} core cycles; "
                  f"first response after {first / 1e3:.2f} us)")
        print(f"[host]   {t['what'][:56]:<56} wall {t['wall_ms']:9.2f} ms   {tt}")
    wall = sum(t["wall_ms"] for t in timed)
    tgt = sum(t["target"][1] for t in timed if t["target"] is not None)
    png = plot_steps(timed, out / "target_time.png")
    print(f"[host] summary: wall time {wall / 1e3:.2f} s over the steps (QEMU TCG guest + "
          f"simulation); target time {tgt / 1e3:.1f} us over the same steps (what the ECPIX-5 "
          f"core takes at its clocks); log {out / 'demo.log'}, stats {stats_file}, "
          f"plot {png}")


if __name__ == "__main__":
    sys.exit(main())

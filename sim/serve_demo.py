# Ref: make demo; docs/softroce-vm.md
"""``make demo``: ``kbtp-sim serve`` + the soft-RoCE guest running ``tests/e2e/demo.py``.

Prints the guest's log (what moved, where, how long) as it runs, then the target's side: the
requests it served, RDMA traffic, frames, and per-operation counters (the gateware's engine and
host driver, or the model's).
``python -m sim.serve_demo [--backend gateware|model] [--mtu 1500|9000] [--drop F] [--pcap FILE]
[--target-log]``.
"""

import argparse
import sys
import time


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m sim.serve_demo")
    p.add_argument("--mtu", type=int, default=1500, help="guest MTU (9000 -> RoCE MTU 4096)")
    p.add_argument("--drop", type=float, default=0.0, help="frame loss at the target")
    p.add_argument("--pcap", help="capture both directions here")
    p.add_argument("--target-log", action="store_true", help="also print the target's log")
    p.add_argument("--backend", choices=("gateware", "model"), default="gateware",
                   help="the Verilated gateware (first run builds it) or the golden model")
    a = p.parse_args(argv)

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
                    log_stream=sys.stdout if a.target_log else None, backend=a.backend)
    except (GuestError, RuntimeError) as exc:
        print(f"[host] failed: {exc}", file=sys.stderr)
        return 1
    print(r.output.rstrip())
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
    if a.pcap:
        print(f"[host] capture: {a.pcap} (tshark -r {a.pcap} --disable-protocol rpcordma)")
    print(f"[host] demo {'PASSED' if r.exit_code == 0 else 'FAILED'}")
    return 0 if r.exit_code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

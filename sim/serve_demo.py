# Ref: brief e2e.md (make demo); shared/notes/softroce-vm.md
"""``make demo``: ``serve --model`` + the soft-RoCE guest running ``tests/e2e/demo.py``.

Prints the guest's log (what moved, where, how long) as it runs, then the target's side: the
requests it served, RDMA traffic, frames, and the model's per-operation counters.
``python -m sim.serve_demo [--mtu 1500|9000] [--drop F] [--pcap FILE] [--target-log]``.
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
    a = p.parse_args(argv)

    from sim.guest.run import GuestError
    from sim.serve_guest import run_e2e

    print("[host] KBTP end-to-end demo: Linux soft-RoCE initiator (QEMU guest, pyverbs) <-> "
          "kbtp-sim serve --model (golden model behind a Python RoCEv2 RC endpoint)")
    print(f"[host] booting the guest (TCG; this takes a while), MTU {a.mtu}, loss {a.drop}",
          flush=True)
    t0 = time.monotonic()
    try:
        r = run_e2e("demo.py", mtu=a.mtu, drop=a.drop, pcap=a.pcap, timeout_s=600,
                    log_stream=sys.stdout if a.target_log else None)
    except GuestError as exc:
        print(f"[host] guest failed: {exc}", file=sys.stderr)
        return 1
    print(r.output.rstrip())
    g = r.glue
    print(f"[host] guest boot {r.guest.boot_s:.1f} s, whole run {time.monotonic() - t0:.1f} s")
    print(f"[host] target served {g['requests']} requests: {g['reads']} RDMA READs "
          f"({g['read_bytes']} octets), {g['writes']} RDMA WRITEs ({g['write_bytes']} octets), "
          f"{g['sends']} SENDs; frames in {r.frames['rx']}, out {r.frames['tx']}, "
          f"dropped {r.frames['dropped']}; retransmissions {r.ep_counters['retransmissions']}")
    counts = ", ".join(f"{op} {st}: {n}" for (op, st), n in sorted(r.model.counters.items()))
    print(f"[host] model counters: {counts}")
    if a.pcap:
        print(f"[host] capture: {a.pcap} (tshark -r {a.pcap} --disable-protocol rpcordma)")
    print(f"[host] demo {'PASSED' if r.exit_code == 0 else 'FAILED'}")
    return 0 if r.exit_code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

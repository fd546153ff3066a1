# Ref: issue 22 item 4 (table and ring at pool scale, initialised in DDR3 within seconds);
#      host/driver.py (init: ``initial_structures``); sim/vllink.py (the UDP host link over the
#      simulated wire); sim/vltarget.py SHIPPED (the ECPIX-5 core, DDR3 timing model);
#      draft KBTP §Block Table, §Free-Block Ring.
"""``make init-time``: how long the host driver takes to set up a pool-scale table and ring.

The shipped core (:data:`sim.vltarget.SHIPPED`: the ECPIX-5 bitstream's KbtpCore, its memory
the 512 MB of DDR3 through the timing model of LiteDRAM's user port) under Verilator. The driver
(:class:`host.driver.KbtpDriver`, as it is) writes the table of ``--handles`` entries and the
ring of one slot per block (``--blocks`` blocks of ``--block-size`` octets), the counters and
the QPs, and 4 initiators say HELLO. Not the pool itself: a board's DRAM holds whatever it
held; the driver never reads a block it has not written (``zero_pool = False``).

``--link udp`` (default): every host access goes over the UDP host link (what a board's host
uses; the host's own turnaround per exchange is ``--turnaround-ns``, default 0), simulated
at the board's clocks with the target; ``--link bus``: the direct host bus in zero simulated
time (a lower bound: the target's own time to take the writes). Prints GMII cycles and
milliseconds at the board's clocks (125 MHz GMII, 25 MHz core).
"""

import argparse
import json
import sys
import time

__all__ = ["init_time", "main"]


def init_time(*, handles=65536, blocks=65536, block_size=1024, link="udp", turnaround_ns=0.0,
              log=print):
    """Run one bring-up; returns the figures dict."""
    from sim.system import VlSystemBench, model_config, run_sync
    from sim.vltarget import SHIPPED, VlTarget
    from sim.vllink import VlUdpSystemBench
    cfg = model_config(block_size=block_size, num_blocks=blocks, num_handles=handles,
                       handles_per_initiator=handles // 16)
    with VlTarget(SHIPPED, log=log) as vt:
        if link == "udp":
            b = VlUdpSystemBench(vt, n_init=4, cfg=cfg, seed=22, host_turnaround_ns=turnaround_ns)
        else:
            b = VlSystemBench(vt, n_init=4, cfg=cfg, seed=22, bulk=True)
        b.driver.zero_pool = False
        b.hello_cycles = 10_000_000
        octets = sum(len(x) for _, x in b.driver.initial_structures())
        t0, c0 = time.perf_counter(), vt.cycle
        run_sync(b.bring_up())
        cycles = vt.cycle - c0
        out = {"link": link, "handles": handles, "ring_slots": cfg.layout()["ring_n"],
               "blocks": blocks, "block_size": block_size, "octets": octets,
               "gmii_cycles": cycles, "ms": round(cycles * 8 / 1e6, 1),
               "turnaround_ns": turnaround_ns, "wall_s": round(time.perf_counter() - t0, 1)}
        if link == "udp":
            out["udplink"] = dict(b.udplink.stats)
    log(f"init-time ({link}): {handles:,} handles, {out['ring_slots']:,} ring slots, "
        f"{blocks:,} blocks of {block_size}: {octets:,} octets written in {cycles:,} GMII "
        f"cycles = {out['ms']} ms at the board's clocks"
        + (f" ({out['udplink']['exchanges']:,} exchanges, host turnaround {turnaround_ns:g} ns "
           f"each)" if link == "udp" else "") + f"; wall {out['wall_s']} s")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--handles", type=int, default=65536)
    ap.add_argument("--blocks", type=int, default=65536)
    ap.add_argument("--block-size", type=int, default=1024)
    ap.add_argument("--link", choices=("udp", "bus"), default="udp")
    ap.add_argument("--turnaround-ns", type=float, default=0.0)
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    out = init_time(handles=a.handles, blocks=a.blocks, block_size=a.block_size, link=a.link,
                    turnaround_ns=a.turnaround_ns)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

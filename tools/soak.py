# Ref: issue 7 item 2: the soak; draft KBTP §Operations, §Free-Block Ring (every block
#      in exactly one place), §Direct Modes; sim/system.py (bench, rounds vs the model);
#      sim/vltarget.py (Verilated target); sim/channel.py (LossyLink).
"""Soak: the Verilated target serving 4 initiators (``--initiators``: up to its QPs) for
thousands of mixed KBTP operations over a lossy, duplicating, corrupting link, against the
golden model.

Usage::

    python -m tools.soak --ops 10000 --loss 0.01 --dup 0.01 --corrupt 0.001 --seed 1 [--hw unit]

The target is the core the ECPIX-5 bitstream holds (:data:`sim.vltarget.SHIPPED`: two clocks,
width 64, 512 MB of DDR3 through its timing model) unless ``--hw ecpix5-bram`` asks for the
same core with 128 KiB of block RAM, or ``--hw unit`` for the one-clock width-8 unit target.

Initiators: one :class:`roce.rc.RoceEndpoint` QP each (4 by default); initiator 0 holds a
DIRECT_LOAD + DIRECT_ALLOC session (its turns include DIRECT_LOAD reads and DIRECT_ALLOC
FetchAdd + slot READ + partition WRITE + BIND), the others ALLOC_STORE (inline and by READ),
STORE, LOAD and FREE (some requests malformed on purpose, 12 %). The host side is
:class:`host.driver.KbtpDriver` (HELLO, FREE, BIND and all of the direct session's requests).
Every round is matched to the model (any draft-allowed order); the initiators' buffers the
target writes are compared with the model's after every round; at the end the target's memory
image (counters, table, rings, pool) must equal the model's, the engine's + driver's counters
the model's, and every pool block must be in exactly one place (:func:`sim.system.block_census`).
"""

import argparse
import json
import sys
import time

from hw.headers import Features
from sim.system import (DIRECT, VlSystemBench, block_census, mixed, mixed_checks, model_config,
                        run_sync)
from sim.vltarget import NAMED, SHIPPED, VlTarget

#: ``--hw`` choices: the shipped board core (DDR3 timing model, boards/dram.py), the same with
#: its memory in block RAM, or the one-clock unit-test target.
HW_CHOICES = NAMED

__all__ = ["soak", "main"]


def soak(*, ops=10000, loss=0.01, dup=0.01, corrupt=0.001, seed=1, n_init=4, direct=True,
         params=None, peer_timeout=5, log=print, vt=None):
    """Run the soak; returns the figures dict (raises AssertionError on any mismatch).

    Parameters
    ----------
    ops : int
        KBTP operations to run (requests posted plus DIRECT_LOAD reads).
    loss, dup, corrupt : float
        LossyLink impairments, both directions (corruption flips one bit past the Ethernet
        header: the target's FCS/ICRC checks or the peer's ICRC check drop the frame).
    peer_timeout : int
        The initiators' ACK timeout code (4.096 us * 2**code; 5 = 131 us).
    vt : VlTarget, optional
        A running target (fresh from reset); default: one built from ``params`` (default
        :data:`~sim.vltarget.SHIPPED`, the ECPIX-5 core as built).
    """
    own = vt is None
    vt = vt or VlTarget(SHIPPED if params is None else params, log=log)
    try:
        # Beyond 4 initiators the table and pool grow with them (16 handles and 3 blocks
        # each, as the 4-initiator configuration has), and a round holds at most 4 of them:
        # every order of a round's requests is tried against the model (k! runs).
        scale = {} if n_init <= 4 else dict(num_handles=16 * n_init, num_blocks=3 * n_init)
        cfg = model_config(direct_partitions=1, direct_quota=4, masked=False, **scale) \
            if direct else (model_config(**scale) if scale else None)
        b = VlSystemBench(vt, n_init=n_init, loss=loss, dup=dup, corrupt=corrupt, seed=seed,
                          cfg=cfg, peer_timeout=peer_timeout)
        feats = [Features.RECORD_COMPLETION.value if q % 2 else 0 for q in range(n_init)]
        if direct:
            feats[0] = DIRECT
        t0 = time.perf_counter()
        run_sync(b.bring_up(features=feats))
        t_up, c_up = time.perf_counter() - t0, vt.cycle
        last = [time.perf_counter()]

        def progress(st):
            if time.perf_counter() - last[0] > 30:
                last[0] = time.perf_counter()
                done = st["requests"] + st["direct_load"]
                log(f"soak: {done} ops, {st['rounds']} rounds, cycle {vt.cycle:,}, "
                    f"{vt.cycle / (last[0] - t0):,.0f} cycles/s")

        stats = run_sync(mixed(b, ops=ops, direct=direct, progress=progress,
                               max_batch=4 if n_init > 4 else None))
        figs = run_sync(mixed_checks(b, stats, direct=direct))
        census = block_census(b.model, vt.mem_read)
        wall = time.perf_counter() - t0
        figs.update(
            ops=stats["requests"] + stats["direct_load"],
            image_equal=True,                       # mixed_checks raised otherwise
            census={k: v for k, v in census.items() if k != "where"},
            peer=dict(retransmissions=b.ep.counters.retransmissions,
                      duplicates=b.ep.counters.duplicates, retries=b.ep.counters.retries,
                      naks_sent=b.ep.counters.naks_sent,
                      naks_received=b.ep.counters.naks_received,
                      icrc_errors=b.ep.counters.icrc_errors),
            target_requester=run_sync(b.req_counters()),
            target_responder=run_sync(b.resp_counters()),
            target_mac=run_sync(b.mac_counters()),
            bring_up=dict(seconds=round(t_up, 1), cycles=c_up),
            wall_s=round(wall, 1), cycles_per_s=round(vt.cycle / wall))
        assert census["lost"] == 0 and census["duplicated"] == 0, census
        # The MAC's transmitter sends cut-through (issue 21): no frame of the target's may have
        # run dry on the wire (an underrun is a frame lost, which the transport would hide).
        assert figs["target_mac"]["tx_underruns"] == 0, figs["target_mac"]
        return figs
    finally:
        if own:
            vt.close()


def report(f, log=print):
    """Print the soak's figures."""
    log(f"ops done: {f['ops']} in {f['rounds']} rounds; by kind: "
        + ", ".join(f"{k}={v}" for k, v in sorted(f["kinds"].items())))
    log(f"statuses (op, status): {f.get('status')}")
    log(f"requests regenerated because their RDMA transfer would fault (a connection-fatal NAK "
        f"on RoCE): {f.get('faulting_skipped', 0)}")
    log(f"link: {f['link']}")
    p, rq, rs = f["peer"], f["target_requester"], f["target_responder"]
    log(f"peer (initiators): retransmissions={p['retransmissions']} "
        f"duplicates_seen={p['duplicates']} retries={p['retries']} naks_sent="
        f"{p['naks_sent']} naks_received={p['naks_received']} icrc_errors={p['icrc_errors']}")
    log(f"target requester: retransmits={rq['cnt_retransmits']} timeouts={rq['cnt_timeouts']} "
        f"seq_naks={rq['cnt_seq_naks']} stale={rq['cnt_stale']} qp_error={rq['qp_error']}")
    log(f"target responder: duplicates_seen={rs['cnt_duplicates']} seq_naks_sent="
        f"{rs['cnt_seq_naks']} psn_ahead={rs['cnt_psn_ahead']} packets={rs['cnt_packets']}")
    mc = f["target_mac"]
    log(f"target MAC: tx_frames={mc['tx_frames']} tx_underruns={mc['tx_underruns']} "
        f"rx_frames_ok={mc['rx_frames_ok']} rx_fcs_errors={mc['rx_fcs_errors']} "
        f"rx_overflows={mc['rx_overflows']}")
    c = f["census"]
    log(f"ring census: {c['blocks']} blocks, {c['in_rings']} in ring slots, {c['in_table']} in "
        f"table entries, {c['pending']} pending deferred frees; lost={c['lost']} "
        f"duplicated={c['duplicated']}")
    log(f"final memory image == model image: {f['image_equal']}; engine fast-path requests "
        f"{f['fast_path']}, host messages {f['host_messages']}")
    log(f"cycles: {f['cycles']:,} in {f['wall_s']} s = {f['cycles_per_s']:,} cycles/s "
        f"(bring-up {f['bring_up']['seconds']} s)")


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m tools.soak", description=__doc__.split("\n")[0])
    ap.add_argument("--ops", type=int, default=10000)
    ap.add_argument("--loss", type=float, default=0.01)
    ap.add_argument("--dup", type=float, default=0.01)
    ap.add_argument("--corrupt", type=float, default=0.001)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--initiators", type=int, default=4)
    ap.add_argument("--no-direct", action="store_true", help="no DIRECT_* session")
    ap.add_argument("--json", help="write the figures here")
    ap.add_argument("--hw", choices=sorted(HW_CHOICES), default="ecpix5",
                    help="the ECPIX-5 core as built (default) or the one-clock unit target")
    a = ap.parse_args(argv)
    print(f"soak: {a.ops} ops, loss {a.loss}, dup {a.dup}, corrupt {a.corrupt}, seed {a.seed}, "
          f"target {a.hw}", flush=True)
    f = soak(ops=a.ops, loss=a.loss, dup=a.dup, corrupt=a.corrupt, seed=a.seed,
             n_init=a.initiators, direct=not a.no_direct, params=HW_CHOICES[a.hw],
             log=lambda s: print(s, flush=True))
    report(f, log=lambda s: print(s, flush=True))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(f, fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())

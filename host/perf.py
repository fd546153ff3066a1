# Ref: issue 24 (kbtp-perf); draft KBTP §Operations (LOAD, STORE, ALLOC_STORE, FREE),
#      §Direct Modes (DIRECT_LOAD, DIRECT_ALLOC + BIND), §Flow Control (request credits);
#      perftest (linux-rdma/perftest: ib_send_bw / ib_send_lat table layout).
"""``kbtp-perf``: a perftest-style KBTP initiator (pyverbs + rdma_cm, :class:`KbtpClient`).

Runs wherever :mod:`host.initiator` runs (the soft-RoCE guest: ``python3 -m host.perf``, or a
host with pyverbs and a RoCE NIC)::

    kbtp-perf 10.0.0.2 --ops load,store --sizes 64,4096 --iters 100 --depth 4 --conns 1

Per operation and size it prints perftest's bandwidth table (``#bytes #iterations BW
peak[MB/sec] BW average[MB/sec] MsgRate[Mpps]``) and latency table (``t_min t_max t_typical
t_avg t_stdev t_99 t_99.9 [usec]``), and with ``--json`` one ``PERFJSON {...}`` line per test
(the same figures, each connection's QPN and the Request IDs of the timed requests, so a
target-side view -- ``kbtp-sim serve --stats-file``, :mod:`tools.perf_run` -- can pick them out).

What is timed (wall time of this host, submit -> COMPLETION seen; untimed set-up in brackets):

* ``load``: LOAD of a block of ``size`` octets [one ALLOC_STORE per connection first];
* ``store``: STORE (mapped, unsealed) of ``size`` octets into a bound block [ALLOC_STORE];
* ``alloc_store``: ALLOC_STORE of ``size`` octets on a fresh handle [FREE of it afterwards];
* ``free``: FREE of a block holding ``size`` octets [its ALLOC_STORE before];
* ``direct_load``: table-entry RDMA READ + block RDMA READ (one-sided; depth 1);
* ``direct_alloc``: FetchAdd + slot READ + RDMA WRITE + BIND [FREE afterwards] (depth 1).

``--depth`` requests are kept in flight per connection (at most the session's request
credits, and for the allocating tests the session's quota); ``--conns`` connections take the
iterations round-robin, batch by batch. Data of ``size`` <= ``--inline-max`` (default 0: never)
goes INLINE in the request, else the target RDMA READs it. The session requests only the
direct-mode features the chosen operations need (none for LOAD .. FREE: such sessions run on
the target's engine fast path; a direct-mode session is served by the host driver).

MTU: :class:`KbtpClient` takes the QP's path MTU from rdma_cm (``init_qp_attr``, derived from
the interface MTU: 1500 -> 1024, 9000 -> 4096); it does not set it. ``--mtu`` is therefore a
check: the QP's path MTU must equal it (else exit 2); set the interface MTU to change it
(:mod:`tools.perf_run` does, for the guest).
"""

import argparse
import json
import math
import os
import statistics
import sys
import time

__all__ = ["main", "run_test", "OPS", "summarise"]

OPS = ("load", "store", "alloc_store", "free", "direct_load", "direct_alloc")
_MTU_ENUM = {256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}


def _pct(sorted_us, p):
    """Percentile ``p`` (0..100) of sorted values, nearest rank (as perftest's 99%)."""
    if not sorted_us:
        return float("nan")
    k = max(0, min(len(sorted_us) - 1, math.ceil(p / 100 * len(sorted_us)) - 1))
    return sorted_us[k]


def summarise(size, lat_s, batches):
    """perftest's figures from per-operation latencies (s) and batches ((octets, seconds)).

    Returns a dict: ``bytes``, ``iterations``, ``bw_peak_MBps``, ``bw_avg_MBps`` (MB = 10^6
    octets, as perftest's MB/sec), ``msg_rate_Mpps``, ``t_min`` .. ``t_99_9`` (usec).
    """
    us = sorted(x * 1e6 for x in lat_s)
    total_s = sum(t for _, t in batches)
    total_b = sum(b for b, _ in batches)
    return {"bytes": size, "iterations": len(us),
            "bw_peak_MBps": max((b / t / 1e6 for b, t in batches if t > 0), default=0.0),
            "bw_avg_MBps": total_b / total_s / 1e6 if total_s else 0.0,
            "msg_rate_Mpps": len(us) / total_s / 1e6 if total_s else 0.0,
            "t_min": us[0] if us else float("nan"), "t_max": us[-1] if us else float("nan"),
            "t_typical": statistics.median(us) if us else float("nan"),
            "t_avg": statistics.fmean(us) if us else float("nan"),
            "t_stdev": statistics.pstdev(us) if len(us) > 1 else 0.0,
            "t_99": _pct(us, 99), "t_99_9": _pct(us, 99.9)}


BW_HEAD = (" #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   "
           "MsgRate[Mpps]")
LAT_HEAD = (" #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    "
            "t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]")


def bw_row(s):
    return (f" {s['bytes']:<10} {s['iterations']:<14} {s['bw_peak_MBps']:<18.6f} "
            f"{s['bw_avg_MBps']:<20.6f} {s['msg_rate_Mpps']:.6f}")


def lat_row(s):
    return (f" {s['bytes']:<6} {s['iterations']:<11} {s['t_min']:<14.2f} {s['t_max']:<13.2f} "
            f"{s['t_typical']:<16.2f} {s['t_avg']:<14.2f} {s['t_stdev']:<15.2f} "
            f"{s['t_99']:<22.2f} {s['t_99_9']:.2f}")


def _pattern(size, seed):
    return bytes((seed * 131 + k * 7) & 0xFF for k in range(size))


class _Conn:
    """One connection's session state for the tests."""

    def __init__(self, client, index):
        self.c = client
        self.index = index
        self.bufs = []
        self.block = None            # (handle, size) of the block LOAD/STORE use

    def buffers(self, n, size):
        while len(self.bufs) < n or (self.bufs and self.bufs[0].length != size):
            if self.bufs and self.bufs[0].length != size:
                self.bufs = []
            self.bufs.append(self.c.register(max(size, 1)))
        return self.bufs[:n]


def _depth(conn, op, want):
    s = conn.c.session
    d = min(want, conn.c.credits)
    if op in ("alloc_store", "free"):
        d = min(d, max(1, s.allocation_quota - (1 if conn.block else 0)))
    if op in ("direct_load", "direct_alloc"):
        d = 1
    return max(1, d)


def _batch(conn, op, size, depth, inline_max, tag):
    """One batch on one connection: [set-up], timed part, [tear-down].

    Returns (latencies in s, octets moved, timed seconds, Request IDs of the timed requests).
    """
    from host.codec import Free
    c = conn.c
    inline = size <= inline_max
    handles = [c.handle(1 + k) for k in range(depth)]
    lat, rids = [], []
    if op == "free":
        for k, h in enumerate(handles):
            c.submit(c.store_msg(h, _pattern(size, k), seal=True, inline=inline, alloc=True))
        for rid in list(c._inflight):
            c.wait(rid)
    msgs, data = [], None
    if op == "load":
        msgs = [c.load_msg(conn.block[0], b) for b in conn.buffers(depth, size)]
    elif op == "store":
        msgs = [c.store_msg(conn.block[0], b, inline=False) if not inline
                else c.store_msg(conn.block[0], _pattern(size, tag), inline=True)
                for b in conn.buffers(depth, size)]
    elif op == "alloc_store":
        srcs = conn.buffers(depth, size)
        msgs = [c.store_msg(h, _pattern(size, tag), seal=True, inline=True, alloc=True)
                if inline else c.store_msg(h, b, seal=True, alloc=True)
                for h, b in zip(handles, srcs)]
    elif op == "free":
        msgs = [Free(handle=h) for h in handles]
    elif op == "direct_alloc":
        data = _pattern(size, tag)
    t0 = time.monotonic()
    if msgs:
        start = {}
        for m in msgs:
            start[c.submit(m)] = time.monotonic()
        for rid, t in start.items():
            c.wait(rid)
            lat.append(time.monotonic() - t)
            rids.append(rid)
    elif op == "direct_load":
        r = c.direct_load(conn.block[0])
        if len(r.data) != size:
            raise RuntimeError(f"DIRECT_LOAD returned {len(r.data)} octets, not {size}")
        lat.append(time.monotonic() - t0)
    elif op == "direct_alloc":
        t = c.direct_alloc(data)
        rid = c._next_rid
        c.bind(handles[0], t)
        lat.append(time.monotonic() - t0)
        rids.append(rid)
    timed = time.monotonic() - t0
    if op in ("alloc_store", "direct_alloc"):
        frees = [c.submit(Free(handle=h)) for h in handles[:len(lat) if op == "alloc_store"
                                                             else 1]]
        for rid in frees:
            c.wait(rid)
    return lat, size * len(lat), timed, rids


def _prepare(conn, op, size, inline_max):
    """The block LOAD / STORE / DIRECT_LOAD use: handle 0 holding ``size`` octets."""
    c = conn.c
    if op not in ("load", "store", "direct_load"):
        return
    if conn.block is not None and conn.block[1] == size:
        return
    h = c.handle(0)
    if conn.block is not None:
        c.free(h)
    c.alloc_store(h, _pattern(size, 99), seal=op != "store", inline=size <= inline_max)
    conn.block = (h, size)


def run_test(conns, op, size, iters, depth, inline_max=0):
    """Run ``iters`` timed operations of ``op`` at ``size`` over ``conns``; the summary dict
    (:func:`summarise`) plus ``op``, ``depth``, ``conns`` and ``rids`` ({QPN: [Request ID]})."""
    for conn in conns:
        if conn.block is not None and (op == "store") != (conn.block[2:] == ("unsealed",)):
            conn.c.free(conn.block[0])
            conn.block = None
        _prepare(conn, op, size, inline_max)
        if op == "store":
            conn.block = conn.block[:2] + ("unsealed",)
    lat, batches, rids = [], [], {}
    done, k = 0, 0
    while done < iters:
        conn = conns[k % len(conns)]
        d = min(_depth(conn, op, depth), iters - done)
        ls, octets, timed, rr = _batch(conn, op, size, d, inline_max, k)
        lat += ls
        batches.append((octets, timed))
        rids.setdefault(conn.c.qp.qp_num, []).extend(rr)
        done += len(ls)
        k += 1
    out = summarise(size, lat, batches)
    out.update(op=op.upper(), depth=depth, conns=len(conns), rids=rids)
    return out


def _path_mtu(client):
    import pyverbs.enums as e
    attr, _ = client.qp.query(e.IBV_QP_PATH_MTU)
    return {v: k for k, v in _MTU_ENUM.items()}.get(attr.path_mtu, attr.path_mtu)


def main(argv=None):
    p = argparse.ArgumentParser(prog="kbtp-perf", description=__doc__.split("\n\n")[0])
    p.add_argument("target", nargs="?", default=os.environ.get("KBTP_TARGET_IP", "10.0.0.2"),
                   help="target IP (default $KBTP_TARGET_IP or 10.0.0.2)")
    p.add_argument("--port", type=int, default=18515, help="RDMA CM port")
    p.add_argument("--ops", default="load", help=f"comma list of {', '.join(OPS)}")
    p.add_argument("--size", type=int, default=4096, help="octets per operation")
    p.add_argument("--sizes", help="comma list of sizes (a sweep; overrides --size)")
    p.add_argument("--iters", type=int, default=100, help="timed operations per test")
    p.add_argument("--depth", type=int, default=1,
                   help="requests in flight per connection (capped at the request credits)")
    p.add_argument("--conns", type=int, default=1, help="connections (initiator ids 1..N)")
    p.add_argument("--mtu", type=int, choices=sorted(_MTU_ENUM),
                   help="expected RoCE path MTU (checked; set by the interface MTU)")
    p.add_argument("--inline-max", type=int, default=0,
                   help="send data of at most this many octets INLINE (default 0: never)")
    p.add_argument("--json", action="store_true", help="also print PERFJSON lines")
    a = p.parse_args(argv)
    ops = [o.strip().lower() for o in a.ops.split(",") if o.strip()]
    bad = [o for o in ops if o not in OPS]
    if bad:
        p.error(f"unknown operation(s) {bad}; choose from {OPS}")
    sizes = [int(x) for x in a.sizes.split(",")] if a.sizes else [a.size]

    from host.initiator import KbtpClient
    from hw.headers import Features
    # Only the features the tests need: a session with a direct mode is served by the host
    # driver (slow path) on this target, which would hide the engine's figures.
    feats = ((Features.DIRECT_LOAD.value if "direct_load" in ops else 0)
             | (Features.DIRECT_ALLOC.value if "direct_alloc" in ops else 0))
    conns = [_Conn(KbtpClient(a.target, a.port, initiator_id=100 + i, features=feats), i)
             for i in range(a.conns)]
    s = conns[0].c.session
    mtu = _path_mtu(conns[0].c)
    print(f"# kbtp-perf: target {a.target}:{a.port}, {a.conns} connection(s) (QPN "
          f"{', '.join(hex(c.c.qp.qp_num) for c in conns)}), path MTU {mtu}, block size "
          f"{s.block_size}, request credits {s.request_credits}, quota {s.allocation_quota}, "
          f"features {s.features:#x}; wall time of this host", flush=True)
    if a.mtu and a.mtu != mtu:
        print(f"# path MTU is {mtu}, not --mtu {a.mtu}: set the interface MTU", flush=True)
        return 2
    results = []
    try:
        for op in ops:
            print(f"\n# {op.upper()} depth {a.depth}, {a.conns} connection(s)", flush=True)
            rows = []
            for size in sizes:
                if size > s.block_size:
                    print(f"# {size} octets > block size {s.block_size}: skipped")
                    continue
                r = run_test(conns, op, size, a.iters, a.depth, a.inline_max)
                r["path_mtu"] = mtu
                rows.append(r)
                results.append(r)
                if a.json:
                    print("PERFJSON " + json.dumps(r), flush=True)
            print(BW_HEAD)
            for r in rows:
                print(bw_row(r))
            print(LAT_HEAD)
            for r in rows:
                print(lat_row(r))
            sys.stdout.flush()
    finally:
        for conn in conns:
            try:
                conn.c.goodbye(release=True)
            except Exception:
                pass
    return 0


if __name__ == "__main__":
    sys.exit(main())

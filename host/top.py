# Ref: issue 24 (kbtp top); draft KBTP §Operations (status codes); host/driver.py (counters());
#      hw/target/target.py (TOP_COUNTERS, RESP_COUNTERS, REQ_COUNTERS); sim/serve_stats.py.
"""``kbtp top``: a live text view of a KBTP target's driver and target counters.

Sources:

* ``--stats-file PATH``: the JSON ``kbtp-sim serve --stats-file`` rewrites every ~1 s
  (:mod:`sim.serve_stats`): counters, driver figures, CM links and board-time records;
* ``--port DEV``: a board over the UART host link (as ``kbtp driver``): the target's counters
  (MAC, parser, ICRC, transport) and the engine's and driver's figures read through
  :class:`host.driver.KbtpDriver`; this process's driver holds no sessions, so the per-QP table
  shows only what the target's counters say.

One screen: operations by status (engine fast path and driver slow path), frames, ICRC and
PSN errors, retransmissions, host-queue and free-block ring occupancy, the QPs, and the
board time of the latest requests. It refreshes every ``--interval`` seconds (plain ANSI:
clear screen + home) until interrupted; ``--once`` prints one frame without escapes.
"""

import json
import statistics
import sys
import time

__all__ = ["render", "read_source", "board_snapshot", "run_top"]

_CLEAR = "\x1b[2J\x1b[H"


def _ops_by_status(driver):
    """{op: {status: count}} from the driver's ``engine`` and ``slow_path`` dicts."""
    out = {}
    for part in ("engine", "slow_path"):
        for key, n in (driver or {}).get(part, {}).items():
            op, _, st = key.partition("/")
            d = out.setdefault(op, {})
            d[st] = d.get(st, 0) + n
    return out


def _ring(v):
    """Ring occupancy as a signed 32-bit count (an empty partition reads as -1: unused)."""
    return v - (1 << 32) if v >= 1 << 31 else v


def render(stats, source="", now=None):
    """One screen of ``kbtp top`` (a string) from a stats dict (:mod:`sim.serve_stats`'s
    layout; :func:`board_snapshot` gives the same keys for a board)."""
    now = time.time() if now is None else now
    c = stats.get("counters", {})
    drv = stats.get("driver") or {}
    lines = []
    age = now - stats["written"] if stats.get("written") else None
    state = "final" if stats.get("final") else "live"
    head = f"kbtp top - {source} ({state}"
    head += f", written {age:.1f} s ago)" if age is not None else ")"
    cyc = stats.get("cycle")
    if cyc is not None:
        ns = stats.get("clocks", {}).get("ns_per_gmii_cycle", 8.0)
        head += f"  board time {cyc * ns / 1e6:.3f} ms ({cyc} GMII cycles)"
    lines.append(head)

    ops = _ops_by_status(drv)
    statuses = sorted({s for d in ops.values() for s in d}, key=lambda s: (s != "OK", s))
    lines.append("")
    lines.append("operations   " + "".join(f"{s:>18}" for s in statuses))
    for op in sorted(ops):
        lines.append(f"  {op:<11}" + "".join(f"{ops[op].get(s, 0):>18}" for s in statuses))
    if not ops:
        lines.append("  (none yet)")

    f = stats.get("frames", {})
    lines.append("")
    lines.append(f"frames       in {c.get('mac.rx_frames_ok', 0)}  out {c.get('mac.tx_frames', 0)}"
                 f"  roce in {c.get('ethrx.cnt_roce', 0)}  arp in {c.get('ethrx.cnt_arp', 0)}"
                 f"  raw/CM in {c.get('rawq.cnt_rx_frames', 0)} out "
                 f"{c.get('rawq.cnt_tx_frames', 0)}"
                 + (f"  link: rx {f.get('rx', 0)} tx {f.get('tx', 0)} dropped "
                    f"{f.get('dropped', 0)}" if f else ""))
    lines.append(f"errors       ICRC bad {c.get('icrc.cnt_bad', 0)}  FCS "
                 f"{c.get('mac.rx_fcs_errors', 0)}  PSN: seq NAKs sent "
                 f"{c.get('resp.cnt_seq_naks', 0)}, ahead {c.get('resp.cnt_psn_ahead', 0)}, "
                 f"duplicates {c.get('resp.cnt_duplicates', 0)}, seq NAKs got "
                 f"{c.get('req.cnt_seq_naks', 0)}  RNR NAKs {c.get('resp.cnt_rnr_naks', 0)}"
                 f"/{c.get('req.cnt_rnr_naks', 0)} (refused at backlog "
                 f"{c.get('resp.cnt_rnr_backlog', 0)}, MAC overflows "
                 f"{c.get('mac.rx_overflows', 0)})  rkey {c.get('resp.cnt_rkey_errors', 0)}")
    lines.append(f"retransmit   {c.get('req.cnt_retransmits', 0)} (timeouts "
                 f"{c.get('req.cnt_timeouts', 0)})  QP errors {c.get('req.qp_error', 0)}")
    fb = drv.get("free_blocks", {})
    lines.append(f"rings        host queue {drv.get('hostq_count', 0)}  engine ring "
                 f"{drv.get('ring_occupancy', 0)}  free blocks: "
                 + (", ".join(f"{k} {_ring(v)}" for k, v in fb.items()) or "-")
                 + f"  stall cycles {drv.get('stall_cycles', 0)}  last latency "
                 f"{drv.get('last_latency', 0)} core cycles")

    lines.append("")
    lines.append("qp  qpn       peer qpn  peer ip          state       initiator  usage/quota")
    quota = {v.get("qp"): (k, v) for k, v in drv.get("quota", {}).items()}
    qps = stats.get("qps", {})
    for qp in sorted(qps, key=int):
        q = qps[qp]
        ip = q.get("peer_ip")
        ip = ".".join(str((ip >> s) & 255) for s in (24, 16, 8, 0)) if isinstance(ip, int) \
            else str(ip)
        iid, qv = quota.get(int(qp), ("-", {}))
        lines.append(f"{qp:<3} {q['qpn']:#08x}  {q['peer_qpn']:#08x}  {ip:<16} "
                     f"{q['state']:<11} {iid:<10} {qv.get('usage', '-')}/{qv.get('quota', '-')}")
    retained = [(k, v) for k, v in drv.get("quota", {}).items() if v.get("qp") is None]
    for k, v in retained:
        lines.append(f"-   (retained session of initiator {k}: usage {v['usage']}/"
                     f"{v['quota']})")
    if not qps and not retained:
        lines.append("(no connection)")

    recs = stats.get("records", [])
    done = [r for r in recs if r.get("ns_completion") is not None]
    if recs:
        lines.append("")
        lines.append(f"requests     {stats.get('requests_seen', len(recs))} seen, "
                     f"{len(done)} of the last {len(recs)} completed; board time request in -> "
                     f"COMPLETION out (8 ns GMII cycles):")
        by_op = {}
        for r in done:
            by_op.setdefault(r["opcode"], []).append(r["ns_completion"] / 1e3)
        for op in sorted(by_op):
            v = by_op[op]
            lines.append(f"  {op:<11} n {len(v):<6} median {statistics.median(v):9.2f} us  "
                         f"min {min(v):9.2f} us  max {max(v):9.2f} us")
    return "\n".join(lines)


def read_source(path):
    """The stats dict of a ``--stats-file`` (None while it does not exist)."""
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


async def board_snapshot(port, driver):
    """A stats-like dict read from a board: ``counters`` (target), ``driver``
    (:meth:`KbtpDriver.counters`), ``written``."""
    from hw.iface import REG_TOP, REG_TRANSPORT
    from hw.target.regbank import TOP_COUNTER_BASE
    from hw.target.target import (REQ_COUNTER_BASE, REQ_COUNTERS, REQ_STATUS, RESP_COUNTERS,
                               TOP_COUNTERS)
    out = {}
    for k, (blk, p) in enumerate(TOP_COUNTERS):
        out[f"{blk}.{p}"] = await port.rreg(REG_TOP + TOP_COUNTER_BASE + 4 * k)
    for k, name in enumerate(RESP_COUNTERS):
        out[f"resp.{name}"] = await port.rreg(REG_TRANSPORT + 4 * k)
    for k, name in enumerate(REQ_COUNTERS + REQ_STATUS):
        out[f"req.{name}"] = await port.rreg(REQ_COUNTER_BASE + 4 * k)
    drv = await driver.counters()
    drv = {k: ({"/".join(map(str, kk)) if isinstance(kk, tuple) else str(kk): vv
                for kk, vv in v.items()} if isinstance(v, dict) else v)
           for k, v in drv.items()}
    return {"counters": out, "driver": drv, "written": time.time()}


def run_top(snapshot, source, *, once=False, interval=1.0, out=None, frames=None):
    """Print frames of ``snapshot()`` (a callable returning a stats dict or None) until
    interrupted (or ``frames`` of them); ``once``: one frame, no escapes."""
    out = sys.stdout if out is None else out
    n = 0
    try:
        while True:
            s = snapshot()
            text = render(s, source) if s is not None else f"kbtp top - {source}: no data yet"
            out.write(text + "\n" if once else _CLEAR + text + "\n")
            out.flush()
            n += 1
            if once or (frames is not None and n >= frames):
                return 0
            time.sleep(interval)
    except KeyboardInterrupt:
        return 0

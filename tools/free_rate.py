# Ref: issue 23 (frees at the rate of allocations: the target to beat is the 4 KiB ALLOC_STORE
#      rate at 1 Gb/s, 28,000/s); host/driver.py (poll_all, FREE bursts); host/udplink.py;
#      sim/vllink.py (the UDP host link over the simulated wire); sim/system.py (VlSystemBench,
#      block_census); boards/cores.py KbtpCore (the shipped core, udp_link=True).
"""``make free-rate``: how fast the host driver frees blocks over the UDP host link, simulated.

The shipped core (:data:`sim.vltarget.SHIPPED`: the ECPIX-5 bitstream's KbtpCore, UDP host link
in) under Verilator; the host driver (:class:`host.driver.KbtpDriver`, as it is) runs over
:class:`host.udplink.UdpLink` on :class:`sim.vllink.VlUdpTransport`: every exchange is a UDP
datagram on the target's GMII and its response datagram back. Four initiators
(:class:`roce.rc.RoceEndpoint` RC QPs, the system benches' peer) send KBTP requests as SENDs.
Configuration: 4 KiB blocks, ``--blocks`` of them (quota ``blocks / 4`` per initiator), 16
request credits and so 16 receive buffers of 512 octets per QP (:func:`sim.system.model_config`;
with the default 20 blocks the plan ends at 121856 of the core's 131072 octets, 22 is the most
blocks that fit), the driver with ``max_messages`` 32.

Time: the host's own processing takes **zero simulated time**; the wire and the target run at
the board's clocks (GMII 125 MHz, core 25 MHz). ``--turnaround-ns`` adds a *modelled* host
turnaround per link exchange (default runs: 0 and 20,000 ns, a plausible Linux UDP round trip
through the socket API). Figures in GMII cycles (8 ns) and at the board's real clocks.

Runs
----
burst
    Each round: every initiator ALLOC_STOREs (4 KiB by RDMA READ, engine fast path) as many
    blocks as its quota while the driver does not poll, then FREEs them in waves of one FREE
    per initiator. The engine forwards one message per QP until the host has finished it
    (per-connection order) and is serial, so a QP's second message in the notify stream holds
    up every QP behind it: one FREE per QP (4) is the most the host can find pending at once.
    Once a wave's 4 are in the notify queue (HOSTQ_COUNT) the driver runs :meth:`poll_all`
    until it has handled them. Rate = FREEs / simulated time from the first ``poll_all`` to
    the return of the one that handled the wave's last FREE (its replies posted), summed over
    the waves; also to the last COMPLETION at the initiators.
cycle
    Every initiator keeps ``--inflight`` handles cycling ALLOC_STORE -> COMPLETION -> FREE ->
    COMPLETION -> ALLOC_STORE ... (4 KiB by READ; the ring is never empty: at most
    ``4 * inflight`` of the ``--blocks`` blocks are out), the driver polling (``poll_all``)
    whenever the simulation steps, as ``kbtp-sim serve`` does. Rate = pairs (one ALLOC_STORE
    and one FREE each) per second in steady state (after ``--warmup`` pairs).

Per FREE, from the link's stats over the measured span: exchanges (request datagrams), UDP
payload octets both ways, Ethernet wire octets (headers, FCS, preamble, gap), words on the
target's host bus (the ``count`` of every request frame), and the host-link frame octets alone
(no datagram header): **the UART figure** is those frame octets at 115,200 baud, 10 bits per
octet, request and response serialized (the UART link is lock-step), computed from the same
run (not simulated: the UART's own turnaround is not counted).

Checks: every COMPLETION OK, the block census of target memory (:func:`sim.system.block_census`:
no block lost or duplicated, all back in the ring at the end), no link timeouts.

CLI: ``python -m tools.free_rate [--rounds 4] [--pairs 120] [--turnaround-ns 0,20000]
[--json build/free_rate.json]``.
"""

import argparse
import json
import sys
import time
from pathlib import Path

from host import codec
from hw.headers import Opcode, Status
from hw.iface import REG_KBTP
from hw.kbtp.engine import reg as ENG
from sim.system import block_census, model_config, run_sync
from sim.workload import build

__all__ = ["TARGET_RATE", "UART_BAUD", "run", "burst_run", "cycle_run", "main"]

#: The rate to beat: 4 KiB ALLOC_STOREs per second at 1 Gb/s (issue 23).
TARGET_RATE = 28_000
UART_BAUD = 115_200
BLOCK = 4096
#: KbtpDriver options (its receive buffers per QP are the configuration's request credits).
DRIVER_KW = {"max_messages": 32}
STAG0 = 0x5100


class Rig:
    """A brought-up :class:`sim.vllink.VlUdpSystemBench` on the shipped core with one 4 KiB
    source buffer per initiator, and per-request completion tracking."""

    def __init__(self, vt, *, blocks, turnaround_ns, seed=1):
        from sim.vllink import VlUdpSystemBench
        n_init = 4
        cfg = model_config(block_size=BLOCK, num_blocks=blocks,
                           quota_per_initiator=blocks // n_init, handles_per_initiator=16,
                           ticket_timeout_ms=10_000)
        self.b = b = VlUdpSystemBench(vt, n_init=n_init, seed=seed, cfg=cfg,
                                      driver_kw=DRIVER_KW, host_turnaround_ns=turnaround_ns)
        run_sync(b.bring_up(features=[0] * n_init))
        self.vt = vt
        self.rid = 0
        self.pending = {}           # request id -> (q, op, handle)
        self.done = []              # (cycle, q, op, handle, status)
        self.seen = [0] * n_init
        self.stag = []
        for q in range(n_init):
            stag = STAG0 + q
            b.pmem.register(stag, bytes((q * 7 + k) & 0xFF for k in range(BLOCK)), access="r")
            self.stag.append(stag)
        s = [b.model.session_of(c) for c in b.conns]
        self.handles = [list(range(x.handle_base, x.handle_base + x.handle_count)) for x in s]
        self.quota = cfg.quota_per_initiator

    def send(self, q, op, h):
        self.rid += 1
        if op is Opcode.ALLOC_STORE:
            raw = build(op, rid=self.rid, handle=h, stag=self.stag[q], to=0, length=BLOCK)
        else:
            raw = codec.encode(codec.Free(request_id=self.rid, handle=h, generation=0))
            self.b.slow_sent += 1
        self.pending[self.rid] = (q, op, h)
        self.b.qps[q].send(raw)

    def collect(self):
        """Completions that arrived since the last call: list of (q, op, handle, status)."""
        out = []
        for q, ev in self.b.events.items():
            for e in ev[self.seen[q]:]:
                assert e[0] == "SEND", e
                m = codec.decode(e[1])
                q2, op, h = self.pending.pop(m.request_id)
                assert q2 == q
                out.append((q, op, h, m.status))
                self.done.append((self.vt.cycle, q, op, h, m.status))
            self.seen[q] = len(ev)
        return out

    def hostq(self):
        return self.vt.access(0, REG_KBTP + ENG["HOSTQ_COUNT"], 0, 0)[0]

    def census(self):
        b = self.b
        c = block_census(b.model, self.vt.mem_read)
        c.pop("where")
        return c


def _link_snap(b):
    return dict(b.udplink.stats, **{f"tr_{k}": v for k, v in b.transport.stats.items()})


def _per(d0, d1, n):
    keys = ("exchanges", "octets_out", "octets_in", "bus_words", "frame_octets_out",
            "frame_octets_in", "tr_wire_octets_out", "tr_wire_octets_in")
    return {k: (d1[k] - d0[k]) / n for k in keys}


def _figures(n, cycles, d0, d1, p):
    """Rate and per-FREE link figures of ``n`` FREEs in ``cycles`` GMII cycles."""
    per = _per(d0, d1, n)
    sec = cycles / p["mac_hz"]
    uart_s = (per["frame_octets_out"] + per["frame_octets_in"]) * 10 / UART_BAUD
    return {"frees": n, "gmii_cycles": cycles, "core_cycles": cycles / p["core_div"],
            "ns_per_free": sec / n * 1e9, "frees_per_s": n / sec if sec else None,
            "per_free": per, "uart_s_per_free": uart_s, "uart_frees_per_s": 1 / uart_s,
            "retransmits": d1["retransmits"] - d0["retransmits"],
            "timeouts": d1["timeouts"] - d0["timeouts"]}


def burst_run(r, rounds, log=print):
    """The ``burst`` run (see the module docstring) on a :class:`Rig`."""
    b, vt, p = r.b, r.vt, r.vt.params
    spans, n_total, c_total, c_compl = [], 0, 0, 0
    acc = None                  # the link stats summed over the measured spans
    for k in range(rounds):
        b.host_on = False
        hs = [r.handles[q][:r.quota] for q in range(b.n_init)]
        for q in range(b.n_init):
            for h in hs[q]:
                r.send(q, Opcode.ALLOC_STORE, h)
        want = b.n_init * r.quota
        got = []
        run_sync(b.run_until(lambda: (got.extend(r.collect()) or len(got) >= want),
                             20_000_000, "ALLOC_STOREs"))
        assert all(s == Status.OK.value for *_, s in got), got
        # The engine forwards one message per QP until the host has finished it (per-connection
        # order) and is serial: a QP's second message in the notify stream holds up every QP
        # behind it. So the FREEs go in waves, one per initiator (4 pending at once, the most
        # the engine lets the host see), and the host's time is measured per wave.
        got = []
        for k_ in range(r.quota):
            q0 = r.hostq()
            for q in range(b.n_init):
                r.send(q, Opcode.FREE, hs[q][k_])
            run_sync(b.run_until(lambda: r.hostq() - q0 >= b.n_init, 20_000_000,
                                 "FREEs queued"))
            d0, c0 = _link_snap(b), vt.cycle
            handled, passes = 0, []
            while handled < b.n_init:
                hs_ = run_sync(b.driver.poll_all(now_ms=vt.cycle * 8e-6))
                b.handled += hs_
                n = sum(1 for h in hs_ if h.op == "FREE")
                handled += n
                passes.append(n)
                assert vt.cycle - c0 < 50_000_000, "FREEs not handled"
            c1, d1 = vt.cycle, _link_snap(b)
            n0 = len(got)
            run_sync(b.run_until(lambda: (got.extend(r.collect()) or len(got) >= n0 + b.n_init),
                                 20_000_000, "FREE COMPLETIONs"))
            c2 = max(c for c, *_ in r.done[-b.n_init:])
            spans.append(dict(_figures(b.n_init, c1 - c0, d0, d1, p), frees_per_pass=passes,
                              to_last_completion=c2 - c0))
            log(f"  round {k} wave {k_}: {b.n_init} FREEs handled in {c1 - c0:,} GMII cycles "
                f"({(c1 - c0) * 8 / 1e3:.1f} us), last COMPLETION at "
                f"+{(c2 - c0) * 8 / 1e3:.1f} us; {d1['exchanges'] - d0['exchanges']} exchanges; "
                f"FREEs per poll_all pass {passes}")
            n_total += b.n_init
            c_total += c1 - c0
            c_compl += c2 - c0
            delta = {key: d1[key] - d0[key] for key in d1}
            acc = delta if acc is None else {key: acc[key] + delta[key] for key in acc}
        assert all(s == Status.OK.value for *_, s in got), got
    fig = _figures(n_total, c_total, {key: 0 for key in acc}, acc, p)
    fig["to_last_completion_frees_per_s"] = n_total / (c_compl / p["mac_hz"])
    fig["rounds"] = spans
    return fig


def cycle_run(r, pairs, warmup, inflight, log=print):
    """The ``cycle`` run (see the module docstring) on a :class:`Rig`."""
    b, vt, p = r.b, r.vt, r.vt.params
    b.host_on = True
    n_init = b.n_init
    assert inflight <= r.quota - 1, "keep the ring non-empty: inflight < quota"
    for q in range(n_init):
        for h in r.handles[q][r.quota:r.quota + inflight]:
            r.send(q, Opcode.ALLOC_STORE, h)
    pairs_done, marks = 0, {}
    bad = []

    def step():
        nonlocal pairs_done
        for q, op, h, s in r.collect():
            if s != Status.OK.value:
                bad.append((q, op, h, s))
            if op is Opcode.ALLOC_STORE:
                r.send(q, Opcode.FREE, h)
            else:
                pairs_done += 1
                if pairs_done in (warmup, warmup + pairs):
                    marks[pairs_done] = (vt.cycle, _link_snap(b))
                if pairs_done < warmup + pairs + n_init * inflight:
                    r.send(q, Opcode.ALLOC_STORE, h)
        return pairs_done >= warmup + pairs
    run_sync(b.run_until(step, 200_000_000, "ALLOC_STORE/FREE pairs"))
    assert not bad, bad[:8]
    (c0, d0), (c1, d1) = marks[warmup], marks[warmup + pairs]
    fig = _figures(pairs, c1 - c0, d0, d1, p)
    fig["pairs_per_s"] = fig.pop("frees_per_s")
    fig["inflight_per_initiator"] = inflight
    # let the rest finish, then the census
    run_sync(b.run_until(lambda: (step() or True) and not r.pending, 50_000_000, "drain"))
    log(f"  cycle: {pairs} pairs in {c1 - c0:,} GMII cycles")
    return fig


def run(*, turnaround_ns=0.0, rounds=4, pairs=120, warmup=16, inflight=2, blocks=20, seed=1,
        log=print):
    """Both runs on one fresh shipped core; the figures dict."""
    from sim.vltarget import SHIPPED, VlTarget
    t0 = time.monotonic()
    with VlTarget(SHIPPED, log=log) as vt:
        p = vt.params
        assert p.get("udp_link"), "the shipped core has no UDP host link"
        r = Rig(vt, blocks=blocks, turnaround_ns=turnaround_ns, seed=seed)
        out = {"turnaround_ns": turnaround_ns, "blocks": blocks, "block_size": BLOCK,
               "params": {k: p[k] for k in ("board", "width", "core_div", "mac_hz", "core_hz")}}
        log(f"free rate, host turnaround {turnaround_ns:,.0f} ns (modelled): burst")
        out["burst"] = burst_run(r, rounds, log)
        c = r.census()
        assert c["lost"] == 0 and c["duplicated"] == 0 and c["in_rings"] == blocks, c
        log("free rate: cycle")
        out["cycle"] = cycle_run(r, pairs, warmup, inflight, log)
        c = r.census()
        assert c["lost"] == 0 and c["duplicated"] == 0 and c["in_rings"] == blocks, c
        out["census"] = c
        out["link"] = _link_snap(r.b)
        out["udplink_counters"] = r.b.transport.counters()
        assert out["link"]["timeouts"] == 0
        out["wall_s"] = time.monotonic() - t0
    return out


def format_result(res):
    lines = []
    for o in res["runs"]:
        t = o["turnaround_ns"]
        lab = "host 0 ns (zero-time host)" if not t else f"host turnaround {t / 1e3:g} us " \
                                                          f"per exchange (MODELLED)"
        lines.append(f"== {lab}; {o['blocks']} blocks of {o['block_size']} octets, shipped "
                     f"core (GMII 125 MHz, core {o['params']['core_hz'] / 1e6:.2f} MHz)")
        for kind, rate_key, what in (("burst", "frees_per_s", "FREE/s"),
                                     ("cycle", "pairs_per_s", "ALLOC_STORE+FREE pairs/s")):
            f = o[kind]
            pf = f["per_free"]
            lines.append(
                f"  {kind:5s}: {f['frees']} FREEs in {f['gmii_cycles']:,} GMII cycles "
                f"({f['core_cycles']:,.0f} core cycles) = {f['ns_per_free']:,.0f} ns/FREE = "
                f"{f[rate_key]:,.0f} {what} (target {TARGET_RATE:,}: "
                f"{f[rate_key] / TARGET_RATE:.2f}x)")
            if kind == "burst":
                lines.append(f"         to the last COMPLETION at the initiators: "
                             f"{f['to_last_completion_frees_per_s']:,.0f} FREE/s")
            lines.append(
                f"         per FREE: {pf['exchanges']:.2f} exchanges, UDP payload "
                f"{pf['octets_out']:.0f} out / {pf['octets_in']:.0f} in octets, wire "
                f"{pf['tr_wire_octets_out']:.0f} / {pf['tr_wire_octets_in']:.0f} octets, "
                f"{pf['bus_words']:.1f} bus words; frames alone "
                f"{pf['frame_octets_out']:.0f} / {pf['frame_octets_in']:.0f} octets")
            lines.append(
                f"         UART (computed from these frame octets, 115,200 baud, 10 bit/octet): "
                f"{f['uart_s_per_free'] * 1e3:.2f} ms/FREE = {f['uart_frees_per_s']:.1f} FREE/s")
        lines.append(f"  census {o['census']}; link retransmits {o['link']['retransmits']}, "
                     f"timeouts {o['link']['timeouts']}; wall {o['wall_s']:.0f} s")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m tools.free_rate", description=__doc__.split(
        "\n")[0])
    ap.add_argument("--rounds", type=int, default=4, help="burst rounds")
    ap.add_argument("--pairs", type=int, default=120, help="measured ALLOC_STORE+FREE pairs")
    ap.add_argument("--warmup", type=int, default=16)
    ap.add_argument("--inflight", type=int, default=2, help="cycling handles per initiator")
    ap.add_argument("--blocks", type=int, default=20)
    ap.add_argument("--turnaround-ns", default="0,20000",
                    help="comma-separated modelled host turnarounds per exchange")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", help="write the figures here")
    a = ap.parse_args(argv)
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    runs = [run(turnaround_ns=float(t), rounds=a.rounds, pairs=a.pairs, warmup=a.warmup,
                inflight=a.inflight, blocks=a.blocks, seed=a.seed, log=log)
            for t in a.turnaround_ns.split(",")]
    res = {"target_rate": TARGET_RATE, "runs": runs}
    print(format_result(res))
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(res, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

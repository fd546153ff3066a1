# Ref: roce-layouts.md §6.5 (NAK 0x61/0x62/0x63 -> WR completes with the error, QP to Error),
#      §6.7 (retry_cnt / rnr_retry exhausted -> "retry exceeded", QP to Error); iface.py WcStatus.
"""RC requester error paths: remote NAKs, retry and RNR exhaustion, flush, error event, and the
rate of a 4 KiB WRITE. Bench and peer from tests/hw/rdma/test_requester.py."""

import random
import re

import pytest

from hw.iface import REG_QP, QpState, WcStatus, WrOp, qp_index_of
from hw.rdma.qp import QP_STRIDE
from hw.rdma.requester import ack_timeout_cycles
from tests.hw.rdma.test_requester import (CLK_HZ, SCALE, SQ_PSN, Bench, check_outcome, mixed_wrs,
                                          wr, VA0)
from tests.hw.rdma.responder_bench import bus_access, write_qp

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

TO = 10


def some_wrs():
    """QP 0: OK, failing (bad R_Key WRITE), then three more; QP 1 interleaved, all fine."""
    return [wr(0, 10, WrOp.SEND, 50, 0x100), wr(1, 20, WrOp.WRITE, 300, 0x200),
            wr(0, 11, WrOp.WRITE, 600, 0x300, rkey=0xDEAD), wr(1, 21, WrOp.READ, 40, 0xA000),
            wr(0, 12, WrOp.SEND, 10, 0x400), wr(0, 13, WrOp.READ, 20, 0x5000),
            wr(1, 22, WrOp.SEND_INV, 9, 0x500, inv=0x77), wr(0, 14, WrOp.WRITE_IMM, 3, 0x10)]


@pytest.mark.parametrize("width", [8, 64])
def test_remote_access_nak_error_and_flush(width):
    b = Bench(width, seed=11, timeout=TO)
    wrs = some_wrs()
    b.run(wrs)
    st = {(q, w): s for q, w, s in b.wcs}
    assert st[(0, 10)] == WcStatus.OK
    assert st[(0, 11)] == WcStatus.REMOTE_ACCESS
    assert [st[(0, w)] for w in (12, 13, 14)] == [WcStatus.FLUSHED] * 3
    assert all(st[(1, w)] == WcStatus.OK for w in (20, 21, 22))
    check_outcome(b, wrs, b.img, statuses=True)
    assert [q for q, _ in b.events] == [0]
    assert b.qp_error == 0b01
    # Nothing of QP 0 is sent after the NAK arrived (flushed WRs never reach the wire).
    assert not any(qp == 0 and op in (0x0C, 0x0B) for qp, op, *_ in b.sent)


@pytest.mark.parametrize("syndrome,status", [(0x61, WcStatus.REMOTE_INVALID),
                                             (0x63, WcStatus.REMOTE_OP)])
def test_other_naks(syndrome, status):
    """NAK invalid request / remote operational error on the 2nd WR's last packet."""
    b = Bench(64, seed=12, timeout=TO)
    peer = b.peers[0]
    orig = peer.execute

    def execute(op, psn, bth, ext, payload):
        if op == 0x02:                       # SEND Last
            peer.error = True
            return [peer.frame(0x11, psn, syndrome=syndrome)]
        return orig(op, psn, bth, ext, payload)
    peer.execute = execute
    wrs = [wr(0, 1, WrOp.WRITE, 8, 0x10), wr(0, 2, WrOp.SEND, 600, 0x100),
           wr(0, 3, WrOp.SEND, 6, 0x100)]
    b.run(wrs)
    assert [(w, s) for _, w, s in b.wcs] == [(1, WcStatus.OK), (2, status), (3, WcStatus.FLUSHED)]
    assert [q for q, _ in b.events] == [0]


@pytest.mark.parametrize("width", [64])
def test_retry_exhausted(width):
    """A peer that never answers: 1 + retry_cnt transmissions of the oldest PSN, each a timeout
    apart, then RETRY_EXCEEDED for that WR, FLUSHED for the rest, QP error event."""
    b = Bench(width, seed=13, timeout=TO, retry_cnt=2)
    b.peers[0].black_hole = True
    wrs = [wr(0, 1, WrOp.SEND, 20, 0x10), wr(0, 2, WrOp.WRITE, 20, 0x10),
           wr(1, 3, WrOp.SEND, 20, 0x30)]
    b.run(wrs, max_cycles=20_000)
    st = {(q, w): s for q, w, s in b.wcs}
    assert st == {(0, 1): WcStatus.RETRY_EXCEEDED, (0, 2): WcStatus.FLUSHED,
                  (1, 3): WcStatus.OK}
    first = [t for qp, op, psn, t, _ in b.sent if qp == 0 and psn == SQ_PSN[0]]
    assert len(first) == 3
    to = ack_timeout_cycles(TO, CLK_HZ, SCALE)
    for a, c in zip(first, first[1:]):
        assert to <= c - a <= to + 300
    assert len(b.events) == 1 and b.events[0][0] == 0
    assert b.events[0][1] - first[-1] >= to - 50      # packet end vs. timer start
    assert b.cnt_timeouts == 3 and b.qp_error == 0b01


def test_rnr_exhausted():
    b = Bench(8, seed=14, timeout=TO, rnr_retry=1)
    b.peers[0].rnr = 5
    wrs = [wr(0, 1, WrOp.SEND, 20, 0x10), wr(0, 2, WrOp.SEND, 20, 0x10)]
    b.run(wrs)
    assert [(w, s) for _, w, s in b.wcs] == [(1, WcStatus.RNR_EXCEEDED), (2, WcStatus.FLUSHED)]
    assert b.cnt_rnr_naks == 2


def test_qp_not_ready_flushes():
    """QP 1 left in RESET: its WRs complete FLUSHED at once and nothing is sent for it."""
    b = Bench(8, seed=15, timeout=TO)
    cfg = b.cfg

    async def cfg_reset1(ctx):
        await cfg(ctx)
        await write_qp(ctx, b.top.qpt.bus, 1, **{**b.qp_values(1), "state": QpState.RESET.value})
    b.cfg = cfg_reset1
    wrs = [wr(1, 1, WrOp.SEND, 20, 0x10), wr(0, 2, WrOp.SEND, 20, 0x10)]
    b.run(wrs)
    assert sorted(b.wcs) == [(0, 2, WcStatus.OK), (1, 1, WcStatus.FLUSHED)]
    assert all(qp == 0 for qp, *_ in b.sent)


@pytest.mark.parametrize("width,pmtu", [(8, 3), (64, 3)])
def test_write_4k_rate(width, pmtu):
    """4 KiB WRITE: cycles per payload octet on the RoceTxBuilder output (BTH .. pad)."""
    b = Bench(width, pmtu_code=pmtu, seed=16, timeout=0)
    wrs = [wr(0, 1, WrOp.WRITE, 4096, 0x1000, va=VA0)]
    b.run(wrs)
    check_outcome(b, wrs, b.img)
    end = b.sent[-1][3]
    wire = sum(len(p) + 28 for *_, p in b.sent)   # + BTH and RETH (upper bound) per packet
    lanes = width // 8
    print(f"\n4 KiB WRITE, width {width}, PMTU {128 << pmtu}: {len(b.sent)} packets, "
          f"{end} cycles from the WR, {end / 4096:.3f} cycles/octet "
          f"(ideal {wire / lanes / 4096:.3f} incl. headers), WC at cycle {b.cycles}")
    if width == 8:
        assert end <= 1.05 * wire / lanes + 60         # line rate at the narrow width
    else:
        # The DmaReader alone does 4 KiB in 516 cycles at 64 bits (tests/hw/rdma/test_txpath.py);
        # behind MemArbiter reads run at one word per two cycles (its route FIFO latency).
        assert end <= 2.1 * wire / lanes + 60


def _monitor(top, ev):
    """Background testbench: (QP, cycle) of every packet entering the packetizer's register
    (``ev["enter"]``) and leaving it (``ev["take"]``), of every response header the requester's
    intake accepts (``ev["rsp"]``); the cycles of the host's loads of ERROR into QP 0
    (``ev["load"]``)."""
    async def monitor(ctx):
        cycle, was_valid, was_taken = 0, False, False
        tx, rh = top.req.tx, top.req.rsp_hdr
        while True:
            _, _, v, r, q, lv, lq, st, hv, hr, hq = await ctx.tick().sample(
                tx.valid, tx.ready, tx.p.qp, top.qpt.load_valid, top.qpt.load_qp,
                top.qpt.load_row.state, rh.valid, rh.ready, rh.p.bth.dest_qp)
            if v and (not was_valid or was_taken):
                ev["enter"].append((q, cycle))
            if v and r:
                ev["take"].append((q, cycle))
            was_valid, was_taken = v, v and r
            if lv and lq == 0 and st == QpState.ERROR:
                ev["load"].append(cycle)
            if hv and hr:
                ev["rsp"].append((qp_index_of(hq), cycle))
            cycle += 1
    return monitor


@pytest.mark.parametrize("trigger,delay", [(t, d) for t in ("take", "rsp") for d in range(4)])
def test_host_error_load_flushes(trigger, delay):
    """The host moves QP 0 to ERROR with work outstanding, its load event ``delay`` + 3 cycles
    after the TX path took QP 0's 4th packet from the packetizer (QP 0's next packet step was
    selected in the cycle after the take: the load lands on its act, or on the work-request
    and packet steps after it), or after the requester's intake accepted QP 0's 2nd response
    (taken in the next cycle: the load lands on its ACK_LOOP and ACT cycles). Every WR of QP 0
    completes once, in order: OK up to some point, FLUSHED from there on (what the load found
    queued and what was posted after it), and what the peer received of QP 0 starts with the
    OK SENDs; no packet of QP 0 enters the packetizer after the load; no error event (the host
    knows); QP 1 completes everything."""
    b = Bench(64, seed=30 + delay, timeout=TO, latency=40)
    top = b.top
    sends = [wr(0, 100 + k, WrOp.SEND, 2 * b.pmtu + 7, 0x100 * k) for k in range(10)]
    writes = [wr(1, 200 + k, WrOp.WRITE, 200, 0x2000 + 0x100 * k, va=VA0 + 0x400 * k)
              for k in range(2)]
    wrs = [writes[0], sends[0], writes[1], *sends[1:]]
    ev = {"enter": [], "take": [], "rsp": [], "load": []}

    async def host(ctx):
        while sum(q == 0 for q, _ in ev[trigger]) < (4 if trigger == "take" else 2):
            await ctx.tick()
        for _ in range(delay):
            await ctx.tick()
        _, err = await bus_access(ctx, top.qpt.bus, REG_QP + QP_STRIDE * 0,
                                  QpState.ERROR.value)
        assert not err

    b.run(wrs, extra=(_monitor(top, ev), host), max_cycles=60_000)
    assert len(ev["load"]) == 1
    load = ev["load"][0]
    q0 = [(w, s) for q, w, s in b.wcs if q == 0]
    assert [w for w, _ in q0] == [x["wr_id"] for x in sends]
    codes = "".join("O" if s == WcStatus.OK else "F" if s == WcStatus.FLUSHED else "?"
                    for _, s in q0)
    assert re.fullmatch("O*F+", codes), codes
    ok = [x for x, (_, s) in zip(sends, q0) if s == WcStatus.OK]
    got = b.peers[0].messages
    assert got[:len(ok)] == [("send", b.img[x["laddr"]:x["laddr"] + x["length"]], None, None)
                             for x in ok]
    assert [c for q, c in ev["enter"] if q == 0 and c > load] == [], ev
    assert b.events == [] and b.qp_error == 0b01
    assert [(w, s) for q, w, s in b.wcs if q == 1] == [(x["wr_id"], WcStatus.OK) for x in writes]
    remote = bytearray(random.Random(1).getrandbits(8) for _ in range(0x4000))
    for x in writes:
        remote[x["va"] - VA0:x["va"] - VA0 + x["length"]] = \
            b.img[x["laddr"]:x["laddr"] + x["length"]]
    assert bytes(b.peers[1].mem) == bytes(remote)


@pytest.mark.parametrize("width", [8, 64])
def test_host_loads_of_another_qp_lose_nothing(width):
    """While QP 0 runs mixed work under loss, the host rewrites QP 1's state (RESET, RTS, ...)
    back to back: each load rewrites QP 1's record through the write port QP 0's steps use, and
    the requester holds its steps while it does; QP 0 loses no update (its completions, both
    memories, and its first transmissions in PSN order, as without the loads)."""
    b = Bench(width, seed=40 + width, timeout=TO)
    b.peers[0].drop_req = lambda n, bth: n % 7 == 3
    wrs = [x for x in mixed_wrs(random.Random(width), 1, 12, b.pmtu)]
    loads, done = [], []

    async def host(ctx):
        await ctx.tick().until(b.top.req.tx.valid)
        rng = random.Random(width)
        k = 0
        while not done:
            for _ in range(rng.randrange(3)):
                await ctx.tick()
            st = (QpState.RESET, QpState.RTS)[k % 2]
            _, err = await bus_access(ctx, b.top.qpt.bus, REG_QP + QP_STRIDE * 1, st.value)
            assert not err
            loads.append(b.now[0])
            k += 1

    async def stop(ctx):
        while len(b.wcs) < len(wrs):
            await ctx.tick()
        done.append(1)

    b.run(wrs, extra=(host, stop))
    assert len(loads) > 100
    check_outcome(b, wrs, b.img)
    assert b.qp_error == 0 and b.cnt_retransmits > 0

# Ref: roce-layouts.md §4.2 (AETH syndromes), §6.2 (PSN classes), §6.5 (ACK/NAK table),
#      §6.6 (duplicates).
"""Responder error and recovery paths, widths 8 and 64, with idles and back-pressure:
duplicates of every kind, PSN ahead after a loss (the peer's go-back-N recovers), R_Key /
range / rights / QP-mask violations, invalid requests, RNR, unknown QPN / bad state / bad
opcode drops, ACK coalescing. Expected packets are computed from the frames sent (PSN rules of
§6) and the peer's own completions."""

import pytest

from hw.headers import AETH, RETH, IETH, AethSyndrome as S, BthOpcode as O, pack
from roce.rc import WcStatus
from hw.iface import MSG_HEAD_OCTETS
from roce.frames import PSN_MASK, ip_int, mac_bytes
from tests.hw.rdma.responder_bench import DUT_IP, DUT_MAC, run
from tests.hw.rdma.test_responder import (DUT_QPN, PEER_QPN, RECV_BASE, Oracle, configure, first_diff,
                                  make_env, peer_qp, repost_all)

WIDTHS = [8, 64]


def craft(env, opcode, psn, ext=b"", payload=b"", dest_qp=DUT_QPN, ackreq=1):
    """A request frame built by hand (for what the peer would never send)."""
    return env.peer.build(mac_bytes(DUT_MAC), ip_int(DUT_IP), 0xC000, dest_qp, opcode=opcode,
                          psn=psn & PSN_MASK, ackreq=ackreq, ext=ext, payload=payload)


async def fresh(ctx, env, psn, pmtu=256, **kw):
    """(Re)configure QP 0 at ePSN ``psn`` (host write of state reloads it); new peer QP."""
    await configure(ctx, env, pmtu, psn, **kw)
    env.peer.destroy_qp(env.peer.qps[PEER_QPN]) if PEER_QPN in env.peer.qps else None
    return peer_qp(env, pmtu, psn)


def summary(entries):
    """(opcode, syndrome or None, psn) of RespTx entries."""
    out = []
    for rec, _, _ in entries:
        has_aeth = rec["opcode"] in (O.ACKNOWLEDGE.value, O.ATOMIC_ACKNOWLEDGE.value,
                                     O.READ_RESPONSE_FIRST.value, O.READ_RESPONSE_LAST.value,
                                     O.READ_RESPONSE_ONLY.value)
        out.append((rec["opcode"], rec["aeth"]["syndrome"] if has_aeth else None, rec["psn"]))
    return out


@pytest.mark.parametrize("width", WIDTHS)
def test_duplicates(width):
    """Duplicate SEND/WRITE: re-ACKed (PSN = ePSN - 1), not executed; duplicate READ: re-read
    from its own PSN (also from the middle of the original); duplicate atomic: replayed with
    the saved original value; a duplicate READ that does not match its context is dropped."""
    env, rng = make_env(width, 256, seed=width + 1)
    orc = Oracle(env.init)
    psn0 = 0x7FFFFE

    async def scenario(ctx, env):
        qp = await fresh(ctx, env, psn0)
        data_w = bytes(rng.getrandbits(8) for _ in range(600))
        data_s = bytes(rng.getrandbits(8) for _ in range(20))
        qp.write(0x10000010, 0x1000, data_w)
        orc.write(0x10000010, 0x1000, data_w)
        qp.send(data_s)
        orc.send(data_s)
        qp.read(0x10000010, 0x1000, 600)
        fa = qp.fetch_add(0x10000FF8, 0x1000, 7)
        old = orc.atomic(0x10000FF8, 0x1000, lambda v: (v + 7) % (1 << 64))
        frames = env.peer.poll_tx()
        assert len(frames) == 6          # WRITE x3, SEND, READ request, FetchAdd
        env.to_peer(await env.exchange(ctx, frames), PEER_QPN)
        done = {c.wr_id: c for c in qp.poll_cq()}
        assert all(c.status == WcStatus.SUCCESS for c in done.values()) and len(done) == 4
        assert done[fa].orig == old
        mem_before = env.mem(ctx)
        assert mem_before == bytes(orc.image), first_diff(mem_before, orc.image)
        n_notes = len(env.notes)

        # All six again: every one is a duplicate now.
        epsn = (psn0 + 3 + 1 + 3 + 1) & PSN_MASK
        msn = 4
        out = await env.exchange(ctx, frames)
        read_psn = (psn0 + 4) & PSN_MASK
        want = [(O.ACKNOWLEDGE.value, S.ACK.value, (epsn - 1) & PSN_MASK)] * 4 + [
            (O.READ_RESPONSE_FIRST.value, S.ACK.value, read_psn),
            (O.READ_RESPONSE_MIDDLE.value, None, (read_psn + 1) & PSN_MASK),
            (O.READ_RESPONSE_LAST.value, S.ACK.value, (read_psn + 2) & PSN_MASK),
            (O.ATOMIC_ACKNOWLEDGE.value, S.ACK.value, (psn0 + 7) & PSN_MASK)]
        assert summary(out) == want
        assert all(rec["aeth"]["msn"] == msn for rec, _, _ in out if rec["opcode"] != 0x0E)
        assert b"".join(p for _, p, _ in out[4:7]) == data_w
        assert out[7][0]["atomic_ack"]["orig_data"] == old
        # Duplicate READ of the last two thirds (the requester resuming at PSN + 1).
        dup = craft(env, O.READ_REQUEST.value, read_psn + 1,
                    pack(RETH, va=0x10000010 + 256, rkey=0x1000, dma_length=600 - 256))
        out = await env.exchange(ctx, [dup])
        assert summary(out) == [
            (O.READ_RESPONSE_FIRST.value, S.ACK.value, (read_psn + 1) & PSN_MASK),
            (O.READ_RESPONSE_LAST.value, S.ACK.value, (read_psn + 2) & PSN_MASK)]
        assert b"".join(p for _, p, _ in out) == data_w[256:]
        # Not matching the saved context (other R_Key / VA): dropped silently.
        bad = [craft(env, O.READ_REQUEST.value, read_psn,
                     pack(RETH, va=0x10000010, rkey=0x2000, dma_length=600)),
               craft(env, O.READ_REQUEST.value, read_psn,
                     pack(RETH, va=0x10000018, rkey=0x1000, dma_length=600))]
        assert await env.exchange(ctx, bad) == []
        assert env.mem(ctx) == mem_before
        assert len(env.notes) == n_notes
        c = env.counters(ctx)
        assert c["cnt_duplicates"] == 6 + 1 + 2
        assert c["cnt_nak_invalid"] == c["cnt_nak_access"] == c["cnt_seq_naks"] == 0

    run(env, scenario)


@pytest.mark.parametrize("width", WIDTHS)
def test_psn_ahead_after_loss(width):
    """A lost packet: the next packets are ahead -> one NAK PSN sequence error (PSN = ePSN),
    silence for the rest; the peer goes back and everything completes in order."""
    env, rng = make_env(width, 256, seed=width + 2)
    orc = Oracle(env.init)
    psn0 = 1000

    async def scenario(ctx, env):
        qp = await fresh(ctx, env, psn0)
        msgs = [bytes(rng.getrandbits(8) for _ in range(n)) for n in (40, 300, 12, 77)]
        for d in msgs:
            qp.send(d)
            orc.send(d)
        w = bytes(rng.getrandbits(8) for _ in range(100))
        qp.write(0x10000100, 0x1000, w)
        orc.write(0x10000100, 0x1000, w)
        frames = env.peer.poll_tx()
        assert len(frames) == 6
        lost = frames.pop(1)                     # SEND #2, first packet (PSN psn0 + 1)
        out = await env.exchange(ctx, frames)
        assert summary(out) == [(O.ACKNOWLEDGE.value, S.ACK.value, psn0),
                                (O.ACKNOWLEDGE.value, S.NAK_PSN_SEQ_ERROR.value, psn0 + 1)]
        assert out[1][0]["aeth"]["msn"] == 1
        del lost
        env.to_peer(out, PEER_QPN)
        await repost_all(ctx, env, 1)
        await env.run_peer(ctx, PEER_QPN)
        cs = qp.poll_cq()
        assert [c.status for c in cs] == [WcStatus.SUCCESS] * 5
        assert len(env.notes) == 4
        for n, want in zip(env.notes, orc.notes):
            assert (n["addr"], n["length"]) == (want["addr"], want["length"])
        for n, d in zip(env.notes, msgs):
            assert env.mem(ctx, n["addr"], n["length"]) == d
        assert env.mem(ctx, 0x100, 100) == w
        c = env.counters(ctx)
        assert c["cnt_seq_naks"] == 1 and c["cnt_psn_ahead"] == 4

    run(env, scenario)


ACCESS_CASES = [
    ("bad rkey", "write", dict(va=0x10000000, rkey=0x5555, n=16)),
    ("past end", "write", dict(va=0x10000FF8, rkey=0x1000, n=16)),
    ("before start", "write", dict(va=0x0FFFFFF0, rkey=0x1000, n=16)),
    ("read-only MR", "write", dict(va=0x20000000, rkey=0x2000, n=300)),
    ("write-only MR", "read", dict(va=0x30000000, rkey=0x3000, n=16)),
    ("no atomic right", "fetch_add", dict(va=0x20000008, rkey=0x2000)),
    ("QP not in mask", "write", dict(va=0x40000000, rkey=0x4000, n=16)),
]


@pytest.mark.parametrize("width", WIDTHS)
def test_remote_access_errors(width):
    """R_Key, range, rights and QP-mask violations: NAK 0x62 with the request's PSN, the peer
    completes with REM_ACCESS_ERR, memory untouched, later packets of the QP dropped until the
    host reloads the QP."""
    env, rng = make_env(width, 256, seed=width + 3)

    async def scenario(ctx, env):
        psn = 0xFFFFF0
        for k, (name, kind, a) in enumerate(ACCESS_CASES):
            qp = await fresh(ctx, env, psn)
            ok = qp.send(b"before the error")      # executed normally first
            if kind == "write":
                bad = qp.write(a["va"], a["rkey"], bytes(a["n"]))
            elif kind == "read":
                bad = qp.read(a["va"], a["rkey"], a["n"])
            else:
                bad = qp.fetch_add(a["va"], a["rkey"], 1)
            frames = env.peer.poll_tx()
            before = env.counters(ctx)
            out = await env.exchange(ctx, frames)
            assert summary(out) == [(O.ACKNOWLEDGE.value, S.ACK.value, psn),
                                    (O.ACKNOWLEDGE.value, S.NAK_REMOTE_ACCESS.value,
                                     (psn + 1) & PSN_MASK)], name
            env.to_peer(out, PEER_QPN)
            st = {c.wr_id: c.status for c in qp.poll_cq()}
            assert st == {ok: WcStatus.SUCCESS, bad: WcStatus.REM_ACCESS_ERR}, name
            # The QP is in error at the responder: the next request is dropped.
            later = craft(env, O.SEND_ONLY.value, psn + 2, payload=b"x" * 8)
            assert await env.exchange(ctx, [later]) == [], name
            after = env.counters(ctx)
            assert after["cnt_nak_access"] - before["cnt_nak_access"] == 1
            assert after["cnt_rkey_errors"] - before["cnt_rkey_errors"] == 1
            # Dropped: packets of the failed message after its first, and ``later``.
            assert after["cnt_bad_state"] - before["cnt_bad_state"] == len(frames) - 1, name
            await repost_all(ctx, env, 1)
            psn = (psn + 100) & PSN_MASK
        assert env.qp_errors == [0] * len(ACCESS_CASES)
        mem = env.mem(ctx)
        # Only the receive buffers changed (the good SENDs); every MR is as initialised.
        assert mem[:RECV_BASE] == env.init[:RECV_BASE]

    run(env, scenario)


@pytest.mark.parametrize("width", WIDTHS)
def test_invalid_requests(width):
    """NAK 0x61 (PSN of the request): misaligned atomic, continuation without a first packet,
    short SEND First, WRITE Last length mismatch, SEND longer than the receive buffer, SEND
    with Invalidate of an unknown R_Key."""
    env, rng = make_env(width, 256, seed=width + 4)

    async def scenario(ctx, env):
        psn = 5

        async def expect_nak(frames, nak_psn, name, first_acks=0):
            out = await env.exchange(ctx, frames)
            got = summary(out)
            assert got[-1] == (O.ACKNOWLEDGE.value, S.NAK_INVALID_REQUEST.value,
                               nak_psn & PSN_MASK), (name, got)
            assert len(got) == first_acks + 1, (name, got)
            return out

        # Misaligned atomic, via the peer: its completion says REM_INV_REQ_ERR.
        qp = await fresh(ctx, env, psn)
        bad = qp.fetch_add(0x10000004, 0x1000, 1)
        out = await expect_nak(env.peer.poll_tx(), psn, "misaligned atomic")
        env.to_peer(out, PEER_QPN)
        assert [(c.wr_id, c.status) for c in qp.poll_cq()] == [(bad, WcStatus.REM_INV_REQ_ERR)]

        reth = pack(RETH, va=0x10000000, rkey=0x1000, dma_length=600)
        cases = [   # name, the frames from PSN p, the NAK's PSN - p, ACKs before the NAK
            ("middle first", lambda p: [craft(env, O.SEND_MIDDLE.value, p, payload=bytes(256))],
             0, 0),
            ("write last first", lambda p: [craft(env, O.WRITE_LAST.value, p, payload=bytes(8))],
             0, 0),
            ("short first", lambda p: [craft(env, O.SEND_FIRST.value, p, payload=bytes(100))],
             0, 0),
            ("write length", lambda p: [
                craft(env, O.WRITE_FIRST.value, p, reth, bytes(256), ackreq=0),
                craft(env, O.WRITE_LAST.value, p + 1, payload=bytes(100))], 1, 0),
            ("only inside a SEND", lambda p: [
                craft(env, O.SEND_FIRST.value, p, payload=bytes(256)),
                craft(env, O.SEND_ONLY.value, p + 1, payload=bytes(8))], 1, 1),
        ]
        for name, frames, nak_at, acks in cases:
            psn += 50
            await fresh(ctx, env, psn)
            await expect_nak(frames(psn), psn + nak_at, name, first_acks=acks)
        # SEND of 600 octets into 512-octet buffers: the third packet overflows.
        psn += 50
        await repost_all(ctx, env, 4)
        qp = await fresh(ctx, env, psn, recv_log2=9)
        qp.send(bytes(600))
        await expect_nak(env.peer.poll_tx(), psn + 2, "buffer overflow")
        psn += 50
        await fresh(ctx, env, psn)
        await expect_nak([craft(env, O.SEND_ONLY_INV.value, psn, pack(IETH, rkey=0x7777),
                                bytes(8))], psn, "invalidate unknown rkey")
        c = env.counters(ctx)
        assert c["cnt_nak_invalid"] == 8 and c["cnt_nak_access"] == 0

    run(env, scenario)


@pytest.mark.parametrize("width", WIDTHS)
def test_rnr(width):
    """One receive buffer: the second SEND gets RNR NAK (0x20 | timer, its PSN) until the
    consumer reposts; a WRITE with Immediate needs a buffer too; the peer retries and wins."""
    env, rng = make_env(width, 256, seed=width + 5)

    async def scenario(ctx, env):
        psn = 0xFFFFFF
        qp = await fresh(ctx, env, psn, recv_count=1)
        a, b = b"A" * 30, b"B" * 200
        qp.send(a)
        qp.send(b)
        out = await env.exchange(ctx, env.peer.poll_tx())
        assert summary(out) == [(O.ACKNOWLEDGE.value, S.ACK.value, psn),
                                (O.ACKNOWLEDGE.value, S.RNR_NAK.value | 1, 0)]
        env.to_peer(out, PEER_QPN)
        env.peer.tick(env.peer.now + 20)         # RNR timer code 1 = 10 us
        out = await env.exchange(ctx, env.peer.poll_tx())
        assert summary(out) == [(O.ACKNOWLEDGE.value, S.RNR_NAK.value | 1, 0)]
        env.to_peer(out, PEER_QPN)
        await repost_all(ctx, env, 1)
        await env.run_peer(ctx, PEER_QPN, tick_us=20)
        qp.write(0x10000000, 0x1000, b"imm", imm=0xABCD)
        out = await env.exchange(ctx, env.peer.poll_tx())
        assert summary(out) == [(O.ACKNOWLEDGE.value, S.RNR_NAK.value | 1, 1)]
        env.to_peer(out, PEER_QPN)
        await repost_all(ctx, env, 1)
        await env.run_peer(ctx, PEER_QPN, tick_us=20)
        assert [c.status for c in qp.poll_cq()] == [WcStatus.SUCCESS] * 3
        assert [(n["addr"], n["length"], n["has_imm"]) for n in env.notes] == [
            (RECV_BASE, 30, 0), (RECV_BASE, 200, 0), (RECV_BASE, 0, 1)]
        assert env.notes[2]["imm"] == 0xABCD
        assert env.mem(ctx, RECV_BASE, 200) == b
        assert env.mem(ctx, 0, 3) == b"imm"
        c = env.counters(ctx)
        assert c["cnt_rnr_naks"] == 3

    run(env, scenario)


@pytest.mark.parametrize("width", WIDTHS)
def test_rnr_backlog(width):
    """``rx_backlog`` (the MAC's receive buffer half full): the first packet of a new SEND gets
    an RNR NAK although a receive buffer is free (cnt_rnr_naks and cnt_rnr_backlog), and takes
    no buffer; the packets of a SEND already under way are placed; once the backlog clears,
    the peer's retry after the RNR timer is accepted, and every message lands once."""
    env, rng = make_env(width, 256, seed=width + 11)

    async def scenario(ctx, env):
        psn = 0x123456
        qp = await fresh(ctx, env, psn, recv_count=4)
        r = env.dut.resp
        long = bytes(rng.getrandbits(8) for _ in range(600))      # 3 packets at PMTU 256
        qp.send(long)
        first, *rest = env.peer.poll_tx()
        out = await env.exchange(ctx, [first])
        ctx.set(r.rx_backlog, 1)
        out += await env.exchange(ctx, rest)
        # the SEND under way is finished: one ACK (AckReq on its last packet), no NAK
        assert summary(out) == [(O.ACKNOWLEDGE.value, S.ACK.value, psn + 2)], summary(out)
        env.to_peer(out, PEER_QPN)
        short = b"S" * 40
        qp.send(short)
        out = await env.exchange(ctx, env.peer.poll_tx())
        assert summary(out) == [(O.ACKNOWLEDGE.value, S.RNR_NAK.value | 1, psn + 3)]
        env.to_peer(out, PEER_QPN)
        c = env.counters(ctx)
        assert (c["cnt_rnr_naks"], c["cnt_rnr_backlog"]) == (1, 1), c
        assert len(env.notes) == 1          # the refused SEND took no buffer
        ctx.set(r.rx_backlog, 0)
        await env.run_peer(ctx, PEER_QPN, tick_us=20)       # RNR timer code 1 = 10 us
        assert [c.status for c in qp.poll_cq()] == [WcStatus.SUCCESS] * 2
        assert [n["length"] for n in env.notes] == [600, 40]
        assert env.notes[0]["addr"] == RECV_BASE != env.notes[1]["addr"]
        assert env.mem(ctx, env.notes[0]["addr"], 600) == long
        assert env.mem(ctx, env.notes[1]["addr"], 40) == short
        c = env.counters(ctx)
        assert (c["cnt_rnr_naks"], c["cnt_rnr_backlog"]) == (1, 1), c

    run(env, scenario)


@pytest.mark.parametrize("width", WIDTHS)
def test_drops(width):
    """Unknown QPN, QP not in RTR/RTS, response opcodes: dropped and counted, their payload
    drained (the following request still executes); no packet goes out."""
    env, rng = make_env(width, 256, seed=width + 6)

    async def scenario(ctx, env):
        psn = 77
        qp = await fresh(ctx, env, psn)
        # QP 1 exists but is only INIT.
        await configure(ctx, env, 256, 0, qp=1, local_qpn=0x12, state=1)
        reth = pack(RETH, va=0x10000000, rkey=0x1000, dma_length=200)
        drops = [craft(env, O.WRITE_ONLY.value, psn, reth, bytes(200), dest_qp=0x99),
                 craft(env, O.WRITE_ONLY.value, psn, reth, bytes(200), dest_qp=0x12),
                 craft(env, O.READ_RESPONSE_ONLY.value, psn,
                       pack(AETH, syndrome=0x1F, msn=0), bytes(64)),
                 craft(env, O.ACKNOWLEDGE.value, psn, pack(AETH, syndrome=0x1F, msn=0))]
        assert await env.exchange(ctx, drops) == []
        c = env.counters(ctx)
        assert (c["cnt_unknown_qp"], c["cnt_bad_state"], c["cnt_bad_opcode"]) == (1, 1, 2)
        assert c["cnt_packets"] == 4
        qp.write(0x10000000, 0x1000, b"z" * 200)
        env.to_peer(await env.exchange(ctx, env.peer.poll_tx()), PEER_QPN)
        assert [c.status for c in qp.poll_cq()] == [WcStatus.SUCCESS]
        assert env.mem(ctx, 0, 200) == b"z" * 200
        # QP 1 moved to RTR by the host: now it answers (PSN from its rq_psn).
        await configure(ctx, env, 256, 0, qp=1, local_qpn=0x12, state=2)
        out = await env.exchange(ctx, [craft(env, O.SEND_ONLY.value, 0, payload=b"q",
                                             dest_qp=0x12)])
        assert summary(out) == [(O.ACKNOWLEDGE.value, S.ACK.value, 0)]
        assert out[0][0]["qp"] == 1

    run(env, scenario)


@pytest.mark.parametrize("width", WIDTHS)
def test_ack_coalescing(width):
    """ack_every = 4: a 10-packet WRITE (AckReq on the last only) is ACKed at packets 4, 8
    and 10; with ack_every = 0 only at 10."""
    for every, want in ((4, [3, 7, 9]), (0, [9])):
        env, rng = make_env(width, 256, seed=width + 7, idle=0.1, bp=0.1, ack_every=every)

        async def scenario(ctx, env):
            qp = await fresh(ctx, env, 500)
            qp.write(0x10000000, 0x1000, bytes(range(256)) * 10)
            out = await env.exchange(ctx, env.peer.poll_tx())
            assert summary(out) == [(O.ACKNOWLEDGE.value, S.ACK.value, 500 + k) for k in want]
            assert [rec["aeth"]["msn"] for rec, _, _ in out] == [0] * (len(want) - 1) + [1]
            env.to_peer(out, PEER_QPN)
            assert [c.status for c in qp.poll_cq()] == [WcStatus.SUCCESS]

        run(env, scenario)


@pytest.mark.parametrize("width", WIDTHS)
def test_invalidate_with_slow_consumer(width):
    """SEND with Invalidate finishing while the previous RecvNotify still waits: the MR is
    invalidated exactly once, the SEND succeeds, its notification names the R_Key."""
    env, rng = make_env(width, 256, seed=width + 8, idle=0.0, bp=0.0)
    env.notify_bp = 0.97

    async def scenario(ctx, env):
        qp = await fresh(ctx, env, 9)
        qp.send(b"first")
        qp.send(b"second", inv_rkey=0x4000)
        await env.run_peer(ctx, PEER_QPN)
        for _ in range(20000):
            if len(env.notes) >= 2:
                break
            await ctx.tick()
        assert [c.status for c in qp.poll_cq()] == [WcStatus.SUCCESS] * 2
        assert [(n["has_inv"], n["inv_rkey"]) for n in env.notes] == [(0, 0), (1, 0x4000)]
        c = env.counters(ctx)
        assert c["cnt_nak_invalid"] == 0
        # A second invalidate of the same R_Key now fails (NAK invalid request).
        qp.send(b"third", inv_rkey=0x4000)
        out = await env.exchange(ctx, env.peer.poll_tx())
        assert summary(out) == [(O.ACKNOWLEDGE.value, S.NAK_INVALID_REQUEST.value, 11)]

    run(env, scenario)


@pytest.mark.parametrize("width", WIDTHS)
def test_head_with_slow_consumer(width):
    """The on-chip first octets (``notify_head``) of SEND Onlys that come while the previous
    RecvNotify still waits: the responder's capture is not touched while a notify waits, so a
    message that begins or brings payload then goes without a head (``ok`` 0, the consumer
    reads the buffer), and every head that is ``ok`` equals its message's first 56 octets."""
    env, rng = make_env(width, 256, seed=width + 21, idle=0.0, bp=0.0, auto_repost=True)
    env.notify_bp = 0.95
    sent = [bytes(rng.getrandbits(8) for _ in range(n)) for n in (20, 56, 60, 8, 100, 33) * 3]

    async def scenario(ctx, env):
        qp = await fresh(ctx, env, 77)
        for d in sent:
            qp.send(d)
        await env.run_peer(ctx, PEER_QPN)
        for _ in range(40000):
            if len(env.notes) >= len(sent):
                break
            await ctx.tick()
        assert [c.status for c in qp.poll_cq()] == [WcStatus.SUCCESS] * len(sent)

    run(env, scenario)
    assert [n["data"] for n in env.notes] == sent
    oks = [n["head"][0] for n in env.notes]
    for n in env.notes:
        if n["head"][0]:
            first = (n["data"] + bytes(MSG_HEAD_OCTETS))[:MSG_HEAD_OCTETS]
            assert n["head"][1] == int.from_bytes(first, "big"), n
    # Both kinds occur: the slow consumer spoils some heads and not all.
    assert 0 < sum(oks) < len(sent), oks

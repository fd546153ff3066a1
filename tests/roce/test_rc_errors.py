# Ref: docs/roce-layouts.md §6.2 (ePSN classes), §6.5 (ACK coalescing, NAK table,
#      requester reactions), §6.6 (duplicates), §6.7 (retry counters), §4.3 (atomic alignment),
#      §1.6 (what a receiver drops). Stimulus frames are built by scapy (sim/scapy_roce.py),
#      answers dissected by scapy: an oracle that shares no code with roce/frames.py.
"""Negative paths and recovery details of the roce.rc endpoint."""

from sim.scapy_roce import AtomicETH, IETH, RETH, dissect_roce, roce_frame
from sim.channel import LossyLink, run
from roce.rc import QPState, RoceEndpoint, WcStatus
from roce.frames import parse_frame

MAC1, MAC2 = "52:54:00:00:00:01", "52:54:00:00:00:02"
BASE, RKEY, RKEY_NOATOMIC = 0x10000000, 0x1234, 0x55


def responder(**qp):
    """Our endpoint at 10.0.0.1 / QP 0x11, expecting PSN 0x100 from 10.0.0.2 / QP 0xABC."""
    ep = RoceEndpoint(MAC1, "10.0.0.1")
    msgs = []
    q = ep.create_qp(qpn=0x11, dest_qpn=0xABC, remote_ip="10.0.0.2", remote_mac=MAC2,
                     sq_psn=0x200, epsn=0x100, pmtu=256,
                     on_message=lambda qp_, p, **kw: msgs.append((p, kw)), **qp)
    mem = bytearray(range(256)) * 32
    ep.register(mem, BASE, RKEY, atomic=True)
    ep.register(bytearray(64), 0x20000000, RKEY_NOATOMIC)
    return ep, q, mem, msgs


def req(op, psn, payload=b"", ext=None, ackreq=1, dqpn=0x11):
    return bytes(roce_frame(op, payload, ext=ext, bth=dict(dqpn=dqpn, psn=psn, ackreq=ackreq)))


def answers(ep):
    """Our frames, dissected by scapy: [(opcode, psn, syndrome, msn, exts, payload)]."""
    out = []
    for f in ep.poll_tx():
        bth, exts, payload, _ = dissect_roce(f[42:])
        a = exts.get("aeth") or {}
        out.append((bth["opcode"], bth["psn"], a.get("syndrome"), a.get("msn"), exts, payload))
    return out


def test_bad_rkey_write_nak_remote_access_then_error():
    ep, q, mem, _ = responder()
    ep.receive_frame(req(0x0A, 0x100, b"x" * 16,
                         {RETH: dict(va=BASE, rkey=0xDEAD, dma_length=16)}), 1)
    assert [a[:4] for a in answers(ep)] == [(0x11, 0x100, 0x62, 0)]
    assert ep.counters.rkey_errors == 1 and ep.counters.naks_sent == 1
    assert q.state == QPState.ERROR
    ep.receive_frame(req(0x04, 0x101, b"late"), 2)        # QP in Error: dropped, counted
    assert answers(ep) == [] and ep.counters.bad_qp_state == 1


def test_range_and_rights_violations():
    for op, ext, syndrome in (
            (0x0C, {RETH: dict(va=BASE + 8190, rkey=RKEY, dma_length=16)}, 0x62),   # past end
            (0x14, {AtomicETH: dict(va=0x20000000, rkey=RKEY_NOATOMIC, swap_add=1)}, 0x62),
            (0x14, {AtomicETH: dict(va=BASE + 4, rkey=RKEY, swap_add=1)}, 0x61),    # misaligned
            (0x13, {AtomicETH: dict(va=BASE + 12, rkey=RKEY)}, 0x61)):
        ep, q, mem, _ = responder()
        before = bytes(mem)
        ep.receive_frame(req(op, 0x100, ext=ext), 1)
        assert [a[:3] for a in answers(ep)] == [(0x11, 0x100, syndrome)]
        assert bytes(mem) == before and q.state == QPState.ERROR


def test_wrong_qpn_bad_icrc_and_wrong_source_are_dropped():
    ep, q, _, msgs = responder()
    ep.receive_frame(req(0x04, 0x100, b"abcd", dqpn=0x99), 1)
    assert ep.counters.unknown_qp == 1
    good = req(0x04, 0x100, b"abcd")
    bad = bytearray(good)
    bad[-5] ^= 0x10                                       # payload bit: ICRC mismatch
    ep.receive_frame(bytes(bad), 2)
    assert ep.counters.icrc_errors == 1
    spoof = bytes(roce_frame(0x04, b"abcd", src_ip="10.0.0.9", bth=dict(dqpn=0x11, psn=0x100)))
    ep.receive_frame(spoof, 3)                            # not the QP's remote address
    assert ep.counters.not_for_us == 1
    assert answers(ep) == [] and msgs == [] and q.epsn == 0x100
    ep.receive_frame(good, 4)
    assert [a[:4] for a in answers(ep)] == [(0x11, 0x100, 0x1F, 1)] and msgs[0][0] == b"abcd"


def test_out_of_sequence_nak_once_per_episode():
    ep, q, _, msgs = responder()
    ep.receive_frame(req(0x04, 0x102, b"two!"), 1)
    ep.receive_frame(req(0x04, 0x103, b"thr!"), 2)
    assert [a[:3] for a in answers(ep)] == [(0x11, 0x100, 0x60)]   # NAK carries the ePSN
    assert ep.counters.psn_errors == 2 and ep.counters.naks_sent == 1
    ep.receive_frame(req(0x04, 0x100, b"zero"), 3)
    ep.receive_frame(req(0x04, 0x101, b"one!"), 4)
    # ACKs coalesce: only the newest goes out, MSN counts both messages
    assert [a[:4] for a in answers(ep)] == [(0x11, 0x101, 0x1F, 2)]
    ep.receive_frame(req(0x04, 0x104, b"four"), 5)          # a new episode: NAK again
    assert [a[:3] for a in answers(ep)] == [(0x11, 0x102, 0x60)]
    assert [m for m, _ in msgs] == [b"zero", b"one!"] and q.state == QPState.RTS


def test_duplicates_reack_replay_and_reread():
    ep, q, mem, msgs = responder()
    send = req(0x04, 0x100, b"once")
    fadd = req(0x14, 0x101, ext={AtomicETH: dict(va=BASE + 64, rkey=RKEY, swap_add=5)})
    read = req(0x0C, 0x102, ext={RETH: dict(va=BASE, rkey=RKEY, dma_length=600)})
    for f in (send, fadd, read):
        ep.receive_frame(f, 1)
    first = answers(ep)
    assert [(a[0], a[1]) for a in first] == [(0x11, 0x100), (0x12, 0x101), (0x0D, 0x102),
                                             (0x0E, 0x103), (0x0F, 0x104)]
    orig = first[1][4]["atomic_ack"]["orig_data"]
    assert orig == int.from_bytes(bytes(range(64, 72)), "little")
    assert q.epsn == 0x105                                # READ consumed 3 PSNs (§6.3)
    mem[0] = 0xEE                                         # a re-executed READ sees this
    for f in (send, fadd, read, send):
        ep.receive_frame(f, 2)
    again = answers(ep)
    ops = [(a[0], a[1]) for a in again]
    assert (0x12, 0x101) in ops and ops.count((0x0D, 0x102)) == 1
    assert [a for a in again if a[0] == 0x12][0][4]["atomic_ack"]["orig_data"] == orig
    assert [a for a in again if a[0] == 0x0D][0][5][0] == 0xEE
    dup_acks = [a for a in again if a[0] == 0x11]
    assert dup_acks and all(a[2] == 0x1F and a[1] == 0x104 for a in dup_acks)
    assert int.from_bytes(mem[64:72], "little") == orig + 5        # added exactly once
    assert len(msgs) == 1 and ep.counters.duplicates == 4
    # a READ resumed mid-way (requester lost response 0x103): re-read from the right offset
    ep.receive_frame(req(0x0C, 0x103, ext={RETH: dict(va=BASE + 256, rkey=RKEY,
                                                      dma_length=344)}), 3)
    mid = answers(ep)
    assert [(a[0], a[1]) for a in mid] == [(0x0D, 0x103), (0x0F, 0x104)]
    assert mid[0][5] == bytes(mem[256:512])


def test_send_with_invalidate_and_write_imm_rnr():
    ep, q, mem, msgs = responder(recv_credits=0, min_rnr_timer=14)
    ep.receive_frame(req(0x17, 0x100, b"bye", {IETH: dict(rkey=RKEY)}), 1)
    assert [a[:3] for a in answers(ep)] == [(0x11, 0x100, 0x20 | 14)]     # RNR NAK
    assert q.epsn == 0x100 and ep.mrs[RKEY].valid and not msgs
    q.post_recv(1)
    ep.receive_frame(req(0x17, 0x100, b"bye", {IETH: dict(rkey=RKEY)}), 2)
    assert [a[:3] for a in answers(ep)] == [(0x11, 0x100, 0x1F)]
    assert msgs == [(b"bye", dict(imm=None, invalidated_rkey=RKEY))]
    assert not ep.mrs[RKEY].valid and q.recv_credits == 0
    ep.receive_frame(req(0x0A, 0x101, b"abcd", {RETH: dict(va=BASE, rkey=RKEY,
                                                           dma_length=4)}), 3)
    assert [a[:3] for a in answers(ep)] == [(0x11, 0x101, 0x62)]          # invalidated


def pair(link_seed=0, pmtu=256, **qa_kw):
    a = RoceEndpoint(MAC1, "10.0.0.1", seed=1)
    b = RoceEndpoint(MAC2, "10.0.0.2", seed=2)
    got = []
    qa = a.create_qp(qpn=0x11, dest_qpn=0x22, remote_ip="10.0.0.2", remote_mac=MAC2,
                     sq_psn=0xFFFFFE,
                     epsn=0x500, pmtu=pmtu, timeout=8, **qa_kw)
    qb = b.create_qp(qpn=0x22, dest_qpn=0x11, remote_ip="10.0.0.1", remote_mac=MAC1,
                     sq_psn=0x500,
                     epsn=0xFFFFFE, pmtu=pmtu, timeout=8,
                     on_message=lambda q, p, **kw: got.append(p))
    mem = bytearray(range(256)) * 16
    b.register(mem, BASE, RKEY, atomic=True)
    return a, b, qa, qb, mem, got


def test_requester_error_completions_and_flush():
    a, b, qa, qb, mem, got = pair()
    qa.write(BASE, 0xBAD, b"x" * 8)
    qa.send(b"never")
    run(a, b, until=lambda: not qa.outstanding)
    assert [c.status for c in qa.poll_cq()] == [WcStatus.REM_ACCESS_ERR, WcStatus.WR_FLUSH_ERR]
    assert qa.state == qb.state == QPState.ERROR and got == []
    assert a.counters.naks_received == 1 and b.counters.naks_sent == 1
    a, b, qa, qb, mem, got = pair()
    qa.fetch_add(BASE + 3, RKEY, 1)
    run(a, b, until=lambda: not qa.outstanding)
    assert [c.status for c in qa.poll_cq()] == [WcStatus.REM_INV_REQ_ERR]


def test_retry_exhaustion_and_rnr_retry_exhaustion():
    a, b, qa, qb, mem, got = pair(retry_cnt=2)
    qa.send(b"lost")
    qa.send(b"also")
    dead = LossyLink(0, loss=1.0)
    t = run(a, b, link=dead, until=lambda: not qa.outstanding)
    cq = qa.poll_cq()
    assert [c.status for c in cq] == [WcStatus.RETRY_EXC_ERR, WcStatus.WR_FLUSH_ERR]
    timeout = 4096 * 2 ** 8 // 1000
    assert 3 * timeout <= t < 4 * timeout                  # first try + 2 retries
    assert a.counters.retransmissions == 2 * 2 and qa.state == QPState.ERROR
    a, b, qa, qb, mem, got = pair(rnr_retry=1)
    qb.recv_credits = 0
    qa.send(b"nobody listens")
    run(a, b, until=lambda: not qa.outstanding)
    assert [c.status for c in qa.poll_cq()] == [WcStatus.RNR_RETRY_EXC_ERR]
    assert b.counters.rnr_naks_sent == 2 and a.counters.rnr_naks_received == 2


def test_rnr_then_credit_completes():
    a, b, qa, qb, mem, got = pair()
    qb.recv_credits = 0
    qa.send(b"a" * 600)
    t0 = run(a, b, until=lambda: b.counters.rnr_naks_sent >= 3)
    qb.post_recv(1)
    run(a, b, until=lambda: not qa.outstanding)
    assert got == [b"a" * 600] and qa.poll_cq()[0].status == WcStatus.SUCCESS
    assert t0 > 0 and qb.recv_credits == 0


def _step(src, dst, drop=(), t=0):
    """Move src's frames to dst, dropping those whose position is in ``drop``."""
    sent = src.poll_tx()
    for i, f in enumerate(sent):
        if i not in drop:
            dst.receive_frame(f, t)
    return [parse_frame(f)[1] for f in sent]


def test_go_back_n_from_the_nak_psn_across_psn_wrap():
    a, b, qa, qb, mem, got = pair()
    qa.send(bytes(range(256)) * 6)                         # 6 packets, PSN 0xFFFFFE .. 0x3
    sent = _step(a, b, drop={2})
    assert [p.psn for p in sent] == [0xFFFFFE, 0xFFFFFF, 0, 1, 2, 3]
    nak = _step(b, a)
    assert [(p.opcode, p.psn, p.ext["aeth"]["syndrome"]) for p in nak] == [(0x11, 0, 0x60)]
    resent = _step(a, b)
    assert [p.psn for p in resent] == [0, 1, 2, 3]         # from the NAK's PSN, not before
    assert a.counters.retransmissions == 4
    ack = _step(b, a)
    assert [(p.psn, p.ext["aeth"]["msn"]) for p in ack] == [(3, 1)]
    assert got == [bytes(range(256)) * 6] and qa.poll_cq()[0].status == WcStatus.SUCCESS


def test_lost_read_response_is_requested_again_from_the_gap():
    a, b, qa, qb, mem, got = pair()
    qa.send(b"first")                                      # PSN 0xFFFFFE
    into = bytearray(1000)
    qa.read(BASE + 10, RKEY, 1000, into=into)              # PSN 0xFFFFFF .. 2 (4 responses)
    qa.send(b"after")                                      # PSN 3
    _step(a, b)
    resp = _step(b, a, drop={2})                           # lose the 2nd READ response
    assert [(p.opcode, p.psn) for p in resp] == [(0x11, 0xFFFFFE), (0x0D, 0xFFFFFF),
                                                 (0x0E, 0), (0x0E, 1), (0x0F, 2), (0x11, 3)]
    again = _step(a, b)
    assert [(p.opcode, p.psn) for p in again][0] == (0x0C, 0)
    r = again[0].ext["reth"]
    assert (r["va"], r["dma_length"]) == (BASE + 10 + 256, 1000 - 256)
    run(a, b, until=lambda: not qa.outstanding)
    cq = qa.poll_cq()
    assert [c.status for c in cq] == [WcStatus.SUCCESS] * 3
    assert bytes(into) == bytes(mem[10:1010]) == cq[1].data
    assert got == [b"first", b"after"]                     # never delivered twice


def test_mutated_frames_with_valid_checksums_never_crash():
    """Random octets changed in real frames, IPv4 checksum and ICRC then made valid again so
    the mutation reaches the transport: the endpoint may NAK, drop or go to Error, but never
    raises, and every frame is counted in."""
    import random
    import struct

    from roce.frames import icrc, ipv4_checksum
    from tests.roce.test_rc_frames import _mixed_traffic

    link, _, _ = _mixed_traffic(7)
    pool = [f for _, _, f in link.log]
    rng = random.Random(11)
    fed, deep = 0, 0
    for _ in range(60):
        ep, q, mem, msgs = responder()
        ep.listen(4000)
        for k in range(25):
            f = bytearray(rng.choice(pool))
            for _ in range(rng.randrange(1, 4)):
                f[rng.randrange(14, len(f))] = rng.getrandbits(8)
            tot = struct.unpack(">H", f[16:18])[0]
            if f[12:14] == b"\x08\x00" and 44 <= tot <= len(f) - 14:
                f[26:34] = bytes([10, 0, 0, 2, 10, 0, 0, 1])      # to our QP from its peer
                if f[42] < 0x20:
                    f[47:50] = b"\x00\x00\x11"
                    if rng.random() < 0.7:                        # near the expected PSN
                        f[51:54] = (0x100 + rng.randrange(-3, 6)).to_bytes(3, "big")
                f[24:26] = b"\0\0"
                f[24:26] = struct.pack(">H", ipv4_checksum(f[14:34]))
                f[10 + tot:14 + tot] = icrc(bytes(f[14:10 + tot]))
            f[0:6] = bytes.fromhex(MAC1.replace(":", ""))
            ep.receive_frame(bytes(f), k)
            ep.tick(k * 1000)
            ep.poll_tx()
            fed += 1
        c = ep.counters
        assert c.frames_in == 25
        deep += c.naks_sent + c.acks_sent + c.duplicates + c.psn_errors + c.rkey_errors
    assert fed == 1500 and deep > 100          # the mutations reached the transport

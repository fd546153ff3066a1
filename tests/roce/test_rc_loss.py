# Ref: docs/roce-layouts.md §6 (PSNs, ACK coalescing, NAKs, duplicates, go-back-N
#      retransmission, retry counters), §3 (opcodes), §7 (CM); issue 3 (RC peer under
#      random loss, duplication and corruption).
"""Two roce.rc endpoints over a LossyLink: a random mix of every operation in both directions,
checked against a plain in-order model of the remote memory (the oracle: RC executes each QP's
requests exactly once, in order).

A WRITE or atomic that touches a range an earlier READ covers is posted with ``fence``: as in
IB, a retransmitted READ is re-executed on current memory, so without a fence its data may
legitimately include a later write (the model would then be wrong, not the endpoint)."""

import random

import pytest

from sim.channel import LossyLink, run
from roce.rc import RoceEndpoint, WcStatus, WrOp

MEM = 32 * 1024
CTR_OFF, CAS_OFF = MEM - 16, MEM - 8        # 64-bit FetchAdd counter and CmpSwap word


class Side:
    """One endpoint plus the model of the memory its peer exposes to it."""

    def __init__(self, ep, rkey, base):
        self.ep, self.rkey, self.base = ep, rkey, base
        self.mem = bytearray(MEM)
        ep.register(self.mem, base, rkey, atomic=True)
        self.spare = {}                   # rkeys the peer may invalidate with SEND_INV
        for k in range(4):
            rk = rkey + 0x100 + k
            ep.register(bytearray(64), 0x900000 + k * 64, rk)
            self.spare[rk] = True
        self.received = []                # (payload, imm, invalidated_rkey) in arrival order

    def on_message(self, qp, payload, imm=None, invalidated_rkey=None):
        self.received.append((payload, imm, invalidated_rkey))


def plan(rng, qp, peer, pmtu, n_ops):
    """Post n_ops random work requests to ``peer``; return the expectations."""
    model = bytearray(peer.mem)           # what the peer's memory must become
    expect_msgs, expect_cq = [], []
    fa_sum = 0
    reads = []                            # ranges read so far: a later writer must fence
    def fence(off, n):
        return any(o < off + n and off < o + m for o, m in reads)
    for _ in range(n_ops):
        kind = rng.choice(["send", "send", "send_imm", "write", "write", "write_imm", "read",
                           "read", "fetch_add", "fetch_add", "cmp_swap", "send_inv"])
        n = rng.choice([0, 1, 3, pmtu - 1, pmtu, pmtu + 1, 2 * pmtu, 3 * pmtu + 5,
                        rng.randrange(1, 4 * pmtu)])
        if kind in ("send", "send_imm"):
            data = rng.randbytes(n)
            imm = rng.getrandbits(32) if kind == "send_imm" else None
            wr = qp.send(data, imm=imm)
            expect_msgs.append((data, imm, None))
            expect_cq.append((wr, None))
        elif kind == "send_inv":
            live = [k for k, v in peer.spare.items() if v]
            if not live:
                continue
            rk = rng.choice(live)
            peer.spare[rk] = False
            data = rng.randbytes(min(n, 40))
            wr = qp.send(data, inv_rkey=rk)
            expect_msgs.append((data, None, rk))
            expect_cq.append((wr, None))
        elif kind in ("write", "write_imm"):
            off = rng.randrange(0, CTR_OFF - n + 1)
            data = rng.randbytes(n)
            imm = rng.getrandbits(32) if kind == "write_imm" else None
            wr = qp.write(peer.base + off, peer.rkey, data, imm=imm, fence=fence(off, n))
            model[off:off + n] = data
            if imm is not None:
                expect_msgs.append((b"", imm, None))
            expect_cq.append((wr, None))
        elif kind == "read":
            off = rng.randrange(0, MEM - n + 1)
            wr = qp.read(peer.base + off, peer.rkey, n)
            reads.append((off, n))
            expect_cq.append((wr, bytes(model[off:off + n])))
        elif kind == "fetch_add":
            add = rng.getrandbits(40)
            wr = qp.fetch_add(peer.base + CTR_OFF, peer.rkey, add, fence=fence(CTR_OFF, 8))
            old = int.from_bytes(model[CTR_OFF:CTR_OFF + 8], "little")
            model[CTR_OFF:CTR_OFF + 8] = ((old + add) % (1 << 64)).to_bytes(8, "little")
            fa_sum += add
            expect_cq.append((wr, old))
        else:
            cur = int.from_bytes(model[CAS_OFF:CAS_OFF + 8], "little")
            compare = cur if rng.random() < 0.7 else cur ^ 1
            swap = rng.getrandbits(64)
            wr = qp.cmp_swap(peer.base + CAS_OFF, peer.rkey, compare, swap,
                             fence=fence(CAS_OFF, 8))
            if compare == cur:
                model[CAS_OFF:CAS_OFF + 8] = swap.to_bytes(8, "little")
            expect_cq.append((wr, cur))
    return model, expect_msgs, expect_cq, fa_sum


@pytest.mark.parametrize("loss", [0.0, 0.01, 0.05])
@pytest.mark.parametrize("pmtu", [256, 1024, 4096])
def test_mixed_traffic_over_lossy_link(loss, pmtu):
    seed = int(loss * 1000) * 7 + pmtu
    rng = random.Random(seed)
    a = Side(RoceEndpoint("02:00:00:00:02:01", "10.2.0.1", seed=seed), 0x1000, 0x10000000)
    b = Side(RoceEndpoint("02:00:00:00:02:02", "10.2.0.2", seed=seed + 1), 0x2000, 0x20000000)
    # loss, duplication and corruption in both directions, CM included
    link = LossyLink(seed, loss=loss, dup=loss, corrupt=loss, delay_us=4)
    b_qps = []
    b.ep.listen(18515, on_connect=b_qps.append, target_ack_delay=0,
                qp_params=dict(on_message=b.on_message, max_unacked=64))
    qa = a.ep.connect("10.2.0.2", pmtu=pmtu, local_ack_timeout=9,
                      qp_params=dict(on_message=a.on_message, max_unacked=64))
    run(a.ep, b.ep, link=link, until=lambda: b_qps and qa.state.name == "RTS",
        max_us=200_000_000)
    qb = b_qps[0]
    assert qb.pmtu == qa.pmtu == pmtu
    n_ops = {256: 150, 1024: 100, 4096: 60}[pmtu]
    model_b, msgs_to_b, cq_a, fa_a = plan(rng, qa, b, pmtu, n_ops)
    model_a, msgs_to_a, cq_b, fa_b = plan(rng, qb, a, pmtu, n_ops)
    run(a.ep, b.ep, link=link, max_us=2_000_000_000,
        until=lambda: not qa.outstanding and not qb.outstanding
        and len(a.received) >= len(msgs_to_a) and len(b.received) >= len(msgs_to_b))
    # let stray duplicates and retransmissions drain: nothing may be delivered twice
    run(a.ep, b.ep, link=link, until=link.next_arrival() is None and 0 or
        max(a.ep.now, b.ep.now) + 50_000)
    for qp, expect, got_msgs, want_msgs, model, peer, fa in (
            (qa, cq_a, b.received, msgs_to_b, model_b, b, fa_a),
            (qb, cq_b, a.received, msgs_to_a, model_a, a, fa_b)):
        cq = qp.poll_cq()
        assert [c.status for c in cq] == [WcStatus.SUCCESS] * len(expect)
        assert [c.wr_id for c in cq] == [w for w, _ in expect]       # in order, once each
        for c, (_, want) in zip(cq, expect):
            if c.op == WrOp.READ:
                assert c.data == want
            elif c.op in (WrOp.FETCH_ADD, WrOp.CMP_SWAP):
                assert c.orig == want
        assert got_msgs == want_msgs                                  # exactly once, in order
        assert peer.mem == model                                      # memory as the model
        ctr = int.from_bytes(peer.mem[CTR_OFF:CTR_OFF + 8], "little")
        assert ctr == fa % (1 << 64)                                  # atomics applied once
        for rk, live in peer.spare.items():
            assert peer.ep.mrs[rk].valid == live
    sa, sb = a.ep.counters, b.ep.counters
    print(link.stats, sa, sb)
    if loss:                           # every impairment happened and was recovered from
        assert link.stats["lost"] > 0 and link.stats["duplicated"] > 0 \
            and link.stats["corrupted"] > 0, link.stats
        assert sa.retransmissions + sb.retransmissions > 0
        assert sa.duplicates + sb.duplicates > 0
        assert sa.icrc_errors + sb.icrc_errors + sa.ip_checksum_errors + \
            sb.ip_checksum_errors > 0
    else:
        assert sa.retransmissions == sb.retransmissions == 0
        assert sa.psn_errors == sb.psn_errors == sa.naks_sent == sb.naks_sent == 0


def test_rnr_flow_control_under_loss():
    """A slow consumer (one receive credit, re-posted 300 us after each message) behind a 5%
    lossy link: RNR NAKs pace the sender, every message arrives once and in order."""
    a = RoceEndpoint("02:00:00:00:04:01", "10.4.0.1", seed=9)
    b = RoceEndpoint("02:00:00:00:04:02", "10.4.0.2", seed=10)
    link = LossyLink(99, loss=0.05, dup=0.05, corrupt=0.05, delay_us=4)
    got, due = [], []

    def consume(qp, payload, imm=None, invalidated_rkey=None):
        got.append((payload, imm))
        due.append(b.now + 300)               # the buffer comes back later

    qa = a.create_qp(qpn=0x30, dest_qpn=0x40, remote_ip="10.4.0.2", pmtu=512, timeout=9,
                     sq_psn=0xFFFFF0, epsn=7)
    qb = b.create_qp(qpn=0x40, dest_qpn=0x30, remote_ip="10.4.0.1", pmtu=512, timeout=9,
                     sq_psn=7, epsn=0xFFFFF0, recv_credits=1, min_rnr_timer=3,
                     on_message=consume)
    mem = bytearray(4096)
    b.register(mem, 0, 0x5)
    rng = random.Random(4)
    want = []
    for i in range(40):
        data = rng.randbytes(rng.randrange(0, 1500))
        imm = i if i % 3 == 0 else None
        if i % 5 == 4:                        # WRITE with immediate needs a credit as well
            qa.write(i * 64, 0x5, data[:64], imm=i)
            mem_expect = data[:64]
            want.append((b"", i))
            continue
        qa.send(data, imm=imm)
        want.append((data, imm))

    def until():
        while due and due[0] <= b.now:
            due.pop(0)
            qb.post_recv(1)
        return not qa.outstanding and len(got) >= len(want)

    run(a, b, link=link, until=until, max_us=2_000_000_000)
    assert got == want
    assert bytes(mem[39 * 64:40 * 64]) == mem_expect
    assert [c.status for c in qa.poll_cq()] == [WcStatus.SUCCESS] * 40
    assert b.counters.rnr_naks_sent > 5 and a.counters.rnr_naks_received > 0

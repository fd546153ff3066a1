# Ref: roce-layouts.md §6.5 (NAK PSN sequence error -> go back to its PSN; RNR NAK), §6.6
#      (duplicates), §6.7 (local ACK timeout, go-back-N from the oldest unacknowledged PSN).
"""RC requester under loss: dropped requests and responses, go-back-N, READ re-request, RNR.

Same bench as tests/hw/rdma/test_requester.py (gateware requester + TxPath + builder/parser against the
independent Python :class:`Peer`); the checks name the PSN the rules of §6 require next.
"""

import random

import pytest

from hw.iface import WrOp
from hw.rdma.requester import ack_timeout_cycles, rnr_timer_cycles
from tests.hw.rdma.test_requester import (CLK_HZ, SCALE, SQ_PSN, Bench, check_outcome, mixed_wrs, wr,
                                  VA0)

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

TO = 10                      # timeout code: 1024 cycles at SCALE 512


def sent_q(b, q=0):
    return [(op, psn, t) for qp, op, psn, t, _ in b.sent if qp == q]


def run_checked(b, wrs):
    """Run ``wrs`` on the bench, check every outcome against the peer's memory, and return what
    QP 0 sent: (opcode, PSN, cycle) per packet."""
    b.run(wrs)
    check_outcome(b, wrs, b.img)
    return sent_q(b)


def psn_after(k):
    """The PSN ``k`` packets after QP 0's first."""
    return (SQ_PSN[0] + k) % (1 << 24)


@pytest.mark.parametrize("width", [8, 64])
def test_nak_seq_goes_back_to_nak_psn(width):
    """Lose packet 1 of a 4-packet WRITE: the peer NAKs (0x60, ePSN = first + 1) at packet 2;
    the requester resends from first + 1, not from the start and not from the timeout."""
    b = Bench(width, seed=1, timeout=TO)
    b.peers[0].drop_req = lambda n, bth: n == 1
    wrs = [wr(0, 7, WrOp.WRITE, 3 * 256 + 5, 0x100, va=VA0 + 3),
           wr(0, 8, WrOp.SEND, 40, 0x900)]
    psns = [psn for _, psn, _ in run_checked(b, wrs)]
    first_tx = [psn_after(i) for i in range(5)]
    # Original pass (packets 0..3 and the SEND), then the go-back run from p0 + 1.
    k = psns.index(psn_after(1), 2)
    assert psns[:k] == first_tx[:k]
    assert psns[k:k + 4] == first_tx[1:5]
    assert b.cnt_seq_naks == 1 and b.cnt_timeouts == 0


@pytest.mark.parametrize("width", [8, 64])
def test_lost_ack_timeout_retransmits_oldest(width):
    """Lose the ACK of the last WRITE: after the local ACK timeout the requester resends the
    oldest unacknowledged PSN; the peer sees a duplicate and re-ACKs; the WR completes once."""
    b = Bench(width, seed=2, timeout=TO)
    b.peers[0].drop_rsp = lambda n, op, psn: n == 1
    wrs = [wr(0, 1, WrOp.SEND, 100, 0x40), wr(0, 2, WrOp.WRITE, 10, 0x80)]
    s = run_checked(b, wrs)
    assert [psn for _, psn, _ in s] == [psn_after(0), psn_after(1), psn_after(1)]
    to = ack_timeout_cycles(TO, CLK_HZ, SCALE)
    # The timer ran from the ACK of the SEND (progress restarts it), not from the WRITE.
    assert to - 200 <= s[2][2] - s[1][2] <= to + 200
    assert b.cnt_timeouts == 1 and b.cnt_retransmits == 1
    assert [w for _, w, _ in b.wcs] == [1, 2]


@pytest.mark.parametrize("width", [64])
def test_lost_ack_covered_by_coalesced_ack(width):
    """Lose the ACK of the first WR only: the ACK of the second covers both (§6.5), nothing is
    resent."""
    b = Bench(width, seed=2, timeout=TO)
    b.peers[0].drop_rsp = lambda n, op, psn: n == 0
    wrs = [wr(0, 1, WrOp.SEND, 100, 0x40), wr(0, 2, WrOp.WRITE, 10, 0x80)]
    assert len(run_checked(b, wrs)) == 2 and b.cnt_timeouts == 0


@pytest.mark.parametrize("width", [8, 64])
def test_read_response_lost(width):
    """Lose the middle response of a 3-packet READ: the last one is out of order and dropped,
    the timeout re-requests the READ, the data lands at laddr in order."""
    b = Bench(width, seed=3, timeout=TO)
    b.peers[0].drop_rsp = lambda n, op, psn: n == 1
    wrs = [wr(0, 5, WrOp.READ, 2 * 256 + 77, 0x4003, va=VA0 + 0x101),
           wr(0, 6, WrOp.SEND, 3, 0x10)]
    s = run_checked(b, wrs)
    assert [op for op, _, _ in s][:2] == [0x0C, 0x04]
    assert 0x0C in [op for op, _, _ in s[2:]], "READ request resent"
    assert b.cnt_timeouts >= 1 and b.cnt_stale >= 1


@pytest.mark.parametrize("width", [8])
def test_rnr_nak_waits_then_resends(width):
    """Two RNR NAKs (timer code 14 = 1.28 ms / SCALE): the SEND is resent after the RNR delay,
    from the NAK's PSN, twice, then acknowledged."""
    b = Bench(width, seed=4, timeout=TO)
    b.peers[0].rnr = 2
    wrs = [wr(0, 1, WrOp.WRITE, 8, 0x10), wr(0, 2, WrOp.SEND, 300, 0x200)]
    firsts = [t for op, psn, t in run_checked(b, wrs) if psn == psn_after(1)]
    assert len(firsts) == 3
    delay = rnr_timer_cycles(14, CLK_HZ, SCALE)
    for a, c in zip(firsts, firsts[1:]):
        assert c - a >= delay
    assert b.cnt_rnr_naks == 2 and b.cnt_timeouts == 0


@pytest.mark.parametrize("width,loss", [(64, 0.08)])
def test_random_loss(width, loss):
    """Random loss in both directions, retry_cnt 7 (never exhausted): every WR completes OK,
    the peer and target memory end as if there had been no loss."""
    rng = random.Random(width)
    b = Bench(width, seed=width + 50, timeout=TO, retry_cnt=7, idle=0.1, bp=0.1)
    lr = random.Random(width + 1)
    dropped = {"req": 0, "rsp": 0}

    def drop(way):
        def f(*_):
            d = lr.random() < loss
            dropped[way] += d
            return d
        return f
    for p in b.peers:
        p.drop_req = drop("req")
        p.drop_rsp = drop("rsp")
    wrs = mixed_wrs(rng, 2, 8, b.pmtu)
    b.run(wrs, max_cycles=100_000)
    check_outcome(b, wrs, b.img)
    assert dropped["req"] + dropped["rsp"] > 0, "the link lost nothing"
    assert b.cnt_timeouts + b.cnt_seq_naks > 0, "the loss must have been noticed"
    assert b.cnt_retransmits > 0, "the loss must have been repaired by retransmission"

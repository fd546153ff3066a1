# Ref: roce-layouts.md §6.2-§6.7 (PSN classes, NAK once per episode, duplicates, go-back-N);
#      roce/rc.py (the peer requester and its retransmission rules).
"""Responder under a lossy, duplicating link: random SEND / WRITE / READ / atomic traffic from
the Python RC peer, frames lost or duplicated in both directions. Everything must complete
successfully with the right data: the responder's duplicate, PSN-ahead and replay-cache rules
are what make the peer's go-back-N recovery correct."""

import random

import pytest

from hw.iface import QPN_BASE
from roce.rc import WcStatus
from tests.hw.rdma.test_responder import Oracle, configure, first_diff, make_env, peer_qp
from tests.hw.rdma.test_responder import PEER_QPN
from tests.hw.rdma.responder_bench import run

LOSS = 0.05                 # test_fetch_add_same_word_lossy: loss and duplication, each way


async def pump_lossy(ctx, env, qp, link, loss, dup, rounds):
    """Carry frames between the peer and the responder for up to ``rounds`` exchanges (or until
    the peer has nothing left to send or time out), losing each frame with probability ``loss``
    in both directions and duplicating a request frame with probability ``dup`` (``link``
    draws). Returns the peer's completions of ``qp`` by work request id, and what the link did."""
    impaired = {"lost": 0, "duplicated": 0}
    for _ in range(rounds):
        frames = env.peer.poll_tx()
        if not frames:
            t = env.peer.next_deadline()
            if t is None:
                break
            env.peer.tick(t)
            continue
        wire = []
        for f in frames:
            if link.random() < loss:
                impaired["lost"] += 1
                continue
            wire.append(f)
            if link.random() < dup:
                impaired["duplicated"] += 1
                wire.append(f)
        out = await env.exchange(ctx, wire)
        drop = {j for j in range(len(out)) if link.random() < loss}
        impaired["lost"] += len(drop)
        env.to_peer(out, PEER_QPN, drop=drop)
    return {c.wr_id: c for c in qp.poll_cq()}, impaired


def check_done(expect, done):
    """Every work request completed successfully, READs with their data, atomics with their
    original value (``expect``: wr_id -> None, ("data", octets) or ("orig", value))."""
    assert set(done) == set(expect)
    for wr_id, want in expect.items():
        c = done[wr_id]
        assert c.status == WcStatus.SUCCESS, c
        if want and want[0] == "data":
            assert c.data == want[1], wr_id
        if want and want[0] == "orig":
            assert c.orig == want[1], wr_id


def check_recovered(env, impaired):
    """The link really lost and duplicated frames, and the peer recovered by retransmitting."""
    assert impaired["lost"] > 0 and impaired["duplicated"] > 0, impaired
    assert env.peer.counters.retransmissions > 0, env.peer.counters


@pytest.mark.parametrize("width,n_ops,loss,dup", [(64, 40, 0.08, 0.05), (8, 16, 0.08, 0.05)])
def test_lossy_link(width, n_ops, loss, dup):
    lossy_link(width, n_ops, loss, dup)


def test_lossy_link_qp63_of_64():
    """The same on the last QP of a 64-QP responder: its context and replay-cache entries sit
    at the top of their memories (rows 63 and 252..255), read through registered ports."""
    lossy_link(64, 40, 0.08, 0.05, n_qp=64, qp_index=63)


def lossy_link(width, n_ops, loss, dup, n_qp=2, qp_index=0):
    env, rng = make_env(width, 256, seed=width * 3 + n_ops, idle=0.2, bp=0.2,
                        auto_repost=True, n_qp=n_qp)
    orc = Oracle(env.init)
    link = random.Random(width)
    local_qpn = QPN_BASE + qp_index

    async def scenario(ctx, env):
        psn0 = 0xFFFF00
        await configure(ctx, env, 256, psn0, qp=qp_index, local_qpn=local_qpn,
                        mask_or=1 << qp_index)
        qp = peer_qp(env, 256, psn0, dest_qpn=local_qpn)
        expect = {}
        sends = []
        # READs only touch MR 1 (never written) and atomics a word range nothing reads, so a
        # READ or atomic replayed after later requests still has one right answer.
        for k in range(n_ops):
            kind = rng.choice(["send", "send", "write", "write", "read", "atomic"])
            if kind == "send":
                d = bytes(rng.getrandbits(8) for _ in range(rng.randrange(0, 700)))
                expect[qp.send(d)] = None
                sends.append(d)
            elif kind == "write":
                d = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 900)))
                va = 0x10000000 + rng.randrange(0, 0x800 - len(d))
                expect[qp.write(va, 0x1000, d)] = None
                orc.write(va, 0x1000, d)
            elif kind == "read":
                n = rng.randrange(0, 800)
                va = 0x20000000 + rng.randrange(0, 0x1000 - n)
                expect[qp.read(va, 0x2000, n)] = ("data", orc.read(va, 0x2000, n))
            else:
                va = 0x10000800 + 8 * rng.randrange(0, 8)
                add = rng.getrandbits(64)
                expect[qp.fetch_add(va, 0x1000, add)] = (
                    "orig", orc.atomic(va, 0x1000, lambda v: (v + add) % (1 << 64)))
        done, impaired = await pump_lossy(ctx, env, qp, link, loss, dup, 400)
        check_done(expect, done)
        assert [n["data"] for n in env.notes] == sends
        assert {n["qp"] for n in env.notes} <= {qp_index}
        mem = env.mem(ctx)
        # Receive buffers hold consumed messages; everything below them is the oracle's.
        assert mem[:0x4000] == bytes(orc.image[:0x4000]), first_diff(mem, orc.image)
        c = env.counters(ctx)
        print(f"\nwidth {width}: {c}")
        assert c["cnt_nak_invalid"] == c["cnt_nak_access"] == 0
        assert c["cnt_duplicates"] > 0 and c["cnt_seq_naks"] > 0
        check_recovered(env, impaired)

    run(env, scenario)


@pytest.mark.parametrize("width,seed", [(8, 1), (8, 2), (64, 3)])
def test_fetch_add_same_word_lossy(width, seed):
    """The system bench's pattern: rounds of SEND, WRITE, FetchAdd on ONE word, READ back of the
    WRITE, over a lossy duplicating link. A duplicated FetchAdd must be answered from the atomic
    cache (§6.6), never executed again: the word must end as the sum of the adds. (The bench's
    "FetchAdd applied twice" report was not the responder's: it passed here too; the bench's
    failure went away with the requester DmaWriter `we` fix.)"""
    env, rng = make_env(width, 256, seed=seed, idle=0.2, bp=0.2, auto_repost=True)
    orc = Oracle(env.init)
    link = random.Random(seed)

    async def scenario(ctx, env):
        psn0 = 0xFFFFF0
        await configure(ctx, env, 256, psn0)
        qp = peer_qp(env, 256, psn0)
        expect, sends = {}, []
        for r in range(4):
            d = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 700)))
            expect[qp.send(d)] = None
            sends.append(d)
            w = bytes(rng.getrandbits(8) for _ in range(rng.randrange(1, 600)))
            va = 0x10000200 + rng.randrange(0, 0x400)
            expect[qp.write(va, 0x1000, w)] = None
            orc.write(va, 0x1000, w)
            add = rng.getrandbits(64)
            expect[qp.fetch_add(0x10000100, 0x1000, add)] = (
                "orig", orc.atomic(0x10000100, 0x1000, lambda v: (v + add) % (1 << 64)))
            expect[qp.read(va, 0x1000, len(w))] = ("data", w)
        done, impaired = await pump_lossy(ctx, env, qp, link, LOSS, LOSS, 600)
        check_done(expect, done)
        mem = env.mem(ctx)
        a = orc.laddr(0x10000100, 0x1000)
        assert mem[a:a + 8] == bytes(orc.image[a:a + 8]), "FetchAdd word (applied twice?)"
        assert mem[:0x4000] == bytes(orc.image[:0x4000]), first_diff(mem, orc.image)
        check_recovered(env, impaired)

    run(env, scenario)

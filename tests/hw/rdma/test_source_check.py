# Ref: issue 18 (Deliver item 5: source checks on every RC packet); Linux rxe check_addr()
#      (a packet whose source is not the QP's path is dropped); hw/rdma/responder.py,
#      hw/rdma/requester.py, hw/target/target.py (counter maps).
"""Source checks: an RC packet whose IPv4 source address (RoCEv2 source GID) is not its QP's
``peer_ip`` is dropped and counted, however right its QPN, PSN and ICRC, on both sides:

- responder (requests): never executed, never answered, no PSN/MSN/receive buffer consumed,
  nothing written; at the expected PSN, behind it (duplicate) and ahead of it (no NAK, the
  NAK stays armed); the genuine packet afterwards is accepted as if nothing had happened;
- requester (responses): a spoofed ACK, NAK or READ response completes, advances, retries or
  writes nothing; the genuine response (after a retransmission) completes the work request;
- the UDP source port (ECMP entropy) and the source MAC (a router's) are not checked;
- the counters are at their register addresses in the whole target (over GMII);
- the Python RoCE stack (roce/rc.py, modelling rxe) does the same for its own QPs.
"""

import pytest

from hw.headers import AETH, RETH, AtomicETH, AethSyndrome as S, BthOpcode as O, pack
from hw.iface import QpState, REG_MR, REG_QP, REG_TRANSPORT, Space, WcStatus, WrOp
from hw.rdma.qp import MR_REGS, QP_REGS
from roce.frames import PSN_MASK, build_roce, ip_int, mac_bytes
from sim.hdl import gmii_drive, gmii_wire
from tests.hw.rdma.responder_bench import DUT_IP, DUT_MAC, PEER_IP, PEER_MAC, run
from tests.hw.rdma.test_responder import DUT_QPN, RECV_BASE, make_env
from tests.hw.rdma.test_responder_errors import craft, fresh, summary
# Imported here, not in the test: pytest rewrites a module's asserts when it is first
# imported, and CPython 3.11 can fail to parse inside a deep simulator stack.
from tests.hw.rdma.test_rawq import access, run as run_sim

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

WIDTHS = [8, 64]
SPOOF_IP = "10.0.0.9"           # an address on the same subnet that is not the QP's peer


def spoofed(opcode, psn, ext=b"", payload=b"", *, src_ip=SPOOF_IP, src_mac=PEER_MAC,
            sport=0xC000, ackreq=1, dest_qp=DUT_QPN):
    """A request to the DUT's QP with a chosen source (valid checksums and ICRC)."""
    return build_roce(mac_bytes(src_mac), mac_bytes(DUT_MAC), src_ip, DUT_IP, sport,
                      opcode=opcode, dest_qp=dest_qp, psn=psn & PSN_MASK, ackreq=ackreq,
                      ext=ext, payload=payload)


# ---- responder ------------------------------------------------------------------------------

@pytest.mark.parametrize("width", WIDTHS)
def test_responder_drops_spoofed_requests(width):
    """Through the gateware RoceRxParser (the source address travels in its metadata)."""
    env, rng = make_env(width, 256, seed=width + 180, parser=True)
    psn = 0xFFFFFE                          # the PSNs wrap inside the run

    async def scenario(ctx, env):
        await fresh(ctx, env, psn)
        mem0 = env.mem(ctx)
        data = bytes(rng.getrandbits(8) for _ in range(40))
        reth = pack(RETH, va=0x10000100, rkey=0x1000, dma_length=len(data))
        rd = pack(RETH, va=0x10000100, rkey=0x1000, dma_length=300)
        fa = pack(AtomicETH, va=0x10000200, rkey=0x1000, swap_add=5, compare=0)

        # At the expected PSN: every kind of request, right QPN, PSN and ICRC, wrong source.
        at_epsn = [spoofed(O.WRITE_ONLY.value, psn, reth, b"X" * len(data)),
                   spoofed(O.SEND_ONLY.value, psn, payload=b"spoofed send"),
                   spoofed(O.WRITE_FIRST.value, psn,
                           pack(RETH, va=0x10000000, rkey=0x1000, dma_length=512), bytes(256)),
                   spoofed(O.READ_REQUEST.value, psn, rd),
                   spoofed(O.FETCH_ADD.value, psn, fa),
                   spoofed(O.SEND_ONLY.value, psn, payload=b"x", src_ip=DUT_IP)]
        # Ahead of it: no NAK (and the NAK of the episode is not used up).
        ahead = [spoofed(O.SEND_ONLY.value, psn + 3, payload=b"ahead")]
        assert await env.exchange(ctx, at_epsn + ahead) == []
        assert env.mem(ctx) == mem0 and env.notes == []
        c = env.counters(ctx)
        assert c["cnt_src_mismatch"] == 7 and c["cnt_packets"] == 7
        assert sum(v for k, v in c.items() if k not in ("cnt_src_mismatch", "cnt_packets")) == 0

        # The genuine packets at that same PSN are accepted and ACKed normally; a genuine one
        # from another UDP source port and another source MAC (a router's) as well.
        out = await env.exchange(ctx, [craft(env, O.WRITE_ONLY.value, psn, reth, data)])
        assert summary(out) == [(O.ACKNOWLEDGE.value, S.ACK.value, psn)]
        assert out[0][0]["aeth"]["msn"] == 1
        assert env.mem(ctx, 0x100, len(data)) == data
        routed = spoofed(O.SEND_ONLY.value, psn + 1, payload=b"via a router",
                         src_ip=PEER_IP, src_mac="02:00:00:00:00:fe", sport=0xE123)
        out = await env.exchange(ctx, [routed])
        assert summary(out) == [(O.ACKNOWLEDGE.value, S.ACK.value, (psn + 1) & PSN_MASK)]
        assert [(n["addr"], n["length"]) for n in env.notes] == [(RECV_BASE, 12)]
        assert env.mem(ctx, RECV_BASE, 12) == b"via a router"

        # Behind the ePSN (psn + 2): the genuine duplicate is re-ACKed, the spoofed ones get
        # nothing (a duplicate READ would re-send memory contents to the spoofer).
        epsn = (psn + 2) & PSN_MASK
        out = await env.exchange(ctx, [spoofed(O.WRITE_ONLY.value, psn, reth, b"Y" * 40),
                                       spoofed(O.SEND_ONLY.value, psn + 1, payload=b"dup")])
        assert out == []
        out = await env.exchange(ctx, [craft(env, O.WRITE_ONLY.value, psn, reth, data)])
        assert summary(out) == [(O.ACKNOWLEDGE.value, S.ACK.value, (epsn - 1) & PSN_MASK)]
        out = await env.exchange(ctx, [craft(env, O.READ_REQUEST.value, epsn, rd)])
        assert [r["opcode"] for r, _, _ in out] == [O.READ_RESPONSE_FIRST.value,
                                                    O.READ_RESPONSE_LAST.value]
        epsn = (epsn + 2) & PSN_MASK
        assert await env.exchange(ctx, [spoofed(O.READ_REQUEST.value, epsn - 2, rd)]) == []
        out = await env.exchange(ctx, [craft(env, O.READ_REQUEST.value, epsn - 2, rd)])
        assert len(out) == 2                 # the genuine duplicate READ is re-read

        # Ahead again: the genuine packet gets the NAK the spoofed one did not use up.
        out = await env.exchange(ctx, [spoofed(O.SEND_ONLY.value, epsn + 1, payload=b"a"),
                                       craft(env, O.SEND_ONLY.value, epsn + 1, payload=b"a")])
        assert summary(out) == [(O.ACKNOWLEDGE.value, S.NAK_PSN_SEQ_ERROR.value, epsn)]

        assert len(env.notes) == 1 and env.qp_errors == []
        c = env.counters(ctx)
        assert c["cnt_src_mismatch"] == 7 + 2 + 1 + 1
        assert c["cnt_duplicates"] == 2 and c["cnt_acks"] == 3 and c["cnt_seq_naks"] == 1
        assert c["cnt_psn_ahead"] == 1
        assert c["cnt_unknown_qp"] == c["cnt_bad_state"] == c["cnt_bad_opcode"] == 0

    run(env, scenario)


@pytest.mark.parametrize("width", [8])
def test_responder_source_is_per_qp(width):
    """Two QPs with different peers: each accepts only its own peer; a packet from QP 1's peer
    to QP 0 is dropped (and the other way round), unknown QPNs still count as unknown."""
    env, rng = make_env(width, 256, seed=width + 181)
    other_ip = "10.0.0.3"

    async def scenario(ctx, env):
        from tests.hw.rdma.responder_bench import write_qp
        await fresh(ctx, env, 10)
        await write_qp(ctx, env.dut.bus, 1, state=3, local_qpn=0x12, remote_qpn=0x21,
                       peer_mac=int.from_bytes(mac_bytes(PEER_MAC), "big"),
                       peer_ip=ip_int(other_ip), udp_sport=0xC124, pmtu=1, rq_psn=20,
                       recv_base=RECV_BASE, recv_count=2, recv_size_log2=8)
        out = await env.exchange(ctx, [
            spoofed(O.SEND_ONLY.value, 10, payload=b"a", src_ip=other_ip),      # to QP 0: drop
            spoofed(O.SEND_ONLY.value, 20, payload=b"b", src_ip=PEER_IP, dest_qp=0x12),  # drop
            spoofed(O.SEND_ONLY.value, 20, payload=b"c", src_ip=other_ip, dest_qp=0x12),
            spoofed(O.SEND_ONLY.value, 10, payload=b"d", src_ip=PEER_IP),
            spoofed(O.SEND_ONLY.value, 10, payload=b"e", src_ip=PEER_IP, dest_qp=0x99)])
        assert [(r["qp"], r["psn"], r["aeth"]["syndrome"]) for r, _, _ in out] == \
            [(1, 20, S.ACK.value), (0, 10, S.ACK.value)]
        c = env.counters(ctx)
        assert (c["cnt_src_mismatch"], c["cnt_unknown_qp"], c["cnt_acks"]) == (2, 1, 2)

    run(env, scenario)


# ---- requester --------------------------------------------------------------------------------

def _spoof_first_response(b, qp, pick, rewrite=None):
    """Peer ``qp`` of requester bench ``b``: the first response frame that ``pick(opcode)``
    selects is replaced by a copy from SPOOF_IP (``rewrite(fields)`` may change it); the
    genuine one is lost. Returns the list of spoofed (opcode, psn)."""
    from sim.scapy_roce import dissect_roce, roce_frame, AETH as SAETH
    peer = b.peers[qp]
    orig = peer.handle
    done = []

    def handle(bth, ext, payload):
        out = []
        for f in orig(bth, ext, payload):
            rb, rext, rpay, _ = dissect_roce(f[42:])
            if not done and pick(rb["opcode"]):
                fields = dict(op=rb["opcode"], psn=rb["psn"], payload=rpay,
                              aeth=rext.get("aeth"))
                if rewrite:
                    rewrite(fields)
                ext2 = {SAETH: fields["aeth"]} if fields["aeth"] else {}
                out.append(bytes(roce_frame(fields["op"], fields["payload"], ext=ext2,
                                            bth={"psn": fields["psn"], "dqpn": rb["dqpn"]},
                                            src_ip=SPOOF_IP)))
                done.append((fields["op"], fields["psn"]))
            else:
                out.append(f)
        return out
    peer.handle = handle
    return done


def _sends_of(b, qp, psn):
    return [t for q, _, p, t, _ in b.sent if q == qp and p == psn]


@pytest.mark.parametrize("width", WIDTHS)
def test_requester_drops_spoofed_ack(width):
    """The ACK of a SEND comes only from SPOOF_IP: the WR is not completed by it; it is
    retransmitted after the timeout and the peer's (genuine) re-ACK completes it."""
    from tests.hw.rdma.test_requester import SQ_PSN, Bench, check_outcome, wr
    b = Bench(width, seed=width + 182, timeout=10)
    spoofs = _spoof_first_response(b, 0, lambda op: op == O.ACKNOWLEDGE.value)
    wrs = [wr(0, 1, WrOp.SEND, 20, 0x100), wr(1, 2, WrOp.WRITE, 30, 0x200)]
    b.run(wrs, max_cycles=30_000)
    assert spoofs == [(O.ACKNOWLEDGE.value, SQ_PSN[0])]
    assert sorted(b.wcs) == [(0, 1, WcStatus.OK), (1, 2, WcStatus.OK)]
    assert len(_sends_of(b, 0, SQ_PSN[0])) == 2 and b.cnt_timeouts == 1
    assert b.cnt_src_mismatch == 1 and b.cnt_stale == 0 and b.qp_error == 0
    check_outcome(b, wrs, b.img)


@pytest.mark.parametrize("width", WIDTHS)
def test_requester_drops_spoofed_nak(width):
    """A spoofed remote-access NAK (would complete the WR in error and put the QP in error)
    replaces the genuine ACK: nothing happens until the retransmission is ACKed."""
    from tests.hw.rdma.test_requester import SQ_PSN, Bench, check_outcome, wr

    def nak(f):
        f["aeth"] = {"syndrome": 0x62, "msn": 0}
    b = Bench(width, seed=width + 183, timeout=10)
    spoofs = _spoof_first_response(b, 0, lambda op: op == O.ACKNOWLEDGE.value, nak)
    wrs = [wr(0, 1, WrOp.WRITE, 20, 0x100, rkey=0x1234)]
    b.run(wrs, max_cycles=30_000)
    assert spoofs == [(O.ACKNOWLEDGE.value, SQ_PSN[0])]
    assert b.wcs == [(0, 1, WcStatus.OK)] and b.events == [] and b.qp_error == 0
    assert len(_sends_of(b, 0, SQ_PSN[0])) == 2
    assert b.cnt_src_mismatch == 1
    check_outcome(b, wrs, b.img)


@pytest.mark.parametrize("width", WIDTHS)
def test_requester_drops_spoofed_read_response(width):
    """The first READ response comes only from SPOOF_IP with other data: nothing of it reaches
    memory and the READ completes (with the peer's data) only after its retransmission."""
    from tests.hw.rdma.test_requester import SQ_PSN, Bench, check_outcome, wr

    def garble(f):
        f["payload"] = bytes(0xEE for _ in f["payload"])
    b = Bench(width, seed=width + 184, timeout=10)
    is_rsp = lambda op: O.READ_RESPONSE_FIRST.value <= op <= O.READ_RESPONSE_ONLY.value  # noqa
    spoofs = _spoof_first_response(b, 1, is_rsp, garble)
    wrs = [wr(1, 7, WrOp.READ, 600, 0x4008), wr(0, 8, WrOp.READ, 40, 0x5000)]
    b.run(wrs, max_cycles=30_000)
    assert spoofs == [(O.READ_RESPONSE_FIRST.value, SQ_PSN[1])]
    assert sorted(b.wcs) == [(0, 8, WcStatus.OK), (1, 7, WcStatus.OK)]
    assert len(_sends_of(b, 1, SQ_PSN[1])) == 2 and b.cnt_timeouts == 1
    assert b.cnt_src_mismatch == 1 and b.qp_error == 0
    check_outcome(b, wrs, b.img)             # target memory holds the peer's data only


# ---- whole target: counters at their registers ----------------------------------------------

@pytest.mark.parametrize("width", [8])
def test_target_counters_over_gmii(width):
    """KbtpTarget in Amaranth's simulator: a spoofed WRITE and a spoofed ACK in over GMII are
    dropped and counted at REG_TRANSPORT (responder) and REQ_COUNTER_BASE (requester); the
    genuine WRITE after them is executed and ACKed on GMII."""
    from hw.target.target import (KbtpTarget, REQ_COUNTER_BASE, REQ_COUNTERS, RESP_COUNTERS)
    t_mac, t_ip = 0x020000000001, "10.0.0.1"
    dut = KbtpTarget(width, n_qp=2, mem_words=256, own_mac=t_mac, own_ip=ip_int(t_ip))
    tx = []
    data = b"genuine payload!" * 2

    def frm(src_ip, opcode, psn, ext=b"", payload=b""):
        return build_roce(mac_bytes(PEER_MAC), t_mac.to_bytes(6, "big"), src_ip, t_ip, 0xC000,
                          opcode=opcode, dest_qp=0x11, psn=psn, ackreq=1, ext=ext,
                          payload=payload)
    reth = pack(RETH, va=0x1000, rkey=0x77, dma_length=len(data))
    frames = [frm(SPOOF_IP, O.WRITE_ONLY.value, 5, reth, b"S" * len(data)),
              frm(SPOOF_IP, O.ACKNOWLEDGE.value, 99, pack(AETH, syndrome=0x1F, msn=0)),
              frm(PEER_IP, O.WRITE_ONLY.value, 5, reth, data)]

    async def bench(ctx):
        h = dut.host
        qp = dict(local_qpn=0x11, remote_qpn=0x22, peer_mac=int.from_bytes(
            mac_bytes(PEER_MAC), "big"), peer_ip=ip_int(PEER_IP), udp_sport=0xC001, pmtu=1,
            rq_psn=5, sq_psn=100, timeout=0)
        for off, (name, lo, bits) in sorted(QP_REGS.items()):
            if name != "state":
                await access(ctx, h, Space.REG, REG_QP + off, 1,
                             (qp.get(name, 0) >> lo) & ((1 << bits) - 1))
        await access(ctx, h, Space.REG, REG_QP, 1, QpState.RTS.value)
        mr = dict(qp_mask=1, rkey=0x77, va=0x1000, length=0x100, laddr=0x400)
        for off, (name, lo, bits) in MR_REGS.items():
            await access(ctx, h, Space.REG, REG_MR + off, 1, (mr[name] >> lo) & ((1 << bits) - 1))
        await access(ctx, h, Space.REG, REG_MR, 1, 0b0111)
        for f in frames:
            await gmii_drive(ctx, dut, gmii_wire(f))
        await ctx.tick().repeat(600)

        async def rd(addr):
            v, e = await access(ctx, h, Space.REG, addr, 0)
            assert not e
            return v
        resp = {n: await rd(REG_TRANSPORT + 4 * k) for k, n in enumerate(RESP_COUNTERS)}
        req = {n: await rd(REQ_COUNTER_BASE + 4 * k) for k, n in enumerate(REQ_COUNTERS)}
        assert REG_TRANSPORT + 4 * RESP_COUNTERS.index("cnt_src_mismatch") == 0x3030
        assert REQ_COUNTER_BASE + 4 * REQ_COUNTERS.index("cnt_src_mismatch") == 0x3114
        assert (resp["cnt_packets"], resp["cnt_src_mismatch"], resp["cnt_acks"]) == (2, 1, 1)
        assert (req["cnt_src_mismatch"], req["cnt_stale"]) == (1, 0)
        got = b"".join(ctx.get(dut.ram.mem.data[0x400 // 8 + i]).to_bytes(8, "little")
                       for i in range(len(data) // 8))
        assert got == data

    async def gmii_tx(ctx):
        async for *_, en, d in ctx.tick().sample(dut.tx_en, dut.txd):
            if en:
                tx.append(d)
    run_sim(dut, bench, [gmii_tx])
    wire = bytes(tx)
    # One frame went out: the ACK of PSN 5 to the genuine peer.
    assert wire.count(b"\x55" * 7 + b"\xd5") == 1
    body = wire[8:-4]
    assert body[0:6] == mac_bytes(PEER_MAC) and body[30:34] == ip_int(PEER_IP).to_bytes(4, "big")
    assert body[42] == O.ACKNOWLEDGE.value and int.from_bytes(body[50:54], "big") & PSN_MASK == 5


# ---- Python RoCE stack (roce/rc.py) ---------------------------------------------------------

def test_model_requester_drops_spoofed_ack():
    """RoceEndpoint (the rxe model): a spoofed ACK to one of its requester QPs completes
    nothing and is counted; the genuine one completes the SEND."""
    from roce.rc import RoceEndpoint, WcStatus as RcStatus
    ep = RoceEndpoint(PEER_MAC, PEER_IP, seed=1)
    ep.arp_table[ip_int(DUT_IP)] = mac_bytes(DUT_MAC)
    q = ep.create_qp(qpn=0x20, dest_qpn=DUT_QPN, remote_ip=DUT_IP, remote_mac=DUT_MAC,
                     pmtu=256, sq_psn=0x30, retry_cnt=7, rnr_retry=7, timeout=14)
    q.send(b"hello")
    assert len(ep.poll_tx()) == 1

    def ack(src_ip):
        return build_roce(mac_bytes(DUT_MAC), mac_bytes(PEER_MAC), src_ip, PEER_IP, 0xC000,
                          opcode=O.ACKNOWLEDGE.value, dest_qp=0x20, psn=0x30,
                          ext=pack(AETH, syndrome=0x1F, msn=1))
    before = ep.counters.not_for_us
    ep.receive_frame(ack(SPOOF_IP), 1)
    assert q.poll_cq() == [] and ep.counters.not_for_us == before + 1
    ep.receive_frame(ack(DUT_IP), 2)
    assert [c.status for c in q.poll_cq()] == [RcStatus.SUCCESS]


def test_driver_counters_show_source_drops():
    """``kbtp driver counters`` (KbtpDriver.counters) reports both source-check counters."""
    from tests.host.test_driver import World, run as run_async
    w = World(n_qp=2)
    w.fake.regs[REG_TRANSPORT + 0x30] = 3           # responder cnt_src_mismatch
    w.fake.regs[REG_TRANSPORT + 0x114] = 2          # requester cnt_src_mismatch
    t = run_async(w.drv.counters())["transport"]
    assert t["resp.cnt_src_mismatch"] == 3 and t["req.cnt_src_mismatch"] == 2
    assert t["resp.cnt_unknown_qp"] == 0 and "req.qp_error" in t

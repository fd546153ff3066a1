# Ref: docs/roce-layouts.md §7 (CM on QP1), §7.8 (Starting PSN direction), §8 (ARP),
#      §9 (C1 worked examples REQ/REP/RTU/DREQ/DREP). Oracle: the frames Linux rxe/rdma_cm sent in
#      capture C1 (rping, frames 1065-1129), parsed independently with scapy.
"""CM of roce.rc: our endpoint replaces either rping peer of capture C1 and must produce the same
CM messages rxe produced; then two Python endpoints connect and disconnect through CM."""

import struct

from scapy.layers.l2 import ARP, Ether

from sim.scapy_roce import dissect_roce
from tests.roce.test_rc_frames import C1, frames
from sim.channel import LossyLink, run
from roce.rc import QPState, RoceEndpoint
from roce.cm import REJ_INVALID_SERVICE_ID, decode_mad
from roce.frames import ip_int

MAC1, MAC2 = "52:54:00:00:00:01", "52:54:00:00:00:02"


def c1(n):
    """Frame n (1-based) of C1 (loaded once, shared with test_rc_frames)."""
    return frames(C1)[n - 1]


def test_c1_req_parsed_independently():
    """Our decoder reads C1#1065 as §9.1 does; scapy agrees on the carrier."""
    f = c1(1065)
    bth, exts, mad, _ = dissect_roce(f[42:])
    assert bth["opcode"] == 0x64 and bth["dqpn"] == 1 and exts["deth"]["qkey"] == 0x80010000
    hdr, req = decode_mad(mad)
    assert hdr["mgmt_class"] == 7 and hdr["attr_id"] == 0x10 and hdr["tid"] == 0x235317861
    # values from the raw octets of the capture (struct, not our layouts)
    cm = f[86:318]
    assert req["local_comm_id"] == struct.unpack(">I", cm[0:4])[0] == 0x61783135
    assert req["service_id"] == struct.unpack(">Q", cm[8:16])[0] == 0x0000000001061C06
    assert req["local_qpn"] == int.from_bytes(cm[32:35], "big") == 0x13
    assert req["starting_psn"] == int.from_bytes(cm[44:47], "big") == 0x5D19F1
    assert req["path_mtu"] == cm[50] >> 4 == 3
    assert req["primary_flow_label"] == 0xCA884                  # §10 item 1, not Wireshark's
    assert req["primary_local_ack_timeout"] == cm[95] >> 3 == 19
    assert req["retry_count"] == 7 and req["rnr_retry_count"] == 7
    assert req["private_data"][:20] == bytes.fromhex("0040ebc2") + bytes(12) + \
        bytes([10, 0, 0, 2])


def test_passive_side_answers_c1_req_like_rxe():
    """Target role (10.0.0.1): REP, then RTU in, SEND in -> ACK, DREQ in -> DREP; the
    octets from UDP to payload equal rxe's C1#1066 / #1069 / #1129."""
    t = RoceEndpoint(MAC1, "10.0.0.1")
    connected, msgs, gone = [], [], []
    t.listen(7174, on_connect=connected.append, on_disconnect=gone.append,
             qp_params=dict(qpn=0x13, epsn=0x785BBA,
                            on_message=lambda q, p, **kw: msgs.append(p)),
             local_comm_id=0xF6B33C06)
    t.receive_frame(c1(1065), 1)
    (rep,) = t.poll_tx()
    assert rep[:14] == c1(1066)[:14]                       # learnt the MAC from the REQ
    assert rep[34:-4] == c1(1066)[34:-4]
    qp = t.qps[0x13]
    # §7.7 / §7.8: target sends from the REQ's Starting PSN, expects the REP's
    assert qp.state == QPState.RTS and qp.sq_psn == 0x5D19F1 and qp.epsn == 0x785BBA
    assert qp.dest_qpn == 0x13 and qp.pmtu == 1024 and qp.timeout == 19
    assert qp.sport == 59574                               # from the REQ's flow label (§1.4)
    t.receive_frame(c1(1067), 2)                           # RTU
    assert connected == [qp]
    t.receive_frame(c1(1068), 3)                           # first RC SEND of the initiator
    (ack,) = t.poll_tx()
    assert ack[34:-4] == c1(1069)[34:-4]
    assert msgs == [c1(1068)[54:-4]]
    t.receive_frame(c1(1128), 4)                           # DREQ
    (drep,) = t.poll_tx()
    assert drep[34:-4] == c1(1129)[34:-4]
    assert gone == [qp] and qp.state == QPState.ERROR
    t.receive_frame(c1(1128), 5)                           # repeated DREQ: DREP again
    (drep2,) = t.poll_tx()
    assert drep2[54:-4] == c1(1129)[54:-4]


def test_active_side_sends_c1_req_like_rxe():
    """Initiator role (10.0.0.2): ARP request, REQ, RTU, first SEND, DREQ as in C1."""
    i = RoceEndpoint(MAC2, "10.0.0.2")
    i.cm.tid_hi = 2                                        # rxe's MAD agent TID high word
    up, down = [], []
    qp = i.connect("10.0.0.1", 7174, on_connect=up.append, on_disconnect=down.append,
                   src_port=60354, qp_params=dict(qpn=0x13, epsn=0x5D19F1),
                   local_comm_id=0x61783135, pmtu=1024, local_ack_timeout=19)
    assert qp.state == QPState.INIT
    (arp,) = i.poll_tx()
    a = Ether(arp)[ARP]
    assert a.op == 1 and a.pdst == "10.0.0.1" and a.psrc == "10.0.0.2" and a.hwsrc == MAC2
    assert Ether(arp).dst == "ff:ff:ff:ff:ff:ff"
    arp_reply = [f for f in frames(C1) if len(f) == 42 and f[21] == 2][0]
    i.receive_frame(arp_reply, 1)
    i.tick(2)
    (req,) = i.poll_tx()
    assert req[:14] == c1(1065)[:14]
    assert req[34:-4] == c1(1065)[34:-4]                   # whole REQ incl. IP CM header
    i.receive_frame(c1(1066), 3)                           # REP
    (rtu,) = i.poll_tx()
    assert rtu[34:-4] == c1(1067)[34:-4]
    assert up == [qp] and qp.state == QPState.RTS
    assert qp.sq_psn == 0x785BBA and qp.epsn == 0x5D19F1   # initiator sends from REP's PSN
    assert qp.timeout == 19 and qp.sport == 59574
    qp.send(c1(1068)[54:-4])
    (send,) = i.poll_tx()
    assert send[34:-4] == c1(1068)[34:-4]
    i.receive_frame(c1(1069), 4)
    i.disconnect(qp)
    (dreq,) = i.poll_tx()
    assert dreq[34:-4] == c1(1128)[34:-4]
    i.receive_frame(c1(1129), 5)
    assert down == [qp] and i.cm.conns[0].state == "TIMEWAIT"
    i.tick(5 + 2_048_000)                                  # 2^(19-8) ms of TIMEWAIT
    assert i.cm.conns == []


def _pair(seed, **link):
    a = RoceEndpoint("02:00:00:00:01:01", "10.1.0.1", seed=seed)
    b = RoceEndpoint("02:00:00:00:01:02", "10.1.0.2", seed=seed + 100)
    return a, b, LossyLink(seed, **link)


def test_two_endpoints_connect_and_disconnect():
    a, b, link = _pair(1)
    got, up_b, down_b = [], [], []
    b.listen(18515, on_connect=up_b.append, on_disconnect=down_b.append,
             qp_params=dict(on_message=lambda q, p, **kw: got.append(p)), target_ack_delay=0)
    up_a = []
    qa = a.connect("10.1.0.2", on_connect=up_a.append, local_ack_timeout=8)
    run(a, b, link=link, until=lambda: up_a and up_b)
    qb = up_b[0]
    assert qa.dest_qpn == qb.qpn and qb.dest_qpn == qa.qpn
    assert qa.sq_psn == qb.epsn and qb.sq_psn == qa.epsn and qa.sport == qb.sport
    qa.send(b"ping")
    qb.send(b"pong")
    got_a = []
    qa.on_message = lambda q, p, **kw: got_a.append(p)
    run(a, b, link=link, until=lambda: got and got_a and not qa.outstanding
        and not qb.outstanding)
    assert got == [b"ping"] and got_a == [b"pong"]
    a.disconnect(qa)
    run(a, b, link=link, until=lambda: not a.cm.conns and not b.cm.conns)
    assert down_b == [qb] and qa.state == qb.state == QPState.ERROR


def test_connect_over_lossy_link_and_unknown_service():
    """REQ/REP/RTU/DREQ survive loss (MAD retransmission, RTU loss covered by RC traffic);
    a REQ to a port nobody listens on is rejected with reason 8."""
    resent = 0
    for seed in range(4):
        a, b, link = _pair(10 + seed, loss=0.3, dup=0.1)
        ups = []
        b.listen(18515, on_connect=ups.append, target_ack_delay=0)
        qa = a.connect("10.1.0.2", on_connect=ups.append, local_ack_timeout=8)
        qa.send(b"x")
        run(a, b, link=link, until=lambda: len(ups) == 2 and not qa.outstanding,
            max_us=400_000_000)
        a.disconnect(qa)
        run(a, b, link=link, until=lambda: not a.cm.conns and not b.cm.conns,
            max_us=400_000_000)
        assert qa.state == QPState.ERROR and ups[0].state == QPState.ERROR
        resent += a.counters.cm_retransmissions + b.counters.cm_retransmissions
    assert resent > 0                                      # the loss did hit CM messages
    a, b, link = _pair(3)
    rej = []
    qa = a.connect("10.1.0.2", 9999, on_reject=lambda q, r: rej.append(r))
    run(a, b, link=link, until=lambda: rej)
    assert rej == [REJ_INVALID_SERVICE_ID] and qa.state == QPState.ERROR
    assert ip_int("10.1.0.2") in a.arp_table


def _deliver(src, dst, t, drop=lambda f: False):
    n = 0
    for f in src.poll_tx():
        if not drop(f):
            dst.receive_frame(f, t)
            n += 1
    return n


def test_lost_rtu_first_rc_packet_establishes_and_padding():
    """§7.10 step 4: the target accepts RC traffic once the REP is out; the first RC packet
    stands in for a lost RTU. Both ends pad to 60 octets (a real link) and still interwork."""
    a = RoceEndpoint("02:00:00:00:03:01", "10.3.0.1", seed=5, min_frame=60)
    b = RoceEndpoint("02:00:00:00:03:02", "10.3.0.2", seed=6, min_frame=60)
    ups, got = [], []
    b.listen(18515, on_connect=ups.append,
             qp_params=dict(on_message=lambda q, p, **kw: got.append(p)))
    qa = a.connect("10.3.0.2")
    is_rtu = lambda f: f[42] == 0x64 and decode_mad(f[62:318])[0]["attr_id"] == 0x14  # noqa
    for t in range(1, 8):
        _deliver(a, b, t, drop=is_rtu)
        _deliver(b, a, t)
        a.tick(t)
        b.tick(t)
    assert qa.state == QPState.RTS and ups == [] and b.cm.conns[0].state == "REP_SENT"
    qa.send(b"")                                           # zero-length SEND Only: 58 octets
    sent = a.poll_tx()
    assert [len(f) for f in sent] == [60]                  # padded; ICRC found via lengths
    for f in sent:
        b.receive_frame(f, 9)
    assert len(ups) == 1 and got == [b""] and b.cm.conns[0].state == "ESTABLISHED"
    _deliver(b, a, 10)
    assert qa.poll_cq()[0].status.name == "SUCCESS"

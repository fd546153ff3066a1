# Ref: docs/roce-layouts.md §1-§6 (framing, ICRC, PSN/ACK rules), §0.2 captures C2/C3;
#      docs/softroce-vm.md. Oracles: scapy (Ether/IP/UDP/BTH, ICRC), and bytes that
#      Linux rxe and the hand-written peer put on the wire in the captures.
"""roce.rc framing against scapy, and the endpoint replayed against the rxe captures C2 / C3.

Replay: our endpoint takes the place of one side of capture C2 (rxe 10.0.0.1 QP 0x11 <->
hand-written peer 10.0.0.2 QP 0xABC), is fed the other side's frames, and must answer with the
same octets from the UDP header to the end of the payload (IP ID and hence IP checksum / ICRC
differ by design, §5.4).
"""

from sim.paths import DATA_DIR
import random
from pathlib import Path

import pytest
from scapy.all import rdpcap
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import ARP, Ether

from sim.scapy_roce import dissect_roce, icrc_of
from sim.channel import LossyLink, run
from roce.rc import RoceEndpoint, WcStatus, rxe_udp_sport
from roce.frames import FrameError, parse_frame

DATA = DATA_DIR
C1 = DATA / "rxe-two-guests-pingpong-rping.pcap"
C2 = DATA / "rxe-vs-host-peer-send-write-read-atomic.pcap"
C3 = DATA / "rxe-retransmit-after-drop.pcap"
RXE_MAC, PEER_MAC = "52:54:00:00:00:01", "52:54:00:00:00:02"


_CACHE = {}


def frames(path):
    """Frames of a capture (rdpcap once per file: it is the slow part)."""
    if path not in _CACHE:
        _CACHE[path] = [bytes(p) for p in rdpcap(str(path))]
    return _CACHE[path]


def check_with_scapy(frame):
    """Assert scapy agrees with the frame: ICRC, IPv4 checksum, lengths, PadCnt."""
    p = Ether(frame)
    if p.type == 0x0806:
        a = p[ARP]
        assert a.hwtype == 1 and a.ptype == 0x0800 and a.op in (1, 2)
        return "arp"
    ip = p[IP]
    rebuilt = IP(bytes(ip))
    del rebuilt.chksum
    assert IP(bytes(rebuilt)).chksum == ip.chksum, "IPv4 header checksum"
    assert ip.flags == "DF" and ip.ttl == 64 and ip.len == len(frame) - 14
    assert p[UDP].dport == 4791 and p[UDP].chksum == 0 and p[UDP].len == ip.len - 20
    assert 0xC000 <= p[UDP].sport <= 0xFFFF
    assert icrc_of(frame) == frame[-4:], "ICRC differs from scapy's"
    bth, exts, payload, _ = dissect_roce(frame[42:])
    assert bth["padcount"] == (-len(payload)) % 4
    assert bth["pkey"] == 0xFFFF and bth["version"] == 0
    return bth["opcode"]


def test_all_capture_frames_parse_with_icrc_ok():
    n = 0
    for path in (C1, C2, C3):
        for f in frames(path):
            try:
                kind, pkt = parse_frame(f)
            except FrameError as e:      # pragma: no cover - would be a failure
                pytest.fail(f"{path.name}: {e}")
            if kind == "roce":
                n += 1
                if path != C1 or n % 16 == 0:     # scapy's ICRC is slow: sample the big one
                    assert icrc_of(f) == f[-4:]   # scapy agrees the capture is valid
    assert n == 1133                              # roce-layouts.md §0.2 count


def test_bad_icrc_and_checksums_are_rejected():
    f = frames(C2)[6]                             # peer SEND Only
    kind, _ = parse_frame(f)
    assert kind == "roce"
    bad = bytearray(f)
    bad[-6] ^= 0x01                               # payload bit: only the ICRC can tell
    with pytest.raises(FrameError) as e:
        parse_frame(bytes(bad))
    assert e.value.kind == "icrc"
    bad = bytearray(f)
    bad[22] ^= 0x01                               # TTL: masked in ICRC, IP checksum catches
    with pytest.raises(FrameError) as e:
        parse_frame(bytes(bad))
    assert e.value.kind == "ip_checksum"
    bad = bytearray(f)
    bad[46] ^= 0x80                               # BTH FECN: masked everywhere, harmless
    assert parse_frame(bytes(bad))[0] == "roce"


def _pattern(n):
    return bytearray((3 + 7 * i) & 0xFF for i in range(n))


def _peer_endpoint(msgs):
    """Our endpoint in the role of the C2 hand-written peer (10.0.0.2, QP 0xABC)."""
    ep = RoceEndpoint(PEER_MAC, "10.0.0.2")
    qp = ep.create_qp(qpn=0xABC, dest_qpn=0x11, remote_ip="10.0.0.1", remote_mac=RXE_MAC,
                      sq_psn=0x200, epsn=0x100, pmtu=1024, sport=55996,
                      on_message=lambda q, p, imm=None, invalidated_rkey=None: msgs.append(p))
    mem = _pattern(8192)
    ep.register(mem, 0x10000000, 0x1234, atomic=True)
    return ep, qp, mem


def test_c2_replay_as_responder_matches_peer_bytes():
    """Feed rxe's requests of C2; our responses equal the accepted peer's, octet for octet."""
    c2 = frames(C2)
    msgs = []
    ep, qp, mem = _peer_endpoint(msgs)
    # (rxe request frame numbers) -> (peer answer frame numbers), 1-based as in the page
    steps = [((11,), (12,)), ((13,), (14,)), ((15,), (16, 17)), ((18,), (19,)),
             ((20,), (21,)), ((22,), (23,))]
    t = 0
    for reqs, answers in steps:
        for r in reqs:
            t += 100
            ep.receive_frame(c2[r - 1], t)
        out = ep.poll_tx()
        assert len(out) == len(answers)
        for mine, n in zip(out, answers):
            theirs = c2[n - 1]
            assert mine[:14] == theirs[:14]
            assert mine[26:34] == theirs[26:34]          # IP addresses
            assert mine[34:-4] == theirs[34:-4], f"answer to frame {reqs} differs from #{n}"
            check_with_scapy(mine)
    assert msgs == [c2[10][54:-4]]                        # the guest's SEND payload
    wr = parse_frame(c2[12])[1]
    assert bytes(mem[0x800:0x840]) == wr.payload          # the WRITE landed
    # FetchAdd +5 then CmpSwap(compare old+5 -> swap): memory holds the swap value, LE
    assert int.from_bytes(mem[0x1000:0x1008], "little") == 0x1122334455667788
    assert ep.counters.rkey_errors == 1 and ep.counters.naks_sent == 1
    assert qp.state.name == "ERROR"                       # NAK 0x62 is fatal (§6.5)


def test_c2_replay_as_rxe_requester_and_responder():
    """Our endpoint as rxe: its ACKs and its requests equal rxe's own frames in C2."""
    c2 = frames(C2)
    ep = RoceEndpoint(RXE_MAC, "10.0.0.1")
    host = bytearray(8192)
    ep.register(host, 0x1DDA5800, 0x25F)
    qp = ep.create_qp(qpn=0x11, dest_qpn=0xABC, remote_ip="10.0.0.2", remote_mac=PEER_MAC,
                      sq_psn=0x100, epsn=0x200, pmtu=1024)
    assert qp.sport == 63102 == rxe_udp_sport(0x11, 0xABC)   # §1.4, rxe's own choice
    for req, ack in ((7, 9), (8, 10)):
        ep.receive_frame(c2[req - 1], 10)
        (mine,) = ep.poll_tx()
        assert mine[34:-4] == c2[ack - 1][34:-4]
    assert bytes(host[:32]) == parse_frame(c2[7])[1].payload
    # rxe's six requests, rebuilt from the verbs the guest posted
    send = parse_frame(c2[10])[1].payload
    write = parse_frame(c2[12])[1]
    qp.send(send)
    qp.write(0x10000800, 0x1234, write.payload)
    rd_into = bytearray(2048)
    qp.read(0x10000100, 0x1234, 2048, into=rd_into)
    qp.fetch_add(0x10001000, 0x1234, 5)
    qp.cmp_swap(0x10001000, 0x1234, compare=0x342D261F18110A08, swap=0x1122334455667788)
    qp.write(0x10000000, 0x0000DEAD, parse_frame(c2[21])[1].payload)
    out = ep.poll_tx()
    assert [f[34:-4] for f in out] == [c2[n - 1][34:-4] for n in (11, 13, 15, 18, 20, 22)]
    for f in out:
        check_with_scapy(f)
    for n in (12, 14, 16, 17, 19, 21, 23):
        ep.receive_frame(c2[n - 1], 1000 + n)
    cq = qp.poll_cq()
    assert [c.status for c in cq] == [WcStatus.SUCCESS] * 5 + [WcStatus.REM_ACCESS_ERR]
    assert cq[2].data == parse_frame(c2[15])[1].payload + parse_frame(c2[16])[1].payload
    assert bytes(rd_into) == cq[2].data
    assert cq[3].orig == 0x342D261F18110A03 and cq[4].orig == 0x342D261F18110A08
    assert qp.state.name == "ERROR" and ep.counters.naks_received == 1


def test_c3_timeout_retransmission_identical_from_udp_on():
    """C3: rxe resent a dropped READ / FetchAdd byte-identical from UDP to payload (§6.7)."""
    c3 = frames(C3)
    ep = RoceEndpoint(RXE_MAC, "10.0.0.1")
    qp = ep.create_qp(qpn=0x11, dest_qpn=0xABC, remote_ip="10.0.0.2", remote_mac=PEER_MAC,
                      sq_psn=0x102, epsn=0x200, pmtu=1024, timeout=17)
    rd = parse_frame(c3[12])[1].ext["reth"]
    qp.read(rd["va"], rd["rkey"], rd["dma_length"])
    (first,) = ep.poll_tx()
    assert first[34:-4] == c3[12][34:-4]                  # the request that got dropped
    ep.tick(536_000)                                      # 4.096 us * 2^17 = 536.9 ms
    assert ep.poll_tx() == []
    ep.tick(537_000)
    (again,) = ep.poll_tx()
    assert again[34:-4] == c3[15][34:-4] == first[34:-4]  # #16 is rxe's retransmission
    assert again[18:20] != first[18:20] and again[-4:] != first[-4:]   # new IP ID -> new ICRC
    assert icrc_of(again) == again[-4:]
    assert ep.counters.retransmissions == 1


def _mixed_traffic(seed):
    """Two endpoints exchanging every opcode the endpoint can send, plus ARP and CM."""
    a = RoceEndpoint("02:00:00:00:00:0a", "192.168.7.1", seed=seed)
    b = RoceEndpoint("02:00:00:00:00:0b", "192.168.7.2", seed=seed + 1)
    mem = bytearray(64 * 1024)
    b.register(mem, 0x4000, 0x77, atomic=True)
    b.register(bytearray(64), 0x90000, 0x99)
    got = []
    b.listen(4000, qp_params=dict(on_message=lambda q, p, **kw: got.append((p, kw))),
             target_ack_delay=0)
    qa = a.connect("192.168.7.2", 4000, pmtu=256, local_ack_timeout=10)
    link = LossyLink(seed, delay_us=3)
    run(a, b, link=link, until=lambda: qa.state.name == "RTS" and b.cm.conns[0].state
        == "ESTABLISHED", log=True)
    rng = random.Random(seed)
    for n in (0, 1, 2, 3, 255, 256, 257, 511, 1029):
        qa.send(rng.randbytes(n))
    qa.send(b"imm", imm=0xABCD)
    qa.send(rng.randbytes(300), imm=7)
    qa.send(b"inv!", inv_rkey=0x99)
    qa.write(0x4000, 0x77, rng.randbytes(777))
    qa.write(0x4400, 0x77, rng.randbytes(13), imm=0x1234)
    qa.write(0x4800, 0x77, rng.randbytes(513), imm=0x4321)
    qa.read(0x4000, 0x77, 777)
    qa.read(0x4000, 0x77, 3)
    qa.read(0x4000, 0x77, 0)
    qa.fetch_add(0x5000, 0x77, 3)
    qa.cmp_swap(0x5000, 0x77, 3, 9)
    qa.write(0x4000, 0x1, b"bad key")          # NAK remote access, too
    run(a, b, link=link, until=lambda: qa.outstanding == 0, log=True)
    a.disconnect(qa)
    run(a, b, link=link, until=lambda: not a.cm.conns and not b.cm.conns, log=True)
    return link, got, qa


def test_every_emitted_frame_passes_scapy():
    link, got, qa = _mixed_traffic(5)
    seen = set()
    for _, _, f in link.log:
        seen.add(check_with_scapy(f))
    # every request / response opcode the endpoint generates went through the oracle
    expected = {0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B, 0x0C,
                0x0D, 0x0E, 0x0F, 0x10, 0x11, 0x12, 0x13, 0x14, 0x17, 0x64, "arp"}
    assert expected <= seen, expected - seen
    assert len(got) == 14
    assert [kw["invalidated_rkey"] for _, kw in got].count(0x99) == 1
    assert [kw["imm"] for _, kw in got][9:] == [0xABCD, 7, None, 0x1234, 0x4321]
    cq = qa.poll_cq()
    assert cq[-1].status == WcStatus.REM_ACCESS_ERR
    assert all(c.status == WcStatus.SUCCESS for c in cq[:-1])

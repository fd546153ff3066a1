# Ref: roce-layouts.md §8 (ARP the endpoint must answer); RFC 826; C1 capture frames #5/#6.
"""ArpResponder: replies byte-equal to the reply scapy builds; everything else ignored."""

from sim.paths import DATA_DIR
import pytest
from scapy.layers.l2 import ARP, Ether

from hw.net.arp import ArpResponder
from sim.hdl import packet_to_beats, run_through, split_packets
from sim.scapy_roce import seeded

OWN_MAC_S, OWN_IP_S = "52:54:00:00:00:01", "10.0.0.1"
OWN_MAC, OWN_IP = 0x525400000001, 0x0A000001


def expected_reply(req):
    """The reply scapy builds for a request: to the asker, from us, operation 2."""
    a = Ether(req)[ARP]
    return bytes(Ether(dst=a.hwsrc, src=OWN_MAC_S) /
                 ARP(op=2, hwsrc=OWN_MAC_S, psrc=OWN_IP_S, hwdst=a.hwsrc, pdst=a.psrc))


def make_requests(rng):
    cases = []
    for k in range(16):
        asker_mac = "02:%02x:%02x:%02x:%02x:%02x" % tuple(rng.getrandbits(8) for _ in range(5))
        asker_ip = "10.0.%d.%d" % (rng.randrange(256), rng.randrange(1, 255))
        kind = rng.choice(["answer", "answer", "answer_unicast", "other_ip", "reply",
                           "other_mac", "not_arp", "short"])
        edst = {"answer_unicast": OWN_MAC_S, "other_mac": "52:54:00:00:00:99"}.get(
            kind, "ff:ff:ff:ff:ff:ff")
        f = bytes(Ether(dst=edst, src=asker_mac) /
                  ARP(op=2 if kind == "reply" else 1, hwsrc=asker_mac, psrc=asker_ip,
                      pdst="10.0.0.77" if kind == "other_ip" else OWN_IP_S))
        if kind == "not_arp":
            f = f[:12] + b"\x08\x00" + f[14:]
        if kind == "short":
            f = f[:rng.randrange(20, 42)]
        if rng.random() < 0.5 and kind != "short":
            f += bytes(18)                      # Ethernet padding to 60 octets
        cases.append((kind, f))
    return cases


def test_capture_request_reply():
    """C1#5 (request from 10.0.0.2) is answered with the bytes rxe's peer sent in C1#6."""
    from scapy.utils import rdpcap
    frames = [bytes(p) for p in rdpcap(str(DATA_DIR / "rxe-two-guests-pingpong-rping.pcap"),
                                       count=8)]
    req, rep = frames[4], frames[5]
    assert Ether(req)[ARP].op == 1 and Ether(rep)[ARP].op == 2
    got = _run(8, [("answer", req)], 0, 0)[0]
    assert got == [rep[:42]]


def _run(width, cases, idle, stall):
    rng = seeded(width + int(idle * 10))
    dut = ArpResponder(width)
    beats = [beat for _, f in cases for beat in packet_to_beats(f, width)]
    out, cnt = run_through(dut, beats, {"o": dut.o}, settle=150, idle=idle, stall=stall,
                           rng=rng, counters=("answered", "ignored"),
                           setup=[(dut.own_mac, OWN_MAC), (dut.own_ip, OWN_IP)])
    return [p for p, _ in split_packets(out["o"], width)], cnt


@pytest.mark.parametrize("width", [8, 64])
@pytest.mark.parametrize("idle,stall", [(0.0, 0.0), (0.3, 0.3)])
def test_arp_responder(width, idle, stall):
    cases = make_requests(seeded(3))
    replies, cnt = _run(width, cases, idle, stall)
    expect = [expected_reply(f) for kind, f in cases if kind.startswith("answer")]
    assert replies == expect
    assert cnt == {"answered": len(expect), "ignored": len(cases) - len(expect)}
    assert 0 < len(expect) < len(cases)

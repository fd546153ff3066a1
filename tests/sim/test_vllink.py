# Ref: issue 23 (the UDP host link shipped; frees at the rate of allocations); sim/vllink.py;
#      sim/system.py (VlSystemBench, round matching against the golden model, block_census);
#      sim/serve_hw.py (--host-link udp); boards/cores.py KbtpCore (udp_link=True).
"""The host driver over the UDP host link on the shipped core (Verilated), against the model.

:class:`sim.vllink.VlUdpSystemBench` on ``VlTarget(SHIPPED)``: the link brought up over the
direct host bus, then everything the driver does (init, QPs, HELLOs, FREEs) goes as UDP
datagrams through the target's GMII. Random rounds and FREE rounds are matched to the golden
model (:meth:`SystemBench.round`), then the memory image and counters
(:func:`sim.system.mixed_checks`) and the block census; the same over a link that loses,
corrupts and duplicates frames both ways (:class:`sim.vllink.VlUdpTransport`'s impairments:
issue 23's loss test), with every datagram accounted for. Also ``kbtp-sim serve``'s gateware
backend with ``host_link="udp"``: initialised over the link while an ARP request from the
socket is answered to the socket and no link datagram leaks there.
"""

import asyncio
import socket

import pytest

from sim.system import block_census, mixed, mixed_checks, run_sync
from sim.vltarget import SHIPPED, VlTarget
from tests.sim.test_serve_hw import free_port

pytestmark = pytest.mark.xdist_group("shipped")


@pytest.fixture(scope="module")
def built():
    from sim.vltarget import build, board_params
    assert board_params("ecpix5")["udp_link"], "the shipped core has no UDP host link"
    build(SHIPPED)


async def _free_rounds(b, stats, rounds=4):
    """FREE rounds: every bound handle of every initiator, one per initiator per round,
    matched to the model; the number of FREE requests."""
    frees = 0
    for _ in range(rounds):
        batch = []
        for q in range(b.n_init):
            s = b.model.session_of(b.conns[q])
            if any(b.model.read_entry(h)["flags"] & 1
                   for h in range(s.handle_base, s.handle_base + s.handle_count)):
                batch.append((q, b.free_request(q)))
                b.slow_sent += 1
        if not batch:
            break
        await b.round(batch, stats)
        frees += len(batch)
        stats["requests"] += len(batch)
    return frees


def _census(b, vt):
    """The block census of the target's memory: nothing lost or duplicated."""
    c = block_census(b.model, vt.mem_read)
    assert c["lost"] == 0 and c["duplicated"] == 0, c
    assert c["in_rings"] + c["in_table"] + c["pending"] == c["blocks"], c
    return {k: v for k, v in c.items() if k != "where"}


def test_driver_over_udp_link_matches_model(built):
    from sim.vllink import VlUdpSystemBench
    with VlTarget(SHIPPED) as vt:
        b = VlUdpSystemBench(vt, n_init=2, seed=11)
        run_sync(b.bring_up())
        up = dict(b.udplink.stats)
        assert up["exchanges"] > 10 and up["timeouts"] == 0
        stats = run_sync(mixed(b, rounds=6))
        frees = run_sync(_free_rounds(b, stats))
        figs = run_sync(mixed_checks(b, stats))
        c = _census(b, vt)
        link, tr = b.udplink.stats, b.transport.stats
        assert link["timeouts"] == 0 and link["retransmits"] == 0 and link["bad"] == 0, link
        # every exchange was a datagram executed by the target's link (the sync answered too)
        cnt = b.transport.counters()
        assert cnt["executed"] == link["exchanges"] and cnt["sync"] == link["syncs"], cnt
        assert cnt["crc_errors"] == 0 and cnt["bus_errors"] == 0 and cnt["bad_src"] == 0, cnt
        assert tr["datagrams_in"] == link["datagrams_in"], (tr, link)
        print(f"\ndriver over the UDP link: {figs['rounds']} rounds, {frees} FREE rounds' "
              f"requests; link {link}; census {c}")


#: Issue 23's loss test: 5 % of the link's frames lost and 5 % corrupted, each way, and 2 %
#: duplicated (seeded: the same run every time).
LOSSY = dict(loss=0.05, corrupt=0.05, dup=0.02, seed=5)
#: The link's timeout per attempt for the loss test, simulated: about twice the longest round
#: trip of the run (a datagram of 64-word writes into the DDR3: ~39,000 GMII cycles, 0.31 ms;
#: 30,000 into block RAM), so a lost frame costs 0.8 ms of simulated time (100,000 cycles).
LOSSY_TIMEOUT_S = 0.0008
#: A round's wait in the loss test: 20 lost host-link frames (the driver's accesses of one
#: round can meet several at 5 % loss and 5 % corruption each way; 300,000 cycles, the
#: default, held 3 and timed out on some seeds).
LOSSY_ROUND_CYCLES = 2_000_000


def test_driver_over_lossy_udp_link_matches_model(built):
    """The driver over a link losing, corrupting and duplicating frames both ways: the same
    random and FREE rounds match the model, the memory image and counters equal the model's,
    no block is lost or duplicated; the impairments bit (retransmissions, the target's
    ``bad_csum`` and ``duplicate``) and every datagram is accounted for."""
    from sim.vllink import VlUdpSystemBench
    with VlTarget(SHIPPED) as vt:
        b = VlUdpSystemBench(vt, n_init=2, seed=11, transport_kw=LOSSY,
                             link_kw=dict(timeout=LOSSY_TIMEOUT_S))
        b.round_cycles = LOSSY_ROUND_CYCLES
        run_sync(b.bring_up())
        stats = run_sync(mixed(b, rounds=60))
        frees = run_sync(_free_rounds(b, stats, rounds=8))
        figs = run_sync(mixed_checks(b, stats))
        c = _census(b, vt)
        link, tr = b.udplink.stats, b.transport.stats
        cnt = b.transport.counters()
        imp = {k: tr[k] for k in ("lost_out", "corrupted_out", "duplicated_out", "lost_in",
                                  "corrupted_in", "duplicated_in", "ignored", "rtt_max_cycles")}
        print(f"\ndriver over the lossy UDP link: {figs['rounds']} rounds, {frees} FREE "
              f"rounds' requests; impairments {imp}; link {link}; target {cnt}; census {c}")
        # The impairments happened, both ways, and the link recovered from all of them.
        assert all(tr[k] for k in ("lost_out", "corrupted_out", "lost_in", "corrupted_in")), tr
        assert link["retransmits"] > 0 and link["timeouts"] == 0, link
        assert tr["rtt_max_cycles"] < LOSSY_TIMEOUT_S * vt.params["mac_hz"] / 2, tr
        # Requests: every corrupted one was dropped by the target's checks (none reached the
        # engine: no CRC error), every other one that arrived was executed once, answered from
        # the kept response, or dropped by the sequence rules.
        assert cnt["bad_csum"] > 0 and cnt["duplicate"] > 0, cnt
        assert cnt["bad_csum"] + cnt["bad_src"] + cnt["malformed"] <= tr["corrupted_out"], cnt
        assert cnt["crc_errors"] == 0 and cnt["bus_errors"] == 0, cnt
        arrived = tr["datagrams_out"] - tr["lost_out"] + tr["duplicated_out"] - tr["corrupted_out"]
        assert (cnt["executed"] + cnt["duplicate"] + cnt["sync"] + cnt["bad_seq"]
                + cnt["overrun"]) == arrived, (cnt, tr)
        assert cnt["executed"] == link["exchanges"], (cnt, link)
        # Responses: every corrupted one was dropped by the host's kernel checks, so the link
        # saw no malformed datagram; the rest reached it (stale ones: duplicates).
        assert cnt["tx_datagrams"] == cnt["executed"] + cnt["duplicate"] + cnt["sync"], cnt
        assert tr["ignored"] == tr["corrupted_in"] and link["bad"] == 0, (tr, link)
        assert tr["datagrams_in"] == (cnt["tx_datagrams"] - tr["lost_in"] + tr["duplicated_in"]
                                      - tr["corrupted_in"]), (tr, cnt)
        assert link["datagrams_in"] + len(b.transport.inbox) == tr["datagrams_in"], (tr, link)
        assert link["stale"] > 0, link


def test_serve_hw_over_udp_host_link(built):
    from scapy.layers.l2 import ARP, Ether

    from sim.serve_hw import Served
    from sim.vllink import HOST_MAC
    t_port = free_port()
    peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    peer.bind(("127.0.0.1", 0))
    peer.settimeout(0.0)
    mac, ip = "02:4b:42:54:50:01", "10.0.0.2"
    opts = dict(mac=mac, ip=ip, port=18515, listen=["127.0.0.1", t_port],
                peer=list(peer.getsockname()), quiet=True, hw="ecpix5", host_link="udp")
    s = Served(opts)
    try:
        asyncio.run(s.start())
        st = dict(s.udplink.stats)
        assert st["exchanges"] > 5 and st["timeouts"] == 0, st
        # An ARP request from the network goes in and its reply out, also while the driver's
        # own accesses run the simulation (a driver poll over the link).
        req = bytes(Ether(dst="ff:ff:ff:ff:ff:ff", src="02:00:00:00:00:07")
                    / ARP(op=1, hwsrc="02:00:00:00:00:07", psrc="10.0.0.7", pdst=ip))
        peer.sendto(req, ("127.0.0.1", t_port))
        got = []
        for _ in range(200):
            asyncio.run(s.driver.poll())
            s._out(s.vl.run(512))
            try:
                while True:
                    got.append(peer.recv(65536))
            except (BlockingIOError, socket.timeout):
                pass
            if got:
                break
        assert got, "no ARP reply on the socket"
        arp = [Ether(g) for g in got if Ether(g).type == 0x0806]
        assert arp and arp[0][ARP].op == 2 and arp[0][ARP].psrc == ip
        assert all(Ether(g).dst != HOST_MAC for g in got), "a link datagram reached the socket"
        assert s.udplink.stats["exchanges"] > st["exchanges"]
        assert s.transport.counters()["executed"] == s.udplink.stats["exchanges"]
    finally:
        s.srv.stop()
        s.vl.close()
        peer.close()

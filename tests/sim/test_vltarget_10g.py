# Ref: issue 21 item 4 (10 Gb/s in simulation); IEEE 802.3 clause 46 (XGMII: /S/ in lane 0 or
#      4, /T/, §46.3.1.4 deficit idle count), §4.4.2 (IFG 12 octets); RFC 826 (ARP);
#      sim/vltarget.py XGMII_10G; sim/vl/harness.cpp (KBTP_XGMII); hw/target/xgmii_target.py.
"""The 10 Gb/s configuration in the Verilator harness: XgmiiKbtpTarget (KbtpTarget at width 64
behind the XGMII MAC, hw/target/xgmii_target.py), one 156.25 MHz clock, its XGMII pins driven by
the C++ harness (counts in octet times, 8 per clock cycle). ARP answered (scapy builds the
request and parses the reply), frames back to back at line rate in both directions (every /S/ in
lane 0 or 4, gaps of 9 to 15 octets that average 12: the deficit idle count), a bad FCS dropped
and counted, and an RC exchange of KBTP requests through the host driver checked against the
golden model."""

import pytest
from scapy.layers.l2 import ARP, Ether

from host.port import TargetPort
from hw.iface import REG_TOP, Space
from hw.target.regbank import TOP_COUNTER_BASE
from hw.target.target import TOP_COUNTERS
from sim.system import P_IP, P_MAC, T_IP, T_MAC, VlSystemBench, mixed, mixed_checks, run_sync
from sim.vltarget import XGMII_10G, XGMII_TICKS, VlTarget


@pytest.fixture
def vt():
    t = VlTarget(XGMII_10G)     # one build for all (cached); a fresh process from reset per test
    yield t
    t.close()


def _mac(i):
    return f"02:00:00:01:{i >> 8:02x}:{i & 0xFF:02x}"


def _arp(i=None, pad=60):
    src = P_MAC if i is None else _mac(i)
    return bytes(Ether(dst="ff:ff:ff:ff:ff:ff", src=src)
                 / ARP(op=1, hwsrc=src, psrc=P_IP, pdst=T_IP)).ljust(pad, b"\0")


def _top(vt, name):
    k = TOP_COUNTERS.index(("mac", name))
    rdata, err = vt.access(Space.REG, REG_TOP + TOP_COUNTER_BASE + 4 * k, 0, 0)
    assert not err
    return rdata


def test_fmax_build_is_the_simulated_configuration():
    """``make fmax-10g`` (boards/xgmii10g.py) builds what this simulates, but for its memory
    (block RAM an ECP5 holds) and its timers (real time)."""
    from boards.xgmii10g import FMAX_KWARGS, MEM_WORDS
    from sim.vltarget import HW_DEFAULT, config_params
    sim = {**HW_DEFAULT, **config_params("10g")}
    assert {k: v for k, v in sim.items() if k not in ("mem_words", "timer_scale")} == {
        k: v for k, v in FMAX_KWARGS.items() if k != "mem_words"}
    assert FMAX_KWARGS["mem_words"] == MEM_WORDS and "timer_scale" not in FMAX_KWARGS


def test_arp_over_xgmii(vt):
    port = TargetPort(vt.aaccess)
    run_sync(port.set_own(T_MAC, T_IP))
    c0 = vt.cycle
    vt.send(_arp())
    out = vt.run(2000, until_tx=True)
    assert len(out) == 1 and out[0].fcs_ok, out
    first, last = vt.rx_log[-1]
    # /S/ + 6 x 0x55 + SFD, 60 octets and the FCS: one octet per octet time
    assert last - first == 8 + 60 + 4 - 1 and first >= c0 and first % 4 == 0
    assert out[0].start > last and out[0].start % 4 == 0
    rep = Ether(out[0].frame)
    a = rep[ARP]
    assert (rep.dst, rep.src) == (P_MAC, T_MAC)
    assert (a.op, a.hwsrc, a.psrc, a.hwdst, a.pdst) == (2, T_MAC, T_IP, P_MAC, P_IP)
    # a bad FCS is dropped and counted, the next good request is answered
    bad0 = _top(vt, "rx_fcs_errors")
    vt.send(_arp(), fcs_ok=False)
    assert vt.run(2000, until_tx=True) == []
    assert _top(vt, "rx_fcs_errors") == bad0 + 1
    vt.send(_arp())
    out = vt.run(2000, until_tx=True)
    assert len(out) == 1 and out[0].fcs_ok
    # the counts are octet times: a clock cycle is 8 of them
    assert vt.cycle % XGMII_TICKS == 0 and vt.core_cycle == vt.cycle // XGMII_TICKS


def test_back_to_back_at_line_rate(vt):
    """64 ARP requests of 60 to 67 octets back to back: the harness's /S/ on lanes 0 and 4 with the
    deficit idle count makes them take exactly what they take on GMII (preamble, frame, FCS
    and 12 octets of gap each, within the 3 octets of deficit); the MAC takes every one, and
    every reply leaves with a good FCS on lane 0 or 4, at least 9 octets after the one
    before."""
    run_sync(TargetPort(vt.aaccess).set_own(T_MAC, T_IP))
    n = 64
    # 60 to 67 octets: every alignment of the next /S/, so the deficit idle count is used
    lens = [60 + i % 8 for i in range(n)]
    for i in range(n):
        vt.send(_arp(i, lens[i]))
    out = []
    while len(out) < n:
        got = vt.run(20_000, until_tx=False)
        assert got, f"{len(out)} replies of {n}"
        out += got
    log = vt.rx_log[-n:]
    gaps = [log[i][0] - log[i - 1][1] - 1 for i in range(1, n)]
    assert all(f % 4 == 0 for f, _ in log), log
    assert all(9 <= g <= 15 for g in gaps), gaps
    assert [b - a + 1 for a, b in log] == [8 + x + 4 for x in lens]
    span = log[-1][0] - log[0][0]
    assert abs(span - sum(8 + x + 4 + 12 for x in lens[:-1])) <= 3, (span, gaps)
    assert len(set(gaps)) > 1, gaps     # the gap really varies
    assert _top(vt, "rx_frames_ok") == n
    # replies: all good, to the n requesters, on lanes 0 / 4, gaps of 9 to 15 octets
    assert all(f.fcs_ok for f in out)
    assert sorted(Ether(f.frame)[ARP].hwdst for f in out) == sorted(_mac(i) for i in range(n))
    assert all(f.start % 4 == 0 for f in out)
    tgaps = [out[i].start - out[i - 1].end - 1 for i in range(1, n)]
    assert min(tgaps) >= 9, tgaps
    # The ARP path answers one request in 14 clock cycles (112 octet times for a 72-octet
    # reply: a gap of 40), slower than the line's 84; the requests wait in the MAC's buffer
    # and none is lost. Printed, not a line-rate path.
    tspan = out[-1].start - out[0].start
    print(f"\n10G ARP burst: {n} requests in {span} octet times (gaps {min(gaps)}-{max(gaps)}), "
          f"{n} replies in {tspan} (gaps {min(tgaps)}-{max(tgaps)})")


def test_rc_exchange_10g(vt):
    """HELLO through the driver, then rounds of KBTP requests over RC matched to the golden
    model, at 10 Gb/s."""
    b = VlSystemBench(vt, n_init=2, seed=11)
    run_sync(b.bring_up())
    stats = run_sync(mixed(b, rounds=4))
    assert stats["rounds"] == 4
    figs = run_sync(mixed_checks(b, stats))
    print(f"\n10G rc exchange: {figs}")

# Ref: issue 18 item 2 (the shipped configuration, simulated whole); boards/cores.py KbtpCore
#      (what the ECPIX-5 bitstream holds); sim/vltarget.py SHIPPED, sim/vl/harness.cpp (two
#      clocks); sim/system.py (system bench vs the golden model); tools/soak.py; draft KBTP
#      §Operations, §Free-Block Ring.
"""The ECPIX-5 core as the bitstream holds it, simulated whole under Verilator.

``VlTarget(SHIPPED)`` is :class:`boards.cores.KbtpCore` built by the board's own factory: the
GMII MAC at 125 MHz behind ``MacCdc``, the target at width 64 in its own 25 MHz clock (one
core cycle every 5 GMII cycles), SHIPPED_QPS QPs (boards/cores.py), 8 memory regions, its
memory the 512 MB of DDR3 (boards/dram.py's timing model of LiteDRAM's user port in LiteDRAM's place), the host bus
behind ``HostBusRegister``; its timers run at the board's real rate (no timer scaling). The
system bench (4 initiators, loss, duplication and corruption, every round matched to the golden
model, the final memory image and counters compared) and a short soak run on it. The
end-to-end soft-RoCE run on it is tests/system/test_e2e.py (``kbtp-sim serve`` serves this
configuration by default).
"""

import pytest

from tools.soak import report, soak
from sim.system import VlSystemBench, mixed, mixed_checks, model_config, run_sync
from boards.cores import CORE_FREQ
from sim.vltarget import SHIPPED, VlTarget, board_params

#: GMII cycles per core cycle of the shipped core (boards.cores.CORE_FREQ; checked exactly in
#: test_shipped_is_the_board_core).
DIV = board_params("ecpix5")["core_div"]

pytestmark = pytest.mark.xdist_group("shipped")


def test_shipped_is_the_board_core():
    """The simulated configuration is the one boards/ecpix5.py builds."""
    from boards import BOARDS
    from boards.cores import KbtpCore
    p = board_params("ecpix5")
    spec = BOARDS["ecpix5"]
    kw = KbtpCore.target_kwargs_of(spec.memory)
    assert (p["width"], p["n_qp"], p["n_mr"], p["mem_words"]) == \
        (kw["width"], kw["n_qp"], kw["n_mr"], kw["mem_words"]) == (64, 4, 8, 16384)
    assert p["core_div"] == round(125e6 / CORE_FREQ) == 3 and p["mac_hz"] == 125e6
    assert abs(p["core_hz"] - CORE_FREQ) < 1
    assert p["timer_scale"] == 1


@pytest.fixture(scope="module")
def built():
    from sim.vltarget import build
    build(SHIPPED)                  # once (cached); each test starts a fresh process from reset


def test_shipped_clocks(built):
    """Two clocks at the board's ratio: one ARP request in, one reply out; the host bus is in
    the core clock (an access costs whole core cycles)."""
    from scapy.layers.l2 import ARP, Ether

    from host.port import TargetPort
    from sim.system import P_IP, P_MAC, T_IP, T_MAC
    with VlTarget(SHIPPED) as vt:
        run_sync(TargetPort(vt.aaccess).set_own(T_MAC, T_IP))
        c0 = vt.cycle
        vt.access(1, 0, 0, 0)                       # one read of target memory
        assert (vt.cycle - c0) % DIV == 0 and vt.cycle - c0 >= DIV * 3
        req = bytes(Ether(dst="ff:ff:ff:ff:ff:ff", src=P_MAC)
                    / ARP(op=1, hwsrc=P_MAC, psrc=P_IP, pdst=T_IP)).ljust(60, b"\0")
        vt.send(req)
        out = vt.run(20_000, until_tx=True)
        assert len(out) == 1 and out[0].fcs_ok
        rep = Ether(out[0].frame)
        assert rep[ARP].op == 2 and rep[ARP].psrc == T_IP and rep.src == T_MAC
        first, last = vt.rx_log[-1]
        assert last - first == 8 + 60 + 4 - 1       # one octet per GMII cycle
        assert vt.core_cycle == vt.cycle // DIV


def test_shipped_system_bench(built):
    """4 initiators through 2 % loss, 1 % duplication and 0.5 % corruption both ways: every
    round matched to the golden model, then the image, the engine's and driver's counters."""
    with VlTarget(SHIPPED) as vt:
        b = VlSystemBench(vt, n_init=4, loss=0.02, dup=0.01, corrupt=0.005, seed=21)
        run_sync(b.bring_up())
        stats = run_sync(mixed(b, rounds=40))
        figs = run_sync(mixed_checks(b, stats))
        print(f"\nshipped system bench: {figs}; {vt.cycle:,} GMII cycles "
              f"({vt.cycle * 8 / 1e6:.2f} ms at the board's clocks)")
        assert stats["rounds"] == 40 and stats["requests"] > 40
        link = b.link.stats
        assert link["lost"] > 0 and link["duplicated"] > 0 and link["corrupted"] > 0, link
        assert b.ep.counters.retransmissions > 0


def test_shipped_soak_short(built):
    """A short soak (tools/soak.py) on the shipped core: one direct-mode initiator and three
    others, 1 % loss, 1 % duplication, 0.1 % corruption; no block lost or duplicated."""
    with VlTarget(SHIPPED) as vt:
        f = soak(ops=150, loss=0.01, dup=0.01, corrupt=0.001, seed=5, vt=vt)
    report(f)
    assert f["ops"] >= 150
    c = f["census"]
    assert c["lost"] == 0 and c["duplicated"] == 0
    assert c["in_rings"] + c["in_table"] + c["pending"] == c["blocks"]
    assert f["link"]["lost"] > 0 and f["link"]["duplicated"] > 0
    assert f["peer"]["retransmissions"] + f["target_requester"]["cnt_retransmits"] > 0


def test_shipped_one_initiator_per_qp(built):
    """Issue 22: one initiator per QP of the shipped core (SHIPPED_QPS, 64), each with its own handle range
    of 16 handles, HELLO from all, then mixed rounds through 2 % loss, 1 % duplication and
    0.5 % corruption, every round matched to the golden model, then the image and the
    counters. Rounds have 1 to 4 initiators at once (the bench tries every order of a round's
    requests: 64 at once would be 64! orders); over the run every initiator takes part, and
    the LOADs and STOREs run in the engine, not the host (its 64 RANGE registers)."""
    from boards.cores import SHIPPED_QPS
    n = board_params("ecpix5", "ddr3")["n_qp"]
    assert n == SHIPPED_QPS
    cfg = model_config(num_handles=16 * n, handles_per_initiator=16, num_blocks=2 * n + 16,
                       quota_per_initiator=2)
    with VlTarget(SHIPPED) as vt:
        b = VlSystemBench(vt, n_init=n, loss=0.02, dup=0.01, corrupt=0.005, seed=23, cfg=cfg)
        assert b.driver.fast_ok, f"the engine must check all {n} handle ranges"
        run_sync(b.bring_up())
        stats = run_sync(mixed(b, rounds=160, max_batch=4))
        figs = run_sync(mixed_checks(b, stats))
        print(f"\nshipped {n}-initiator bench: {figs}; {vt.cycle:,} GMII cycles "
              f"({vt.cycle * 8 / 1e6:.2f} ms at the board's clocks)")
        assert stats["rounds"] == 160 and len(stats["initiators"]) == n
        assert figs["fast_path"] > stats["requests"] // 2
        link = b.link.stats
        assert link["lost"] > 0 and link["duplicated"] > 0 and link["corrupted"] > 0, link

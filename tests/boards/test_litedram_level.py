# Ref: issue 22 item 1; boards/litedram_bridge.py LiteDramReadLevel; LiteDRAM litedram/phy/ecp5ddrphy.py
#      (dly_sel, rdly_dq_rst/_inc, rdly_dq_bitslip_rst/_bitslip strobes per selected lane,
#      burstdet_clr / burstdet_seen; BL8 beats of the x16 bus: octet k of a native word is lane
#      k % 2); LiteX liblitedram/sdram.c sdram_read_leveling() (the algorithm).
"""Read levelling of the ECP5 DDR3 PHY against a behavioural PHY + controller model.

The model stands for LiteDRAM's ECP5DDRPHY behind its controller, as the leveller sees them:
a Wishbone CSR slave with the PHY's levelling registers (the strobes act on the lanes selected
in ``dly_sel``), and a native port with LiteDRAM's habits (write data taken on ``wdata.ready``
whether valid or not, at least two cycles after its command, read data a fixed latency later, ``cmd.ready`` at random). Each lane reads
right only at one bitslip and inside a window of read delays the test draws; outside it the
lane's octets come back garbled and ``burstdet`` may or may not fire. The leveller must load
each lane's right bitslip and the middle of its window, and say ``error`` when a lane has no
good setting at all. (Nothing here runs on the board: the windows of a real ECPIX-5 are
unknown until one is levelled.)
"""

import random

import pytest
from amaranth.sim import Simulator

from boards.litedram_bridge import (LiteDramReadLevel, NativePortSignature, level_choice,
                                    native_port_mux)
from tests.boards.litedram_cores import litedram_cores

CSR = {
    "ddrphy_dly_sel": 0x800, "ddrphy_rdly_dq_rst": 0x804, "ddrphy_rdly_dq_inc": 0x808,
    "ddrphy_rdly_dq_bitslip_rst": 0x80C, "ddrphy_rdly_dq_bitslip": 0x810,
    "ddrphy_burstdet_clr": 0x814, "ddrphy_burstdet_seen": 0x818,
}


def _run(good, rng, cycles=200_000):
    """``good``: per lane ``(bitslip, set of delays that read right)``. Returns (done, error,
    bitslips, delays, choice) from the model's registers after the leveller stops."""
    dut = LiteDramReadLevel(CSR, 16)
    adr_of = {v >> 2: k for k, v in CSR.items()}
    st = {"sel": 0, "bs": [0, 0], "dl": [0, 0], "seen": 0, "mem": {}, "out": None}

    def lane_ok(lane):
        b, window = good[lane]
        return st["bs"][lane] == b and st["dl"][lane] in window

    async def tb(ctx):
        wb, port = dut.wb, dut.port
        ctx.set(dut.start, 1)
        waiting_data = []       # write addresses whose data is still to be taken
        reads = []              # (cycle due, address)
        for cyc in range(cycles):
            if ctx.get(dut.done) or ctx.get(dut.error):
                break
            # Wishbone: zero-wait slave.
            ack, dat_r = 0, 0
            if ctx.get(wb.cyc) and ctx.get(wb.stb):
                ack = 1
                name = adr_of[ctx.get(wb.adr)]
                if ctx.get(wb.we):
                    v = ctx.get(wb.dat_w)
                    if name == "ddrphy_dly_sel":
                        st["sel"] = v
                    elif name == "ddrphy_burstdet_clr":
                        st["seen"] = 0
                    for lane in range(2):
                        if st["sel"] >> lane & 1 and v:
                            if name == "ddrphy_rdly_dq_rst":
                                st["dl"][lane] = 0
                            elif name == "ddrphy_rdly_dq_inc":
                                st["dl"][lane] = (st["dl"][lane] + 1) % 8
                            elif name == "ddrphy_rdly_dq_bitslip_rst":
                                st["bs"][lane] = 0
                            elif name == "ddrphy_rdly_dq_bitslip":
                                st["bs"][lane] = (st["bs"][lane] + 1) % 4
                else:
                    assert name == "ddrphy_burstdet_seen", name
                    dat_r = st["seen"]
            ctx.set(wb.ack, ack)
            ctx.set(wb.dat_r, dat_r)
            # Native port.
            ready = rng.random() < 0.7
            ctx.set(port.cmd_ready, int(ready))
            if ready and ctx.get(port.cmd_valid):
                a = ctx.get(port.cmd_addr)
                if ctx.get(port.cmd_we):
                    waiting_data.append((cyc + 2, a))   # LiteDRAM: ready >= 2 cycles later
                else:
                    reads.append((cyc + 6, a))
            wready = bool(waiting_data) and waiting_data[0][0] <= cyc and rng.random() < 0.5
            ctx.set(port.wdata_ready, int(wready))
            if wready:
                _, a = waiting_data.pop(0)
                data = ctx.get(port.wdata_data) if ctx.get(port.wdata_valid) else 0xDEAD
                st["mem"][a] = data
            if reads and reads[0][0] <= cyc:
                _, a = reads.pop(0)
                word = st["mem"].get(a, 0)
                for lane in range(2):
                    if not lane_ok(lane):
                        for o in range(lane, 16, 2):
                            word ^= rng.getrandbits(8) << (8 * o)
                    if lane_ok(lane) or rng.random() < 0.3:
                        st["seen"] |= 1 << lane
                ctx.set(port.rdata_valid, 1)
                ctx.set(port.rdata_data, word)
            else:
                ctx.set(port.rdata_valid, 0)
            await ctx.tick()
        st["out"] = (ctx.get(dut.done), ctx.get(dut.error), ctx.get(dut.choice))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    done, error, choice = st["out"]
    return done, error, list(st["bs"]), list(st["dl"]), choice


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_read_levelling_finds_each_lanes_window(seed):
    rng = random.Random(seed)
    good = []
    for lane in range(2):
        lo = rng.randrange(0, 5)
        hi = rng.randrange(lo + 1, 8)
        good.append((rng.randrange(4), set(range(lo, hi + 1))))
    done, error, bs, dl, choice = _run(good, rng)
    assert done and not error, (good, bs, dl)
    for lane, (b, window) in enumerate(good):
        passes = sum(1 << d for d in window)
        assert bs[lane] == b, (lane, good, bs)
        assert dl[lane] == level_choice(passes)[0] == (min(window) + max(window)) // 2, \
            (lane, good, dl)
        assert choice >> (8 * lane) & 0xFF == (b << 4) | dl[lane]


def test_read_levelling_reports_a_dead_lane():
    rng = random.Random(7)
    done, error, *_ = _run([(1, {2, 3, 4}), (0, set())], rng)
    assert error and not done


def test_board_core_has_the_levelling_registers():
    """The generated ECP5 core's CSR map has every register the leveller writes (the test's
    map above is an invented one: the leveller takes addresses from the map it is given)."""
    names = set(litedram_cores()["board"][0]["csr"])
    assert set(CSR) <= names, set(CSR) - names


def test_native_port_mux_gives_answers_only_to_the_owner():
    """The leveller's read answers never reach the bridge (its return FIFO would hand them to
    the target), and the bridge's never reach the leveller; commands come from the owner."""
    from amaranth import Module, Signal
    m = Module()
    sig = NativePortSignature(16)
    port = sig.flip().create(path=("port",))
    a, b = sig.create(path=("a",)), sig.create(path=("b",))
    owner = Signal()
    native_port_mux(m, port, owner, a, b)
    sim = Simulator(m)
    seen = []

    async def tb(ctx):
        ctx.set(a.cmd_valid, 1)
        ctx.set(a.cmd_addr, 0x111)
        ctx.set(b.cmd_valid, 1)
        ctx.set(b.cmd_addr, 0x222)
        for own in (0, 1):
            ctx.set(owner, own)
            ctx.set(port.rdata_valid, 1)
            ctx.set(port.wdata_ready, 1)
            ctx.set(port.cmd_ready, 1)
            ctx.set(port.rdata_data, 0xABC)
            seen.append((own, ctx.get(port.cmd_addr), ctx.get(a.rdata_valid),
                         ctx.get(b.rdata_valid), ctx.get(a.wdata_ready), ctx.get(b.wdata_ready),
                         ctx.get(a.cmd_ready), ctx.get(b.cmd_ready)))

    sim.add_testbench(tb)
    sim.run()
    assert seen == [(0, 0x222, 0, 1, 0, 1, 0, 1), (1, 0x111, 1, 0, 1, 0, 1, 0)], seen

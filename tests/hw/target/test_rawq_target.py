# Ref: hw/target/target.py (raw queues wired in), hw/rdma/rawq.py (word formats); IEEE 802.3 clause
#      35 (GMII preamble/SFD, FCS = CRC-32 LSB first); roce-layouts.md §7 (CM on QP1).
"""The raw frame queues inside the whole KbtpTarget, over GMII, in the Amaranth simulator.

A CM REQ from the rdma_cm capture enters on GMII and comes out of Q_RAW_RX intact (ICRC
included) and never reaches the RoCE parser; an RC frame next to it still does; a frame pushed
on Q_RAW_TX leaves on GMII with preamble, SFD and a good FCS (zlib CRC-32 as the oracle).
"""

import zlib

import pytest

from hw.iface import REG_TOP, Space
from hw.rdma.rawq import Q_RAW_RX
from hw.target.regbank import TOP_COUNTER_BASE
from sim.hdl import gmii_drive, gmii_wire
from tests.hw.rdma.test_rawq import IPV4, MAC, access, cm_req, pop_frame, push_frame, rc_frame, run


@pytest.mark.parametrize("width", [8, 64])
def test_target_raw_queues_over_gmii(width):
    from hw.target.target import KbtpTarget, TOP_COUNTERS
    dut = KbtpTarget(width, n_qp=2, mem_words=256, own_mac=MAC, own_ip=IPV4)
    req, rc = cm_req(), rc_frame()
    out = rc_frame(b"host frame " * 5, dqpn=0x22)[:120]
    tx = []

    def counter(name):
        return REG_TOP + TOP_COUNTER_BASE + 4 * TOP_COUNTERS.index(name)

    async def bench(ctx):
        await ctx.tick().repeat(5)
        for f in (req, rc):
            await gmii_drive(ctx, dut, gmii_wire(f))
        await ctx.tick().repeat(300)
        assert await pop_frame(ctx, dut.host) == req
        assert (await access(ctx, dut.host, Space.QUEUE, Q_RAW_RX, 0))[1] == 1   # empty now
        got = {}
        for name in (("rawq", "cnt_rx_frames"), ("qpf", "cnt_dropped"), ("prs", "cnt_packets"),
                     ("ethrx", "cnt_roce")):
            got[name] = (await access(ctx, dut.host, Space.REG, counter(name), 0))[0]
        assert got == {("rawq", "cnt_rx_frames"): 1, ("qpf", "cnt_dropped"): 1,
                       ("prs", "cnt_packets"): 1, ("ethrx", "cnt_roce"): 2}
        assert not any(await push_frame(ctx, dut.host, out))
        for _ in range(len(out) + 200):
            await ctx.tick()
            if len(tx) > 8 and not ctx.get(dut.tx_en):
                break
        wire = bytes(tx)
        assert wire[:8] == b"\x55" * 7 + b"\xd5"
        body, fcs = wire[8:-4], wire[-4:]
        assert body == out and zlib.crc32(body).to_bytes(4, "little") == fcs
        n, _ = await access(ctx, dut.host, Space.REG, counter(("rawq", "cnt_tx_frames")), 0)
        assert n == 1

    async def gmii_tx(ctx):
        async for *_, en, d in ctx.tick().sample(dut.tx_en, dut.txd):
            if en:
                tx.append(d)
    run(dut, bench, [gmii_tx])

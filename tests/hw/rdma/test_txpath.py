# Ref: roce-layouts.md §2-§4; hw/rdma/txpath.py.
"""TX path: DMA reader against a byte image; TxPath + RoceTxBuilder bytes checked with scapy.

Oracles: the memory image itself (Python slices) for payloads, scapy's BTH/RETH/AETH/... layers
(sim/scapy_roce.py, restated from roce-layouts.md independently of hw/headers.py) for headers.
"""

import random

import pytest
from amaranth.hdl import Module, Signal
from amaranth.lib import wiring
from amaranth.sim import Simulator

from hw.iface import QpState, QpTxCfg
from hw.lib.membus import MemRam
from hw.rdma.roce_hdr import RoceTxBuilder
from hw.lib.dma import DmaReader
from hw.rdma.txpath import TxPath
from sim.hdl import beats_to_packet, on_ram, packet_get, stream_get, stream_put
from sim.scapy_roce import dissect_roce

WORDS = 1024


def image(seed):
    rng = random.Random(seed)
    return bytes(rng.getrandbits(8) for _ in range(WORDS * 8))


@pytest.mark.parametrize("width,idle,bp", [(8, 0.0, 0.0), (8, 0.3, 0.4), (64, 0.0, 0.0),
                                           (64, 0.3, 0.4), (32, 0.2, 0.2)])
def test_dma_reader_random(width, idle, bp):
    rng = random.Random(width * 7 + int(bp * 10))
    img = image(width)
    top = on_ram(DmaReader(width), "mem", WORDS, MemRam.words_from_bytes(img))
    cmds = [(rng.randrange(0, 4000), rng.choice([1, 2, 3, 7, 8, 9, 15, 16, 17, 63, 64, 200]))
            for _ in range(40)]
    got = []

    async def src(ctx):
        await stream_put(ctx, top.master.cmd, [{"addr": a, "length": n} for a, n in cmds],
                         idle=idle, rng=rng)

    async def sink(ctx):
        for _ in cmds:
            got.append(await packet_get(ctx, top.master.o, width, backpressure=bp, rng=rng))

    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(src, background=True)
    sim.add_testbench(sink)
    sim.run()
    for (a, n), pkt in zip(cmds, got):
        assert pkt == img[a:a + n], (a, n)


@pytest.mark.parametrize("width", [8, 64])
def test_dma_reader_rate(width):
    """4 KiB from an unaligned address: one beat per cycle once the pipeline is full."""
    img = image(3)
    top = on_ram(DmaReader(width), "mem", WORDS, MemRam.words_from_bytes(img))
    times = []

    async def tb(ctx):
        ctx.set(top.master.o.ready, 1)
        await stream_put(ctx, top.master.cmd, [{"addr": 5, "length": 4096}])
        t0 = 0
        out = bytearray()
        while True:
            await ctx.tick()
            t0 += 1
            if ctx.get(top.master.o.valid):
                d, k = ctx.get(top.master.o.p.data), ctx.get(top.master.o.p.keep)
                out += d.to_bytes(width // 8, "little")[:bin(k).count("1")]
                if ctx.get(top.master.o.p.last):
                    break
        times.append(t0)
        assert bytes(out) == img[5:5 + 4096]

    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    beats = 4096 // (width // 8)
    print(f"\nDmaReader width {width}: 4096 octets in {times[0]} cycles "
          f"({times[0] / 4096:.3f} cycles/octet, {beats} beats minimum)")
    assert times[0] <= beats + 8


# --------------------------------------------------------------------------------------------
# TxPath + RoceTxBuilder
# --------------------------------------------------------------------------------------------

CFG = [dict(state=QpState.RTS, local_qpn=0x11, remote_qpn=0xABCDE, peer_mac=0x525400000002,
            peer_ip=0x0A000002, udp_sport=50001, pmtu=1),
       dict(state=QpState.RTS, local_qpn=0x12, remote_qpn=0x00042, peer_mac=0x0200DEADBEEF,
            peer_ip=0x0A000063, udp_sport=50002, pmtu=3)]


class PathTop(wiring.Component):
    def __init__(self, width, img, n_src=2):
        self.tx = TxPath(width, n_src, len(CFG))
        self.bld = RoceTxBuilder(width)
        self.ram = MemRam(WORDS, init=MemRam.words_from_bytes(img))
        #: The QP rows the test sets, behind a registered read port like QpTable.tx.
        self.rows = [Signal(QpTxCfg, name=f"row{i}") for i in range(len(CFG))]
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        m.submodules.tx, m.submodules.bld, m.submodules.ram = self.tx, self.bld, self.ram
        wiring.connect(m, self.tx.mem, self.ram.bus)
        wiring.connect(m, self.tx.hdr, self.bld.hdr)
        wiring.connect(m, self.tx.payload, self.bld.payload)
        with m.Switch(self.tx.cfg.addr):
            for i, row in enumerate(self.rows):
                with m.Case(i):
                    m.d.sync += self.tx.cfg.data.eq(row)
        return m


def random_req(rng, src):
    op = rng.choice([0x11, 0x12, 0x0D, 0x0E, 0x10, 0x04, 0x00, 0x06, 0x0A, 0x0B, 0x0C, 0x17, 0x03])
    has_payload = op not in (0x11, 0x12, 0x0C)
    return {"qp": rng.randrange(2), "opcode": op, "psn": rng.getrandbits(24),
            "ackreq": rng.getrandbits(1),
            "aeth": {"syndrome": rng.getrandbits(8), "msn": rng.getrandbits(24)},
            "atomic_ack": {"orig_data": rng.getrandbits(64)},
            "reth": {"va": rng.getrandbits(64), "rkey": rng.getrandbits(32),
                     "dma_length": rng.getrandbits(32)},
            "imm": {"imm": rng.getrandbits(32)}, "ieth": {"rkey": rng.getrandbits(32)},
            "laddr": rng.randrange(0, 7000),
            "length": rng.choice([1, 3, 4, 8, 13, 64, 255, 256]) if has_payload else 0,
            "src": src}


@pytest.mark.parametrize("width,idle,bp", [(8, 0.0, 0.0), (64, 0.0, 0.0), (8, 0.4, 0.3),
                                           (64, 0.4, 0.3)])
def test_txpath_scapy(width, idle, bp):
    rng = random.Random(width + int(idle * 10))
    img = image(width + 1)
    top = PathTop(width, img)
    reqs = [[random_req(rng, s) for _ in range(15)] for s in range(2)]
    out = []

    def producer(s):
        async def run(ctx):
            beats = [{k: v for k, v in r.items() if k != "src"} for r in reqs[s]]
            await stream_put(ctx, top.tx.src[s], beats, idle=idle, rng=random.Random(s))
        return run

    async def sink(ctx):
        for i, c in enumerate(CFG):
            for k, v in c.items():
                if k in dict(QpTxCfg.members):
                    ctx.set(getattr(top.rows[i], k), v)
        for _ in range(30):
            beats = []
            while not beats or not beats[-1].last:
                beats.append(await stream_get(ctx, top.bld.o, backpressure=bp, rng=rng))
            pkt = beats_to_packet([{"data": b.data, "keep": b.keep, "last": b.last}
                                   for b in beats], width)
            meta = beats[0].meta       # held on every beat of the packet
            assert all(b.meta.as_value().value == meta.as_value().value for b in beats)
            out.append((pkt, {"dst_mac": meta.dst_mac, "dst_ip": meta.dst_ip,
                              "sport": meta.udp_src_port, "ip_id": meta.ip_id,
                              "length": meta.length}))

    sim = Simulator(top)
    sim.add_clock(1e-8)
    for s in range(2):
        sim.add_testbench(producer(s), background=True)
    sim.add_testbench(sink)
    sim.run()

    # Match packets to requests by source, in order per source (PSN + opcode identify them).
    queues = [list(r) for r in reqs]
    ids = []
    for pkt, meta in out:
        bth, ext, payload, _ = dissect_roce(pkt + b"\0\0\0\0")
        cands = [q for q in queues if q and q[0]["psn"] == bth["psn"]
                 and q[0]["opcode"] == bth["opcode"]]
        assert cands, f"unexpected packet {bth}"
        r = cands[0].pop(0)
        c = CFG[r["qp"]]
        assert bth["dqpn"] == c["remote_qpn"] and bth["pkey"] == 0xFFFF
        assert bth["ackreq"] == r["ackreq"]
        assert bth["padcount"] == (-r["length"]) % 4
        assert payload == img[r["laddr"]:r["laddr"] + r["length"]]
        for name, fields in ext.items():
            for f, v in fields.items():
                assert v == r[name][f], (name, f)
        assert meta["dst_mac"] == c["peer_mac"] and meta["dst_ip"] == c["peer_ip"]
        assert meta["sport"] == c["udp_sport"] and meta["length"] == len(pkt) + 4
        ids.append(meta["ip_id"])
    assert not any(queues)
    assert ids == list(range(30)), "IP ID is a per-packet counter"


# --------------------------------------------------------------------------------------------
# AckHold: the responder's plain ACKs wait for the requester's next packet, or ``delay`` cycles
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("delay,grace,other_p,expect_p,offer_p,bp", [
    (8, 8, 0.0, 1.0, 0.7, 0.0), (8, 2, 0.05, 0.3, 0.1, 0.3), (32, 3, 0.02, 0.6, 0.05, 0.5),
    (1, 1, 0.1, 0.5, 0.3, 0.2), (64, 4, 0.0, 0.8, 0.02, 0.1), (16, 4, 0.01, 0.9, 0.03, 0.0)])
def test_ack_hold(delay, grace, other_p, expect_p, offer_p, bp):
    _run_ack_hold(delay, grace, other_p, expect_p, offer_p, bp)


def _run_ack_hold(delay, grace, other_p, expect_p, offer_p, bp):
    """Every cycle is checked against the rule, written here from the docstring: a plain ACK
    (opcode ACKNOWLEDGE, syndrome bits 7..5 zero) is taken at once when none is held; n cycles
    after it was taken it is offered downstream iff n > delay, or ``other`` strobed in one of
    the cycles between, or ``expect`` was low in the last ``grace`` of them, or a record
    waits behind it now; once offered it stays offered. Any other record goes straight through
    when no ACK is held. Order and contents pass unchanged."""
    from hw.rdma.resp_common import RespTx
    from hw.rdma.txpath import AckHold
    rng = random.Random(delay * 100 + grace + int(other_p * 100) + int(bp * 10))
    dut = AckHold(RespTx, delay, grace)
    kinds = [(0x11, 0x1F), (0x11, 0x00), (0x11, 0x60), (0x11, 0x20), (0x11, 0x61),
             (0x0D, 0x00), (0x10, 0x00), (0x12, 0x1F)]
    recs = []
    for k in range(150):
        op, syn = rng.choice(kinds)
        recs.append({"qp": rng.randrange(4), "opcode": op, "psn": k,
                     "aeth": {"syndrome": syn, "msn": rng.getrandbits(24)},
                     "atomic_ack": {"orig_data": rng.getrandbits(64)},
                     "laddr": rng.getrandbits(20), "length": rng.getrandbits(16)})
    # per cycle: input index offered (or None), i.ready, other, expect, o.valid, o.ready, o.psn
    trace = []
    got = []

    async def tb(ctx):
        k = 0
        offering = False
        while len(got) < len(recs) and len(trace) < 40_000:
            # a stream's valid stays up from its first cycle until the record is taken
            offering = k < len(recs) and (offering or rng.random() < offer_p)
            other = int(rng.random() < other_p)
            expect = int(rng.random() < expect_p)
            ready = int(rng.random() >= bp)
            if offering:
                ctx.set(dut.i.payload, recs[k])
            ctx.set(dut.i.valid, int(offering))
            ctx.set(dut.other, other)
            ctx.set(dut.expect, expect)
            ctx.set(dut.o.ready, ready)
            ov, ir = ctx.get(dut.o.valid), ctx.get(dut.i.ready)
            opsn = ctx.get(dut.o.payload.psn)
            if ov and ready:
                got.append(ctx.get(dut.o.payload))
            trace.append((k if offering else None, ir, other, expect, ov, ready, opsn))
            await ctx.tick()
            if offering and ir:
                k += 1
                offering = False

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    assert len(got) == len(recs)
    for r, g in zip(recs, got):
        assert g.psn == r["psn"] and g.opcode == r["opcode"] and g.laddr == r["laddr"]
        assert g.aeth.syndrome == r["aeth"]["syndrome"] and g.aeth.msn == r["aeth"]["msn"]

    def plain(k):
        return recs[k]["opcode"] == 0x11 and recs[k]["aeth"]["syndrome"] >> 5 == 0

    why = {"delay": 0, "other": 0, "expect": 0, "behind": 0}
    held, taken, offered = None, None, False
    for t, (k, ir, other, expect, ov, ready, opsn) in enumerate(trace):
        if held is None:
            if k is not None and plain(k):
                assert ir and not ov, (t, k)          # taken at once, not offered yet
                held, taken, offered = k, t, False
            elif k is not None:
                assert ov and opsn == k and ir == ready, (t, k)     # straight through
            else:
                assert not ov, t
            continue
        assert not ir, (t, "a record behind a held ACK waits")
        between = trace[taken + 1:t]
        reason = ("delay" if t - taken > delay else
                  "other" if any(c[2] for c in between) else
                  "expect" if len(between) >= grace and not any(c[3] for c in between[-grace:])
                  else "behind" if k is not None else None)
        want = offered or reason is not None
        assert ov == want and (not ov or opsn == held), (t, held, t - taken, reason, offered)
        if ov and not offered:
            why[reason] += 1
        offered = ov
        if ov and ready:
            held = None
    print(why)
    assert sum(why.values()) > 10
    return why


def test_ack_hold_every_release_is_seen():
    """The cases above between them release held ACKs for each of the four reasons."""
    seen = {}
    for args in [(8, 2, 0.05, 0.3, 0.1, 0.3), (64, 4, 0.0, 0.8, 0.02, 0.1),
                 (16, 4, 0.01, 0.9, 0.03, 0.0), (8, 8, 0.0, 1.0, 0.7, 0.0)]:
        for r, n in _run_ack_hold(*args).items():
            seen[r] = seen.get(r, 0) + n
    assert all(seen[r] >= 3 for r in ("delay", "other", "expect", "behind")), seen

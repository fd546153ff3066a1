# Ref: hw/kbtp/engine.py (register map, hostq, CMD FREE_BLOCK, "What the host keeps doing");
#      hw/target/regbank.py (HostDecoder, HostMemPort, HostQueues); hw/rdma/qp.py; model/target.py.
"""The driver against the real engine gateware (Amaranth simulator, no Verilator).

A small top holds what the driver talks to in a KbtpTarget: the KBTP engine, the host queues
(engine ``hostq`` -> Q_NOTIFY), the host memory port, the QP and MR tables behind one host
decoder, and a RAM. The testbench plays the responder (writes a message into a receive buffer and
notifies the engine) and the requester (executes the WorkRequests of both the engine and the host
against the initiator's memory and answers each source with its WorkCompletion).

Oracle: the golden model fed the same messages: every SEND payload (engine's or driver's)
octet for octet, and the RAM image of the KBTP structures byte for byte after every step.
"""

import random

import pytest
from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In
from amaranth.sim import Simulator

from hw.headers import Features, GoodbyeFlags, ReqFlags, Status
from hw.iface import (HostBusSignature, QP_INDEX_BITS, REG_KBTP, REG_MR, REG_QP, Space,
                      WcStatus, WrOp)
from hw.kbtp.engine import KbtpEngine, reg as ENG
from hw.lib.membus import MemArbiter, MemRam
from hw.rdma.qp import MR_STRIDE, QP_STRIDE, MrTable, QpTable
from hw.target.regbank import HostDecoder, HostMemPort, HostQueues
from host import codec
from host.driver import KbtpDriver, memory_plan
from host.port import TargetPort
from model.target import InitiatorMemory, SendMsg, TargetConfig, TargetModel
from sim.hostbus import bus_access
from tests.host.test_driver import alloc_inline, free, hello

N_QP = 2
CFG = dict(block_size=256, num_blocks=8, num_handles=64, handles_per_initiator=32,
           quota_per_initiator=3, trust_domains={1: 0, 2: 1}, max_inline=128)


class Top(wiring.Component):
    def __init__(self, mem_bytes, n_qp=N_QP, n_ranges=8, queue_depth=8):
        self.eng = KbtpEngine(n_qp=n_qp, n_ranges=n_ranges)
        self.hq = HostQueues(queue_depth)
        self.hmem = HostMemPort(mem_bytes)
        self.qpt = QpTable(n_qp)
        self.mrt = MrTable(8)
        self.arb = MemArbiter(2, outstanding=8)
        self.ram = MemRam(mem_bytes // 8)
        self.dec = HostDecoder([[(Space.MEM, 0, 1 << 32)], [(Space.QUEUE, 0, 4)],
                                [(Space.REG, REG_KBTP, 0x1000)],
                                [(Space.REG, REG_QP, QP_STRIDE * n_qp)],
                                [(Space.REG, REG_MR, MR_STRIDE * 8)]])
        super().__init__({"host": In(HostBusSignature())})

    def elaborate(self, platform):
        m = Module()
        for name in ("eng", "hq", "hmem", "qpt", "mrt", "arb", "ram", "dec"):
            m.submodules[name] = getattr(self, name)
        wiring.connect(m, self.eng.mem, self.arb.masters[0])
        wiring.connect(m, self.hmem.mem, self.arb.masters[1])
        wiring.connect(m, self.arb.bus, self.ram.bus)
        wiring.connect(m, self.eng.hostq, self.hq.notify)
        # As in KbtpTarget: the host's RecvRepost tells the engine the host finished a message.
        m.d.comb += [self.eng.host_done.eq(self.hq.repost.valid & self.hq.repost.ready),
                     self.eng.host_done_qp.eq(self.hq.repost.payload.qp)]
        wiring.connect(m, wiring.flipped(self.host), self.dec.host)
        for k, slave in enumerate([self.hmem.bus, self.hq.bus, self.eng.bus, self.qpt.bus,
                                   self.mrt.bus]):
            wiring.connect(m, self.dec.slaves[k], slave)
        return m


def ram_read(ctx, ram, addr, n):
    out = bytearray()
    for w in range(addr // 8, (addr + n + 7) // 8):
        out += ctx.get(ram.mem.data[w]).to_bytes(8, "little")
    return bytes(out[addr % 8:addr % 8 + n])


def ram_write(ctx, ram, addr, data):
    for i, b in enumerate(data):
        w, k = divmod(addr + i, 8)
        old = ctx.get(ram.mem.data[w])
        ctx.set(ram.mem.data[w], (old & ~(0xFF << 8 * k)) | (b << 8 * k))


class Bench:
    """``n_qp`` QPs, an engine of ``n_ranges`` RANGEs (None: its default, and the driver's),
    HostQueues of ``queue_depth``; ``over``: TargetConfig fields other than :data:`CFG`'s."""

    def __init__(self, n_qp=N_QP, n_ranges=8, queue_depth=8, **over):
        self.cfg = TargetConfig(**{**CFG, **over})
        self.model = TargetModel(TargetConfig(**{**CFG, **over}))
        self.plan = memory_plan(self.cfg, n_qp)
        self.top = Top(self.plan["end"], n_qp, n_ranges, queue_depth)
        self.imem = {q: InitiatorMemory() for q in range(n_qp)}
        self.sent = []                  # (source, qp, payload, inv) of every SEND
        self.reposts = [0, 0]           # engine, host
        self.ctx = None
        self.recv_k = {}
        self.drv = KbtpDriver(TargetPort(self.access), self.cfg, n_qp=n_qp,
                              mem_size=self.plan["end"], n_ranges=n_ranges, n_mr=8)
        self.now = 0.0

    def simulate(self, bench):
        """Run ``bench`` with the requester and the repost sink beside it."""
        sim = Simulator(self.top)
        sim.add_clock(1e-8)
        sim.add_testbench(self.requester, background=True)
        sim.add_testbench(self.repost_sink, background=True)
        sim.add_testbench(bench)
        sim.run()

    async def access(self, space, addr, we, wdata):
        return await bus_access(self.ctx, self.top.host, space, addr, we, wdata)

    # ---- the requester and the responder's repost side --------------------------------------
    async def requester(self, ctx):
        eng, hq, ram = self.top.eng, self.top.hq, self.top.ram
        while True:
            for src, s, wc in ((0, eng.wr, eng.wc), (1, hq.wr, hq.wc)):
                if ctx.get(s.valid):
                    w = ctx.get(s.payload)
                    ctx.set(s.ready, 1)
                    await ctx.tick()
                    ctx.set(s.ready, 0)
                    st = self.execute(ctx, ram, src, w)
                    ctx.set(wc.payload, {"qp": w.qp, "wr_id": w.wr_id, "status": st})
                    ctx.set(wc.valid, 1)
                    await ctx.tick().until(wc.ready)
                    ctx.set(wc.valid, 0)
                    break
            else:
                await ctx.tick()

    def execute(self, ctx, ram, src, w):
        op, im = WrOp(w.op), self.imem[int(w.qp)]
        try:
            if op in (WrOp.WRITE, WrOp.WRITE_IMM):
                im.write(w.rkey, w.va, ram_read(ctx, ram, w.laddr, w.length))
            elif op is WrOp.READ:
                ram_write(ctx, ram, w.laddr, im.read(w.rkey, w.va, w.length))
            else:
                self.sent.append((src, int(w.qp), ram_read(ctx, ram, w.laddr, w.length),
                                  int(w.inv_rkey) if op is WrOp.SEND_INV else None))
        except Exception:
            return WcStatus.REMOTE_ACCESS
        return WcStatus.OK

    async def repost_sink(self, ctx):
        eng, hq = self.top.eng, self.top.hq
        ctx.set(eng.repost.ready, 1)
        ctx.set(hq.repost.ready, 1)
        async for _, _, a, b in ctx.tick().sample(eng.repost.valid, hq.repost.valid):
            self.reposts[0] += a
            self.reposts[1] += b

    async def two_sessions(self, feature):
        """Driver up, both QPs open; QP 0's HELLO asks for ``feature`` (granted), QP 1's for
        none; each QP's initiator memory has STag 0x70 + q (256 octets at 2**32)."""
        await self.drv.init()
        for q in range(N_QP):
            await self.drv.open_qp(q, local_qpn=0x11 + q)
            self.model.connect(q)
        for q, feats in ((0, feature), (1, 0)):
            want, res, src = await self.deliver(q, hello(q + 1, feats))
            ack = codec.decode(want[0])
            assert ack.status == 0 and bool(ack.features & feature) == (q == 0) and src == [1]
        for q in range(N_QP):
            for m in (self.imem[q], self.model.initiator_memory(q)):
                m.register(0x70 + q, 256, base_to=0x1_0000_0000)

    # ---- one message ------------------------------------------------------------------------
    async def deliver(self, q, raw):
        """Both sides get ``raw`` on QP ``q``; returns the model's SEND payloads, after checking
        the hardware's (engine or driver) and the memory image."""
        ctx, eng = self.ctx, self.top.eng
        want = [a.payload for a in self.model.receive(q, raw, self.now)
                if isinstance(a, SendMsg)]
        size = 1 << self.plan["recv_log2"]
        k = self.recv_k.get(q, 0)
        self.recv_k[q] = (k + 1) % self.plan["recv_count"]
        addr = self.plan["recv"] + (q * self.plan["recv_count"] + k) * size
        ram_write(ctx, self.top.ram, addr, raw)
        mark, reposts = len(self.sent), sum(self.reposts)
        ctx.set(eng.notify.payload, {"qp": q, "addr": addr, "length": len(raw)})
        ctx.set(eng.notify.valid, 1)
        await ctx.tick().until(eng.notify.ready)
        ctx.set(eng.notify.valid, 0)
        handled = None
        for _ in range(3000):
            if sum(self.reposts) > reposts:
                break
            res = await self.drv.poll(self.now)
            if res is not None:
                handled = res
        else:
            raise AssertionError("request never finished (no RecvRepost)")
        for _ in range(20):         # let a last reply of the driver reach the requester
            await ctx.tick()
        got = [p for _, qq, p, _ in self.sent[mark:]]
        assert got == want, (got, want)
        n = self.model.lay["size"]
        assert ram_read(ctx, self.top.ram, 0, n) == bytes(self.model.mem[:n])
        return want, handled, [src for src, *_ in self.sent[mark:]]


def test_driver_with_the_engine():
    b = Bench()
    out = {}

    async def bench(ctx):
        b.ctx = ctx
        drv = b.drv
        await drv.init()
        n = b.model.lay["size"]
        assert ram_read(ctx, b.top.ram, 0, n) == bytes(b.model.mem[:n])
        assert await drv.port.rreg(REG_KBTP + ENG["ID"]) == 0x4B425445
        for q in range(N_QP):
            await drv.open_qp(q, local_qpn=0x11 + q)
            b.model.connect(q)
        want, res, src = await b.deliver(0, hello(1, Features.RECORD_COMPLETION.value))
        assert codec.decode(want[0]).status == 0 and src == [1] and res.op == "HELLO"
        await b.deliver(1, hello(2))
        # fast path: the engine allocates three blocks for initiator 1
        for k in range(3):
            want, res, src = await b.deliver(0, alloc_inline(k, 0x4000 + k, b"eng%d" % k * 9))
            assert codec.decode(want[0]).status == 0 and src == [0] and res is None
        # quota 3 reached: the engine answers NO_SPACE
        want, _, src = await b.deliver(0, alloc_inline(3, 0x4003, b"x"))
        assert codec.decode(want[0]).status == Status.NO_SPACE.value and src == [0]
        # slow path: FREE by the driver (engine FREE_BLOCK, USAGE lowered, block cleared since
        # two trust domains exist); then the engine can allocate again
        want, res, src = await b.deliver(0, free(4, 0x4001))
        assert codec.decode(want[0]).status == 0 and src == [1] and res.op == "FREE"
        usage = REG_KBTP + ENG["QP"] + ENG["QP_USAGE"]
        assert await drv.port.rreg(usage) == 2
        want, _, src = await b.deliver(0, alloc_inline(5, 0x4003, b"again"))
        assert codec.decode(want[0]).status == 0 and src == [0]
        # LOAD of another domain's handle: refused by the engine (RANGE says domain 0)
        want, _, src = await b.deliver(1, codec.encode(codec.Load(
            request_id=6, handle=0x4000, data=codec.DataDesc(0x10, 0, 256))))
        assert codec.decode(want[0]).status == Status.INVALID_HANDLE.value and src == [0]
        # GOODBYE: the driver turns the engine session off; later messages on the closed
        # connection reach the driver, which drops them (and returns the buffer)
        await b.deliver(0, codec.encode(codec.Goodbye()))
        assert await drv.port.rreg(REG_KBTP + ENG["QP"] + ENG["QP_SESSION"]) == 0
        want, _, src = await b.deliver(0, alloc_inline(7, 0x4002, b"x"))
        assert want == [] and src == []         # connection closed: dropped by the driver
        # the initiator reconnects (new connection on QP 0): its three bindings were retained,
        # so the engine's USAGE starts at 3 and the quota is full
        await drv.open_qp(0, local_qpn=0x11)
        b.model.connect(0)
        b.now = 10
        want, _, _ = await b.deliver(0, hello(1))
        assert codec.decode(want[0]).status == 0
        assert await drv.port.rreg(usage) == 3
        want, _, src = await b.deliver(0, alloc_inline(8, 0x4001, b"y"))
        assert codec.decode(want[0]).status == Status.NO_SPACE.value and src == [0]
        want, _, src = await b.deliver(0, free(9, 0x4000))
        assert codec.decode(want[0]).status == 0 and src == [1]
        want, _, src = await b.deliver(0, alloc_inline(10, 0x4001, b"z" * 100))
        assert codec.decode(want[0]).status == 0 and src == [0]
        out["counters"] = await drv.counters(transport=False)    # the engine alone
        out["done"] = True

    b.simulate(bench)
    assert out.get("done")
    c = out["counters"]
    assert c["engine"][("ALLOC_STORE", "OK")] == 5
    assert c["engine"][("ALLOC_STORE", "NO_SPACE")] == 2
    assert c["hostq_count"] == c["host_actions"] == 7
    assert c["quota"][1] == {"qp": 0, "usage": 3, "quota": 3, "state": "active"}


def test_addr_le_sessions_in_the_engine():
    """An ADDR_LE target (little-endian Block Offsets in entries and slots) with an ADDR_LE
    session on QP 0 and a big-endian one on QP 1: after HELLO, their ALLOC_STORE, STORE and LOAD
    run in the engine (every Send is the engine's; the driver handles nothing more), each answer
    the golden model's and the image of the structures equal to the model's (issue 20)."""
    b = Bench(addr_le=True)
    le = Features.ADDR_LE.value
    out = {}

    def enc(q, msg):
        return codec.encode(msg, addr_le=q == 0)

    async def bench(ctx):
        b.ctx = ctx
        drv = b.drv
        await b.two_sessions(le)
        actions = drv.host_actions
        for q in range(N_QP):
            h = 0x4000 + 32 * q
            steps = [
                codec.AllocStore(flags=ReqFlags.INLINE.value, request_id=1, handle=h,
                                 data=codec.DataDesc(0, 0, 24), inline=b"little or big endian? ok"),
                codec.Store(flags=ReqFlags.INLINE.value | ReqFlags.SEAL.value, request_id=2,
                            handle=h, data=codec.DataDesc(0, 0, 12),
                            inline=b"sealed now!%d" % q),
                codec.Load(request_id=3, handle=h, data=codec.DataDesc(0x70 + q, 0x1_0000_0000,
                                                                       256)),
            ]
            for msg in steps:
                want, res, src = await b.deliver(q, enc(q, msg))
                c = codec.decode(want[0])
                assert c.status == 0, (q, msg, c)
                assert src == [0] and res is None, (q, msg, src, res)
            assert b.imem[q].contents(0x70 + q)[:12] == b"sealed now!%d" % q
        assert drv.host_actions == actions
        out["counters"] = await drv.counters(transport=False)
        out["done"] = True

    b.simulate(bench)
    assert out.get("done")
    c = out["counters"]["engine"]
    for op in ("ALLOC_STORE", "STORE", "LOAD"):
        assert c[(op, "OK")] == N_QP, (op, c)


def test_direct_alloc_session_in_the_engine():
    """A session granted DIRECT_ALLOC (a partition of its own) on QP 0 beside a plain one on
    QP 1: every LOAD, STORE and ALLOC_STORE of both runs in the engine (the engine's Send, no
    driver action). QP 0's ALLOC_STOREs take blocks from its partition's ring (QP_SESSION bits
    5..4, the Head's FetchAdd locked), QP 1's from the shared ring. Then QP 0's partition ring
    is drained: an ALLOC_STORE whose RDMA READ fails (STag 0x99, nobody's) answers INTERNAL and
    puts its block back into the partition's ring (the ring it came from), the next one takes
    it again, and the one after finds the ring empty (NO_SPACE). Every answer and the image of
    the structures (ring slots, counters, table) equal the golden model's after every step
    (issue 20, item 3)."""
    b = Bench(direct_partitions=1, direct_quota=2)
    da = Features.DIRECT_ALLOC.value
    out = {}

    async def bench(ctx):
        b.ctx = ctx
        drv = b.drv
        await b.two_sessions(da)
        assert drv.engine_parts
        for q in range(N_QP):
            h = 0x4000 + 32 * q
            steps = [
                codec.AllocStore(flags=ReqFlags.INLINE.value, request_id=1, handle=h,
                                 data=codec.DataDesc(0, 0, 20), inline=b"allocated by %d ....." % q),
                codec.Store(flags=ReqFlags.INLINE.value | ReqFlags.SEAL.value, request_id=2,
                            handle=h, data=codec.DataDesc(0, 0, 12), inline=b"sealed now!%d" % q),
                codec.Load(request_id=3, handle=h,
                           data=codec.DataDesc(0x70 + q, 0x1_0000_0000, 256)),
            ]
            for msg in steps:
                before = drv.host_actions
                want, res, src = await b.deliver(q, codec.encode(msg))
                c = codec.decode(want[0])
                assert c.status == 0, (q, msg, c)
                assert src == [0] and res is None and drv.host_actions == before, \
                    (q, msg, src, res)
            assert b.imem[q].contents(0x70 + q)[:12] == b"sealed now!%d" % q
        # QP 0's partition ring (2 blocks, one taken above): a failed READ gives its block back
        for k, (msg, status) in enumerate([
                (codec.AllocStore(request_id=4, handle=0x4001,
                                  data=codec.DataDesc(0x99, 0x1_0000_0000, 64)), Status.INTERNAL),
                (codec.AllocStore(request_id=5, handle=0x4002,
                                  data=codec.DataDesc(0x70, 0x1_0000_0000, 64)), Status.OK),
                (alloc_inline(6, 0x4003, b"no room left"), Status.NO_SPACE)]):
            before = drv.host_actions
            raw = msg if isinstance(msg, bytes) else codec.encode(msg)
            want, res, src = await b.deliver(0, raw)
            c = codec.decode(want[0])
            assert c.status == status.value, (k, msg, c)
            assert src == [0] and res is None and drv.host_actions == before, (k, src, res)
        out["counters"] = await drv.counters(transport=False)
        out["done"] = True

    b.simulate(bench)
    assert out.get("done")
    c = out["counters"]["engine"]
    assert c[("LOAD", "OK")] == N_QP and c[("STORE", "OK")] == N_QP, c
    # QP 1's, QP 0's first and the one after the failed READ; the failed one; the empty ring
    assert c[("ALLOC_STORE", "OK")] == 3 and c[("ALLOC_STORE", "INTERNAL")] == 1, c
    assert c[("ALLOC_STORE", "NO_SPACE")] == 1, c
    assert not out["counters"]["slow_path"].get(("ALLOC_STORE", "OK")), out["counters"]


def test_driver_says_why_the_engine_is_not_used():
    """A table of 65,536 handles in ranges of 16 needs 4,096 range registers; the engine has 16.
    The driver then keeps every request on the host and says why, with the figures."""
    from sim.system import model_config

    def drv(**over):
        return KbtpDriver(TargetPort(None), model_config(**over), n_qp=4, n_ranges=16)
    ok = drv(num_handles=65536, handles_per_initiator=4096)
    assert ok.fast_ok and ok.fast_off_reasons == []
    bad = drv(num_handles=65536, handles_per_initiator=16)
    assert not bad.fast_ok
    assert bad.fast_off_reasons == ["4096 handle ranges, the engine checks 16"]
    assert not KbtpDriver(TargetPort(None), model_config(), n_qp=4, fast_path=False).fast_ok


@pytest.mark.filterwarnings("ignore::amaranth.hdl.UnusedElaboratable")    # (KbtpTarget's n_ranges)
def test_64_sessions_keep_the_fast_path():
    """64 QPs, each with a session and its handle range (64 ranges): the engine's default RANGEs
    (hw.kbtp.engine.ranges_for, as a KbtpTarget of 64 QPs has) are the driver's default too, so
    the driver keeps the fast path on (with 16, where RANGE sat before 0xA00, it would not). Its
    HELLOs write RANGE[i] (``1 << 8 | domain``) through the host bus, which reads all 64 back,
    and the engine's LOAD authorization uses them: range 40 belongs to trust domain 1
    (initiator 41 on QP 40), ranges 0..63 else to domain 0; a LOAD of a range owned by the
    session's domain runs, one of a range another domain owns is refused (INVALID_HANDLE), both
    by the engine and as the golden model answers."""
    from hw.target.target import KbtpTarget
    n = 1 << QP_INDEX_BITS
    b = Bench(n_qp=n, n_ranges=None, queue_depth=16, num_handles=4 * n, handles_per_initiator=4,
              quota_per_initiator=2, overcommit_quotas=True, trust_domains={41: 1})
    assert b.cfg.num_ranges == n
    assert b.drv.n_ranges == b.top.eng.n_ranges == KbtpTarget(n_qp=n).n_ranges == n
    assert b.drv.fast_ok, b.drv.fast_off_reasons
    assert not KbtpDriver(TargetPort(None), b.cfg, n_qp=n, n_ranges=16).fast_ok
    out = {}

    async def bench(ctx):
        b.ctx = ctx
        drv = b.drv
        await drv.init()
        for q in range(n):
            await drv.open_qp(q)
            b.model.connect(q)
        for q in range(n):
            want, _, src = await b.deliver(q, hello(q + 1))
            assert codec.decode(want[0]).status == 0 and src == [1], q
            assert b.model.session_of(q).range_index == q
        ranges = [await drv.port.rreg(REG_KBTP + ENG["RANGE"] + 4 * i) for i in range(n)]
        assert ranges == [1 << 8 | (i == 40) for i in range(n)]
        h = {q: b.model.session_of(q).handle_base for q in (20, 21, 40)}
        for q in (20, 40):
            want, res, src = await b.deliver(q, alloc_inline(q, h[q], b"range %d" % q,
                                                             flags=ReqFlags.SEAL.value))
            assert codec.decode(want[0]).status == 0 and src == [0] and res is None, q
        for q in (20, 21, 40):
            for m in (b.imem[q], b.model.initiator_memory(q)):
                m.register(0x70 + q, 256, base_to=0x1_0000_0000)
        for q, r, status in ((40, 40, Status.OK), (21, 20, Status.OK),
                             (20, 40, Status.INVALID_HANDLE), (40, 20, Status.INVALID_HANDLE)):
            want, res, src = await b.deliver(q, codec.encode(codec.Load(
                request_id=100 + q, handle=h[r], data=codec.DataDesc(0x70 + q, 0x1_0000_0000,
                                                                     256))))
            assert codec.decode(want[0]).status == status.value, (q, r)
            assert src == [0] and res is None, (q, r, src)       # the engine's answer
        assert b.imem[21].contents(0x70 + 21)[:8] == b"range 20"
        out["counters"] = await drv.counters(transport=False)
        out["done"] = True

    b.simulate(bench)
    assert out.get("done")
    c = out["counters"]["engine"]
    assert c[("LOAD", "OK")] == 2 and c[("LOAD", "INVALID_HANDLE")] == 2, c

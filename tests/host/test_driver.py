# Ref: draft KBTP §Target Memory Structures, §Session Establishment, §Operations (FREE, BIND,
#      GOODBYE), §Direct Modes, §Operational Considerations; model/target.py (the oracle);
#      hw/kbtp/engine.py (register map, CMD FREE_BLOCK busy/deferred); hw/target/regbank.py.
"""host/driver.py against the golden model, through a test-side fake of the target's host bus.

Oracles: :class:`model.target.TargetModel` fed the same messages on the same connections (its
replies, octet for octet, and its memory image, byte for byte); what the fake requester actually
read from target memory for each SEND (not what the driver says it sent); model/ring.py playing the
engine's FREE_BLOCK; the MR table as the hardware responder would check it.
"""

import asyncio
import random
from collections import deque

import pytest

from hw.headers import Features, GoodbyeFlags, Opcode, ReqFlags, Status
from hw.iface import (QP_INDEX_BITS, QPN_BASE, REG_KBTP, REG_MR, REG_QP, RecvNotify, Space,
                     WcStatus, WorkCompletion, WorkRequest, WrOp)
from hw.kbtp.engine import Cmd, reg as ENG
from hw.kbtp.engine_regs import RING_SHIFT
from hw.kbtp.regmap import FREE_DEPTH
from hw.rdma.qp import MR_STRIDE, QP_STRIDE
from hw.target.regbank import Q_NOTIFY, Q_REPOST, Q_WC, Q_WR, record_words
from host import codec
from host.driver import DriverError, KbtpDriver, memory_plan
from host.policy import slot_consumed
from host.port import HostError, TargetPort, pack_record, unpack_record
from model.target import (AccessError, Disconnect, InitiatorMemory, InvalidateStag, MemWrite,
                       RdmaRead, RdmaWrite, SendMsg, TargetConfig, TargetModel, WriteImm)
from model.ring import RingImage


def run(coro):
    return asyncio.run(coro)


# --------------------------------------------------------------------------------------------
# The fake target (test side)
# --------------------------------------------------------------------------------------------

class FakeTarget:
    """``access(space, addr, we, wdata)`` over a bytearray, a register dict and record queues.

    The engine's CMD register and free queue (FREE_PUSH, FREE_QUEUE) are played with
    model/ring.py's RingImage on the same memory (Tail FetchAdd, slot write or deferral,
    busy/deferred bits; queued frees run in order, each as soon as no free is deferred). A
    free's bits 63..62 name its ring: 0 the shared ring, p + 1 partition p, found where the
    driver's PART<p>_RING / _HEAD / _TAIL and PART_ORDER registers say. Pushed WorkRequests run
    at once against one InitiatorMemory per QP; each gets a WorkCompletion.
    """

    def __init__(self, cfg, mem_size, n_qp=2):
        self.cfg = cfg
        self.lay = cfg.layout()
        self.mem = bytearray(mem_size)
        self.regs = {}
        self.notify = deque()
        self.wc = deque()
        self._wr_words = []
        self.sent = []                  # (qp, op, payload, inv_rkey, wr, ok)
        self.reposts = {}
        self.imem = {q: InitiatorMemory() for q in range(n_qp)}
        self.ring = RingImage(self.mem, self.lay["ring"], cfg.ring_order, self.lay["head"],
                              self.lay["tail"], addr_le=cfg.addr_le, masked=cfg.masked)
        self.deferred = None            # (ring, ticket, slot, block) of a deferred FREE_BLOCK
        self.free_queue = deque()       # pushed frees (ring << 62 | Block Offset) not started
        self.pushed = []                # every free pushed or commanded, as written
        self.free_depth = FREE_DEPTH
        self.max_queued = 0
        self.on_busy = None             # called on CMD reads while busy (the engine moving on)
        self.free_cmds = 0
        self.recv_next = {}

    async def __call__(self, space, addr, we, wdata):
        space = Space(space)
        if space is Space.MEM:
            if addr % 4 or addr + 4 > len(self.mem):
                return 0, 1
            if we:
                self.mem[addr:addr + 4] = wdata.to_bytes(4, "little")
                return 0, 0
            return int.from_bytes(self.mem[addr:addr + 4], "little"), 0
        if space is Space.REG:
            return self._reg(addr, we, wdata)
        return self._queue(addr, we, wdata)

    def rd(self, addr):
        return self.regs.get(addr, 0)

    def _reg(self, addr, we, wdata):
        if addr == REG_KBTP + ENG["FREE_PUSH_HI"] and we:
            if len(self.free_queue) == self.free_depth:
                return 0, 1
            self.free_cmds += 1
            self.free_queue.append(self.rd(REG_KBTP + ENG["FREE_PUSH_LO"]) | wdata << 32)
            self.pushed.append(self.free_queue[-1])
            self.max_queued = max(self.max_queued, len(self.free_queue))
            self._run_queue()
            return 0, 0
        if addr == REG_KBTP + ENG["FREE_QUEUE"] and not we:
            self._run_queue()
            if self.free_queue and self.on_busy:
                self.on_busy()
                self._run_queue()
            n = len(self.free_queue)
            return n | (self.free_depth - n) << 16, 0
        if addr == REG_KBTP + ENG["CMD"]:
            self._run_queue()
            busy = self.deferred is not None or bool(self.free_queue)
            if we:
                assert not busy, "driver issued a command while the engine was busy"
                assert wdata == Cmd.FREE_BLOCK
                self.free_cmds += 1
                self.pushed.append(self.rd(REG_KBTP + ENG["CMD_ARG_LO"])
                                   | self.rd(REG_KBTP + ENG["CMD_ARG_HI"]) << 32)
                self._free_block(self.pushed[-1])
                return 0, 0
            if busy and self.on_busy:
                self.on_busy()
                self._run_queue()
                busy = self.deferred is not None or bool(self.free_queue)
            return (int(busy) | int(self.deferred is not None) << 1), 0
        if addr >= 0x8000:
            return 0, 1
        if we:
            self.regs[addr] = wdata
            return 0, 0
        return self.regs.get(addr, 0), 0

    def ring_of(self, k):
        """The engine's ring ``k`` (0 shared, p + 1 partition p, as its registers say)."""
        if k == 0:
            return self.ring
        e = lambda name: self.rd(REG_KBTP + ENG[name])       # noqa: E731
        p = k - 1
        assert e(f"PART{p}_RING"), f"free into partition {p}, whose ring was never configured"
        return RingImage(self.mem, e(f"PART{p}_RING"), e("PART_ORDER"), e(f"PART{p}_HEAD"),
                         e(f"PART{p}_TAIL"), addr_le=self.cfg.addr_le, masked=self.cfg.masked)

    def _free_block(self, arg):
        ring = self.ring_of(arg >> RING_SHIFT)
        block = arg & ((1 << RING_SHIFT) - 1)
        u, o = ring.fetch_add_counter("tail")
        if ring.slot_free_for(u, o):
            ring.write_block_offset(o, block)
            ring.write_sequence(o, u)
        else:
            self.deferred = (ring, u, o, block)

    def _run_queue(self):
        """Retry the deferred free; then start queued frees while none is deferred."""
        self._retry_deferred()
        while self.free_queue and self.deferred is None:
            self._free_block(self.free_queue.popleft())

    def _retry_deferred(self):
        if self.deferred is None:
            return
        ring, u, o, block = self.deferred
        if ring.read_slot(o) == (u, block):
            self.deferred = None        # the model, playing the engine, wrote it
        elif ring.slot_free_for(u, o):
            ring.write_block_offset(o, block)
            ring.write_sequence(o, u)
            self.deferred = None

    def _queue(self, q, we, wdata):
        if q == Q_NOTIFY and not we:
            if not self.notify:
                return 0, 1
            words = self.notify[0]
            w = words.pop(0)
            if not words:
                self.notify.popleft()
            return w, 0
        if q == Q_WC and not we:
            return (self.wc.popleft(), 0) if self.wc else (0, 1)
        if q == Q_REPOST and we:
            self.reposts[wdata] = self.reposts.get(wdata, 0) + 1
            return 0, 0
        if q == Q_WR and we:
            self._wr_words.append(wdata)
            if len(self._wr_words) == record_words(WorkRequest):
                v = sum(w << (32 * k) for k, w in enumerate(self._wr_words))
                self._wr_words = []
                self._execute(unpack_record(WorkRequest, v))
            return 0, 0
        return 0, 1

    def recv_buffers(self, qp):
        b = REG_QP + QP_STRIDE * qp
        return self.rd(b + 0x34), self.rd(b + 0x38), self.rd(b + 0x3C)

    def deliver(self, qp, raw):
        """The responder wrote a SEND into a receive buffer of ``qp`` and notified."""
        base, count, log2 = self.recv_buffers(qp)
        assert count and len(raw) <= 1 << log2
        k = self.recv_next.get(qp, 0)
        self.recv_next[qp] = (k + 1) % count
        a = base + (k << log2)
        self.mem[a:a + len(raw)] = raw
        v = pack_record(RecvNotify, qp=qp, addr=a, length=len(raw))
        self.notify.append([(v >> (32 * j)) & 0xFFFFFFFF
                            for j in range(record_words(RecvNotify))])

    def _execute(self, wr):
        op = WrOp(wr["op"])
        assert wr["wr_id"] < 1 << 15, "host wr_ids are 15 bits"
        qp, n, la = wr["qp"], wr["length"], wr["laddr"]
        ok, payload = True, None
        im = self.imem[qp]
        try:
            if op in (WrOp.SEND, WrOp.SEND_INV):
                payload = bytes(self.mem[la:la + n])
            elif op in (WrOp.WRITE, WrOp.WRITE_IMM):
                payload = bytes(self.mem[la:la + n])
                im.write(wr["rkey"], wr["va"], payload)
            elif op is WrOp.READ:
                self.mem[la:la + n] = im.read(wr["rkey"], wr["va"], n)
        except AccessError:
            ok = False
        self.sent.append((qp, op, payload, wr["inv_rkey"] if op is WrOp.SEND_INV else None,
                          wr, ok))
        st = WcStatus.OK if ok else WcStatus.REMOTE_ACCESS
        self.wc.append(pack_record(WorkCompletion, qp=qp, wr_id=wr["wr_id"], status=st))

    def mr(self, stag):
        """The MR of the table that has R_Key ``stag`` (as the responder would look it up)."""
        for j in range(16):
            b = REG_MR + MR_STRIDE * j
            if self.rd(b + 0x08) == stag and self.rd(b) & 1:
                return dict(control=self.rd(b), qp_mask=self.rd(b + 0x04),
                            va=self.rd(b + 0x0C) << 32 | self.rd(b + 0x10),
                            length=self.rd(b + 0x14), laddr=self.rd(b + 0x18))
        return None


# --------------------------------------------------------------------------------------------
# Driver + model side by side
# --------------------------------------------------------------------------------------------

def wire_of_model(actions):
    out = []
    for a in actions:
        if isinstance(a, SendMsg):
            out.append(("send", a.conn, a.payload, a.invalidate_stag))
        elif isinstance(a, WriteImm):
            out.append(("write_imm", a.conn, a.stag, a.to, a.data, a.imm, a.error is None))
        elif isinstance(a, RdmaWrite):
            out.append(("rdma_write", a.conn, a.stag, a.to, len(a.data), a.error is None))
        elif isinstance(a, RdmaRead):
            out.append(("rdma_read", a.conn, a.stag, a.to, a.length, a.error is None))
    return out


def wire_of_fake(sent):
    out = []
    for qp, op, payload, inv, wr, ok in sent:
        if op in (WrOp.SEND, WrOp.SEND_INV):
            out.append(("send", qp, payload, inv))
        elif op is WrOp.WRITE_IMM:
            out.append(("write_imm", qp, wr["rkey"], wr["va"], payload, wr["imm"], ok))
        elif op is WrOp.WRITE:
            out.append(("rdma_write", qp, wr["rkey"], wr["va"], wr["length"], ok))
        else:
            out.append(("rdma_read", qp, wr["rkey"], wr["va"], wr["length"], ok))
    return out


def other_of_model(actions):
    out = []
    for a in actions:
        if isinstance(a, Disconnect):
            out.append(("disconnect", a.conn, a.reason))
        elif isinstance(a, InvalidateStag):
            out.append(("invalidate", a.conn, a.stag, a.reason))
    return out


def other_of_driver(acts):
    return [a for a in acts if a[0] in ("disconnect", "invalidate")]


class World:
    """One config, one model, one fake target, one driver; QPs 0..n_qp-1 = model conns."""

    def __init__(self, n_qp=2, fast_path=True, **cfg):
        self.cfg = TargetConfig(**cfg)
        self.model = TargetModel(TargetConfig(**cfg))
        self.lay = self.cfg.layout()
        self.n_qp = n_qp
        self.plan = memory_plan(self.cfg, n_qp)
        self.fake = FakeTarget(self.cfg, self.plan["end"], n_qp)
        self.drv = KbtpDriver(TargetPort(self.fake), self.cfg, n_qp=n_qp, fast_path=fast_path,
                              mem_size=self.plan["end"], n_mr=16)
        self.now = 0.0
        run(self._setup())

    async def _setup(self):
        await self.drv.init()
        for q in range(self.n_qp):
            await self.drv.open_qp(q, local_qpn=0x11 + q, remote_qpn=0x20 + q,
                                   peer_mac="02:00:00:00:00:02", peer_ip="10.0.0.2")
            self.model.connect(q)

    def image_ok(self):
        n = self.lay["size"]
        if bytes(self.fake.mem[:n]) != bytes(self.model.mem[:n]):
            diff = [a for a in range(n) if self.fake.mem[a] != self.model.mem[a]]
            raise AssertionError(f"images differ at {len(diff)} octets, first {diff[0]:#x} "
                                 f"({self.model._label(diff[0], 1)})")
        return True

    def slow(self, q, raw, now=None):
        """A slow-path message on QP ``q``: both sides; checks and returns the model's actions."""
        if now is not None:
            self.now = now
        m = self.model.receive(q, raw, self.now)
        mark = len(self.fake.sent)
        self.fake.deliver(q, raw)
        reposts = self.fake.reposts.get(q, 0)
        res = run(self.drv.poll(self.now))
        assert res is not None and res.qp == q
        assert self.fake.reposts.get(q, 0) == reposts + 1, "receive buffer not reposted"
        assert wire_of_fake(self.fake.sent[mark:]) == wire_of_model(m)
        assert other_of_driver(res.actions) == other_of_model(m)
        assert self.image_ok()
        return m, res

    def engine(self, q, raw):
        """A fast-path request: the model plays the engine (its memory writes land in the fake
        memory, its RDMA writes in the fake initiator memory, USAGE follows for a session
        allocating from the shared ring: the engine does not count a partition's)."""
        m = self.model.receive(q, raw, self.now)
        for a in m:
            if isinstance(a, MemWrite):
                self.fake.mem[a.addr:a.addr + len(a.data)] = a.data
            elif isinstance(a, (RdmaWrite, WriteImm)) and a.error is None:
                self.fake.imem[q].write(a.stag, a.to, a.data)
        sends = [a for a in m if isinstance(a, SendMsg)]
        shared = not self.session_reg(q) & 0b111000         # QP_SESSION ring 0, bit 3 clear
        if raw[1] == Opcode.ALLOC_STORE.value and sends and shared:
            if codec.decode(sends[0].payload).status == Status.OK.value:
                a = REG_KBTP + ENG["QP"] + ENG["QP_STRIDE"] * q + ENG["QP_USAGE"]
                self.fake.regs[a] = self.fake.rd(a) + 1
        return m

    def tick(self, now):
        self.now = now
        m = self.model.tick(now)
        acts = run(self.drv.tick(now))
        assert other_of_driver(acts) == other_of_model(m)
        assert self.image_ok()
        return m

    def buffer(self, q, stag, data, access="rw"):
        self.model.initiator_memory(q).register(stag, data, access=access)
        self.fake.imem[q].register(stag, data, access=access)

    def imem_ok(self, q, stag):
        assert self.model.initiator_memory(q).contents(stag) == self.fake.imem[q].contents(stag)
        return True

    def fetch_add(self, q, stag):
        """The initiator's FetchAdd on its Head (DIRECT_ALLOC); the fake's MR must allow it."""
        mr = self.fake.mr(stag)
        assert mr is not None and mr["control"] & 8 and mr["qp_mask"] >> q & 1
        old = self.model.remote_fetch_add(q, stag, 0, 0x0000000100000010,
                                          (1 << 63) | (1 << 31) | (1 << (self.cfg.direct_ring_order
                                                                         + 3)), self.now)
        a = mr["laddr"]
        self.fake.mem[a:a + 8] = self.model.mem[a:a + 8]
        return old

    def usage_reg(self, q):
        return self.fake.rd(REG_KBTP + ENG["QP"] + ENG["QP_STRIDE"] * q + ENG["QP_USAGE"])

    def session_reg(self, q):
        return self.fake.rd(REG_KBTP + ENG["QP"] + ENG["QP_STRIDE"] * q + ENG["QP_SESSION"])


def hello(iid, features=0, credits=8):
    return codec.encode(codec.Hello(requested_features=features, completion_credits=credits,
                                    initiator_id=iid))


def ack_of(m):
    return codec.decode([a for a in m if isinstance(a, SendMsg)][0].payload)


def compl_of(m, addr_le=False):
    return codec.decode([a for a in m if isinstance(a, SendMsg)][0].payload, addr_le=addr_le)


def alloc_inline(rid, h, data, flags=0, gen=0):
    return codec.encode(codec.AllocStore(flags=flags | ReqFlags.INLINE.value, request_id=rid,
                                         handle=h, generation=gen,
                                         data=codec.DataDesc(0, 0, len(data)), inline=data))


def free(rid, h, gen=0, flags=0, completion=None):
    return codec.encode(codec.Free(flags=flags, request_id=rid, handle=h, generation=gen,
                                   completion=completion))


# --------------------------------------------------------------------------------------------
# init
# --------------------------------------------------------------------------------------------

CONFIGS = [
    dict(),
    dict(masked=False, initial_generation=7, pool_to_base=0x150000),
    dict(addr_le=True, block_size=512, num_blocks=12,
         initial_free_order=[3, 1, 2, 0, 7, 5, 6, 4, 11, 10, 9, 8]),
    dict(block_size=256, num_blocks=10, direct_partitions=2, direct_quota=3,
         initial_free_order=[3, 1, 0, 2]),
    dict(block_size=1024, num_blocks=5, num_handles=128, handles_per_initiator=32,
         table_base_handle=0x100, ring_order=4),
]


@pytest.mark.parametrize("over", CONFIGS)
def test_init_image_equals_model(over):
    w = World(**over)
    assert w.image_ok()
    cfg, lay, f = w.cfg, w.lay, w.fake
    e = lambda name: f.rd(REG_KBTP + ENG[name])       # noqa: E731
    assert e("TABLE_BASE") == lay["table"] and e("TABLE_COUNT") == cfg.num_handles
    assert e("TABLE_BASE_HANDLE_LO") | e("TABLE_BASE_HANDLE_HI") << 32 == cfg.table_base_handle
    assert e("POOL_BASE") == lay["pool"] and e("BLOCK_SIZE") == cfg.block_size
    assert e("POOL_TO_BASE_LO") | e("POOL_TO_BASE_HI") << 32 == cfg.pool_to_base
    assert (e("RING_BASE"), e("RING_ORDER")) == (lay["ring"], cfg.ring_order)
    assert (e("HEAD_ADDR"), e("TAIL_ADDR")) == (lay["head"], lay["tail"])
    assert e("MAX_INLINE") == cfg.max_inline
    assert 1 << e("RANGE_LOG2") == cfg.handles_per_initiator
    # fast path on (ADDR_LE targets too: the engine reads their little-endian Block Offsets)
    assert e("CTRL") == 1 | int(cfg.masked) << 1 | int(cfg.addr_le) << 2
    # receive buffers of each QP lie after the KBTP structures and the scratch areas
    for q in range(w.n_qp):
        base, count, log2 = f.recv_buffers(q)
        assert base >= w.plan["host_scratch"] + 256 * w.n_qp and count == cfg.request_credits
        assert base + (count << log2) <= w.plan["end"]
        assert (1 << log2) >= 24 + 32 + cfg.max_inline
        assert f.rd(REG_QP + QP_STRIDE * q) == 3        # RTS


def test_init_overwrites_a_dirty_memory():
    w = World()
    w.fake.mem[:] = bytes(random.Random(1).randrange(256) for _ in range(len(w.fake.mem)))
    run(w.drv.init())
    assert w.image_ok()


def test_memory_plan_refuses_a_small_memory():
    cfg = TargetConfig()
    with pytest.raises(ValueError, match="memory plan needs"):
        KbtpDriver(TargetPort(None), cfg, mem_size=cfg.layout()["size"])


# --------------------------------------------------------------------------------------------
# HELLO
# --------------------------------------------------------------------------------------------

def test_hello_programs_engine_session_and_range():
    w = World(trust_domains={5: 2}, n_qp=3)
    m, res = w.slow(0, hello(5, Features.RECORD_COMPLETION.value))
    ack = ack_of(m)
    assert ack.status == 0 and res.status == "OK" and res.op == "HELLO"
    assert w.session_reg(0) == 1 | 1 << 1 | 2 << 8
    q = lambda n: w.fake.rd(REG_KBTP + ENG["QP"] + ENG[n])      # noqa: E731
    assert q("QP_HANDLE_BASE_LO") == ack.handle_base and q("QP_HANDLE_COUNT") == ack.handle_count
    assert q("QP_QUOTA") == ack.allocation_quota and q("QP_USAGE") == 0
    assert q("QP_SCRATCH") == w.plan["engine_scratch"]
    assert w.fake.rd(REG_KBTP + ENG["RANGE"]) == 1 << 8 | 2
    # the second initiator: next range, its own domain, quota capped by what is left
    m, _ = w.slow(1, hello(6))
    assert ack_of(m).handle_base == ack.handle_base + 64
    assert w.fake.rd(REG_KBTP + ENG["RANGE"] + 4) == 1 << 8 | 0
    assert w.session_reg(1) & 0xFF03 == 1
    assert w.drv.host_actions == 2


@pytest.mark.parametrize("features", [0, 1, 2, 3, 4, 8, 15])
def test_hello_features_and_direct_descriptors(features):
    w = World(block_size=256, num_blocks=10, direct_partitions=2, direct_quota=3, n_qp=3)
    m, _ = w.slow(0, hello(1, features))
    ack = ack_of(m)
    assert ack.status == 0
    if ack.features & Features.DIRECT_LOAD.value:
        for stag in (w.cfg.table_stag, w.cfg.pool_stag):
            mr = w.fake.mr(stag)
            assert mr["qp_mask"] == 1 and mr["control"] & 2 and not mr["control"] & 12
        assert w.fake.mr(w.cfg.pool_stag)["laddr"] == w.lay["pool"]
    if ack.features & Features.DIRECT_ALLOC.value:
        part = w.fake.mr(ack.partition.stag)
        assert part["va"] == ack.partition.tagged_offset and part["control"] & 4
        assert part["length"] == 3 * 256
        assert w.fake.mr(ack.ring.stag)["laddr"] == w.lay["direct"][0]["ring"]
        assert w.fake.mr(ack.head.stag)["laddr"] == w.lay["direct"][0]["head"]
        # a partition session's LOADs, STOREs and ALLOC_STOREs run in the engine: QP_SESSION
        # bits 5..4 = partition 0's ring (1), bit 3 ("host allocates") clear
        assert w.session_reg(0) & 0b111001 == 1 | 1 << 4
        assert w.drv.engine_parts


def test_open_qp_refuses_a_qpn_of_another_index():
    """The target finds a packet's QP by (qpn - QPN_BASE) mod 2**QP_INDEX_BITS (hw/iface.py):
    a local QPN that names another index would never be found, so the driver refuses it and
    names the value; a QPN of a later generation of the same index is taken."""
    w = World(num_handles=128, n_qp=4)
    with pytest.raises(ValueError, match=r"local QPN 0x13 is not one of QP 1's.*= 2; use 0x12"):
        run(w.drv.open_qp(1, local_qpn=0x13))
    with pytest.raises(ValueError, match=r"local QPN 0x1000000"):
        run(w.drv.open_qp(1, local_qpn=1 << 24))
    run(w.drv.disconnect(1))
    run(w.drv.open_qp(1, local_qpn=QPN_BASE + 1 + 7 * (1 << QP_INDEX_BITS)))
    assert run(w.drv.port.rreg(REG_QP + QP_STRIDE + 0x04)) == QPN_BASE + 1 + 7 * 64


def test_hello_rejections():
    w = World(num_handles=128, n_qp=4)
    w.slow(0, hello(1))
    m, res = w.slow(1, hello(1))                     # ID bound to a live session
    assert ack_of(m).status == Status.ALREADY_BOUND.value
    assert res.actions[-1][0] == "disconnect"
    w.slow(2, hello(2))
    run(w.drv.open_qp(1))                            # a new connection on QP 1
    w.model.connect(1)
    m, _ = w.slow(1, hello(3))                       # no range left (2 ranges of 64)
    assert ack_of(m).status == Status.NO_SPACE.value
    m, _ = w.slow(0, hello(1))                       # second HELLO on a session: kept
    assert ack_of(m).status == Status.MALFORMED.value
    m, _ = w.slow(3, hello(9)[:30])                  # undecodable HELLO
    assert ack_of(m).status == Status.MALFORMED.value
    # a closed connection's messages are dropped (buffer reposted, nothing sent)
    mark = len(w.fake.sent)
    w.slow(3, free(1, 0x4000))
    assert len(w.fake.sent) == mark


# --------------------------------------------------------------------------------------------
# FREE
# --------------------------------------------------------------------------------------------

def test_free_after_fast_path_alloc():
    w = World(trust_domains={1: 0, 2: 1})            # two domains: freed blocks are cleared
    w.slow(0, hello(1))
    w.slow(1, hello(2, Features.RECORD_COMPLETION.value))
    for k in range(3):
        assert compl_of(w.engine(0, alloc_inline(k, 0x4000 + k, b"blk%d" % k * 10))).status == 0
    assert w.usage_reg(0) == 3
    w.image_ok()
    m, res = w.slow(0, free(10, 0x4001))
    c = compl_of(m)
    assert c.status == 0 and c.data_length == 0 and c.block_offset == 4096
    assert w.usage_reg(0) == 2 and w.fake.free_cmds == 1
    # errors: stale generation, not valid, another initiator's handle, no session yet
    assert compl_of(w.slow(0, free(11, 0x4000, gen=9))[0]).status == \
        Status.STALE_GENERATION.value
    assert compl_of(w.slow(0, free(12, 0x4001))[0]).status == Status.NOT_VALID.value
    assert compl_of(w.slow(0, free(13, 0x4040))[0]).status == Status.INVALID_HANDLE.value
    assert w.usage_reg(0) == 2
    # RECORD with RECORD_COMPLETION: WRITE_IMM of the record to the initiator
    w.engine(1, alloc_inline(20, 0x4040, b"x" * 40))
    w.buffer(1, 0x55, 64)
    m, _ = w.slow(1, free(21, 0x4040, flags=ReqFlags.RECORD.value,
                          completion=codec.ComplDesc(0x55, 8)))
    assert [type(a) for a in m if not isinstance(a, MemWrite)] == [WriteImm]
    assert w.imem_ok(1, 0x55)
    # RECORD to a bad STag: the record write fails, a COMPLETION Send follows
    w.engine(1, alloc_inline(22, 0x4041, b"y"))
    m, _ = w.slow(1, free(23, 0x4041, flags=ReqFlags.RECORD.value,
                          completion=codec.ComplDesc(0x66, 0)))
    assert [type(a) for a in m if not isinstance(a, MemWrite)] == [WriteImm, SendMsg]


def test_requests_before_hello_and_send_with_invalidate():
    w = World(fast_path=False)
    m, _ = w.slow(0, free(1, 0x4000))                # no session: COMPLETION MALFORMED
    assert compl_of(m).status == Status.MALFORMED.value
    w.slow(0, hello(1))
    assert w.session_reg(0) == 0                     # fast path off: the driver runs LOAD
    w.slow(0, alloc_inline(2, 0x4002, b"abc"))
    w.buffer(0, 0x77, 16)
    flags = ReqFlags.INVALIDATE.value | ReqFlags.ALLOW_UNSEALED.value
    m, _ = w.slow(0, codec.encode(codec.Load(flags=flags, request_id=3, handle=0x4002,
                                             data=codec.DataDesc(0x77, 0, 16))))
    assert compl_of(m).status == 0
    assert [(op, inv) for _, op, _, inv, _, _ in w.fake.sent[-2:]] == \
        [(WrOp.WRITE, None), (WrOp.SEND_INV, 0x77)]
    assert w.imem_ok(0, 0x77)


def test_deferred_free_queues_the_next_behind_it():
    """The engine's free is deferred while its slot holds an unconsumed block (an ALLOC_STORE
    of another QP took the ticket and is stalled); the driver's next FREE does not wait: its
    block goes into the engine's free queue behind the deferred one (FREE_PUSH), and the engine
    runs it once the stalled allocation has consumed the slot. The driver never writes the
    ring itself."""
    w = World(block_size=256, num_blocks=4, overcommit_quotas=True, quota_per_initiator=4)
    w.slow(0, hello(1))
    w.slow(1, hello(2))
    w.engine(0, alloc_inline(1, 0x4000, b"a"))               # ticket 0
    w.model.hold(1)
    w.engine(1, alloc_inline(2, 0x4040, b"b"))               # ticket 1 taken, stalled
    w.engine(0, alloc_inline(3, 0x4001, b"c"))               # ticket 2
    w.slow(0, free(4, 0x4001))                               # Tail 4 -> slot 0 free: written
    assert w.fake.deferred is None
    m, _ = w.slow(0, free(5, 0x4000))                        # Tail 5 -> slot 1: deferred
    assert compl_of(m).status == 0 and w.fake.deferred is not None
    w.engine(0, alloc_inline(6, 0x4002, b"d"))
    # Queued behind the deferred free: answered at once. Until it starts, the Tail counter lags
    # the model's by its ticket (the model takes a FREE's ticket at once).
    m = w.model.receive(0, free(7, 0x4002), w.now)
    mark = len(w.fake.sent)
    w.fake.deliver(0, free(7, 0x4002))
    res = run(w.drv.poll(w.now))
    assert res.status == "OK" and wire_of_fake(w.fake.sent[mark:]) == wire_of_model(m)
    assert len(w.fake.free_queue) == 1
    # the engine finishes the stalled allocation; the deferred free, then the queued one, run
    for a in w.model.release(1, w.now):
        if isinstance(a, MemWrite):
            w.fake.mem[a.addr:a.addr + len(a.data)] = a.data
    w.fake._run_queue()
    assert w.fake.deferred is None and not w.fake.free_queue and w.fake.free_cmds == 3
    assert w.image_ok()


def stuck_queue_world(**over):
    """A free deferred for good (the ALLOC_STORE that took its slot's ticket never finishes),
    a free queue of one entry, and two more FREEs delivered: the first fills the queue."""
    w = World(block_size=256, num_blocks=4, overcommit_quotas=True, quota_per_initiator=4,
              **over)
    w.slow(0, hello(1))
    w.slow(1, hello(2))
    w.engine(0, alloc_inline(1, 0x4000, b"a"))
    w.model.hold(1)
    w.engine(1, alloc_inline(2, 0x4040, b"b"))
    w.engine(0, alloc_inline(3, 0x4001, b"c"))
    w.slow(0, free(4, 0x4001))
    w.slow(0, free(5, 0x4000))                               # deferred for good
    w.engine(0, alloc_inline(6, 0x4002, b"d"))
    w.engine(0, alloc_inline(8, 0x4003, b"e"))
    w.fake.free_depth = 1
    w.drv.wc_polls = 50
    return w


def test_full_free_queue_behind_a_stuck_free_raises():
    w = stuck_queue_world()
    w.fake.deliver(0, free(7, 0x4002))                       # fills the queue
    assert run(w.drv.poll(w.now)).status == "OK" and len(w.fake.free_queue) == 1
    w.fake.deliver(0, free(9, 0x4003))
    reposts, mark = w.fake.reposts.get(0, 0), len(w.fake.sent)
    with pytest.raises(DriverError, match="free queue stayed full"):
        run(w.drv.poll(w.now))
    # The error does not wedge the connection: the initiator is answered (INTERNAL, the FREE's
    # Request ID) and the receive buffer goes back, so the engine takes the QP's next message.
    assert w.fake.reposts.get(0, 0) == reposts + 1
    sent = [codec.decode(x[2]) for x in w.fake.sent[mark:] if x[0] == 0]
    assert [(c.request_id, c.status) for c in sent] == [(9, Status.INTERNAL.value)]


# --------------------------------------------------------------------------------------------
# BIND, tickets, Ticket Timeout
# --------------------------------------------------------------------------------------------

def bind(rid, h, ticket, boff, dlen, gen=0):
    return codec.encode(codec.Bind(request_id=rid, handle=h, generation=gen, ticket=ticket,
                                   data_length=dlen, block_offset=boff))


def direct_world(**over):
    cfg = dict(block_size=256, num_blocks=10, direct_partitions=2, direct_quota=3,
               ticket_timeout_ms=50, n_qp=3)
    cfg.update(over)
    w = World(**cfg)
    m, _ = w.slow(0, hello(1, Features.DIRECT_ALLOC.value), now=0)
    return w, ack_of(m)


def slot_block(w, ack, ticket):
    a = w.lay["direct"][0]["ring"] + 16 * (ticket % ack.ring.count)
    return int.from_bytes(w.fake.mem[a + 8:a + 16], "big")


def test_bind_after_direct_allocation():
    w, ack = direct_world()
    t0 = w.fetch_add(0, ack.head.stag) >> 32
    boff = slot_block(w, ack, t0)
    # the initiator writes its data through the Partition STag (the responder's RDMA WRITE)
    a = w.model._region(0, ack.partition.stag, boff, 5, "w")
    w.model.remote_write(0, ack.partition.stag, boff, b"hello")
    w.fake.mem[a:a + 5] = b"hello"
    m, res = w.slow(0, bind(1, ack.handle_base, t0, boff, 5), now=1)
    c = compl_of(m)
    assert c.status == 0 and c.block_offset == boff and res.status == "OK"
    # again: ALREADY_BOUND; an unknown ticket: MALFORMED; wrong block: MALFORMED
    assert compl_of(w.slow(0, bind(2, ack.handle_base, t0, boff, 5))[0]).status == \
        Status.ALREADY_BOUND.value
    assert compl_of(w.slow(0, bind(3, ack.handle_base + 1, 7, boff, 5))[0]).status == \
        Status.MALFORMED.value
    t1 = w.fetch_add(0, ack.head.stag) >> 32
    assert compl_of(w.slow(0, bind(4, ack.handle_base + 1, t1, boff, 5))[0]).status == \
        Status.MALFORMED.value
    assert compl_of(w.slow(0, bind(5, ack.handle_base + 1, t1, slot_block(w, ack, t1),
                                   999))[0]).status == Status.TOO_LARGE.value
    # FREE returns a partition block to the partition ring (the engine's free queue, ring 1),
    # then BIND again
    m, _ = w.slow(0, free(6, ack.handle_base))
    assert compl_of(m).status == 0
    m, _ = w.slow(0, bind(7, ack.handle_base + 1, t1, slot_block(w, ack, t1), 3))
    assert compl_of(m).status == 0


def test_ticket_timeout_reclaims_and_invalidates():
    w, ack = direct_world()
    t0 = w.fetch_add(0, ack.head.stag) >> 32
    t1 = w.fetch_add(0, ack.head.stag) >> 32
    b1 = slot_block(w, ack, t1)                      # what the initiator read from the ring
    w.slow(0, bind(1, ack.handle_base, t0, slot_block(w, ack, t0), 0), now=10)
    m = w.tick(40)                                   # t1 seen at 10: not yet
    assert not other_of_model(m)
    m = w.tick(61)
    assert [type(a) for a in m if not isinstance(a, MemWrite)] == [InvalidateStag] * 3
    for stag in (ack.partition.stag, ack.ring.stag, ack.head.stag):
        assert w.fake.mr(stag) is None, "MR still valid after the invalidation"
    assert w.model.counters.get(("RECLAIM", "OK")) == w.drv.stats.get(("RECLAIM", "OK")) == 1
    m, _ = w.slow(0, bind(2, ack.handle_base + 1, t1, b1, 0), now=62)
    assert compl_of(m).status == Status.TICKET_ABANDONED.value


# --------------------------------------------------------------------------------------------
# DIRECT_ALLOC partitions served by the engine (engine_parts): rings 1..3, tagged frees
# --------------------------------------------------------------------------------------------

def test_engine_programs_partition_rings():
    w, _ = direct_world()
    e = lambda name: w.fake.rd(REG_KBTP + ENG[name])       # noqa: E731
    for p, d in enumerate(w.lay["direct"]):
        assert (e(f"PART{p}_RING"), e(f"PART{p}_HEAD"), e(f"PART{p}_TAIL")) == \
            (d["ring"], d["head"], d["tail"])
    assert e("PART_ORDER") == w.cfg.direct_ring_order


def test_engine_free_refuses_what_the_ring_bits_would_hide():
    w = World()
    with pytest.raises(DriverError, match="Block Offset 0x4000000000000000 is not below 2"):
        run(w.drv._engine_free_many([(1 << 62, 0)]))
    assert w.fake.free_cmds == 0
    # a pool whose last Block Offset reaches bit 62 keeps every request on the host
    cfg = TargetConfig(pool_to_base=(1 << 62) - 15 * 4096)
    drv = KbtpDriver(TargetPort(None), cfg)
    assert not drv.fast_ok and not drv.engine_parts
    assert drv.fast_off_reasons == ["the last Block Offset 0x4000000000000000 is not below "
                                    "2**62 (a free names its ring in bits 63..62)"]
    assert KbtpDriver(TargetPort(None), TargetConfig(pool_to_base=(1 << 62) - 16 * 4096)).fast_ok


def test_partition_free_goes_through_the_engine_queue():
    """A partition session's ALLOC_STORE runs in the engine (the model plays it); its FREE
    gives the block back through the engine's free queue, tagged with ring 1 (partition 0),
    and the fake engine writes it into partition 0's ring as the model does."""
    w, ack = direct_world()
    assert w.session_reg(0) & 0b111000 == 1 << 4
    c = compl_of(w.engine(0, alloc_inline(1, ack.handle_base, b"abc")))
    assert c.status == 0 and w.usage_reg(0) == 0
    first = w.cfg.block_offset(w.lay["direct"][0]["first_block"])
    assert first <= c.block_offset < first + 3 * 256
    mark = w.fake.free_cmds
    m, _ = w.slow(0, free(2, ack.handle_base), now=1)        # checks the image vs the model
    assert compl_of(m).status == 0 and w.fake.free_cmds == mark + 1
    assert w.fake.pushed[-1] == c.block_offset | 1 << RING_SHIFT
    tail = int.from_bytes(w.fake.mem[w.lay["direct"][0]["tail"]:][:8], "little") >> 32
    assert tail == 4                                         # 3 at init, 1 freed


def test_partitions_beyond_the_engine_stay_on_the_host():
    """More partitions than the engine serves: a partition session's ALLOC_STOREs come to the
    host (QP_SESSION bit 3, ring bits 0), which frees into the partition rings itself; the
    engine's free queue refuses a partition ring."""
    w, ack = direct_world(num_blocks=10, direct_partitions=4, direct_quota=2)
    assert w.drv.fast_ok and not w.drv.engine_parts
    assert w.session_reg(0) & 0b111001 == 0b1001
    m, _ = w.slow(0, alloc_inline(1, ack.handle_base, b"host"), now=1)
    c = compl_of(m)
    assert c.status == 0
    mark = w.fake.free_cmds
    assert compl_of(w.slow(0, free(2, ack.handle_base), now=2)[0]).status == 0
    assert w.fake.free_cmds == mark                          # the host wrote the ring
    with pytest.raises(DriverError, match="into ring 1 .partition 0.: the engine does not"):
        run(w.drv._engine_free_many([(c.block_offset, 1)]))


def test_slot_consumed():
    N, t = 8, 5
    assert not slot_consumed(t, t, 0x1200)                   # filled, not consumed yet
    assert slot_consumed(t, t, (1 << 64) - 1)                # consumed on this lap
    assert slot_consumed(t, t + N, 0x1300)                   # refilled for the next lap
    assert slot_consumed(t, t + N, (1 << 64) - 1)            # ... and consumed again
    assert not slot_consumed(t, t - N, (1 << 64) - 1)        # waiting for this lap's free
    assert not slot_consumed(t, t - N, 0x1200)               # last lap's block not yet taken
    w = 0xFFFFFFFE                                           # across the 32-bit wrap
    assert slot_consumed(w, (w + N) & 0xFFFFFFFF, 0x1200)
    assert not slot_consumed(w, w - N, (1 << 64) - 1)
    assert not slot_consumed(2, (2 - N) & 0xFFFFFFFF, (1 << 64) - 1)


def test_tick_drops_engine_tickets_and_times_out_initiators():
    """The engine's ALLOC_STORE takes a ticket on the partition Head; the driver sees it as an
    initiator's (first sight at its poll), but the tick finds its slot consumed and drops it
    instead of abandoning the partition. An initiator's own idle ticket still times out."""
    w, ack = direct_world()                                  # Ticket Timeout 50 ms
    assert compl_of(w.engine(0, alloc_inline(1, ack.handle_base, b"e"))).status == 0
    assert run(w.drv.poll(1)) is None                        # the driver sees ticket 0
    part = w.drv.parts[0]
    assert list(part.outstanding) == [0]
    w.now = 30
    t1 = w.fetch_add(0, ack.head.stag) >> 32                 # the initiator's, at 30
    assert t1 == 1
    assert run(w.drv.poll(30)) is None
    m = w.tick(61)                                           # ticket 0 seen at 1: not reclaimed
    assert not other_of_model(m) and list(part.outstanding) == [1]
    assert w.drv.stats[("ENGINE_TICKET", "OK")] == 1
    m = w.tick(81)                                           # ticket 1 seen at 30: timed out
    assert [type(a) for a in m if not isinstance(a, MemWrite)] == [InvalidateStag] * 3
    assert w.model.counters.get(("RECLAIM", "OK")) == w.drv.stats.get(("RECLAIM", "OK")) == 1


def test_release_does_not_reclaim_engine_tickets():
    """GOODBYE RELEASE abandons the partition's outstanding tickets: the engine's, seen but not
    yet dropped by a tick, is dropped (before the abandonment, or by the reclamation finding
    its slot consumed), not left waiting for a reclamation that cannot come."""
    w, ack = direct_world()
    w.engine(0, alloc_inline(1, ack.handle_base, b"e"))
    assert run(w.drv.poll(1)) is None
    w.slow(0, codec.encode(codec.Goodbye(flags=GoodbyeFlags.RELEASE.value)), now=2)
    part = w.drv.parts[0]
    assert not part.outstanding and not part.to_reclaim and not part.abandoned
    assert w.drv.stats[("ENGINE_TICKET", "OK")] == 1


# --------------------------------------------------------------------------------------------
# GOODBYE, retention, reconnection
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("release", [False, True])
def test_goodbye_retention_and_reconnect(release):
    w = World(retention_ms=100, n_qp=3)
    w.slow(0, hello(1), now=0)
    for k in range(3):
        w.engine(0, alloc_inline(k, 0x4000 + k, b"data%d" % k))
    flags = GoodbyeFlags.RELEASE.value if release else 0
    m, res = w.slow(0, codec.encode(codec.Goodbye(flags=flags)), now=5)
    assert not [a for a in m if isinstance(a, SendMsg)]
    assert res.actions == [("disconnect", 0, "GOODBYE")] and res.status is None
    assert w.session_reg(0) == 0
    # the same initiator comes back on another QP: retained bindings are still there
    m, _ = w.slow(1, hello(1), now=50)
    assert ack_of(m).status == 0
    if not release:
        assert w.usage_reg(1) == 3 and w.session_reg(1) & 1
        m, _ = w.slow(1, free(9, 0x4001), now=51)
        assert compl_of(m).status == 0 and w.usage_reg(1) == 2
    else:
        assert w.usage_reg(1) == 0
        assert w.fake.rd(REG_KBTP + ENG["RANGE"]) == 1 << 8


def test_disconnect_then_retention_expiry():
    w = World(retention_ms=100, trust_domains={1: 1})
    w.slow(0, hello(1), now=0)
    w.engine(0, alloc_inline(1, 0x4000, b"zz"))
    w.model.disconnect(0, 10)
    run(w.drv.disconnect(0, 10))
    assert w.session_reg(0) == 0 and w.fake.rd(REG_KBTP + ENG["RANGE"]) == 1 << 8 | 1
    w.tick(50)
    w.tick(111)                                      # retention over: bindings freed
    assert w.fake.rd(REG_KBTP + ENG["RANGE"]) == 0
    assert w.model.counters[("RETENTION_EXPIRY", "OK")] == \
        w.drv.stats[("RETENTION_EXPIRY", "OK")] == 1


# --------------------------------------------------------------------------------------------
# Undecodable messages
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("raw", [
    b"\x01", b"\x01\x05\x00", bytes(30), bytes.fromhex("02050000") + bytes(60),
    bytes.fromhex("01ee0000") + bytes(52),
    codec.encode(codec.Completion(request_id=5, handle=0x4000)),
    bytes.fromhex("0105ffff") + bytes(60),
])
def test_malformed_messages(raw):
    w = World()
    w.slow(0, hello(1))
    m, res = w.slow(0, raw)
    assert compl_of(m).status != 0


# --------------------------------------------------------------------------------------------
# Slow-path data operations (fast path off): random sequences against the model
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(6))
def test_random_slow_path_against_model(seed):
    rng = random.Random(seed)
    over = rng.choice([dict(), dict(addr_le=True), dict(masked=False),
                       dict(direct_partitions=1, direct_quota=4)])
    w = World(fast_path=False, block_size=128, num_blocks=12, num_handles=128,
              trust_domains={3: 1}, max_inline=64, **over)
    feats = [Features.RECORD_COMPLETION.value | (8 if over.get("addr_le") else 0),
             Features.DIRECT_ALLOC.value | 4, 0]
    for q in range(2):
        m, _ = w.slow(q, hello(q + 2 + q, feats[q] if q == 0 else rng.choice(feats)))
    for q in range(2):
        w.buffer(q, 0x100 + q, bytes(rng.randrange(256) for _ in range(512)))
        w.buffer(q, 0x200 + q, 256)
        w.buffer(q, 0x300 + q, 64, access="r")
    for k in range(100):
        q = rng.randrange(2)
        s = w.model.session_of(q)
        le = s.addr_le if s else False
        h = rng.choice([s.handle_base + rng.randrange(4) if s else 0x4000] * 4
                       + [0x4000 + rng.randrange(128)])
        op = rng.choice(["load", "store", "alloc", "alloc_rdma", "free", "free"])
        flags = rng.choice([0, 0, ReqFlags.RECORD.value, ReqFlags.SEAL.value,
                            ReqFlags.ALLOW_UNSEALED.value])
        gen = rng.choice([0] * 8 + [2, 3])
        comp = codec.ComplDesc(rng.choice([0x200 + q, 0x300 + q]), 8 * rng.randrange(4)) \
            if flags & ReqFlags.RECORD.value else None
        if op == "load":
            msg = codec.Load(flags=flags & ~ReqFlags.SEAL.value, request_id=k, handle=h,
                             generation=gen, completion=comp,
                             data=codec.DataDesc(rng.choice([0x200 + q, 0x300 + q]), 0,
                                                 rng.choice([8, 128, 256])))
        elif op in ("store", "alloc"):
            data = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 73)))
            cls = codec.Store if op == "store" else codec.AllocStore
            msg = cls(flags=(flags & ~ReqFlags.ALLOW_UNSEALED.value) | ReqFlags.INLINE.value,
                      request_id=k, handle=h, generation=gen, completion=comp,
                      data=codec.DataDesc(0, 0, len(data)), inline=data)
        elif op == "alloc_rdma":
            msg = codec.AllocStore(flags=flags & ~ReqFlags.ALLOW_UNSEALED.value,
                                   request_id=k, handle=h, completion=comp,
                                   data=codec.DataDesc(rng.choice([0x100 + q, 0x999]),
                                                       rng.randrange(8),
                                                       rng.choice([0, 16, 128, 200])))
        else:
            msg = codec.Free(flags=flags & ReqFlags.RECORD.value, request_id=k, handle=h,
                             generation=gen, completion=comp)
        try:
            raw = codec.encode(msg, addr_le=le)
        except codec.KbtpError:
            continue
        w.slow(q, raw, now=k)
        for stag in (0x200 + q, 0x100 + q):
            assert w.imem_ok(q, stag)
    assert w.drv.host_actions >= 60


# --------------------------------------------------------------------------------------------
# counters, port
# --------------------------------------------------------------------------------------------

def test_counters_report():
    w = World(n_qp=2)
    w.slow(0, hello(1))
    w.engine(0, alloc_inline(1, 0x4000, b"q"))
    w.fake.regs[REG_KBTP + ENG["COUNT"] + 4 * (16 * 2 + 0)] = 1      # engine's ALLOC_STORE OK
    w.fake.regs[REG_KBTP + ENG["HOSTQ_COUNT"]] = 1
    c = run(w.drv.counters())
    assert c["host_actions"] == 1 and c["hostq_count"] == 1
    assert c["engine"] == {("ALLOC_STORE", "OK"): 1}
    assert c["free_blocks"]["shared"] == w.model.occupancy()["shared"] == 15
    assert c["quota"][1] == {"qp": 0, "usage": 1, "quota": 4, "state": "active"}
    assert c["slow_path"] == {("HELLO", "OK"): 1}


def test_port_unaligned_memory_and_errors():
    cfg = TargetConfig()
    fake = FakeTarget(cfg, cfg.layout()["size"])
    port = TargetPort(fake)
    ref = bytearray(fake.mem)

    async def go():
        r = random.Random(3)
        for _ in range(200):
            a, n = r.randrange(200), r.randrange(1, 40)
            data = bytes(r.randrange(256) for _ in range(n))
            await port.mem_write(a, data)
            ref[a:a + n] = data
            assert bytes(fake.mem) == bytes(ref)
            b, k = r.randrange(220), r.randrange(1, 30)
            assert await port.mem_read(b, k) == bytes(ref[b:b + k])
        with pytest.raises(HostError, match=r"write MEM 0x102 value 0x12345678"):
            await port.write(Space.MEM, 0x102, 0x12345678)
        with pytest.raises(HostError, match=r"read REG 0x9000"):
            await port.rreg(0x9000)
        assert await port.poll_wc() is None
    run(go())


# --------------------------------------------------------------------------------------------
# Mixed random sessions: fast path (model as engine) + driver, reconnections, tickets, time
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(5))
def test_random_sessions_against_model(seed):
    rng = random.Random(100 + seed)
    w = World(n_qp=3, block_size=128, num_blocks=14, num_handles=256, handles_per_initiator=64,
              direct_partitions=2, direct_quota=3, ticket_timeout_ms=80, retention_ms=60,
              quota_per_initiator=3, trust_domains={1: 0, 2: 0, 3: 1}, max_inline=64)
    open_ = {q: True for q in range(3)}
    now = 0.0
    for k in range(200):
        now += rng.choice([0, 1, 5, 20])
        w.now = now
        q = rng.randrange(3)
        s = w.model.session_of(q) if open_[q] else None
        kind = rng.choice(["hello"] + ["alloc"] * 4 + ["free"] * 3 + ["bind"] * 3
                          + ["fetch"] * 2 + ["goodbye", "disconnect", "tick"] + ["load"] * 2)
        if not open_[q]:
            run(w.drv.open_qp(q))
            w.model.connect(q)
            open_[q] = True
            continue
        if kind == "hello" or s is None:
            m, res = w.slow(q, hello(rng.choice([1, 2, 3]), rng.choice([0, 2, 3, 4, 6])))
            if any(isinstance(a, Disconnect) for a in m):
                open_[q] = False
            continue
        base = s.handle_base
        h = base + rng.randrange(5) if rng.random() < 0.9 else 0x4000 + rng.randrange(256)
        fast = w.session_reg(q) & 1
        host_alloc = w.session_reg(q) & 8           # (engine_parts: never; see below)
        if kind == "alloc":
            raw = alloc_inline(k, h, bytes([k & 0xFF]) * rng.randrange(1, 60))
            w.engine(q, raw) if fast and not host_alloc else w.slow(q, raw)
            if fast and w.session_reg(q) & 0b110000:
                # a partition ALLOC_STORE in the engine took a Head ticket, which the driver
                # takes for an initiator's until a tick finds its slot consumed; the serving
                # driver ticks whenever it is idle (a BIND naming that ticket before would
                # get NO_SPACE from the driver, MALFORMED from the model)
                w.tick(now)
        elif kind == "load":
            w.buffer(q, 0x500 + k, 128)
            raw = codec.encode(codec.Load(flags=ReqFlags.ALLOW_UNSEALED.value, request_id=k,
                                          handle=h, data=codec.DataDesc(0x500 + k, 0, 128)))
            w.engine(q, raw) if fast else w.slow(q, raw)
            if not fast:
                assert w.imem_ok(q, 0x500 + k)
        elif kind == "free":
            w.slow(q, free(k, h))
        elif kind == "fetch" and s.direct_alloc:
            ack_head = w.model.partitions[s.partition].stags[2]
            w.fetch_add(q, ack_head)
            # the serving driver polls all the time: it sees the ticket at once (the model
            # stamps it inside the FetchAdd); the Ticket Timeout runs from that sight
            w.tick(now)
        elif kind == "bind" and s.partition is not None:
            part = w.model.partitions[s.partition]
            tickets = list(part.abandoned) + [rng.randrange(8)]
            t = rng.choice(list(part.outstanding) if part.outstanding and rng.random() < 0.8
                           else tickets)
            a = w.lay["direct"][s.partition]["ring"] + 16 * (t % (1 << w.cfg.direct_ring_order))
            boff = int.from_bytes(w.model.mem[a + 8:a + 16], "big")
            if boff == (1 << 64) - 1:
                boff = w.cfg.block_offset(rng.randrange(14))
            free_h = [x for x in range(base, base + 8) if not w.model.read_entry(x)["flags"] & 1]
            if free_h and rng.random() < 0.8:
                h = rng.choice(free_h)
            w.slow(q, bind(k, h, t, boff, rng.randrange(0, 140)))
        elif kind == "goodbye":
            w.slow(q, codec.encode(codec.Goodbye(flags=rng.choice([0, 1]))))
            open_[q] = False
        elif kind == "disconnect":
            w.model.disconnect(q, now)
            run(w.drv.disconnect(q, now))
            open_[q] = False
            assert w.image_ok()
        elif kind == "tick":
            w.tick(now)
        # the engine's USAGE of every session the engine allocates for from the shared ring
        # equals the model's quota use (a partition session's, QP_SESSION bits 5..4 or bit 3,
        # is the driver's count)
        for qq in range(3):
            ss = w.model.session_of(qq)
            if (open_[qq] and ss is not None and ss.conn == qq
                    and w.session_reg(qq) & 0b111001 == 1):
                assert w.usage_reg(qq) == w.model.usage(ss.initiator_id), (k, qq)
    # operations only the driver runs: its counts equal the model's
    only = ("HELLO", "FREE", "BIND", "GOODBYE", "RECLAIM", "RETENTION_EXPIRY")
    assert {k: v for k, v in w.drv.stats.items() if k[0] in only} == \
        {k: v for k, v in w.model.counters.items() if k[0] in only}


def test_serve_handles_everything_queued_then_ticks():
    w = World(retention_ms=5)
    for q, iid in ((0, 1), (1, 2)):
        w.model.receive(q, hello(iid), 0)
        w.fake.deliver(q, hello(iid))
    w.model.disconnect(1, 0)
    out = run(w.drv.serve(max_idle=2, now=lambda: 0))
    assert [(h.qp, h.op, h.status) for h in out] == [(0, "HELLO", "OK"), (1, "HELLO", "OK")]
    run(w.drv.disconnect(1, 0))
    w.model.tick(10)
    run(w.drv.serve(max_idle=1, now=lambda: 10))      # idle: the tick expires the retention
    assert w.drv.stats[("RETENTION_EXPIRY", "OK")] == 1 and w.image_ok()

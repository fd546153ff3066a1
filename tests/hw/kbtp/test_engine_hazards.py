# Ref: draft KBTP §Operations ("A target processes the requests of one connection in order"),
#      §Block Load, §Block Mapped Store, §Completion; issue 20 (the handle hazards, SCRATCH
#      slots); hw/kbtp/movers.py (WorkIssuer tags, LoadLocks); hw/kbtp/engine.py _in_flight.
"""The engine's requests on the wire without waiting, and the hazards that come with it.

A LOAD's RDMA WRITE and every COMPLETION Send go out without the engine waiting for their
WorkCompletions. The transport reads a WRITE's source block, and a Send's SCRATCH slot, when it
sends them and again when it retransmits them, up to the WorkCompletion. These tests hold the
WorkCompletions back (as a lossy link does) and check at the moment each comes back that the
memory the request reads still holds what the request's place in the connection's order saw:

(A LOAD needs a SEALED block and a STORE an unsealed one, so the one way a request writes a
block a LOAD still sends is through a FREE: the block goes back to the ring and an ALLOC_STORE
gets it.)

* test_alloc_reuses_block_after_load: LOAD h; the host frees h; the next ALLOC_STORE gets h's
  block from the ring and must wait for the LOAD's WRITE before writing it.
* test_other_block_does_not_wait: LOAD h1 held; a STORE of h2 (another block) runs at once.
* test_scratch_slots: SCRATCH_SLOTS LOADs with every WorkCompletion held: each COMPLETION sits in
  its own slot, the next request waits (for a slot and a LoadLocks entry), and every held Send
  still reads its own COMPLETION when its WorkCompletion finally comes.
* test_store_then_load: STORE inline h then LOAD h, the STORE's COMPLETION held: the LOAD sends
  the stored data (the engine finishes the STORE's data and entry before it takes the LOAD).
"""

from amaranth.sim import Simulator

from host import codec
from hw.headers import Opcode, ReqFlags
from hw.iface import WcStatus, WrOp
from hw.kbtp.engine import SCRATCH_SLOTS, Cmd
from hw.kbtp.movers import WR_LOCK, WR_SCRATCH, WR_SYNC
from model.target import InitiatorMemory
from sim.hdl import stream_put

from tests.hw.kbtp.test_kbtp_engine import (RAM_BYTES, RECV_BASE, Top, build, configure, hello,
                                            make_model, norm_model, ram_read, ram_write)
from tests.hw.kbtp.test_kbtp_engine_ring import host_command, host_free, wait_cmd_idle

BS = 256
INLINE, SEAL = ReqFlags.INLINE.value, ReqFlags.SEAL.value
STAG, TO = 0x51, 0x1000


def setup(conns=("y",)):
    model = make_model(block_size=BS, num_blocks=4, pool_to_base=100 * BS,
                       quota_per_initiator=4)
    imems = []
    for i, c in enumerate(conns):
        model.connect(c)
        hello(model, c, i + 1)
        model.initiator_memory(c).register(STAG, 64 * 1024, base_to=TO)
        im = InitiatorMemory()
        im.register(STAG, 64 * 1024, base_to=TO)
        imems.append(im)
    top = Top(bytes(model.mem) + bytes(RAM_BYTES - len(model.mem)))
    return model, top, imems


class Wire:
    """The engine's transport, with WorkCompletions returned only when the test says so."""

    def __init__(self, top, imems):
        self.top, self.imems = top, imems
        self.held = []          # WorkRequests taken and not completed, in order
        self.n = {}

    async def offer(self, ctx, q, raw):
        """Put a request in QP q's next receive buffer and notify the engine."""
        k = self.n[q] = self.n.get(q, 0) + 1
        addr = RECV_BASE + 1024 * q + 256 * (k % 4)
        ram_write(ctx, self.top.ram, addr, raw)
        await stream_put(ctx, self.top.eng.notify, [{"qp": q, "addr": addr,
                                                     "length": len(raw)}])

    async def run(self, ctx, cycles, *, until_repost=True):
        """Take WorkRequests for up to ``cycles`` cycles (until a RecvRepost when
        ``until_repost``); True if the RecvRepost came."""
        eng = self.top.eng
        for _ in range(cycles):
            ctx.set(eng.repost.ready, 1)
            ctx.set(eng.wr.ready, 1)
            _, _, rp, wv, w = await ctx.tick().sample(eng.repost.valid, eng.wr.valid,
                                                      eng.wr.payload)
            if wv:
                self.held.append({f: int(getattr(w, f)) if f != "op" else WrOp(w.op)
                                  for f in ("qp", "wr_id", "op", "rkey", "va", "length",
                                            "laddr")})
            if rp and until_repost:
                ctx.set(eng.repost.ready, 0)
                ctx.set(eng.wr.ready, 0)
                return True
        ctx.set(eng.repost.ready, 0)
        ctx.set(eng.wr.ready, 0)
        return False

    async def complete(self, ctx, k=0):
        """Carry out held WorkRequest k now (it reads target memory now, as a retransmission
        would) and return its WorkCompletion; returns the action as norm_model shows it."""
        w = self.held.pop(k)
        ram, im = self.top.ram, self.imems[w["qp"]]
        if w["op"] == WrOp.WRITE:
            data = ram_read(ctx, ram, w["laddr"], w["length"])
            im.write(w["rkey"], w["va"], data)
            act = ("WRITE", w["rkey"], w["va"], data, False)
        elif w["op"] in (WrOp.SEND, WrOp.SEND_INV):
            act = ("SEND", ram_read(ctx, ram, w["laddr"], w["length"]), None)
        else:
            raise AssertionError(f"unexpected work request {w}")
        await stream_put(ctx, self.top.eng.wc, [{"qp": w["qp"], "wr_id": w["wr_id"],
                                                 "status": WcStatus.OK}])
        return act


def alloc_raw(handle, rid, data, seal=True):
    return build(Opcode.ALLOC_STORE, flags=INLINE | (SEAL if seal else 0), rid=rid, handle=handle, length=len(data),
                 inline=data)


def store_raw(handle, rid, data):
    return build(Opcode.STORE, flags=INLINE | SEAL, rid=rid, handle=handle, length=len(data),
                 inline=data)


def load_raw(handle, rid, gen):
    return build(Opcode.LOAD, rid=rid, handle=handle, gen=gen, stag=STAG, to=TO, length=BS)


async def through(ctx, wire, model, raw):
    """A request of "y" (QP 0) run to its end with every WorkCompletion returned at once; its
    actions must be the golden model's."""
    want = norm_model(model.receive("y", raw))
    await wire.offer(ctx, 0, raw)
    assert await wire.run(ctx, 3000)
    acts = []
    while wire.held:
        acts.append(await wire.complete(ctx))
    assert acts == want


def simulate(top, bench):
    sim = Simulator(top)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()


def block_of(model, handle):
    return model.block_addr(model.read_entry(handle)["block_offset"])


def test_other_block_does_not_wait():
    model, top, imems = setup()
    wire = Wire(top, imems)
    h1 = model.session_of("y").handle_base
    h2 = h1 + 1

    async def bench(ctx):
        await configure(ctx, top.eng, model, ["y"])
        for h, rid, seal in ((h1, 1, True), (h2, 2, False)):
            raw = alloc_raw(h, rid, bytes([rid]) * 16, seal)
            await through(ctx, wire, model, raw)
        load = load_raw(h1, 3, model.read_entry(h1)["generation"])
        store = store_raw(h2, 4, b"other block!" * 2)
        want = norm_model(model.receive("y", load)) + norm_model(model.receive("y", store))
        # The LOAD: its WRITE and its COMPLETION are both taken, neither completes.
        await wire.offer(ctx, 0, load)
        assert await wire.run(ctx, 3000), "the LOAD waited for its WorkCompletions"
        assert [w["op"] for w in wire.held] == [WrOp.WRITE, WrOp.SEND]
        assert wire.held[0]["wr_id"] & WR_LOCK and not wire.held[0]["wr_id"] & WR_SYNC
        assert wire.held[1]["wr_id"] & WR_SCRATCH and not wire.held[1]["wr_id"] & WR_SYNC
        # The STORE into another block runs under it.
        await wire.offer(ctx, 0, store)
        assert await wire.run(ctx, 3000), "a STORE into another block waited for a LOAD"
        assert ram_read(ctx, top.ram, block_of(model, h2), 24) == b"other block!" * 2
        got = [await wire.complete(ctx) for _ in range(len(wire.held))]
        assert got == want

    simulate(top, bench)


def test_alloc_reuses_block_after_load():
    model, top, imems = setup()
    wire = Wire(top, imems)
    h = model.session_of("y").handle_base
    old, new = bytes(range(1, 17)), bytes(range(201, 217))

    async def bench(ctx):
        await configure(ctx, top.eng, model, ["y"])
        # Four ALLOC_STOREs take the four blocks: the ring is empty.
        for i in range(4):
            raw = alloc_raw(h + i, 10 + i, old if i == 0 else bytes([i]) * 8)
            await through(ctx, wire, model, raw)
        blk = block_of(model, h)
        load = load_raw(h, 2, model.read_entry(h)["generation"])
        want_load = norm_model(model.receive("y", load))
        await wire.offer(ctx, 0, load)
        assert await wire.run(ctx, 3000)
        assert [w["op"] for w in wire.held] == [WrOp.WRITE, WrOp.SEND]
        # FREE h (by the host: the model's FREE, the entry and usage on the hardware) while
        # the LOAD's WRITE is on the wire; the block goes back with FREE_BLOCK.
        boff = await host_free(ctx, top, model, h)
        await host_command(ctx, top.eng.bus, Cmd.FREE_BLOCK, boff)
        await wait_cmd_idle(ctx, top.eng.bus)
        # The next ALLOC_STORE gets that block and must wait for the LOAD's WRITE.
        alloc = alloc_raw(h + 4, 20, new)
        want_alloc = norm_model(model.receive("y", alloc))
        assert codec.decode(want_alloc[-1][1]).block_offset == boff
        await wire.offer(ctx, 0, alloc)
        assert not await wire.run(ctx, 1500), "the ALLOC_STORE wrote under a LOAD's WRITE"
        assert ram_read(ctx, top.ram, blk, len(old)) == old
        got_load = [await wire.complete(ctx), await wire.complete(ctx)]
        assert got_load == want_load
        assert got_load[0][3] == old
        assert await wire.run(ctx, 3000)
        got_alloc = [await wire.complete(ctx) for _ in range(len(wire.held))]
        assert got_alloc == want_alloc
        assert ram_read(ctx, top.ram, blk, len(new)) == new

    simulate(top, bench)


def test_scratch_slots():
    model, top, imems = setup()
    wire = Wire(top, imems)
    h = model.session_of("y").handle_base

    async def bench(ctx):
        await configure(ctx, top.eng, model, ["y"])
        first = alloc_raw(h, 1, b"slots!!!")
        await through(ctx, wire, model, first)
        gen = model.read_entry(h)["generation"]
        want = []
        for i in range(SCRATCH_SLOTS):
            raw = load_raw(h, 100 + i, gen)
            want.append(norm_model(model.receive("y", raw)))
            await wire.offer(ctx, 0, raw)
            assert await wire.run(ctx, 3000), f"LOAD {i} waited"
        sends = [w for w in wire.held if w["op"] == WrOp.SEND]
        assert len({w["laddr"] for w in sends}) == SCRATCH_SLOTS     # a slot each
        # One more waits (for a LoadLocks entry and a SCRATCH slot: both have 8).
        raw = load_raw(h, 200, gen)
        want.append(norm_model(model.receive("y", raw)))
        await wire.offer(ctx, 0, raw)
        assert not await wire.run(ctx, 1500), "a COMPLETION without a free SCRATCH slot"
        assert [w["op"] for w in wire.held].count(WrOp.SEND) == SCRATCH_SLOTS
        # Complete in order: each Send still reads its own COMPLETION; the last one goes out
        # once the first slot is free.
        got = []
        while len(got) < SCRATCH_SLOTS + 1:
            got.append([await wire.complete(ctx), await wire.complete(ctx)])
            await wire.run(ctx, 200)
        assert got == want

    simulate(top, bench)


def test_store_then_load():
    model, top, imems = setup()
    wire = Wire(top, imems)
    h = model.session_of("y").handle_base

    async def bench(ctx):
        await configure(ctx, top.eng, model, ["y"])
        first = alloc_raw(h, 1, b"first...", seal=False)
        await through(ctx, wire, model, first)
        gen = model.read_entry(h)["generation"]
        # STORE, then LOAD with the STORE's COMPLETION still held.
        store, load = store_raw(h, 2, b"second.." * 4), load_raw(h, 3, gen)
        want = norm_model(model.receive("y", store)) + norm_model(model.receive("y", load))
        await wire.offer(ctx, 0, store)
        assert await wire.run(ctx, 3000)
        await wire.offer(ctx, 0, load)
        assert await wire.run(ctx, 3000)
        got = [await wire.complete(ctx) for _ in range(len(wire.held))]
        assert got == want
        assert got[1][3][:32] == b"second.." * 4

    simulate(top, bench)

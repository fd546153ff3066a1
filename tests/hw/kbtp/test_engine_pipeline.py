# Ref: draft KBTP §Operations ("A target processes the requests of one connection in order"),
#      §Block Mapped Store, §Block Unmapped Store, §Allocation Quotas, §Completion; issue 20
#      (pipelined engine: front / back stages, in-order context FIFO, hazard rules a-d);
#      model/target.py Readings 10 (a failed RDMA READ: INTERNAL, the block back to the ring).
"""The pipelined engine: a store's RDMA READ no longer holds up the requests behind it.

:class:`Pipe` (the hazard tests' :class:`Wire` driving every engine port each cycle) takes
messages without blocking the testbench, carries out an RDMA READ only when the test returns its
WorkCompletion, and watches ``hostq``. Every answer is compared with the golden model run
serially: per QP, the data transfers and the COMPLETIONs, each in the engine's issue order.
New behaviour: test_reads_overlap, test_other_qp_overlaps (fail on the serial engine). Hazards
(a) test_load_waits_for_store_of_same_handle, (b) test_failed_alloc_read_gives_block_back /
_quota_back, (c) test_slow_path_waits_for_pipeline, (d) COMPLETION order, in all of them.
STOREs into one handle (hw/kbtp/context.py ``entry_hit``): past a STORE without SEAL, a STORE
by READ of the same QP goes on (test_stores_into_one_handle_overlap), and so does an inline STORE
past an inline one (test_inline_stores_into_one_handle_overlap); an inline STORE
(test_inline_store_waits_for_read_of_same_handle) and a STORE by READ after an inline copy
still running (test_read_store_waits_for_inline_copy_of_same_handle), anything after a STORE with SEAL
(test_store_after_sealing_store_waits) and another QP's STORE (test_other_qp_store_waits) wait.
"""

from host import codec
from host.config import ENTRY_SIZE
from host.policy import SEALED, VALID, decode_entry
from hw.headers import Opcode, Status
from hw.iface import MSG_HEAD_OCTETS, WcStatus, WrOp
from hw.kbtp.movers import WR_CHUNK, WR_CTX
from hw.kbtp.engine import Cmd, KbtpEngine, reg
from model.target import AccessError, InitiatorMemory

from tests.hw.kbtp.test_engine_hazards import (BS, INLINE, SEAL, STAG, TO, Wire, alloc_raw,
                                               block_of, load_raw, setup, simulate, through)
from tests.hw.kbtp.test_kbtp_engine import (RECV_BASE, build, compare_image, configure, hello,
                                            norm_model, ram_read, ram_write, reg_read)
from tests.hw.kbtp.test_kbtp_engine_ring import host_command, host_free, wait_cmd_idle
from tests.hw.kbtp.test_kbtp_engine_ring import setup as ring_setup

BAD_STAG = 0x99                                 # registered nowhere: the READ fails
SRC = TO + 0x2000                               # where the stores' data sit (LOADs write at TO)


class Pipe(Wire):
    """:class:`Wire` with every port driven each cycle by :meth:`go`: offered messages wait in
    ``notifies`` until the engine takes one (the testbench never blocks on RecvNotify), queued
    WorkCompletions in ``wcs``, RecvReposts and hostq beats recorded. :meth:`finish` carries out
    a held WorkRequest, RDMA READs included (data from the initiator memory into the block; a
    refused access returns REMOTE_ACCESS), and queues its WorkCompletion."""

    def __init__(self, top, imems):
        super().__init__(top, imems)
        self.now, self.seq = 0, 0
        self.notifies, self.wcs, self.reposts, self.host, self.done = [], [], [], [], []
        self.head, self.heads = False, []   # head: the first 56 octets on chip (MsgHead)

    def post(self, ctx, q, raw):
        k = self.n[q] = self.n.get(q, 0) + 1
        addr = RECV_BASE + 1024 * q + 256 * (k % 4)
        ram_write(ctx, self.top.ram, addr, raw)
        # as the responder gives them: big-endian, zeros past the message's end
        self.heads.append(int.from_bytes((raw + bytes(MSG_HEAD_OCTETS))[:MSG_HEAD_OCTETS], "big"))
        self.notifies.append({"qp": q, "addr": addr, "length": len(raw)})
        return self.notifies[-1]

    def issued(self, op, qp=None):
        return [w for w in self.held if w["op"] == op and qp in (None, w["qp"])]

    async def go(self, ctx, cycles, until=lambda: False, auto=False):
        """Up to ``cycles`` cycles, until ``until()``; ``auto``: finish every WorkRequest as it
        comes. True if ``until()`` held. Prints what crosses the ports, with the cycle."""
        eng = self.top.eng
        outs = (eng.notify.valid, eng.wc.valid, eng.wr.ready, eng.repost.ready, eng.hostq.ready)
        try:
            for _ in range(cycles):
                if until():
                    return True
                while auto and self.held:
                    self.finish(ctx)
                nv, cv = bool(self.notifies), bool(self.wcs)
                for sig, v in zip(outs, (nv, cv, 1, 1, 1)):
                    ctx.set(sig, v)
                if nv:
                    ctx.set(eng.notify.payload, self.notifies[0])
                ctx.set(eng.head.valid, nv and self.head)
                ctx.set(eng.notify_head_ok, nv and self.head)
                if nv and self.head:
                    ctx.set(eng.head.payload, self.heads[0])
                if cv:
                    ctx.set(eng.wc.payload, self.wcs[0])
                _, _, n_ok, c_ok, wv, w, rv, r, hv, h = await ctx.tick().sample(
                    eng.notify.ready, eng.wc.ready, eng.wr.valid, eng.wr.payload,
                    eng.repost.valid, eng.repost.payload, eng.hostq.valid, eng.hostq.payload)
                self.now += 1
                ev = []
                if nv and n_ok:
                    ev.append(f"notify taken {self.notifies.pop(0)}")
                    self.heads.pop(0)
                if cv and c_ok:
                    ev.append(f"WC {self.wcs.pop(0)}")
                if wv:
                    self.seq += 1
                    d = {f: int(getattr(w, f)) for f in ("qp", "wr_id", "rkey", "va", "length",
                                                           "laddr")}
                    d.update(op=WrOp(w.op), cycle=self.now, seq=self.seq)
                    self.held.append(d)
                    ev.append(f"WR {d['op'].name} qp{d['qp']} wr_id {d['wr_id']:#x}")
                if rv:
                    self.reposts.append((self.now, int(r.qp)))
                    ev.append(f"RecvRepost qp{int(r.qp)}")
                if hv:
                    self.host.append((self.now, int(h.qp), int(h.addr), int(h.length)))
                    ev.append(f"hostq qp{int(h.qp)}")
                for e in ev:
                    print(f"  cycle {self.now:5}: {e}")
            return until()
        finally:
            for sig in (*outs, eng.head.valid, eng.notify_head_ok):
                ctx.set(sig, 0)

    def finish(self, ctx, qp=None):
        """Carry out the oldest held WorkRequest (of ``qp``) now and queue its WorkCompletion;
        returns the action as norm_model shows it."""
        w = self.held.pop(next(i for i, w in enumerate(self.held) if qp in (None, w["qp"])))
        ram, im, status = self.top.ram, self.imems[w["qp"]], WcStatus.OK
        where = (w["rkey"], w["va"])
        if w["op"] == WrOp.READ:
            try:
                data = im.read(*where, w["length"])
                ram_write(ctx, ram, w["laddr"], data)
            except AccessError:
                data, status = b"", WcStatus.REMOTE_ACCESS
            act = ("READ", *where, w["length"], data, status != WcStatus.OK)
        elif w["op"] == WrOp.WRITE:
            data = ram_read(ctx, ram, w["laddr"], w["length"])
            im.write(*where, data)
            act = ("WRITE", *where, data, False)
        else:
            assert w["op"] == WrOp.SEND, w
            act = ("SEND", ram_read(ctx, ram, w["laddr"], w["length"]), None)
        self.wcs.append({"qp": w["qp"], "wr_id": w["wr_id"], "status": status})
        self.done.append((w["seq"], w["qp"], act, w["cycle"]))
        return act

    async def drain(self, ctx, reposts, cycles=5000):
        """Finish everything until ``reposts`` RecvReposts have come and nothing is held."""
        assert await self.go(ctx, cycles, auto=True,
                             until=lambda: len(self.reposts) >= reposts and not self.held
                             and not self.wcs), "the engine did not finish its requests"

    def answers(self, qp, since=0):
        """QP ``qp``'s actions finished since ``done[since]``, in issue order, split."""
        return split([a for _, q, a, _ in sorted(self.done[since:]) if q == qp])


def split(acts):
    """(data transfers, COMPLETIONs), each in issue order: the draft orders a connection's
    COMPLETIONs; where a transfer falls among other requests' COMPLETIONs is the engine's."""
    return ([a for a in acts if a[0] in ("READ", "WRITE")],
            [a for a in acts if a[0] in ("SEND", "WRITE_IMM")])


def status_of(act):
    return Status(codec.decode(act[1]).status)


def put(model, imem, conn, to, data):
    """The same data in the model's and in the stand-in's initiator memory."""
    model.initiator_memory(conn).write(STAG, to, data)
    imem.write(STAG, to, data)


def read_raw(op, handle, rid, n, to=SRC, stag=STAG, seal=True):
    """A STORE / ALLOC_STORE whose data comes by RDMA READ (no INLINE)."""
    return build(op, flags=SEAL if seal else 0, rid=rid, handle=handle, stag=stag, to=to, length=n)


async def settle(ctx, wire, model, conn, q, raw):
    """``through`` for any connection (it runs QP 0 only)."""
    want = norm_model(model.receive(conn, raw))
    mark, n = len(wire.done), len(wire.reposts)
    wire.post(ctx, q, raw)
    await wire.drain(ctx, n + 1)
    assert wire.answers(q, mark) == split(want)


def test_reads_overlap():
    model, top, imems = setup()
    wire = Pipe(top, imems)
    h = model.session_of("y").handle_base
    d1, d2 = bytes(range(1, 49)), bytes(range(101, 165))

    async def bench(ctx):
        await configure(ctx, top.eng, model, ["y"])
        for i in (0, 1):
            await through(ctx, wire, model, alloc_raw(h + i, 1 + i, b"old" * 5, seal=False))
        put(model, imems[0], "y", SRC, d1)
        put(model, imems[0], "y", SRC + 0x100, d2)
        s1 = read_raw(Opcode.STORE, h, 3, len(d1))
        s2 = read_raw(Opcode.STORE, h + 1, 4, len(d2), to=SRC + 0x100)
        want = norm_model(model.receive("y", s1)) + norm_model(model.receive("y", s2))
        assert [status_of(a) for a in split(want)[1]] == [Status.OK, Status.OK]
        wire.post(ctx, 0, s1)
        wire.post(ctx, 0, s2)
        two = await wire.go(ctx, 3000, until=lambda: len(wire.issued(WrOp.READ)) == 2)
        assert two, "the second READ was not issued while the first's WorkCompletion was held"
        r1, r2 = wire.issued(WrOp.READ)
        print(f"READ 1 at cycle {r1['cycle']}, READ 2 at cycle {r2['cycle']}, WC 1 held")
        assert r1["wr_id"] & WR_CTX and r2["wr_id"] & WR_CTX and r1["wr_id"] != r2["wr_id"]
        await wire.go(ctx, 300)
        assert not wire.issued(WrOp.SEND), "a COMPLETION before the first READ's WorkCompletion"
        wire.finish(ctx)                                    # READ 1 and its WC
        assert await wire.go(ctx, 3000, until=lambda: wire.issued(WrOp.SEND))
        assert [w["op"] for w in wire.held] == [WrOp.READ, WrOp.SEND]
        await wire.drain(ctx, 2)
        assert wire.answers(0) == split(want)
        assert [codec.decode(a[1]).request_id for a in wire.answers(0)[1]] == [3, 4]
        compare_image(ctx, top.ram, model)

    simulate(top, bench)


def test_load_waits_for_store_of_same_handle():
    model, top, imems = setup()
    wire = Pipe(top, imems)
    h = model.session_of("y").handle_base
    data = bytes(range(7, 7 + 96))

    async def bench(ctx):
        await configure(ctx, top.eng, model, ["y"])
        await through(ctx, wire, model, alloc_raw(h, 1, b"before.." * 2, seal=False))
        put(model, imems[0], "y", SRC, data)
        store = read_raw(Opcode.STORE, h, 2, len(data))         # seals the block
        load = load_raw(h, 3, model.read_entry(h)["generation"])
        want = norm_model(model.receive("y", store)) + norm_model(model.receive("y", load))
        assert [status_of(a) for a in split(want)[1]] == [Status.OK, Status.OK]
        wire.post(ctx, 0, store)
        assert await wire.go(ctx, 3000, until=lambda: wire.issued(WrOp.READ))
        wire.post(ctx, 0, load)
        await wire.go(ctx, 600)
        assert not wire.issued(WrOp.WRITE), "the LOAD's WRITE went out before the STORE's data"
        assert not wire.issued(WrOp.SEND)
        print(f"cycle {wire.now}: no WRITE while the READ is held")
        wire.finish(ctx)
        await wire.drain(ctx, 2)
        assert wire.answers(0) == split(want), "the LOAD read the entry before the STORE's update"
        assert wire.answers(0)[0][1][3] == data                # the WRITE sends the new data
        compare_image(ctx, top.ram, model)

    simulate(top, bench)


def test_other_qp_overlaps():
    # (setup(conns=("y", "z")) has 4 blocks, all of them y's quota: z could not bind a block)
    model, top = ring_setup(num_blocks=8)
    image = bytes(model.mem)
    model.connect("z")
    hello(model, "z", 2)
    assert bytes(model.mem) == image and model.session_of("z").quota == 4
    imems = [InitiatorMemory(), InitiatorMemory()]
    for c, im in zip(("y", "z"), imems):
        for x in (im, model.initiator_memory(c)):
            x.register(STAG, 64 * 1024, base_to=TO)
    wire = Pipe(top, imems)
    hy, hz = model.session_of("y").handle_base, model.session_of("z").handle_base
    data, zdata = bytes(range(40)), b"z's sealed block" * 3

    async def bench(ctx):
        await configure(ctx, top.eng, model, ["y", "z"])
        await through(ctx, wire, model, alloc_raw(hy, 1, b"y" * 8, seal=False))
        await settle(ctx, wire, model, "z", 1, alloc_raw(hz, 2, zdata))
        put(model, imems[0], "y", SRC, data)
        store = read_raw(Opcode.STORE, hy, 3, len(data))
        load = load_raw(hz, 4, model.read_entry(hz)["generation"])
        want_y, want_z = norm_model(model.receive("y", store)), norm_model(model.receive("z", load))
        assert status_of(want_y[-1]) == status_of(want_z[-1]) == Status.OK
        mark, n = len(wire.done), len(wire.reposts)
        wire.post(ctx, 0, store)
        assert await wire.go(ctx, 3000, until=lambda: wire.issued(WrOp.READ))
        wire.post(ctx, 1, load)
        ok = await wire.go(ctx, 3000, until=lambda: wire.issued(WrOp.WRITE, qp=1))
        assert ok, "QP 1's LOAD waited for QP 0's READ"
        print(f"QP 1's WRITE at cycle {wire.issued(WrOp.WRITE)[0]['cycle']}, "
              f"QP 0's READ (cycle {wire.issued(WrOp.READ)[0]['cycle']}) still held")
        # (z's COMPLETION may wait behind y's context: the context FIFO is one for all QPs)
        wire.finish(ctx, qp=1)                              # z's WRITE, then y's READ
        wire.finish(ctx, qp=0)
        await wire.drain(ctx, n + 2)
        assert wire.answers(0, mark) == split(want_y)
        assert wire.answers(1, mark) == split(want_z)
        compare_image(ctx, top.ram, model)

    simulate(top, bench)


def failed_alloc_then_alloc(model, top, limit):
    """Three ALLOC_STOREs; A by READ of an STag nobody registered (the READ fails), B by READ
    behind it, which fits only once A's block (``limit`` "ring") or quota ("quota") is back."""
    im = InitiatorMemory()
    for x in (im, model.initiator_memory("y")):
        x.register(STAG, 64 * 1024, base_to=TO)
    wire, s = Pipe(top, [im]), model.session_of("y")
    h = s.handle_base
    data = bytes(range(200, 232))

    async def bench(ctx):
        await configure(ctx, top.eng, model, ["y"])
        for i in range(3):
            await through(ctx, wire, model, build(Opcode.ALLOC_STORE, flags=INLINE, rid=1 + i,
                                                  handle=h + i, length=8, inline=bytes([i]) * 8))
        # The limit: B fits only with what A takes and then gives back.
        free, room = model.occupancy()["shared"], s.quota - model.usage(s.initiator_id)
        assert (free == 1 and room > 1) if limit == "ring" else (room == 1 and free > 1)
        last = {block_of(model, h + i) for i in range(3)}
        put(model, im, "y", SRC, data)
        a = read_raw(Opcode.ALLOC_STORE, h + 3, 10, 64, stag=BAD_STAG)
        b = read_raw(Opcode.ALLOC_STORE, h + 4, 11, len(data))
        want_a, want_b = norm_model(model.receive("y", a)), norm_model(model.receive("y", b))
        assert want_a[0][-1] and status_of(want_a[-1]) == Status.INTERNAL
        assert status_of(want_b[-1]) == Status.OK
        if limit == "ring":                                 # A's block, back from the ring
            assert block_of(model, h + 4) not in last
        wire.post(ctx, 0, a)
        wire.post(ctx, 0, b)
        assert await wire.go(ctx, 3000, until=lambda: wire.issued(WrOp.READ))
        await wire.go(ctx, 300)
        assert len(wire.issued(WrOp.READ)) == 1 and not wire.issued(WrOp.SEND)
        print(f"cycle {wire.now}: A's READ held, B waits")
        assert wire.finish(ctx)[-1], "A's READ should have failed"
        await wire.drain(ctx, 2)
        got = wire.answers(0)
        print("COMPLETIONs:", [status_of(c).name for c in got[1]])
        assert [status_of(c) for c in got[1]] == [Status.INTERNAL, Status.OK], \
            "B refused: A's block / quota was not given back first"
        assert got == split(want_a + want_b)
        compare_image(ctx, top.ram, model)
        usage = await reg_read(ctx, top.eng.bus, reg["QP"] + reg["QP_USAGE"])
        assert usage == model.usage(s.initiator_id)

    simulate(top, bench)


def test_failed_alloc_read_gives_block_back():
    # 4 blocks, quota 8 (overcommitted): the ring is the limit, one block left for A.
    model, top = ring_setup(overcommit_quotas=True, quota_per_initiator=8)
    failed_alloc_then_alloc(model, top, "ring")


def test_failed_alloc_read_gives_quota_back():
    # 8 blocks, quota 4: the quota is the limit, A takes its last unit.
    model, top = ring_setup(num_blocks=8, quota_per_initiator=4)
    failed_alloc_then_alloc(model, top, "quota")


def test_slow_path_waits_for_pipeline():
    model, top, imems = setup()
    wire = Pipe(top, imems)
    h = model.session_of("y").handle_base
    data = bytes(range(33))

    async def bench(ctx):
        await configure(ctx, top.eng, model, ["y"])
        await through(ctx, wire, model, alloc_raw(h, 1, b"free me!", seal=False))
        put(model, imems[0], "y", SRC, data)
        store = read_raw(Opcode.STORE, h, 2, len(data))
        want = norm_model(model.receive("y", store))
        assert status_of(want[-1]) == Status.OK
        wire.post(ctx, 0, store)
        assert await wire.go(ctx, 3000, until=lambda: wire.issued(WrOp.READ))
        free = wire.post(ctx, 0, build(Opcode.FREE, rid=3, handle=h)[:24])
        await wire.go(ctx, 600)
        assert not wire.host, "a FREE went to the host while a STORE of its QP was unfinished"
        wire.finish(ctx)
        assert await wire.go(ctx, 3000, auto=True, until=lambda: wire.host)
        await wire.drain(ctx, 1)
        assert wire.host == [(wire.host[0][0], 0, free["addr"], free["length"])]
        assert wire.answers(0) == split(want)
        sent = [c for _, _, a, c in wire.done if a[0] == "SEND"]
        print(f"STORE's COMPLETION issued at cycle {sent[0]}, FREE on hostq at {wire.host[0][0]}")
        assert sent[0] < wire.host[0][0], "the FREE reached the host before the STORE completed"
        # The host does the FREE (the model's, on the hardware's entry, usage and ring).
        boff = await host_free(ctx, top, model, h)
        blk = model.block_addr(boff)                        # cleared on return, as the host does
        ram_write(ctx, top.ram, blk, bytes(model.mem[blk:blk + BS]))
        await host_command(ctx, top.eng.bus, Cmd.FREE_BLOCK, boff)
        await wait_cmd_idle(ctx, top.eng.bus)
        compare_image(ctx, top.ram, model)

    simulate(top, bench)


# ---------------------------------------------------------------- STOREs into one handle
# (hw/kbtp/context.py ``entry_hit``: past a plain STORE (no SEAL) a later STORE by RDMA READ of
# the same QP reads the entry at once; an inline STORE, another QP's STORE and anything after a
# STORE with SEAL wait for it.)

def entry_of(ctx, top, model, handle):
    """The engine's table entry of ``handle``, decoded as the model decodes its own."""
    raw = ram_read(ctx, top.ram, model.entry_addr(handle), ENTRY_SIZE)
    return decode_entry(model.cfg, raw)


def test_stores_into_one_handle_overlap():
    model, top, imems = setup()
    wire = Pipe(top, imems)
    h = model.session_of("y").handle_base
    a, b = bytes(range(1, 81)), bytes(range(150, 190))      # B shorter: A's tail stays

    async def bench(ctx):
        await configure(ctx, top.eng, model, ["y"])
        await through(ctx, wire, model, alloc_raw(h, 1, b"unsealed" * 2, seal=False))
        put(model, imems[0], "y", SRC, a)
        put(model, imems[0], "y", SRC + 0x100, b)
        s1 = read_raw(Opcode.STORE, h, 2, len(a), seal=False)
        s2 = read_raw(Opcode.STORE, h, 3, len(b), to=SRC + 0x100, seal=False)
        want = norm_model(model.receive("y", s1)) + norm_model(model.receive("y", s2))
        assert [status_of(c) for c in split(want)[1]] == [Status.OK, Status.OK]
        wire.post(ctx, 0, s1)
        wire.post(ctx, 0, s2)
        two = await wire.go(ctx, 3000, until=lambda: len(wire.issued(WrOp.READ)) == 2)
        assert two, "the second STORE of h waited for the first's READ (a plain STORE's)"
        r1, r2 = wire.issued(WrOp.READ)
        print(f"READ 1 at cycle {r1['cycle']}, READ 2 (same handle) at cycle {r2['cycle']}, "
              f"WC 1 held")
        assert (r1["va"], r2["va"]) == (SRC, SRC + 0x100)
        assert r1["laddr"] == r2["laddr"] == block_of(model, h)
        await wire.go(ctx, 300)
        assert not wire.issued(WrOp.SEND), "a COMPLETION before the first READ's WorkCompletion"
        wire.finish(ctx)                                    # READ 1 (data A) and its WC
        assert await wire.go(ctx, 3000, until=lambda: wire.issued(WrOp.SEND))
        assert [w["op"] for w in wire.held] == [WrOp.READ, WrOp.SEND]
        await wire.drain(ctx, 2)                            # READ 2 (data B), the COMPLETIONs
        sent = [c for _, _, x, c in wire.done if x[0] == "SEND"]
        print(f"COMPLETIONs issued at cycles {sent}")
        assert wire.answers(0) == split(want)
        assert [codec.decode(x[1]).request_id for x in wire.answers(0)[1]] == [2, 3]
        e = entry_of(ctx, top, model, h)
        assert e == model.read_entry(h) and e["data_length"] == len(b)
        assert e["flags"] & VALID and not e["flags"] & SEALED
        blk = ram_read(ctx, top.ram, block_of(model, h), len(a))
        assert blk == b + a[len(b):], "the block does not hold B (over A's tail)"
        compare_image(ctx, top.ram, model)

    simulate(top, bench)


def test_inline_store_waits_for_read_of_same_handle():
    model, top, imems = setup()
    wire = Pipe(top, imems)
    h = model.session_of("y").handle_base
    a, c = bytes(range(1, 65)), b"inline C" * 3

    async def bench(ctx):
        await configure(ctx, top.eng, model, ["y"])
        await through(ctx, wire, model, alloc_raw(h, 1, b"unsealed" * 2, seal=False))
        put(model, imems[0], "y", SRC, a)
        s1 = read_raw(Opcode.STORE, h, 2, len(a), seal=False)
        s2 = build(Opcode.STORE, flags=INLINE, rid=3, handle=h, length=len(c), inline=c)
        want = norm_model(model.receive("y", s1)) + norm_model(model.receive("y", s2))
        assert [status_of(x) for x in split(want)[1]] == [Status.OK, Status.OK]
        blk = block_of(model, h)
        wire.post(ctx, 0, s1)
        assert await wire.go(ctx, 3000, until=lambda: wire.issued(WrOp.READ))
        wire.post(ctx, 0, s2)
        await wire.go(ctx, 600)
        assert not wire.notifies, "the engine did not take the inline STORE"
        assert ram_read(ctx, top.ram, blk, len(c)) != c, \
            "the inline copy landed while the READ of the same block was held"
        assert not wire.issued(WrOp.SEND), "a COMPLETION before the READ's WorkCompletion"
        assert len(wire.issued(WrOp.READ)) == 1
        print(f"cycle {wire.now}: READ (cycle {wire.issued(WrOp.READ)[0]['cycle']}) held, "
              f"no inline copy yet")
        wire.finish(ctx)                                    # the READ (data A) and its WC
        await wire.drain(ctx, 2)
        sent = [cy for _, _, x, cy in wire.done if x[0] == "SEND"]
        print(f"COMPLETIONs issued at cycles {sent}")
        assert wire.answers(0) == split(want)
        assert [codec.decode(x[1]).request_id for x in wire.answers(0)[1]] == [2, 3]
        assert ram_read(ctx, top.ram, blk, len(c)) == c, "the READ's data landed over C"
        assert entry_of(ctx, top, model, h)["data_length"] == len(c)
        compare_image(ctx, top.ram, model)

    simulate(top, bench)


def test_read_store_waits_for_inline_copy_of_same_handle():
    """The other order: an inline STORE without SEAL, then a STORE by READ of the same handle
    and QP. The copy runs beside the front (hw/kbtp/engine.py), so the READ's entry read must
    wait for it (hw/kbtp/context.py: a plain context passes a later READ of its QP only once
    its copy is done): else the READ's data could land under the copy's last words."""
    model, top, imems = setup()
    wire = Pipe(top, imems)
    wire.head = True        # (the message's head on chip: its front reaches the READ sooner)
    h = model.session_of("y").handle_base
    c, b = bytes((7 * i + 3) & 0xFF for i in range(128)), bytes(range(100, 164))

    async def bench(ctx):
        await configure(ctx, top.eng, model, ["y"])
        await through(ctx, wire, model, alloc_raw(h, 1, b"unsealed" * 2, seal=False))
        put(model, imems[0], "y", SRC, b)
        s1 = build(Opcode.STORE, flags=INLINE, rid=2, handle=h, length=len(c), inline=c)
        s2 = read_raw(Opcode.STORE, h, 3, len(b), seal=False)
        want = norm_model(model.receive("y", s1)) + norm_model(model.receive("y", s2))
        assert [status_of(x) for x in split(want)[1]] == [Status.OK, Status.OK]
        blk = block_of(model, h)
        wire.post(ctx, 0, s1)
        wire.post(ctx, 0, s2)
        assert await wire.go(ctx, 3000, until=lambda: wire.issued(WrOp.READ))
        got = ram_read(ctx, top.ram, blk, len(c))
        print(f"cycle {wire.now}: READ issued (cycle {wire.issued(WrOp.READ)[0]['cycle']}); "
              f"block holds the inline data: {got == c}")
        assert got == c, "the READ of the same handle went out before the inline copy ended"
        await wire.drain(ctx, 2)
        assert wire.answers(0) == split(want)
        assert [codec.decode(x[1]).request_id for x in wire.answers(0)[1]] == [2, 3]
        assert ram_read(ctx, top.ram, blk, len(c)) == b + c[len(b):]
        compare_image(ctx, top.ram, model)

    simulate(top, bench)


def test_inline_stores_into_one_handle_overlap():
    """Two inline STOREs without SEAL into one handle: the second does not wait for the first's
    entry update and RecvRepost (hw/kbtp/context.py ``pass_ordered``): its copy starts when
    the first's copy ends (one copy at a time, in order), so its first word is in the block by
    the first request's RecvRepost. Answers, entry and block are the model's."""
    model, top, imems = setup()
    wire = Pipe(top, imems)
    wire.head = True
    h = model.session_of("y").handle_base
    a, b = bytes((5 * i + 1) & 0xFF for i in range(128)), bytes(range(200, 240))

    async def bench(ctx):
        await configure(ctx, top.eng, model, ["y"])
        await through(ctx, wire, model, alloc_raw(h, 1, b"unsealed" * 2, seal=False))
        s1 = build(Opcode.STORE, flags=INLINE, rid=2, handle=h, length=len(a), inline=a)
        s2 = build(Opcode.STORE, flags=INLINE, rid=3, handle=h, length=len(b), inline=b)
        want = norm_model(model.receive("y", s1)) + norm_model(model.receive("y", s2))
        assert [status_of(x) for x in split(want)[1]] == [Status.OK, Status.OK]
        blk = block_of(model, h)
        n = len(wire.reposts)
        wire.post(ctx, 0, s1)
        wire.post(ctx, 0, s2)
        assert await wire.go(ctx, 3000, auto=True, until=lambda: len(wire.reposts) > n)
        first = ram_read(ctx, top.ram, blk, 8)
        print(f"cycle {wire.now}: the first STORE's RecvRepost; the block starts "
              f"{first.hex()} (the second STORE's data {b[:8].hex()}, the first's {a[:8].hex()})")
        assert first == b[:8], "the second inline STORE waited for the first's entry update"
        await wire.drain(ctx, n + 2)
        assert wire.answers(0) == split(want)
        assert ram_read(ctx, top.ram, blk, len(a)) == b + a[len(b):]
        assert entry_of(ctx, top, model, h)["data_length"] == len(b)
        compare_image(ctx, top.ram, model)

    simulate(top, bench)


def test_store_after_sealing_store_waits():
    model, top, imems = setup()
    wire = Pipe(top, imems)
    h = model.session_of("y").handle_base
    a, b = bytes(range(1, 49)), bytes(range(99, 131))

    async def bench(ctx):
        await configure(ctx, top.eng, model, ["y"])
        await through(ctx, wire, model, alloc_raw(h, 1, b"unsealed" * 2, seal=False))
        put(model, imems[0], "y", SRC, a)
        put(model, imems[0], "y", SRC + 0x100, b)
        s1 = read_raw(Opcode.STORE, h, 2, len(a))               # seals the block
        s2 = read_raw(Opcode.STORE, h, 3, len(b), to=SRC + 0x100, seal=False)
        want = norm_model(model.receive("y", s1)) + norm_model(model.receive("y", s2))
        assert [status_of(x) for x in split(want)[1]] == [Status.OK, Status.SEALED]
        assert len(split(want)[0]) == 1                         # no READ for the second
        wire.post(ctx, 0, s1)
        assert await wire.go(ctx, 3000, until=lambda: wire.issued(WrOp.READ))
        wire.post(ctx, 0, s2)
        await wire.go(ctx, 600)
        assert len(wire.issued(WrOp.READ)) == 1, \
            "a STORE's READ went out behind a held STORE with SEAL of the same handle"
        assert not wire.issued(WrOp.SEND)
        print(f"cycle {wire.now}: READ (cycle {wire.issued(WrOp.READ)[0]['cycle']}) of the "
              f"sealing STORE held, the next STORE waits")
        wire.finish(ctx)
        await wire.drain(ctx, 2)
        sent = [cy for _, _, x, cy in wire.done if x[0] == "SEND"]
        print(f"COMPLETIONs issued at cycles {sent}")
        got = wire.answers(0)
        assert [status_of(x) for x in got[1]] == [Status.OK, Status.SEALED]
        assert got == split(want)
        assert ram_read(ctx, top.ram, block_of(model, h), len(a)) == a
        compare_image(ctx, top.ram, model)

    simulate(top, bench)


def test_other_qp_store_waits():
    # The golden model cannot have two sessions store into one handle: a STORE is authorized
    # only in its session's own range, ranges are handed out disjoint, and a session lives on
    # one connection (a second HELLO with its Initiator ID is refused ALREADY_BOUND). The
    # engine's registers can give QP 1 the same session as QP 0 ("y" twice); the answers are
    # then the model's for both requests on "y" in the engine's order, each compared on the QP
    # that sent it.
    model, top, imems = setup()
    im1 = InitiatorMemory()
    im1.register(STAG, 64 * 1024, base_to=TO)
    wire = Pipe(top, [imems[0], im1])
    h = model.session_of("y").handle_base
    a, b = bytes(range(1, 57)), bytes(range(180, 220))

    async def bench(ctx):
        await configure(ctx, top.eng, model, ["y", "y"])
        await through(ctx, wire, model, alloc_raw(h, 1, b"unsealed" * 2, seal=False))
        put(model, imems[0], "y", SRC, a)
        put(model, im1, "y", SRC + 0x100, b)                   # QP 1's data, in "y"'s model
        s0 = read_raw(Opcode.STORE, h, 2, len(a), seal=False)
        s1 = read_raw(Opcode.STORE, h, 3, len(b), to=SRC + 0x100, seal=False)
        want0, want1 = norm_model(model.receive("y", s0)), norm_model(model.receive("y", s1))
        assert status_of(want0[-1]) == status_of(want1[-1]) == Status.OK
        mark, n = len(wire.done), len(wire.reposts)
        wire.post(ctx, 0, s0)
        assert await wire.go(ctx, 3000, until=lambda: wire.issued(WrOp.READ))
        wire.post(ctx, 1, s1)
        await wire.go(ctx, 600)
        assert not wire.issued(WrOp.READ, qp=1), \
            "QP 1's READ into h went out while QP 0's READ into h was held"
        assert not wire.issued(WrOp.SEND)
        print(f"cycle {wire.now}: QP 0's READ (cycle {wire.issued(WrOp.READ)[0]['cycle']}) "
              f"held, QP 1's STORE of the same handle waits")
        wire.finish(ctx, qp=0)
        await wire.drain(ctx, n + 2)
        r0, r1 = (w for w in sorted(wire.done[mark:]) if w[2][0] == "READ")
        print(f"READs issued at cycles {r0[3]} (QP {r0[1]}), {r1[3]} (QP {r1[1]})")
        assert (r0[1], r1[1]) == (0, 1)
        assert wire.answers(0, mark) == split(want0)
        assert wire.answers(1, mark) == split(want1)
        e = entry_of(ctx, top, model, h)
        assert e == model.read_entry(h) and e["data_length"] == len(b)
        assert ram_read(ctx, top.ram, block_of(model, h), len(a)) == b + a[len(b):]
        compare_image(ctx, top.ram, model)

    simulate(top, bench)


def test_store_waits_for_alloc_store_of_same_handle():
    # An ALLOC_STORE is never plain (hw/kbtp/context.py): it binds the entry, so a STORE of
    # the same handle behind it, even by READ of the same QP, waits for its entry update; read
    # earlier, the entry is still unbound and the STORE answers NOT_VALID.
    model, top, imems = setup()
    wire = Pipe(top, imems)
    h = model.session_of("y").handle_base
    a, b = bytes(range(1, 73)), bytes(range(120, 160))      # B shorter: A's tail stays

    async def bench(ctx):
        await configure(ctx, top.eng, model, ["y"])
        put(model, imems[0], "y", SRC, a)
        put(model, imems[0], "y", SRC + 0x100, b)
        s1 = read_raw(Opcode.ALLOC_STORE, h, 2, len(a), seal=False)
        s2 = read_raw(Opcode.STORE, h, 3, len(b), to=SRC + 0x100, seal=False)
        want = norm_model(model.receive("y", s1)) + norm_model(model.receive("y", s2))
        assert [status_of(x) for x in split(want)[1]] == [Status.OK, Status.OK]
        assert len(split(want)[0]) == 2                         # a READ for each
        wire.post(ctx, 0, s1)
        wire.post(ctx, 0, s2)
        assert await wire.go(ctx, 3000, until=lambda: wire.issued(WrOp.READ))
        await wire.go(ctx, 600)
        assert len(wire.issued(WrOp.READ)) == 1, \
            "a STORE's READ went out behind a held ALLOC_STORE of the same handle"
        assert not wire.issued(WrOp.SEND)
        print(f"cycle {wire.now}: READ (cycle {wire.issued(WrOp.READ)[0]['cycle']}) of the "
              f"ALLOC_STORE held, the STORE of the same handle waits")
        wire.finish(ctx)                                    # the ALLOC_STORE's READ (data A)
        await wire.drain(ctx, 2)
        r = [cy for _, _, x, cy in wire.done if x[0] == "READ"]
        sent = [cy for _, _, x, cy in wire.done if x[0] == "SEND"]
        print(f"READs issued at cycles {r}, COMPLETIONs at cycles {sent}")
        got = wire.answers(0)
        print("COMPLETIONs:", [status_of(x).name for x in got[1]])
        assert [status_of(x) for x in got[1]] == [Status.OK, Status.OK], \
            "the STORE read the entry before the ALLOC_STORE bound it"
        assert got == split(want)
        assert [codec.decode(x[1]).request_id for x in got[1]] == [2, 3]
        e = entry_of(ctx, top, model, h)
        assert e == model.read_entry(h) and e["data_length"] == len(b)
        assert e["flags"] & VALID and not e["flags"] & SEALED
        assert ram_read(ctx, top.ram, block_of(model, h), len(a)) == b + a[len(b):], \
            "the block does not hold B (over A's tail)"
        compare_image(ctx, top.ram, model)

    simulate(top, bench)


def merge_parts(acts):
    """READ actions of one READ's parts (contiguous, of one rkey) joined into one, as the
    model does the READ: WorkIssuer sends a store's READ in parts (hw/kbtp/movers.py)."""
    out = []
    for a in acts:
        p = out[-1] if out else None
        if (a[0] == "READ" and p and p[0] == "READ" and p[1] == a[1] and p[2] + p[3] == a[2]
                and not p[5] and not a[5]):
            out[-1] = ("READ", p[1], p[2], p[3] + a[3], p[4] + a[4], False)
        else:
            out.append(a)
    return out


def test_read_window():
    """With a READ window of 100 octets (hw/kbtp/engine.py ``read_window``), READ parts of 16
    (a quarter, rounded down to a power of two): STOREs of 48, 64 and 160 octets go out as 3, 4
    and 10 parts, in order, contiguous, every part but a READ's last tagged WR_CHUNK and the last
    with the READ's WR_CTX. At every point the parts out hold at most 100 octets, and as many as
    fit: the next part waits only while it does not fit. A part's WorkCompletion makes room for
    the next. The READ of 160 (more than the window) goes all the same. Answers (parts joined)
    and the memory image as the model's."""
    model, top, imems = setup()
    top.eng = KbtpEngine(n_qp=4, n_ranges=8, read_window=100)
    wire = Pipe(top, imems)
    h = model.session_of("y").handle_base
    d1, d2, d3 = bytes(range(1, 49)), bytes(range(101, 165)), bytes(range(0, 160))
    lens = [48, 64, 160]

    async def bench(ctx):
        await configure(ctx, top.eng, model, ["y"])
        for i in (0, 1, 2):
            await through(ctx, wire, model, alloc_raw(h + i, 1 + i, b"old" * 5, seal=False))
        put(model, imems[0], "y", SRC, d1)
        put(model, imems[0], "y", SRC + 0x100, d2)
        put(model, imems[0], "y", SRC + 0x200, d3)
        raws = [read_raw(Opcode.STORE, h, 4, len(d1)),
                read_raw(Opcode.STORE, h + 1, 5, len(d2), to=SRC + 0x100),
                read_raw(Opcode.STORE, h + 2, 6, len(d3), to=SRC + 0x200)]
        want = sum((norm_model(model.receive("y", r)) for r in raws), [])
        assert [status_of(a) for a in split(want)[1]] == [Status.OK] * 3
        mark = len(wire.done)
        for r in raws:
            wire.post(ctx, 0, r)
        parts, outs = [], []            # every part issued; octets out at each stop

        def new_parts():
            for w in wire.issued(WrOp.READ):
                if w["seq"] not in {p["seq"] for p in parts}:
                    parts.append(w)

        while len(parts) < 17:
            await wire.go(ctx, 400)     # until the engine issues nothing more
            new_parts()
            out = sum(w["length"] for w in wire.issued(WrOp.READ))
            outs.append(out)
            assert out <= 100, f"{out} octets of READ parts out, more than the window"
            if len(parts) < 17:
                assert out + 16 > 100, f"only {out} octets out, and the next part of 16 fits"
            wire.finish(ctx)            # the oldest part lands: room for the next
        print("octets out at each stop:", outs)
        sizes = [w["length"] for w in parts]
        assert sizes == [16] * 3 + [16] * 4 + [16] * 10, sizes
        k = 0
        for n, to in zip(lens, (SRC, SRC + 0x100, SRC + 0x200)):
            mine = parts[k:k + n // 16]
            k += n // 16
            assert [w["va"] for w in mine] == [to + 16 * i for i in range(len(mine))]
            assert [w["laddr"] - mine[0]["laddr"] for w in mine] == \
                [16 * i for i in range(len(mine))]
            assert all(w["wr_id"] == WR_CHUNK for w in mine[:-1]), [hex(w["wr_id"]) for w in mine]
            assert mine[-1]["wr_id"] & WR_CTX, hex(mine[-1]["wr_id"])
        await wire.drain(ctx, 3)
        got = wire.answers(0, mark)
        assert (merge_parts(got[0]), got[1]) == split(want)
        compare_image(ctx, top.ram, model)

    simulate(top, bench)


def test_read_depth():
    """The READ depth (hw/kbtp/movers.py WorkIssuer ``read_depth``): with a window of 100
    octets that would hold 6 parts of 16, and a depth of 2, STOREs of 48, 64 and 160 octets
    (17 parts) never have more than 2 READ requests out, and always 2 while parts remain: a
    part's WorkCompletion lets the next one go. Answers (parts joined) and the memory image as
    the model's."""
    model, top, imems = setup()
    top.eng = KbtpEngine(n_qp=4, n_ranges=8, read_window=100, read_depth=2)
    wire = Pipe(top, imems)
    h = model.session_of("y").handle_base
    data = [bytes(range(1, 49)), bytes(range(101, 165)), bytes(range(0, 160))]
    srcs = [SRC, SRC + 0x100, SRC + 0x200]

    async def bench(ctx):
        await configure(ctx, top.eng, model, ["y"])
        for i in (0, 1, 2):
            await through(ctx, wire, model, alloc_raw(h + i, 1 + i, b"old" * 5, seal=False))
        for d, a in zip(data, srcs):
            put(model, imems[0], "y", a, d)
        raws = [read_raw(Opcode.STORE, h + i, 4 + i, len(d), to=a)
                for i, (d, a) in enumerate(zip(data, srcs))]
        want = sum((norm_model(model.receive("y", r)) for r in raws), [])
        mark = len(wire.done)
        for r in raws:
            wire.post(ctx, 0, r)
        seen, outs = set(), []
        while len(seen) < 17:
            await wire.go(ctx, 400)
            out = wire.issued(WrOp.READ)
            seen |= {w["seq"] for w in out}
            outs.append(len(out))
            assert len(out) <= 2, f"{len(out)} READ requests out, more than the depth of 2"
            if len(seen) < 17:
                assert len(out) == 2, f"only {len(out)} READ out, and parts remain"
            wire.finish(ctx)
        print("READ requests out at each stop:", outs)
        await wire.drain(ctx, 3)
        got = wire.answers(0, mark)
        assert (merge_parts(got[0]), got[1]) == split(want)
        compare_image(ctx, top.ram, model)

    simulate(top, bench)

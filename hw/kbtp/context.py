# Ref: draft KBTP §Operations ("A target processes the requests of one connection in order"),
#      §Block Mapped Store / §Block Unmapped Store (the RDMA READ of the data completes before
#      the entry update and the COMPLETION), §Completion; issue 20 (the pipelined engine).
"""The KBTP engine's request contexts: what the front stage hands the back stage.

The engine runs in two stages (hw/kbtp/engine.py). The front takes a message, decodes and
checks it, allocates, copies inline data and hands over the data's WorkRequest; the back
finishes requests in the order the front took them: it waits for a store's RDMA READ, updates
the table entry and sends the COMPLETION. Between them, this queue of contexts: one per request,
written by the front when it is done with it, read by the back at its head, freed when the back
has returned the receive buffer.

Beside each context the queue keeps, in flip-flops, what the front must see of the requests
still in it (the hazards, issue 20):

* ``entry_hit``: a context that will write the table entry at ``probe`` (a STORE or
  ALLOC_STORE past its checks). The front reads no entry that a request before it has yet to
  write: a LOAD after a STORE of the same handle sees the stored block. One exception keeps
  a stream of STOREs into one handle (an initiator rewriting a block it has not sealed)
  pipelined: a *plain* context (a STORE without SEAL) changes only the entry's Data Length,
  whether its READ succeeds or fails, so no check of a later request depends on it. A later
  LOAD or ALLOC_STORE passes it (they get NOT_SEALED / ALREADY_BOUND either way and touch no
  data), and so does a later STORE by RDMA READ *of the same QP* (one RC QP's READ responses
  land in order, so the later data overwrites the earlier as in the serial order; an inline
  copy would land first, and another QP's READ in any order, so those wait). The pass is asked
  with ``probe_qp`` / ``pass_any`` / ``pass_same_qp``.
* ``alloc_pending``: an ALLOC_STORE whose RDMA READ may still fail. Its block and its quota go
  back when it does (model Readings 10), so a later ALLOC_STORE that finds the ring empty or
  its quota used up waits for it: the answer is the serial order's.
* ``empty``: nothing in flight; the front hands a slow-path message to the host only then.

The READ's WorkCompletion comes back tagged with its context's index (``WR_CTX | idx``,
hw/kbtp/movers.py): ``wc`` marks that context done, with its status. An inline store's copy
runs beside the front's next request (hw/kbtp/engine.py); ``copied`` marks its context done.
Until then a plain context of a copy is not passed by a later STORE by READ of its QP (that
READ's data might land before the copy's last word). A later inline STORE passes a plain
context whose data comes by copy, or that has none (``pass_ordered``): the engine runs one copy
at a time, in the front's order, so the later copy lands after the earlier one, as in the
serial order, whichever QP they are of.

Why a hand-written queue rather than amaranth.lib.fifo: the back needs the head's index (to
look up its WorkCompletion) and the front the index it will push at (the READ's tag), and the
hazard checks look at every context in the queue, not just the head.
"""

from amaranth.lib import enum

from amaranth.hdl import Array, Cat, Module, Signal
from amaranth.lib import data, memory, wiring
from amaranth.lib.wiring import In, Out

from hw.iface import ADDR_BITS, QP_INDEX_BITS
from hw.kbtp.decode import REQUEST, RESULT
from hw.kbtp.movers import CTX_BITS
from hw.kbtp.regmap import RING_BITS

__all__ = ["Ctx", "CTX", "CTX_DEPTH", "ContextQueue"]

#: Contexts in flight between the stages (a power of two; the READ's tag holds the index).
CTX_DEPTH = 1 << CTX_BITS


class Ctx(enum.Enum, shape=2):
    """What the back stage does with a context."""
    RESULT = 0      # the answer is known (an error, a LOAD sent): complete
    ENTRY = 1       # data in the block (inline, or none): entry update, then OK
    READ = 2        # data by RDMA READ: wait for its WorkCompletion, then ENTRY (or INTERNAL)
    COPY = 3        # inline data being copied into the block: wait for the copy, then ENTRY


#: One request between the stages.
CTX = data.StructLayout({
    "kind": Ctx, "qp": QP_INDEX_BITS,
    "req": REQUEST, "res": RESULT,
    "entry_addr": ADDR_BITS, "flags": 16, "gen": 16, "next_gen": 16, "boff": 64,
    "granted": 1,                   # the session was granted RECORD_COMPLETION
    "scratch": ADDR_BITS,           # the session's SCRATCH area
    "ring": RING_BITS,              # the ring an ALLOC_STORE's block came from (its RETURN's)
})


class ContextQueue(wiring.Component):
    """In-order queue of ``depth`` request contexts (see the module docstring).

    Ports
    -----
    push : In(1), push_ctx : In(CTX)    append (the front; only when not ``full``)
    push_idx : Out(CTX_BITS)            the index the next push takes (the READ's tag)
    full : Out(1), empty : Out(1)
    head_valid : Out(1), head_rd : Out(CTX), head_done : Out(1), head_ok : Out(1)
        the oldest context, and its READ's WorkCompletion (came back / status OK)
    pop : In(1)                         the back has finished the head
    wc : In(1), wc_idx : In(CTX_BITS), wc_ok : In(1)
        a READ's WorkCompletion for context ``wc_idx``
    copied : In(1), copied_idx : In(CTX_BITS)
        the inline copy of context ``copied_idx`` (a :attr:`Ctx.COPY`) has written its last word
    probe : In(ADDR_BITS), probe_qp : In(QP_INDEX_BITS), pass_any : In(1),
    pass_same_qp : In(1), pass_ordered : In(1), entry_hit : Out(1), alloc_pending : Out(1)
        the hazards (module docstring)
    """

    def __init__(self, depth=CTX_DEPTH):
        assert depth == 1 << CTX_BITS
        self.depth = depth
        super().__init__({
            "push": In(1), "push_ctx": In(CTX), "push_idx": Out(CTX_BITS),
            "full": Out(1), "empty": Out(1),
            "head_valid": Out(1), "head_rd": Out(CTX), "head_done": Out(1), "head_ok": Out(1),
            "pop": In(1),
            "wc": In(1), "wc_idx": In(CTX_BITS), "wc_ok": In(1),
            "copied": In(1), "copied_idx": In(CTX_BITS),
            "probe": In(ADDR_BITS), "probe_qp": In(QP_INDEX_BITS), "pass_any": In(1),
            "pass_same_qp": In(1), "pass_ordered": In(1), "entry_hit": Out(1),
            "alloc_pending": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        n = self.depth
        # (LUT RAM on the ECP5: one 16-deep row of cells per 4 bits)
        m.submodules.ctxs = ctxs = memory.Memory(shape=CTX, depth=n, init=[])
        wp, rp = Signal(CTX_BITS), Signal(CTX_BITS)
        valid, writes, plain, alloc, copying, ordered, done, ok = (
            Signal(n, name=x) for x in ("valid", "writes", "plain", "alloc", "copying",
                                        "ordered", "done", "ok"))
        eaddr = Array(Signal(ADDR_BITS, name=f"eaddr{i}") for i in range(n))
        qps = Array(Signal(QP_INDEX_BITS, name=f"qp{i}") for i in range(n))
        w = ctxs.write_port()
        r = ctxs.read_port(domain="comb")
        c = self.push_ctx
        m.d.comb += [w.addr.eq(wp), w.data.eq(c), w.en.eq(self.push), r.addr.eq(rp),
                     self.head_rd.eq(r.data), self.push_idx.eq(wp),
                     self.full.eq(valid.bit_select(wp, 1)), self.empty.eq(~valid.any()),
                     self.head_valid.eq(valid.bit_select(rp, 1)),
                     self.head_done.eq(done.bit_select(rp, 1)),
                     self.head_ok.eq(ok.bit_select(rp, 1)),
                     self.entry_hit.eq(Cat(
                         valid[i] & writes[i] & (eaddr[i] == self.probe) &
                         ~(plain[i] & (self.pass_any |
                                       (self.pass_same_qp & (qps[i] == self.probe_qp) &
                                        ~(copying[i] & ~done[i])) |
                                       (self.pass_ordered & ordered[i])))
                         for i in range(n)).any()),
                     self.alloc_pending.eq((valid & alloc).any())]
        for i in range(n):
            with m.If(self.push & (wp == i)):
                m.d.sync += [valid[i].eq(1), writes[i].eq(c.kind != Ctx.RESULT),
                             plain[i].eq(~c.req.seal & ~c.req.is_alloc),
                             alloc[i].eq((c.kind == Ctx.READ) & c.req.is_alloc),
                             copying[i].eq(c.kind == Ctx.COPY),
                             ordered[i].eq((c.kind == Ctx.COPY) | (c.kind == Ctx.ENTRY)),
                             eaddr[i].eq(c.entry_addr), qps[i].eq(c.qp)]
            with m.If(self.pop & (rp == i)):
                m.d.sync += [valid[i].eq(0), done[i].eq(0), ok[i].eq(0)]
            with m.If(self.wc & (self.wc_idx == i)):
                m.d.sync += [done[i].eq(1), ok[i].eq(self.wc_ok)]
            with m.If(self.copied & (self.copied_idx == i)):
                m.d.sync += [done[i].eq(1), ok[i].eq(1)]
        with m.If(self.push):
            m.d.sync += wp.eq(wp + 1)
        with m.If(self.pop):
            m.d.sync += rp.eq(rp + 1)
        return m

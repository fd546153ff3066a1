# Ref: draft KBTP §Allocation Quotas (USAGE), §Free-Block Ring (host commands); docs/registers.md
#      (the map, rendered from hw/kbtp/regmap.py); docs/layouts.md; issue 19 items 3 and 4;
#      issue 23 (the free queue).
"""The KBTP engine's register bank: every register of hw/kbtp/regmap.py and what the host bus
does to it.

It owns the configuration registers (exported as :data:`~hw.kbtp.regmap.CONFIG`), the RANGE
registers (a LUT RAM read at ``range_idx``, and a flip-flop per range saying it was written since
reset), the sessions (every session word but USAGE in one memory with registered ports, block RAM
on the ECP5, a row per QP; USAGE in a LUT RAM; a flip-flop per QP saying the row was written since
reset), the COUNT memory with its clearing sweep after reset,
the host command register and the free queue, the statistics (STALL_CYCLES, LAST_LATENCY,
LAST_CYCLES, HOSTQ_COUNT) and the host-bus decode, generated from
:data:`~hw.kbtp.regmap.REGS`: every register of the table must have a storage here (elaborate
fails otherwise) and every access to a word of the window that no register holds is refused
(``err``).

The decode compares the window offset with each plain register's words, but an array (RANGE,
COUNT, the QP session records) by its span only: one range compare of the offset against
``[offset, offset + count * stride)``, then the entry's index from the offset's bits above the
stride (a power of two) and the register and word from the bits below it. (A compare per entry's
word, with RANGE in flip-flops, took EngineRegs of 64 QPs and 64 ranges to 6,237 LUT4 and 1,361
flip-flops in synth_ecp5; this way 3,855 and 849.)

Free queue (issue 23: frees at the rate of allocations). A FREE_BLOCK by CMD costs the host a link
round trip per free (argument, command, then a CMD read until not busy). FREE_PUSH queues Block
Offsets instead, as many as the queue has space for in one go (one link datagram): the high word's
write pushes {HI, LO} into a ``SyncFIFO`` of ``free_depth`` entries (LUT RAM on the ECP5;
``SyncFIFOBuffered`` cost more LUTs for no gain here), or, when the queue is full, is refused with
``err`` and counted in FREE_REFUSED (nothing else changes; the LO word is kept, so a host may resend
only the HI word). Whenever no command is pending, no free is deferred and the queue holds a free,
the bank starts a FREE_BLOCK with the queue's head as its argument, exactly as a host CMD write of
FREE_BLOCK would (``cmd_valid`` / ``cmd_kind`` / ``cmd_arg``): the ring allocator cannot tell the
two apart. The head is popped at ``cmd_ack`` (its Tail FetchAdd is written), so queued frees run in
push order, one after the other, each waiting for the deferred free before it as host commands do.
CMD reads busy while frees are queued, and a CMD write while busy is ignored as before: the host's
rule "read CMD until not busy, then write CMD" still holds, and a host command never overtakes
queued frees (nor is the queue's start arbitrated against it).
"""

from types import SimpleNamespace

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, fifo, memory, wiring
from amaranth.lib.wiring import In, Out

from hw.iface import ADDR_BITS, HostBusSignature, QP_INDEX_BITS, Space
from hw.kbtp import regmap
from hw.kbtp.regmap import CONFIG, ENGINE_ID, FREE_DEPTH, REGS, RING_BITS, WINDOW
from hw.kbtp.ring_alloc import Cmd

__all__ = ["EngineRegs", "SESSION", "RING_SHIFT"]

#: A free's argument (CMD_ARG, a FREE_PUSH entry) names its ring in its top RING_BITS bits
#: (0 the shared ring, p + 1 partition p): the block goes back to the ring it came from, named
#: by the host, which knows it, rather than looked up from six Block Offset bounds here (which
#: cost 384 CCU2C and 384 flip-flops, and left the ECPIX-5 netlist unroutable).
RING_SHIFT = 64 - RING_BITS

#: The session of the request's QP, as the register bank shows it.
SESSION = data.StructLayout({"valid": 1, "record": 1, "addr_le": 1, "host_alloc": 1,
                             "ring": RING_BITS, "domain": 8,
                             "handle_base": 64,
                             "handle_count": 32, "quota": 32, "usage": 32,
                             "scratch": ADDR_BITS})

_QP = next(r for r in REGS if r.name == "QP")
#: A row of the sessions memory: each session register of the map but USAGE, as
#: ``name: (first bit, bits)``, each in whole 32-bit words (SESSION's implemented bits 5..0 and
#: 15..8 in the low 14 bits of its word), written a word at a time (``_LANE``). USAGE, which the
#: engine reads, changes and writes back in one cycle, has a memory of its own.
_LANE = 32
_FIELD, _ROW_BITS = {}, 0
for _f in _QP.fields:
    if _f.name != "USAGE":
        _FIELD[_f.name] = (_ROW_BITS, 32 * _f.n_words)
        _ROW_BITS += _FIELD[_f.name][1]


def _row(v):
    """The fields of a sessions row ``v``, by register name."""
    return {n: v[p:p + w] for n, (p, w) in _FIELD.items()}


def _lanes(name, k):
    """Write-enable lane of word ``k`` of register ``name`` of a row."""
    return 1 << (_FIELD[name][0] // _LANE + k)


class EngineRegs(wiring.Component):
    """Register bank of the KBTP engine (see the module docstring).

    Ports
    -----
    bus : In(HostBusSignature())        the host's accesses (window at ``base``)
    cfg : Out(CONFIG)                   configuration registers
    qp : In(QP_INDEX_BITS), qp_next : In(QP_INDEX_BITS), session : Out(SESSION)
        the session of QP ``qp`` (the request's). ``qp_next`` is the QP ``qp`` will hold in
        the next cycle: the session row is read at it and registered, so the session shows
        the request's QP from the cycle ``qp`` takes it, from flops, and each write (the
        host's, an engine USAGE update) the cycle after it, as flip-flops would. (The lookup
        behind ``qp``, a LUT RAM row and flip-flop multiplexers feeding the request's checks,
        began the core clock's longest path on the ECPIX-5.)
    usage_inc, usage_dec : In(1), dec_qp : In(QP_INDEX_BITS)
                                        add one block to QP ``qp``'s USAGE / remove one from
                                        QP ``dec_qp``'s (never both in one cycle; a host
                                        access to a session in that cycle is answered the
                                        cycle after, so a host write of that USAGE wins)
    range_idx : In, range : Out(9)      RANGE[range_idx], combinational (a LUT RAM read)
    cmd_valid : Out(1), cmd_kind : Out(2), cmd_arg : Out(RING_SHIFT), cmd_ring : Out(RING_BITS),
    cmd_ack : In(1)
        a host command (:class:`~hw.kbtp.ring_alloc.Cmd`) for the ring allocator, held until
        ``cmd_ack``: a CMD write (argument CMD_ARG) or the free queue's head (a FREE_BLOCK);
        the argument's Block Offset bits and, apart, the ring its top bits name
    deferred : In(1), cmd_result : In(64), occupancy : In(32)
        the ring allocator's state, shown in CMD, CMD_RESULT and RING_OCCUPANCY
    stall : In(1)                       one count of STALL_CYCLES
    started, wr_fire, to_host, finished : In(1)
        events of the request: RecvNotify taken, a WorkRequest out, forwarded to the host,
        RecvRepost out (for the latency registers; ``finished`` counts COUNT[count_k])
    count_k : In(6), count_ready : Out(1)
        the COUNT entry of the request; the COUNT memory is cleared (after reset)
    """

    def __init__(self, n_qp, n_ranges, base, free_depth=FREE_DEPTH):
        regmap.check(n_qp=n_qp, n_ranges=n_ranges)
        if not 2 <= free_depth < 1 << 16:
            raise ValueError(f"free_depth {free_depth}: FREE_QUEUE has 16 bits per field")
        self.n_qp, self.n_ranges, self.base = n_qp, n_ranges, base
        self.free_depth = free_depth
        cfg_init = {r.name.lower(): r.reset for r in REGS if r.name.lower() in CONFIG.members}
        super().__init__({
            "bus": In(HostBusSignature()),
            "cfg": Out(CONFIG, init=cfg_init),
            "qp": In(QP_INDEX_BITS), "qp_next": In(QP_INDEX_BITS), "session": Out(SESSION),
            "usage_inc": In(1), "usage_dec": In(1), "dec_qp": In(QP_INDEX_BITS),
            "range_idx": In(max(1, (n_ranges - 1).bit_length())), "range": Out(9),
            "cmd_valid": Out(1), "cmd_kind": Out(2), "cmd_arg": Out(RING_SHIFT),
            "cmd_ring": Out(RING_BITS), "cmd_ack": In(1),
            "deferred": In(1), "cmd_result": In(64), "occupancy": In(32),
            "stall": In(1),
            "started": In(1), "wr_fire": In(1), "to_host": In(1), "finished": In(1),
            "count_k": In(6), "count_ready": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        rel = Signal(range(WINDOW))     # the offset in the window (when in_win)
        m.d.comb += rel.eq(bus.addr - self.base)
        in_win = (bus.space == Space.REG) & (bus.addr >= self.base) & \
            (bus.addr < self.base + WINDOW)

        # The arrays: the offset is in one's span (``hit``), at entry ``idx``, word ``rel[:sh]``
        # of the entry (its register's offset in a record + 4 * the register's word).
        arrays = {}
        for r in REGS:
            if r.count == 1 and not r.fields:
                continue
            n = {"n_qp": self.n_qp, "n_ranges": self.n_ranges}.get(r.count, r.count)
            sh = r.stride.bit_length() - 1
            assert r.stride == 1 << sh and r.offset % r.stride == 0, r.name
            idx = Signal(range(max(2, n)), name=r.name.lower() + "_idx")
            # (rel[sh:] - offset / stride, mod 2**w: rel's bits above sh + w do not count)
            w = len(idx)
            c = (r.offset >> sh) % (1 << w)
            m.d.comb += idx.eq(rel[sh:sh + w] - c if c else rel[sh:sh + w])
            arrays[r.name] = SimpleNamespace(
                sh=sh, idx=idx, hit=(rel >= r.offset) & (rel < r.offset + n * r.stride),
                cases=[])

        # Storage, by register name: a plain register's (value, write target or None), or a
        # function giving the statements of an access to word k of the register (an array's:
        # of its entry ``idx``).
        store = {n.upper(): (self.cfg[n], self.cfg[n]) for n in CONFIG.members}
        store["ID"] = (Const(ENGINE_ID, 32), None)
        store["CMD_RESULT"] = (self.cmd_result, None)
        store.update(self._ranges(m, arrays["RANGE"].idx))
        store.update(self._statistics(m))
        store.update(self._sessions(m, arrays["QP"].idx))
        store.update(self._counts(m, arrays["COUNT"].idx))
        store.update(self._command(m))

        cases = []                  # the plain registers' (word offset, access)
        for r in REGS:
            for f in r.fields or (r,):
                name = r.name + "_" + f.name if r.fields else r.name
                how = store[name]   # (a KeyError here: a register of the table without storage)
                if r.name in arrays and not callable(how):
                    raise TypeError(f"{name}: an array's storage is a function of the word")
                for k in range(f.n_words):
                    access = how(k) if callable(how) else self._word(m, *how, k)
                    if r.name in arrays:
                        arrays[r.name].cases.append(((f.offset if r.fields else 0) + 4 * k,
                                                     access))
                    else:
                        cases.append((r.offset + 4 * k, access))

        with m.If(in_win & (bus.re | bus.we)):
            m.d.comb += [bus.ack.eq(1), bus.err.eq(1)]
            with m.Switch(rel):
                for off, access in cases:
                    with m.Case(off):
                        m.d.comb += bus.err.eq(0)
                        access()
            for a in arrays.values():       # (their spans are apart: regmap.check)
                with m.If(a.hit), m.Switch(rel[:a.sh]):
                    for off, access in a.cases:
                        with m.Case(off):
                            m.d.comb += bus.err.eq(0)
                            access()
        return m

    def _word(self, m, value, target, k):
        """Access to word ``k`` of a register held in ``value`` (written through ``target``: a
        Value, a function of the written word, or None for a read-only register)."""
        bus = self.bus

        def access():
            with m.If(bus.re):
                m.d.comb += bus.rdata.eq(value[32 * k:32 * (k + 1)])
            if target is not None:
                with m.If(bus.we):
                    m.d.sync += (target(bus.wdata) if callable(target) else
                                 target[32 * k:32 * (k + 1)].eq(bus.wdata))
        return access

    def _ranges(self, m, idx):
        """RANGE[i] in a memory (LUT RAM on the ECP5: 64 x 9 flip-flops behind two 64-to-1
        multiplexers cost more), read without a clock by the decoder (at ``range_idx``: its
        authorization is combinational) and by the host (at ``idx``). A memory has no reset:
        ``live`` (a bit per range, cleared by reset) says the range was written since; one
        that is not reads 0, the registers' reset value."""
        bus, n = self.bus, self.n_ranges
        m.submodules.ranges = ranges = memory.Memory(shape=9, depth=n, init=[])
        wp = ranges.write_port()
        rp = ranges.read_port(domain="comb")
        hp = ranges.read_port(domain="comb")
        live = Signal(n)
        m.d.comb += [rp.addr.eq(self.range_idx), hp.addr.eq(idx),
                     self.range.eq(Mux(live.bit_select(self.range_idx, 1), rp.data, 0))]

        def access(k):
            def go():
                with m.If(bus.re):
                    m.d.comb += bus.rdata.eq(Mux(live.bit_select(idx, 1), hp.data, 0))
                with m.If(bus.we):
                    m.d.comb += [wp.addr.eq(idx), wp.en.eq(1), wp.data.eq(bus.wdata)]
                    m.d.sync += live.bit_select(idx, 1).eq(1)
            return go
        return {"RANGE": access}

    def _statistics(self, m):
        stall_cycles, last_latency, last_cycles, hostq_count = (
            Signal(32, name=n) for n in ("stall_cycles", "last_latency", "last_cycles",
                                         "hostq_count"))
        lat = Signal(32)            # running cycle count of the current request
        lat_open = Signal()         # no WorkRequest out yet for this request
        with m.If(self.stall):
            m.d.sync += stall_cycles.eq(stall_cycles + 1)
        with m.If(lat_open | (lat != 0)):
            m.d.sync += lat.eq(lat + 1)
        with m.If(self.wr_fire & lat_open):
            m.d.sync += [last_latency.eq(lat), lat_open.eq(0)]
        with m.If(self.started):
            m.d.sync += [lat.eq(0), lat_open.eq(1)]
        with m.If(self.to_host):
            m.d.sync += [hostq_count.eq(hostq_count + 1), lat_open.eq(0), lat.eq(0)]
        with m.If(self.finished):
            m.d.sync += [last_cycles.eq(lat), lat.eq(0), lat_open.eq(0)]
        return {"STALL_CYCLES": (stall_cycles, None), "LAST_LATENCY": (last_latency, None),
                "LAST_CYCLES": (last_cycles, None),
                "RING_OCCUPANCY": (self.occupancy, None), "HOSTQ_COUNT": (hostq_count, None)}

    def _sessions(self, m, sq):
        """The sessions; ``sq`` is the host's QP (when the decode finds a session register)."""
        nq, bus, qn = self.n_qp, self.bus, self.qp_next
        # Every session word but USAGE in one memory, one row per QP, with two registered read
        # ports: the request's, at ``qp_next`` and transparent to the host's writes, so a write
        # shows the next cycle as a flip-flop's would; and the host's, so a host read of a
        # session word answers a cycle late (``hwait``). Registered ports let yosys put the
        # rows in block RAM (the ECPIX-5 has EBR to spare): with a combinational host port they
        # were LUT RAM, two copies of 204 bits x 64 QPs, 520 DPR16X4 (tools/area.py).
        m.submodules.sessions = sessions = memory.Memory(shape=_ROW_BITS, depth=nq, init=[])
        wp = sessions.write_port(granularity=_LANE)
        all_lanes = (1 << len(wp.en)) - 1
        rp = sessions.read_port(domain="sync", transparent_for=(wp,))
        hp = sessions.read_port(domain="sync")
        # USAGE alone (LUT RAM): a registered port for the request, transparent, and a
        # combinational one shared by the host's accesses and the engine's read-modify-write.
        m.submodules.usage = usage = memory.Memory(shape=32, depth=nq, init=[])
        uwp = usage.write_port()
        urp = usage.read_port(domain="sync", transparent_for=(uwp,))
        uhp = usage.read_port(domain="comb")
        # A memory has no reset: ``live`` (a bit per QP, cleared by reset) says the row was
        # written since; a row that is not reads 0 (SESSION, USAGE reset 0), and the host's
        # first write fills the whole row (zeros beside the word written; USAGE 0).
        live = Signal(nq)
        live_h, live_r = live.bit_select(sq, 1), Signal()
        m.d.sync += live_r.eq(live.bit_select(qn, 1))
        row = _row(rp.data)
        sess = self.session
        m.d.comb += [rp.addr.eq(qn), hp.addr.eq(sq), urp.addr.eq(qn), uhp.addr.eq(sq),
                     sess.valid.eq(live_r & row["SESSION"][0]), sess.record.eq(row["SESSION"][1]),
                     sess.addr_le.eq(row["SESSION"][2]), sess.host_alloc.eq(row["SESSION"][3]),
                     sess.ring.eq(row["SESSION"][4:6]),
                     sess.domain.eq(row["SESSION"][6:14]), sess.usage.eq(urp.data),
                     sess.handle_base.eq(row["HANDLE_BASE"]),
                     sess.handle_count.eq(row["HANDLE_COUNT"]), sess.quota.eq(row["QUOTA"]),
                     sess.scratch.eq(row["SCRATCH"])]
        # USAGE has one writer, this port: the front's +1 (at ``qp``) and the back's -1 (at
        # ``dec_qp``) never come in one cycle (both are the ring allocator's ``done``), and a
        # host access to USAGE in such a cycle is not answered until the next (the bus holds
        # it), so a host write of USAGE still lands after the engine's update ("the host
        # wins"). One read-modify-write port rather than an increment and a decrement counter
        # per QP: the host's absolute writes would make those three writers again.
        engine = Signal()
        usage_qp = Mux(self.usage_dec, self.dec_qp, self.qp)
        m.d.comb += engine.eq(self.usage_inc | self.usage_dec)
        with m.If(engine):
            old = uhp.data
            m.d.comb += [uhp.addr.eq(usage_qp), uwp.addr.eq(usage_qp), uwp.en.eq(1),
                         uwp.data.eq(Mux(self.usage_dec, old - 1, old + 1))]
        # A host read of a session word: its row is in hp.data. Set only in a read's first
        # cycle and clear in every other, so a read that a master dropped before its answer
        # cannot leave it set for the next one.
        hwait = Signal()
        m.d.sync += hwait.eq(0)

        def word(name, k):
            """Host access to word ``k`` of session register ``name`` of QP ``sq``."""
            def usage_access():
                with m.If(engine):
                    m.d.comb += bus.ack.eq(0)           # the port is USAGE's this cycle: wait
                with m.Else():
                    m.d.comb += bus.rdata.eq(Mux(live_h, uhp.data, 0))
                    with m.If(bus.we):
                        m.d.comb += [uwp.addr.eq(sq), uwp.en.eq(1), uwp.data.eq(bus.wdata)]
                        with m.If(~live_h):         # the rest of the row: zeros
                            m.d.comb += [wp.addr.eq(sq), wp.en.eq(all_lanes), wp.data.eq(0)]
                        m.d.sync += live.bit_select(sq, 1).eq(1)

            def access():
                pos = _FIELD[name][0] + 32 * k
                v = hp.data[pos:pos + 32]
                wd = bus.wdata
                if name == "SESSION":
                    v, wd = Cat(v[:6], Const(0, 2), v[6:14]), Cat(bus.wdata[:6], bus.wdata[8:16])
                with m.If(bus.re & ~hwait):
                    m.d.comb += bus.ack.eq(0)           # the row is read: answer next cycle
                    m.d.sync += hwait.eq(1)
                with m.Elif(bus.re):
                    m.d.comb += bus.rdata.eq(Mux(live_h, v, 0))
                with m.If(bus.we & ~live_h & engine):
                    m.d.comb += bus.ack.eq(0)   # a first write also clears USAGE: wait
                with m.Elif(bus.we):
                    m.d.comb += [wp.addr.eq(sq), wp.en.eq(Mux(live_h, _lanes(name, k), all_lanes)),
                                 wp.data.eq(wd << pos)]
                    with m.If(~live_h):         # the first write since reset: USAGE 0
                        m.d.comb += [uwp.addr.eq(sq), uwp.en.eq(1), uwp.data.eq(0)]
                    m.d.sync += live.bit_select(sq, 1).eq(1)
            return usage_access if name == "USAGE" else access

        return {"QP_" + f.name: (lambda k, n=f.name: word(n, k)) for f in _QP.fields}

    def _counts(self, m, k_host):
        # COUNT[k] in a memory (LUT RAM on the ECP5: 48 x 32 flip-flops behind a 48-to-1
        # multiplexer were some of the most congested logic of the ECPIX-5 build). Reset clears
        # it as it cleared the registers: ``clear`` sweeps every entry before a request counts.
        m.submodules.counts = counts = memory.Memory(shape=32, depth=64, init=[])
        clear = Signal(range(65), init=64)      # entries still to clear after reset
        wp = counts.write_port()
        rp = counts.read_port(domain="comb")    # the request's read-modify-write
        bus_rp = counts.read_port(domain="comb")
        m.d.comb += [self.count_ready.eq(clear == 0), rp.addr.eq(self.count_k)]
        with m.If(clear != 0):
            m.d.comb += [wp.en.eq(1), wp.addr.eq(clear - 1), wp.data.eq(0)]
            m.d.sync += clear.eq(clear - 1)
        with m.If(self.finished):
            m.d.comb += [wp.en.eq(1), wp.addr.eq(self.count_k), wp.data.eq(rp.data + 1)]

        def access(k):
            def go():
                m.d.comb += [bus_rp.addr.eq(k_host), self.bus.rdata.eq(bus_rp.data)]
            return go
        return {"COUNT": access}

    def _command(self, m):
        """CMD, FREE_PUSH, FREE_QUEUE and FREE_REFUSED (the free queue: module docstring)."""
        bus, depth = self.bus, self.free_depth
        pending = self.cmd_valid
        m.submodules.free_queue = q = fifo.SyncFIFO(width=64, depth=depth)
        queued = Signal()           # the pending (or last) command is the queue's head
        push_lo = Signal(32)        # FREE_PUSH_LO, until the high word's write
        refused = Signal(32)
        busy = Signal()
        arg = Signal(64)
        m.d.comb += [busy.eq(pending | self.deferred | (q.level != 0)),
                     arg.eq(Mux(queued, q.r_data, self.cfg.cmd_arg)),
                     self.cmd_arg.eq(arg[:RING_SHIFT]), self.cmd_ring.eq(arg[RING_SHIFT:])]
        with m.If(self.cmd_ack):
            m.d.sync += pending.eq(0)
            m.d.comb += q.r_en.eq(queued)
        # A queued free starts as a host FREE_BLOCK would. (A host CMD write is ignored while
        # the queue holds frees, so the two never start in the same cycle.)
        with m.If(~pending & ~self.deferred & q.r_rdy):
            m.d.sync += [pending.eq(1), queued.eq(1), self.cmd_kind.eq(Cmd.FREE_BLOCK)]

        def command(k):
            def go():
                m.d.comb += bus.rdata.eq(Cat(busy, self.deferred))
                with m.If(bus.we & ~busy &
                          ((bus.wdata == Cmd.TAIL_FETCHADD) | (bus.wdata == Cmd.FREE_BLOCK))):
                    m.d.sync += [pending.eq(1), queued.eq(0), self.cmd_kind.eq(bus.wdata[:2])]
            return go

        def push(k):
            def go():               # reads 0
                with m.If(bus.we):
                    if k == 0:
                        m.d.sync += push_lo.eq(bus.wdata)
                    else:
                        m.d.comb += q.w_data.eq(Cat(push_lo, bus.wdata))
                        with m.If(q.w_rdy):
                            m.d.comb += q.w_en.eq(1)
                        with m.Else():
                            m.d.comb += bus.err.eq(1)
                            m.d.sync += refused.eq(refused + 1)
            return go

        space = Signal(16)
        m.d.comb += space.eq(depth - q.level)
        return {"CMD": command, "FREE_PUSH": push,
                "FREE_QUEUE": (Cat(q.level, Const(0, 16 - len(q.level)), space), None),
                "FREE_REFUSED": (refused, None)}

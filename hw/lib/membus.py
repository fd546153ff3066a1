# Ref: hw/iface.py (MemBusSignature); draft KBTP §Free-Block Ring and §Block Unmapped Store
#      (ordering: a write accepted before another request is visible to it).
"""Target memory: a block-RAM model behind :class:`~hw.iface.MemBusSignature`, and an
arbiter that merges several masters into one bus in a single global order.

Why our own bus instead of AXI4: every master here moves whole 8-octet words in order and needs
no IDs, bursts or separate write-response channel; one request stream and one in-order response
stream keep each master a small FSM and make the order of writes (which the draft's memory rules
depend on) the order in which the arbiter accepts them.
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, fifo, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hw.headers import wire_fields

from hw.iface import MEM_DATA_BITS, MemBusSignature
from hw.lib.stream import RegisterSlice

__all__ = ["MemRam", "MemArbiter", "MemSplit", "be_field", "bswap", "bswap64", "read_words"]


def bswap64(x):
    """Reverse the octets of a 64-bit word: memory lanes (octet 0 = bits 7..0) <-> big-endian."""
    return Cat(*[x[8 * k:8 * k + 8] for k in reversed(range(8))])


def bswap(x):
    """Reverse the octets of a value a whole number of octets wide (a field read big-endian,
    taken little-endian: ADDR_LE)."""
    assert len(x) % 8 == 0, len(x)
    return Cat(*[x[8 * k:8 * k + 8] for k in reversed(range(len(x) // 8))])


def be_field(buf, total, struct, name, base=0):
    """The slice of a big-endian buffer of ``total`` octets (octet 0 = most significant, as
    :func:`bswap64` and :func:`read_words` leave words) holding field ``name`` of a hw.headers
    layout placed at octet ``base``."""
    for fname, off, bits, _ in wire_fields(struct):
        if fname == name:
            off += base
            return buf[8 * (total - off - bits // 8):8 * (total - off)]
    raise KeyError(name)


def read_words(m, mem, addr, issue, wait, buf, ret, states, next_addr=None):
    """The body of a master's word-read FSM state, shared by the KBTP engine and the ring
    allocator: request ``issue`` words from ``addr`` on, shift each response into ``buf``
    (big-endian octets, the newest word in the low 64 bits); with the last response (``wait``
    counts the responses still to come) go to state ``states[ret]``. ``next_addr``: the address
    that follows each word requested (default ``addr + 8``, consecutive words)."""
    req, rsp = mem.req, mem.rsp
    m.d.comb += [req.valid.eq(issue != 0), req.payload.addr.eq(addr), req.payload.we.eq(0),
                 rsp.ready.eq(1)]
    with m.If(req.valid & req.ready):
        m.d.sync += [issue.eq(issue - 1), addr.eq(addr + 8 if next_addr is None else next_addr)]
    with m.If(rsp.valid):
        m.d.sync += [buf.eq(Cat(bswap64(rsp.payload.rdata), buf[:-64])), wait.eq(wait - 1)]
        with m.If(wait == 1):
            with m.Switch(ret):
                for i, name in enumerate(states):
                    with m.Case(i):
                        m.next = name


class MemRam(wiring.Component):
    """Word RAM of ``depth`` 8-octet words, base address 0, one request per cycle, read latency 1.

    Ports
    -----
    bus : In(MemBusSignature)
    Parameters
    ----------
    depth : int
        words; addresses at or above ``8 * depth`` wrap (the arbiter's clients must stay inside).
    init : list[int]
        initial word contents (little-endian octet lanes), e.g. from a golden-model image.
    """

    def __init__(self, depth, init=()):
        self.depth = depth
        super().__init__({"bus": In(MemBusSignature())})
        #: The storage, reachable by testbenches (``ctx.get(ram.mem.data[i])``) for image checks.
        self.mem = Memory(shape=MEM_DATA_BITS, depth=depth, init=list(init))

    @staticmethod
    def words_from_bytes(image):
        image = bytes(image) + bytes(-len(image) % 8)
        return [int.from_bytes(image[i:i + 8], "little") for i in range(0, len(image), 8)]

    def elaborate(self, platform):
        m = Module()
        m.submodules.mem = mem = self.mem
        wr = mem.write_port(granularity=8)
        rd = mem.read_port()
        abits = max(1, (self.depth - 1).bit_length())
        req, rsp = self.bus.req, self.bus.rsp

        pending = Signal()          # a read result is in rd.data, waiting for rsp.ready
        m.d.comb += [
            rsp.payload.rdata.eq(rd.data),
            rsp.valid.eq(pending),
            # Accept a new request unless a read result is stuck.
            req.ready.eq(~pending | rsp.ready),
            rd.addr.eq(req.payload.addr[3:3 + abits]),
            rd.en.eq(req.valid & req.ready & ~req.payload.we),
            wr.addr.eq(req.payload.addr[3:3 + abits]),
            wr.data.eq(req.payload.wdata),
        ]
        with m.If(req.valid & req.ready & req.payload.we):
            m.d.comb += wr.en.eq(req.payload.wstrb)
        with m.If(rsp.ready & pending):
            m.d.sync += pending.eq(0)
        with m.If(req.valid & req.ready & ~req.payload.we):
            m.d.sync += pending.eq(1)
        return m


class MemArbiter(wiring.Component):
    """Arbiter of ``n`` masters onto one bus, with a registered grant; responses routed back in
    order through a register.

    No combinational path runs from one master to another, for the ECPIX-5's core clock. The
    grant is a flop: a master's ``req.ready`` is its grant bit and the bus's
    ready, never another master's ``valid``; the decision for the next cycle is made from this
    cycle's requests. Responses pass a register stage (:class:`~hw.lib.stream.RegisterSlice`)
    before they reach their master. The single order of the bus is kept: a request is accepted
    by the arbiter in the cycle it goes out on the bus, so a write is visible to every request
    any master hands over later (the ordering the draft's memory rules need).

    Cost: a master that asks while the grant is elsewhere waits one cycle more than with a
    combinational grant; a read answers one cycle later. A master keeps the grant after a
    request while its run is below ``hold`` (it may not ask again: one idle cycle on the bus
    if another master was waiting).

    Before this, the grant was combinational: the core's longest ECPIX-5 path (28.3 ns, 24.8 of
    routing) ran from the ring allocator through it into the requester and the responder; with
    the flop, the build at seed 3 routed in 86 iterations (140 before), core 35.66 MHz.

    Ports
    -----
    masters : In(MemBusSignature()).array(n)
    bus : Out(MemBusSignature())
    Parameters
    ----------
    outstanding : int
        reads in flight the arbiter can track (depth of its return-route FIFO). To stream one
        word per cycle it must cover the memory's read latency: the ECPIX-5 DDR3 answers a row
        hit 12 core cycles after it takes the read (boards/dram.py ECPIX5_DDR3), so 8 hold every
        master behind it to 8 words per 13 cycles, and 32 also ride out a refresh (12 more);
        tests/hw/lib/test_dram_stream.py measures both. The default is 32: the ECPIX-5 build
        with it (32 in DmaReader, a hold of 16) routed at the board's seed and met timing. With
        bursts of 64 in InlineCopy as well, nextpnr's router2 did not converge at that seed
        (overuse still rising at iteration 204), so InlineCopy's burst stays 16.
    hold : int
        grants in a row the last master keeps, before the others' turn (1: plain round robin;
        16, the default). One request each in turn makes DRAM switch rows with nearly every
        request when two masters stream to two rows of a bank (the responder filling a receive
        buffer while the engine copies the previous one into a block: a row miss costs 3 core
        cycles on the ECPIX-5 DDR3); 16 in a row cut a STORE inline of 4 KiB from 11,432 to
        8,249 GMII cycles in the bench (with the deeper sizes above). Another master waits at
        most ``hold`` requests longer.
    urgent : tuple of int
        Masters granted whenever they ask, before the round robin and any other master's hold,
        the first listed first: the cycle after they ask, or at once if the grant is already
        theirs. Meant for the masters the wire feeds (the responder placing SEND and WRITE
        payloads, the requester placing READ responses): they must keep pace with the line, or
        the MAC's receive buffer fills behind them. Their demand is bounded by the line rate, so
        the others keep what the line leaves of the bus. Default none.
    locking : tuple of int
        Masters whose ``req.payload.lock`` counts (:data:`~hw.iface.MemReq`): a request of theirs
        taken with ``lock`` = 1 keeps the grant with them until their next request is taken
        (the write of a read-modify-write), so no other master reaches the bus in between: no
        round robin, no ``hold`` limit, no urgent master. Meant for the responder's atomics and
        the KBTP engine's ring allocator, which both read-modify-write a DIRECT_ALLOC
        partition's Head: without the lock one's write could overwrite the other's, and an
        update is lost. The ``lock`` bit of every other master is ignored (it may be left
        undriven), and the arbiter's own ``bus.req.payload.lock`` is that of the granted master
        if it is listed, else 0: an arbiter behind another passes a lock on when the outer one
        lists its port here. Cost: another master, urgent or not, waits at most for the locked
        master's next request (a read's latency and the master's turnaround). Default none.
    """

    def __init__(self, n, outstanding=32, hold=16, urgent=(), locking=()):
        if hold < 1:
            raise ValueError(f"MemArbiter: hold {hold} < 1")
        if any(not 0 <= i < n for i in urgent):
            raise ValueError(f"MemArbiter: urgent masters {urgent} not all in 0..{n - 1}")
        if any(not 0 <= i < n for i in locking):
            raise ValueError(f"MemArbiter: locking masters {locking} not all in 0..{n - 1}")
        self.n = n
        self.outstanding = outstanding
        self.hold = hold
        self.urgent = tuple(urgent)
        self.locking = tuple(locking)
        super().__init__({"masters": In(MemBusSignature()).array(n),
                          "bus": Out(MemBusSignature())})

    def elaborate(self, platform):
        m = Module()
        n = self.n
        idbits = max(1, (n - 1).bit_length())
        # SyncFIFO (not Buffered): its output is readable the cycle after the write, when the RAM
        # answers, so back-to-back reads run at one word per cycle.
        m.submodules.route = route = fifo.SyncFIFO(width=idbits, depth=self.outstanding)

        grant = Signal(idbits)      # the master whose request may go out this cycle (a flop)
        run = Signal(range(self.hold + 1))      # requests in a row taken from `grant`
        asks = Signal(n)
        m.d.comb += asks.eq(Cat(p.req.valid for p in self.masters))

        out = self.bus.req
        with m.Switch(grant):
            for i in range(n):
                with m.Case(i):
                    m.d.comb += out.payload.eq(self.masters[i].req.payload)
                    if i not in self.locking:
                        # Its lock bit may be undriven (X in a Verilog simulator): not passed.
                        m.d.comb += out.payload.lock.eq(0)
        is_read = ~out.payload.we
        # A read needs room to remember where its response goes. Each master's ready from its
        # own request's `we`, not from the granted request's (a mux over every master's
        # payload): no path from one master's request into another's ready, for the core clock.
        room = ~is_read | route.w_rdy
        m.d.comb += out.valid.eq(asks.bit_select(grant, 1) & room)
        for i in range(n):
            room_i = self.masters[i].req.payload.we | route.w_rdy
            m.d.comb += self.masters[i].req.ready.eq((grant == i) & room_i & out.ready)
        take = out.valid & out.ready
        m.d.comb += [route.w_data.eq(grant), route.w_en.eq(take & is_read)]

        # The next grant, from this cycle's requests. `others`: every master asking but the
        # granted one (whether it asks again after a request it hands over now is not known).
        others = Signal(n)
        m.d.comb += others.eq(asks & ~(1 << grant)[:n])
        # Round robin among the others: the first asking after `grant`, wrapping (`i` is never
        # `grant` here, so a plain `asks[i]`).
        rr, rr_any = Signal(idbits), Signal()
        for off in reversed(range(1, n)):
            with m.Switch(grant):
                for g in range(n):
                    with m.Case(g):
                        i = (g + off) % n
                        with m.If(asks[i]):
                            m.d.comb += [rr.eq(i), rr_any.eq(1)]
        # An urgent master asking, the first listed first, unless an urgent master listed
        # before it has the grant and asks.
        urg, urg_any = Signal(idbits), Signal()
        for k, i in reversed(list(enumerate(self.urgent))):
            earlier = Cat((grant == j) & asks[j] for j in self.urgent[:k]).any()
            with m.If(others[i] & ~earlier):
                m.d.comb += [urg.eq(i), urg_any.eq(1)]
        granted_urgent = Cat(grant == i for i in self.urgent).any()
        # Lock: set by a request taken with lock = 1 (only a `locking` master's, see the
        # payload copy above), cleared by the next request taken; `stay`: locked after this
        # cycle, when the grant may not move.
        stay = Const(0)
        if self.locking:
            stay, locked = Signal(), Signal()
            m.d.comb += stay.eq(Mux(take, out.payload.lock, locked))
            m.d.sync += locked.eq(stay)
        keep = Signal()             # the granted master keeps the grant after this cycle
        with m.If(stay):
            m.d.comb += keep.eq(1)
        with m.Elif(take):
            m.d.comb += keep.eq((run + 1 < self.hold) | granted_urgent)
        with m.Else():
            m.d.comb += keep.eq(asks.bit_select(grant, 1))      # stalled: keeps it
        with m.If(take & (run < self.hold)):
            m.d.sync += run.eq(run + 1)
        with m.If(urg_any & ~stay):
            m.d.sync += [grant.eq(urg), run.eq(0)]
        with m.Elif(~keep & rr_any):
            m.d.sync += [grant.eq(rr), run.eq(0)]
        with m.Elif(~keep):
            m.d.sync += run.eq(0)     # parked on an idle master: its next run starts anew

        # Responses: in order, to the master at the head of the route FIFO, through a register.
        rsp = self.bus.rsp
        rlayout = data.StructLayout({"rdata": MEM_DATA_BITS, "id": idbits})
        m.submodules.rsp_reg = reg = RegisterSlice(signature=stream.Signature(rlayout))
        m.d.comb += [reg.i.valid.eq(rsp.valid & route.r_rdy),
                     reg.i.payload.rdata.eq(rsp.payload.rdata),
                     reg.i.payload.id.eq(route.r_data),
                     rsp.ready.eq(reg.i.ready & route.r_rdy),
                     route.r_en.eq(rsp.valid & rsp.ready)]
        for i in range(n):
            m.d.comb += [self.masters[i].rsp.payload.rdata.eq(reg.o.payload.rdata),
                         self.masters[i].rsp.valid.eq(reg.o.valid & (reg.o.payload.id == i))]
            with m.If(reg.o.payload.id == i):
                m.d.comb += reg.o.ready.eq(self.masters[i].rsp.ready)
        return m


class MemSplit(wiring.Component):
    """One bus onto two memories by address: the ``words`` 8-octet words from byte address
    ``base`` on go to ``fast`` (at fast-side address ``addr - base``), every other address to
    ``slow`` (unchanged). Made for a block-RAM window (receive and scratch buffers) in front
    of the DRAM, whose reads answer many cycles later.

    The bus's rules hold across the two: requests are accepted in order, so a write is seen by
    every later request; read responses come back in request order. A FIFO remembers which
    side each read went to, and only the side at its head may hand over a response: the other
    side holds its answers (its ``rsp.ready`` low), so a fast read issued behind a slow one
    waits for it, and neither side's data is ever dropped. Neither memory may make its answers
    to earlier reads wait for later requests (both here answer reads on their own).

    Ports
    -----
    bus : In(MemBusSignature())
    fast, slow : Out(MemBusSignature())
    Parameters
    ----------
    base : int          byte address of the window, a multiple of 8 * ``words``
    words : int         window size in words, a power of two
    outstanding : int   reads in flight the split can route back (its FIFO's depth); at least
                        the slow side's latency for the bus to stream one word per cycle
    """

    def __init__(self, base, words, outstanding=32):
        if words & (words - 1) or base % (8 * words):
            raise ValueError(f"MemSplit: window of {words} words at {base:#x}: the size must be "
                             f"a power of two and the base a multiple of it")
        self.base, self.words, self.outstanding = base, words, outstanding
        super().__init__({"bus": In(MemBusSignature()), "fast": Out(MemBusSignature()),
                          "slow": Out(MemBusSignature())})

    def elaborate(self, platform):
        m = Module()
        m.submodules.route = route = fifo.SyncFIFO(width=1, depth=self.outstanding)
        req, rsp = self.bus.req, self.bus.rsp
        low = (8 * self.words - 1).bit_length()         # address bits inside the window
        in_window = Signal()
        m.d.comb += in_window.eq(req.payload.addr[low:] == self.base >> low)

        is_read = ~req.payload.we
        side_ready = Signal()
        m.d.comb += [self.fast.req.payload.eq(req.payload),
                     self.fast.req.payload.addr.eq(req.payload.addr[:low]),
                     self.slow.req.payload.eq(req.payload)]
        # A read needs room in the route FIFO; a request goes out to its side only.
        room = Signal()
        m.d.comb += room.eq(~is_read | route.w_rdy)
        with m.If(in_window):
            m.d.comb += [self.fast.req.valid.eq(req.valid & room),
                         side_ready.eq(self.fast.req.ready)]
        with m.Else():
            m.d.comb += [self.slow.req.valid.eq(req.valid & room),
                         side_ready.eq(self.slow.req.ready)]
        m.d.comb += [req.ready.eq(side_ready & room),
                     route.w_data.eq(in_window),
                     route.w_en.eq(req.valid & req.ready & is_read)]

        # Responses in request order: from the side the oldest read went to.
        with m.If(route.r_rdy & route.r_data):         # r_data: the oldest read went to fast
            m.d.comb += [rsp.valid.eq(self.fast.rsp.valid), rsp.payload.eq(self.fast.rsp.payload),
                         self.fast.rsp.ready.eq(rsp.ready)]
        with m.Elif(route.r_rdy):
            m.d.comb += [rsp.valid.eq(self.slow.rsp.valid), rsp.payload.eq(self.slow.rsp.payload),
                         self.slow.rsp.ready.eq(rsp.ready)]
        m.d.comb += route.r_en.eq(rsp.valid & rsp.ready)
        return m

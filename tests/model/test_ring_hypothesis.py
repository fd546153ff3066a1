# Ref: draft KBTP §Free-Block Ring, §Allocation Quotas, §Direct Modes (DIRECT_ALLOC, BIND, Ticket
#      Timeout reclamation), §InfiniBand and RoCEv2 (unmasked counters); layouts.md (ADDR_LE).
"""Long random runs of the ring with several initiators (hypothesis).

1. :class:`RingMachine` drives the atomic API the golden model uses (``RingImage``): target
   allocations, DIRECT_ALLOC tickets taken without reading, BIND (read + consume), frees that may
   be deferred, reclamation of abandoned tickets; quotas respected. The oracle is a plain dict
   "Tail ticket -> block" kept by the test (the block each free put in, or the initial block):
   every allocation of ticket t must return exactly that block, and the memory image must show
   every block exactly once (slot, pending free, or an initiator's hand).
   Four variants: masked/unmasked counters x big/little-endian Block Offsets.
2. :func:`test_random_interleavings` walks random paths through :class:`model.ring.RingWorld`
   (one memory action per step, invariants checked at every step) on rings bigger than the
   exhaustive tests can cover.
"""

import struct

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, invariant, precondition, rule)

from hw.headers import SLOT_EMPTY
from model.ring import (MASK32, Initiator, RingEmpty, RingImage, RingStall, RingWorld,
                      counter_fields)

N_ORDER = 3
N = 1 << N_ORDER
F = 7                                      # F < N: one slot starts empty
QUOTAS = (3, 2, 2)                         # sum = F
BLOCKS = [0x40000 + 0x8000 * k for k in range(F)]
BASE, HEAD, TAIL, SIZE = 0x40, 0x10, 0x18, 0x40 + 16 * N + 0x20


class RingMachine(RuleBasedStateMachine):
    """Several initiators sharing one ring through the atomic (golden model) API."""

    MASKED = True
    ADDR_LE = False

    def __init__(self):
        super().__init__()
        self.mem = bytearray(SIZE)
        self.ring = RingImage(self.mem, BASE, N_ORDER, HEAD, TAIL, addr_le=self.ADDR_LE,
                              masked=self.MASKED)
        self.ring.initialize(BLOCKS)
        self.oracle = {k: b for k, b in enumerate(BLOCKS)}   # Tail ticket -> block put in
        self.next_tail = F
        self.next_head = 0
        self.held = [[] for _ in QUOTAS]                      # blocks bound per initiator
        self.tickets = [[] for _ in QUOTAS]                   # direct tickets not yet bound
        self.stalled = [[] for _ in QUOTAS]                   # target allocations waiting
        self.abandoned = []                                   # tickets awaiting reclamation
        self.usage = [0] * len(QUOTAS)
        self.allocations = 0

    # -- helpers -------------------------------------------------------------------------------

    def _take(self, i):
        t, o = self.ring.take_ticket()
        assert t == self.next_head & MASK32
        assert o == 16 * (t % N)
        self.next_head += 1
        self.usage[i] += 1
        return t, o

    def _got(self, i, t, block):
        assert block == self.oracle.pop(t), f"ticket {t} got the wrong block"
        self.held[i].append(block)
        self.allocations += 1

    def _freed(self, result, block):
        status, u, o = result
        assert u == self.next_tail & MASK32 and o == 16 * (u % N)
        assert status in ("written", "deferred")
        event(f"free {status}")
        self.oracle[u] = block
        self.next_tail += 1

    # -- rules ---------------------------------------------------------------------------------

    @rule(i=st.integers(0, len(QUOTAS) - 1))
    def target_allocate(self, i):
        """ALLOC_STORE executed by the target (quota checked first, as the target does)."""
        if self.usage[i] >= QUOTAS[i]:
            return
        if self.ring.occupancy() == 0:
            head = self.ring.read_counter("head")
            try:
                self.ring.allocate()
            except RingEmpty:
                assert self.ring.read_counter("head") == head      # no ticket taken
                return
            raise AssertionError("allocate() did not raise RingEmpty on an empty ring")
        self.usage[i] += 1
        try:
            t, o, block = self.ring.allocate()
        except RingStall as e:
            event("target allocation stalled on a deferred free")
            self.stalled[i].append((e.ticket, e.slot_offset))
        else:
            assert t == self.next_head & MASK32
            self._got(i, t, block)
        self.next_head += 1

    @rule(i=st.integers(0, len(QUOTAS) - 1))
    def direct_take_ticket(self, i):
        """DIRECT_ALLOC: FetchAdd on Head without reading the slot yet."""
        if self.usage[i] < QUOTAS[i] and self.ring.occupancy() > 0:
            self.tickets[i].append(self._take(i))

    @precondition(lambda self: any(self.tickets))
    @rule(i=st.integers(0, len(QUOTAS) - 1), k=st.integers(0, 7))
    def direct_bind(self, i, k):
        """Initiator reads its slot; if ready it BINDs and the target consumes the slot."""
        if not self.tickets[i]:
            return
        t, o = self.tickets[i][k % len(self.tickets[i])]
        if not self.ring.slot_ready(t, o):
            assert t not in self.oracle or self._pending_has(t)    # its free is not written yet
            return
        seq, block = self.ring.read_slot(o)
        assert seq == t and self.ring.bind_check(t, block)
        assert not self.ring.bind_check(t, block ^ 0x8000)
        self.tickets[i].remove((t, o))
        assert self.ring.finish_allocation(t, o) == block
        event("BIND")
        self._got(i, t, block)

    @precondition(lambda self: any(self.stalled))
    @rule(i=st.integers(0, len(QUOTAS) - 1))
    def finish_stalled(self, i):
        if self.stalled[i]:
            t, o = self.stalled[i][0]
            try:
                block = self.ring.finish_allocation(t, o)
            except RingStall:
                return
            self.stalled[i].pop(0)
            self._got(i, t, block)

    @precondition(lambda self: any(self.held))
    @rule(i=st.integers(0, len(QUOTAS) - 1), k=st.integers(0, 7))
    def free(self, i, k):
        """FREE: the block goes back with a new Tail ticket (possibly deferred). The FREE
        completes, and releases its quota unit, at once (the ring keeps the deferred write)."""
        if not self.held[i]:
            return
        block = self.held[i].pop(k % len(self.held[i]))
        self._freed(self.ring.free(block), block)
        self.usage[i] -= 1

    @precondition(lambda self: any(self.tickets))
    @rule(i=st.integers(0, len(QUOTAS) - 1), k=st.integers(0, 7))
    def abandon(self, i, k):
        """A direct ticket passes its Ticket Timeout: the target will reclaim it."""
        if self.tickets[i]:
            self.abandoned.append((i, self.tickets[i].pop(k % len(self.tickets[i]))))

    @precondition(lambda self: self.abandoned)
    @rule()
    def reclaim(self):
        if not self.abandoned:
            return
        i, (t, o) = self.abandoned[0]
        if not self.ring.slot_ready(t, o):
            try:
                self.ring.reclaim(t, o)
            except RingStall:
                return
            raise AssertionError("reclaim of a not-ready slot did not raise RingStall")
        self.abandoned.pop(0)
        expect = self.oracle.pop(t)
        block = self.ring.reclaim(t, o)
        assert block == expect
        self._freed(self.ring.last_free, block)
        event("abandoned ticket reclaimed")
        self.usage[i] -= 1
        assert not self.ring.bind_check(t, block)            # a late BIND is rejected

    def _pending_has(self, t):
        return any(u == t for q in self.ring.pending_frees.values() for u, _ in q)

    # -- invariants ----------------------------------------------------------------------------

    @invariant()
    def every_block_in_exactly_one_place(self):
        places = []
        for s in range(N):
            seq, bo = self.ring.read_slot(16 * s)
            raw = self.mem[BASE + 16 * s:BASE + 16 * s + 16]
            assert raw[4:8] == bytes(4)                                 # Reserved stays zero
            fmt = "<Q" if self.ADDR_LE else ">Q"
            assert struct.unpack(fmt, raw[8:16])[0] == bo
            assert struct.unpack(">I", raw[0:4])[0] == seq
            if bo != SLOT_EMPTY:
                assert self.oracle.get(seq) == bo, f"slot {s} holds {bo:#x} for ticket {seq}"
                assert seq % N == s
                places.append(bo)
        for q in self.ring.pending_frees.values():
            for u, b in q:
                assert self.oracle.get(u) == b
                places.append(b)
        for h in self.held:
            places.extend(h)
        assert sorted(places) == sorted(BLOCKS)

    @invariant()
    def counters_agree(self):
        fmt = "<Q"                                                      # documented LE counters
        head = struct.unpack(fmt, self.mem[HEAD:HEAD + 8])[0]
        tail = struct.unpack(fmt, self.mem[TAIL:TAIL + 8])[0]
        assert counter_fields(head, N_ORDER, self.MASKED)[0] == self.next_head & MASK32
        assert counter_fields(tail, N_ORDER, self.MASKED)[0] == self.next_tail & MASK32
        low = (head & MASK32, tail & MASK32)
        if self.MASKED:
            assert low == (16 * (self.next_head % N), 16 * (self.next_tail % N))
        else:
            assert low == (0, 0)
        assert self.ring.occupancy() == self.next_tail - self.next_head
        # Tickets taken but not yet served + blocks waiting = what the oracle still holds.
        assert len(self.oracle) == self.next_tail - self.next_head + sum(
            len(x) for x in self.tickets + self.stalled) + len(self.abandoned)

    @invariant()
    def quotas(self):
        for i, q in enumerate(QUOTAS):
            out = len(self.held[i]) + len(self.tickets[i]) + len(self.stalled[i]) + sum(
                1 for j, _ in self.abandoned if j == i)
            assert self.usage[i] == out <= q


_SETTINGS = settings(max_examples=60, stateful_step_count=150, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])


def _variant(masked, addr_le):
    cls = type(f"Ring{'Masked' if masked else 'Unmasked'}{'LE' if addr_le else 'BE'}",
               (RingMachine,), {"MASKED": masked, "ADDR_LE": addr_le})
    case = cls.TestCase
    case.settings = _SETTINGS
    return case


TestMaskedBE = _variant(True, False)
TestMaskedLE = _variant(True, True)
TestUnmaskedBE = _variant(False, False)
TestUnmaskedLE = _variant(False, True)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), masked=st.booleans(), addr_le=st.booleans(),
       release=st.sampled_from(["written", "ticket"]))
def test_random_interleavings(data, masked, addr_le, release):
    """Random paths, one memory action per step, through a bigger world than the exhaustive
    tests can cover: N = 16, F = 12, four initiators (one DIRECT_ALLOC with an abandoned
    ticket), Sequence-checked frees. Every step checks the invariants (RingWorld)."""
    blocks = [0x100000 + 0x10000 * k for k in range(12)]
    inits = [Initiator(4, 8, 8), Initiator(3, 6, 6), Initiator(3, 6, 6, direct=True, abandons=1),
             Initiator(2, 5, 5)]
    w = RingWorld(4, blocks, inits, masked=masked, addr_le=addr_le, release=release,
                  free_check="sequence", ticket_base=data.draw(st.sampled_from([0, 2**32 - 20])))
    state, steps = w.initial, 0
    while True:
        succ = list(w.successors(state))
        if not succ:
            break
        _, state = succ[data.draw(st.integers(0, len(succ) - 1), label="choice")]
        w.check_state(state)
        steps += 1
    assert not state[1] and steps > 0                  # ended with nothing in flight
    event(f"steps >= {steps // 100 * 100}")
    held = sorted(b for init in state[2] for b in init[0])
    w.mem[:] = state[0]
    in_ring = sorted(bo for _, bo in w.ring.slots() if bo != SLOT_EMPTY)
    assert sorted(held + in_ring) == sorted(blocks)

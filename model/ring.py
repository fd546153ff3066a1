# Ref: draft KBTP §Free-Block Ring, §Allocation Quotas, §Direct Modes (DIRECT_ALLOC),
#      §InfiniBand and RoCEv2 (unmasked Fetch and Add), §Examples (ring counter table,
#      deferred free); RFC 7306 §3.1 (masked Fetch and Add); layouts.md §Ring counters.
"""The KBTP free-block ring as a byte image, with masked FetchAdd and step machines.

Three layers:

* :func:`masked_fetch_add` / :func:`fetch_add` / :func:`counter_fields` -- the counter arithmetic.
* :class:`RingImage` -- the ring's N slots and its Head and Tail counters inside one target memory
  image (a ``bytearray`` shared with the table and the pool), with the draft's initialization,
  allocation, free (immediate or deferred), consumption and ticket-reclamation rules, each done
  as one atomic step. This is what the golden model uses.
* :class:`Allocator`, :class:`DirectAllocator`, :class:`Freer` -- the same rules split into single
  memory actions (one FetchAdd, one 4- or 8-octet read, one write), so that an explorer can
  interleave concurrent allocations and frees in every possible order.

Readings of the draft (documented choices)
------------------------------------------
* Counter byte order: Head and Tail are stored **little-endian** in the image. The draft says
  "the target's memory byte order" (RFC 7306); our targets (x86 host model, FPGA with an AXI/
  Wishbone little-endian memory) are little-endian. ``counter_order="big"`` is available.
* Masked FetchAdd: every set bit of the mask is the most significant bit of a field, and the carry
  out of that bit is discarded (RFC 7306 §3.1, layouts.md). The top field ends at bit 63; with
  ``mask == 0`` the operation is a plain 64-bit addition modulo 2**64.
* Slot Offset of a ticket: since both fields start at zero and advance together and 2**32 is a
  multiple of N, ticket t always sits at slot offset ``16 * (t mod N)``; :meth:`RingImage.slot_of`
  uses that for BIND (which carries only the ticket) and for the unmasked variant.
* Ticket comparison: Sequence is 32 bits, so a ticket matches a slot when ``ticket mod 2**32``
  equals the Sequence.
* "Consumed" is "Block Offset is all ones"; the Sequence of a consumed slot is left unchanged
  (the draft says only that the Block Offset is set to all ones).
* Deferred frees: the target keeps them per slot, in ticket order (FIFO), and performs the oldest
  one as soon as the slot is consumed (:meth:`RingImage.consume`). A free whose slot already has a
  deferred free waiting is itself deferred, even though the slot may look consumed, because the
  earlier free has not written it yet.
* A free may write its slot only when it is consumed **and** its Sequence is ``u - N``
  (:meth:`RingImage.slot_free_for`). The draft's text says only "if the slot at o is consumed";
  that is enough only when the target performs its frees one at a time in ticket order. With
  frees in flight concurrently (quotas respected) two frees N tickets apart both see a consumed
  slot and the later may write first: a block is lost (tests/model/test_ring.py::
  test_concurrent_frees_into_one_slot, found by tests/model/test_ring_exhaustive.py). The initial
  Sequence s - N of empty slots makes the stricter check work from the first lap.
* Quota release of a FREE: :class:`RingWorld` explores both "when the slot is written" and "when
  the free holds its Tail ticket" (a FREE completed while deferred). The second reading needs
  the stricter check above (or per-slot FIFO); with it both readings keep every invariant.
* N = 1 (n = 0): the draft's Add Mask bit n+3 = 3 lies below Add Data's bit 4, so FetchAdd
  carries into bits 31..4 (which the draft says are zero). The Slot Offset proper (low n+4 bits)
  stays 0, and :func:`counter_fields` reads only those; a target that uses the low 32 bits as an
  address offset would overrun a one-slot ring. Suggested fix: for N = 1 use Add Data
  0x0000000100000000, or require N >= 2.
"""

from collections import deque
from dataclasses import dataclass, field

from hw.headers import (RING_ADD_DATA, RING_ADD_DATA_UNMASKED, SLOT_EMPTY, RingSlot, pack,
                        ring_add_mask, unpack, wire_fields)

__all__ = [
    "MASK64", "MASK32", "SLOT_SIZE", "masked_fetch_add", "fetch_add", "counter_fields",
    "RingEmpty", "RingStall", "RingImage", "Allocator", "DirectAllocator", "Freer",
    "SeqFreer",
    "Initiator", "InvariantViolation", "RingWorld", "ExploreResult", "explore",
]

MASK64 = (1 << 64) - 1
MASK32 = (1 << 32) - 1
SLOT_SIZE = RingSlot.SIZE            # 16 octets
# Field offsets within a slot, taken from the one layout in hw.headers (fast paths use them).
_FIELDS = {name: (off, bits // 8) for name, off, bits, _ in wire_fields(RingSlot)}
_SEQ_OFF, _SEQ_LEN = _FIELDS["sequence"]
_BO_OFF, _BO_LEN = _FIELDS["block_offset"]
assert (_SEQ_LEN, _BO_LEN) == (4, 8)


def masked_fetch_add(value: int, add: int, mask: int) -> int:
    """Return the new value of a masked FetchAdd.

    Parameters
    ----------
    value, add, mask : int
        64-bit operands. Each set bit of ``mask`` is the most significant bit of a field; the
        carry out of such a bit is dropped instead of entering the next field up.

    Returns
    -------
    int
        The new 64-bit value (the "fetched" value is ``value`` itself).

    Notes
    -----
    Computed with the carry-isolation identity: clear the field MSBs of both operands, so a carry
    out of a field's low bits lands in its (cleared) MSB and can go no further; then put the MSBs
    back with XOR, which is their sum modulo 2 including that carry. ``mask == 0`` gives plain
    addition modulo 2**64.
    """
    value &= MASK64
    add &= MASK64
    mask &= MASK64
    low = ((value & ~mask) + (add & ~mask)) & MASK64
    return low ^ ((value ^ add) & mask)


def fetch_add(value: int, add: int) -> int:
    """New value of an unmasked (InfiniBand) Fetch and Add: ``(value + add) mod 2**64``."""
    return (value + add) & MASK64


def counter_fields(value: int, n_order: int, masked: bool = True) -> tuple[int, int]:
    """Split a Head/Tail counter into ``(ticket, slot_offset)``.

    Masked counters carry the Slot Offset in bits n+3..0; unmasked ones hold zero there and the
    slot is ``16 * (ticket mod N)``.
    """
    ticket = (value >> 32) & MASK32
    if masked:
        return ticket, value & ((SLOT_SIZE << n_order) - 1)
    return ticket, SLOT_SIZE * (ticket % (1 << n_order))


class RingEmpty(Exception):
    """No ticket is available: Tail ticket == Head ticket (allocation must fail with NO_SPACE)."""


class RingStall(Exception):
    """The slot of a taken ticket is not ready yet (its block is still being freed into it).

    Attributes ``ticket`` and ``slot_offset`` say which allocation to finish later with
    :meth:`RingImage.finish_allocation`.
    """

    def __init__(self, ticket, slot_offset):
        super().__init__(f"slot {slot_offset:#x} not ready for ticket {ticket}")
        self.ticket = ticket
        self.slot_offset = slot_offset


class RingImage:
    """The free-block ring and its two counters inside a target memory image.

    Parameters
    ----------
    mem : bytearray
        The target memory image; slots live at ``mem[base : base + 16 * N]``.
    base : int
        Byte address of slot 0 in ``mem``.
    n_order : int
        ``N = 2 ** n_order`` slots.
    head_addr, tail_addr : int
        Byte addresses of the 8-octet Head and Tail counters (multiples of 8).
    addr_le : bool
        ADDR_LE: the Block Offset of slots is little-endian (Sequence stays big-endian).
    masked : bool
        True: the draft's counter ``ticket << 32 | slot offset`` advanced with RING_ADD_DATA under
        ``ring_add_mask(n)``. False: the InfiniBand variant, ``ticket << 32`` advanced with
        RING_ADD_DATA_UNMASKED, slot ``16 * (ticket mod N)``.
    counter_order : str
        Byte order of the counters in ``mem``: "little" (default, see module notes) or "big".

    Attributes
    ----------
    pending_frees : dict[int, collections.deque]
        Deferred frees per slot offset, oldest first, as ``(ticket, block_offset)``.
    """

    def __init__(self, mem: bytearray, base: int, n_order: int, head_addr: int, tail_addr: int,
                 *, addr_le: bool = False, masked: bool = True, counter_order: str = "little"):
        if head_addr % 8 or tail_addr % 8:
            raise ValueError("Head and Tail must be aligned to 8 octets (FetchAdd)")
        if counter_order not in ("little", "big"):
            raise ValueError("counter_order must be 'little' or 'big'")
        self.mem = mem
        self.base = base
        self.n_order = n_order
        self.N = 1 << n_order
        self.head_addr = head_addr
        self.tail_addr = tail_addr
        self.addr_le = addr_le
        self.masked = masked
        self.counter_order = counter_order
        self.add_data = RING_ADD_DATA if masked else RING_ADD_DATA_UNMASKED
        self.add_mask = ring_add_mask(n_order) if masked else 0
        self._bo_order = "little" if addr_le else "big"
        self.pending_frees = {}
        for addr in (base, base + SLOT_SIZE * self.N, head_addr + 8, tail_addr + 8):
            if addr > len(mem):
                raise ValueError(f"ring or counter beyond the memory image ({addr:#x})")

    # -- raw memory actions (each is one RDMA-sized access) ----------------------------------

    def _caddr(self, which):
        if which == "head":
            return self.head_addr
        if which == "tail":
            return self.tail_addr
        raise ValueError(f"counter must be 'head' or 'tail', not {which!r}")

    def read_counter(self, which: str) -> int:
        """Raw 64-bit value of the 'head' or 'tail' counter."""
        a = self._caddr(which)
        return int.from_bytes(self.mem[a:a + 8], self.counter_order)

    def write_counter(self, which: str, value: int) -> None:
        """Store a raw counter value (initialization only; the protocol uses FetchAdd)."""
        a = self._caddr(which)
        self.mem[a:a + 8] = (value & MASK64).to_bytes(8, self.counter_order)

    def counter_fields(self, which: str) -> tuple[int, int]:
        """``(ticket, slot_offset)`` currently in a counter."""
        return counter_fields(self.read_counter(which), self.n_order, self.masked)

    def fetch_add_counter(self, which: str) -> tuple[int, int]:
        """One atomic (masked) FetchAdd on a counter; returns ``(ticket, slot_offset)`` before."""
        old = self.read_counter(which)
        if self.masked:
            new = masked_fetch_add(old, self.add_data, self.add_mask)
        else:
            new = fetch_add(old, self.add_data)
        self.write_counter(which, new)
        return counter_fields(old, self.n_order, self.masked)

    def slot_of(self, ticket: int) -> int:
        """Slot Offset that ticket ``ticket`` uses: ``16 * (ticket mod N)``."""
        return SLOT_SIZE * (ticket % self.N)

    def _check_slot(self, slot_offset):
        if slot_offset % SLOT_SIZE or not 0 <= slot_offset < SLOT_SIZE * self.N:
            raise ValueError(f"bad slot offset {slot_offset:#x} for N = {self.N}")
        return self.base + slot_offset

    def read_sequence(self, slot_offset: int) -> int:
        """Read the 4-octet Sequence of a slot (big-endian)."""
        a = self._check_slot(slot_offset) + _SEQ_OFF
        return int.from_bytes(self.mem[a:a + 4], "big")

    def read_block_offset(self, slot_offset: int) -> int:
        """Read the 8-octet Block Offset of a slot (byte order per ADDR_LE)."""
        a = self._check_slot(slot_offset) + _BO_OFF
        return int.from_bytes(self.mem[a:a + 8], self._bo_order)

    def write_sequence(self, slot_offset: int, ticket: int) -> None:
        """Write the Sequence of a slot (the ticket modulo 2**32)."""
        a = self._check_slot(slot_offset) + _SEQ_OFF
        self.mem[a:a + 4] = (ticket & MASK32).to_bytes(4, "big")

    def write_block_offset(self, slot_offset: int, block_offset: int) -> None:
        """Write the Block Offset of a slot (all ones marks it consumed)."""
        a = self._check_slot(slot_offset) + _BO_OFF
        self.mem[a:a + 8] = (block_offset & MASK64).to_bytes(8, self._bo_order)

    def write_slot(self, slot_offset: int, sequence: int, block_offset: int) -> None:
        """Write a whole slot image (initialization only), packed from hw.headers.RingSlot."""
        a = self._check_slot(slot_offset)
        raw = bytearray(pack(RingSlot, sequence=sequence & MASK32, reserved=0,
                             block_offset=block_offset & MASK64))
        if self.addr_le:
            raw[_BO_OFF:_BO_OFF + 8] = raw[_BO_OFF:_BO_OFF + 8][::-1]
        self.mem[a:a + SLOT_SIZE] = raw

    def read_slot(self, slot_offset: int) -> tuple[int, int]:
        """``(sequence, block_offset)`` of a slot (one 16-octet read)."""
        a = self._check_slot(slot_offset)
        return (int.from_bytes(self.mem[a + _SEQ_OFF:a + _SEQ_OFF + 4], "big"),
                int.from_bytes(self.mem[a + _BO_OFF:a + _BO_OFF + 8], self._bo_order))

    def unpack_slot(self, slot_offset: int) -> dict:
        """All fields of a slot (including Reserved) through hw.headers.RingSlot."""
        a = self._check_slot(slot_offset)
        raw = bytearray(self.mem[a:a + SLOT_SIZE])
        if self.addr_le:
            raw[_BO_OFF:_BO_OFF + 8] = raw[_BO_OFF:_BO_OFF + 8][::-1]
        return unpack(RingSlot, raw)

    def slot_consumed(self, slot_offset: int) -> bool:
        """A slot is consumed (empty) when its Block Offset is all ones."""
        return self.read_block_offset(slot_offset) == SLOT_EMPTY

    def slot_free_for(self, ticket: int, slot_offset: int) -> bool:
        """May the free with Tail ticket ``ticket`` write this slot: consumed, and its Sequence
        is ``ticket - N`` (its previous content was written for ticket - N, then consumed)?"""
        seq, bo = self.read_slot(slot_offset)
        return bo == SLOT_EMPTY and seq == ((ticket - self.N) & MASK32)

    def slot_ready(self, ticket: int, slot_offset: int) -> bool:
        """The slot holds the block of ``ticket``: Sequence == ticket and not consumed."""
        seq, bo = self.read_slot(slot_offset)
        return seq == (ticket & MASK32) and bo != SLOT_EMPTY

    # -- the draft's rules, each as one atomic step ------------------------------------------

    def initialize(self, free_block_offsets: list[int], ticket_base: int = 0) -> None:
        """Initialization rule: slots 0..F-1 hold the free blocks with Sequence s, slots F..N-1
        are empty with Sequence s - N (mod 2**32); Head = (0, 0); Tail = (F, 16 * (F mod N)).

        ``ticket_base`` (not in the draft, which starts at 0) shifts every ticket by a constant, so
        tests can start a ring just before the 32-bit ticket wraps: ticket ``ticket_base + k``
        owns block k, in slot ``(ticket_base + k) mod N`` as usual.
        """
        F = len(free_block_offsets)
        if F > self.N:
            raise ValueError(f"F = {F} free blocks exceed N = {self.N} slots")
        for b in free_block_offsets:
            if b == SLOT_EMPTY or not 0 <= b <= MASK64:
                raise ValueError(f"block offset {b:#x} cannot be stored in a slot")
        for k in range(self.N):
            t = (ticket_base + k) & MASK32
            if k < F:
                self.write_slot(self.slot_of(t), t, free_block_offsets[k])
            else:
                self.write_slot(self.slot_of(t), (t - self.N) & MASK32, SLOT_EMPTY)
        self.write_counter("head", self._counter_value(ticket_base))
        self.write_counter("tail", self._counter_value(ticket_base + F))
        self.pending_frees = {}

    def _counter_value(self, ticket):
        ticket &= MASK32
        return (ticket << 32) | (self.slot_of(ticket) if self.masked else 0)

    def occupancy(self) -> int:
        """Tickets available to allocations: Tail ticket - Head ticket (mod 2**32).

        Deferred frees and frees in progress count: they have taken their Tail ticket, and the
        allocation that takes the matching Head ticket waits for them.
        """
        return (self.counter_fields("tail")[0] - self.counter_fields("head")[0]) & MASK32

    def pending_count(self) -> int:
        """Number of deferred frees waiting for their slot."""
        return sum(len(q) for q in self.pending_frees.values())

    def consume(self, slot_offset: int) -> list[tuple[int, int]]:
        """Mark a slot consumed, then perform the oldest deferred free waiting on it.

        Returns
        -------
        list of (ticket, block_offset)
            The deferred frees written into the slot by this call (zero or one: once one is
            written, the slot is full again and the next waiter needs another consumption).
        """
        if self.slot_consumed(slot_offset):
            raise ValueError(f"slot {slot_offset:#x} is already consumed")
        self.write_block_offset(slot_offset, SLOT_EMPTY)
        done = []
        q = self.pending_frees.get(slot_offset)
        if q:
            u, block = q.popleft()
            if not q:
                del self.pending_frees[slot_offset]
            # Draft rule: Block Offset first, then Sequence.
            self.write_block_offset(slot_offset, block)
            self.write_sequence(slot_offset, u)
            done.append((u, block))
        return done

    def free(self, block_offset: int) -> tuple[str, int, int]:
        """Return a block: FetchAdd on Tail, then write the slot or defer.

        Returns
        -------
        (status, ticket, slot_offset)
            status is ``"written"`` when the slot was consumed and is now written, or
            ``"deferred"`` when the write waits in :attr:`pending_frees` for a consumption.
        """
        if block_offset == SLOT_EMPTY or not 0 <= block_offset <= MASK64:
            raise ValueError(f"block offset {block_offset:#x} cannot be stored in a slot")
        u, o = self.fetch_add_counter("tail")
        # Consumed is not enough when frees may be in flight concurrently (see SeqFreer); the
        # Sequence check makes the rule safe for any caller, and agrees with the draft's text in
        # this single-threaded model, where an older free into the slot is always written or
        # waiting in pending_frees.
        if self.pending_frees.get(o) or not self.slot_free_for(u, o):
            self.pending_frees.setdefault(o, deque()).append((u, block_offset))
            return "deferred", u, o
        self.write_block_offset(o, block_offset)
        self.write_sequence(o, u)
        return "written", u, o

    def take_ticket(self) -> tuple[int, int]:
        """FetchAdd on Head: what a DIRECT_ALLOC initiator (or a chain) does first."""
        return self.fetch_add_counter("head")

    def finish_allocation(self, ticket: int, slot_offset: int) -> int:
        """Read and consume the slot of an already taken ticket; raise RingStall if not ready."""
        if not self.slot_ready(ticket, slot_offset):
            raise RingStall(ticket, slot_offset)
        _, block = self.read_slot(slot_offset)
        self.consume(slot_offset)
        return block

    def allocate(self) -> tuple[int, int, int]:
        """A whole target-executed allocation: ticket, slot check, consumption.

        Raises
        ------
        RingEmpty
            If no ticket is available (checked before the FetchAdd, so nothing changes).
        RingStall
            If the slot of the taken ticket is not ready (a free into it is still pending); the
            ticket stays taken, finish it later with :meth:`finish_allocation`.
        """
        if self.occupancy() == 0:
            raise RingEmpty("free-block ring is empty")
        t, o = self.take_ticket()
        return t, o, self.finish_allocation(t, o)

    def bind_check(self, ticket: int, block_offset: int) -> bool:
        """BIND verification: the slot of ``ticket`` holds ``block_offset`` for that ticket."""
        o = self.slot_of(ticket)
        return self.slot_ready(ticket, o) and self.read_block_offset(o) == block_offset

    def reclaim(self, ticket: int, slot_offset: int) -> int:
        """Reclaim the block of an abandoned direct-allocation ticket.

        Waits (raises RingStall) until the slot holds the ticket's block, consumes it, and returns
        the block to the ring with a new Tail ticket. The result of that free is kept in
        :attr:`last_free`. Returns the block offset.
        """
        block = self.finish_allocation(ticket, slot_offset)
        self.last_free = self.free(block)
        return block

    # -- inspection ----------------------------------------------------------------------------

    def slots(self) -> list[tuple[int, int]]:
        """All slots as ``(sequence, block_offset)``, slot 0 first."""
        return [self.read_slot(SLOT_SIZE * s) for s in range(self.N)]


# ------------------------------------------------------------------------------------------------
# Step machines: the same rules, one memory action per step
# ------------------------------------------------------------------------------------------------
#
# Each machine keeps its state in a plain tuple ``st`` so that an explorer can snapshot and restore
# it cheaply; ``enabled_in(ring, st)`` says whether the next action can happen now (a read that
# would fail its check changes nothing, so it is modelled as "not enabled": the actor waits), and
# ``advance(ring, st)`` performs exactly one memory action and returns ``(new_st, event)``.
# Events are tuples naming the action and its operands, for invariant checkers.


class _Machine:
    """Common wrapper: an instance holds ``ring`` and ``st`` and forwards to the static rules."""

    def __init__(self, ring, st):
        self.ring = ring
        self.st = st

    @property
    def phase(self):
        return self.st[0]

    @property
    def done(self):
        return self.st[0] == "done"

    def enabled(self):
        return self.enabled_in(self.ring, self.st)

    def step(self):
        """Perform one memory action; returns the event tuple."""
        if not self.enabled():
            raise RuntimeError(f"{type(self).__name__} in {self.st!r} cannot step now")
        self.st, event = self.advance(self.ring, self.st)
        return event


def _claim_step(ring, st, then):
    """The two phases every allocation starts with (target or initiator): ``start`` FetchAdds
    Head for a ticket; ``read`` reads the ticket's slot (one 16-octet read) and goes on to the
    phase ``then`` with the Block Offset it read."""
    if st[0] == "start":
        t, o = ring.fetch_add_counter("head")
        return ("read", t, o), ("fetch_head", t, o)
    _, t, o = st
    seq, bo = ring.read_slot(o)
    return (then, t, o, bo), ("read", t, o, seq, bo)


class Allocator(_Machine):
    """Target-executed allocation chain: FetchAdd Head; read slot (until its Sequence is the ticket
    and it is not empty); mark it consumed.

    States: ``("start",)`` -> ``("read", t, o)`` -> ``("consume", t, o, block)`` ->
    ``("done", t, o, block)``. A reclamation of an abandoned ticket starts at ``("read", t, o)``.
    """

    def __init__(self, ring, st=("start",)):
        super().__init__(ring, st)

    @staticmethod
    def enabled_in(ring, st):
        if st[0] == "read":
            return ring.slot_ready(st[1], st[2])
        return st[0] != "done"

    @staticmethod
    def advance(ring, st):
        ph = st[0]
        if ph in ("start", "read"):
            return _claim_step(ring, st, "consume")
        if ph == "consume":
            _, t, o, b = st
            ring.write_block_offset(o, SLOT_EMPTY)
            return ("done", t, o, b), ("consume", t, o, b)
        raise RuntimeError(f"Allocator cannot step from {st!r}")


class DirectAllocator(_Machine):
    """DIRECT_ALLOC by an initiator: FetchAdd its Head; RDMA Read the slot until ready; read it once
    more to confirm (a 16-octet read is not atomic); write the data (no ring action); send BIND,
    which the target verifies against the slot and then consumes.

    States: ``("start",)`` -> ``("read", t, o)`` -> ``("confirm", t, o, b)`` ->
    ``("bind", t, o, b)`` -> ``("done", t, o, b)``; a failed confirmation goes back to ``read``;
    a BIND the target rejects ends in ``("rejected", t, o, b)``.
    """

    def __init__(self, ring, st=("start",)):
        super().__init__(ring, st)

    @property
    def done(self):
        return self.st[0] in ("done", "rejected")

    @staticmethod
    def enabled_in(ring, st):
        if st[0] == "read":
            return ring.slot_ready(st[1], st[2])
        return st[0] not in ("done", "rejected")

    @staticmethod
    def advance(ring, st):
        ph = st[0]
        if ph in ("start", "read"):
            return _claim_step(ring, st, "confirm")
        if ph == "confirm":
            _, t, o, b = st
            seq, bo = ring.read_slot(o)
            if seq == (t & MASK32) and bo == b:
                return ("bind", t, o, b), ("confirm", t, o, seq, bo)
            return ("read", t, o), ("confirm_failed", t, o, seq, bo)
        if ph == "bind":
            _, t, o, b = st
            # Target side of BIND: verify the slot of the ticket holds that block, then consume.
            if ring.slot_of(t) == o and ring.bind_check(t, b):
                ring.write_block_offset(o, SLOT_EMPTY)
                return ("done", t, o, b), ("consume", t, o, b)
            return ("rejected", t, o, b), ("bind_rejected", t, o, b)
        raise RuntimeError(f"DirectAllocator cannot step from {st!r}")


class Freer(_Machine):
    """Target free of one block: FetchAdd Tail; read the slot's Block Offset; if consumed write
    Block Offset then Sequence (two writes), otherwise wait (deferred) until it is consumed.

    States: ``("start", b)`` -> ``("check", b, u, o)`` -> ``("deferred", b, u, o)`` (only while
    the slot is not consumed) -> ``("write_bo", b, u, o)`` -> ``("write_seq", b, u, o)`` ->
    ``("done", b, u, o)``. ``deferred`` is enabled only once the slot reads as consumed.
    """

    def __init__(self, ring, block_offset=None, st=None):
        super().__init__(ring, st if st is not None else ("start", block_offset))

    #: False: the draft's literal rule, the slot is free when its Block Offset is all ones.
    CHECK_SEQUENCE = False

    @classmethod
    def slot_free(cls, ring, u, o):
        """May free ticket ``u`` write slot ``o`` now?"""
        if cls.CHECK_SEQUENCE:
            return ring.slot_free_for(u, o)
        return ring.slot_consumed(o)

    @classmethod
    def enabled_in(cls, ring, st):
        if st[0] == "deferred":
            return cls.slot_free(ring, st[2], st[3])
        return st[0] != "done"

    @classmethod
    def advance(cls, ring, st):
        ph = st[0]
        if ph == "start":
            b = st[1]
            u, o = ring.fetch_add_counter("tail")
            return ("check", b, u, o), ("fetch_tail", u, o, b)
        _, b, u, o = st
        if ph in ("check", "deferred"):
            if cls.slot_free(ring, u, o):         # one read of the slot
                return ("write_bo", b, u, o), ("check_consumed", u, o)
            return ("deferred", b, u, o), ("defer", u, o)
        if ph == "write_bo":
            ring.write_block_offset(o, b)
            return ("write_seq", b, u, o), ("write_bo", u, o, b)
        if ph == "write_seq":
            ring.write_sequence(o, u)
            return ("done", b, u, o), ("write_seq", u, o, b)
        raise RuntimeError(f"Freer cannot step from {st!r}")


class SeqFreer(Freer):
    """Free that writes its slot only when it is consumed AND its Sequence is ``u - N``, i.e. the
    slot's previous content was the one for ticket ``u - N`` (written, then consumed).

    The draft's literal check (Block Offset all ones) cannot tell "the previous free into this
    slot was consumed" from "the previous free into this slot has not written it yet": two frees
    N tickets apart, both in flight, then both see a consumed slot and the later one may write
    first, losing a block (found by :func:`explore`). The Sequence the draft already gives the
    initially empty slots (s - N) makes this check work from the first free on.
    """

    CHECK_SEQUENCE = True


# ------------------------------------------------------------------------------------------------
# Exhaustive exploration of concurrent allocations and frees
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Initiator:
    """One initiator in an exploration.

    Parameters
    ----------
    quota : int
        Allocation Quota; usage = held blocks + allocation tickets in flight + frees whose usage
        has not been released yet (see ``release`` of :class:`RingWorld`).
    allocs : int
        Allocations it starts (at any time, while under quota).
    frees : int
        Frees it starts, each of any block it holds at that time.
    direct : bool
        Its allocations are DIRECT_ALLOC (initiator reads the slot, BIND consumes it) instead of
        target-executed chains.
    abandons : int
        DIRECT_ALLOC tickets it takes and never binds; the target reclaims each one (waits for
        the slot, consumes it, frees the block with a new Tail ticket).
    """

    quota: int
    allocs: int = 1
    frees: int = 0
    direct: bool = False
    abandons: int = 0


class InvariantViolation(AssertionError):
    """An exploration found a state or action that breaks a ring invariant."""


_KIND = {"A": Allocator, "D": DirectAllocator, "R": Allocator, "F": Freer}


class RingWorld:
    """A ring plus initiators whose operations interleave one memory action at a time.

    A world state is ``(mem, ops, inits, written)``: the ring and counters bytes; the operations
    in flight as sorted ``(kind, owner, st)`` tuples (kind A = target allocation, D = direct
    allocation, R = reclamation of an abandoned ticket, F = free); per initiator ``(held blocks,
    allocs left, frees left, abandons left, usage)``; and a ghost record, per slot, of the last
    completed write ``(ticket, block)`` (what the slot must hold for its next reader), which the
    invariant checks compare the memory against. The ghost is kept from the operations'
    intentions, not from the ring code, so the two cannot share a bug.

    Parameters
    ----------
    n_order : int
        Ring of N = 2 ** n_order slots.
    blocks : list of int
        The F <= N free block offsets.
    initiators : list of Initiator
        Their quotas must sum to at most F (the draft's target rule), unless ``check_quota``
        is False.
    masked, addr_le : bool
        Counter variant and slot byte order.
    release : str
        When a FREE releases its unit of usage: ``"written"`` once the slot is written (the
        conservative reading) or ``"ticket"`` as soon as it holds its Tail ticket (a FREE that
        completes while deferred).
    ticket_base : int
        First ticket (see :meth:`RingImage.initialize`), to explore the 32-bit ticket wrap.
    free_check : str
        ``"consumed"``: frees use the draft's literal check (:class:`Freer`); ``"sequence"``:
        they also require Sequence == u - N (:class:`SeqFreer`).
    per_slot_order : bool
        The target also keeps its frees in flight per slot in ticket order (as
        :meth:`RingImage.free` does with ``pending_frees``): a free does not check its slot
        while an older free into the same slot is still in flight. The draft's text needs only
        the Block Offset check; this option shows what the extra bookkeeping buys.
    """

    def __init__(self, n_order, blocks, initiators, *, masked=True, addr_le=False,
                 release="written", check_quota=True, per_slot_order=False,
                 free_check="consumed", ticket_base=0):
        self.N = 1 << n_order
        self.blocks = tuple(blocks)
        self.initiators = tuple(initiators)
        if check_quota and sum(i.quota for i in initiators) > len(blocks):
            raise ValueError("sum of quotas exceeds F")
        if release not in ("written", "ticket"):
            raise ValueError("release must be 'written' or 'ticket'")
        self.release = release
        self.per_slot_order = per_slot_order
        if free_check not in ("consumed", "sequence"):
            raise ValueError("free_check must be 'consumed' (draft text) or 'sequence'")
        self.kinds = dict(_KIND, F=SeqFreer if free_check == "sequence" else Freer)
        self.mem = bytearray(SLOT_SIZE * self.N + 16)
        self.ring = RingImage(self.mem, 0, n_order, SLOT_SIZE * self.N, SLOT_SIZE * self.N + 8,
                              addr_le=addr_le, masked=masked)
        self.ring.initialize(list(blocks), ticket_base)
        F = len(blocks)
        written = [None] * self.N
        for k in range(self.N):
            t = (ticket_base + k) & MASK32
            written[t % self.N] = (t, blocks[k]) if k < F else ((t - self.N) & MASK32, -1)
        written = tuple(written)
        inits = tuple(((), i.allocs, i.frees, i.abandons, 0) for i in initiators)
        self.initial = (bytes(self.mem), (), inits, written)

    # -- one transition ------------------------------------------------------------------------

    def _fail(self, msg, state):
        raise InvariantViolation(f"{msg}\n  in state ops={state[1]} inits={state[2]} "
                                 f"written={state[3]}\n  slots={self.ring.slots()}")

    def successors(self, state):
        """Yield ``(label, next_state)`` for every action enabled in ``state``; checks the
        action invariants on the way (raises InvariantViolation)."""
        mem, ops, inits, written = state
        ring = self.ring
        # Initiator actions: start an allocation (its FetchAdd included), an abandoned direct
        # ticket, or a free of a held block (FetchAdd Tail included).
        for i, (held, al, fr, ab, usage) in enumerate(inits):
            q = self.initiators[i].quota
            if al and usage < q:
                kind = "D" if self.initiators[i].direct else "A"
                yield from self._start(state, i, kind, (held, al - 1, fr, ab, usage + 1))
            if ab and usage < q:
                yield from self._start(state, i, "R", (held, al, fr, ab - 1, usage + 1))
            if fr:
                for b in sorted(set(held)):
                    h = list(held)
                    h.remove(b)
                    yield from self._start(state, i, "F", (tuple(h), al, fr - 1, ab, usage),
                                           block=b)
        # Operation steps.
        for j, op in enumerate(ops):
            kind, owner, st = op
            mach = self.kinds[kind]
            self.mem[:] = mem
            if not mach.enabled_in(ring, st):
                continue
            if self.per_slot_order and kind == "F" and st[0] in ("check", "deferred") and any(
                    k2 == "F" and st2[0] != "start" and st2[3] == st[3]
                    and 0 < ((st[2] - st2[2]) & MASK32) < (1 << 31) for k2, _, st2 in ops):
                continue
            yield self._step(state, j, op)

    def _start(self, state, i, kind, new_init, block=None):
        mem, ops, inits, written = state
        self.mem[:] = mem
        st = ("start", block) if kind == "F" else ("start",)
        st, ev = self.kinds[kind].advance(self.ring, st)
        inits = inits[:i] + (new_init,) + inits[i + 1:]
        if kind == "F":
            u, o = ev[1], ev[2]
            if o != self.ring.slot_of(u):
                self._fail(f"free ticket {u} got slot offset {o:#x}", state)
            if self.release == "ticket":
                inits = self._release(inits, i)
        else:
            t, o = ev[1], ev[2]
            if o != self.ring.slot_of(t):
                self._fail(f"allocation ticket {t} got slot offset {o:#x}", state)
            tail_t = self.ring.counter_fields("tail")[0]
            if not 0 < ((tail_t - t) & MASK32) <= len(self.blocks):
                self._fail(f"allocation ticket {t} has no block (Tail ticket {tail_t})", state)
        self._check_counters(state)
        ops = tuple(sorted(ops + ((kind, i, st),)))
        label = (f"{kind}{i}", ev)
        return [(label, (bytes(self.mem), ops, inits, written))]

    def run_sequentially(self, state, actions):
        """Apply whole operations one after another (no interleaving), e.g. to warm the ring up
        before an exploration: ``("alloc", i)`` starts an allocation of initiator i (direct or
        target per its configuration) and runs it to completion; ``("free", i, block)`` likewise.
        Invariants are checked at every step. Returns the resulting state."""
        for act in actions:
            i = act[1]
            held, al, fr, ab, usage = state[2][i]
            if act[0] == "alloc":
                if not al or usage >= self.initiators[i].quota:
                    raise ValueError(f"initiator {i} cannot allocate now")
                kind = "D" if self.initiators[i].direct else "A"
                (_, state), = self._start(state, i, kind, (held, al - 1, fr, ab, usage + 1))
            elif act[0] == "free":
                b = act[2]
                if not fr or b not in held:
                    raise ValueError(f"initiator {i} cannot free block {b} now")
                h = list(held)
                h.remove(b)
                (_, state), = self._start(state, i, "F", (tuple(h), al, fr - 1, ab, usage),
                                         block=b)
            else:
                raise ValueError(f"unknown action {act!r}")
            self.check_state(state)
            # Run the operations in flight (the new one) to completion.
            while state[1]:
                for j, (kind, owner, st) in enumerate(state[1]):
                    self.mem[:] = state[0]
                    if self.kinds[kind].enabled_in(self.ring, st):
                        _, state = self._step(state, j, state[1][j])
                        self.check_state(state)
                        break
                else:
                    self._fail("sequential run is stuck", state)
        return state

    def _release(self, inits, i):
        held, al, fr, ab, usage = inits[i]
        return inits[:i] + ((held, al, fr, ab, usage - 1),) + inits[i + 1:]

    def _step(self, state, j, op):
        mem, ops, inits, written = state
        kind, owner, st = op
        ring = self.ring
        ph = st[0]
        # Pre-checks of the writes against the ghost.
        if kind == "F" and ph == "write_bo":
            _, b, u, o = st
            if not ring.slot_consumed(o):
                self._fail(f"free ticket {u} overwrites slot {o:#x} before it is consumed", state)
            if written[o // SLOT_SIZE][0] != ((u - self.N) & MASK32):
                self._fail(f"free ticket {u} writes slot {o:#x} whose last write was for ticket "
                           f"{written[o // SLOT_SIZE][0]}, not {u - self.N}", state)
        if kind in ("A", "R") and ph == "consume" or kind == "D" and ph == "bind":
            _, t, o, b = st
            if ring.read_block_offset(o) != b or written[o // SLOT_SIZE] != (t & MASK32, b):
                self._fail(f"ticket {t} consumes slot {o:#x} that no longer holds block {b}",
                           state)
        new_st, ev = self.kinds[kind].advance(ring, st)
        ops = list(ops)
        del ops[j]
        if ev[0] == "read":
            _, t, o, seq, bo = ev
            if written[o // SLOT_SIZE] != (t & MASK32, bo) or o != ring.slot_of(t):
                self._fail(f"ticket {t} read slot {o:#x} = (seq {seq}, block {bo}); the slot "
                           f"was written for {written[o // SLOT_SIZE]}", state)
        elif ev[0] in ("confirm_failed", "bind_rejected"):
            self._fail(f"direct allocation event {ev}", state)
        elif ev[0] == "write_seq":
            _, u, o, b = ev
            s = o // SLOT_SIZE
            written = written[:s] + ((u & MASK32, b),) + written[s + 1:]
        if new_st[0] == "done":
            if kind in ("A", "D"):
                held, al, fr, ab, usage = inits[owner]
                inits = inits[:owner] + ((tuple(sorted(held + (new_st[3],))), al, fr, ab,
                                          usage),) + inits[owner + 1:]
            elif kind == "R":
                # The target returns the reclaimed block at once, with a new Tail ticket.
                fst, fev = self.kinds["F"].advance(ring, ("start", new_st[3]))
                ops.append(("F", owner, fst))
                self._check_counters(state)
                if self.release == "ticket":
                    inits = self._release(inits, owner)
            elif kind == "F" and self.release == "written":
                inits = self._release(inits, owner)
        else:
            ops.append((kind, owner, new_st))
        return (f"{kind}{owner}", ev), (bytes(self.mem), tuple(sorted(ops)), inits, written)

    def _check_counters(self, state):
        ring = self.ring
        for which in ("head", "tail"):
            raw = ring.read_counter(which)
            t, o = counter_fields(raw, ring.n_order, ring.masked)
            low = raw & MASK32
            # For N = 1 the draft's Add Data bit 4 lies above the mask bit 3 and carries into
            # bits 31..4 (see test_ring.py::test_n1_counter_defect), so only the low n+4 bits
            # are checked there.
            if ring.masked and ((ring.n_order and low >> (ring.n_order + 4))
                                or o != ring.slot_of(t)):
                self._fail(f"{which} counter {raw:#018x} has a bad Slot Offset field", state)
            if not ring.masked and low:
                self._fail(f"unmasked {which} counter {raw:#018x} has low bits set", state)

    # -- state invariants ----------------------------------------------------------------------

    def check_state(self, state):
        """Every block is in exactly one place: an unconsumed ring slot that no operation is
        taking, an operation in flight (allocation that has read it, free in progress), or an
        initiator's hand."""
        mem, ops, inits, written = state
        self.mem[:] = mem
        ring = self.ring
        where = {}

        def put(b, place):
            if b in where:
                self._fail(f"block {b} is in two places: {where[b]} and {place}", state)
            where[b] = place

        taken = set()
        for kind, owner, st in ops:
            ph = st[0]
            if kind == "F":
                put(st[1], f"free by {owner} ({ph})")
                if ph == "write_seq":
                    taken.add(st[3])
            elif ph in ("consume", "confirm", "bind"):
                put(st[3], f"allocation {kind} by {owner} ({ph})")
                taken.add(st[2])
        for i, init in enumerate(inits):
            for b in init[0]:
                put(b, f"held by initiator {i}")
        for s in range(self.N):
            o = SLOT_SIZE * s
            bo = ring.read_block_offset(o)
            if bo != SLOT_EMPTY and o not in taken:
                put(bo, f"ring slot {s}")
        if set(where) != set(self.blocks):
            lost = set(self.blocks) - set(where)
            extra = set(where) - set(self.blocks)
            self._fail(f"blocks lost {sorted(lost)} / unknown {sorted(extra)}", state)
        if not ops:
            # Quiescent: the counters say exactly how many blocks wait in the ring, and every
            # initiator's usage is exactly its bound handles.
            in_ring = sum(1 for v in where.values() if v.startswith("ring"))
            if ring.occupancy() != in_ring:
                self._fail(f"occupancy {ring.occupancy()} but {in_ring} blocks in the ring", state)
            for i, init in enumerate(inits):
                if init[4] != len(init[0]):
                    self._fail(f"initiator {i} usage {init[4]} != {len(init[0])} held", state)
        # Termination: operations in flight must be able to finish by themselves.
        if ops and not any(self.kinds[k].enabled_in(ring, st) for k, _, st in ops
                           if not (self.per_slot_order and k == "F"
                                   and st[0] in ("check", "deferred") and any(
                                       k2 == "F" and st2[3] == st[3]
                                       and 0 < ((st[2] - st2[2]) & MASK32) < (1 << 31)
                                       for k2, _, st2 in ops))):
            self._fail("deadlock: operations in flight and none can proceed", state)


@dataclass
class ExploreResult:
    """Figures of one exhaustive exploration."""

    states: int = 0
    transitions: int = 0
    terminal_states: int = 0
    paths: int | None = None          # complete interleavings; None if the graph has a cycle
    deferrals: int = 0                # transitions in which a free was deferred
    max_in_flight: int = 0
    labels: set = field(default_factory=set)

    def summary(self):
        p = "cyclic" if self.paths is None else f"{self.paths}"
        return (f"states={self.states} transitions={self.transitions} "
                f"terminal_states={self.terminal_states} interleavings={p} "
                f"deferrals={self.deferrals} max_in_flight={self.max_in_flight}")


def explore(world, visit=None, max_states=5_000_000, start=None):
    """Visit every reachable state of ``world`` (DFS with memoization), checking invariants.

    Parameters
    ----------
    world : RingWorld
    visit : callable, optional
        Called with each new state (for scenario look-ups).
    start : tuple, optional
        State to start from (default ``world.initial``), e.g. from
        :meth:`RingWorld.run_sequentially`.

    Returns
    -------
    ExploreResult
        Counts of states, transitions, terminal states and complete interleavings (paths from
        the initial state to a terminal state, counted over the state graph).
    """
    res = ExploreResult()
    start = world.initial if start is None else start
    index = {start: 0}
    succ = [None]
    stack = [start]
    world.check_state(start)
    if visit:
        visit(start)
    while stack:
        s = stack.pop()
        sid = index[s]
        out = []
        for label, t in world.successors(s):
            res.transitions += 1
            if label[1][0] == "defer":
                res.deferrals += 1
            tid = index.get(t)
            if tid is None:
                tid = index[t] = len(succ)
                succ.append(None)
                world.check_state(t)
                res.max_in_flight = max(res.max_in_flight, len(t[1]))
                if visit:
                    visit(t)
                stack.append(t)
                if len(succ) > max_states:
                    raise RuntimeError(f"more than {max_states} states")
            out.append(tid)
        succ[sid] = out
    res.states = len(succ)
    res.terminal_states = sum(1 for o in succ if not o)
    # Complete interleavings: paths to terminal states, by DP in reverse topological order.
    order, mark = [], [0] * len(succ)       # 0 new, 1 on stack, 2 finished
    cyclic = False
    for root in range(len(succ)):
        if mark[root]:
            continue
        work = [(root, 0)]
        mark[root] = 1
        while work:
            v, k = work.pop()
            if k < len(succ[v]):
                work.append((v, k + 1))
                w = succ[v][k]
                if mark[w] == 0:
                    mark[w] = 1
                    work.append((w, 0))
                elif mark[w] == 1:
                    cyclic = True
            else:
                mark[v] = 2
                order.append(v)
    if not cyclic:
        paths = [0] * len(succ)
        for v in order:
            paths[v] = 1 if not succ[v] else sum(paths[w] for w in succ[v])
        res.paths = paths[0]
    return res

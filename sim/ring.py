# Ref: draft KBTP §Free-Block Ring, §Allocation Quotas, §Direct Modes (DIRECT_ALLOC),
#      §InfiniBand and RoCEv2 (unmasked Fetch and Add), §Examples (ring counter table, deferred free);
#      RFC 7306 §3.1 (masked Fetch and Add); shared/spec/layouts.md §Ring counters.
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
"""

from collections import deque

from hw.headers import (RING_ADD_DATA, RING_ADD_DATA_UNMASKED, SLOT_EMPTY, RingSlot, pack,
                        ring_add_mask, unpack)

__all__ = [
    "MASK64", "MASK32", "SLOT_SIZE", "masked_fetch_add", "fetch_add", "counter_fields",
    "RingEmpty", "RingStall", "RingImage",
]

MASK64 = (1 << 64) - 1
MASK32 = (1 << 32) - 1
SLOT_SIZE = RingSlot.SIZE            # 16 octets
_BO_OFF = 8                          # offset of Block Offset within a slot, from the RingSlot layout
_SEQ_OFF = 0


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
        """Store a raw counter value (initialization only; the protocol changes them by FetchAdd)."""
        a = self._caddr(which)
        self.mem[a:a + 8] = (value & MASK64).to_bytes(8, self.counter_order)

    def counter_fields(self, which: str) -> tuple[int, int]:
        """``(ticket, slot_offset)`` currently in a counter."""
        return counter_fields(self.read_counter(which), self.n_order, self.masked)

    def fetch_add_counter(self, which: str) -> tuple[int, int]:
        """One atomic (masked) FetchAdd on a counter; returns ``(ticket, slot_offset)`` before it."""
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
        """``(sequence, block_offset)`` of a slot, unpacked through hw.headers.RingSlot."""
        a = self._check_slot(slot_offset)
        raw = bytearray(self.mem[a:a + SLOT_SIZE])
        if self.addr_le:
            raw[_BO_OFF:_BO_OFF + 8] = raw[_BO_OFF:_BO_OFF + 8][::-1]
        f = unpack(RingSlot, raw)
        return f["sequence"], f["block_offset"]

    def slot_consumed(self, slot_offset: int) -> bool:
        """A slot is consumed (empty) when its Block Offset is all ones."""
        return self.read_block_offset(slot_offset) == SLOT_EMPTY

    def slot_ready(self, ticket: int, slot_offset: int) -> bool:
        """The slot holds the block of ``ticket``: Sequence == ticket and not consumed."""
        seq, bo = self.read_slot(slot_offset)
        return seq == (ticket & MASK32) and bo != SLOT_EMPTY

    # -- the draft's rules, each as one atomic step ------------------------------------------

    def initialize(self, free_block_offsets: list[int]) -> None:
        """Initialization rule: slots 0..F-1 hold the free blocks with Sequence s, slots F..N-1
        are empty with Sequence s - N (mod 2**32); Head = (0, 0); Tail = (F, 16 * (F mod N))."""
        F = len(free_block_offsets)
        if F > self.N:
            raise ValueError(f"F = {F} free blocks exceed N = {self.N} slots")
        for b in free_block_offsets:
            if b == SLOT_EMPTY or not 0 <= b <= MASK64:
                raise ValueError(f"block offset {b:#x} cannot be stored in a slot")
        for s in range(self.N):
            if s < F:
                self.write_slot(SLOT_SIZE * s, s, free_block_offsets[s])
            else:
                self.write_slot(SLOT_SIZE * s, (s - self.N) & MASK32, SLOT_EMPTY)
        self.write_counter("head", 0)
        tail_off = SLOT_SIZE * (F % self.N) if self.masked else 0
        self.write_counter("tail", (F << 32) | tail_off)
        self.pending_frees = {}

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
        if self.pending_frees.get(o) or not self.slot_consumed(o):
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

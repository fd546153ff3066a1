# Ref: draft KBTP §Free-Block Ring, §Allocation Quotas, §Direct Modes, §InfiniBand and RoCEv2,
#      §Examples (ring counter table, deferred-free scenario); RFC 7306 §3.1; layouts.md.
"""Unit tests of model/ring.py: masked FetchAdd, counters, slot images, the draft's scenarios.

Oracles: the draft's worked table (literal numbers), a per-field and a bit-serial adder written
here from the definition of the masked add, ``struct.pack`` for the slot and counter bytes, and
hand-followed scenarios of the draft.
"""

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hw.headers import RING_ADD_DATA, RING_ADD_DATA_UNMASKED, SLOT_EMPTY, ring_add_mask
from model.ring import (MASK64, Allocator, DirectAllocator, Freer, RingEmpty, RingImage, RingStall,
                      SeqFreer, counter_fields, fetch_add, masked_fetch_add)

u64 = st.integers(0, MASK64)


# -- oracles ------------------------------------------------------------------------------------

def fieldwise_add(value, add, mask):
    """Masked add computed field by field: fields end (MSB) at each set mask bit and at bit 63."""
    tops = sorted(b for b in range(64) if mask >> b & 1)
    if 63 not in tops:
        tops.append(63)
    out, lo = 0, 0
    for top in tops:
        width = top - lo + 1
        m = (1 << width) - 1
        f = ((value >> lo & m) + (add >> lo & m)) & m      # this field's carry out is dropped
        out |= f << lo
        lo = top + 1
    return out


def ripple_add(value, add, mask):
    """Bit-serial ripple-carry adder that kills the carry leaving every mask bit."""
    out, carry = 0, 0
    for b in range(64):
        s = (value >> b & 1) + (add >> b & 1) + carry
        out |= (s & 1) << b
        carry = 0 if mask >> b & 1 else s >> 1
    return out


def slot_bytes(seq, block, addr_le):
    """Ring slot image from struct.pack: Sequence BE, 4 reserved, Block Offset BE or LE."""
    return struct.pack(">II", seq, 0) + struct.pack("<Q" if addr_le else ">Q", block)


def new_ring(n, *, base=64, addr_le=False, masked=True, size=None):
    N = 1 << n
    mem = bytearray(size or (base + 16 * N + 64))
    head = base + 16 * N + 8
    ring = RingImage(mem, base, n, head, head + 16, addr_le=addr_le, masked=masked)
    return mem, ring


# -- masked FetchAdd ----------------------------------------------------------------------------

def test_draft_worked_example_table():
    # Draft §Examples: N = 4, Add Data 0x0000000100000010, Add Mask 0x8000000080000020.
    mask = ring_add_mask(2)
    assert mask == 0x8000000080000020
    assert RING_ADD_DATA == 0x0000000100000010
    expected = [((0, 0), 0x0000000100000010), ((1, 16), 0x0000000200000020),
                ((2, 32), 0x0000000300000030), ((3, 48), 0x0000000400000000),
                ((4, 0), 0x0000000500000010)]
    v = 0
    for (ticket, off), new in expected:
        assert counter_fields(v, 2) == (ticket, off)
        v = masked_fetch_add(v, RING_ADD_DATA, mask)
        assert v == new


def test_draft_worked_example_through_ring_image():
    mem, ring = new_ring(2)
    ring.initialize([0x1000 * i for i in range(4)])
    got = [ring.fetch_add_counter("head") for _ in range(5)]
    assert got == [(0, 0), (1, 16), (2, 32), (3, 48), (4, 0)]
    raw = mem[ring.head_addr:ring.head_addr + 8]
    assert raw == struct.pack("<Q", 0x0000000500000010)      # little-endian counter, documented


@settings(max_examples=400, deadline=None)
@given(u64, u64, u64)
def test_masked_add_matches_fieldwise_oracle(value, add, mask):
    r = masked_fetch_add(value, add, mask)
    assert r == fieldwise_add(value, add, mask)
    assert r == ripple_add(value, add, mask)


@settings(max_examples=200, deadline=None)
@given(u64, u64, st.sets(st.integers(0, 63), max_size=6))
def test_masked_add_sparse_masks(value, add, bits):
    mask = sum(1 << b for b in bits)
    assert masked_fetch_add(value, add, mask) == fieldwise_add(value, add, mask)


@settings(max_examples=100, deadline=None)
@given(u64, u64)
def test_mask_zero_is_plain_addition(value, add):
    assert masked_fetch_add(value, add, 0) == (value + add) % 2**64
    assert fetch_add(value, add) == (value + add) % 2**64


def test_ripple_oracle_sanity():
    # The oracles themselves against hand-computed values (so they cannot both be wrong the same
    # way as the implementation): 0xF + 1 in a 4-bit field wraps to 0 without touching bit 4.
    assert fieldwise_add(0xF, 1, 0x8) == 0
    assert ripple_add(0xF, 1, 0x8) == 0
    assert fieldwise_add(0xF, 1, 0) == 0x10
    assert ripple_add(0xFF, 1, 0x8) == 0xF0


@pytest.mark.parametrize("n", [1, 2, 3, 5, 10, 27])
def test_ticket_wraps_without_touching_offset(n):
    mask = ring_add_mask(n)
    N = 1 << n
    for slot in (0, N - 1):
        v = (0xFFFFFFFF << 32) | (16 * slot)
        new = masked_fetch_add(v, RING_ADD_DATA, mask)
        assert new >> 32 == 0                                  # ticket wrapped to 0
        assert new & 0xFFFFFFFF == 16 * ((slot + 1) % N)       # offset advanced on its own


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8, 16, 27])
def test_offset_wraps_without_touching_upper_bits(n):
    mask = ring_add_mask(n)
    N = 1 << n
    v = (12345 << 32) | (16 * (N - 1))
    new = masked_fetch_add(v, RING_ADD_DATA, mask)
    assert new == (12346 << 32)                               # offset 0, bits 31..n+4 still 0
    # A whole lap: N adds bring the offset back and advance the ticket by N.
    v = 7 << 32
    for _ in range(N if N <= 256 else 0):
        v = masked_fetch_add(v, RING_ADD_DATA, mask)
        assert (v & 0xFFFFFFFF) >> (n + 4) == 0
    if N <= 256:
        assert v == (7 + N) << 32


def test_n1_counter_defect():
    """Draft issue: for N = 1 (n = 0) the mask bit n+3 = 3 lies below Add Data's bit 4, so the
    carry is not confined to the Slot Offset: bits 31..4 count up, against "Bits 31 to n+4 are
    zero". The low n+4 bits (the Slot Offset) stay 0, which is what counter_fields returns."""
    mask = ring_add_mask(0)
    v = 0
    for i in range(1, 4):
        v = masked_fetch_add(v, RING_ADD_DATA, mask)
        assert v == (i << 32) | (16 * i)                       # 0x10, 0x20, 0x30 leak in
        assert counter_fields(v, 0) == (i, 0)


# -- slot images and initialization ------------------------------------------------------------

@pytest.mark.parametrize("addr_le", [False, True])
@pytest.mark.parametrize("masked", [True, False])
@pytest.mark.parametrize("n,F", [(0, 1), (2, 3), (2, 4), (3, 5), (4, 16)])
def test_initialization_bytes(n, F, addr_le, masked):
    N = 1 << n
    mem, ring = new_ring(n, addr_le=addr_le, masked=masked)
    blocks = [0x150000 + 0x8000 * i for i in range(F)]
    ring.initialize(blocks)
    for s in range(N):
        got = bytes(mem[ring.base + 16 * s:ring.base + 16 * s + 16])
        if s < F:
            assert got == slot_bytes(s, blocks[s], addr_le), s
        else:
            assert got == slot_bytes((s - N) % 2**32, 2**64 - 1, addr_le), s
        # The fast reader and the hw.headers RingSlot unpacking agree on every field.
        f = ring.unpack_slot(16 * s)
        assert (f["sequence"], f["block_offset"]) == ring.read_slot(16 * s)
        assert f["reserved"] == 0
    assert mem[ring.head_addr:ring.head_addr + 8] == bytes(8)
    tail = (F << 32) | (16 * (F % N) if masked else 0)
    assert mem[ring.tail_addr:ring.tail_addr + 8] == struct.pack("<Q", tail)
    assert ring.occupancy() == F
    assert bytes(mem[:ring.base]) == bytes(ring.base)           # nothing written before the ring


def test_addr_le_block_offset_byte_order():
    mem, ring = new_ring(1, base=0, addr_le=True)
    ring.initialize([0x0102030405060708])
    assert bytes(mem[8:16]) == bytes([8, 7, 6, 5, 4, 3, 2, 1])
    assert bytes(mem[0:4]) == bytes([0, 0, 0, 0])
    assert ring.read_slot(0) == (0, 0x0102030405060708)


def test_initialize_rejects_too_many_blocks():
    _, ring = new_ring(1)
    with pytest.raises(ValueError):
        ring.initialize([1, 2, 3])
    with pytest.raises(ValueError):
        ring.initialize([SLOT_EMPTY])


def test_counter_alignment():
    with pytest.raises(ValueError):
        RingImage(bytearray(256), 0, 2, 68, 80)


# -- unmasked (InfiniBand / RoCEv2) variant -----------------------------------------------------

def test_unmasked_variant():
    mem, ring = new_ring(2, masked=False)
    ring.initialize([100, 101, 102])
    assert ring.add_data == RING_ADD_DATA_UNMASKED and ring.add_mask == 0
    seen = []
    for _ in range(3):
        t, o, b = ring.allocate()
        seen.append((t, o, b))
    assert seen == [(0, 0, 100), (1, 16, 101), (2, 32, 102)]
    assert mem[ring.head_addr:ring.head_addr + 8] == struct.pack("<Q", 3 << 32)
    with pytest.raises(RingEmpty):
        ring.allocate()
    # Frees land at 16 * (ticket mod N): tickets 3, 4 -> slots 3, 0.
    assert ring.free(102) == ("written", 3, 48)
    assert ring.free(100) == ("written", 4, 0)
    assert mem[ring.tail_addr:ring.tail_addr + 8] == struct.pack("<Q", 5 << 32)
    assert ring.allocate() == (3, 48, 102)
    assert ring.allocate() == (4, 0, 100)


@settings(max_examples=50, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 8))
def test_unmasked_counter_fields(ticket, n):
    v = fetch_add(ticket << 32, RING_ADD_DATA_UNMASKED)
    assert counter_fields(v, n, masked=False) == ((ticket + 1) % 2**32,
                                                  16 * (((ticket + 1) % 2**32) % (1 << n)))


# -- the draft's deferred-free scenario ---------------------------------------------------------

@pytest.mark.parametrize("addr_le", [False, True])
@pytest.mark.parametrize("masked", [True, False])
def test_deferred_free_scenario(masked, addr_le):
    """Draft §Examples: blocks 100..103, N = F = 4, step by step with the atomic API."""
    mem, ring = new_ring(2, masked=masked, addr_le=addr_le)
    ring.initialize([100, 101, 102, 103])
    # X's chain takes ticket 0 and is delayed before reading slot 0.
    assert ring.take_ticket() == (0, 0)
    # Y takes tickets 1, 2, 3: blocks 101, 102, 103.
    assert [ring.allocate() for _ in range(3)] == [(1, 16, 101), (2, 32, 102), (3, 48, 103)]
    assert ring.occupancy() == 0
    # Y frees 101: ticket 4, slot 0, not consumed yet -> deferred, slot 0 untouched.
    before = bytes(mem[ring.base:ring.base + 16])
    assert ring.free(101) == ("deferred", 4, 0)
    assert bytes(mem[ring.base:ring.base + 16]) == before == slot_bytes(0, 100, addr_le)
    assert ring.pending_count() == 1 and ring.occupancy() == 1
    # X reads slot 0, gets 100 and consumes; the deferred free then writes {4, 101}.
    assert ring.slot_ready(0, 0)
    assert ring.read_slot(0) == (0, 100)
    assert ring.consume(0) == [(4, 101)]
    assert bytes(mem[ring.base:ring.base + 16]) == slot_bytes(4, 101, addr_le)
    assert ring.pending_count() == 0
    # The next allocation (ticket 4) gets 101.
    assert ring.allocate() == (4, 0, 101)
    assert ring.occupancy() == 0
    with pytest.raises(RingEmpty):
        ring.allocate()


def test_deferred_free_scenario_step_machines():
    """Same scenario with one memory action per step: the free really waits."""
    mem, ring = new_ring(2)
    ring.initialize([100, 101, 102, 103])
    x = Allocator(ring)
    x.step()                                                # FetchAdd Head: ticket 0
    assert x.st == ("read", 0, 0)
    ys = []
    for _ in range(3):
        y = Allocator(ring)
        while not y.done:
            y.step()
        ys.append(y.st[3])
    assert ys == [101, 102, 103]
    f = SeqFreer(ring, 101)
    assert f.step() == ("fetch_tail", 4, 0, 101)
    assert f.step() == ("defer", 4, 0)
    assert not f.enabled()                                  # waits: slot 0 not consumed
    assert x.step() == ("read", 0, 0, 0, 100)
    assert not f.enabled()                                  # read, not yet consumed
    assert x.step() == ("consume", 0, 0, 100)
    assert f.enabled()
    assert f.step() == ("check_consumed", 4, 0)
    nxt = Allocator(ring)
    nxt.step()
    assert nxt.st == ("read", 4, 0) and not nxt.enabled()   # slot not written yet
    assert f.step() == ("write_bo", 4, 0, 101)
    assert not nxt.enabled()                                # Block Offset before Sequence
    assert f.step() == ("write_seq", 4, 0, 101)
    assert nxt.enabled()
    nxt.step()
    nxt.step()
    assert nxt.st == ("done", 4, 0, 101)


def _drive(machine):
    while not machine.done:
        machine.step()
    return machine.st


@pytest.mark.parametrize("freer,lost", [(Freer, True), (SeqFreer, False)])
def test_concurrent_frees_into_one_slot(freer, lost):
    """Two frees N tickets apart in flight at once (quotas respected: 2 + 2 = F = 4).

    The draft's literal check (Block Offset all ones) lets the later free write first and the
    earlier one then overwrites it: a block is lost. Checking also Sequence == u - N waits.
    Found by tests/model/test_ring_exhaustive.py; replayed here as one fixed schedule.
    """
    mem, ring = new_ring(2)
    ring.initialize([1, 2, 3, 4])
    # Initiator 0 (quota 2) holds 1, 2; initiator 1 (quota 2) holds 3, 4.
    assert [_drive(Allocator(ring))[3] for _ in range(4)] == [1, 2, 3, 4]
    f4 = freer(ring, 1)                     # initiator 0 frees 1: ticket 4, slot 0 ...
    f4.step()
    f4.step()
    assert f4.st == ("write_bo", 1, 4, 0)   # ... checked "consumed", delayed before writing
    assert _drive(freer(ring, 2))[2] == 5   # initiator 0 frees 2 (ticket 5, slot 1)
    assert _drive(freer(ring, 3))[2] == 6   # initiator 1 frees 3 and 4 (tickets 6, 7)
    assert _drive(freer(ring, 4))[2] == 7
    a4 = Allocator(ring)                    # initiator 0 allocates: ticket 4, waits for f4
    a4.step()
    assert a4.st == ("read", 4, 0) and not a4.enabled()
    assert _drive(Allocator(ring))[3] == 2  # initiator 1 allocates ticket 5: block 2 ...
    f8 = freer(ring, 2)                     # ... and frees it: ticket 8, slot 0 again
    f8.step()
    assert f8.st[2:] == (8, 0)
    f8.step()
    if lost:
        assert f8.st[0] == "write_bo"       # literal check: slot 0 looks consumed
        _drive(f8)
        _drive(f4)                          # f4 now overwrites block 2 with block 1
        assert ring.read_slot(0) == (4, 1)
        _drive(a4)
        # Block 2 was freed (ticket 8) but is in no slot and held by nobody: lost.
        blocks_in_ring = {b for _, b in ring.slots() if b != SLOT_EMPTY}
        assert 2 not in blocks_in_ring and a4.st[3] == 1
        assert ring.counter_fields("tail")[0] == 9
    else:
        assert f8.st[0] == "deferred" and not f8.enabled()
        _drive(f4)
        assert not f8.enabled()             # written for ticket 4, not consumed yet
        assert _drive(a4)[3] == 1
        _drive(f8)
        assert ring.read_slot(0) == (8, 2)
        # Tickets 6, 7, 8 hold 3, 4, 2; block 1 is with ticket 4's allocation: nothing lost.
        assert [_drive(Allocator(ring))[3] for _ in range(3)] == [3, 4, 2]
        assert ring.occupancy() == 0


# -- allocation, stall, BIND, reclamation -------------------------------------------------------

def test_allocate_empty_does_not_take_ticket():
    mem, ring = new_ring(1)
    ring.initialize([5])
    assert ring.allocate() == (0, 0, 5)
    head = bytes(mem[ring.head_addr:ring.head_addr + 8])
    with pytest.raises(RingEmpty):
        ring.allocate()
    assert bytes(mem[ring.head_addr:ring.head_addr + 8]) == head


def test_ring_stall_and_finish():
    mem, ring = new_ring(1)
    ring.initialize([5, 6])
    t0, o0 = ring.take_ticket()                    # direct-alloc ticket, not bound yet
    assert ring.allocate() == (1, 16, 6)
    assert ring.free(6) == ("deferred", 2, 0)      # slot 0 still holds ticket 0's block
    with pytest.raises(RingStall) as e:
        ring.allocate()                            # ticket 2 waits for the deferred free
    assert (e.value.ticket, e.value.slot_offset) == (2, 0)
    assert ring.bind_check(t0, 5) and not ring.bind_check(t0, 6) and not ring.bind_check(1, 6)
    assert ring.finish_allocation(t0, o0) == 5     # BIND consumes -> deferred free written
    assert ring.read_slot(0) == (2, 6)
    assert ring.finish_allocation(2, 0) == 6


def test_reclaim_abandoned_ticket():
    mem, ring = new_ring(2)
    ring.initialize([10, 11, 12])
    t, o = ring.take_ticket()                      # abandoned DIRECT_ALLOC ticket
    assert ring.allocate() == (1, 16, 11)
    assert ring.reclaim(t, o) == 10
    assert ring.last_free == ("written", 3, 48)    # back in the ring with a new Tail ticket
    assert ring.read_slot(0) == (0, SLOT_EMPTY)
    assert ring.occupancy() == 2
    assert [ring.allocate()[2] for _ in range(2)] == [12, 10]
    # The abandoned ticket's slot no longer verifies for a late BIND.
    assert not ring.bind_check(t, 10)


def test_direct_allocator_machine():
    mem, ring = new_ring(1)
    ring.initialize([7, 8])
    d = DirectAllocator(ring)
    assert d.step() == ("fetch_head", 0, 0)
    assert d.step() == ("read", 0, 0, 0, 7)
    assert d.step() == ("confirm", 0, 0, 0, 7)
    assert d.step() == ("consume", 0, 0, 7)        # BIND verified and consumed by the target
    assert d.st == ("done", 0, 0, 7) and ring.read_slot(0) == (0, SLOT_EMPTY)


def test_consume_twice_is_an_error():
    _, ring = new_ring(1)
    ring.initialize([7])
    ring.allocate()
    with pytest.raises(ValueError):
        ring.consume(0)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 6), st.lists(st.booleans(), min_size=1, max_size=200))
def test_single_threaded_fifo(n, script):
    """Single-threaded use: allocations return blocks in exactly the order they were freed
    (initial blocks first), checked against a deque oracle; the occupancy equals its length."""
    from collections import deque
    N = 1 << n
    F = max(1, N - 1)
    _, ring = new_ring(n, addr_le=bool(n & 1), masked=not n & 2)
    init = [0x1000 * (i + 1) for i in range(F)]
    ring.initialize(init)
    fifo = deque(init)
    for alloc in script:
        if alloc:
            if not fifo:
                with pytest.raises(RingEmpty):
                    ring.allocate()
                continue
            assert ring.allocate()[2] == fifo.popleft()
        elif ring.occupancy() < F:
            # free some block that is out (the middle one of those not in the ring)
            out = [b for b in init if b not in fifo]
            b = out[len(out) // 2]
            assert ring.free(b)[0] == "written"
            fifo.append(b)
        assert ring.occupancy() == len(fifo)

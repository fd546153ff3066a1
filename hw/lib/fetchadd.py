# Ref: draft KBTP §Free-Block Ring (Add Data / Add Mask), RFC 7306 §Masked Fetch and Add;
#      IBTA Vol. 1 §9.4.5 (unmasked Fetch and Add, the mask = 0 case).
"""Masked FetchAdd arithmetic unit.

Each set bit of ``mask`` is the most significant bit of a field; the carry out of that bit is
discarded instead of entering the next field. With ``mask = 0`` this is plain addition mod 2**w,
the InfiniBand/RoCEv2 Fetch and Add.

Why not a ripple of carry-kill cells: a hand-built ripple does not map onto the FPGA's carry
chain (ECP5 CCU2), so 64 bits of it would be the slowest path of the design. Instead the unit
uses one ordinary adder on the operands with every field MSB cleared, so no carry can cross a
field boundary, and then restores each field MSB with an XOR (the carry *into* an MSB is what the
adder left there)::

    new = ((old & ~mask) + (add & ~mask)) ^ ((old ^ add) & mask)

tests/hw/lib/test_formal_fetchadd.py proves this equal to the ripple definition for all inputs.
"""

from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

__all__ = ["MaskedFetchAdd", "masked_add_value"]


def masked_add_value(old, add, mask, width):
    """The masked sum as an Amaranth value (or plain ints): carries stop at mask bits."""
    full = (1 << width) - 1
    keep = ~mask & full if isinstance(mask, int) else ~mask
    return (((old & keep) + (add & keep)) ^ ((old ^ add) & mask))[:width] \
        if not isinstance(old, int) else (((old & keep) + (add & keep)) ^ ((old ^ add) & mask)) & full


class MaskedFetchAdd(wiring.Component):
    """Combinational masked adder.

    Ports
    -----
    old, add, mask : In(width)
        Current memory word, Add Data, Add Mask (0 for the unmasked IB variant).
    new : Out(width)
        Word to write back; the requester is returned ``old``.
    """

    def __init__(self, width=64):
        self.width = width
        super().__init__({"old": In(width), "add": In(width), "mask": In(width),
                          "new": Out(width)})

    def elaborate(self, platform):
        m = Module()
        m.d.comb += self.new.eq(masked_add_value(self.old, self.add, self.mask, self.width))
        return m

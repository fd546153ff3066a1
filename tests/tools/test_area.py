# Ref: tools/area.py; yosys synth_ecp5 / stat (the cell counts are yosys's own).
"""tools.area: the cells it reports are the ones synth_ecp5 makes of a block (a register of a
known width, an adder whose carry chain is known), the blocks are the target's own submodules
without its memory."""

from amaranth import Module, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from tools import area


class _Reg(wiring.Component):
    """``o`` = ``i`` one cycle later; ``s`` = ``a + b`` (registered)."""

    def __init__(self, width):
        self.width = width
        super().__init__({"i": In(width), "o": Out(width), "a": In(16), "b": In(16),
                          "s": Out(16)})

    def elaborate(self, platform):
        m = Module()
        m.d.sync += [self.o.eq(self.i), self.s.eq(self.a + self.b)]
        return m


def test_register_and_adder_cells():
    cells = area.synth_cells(area._rtlil_of(_Reg(37)))
    assert cells["FF"] == 37 + 16, cells
    # A 16-bit adder is a carry chain of 16 / 2 CCU2C (two bits a cell), plus the last carry.
    assert 8 <= cells["CCU2C"] <= 9, cells
    assert cells["EBR"] == 0 and cells["DPR16X4"] == 0, cells


def test_blocks_of_unit_target():
    blocks = dict(area.blocks_of("8"))
    for name in ("resp", "req", "eng", "icrc", "ethrx"):
        assert name in blocks, sorted(blocks)
    assert "ram" not in blocks

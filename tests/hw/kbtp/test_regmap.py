# Ref: hw/kbtp/regmap.py (the engine's register map, one table); hw/kbtp/engine_regs.py (the
#      decode generated from it); docs/registers.md and tools/registers/gen.py; issue 19 item 3.
"""The KBTP engine's register map is written once (hw/kbtp/regmap.py) and everything follows it:
the offsets drivers use (``reg``), the register bank's decode, docs/registers.md."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from amaranth.sim import Simulator

from hw import iface
from hw.iface import QP_INDEX_BITS, REG_KBTP, Space
from hw.kbtp import regmap
from hw.kbtp.engine import ENGINE_ID, ranges_for, reg
from hw.kbtp.engine_regs import EngineRegs
from sim.hostbus import bus_access

ROOT = Path(__file__).resolve().parents[3]
GEN = ROOT / "tools" / "registers" / "gen.py"

#: The offsets host/driver.py, sim/ and the tests were written against (before the table; QP
#: records 0x20 apart since 64 QPs, issue 22: at 0x40 they left the window from QP 56 on;
#: RANGE after them since 64 ranges: at 0x040 only 16 fitted below CMD).
OFFSETS = dict(
    ID=0x000, CTRL=0x004, TABLE_BASE=0x008, TABLE_BASE_HANDLE_LO=0x00C,
    TABLE_BASE_HANDLE_HI=0x010, TABLE_COUNT=0x014, POOL_BASE=0x018, POOL_TO_BASE_LO=0x01C,
    POOL_TO_BASE_HI=0x020, BLOCK_SIZE=0x024, RING_BASE=0x028, RING_ORDER=0x02C,
    HEAD_ADDR=0x030, TAIL_ADDR=0x034, MAX_INLINE=0x038, RANGE_LOG2=0x03C, RANGE=0xA00,
    CMD=0x080, CMD_ARG_LO=0x084, CMD_ARG_HI=0x088, CMD_RESULT_LO=0x08C,
    CMD_RESULT_HI=0x090, FREE_PUSH_LO=0x094, FREE_PUSH_HI=0x098, FREE_QUEUE=0x09C,
    FREE_REFUSED=0x0B4, STALL_CYCLES=0x0A0, LAST_LATENCY=0x0A4, LAST_CYCLES=0x0A8,
    RING_OCCUPANCY=0x0AC, HOSTQ_COUNT=0x0B0, COUNT=0x100, QP=0x200, QP_STRIDE=0x20,
    QP_SESSION=0x00, QP_HANDLE_BASE_LO=0x04, QP_HANDLE_BASE_HI=0x08,
    QP_HANDLE_COUNT=0x0C, QP_QUOTA=0x10, QP_USAGE=0x14, QP_SCRATCH=0x18,
    # DIRECT_ALLOC partition rings (issue 20 item 3), in the free words below CMD
    PART0_RING=0x040, PART0_HEAD=0x044, PART0_TAIL=0x048, PART1_RING=0x04C,
    PART1_HEAD=0x050, PART1_TAIL=0x054, PART2_RING=0x058, PART2_HEAD=0x05C,
    PART2_TAIL=0x060, PART_ORDER=0x064)


def _gen():
    # by path: tests/tool_gate.py takes the name "tools" on sys.path under pytest
    spec = importlib.util.spec_from_file_location("kbtp_registers_gen", GEN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_reg_offsets_unchanged():
    assert reg == OFFSETS
    assert regmap.ENGINE_ID == ENGINE_ID == 0x4B425445


def test_docs_generated_from_the_table():
    """docs/registers.md is exactly what tools/registers/gen.py renders."""
    p = subprocess.run([sys.executable, str(GEN), "--check"], cwd=ROOT, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr


def test_drift_is_detected(tmp_path):
    gen = _gen()
    doc = (ROOT / "docs" / "registers.md").read_text()
    assert gen.render() == doc
    bad = tmp_path / "registers.md"
    bad.write_text(doc.replace("| 0x0A4 | LAST_LATENCY |", "| 0x0A8 | LAST_LATENCY |", 1))
    assert gen.main(["--check", "--out", str(bad)]) == 1
    # every register of the table is in the document, under the name drivers use
    for name in reg:
        if not name.endswith(("_STRIDE", "_HI")) and name != "QP":
            assert f" {name.removesuffix('_LO')}" in doc, name


def test_overlapping_arrays_are_refused():
    """RANGE follows the 64 session records to the window's end: 384 ranges fit."""
    regmap.check(n_qp=16, n_ranges=16)
    regmap.check(n_qp=1 << QP_INDEX_BITS, n_ranges=(regmap.WINDOW - 0xA00) // 4)
    with pytest.raises(ValueError, match="window"):
        regmap.check(n_qp=1, n_ranges=(regmap.WINDOW - 0xA00) // 4 + 1)
    with pytest.raises(ValueError, match="RANGE"):
        regmap.check(n_qp=(1 << QP_INDEX_BITS) + 1, n_ranges=1)
    with pytest.raises(ValueError, match="window"):
        EngineRegs(n_qp=113, n_ranges=1, base=REG_KBTP)


def test_64_sessions_fit_the_window():
    """Every QP index has a session record (2**QP_INDEX_BITS) and a RANGE (the default of a
    64-QP engine, hw.kbtp.engine.ranges_for), inside the engine's window, and the window ends
    before the next block of the host bus's register space."""
    n_qp = 1 << QP_INDEX_BITS
    assert ranges_for(n_qp) == n_qp and ranges_for(4) == 16
    regmap.check(n_qp=n_qp, n_ranges=ranges_for(n_qp))
    last = reg["QP"] + reg["QP_STRIDE"] * (n_qp - 1) + reg["QP_SCRATCH"]
    assert last + 4 <= regmap.WINDOW
    blocks = sorted(v for k, v in vars(iface).items() if k.startswith("REG_") and
                    isinstance(v, int))
    assert REG_KBTP + regmap.WINDOW <= next(b for b in blocks if b > REG_KBTP)
    # the record holds its registers
    assert max(o for k, o in reg.items() if k.startswith("QP_") and k != "QP_STRIDE") + 4 <= \
        reg["QP_STRIDE"]


N_RANGES = 3


def _words(N_QP):
    """{word offset: (register, its name)} of every word of the map."""
    out = {}
    for name, r, entries in regmap.layout(n_qp=N_QP, n_ranges=N_RANGES):
        for words in entries:
            for k, off in enumerate(words):
                out[off] = (r, name, k)
    return out


@pytest.mark.parametrize("N_QP", [2, 1 << QP_INDEX_BITS])
def test_decode_follows_the_table(N_QP):
    """The register bank answers every word of the table and only those, reads back what an RW
    register was written (within its width), and resets as the table says."""
    dut = EngineRegs(N_QP, N_RANGES, REG_KBTP)
    words = _words(N_QP)
    bad, written = [], []

    async def access(ctx, off, value=None):
        # The bank answers in the cycle of the request, or bus_access raises; a read of a
        # session word but USAGE the cycle after (its registered block-RAM port).
        name = words[off][1] if off in words else ""
        late = value is None and name.startswith("QP_") and name != "QP_USAGE"
        rdata, err = await bus_access(ctx, dut.bus, Space.REG, REG_KBTP + off,
                                      value is not None, value or 0, limit=2 if late else 1)
        return err, rdata

    async def bench(ctx):
        for _ in range(70):             # the COUNT memory's clearing sweep
            await ctx.tick()
        for off in range(0, regmap.WINDOW, 4):
            err, rdata = await access(ctx, off)
            assert err == (off not in words), hex(off)
            if off in words:
                r, name, k = words[off]
                if r.reset is not None:
                    assert rdata == (r.reset >> 32 * k) & 0xFFFFFFFF, name
        for off, (r, name, k) in words.items():
            if r.access != "RW":
                continue
            value = 0xA5C3_5A3C ^ off
            await access(ctx, off, value)
            bits = min(32, r.width - 32 * k)
            # (QP_SESSION implements bits 5..0 and the domain byte 15..8)
            mask = 0xFF3F if name == "QP_SESSION" else (1 << bits) - 1
            got = (await access(ctx, off))[1]
            written.append(name)
            if got != value & mask:
                bad.append((hex(off), name, hex(got), hex(value & mask)))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert not bad
    assert set(written) == {name for name, r, _ in regmap.layout(n_qp=1, n_ranges=1)
                            if r.access == "RW"}


def test_dropped_session_read_leaves_no_wait():
    """A session word's read takes two cycles (``hwait``). A master that drops it after the first
    must not leave the bank answering the next read at once, with the row of the address the
    dropped one had: the next read, of another QP, still gets its own QP's word."""
    dut = EngineRegs(4, N_RANGES, REG_KBTP)
    entries = {name: e for name, r, e in regmap.layout(n_qp=4, n_ranges=N_RANGES)}
    off = [words[0] for words in entries["QP_HANDLE_BASE"]]   # word 0 of QP 0, 1, ...
    got = {}

    async def bench(ctx):
        for _ in range(70):             # the COUNT memory's clearing sweep
            await ctx.tick()
        for qp, value in ((0, 0x1111_0000), (1, 0x2222_0000)):
            _, err = await bus_access(ctx, dut.bus, Space.REG, REG_KBTP + off[qp], True, value)
            assert not err
        # QP 0's word: one cycle of the read, then the master lets go (no ack seen).
        ctx.set(dut.bus.space, Space.REG)
        ctx.set(dut.bus.addr, REG_KBTP + off[0])
        ctx.set(dut.bus.we, 0)
        ctx.set(dut.bus.re, 1)
        assert not ctx.get(dut.bus.ack)
        await ctx.tick()
        ctx.set(dut.bus.re, 0)
        await ctx.tick()
        got[1] = await bus_access(ctx, dut.bus, Space.REG, REG_KBTP + off[1], False, limit=2)
        got[0] = await bus_access(ctx, dut.bus, Space.REG, REG_KBTP + off[0], False, limit=2)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    assert got == {1: (0x2222_0000, 0), 0: (0x1111_0000, 0)}, {k: hex(v[0]) for k, v in got.items()}

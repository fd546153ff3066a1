# Ref: boards/litedram_gen.py (the controller and the model this times); litedram/common.py
#      (LiteDRAMNativePort: cmd/wdata/rdata streams, valid/ready); litedram/core/bankmachine.py,
#      multiplexer.py, refresher.py (what the figures come from); JEDEC JESD79-3F (DDR3
#      command encoding: REF = RAS#+CAS# low, WE# high); Micron MT41K256M16 datasheet.
"""User-port timing of the ECPIX-5 LiteDRAM controller, measured in migen simulation.

Run in the LiteDRAM venv (no amaranth)::

    /tmp/ldvenv/bin/python -m tools.litedram_timing [--mib 1] [--vcd FILE]

The device under test is what ``boards/litedram_gen.py --sim`` turns into Verilog, built
the way ``litedram.gen.LiteDRAMCore`` / ``SoC.add_sdram`` build it: ``litedram.core.LiteDRAMCore``
with the default ``ControllerSettings`` on ``SDRAMPHYModel`` with the ECP5DDRPHY's PhySettings
and MT41K256M16 timings (boards/litedram_gen.py's, tRFC in ns) at 1:2 rate and sys = 50 MHz, one native port from the crossbar. The
wrapper's ``user_enable`` gating and pads are combinational, so they add no cycles.

All figures are in sys cycles (50 MHz, 20 ns) at the native port:

* read latency: from the cycle the read command is accepted (cmd.valid & cmd.ready) to the
  cycle rdata.valid is high (rdata.ready held high), for a row hit (row open in its bank), a
  row miss (another row of the same bank open: precharge + activate first) and a closed bank;
* write acceptance: back-to-back sequential writes with wdata always valid: commands and data
  accepted per cycle over a run;
* sequential read throughput: back-to-back reads of consecutive 128-bit words, rdata.ready
  high; words per cycle from the first command to the last data;
* refresh: the interval between REF commands on the DFI (tREFI) and, in a continuous read
  stream, the longest run of cycles without read data around each REF (the port's stall).

The model's read path is ``PhySettings.read_latency`` of the ECP5DDRPHY, so the read figures
include the real PHY's pipeline as LiteDRAM accounts for it; the DRAM itself is not simulated
electrically (no read levelling, bitslip or board delays).
"""

import argparse
import functools
import importlib.util
import os
import statistics

from migen import Module, run_simulation, passive



@functools.lru_cache(maxsize=None)
def _litedram_gen():
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "boards", "litedram_gen.py")
    spec = importlib.util.spec_from_file_location("litedram_gen", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


SYS = _litedram_gen().SYS_CLK_FREQ
NS = 1e9 / SYS


class Dut(Module):
    def __init__(self, mib, board="ecpix5"):
        from litedram.core import LiteDRAMCore
        from litedram.core.controller import ControllerSettings
        from litedram.phy.model import SDRAMPHYModel
        lg = _litedram_gen()
        self.module = lg._sim_module(mib, board)(SYS, "1:2")
        settings = lg.ecp5_phy_settings(SYS)
        self.submodules.phy = SDRAMPHYModel(self.module, settings, clk_freq=SYS)
        self.submodules.core = LiteDRAMCore(self.phy, self.module.geom_settings,
                                            self.module.timing_settings, SYS,
                                            controller_settings=ControllerSettings())
        self.port = self.core.crossbar.get_port()
        self.settings = settings


class Bench:
    """One driver and one passive monitor; both count cycles from 0, so their stamps agree."""

    def __init__(self, dut):
        self.dut = dut
        self.p = dut.port
        self.t = 0
        self.trace = []     # per cycle: (cmd_fire, wdata_fire, rdata_valid, dfi commands)
        self.rdata = []     # (cycle, data)
        self.results = {}
        self.row_words = dut.module.ncols // 8              # 128-bit words per row and bank
        self.bank_words = self.row_words
        self.nbanks = dut.module.nbanks

    def addr(self, row, bank, word):
        # ROW_BANK_COL: the native address is {row, bank, column/8}.
        return (row * self.nbanks + bank) * self.row_words + word

    @passive
    def monitor(self):
        p = self.p
        phases = self.dut.phy.dfi.phases
        while True:
            cmds = []
            for ph in phases:
                if not (yield ph.cs_n):
                    ras, cas, we = (yield ph.ras_n), (yield ph.cas_n), (yield ph.we_n)
                    cmds.append({(0, 0, 1): "REF", (0, 1, 1): "ACT", (0, 1, 0): "PRE",
                                 (1, 0, 1): "RD", (1, 0, 0): "WR",
                                 (0, 0, 0): "MRS", (1, 1, 0): "ZQ"}.get((ras, cas, we), "?"))
            cmd_fire = (yield p.cmd.valid) and (yield p.cmd.ready)
            wd_fire = (yield p.wdata.valid) and (yield p.wdata.ready)
            rv = (yield p.rdata.valid) and (yield p.rdata.ready)
            if rv:
                self.rdata.append((len(self.trace), (yield p.rdata.data)))
            self.trace.append((cmd_fire, wd_fire, rv, cmds))
            yield

    def tick(self, n=1):
        for _ in range(n):
            yield
            self.t += 1

    def issue(self, addr, we):
        """Present one command, return the cycle it is accepted (the cycle after it leaves)."""
        p = self.p
        yield p.cmd.valid.eq(1)
        yield p.cmd.we.eq(we)
        yield p.cmd.addr.eq(addr)
        yield from self.tick()
        while not (yield p.cmd.ready):
            yield from self.tick()
        accepted = self.t
        yield p.cmd.valid.eq(0)
        yield from self.tick()
        return accepted

    def read_one(self, addr):
        n = len(self.rdata)
        accepted = yield from self.issue(addr, 0)
        while len(self.rdata) == n:
            yield from self.tick()
        cyc, data = self.rdata[n]
        assert data == self.data_of(addr) or addr >= 4 * self.row_words
        return accepted, cyc - accepted

    def data_of(self, addr):
        return (addr * 0x9E3779B97F4A7C15 ^ 0x0123456789ABCDEF) & (2**128 - 1)

    def stream(self, addrs, we):
        """Back-to-back commands; for writes wdata is always valid with data_of(address)."""
        p = self.p
        first = None
        i = 0
        wi = 0
        n0 = len(self.rdata)
        yield p.rdata.ready.eq(1)
        if we:
            yield p.wdata.valid.eq(1)
            yield p.wdata.we.eq(2**16 - 1)
            yield p.wdata.data.eq(self.data_of(addrs[0]))
        yield p.cmd.valid.eq(1)
        yield p.cmd.we.eq(we)
        yield p.cmd.addr.eq(addrs[0])
        while True:
            yield from self.tick()
            if i < len(addrs) and (yield p.cmd.ready):
                if first is None:
                    first = self.t
                i += 1
                if i < len(addrs):
                    yield p.cmd.addr.eq(addrs[i])
                else:
                    yield p.cmd.valid.eq(0)
            if we and (yield p.wdata.ready):
                wi += 1
                if wi < len(addrs):
                    yield p.wdata.data.eq(self.data_of(addrs[wi]))
                else:
                    yield p.wdata.valid.eq(0)
            done = (wi == len(addrs)) if we else (len(self.rdata) - n0 == len(addrs))
            if i == len(addrs) and done:
                break
        return first, self.t

    def run(self):
        p = self.p
        r = self.results
        yield p.rdata.ready.eq(1)
        yield from self.tick(40)

        # Sequential writes: 4 rows' worth (two banks of rows 0 and 1).
        addrs = list(range(4 * self.row_words))
        first, last = yield from self.stream(addrs, 1)
        r["write_seq"] = (len(addrs), last - first + 1)
        r["write_seq_span"] = (first, last)
        yield from self.tick(40)

        # Sequential reads of the same words, data checked.
        n0 = len(self.rdata)
        first, last = yield from self.stream(addrs, 0)
        got = [d for _, d in self.rdata[n0:]]
        r["read_seq"] = (len(addrs), last - first + 1)
        r["read_seq_span"] = (first, last)
        r["read_seq_ok"] = got == [self.data_of(a) for a in addrs]
        yield from self.tick(40)

        # Single reads: (accept cycle, latency). Bank 1: row 1 opened first, then a hit in it,
        # then another row of the same bank (miss); banks 4..7 are never opened before.
        hit, miss, closed = [], [], []
        for k in range(6):
            yield from self.tick(40 + 7 * k)          # vary the phase against the refresh timer
            yield from self.read_one(self.addr(1, 1, 5))                     # open row 1
            yield from self.tick(20)
            hit.append((yield from self.read_one(self.addr(1, 1, 3 + k))))   # row hit
            yield from self.tick(20)
            miss.append((yield from self.read_one(self.addr(5 + k, 1, 0))))  # row miss
            yield from self.tick(20)
            if k < 4:
                closed.append((yield from self.read_one(self.addr(2, 4 + k, 0))))
            yield from self.tick(20)
        r["hit"], r["miss"], r["closed"] = hit, miss, closed

        # Continuous reads over > 3 refresh intervals.
        n_ref = 3.5
        words = int(n_ref * self.dut.module.timing_settings.tREFI / 2) + 64
        span = 1 << len(p.cmd.addr)
        r["refresh_run_start"] = self.t
        first, last = yield from self.stream([(4096 + i) % span for i in range(words)], 0)
        r["refresh_run"] = (first, last)


def analyse(b):
    r = b.results
    ts = b.dut.module.timing_settings
    out = []

    def fig(name, cyc, extra=""):
        out.append(f"{name:44} {cyc:>10} cycles  {cyc_ns(cyc):>12}{extra}")

    def cyc_ns(c):
        if isinstance(c, (int, float)):
            return f"{c * NS:.1f} ns"
        return ""

    st = b.dut.settings
    out.append(f"PHY settings (ECP5DDRPHY at {SYS / 1e6:g} MHz): nphases={st.nphases} cl={st.cl} "
               f"cwl={st.cwl} read_latency={st.read_latency} write_latency={st.write_latency}")
    out.append("controller timings (sys cycles): " + ", ".join(
        f"{k}={getattr(ts, k)}" for k in ("tRP", "tRCD", "tWR", "tWTR", "tREFI", "tRFC",
                                          "tFAW", "tCCD", "tRRD", "tRC", "tRAS", "tZQCS")))
    out.append(f"native port: {b.p.data_width} data bits, {len(b.p.cmd.addr)} address bits "
               f"(one 128-bit word = one BL8 burst of the x16 part)")

    refs = [t for t, (_, _, _, cmds) in enumerate(b.trace) if "REF" in cmds]

    def single(name, key):
        # A read whose command or data overlapped a refresh (REF within tRFC + 20 before its
        # acceptance up to its data) is reported apart.
        clean, hit_ref = [], []
        for acc, lat in r[key]:
            near = any(acc - ts.tRFC - 20 <= ref <= acc + lat for ref in refs)
            (hit_ref if near else clean).append(lat)
        fig(name + " (median)", statistics.median(clean),
            f"  (clean {clean}; overlapping a refresh {hit_ref})")

    single("read latency, row hit", "hit")
    single("read latency, row miss same bank", "miss")
    single("read latency, bank closed", "closed")
    n, c = r["write_seq"]
    out.append(f"{'sequential writes':44} {n} words in {c} cycles = {n / c:.3f} words/cycle "
               f"= {n / c * 16 * SYS / 1e6:.0f} MB/s")
    n, c = r["read_seq"]
    out.append(f"{'sequential reads (first cmd..last data)':44} {n} words in {c} cycles = "
               f"{n / c:.3f} words/cycle = {n / c * 16 * SYS / 1e6:.0f} MB/s; data "
               f"{'ok' if r['read_seq_ok'] else 'MISMATCH'}")

    # Streams with the refresh windows taken out: cycles from 20 before a REF to tRFC + 40
    # after it are not counted (nor are their words), so what is left is the row/bank pattern.
    def ex_refresh(first, last, col):
        keep = [t for t in range(first, last + 1)
                if not any(ref - 20 <= t <= ref + ts.tRFC + 40 for ref in refs)]
        words = sum(1 for t in keep if b.trace[t][col])
        return words, len(keep)

    def hist(first, last, col):
        fires = [t for t in range(first, last + 1) if b.trace[t][col]]
        h = {}
        for a, c in zip(fires, fires[1:]):
            h[c - a] = h.get(c - a, 0) + 1
        return dict(sorted(h.items()))

    for name, key, col in (("writes", "write_seq_span", 1), ("reads", "read_seq_span", 2)):
        first, last = r[key]
        w, c = ex_refresh(first, last, col)
        out.append(f"{'sequential ' + name + ', refresh windows left out':44} {w} words in {c} "
                   f"cycles = {w / c:.3f} words/cycle")
        out.append(f"{'  cycles between ' + ('wdata' if col == 1 else 'rdata') + ' beats':44} "
                   f"{{gap: count}} {hist(first, last, col)}")
        out.append(f"{'  cycles between accepted commands':44} {{gap: count}} "
                   f"{hist(first, last, 0)}")
    iv = [b2 - a for a, b2 in zip(refs, refs[1:])]
    out.append(f"{'REF commands at cycles':44} {refs}")
    if iv:
        fig("refresh interval (measured, median)", statistics.median(iv), f"  (tREFI={ts.tREFI})")
    first, last = r["refresh_run"]
    valid = [t for t in range(first, last + 1) if b.trace[t][2]]
    gaps = [(a, b2 - a - 1) for a, b2 in zip(valid, valid[1:])]
    normal = statistics.mode(g for _, g in gaps)
    stalls = []
    for ref in refs:
        if first < ref < last:
            near = [g for a, g in gaps if ref - 40 <= a <= ref + 10]
            if near:
                stalls.append(max(near))
    cmd_gaps = []
    fires = [t for t in range(first, last + 1) if b.trace[t][0]]
    cg = [(a, b2 - a) for a, b2 in zip(fires, fires[1:])]
    for ref in refs:
        if first < ref < last:
            near = [g for a, g in cg if ref - 40 <= a <= ref + 10]
            if near:
                cmd_gaps.append(max(near))
    n = len(valid)
    out.append(f"{'read stream over refreshes':44} {n} words in {last - first + 1} cycles = "
               f"{n / (last - first + 1):.3f} words/cycle (normal gap between data: {normal})")
    if stalls:
        fig("rdata gap around each REF (max)", max(stalls), f"  (per REF: {stalls})")
        fig("cmd accept gap around each REF (max)", max(cmd_gaps), f"  (per REF: {cmd_gaps})")
    out.append(f"tRFC = {ts.tRFC} cycles; ZQCS (tZQCS={ts.tZQCS}) once a second, not simulated")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m tools.litedram_timing", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mib", type=int, default=1, help="model storage in MiB")
    ap.add_argument("--vcd", help="write a VCD of the run")
    ap.add_argument("--board", default="ecpix5",
                    help="the board's DDR3 module (boards/litedram_gen.py BOARDS: ecpix5, versa)")
    a = ap.parse_args(argv)
    dut = Dut(a.mib, a.board)
    b = Bench(dut)
    run_simulation(dut, [b.run(), b.monitor()], vcd_name=a.vcd)
    for line in analyse(b):
        print(line)


if __name__ == "__main__":
    main()

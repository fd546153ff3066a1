# Ref: issue 22 item 2 (the shipped configuration simulated with what DRAM costs: refresh, bank
#      conflicts, read latency); hw/iface.py MemBusSignature (split transactions, in-order
#      responses, a write visible to every request accepted after it); Micron MT41K256M16 data
#      sheet (4 Gb DDR3 x16: 8 banks, 32K rows of 1K columns = 2 KiB pages; tREFI 7.8 us,
#      tRFC 260 ns, tRP = tRCD = 13.75 ns at -125); LiteDRAM (litedram.core.crossbar native
#      port, ROW_BANK_COL address mapping; litedram.phy.ECP5DDRPHY, 1:2 rate).
"""A cycle timing model of DDR3 behind the target's memory bus, for simulation.

The ECPIX-5 carries 512 MB of DDR3 (MT41K256M16). On the board the target's memory bus will
reach it through a LiteDRAM controller in its own clock and an asynchronous FIFO each way
(issue 22). :class:`DramModel` stands where that bridge and controller will stand, in the core
clock, with the costs a master sees on the bus:

- **read latency**: a read of an open row answers ``hit`` core cycles after it is accepted
  (crossing into the controller's clock, the controller's pipeline and CAS latency, crossing
  back);
- **bank conflicts**: a request to a bank whose open row is another one (or none: after reset
  and after every refresh) first closes and opens a row: the port takes no request for ``miss``
  more cycles and the request's answer comes ``miss`` cycles later;
- **refresh**: every ``refi`` core cycles the port takes no request for ``rfc`` cycles, and
  every bank is closed afterwards;
- **command rate**: the controller moves one DDR3 burst (a 16-octet native word, of which a
  bus word is half) per ``read_ctrl`` controller cycles for a read and ``write_ctrl`` for a
  write; a request takes the port for that long, so at a core clock above ``ctrl_hz /
  read_ctrl`` the port takes fewer than one request a core cycle: at the ECPIX-5's 41.67 MHz,
  3 reads in 5 cycles. (Until 2026-12-07 the model took a request every cycle at any clock,
  LiteDRAM's rate at the 25 MHz core clock it was made for. At 41.67 MHz
  tests/boards/test_litedram.py streamed 256 reads through the real controller in 467 core
  cycles and 256 writes in 532; the model took 323 and 279.)

Reads answer in order, at most one per cycle. Addresses map as LiteDRAM's ROW_BANK_COL does on
this module with its 16-octet native port: octets 0-3 of the byte address within the native
word, column bits 4-10 (a 2 KiB page), bank bits 11-13, row bits 14 and up.

Simplifications, on the side of the pessimist where they are not exact: one command at a time
(a miss holds the port even when the next request is to another bank; LiteDRAM's bank machines
would overlap it); responses already scheduled are not delayed by a refresh that starts after
them. The data: one block-RAM-like array of ``depth`` words (a simulation holds it in host
memory), read and written when the request is accepted, so the bus's order rule holds by
construction whatever the timing. At DDR3 size (``external_storage``) the array is the Verilog
module of ``boards/dram_storage.v`` (:data:`STORAGE_VERILOG`), which the Verilator build of
:mod:`sim.vltarget` compiles beside the design: an Amaranth ``Memory`` of 64 M words would put
an initialiser of every word into the exported text.

Why our own model and not LiteDRAM's ``SDRAMPHYModel`` behind the real controller: that needs
the controller generated as Verilog by migen/LiteX into every simulation of the shipped core;
this model keeps the simulation in one Amaranth design while the board side is built. Its
figures come from :data:`ECPIX5_DDR3`: the controller's own latencies and refresh, measured on
LiteDRAM's simulation (tools/litedram_timing.py), in the controller's clock. They are checked
against the real thing: tests/boards/test_litedram.py puts the bridge of boards/litedram_bridge.py in
front of LiteDRAM's controller on its PHY model, with the board's two clocks, and the median
read latencies it measures there (open row, row miss) must be this model's ``hit`` and
``hit + miss`` at the core clock (boards/cores.py CORE_FREQ).
"""

import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace

from amaranth import Cat, ClockSignal, Instance, Module, Mux, Signal
from amaranth.lib import fifo, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In

from hw.iface import MEM_DATA_BITS, MemBusSignature

__all__ = ["DramTiming", "DramCycles", "ECPIX5_DDR3", "DramModel", "dram_address",
           "STORAGE_VERILOG"]

#: The data array of :class:`DramModel` with ``external_storage`` (module kbtp_dram_storage).
STORAGE_VERILOG = Path(__file__).resolve().parent / "dram_storage.v"

#: Octets of a native-port word, of a page (one row of one bank), and banks (MT41K256M16 x16
#: with LiteDRAM's 16-octet native port).
NATIVE_OCTETS = 16
PAGE_OCTETS = 2048
N_BANKS = 8


def dram_address(addr):
    """(bank, row) of byte address ``addr`` (ROW_BANK_COL on MT41K256M16)."""
    page = addr // PAGE_OCTETS
    return page % N_BANKS, page // N_BANKS


@dataclass(frozen=True)
class DramCycles:
    """The model's figures in core cycles (see the module docstring). The command rate in
    integer units: a core cycle is ``tick`` units, a read takes the port for ``read_cost``
    units and a write for ``write_cost``; the port takes a request while it owes less than a
    cycle. The defaults (1, 1, 1) take one request a cycle."""
    hit: int
    miss: int
    refi: int
    rfc: int
    tick: int = 1
    read_cost: int = 1
    write_cost: int = 1

    def __post_init__(self):
        if self.hit < 3 or self.miss < 0 or self.rfc < 1 or self.refi <= self.rfc:
            raise ValueError(f"impossible DRAM timing {self}")
        if min(self.tick, self.read_cost, self.write_cost) < 1:
            raise ValueError(f"impossible DRAM command rate {self}")

    def per_request(self, we):
        """Core cycles a request takes the port for when streaming (at least 1)."""
        return max(1.0, (self.write_cost if we else self.read_cost) / self.tick)


@dataclass(frozen=True)
class DramTiming:
    """A DRAM controller's costs, in its own clock, and the crossing to and from the core.

    Attributes
    ----------
    name : str
    ctrl_hz : float             the controller's clock (LiteDRAM's ``sys``)
    hit_ctrl : int              native command accepted -> read data, row open (controller cycles)
    miss_ctrl : int             extra cycles when the row must be opened (precharge + activate)
    refi_ctrl : int             cycles from one refresh to the next
    rfc_ctrl : int              cycles the port takes no command for one refresh
    cdc_core : int              core cycles of the two clock crossings (request + response)
    size_bytes : int            capacity (the target memory of a core with this DRAM)
    cdc_ctrl : int              controller cycles of the crossings (each crossing's
                                synchroniser runs in the clock it enters)
    read_ctrl, write_ctrl : Fraction
                                controller cycles a read / a write takes the port for when
                                streaming (one native-port burst each); the defaults are
                                LiteDRAM's behind boards/litedram_bridge.py, measured by
                                tests/boards/test_litedram.py (see ECPIX5_DDR3)
    """
    name: str
    ctrl_hz: float
    hit_ctrl: int
    miss_ctrl: int
    refi_ctrl: int
    rfc_ctrl: int
    cdc_core: int
    size_bytes: int
    cdc_ctrl: int = 0
    read_ctrl: Fraction = Fraction(2)
    write_ctrl: Fraction = Fraction(9, 4)

    def cycles(self, core_hz):
        """The figures in core cycles at ``core_hz``: latencies and the refresh stall to the
        nearest cycle (a half up), the refresh interval down. Nearest, not up: at 31.25 MHz a
        row miss's 5 controller cycles are 3.125 core cycles, and LiteDRAM behind the bridge
        (tests/boards/test_litedram.py) takes 3 more than a hit, as at 25 MHz it takes 3 for 2.5."""
        ratio = core_hz / self.ctrl_hz            # core cycles per controller cycle

        def near(n):
            return max(0, math.floor(n * ratio + 0.5 + 1e-9))
        # The command rate exactly: a core cycle is `per_core` controller cycles (a ratio
        # of small integers: 6/5 at 41.67 MHz), in units that make every figure whole.
        per_core = Fraction(self.ctrl_hz / core_hz).limit_denominator(1000)
        rd, wr = Fraction(self.read_ctrl), Fraction(self.write_ctrl)
        unit = math.lcm(per_core.denominator, rd.denominator, wr.denominator)
        return DramCycles(hit=self.cdc_core + near(self.hit_ctrl + self.cdc_ctrl),
                          miss=near(self.miss_ctrl),
                          refi=int(self.refi_ctrl * ratio + 1e-9),
                          rfc=max(1, near(self.rfc_ctrl)),
                          tick=int(per_core * unit), read_cost=int(rd * unit),
                          write_cost=int(wr * unit))


#: The ECPIX-5's DDR3 behind LiteDRAM as boards/litedram_gen.py builds it: LiteDRAMCore 2024.12
#: (migen 0.10.0) with ECP5DDRPHY (1:2) at sys 50 MHz, DDR clock 100 MHz, MT41K256M16 with
#: tRFC 260 ns. Measured by tools/litedram_timing.py (``make litedram-timing``) on LiteDRAM's
#: SDRAMPHYModel with the ECP5 PHY's settings (CL 6, CWL 5, read latency 13), native port, in
#: 50 MHz cycles: a read 16 from command to data on a row hit, 21 on a miss or a closed bank;
#: one burst per 2 cycles streaming; a refresh every 391 (7.82 us) that stops read data for
#: 23-24 cycles (tRFC 14 plus the precharge-all and the pipeline). cdc_core, cdc_ctrl: an
#: asynchronous FIFO each way, 3 core cycles and 2 controller cycles in all;
#: tests/boards/test_litedram.py measures hit + cdc through the real bridge and LiteDRAM's
#: controller and holds this model to it: median 12 core cycles (a miss 15) at 25 MHz, 14 (17)
#: at 31.25 MHz, 18 (22) at 41.67 MHz. (Until 2026-12-06 the crossings were 4 core cycles,
#: which fit 25 and 31.25 MHz but gave 17 at 41.67.)
#: A read takes the port for 2 controller cycles (one BL8 burst of the 1:2 PHY), a write for
#: 9/4: what tests/boards/test_litedram.py measures through the bridge and the controller (256
#: reads streamed in 467 core cycles at 41.67 MHz, 256 writes and one read in 532); it holds
#: this model to those within one refresh (the model: 470 and 524).
ECPIX5_DDR3 = DramTiming(name="ecpix5-ddr3", ctrl_hz=50e6, hit_ctrl=16, miss_ctrl=5,
                         refi_ctrl=391, rfc_ctrl=24, cdc_core=3, cdc_ctrl=2,
                         size_bytes=512 << 20)


class DramModel(wiring.Component):
    """Word memory of ``depth`` 8-octet words behind :class:`~hw.iface.MemBusSignature`, with
    the DRAM timing ``cycles`` (:class:`DramCycles`, core cycles).

    Parameters
    ----------
    depth : int
        Words; addresses at or above ``8 * depth`` wrap.
    cycles : DramCycles
    credits : int
        Reads accepted and not yet handed out (the response queue's depth); at least ``hit``
        for a master reading back to back to get one word per cycle.
    external_storage : bool
        The data array is ``boards/dram_storage.v`` (Verilator only) instead of a ``Memory``.

    Ports
    -----
    bus : In(MemBusSignature)

    Counters (for tests and benches): ``n_miss`` rows opened, ``n_refresh`` refreshes.
    """

    def __init__(self, depth, cycles, *, credits=16, external_storage=False):
        if depth < 2 or depth & (depth - 1):
            raise ValueError(f"depth {depth} is not a power of two >= 2")
        self.depth, self.timing, self.credits = depth, cycles, credits
        self.external_storage = external_storage
        super().__init__({"bus": In(MemBusSignature())})
        self.mem = None if external_storage else Memory(shape=MEM_DATA_BITS, depth=depth,
                                                        init=[])
        self.n_miss = Signal(32)
        self.n_refresh = Signal(32)

    def elaborate(self, platform):
        m = Module()
        t = self.timing
        req, rsp = self.bus.req, self.bus.rsp
        abits = (self.depth - 1).bit_length()
        if self.external_storage:
            wr = SimpleNamespace(addr=Signal(abits), data=Signal(MEM_DATA_BITS), en=Signal(8))
            rd = SimpleNamespace(addr=Signal(abits), data=Signal(MEM_DATA_BITS), en=Signal())
            m.submodules.mem = Instance("kbtp_dram_storage", p_ABITS=abits,
                                        i_clk=ClockSignal(), i_addr=rd.addr, i_re=rd.en,
                                        i_we=wr.en, i_wdata=wr.data, o_rdata=rd.data)
            # One address for both: a cycle has a read or a write, never both.
            m.d.comb += rd.addr.eq(wr.addr)
        else:
            m.submodules.mem = mem = self.mem
            wr = mem.write_port(granularity=8)
            rd = mem.read_port()

        # A free-running cycle count; answers carry the cycle they are due in. 48 bits: wraps
        # after 130 days of simulated time at 25 MHz.
        now = Signal(48)
        m.d.sync += now.eq(now + 1)

        # ---- the port's state: busy after a miss, refresh ------------------------------------
        busy = Signal(range(t.miss + 2))          # cycles the port still takes no request
        to_refresh = Signal(range(t.refi), init=t.refi - 1)     # a refresh every `refi` cycles
        refreshing = Signal(range(t.rfc + 1))
        reserved = Signal(range(self.credits + 1))
        # The command rate: what the port still owes of the controller's time, in units of
        # t.tick per core cycle; it takes a request while it owes less than a cycle.
        owed = Signal(range(max(t.read_cost, t.write_cost) + t.tick + 1))
        m.d.comb += req.ready.eq((busy == 0) & (refreshing == 0) & (reserved != self.credits) &
                                 (owed < t.tick))
        accept = req.valid & req.ready
        owes = Signal.like(owed)
        m.d.comb += owes.eq(owed + Mux(accept, Mux(req.payload.we, t.write_cost, t.read_cost),
                                       0))
        m.d.sync += owed.eq(Mux(owes > t.tick, owes - t.tick, 0))

        # ---- open rows ------------------------------------------------------------------------
        bank = req.payload.addr[11:14]
        row = req.payload.addr[14:]
        open_row = [Signal(len(row), name=f"open_row{b}") for b in range(N_BANKS)]
        is_open = [Signal(name=f"is_open{b}") for b in range(N_BANKS)]
        miss = Signal()
        for b in range(N_BANKS):
            with m.If(bank == b):
                m.d.comb += miss.eq(~is_open[b] | (open_row[b] != row))

        with m.If(to_refresh == 0):
            # A refresh is due: this cycle's request is still taken; none for `rfc` cycles from
            # the next one on.
            m.d.sync += [to_refresh.eq(t.refi - 1), refreshing.eq(t.rfc),
                         self.n_refresh.eq(self.n_refresh + 1)]
        with m.Else():
            m.d.sync += to_refresh.eq(to_refresh - 1)
        with m.If(refreshing != 0):
            m.d.sync += refreshing.eq(refreshing - 1)
            with m.If(refreshing == 1):
                m.d.sync += [o.eq(0) for o in is_open]       # every bank closed afterwards

        with m.If(busy != 0):
            m.d.sync += busy.eq(busy - 1)
        with m.If(accept & miss):
            m.d.sync += [busy.eq(t.miss), self.n_miss.eq(self.n_miss + 1)]
            for b in range(N_BANKS):
                with m.If(bank == b):
                    m.d.sync += [open_row[b].eq(row), is_open[b].eq(1)]

        # ---- data: read and written at acceptance --------------------------------------------
        m.d.comb += [wr.addr.eq(req.payload.addr[3:3 + abits]), wr.data.eq(req.payload.wdata),
                     rd.en.eq(accept & ~req.payload.we)]
        if not self.external_storage:
            m.d.comb += rd.addr.eq(req.payload.addr[3:3 + abits])
        with m.If(accept & req.payload.we):
            m.d.comb += wr.en.eq(req.payload.wstrb)

        # ---- answers: in order, each held until its cycle ------------------------------------
        # due = acceptance cycle + hit (+ miss); accepted requests are at least 1 + miss apart,
        # so the due cycles of successive reads rise by at least one.
        s1_read = Signal()
        s1_due = Signal(len(now))
        m.d.sync += [s1_read.eq(accept & ~req.payload.we),
                     s1_due.eq(now + t.hit + (miss * t.miss))]
        m.submodules.q = q = fifo.SyncFIFOBuffered(width=MEM_DATA_BITS + len(now),
                                                   depth=self.credits)
        m.d.comb += [q.w_data.eq(Cat(rd.data, s1_due)), q.w_en.eq(s1_read)]
        head_due = q.r_data[MEM_DATA_BITS:]
        # The FIFO's output lags the request by three cycles; `hit` >= 3 keeps answers on time.
        m.d.comb += [rsp.valid.eq(q.r_rdy & (head_due <= now)),
                     rsp.payload.rdata.eq(q.r_data[:MEM_DATA_BITS]),
                     q.r_en.eq(rsp.valid & rsp.ready)]
        pop = rsp.valid & rsp.ready
        m.d.sync += reserved.eq(reserved + (accept & ~req.payload.we) - pop)
        return m


#: The Lattice ECP5 Versa's DDR3L (one MT41K64M16, 1Gb x16: 8 banks x 8192 rows of 1024
#: columns, the same 2 KiB pages and ROW_BANK_COL mapping as above) behind the same LiteDRAM
#: core (``boards/litedram_gen.py --board versa``: ECP5DDRPHY 1:2, sys 50 MHz, DDR clock 100 MHz,
#: 128-bit native port), so the same PHY latencies (CL 6, CWL 5, read latency 13). The 1Gb die's
#: tRFC is 110 ns (Micron; 6 cycles at 50 MHz with LiteDRAM's margin, 14 for the ECPIX-5's 4Gb
#: part). Measured by ``python -m tools.litedram_timing --board versa`` (2026-12-04), in 50 MHz
#: cycles: a read 16 on a row hit, 21 on a miss or a closed bank; a refresh every 391 that stops
#: read data for 15-16 cycles (24 on the ECPIX-5). The command rate is the ECPIX-5's (the same
#: controller, PHY and bridge; not measured on this part).
VERSA_DDR3 = DramTiming(name="versa-ddr3", ctrl_hz=50e6, hit_ctrl=16, miss_ctrl=5,
                        refi_ctrl=391, rfc_ctrl=16, cdc_core=4, size_bytes=128 << 20)
__all__ += ["VERSA_DDR3"]

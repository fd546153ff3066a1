# Ref: docs/roce-layouts.md §6.7 (local ACK timeout 4.096 us * 2**timeout, RNR NAK timer);
#      IBTA Vol. 1 §9.7.5.2.8 (RNR timer table).
"""The requester's retry timers: a deadline per QP in a memory (ACK timeout, RNR wait).

The control FSM only starts a timer (``start_ack``: the local ACK timeout of the QP's
``timeout`` code; ``start_rnr``: the RNR NAK's timer code, which wins when both are asked for
in one cycle) and sees it expire through the scheduler (:class:`~hw.rdma.req_sq.SqScheduler`).
Whether a timer is running at all is the QP record's ``timer_on`` bit, not this block's.

Design
------
One free-running counter ``now`` of :func:`timer_bits` bits. A start of QP ``i`` at cycle k is
registered; at cycle k+1 it writes the deadline, ``now + cycles`` of cycle k, into row ``i`` of a
memory (one row per QP) and clears the flip-flop ``expired[i]`` (``cycles == 0``, ACK code 0,
sets it instead). ``zero[i]`` is ``expired[i]``, except at k+1, where it is already what the
start makes it: the FSM sees the start from cycle k+1. A sweep reads one row per cycle, QP 0,
1, ..., n_qp-1, 0, ...; the row read at cycle t arrives at t+1, where ``now - deadline`` >= 0
(the sign bit of the difference, modulo 2**width) sets ``zero[i]`` for cycle t+2. ``zero[i]``
then stays set until QP i's next start.

Timing against the old down-counters (a counter loaded with ``cycles`` at cycle k read 0 from
cycle k+1+cycles on): ``zero[i]`` is never early (the compare at cycle t >= k+cycles is the
first that can set it) and at most n_qp-1 cycles late: every row is compared once every n_qp
cycles (n_qp late for a timer of one cycle, whose first compare the write of its deadline
suppresses); tests/hw/rdma/test_req_timers.py holds it to n_qp+1. ``zero`` is all 1 at reset, as
the counters were 0 at reset.

A restart of QP i while the sweep is on i must not let the old deadline set ``zero[i]``: the
read port is transparent to the write port (a deadline written and the sweep's read of the
same row in one cycle return the new deadline), and the registered start wins over the compare
of the row read the cycle before (which holds the old deadline).

Width
-----
``timer_bits = bit_length(longest + n_qp + 1) + 1``, ``longest`` the largest value of
:func:`ack_timeout_cycles` and :func:`rnr_timer_cycles` over codes 0..31 at the given clock and
``timer_scale``: ``now - deadline`` goes from ``-longest`` (just started) to ``n_qp - 1`` (the
sweep's lateness) before ``zero`` sticks, a range the sign of a difference this wide tells
apart. 39 bits at 25 MHz with 4 or 64 QPs (ACK code 31: 4.096 us * 2**31 * 25 MHz =
2**38 * 0.8 cycles), 42 at 125 MHz. The down-counters were a fixed 40 bits, which at 125 MHz
could not hold ACK code 31 (4.096 us * 2**31 * 125 MHz = 2**40 cycles: it loaded 0, a timeout
at once).

Why a memory: the counters were 40 flip-flops and a decrementer per QP; at 64 QPs they took
3,909 LUT4, 1,280 CCU2C and 2,560 flip-flops of the ECP5 (synth_ecp5 of this block alone),
which does not fit beside the rest. The deadlines take LUT RAM, three adders (``now + 1``,
``now + cycles``, ``now - deadline``) and one flip-flop per QP: 541 LUT4, 63 CCU2C, 121
flip-flops and 40 TRELLIS_DPR16X4 at 64 QPs, 25 MHz.
"""

from amaranth import Module, Mux, Signal
from amaranth.lib import memory, wiring
from amaranth.lib.wiring import In, Out

from hw.rdma.req_sq import qp_bits

__all__ = ["RNR_TIMER_MS", "ack_timeout_cycles", "rnr_timer_cycles", "timer_bits",
           "timer_port", "RetryTimers"]

#: IBTA RNR NAK timer field (AETH syndrome bits 4:0) -> minimum delay in milliseconds.
RNR_TIMER_MS = [655.36, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12, 0.16, 0.24, 0.32, 0.48, 0.64,
                0.96, 1.28, 1.92, 2.56, 3.84, 5.12, 7.68, 10.24, 15.36, 20.48, 30.72, 40.96,
                61.44, 81.92, 122.88, 163.84, 245.76, 327.68, 491.52]


def ack_timeout_cycles(code, clk_hz, timer_scale=1):
    """Clock cycles of the local ACK timeout 4.096 us * 2**code (code 0 = no timeout: 0)."""
    if code == 0:
        return 0
    return max(1, round(4.096e-6 * 2 ** code * clk_hz / timer_scale))


def rnr_timer_cycles(code, clk_hz, timer_scale=1):
    """Clock cycles of the RNR NAK timer code (IBTA table)."""
    return max(1, round(RNR_TIMER_MS[code] * 1e-3 * clk_hz / timer_scale))


def timer_bits(n_qp, clk_hz, timer_scale=1):
    """Width of ``now`` and of a deadline (see the module docstring, Width)."""
    longest = max(f(code, clk_hz, timer_scale)
                  for f in (ack_timeout_cycles, rnr_timer_cycles) for code in range(32))
    return (longest + n_qp + 1).bit_length() + 1


def timer_port(n_qp):
    """The control FSM's port on :class:`RetryTimers`, seen from the FSM (Out: driven by it)."""
    return wiring.Signature({
        "index": Out(qp_bits(n_qp)),
        "ack_code": Out(5),                 # the QP's timeout code (QpConfig.timeout)
        "start_ack": Out(1),                # start timer `index` with the ACK timeout
        "start_rnr": Out(1),                # start timer `index` with the RNR timer
        "rnr_code": Out(5),                 # AETH syndrome bits 4:0 of the RNR NAK
    })


class RetryTimers(wiring.Component):
    """``n_qp`` retry timers; ``zero[i]``: timer i expired (see the module docstring).

    Parameters
    ----------
    n_qp : int
        number of QPs (memory rows; the sweep visits each once every n_qp cycles).
    clk_hz : float
        clock frequency.
    timer_scale : int
        divides every timer (simulation: make 4.096 us * 2**timeout a few hundred cycles).

    Ports
    -----
    ctl : In(:func:`timer_port`)
    zero : Out(n_qp)
        sticky from the sweep's first compare at or after the deadline to the QP's next start.
    """

    def __init__(self, n_qp, clk_hz, timer_scale=1):
        self._n_qp, self._clk_hz, self._scale = n_qp, clk_hz, timer_scale
        self.width = timer_bits(n_qp, clk_hz, timer_scale)
        super().__init__({"ctl": In(timer_port(n_qp)), "zero": Out(n_qp)})

    def _table(self, m, code, cycles, name):
        out = Signal(self.width, name=name)
        with m.Switch(code):
            for c in range(32):
                with m.Case(c):
                    m.d.comb += out.eq(cycles(c, self._clk_hz, self._scale))
        return out

    def elaborate(self, platform):
        m = Module()
        nq, w, c = self._n_qp, self.width, self.ctl
        ack_cyc = self._table(m, c.ack_code, ack_timeout_cycles, "ack_cyc")
        rnr_cyc = self._table(m, c.rnr_code, rnr_timer_cycles, "rnr_cyc")
        value = Signal(w)
        start = Signal()
        m.d.comb += [value.eq(Mux(c.start_rnr, rnr_cyc, ack_cyc)),
                     start.eq(c.start_ack | c.start_rnr)]

        now = Signal(w)
        m.d.sync += now.eq(now + 1)

        # A start acts a cycle later, from registers (``pend*``): the control FSM's decision,
        # the code tables, the adder ``now + value`` and the decoder of the QP index were one
        # path into the memory's write data and the ``expired`` flip-flops, among the core
        # clock's deepest on the ECPIX-5 (tools/depth.py). ``zero`` shows the pending start's
        # QP as the start left it, so the FSM sees the same as before from cycle k+1; the
        # deadline is the same, ``now + value`` of the start's cycle (``then``).
        pend, pend_index, pend_value, pend_zero = (Signal(), Signal.like(c.index), Signal(w),
                                                   Signal())
        then = Signal(w)
        m.d.sync += [pend.eq(start), pend_index.eq(c.index), pend_value.eq(value),
                     pend_zero.eq(value == 0), then.eq(now)]
        m.submodules.deadlines = mem = memory.Memory(shape=w, depth=nq, init=[])
        wr = mem.write_port()
        rd = mem.read_port(transparent_for=(wr,))
        m.d.comb += [wr.en.eq(pend), wr.addr.eq(pend_index), wr.data.eq(then + pend_value)]

        sweep = Signal(range(nq))           # the row read this cycle
        swept = Signal(range(nq))           # the row in rd.data
        m.d.sync += [sweep.eq(Mux(sweep == nq - 1, 0, sweep + 1)), swept.eq(sweep)]
        m.d.comb += rd.addr.eq(sweep)
        late = Signal(w)
        m.d.comb += late.eq(now - rd.data)  # >= 0: the deadline is reached

        expired = Signal(nq, init=(1 << nq) - 1)
        for i in range(nq):
            mine = pend & (pend_index == i)
            m.d.comb += self.zero[i].eq(Mux(mine, pend_zero, expired[i]))
            with m.If(mine):
                # (wins over the compare of the row read the cycle before: the old deadline)
                m.d.sync += expired[i].eq(pend_zero)
            with m.Elif(~late[-1] & (swept == i)):
                m.d.sync += expired[i].eq(1)
        return m

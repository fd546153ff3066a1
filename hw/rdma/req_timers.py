# Ref: docs/roce-layouts.md §6.7 (local ACK timeout 4.096 us * 2**timeout, RNR NAK timer);
#      IBTA Vol. 1 §9.7.5.2.8 (RNR timer table).
"""The requester's retry timers: one down-counter per QP, for the ACK timeout and the RNR wait.

The counters run every cycle; the control FSM only loads one (``start_ack``: the local ACK
timeout of the QP's ``timeout`` code; ``start_rnr``: the RNR NAK's timer code, which wins when
both are asked for in one cycle) and sees them reach zero through the scheduler
(:class:`~hw.rdma.req_sq.SqScheduler`). Whether a timer is running at all is the QP record's
``timer_on`` bit, not the counter's.
"""

from amaranth import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.rdma.req_sq import qp_bits

__all__ = ["RNR_TIMER_MS", "ack_timeout_cycles", "rnr_timer_cycles", "timer_port",
           "RetryTimers"]

#: IBTA RNR NAK timer field (AETH syndrome bits 4:0) -> minimum delay in milliseconds.
RNR_TIMER_MS = [655.36, 0.01, 0.02, 0.03, 0.04, 0.06, 0.08, 0.12, 0.16, 0.24, 0.32, 0.48, 0.64,
                0.96, 1.28, 1.92, 2.56, 3.84, 5.12, 7.68, 10.24, 15.36, 20.48, 30.72, 40.96,
                61.44, 81.92, 122.88, 163.84, 245.76, 327.68, 491.52]

#: Counter width.
TIMER_BITS = 40


def ack_timeout_cycles(code, clk_hz, timer_scale=1):
    """Clock cycles of the local ACK timeout 4.096 us * 2**code (code 0 = no timeout: 0)."""
    if code == 0:
        return 0
    return max(1, round(4.096e-6 * 2 ** code * clk_hz / timer_scale))


def rnr_timer_cycles(code, clk_hz, timer_scale=1):
    """Clock cycles of the RNR NAK timer code (IBTA table)."""
    return max(1, round(RNR_TIMER_MS[code] * 1e-3 * clk_hz / timer_scale))


def timer_port(n_qp):
    """The control FSM's port on :class:`RetryTimers`, seen from the FSM (Out: driven by it)."""
    return wiring.Signature({
        "index": Out(qp_bits(n_qp)),
        "ack_code": Out(5),                 # the QP's timeout code (QpConfig.timeout)
        "start_ack": Out(1),                # load timer `index` with the ACK timeout
        "start_rnr": Out(1),                # load timer `index` with the RNR timer
        "rnr_code": Out(5),                 # AETH syndrome bits 4:0 of the RNR NAK
    })


class RetryTimers(wiring.Component):
    """``n_qp`` down-counters; ``zero[i]``: counter i is 0.

    Parameters
    ----------
    clk_hz : float
        clock frequency.
    timer_scale : int
        divides every timer (simulation: make 4.096 us * 2**timeout a few hundred cycles).

    Ports
    -----
    ctl : In(:func:`timer_port`)
    zero : Out(n_qp)
    """

    def __init__(self, n_qp, clk_hz, timer_scale=1):
        self._n_qp, self._clk_hz, self._scale = n_qp, clk_hz, timer_scale
        super().__init__({"ctl": In(timer_port(n_qp)), "zero": Out(n_qp)})

    def _table(self, m, code, cycles, name):
        out = Signal(TIMER_BITS, name=name)
        with m.Switch(code):
            for c in range(32):
                with m.Case(c):
                    m.d.comb += out.eq(cycles(c, self._clk_hz, self._scale))
        return out

    def elaborate(self, platform):
        m = Module()
        c = self.ctl
        ack_cyc = self._table(m, c.ack_code, ack_timeout_cycles, "ack_cyc")
        rnr_cyc = self._table(m, c.rnr_code, rnr_timer_cycles, "rnr_cyc")
        value = Signal(TIMER_BITS)
        m.d.comb += value.eq(Mux(c.start_rnr, rnr_cyc, ack_cyc))
        for i in range(self._n_qp):
            t = Signal(TIMER_BITS, name=f"timer{i}")
            m.d.comb += self.zero[i].eq(t == 0)
            with m.If((c.start_ack | c.start_rnr) & (c.index == i)):
                m.d.sync += t.eq(value)
            with m.Elif(t != 0):
                m.d.sync += t.eq(t - 1)
        return m

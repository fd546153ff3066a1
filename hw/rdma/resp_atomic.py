# Ref: roce-layouts.md §3 (CmpSwap, FetchAdd), §4.3 (AtomicETH), §4.4 (AtomicAckETH: the
#      original value); IBTA Vol. 1 §9.4.5 (64-bit little-endian word, no carry across it).
"""Atomic execution of the RC responder.

:class:`AtomicUnit` owns the read-modify-write of one aligned 64-bit word of target memory for
a Compare & Swap or a Fetch & Add, and the original value it read (returned in the ATOMIC
ACKNOWLEDGE). The read and the write are two bus requests; the read sets ``lock``
(:data:`~hw.iface.MemReq`), so no other master of a :class:`~hw.lib.membus.MemArbiter` that
lists the unit in ``locking`` (and of every arbiter between it and the unit) can access the
word in between.
"""

from amaranth import Module, Mux, Signal
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.iface import ADDR_BITS, MemBusSignature
from hw.lib.fetchadd import MaskedFetchAdd

__all__ = ["AtomicUnit", "AtomicCtl"]

#: Atomic control, seen from the sequencer.
AtomicCtl = wiring.Signature({
    "start": Out(1), "addr": Out(ADDR_BITS),    # execute at this (8-aligned) address
    "done": In(1),                              # strobe: the write is accepted
    "orig": In(64),                             # the word before the operation
})


class AtomicUnit(wiring.Component):
    """Read, modify, write one 64-bit word (see the module docstring).

    Ports
    -----
    ctl : In(AtomicCtl)
    fetch_add : In(1)           1: Fetch & Add, 0: Compare & Swap
    compare, swap_add : In(64)  AtomicETH fields
    mem : Out(MemBusSignature)  requests only while the unit runs (``mem.req.valid``)
    """

    def __init__(self):
        super().__init__({
            "ctl": In(AtomicCtl),
            "fetch_add": In(1), "compare": In(64), "swap_add": In(64),
            "mem": Out(MemBusSignature()),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.fadd = fadd = MaskedFetchAdd(64)
        ctl, req, rsp = self.ctl, self.mem.req, self.mem.rsp
        addr = Signal(ADDR_BITS)
        orig = ctl.orig
        with m.FSM():
            with m.State("IDLE"):
                with m.If(ctl.start):
                    m.d.sync += addr.eq(ctl.addr)
                    m.next = "READ"
            with m.State("READ"):
                m.d.comb += [req.valid.eq(1), req.p.addr.eq(addr), req.p.we.eq(0),
                             req.p.lock.eq(1)]
                with m.If(req.ready):
                    m.next = "WAIT"
            with m.State("WAIT"):
                m.d.comb += rsp.ready.eq(1)
                with m.If(rsp.valid):
                    m.d.sync += orig.eq(rsp.p.rdata)
                    m.next = "WRITE"
            with m.State("WRITE"):
                m.d.comb += [fadd.old.eq(orig), fadd.add.eq(self.swap_add), fadd.mask.eq(0)]
                new = Mux(self.fetch_add, fadd.new,
                          Mux(orig == self.compare, self.swap_add, orig))
                m.d.comb += [req.valid.eq(1), req.p.addr.eq(addr), req.p.we.eq(1),
                             req.p.wdata.eq(new), req.p.wstrb.eq(0xFF), req.p.lock.eq(0)]
                with m.If(req.ready):
                    m.d.comb += ctl.done.eq(1)
                    m.next = "IDLE"
        return m

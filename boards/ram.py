# Ref: hw/iface.py MemBusSignature (split transactions, in-order responses, writes visible
#      to every later request); hw/lib/membus.py MemRam (the behaviour this replaces on boards);
#      Lattice FPGA-TN-02204 (ECP5 sysMEM: DP16KD, 1024 x 18 / 512 x 36).
"""A pipelined, banked target memory for the boards.

:class:`~hw.lib.membus.MemRam` answers one cycle after a request, straight from the block RAM.
At board size (the pool of an ECPIX-5 is 256 KiB = 128 DP16KD) yosys builds that RAM from
dozens of blocks spread over the die and a wide multiplexer after them, and the whole of it
(block clock-to-out, the multiplexer, the routing back) then runs on into the arbiter and its
masters in the same cycle. :class:`PipelinedRam` keeps the bus contract and cuts the path:

::

    req -> [s1 flops] -> bank 0..n-1 (block RAM, read latency 1) -> [per-bank flops]
        -> bank mux -> [response FIFO (SyncFIFOBuffered)] -> rsp

Reads take five cycles instead of one; one request per cycle is still accepted while the
response FIFO has room. ``req.ready`` comes from a credit counter (a flop), so the master's
``rsp.ready`` no longer reaches back into its own ``req.valid`` logic through the RAM.
Writes and reads pass stage s1 in acceptance order, so a write is visible to every request
accepted after it, as the bus requires.
"""

from amaranth import Module, Signal
from amaranth.lib import fifo, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In

from hw.iface import MEM_DATA_BITS, MemBusSignature

__all__ = ["PipelinedRam"]


class PipelinedRam(wiring.Component):
    """Word RAM of ``depth`` 8-octet words behind :class:`~hw.iface.MemBusSignature`.

    Parameters
    ----------
    depth : int
        Words, a power of two; addresses at or above ``8 * depth`` wrap, as in ``MemRam``.
    bank_words : int
        Words per bank (power of two). Each bank's read data is registered before the banks
        are multiplexed; 4096 words = 16 DP16KD per bank.
    credits : int
        Reads in flight or waiting in the response FIFO (its depth); 8 covers the pipeline's
        latency so that a master reading back to back is not throttled.

    Ports
    -----
    bus : In(MemBusSignature)
    """

    LATENCY = 5     # cycles from an accepted read to its rsp.valid (rsp.ready held high)

    def __init__(self, depth, *, bank_words=4096, credits=8):
        if depth < 2 or depth & (depth - 1):
            raise ValueError(f"depth {depth} is not a power of two >= 2")
        if bank_words < 2 or bank_words & (bank_words - 1):
            raise ValueError(f"bank_words {bank_words} is not a power of two >= 2")
        self.depth = depth
        self.bank_words = min(bank_words, depth)
        self.n_banks = depth // self.bank_words
        self.credits = credits
        super().__init__({"bus": In(MemBusSignature())})
        self.banks = [Memory(shape=MEM_DATA_BITS, depth=self.bank_words, init=[])
                      for _ in range(self.n_banks)]

    def elaborate(self, platform):
        m = Module()
        req, rsp = self.bus.req, self.bus.rsp
        abits = (self.depth - 1).bit_length()
        lbits = (self.bank_words - 1).bit_length()
        bbits = max(1, abits - lbits)

        # ---- credits: reads accepted and not yet handed out -----------------------------------
        reserved = Signal(range(self.credits + 1))
        accept = req.valid & req.ready
        pop = rsp.valid & rsp.ready
        m.d.comb += req.ready.eq(reserved != self.credits)
        m.d.sync += reserved.eq(reserved + (accept & ~req.payload.we) - pop)

        # ---- s1: the request, registered ------------------------------------------------------
        s1_valid = Signal()
        s1_we = Signal()
        s1_addr = Signal(abits)
        s1_wdata = Signal(MEM_DATA_BITS)
        s1_wstrb = Signal(MEM_DATA_BITS // 8)
        m.d.sync += [s1_valid.eq(accept), s1_we.eq(req.payload.we),
                     s1_addr.eq(req.payload.addr[3:3 + abits]),
                     s1_wdata.eq(req.payload.wdata), s1_wstrb.eq(req.payload.wstrb)]
        s1_bank = s1_addr[lbits:] if self.n_banks > 1 else 0

        # ---- s2: the banks (block RAM read latency 1) -----------------------------------------
        bank_q = []
        for b, mem in enumerate(self.banks):
            m.submodules[f"bank{b}"] = mem
            wr = mem.write_port(granularity=8)
            rd = mem.read_port()
            sel = s1_valid & (s1_bank == b)
            m.d.comb += [wr.addr.eq(s1_addr[:lbits]), wr.data.eq(s1_wdata),
                         rd.addr.eq(s1_addr[:lbits]), rd.en.eq(sel & ~s1_we)]
            with m.If(sel & s1_we):
                m.d.comb += wr.en.eq(s1_wstrb)
            # s3: every bank's output in a flop next to it.
            q = Signal(MEM_DATA_BITS, name=f"bank{b}_q")
            m.d.sync += q.eq(rd.data)
            bank_q.append(q)
        s2_read = Signal()
        s2_bank = Signal(bbits)
        s3_read = Signal()
        s3_bank = Signal(bbits)
        m.d.sync += [s2_read.eq(s1_valid & ~s1_we), s2_bank.eq(s1_bank),
                     s3_read.eq(s2_read), s3_bank.eq(s2_bank)]

        # ---- s4: bank multiplexer into the response FIFO --------------------------------------
        m.submodules.out = out = fifo.SyncFIFOBuffered(width=MEM_DATA_BITS, depth=self.credits)
        word = Signal(MEM_DATA_BITS)
        with m.Switch(s3_bank):
            for b in range(self.n_banks):
                with m.Case(b):
                    m.d.comb += word.eq(bank_q[b])
        m.d.comb += [out.w_data.eq(word), out.w_en.eq(s3_read),
                     rsp.payload.rdata.eq(out.r_data), rsp.valid.eq(out.r_rdy),
                     out.r_en.eq(rsp.ready)]
        return m

# Ref: roce-layouts.md §3 (opcodes and the headers that follow the BTH), §4.2 (AETH),
#      §4.4 (AtomicAckETH), §1.5 (PMTU codes), §6.2-§6.6 (ePSN, MSN, duplicates).
"""Records, opcode classes and the request decoder shared by the RC responder's blocks.

:mod:`hw.rdma.responder` wires the blocks together; each block's own docstring says what it
owns. This module owns the vocabulary between them: the :data:`RespTx` record the responder
sends, the counter names, the per-QP context (split by owner: :data:`SeqCtx` belongs to the
sequencer, :data:`PlaceCtx` to the payload placer), the replay-cache entry, and
:class:`RequestDecoder`, the combinational class of a request opcode with the checks that depend
only on the header and the QP's PMTU.
"""

from amaranth import Const, Module, Mux
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from hw.headers import AETH, AtomicAckETH, BthOpcode
from hw.iface import ADDR_BITS, QP_INDEX_BITS

__all__ = ["RespTx", "COUNTERS", "Counts", "SeqCtx", "PlaceCtx", "QpCtx", "CacheEntry",
           "ReqKind", "RequestDecoder", "op_in"]

#: One packet for the TX path to send (hw/rdma/txpath.py).
RespTx = data.StructLayout({
    "qp": QP_INDEX_BITS,
    "opcode": 8,
    "psn": 24,
    "aeth": AETH,
    "atomic_ack": AtomicAckETH,
    "laddr": ADDR_BITS,
    "length": 16,
})

#: Counter output ports, in the order a register bank should map them (offset 4 * index).
COUNTERS = ("cnt_packets", "cnt_acks", "cnt_seq_naks", "cnt_psn_ahead", "cnt_duplicates",
            "cnt_rkey_errors", "cnt_nak_invalid", "cnt_nak_access", "cnt_rnr_naks",
            "cnt_unknown_qp", "cnt_bad_state", "cnt_bad_opcode", "cnt_src_mismatch",
            "cnt_rnr_backlog")

#: One strobe per counter: a block raises a bit for one cycle to count one event.
Counts = data.StructLayout({name: 1 for name in COUNTERS})

#: Per-QP sequencing state (the sequencer's part of the context).
SeqCtx = data.StructLayout({
    "epsn": 24, "msn": 24, "nak_armed": 1, "err": 1,
    "since_ack": 8,
    "cache_ptr": 4,                               # next replay-cache entry to write
})

#: Per-QP placement state (the payload placer's part of the context).
PlaceCtx = data.StructLayout({
    "in_send": 1, "in_write": 1,
    "wr_laddr": ADDR_BITS, "wr_rem": 32,          # RDMA WRITE cursor
    "send_addr": ADDR_BITS, "send_off": 17,       # receive buffer of the SEND in progress
    "head": 8,                                    # next receive buffer index
})

#: Per-QP dynamic state, loaded into the working registers for the packet being processed.
QpCtx = data.StructLayout({"seq": SeqCtx, "place": PlaceCtx})

#: Replay-cache entry of a READ (psn .. psn + npsn - 1) or an atomic (npsn = 1; ``va`` holds
#: the original value).
CacheEntry = data.StructLayout({
    "valid": 1, "atomic": 1, "psn": 24, "npsn": 24, "rkey": 32, "va": 64, "length": 32,
})

O = BthOpcode
_SEND = [O.SEND_FIRST, O.SEND_MIDDLE, O.SEND_LAST, O.SEND_LAST_IMM, O.SEND_ONLY,
         O.SEND_ONLY_IMM, O.SEND_LAST_INV, O.SEND_ONLY_INV]
_WRITE = [O.WRITE_FIRST, O.WRITE_MIDDLE, O.WRITE_LAST, O.WRITE_LAST_IMM, O.WRITE_ONLY,
          O.WRITE_ONLY_IMM]
_ATOMIC = [O.CMP_SWAP, O.FETCH_ADD]
_FIRST_ONLY = [O.SEND_FIRST, O.SEND_ONLY, O.SEND_ONLY_IMM, O.SEND_ONLY_INV, O.WRITE_FIRST,
               O.WRITE_ONLY, O.WRITE_ONLY_IMM, O.READ_REQUEST] + _ATOMIC
_MID_LAST_SEND = [O.SEND_MIDDLE, O.SEND_LAST, O.SEND_LAST_IMM, O.SEND_LAST_INV]
_MID_LAST_WRITE = [O.WRITE_MIDDLE, O.WRITE_LAST, O.WRITE_LAST_IMM]
_FULL = [O.SEND_FIRST, O.SEND_MIDDLE, O.WRITE_FIRST, O.WRITE_MIDDLE]       # payload == PMTU

#: ReqKind field -> the opcodes that set it.
_KIND_OPS = {
    "send": _SEND,
    "write": _WRITE,
    "read": [O.READ_REQUEST],
    "atomic": _ATOMIC,
    "fetch_add": [O.FETCH_ADD],
    "request": _SEND + _WRITE + _ATOMIC + [O.READ_REQUEST],
    "first_only": _FIRST_ONLY,
    "last": [O.SEND_LAST, O.SEND_LAST_IMM, O.SEND_LAST_INV, O.WRITE_LAST, O.WRITE_LAST_IMM],
    "only": [O.SEND_ONLY, O.SEND_ONLY_IMM, O.SEND_ONLY_INV, O.WRITE_ONLY, O.WRITE_ONLY_IMM],
    "imm": [O.SEND_LAST_IMM, O.SEND_ONLY_IMM, O.WRITE_LAST_IMM, O.WRITE_ONLY_IMM],
    "inv": [O.SEND_LAST_INV, O.SEND_ONLY_INV],
    "needs_recv": [O.SEND_FIRST, O.SEND_ONLY, O.SEND_ONLY_IMM, O.SEND_ONLY_INV,
                   O.WRITE_LAST_IMM, O.WRITE_ONLY_IMM],      # takes a receive buffer
}

#: Class of a request opcode (one bit per :data:`_KIND_OPS` entry).
ReqKind = data.StructLayout({name: 1 for name in _KIND_OPS})


def op_in(op, ops):
    """1 when ``op`` is one of the opcodes ``ops``."""
    out = Const(0)
    for o in ops:
        out = out | (op == o.value)
    return out


class RequestDecoder(wiring.Component):
    """Combinational: the class of a request and the checks that need no memory access.

    Ports
    -----
    op : In(8), n : In(16)          opcode and payload octets of the packet
    pmtu_code : In(3)               the QP's IB MTU code
    in_send, in_write : In(1)       a SEND / WRITE message of the QP is in progress
    kind : Out(ReqKind)
    seq_bad : Out(1)                opcode out of sequence (roce-layouts.md §3)
    len_bad : Out(1)                payload length wrong for the opcode and PMTU
    pmtu : Out(14), pmtu_log2 : Out(4)
    """

    def __init__(self):
        super().__init__({
            "op": In(8), "n": In(16), "pmtu_code": In(3), "in_send": In(1), "in_write": In(1),
            "kind": Out(ReqKind), "seq_bad": Out(1), "len_bad": Out(1),
            "pmtu": Out(14), "pmtu_log2": Out(4),
        })

    def elaborate(self, platform):
        m = Module()
        op, k, n, pmtu = self.op, self.kind, self.n, self.pmtu
        for name, ops in _KIND_OPS.items():
            m.d.comb += k[name].eq(op_in(op, ops))
        m.d.comb += [self.pmtu_log2.eq(self.pmtu_code + 7), pmtu.eq(1 << self.pmtu_log2)]
        m.d.comb += [
            self.seq_bad.eq(Mux(self.in_send, ~op_in(op, _MID_LAST_SEND),
                                Mux(self.in_write, ~op_in(op, _MID_LAST_WRITE), ~k.first_only))),
            self.len_bad.eq((op_in(op, _FULL) & (n != pmtu)) |
                            (k.last & ((n == 0) | (n > pmtu))) | (k.only & (n > pmtu))),
        ]
        return m

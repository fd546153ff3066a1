# Ref: IBTA Vol. 1 §10.8 (work requests / completions), §9.7 (RC responder); draft KBTP
#      §Target Execution Model (pre-posted receives + chained work requests).
"""Internal interfaces between the target's gateware blocks.

The target is organised like an RNIC whose upper-layer consumer (the KBTP engine) sits on the
chip instead of behind PCIe::

        RoCE RX --> responder --(RecvNotify)--> KBTP engine / host slow path
                        |                            |
                        +---------- MemBus ----------+----- target memory (pool, table, ring,
                        |                            |      receive buffers, scratch)
        RoCE TX <-- requester <--(WorkRequest)-------+
                    requester --(WorkCompletion)-->  engine / host

- Target memory is one byte-addressed space behind :class:`MemBusSignature`. Every block that
  touches pool, table, ring, receive buffers or scratch is a master; a :class:`MemArbiter`
  (hw/rtl/membus.py) merges them in front of a RAM (BRAM on a board, a RAM model in simulation).
- The responder writes each accepted SEND message into a pre-posted receive buffer of its QP in
  target memory (exactly what an RNIC does with a posted receive), then tells the consumer with a
  :data:`RecvNotify` beat. The consumer returns the buffer with a :data:`RecvRepost` beat; when a
  QP has no buffer left the responder answers RNR NAK.
- The consumer asks the requester for RDMA operations towards the initiator with
  :data:`WorkRequest` beats. Payloads always come from (WRITE, SEND) or go to (READ) target
  memory at ``laddr``, so a COMPLETION message is first written to a scratch buffer and then sent.
  The requester answers each request with one :data:`WorkCompletion` beat, in order per QP.
"""

from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = [
    "ADDR_BITS", "MEM_DATA_BITS", "QPN_BITS", "QP_INDEX_BITS",
    "MemReq", "MemRsp", "MemBusSignature",
    "WrOp", "WcStatus", "RecvNotify", "RecvRepost", "WorkRequest", "WorkCompletion",
]

#: Byte address width of target memory.
ADDR_BITS = 32
#: Data width of the memory bus, in bits (one 8-octet word per beat).
MEM_DATA_BITS = 64
#: Width of a queue pair number on the wire, and of a local QP table index.
QPN_BITS = 24
QP_INDEX_BITS = 4


# --------------------------------------------------------------------------------------------
# Memory bus: split transactions, in-order responses, one word per beat.
# --------------------------------------------------------------------------------------------

MemReq = data.StructLayout({
    "addr": ADDR_BITS,          # byte address of the word; must be 8-octet aligned
    "we": 1,                    # 1 = write, 0 = read
    "wdata": MEM_DATA_BITS,     # octet k of the word is wdata[8k:8k+8] (little-endian lanes)
    "wstrb": MEM_DATA_BITS // 8,
})

MemRsp = data.StructLayout({
    "rdata": MEM_DATA_BITS,     # one beat per read request, in request order
})


class MemBusSignature(wiring.Signature):
    """Master side of the memory bus.

    ``req`` carries reads and writes; every read gets exactly one ``rsp`` beat, in order.
    Writes get no response: a write is visible to every later request of any master once the
    arbiter has accepted it (the arbiter keeps a single order), which is what the draft's
    ordering rules (data before entry; Block Offset before Sequence) need.
    """

    def __init__(self):
        super().__init__({
            "req": Out(stream.Signature(MemReq)),
            "rsp": In(stream.Signature(MemRsp)),
        })


# --------------------------------------------------------------------------------------------
# Responder -> consumer, consumer -> requester.
# --------------------------------------------------------------------------------------------

class WrOp(enum.Enum, shape=3):
    SEND = 0
    SEND_INV = 1        # SEND with Invalidate of ``inv_rkey``
    WRITE = 2
    WRITE_IMM = 3       # RDMA WRITE with Immediate ``imm``
    READ = 4            # RDMA READ of ``length`` octets at (rkey, va) into ``laddr``


class WcStatus(enum.Enum, shape=4):
    OK = 0
    REMOTE_ACCESS = 1       # NAK remote access error
    REMOTE_INVALID = 2      # NAK invalid request
    REMOTE_OP = 3           # NAK remote operational error
    RETRY_EXCEEDED = 4      # transport retries exhausted: QP moved to error
    RNR_EXCEEDED = 5
    FLUSHED = 6             # QP in error: request not executed


RecvNotify = data.StructLayout({
    "qp": QP_INDEX_BITS,        # local QP table index
    "addr": ADDR_BITS,          # receive buffer in target memory holding the whole message
    "length": 16,               # message length in octets
    "has_imm": 1, "imm": 32,
    "has_inv": 1, "inv_rkey": 32,
})

RecvRepost = data.StructLayout({
    "qp": QP_INDEX_BITS,        # one receive buffer of this QP is free again
})

WorkRequest = data.StructLayout({
    "qp": QP_INDEX_BITS,
    "wr_id": 16,
    "op": WrOp,
    "rkey": 32,                 # remote STag (WRITE, WRITE_IMM, READ)
    "va": 64,                   # remote Tagged Offset
    "length": 32,               # octets
    "laddr": ADDR_BITS,         # local target-memory address of the payload (source or sink)
    "imm": 32,                  # WRITE_IMM
    "inv_rkey": 32,             # SEND_INV
})

WorkCompletion = data.StructLayout({
    "qp": QP_INDEX_BITS,
    "wr_id": 16,
    "status": WcStatus,
})

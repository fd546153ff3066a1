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
  (hw/lib/membus.py) merges them in front of a RAM (BRAM on a board, a RAM model in simulation).
- The responder writes each accepted SEND message into a pre-posted receive buffer of its QP in
  target memory (exactly what an RNIC does with a posted receive), then tells the consumer with a
  :data:`RecvNotify` beat. The consumer returns the buffer with a :data:`RecvRepost` beat; when a
  QP has no buffer left the responder answers RNR NAK.
- The consumer asks the requester for RDMA operations towards the initiator with
  :data:`WorkRequest` beats. Payloads always come from (WRITE, SEND) or go to (READ) target
  memory at ``laddr``, so a COMPLETION message is first written to a scratch buffer and then sent.
  The requester answers each request with one :data:`WorkCompletion` beat, in order per QP.
"""

from amaranth import Cat
from amaranth.lib import data, enum, stream, wiring
from amaranth.lib.wiring import In, Out

__all__ = [
    "ADDR_BITS", "MEM_DATA_BITS", "QPN_BITS", "QP_INDEX_BITS", "QPN_BASE", "qp_index_of",
    "MemReq", "MemRsp", "MemBusSignature",
    "WrOp", "WcStatus", "RecvNotify", "MSG_HEAD_OCTETS", "MsgHead", "RecvRepost",
    "WorkRequest", "WorkCompletion",
    "Space", "HostBusSignature", "counter_ports",
]

#: Byte address width of target memory.
ADDR_BITS = 32
#: Data width of the memory bus, in bits (one 8-octet word per beat).
MEM_DATA_BITS = 64
#: Width of a queue pair number on the wire, and of a local QP table index.
QPN_BITS = 24
QP_INDEX_BITS = 6
#: The local QPN of QP table index ``i`` is ``QPN_BASE + i + 2**QP_INDEX_BITS * g``, where the
#: generation ``g`` counts the reuses of index ``i`` (host/cm.py). A QPN's index is therefore
#: ``(qpn - QPN_BASE) mod 2**QP_INDEX_BITS`` (:func:`qp_index_of`), and the hardware finds a
#: packet's QP by that subtraction and one compare with the indexed row's ``local_qpn``,
#: instead of comparing the QPN with every QP's (a search that grows with the QP count).
QPN_BASE = 0x11


def qp_index_of(qpn):
    """QP table index of local QPN ``qpn`` (an int, or an Amaranth value: then a value)."""
    if isinstance(qpn, int):
        return (qpn - QPN_BASE) % (1 << QP_INDEX_BITS)
    return (qpn - QPN_BASE)[:QP_INDEX_BITS]


def counter_ports(names):
    """Signature members ``cnt_<name>: Out(32)``, one per event counter in ``names``."""
    return {f"cnt_{c}": Out(32) for c in names}


# --------------------------------------------------------------------------------------------
# Memory bus: split transactions, in-order responses, one word per beat.
# --------------------------------------------------------------------------------------------

MemReq = data.StructLayout({
    "addr": ADDR_BITS,          # byte address of the word; must be 8-octet aligned
    "we": 1,                    # 1 = write, 0 = read
    "wdata": MEM_DATA_BITS,     # octet k of the word is wdata[8k:8k+8] (little-endian lanes)
    "wstrb": MEM_DATA_BITS // 8,
    # 1 on a read: the arbiter keeps its grant with this master until the master's next request
    # is accepted (the write of a read-modify-write). Only masters an arbiter lists in its
    # ``locking`` may set it (hw/lib/membus.py MemArbiter); the others may leave it undriven.
    "lock": 1,
})

MemRsp = data.StructLayout({
    "rdata": MEM_DATA_BITS,     # one beat per read request, in request order
})


class MemBusSignature(wiring.Signature):
    """Master side of the memory bus.

    ``req`` carries reads and writes; every read gets exactly one ``rsp`` beat, in order.
    Writes get no response: a write is visible to every later request of any master once the
    arbiter has accepted it (the arbiter keeps a single order), which is what the draft's
    ordering rules (data before entry; Block Offset before Sequence) need. A read with
    ``lock`` set makes the master's next request follow it with no other master's in between
    (a read-modify-write), where the arbiter lists the master in ``locking``.
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

#: Octets of a single-packet message the responder hands its consumer on chip, beside the
#: RecvNotify (:data:`MsgHead`): the KBTP engine decodes a request from them instead of reading
#: them back from the receive buffer (hw/kbtp/decode.py ``MSG_WORDS``: a request's header and
#: both descriptors, 56 octets). A DDR3 read on the ECPIX-5 is some 20 core cycles.
MSG_HEAD_OCTETS = 56

#: The first :data:`MSG_HEAD_OCTETS` octets of a message, big-endian (octet 0 the most
#: significant, as hw/kbtp/movers.py WordReader gives them), with ``ok``: the message was one
#: packet (a SEND Only); octets past its length are 0. Not ``ok`` (another kind of message, or
#: one whose payload came while the previous notify waited: hw/rdma/resp_place.py): read the
#: receive buffer.
MsgHead = data.StructLayout({
    "ok": 1,
    "octets": 8 * MSG_HEAD_OCTETS,
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


# --------------------------------------------------------------------------------------------
# QP context and memory regions (written by the host; read by responder and requester).
# --------------------------------------------------------------------------------------------

class QpState(enum.Enum, shape=3):
    RESET = 0
    INIT = 1
    RTR = 2         # ready to receive: responder active
    RTS = 3         # ready to send: responder and requester active
    ERROR = 4       # retries exhausted or fatal error: requests flushed, host told


#: Static per-QP configuration (host-written). Dynamic state (expected PSN, MSN, send PSN,
#: unacknowledged PSN, retry counters) lives in the responder and the requester, which load
#: their starting PSNs from here when the host writes ``state``.
QpConfig = data.StructLayout({
    "state": QpState,
    "local_qpn": QPN_BITS,
    "remote_qpn": QPN_BITS,
    "peer_mac": 48,
    "peer_ip": 32,
    "udp_sport": 16,
    "pmtu": 3,              # IB MTU code: 1 = 256, 2 = 512, 3 = 1024, 4 = 2048, 5 = 4096
    "rq_psn": 24,           # first PSN expected from the peer (responder's ePSN at RTR)
    "sq_psn": 24,           # first PSN we send (requester at RTS)
    "timeout": 5,           # local ACK timeout: 4.096 us * 2**timeout (0 = infinite)
    "retry_cnt": 3,
    "rnr_retry": 3,
    "recv_base": ADDR_BITS,  # receive buffers of this QP in target memory
    "recv_count": 8,         # number of receive buffers (credits)
    "recv_size_log2": 5,     # each buffer is 2**recv_size_log2 octets
})

MrRights = data.StructLayout({"read": 1, "write": 1, "atomic": 1})



def mr_entry(n_qp=1 << QP_INDEX_BITS):
    """One memory region of a target with ``n_qp`` QPs: remote access to target memory through
    an R_Key. ``qp_mask`` has one bit per QP (a 4-QP target keeps 4, not 64)."""
    return data.StructLayout({
        "valid": 1,
        "rights": MrRights,
        "qp_mask": n_qp,        # QPs (by table index) allowed to use it; bit i = QP i
        "rkey": 32,
        "va": 64,               # first Tagged Offset of the region
        "length": 32,
        "laddr": ADDR_BITS,     # target-memory address of ``va``
    })


#: One memory region at the largest QP count.
MrEntry = mr_entry()

#: The subsets of a QP's row that each reader keeps in its own copy (hw/rdma/qp.py QpTable):
#: the responder's admission and execution, the requester's response intake, the TX header.
QpRespCfg = data.StructLayout({
    "state": QpState, "local_qpn": QPN_BITS, "peer_ip": 32, "pmtu": 3,
    "recv_base": ADDR_BITS, "recv_count": 8, "recv_size_log2": 5,
})
QpIntakeCfg = data.StructLayout({"local_qpn": QPN_BITS, "peer_ip": 32})
QpTxCfg = data.StructLayout({"remote_qpn": QPN_BITS, "peer_mac": 48, "peer_ip": 32,
                             "udp_sport": 16})
#: The requester control FSM's fields (QpTable's ``req`` copy).
ReqCfg = data.StructLayout({"pmtu": 3, "timeout": 5, "retry_cnt": 3, "rnr_retry": 3})


class QpReadSignature(wiring.Signature):
    """A registered read port on one copy of the QP table, seen from the reader: ``data`` is
    the row (of ``layout``) at the ``addr`` of the previous cycle."""

    def __init__(self, layout):
        super().__init__({"addr": Out(QP_INDEX_BITS), "data": In(layout)})


def qp_subset(layout, row):
    """The fields of ``layout`` (StructLayout of QpConfig field names) taken from ``row``, a
    QpConfig view, as one value of ``layout``'s size."""
    return Cat(*(getattr(row, name) for name, _ in data.Layout.cast(layout)))


__all__ += ["QpState", "QpConfig", "QpRespCfg", "QpIntakeCfg", "QpTxCfg", "ReqCfg",
            "QpReadSignature", "qp_subset", "MrRights", "MrEntry", "mr_entry"]

#: Host register map (HostBusSignature ``Space.REG`` byte addresses), one window per block.
REG_TOP = 0x0000        # own MAC / IP, MAC/IP/ARP counters, ID register
REG_QP = 0x1000         # QP i at REG_QP + 0x40 * i (64 QPs end at REG_MR)
REG_MR = 0x2000         # MR j at REG_MR + 0x40 * j
REG_TRANSPORT = 0x3000  # responder/requester counters, QP error events
REG_KBTP = 0x4000       # KBTP engine configuration and counters
REG_UDPLINK = 0x5000    # UDP host link: host address, enable, counters (hw/target/udplink.py)
__all__ += ["REG_TOP", "REG_QP", "REG_MR", "REG_TRANSPORT", "REG_KBTP", "REG_UDPLINK"]


# --------------------------------------------------------------------------------------------
# Host bus: the register / memory / queue bus every host-visible block answers on (the master
# is the host link, hw/target/hostlink.py; its protocol is documented there).
# --------------------------------------------------------------------------------------------

class Space(enum.Enum, shape=2):
    REG = 0
    MEM = 1
    QUEUE = 2


class HostBusSignature(wiring.Signature):
    """Register / memory / queue bus, seen from the master (the host link).

    Members
    -------
    addr : Out(32)    byte address (word aligned); queue number for ``Space.QUEUE``
    space : Out(Space)
    wdata : Out(32)
    we, re : Out(1)   request; held until ``ack``
    rdata : In(32)    read data, valid with ``ack`` on reads
    ack : In(1)       access done (one cycle)
    err : In(1)       with ``ack``: access refused
    """

    def __init__(self):
        super().__init__({
            "addr": Out(32), "space": Out(Space), "wdata": Out(32),
            "we": Out(1), "re": Out(1),
            "rdata": In(32), "ack": In(1), "err": In(1),
        })

# Ref: roce-layouts.md §1.3 (IPv4 fields), §2 (BTH), §3 (opcodes).
#      §6.5, §6.7 (ACKs, the retransmission timer: AckHold);
#      (RespTx / TxReq); hw/iface.py (MemBusSignature, QpTxCfg); hw/rdma/roce_hdr.py.
"""Transmit path of the RC transport: merges packet requests of the responder and the requester.

Each source hands over one :data:`TxReq` record per packet: the transport header fields it
decides (opcode, PSN, AckReq, AETH, RETH, ImmDt, IETH, AtomicAckETH) and where the payload lies
in target memory. The TX path completes the header from the QP's configuration (destination
QPN, peer MAC/IP, UDP source port, P_Key), fetches the payload with a :class:`DmaReader` and
presents a :data:`~hw.rdma.roce_hdr.RoceTxHeader` record plus a payload packet, ready for
:class:`~hw.rdma.roce_hdr.RoceTxBuilder`. Sources are served round robin, one packet at a time.
The QP's fields come from the TX path's copy of the QP table (registered read port ``cfg``,
QpTable.tx) read at the granted record's QP: the header is valid from the second cycle after
the grant (one cycle after the record is latched); the payload fetch starts without waiting.

Why the payload is read here and not by the sources: retransmissions (requester) and READ
responses (responder) both need "octets at laddr, length" at the moment the packet leaves, and
one reader in front of the single output keeps the memory traffic in packet order.
"""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.headers import RETH, AETH, AtomicAckETH, BthOpcode, ImmDt, IETH
from hw.iface import ADDR_BITS, QP_INDEX_BITS, MemBusSignature, QpReadSignature, QpTxCfg
from hw.rdma.roce_hdr import RoceTxHeader
from hw.lib.dma import DmaReader
from hw.lib.stream import PacketStream

__all__ = ["TxReq", "TxPath", "AckHold", "connect_fields"]

#: One packet to send (superset of the responder's ``RespTx``, same names and shapes).
TxReq = data.StructLayout({
    "qp": QP_INDEX_BITS,        # local QP table index: selects the QpConfig used for addressing
    "opcode": 8,                # BthOpcode
    "psn": 24,
    "aeth": AETH,
    "atomic_ack": AtomicAckETH,
    "laddr": ADDR_BITS,         # payload source in target memory, any alignment
    "length": 16,               # payload octets; 0 = no payload
    "ackreq": 1,                # BTH AckReq (requester: last packet of a message)
    "reth": RETH,
    "imm": ImmDt,
    "ieth": IETH,
})

#: Default P_Key (roce-layouts.md §2: rxe sends 0xFFFF).
DEFAULT_PKEY = 0xFFFF


def connect_fields(m, src, dst):
    """Connect stream ``src`` to stream ``dst`` copying the payload fields both layouts share
    by name (e.g. a responder ``RespTx`` stream into a :data:`TxReq` source port)."""
    m.d.comb += [dst.valid.eq(src.valid), src.ready.eq(dst.ready)]
    names = dict(dst.payload.shape().members)
    for name in dict(src.payload.shape().members):
        if name in names:
            m.d.comb += getattr(dst.payload, name).eq(getattr(src.payload, name))


class TxPath(wiring.Component):
    """Merge :data:`TxReq` streams into RoceTxBuilder records and payload packets.

    Parameters
    ----------
    width : int
        payload datapath width (8 .. 64 bits).
    n_sources : int
        number of :data:`TxReq` sources (e.g. 0 = responder, 1 = requester).
    n_qp : int
        QP table entries.

    Ports
    -----
    src : In(stream of TxReq).array(n_sources)
        one beat per packet; taken when the TX path starts the packet.
    cfg : Out(QpReadSignature(QpTxCfg))  the TX path's copy of the QP table (QpTable.tx)
    hdr : Out(stream of RoceTxHeader)  -> RoceTxBuilder.hdr (held until the packet is built)
    payload : Out(PacketStream(width))  -> RoceTxBuilder.payload
    mem : Out(MemBusSignature())  payload reads
    cnt_packets : Out(32)
    """

    def __init__(self, width, n_sources, n_qp):
        self._width = width
        self._n_src = n_sources
        self._n_qp = n_qp
        super().__init__({
            "src": In(stream.Signature(TxReq)).array(n_sources),
            "cfg": Out(QpReadSignature(QpTxCfg)),
            "hdr": Out(stream.Signature(RoceTxHeader)),
            "payload": Out(PacketStream(self._width)),
            "mem": Out(MemBusSignature()),
            "cnt_packets": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        n = self._n_src
        m.submodules.dma = dma = DmaReader(self._width)
        wiring.connect(m, dma.mem, wiring.flipped(self.mem))
        wiring.connect(m, dma.o, wiring.flipped(self.payload))

        rec = Signal(TxReq)
        busy = Signal()
        cmd_done = Signal()
        ip_id = Signal(16)
        last = Signal(range(max(n, 2)))     # last source served: the search starts after it

        # Round robin over sources, one packet each.
        grant = Signal(range(max(n, 2)))
        any_valid = Signal()
        for off in reversed(range(1, n + 1)):
            idx = Signal(range(max(n, 2)), name=f"cand{off}")
            m.d.comb += idx.eq((last + off) % n)
            with m.Switch(idx):
                for i in range(n):
                    with m.Case(i):
                        with m.If(self.src[i].valid):
                            m.d.comb += [grant.eq(i), any_valid.eq(1)]
        with m.If(~busy & any_valid):
            for i in range(n):
                with m.If(grant == i):
                    m.d.comb += self.src[i].ready.eq(1)
                    m.d.sync += rec.eq(self.src[i].p)
            m.d.sync += [busy.eq(1), last.eq(grant), cmd_done.eq(0)]

        # The row of rec.qp is read while the record is held: there one cycle after the grant.
        cfg = self.cfg.data
        row_ok = Signal()
        m.d.comb += self.cfg.addr.eq(rec.qp)
        m.d.sync += row_ok.eq(busy)
        h = self.hdr.p
        m.d.comb += [
            h.bth.opcode.eq(rec.opcode), h.bth.psn.eq(rec.psn), h.bth.ackreq.eq(rec.ackreq),
            h.bth.pkey.eq(DEFAULT_PKEY), h.bth.dest_qp.eq(cfg.remote_qpn),
            h.reth.eq(rec.reth), h.aeth.eq(rec.aeth), h.atomic_ack.eq(rec.atomic_ack),
            h.imm.eq(rec.imm), h.ieth.eq(rec.ieth),
            h.payload_len.eq(rec.length),
            h.meta.dst_mac.eq(cfg.peer_mac), h.meta.dst_ip.eq(cfg.peer_ip),
            h.meta.udp_src_port.eq(cfg.udp_sport), h.meta.ip_id.eq(ip_id),
            self.hdr.valid.eq(busy & row_ok),
            dma.cmd.valid.eq(busy & ~cmd_done & (rec.length != 0)),
            dma.cmd.p.addr.eq(rec.laddr), dma.cmd.p.length.eq(rec.length),
        ]
        with m.If(dma.cmd.valid & dma.cmd.ready):
            m.d.sync += cmd_done.eq(1)
        # RoceTxBuilder takes the record when the whole packet has been built.
        with m.If(self.hdr.valid & self.hdr.ready):
            m.d.sync += [busy.eq(0), ip_id.eq(ip_id + 1),
                         self.cnt_packets.eq(self.cnt_packets + 1)]
        return m


class AckHold(wiring.Component):
    """Holds a plain ACK of the responder back while an answer of ours may still come: a KBTP
    answer goes on the wire ahead of the transport ACK of its request.

    Why: a LOAD's request (a SEND) is ACKed by the responder as soon as its payload is placed,
    12 to 20 cycles before the engine hands the LOAD's RDMA WRITE over (a STORE's COMPLETION,
    after the copy, some 40 more). The ACK then held the wire for its whole frame (94 octet
    times with preamble and gap) and the answer behind it: at one octet a cycle that was most
    of a LOAD's answer time in the one-clock targets (issue 21). The two directions of an RC
    connection are independent (the ACK answers the initiator's requests, the WRITE is one of
    ours), and an ACK may come late: the initiator waits for it up to its retransmission timer
    (roce-layouts.md §6.5, §6.7: milliseconds, against ``delay`` cycles here).

    What is held: a record with opcode ACKNOWLEDGE and an ACK syndrome (AETH syndrome bits
    7..5 = 0), taken from the responder at once into a register, so the responder goes on with
    the next packet (a responder that waited for its ACK to be taken would stop the receive
    path for the hold: with holds of thousands of cycles, inline STOREs of 4 KiB at width 8
    ran at a third of the wire's rate). NAKs, READ responses and ATOMIC ACKNOWLEDGEs pass at
    once. The held ACK goes at the first of: another record of the responder's waits behind
    it (order kept: a QP's responses stay in PSN order); ``other`` (a packet of another
    source taken by the TX path) has strobed while it waited; ``expect`` has been low for
    ``grace`` cycles in a row (no answer is coming: the RecvNotify, which follows the ACK by
    the last payload write's acceptance, and a WorkRequest on its way through the
    requester's queues leave ``expect`` low for a few cycles, which ``grace`` covers);
    ``delay`` cycles. Once offered it stays offered until taken.

    Ports
    -----
    i : In(stream of RespTx-like records)  from the responder (a layout with ``opcode`` and
        ``aeth``)
    o : Out(the same)                      to the TX path
    other : In(1)                          another source's packet was taken this cycle
    expect : In(1)                         an answer may still come (the engine is busy or has
                                           a RecvNotify waiting, a WorkRequest or packet of
                                           the requester is on its way)
    """

    def __init__(self, layout, delay, grace=16):
        if not 1 <= grace <= delay:
            raise ValueError(f"AckHold: need 1 <= grace ({grace}) <= delay ({delay})")
        self.delay, self.grace = delay, grace
        super().__init__({"i": In(stream.Signature(layout)), "o": Out(stream.Signature(layout)),
                          "other": In(1), "expect": In(1)})

    def elaborate(self, platform):
        m = Module()
        i, o = self.i, self.o
        held = Signal()
        rec = Signal.like(i.p)
        waited = Signal(range(self.delay + 1))
        quiet = Signal(range(self.grace + 1))       # cycles in a row without ``expect``
        released = Signal()
        plain_ack = ((i.p.opcode == BthOpcode.ACKNOWLEDGE) & (i.p.aeth.syndrome[5:8] == 0))
        go = held & (released | (waited == self.delay) | (quiet == self.grace) | i.valid)
        m.d.comb += [o.p.eq(Mux(held, rec, i.p)),
                     o.valid.eq(Mux(held, go, i.valid & ~plain_ack)),
                     i.ready.eq(~held & (plain_ack | o.ready))]
        with m.If(~held):
            with m.If(i.valid & plain_ack):
                m.d.sync += [held.eq(1), rec.eq(i.p), waited.eq(0), quiet.eq(0),
                             released.eq(0)]
        with m.Elif(o.valid & o.ready):
            m.d.sync += held.eq(0)
        with m.Elif(o.valid):
            m.d.sync += released.eq(1)      # offered: it stays offered until taken
        with m.Else():
            m.d.sync += [waited.eq(waited + 1), quiet.eq(Mux(self.expect, 0, quiet + 1))]
            with m.If(self.other):
                m.d.sync += released.eq(1)
        return m

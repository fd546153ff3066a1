# Ref: roce-layouts.md §2 (BTH, PadCnt), §3 (opcodes and the headers after the BTH), §4
#      (RETH, AETH, AtomicETH, AtomicAckETH, ImmDt, IETH, DETH); hw/headers.py EXT_HEADERS.
"""RoCEv2 transport header parser (receive) and builder (transmit), width-parametric.

Receive: BTH .. ICRC (as :class:`~hw.net.icrc.IcrcCheck` releases it) -> one header record per
packet on ``hdr`` and the payload (pad and ICRC removed) on ``payload``. Transmit: a header
record plus payload -> BTH .. pad with :data:`~hw.net.ip.RoceTxMeta`, ready for
:class:`~hw.net.icrc.IcrcInsert`.
"""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.headers import (BTH, RETH, AETH, AtomicETH, AtomicAckETH, ImmDt, IETH, DETH,
                        EXT_HEADERS, BthOpcode, size_of)
from hw.lib.octets import HeaderCapture, OctetPacker, lane_region, octets_be
from hw.net.ip import RoceRxMeta, RoceTxMeta, roce_rx_layout, roce_tx_layout
from hw.lib.stream import PacketStream, keep_count

__all__ = ["RoceRxHeader", "RoceTxHeader", "RoceRxParser", "RoceTxBuilder", "header_length",
           "MAX_ROCE_HEADER", "EXT_FIELDS"]

#: Record field name and layout of each extended header.
EXT_FIELDS = {RETH: "reth", AETH: "aeth", AtomicETH: "atomic_eth", AtomicAckETH: "atomic_ack",
              ImmDt: "imm", IETH: "ieth", DETH: "deth"}
BTH_LEN = size_of(BTH)
#: Longest BTH + extended headers of any opcode (BTH + AtomicETH = 40).
MAX_ROCE_HEADER = BTH_LEN + max(sum(size_of(h) for h in exts) for exts in EXT_HEADERS.values())


def header_length(opcode):
    """Octets of BTH + extended headers for a known opcode (``BthOpcode`` or int)."""
    for op, exts in EXT_HEADERS.items():
        if op == opcode or op.value == opcode:
            return BTH_LEN + sum(size_of(h) for h in exts)
    raise KeyError(opcode)


_headers = {"bth": BTH, **{name: hdr for hdr, name in EXT_FIELDS.items()}}
_flags = {f"has_{name}": 1 for name in EXT_FIELDS.values()}

#: Header record of a received packet.
RoceRxHeader = data.StructLayout({
    **_headers, **_flags,
    "known_opcode": 1,      # opcode is one of EXT_HEADERS (RC or UD as in roce-layouts §3)
    "malformed": 1,         # UDP length too short for headers + pad + ICRC
    "payload_len": 16,      # octets on ``payload`` (0: none are sent)
    "meta": RoceRxMeta,
})

#: Header record of a packet to send (``bth.padcnt`` and ``meta.length`` are computed).
RoceTxHeader = data.StructLayout({
    **_headers,
    "payload_len": 16,
    "meta": RoceTxMeta,
})


#: Opcodes made of headers only (IBA 9.4: READ request, atomics, ACKs). A packet of one of them
#: with octets beyond its headers is malformed: no consumer of its record drains a payload, so
#: forwarding one stalled the receive path (an ACKNOWLEDGE with 64 octets: found by tools/fuzz.py).
HEADERS_ONLY = frozenset(op.value for op in (
    BthOpcode.READ_REQUEST, BthOpcode.ACKNOWLEDGE, BthOpcode.ATOMIC_ACKNOWLEDGE,
    BthOpcode.CMP_SWAP, BthOpcode.FETCH_ADD))


def _ext_placement():
    """``{opcode value: [(field name, layout, octet offset)]}`` from EXT_HEADERS."""
    out = {}
    for op, exts in EXT_HEADERS.items():
        off, items = BTH_LEN, []
        for h in exts:
            items.append((EXT_FIELDS[h], h, off))
            off += size_of(h)
        out[op.value] = (items, off)
    return out


class RoceRxParser(wiring.Component):
    """Split a received RoCE packet into its header record and its payload.

    Opcodes outside EXT_HEADERS are flagged (``known_opcode = 0``) and so are packets whose
    UDP length cannot hold BTH, extended headers, pad and ICRC, or that carry octets after the
    headers of a headers-only opcode (:data:`HEADERS_ONLY`) (``malformed``); neither sends
    payload. The record is presented as soon as its last header octet has arrived.

    Ports
    -----
    i : In(stream of :func:`~hw.net.ip.roce_rx_layout`)
        BTH .. ICRC, ``meta.udp_length`` − 8 octets.
    hdr : Out(stream of :data:`RoceRxHeader`)
    payload : Out(PacketStream(width))
        Payload octets only (PadCnt pad and ICRC removed); packets with no payload send none.
    cnt_packets, cnt_bad_opcode, cnt_malformed : Out(32)
    """

    def __init__(self, width):
        self._width = width
        super().__init__({
            "i": In(stream.Signature(roce_rx_layout(width))),
            "hdr": Out(stream.Signature(RoceRxHeader)),
            "payload": Out(PacketStream(width)),
            "cnt_packets": Out(32), "cnt_bad_opcode": Out(32), "cnt_malformed": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        w, nl = self._width, self._width // 8
        m.submodules.packer = packer = OctetPacker(w)
        wiring.connect(m, wiring.flipped(self.payload), packer.o)

        fire = self.i.valid & self.i.ready
        pos = Signal(17)
        cap = HeaderCapture(MAX_ROCE_HEADER, w, "bth").add(m, pos, self.i.p.data, fire)
        bth = BTH(cap.value(0, BTH_LEN))
        meta = self.i.p.meta

        # Per-opcode header length; the opcode is octet 0, in lane 0 of the first beat.
        placement = _ext_placement()
        hlen = Signal(range(MAX_ROCE_HEADER + 1))
        known = Signal()
        headers_only = Signal()
        with m.Switch(bth.opcode):
            for op, (_, end) in placement.items():
                with m.Case(op):
                    m.d.comb += [hlen.eq(end), known.eq(1), headers_only.eq(op in HEADERS_ONLY)]
            with m.Default():
                m.d.comb += [hlen.eq(BTH_LEN), known.eq(0)]

        total = Signal(17)
        m.d.comb += total.eq(meta.udp_length - 8)
        pad = bth.padcnt
        malformed = (total < hlen + pad + 4) | (headers_only & (total > hlen + pad + 4))
        pay_end = Signal(17)
        m.d.comb += pay_end.eq(total - 4 - pad)

        hdr_done = Signal()         # header record already produced for this packet
        pay_done = Signal()         # payload region already closed
        completing = ~hdr_done & ((pos + nl >= hlen) | self.i.p.last)
        ok = Signal()               # payload is forwarded for this packet
        ok_r = Signal()
        m.d.comb += ok.eq(Mux(hdr_done, ok_r, known & ~malformed))

        # Never read past the stream's end (a packet shorter than its UDP length).
        stream_end = pos + keep_count(self.i.p.keep)
        cut_end = Mux(self.i.p.last & (stream_end < pay_end), stream_end, pay_end)
        lo, n, reaches = lane_region(m, pos, hlen, cut_end, nl, "pl")
        feed = ok & ~pay_done
        m.d.comb += [
            packer.i.valid.eq(self.i.valid & feed & ~(completing & self.hdr.valid)),
            packer.i.p.data.eq(self.i.p.data),
            packer.i.p.lo.eq(lo), packer.i.p.n.eq(n),
            packer.i.p.last.eq(self.i.p.last | reaches),
        ]
        # Hold the beat that completes a header until the previous record has been taken.
        m.d.comb += self.i.ready.eq(Mux(feed, packer.i.ready, 1) &
                                    ~(completing & self.hdr.valid))

        # Header record.
        rec = Signal(RoceRxHeader)
        m.d.comb += [
            rec.bth.eq(cap.value(0, BTH_LEN)),
            rec.known_opcode.eq(known),
            rec.malformed.eq(malformed),
            rec.payload_len.eq(Mux(known & ~malformed, total - hlen - pad - 4, 0)),
            rec.meta.eq(meta),
        ]
        with m.Switch(bth.opcode):
            for op, (items, _) in placement.items():
                with m.Case(op):
                    for name, h, off in items:
                        m.d.comb += [getattr(rec, name).eq(cap.value(off, size_of(h))),
                                     getattr(rec, f"has_{name}").eq(1)]

        with m.If(self.hdr.valid & self.hdr.ready):
            m.d.sync += self.hdr.valid.eq(0)
        with m.If(fire):
            with m.If(completing):
                m.d.sync += [self.hdr.valid.eq(1), self.hdr.p.eq(rec), ok_r.eq(ok),
                             self.cnt_packets.eq(self.cnt_packets + 1)]
                with m.If(~known):
                    m.d.sync += self.cnt_bad_opcode.eq(self.cnt_bad_opcode + 1)
                with m.Elif(malformed):
                    m.d.sync += self.cnt_malformed.eq(self.cnt_malformed + 1)
            with m.If(self.i.p.last):
                m.d.sync += [pos.eq(0), hdr_done.eq(0), pay_done.eq(0)]
            with m.Else():
                m.d.sync += pos.eq(Mux(pos >= (1 << 16), pos, pos + nl))
                with m.If(completing):
                    m.d.sync += hdr_done.eq(1)
                with m.If(feed & reaches):
                    m.d.sync += pay_done.eq(1)
        return m


class RoceTxBuilder(wiring.Component):
    """Build BTH + extended headers + payload + pad from a header record and a payload stream.

    The extended headers sent are those EXT_HEADERS lists for ``bth.opcode`` (other record
    fields are ignored); an unknown opcode sends the BTH alone and is counted. ``bth.padcnt``
    is replaced by (−payload_len) mod 4 and zero pad octets are appended; ``meta.length`` is
    set to the whole BTH .. ICRC length. A record with ``payload_len`` = 0 takes no payload
    packet; otherwise exactly one payload packet is consumed (its length should equal
    ``payload_len``).

    Ports
    -----
    hdr : In(stream of :data:`RoceTxHeader`)
    payload : In(PacketStream(width))
    o : Out(stream of :func:`~hw.net.ip.roce_tx_layout`)
        BTH .. pad (no ICRC).
    cnt_packets, cnt_bad_opcode : Out(32)
    """

    def __init__(self, width):
        self._width = width
        super().__init__({
            "hdr": In(stream.Signature(RoceTxHeader)),
            "payload": In(PacketStream(width)),
            "o": Out(stream.Signature(roce_tx_layout(width))),
            "cnt_packets": Out(32), "cnt_bad_opcode": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        w, nl = self._width, self._width // 8
        m.submodules.packer = packer = OctetPacker(w, RoceTxMeta)
        wiring.connect(m, packer.o, wiring.flipped(self.o))
        rec = self.hdr.p
        placement = _ext_placement()
        pad = Signal(2)
        m.d.comb += pad.eq(-rec.payload_len)
        hlen = Signal(range(MAX_ROCE_HEADER + 1))
        known = Signal()
        octs = [Signal(8, name=f"txh{p}") for p in range(MAX_ROCE_HEADER)]
        bth = Signal(BTH)
        m.d.comb += [bth.eq(rec.bth), bth.padcnt.eq(pad)]
        for p, o in enumerate(octets_be(bth.as_value(), BTH_LEN)):
            m.d.comb += octs[p].eq(o)
        with m.Switch(rec.bth.opcode):
            for op, (items, end) in placement.items():
                with m.Case(op):
                    m.d.comb += [hlen.eq(end), known.eq(1)]
                    for name, h, off in items:
                        val = getattr(rec, name).as_value()
                        for k, o in enumerate(octets_be(val, size_of(h))):
                            m.d.comb += octs[off + k].eq(o)
            with m.Default():
                m.d.comb += [hlen.eq(BTH_LEN), known.eq(0)]
        meta = Signal(RoceTxMeta)
        m.d.comb += [meta.eq(rec.meta),
                     meta.length.eq(hlen + rec.payload_len + pad + 4)]
        m.d.comb += packer.i.p.side.eq(meta)

        n_hbeats = (MAX_ROCE_HEADER + nl - 1) // nl
        hidx = Signal(range(n_hbeats + 1))
        pad_sent = Signal(3)
        no_payload = rec.payload_len == 0

        def packet_done():
            # The packet's last octet went to the packer: the record is used up and counted.
            m.d.comb += self.hdr.ready.eq(1)
            m.d.sync += self.cnt_packets.eq(self.cnt_packets + 1)
            with m.If(~known):
                m.d.sync += self.cnt_bad_opcode.eq(self.cnt_bad_opcode + 1)
            m.next = "IDLE"

        with m.FSM(name="build"):
            with m.State("IDLE"):
                m.d.sync += [hidx.eq(0), pad_sent.eq(0)]
                with m.If(self.hdr.valid):
                    m.next = "HEADERS"
            with m.State("HEADERS"):
                chunk_end = (hidx + 1) * nl >= hlen
                with m.Switch(hidx):
                    for b in range(n_hbeats):
                        with m.Case(b):
                            seg = [octs[b * nl + j] if b * nl + j < MAX_ROCE_HEADER
                                   else Const(0, 8) for j in range(nl)]
                            m.d.comb += [packer.i.p.data.eq(Cat(*seg)),
                                         packer.i.p.n.eq(Mux(hlen - b * nl >= nl, nl,
                                                             hlen - b * nl))]
                m.d.comb += [packer.i.valid.eq(1), packer.i.p.lo.eq(0),
                             packer.i.p.last.eq(chunk_end & no_payload)]
                with m.If(packer.i.ready):
                    m.d.sync += hidx.eq(hidx + 1)
                    with m.If(chunk_end):
                        with m.If(no_payload):
                            packet_done()
                        with m.Else():
                            m.next = "PAYLOAD"
            with m.State("PAYLOAD"):
                packer.forward(m, self.payload, last=self.payload.p.last & (pad == 0))
                with m.If(self.payload.valid & self.payload.ready & self.payload.p.last):
                    with m.If(pad == 0):
                        packet_done()
                    with m.Else():
                        m.next = "PAD"
            with m.State("PAD"):
                left = pad - pad_sent
                k = Mux(left > nl, nl, left)
                m.d.comb += [packer.i.valid.eq(1), packer.i.p.data.eq(0),
                             packer.i.p.lo.eq(0), packer.i.p.n.eq(k),
                             packer.i.p.last.eq(left <= nl)]
                with m.If(packer.i.ready):
                    m.d.sync += pad_sent.eq(pad_sent + k)
                    with m.If(left <= nl):
                        packet_done()
        return m

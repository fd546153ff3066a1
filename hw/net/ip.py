# Ref: roce-layouts.md §1 (Ethernet/IPv4/UDP as rxe sends and checks them), §8 (ARP);
#      RFC 791 (IPv4 header checksum), RFC 768 (UDP); docs/softroce-vm.md.
"""Ethernet / IPv4 / UDP receive demultiplexer and transmit framer, width-parametric.

The width-generic octet helpers it uses with the other network blocks (octet slicing, header
capture, :class:`~hw.lib.octets.OctetPacker`) are in :mod:`hw.lib.octets`.

Conventions (see :mod:`hw.lib.stream`): lane 0 of ``data`` is the first octet on the wire.
A header value is the big-endian load of its octets, so the layouts of :mod:`hw.headers` apply.
"""

from amaranth import *
from amaranth.lib import data, stream, wiring
from amaranth.lib.wiring import In, Out

from hw.headers import (EthernetHeader, IPv4Header, UDPHeader, ETHERTYPE_ARP, ETHERTYPE_IPV4,
                        ROCE_UDP_PORT)
from hw.iface import counter_ports
from hw.lib.octets import HeaderCapture, OctetPacker, lane_region, octets_be
from hw.lib.stream import FrameStream, PacketStream, keep_count, packet_layout

__all__ = [
    "ones_sum", "ipv4_checksum", "RoceRxMeta", "RoceTxMeta", "roce_rx_layout",
    "roce_tx_layout", "EthIpRx", "EthIpTx", "ETH_IP_UDP_LEN", "IP_PROTO_UDP",
]

#: Octets of Ethernet II + IPv4 (no options) + UDP headers before the BTH.
ETH_IP_UDP_LEN = 14 + 20 + 8
IP_PROTO_UDP = 17
BROADCAST_MAC = (1 << 48) - 1


def ones_sum(words):
    """16-bit one's-complement sum (end-around carry) of a list of values: 16-bit words, or
    partial sums of them (the UDP link passes 28-bit ones)."""
    total = sum(words[1:], words[0])
    # Two folds are enough for any total below 2**32: the first leaves at most 0x1FFFE.
    fold = total[:16] + total[16:]
    return (fold[:16] + fold[16:])[:16]


def ipv4_checksum(header_value):
    """Checksum of a 20-octet IPv4 header value whose checksum field is zero."""
    words = [header_value[(9 - k) * 16:(10 - k) * 16] for k in range(10)]
    return ~ones_sum(words) & 0xFFFF


# --------------------------------------------------------------------------------------------
# Metadata and stream layouts
# --------------------------------------------------------------------------------------------

#: Receive sideband of a RoCE packet (held constant on every beat of the packet).
RoceRxMeta = data.StructLayout({
    "src_mac": 48,
    "src_ip": 32,
    "dst_ip": 32,
    "ip_id": 16,
    "ip_flags": 3,
    "tos": 8,
    "ttl": 8,
    "udp_src_port": 16,
    "udp_length": 16,     # UDP length: 8 + BTH .. ICRC
})

#: Transmit sideband of a RoCE packet (held constant on every beat of the packet).
RoceTxMeta = data.StructLayout({
    "dst_mac": 48,
    "dst_ip": 32,
    "udp_src_port": 16,
    "length": 16,         # octets BTH .. ICRC inclusive (UDP length - 8)
    "ip_id": 16,          # covered by the ICRC: must be known before the ICRC is computed
    "tos": 8,
})


def roce_rx_layout(width):
    """Payload layout of the receive RoCE stream: a packet stream plus :data:`RoceRxMeta`, and
    ``err`` on the last beat: the frame that carried the packet was bad (its FCS, length or
    the MAC's buffer; :func:`~hw.lib.stream.FrameStream`). The ICRC check drops such packets,
    the receive path's commit point (hw/net/icrc.py)."""
    return data.StructLayout({**dict(packet_layout(width).members), "meta": RoceRxMeta,
                              "err": 1})


def roce_tx_layout(width):
    """Payload layout of the transmit RoCE stream: a packet stream plus :data:`RoceTxMeta`."""
    return data.StructLayout({**dict(packet_layout(width).members), "meta": RoceTxMeta})


# --------------------------------------------------------------------------------------------
# Receive
# --------------------------------------------------------------------------------------------

class EthIpRx(wiring.Component):
    """Ethernet frame demultiplexer: ARP to one port, RoCEv2 (UDP 4791) to another.

    A RoCE packet leaves on ``roce`` starting at the BTH and trimmed to the UDP length (BTH ..
    ICRC inclusive; Ethernet padding removed), with :data:`RoceRxMeta` on every beat. An ARP
    frame leaves on ``arp`` as its first 42 octets (Ethernet header + ARP body), padding
    removed.

    The input may come cut-through (:func:`~hw.lib.stream.FrameStream`: the frame's verdict,
    ``err``, on its last beat). A RoCE packet's last beat therefore leaves only with the frame's
    last beat, carrying its ``err`` (a packet that ends before its frame, at Ethernet padding,
    has its last beat held until then); an ARP frame leaves only after a last beat without
    ``err``. The counters count the frames that end without ``err`` (the MAC counts the others).

    Everything else is dropped and counted by the first failing check, in this order:
    EtherType, destination MAC (ours; broadcast also for ARP), IPv4 format (version 4, IHL 5, no
    fragment), header checksum, destination IP, protocol UDP, UDP port 4791, lengths
    (UDP length >= 24, IPv4 total length = 20 + UDP length).

    Ports
    -----
    i : In(FrameStream(width))
        Frames, Ethernet header first, FCS already removed; ``err`` on a bad frame's last beat.
    roce : Out(stream of :func:`roce_rx_layout`)
    arp : Out(PacketStream(width))
    own_mac, own_ip : In
        Configuration.
    cnt_* : Out(32)
        Frame counters: ``roce``, ``arp``, and drop reasons ``ethertype``, ``mac``,
        ``ip_format``, ``checksum``, ``ip``, ``not_udp``, ``port``, ``length``, ``short``
        (frame ended inside the 42 header octets), plus ``truncated`` (RoCE frame shorter than
        its UDP length: forwarded, the ICRC check will reject it).
    """

    COUNTERS = ("roce", "arp", "ethertype", "mac", "ip_format", "checksum", "ip", "not_udp",
                "port", "length", "short", "truncated")

    def __init__(self, width):
        self._width = width
        members = {
            "i": In(FrameStream(width)),
            "roce": Out(stream.Signature(roce_rx_layout(width))),
            "arp": Out(PacketStream(width)),
            "own_mac": In(48),
            "own_ip": In(32),
            **counter_ports(self.COUNTERS),
        }
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        w, nl = self._width, self._width // 8
        n_hdr = ETH_IP_UDP_LEN
        # The packer's side data: the metadata, and the frame's verdict (taken with the last
        # input beat, so shown on the last output beat only).
        side = data.StructLayout({"meta": RoceRxMeta, "err": 1})
        m.submodules.packer = packer = OctetPacker(w, side)
        m.d.comb += [self.roce.valid.eq(packer.o.valid), packer.o.ready.eq(self.roce.ready),
                     self.roce.p.data.eq(packer.o.p.data), self.roce.p.keep.eq(packer.o.p.keep),
                     self.roce.p.last.eq(packer.o.p.last),
                     self.roce.p.meta.eq(packer.o.p.side.meta),
                     self.roce.p.err.eq(packer.o.p.side.err & packer.o.p.last)]

        pos = Signal(17)
        fire = self.i.valid & self.i.ready
        cap = HeaderCapture(n_hdr, w, "rxh").add(m, pos, self.i.p.data, fire)

        eth = EthernetHeader(cap.value(0, 14))
        ip = IPv4Header(cap.value(14, 20))
        udp = UDPHeader(cap.value(34, 8))
        ip_words = [cap.value(14 + 2 * k, 2) for k in range(10)]
        # The header checksum, registered at every beat: the decision beat comes at least one
        # beat after the one that brings the last IPv4 octet (asserted), so at the decision the
        # register holds the whole header's sum. The adder tree then ends in a flop instead of
        # running on into the decision, the metadata and the packer (the core clock's longest
        # path on the ECPIX-5 after the memory arbiter's was cut, hw/lib/membus.py).
        assert (n_hdr - 1) // nl > (14 + 20 - 1) // nl, "decision beat must follow the IPv4 header"
        csum_ok = Signal()
        with m.If(fire):
            m.d.sync += csum_ok.eq(ones_sum(ip_words) == 0xFFFF)

        # Per-frame state.
        # TAIL: the packet has ended before its frame (Ethernet padding); its last beat waits
        # in ``hold_*`` for the frame's last beat and verdict.
        HDR, PASS, DROP, TAIL = 0, 1, 2, 3
        mode = Signal(2)
        hold_data = Signal(w)
        hold_lo = Signal(range(nl + 1))
        hold_n = Signal(range(nl + 1))
        meta = Signal(RoceRxMeta)
        roce_end = Signal(17)              # frame octet position just after the ICRC
        arp_busy = Signal()
        arp_seen = Signal()
        arp_idx = Signal(range((n_hdr + nl - 1) // nl + 1))

        decision_beat = pos == ((n_hdr - 1) // nl) * nl
        is_arp = eth.ethertype == ETHERTYPE_ARP
        is_ip = eth.ethertype == ETHERTYPE_IPV4
        # One-hot over the decisions taken at the decision beat ("short" and "truncated" are
        # counted from the frame's end instead: bits for them would be constant-only).
        decisions = [c for c in self.COUNTERS if c not in ("short", "truncated")]
        reason = Signal(len(decisions))
        idx = {c: k for k, c in enumerate(decisions)}
        with m.If(is_arp):
            with m.If((eth.dst == self.own_mac) | (eth.dst == BROADCAST_MAC)):
                m.d.comb += reason[idx["arp"]].eq(1)
            with m.Else():
                m.d.comb += reason[idx["mac"]].eq(1)
        with m.Elif(~is_ip):
            m.d.comb += reason[idx["ethertype"]].eq(1)
        with m.Elif(eth.dst != self.own_mac):
            m.d.comb += reason[idx["mac"]].eq(1)
        with m.Elif((ip.version != 4) | (ip.ihl != 5) | ip.flags[0] |
                    (ip.fragment_offset != 0)):
            # flags[0] is MF: the 3-bit flags field is (reserved, DF, MF) from its MSB.
            m.d.comb += reason[idx["ip_format"]].eq(1)
        with m.Elif(~csum_ok):
            m.d.comb += reason[idx["checksum"]].eq(1)
        with m.Elif(ip.dst != self.own_ip):
            m.d.comb += reason[idx["ip"]].eq(1)
        with m.Elif(ip.protocol != IP_PROTO_UDP):
            m.d.comb += reason[idx["not_udp"]].eq(1)
        with m.Elif(udp.dst_port != ROCE_UDP_PORT):
            m.d.comb += reason[idx["port"]].eq(1)
        with m.Elif((udp.length < 8 + 12 + 4) | (ip.total_length != udp.length + 20)):
            m.d.comb += reason[idx["length"]].eq(1)
        with m.Else():
            m.d.comb += reason[idx["roce"]].eq(1)

        # RoCE octets of this beat: [42, 42 + UDP length - 8).
        now_end = Signal(17)
        m.d.comb += now_end.eq(Mux(mode != HDR, roce_end, n_hdr + udp.length - 8))
        # A frame shorter than its UDP length ends where its last beat's keep says.
        frame_end = pos + keep_count(self.i.p.keep)
        cut_end = Mux(self.i.p.last & (frame_end < now_end), frame_end, now_end)
        lo, n, reaches = lane_region(m, pos, n_hdr, cut_end, nl, "rr")
        pass_now = (mode == PASS) | ((mode == HDR) & decision_beat & reason[idx["roce"]])
        meta_now = Signal(RoceRxMeta)
        with m.If(mode != HDR):
            m.d.comb += meta_now.eq(meta)
        with m.Else():
            m.d.comb += [
                meta_now.src_mac.eq(eth.src), meta_now.src_ip.eq(ip.src),
                meta_now.dst_ip.eq(ip.dst), meta_now.ip_id.eq(ip.identification),
                meta_now.ip_flags.eq(ip.flags), meta_now.tos.eq(ip.tos),
                meta_now.ttl.eq(ip.ttl), meta_now.udp_src_port.eq(udp.src_port),
                meta_now.udp_length.eq(udp.length),
            ]
        # The packet's last beat goes with the frame's, which brings the verdict: a packet that
        # ends earlier (``hold``: only the shortest ones, at Ethernet padding) has that beat
        # held until then. (The packer cannot take an empty last beat later: it has already
        # sent out a last beat that filled a word, without ``last``.)
        hold = Signal()
        to_packer = Signal()
        tail = mode == TAIL
        m.d.comb += [
            hold.eq(pass_now & reaches & ~self.i.p.last),
            to_packer.eq((pass_now & ~hold) | (tail & self.i.p.last)),
            packer.i.valid.eq(self.i.valid & to_packer),
            packer.i.p.data.eq(Mux(tail, hold_data, self.i.p.data)),
            packer.i.p.lo.eq(Mux(tail, hold_lo, lo)),
            packer.i.p.n.eq(Mux(tail, hold_n, n)),
            packer.i.p.last.eq(self.i.p.last),
            packer.i.p.side.meta.eq(meta_now),
            packer.i.p.side.err.eq(self.i.p.err),
        ]
        # A new header may not overwrite the captured ARP frame before it has been sent.
        m.d.comb += self.i.ready.eq(
            Mux(to_packer, packer.i.ready, ~((mode == HDR) & arp_busy)))
        with m.If(fire & hold):
            m.d.sync += [hold_data.eq(self.i.p.data), hold_lo.eq(lo), hold_n.eq(n)]

        with m.If(fire):
            m.d.sync += pos.eq(Mux(self.i.p.last, 0, Mux(pos >= (1 << 16), pos, pos + nl)))
            with m.If(self.i.p.last):
                m.d.sync += mode.eq(HDR)
            with m.Elif(hold):
                m.d.sync += mode.eq(TAIL)
            with m.Elif((mode == HDR) & decision_beat):
                m.d.sync += mode.eq(Mux(reason[idx["roce"]], PASS, DROP))
            with m.If((mode == HDR) & decision_beat):
                m.d.sync += [meta.eq(meta_now), roce_end.eq(now_end)]
            # An ARP frame is answered once it has ended well (``arp_seen``: its headers said
            # ARP; its last beat may be the decision beat).
            arp_now = ((mode == HDR) & decision_beat & reason[idx["arp"]]) | arp_seen
            with m.If(self.i.p.last):
                m.d.sync += arp_seen.eq(0)
                with m.If(arp_now & ~self.i.p.err):
                    m.d.sync += [arp_busy.eq(1), arp_idx.eq(0)]
            with m.Elif((mode == HDR) & decision_beat & reason[idx["arp"]]):
                m.d.sync += arp_seen.eq(1)

        # Counters: one per decided frame; "short" for frames ending inside the headers;
        # "truncated" for RoCE frames ending before their UDP length. Each is counted at the
        # frame's last beat and only without ``err`` (the MAC counts a bad frame), so they
        # read the same whether the MAC cuts through or not; ``pend`` keeps the decision.
        counters = {c: getattr(self, f"cnt_{c}") for c in self.COUNTERS}
        decided = fire & (mode == HDR) & decision_beat
        pend = Signal(len(decisions))
        with m.If(fire & self.i.p.last):
            m.d.sync += pend.eq(0)
        with m.Elif(decided):
            m.d.sync += pend.eq(reason)
        ended_ok = fire & self.i.p.last & ~self.i.p.err
        counted = Mux(decided, reason, pend)
        # The increments go through a flop (``bump``), a cycle before the counters add them:
        # ``fire`` comes from the receiver's ready, at the end of the core's longest routes on
        # the ECPIX-5 (25.3 ns at seed 4 on 5fb7c1d's netlist: the handshakes of the raw queue and
        # the UDP link, then a 32-bit counter's clock enable across the die).
        bump = Signal(len(decisions) + 2)
        m.d.sync += bump.eq(Cat(*[ended_ok & counted[idx[c]] for c in decisions],
                                ended_ok & (mode == HDR) & ~decision_beat,
                                ended_ok & pass_now & (frame_end < now_end)))
        for k, c in enumerate([*decisions, "short", "truncated"]):
            with m.If(bump[k]):
                m.d.sync += counters[c].eq(counters[c] + 1)

        # ARP frame out of the capture register (42 octets = Ethernet + ARP body exactly).
        n_arp_beats = (n_hdr + nl - 1) // nl
        with m.Switch(arp_idx):
            for b in range(n_arp_beats):
                with m.Case(b):
                    octs = [cap.reg[b * nl + j] if b * nl + j < n_hdr else Const(0, 8)
                            for j in range(nl)]
                    m.d.comb += [
                        self.arp.p.data.eq(Cat(*octs)),
                        self.arp.p.keep.eq(Cat(*[Const(b * nl + j < n_hdr, 1)
                                                 for j in range(nl)])),
                        self.arp.p.last.eq(b == n_arp_beats - 1),
                    ]
        m.d.comb += self.arp.valid.eq(arp_busy)
        with m.If(self.arp.valid & self.arp.ready):
            m.d.sync += arp_idx.eq(arp_idx + 1)
            with m.If(self.arp.p.last):
                m.d.sync += arp_busy.eq(0)
        return m


# --------------------------------------------------------------------------------------------
# Transmit
# --------------------------------------------------------------------------------------------

class EthIpTx(wiring.Component):
    """Frame a RoCE packet in Ethernet + IPv4 + UDP; merge ARP frames.

    The IPv4 header is built as rxe builds it (roce-layouts.md §1.3): version 4, IHL 5, TOS and
    identification from the metadata, DF set, TTL 64, protocol 17, a correct header checksum,
    source = ``own_ip``. UDP: source port from the metadata, destination 4791, checksum 0.
    Ethernet: destination from the metadata, source ``own_mac``, EtherType 0x0800. ARP frames
    (complete, Ethernet header included) pass unchanged; the arbiter switches only between
    frames and prefers ARP.

    Ports
    -----
    roce : In(stream of :func:`roce_tx_layout`)
        BTH .. ICRC (``meta.length`` octets), metadata constant over the packet.
    arp : In(PacketStream(width))
    o : Out(PacketStream(width))
    own_mac, own_ip : In
    cnt_roce, cnt_arp : Out(32)
    """

    def __init__(self, width):
        self._width = width
        super().__init__({
            "roce": In(stream.Signature(roce_tx_layout(width))),
            "arp": In(PacketStream(width)),
            "o": Out(PacketStream(width)),
            "own_mac": In(48),
            "own_ip": In(32),
            "cnt_roce": Out(32),
            "cnt_arp": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        w, nl = self._width, self._width // 8
        n_hdr = ETH_IP_UDP_LEN
        n_hdr_beats = (n_hdr + nl - 1) // nl
        m.submodules.packer = packer = OctetPacker(w)
        m.d.comb += [
            self.o.valid.eq(packer.o.valid),
            self.o.p.eq(packer.o.p),
            packer.o.ready.eq(self.o.ready),
        ]

        meta = self.roce.p.meta
        eth = Signal(EthernetHeader)
        ip = Signal(IPv4Header)
        udp = Signal(UDPHeader)
        ip_nocsum = Signal(IPv4Header)
        m.d.comb += [
            eth.dst.eq(meta.dst_mac), eth.src.eq(self.own_mac), eth.ethertype.eq(ETHERTYPE_IPV4),
            ip_nocsum.version.eq(4), ip_nocsum.ihl.eq(5), ip_nocsum.tos.eq(meta.tos),
            ip_nocsum.total_length.eq(meta.length + 28),
            ip_nocsum.identification.eq(meta.ip_id),
            ip_nocsum.flags.eq(0b010), ip_nocsum.fragment_offset.eq(0),
            ip_nocsum.ttl.eq(64), ip_nocsum.protocol.eq(IP_PROTO_UDP),
            ip_nocsum.src.eq(self.own_ip), ip_nocsum.dst.eq(meta.dst_ip),
            ip.eq(ip_nocsum),
            ip.checksum.eq(ipv4_checksum(ip_nocsum.as_value())),
            udp.src_port.eq(meta.udp_src_port), udp.dst_port.eq(ROCE_UDP_PORT),
            udp.length.eq(meta.length + 8), udp.checksum.eq(0),
        ]
        hdr = (octets_be(eth.as_value(), 14) + octets_be(ip.as_value(), 20)
               + octets_be(udp.as_value(), 8))

        def forward_frame(s, count):
            # Pass a whole frame from s through the packer; count it after its last beat.
            packer.forward(m, s)
            with m.If(s.valid & s.ready & s.p.last):
                m.d.sync += count.eq(count + 1)
                m.next = "IDLE"

        hidx = Signal(range(n_hdr_beats + 1))
        with m.FSM(name="tx"):
            with m.State("IDLE"):
                with m.If(self.arp.valid):
                    m.next = "ARP_FRAME"
                with m.Elif(self.roce.valid):
                    m.d.sync += hidx.eq(0)
                    m.next = "FRAME_HEADER"
            with m.State("ARP_FRAME"):
                forward_frame(self.arp, self.cnt_arp)
            with m.State("FRAME_HEADER"):
                with m.Switch(hidx):
                    for b in range(n_hdr_beats):
                        with m.Case(b):
                            octs = [hdr[b * nl + j] if b * nl + j < n_hdr else Const(0, 8)
                                    for j in range(nl)]
                            m.d.comb += [packer.i.p.data.eq(Cat(*octs)),
                                         packer.i.p.n.eq(min(nl, n_hdr - b * nl))]
                m.d.comb += [packer.i.valid.eq(1), packer.i.p.lo.eq(0), packer.i.p.last.eq(0)]
                with m.If(packer.i.ready):
                    m.d.sync += hidx.eq(hidx + 1)
                    with m.If(hidx == n_hdr_beats - 1):
                        m.next = "ROCE_PACKET"
            with m.State("ROCE_PACKET"):
                forward_frame(self.roce, self.cnt_roce)
        return m

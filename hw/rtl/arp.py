# Ref: roce-layouts.md §8 (what the endpoint must answer); RFC 826 (ARP); hw/headers.py ArpPacket.
"""ARP responder: answer "who has <own IP>" with "<own IP> is at <own MAC>".

The transport keeps the peer's MAC in its QP context, so no ARP cache is kept here.
"""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.headers import ArpPacket, EthernetHeader, ETHERTYPE_ARP, ETHERTYPE_IPV4
from hw.rtl.ip import BROADCAST_MAC, HeaderCapture, octets_be
from hw.rtl.stream import PacketStream

__all__ = ["ArpResponder", "ARP_FRAME_LEN"]

#: Ethernet header + ARP body for IPv4 over Ethernet (no padding, no FCS).
ARP_FRAME_LEN = 14 + 28
ARP_REQUEST = 1
ARP_REPLY = 2


class ArpResponder(wiring.Component):
    """Answer ARP requests for our IPv4 address.

    A request is answered when the frame holds at least 42 octets, its Ethernet destination is
    broadcast or ``own_mac``, EtherType 0x0806, hardware type 1 (Ethernet), protocol 0x0800,
    sizes 6/4, operation 1 and target IP ``own_ip``. The reply goes to the asker's MAC: sender
    = (``own_mac``, ``own_ip``), target = the asker's (MAC, IP). It is 42 octets: the MAC pads
    it to 60 and appends the FCS. Every other frame is ignored and counted.

    Ports
    -----
    i : In(PacketStream(width))
        Ethernet frames (header included).
    o : Out(PacketStream(width))
        ARP replies.
    own_mac, own_ip : In
    cnt_answered, cnt_ignored : Out(32)
    """

    def __init__(self, width):
        self._width = width
        super().__init__({
            "i": In(PacketStream(width)),
            "o": Out(PacketStream(width)),
            "own_mac": In(48),
            "own_ip": In(32),
            "cnt_answered": Out(32),
            "cnt_ignored": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        nl = self._width // 8
        fire = self.i.valid & self.i.ready
        pos = Signal(17)
        cap = HeaderCapture(ARP_FRAME_LEN, self._width, "arq").add(m, pos, self.i.p.data, fire)
        with m.If(fire):
            m.d.sync += pos.eq(Mux(self.i.p.last, 0, Mux(pos >= (1 << 16), pos, pos + nl)))

        eth = EthernetHeader(cap.value(0, 14))
        req = ArpPacket(cap.value(14, 28))
        long_enough = pos + nl >= ARP_FRAME_LEN
        answer = (long_enough & ((eth.dst == BROADCAST_MAC) | (eth.dst == self.own_mac))
                  & (eth.ethertype == ETHERTYPE_ARP) & (req.htype == 1)
                  & (req.ptype == ETHERTYPE_IPV4) & (req.hlen == 6) & (req.plen == 4)
                  & (req.oper == ARP_REQUEST) & (req.tpa == self.own_ip))

        # The reply, latched when the request's last beat is accepted.
        rep_eth = Signal(EthernetHeader)
        rep = Signal(ArpPacket)
        busy = Signal()
        n_beats = (ARP_FRAME_LEN + nl - 1) // nl
        idx = Signal(range(n_beats + 1))
        m.d.comb += self.i.ready.eq(~busy)
        with m.If(fire & self.i.p.last):
            with m.If(answer):
                m.d.sync += [
                    busy.eq(1), idx.eq(0),
                    rep_eth.dst.eq(req.sha), rep_eth.src.eq(self.own_mac),
                    rep_eth.ethertype.eq(ETHERTYPE_ARP),
                    rep.htype.eq(1), rep.ptype.eq(ETHERTYPE_IPV4), rep.hlen.eq(6),
                    rep.plen.eq(4), rep.oper.eq(ARP_REPLY),
                    rep.sha.eq(self.own_mac), rep.spa.eq(self.own_ip),
                    rep.tha.eq(req.sha), rep.tpa.eq(req.spa),
                    self.cnt_answered.eq(self.cnt_answered + 1),
                ]
            with m.Else():
                m.d.sync += self.cnt_ignored.eq(self.cnt_ignored + 1)

        octs = octets_be(rep_eth.as_value(), 14) + octets_be(rep.as_value(), 28)
        with m.Switch(idx):
            for b in range(n_beats):
                with m.Case(b):
                    seg = [octs[b * nl + j] if b * nl + j < ARP_FRAME_LEN else Const(0, 8)
                           for j in range(nl)]
                    m.d.comb += [
                        self.o.p.data.eq(Cat(*seg)),
                        self.o.p.keep.eq(Cat(*[Const(b * nl + j < ARP_FRAME_LEN, 1)
                                               for j in range(nl)])),
                        self.o.p.last.eq(b == n_beats - 1),
                    ]
        m.d.comb += self.o.valid.eq(busy)
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += idx.eq(idx + 1)
            with m.If(self.o.p.last):
                m.d.sync += busy.eq(0)
        return m

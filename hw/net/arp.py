# Ref: roce-layouts.md §8 (what the endpoint must answer); RFC 826 (ARP); hw/headers.py ArpPacket.
"""ARP responder: answer "who has <own IP>" with "<own IP> is at <own MAC>".

The transport keeps the peer's MAC in its QP context, so no ARP cache is kept here.

Timing structure (the block sits in the 125 MHz GMII ``sync`` domain at width 8): the beat
position is a one-hot register; the expected octet of each lane for the coming beat is
registered ahead of it, so each accepted beat costs one 8-bit compare per lane folded into
per-check "still matching" flags; only the asker's MAC and IP are stored; the decision, the reply
load and the counters happen in one cycle after the frame's last beat, from registers only.
"""

from amaranth import *
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from hw.headers import ArpPacket, EthernetHeader, ETHERTYPE_ARP, ETHERTYPE_IPV4, wire_fields
from hw.lib.octets import octets_be
from hw.lib.stream import PacketStream

__all__ = ["ArpResponder", "ARP_FRAME_LEN"]

#: Ethernet header + ARP body for IPv4 over Ethernet (no padding, no FCS).
ARP_FRAME_LEN = 14 + 28
ARP_REQUEST = 1
ARP_REPLY = 2
_ETH_LEN = 14


def _one_hot_select(pairs):
    """OR of ``value & sel`` over ``(sel, value)`` pairs whose selects are one-hot (or none)."""
    out = Const(0, 8)
    for sel, value in pairs:
        out = out | (sel.replicate(8) & value)
    return out


def _octets(struct, base, name):
    """Frame octet positions of field ``name`` of ``struct`` placed at octet ``base``."""
    for fname, off, bits, _ in wire_fields(struct):
        if fname == name:
            return list(range(base + off, base + off + bits // 8))
    raise KeyError(name)


class ArpResponder(wiring.Component):
    """Answer ARP requests for our IPv4 address.

    A request is answered when the frame holds at least 42 octets (counted in whole beats, as
    the frame's beats reach octet 41), its Ethernet destination is broadcast or ``own_mac``,
    EtherType 0x0806, hardware type 1 (Ethernet), protocol 0x0800, sizes 6/4, operation 1 and
    target IP ``own_ip``. The reply goes to the asker's MAC: sender = (``own_mac``,
    ``own_ip``), target = the asker's (MAC, IP). It is 42 octets: the MAC pads it to 60 and
    appends the FCS. Every other frame is ignored and counted.

    Flow: the cycle after a frame's last beat is the decision cycle (input not ready); the
    counters move and the reply (if any) starts in the cycle after it. Input is not accepted
    while a reply is being sent, nor in the first cycle after reset.

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
        n_beats = (ARP_FRAME_LEN + nl - 1) // nl      # beats holding the 42 header octets
        beat = [self.i.p.data[j * 8:(j + 1) * 8] for j in range(nl)]

        # Frame end -> one decision cycle (``pending``, input held off) -> reply or nothing.
        # ``primed`` holds the input off for the first cycle after reset, until the expected-
        # octet registers below have been loaded once.
        primed = Signal()
        pending = Signal()
        busy = Signal()
        m.d.sync += primed.eq(1)
        m.d.comb += self.i.ready.eq(primed & ~pending & ~busy)
        fire = self.i.valid & self.i.ready
        m.d.sync += pending.eq(fire & self.i.p.last)

        # One-hot beat position: ph[b] = the next beat accepted is beat b of its frame;
        # ph[n_beats] = past the header (saturates). Replaces a wide octet counter and its
        # compares.
        ph = Signal(n_beats + 1, init=1)
        ph_next = Signal.like(ph)
        m.d.comb += ph_next.eq(ph)
        with m.If(fire):
            with m.If(self.i.p.last):
                m.d.comb += ph_next.eq(1)
            with m.Else():
                m.d.comb += ph_next.eq(Cat(Const(0, 1), ph[:n_beats - 1],
                                           ph[n_beats - 1] | ph[n_beats]))
        m.d.sync += ph.eq(ph_next)

        # What each header octet must be: constants, our IP (target IP) and, for the
        # destination MAC, broadcast or our MAC.
        A = _ETH_LEN
        want = {}
        for p, o in zip(_octets(EthernetHeader, 0, "ethertype"),
                        octets_be(Const(ETHERTYPE_ARP, 16), 2)):
            want[p] = o
        for name, value, bits in (("htype", 1, 16), ("ptype", ETHERTYPE_IPV4, 16),
                                  ("hlen", 6, 8), ("plen", 4, 8), ("oper", ARP_REQUEST, 16)):
            for p, o in zip(_octets(ArpPacket, A, name), octets_be(Const(value, bits), bits // 8)):
                want[p] = o
        for p, o in zip(_octets(ArpPacket, A, "tpa"), octets_be(self.own_ip, 4)):
            want[p] = o
        dst = _octets(EthernetHeader, 0, "dst")
        own_mac_oct = dict(zip(dst, octets_be(self.own_mac, 6)))
        checks = {"rest": want, "bcast": {p: Const(0xFF, 8) for p in dst}, "own": own_mac_oct}

        # Per lane and check, the expected octet of the coming beat and whether it is checked,
        # registered from ``ph_next`` every cycle: the compare on the data path is then one
        # 8-bit equality against a register.
        ok = {}
        for key, table in checks.items():
            ok[key] = Signal(init=1, name=f"ok_{key}")   # all accepted beats matched so far
            match = []
            for j in range(nl):
                sel = [(b, b * nl + j) for b in range(n_beats) if b * nl + j in table]
                if not sel:
                    continue
                exp = Signal(8, name=f"exp_{key}{j}")
                chk = Signal(name=f"chk_{key}{j}")
                m.d.sync += [
                    exp.eq(_one_hot_select([(ph_next[b], table[p]) for b, p in sel])),
                    chk.eq(Cat(*[ph_next[b] for b, _ in sel]).any()),
                ]
                match.append(~chk | (beat[j] == exp))
            with m.If(pending):
                m.d.sync += ok[key].eq(1)
            with m.Elif(fire):
                m.d.sync += ok[key].eq(ok[key] & Cat(*match).all())
        # The frame reached octet 41 (in whole beats) if its last beat was beat n_beats - 1 or
        # later (ph says so while that beat is accepted; it is reset right after, so remember).
        long_enough = Signal()
        with m.If(fire & self.i.p.last):
            m.d.sync += long_enough.eq(ph[n_beats - 1] | ph[n_beats])
        answer = long_enough & (ok["bcast"] | ok["own"]) & ok["rest"]

        # Keep the asker's MAC and IP (the reply is built in the decision cycle, from
        # registers only).
        asker = {}
        for p in _octets(ArpPacket, A, "sha") + _octets(ArpPacket, A, "spa"):
            b, j = divmod(p, nl)
            reg = Signal(8, name=f"asker{p}")
            with m.If(fire & ph[b]):
                m.d.sync += reg.eq(beat[j])
            asker[p] = reg
        sha = [asker[p] for p in _octets(ArpPacket, A, "sha")]
        spa = [asker[p] for p in _octets(ArpPacket, A, "spa")]

        # Reply octets in wire order.
        rep_eth = Signal(EthernetHeader)
        rep = Signal(ArpPacket)
        m.d.comb += [
            rep_eth.dst.eq(Cat(*reversed(sha))), rep_eth.src.eq(self.own_mac),
            rep_eth.ethertype.eq(ETHERTYPE_ARP),
            rep.htype.eq(1), rep.ptype.eq(ETHERTYPE_IPV4), rep.hlen.eq(6),
            rep.plen.eq(4), rep.oper.eq(ARP_REPLY),
            rep.sha.eq(self.own_mac), rep.spa.eq(self.own_ip),
            rep.tha.eq(Cat(*reversed(sha))), rep.tpa.eq(Cat(*reversed(spa))),
        ]
        octs = octets_be(rep_eth.as_value(), _ETH_LEN) + octets_be(rep.as_value(), 28)
        octs += [Const(0, 8)] * (n_beats * nl - ARP_FRAME_LEN)

        # Output: a shift register loaded in every decision cycle (the input is held off until
        # the reply is out, so it never overwrites a reply in flight); ``busy`` says whether to
        # send it.
        sr = Signal(8 * nl * n_beats)
        left = Signal(range(n_beats), init=n_beats - 1)  # beats after the one on the output
        m.d.comb += [
            self.o.valid.eq(busy),
            self.o.p.data.eq(sr[:8 * nl]),
            self.o.p.last.eq(left == 0),
        ]
        tail = ARP_FRAME_LEN - (n_beats - 1) * nl
        m.d.comb += self.o.p.keep.eq(Mux(left == 0, (1 << tail) - 1, (1 << nl) - 1))
        with m.If(pending):
            m.d.sync += [sr.eq(Cat(*octs)), left.eq(n_beats - 1), busy.eq(answer)]
        with m.If(self.o.valid & self.o.ready):
            m.d.sync += [sr.eq(sr >> (8 * nl)), left.eq(left - 1)]
            with m.If(self.o.p.last):
                m.d.sync += busy.eq(0)

        # The counters count the decision, made from registers only.
        with m.If(pending & answer):
            m.d.sync += self.cnt_answered.eq(self.cnt_answered + 1)
        with m.If(pending & ~answer):
            m.d.sync += self.cnt_ignored.eq(self.cnt_ignored + 1)
        return m

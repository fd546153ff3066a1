# Ref: issue 23 (the UDP host-link wire format and the target's rules); RFC 768 (UDP: header,
#      checksum over the pseudo-header, 0 = no checksum, a computed 0 is sent as 0xFFFF);
#      RFC 791 §3.1 (IPv4 header, header checksum); RFC 1071 (the Internet checksum: 16-bit
#      one's-complement sum, end-around carry, an odd last octet padded with zero);
#      hw/target/hostlink.py (the frames carried, HostLinkEngine); host/udplink.py (host side).
"""UDP host link: the host-link frames of :mod:`hw.target.hostlink` over the target's Ethernet.

:class:`UdpHostLink` is a bus master like :class:`~hw.target.hostlink.HostLinkUart`, fed from
UDP datagrams instead of a 115,200-baud UART, many frames per datagram; the frames are run by
the same :class:`~hw.target.hostlink.HostLinkEngine`.

Wire format (UDP payload, both ways; the target listens on :data:`HOSTLINK_UDP_PORT`)
-------------------------------------------------------------------------------------
::

    0..1  magic 0x4B 0x48 ("KH")
    2     version 1
    3     type: 0 request, 1 response, 2 sync request, 3 sync response
    4..7  seq, u32 big-endian
    8..   request: one or more host-link request frames (0xA5 ...), back to back;
          response: the response frames (0x5A ...), one per request frame, in order;
          sync request: empty; sync response: 4 octets, the next sequence number expected.

Rules (a frame is counted once, by the first rule it fails)
-----------------------------------------------------------
1. ``ignored``: not IPv4 (version 4, IHL 5, unfragmented) / UDP to the target's MAC
   (``own_mac``) and IP (``own_ip``) and UDP port 19272, or shorter than its headers.
2. ``disabled``: the link is not enabled (``ctrl`` bit 0; reset value 0).
3. ``bad_src``: source MAC, IP or UDP port is not the configured host's.
4. ``bad_csum``: wrong IPv4 header checksum.
5. ``malformed``: IPv4 total length is not 20 + UDP length, the frame is shorter than its UDP
   length (truncated), or the payload is not 8..1472 octets.
6. ``bad_csum``: UDP checksum 0 (absent) or wrong.
7. ``malformed``: magic, version or type wrong (only requests and sync requests are taken), a
   sync request with a body, a request without one, request frames that do not follow each
   other exactly (each must start with 0xA5; its length is given by its command and count:
   :func:`~hw.target.hostlink.carries_data`), or a longest possible response (every read
   returning ``count`` words) longer than 1472 octets.
8. Sync request: answered with ``expected``, nothing executed (``sync``).
9. Request, ``seq == expected``: every frame executed in order, the response kept,
   ``expected`` advanced (``executed``); ``seq == expected - 1`` with a kept response: the kept
   response again, nothing executed (``duplicate``); any other seq: dropped (``bad_seq``).

Nothing of a datagram is executed before rules 1-7 have passed: the checksum and the frame
structure are known only at its end, so a datagram is stored first and run afterwards.
A datagram that arrives while the store is full is dropped (``overrun``; the host
retransmits). Responses go to the configured host MAC / IP / UDP port from ``own_mac`` /
``own_ip`` / 19272, with the request's seq, IPv4 DF, TTL 64, identification 0 and both
checksums; the MAC pads short frames.

Structure
---------
::

    i (whole frames) -> UdpLinkRx: header checks and captures at fixed beats and lanes, both
                        checksums (one adder tree per beat), frame walker, PacketFifo (the
                        frame's beats from octet 42's, as received; commit at the end / discard)
        -> executor: seq rules; body octets (from frame octet 50) -> HostLinkEngine -> bus
                     response octets -> response RAM, where they go on the wire (kept for
                     duplicates)
        -> UdpLinkTx: checksums (a word a cycle); Ethernet / IPv4 / UDP / KH header beats,
                      then the response RAM's words -> o

Every header field is at a fixed frame octet (IPv4 without options), so at a fixed beat and
lane: no octet realignment anywhere. A datagram costs the transmit side 13 cycles of checksum
before its first beat.

``i`` is always ready, so the endpoint can sit on a tap of the receive stream (as the raw frame
queues do) and never holds up the rest of the target.

Registers (``regs``, ``Space.REG``, byte offsets from ``base``, :data:`REG_UDPLINK` by default;
:data:`UDPLINK_REGS`): ``id`` (ro, :data:`UDPLINK_ID`), ``ctrl`` (rw, bit 0 enable),
``host_mac_hi`` (rw, MAC bits 47..32), ``host_mac_lo`` (rw, bits 31..0), ``host_ip`` (rw),
``host_port`` (rw, 16 bits), ``expected`` (ro); the counters (ro) from
:data:`UDPLINK_COUNTER_BASE`, four octets apart, in :data:`UDPLINK_COUNTERS` order. The engine's
``STATUS`` command reports frames executed, CRC errors, malformed datagrams and bus errors.
"""

from types import SimpleNamespace

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hw.headers import ETHERTYPE_IPV4, EthernetHeader, IPv4Header, UDPHeader
from hw.iface import REG_UDPLINK, HostBusSignature, counter_ports
from hw.lib.fifo import PacketFifo
from hw.lib.octets import be_value, lanes, octets_be
from hw.lib.stream import FrameStream, PacketStream, keep_count, packet_layout
from hw.net.ip import IP_PROTO_UDP
from hw.target.hostlink import (SOF_REQUEST, HostLinkEngine, carries_data,
                                response_words_max)

__all__ = ["UdpHostLink", "UdpLinkRx", "UdpLinkTx", "HostBusArbiter", "HostBusRegister", "HOSTLINK_UDP_PORT",
           "MAGIC", "VERSION", "HEADER", "MAX_PAYLOAD", "T_REQUEST", "T_RESPONSE", "T_SYNC",
           "T_SYNC_RESPONSE", "UDPLINK_ID", "UDPLINK_REGS", "UDPLINK_REG_DOC", "UDPLINK_COUNTER_BASE",
           "UDPLINK_COUNTERS", "REG_UDPLINK", "stored_layout"]

#: UDP port of the endpoint ("KH").
HOSTLINK_UDP_PORT = 0x4B48
MAGIC = 0x4B48
VERSION = 1
#: Octets of the datagram header (magic, version, type, seq).
HEADER = 8
#: Largest UDP payload either way (1500-octet MTU - 20 IPv4 - 8 UDP).
MAX_PAYLOAD = 1472
T_REQUEST, T_RESPONSE, T_SYNC, T_SYNC_RESPONSE = 0, 1, 2, 3

#: ``id`` register value: "KH", version 1.
UDPLINK_ID = (MAGIC << 16) | VERSION
UDPLINK_REGS = {"id": 0x00, "ctrl": 0x04, "host_mac_hi": 0x08, "host_mac_lo": 0x0C,
                "host_ip": 0x10, "host_port": 0x14, "expected": 0x18}
#: Access and meaning of each register (docs/registers.md is rendered from these).
UDPLINK_REG_DOC = {
    "id": ("R", "0x4B480001: \"KH\", version 1"),
    "ctrl": ("RW", "bit 0: enable (reset 0: every datagram is dropped, `disabled`)"),
    "host_mac_hi": ("RW", "the host's MAC, bits 47..32 (16 bits)"),
    "host_mac_lo": ("RW", "the host's MAC, bits 31..0"),
    "host_ip": ("RW", "the host's IPv4 address"),
    "host_port": ("RW", "the host's UDP port (16 bits): datagrams only from it, answers to it"),
    "expected": ("R", "the sequence number the next request must carry"),
}
UDPLINK_COUNTER_BASE = 0x40
#: Counter order from UDPLINK_COUNTER_BASE: the receive checks (:attr:`UdpLinkRx.COUNTERS`),
#: the executor's outcomes, datagrams sent, and the engine's counters.
UDPLINK_COUNTERS = ("ignored", "disabled", "bad_src", "bad_csum", "malformed", "overrun",
                    "executed", "duplicate", "bad_seq", "sync", "tx_datagrams",
                    "frames_ok", "crc_errors", "bus_errors")

_ETH, _IP, _UDP = 14, 20, 8
_UDP_AT = _ETH + _IP                 # 34: first octet of the UDP header
_KH_AT = _UDP_AT + _UDP              # 42: first octet of the UDP payload (the KH header)
_SEG_AT = _UDP_AT + 6               # 40: from here, the UDP length tells the lanes inside
_CAPTURE = _KH_AT + HEADER           # 50: the end of the KH header, the body's first octet
_BODY_MAX = MAX_PAYLOAD - HEADER     # 1464 octets of frames at most, either way
_SUM_BITS = 28                       # one's-complement partial sums of up to 1480 octets

# Header verdicts of the receive side, in rule order; PASS = every header rule passed.
_IGNORED, _DISABLED, _BAD_SRC, _BAD_IP_CSUM, _PASS = range(5)


def _check_width(width):
    if width not in (8, 16, 32, 64):
        raise ValueError(f"datapath width {width} is not 8, 16, 32 or 64 (a beat must hold at "
                         f"most one host-link frame start: frames are 8 octets or more)")


_STORED_SIDE = data.StructLayout({"sync": 1, "seq": 32})


def stored_layout(width):
    """A stored datagram (frame octets from the beat holding octet 42 to the UDP end, as
    received: the KH header at lane ``42 % (width/8)``, then the frames) and its side data: a
    sync request or a request, and its seq."""
    return data.StructLayout({**dict(packet_layout(width).members), "side": _STORED_SIDE})


def _fold16(n):
    """A constant's 16-bit one's-complement sum (end-around carry)."""
    while n >> 16:
        n = (n & 0xFFFF) + (n >> 16)
    return n


def _words16(value, n):
    """The ``n`` big-endian 16-bit words of a ``16 * n``-bit value, first on the wire first."""
    return [value[16 * (n - 1 - k):16 * (n - k)] for k in range(n)]


# --------------------------------------------------------------------------------------------
# Receive: checks, store, frame walker
# --------------------------------------------------------------------------------------------

class UdpLinkRx(wiring.Component):
    """Validate host-link datagrams (rules 1-7 of the module docstring) and store the good ones.

    Every header field sits at a fixed frame octet (IHL 5), hence at a fixed beat and lane at
    any width: each field is compared or captured in the beat that carries it, nothing else of
    the header is kept. Per frame beat:

    - rules 1-4: the octets of the addresses, ports, EtherType, version, fragment fields and
      protocol are compared where they pass, into sticky mismatch flags; the verdict is taken
      at the beat holding octet 41 (the frame must reach it: else ``ignored``);
    - the one's-complement sums (RFC 1071): one adder tree over the beat's 16-bit words, into
      one accumulator: words 14..25, then (restarted at 26, with the UDP length word counted
      twice for the pseudo-header) words 26 .. UDP end; the IPv4 header sum (14..33) is taken
      at octet 34, the UDP sum (source and destination address .. UDP end, + UDP length) is
      the accumulator after the last beat, short of the protocol number (17);
    - the UDP end, from the UDP length: the beats before the one holding it (counted down)
      and its lane; hence the lanes inside the segment, the datagram's last beat, truncation;
    - the frame walker (rule 7) follows the request frames: a frame's head (start octet,
      command, count) is complete in the beat holding its count octet; one head per beat (a
      frame is 8 octets or more), read through a window of the preceding beats;
    - from the beat holding octet 42 to the UDP end the frame's beats go into a
      :class:`~hw.lib.fifo.PacketFifo` as they are (no realignment: the KH header starts at
      lane ``42 % (width/8)`` of the first stored beat), while rules 1-4 pass.

    The cycle after the last beat decides (rules 5-7, from registers only): the datagram is
    committed with its side data, or discarded (a failed rule, a broken frame structure, no
    room: ``overrun``). The next frame may start in that cycle: its octets 0..39 are never
    stored, so ``i`` is always ready.

    Ports
    -----
    i : In(FrameStream(width))       whole Ethernet frames (no FCS); ``ready`` is always 1; a
                                     frame with ``err`` on its last beat is discarded, uncounted
                                     (the MAC counts it)
    o : Out(stream of :func:`stored_layout`)   committed datagrams
    own_mac, own_ip, host_mac, host_ip, host_port, enable : In
    cnt_* : Out(32)    :attr:`COUNTERS`
    """

    COUNTERS = ("ignored", "disabled", "bad_src", "bad_csum", "malformed", "overrun")

    def __init__(self, width, *, max_words=64, depth=None, max_packets=16):
        _check_width(width)
        self._width = width
        self._max_words = max_words
        nl = width // 8
        #: Beats of the store: two of the largest datagrams (from the beat holding octet 42).
        self.depth = depth or 2 * -(-(_KH_AT % nl + MAX_PAYLOAD) // nl)
        self._max_packets = max_packets
        members = {"i": In(FrameStream(width)), "o": Out(stream.Signature(stored_layout(width))),
                   "own_mac": In(48), "own_ip": In(32), "host_mac": In(48), "host_ip": In(32),
                   "host_port": In(16), "enable": In(1), **counter_ports(self.COUNTERS)}
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        w, nl = self._width, self._width // 8
        m.submodules.store = store = PacketFifo(w, self.depth, side=_STORED_SIDE,
                                                max_packets=self._max_packets)
        wiring.connect(m, store.r, wiring.flipped(self.o))

        i = self.i
        m.d.comb += i.ready.eq(1)
        fire, last = i.valid, i.p.last
        x = lanes(i.p.data, nl)
        nb = (_CAPTURE - 1) // nl + 1        # beats holding octets 0..49; ``beat`` stops there
        beat = Signal(range(nb + 1))
        with m.If(fire):
            m.d.sync += beat.eq(Mux(last, 0, Mux(beat == nb, nb, beat + 1)))
        first = beat == 0
        b0 = _SEG_AT // nl                   # first beat of octets 40..: ``seg`` valid

        def at(p):
            """The current beat holds frame octet ``p`` (< 50)."""
            return beat == p // nl

        def octet(p):
            return x[p % nl]

        def sticky(name, fails):
            """Set by any ``(octet, fails(value))`` in its beat; cleared by a frame's first."""
            flag = Signal(name=name)
            hit = Cat(*[at(p) & bad(octet(p)) for p, bad in fails]).any()
            with m.If(fire):
                m.d.sync += flag.eq(Mux(first, 0, flag) | hit)
            return flag

        def ne(*values):
            return [lambda v, c=c: v != c for c in values]

        def field(name, p, n):
            """Octets ``[p, p + n)`` big-endian, captured as they pass: (register, the value in
            the beat holding the last of them)."""
            reg = Signal(8 * n, name=name)
            now = []
            for k, q in enumerate(range(p, p + n)):
                part = reg[8 * (n - 1 - k):8 * (n - k)]
                with m.If(fire & at(q)):
                    m.d.sync += part.eq(octet(q))
                now.append(octet(q) if q // nl == (p + n - 1) // nl else part)
            return reg, be_value(now)

        # Rules 1-4 (octets 0..37).
        not_for_us = sticky("not_for_us", [
            *zip(range(0, 6), ne(*octets_be(self.own_mac, 6))),
            *zip((12, 13, 14), ne(ETHERTYPE_IPV4 >> 8, ETHERTYPE_IPV4 & 0xFF, 0x45)),
            (20, lambda v: v[:6] != 0),      # MF and the fragment offset
            (21, lambda v: v != 0), (23, lambda v: v != IP_PROTO_UDP),
            *zip(range(30, 34), ne(*octets_be(self.own_ip, 4))),
            *zip((36, 37), ne(HOSTLINK_UDP_PORT >> 8, HOSTLINK_UDP_PORT & 0xFF))])
        not_from_host = sticky("not_from_host", [
            *zip(range(6, 12), ne(*octets_be(self.host_mac, 6))),
            *zip(range(26, 30), ne(*octets_be(self.host_ip, 4))),
            *zip((34, 35), ne(*octets_be(self.host_port, 2)))])
        csum_present = sticky("csum_present", [(40, lambda v: v != 0), (41, lambda v: v != 0)])
        kh_bad = sticky("kh_bad", list(zip((_KH_AT, _KH_AT + 1, _KH_AT + 2),
                                           ne(MAGIC >> 8, MAGIC & 0xFF, VERSION))))
        ip_len, _ = field("ip_len", _ETH + 2, 2)
        udp_len, udp_len_now = field("udp_len", _UDP_AT + 4, 2)
        kind, _ = field("kind", _KH_AT + 3, 1)
        seq, _ = field("seq", _KH_AT + 4, 4)

        # The UDP end (octet 34 + UDP length; its last octet is 40 + (UDP length - 7)), from
        # beat b0 on: ``seg.beats`` before the beat holding the last octet, ``seg.lane`` its lane;
        # ``seg.final`` in that beat, ``seg.done`` after it. Counted, not compared, so that no
        # wide comparison (a carry chain each) decides a lane.
        seg = SimpleNamespace(beats=Signal(16 - nl.bit_length() + 1), lane=Signal(range(nl)),
                              done=Signal())
        seg_last = Signal(16)
        m.d.comb += seg_last.eq(udp_len_now - 7)
        tail = beat >= b0
        seg.final = tail & ~seg.done & (seg.beats == 0)
        with m.If(fire):
            with m.If(at(_SEG_AT - 1)):
                m.d.sync += [seg.beats.eq(seg_last >> (nl.bit_length() - 1)),
                             seg.lane.eq(seg_last[:nl.bit_length() - 1]), seg.done.eq(0)]
            with m.Elif(seg.final):
                m.d.sync += seg.done.eq(1)
            with m.Elif(tail):
                m.d.sync += seg.beats.eq(seg.beats - 1)
        inside = [Mux(tail, ~seg.done & (~seg.final | (seg.lane >= j)),
                      self._header_lane(beat, j, nl)) for j in range(nl)]

        # One's-complement sums: one adder tree over the beat's words.
        sums = self._checksums(m, beat, fire, first, x, inside, nl)

        # Rules 1-4: the verdict at the beat holding octet 41 (every octet it reads is older).
        b41 = (_KH_AT - 1) // nl
        verdict = Signal(range(_PASS + 1), init=_IGNORED)
        v_now = Signal(range(_PASS + 1))
        reached = ~last | i.p.keep[(_KH_AT - 1) % nl]
        with m.If(not_for_us | ~reached):
            m.d.comb += v_now.eq(_IGNORED)
        with m.Elif(~self.enable):
            m.d.comb += v_now.eq(_DISABLED)
        with m.Elif(not_from_host):
            m.d.comb += v_now.eq(_BAD_SRC)
        with m.Elif(~sums.ip_ok):
            m.d.comb += v_now.eq(_BAD_IP_CSUM)
        with m.Else():
            m.d.comb += v_now.eq(_PASS)
        with m.If(fire):
            with m.If(first):
                m.d.sync += verdict.eq(_IGNORED)
            with m.Elif(beat == b41):
                m.d.sync += verdict.eq(v_now)
        passing = Mux(beat == b41, v_now, verdict) == _PASS

        walk_ok = self._walker(m, fire, first, x, seg, nl)

        # The store: the beats from the one holding octet 42 to the UDP end.
        lost = Signal()                      # a beat of this datagram found the store full
        take = fire & passing & (beat >= _KH_AT // nl) & ~seg.done
        m.d.comb += [
            store.w.valid.eq(take & ~lost),
            store.w.p.data.eq(i.p.data),
            store.w.p.keep.eq(Cat(*inside)),
            store.w.p.last.eq(seg.final),
        ]
        decide = Signal()                    # the cycle after a frame's last beat
        truncated = Signal()
        frame_err = Signal()                 # the MAC's verdict on the frame (cut-through)
        m.d.sync += decide.eq(fire & last)
        with m.If(fire & last):
            m.d.sync += [truncated.eq(~seg.done
                                      & (~seg.final | (seg.lane >= keep_count(i.p.keep)))),
                         frame_err.eq(i.p.err)]
        with m.If(decide):
            m.d.sync += lost.eq(0)
        with m.Elif(take & ~store.w.ready):
            m.d.sync += lost.eq(1)

        # The decision: rules 5-7 from registers.
        passed = verdict == _PASS
        length_ok = ((ip_len == udp_len + _IP) & (udp_len >= _UDP + HEADER)
                     & (udp_len <= _UDP + MAX_PAYLOAD) & ~truncated)
        udp_ok = csum_present & sums.udp_ok
        kh_ok = ~kh_bad & (((kind == T_REQUEST) & (udp_len > _UDP + HEADER))
                           | ((kind == T_SYNC) & (udp_len == _UDP + HEADER)))
        sound = passed & length_ok & udp_ok & kh_ok        # rules 1-7 but the frame structure
        good = sound & ~lost & walk_ok & ~frame_err
        m.d.comb += [
            store.w_commit.eq(decide & good),
            store.w_discard.eq(decide & ~good),
            store.w.p.side.sync.eq(kind == T_SYNC),
            store.w.p.side.seq.eq(seq),
        ]
        outcome = {
            "ignored": verdict == _IGNORED,
            "disabled": verdict == _DISABLED,
            "bad_src": verdict == _BAD_SRC,
            "bad_csum": (verdict == _BAD_IP_CSUM) | (passed & length_ok & ~udp_ok),
            "malformed": passed & (~length_ok | (udp_ok & ~kh_ok) | (sound & ~lost & ~walk_ok)),
            "overrun": sound & lost,
        }
        for c in self.COUNTERS:
            cnt = getattr(self, f"cnt_{c}")
            with m.If(decide & ~frame_err & outcome[c]):
                m.d.sync += cnt.eq(cnt + 1)
        return m

    @staticmethod
    def _header_lane(beat, j, nl):
        """Lane ``j`` of the beat (before b0) holds an octet of 14..39 that goes into the
        accumulator: not those of the beat of octet 26 below it (``_checksums``)."""
        lo = max(0, -(-(_ETH - j) // nl))              # first beat with octet >= 14 in lane j
        hi = -(-(_SEG_AT - j) // nl)                   # first beat with octet >= 40
        inside = (beat >= lo) & (beat < hi)
        if j < (_UDP_AT - 8) % nl:
            inside = inside & (beat != (_UDP_AT - 8) // nl)
        return inside

    def _checksums(self, m, beat, fire, first, x, inside, nl):
        """The IPv4 header and UDP one's-complement sums (class docstring): ``ip_ok`` (a
        register, from the beat after octet 33 on) and ``udp_ok`` (after the last beat)."""
        def at(p):
            return beat == p // nl
        # The beat's 16-bit words: an even frame offset is the high octet (RFC 1071); at width
        # 8, ``odd`` tells (``beat`` stops counting).
        octs = [Mux(inside[j], x[j], 0) for j in range(nl)]
        raw = [Cat(x[2 * k + 1], x[2 * k]) for k in range(nl // 2)]
        if nl == 1:
            odd = Signal()
            with m.If(fire):
                m.d.sync += odd.eq(Mux(self.i.p.last, 0, ~odd))
            words = [Mux(odd, octs[0], Cat(Const(0, 8), octs[0]))]
            double = [at(_UDP_AT + 4) | at(_UDP_AT + 5)]
        else:
            words = [Cat(octs[2 * k + 1], octs[2 * k]) for k in range(nl // 2)]
            double = [at(_UDP_AT + 4) if k == (_UDP_AT + 4) % nl // 2 else Const(0)
                      for k in range(nl // 2)]
        # The UDP length again (pseudo-header): its word counted twice, in place.
        terms = [Mux(d, Cat(Const(0, 1), wd), wd) for wd, d in zip(words, double)]
        split26 = (_UDP_AT - 8) % nl // 2               # words of the beat below octet 26
        split34 = _UDP_AT % nl // 2                     # ... below octet 34
        while len(terms) > 1:
            terms = [terms[k] + terms[k + 1] for k in range(0, len(terms) - 1, 2)] + \
                    ([terms[-1]] if len(terms) % 2 else [])
        tree = terms[0]
        # At octet 26's beat the words below it go to ``ip_a`` instead (``_header_lane``);
        # at octet 34's the words below it are in both sums.
        low26 = sum(raw[1:split26], raw[0]) if split26 else Const(0, 16)
        low34 = sum(raw[1:split34], raw[0]) if split34 else Const(0, 16)
        acc = Signal(_SUM_BITS)
        ip_a = Signal(20)                   # words 14..25
        ip_ok = Signal()
        with m.If(fire):
            with m.If(first):
                m.d.sync += acc.eq(0)
            with m.Elif(at(_UDP_AT - 8)):
                m.d.sync += [acc.eq(tree), ip_a.eq(acc + low26)]
            with m.Else():
                m.d.sync += acc.eq(acc + tree)
            with m.If(at(_UDP_AT)):
                ip = Signal(20)
                m.d.comb += ip.eq(ip_a + acc + low34)
                # The sum of words 14..33 is 0 modulo 0xFFFF, and not 0: folded once, 0xFFFF.
                m.d.sync += ip_ok.eq(ip[:16] + ip[16:] == 0xFFFF)
        # acc + 17 (the protocol) is 0 modulo 0xFFFF (never 0): acc folded once is 0xFFEE.
        udp_ok = (acc[:16] + acc[16:]) == 0xFFFF - IP_PROTO_UDP
        return SimpleNamespace(ip_ok=ip_ok, udp_ok=udp_ok)

    def _walker(self, m, fire, first, x, seg, nl):
        """Rule 7's frame structure, beat by beat: True (a register, from the beat after the
        UDP end on) when the request frames follow each other exactly from octet 50 to the UDP
        end and their longest responses fit in :data:`MAX_PAYLOAD`.

        ``start``: where the next frame starts, from lane 0 of the current beat, + 6. Its head
        is complete in the beat holding its count octet (``start`` below the beat's width): its
        start octet and command are then in this beat or the ``-(-6 // (width/8))`` beats
        before, kept in ``prev``. ``seg``: the UDP end (``elaborate``)."""
        mw = self._max_words
        back = -(-6 // nl)
        prev = [Signal(8 * nl, name=f"walk_prev{k}") for k in range(back)]   # prev[0]: last beat
        with m.If(fire):
            m.d.sync += [prev[0].eq(Cat(*x))] + [prev[k].eq(prev[k - 1])
                                                 for k in range(1, back)]
        window = [o for k in reversed(range(back)) for o in lanes(prev[k], nl)] + x

        start = Signal(range(nl + 8 + 4 * 255))    # at most a head here + its frame's size
        start_now = Signal.like(start)
        m.d.comb += start_now.eq(Mux(first, _CAPTURE + 6, start))

        def pick(offset):
            """Window octet ``back * nl + start - 6 + offset`` (``start`` below ``nl``)."""
            opts = [window[back * nl + u - 6 + offset] for u in range(nl)]
            if nl == 1:
                return opts[0]
            v = Signal(8, name=f"walk_at{offset}")
            with m.Switch(start_now[:nl.bit_length() - 1]):
                for u, opt in enumerate(opts):
                    with m.Case(u):
                        m.d.comb += v.eq(opt)
            return v
        sof, cmd, count = pick(0), pick(1), pick(6)
        # A head here, starting before the UDP end (``start_now`` is then below ``nl``).
        near = start_now[:nl.bit_length()]
        head = (start_now[nl.bit_length() - 1:] == 0) & ~seg.done & (~seg.final
                                                                     | (near < seg.lane + 7))
        size = Mux(carries_data(cmd, count, mw), count << 2, 0) + 8
        rsize = (response_words_max(cmd, count, mw) << 2) + 5
        start_post = Signal.like(start)
        m.d.comb += start_post.eq(start_now + Mux(head, size, 0))

        ok, over = Signal(), Signal()
        rs = Signal(range(2048))             # longest responses so far (until ``over``)
        rs_post = Signal(range(4096))
        m.d.comb += rs_post.eq(Mux(first, 0, rs) + Mux(head, rsize, 0))
        ok_post = Mux(first, 1, ok) & ~(head & (sof != SOF_REQUEST))
        over_post = Mux(first, 0, over) | (rs_post > _BODY_MAX)
        walk_ok = Signal()
        with m.If(fire):
            m.d.sync += [start.eq(start_post - nl), rs.eq(rs_post), ok.eq(ok_post),
                         over.eq(over_post)]
            with m.If(first):
                m.d.sync += walk_ok.eq(0)
            with m.Elif(seg.final):
                # The beat of the UDP end: the next frame would start exactly there.
                m.d.sync += walk_ok.eq(ok_post & ~over_post & (start_post == seg.lane + 7))
        return walk_ok


# --------------------------------------------------------------------------------------------
# Transmit
# --------------------------------------------------------------------------------------------

class UdpLinkTx(wiring.Component):
    """Send one response datagram per ``start``: Ethernet / IPv4 / UDP / KH header built from
    the inputs (held steady while ``busy``), then ``body_len`` octets from the response RAM
    (``rd_*``), or for a sync response the 4 octets of ``value``.

    The body sits in the RAM where it goes on the wire: RAM word ``a`` is frame beat
    ``50 // (width/8) + a``, body octet ``q`` at RAM octet ``q + 50 % (width/8)`` (the lanes
    below that, in word 0, are the header's). So every beat is a header beat (a case over the
    beat index: each field has a fixed beat and lane), a RAM word, or, once, both side by side.

    First the checksums, one 16-bit word a cycle into two one's-complement accumulators
    (end-around carry; the constant words preset them): the IPv4 header's and the UDP one
    (pseudo-header, header, KH header, then ``body_sum``, the body's partial sum), 13 cycles;
    then one beat a cycle through the output register.

    Ports
    -----
    start : In(1); sync : In(1); seq, value : In(32); body_len : In; body_sum : In(28)
    own_mac, own_ip, host_mac, host_ip, host_port : In
    busy : Out(1)
    rd_addr : Out, rd_en : Out(1), rd_data : In(width)   the response RAM's read port
    o : Out(PacketStream(width))    whole frames (no FCS, not padded)
    """

    def __init__(self, width):
        _check_width(width)
        self._width = width
        nl = width // 8
        #: RAM words: the body from lane ``50 % (width/8)`` on.
        self.body_depth = -(-(_CAPTURE % nl + _BODY_MAX) // nl)
        super().__init__({
            "start": In(1), "sync": In(1), "seq": In(32), "value": In(32),
            "body_len": In(range(_BODY_MAX + 1)), "body_sum": In(_SUM_BITS),
            "own_mac": In(48), "own_ip": In(32), "host_mac": In(48), "host_ip": In(32),
            "host_port": In(16), "busy": Out(1),
            "rd_addr": Out(range(self.body_depth + 1)), "rd_en": Out(1), "rd_data": In(width),
            "o": Out(PacketStream(width)),
        })

    def _header(self, m, udp_csum, ip_csum, udp_len):
        """The 54 header octets (Ethernet, IPv4, UDP, KH, sync value) in wire order; the
        checksum words (pseudo-header, UDP and KH header, payload) that are not constants,
        each ``(value, also in the IPv4 header)``; the constant parts of both sums."""
        kind = Mux(self.sync, Const(T_SYNC_RESPONSE, 8), Const(T_RESPONSE, 8))
        eth, ip, udp = Signal(EthernetHeader), Signal(IPv4Header), Signal(UDPHeader)
        m.d.comb += [
            eth.dst.eq(self.host_mac), eth.src.eq(self.own_mac), eth.ethertype.eq(ETHERTYPE_IPV4),
            ip.version.eq(4), ip.ihl.eq(5), ip.total_length.eq(udp_len + _IP),
            ip.flags.eq(0b010), ip.ttl.eq(64), ip.protocol.eq(IP_PROTO_UDP),
            ip.src.eq(self.own_ip), ip.dst.eq(self.host_ip), ip.checksum.eq(ip_csum),
            udp.src_port.eq(HOSTLINK_UDP_PORT), udp.dst_port.eq(self.host_port),
            udp.length.eq(udp_len), udp.checksum.eq(udp_csum),
        ]
        kh = [Const(MAGIC >> 8, 8), Const(MAGIC & 0xFF, 8), Const(VERSION, 8), kind]
        octs = (octets_be(eth.as_value(), _ETH) + octets_be(ip.as_value(), _IP)
                + octets_be(udp.as_value(), _UDP) + kh + octets_be(self.seq, 4)
                + octets_be(self.value, 4))
        ips = _words16(self.own_ip, 2) + _words16(self.host_ip, 2)
        words = ([(wd, 1) for wd in ips] + [(udp_len, 1), (udp_len, 0), (self.host_port, 0)]
                 + [(wd, 0) for wd in _words16(self.seq, 2)]
                 + [(Mux(self.sync, self.value[16:], self.body_sum[:16]), 0),
                    (Mux(self.sync, self.value[:16], self.body_sum[16:]), 0)])
        # IPv4: version/IHL/TOS, identification, flags, TTL/protocol; total length - UDP length.
        k_ip = 0x4500 + 0x4000 + (64 << 8 | IP_PROTO_UDP) + _IP
        # UDP: protocol (pseudo-header), source port, magic, version and type.
        k_udp = IP_PROTO_UDP + HOSTLINK_UDP_PORT + MAGIC + (VERSION << 8)
        k_udp = Mux(self.sync, _fold16(k_udp + T_SYNC_RESPONSE), _fold16(k_udp + T_RESPONSE))
        return octs, words, _fold16(k_ip), k_udp

    def elaborate(self, platform):
        m = Module()
        w, nl = self._width, self._width // 8
        shift = nl.bit_length() - 1
        o = self.o

        udp_len = Signal(16)
        m.d.comb += udp_len.eq(Mux(self.sync, _UDP + HEADER + 4, _UDP + HEADER + self.body_len))
        acc_ip, acc_udp = Signal(17), Signal(17)      # 16 bits + the carry still to add
        ip_csum, udp_csum = Signal(16), Signal(16)
        m.d.comb += [ip_csum.eq(~acc_ip[:16]),
                     udp_csum.eq(Mux(acc_udp[:16] == 0xFFFF, 0xFFFF, ~acc_udp[:16]))]
        octs, words, k_ip, k_udp = self._header(m, udp_csum, ip_csum, udp_len)
        n_steps = len(words) + 2                     # two more fold the last carries in
        step = Signal(range(n_steps))
        word = Signal(16)
        with m.Switch(step):
            for k, (wd, _) in enumerate(words):
                with m.Case(k):
                    m.d.comb += word.eq(wd)
        n_ip = sum(f for _, f in words)             # the IPv4 header's words come first
        assert all(f for _, f in words[:n_ip])
        in_ip = step < n_ip

        n_hdr = len(octs)                                          # 54
        b_body, l0 = _CAPTURE // nl, _CAPTURE % nl                 # the body's first beat, lane
        beat = Signal(range((_CAPTURE + _BODY_MAX) // nl + 2))
        end = Signal(range(_CAPTURE + _BODY_MAX))                  # the frame's last octet
        m.d.comb += end.eq(Mux(self.sync, n_hdr - 1, _CAPTURE - 1 + self.body_len))
        hdr = Signal(w)
        with m.Switch(beat):
            for k in range(-(-n_hdr // nl)):
                with m.Case(k):
                    m.d.comb += hdr.eq(Cat(*[octs[p] if p < n_hdr else Const(0, 8)
                                             for p in range(k * nl, (k + 1) * nl)]))
        ram = lanes(self.rd_data, nl)
        beat_data = Cat(*[Mux(self.sync | (beat < b_body) | ((beat == b_body) & (j < l0)),
                              hdr[8 * j:8 * (j + 1)], ram[j]) for j in range(nl)])
        is_last = beat == end >> shift
        load = ~o.valid | o.ready
        with m.If(o.ready):
            m.d.sync += o.valid.eq(0)

        with m.FSM(name="tx") as fsm:
            with m.State("IDLE"):
                m.d.sync += [step.eq(0), beat.eq(0), self.rd_addr.eq(0),
                             acc_ip.eq(k_ip), acc_udp.eq(k_udp)]
                with m.If(self.start):
                    m.next = "SUM"
            with m.State("SUM"):
                m.d.sync += [
                    acc_ip.eq(acc_ip[:16] + acc_ip[16] + Mux(in_ip, word, 0)),
                    acc_udp.eq(acc_udp[:16] + acc_udp[16] + word),
                    step.eq(step + 1),
                ]
                with m.If(step == n_steps - 1):
                    m.next = "SEND"
            with m.State("SEND"):
                # The RAM word of beat ``beat + 1`` is read while ``beat`` is loaded.
                m.d.comb += self.rd_en.eq(load & ~self.sync & (beat >= b_body - 1))
                with m.If(self.rd_en):
                    m.d.sync += self.rd_addr.eq(self.rd_addr + 1)
                with m.If(load):
                    m.d.sync += [
                        o.valid.eq(1), o.p.data.eq(beat_data), o.p.last.eq(is_last),
                        o.p.keep.eq(Mux(is_last, Cat(*[end[:shift] >= j for j in range(nl)])
                                        if nl > 1 else 1, (1 << nl) - 1)),
                        beat.eq(beat + 1),
                    ]
                    with m.If(is_last):
                        m.next = "IDLE"
        m.d.comb += self.busy.eq(~fsm.ongoing("IDLE") | o.valid)
        return m


# --------------------------------------------------------------------------------------------
# The endpoint
# --------------------------------------------------------------------------------------------

class UdpHostLink(wiring.Component):
    """The UDP host-link endpoint (module docstring): a host-bus master fed from Ethernet.

    Parameters
    ----------
    width : int
        Datapath width of ``i`` / ``o`` (8, 16, 32 or 64).
    max_words : int
        The engine's largest ``count`` (as :class:`~hw.target.hostlink.HostLinkUart`).
    bus_timeout : int
    base : int
        Byte address of the register window (``regs``).
    rx_depth : int or None
        Beats of the datagram store (default two of the largest datagrams).

    Ports
    -----
    i : In(FrameStream(width))      received frames (always ready: a tap is enough)
    o : Out(PacketStream(width))    response frames, for the transmit mux
    bus : Out(HostBusSignature)     master
    regs : In(HostBusSignature)     the register window (only accesses inside it)
    own_mac, own_ip : In            the target's addresses
    host_mac, host_ip, host_port, enable, expected : Out   the registers' values
    cnt_* : Out(32)                 :data:`UDPLINK_COUNTERS`
    """

    def __init__(self, width, *, max_words=64, bus_timeout=4096, base=REG_UDPLINK,
                 rx_depth=None):
        _check_width(width)
        self._width = width
        self.max_words, self.bus_timeout, self.base = max_words, bus_timeout, base
        self.rx_depth = rx_depth
        members = {"i": In(FrameStream(width)), "o": Out(PacketStream(width)),
                   "bus": Out(HostBusSignature()), "regs": In(HostBusSignature()),
                   "own_mac": In(48), "own_ip": In(32),
                   "host_mac": Out(48), "host_ip": Out(32), "host_port": Out(16),
                   "enable": Out(1), "expected": Out(32), **counter_ports(UDPLINK_COUNTERS)}
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        w, nl = self._width, self._width // 8
        m.submodules.rx = rx = UdpLinkRx(w, max_words=self.max_words, depth=self.rx_depth)
        m.submodules.tx = tx = UdpLinkTx(w)
        m.submodules.engine = eng = HostLinkEngine(max_words=self.max_words,
                                                   bus_timeout=self.bus_timeout)
        wiring.connect(m, wiring.flipped(self.i), rx.i)
        wiring.connect(m, tx.o, wiring.flipped(self.o))
        wiring.connect(m, eng.bus, wiring.flipped(self.bus))
        for blk in (rx, tx):
            m.d.comb += [blk.own_mac.eq(self.own_mac), blk.own_ip.eq(self.own_ip),
                         blk.host_mac.eq(self.host_mac), blk.host_ip.eq(self.host_ip),
                         blk.host_port.eq(self.host_port)]
        m.d.comb += rx.enable.eq(self.enable)
        for c in UdpLinkRx.COUNTERS:
            m.d.comb += getattr(self, f"cnt_{c}").eq(getattr(rx, f"cnt_{c}"))
        m.d.comb += [self.cnt_frames_ok.eq(eng.frames_ok), self.cnt_crc_errors.eq(eng.crc_errors),
                     self.cnt_bus_errors.eq(eng.bus_errors),
                     eng.frame_errors.eq(rx.cnt_malformed)]

        # Response RAM: the engine's response octets, from lane 50 % (width/8) of word 0 (where
        # they go on the wire: UdpLinkTx); kept for duplicates. ``ridx``: the next octet's place.
        m.submodules.resp = resp = Memory(shape=w, depth=tx.body_depth, init=[])
        bw = resp.write_port(granularity=8)
        br = resp.read_port()
        m.d.comb += [br.addr.eq(tx.rd_addr), br.en.eq(tx.rd_en), tx.rd_data.eq(br.data)]
        l0 = _CAPTURE % nl
        ridx = Signal(range(l0 + _BODY_MAX + 1))
        rsum = Signal(_SUM_BITS)
        shift = nl.bit_length() - 1
        m.d.comb += [eng.tx_ready.eq(1), bw.addr.eq(ridx >> shift),
                     bw.data.eq(Cat(*[eng.tx_data] * nl))]
        # ``l0`` is even: ``ridx`` has the parity of the body octet (the high octet of a word).
        with m.If(eng.tx_valid & (ridx < l0 + _BODY_MAX)):
            m.d.comb += bw.en.eq(Const(1, nl) << ridx[:shift] if nl > 1 else 1)
            m.d.sync += [ridx.eq(ridx + 1),
                         rsum.eq(rsum + Mux(ridx[0], eng.tx_data, Cat(Const(0, 8), eng.tx_data)))]
        self._executor(m, rx.o, eng, tx, ridx, rsum)
        self._registers(m)
        return m

    def _executor(self, m, r, eng, tx, ridx, rsum):
        """Take stored datagrams in order: the seq rules, the engine, the response."""
        nl = self._width // 8
        # The stored datagram starts at the beat of frame octet 42; the body at octet 50.
        hb = _CAPTURE // nl - _KH_AT // nl
        l0 = _CAPTURE % nl
        kept = SimpleNamespace(valid=Signal(), seq=Signal(32), len=Signal(range(_BODY_MAX + 1)),
                               sum=Signal(_SUM_BITS))
        job = SimpleNamespace(sync=Signal(), seq=Signal(32), value=Signal(32), then_send=Signal())
        m.d.comb += [tx.sync.eq(job.sync), tx.seq.eq(Mux(job.sync, job.seq, kept.seq)),
                     tx.value.eq(job.value), tx.body_len.eq(kept.len), tx.body_sum.eq(kept.sum)]
        hcount = Signal(range(hb + 1))
        li = Signal(range(max(nl, 2)))
        cnt = {c: getattr(self, f"cnt_{c}") for c in UDPLINK_COUNTERS}

        def count(c):
            m.d.sync += cnt[c].eq(cnt[c] + 1)

        side = r.p.side
        with m.FSM(name="exec"):
            with m.State("IDLE"):
                m.d.sync += [hcount.eq(0), li.eq(l0)]
                with m.If(r.valid):
                    m.d.sync += [job.sync.eq(side.sync), job.seq.eq(side.seq),
                                 job.value.eq(self.expected)]
                    with m.If(side.sync):
                        count("sync")
                        m.d.sync += job.then_send.eq(1)
                        m.next = "DRAIN"
                    with m.Elif(side.seq == self.expected):
                        m.d.sync += [ridx.eq(l0), rsum.eq(0)]
                        m.next = "HEADER"
                    # ``expected - 1`` (modulo 2**32: after seq 0xFFFFFFFF ran, ``expected`` is
                    # 0) is the kept response's seq: ``expected`` only advances when one is kept.
                    with m.Elif(kept.valid & (side.seq == kept.seq)):
                        count("duplicate")
                        m.d.sync += job.then_send.eq(1)
                        m.next = "DRAIN"
                    with m.Else():
                        count("bad_seq")
                        m.d.sync += job.then_send.eq(0)
                        m.next = "DRAIN"
            with m.State("DRAIN"):
                m.d.comb += r.ready.eq(1)
                with m.If(r.valid & r.p.last):
                    m.next = "IDLE"
                    with m.If(job.then_send):
                        m.next = "SEND"
            with m.State("HEADER"):
                # The beats before the body (the side data already holds type and seq).
                m.d.comb += r.ready.eq(1)
                with m.If(r.valid):
                    m.d.sync += hcount.eq(hcount + 1)
                    with m.If(hcount == hb - 1):
                        m.next = "FEED"
            with m.State("FEED"):
                # Body octets, one per cycle while the engine takes them.
                keep_next = Cat(r.p.keep[1:], Const(0, 1)).bit_select(li, 1)
                m.d.comb += [eng.rx_data.eq(r.p.data.word_select(li, 8)),
                             eng.rx_valid.eq(r.valid)]
                with m.If(r.valid & eng.rx_ready):
                    with m.If((li == nl - 1) | ~keep_next):
                        m.d.comb += r.ready.eq(1)
                        m.d.sync += li.eq(0)
                        with m.If(r.p.last):
                            m.next = "FINISH"
                    with m.Else():
                        m.d.sync += li.eq(li + 1)
            with m.State("FINISH"):
                # The last frame runs and answers; then the response is kept.
                with m.If(eng.idle):
                    count("executed")
                    m.d.sync += [self.expected.eq(self.expected + 1), kept.valid.eq(1),
                                 kept.seq.eq(job.seq), kept.len.eq(ridx - l0), kept.sum.eq(rsum)]
                    m.next = "SEND"
            with m.State("SEND"):
                m.d.comb += tx.start.eq(1)
                m.next = "SENDING"
            with m.State("SENDING"):
                with m.If(~tx.busy):
                    count("tx_datagrams")
                    m.next = "IDLE"

    def _registers(self, m):
        """The register window (``regs``), decoded combinationally like TopRegs."""
        b = self.regs
        R = UDPLINK_REGS
        span = (UDPLINK_COUNTER_BASE + 4 * len(UDPLINK_COUNTERS) - 1).bit_length()
        if self.base % (1 << span):
            rel = Signal(32)
            m.d.comb += rel.eq(b.addr - self.base)
        else:               # no subtraction: the offset is the address's low bits
            rel = Cat(b.addr[:span], b.addr[span:] != self.base >> span)
        rw = {R["ctrl"]: self.enable, R["host_mac_hi"]: self.host_mac[32:],
              R["host_mac_lo"]: self.host_mac[:32], R["host_ip"]: self.host_ip,
              R["host_port"]: self.host_port}
        ro = {R["id"]: Const(UDPLINK_ID, 32), R["expected"]: self.expected}
        for k, c in enumerate(UDPLINK_COUNTERS):
            ro[UDPLINK_COUNTER_BASE + 4 * k] = getattr(self, f"cnt_{c}")
        with m.If(b.re | b.we):
            m.d.comb += [b.ack.eq(1), b.err.eq(1)]
            with m.Switch(rel):
                for off, reg in rw.items():
                    with m.Case(off):
                        m.d.comb += [b.err.eq(0), b.rdata.eq(reg)]
                        with m.If(b.we):
                            m.d.sync += reg.eq(b.wdata[:len(reg)])
                for off, reg in ro.items():
                    with m.Case(off):
                        m.d.comb += [b.err.eq(b.we), b.rdata.eq(reg)]


# --------------------------------------------------------------------------------------------
# Two bus masters
# --------------------------------------------------------------------------------------------

class HostBusRegister(wiring.Component):
    """One register stage in each direction of a :class:`~hw.target.hostlink.HostBusSignature`.

    The host link's request signals (its buffer RAM drives ``wdata``) and the target's answer
    (its address decoders drive ``rdata``/``ack``/``err``) each end in a flop here, so neither
    side's logic adds up with the other's. An access costs two more cycles, which the UART
    (thousands of cycles per octet) never notices. Behind :class:`HostBusArbiter` in the
    target it does the same for the UDP host link (the arbiter's grant no longer runs into the
    blocks' address decoders, nor their answers back into the masters' state machines).

    Ports
    -----
    up : In(HostBusSignature)     towards the master (host link)
    down : Out(HostBusSignature)  towards the target (core)
    """

    def __init__(self):
        super().__init__({"up": In(HostBusSignature()), "down": Out(HostBusSignature())})

    def elaborate(self, platform):
        m = Module()
        up, down = self.up, self.down
        with m.FSM(name="hbr"):
            with m.State("Idle"):
                with m.If(up.re | up.we):
                    m.d.sync += [down.addr.eq(up.addr), down.space.eq(up.space),
                                 down.wdata.eq(up.wdata), down.re.eq(up.re), down.we.eq(up.we)]
                    m.next = "Issued"
            with m.State("Issued"):
                with m.If(down.ack):
                    m.d.sync += [down.re.eq(0), down.we.eq(0), up.ack.eq(1),
                                 up.err.eq(down.err), up.rdata.eq(down.rdata)]
                    m.next = "Answered"
            with m.State("Answered"):
                # up.ack is high during this cycle; the master drops its request in the next.
                m.d.sync += [up.ack.eq(0), up.err.eq(0)]
                m.next = "Idle"
        return m


class HostBusArbiter(wiring.Component):
    """``n`` host-bus masters onto one target, one access at a time.

    An access is granted to one master (round robin among those requesting, starting after the
    last one served) and held, whatever the others do, until the target's ``ack``; the other
    masters wait (their ``ack`` stays low). Combinational both ways: the target still answers
    in the cycle of the request if it can.

    Ports
    -----
    masters : In(HostBusSignature).array(n)
    target : Out(HostBusSignature)
    """

    def __init__(self, n=2):
        self.n = n
        super().__init__({"masters": In(HostBusSignature()).array(n),
                          "target": Out(HostBusSignature())})

    def elaborate(self, platform):
        m = Module()
        n, t = self.n, self.target
        busy = Signal()                      # an access granted and not yet answered
        owner = Signal(range(n))
        prev = Signal(range(n))              # served last: lowest priority next
        grant = Signal(range(n))
        wants = [s.re | s.we for s in self.masters]
        with m.If(busy):
            m.d.comb += grant.eq(owner)
        with m.Else():
            m.d.comb += grant.eq(prev)
            for off in reversed(range(1, n + 1)):
                for j in range(n):
                    with m.If((prev == j) & wants[(j + off) % n]):
                        m.d.comb += grant.eq((j + off) % n)
        for k, s in enumerate(self.masters):
            with m.If(grant == k):
                m.d.comb += [t.addr.eq(s.addr), t.space.eq(s.space), t.wdata.eq(s.wdata),
                             t.re.eq(s.re), t.we.eq(s.we),
                             s.ack.eq(t.ack), s.err.eq(t.err), s.rdata.eq(t.rdata)]
        with m.If(t.ack):
            m.d.sync += [busy.eq(0), prev.eq(grant)]
        with m.Elif(t.re | t.we):
            m.d.sync += [busy.eq(1), owner.eq(grant)]
        return m

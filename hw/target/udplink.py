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

    i (whole frames) -> UdpLinkRx: header checks, UDP checksum, OctetPacker (KH header + body),
                        frame walker, PacketFifo (commit at the end / discard)
        -> executor: seq rules; body octets -> HostLinkEngine -> bus
                     response octets -> response RAM (kept for duplicates)
        -> UdpLinkTx: Ethernet / IPv4 / UDP / KH header + response RAM -> OctetPacker -> o

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
from hw.lib.octets import HeaderCapture, OctetPacker, lane_region, lanes, octets_be
from hw.lib.stream import PacketStream, keep_count, packet_layout
from hw.net.ip import IP_PROTO_UDP, ipv4_checksum, ones_sum
from hw.target.hostlink import (SOF_REQUEST, HostLinkEngine, carries_data,
                                response_words_max)

__all__ = ["UdpHostLink", "UdpLinkRx", "UdpLinkTx", "HostBusArbiter", "HOSTLINK_UDP_PORT",
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
_CAPTURE = _KH_AT + HEADER           # 50 header octets captured
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
    """A stored datagram (KH header + frames, dense from lane 0) and its side data: a sync
    request or a request, and its seq."""
    return data.StructLayout({**dict(packet_layout(width).members), "side": _STORED_SIDE})


def _words16(value, n):
    """The ``n`` big-endian 16-bit words of a ``16 * n``-bit value, first on the wire first."""
    return [value[16 * (n - 1 - k):16 * (n - k)] for k in range(n)]


# --------------------------------------------------------------------------------------------
# Receive: checks, store, frame walker
# --------------------------------------------------------------------------------------------

class UdpLinkRx(wiring.Component):
    """Validate host-link datagrams (rules 1-7 of the module docstring) and store the good ones.

    Per frame: the header verdict at the beat holding octet 41 (rules 1-4, from
    :class:`~hw.lib.octets.HeaderCapture`); the UDP payload (KH header + frames) into an
    :class:`~hw.lib.octets.OctetPacker` while the UDP segment's one's-complement sum
    accumulates; after the last beat, one decision cycle (rules 5-7 but the frame structure,
    from registers only) in which the datagram's final octets (one beat is always held back
    for this) go into the packer with ``last`` and the verdict. The packed beats go into a
    :class:`~hw.lib.fifo.PacketFifo` while the frame walker follows the request frames; at the
    packed last beat the datagram is committed (or discarded: a failed verdict, a broken frame
    structure, no room: ``overrun``).

    The decision cycle and the packer's last beats overlap the first beats of the next frame,
    which never feed the packer (octets 0..41), so ``i`` is always ready.

    Ports
    -----
    i : In(PacketStream(width))      whole Ethernet frames (no FCS); ``ready`` is always 1
    o : Out(stream of :func:`stored_layout`)   committed datagrams: KH header, then frames
    own_mac, own_ip, host_mac, host_ip, host_port, enable : In
    cnt_* : Out(32)    :attr:`COUNTERS`
    """

    COUNTERS = ("ignored", "disabled", "bad_src", "bad_csum", "malformed", "overrun")

    def __init__(self, width, *, max_words=64, depth=None, max_packets=16):
        _check_width(width)
        self._width = width
        self._max_words = max_words
        nl = width // 8
        #: Beats of the store: two of the largest datagrams.
        self.depth = depth or 2 * -(-MAX_PAYLOAD // nl)
        self._max_packets = max_packets
        members = {"i": In(PacketStream(width)), "o": Out(stream.Signature(stored_layout(width))),
                   "own_mac": In(48), "own_ip": In(32), "host_mac": In(48), "host_ip": In(32),
                   "host_port": In(16), "enable": In(1), **counter_ports(self.COUNTERS)}
        super().__init__(members)

    def elaborate(self, platform):
        m = Module()
        w, nl = self._width, self._width // 8
        side = data.StructLayout({"ok": 1, "sync": 1, "seq": 32})
        m.submodules.packer = packer = OctetPacker(w, side)
        m.submodules.store = store = PacketFifo(w, self.depth, side=_STORED_SIDE,
                                                max_packets=self._max_packets)
        wiring.connect(m, store.r, wiring.flipped(self.o))

        i = self.i
        m.d.comb += i.ready.eq(1)
        fire = i.valid
        pos = Signal(14)                     # frame octet of lane 0 (saturates)
        with m.If(fire):
            m.d.sync += pos.eq(Mux(i.p.last, 0, Mux(pos[13], pos, pos + nl)))
        cap = HeaderCapture(_CAPTURE, w, "uh").add(m, pos, i.p.data, fire)
        hdr = self._header_verdict(m, cap, pos)

        # The UDP payload [42, 34 + UDP length), cut at the frame's end, into the packer.
        udp = UDPHeader(cap.value(_UDP_AT, _UDP))
        udp_end = Signal(17)
        frame_end = Signal(15)
        m.d.comb += [udp_end.eq(_UDP_AT + udp.length), frame_end.eq(pos + keep_count(i.p.keep))]
        cut_end = Mux(i.p.last & (frame_end < udp_end), frame_end, udp_end)
        lo, n, _ = lane_region(m, pos, _KH_AT, cut_end, nl, "kh")
        # Each payload beat waits in ``held`` until the next one (or the decision) comes: the
        # packer needs ``last`` with the final octets, and the verdict is known only after them.
        held = SimpleNamespace(valid=Signal(), data=Signal(w), lo=Signal.like(lo),
                               n=Signal.like(n))
        take = fire & (hdr.now == _PASS) & (n != 0)
        flush = Signal()                     # the decision cycle: ``held`` goes with ``last``
        flush_side = Signal(side)
        m.d.comb += [
            packer.i.valid.eq(held.valid & (take | flush)),
            packer.i.p.data.eq(held.data),
            packer.i.p.lo.eq(held.lo),
            packer.i.p.n.eq(held.n),
            packer.i.p.last.eq(flush),
            packer.i.p.side.eq(flush_side),
        ]
        with m.If(take):
            m.d.sync += [held.valid.eq(1), held.data.eq(i.p.data), held.lo.eq(lo), held.n.eq(n)]
        with m.Elif(flush):
            m.d.sync += held.valid.eq(0)

        # One's-complement sum of the UDP segment [34, 34 + UDP length): an octet at an even
        # frame offset (34 is even) is the high half of its 16-bit word (RFC 1071).
        seg_end = Mux(udp_end < _KH_AT, _KH_AT, udp_end)    # stale before octets 38-39: >= 42
        slo, sn, _ = lane_region(m, pos, _UDP_AT, seg_end, nl, "us")
        terms = []
        for j, octet in enumerate(lanes(i.p.data, nl)):
            inside = i.p.keep[j] & (j >= slo) & (j < slo + sn)
            high = ~pos[0] if nl == 1 else Const(j % 2 == 0)
            terms.append(Mux(inside, Mux(high, Cat(Const(0, 8), octet), octet), 0))
        acc = Signal(_SUM_BITS)
        acc_next = Signal(_SUM_BITS)
        m.d.comb += acc_next.eq(Mux(pos == 0, 0, acc) + sum(terms))

        # Frame end: snapshot for the decision cycle (the next frame may start meanwhile).
        fin = SimpleNamespace(hdr=Signal(range(_PASS + 1)), len=Signal(15),
                              sum=Signal(_SUM_BITS), decide=Signal())
        m.d.sync += fin.decide.eq(fire & i.p.last)
        with m.If(fire):
            m.d.sync += acc.eq(acc_next)
            with m.If(i.p.last):
                m.d.sync += [fin.hdr.eq(hdr.now), fin.len.eq(frame_end), fin.sum.eq(acc_next)]
        decided = self._decide(m, cap, fin, flush, flush_side)
        # The packer's beats go through a register before the frame walker and the store: the
        # packer's lane shifter and the walker's eight chained octet steps (at width 64) made
        # one of the core clock's longest paths (tools/depth.py). ``o.ready`` is always high,
        # so a plain register is the whole stage.
        pk = SimpleNamespace(valid=Signal(name="pk_valid"),
                             p=Signal(packer.o.p.shape(), name="pk"))
        m.d.comb += packer.o.ready.eq(1)
        m.d.sync += [pk.valid.eq(packer.o.valid), pk.p.eq(packer.o.p)]
        self._store(m, pk, store, decided)
        return m

    def _header_verdict(self, m, cap, pos):
        """Rules 1-4 at the beat holding octet 41 (``now``: as seen in the current beat,
        ``reg``: the frame's verdict so far); IGNORED until then."""
        nl = self._width // 8
        eth = EthernetHeader(cap.value(0, _ETH))
        ip = IPv4Header(cap.value(_ETH, _IP))
        udp = UDPHeader(cap.value(_UDP_AT, _UDP))
        for_us = ((eth.ethertype == ETHERTYPE_IPV4) & (eth.dst == self.own_mac)
                  & (ip.version == 4) & (ip.ihl == 5) & ~ip.flags[0] & (ip.fragment_offset == 0)
                  & (ip.dst == self.own_ip) & (ip.protocol == IP_PROTO_UDP)
                  & (udp.dst_port == HOSTLINK_UDP_PORT))
        from_host = ((eth.src == self.host_mac) & (ip.src == self.host_ip)
                     & (udp.src_port == self.host_port))
        ip_ok = ones_sum([cap.value(_ETH + 2 * k, 2) for k in range(10)]) == 0xFFFF
        verdict = Signal(range(_PASS + 1))
        with m.If(~for_us):
            m.d.comb += verdict.eq(_IGNORED)
        with m.Elif(~self.enable):
            m.d.comb += verdict.eq(_DISABLED)
        with m.Elif(~from_host):
            m.d.comb += verdict.eq(_BAD_SRC)
        with m.Elif(~ip_ok):
            m.d.comb += verdict.eq(_BAD_IP_CSUM)
        with m.Else():
            m.d.comb += verdict.eq(_PASS)
        reg = Signal(range(_PASS + 1), init=_IGNORED)
        now = Signal(range(_PASS + 1))
        m.d.comb += now.eq(Mux(pos == (_KH_AT - 1) // nl * nl, verdict, reg))
        with m.If(self.i.valid):
            m.d.sync += reg.eq(Mux(self.i.p.last, _IGNORED, now))
        return SimpleNamespace(now=now, reg=reg)

    def _decide(self, m, cap, fin, flush, flush_side):
        """The decision cycle: rules 5-7 (but the frame structure) from registers; counters;
        ``flush``: the held beat ends the packed datagram, with the verdict."""
        ip = IPv4Header(cap.value(_ETH, _IP, now=False))
        udp = UDPHeader(cap.value(_UDP_AT, _UDP, now=False))
        kind = cap.reg[_KH_AT + 3]
        ulen = udp.length
        length_ok = ((ip.total_length == ulen + _IP) & (ulen >= _UDP + HEADER)
                     & (ulen <= _UDP + MAX_PAYLOAD) & (fin.len >= ulen + _UDP_AT))
        pseudo = _words16(ip.src, 2) + _words16(ip.dst, 2) + [Const(IP_PROTO_UDP, 16), ulen]
        udp_ok = (udp.checksum != 0) & (ones_sum([fin.sum] + pseudo) == 0xFFFF)
        kh_ok = ((cap.value(_KH_AT, 2, now=False) == MAGIC) & (cap.reg[_KH_AT + 2] == VERSION)
                 & (((kind == T_REQUEST) & (ulen > _UDP + HEADER))
                    | ((kind == T_SYNC) & (ulen == _UDP + HEADER))))
        outcome = {c: Signal(name=f"is_{c}") for c in self.COUNTERS}
        passed = fin.hdr == _PASS
        m.d.comb += [
            outcome["ignored"].eq(fin.hdr == _IGNORED),
            outcome["disabled"].eq(fin.hdr == _DISABLED),
            outcome["bad_src"].eq(fin.hdr == _BAD_SRC),
            outcome["bad_csum"].eq((fin.hdr == _BAD_IP_CSUM) | (passed & length_ok & ~udp_ok)),
            outcome["malformed"].eq(passed & (~length_ok | (udp_ok & ~kh_ok))),
            flush.eq(fin.decide & passed),
            flush_side.ok.eq(length_ok & udp_ok & kh_ok),
            flush_side.sync.eq(kind == T_SYNC),
            flush_side.seq.eq(cap.value(_KH_AT + 4, 4, now=False)),
        ]
        return {c: fin.decide & v for c, v in outcome.items()}

    def _store(self, m, o, store, decided):
        """Packed beats (``o``: registered, always taken) -> store, frame walker; commit or
        discard at the packed last beat; counters (``decided``: the decision cycle's strobes,
        and the store's). A beat the store cannot take is dropped (overrun)."""
        lost = Signal()                      # a beat of this datagram found the store full
        drop = o.valid & (lost | ~store.w.ready)
        walk_ok = self._walker(m, o)
        good = o.p.side.ok & walk_ok & ~drop
        m.d.comb += [
            store.w.valid.eq(o.valid & ~lost),
            store.w.p.data.eq(o.p.data),
            store.w.p.keep.eq(o.p.keep),
            store.w.p.last.eq(o.p.last),
            store.w.p.side.sync.eq(o.p.side.sync),
            store.w.p.side.seq.eq(o.p.side.seq),
            store.w_commit.eq(o.valid & o.p.last & good),
            store.w_discard.eq(o.valid & o.p.last & ~good),
        ]
        with m.If(o.valid & o.p.last):
            m.d.sync += lost.eq(0)
        with m.Elif(drop):
            m.d.sync += lost.eq(1)
        ended = o.valid & o.p.last & o.p.side.ok
        more = {"overrun": ended & drop, "malformed": ended & ~drop & ~walk_ok}
        for c in self.COUNTERS:
            cnt = getattr(self, f"cnt_{c}")
            inc = decided[c] + (more[c] if c in more else 0)
            m.d.sync += cnt.eq(cnt + inc)

    def _walker(self, m, o):
        """Follow the request frames of the packed datagram (octets 8.. of it) octet by octet,
        every lane of a beat in one cycle; True at the last beat when they follow each other
        exactly and their longest response fits (rule 7)."""
        nl = self._width // 8
        mw = self._max_words
        hb = HEADER // nl                    # beats of the KH header
        beat = Signal(range(hb + 1))         # packed beat index, saturating at hb
        with m.If(o.valid):
            m.d.sync += beat.eq(Mux(o.p.last, 0, Mux(beat == hb, hb, beat + 1)))
        init = dict(hoff=0, rem=0, cmd=0, ok=1, rs=0)
        st = SimpleNamespace(hoff=Signal(3), rem=Signal(10), cmd=Signal(8), ok=Signal(init=1),
                             rs=Signal(18))
        cur = st
        for j, x in enumerate(lanes(o.p.data, nl)):
            cur = self._walk_octet(m, cur, x, o.p.keep[j] & (beat == hb), mw, f"w{j}")
        with m.If(o.valid):
            for k, v in vars(st).items():
                m.d.sync += v.eq(Mux(o.p.last, init[k], getattr(cur, k)))
        return cur.ok & (cur.hoff == 0) & (cur.rs <= _BODY_MAX)

    @staticmethod
    def _walk_octet(m, st, x, act, mw, name):
        """One octet ``x`` (when ``act``) of the frame walker: ``hoff`` is the octet's place in
        its frame's 7-octet head (7: data or CRC, ``rem`` data octets left before the CRC)."""
        nx = SimpleNamespace(**{k: Signal.like(v, name=f"{name}_{k}") for k, v in vars(st).items()})
        m.d.comb += [getattr(nx, k).eq(v) for k, v in vars(st).items()]
        with m.If(act):
            with m.Switch(st.hoff):
                with m.Case(0):
                    m.d.comb += [nx.ok.eq(st.ok & (x == SOF_REQUEST)), nx.hoff.eq(1)]
                with m.Case(1):
                    m.d.comb += [nx.cmd.eq(x), nx.hoff.eq(2)]
                with m.Case(6):
                    m.d.comb += [
                        nx.rem.eq(Mux(carries_data(st.cmd, x, mw), x << 2, 0)),
                        nx.rs.eq(st.rs + 5 + (response_words_max(st.cmd, x, mw) << 2)),
                        nx.hoff.eq(7)]
                with m.Case(7):
                    with m.If(st.rem == 0):
                        m.d.comb += nx.hoff.eq(0)
                    with m.Else():
                        m.d.comb += nx.rem.eq(st.rem - 1)
                with m.Default():
                    m.d.comb += nx.hoff.eq(st.hoff + 1)
        return nx


# --------------------------------------------------------------------------------------------
# Transmit
# --------------------------------------------------------------------------------------------

class UdpLinkTx(wiring.Component):
    """Send one response datagram per ``start``: Ethernet / IPv4 / UDP / KH header built from
    the inputs (held steady while ``busy``), then ``body_len`` octets from the response RAM
    (``rd_*``, one beat of ``width`` bits per address, dense from lane 0), or for a sync
    response the 4 octets of ``value``. One cycle computes the checksums (the UDP checksum from
    ``body_sum``, the body's one's-complement partial sum), the next loads the header register.

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
        self.body_depth = -(-_BODY_MAX // nl)
        super().__init__({
            "start": In(1), "sync": In(1), "seq": In(32), "value": In(32),
            "body_len": In(range(_BODY_MAX + 1)), "body_sum": In(_SUM_BITS),
            "own_mac": In(48), "own_ip": In(32), "host_mac": In(48), "host_ip": In(32),
            "host_port": In(16), "busy": Out(1),
            "rd_addr": Out(range(self.body_depth + 1)), "rd_en": Out(1), "rd_data": In(width),
            "o": Out(PacketStream(width)),
        })

    def _header(self, m, udp_csum, ip_csum):
        """The 54 header octets (Ethernet, IPv4, UDP, KH, sync value) in wire order, the IPv4
        header without its checksum, and the 16-bit words the UDP checksum sums (pseudo-header,
        UDP header, KH header, payload)."""
        plen = Mux(self.sync, HEADER + 4, HEADER + self.body_len)
        kind = Mux(self.sync, Const(T_SYNC_RESPONSE, 8), Const(T_RESPONSE, 8))
        eth, ip, ip_nocsum, udp = (Signal(EthernetHeader), Signal(IPv4Header),
                                   Signal(IPv4Header), Signal(UDPHeader))
        m.d.comb += [
            eth.dst.eq(self.host_mac), eth.src.eq(self.own_mac), eth.ethertype.eq(ETHERTYPE_IPV4),
            ip_nocsum.version.eq(4), ip_nocsum.ihl.eq(5), ip_nocsum.total_length.eq(plen + 28),
            ip_nocsum.flags.eq(0b010), ip_nocsum.ttl.eq(64), ip_nocsum.protocol.eq(IP_PROTO_UDP),
            ip_nocsum.src.eq(self.own_ip), ip_nocsum.dst.eq(self.host_ip),
            ip.eq(ip_nocsum), ip.checksum.eq(ip_csum),
            udp.src_port.eq(HOSTLINK_UDP_PORT), udp.dst_port.eq(self.host_port),
            udp.length.eq(plen + _UDP), udp.checksum.eq(udp_csum),
        ]
        kh = [Const(MAGIC >> 8, 8), Const(MAGIC & 0xFF, 8), Const(VERSION, 8), kind]
        octs = (octets_be(eth.as_value(), _ETH) + octets_be(ip.as_value(), _IP)
                + octets_be(udp.as_value(), _UDP) + kh + octets_be(self.seq, 4)
                + octets_be(self.value, 4))
        words = (_words16(self.own_ip, 2) + _words16(self.host_ip, 2)
                 + [Const(IP_PROTO_UDP, 16), udp.length, Const(HOSTLINK_UDP_PORT, 16),
                    self.host_port, udp.length, Const(MAGIC, 16), Cat(kind, Const(VERSION, 8))]
                 + _words16(self.seq, 2)
                 + [Mux(self.sync, self.value[16:], 0), Mux(self.sync, self.value[:16], 0),
                    Mux(self.sync, 0, self.body_sum)])
        return octs, ip_nocsum, words

    def elaborate(self, platform):
        m = Module()
        w, nl = self._width, self._width // 8
        m.submodules.packer = packer = OctetPacker(w)
        wiring.connect(m, packer.o, wiring.flipped(self.o))

        udp_csum, ip_csum = Signal(16), Signal(16)
        octs, ip_nocsum, words = self._header(m, udp_csum, ip_csum)
        n_hdr = len(octs)                                   # 54
        hsr = Signal(8 * nl * -(-n_hdr // nl))              # header shift register
        hleft = Signal(range(n_hdr + 1))
        shift = nl.bit_length() - 1
        bidx = Signal(range(self.body_depth + 1))
        last_beat = (self.body_len - 1) >> shift
        tail = ((self.body_len - 1) & (nl - 1)) + 1

        with m.FSM(name="tx") as fsm:
            with m.State("IDLE"):
                with m.If(self.start):
                    m.next = "SUM"
            with m.State("SUM"):
                csum = Signal(16)
                m.d.comb += csum.eq(~ones_sum(words))
                m.d.sync += [udp_csum.eq(Mux(csum == 0, 0xFFFF, csum)),
                             ip_csum.eq(ipv4_checksum(ip_nocsum.as_value()))]
                m.next = "LOAD"
            with m.State("LOAD"):
                m.d.sync += [hsr.eq(Cat(*octs)), hleft.eq(Mux(self.sync, n_hdr, n_hdr - 4))]
                m.next = "HEADER"
            with m.State("HEADER"):
                m.d.comb += [packer.i.valid.eq(1), packer.i.p.data.eq(hsr[:w]),
                             packer.i.p.lo.eq(0), packer.i.p.n.eq(Mux(hleft >= nl, nl, hleft)),
                             packer.i.p.last.eq(self.sync & (hleft <= nl))]
                with m.If(packer.i.ready):
                    m.d.sync += [hsr.eq(hsr >> w), hleft.eq(hleft - nl)]
                    with m.If(hleft <= nl):
                        m.next = "IDLE"
                        with m.If(~self.sync):
                            m.next = "BODY_FETCH"
            with m.State("BODY_FETCH"):
                m.d.comb += [self.rd_addr.eq(0), self.rd_en.eq(1)]
                m.d.sync += bidx.eq(0)
                m.next = "BODY"
            with m.State("BODY"):
                m.d.comb += [packer.i.valid.eq(1), packer.i.p.data.eq(self.rd_data),
                             packer.i.p.lo.eq(0),
                             packer.i.p.n.eq(Mux(bidx == last_beat, tail, nl)),
                             packer.i.p.last.eq(bidx == last_beat),
                             self.rd_addr.eq(bidx + 1), self.rd_en.eq(packer.i.ready)]
                with m.If(packer.i.ready):
                    m.d.sync += bidx.eq(bidx + 1)
                    with m.If(bidx == last_beat):
                        m.next = "IDLE"
        m.d.comb += self.busy.eq(~fsm.ongoing("IDLE") | packer.o.valid)
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
    i : In(PacketStream(width))     received frames (always ready: a tap is enough)
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
        members = {"i": In(PacketStream(width)), "o": Out(PacketStream(width)),
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

        # Response RAM: the engine's response octets, dense from lane 0; kept for duplicates.
        m.submodules.resp = resp = Memory(shape=w, depth=tx.body_depth, init=[])
        bw = resp.write_port(granularity=8)
        br = resp.read_port()
        m.d.comb += [br.addr.eq(tx.rd_addr), br.en.eq(tx.rd_en), tx.rd_data.eq(br.data)]
        ridx = Signal(range(_BODY_MAX + 1))
        rsum = Signal(_SUM_BITS)
        shift = nl.bit_length() - 1
        m.d.comb += [eng.tx_ready.eq(1), bw.addr.eq(ridx >> shift),
                     bw.data.eq(Cat(*[eng.tx_data] * nl))]
        with m.If(eng.tx_valid & (ridx < _BODY_MAX)):
            m.d.comb += bw.en.eq(Const(1, nl) << ridx[:shift] if nl > 1 else 1)
            m.d.sync += [ridx.eq(ridx + 1),
                         rsum.eq(rsum + Mux(ridx[0], eng.tx_data, Cat(Const(0, 8), eng.tx_data)))]
        self._executor(m, rx.o, eng, tx, ridx, rsum)
        self._registers(m)
        return m

    def _executor(self, m, r, eng, tx, ridx, rsum):
        """Take stored datagrams in order: the seq rules, the engine, the response."""
        nl = self._width // 8
        hb = HEADER // nl
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
                m.d.sync += [hcount.eq(0), li.eq(0)]
                with m.If(r.valid):
                    m.d.sync += [job.sync.eq(side.sync), job.seq.eq(side.seq),
                                 job.value.eq(self.expected)]
                    with m.If(side.sync):
                        count("sync")
                        m.d.sync += job.then_send.eq(1)
                        m.next = "DRAIN"
                    with m.Elif(side.seq == self.expected):
                        m.d.sync += [ridx.eq(0), rsum.eq(0)]
                        m.next = "HEADER"
                    # Modulo 2**32: after seq 0xFFFFFFFF ran, ``expected`` is 0.
                    with m.Elif(kept.valid & (side.seq == (self.expected - 1)[:32])):
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
                # The KH header beats (the side data already holds type and seq).
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
                                 kept.seq.eq(job.seq), kept.len.eq(ridx), kept.sum.eq(rsum)]
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
        rel = Signal(32)
        m.d.comb += rel.eq(b.addr - self.base)
        R = UDPLINK_REGS
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

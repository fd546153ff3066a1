# Ref: roce-layouts.md §5 (ICRC: coverage, masks, algorithm, byte order), §1.1 (ICRC located by
#      the UDP length); docs/softroce-vm.md ("Rules a peer of rxe must follow").
"""RoCEv2 ICRC check (receive, store-and-forward) and generation (transmit), width-parametric.

The ICRC is CRC-32/IEEE 802.3 (``zlib.crc32``) over 8 octets of 0xFF, the IPv4 header with TOS,
TTL and header checksum set to 0xFF, the UDP header with its checksum set to 0xFF, the BTH with
octet 4 set to 0xFF, the extended headers, payload and pad. It goes on the wire least
significant octet first.

The IPv4 and UDP headers are not in the RoCE stream (it starts at the BTH); they are rebuilt
from the metadata, which carries every covered field, and folded into the CRC in one wide
step when a packet starts. The CRC itself is :mod:`amaranth.lib.crc`'s catalog
``CRC32_ETHERNET``; the parallel update (which register and data bits each next register bit
XORs together) is derived from its public :meth:`~amaranth.lib.crc.Parameters.compute`
(see :func:`_masks`), for the numbers of valid octets a beat can hold.
"""

import functools

from amaranth import *
from amaranth.lib import stream, wiring
from amaranth.lib.crc import Algorithm, catalog
from amaranth.lib.wiring import In, Out

from hw.headers import IPv4Header, UDPHeader, ROCE_UDP_PORT
from hw.lib.fifo import PacketFifo
from hw.lib.octets import OctetPacker, lanes, octets_be
from hw.lib.stream import keep_count
from hw.net.ip import RoceRxMeta, RoceTxMeta, roce_rx_layout, roce_tx_layout, IP_PROTO_UDP

__all__ = ["crc32_step", "crc32_step_py", "crc32_value", "crc32_unpad", "residue_padded", "ICRC_PREFIX_STATE", "IcrcCheck",
           "IcrcInsert", "masked_ipudp_octets", "BTH_MASKED_OCTET"]

_ALGO = catalog.CRC32_ETHERNET
#: BTH octet whose value is replaced by 0xFF for the ICRC (FECN, BECN, resv6).
BTH_MASKED_OCTET = 4


@functools.lru_cache(maxsize=None)
def _masks(n_bits):
    """For each next-state bit, the mask over ``Cat(state, reflected data)`` to XOR together.

    One update of the raw register by a data word of ``n_bits`` is linear over GF(2) in the
    register and the (already reflected) word, so it is known from the images of the unit
    vectors: bit ``j < 32`` of a mask is set when register bit ``j`` alone, bit ``32 + j`` when
    data bit ``j`` alone, sets that next-state bit. Each image is one call of the public
    :meth:`~amaranth.lib.crc.Parameters.compute` of the catalog polynomial with no reflection
    and no output XOR (so that it returns the raw register), starting from that register bit
    or from zero. :class:`amaranth.lib.crc.Processor` builds its matrices the same way, but
    through a private method (``Parameters._matrices``) that may change between releases.
    """
    def step(initial, word):
        return Algorithm(crc_width=32, polynomial=_ALGO.polynomial, initial_crc=initial,
                         reflect_input=False, reflect_output=False,
                         xor_output=0)(n_bits).compute([word])
    images = [step(1 << j, 0) for j in range(32)] + [step(0, 1 << j) for j in range(n_bits)]
    return tuple(sum(((img >> i) & 1) << j for j, img in enumerate(images)) for i in range(32))


def crc32_step(m, state, octets):
    """Next CRC register after ``octets`` (list of 8-bit values in wire order), combinationally.

    ``state`` is the raw register as :class:`amaranth.lib.crc.Processor` keeps it (initial
    value 0xFFFFFFFF, not reflected, no output XOR). The operands go through named signals of
    ``m``: without them every output bit would carry its own copy of the input expression
    tree, which the simulator compiles (and elaboration walks) once per use.
    """
    word = Signal(8 * len(octets))
    vec = Signal(32 + 8 * len(octets))
    m.d.comb += word.eq(Cat(*octets))           # first octet in the low bits, as on a beat
    m.d.comb += vec.eq(Cat(state, word[::-1]))  # the algorithm reflects its input word
    return Cat(*[(vec & mk).xor() for mk in _masks(8 * len(octets))])


def crc32_step_py(state, octets):
    """Software twin of :func:`crc32_step` on ints (used for constants)."""
    word = int.from_bytes(bytes(octets), "little")
    refl = int(f"{word:0{8 * len(octets)}b}"[::-1], 2)
    vec = state | (refl << 32)
    return sum(((bin(vec & mk).count("1") & 1) << i)
               for i, mk in enumerate(_masks(8 * len(octets))))


def crc32_value(state):
    """Output CRC (the ``zlib.crc32`` value) of a register: reflect, then invert."""
    return state[::-1] ^ 0xFFFFFFFF


#: Register value after the 8 octets of 0xFF that stand in for the InfiniBand LRH.
ICRC_PREFIX_STATE = crc32_step_py(_ALGO.initial_crc, [0xFF] * 8)
#: Register value after a message followed by its own CRC, least significant octet first.
_RESIDUE_REG = int(f"{_ALGO(8).residue():032b}"[::-1], 2)


@functools.lru_cache(maxsize=None)
def _unzero_masks(n_octets):
    """For each register bit, the mask over the register of Z**-n_octets, Z the update by one
    zero octet (invertible: the polynomial's x**0 term is set). Found by inverting Z**n over
    GF(2) by Gauss-Jordan elimination of its columns (images of the unit vectors)."""
    n = 32
    cols = [crc32_step_py(1 << j, [0] * n_octets) for j in range(n)]   # Z**n e_j
    # rows[i] = (row i of Z**n, row i of the identity); reduce to (I, (Z**n)**-1).
    rows = [(sum(((cols[j] >> i) & 1) << j for j in range(n)), 1 << i) for i in range(n)]
    for c in range(n):
        piv = next(r for r in range(c, n) if (rows[r][0] >> c) & 1)
        rows[c], rows[piv] = rows[piv], rows[c]
        for r in range(n):
            if r != c and (rows[r][0] >> c) & 1:
                rows[r] = (rows[r][0] ^ rows[c][0], rows[r][1] ^ rows[c][1])
    return tuple(rows[i][1] for i in range(n))


def crc32_unpad(m, reg, pad, nl):
    """The register before ``pad`` (a signal, ``0 <= pad < nl``) trailing zero octets that
    :class:`_BeatCrc` fed after a packet's last octet: Z**-pad of ``reg``, as a chain of
    Z**-1, Z**-2, Z**-4, ... each applied when its bit of ``pad`` is set."""
    cur, k = reg, 0
    while (1 << k) < nl:
        stepped = Signal(32, name=f"crc_unpad{1 << k}")
        src = Signal(32, name=f"crc_unpad_in{1 << k}")
        m.d.comb += src.eq(cur)
        inv = Cat(*[(src & mk).xor() for mk in _unzero_masks(1 << k)])
        m.d.comb += stepped.eq(Mux(pad[k], inv, src))
        cur, k = stepped, k + 1
    return cur


def residue_padded(pad):
    """The register a correct packet (its ICRC included) leaves after ``pad`` zero octets."""
    return crc32_step_py(_RESIDUE_REG, [0] * pad) if pad else _RESIDUE_REG


def masked_ipudp_octets(m, *, tos_ttl_masked=True, total_length, ip_id, ip_flags, src_ip,
                        dst_ip, udp_src_port, udp_length):
    """The 28 octets of IPv4 + UDP header as the ICRC sees them (masked fields = 0xFF)."""
    ip = Signal(IPv4Header)
    udp = Signal(UDPHeader)
    m.d.comb += [
        ip.version.eq(4), ip.ihl.eq(5), ip.tos.eq(0xFF), ip.total_length.eq(total_length),
        ip.identification.eq(ip_id), ip.flags.eq(ip_flags), ip.fragment_offset.eq(0),
        ip.ttl.eq(0xFF), ip.protocol.eq(IP_PROTO_UDP), ip.checksum.eq(0xFFFF),
        ip.src.eq(src_ip), ip.dst.eq(dst_ip),
        udp.src_port.eq(udp_src_port), udp.dst_port.eq(ROCE_UDP_PORT),
        udp.length.eq(udp_length), udp.checksum.eq(0xFFFF),
    ]
    return octets_be(ip.as_value(), 20) + octets_be(udp.as_value(), 8)


class _BeatCrc:
    """CRC register advanced by the keep-masked beats (BTH octet 4 masked) of the RoCE stream
    ``s`` (BTH first) that are taken (``fire``: ``s.valid & s.ready``).

    The first beat of a packet starts from the ICRC prefix folded with the packet's IPv4 and
    UDP headers, :func:`masked_ipudp_octets` of ``ipudp``. ``pos`` is the octet offset of the
    beat in its packet (saturating past 64 KiB); ``next`` the register after this beat and
    ``pad`` zero octets (the lanes past ``keep`` of a partial last beat, below).
    """

    def __init__(self, width):
        self.width = width

    def add(self, m, s, **ipudp):
        nl = self.width // 8
        self.fire = fire = s.valid & s.ready
        first = Signal(init=1)
        self.pos = pos = Signal(17)
        with m.If(fire):
            m.d.sync += [first.eq(s.p.last),
                         pos.eq(Mux(s.p.last, 0, Mux(pos >= (1 << 16), pos, pos + nl)))]
        start_state = crc32_step(m, Const(ICRC_PREFIX_STATE, 32), masked_ipudp_octets(m, **ipudp))
        beat, keep = s.p.data, s.p.keep
        self.reg = Signal(32)
        octs = lanes(beat, nl)
        # BTH octet 4 is fixed at a static lane of a static beat.
        b4, l4 = divmod(BTH_MASKED_OCTET, nl)
        octs = [Mux(pos == b4 * nl, 0xFF, o) if j == l4 else o for j, o in enumerate(octs)]
        # Named signals keep the expression trees shallow (elaboration walks them per use).
        start_sig = Signal(32)
        src = Signal(32)
        m.d.comb += [start_sig.eq(start_state), src.eq(Mux(first, start_sig, self.reg))]
        masked = Signal(self.width)
        m.d.comb += masked.eq(Cat(*octs))
        # Every beat goes through the one nl-octet matrix, its octets past ``keep`` as zeros.
        # A beat of k < nl octets (the last of a packet, contiguous from lane 0) is then
        # followed by pad = nl - k zero octets that the packet does not have: ``next`` is
        # Z**pad of the true register, Z the update by one zero octet (an invertible linear map
        # of the register). Consumers undo or absorb that: IcrcCheck compares with Z**pad of
        # the residue (a constant per pad), IcrcInsert applies Z**-pad (:func:`crc32_unpad`).
        # Why not one matrix per k, or a chain of nl/2-, nl/4-, ... 1-octet matrices: at width
        # 64 the chain and its octet selection were about 1,600 of this block's 2,700 LUT4 in
        # synth_ecp5, in each of the two ICRC units.
        zeroed = Signal(self.width)
        m.d.comb += zeroed.eq(Cat(*[Mux(keep[j], o, 0) for j, o in enumerate(lanes(masked, nl))]))
        self.next = Signal(32)
        self.pad = Signal(range(nl))
        m.d.comb += [self.next.eq(crc32_step(m, src, lanes(zeroed, nl))),
                     self.pad.eq(keep_count(~keep)[:len(self.pad)] if nl > 1 else 0)]
        with m.If(fire):
            m.d.sync += self.reg.eq(self.next)
        return self


class IcrcCheck(wiring.Component):
    """Check the ICRC of received RoCE packets; forward good ones, drop bad ones.

    The input is what :class:`~hw.net.ip.EthIpRx` emits: BTH .. ICRC, UDP length − 8 octets,
    with :data:`~hw.net.ip.RoceRxMeta` on every beat. The CRC runs over every octet, the ICRC
    included: a correct packet leaves the register at the CRC's residue, so the ICRC never has
    to be located. Packets are buffered whole (:class:`~hw.lib.fifo.PacketFifo` with the
    metadata as per-packet side data; a packet larger than the buffer is dropped and counted in
    ``cnt_overflow``) and released only when good. The verdict is registered: it is taken the
    cycle after a packet's last beat, and the input waits that cycle (one cycle per packet).
    The output is the input unchanged (ICRC still present).

    This is the receive path's commit point (issue 21, docs/architecture.md "Where a frame
    waits"): the MAC passes frames on cut-through, and a packet whose frame then proved bad
    arrives with ``err`` on its last beat; it is dropped here like a bad ICRC (and counted by
    the MAC, not in ``cnt_bad``). Nothing behind this block sees a packet before its commit.

    A packet is good only if it also has exactly ``meta.udp_length − 8`` octets. EthIpRx
    forwards a frame that ends before its UDP length (and counts it ``truncated``); if its last
    four octets are the ICRC of what did arrive (the IPv4 and UDP lengths are covered, so only
    a forger makes one), the CRC alone would pass it, and the parser would promise the
    consumers a payload of the UDP length that never comes: one such frame stopped the receive
    path (found by tools/fuzz.py). Such packets are dropped here and counted only by EthIpRx.

    Parameters
    ----------
    width : int
    depth : int
        Buffer beats (any number; a power of two is the cheapest); must hold the largest
        packet (PMTU 4096 + 64 octets) to pass it.

    Ports
    -----
    i, o : stream of :func:`~hw.net.ip.roce_rx_layout`
    cnt_ok, cnt_bad, cnt_overflow : Out(32)
    """

    def __init__(self, width, depth=1024, max_packets=8):
        self._width = width
        self._depth = depth
        self._max_packets = max_packets
        sig = stream.Signature(roce_rx_layout(width))
        super().__init__({
            "i": In(sig), "o": Out(sig),
            "cnt_ok": Out(32), "cnt_bad": Out(32), "cnt_overflow": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.fifo = pf = PacketFifo(self._width, self._depth, side=RoceRxMeta,
                                            max_packets=self._max_packets, drop_oversize=True)
        # Out: committed packets only, so ``err`` is 0 from here on.
        m.d.comb += [self.o.valid.eq(pf.r.valid), pf.r.ready.eq(self.o.ready),
                     self.o.p.data.eq(pf.r.p.data), self.o.p.keep.eq(pf.r.p.keep),
                     self.o.p.last.eq(pf.r.p.last), self.o.p.meta.eq(pf.r.p.side),
                     self.o.p.err.eq(0)]
        m.d.comb += self.cnt_overflow.eq(pf.cnt_overflow)

        meta = self.i.p.meta
        crc = _BeatCrc(self._width).add(
            m, self.i, total_length=meta.udp_length + 20, ip_id=meta.ip_id,
            ip_flags=meta.ip_flags, src_ip=meta.src_ip, dst_ip=meta.dst_ip,
            udp_src_port=meta.udp_src_port, udp_length=meta.udp_length)
        fire, pos = crc.fire, crc.pos
        # Octets of the packet so far, this beat included (pos saturates past 64 KiB).
        length_ok = (pos + keep_count(self.i.p.keep)) == (meta.udp_length - 8)
        nl = self._width // 8
        residue = Signal(32)
        m.d.comb += residue.eq(_RESIDUE_REG)
        if nl > 1:
            with m.Switch(crc.pad):
                for p in range(1, nl):
                    with m.Case(p):
                        m.d.comb += residue.eq(residue_padded(p))

        # The verdict comes a cycle after the last beat (``late``), from flip-flops: the CRC
        # register (it holds the last beat's ``next`` then), the residue of that beat's pad,
        # the length check, the metadata (the packet's side data) and whether the buffer
        # dropped the packet. The input waits that cycle. (At the last beat the CRC's XOR
        # tree, the 32-bit compare and the length adder ran into the buffer's commit pointer
        # and side-data FIFO: 16 to 17 LUT levels, the most register groups at that depth in
        # the core clock of the ECPIX-5 build of 045cda2.)
        late = Signal()
        v_res, v_len, v_lost, v_err = Signal(32), Signal(), Signal(), Signal()
        v_meta = Signal(RoceRxMeta)
        ended = fire & self.i.p.last
        m.d.sync += late.eq(ended)
        with m.If(ended):
            m.d.sync += [v_res.eq(residue), v_len.eq(length_ok), v_lost.eq(pf.w_lost),
                         v_meta.eq(meta), v_err.eq(self.i.p.err)]
        m.d.comb += [pf.w.p.data.eq(self.i.p.data), pf.w.p.keep.eq(self.i.p.keep),
                     pf.w.p.last.eq(self.i.p.last), pf.w.p.side.eq(v_meta),
                     pf.w.valid.eq(self.i.valid & ~late), self.i.ready.eq(pf.w.ready & ~late)]
        good = (crc.reg == v_res) & v_len & ~v_err
        # A packet the buffer dropped (too large) is counted there; its discard is harmless.
        m.d.comb += [pf.w_commit.eq(late & good & ~v_lost),
                     pf.w_discard.eq(late & ~good)]
        with m.If(late):
            with m.If(good):
                m.d.sync += self.cnt_ok.eq(self.cnt_ok + 1)
            with m.Elif(v_len & ~v_err):
                m.d.sync += self.cnt_bad.eq(self.cnt_bad + 1)
        return m


class IcrcInsert(wiring.Component):
    """Append the ICRC to a transmitted RoCE packet.

    The input carries BTH .. pad (``meta.length − 4`` octets) with
    :data:`~hw.net.ip.RoceTxMeta`; the output carries the same plus the 4 ICRC octets, least
    significant first, with the metadata unchanged. The IPv4/UDP fields the ICRC covers are
    those :class:`~hw.net.ip.EthIpTx` will send: total length ``meta.length + 28``,
    identification ``meta.ip_id``, DF, source ``own_ip``, destination ``meta.dst_ip``, UDP
    source port ``meta.udp_src_port``, UDP length ``meta.length + 8``.

    Ports
    -----
    i, o : stream of :func:`~hw.net.ip.roce_tx_layout`
    own_ip : In(32)
    """

    def __init__(self, width):
        self._width = width
        sig = stream.Signature(roce_tx_layout(width))
        super().__init__({"i": In(sig), "o": Out(sig), "own_ip": In(32)})

    def elaborate(self, platform):
        m = Module()
        w, nl = self._width, self._width // 8
        m.submodules.packer = packer = OctetPacker(w, RoceTxMeta)
        wiring.connect(m, packer.o, wiring.flipped(self.o))
        meta = self.i.p.meta
        crc = _BeatCrc(w).add(
            m, self.i, total_length=meta.length + 28, ip_id=meta.ip_id, ip_flags=0b010,
            src_ip=self.own_ip, dst_ip=meta.dst_ip, udp_src_port=meta.udp_src_port,
            udp_length=meta.length + 8)
        fire = crc.fire
        # The true register of a last beat of fewer than nl octets (see _BeatCrc).
        unpadded = crc32_unpad(m, crc.next, crc.pad, nl)

        # The ICRC octets follow the last data beat through the packer, at most nl per beat.
        icrc = Signal(32)
        tail_meta = Signal(RoceTxMeta)
        sent = Signal(range(5))
        icrc_octets = lanes(icrc, 4)
        with m.FSM(name="icrc"):
            with m.State("PACKET_DATA"):
                packer.forward(m, self.i, last=0, side=meta)
                with m.If(fire & self.i.p.last):
                    m.d.sync += [icrc.eq(crc32_value(unpadded)), tail_meta.eq(meta),
                                 sent.eq(0)]
                    m.next = "ICRC"
            with m.State("ICRC"):
                with m.Switch(sent):
                    for s in range(4):
                        with m.Case(s):
                            k = min(nl, 4 - s)
                            octs = icrc_octets[s:s + k] + [Const(0, 8)] * (nl - k)
                            m.d.comb += [packer.i.p.data.eq(Cat(*octs)), packer.i.p.n.eq(k),
                                         packer.i.p.last.eq(s + k >= 4)]
                m.d.comb += [packer.i.valid.eq(1), packer.i.p.lo.eq(0),
                             packer.i.p.side.eq(tail_meta)]
                with m.If(packer.i.ready):
                    m.d.sync += sent.eq(sent + min(nl, 4))
                    with m.If(packer.i.p.last):
                        m.next = "PACKET_DATA"
        return m

# Ref: IEEE 802.3 §3.1.1 (frame: preamble, SFD, FCS), §4.2.3.3 (minimum frame 64 octets, pad),
#      §4.4.2 (interframe gap 96 bit times), clause 46 (XGMII: TXD/TXC, RXD/RXC, /I/ /S/ /T/
#      /E/, §46.3.1.4 start alignment and the deficit idle count); hw/lib/stream.py
#      (PacketStream); hw/lib/fifo.py (PacketFifo); hw/net/mac.py (the GMII MAC this one
#      follows); amaranth.lib.crc catalog CRC32_ETHERNET.
"""10 Gb/s Ethernet MAC over a 64-bit XGMII: receiver, transmitter, and the two with buffers.

Everything runs in one clock domain, ``sync`` = the 156.25 MHz XGMII clock (RX and TX clocks
assumed to be the same, as with a 10GBASE-R PCS whose receive side is re-timed onto the
transmit clock). The XGMII is the 64-bit single-data-rate form (two 32-bit XGMII transfers per
clock, as cocotbext-eth models it): lane ``i`` is ``xgmii_*xd[8i:8i+8]``, ``xgmii_*xc[i]`` is 1
for a control character in lane ``i``, lane 0 goes first on the wire. The user side is a
``PacketStream(64)`` (lane 0 = first octet): at line rate it carries one beat in most cycles.

A frame on the XGMII is /S/ (in lane 0 or lane 4; 802.3 starts a frame in lane 0 of a 32-bit
column), six preamble octets 0x55, the SFD 0xD5, the frame, its FCS, then /T/ in any lane and
/I/ to the end of the word and through the gap. The inter-frame gap counts from /T/.

Bad frames on receive
---------------------
As in :class:`hw.net.mac.GmiiRx`: each frame goes into a :class:`~hw.lib.fifo.PacketFifo`
and is committed only when it ends well. A frame that holds /E/ or any other control character
before its /T/, has fewer than 64 octets (FCS included), a bad FCS, or did not fit in the
buffer is discarded and counted once, under the first of ``rx_errors``, ``runts``,
``fcs_errors``, ``overflows``. Downstream blocks see only good frames, without the FCS, lane 0
first whatever lane the /S/ came in. Latency: a frame appears a few cycles after its /T/.

The receiver takes frames back to back at the shortest gap a receiver may see (802.3 §4.4.2:
the gap may shrink to 5 octets on the way, e.g. /T/ in lane 3 and /S/ in lane 0 of the next
word, or /T/ in lane 7 and /S/ in lane 4 of the next one). Shorter gaps pass too, except /T/ in
lanes 0..3 of the word whose lane 4 holds the next /S/ after a lane-0 start: that frame then
counts in ``rx_errors`` and the next one is lost.

Transmit
--------
:class:`XgmiiTx` sends /S/ + 6 x 0x55 + SFD, the frame, zero padding up to 60 octets, the FCS,
/T/, and idles. A frame starts in lane 0 or lane 4, chosen with the deficit idle count of
§46.3.1.4: the gap after /T/ is rounded down to a multiple of four octets while at most three
idles are owed, up otherwise, so that the gap is 9 to 15 octets and 12 on average (frames
of ``L`` octets with FCS take ``(L + 8 + 12) / 8`` cycles each, back to back). XGMII cannot
pause inside a frame: an input that runs dry mid-frame is an underrun, sent as /E/ in the words
that should have been data (the receiver drops the frame) and counted. :class:`XgmiiMac` puts
a store-and-forward :class:`PacketFifo` in front of the transmitter so that this cannot happen
for frames that fit in it.

CRC over a 64-bit word that ends at any lane
--------------------------------------------
Both sides use ``amaranth.lib.crc`` (CRC32_ETHERNET at ``data_width=64``: the whole word is
bit-reflected, so lane 0's least significant bit goes in first, as on the wire) on whole
words, the last one with its lanes past the end of the frame set to zero. Appending ``z`` zero
octets is a fixed linear map of the CRC register, so:

- the receiver feeds the frame with its FCS; a good frame then leaves one of eight constants
  in the register (the residue followed by ``z`` zero octets, ``z = 1 .. 8`` by the lane of
  /T/), computed here with the same library's software model;
- the transmitter needs the CRC itself, so it undoes the ``z`` zero octets (``z = 0 .. 7``)
  with the inverse map (a 32 x 32 matrix over GF(2) per ``z``, again derived from the library's
  model). ``amaranth.lib.crc.Processor`` has no way to load a state or change its data width,
  which a final word of 1 to 7 octets would need; this small correction is the only CRC logic
  written here.
"""

from amaranth import *
from amaranth.lib import crc, wiring
from amaranth.lib.wiring import In, Out

from hw.lib.stream import FrameStream, PacketStream, RegisterSlice, keep_count
from hw.lib.fifo import PacketFifo
from hw.net.mac import PREAMBLE, SFD, MIN_FRAME, IFG, cut_through_start

__all__ = ["XgmiiRx", "XgmiiTx", "XgmiiMac", "IDLE", "START", "TERMINATE", "ERROR"]

IDLE, START, TERMINATE, ERROR = 0x07, 0xFB, 0xFD, 0xFE
LANES = 8
FCS_LEN = 4
_ALGO = crc.catalog.CRC32_ETHERNET
_MASK32 = 0xFFFF_FFFF


def _fcs_crc():
    return _ALGO(data_width=64).create()


def _lane_const(octet, lanes=LANES):
    return int.from_bytes(bytes([octet] * lanes), "little")


def _rx_residues():
    """CRC output after a good frame (with FCS) followed by ``8 - j`` zero octets, ``j = 0..7``
    (the /T/ word fed with its lanes from /T/ on zeroed). The same for every good frame: the
    register holds the residue after the FCS, and zeros move it by a fixed map."""
    p8 = _ALGO(data_width=8)
    frame = b"any frame"
    fcs = p8.compute(frame).to_bytes(4, "little")
    return [p8.compute(frame + fcs + bytes(LANES - j)) for j in range(LANES)]


def _reflect32(x):
    return int(f"{x:032b}"[::-1], 2)


def _gf2_inverse(cols):
    """Inverse of a 32 x 32 GF(2) matrix given by its column images (``cols[i]`` = image of bit
    ``i``); returns the inverse's column images."""
    n = 32
    # Rows of [A | I], A's row r as a bit mask over columns.
    rows = [sum(((cols[c] >> r) & 1) << c for c in range(n)) | (1 << (n + r)) for r in range(n)]
    for c in range(n):
        p = next(r for r in range(c, n) if (rows[r] >> c) & 1)
        rows[c], rows[p] = rows[p], rows[c]
        for r in range(n):
            if r != c and (rows[r] >> c) & 1:
                rows[r] ^= rows[c]
    inv_rows = [row >> n for row in rows]
    return [sum(((inv_rows[r] >> c) & 1) << r for r in range(n)) for c in range(n)]


def _tx_unzero_rows():
    """For ``z = 0 .. 7``: rows of the map taking the CRC register (as
    ``amaranth.lib.crc.Processor`` holds it: unreflected, no output XOR) after ``z`` appended
    zero octets back to the register before them. Row ``i`` is the mask of register bits whose
    parity gives bit ``i``."""
    one_zero_octet = [
        crc.Algorithm(crc_width=32, polynomial=_ALGO.polynomial, initial_crc=1 << i,
                      reflect_input=False, reflect_output=False, xor_output=0)(8).compute([0])
        for i in range(32)]
    inv = _gf2_inverse(one_zero_octet)

    def apply(cols, x):
        y = 0
        for i in range(32):
            if (x >> i) & 1:
                y ^= cols[i]
        return y

    out = []
    cols = [1 << i for i in range(32)]             # identity: z = 0
    for z in range(LANES):
        out.append([sum(((cols[c] >> r) & 1) << c for c in range(32)) for r in range(32)])
        cols = [apply(inv, c) for c in cols]
    return out


def _first_lane_onehot(m, bits, name):
    """One-hot of the lowest set bit of ``bits`` (0 if none)."""
    onehot = Signal(len(bits), name=name)
    m.d.comb += onehot.eq(bits & ~(bits - 1))
    return onehot


class XgmiiRx(wiring.Component):
    """XGMII receiver: aligns /S/ to lane 0, strips preamble/SFD/FCS, drops bad frames, buffers
    good ones.

    Parameters
    ----------
    depth : int
        Frame buffer size in 64-bit beats (power of two). Frames longer than ``8 * depth``
        octets are dropped as overflows; so are frames arriving while the buffer is full.
    cut_through : bool
        As :class:`hw.net.mac.GmiiRx` ``cut_through``: every word is passed on once the next
        shows it holds no FCS octet; the frame's last beat waits for the verdict (two cycles
        after /T/) and carries it, ``err``. A frame the buffer cannot take is cut and closed
        with an ``err`` beat once there is room; frames that start before then are dropped.

    Ports
    -----
    rxd : In(64); rxc : In(8)
        XGMII receive side, sampled on the ``sync`` clock (registered once inside).
    o : Out(PacketStream(64)), or Out(FrameStream(64)) with ``cut_through``
        Good frames, destination MAC first (lane 0), without FCS (cut-through: every frame,
        ``err`` on a bad one's last beat).
    frames_ok, fcs_errors, runts, rx_errors, overflows : Out(32)
        Frame counters (wrapping). A bad frame counts once, under the first of: ``rx_errors``
        (/E/ or another control character before /T/), ``runts`` (< 64 octets with FCS),
        ``fcs_errors``, ``overflows`` (did not fit in the buffer).
    backlog : Out(1)
        The buffer holds at least ``depth // 2`` beats (registered).
    """

    def __init__(self, depth=4096, *, cut_through=False):
        self._depth, self._cut = depth, cut_through
        super().__init__({
            "rxd": In(64), "rxc": In(8),
            "o": Out(FrameStream(64) if cut_through else PacketStream(64)),
            "frames_ok": Out(32), "fcs_errors": Out(32), "runts": Out(32),
            "rx_errors": Out(32), "overflows": Out(32),
            "backlog": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        cut = self._cut
        m.submodules.fifo = fifo = PacketFifo(64, self._depth, registered_ready=True, err=cut)
        m.submodules.crc = fcs = _fcs_crc()
        wiring.connect(m, wiring.flipped(self.o), fifo.r)
        m.d.sync += self.backlog.eq(fifo.level >= self._depth // 2)

        # Stage 0: input register (the XGMII comes straight from pins or a PCS).
        rxd = Signal(64)
        rxc = Signal(8)
        m.d.sync += [rxd.eq(self.rxd), rxc.eq(self.rxc)]

        # Stage 1: the previous word and per-lane flags of it, so that the alignment below and
        # the decisions after it read flops, not 8-bit compares.
        def lane(d, i):
            return d[8 * i:8 * i + 8]

        prev_d = Signal(64)
        prev_c = Signal(8)
        prev_s = Signal(8)           # /S/
        prev_t = Signal(8)           # /T/
        prev_p = Signal(8)           # data 0x55
        prev_f = Signal(8)           # data 0xD5 (SFD)
        m.d.sync += [prev_d.eq(rxd), prev_c.eq(rxc)]
        m.d.sync += [prev_s[i].eq(rxc[i] & (lane(rxd, i) == START)) for i in range(LANES)]
        m.d.sync += [prev_t[i].eq(rxc[i] & (lane(rxd, i) == TERMINATE)) for i in range(LANES)]
        m.d.sync += [prev_p[i].eq(~rxc[i] & (lane(rxd, i) == PREAMBLE)) for i in range(LANES)]
        m.d.sync += [prev_f[i].eq(~rxc[i] & (lane(rxd, i) == SFD)) for i in range(LANES)]
        # ... and the same flags of the current word, for the half that the alignment takes
        # from it.
        cur_s = Signal(4)
        cur_t = Signal(4)
        cur_p = Signal(4)
        cur_f = Signal(4)
        m.d.comb += [cur_s[i].eq(rxc[i] & (lane(rxd, i) == START)) for i in range(4)]
        m.d.comb += [cur_t[i].eq(rxc[i] & (lane(rxd, i) == TERMINATE)) for i in range(4)]
        m.d.comb += [cur_p[i].eq(~rxc[i] & (lane(rxd, i) == PREAMBLE)) for i in range(4)]
        m.d.comb += [cur_f[i].eq(~rxc[i] & (lane(rxd, i) == SFD)) for i in range(4)]

        # Alignment: a frame whose /S/ is in lane 4 is read half a word late (upper half of the
        # previous word, lower half of this one), so that /S/ is in lane 0 of the aligned word.
        # The choice changes at each /S/ in lane 0 or 4 of the previous word. Going from late
        # to on time skips nothing (the lower half of the /S/ word shows twice: /S/ in lane 4
        # of one aligned word, ignored, then in lane 0 of the next); going from on time to
        # late skips the lower half of the /S/ word, which holds no /T/ when the gap before
        # /S/ is at least 5 octets.
        shift_r = Signal()
        shift = Signal()
        m.d.comb += shift.eq(prev_s[4] | (~prev_s[0] & shift_r))
        m.d.sync += shift_r.eq(shift)

        al_d = Signal(64)
        al_c = Signal(8)
        al_s = Signal(8)
        al_t = Signal(8)
        al_p = Signal(8)
        al_f = Signal(8)
        with m.If(shift):
            m.d.comb += [
                al_d.eq(Cat(prev_d[32:], rxd[:32])), al_c.eq(Cat(prev_c[4:], rxc[:4])),
                al_s.eq(Cat(prev_s[4:], cur_s)), al_t.eq(Cat(prev_t[4:], cur_t)),
                al_p.eq(Cat(prev_p[4:], cur_p)), al_f.eq(Cat(prev_f[4:], cur_f)),
            ]
        with m.Else():
            m.d.comb += [al_d.eq(prev_d), al_c.eq(prev_c), al_s.eq(prev_s), al_t.eq(prev_t),
                         al_p.eq(prev_p), al_f.eq(prev_f)]

        # Stage 2 registers: the aligned word and what the frame logic needs to know of it.
        a_d = Signal(64)
        a_start = Signal()           # /S/, 6 x 0x55, SFD: a frame starts, data next word
        a_ctrl = Signal()            # some lane is a control character
        a_j = Signal(range(LANES))   # ... the first such lane
        a_term = Signal()            # ... and it is /T/
        a_mask = Signal(64)          # the lanes before it (all when none)
        first = _first_lane_onehot(m, al_c, "al_first")
        m.d.sync += [
            a_d.eq(al_d),
            a_start.eq(al_s[0] & al_p[1:7].all() & al_f[7]),
            a_ctrl.eq(al_c.any()),
            a_term.eq((first & al_t).any()),
            a_mask.eq(Cat(*(Mux((al_c & ((2 << i) - 1)).any(), 0, 0xFF)
                            for i in range(LANES)))),
        ]
        for i in reversed(range(LANES)):
            with m.If(first[i]):
                m.d.sync += a_j.eq(i)

        # Frame logic. Data words are held back one word: the last four octets before /T/ are
        # the FCS, so a word is written once the next word shows where the frame ends.
        hold = Signal(64)
        hold_valid = Signal()
        words = Signal(range(MIN_FRAME // LANES + 1))   # whole data words, saturating at 8
        overflow = Signal()
        # The frame ended with /T/ in lane 5..7: its last data octets (lanes 0 .. j-5 of the /T/
        # word) are written in the next cycle.
        tail = Signal(64)
        tail_keep = Signal(LANES)
        tail_pending = Signal()
        # End of frame, latched for the check in the next cycle.
        end_pending = Signal()
        end_j = Signal(range(LANES))
        end_err = Signal()
        end_short = Signal()
        end_ovf = Signal()
        # Verdict, applied one cycle later still (from flops, as GmiiRx's FRAME_END).
        v_go = Signal()
        v_err = Signal()
        v_short = Signal()
        v_crc_bad = Signal()
        v_ovf = Signal()

        w_valid = Signal()
        w_data = Signal(64)
        w_keep = Signal(LANES)
        w_last = Signal()
        lost = Signal()              # a beat offered now that the buffer cannot take
        m.d.comb += lost.eq(w_valid & ~fifo.w.ready)
        # Cut-through (``cut``): every beat is published as it is written. The frame's last
        # beat is stashed (``lb_*``) at its end and written with the verdict (``w_err``) two
        # cycles later. A refused beat cuts the frame (``cut_frame``: no more of it is written)
        # and owes the reader a last beat with ``err`` (``closing``), written in the first
        # cycle with room and no other write; a frame that starts while one is owed is cut
        # from its start.
        w_err = Signal()
        cut_frame = Signal()
        closing = Signal()
        close_now = Signal()
        lb_data = Signal(64)
        lb_keep = Signal(LANES)
        lb_have = Signal()
        if cut:
            m.d.comb += [
                close_now.eq(closing & ~w_valid & fifo.w.ready),
                fifo.w_commit.eq(1),
                fifo.w.valid.eq(w_valid | close_now),
                fifo.w.payload.data.eq(w_data),
                fifo.w.payload.keep.eq(Mux(close_now, 1, w_keep)),
                fifo.w.payload.last.eq(w_last | close_now),
                fifo.w.payload.err.eq(w_err | close_now),
            ]
            with m.If(lost):
                m.d.sync += [cut_frame.eq(1), closing.eq(1), overflow.eq(1)]
            with m.Elif(close_now):
                m.d.sync += closing.eq(0)
        else:
            m.d.comb += [
                fifo.w.valid.eq(w_valid),
                fifo.w.payload.data.eq(w_data),
                fifo.w.payload.keep.eq(w_keep),
                fifo.w.payload.last.eq(w_last),
            ]

        m.d.comb += fcs.data.eq(a_d & a_mask)
        # keep of the last beat by the lane of /T/: the held word's lanes 0 .. 3 + j (j <= 4),
        # or the /T/ word's lanes 0 .. j - 5 (j >= 5).
        end_keep = Array(Const(min(0xFF, (1 << (4 + j)) - 1), 8) for j in range(LANES))
        end_tail_keep = Array(Const(max(0, (1 << max(0, j - 4)) - 1), 8) for j in range(LANES))

        with m.FSM(name="rx"):
            with m.State("IDLE"):
                with m.If(a_start):
                    m.d.comb += fcs.start.eq(1)
                    m.d.sync += [hold_valid.eq(0), words.eq(0), overflow.eq(0)]
                    if cut:
                        # (``lost``: a close is owed from this cycle on.)
                        m.d.sync += [cut_frame.eq(closing | lost), overflow.eq(closing | lost)]
                    m.next = "FRAME_DATA"

            with m.State("FRAME_DATA"):
                # Every word goes into the CRC, the /T/ word with its lanes from /T/ on zeroed.
                m.d.comb += fcs.valid.eq(1)
                with m.If(~a_ctrl):
                    m.d.comb += [w_valid.eq(hold_valid & ~cut_frame), w_data.eq(hold),
                                 w_keep.eq(0xFF)]
                    m.d.sync += [hold.eq(a_d), hold_valid.eq(1)]
                    with m.If(words != MIN_FRAME // LANES):
                        m.d.sync += words.eq(words + 1)
                    with m.If(lost):
                        m.d.sync += overflow.eq(1)
                with m.Else():
                    # End of frame at lane a_j (/T/, or an error if it is anything else).
                    # Octets a_j-4 .. a_j-1 of this word, counting back into the held word, are
                    # the FCS.
                    if not cut:
                        m.d.comb += [w_valid.eq(hold_valid), w_data.eq(hold)]
                        with m.If(a_j <= 4):
                            m.d.comb += [w_keep.eq(end_keep[a_j]), w_last.eq(1)]
                        with m.Else():
                            m.d.comb += w_keep.eq(0xFF)
                            m.d.sync += [tail.eq(a_d), tail_pending.eq(1),
                                         tail_keep.eq(end_tail_keep[a_j])]
                    else:
                        # The last beat waits for the verdict (``lb_*``); with /T/ in lane 5..7
                        # the held word goes now, whole, and the /T/ word is the last beat.
                        with m.If(a_j <= 4):
                            m.d.sync += [lb_data.eq(hold), lb_keep.eq(end_keep[a_j]),
                                         lb_have.eq(hold_valid & ~cut_frame)]
                        with m.Else():
                            m.d.comb += [w_valid.eq(hold_valid & ~cut_frame), w_data.eq(hold),
                                         w_keep.eq(0xFF)]
                            m.d.sync += [lb_data.eq(a_d), lb_keep.eq(end_tail_keep[a_j]),
                                         lb_have.eq(~cut_frame & ~lost)]
                    m.d.sync += [
                        end_pending.eq(1), end_j.eq(a_j), end_err.eq(~a_term),
                        end_short.eq(words < MIN_FRAME // LANES),
                        end_ovf.eq(overflow | lost),
                    ]
                    m.next = "IDLE"

        # The cycle after the end: the tail beat, and the checks (the CRC register now holds
        # the whole frame; a next frame's /S/ in this cycle only restarts it at the edge).
        residues = Array(Const(r, 32) for r in _rx_residues())
        with m.If(tail_pending):
            m.d.comb += [w_valid.eq(1), w_data.eq(tail), w_keep.eq(tail_keep), w_last.eq(1)]
            m.d.sync += tail_pending.eq(0)
        m.d.sync += v_go.eq(end_pending)
        with m.If(end_pending):
            m.d.sync += [
                end_pending.eq(0),
                v_err.eq(end_err), v_short.eq(end_short),
                v_crc_bad.eq(fcs.crc != residues[end_j]),
                v_ovf.eq(end_ovf | lost),
            ]

        # Two cycles after the end: commit or discard (cut-through: the last beat with the
        # verdict). A next frame writes nothing before the cycle after this one (its first data
        # word is held back).
        if cut:
            with m.If(v_go & lb_have):
                m.d.comb += [w_valid.eq(1), w_data.eq(lb_data), w_keep.eq(lb_keep),
                             w_last.eq(1), w_err.eq(v_err | v_short | v_crc_bad | v_ovf)]
            with m.If(v_go):
                m.d.sync += lb_have.eq(0)

        def drop():
            if not cut:
                m.d.comb += fifo.w_discard.eq(1)

        with m.If(v_go):
            with m.If(v_err):
                drop()
                m.d.sync += self.rx_errors.eq(self.rx_errors + 1)
            with m.Elif(v_short):
                drop()
                m.d.sync += self.runts.eq(self.runts + 1)
            with m.Elif(v_crc_bad):
                drop()
                m.d.sync += self.fcs_errors.eq(self.fcs_errors + 1)
            with m.Elif(v_ovf | (lost if cut else 0)):
                # (Cut-through: ``lost``, the last beat refused now; the close beat follows.)
                drop()
                m.d.sync += self.overflows.eq(self.overflows + 1)
            with m.Else():
                if not cut:
                    m.d.comb += fifo.w_commit.eq(1)
                m.d.sync += self.frames_ok.eq(self.frames_ok + 1)
        return m


def _dic_next(k, o4, d):
    """Deficit idle count (§46.3.1.4) as plain arithmetic, for the transmitter and its tests.

    ``k``: lane of /T/ in its word before the output shift, ``o4``: the current shift (0 or 1
    for 4 octets), ``d``: idles owed (0..3). The next /S/ goes ``g`` octets after /T/ (``g``
    counts /T/): 12 rounded down to a lane 0 or 4 position while at most 3 idles are owed in
    all, rounded up otherwise. Returns (whole idle words between the /T/ word and the /S/
    word, next shift, next idles owed).
    """
    e = (k + 4 * o4) % 4
    if e == 0:
        g, d2 = IFG, d
    elif d + e <= 3:
        g, d2 = IFG - e, d + e
    else:
        g, d2 = IFG + 4 - e, d + e - 4
    s = k + 4 * o4 + g                   # position of /S/ counted from the /T/ word's lane 0
    return s // LANES - 1, (s % LANES) // 4, d2


class XgmiiTx(wiring.Component):
    """XGMII transmitter: /S/ + preamble + SFD, data, pad to 60, FCS, /T/, deficit idle count.

    Ports
    -----
    i : In(PacketStream(64))
        Frames from destination MAC on (lane 0 first), without FCS. ``ready`` is high only
        while frame data is being sent (one beat per cycle).
    txd : Out(64); txc : Out(8)
        XGMII transmit side, registered.
    frames, underruns : Out(32)
        Frames sent; frames during which the input ran dry (sent with /E/ words).
    start : In(1)
        Only with ``gated``: the next frame may start (the cut-through start rule,
        :func:`hw.net.mac.cut_through_start`), sampled with ``i.valid`` in Idle and Gap.
    """

    def __init__(self, *, gated=False):
        self._gated = gated
        super().__init__({
            "i": In(PacketStream(64)),
            **({"start": In(1)} if gated else {}),
            "txd": Out(64, init=_lane_const(IDLE)), "txc": Out(8, init=0xFF),
            "frames": Out(32), "underruns": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.crc = fcs = _fcs_crc()
        idle_d = _lane_const(IDLE)

        # Word stream before the output shift ("aligned": /S/ in lane 0), one word per cycle,
        # with what the later stages fill in: the FCS and /T/ after the last data word, and
        # the shift of each word.
        def word_record(name):
            return {
                "d": Signal(64, name=f"{name}_d", init=idle_d),
                "c": Signal(8, name=f"{name}_c", init=0xFF),
                "last": Signal(name=f"{name}_last"),    # last data word: rr data lanes
                "tail": Signal(name=f"{name}_tail"),    # the word after it (rr >= 4)
                "rr": Signal(range(LANES + 1), name=f"{name}_rr"),
                "o4": Signal(name=f"{name}_o4"),        # shift by 4 lanes on output
            }

        e = word_record("emit")      # comb, from the frame FSM
        m.d.comb += [e["d"].eq(idle_d), e["c"].eq(0xFF)]

        o4 = Signal()                # current shift
        deficit = Signal(2)          # idles owed (§46.3.1.4)
        words = Signal(range(MIN_FRAME // LANES + 2))   # data words sent, saturating at 9
        rr = Signal(range(LANES + 1))
        gap = Signal(2)              # idle words still due before the next /S/ slot
        next_o4 = Signal()
        next_deficit = Signal(2)
        underrun = Signal()
        m.d.comb += e["o4"].eq(o4)

        last_rr = Signal(range(LANES + 1))

        def end_frame(valid_lanes):
            # valid_lanes: data lanes of the last word (1..8); /T/ is in it (<= 3) or in the
            # tail word after it (>= 4).
            m.d.comb += [e["last"].eq(1), e["rr"].eq(valid_lanes), last_rr.eq(valid_lanes)]
            valid_lanes = last_rr
            m.d.sync += [rr.eq(valid_lanes), self.frames.eq(self.frames + 1),
                         self.underruns.eq(self.underruns + underrun)]
            # The DIC of _dic_next as a table: (rr, o4, deficit) -> (gap, next o4, deficit).
            for n in range(1, LANES + 1):
                k = n + 4 if n <= 3 else n - 4
                for o in (0, 1):
                    for d in range(4):
                        g, o2, d2 = _dic_next(k, o, d)
                        with m.If((valid_lanes == n) & (o4 == o) & (deficit == d)):
                            m.d.sync += [gap.eq(g), next_o4.eq(o2), next_deficit.eq(d2)]
            with m.If(valid_lanes >= 4):
                m.next = "TAIL"
            with m.Else():
                m.next = "GAP"

        def start_frame():
            m.d.comb += [e["d"].eq(Cat(Const(START, 8), Const(_lane_const(PREAMBLE, 6), 48),
                                       Const(SFD, 8))),
                         e["c"].eq(0x01), fcs.start.eq(1)]
            m.d.sync += [words.eq(0), underrun.eq(0)]
            m.next = "FRAME_DATA"

        lane_mask = Signal(64)
        n_keep = Signal(range(LANES + 1))
        m.d.comb += [
            lane_mask.eq(Cat(*(Mux(self.i.payload.keep[j], 0xFF, 0) for j in range(LANES)))),
            n_keep.eq(keep_count(self.i.payload.keep)),
        ]

        go = self.i.valid & (self.start if self._gated else 1)
        with m.FSM(name="tx"):
            with m.State("IDLE"):
                # Not in time for the slot the DIC gave (or after reset): start in the lane
                # the output is shifted to now, owing nothing.
                with m.If(go):
                    m.d.sync += deficit.eq(0)
                    start_frame()

            with m.State("FRAME_DATA"):
                m.d.comb += self.i.ready.eq(1)
                with m.If(self.i.valid):
                    m.d.comb += [e["d"].eq(self.i.payload.data & lane_mask), e["c"].eq(0),
                                 fcs.data.eq(self.i.payload.data & lane_mask), fcs.valid.eq(1)]
                    with m.If(words != MIN_FRAME // LANES + 1):
                        m.d.sync += words.eq(words + 1)
                    with m.If(self.i.payload.last):
                        with m.If(words < 7):
                            m.next = "PAD"            # pad to 60: 7 words + 4 octets
                        with m.Elif(words == 7):
                            end_frame(Mux(n_keep < 4, 4, n_keep))
                        with m.Else():
                            end_frame(n_keep)
                with m.Else():
                    # Underrun: XGMII cannot pause inside a frame; poison it and wait.
                    m.d.comb += [e["d"].eq(_lane_const(ERROR)), e["c"].eq(0xFF)]
                    m.d.sync += underrun.eq(1)

            with m.State("PAD"):
                m.d.comb += [e["d"].eq(0), e["c"].eq(0), fcs.data.eq(0), fcs.valid.eq(1)]
                m.d.sync += words.eq(words + 1)
                with m.If(words == 7):
                    end_frame(C(4, range(LANES + 1)))

            with m.State("TAIL"):
                m.d.comb += [e["tail"].eq(1), e["rr"].eq(rr)]
                m.next = "GAP"

            with m.State("GAP"):
                with m.If(gap != 0):
                    m.d.sync += gap.eq(gap - 1)
                with m.Elif(go):
                    # The slot the DIC chose: /S/ in lane 0 or 4 of the output.
                    m.d.comb += e["o4"].eq(next_o4)
                    m.d.sync += [o4.eq(next_o4), deficit.eq(next_deficit)]
                    start_frame()
                with m.Else():
                    m.next = "IDLE"

        # FCS: the CRC register holds the frame followed by 8 - rr zero octets one cycle after
        # the last word; undo those zeros (see the module docstring) into a register, ready two
        # cycles after the last word, when that word leaves the delay line below.
        fcs_z = Signal(range(LANES))
        fcs_load = Signal()
        fcs_val = Signal(32)
        m.d.sync += fcs_load.eq(e["last"])
        with m.If(e["last"]):
            m.d.sync += fcs_z.eq(LANES - e["rr"])
        # (Intermediate signals: a stepped slice of an expression repeats the expression for
        # every bit in the Verilog.)
        crc_x = Signal(32)
        raw = Signal(32)
        m.d.comb += [crc_x.eq(fcs.crc ^ _ALGO.xor_output), raw.eq(crc_x[::-1])]
        for z, rows in enumerate(_tx_unzero_rows()):
            fixed = Signal(32, name=f"fcs_unzero{z}")
            m.d.comb += fixed.eq(Cat(*((raw & rows[b]).xor() for b in range(32))))
            with m.If(fcs_load & (fcs_z == z)):
                m.d.sync += fcs_val.eq(fixed[::-1] ^ _ALGO.xor_output)

        # Two-word delay line, then the FCS, /T/ and idles go in after the last data octet.
        d1, d2 = word_record("d1"), word_record("d2")
        m.d.sync += [d1[k].eq(e[k]) for k in e] + [d2[k].eq(d1[k]) for k in e]
        fcs_oct = [fcs_val[8 * i:8 * i + 8] for i in range(FCS_LEN)]
        merged = word_record("merged")
        for i in range(LANES):
            di, ci = merged["d"][8 * i:8 * i + 8], merged["c"][i]
            # Octet position after the last data octet (0..3 FCS, 4 /T/, then idles).
            pos = Signal(range(-LANES, 2 * LANES), name=f"pos{i}")
            m.d.comb += pos.eq(Mux(d2["tail"], i + LANES, i) - d2["rr"])
            m.d.sync += [di.eq(d2["d"][8 * i:8 * i + 8]), ci.eq(d2["c"][i])]
            with m.If((d2["last"] | d2["tail"]) & (pos >= 0)):
                with m.If(pos < FCS_LEN):
                    m.d.sync += [di.eq(Array(fcs_oct)[pos[:2]]), ci.eq(0)]
                with m.Elif(pos == FCS_LEN):
                    m.d.sync += [di.eq(TERMINATE), ci.eq(1)]
                with m.Else():
                    m.d.sync += [di.eq(IDLE), ci.eq(1)]
        m.d.sync += merged["o4"].eq(d2["o4"])

        # Output shift: a frame started in lane 4 goes out half a word late. The shift changes
        # only at an /S/; with a gap of at least 9 octets the half word shown twice (shift
        # 0 -> 4) or skipped (4 -> 0) is idle.
        prev_d = Signal(32, init=_lane_const(IDLE, 4))
        prev_c = Signal(4, init=0xF)
        m.d.sync += [prev_d.eq(merged["d"][32:]), prev_c.eq(merged["c"][4:])]
        with m.If(merged["o4"]):
            m.d.sync += [self.txd.eq(Cat(prev_d, merged["d"][:32])),
                         self.txc.eq(Cat(prev_c, merged["c"][:4]))]
        with m.Else():
            m.d.sync += [self.txd.eq(merged["d"]), self.txc.eq(merged["c"])]
        return m


class XgmiiMac(wiring.Component):
    """10 Gb/s MAC over a 64-bit XGMII with a ``PacketStream(64)`` user side.

    Receive: :class:`XgmiiRx` (frame buffer, bad frames dropped). Transmit: :class:`PacketFifo`
    -> :class:`RegisterSlice` -> :class:`XgmiiTx`. Store-and-forward (``tx_start=None``): a
    frame starts on the wire only once it is wholly in the FIFO, so the transmitter never
    underruns whatever idles the user side has. Cut-through (``tx_start=N``): as
    :class:`~hw.net.mac.GmiiMac`, a frame starts once N of its octets or all of them are in
    (:func:`~hw.net.mac.cut_through_start`); a source that then falls behind the line
    underruns the transmitter (the rest of the frame as /E/, ``tx_underruns``).

    One clock domain (``sync``, the 156.25 MHz XGMII clock).

    Parameters
    ----------
    width : int
        User-side data width; only 64 (the XGMII word) is supported.
    rx_depth, tx_depth : int
        Receive and transmit buffer sizes in octets (powers of two, >= one largest frame).
    tx_start : int or None
        Cut-through transmit: octets of a frame in the FIFO before it starts (whole words);
        None: store-and-forward.
    rx_cut_through : bool
        Cut-through receive (:class:`XgmiiRx` ``cut_through``): ``rx`` is then a
        :func:`~hw.lib.stream.FrameStream`, the verdict on each frame's last beat.

    Ports
    -----
    xgmii_rxd : In(64); xgmii_rxc : In(8); xgmii_txd : Out(64); xgmii_txc : Out(8)
        XGMII.
    rx : Out(PacketStream(64)), or Out(FrameStream(64)) with ``rx_cut_through``
        Received frames without FCS (only the good ones when store-and-forward).
    tx : In(PacketStream(64))
        Frames to send, without FCS (padded to 60 octets and FCS added here). A frame longer
        than ``tx_depth`` octets would stall the stream forever: keep frames within the MTU.
    rx_frames_ok, rx_fcs_errors, rx_runts, rx_errors, rx_overflows, tx_frames, tx_underruns
        Out(32) counters (see :class:`XgmiiRx`, :class:`XgmiiTx`).
    rx_backlog : Out(1)
        The receive buffer is at least half full (registered).
    """

    def __init__(self, width=64, *, rx_depth=32768, tx_depth=8192, tx_start=None,
                 rx_cut_through=False):
        if width != 64:
            raise ValueError(f"width {width}: the XGMII MAC supports width 64 only")
        for name, depth in (("rx_depth", rx_depth), ("tx_depth", tx_depth)):
            beats = depth // (width // 8)
            if depth % (width // 8) or beats < 2 or beats & (beats - 1):
                raise ValueError(f"{name} {depth} is not a power of two of at least 16 octets")
        if tx_start is not None and not 1 <= tx_start <= tx_depth:
            raise ValueError(f"tx_start {tx_start} is not within 1..tx_depth ({tx_depth}) "
                             f"octets")
        self._width, self._rx_depth, self._tx_depth = width, rx_depth, tx_depth
        self._tx_start, self._rx_cut = tx_start, rx_cut_through
        super().__init__({
            "xgmii_rxd": In(64), "xgmii_rxc": In(8),
            "xgmii_txd": Out(64), "xgmii_txc": Out(8),
            "rx": Out(FrameStream(width) if rx_cut_through else PacketStream(width)),
            "tx": In(PacketStream(width)),
            "rx_frames_ok": Out(32), "rx_fcs_errors": Out(32), "rx_runts": Out(32),
            "rx_errors": Out(32), "rx_overflows": Out(32),
            "tx_frames": Out(32), "tx_underruns": Out(32),
            "rx_backlog": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        w = self._width
        m.submodules.xgmii_rx = rx = XgmiiRx(self._rx_depth // (w // 8),
                                             cut_through=self._rx_cut)
        cut = self._tx_start is not None
        m.submodules.xgmii_tx = tx = XgmiiTx(gated=cut)
        mark = -(-self._tx_start // (w // 8)) if cut else None
        m.submodules.tx_fifo = fifo = PacketFifo(w, self._tx_depth // (w // 8), mark=mark)

        m.d.comb += [
            rx.rxd.eq(self.xgmii_rxd), rx.rxc.eq(self.xgmii_rxc),
            self.xgmii_txd.eq(tx.txd), self.xgmii_txc.eq(tx.txc),
            self.rx_frames_ok.eq(rx.frames_ok), self.rx_fcs_errors.eq(rx.fcs_errors),
            self.rx_runts.eq(rx.runts), self.rx_errors.eq(rx.rx_errors),
            self.rx_overflows.eq(rx.overflows), self.rx_backlog.eq(rx.backlog),
            self.tx_frames.eq(tx.frames), self.tx_underruns.eq(tx.underruns),
        ]
        wiring.connect(m, rx.o, wiring.flipped(self.rx))

        wiring.connect(m, wiring.flipped(self.tx), fifo.w)
        put = self.tx.valid & self.tx.ready
        if cut:
            m.d.comb += [fifo.w_commit.eq(put),
                         tx.start.eq(cut_through_start(m, fifo, self.tx, tx.i,
                                                       self._tx_depth // (w // 8)))]
        else:
            m.d.comb += fifo.w_commit.eq(put & self.tx.payload.last)
        # A register slice after the FIFO's block-RAM read port, as in GmiiMac: the RAM's
        # clock-to-out then does not add up with the transmitter's CRC update.
        m.submodules.tx_slice = tx_slice = RegisterSlice(w)
        wiring.connect(m, fifo.r, tx_slice.i)
        wiring.connect(m, tx_slice.o, tx.i)
        return m

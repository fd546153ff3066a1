# Ref: IEEE 802.3 §3.1.1 (frame: preamble, SFD, FCS), §4.2.3.3 (minimum frame 64 octets, pad),
#      §4.4.2 (interframe gap 96 bit times), §35.2 (GMII TXD/TX_EN/TX_ER, RXD/RX_DV/RX_ER);
#      hw/lib/stream.py (PacketStream); amaranth.lib.crc catalog CRC32_ETHERNET.
"""Gigabit Ethernet MAC over GMII: receiver, transmitter, and the two with width conversion.

Everything runs in one clock domain, ``sync`` = the GMII 125 MHz clock (RX and TX clocks are
assumed to be the same, as on a GMII/RGMII PHY whose RX clock is taken as the design clock or
re-timed before the MAC). The GMII side moves one octet per cycle; a ``PacketStream(64)`` side
therefore carries at most one beat per 8 cycles on average at line rate (a received frame
leaves the receive buffer in a burst of one beat a cycle once its FCS is checked).

Bad frames on receive
---------------------
A stream cannot take back beats already passed on, and the FCS is only known after the last
octet. A frame with ``rx_er``, a bad FCS, fewer than 64 octets (FCS included), or that did not
fit in the buffer is bad and counted. :class:`GmiiRx` has two ways with it:

- store-and-forward (the default): each frame waits in a :class:`~hw.lib.fifo.PacketFifo` and
  is committed only when it ends well, so downstream blocks see only good frames (a
  :func:`~hw.lib.stream.PacketStream`). A frame appears after its last octet: a frame's length
  in octets, divided by the width, in cycles of wait (issue 21, "Where a frame waits" in
  docs/architecture.md).
- cut-through (``cut_through``): every octet is passed on once the four that may be the FCS
  have followed it, and the frame's last beat carries the verdict, ``err``
  (:func:`~hw.lib.stream.FrameStream`). Downstream blocks act on nothing before that beat
  (hw/net/ip.py EthIpRx, hw/net/icrc.py IcrcCheck: the receive commit point). A frame the
  buffer cannot take is cut: its last beat, with ``err``, is written as soon as there is room,
  and frames that start before then are dropped whole.

Transmit
--------
:class:`GmiiTx` sends preamble (7 x 0x55), SFD (0xD5), the frame, zero padding up to 60 octets,
the FCS, and at least 12 idle octets. Its ``i.ready`` is low outside the frame data. GMII cannot
pause inside a frame, so an input that runs dry mid-frame is an underrun: ``tx_er`` is raised
on the octets that should have been data (the receiver then drops the frame) and it is counted.
:class:`GmiiMac` puts a :class:`PacketFifo` in front of the transmitter. Store-and-forward (the
default), a frame starts once it is wholly in the FIFO, so this cannot happen for frames that
fit. Cut-through (``tx_start``), a frame starts once that many of its octets are in, or all of
them: the start threshold is the slack a source's stalls may use up (issue 21 "Cut-through
transmit"; each configuration's ``tx_start``: hw/target/target.py, boards/cores.py).
"""

from amaranth import *
from amaranth.lib import crc, wiring
from amaranth.lib.wiring import In, Out

from hw.lib.stream import FrameStream, PacketStream, RegisterSlice
from hw.lib.fifo import PacketFifo
from hw.lib.width import StreamDownsizer

__all__ = ["GmiiRx", "GmiiTx", "GmiiMac", "cut_through_start", "PREAMBLE", "SFD", "MIN_FRAME",
           "IFG"]

PREAMBLE = 0x55
SFD = 0xD5
MIN_FRAME = 64          # octets, FCS included
FCS_LEN = 4
IFG = 12                # octets of idle between frames


def _fcs_crc():
    return crc.catalog.CRC32_ETHERNET(data_width=8).create()


class GmiiRx(wiring.Component):
    """GMII receiver: strips preamble/SFD/FCS, drops bad frames, buffers good ones.

    Parameters
    ----------
    depth : int
        Frame buffer size in octets (power of two). Frames longer than ``depth`` octets are
        dropped as overflows; so are frames arriving while the buffer is full.
    cut_through : bool
        Pass octets on before the frame's end; its last beat carries ``err`` (module docstring).
    width : int
        Width of the buffer and of ``o`` (8, 16, 32, 64). Wider than 8, the octets are packed
        into words *before* the buffer (lane 0 first, ``keep`` on the last word), so a frame
        leaves the buffer at ``width / 8`` octets a cycle once its verdict is in. With an 8-bit
        buffer and an upsizer behind it (as the MAC had it before), a good frame drained at one
        octet a cycle after its last octet: a store-and-forward cost of a whole frame's length
        in cycles (98 of the 236 cycles of a 64-octet LOAD at width 64, issue 21).

    Ports
    -----
    rxd : In(8); rx_dv, rx_er : In(1)
        GMII receive side, sampled on the ``sync`` clock (registered once inside).
    o : Out(PacketStream(width)), or Out(FrameStream(width)) with ``cut_through``
        Good frames, destination MAC first, without FCS; with ``cut_through``, every frame of
        five octets or more, ``err`` on its last beat when it is bad.
    frames_ok, fcs_errors, runts, rx_errors, overflows : Out(32)
        Frame counters (wrapping). A bad frame counts once, under the first of: ``rx_errors``
        (rx_er seen while rx_dv), ``runts`` (< 64 octets with FCS), ``fcs_errors``,
        ``overflows`` (did not fit in the buffer).
    backlog : Out(1)
        The buffer holds half its depth or more (registered): what lies behind the reader is
        arriving faster than it drains. The responder then refuses new messages with an RNR
        NAK instead of letting the buffer overflow (hw/rdma/resp_exec.py).
    """

    def __init__(self, depth=2048, *, width=8, cut_through=False):
        if width % 8 or width <= 0 or depth % (width // 8):
            raise ValueError(f"width {width} is not a positive multiple of 8 dividing depth "
                             f"{depth} octets")
        self._depth, self._width, self._cut = depth, width, cut_through
        super().__init__({
            "rxd": In(8), "rx_dv": In(1), "rx_er": In(1),
            "o": Out(FrameStream(width) if cut_through else PacketStream(width)),
            "frames_ok": Out(32), "fcs_errors": Out(32), "runts": Out(32),
            "rx_errors": Out(32), "overflows": Out(32), "backlog": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        lanes = self._width // 8
        cut = self._cut
        m.submodules.fifo = fifo = PacketFifo(self._width, self._depth // lanes,
                                              registered_ready=True, err=cut)
        m.d.comb += self.backlog.eq(fifo.half)
        m.submodules.crc = fcs = _fcs_crc()
        wiring.connect(m, wiring.flipped(self.o), fifo.r)

        # Input register: GMII inputs come straight from pins.
        rxd = Signal(8)
        dv = Signal()
        er = Signal()
        m.d.sync += [rxd.eq(self.rxd), dv.eq(self.rx_dv), er.eq(self.rx_er)]

        # The last four octets of a frame are its FCS, which is known only when rx_dv falls; a
        # five-octet delay line holds them back, so that an octet is written to the buffer once
        # four more have followed it, and the final data octet (with last=1) when rx_dv falls.
        delay = Array(Signal(8, name=f"delay{i}") for i in range(5))
        count = Signal(range(MIN_FRAME + 1))     # octets since SFD, saturating at MIN_FRAME
        got_er = Signal()
        overflow = Signal()
        short = Signal()

        # keep is set next to data below, not as a lone constant: Amaranth's Verilog puts a
        # lone constant assignment to part of a signal in an `always @*` with nothing to
        # trigger it, which Icarus and Verilator never run (the bit then stays 0).
        m.d.comb += fcs.data.eq(rxd)

        def await_frame():
            with m.If(dv & (rxd == PREAMBLE)):
                m.next = "PREAMBLE"
            with m.Elif(dv & (rxd == SFD)):
                # A PHY may shorten the preamble; the SFD alone starts a frame.
                new_frame()
                m.next = "FRAME_DATA"
            with m.Elif(dv):
                m.next = "DROP"

        # The buffer's write side is a register stage: ``put_octet`` loads it, and the octet
        # goes into the FIFO in the next cycle. Before, the FSM's decision (the octet count
        # compare, the state, rx_dv) chained through ``w.valid`` into the FIFO's write-pointer
        # adder: the ECPIX-5's 125 MHz critical path (22 levels, 6.8 ns at seed 3, and over
        # 8 ns at other seeds and netlists). Now that path starts at this flop. A frame that
        # finds the buffer full is lost: ``overflow`` is set when the staged octet is refused.
        # Wider than 8: the stage is also the packer. ``lane`` is where the next octet goes;
        # a word is written when its last lane is filled or the frame ends (``keep``: lanes
        # 0..lane). A new word's other lanes are cleared, so no octet of the previous word shows
        # beyond ``keep``.
        w_valid = Signal()
        w_data = Signal(self._width)
        w_keep = Signal(lanes)
        w_last = Signal()
        lane = Signal(range(lanes))
        m.d.comb += [
            fifo.w.valid.eq(w_valid),
            fifo.w.payload.data.eq(w_data),
            fifo.w.payload.keep.eq(w_keep),
            fifo.w.payload.last.eq(w_last),
        ]
        refused = Signal()
        m.d.comb += refused.eq(w_valid & ~fifo.w.ready)
        m.d.sync += w_valid.eq(0)
        # (Before the FSM: a new frame's SFD in FRAME_END clears the flag after this.)
        with m.If(refused):
            m.d.sync += overflow.eq(1)

        # Cut-through: every beat is published as it is written. A refused beat cuts the frame
        # (``cut``: none of its later octets is staged) and owes the reader a last beat with
        # ``err`` (``closing``), staged whenever the stage is free and retried until written;
        # a frame that starts while one is owed is cut from its start (nothing of it written).
        # The last beat's ``err`` is the verdict, computed in FRAME_END (``bad_now``) as the
        # beat is written; only the close beat sets ``w_err``.
        cut_frame = Signal()
        closing = Signal()
        w_err = Signal()
        bad_now = Signal()
        if cut:
            m.d.comb += [fifo.w_commit.eq(1),
                         fifo.w.payload.err.eq(w_last & (w_err | bad_now))]
            with m.If(refused):
                m.d.sync += [cut_frame.eq(1), closing.eq(1)]
            with m.Elif(closing & ~w_valid):
                m.d.sync += [w_valid.eq(1), w_keep.eq(1), w_last.eq(1), w_err.eq(1),
                             closing.eq(0)]

        def new_frame():
            m.d.comb += fcs.start.eq(1)
            m.d.sync += [count.eq(0), got_er.eq(0), overflow.eq(0), lane.eq(0)]
            if cut:
                # (``refused``: a close is owed from this cycle on.)
                m.d.sync += [cut_frame.eq(closing | refused), overflow.eq(closing | refused)]

        def put_octet(last):
            if cut:
                with m.If(~cut_frame):
                    _put_octet(last)
            else:
                _put_octet(last)

        def _put_octet(last):
            # delay[4] into lane ``lane`` of the write stage; the word is written when full or
            # last.
            if cut:
                m.d.sync += w_err.eq(0)
            if lanes == 1:
                m.d.sync += [w_valid.eq(1), w_data.eq(delay[4]), w_keep.eq(1), w_last.eq(last)]
                return
            with m.Switch(lane):
                for k in range(lanes):
                    with m.Case(k):
                        if k == 0:
                            m.d.sync += w_data.eq(delay[4])
                        else:
                            m.d.sync += w_data[8 * k:8 * k + 8].eq(delay[4])
                        m.d.sync += w_keep.eq((1 << (k + 1)) - 1)
            m.d.sync += w_last.eq(last)
            with m.If(last | (lane == lanes - 1)):
                m.d.sync += [w_valid.eq(1), lane.eq(0)]
            with m.Else():
                m.d.sync += lane.eq(lane + 1)

        def drop():
            if not cut:
                m.d.comb += fifo.w_discard.eq(1)

        def keep():
            if not cut:
                m.d.comb += fifo.w_commit.eq(1)

        with m.FSM(name="rx"):
            with m.State("IDLE"):
                await_frame()

            with m.State("PREAMBLE"):
                with m.If(~dv):
                    m.next = "IDLE"
                with m.Elif(rxd == SFD):
                    new_frame()
                    m.next = "FRAME_DATA"
                with m.Elif(rxd != PREAMBLE):
                    m.next = "DROP"

            with m.State("FRAME_DATA"):
                with m.If(dv):
                    m.d.comb += fcs.valid.eq(1)
                    m.d.sync += [delay[0].eq(rxd)] + [delay[i].eq(delay[i - 1])
                                                      for i in range(1, 5)]
                    with m.If(count != MIN_FRAME):
                        m.d.sync += count.eq(count + 1)
                    with m.If(er):
                        m.d.sync += got_er.eq(1)
                    # delay[4] is a data octet once five octets are in (count >= 5 before this).
                    with m.If(count >= 5):
                        put_octet(last=0)
                with m.Else():
                    # End of frame: delay[4] is the last data octet, delay[0..3] the FCS, and
                    # the CRC register has taken every octet (match_detected valid now and
                    # held: the CRC takes no octet until the next SFD). The verdict is given
                    # in the next cycle ("FRAME_END", when the last octet leaves the write
                    # stage: a commit there includes it) from registered flags, so the CRC
                    # compare and the checks do not chain into the FIFO's pointer update
                    # (the 125 MHz critical path on ECPIX-5).
                    with m.If(count >= 5):
                        put_octet(last=1)
                    m.d.sync += short.eq(count < MIN_FRAME)
                    m.next = "FRAME_END"

            with m.State("FRAME_END"):
                if cut:
                    # The verdict rides on the last beat, written from the stage now. (A cut
                    # frame's close beat carries ``w_err`` instead; it is counted here too.)
                    m.d.comb += bad_now.eq(got_er | short | ~fcs.match_detected | overflow)
                with m.If(got_er):
                    drop()
                    m.d.sync += self.rx_errors.eq(self.rx_errors + 1)
                with m.Elif(short):
                    drop()
                    m.d.sync += self.runts.eq(self.runts + 1)
                with m.Elif(~fcs.match_detected):
                    drop()
                    m.d.sync += self.fcs_errors.eq(self.fcs_errors + 1)
                with m.Elif(overflow | refused):
                    # (refused: the last octet, written from the stage in this cycle.)
                    drop()
                    m.d.sync += self.overflows.eq(self.overflows + 1)
                with m.Else():
                    keep()
                    m.d.sync += self.frames_ok.eq(self.frames_ok + 1)
                # As in Idle: a PHY that shrinks the gap to one octet may start the next
                # frame (even with its SFD) right now. The verdict above reads the flags
                # before the SFD clears them.
                m.next = "IDLE"
                await_frame()

            with m.State("DROP"):
                # Carrier without a valid preamble/SFD: ignore until it ends.
                with m.If(~dv):
                    m.next = "IDLE"
        return m


def cut_through_start(m, fifo, put, sent, frames):
    """The start rule of a cut-through MAC transmitter: the next frame may start once its last
    beat is in ``fifo`` (a :class:`PacketFifo` with ``mark``) or ``fifo`` holds ``mark`` beats.

    ``put``: the stream into the FIFO; ``sent``: the stream the transmitter takes octets or
    words from (behind the FIFO, its read register and whatever slices and sizers follow);
    ``frames``: the most frames the FIFO can hold. Returns the ``start`` signal
    (combinational, from flops).

    ``ends`` counts the frames whose last beat is in and that the transmitter has not finished
    taking; it is updated in the cycle after the transmitter takes a last beat, before any
    transmitter samples ``start`` again (GMII: FCS and gap; XGMII: at least one gap word).
    ``fifo.at_mark`` is the FIFO's count a cycle earlier; once the transmitter takes a frame's
    last beat, none of that frame's beats has been counted there for at least two cycles (the
    read register and a slice sit between), so it counts the next frame's beats only.
    """
    ends = Signal(range(frames + 1), name="tx_frames_in")
    put_end = Signal(name="tx_put_end")
    sent_end = Signal(name="tx_sent_end")
    m.d.comb += [put_end.eq(put.valid & put.ready & put.payload.last),
                 sent_end.eq(sent.valid & sent.ready & sent.payload.last)]
    with m.If(put_end & ~sent_end):
        m.d.sync += ends.eq(ends + 1)
    with m.Elif(sent_end & ~put_end):
        m.d.sync += ends.eq(ends - 1)
    return (ends != 0) | fifo.at_mark


class GmiiTx(wiring.Component):
    """GMII transmitter: preamble, SFD, data, pad to 60, FCS, inter-frame gap.

    Parameters
    ----------
    gated : bool
        A frame starts only while ``start`` is high too (the cut-through MAC's start rule,
        :class:`GmiiMac` ``tx_start``); without it, as soon as ``i.valid``.

    Ports
    -----
    i : In(PacketStream(8))
        Frames from destination MAC on, without FCS. ``ready`` is high only while frame data
        is being sent.
    start : In(1)
        Only with ``gated``: the next frame may start (sampled in Idle with ``i.valid``).
    txd : Out(8); tx_en, tx_er : Out(1)
        GMII transmit side, registered.
    frames, underruns : Out(32)
        Frames sent; frames during which the input ran dry (sent with ``tx_er``).
    """

    def __init__(self, *, gated=False):
        self._gated = gated
        super().__init__({
            "i": In(PacketStream(8)),
            **({"start": In(1)} if gated else {}),
            "txd": Out(8), "tx_en": Out(1), "tx_er": Out(1),
            "frames": Out(32), "underruns": Out(32),
        })

    def elaborate(self, platform):
        m = Module()
        m.submodules.crc = fcs = _fcs_crc()

        txd = Signal(8)
        en = Signal()
        er = Signal()
        m.d.sync += [self.txd.eq(txd), self.tx_en.eq(en), self.tx_er.eq(er)]

        n = Signal(range(64))            # octet counter within preamble / pad / FCS / IFG
        length = Signal(range(61))       # frame octets sent so far, saturating at 60
        underrun = Signal()
        fcs_bytes = Array(fcs.crc[8 * i:8 * i + 8] for i in range(4))

        with m.FSM(name="tx"):
            with m.State("IDLE"):
                with m.If(self.i.valid & (self.start if self._gated else 1)):
                    m.d.sync += n.eq(0)
                    m.next = "PREAMBLE"

            with m.State("PREAMBLE"):
                m.d.comb += [txd.eq(PREAMBLE), en.eq(1)]
                m.d.sync += n.eq(n + 1)
                with m.If(n == 6):
                    m.next = "START_DELIMITER"

            with m.State("START_DELIMITER"):
                m.d.comb += [txd.eq(SFD), en.eq(1), fcs.start.eq(1)]
                m.d.sync += [length.eq(0), underrun.eq(0)]
                m.next = "FRAME_DATA"

            with m.State("FRAME_DATA"):
                m.d.comb += [en.eq(1), self.i.ready.eq(1)]
                with m.If(self.i.valid):
                    m.d.comb += [txd.eq(self.i.payload.data), fcs.data.eq(self.i.payload.data),
                                 fcs.valid.eq(1)]
                    with m.If(length != 60):
                        m.d.sync += length.eq(length + 1)
                    with m.If(self.i.payload.last):
                        with m.If(length >= 59):
                            m.d.sync += n.eq(0)
                            m.next = "FCS"
                        with m.Else():
                            m.next = "PAD"
                with m.Else():
                    # Underrun: GMII cannot pause inside a frame; poison it and wait.
                    m.d.comb += er.eq(1)
                    m.d.sync += underrun.eq(1)

            with m.State("PAD"):
                m.d.comb += [txd.eq(0), en.eq(1), fcs.data.eq(0), fcs.valid.eq(1)]
                m.d.sync += length.eq(length + 1)
                with m.If(length == 59):
                    m.d.sync += n.eq(0)
                    m.next = "FCS"

            with m.State("FCS"):
                # The CRC of all data and pad octets is in fcs.crc now (it is not fed here);
                # Ethernet sends it least significant octet first.
                m.d.comb += [txd.eq(fcs_bytes[n[:2]]), en.eq(1)]
                m.d.sync += n.eq(n + 1)
                with m.If(n == 3):
                    m.d.sync += [n.eq(0), self.frames.eq(self.frames + 1)]
                    with m.If(underrun):
                        m.d.sync += self.underruns.eq(self.underruns + 1)
                    m.next = "GAP"

            with m.State("GAP"):
                # IFG - 1 octets here plus at least one in Idle: IFG idle octets in all.
                m.d.sync += n.eq(n + 1)
                with m.If(n == IFG - 2):
                    m.next = "IDLE"
        return m


class GmiiMac(wiring.Component):
    """GMII MAC with a ``PacketStream(width)`` user side.

    Receive: :class:`GmiiRx` at ``width`` (octets packed into words before its frame buffer,
    bad frames dropped there).
    Transmit: :class:`PacketFifo` at ``width`` -> :class:`StreamDownsizer` -> :class:`GmiiTx`.
    Store-and-forward (``tx_start=None``): a frame starts on the wire only once it is wholly in
    the FIFO, so the transmitter never underruns whatever idles the user side has.
    Cut-through (``tx_start=N``): a frame starts once N of its octets are in the FIFO or its
    last beat is. The preamble and SFD then give 8 more octet times. The user side must keep
    pace from there: a source that falls further behind than that slack underruns the
    transmitter, which sends the rest of the frame with ``tx_er`` (a receiver drops it) and
    counts ``tx_underruns``; the transport's retransmission recovers the packet.

    One clock domain (``sync``, the 125 MHz GMII clock). At ``width=64`` the user streams carry
    at most one beat per 8 cycles at line rate on average (1/8 duty), a received frame in a
    burst of one beat a cycle.

    Parameters
    ----------
    width : int
        User-side data width: 8, 16, 32, 64 (any multiple of 8 dividing into whole octets).
    rx_depth, tx_depth : int
        Receive and transmit buffer sizes in octets (powers of two, >= one largest frame).
    tx_start : int or None
        Cut-through transmit: octets of a frame in the FIFO before it starts (rounded up to
        whole beats; the FIFO's registered level, which leaves out the up to three beats
        already in the read register, the slice and the downsizer). None: store-and-forward.
    rx_cut_through : bool
        Cut-through receive (:class:`GmiiRx` ``cut_through``): ``rx`` is then a
        :func:`~hw.lib.stream.FrameStream`, the verdict on each frame's last beat.

    Ports
    -----
    rxd, rx_dv, rx_er : In; txd, tx_en, tx_er : Out
        GMII.
    rx : Out(PacketStream(width)), or Out(FrameStream(width)) with ``rx_cut_through``
        Received frames without FCS (only the good ones when store-and-forward).
    tx : In(PacketStream(width))
        Frames to send, without FCS (padded to 60 octets and FCS added here). A frame longer
        than ``tx_depth`` octets would stall the stream forever: keep frames within the MTU.
    rx_frames_ok, rx_fcs_errors, rx_runts, rx_errors, rx_overflows, tx_frames, tx_underruns
        Out(32) counters (see :class:`GmiiRx`, :class:`GmiiTx`).
    rx_backlog : Out(1)
        The receive buffer is half full or more (:class:`GmiiRx` ``backlog``).
    """

    def __init__(self, width=8, *, rx_depth=2048, tx_depth=2048, tx_start=None,
                 rx_cut_through=False):
        if width % 8 or width <= 0:
            raise ValueError(f"width {width} is not a positive multiple of 8")
        if tx_depth % (width // 8) or rx_depth % (width // 8):
            raise ValueError("rx_depth and tx_depth must be multiples of the lane count")
        if tx_start is not None and not 1 <= tx_start <= tx_depth:
            raise ValueError(f"tx_start {tx_start} is not within 1..tx_depth ({tx_depth}) "
                             f"octets")
        self._width, self._rx_depth, self._tx_depth = width, rx_depth, tx_depth
        self._tx_start = tx_start
        self._rx_cut = rx_cut_through
        super().__init__({
            "rxd": In(8), "rx_dv": In(1), "rx_er": In(1),
            "txd": Out(8), "tx_en": Out(1), "tx_er": Out(1),
            "rx": Out(FrameStream(width) if rx_cut_through else PacketStream(width)),
            "tx": In(PacketStream(width)),
            "rx_frames_ok": Out(32), "rx_fcs_errors": Out(32), "rx_runts": Out(32),
            "rx_errors": Out(32), "rx_overflows": Out(32),
            "tx_frames": Out(32), "tx_underruns": Out(32), "rx_backlog": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        w = self._width
        m.submodules.gmii_rx = rx = GmiiRx(self._rx_depth, width=w, cut_through=self._rx_cut)
        cut = self._tx_start is not None
        m.submodules.gmii_tx = tx = GmiiTx(gated=cut)
        # ``registered_ready``: the FIFO's full flag from a flop. Combinational, the read pointer's
        # compare ran through ``w.ready``, the register slice in front (then MacCdc's 8-bit
        # ``tx_slice8``) and back into the write pointer's adder: the GMII clock's critical path on ECPIX-5
        # (113.95 MHz at 125, trial ck3, seed 3).
        lanes = w // 8
        mark = -(-self._tx_start // lanes) if cut else None
        m.submodules.tx_fifo = fifo = PacketFifo(w, self._tx_depth // lanes,
                                                 registered_ready=True, mark=mark)
        m.submodules.tx_down = down = StreamDownsizer(w, 8)

        m.d.comb += [
            rx.rxd.eq(self.rxd), rx.rx_dv.eq(self.rx_dv), rx.rx_er.eq(self.rx_er),
            self.txd.eq(tx.txd), self.tx_en.eq(tx.tx_en), self.tx_er.eq(tx.tx_er),
            self.rx_frames_ok.eq(rx.frames_ok), self.rx_fcs_errors.eq(rx.fcs_errors),
            self.rx_runts.eq(rx.runts), self.rx_errors.eq(rx.rx_errors),
            self.rx_overflows.eq(rx.overflows), self.rx_backlog.eq(rx.backlog),
            self.tx_frames.eq(tx.frames), self.tx_underruns.eq(tx.underruns),
        ]
        wiring.connect(m, rx.o, wiring.flipped(self.rx))

        wiring.connect(m, wiring.flipped(self.tx), fifo.w)
        put = self.tx.valid & self.tx.ready
        if not cut:
            m.d.comb += fifo.w_commit.eq(put & self.tx.payload.last)
        else:
            # Every beat is published at once (the FIFO is a plain FIFO then); the start rule
            # is the transmitter's gate.
            m.d.comb += [fifo.w_commit.eq(put),
                         tx.start.eq(cut_through_start(m, fifo, self.tx, tx.i, self._tx_depth))]
        # A register slice after the FIFO's block-RAM read port: the RAM's clock-to-out plus
        # the transmitter's CRC update was the 125 MHz critical path on the Versa's 45F
        # (8.9 ns, board core ``mac-cdc``).
        m.submodules.tx_slice = tx_slice = RegisterSlice(w)
        wiring.connect(m, fifo.r, tx_slice.i)
        wiring.connect(m, tx_slice.o, down.i)
        wiring.connect(m, down.o, tx.i)
        return m

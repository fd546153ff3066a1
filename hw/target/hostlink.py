# Ref: CRC-8/SMBUS from amaranth.lib.crc.catalog
#      (poly 0x07, init 0, no reflection, no xorout; check value 0xF4 over b"123456789").
"""Host link: a framed UART bridge onto a simple register / memory / queue bus.

The board's USB-serial port (amaranth-boards resource ``uart``) carries small framed requests
from the host (:mod:`host.link`) to the gateware, which turns each into a sequence of 32-bit
accesses on the :class:`HostBusSignature` bus that the core implements.

Wire protocol (UART 8N1, every multi-octet field big-endian)
---------------------------------------------------------------
Request, host to board::

    0xA5 | cmd | addr[31:24] addr[23:16] addr[15:8] addr[7:0] | count | data ... | crc8

Response, board to host::

    0x5A | cmd | status | count | data ... | crc8

- ``cmd``: :class:`Cmd`. Its high nibble names the bus space (1 register, 2 memory,
  3 queue), bit 0 the direction (1 = the host writes). ``STATUS`` (0x40) reads the bridge's
  own counters without touching the bus.
- ``addr``: byte address of the first word (must be a multiple of 4); register and memory
  accesses step it by 4 per word; queue accesses keep it (it is the queue number).
- ``count``: number of 32-bit words, 1..``max_words``. A request carries ``4*count`` data
  octets when it writes (``WRITE_REG``, ``WRITE_MEM``, ``PUSH``), none otherwise. A response
  carries ``4*count`` data octets when it reads, and ``count`` is then the number of words
  actually read; for a write it is the number of words written.
- ``crc8``: CRC-8/SMBUS over every octet after the start octet (cmd .. last data octet).
- ``status``: :class:`LinkStatus`. A frame whose CRC fails is *not* executed: the bridge
  answers ``BAD_CRC`` (count 0) and increments its ``crc_errors`` counter. A UART framing error
  (stop bit low) or a gap longer than ``frame_timeout`` cycles inside a frame abandons the frame
  silently (``frame_errors`` counter); the host times out and retries.
- ``POP`` stops early, with status ``OK``, when the queue runs empty (the target answers the
  read with ``err``); ``PUSH`` stops with ``QUEUE_FULL`` when the target refuses a word.
  Register/memory accesses stop at the first ``err`` with ``BUS_ERROR`` and the count done.
- ``STATUS`` answers 4 words: frames executed, CRC errors, frame errors, bus errors.

Engine and transports
---------------------
:class:`HostLinkEngine` is the protocol (octets in, bus accesses, octets out); it is the only
command decoder and CRC check. Transports feed it: :class:`HostLinkUart` (the UART above, which
adds the framing errors) and :class:`hw.target.udplink.UdpHostLink` (the same frames, many per
UDP datagram, over the target's Ethernet port; its wire format is documented there).

Bus (:class:`HostBusSignature`, master = this bridge)
----------------------------------------------------
``addr`` (32), ``space`` (:class:`Space`), ``wdata`` (32), ``we``, ``re`` from the master;
``rdata`` (32), ``ack``, ``err`` from the target. The master raises exactly one of ``re`` /
``we`` and holds every master signal steady until the target answers with ``ack`` high for one
cycle (``ack`` may come in the same cycle, combinationally); ``err`` together with ``ack``
refuses the access (unmapped address, queue empty on a read, queue full on a write). ``rdata``
is sampled with ``ack`` on reads. The master drops the request the cycle after ``ack``. No
answer within ``bus_timeout`` cycles ends the request with status ``TIMEOUT``.
"""

from contextlib import contextmanager
from types import SimpleNamespace

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, enum, fifo, wiring
from amaranth.lib.crc import catalog
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hw.iface import HostBusSignature, Space

__all__ = [
    "SOF_REQUEST", "SOF_RESPONSE", "Cmd", "LinkStatus",
    "UartRx", "UartTx", "HostLinkEngine", "HostLinkUart", "HostBusDemoTarget", "DEMO_ID",
    "cmd_known", "count_ok", "carries_data", "response_words_max",
]

SOF_REQUEST = 0xA5
SOF_RESPONSE = 0x5A
#: Value of register 0 of :class:`HostBusDemoTarget` ("KBTP").
DEMO_ID = 0x4B425450


class Cmd(enum.Enum, shape=8):
    READ_REG = 0x10
    WRITE_REG = 0x11
    READ_MEM = 0x20
    WRITE_MEM = 0x21
    POP = 0x30
    PUSH = 0x31
    STATUS = 0x40


class LinkStatus(enum.Enum, shape=8):
    OK = 0
    BAD_CRC = 1
    BAD_CMD = 2
    BAD_COUNT = 3
    BUS_ERROR = 4
    TIMEOUT = 5
    QUEUE_FULL = 6
    BAD_ALIGN = 7


class _UartHalf(wiring.Component):
    """What the receiver and the transmitter share: the bit period, ``divisor`` clock
    cycles (>= 4), checked here."""

    def __init__(self, divisor):
        if divisor < 4:
            raise ValueError(f"UART divisor {divisor} is below 4 cycles per bit")
        self.divisor = divisor
        super().__init__()


class UartRx(_UartHalf):
    """8N1 UART receiver, LSB first.

    Parameters
    ----------
    divisor : int
        Clock cycles per bit (>= 4).

    Ports
    -----
    rx : In(1)          the line (idle high); synchronised here
    data : Out(8), valid : Out(1)   one-cycle strobe per received octet
    error : Out(1)      one-cycle strobe: stop bit was low (octet dropped)
    """

    rx: In(1, init=1)
    data: Out(8)
    valid: Out(1)
    error: Out(1)

    def elaborate(self, platform):
        m = Module()
        # Two flops because the line is asynchronous to our clock.
        sync1 = Signal(init=1)
        line = Signal(init=1)
        m.d.sync += [sync1.eq(self.rx), line.eq(sync1)]

        timer = Signal(range(self.divisor * 3 // 2 + 1))
        bit = Signal(range(9))
        shreg = Signal(8)
        m.d.sync += [self.valid.eq(0), self.error.eq(0)]

        with m.FSM():
            with m.State("IDLE"):
                with m.If(~line):
                    # Sample bit 0 one and a half bit times after the start edge.
                    m.d.sync += [timer.eq(self.divisor * 3 // 2 - 1), bit.eq(0)]
                    m.next = "DATA"
            with m.State("DATA"):
                with m.If(timer == 0):
                    m.d.sync += [shreg.eq(Cat(shreg[1:], line)), bit.eq(bit + 1),
                                 timer.eq(self.divisor - 1)]
                    with m.If(bit == 7):
                        m.next = "STOP"
                with m.Else():
                    m.d.sync += timer.eq(timer - 1)
            with m.State("STOP"):
                with m.If(timer == 0):
                    with m.If(line):
                        m.d.sync += [self.data.eq(shreg), self.valid.eq(1)]
                        m.next = "IDLE"
                    with m.Else():
                        m.d.sync += self.error.eq(1)
                        m.next = "BREAK"
                with m.Else():
                    m.d.sync += timer.eq(timer - 1)
            with m.State("BREAK"):
                # Wait for the line to go idle again before looking for a start bit.
                with m.If(line):
                    m.next = "IDLE"
        return m


class UartTx(_UartHalf):
    """8N1 UART transmitter, LSB first.

    Ports
    -----
    tx : Out(1)                        the line (idle high)
    data : In(8), valid : In(1), ready : Out(1)   octet handshake
    """

    tx: Out(1, init=1)
    data: In(8)
    valid: In(1)
    ready: Out(1)

    def elaborate(self, platform):
        m = Module()
        timer = Signal(range(self.divisor))
        shreg = Signal(10, init=0x3FF)
        bits = Signal(range(11))
        m.d.comb += [self.tx.eq(shreg[0]), self.ready.eq(bits == 0)]
        with m.If(bits == 0):
            with m.If(self.valid):
                # start bit (0), 8 data bits LSB first, stop bit (1)
                m.d.sync += [shreg.eq(Cat(Const(0, 1), self.data, Const(1, 1))),
                             bits.eq(10), timer.eq(self.divisor - 1)]
        with m.Elif(timer == 0):
            m.d.sync += [shreg.eq(Cat(shreg[1:], Const(1, 1))), bits.eq(bits - 1),
                         timer.eq(self.divisor - 1)]
        with m.Else():
            m.d.sync += timer.eq(timer - 1)
        return m


def cmd_known(cmd):
    """``cmd`` (an 8-bit value) is one of :class:`Cmd`."""
    return ((cmd == Cmd.READ_REG) | (cmd == Cmd.WRITE_REG) | (cmd == Cmd.READ_MEM)
            | (cmd == Cmd.WRITE_MEM) | (cmd == Cmd.POP) | (cmd == Cmd.PUSH)
            | (cmd == Cmd.STATUS))


def count_ok(count, max_words):
    """``count`` is a word count the engine accepts (1..``max_words``)."""
    return (count != 0) & (count <= max_words)


def carries_data(cmd, count, max_words):
    """The request frame ``cmd``/``count`` carries ``4 * count`` data octets (a known write
    command other than ``STATUS`` with an accepted count); otherwise it carries none. This is
    what decides where a frame ends: the engine and every transport that parses frames ahead
    of it (the UDP endpoint) use this one definition."""
    return cmd[0] & cmd_known(cmd) & (cmd != Cmd.STATUS) & count_ok(count, max_words)


def response_words_max(cmd, count, max_words):
    """The most data words the response to ``cmd``/``count`` can carry: 4 for ``STATUS``,
    ``count`` for an accepted read, 0 otherwise (the response is ``5 + 4 * words`` octets)."""
    reads = ~cmd[0] & cmd_known(cmd) & count_ok(count, max_words)
    return Mux(cmd == Cmd.STATUS, 4, Mux(reads, count, 0))


class HostLinkEngine(wiring.Component):
    """The frame engine: request octets in, bus accesses, response octets out.

    Everything of the protocol (module docstring) that is not the transport: start octet,
    command decode, CRC-8 check, the payload buffer, the bus master and the response. The
    transports are :class:`HostLinkUart` (octets from a UART) and
    :class:`hw.target.udplink.UdpHostLink` (octets from validated UDP datagrams).

    One frame at a time: the engine takes request octets while it receives a frame
    (``rx_ready``), then executes it and sends the response, then waits for the next start
    octet (``idle``). Octets offered while it is not ready are not taken (the UART drops them).

    Parameters
    ----------
    max_words : int
        Largest ``count`` accepted (words buffered per frame, one memory).
    bus_timeout : int
        Cycles to wait for ``ack`` before answering ``TIMEOUT``.

    Ports
    -----
    rx_data : In(8), rx_valid : In(1), rx_ready : Out(1)
        Request octets. An octet is taken in a cycle with ``rx_valid`` and ``rx_ready``.
    rx_abort : In(1)
        Abandon a half-received frame (the transport's framing error or timeout); ignored
        outside a frame.
    in_frame : Out(1)
        A frame is half received (start octet seen, CRC octet not yet).
    idle : Out(1)
        Waiting for a start octet: every earlier frame has been answered completely.
    tx_data : Out(8), tx_valid : Out(1), tx_ready : In(1), tx_last : Out(1)
        Response octets; ``tx_last`` marks a response's CRC octet.
    bus : Out(HostBusSignature)  master
    frames_ok, crc_errors, bus_errors : Out(32)  counters
    frame_errors : In(32)
        The transport's framing-error count, reported by ``STATUS``.
    """

    rx_data: In(8)
    rx_valid: In(1)
    rx_ready: Out(1)
    rx_abort: In(1)
    in_frame: Out(1)
    idle: Out(1)
    tx_data: Out(8)
    tx_valid: Out(1)
    tx_ready: In(1)
    tx_last: Out(1)
    bus: Out(HostBusSignature())
    frames_ok: Out(32)
    crc_errors: Out(32)
    bus_errors: Out(32)
    frame_errors: In(32)

    def __init__(self, *, max_words=64, bus_timeout=4096):
        if not 1 <= max_words <= 255:
            raise ValueError(f"max_words {max_words} is not in 1..255")
        self.max_words = max_words
        self.bus_timeout = bus_timeout
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        m.submodules.rx_crc = rx_crc = catalog.CRC8_SMBUS(data_width=8).create()
        m.submodules.tx_crc = tx_crc = catalog.CRC8_SMBUS(data_width=8).create()

        # Payload buffer: filled from the request (writes) or from the bus (reads), then drained
        # to the bus (writes) or the response (reads). A write is only executed once its CRC has
        # been checked, hence the buffer. STATUS puts its 4 counters here too, whatever
        # max_words.
        m.submodules.buf = buf = Memory(shape=32, depth=max(self.max_words, 4), init=[])
        s = SimpleNamespace(
            rx_crc=rx_crc, tx_crc=tx_crc, wr=buf.write_port(),
            cmd=Signal(8), addr=Signal(32), count=Signal(8), status=Signal(LinkStatus),
            done=Signal(8),         # words executed / returned
            octet=Signal(2),        # octet index inside a 32-bit word (MSB first)
            word=Signal(32), idx=Signal(8),
            bus_timer=Signal(range(self.bus_timeout + 1)),
            status_regs=Signal(range(4)), resp_err=Signal(), resp_data=Signal(32),
            tx_word=Signal(32))     # the response word being sent (registered buffer output)
        s.rd = buf.read_port(transparent_for=(s.wr,))
        s.is_write = s.cmd[0]
        s.space_nibble = s.cmd[4:8]

        m.d.comb += [
            rx_crc.data.eq(self.rx_data),
            self.bus.addr.eq(s.addr),
            self.bus.space.eq(Mux(s.space_nibble == 1, Space.REG,
                                  Mux(s.space_nibble == 2, Space.MEM, Space.QUEUE))),
            self.bus.wdata.eq(s.rd.data),
        ]
        with m.FSM(name="link") as fsm:
            self._receive(m, s)
            self._execute(m, s)
            self._respond(m, s)
        receiving = [fsm.ongoing(n) for n in ("COMMAND", "ADDRESS", "COUNT", "PAYLOAD", "CHECK")]
        m.d.comb += [
            self.idle.eq(fsm.ongoing("START_OF_FRAME")),
            self.in_frame.eq(Cat(*receiving).any()),
            self.rx_ready.eq(self.idle | self.in_frame),
        ]
        return m

    def _receive(self, m, s):
        """States START_OF_FRAME .. CHECK: take a request frame, check it."""
        rx_crc, byte_in, data = s.rx_crc, self.rx_valid, self.rx_data
        with m.State("START_OF_FRAME"):
            with m.If(byte_in & (data == SOF_REQUEST)):
                m.d.comb += rx_crc.start.eq(1)
                m.next = "COMMAND"

        # The transport abandons a frame in any receive state (counted there).
        @contextmanager
        def take(crc=True):
            with m.If(self.rx_abort):
                m.next = "START_OF_FRAME"
            with m.If(byte_in & ~self.rx_abort):
                if crc:
                    m.d.comb += rx_crc.valid.eq(1)
                yield

        def shift_in(word):
            # The octet into a 32-bit word, MSB first; returns the word with it.
            m.d.sync += [word.eq(Cat(data, word[:24])), s.octet.eq(s.octet + 1)]
            return Cat(data, word[:24])

        with m.State("COMMAND"):
            with take():
                m.d.sync += [s.cmd.eq(data), s.octet.eq(0)]
                m.next = "ADDRESS"
        with m.State("ADDRESS"):
            with take():
                shift_in(s.addr)
                with m.If(s.octet == 3):
                    m.next = "COUNT"
        with m.State("COUNT"):
            with take():
                m.d.sync += [s.count.eq(data), s.idx.eq(0), s.octet.eq(0)]
                m.next = "COUNT_DECODE"
        with m.State("COUNT_DECODE"):
            # One cycle to look at cmd and count together before choosing the next octet.
            with m.If(carries_data(s.cmd, s.count, self.max_words)):
                m.next = "PAYLOAD"
            with m.Else():
                m.next = "CHECK"
        with m.State("PAYLOAD"):
            with take():
                word = shift_in(s.word)
                with m.If(s.octet == 3):
                    m.d.comb += [s.wr.addr.eq(s.idx), s.wr.data.eq(word), s.wr.en.eq(1)]
                    m.d.sync += s.idx.eq(s.idx + 1)
                    with m.If(s.idx + 1 == s.count):
                        m.next = "CHECK"
        with m.State("CHECK"):
            with take(crc=False):
                m.d.sync += [s.idx.eq(0), s.done.eq(0), s.bus_timer.eq(0), s.status_regs.eq(0)]
                with m.If(data != rx_crc.crc):
                    self._answer(m, s, LinkStatus.BAD_CRC, self.crc_errors)
                with m.Elif(~cmd_known(s.cmd)):
                    self._answer(m, s, LinkStatus.BAD_CMD)
                with m.Elif(s.cmd == Cmd.STATUS):
                    m.d.sync += [s.status.eq(LinkStatus.OK),
                                 self.frames_ok.eq(self.frames_ok + 1)]
                    m.next = "STATUS_WORDS"
                with m.Elif(~count_ok(s.count, self.max_words)):
                    self._answer(m, s, LinkStatus.BAD_COUNT)
                with m.Elif((s.addr[:2] != 0) & (s.space_nibble != 3)):
                    self._answer(m, s, LinkStatus.BAD_ALIGN)
                with m.Else():
                    m.d.sync += [s.status.eq(LinkStatus.OK),
                                 self.frames_ok.eq(self.frames_ok + 1)]
                    m.next = "BUS_PREFETCH"

    @staticmethod
    def _answer(m, s, status, counter=None):
        """End the frame with the error ``status`` (its response says so), counting it in
        ``counter`` if given."""
        m.d.sync += s.status.eq(status)
        if counter is not None:
            m.d.sync += counter.eq(counter + 1)
        m.next = "RESPONSE"

    def _execute(self, m, s):
        """States STATUS_WORDS, BUS_*: run the checked frame."""
        wr, rd, bus = s.wr, s.rd, self.bus
        with m.State("STATUS_WORDS"):
            m.d.comb += [wr.addr.eq(s.status_regs), wr.en.eq(1),
                         wr.data.eq(Mux(s.status_regs == 0, self.frames_ok,
                                    Mux(s.status_regs == 1, self.crc_errors,
                                    Mux(s.status_regs == 2, self.frame_errors,
                                        self.bus_errors))))]
            m.d.sync += s.status_regs.eq(s.status_regs + 1)
            with m.If(s.status_regs == 3):
                m.d.sync += s.done.eq(4)
                m.next = "RESPONSE"

        with m.State("BUS_PREFETCH"):
            # The buffer read port has one cycle of latency: present idx, use data next.
            m.d.comb += rd.addr.eq(s.idx)
            m.d.sync += s.bus_timer.eq(0)
            with m.If(s.idx == s.count):
                m.next = "RESPONSE"
            with m.Else():
                m.next = "BUS_ACCESS"
        with m.State("BUS_ACCESS"):
            m.d.comb += [rd.addr.eq(s.idx), bus.we.eq(s.is_write), bus.re.eq(~s.is_write)]
            m.d.sync += s.bus_timer.eq(s.bus_timer + 1)
            # The answer is registered and acted on in the next state: the target's decode
            # logic then ends in a flop instead of running on into the buffer's write port.
            with m.If(bus.ack):
                m.d.sync += [s.resp_err.eq(bus.err), s.resp_data.eq(bus.rdata)]
                m.next = "BUS_DONE"
            with m.Elif(s.bus_timer == self.bus_timeout):
                self._answer(m, s, LinkStatus.TIMEOUT, self.bus_errors)
        with m.State("BUS_DONE"):
            m.d.comb += rd.addr.eq(s.idx)
            with m.If(s.resp_err):
                with m.If(s.cmd == Cmd.POP):
                    m.next = "RESPONSE"     # queue ran empty: a short, good answer
                with m.Elif(s.cmd == Cmd.PUSH):
                    self._answer(m, s, LinkStatus.QUEUE_FULL)
                with m.Else():
                    self._answer(m, s, LinkStatus.BUS_ERROR, self.bus_errors)
            with m.Else():
                with m.If(~s.is_write):
                    m.d.comb += [wr.addr.eq(s.idx), wr.data.eq(s.resp_data), wr.en.eq(1)]
                m.d.sync += [s.idx.eq(s.idx + 1), s.done.eq(s.done + 1)]
                with m.If(s.space_nibble != 3):
                    m.d.sync += s.addr.eq(s.addr + 4)
                m.next = "BUS_PREFETCH"

    def _respond(self, m, s):
        """States RESPONSE*: send the response frame."""
        tx_crc = s.tx_crc

        def send(value, next_state, *, crc_start=False, crc=True):
            m.d.comb += [self.tx_data.eq(value), self.tx_valid.eq(1)]
            with m.If(self.tx_ready):
                if crc:
                    m.d.comb += [tx_crc.data.eq(value), tx_crc.valid.eq(1)]
                if crc_start:
                    m.d.comb += tx_crc.start.eq(1)
                m.next = next_state

        # Reads return data words; STATUS returns its 4 counters.
        returns_data = (~s.is_write | (s.cmd == Cmd.STATUS)) \
            & (s.status != LinkStatus.BAD_CRC) & (s.status != LinkStatus.BAD_CMD)
        with m.State("RESPONSE"):
            m.d.sync += [s.idx.eq(0), s.octet.eq(0)]
            send(SOF_RESPONSE, "RESPONSE_COMMAND", crc=False)
        with m.State("RESPONSE_COMMAND"):
            send(s.cmd, "RESPONSE_STATUS", crc_start=True)
        with m.State("RESPONSE_STATUS"):
            send(s.status, "RESPONSE_COUNT")
        with m.State("RESPONSE_COUNT"):
            with m.If(returns_data & (s.done != 0)):
                send(s.done, "RESPONSE_FETCH")
            with m.Else():
                send(s.done, "RESPONSE_CRC")
        # Each response word goes buffer -> tx_word (a flop) -> transport: the block RAM's read
        # data (slow clock-to-out) never runs on into the transmitter's shift register.
        with m.State("RESPONSE_FETCH"):
            m.d.comb += s.rd.addr.eq(s.idx)
            m.next = "RESPONSE_LATCH"
        with m.State("RESPONSE_LATCH"):
            m.d.sync += s.tx_word.eq(s.rd.data)
            m.next = "RESPONSE_DATA"
        with m.State("RESPONSE_DATA"):
            byte = s.tx_word.word_select((~s.octet)[:2], 8)     # MSB octet first
            send(byte, "RESPONSE_DATA")
            with m.If(self.tx_ready):
                m.d.sync += s.octet.eq(s.octet + 1)
                with m.If(s.octet == 3):
                    m.d.sync += s.idx.eq(s.idx + 1)
                    with m.If(s.idx + 1 == s.done):
                        m.next = "RESPONSE_CRC"
                    with m.Else():
                        m.next = "RESPONSE_FETCH"
        with m.State("RESPONSE_CRC"):
            m.d.comb += self.tx_last.eq(1)
            send(tx_crc.crc, "START_OF_FRAME", crc=False)


class HostLinkUart(wiring.Component):
    """UART bridge from the framed host protocol (module docstring) to :class:`HostBusSignature`:
    :class:`UartRx` and :class:`UartTx` around a :class:`HostLinkEngine`.

    The UART transport adds the framing errors: a stop bit read low or a gap longer than
    ``frame_timeout`` cycles inside a frame abandons it (``frame_errors``). Octets that arrive
    while the engine executes or answers a frame are lost (the host waits for each answer).

    Parameters
    ----------
    baud : int
    clk_freq : int or float
        Frequency of the ``sync`` domain in Hz.
    max_words : int
        Largest ``count`` accepted (words buffered per frame, one memory).
    frame_timeout : int or None
        Cycles of silence that abandon a half-received frame (default: 50 ms).
    bus_timeout : int
        Cycles to wait for ``ack`` before answering ``TIMEOUT``.

    Ports
    -----
    rx : In(1), tx : Out(1)      serial lines (board side)
    bus : Out(HostBusSignature)  master
    frames_ok, crc_errors, frame_errors, bus_errors : Out(32)  counters
    """

    rx: In(1, init=1)
    tx: Out(1, init=1)
    bus: Out(HostBusSignature())
    frames_ok: Out(32)
    crc_errors: Out(32)
    frame_errors: Out(32)
    bus_errors: Out(32)

    def __init__(self, baud, clk_freq, *, max_words=64, frame_timeout=None, bus_timeout=4096):
        self.divisor = int(round(clk_freq / baud))
        if self.divisor < 4:
            raise ValueError(f"baud {baud} is too fast for a {clk_freq} Hz clock "
                             f"(divisor {self.divisor} < 4)")
        if not 1 <= max_words <= 255:
            raise ValueError(f"max_words {max_words} is not in 1..255")
        self.baud = baud
        self.clk_freq = clk_freq
        self.max_words = max_words
        self.frame_timeout = int(frame_timeout if frame_timeout is not None else clk_freq // 20)
        self.bus_timeout = bus_timeout
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        m.submodules.urx = urx = UartRx(self.divisor)
        m.submodules.utx = utx = UartTx(self.divisor)
        m.submodules.engine = eng = HostLinkEngine(max_words=self.max_words,
                                                   bus_timeout=self.bus_timeout)
        wiring.connect(m, eng.bus, wiring.flipped(self.bus))
        m.d.comb += [
            urx.rx.eq(self.rx), self.tx.eq(utx.tx),
            eng.rx_data.eq(urx.data), eng.rx_valid.eq(urx.valid),
            utx.data.eq(eng.tx_data), utx.valid.eq(eng.tx_valid), eng.tx_ready.eq(utx.ready),
            self.frames_ok.eq(eng.frames_ok), self.crc_errors.eq(eng.crc_errors),
            self.bus_errors.eq(eng.bus_errors), eng.frame_errors.eq(self.frame_errors),
        ]

        # Inter-octet timeout and UART framing errors abandon a frame in any receive state.
        idle_timer = Signal(range(self.frame_timeout + 1))
        abandon = urx.error | (idle_timer == self.frame_timeout)
        m.d.comb += eng.rx_abort.eq(abandon)
        with m.If(~eng.in_frame):
            m.d.sync += idle_timer.eq(0)
        with m.Elif(abandon):
            m.d.sync += self.frame_errors.eq(self.frame_errors + 1)
        with m.Elif(urx.valid):
            m.d.sync += idle_timer.eq(0)
        with m.Else():
            m.d.sync += idle_timer.eq(idle_timer + 1)
        return m


class HostBusDemoTarget(wiring.Component):
    """A small bus target: ID, scratch and counter registers, a RAM and one loop-back queue.

    Used by the board's stand-in cores (so the host link can be exercised on hardware before
    the real core exists) and by the host-link tests.

    Map
    ---
    ``Space.REG``: 0x00 ``DEMO_ID`` (ro), 0x04 ``revision`` (ro), 0x08..0x14 four scratch
    registers (rw), 0x20 + 4*i ``counters[i]`` (ro). Anything else: ``err``.
    ``Space.MEM``: ``mem_words`` words from byte address 0; beyond: ``err``.
    ``Space.QUEUE``: queue 0 is a FIFO of ``queue_depth`` words (push full / pop empty: ``err``);
    other queue numbers: ``err``.

    Parameters
    ----------
    mem_words, queue_depth : int
    scratch_init : 4 ints
        Reset values of the scratch registers (a stand-in core may use them as settings).
    n_counters : int
        Number of read-only counter inputs.
    revision : int
    """

    def __init__(self, *, mem_words=256, queue_depth=16, n_counters=4, revision=1,
                 scratch_init=(0, 0, 0, 0)):
        self.mem_words = mem_words
        self.queue_depth = queue_depth
        self.n_counters = n_counters
        self.revision = revision
        super().__init__({
            "bus": In(HostBusSignature()),
            "counters": In(32).array(n_counters),
            "scratch": Out(data.ArrayLayout(32, 4), init=list(scratch_init)),
        })

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        m.submodules.mem = mem = Memory(shape=32, depth=self.mem_words, init=[])
        mw = mem.write_port()
        mr = mem.read_port()
        m.submodules.queue = queue = fifo.SyncFIFOBuffered(width=32, depth=self.queue_depth)

        word = bus.addr[2:]
        pending = Signal()      # memory read issued, data next cycle
        m.d.sync += pending.eq(0)
        m.d.comb += [mr.addr.eq(word), mw.addr.eq(word), mw.data.eq(bus.wdata),
                     queue.w_data.eq(bus.wdata)]

        with m.Switch(bus.space):
            with m.Case(Space.REG):
                with m.If(bus.re):
                    m.d.comb += bus.ack.eq(1)
                    with m.If(bus.addr == 0x00):
                        m.d.comb += bus.rdata.eq(DEMO_ID)
                    with m.Elif(bus.addr == 0x04):
                        m.d.comb += bus.rdata.eq(self.revision)
                    for i in range(4):
                        with m.Elif(bus.addr == 0x08 + 4 * i):
                            m.d.comb += bus.rdata.eq(self.scratch[i])
                    for i in range(self.n_counters):
                        with m.Elif(bus.addr == 0x20 + 4 * i):
                            m.d.comb += bus.rdata.eq(self.counters[i])
                    with m.Else():
                        m.d.comb += bus.err.eq(1)
                with m.Elif(bus.we):
                    m.d.comb += bus.ack.eq(1)
                    for i in range(4):
                        with m.If(bus.addr == 0x08 + 4 * i):
                            m.d.sync += self.scratch[i].eq(bus.wdata)
                    valid = Const(0, 1)
                    for i in range(4):
                        valid = valid | (bus.addr == 0x08 + 4 * i)
                    m.d.comb += bus.err.eq(~valid)
            with m.Case(Space.MEM):
                in_range = bus.addr[2:] < self.mem_words
                with m.If(bus.we):
                    m.d.comb += [bus.ack.eq(1), bus.err.eq(~in_range), mw.en.eq(in_range)]
                with m.Elif(bus.re):
                    with m.If(~in_range):
                        m.d.comb += [bus.ack.eq(1), bus.err.eq(1)]
                    with m.Elif(pending):
                        m.d.comb += [bus.ack.eq(1), bus.rdata.eq(mr.data)]
                    with m.Else():
                        m.d.sync += pending.eq(1)
            with m.Case(Space.QUEUE):
                with m.If(bus.addr != 0):
                    m.d.comb += [bus.ack.eq(bus.re | bus.we), bus.err.eq(bus.re | bus.we)]
                with m.Elif(bus.we):
                    m.d.comb += [bus.ack.eq(1), bus.err.eq(~queue.w_rdy),
                                 queue.w_en.eq(queue.w_rdy)]
                with m.Elif(bus.re):
                    m.d.comb += [bus.ack.eq(1), bus.err.eq(~queue.r_rdy),
                                 bus.rdata.eq(queue.r_data), queue.r_en.eq(queue.r_rdy)]
            with m.Default():
                m.d.comb += [bus.ack.eq(bus.re | bus.we), bus.err.eq(1)]
        return m

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

from amaranth import Cat, Const, Module, Mux, Signal
from amaranth.lib import data, enum, fifo, wiring
from amaranth.lib.crc import catalog
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hw.iface import HostBusSignature, Space

__all__ = [
    "SOF_REQUEST", "SOF_RESPONSE", "Cmd", "LinkStatus",
    "UartRx", "UartTx", "HostLinkUart", "HostBusDemoTarget", "DEMO_ID",
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


class UartRx(wiring.Component):
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

    def __init__(self, divisor):
        if divisor < 4:
            raise ValueError(f"UART divisor {divisor} is below 4 cycles per bit")
        self.divisor = divisor
        super().__init__()

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


class UartTx(wiring.Component):
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

    def __init__(self, divisor):
        if divisor < 4:
            raise ValueError(f"UART divisor {divisor} is below 4 cycles per bit")
        self.divisor = divisor
        super().__init__()

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


class HostLinkUart(wiring.Component):
    """UART bridge from the framed host protocol (module docstring) to :class:`HostBusSignature`.

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
        m.d.comb += [urx.rx.eq(self.rx), self.tx.eq(utx.tx)]

        m.submodules.rx_crc = rx_crc = catalog.CRC8_SMBUS(data_width=8).create()
        m.submodules.tx_crc = tx_crc = catalog.CRC8_SMBUS(data_width=8).create()

        # Payload buffer: filled from the request (writes) or from the bus (reads), then drained
        # to the bus (writes) or the response (reads). A write is only executed once its CRC has
        # been checked, hence the buffer.
        m.submodules.buf = buf = Memory(shape=32, depth=self.max_words, init=[])
        wr = buf.write_port()
        rd = buf.read_port(transparent_for=(wr,))

        cmd = Signal(8)
        addr = Signal(32)
        count = Signal(8)
        status = Signal(LinkStatus)
        done = Signal(8)        # words executed / returned
        octet = Signal(2)       # octet index inside a 32-bit word (MSB first)
        word = Signal(32)
        idx = Signal(8)
        idle_timer = Signal(range(self.frame_timeout + 1))
        bus_timer = Signal(range(self.bus_timeout + 1))
        status_regs = Signal(range(4))
        resp_err = Signal()
        resp_data = Signal(32)
        tx_word = Signal(32)    # the response word being sent (registered buffer output)

        is_write = cmd[0]
        space_nibble = cmd[4:8]
        cmd_known = Signal()
        m.d.comb += cmd_known.eq(
            (cmd == Cmd.READ_REG) | (cmd == Cmd.WRITE_REG) | (cmd == Cmd.READ_MEM)
            | (cmd == Cmd.WRITE_MEM) | (cmd == Cmd.POP) | (cmd == Cmd.PUSH)
            | (cmd == Cmd.STATUS))
        count_ok = (count != 0) & (count <= self.max_words)
        carries_data = is_write & cmd_known & (cmd != Cmd.STATUS) & count_ok

        m.d.comb += [
            rx_crc.data.eq(urx.data),
            self.bus.addr.eq(addr),
            self.bus.space.eq(Mux(space_nibble == 1, Space.REG,
                                  Mux(space_nibble == 2, Space.MEM, Space.QUEUE))),
            self.bus.wdata.eq(rd.data),
        ]

        def byte_in():
            return urx.valid

        with m.FSM(name="link"):
            with m.State("START_OF_FRAME"):
                m.d.sync += idle_timer.eq(0)
                with m.If(byte_in() & (urx.data == SOF_REQUEST)):
                    m.d.comb += rx_crc.start.eq(1)
                    m.next = "COMMAND"

            # Inter-octet timeout and UART framing errors abandon a frame in any receive state.
            abandon = urx.error | (idle_timer == self.frame_timeout)

            def receive_guard():
                with m.If(abandon):
                    m.d.sync += self.frame_errors.eq(self.frame_errors + 1)
                    m.next = "START_OF_FRAME"
                with m.Elif(byte_in()):
                    m.d.sync += idle_timer.eq(0)
                with m.Else():
                    m.d.sync += idle_timer.eq(idle_timer + 1)

            with m.State("COMMAND"):
                receive_guard()
                with m.If(byte_in() & ~abandon):
                    m.d.comb += rx_crc.valid.eq(1)
                    m.d.sync += [cmd.eq(urx.data), octet.eq(0)]
                    m.next = "ADDRESS"
            with m.State("ADDRESS"):
                receive_guard()
                with m.If(byte_in() & ~abandon):
                    m.d.comb += rx_crc.valid.eq(1)
                    m.d.sync += [addr.eq(Cat(urx.data, addr[:24])), octet.eq(octet + 1)]
                    with m.If(octet == 3):
                        m.next = "COUNT"
            with m.State("COUNT"):
                receive_guard()
                with m.If(byte_in() & ~abandon):
                    m.d.comb += rx_crc.valid.eq(1)
                    m.d.sync += [count.eq(urx.data), idx.eq(0), octet.eq(0)]
                    m.next = "COUNT_DECODE"
            with m.State("COUNT_DECODE"):
                # One cycle to look at cmd and count together before choosing the next octet.
                with m.If(carries_data):
                    m.next = "PAYLOAD"
                with m.Else():
                    m.next = "CHECK"
            with m.State("PAYLOAD"):
                receive_guard()
                with m.If(byte_in() & ~abandon):
                    m.d.comb += rx_crc.valid.eq(1)
                    m.d.sync += [word.eq(Cat(urx.data, word[:24])), octet.eq(octet + 1)]
                    with m.If(octet == 3):
                        m.d.comb += [wr.addr.eq(idx), wr.data.eq(Cat(urx.data, word[:24])),
                                     wr.en.eq(1)]
                        m.d.sync += idx.eq(idx + 1)
                        with m.If(idx + 1 == count):
                            m.next = "CHECK"
            with m.State("CHECK"):
                receive_guard()
                with m.If(byte_in() & ~abandon):
                    m.d.sync += [idx.eq(0), done.eq(0), bus_timer.eq(0), status_regs.eq(0)]
                    with m.If(urx.data != rx_crc.crc):
                        m.d.sync += [status.eq(LinkStatus.BAD_CRC),
                                     self.crc_errors.eq(self.crc_errors + 1)]
                        m.next = "RESPONSE"
                    with m.Elif(~cmd_known):
                        m.d.sync += status.eq(LinkStatus.BAD_CMD)
                        m.next = "RESPONSE"
                    with m.Elif(cmd == Cmd.STATUS):
                        m.d.sync += [status.eq(LinkStatus.OK),
                                     self.frames_ok.eq(self.frames_ok + 1)]
                        m.next = "STATUS_WORDS"
                    with m.Elif(~count_ok):
                        m.d.sync += status.eq(LinkStatus.BAD_COUNT)
                        m.next = "RESPONSE"
                    with m.Elif((addr[:2] != 0) & (space_nibble != 3)):
                        m.d.sync += status.eq(LinkStatus.BAD_ALIGN)
                        m.next = "RESPONSE"
                    with m.Else():
                        m.d.sync += [status.eq(LinkStatus.OK),
                                     self.frames_ok.eq(self.frames_ok + 1)]
                        m.next = "BUS_PREFETCH"

            with m.State("STATUS_WORDS"):
                m.d.comb += [wr.addr.eq(status_regs), wr.en.eq(1),
                             wr.data.eq(Mux(status_regs == 0, self.frames_ok,
                                        Mux(status_regs == 1, self.crc_errors,
                                        Mux(status_regs == 2, self.frame_errors,
                                            self.bus_errors))))]
                m.d.sync += status_regs.eq(status_regs + 1)
                with m.If(status_regs == 3):
                    m.d.sync += done.eq(4)
                    m.next = "RESPONSE"

            with m.State("BUS_PREFETCH"):
                # The buffer read port has one cycle of latency: present idx, use data next.
                m.d.comb += rd.addr.eq(idx)
                m.d.sync += bus_timer.eq(0)
                with m.If(idx == count):
                    m.next = "RESPONSE"
                with m.Else():
                    m.next = "BUS_ACCESS"
            with m.State("BUS_ACCESS"):
                m.d.comb += [rd.addr.eq(idx), self.bus.we.eq(is_write), self.bus.re.eq(~is_write)]
                m.d.sync += bus_timer.eq(bus_timer + 1)
                # The answer is registered and acted on in the next state: the target's decode
                # logic then ends in a flop instead of running on into the buffer's write port.
                with m.If(self.bus.ack):
                    m.d.sync += [resp_err.eq(self.bus.err), resp_data.eq(self.bus.rdata)]
                    m.next = "BUS_DONE"
                with m.Elif(bus_timer == self.bus_timeout):
                    m.d.sync += [status.eq(LinkStatus.TIMEOUT),
                                 self.bus_errors.eq(self.bus_errors + 1)]
                    m.next = "RESPONSE"
            with m.State("BUS_DONE"):
                m.d.comb += rd.addr.eq(idx)
                with m.If(resp_err):
                    with m.If(cmd == Cmd.POP):
                        m.next = "RESPONSE"     # queue ran empty: a short, good answer
                    with m.Elif(cmd == Cmd.PUSH):
                        m.d.sync += status.eq(LinkStatus.QUEUE_FULL)
                        m.next = "RESPONSE"
                    with m.Else():
                        m.d.sync += [status.eq(LinkStatus.BUS_ERROR),
                                     self.bus_errors.eq(self.bus_errors + 1)]
                        m.next = "RESPONSE"
                with m.Else():
                    with m.If(~is_write):
                        m.d.comb += [wr.addr.eq(idx), wr.data.eq(resp_data), wr.en.eq(1)]
                    m.d.sync += [idx.eq(idx + 1), done.eq(done + 1)]
                    with m.If(space_nibble != 3):
                        m.d.sync += addr.eq(addr + 4)
                    m.next = "BUS_PREFETCH"

            # ---- response -------------------------------------------------------------------
            def send(value, next_state, *, crc_start=False, crc=True):
                m.d.comb += [utx.data.eq(value), utx.valid.eq(1)]
                with m.If(utx.ready):
                    if crc:
                        m.d.comb += [tx_crc.data.eq(value), tx_crc.valid.eq(1)]
                    if crc_start:
                        m.d.comb += tx_crc.start.eq(1)
                    m.next = next_state

            # Reads return data words; STATUS returns its 4 counters.
            returns_data = (~is_write | (cmd == Cmd.STATUS)) & (status != LinkStatus.BAD_CRC) \
                & (status != LinkStatus.BAD_CMD)
            with m.State("RESPONSE"):
                m.d.sync += [idx.eq(0), octet.eq(0)]
                send(SOF_RESPONSE, "RESPONSE_COMMAND", crc=False)
            with m.State("RESPONSE_COMMAND"):
                send(cmd, "RESPONSE_STATUS", crc_start=True)
            with m.State("RESPONSE_STATUS"):
                send(status, "RESPONSE_COUNT")
            with m.State("RESPONSE_COUNT"):
                with m.If(returns_data & (done != 0)):
                    send(done, "RESPONSE_FETCH")
                with m.Else():
                    send(done, "RESPONSE_CRC")
            # Each response word goes buffer -> tx_word (a flop) -> UART: the block RAM's read
            # data (slow clock-to-out) never runs on into the transmitter's shift register.
            with m.State("RESPONSE_FETCH"):
                m.d.comb += rd.addr.eq(idx)
                m.next = "RESPONSE_LATCH"
            with m.State("RESPONSE_LATCH"):
                m.d.sync += tx_word.eq(rd.data)
                m.next = "RESPONSE_DATA"
            with m.State("RESPONSE_DATA"):
                byte = tx_word.word_select((~octet)[:2], 8)     # MSB octet first
                send(byte, "RESPONSE_DATA")
                with m.If(utx.ready):
                    m.d.sync += octet.eq(octet + 1)
                    with m.If(octet == 3):
                        m.d.sync += idx.eq(idx + 1)
                        with m.If(idx + 1 == done):
                            m.next = "RESPONSE_CRC"
                        with m.Else():
                            m.next = "RESPONSE_FETCH"
            with m.State("RESPONSE_CRC"):
                send(tx_crc.crc, "START_OF_FRAME", crc=False)
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

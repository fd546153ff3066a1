# Ref: protocol in hw/target/hostlink.py. Oracles: amaranth.lib.crc's software
#      CRC-8/SMBUS model and its published check value; a bit-level UART line model written here
#      from the 8N1 definition; the demo target's documented map; plain Python lists/bytes.
"""Host link: the host-side UartLink drives the gateware bridge through a simulated UART line."""

import random
from collections import deque

import pytest
from amaranth import Elaboratable, Module
from amaranth.lib import wiring
from amaranth.lib.crc import catalog
from amaranth.sim import Simulator

from host.link import (LinkError, LinkStatusError, LinkTimeout, UartLink, crc8,
                       encode_request)
from hw.target.hostlink import (DEMO_ID, Cmd, HostBusDemoTarget, HostLinkUart, LinkStatus,
                             UartRx)

# Background testbenches are closed mid-wait when a test ends; Python reports that as unraisable.
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

CLK = 1e6
DIVISOR = 4                 # clock cycles per UART bit: fast but still bit-level
PERIOD = 1 / CLK


async def ticks(ctx, n):
    # Plain ticks rather than tick().repeat(): the latter is an async generator, and closing a
    # background testbench inside it at the end of a test makes Python print a warning.
    for _ in range(n):
        await ctx.tick()


class LinkTop(Elaboratable):
    def __init__(self, *, max_words=8, connect_target=True, frame_timeout=2000,
                 bus_timeout=64, queue_depth=8, mem_words=64, registered=False):
        self.link = HostLinkUart(CLK / DIVISOR, CLK, max_words=max_words,
                                 frame_timeout=frame_timeout, bus_timeout=bus_timeout)
        self.target = HostBusDemoTarget(mem_words=mem_words, queue_depth=queue_depth)
        self.connect_target = connect_target
        # boards.cores.HostBusRegister between the two, as the kbtp board core has it.
        self.registered = registered

    def elaborate(self, platform):
        m = Module()
        m.submodules.link = self.link
        m.submodules.target = self.target
        if self.connect_target and self.registered:
            from boards.cores import HostBusRegister

            m.submodules.bus_reg = reg = HostBusRegister()
            wiring.connect(m, self.link.bus, reg.up)
            wiring.connect(m, reg.down, self.target.bus)
        elif self.connect_target:
            wiring.connect(m, self.link.bus, self.target.bus)
        return m


class SimSerial:
    """A serial port whose far end is the simulated bridge, at bit level (8N1, LSB first).

    ``write`` queues octets that a process shifts onto ``rx``; a second process samples ``tx``
    in the middle of each bit. ``read(n)`` runs the simulation until n octets have arrived or
    ``timeout_cycles`` passed, like a pyserial port with a timeout.
    """

    def __init__(self, top, *, timeout_cycles=60000):
        self.top = top
        self.to_dut = deque()
        self.from_dut = bytearray()
        self.framing_errors = 0
        self.timeout_cycles = timeout_cycles
        self.sim = Simulator(top)
        self.sim.add_clock(PERIOD)
        self.sim.add_testbench(self._drive, background=True)
        self.sim.add_testbench(self._sample, background=True)
        self.sim.add_testbench(self._watch, background=True)
        self.crc_errors_seen = []
        self.now = 0.0
        self.break_next = False     # send the next octet with a low stop bit

    async def _drive(self, ctx):
        rx = self.top.link.rx
        ctx.set(rx, 1)
        while True:
            if not self.to_dut:
                await ticks(ctx, DIVISOR)
                continue
            byte = self.to_dut.popleft()
            stop = 0 if self.break_next else 1
            self.break_next = False
            for bit in [0] + [(byte >> i) & 1 for i in range(8)] + [stop]:
                ctx.set(rx, bit)
                await ticks(ctx, DIVISOR)
            ctx.set(rx, 1)
            await ticks(ctx, DIVISOR)

    async def _sample(self, ctx):
        tx = self.top.link.tx
        while True:
            while ctx.get(tx):
                await ctx.changed(tx)
                await ctx.tick()
            await ticks(ctx, DIVISOR // 2)      # middle of the start bit
            assert ctx.get(tx) == 0, "glitch on tx: start bit not held"
            value = 0
            for i in range(8):
                await ticks(ctx, DIVISOR)
                value |= ctx.get(tx) << i
            await ticks(ctx, DIVISOR)
            if ctx.get(tx) != 1:
                self.framing_errors += 1
            self.from_dut.append(value)

    async def _watch(self, ctx):
        # Record every value the gateware's own CRC error counter takes.
        async for (value,) in ctx.changed(self.top.link.crc_errors):
            self.crc_errors_seen.append(value)

    def run(self, cycles):
        self.now += cycles * PERIOD
        self.sim.run_until(self.now)

    def write(self, data):
        self.to_dut.extend(data)
        return len(data)

    def read(self, n):
        waited = 0
        while len(self.from_dut) < n and waited < self.timeout_cycles:
            self.run(200)
            waited += 200
        out = bytes(self.from_dut[:n])
        del self.from_dut[:n]
        return out


def make_link(**kw):
    top = LinkTop(**kw)
    port = SimSerial(top)
    return top, port, UartLink(port, max_words=kw.get("max_words", 8))


# ---- oracles for the CRC and UART framing ----------------------------------------------------

def test_crc8_matches_amaranth_catalog_and_check_value():
    params = catalog.CRC8_SMBUS()
    assert crc8(b"123456789") == 0xF4                  # the catalogue's published check value
    rng = random.Random(1)
    for _ in range(50):
        data = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
        assert crc8(data) == params.compute(data)


def test_uart_rx_flags_low_stop_bit():
    dut = UartRx(DIVISOR)
    got, errors = [], []

    async def bench(ctx):
        ctx.set(dut.rx, 1)
        await ctx.tick().repeat(5)
        for byte, stop in [(0x3C, 1), (0xA5, 0), (0x81, 1)]:
            for bit in [0] + [(byte >> i) & 1 for i in range(8)] + [stop]:
                ctx.set(dut.rx, bit)
                for _ in range(DIVISOR):
                    await ctx.tick()
                    if ctx.get(dut.valid):
                        got.append(ctx.get(dut.data))
                    if ctx.get(dut.error):
                        errors.append(byte)
            ctx.set(dut.rx, 1)
            for _ in range(3 * DIVISOR):
                await ctx.tick()
                if ctx.get(dut.valid):
                    got.append(ctx.get(dut.data))
                if ctx.get(dut.error):
                    errors.append(byte)

    sim = Simulator(dut)
    sim.add_clock(PERIOD)
    sim.add_testbench(bench)
    sim.run()
    assert got == [0x3C, 0x81]
    assert errors == [0xA5]


# ---- round trips through the bridge ---------------------------------------------------------

@pytest.mark.parametrize("registered", [False, True])
def test_register_round_trip_and_unmapped_register(registered):
    top, port, link = make_link(registered=registered)
    assert link.read_reg(0x00) == DEMO_ID
    assert link.read_reg(0x04) == 1
    values = [0xDEADBEEF, 0x00000001, 0x80000000, 0x12345678]
    for i, v in enumerate(values):
        link.write_reg(0x08 + 4 * i, v)
    assert [link.read_reg(0x08 + 4 * i) for i in range(4)] == values
    with pytest.raises(LinkStatusError, match="read_reg\\(0x100\\).*BUS_ERROR") as exc:
        link.read_reg(0x100)
    assert exc.value.status is LinkStatus.BUS_ERROR and exc.value.done == 0
    with pytest.raises(LinkStatusError, match="BUS_ERROR"):
        link.write_reg(0x00, 5)                        # the ID register is read-only
    st = link.status()
    assert st["bus_errors"] == 2 and st["crc_errors"] == 0
    assert port.framing_errors == 0


def test_status_on_a_link_of_fewer_than_four_words():
    """STATUS answers 4 words on any link: the bridge takes it before the count check, so the
    host does not hold it to max_words (here 2)."""
    top, port, link = make_link(max_words=2)
    with pytest.raises(LinkStatusError, match="BUS_ERROR"):
        link.read_reg(0x100)
    st = link.status()
    assert st["bus_errors"] == 1 and st["crc_errors"] == 0


@pytest.mark.parametrize("registered", [False, True])
def test_memory_round_trip_multi_frame(registered):
    top, port, link = make_link(max_words=8, mem_words=64, registered=registered)
    rng = random.Random(7)
    data = bytes(rng.randrange(256) for _ in range(4 * 21))     # 21 words = 3 frames of <= 8
    link.write_mem(0x20, data)
    assert link.read_mem(0x20, len(data)) == data
    assert link.read_mem(0x24, 8) == data[4:12]
    # Reading across the end of the 64-word memory stops at the first refused word.
    with pytest.raises(LinkStatusError) as exc:
        link.read_mem(4 * 62, 16)
    assert exc.value.status is LinkStatus.BUS_ERROR
    assert exc.value.done == 2 and len(exc.value.data) == 8


@pytest.mark.parametrize("registered", [False, True])
def test_queue_push_pop_full_and_empty(registered):
    top, port, link = make_link(queue_depth=8, registered=registered)
    words = [0x01020304, 0xFFFFFFFF, 0, 0x55AA55AA, 0x7]
    link.push(0, words)
    assert link.pop(0, 8) == words                     # returns early: the queue ran empty
    assert link.pop(0, 3) == []
    with pytest.raises(LinkStatusError, match="QUEUE_FULL") as exc:
        link.push(0, list(range(100, 110)))            # depth 8: two words refused
    assert exc.value.done == 8
    assert link.pop(0, 8) == list(range(100, 108))
    assert link.pop(5, 2) == []                        # unknown queue reads as empty


def test_bad_crc_rejected_with_error_response_and_counter():
    top, port, link = make_link()
    frame = bytearray(encode_request(Cmd.WRITE_REG, 0x08, 1, (0xCAFEF00D).to_bytes(4, "big")))
    frame[-1] ^= 0x01
    port.write(bytes(frame))
    resp = port.read(5)
    assert resp[0] == 0x5A and resp[1] == Cmd.WRITE_REG.value
    assert resp[2] == LinkStatus.BAD_CRC.value and resp[3] == 0
    assert resp[4] == crc8(resp[1:4])
    assert link.read_reg(0x08) == 0                    # the write was not executed
    # A corrupted data octet (CRC left as sent) must be caught as well.
    frame = bytearray(encode_request(Cmd.WRITE_REG, 0x08, 1, (0xCAFEF00D).to_bytes(4, "big")))
    frame[8] ^= 0x40
    port.write(bytes(frame))
    assert port.read(5)[2] == LinkStatus.BAD_CRC.value
    with pytest.raises(LinkStatusError, match="BAD_CRC"):
        # The host class raises on the same condition when the line corrupts a frame.
        class Corrupting:
            def write(self, data):
                port.write(data[:-1] + bytes([data[-1] ^ 0x80]))

            def read(self, n):
                return port.read(n)
        UartLink(Corrupting()).write_reg(0x08, 1)
    st = link.status()
    assert st["crc_errors"] == 3
    assert st["frames_ok"] == 2                       # read_reg and this status()
    assert port.crc_errors_seen[-3:] == [1, 2, 3]


def test_truncated_frame_times_out_and_link_recovers():
    top, port, link = make_link(frame_timeout=500)
    port.write(encode_request(Cmd.WRITE_REG, 0x08, 1, b"\x00\x00\x00\x01")[:6])
    port.run(2000)                                    # silence > frame_timeout
    port.write(bytes([0xA5]))
    port.run(20 * DIVISOR)
    port.break_next = True                            # and a framing error mid-frame
    port.write(bytes([0x10, 0x00]))
    port.run(2000)
    assert port.read(1) == b""                        # a broken frame gets no answer
    link.write_reg(0x0C, 0x77)
    assert link.read_reg(0x0C) == 0x77
    assert link.read_reg(0x08) == 0
    assert link.status()["frame_errors"] == 2


def test_bus_timeout_and_bad_command():
    top, port, link = make_link(connect_target=False, bus_timeout=40)
    with pytest.raises(LinkStatusError, match="TIMEOUT"):
        link.read_reg(0)
    port.write(encode_request(0x13, 0, 1))            # unknown command, no data octets
    resp = port.read(5)
    assert resp[1] == 0x13 and resp[2] == LinkStatus.BAD_CMD.value
    port.write(encode_request(Cmd.READ_MEM, 2, 1))    # misaligned, bypassing the host checks
    assert port.read(5)[2] == LinkStatus.BAD_ALIGN.value
    port.write(encode_request(Cmd.READ_MEM, 0, 9))    # count above max_words (8)
    assert port.read(5)[2] == LinkStatus.BAD_COUNT.value


# ---- host-side argument checking (no gateware) ----------------------------------------------

class Silent:
    def __init__(self):
        self.sent = b""

    def write(self, data):
        self.sent += data

    def read(self, n):
        return b""


def test_host_errors_name_the_offending_value():
    link = UartLink(Silent())
    with pytest.raises(ValueError, match="0x6 is not a multiple of 4"):
        link.read_reg(6)
    with pytest.raises(ValueError, match="value 0x100000000"):
        link.write_reg(0, 1 << 32)
    with pytest.raises(ValueError, match="data length 6"):
        link.write_mem(0, b"\x00" * 6)
    with pytest.raises(ValueError, match="words\\[1\\] -1 is negative"):
        link.push(0, [1, -1])
    with pytest.raises(TypeError, match="address must be an int, not str"):
        link.read_reg("0")
    with pytest.raises(TypeError, match="has no write"):
        UartLink(object())
    with pytest.raises(LinkTimeout, match="response start octet"):
        link.read_reg(0)
    # The request on the wire: SOF, cmd, addr BE, count, CRC over cmd..count.
    assert link.port.sent == bytes([0xA5, 0x10, 0, 0, 0, 0, 1, crc8(bytes([0x10, 0, 0, 0, 0, 1]))])


def test_host_rejects_corrupt_response():
    class Answer:
        def __init__(self, resp):
            self.resp = bytearray(resp)

        def write(self, data):
            pass

        def read(self, n):
            out = bytes(self.resp[:n])
            del self.resp[:n]
            return out
    body = bytes([0x10, 0, 1]) + (0x11223344).to_bytes(4, "big")
    good = bytes([0x5A]) + body + bytes([crc8(body)])
    assert UartLink(Answer(b"\x00\xff" + good)).read_reg(0) == 0x11223344   # noise skipped
    with pytest.raises(LinkError, match="response CRC"):
        UartLink(Answer(good[:-1] + bytes([good[-1] ^ 1]))).read_reg(0)
    with pytest.raises(LinkError, match="command 0x20"):
        UartLink(Answer(bytes([0x5A, 0x20]) + good[2:])).read_reg(0)

# Ref: hw/target/hostlink.py (UART wire protocol, bus spaces, demo target map); host/link.py;
#      host/port.py (link_access); model/target.py (the oracle of the driver run).
"""The UART backend of the host port.

1. :func:`host.port.link_access` through the real bridge gateware (HostLinkUart + the demo bus
   target, bit-level UART, tests/hw/target/test_hostlink.py's SimSerial): registers, single and bulk
   memory (the two paths must agree on octet order), queues, refused accesses.
2. The driver over UartLink + link_access against a frame-level bridge written here from the
   protocol text (CRC from amaranth.lib.crc's catalogue), in front of tests/host/test_driver.py's
   fake target: HELLO / ALLOC_STORE / FREE replies and memory still equal the golden model's.
"""

import asyncio
import random
import struct

import pytest
from amaranth.lib.crc import catalog

from hw.headers import Status
from host.link import UartLink
from host.port import HostError, TargetPort, pack_record, link_access
from hw.target.hostlink import DEMO_ID, SOF_REQUEST, SOF_RESPONSE, Cmd, LinkStatus
from hw.iface import RecvNotify, Space

from model.target import TargetModel
from tests.host.test_driver import World, alloc_inline, compl_of, free, hello
from tests.hw.target.test_hostlink import make_link

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def run(coro):
    return asyncio.run(coro)


def test_link_access_on_the_bridge_gateware():
    top, serial, link = make_link(max_words=4, mem_words=32)
    port = TargetPort(link_access(link))
    rng = random.Random(5)

    async def go():
        assert await port.rreg(0x00) == DEMO_ID
        await port.wreg(0x08, 0xCAFEF00D)
        assert await port.rreg(0x08) == 0xCAFEF00D
        # bulk (several frames of 4 words), unaligned at both ends
        data = bytes(rng.randrange(256) for _ in range(37))
        await port.mem_write(6, data)
        assert await port.mem_read(6, 37) == data
        # single-word path: octet addr in bits 7..0 of the word
        for a in range(8, 40, 4):
            assert await port.read(Space.MEM, a) == int.from_bytes(data[a - 6:a - 2], "little")
        await port.write(Space.MEM, 0x40, 0x44332211)
        assert await port.mem_read(0x40, 4) == bytes([0x11, 0x22, 0x33, 0x44])
        # queue 0 is a loop-back FIFO; empty pops answer err
        for w in (1, 2, 3):
            await port.write(Space.QUEUE, 0, w)
        assert [await port.read(Space.QUEUE, 0) for _ in range(3)] == [1, 2, 3]
        with pytest.raises(HostError, match="read QUEUE 0x0"):
            await port.read(Space.QUEUE, 0)
        # whole records in one frame each (RecvNotify = 4 words, LS word first)
        rec = dict(qp=3, addr=0x1234, length=77, has_imm=1, imm=0xA5A5A5A5, inv_rkey=9)
        await port._push(0, RecvNotify, **rec)
        assert [await port.read(Space.QUEUE, 0) for _ in range(4)] == \
            [(pack_record(RecvNotify, **rec) >> (32 * k)) & 0xFFFFFFFF for k in range(4)]
        await port._push(0, RecvNotify, **rec)
        got = await port._pop(0, RecvNotify)
        assert {k: got[k] for k in rec} == rec and await port._pop(0, RecvNotify) is None
        await port.write(Space.QUEUE, 0, 7)
        with pytest.raises(HostError, match="cut short: 1 of 4"):
            await port._pop(0, RecvNotify)
        await port._push(0, RecvNotify, **rec)
        await port._push(0, RecvNotify, **rec)            # 8 words: the FIFO is full
        with pytest.raises(HostError, match="write QUEUE 0x0 value .*QUEUE_FULL"):
            await port._push(0, RecvNotify, **rec)
        with pytest.raises(HostError, match="read REG 0x100"):
            await port.rreg(0x100)
        with pytest.raises(HostError, match="write REG 0x0 value 0x5"):
            await port.wreg(0x00, 5)
        with pytest.raises(HostError, match="bulk write"):
            await port.mem_write(4 * 30, bytes(16))          # runs past the 32 words
    run(go())
    assert serial.framing_errors == 0


class PyBridge:
    """A serial port whose far end is a frame-level bridge (protocol of hw/target/hostlink.py)
    in front of an async ``access`` (the test driver's fake target)."""

    def __init__(self, access, max_words=16):
        self.access = access
        self.max_words = max_words
        self.rx = bytearray()
        self.out = bytearray()
        self.crc = catalog.CRC8_SMBUS()
        self.frames = 0

    def _call(self, *args):
        coro = self.access(*args)
        try:
            coro.send(None)
        except StopIteration as stop:
            return stop.value
        raise AssertionError("the fake target never waits")

    def write(self, data):
        self.rx += data
        while len(self.rx) >= 8:
            assert self.rx[0] == SOF_REQUEST
            cmd, addr, count = struct.unpack(">BIB", bytes(self.rx[1:7]))
            writes = cmd & 1 and cmd != Cmd.STATUS.value
            n = 7 + (4 * count if writes else 0) + 1
            if len(self.rx) < n:
                break
            frame, self.rx = bytes(self.rx[:n]), self.rx[n:]
            assert self.crc.compute(frame[1:-1]) == frame[-1]
            self._execute(cmd, addr, count, frame[7:-1])
        return len(data)

    def _execute(self, cmd, addr, count, data):
        self.frames += 1
        space = {1: Space.REG, 2: Space.MEM, 3: Space.QUEUE}[cmd >> 4]
        status, done, out = LinkStatus.OK, 0, b""
        for k in range(count):
            a = addr if space is Space.QUEUE else addr + 4 * k
            if cmd & 1:
                (w,) = struct.unpack(">I", data[4 * k:4 * k + 4])
                _, err = self._call(space, a, 1, w)
            else:
                w, err = self._call(space, a, 0, 0)
            if err:
                if space is Space.QUEUE and not cmd & 1:
                    break                       # POP stops early, status OK
                status = LinkStatus.QUEUE_FULL if space is Space.QUEUE else \
                    LinkStatus.BUS_ERROR
                break
            done += 1
            if not cmd & 1:
                out += struct.pack(">I", w)
        body = bytes([cmd, status.value, done]) + out
        self.out += bytes([SOF_RESPONSE]) + body + bytes([self.crc.compute(body)])

    def read(self, n):
        got, self.out = bytes(self.out[:n]), self.out[n:]
        return got


def test_driver_over_uart_matches_model():
    w = World()
    bridge = PyBridge(w.fake)
    w.drv.port = TargetPort(link_access(UartLink(bridge, max_words=16)))
    w.slow(0, hello(1))
    w.slow(1, hello(2))
    for k in range(3):
        w.engine(0, alloc_inline(k, 0x4000 + k, b"uart%d" % k))
    m, _ = w.slow(0, free(5, 0x4001))
    assert compl_of(m).status == 0 and w.usage_reg(0) == 2
    m, _ = w.slow(1, free(6, 0x4001))
    assert compl_of(m).status == Status.INVALID_HANDLE.value         # not its range
    before = bridge.frames
    run(w.drv.init())                                 # the whole image again, in bulk frames
    n = w.lay["size"]
    assert bytes(w.fake.mem[:n]) == bytes(TargetModel(w.cfg).mem[:n])
    assert bridge.frames - before < w.lay["size"] // 64 + 200

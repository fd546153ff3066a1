# Ref: issue 23 (UDP host-link wire format and rules); hw/target/udplink.py; hw/target/hostlink.py
#      (frames). Oracles: scapy builds every Ethernet/IPv4/UDP frame (its own IPv4 and UDP
#      checksums) and re-computes the checksums of every response; amaranth.lib.crc's software
#      CRC-8/SMBUS model; request frames packed here with struct; the demo target's documented
#      map (hw/target/hostlink.py HostBusDemoTarget).
"""UDP host link in the Amaranth simulator, widths 8 and 64: execution, duplicates, sync, every
rejection rule (its counter moves, nothing runs on the bus, nothing is sent), throughput."""

import collections
import random
import struct

import pytest
from amaranth import Elaboratable, Module
from amaranth.lib import wiring
from amaranth.lib.crc import catalog
from amaranth.sim import Simulator
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether
from scapy.packet import Raw
from scapy.utils import checksum

from hw.iface import REG_UDPLINK, Space
from hw.target.hostlink import DEMO_ID, Cmd, HostBusDemoTarget, LinkStatus
from hw.target.regbank import TARGET_ID
from hw.target.target import KbtpTarget
from hw.target.udplink import (HOSTLINK_UDP_PORT, T_REQUEST, T_RESPONSE, T_SYNC,
                               T_SYNC_RESPONSE, UDPLINK_COUNTER_BASE, UDPLINK_COUNTERS,
                               UDPLINK_ID, UDPLINK_REGS, HostBusArbiter, UdpHostLink)
from sim.hostbus import bus_access

from host.udplink import UdpLink

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

HOST_MAC, HOST_IP, HOST_PORT = "02:00:00:00:00:02", "10.0.0.2", 50000
TGT_MAC, TGT_IP = "02:00:00:00:00:01", "10.0.0.1"
MAX_WORDS = 8
CRC = catalog.CRC8_SMBUS()


def mac_int(mac):
    return int(mac.replace(":", ""), 16)


def ip_int(ip):
    return int.from_bytes(bytes(int(x) for x in ip.split(".")), "big")


# ---- frames (struct + the catalogue CRC) and datagrams (scapy) ------------------------------

def req(cmd, addr, count, words=()):
    """One host-link request frame."""
    body = struct.pack(">BIB", getattr(cmd, "value", cmd), addr, count)
    body += b"".join(struct.pack(">I", w) for w in words)
    return bytes([0xA5]) + body + bytes([CRC.compute(body)])


def kh(kind, seq, body=b"", *, magic=b"KH", version=1):
    return struct.pack(">2sBBI", magic, version, kind, seq & 0xFFFFFFFF) + body


def frame(payload, *, src_mac=HOST_MAC, dst_mac=TGT_MAC, src_ip=HOST_IP, dst_ip=TGT_IP,
          sport=HOST_PORT, dport=HOSTLINK_UDP_PORT, udp_chksum=None, ip_chksum=None,
          ip_len=None, pad=True):
    """An Ethernet frame (no FCS) built by scapy; checksums scapy's unless given."""
    udp = UDP(sport=sport, dport=dport)
    if udp_chksum is not None:
        udp.chksum = udp_chksum
    ip = IP(src=src_ip, dst=dst_ip, flags="DF")
    if ip_chksum is not None:
        ip.chksum = ip_chksum
    if ip_len is not None:
        ip.len = ip_len
    raw = bytes(Ether(src=src_mac, dst=dst_mac) / ip / udp / Raw(payload))
    return raw.ljust(60, b"\0") if pad else raw


def good_udp_chksum(raw):
    return Ether(raw)[UDP].chksum


def ones16(data):
    """16-bit one's-complement sum of ``data`` (RFC 1071), for the search below only."""
    data = bytes(data) + b"\0" * (len(data) % 2)
    total = sum(struct.unpack(f">{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return total


def write_whose_udp_checksum_is_zero(seq):
    """A request datagram (WRITE_REG 0x0C of a word found here) whose UDP checksum computes to
    0, so that it is sent as 0xFFFF (RFC 768) and a zero in its place passes the sum: only the
    "zero means no checksum" rule refuses it. ``(payload, word)``."""
    pseudo = struct.pack(">IIBBH", ip_int(HOST_IP), ip_int(TGT_IP), 0, 17, 8 + 8 + 12)
    for w in range(1 << 20):
        payload = kh(T_REQUEST, seq, req(Cmd.WRITE_REG, 0x0C, 1, [w]))
        udp = struct.pack(">HHHH", HOST_PORT, HOSTLINK_UDP_PORT, 8 + len(payload), 0)
        if ones16(pseudo + udp + payload) == 0xFFFF:
            return payload, w
    raise AssertionError("no such word")


def parse_reply(raw):
    """Check a frame from the endpoint with scapy (addresses, lengths, both checksums
    re-computed); ``(type, seq, body)``."""
    p = Ether(raw)
    assert (p.src, p.dst) == (TGT_MAC, HOST_MAC)
    assert (p[IP].src, p[IP].dst, p[IP].ttl, p[IP].flags) == (TGT_IP, HOST_IP, 64, "DF")
    assert (p[UDP].sport, p[UDP].dport) == (HOSTLINK_UDP_PORT, HOST_PORT)
    assert p[IP].len == len(raw) - 14 and p[UDP].len == p[IP].len - 20
    q = p.copy()
    del q[IP].chksum
    del q[UDP].chksum
    q = Ether(bytes(q))
    assert p[IP].chksum == q[IP].chksum, "IPv4 header checksum"
    assert p[UDP].chksum == q[UDP].chksum != 0, "UDP checksum"
    payload = bytes(p[UDP].payload)
    magic, version, kind, seq = struct.unpack(">2sBBI", payload[:8])
    assert (magic, version) == (b"KH", 1)
    return kind, seq, payload[8:]


def split_responses(requests, body):
    """``[(cmd, status, count, words)]`` of the response frames to ``requests``; checks the
    start octets, the CRCs and that nothing follows."""
    out, pos = [], 0
    known = {c.value: c for c in Cmd}
    for r in requests:
        cmd = r[1]
        assert body[pos] == 0x5A, f"start octet at {pos}"
        rcmd, status, count = body[pos + 1:pos + 4]
        assert rcmd == cmd
        reads = (not cmd & 1 or cmd == Cmd.STATUS.value) \
            and status not in (LinkStatus.BAD_CRC.value, LinkStatus.BAD_CMD.value)
        n = 4 * count if reads else 0
        data = body[pos + 4:pos + 4 + n]
        assert body[pos + 4 + n] == CRC.compute(body[pos + 1:pos + 4 + n]), "response CRC"
        out.append((known.get(cmd, cmd), LinkStatus(status), count,
                    list(struct.unpack(f">{count}I", data)) if n else []))
        pos += 5 + n
    assert pos == len(body), "octets after the response frames"
    return out


# ---- the bench ------------------------------------------------------------------------------

class Top(Elaboratable):
    def __init__(self, width, max_words=MAX_WORDS):
        self.link = UdpHostLink(width, max_words=max_words, bus_timeout=64)
        self.target = HostBusDemoTarget(mem_words=64, queue_depth=8)

    def elaborate(self, platform):
        m = Module()
        m.submodules.link, m.submodules.target = self.link, self.target
        wiring.connect(m, self.link.bus, self.target.bus)
        m.d.comb += [self.link.own_mac.eq(mac_int(TGT_MAC)), self.link.own_ip.eq(ip_int(TGT_IP))]
        return m


class Bench:
    """The endpoint + demo target; a background process counts cycles and bus accesses and
    collects output frames (``out``: ``(cycle of the last beat, bytes)``)."""

    def __init__(self, width, *, out_stall=0.0, seed=1):
        self.width, self.nl = width, width // 8
        self.top = Top(width)
        self.link = self.top.link
        self.out, self.cycle, self.bus_cycles = [], 0, 0
        self.out_stall = out_stall
        self.rng = random.Random(seed)
        self.sim = Simulator(self.top)
        self.sim.add_clock(1e-8)
        self.sim.add_testbench(self._collect, background=True)

    async def _collect(self, ctx):
        o, bus = self.link.o, self.link.bus
        ctx.set(o.ready, 1)
        buf = bytearray()
        async for _, _, valid, ready, data, keep, last, re, we in ctx.tick().sample(
                o.valid, o.ready, o.p.data, o.p.keep, o.p.last, bus.re, bus.we):
            self.cycle += 1
            self.bus_cycles += bool(re or we)
            if valid and ready:
                for j in range(self.nl):
                    if keep >> j & 1:
                        buf.append(data >> (8 * j) & 0xFF)
                if last:
                    self.out.append((self.cycle, bytes(buf)))
                    buf = bytearray()
            if self.out_stall:
                ctx.set(o.ready, self.rng.random() >= self.out_stall)

    def run(self, body):
        self.sim.add_testbench(body)
        self.sim.run()

    async def send(self, ctx, raw, *, gaps=0.0, err=0):
        """One frame on ``i``; ``err``: on its last beat (a cut-through MAC's bad frame)."""
        i, nl = self.link.i, self.nl
        for k in range(0, len(raw), nl):
            chunk = raw[k:k + nl]
            while gaps and self.rng.random() < gaps:
                ctx.set(i.valid, 0)
                await ctx.tick()
            ctx.set(i.valid, 1)
            ctx.set(i.p.data, int.from_bytes(chunk, "little"))
            ctx.set(i.p.keep, (1 << len(chunk)) - 1)
            ctx.set(i.p.last, k + nl >= len(raw))
            ctx.set(i.p.err, err and k + nl >= len(raw))
            assert ctx.get(i.ready), "the endpoint's input must always be ready"
            await ctx.tick()
        ctx.set(i.valid, 0)
        ctx.set(i.p.err, 0)

    async def replies(self, ctx, n, limit=20000):
        """Wait for ``n`` frames in ``out`` (in all); return them parsed."""
        for _ in range(limit):
            if len(self.out) >= n:
                break
            await ctx.tick()
        assert len(self.out) >= n, f"{len(self.out)} frames out, {n} expected"
        return [parse_reply(raw) for _, raw in self.out[:n]]

    async def reg(self, ctx, name, value=None):
        off = UDPLINK_REGS[name] if isinstance(name, str) else name
        rdata, err = await bus_access(ctx, self.link.regs, Space.REG, REG_UDPLINK + off,
                                      value is not None, value or 0, limit=1)
        assert not err, f"register {name}"
        return rdata

    async def counters(self, ctx):
        return {c: await self.reg(ctx, UDPLINK_COUNTER_BASE + 4 * k)
                for k, c in enumerate(UDPLINK_COUNTERS)}

    async def configure(self, ctx, enable=True):
        await self.reg(ctx, "host_mac_hi", mac_int(HOST_MAC) >> 32)
        await self.reg(ctx, "host_mac_lo", mac_int(HOST_MAC) & 0xFFFFFFFF)
        await self.reg(ctx, "host_ip", ip_int(HOST_IP))
        await self.reg(ctx, "host_port", HOST_PORT)
        await self.reg(ctx, "ctrl", int(enable))

    async def exchange(self, ctx, seq, frames, **kw):
        """Send one request datagram, return its response frames (checked)."""
        n = len(self.out)
        await self.send(ctx, frame(kh(T_REQUEST, seq, b"".join(frames)), **kw))
        (kind, rseq, body), = (await self.replies(ctx, n + 1))[n:]
        assert (kind, rseq) == (T_RESPONSE, seq)
        return split_responses(frames, body)


WIDTHS = [8, 64]


# ---- registers ------------------------------------------------------------------------------

def test_registers_reset_values_and_access():
    b = Bench(8)

    async def body(ctx):
        assert await b.reg(ctx, "id") == UDPLINK_ID
        for name in ("ctrl", "host_mac_hi", "host_mac_lo", "host_ip", "host_port", "expected"):
            assert await b.reg(ctx, name) == 0, name        # disabled at reset
        assert set((await b.counters(ctx)).values()) == {0}
        await b.configure(ctx)
        assert await b.reg(ctx, "host_mac_hi") == 0x0200
        assert await b.reg(ctx, "host_mac_lo") == 0x00000002
        assert await b.reg(ctx, "host_ip") == ip_int(HOST_IP)
        assert await b.reg(ctx, "host_port") == HOST_PORT
        assert await b.reg(ctx, "ctrl") == 1
        for off, we in ((UDPLINK_REGS["id"], 1), (UDPLINK_REGS["expected"], 1),
                        (UDPLINK_COUNTER_BASE, 1), (0x3C, 0), (0x1C, 0)):
            _, err = await bus_access(ctx, b.link.regs, Space.REG, REG_UDPLINK + off, we, 5,
                                      limit=1)
            assert err, f"offset {off:#x} we={we} must be refused"

    b.run(body)


# ---- execution ------------------------------------------------------------------------------

@pytest.mark.parametrize("width", WIDTHS)
def test_several_frames_register_memory_queue_status(width):
    b = Bench(width, out_stall=0.3)
    mem = [0x01020304, 0xA0B0C0D0, 0xFFFFFFFF, 0x00000000]
    bad_crc = bytearray(req(Cmd.WRITE_REG, 0x0C, 1, [0x5555AAAA]))
    bad_crc[-1] ^= 0x01
    frames = [
        req(Cmd.WRITE_REG, 0x08, 1, [0x11111111]),
        req(Cmd.READ_REG, 0x00, 3),
        req(Cmd.WRITE_MEM, 0x10, 4, mem),
        req(Cmd.READ_MEM, 0x10, 4),
        req(Cmd.PUSH, 0, 3, [7, 8, 9]),
        req(Cmd.POP, 0, 5),
        bytes(bad_crc),
        req(Cmd.READ_REG, 0x100, 1),
        req(Cmd.READ_REG, 0x00, MAX_WORDS + 1),        # BAD_COUNT: no data octets follow
        req(0x55, 0x00, 1),                             # BAD_CMD
        req(Cmd.STATUS, 0, 1),
    ]

    async def body(ctx):
        await b.configure(ctx)
        got = await b.exchange(ctx, 0, frames)
        assert got == [
            (Cmd.WRITE_REG, LinkStatus.OK, 1, []),
            (Cmd.READ_REG, LinkStatus.OK, 3, [DEMO_ID, 1, 0x11111111]),
            (Cmd.WRITE_MEM, LinkStatus.OK, 4, []),
            (Cmd.READ_MEM, LinkStatus.OK, 4, mem),
            (Cmd.PUSH, LinkStatus.OK, 3, []),
            (Cmd.POP, LinkStatus.OK, 3, [7, 8, 9]),     # stops early: the queue ran empty
            (Cmd.WRITE_REG, LinkStatus.BAD_CRC, 0, []),
            (Cmd.READ_REG, LinkStatus.BUS_ERROR, 0, []),
            (Cmd.READ_REG, LinkStatus.BAD_COUNT, 0, []),
            (0x55, LinkStatus.BAD_CMD, 0, []),
            # frames taken (CRC, command, count and alignment good; this one included), CRC
            # errors, malformed datagrams, bus errors
            (Cmd.STATUS, LinkStatus.OK, 4, [8, 1, 0, 1]),
        ]
        got = await b.exchange(ctx, 1, [req(Cmd.READ_REG, 0x08, 2), req(Cmd.READ_MEM, 0x14, 2)])
        assert got == [(Cmd.READ_REG, LinkStatus.OK, 2, [0x11111111, 0]),   # CRC-bad: not run
                       (Cmd.READ_MEM, LinkStatus.OK, 2, mem[1:3])]
        c = await b.counters(ctx)
        assert (c["executed"], c["tx_datagrams"], c["frames_ok"], c["crc_errors"],
                c["bus_errors"]) == (2, 2, 10, 1, 1)
        assert await b.reg(ctx, "expected") == 2

    b.run(body)


@pytest.mark.parametrize("width", WIDTHS)
def test_duplicate_resends_kept_response_without_executing(width):
    b = Bench(width)

    async def body(ctx):
        await b.configure(ctx)
        frames = [req(Cmd.PUSH, 0, 1, [0xC0FFEE01]), req(Cmd.READ_REG, 0x00, 1)]
        raw = frame(kh(T_REQUEST, 0, b"".join(frames)))
        await b.send(ctx, raw)
        await b.replies(ctx, 1)
        await b.send(ctx, raw)                          # the host retransmits: seq 0 again
        await b.replies(ctx, 2)
        assert b.out[1][1] == b.out[0][1], "the duplicate must get the same response"
        # A sync between does not disturb the kept response.
        await b.send(ctx, frame(kh(T_SYNC, 0x1234)))
        (kind, seq, value), = (await b.replies(ctx, 3))[2:]
        assert (kind, seq, value) == (T_SYNC_RESPONSE, 0x1234, (1).to_bytes(4, "big"))
        await b.send(ctx, raw)
        await b.replies(ctx, 4)
        assert b.out[3][1] == b.out[0][1]
        # The push ran once: the queue holds one word.
        got = await b.exchange(ctx, 1, [req(Cmd.POP, 0, 4)])
        assert got == [(Cmd.POP, LinkStatus.OK, 1, [0xC0FFEE01])]
        c = await b.counters(ctx)
        assert (c["executed"], c["duplicate"], c["sync"], c["frames_ok"]) == (2, 2, 1, 3)

    b.run(body)


def test_duplicate_recognised_across_the_sequence_wrap():
    """The retransmission of seq 0xFFFFFFFF, after it ran and ``expected`` wrapped to 0, gets
    the kept response (the sequence numbers count modulo 2**32)."""
    b = Bench(8)

    async def body(ctx):
        await b.configure(ctx)
        # 2**32 datagrams would take hours to simulate: start the count just below the wrap.
        ctx.set(b.link.expected, 0xFFFFFFFF)
        raw = frame(kh(T_REQUEST, 0xFFFFFFFF, req(Cmd.PUSH, 0, 1, [0xA11CE])))
        await b.send(ctx, raw)
        await b.replies(ctx, 1)
        assert await b.reg(ctx, "expected") == 0
        await b.send(ctx, raw)
        await b.replies(ctx, 2)
        assert b.out[1][1] == b.out[0][1], "the duplicate must get the kept response"
        c = await b.counters(ctx)
        assert (c["executed"], c["duplicate"], c["bad_seq"]) == (1, 1, 0)
        got = await b.exchange(ctx, 0, [req(Cmd.POP, 0, 4)])
        assert got == [(Cmd.POP, LinkStatus.OK, 1, [0xA11CE])]     # the push ran once

    b.run(body)


@pytest.mark.parametrize("width", WIDTHS)
def test_sync_answers_expected_and_executes_nothing(width):
    b = Bench(width)

    async def body(ctx):
        await b.configure(ctx)
        await b.send(ctx, frame(kh(T_SYNC, 0xDEADBEEF), pad=False))    # 50 octets, no padding
        assert await b.replies(ctx, 1) == [(T_SYNC_RESPONSE, 0xDEADBEEF, bytes(4))]
        assert len(b.out[0][1]) == 14 + 20 + 8 + 12
        for seq in range(3):
            await b.exchange(ctx, seq, [req(Cmd.WRITE_REG, 0x08, 1, [seq])])
        await b.send(ctx, frame(kh(T_SYNC, 7)))
        assert (await b.replies(ctx, 5))[4] == (T_SYNC_RESPONSE, 7, (3).to_bytes(4, "big"))
        c = await b.counters(ctx)
        assert (c["sync"], c["executed"], c["frames_ok"]) == (2, 3, 3)

    b.run(body)


@pytest.mark.parametrize("width", WIDTHS)
def test_frame_the_mac_found_bad_runs_nothing(width):
    """A request datagram whose frame ends with ``err`` (the cut-through MAC's verdict: bad FCS)
    executes nothing, is answered by nothing and moves none of the link's counters (the MAC
    counts it); the same request then runs once, as the sequence number it carries."""
    b = Bench(width)

    async def body(ctx):
        await b.configure(ctx)
        before = await b.counters(ctx)
        await b.send(ctx, frame(kh(T_REQUEST, 0, req(Cmd.WRITE_REG, 0x08, 1, [0x5EED]))),
                     err=1)
        await ctx.tick().repeat(200)
        assert b.out == [] and await b.counters(ctx) == before
        (r,) = await b.exchange(ctx, 0, [req(Cmd.WRITE_REG, 0x08, 1, [0x5EED])])
        assert r[1] == LinkStatus.OK
        c = await b.counters(ctx)
        assert (c["executed"], c["frames_ok"]) == (1, 1)

    b.run(body)


# ---- rejections -----------------------------------------------------------------------------

MARK = 0xBAD0BAD0


def rejections(expected):
    """``(name, frame, counter)``: datagrams that must be dropped (counter + 1, nothing run,
    nothing sent) while the endpoint expects seq ``expected``. Each would write MARK into
    scratch register 0x08 and push to queue 0."""
    frames = [req(Cmd.WRITE_REG, 0x08, 1, [MARK]), req(Cmd.PUSH, 0, 1, [MARK])]
    body = b"".join(frames)
    ok = kh(T_REQUEST, expected, body)
    good = frame(ok)
    long_read = kh(T_REQUEST, expected, body + req(Cmd.READ_MEM, 0, MAX_WORDS) * 40)
    return [
        ("wrong source MAC", frame(ok, src_mac="02:00:00:00:00:03"), "bad_src"),
        ("wrong source IP", frame(ok, src_ip="10.0.0.3"), "bad_src"),
        ("wrong source UDP port", frame(ok, sport=HOST_PORT + 1), "bad_src"),
        ("seq ahead by 2", frame(kh(T_REQUEST, expected + 2, body)), "bad_seq"),
        ("seq behind by 2", frame(kh(T_REQUEST, expected - 2, body)), "bad_seq"),
        ("bad UDP checksum", frame(ok, udp_chksum=good_udp_chksum(good) ^ 0x0100), "bad_csum"),
        ("zero UDP checksum", frame(ok, udp_chksum=0), "bad_csum"),
        ("bad IPv4 checksum", frame(ok, ip_chksum=0x1234), "bad_csum"),
        ("payload bit flipped", good[:60] + bytes([good[60] ^ 0x10]) + good[61:], "bad_csum"),
        ("bad magic", frame(kh(T_REQUEST, expected, body, magic=b"KI")), "malformed"),
        ("bad version", frame(kh(T_REQUEST, expected, body, version=2)), "malformed"),
        ("response type", frame(kh(T_RESPONSE, expected, body)), "malformed"),
        ("type 7", frame(kh(7, expected, body)), "malformed"),
        ("frame truncated on the wire", good[:-6], "malformed"),
        ("last host-link frame truncated", frame(kh(T_REQUEST, expected, body[:-3])),
         "malformed"),
        ("frames not back to back", frame(kh(T_REQUEST, expected, frames[0] + b"\x00"
                                             + frames[1])), "malformed"),
        ("empty request", frame(kh(T_REQUEST, expected)), "malformed"),
        ("sync with a body", frame(kh(T_SYNC, expected, body)), "malformed"),
        ("IPv4 length != UDP length + 20", frame(ok, ip_len=20 + 8 + len(ok) + 2), "malformed"),
        ("longest response > 1472 octets", frame(long_read), "malformed"),
        ("other UDP port", frame(ok, dport=HOSTLINK_UDP_PORT + 1), "ignored"),
        ("other destination MAC", frame(ok, dst_mac="02:00:00:00:00:09"), "ignored"),
        ("other destination IP", frame(ok, dst_ip="10.0.0.9"), "ignored"),
        ("not IPv4", bytes(Ether(src=HOST_MAC, dst=TGT_MAC, type=0x86DD) / Raw(ok)).ljust(60,
                                                                                    b"\0"),
         "ignored"),
        ("runt", good[:30], "ignored"),
        ("link disabled", good, "disabled"),
    ]


@pytest.mark.parametrize("width", WIDTHS)
def test_rejections_count_and_run_nothing(width):
    b = Bench(width)

    async def body(ctx):
        await b.configure(ctx)
        for seq in range(2):        # expected = 2, a response kept
            await b.exchange(ctx, seq, [req(Cmd.WRITE_REG, 0x08, 1, [seq])])
        failures = []
        for name, raw, counter in rejections(2):
            if counter == "disabled":
                await b.reg(ctx, "ctrl", 0)
            before, n_out, bus = await b.counters(ctx), len(b.out), b.bus_cycles
            await b.send(ctx, raw, gaps=0.2)
            for _ in range(3000 // b.nl):
                await ctx.tick()
            after = await b.counters(ctx)
            moved = {c: after[c] - before[c] for c in after if after[c] != before[c]}
            if moved != {counter: 1}:
                failures.append(f"{name}: counters moved {moved}, expected {counter} + 1")
            if len(b.out) != n_out:
                failures.append(f"{name}: {len(b.out) - n_out} frames sent")
            if b.bus_cycles != bus or ctx.get(b.top.target.scratch[0]) == MARK:
                failures.append(f"{name}: executed")
            if await b.reg(ctx, "expected") != 2:
                failures.append(f"{name}: expected moved")
            if counter == "disabled":
                await b.reg(ctx, "ctrl", 1)
        assert not failures, "\n".join(failures)
        # Still working; nothing was pushed. A long response: at most 37 + 9 + 38 * 37 = 1452
        # octets of frames (+ 8 = 1460 <= 1472; "longest response" above had 1490 + 8).
        frames = ([req(Cmd.POP, 0, MAX_WORDS), req(Cmd.READ_REG, 0x08, 1)]
                  + [req(Cmd.READ_MEM, 0, MAX_WORDS)] * 38)
        got = await b.exchange(ctx, 2, frames)
        assert got[:2] == [(Cmd.POP, LinkStatus.OK, 0, []), (Cmd.READ_REG, LinkStatus.OK, 1, [1])]
        assert all(g[:3] == (Cmd.READ_MEM, LinkStatus.OK, MAX_WORDS) for g in got[2:])
        assert len(b.out[-1][1]) == 42 + 8 + 5 + 9 + 38 * (5 + 4 * MAX_WORDS)

    b.run(body)


@pytest.mark.parametrize("width", WIDTHS)
def test_udp_checksum_zero_is_absent_and_ffff_is_zero(width):
    b = Bench(width)
    payload, word = write_whose_udp_checksum_is_zero(0)
    sent = frame(payload)
    assert good_udp_chksum(sent) == 0xFFFF                  # scapy's own choice

    async def body(ctx):
        await b.configure(ctx)
        await b.send(ctx, frame(payload, udp_chksum=0))
        for _ in range(400):
            await ctx.tick()
        c = await b.counters(ctx)
        assert (c["bad_csum"], c["executed"], b.out, b.bus_cycles) == (1, 0, [], 0)
        await b.send(ctx, sent)
        assert (await b.replies(ctx, 1))[0][:2] == (T_RESPONSE, 0)
        assert ctx.get(b.top.target.scratch[1]) == word

    b.run(body)


# ---- random traffic against an oracle -------------------------------------------------------

def oracle_rules(raw, enabled=True):
    """Rules 1-7 of hw/target/udplink.py's docstring for one Ethernet frame, read off the raw
    octets, with scapy's RFC 1071 checksum (``scapy.utils.checksum``: 0 over a correct header
    or pseudo-header + segment): the counter of a dropped frame, else ``(kind, seq, body)``."""
    b16 = lambda o: int.from_bytes(o, "big")                        # noqa: E731
    if (len(raw) < 42 or raw[:6] != bytes.fromhex(TGT_MAC.replace(":", ""))
            or raw[12:15] != b"\x08\x00\x45" or raw[20] & 0x3F or raw[21] or raw[23] != 17
            or b16(raw[30:34]) != ip_int(TGT_IP) or b16(raw[36:38]) != HOSTLINK_UDP_PORT):
        return "ignored"
    if not enabled:
        return "disabled"
    if (raw[6:12] != bytes.fromhex(HOST_MAC.replace(":", "")) or b16(raw[26:30]) != ip_int(HOST_IP)
            or b16(raw[34:36]) != HOST_PORT):
        return "bad_src"
    if checksum(raw[14:34]):
        return "bad_csum"
    ulen = b16(raw[38:40])
    if b16(raw[16:18]) != ulen + 20 or not 16 <= ulen <= 1480 or len(raw) < 34 + ulen:
        return "malformed"
    seg = raw[34:34 + ulen]
    if seg[6:8] == b"\0\0" or checksum(raw[26:34] + bytes([0, 17]) + seg[4:6] + seg):
        return "bad_csum"
    p = seg[8:]
    if p[:3] != b"KH\x01" or not ((p[3] == T_REQUEST and len(p) > 8)
                                  or (p[3] == T_SYNC and len(p) == 8)):
        return "malformed"
    body, pos, longest = p[8:], 0, 0
    known = {c.value for c in Cmd}
    while pos < len(body):
        if body[pos] != 0xA5 or pos + 8 > len(body):
            return "malformed"
        cmd, count = body[pos + 1], body[pos + 6]
        accepted = cmd in known and 1 <= count <= MAX_WORDS
        status = cmd == Cmd.STATUS.value
        pos += 8 + (4 * count if cmd & 1 and accepted and not status else 0)
        longest += 5 + 4 * (4 if status else count if accepted and not cmd & 1 else 0)
    if pos != len(body) or longest > 1464:
        return "malformed"
    return (p[3], b16(p[4:8]), body)


class ExecModel:
    """The executor's seq rules (9) and the demo target's scratch registers and memory, for the
    request frames :func:`random_frames` makes; counters as the endpoint's."""

    def __init__(self):
        self.expected, self.kept = 0, None
        self.mem, self.scratch = [0] * 64, [0] * 4
        self.counters = dict.fromkeys(UDPLINK_COUNTERS, 0)
        self.responses = []             # (type, seq, body) in order

    def frame(self, f):
        cmd, addr, count = f[1], int.from_bytes(f[2:6], "big"), f[6]
        words = list(struct.unpack(f">{(len(f) - 8) // 4}I", f[7:-1]))

        def answer(status, done=0, data=()):
            body = bytes([cmd, status.value, done]) + b"".join(struct.pack(">I", d) for d in data)
            return bytes([0x5A]) + body + bytes([CRC.compute(body)])
        if CRC.compute(f[1:-1]) != f[-1]:
            self.counters["crc_errors"] += 1
            return answer(LinkStatus.BAD_CRC)
        if cmd not in {c.value for c in Cmd}:
            return answer(LinkStatus.BAD_CMD)
        if not 1 <= count <= MAX_WORDS:
            return answer(LinkStatus.BAD_COUNT)
        self.counters["frames_ok"] += 1
        k = addr // 4
        if cmd == Cmd.WRITE_MEM.value:
            self.mem[k:k + count] = words
        elif cmd == Cmd.READ_MEM.value:
            return answer(LinkStatus.OK, count, self.mem[k:k + count])
        elif cmd == Cmd.WRITE_REG.value:
            self.scratch[k - 2] = words[0]
        else:
            return answer(LinkStatus.OK, 1, [DEMO_ID if addr == 0 else self.scratch[k - 2]])
        return answer(LinkStatus.OK, count)

    def datagram(self, raw, enabled=True):
        got = oracle_rules(raw, enabled)
        if isinstance(got, str):
            self.counters[got] += 1
            return got
        kind, seq, body = got
        c = self.counters
        if kind == T_SYNC:
            c["sync"] += 1
            self.responses.append((T_SYNC_RESPONSE, seq, self.expected.to_bytes(4, "big")))
        elif seq == self.expected:
            c["executed"] += 1
            frames, pos = [], 0
            while pos < len(body):
                n = 8 + (4 * body[pos + 6] if body[pos + 1] & 1 else 0)
                frames.append(body[pos:pos + n])
                pos += n
            self.kept = (seq, b"".join(self.frame(f) for f in frames))
            self.responses.append((T_RESPONSE,) + self.kept)
            self.expected = (self.expected + 1) & 0xFFFFFFFF
        elif self.kept and seq == (self.expected - 1) & 0xFFFFFFFF:
            c["duplicate"] += 1
            self.responses.append((T_RESPONSE,) + self.kept)
        else:
            c["bad_seq"] += 1
            return "bad_seq"
        c["tx_datagrams"] += 1
        return "answered"


def random_frames(rng):
    """Request frames on scratch registers and memory (every frame good but, now and then,
    one with a bad CRC), from 8 octets to a body of about 1,400; or reads whose longest
    responses just fit or just do not."""
    if rng.random() < 0.05:         # the longest responses fill 1,443 octets, then 1,480
        return [req(Cmd.READ_MEM, 0, MAX_WORDS)] * rng.choice([39, 40])
    frames = []
    for _ in range(rng.choice([1, 1, 2, 3, 5, 8, 36])):
        c = rng.randint(1, MAX_WORDS)
        a = 4 * rng.randrange(64 - c + 1)
        f = rng.choice([
            lambda: req(Cmd.WRITE_MEM, a, c, [rng.getrandbits(32) for _ in range(c)]),
            lambda: req(Cmd.READ_MEM, a, c),
            lambda: req(Cmd.WRITE_REG, 0x08 + 4 * rng.randrange(4), 1, [rng.getrandbits(32)]),
            lambda: req(Cmd.READ_REG, rng.choice([0, 0x08, 0x0C, 0x10, 0x14]), 1)])()
        if rng.random() < 0.05:
            f = f[:-1] + bytes([f[-1] ^ 0x40])
        frames.append(f)
    return frames


def random_datagram(rng, model):
    """A frame to the endpoint: a request (seq expected, the one before, or another), a sync,
    or one of them damaged: octets added to, cut from or lost inside the body (odd lengths
    too), a bit flipped anywhere, the frame cut short, padded or with octets after the UDP
    datagram, wrong addresses, lengths or checksums."""
    exp = model.expected
    seq = rng.choice([exp] * 6 + [(exp - 1) & 0xFFFFFFFF, rng.getrandbits(32)])
    body = b"".join(random_frames(rng))
    r = rng.random()
    if r < 0.04:
        body += bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 3)))
    elif r < 0.08:
        body = body[:rng.randrange(1, len(body))]               # the last frame cut short
    elif r < 0.10:
        k = rng.randrange(len(body))
        body = body[:k] + body[k + rng.randint(1, 2):]          # octets lost inside
    payload = kh(T_REQUEST, seq, body)
    if rng.random() < 0.12:
        payload = kh(T_SYNC, rng.getrandbits(32))
    kw = {}
    r = rng.random()
    if r < 0.03:
        payload += bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 3)))   # a sync too
    elif r < 0.12:
        kw = rng.choice([dict(src_mac="02:00:00:00:00:03"), dict(dst_ip="10.0.0.7"),
                         dict(sport=HOST_PORT ^ 1), dict(dport=HOSTLINK_UDP_PORT ^ 0x100),
                         dict(udp_chksum=0), dict(ip_chksum=0x1234),
                         dict(ip_len=20 + 8 + len(payload) + 2)])
    raw = frame(payload, pad=rng.random() < 0.8, **kw)
    r = rng.random()
    if r < 0.12:
        k = rng.randrange(len(raw))
        raw = raw[:k] + bytes([raw[k] ^ (1 << rng.randrange(8))]) + raw[k + 1:]
    elif r < 0.17:
        raw = raw[:rng.choice([len(raw) - 1, rng.randrange(1, len(raw))])]
    elif r < 0.22:
        raw += bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 40)))
    return raw


@pytest.mark.parametrize("width", [8, 16, 32, 64])
def test_random_datagrams_back_to_back_against_an_oracle(width):
    """Bursts of frames back to back (no idle beat between them, or a few idle beats inside
    them), each judged by :func:`oracle_rules` and :class:`ExecModel`: the counters after
    every burst and every response datagram (bytes checked by scapy) as the oracle says."""
    b = Bench(width)
    rng = random.Random(23 + width)
    model = ExecModel()
    store_beats = b.link.rx_depth or 2 * -(-(2 + 1472) // b.nl)

    async def body(ctx):
        await b.configure(ctx)
        sent, outcomes = 0, collections.Counter()
        while sent < 90:
            burst, beats = [], 0
            while len(burst) < 8:
                raw = random_datagram(rng, model)
                beats += len(raw) // b.nl + 2
                if burst and beats > store_beats // 2:   # never an overrun
                    break
                outcomes[model.datagram(raw)] += 1
                burst.append(raw)
            gaps = rng.choice([0.0, 0.0, 0.1])
            for raw in burst:
                await b.send(ctx, raw, gaps=gaps)
            sent += len(burst)
            await b.replies(ctx, len(model.responses), limit=100000)
            for _ in range(200):                  # a datagram still draining: bad_seq
                got = await b.counters(ctx)
                if got == model.counters:
                    break
                for _ in range(20):
                    await ctx.tick()
            assert got == model.counters, f"after {sent} frames"
        assert [parse_reply(raw) for _, raw in b.out] == model.responses
        # Every rule and outcome was exercised.
        assert set(outcomes) >= {"ignored", "bad_src", "bad_csum", "malformed", "bad_seq",
                                 "answered"}, outcomes
        assert model.counters["duplicate"] and model.counters["sync"]

    b.run(body)


@pytest.mark.parametrize("width", [8, 16, 32, 64])
def test_frame_ending_before_octet_42_is_ignored(width):
    """Rule 1: a frame shorter than its headers (Ethernet, IPv4, UDP: 42 octets) is ignored,
    whatever its first 41 octets say, and the frame after it is unaffected."""
    b = Bench(width)
    good = frame(kh(T_SYNC, 5))

    async def body(ctx):
        await b.configure(ctx)
        for n in (14, 34, 38, 40, 41):
            await b.send(ctx, good[:n])
        await b.send(ctx, good)
        assert await b.replies(ctx, 1) == [(T_SYNC_RESPONSE, 5, bytes(4))]
        c = await b.counters(ctx)
        assert {k: v for k, v in c.items() if v} == {"ignored": 5, "sync": 1,
                                                      "tx_datagrams": 1}

    b.run(body)


# ---- throughput -----------------------------------------------------------------------------

@pytest.mark.parametrize("width", WIDTHS)
def test_throughput_register_writes(width, capsys):
    b = Bench(width)
    results = {}

    async def body(ctx):
        await b.configure(ctx)
        seq = 0
        for n in (1, 100):
            frames = [req(Cmd.WRITE_REG, 0x08 + 4 * (k % 4), 1, [k]) for k in range(n)]
            raws = [frame(kh(T_REQUEST, seq + d, b"".join(frames))) for d in range(4)]
            seq += len(raws)
            # Latency of one datagram: first beat in to last beat out.
            start, done = b.cycle, len(b.out)
            await b.send(ctx, raws[0])
            await b.replies(ctx, done + 1, limit=50000)
            latency = b.out[done][0] - start
            # Back to back: the next datagram goes in as soon as one is answered, two stay
            # in flight (the store holds two of the largest); cycles between answers.
            first = len(b.out)
            await b.send(ctx, raws[1])
            for k, raw in enumerate(raws[2:]):
                await b.send(ctx, raw)
                await b.replies(ctx, first + k + 1, limit=50000)
            await b.replies(ctx, first + 3, limit=50000)
            ends = [c for c, _ in b.out[first:first + 3]]
            results[n] = (latency, (ends[-1] - ends[0]) / 2, len(raws[0]))
        c = await b.counters(ctx)
        assert (c["executed"], c["overrun"]) == (8, 0)

    b.run(body)
    with capsys.disabled():
        for n, (latency, per, octets) in results.items():
            print(f"\nUDP host link width {width}: {n} register writes per datagram "
                  f"({octets}-octet frame): latency {latency} cycles, back to back "
                  f"{per:.0f} cycles per datagram ({per / n:.1f} per write)")
    latency, per, _ = results[100]
    assert per < 100 * 30, "one register write should cost well under 30 cycles"


# ---- the host side against the gateware -----------------------------------------------------

def test_host_udplink_against_gateware():
    b = Bench(64)
    pending = []

    async def feeder(ctx):
        while True:
            if pending:
                await b.send(ctx, pending.pop(0))
            else:
                await ctx.tick()

    async def setup(ctx):
        await b.configure(ctx)

    b.sim.add_testbench(feeder, background=True)
    b.sim.add_testbench(setup)
    now = [0.0]
    b.sim.run_until(now[0] + 1e-6)
    now[0] += 1e-6
    seen = [0]

    def send(payload):
        pending.append(frame(payload))

    def recv(timeout):
        for _ in range(200):
            if len(b.out) > seen[0]:
                raw = b.out[seen[0]][1]
                seen[0] += 1
                return bytes(Ether(raw)[UDP].payload)
            now[0] += 100e-8
            b.sim.run_until(now[0])
        return None

    link = UdpLink((send, recv), max_words=MAX_WORDS, seed=3, timeout=1.0, retries=1)
    assert link.read_reg(0x00) == DEMO_ID
    link.write_reg(0x10, 0x12345678)
    assert link.read_reg(0x10) == 0x12345678
    data = bytes(range(4 * 40))
    link.write_mem(0x20, data)
    assert link.read_mem(0x20, len(data)) == data
    batch = link.batch()
    for k in range(60):
        batch.write_reg(0x08 + 4 * (k % 4), k)
    batch.run()
    assert [link.read_reg(0x08 + 4 * k) for k in range(4)] == [56, 57, 58, 59]
    assert link.stats["retransmits"] == 0


# ---- inside the target ----------------------------------------------------------------------

def test_in_kbtp_target_next_to_the_host_port():
    """KbtpTarget (width 64, MAC outside): the endpoint taps ``rx``, answers on ``tx`` and
    reaches the target's registers and memory while the ``host`` port (the UART link) is used
    too; disabled until the host port has configured it."""
    dut = KbtpTarget(64, n_qp=1, n_mr=1, mem_words=1024, mac=False, engine=False,
                     own_mac=mac_int(TGT_MAC), own_ip=ip_int(TGT_IP), udp_link=True)
    sim = Simulator(dut)
    sim.add_clock(1e-8)
    out = []

    async def collect(ctx):
        ctx.set(dut.tx.ready, 1)
        buf = bytearray()
        async for _, _, valid, data, keep, last in ctx.tick().sample(
                dut.tx.valid, dut.tx.p.data, dut.tx.p.keep, dut.tx.p.last):
            if valid:
                buf += bytes(b for j, b in enumerate(data.to_bytes(8, "little")) if keep >> j & 1)
                if last:
                    out.append(bytes(buf))
                    buf = bytearray()

    async def send(ctx, raw):
        i = dut.rx
        for k in range(0, len(raw), 8):
            chunk = raw[k:k + 8]
            ctx.set(i.valid, 1)
            ctx.set(i.p.data, int.from_bytes(chunk, "little"))
            ctx.set(i.p.keep, (1 << len(chunk)) - 1)
            ctx.set(i.p.last, k + 8 >= len(raw))
            await ctx.tick()
            while not ctx.get(i.ready):
                await ctx.tick()
        ctx.set(i.valid, 0)

    async def host(ctx, off, value=None):
        rdata, err = await bus_access(ctx, dut.host, Space.REG, REG_UDPLINK + off,
                                      value is not None, value or 0)
        assert not err
        return rdata

    frames = [req(Cmd.READ_REG, 0, 1), req(Cmd.WRITE_MEM, 0x40, 2, [5, 6]),
              req(Cmd.READ_MEM, 0x40, 2), req(Cmd.READ_REG, REG_UDPLINK + 0x18, 1)]
    raw = frame(kh(T_REQUEST, 0, b"".join(frames)))

    async def body(ctx):
        await send(ctx, raw)                    # disabled at reset: dropped
        for _ in range(300):
            await ctx.tick()
        assert out == []
        assert await host(ctx, UDPLINK_COUNTER_BASE + 4 * UDPLINK_COUNTERS.index("disabled")) == 1
        for name, value in (("host_mac_hi", mac_int(HOST_MAC) >> 32),
                            ("host_mac_lo", mac_int(HOST_MAC) & 0xFFFFFFFF),
                            ("host_ip", ip_int(HOST_IP)), ("host_port", HOST_PORT), ("ctrl", 1)):
            await host(ctx, UDPLINK_REGS[name], value)
        await send(ctx, raw)
        # The host port meanwhile (the arbiter takes one access at a time).
        for _ in range(20):
            rdata, err = await bus_access(ctx, dut.host, Space.REG, 0, 0)
            assert (rdata, err) == (TARGET_ID, 0)
        for _ in range(3000):
            if out:
                break
            await ctx.tick()
        kind, seq, rbody = parse_reply(out[0])
        assert (kind, seq) == (T_RESPONSE, 0)
        assert split_responses(frames, rbody) == [
            (Cmd.READ_REG, LinkStatus.OK, 1, [TARGET_ID]),
            (Cmd.WRITE_MEM, LinkStatus.OK, 2, []),
            (Cmd.READ_MEM, LinkStatus.OK, 2, [5, 6]),
            (Cmd.READ_REG, LinkStatus.OK, 1, [0])]        # ``expected`` before it advanced
        rdata, err = await bus_access(ctx, dut.host, Space.MEM, 0x44, 0)
        assert (rdata, err) == (6, 0)
        assert await host(ctx, UDPLINK_REGS["expected"]) == 1

    sim.add_testbench(collect, background=True)
    sim.add_testbench(body)
    sim.run()


# ---- two masters ----------------------------------------------------------------------------

def test_arbiter_two_masters_interleaved():
    class ArbTop(Elaboratable):
        def __init__(self):
            self.arb = HostBusArbiter(2)
            self.target = HostBusDemoTarget(mem_words=16)

        def elaborate(self, platform):
            m = Module()
            m.submodules.arb, m.submodules.target = self.arb, self.target
            wiring.connect(m, self.arb.target, self.target.bus)
            return m

    top = ArbTop()
    sim = Simulator(top)
    sim.add_clock(1e-8)
    got = {0: [], 1: []}

    def master(k):
        async def bench(ctx):
            bus = top.arb.masters[k]
            for n in range(6):
                addr = 4 * (2 * n + k)                  # memory words, interleaved
                await bus_access(ctx, bus, Space.MEM, addr, 1, 0x100 * k + n)
                rdata, err = await bus_access(ctx, bus, Space.MEM, addr, 0)
                got[k].append((rdata, err))
                _, err = await bus_access(ctx, bus, Space.REG, 0x08 + 4 * k, 1, n)
                assert not err
        return bench

    sim.add_testbench(master(0))
    sim.add_testbench(master(1))
    sim.run()
    for k in (0, 1):
        assert got[k] == [(0x100 * k + n, 0) for n in range(6)]

# Ref: issue 23 (the UDP host-link wire format, the target's rules); host/udplink.py;
#      host/link.py (the frame API it shares with UartLink); tests/host/udp_target.py (the
#      reference endpoint); host/cli.py (``kbtp driver --link udp``).
"""The UDP host link against the Python reference of the target's endpoint.

A small bus behind the endpoint (registers, memory, a loop-back queue) checks the link API;
the endpoint's rules are checked by injecting datagrams (wrong seq, wrong source, missing or
wrong checksum, malformed); the host's by injecting responses (stale, corrupted, malformed).
The driver over this link is in tests/host/test_driver_batch.py.
"""

import json
import socket
import struct
import threading
from collections import deque

import pytest

from host import cli
from host.link import LinkError, LinkStatusError, LinkTimeout, Request, crc8
from host.port import HostError, TargetPort, link_access
from host.udplink import (HOSTLINK_UDP_PORT, MAX_PAYLOAD, T_REQUEST, T_RESPONSE, T_SYNC,
                          CallableTransport, SocketTransport, UdpLink, pack_header)
from hw.iface import Space
from hw.target.hostlink import Cmd, LinkStatus
from tests.host.test_driver_uart import PyBridge
from tests.host.udp_target import (HOST, TARGET, SimNet, UdpHostLinkEndpoint, parse_udp_frame,
                                   udp_frame)

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


class Bus:
    """Registers 0x00..0xFC (0x00 read-only: 0x4B425450), 1 KiB of memory, queue 0 a loop-back
    FIFO of ``depth`` words; everything else refused."""

    def __init__(self, depth=8):
        self.regs = {0: 0x4B425450}
        self.mem = bytearray(1024)
        self.fifo = deque()
        self.depth = depth
        self.accesses = 0

    async def __call__(self, space, addr, we, wdata):
        self.accesses += 1
        space = Space(space)
        if space is Space.REG:
            if addr >= 0x100 or (we and addr == 0):
                return 0, 1
            if we:
                self.regs[addr] = wdata
            return self.regs.get(addr, 0), 0
        if space is Space.MEM:
            if addr + 4 > len(self.mem):
                return 0, 1
            if we:
                self.mem[addr:addr + 4] = wdata.to_bytes(4, "little")
            return int.from_bytes(self.mem[addr:addr + 4], "little"), 0
        if addr != 0:
            return 0, 1
        if we:
            if len(self.fifo) >= self.depth:
                return 0, 1
            self.fifo.append(wdata)
            return 0, 0
        return (self.fifo.popleft(), 0) if self.fifo else (0, 1)


def rig(seed=1, expected=100, max_words=64, link_kw=None, **net):
    bus = Bus()
    ep = UdpHostLinkEndpoint(PyBridge(bus, max_words), max_words=max_words, expected=expected)
    sim = SimNet(ep, seed=seed, **net)
    link = UdpLink(sim.transport(), max_words=max_words, seed=seed, **(link_kw or {}))
    return bus, ep, sim, link


def host_frame(payload, **over):
    """A datagram from the host (``over`` replaces addresses / checksum)."""
    a = dict(src_mac=HOST["mac"], dst_mac=TARGET["mac"], src_ip=HOST["ip"], dst_ip=TARGET["ip"],
             sport=HOST["port"], dport=HOSTLINK_UDP_PORT, checksum=True)
    a.update(over)
    return udp_frame(a["src_mac"], a["dst_mac"], a["src_ip"], a["dst_ip"], a["sport"],
                     a["dport"], payload, a["checksum"])


def request(seq, *frames):
    from host.link import encode_request
    return pack_header(T_REQUEST, seq) + b"".join(encode_request(*f) for f in frames)


# --------------------------------------------------------------------------------------------
# The link API
# --------------------------------------------------------------------------------------------

def test_api_round_trips_and_errors():
    bus, ep, sim, link = rig()
    assert link.read_reg(0) == 0x4B425450
    assert link.expected == 101 and ep.counters["sync"] == 1      # synced on first use
    link.write_reg(0x08, 0xCAFEF00D)
    assert link.read_reg(0x08) == 0xCAFEF00D
    data = bytes(range(256)) * 3
    link.write_mem(0x40, data)                                      # 12 frames of 64 words
    assert link.read_mem(0x40, len(data)) == data
    assert bus.mem[0x40:0x44] == bytes([3, 2, 1, 0])                # link words big-endian
    link.push(0, [1, 2, 3])
    assert link.pop(0, 8) == [1, 2, 3] and link.pop(0, 2) == []
    with pytest.raises(LinkStatusError, match="QUEUE_FULL") as exc:
        link.push(0, list(range(10)))
    assert exc.value.done == 8 and link.pop(0, 10) == list(range(8))
    with pytest.raises(LinkStatusError, match=r"read_reg\(0x100\).*BUS_ERROR"):
        link.read_reg(0x100)
    with pytest.raises(LinkStatusError, match="BUS_ERROR") as exc:
        link.read_mem(1024 - 8, 16)
    assert exc.value.done == 2 and len(exc.value.data) == 8
    st = link.status()
    assert st["bus_errors"] == 3 and st["crc_errors"] == 0
    assert ep.counters["executed"] == link.stats["exchanges"]


def test_batch_fills_datagrams_both_ways():
    """300 one-word writes (12-octet requests, 122 to a datagram) and 12 reads of 64 words
    (261-octet responses, 5 to a datagram): 5 datagrams, none over 1472 octets either way."""
    bus, ep, sim, link = rig()
    link.read_reg(0)
    out, back = [], []
    link.transport = CallableTransport(lambda p: (out.append(len(p)), sim.send(p)),
                                       lambda t: (lambda d: (d and back.append(len(d)), d)[1])(
                                           sim.recv(t)))
    bus.mem[:] = bytes(range(256)) * 4
    b = link.batch()
    for k in range(300):
        b.write_reg(0x10, k)
    last = b.read_reg(0x10)
    for _ in range(3):
        b.read_mem(0, 1024)
    res = b.run()
    assert res[last] == 299 and res[-1] == bytes(_swap_words(bus.mem))
    assert max(out + back) <= MAX_PAYLOAD and len(out) == len(back) == 5
    assert out[:2] == [MAX_PAYLOAD] * 2 and link.stats["frames"] == 1 + 301 + 12


def _swap_words(b):
    return b"".join(b[k:k + 4][::-1] for k in range(0, len(b), 4))


def test_pop_frames_of_one_operation_are_all_kept():
    """On UDP every frame of a datagram runs: a pop split into frames keeps the words that a
    later frame found (the UART stops at a short frame)."""
    bus, ep, sim, link = rig(max_words=4)
    link.push(0, [1, 2, 3, 4, 5, 6])
    assert link.pop(0, 12) == [1, 2, 3, 4, 5, 6]


# --------------------------------------------------------------------------------------------
# Reliability: loss, corruption, duplicates, reordering
# --------------------------------------------------------------------------------------------

def test_lossy_network_is_transparent():
    bus, ep, sim, link = rig(seed=4, loss=0.1, corrupt=0.1, dup=0.1, reorder=0.1)
    ref = {}
    for k in range(300):
        a = 0x04 + 4 * (k % 16)
        link.write_reg(a, k)
        ref[a] = k
        if k % 7 == 0:
            b = link.batch()
            for x in sorted(ref):
                b.read_reg(x)
            assert b.run() == [ref[x] for x in sorted(ref)]
    assert link.stats["retransmits"] and link.stats["stale"] and not link.stats["timeouts"]
    c = ep.counters
    assert c["duplicate"] and c["bad_csum"] and sim.stats["reordered"]
    # exactly-once: every request datagram the host saw answered ran once
    assert c["executed"] == link.stats["exchanges"]


def test_target_rules_on_injected_datagrams():
    bus, ep, sim, link = rig(expected=0xFFFFFFFF)
    link.write_reg(0x10, 1)
    assert link.expected == 0                   # wrapped
    e = ep.counters
    w = (Cmd.WRITE_REG, 0x10, 1, (99).to_bytes(4, "big"))
    cases = [
        (host_frame(request(5, w)), "bad_seq"),                             # ahead
        (host_frame(request(0xFFFFFFFE, w)), "bad_seq"),                    # expected - 2
        (host_frame(request(0, w), src_mac="02:00:00:00:00:09"), "bad_src"),
        (host_frame(request(0, w), src_ip="10.0.0.9"), "bad_src"),
        (host_frame(request(0, w), sport=HOST["port"] + 1), "bad_src"),
        (host_frame(request(0, w), checksum=False), "bad_csum"),
        (host_frame(request(0, w)[:-1]), "malformed"),                      # last frame cut
        (host_frame(b"KH\x02\x00" + bytes(4)), "malformed"),                 # version 2
        (host_frame(pack_header(T_RESPONSE, 0)), "malformed"),
        (host_frame(request(0, w), dport=HOSTLINK_UDP_PORT + 1), "ignored"),
    ]
    bad = bytearray(host_frame(request(0, w)))
    bad[-3] ^= 0x10                             # a data octet: the UDP checksum catches it
    cases.append((bytes(bad), "bad_csum"))
    for frame, counter in cases:
        before = dict(e)
        assert ep.receive_frame(frame) == [], counter
        assert e[counter] == before[counter] + 1, counter
    assert bus.regs[0x10] == 1 and e["executed"] == 1
    # expected - 1: the cached response again, nothing executed
    again = ep.receive_frame(host_frame(request(0xFFFFFFFF, w)))
    assert e["duplicate"] == 1 and bus.regs[0x10] == 1
    assert parse_udp_frame(again[0])["payload"][:8] == pack_header(T_RESPONSE, 0xFFFFFFFF)
    # a sync request executes nothing and names expected
    (r,) = ep.receive_frame(host_frame(pack_header(T_SYNC, 0x1234)))
    assert parse_udp_frame(r)["payload"] == pack_header(T_SYNC + 1, 0x1234) + bytes(4)
    # a frame with a bad crc8 inside a good datagram: BAD_CRC for it, the others run
    good = request(0, (Cmd.WRITE_REG, 0x14, 1, (7).to_bytes(4, "big")))
    frame2 = bytearray(request(0, w)[8:])
    frame2[-1] ^= 1
    (r,) = ep.receive_frame(host_frame(good + bytes(frame2)))
    body = parse_udp_frame(r)["payload"][8:]
    assert body[2] == LinkStatus.OK.value and body[5 + 2] == LinkStatus.BAD_CRC.value
    assert bus.regs[0x14] == 7 and bus.regs[0x10] == 1
    # that datagram took the link's seq 0: the link's own seq 0 now gets the cached answer to
    # other frames, which it refuses (command echo); after the timeout it syncs and goes on
    with pytest.raises(LinkTimeout, match="frame 0: response is for command 0x11, expected "
                                          "0x10"):
        link.read_reg(0x14)
    assert link.read_reg(0x14) == 7 and link.stats["syncs"] == 2


class Injecting:
    """A transport in front of another, handing the host ``junk`` datagrams before each real
    answer."""

    def __init__(self, inner):
        self.inner, self.junk = inner, []

    def send(self, payload):
        self.inner.send(payload)

    def recv(self, timeout):
        if self.junk:
            return self.junk.pop(0)
        return self.inner.recv(timeout)


def test_host_ignores_stale_and_malformed_responses():
    bus, ep, sim, link = rig()
    t = link.transport = Injecting(sim.transport())
    link.write_reg(0x10, 5)
    seq = link.expected
    ok_body = bytes([Cmd.READ_REG.value, 0, 1]) + (5).to_bytes(4, "big")
    frame = b"\x5a" + ok_body + bytes([crc8(ok_body)])
    t.junk = [
        pack_header(T_RESPONSE, seq - 1) + frame,               # stale (earlier seq)
        pack_header(T_SYNC + 1, seq) + bytes(4),                # a late sync answer
        b"KX" + pack_header(T_RESPONSE, seq)[2:] + frame,       # magic
        b"KH\x07\x01" + seq.to_bytes(4, "big") + frame,        # version
        pack_header(T_RESPONSE, seq) + frame[:-1] + bytes([frame[-1] ^ 1]),   # crc8
        pack_header(T_RESPONSE, seq) + b"\x5a\x11" + frame[2:],  # command echo
        pack_header(T_RESPONSE, seq) + frame + b"\x00",         # trailing octet
        pack_header(T_RESPONSE, seq) + frame[:4],               # cut
        b"KH",                                                  # runt
    ]
    assert link.read_reg(0x10) == 5
    assert link.stats["stale"] == 2 and link.stats["bad"] == 7 and not link.stats["retransmits"]


def test_timeouts_name_seq_and_attempts_then_resync():
    bus, ep, sim, link = rig(link_kw=dict(retries=2))
    link.write_reg(0x10, 1)
    seq = link.expected
    ep.expected = 500                           # the target was reset behind our back
    with pytest.raises(LinkTimeout, match=rf"request datagram \(1 frames, 20 octets\) seq {seq} "
                       r"\(0x[0-9a-f]{8}\) after 3 attempts of 0.05 s") as exc:
        link.write_reg(0x10, 2)
    assert (exc.value.seq, exc.value.attempts) == (seq, 3) and link.expected is None
    assert ep.counters["bad_seq"] == 3 and bus.regs[0x10] == 1
    link.write_reg(0x10, 3)                     # syncs first
    assert link.expected == 501 and bus.regs[0x10] == 3 and link.stats["syncs"] == 2
    # a silent target: the sync request itself times out
    dead = UdpLink((lambda p: None, lambda t: None), retries=0, seed=1)
    with pytest.raises(LinkTimeout, match=r"sync request seq \d+ .* after 1 attempts"):
        dead.read_reg(0)
    # answers that are all malformed: the last reason is in the message
    junk = UdpLink((lambda p: None, lambda t: b"KH\x01\x03\x00"), retries=1, seed=1)
    with pytest.raises(LinkTimeout, match="last datagram ignored: datagram of 5 octets"):
        junk.read_reg(0)


def test_host_errors_name_the_offending_value():
    bus, ep, sim, link = rig()
    with pytest.raises(ValueError, match="address 0x6 is not a multiple of 4"):
        link.read_reg(6)
    with pytest.raises(ValueError, match="READ_MEM: count 65 is not in 1..64"):
        link.exchange([Request(Cmd.READ_MEM, 0, 65)])
    with pytest.raises(ValueError, match="WRITE_REG: address 0x2 is not a multiple of 4"):
        link.transact(Cmd.WRITE_REG, 2, 1, bytes(4))
    with pytest.raises(ValueError, match="WRITE_MEM of 2 words carries 4 data octets, "
                                         "expected 8"):
        link.transact(Cmd.WRITE_MEM, 0, 2, bytes(4))
    with pytest.raises(ValueError, match="command 0x99 is not a host-link command"):
        link.exchange([Request(0x99, 0, 1)])
    with pytest.raises(ValueError, match="words\\[1\\] -1 is negative"):
        link.push(0, [1, -1])
    with pytest.raises(ValueError, match="value 0x100000000 does not fit"):
        link.write_reg(0, 1 << 32)
    with pytest.raises(ValueError, match="max_count 0 is not a positive int"):
        link.pop(0, 0)
    with pytest.raises(ValueError, match="max_words 300 is not in 1..255"):
        UdpLink(sim.transport(), max_words=300)
    with pytest.raises(ValueError, match="max_payload 512 cannot carry one frame of "
                                         "max_words 255"):
        UdpLink(sim.transport(), max_words=255, max_payload=512)
    with pytest.raises(ValueError, match="timeout 0 is not a positive"):
        UdpLink(sim.transport(), timeout=0)
    with pytest.raises(TypeError, match="has no send"):
        UdpLink(object())
    assert link.stats["datagrams_out"] == 0     # nothing went out for any of these


def test_port_over_udp_reports_refused_accesses():
    bus, ep, sim, link = rig()
    port = TargetPort(link_access(link))

    async def go():
        await port.mem_write(6, b"abcdefghij")
        assert await port.mem_read(6, 10) == b"abcdefghij"
        assert await port.read(Space.MEM, 8) == int.from_bytes(b"cdef", "little")
        with pytest.raises(HostError, match="read REG 0x100"):
            await port.rreg(0x100)
        with pytest.raises(HostError, match="bulk write of 16 octets"):
            await port.mem_write(1024 - 8, bytes(16))
        async with port.batch():
            await port.wreg(0x20, 1)
            await port.wreg(0x24, 2)            # one WRITE_REG frame of 2 words
            await port.write(Space.QUEUE, 0, 7)
            await port.write(Space.QUEUE, 0, 8)  # one PUSH frame of 2 words
            n = link.stats["exchanges"]
            assert await port.rreg(0x24) == 2 and link.stats["exchanges"] == n + 1
            await port.wreg(0x00, 5)            # refused, reported at the end of the batch
            with pytest.raises(HostError, match="write REG 0x0 value 0x5"):
                await port.rreg(0x20)
        assert list(bus.fifo) == [7, 8]
    import asyncio
    asyncio.run(go())


# --------------------------------------------------------------------------------------------
# A real socket (localhost), and the command line
# --------------------------------------------------------------------------------------------

def serve_endpoint(ep, sock, stop):
    """The endpoint on a UDP socket: each datagram wrapped in an Ethernet frame from the host
    it came from, each answer unwrapped."""
    sock.settimeout(0.05)
    while not stop.is_set():
        try:
            payload, (ip, port) = sock.recvfrom(65535)
        except socket.timeout:
            continue
        for r in ep.receive_frame(host_frame(payload, src_ip=ip, sport=port)):
            sock.sendto(parse_udp_frame(r)["payload"], (ip, port))


@pytest.fixture
def udp_target():
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
    except OSError as e:                        # pragma: no cover - sandbox without sockets
        pytest.skip(f"no UDP sockets here: {e}")
    bus = Bus()
    host = dict(HOST, ip="127.0.0.1", port=None)
    ep = UdpHostLinkEndpoint(PyBridge(bus), host=host, expected=42)
    stop = threading.Event()
    th = threading.Thread(target=serve_endpoint, args=(ep, sock, stop), daemon=True)
    th.start()
    yield bus, ep, sock.getsockname()[1]
    stop.set()
    th.join()
    sock.close()


def test_socket_transport(udp_target):
    bus, ep, tport = udp_target
    link = UdpLink.open("127.0.0.1", host_port=0, host_ip="127.0.0.1", target_port=tport,
                        timeout=0.5)
    ep.host["port"] = link.transport.sock.getsockname()[1]
    try:
        assert link.read_reg(0) == 0x4B425450 and link.expected == 43
        link.write_mem(0, bytes(range(256)))
        assert link.read_mem(0, 256) == bytes(range(256))
    finally:
        link.close()
    # another source port is not the configured host: dropped, counted
    other = UdpLink(SocketTransport("127.0.0.1", host_port=0, host_ip="127.0.0.1",
                                    target_port=tport), timeout=0.05, retries=1, seed=1)
    with pytest.raises(LinkTimeout):
        other.read_reg(0)
    other.close()
    assert ep.counters["bad_src"] == 2


def test_cli_driver_over_udp(monkeypatch, capsys):
    from host.driver import memory_plan
    from model.target import TargetConfig, TargetModel
    from tests.host.test_driver import FakeTarget
    cfgd = dict(block_size=256, num_blocks=8, num_handles=64, handles_per_initiator=32)
    cfg = TargetConfig(**cfgd)
    fake = FakeTarget(cfg, memory_plan(cfg, 2)["end"])
    opened = []

    def open_udp(args):
        opened.append((args.target_ip, args.host_port, args.host_ip, args.target_port))
        ep = UdpHostLinkEndpoint(PyBridge(fake))
        return UdpLink(SimNet(ep, seed=2, loss=0.1).transport(), seed=2,
                       timeout=args.timeout, retries=args.retries)
    monkeypatch.setattr(cli, "_open_udp_link", open_udp)
    assert cli.main(["driver", "--link", "udp", "--target-ip", "10.0.0.1", "--host-port",
                     "50000", "--config", json.dumps(cfgd), "init"]) == 0
    assert opened == [("10.0.0.1", 50000, None, HOSTLINK_UDP_PORT)]
    n = cfg.layout()["size"]
    assert bytes(fake.mem[:n]) == bytes(TargetModel(cfg).mem[:n])
    assert "initialized" in capsys.readouterr().out
    assert cli.main(["driver", "--link", "udp", "--target-ip", "10.0.0.1", "init"]) == 2
    assert "--link udp needs --target-ip and --host-port" in capsys.readouterr().err
    assert cli.main(["driver", "init"]) == 2
    assert "--link uart needs --port" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["driver", "--help"])
    out = capsys.readouterr().out
    assert "--link" in out and "--target-ip" in out and "--host-port" in out


def test_header_helpers():
    assert pack_header(T_REQUEST, 0x01020304) == b"KH\x01\x00\x01\x02\x03\x04"
    assert struct.unpack(">H", b"KH")[0] == HOSTLINK_UDP_PORT == 19272
    with pytest.raises(LinkError, match="type 9 is not"):
        from host.udplink import unpack_header
        unpack_header(b"KH\x01\x09" + bytes(4))

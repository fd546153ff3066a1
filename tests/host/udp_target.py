# Ref: issue 23 (the UDP host-link wire format and the target's rules); hw/target/hostlink.py
#      (the frames); host/udplink.py (the host side); RFC 768 / 791 (UDP and IPv4 checksums).
"""A Python reference of the target's UDP host-link endpoint, and a lossy network to it.

:class:`UdpHostLinkEndpoint` applies the target's rules (hw/target/udplink.py, whose counter
names it uses) to whole Ethernet frames, a frame counted by the first rule it fails:

* only IPv4/UDP to the target's MAC, IP and port :data:`~host.udplink.HOSTLINK_UDP_PORT` is
  looked at (anything else: ``ignored``);
* only from the configured host MAC, IP and UDP source port (else ``bad_src``), with a correct
  IPv4 header checksum and a present (non-zero), correct UDP checksum (else ``bad_csum``);
* a payload that is not a version-1 host-link request or sync request, or whose frames do not
  parse back to back, or longer than 1472 octets: ``malformed`` (nothing executed);
* sync request: answered with ``expected``, nothing executed (``sync``);
* request, ``seq == expected``: every frame executed in order, one response frame each
  (``BAD_CRC`` / ``BAD_CMD`` / ``BAD_COUNT`` / ``BAD_ALIGN`` for a frame the bridge would
  refuse), the response datagram cached, ``expected`` advanced (``executed``);
  ``seq == expected - 1``: the cached response again, nothing executed (``duplicate``); any
  other seq: dropped (``bad_seq``).

What the gateware has and this reference has not: the enable bit (``disabled``: this endpoint
is always enabled) and a bounded datagram store (``overrun``); it also counts no
``tx_datagrams``. The host's behaviour under loss does not depend on either.

Bus accesses go through a :class:`tests.host.test_driver_uart.PyBridge` (the frame-level UART
bridge of the UART tests, in front of the test driver's fake target), one frame at a time.
The response must fit 1472 octets: a longer one is a host bug (the host splits its batches) and
raises AssertionError here.

:class:`SimNet` carries the host's datagrams to the endpoint and back as real Ethernet / IPv4 /
UDP frames (checksums included) in simulated time, with per-direction loss, one-bit
corruption, duplication and reordering, and checks the UDP checksum on the host side as the
host's kernel would. ``SimNet.transport()`` is what :class:`host.udplink.UdpLink` takes.
"""

import random
import struct
from collections import deque

from host.link import STATUS_FIELDS, crc8
from host.udplink import (HEADER, HOSTLINK_UDP_PORT, MAX_PAYLOAD, T_REQUEST, T_SYNC,
                          CallableTransport, pack_header)
from hw.target.hostlink import SOF_REQUEST, SOF_RESPONSE, Cmd, LinkStatus
from roce.frames import ip_int, mac_bytes
from sim.vllink import parse_udp_frame, udp_frame, wire_octets

__all__ = ["UdpHostLinkEndpoint", "SimNet", "udp_frame", "parse_udp_frame", "wire_octets",
           "HOST", "TARGET"]

#: Addresses of the simulated host and target.
HOST = dict(mac="02:00:00:00:00:02", ip="10.0.0.2", port=50000)
TARGET = dict(mac="02:00:00:00:00:01", ip="10.0.0.1")


class UdpHostLinkEndpoint:
    """The target side of the UDP host link (see the module docstring).

    Parameters
    ----------
    bridge : a PyBridge (``write(frame)`` executes it, ``read(n)`` returns the response)
    host : dict(mac, ip, port)   the configured host
    target : dict(mac, ip)
    max_words : int              largest frame count
    expected : int               the sequence number expected after reset
    """

    def __init__(self, bridge, host=HOST, target=TARGET, *, max_words=64, expected=0):
        self.bridge = bridge
        self.host = dict(host)
        self.target = dict(target)
        self.max_words = max_words
        self.expected = expected & 0xFFFFFFFF
        self.cache = None               # (seq, response payload)
        self.counters = dict.fromkeys(
            ("ignored", "bad_src", "bad_csum", "malformed", "executed", "duplicate", "bad_seq",
             "sync", "frames_ok", "crc_errors", "bus_errors"), 0)

    # ---- frames -----------------------------------------------------------------------------
    def _frames(self, body):
        """Split ``body`` into request frames; None when they do not parse back to back."""
        out, pos = [], 0
        while pos < len(body):
            if body[pos] != SOF_REQUEST or pos + 8 > len(body):
                return None
            cmd, count = body[pos + 1], body[pos + 6]
            writes = cmd & 1 and cmd != Cmd.STATUS.value and cmd in {c.value for c in Cmd} \
                and 1 <= count <= self.max_words
            n = 8 + (4 * count if writes else 0)
            if pos + n > len(body):
                return None
            out.append(body[pos:pos + n])
            pos += n
        return out or None

    def _execute(self, frame):
        """One request frame -> its response frame (the bridge's rules)."""
        cmd, addr, count = struct.unpack(">BIB", frame[1:7])

        def answer(status, done=0, data=b""):
            body = bytes([cmd, status.value, done]) + data
            return bytes([SOF_RESPONSE]) + body + bytes([crc8(body)])
        if crc8(frame[1:-1]) != frame[-1]:
            self.counters["crc_errors"] += 1
            return answer(LinkStatus.BAD_CRC)
        if cmd not in {c.value for c in Cmd}:
            return answer(LinkStatus.BAD_CMD)
        if not 1 <= count <= self.max_words:
            return answer(LinkStatus.BAD_COUNT)
        self.counters["frames_ok"] += 1
        if cmd == Cmd.STATUS.value:
            c = self.counters
            words = (c["frames_ok"], c["crc_errors"], c["malformed"], c["bus_errors"])
            assert len(words) == len(STATUS_FIELDS)
            return answer(LinkStatus.OK, 4, struct.pack(">4I", *words))
        if cmd >> 4 != 3 and addr % 4:
            return answer(LinkStatus.BAD_ALIGN)
        self.bridge.write(frame)
        head = self.bridge.read(4)
        reads = not cmd & 1
        status, done = head[2], head[3]
        if status != LinkStatus.OK.value:
            self.counters["bus_errors"] += 1
        n = 4 * done if reads else 0
        return head + self.bridge.read(n + 1)

    # ---- datagrams --------------------------------------------------------------------------
    def _reply(self, payload):
        h, t = self.host, self.target
        assert len(payload) <= MAX_PAYLOAD, \
            f"response datagram of {len(payload)} octets: the host did not split its batch"
        return udp_frame(t["mac"], h["mac"], t["ip"], h["ip"], HOSTLINK_UDP_PORT, h["port"],
                         payload)

    def receive_frame(self, frame):
        """One Ethernet frame from the network -> the frames the target sends back."""
        c = self.counters
        u = parse_udp_frame(frame)
        if u is None or u["dst_mac"] != mac_bytes(self.target["mac"]) \
                or u["dst_ip"] != ip_int(self.target["ip"]) or u["dport"] != HOSTLINK_UDP_PORT:
            c["ignored"] += 1
            return []
        if (u["src_mac"], u["src_ip"], u["sport"]) != (mac_bytes(self.host["mac"]),
                                                       ip_int(self.host["ip"]),
                                                       self.host["port"]):
            c["bad_src"] += 1
            return []
        if not u["ip_ok"] or not u["checksum"] or not u["checksum_ok"]:
            c["bad_csum"] += 1
            return []
        p = u["payload"]
        if len(p) < HEADER or len(p) > MAX_PAYLOAD or p[:3] != b"KH\x01" \
                or p[3] not in (T_REQUEST, T_SYNC):
            c["malformed"] += 1
            return []
        kind, seq = p[3], int.from_bytes(p[4:8], "big")
        if kind == T_SYNC:
            c["sync"] += 1
            return [self._reply(pack_header(kind + 1, seq) + self.expected.to_bytes(4, "big"))]
        if seq == (self.expected - 1) & 0xFFFFFFFF and self.cache is not None \
                and self.cache[0] == seq:
            c["duplicate"] += 1
            return [self._reply(self.cache[1])]
        if seq != self.expected:
            c["bad_seq"] += 1
            return []
        frames = self._frames(p[HEADER:])
        if frames is None:
            c["malformed"] += 1
            return []
        resp = pack_header(kind + 1, seq) + b"".join(self._execute(f) for f in frames)
        self.cache = (seq, resp)
        self.expected = (seq + 1) & 0xFFFFFFFF
        c["executed"] += 1
        return [self._reply(resp)]


class SimNet:
    """Host <-> endpoint in simulated time (see the module docstring).

    ``loss``, ``corrupt``, ``dup``, ``reorder``: probabilities per frame and direction
    (reordering holds a frame back until the next one of its direction has gone). ``stats``
    counts what happened; ``wire`` the Ethernet octets each way (:func:`wire_octets`).
    """

    def __init__(self, endpoint, *, seed=0, loss=0.0, corrupt=0.0, dup=0.0, reorder=0.0,
                 host=HOST, target=TARGET):
        self.endpoint = endpoint
        self.rng = random.Random(seed)
        self.loss, self.corrupt, self.dup, self.reorder = loss, corrupt, dup, reorder
        self.host, self.target = dict(host), dict(target)
        self.to_host = deque()
        self._held = [None, None]       # a frame held back, per direction (0: to the target)
        self.stats = dict.fromkeys(("sent", "lost", "corrupted", "duplicated", "reordered",
                                    "host_dropped"), 0)
        self.wire = [0, 0]

    def transport(self):
        """The ``send`` / ``recv`` pair :class:`host.udplink.UdpLink` takes."""
        return CallableTransport(self.send, self.recv)

    def _impair(self, frame, direction):
        """What of ``frame`` reaches the other side now (a list, in order)."""
        self.stats["sent"] += 1
        self.wire[direction] += wire_octets(len(frame))
        rng = self.rng
        if rng.random() < self.loss:
            self.stats["lost"] += 1
            return self._release(direction)
        copies = [frame, frame] if rng.random() < self.dup else [frame]
        self.stats["duplicated"] += len(copies) - 1
        out = []
        for f in copies:
            if rng.random() < self.corrupt:
                self.stats["corrupted"] += 1
                b = bytearray(f)
                i = rng.randrange(14, len(b))
                b[i] ^= 1 << rng.randrange(8)
                f = bytes(b)
            out.append(f)
        if self._held[direction] is None and rng.random() < self.reorder:
            self.stats["reordered"] += 1
            self._held[direction] = out.pop()
        return out + self._release(direction) if out else out

    def _release(self, direction):
        held, self._held[direction] = self._held[direction], None
        return [held] if held is not None else []

    def to_target(self, frame):
        """A frame onto the host -> target path (impairments apply)."""
        self._arrive(self._impair(frame, 0))

    def _arrive(self, frames):
        for f in frames:
            for r in self.endpoint.receive_frame(f):
                self.to_host.extend(self._impair(r, 1))

    def send(self, payload):
        h, t = self.host, self.target
        self.to_target(udp_frame(h["mac"], t["mac"], h["ip"], t["ip"], h["port"],
                                 HOSTLINK_UDP_PORT, payload))

    def recv(self, timeout):
        """The next datagram for the host (kernel checks: our port, UDP checksum), or None:
        nothing in flight (held frames are released then)."""
        while True:
            if not self.to_host:
                self._arrive(self._release(0))
                self.to_host.extend(self._release(1))
                if not self.to_host:
                    return None
                continue
            u = parse_udp_frame(self.to_host.popleft())
            if u is None or u["dport"] != self.host["port"] or not u["ip_ok"] or \
                    (u["checksum"] and not u["checksum_ok"]):
                self.stats["host_dropped"] += 1
                continue
            return u["payload"]

# Ref: issue 23 (the UDP host-link wire format); hw/target/hostlink.py (the frames it carries);
#      host/link.py (FrameLink: the API shared with UartLink); RFC 768 (UDP).
"""Host side of the UDP host link: :class:`UdpLink`.

The target's own Ethernet port carries the host-link frames of :mod:`hw.target.hostlink` in UDP
datagrams, many frames per datagram, so that the host driver's slow path is not bound by a
115,200-baud UART.

Wire format (UDP payload, both ways; the target listens on UDP port :data:`HOSTLINK_UDP_PORT`)
-------------------------------------------------------------------------------------------
::

    0..1  magic 0x4B 0x48 ("KH")
    2     version 1
    3     type: 0 request, 1 response, 2 sync request, 3 sync response
    4..7  seq, u32 big-endian
    8..   request: host-link request frames (0xA5 | cmd | addr | count | data | crc8),
          back to back; response: the response frames (0x5A | ...), one per request frame,
          in order. Sync request: empty; sync response: 4 octets, the next sequence number
          the target expects.

Target rules: datagrams only from the configured host MAC, IP and UDP source port, with a
present and correct UDP checksum; ``seq == expected`` executes every frame, caches the response
and advances ``expected``; ``seq == expected - 1`` re-sends the cached response without
executing; any other seq is dropped; a sync request is answered with ``expected`` and executes
nothing. Payloads are at most :data:`MAX_PAYLOAD` octets each way (MTU 1500).

Host rules (this class)
-----------------------
* Sync first (type 2, a random seq as nonce; the answer must echo it): the link learns
  ``expected``. After a :class:`~host.link.LinkTimeout` the link syncs again before its next
  request (the target may or may not have executed the lost one).
* One request datagram outstanding; retransmitted unchanged (same seq) after ``timeout``
  seconds, ``retries`` times; then :class:`~host.link.LinkTimeout` naming the seq and attempts.
* A datagram is accepted as the response only with the magic, version 1, type 1, the request's
  seq, exactly one well-formed response frame per request frame (start octet, command echo,
  count, crc8) and nothing after them. Anything else (a stale or duplicated response, a late
  sync answer, a corrupted datagram) is ignored and counted (``stats["stale"]``,
  ``stats["bad"]``); the wait goes on until the attempt's timeout.
* A batch is split so that every request datagram and its longest possible response fit
  :data:`MAX_PAYLOAD` (``max_payload``); its frames all execute at the target, so an error
  status in one frame does not stop the following ones (unlike the UART, which skips the rest of
  a failed operation).

Transports
----------
Anything with ``send(payload: bytes)`` and ``recv(timeout: float) -> bytes | None`` (None:
nothing arrived within ``timeout`` seconds): :class:`SocketTransport` (a board: an
``AF_INET``/``SOCK_DGRAM`` socket bound to the host port and connected to the target), or
:class:`CallableTransport` around two functions (a simulator carrying the datagrams; its
``recv`` may return None at once, the link then treats the attempt as timed out).

Bring-up (over the UART, before the first datagram): :func:`setup_target` points the target's
endpoint at this host (MAC, IP, UDP port) and enables it; :func:`target_state` reads its
registers and counters (``kbtp driver --port DEV link ...``).

Example::

    link = UdpLink(SocketTransport("10.0.0.1", host_port=19273))
    assert link.read_reg(0x0) == 0x4B425450
    b = link.batch()
    for k in range(100):
        b.write_reg(0x100 + 4 * k, k)
    b.run()                     # a few datagrams, one round trip each
"""

import random
import socket
import struct
import time

from host.link import (FrameLink, LinkError, LinkTimeout, check_request, encode_request,
                       parse_response, request_size, response_size)
from hw.target.hostlink import SOF_RESPONSE
# The datagram format is the gateware's (hw/target/udplink.py): one definition of each number.
from hw.target.udplink import (HEADER, HOSTLINK_UDP_PORT, MAGIC as _MAGIC, MAX_PAYLOAD,
                               REG_UDPLINK, T_REQUEST, T_RESPONSE, T_SYNC, T_SYNC_RESPONSE,
                               UDPLINK_COUNTER_BASE, UDPLINK_COUNTERS, UDPLINK_ID,
                               UDPLINK_REGS, VERSION)

__all__ = ["UdpLink", "SocketTransport", "CallableTransport", "HOSTLINK_UDP_PORT", "MAGIC",
           "VERSION", "MAX_PAYLOAD", "HEADER", "T_REQUEST", "T_RESPONSE", "T_SYNC",
           "T_SYNC_RESPONSE", "TIMEOUT", "RETRIES", "pack_header", "unpack_header",
           "setup_target", "target_state"]

#: The header's magic, "KH" (the gateware's is the same two octets as a number).
MAGIC = _MAGIC.to_bytes(2, "big")
#: Seconds before a request is sent again, and how many times, by default.
TIMEOUT, RETRIES = 0.05, 8
_TYPES = {T_REQUEST: "request", T_RESPONSE: "response", T_SYNC: "sync request",
          T_SYNC_RESPONSE: "sync response"}
M32 = (1 << 32) - 1


def pack_header(kind, seq):
    """The 8 header octets of a datagram of type ``kind`` with sequence number ``seq``."""
    return struct.pack(">2sBBI", MAGIC, VERSION, kind, seq & M32)


def unpack_header(payload):
    """``(type, seq, body)`` of a datagram; LinkError if it is not a version-1 host-link one."""
    if len(payload) < HEADER:
        raise LinkError(f"datagram of {len(payload)} octets is shorter than the "
                        f"{HEADER}-octet header")
    magic, version, kind, seq = struct.unpack(">2sBBI", payload[:HEADER])
    if magic != MAGIC:
        raise LinkError(f"magic {magic.hex()} is not {MAGIC.hex()}")
    if version != VERSION:
        raise LinkError(f"version {version} is not {VERSION}")
    if kind not in _TYPES:
        raise LinkError(f"type {kind} is not a host-link datagram type")
    return kind, seq, payload[HEADER:]


async def setup_target(port, *, host_mac, host_ip, host_port, enable=True):
    """Bring-up of the target's UDP endpoint through ``port`` (a :class:`host.port.TargetPort`,
    on a board over the UART): check its ID register, write the host's MAC, IP and UDP port,
    then set ``ctrl`` (enable last, so no datagram is taken from a half-written address).
    Raises ValueError naming a bad value, :class:`host.port.HostError` if the target has no
    endpoint (its window answers ``err``)."""
    from host.port import ip_value, mac_value
    mac = mac_value(host_mac) if isinstance(host_mac, str) else host_mac
    ip = ip_value(host_ip) if isinstance(host_ip, str) else host_ip
    if not isinstance(mac, int) or not 0 <= mac < 1 << 48 or mac >> 40 & 1:
        raise ValueError(f"host MAC {host_mac!r} is not a unicast 48-bit address")
    if not isinstance(ip, int) or not 0 < ip < 1 << 32:
        raise ValueError(f"host IP {host_ip!r} is not an IPv4 address")
    if not isinstance(host_port, int) or not 0 < host_port < 1 << 16:
        raise ValueError(f"host UDP port {host_port!r} is not in 1..65535")
    ident = await port.rreg(REG_UDPLINK + UDPLINK_REGS["id"])
    if ident != UDPLINK_ID:
        raise ValueError(f"register {REG_UDPLINK:#x} reads {ident:#010x}, not the UDP host "
                         f"link's ID {UDPLINK_ID:#010x}")
    await port.wreg(REG_UDPLINK + UDPLINK_REGS["ctrl"], 0)
    await port.wreg(REG_UDPLINK + UDPLINK_REGS["host_mac_hi"], mac >> 32)
    await port.wreg(REG_UDPLINK + UDPLINK_REGS["host_mac_lo"], mac & M32)
    await port.wreg(REG_UDPLINK + UDPLINK_REGS["host_ip"], ip)
    await port.wreg(REG_UDPLINK + UDPLINK_REGS["host_port"], host_port)
    await port.wreg(REG_UDPLINK + UDPLINK_REGS["ctrl"], int(bool(enable)))


async def target_state(port):
    """The endpoint's registers (``id``, ``ctrl``, ``host_mac``, ``host_ip``, ``host_port``,
    ``expected``) and counters (:data:`~hw.target.udplink.UDPLINK_COUNTERS`), as a dict."""
    rs = port.reads()
    regs = {name: rs.reg(REG_UDPLINK + off) for name, off in UDPLINK_REGS.items()}
    cnt = {name: rs.reg(REG_UDPLINK + UDPLINK_COUNTER_BASE + 4 * k)
           for k, name in enumerate(UDPLINK_COUNTERS)}
    got = await rs.run()
    out = {name: got[i] for name, i in regs.items()}
    mac = out.pop("host_mac_hi") << 32 | out.pop("host_mac_lo")
    out["host_mac"] = ":".join(f"{mac >> 8 * k & 0xFF:02x}" for k in range(5, -1, -1))
    out["host_ip"] = ".".join(str(out["host_ip"] >> 8 * k & 0xFF) for k in range(3, -1, -1))
    out["counters"] = {name: got[i] for name, i in cnt.items()}
    return out


class SocketTransport:
    """UDP socket to the target: bound to ``(host_ip, host_port)`` (the source port the target
    is configured to accept) and connected to ``(target_ip, target_port)``, so the kernel
    keeps datagrams from anyone else away."""

    def __init__(self, target_ip, *, host_port, host_ip="", target_port=HOSTLINK_UDP_PORT):
        self.target = (target_ip, target_port)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            self.sock.bind((host_ip, host_port))
            self.sock.connect(self.target)
        except OSError:
            self.sock.close()
            raise

    def send(self, payload):
        self.sock.send(payload)

    def recv(self, timeout):
        self.sock.settimeout(max(timeout, 1e-4))
        try:
            return self.sock.recv(65535)
        except socket.timeout:
            return None
        except ConnectionRefusedError:      # ICMP port unreachable: as good as a loss
            return None

    def close(self):
        self.sock.close()


class CallableTransport:
    """A transport from two functions: ``send(payload)`` and ``recv(timeout) -> bytes|None``."""

    def __init__(self, send, recv):
        self.send = send
        self.recv = recv

    def close(self):
        pass


class UdpLink(FrameLink):
    """Register / memory / queue access over the UDP host link (see the module docstring).

    Parameters
    ----------
    transport : object with ``send`` and ``recv``, or a ``(send, recv)`` pair of functions
    timeout : float
        Seconds to wait for the response to one attempt.
    retries : int
        Retransmissions of a request (or sync) before :class:`~host.link.LinkTimeout`.
    max_words : int
        The endpoint's ``max_words`` (largest frame count); longer transfers take more frames.
    max_payload : int
        Largest UDP payload either way (:data:`MAX_PAYLOAD` for a 1500-octet MTU).
    seed : int or None
        Seeds the sync nonces (tests); None draws them from the OS.
    clock : callable
        Seconds, monotonic (tests may pass a simulated clock).

    ``stats``: ``exchanges`` (request datagrams answered: round trips), ``frames``,
    ``octets_out`` / ``octets_in`` (UDP payload octets, retransmissions included),
    ``datagrams_out`` / ``datagrams_in``, ``retransmits``, ``timeouts``, ``syncs``,
    ``stale`` (well-formed datagrams of another seq or type), ``bad`` (malformed).
    """

    def __init__(self, transport, *, timeout=TIMEOUT, retries=RETRIES, max_words=64,
                 max_payload=MAX_PAYLOAD, seed=None, clock=time.monotonic):
        if isinstance(transport, tuple):
            transport = CallableTransport(*transport)
        if not (callable(getattr(transport, "send", None))
                and callable(getattr(transport, "recv", None))):
            raise TypeError(f"transport {transport!r} has no send()/recv()")
        super().__init__(max_words)
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError(f"timeout {timeout!r} is not a positive number of seconds")
        if not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries {retries!r} is not a non-negative int")
        worst = HEADER + 8 + 4 * max_words     # a request of max_words (its response: 5 + 4 *)
        if not isinstance(max_payload, int) or worst > max_payload:
            raise ValueError(f"max_payload {max_payload!r} cannot carry one frame of max_words "
                             f"{max_words} ({worst} octets with the header)")
        self.transport = transport
        self.timeout = timeout
        self.retries = retries
        self.max_payload = max_payload
        self.clock = clock
        self._rng = random.Random(seed) if seed is not None else random.SystemRandom()
        self.expected = None            # the target's next seq, once synced
        self.stats.update(datagrams_out=0, datagrams_in=0, retransmits=0, timeouts=0, syncs=0,
                          stale=0, bad=0)
        self.last_ignored = None        # why the last ignored datagram was ignored

    @classmethod
    def open(cls, target_ip, *, host_port, host_ip="", target_port=HOSTLINK_UDP_PORT, **kw):
        """A link over a :class:`SocketTransport` (a board)."""
        return cls(SocketTransport(target_ip, host_port=host_port, host_ip=host_ip,
                                   target_port=target_port), **kw)

    def close(self):
        close = getattr(self.transport, "close", None)
        if close is not None:
            close()

    # ---- datagrams ------------------------------------------------------------------------
    def _ignore(self, kind, why):
        self.stats[kind] += 1
        self.last_ignored = why

    def _round_trip(self, kind, seq, body, accept, what):
        """Send a datagram and retransmit it until ``accept(type, seq, body)`` returns a value
        other than None (raising LinkError: ignored as malformed)."""
        datagram = pack_header(kind, seq) + body
        attempts = self.retries + 1
        self.last_ignored = None
        for attempt in range(attempts):
            if attempt:
                self.stats["retransmits"] += 1
            self.transport.send(datagram)
            self.stats["datagrams_out"] += 1
            self.stats["octets_out"] += len(datagram)
            deadline = self.clock() + self.timeout
            first = True
            while first or self.clock() < deadline:     # at least one look per attempt
                first = False
                got = self.transport.recv(max(0.0, deadline - self.clock()))
                if got is None:
                    break
                got = bytes(got)
                self.stats["datagrams_in"] += 1
                self.stats["octets_in"] += len(got)
                try:
                    rkind, rseq, rbody = unpack_header(got)
                except LinkError as e:
                    self._ignore("bad", f"{e}")
                    continue
                if (rkind, rseq) != (kind + 1, seq):
                    self._ignore("stale", f"{_TYPES[rkind]} seq {rseq}")
                    continue
                try:
                    value = accept(rbody)
                except LinkError as e:
                    self._ignore("bad", f"{_TYPES[rkind]} seq {rseq}: {e}")
                    continue
                return value
        self.stats["timeouts"] += 1
        self.expected = None            # executed or not: sync before the next request
        last = f"; last datagram ignored: {self.last_ignored}" if self.last_ignored else ""
        raise LinkTimeout(f"UDP host link: no valid answer to {what} seq {seq} ({seq:#010x}) "
                          f"after {attempts} attempts of {self.timeout} s{last}",
                          seq=seq, attempts=attempts)

    def sync(self):
        """Ask the target for the sequence number it expects next (type 2); returns it."""
        def accept(body):
            if len(body) != 4:
                raise LinkError(f"sync response carries {len(body)} octets, not 4")
            return int.from_bytes(body, "big")
        nonce = self._rng.getrandbits(32)
        self.stats["syncs"] += 1
        self.expected = self._round_trip(T_SYNC, nonce, b"", accept, "sync request")
        return self.expected

    @staticmethod
    def _parse(requests, body):
        """The response frames of ``requests`` in ``body``; LinkError when malformed."""
        pos = 0

        def read(n, what):
            nonlocal pos
            if pos + n > len(body):
                raise LinkError(f"datagram ends in {what} (frame {k}, needs {n} octets at "
                                f"{pos}, has {len(body) - pos})")
            pos += n
            return body[pos - n:pos]

        out = []
        for k, req in enumerate(requests):
            (sof,) = read(1, "the response start octet")
            if sof != SOF_RESPONSE:
                raise LinkError(f"frame {k}: start octet {sof:#04x} is not {SOF_RESPONSE:#04x}")
            try:
                out.append(parse_response(req, read))
            except LinkError as e:
                raise LinkError(f"frame {k}: {e}") from None
        if pos != len(body):
            raise LinkError(f"{len(body) - pos} octets after the {len(requests)} response "
                            f"frames")
        return out

    def _datagrams(self, requests):
        """Split ``requests`` in order into datagrams whose request and longest response both
        fit ``max_payload``."""
        out, cur, qlen, rlen = [], [], HEADER, HEADER
        for req in requests:
            q, r = request_size(req), response_size(req)
            if cur and (qlen + q > self.max_payload or rlen + r > self.max_payload):
                out.append(cur)
                cur, qlen, rlen = [], HEADER, HEADER
            cur.append(req)
            qlen, rlen = qlen + q, rlen + r
        if cur:
            out.append(cur)
        return out

    def exchange(self, requests, groups=None):
        """Carry out the frames in as few datagrams as fit, one round trip each; every
        frame's ``(status, done, data)`` in order (``groups`` is not needed: every frame of a
        datagram executes)."""
        requests = [check_request(r, self.max_words) for r in requests]
        out = []
        for frames in self._datagrams(requests):
            if self.expected is None:
                self.sync()
            seq = self.expected
            body = b"".join(encode_request(*r) for r in frames)
            out += self._round_trip(T_REQUEST, seq, body,
                                    lambda rbody, frames=frames: self._parse(frames, rbody),
                                    f"request datagram ({len(frames)} frames, "
                                    f"{HEADER + len(body)} octets)")
            self.expected = (seq + 1) & M32
            self.stats["exchanges"] += 1
            self.stats["frames"] += len(frames)
        return out

# Ref: issue 23 (frees at the rate of allocations: the UDP host link); host/udplink.py (UdpLink,
#      the datagram format, the transport contract); hw/target/udplink.py (the target's rules,
#      UDPLINK_REGS); sim/vltarget.py (the Verilated target); RFC 768 / RFC 791 (UDP, IPv4).
"""The UDP host link over the simulated wire: a :class:`host.udplink.UdpLink` transport on a
:class:`sim.vltarget.VlTarget`.

:class:`VlUdpTransport` turns each request payload of the link into an Ethernet / IPv4 / UDP
frame from the configured host (``host_mac``, ``host_ip``, ``host_port``) to the target's own
MAC / IP and UDP port :data:`~hw.target.udplink.HOSTLINK_UDP_PORT` (19272), queues it on the
target's GMII input (:meth:`VlTarget.send`), and :meth:`~VlUdpTransport.recv` runs the simulation
in steps of ``step`` GMII cycles until the target has sent the response datagram (UDP from port
19272 to the host's MAC and port). Every other frame the target sends meanwhile (RoCE, ARP,
CM) is handed to ``on_frames`` (called after every step, with an empty list too, so that the
caller's network can move: deliver its own frames, run its timers).

Impairments (``loss``, ``corrupt``, ``dup``; seeded): the link's own frames may be lost,
corrupted (one bit of the IPv4 datagram, FCS still good) or duplicated, per direction; the
target's checks and the host's kernel checks (:meth:`~VlUdpTransport.sift`) drop the corrupted
ones, :class:`~host.udplink.UdpLink` retransmits (``tests/sim/test_vllink.py``: issue 23's loss
test).

Whatever else runs the simulation (a bench's wait loop, ``kbtp-sim serve``'s service loop) must
pass the target's frames through :meth:`~VlUdpTransport.sift`: it keeps the host-link
datagrams (for the next :meth:`recv`) and returns the rest.

Time
----
The host's own processing takes **zero simulated time**: the driver, the link's packing and
parsing run between two simulation steps. The wire (one octet per 125 MHz GMII cycle,
preamble, FCS and inter-frame gap included) and the target's processing (MAC at 125 MHz, the
core at ``params["core_div"]`` GMII cycles per core cycle: 3, 41.67 MHz, on the ECPIX-5) are
simulated at the board's clocks. ``host_turnaround_ns`` (default 0) models the host's own
turnaround per exchange: that much simulated time passes (the network still moving) before
each datagram is sent. :meth:`clock` is the simulated time in seconds: give it to
:class:`~host.udplink.UdpLink` as ``clock`` so that its timeouts are simulated time too
(:func:`sim_udp_link` does).

Bring-up (:meth:`~VlUdpTransport.bring_up`): what ``kbtp driver init`` would do over the UART on
a board, through the direct host bus (:meth:`VlTarget.access`, zero simulated time): the
target's own MAC / IP (the link is addressed to them), then ``host_mac_hi`` / ``host_mac_lo`` /
``host_ip`` / ``host_port`` and ``ctrl`` = 1 of :data:`~hw.target.udplink.UDPLINK_REGS`.

Example::

    with VlTarget(SHIPPED) as vt:
        tr = VlUdpTransport(vt, target_mac=T_MAC, target_ip=T_IP)
        tr.bring_up()
        port = TargetPort(link_access(sim_udp_link(tr)))
"""

import random
import struct

from host.link import request_size
from host.port import TargetPort, link_access
from host.udplink import UdpLink
from hw.headers import ETHERTYPE_IPV4, EthernetHeader, IPv4Header, UDPHeader, pack, unpack
from hw.iface import REG_TOP, REG_UDPLINK
from hw.target.udplink import (HOSTLINK_UDP_PORT, UDPLINK_COUNTER_BASE, UDPLINK_COUNTERS,
                               UDPLINK_REGS)
from roce.frames import ip_int, ipv4_checksum, mac_bytes
from sim.system import PERIOD_NS, T_IP, T_MAC, VlSystemBench
from sim.vltarget import driver_for

__all__ = ["VlUdpTransport", "VlUdpSystemBench", "CountingUdpLink", "sim_udp_link", "udp_frame", "parse_udp_frame", "wire_octets",
           "HOST_MAC", "HOST_IP", "HOST_PORT", "STEP", "LINK_TIMEOUT_S"]

#: The simulated host's addresses on the link (locally administered MAC, a spare IP).
HOST_MAC, HOST_IP, HOST_PORT = "02:4b:48:00:00:01", "10.0.0.250", 19273
#: GMII cycles per simulation step while waiting for a response (1.024 us).
STEP = 128
#: The link's timeout per attempt in simulated seconds (a full datagram of reads executes in
#: well under 1 ms on the shipped core).
LINK_TIMEOUT_S = 0.002


def _pseudo(src_ip, dst_ip, udp_len):
    return struct.pack(">IIBBH", ip_int(src_ip), ip_int(dst_ip), 0, 17, udp_len)


def udp_frame(src_mac, dst_mac, src_ip, dst_ip, sport, dport, payload, checksum=True):
    """An Ethernet II frame (no FCS, not padded) carrying ``payload`` in IPv4 / UDP (IPv4 DF,
    TTL 64), both checksums present (``checksum`` False: a zero UDP checksum)."""
    payload = bytes(payload)
    ulen = 8 + len(payload)
    udp = pack(UDPHeader, src_port=sport, dst_port=dport, length=ulen, checksum=0) + payload
    if checksum:
        c = ipv4_checksum(_pseudo(src_ip, dst_ip, ulen) + udp) or 0xFFFF
        udp = udp[:6] + c.to_bytes(2, "big") + udp[8:]
    ip = bytearray(pack(IPv4Header, version=4, ihl=5, total_length=20 + ulen, flags=0b010,
                        ttl=64, protocol=17, src=ip_int(src_ip), dst=ip_int(dst_ip)))
    ip[10:12] = ipv4_checksum(ip).to_bytes(2, "big")
    eth = pack(EthernetHeader, dst=int.from_bytes(mac_bytes(dst_mac), "big"),
               src=int.from_bytes(mac_bytes(src_mac), "big"), ethertype=ETHERTYPE_IPV4)
    return eth + bytes(ip) + udp


def parse_udp_frame(frame):
    """The fields of an IPv4/UDP frame as a dict (``src_mac``, ``dst_mac``, ``src_ip``,
    ``dst_ip``, ``sport``, ``dport``, ``ip_ok``, ``checksum``, ``checksum_ok``, ``payload``), or
    None when it is not one."""
    frame = bytes(frame)
    if len(frame) < 42:
        return None
    eth = unpack(EthernetHeader, frame)
    ip = unpack(IPv4Header, frame, 14)
    if (eth["ethertype"] != ETHERTYPE_IPV4 or ip["version"] != 4 or ip["ihl"] != 5
            or ip["protocol"] != 17):
        return None
    udp = unpack(UDPHeader, frame, 34)
    tot, ulen = ip["total_length"], udp["length"]
    if not 28 <= tot <= len(frame) - 14 or ulen != tot - 20:
        return None
    seg = frame[34:34 + ulen]
    return dict(src_mac=frame[6:12], dst_mac=frame[0:6], src_ip=ip["src"], dst_ip=ip["dst"],
                sport=udp["src_port"], dport=udp["dst_port"],
                ip_ok=ipv4_checksum(frame[14:34]) == 0, checksum=udp["checksum"],
                checksum_ok=ipv4_checksum(_pseudo(ip["src"], ip["dst"], ulen) + seg) == 0,
                payload=seg[8:])


def wire_octets(frame_len):
    """GMII octets (cycles) a frame of ``frame_len`` octets (no FCS) takes: padding to 60, FCS,
    preamble + SFD, inter-frame gap."""
    return max(frame_len, 60) + 4 + 8 + 12


def _pair(p, what):
    """``(to_target, to_host)`` probabilities of an impairment given as one or a pair."""
    pair = tuple(p) if isinstance(p, (tuple, list)) else (p, p)
    if len(pair) != 2 or not all(isinstance(x, (int, float)) and 0 <= x <= 1 for x in pair):
        raise ValueError(f"{what} {p!r} is not a probability or a (to_target, to_host) pair")
    return tuple(float(x) for x in pair)


def _flip(frame, rng):
    """``frame`` with one random bit of its IPv4 datagram (octet 14 up to the IPv4 total
    length: headers and payload, not the padding) flipped."""
    b = bytearray(frame)
    end = min(len(b), 14 + int.from_bytes(b[16:18], "big"))
    i = rng.randrange(14, max(end, 15))
    b[i] ^= 1 << rng.randrange(8)
    return bytes(b)


class VlUdpTransport:
    """``send`` / ``recv`` of :class:`host.udplink.UdpLink` over a :class:`VlTarget`'s GMII.

    Parameters
    ----------
    vt : VlTarget
    target_mac, target_ip : str
        The target's own addresses (the link's destination; :meth:`bring_up` sets them).
    host_mac, host_ip, host_port :
        The simulated host (the target's configured peer of the link).
    on_frames : callable ``(list of TxFrame) -> None``, optional
        Every other frame the target sends while the transport runs the simulation, after
        every step (an empty list too). None: they are kept in :attr:`others`.
    step : int
        GMII cycles per simulation step while waiting.
    host_turnaround_ns : float
        Modelled host turnaround per exchange, simulated before each datagram is sent.
    on_send : callable ``(frame) -> None``, optional
        Told every frame queued into the target (e.g. ``BoardTimer.sent``, which pairs the
        harness's ``rx_log`` with the frames sent).

    loss, corrupt, dup : float or ``(to_target, to_host)`` pair of floats
        Impairments of the link's own frames, probabilities per frame and per direction
        (a float: the same both ways; default 0: none, and no random numbers drawn). A lost
        frame never reaches the other side; a duplicated one arrives twice (the copies
        corrupted independently); a corrupted one has one random bit of its IPv4 datagram
        (IPv4 header, UDP header, payload: octet 14 up to the IPv4 total length, never the
        Ethernet header or the padding) flipped, its FCS still good (corruption the MAC cannot
        see, e.g. in a switch's memory). A corrupted request goes into the target, whose
        checks drop and count it (``bad_csum`` mostly; ``ignored`` / ``bad_src`` /
        ``malformed`` when the flip hits an address, the protocol or a length). A corrupted
        response is put through the host's kernel checks (:meth:`_response`: IPv4 header
        checksum, UDP checksum present and correct, addresses and ports): every one-bit flip
        fails them, so it is dropped there and counted in ``ignored``, as a host's kernel
        would drop it before the socket; it never reaches :class:`~host.udplink.UdpLink`
        (whose ``bad`` / ``stale`` checks still see the duplicates). Only the link's frames are
        impaired (requests, and the target's datagrams to the host's link port); the
        other frames (RoCE, ARP) pass untouched.
    seed : int
        Seeds the impairments' random numbers.

    ``stats``: ``datagrams_out`` / ``datagrams_in``, ``wire_octets_out`` / ``wire_octets_in``
    (GMII octets of the frames, preamble / FCS / IFG included), ``wait_cycles`` (GMII cycles
    :meth:`recv` ran the simulation), ``turnaround_cycles``, ``ignored`` (frames to the host's
    port that were no link datagram: bad checksum, wrong source), ``rtt_max_cycles`` (GMII
    cycles from queueing the last request datagram to the end of its response frame, the
    longest seen: give :class:`~host.udplink.UdpLink` a timeout well above it); the
    impairments: ``lost_out`` / ``corrupted_out`` / ``duplicated_out`` (requests, counted
    before :meth:`send` queues them: ``datagrams_out`` counts every datagram the host sent,
    lost ones too) and ``lost_in`` / ``corrupted_in`` / ``duplicated_in`` (responses, as the
    target sent them; ``datagrams_in`` counts only the payloads the host received).
    """

    def __init__(self, vt, *, target_mac, target_ip, host_mac=HOST_MAC, host_ip=HOST_IP,
                 host_port=HOST_PORT, on_frames=None, step=STEP, host_turnaround_ns=0.0,
                 on_send=None, loss=0.0, corrupt=0.0, dup=0.0, seed=0):
        self.vt = vt
        self.target_mac, self.target_ip = target_mac, target_ip
        self.host_mac, self.host_ip, self.host_port = host_mac, host_ip, host_port
        self._host_mac = mac_bytes(host_mac)
        self.on_frames = on_frames
        self.on_send = on_send
        self.step = step
        self.mac_hz = vt.params.get("mac_hz", 125e6)
        self.turnaround_cycles = round(host_turnaround_ns * 1e-9 * self.mac_hz)
        self.inbox = []             # response payloads taken out of the target's frames
        self.others = []            # other frames, when there is no on_frames
        self.loss, self.corrupt, self.dup = (_pair(loss, "loss"), _pair(corrupt, "corrupt"),
                                             _pair(dup, "dup"))
        self.rng = random.Random(seed)
        self._sent_at = None        # cycle the last request datagram was queued
        self.stats = dict(datagrams_out=0, datagrams_in=0, wire_octets_out=0, wire_octets_in=0,
                          wait_cycles=0, turnaround_cycles=0, ignored=0, rtt_max_cycles=0,
                          lost_out=0, corrupted_out=0, duplicated_out=0,
                          lost_in=0, corrupted_in=0, duplicated_in=0)

    # ---- time -----------------------------------------------------------------------------
    def clock(self):
        """Simulated seconds since reset (GMII cycles at the board's MAC clock)."""
        return self.vt.cycle / self.mac_hz

    # ---- bring-up -------------------------------------------------------------------------
    def bring_up(self, *, own=True):
        """Configure and enable the target's end of the link over the direct host bus (as the
        UART would on a board); ``own``: set the target's own MAC / IP first."""
        from host.port import ip_value, mac_value
        from hw.target.regbank import TOP_REGS
        R = UDPLINK_REGS

        def w(addr, value):
            _, err = self.vt.access(0, addr, 1, value)
            if err:
                raise RuntimeError(f"host bus refused the write of {value:#x} to {addr:#x}")

        if own:
            mac = mac_value(self.target_mac)   # as TargetPort.set_own
            w(REG_TOP + TOP_REGS["own_mac_hi"], mac >> 32)
            w(REG_TOP + TOP_REGS["own_mac_lo"], mac & 0xFFFFFFFF)
            w(REG_TOP + TOP_REGS["own_ip"], ip_value(self.target_ip))
        mac = mac_value(self.host_mac)
        w(REG_UDPLINK + R["host_mac_hi"], mac >> 32)
        w(REG_UDPLINK + R["host_mac_lo"], mac & 0xFFFFFFFF)
        w(REG_UDPLINK + R["host_ip"], ip_value(self.host_ip))
        w(REG_UDPLINK + R["host_port"], self.host_port)
        w(REG_UDPLINK + R["ctrl"], 1)

    def counters(self):
        """The target's link counters (:data:`UDPLINK_COUNTERS`), read over the direct bus."""
        return {n: self.vt.access(0, REG_UDPLINK + UDPLINK_COUNTER_BASE + 4 * k, 0, 0)[0]
                for k, n in enumerate(UDPLINK_COUNTERS)}

    # ---- frames ---------------------------------------------------------------------------
    def _response(self, f):
        """The payload of ``f`` if it is a link datagram to the host (else None)."""
        raw = f.frame
        if len(raw) < 42 or raw[0:6] != self._host_mac:
            return None
        p = parse_udp_frame(raw)
        if p is None or p["sport"] != HOSTLINK_UDP_PORT or p["dport"] != self.host_port:
            return None
        ok = p["ip_ok"] and p["checksum"] != 0 and p["checksum_ok"]
        if not (f.fcs_ok and ok and p["src_ip"] == ip_int(self.target_ip)
                and p["dst_ip"] == ip_int(self.host_ip)):
            self.stats["ignored"] += 1
            return b""              # to the host's port but unusable: a loss (UdpLink retries)
        return p["payload"]

    # ---- impairments -----------------------------------------------------------------------
    def _impair(self, frame, d, tag):
        """The copies of ``frame`` that reach the other side (direction ``d``: 0 to the target,
        1 to the host), each corrupted or not: a list of ``(frame, corrupted)``."""
        rng, st = self.rng, self.stats
        if self.loss[d] and rng.random() < self.loss[d]:
            st["lost_" + tag] += 1
            return []
        n = 1
        if self.dup[d] and rng.random() < self.dup[d]:
            st["duplicated_" + tag] += 1
            n = 2
        out = []
        for _ in range(n):
            bad = bool(self.corrupt[d]) and rng.random() < self.corrupt[d]
            out.append((_flip(frame, rng) if bad else frame, bad))
            st["corrupted_" + tag] += bad
        return out

    def sift(self, frames):
        """Keep the host-link datagrams of ``frames`` (TxFrame list) for :meth:`recv`; the
        other frames, in order. The impairments to the host apply here: every path of the
        target's frames to the host comes through."""
        out = []
        for f in frames:
            payload = self._response(f)
            if payload is None:
                out.append(f)
                continue
            if not payload:
                continue
            if self._sent_at is not None:
                self.stats["rtt_max_cycles"] = max(self.stats["rtt_max_cycles"],
                                                   f.end - self._sent_at)
            for raw, bad in self._impair(f.frame, 1, "in"):
                got = payload
                if bad:
                    # the host's kernel checks; a frame they refuse is dropped (``ignored``)
                    got = self._response(f._replace(frame=raw))
                    if got is None:
                        self.stats["ignored"] += 1
                    if not got:
                        continue
                self.stats["datagrams_in"] += 1
                self.stats["wire_octets_in"] += wire_octets(len(raw))
                self.inbox.append(got)
        return out

    def _hand(self, frames):
        if self.on_frames is not None:
            self.on_frames(frames)
        else:
            self.others += frames

    def _run(self, cycles, until_tx):
        frames = self.sift(self.vt.run(cycles, until_tx=until_tx))
        self._hand(frames)

    def advance(self, cycles):
        """Let ``cycles`` GMII cycles pass in steps (the network moving)."""
        end = self.vt.cycle + cycles
        while self.vt.cycle < end:
            self._run(min(self.step, end - self.vt.cycle), False)

    # ---- the transport --------------------------------------------------------------------
    def send(self, payload):
        if self.turnaround_cycles:
            c0 = self.vt.cycle
            self.advance(self.turnaround_cycles)
            self.stats["turnaround_cycles"] += self.vt.cycle - c0
        frame = udp_frame(self.host_mac, self.target_mac, self.host_ip, self.target_ip,
                          self.host_port, HOSTLINK_UDP_PORT, payload)
        frame = frame.ljust(60, b"\0")
        self.stats["datagrams_out"] += 1
        self.stats["wire_octets_out"] += wire_octets(len(frame))
        self._sent_at = self.vt.cycle
        for raw, _ in self._impair(frame, 0, "out"):
            self.vt.send(raw)
            if self.on_send is not None:
                self.on_send(raw)

    def recv(self, timeout):
        """The next response payload, running the simulation for up to ``timeout`` simulated
        seconds; None when none came."""
        end = self.vt.cycle + max(1, round(timeout * self.mac_hz))
        c0 = self.vt.cycle
        try:
            while not self.inbox and self.vt.cycle < end:
                self._run(min(self.step, end - self.vt.cycle), True)
        finally:
            self.stats["wait_cycles"] += self.vt.cycle - c0
        return self.inbox.pop(0) if self.inbox else None

    def close(self):
        pass


class CountingUdpLink(UdpLink):
    """:class:`UdpLink` that also counts ``bus_words`` (words the request frames ask the
    target's host bus for: their ``count``) and ``frame_octets_out`` / ``_in`` (the
    host-link frames alone, without the 8-octet datagram headers: what a UART would carry
    for the same frames)."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.stats.update(bus_words=0, frame_octets_out=0, frame_octets_in=0)

    def exchange(self, requests, groups=None):
        out = super().exchange(requests, groups)
        self.stats["bus_words"] += sum(r.count for r in requests)
        self.stats["frame_octets_out"] += sum(request_size(r) for r in requests)
        # a response frame: start, command echo, status, done, the words read, crc8
        self.stats["frame_octets_in"] += sum(5 + len(d or b"") for _, _, d in out)
        return out


def sim_udp_link(transport, *, timeout=LINK_TIMEOUT_S, retries=8, max_words=64, seed=1):
    """A :class:`host.udplink.UdpLink` on ``transport`` whose clock (and so its timeout) is the
    simulated time; its ``stats`` also count ``bus_words`` and ``frame_octets_out`` / ``_in``
    (the frames without datagram headers)."""
    return CountingUdpLink(transport, timeout=timeout, retries=retries,
                           max_words=max_words, seed=seed, clock=transport.clock)


class VlUdpSystemBench(VlSystemBench):
    """:class:`sim.system.VlSystemBench` whose host driver (and every ``self.port``
    access) runs over the UDP host link (:class:`VlUdpTransport`) instead of the direct
    host bus; the link is brought up over the direct bus first (:meth:`_start`).
    ``poll_all``: the wait loop's host step is :meth:`KbtpDriver.poll_all` (every pending
    message in one pass) instead of one :meth:`~KbtpDriver.poll`. ``driver_kw``: extra
    KbtpDriver options (e.g. ``max_messages``); ``link_kw``: :func:`sim_udp_link`
    options (``timeout``, ``retries``); ``transport_kw``: :class:`VlUdpTransport` options (the
    impairments ``loss`` / ``corrupt`` / ``dup`` and their ``seed``)."""

    def __init__(self, vt, *, host_turnaround_ns=0.0, poll_all=True, driver_kw=None,
                 link_kw=None, transport_kw=None, **kw):
        super().__init__(vt, **kw)
        self.transport = VlUdpTransport(vt, target_mac=T_MAC, target_ip=T_IP,
                                        on_frames=self._link_frames,
                                        host_turnaround_ns=host_turnaround_ns,
                                        step=self.step, **(transport_kw or {}))
        self.udplink = sim_udp_link(self.transport, **(link_kw or {}))
        self.direct_port = self.port
        self.port = TargetPort(link_access(self.udplink))
        self.driver = driver_for(self.port, self.cfg, vt.params, **(driver_kw or {}))
        self.poll_all = poll_all
        self._held = []

    async def _start(self):
        self.transport.bring_up()

    def _deliver(self, frames):
        self._net_at = self.vt.cycle
        self._collect_in()
        if not self.net_on:
            self._held += frames
            return
        frames, self._held = self._held + frames, []
        self.net_step([(f.frame, f.fcs_ok, f.start * PERIOD_NS) for f in frames])

    def _link_frames(self, frames):
        """The transport's steps: the network moves while the host waits for the link."""
        if self._in_net:
            self._held += frames
            return
        self._in_net = True
        try:
            self._deliver(frames)
        finally:
            self._in_net = False

    def _tx_frames(self):
        return self.transport.sift(self.vt.run(0))

    async def host_step(self):
        if not self.poll_all:
            return await super().host_step()
        hs = await self.driver.poll_all(now_ms=self.cycles * PERIOD_NS / 1e6)
        self.handled += hs
        return hs[-1] if hs else None

    async def wait(self, cycles):
        end = self.vt.cycle + cycles
        while self.vt.cycle < end:
            out = self.transport.sift(self.vt.run(min(self.step, end - self.vt.cycle)))
            self._in_net = True
            try:
                self._deliver(out)
            finally:
                self._in_net = False
            if self.host_on:
                for _ in range(1 if self.poll_all else 4):
                    if await self.host_step() is None:
                        break

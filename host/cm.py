# Ref: docs/roce-layouts.md §7 (CM on QP1: REQ/REP/RTU/DREQ/DREP/REJ, IP CM service §7.6,
#      field use §7.7, Starting PSN direction §7.8, timers §7.9, minimal behaviour §7.10);
#      hw/rdma/rawq.py (raw frame queues: word formats); host/driver.py (open_qp, disconnect).
"""The target side of the InfiniBand Communication Manager, over the raw frame queues.

The gateware hands every QP1 (GSI) datagram addressed to the target to the host
(``Q_RAW_RX``) and sends whatever complete frame the host pushes (``Q_RAW_TX``).
:class:`CmServer` is the passive side of rdma_cm over those queues, for a
:class:`host.driver.KbtpDriver`:

* REQ for our IP CM service (TCP port space, ``cm_port``) and our GID -> pick a free transport
  QP, ``driver.open_qp`` with the REQ's QPN, Starting PSN (our send PSN, §7.8), path MTU, retry
  counts, ACK timeout, flow label (-> UDP source port) and the peer's MAC/IP, straight to RTS
  (rdma_cm moves the passive QP to RTR and RTS before it sends the REP); then REP, repeated on
  its timer until the RTU (or until the first message arrives on the QP: a lost RTU must not
  keep the connection waiting).
* Duplicate REQ -> the REP again (REP_SENT) or REJ stale (TIMEWAIT).
* DREQ -> DREP, QP to ERROR, ``driver.disconnect``; :meth:`disconnect` is the target-initiated
  DREQ (after the driver asked for it with a ``("disconnect", qp, ...)`` action).
* REJ: reason 1 (no QP available) when every QP has a connection, 8 for another service,
  12 for another GID, 27 (insufficient responder resources) when the initiator's responder
  resources are fewer than the READs the KBTP engine keeps out (hw/kbtp/movers.py
  ``READ_DEPTH``): the engine would otherwise send more RDMA READs than the initiator can hold.
* A QP the transport moved to error (the requester's retry or RNR retry count exhausted, a
  fatal NAK from the peer: the bitmap ``driver.qp_errors()`` reads) -> :meth:`reap_errors`
  disconnects it as the target (DREQ, repeated until the DREP or its retries run out), and the
  time-wait or the last retry frees the QP for the next REQ. A QP is freed the same way when
  its REP is never answered (REP retries exhausted) and after a DREQ from the peer.

Encoding: MADs with :func:`roce.cm.encode_mad` / :func:`roce.cm.decode_mad` (the CM layouts of
:mod:`hw.headers`), frames with :func:`roce.frames.build_roce` / :func:`roce.frames.parse_frame`
(IPv4 checksum and ICRC with zlib), all pure functions. The host computes the ICRC; the gateware
only adds the FCS.

API
---
``CmServer(driver, port, *, mac, ip, cm_port=18515, qpn_base=QPN_BASE, log=None, seed=0)``
``await poll(now_us=None)`` handles queued CM frames and timers; returns the number of frames.
``await disconnect(qp)`` target-initiated disconnect.
``await reap_errors(mask)`` target-initiated disconnect of every connected QP whose bit is set.
``conns`` QP index -> :class:`CmLink` (state ``REP_SENT``, ``ESTABLISHED``, ``DREQ_SENT``,
``TIMEWAIT``); ``stats`` counts of MADs in and out by name.
"""

import random
import time
from dataclasses import dataclass

from hw.headers import (DETH, GSI_QKEY, IP_CM_SERVICE_ID_TCP, BthOpcode, CmAttr, pack)
from hw.iface import QP_INDEX_BITS, QPN_BASE, QpState, REG_QP, Space
from hw.rdma.qp import QP_STRIDE
from hw.kbtp.movers import READ_DEPTH
from hw.rdma.rawq import Q_RAW_RX, Q_RAW_TX
from roce.rc import rxe_udp_sport
from roce.cm import (REJ_INSUFFICIENT_RESP_RES, REJ_INVALID_GID, REJ_INVALID_SERVICE_ID,
                     REJ_STALE, ca_guid, decode_mad, encode_mad, gid_of)
from roce.frames import FrameError, build_roce, ip_int, mac_bytes, parse_frame

__all__ = ["CmServer", "CmLink", "REJ_NO_QP", "raw_pop", "raw_push"]

#: IB CM REJ reason 1: no QP available.
REJ_NO_QP = 1
#: UDP source port of QP1 datagrams (Linux hash_32(1, 14) + 0xC000, as rxe sends them).
QP1_SPORT = 0xC000 + (((1 * 0x61C88647) & 0xFFFFFFFF) >> 18)
_MTU_CODES = (1, 2, 3, 4, 5)            # IB MTU enum 256 .. 4096 = the QP table's pmtu code


def _cm_timeout_us(t):
    """CM timeout code -> microseconds, rounded as Linux does (2^(t-8) ms)."""
    return (1 << max(0, t - 8)) * 1000


async def raw_pop(port):
    """One frame from ``Q_RAW_RX`` (bytes), or None when the queue is empty."""
    n, err = await port.access(Space.QUEUE, Q_RAW_RX, 0, 0)
    if err:
        return None
    n &= 0xFFFF
    out = bytearray()
    for _ in range((n + 3) // 4):
        w, err = await port.access(Space.QUEUE, Q_RAW_RX, 0, 0)
        if err:
            raise RuntimeError("raw RX queue: data word refused")
        out += w.to_bytes(4, "little")
    return bytes(out[:n])


async def raw_push(port, frame, *, wait_polls=10000):
    """Push one frame (no FCS) on ``Q_RAW_TX``; waits for room first. True when queued."""
    for _ in range(wait_polls):
        free, _ = await port.access(Space.QUEUE, Q_RAW_TX, 0, 0)
        if free >= len(frame):
            break
    else:
        return False
    _, err = await port.access(Space.QUEUE, Q_RAW_TX, 1, len(frame))
    if err:
        return False
    raw = bytes(frame) + bytes(-len(frame) % 4)
    for k in range(0, len(raw), 4):
        _, err = await port.access(Space.QUEUE, Q_RAW_TX, 1,
                                   int.from_bytes(raw[k:k + 4], "little"))
    return not err


@dataclass
class CmLink:
    """One passive CM connection on transport QP ``qp``."""
    qp: int
    qpn: int
    peer_ip: int
    peer_mac: bytes
    peer_qpn: int
    local_comm_id: int
    remote_comm_id: int
    tid: int
    state: str = "REP_SENT"
    last_mad: bytes = None
    deadline: int = None
    interval: int = 0
    retries: int = 0
    timewait_us: int = 1000


class CmServer:
    """Passive rdma_cm endpoint over the raw frame queues (see the module docstring).

    Parameters
    ----------
    driver : host.driver.KbtpDriver
        Its ``port`` is used for the queues; its ``n_qp`` QPs are handed out.
    mac, ip : str or bytes / str or int
        The target's addresses (as programmed in REG_TOP).
    cm_port : int
        RDMA CM port (IP CM service ID = 0x0000000001060000 | port).
    qpn_base : int
        Local QPN of QP index ``i`` is ``qpn_base + i + 2**QP_INDEX_BITS * g`` (``g`` counts
        the connections of that index, so a late packet of an old connection never matches).
        The hardware finds a QP by ``(qpn - QPN_BASE) mod 2**QP_INDEX_BITS`` (hw/iface.py), so
        ``qpn_base`` must be ``QPN_BASE`` (the default) for the target's transport.
    responder_resources, initiator_depth : int
        Advertised in the REP (responder replay cache depth, requester READ depth; the REP's
        initiator depth is the smaller of ``initiator_depth`` and the REQ's responder
        resources).
    read_depth : int
        The RDMA READs the target keeps out on a connection (the KBTP engine's
        :data:`~hw.kbtp.movers.READ_DEPTH`): a REQ whose responder resources are fewer is
        refused (REJ 27), and ``initiator_depth`` may not be fewer.
    """

    def __init__(self, driver, port=None, *, mac, ip, cm_port=18515, qpn_base=QPN_BASE, log=None,
                 seed=0, responder_resources=4, initiator_depth=READ_DEPTH,
                 target_ack_delay=15, rnr_retry=7, max_ack_timeout=31, read_depth=READ_DEPTH):
        if initiator_depth < read_depth:
            raise ValueError(f"initiator_depth {initiator_depth} is fewer than the READs the "
                             f"engine keeps out ({read_depth})")
        self.read_depth = read_depth
        self.driver = driver
        self.port = port or driver.port
        # Our QP's own ACK timeout (IB code: 4.096 us * 2^t) is the REQ's Local ACK Timeout,
        # capped here: a simulated target whose timers run on simulated cycles caps it so that
        # a lost frame is retransmitted within seconds of wall time.
        self.max_ack_timeout = max_ack_timeout
        self.mac, self.ip = mac_bytes(mac), ip_int(ip)
        self.cm_port, self.qpn_base = cm_port, qpn_base
        self.log = log or (lambda s: None)
        self.rng = random.Random(seed)
        self.rr, self.ri = responder_resources, initiator_depth
        self.target_ack_delay, self.rnr_retry = target_ack_delay, rnr_retry
        self.conns: dict[int, CmLink] = {}
        self.gen = [0] * driver.n_qp
        self.psn = 0
        self.stats: dict[str, int] = {}
        self._t0 = time.monotonic()
        self.now = 0

    # ---- frames ------------------------------------------------------------------------------
    def _count(self, what):
        self.stats[what] = self.stats.get(what, 0) + 1

    async def _emit(self, peer_mac, peer_ip, mad, what):
        frame = build_roce(self.mac, peer_mac, self.ip, peer_ip, QP1_SPORT,
                           opcode=BthOpcode.UD_SEND_ONLY.value, dest_qp=1, psn=self.psn,
                           ackreq=1, ext=pack(DETH, qkey=GSI_QKEY, src_qp=1), payload=mad)
        self.psn = (self.psn + 1) & 0xFFFFFF
        self._count("out_" + what)
        if not await raw_push(self.port, frame):
            self._count("tx_refused")

    async def _send(self, c, mad, what, interval_us, retries):
        c.last_mad, c.interval, c.retries = mad, interval_us, retries
        c.deadline = self.now + interval_us
        await self._emit(c.peer_mac, c.peer_ip, mad, what)

    async def _reject(self, pkt, tid, remote_comm_id, reason):
        self.log(f"CM REJ reason {reason} to {pkt.src_ip:#x}")
        await self._emit(pkt.eth_src, pkt.src_ip,
                         encode_mad(CmAttr.REJ, tid, local_comm_id=0,
                                    remote_comm_id=remote_comm_id, msg_rejected=0,
                                    reason=reason), "REJ")

    # ---- public ------------------------------------------------------------------------------
    async def poll(self, now_us=None):
        """Handle every queued CM frame, then the timers; returns the frames handled."""
        self.now = int((time.monotonic() - self._t0) * 1e6) if now_us is None else now_us
        n = 0
        while (frame := await raw_pop(self.port)) is not None:
            n += 1
            await self.receive(frame)
        await self._timers()
        return n

    async def receive(self, frame):
        """One frame from the raw RX queue."""
        try:
            kind, pkt = parse_frame(frame)
        except FrameError as e:
            self._count("bad_" + e.kind)
            return
        if kind != "roce" or pkt.dest_qp != 1 or pkt.opcode != BthOpcode.UD_SEND_ONLY.value \
                or len(pkt.payload) < 256:
            self._count("not_cm")
            return
        hdr, body = decode_mad(pkt.payload[:256])
        if body is None:
            self._count("not_cm")
            return
        attr = hdr["attr_id"]
        name = CmAttr(attr).name
        self._count("in_" + name)
        h = {CmAttr.REQ.value: self._on_req, CmAttr.RTU.value: self._on_rtu,
             CmAttr.DREQ.value: self._on_dreq, CmAttr.DREP.value: self._on_drep,
             CmAttr.REJ.value: self._on_rej}.get(attr)
        if h is not None:
            await h(pkt, hdr, body)

    def established(self, qp):
        """A message arrived on ``qp``: a lost RTU must not keep the REP timer running."""
        c = self.conns.get(qp)
        if c is not None and c.state == "REP_SENT":
            c.state, c.deadline, c.last_mad = "ESTABLISHED", None, None

    async def disconnect(self, qp):
        """Target-initiated disconnect: QP to ERROR, DREQ (repeated until the DREP)."""
        c = self.conns.get(qp)
        if c is None or c.state not in ("REP_SENT", "ESTABLISHED"):
            return
        await self._qp_error(c)
        await self.driver.disconnect(qp)
        c.state = "DREQ_SENT"
        c.tid = self.rng.getrandbits(64)
        mad = encode_mad(CmAttr.DREQ, c.tid, local_comm_id=c.local_comm_id,
                         remote_comm_id=c.remote_comm_id, remote_qpn=c.peer_qpn)
        self.log(f"CM DREQ qp {qp}")
        await self._send(c, mad, "DREQ", _cm_timeout_us(20), 15)

    async def reap_errors(self, mask):
        """Disconnect (as :meth:`disconnect`) every connection whose QP is in error in
        ``mask`` (bit i: QP index i; ``driver.qp_errors()``). The initiator's side of such a QP
        cannot complete anything any more (IBTA: a QP in error flushes its work requests), and
        a peer that stopped answering (what exhausts the retry count) sends no DREQ itself: so
        the target disconnects, and the QP is reused after the DREP and the time-wait, or after
        the DREQ's last retry if the peer is gone. Returns the QP indices disconnected."""
        done = []
        for qp, c in sorted(self.conns.items()):
            if mask >> qp & 1 and c.state in ("REP_SENT", "ESTABLISHED"):
                self.log(f"CM qp {qp}: the transport moved it to error, disconnect")
                self._count("transport_errors")
                await self.disconnect(qp)
                done.append(qp)
        return done

    # ---- handlers ------------------------------------------------------------------------------
    async def _on_req(self, pkt, hdr, req):
        src = pkt.src_ip
        for c in self.conns.values():
            if c.peer_ip == src and c.remote_comm_id == req["local_comm_id"]:
                if c.state == "REP_SENT" and c.last_mad is not None:
                    await self._emit(c.peer_mac, c.peer_ip, c.last_mad, "REP")
                elif c.state == "TIMEWAIT":
                    await self._reject(pkt, hdr["tid"], req["local_comm_id"], REJ_STALE)
                return
        if req["service_id"] != IP_CM_SERVICE_ID_TCP | self.cm_port:
            return await self._reject(pkt, hdr["tid"], req["local_comm_id"],
                                      REJ_INVALID_SERVICE_ID)
        if req["primary_remote_gid"] != gid_of(self.ip) or req["path_mtu"] not in _MTU_CODES:
            return await self._reject(pkt, hdr["tid"], req["local_comm_id"], REJ_INVALID_GID)
        if req["responder_resources"] < self.read_depth:
            self.log(f"CM REQ from {src:#x}: responder resources {req['responder_resources']}, "
                     f"fewer than the {self.read_depth} RDMA READs the target keeps out")
            return await self._reject(pkt, hdr["tid"], req["local_comm_id"],
                                      REJ_INSUFFICIENT_RESP_RES)
        qp = next((i for i in range(self.driver.n_qp) if i not in self.conns), None)
        if qp is None:
            return await self._reject(pkt, hdr["tid"], req["local_comm_id"], REJ_NO_QP)
        qpn = self.qpn_base + qp + (1 << QP_INDEX_BITS) * self.gen[qp]
        self.gen[qp] = (self.gen[qp] + 1) % 1024
        epsn = self.rng.getrandbits(24)
        # rdma_cm programs the passive QP (RTR, then RTS) before the REP: packets may follow
        # the RTU at once. Our QP sends from the REQ's Starting PSN and expects ours (§7.8).
        await self.driver.open_qp(
            qp, state=QpState.RTS, local_qpn=qpn, remote_qpn=req["local_qpn"],
            peer_mac=int.from_bytes(pkt.eth_src, "big"), peer_ip=src,
            udp_sport=rxe_udp_sport(0, 0, req["primary_flow_label"]), pmtu=req["path_mtu"],
            rq_psn=epsn, sq_psn=req["starting_psn"],
            timeout=min(req["primary_local_ack_timeout"], self.max_ack_timeout),
            retry_cnt=req["retry_count"], rnr_retry=req["rnr_retry_count"])
        c = CmLink(qp, qpn, src, pkt.eth_src, req["local_qpn"],
                   self.rng.getrandbits(32) | 1, req["local_comm_id"], hdr["tid"],
                   timewait_us=_cm_timeout_us(req["primary_local_ack_timeout"]))
        self.conns[qp] = c
        mad = encode_mad(CmAttr.REP, hdr["tid"], local_comm_id=c.local_comm_id,
                         remote_comm_id=c.remote_comm_id, local_qpn=qpn, starting_psn=epsn,
                         responder_resources=self.rr,
                         initiator_depth=min(self.ri, req["responder_resources"]),
                         target_ack_delay=self.target_ack_delay, rnr_retry_count=self.rnr_retry,
                         local_ca_guid=ca_guid(self.mac))
        self.log(f"CM REQ from {src:#x} qpn {req['local_qpn']:#x} -> qp {qp} (qpn {qpn:#x}) "
                 f"pmtu code {req['path_mtu']} psn {req['starting_psn']:#x}/{epsn:#x}")
        await self._send(c, mad, "REP", _cm_timeout_us(req["local_cm_response_timeout"]),
                         req["max_cm_retries"])

    def _find(self, local_comm_id):
        return next((c for c in self.conns.values() if c.local_comm_id == local_comm_id), None)

    async def _on_rtu(self, pkt, hdr, rtu):
        c = self._find(rtu["remote_comm_id"])
        if c is not None and c.remote_comm_id == rtu["local_comm_id"]:
            self.established(c.qp)
            self.log(f"CM RTU qp {c.qp}: established")

    async def _on_dreq(self, pkt, hdr, dreq):
        c = self._find(dreq["remote_comm_id"])
        drep = encode_mad(CmAttr.DREP, hdr["tid"], local_comm_id=dreq["remote_comm_id"],
                          remote_comm_id=dreq["local_comm_id"])
        if c is not None and c.remote_comm_id == dreq["local_comm_id"] and \
                c.state in ("REP_SENT", "ESTABLISHED", "DREQ_SENT"):
            self.log(f"CM DREQ qp {c.qp}: DREP, disconnect")
            await self._qp_error(c)
            await self.driver.disconnect(c.qp)
            self._timewait(c)
        await self._emit(pkt.eth_src, pkt.src_ip, drep, "DREP")

    async def _on_drep(self, pkt, hdr, drep):
        c = self._find(drep["remote_comm_id"])
        if c is not None and c.state == "DREQ_SENT":
            self._timewait(c)

    async def _on_rej(self, pkt, hdr, rej):
        c = self._find(rej["remote_comm_id"])
        if c is not None and c.state == "REP_SENT":
            self.log(f"CM REJ from peer, qp {c.qp}, reason {rej['reason']}")
            await self._qp_error(c)
            await self.driver.disconnect(c.qp)
            del self.conns[c.qp]

    # ---- helpers --------------------------------------------------------------------------------
    async def _qp_error(self, c):
        await self.port.wreg(REG_QP + QP_STRIDE * c.qp, QpState.ERROR.value)

    def _timewait(self, c):
        c.state, c.last_mad = "TIMEWAIT", None
        c.deadline = self.now + max(c.timewait_us, 1000)

    async def _timers(self):
        for c in list(self.conns.values()):
            if c.deadline is None or self.now < c.deadline:
                continue
            if c.state == "TIMEWAIT" or c.retries <= 0:
                if c.state == "REP_SENT":            # never confirmed: give the QP back
                    await self._qp_error(c)
                    await self.driver.disconnect(c.qp)
                del self.conns[c.qp]
                continue
            c.retries -= 1
            c.deadline = self.now + c.interval
            self._count("retransmissions")
            await self._emit(c.peer_mac, c.peer_ip, c.last_mad, "retry")

# Ref: docs/roce-layouts.md §7 (CM on QP1: MAD header, REQ/REP/RTU/DREQ/DREP/REJ, IP CM
#      service §7.6, field use §7.7, Starting PSN direction §7.8, timers and TID §7.9,
#      minimal behaviour §7.10), §9 (C1 worked examples); docs/softroce-vm.md.
"""InfiniBand Communication Manager over RoCEv2 QP1 for :class:`roce.rc.RoceEndpoint`.

Speaks the subset rdma_cm uses: REQ -> REP -> RTU to connect, DREQ -> DREP to disconnect,
REJ to refuse, with MAD retransmission timers. The Starting PSN rule (§7.8): each side writes
its own *expected receive* PSN into the message it sends; the receiver of the message sends
from it.
"""

from dataclasses import dataclass, field

from hw.headers import (
    CM_CLASS_VERSION, CM_MGMT_CLASS, IP_CM_SERVICE_ID_TCP, MAD_METHOD_SEND, CmAttr, CmDrep,
    CmDreq, CmRej, CmRep, CmReq, CmRtu, IpCmHeader, MadHeader, pack, unpack,
)
from roce.frames import PMTU_CODES, QPState, ip_int, rxe_udp_sport

__all__ = ["CmAgent", "CmConn", "gid_of", "ca_guid", "cm_ack_timeout", "encode_mad",
           "decode_mad", "REJ_INVALID_SERVICE_ID", "REJ_INVALID_GID", "REJ_CONSUMER",
           "REJ_STALE", "REJ_TIMEOUT"]

REJ_TIMEOUT = 4
REJ_INVALID_SERVICE_ID = 8
REJ_STALE = 10
REJ_INVALID_GID = 12
REJ_INSUFFICIENT_RESP_RES = 27
REJ_CONSUMER = 28
_MTU_CODE = {v: k for k, v in PMTU_CODES.items()}
_BODY = {CmAttr.REQ.value: CmReq, CmAttr.REP.value: CmRep, CmAttr.RTU.value: CmRtu,
         CmAttr.DREQ.value: CmDreq, CmAttr.DREP.value: CmDrep, CmAttr.REJ.value: CmRej}


def gid_of(ip):
    """RoCEv2 GID of an IPv4 address: ::ffff:a.b.c.d as a 128-bit int."""
    return (0xFFFF << 32) | ip_int(ip)


def ca_guid(mac):
    """Modified EUI-64 of a MAC: 52:54:00:00:00:01 -> 0x505400fffe000001."""
    b = bytes([mac[0] ^ 0x02]) + mac[1:3] + b"\xff\xfe" + mac[3:6]
    return int.from_bytes(b, "big")


def cm_ack_timeout(ca_ack_delay, packet_life):
    """Active side's QP local ACK timeout from REP Target ACK Delay and path life (§7.7)."""
    t = packet_life + 1
    if t >= ca_ack_delay:
        t += ca_ack_delay >= t - 1
    else:
        t = ca_ack_delay + (t >= ca_ack_delay - 1)
    return min(31, t)


def _ms_us(t):
    """CM timeout code t -> 4.096 us x 2^t, rounded as Linux does to 2^(t-8) ms, in us."""
    return (1 << max(0, t - 8)) * 1000


def _pd_int(data, size):
    data = bytes(data)
    if len(data) > size:
        raise ValueError(f"private data longer than {size} octets")
    return int.from_bytes(data.ljust(size, b"\x00"), "big")


def encode_mad(attr, tid, **body):
    """MAD header + CM message body; ``private_data`` may be given as bytes."""
    attr = attr.value if isinstance(attr, CmAttr) else attr
    struct = _BODY[attr]
    if isinstance(body.get("private_data"), (bytes, bytearray)):
        bits = dict(struct.WIRE_FIELDS)["private_data"]
        body["private_data"] = _pd_int(body["private_data"], bits // 8)
    hdr = pack(MadHeader, base_version=1, mgmt_class=CM_MGMT_CLASS,
               class_version=CM_CLASS_VERSION, method=MAD_METHOD_SEND, tid=tid,
               attr_id=attr)
    return hdr + pack(struct, **body)


def decode_mad(mad):
    """(header dict, body dict or None); private data comes back as bytes."""
    hdr = unpack(MadHeader, mad)
    struct = _BODY.get(hdr["attr_id"])
    if struct is None or len(mad) < 24 + struct.SIZE:
        return hdr, None
    body = unpack(struct, mad, 24)
    bits = dict(struct.WIRE_FIELDS)["private_data"]
    body["private_data"] = body["private_data"].to_bytes(bits // 8, "big")
    return hdr, body


@dataclass
class CmConn:
    """One CM connection (either side)."""
    role: str                       # "active" or "passive"
    qp: object
    peer_ip: int
    local_comm_id: int
    remote_comm_id: int = 0
    state: str = "IDLE"
    tid: int = 0                    # TID of the REQ (reused by REP, RTU, REJ)
    dreq_tid: int = 0
    peer_qpn: int = 0
    on_connect: object = None
    on_disconnect: object = None
    on_reject: object = None
    reject_reason: int = None
    private_data: bytes = b""       # the peer's consumer private data
    params: dict = field(default_factory=dict)
    last_mad: bytes = None          # for retransmission
    deadline: int = None
    interval: int = 0
    retries_left: int = 0
    timewait_us: int = 0


@dataclass
class _Listener:
    port: int
    on_connect: object
    accept: object
    opts: dict


class CmAgent:
    """The CM state machines of one endpoint (owned by :class:`roce.rc.RoceEndpoint`)."""

    def __init__(self, ep):
        self.ep = ep
        self.listeners = {}
        self.conns = []
        self.qp1_psn = 0
        self.tid_hi = ep.rng.getrandbits(32)

    # ---- API ------------------------------------------------------------------------------
    def listen(self, port, on_connect=None, *, accept=None, on_disconnect=None,
               responder_resources=1, initiator_depth=1, rnr_retry=7, target_ack_delay=15,
               qp_params=None, local_comm_id=None, private_data=b""):
        """Accept REQs for IP CM service ``port`` (TCP port space).

        ``accept(req_info) -> bool`` may refuse (REJ reason 28); ``on_connect(qp)`` runs
        when the RTU (or the first RC packet) arrives. ``qp_params`` go to ``create_qp``
        (e.g. ``qpn``, ``epsn`` = the Starting PSN put into the REP, ``on_message``).
        """
        self.listeners[port] = _Listener(port, on_connect, accept, dict(
            responder_resources=responder_resources, initiator_depth=initiator_depth,
            rnr_retry=rnr_retry, target_ack_delay=target_ack_delay,
            qp_params=dict(qp_params or {}), local_comm_id=local_comm_id,
            private_data=private_data, on_disconnect=on_disconnect))

    def connect(self, dst_ip, port, on_connect=None, *, src_port=None, qp_params=None,
                private_data=b"", retry_count=7, rnr_retry=7, responder_resources=1,
                initiator_depth=1, pmtu=1024, local_ack_timeout=19, cm_response_timeout=20,
                max_cm_retries=15, local_comm_id=None, on_disconnect=None, on_reject=None):
        """Send a REQ to ``dst_ip``:``port``; return the (INIT) QP that the REP moves to RTS.

        ``responder_resources``: the RDMA READs of ours the peer may have out at once; 1 by
        default, as rdma_cm's (the REQ of the rxe capture, tests/roce/test_rc_cm.py). A KBTP
        initiator offers more: the target READs its store data, and host/cm.py refuses fewer
        than the engine's READ depth.

        ``qp_params['epsn']`` is the Starting PSN of the REQ (random when absent).
        """
        params = dict(qp_params or {})
        params.setdefault("epsn", self.ep.rng.getrandbits(24))
        qp = self.ep.create_qp(state=QPState.INIT, **params)
        if src_port is None:
            src_port = self.ep.rng.randrange(0x8000, 0x10000)
        conn = CmConn("active", qp, ip_int(dst_ip), local_comm_id or self._comm_id(),
                      on_connect=on_connect, on_disconnect=on_disconnect, on_reject=on_reject)
        conn.tid = (self.tid_hi << 32) | int.from_bytes(
            conn.local_comm_id.to_bytes(4, "little"), "big")
        conn.params = dict(port=port, src_port=src_port, private_data=private_data,
                           retry_count=retry_count, rnr_retry=rnr_retry,
                           responder_resources=responder_resources,
                           initiator_depth=initiator_depth, pmtu=pmtu,
                           local_ack_timeout=local_ack_timeout,
                           cm_response_timeout=cm_response_timeout,
                           max_cm_retries=max_cm_retries)
        qp.cm = self
        qp.cm_conn = conn
        conn.state = "ARP"
        self.conns.append(conn)
        self._try_send_req(conn)
        return qp

    def disconnect(self, qp):
        """DREQ for the connection of ``qp``; the QP goes to Error first (as rdma_cm does)."""
        conn = getattr(qp, "cm_conn", None)
        if conn is None or conn.state not in ("ESTABLISHED", "REP_SENT"):
            raise RuntimeError("QP has no established CM connection")
        qp.modify(state=QPState.ERROR)
        conn.dreq_tid = (self.tid_hi << 32) | int.from_bytes(
            conn.local_comm_id.to_bytes(4, "little"), "big")
        conn.state = "DREQ_SENT"
        mad = encode_mad(CmAttr.DREQ, conn.dreq_tid, local_comm_id=conn.local_comm_id,
                         remote_comm_id=conn.remote_comm_id, remote_qpn=conn.peer_qpn)
        self._send(conn, mad, retransmit_us=_ms_us(20), retries=15)

    # ---- timers ---------------------------------------------------------------------------
    def deadline(self):
        ds = [c.deadline for c in self.conns if c.deadline is not None]
        return min(ds) if ds else None

    def tick(self, now):
        for c in list(self.conns):
            if c.state == "ARP":
                self._try_send_req(c)
                continue
            if c.deadline is None or now < c.deadline:
                continue
            if c.state == "TIMEWAIT":
                self.conns.remove(c)
                continue
            if c.retries_left <= 0:
                self._give_up(c)
                continue
            c.retries_left -= 1
            self.ep.counters.cm_retransmissions += 1
            self._emit(c.peer_ip, c.last_mad)
            c.deadline = now + c.interval

    def rc_traffic(self, qp):
        """An RC packet arrived on ``qp``: a lost RTU must not keep the target waiting."""
        conn = getattr(qp, "cm_conn", None)
        if conn is not None and conn.state == "REP_SENT":
            self._established(conn)

    # ---- receive --------------------------------------------------------------------------
    def receive(self, pkt):
        mad = pkt.payload
        if len(mad) < 256:
            self.ep.counters.malformed += 1
            return
        hdr, body = decode_mad(mad)
        if hdr["base_version"] != 1 or hdr["mgmt_class"] != CM_MGMT_CLASS or \
                hdr["class_version"] != CM_CLASS_VERSION or hdr["method"] != MAD_METHOD_SEND or \
                body is None:
            self.ep.counters.malformed += 1
            return
        attr = hdr["attr_id"]
        handler = {CmAttr.REQ.value: self._on_req, CmAttr.REP.value: self._on_rep,
                   CmAttr.RTU.value: self._on_rtu, CmAttr.DREQ.value: self._on_dreq,
                   CmAttr.DREP.value: self._on_drep, CmAttr.REJ.value: self._on_rej}[attr]
        handler(pkt, hdr, body)

    def _find(self, local_comm_id):
        return next((c for c in self.conns if c.local_comm_id == local_comm_id), None)

    def _on_req(self, pkt, hdr, req):
        src = pkt.src_ip
        dup = next((c for c in self.conns if c.role == "passive" and c.peer_ip == src
                    and c.remote_comm_id == req["local_comm_id"]), None)
        if dup is not None:
            if dup.state == "TIMEWAIT":
                self._reject(src, hdr["tid"], req["local_comm_id"], REJ_STALE)
            return                                  # the REP has its own timer (§7.9)
        port = req["service_id"] & 0xFFFF
        lst = self.listeners.get(port)
        if lst is None or req["service_id"] & ~0xFFFF != IP_CM_SERVICE_ID_TCP:
            return self._reject(src, hdr["tid"], req["local_comm_id"], REJ_INVALID_SERVICE_ID)
        if req["primary_remote_gid"] != gid_of(self.ep.ip) or req["path_mtu"] not in PMTU_CODES:
            return self._reject(src, hdr["tid"], req["local_comm_id"], REJ_INVALID_GID)
        ipcm = unpack(IpCmHeader, req["private_data"])
        info = dict(req=req, src_ip=src, src_port=ipcm["src_port"],
                    private_data=req["private_data"][36:])
        if lst.accept is not None and not lst.accept(info):
            return self._reject(src, hdr["tid"], req["local_comm_id"], REJ_CONSUMER)
        o = lst.opts
        params = dict(o["qp_params"])
        epsn = params.pop("epsn", None)
        if epsn is None:
            epsn = self.ep.rng.getrandbits(24)
        qp = self.ep.create_qp(state=QPState.INIT, **params)
        conn = CmConn("passive", qp, src, o["local_comm_id"] or self._comm_id(),
                      remote_comm_id=req["local_comm_id"], tid=hdr["tid"],
                      peer_qpn=req["local_qpn"], on_connect=lst.on_connect,
                      on_disconnect=o["on_disconnect"], private_data=info["private_data"])
        qp.cm, qp.cm_conn = self, conn
        # rdma_cm moves the target QP to RTR/RTS before sending the REP (§7.8).
        qp.modify(dest_qpn=req["local_qpn"], remote_ip=src, remote_mac=pkt.eth_src,
                  sq_psn=req["starting_psn"], epsn=epsn, pmtu=PMTU_CODES[req["path_mtu"]],
                  retry_cnt=req["retry_count"], rnr_retry=req["rnr_retry_count"],
                  timeout=req["primary_local_ack_timeout"],
                  sport=rxe_udp_sport(0, 0, req["primary_flow_label"]),
                  tos=req["primary_traffic_class"], ttl=req["primary_hop_limit"] or 64,
                  max_rd_atomic=min(o["initiator_depth"], req["responder_resources"]),
                  max_dest_rd_atomic=max(o["responder_resources"], req["initiator_depth"]),
                  state=QPState.RTS)
        self.conns.append(conn)
        mad = encode_mad(CmAttr.REP, hdr["tid"], local_comm_id=conn.local_comm_id,
                         remote_comm_id=conn.remote_comm_id, local_qpn=qp.qpn,
                         starting_psn=epsn, responder_resources=o["responder_resources"],
                         initiator_depth=min(o["initiator_depth"], req["responder_resources"]),
                         target_ack_delay=o["target_ack_delay"],
                         rnr_retry_count=o["rnr_retry"], local_ca_guid=ca_guid(self.ep.mac),
                         private_data=o["private_data"])
        conn.state = "REP_SENT"
        conn.timewait_us = _ms_us(req["primary_local_ack_timeout"])
        self._send(conn, mad, retransmit_us=_ms_us(req["local_cm_response_timeout"]),
                   retries=req["max_cm_retries"])

    def _on_rep(self, pkt, hdr, rep):
        conn = self._find(rep["remote_comm_id"])
        if conn is None or conn.role != "active" or conn.peer_ip != pkt.src_ip:
            return
        rtu = encode_mad(CmAttr.RTU, conn.tid, local_comm_id=conn.local_comm_id,
                         remote_comm_id=rep["local_comm_id"])
        if conn.state == "ESTABLISHED":
            self._emit(conn.peer_ip, rtu)           # our RTU was lost: send it again
            return
        if conn.state != "REQ_SENT":
            return
        p = conn.params
        conn.remote_comm_id, conn.peer_qpn = rep["local_comm_id"], rep["local_qpn"]
        conn.private_data = rep["private_data"]
        fl = (p["src_port"] * 31 + p["port"]) & 0xFFFFF
        # The active side sends from the REP's Starting PSN (§7.8).
        conn.qp.modify(dest_qpn=rep["local_qpn"], remote_ip=conn.peer_ip,
                       sq_psn=rep["starting_psn"], pmtu=p["pmtu"], retry_cnt=p["retry_count"],
                       rnr_retry=rep["rnr_retry_count"],
                       timeout=cm_ack_timeout(rep["target_ack_delay"],
                                              p["local_ack_timeout"] - 1),
                       sport=rxe_udp_sport(0, 0, fl),
                       max_rd_atomic=min(p["initiator_depth"], rep["responder_resources"]),
                       max_dest_rd_atomic=max(p["responder_resources"],
                                              rep["initiator_depth"]),
                       state=QPState.RTS)
        conn.deadline, conn.last_mad = None, None
        conn.timewait_us = _ms_us(p["local_ack_timeout"])
        self._emit(conn.peer_ip, rtu)
        self._established(conn)

    def _on_rtu(self, pkt, hdr, rtu):
        conn = self._find(rtu["remote_comm_id"])
        if conn is not None and conn.role == "passive" and conn.state == "REP_SENT" and \
                conn.remote_comm_id == rtu["local_comm_id"]:
            self._established(conn)

    def _on_dreq(self, pkt, hdr, dreq):
        conn = self._find(dreq["remote_comm_id"])
        drep = encode_mad(CmAttr.DREP, hdr["tid"], local_comm_id=dreq["remote_comm_id"],
                          remote_comm_id=dreq["local_comm_id"])
        if conn is None or conn.remote_comm_id != dreq["local_comm_id"]:
            self._emit(pkt.src_ip, drep)            # unknown connection: answer anyway
            return
        if conn.state in ("ESTABLISHED", "REP_SENT", "DREQ_SENT"):
            if conn.qp.state != QPState.ERROR:
                conn.qp.modify(state=QPState.ERROR)
            self._timewait(conn)
            if conn.on_disconnect:
                conn.on_disconnect(conn.qp)
        self._emit(conn.peer_ip, drep)             # also for repeated DREQs in TIMEWAIT

    def _on_drep(self, pkt, hdr, drep):
        conn = self._find(drep["remote_comm_id"])
        if conn is not None and conn.state == "DREQ_SENT":
            self._timewait(conn)
            if conn.on_disconnect:
                conn.on_disconnect(conn.qp)

    def _on_rej(self, pkt, hdr, rej):
        conn = self._find(rej["remote_comm_id"])
        if conn is None or conn.state not in ("REQ_SENT", "REP_SENT"):
            return
        conn.reject_reason = rej["reason"]
        conn.state = "REJECTED"
        conn.deadline = None
        self.conns.remove(conn)
        conn.qp.modify(state=QPState.ERROR)
        if conn.on_reject:
            conn.on_reject(conn.qp, rej["reason"])

    # ---- helpers --------------------------------------------------------------------------
    def _comm_id(self):
        while True:
            c = self.ep.rng.getrandbits(32)
            if c and self._find(c) is None:
                return c

    def _try_send_req(self, conn):
        mac = self.ep.resolve(conn.peer_ip)
        if mac is None:
            return
        p, qp = conn.params, conn.qp
        ipcm = pack(IpCmHeader, ip_ver=4, src_port=p["src_port"], src_ip=self.ep.ip,
                    dst_ip=conn.peer_ip)
        fl = (p["src_port"] * 31 + p["port"]) & 0xFFFFF
        mad = encode_mad(
            CmAttr.REQ, conn.tid, local_comm_id=conn.local_comm_id,
            service_id=IP_CM_SERVICE_ID_TCP | p["port"], local_ca_guid=ca_guid(self.ep.mac),
            local_qpn=qp.qpn, responder_resources=p["responder_resources"],
            initiator_depth=p["initiator_depth"],
            remote_cm_response_timeout=p["cm_response_timeout"], starting_psn=qp.epsn,
            local_cm_response_timeout=p["cm_response_timeout"], retry_count=p["retry_count"],
            pkey=0xFFFF, path_mtu=_MTU_CODE[p["pmtu"]], rnr_retry_count=p["rnr_retry"],
            max_cm_retries=p["max_cm_retries"], primary_local_lid=0xFFFF,
            primary_remote_lid=0xFFFF, primary_local_gid=gid_of(self.ep.ip),
            primary_remote_gid=gid_of(conn.peer_ip), primary_flow_label=fl,
            primary_hop_limit=64, primary_local_ack_timeout=p["local_ack_timeout"],
            private_data=ipcm + bytes(p["private_data"]))
        conn.state = "REQ_SENT"
        life = p["local_ack_timeout"] - 1
        self._send(conn, mad, retransmit_us=2 * _ms_us(life) + _ms_us(p["cm_response_timeout"]),
                   retries=p["max_cm_retries"])

    def _send(self, conn, mad, retransmit_us, retries):
        conn.last_mad, conn.interval, conn.retries_left = mad, retransmit_us, retries
        conn.deadline = self.ep.now + retransmit_us
        self._emit(conn.peer_ip, mad)

    def _emit(self, ip, mad):
        mac = self.ep.arp_table.get(ip)
        if mac is None:
            self.ep.resolve(ip)
            return                                  # the retransmission timer covers it
        self.ep.send_raw(self.ep.build_qp1(mac, ip, mad, self.qp1_psn))
        self.qp1_psn = (self.qp1_psn + 1) & 0xFFFFFF

    def _reject(self, ip, tid, remote_comm_id, reason):
        self._emit(ip, encode_mad(CmAttr.REJ, tid, local_comm_id=0,
                                  remote_comm_id=remote_comm_id, msg_rejected=0,
                                  reason=reason))

    def _established(self, conn):
        conn.state = "ESTABLISHED"
        conn.deadline = conn.last_mad = None
        if conn.on_connect:
            conn.on_connect(conn.qp)

    def _timewait(self, conn):
        conn.state = "TIMEWAIT"
        conn.last_mad = None
        conn.deadline = self.ep.now + max(conn.timewait_us, 1000)

    def _give_up(self, conn):
        """Out of MAD retries: an active REQ ends with REJ timeout, others just close."""
        if conn.state == "REQ_SENT":
            self._reject(conn.peer_ip, conn.tid, conn.remote_comm_id, REJ_TIMEOUT)
            conn.reject_reason = REJ_TIMEOUT
            if conn.on_reject:
                conn.on_reject(conn.qp, REJ_TIMEOUT)
        if conn.qp.state != QPState.ERROR:
            conn.qp.modify(state=QPState.ERROR)
        conn.state = "CLOSED"
        conn.deadline = None
        self.conns.remove(conn)

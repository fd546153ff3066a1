# Ref: issue 24 (target time from the simulated target); draft KBTP §Operations, §Completion;
#      IBTA Vol. 1 §9.2 (BTH opcodes, message first/last packets); sim/vltarget.py (rx_log,
#      TxFrame start/end in GMII cycles); sim/serve_hw.py (``kbtp-sim serve --stats-file``).
"""Board time of every KBTP request the served gateware answered, and the ``--stats-file``.

:class:`BoardTimer` watches the frames going into the Verilated target (with the GMII cycle of
each one's last octet, from :attr:`sim.vltarget.VlTarget.rx_log`) and the frames coming out
(:class:`sim.vltarget.TxFrame`, first octet at ``start``). A KBTP request is a SEND message
(SEND_ONLY, or SEND_FIRST .. SEND_LAST reassembled) to a target QP; its time starts at the last
octet of its last packet. Its response, on the initiator's QP (the CM link's peer QPN):

* ``first``: the first octet of the first message the target starts towards that QP after the
  request arrived (an RDMA WRITE of a LOAD's data, the RDMA READ request of a STORE /
  ALLOC_STORE by READ, or the COMPLETION itself); messages go to the oldest open request of
  the QP first, as the engine serves a QP's requests in order;
* ``completion``: the first octet of the SEND whose KBTP payload (COMPLETION, or HELLO_ACK for a
  HELLO) carries the request's Request ID, or of the RDMA WRITE with Immediate carrying its
  completion record (RECORD_COMPLETION).

Cycles are GMII cycles (8 ns at the ECPIX-5's 125 MHz ``mac_hz``); ``*_ns`` convert them at
the board's clock, ``*_core_cycles`` in the core clock (``core_hz``: 41.67 MHz, 24 ns, the
unit of the engine's LAST_LATENCY register). A retransmitted request (same QP and PSN) is timed
once, from its first arrival. Records are bounded (:data:`MAX_RECORDS`, the newest kept).

:func:`write_stats` writes the JSON atomically (a temporary file renamed over the target), so a
reader (``kbtp top``, ``tools.serve_demo``, ``tools.perf_run``) never sees half a file.
"""

import collections
import json
import os
import time

from host import codec
from host.codec import KbtpError
from hw.headers import BthOpcode, Features
from roce.frames import FrameError, parse_frame

__all__ = ["BoardTimer", "MAX_RECORDS", "write_stats", "STATS_VERSION"]

MAX_RECORDS = 10000
STATS_VERSION = 1

_SEND_FIRST = {BthOpcode.SEND_FIRST.value}
_SEND_ONLY = {BthOpcode.SEND_ONLY.value, BthOpcode.SEND_ONLY_IMM.value,
              BthOpcode.SEND_ONLY_INV.value}
_SEND_MID = {BthOpcode.SEND_MIDDLE.value}
_SEND_LAST = {BthOpcode.SEND_LAST.value, BthOpcode.SEND_LAST_IMM.value,
              BthOpcode.SEND_LAST_INV.value}
# Packets that start a message the target initiates towards the initiator (not ACKs, not READ
# responses to the initiator's own READs, not atomic ACKs).
_MSG_START = {BthOpcode.WRITE_FIRST.value: "WRITE", BthOpcode.WRITE_ONLY.value: "WRITE",
              BthOpcode.WRITE_ONLY_IMM.value: "WRITE_IMM",
              BthOpcode.READ_REQUEST.value: "READ", BthOpcode.SEND_FIRST.value: "SEND",
              BthOpcode.SEND_ONLY.value: "SEND", BthOpcode.SEND_ONLY_IMM.value: "SEND",
              BthOpcode.SEND_ONLY_INV.value: "SEND"}


class BoardTimer:
    """Pairs KBTP requests into the target with the target's responses, in GMII cycles.

    Parameters
    ----------
    params : dict
        The target's :attr:`sim.vltarget.VlTarget.params` (``mac_hz``, ``core_hz`` or
        ``core_div``); a one-clock target without them counts at 125 MHz.
    peer_of : callable(int) -> int or None
        The initiator's QPN of a target QPN (the CM link's ``peer_qpn``).
    max_records : int

    Attributes
    ----------
    records : collections.deque of dict
        One per request, oldest first; see :meth:`_record` for the keys.
    """

    def __init__(self, params, peer_of, max_records=MAX_RECORDS):
        self.mac_hz = float(params.get("mac_hz", 125e6))
        div = params.get("core_div") or 1
        self.core_hz = float(params.get("core_hz", self.mac_hz / div))
        self.ns_per_cycle = 1e9 / self.mac_hz
        self.peer_of = peer_of
        self.records = collections.deque(maxlen=max_records)
        self.total = 0                          # requests seen (also those dropped from records)
        self._pending = collections.deque()     # frames sent, waiting for their rx_log entry
        self._rx_used = 0
        self._partial = {}                      # target QPN -> (payload so far, psn)
        self._open = {}                         # initiator QPN -> [record] in arrival order
        self._by_rid = {}                       # (initiator QPN, request id) -> record
        self._seen_psn = {}                     # target QPN -> recent request PSNs
        self._addr_le = {}                      # initiator QPN -> ADDR_LE negotiated

    # ---- frames in ----------------------------------------------------------------------------
    def sent(self, frame):
        """A frame was queued into the target (:meth:`VlTarget.send`), in order."""
        self._pending.append(bytes(frame))

    def sync_rx(self, rx_log):
        """Take the frames whose last octet has been clocked in (new ``rx_log`` entries).

        Consumed entries are deleted from ``rx_log`` (the served target's log would grow
        without bound otherwise); the caller owns that list.
        """
        n = min(len(rx_log), len(self._pending))
        for k in range(n):
            self._rx(self._pending.popleft(), rx_log[k][1])
        if n:
            del rx_log[:n]

    def _rx(self, frame, last):
        try:
            kind, p = parse_frame(frame)
        except FrameError:
            return
        if kind != "roce":
            return
        op, qpn = p.opcode, p.dest_qp
        if op in _SEND_ONLY:
            self._request(qpn, p.psn, bytes(p.payload), last)
        elif op in _SEND_FIRST:
            self._partial[qpn] = (bytearray(p.payload), p.psn)
        elif op in _SEND_MID and qpn in self._partial:
            self._partial[qpn][0].extend(p.payload)
        elif op in _SEND_LAST and qpn in self._partial:
            buf, psn = self._partial.pop(qpn)
            self._request(qpn, psn, bytes(buf + p.payload), last)

    def _request(self, tqpn, psn, payload, last):
        seen = self._seen_psn.setdefault(tqpn, collections.deque(maxlen=256))
        if psn in seen:
            return                              # a retransmission: timed from the first copy
        seen.append(psn)
        peer = self.peer_of(tqpn)
        le = self._addr_le.get(peer, False)
        try:
            msg = codec.decode(payload, addr_le=le)
        except KbtpError:
            msg = None
        data = getattr(msg, "data", None)
        length = len(msg.inline) if getattr(msg, "inline", b"") else None
        if length is None:
            length = data.length if data is not None else 0
        rec = {"qpn": tqpn, "peer_qpn": peer, "psn": psn,
               "opcode": msg.OPCODE.name if msg is not None else "UNDECODABLE",
               "request_id": msg.request_id if msg is not None else None,
               "length": length, "inline": bool(getattr(msg, "inline", b"")),
               "status": None, "status_name": None,
               "rx_last_cycle": last, "first_cycle": None, "first_kind": None,
               "completion_cycle": None}
        self.records.append(rec)
        self.total += 1
        if peer is None or msg is None:
            return
        self._open.setdefault(peer, []).append(rec)
        self._by_rid[(peer, msg.request_id)] = rec

    # ---- frames out ---------------------------------------------------------------------------
    def sent_by_target(self, frames):
        """TX frames of the target (:class:`sim.vltarget.TxFrame`), in order."""
        for f in frames:
            if not f.fcs_ok:
                continue
            try:
                kind, p = parse_frame(f.frame)
            except FrameError:
                continue
            if kind != "roce":
                continue
            self._tx(p, f.start)

    def _tx(self, p, start):
        op, peer = p.opcode, p.dest_qp
        if op in _SEND_ONLY:
            try:
                msg = codec.decode(bytes(p.payload), addr_le=self._addr_le.get(peer, False))
            except KbtpError:
                self._msg_start(peer, "SEND", start)
                return
            if isinstance(msg, codec.HelloAck):
                self._addr_le[peer] = bool(msg.features & Features.ADDR_LE.value)
            self._complete(peer, msg.request_id, msg.status, start)
        elif op == BthOpcode.WRITE_ONLY_IMM.value and len(p.payload) == 24:
            try:
                r = codec.decode_record(bytes(p.payload))
            except KbtpError:
                self._msg_start(peer, "WRITE_IMM", start)
                return
            self._complete(peer, r.request_id, r.status, start)
        elif op in _MSG_START:
            self._msg_start(peer, _MSG_START[op], start)

    def _msg_start(self, peer, kind, start):
        for rec in self._open.get(peer, ()):
            if rec["first_cycle"] is None and rec["rx_last_cycle"] <= start:
                rec["first_cycle"], rec["first_kind"] = start, kind
                return

    def _complete(self, peer, rid, status, start):
        rec = self._by_rid.pop((peer, rid), None)
        if rec is None:
            return
        if rec["first_cycle"] is None:
            rec["first_cycle"], rec["first_kind"] = start, "SEND"
        rec["completion_cycle"] = start
        rec["status"] = status
        rec["status_name"] = codec._status_name(status)
        if rec["status_name"] == status:
            rec["status_name"] = str(status)
        lst = self._open.get(peer, [])
        if rec in lst:
            lst.remove(rec)

    # ---- output -------------------------------------------------------------------------------
    def _record(self, rec):
        """A record with its derived figures: ``cycles_first`` / ``cycles_completion`` (GMII
        cycles from the request's last octet to the first octet of the first response /
        completion), the same as ``*_ns`` and ``*_core_cycles``."""
        out = dict(rec)
        for key, at in (("first", rec["first_cycle"]), ("completion", rec["completion_cycle"])):
            cyc = None if at is None else at - rec["rx_last_cycle"]
            out[f"cycles_{key}"] = cyc
            out[f"ns_{key}"] = None if cyc is None else cyc * self.ns_per_cycle
            out[f"core_cycles_{key}"] = (None if cyc is None
                                         else cyc * self.core_hz / self.mac_hz)
        return out

    def snapshot(self):
        """The records as JSON-ready dicts, with the clocks they count in."""
        return {"clocks": {"mac_hz": self.mac_hz, "core_hz": self.core_hz,
                           "ns_per_gmii_cycle": self.ns_per_cycle,
                           "ns_per_core_cycle": 1e9 / self.core_hz},
                "requests_seen": self.total,
                "records": [self._record(r) for r in self.records]}


def _jsonable(obj):
    if isinstance(obj, dict):
        return {(k if isinstance(k, str) else "/".join(map(str, k)) if isinstance(k, tuple)
                 else str(k)): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


def write_stats(path, data):
    """Write ``data`` as JSON to ``path`` atomically (temporary file + rename). Dict keys that
    are tuples (the driver's ``(op, status)``) become ``"op/status"``."""
    path = os.fspath(path)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(_jsonable(dict(data, version=STATS_VERSION, written=time.time())), f)
    os.replace(tmp, path)


# Ref: docs/roce-layouts.md §1-§6 (framing, opcodes, ICRC, PSN rules, ACK/NAK, duplicates,
#      retransmission), §7 (CM, in roce/cm.py), §8 (ARP); docs/softroce-vm.md.
"""A Python RoCEv2 reliable-connected endpoint: requester, responder, ARP and CM on QP1.

Written from the wire rules of roce-layouts.md, independently of the gateware. Plain,
deterministic Python: no threads and no wall clock. Time is passed in (``now_us``) by
:meth:`RoceEndpoint.receive_frame` and :meth:`RoceEndpoint.tick`; frames leave through
:meth:`RoceEndpoint.poll_tx`.

Behaviour follows Linux rxe where the layout page describes it: ACKs only for AckReq packets
(coalesced: the newest pending ACK goes out at ``poll_tx``), NAK sequence error once per
episode, duplicate SEND/WRITE re-ACKed and never re-executed, duplicate READ re-read (any
sub-range of the original), duplicate atomics answered from a cache of saved results, one
retransmission timer per QP (go-back-N from the oldest unacknowledged PSN), retry count 7
and RNR retry 7 meaning "infinite". A READ/atomic response found missing (a later response
or ACK arrived) is re-requested selectively. Completions are reported in posting order.

Choices where the page leaves room (see the report of this module): SEND with Invalidate of
an unknown or already invalid R_Key answers NAK invalid request; WRITE with Immediate
delivers ``on_message(qp, b"", imm=...)``; receive credits are unlimited unless
``recv_credits`` is set (then SEND First/Only and WRITE-with-Immediate Last/Only need one,
else RNR NAK).

Example
-------
>>> a = RoceEndpoint("02:00:00:00:00:01", "10.0.0.1")
>>> b = RoceEndpoint("02:00:00:00:00:02", "10.0.0.2")
>>> qa = a.create_qp(dest_qpn=0x20, remote_ip="10.0.0.2", qpn=0x10)
>>> qb = b.create_qp(dest_qpn=0x10, remote_ip="10.0.0.1", qpn=0x20,
...                  on_message=lambda qp, data, imm=None, invalidated_rkey=None: None)
>>> mr = b.register(bytearray(4096), base_va=0x1000, rkey=0x77, atomic=True)
>>> wr = qa.write(0x1000, 0x77, b"hello")            # then pump frames between a and b
>>> from sim.channel import run
>>> _ = run(a, b, until=lambda: not qa.outstanding)
>>> qa.poll_cq()[0].status
<WcStatus.SUCCESS: 'SUCCESS'>

With CM: ``b.listen(18515, on_connect=...)`` and ``qp = a.connect("10.0.0.2", 18515)``
(ARP, REQ, REP, RTU); ``a.disconnect(qp)`` sends DREQ.
"""

import enum
import random
from collections import deque
from dataclasses import dataclass

from hw.headers import (
    AETH, DETH, GSI_QKEY, IETH, RETH, AethSyndrome, AtomicAckETH, AtomicETH, BthOpcode, ImmDt,
    pack,
)
from roce.frames import (
    PMTU_CODES, QPState, rxe_udp_sport,
    BROADCAST_MAC, PSN_MASK, FrameError, build_arp, build_roce, ip_int, mac_bytes,
    parse_frame, psn_diff,
)

__all__ = [
    "RoceEndpoint", "QP", "MR", "QPState", "WrOp", "WcStatus", "Completion", "Counters",
    "PMTU_CODES", "RNR_TIMER_US", "ack_timeout_us", "rxe_udp_sport",
]

O = BthOpcode
#: RNR timer code -> microseconds (§4.2)
RNR_TIMER_US = [655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920,
                2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920,
                122880, 163840, 245760, 327680, 491520]
_SEND_OPS = {O.SEND_FIRST.value, O.SEND_MIDDLE.value, O.SEND_LAST.value, O.SEND_LAST_IMM.value,
             O.SEND_ONLY.value, O.SEND_ONLY_IMM.value, O.SEND_LAST_INV.value,
             O.SEND_ONLY_INV.value}
_WRITE_OPS = {O.WRITE_FIRST.value, O.WRITE_MIDDLE.value, O.WRITE_LAST.value,
              O.WRITE_LAST_IMM.value, O.WRITE_ONLY.value, O.WRITE_ONLY_IMM.value}
_ATOMIC_OPS = {O.CMP_SWAP.value, O.FETCH_ADD.value}
_REQUEST_OPS = _SEND_OPS | _WRITE_OPS | _ATOMIC_OPS | {O.READ_REQUEST.value}
_RESPONSE_OPS = {O.READ_RESPONSE_FIRST.value, O.READ_RESPONSE_MIDDLE.value,
                 O.READ_RESPONSE_LAST.value, O.READ_RESPONSE_ONLY.value,
                 O.ACKNOWLEDGE.value, O.ATOMIC_ACKNOWLEDGE.value}
_FIRST_OR_ONLY = {O.SEND_FIRST.value, O.SEND_ONLY.value, O.SEND_ONLY_IMM.value,
                  O.SEND_ONLY_INV.value, O.WRITE_FIRST.value, O.WRITE_ONLY.value,
                  O.WRITE_ONLY_IMM.value, O.READ_REQUEST.value} | _ATOMIC_OPS
_MID_OR_LAST_SEND = {O.SEND_MIDDLE.value, O.SEND_LAST.value, O.SEND_LAST_IMM.value,
                     O.SEND_LAST_INV.value}
_MID_OR_LAST_WRITE = {O.WRITE_MIDDLE.value, O.WRITE_LAST.value, O.WRITE_LAST_IMM.value}
_LAST = {O.SEND_LAST.value, O.SEND_LAST_IMM.value, O.SEND_LAST_INV.value, O.WRITE_LAST.value,
         O.WRITE_LAST_IMM.value}
_ONLY = {O.SEND_ONLY.value, O.SEND_ONLY_IMM.value, O.SEND_ONLY_INV.value, O.WRITE_ONLY.value,
         O.WRITE_ONLY_IMM.value}
_NEEDS_RECV = {O.SEND_FIRST.value, O.SEND_ONLY.value, O.SEND_ONLY_IMM.value,
               O.SEND_ONLY_INV.value, O.WRITE_LAST_IMM.value, O.WRITE_ONLY_IMM.value}


def ack_timeout_us(code):
    """Local ACK timeout 4.096 us x 2^code (§6.7); 0 = no timeout (None)."""
    return None if code == 0 else (4096 << code) // 1000


class WrOp(enum.Enum):
    SEND = "SEND"
    SEND_IMM = "SEND_IMM"
    SEND_INV = "SEND_INV"
    WRITE = "WRITE"
    WRITE_IMM = "WRITE_IMM"
    READ = "READ"
    FETCH_ADD = "FETCH_ADD"
    CMP_SWAP = "CMP_SWAP"


class WcStatus(enum.Enum):
    SUCCESS = "SUCCESS"
    REM_INV_REQ_ERR = "REM_INV_REQ_ERR"
    REM_ACCESS_ERR = "REM_ACCESS_ERR"
    REM_OP_ERR = "REM_OP_ERR"
    RETRY_EXC_ERR = "RETRY_EXC_ERR"
    RNR_RETRY_EXC_ERR = "RNR_RETRY_EXC_ERR"
    WR_FLUSH_ERR = "WR_FLUSH_ERR"


_NAK_STATUS = {0x61: WcStatus.REM_INV_REQ_ERR, 0x62: WcStatus.REM_ACCESS_ERR,
               0x63: WcStatus.REM_OP_ERR}


@dataclass
class Completion:
    """A send-queue completion. ``data``: READ bytes; ``orig``: atomic original value."""
    wr_id: int
    op: WrOp
    status: WcStatus
    byte_len: int = 0
    data: bytes = None
    orig: int = None


class Counters:
    """Event counters of one endpoint (attributes, all ints)."""
    NAMES = ("frames_in", "frames_out", "icrc_errors", "ip_checksum_errors", "udp_checksum_errors",
             "malformed", "not_for_us", "unknown_qp", "bad_qp_state", "psn_errors",
             "rkey_errors", "naks_sent", "naks_received", "rnr_naks_sent", "rnr_naks_received",
             "retransmissions", "retries", "duplicates", "acks_sent", "acks_received",
             "arp_requests_sent", "arp_replies_sent", "cm_in", "cm_out", "cm_retransmissions")

    def __init__(self):
        for n in self.NAMES:
            setattr(self, n, 0)

    def as_dict(self):
        return {n: getattr(self, n) for n in self.NAMES}

    def __repr__(self):
        return "Counters(" + ", ".join(f"{k}={v}" for k, v in self.as_dict().items() if v) + ")"


class MR:
    """A registered memory region: ``data`` is addressed by VAs base_va .. base_va+len-1."""

    def __init__(self, data, base_va, rkey, read, write, atomic):
        self.data = data if isinstance(data, memoryview) else memoryview(data)
        self.base_va, self.rkey = base_va, rkey
        self.read, self.write, self.atomic = read, write, atomic
        self.valid = True

    def offset(self, va, length):
        """Offset of [va, va+length) in ``data``, or None when outside the region."""
        off = va - self.base_va
        if off < 0 or off + length > len(self.data):
            return None
        return off


class _Wqe:
    __slots__ = ("wr_id", "op", "payload", "va", "rkey", "length", "imm", "inv_rkey", "add",
                 "compare", "swap", "into", "first_psn", "npsn", "acked", "resp_psn",
                 "rdata", "orig", "done", "pmtu", "fence", "result", "rereq")

    def __init__(self, wr_id, op, **kw):
        self.wr_id, self.op = wr_id, op
        self.payload = kw.get("payload", b"")
        self.va, self.rkey = kw.get("va", 0), kw.get("rkey", 0)
        self.length = kw.get("length", 0)
        self.imm, self.inv_rkey = kw.get("imm"), kw.get("inv_rkey")
        self.add, self.compare, self.swap = kw.get("add", 0), kw.get("compare", 0), kw.get(
            "swap", 0)
        self.into = kw.get("into")
        self.fence = kw.get("fence", False)
        self.first_psn = None       # assigned at first transmission
        self.npsn = 0
        self.acked = 0              # SEND/WRITE: packets acknowledged
        self.resp_psn = None        # READ: next response PSN expected
        self.rdata = None
        self.orig = None
        self.done = False
        self.result = None
        self.rereq = None
        self.pmtu = 0

    @property
    def is_rd_atomic(self):
        return self.op in (WrOp.READ, WrOp.FETCH_ADD, WrOp.CMP_SWAP)

    def last_psn(self):
        return (self.first_psn + self.npsn - 1) & PSN_MASK

    def contains(self, psn):
        return 0 <= psn_diff(psn, self.first_psn) < self.npsn


class QP:
    """One RC queue pair: requester (send queue) and responder (receive side) together.

    Create with :meth:`RoceEndpoint.create_qp`; change the context with :meth:`modify`.
    Attributes are the "QP context" the host writes: ``state``, ``qpn``, ``dest_qpn``,
    ``sq_psn`` (next PSN the requester assigns), ``epsn`` (responder's expected PSN),
    ``remote_ip``, ``remote_mac``, ``pmtu``, ``timeout`` (5-bit code), ``retry_cnt``,
    ``rnr_retry``, ``min_rnr_timer``, ``max_rd_atomic``, ``max_dest_rd_atomic``, ``sport``,
    ``recv_credits`` (None = unlimited), ``on_message``, ``on_completion``.
    """

    _ATTRS = ("state", "dest_qpn", "sq_psn", "epsn", "remote_ip", "remote_mac", "pmtu",
              "timeout", "retry_cnt", "rnr_retry", "min_rnr_timer", "max_rd_atomic",
              "max_dest_rd_atomic", "sport", "recv_credits", "on_message", "on_completion",
              "max_unacked", "tos", "ttl", "pkey", "on_state")

    def __init__(self, ep, qpn, **attrs):
        self.ep, self.qpn = ep, qpn
        self.state = QPState.RESET
        self.dest_qpn, self.remote_ip, self.remote_mac = 0, 0, None
        self.sq_psn, self.epsn = 0, 0
        self.pmtu, self.timeout, self.retry_cnt, self.rnr_retry = 1024, 14, 7, 7
        self.min_rnr_timer = 1
        self.max_rd_atomic, self.max_dest_rd_atomic = 16, 16
        self.max_unacked = 128
        self.sport = None
        self.recv_credits = None
        self.on_message = self.on_completion = self.on_state = None
        self.tos, self.ttl, self.pkey = 0, 64, 0xFFFF
        self.cm = None                     # set by the CM when it owns this QP
        self.error_reason = ""             # why the QP went to Error (diagnostics)
        # requester
        self._wqes = deque()               # posted, not yet completed, in order
        self._tx_psn = None                # next PSN to (re)transmit
        self._hi_psn = None                # one past the furthest PSN ever transmitted
        self._last_una = None
        self._timer = None                 # retransmission deadline (us)
        self._retry_left = self._rnr_left = 0
        self._rnr_wait = None              # (deadline, psn) after an RNR NAK
        self._resend = []                  # READ/atomic WQEs to re-request (selective)
        self._since_ackreq = 0
        self._cq = []
        self._next_wr_id = 1
        # responder
        self._out = []                     # responder packets waiting for poll_tx
        self._pending_ack = None
        self._nak_armed = True
        self._msn = 0
        self._in_send = None               # bytearray of a multi-packet SEND
        self._in_write = None              # [mr, offset, remaining] of a multi-packet WRITE
        self._rd_ctx = deque()             # saved READ/atomic contexts (responder resources)
        self.modify(**attrs)

    # ---- context -------------------------------------------------------------------------
    def modify(self, **attrs):
        """Write QP context fields (see class doc). Moving to RTS (re)loads retry counters."""
        for k, v in attrs.items():
            if k not in self._ATTRS:
                raise TypeError(f"unknown QP attribute {k!r}")
            if k == "remote_ip":
                v = ip_int(v)
            elif k == "remote_mac" and v is not None:
                v = mac_bytes(v)
            elif k == "pmtu" and v not in PMTU_CODES.values():
                raise ValueError(f"PMTU {v} not one of 256..4096")
            elif k in ("sq_psn", "epsn"):
                v &= PSN_MASK
            setattr(self, k, v)
        if "state" in attrs:
            st = attrs["state"]
            if st == QPState.RTS:
                self._retry_left, self._rnr_left = self.retry_cnt, self.rnr_retry
                if self._tx_psn is None:
                    self._tx_psn = self._hi_psn = self.sq_psn
                self._last_una = self._una()
            if st == QPState.ERROR:
                self._flush()
            if self.on_state:
                self.on_state(self, st)
        if self.sport is None and self.dest_qpn:
            self.sport = rxe_udp_sport(self.qpn, self.dest_qpn)
        return self

    def post_recv(self, count=1):
        """Add receive credits (receive WQEs); credits are unlimited while None."""
        self.recv_credits = (self.recv_credits or 0) + count

    # ---- verbs: send queue ----------------------------------------------------------------
    def post_send(self, op, *, data=b"", va=0, rkey=0, length=None, imm=None, inv_rkey=None,
                  add=0, compare=0, swap=0, into=None, fence=False, wr_id=None):
        """Post a work request; returns its ``wr_id``.

        SEND / SEND_IMM / SEND_INV(inv_rkey): ``data``. WRITE / WRITE_IMM(imm): ``data`` to
        (``va``, ``rkey``). READ: ``length`` octets from (``va``, ``rkey``), stored into the
        writable buffer ``into`` if given, and returned in ``Completion.data``. FETCH_ADD
        (``add``) and CMP_SWAP (``compare``, ``swap``) on the 64-bit word at ``va``; the old
        value is in ``Completion.orig`` (and written little-endian into ``into``).

        ``fence``: do not start this request before every earlier READ and atomic has
        completed (IB fence). Without it a later WRITE may overtake a READ's *retransmitted*
        responses: a duplicate READ is re-executed on the current memory (§6.6).
        """
        op = WrOp(op)
        if self.state == QPState.ERROR:
            raise RuntimeError("QP is in the Error state")
        if wr_id is None:
            wr_id = self._next_wr_id
        self._next_wr_id = max(self._next_wr_id, wr_id + 1)
        if op == WrOp.SEND_IMM and imm is None or op == WrOp.WRITE_IMM and imm is None:
            raise ValueError(f"{op.name} needs imm")
        if op == WrOp.SEND_INV and inv_rkey is None:
            raise ValueError("SEND_INV needs inv_rkey")
        if op == WrOp.READ:
            length = len(into) if length is None else length
        w = _Wqe(wr_id, op, payload=bytes(data), va=va, rkey=rkey, length=length or 0,
                 imm=imm, inv_rkey=inv_rkey, add=add, compare=compare, swap=swap, into=into,
                 fence=fence)
        self._wqes.append(w)
        return wr_id

    def send(self, data, imm=None, inv_rkey=None, **kw):
        op = WrOp.SEND_INV if inv_rkey is not None else WrOp.SEND_IMM if imm is not None else \
            WrOp.SEND
        return self.post_send(op, data=data, imm=imm, inv_rkey=inv_rkey, **kw)

    def write(self, va, rkey, data, imm=None, **kw):
        op = WrOp.WRITE_IMM if imm is not None else WrOp.WRITE
        return self.post_send(op, va=va, rkey=rkey, data=data, imm=imm, **kw)

    def read(self, va, rkey, length, into=None, **kw):
        return self.post_send(WrOp.READ, va=va, rkey=rkey, length=length, into=into, **kw)

    def fetch_add(self, va, rkey, add, **kw):
        return self.post_send(WrOp.FETCH_ADD, va=va, rkey=rkey, add=add, **kw)

    def cmp_swap(self, va, rkey, compare, swap, **kw):
        return self.post_send(WrOp.CMP_SWAP, va=va, rkey=rkey, compare=compare, swap=swap, **kw)

    def poll_cq(self, max_entries=None):
        """Take the completions gathered so far (oldest first)."""
        n = len(self._cq) if max_entries is None else max_entries
        out, self._cq = self._cq[:n], self._cq[n:]
        return out

    @property
    def outstanding(self):
        """Number of posted work requests not yet completed."""
        return len(self._wqes)

    # ---- requester: completion ------------------------------------------------------------
    def _finish(self, w, status, **kw):
        """Mark ``w`` finished; completions are reported in posting order (_retire_head)."""
        w.done = True
        w.result = (status, kw)

    def _report(self, w, status=None):
        st, kw = w.result if status is None else (status, {})
        c = Completion(w.wr_id, w.op, st, **kw)
        if self.on_completion:
            self.on_completion(self, c)
        else:
            self._cq.append(c)

    def _retire_head(self):
        """Report finished WQEs at the head of the queue, in order."""
        while self._wqes and self._wqes[0].done:
            self._report(self._wqes.popleft())

    def _flush(self):
        while self._wqes:
            self._report(self._wqes.popleft(), WcStatus.WR_FLUSH_ERR)
        self._resend.clear()
        self._timer = self._rnr_wait = None

    def _enter_error(self, head_status):
        """Requester error: the oldest unfinished WR gets ``head_status``, the rest flush."""
        if not self.error_reason:
            self.error_reason = f"requester: {head_status.name}"
        self._retire_head()
        if self._wqes:
            self._report(self._wqes.popleft(), head_status)
        self.state = QPState.ERROR
        self._flush()
        if self.on_state:
            self.on_state(self, QPState.ERROR)

    def _una(self):
        """Oldest PSN not yet acknowledged (the next PSN to assign when nothing is out)."""
        for w in self._wqes:
            if w.first_psn is None:
                break
            if w.done:
                continue
            if w.op == WrOp.READ:
                return w.resp_psn
            if w.op in (WrOp.FETCH_ADD, WrOp.CMP_SWAP):
                return w.first_psn
            return (w.first_psn + w.acked) & PSN_MASK
        return self.sq_psn

    def _rerequest(self, w):
        """Selective retry of a READ/atomic whose response was lost (the responder already
        executed what follows, so only this request is sent again; once per resume PSN, the
        timer covers a lost retry)."""
        resume = w.resp_psn if w.op == WrOp.READ else w.first_psn
        if w.rereq == resume or psn_diff(resume, self._tx_psn) >= 0:
            return
        w.rereq = resume
        if self._charge_retry():
            self._resend.append(w)

    def _rewind(self, psn):
        """Go back N: retransmit from ``psn`` if it lies before the transmit pointer."""
        if self._tx_psn is not None and psn_diff(psn, self._tx_psn) < 0:
            self._tx_psn = psn
            self._arm()
            return True
        return False

    def _charge_retry(self):
        """One retry sequence; False (and QP error) when the retry count is exhausted."""
        self.ep.counters.retries += 1
        if self.retry_cnt == 7:
            return True
        self._retry_left -= 1
        if self._retry_left < 0:
            self._enter_error(WcStatus.RETRY_EXC_ERR)
            return False
        return True

    def _arm(self):
        """(Re)start the retransmission timer: 4.096 us x 2^timeout from now."""
        t = ack_timeout_us(self.timeout)
        self._timer = None if t is None else self.ep.now + t

    def _progress(self):
        self._retire_head()
        una = self._una()
        advanced = una != self._last_una
        if advanced:                        # something new was acknowledged: reload counters
            self._last_una = una
            self._retry_left, self._rnr_left = self.retry_cnt, self.rnr_retry
        # After a rewind, responses to packets sent before it may still arrive: never resend
        # what they acknowledged (a READ being answered is not requested again).
        if psn_diff(una, self._tx_psn) > 0:
            w = next((x for x in self._wqes if x.first_psn is not None and x.contains(una)),
                     None)
            self._tx_psn = (w.first_psn + w.npsn) & PSN_MASK if w is not None and \
                w.op == WrOp.READ else una
        if psn_diff(self._hi_psn, una) <= 0 and not self._resend:
            self._timer = None              # nothing in flight
        elif advanced or self._timer is None:
            self._arm()

    def _req_rx(self, pkt):
        """Requester side: an ACK, NAK, READ response or ATOMIC ACKNOWLEDGE arrived."""
        ctr = self.ep.counters
        op, p = pkt.opcode, pkt.psn
        if self.state != QPState.RTS or self._tx_psn is None:
            ctr.bad_qp_state += 1
            return
        una = self._una()
        if psn_diff(p, una) < 0 or psn_diff(p, self._hi_psn) >= 0:
            ctr.duplicates += 1            # stale or not for anything in flight
            return
        aeth = pkt.ext.get("aeth")
        syn = aeth["syndrome"] if aeth else 0x1F
        is_nak = bool(aeth) and (syn & 0x60) != 0
        if is_nak:
            ctr.naks_received += 1
        elif op == O.ACKNOWLEDGE.value:
            ctr.acks_received += 1
        # Implicit acknowledgement of everything before p (§6.5).
        for x in list(self._wqes):
            if x.first_psn is None or psn_diff(x.first_psn, p) >= 0 or x.contains(p):
                break
            if x.done:
                continue
            if x.op in (WrOp.SEND, WrOp.SEND_IMM, WrOp.SEND_INV, WrOp.WRITE, WrOp.WRITE_IMM):
                x.acked = x.npsn
                self._finish(x, WcStatus.SUCCESS, byte_len=len(x.payload))
            else:
                # p is past a READ/atomic whose response never came: it was lost.
                self._rerequest(x)
        w = next((x for x in self._wqes if x.first_psn is not None and x.contains(p)), None)
        if w is None or w.done:
            self._progress()
            return
        if is_nak:
            self._nak(w, p, syn)
            return
        if op == O.ACKNOWLEDGE.value:
            if w.op in (WrOp.READ, WrOp.FETCH_ADD, WrOp.CMP_SWAP):
                self._progress()
                return
            w.acked = max(w.acked, psn_diff(p, w.first_psn) + 1)
            if w.acked == w.npsn:
                self._finish(w, WcStatus.SUCCESS, byte_len=len(w.payload))
        elif op == O.ATOMIC_ACKNOWLEDGE.value:
            if w.op not in (WrOp.FETCH_ADD, WrOp.CMP_SWAP):
                ctr.malformed += 1
                return
            w.orig = pkt.ext["atomic_ack"]["orig_data"]
            if w.into is not None:
                w.into[:8] = w.orig.to_bytes(8, "little")
            self._finish(w, WcStatus.SUCCESS, byte_len=8, orig=w.orig)
        else:                               # READ response
            if w.op != WrOp.READ:
                ctr.malformed += 1
                return
            d = psn_diff(p, w.resp_psn)
            if d < 0:
                ctr.duplicates += 1
                return
            if d > 0:                       # a response packet went missing: ask from there
                self._rerequest(w)
                self._progress()
                return
            k = psn_diff(p, w.first_psn)
            exp = min(w.pmtu, w.length - k * w.pmtu) if w.length else 0
            if len(pkt.payload) != exp:
                ctr.malformed += 1
                return
            off = k * w.pmtu
            w.rdata[off:off + exp] = pkt.payload
            w.resp_psn = (p + 1) & PSN_MASK
            if k == w.npsn - 1:
                if w.into is not None:
                    w.into[:w.length] = w.rdata
                self._finish(w, WcStatus.SUCCESS, byte_len=w.length, data=bytes(w.rdata))
        self._progress()

    def _nak(self, w, p, syn):
        ctr = self.ep.counters
        if syn == AethSyndrome.NAK_PSN_SEQ_ERROR.value:
            if self._rewind(p) and not self._charge_retry():
                return
            self._progress()
            return
        if syn & 0xE0 == AethSyndrome.RNR_NAK.value:
            ctr.rnr_naks_received += 1
            if self.rnr_retry != 7:
                self._rnr_left -= 1
                if self._rnr_left < 0:
                    self._enter_error(WcStatus.RNR_RETRY_EXC_ERR)
                    return
            self._retire_head()
            self._rnr_wait = (self.ep.now + RNR_TIMER_US[syn & 0x1F], p)
            self._timer = None
            return
        # invalid request / remote access / remote operational error: fatal (§6.5)
        self._enter_error(_NAK_STATUS.get(syn, WcStatus.REM_OP_ERR))

    def _req_tick(self, now):
        if self.state != QPState.RTS:
            return
        if self._rnr_wait and now >= self._rnr_wait[0]:
            psn = self._rnr_wait[1]
            self._rnr_wait = None
            self._rewind(psn)
            self._progress()
        if self._timer is not None and now >= self._timer:
            una = self._una()
            if psn_diff(self._hi_psn, una) > 0:
                self._rewind(una)
                if not self._charge_retry():
                    return
                self._arm()
            else:
                self._timer = None

    def _deadline(self):
        ds = [d for d in (self._timer, self._rnr_wait and self._rnr_wait[0]) if d is not None]
        return min(ds) if ds else None

    # ---- requester: transmission ----------------------------------------------------------
    def _req_packets(self):
        """Packets the requester may send now (new and retransmitted), as build kwargs."""
        out = []
        if self.state != QPState.RTS or self._rnr_wait or self._tx_psn is None:
            return out
        for w in self._resend:
            if not w.done and w.rereq is not None and w in self._wqes:
                self.ep.counters.retransmissions += 1
                out.append(self._packet(w, psn_diff(w.rereq, w.first_psn)))
                if self._timer is None:
                    self._arm()
        self._resend.clear()
        while True:
            w = None
            for x in self._wqes:
                if x.first_psn is None or x.contains(self._tx_psn):
                    w = x
                    break
            if w is None:
                break
            una = self._una()
            new = w.first_psn is None
            if psn_diff(self._tx_psn, una) >= self.max_unacked and una != self._tx_psn:
                break
            if new and w.fence and any(x.first_psn is not None and x.is_rd_atomic and
                                       not x.done for x in self._wqes):
                break
            if new and w.is_rd_atomic:
                busy = sum(1 for x in self._wqes if x.first_psn is not None and x.is_rd_atomic
                           and not x.done)
                if busy >= self.max_rd_atomic:
                    break
            if new:
                self._assign(w)
            elif psn_diff(self._tx_psn, self._hi_psn) < 0:
                self.ep.counters.retransmissions += 1
            k = psn_diff(self._tx_psn, w.first_psn)
            out.append(self._packet(w, k))
            if w.op == WrOp.READ:
                self._tx_psn = (w.first_psn + w.npsn) & PSN_MASK
            else:
                self._tx_psn = (self._tx_psn + 1) & PSN_MASK
            if psn_diff(self._tx_psn, self._hi_psn) > 0:
                self._hi_psn = self._tx_psn
            if self._timer is None:
                self._arm()
        return out

    def _assign(self, w):
        w.first_psn = self._tx_psn = self.sq_psn
        w.pmtu = self.pmtu
        if w.op == WrOp.READ:
            w.npsn = max(1, -(-w.length // self.pmtu))
            w.resp_psn = w.first_psn
            w.rdata = bytearray(w.length)
        elif w.op in (WrOp.FETCH_ADD, WrOp.CMP_SWAP):
            w.npsn = 1
        else:
            w.npsn = max(1, -(-len(w.payload) // self.pmtu))
        self.sq_psn = (w.first_psn + w.npsn) & PSN_MASK

    def _packet(self, w, k):
        """Build kwargs of packet k of WQE w (k > 0 on a READ = resume mid-response)."""
        psn = (w.first_psn + k) & PSN_MASK
        if w.op == WrOp.READ:
            off = k * w.pmtu
            ext = pack(RETH, va=w.va + off, rkey=w.rkey, dma_length=w.length - off)
            return dict(opcode=O.READ_REQUEST.value, psn=psn, ackreq=1, ext=ext)
        if w.op in (WrOp.FETCH_ADD, WrOp.CMP_SWAP):
            opc = O.FETCH_ADD if w.op == WrOp.FETCH_ADD else O.CMP_SWAP
            ext = pack(AtomicETH, va=w.va, rkey=w.rkey, swap_add=(
                w.add if w.op == WrOp.FETCH_ADD else w.swap) & ((1 << 64) - 1),
                compare=w.compare & ((1 << 64) - 1) if w.op == WrOp.CMP_SWAP else 0)
            return dict(opcode=opc.value, psn=psn, ackreq=1, ext=ext)
        n = w.npsn
        chunk = w.payload[k * w.pmtu:(k + 1) * w.pmtu]
        first, last = k == 0, k == n - 1
        is_send = w.op in (WrOp.SEND, WrOp.SEND_IMM, WrOp.SEND_INV)
        ext = b""
        if is_send:
            if n == 1:
                opc = {WrOp.SEND: O.SEND_ONLY, WrOp.SEND_IMM: O.SEND_ONLY_IMM,
                       WrOp.SEND_INV: O.SEND_ONLY_INV}[w.op]
            elif first:
                opc = O.SEND_FIRST
            elif last:
                opc = {WrOp.SEND: O.SEND_LAST, WrOp.SEND_IMM: O.SEND_LAST_IMM,
                       WrOp.SEND_INV: O.SEND_LAST_INV}[w.op]
            else:
                opc = O.SEND_MIDDLE
            if last and w.op == WrOp.SEND_IMM:
                ext = pack(ImmDt, imm=w.imm)
            if last and w.op == WrOp.SEND_INV:
                ext = pack(IETH, rkey=w.inv_rkey)
        else:
            imm = w.op == WrOp.WRITE_IMM
            if n == 1:
                opc = O.WRITE_ONLY_IMM if imm else O.WRITE_ONLY
            elif first:
                opc = O.WRITE_FIRST
            elif last:
                opc = O.WRITE_LAST_IMM if imm else O.WRITE_LAST
            else:
                opc = O.WRITE_MIDDLE
            if first:
                ext = pack(RETH, va=w.va, rkey=w.rkey, dma_length=len(w.payload))
            if last and imm:
                ext += pack(ImmDt, imm=w.imm)
        # AckReq on the last packet of a message and every 64th packet inside a long one.
        self._since_ackreq += 1
        ackreq = last or self._since_ackreq >= 64
        if ackreq:
            self._since_ackreq = 0
        return dict(opcode=opc.value, psn=psn, ackreq=ackreq, ext=ext, payload=chunk)

    # ---- responder ------------------------------------------------------------------------
    def _queue(self, **kw):
        if self._pending_ack is not None:       # keep ACK/response order on the wire
            self._out.append(self._ack_kwargs(*self._pending_ack))
            self._pending_ack = None
        self._out.append(kw)

    def _ack_kwargs(self, psn, syndrome):
        return dict(opcode=O.ACKNOWLEDGE.value, psn=psn,
                    ext=pack(AETH, syndrome=syndrome, msn=self._msn))

    def _send_nak(self, psn, syndrome):
        self.ep.counters.naks_sent += 1
        self._queue(**self._ack_kwargs(psn, syndrome))

    def _ack(self, psn):
        """Coalesce ACKs: only the newest one waiting at poll_tx time goes out."""
        self._pending_ack = (psn, AethSyndrome.ACK.value)

    def _fatal(self, psn, syndrome, why=""):
        """NAK invalid request / remote access / remote operational: responder to Error."""
        self.error_reason = f"responder: {why} at PSN {psn:#x}"
        self._send_nak(psn, syndrome)
        self._in_send = self._in_write = None
        self.state = QPState.ERROR
        self._flush()
        if self.on_state:
            self.on_state(self, QPState.ERROR)

    def _resp_rx(self, pkt):
        ctr = self.ep.counters
        if self.state not in (QPState.RTR, QPState.RTS):
            ctr.bad_qp_state += 1
            return
        op, p = pkt.opcode, pkt.psn
        d = psn_diff(p, self.epsn)
        if d > 0:
            ctr.psn_errors += 1
            if self._nak_armed:
                self._nak_armed = False
                self._send_nak(self.epsn, AethSyndrome.NAK_PSN_SEQ_ERROR.value)
            return
        if d < 0:
            ctr.duplicates += 1
            self._duplicate(pkt)
            return
        self._nak_armed = True
        # opcode sequence (§3): continuation packets only inside a message, and vice versa
        if self._in_send is not None and op not in _MID_OR_LAST_SEND or \
                self._in_write is not None and op not in _MID_OR_LAST_WRITE or \
                self._in_send is None and self._in_write is None and op not in _FIRST_OR_ONLY:
            state = "SEND" if self._in_send is not None else \
                "WRITE" if self._in_write is not None else "no message"
            return self._fatal(p, AethSyndrome.NAK_INVALID_REQUEST.value,
                               f"opcode {op:#x} out of sequence (inside {state})")
        n = len(pkt.payload)
        if op in (O.SEND_FIRST.value, O.SEND_MIDDLE.value, O.WRITE_FIRST.value,
                  O.WRITE_MIDDLE.value) and n != self.pmtu or \
                op in _LAST and not 1 <= n <= self.pmtu or op in _ONLY and n > self.pmtu:
            return self._fatal(p, AethSyndrome.NAK_INVALID_REQUEST.value, "payload length")
        if op in _NEEDS_RECV and self.recv_credits is not None and self.recv_credits <= 0:
            ctr.rnr_naks_sent += 1
            ctr.naks_sent += 1
            self._queue(**self._ack_kwargs(p, AethSyndrome.RNR_NAK.value | self.min_rnr_timer))
            return
        if op == O.READ_REQUEST.value:
            return self._read(pkt, p, new=True)
        if op in _ATOMIC_OPS:
            return self._atomic(pkt, p)
        if op in _SEND_OPS:
            if op in (O.SEND_FIRST.value, O.SEND_ONLY.value, O.SEND_ONLY_IMM.value,
                      O.SEND_ONLY_INV.value) and self.recv_credits is not None:
                self.recv_credits -= 1
            if op == O.SEND_FIRST.value:
                self._in_send = bytearray(pkt.payload)
            elif op == O.SEND_MIDDLE.value:
                self._in_send += pkt.payload
            else:
                msg = bytes(self._in_send or b"") + pkt.payload
                inv = pkt.ext["ieth"]["rkey"] if "ieth" in pkt.ext else None
                if inv is not None and not self.ep.invalidate(inv, missing_ok=True):
                    return self._fatal(p, AethSyndrome.NAK_INVALID_REQUEST.value,
                                       "invalidate failed")
                self._in_send = None
                self._msn = (self._msn + 1) & PSN_MASK
                imm = pkt.ext["imm"]["imm"] if "imm" in pkt.ext else None
                if self.on_message:
                    self.on_message(self, msg, imm=imm, invalidated_rkey=inv)
        else:                                   # RDMA WRITE
            if "reth" in pkt.ext:
                r = pkt.ext["reth"]
                if r["dma_length"] == 0:
                    mr, off = None, 0
                else:
                    mr = self.ep._lookup(r["rkey"])
                    off = mr.offset(r["va"], r["dma_length"]) if mr and mr.write else None
                    if off is None:
                        ctr.rkey_errors += 1
                        return self._fatal(p, AethSyndrome.NAK_REMOTE_ACCESS.value, "write access")
                self._in_write = [mr, off, r["dma_length"]]
            mr, off, rem = self._in_write
            last = op not in (O.WRITE_FIRST.value, O.WRITE_MIDDLE.value)
            if n > rem or last and n != rem:
                return self._fatal(p, AethSyndrome.NAK_INVALID_REQUEST.value, "write length")
            if n:
                mr.data[off:off + n] = pkt.payload
            self._in_write = [mr, off + n, rem - n]
            if last:
                self._in_write = None
                self._msn = (self._msn + 1) & PSN_MASK
                if "imm" in pkt.ext:
                    if self.recv_credits is not None:
                        self.recv_credits -= 1
                    if self.on_message:
                        self.on_message(self, b"", imm=pkt.ext["imm"]["imm"],
                                        invalidated_rkey=None)
        self.epsn = (p + 1) & PSN_MASK
        if pkt.ackreq:
            self._ack(p)

    def _read(self, pkt, p, new):
        r = pkt.ext["reth"]
        length, va = r["dma_length"], r["va"]
        if new:
            mr, off = None, 0
            if length:
                mr = self.ep._lookup(r["rkey"])
                off = mr.offset(va, length) if mr and mr.read else None
                if off is None or length > 1 << 31:
                    self.ep.counters.rkey_errors += 1
                    return self._fatal(p, AethSyndrome.NAK_REMOTE_ACCESS.value, "read access")
            npsn = max(1, -(-length // self.pmtu))
            self._save_ctx(dict(kind="read", psn=p, npsn=npsn, va=va, rkey=r["rkey"],
                                length=length))
            self._msn = (self._msn + 1) & PSN_MASK
            self.epsn = (p + npsn) & PSN_MASK
        else:
            mr = self.ep._lookup(r["rkey"]) if length else None
            off = mr.offset(va, length) if mr else 0
            if length and (off is None or not mr.valid):
                return
        mem = bytes(mr.data[off:off + length]) if length else b""
        npsn = max(1, -(-length // self.pmtu))
        for k in range(npsn):
            chunk = mem[k * self.pmtu:(k + 1) * self.pmtu]
            if npsn == 1:
                opc = O.READ_RESPONSE_ONLY
            elif k == 0:
                opc = O.READ_RESPONSE_FIRST
            elif k == npsn - 1:
                opc = O.READ_RESPONSE_LAST
            else:
                opc = O.READ_RESPONSE_MIDDLE
            ext = b"" if opc == O.READ_RESPONSE_MIDDLE else pack(
                AETH, syndrome=AethSyndrome.ACK.value, msn=self._msn)
            self._queue(opcode=opc.value, psn=(p + k) & PSN_MASK, ext=ext, payload=chunk)

    def _atomic(self, pkt, p):
        a = pkt.ext["atomic"]
        if a["va"] % 8:
            return self._fatal(p, AethSyndrome.NAK_INVALID_REQUEST.value, "atomic misaligned")
        mr = self.ep._lookup(a["rkey"])
        off = mr.offset(a["va"], 8) if mr and mr.atomic else None
        if off is None:
            self.ep.counters.rkey_errors += 1
            return self._fatal(p, AethSyndrome.NAK_REMOTE_ACCESS.value, "atomic access")
        orig = int.from_bytes(mr.data[off:off + 8], "little")
        if pkt.opcode == O.FETCH_ADD.value:
            new = (orig + a["swap_add"]) & ((1 << 64) - 1)
        else:
            new = a["swap_add"] if orig == a["compare"] else orig
        mr.data[off:off + 8] = new.to_bytes(8, "little")
        self._save_ctx(dict(kind="atomic", psn=p, npsn=1, orig=orig))
        self._msn = (self._msn + 1) & PSN_MASK
        self.epsn = (p + 1) & PSN_MASK
        self._atomic_ack(p, orig)

    def _atomic_ack(self, p, orig):
        self._queue(opcode=O.ATOMIC_ACKNOWLEDGE.value, psn=p,
                    ext=pack(AETH, syndrome=AethSyndrome.ACK.value, msn=self._msn)
                    + pack(AtomicAckETH, orig_data=orig))

    def _save_ctx(self, ctx):
        self._rd_ctx.append(ctx)
        while len(self._rd_ctx) > max(1, self.max_dest_rd_atomic):
            self._rd_ctx.popleft()

    def _duplicate(self, pkt):
        """§6.6: re-ACK SEND/WRITE, re-read READ, replay atomics; never re-execute."""
        op, p = pkt.opcode, pkt.psn
        if op == O.READ_REQUEST.value or op in _ATOMIC_OPS:
            for c in reversed(self._rd_ctx):
                if 0 <= psn_diff(p, c["psn"]) < c["npsn"]:
                    break
            else:
                return                          # no context: drop silently
            if c["kind"] == "atomic":
                if op in _ATOMIC_OPS and p == c["psn"]:
                    self._atomic_ack(p, c["orig"])
                return
            if op != O.READ_REQUEST.value:
                return
            r = pkt.ext["reth"]
            # as rxe: the retried range must lie within the original READ, same R_Key
            if r["rkey"] != c["rkey"] or r["va"] < c["va"] or \
                    r["va"] + r["dma_length"] > c["va"] + c["length"]:
                return
            return self._read(pkt, p, new=False)
        self._ack((self.epsn - 1) & PSN_MASK)

    def _resp_packets(self):
        if self._pending_ack is not None:
            self._out.append(self._ack_kwargs(*self._pending_ack))
            self._pending_ack = None
        out, self._out = self._out, []
        for kw in out:
            if kw["opcode"] == O.ACKNOWLEDGE.value and kw["ext"][0] == 0x1F:
                self.ep.counters.acks_sent += 1
        return out


class RoceEndpoint:
    """A RoCEv2 (IPv4) endpoint: ARP, RC QPs (requester + responder), CM on QP1.

    Parameters
    ----------
    mac, ip : own Ethernet and IPv4 address.
    udp_sport_base : base of the UDP source ports of QPs created without a flow label.
    seed : seeds the choice of QPNs, starting PSNs and CM communication IDs (deterministic).
    first_qpn : QPN of the first QP created without an explicit one.
    arp_retry_us : interval of ARP request retries while a peer's MAC is unknown.
    ip_id : IPv4 identification of the frame before the first one sent (it counts up).
    min_frame : pad shorter frames with zeros to this length (0: none, as the captures; 60
        for a real Ethernet link, where the MAC then appends the FCS).
    """

    def __init__(self, mac, ip, *, udp_sport_base=0xC000, seed=0, first_qpn=0x11,
                 arp_retry_us=1_000_000, ip_id=0, min_frame=0):
        self.mac, self.ip = mac_bytes(mac), ip_int(ip)
        self.udp_sport_base = udp_sport_base
        self.rng = random.Random(seed)
        self.counters = Counters()
        self.now = 0
        self.qps = {}
        self.mrs = {}
        self.arp_table = {}
        self.arp_retry_us = arp_retry_us
        self._arp_pending = {}            # ip -> next retry time
        self._tx = []                     # ARP and CM frames waiting for poll_tx
        self._ip_id = ip_id
        self.min_frame = min_frame
        self._next_qpn = first_qpn
        from roce.cm import CmAgent     # late import: rc_cm builds on this module
        self.cm = CmAgent(self)

    # ---- memory ---------------------------------------------------------------------------
    def register(self, data, base_va, rkey, *, read=True, write=True, atomic=False):
        """Register ``data`` (bytearray/memoryview) at ``base_va`` under ``rkey``."""
        mr = MR(data, base_va, rkey, read, write, atomic)
        self.mrs[rkey] = mr
        return mr

    def invalidate(self, rkey, missing_ok=False):
        """Invalidate the region of ``rkey``; later accesses get NAK remote access."""
        mr = self.mrs.get(rkey)
        if mr is None or not mr.valid:
            if missing_ok:
                return False
            raise KeyError(f"no valid MR with rkey {rkey:#x}")
        mr.valid = False
        return True

    def _lookup(self, rkey):
        mr = self.mrs.get(rkey)
        return mr if mr is not None and mr.valid else None

    # ---- QPs ------------------------------------------------------------------------------
    def create_qp(self, *, qpn=None, dest_qpn=None, remote_ip=None, remote_mac=None,
                  state=None, **attrs):
        """Create an RC QP. With ``dest_qpn`` and ``remote_ip`` given it goes straight to RTS
        (``sq_psn`` / ``epsn`` default 0), otherwise it stays in INIT for the CM."""
        if qpn is None:
            while self._next_qpn in self.qps or self._next_qpn < 2:
                self._next_qpn += 1
            qpn = self._next_qpn
            self._next_qpn += 1
        if qpn in self.qps or qpn < 2 or qpn > 0xFFFFFF:
            raise ValueError(f"QPN {qpn:#x} unavailable")
        if dest_qpn is not None:
            attrs["dest_qpn"] = dest_qpn
        if remote_ip is not None:
            attrs["remote_ip"] = remote_ip
        if remote_mac is not None:
            attrs["remote_mac"] = remote_mac
        if state is None:
            state = QPState.RTS if dest_qpn is not None and remote_ip is not None else \
                QPState.INIT
        qp = QP(self, qpn, **attrs)
        self.qps[qpn] = qp
        qp.modify(state=state)
        return qp

    def destroy_qp(self, qp):
        self.qps.pop(qp.qpn, None)

    # ---- CM (roce/cm.py) ----------------------------------------------------------------
    def listen(self, port=18515, on_connect=None, **kw):
        """Passive side: accept rdma_cm connections to ``port`` (see CmAgent.listen)."""
        return self.cm.listen(port, on_connect, **kw)

    def connect(self, dst_ip, port=18515, on_connect=None, **kw):
        """Active side: connect to ``dst_ip:port``; returns the QP (RTS once the REP is in)."""
        return self.cm.connect(dst_ip, port, on_connect, **kw)

    def disconnect(self, qp):
        """Send DREQ for the CM connection of ``qp`` (the QP goes to Error first)."""
        return self.cm.disconnect(qp)

    # ---- frames ---------------------------------------------------------------------------
    def _next_ip_id(self):
        self._ip_id = (self._ip_id + 1) & 0xFFFF
        return self._ip_id

    def _pad(self, frame):
        """Ethernet padding up to ``min_frame`` octets (60 on a real link, §1.1)."""
        self.counters.frames_out += 1
        return frame + bytes(self.min_frame - len(frame)) if len(frame) < self.min_frame \
            else frame

    def build(self, dst_mac, dst_ip, sport, dest_qp, **kw):
        """One RoCEv2 frame from this endpoint (fresh IP ID: the ICRC is recomputed)."""
        return self._pad(build_roce(self.mac, dst_mac, self.ip, dst_ip, sport, dest_qp=dest_qp,
                                    ip_id=self._next_ip_id(), **kw))

    def send_raw(self, frame):
        self._tx.append(frame)

    def receive_frame(self, frame, now_us):
        """Process one received Ethernet frame (no FCS)."""
        self.now = max(self.now, now_us)
        ctr = self.counters
        ctr.frames_in += 1
        dst = bytes(frame[:6])
        if dst != self.mac and dst != BROADCAST_MAC:
            ctr.not_for_us += 1
            return
        try:
            kind, pkt = parse_frame(frame)
        except FrameError as e:
            name = {"icrc": "icrc_errors", "ip_checksum": "ip_checksum_errors",
                    "udp_checksum": "udp_checksum_errors"}.get(e.kind, "malformed")
            setattr(ctr, name, getattr(ctr, name) + 1)
            return
        if kind == "arp":
            return self._arp_rx(pkt)
        if kind != "roce":
            return
        if pkt.dst_ip != self.ip:
            ctr.not_for_us += 1
            return
        if pkt.bth["pkey"] & 0x7FFF != 0x7FFF:
            ctr.malformed += 1
            return
        if pkt.dest_qp == 1:
            if pkt.opcode != O.UD_SEND_ONLY.value or pkt.ext["deth"]["qkey"] != GSI_QKEY:
                ctr.malformed += 1
                return
            ctr.cm_in += 1
            if pkt.src_ip not in self.arp_table:
                self.arp_table[pkt.src_ip] = pkt.eth_src
            return self.cm.receive(pkt)
        qp = self.qps.get(pkt.dest_qp)
        if qp is None or pkt.opcode >> 5 != 0:
            ctr.unknown_qp += 1
            return
        if pkt.src_ip != qp.remote_ip:
            ctr.not_for_us += 1
            return
        if qp.cm is not None:
            qp.cm.rc_traffic(qp)
        if pkt.opcode in _RESPONSE_OPS:
            qp._req_rx(pkt)
        elif pkt.opcode in _REQUEST_OPS:
            qp._resp_rx(pkt)
        else:
            ctr.malformed += 1

    def _arp_rx(self, a):
        if a.target_ip != self.ip:
            return
        self.arp_table[a.sender_ip] = a.sender_mac
        self._arp_pending.pop(a.sender_ip, None)
        if a.oper == 1:
            self.counters.arp_replies_sent += 1
            self._tx.append(self._pad(build_arp(2, self.mac, self.ip, a.sender_mac,
                                                a.sender_ip, a.sender_mac)))

    def resolve(self, ip):
        """MAC of ``ip`` if known; otherwise start (or keep) ARP-ing for it and return None."""
        ip = ip_int(ip)
        mac = self.arp_table.get(ip)
        if mac is None and ip not in self._arp_pending:
            self._arp_pending[ip] = self.now
        return mac

    def _arp_tick(self):
        for ip, when in list(self._arp_pending.items()):
            if self.now >= when:
                self.counters.arp_requests_sent += 1
                self._tx.append(self._pad(build_arp(1, self.mac, self.ip, b"\x00" * 6, ip,
                                                    BROADCAST_MAC)))
                self._arp_pending[ip] = self.now + self.arp_retry_us

    def tick(self, now_us):
        """Advance time: retransmission, RNR, ARP and CM timers."""
        self.now = max(self.now, now_us)
        for qp in list(self.qps.values()):
            qp._req_tick(self.now)
        self.cm.tick(self.now)

    def next_deadline(self):
        """Earliest time at which :meth:`tick` has work to do (None = no timer running)."""
        ds = [qp._deadline() for qp in self.qps.values()]
        ds += list(self._arp_pending.values()) + [self.cm.deadline()]
        ds = [d for d in ds if d is not None]
        return min(ds) if ds else None

    def poll_tx(self):
        """Frames to put on the wire now (ARP, CM, responder packets, requester packets)."""
        self._arp_tick()
        out, self._tx = self._tx, []
        for qp in list(self.qps.values()):
            if qp.remote_ip == 0 or qp.state in (QPState.RESET, QPState.INIT):
                continue
            mac = qp.remote_mac or self.resolve(qp.remote_ip)
            if mac is None:
                self._arp_tick()
                out += self._tx
                self._tx = []
                continue
            for kw in qp._resp_packets() + qp._req_packets():
                out.append(self.build(mac, qp.remote_ip, qp.sport or self.udp_sport_base,
                                      qp.dest_qpn, tos=qp.tos, ttl=qp.ttl, pkey=qp.pkey, **kw))
        return out

    def build_qp1(self, dst_mac, dst_ip, mad, psn):
        """A QP1 (GSI) datagram: UD SEND Only + DETH (Q_Key 0x80010000, source QP 1)."""
        self.counters.cm_out += 1
        sport = 0xC000 + (((1 * 0x61C88647) & 0xFFFFFFFF) >> 18)   # Linux hash_32(1, 14)
        return self.build(dst_mac, dst_ip, sport, 1, opcode=O.UD_SEND_ONLY.value, psn=psn,
                          ackreq=1, ext=pack(DETH, qkey=GSI_QKEY, src_qp=1), payload=mad)

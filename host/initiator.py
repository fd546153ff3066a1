# Ref: draft KBTP §Session Establishment, §Operations, §Completion, §Direct Modes,
#      §InfiniBand and RoCEv2; docs/softroce-vm.md (pyverbs 44, rdma_cm, own QP)
"""A KBTP initiator on RDMA verbs (pyverbs): :class:`KbtpClient`.

Runs where pyverbs runs (the soft-RoCE guest: Debian python3-pyverbs 44, Python 3.11). It imports
only the standard library, pyverbs and the project's :mod:`host.codec` (which imports
:mod:`hw.headers` and so amaranth: amaranth is pure Python, and ``sim.serve_guest`` puts a copy
of it, with jschon and rfc3986, on the guest's ``PYTHONPATH`` next to ``hw`` and ``host``).

Connection: an rdma_cm CMID resolves the target; the QP is our own (a CMID's QP can only SEND
and RECV), walked to RTS with the attributes ``cmid.init_qp_attr`` gives plus our own timeout and
retry counts, and its number goes in ``ConnParam(qp_num=...)`` with ``responder_resources`` and
``initiator_depth`` set (the target RDMA READs our buffers). Then HELLO -> :attr:`session`.

Operations return the COMPLETION (:class:`host.codec.Completion`), or raise
:class:`KbtpStatusError` when its Status is not OK. Pipelining: :meth:`submit` posts a request
(up to the HELLO_ACK's request credits in flight) and returns its Request ID; :meth:`wait`
returns its completion. The blocking methods are submit + wait.

INVALIDATE: a LOAD's destination may be a type-2B memory window bound over the buffer
(:meth:`window`); the target's Send with Invalidate invalidates the window, and the receive
completion says so (``IBV_WC_WITH_INV``; the invalidated R_Key is in the WC's immediate field,
a C union). Registered memory regions themselves cannot be invalidated remotely on rxe (only
fast-registration MRs can), hence windows.

Example (in the guest)::

    c = KbtpClient(os.environ["KBTP_TARGET_IP"], initiator_id=7)
    c.alloc_store(c.handle(0), b"KV" * 100, seal=True)
    data = c.load(c.handle(0), length=200).data
    c.goodbye(release=True)
"""

import os
import signal
import socket
import time
from dataclasses import dataclass

import pyverbs.cm_enums as ce
import pyverbs.enums as e
from pyverbs.cmid import CMID, AddrInfo, ConnParam
from pyverbs.cq import CQ
from pyverbs.mr import MR, MW, MWBindInfo
from pyverbs.qp import QP, QPCap, QPInitAttr
from pyverbs.wr import SGE, RecvWR, SendWR

from host import codec
from hw.headers import EntryFlags, Features, GoodbyeFlags, ReqFlags, Status

__all__ = ["KbtpClient", "KbtpStatusError", "KbtpTransportError", "Buffer", "LoadResult",
           "Ticket", "DirectLoadResult", "ALL_FEATURES"]

ALL_FEATURES = (Features.DIRECT_LOAD | Features.DIRECT_ALLOC | Features.RECORD_COMPLETION
                | Features.ADDR_LE).value
_MSG_SLOT = 2048                       # one send/recv buffer: header + inline data
_REMOTE = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
_WR_RECV_BASE = 1 << 40               # wr_id space of receive buffers
_EMPTY = (1 << 64) - 1
_MASK32 = (1 << 32) - 1
_RING_ADD = 1 << 32                   # unmasked FetchAdd variant: Sequence field +1


class KbtpStatusError(Exception):
    """A COMPLETION (or HELLO_ACK) with a Status other than OK.

    Attributes
    ----------
    status_name : str
        e.g. ``"STALE_GENERATION"``.
    status : int
    completion : host.codec.Completion or HelloAck
    """

    def __init__(self, status_name, completion=None, op=""):
        self.status_name = status_name
        self.status = getattr(completion, "status", None)
        self.completion = completion
        self.op = op
        super().__init__(f"{op} {status_name}".strip())


class KbtpTransportError(Exception):
    """A work request failed (WC status) or an expected message did not arrive in time.

    ``wc_status`` is the failed work completion's status (``ibv_wc_status``), None for a
    timeout."""

    def __init__(self, msg, wc_status=None):
        super().__init__(msg)
        self.wc_status = wc_status


class _Alarm:
    """Bound a blocking rdma_cm call with SIGALRM (it does not return to Python otherwise)."""

    def __init__(self, seconds, what):
        self.seconds, self.what = seconds, what

    def _fire(self, *_):
        raise KbtpTransportError(f"{self.what}: no answer within {self.seconds} s")

    def __enter__(self):
        self.old = signal.signal(signal.SIGALRM, self._fire)
        signal.alarm(self.seconds)

    def __exit__(self, *exc):
        signal.alarm(0)
        signal.signal(signal.SIGALRM, self.old)


class Buffer:
    """A registered buffer: remote (``rkey``) and local (``lkey``) access, address = its VA.

    ``rkey`` is the R_Key the target uses; for a window (:meth:`KbtpClient.window`) it is the
    window's, and ``mr`` is the region underneath.
    """

    def __init__(self, mr, addr, length, rkey):
        self.mr, self.addr, self.length, self.rkey = mr, addr, length, rkey
        self.lkey = mr.lkey

    def write(self, data, offset=0):
        self.mr.write(bytes(data), len(data), offset + self.addr - self.mr.buf)

    def read(self, length=None, offset=0):
        n = self.length - offset if length is None else length
        return self.mr.read(n, offset + self.addr - self.mr.buf) if n else b""


@dataclass
class LoadResult:
    completion: object
    data: bytes
    invalidated_rkey: int | None = None
    recorded: bool = False              # the completion came as a record (RECORD)


@dataclass
class Ticket:
    """A DIRECT_ALLOC allocation: ticket, the block's Offset, and the length written."""
    ticket: int
    block_offset: int
    data_length: int


@dataclass
class DirectLoadResult:
    entry: object                       # codec.TableEntryValue
    data: bytes


class KbtpClient:
    """A KBTP session over one RC connection (see the module docstring).

    Parameters
    ----------
    target_ip : str
    port : int
        RDMA CM port of the target.
    initiator_id : int
    features : int
        Requested features (default: all four).
    completion_credits : int
        Receive buffers posted for COMPLETION Sends (sent in HELLO).
    qp_timeout, retry_cnt, rnr_retry : int
        Local ACK timeout code and retry counts of the QP (a slow target wants a large timeout).
    rd_atomic : int
        responder_resources / initiator_depth of ConnParam and the QP.
    hello : bool
        Send HELLO at once (else call :meth:`hello`).
    """

    def __init__(self, target_ip, port=18515, *, initiator_id=1, features=ALL_FEATURES,
                 completion_credits=16, qp_timeout=16, retry_cnt=7, rnr_retry=7, rd_atomic=16,
                 hello=True, connect_timeout_s=30):
        self.target_ip, self.port = target_ip, port
        self.initiator_id = initiator_id
        self.requested = features
        self.completion_credits = completion_credits
        self.session = None
        self.addr_le = False
        self._next_rid = 1
        self._done = {}                 # request id -> (completion, wc_flags, imm)
        self._inflight = set()
        self._send_pending = 0
        self._wcs = {}                  # wr_id -> WC of one-sided / bind work requests
        self._records = {}              # request id -> Buffer of its completion record
        self._wr_seq = 1
        self.stats = {"sends": 0, "completions": 0, "reads": 0, "writes": 0, "atomics": 0}
        self._connect(connect_timeout_s, qp_timeout, retry_cnt, rnr_retry, rd_atomic)
        if hello:
            self.hello()

    # ---------------------------------------------------------------- connection
    def _connect(self, tmo, qp_timeout, retry_cnt, rnr_retry, rd_atomic):
        ai = AddrInfo(dst=self.target_ip, dst_service=str(self.port),
                      port_space=ce.RDMA_PS_TCP)
        with _Alarm(tmo, "rdma_cm address/route resolution"):
            self.cmid = CMID(creator=ai)
        self.ctx, self.pd = self.cmid.context, self.cmid.pd
        depth = 4 * self.completion_credits + 256
        self.cq = CQ(self.ctx, depth)
        cap = QPCap(max_send_wr=128, max_recv_wr=self.completion_credits + 4,
                    max_send_sge=1, max_recv_sge=1)
        self.qp = QP(self.pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=self.cq, rcq=self.cq,
                                         cap=cap))
        attr, mask = self.cmid.init_qp_attr(e.IBV_QPS_INIT)
        attr.qp_access_flags = _REMOTE | e.IBV_ACCESS_REMOTE_ATOMIC | e.IBV_ACCESS_MW_BIND
        self.qp.modify(attr, mask | e.IBV_QP_ACCESS_FLAGS)
        # Message buffers: credits x send slots, completion_credits x receive slots.
        self._sbuf = MR(self.pd, _MSG_SLOT * 64, e.IBV_ACCESS_LOCAL_WRITE)
        self._sfree = list(range(64))
        self._rbuf = MR(self.pd, _MSG_SLOT * self.completion_credits,
                        e.IBV_ACCESS_LOCAL_WRITE)
        for i in range(self.completion_credits):
            self._post_recv(i)
        param = ConnParam(resources=rd_atomic, depth=rd_atomic, retry=retry_cnt,
                          rnr_retry=rnr_retry, qp_num=self.qp.qp_num)
        with _Alarm(tmo, "rdma_cm connect"):
            self.cmid.connect(param)
        attr, mask = self.cmid.init_qp_attr(e.IBV_QPS_RTR)
        self.qp.modify(attr, mask)
        attr, mask = self.cmid.init_qp_attr(e.IBV_QPS_RTS)
        attr.timeout, attr.retry_cnt, attr.rnr_retry = qp_timeout, retry_cnt, rnr_retry
        self.qp.modify(attr, mask | e.IBV_QP_TIMEOUT | e.IBV_QP_RETRY_CNT | e.IBV_QP_RNR_RETRY)
        with _Alarm(tmo, "rdma_cm establish"):
            self.cmid.establish()
        # Scratch buffers for one-sided operations and LOAD destinations.
        self._scratch = self.register(64 * 1024 + 64)

    def _post_recv(self, i):
        sge = SGE(self._rbuf.buf + i * _MSG_SLOT, _MSG_SLOT, self._rbuf.lkey)
        self.qp.post_recv(RecvWR(wr_id=_WR_RECV_BASE + i, num_sge=1, sg=[sge]))

    def close(self):
        """Disconnect (DREQ) without GOODBYE."""
        try:
            with _Alarm(10, "rdma_cm disconnect"):
                self.cmid.disconnect()
        except Exception:
            pass

    # ---------------------------------------------------------------- memory
    def register(self, length, data=None):
        """A new registered buffer the target may read and write (zeros, or ``data``)."""
        mr = MR(self.pd, max(length, 1), _REMOTE | e.IBV_ACCESS_REMOTE_ATOMIC |
                e.IBV_ACCESS_MW_BIND)
        b = Buffer(mr, mr.buf, length, mr.rkey)
        if data is not None:
            b.write(data)
        return b

    def qp_state(self):
        """The connection's QP state (``ibv_qp_state``, e.g. ``IBV_QPS_ERR`` once our NIC has
        moved it to error)."""
        attr, _ = self.qp.query(e.IBV_QP_STATE)
        return attr.qp_state

    def window(self, buf, access=e.IBV_ACCESS_REMOTE_WRITE):
        """Bind a type-2B memory window over ``buf``; returns a Buffer with the window's R_Key
        (what INVALIDATE lets the target invalidate)."""
        mw = MW(self.pd, e.IBV_MW_TYPE_2)
        wr = SendWR(wr_id=self._wr(), opcode=e.IBV_WR_BIND_MW, num_sge=0,
                    send_flags=e.IBV_SEND_SIGNALED)
        wr.set_bind_wr(mw, MWBindInfo(buf.mr, buf.addr, buf.length, access))
        self.qp.post_send(wr)
        self._wait_wr(wr.wr_id, "bind memory window")
        w = Buffer(buf.mr, buf.addr, buf.length, wr.rkey)
        w.mw = mw
        return w

    # ---------------------------------------------------------------- completion queue
    def _wr(self):
        self._wr_seq += 1
        return self._wr_seq

    def _poll(self, deadline):
        n, wcs = self.cq.poll(16)
        if not n:
            if time.monotonic() > deadline:
                raise KbtpTransportError("timed out waiting for completions")
            return
        for wc in wcs[:n]:
            if wc.wr_id >= _WR_RECV_BASE:
                i = wc.wr_id - _WR_RECV_BASE
                if wc.status != e.IBV_WC_SUCCESS:
                    raise KbtpTransportError(f"receive failed: WC status {wc.status}",
                                             wc_status=wc.status)
                self._post_recv(i)
                if wc.opcode == e.IBV_WC_RECV_RDMA_WITH_IMM:
                    self._on_record(wc.imm_data)
                    continue
                raw = self._rbuf.read(wc.byte_len, i * _MSG_SLOT)
                self._on_message(raw, wc.wc_flags, wc.imm_data)
            elif wc.wr_id & (1 << 39):          # SEND of a request
                self._sfree.append(wc.wr_id & 0xFFFF)
                if wc.status != e.IBV_WC_SUCCESS:
                    raise KbtpTransportError(f"SEND failed: WC status {wc.status}",
                                             wc_status=wc.status)
            else:
                self._wcs[wc.wr_id] = wc

    def _wait_wr(self, wr_id, what, timeout_s=60):
        deadline = time.monotonic() + timeout_s
        while wr_id not in self._wcs:
            self._poll(deadline)
        wc = self._wcs.pop(wr_id)
        if wc.status != e.IBV_WC_SUCCESS:
            raise KbtpTransportError(f"{what} failed: WC status {wc.status}",
                                     wc_status=wc.status)
        return wc

    def _on_message(self, raw, flags, imm):
        if os.environ.get("KBTP_DEBUG"):
            print(f"debug: recv {len(raw)} octets wc_flags={flags:#x} imm={imm:#x}", flush=True)
        msg = codec.decode(raw)
        self.stats["completions"] += 1
        inv = imm if flags & e.IBV_WC_WITH_INV else None
        if isinstance(msg, codec.HelloAck):
            self._done["hello"] = (msg, inv)
        else:
            self._done[msg.request_id] = (msg, inv)

    def _on_record(self, imm):
        """A completion record arrived by RDMA Write with Immediate (RECORD_COMPLETION): the
        immediate is the low 32 bits of the Request ID (pyverbs gives it in network order)."""
        low = socket.ntohl(imm)
        rid = next((r for r in self._records if r & _MASK32 in (low, imm)), None)
        if rid is None:
            raise KbtpTransportError(f"record for unknown request (imm {low:#x})")
        buf = self._records.pop(rid)
        rec = codec.decode_record(buf.read(24))
        self.stats["completions"] += 1
        self._done[rid] = (codec.Completion(request_id=rec.request_id, status=rec.status,
                                            generation=rec.generation,
                                            data_length=rec.data_length,
                                            block_offset=rec.block_offset), "record")

    # ---------------------------------------------------------------- messages
    def _post_message(self, msg):
        raw = msg if isinstance(msg, bytes) else codec.encode(msg, addr_le=self.addr_le)
        if len(raw) > _MSG_SLOT:
            raise ValueError("message larger than a send slot")
        deadline = time.monotonic() + 60
        while not self._sfree:
            self._poll(deadline)
        slot = self._sfree.pop()
        self._sbuf.write(raw, len(raw), slot * _MSG_SLOT)
        sge = SGE(self._sbuf.buf + slot * _MSG_SLOT, len(raw), self._sbuf.lkey)
        self.qp.post_send(SendWR(wr_id=(1 << 39) | slot, opcode=e.IBV_WR_SEND, num_sge=1,
                                 sg=[sge], send_flags=e.IBV_SEND_SIGNALED))
        self.stats["sends"] += 1

    def hello(self, timeout_s=60):
        """HELLO -> HELLO_ACK; sets :attr:`session` (the HelloAck) and ADDR_LE."""
        self._post_message(codec.Hello(requested_features=self.requested,
                                       completion_credits=self.completion_credits,
                                       initiator_id=self.initiator_id))
        deadline = time.monotonic() + timeout_s
        while "hello" not in self._done:
            self._poll(deadline)
        ack, _ = self._done.pop("hello")
        if ack.status != Status.OK.value:
            raise KbtpStatusError(Status(ack.status).name, ack, "HELLO")
        self.session = ack
        self.addr_le = bool(ack.features & Features.ADDR_LE.value)
        return ack

    @property
    def credits(self):
        return self.session.request_credits if self.session else 1

    def handle(self, i):
        """The ``i``-th Block Handle of this session's range."""
        if not 0 <= i < self.session.handle_count:
            raise IndexError(f"handle index {i} outside 0..{self.session.handle_count - 1}")
        return self.session.handle_base + i

    def submit(self, msg):
        """Post one request (a :mod:`host.codec` message; its Request ID is assigned here if 0);
        blocks only while all request credits are in use. Returns the Request ID."""
        deadline = time.monotonic() + 120
        while len(self._inflight) >= self.credits:
            self._poll(deadline)
            self._inflight -= set(self._done)
        if not msg.request_id:
            msg.request_id = self._next_rid
        self._next_rid = max(self._next_rid, msg.request_id) + 1
        self._inflight.add(msg.request_id)
        comp = getattr(msg, "completion", None)
        if comp is not None and getattr(msg, "record_buffer", None) is not None:
            self._records[msg.request_id] = msg.record_buffer
        self._post_message(msg)
        return msg.request_id

    def submit_raw(self, raw, request_id):
        """Post ``raw`` octets as a request (negative tests); its COMPLETION is expected
        under ``request_id`` (the target echoes the Request ID it could read)."""
        self._inflight.add(request_id)
        self._post_message(bytes(raw))
        return request_id

    def wait(self, request_id, timeout_s=120, check=True):
        """The COMPLETION of ``request_id`` (KbtpStatusError unless OK when ``check``).

        Returns (completion, invalidated_rkey or None).
        """
        deadline = time.monotonic() + timeout_s
        while request_id not in self._done:
            self._poll(deadline)
        comp, inv = self._done.pop(request_id)
        self._inflight.discard(request_id)
        if check and comp.status != Status.OK.value:
            raise KbtpStatusError(Status(comp.status).name, comp,
                                  f"request {request_id}")
        return comp, inv

    def call(self, msg, check=True):
        return self.wait(self.submit(msg), check=check)

    # ---------------------------------------------------------------- operations
    def _source(self, data, inline):
        """(DataDesc, inline bytes, flags) for store data."""
        data = bytes(data)
        if inline is None:
            inline = len(data) <= min(self.session.max_inline, 256)
        if inline:
            return codec.DataDesc(0, 0, len(data)), data, ReqFlags.INLINE.value
        if isinstance(data, Buffer):
            buf = data
        else:
            buf = self._stage(data)
        return codec.DataDesc(buf.rkey, buf.addr, len(data)), b"", 0

    def _stage(self, data):
        """A registered buffer holding ``data`` (kept until the next stage of that size)."""
        buf = self.register(len(data), data)
        self._staged = getattr(self, "_staged", [])
        self._staged.append(buf)
        if len(self._staged) > 2 * self.credits:
            self._staged.pop(0)
        return buf

    def store_msg(self, handle, data, *, seal=False, inline=None, generation=0, alloc=False,
                  record=None, invalidate=False):
        """The STORE / ALLOC_STORE message for ``data`` (bytes or a Buffer)."""
        if isinstance(data, Buffer):
            desc, inl, flags = codec.DataDesc(data.rkey, data.addr, data.length), b"", 0
        else:
            desc, inl, flags = self._source(data, inline)
        if seal:
            flags |= ReqFlags.SEAL.value
        if invalidate:
            flags |= ReqFlags.INVALIDATE.value
        comp = None
        if record is not None:
            flags |= ReqFlags.RECORD.value
            comp = codec.ComplDesc(record.rkey, record.addr)
        cls = codec.AllocStore if alloc else codec.Store
        m = cls(flags=flags, handle=handle, generation=generation, data=desc,
                completion=comp, inline=inl)
        m.record_buffer = record
        return m

    def store(self, handle, data, seal=False, inline=None, generation=0, check=True):
        """STORE (mapped) ``data`` into the block bound to ``handle``; returns the COMPLETION."""
        return self.call(self.store_msg(handle, data, seal=seal, inline=inline,
                                        generation=generation), check)[0]

    def alloc_store(self, handle, data, seal=False, inline=None, generation=0, check=True):
        """ALLOC_STORE (unmapped): allocate a block, write ``data``, bind ``handle``."""
        return self.call(self.store_msg(handle, data, seal=seal, inline=inline,
                                        generation=generation, alloc=True), check)[0]

    def load_msg(self, handle, buf, *, generation=0, allow_unsealed=False, invalidate=False,
                 record=None):
        flags = (ReqFlags.ALLOW_UNSEALED.value if allow_unsealed else 0) | \
            (ReqFlags.INVALIDATE.value if invalidate else 0)
        comp = None
        if record is not None:
            flags |= ReqFlags.RECORD.value
            comp = codec.ComplDesc(record.rkey, record.addr)
        m = codec.Load(flags=flags, handle=handle, generation=generation,
                       data=codec.DataDesc(buf.rkey, buf.addr, buf.length), completion=comp)
        m.record_buffer = record
        return m

    def load(self, handle, buf=None, length=None, generation=0, allow_unsealed=False,
             invalidate=False, check=True, record=None):
        """LOAD ``handle`` into ``buf`` (a Buffer; a scratch one of ``length`` otherwise).

        Returns a :class:`LoadResult` (data = the first Data Length octets of the buffer).
        """
        if buf is None:
            n = self.session.block_size if length is None else length
            buf = Buffer(self._scratch.mr, self._scratch.addr, n, self._scratch.rkey)
        comp, inv = self.call(self.load_msg(handle, buf, generation=generation,
                                            allow_unsealed=allow_unsealed,
                                            invalidate=invalidate, record=record), check)
        data = buf.read(min(comp.data_length, buf.length)) if comp.status == 0 else b""
        if inv == "record":
            return LoadResult(comp, data, None, recorded=True)
        return LoadResult(comp, data, inv)

    def free(self, handle, generation=0, check=True):
        """FREE ``handle``; the COMPLETION carries the new Generation."""
        return self.call(codec.Free(handle=handle, generation=generation), check)[0]

    def goodbye(self, release=False):
        """GOODBYE (no completion), then disconnect (DREQ) once its SEND completed (the target
        would send its own DREQ after host.driver.GOODBYE_GRACE_MS)."""
        flags = GoodbyeFlags.RELEASE.value if release else 0
        self._post_message(codec.Goodbye(flags=flags))
        deadline = time.monotonic() + 30
        while self._sfree and len(self._sfree) < 64 and time.monotonic() < deadline:
            self._poll(deadline)        # until the GOODBYE SEND completed
        self.close()

    # ---------------------------------------------------------------- one-sided
    def _one_sided(self, opcode, local, length, rkey, addr, *, add=None, what=""):
        wr_id = self._wr()
        sge = SGE(local.addr, length, local.lkey)
        wr = SendWR(wr_id=wr_id, opcode=opcode, num_sge=1, sg=[sge],
                    send_flags=e.IBV_SEND_SIGNALED)
        if add is not None:
            wr.set_wr_atomic(rkey, addr, add, 0)
        else:
            wr.set_wr_rdma(rkey, addr)
        self.qp.post_send(wr)
        self._wait_wr(wr_id, what)

    def rdma_read(self, rkey, addr, length):
        """RDMA READ ``length`` octets at (rkey, addr) of the target."""
        self._one_sided(e.IBV_WR_RDMA_READ, self._scratch, length, rkey, addr, what="READ")
        self.stats["reads"] += 1
        return self._scratch.read(length)

    def rdma_write(self, rkey, addr, data):
        """RDMA WRITE ``data`` to (rkey, addr) of the target."""
        src = self._stage(data)
        self._one_sided(e.IBV_WR_RDMA_WRITE, src, len(data), rkey, addr, what="WRITE")
        self.stats["writes"] += 1

    def fetch_add(self, rkey, addr, add):
        """64-bit FetchAdd (unmasked, as rxe has it); returns the original value."""
        self._one_sided(e.IBV_WR_ATOMIC_FETCH_AND_ADD, self._scratch, 8, rkey, addr, add=add,
                        what="FETCH_ADD")
        self.stats["atomics"] += 1
        return int.from_bytes(self._scratch.read(8), "little")

    def direct_load(self, handle, check=True):
        """DIRECT_LOAD: RDMA READ the table entry, then the block's data from the Pool STag.

        Raises KbtpStatusError('NOT_VALID' / 'NOT_SEALED') when the entry says so (as the
        target would answer a LOAD); returns a :class:`DirectLoadResult`.
        """
        s = self.session
        if s.table is None:
            raise KbtpStatusError("MALFORMED", None, "DIRECT_LOAD not granted")
        to = s.table.tagged_offset + 16 * (handle - s.table_base_handle)
        ent = codec.decode_entry(self.rdma_read(s.table.stag, to, 16), addr_le=self.addr_le)
        if check and not ent.flags & EntryFlags.VALID.value:
            raise KbtpStatusError("NOT_VALID", None, "DIRECT_LOAD")
        if check and not ent.flags & EntryFlags.SEALED.value:
            raise KbtpStatusError("NOT_SEALED", None, "DIRECT_LOAD")
        data = self.rdma_read(s.pool.stag, ent.block_offset, ent.data_length) \
            if ent.data_length else b""
        return DirectLoadResult(ent, data)

    def direct_alloc(self, data, poll_s=30):
        """DIRECT_ALLOC: FetchAdd the Head for a ticket, RDMA READ its slot until it holds a
        block (twice equal: a 16-octet read is not atomic), RDMA WRITE ``data`` through the
        Partition STag. Returns a :class:`Ticket`; then :meth:`bind` it."""
        s = self.session
        if s.head is None:
            raise KbtpStatusError("MALFORMED", None, "DIRECT_ALLOC not granted")
        old = self.fetch_add(s.head.stag, s.head.tagged_offset, _RING_ADD)
        t = (old >> 32) & _MASK32
        n = s.ring.count
        to = s.ring.tagged_offset + 16 * (t % n)
        deadline = time.monotonic() + poll_s
        prev = None
        while True:
            cur = codec.decode_slot(self.rdma_read(s.ring.stag, to, 16), addr_le=self.addr_le,
                                    strict=False)
            seq, boff = cur
            if seq == t and boff != _EMPTY and cur == prev:
                break
            prev = cur
            if time.monotonic() > deadline:
                raise KbtpTransportError(f"ticket {t}: slot never filled")
        if data:
            self.rdma_write(s.partition.stag, boff, data)
        return Ticket(t, boff, len(data))

    def bind(self, handle, ticket, generation=0, check=True):
        """BIND ``handle`` to a DIRECT_ALLOC :class:`Ticket`; returns the COMPLETION."""
        return self.call(codec.Bind(handle=handle, generation=generation,
                                    ticket=ticket.ticket, data_length=ticket.data_length,
                                    block_offset=ticket.block_offset), check)[0]


def env_target():
    """The target IP the guest runner exported (KBTP_TARGET_IP), default 10.0.0.2."""
    return os.environ.get("KBTP_TARGET_IP", "10.0.0.2")

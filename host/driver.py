# Ref: draft KBTP §Target Memory Structures (Block Table, Free-Block Ring, initialization rules),
#      §Allocation Quotas, §Session Establishment, §Operations (FREE, BIND, GOODBYE),
#      §Direct Modes, §Completion, §Operational Considerations (retention, Ticket Timeout);
#      layouts.md;
#      model/target.py "Readings of the draft" (the behaviour followed here, the oracle of the tests);
#      hw/kbtp/engine.py "What the host keeps doing"; docs/registers.md (the engine's register map);
#      host/policy.py (the decisions shared with the model, and the differences).
"""The KBTP host driver: the slow path of a :class:`hw.target.target.KbtpTarget`.

The gateware engine runs LOAD, STORE and ALLOC_STORE of configured sessions on its own (fast
path). Everything else arrives in the host's notify queue and is handled here, through the one
narrow interface :class:`host.port.TargetPort`, exactly as the golden model
:class:`model.target.TargetModel` would (same replies octet for octet, same target-memory effects).
Every decision the two must make alike (validation order, quotas, generations, HELLO admission
and HELLO_ACK contents, trust domains, completions) is taken from :mod:`host.policy`; its
docstring lists what still differs between the driver and the model, and why.

API
---
``KbtpDriver(port, cfg, **options)``
    ``port`` a :class:`~host.port.TargetPort`; ``cfg`` a :class:`model.target.TargetConfig` (its
    ``layout()`` places counters, table, rings and pool). Options: ``n_qp`` (QPs of the target),
    ``mem_size`` (octets of target memory, checked against the plan), ``fast_path`` (enable the
    engine), ``n_ranges`` (engine RANGE registers; default that of a target of ``n_qp`` QPs,
    :func:`hw.kbtp.engine.ranges_for`: give the target's own when it was built otherwise or has
    more QPs than ``n_qp``), ``mr_base`` / ``n_mr`` (MR table slots the driver may use for the
    direct-mode STags), ``recv_count`` (receive buffers per QP: always ``cfg.request_credits``,
    see "Receive buffers" below), ``notify_depth`` (the target's RecvNotify FIFO, default
    :data:`NOTIFY_DEPTH_PER_QP` per QP), ``max_messages`` (messages :meth:`poll_all` takes in
    one pass).
``await init()``
    Write the table (all entries invalid), the shared ring and the DIRECT_ALLOC partition rings
    (draft initialization rules), the Head/Tail counters and a zero pool as one bulk image
    ``[0, layout size)``; then the direct-mode MRs (disabled) and the engine registers
    (layout, RANGE[], sessions off, CTRL last).
``await open_qp(qp, *, local_qpn, remote_qpn, peer_mac, peer_ip, ...)``
    Program a transport QP (receive buffers from :attr:`plan`; state RTS) and start a connection
    on it (no session until HELLO). ``program=False`` only starts the connection.
``await poll(now_ms=None)``
    Observe partition Heads, reclaim what can be reclaimed, then pop one RecvNotify; read the
    message from its receive buffer, handle it, send the reply, repost the buffer. Returns a
    :class:`Handled` (or None when the queue was empty).
``await poll_all(now_ms=None, max_messages=None)``
    Every pending message in one pass: the notify queue drained in one bulk pop, the messages
    read in one exchange, consecutive FREEs as one burst (:meth:`_free_many`: what they need
    read once, entry writes back to back, the blocks returned together, the replies and
    reposts in one final exchange). A list of :class:`Handled`, as :meth:`poll` once per
    message would have returned (same replies, same memory). :meth:`serve` uses it.
``await disconnect(qp, now_ms=None)``
    The connection is gone (CM): retain its session (retention timer starts).
``await qp_errors()``
    Bitmap of the QPs the transport holds in error (retry exhaustion, a fatal NAK); the CM
    disconnects them (host/cm.py ``reap_errors``).
``await tick(now_ms)``
    Ticket-timeout reclamation (the engine's own partition tickets dropped first; the
    Partition/Ring/Head MRs are invalidated before reclaiming) and retention expiry.
``await counters()``
    Engine counters per (op, status), HOSTQ_COUNT, STALL_CYCLES, ring occupancy, quota use per
    QP, :attr:`host_actions` (slow-path messages handled), and ``transport``: the responder's
    (``resp.*``, e.g. ``resp.cnt_src_mismatch``: requests dropped because their source address
    is not the QP's peer) and requester's (``req.*``) counters of REG_TRANSPORT.

Every public coroutine runs inside one :meth:`host.port.TargetPort.batch`: over a host link
(:func:`host.port.link_access`) the writes, pushes and bulk memory writes that need no answer
travel with the next read in one link exchange (a UDP datagram), and what is left at the end in
one more. A FREE's cost on each link: tests/host/test_driver_batch.py (``python -m
tests.host.test_driver_batch`` prints the table).

On a board: ``kbtp driver --port /dev/ttyUSB1 init|serve|counters`` (host/cli.py) runs this
driver over the UART (:class:`host.link.UartLink`), ``kbtp driver --link udp --target-ip IP
--host-port N ...`` over the target's Ethernet port (:class:`host.udplink.UdpLink`).

Target memory plan (:attr:`plan`, after ``cfg.layout()["size"]``, each 64-octet aligned)
----------------------------------------------------------------------------------------
``engine_scratch``  512 octets per QP: the engine's SCRATCH (SCRATCH_SLOTS COMPLETION / record
                    buffers of SLOT_SIZE octets, one per completion on the wire);
``host_scratch``    256 octets per QP: the driver's reply buffer (HELLO_ACK <= 152 octets);
``recv``            receive buffers: ``recv_count`` per QP of ``2**recv_log2`` octets, enough for
                    the longest request (24-octet header, Data and Completion Descriptors of 16
                    octets each, Max Inline octets of data; 64 octets at least).
A reply buffer is reused only after the WorkCompletion of the previous reply of its QP.

Receive buffers (issue 20 item 5)
---------------------------------
The HELLO_ACK's Request Credits (``cfg.request_credits``, :func:`host.policy.hello_ack_fields`)
are the receive buffers posted per QP: the draft's target pre-posts one receive buffer per
request credit (§Target Execution Model, §Flow Control), and an initiator that keeps its
credits' worth of requests outstanding (host/initiator.py) must never meet an RNR NAK. So
``recv_count`` *is* ``cfg.request_credits``: the configuration is the one source of both (the
golden model, which has no buffers, advertises the same credits from it), and
:func:`memory_plan` refuses a ``recv_count`` that differs. Two limits bound the credits: the
buffers must fit the target's memory (``mem_size``), and the sum of ``recv_count`` over the QPs
must not exceed the target's RecvNotify FIFO (``notify_depth``: hw/target/target.py
``KbtpTarget``, 16 per QP unless built otherwise, i.e. 64 on the 4-QP ECPIX-5 core and on the
unit-test target): the responder then never waits for the engine. :func:`memory_plan` names the
figures to lower when either is exceeded.

Actions (what :meth:`poll` reports, in order; ``Handled.actions``)
------------------------------------------------------------------
``("send", qp, payload, inv_rkey|None)``, ``("write_imm", qp, stag, to, record, imm, ok)``,
``("rdma_write", qp, stag, to, length, ok)``, ``("rdma_read", qp, stag, to, length, ok)``,
``("invalidate", qp, stag, reason)``, ``("disconnect", qp, reason)``. A ``disconnect`` tells
the caller (CM) to tear the connection down once the reply has gone; the driver itself only
forgets the connection and turns its engine session off. After GOODBYE the caller waits
:data:`GOODBYE_GRACE_MS` for the initiator's own DREQ first (see there).

Limits (v1)
-----------
* Slow-path LOAD / STORE / ALLOC_STORE (fast path off) are executed here with RDMA work
  requests, one at a time. ADDR_LE sessions run in the engine (CTRL bit 2 = ``cfg.addr_le``
  for the structures, QP_SESSION bit 2 for the session's requests). The shared ring's
  counters are touched by the host only while the fast path is off (with it on, frees go
  through the engine's free queue, and no session the driver serves allocates from the shared
  ring).
* DIRECT_ALLOC partitions (:attr:`KbtpDriver.engine_parts`: the fast path on and at most
  :data:`~hw.kbtp.regmap.ENGINE_PARTS` partitions): the engine serves partition p as its ring
  p + 1 (PART<p>_RING / _HEAD / _TAIL, PART_ORDER), and runs a partition session's
  ALLOC_STOREs too (QP_SESSION bits 5..4 = p + 1), taking the Head ticket by a locked FetchAdd,
  atomic against the initiator's own RDMA FetchAdds on that Head; the ring is the quota (no
  QUOTA check, USAGE stays the driver's count). The host keeps HELLO, FREE, BIND, GOODBYE and
  the Ticket Timeouts; every free into a partition ring (FREE, reclamation) goes through the
  engine's free queue with the ring in bits 63..62. Otherwise (more partitions than the engine
  serves) a partition session's ALLOC_STOREs come here (QP_SESSION bit 3), whose Head ticket
  is taken by a host read-modify-write, not atomic against the initiator's own FetchAdd, and
  the host frees into the partition rings itself.
* Frees through the engine's free queue (FREE_PUSH, 32 deep) name their ring in bits 63..62
  (0 shared, p + 1 partition p): a FREE burst's pushes travel with its other writes, and the
  driver waits only while the queue is full. Block Offsets must be below 2**62 for the fast
  path (:attr:`KbtpDriver.fast_off_reasons`).
* Tickets taken on a partition Head are seen when the driver polls (:meth:`poll`,
  :meth:`tick`); the Ticket Timeout runs from that first sight (the model's reading 13). With
  :attr:`~KbtpDriver.engine_parts` the engine's own ALLOC_STORE tickets are seen there too:
  :meth:`tick` (and an abandonment) first reads the slots of the outstanding tickets and
  drops those already consumed (:func:`host.policy.slot_consumed`; counted in
  ``stats[("ENGINE_TICKET", "OK")]``), which no initiator's unbound ticket can be.
* A reply whose WorkCompletion fails is counted in ``stats[("REPLY_WC", status)]`` only.
* The engine's USAGE is lowered by a read-modify-write after a FREE. No ALLOC_STORE of the same
  QP runs in between: the engine takes none of a QP's messages while one of them is here,
  until its receive buffer comes back (KbtpEngine ``host_done``; the repost in
  :meth:`_handle` comes after the USAGE write and the completion). The same order keeps
  "FREE h; ALLOC_STORE h" on one connection in that order (the hold per QP:
  tests/hw/kbtp/test_engine_64.py).
"""

from __future__ import annotations

import functools
import time
from collections import deque
from dataclasses import dataclass, field

from hw.headers import (Features, Opcode, ReqFlags, RingSlot, SLOT_EMPTY, Status, TableEntry,
                        CommonHeader, RING_ADD_DATA, RING_ADD_DATA_UNMASKED, wire_fields)
from host import codec, policy
from host.policy import PartitionState, SessionState, next_generation
from hw.iface import (QP_INDEX_BITS, QPN_BASE, QPN_BITS, REG_KBTP, REG_MR, QpConfig, QpState,
                      RecvNotify, WcStatus, qp_index_of,
                      WorkCompletion, WrOp)
from hw.kbtp.engine import FAST_OPS, SCRATCH_SLOTS, SLOT_SIZE, ranges_for, reg as ENG
from hw.kbtp.engine_regs import RING_SHIFT
from hw.kbtp.regmap import ENGINE_PARTS
from hw.rdma.qp import MR_STRIDE
from hw.target.regbank import Q_NOTIFY, Q_WC

__all__ = ["KbtpDriver", "Handled", "DriverError", "memory_plan", "HOST_SCRATCH",
           "ENGINE_SCRATCH", "NOTIFY_DEPTH_PER_QP"]

#: How long a server holds its own DREQ after GOODBYE (ms). GOODBYE has no reply (draft
#: §Operations), so the initiator learns that it arrived only from the RC ACK. If that ACK is
#: lost, the initiator retransmits the SEND; a target that had already moved the QP to ERROR
#: (as a target-initiated disconnect does) would never ACK it and the initiator's GOODBYE would
#: fail. Within the grace the QP stays in RTS and the responder re-ACKs the duplicate; the
#: initiator normally disconnects itself (DREQ) as soon as the SEND completed. 5 s covers
#: several retransmissions at the ACK timeouts rdma_cm negotiates here (capped at 12: 16.8 ms).
GOODBYE_GRACE_MS = 5000.0


def disconnect_delay_ms(reason):
    """How long a server waits before carrying out a ``("disconnect", qp, reason)`` action:
    :data:`GOODBYE_GRACE_MS` after GOODBYE, none after an error."""
    return GOODBYE_GRACE_MS if reason == "GOODBYE" else 0.0

M32 = (1 << 32) - 1
M64 = (1 << 64) - 1
ENTRY = TableEntry.SIZE
SLOT = RingSlot.SIZE
HOST_SCRATCH = 256
ENGINE_SCRATCH = SCRATCH_SLOTS * SLOT_SIZE
#: RecvNotify FIFO entries per QP of a :class:`hw.target.target.KbtpTarget` built with its
#: default ``notify_depth`` (16 * n_qp): the host must post no more receive buffers in all (the
#: sum of the QPs' ``recv_count``, i.e. ``n_qp * request_credits``) than the FIFO holds.
NOTIFY_DEPTH_PER_QP = 16
#: The most receive buffers one QP can have (QpConfig ``recv_count`` field).
RECV_COUNT_MAX = (1 << QpConfig["recv_count"].width) - 1
_VALID = policy.VALID
_ACCESS = {"r": "read", "w": "write", "a": "atomic"}      # Window.access -> set_mr right
_SLOT_F = {n: (off, bits // 8) for n, off, bits, _ in wire_fields(RingSlot)}


class DriverError(Exception):
    """The target did not behave (a WorkCompletion never came, a command stayed busy)."""


def _batched(method):
    """Run ``method`` inside one :meth:`host.port.TargetPort.batch` (writes coalesced into the
    next read's link exchange)."""
    @functools.wraps(method)
    async def run(self, *args, **kw):
        async with self.port.batch():
            return await method(self, *args, **kw)
    return run


def _align(x, a):
    return (x + a - 1) // a * a


def _log2_ceil(x):
    n = 0
    while (1 << n) < x:
        n += 1
    return n


def _engine_usage(s):
    """The engine counts the session's USAGE (QP_USAGE): it runs the session's ALLOC_STOREs
    (no DIRECT_ALLOC partition, see ``KbtpDriver._engine_session``)."""
    return s.engine and s.partition is None


def memory_plan(cfg, n_qp, *, recv_count=None, mem_size=None, notify_depth=None):
    """Addresses of the driver's areas after the KBTP structures (see the module docstring).

    ``recv_count`` receive buffers per QP: ``cfg.request_credits``, what HELLO_ACK advertises
    (module docstring, "Receive buffers"). It is derived, never chosen: a different value is
    refused (ValueError) rather than followed, since the credits also reach the initiators
    through the golden model and the policy, which know nothing of buffers; lower
    ``request_credits`` in the configuration instead. ``mem_size`` (octets of target memory)
    and ``notify_depth`` (the target's RecvNotify FIFO; default :data:`NOTIFY_DEPTH_PER_QP` per
    QP) are checked: ValueError naming the figures to lower.
    """
    credits = cfg.request_credits
    if recv_count is None:
        recv_count = credits
    elif recv_count != credits:
        raise ValueError(f"recv_count {recv_count} receive buffers per QP, but the target "
                         f"advertises request_credits {credits} in HELLO_ACK: the two must be "
                         f"equal (set request_credits={recv_count} in the configuration)")
    if not 1 <= recv_count <= RECV_COUNT_MAX:
        raise ValueError(f"request_credits {credits}: a QP has 1..{RECV_COUNT_MAX} receive "
                         f"buffers")
    if notify_depth is None:
        notify_depth = NOTIFY_DEPTH_PER_QP * n_qp
    if n_qp * recv_count > notify_depth:
        raise ValueError(f"{n_qp} QPs x request_credits {recv_count} = {n_qp * recv_count} "
                         f"receive buffers exceed the target's RecvNotify FIFO of {notify_depth} "
                         f"(hw/target/target.py notify_depth): lower request_credits to at most "
                         f"{notify_depth // n_qp}")
    lay = cfg.layout()
    es = _align(lay["size"], 64)
    hs = es + ENGINE_SCRATCH * n_qp
    # longest request: header + Data Descriptor + Completion Descriptor + inline data
    recv_log2 = max(6, _log2_ceil(CommonHeader.SIZE + 32 + cfg.max_inline))
    size = 1 << recv_log2
    recv = _align(hs + HOST_SCRATCH * n_qp, size)
    end = recv + n_qp * recv_count * size
    if mem_size is not None and end > mem_size:
        fit = max(0, (mem_size - recv) // (n_qp * size))
        raise ValueError(
            f"memory plan needs {end:#x} octets, the target has {mem_size:#x}: receive "
            f"buffers from {recv:#x}, {n_qp} QPs x request_credits (recv_count) {recv_count} x "
            f"{size} octets (the longest request with max_inline {cfg.max_inline}); "
            + (f"lower request_credits to {fit}, or max_inline, or the pool "
               f"(num_blocks {cfg.num_blocks} x block_size {cfg.block_size})" if fit else
               f"the KBTP structures and scratch areas leave no room for one buffer per QP: "
               f"lower max_inline or the pool (num_blocks {cfg.num_blocks} x block_size "
               f"{cfg.block_size})"))
    return {"engine_scratch": es, "host_scratch": hs, "recv": recv, "recv_count": recv_count,
            "recv_log2": recv_log2, "end": end}


def _ring_add(value, n, masked):
    """New counter value after one ring FetchAdd (draft Add Data / Add Mask, or InfiniBand).

    Masked: the ticket field (bits 63..32) and the Slot Offset field (bits n+3..0) each wrap on
    their own; bits 31..n+4 are untouched (Add Data is zero there and no carry reaches them).
    """
    if not masked:
        return (value + RING_ADD_DATA_UNMASKED) & M64
    ticket = ((value >> 32) + (RING_ADD_DATA >> 32)) & M32
    span = SLOT << n
    slot = ((value & (span - 1)) + (RING_ADD_DATA & M32)) % span
    return ticket << 32 | (value & M32 & ~(span - 1)) | slot


@dataclass
class Handled:
    """What one :meth:`KbtpDriver.poll` did."""
    qp: int
    op: str                 # opcode name ('HELLO', 'FREE', ..., 'SHORT', 'OPCODE_0x..')
    status: str | None      # status name of the reply (None: no reply, e.g. GOODBYE, dropped)
    actions: list = field(default_factory=list)


@dataclass
class _Session(SessionState):
    """A session (:class:`host.policy.SessionState`; ``conn`` is the QP) and whether the engine
    runs its fast path."""
    engine: bool = False            # session registers of ``conn`` programmed in the engine


@dataclass
class _Ring:
    """A free-block ring in target memory, as the host sees it."""
    base: int
    n: int                  # order
    head: int
    tail: int
    pending: dict = field(default_factory=dict)     # slot offset -> deque[(ticket, block)]

    @property
    def N(self):
        return 1 << self.n

    def slot_of(self, t):
        return SLOT * (t % self.N)


@dataclass
class _Conn:
    qp: int
    session: _Session | None = None
    closed: bool = False


class KbtpDriver:
    """KBTP slow path over a :class:`host.port.TargetPort` (see the module docstring)."""

    def __init__(self, port, cfg, *, n_qp=2, mem_size=None, fast_path=True, n_ranges=None,
                 mr_base=0, n_mr=None, recv_count=None, notify_depth=None, wc_polls=100000,
                 max_messages=16, zero_pool=True, wc_room=16):
        self.port = port
        # init() writes the pool's zeros too (draft §Block Free: a block may not carry another
        # trust domain's data); False leaves the pool as it is: a memory known to be zero (a
        # simulation), or a pool too large for the host link to write (DDR3: 256 MiB of zeros).
        self.zero_pool = zero_pool
        self.max_messages = max_messages
        self._backlog = deque()     # (RecvNotify, raw message or None) popped, not handled
        self.cfg = cfg
        self.lay = cfg.layout()
        self.n_qp = n_qp
        self.n_ranges = n_ranges = ranges_for(n_qp, n_ranges)
        # recv_count: cfg.request_credits (memory_plan refuses another figure)
        self.plan = memory_plan(cfg, n_qp, recv_count=recv_count, mem_size=mem_size,
                                notify_depth=notify_depth)
        self.wc_polls = wc_polls
        # WorkCompletions the target holds before its requester waits: HostQueues' Q_WC
        # (hw/target/target.py queue_depth, 16); the requester's own FIFO of 4 is margin.
        self.wc_room = wc_room
        self.host_actions = 0
        self.stats: dict[tuple[str, str], int] = {}
        self.now_ms = 0.0
        self._t0 = time.monotonic()
        self._conns: dict[int, _Conn] = {}
        self._sessions: dict[int, _Session] = {}
        self._next_stag = cfg.direct_stag_base
        self._wr_id = 0
        self._inflight: dict[int, int] = {}         # qp -> wr_id of its last reply
        self._wcs: dict[int, dict] = {}             # wr_id -> WorkCompletion not yet claimed
        lay = self.lay
        self.shared = _Ring(lay["ring"], cfg.ring_order, lay["head"], lay["tail"])
        self.parts = [PartitionState(p, _Ring(d["ring"], cfg.direct_ring_order, d["head"],
                                              d["tail"]), d["first_block"])
                      for p, d in enumerate(lay["direct"])]
        # MR slots: table, pool (DIRECT_LOAD), then 3 per partition (DIRECT_ALLOC).
        self.mr_base = mr_base
        # DIRECT_LOAD is granted only when a single trust domain exists and it is trusted
        # (the Pool STag reaches every block): otherwise its two MRs are never needed
        self._mr_direct_load = policy.direct_load_possible(cfg)
        need = (2 if self._mr_direct_load else 0) + 3 * cfg.direct_partitions
        if n_mr is not None and need > n_mr:
            raise ValueError(f"direct modes need {need} MR slots from {mr_base}, "
                             f"the target has {n_mr}")
        self._mr_masks: dict[int, int] = {}
        hpi = cfg.handles_per_initiator
        # what the engine can run (hw/kbtp/engine.py "Assumptions (v1)")
        aligned = all(lay[k] % 8 == 0 for k in ("table", "ring", "pool", "head", "tail"))
        last = cfg.block_offset(cfg.num_blocks - 1)
        why = [w for w, bad in [
            ("the fast path is off (fast_path=False)", not fast_path),
            (f"handles_per_initiator {hpi} is not a power of two", hpi & (hpi - 1) != 0),
            (f"{cfg.num_ranges} handle ranges, the engine checks {n_ranges}",
             cfg.num_ranges > n_ranges),
            (f"block_size {cfg.block_size} is not a multiple of 8", cfg.block_size % 8 != 0),
            ("a structure is not 8-octet aligned", not aligned),
            (f"the last Block Offset {last:#x} is not below 2**62 (a free names its ring in "
             f"bits 63..62)", last >= 1 << RING_SHIFT)] if bad]
        self.fast_ok = not why
        #: Why every request stays on the host (empty when the engine runs them).
        self.fast_off_reasons = why
        #: The engine serves the DIRECT_ALLOC partitions (partition p = its ring p + 1): their
        #: ALLOC_STOREs and every free into their rings. False: the host allocates from them
        #: (QP_SESSION bit 3) and frees into them itself.
        self.engine_parts = (self.fast_ok and cfg.direct_partitions <= ENGINE_PARTS
                             and all(d["ring"] % 8 == 0 for d in lay["direct"]))

    # ---------------------------------------------------------------- small helpers
    def _now(self, now_ms):
        if now_ms is None:
            now_ms = (time.monotonic() - self._t0) * 1000.0
        self.now_ms = max(self.now_ms, float(now_ms))
        return self.now_ms

    def _count(self, op, status):
        key = (op, Status(status).name)
        self.stats[key] = self.stats.get(key, 0) + 1

    async def _ereg(self, off, value):
        await self.port.wreg(REG_KBTP + off, value)

    async def _erd(self, off):
        return await self.port.rreg(REG_KBTP + off)

    def _qreg(self, qp, name):
        return ENG["QP"] + ENG["QP_STRIDE"] * qp + ENG[name]

    def entry_addr(self, h):
        return policy.entry_addr(self.cfg, self.lay, h)

    def block_addr(self, boff):
        return policy.block_addr(self.cfg, self.lay, boff)

    def _part(self, s):
        """The session's partition, or None."""
        return self.parts[s.partition] if s.partition is not None else None

    # ---------------------------------------------------------------- memory structures
    def _bo_bytes(self, boff):
        return (boff & M64).to_bytes(8, "little" if self.cfg.addr_le else "big")

    def _bo_value(self, raw):
        return int.from_bytes(raw, "little" if self.cfg.addr_le else "big")

    async def read_entry(self, h):
        """Table entry of handle ``h`` as a dict (flags, generation, data_length,
        block_offset)."""
        raw = await self.port.mem_read(self.entry_addr(h), ENTRY)
        return policy.decode_entry(self.cfg, raw)

    async def _write(self, writes):
        """Carry out ordered target-memory writes ``[(address, octets), ...]``."""
        for a, data in writes:
            await self.port.mem_write(a, data)

    def _ring_image(self, n, blocks):
        """Slots of a fresh ring of order ``n`` holding ``blocks`` for tickets 0..F-1, and the
        (head, tail) counter values (draft initialization rule)."""
        N, F = 1 << n, len(blocks)
        img = bytearray()
        for k in range(N):
            if k < F:
                seq, bo = k, blocks[k]
            else:
                seq, bo = (k - N) & M32, SLOT_EMPTY
            slot = bytearray(SLOT)
            so, sn = _SLOT_F["sequence"]
            bo_o, bo_n = _SLOT_F["block_offset"]
            slot[so:so + sn] = seq.to_bytes(sn, "big")
            slot[bo_o:bo_o + bo_n] = self._bo_bytes(bo)
            img += slot
        tail = F << 32 | ((SLOT * (F % N)) if self.cfg.masked else 0)
        return bytes(img), 0, tail

    def initial_image(self):
        """The target memory image ``[0, layout size)`` that :meth:`init` writes (the pool
        zero)."""
        img = bytearray(self.lay["size"])
        for a, b in self.initial_structures():
            img[a:a + len(b)] = b
        return bytes(img)

    def initial_structures(self):
        """``(address, octets)`` of every structure of the image but the pool: the counters,
        rings and table that :meth:`init` writes when it leaves the pool alone."""
        cfg, lay = self.cfg, self.lay
        out = []

        def put(a, b):
            out.append((a, bytes(b)))

        shared, parts = policy.initial_blocks(cfg, lay)
        rings = [(lay, cfg.ring_order, shared)]
        rings += [(d, cfg.direct_ring_order, b) for d, b in zip(lay["direct"], parts)]
        for d, order, blocks in rings:
            ring, head, tail = self._ring_image(order, blocks)
            put(d["ring"], ring)
            put(d["head"], head.to_bytes(8, "little"))
            put(d["tail"], tail.to_bytes(8, "little"))
        put(lay["table"],
            policy.entry_image(cfg, 0, cfg.initial_generation, 0, 0) * cfg.num_handles)
        return sorted(out)

    # ring operations done by the host (partition rings; shared ring only without the engine)
    async def _counter(self, addr):
        return int.from_bytes(await self.port.mem_read(addr, 8), "little")

    def _ticket(self, ring, old):
        """Ticket and slot offset that a ring counter value ``old`` hands out."""
        t = old >> 32
        return t, (old & ((SLOT << ring.n) - 1)) if self.cfg.masked else ring.slot_of(t)

    async def _fetch_add(self, ring, which):
        """Ticket and slot offset before a FetchAdd of the host on a ring counter."""
        a = ring.head if which == "head" else ring.tail
        old = await self._counter(a)
        await self.port.mem_write(a, _ring_add(old, ring.n, self.cfg.masked).to_bytes(8, "little"))
        return self._ticket(ring, old)

    def _slot_value(self, raw):
        """(Sequence, Block Offset) of a slot's octets."""
        so, sn = _SLOT_F["sequence"]
        bo_o, bo_n = _SLOT_F["block_offset"]
        return int.from_bytes(raw[so:so + sn], "big"), self._bo_value(raw[bo_o:bo_o + bo_n])

    async def _read_slot(self, ring, o):
        return self._slot_value(await self.port.mem_read(ring.base + o, SLOT))

    async def _write_slot_free(self, ring, o, u, block):
        """Draft order: Block Offset first, then Sequence."""
        bo_o, _ = _SLOT_F["block_offset"]
        so, sn = _SLOT_F["sequence"]
        await self.port.mem_write(ring.base + o + bo_o, self._bo_bytes(block))
        await self.port.mem_write(ring.base + o + so, (u & M32).to_bytes(sn, "big"))

    async def _slot_ready(self, ring, t, o):
        return policy.slot_holds(t, *await self._read_slot(ring, o))

    async def _consume(self, ring, o):
        """Mark a slot consumed, then write the oldest free deferred on it."""
        bo_o, _ = _SLOT_F["block_offset"]
        await self.port.mem_write(ring.base + o + bo_o, self._bo_bytes(SLOT_EMPTY))
        q = ring.pending.get(o)
        if q:
            u, block = q.popleft()
            if not q:
                del ring.pending[o]
            await self._write_slot_free(ring, o, u, block)

    async def _host_free_many(self, frees):
        """Frees ``[(ring, block), ...]`` into host-managed rings, in order. Each takes a Tail
        ticket u and writes its slot only when the slot is consumed and its Sequence is u - N
        (model/ring.py's safe reading), else it is deferred (FIFO per slot). Every ring's Tail
        counter is read once and written once, and the slots the frees land on are read in one
        go (two reads in all, however many frees)."""
        if not frees:
            return
        rings = list({id(r): r for r, _ in frees}.values())
        rs = self.port.reads()
        at = {id(r): rs.mem(r.tail, 8) for r in rings}
        got = await rs.run()
        tail = {k: int.from_bytes(got[i], "little") for k, i in at.items()}
        plan = []
        for ring, block in frees:
            u, o = self._ticket(ring, tail[id(ring)])
            tail[id(ring)] = _ring_add(tail[id(ring)], ring.n, self.cfg.masked)
            plan.append((ring, u, o, block))
        rs = self.port.reads()
        at = {}
        for ring, _, o, _ in plan:
            if (id(ring), o) not in at:
                at[id(ring), o] = rs.mem(ring.base + o, SLOT)
        got = await rs.run()
        slot = {k: self._slot_value(got[i]) for k, i in at.items()}
        for r in rings:
            await self.port.mem_write(r.tail, tail[id(r)].to_bytes(8, "little"))
        for ring, u, o, block in plan:
            seq, bo = slot[id(ring), o]
            if ring.pending.get(o) or not (bo == SLOT_EMPTY and seq == (u - ring.N) & M32):
                ring.pending.setdefault(o, deque()).append((u, block))
                continue
            await self._write_slot_free(ring, o, u, block)
            slot[id(ring), o] = (u, block)

    async def _engine_free_many(self, frees, space=None):
        """Frees ``[(block, ring), ...]`` through the engine's free queue (FREE_PUSH; ``ring``
        0 the shared ring, p + 1 partition p, pushed in bits 63..62 above the Block Offset):
        the engine runs each as a FREE_BLOCK on that ring (Tail FetchAdd, slot write, deferred
        while the slot is unconsumed), in push order, so the pushes need no answer and travel
        together; the driver waits only while the queue is full. ``space``: the queue's free
        entries as just read (None: read them first). DriverError, before any push, for a
        Block Offset the ring bits would overwrite and for a ring the engine does not serve."""
        values = []
        for block, ring in frees:
            if not 0 <= block < 1 << RING_SHIFT:
                raise DriverError(f"Block Offset {block:#x} is not below 2**{RING_SHIFT}: the "
                                  f"engine's free queue names the ring in bits 63..62")
            if ring and not (self.engine_parts and ring <= len(self.parts)):
                raise DriverError(f"free of Block Offset {block:#x} into ring {ring} "
                                  f"(partition {ring - 1}): the engine does not serve it")
            values.append(block | ring << RING_SHIFT)
        for value in values:
            for _ in range(self.wc_polls):
                if space:
                    break
                space = await self._erd(ENG["FREE_QUEUE"]) >> 16
            else:
                raise DriverError("engine free queue stayed full (a deferred free never wrote "
                                  "its slot)")
            await self.port.wreg64(REG_KBTP + ENG["FREE_PUSH_LO"], value)
            space -= 1

    async def _give_back(self, blocks, space=None):
        """Give each block of ``[(home, block), ...]`` back to its ring (``home``: None the
        shared ring, else the partition's index): the host-managed rings' in one burst
        (:meth:`_host_free_many`), then the engine's free queue (:meth:`_engine_free_many`;
        ``space``: its free entries as just read). The engine takes the shared ring's frees
        when the fast path is on, a partition's when it serves the partitions
        (:attr:`engine_parts`)."""
        host, engine = [], []
        for home, boff in blocks:
            if home is None:
                if self.fast_ok:
                    engine.append((boff, 0))
                else:
                    host.append((self.shared, boff))
            elif self.engine_parts:
                engine.append((boff, home + 1))
            else:
                host.append((self.parts[home].ring, boff))
        await self._host_free_many(host)
        await self._engine_free_many(engine, space)

    async def _return_blocks(self, blocks, space=None):
        """Clear if needed, then give each block of ``[(domain, block), ...]`` back to its ring
        (after the entry updates; :meth:`_give_back`)."""
        cfg = self.cfg
        home = []
        for domain, boff in blocks:
            h = policy.block_home(cfg, boff)
            if policy.clear_on_return(cfg, domain, h):
                await self.port.mem_write(self.block_addr(boff), bytes(cfg.block_size))
            home.append((h, boff))
        await self._give_back(home, space)

    # ---------------------------------------------------------------- init / QPs
    @_batched
    async def init(self):
        """Write every KBTP structure into target memory, then program MRs and the engine."""
        cfg, lay, port = self.cfg, self.lay, self.port
        await self._ereg(ENG["CTRL"], self._ctrl(False))       # fast path off meanwhile
        if self.zero_pool:
            await port.mem_write(0, self.initial_image())
        else:
            for a, b in self.initial_structures():
                await port.mem_write(a, b)
        for p in self.parts:
            p.ring.pending.clear()
        self.shared.pending.clear()
        # direct-mode MRs, reachable by nobody yet
        if self._mr_direct_load:
            for k, w in enumerate(policy.direct_load_windows(cfg, lay)):
                await self._set_window(self.mr_base + k, w, 0)
        for p in self.parts:
            for k in range(3):
                await self._mr_off(self._part_mr(p.index, k))
        # engine layout
        for name, v in [("TABLE_BASE", lay["table"]), ("TABLE_COUNT", cfg.num_handles),
                        ("POOL_BASE", lay["pool"]), ("BLOCK_SIZE", cfg.block_size),
                        ("RING_BASE", lay["ring"]), ("RING_ORDER", cfg.ring_order),
                        ("HEAD_ADDR", lay["head"]), ("TAIL_ADDR", lay["tail"]),
                        ("MAX_INLINE", cfg.max_inline),
                        ("RANGE_LOG2", cfg.handles_per_initiator.bit_length() - 1)]:
            await self._ereg(ENG[name], v)
        await port.wreg64(REG_KBTP + ENG["TABLE_BASE_HANDLE_LO"], cfg.table_base_handle)
        await port.wreg64(REG_KBTP + ENG["POOL_TO_BASE_LO"], cfg.pool_to_base)
        if self.engine_parts:
            # the partitions the engine serves: partition p is its ring p + 1
            for p, d in enumerate(lay["direct"]):
                for name in ("RING", "HEAD", "TAIL"):
                    await self._ereg(ENG[f"PART{p}_{name}"], d[name.lower()])
            await self._ereg(ENG["PART_ORDER"], cfg.direct_ring_order)
        for i in range(self.n_ranges):
            await self._ereg(ENG["RANGE"] + 4 * i, 0)
        for q in range(self.n_qp):
            await self._ereg(self._qreg(q, "QP_SESSION"), 0)
            await self._ereg(self._qreg(q, "QP_SCRATCH"),
                             self.plan["engine_scratch"] + ENGINE_SCRATCH * q)
        await self._ereg(ENG["CTRL"], self._ctrl(self.fast_ok))

    @_batched
    async def open_qp(self, qp, *, program=True, state=QpState.RTS, local_qpn=None, remote_qpn=0,
                      peer_mac=0, peer_ip=0, udp_sport=0xC000, pmtu=3, rq_psn=0, sq_psn=0,
                      timeout=14, retry_cnt=7, rnr_retry=7):
        """Program transport QP ``qp`` (receive buffers from :attr:`plan`) and start a
        connection on it; any earlier connection of ``qp`` must have been closed.

        ``local_qpn`` (default ``QPN_BASE + qp``) must name index ``qp``: the hardware finds a
        packet's QP by ``(qpn - QPN_BASE) mod 2**QP_INDEX_BITS`` (hw/iface.py)."""
        if not 0 <= qp < self.n_qp:
            raise ValueError(f"QP {qp} not in 0..{self.n_qp - 1}")
        if local_qpn is None:
            local_qpn = QPN_BASE + qp
        if not 0 <= local_qpn < 1 << QPN_BITS or qp_index_of(local_qpn) != qp:
            raise ValueError(
                f"local QPN {local_qpn:#x} is not one of QP {qp}'s: the target finds QP "
                f"(qpn - {QPN_BASE:#x}) mod {1 << QP_INDEX_BITS} = "
                f"{qp_index_of(local_qpn) if local_qpn >= 0 else '?'}; use {QPN_BASE + qp:#x} "
                f"+ {1 << QP_INDEX_BITS} * generation")
        c = self._conns.get(qp)
        if c is not None and not c.closed:
            raise ValueError(f"QP {qp} has a live connection")
        if program:
            pl = self.plan
            size = 1 << pl["recv_log2"]
            await self.port.set_qp(
                qp, state=state, local_qpn=local_qpn, remote_qpn=remote_qpn, peer_mac=peer_mac,
                peer_ip=peer_ip, udp_sport=udp_sport, pmtu=pmtu, rq_psn=rq_psn, sq_psn=sq_psn,
                timeout=timeout, retry_cnt=retry_cnt, rnr_retry=rnr_retry,
                recv_base=pl["recv"] + qp * pl["recv_count"] * size,
                recv_count=pl["recv_count"], recv_size_log2=pl["recv_log2"])
        self._conns[qp] = _Conn(qp)
        self._inflight.pop(qp, None)

    # ---------------------------------------------------------------- MRs (direct modes)
    def _part_mr(self, p, k):
        return self.mr_base + (2 if self._mr_direct_load else 0) + 3 * p + k

    async def _set_mr(self, j, rkey, va, length, laddr, mask, *, read=0, write=0, atomic=0):
        self._mr_masks[j] = mask
        await self.port.set_mr(j, read=read, write=write,
                               atomic=atomic, qp_mask=mask, rkey=rkey, va=va, length=length,
                               laddr=laddr)

    async def _set_window(self, j, w, mask):
        """MR slot ``j`` for what a direct STag exposes (a :class:`host.policy.Window`)."""
        await self._set_mr(j, w.stag, w.base_to, w.length, w.addr, mask,
                           **{_ACCESS[w.access]: 1})

    async def _mr_off(self, j):
        self._mr_masks[j] = 0
        await self.port.wreg(REG_MR + MR_STRIDE * j, 0)

    async def _mr_mask(self, j, mask):
        self._mr_masks[j] = mask
        await self.port.set_mr_mask(j, mask)

    # ---------------------------------------------------------------- work requests
    async def _wait_wc(self, wr_id):
        for _ in range(self.wc_polls):
            if wr_id in self._wcs:
                return self._wcs.pop(wr_id)
            await self._pop_wcs(len(self._inflight) + 1)
        raise DriverError(f"no WorkCompletion for host work request {wr_id}")

    async def _post(self, qp, op, **f):
        self._wr_id = self._wr_id % 0x7FFF + 1          # 15 bits; 0 never used
        await self.port.post_wr(qp=qp, wr_id=self._wr_id, op=op, **f)
        return self._wr_id

    async def _scratch(self, qp, payload):
        """Write ``payload`` into ``qp``'s reply buffer once its previous reply has gone."""
        await self._flush(qp)
        a = self.plan["host_scratch"] + HOST_SCRATCH * qp
        # padded to whole words (the buffer is the driver's own): no read-modify-write
        await self.port.mem_write(a, bytes(payload) + bytes(-len(payload) % 4))
        return a

    async def _flush(self, qp):
        """Wait until the last reply of ``qp`` has completed."""
        prev = self._inflight.pop(qp, None)
        if prev is not None:
            wc = await self._wait_wc(prev)
            if wc["status"] != WcStatus.OK.value:
                key = ("REPLY_WC", WcStatus(wc["status"]).name)
                self.stats[key] = self.stats.get(key, 0) + 1

    async def _drain_wcs(self):
        """Keep the replies whose WorkCompletion the target still holds below its queues'
        room: the requester's completion FIFO and HostQueues Q_WC (``wc_room``) hold them, and a
        full Q_WC stops the requester for every QP (it waits to complete the head of the QP an
        ACK is about). One reply per QP may be in flight (``_scratch``), so with more QPs than
        room the driver pops completions here before it posts another reply."""
        unclaimed = [w for w in self._inflight.values() if w not in self._wcs]
        if len(unclaimed) >= self.wc_room:
            await self._pop_wcs(len(unclaimed))

    async def _pop_wcs(self, n):
        """Up to ``n`` WorkCompletions from Q_WC, kept until claimed by their wr_id."""
        for wc in await self.port.poll_wcs(n):
            self._wcs[wc["wr_id"]] = wc

    async def _send(self, qp, payload, inv=None, acts=None):
        a = await self._scratch(qp, payload)
        await self._drain_wcs()
        op = WrOp.SEND if inv is None else WrOp.SEND_INV
        self._inflight[qp] = await self._post(qp, op, length=len(payload), laddr=a,
                                              inv_rkey=inv or 0)
        acts.append(("send", qp, bytes(payload), inv))

    async def _rdma(self, qp, op, stag, to, length, laddr, **extra):
        """Issue one RDMA work request and wait for its completion; True when it succeeded."""
        wr = await self._post(qp, op, rkey=stag, va=to, length=length, laddr=laddr, **extra)
        wc = await self._wait_wc(wr)
        return wc["status"] == WcStatus.OK.value

    # ---------------------------------------------------------------- public: slow path
    @_batched
    async def poll(self, now_ms=None):
        """Handle one slow-path message (see the module docstring); None if there was none."""
        now = self._now(now_ms)
        await self._observe(now)
        await self._pump()
        if not self._backlog:
            n = await self.port.poll_notify()
            if n is None:
                return None
            self._backlog.append((n, None))
        return (await self._handle([self._backlog.popleft()], now))[0]

    @_batched
    async def poll_all(self, now_ms=None, max_messages=None):
        """Handle every pending slow-path message (at most ``max_messages``, default the
        ``max_messages`` option) in one pass; the list of :class:`Handled` (empty: none).

        One exchange pops the notify queue in bulk (with the partition Heads), one reads every
        message, and a run of consecutive FREEs (distinct handles) is handled as one burst
        (:meth:`_free_many`); anything else one message at a time, as :meth:`poll` does. Each
        message's effects, replies and their order are those of :meth:`poll` called once per
        message; every access goes through one :meth:`TargetPort.batch`. A message popped but
        not handled because of an error waits for the next :meth:`poll` / :meth:`poll_all`;
        an error inside a FREE burst answers INTERNAL to every FREE of it not yet answered.
        """
        limit = self.max_messages if max_messages is None else max_messages
        out = []
        now = self._now(now_ms)
        rs = self.port.reads()
        want = limit - len(self._backlog)
        notes = rs.records(Q_NOTIFY, RecvNotify, want) if want > 0 else None
        got = await self._observe(now, rs)
        await self._pump()
        self._backlog.extend((n, None) for n in (got[notes] if notes is not None else ()))
        rs = self.port.reads()
        unread = [(k, rs.mem(n["addr"], n["length"]))
                  for k, (n, raw) in enumerate(self._backlog) if raw is None]
        got = await rs.run()
        for k, i in unread:
            self._backlog[k] = (self._backlog[k][0], got[i])
        while self._backlog and len(out) < limit:
            frees = self._free_run(limit - len(out))
            out += await self._handle([self._backlog.popleft() for _ in range(len(frees) or 1)],
                                      now, frees)
        return out

    def _free_run(self, limit):
        """The decoded FREEs at the front of the backlog that form a burst: 2 or more FREEs of
        live sessions, distinct handles (none: an empty list)."""
        frees = []
        for n, raw in self._backlog:
            c = self._conns.get(n["qp"])
            if (len(frees) == limit or c is None or c.closed or c.session is None
                    or policy.is_hello(raw)):
                break
            msg, _ = policy.screen(self.cfg, raw, c.session)
            if (msg is None or msg.OPCODE is not Opcode.FREE
                    or msg.handle in {f.handle for f in frees}):
                break
            frees.append(msg)
        return frees if len(frees) > 1 else []

    async def _handle(self, batch, now, frees=()):
        """Handle ``[(notify, raw or None), ...]``: one message, or a run of FREEs (``frees``,
        decoded by :meth:`_free_run`); then hand the receive buffers back. The list of
        Handled."""
        items = []
        for n, raw in batch:
            if raw is None:
                raw = await self.port.mem_read(n["addr"], n["length"])
            self.host_actions += 1
            c = self._conns.get(n["qp"])
            live = c if c is not None and not c.closed else None
            items.append((live, raw, Handled(n["qp"], policy.op_name(raw), None)))
        try:
            if len(items) > 1:
                await self._free_many([(c, msg, res)
                                       for (c, _, res), msg in zip(items, frees)])
            elif items[0][0] is not None:
                await self._dispatch(*items[0], now)
        except Exception:
            # The initiator still gets an answer (INTERNAL), as for an initiator-memory fault;
            # the error itself goes to the caller once the buffer is back.
            for c, raw, res in items:
                if c is not None and not c.closed and res.status is None:
                    try:
                        res.status = await self._complete_raw(c, raw, Status.INTERNAL,
                                                              res.actions)
                    except Exception:           # the first error is the one to report
                        pass
            raise
        finally:
            # Always hand the receive buffers back: until then the engine holds this QP's next
            # messages (per-connection order), so one host error would wedge the connection.
            for n, _ in batch:
                await self.port.repost(n["qp"])
        await self._pump()
        return [res for _, _, res in items]

    async def serve(self, max_idle=None, now=None):
        """Poll (:meth:`poll_all`) until the notify queue stays empty for ``max_idle`` polls
        (None: forever), ticking (timeouts, retention) whenever it is empty; ``now`` is an
        optional clock ``() -> ms``. Returns the list of :class:`Handled`."""
        out, idle = [], 0
        while max_idle is None or idle < max_idle:
            r = await self.poll_all(now() if now else None)
            if not r:
                idle += 1
                await self.tick(now() if now else None)
            else:
                idle = 0
                out += r
        return out

    @_batched
    async def disconnect(self, qp, now_ms=None):
        """The connection of ``qp`` failed or closed: its session is retained."""
        now = self._now(now_ms)
        c = self._conns.get(qp)
        if c is not None and not c.closed:
            await self._close(c, now)
        await self._pump()

    async def qp_errors(self):
        """Bitmap of the QPs the transport holds in error (bit i: QP index i): the requester's
        retry or RNR retry count exhausted, or a fatal NAK from the peer (the ``qp_error`` and
        ``qp_error_hi`` words of hw/target/target.py REQ_STATUS). A QP leaves it when
        :meth:`open_qp` programs it again."""
        from hw.target.target import REQ_COUNTER_BASE, REQ_COUNTERS
        base = REQ_COUNTER_BASE + 4 * len(REQ_COUNTERS)
        lo = await self.port.rreg(base)
        hi = await self.port.rreg(base + 4) if self.n_qp > 32 else 0
        return (lo | hi << 32) & ((1 << self.n_qp) - 1)

    @_batched
    async def tick(self, now_ms=None):
        """Ticket-timeout reclamation and retention expiry; returns the actions taken."""
        now = self._now(now_ms)
        acts = []
        await self._observe(now)
        await self._drop_engine_tickets(self.parts)
        for p in self.parts:
            if p.timed_out(now, self.cfg.ticket_timeout_ms):
                await self._abandon_all(p, "ticket timeout", acts)
        for s in list(self._sessions.values()):
            if s.expired(now):
                await self._release_session(s, acts)
                self.stats[("RETENTION_EXPIRY", "OK")] = \
                    self.stats.get(("RETENTION_EXPIRY", "OK"), 0) + 1
        await self._pump()
        return acts

    def state(self):
        """What the driver holds for an operator or a hang report: messages popped from the
        host queue and not yet handled (``backlog``), each QP's last reply still in flight
        (``inflight``: QP -> its WorkRequest's wr_id) and the host actions taken."""
        return {"backlog": len(self._backlog), "inflight": dict(self._inflight),
                "host_actions": self.host_actions}

    def session_of(self, qp):
        """(Initiator ID, handle base, handle count, quota, features) of ``qp``'s session."""
        c = self._conns.get(qp)
        s = c.session if c else None
        return None if s is None else (s.initiator_id, s.handle_base, s.handle_count, s.quota,
                                       s.features)

    # ---------------------------------------------------------------- dispatch
    async def _dispatch(self, c, raw, res, now):
        acts = res.actions
        if policy.is_hello(raw):
            res.status = await self._hello(c, raw, now, acts)
            return
        s = c.session
        msg, status = policy.screen(self.cfg, raw, s)
        if msg is None:
            res.status = await self._complete_raw(c, raw, status, acts)
            return
        handler = {Opcode.FREE: self._free, Opcode.BIND: self._bind,
                   Opcode.GOODBYE: self._goodbye, Opcode.LOAD: self._load,
                   Opcode.STORE: self._store, Opcode.ALLOC_STORE: self._alloc_store}[msg.OPCODE]
        res.status = await handler(c, s, msg, now, acts)

    # ---------------------------------------------------------------- completions
    async def _complete(self, c, op, msg, status, acts, gen=0, dlen=0, boff=0):
        status = Status(status)
        self._count(op.name, status)
        if c.closed:
            return status.name
        s, qp = c.session, c.qp
        cd = policy.record_descriptor(msg, s)
        if cd is not None:
            rec, imm = policy.completion_record(msg, status, gen, dlen, boff)
            a = await self._scratch(qp, rec)
            ok = await self._rdma(qp, WrOp.WRITE_IMM, cd.stag, cd.tagged_offset, len(rec), a,
                                  imm=imm)
            acts.append(("write_imm", qp, cd.stag, cd.tagged_offset, rec, imm, ok))
            if ok:
                return status.name
        payload = policy.completion_payload(msg, s, status, gen, dlen, boff)
        await self._send(qp, payload, policy.invalidate_stag(msg), acts)
        return status.name

    async def _complete_raw(self, c, raw, status, acts):
        """COMPLETION for an undecodable request: echo Request ID / Block Handle if they came."""
        self._count(policy.op_name(raw), status)
        await self._send(c.qp, policy.raw_completion(raw, c.session, status), None, acts)
        return Status(status).name

    # ---------------------------------------------------------------- HELLO / GOODBYE
    async def _hello_ack(self, c, status, acts, reason=None, **fields):
        payload = codec.encode(codec.HelloAck(status=Status(status).value, **fields))
        await self._send(c.qp, payload, None, acts)
        self._count("HELLO", status)
        if reason is not None:
            await self._flush(c.qp)         # the reply is out before the CM tears down
            acts.append(("disconnect", c.qp, reason))
            c.closed = True
        return Status(status).name

    async def _hello(self, c, raw, now, acts):
        cfg = self.cfg
        plan = policy.plan_hello(cfg, raw, conn_has_session=c.session is not None,
                                 sessions=self._sessions,
                                 partition_owners=[p.owner for p in self.parts])
        if plan.status is not Status.OK:
            return await self._hello_ack(c, plan.status, acts, plan.disconnect)
        s = plan.session
        if s is None:
            s = self._sessions[plan.new["initiator_id"]] = _Session(**plan.new)
            if plan.partition is not None:
                await self._assign_partition(s, self.parts[plan.partition])
            if s.range_index < self.n_ranges:
                await self._ereg(ENG["RANGE"] + 4 * s.range_index, 1 << 8 | (s.domain & 0xFF))
        s.attach(c.qp, plan.features, plan.msg.completion_credits)
        c.session = s
        bit = 1 << c.qp
        if s.features & Features.DIRECT_LOAD.value:
            for j in (self.mr_base, self.mr_base + 1):
                await self._mr_mask(j, self._mr_masks.get(j, 0) | bit)
        stags = None
        if s.direct_alloc:
            part = self.parts[s.partition]
            stags = part.stags = policy.new_stags(self._next_stag)
            self._next_stag = stags[-1]
            for k, w in enumerate(policy.partition_windows(cfg, self.lay, part.index, stags)):
                await self._set_window(self._part_mr(part.index, k), w, bit)
        await self._engine_session(c.qp, s)
        return await self._hello_ack(c, Status.OK, acts,
                                     **policy.hello_ack_fields(cfg, self.lay, s, stags))

    def _ctrl(self, fast):
        """The engine's CTRL: fast path, masked counters, ADDR_LE structures."""
        return int(fast) | int(self.cfg.masked) << 1 | int(self.cfg.addr_le) << 2

    async def _engine_session(self, qp, s):
        """Hand the session's LOAD/STORE/ALLOC_STORE to the engine. QP_SESSION bits 5..4 name
        the ring its ALLOC_STOREs take blocks from: 0 the shared ring (QUOTA checked, USAGE
        counted by the engine), p + 1 for a session owning DIRECT_ALLOC partition p when the
        engine serves the partitions (:attr:`engine_parts`: a locked FetchAdd on the Head,
        atomic against the initiator's own; the ring is the quota). A partition session the
        engine cannot serve keeps its ALLOC_STOREs here (bit 3, "host allocates"). A partition
        session's USAGE is the driver's count either way, not the engine's
        (:func:`_engine_usage`)."""
        s.engine = bool(self.fast_ok)
        if not s.engine:
            await self._ereg(self._qreg(qp, "QP_SESSION"), 0)
            return
        usage = await self._bound_count(s)
        await self.port.wreg64(REG_KBTP + self._qreg(qp, "QP_HANDLE_BASE_LO"), s.handle_base)
        await self._ereg(self._qreg(qp, "QP_HANDLE_COUNT"), s.handle_count)
        await self._ereg(self._qreg(qp, "QP_QUOTA"), s.quota)
        await self._ereg(self._qreg(qp, "QP_USAGE"), usage)
        await self._ereg(self._qreg(qp, "QP_SCRATCH"),
                         self.plan["engine_scratch"] + ENGINE_SCRATCH * qp)
        rec = bool(s.features & Features.RECORD_COMPLETION.value)
        host_alloc = s.partition is not None and not self.engine_parts
        ring = s.partition + 1 if s.partition is not None and self.engine_parts else 0
        await self._ereg(self._qreg(qp, "QP_SESSION"),
                         1 | rec << 1 | int(s.addr_le) << 2 | host_alloc << 3 | ring << 4
                         | (s.domain & 0xFF) << 8)

    async def _entries(self, s):
        raw = await self.port.mem_read(self.entry_addr(s.handle_base), ENTRY * s.handle_count)
        return [policy.decode_entry(self.cfg, raw[k:k + ENTRY]) for k in range(0, len(raw), ENTRY)]

    async def _bound_count(self, s):
        return sum(1 for e in await self._entries(s) if e["flags"] & _VALID)

    async def _assign_partition(self, s, part):
        cfg = self.cfg
        if part.assign(s):
            first = cfg.block_offset(part.first_block)
            await self.port.mem_write(self.block_addr(first),
                                      bytes(cfg.block_size * cfg.direct_quota))

    async def _close(self, c, now):
        """The connection is gone: retain its session, drop its STags (MR masks)."""
        c.closed = True
        bit = 1 << c.qp
        for j, mask in list(self._mr_masks.items()):
            if mask & bit:
                await self._mr_mask(j, mask & ~bit)
        s = c.session
        if s is not None and s.conn == c.qp:
            s.retain(now, self.cfg.retention_ms)
            if s.engine:
                await self._ereg(self._qreg(c.qp, "QP_SESSION"), 0)
                s.engine = False

    async def _release_session(self, s, acts):
        """Free every binding, reclaim tickets, give back range, quota and partition."""
        for k, e in enumerate(await self._entries(s)):
            if e["flags"] & _VALID:
                await self._unbind(s, s.handle_base + k, e)
                await self._return_blocks([(s.domain, e["block_offset"])])
        if s.partition is not None:
            part = self.parts[s.partition]
            await self._abandon_all(part, "session released", acts)
            part.release()
        if s.range_index < self.n_ranges:
            await self._ereg(ENG["RANGE"] + 4 * s.range_index, 0)
        del self._sessions[s.initiator_id]

    async def _goodbye(self, c, s, msg, now, acts):
        if policy.goodbye_releases(msg):
            if s.partition is not None:
                await self._abandon_all(self.parts[s.partition], "GOODBYE RELEASE", acts)
            await self._close(c, now)
            await self._release_session(s, acts)
        else:
            await self._close(c, now)
        self._count("GOODBYE", Status.OK)
        await self._flush(c.qp)
        acts.append(("disconnect", c.qp, "GOODBYE"))
        return None

    # ---------------------------------------------------------------- checks
    async def _checked(self, c, s, op, msg, acts):
        """Authorization and the entry checks (host.policy): (entry, None) to go on, or (None,
        the status name of the error completion sent)."""
        status = policy.authorize(self.cfg, op, s, msg.handle, self._sessions.values())
        if status is not None:
            return None, await self._complete(c, op, msg, status, acts)
        e = await self.read_entry(msg.handle)
        status = policy.check_entry(self.cfg, op, msg, e)
        if status is not None:
            return None, await self._complete(c, op, msg, status, acts, e["generation"])
        return e, None

    # ---------------------------------------------------------------- FREE / BIND
    async def _unbind(self, s, h, e):
        """Invalidate entry ``h`` (``e`` its contents); the block goes back after the entry
        update. Returns the new generation."""
        g = next_generation(e["generation"])
        await self._write(policy.unbind_writes(self.cfg, self.lay, h, g))
        return g

    async def _free(self, c, s, msg, now, acts):
        h = Handled(c.qp, "FREE", None, acts)
        await self._free_many([(c, msg, h)])
        return h.status

    async def _free_many(self, frees):
        """FREEs ``[(conn, msg, Handled), ...]`` in one burst, as one after the other would do
        them (the handles differ; each Handled gets its status as its completion goes):

        1. one read of what they all need: the WorkCompletions of the replies in flight, every
           authorized handle's entry, the engine's USAGE of each engine session, its CMD;
        2. the checks (host.policy) and the entry writes of every FREE, in order;
        3. every block back to its ring (:meth:`_return_blocks`);
        4. USAGE lowered and the completions, in order.
        """
        cfg, op = self.cfg, Opcode.FREE
        rs = self.port.reads()
        wcs = rs.records(Q_WC, WorkCompletion, len(self._inflight)) if self._inflight else None
        auth = [policy.authorize(cfg, op, c.session, msg.handle, self._sessions.values())
                for c, msg, _ in frees]
        entry = [rs.mem(self.entry_addr(msg.handle), ENTRY) if a is None else None
                 for (_, msg, _), a in zip(frees, auth)]
        usage = {c.qp: rs.reg(REG_KBTP + self._qreg(c.qp, "QP_USAGE"))
                 for (c, _, _), a in zip(frees, auth) if a is None and _engine_usage(c.session)}
        fq = rs.reg(REG_KBTP + ENG["FREE_QUEUE"]) if self.fast_ok and usage else None
        got = await rs.run()
        for wc in got[wcs] if wcs is not None else ():
            self._wcs[wc["wr_id"]] = wc
        usage = {qp: got[i] for qp, i in usage.items()}
        done, blocks = [], []
        for (c, msg, h), a, i in zip(frees, auth, entry):
            if a is not None:
                done.append((a, 0, 0))
                continue
            e = policy.decode_entry(cfg, got[i])
            status = policy.check_entry(cfg, op, msg, e)
            if status is not None:
                done.append((status, e["generation"], 0))
                continue
            g = await self._unbind(c.session, msg.handle, e)
            blocks.append((c.session.domain, e["block_offset"]))
            done.append((Status.OK, g, e["block_offset"]))
        await self._return_blocks(blocks, None if fq is None else got[fq] >> 16)
        for (c, msg, h), (status, g, boff) in zip(frees, done):
            if status is Status.OK and c.qp in usage:
                usage[c.qp] = max(0, usage[c.qp] - 1)
                await self.port.wreg(REG_KBTP + self._qreg(c.qp, "QP_USAGE"), usage[c.qp])
            h.status = await self._complete(c, op, msg, status, h.actions, g, 0, boff)

    async def _bind(self, c, s, msg, now, acts):
        op, h = Opcode.BIND, msg.handle
        e, sent = await self._checked(c, s, op, msg, acts)
        if e is None:
            return sent
        g = e["generation"]
        part = self._part(s)
        t = msg.ticket
        status = policy.check_ticket(s, part, t)
        if status is None:
            o = part.ring.slot_of(t)
            status = policy.check_slot(t, *await self._read_slot(part.ring, o), msg.block_offset)
        if status is not None:
            return await self._complete(c, op, msg, status, acts, g)
        del part.outstanding[t]
        await self._consume(part.ring, o)
        g = next_generation(e["generation"])
        await self._write(policy.bind_writes(self.cfg, self.lay, h, _VALID, g, msg.data_length,
                                             msg.block_offset))
        return await self._complete(c, op, msg, Status.OK, acts, g, msg.data_length,
                                    msg.block_offset)

    # ---------------------------------------------------------------- tickets (DIRECT_ALLOC)
    async def _observe(self, now, rs=None):
        """Stamp tickets initiators took on partition Heads since the last look (the Heads read
        in one go; with ``rs``, a PortReads, together with what else it reads: returns
        its results)."""
        own = rs is None
        rs = self.port.reads() if own else rs
        heads = [rs.mem(p.ring.head, 8) for p in self.parts]
        got = await rs.run()
        for p, i in zip(self.parts, heads):
            p.observe(int.from_bytes(got[i], "little") >> 32, now)
        return got

    async def _drop_engine_tickets(self, parts):
        """With :attr:`engine_parts`, forget the outstanding tickets of ``parts`` that the
        engine took for its own ALLOC_STOREs: :meth:`_observe` stamps every new Head ticket as
        an initiator's, but a slot that shows its ticket consumed (:func:`host.policy.
        slot_consumed`) was the engine's (an initiator's unbound ticket is consumed only by
        BIND or reclamation, which remove it first). The slots are read in one go."""
        if not self.engine_parts:
            return
        rs = self.port.reads()
        at = [(p, t, rs.mem(p.ring.base + p.ring.slot_of(t), SLOT))
              for p in parts for t in p.outstanding]
        if not at:
            return
        got = await rs.run()
        for p, t, i in at:
            if policy.slot_consumed(t, *self._slot_value(got[i])):
                del p.outstanding[t]
                self.stats[("ENGINE_TICKET", "OK")] = \
                    self.stats.get(("ENGINE_TICKET", "OK"), 0) + 1

    async def _abandon_all(self, part, reason, acts):
        await self._drop_engine_tickets([part])      # the engine's are no initiator's
        s = self._sessions.get(part.owner)
        if s is not None and s.partition_exposed:
            # invalidate the partition region first: no RDMA Write may land after reclamation
            for k, stag in enumerate(part.stags):
                await self._mr_off(self._part_mr(part.index, k))
                acts.append(("invalidate", s.conn, stag, reason))
            s.direct_alloc = False
        part.abandon()
        await self._retry_reclaims(part)

    async def _retry_reclaims(self, part):
        moved = False
        for t in list(part.to_reclaim):
            o = part.ring.slot_of(t)
            seq, bo = await self._read_slot(part.ring, o)
            if policy.slot_holds(t, seq, bo):
                await self._consume(part.ring, o)
                await self._give_back([(part.index, bo)])
                part.to_reclaim.remove(t)
                self.stats[("RECLAIM", "OK")] = self.stats.get(("RECLAIM", "OK"), 0) + 1
                moved = True
            elif self.engine_parts and policy.slot_consumed(t, seq, bo):
                # an engine ALLOC_STORE's ticket, abandoned while its slot was still to fill:
                # the engine consumed it since (:meth:`_drop_engine_tickets`)
                part.to_reclaim.remove(t)
                part.abandoned.discard(t)
                self.stats[("ENGINE_TICKET", "OK")] = \
                    self.stats.get(("ENGINE_TICKET", "OK"), 0) + 1
                moved = True
        return moved

    async def _pump(self):
        progress = True
        while progress:
            progress = False
            for p in self.parts:
                if p.to_reclaim:
                    progress |= await self._retry_reclaims(p)

    # ---------------------------------------------------------------- slow-path data ops
    async def _load(self, c, s, msg, now, acts):
        op = Opcode.LOAD
        e, sent = await self._checked(c, s, op, msg, acts)
        if e is None:
            return sent
        g = e["generation"]
        n, boff = e["data_length"], e["block_offset"]
        if n:
            d = msg.data
            ok = await self._rdma(c.qp, WrOp.WRITE, d.stag, d.tagged_offset, n,
                                  self.block_addr(boff))
            acts.append(("rdma_write", c.qp, d.stag, d.tagged_offset, n, ok))
            # (a failed WRITE still gets the OK COMPLETION, as from the engine, which does not
            # wait for the WRITE: on RC the fault put the QP in error and the Send is flushed;
            # model/target.py Readings 10)
        return await self._complete(c, op, msg, Status.OK, acts, g, n, boff)

    async def _obtain(self, c, msg, boff, acts):
        """Put the store's data at the start of block ``boff``; its length, or None when the
        RDMA READ of the initiator's buffer failed."""
        if msg.flags & ReqFlags.INLINE.value:
            if msg.inline:
                await self.port.mem_write(self.block_addr(boff), msg.inline)
            return len(msg.inline)
        d = msg.data
        if not d.length:
            return 0
        ok = await self._rdma(c.qp, WrOp.READ, d.stag, d.tagged_offset, d.length,
                              self.block_addr(boff))
        acts.append(("rdma_read", c.qp, d.stag, d.tagged_offset, d.length, ok))
        return d.length if ok else None

    async def _store(self, c, s, msg, now, acts):
        op, h = Opcode.STORE, msg.handle
        e, sent = await self._checked(c, s, op, msg, acts)
        if e is None:
            return sent
        g = e["generation"]
        n = await self._obtain(c, msg, e["block_offset"], acts)
        if n is None:
            return await self._complete(c, op, msg, Status.INTERNAL, acts, g)
        await self._write(policy.store_writes(self.cfg, self.lay, h, e, n,
                                              msg.flags & ReqFlags.SEAL.value))
        return await self._complete(c, op, msg, Status.OK, acts, g, n, e["block_offset"])

    async def _usage(self, s):
        return policy.quota_use(await self._bound_count(s), self._part(s))

    async def _alloc_store(self, c, s, msg, now, acts):
        op, h = Opcode.ALLOC_STORE, msg.handle
        e, sent = await self._checked(c, s, op, msg, acts)
        if e is None:
            return sent
        g = e["generation"]
        part = self._part(s)
        ring = part.ring if part is not None else self.shared
        status = policy.check_quota(await self._usage(s), s.quota)
        if status is None:
            head = await self._counter(ring.head) >> 32
            tail = await self._counter(ring.tail) >> 32
            status = policy.check_ring((tail - head) & M32)
        if status is not None:
            return await self._complete(c, op, msg, status, acts, g)
        if part is not None:
            await self._observe(now)
        t, o = await self._fetch_add(ring, "head")
        if part is not None:
            part.took(t)
        for _ in range(self.wc_polls):
            if await self._slot_ready(ring, t, o):
                break
        else:
            raise DriverError(f"ALLOC_STORE: slot {o:#x} never filled for ticket {t}")
        _, boff = await self._read_slot(ring, o)
        await self._consume(ring, o)
        n = await self._obtain(c, msg, boff, acts)
        if n is None:
            await self._give_back([(None if part is None else part.index, boff)])
            return await self._complete(c, op, msg, Status.INTERNAL, acts, g)
        g = next_generation(e["generation"])
        await self._write(policy.bind_writes(self.cfg, self.lay, h, policy.alloc_flags(msg), g,
                                             n, boff))
        return await self._complete(c, op, msg, Status.OK, acts, g, n, boff)

    # ---------------------------------------------------------------- counters
    @_batched
    async def counters(self, *, transport=True):
        """Engine and driver figures as a dict (see the module docstring); with ``transport``
        the RoCE transport's counters too (``transport=False`` for a bench of the engine
        alone, which has no transport registers)."""
        out = {"host_actions": self.host_actions, "slow_path": dict(self.stats)}
        eng = {}
        for k, op in enumerate(FAST_OPS):
            for st in Status:
                v = await self._erd(ENG["COUNT"] + 4 * (16 * k + st.value))
                if v:
                    eng[(op.name, st.name)] = v
        out["engine"] = eng
        for name in ("HOSTQ_COUNT", "STALL_CYCLES", "LAST_LATENCY", "LAST_CYCLES",
                     "RING_OCCUPANCY"):
            out[name.lower()] = await self._erd(ENG[name])
        occ = {"shared": ((await self._counter(self.shared.tail) >> 32)
                          - (await self._counter(self.shared.head) >> 32)) & M32}
        for p in self.parts:
            occ[f"partition{p.index}"] = ((await self._counter(p.ring.tail) >> 32)
                                         - (await self._counter(p.ring.head) >> 32)) & M32
        out["free_blocks"] = occ
        quota = {}
        for iid, s in self._sessions.items():
            if _engine_usage(s):
                used = await self._erd(self._qreg(s.conn, "QP_USAGE"))
            else:
                used = await self._usage(s)
            quota[iid] = {"qp": s.conn, "usage": used, "quota": s.quota,
                          "state": "active" if s.active else "retained"}
        out["quota"] = quota
        if not transport:
            return out
        from hw.iface import REG_TRANSPORT
        from hw.target.target import REQ_COUNTER_BASE, REQ_COUNTERS, REQ_STATUS, RESP_COUNTERS
        tr = {}
        for k, name in enumerate(RESP_COUNTERS):
            tr[f"resp.{name}"] = await self.port.rreg(REG_TRANSPORT + 4 * k)
        for k, name in enumerate(REQ_COUNTERS + REQ_STATUS):
            tr[f"req.{name}"] = await self.port.rreg(REQ_COUNTER_BASE + 4 * k)
        out["transport"] = tr
        return out

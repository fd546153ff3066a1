# Ref: draft KBTP §Target Memory Structures, §Allocation Quotas, §Session Establishment,
#      §Operations, §Completion, §Direct Modes, §Status Codes, §Operational Considerations,
#      §Security Considerations, §Examples; docs/layouts.md; host/policy.py (the decisions
#      shared with the host driver)
"""The golden model of a KBTP target.

One target memory image :attr:`TargetModel.mem` holds the Head/Tail counters, the block table,
the shared free-block ring, one ring per DIRECT_ALLOC partition, and the block pool, at the
addresses of :meth:`TargetConfig.layout`. Requests go in as Send payloads
(:meth:`TargetModel.receive`); the target's reaction comes back as an ordered list of actions:
RDMA operations towards the initiator (already carried out on the initiator's
:class:`InitiatorMemory`), Sends, and every write to target memory (:class:`MemWrite`, in the
order the draft requires, so testbenches can compare the hardware's write stream one by one).

The model is transport-neutral: the Python RC endpoint and the gateware testbenches call
:meth:`TargetModel.connect`, :meth:`~TargetModel.receive`, :meth:`~TargetModel.disconnect` and
:meth:`~TargetModel.tick`, and replay or compare the actions. One-sided operations of a trusted
initiator on the exposed STags (direct modes) go through :meth:`TargetModel.remote_read`,
:meth:`~TargetModel.remote_write` and :meth:`~TargetModel.remote_fetch_add`, which check the
STag's access rights as the target's RDMA interface would.

Requests of one connection are processed in order. A target-executed allocation that must wait
(its slot still awaits a deferred free, or a test holds it with :meth:`TargetModel.hold`) blocks
its connection: later requests on it queue, other connections go on, and the allocation finishes
as soon as it can, inside whichever call made that possible.

The decisions the model shares with the host driver (host/driver.py) are made in
:mod:`host.policy`: validation order, quotas, generations, HELLO admission and HELLO_ACK
contents, trust domains, completions. Its docstring lists what differs between the two.

Readings of the draft
---------------------
Where the draft is silent or ambiguous the model does what follows (also in the report).

1. Memory: all structures sit in one image. Table entries start as Flags 0, Generation
   ``initial_generation`` (default 1; never 0), Data Length 0, Block Offset 0. The Head/Tail
   counters are little-endian (model.ring's reading of "the target's memory byte order").
   Block Offsets are Tagged Offsets in the Pool STag: ``pool_to_base + i * block_size`` for
   block ``i``; its address in the image is ``pool_base + i * block_size``. The Table, Ring
   and Head STags address their structure from Tagged Offset 0; a Partition STag uses the
   Pool's Tagged Offsets (a window over the partition), so Block Offsets read from a ring
   are used unchanged in the initiator's RDMA Writes. Partition, Ring and Head STags are new
   for every connection; the Table and Pool STags are fixed.
2. The pool is split once, at configuration: the first ``F - P*Q`` blocks feed the shared ring
   (target-executed allocations); ``P = direct_partitions`` partitions of ``Q = direct_quota``
   blocks each have their own ring, Head and Tail. A session granted DIRECT_ALLOC gets one
   partition and Allocation Quota = Q; all its allocations (BIND and its own ALLOC_STOREs,
   which the target executes on the partition ring) come from that ring. Other sessions get
   ``quotas.get(id, quota_per_initiator)`` capped so that the sum over active and retained
   sessions never exceeds the shared blocks (sum of quotas <= F); a session may get quota 0
   (load-only). ``overcommit_quotas=True`` drops the cap (non-conformant; it is the only way
   to make "ring empty" reachable, for tests).
3. A block returns to the ring its offset belongs to (shared range or a partition).
4. ADDR_LE is target-wide for memory structures (``cfg.addr_le``: Block Offset of entries and
   slots). A session gets ADDR_LE iff it requests it and the target offers it; it gets direct
   modes only when its ADDR_LE equals ``cfg.addr_le`` (otherwise it would misread the
   structures), and only if its trust domain is in ``direct_domains``. DIRECT_LOAD also needs
   every configured domain to be the initiator's own (the Pool and Table STags reach every
   block and entry); DIRECT_ALLOC exposes only the initiator's partition, ring and Head.
   RECORD_COMPLETION is never offered with ``binding="rdmap"``.
5. HELLO rejections: an Initiator ID whose session is active -> HELLO_ACK Status ALREADY_BOUND
   ("that ID is bound to a live session"); no free handle range -> NO_SPACE; undecodable HELLO
   -> MALFORMED. Each is followed by :class:`Disconnect`. A second HELLO on a connection that
   has a session -> HELLO_ACK MALFORMED, session kept. Requests before HELLO -> COMPLETION
   MALFORMED. Request and completion credits are recorded, not enforced (the RDMA receive
   queue enforces them).
6. Validation order (§Operations first, then the operation's steps): decode (MALFORMED, inline
   longer than Max Inline TOO_LARGE), handle authorization (INVALID_HANDLE), length against
   Block Size (TOO_LARGE; stores and BIND only: a LOAD destination may be larger than a block),
   request Generation (STALE_GENERATION), then per operation: LOAD NOT_VALID, NOT_SEALED, Data
   Length > descriptor Length TOO_LARGE; STORE NOT_VALID, SEALED; ALLOC_STORE ALREADY_BOUND,
   quota NO_SPACE, ring empty NO_SPACE; FREE NOT_VALID; BIND ALREADY_BOUND, then the ticket.
7. LOAD authorization: any handle of the table whose range is free or owned (active or
   retained) by an initiator of the same trust domain.
8. Completions: Generation = the entry's current one whenever the handle was authorized (also
   on errors, so STALE_GENERATION tells the right one), else 0. FREE completes with the new
   Generation, Data Length 0 and the freed Block Offset. Errors carry Data Length and Block
   Offset 0. Decode errors echo the Request ID and Block Handle read from the header octets
   that arrived, always as a COMPLETION Send.
9. RECORD: with RECORD_COMPLETION granted, the record goes by RDMA Write with Immediate, the
   immediate being the low 32 bits of the Request ID; RECORD+INVALIDATE then completes
   MALFORMED (a Write with Immediate cannot invalidate). Without RECORD_COMPLETION, RECORD is
   ignored and a COMPLETION Send is used. INVALIDATE is honoured on error completions too.
   INVALIDATE with INLINE is rejected by the codec (no STag to invalidate).
10. Initiator memory faults (bad STag, rights, range, invalidated): the RDMA operation is
    recorded with ``error`` and the request completes with INTERNAL and no lasting effect (an
    ALLOC_STORE returns its block to the ring). A real RC NIC would put the QP in error; the RC
    endpoint may map INTERNAL-by-fault to a disconnect. A failed record write falls back to a
    COMPLETION Send with the operation's status. Zero-length transfers issue no RDMA operation.
    Except LOAD (issue 20): its COMPLETION (OK) is sent right behind its data WRITE, without
    waiting for the WRITE's WorkCompletion. On one RC QP a WRITE that faults at the initiator
    is NAKed, the target's QP goes to error and the COMPLETION behind it is flushed: the
    initiator sees neither data nor completion, as it would see no INTERNAL completion either.
11. STORE writes data at the start of the block and updates Data Length (then SEALED if SEAL);
    the Generation is unchanged (it changes only on bind/unbind). BIND binds VALID, unsealed
    (BIND has no flags).
12. BIND of a ticket: reclaimed -> TICKET_ABANDONED; session without DIRECT_ALLOC (never granted
    or disabled) -> MALFORMED; ticket not taken yet or already bound -> MALFORMED; slot not
    holding a block for the ticket (the initiator took more tickets than its ring holds) ->
    NO_SPACE; slot holding another Block Offset -> MALFORMED.
13. Ticket Timeout: the model notices tickets by polling the partition Heads (every
    receive/tick/remote_fetch_add) and stamps each with the time it first saw it. When one is
    older than ``ticket_timeout_ms``, the target invalidates the Partition, Ring and Head STags
    (:class:`InvalidateStag`, DIRECT_ALLOC disabled for the session) and reclaims *all*
    outstanding tickets of that ring: none can be completed safely once the Partition STag is
    gone. For a disconnected (retained) session no invalidation is needed (the STags died with
    the connection). A ticket without a block yet is reclaimed as soon as its slot fills.
14. GOODBYE gets no completion; the target ends the session and emits :class:`Disconnect`.
    RELEASE frees all bound handles (and reclaims outstanding tickets) at once; otherwise, and on
    :meth:`TargetModel.disconnect`, the session is retained for ``retention_ms`` with its range,
    quota, partition and bindings; a HELLO with the same Initiator ID restores them; expiry (in
    :meth:`TargetModel.tick`) frees them.
15. Trust domains: ``trust_domains`` maps Initiator IDs to domains (others:
    ``default_trust_domain``). A block freed to the shared ring is cleared (zero-filled
    MemWrite before it goes back) iff some other domain exists in the configuration; a
    partition's blocks go back to the same initiator and are cleared only when the partition is
    handed to an initiator of another domain than its last owner.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from hw.headers import Features, Opcode, ReqFlags, Status
from host import codec, policy
from host.config import ENTRY_SIZE, TargetConfig
from host.policy import PartitionState as Partition, SessionState, next_generation
from model.ring import SLOT_SIZE, RingImage, masked_fetch_add, fetch_add

__all__ = [
    "TargetConfig", "TargetModel", "InitiatorMemory", "AccessError",
    "RdmaRead", "RdmaWrite", "SendMsg", "WriteImm", "MemWrite", "InvalidateStag", "Disconnect",
    "ENTRY_SIZE", "next_generation",
]

_VALID = policy.VALID


# --------------------------------------------------------------------------------------------
# Actions
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RdmaRead:
    """The target RDMA-read ``length`` octets of the initiator's buffer (``data`` = what came)."""
    conn: object
    stag: int
    to: int
    length: int
    data: bytes = b""
    error: str | None = None


@dataclass(frozen=True)
class RdmaWrite:
    """The target RDMA-wrote ``data`` into the initiator's buffer."""
    conn: object
    stag: int
    to: int
    data: bytes
    error: str | None = None


@dataclass(frozen=True)
class SendMsg:
    """A Send (or Send with Invalidate when ``invalidate_stag`` is not None)."""
    conn: object
    payload: bytes
    invalidate_stag: int | None = None


@dataclass(frozen=True)
class WriteImm:
    """RDMA Write with Immediate of a completion record."""
    conn: object
    stag: int
    to: int
    data: bytes
    imm: int
    error: str | None = None


@dataclass(frozen=True)
class MemWrite:
    """One write to target memory, in order. ``what`` names the field (not compared)."""
    addr: int
    data: bytes
    what: str = field(default="", compare=False)


@dataclass(frozen=True)
class InvalidateStag:
    """The target locally invalidated one of its own STags exposed to ``conn``."""
    conn: object
    stag: int
    reason: str


@dataclass(frozen=True)
class Disconnect:
    """The target closes the connection."""
    conn: object
    reason: str


# --------------------------------------------------------------------------------------------
# Initiator memory
# --------------------------------------------------------------------------------------------

class AccessError(Exception):
    """An RDMA access that the NIC refuses (bad STag, rights, range, invalidated)."""


@dataclass
class Buffer:
    """A registered initiator buffer: Tagged Offsets ``base_to .. base_to + len(data)``."""
    stag: int
    base_to: int
    data: bytearray
    access: str = "rw"          # remote rights: 'r' (target may read), 'w' (may write)
    valid: bool = True


class InitiatorMemory:
    """The initiator's buffers, keyed by STag, as its NIC would check remote accesses."""

    def __init__(self):
        self.buffers: dict[int, Buffer] = {}

    def register(self, stag, data, *, base_to=0, access="rw") -> Buffer:
        """Register a buffer; ``data`` is bytes-like contents or an int length (zeros)."""
        buf = bytearray(data) if not isinstance(data, int) else bytearray(data)
        b = Buffer(stag, base_to, buf, access)
        self.buffers[stag] = b
        return b

    def invalidate(self, stag) -> None:
        if stag in self.buffers:
            self.buffers[stag].valid = False

    def _check(self, stag, to, length, right):
        b = self.buffers.get(stag)
        if b is None:
            raise AccessError(f"STag {stag:#x} unknown")
        if not b.valid:
            raise AccessError(f"STag {stag:#x} invalidated")
        if right not in b.access:
            raise AccessError(f"STag {stag:#x} lacks remote {right} access")
        if to < b.base_to or to + length > b.base_to + len(b.data):
            raise AccessError(f"range {to:#x}+{length} outside STag {stag:#x}")
        return b, to - b.base_to

    def read(self, stag, to, length) -> bytes:
        b, off = self._check(stag, to, length, "r")
        return bytes(b.data[off:off + length])

    def write(self, stag, to, data) -> None:
        b, off = self._check(stag, to, len(data), "w")
        b.data[off:off + len(data)] = data

    def contents(self, stag) -> bytes:
        return bytes(self.buffers[stag].data)


# --------------------------------------------------------------------------------------------
# Target memory that records its writes
# --------------------------------------------------------------------------------------------

class TargetMemory(bytearray):
    """The target memory image; while ``log`` is a list, every slice write appends a MemWrite.

    model.ring writes through slice assignment, so its slot and counter writes are captured in
    the order it performs them (Block Offset before Sequence, FetchAdd results).
    """

    log = None
    labeler = None

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        if self.log is None:
            return
        if isinstance(key, slice):
            start = key.start or 0
            data = bytes(value)
        else:
            start, data = key, bytes([value])
        what = self.labeler(start, len(data)) if self.labeler else ""
        self.log.append(MemWrite(start, data, what))


# --------------------------------------------------------------------------------------------
# Sessions and per-partition state
# --------------------------------------------------------------------------------------------

@dataclass
class Session(SessionState):
    """A session (:class:`host.policy.SessionState`; ``conn`` is the connection id) and the
    model's own count of target-executed tickets taken, not yet bound."""
    pending_allocs: int = 0


# A DIRECT_ALLOC partition: host.policy.PartitionState, ``ring`` a model.ring.RingImage.


@dataclass
class Region:
    """A target STag exposed for direct modes."""
    stag: int
    addr: int
    base_to: int
    length: int
    access: str                          # 'r' read, 'w' write, 'a' atomic
    conns: set = field(default_factory=set)
    valid: bool = True


@dataclass
class Conn:
    conn_id: object
    imem: InitiatorMemory
    session: Session | None = None
    closed: bool = False
    hold: bool = False
    blocked: object = None              # generator of the request in progress
    queue: deque = field(default_factory=deque)


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------

class TargetModel:
    """The golden model of a KBTP target (see the module docstring).

    Attributes
    ----------
    cfg : TargetConfig
    mem : bytearray
        The target memory image (a :class:`TargetMemory`).
    counters : dict[(str, str), int]
        Requests per (operation name, status name), plus ('RECLAIM', 'OK') per reclaimed ticket
        and ('RETENTION_EXPIRY', 'OK') per expired session.
    shared_ring : model.ring.RingImage
    partitions : list[Partition]
    """

    def __init__(self, cfg: TargetConfig):
        self.cfg = cfg
        self.lay = cfg.layout()
        self.mem = TargetMemory(self.lay["size"])
        self.mem.labeler = self._label
        self.counters: dict[tuple[str, str], int] = {}
        self.now_ms = 0.0
        self.dropped = 0
        self._conns: dict[object, Conn] = {}
        self._sessions: dict[int, Session] = {}           # Initiator ID -> session
        self._actions: list | None = None
        self._next_stag = cfg.direct_stag_base
        self.regions: dict[int, Region] = {}
        lay = self.lay
        shared, parts = policy.initial_blocks(cfg, lay)
        self.shared_ring = RingImage(self.mem, lay["ring"], cfg.ring_order, lay["head"],
                                     lay["tail"], addr_le=cfg.addr_le, masked=cfg.masked)
        self.shared_ring.initialize(shared)
        self.partitions: list[Partition] = []
        for p, (d, blocks) in enumerate(zip(lay["direct"], parts)):
            ring = RingImage(self.mem, d["ring"], cfg.direct_ring_order, d["head"], d["tail"],
                             addr_le=cfg.addr_le, masked=cfg.masked)
            ring.initialize(blocks)
            self.partitions.append(Partition(p, ring, d["first_block"]))
        for h in range(cfg.num_handles):
            a = lay["table"] + ENTRY_SIZE * h
            self.mem[a:a + ENTRY_SIZE] = policy.entry_image(cfg, 0, cfg.initial_generation, 0, 0)
        for w in policy.direct_load_windows(cfg, lay):
            self.regions[w.stag] = Region(*w)

    # ---------------------------------------------------------------- public API: connections

    def connect(self, conn_id) -> None:
        """An RDMA connection came up (no session yet)."""
        if conn_id in self._conns and not self._conns[conn_id].closed:
            raise ValueError(f"connection {conn_id!r} already up")
        self._conns[conn_id] = Conn(conn_id, InitiatorMemory())

    def initiator_memory(self, conn_id) -> InitiatorMemory:
        """The peer's buffers on this connection (register them in tests)."""
        return self._conns[conn_id].imem

    def disconnect(self, conn_id, now_ms: float | None = None) -> list:
        """The connection failed or closed: its session is retained (retention starts)."""
        now = self._time(now_ms)
        self._begin()
        c = self._conns.get(conn_id)
        if c is not None and not c.closed:
            self._close(c, now, "disconnect")
        self._pump(now)
        return self._end()

    def receive(self, conn_id, payload: bytes, now_ms: float | None = None) -> list:
        """Process one Send payload; return the target's actions in order."""
        now = self._time(now_ms)
        c = self._conns.get(conn_id)
        if c is None or c.closed:
            self.dropped += 1
            return []
        self._begin()
        self._observe(now)
        if c.blocked is not None or c.queue:
            c.queue.append(bytes(payload))
        else:
            self._run(c, self._dispatch(c, bytes(payload), now))
        self._pump(now)
        return self._end()

    def tick(self, now_ms: float) -> list:
        """Advance time: ticket-timeout reclamation and retention expiry."""
        now = self._time(now_ms)
        self._begin()
        self._observe(now)
        for part in self.partitions:
            if part.timed_out(now, self.cfg.ticket_timeout_ms):
                self._abandon_all(part, "ticket timeout")
        for s in list(self._sessions.values()):
            if s.expired(now):
                self._release_session(s)
                self._count("RETENTION_EXPIRY", "OK")
        self._pump(now)
        return self._end()

    def hold(self, conn_id) -> None:
        """Delay the next target-executed allocation of ``conn_id`` after it took its ticket
        (the draft's stalled work request chain) until :meth:`release`."""
        self._conns[conn_id].hold = True

    def release(self, conn_id, now_ms: float | None = None) -> list:
        """Let a held allocation go on; returns the actions that follow."""
        now = self._time(now_ms)
        self._begin()
        self._conns[conn_id].hold = False
        self._pump(now)
        return self._end()

    # ---------------------------------------------------------------- public API: inspection

    def session_of(self, conn_id) -> Session | None:
        c = self._conns.get(conn_id)
        return c.session if c else None

    def session_by_id(self, initiator_id) -> Session | None:
        return self._sessions.get(initiator_id)

    def entry_addr(self, handle: int) -> int:
        return policy.entry_addr(self.cfg, self.lay, handle)

    def block_addr(self, block_offset: int) -> int:
        return policy.block_addr(self.cfg, self.lay, block_offset)

    def read_entry(self, handle: int) -> dict:
        a = self.entry_addr(handle)
        return policy.decode_entry(self.cfg, bytes(self.mem[a:a + ENTRY_SIZE]))

    def usage(self, initiator_id) -> int:
        """Quota use: bound handles + tickets taken and not yet bound (or reclaimed)."""
        s = self._sessions[initiator_id]
        return policy.quota_use(self._bound_count(s), self._part(s), s.pending_allocs)

    def quota_use(self) -> dict:
        """Initiator ID -> (usage, quota, 'active'|'retained')."""
        return {iid: (self.usage(iid), s.quota, "active" if s.conn is not None else "retained")
                for iid, s in self._sessions.items()}

    def occupancy(self) -> dict:
        """Free blocks (tickets available) per ring: 'shared' and 'partition<i>'."""
        out = {"shared": self.shared_ring.occupancy()}
        for p in self.partitions:
            out[f"partition{p.index}"] = p.ring.occupancy()
        return out

    # ---------------------------------------------------------------- one-sided initiator ops

    def _region(self, conn_id, stag, to, length, right):
        r = self.regions.get(stag)
        if r is None or not r.valid:
            raise AccessError(f"target STag {stag:#x} unknown or invalidated")
        if r.access != right or conn_id not in r.conns:
            raise AccessError(f"target STag {stag:#x}: no {right} access for {conn_id!r}")
        if to < r.base_to or to + length > r.base_to + r.length:
            raise AccessError(f"range {to:#x}+{length} outside target STag {stag:#x}")
        return r.addr + (to - r.base_to)

    def remote_read(self, conn_id, stag, to, length) -> bytes:
        """RDMA Read by the initiator of a target STag (DIRECT_LOAD table/pool, ring slots)."""
        a = self._region(conn_id, stag, to, length, "r")
        return bytes(self.mem[a:a + length])

    def remote_write(self, conn_id, stag, to, data) -> None:
        """RDMA Write by the initiator through its Partition STag (DIRECT_ALLOC data)."""
        a = self._region(conn_id, stag, to, len(data), "w")
        self.mem[a:a + len(data)] = bytes(data)

    def remote_fetch_add(self, conn_id, stag, to, add, mask=0, now_ms=None) -> int:
        """(Masked) FetchAdd by the initiator on its Head; returns the original value."""
        now = self._time(now_ms)
        a = self._region(conn_id, stag, to, 8, "a")
        if a % 8:
            raise AccessError("FetchAdd address not 8-octet aligned")
        old = int.from_bytes(self.mem[a:a + 8], "little")
        new = masked_fetch_add(old, add, mask) if mask else fetch_add(old, add)
        self.mem[a:a + 8] = new.to_bytes(8, "little")
        self._observe(now)
        return old

    # ---------------------------------------------------------------- machinery

    def _time(self, now_ms):
        if now_ms is not None:
            self.now_ms = max(self.now_ms, float(now_ms))
        return self.now_ms

    def _begin(self):
        self._actions = []
        self.mem.log = self._actions

    def _end(self):
        out, self._actions = self._actions, None
        self.mem.log = None
        return out

    def _emit(self, action):
        self._actions.append(action)

    def _count(self, op, status):
        key = (op, Status(status).name if not isinstance(status, str) else status)
        self.counters[key] = self.counters.get(key, 0) + 1

    def _run(self, c, gen):
        """Run a request generator until it finishes (True) or must wait (False)."""
        if gen is None:
            return True
        try:
            next(gen)
        except StopIteration:
            return True
        c.blocked = gen
        return False

    def _pump(self, now):
        """Resume waiting allocations and queued requests until nothing moves."""
        progress = True
        while progress:
            progress = False
            for part in self.partitions:
                progress |= self._retry_reclaims(part)
            for c in list(self._conns.values()):
                if c.blocked is not None:
                    gen, c.blocked = c.blocked, None
                    if not self._run(c, gen):
                        continue
                    progress = True
                while c.blocked is None and c.queue:
                    payload = c.queue.popleft()
                    progress = True
                    if c.closed:
                        continue
                    self._run(c, self._dispatch(c, payload, now))

    def _label(self, addr, length):
        """Name of the field at ``addr`` (for logs; MemWrite.what)."""
        lay = self.lay
        for name, base, size in lay["spans"]:
            if not base <= addr < base + size:
                continue
            r = addr - base
            if name.endswith(("head", "tail")):
                return name.replace(" ", ".")
            if name == "table":
                i, r = divmod(r, ENTRY_SIZE)
                h = self.cfg.table_base_handle + i
                part = {(0, 4): "flags+generation", (4, 12): "data_length+block_offset",
                        (0, 2): "flags", (4, 4): "data_length"}.get((r, length), f"+{r}")
                return f"entry[{h:#x}].{part}"
            if name.endswith("ring"):
                s, r = divmod(r, SLOT_SIZE)
                field_ = {0: "sequence", 8: "block_offset"}.get(r, f"+{r}")
                return f"{name.split()[0]}.slot[{s}].{field_}"
            b, r = divmod(r, self.cfg.block_size)
            boff = self.cfg.block_offset(b)
            return f"block {boff:#x}" + (f"+{r}" if r else "") + f" ({length} octets)"
        return f"{addr:#x}"

    # ---------------------------------------------------------------- entries

    def _write(self, writes):
        """Carry out ordered target-memory writes ``[(address, octets), ...]``."""
        for a, data in writes:
            self.mem[a:a + len(data)] = data

    def _bound_count(self, s):
        n = 0
        for h in range(s.handle_base, s.handle_base + s.handle_count):
            a = self.entry_addr(h)
            if int.from_bytes(self.mem[a:a + 2], "big") & _VALID:
                n += 1
        return n

    def _in_table(self, h):
        return policy.in_table(self.cfg, h)

    def _part(self, s):
        """The session's partition, or None."""
        return self.partitions[s.partition] if s.partition is not None else None

    # ---------------------------------------------------------------- rings

    def _return_block(self, s_domain, boff):
        """Clear if needed, then give the block back to its ring (after the entry update)."""
        home = policy.block_home(self.cfg, boff)
        if policy.clear_on_return(self.cfg, s_domain, home):
            a = self.block_addr(boff)
            self.mem[a:a + self.cfg.block_size] = bytes(self.cfg.block_size)
        (self.shared_ring if home is None else self.partitions[home].ring).free(boff)

    def _observe(self, now):
        """Stamp tickets that initiators took on partition Heads since the last look."""
        for part in self.partitions:
            part.observe(part.ring.counter_fields("head")[0], now)

    def _abandon_all(self, part, reason):
        s = self._sessions.get(part.owner)
        if s is not None and s.partition_exposed:
            for stag in part.stags:
                self.regions[stag].valid = False
                self._emit(InvalidateStag(s.conn, stag, reason))
            s.direct_alloc = False
        part.abandon()
        self._retry_reclaims(part)

    def _retry_reclaims(self, part):
        moved = False
        for t in list(part.to_reclaim):
            o = part.ring.slot_of(t)
            if part.ring.slot_ready(t, o):
                part.ring.reclaim(t, o)
                part.to_reclaim.remove(t)
                self._count("RECLAIM", "OK")
                moved = True
        return moved

    # ---------------------------------------------------------------- completions

    def _complete(self, c, op, msg, status, gen=0, dlen=0, boff=0):
        """Complete a decoded request: record (RECORD_COMPLETION) or COMPLETION Send."""
        status = Status(status)
        self._count(op.name, status)
        if c.closed:
            return
        s = c.session
        inval = policy.invalidate_stag(msg)
        cd = policy.record_descriptor(msg, s)
        if cd is not None:
            rec, imm = policy.completion_record(msg, status, gen, dlen, boff)
            try:
                c.imem.write(cd.stag, cd.tagged_offset, rec)
                self._emit(WriteImm(c.conn_id, cd.stag, cd.tagged_offset, rec, imm))
                return
            except AccessError as e:
                self._emit(WriteImm(c.conn_id, cd.stag, cd.tagged_offset, rec, imm, str(e)))
        payload = policy.completion_payload(msg, s, status, gen, dlen, boff)
        self._emit(SendMsg(c.conn_id, payload, inval))
        if inval is not None:
            c.imem.invalidate(inval)

    def _complete_raw(self, c, raw, status):
        """COMPLETION for a request that could not be decoded: echo what the header gives."""
        self._count(policy.op_name(raw), status)
        self._emit(SendMsg(c.conn_id, policy.raw_completion(raw, c.session, status)))

    # ---------------------------------------------------------------- dispatch

    def _dispatch(self, c, raw, now):
        if policy.is_hello(raw):
            return self._hello(c, raw, now)
        s = c.session
        msg, status = policy.screen(self.cfg, raw, s)
        if msg is None:
            self._complete_raw(c, raw, status)
            return None
        handler = {Opcode.LOAD: self._load, Opcode.STORE: self._store,
                   Opcode.ALLOC_STORE: self._alloc_store, Opcode.FREE: self._free,
                   Opcode.BIND: self._bind, Opcode.GOODBYE: self._goodbye}[msg.OPCODE]
        return handler(c, s, msg, now)

    # ---------------------------------------------------------------- HELLO / GOODBYE

    def _hello_ack(self, c, status, reason=None, **fields):
        payload = codec.encode(codec.HelloAck(status=Status(status).value, **fields))
        self._emit(SendMsg(c.conn_id, payload))
        self._count("HELLO", status)
        if reason is not None:
            self._emit(Disconnect(c.conn_id, reason))
            c.closed = True

    def _hello(self, c, raw, now):
        cfg = self.cfg
        plan = policy.plan_hello(cfg, raw, conn_has_session=c.session is not None,
                                 sessions=self._sessions,
                                 partition_owners=[p.owner for p in self.partitions])
        if plan.status is not Status.OK:
            self._hello_ack(c, plan.status, plan.disconnect)
            return None
        s = plan.session
        if s is None:
            s = self._sessions[plan.new["initiator_id"]] = Session(**plan.new)
            if plan.partition is not None:
                self._assign_partition(s, self.partitions[plan.partition])
        s.attach(c.conn_id, plan.features, plan.msg.completion_credits)
        c.session = s
        if s.features & Features.DIRECT_LOAD.value:
            for stag in (cfg.table_stag, cfg.pool_stag):
                self.regions[stag].conns.add(c.conn_id)
        stags = None
        if s.direct_alloc:
            part = self.partitions[s.partition]
            stags = part.stags = policy.new_stags(self._next_stag)
            self._next_stag = stags[-1]
            for w in policy.partition_windows(cfg, self.lay, part.index, stags):
                self.regions[w.stag] = Region(*w, {c.conn_id})
        self._hello_ack(c, Status.OK, **policy.hello_ack_fields(cfg, self.lay, s, stags))
        return None

    def _assign_partition(self, s, part):
        if part.assign(s):
            for i in range(self.cfg.direct_quota):
                a = self.block_addr(self.cfg.block_offset(part.first_block + i))
                self.mem[a:a + self.cfg.block_size] = bytes(self.cfg.block_size)

    def _close(self, c, now, reason):
        """The connection is gone: retain its session, drop its STags and queued requests."""
        c.closed = True
        c.queue.clear()
        for r in self.regions.values():
            r.conns.discard(c.conn_id)
        s = c.session
        if s is not None and s.conn == c.conn_id:
            s.retain(now, self.cfg.retention_ms)

    def _release_session(self, s):
        """Free every binding, reclaim tickets, give back range, quota and partition."""
        for h in range(s.handle_base, s.handle_base + s.handle_count):
            e = self.read_entry(h)
            if e["flags"] & _VALID:
                self._unbind(s, h, e)
        if s.partition is not None:
            part = self.partitions[s.partition]
            self._abandon_all(part, "session released")
            part.release()
        del self._sessions[s.initiator_id]

    def _goodbye(self, c, s, msg, now):
        if policy.goodbye_releases(msg):
            if s.partition is not None:
                self._abandon_all(self.partitions[s.partition], "GOODBYE RELEASE")
            self._close(c, now, "goodbye")
            self._release_session(s)
        else:
            self._close(c, now, "goodbye")
        self._count("GOODBYE", Status.OK)
        self._emit(Disconnect(c.conn_id, "GOODBYE"))
        return None

    # ---------------------------------------------------------------- operations

    def _checked(self, c, s, op, msg):
        """Authorization and the entry checks (host.policy): the entry to go on, or None when
        the request was completed with an error."""
        status = policy.authorize(self.cfg, op, s, msg.handle, self._sessions.values())
        if status is not None:
            return self._complete(c, op, msg, status)
        e = self.read_entry(msg.handle)
        status = policy.check_entry(self.cfg, op, msg, e)
        if status is not None:
            return self._complete(c, op, msg, status, e["generation"])
        return e

    def _load(self, c, s, msg, now):
        op = Opcode.LOAD
        e = self._checked(c, s, op, msg)
        if e is None:
            return
        g = e["generation"]
        n, boff = e["data_length"], e["block_offset"]
        if n:
            a = self.block_addr(boff)
            data = bytes(self.mem[a:a + n])
            d = msg.data
            try:
                c.imem.write(d.stag, d.tagged_offset, data)
            except AccessError as err:
                # The COMPLETION follows the WRITE without waiting for it (Readings 10).
                self._emit(RdmaWrite(c.conn_id, d.stag, d.tagged_offset, data, str(err)))
            else:
                self._emit(RdmaWrite(c.conn_id, d.stag, d.tagged_offset, data))
        return self._complete(c, op, msg, Status.OK, g, n, boff)

    def _obtain(self, c, msg):
        """The store's data: inline, or RDMA Read of the Data Descriptor (None on a fault)."""
        if msg.flags & ReqFlags.INLINE.value:
            return msg.inline
        d = msg.data
        if not d.length:
            return b""
        try:
            data = c.imem.read(d.stag, d.tagged_offset, d.length)
        except AccessError as err:
            self._emit(RdmaRead(c.conn_id, d.stag, d.tagged_offset, d.length, b"", str(err)))
            return None
        self._emit(RdmaRead(c.conn_id, d.stag, d.tagged_offset, d.length, data))
        return data

    def _store(self, c, s, msg, now):
        op, h = Opcode.STORE, msg.handle
        e = self._checked(c, s, op, msg)
        if e is None:
            return
        g = e["generation"]
        data = self._obtain(c, msg)
        if data is None:
            return self._complete(c, op, msg, Status.INTERNAL, g)
        boff = e["block_offset"]
        if data:
            b = self.block_addr(boff)
            self.mem[b:b + len(data)] = data
        self._write(policy.store_writes(self.cfg, self.lay, h, e, len(data),
                                        msg.flags & ReqFlags.SEAL.value))
        return self._complete(c, op, msg, Status.OK, g, len(data), boff)

    def _alloc_store(self, c, s, msg, now):
        op, h = Opcode.ALLOC_STORE, msg.handle
        e = self._checked(c, s, op, msg)
        if e is None:
            return
        g = e["generation"]
        part = self._part(s)
        ring = part.ring if part is not None else self.shared_ring
        status = policy.check_quota(self.usage(s.initiator_id), s.quota)
        if status is None:
            status = policy.check_ring(ring.occupancy())
        if status is not None:
            self._complete(c, op, msg, status, g)
            return
        if part is not None:
            self._observe(now)
        ticket, slot = ring.take_ticket()
        if part is not None:
            part.took(ticket)
        s.pending_allocs += 1
        while c.hold or not ring.slot_ready(ticket, slot):
            yield
        boff = ring.finish_allocation(ticket, slot)
        data = self._obtain(c, msg)
        if data is None:
            ring.free(boff)
            s.pending_allocs -= 1
            self._complete(c, op, msg, Status.INTERNAL, g)
            return
        if data:
            b = self.block_addr(boff)
            self.mem[b:b + len(data)] = data
        g = next_generation(e["generation"])
        self._write(policy.bind_writes(self.cfg, self.lay, h, policy.alloc_flags(msg), g,
                                       len(data), boff))
        s.pending_allocs -= 1
        self._complete(c, op, msg, Status.OK, g, len(data), boff)

    def _unbind(self, s, h, e):
        g = next_generation(e["generation"])
        self._write(policy.unbind_writes(self.cfg, self.lay, h, g))
        self._return_block(s.domain, e["block_offset"])
        return g

    def _free(self, c, s, msg, now):
        op, h = Opcode.FREE, msg.handle
        e = self._checked(c, s, op, msg)
        if e is None:
            return
        g = self._unbind(s, h, e)
        return self._complete(c, op, msg, Status.OK, g, 0, e["block_offset"])

    def _bind(self, c, s, msg, now):
        op, h = Opcode.BIND, msg.handle
        e = self._checked(c, s, op, msg)
        if e is None:
            return
        g = e["generation"]
        part = self._part(s)
        t = msg.ticket
        status = policy.check_ticket(s, part, t)
        if status is None:
            o = part.ring.slot_of(t)
            status = policy.check_slot(t, *part.ring.read_slot(o), msg.block_offset)
        if status is not None:
            return self._complete(c, op, msg, status, g)
        del part.outstanding[t]
        part.ring.consume(o)
        g = next_generation(e["generation"])
        self._write(policy.bind_writes(self.cfg, self.lay, h, _VALID, g, msg.data_length,
                                       msg.block_offset))
        return self._complete(c, op, msg, Status.OK, g, msg.data_length, msg.block_offset)

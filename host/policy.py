# Ref: draft KBTP §Session Establishment, §Allocation Quotas, §Operations, §Completion,
#      §Direct Modes, §Operational Considerations, §Security Considerations; issue 19 item 3;
#      model/target.py "Readings of the draft" (the behaviour decided here).
"""What the host driver and the golden model must decide alike.

:mod:`host.driver` (the slow path of the hardware target) and :mod:`model.target` (the golden
model the hardware and the driver are checked against) answer the same requests with the same
octets. Every decision they must make alike is made here, once, from plain values (the request,
the :class:`~host.config.TargetConfig` and its ``layout()``, the session and partition state);
each side only reads what a decision needs and carries its outcome out, the driver through its
:class:`~host.port.TargetPort`, the model on its own memory image.

Contents
--------
State
    :class:`SessionState` (a session: range, quota, features, retention) and
    :class:`PartitionState` (a DIRECT_ALLOC partition: owner, tickets seen, abandoned,
    reclaimed); each side's session is a subclass with its own extra fields.
Memory structures
    :func:`entry_addr`, :func:`block_addr`, :func:`in_table`, :func:`entry_image`,
    :func:`decode_entry`, :func:`initial_blocks`, and the ordered entry writes of each
    operation (:func:`bind_writes`, :func:`unbind_writes`, :func:`store_writes`).
Trust domains and blocks
    :func:`possible_domains`, :func:`readable` (LOAD authorization), :func:`block_home` (the
    ring a block returns to), :func:`clear_on_return`, :func:`direct_load_possible`.
HELLO
    :func:`negotiate_features`, :func:`free_range`, :func:`session_quota`, :func:`plan_hello`
    (the whole admission: rejections, new or restored session, partition, quota),
    :func:`new_stags`, :func:`direct_load_windows` / :func:`partition_windows` (what each direct
    STag exposes) and :func:`hello_ack_fields` (the HELLO_ACK contents).
Requests, in the draft's validation order (model/target.py reading 6)
    :func:`is_hello`, :func:`screen` (decode, no session, RECORD+INVALIDATE),
    :func:`authorize` (INVALID_HANDLE), :func:`check_entry` (TOO_LARGE, STALE_GENERATION and
    the per-operation entry checks), :func:`check_quota`, :func:`check_ring`,
    :func:`check_ticket` and :func:`check_slot` (BIND), :func:`quota_use`,
    :func:`next_generation`, :func:`alloc_flags`, :func:`goodbye_releases`.
Completions
    :func:`op_name`, :func:`invalidate_stag`, :func:`record_descriptor`,
    :func:`completion_record`, :func:`completion_payload`, :func:`raw_completion`.

Differences between the driver and the model
--------------------------------------------
What is left on each side is what it really does differently:

* **Control flow.** Each side keeps one handler per operation that calls the checks here in the
  same order and then carries the outcome out: the driver's are coroutines (every memory access
  awaits the port), the model's plain functions (ALLOC_STORE a generator that can wait). So the
  sequence "check, read the slot, check, consume, bind" is written on both sides.
* **Memory access.** The model owns its memory image and logs every write as a ``MemWrite``;
  the driver reads and writes target memory through its port, so it re-reads an entry, a slot
  or a counter each time it needs one, and counts a session's bindings by reading its entries.
* **Data transfers.** The model performs LOAD / STORE / ALLOC_STORE data movement, the
  completion record and Send with Invalidate on the initiator's memory itself (an
  ``AccessError`` becomes INTERNAL); the driver posts RDMA work requests and waits for their
  WorkCompletion (a failed one becomes INTERNAL). With the fast path on, the engine executes
  those operations and the driver sees only the rest.
* **The engine.** Only the driver programs it: the RANGE register of a session's handle range
  (set at HELLO, cleared when the session is released), the QP session registers (handle range,
  quota, usage, RECORD_COMPLETION, domain; off when the connection goes), the lowering of the
  engine's USAGE after a FREE (and its counters report an engine session's quota use from that
  register), the DIRECT_ALLOC partition rings the engine serves (PART registers; QP session
  bits 5..4), and frees through the engine's free queue, each naming its ring.
* **Direct STags.** The model keeps one ``Region`` per STag with the set of connections that may
  use it and checks the initiator's one-sided accesses itself; the driver programs MR slots with
  a QP bit mask. What each STag exposes (:func:`partition_windows`,
  :func:`direct_load_windows`) is the same.
* **Waiting allocations.** The model's ALLOC_STORE can wait for its slot (a generator; ``hold``
  / ``release``), and counts its taken-but-unbound tickets in the session's quota use
  (``pending_allocs``); the driver handles one request at a time and polls until the slot fills
  (``DriverError`` after ``wc_polls``), so nothing is pending between its requests.
* **Ticket observation.** The model sees initiators' Head FetchAdds as they happen
  (``remote_fetch_add``) and also looks on every receive and tick; the driver looks at the
  partition Heads when it polls or ticks (the Ticket Timeout runs from that first sight).
  When the engine runs a partition session's ALLOC_STOREs, the driver sees their Head tickets
  like an initiator's and drops them on a tick once their slot shows them consumed
  (:func:`slot_consumed`); the model (playing the engine) never counts them.
* **Ring images.** The model's rings are :class:`model.ring.RingImage` objects (frees deferred
  inside the ring); the driver keeps its own deferred frees per slot and writes the same slots
  and counters. The model builds its initial memory structure by structure; the driver writes
  the same octets as one image.
* **Partition clearing.** Handing a partition to another domain clears its blocks: the model
  with one write per block (one ``MemWrite`` each), the driver with one write of the whole
  partition; the memory afterwards is the same.
* **Connections.** The model's connection drops its queued requests when it closes; the driver
  flushes the reply before reporting a ``disconnect`` action, takes the QP out of every MR mask
  and turns the engine session off. The driver answers an unexpected exception with an INTERNAL
  completion (and raises it); the model has no such path. The two count alike but under
  different names (``TargetModel.counters``, ``KbtpDriver.stats``); the driver also counts
  failed reply WorkCompletions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from hw.headers import (EntryFlags, Features, GoodbyeFlags, Opcode, ReqFlags, SLOT_EMPTY, Status,
                        TableEntry, CommonHeader, RingSlot, unpack)
from host import codec
from host.codec import KbtpError

__all__ = [
    "SessionState", "PartitionState", "HelloPlan", "Window",
    "entry_addr", "block_addr", "in_table", "entry_image", "decode_entry", "initial_blocks",
    "bind_writes", "unbind_writes", "store_writes",
    "possible_domains", "readable", "block_home", "clear_on_return", "direct_load_possible",
    "negotiate_features", "free_range", "session_quota", "plan_hello", "new_stags",
    "direct_load_windows", "partition_windows", "hello_ack_fields",
    "is_hello", "screen", "authorize", "check_entry", "check_quota", "check_ring",
    "check_ticket", "check_slot", "slot_holds", "slot_consumed", "quota_use", "next_generation",
    "stale",
    "alloc_flags", "goodbye_releases",
    "op_name", "invalidate_stag", "record_descriptor", "completion_record",
    "completion_payload", "raw_completion",
    "VALID", "SEALED", "DIRECT", "M32", "STAG_STEP",
]

M32 = (1 << 32) - 1
VALID = EntryFlags.VALID.value
SEALED = EntryFlags.SEALED.value
DIRECT = Features.DIRECT_LOAD.value | Features.DIRECT_ALLOC.value
_ENTRY = TableEntry.SIZE
_SLOT = RingSlot.SIZE
#: Distance between two STags the target hands out for the direct modes.
STAG_STEP = 0x100


# --------------------------------------------------------------------------------------------
# State
# --------------------------------------------------------------------------------------------

@dataclass
class SessionState:
    """A session as both sides keep it (model/target.py readings 2, 5 and 14)."""
    initiator_id: int
    domain: int
    range_index: int
    handle_base: int
    handle_count: int
    quota: int
    features: int = 0
    conn: object = None                 # the connection it is active on; None while retained
    partition: int | None = None
    direct_alloc: bool = False          # DIRECT_ALLOC usable now
    completion_credits: int = 0
    expire_at: float | None = None

    @property
    def addr_le(self) -> bool:
        return bool(self.features & Features.ADDR_LE.value)

    @property
    def active(self) -> bool:
        return self.conn is not None

    def owns(self, handle: int) -> bool:
        return self.handle_base <= handle < self.handle_base + self.handle_count

    def attach(self, conn, features, completion_credits):
        """HELLO accepted on ``conn`` with the negotiated ``features``."""
        self.conn = conn
        self.expire_at = None
        self.features = features
        self.completion_credits = completion_credits
        self.direct_alloc = bool(features & Features.DIRECT_ALLOC.value)

    def retain(self, now, retention_ms):
        """The connection is gone: keep everything for ``retention_ms``."""
        self.conn = None
        self.direct_alloc = False
        self.expire_at = now + retention_ms

    def expired(self, now) -> bool:
        """Retained for longer than the retention time (released by the next tick)."""
        return self.conn is None and self.expire_at is not None and self.expire_at <= now

    @property
    def partition_exposed(self) -> bool:
        """Its partition's STags are live (to be invalidated before a reclamation)."""
        return self.conn is not None and self.direct_alloc


@dataclass
class PartitionState:
    """A DIRECT_ALLOC partition (model/target.py readings 2, 12 and 13). ``ring`` is the side's
    own view of the partition ring."""
    index: int
    ring: object
    first_block: int
    owner: int | None = None            # Initiator ID
    last_domain: int | None = None
    seen: int = 0                       # next Head ticket not yet observed
    outstanding: dict = field(default_factory=dict)   # initiator ticket -> first seen (ms)
    abandoned: set = field(default_factory=set)
    to_reclaim: list = field(default_factory=list)    # abandoned tickets without a block yet
    stags: tuple = ()                   # (partition, ring, head) of the current connection

    def observe(self, head_ticket, now):
        """Stamp the tickets taken on the Head since the last look (``head_ticket`` = the Head
        counter's ticket field)."""
        while self.seen != head_ticket:
            self.outstanding[self.seen] = now
            self.seen = (self.seen + 1) & M32

    def took(self, ticket):
        """The target took ``ticket`` itself (its own ALLOC_STORE): not an initiator's."""
        self.seen = (ticket + 1) & M32

    def timed_out(self, now, ticket_timeout_ms) -> bool:
        return bool(self.outstanding) and \
            min(self.outstanding.values()) + ticket_timeout_ms <= now

    def in_use(self) -> int:
        """Tickets counted against the owner's quota: taken and unbound, or being reclaimed."""
        return len(self.outstanding) + len(self.to_reclaim)

    def abandon(self):
        """Every outstanding ticket is abandoned and to be reclaimed (in ticket order)."""
        for t in list(self.outstanding):
            self.abandoned.add(t)
            self.to_reclaim.append(t)
        self.outstanding.clear()

    def assign(self, s) -> bool:
        """Hand the partition to session ``s``; True when its blocks must be cleared first
        (another domain than the last owner's, reading 15)."""
        clear = self.last_domain is not None and self.last_domain != s.domain
        self.owner = s.initiator_id
        self.last_domain = s.domain
        s.partition = self.index
        return clear

    def release(self):
        self.owner = None
        self.stags = ()


# --------------------------------------------------------------------------------------------
# Memory structures
# --------------------------------------------------------------------------------------------

def entry_addr(cfg, lay, handle):
    return lay["table"] + _ENTRY * (handle - cfg.table_base_handle)


def block_addr(cfg, lay, block_offset):
    return lay["pool"] + (block_offset - cfg.pool_to_base)


def in_table(cfg, handle):
    return 0 <= handle - cfg.table_base_handle < cfg.num_handles


def entry_image(cfg, flags, gen, dlen, boff):
    return codec.encode_entry(flags, gen, dlen, boff, addr_le=cfg.addr_le)


def decode_entry(cfg, raw):
    """A table entry's 16 octets as a dict (flags, generation, data_length, block_offset)."""
    raw = bytearray(raw)
    if cfg.addr_le:
        raw[8:16] = raw[8:16][::-1]
    return unpack(TableEntry, raw)


def initial_blocks(cfg, lay):
    """Block Offsets the rings start with: (shared ring, [each partition ring])."""
    order = cfg.initial_free_order or list(range(cfg.shared_blocks))
    return ([cfg.block_offset(i) for i in order],
            [[cfg.block_offset(d["first_block"] + i) for i in range(cfg.direct_quota)]
             for d in lay["direct"]])


def bind_writes(cfg, lay, handle, flags, gen, dlen, boff):
    """A binding's entry writes, in order: Data Length and Block Offset, then Flags and
    Generation. ``[(address, octets), ...]``."""
    a = entry_addr(cfg, lay, handle)
    img = entry_image(cfg, flags, gen, dlen, boff)
    return [(a + 4, img[4:16]), (a, img[0:4])]


def unbind_writes(cfg, lay, handle, gen):
    """An unbinding: Flags 0 and the new Generation, one 4-octet write (the entry's first
    word)."""
    return [(entry_addr(cfg, lay, handle), entry_image(cfg, 0, gen, 0, 0)[0:4])]


def store_writes(cfg, lay, handle, entry, length, seal):
    """A STORE's entry writes after the data: Data Length, then Flags with SEALED if asked."""
    a = entry_addr(cfg, lay, handle)
    out = [(a + 4, length.to_bytes(4, "big"))]
    if seal:
        out.append((a, (entry["flags"] | SEALED).to_bytes(2, "big")))
    return out


# --------------------------------------------------------------------------------------------
# Trust domains and blocks
# --------------------------------------------------------------------------------------------

def possible_domains(cfg):
    """Every trust domain an initiator of this configuration can be in."""
    return set(cfg.trust_domains.values()) | {cfg.default_trust_domain}


def readable(cfg, sessions, domain, handle):
    """LOAD authorization (reading 7): a handle of the table whose range is free or owned (active
    or retained) by a session of ``domain``. ``sessions``: every session."""
    if not in_table(cfg, handle):
        return False
    idx = (handle - cfg.table_base_handle) // cfg.handles_per_initiator
    for other in sessions:
        if other.range_index == idx:
            return other.domain == domain
    return True


def block_home(cfg, boff):
    """The ring block ``boff`` returns to (reading 3): None for the shared ring, else the index
    of its partition."""
    i = (boff - cfg.pool_to_base) // cfg.block_size
    if i < cfg.shared_blocks:
        return None
    return (i - cfg.shared_blocks) // cfg.direct_quota


def clear_on_return(cfg, domain, home):
    """Is a block freed by a session of ``domain`` to ring ``home`` (:func:`block_home`) zeroed
    first? Shared blocks, when another domain exists (reading 15)."""
    return home is None and bool(possible_domains(cfg) - {domain})


def direct_load_possible(cfg):
    """Can any session be granted DIRECT_LOAD (so its two STags are ever needed)?"""
    doms = possible_domains(cfg)
    return bool(cfg.offered() & Features.DIRECT_LOAD.value
                and len(doms) == 1 and doms <= set(cfg.direct_domains))


# --------------------------------------------------------------------------------------------
# HELLO
# --------------------------------------------------------------------------------------------

def negotiate_features(cfg, domain, requested):
    """Features granted to an initiator of ``domain`` that asked for ``requested`` (reading 4),
    before the partition check (:func:`plan_hello`)."""
    offered = cfg.offered()
    if domain not in cfg.direct_domains:
        offered &= ~DIRECT
    if possible_domains(cfg) != {domain}:
        # the Pool STag reaches every block: only when no other domain can own one
        offered &= ~Features.DIRECT_LOAD.value
    feats = requested & offered
    if bool(feats & Features.ADDR_LE.value) != cfg.addr_le:
        feats &= ~DIRECT
    return feats


def free_range(cfg, sessions):
    """The first handle range no session (active or retained) holds, or None."""
    used = {x.range_index for x in sessions}
    return next((i for i in range(cfg.num_ranges) if i not in used), None)


def session_quota(cfg, initiator_id, sessions):
    """Allocation Quota of a new shared-ring session (reading 2): its configured quota, capped
    so that the quotas of all shared-ring sessions stay within the shared blocks."""
    quota = cfg.quotas.get(initiator_id, cfg.quota_per_initiator)
    if not cfg.overcommit_quotas:
        taken = sum(x.quota for x in sessions if x.partition is None)
        quota = max(0, min(quota, cfg.shared_blocks - taken))
    return quota


@dataclass(frozen=True)
class HelloPlan:
    """What a HELLO leads to. ``status`` other than OK: answer HELLO_ACK with it, and disconnect
    when ``disconnect`` (a reason) is set. OK: attach ``session`` (a retained one) or a new
    session made of ``new`` (:class:`SessionState` fields), which gets partition ``partition``
    when it is not None, with ``features``."""
    status: Status
    disconnect: str | None = None
    msg: object = None
    features: int = 0
    session: object = None
    new: dict | None = None
    partition: int | None = None


def plan_hello(cfg, raw, *, conn_has_session, sessions, partition_owners):
    """Admission of a HELLO (reading 5). ``sessions``: Initiator ID -> session (active and
    retained); ``partition_owners``: the owner (Initiator ID or None) of each partition."""
    try:
        msg = codec.decode(raw)
    except KbtpError:
        return HelloPlan(Status.MALFORMED, "malformed HELLO")
    if conn_has_session:
        return HelloPlan(Status.MALFORMED)
    iid = msg.initiator_id
    s = sessions.get(iid)
    if s is not None and s.active:
        return HelloPlan(Status.ALREADY_BOUND, "Initiator ID has an active session")
    domain = cfg.domain_of(iid)
    feats = negotiate_features(cfg, domain, msg.requested_features)
    if s is not None:
        if s.partition is None:
            feats &= ~Features.DIRECT_ALLOC.value
        return HelloPlan(Status.OK, msg=msg, features=feats, session=s)
    ri = free_range(cfg, sessions.values())
    if ri is None:
        return HelloPlan(Status.NO_SPACE, "no free handle range")
    part = None
    if feats & Features.DIRECT_ALLOC.value:
        part = next((p for p, owner in enumerate(partition_owners) if owner is None), None)
    if part is not None:
        quota = cfg.direct_quota
    else:
        feats &= ~Features.DIRECT_ALLOC.value
        quota = session_quota(cfg, iid, sessions.values())
    hpi = cfg.handles_per_initiator
    new = dict(initiator_id=iid, domain=domain, range_index=ri,
               handle_base=cfg.table_base_handle + ri * hpi, handle_count=hpi, quota=quota)
    return HelloPlan(Status.OK, msg=msg, features=feats, new=new, partition=part)


def new_stags(last):
    """The Partition, Ring and Head STags of a new connection after STag ``last`` (they are new
    for every connection, reading 1)."""
    return tuple(last + STAG_STEP * k for k in (1, 2, 3))


class Window(NamedTuple):
    """What a direct-mode STag exposes: ``length`` octets at target address ``addr``, Tagged
    Offsets from ``base_to``; ``access`` 'r' (read), 'w' (write) or 'a' (atomic)."""
    stag: int
    addr: int
    base_to: int
    length: int
    access: str


def direct_load_windows(cfg, lay):
    """The Table and Pool STags (fixed; DIRECT_LOAD)."""
    return (Window(cfg.table_stag, lay["table"], 0, lay["table_size"], "r"),
            Window(cfg.pool_stag, lay["pool"], cfg.pool_to_base, lay["pool_size"], "r"))


def partition_windows(cfg, lay, index, stags):
    """The Partition (the partition's blocks, at their Pool Tagged Offsets), Ring and Head STags
    of partition ``index`` (DIRECT_ALLOC)."""
    d = lay["direct"][index]
    first = cfg.block_offset(d["first_block"])
    return (Window(stags[0], block_addr(cfg, lay, first), first,
                   cfg.direct_quota * cfg.block_size, "w"),
            Window(stags[1], d["ring"], 0, _SLOT * d["n"], "r"),
            Window(stags[2], d["head"], 0, 8, "a"))


def hello_ack_fields(cfg, lay, s, stags=None):
    """The HELLO_ACK fields (besides Status) for session ``s`` as attached; ``stags`` the
    partition's STags when DIRECT_ALLOC is granted."""
    fields = dict(features=s.features, request_credits=cfg.request_credits,
                  block_size=cfg.block_size, max_inline=cfg.max_inline,
                  allocation_quota=s.quota, handle_base=s.handle_base,
                  handle_count=s.handle_count, ticket_timeout_ms=cfg.ticket_timeout_ms)
    if s.features & Features.DIRECT_LOAD.value:
        fields.update(table=codec.DirectDesc(cfg.table_stag, 0, cfg.num_handles),
                      table_base_handle=cfg.table_base_handle,
                      pool=codec.DirectDesc(cfg.pool_stag, cfg.pool_to_base, cfg.num_blocks))
    if stags is not None:
        d = lay["direct"][s.partition]
        first = cfg.block_offset(d["first_block"])
        fields.update(partition=codec.DirectDesc(stags[0], first, cfg.direct_quota),
                      ring=codec.DirectDesc(stags[1], 0, d["n"]),
                      head=codec.DirectDesc(stags[2], 0, 1))
    return fields


# --------------------------------------------------------------------------------------------
# Requests
# --------------------------------------------------------------------------------------------

def next_generation(gen: int) -> int:
    """Generation + 1 modulo 2**16, skipping zero."""
    return ((gen + 1) & 0xFFFF) or 1


def stale(msg, entry) -> bool:
    """The request names a Generation (non-zero) that is not the entry's."""
    return bool(msg.generation and msg.generation != entry["generation"])


def is_hello(raw) -> bool:
    return len(raw) >= 2 and raw[1] == Opcode.HELLO.value


def screen(cfg, raw, s):
    """A request other than HELLO on a connection with session ``s`` (None before HELLO):
    ``(message, None)`` to go on, or ``(None, status)`` to complete the raw request with
    (decode errors, no session yet, a target-to-initiator opcode, RECORD+INVALIDATE under
    RECORD_COMPLETION: reading 9)."""
    try:
        msg = codec.decode(raw, addr_le=s.addr_le if s else False, max_inline=cfg.max_inline)
    except KbtpError as e:
        return None, e.status
    op = msg.OPCODE
    if s is None or op in (Opcode.HELLO_ACK, Opcode.COMPLETION):
        return None, Status.MALFORMED
    both = ReqFlags.RECORD.value | ReqFlags.INVALIDATE.value
    if (msg.flags & both == both and op is not Opcode.GOODBYE
            and s.features & Features.RECORD_COMPLETION.value):
        # a Write with Immediate cannot invalidate
        return None, Status.MALFORMED
    return msg, None


def authorize(cfg, op, s, handle, sessions):
    """INVALID_HANDLE, or None: LOAD reads any handle :func:`readable` by the session's domain,
    every other operation only the session's own range."""
    if op is Opcode.LOAD:
        ok = readable(cfg, sessions, s.domain, handle)
    else:
        ok = s.owns(handle)
    return None if ok else Status.INVALID_HANDLE


def check_entry(cfg, op, msg, entry):
    """The checks after authorization that need only the request and its table entry, in the
    draft's order (reading 6); the first failing status, or None. Errors complete with the
    entry's Generation (reading 8). What follows, by the caller: ALLOC_STORE
    :func:`check_quota` then :func:`check_ring`; BIND :func:`check_ticket` then
    :func:`check_slot`."""
    flags = entry["flags"]
    if op is Opcode.STORE or op is Opcode.ALLOC_STORE:
        if msg.data.length > cfg.block_size:
            return Status.TOO_LARGE
    elif op is Opcode.BIND:
        if msg.data_length > cfg.block_size:
            return Status.TOO_LARGE
    if stale(msg, entry):
        return Status.STALE_GENERATION
    if op is Opcode.LOAD:
        if not flags & VALID:
            return Status.NOT_VALID
        if not flags & SEALED and not msg.flags & ReqFlags.ALLOW_UNSEALED.value:
            return Status.NOT_SEALED
        if entry["data_length"] > msg.data.length:
            return Status.TOO_LARGE
    elif op is Opcode.STORE:
        if not flags & VALID:
            return Status.NOT_VALID
        if flags & SEALED:
            return Status.SEALED
    elif op is Opcode.FREE:
        if not flags & VALID:
            return Status.NOT_VALID
    elif flags & VALID:             # ALLOC_STORE, BIND
        return Status.ALREADY_BOUND
    return None


def quota_use(bound, part=None, pending=0):
    """A session's quota use (reading 2): ``bound`` handles, ``pending`` tickets the target took
    for it and has not bound yet, and its partition's tickets in use."""
    return bound + pending + (part.in_use() if part is not None else 0)


def check_quota(usage, quota):
    """ALLOC_STORE: NO_SPACE once the quota is used up."""
    return Status.NO_SPACE if usage >= quota else None


def check_ring(free_blocks):
    """ALLOC_STORE: NO_SPACE when the ring it allocates from has no free block."""
    return Status.NO_SPACE if free_blocks == 0 else None


def check_ticket(s, part, ticket):
    """BIND's ticket (reading 12), after :func:`check_entry`: ``part`` the session's partition
    (None without one)."""
    if part is None:
        return Status.MALFORMED
    if ticket in part.abandoned:
        return Status.TICKET_ABANDONED
    if not s.direct_alloc or ticket not in part.outstanding:
        return Status.MALFORMED
    return None


def slot_holds(ticket, sequence, block_offset):
    """A ring slot reading ``(sequence, block_offset)`` holds the block of ``ticket``."""
    return sequence == ticket & M32 and block_offset != SLOT_EMPTY


def slot_consumed(ticket, sequence, block_offset):
    """Has the ring slot of ``ticket``, reading ``(sequence, block_offset)``, been consumed for
    it? With ``d = (sequence - ticket) mod 2**32``: yes when ``d < 2**31`` and either the slot
    was consumed on this lap (``d == 0`` and the Block Offset all ones) or it already moved on
    (``d != 0``: refilled for a later lap, ``ticket + N``, which needs the consumption first).
    No while it holds the ticket's block unconsumed (``d == 0``, a Block Offset) or still waits
    for the free of this lap (``sequence == ticket - N``: ``d`` is "negative").

    The host driver uses it to tell the engine's own ALLOC_STORE tickets on a partition Head
    from an initiator's: an initiator's unbound ticket is consumed only by BIND or by
    reclamation, which forget the ticket first (host/driver.py ``_drop_engine_tickets``)."""
    d = (sequence - ticket) & M32
    return d < 1 << 31 and (d != 0 or block_offset == SLOT_EMPTY)


def check_slot(ticket, sequence, block_offset, bind_offset):
    """BIND, last: the ticket's slot must hold a block for it (NO_SPACE) and that block must be
    the one named (MALFORMED)."""
    if not slot_holds(ticket, sequence, block_offset):
        return Status.NO_SPACE
    if block_offset != bind_offset:
        return Status.MALFORMED
    return None


def alloc_flags(msg):
    """Flags of the entry an ALLOC_STORE binds."""
    return VALID | (SEALED if msg.flags & ReqFlags.SEAL.value else 0)


def goodbye_releases(msg) -> bool:
    """GOODBYE with RELEASE frees the bindings at once; without, the session is retained
    (reading 14)."""
    return bool(msg.flags & GoodbyeFlags.RELEASE.value)


# --------------------------------------------------------------------------------------------
# Completions
# --------------------------------------------------------------------------------------------

def op_name(raw):
    """The opcode name of a raw request, for the counters ('SHORT', 'OPCODE_0x..')."""
    if len(raw) < 2:
        return "SHORT"
    try:
        return Opcode(raw[1]).name
    except ValueError:
        return f"OPCODE_{raw[1]:#04x}"


def invalidate_stag(msg):
    """The initiator STag a COMPLETION Send invalidates (INVALIDATE with a Data Descriptor; on
    errors too), or None."""
    if msg.flags & ReqFlags.INVALIDATE.value and getattr(msg, "data", None) is not None:
        return msg.data.stag
    return None


def record_descriptor(msg, s):
    """Where the completion record goes (RECORD, a Completion Descriptor and RECORD_COMPLETION
    granted), or None for a COMPLETION Send."""
    cd = getattr(msg, "completion", None)
    if (msg.flags & ReqFlags.RECORD.value and s is not None and cd is not None
            and s.features & Features.RECORD_COMPLETION.value):
        return cd
    return None


def completion_record(msg, status, gen=0, dlen=0, boff=0):
    """``(record octets, immediate)`` of an RDMA Write with Immediate completion."""
    return (codec.encode_record(msg.request_id, Status(status).value, gen, dlen, boff),
            msg.request_id & M32)


def completion_payload(msg, s, status, gen=0, dlen=0, boff=0):
    """The COMPLETION Send of a decoded request."""
    return codec.encode(codec.Completion(request_id=msg.request_id, handle=msg.handle,
                                         generation=gen, status=Status(status).value,
                                         data_length=dlen, block_offset=boff),
                        addr_le=s.addr_le if s is not None else False)


def raw_completion(raw, s, status):
    """The COMPLETION Send of a request that could not be decoded: echo the Request ID and Block
    Handle only when all their octets arrived (reading 8)."""
    hdr = bytearray(raw[:CommonHeader.SIZE]).ljust(CommonHeader.SIZE, b"\0")
    if s is not None and s.addr_le:
        hdr[12:20] = hdr[12:20][::-1]
    f = unpack(CommonHeader, hdr)
    rid = f["request_id"] if len(raw) >= 12 else 0
    handle = f["handle"] if len(raw) >= 20 else 0
    return codec.encode(codec.Completion(request_id=rid, handle=handle,
                                         status=Status(status).value),
                        addr_le=s.addr_le if s else False)

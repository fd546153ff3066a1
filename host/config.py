# Ref: draft KBTP §Target Memory Structures (Block Table, Free-Block Ring, pool), §Direct Modes,
#      §Allocation Quotas; docs/layouts.md; model/target.py "Readings of the draft".
"""The configuration of a KBTP target and the layout of its memory (table, rings, pool).

One :class:`TargetConfig` describes a target for everyone who must agree on it: the host
driver (host/driver.py) that initialises and serves the target, the golden model
(model/target.py) that the gateware is checked against, and the tools that configure either.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hw.headers import Features, RingSlot, TableEntry

__all__ = ["TargetConfig", "ENTRY_SIZE", "SLOT_SIZE", "ALL_FEATURES", "align", "order_for"]

ENTRY_SIZE = TableEntry.SIZE          # 16
SLOT_SIZE = RingSlot.SIZE             # 16
#: Every Features bit the draft defines.
ALL_FEATURES = sum(f.value for f in Features)


def align(x, a):
    """``x`` rounded up to a multiple of ``a``."""
    return (x + a - 1) // a * a


def order_for(count):
    """The smallest ``n`` with ``2**n >= count`` (at least 0)."""
    n = 0
    while (1 << n) < max(count, 1):
        n += 1
    return n


# --------------------------------------------------------------------------------------------
# Configuration and layout
# --------------------------------------------------------------------------------------------

@dataclass
class TargetConfig:
    """Everything a target decides. Addresses left None are laid out by :meth:`layout`.

    Parameters
    ----------
    block_size, num_blocks : int
        Block Size and F.
    num_handles, table_base_handle, handles_per_initiator : int
        Table size, its first handle, and the size of each initiator's handle range.
    ring_order : int or None
        n of the shared ring (N = 2**n >= shared blocks); None = smallest.
    direct_partitions, direct_quota, direct_ring_order
        DIRECT_ALLOC partitions (count, blocks each, ring order; None = smallest).
    quota_per_initiator, quotas
        Default Allocation Quota and per-Initiator-ID overrides (shared ring sessions).
    features_offered : int
        Features the target offers; ``binding="rdmap"`` removes RECORD_COMPLETION.
    addr_le, masked : bool
        ADDR_LE memory structures; masked (draft) or unmasked (InfiniBand) counters.
    request_credits, max_inline, ticket_timeout_ms, retention_ms
        HELLO_ACK values and the retention time of bindings after a disconnect.
        ``request_credits`` is also the number of receive buffers the host driver posts per
        QP (host/driver.py ``memory_plan``: each ``2**ceil(log2(56 + max_inline))`` octets;
        at most 16 per QP on a target built with the default RecvNotify FIFO): a
        configuration whose credits' buffers do not fit the target's memory is refused there.
    trust_domains, default_trust_domain, direct_domains
        Initiator ID -> domain; the domain of unknown IDs; domains trusted with direct modes.
    initial_free_order : list[int] or None
        Order of the shared blocks (indices) in the initial ring; None = ascending.
    initial_generation : int
        Generation of every table entry at start (never 0).
    pool_to_base, table_stag, pool_stag, direct_stag_base
        Tagged Offset of block 0 in the Pool STag; STags of the direct modes.
    head_addr, tail_addr, direct_counters_base, table_base, ring_base, direct_rings_base, \
pool_base : int or None
        Addresses in the image; None = laid out by :meth:`layout`.
    """
    block_size: int = 4096
    num_blocks: int = 16
    num_handles: int = 256
    table_base_handle: int = 0x4000
    handles_per_initiator: int = 64
    ring_order: int | None = None
    direct_partitions: int = 0
    direct_quota: int = 0
    direct_ring_order: int | None = None
    quota_per_initiator: int = 4
    quotas: dict = field(default_factory=dict)
    overcommit_quotas: bool = False
    features_offered: int = ALL_FEATURES
    binding: str = "roce"
    addr_le: bool = False
    masked: bool = True
    request_credits: int = 16
    max_inline: int = 1024
    ticket_timeout_ms: int = 100
    retention_ms: float = 1000.0
    trust_domains: dict = field(default_factory=dict)
    default_trust_domain: int = 0
    direct_domains: frozenset = frozenset({0})
    initial_free_order: list | None = None
    initial_generation: int = 1
    pool_to_base: int = 0
    table_stag: int = 0x7AB1E000
    pool_stag: int = 0x9001E000
    direct_stag_base: int = 0x0D000000
    head_addr: int | None = None
    tail_addr: int | None = None
    direct_counters_base: int | None = None
    table_base: int | None = None
    ring_base: int | None = None
    direct_rings_base: int | None = None
    pool_base: int | None = None

    def __post_init__(self):
        if self.block_size <= 0 or self.num_blocks <= 0:
            raise ValueError("block_size and num_blocks must be positive")
        if self.direct_partitions * self.direct_quota > self.num_blocks:
            raise ValueError("direct partitions exceed the pool")
        if self.handles_per_initiator <= 0 or self.handles_per_initiator > self.num_handles:
            raise ValueError("handles_per_initiator must be in 1..num_handles")
        if not 1 <= self.initial_generation <= 0xFFFF:
            raise ValueError("initial_generation must be 1..65535 (Generation is never 0)")
        if self.binding not in ("roce", "rdmap"):
            raise ValueError("binding must be 'roce' or 'rdmap'")
        if self.ring_order is None:
            self.ring_order = order_for(self.shared_blocks)
        if (1 << self.ring_order) < self.shared_blocks:
            raise ValueError("shared ring N must be >= the shared blocks")
        if self.direct_ring_order is None:
            self.direct_ring_order = order_for(self.direct_quota)
        if self.direct_partitions and (1 << self.direct_ring_order) < self.direct_quota:
            raise ValueError("direct ring N must be >= direct_quota")
        order = self.initial_free_order
        if order is not None and sorted(order) != list(range(self.shared_blocks)):
            raise ValueError("initial_free_order must be a permutation of the shared blocks")

    @property
    def shared_blocks(self) -> int:
        return self.num_blocks - self.direct_partitions * self.direct_quota

    @property
    def num_ranges(self) -> int:
        return self.num_handles // self.handles_per_initiator

    def offered(self) -> int:
        f = self.features_offered & ALL_FEATURES
        if self.binding == "rdmap":
            f &= ~Features.RECORD_COMPLETION.value
        if not self.addr_le:
            f &= ~Features.ADDR_LE.value
        if not self.direct_partitions:
            f &= ~Features.DIRECT_ALLOC.value
        return f

    def layout(self) -> dict:
        """Addresses of every structure in the target memory image.

        Addresses given in the config (``head_addr``, ``tail_addr``, ``table_base``,
        ``ring_base``, ``direct_counters_base``, ``direct_rings_base``, ``pool_base``) are used
        as they are; the others are laid out in that order (counters first, 64-octet aligned
        rings and table, 4 KiB aligned pool). Overlaps or misaligned counters raise ValueError.

        Returns
        -------
        dict
            ``head``, ``tail`` (shared counters), ``table`` (base), ``table_size``, ``ring``
            (shared slots), ``ring_n``, ``direct`` (one dict per partition: ``head``,
            ``tail``, ``ring``, ``n``, ``first_block``), ``pool``, ``pool_size``, ``size``
            (image size), ``counter_order`` ('little'), ``slot_size``, ``entry_size``.
        """
        def pick(given, auto):
            return auto if given is None else given

        head = pick(self.head_addr, 0)
        tail = pick(self.tail_addr, head + 8)
        dcount = pick(self.direct_counters_base, align(max(head, tail) + 8, 16))
        table = pick(self.table_base, align(dcount + 16 * self.direct_partitions, 64))
        table_size = ENTRY_SIZE * self.num_handles
        ring = pick(self.ring_base, align(table + table_size, 64))
        ring_n = 1 << self.ring_order
        dn = 1 << self.direct_ring_order
        pos = pick(self.direct_rings_base, align(ring + SLOT_SIZE * ring_n, 64))
        direct = []
        for p in range(self.direct_partitions):
            direct.append({"head": dcount + 16 * p, "tail": dcount + 16 * p + 8,
                           "ring": pos + p * align(SLOT_SIZE * dn, 64), "n": dn,
                           "first_block": self.shared_blocks + p * self.direct_quota})
        end = max([ring + SLOT_SIZE * ring_n] + [d["ring"] + SLOT_SIZE * dn for d in direct])
        pool = pick(self.pool_base, align(end, 4096))
        pool_size = self.block_size * self.num_blocks
        spans = [("shared head", head, 8), ("shared tail", tail, 8),
                 ("table", table, table_size), ("shared ring", ring, SLOT_SIZE * ring_n),
                 ("pool", pool, pool_size)]
        for p, d in enumerate(direct):
            spans += [(f"partition{p} head", d["head"], 8), (f"partition{p} tail", d["tail"], 8),
                      (f"partition{p} ring", d["ring"], SLOT_SIZE * dn)]
        for name, addr, _ in spans:
            if addr < 0 or ("head" in name or "tail" in name) and addr % 8:
                raise ValueError(f"{name} at {addr:#x}: negative or not 8-octet aligned")
        ordered = sorted(spans, key=lambda x: x[1])
        for (n1, a1, l1), (n2, a2, _) in zip(ordered, ordered[1:]):
            if a1 + l1 > a2:
                raise ValueError(f"{n1} ({a1:#x}+{l1}) overlaps {n2} ({a2:#x})")
        size = max(a + n for _, a, n in spans)
        return {"head": head, "tail": tail, "table": table, "table_size": table_size,
                "ring": ring, "ring_n": ring_n, "direct": direct, "pool": pool,
                "pool_size": pool_size, "size": size, "spans": ordered,
                "counter_order": "little", "slot_size": SLOT_SIZE, "entry_size": ENTRY_SIZE}

    def block_offset(self, index: int) -> int:
        """Block Offset (Tagged Offset in the Pool STag) of block ``index``."""
        return self.pool_to_base + index * self.block_size

    def domain_of(self, initiator_id: int) -> int:
        return self.trust_domains.get(initiator_id, self.default_trust_domain)

# Ref: Lattice FPGA-DS-02012 (ECP5 family: EBR = sysMEM DP16KD, 18 Kbit, 1024x18 / 512x36);
#      draft KBTP §Target Memory Structures (table entry, ring slot, completion record sizes
#      via hw/headers.py).
"""Memory sizes of the target core chosen from the device's block RAM (EBR) count."""

from dataclasses import asdict, dataclass

from hw.headers import CompletionRecord, RingSlot, TableEntry, size_of

__all__ = ["EBR_BYTES", "BoardMemoryConfig", "ebr_blocks"]

#: Data octets per DP16KD used 32 bits wide (512 x 36 without the parity bits, or 1024 x 16).
EBR_BYTES = 2048


def ebr_blocks(depth, width_bits):
    """DP16KD blocks for a ``depth`` x ``width_bits`` memory (yosys' mapping, roughly).

    Each block is 1024 x 18 or 512 x 36 at most (16 Kbit of data or 18 with parity bits); a
    wide memory takes ceil(width / 36) columns of ceil(depth / 512) blocks, a narrow one
    ceil(width / 18) columns of ceil(depth / 1024).
    """
    if width_bits <= 18:
        return -(-width_bits // 18) * -(-depth // 1024)
    return -(-width_bits // 36) * -(-depth // 512)


@dataclass(frozen=True)
class BoardMemoryConfig:
    """Sizes of the core's on-chip memories for one board.

    Attributes
    ----------
    ebr_total : int             DP16KD blocks in the device
    pool_bytes : int            block pool (KV-cache blocks), a power of two
    block_size : int            octets per pool block
    table_entries : int         block table entries (TableEntry each)
    ring_slots : int            request ring slots (RingSlot each)
    completion_slots : int      completion records (CompletionRecord each)
    mac_fifo_bytes : int        the MAC's transmit frame buffer (and both buffers of the
                                stand-in cores): 8192 holds one path-MTU-4096 frame (4096 + 82
                                octets) and the next
    mac_rx_bytes : int          the KBTP core's MAC receive buffer: the responses of the RDMA
                                READs the engine keeps out (its READ window,
                                hw/kbtp/engine.py read_window_for: 26,760 octets of data at
                                32768)
                                and one largest frame of other traffic
    hostlink_words : int        host-link frame buffer (words of 32 bits)
    demo_mem_words : int        RAM of the stand-in cores' bus target
    """

    ebr_total: int
    pool_bytes: int
    block_size: int
    table_entries: int
    ring_slots: int
    completion_slots: int
    mac_fifo_bytes: int = 8192
    mac_rx_bytes: int = 32768
    hostlink_words: int = 64
    demo_mem_words: int = 1024

    @property
    def pool_blocks(self):
        return self.pool_bytes // self.block_size

    def ebr_by_use(self):
        """Estimated DP16KD blocks of each memory, as a dict."""
        return {
            "pool": ebr_blocks(self.pool_bytes // 4, 32),
            "table": ebr_blocks(self.table_entries, 8 * size_of(TableEntry)),
            "ring": ebr_blocks(self.ring_slots, 8 * size_of(RingSlot)),
            "completions": ebr_blocks(self.completion_slots, 8 * size_of(CompletionRecord)),
            "mac_fifos": ebr_blocks(self.mac_rx_bytes, 8) + ebr_blocks(self.mac_fifo_bytes, 8),
            "hostlink": ebr_blocks(self.hostlink_words, 32),
        }

    def ebr_used(self):
        return sum(self.ebr_by_use().values())

    def as_dict(self):
        return {**asdict(self), "pool_blocks": self.pool_blocks, "ebr_by_use": self.ebr_by_use(),
                "ebr_used": self.ebr_used()}

    @classmethod
    def for_ebr(cls, ebr_total, *, spare_fraction=0.2, block_size=4096, max_pool_bytes=None):
        """Largest power-of-two pool that leaves ``spare_fraction`` of the EBR for the rest.

        The spare covers what the full core will add (packet FIFOs of the RoCE path,
        retransmit state) and keeps placement easy. 20 %: with the 8192-octet MAC buffers,
        25 % halved the ECPIX-5 pool to 128 KiB, and that full width-64 core then used 85
        DP16KD where :meth:`ebr_used` estimated 99, so the 256 KiB pool (estimate 163 of 208)
        still leaves room.

        ``max_pool_bytes`` caps the pool below what the EBR would hold (a board whose routing,
        not its EBR count, limits the pool: see boards/ecpix5.py).
        """
        if ebr_total < 16:
            raise ValueError(f"{ebr_total} EBR is too few for the core")
        # Tables scale with the device: 1024 entries / 256 ring slots from 200 EBR up.
        big = ebr_total >= 200
        fixed = cls(ebr_total=ebr_total, pool_bytes=block_size, block_size=block_size,
                    table_entries=1024 if big else 512, ring_slots=256 if big else 128,
                    completion_slots=256 if big else 128)
        budget = int(ebr_total * (1 - spare_fraction)) - (fixed.ebr_used()
                                                          - fixed.ebr_by_use()["pool"])
        pool = block_size
        while ebr_blocks((2 * pool) // 4, 32) <= budget and (max_pool_bytes is None
                                                             or 2 * pool <= max_pool_bytes):
            pool *= 2
        cfg = cls(**{**asdict(fixed), "pool_bytes": pool})
        assert cfg.ebr_used() <= ebr_total
        return cfg

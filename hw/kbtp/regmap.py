# Ref: draft KBTP §Block Table, §Free-Block Ring, §Allocation Quotas, §Completion (what the
#      registers configure); docs/registers.md (rendered from this table); issue 19 item 3.
"""The KBTP engine's register map, written once.

:data:`REGS` is the only place the map is written. Everything else is derived from it:

* the engine's host-bus decode (hw/kbtp/engine_regs.py loops over the table; its configuration
  port :data:`CONFIG` is made of the table's plain RW registers);
* :data:`reg`, the offsets that host/driver.py, the simulators and the tests use;
* docs/registers.md (``tools/registers/gen.py`` renders :func:`markdown`; a test fails when the
  file is out of date).

Registers are 32 bits wide on the bus (``Space.REG``, byte offsets from the window base,
REG_KBTP). A register of ``width`` 64 takes two words, low then high, named ``<NAME>_LO`` and
``<NAME>_HI`` in :data:`reg`. An array (``count``) repeats a register every ``stride`` octets;
a record array (``fields``) repeats a group of registers, whose offsets are relative to the
record, and :data:`reg` names them ``<ARRAY>_<FIELD>`` beside ``<ARRAY>`` (the base) and
``<ARRAY>_STRIDE``.
"""

from typing import NamedTuple

from amaranth.lib import data

__all__ = ["Reg", "REGS", "reg", "CONFIG", "ENGINE_ID", "WINDOW", "FREE_DEPTH",
           "SCRATCH_SLOTS", "SLOT_SIZE", "ENGINE_PARTS", "RING_BITS", "layout", "check",
           "markdown"]

ENGINE_ID = 0x4B425445      # "KBTE"
WINDOW = 0x1000             # octets of the register window
FREE_DEPTH = 32             # Block Offsets the free queue holds (EngineRegs' default free_depth)
#: COMPLETION / record buffers per QP in its SCRATCH area, each SLOT_SIZE octets: a slot is
#: taken when the completion's WorkRequest is issued and freed by its WorkCompletion, so this
#: many completions of one QP can be on the wire at once (hw/kbtp/engine.py _in_flight).
SCRATCH_SLOTS = 8
#: DIRECT_ALLOC partitions whose rings the engine serves (rings 1..3; ring 0 is the shared
#: ring), and the bits that name a ring: QP_SESSION bits 5..4, and bits 63..62 of a free's
#: argument (CMD_ARG, FREE_PUSH), so Block Offsets of the fast path are below 2**62.
ENGINE_PARTS = 3
RING_BITS = 2
SLOT_SIZE = 64


class Reg(NamedTuple):
    """One register (or array of registers, or record array) of the map."""
    name: str
    offset: int             # from the window base (a field: from its record)
    access: str             # "R", "RW" or "W" (a command register; its reads say its state)
    meaning: str            # one line, for docs/registers.md
    width: int = 32         # implemented bits (reads give zeros above); 64: two words
    reset: object = 0       # value after reset; None: not cleared by reset (LUT RAM)
    count: object = 1       # array entries: a number, or the engine parameter that sets it
    stride: int = 4         # octets between array entries
    fields: tuple = ()      # a record array's registers

    @property
    def n_words(self):
        return (self.width + 31) // 32


REGS = (
    Reg("ID", 0x000, "R", 'engine identifier 0x4B425445 ("KBTE")', reset=ENGINE_ID),
    Reg("CTRL", 0x004, "RW", "bit 0: fast path on (0: every message goes to hostq); bit 1: "
        "masked counters (1: the draft's Add Data / Add Mask; 0: InfiniBand unmasked FetchAdd, "
        "slot = 16 * (ticket mod N)); bit 2: ADDR_LE structures (the Block Offset of table "
        "entries and ring slots little-endian)", width=3, reset=0b010),
    Reg("TABLE_BASE", 0x008, "RW", "address of the table entry of TABLE_BASE_HANDLE"),
    Reg("TABLE_BASE_HANDLE", 0x00C, "RW", "handle of the first table entry", width=64),
    Reg("TABLE_COUNT", 0x014, "RW", "number of table entries"),
    Reg("POOL_BASE", 0x018, "RW", "address of the block whose Block Offset is POOL_TO_BASE"),
    Reg("POOL_TO_BASE", 0x01C, "RW", "Block Offset of the block at POOL_BASE", width=64),
    Reg("BLOCK_SIZE", 0x024, "RW", "Block Size, octets (a multiple of 8)"),
    Reg("RING_BASE", 0x028, "RW", "address of shared ring slot 0"),
    Reg("RING_ORDER", 0x02C, "RW", "ring order n: the shared ring has N = 2**n slots", width=5),
    Reg("HEAD_ADDR", 0x030, "RW", "address of the Head counter (little-endian)"),
    Reg("TAIL_ADDR", 0x034, "RW", "address of the Tail counter (little-endian)"),
    Reg("MAX_INLINE", 0x038, "RW", "Max Inline: largest inline STORE / ALLOC_STORE payload"),
    Reg("RANGE_LOG2", 0x03C, "RW", "log2 of the handles per initiator range (LOAD "
        "authorization)", width=6),
    # DIRECT_ALLOC partitions (issue 20 item 3): partition p is ring p + 1.
    *(Reg(f"PART{p}_{name}", 0x040 + 12 * p + 4 * k, "RW", f"partition {p} (ring {p + 1}): "
          + what)
      for p in range(ENGINE_PARTS)
      for k, (name, what) in enumerate((
          ("RING", "address of its ring's slot 0"),
          ("HEAD", "address of its Head counter (little-endian; the initiator FetchAdds it "
                   "too: the engine's read and write of it are one locked access)"),
          ("TAIL", "address of its Tail counter (little-endian)")))),
    Reg("PART_ORDER", 0x040 + 12 * ENGINE_PARTS, "RW", "ring order of every partition ring "
        "(N = 2**n slots each)", width=5),
    Reg("CMD", 0x080, "W", "write 1: TAIL_FETCHADD (result in CMD_RESULT), 2: FREE_BLOCK (Block "
        "Offset in CMD_ARG), on the ring CMD_ARG names, ignored while busy; read: bit 0 busy (command pending, free "
        "deferred or frees queued in FREE_PUSH), bit 1 free deferred", width=2),
    Reg("CMD_ARG", 0x084, "RW", "command argument: bits 63..62 the ring (0 shared, p + 1 "
        "partition p), bits 61..0 the Block Offset of FREE_BLOCK", width=64),
    Reg("CMD_RESULT", 0x08C, "R", "counter value before the last Tail FetchAdd", width=64),
    Reg("FREE_PUSH", 0x094, "W", "free queue: write a Block Offset (bits 61..0) and its ring "
        "(bits 63..62, as in CMD_ARG), low word then high word; "
        "the high word's write queues it (refused with err and counted in FREE_REFUSED while "
        "the queue is full); queued frees run in order as FREE_BLOCK commands; reads 0",
        width=64),
    Reg("FREE_QUEUE", 0x09C, "R", "free queue: bits 15..0 frees waiting (the next one counts "
        "until its Tail FetchAdd), bits 31..16 space left (reset: the depth, "
        f"{FREE_DEPTH} by default)", reset=FREE_DEPTH << 16),
    Reg("STALL_CYCLES", 0x0A0, "R", "cycles spent re-reading ring slots (total)"),
    Reg("LAST_LATENCY", 0x0A4, "R", "cycles from RecvNotify accepted to the first WorkRequest "
        "out"),
    Reg("LAST_CYCLES", 0x0A8, "R", "cycles from RecvNotify accepted to RecvRepost of the last "
        "request"),
    Reg("RING_OCCUPANCY", 0x0AC, "R", "Tail ticket - Head ticket at the last ALLOC_STORE check"),
    Reg("HOSTQ_COUNT", 0x0B0, "R", "messages pushed to the slow path (hostq)"),
    Reg("FREE_REFUSED", 0x0B4, "R", "FREE_PUSH high-word writes refused (queue full)"),
    Reg("COUNT", 0x100, "R", "requests finished, k = 16 * op + status (op 0 LOAD, 1 STORE, "
        "2 ALLOC_STORE)", count=3 * 16),
    # (stride 0x20, the record's 7 words rounded up: 2**QP_INDEX_BITS = 64 sessions end at
    # 0xA00, inside the window; 0x40 ran past its end at 57)
    Reg("QP", 0x200, "RW", "session of QP q", count="n_qp", stride=0x20, fields=(
        Reg("SESSION", 0x00, "RW", "bit 0 valid, bit 1 RECORD_COMPLETION granted, bit 2 "
            "ADDR_LE granted (Block Handle and descriptors little-endian), bit 3 host "
            "allocates (the session owns a DIRECT_ALLOC partition the engine does not serve: its "
            "ALLOC_STOREs go to the host, its LOADs and STOREs run here), bits 5..4 the ring "
            "its ALLOC_STOREs take blocks from (0 shared, with the QUOTA check; p + 1 "
            "partition p, whose ring is the quota), bits 15..8 trust domain", width=16),
        Reg("HANDLE_BASE", 0x04, "RW", "first handle the session owns", width=64,
            reset=None),
        Reg("HANDLE_COUNT", 0x0C, "RW", "handles the session owns", reset=None),
        Reg("QUOTA", 0x10, "RW", "allocation quota", reset=None),
        Reg("USAGE", 0x14, "RW", "bound + pending blocks (the engine adds its allocations; the "
            "host lowers it on FREE, raises it on BIND)"),
        Reg("SCRATCH", 0x18, "RW", f"address of {SCRATCH_SLOTS} buffers of {SLOT_SIZE} octets "
            f"({SCRATCH_SLOTS * SLOT_SIZE} octets, 8-aligned) for COMPLETIONs / records: one per "
            "completion on the wire", reset=None),
    )),
    # (after the 64 session records, which end at 0xA00: the window holds 384 RANGEs here;
    # at 0x040, below CMD, only 16 fitted, and a target with more sessions than ranges kept
    # every request on the host)
    Reg("RANGE", 0xA00, "RW", "range i: bit 8 owned, bits 7..0 trust domain of the owner",
        width=9, count="n_ranges"),
)


def _names(regs, prefix=""):
    out = {}
    for r in regs:
        name = prefix + r.name
        if r.fields:
            out[name] = r.offset
            out[name + "_STRIDE"] = r.stride
            out.update(_names(r.fields, name + "_"))
        elif r.n_words == 2:
            out[name + "_LO"], out[name + "_HI"] = r.offset, r.offset + 4
        else:
            out[name] = r.offset
    return out


#: Register offsets (relative to the window base), for drivers and tests.
reg = _names(REGS)

#: The configuration registers (the plain RW registers of the table) as the register bank
#: exports them, one field per register, named in lower case.
CONFIG = data.StructLayout({r.name.lower(): r.width for r in REGS
                            if r.access == "RW" and r.count == 1 and not r.fields})


def layout(**params):
    """``(name, register, words)`` for every register of the map: its name as in :data:`reg`
    and the byte offsets of its 32-bit words, one list per array entry (low word first), with
    the array sizes the table names given by ``params`` (``n_qp``, ``n_ranges``)."""
    def entries(r):
        return range(params[r.count] if isinstance(r.count, str) else r.count)

    for r in REGS:
        for f in r.fields or (r,):
            base = r.offset + (f.offset if r.fields else 0)
            yield ((r.name + "_" + f.name if r.fields else r.name), f,
                   [[base + r.stride * i + 4 * k for k in range(f.n_words)] for i in entries(r)])


def check(**params):
    """Raise ValueError if two registers share a word or one leaves the window, with the array
    sizes ``params``."""
    seen = {}
    for name, _, entries in layout(**params):
        for off in (o for words in entries for o in words):
            if off in seen or off >= WINDOW:
                raise ValueError(f"register {name} at 0x{off:03X} collides with "
                                 f"{seen.get(off, 'the window end')} ({params})")
            seen[off] = name


# ------------------------------------------------------------------------------ documentation

def _row(offset, name, r, meaning):
    reset = "not reset" if r.reset is None else f"0x{r.reset:X}"
    return f"| {offset} | {name} | {r.access} | {r.width} | {reset} | {meaning} |"


def _offset(r, base=""):
    """``0x00C`` or, for a 64-bit register, ``0x00C / 0x010`` (after ``base``)."""
    words = [f"0x{r.offset + 4 * k:03X}" for k in range(r.n_words)]
    return base + " / ".join(words)


def _name(r, prefix=""):
    return prefix + r.name + ("_LO / _HI" if r.n_words == 2 else "")


def markdown():
    """The register map as a Markdown table, names as in :data:`reg` (docs/registers.md)."""
    lines = ["| offset | name | access | bits | reset | meaning |",
             "|---|---|---|---|---|---|"]
    for r in REGS:
        if r.fields:
            base = f"0x{r.offset:03X} + 0x{r.stride:X}*q + "
            lines += [_row(_offset(f, base), _name(f, r.name + "_"), f,
                           f"{f.meaning} (q < {r.count})") for f in r.fields]
        elif r.count != 1:
            i = "k" if r.name == "COUNT" else "i"
            lines.append(_row(f"0x{r.offset:03X} + {r.stride}*{i}", f"{r.name}[{i}]", r,
                              f"{r.meaning} ({i} < {r.count})"))
        else:
            lines.append(_row(_offset(r), _name(r), r, r.meaning))
    return "\n".join(lines) + "\n"

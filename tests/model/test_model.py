# Ref: draft KBTP §Target Memory Structures, §Allocation Quotas, §Session Establishment,
#      §Operations, §Completion, §Direct Modes, §Status Codes, §Examples; layouts.md
"""Tests of the golden model (model.target) against independent oracles.

Requests are built and completions, HELLO_ACKs, entries, slots and records are parsed or
predicted with :mod:`struct` straight from the byte offsets of layouts.md and the draft's byte
examples, so these tests share no code (and no bug) with host.codec, hw.headers or model.ring.
"""

import random
import struct

import pytest

from model.target import (AccessError, Disconnect, InvalidateStag, MemWrite, RdmaRead, RdmaWrite,
                       SendMsg, TargetConfig, TargetModel, WriteImm)
import struct

OP = {"HELLO": 0x01, "HELLO_ACK": 0x02, "LOAD": 0x10, "STORE": 0x11, "ALLOC_STORE": 0x12,
      "FREE": 0x13, "BIND": 0x14, "COMPLETION": 0x20, "GOODBYE": 0x30}
ST = {"OK": 0, "INVALID_HANDLE": 1, "STALE_GENERATION": 2, "NOT_VALID": 3, "ALREADY_BOUND": 4,
      "NO_SPACE": 5, "SEALED": 6, "NOT_SEALED": 7, "TOO_LARGE": 8, "MALFORMED": 9,
      "INTERNAL": 10, "TICKET_ABANDONED": 11}
INLINE, SEAL, RECORD, INVALIDATE, ALLOW_UNSEALED = 1, 2, 4, 8, 0x10
DIRECT_LOAD, DIRECT_ALLOC, RECORD_COMPLETION, ADDR_LE = 1, 2, 4, 8


def header(op, flags=0, rid=0, handle=0, gen=0, le=False):
    h = struct.pack("<Q" if le else ">Q", handle)
    return struct.pack(">BBHQ", 1, OP[op], flags, rid) + h + struct.pack(">HH", gen, 0)


def data_desc(stag, to, length, le=False):
    return struct.pack("<IQI" if le else ">IQI", stag, to, length)


def compl_desc(stag, to, le=False):
    return struct.pack("<IQ" if le else ">IQ", stag, to) + b"\0" * 4


def hello(features, iid, credits=8):
    return header("HELLO") + struct.pack(">HH", features, credits) + iid.to_bytes(16, "big")


def load(rid, handle, stag, to, length, flags=0, gen=0, le=False, record=None):
    raw = header("LOAD", flags, rid, handle, gen, le) + data_desc(stag, to, length, le)
    if record is not None:
        raw += compl_desc(*record, le=le)
    return raw


def store(op, rid, handle, data=None, flags=0, gen=0, le=False, src=None, record=None):
    """STORE/ALLOC_STORE: ``data`` inline (INLINE is added) or ``src=(stag, to, length)``."""
    if data is not None:
        flags |= INLINE
        raw = header(op, flags, rid, handle, gen, le) + data_desc(0, 0, len(data), le)
    else:
        raw = header(op, flags, rid, handle, gen, le) + data_desc(*src, le=le)
    if record is not None:
        raw += compl_desc(*record, le=le)
    return raw + (data or b"")


def free(rid, handle, gen=0, le=False, flags=0, record=None):
    raw = header("FREE", flags, rid, handle, gen, le)
    if record is not None:
        raw += compl_desc(*record, le=le)
    return raw


def bind(rid, handle, ticket, length, boff, gen=0, le=False):
    return header("BIND", 0, rid, handle, gen, le) + struct.pack(">IIQ", ticket, length, boff)


def goodbye(release=False):
    return header("GOODBYE", 1 if release else 0)


def parse_completion(raw, le=False):
    assert len(raw) == 40, len(raw)
    v, op, flags, rid = struct.unpack(">BBHQ", raw[:12])
    (handle,) = struct.unpack(">Q", raw[12:20])     # handle of a COMPLETION: big-endian
    gen, status, dlen, resv, boff = struct.unpack(">HHIIQ", raw[20:40])
    assert (v, op, flags, resv) == (1, OP["COMPLETION"], 0, 0)
    return {"rid": rid, "handle": handle, "gen": gen, "status": status, "dlen": dlen,
            "boff": boff}


def parse_hello_ack(raw):
    v, op, flags, rid, handle, gen, status = struct.unpack(">BBHQQHH", raw[:24])
    assert (v, op) == (1, OP["HELLO_ACK"])
    out = dict(zip(("features", "credits", "block_size", "max_inline", "quota", "handle_base",
                    "handle_count", "timeout"), struct.unpack(">HHIIIQII", raw[24:56])))
    out["status"] = status
    pos = 56
    if out["features"] & DIRECT_LOAD and status == 0:
        t = struct.unpack(">IQIQQIQI", raw[pos:pos + 48])
        out["table"], out["table_base_handle"], out["pool"] = t[0:3], t[3], t[5:8]
        pos += 48
    if out["features"] & DIRECT_ALLOC and status == 0:
        t = struct.unpack(">IQIIQIIQI", raw[pos:pos + 48])
        out["partition"], out["ring"], out["head"] = t[0:3], t[3:6], t[6:9]
        pos += 48
    assert pos == len(raw) or status != 0
    return out


def entry(flags, gen, dlen, boff, le=False):
    return struct.pack(">HHI", flags, gen, dlen) + struct.pack("<Q" if le else ">Q", boff)


def slot(seq, boff, le=False):
    return struct.pack(">II", seq & 0xFFFFFFFF, 0) + struct.pack("<Q" if le else ">Q", boff)


def record(rid, status, gen, dlen, boff):
    return struct.pack(">QHHIQ", rid, status, gen, dlen, boff)


# --------------------------------------------------------------------------------------------
# Harness helpers
# --------------------------------------------------------------------------------------------

DRAFT_ALLOC_STORE = bytes.fromhex(
    "01120001 0000000000000007 0000000000004001 00000000"
    "00000000 0000000000000000 00000008 4b56424c4f434b21".replace(" ", ""))
DRAFT_COMPLETION = bytes.fromhex(
    "01200000 0000000000000007 0000000000004001 00050000"
    "00000008 00000000 0000000000150000".replace(" ", ""))
MASK32 = 0xFFFFFFFF


def up(m, conn, iid, features=0):
    """Connect and say HELLO; return the parsed HELLO_ACK."""
    m.connect(conn)
    acts = m.receive(conn, hello(features, iid))
    return parse_hello_ack(sends(acts)[0].payload)


def sends(acts):
    return [a for a in acts if isinstance(a, SendMsg)]


def comp(acts, le=False):
    """The one COMPLETION among the actions, parsed."""
    s = sends(acts)
    assert len(s) == 1, acts
    return parse_completion(s[0].payload, le)


def mws(acts):
    return [a for a in acts if isinstance(a, MemWrite)]


def mem_entry(m, handle):
    a = m.lay["table"] + 16 * (handle - m.cfg.table_base_handle)
    return bytes(m.mem[a:a + 16])


def mem_slot(m, base, s):
    return bytes(m.mem[base + 16 * s: base + 16 * s + 16])


def counter(m, addr):
    return int.from_bytes(m.mem[addr:addr + 8], "little")


def block(m, boff, n):
    a = m.lay["pool"] + boff - m.cfg.pool_to_base
    return bytes(m.mem[a:a + n])


def masked_add_oracle(value, n):
    """Field-by-field counter advance: ticket + 1 mod 2^32, slot offset + 16 mod 16N."""
    ticket, off = value >> 32, value & MASK32
    return (((ticket + 1) & MASK32) << 32) | ((off + 16) % (16 << n))


def draft_cfg(**kw):
    """The draft's example target: 32 KiB blocks, block 42 first on the ring, so that the
    example ALLOC_STORE gets Block Offset 0x150000; entries start at Generation 4 so that the
    bind produces the example's Generation 5."""
    order = list(range(42, 64)) + list(range(42))
    base = dict(block_size=32768, num_blocks=64, num_handles=256, table_base_handle=0x4000,
                handles_per_initiator=64, initial_free_order=order, initial_generation=4,
                quota_per_initiator=8)
    base.update(kw)
    return TargetConfig(**base)


# --------------------------------------------------------------------------------------------
# Layout
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw", [{}, dict(direct_partitions=3, direct_quota=5, num_blocks=40),
                                dict(block_size=32768, num_blocks=64, num_handles=1024)])
def test_layout_regions_disjoint_aligned_and_initialized(kw):
    cfg = TargetConfig(**kw)
    m = TargetModel(cfg)
    lay = cfg.layout()
    spans = [(lay["head"], 8), (lay["tail"], 8), (lay["table"], 16 * cfg.num_handles),
             (lay["ring"], 16 * lay["ring_n"]), (lay["pool"], cfg.block_size * cfg.num_blocks)]
    for d in lay["direct"]:
        spans += [(d["head"], 8), (d["tail"], 8), (d["ring"], 16 * d["n"])]
        assert d["head"] % 8 == 0 and d["tail"] % 8 == 0
    spans.sort()
    for (a, n), (b, _) in zip(spans, spans[1:]):
        assert a + n <= b                                   # no overlap
    assert spans[-1][0] + spans[-1][1] <= lay["size"] == len(m.mem)
    assert lay["ring_n"] >= cfg.shared_blocks and lay["ring_n"] & (lay["ring_n"] - 1) == 0
    # every entry: Flags 0, Generation 1; Head (0, 0); Tail (F, 16 F mod 16 N), little-endian
    for h in range(cfg.num_handles):
        assert mem_entry(m, 0x4000 + h) == entry(0, 1, 0, 0)
    F, n = cfg.shared_blocks, lay["ring_n"]
    assert counter(m, lay["head"]) == 0
    assert counter(m, lay["tail"]) == (F << 32) | (16 * (F % n))
    for s in range(n):
        want = slot(s, s * cfg.block_size) if s < F else slot(s - n, (1 << 64) - 1)
        assert mem_slot(m, lay["ring"], s) == want
    for p, d in enumerate(lay["direct"]):
        q = cfg.direct_quota
        assert counter(m, d["tail"]) == (q << 32) | (16 * (q % d["n"]))
        assert mem_slot(m, d["ring"], 0) == slot(0, (F + p * q) * cfg.block_size)


def test_layout_explicit_addresses_and_overlap_check():
    cfg = TargetConfig(num_blocks=4, block_size=256, num_handles=64, head_addr=0x2000,
                       tail_addr=0x3008, table_base=0x100, ring_base=0x1000, pool_base=0x8000)
    m = TargetModel(cfg)
    assert counter(m, 0x3008) == (4 << 32) | 0          # Tail (F=4, 16*(4 mod 4))
    assert mem_slot(m, 0x1000, 3) == slot(3, 3 * 256)
    assert mem_entry(m, 0x4000) == bytes(m.mem[0x100:0x110]) == entry(0, 1, 0, 0)
    up(m, 1, 0xA)
    acts = m.receive(1, store("ALLOC_STORE", 1, 0x4002, b"here"))
    assert [w.addr for w in mws(acts)] == [0x2000, 0x1008, 0x8000, 0x124, 0x120]
    assert bytes(m.mem[0x8000:0x8004]) == b"here"
    with pytest.raises(ValueError):
        TargetConfig(table_base=0x0).layout()                 # over the counters
    with pytest.raises(ValueError):
        TargetConfig(head_addr=4).layout()                    # FetchAdd needs 8-alignment


# --------------------------------------------------------------------------------------------
# Session establishment
# --------------------------------------------------------------------------------------------

def test_hello_ack_negotiation_ranges_and_quotas():
    cfg = TargetConfig(num_blocks=10, quota_per_initiator=4, num_handles=256,
                       handles_per_initiator=64, features_offered=DIRECT_LOAD | RECORD_COMPLETION)
    m = TargetModel(cfg)
    acks = [up(m, c, 0x1000 + c, features=0xFFFF) for c in range(4)]
    for a in acks:
        assert a["status"] == 0
        assert a["features"] == DIRECT_LOAD | RECORD_COMPLETION     # requested & offered
        assert (a["block_size"], a["max_inline"], a["timeout"]) == (4096, 1024, 100)
        assert a["table"] == (cfg.table_stag, 0, 256) and a["table_base_handle"] == 0x4000
        assert a["pool"] == (cfg.pool_stag, 0, 10)
    # non-overlapping handle ranges, 64 each, covering the table in order
    assert [(a["handle_base"], a["handle_count"]) for a in acks] == \
        [(0x4000 + 64 * i, 64) for i in range(4)]
    # sum of quotas never exceeds F = 10: 4 + 4 + 2 + 0
    assert [a["quota"] for a in acks] == [4, 4, 2, 0]
    # a fifth initiator finds no handle range: NO_SPACE, then the target disconnects
    m.connect(9)
    acts = m.receive(9, hello(0, 0x9999))
    assert parse_hello_ack(acts[0].payload)["status"] == ST["NO_SPACE"]
    assert acts[-1] == Disconnect(9, acts[-1].reason)
    # the RDMAP binding never offers RECORD_COMPLETION
    m2 = TargetModel(TargetConfig(binding="rdmap"))
    assert not up(m2, 1, 7, features=0xFFFF)["features"] & RECORD_COMPLETION


def test_active_initiator_id_rejected_and_second_hello():
    m = TargetModel(TargetConfig())
    assert up(m, 1, 0xABCD)["status"] == 0
    m.connect(2)
    acts = m.receive(2, hello(0, 0xABCD))
    assert parse_hello_ack(acts[0].payload)["status"] == ST["ALREADY_BOUND"]
    assert isinstance(acts[1], Disconnect) and acts[1].conn == 2
    assert m.receive(2, hello(0, 0xABCD)) == []           # closed connection: nothing
    # a second HELLO on a live session: MALFORMED, session kept
    acts = m.receive(1, hello(0, 0xABCD))
    assert parse_hello_ack(acts[0].payload)["status"] == ST["MALFORMED"]
    assert len(acts) == 1
    c = comp(m.receive(1, store("ALLOC_STORE", 5, 0x4000, b"x")))
    assert c["status"] == 0
    # a malformed HELLO (version 2)
    m.connect(3)
    raw = bytearray(hello(0, 0x77))
    raw[0] = 2
    acts = m.receive(3, bytes(raw))
    assert parse_hello_ack(acts[0].payload)["status"] == ST["MALFORMED"]
    assert isinstance(acts[-1], Disconnect)
    assert m.counters[("HELLO", "ALREADY_BOUND")] == 1
    assert m.counters[("HELLO", "MALFORMED")] == 2


def test_decode_errors_echo_what_arrived():
    m = TargetModel(TargetConfig(addr_le=True))
    up(m, 1, 0xA, features=ADDR_LE)
    raw = load(0x0102030405060708, 0x4003, 1, 0, 8, le=True)
    c = comp(m.receive(1, raw[:30]))                       # truncated descriptor
    assert (c["status"], c["rid"], c["handle"]) == (ST["MALFORMED"], 0x0102030405060708, 0x4003)
    c = comp(m.receive(1, raw[:16]))                       # the handle did not arrive
    assert (c["status"], c["rid"], c["handle"]) == (ST["MALFORMED"], 0x0102030405060708, 0)
    bad = bytearray(raw)
    bad[1] = 0x77                                          # unknown opcode
    assert comp(m.receive(1, bytes(bad)))["status"] == ST["MALFORMED"]
    assert m.counters[("LOAD", "MALFORMED")] == 2
    assert m.counters[("OPCODE_0x77", "MALFORMED")] == 1


def test_request_before_hello_is_malformed():
    m = TargetModel(TargetConfig())
    m.connect(1)
    c = comp(m.receive(1, load(0x55, 0x4003, 1, 0, 8)))
    assert (c["status"], c["rid"], c["handle"]) == (ST["MALFORMED"], 0x55, 0x4003)


# --------------------------------------------------------------------------------------------
# The draft's examples
# --------------------------------------------------------------------------------------------

def test_draft_alloc_store_example_bytes_memory_and_write_order():
    m = TargetModel(draft_cfg())
    up(m, 1, 0x1111)
    acts = m.receive(1, DRAFT_ALLOC_STORE)
    assert sends(acts)[0].payload == DRAFT_COMPLETION
    lay = m.lay
    head_new = masked_add_oracle(0, lay["ring_n"].bit_length() - 1)
    entry_addr = lay["table"] + 16 * 1
    expected = [
        MemWrite(lay["head"], head_new.to_bytes(8, "little")),          # FetchAdd on Head
        MemWrite(lay["ring"] + 8, b"\xff" * 8),                          # slot 0 consumed
        MemWrite(lay["pool"] + 0x150000, b"KVBLOCK!"),                   # data
        MemWrite(entry_addr + 4, struct.pack(">IQ", 8, 0x150000)),      # Data Length, Offset
        MemWrite(entry_addr, struct.pack(">HH", 1, 5)),                  # then Flags, Gen
    ]
    assert mws(acts) == expected
    assert acts.index(sends(acts)[0]) == len(acts) - 1                   # completion last
    assert mem_entry(m, 0x4001) == entry(1, 5, 8, 0x150000)
    assert block(m, 0x150000, 8) == b"KVBLOCK!"
    assert m.counters[("ALLOC_STORE", "OK")] == 1


def test_deferred_free_scenario_blocks_100_to_103():
    bs = 4096
    cfg = TargetConfig(block_size=bs, num_blocks=4, ring_order=2, pool_to_base=100 * bs,
                       quotas={0xA: 1, 0xB: 3}, quota_per_initiator=0)
    m = TargetModel(cfg)
    assert up(m, "X", 0xA)["quota"] == 1
    assert up(m, "Y", 0xB)["quota"] == 3
    ring, lay = m.lay["ring"], m.lay
    for s in range(4):                                   # initialization
        assert mem_slot(m, ring, s) == slot(s, (100 + s) * bs)
    m.hold("X")
    acts = m.receive("X", store("ALLOC_STORE", 1, 0x4000, b"X" * 10))
    assert acts == [MemWrite(lay["head"], masked_add_oracle(0, 2).to_bytes(8, "little"))]
    got = []
    for i in range(3):
        c = comp(m.receive("Y", store("ALLOC_STORE", 10 + i, 0x4040 + i, b"Y%d" % i)))
        got.append(c["boff"] // bs)
    assert got == [101, 102, 103]
    acts = m.receive("Y", free(20, 0x4040))                  # frees block 101
    assert comp(acts)["status"] == 0
    tail_new = masked_add_oracle((4 << 32) | 0, 2)          # Tail was (4, 0)
    assert [w for w in mws(acts) if w.addr == lay["tail"]] == \
        [MemWrite(lay["tail"], tail_new.to_bytes(8, "little"))]
    assert not [w for w in mws(acts) if ring <= w.addr < ring + 64]   # deferred: no slot write
    assert mem_slot(m, ring, 0) == slot(0, 100 * bs)             # slot 0 still X's
    acts = m.release("X")
    assert comp(acts)["boff"] == 100 * bs and comp(acts)["rid"] == 1
    slot_writes = [w for w in mws(acts) if ring <= w.addr < ring + 64]
    assert slot_writes == [MemWrite(ring + 8, b"\xff" * 8),                    # X consumes
                           MemWrite(ring + 8, struct.pack(">Q", 101 * bs)),     # deferred free:
                           MemWrite(ring, struct.pack(">I", 4))]               # offset, then seq
    assert mem_slot(m, ring, 0) == slot(4, 101 * bs)
    c = comp(m.receive("Y", store("ALLOC_STORE", 30, 0x4041 + 2, b"again")))
    assert c["boff"] == 101 * bs                                  # ticket 4 gets block 101
    bound = sorted(int.from_bytes(mem_entry(m, h)[8:], "big") // bs
                   for h in (0x4000, 0x4041, 0x4042, 0x4043))
    assert bound == [100, 101, 102, 103]                          # none lost, none twice


def test_allocation_waiting_for_a_deferred_free_blocks_only_its_connection():
    bs = 4096
    cfg = TargetConfig(block_size=bs, num_blocks=4, pool_to_base=100 * bs,
                       quotas={0xA: 1, 0xB: 3}, quota_per_initiator=0)
    m = TargetModel(cfg)
    up(m, "X", 0xA)
    up(m, "Y", 0xB)
    m.initiator_memory("Y").register(0x5, 64)
    m.hold("X")
    m.receive("X", store("ALLOC_STORE", 1, 0x4000, b"X"))              # ticket 0, held
    for i in range(3):
        comp(m.receive("Y", store("ALLOC_STORE", 10 + i, 0x4040 + i, b"Y")))
    comp(m.receive("Y", free(20, 0x4040)))                              # deferred on slot 0
    acts = m.receive("Y", store("ALLOC_STORE", 21, 0x4045, b"Y4"))      # ticket 4: waits
    assert sends(acts) == [] and [w.what for w in mws(acts)] == ["shared.head"]
    assert m.receive("Y", load(22, 0x4041, 0x5, 0, 64, flags=ALLOW_UNSEALED)) == []  # queued
    acts = m.release("X")
    done = [parse_completion(a.payload) for a in sends(acts)]
    assert [(a.conn, d["rid"]) for a, d in zip(sends(acts), done)] == \
        [("X", 1), ("Y", 21), ("Y", 22)]                              # in order, per connection
    assert [d["boff"] // bs for d in done[:2]] == [100, 101]
    assert done[2]["status"] == 0


# --------------------------------------------------------------------------------------------
# LOAD, STORE, FREE
# --------------------------------------------------------------------------------------------

def test_load_store_seal_and_rdma_transfers():
    m = TargetModel(TargetConfig(block_size=256))
    up(m, 1, 0x1)
    im = m.initiator_memory(1)
    src = bytes(range(200))
    im.register(0x51, src, base_to=0x1000, access="r")
    im.register(0x52, 256, base_to=0x9000, access="w")
    # ALLOC_STORE by RDMA Read (no INLINE), not sealed
    acts = m.receive(1, store("ALLOC_STORE", 1, 0x4005, src=(0x51, 0x1010, 100)))
    # draft order: allocate (Head FetchAdd, slot consumed), obtain the data, write it, entry
    assert acts[2] == RdmaRead(1, 0x51, 0x1010, 100, src[0x10:0x10 + 100])
    assert [type(a).__name__ for a in acts] == ["MemWrite"] * 2 + ["RdmaRead"] + \
        ["MemWrite"] * 3 + ["SendMsg"]
    c = comp(acts)
    assert (c["status"], c["dlen"], c["gen"], c["handle"]) == (0, 100, 2, 0x4005)
    boff = c["boff"]
    assert block(m, boff, 100) == src[0x10:0x10 + 100]
    assert mem_entry(m, 0x4005) == entry(1, 2, 100, boff)
    # LOAD of an unsealed block: NOT_SEALED, unless ALLOW_UNSEALED
    c = comp(m.receive(1, load(2, 0x4005, 0x52, 0x9000, 256)))
    assert (c["status"], c["gen"]) == (ST["NOT_SEALED"], 2)
    acts = m.receive(1, load(3, 0x4005, 0x52, 0x9000, 256, flags=ALLOW_UNSEALED))
    assert acts[0] == RdmaWrite(1, 0x52, 0x9000, src[0x10:0x10 + 100])
    assert comp(acts) == {"rid": 3, "handle": 0x4005, "gen": 2, "status": 0, "dlen": 100,
                          "boff": boff}
    assert im.contents(0x52)[:100] == src[0x10:0x10 + 100]
    # LOAD whose destination is smaller than Data Length: TOO_LARGE, nothing written
    acts = m.receive(1, load(4, 0x4005, 0x52, 0x9000, 99, flags=ALLOW_UNSEALED))
    assert comp(acts)["status"] == ST["TOO_LARGE"] and len(acts) == 1
    # STORE inline + SEAL: data, then Data Length, then Flags; Generation unchanged
    acts = m.receive(1, store("STORE", 5, 0x4005, b"sealed!", flags=SEAL))
    a = m.lay["table"] + 16 * 5
    assert mws(acts) == [MemWrite(m.lay["pool"] + boff - 0, b"sealed!"),
                         MemWrite(a + 4, struct.pack(">I", 7)),
                         MemWrite(a, struct.pack(">H", 3))]
    assert comp(acts)["status"] == 0
    assert mem_entry(m, 0x4005) == entry(3, 2, 7, boff)
    # STORE to a sealed block: SEALED; LOAD now works without ALLOW_UNSEALED
    assert comp(m.receive(1, store("STORE", 6, 0x4005, b"no")))["status"] == ST["SEALED"]
    acts = m.receive(1, load(7, 0x4005, 0x52, 0x9000, 7))
    assert acts[0].data == b"sealed!" and comp(acts)["dlen"] == 7


def test_free_entry_ring_and_generation_wrap():
    cfg = TargetConfig(num_blocks=4, initial_generation=0xFFFE)
    m = TargetModel(cfg)
    up(m, 1, 0x1)
    c = comp(m.receive(1, store("ALLOC_STORE", 1, 0x4000, b"abc", flags=SEAL)))
    assert c["gen"] == 0xFFFF
    boff = c["boff"]
    acts = m.receive(1, free(2, 0x4000))
    a, lay = m.lay["table"], m.lay
    # entry first (flags cleared, Generation 0xFFFF + 1 skips 0 -> 1), then the Tail FetchAdd,
    # then the slot: Block Offset, then Sequence (ticket 4 = F lands on slot 0)
    assert mws(acts) == [
        MemWrite(a, struct.pack(">HH", 0, 1)),
        MemWrite(lay["tail"], masked_add_oracle(4 << 32, 2).to_bytes(8, "little")),
        MemWrite(lay["ring"] + 8, struct.pack(">Q", boff)),
        MemWrite(lay["ring"], struct.pack(">I", 4)),
    ]
    assert comp(acts) == {"rid": 2, "handle": 0x4000, "gen": 1, "status": 0, "dlen": 0,
                          "boff": boff}
    assert mem_entry(m, 0x4000) == entry(0, 1, 3, boff)
    assert mem_slot(m, lay["ring"], 0) == slot(4, boff)
    assert comp(m.receive(1, free(3, 0x4000)))["status"] == ST["NOT_VALID"]
    assert m.occupancy()["shared"] == 4
    # rebinding: Generation 2
    assert comp(m.receive(1, store("ALLOC_STORE", 4, 0x4000, b"z")))["gen"] == 2


# --------------------------------------------------------------------------------------------
# Status codes and validation order
# --------------------------------------------------------------------------------------------

def test_every_status_code_is_reachable():
    cfg = TargetConfig(block_size=64, num_blocks=8, quota_per_initiator=2, max_inline=32,
                       direct_partitions=1, direct_quota=2, ticket_timeout_ms=10)
    m = TargetModel(cfg)
    up(m, 1, 0xA)                                   # range 0x4000.., quota 2
    up(m, 2, 0xB)                                   # range 0x4040.., quota 2
    m.initiator_memory(1).register(0x61, 64, access="rw")
    seen = {}

    def req(conn, raw, expect):
        c = comp(m.receive(conn, raw))
        assert c["status"] == ST[expect], (expect, c)
        seen[expect] = True
        return c

    req(1, store("ALLOC_STORE", 1, 0x4000, b"a"), "OK")
    req(1, store("ALLOC_STORE", 2, 0x4040, b"a"), "INVALID_HANDLE")   # B's range
    req(1, load(3, 0x4000 + 256, 0x61, 0, 8), "INVALID_HANDLE")       # outside the table
    req(1, free(4, 0x4000, gen=7), "STALE_GENERATION")
    req(1, free(5, 0x4001), "NOT_VALID")
    req(1, store("ALLOC_STORE", 6, 0x4000, b"b"), "ALREADY_BOUND")
    req(1, store("ALLOC_STORE", 7, 0x4001, b"b"), "OK")
    req(1, store("ALLOC_STORE", 8, 0x4002, b"c"), "NO_SPACE")          # quota 2 used
    req(1, store("STORE", 9, 0x4001, b"s", flags=SEAL), "OK")
    req(1, store("STORE", 10, 0x4001, b"t"), "SEALED")
    req(1, load(11, 0x4000, 0x61, 0, 64), "NOT_SEALED")
    req(1, store("STORE", 12, 0x4000, src=(0x61, 0, 65)), "TOO_LARGE")  # > Block Size
    req(1, store("STORE", 13, 0x4000, b"x" * 33), "TOO_LARGE")          # > Max Inline
    req(1, store("STORE", 14, 0x4000, src=(0x99, 0, 8)), "INTERNAL")    # unknown STag
    bad = bytearray(load(15, 0x4000, 0x61, 0, 8))
    bad[23] = 1                                                        # Status != 0
    c = req(1, bytes(bad), "MALFORMED")
    assert (c["rid"], c["handle"]) == (15, 0x4000)                     # echoed
    # TICKET_ABANDONED: a direct initiator takes a ticket and lets it time out
    ack = up(m, 3, 0xC, features=DIRECT_ALLOC)
    stag, to, _ = ack["head"]
    old = m.remote_fetch_add(3, stag, to, 0x0000000100000010, (1 << 63) | (1 << 31) | (1 << 4),
                             now_ms=0)
    m.tick(11)
    req(3, bind(16, ack["handle_base"], old >> 32, 4, 0), "TICKET_ABANDONED")
    assert set(seen) == set(ST)
    names = {k[1] for k in m.counters}
    assert set(ST) <= names


def test_ring_empty_no_space_with_overcommitted_quotas():
    m = TargetModel(TargetConfig(num_blocks=2, quota_per_initiator=2, overcommit_quotas=True))
    up(m, 1, 0xA)
    up(m, 2, 0xB)
    assert comp(m.receive(1, store("ALLOC_STORE", 1, 0x4000, b"a")))["status"] == 0
    assert comp(m.receive(2, store("ALLOC_STORE", 1, 0x4040, b"a")))["status"] == 0
    acts = m.receive(2, store("ALLOC_STORE", 2, 0x4041, b"a"))     # quota 2 ok, ring empty
    assert comp(acts)["status"] == ST["NO_SPACE"]
    assert mws(acts) == []                                           # no ticket taken
    assert m.occupancy()["shared"] == 0


@pytest.mark.parametrize("raw_args, expect", [
    # out of own range AND too long AND stale: the handle check comes first
    (("STORE", 0x4040, 5000, 9), "INVALID_HANDLE"),
    # own range, too long, stale generation: length before generation
    (("STORE", 0x4000, 5000, 9), "TOO_LARGE"),
    # own range, stale generation, not valid: generation before the entry state
    (("STORE", 0x4001, 10, 9), "STALE_GENERATION"),
    (("ALLOC_STORE", 0x4000, 10, 9), "STALE_GENERATION"),
    (("ALLOC_STORE", 0x4000, 10, 0), "ALREADY_BOUND"),
    (("ALLOC_STORE", 0x4000, 10, 2), "ALREADY_BOUND"),   # matching Generation is fine
])
def test_validation_order(raw_args, expect):
    m = TargetModel(TargetConfig())
    up(m, 1, 0xA)
    up(m, 2, 0xB)
    m.initiator_memory(1).register(0x61, 8192, access="r")
    assert comp(m.receive(1, store("ALLOC_STORE", 1, 0x4000, b"a")))["gen"] == 2
    op, h, length, gen = raw_args
    before = bytes(m.mem)
    acts = m.receive(1, store(op, 9, h, src=(0x61, 0, length), gen=gen))
    assert comp(acts)["status"] == ST[expect]
    assert mws(acts) == [] and bytes(m.mem) == before            # no other effect


def test_load_any_handle_same_domain_only():
    m = TargetModel(TargetConfig(trust_domains={0xA: 0, 0xB: 0, 0xC: 1}))
    up(m, 1, 0xA)
    up(m, 2, 0xB)
    up(m, 3, 0xC)
    m.initiator_memory(2).register(0x62, 64)
    m.initiator_memory(3).register(0x63, 64)
    assert comp(m.receive(1, store("ALLOC_STORE", 1, 0x4000, b"shared", flags=SEAL)))["status"] == 0
    acts = m.receive(2, load(1, 0x4000, 0x62, 0, 64))             # another initiator, same domain
    assert comp(acts)["status"] == 0 and acts[0].data == b"shared"
    assert comp(m.receive(3, load(1, 0x4000, 0x63, 0, 64)))["status"] == ST["INVALID_HANDLE"]


# --------------------------------------------------------------------------------------------
# Completion variants
# --------------------------------------------------------------------------------------------

def test_record_completion_write_with_immediate():
    m = TargetModel(TargetConfig())
    ack = up(m, 1, 0xA, features=RECORD_COMPLETION)
    assert ack["features"] == RECORD_COMPLETION
    im = m.initiator_memory(1)
    im.register(0x70, 48, base_to=0x700)
    rid = 0x1122334455667788
    acts = m.receive(1, store("ALLOC_STORE", rid, 0x4002, b"rec", flags=RECORD,
                              record=(0x70, 0x718)))
    assert sends(acts) == []
    w = acts[-1]
    boff = int.from_bytes(mem_entry(m, 0x4002)[8:], "big")
    assert w == WriteImm(1, 0x70, 0x718, record(rid, 0, 2, 3, boff), 0x55667788)
    assert im.contents(0x70)[0x18:0x30] == record(rid, 0, 2, 3, boff)
    # an error is recorded too
    acts = m.receive(1, free(9, 0x4003, flags=RECORD, record=(0x70, 0x700)))
    assert acts[-1].data == record(9, ST["NOT_VALID"], 1, 0, 0)
    # RECORD + INVALIDATE cannot be honoured by a Write with Immediate: MALFORMED Send
    im.register(0x71, 8)
    c = comp(m.receive(1, load(10, 0x4002, 0x71, 0, 8, flags=RECORD | INVALIDATE,
                              record=(0x70, 0x700))))
    assert c["status"] == ST["MALFORMED"]
    # the record slot faults: the Write with Immediate fails, a COMPLETION Send reports
    acts = m.receive(1, free(11, 0x4003, flags=RECORD, record=(0x7F, 0)))
    assert isinstance(acts[0], WriteImm) and acts[0].error
    assert comp(acts)["status"] == ST["NOT_VALID"]
    # without RECORD_COMPLETION the flag is ignored: a COMPLETION Send
    m2 = TargetModel(TargetConfig(binding="rdmap"))
    up(m2, 1, 0xA, features=RECORD_COMPLETION)
    m2.initiator_memory(1).register(0x70, 24)
    acts = m2.receive(1, free(9, 0x4003, flags=RECORD, record=(0x70, 0)))
    assert comp(acts)["status"] == ST["NOT_VALID"] and not any(
        isinstance(a, WriteImm) for a in acts)


def test_invalidate_and_initiator_memory_faults():
    m = TargetModel(TargetConfig())
    up(m, 1, 0xA)
    im = m.initiator_memory(1)
    im.register(0x80, b"payload!", access="r")
    im.register(0x81, 16, access="w")
    acts = m.receive(1, store("ALLOC_STORE", 1, 0x4000, flags=SEAL | INVALIDATE,
                              src=(0x80, 0, 8)))
    assert sends(acts)[0].invalidate_stag == 0x80
    assert not im.buffers[0x80].valid
    with pytest.raises(AccessError):
        im.read(0x80, 0, 8)
    # the invalidated source now faults: INTERNAL, the block goes back, nothing bound
    occ = m.occupancy()["shared"]
    acts = m.receive(1, store("ALLOC_STORE", 2, 0x4001, src=(0x80, 0, 8)))
    assert comp(acts)["status"] == ST["INTERNAL"]
    assert [a for a in acts if isinstance(a, RdmaRead)][0].error
    assert m.occupancy()["shared"] == occ and mem_entry(m, 0x4001)[:2] == b"\0\0"
    assert m.usage(0xA) == 1
    # write access missing on the LOAD destination; out of range too: the WRITE faults, and the
    # COMPLETION behind it is the OK it would be (Readings 10: the target does not wait for the
    # WRITE; on RC the fault flushes the COMPLETION)
    im.register(0x82, 16, access="r")
    for rid, stag, off in ((3, 0x82, 0), (4, 0x81, 9)):
        acts = m.receive(1, load(rid, 0x4000, stag, off, 16))
        assert [a for a in acts if isinstance(a, RdmaWrite)][0].error
        assert comp(acts)["status"] == 0 and comp(acts)["dlen"] == 8
    acts = m.receive(1, load(5, 0x4000, 0x81, 0, 16, flags=INVALIDATE))
    assert comp(acts)["status"] == 0 and sends(acts)[0].invalidate_stag == 0x81
    assert im.contents(0x81)[:8] == b"payload!"


# --------------------------------------------------------------------------------------------
# Direct modes
# --------------------------------------------------------------------------------------------

def direct_cfg(**kw):
    base = dict(block_size=256, num_blocks=12, direct_partitions=2, direct_quota=4,
                quota_per_initiator=2, ticket_timeout_ms=50)
    base.update(kw)
    return TargetConfig(**base)


def add_mask(n):
    return (1 << 63) | (1 << 31) | (1 << (n + 3))


def take_ticket(m, conn, ack, now=0, masked=True, le=False):
    """The initiator's FetchAdd on its Head, then its slot read (DIRECT_ALLOC)."""
    n = (ack["ring"][2]).bit_length() - 1
    hstag, hto, _ = ack["head"]
    if masked:
        old = m.remote_fetch_add(conn, hstag, hto, 0x0000000100000010, add_mask(n), now_ms=now)
        ticket, off = old >> 32, old & MASK32
    else:
        old = m.remote_fetch_add(conn, hstag, hto, 0x0000000100000000, 0, now_ms=now)
        ticket = old >> 32
        assert old & MASK32 == 0
        off = 16 * (ticket % (1 << n))
    rstag, rto, _ = ack["ring"]
    raw = m.remote_read(conn, rstag, rto + off, 16)
    seq, _ = struct.unpack(">II", raw[:8])
    (boff,) = struct.unpack("<Q" if le else ">Q", raw[8:])
    return ticket, off, seq, boff


@pytest.mark.parametrize("masked", [True, False])
def test_direct_alloc_bind_and_direct_load(masked):
    m = TargetModel(direct_cfg(masked=masked))
    ack = up(m, 1, 0xD, features=DIRECT_ALLOC | DIRECT_LOAD)
    assert ack["features"] == DIRECT_ALLOC | DIRECT_LOAD
    assert ack["quota"] == 4 and ack["partition"][2] == 4 and ack["ring"][2] == 4
    assert ack["head"][2] == 1 and ack["head"][1] % 8 == 0
    pstag, pto, _ = ack["partition"]
    assert pto == 4 * 256                                 # partition 0 = blocks 4..7
    hb = ack["handle_base"]
    ticket, off, seq, boff = take_ticket(m, 1, ack, masked=masked)
    assert (ticket, off, seq, boff) == (0, 0, 0, pto)
    m.remote_write(1, pstag, boff, b"direct data")
    with pytest.raises(AccessError):                      # outside the partition
        m.remote_write(1, pstag, pto + 4 * 256, b"x")
    acts = m.receive(1, bind(1, hb + 3, ticket, 11, boff))
    d = m.lay["direct"][0]
    ea = m.lay["table"] + 16 * (hb + 3 - 0x4000)
    assert mws(acts) == [MemWrite(d["ring"] + 8, b"\xff" * 8),            # slot consumed
                         MemWrite(ea + 4, struct.pack(">IQ", 11, boff)),
                         MemWrite(ea, struct.pack(">HH", 1, 2))]
    assert comp(acts) == {"rid": 1, "handle": hb + 3, "gen": 2, "status": 0, "dlen": 11,
                          "boff": boff}
    assert m.usage(0xD) == 1
    # the same ticket again, a ticket not taken, a wrong Block Offset: MALFORMED
    assert comp(m.receive(1, bind(2, hb + 4, ticket, 1, boff)))["status"] == ST["MALFORMED"]
    assert comp(m.receive(1, bind(3, hb + 4, 1, 1, boff + 256)))["status"] == ST["MALFORMED"]
    t1, _, _, b1 = take_ticket(m, 1, ack, masked=masked)
    assert comp(m.receive(1, bind(4, hb + 4, t1, 1, b1 + 256)))["status"] == ST["MALFORMED"]
    assert comp(m.receive(1, bind(5, hb + 4, t1, 257, b1)))["status"] == ST["TOO_LARGE"]
    assert comp(m.receive(1, bind(6, hb + 3, t1, 1, b1)))["status"] == ST["ALREADY_BOUND"]
    # DIRECT_LOAD: entry, block, entry again, through the read-only STags
    tstag, tto, _ = ack["table"]
    e1 = m.remote_read(1, tstag, tto + 16 * (hb + 3 - ack["table_base_handle"]), 16)
    assert e1 == entry(1, 2, 11, boff)
    assert m.remote_read(1, ack["pool"][0], boff, 11) == b"direct data"
    with pytest.raises(AccessError):                      # the pool is read-only
        m.remote_write(1, ack["pool"][0], boff, b"x")
    # a FREE returns the block to the partition ring, not the shared one
    shared = m.occupancy()["shared"]
    assert comp(m.receive(1, free(7, hb + 3)))["status"] == 0
    assert m.occupancy()["shared"] == shared
    assert m.occupancy()["partition0"] == 3               # 4 - t1 outstanding
    # target-executed ALLOC_STORE of a direct session uses its partition ring
    c = comp(m.receive(1, store("ALLOC_STORE", 8, hb + 9, b"t")))
    assert c["status"] == 0 and pto <= c["boff"] < pto + 4 * 256


def test_direct_modes_only_for_trusted_domains_and_matching_byte_order():
    m = TargetModel(direct_cfg(trust_domains={0xE: 5}))
    ack = up(m, 1, 0xE, features=DIRECT_ALLOC | DIRECT_LOAD)
    assert ack["features"] == 0 and ack["quota"] == 2
    # a trusted initiator on a target with two domains: its partition, but not the whole pool
    ack = up(m, 2, 0xF, features=DIRECT_ALLOC | DIRECT_LOAD)
    assert ack["features"] == DIRECT_ALLOC and ack["quota"] == 4
    m2 = TargetModel(direct_cfg(addr_le=True))
    assert up(m2, 1, 0xF, features=DIRECT_LOAD)["features"] == 0       # would misread LE
    assert up(m2, 2, 0x10, features=DIRECT_LOAD | ADDR_LE)["features"] == DIRECT_LOAD | ADDR_LE
    # partitions run out: the third direct initiator falls back to the shared ring
    m3 = TargetModel(direct_cfg())
    up(m3, 1, 1, features=DIRECT_ALLOC)
    up(m3, 2, 2, features=DIRECT_ALLOC)
    ack = up(m3, 3, 3, features=DIRECT_ALLOC)
    assert ack["features"] == 0 and ack["quota"] == 2
    with pytest.raises(AccessError):                      # no DIRECT_LOAD granted: no access
        m3.remote_read(3, m3.cfg.table_stag, 0, 16)


def test_ticket_timeout_invalidates_and_reclaims():
    m = TargetModel(direct_cfg())
    ack = up(m, 1, 0xD, features=DIRECT_ALLOC)
    hb = ack["handle_base"]
    t0, _, _, b0 = take_ticket(m, 1, ack, now=0)
    t1, _, _, b1 = take_ticket(m, 1, ack, now=30)
    assert m.usage(0xD) == 2 and m.occupancy()["partition0"] == 2
    assert m.tick(49) == []                                 # not yet
    acts = m.tick(50)
    stags = {ack["partition"][0], ack["ring"][0], ack["head"][0]}
    inv = [a for a in acts if isinstance(a, InvalidateStag)]
    assert {a.stag for a in inv} == stags and all(a.conn == 1 for a in inv)
    # invalidation comes before any slot is touched
    first_mw = next(i for i, a in enumerate(acts) if isinstance(a, MemWrite))
    assert first_mw > max(acts.index(a) for a in inv)
    assert m.counters[("RECLAIM", "OK")] == 2
    assert m.usage(0xD) == 0 and m.occupancy()["partition0"] == 4
    # both blocks went back with new Tail tickets 4 and 5 onto slots 0 and 1
    d = m.lay["direct"][0]
    assert mem_slot(m, d["ring"], 0) == slot(4, b0)
    assert mem_slot(m, d["ring"], 1) == slot(5, b1)
    c = comp(m.receive(1, bind(1, hb, t0, 4, b0)))
    assert c["status"] == ST["TICKET_ABANDONED"]
    with pytest.raises(AccessError):
        m.remote_fetch_add(1, ack["head"][0], 0, 1 << 32)
    with pytest.raises(AccessError):
        m.remote_write(1, ack["partition"][0], b0, b"late")
    # DIRECT_ALLOC is off for the session; a later BIND is MALFORMED; ALLOC_STORE still works
    assert comp(m.receive(1, bind(2, hb, 7, 4, b0)))["status"] == ST["MALFORMED"]
    assert comp(m.receive(1, store("ALLOC_STORE", 3, hb, b"ok")))["status"] == 0


def test_over_quota_ticket_gets_no_space_then_reclaim_waits_for_its_block():
    m = TargetModel(direct_cfg(direct_quota=2, num_blocks=8))
    ack = up(m, 1, 0xD, features=DIRECT_ALLOC)
    hb = ack["handle_base"]
    tickets = [take_ticket(m, 1, ack, now=0) for _ in range(3)]   # quota 2, ring N = 2
    t2, o2, seq2, _ = tickets[2]
    assert seq2 != t2                                     # no block for the third ticket
    assert comp(m.receive(1, bind(1, hb, t2, 1, tickets[0][3])))["status"] == ST["NO_SPACE"]
    for i in range(2):
        t, _, _, b = tickets[i]
        assert comp(m.receive(1, bind(2 + i, hb + i, t, 1, b)))["status"] == 0
    assert m.usage(0xD) == 3                              # 2 bound + 1 ticket over quota
    m.tick(100)                                           # ticket 2 abandoned, no block yet
    assert ("RECLAIM", "OK") not in m.counters
    # freeing handle hb writes slot 0 with Tail ticket 2, which ticket 2 was waiting for:
    # it is reclaimed in the same call, and its block goes back with Tail ticket 3
    acts = m.receive(1, free(4, hb))
    assert comp(acts)["status"] == 0
    assert m.counters[("RECLAIM", "OK")] == 1
    assert m.usage(0xD) == 1 and m.occupancy()["partition0"] == 1
    d = m.lay["direct"][0]
    assert mem_slot(m, d["ring"], 1) == slot(3, tickets[0][3])
    assert comp(m.receive(1, bind(5, hb, t2, 1, tickets[0][3])))["status"] == \
        ST["TICKET_ABANDONED"]


# --------------------------------------------------------------------------------------------
# GOODBYE, retention, reconnection
# --------------------------------------------------------------------------------------------

def test_goodbye_retention_and_reconnection():
    m = TargetModel(TargetConfig(retention_ms=1000))
    ack = up(m, 1, 0xA)
    m.initiator_memory(1).register(0x90, 16)
    c = comp(m.receive(1, store("ALLOC_STORE", 1, 0x4007, b"keep me", flags=SEAL)))
    before = mem_entry(m, 0x4007)
    acts = m.receive(1, goodbye(), now_ms=100)
    assert acts == [Disconnect(1, acts[0].reason)] and sends(acts) == []
    assert m.quota_use()[0xA] == (1, 4, "retained")
    # another initiator cannot take the retained range
    assert up(m, 2, 0xB)["handle_base"] == 0x4040
    # reconnect within retention: same range, binding intact
    ack2 = up(m, 3, 0xA, features=0)
    assert (ack2["handle_base"], ack2["quota"]) == (ack["handle_base"], ack["quota"])
    assert mem_entry(m, 0x4007) == before
    m.initiator_memory(3).register(0x90, 16)
    acts = m.receive(3, load(2, 0x4007, 0x90, 0, 16))
    assert comp(acts)["status"] == 0 and acts[0].data == b"keep me"
    # connection failure: retained again; expiry frees the binding
    m.disconnect(3, now_ms=2000)
    assert m.tick(2999) == []
    occ = m.occupancy()["shared"]
    acts = m.tick(3000)
    a = m.lay["table"] + 16 * 7
    assert mws(acts)[0] == MemWrite(a, struct.pack(">HH", 0, 3))
    assert m.occupancy()["shared"] == occ + 1
    assert m.counters[("RETENTION_EXPIRY", "OK")] == 1
    assert 0xA not in m.quota_use()
    ack3 = up(m, 4, 0xA)                                  # a fresh session, range 0 free again
    assert ack3["handle_base"] == 0x4000
    assert comp(m.receive(4, load(3, 0x4007, 0x90, 0, 16)))["status"] == ST["NOT_VALID"]


def test_goodbye_release_frees_everything():
    m = TargetModel(direct_cfg())
    ack = up(m, 1, 0xD, features=DIRECT_ALLOC)
    hb = ack["handle_base"]
    for i in range(2):
        assert comp(m.receive(1, store("ALLOC_STORE", i, hb + i, b"v")))["status"] == 0
    take_ticket(m, 1, ack)
    assert m.usage(0xD) == 3
    acts = m.receive(1, goodbye(release=True))
    assert isinstance(acts[-1], Disconnect)
    assert {a.stag for a in acts if isinstance(a, InvalidateStag)} == \
        {ack["partition"][0], ack["ring"][0], ack["head"][0]}
    assert m.occupancy()["partition0"] == 4
    assert 0xD not in m.quota_use()
    for i in range(2):
        assert mem_entry(m, hb + i)[:4] == struct.pack(">HH", 0, 3)
    # the partition is free for the next direct initiator
    assert up(m, 2, 0xE, features=DIRECT_ALLOC)["partition"][1] == 4 * 256


def test_retained_direct_session_reclaims_without_invalidation_and_keeps_partition():
    m = TargetModel(direct_cfg())
    ack = up(m, 1, 0xD, features=DIRECT_ALLOC)
    take_ticket(m, 1, ack, now=0)
    m.disconnect(1, now_ms=1)
    acts = m.tick(60)
    assert not any(isinstance(a, InvalidateStag) for a in acts)
    assert m.counters[("RECLAIM", "OK")] == 1
    ack2 = up(m, 2, 0xD, features=DIRECT_ALLOC)
    assert ack2["features"] == DIRECT_ALLOC
    assert ack2["partition"][1] == ack["partition"][1]
    assert ack2["partition"][0] != ack["partition"][0]     # a new, connection-specific STag
    t, _, seq, boff = take_ticket(m, 2, ack2, now=61)
    assert seq == t
    assert comp(m.receive(2, bind(1, ack2["handle_base"], t, 1, boff)))["status"] == 0


# --------------------------------------------------------------------------------------------
# Trust domains, ADDR_LE, unmasked counters
# --------------------------------------------------------------------------------------------

def test_trust_domain_clearing():
    bs = 128
    m = TargetModel(TargetConfig(block_size=bs, trust_domains={0xA: 1, 0xB: 2}))
    up(m, 1, 0xA)
    c = comp(m.receive(1, store("ALLOC_STORE", 1, 0x4000, b"secret" * 10)))
    acts = m.receive(1, free(2, 0x4000))
    zero = [w for w in mws(acts) if w.data == bytes(bs)]
    assert zero == [MemWrite(m.lay["pool"] + c["boff"], bytes(bs))]
    idx = mws(acts).index(zero[0])
    assert mws(acts)[0].addr == m.lay["table"]             # entry, then clear, then ring
    assert 0 < idx < [i for i, w in enumerate(mws(acts)) if w.addr == m.lay["tail"]][0]
    assert block(m, c["boff"], bs) == bytes(bs)
    # one trust domain: no clearing, the old contents stay
    m2 = TargetModel(TargetConfig(block_size=bs))
    up(m2, 1, 0xA)
    c = comp(m2.receive(1, store("ALLOC_STORE", 1, 0x4000, b"secret")))
    acts = m2.receive(1, free(2, 0x4000))
    assert not [w for w in mws(acts) if w.data == bytes(bs)]
    assert block(m2, c["boff"], 6) == b"secret"


def test_partition_cleared_when_handed_to_another_domain():
    m = TargetModel(direct_cfg(trust_domains={0xA: 0, 0xB: 0, 0xC: 3},
                               direct_domains=frozenset({0, 3})))
    ack = up(m, 1, 0xA, features=DIRECT_ALLOC)
    t, _, _, boff = take_ticket(m, 1, ack)
    m.remote_write(1, ack["partition"][0], boff, b"A's data")
    m.receive(1, bind(1, ack["handle_base"], t, 8, boff))
    m.receive(1, goodbye(release=True))
    assert block(m, boff, 8) == b"A's data"               # back on the partition: kept
    up(m, 2, 0xB, features=DIRECT_ALLOC)                  # same domain: nothing cleared
    assert block(m, boff, 8) == b"A's data"
    m.receive(2, goodbye(release=True))
    m.connect(3)
    acts = m.receive(3, hello(DIRECT_ALLOC, 0xC))         # another domain: cleared first
    pool = m.lay["pool"]
    assert mws(acts) == [MemWrite(pool + boff + i * 256, bytes(256)) for i in range(4)]
    assert isinstance(acts[-1], SendMsg)
    assert block(m, boff, 8) == bytes(8)


def test_addr_le_messages_and_memory():
    bs = 4096
    m = TargetModel(TargetConfig(addr_le=True, block_size=bs, pool_to_base=0x1234_0000))
    ack = up(m, 1, 0xA, features=ADDR_LE)
    assert ack["features"] == ADDR_LE
    # every slot's Block Offset is little-endian from initialization on
    assert mem_slot(m, m.lay["ring"], 1) == slot(1, 0x1234_0000 + bs, le=True)
    m.initiator_memory(1).register(0xA0B0C0D0, b"little endian!", base_to=0x1122334455)
    acts = m.receive(1, store("ALLOC_STORE", 3, 0x4009, le=True, flags=SEAL,
                              src=(0xA0B0C0D0, 0x1122334455, 14)))
    c = comp(acts)
    assert (c["status"], c["handle"], c["boff"]) == (0, 0x4009, 0x1234_0000)
    assert mem_entry(m, 0x4009) == entry(3, 2, 14, 0x1234_0000, le=True)
    assert mws(acts)[1] == MemWrite(m.lay["ring"] + 8, b"\xff" * 8)
    # a request encoded big-endian means another handle: 0x4009 read LE is out of the table
    c = comp(m.receive(1, free(4, 0x4009, le=False)))
    assert c["status"] == ST["INVALID_HANDLE"]
    acts = m.receive(1, free(5, 0x4009, le=True))
    assert comp(acts)["status"] == 0
    assert mem_slot(m, m.lay["ring"], 0) == slot(16, 0x1234_0000, le=True)


def test_unmasked_counters():
    m = TargetModel(TargetConfig(masked=False, num_blocks=4))
    up(m, 1, 0xA)
    lay = m.lay
    assert counter(m, lay["tail"]) == 4 << 32
    for i in range(3):
        comp(m.receive(1, store("ALLOC_STORE", i, 0x4000 + i, b"u")))
        assert counter(m, lay["head"]) == (i + 1) << 32
    acts = m.receive(1, free(9, 0x4001))
    assert counter(m, lay["tail"]) == 5 << 32
    b1 = int.from_bytes(mem_entry(m, 0x4001)[8:], "big")
    assert mem_slot(m, lay["ring"], 0) == slot(4, b1)       # 16 * (4 mod 4) = slot 0
    assert comp(acts)["status"] == 0


# --------------------------------------------------------------------------------------------
# Random runs: the model's own invariants against brute-force accounting
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(6))
def test_random_runs_keep_every_block_in_one_place(seed):
    rnd = random.Random(seed)
    bs = 64
    cfg = TargetConfig(block_size=bs, num_blocks=10, quota_per_initiator=3, num_handles=64,
                       handles_per_initiator=16, addr_le=bool(seed % 2), masked=seed % 3 != 0,
                       trust_domains={1: 0, 2: 1})
    m = TargetModel(cfg)
    le = cfg.addr_le
    feats = ADDR_LE if le else 0
    ranges = {c: up(m, c, c, features=feats)["handle_base"] for c in (1, 2, 3)}
    shadow = {}                                   # handle -> (data, sealed, gen)
    for step in range(300):
        c = rnd.choice((1, 2, 3))
        h = ranges[c] + rnd.randrange(5)
        op = rnd.choice(("ALLOC_STORE", "STORE", "FREE", "LOAD"))
        data = bytes(rnd.randrange(256) for _ in range(rnd.randrange(1, 20)))
        seal = rnd.randrange(2) == 1
        if op == "LOAD":
            m.initiator_memory(c).register(0x42, 64)
            acts = m.receive(c, load(step, h, 0x42, 0, 64, flags=ALLOW_UNSEALED, le=le))
        elif op == "FREE":
            acts = m.receive(c, free(step, h, le=le))
        else:
            acts = m.receive(c, store(op, step, h, data, le=le, flags=SEAL if seal else 0))
        r = comp(acts)
        used = sum(1 for k in shadow if ranges[c] <= k < ranges[c] + 16)
        if op == "ALLOC_STORE":
            expect = "ALREADY_BOUND" if h in shadow else ("NO_SPACE" if used >= 3 else "OK")
            if expect == "OK":
                shadow[h] = (data, seal)
        elif op == "STORE":
            expect = "NOT_VALID" if h not in shadow else ("SEALED" if shadow[h][1] else "OK")
            if expect == "OK":
                shadow[h] = (data, seal)
        elif op == "FREE":
            expect = "OK" if h in shadow else "NOT_VALID"
            shadow.pop(h, None)
        else:
            expect = "OK" if h in shadow else "NOT_VALID"
            if expect == "OK":
                assert acts[0].data == shadow[h][0]
        assert r["status"] == ST[expect], (step, op, r)
        # brute force: each block is bound to exactly one handle or free in the ring
        order = "<Q" if le else ">Q"
        bound = []
        for k in range(64):
            raw = mem_entry(m, 0x4000 + k)
            if struct.unpack(">H", raw[:2])[0] & 1:
                bound.append(struct.unpack(order, raw[8:])[0])
        assert len(set(bound)) == len(bound) == len(shadow)
        ring, n = m.lay["ring"], m.lay["ring_n"]
        head, tail = counter(m, m.lay["head"]) >> 32, counter(m, m.lay["tail"]) >> 32
        free_blocks = []
        for t in range(head, tail):
            raw = mem_slot(m, ring, t % n)
            assert struct.unpack(">I", raw[:4])[0] == t & MASK32
            free_blocks.append(struct.unpack(order, raw[8:])[0])
        assert sorted(free_blocks + bound) == [i * bs for i in range(10)]


@pytest.mark.parametrize("seed", range(4))
def test_random_direct_and_shared_runs_lose_no_block(seed):
    """Direct and shared initiators, tickets, BINDs, frees, timeouts and reconnections at random;
    after every step each block is in exactly one place: a non-empty ring slot, a deferred free,
    or a VALID table entry (brute force over the memory image)."""
    rnd = random.Random(100 + seed)
    bs = 32
    cfg = TargetConfig(block_size=bs, num_blocks=12, direct_partitions=2, direct_quota=3,
                       quota_per_initiator=3, num_handles=64, handles_per_initiator=16,
                       ticket_timeout_ms=40, retention_ms=200, masked=seed % 2 == 0,
                       addr_le=seed >= 2)
    m = TargetModel(cfg)
    le = cfg.addr_le
    order = "<Q" if le else ">Q"
    feats = ADDR_LE if le else 0
    iids = {"D1": 0xD1, "D2": 0xD2, "S": 0x5}
    acks, taken, conn_of = {}, {}, {}
    gen = 0
    now = 0

    def hi(name):
        nonlocal gen
        gen += 1
        conn = f"{name}#{gen}"
        conn_of[name] = conn
        f = feats | (DIRECT_ALLOC if name != "S" else 0)
        acks[name] = up(m, conn, iids[name], features=f)
        taken[name] = []

    for name in iids:
        hi(name)
    for step in range(250):
        now += rnd.choice((0, 1, 5, 20))
        name = rnd.choice(list(iids))
        conn, ack = conn_of[name], acks[name]
        hb = ack["handle_base"]
        h = hb + rnd.randrange(6)
        r = rnd.random()
        if conn is None:
            if r < 0.5:
                hi(name)
            continue
        if name != "S" and r < 0.25 and ack.get("head") and \
                m.usage(iids[name]) < ack["quota"]:      # a well-behaved initiator
            try:
                t, _, seq, boff = take_ticket(m, conn, ack, now=now, masked=cfg.masked, le=le)
                if seq == t & MASK32 and boff != (1 << 64) - 1:
                    taken[name].append((t, boff))
            except AccessError:
                pass                                     # DIRECT_ALLOC disabled
        elif name != "S" and r < 0.45 and taken[name]:
            t, boff = taken[name].pop(rnd.randrange(len(taken[name])))
            c = comp(m.receive(conn, bind(step, h, t, 4, boff, le=le), now_ms=now))
            assert c["status"] in (ST["OK"], ST["ALREADY_BOUND"], ST["TICKET_ABANDONED"]), \
                (step, name, t, boff, m.partitions[m.session_by_id(iids[name]).partition])
        elif r < 0.65:
            c = comp(m.receive(conn, store("ALLOC_STORE", step, h, b"data", le=le), now_ms=now))
            assert c["status"] in (ST["OK"], ST["ALREADY_BOUND"], ST["NO_SPACE"])
        elif r < 0.85:
            c = comp(m.receive(conn, free(step, h, le=le), now_ms=now))
            assert c["status"] in (ST["OK"], ST["NOT_VALID"])
        elif r < 0.92:
            m.tick(now)
        elif r < 0.96:
            m.disconnect(conn, now_ms=now)
            conn_of[name] = None
        else:
            m.receive(conn, goodbye(release=rnd.random() < 0.5), now_ms=now)
            conn_of[name] = None
        # brute force over the image
        places = []
        for k in range(64):
            raw = mem_entry(m, 0x4000 + k)
            if struct.unpack(">H", raw[:2])[0] & 1:
                places.append(struct.unpack(order, raw[8:])[0])
        rings = [(m.lay["ring"], m.lay["ring_n"], m.shared_ring)] + \
            [(d["ring"], d["n"], m.partitions[p].ring) for p, d in enumerate(m.lay["direct"])]
        for base, n, ring in rings:
            for s in range(n):
                b = struct.unpack(order, mem_slot(m, base, s)[8:])[0]
                if b != (1 << 64) - 1:
                    places.append(b)
            places += [b for q in ring.pending_frees.values() for _, b in q]
        assert sorted(places) == [i * bs for i in range(12)], step
        for iid, (used, quota, _) in m.quota_use().items():
            assert used <= quota
    print(sorted(m.counters.items()))
    assert sum(m.counters.values()) > 200

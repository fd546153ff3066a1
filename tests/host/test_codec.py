# Ref: draft KBTP §Messages, §Session Establishment (ADDR_LE), §Target Memory Structures,
#      §Completion, §Examples; docs/layouts.md ("The draft's worked examples")
"""Tests of host.codec.

Oracles that cannot share a bug with hw/headers.py or host/codec.py: the draft's two example byte
strings, and ``struct.pack`` byte strings built here from the draft's field lists.
"""

import json
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from host import codec
from host.codec import (
    AllocStore, Bind, ComplDesc, Completion, DataDesc, DirectDesc, Free, Goodbye, Hello,
    HelloAck, KbtpError, Load, Store, decode, encode,
)
from hw.headers import Status

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])

# The draft's §Examples, copied octet by octet from kbtp-draft.txt.
DRAFT_ALLOC_STORE = bytes.fromhex(
    "01 12 00 01 00 00 00 00 00 00 00 07 00 00 00 00 00 00 40 01 00 00 00 00"
    "00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 08"
    "4b 56 42 4c 4f 43 4b 21")
DRAFT_COMPLETION = bytes.fromhex(
    "01 20 00 00 00 00 00 00 00 00 00 07 00 00 00 00 00 00 40 01 00 05 00 00"
    "00 00 00 08 00 00 00 00 00 00 00 00 00 15 00 00")

# Draft constants restated for the oracle (draft §KBTP Opcodes, flag and feature lists).
OP = dict(HELLO=0x01, HELLO_ACK=0x02, LOAD=0x10, STORE=0x11, ALLOC_STORE=0x12, FREE=0x13,
          BIND=0x14, COMPLETION=0x20, GOODBYE=0x30)
INLINE, SEAL, RECORD, INVALIDATE, ALLOW_UNSEALED = 0x1, 0x2, 0x4, 0x8, 0x10
DIRECT_LOAD, DIRECT_ALLOC = 0x1, 0x2


def hdr(op, flags=0, rid=0, handle=0, gen=0, status=0, version=1, le=False):
    """Common header per the draft diagram; ``le`` = ADDR_LE Block Handle."""
    return (struct.pack(">BBHQ", version, op, flags, rid)
            + struct.pack("<Q" if le else ">Q", handle) + struct.pack(">HH", gen, status))


def dd(stag=0, to=0, length=0, le=False):
    return struct.pack("<IQI" if le else ">IQI", stag, to, length)


def cd(stag=0, to=0, reserved=0, le=False):
    return struct.pack("<IQ" if le else ">IQ", stag, to) + struct.pack(">I", reserved)


def hello_ack_raw(features=0, status=0, quota=4, parts=True, head_to=0x40, ring=4,
                  partition=None, reserved=0):
    raw = hdr(OP["HELLO_ACK"], status=status) + struct.pack(
        ">HHIIIQII", features, 16, 32768, 1024, quota, 0x4000, 256, 100)
    if parts and features & DIRECT_LOAD:
        raw += struct.pack(">IQI", 0x11, 0x1000, 1024) + struct.pack(">QQ", 0x4000, reserved)
        raw += struct.pack(">IQI", 0x22, 0, 64)
    if parts and features & DIRECT_ALLOC:
        raw += struct.pack(">IQI", 0x33, 0x20000, quota if partition is None else partition)
        raw += struct.pack(">IQI", 0x44, 0x8000, ring) + struct.pack(">IQI", 0x55, head_to, 1)
    return raw


# --------------------------------------------------------------------------------------------
# The draft's worked examples
# --------------------------------------------------------------------------------------------

def test_draft_alloc_store_example():
    msg = decode(DRAFT_ALLOC_STORE)
    assert type(msg) is AllocStore
    assert (msg.flags, msg.request_id, msg.handle, msg.generation, msg.status) == \
        (INLINE, 7, 0x4001, 0, 0)
    assert msg.data == DataDesc(stag=0, tagged_offset=0, length=8)
    assert msg.completion is None
    assert msg.inline == b"KVBLOCK!"
    assert len(DRAFT_ALLOC_STORE) == 48
    assert encode(msg) == DRAFT_ALLOC_STORE
    built = AllocStore(flags=INLINE, request_id=7, handle=0x4001, data=DataDesc(length=8),
                       inline=b"KVBLOCK!")
    assert encode(built) == DRAFT_ALLOC_STORE


def test_draft_completion_example():
    msg = decode(DRAFT_COMPLETION)
    assert type(msg) is Completion
    assert (msg.flags, msg.request_id, msg.handle, msg.generation, msg.status) == \
        (0, 7, 0x4001, 5, Status.OK.value)
    assert msg.data_length == 8
    assert msg.block_offset == 0x150000 == 42 * 32 * 1024
    assert encode(msg) == DRAFT_COMPLETION
    built = Completion(request_id=7, handle=0x4001, generation=5, data_length=8,
                       block_offset=0x150000, status=Status.OK)
    assert encode(built) == DRAFT_COMPLETION
    # ADDR_LE does not touch a COMPLETION (its handle included: module docstring).
    assert decode(DRAFT_COMPLETION, addr_le=True) == msg
    assert encode(msg, addr_le=True) == DRAFT_COMPLETION


def test_draft_examples_under_addr_le_swap_only_the_handle():
    msg = decode(DRAFT_ALLOC_STORE)
    le = encode(msg, addr_le=True)
    assert le == (hdr(OP["ALLOC_STORE"], INLINE, 7, 0x4001, le=True) + dd(0, 0, 8, le=True)
                  + b"KVBLOCK!")
    assert decode(le, addr_le=True) == msg


# --------------------------------------------------------------------------------------------
# ADDR_LE swaps exactly the listed fields: compare with hand-built struct.pack bytes
# --------------------------------------------------------------------------------------------

u8, u16, u32, u64 = (st.integers(0, 2**b - 1) for b in (8, 16, 32, 64))
u128 = st.integers(0, 2**128 - 1)
ORDERS = [False, True]


@pytest.mark.parametrize("le", ORDERS)
@SETTINGS
@given(rid=u64, h=u64, gen=u16, s=u32, to=u64, ln=u32, cs=u32, cto=u64, flags=st.sampled_from(
    [RECORD, RECORD | INVALIDATE, RECORD | ALLOW_UNSEALED, RECORD | INVALIDATE | ALLOW_UNSEALED]))
def test_addr_le_load(le, rid, h, gen, s, to, ln, cs, cto, flags):
    msg = Load(flags=flags, request_id=rid, handle=h, generation=gen,
               data=DataDesc(s, to, ln), completion=ComplDesc(cs, cto))
    expect = hdr(OP["LOAD"], flags, rid, h, gen, le=le) + dd(s, to, ln, le) + cd(cs, cto, le=le)
    assert encode(msg, addr_le=le) == expect
    assert decode(expect, addr_le=le) == msg


@pytest.mark.parametrize("le", ORDERS)
@SETTINGS
@given(rid=u64, h=u64, gen=u16, cs=u32, cto=u64, data=st.binary(max_size=40),
       seal=st.booleans(), alloc=st.booleans())
def test_addr_le_inline_store(le, rid, h, gen, cs, cto, data, seal, alloc):
    flags = INLINE | RECORD | (SEAL if seal else 0)
    cls, op = (AllocStore, "ALLOC_STORE") if alloc else (Store, "STORE")
    msg = cls(flags=flags, request_id=rid, handle=h, generation=gen,
              data=DataDesc(length=len(data)), completion=ComplDesc(cs, cto), inline=data)
    expect = (hdr(OP[op], flags, rid, h, gen, le=le) + dd(0, 0, len(data), le)
              + cd(cs, cto, le=le) + data)
    assert encode(msg, addr_le=le) == expect
    assert decode(expect, addr_le=le) == msg


@pytest.mark.parametrize("le", ORDERS)
@SETTINGS
@given(rid=u64, h=u64, gen=u16, s=u32, to=u64, ln=u32)
def test_addr_le_read_store(le, rid, h, gen, s, to, ln):
    msg = Store(flags=SEAL | INVALIDATE, request_id=rid, handle=h, generation=gen,
                data=DataDesc(s, to, ln))
    expect = hdr(OP["STORE"], SEAL | INVALIDATE, rid, h, gen, le=le) + dd(s, to, ln, le)
    assert encode(msg, addr_le=le) == expect
    assert decode(expect, addr_le=le) == msg


@pytest.mark.parametrize("le", ORDERS)
@SETTINGS
@given(rid=u64, h=u64, gen=u16, cs=u32, cto=u64, ticket=u32, dl=u32,
       bo=st.integers(0, 2**64 - 2), release=st.booleans())
def test_addr_le_free_bind_goodbye(le, rid, h, gen, cs, cto, ticket, dl, bo, release):
    free = Free(flags=RECORD, request_id=rid, handle=h, generation=gen,
                completion=ComplDesc(cs, cto))
    expect = hdr(OP["FREE"], RECORD, rid, h, gen, le=le) + cd(cs, cto, le=le)
    assert encode(free, addr_le=le) == expect
    assert decode(expect, addr_le=le) == free
    # BIND: handle follows ADDR_LE, the body (Ticket, Data Length, Block Offset) stays BE.
    bind = Bind(request_id=rid, handle=h, generation=gen, ticket=ticket, data_length=dl,
                block_offset=bo)
    expect = hdr(OP["BIND"], 0, rid, h, gen, le=le) + struct.pack(">IIQ", ticket, dl, bo)
    assert encode(bind, addr_le=le) == expect
    assert decode(expect, addr_le=le) == bind
    bye = Goodbye(flags=int(release), request_id=rid, handle=h, generation=gen)
    expect = hdr(OP["GOODBYE"], int(release), rid, h, gen, le=le)
    assert encode(bye, addr_le=le) == expect
    assert decode(expect, addr_le=le) == bye


@pytest.mark.parametrize("le", ORDERS)
@SETTINGS
@given(rid=u64, h=u64, gen=u16, st_=st.sampled_from(list(Status)), dl=u32, bo=u64)
def test_addr_le_leaves_completion_big_endian(le, rid, h, gen, st_, dl, bo):
    msg = Completion(request_id=rid, handle=h, generation=gen, status=st_, data_length=dl,
                     block_offset=bo)
    expect = hdr(OP["COMPLETION"], 0, rid, h, gen, st_.value) + struct.pack(">IIQ", dl, 0, bo)
    assert encode(msg, addr_le=le) == expect
    assert decode(expect, addr_le=le) == msg


@pytest.mark.parametrize("le", ORDERS)
@SETTINGS
@given(flags=st.sampled_from([0, 1, 3]), gen=st.integers(1, 0xFFFF), dl=u32, bo=u64, seq=u32,
       rid=u64, status=st.sampled_from(list(Status)), rgen=u16)
def test_addr_le_memory_structures(le, flags, gen, dl, bo, seq, rid, status, rgen):
    o = "<" if le else ">"
    entry = struct.pack(">HHI", flags, gen, dl) + struct.pack(o + "Q", bo)
    assert codec.encode_entry(flags, gen, dl, bo, addr_le=le) == entry
    assert codec.decode_entry(entry, addr_le=le) == codec.TableEntryValue(flags, gen, dl, bo)
    slot = struct.pack(">II", seq, 0) + struct.pack(o + "Q", bo)
    assert codec.encode_slot(seq, bo, addr_le=le) == slot
    assert codec.decode_slot(slot, addr_le=le) == (seq, bo)
    record = struct.pack(">QHHIQ", rid, status.value, rgen, dl, bo)   # never swapped
    assert codec.encode_record(rid, status, rgen, dl, bo) == record
    assert codec.decode_record(record) == codec.CompletionRecordValue(rid, status.value, rgen,
                                                                      dl, bo)


def test_addr_le_hello_ack_all_big_endian():
    raw = hello_ack_raw(DIRECT_LOAD | DIRECT_ALLOC)
    for le in ORDERS:
        msg = decode(raw, addr_le=le)
        assert msg.table == DirectDesc(0x11, 0x1000, 1024) and msg.table_base_handle == 0x4000
        assert msg.pool == DirectDesc(0x22, 0, 64)
        assert msg.partition == DirectDesc(0x33, 0x20000, 4)
        assert msg.ring == DirectDesc(0x44, 0x8000, 4)
        assert msg.head == DirectDesc(0x55, 0x40, 1)
        assert (msg.block_size, msg.max_inline, msg.handle_base, msg.ticket_timeout_ms) == \
            (32768, 1024, 0x4000, 100)
        assert encode(msg, addr_le=le) == raw


def test_hello_body_offsets():
    iid = 0x0123456789ABCDEF_FEDCBA9876543210
    raw = hdr(OP["HELLO"]) + struct.pack(">HH", 0x000F, 32) + iid.to_bytes(16, "big")
    msg = decode(raw)
    assert msg == Hello(requested_features=0xF, completion_credits=32, initiator_id=iid)
    assert encode(msg) == raw and len(raw) == 44


# --------------------------------------------------------------------------------------------
# Round trips of every message in both byte orders
# --------------------------------------------------------------------------------------------

def subset(mask):
    bits = [1 << i for i in range(16) if mask >> i & 1]
    return st.lists(st.sampled_from(bits), unique=True).map(sum) if bits else st.just(0)


@st.composite
def hello_acks(draw):
    status = draw(st.sampled_from(list(Status)))
    features = draw(subset(0xF))
    quota = draw(u16)
    msg = HelloAck(status=status, features=features, request_credits=draw(u16),
                   block_size=draw(u32), max_inline=draw(u32), allocation_quota=quota,
                   handle_base=draw(u64), handle_count=draw(u32), ticket_timeout_ms=draw(u32))
    parts = status == Status.OK or draw(st.booleans())   # an error HELLO_ACK may stop at 56
    if parts and features & DIRECT_LOAD:
        msg.table = DirectDesc(draw(u32), draw(u64), draw(u32))
        msg.table_base_handle = draw(u64)
        msg.pool = DirectDesc(draw(u32), draw(u64), draw(u32))
    if parts and features & DIRECT_ALLOC:
        n = 1 << draw(st.integers(max(quota - 1, 0).bit_length(), 31))
        msg.partition = DirectDesc(draw(u32), draw(u64), quota)
        msg.ring = DirectDesc(draw(u32), draw(u64), n)
        msg.head = DirectDesc(draw(u32), 8 * draw(st.integers(0, 2**61 - 1)), 1)
    return msg


def requests_common(draw):
    return dict(request_id=draw(u64), handle=draw(u64), generation=draw(u16))


@st.composite
def loads(draw):
    flags = draw(subset(RECORD | INVALIDATE | ALLOW_UNSEALED))
    comp = ComplDesc(draw(u32), draw(u64)) if flags & RECORD else None
    return Load(flags=flags, **requests_common(draw), data=DataDesc(draw(u32), draw(u64),
                draw(u32)), completion=comp)


@st.composite
def stores(draw):
    flags = draw(subset(INLINE | SEAL | RECORD | INVALIDATE))
    if flags & INLINE:
        flags &= ~INVALIDATE
    comp = ComplDesc(draw(u32), draw(u64)) if flags & RECORD else None
    cls = draw(st.sampled_from([Store, AllocStore]))
    if flags & INLINE:
        inline = draw(st.binary(max_size=64))
        data = DataDesc(0, 0, len(inline))
    else:
        inline, data = b"", DataDesc(draw(u32), draw(u64), draw(u32))
    return cls(flags=flags, **requests_common(draw), data=data, completion=comp, inline=inline)


@st.composite
def others(draw):
    kind = draw(st.sampled_from(["hello", "free", "bind", "completion", "goodbye"]))
    if kind == "hello":
        return Hello(requested_features=draw(u16), completion_credits=draw(u16),
                     initiator_id=draw(u128))
    if kind == "free":
        flags = draw(subset(RECORD))
        return Free(flags=flags, **requests_common(draw),
                    completion=ComplDesc(draw(u32), draw(u64)) if flags else None)
    if kind == "bind":
        return Bind(**requests_common(draw), ticket=draw(u32), data_length=draw(u32),
                    block_offset=draw(st.integers(0, 2**64 - 2)))
    if kind == "completion":
        return Completion(**requests_common(draw), status=draw(st.sampled_from(list(Status))),
                          data_length=draw(u32), block_offset=draw(u64))
    return Goodbye(flags=draw(subset(1)), **requests_common(draw))


MESSAGES = st.one_of(hello_acks(), loads(), stores(), others())


@SETTINGS
@given(msg=MESSAGES, le=st.booleans())
def test_round_trip_every_message(msg, le):
    raw = encode(msg, addr_le=le)
    back = decode(raw, addr_le=le)
    assert back == msg
    assert encode(back, addr_le=le) == raw
    # The JSON view round-trips too (what `kbtp decode | kbtp encode` relies on).
    view = json.loads(json.dumps(codec.to_json_dict(msg)))
    assert codec.from_json_dict(view) == msg


@SETTINGS
@given(msg=st.one_of(loads(), stores(), others()))
def test_addr_le_changes_only_the_handle_and_descriptors(msg):
    """Byte-reverse exactly the listed fields of the big-endian encoding: that is the LE one."""
    be = bytearray(encode(msg))
    le = encode(msg, addr_le=True)
    if type(msg) in (Hello, Completion):
        assert le == bytes(be)
        return
    spans = [(12, 20)]                                    # Block Handle
    pos = 24
    if isinstance(msg, (Load, Store, AllocStore)):
        spans += [(pos, pos + 4), (pos + 4, pos + 12), (pos + 12, pos + 16)]
        pos += 16
    if getattr(msg, "completion", None) is not None:
        spans += [(pos, pos + 4), (pos + 4, pos + 12)]
    for a, b in spans:
        be[a:b] = be[a:b][::-1]
    assert le == bytes(be)


@SETTINGS
@given(le=st.booleans(), flags=st.sampled_from([1, 3]), gen=st.integers(1, 0xFFFF), dl=u32,
       bo=u64, seq=u32)
def test_round_trip_memory_structures(le, flags, gen, dl, bo, seq):
    raw = codec.encode_entry(flags, gen, dl, bo, addr_le=le)
    e = codec.decode_entry(raw, addr_le=le)
    assert codec.encode_entry(e.flags, e.generation, e.data_length, e.block_offset,
                              addr_le=le) == raw
    raw = codec.encode_slot(seq, bo, addr_le=le)
    assert codec.encode_slot(*codec.decode_slot(raw, addr_le=le), addr_le=le) == raw


# Structured fuzz: strict decoding is canonical, so anything it accepts re-encodes to itself,
# and anything it refuses is a KbtpError with a target status.
@settings(max_examples=400, deadline=None)
@given(op=st.sampled_from(sorted(OP.values())), flags=st.sampled_from([0, 1, 4, 5, 8, 0x10, 0x40]),
       status=st.sampled_from([0, 0, 0, 3, 77]), le=st.booleans(),
       tail=st.one_of(st.binary(max_size=120),
                      st.integers(0, 9).map(lambda n: bytes(16 * n)),
                      st.integers(0, 9).flatmap(lambda n: st.binary(min_size=16 * n,
                                                                    max_size=16 * n))))
def test_fuzz_decode_is_canonical(op, flags, status, le, tail):
    raw = hdr(op, flags, status=status) + tail
    try:
        msg = decode(raw, addr_le=le)
    except KbtpError as err:
        assert err.status in (Status.MALFORMED, Status.TOO_LARGE)
        assert err.field and str(err).startswith(err.field + ": ")
        return
    assert encode(msg, addr_le=le) == raw


# --------------------------------------------------------------------------------------------
# Malformed inputs: field name and status (also driven through the CLI by test_cli.py)
# --------------------------------------------------------------------------------------------

M, T = Status.MALFORMED, Status.TOO_LARGE
_A = DRAFT_ALLOC_STORE
_LOAD = hdr(OP["LOAD"], handle=0x4001) + dd(1, 0x1000, 4096)

# (id, raw, decode keyword arguments, field, status)
MALFORMED_CASES = [
    ("empty", b"", {}, "header", M),
    ("header-truncated", _A[:23], {}, "header", M),
    ("version-2", b"\x02" + _A[1:], {}, "version", M),
    ("opcode-unknown", hdr(0x15), {}, "opcode", M),
    ("status-in-request", hdr(OP["LOAD"], status=9) + dd(), {}, "status", M),
    ("inline-on-load", hdr(OP["LOAD"], INLINE) + dd(), {}, "flags", M),
    ("unknown-flag-bit", hdr(OP["LOAD"], 0x0100) + dd(), {}, "flags", M),
    ("inline-on-free", hdr(OP["FREE"], INLINE), {}, "flags", M),
    ("flags-on-bind", hdr(OP["BIND"], SEAL) + struct.pack(">IIQ", 1, 8, 0), {}, "flags", M),
    ("goodbye-unknown-flag", hdr(OP["GOODBYE"], 0x0002), {}, "flags", M),
    ("inline-with-invalidate", hdr(OP["STORE"], INLINE | INVALIDATE) + dd(0, 0, 1) + b"x", {},
     "flags", M),
    ("inline-stag-nonzero", _A[:24] + dd(5, 0, 8) + b"KVBLOCK!", {}, "data_descriptor.stag", M),
    ("inline-to-nonzero", _A[:24] + dd(0, 1, 8) + b"KVBLOCK!", {},
     "data_descriptor.tagged_offset", M),
    ("inline-length-mismatch", _A[:24] + dd(0, 0, 9) + b"KVBLOCK!", {}, "inline_data", M),
    ("inline-too-long", _A, {"max_inline": 4}, "inline_data", T),
    ("length-over-block-size", hdr(OP["LOAD"]) + dd(1, 0, 65536), {"block_size": 32768},
     "data_descriptor.length", T),
    ("data-descriptor-truncated", _LOAD[:39], {}, "data_descriptor", M),
    ("record-without-descriptor", hdr(OP["LOAD"], RECORD) + dd(1, 0, 8), {},
     "completion_descriptor", M),
    ("descriptor-without-record", _LOAD + cd(2, 0x40), {}, "completion_descriptor", M),
    ("completion-descriptor-reserved", hdr(OP["FREE"], RECORD) + cd(2, 0x40, 1), {},
     "completion_descriptor.reserved", M),
    ("store-trailing", hdr(OP["STORE"]) + dd(1, 0, 8) + b"KVBLOCK!", {}, "message", M),
    ("completion-trailing", DRAFT_COMPLETION + b"\x00", {}, "message", M),
    ("completion-reserved", DRAFT_COMPLETION[:28] + b"\x00\x00\x00\x01" + DRAFT_COMPLETION[32:],
     {}, "reserved", M),
    ("completion-unknown-status", DRAFT_COMPLETION[:22] + b"\x00\x63" + DRAFT_COMPLETION[24:],
     {}, "status", M),
    ("bind-truncated", hdr(OP["BIND"]) + struct.pack(">IIQ", 1, 8, 0)[:15], {}, "body", M),
    ("bind-empty-slot-offset", hdr(OP["BIND"]) + struct.pack(">IIQ", 1, 8, 2**64 - 1), {},
     "block_offset", M),
    ("bind-too-long", hdr(OP["BIND"]) + struct.pack(">IIQ", 1, 40000, 0), {"block_size": 32768},
     "data_length", T),
    ("hello-request-id", hdr(OP["HELLO"], rid=1) + bytes(20), {}, "request_id", M),
    ("hello-truncated", hdr(OP["HELLO"]) + bytes(19), {}, "body", M),
    ("goodbye-trailing", hdr(OP["GOODBYE"]) + b"\x00", {}, "message", M),
    ("hello-ack-unknown-feature", hello_ack_raw(0x0100), {}, "features", M),
    ("hello-ack-direct-load-missing", hello_ack_raw(DIRECT_LOAD, parts=False), {},
     "direct_load", M),
    ("hello-ack-direct-alloc-short", hello_ack_raw(DIRECT_ALLOC)[:-1], {}, "direct_alloc", M),
    ("hello-ack-extra-part", hello_ack_raw(0) + bytes(48), {}, "features", M),
    ("hello-ack-reserved", hello_ack_raw(DIRECT_LOAD, reserved=1), {}, "direct_load.reserved",
     M),
    ("hello-ack-head-unaligned", hello_ack_raw(DIRECT_ALLOC, head_to=0x44), {},
     "head.tagged_offset", M),
    ("hello-ack-ring-not-pow2", hello_ack_raw(DIRECT_ALLOC, ring=6), {}, "ring.count", M),
    ("hello-ack-partition-not-quota", hello_ack_raw(DIRECT_ALLOC, partition=3), {},
     "partition.count", M),
]


@pytest.mark.parametrize("raw, kwargs, field, status",
                         [c[1:] for c in MALFORMED_CASES], ids=[c[0] for c in MALFORMED_CASES])
def test_malformed(raw, kwargs, field, status):
    with pytest.raises(KbtpError) as info:
        decode(raw, **kwargs)
    err = info.value
    assert err.field == field, str(err)
    assert err.status is status
    assert str(err).startswith(f"{field}: ")


def test_malformed_cases_are_one_defect_each():
    """The TOO_LARGE cases decode without the limit, so the limit alone is what fails them."""
    for name, raw, kwargs, _, status in MALFORMED_CASES:
        if status is T:
            decode(raw)
    # and the good neighbours of the synthetic cases do decode
    decode(_LOAD)
    decode(_LOAD[:24].replace(b"\x10\x00\x00", b"\x10\x00\x04") + _LOAD[24:] + cd(2, 0x40))
    decode(hello_ack_raw(DIRECT_LOAD | DIRECT_ALLOC))
    decode(hello_ack_raw(DIRECT_LOAD, status=5, parts=False))   # error HELLO_ACK stops at 56


def test_error_hello_ack_may_stop_after_56_octets():
    raw = hello_ack_raw(DIRECT_LOAD | DIRECT_ALLOC, status=Status.INTERNAL.value, parts=False)
    assert len(raw) == 56
    msg = decode(raw)
    assert msg.status == Status.INTERNAL.value and msg.table is None and msg.head is None
    assert encode(msg) == raw
    with pytest.raises(KbtpError) as info:
        decode(hello_ack_raw(DIRECT_LOAD | DIRECT_ALLOC, status=0, parts=False))
    assert info.value.field == "direct_load"


def test_memory_structures_strict():
    cases = [
        (lambda: codec.decode_entry(struct.pack(">HHIQ", 1, 0, 8, 0)), "entry.generation"),
        (lambda: codec.decode_entry(struct.pack(">HHIQ", 2, 1, 8, 0)), "entry.flags"),
        (lambda: codec.decode_entry(struct.pack(">HHIQ", 0x10, 1, 8, 0)), "entry.flags"),
        (lambda: codec.decode_entry(bytes(15)), "entry"),
        (lambda: codec.decode_slot(struct.pack(">IIQ", 1, 1, 0)), "slot.reserved"),
        (lambda: codec.decode_slot(bytes(17)), "slot"),
        (lambda: codec.decode_record(struct.pack(">QHHIQ", 1, 12, 1, 8, 0)), "record.status"),
        (lambda: codec.decode_record(bytes(23)), "record"),
    ]
    for call, field in cases:
        with pytest.raises(KbtpError) as info:
            call()
        assert info.value.field == field and info.value.status is M
    # non-strict reads of raw memory (e.g. a zeroed table) are still possible
    assert codec.decode_entry(bytes(16), strict=False) == codec.TableEntryValue(0, 0, 0, 0)
    assert codec.decode_slot(struct.pack(">IIQ", 3, 1, 2**64 - 1), strict=False) == \
        (3, 2**64 - 1)


def test_encode_is_strict_unless_asked():
    with pytest.raises(KbtpError) as info:
        encode(Load(flags=RECORD, data=DataDesc(1, 0, 8)))
    assert info.value.field == "completion_descriptor"
    with pytest.raises(KbtpError) as info:
        encode(Store(data=DataDesc(0, 0, 3), inline=b"abc"))
    assert info.value.field == "inline_data"
    with pytest.raises(KbtpError) as info:
        encode(HelloAck(features=DIRECT_LOAD))
    assert info.value.field == "direct_load"
    with pytest.raises(KbtpError) as info:
        encode(Load(handle=2**64))
    assert info.value.field == "handle"
    with pytest.raises(KbtpError) as info:
        encode(Bind(block_offset=2**64 - 1))
    assert info.value.field == "block_offset"
    # strict=False builds the negative-test input; decode then names the defect.
    raw = encode(Load(flags=RECORD, data=DataDesc(1, 0, 8)), strict=False)
    assert raw == hdr(OP["LOAD"], RECORD) + dd(1, 0, 8)
    with pytest.raises(KbtpError):
        decode(raw)


def test_enum_values_accepted():
    from hw.headers import Features, ReqFlags
    a = Load(flags=ReqFlags.RECORD | ReqFlags.INVALIDATE, status=Status.OK,
             completion=ComplDesc(1, 2))
    b = Load(flags=RECORD | INVALIDATE, completion=ComplDesc(1, 2))
    assert a == b and encode(a) == encode(b)
    assert Hello(requested_features=Features.ADDR_LE).requested_features == 8


@pytest.mark.parametrize("le", ORDERS)
def test_error_carries_the_header_for_the_malformed_completion(le):
    raw = hdr(OP["LOAD"], INLINE, 0x77, 0x4001, 9, le=le) + dd()
    with pytest.raises(KbtpError) as info:
        decode(raw, addr_le=le)
    assert info.value.header["request_id"] == 0x77
    assert info.value.header["handle"] == 0x4001
    assert info.value.header["generation"] == 9
    with pytest.raises(KbtpError) as info:
        decode(raw[:23], addr_le=le)
    assert info.value.header is None

# Ref: draft KBTP §Examples, §Session Establishment, §Operations, §Direct Modes,
#      §Free-Block Ring (deferred free), §Allocation Quotas (Ticket Timeout)
"""``python -m tools.demo`` (``make demo``): the golden model serving the draft's example flows.

Prints a readable log: HELLO/HELLO_ACK; the draft's ALLOC_STORE of "KVBLOCK!" to handle 0x4001
with Request ID 7 and its COMPLETION, byte for byte; LOAD, STORE, FREE; the deferred-free
scenario of blocks 100..103; a DIRECT_ALLOC with BIND and a direct load; some errors; a ticket
timeout; and a summary of counters, ring occupancy and quotas. Exits 1 if the draft's example
bytes or the scenario's outcome are not reproduced, else 0.

Block numbering: the draft's example needs Block Offset 0x150000 = block 42 of 32 KiB blocks,
so the first target puts block 42 first on its free ring (``initial_free_order``) and starts its
entries at Generation 4 (so the bind yields the example's Generation 5). The deferred-free
scenario's "blocks 100 to 103" are a 4-block pool whose Pool Tagged Offset starts at
100 * Block Size, so Block Offset / Block Size is 100..103.
"""

import sys

from host import codec
from hw.headers import Features, ReqFlags, Status
from model.target import (Disconnect, InvalidateStag, MemWrite, RdmaRead, RdmaWrite, SendMsg,
                       TargetConfig, TargetModel, WriteImm)

DRAFT_ALLOC_STORE = bytes.fromhex(
    "011200010000000000000007000000000000400100000000"
    "00000000000000000000000000000008" "4b56424c4f434b21")
DRAFT_COMPLETION = bytes.fromhex(
    "012000000000000000000007000000000000400100050000"
    "00000008000000000000000000150000")

_failures = []


def hexdump(raw, indent="      "):
    lines = []
    for i in range(0, len(raw), 24):
        chunk = raw[i:i + 24]
        lines.append(indent + " ".join(f"{b:02x}" for b in chunk))
    return "\n".join(lines)


def check(cond, what):
    print(f"   check: {what}: {'yes' if cond else 'NO'}")
    if not cond:
        _failures.append(what)


def describe(a):
    """One readable line per action."""
    if isinstance(a, MemWrite):
        data = a.data.hex() if len(a.data) <= 16 else f"{a.data[:8].hex()}... ({len(a.data)} B)"
        return f"mem  {a.addr:#08x} <- {data:<34} {a.what}"
    if isinstance(a, SendMsg):
        msg = codec.decode(a.payload)
        inv = f" (Send with Invalidate {a.invalidate_stag:#x})" if a.invalidate_stag else ""
        if isinstance(msg, codec.Completion):
            return (f"send COMPLETION rid={msg.request_id} handle={msg.handle:#x} "
                    f"status={Status(msg.status).name} gen={msg.generation} "
                    f"len={msg.data_length} off={msg.block_offset:#x}{inv}")
        return f"send {type(msg).__name__} status={Status(msg.status).name}"
    if isinstance(a, RdmaRead):
        return f"rdma READ  stag={a.stag:#x} to={a.to:#x} len={a.length}" + \
            (f" FAILED: {a.error}" if a.error else "")
    if isinstance(a, RdmaWrite):
        return f"rdma WRITE stag={a.stag:#x} to={a.to:#x} {a.data[:16]!r}" + \
            (f" FAILED: {a.error}" if a.error else "")
    if isinstance(a, WriteImm):
        return f"rdma WRITE_IMM stag={a.stag:#x} to={a.to:#x} imm={a.imm:#x}"
    if isinstance(a, InvalidateStag):
        return f"local invalidate of target STag {a.stag:#x} ({a.reason})"
    if isinstance(a, Disconnect):
        return f"disconnect ({a.reason})"
    return repr(a)


def show(acts, title=None):
    if title:
        print(f"   {title}")
    for a in acts:
        print("     " + describe(a))
    return acts


def completion(acts):
    s = [a for a in acts if isinstance(a, SendMsg)]
    return codec.decode(s[-1].payload) if s else None


def req(m, conn, msg, title, addr_le=False, now=None):
    raw = codec.encode(msg, addr_le=addr_le)
    print(f"\n-> {conn}: {title}")
    acts = m.receive(conn, raw, now_ms=now)
    show(acts)
    return acts


def hello(m, conn, iid, features=0):
    m.connect(conn)
    acts = m.receive(conn, codec.encode(codec.Hello(requested_features=features,
                                                    completion_credits=8, initiator_id=iid)))
    ack = codec.decode([a for a in acts if isinstance(a, SendMsg)][0].payload)
    feats = [f.name for f in Features if ack.features & f.value]
    print(f"\n-> {conn}: HELLO id={iid:#x} features={features:#x}")
    print(f"   <- HELLO_ACK status={Status(ack.status).name} features={feats} "
          f"quota={ack.allocation_quota} handles={ack.handle_base:#x}+{ack.handle_count} "
          f"block_size={ack.block_size} max_inline={ack.max_inline} "
          f"ticket_timeout={ack.ticket_timeout_ms} ms")
    if ack.partition is not None:
        print(f"      partition STag {ack.partition.stag:#x} TO {ack.partition.tagged_offset:#x}"
              f" x{ack.partition.count}; ring STag {ack.ring.stag:#x} N={ack.ring.count}; "
              f"head STag {ack.head.stag:#x}")
    return ack


def summary(m, name):
    print(f"\n== summary of {name}")
    for (op, st), n in sorted(m.counters.items()):
        print(f"   {op:<18} {st:<18} {n}")
    print(f"   ring occupancy: {m.occupancy()}")
    for iid, (used, quota, state) in m.quota_use().items():
        print(f"   initiator {iid:#x}: quota use {used}/{quota} ({state})")


def draft_examples():
    print("== 1. The draft's example: ALLOC_STORE \"KVBLOCK!\" to handle 0x4001, Request ID 7")
    cfg = TargetConfig(block_size=32768, num_blocks=64, initial_generation=4,
                       initial_free_order=list(range(42, 64)) + list(range(42)),
                       quota_per_initiator=8)
    m = TargetModel(cfg)
    lay = cfg.layout()
    print(f"   target: F={cfg.num_blocks} blocks of {cfg.block_size} B, table at {lay['table']:#x}"
          f", ring at {lay['ring']:#x} (N={lay['ring_n']}), pool at {lay['pool']:#x}")
    hello(m, "A", 0x0123456789ABCDEF0123456789ABCDEF, Features.RECORD_COMPLETION.value)
    print("\n-> A: ALLOC_STORE (the draft's 48 octets)")
    print(hexdump(DRAFT_ALLOC_STORE))
    acts = show(m.receive("A", DRAFT_ALLOC_STORE))
    out = [a for a in acts if isinstance(a, SendMsg)][0].payload
    print("   COMPLETION bytes:")
    print(hexdump(out))
    check(out == DRAFT_COMPLETION, "COMPLETION equals the draft's 40 octets")

    im = m.initiator_memory("A")
    im.register(0x1000, 64, access="rw")
    acts = req(m, "A", codec.Load(request_id=8, handle=0x4001,
                                  data=codec.DataDesc(0x1000, 0, 64)), "LOAD 0x4001 (not sealed)")
    check(completion(acts).status == Status.NOT_SEALED.value, "unsealed LOAD -> NOT_SEALED")
    acts = req(m, "A", codec.Store(request_id=9, handle=0x4001,
                                   flags=(ReqFlags.INLINE | ReqFlags.SEAL).value,
                                   data=codec.DataDesc(0, 0, 9), inline=b"KVBLOCK!!"),
               "STORE 0x4001 \"KVBLOCK!!\" with SEAL")
    acts = req(m, "A", codec.Load(request_id=10, handle=0x4001, generation=5,
                                  flags=ReqFlags.INVALIDATE.value,
                                  data=codec.DataDesc(0x1000, 0, 64)),
               "LOAD 0x4001, generation 5, INVALIDATE")
    check(im.contents(0x1000)[:9] == b"KVBLOCK!!", "initiator buffer holds the block")
    im.register(0x1100, 24)
    acts = req(m, "A", codec.Free(request_id=11, handle=0x4001, generation=5,
                                  flags=ReqFlags.RECORD.value,
                                  completion=codec.ComplDesc(0x1100, 0)),
               "FREE 0x4001 with RECORD (completion record by Write with Immediate)")
    rec = codec.decode_record(im.contents(0x1100))
    print(f"   record: {rec}")
    check(rec.status == 0 and rec.generation == 6, "record says OK, Generation 6")

    print("\n== 2. A few errors")
    im.register(0x1200, 64)
    req(m, "A", codec.Load(request_id=20, handle=0x9999,
                           data=codec.DataDesc(0x1200, 0, 64)), "LOAD outside the table")
    req(m, "A", codec.Free(request_id=21, handle=0x4001, generation=3), "FREE, stale generation")
    req(m, "A", codec.Store(request_id=22, handle=0x4002, data=codec.DataDesc(0x1200, 0, 16)),
        "STORE to an unbound handle")
    print("\n-> A: truncated LOAD (30 octets)")
    show(m.receive("A", codec.encode(codec.Load(request_id=23, handle=0x4002))[:30]))
    req(m, "A", codec.AllocStore(request_id=24, handle=0x4002,
                                 data=codec.DataDesc(0x7777, 0, 16)),
        "ALLOC_STORE from an unregistered STag -> INTERNAL")
    m.connect("A2")
    print("\n-> A2: HELLO with A's Initiator ID while A is connected")
    show(m.receive("A2", codec.encode(codec.Hello(
        initiator_id=0x0123456789ABCDEF0123456789ABCDEF))))
    summary(m, "target 1")


def deferred_free():
    print("\n== 3. The draft's deferred-free scenario: blocks 100..103, N = F = 4")
    bs = 4096
    cfg = TargetConfig(block_size=bs, num_blocks=4, ring_order=2, pool_to_base=100 * bs,
                       quotas={0xA: 1, 0xB: 3}, quota_per_initiator=0)
    m = TargetModel(cfg)
    hello(m, "X", 0xA)
    hello(m, "Y", 0xB)

    def slots():
        s = m.shared_ring.slots()
        return "  ".join(f"[{i}] seq {q} " + ("empty" if b == 2**64 - 1 else f"blk {b // bs}")
                         for i, (q, b) in enumerate(s))

    print(f"   ring: {slots()}")
    m.hold("X")
    req(m, "X", codec.AllocStore(request_id=1, handle=0x4000, flags=ReqFlags.INLINE.value,
                                 data=codec.DataDesc(0, 0, 1), inline=b"X"),
        "ALLOC_STORE: takes ticket 0, its chain is delayed before reading slot 0")
    got = []
    for i in range(3):
        acts = req(m, "Y", codec.AllocStore(request_id=10 + i, handle=0x4040 + i,
                                            flags=ReqFlags.INLINE.value,
                                            data=codec.DataDesc(0, 0, 1), inline=b"Y"),
                   f"ALLOC_STORE (ticket {i + 1})")
        got.append(completion(acts).block_offset // bs)
    check(got == [101, 102, 103], "Y got blocks 101, 102, 103")
    req(m, "Y", codec.Free(request_id=20, handle=0x4040),
        "FREE block 101: Tail ticket 4 -> slot 0, not consumed yet -> deferred")
    print(f"   ring: {slots()}   deferred frees: {m.shared_ring.pending_count()}")
    print("\n-- X's chain resumes")
    acts = show(m.release("X"))
    check(completion(acts).block_offset // bs == 100, "X got block 100")
    print(f"   ring: {slots()}")
    acts = req(m, "Y", codec.AllocStore(request_id=21, handle=0x4043, flags=ReqFlags.INLINE.value,
                                        data=codec.DataDesc(0, 0, 1), inline=b"Y"),
               "ALLOC_STORE (ticket 4)")
    check(completion(acts).block_offset // bs == 101, "ticket 4 got block 101")
    summary(m, "target 2")


def direct_alloc():
    print("\n== 4. DIRECT_ALLOC + BIND, DIRECT_LOAD, Ticket Timeout")
    cfg = TargetConfig(block_size=4096, num_blocks=16, direct_partitions=1, direct_quota=4,
                       ticket_timeout_ms=50)
    m = TargetModel(cfg)
    ack = hello(m, "D", 0xD1, (Features.DIRECT_ALLOC | Features.DIRECT_LOAD).value)
    n = ack.ring.count.bit_length() - 1
    mask = (1 << 63) | (1 << 31) | (1 << (n + 3))
    old = m.remote_fetch_add("D", ack.head.stag, ack.head.tagged_offset, 0x0000000100000010,
                             mask, now_ms=0)
    ticket, off = old >> 32, old & 0xFFFFFFFF
    seq, boff = codec.decode_slot(m.remote_read("D", ack.ring.stag, off, 16))
    print(f"   D: FetchAdd on Head -> ticket {ticket}, slot offset {off}; "
          f"slot: sequence {seq}, block offset {boff:#x}")
    m.remote_write("D", ack.partition.stag, boff, b"one-sided KV block")
    print(f"   D: RDMA Write of 18 octets to {boff:#x} through the Partition STag")
    acts = req(m, "D", codec.Bind(request_id=1, handle=ack.handle_base, ticket=ticket,
                                  data_length=18, block_offset=boff), "BIND", now=1)
    check(completion(acts).status == 0, "BIND OK")
    raw = m.remote_read("D", ack.table.stag, 16 * (ack.handle_base - ack.table_base_handle), 16)
    e = codec.decode_entry(raw)
    data = m.remote_read("D", ack.pool.stag, e.block_offset, e.data_length)
    print(f"   D: direct load: entry {e}, block {data!r}")
    old = m.remote_fetch_add("D", ack.head.stag, ack.head.tagged_offset, 0x0000000100000010,
                             mask, now_ms=10)
    print(f"   D: takes ticket {old >> 32} and never binds it")
    print("\n-- tick(70 ms): the ticket is older than the 50 ms Ticket Timeout")
    show(m.tick(70))
    acts = req(m, "D", codec.Bind(request_id=2, handle=ack.handle_base + 1, ticket=old >> 32,
                                  data_length=1, block_offset=boff + 4096), "late BIND", now=71)
    check(completion(acts).status == Status.TICKET_ABANDONED.value, "late BIND -> "
          "TICKET_ABANDONED")
    req(m, "D", codec.Goodbye(), "GOODBYE (bindings retained)", now=80)
    print("\n-- tick(2000 ms): retention expired")
    show(m.tick(2000))
    summary(m, "target 3")


def main(argv=None):
    draft_examples()
    deferred_free()
    direct_alloc()
    if _failures:
        print(f"\nFAILED checks: {_failures}")
        return 1
    print("\nAll checks passed.")
    return 0


if __name__ == "__main__":
    sys.exit(main())

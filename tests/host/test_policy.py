# Ref: issue 19 item 3 (one policy module for what the driver and the golden model decide alike);
#      host/policy.py; model/target.py "Readings of the draft".
"""The shared decisions of host/policy.py on plain values, and that the host driver and the golden
model both take them from there (their replies are compared octet for octet in test_driver.py)."""

from hw.headers import Features, GoodbyeFlags, Opcode, ReqFlags, Status
from host import codec, policy
from host.config import TargetConfig
from host.driver import _Session
from host.policy import PartitionState, SessionState
from model.target import Session, TargetModel

DL, DA = Features.DIRECT_LOAD.value, Features.DIRECT_ALLOC.value
RC, LE = Features.RECORD_COMPLETION.value, Features.ADDR_LE.value
VALID, SEALED = policy.VALID, policy.SEALED


def cfg_(**kw):
    base = dict(block_size=256, num_blocks=8, num_handles=64, handles_per_initiator=16,
                quota_per_initiator=3)
    base.update(kw)
    return TargetConfig(**base)


def session(cfg, iid=1, ri=0, quota=2, **kw):
    hpi = cfg.handles_per_initiator
    return SessionState(iid, cfg.domain_of(iid), ri, cfg.table_base_handle + ri * hpi, hpi,
                        quota, **kw)


def hello(iid, features=0, credits=4):
    return codec.encode(codec.Hello(initiator_id=iid, requested_features=features,
                                    completion_credits=credits))


def entry(flags=0, gen=5, dlen=0, boff=0):
    return {"flags": flags, "generation": gen, "data_length": dlen, "block_offset": boff}


def test_both_sides_keep_the_policy_state():
    assert issubclass(Session, SessionState) and issubclass(_Session, SessionState)
    m = TargetModel(cfg_(direct_partitions=1, direct_quota=2))
    assert all(isinstance(p, PartitionState) for p in m.partitions)


def test_generation_wraps_past_zero():
    assert policy.next_generation(1) == 2
    assert policy.next_generation(0xFFFF) == 1
    assert not policy.stale(codec.Free(generation=0), entry(gen=9))      # 0: any generation
    assert policy.stale(codec.Free(generation=8), entry(gen=9))
    assert not policy.stale(codec.Free(generation=9), entry(gen=9))


def test_validation_order():
    cfg = cfg_()
    big = codec.DataDesc(1, 0, cfg.block_size + 1)
    stale = dict(generation=4)                       # the entry has 5
    # length before generation; stores and BIND only
    assert policy.check_entry(cfg, Opcode.STORE, codec.Store(data=big, **stale),
                              entry(VALID)) is Status.TOO_LARGE
    assert policy.check_entry(cfg, Opcode.ALLOC_STORE, codec.AllocStore(data=big, **stale),
                              entry()) is Status.TOO_LARGE
    assert policy.check_entry(cfg, Opcode.BIND,
                              codec.Bind(data_length=cfg.block_size + 1, **stale),
                              entry()) is Status.TOO_LARGE
    # a LOAD destination may be larger than a block; generation before the entry's state
    assert policy.check_entry(cfg, Opcode.LOAD, codec.Load(data=big, **stale),
                              entry()) is Status.STALE_GENERATION
    assert policy.check_entry(cfg, Opcode.FREE, codec.Free(**stale),
                              entry()) is Status.STALE_GENERATION
    ok = codec.DataDesc(1, 0, 8)
    checks = [
        (Opcode.LOAD, codec.Load(data=ok), entry(), Status.NOT_VALID),
        (Opcode.LOAD, codec.Load(data=ok), entry(VALID), Status.NOT_SEALED),
        (Opcode.LOAD, codec.Load(data=ok, flags=ReqFlags.ALLOW_UNSEALED.value),
         entry(VALID, dlen=9), Status.TOO_LARGE),
        (Opcode.LOAD, codec.Load(data=ok), entry(VALID | SEALED, dlen=8), None),
        (Opcode.STORE, codec.Store(data=ok), entry(), Status.NOT_VALID),
        (Opcode.STORE, codec.Store(data=ok), entry(VALID | SEALED), Status.SEALED),
        (Opcode.STORE, codec.Store(data=ok), entry(VALID), None),
        (Opcode.ALLOC_STORE, codec.AllocStore(data=ok), entry(VALID), Status.ALREADY_BOUND),
        (Opcode.ALLOC_STORE, codec.AllocStore(data=ok), entry(), None),
        (Opcode.FREE, codec.Free(), entry(), Status.NOT_VALID),
        (Opcode.FREE, codec.Free(), entry(VALID), None),
        (Opcode.BIND, codec.Bind(), entry(VALID), Status.ALREADY_BOUND),
        (Opcode.BIND, codec.Bind(), entry(), None),
    ]
    for op, msg, e, want in checks:
        assert policy.check_entry(cfg, op, msg, e) is want, (op, msg, e)
    assert policy.check_quota(2, 2) is Status.NO_SPACE and policy.check_quota(1, 2) is None
    assert policy.check_ring(0) is Status.NO_SPACE and policy.check_ring(1) is None


def test_authorization_load_reads_its_domain():
    cfg = cfg_(trust_domains={2: 7})
    a, b = session(cfg, 1, 0), session(cfg, 2, 1)
    sessions = [a, b]
    h_b = b.handle_base
    assert policy.authorize(cfg, Opcode.STORE, a, h_b, sessions) is Status.INVALID_HANDLE
    assert policy.authorize(cfg, Opcode.LOAD, a, h_b, sessions) is Status.INVALID_HANDLE
    assert policy.authorize(cfg, Opcode.LOAD, a, a.handle_base, sessions) is None
    free = cfg.table_base_handle + 2 * cfg.handles_per_initiator       # a range nobody holds
    assert policy.authorize(cfg, Opcode.LOAD, a, free, sessions) is None
    outside = cfg.table_base_handle + cfg.num_handles
    assert policy.authorize(cfg, Opcode.LOAD, a, outside, sessions) is Status.INVALID_HANDLE


def test_features_follow_domains_and_addr_le():
    cfg = cfg_(direct_partitions=1, direct_quota=2)
    every = DL | DA | RC | LE
    assert policy.negotiate_features(cfg, 0, every) == DL | DA | RC     # no ADDR_LE offered
    assert policy.negotiate_features(cfg, 3, every) == RC               # untrusted domain
    two = cfg_(direct_partitions=1, direct_quota=2, trust_domains={9: 1},
               direct_domains=frozenset({0, 1}))
    assert policy.negotiate_features(two, 0, every) == DA | RC          # the Pool reaches all
    assert not policy.direct_load_possible(two) and policy.direct_load_possible(cfg)
    le = cfg_(addr_le=True, direct_partitions=1, direct_quota=2)
    assert policy.negotiate_features(le, 0, every) == every
    assert policy.negotiate_features(le, 0, DL | DA) == 0               # structures are LE


def test_quota_is_capped_by_the_shared_blocks():
    cfg = cfg_(num_blocks=8, quota_per_initiator=3, quotas={5: 6})
    s = [session(cfg, 1, 0, quota=3), session(cfg, 2, 1, quota=3)]
    assert policy.session_quota(cfg, 3, s) == 2
    assert policy.session_quota(cfg, 5, s[:1]) == 5
    assert policy.session_quota(cfg_(overcommit_quotas=True), 3, s) == 3
    parted = [session(cfg, 1, 0, quota=3, partition=0)]                 # not a shared quota
    assert policy.session_quota(cfg, 3, parted) == 3


def test_plan_hello():
    cfg = cfg_(num_handles=32, direct_partitions=1, direct_quota=2)
    plan = policy.plan_hello(cfg, b"\x01", conn_has_session=False, sessions={},
                             partition_owners=[None])
    assert (plan.status, plan.disconnect) == (Status.MALFORMED, "malformed HELLO")
    plan = policy.plan_hello(cfg, hello(1), conn_has_session=True, sessions={},
                             partition_owners=[None])
    assert (plan.status, plan.disconnect) == (Status.MALFORMED, None)
    plan = policy.plan_hello(cfg, hello(1, DA | RC, credits=7), conn_has_session=False,
                             sessions={}, partition_owners=[None])
    assert plan.status is Status.OK and plan.features == DA | RC and plan.partition == 0
    assert plan.new == dict(initiator_id=1, domain=0, range_index=0,
                            handle_base=cfg.table_base_handle, handle_count=16, quota=2)
    a = SessionState(**plan.new)
    a.attach("c1", plan.features, plan.msg.completion_credits)
    assert a.active and a.direct_alloc and a.completion_credits == 7
    plan = policy.plan_hello(cfg, hello(1), conn_has_session=False, sessions={1: a},
                             partition_owners=[1])
    assert (plan.status, plan.disconnect) == (Status.ALREADY_BOUND,
                                              "Initiator ID has an active session")
    # the partition is taken: a shared-ring session with the capped quota
    plan = policy.plan_hello(cfg, hello(2, DA), conn_has_session=False, sessions={1: a},
                             partition_owners=[1])
    assert plan.features == 0 and plan.partition is None and plan.new["quota"] == 3
    b = SessionState(**plan.new)
    plan = policy.plan_hello(cfg, hello(3), conn_has_session=False, sessions={1: a, 2: b},
                             partition_owners=[1])
    assert (plan.status, plan.disconnect) == (Status.NO_SPACE, "no free handle range")
    # a retained session comes back as it was, DIRECT_ALLOC only with its partition
    b.retain(10.0, 5.0)
    assert not b.active and not b.expired(14.9) and b.expired(15.0)
    plan = policy.plan_hello(cfg, hello(2, DA | RC), conn_has_session=False,
                             sessions={1: a, 2: b}, partition_owners=[1])
    assert plan.session is b and plan.new is None and plan.features == RC


def test_hello_ack_and_windows_agree():
    cfg = cfg_(direct_partitions=2, direct_quota=2)
    lay = cfg.layout()
    s = session(cfg, 1, 0, quota=2, partition=1)
    s.attach(0, DL | DA, 1)
    stags = policy.new_stags(0x0D000000)
    assert stags == (0x0D000100, 0x0D000200, 0x0D000300)
    f = policy.hello_ack_fields(cfg, lay, s, stags)
    assert f["allocation_quota"] == 2 and f["features"] == DL | DA
    assert f["table"] == codec.DirectDesc(cfg.table_stag, 0, cfg.num_handles)
    part, ring, head = policy.partition_windows(cfg, lay, 1, stags)
    assert (part.stag, part.base_to) == (f["partition"].stag, f["partition"].tagged_offset)
    assert part.length == f["partition"].count * cfg.block_size and part.access == "w"
    assert policy.block_home(cfg, part.base_to) == 1
    assert policy.block_addr(cfg, lay, part.base_to) == part.addr
    assert (ring.stag, ring.access, head.stag, head.access) == (stags[1], "r", stags[2], "a")
    assert ring.length == 16 * f["ring"].count and head.length == 8
    table, pool = policy.direct_load_windows(cfg, lay)
    assert (table.stag, pool.stag, pool.base_to) == (cfg.table_stag, cfg.pool_stag,
                                                     cfg.pool_to_base)
    plain = session(cfg, 2, 1)
    plain.attach(1, RC, 1)
    assert "table" not in policy.hello_ack_fields(cfg, lay, plain)
    assert "partition" not in policy.hello_ack_fields(cfg, lay, plain)


def test_blocks_go_home_and_are_cleared_across_domains():
    cfg = cfg_(num_blocks=8, direct_partitions=2, direct_quota=2, trust_domains={4: 1})
    assert cfg.shared_blocks == 4
    assert [policy.block_home(cfg, cfg.block_offset(i)) for i in range(8)] == \
        [None] * 4 + [0, 0, 1, 1]
    assert policy.clear_on_return(cfg, 0, None) and not policy.clear_on_return(cfg, 0, 1)
    assert not policy.clear_on_return(cfg_(), 0, None)       # one domain: nothing to clear
    p = PartitionState(0, None, 4)
    a, b = session(cfg, 1, 0), session(cfg, 4, 1)
    assert not p.assign(a) and a.partition == 0 and p.owner == 1
    assert p.assign(b)                                       # another domain than the last


def test_partition_tickets():
    p = PartitionState(0, None, 0, seen=0xFFFFFFFE)
    p.observe(1, now=5.0)                                    # the Head ticket wrapped
    assert p.outstanding == {0xFFFFFFFE: 5.0, 0xFFFFFFFF: 5.0, 0: 5.0} and p.seen == 1
    p.took(1)
    assert p.seen == 2 and p.in_use() == 3
    assert not p.timed_out(104.9, 100) and p.timed_out(105.0, 100)
    s = SessionState(1, 0, 0, 0, 4, 4, partition=0)
    s.attach("c", DA, 0)
    assert policy.check_ticket(s, p, 7) is Status.MALFORMED          # not taken
    assert policy.check_ticket(s, None, 0) is Status.MALFORMED       # no partition
    assert policy.check_ticket(s, p, 0) is None
    p.abandon()
    assert p.to_reclaim == [0xFFFFFFFE, 0xFFFFFFFF, 0] and not p.outstanding
    assert policy.check_ticket(s, p, 0) is Status.TICKET_ABANDONED and p.in_use() == 3
    assert policy.quota_use(2, p, pending=1) == 6 and policy.quota_use(2) == 2
    assert policy.check_slot(5, 5, 0x100, 0x100) is None
    assert policy.check_slot(5, 5, 0x100, 0x200) is Status.MALFORMED
    assert policy.check_slot(5, 1, 0x100, 0x100) is Status.NO_SPACE
    assert policy.check_slot(5, 5, (1 << 64) - 1, 0x100) is Status.NO_SPACE   # consumed


def test_screen_and_completions():
    cfg = cfg_()
    s = session(cfg)
    s.attach(0, RC, 1)
    free = codec.encode(codec.Free(request_id=7, handle=s.handle_base))
    assert policy.screen(cfg, free, None) == (None, Status.MALFORMED)   # before HELLO
    msg, st = policy.screen(cfg, free, s)
    assert st is None and msg.request_id == 7
    both = (ReqFlags.RECORD | ReqFlags.INVALIDATE).value
    load = codec.encode(codec.Load(flags=both, data=codec.DataDesc(3, 0, 8),
                                   completion=codec.ComplDesc(4, 0)))
    assert policy.screen(cfg, load, s) == (None, Status.MALFORMED)
    s.features = 0                                  # RECORD ignored: INVALIDATE is honoured
    msg, st = policy.screen(cfg, load, s)
    assert st is None and policy.invalidate_stag(msg) == 3
    assert policy.record_descriptor(msg, s) is None
    s.features = RC
    assert policy.record_descriptor(msg, s) == codec.ComplDesc(4, 0)
    rec, imm = policy.completion_record(codec.Free(request_id=(1 << 40) | 9), Status.OK, 2)
    assert imm == 9 and codec.decode_record(rec).generation == 2
    short = free[:15]                               # Request ID arrived, Block Handle not
    c = codec.decode(policy.raw_completion(short, s, Status.MALFORMED))
    assert (c.request_id, c.handle, c.status) == (7, 0, Status.MALFORMED.value)
    assert policy.op_name(b"\x01") == "SHORT" and policy.op_name(b"\x01\xee") == "OPCODE_0xee"
    assert policy.is_hello(hello(1)) and not policy.is_hello(free)
    assert policy.goodbye_releases(codec.Goodbye(flags=GoodbyeFlags.RELEASE.value))
    assert policy.alloc_flags(codec.AllocStore(flags=ReqFlags.SEAL.value)) == VALID | SEALED


def test_entry_writes_keep_the_draft_order():
    cfg = cfg_(addr_le=True)
    lay = cfg.layout()
    h = cfg.table_base_handle + 3
    a = policy.entry_addr(cfg, lay, h)
    (w1, d1), (w2, d2) = policy.bind_writes(cfg, lay, h, VALID, 6, 10, 0x300)
    assert (w1, w2) == (a + 4, a) and len(d1) == 12 and len(d2) == 4
    e = policy.decode_entry(cfg, d2 + d1)
    assert e == {"flags": VALID, "generation": 6, "data_length": 10, "block_offset": 0x300}
    assert policy.unbind_writes(cfg, lay, h, 7) == [(a, bytes([0, 0, 0, 7]))]
    assert policy.store_writes(cfg, lay, h, e, 5, seal=True) == \
        [(a + 4, (5).to_bytes(4, "big")), (a, (VALID | SEALED).to_bytes(2, "big"))]
    assert policy.store_writes(cfg, lay, h, e, 5, seal=False) == [(a + 4, (5).to_bytes(4, "big"))]

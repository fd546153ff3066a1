# Ref: draft KBTP §Operations, §Completion, §Direct Modes, §Status Codes, §Allocation Quotas.
#      Guest side of tests/system/test_e2e.py (runs under the guest's python3 + pyverbs).
"""Guest script: every KBTP operation against the target, each check printed on one line.

``python3 ops.py SIZES SEED [PART...]``: SIZES is a comma list of block payload sizes; PARTs
choose sections (default all): ``sizes``, ``ops``, ``errors``, ``direct``, ``pipeline``,
``record``, ``invalidate``, ``abandon``.

Output: one line per check and a SUMMARY line last, exit status 1 if any check failed
(tests/e2e/guestcheck.py); ``ENTRY <handle> <flags> <generation> <data_length>`` for handles
the host test compares with the model's table; ``TIME <name> <seconds> <octets>`` per transfer.
The oracle for data is the data this script generated (seeded random octets), for statuses
the draft's rules.
"""

import random
import sys
import time

import guestcheck
from host import codec
from host.initiator import ALL_FEATURES, KbtpClient, KbtpStatusError, env_target
from hw.headers import Features, ReqFlags

# Two sessions: one without DIRECT_ALLOC, whose LOAD/STORE/ALLOC_STORE/FREE the target runs in
# the NIC (the engine's fast path: nothing for its host), for the sections below; and one with
# every feature (DIRECT_ALLOC sessions are served by the target's host) for the others.
FAST_FEATURES = ALL_FEATURES & ~Features.DIRECT_ALLOC.value
FAST_PARTS = ("sizes", "ops", "pipeline", "record", "invalidate")

SIZES = [int(x) for x in sys.argv[1].split(",")] if len(sys.argv) > 1 else [64, 4096]
RNG = random.Random(int(sys.argv[2]) if len(sys.argv) > 2 else 1)
PARTS = set(sys.argv[3:]) or {"sizes", "ops", "errors", "direct", "pipeline", "record",
                              "invalidate", "abandon"}
CHECKS = guestcheck.Checks()
check = CHECKS.check


def expect_status(name, status, fn):
    """Run ``fn``; the check passes when it raises KbtpStatusError with ``status``."""
    return CHECKS.expect_status(name, status, fn, error=KbtpStatusError)


def blob(n):
    return guestcheck.blob(RNG, n)


def entry(c, h):
    """Print the ENTRY line the host compares with the model (uses DIRECT_LOAD's table READ)."""
    if c.session.table is None:
        return
    s = c.session
    raw = c.rdma_read(s.table.stag, s.table.tagged_offset + 16 * (h - s.table_base_handle), 16)
    e = codec.decode_entry(raw, addr_le=c.addr_le)
    print(f"ENTRY {h:#x} {e.flags} {e.generation} {e.data_length}", flush=True)


def section_sizes(c):
    """ALLOC_STORE (sealed) + LOAD + FREE per size; timing per transfer."""
    bs = c.session.block_size
    for n in SIZES:
        if n > bs:
            continue
        h = c.handle(0)
        data = blob(n)
        t0 = time.monotonic()
        comp = c.alloc_store(h, data, seal=True, inline=False)
        t1 = time.monotonic()
        r = c.load(h, length=n)
        t2 = time.monotonic()
        print(f"TIME alloc_store {t1 - t0:.4f} {n}", flush=True)
        print(f"TIME load {t2 - t1:.4f} {n}", flush=True)
        check(f"size{n}.alloc_store", comp.data_length == n, f"gen={comp.generation}")
        check(f"size{n}.load", r.data == data and r.completion.data_length == n,
              f"{len(r.data)} octets")
        if c.session.table is not None:
            t3 = time.monotonic()
            d = c.direct_load(h)
            print(f"TIME direct_load {time.monotonic() - t3:.4f} {n}", flush=True)
            check(f"size{n}.direct_load", d.data == data and d.entry.generation ==
                  comp.generation)
        f = c.free(h, generation=comp.generation)
        check(f"size{n}.free", f.generation != comp.generation, f"gen {comp.generation}->"
              f"{f.generation}")


def section_ops(c):
    """STORE/SEAL rules and generations on handle 1."""
    h = c.handle(1)
    d1, d2, d3 = blob(300), blob(700), blob(100)
    a = c.alloc_store(h, d1, seal=False)
    g = a.generation
    check("ops.alloc_store_unsealed", a.data_length == 300 and g != 0, f"gen={g}")
    expect_status("ops.load_unsealed_NOT_SEALED", "NOT_SEALED", lambda: c.load(h, length=4096))
    r = c.load(h, length=4096, allow_unsealed=True)
    check("ops.load_allow_unsealed", r.data == d1)
    s = c.store(h, d2, seal=False, inline=False)
    check("ops.store", s.data_length == 700 and s.generation == g, f"gen={s.generation}")
    r = c.load(h, length=4096, allow_unsealed=True)
    check("ops.load_after_store", r.data == d2)
    s = c.store(h, d3, seal=True, inline=True)
    check("ops.store_inline_seal", s.data_length == 100 and s.generation == g)
    r = c.load(h, length=4096, generation=g)
    check("ops.load_sealed_with_gen", r.data == d3 and r.completion.generation == g)
    expect_status("ops.store_after_seal_SEALED", "SEALED", lambda: c.store(h, d1))
    expect_status("ops.load_wrong_gen_STALE_GENERATION", "STALE_GENERATION",
                  lambda: c.load(h, length=4096, generation=(g % 0xFFFF) + 1))
    expect_status("ops.free_wrong_gen_STALE_GENERATION", "STALE_GENERATION",
                  lambda: c.free(h, generation=(g % 0xFFFF) + 1))
    f = c.free(h, generation=g)
    check("ops.free_new_generation", f.generation not in (0, g), f"gen {g}->{f.generation}")
    expect_status("ops.load_freed_NOT_VALID", "NOT_VALID", lambda: c.load(h, length=64))
    expect_status("ops.free_freed_NOT_VALID", "NOT_VALID", lambda: c.free(h))
    expect_status("ops.store_freed_NOT_VALID", "NOT_VALID", lambda: c.store(h, d1))
    a2 = c.alloc_store(h, d1, seal=True)
    check("ops.rebind_new_generation", a2.generation not in (0, g),
          f"gen {g}->{f.generation}->{a2.generation}")
    expect_status("ops.load_old_gen_STALE_GENERATION", "STALE_GENERATION",
                  lambda: c.load(h, length=4096, generation=g))
    entry(c, h)
    c.free(h)


def section_errors(c):
    """A status error of each kind an initiator can provoke (besides those in ``ops``)."""
    s = c.session
    h = c.handle(2)
    outside = s.handle_base + s.handle_count
    # LOAD may read any handle of the table (same trust domain): only one outside the table
    # is invalid for it.
    expect_status("err.INVALID_HANDLE_load", "INVALID_HANDLE", lambda: c.load(1, length=64))
    expect_status("err.INVALID_HANDLE_alloc", "INVALID_HANDLE",
                  lambda: c.alloc_store(s.handle_base - 1 if s.handle_base else outside, b"x"))
    a = c.alloc_store(h, blob(64), seal=True)
    expect_status("err.ALREADY_BOUND", "ALREADY_BOUND", lambda: c.alloc_store(h, b"again"))
    expect_status("err.TOO_LARGE_load_buffer", "TOO_LARGE", lambda: c.load(h, length=16))
    big = c.register(s.block_size + 1)
    expect_status("err.TOO_LARGE_store", "TOO_LARGE", lambda: c.call(c.store_msg(
        h, big, alloc=True)))
    # MALFORMED: a LOAD with the INLINE flag (the codec of the target rejects it).
    bad = codec.encode(codec.Load(flags=ReqFlags.INLINE.value, request_id=900, handle=h,
                                  data=codec.DataDesc(c._scratch.rkey, c._scratch.addr, 64)),
                       addr_le=c.addr_le, strict=False)
    c.submit_raw(bad, 900)
    comp, _ = c.wait(900, check=False)
    check("err.MALFORMED", comp.status == 9, f"status={comp.status}")
    # NO_SPACE: bind handles until the quota is used up (h is bound already).
    q = s.allocation_quota
    bound = [h]
    got = None
    for i in range(3, 3 + q + 1):
        try:
            c.alloc_store(c.handle(i), blob(64), inline=True)
            bound.append(c.handle(i))
        except KbtpStatusError as exc:
            got = exc.status_name
            break
    check("err.NO_SPACE_quota", got == "NO_SPACE" and len(bound) == q,
          f"bound {len(bound)} of quota {q}, then {got}")
    for b in bound:
        c.free(b)
    check("err.recovered_after_frees", c.alloc_store(h, b"ok", inline=True).data_length == 2)
    c.free(h)


def section_direct(c):
    """DIRECT_LOAD of a sealed and an unsealed block; DIRECT_ALLOC + BIND."""
    s = c.session
    if s.table is None or s.head is None:
        check("direct.granted", False, f"features={s.features:#x}")
        return
    h = c.handle(4)
    data = blob(min(5000, s.block_size))       # several packets at MTU 1024
    a = c.alloc_store(h, data, seal=True)
    d = c.direct_load(h)
    check("direct.load", d.data == data and d.entry.generation == a.generation)
    c.free(h)
    c.alloc_store(h, b"unsealed", inline=True)
    expect_status("direct.load_unsealed", "NOT_SEALED", lambda: c.direct_load(h))
    c.free(h)
    payload = blob(3000)
    t0 = time.monotonic()
    t = c.direct_alloc(payload)
    b = c.bind(h, t)
    print(f"TIME direct_alloc_bind {time.monotonic() - t0:.4f} {len(payload)}", flush=True)
    check("direct.alloc_bind", b.data_length == 3000 and b.block_offset == t.block_offset,
          f"ticket={t.ticket} offset={t.block_offset:#x} gen={b.generation}")
    r = c.load(h, length=4096, allow_unsealed=True)
    check("direct.load_after_bind", r.data == payload)
    expect_status("direct.bind_again_MALFORMED", "MALFORMED", lambda: c.bind(c.handle(5), t))
    expect_status("direct.bind_bound_ALREADY_BOUND", "ALREADY_BOUND", lambda: c.bind(h, t))
    entry(c, h)
    t2 = c.direct_alloc(b"second")
    c.bind(c.handle(5), t2)
    r = c.load(c.handle(5), length=64, allow_unsealed=True)
    check("direct.second_ticket", r.data == b"second" and t2.ticket == t.ticket + 1,
          f"tickets {t.ticket},{t2.ticket}")
    c.free(h)
    c.free(c.handle(5))


def section_pipeline(c):
    """Requests up to the credits in flight: one block loaded many times at once."""
    h = c.handle(6)
    data = blob(2048)
    c.alloc_store(h, data, seal=True)
    n = c.credits
    bufs = [c.register(2048) for _ in range(n)]
    t0 = time.monotonic()
    rids = [c.submit(c.load_msg(h, b)) for b in bufs]
    comps = [c.wait(r)[0] for r in rids]
    dt = time.monotonic() - t0
    print(f"TIME pipelined_loads {dt:.4f} {n * 2048}", flush=True)
    check("pipeline.loads", all(b.read(2048) == data for b in bufs) and
          all(x.status == 0 for x in comps), f"{n} in flight")
    c.free(h)


def section_record(c):
    """RECORD: the completion arrives as a record by RDMA Write with Immediate."""
    if not c.session.features & 0x4:
        check("record.granted", False)
        return
    h = c.handle(7)
    data = blob(200)
    c.alloc_store(h, data, seal=True)
    rec = c.register(24)
    r = c.load(h, length=256, record=rec)
    check("record.load", r.recorded and r.data == data and r.completion.data_length == 200)
    c.free(h)


def section_invalidate(c):
    """INVALIDATE: the LOAD's destination is a memory window the target's Send invalidates."""
    h = c.handle(8)
    data = blob(1000)
    c.alloc_store(h, data, seal=True)
    buf = c.register(1024)
    w = c.window(buf)
    r = c.load(h, buf=w, invalidate=True)
    # rxe reports IBV_WC_WITH_INV only to kernel consumers (seen: wc_flags 0 here), so the
    # invalidated R_Key is compared when present; invalidate_after() proves the effect.
    check("invalidate.load", r.data == data and r.invalidated_rkey in (None, w.rkey),
          f"window rkey={w.rkey:#x} reported={r.invalidated_rkey}")
    c.free(h)


def invalidate_after():
    """A second connection: LOAD with INVALIDATE into a window, then LOAD into the same window
    again. The second LOAD's RDMA Write must fail at our NIC (window invalid): the target's QP
    gets a remote access NAK and no COMPLETION comes. Run last (the connection dies).

    What this side sees of it (IBA class C responder error, rxe: RESPST_ERR_RKEY_VIOLATION): our
    NIC NAKs the WRITE (remote access error; the WC status IBV_WC_REM_ACCESS_ERR is the
    requester's, i.e. the target's: tests/system/test_e2e.py checks that NAK on the wire) and moves our
    QP to the error state, which flushes our posted receives. So the check requires a receive
    completion with IBV_WC_WR_FLUSH_ERR and the QP in IBV_QPS_ERR; a timeout (nothing at all
    happened) or any other failure does not pass."""
    import pyverbs.enums as ve

    from host.initiator import KbtpTransportError

    c = KbtpClient(env_target(), initiator_id=12, features=FAST_FEATURES)
    h = c.handle(0)
    data = blob(512)
    c.alloc_store(h, data, seal=True)
    w = c.window(c.register(512))
    r = c.load(h, buf=w, invalidate=True)
    check("invalidate.first_load", r.data == data, f"window rkey={w.rkey:#x}")
    print(f"WINDOW {w.rkey:#x}", flush=True)
    try:
        c.wait(c.submit(c.load_msg(h, w)), timeout_s=8)
        check("invalidate.window_dead", False, "second LOAD into the window completed")
    except KbtpTransportError as exc:
        state = c.qp_state()
        check("invalidate.window_dead",
              exc.wc_status == ve.IBV_WC_WR_FLUSH_ERR and state == ve.IBV_QPS_ERR,
              f"{exc} (wc_status {exc.wc_status}, want IBV_WC_WR_FLUSH_ERR "
              f"{ve.IBV_WC_WR_FLUSH_ERR}); QP state {state} (want IBV_QPS_ERR {ve.IBV_QPS_ERR})")


def section_abandon(c):
    """A ticket not bound within the Ticket Timeout: BIND gets TICKET_ABANDONED."""
    s = c.session
    if s.head is None:
        return
    t = c.direct_alloc(b"late")
    time.sleep(s.ticket_timeout_ms / 1000 * 1.5 + 0.5)
    expect_status("abandon.TICKET_ABANDONED", "TICKET_ABANDONED", lambda: c.bind(c.handle(9), t))


def main():
    t0 = time.monotonic()
    clients = {}
    for iid, feats in ((11, ALL_FEATURES), (13, FAST_FEATURES)):
        c = clients[iid] = KbtpClient(env_target(), initiator_id=iid, features=feats)
        s = c.session
        print(f"SESSION id={iid} features={s.features:#x} credits={s.request_credits} "
              f"block={s.block_size} quota={s.allocation_quota} "
              f"handles={s.handle_base:#x}+{s.handle_count} addr_le={c.addr_le} "
              f"ticket_timeout={s.ticket_timeout_ms} connect={time.monotonic() - t0:.2f}s",
              flush=True)
    for name in ("sizes", "ops", "errors", "direct", "pipeline", "record", "invalidate",
                 "abandon"):
        if name in PARTS:
            t1 = time.monotonic()
            c = clients[13 if name in FAST_PARTS else 11]
            CHECKS.guarded(f"{name}.exception", lambda: globals()["section_" + name](c))
            print(f"SECTION {name} {time.monotonic() - t1:.2f}s", flush=True)
    for c in clients.values():
        c.goodbye(release=True)
        print(f"STATS {c.stats}")
    if "invalidate" in PARTS:
        CHECKS.guarded("invalidate.after_exception", invalidate_after)
    CHECKS.finish()


main()

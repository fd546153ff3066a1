# Ref: draft KBTP §Examples, §Operations, §Direct Modes; make demo.
"""Guest side of ``make demo``: a KV-cache-like session, logged readably with timings.

Stores a few "KV blocks" of different sizes (inline and by RDMA READ), loads them back, shows
generations and a stale-generation rejection, a DIRECT_LOAD and a DIRECT_ALLOC + BIND, a
pipelined batch of loads, then GOODBYE. Every step prints what moved, where, and how long it
took; a summary closes. Exit 1 if any loaded data differs from what was stored.

Each step also prints one machine-readable line, ``STEP <n> rids=<comma list> wall_ms=<ms>
what=<description>``: the Request IDs of the KBTP requests the step sent (empty for one-sided
RDMA alone), so the host (``tools.serve_demo``) can put the target's own time, from ``kbtp-sim
serve --stats-file``, beside the guest's wall time (issue 24).
"""

import hashlib
import sys
import time

from host.initiator import KbtpClient, KbtpStatusError, env_target

moved = {"to_target": 0, "from_target": 0}
bad = 0
t_start = time.monotonic()


c = None
n_steps = 0


def step(what, fn, octets=0, direction=None):
    global n_steps
    rid0 = c._next_rid if c is not None else 0      # HELLO (the connect step) has Request ID 0
    t0 = time.monotonic()
    r = fn()
    ms = (time.monotonic() - t0) * 1e3
    rate = f", {octets / ms:9.1f} kB/s" if octets and ms else ""
    print(f"  {what:<58} {ms:8.2f} ms{rate}", flush=True)
    rids = range(rid0, c._next_rid) if c is not None else [0]
    n_steps += 1
    print(f"STEP {n_steps} rids={','.join(map(str, rids))} wall_ms={ms:.3f} what={what}",
          flush=True)
    if direction:
        moved[direction] += octets
    return r


def pattern(tag, n):
    out = bytearray()
    i = 0
    while len(out) < n:
        out += hashlib.sha256(f"{tag}:{i}".encode()).digest()
        i += 1
    return bytes(out[:n])


def verify(name, got, want):
    global bad
    ok = got == want
    bad += not ok
    print(f"    {'ok' if ok else 'MISMATCH'}: {name} ({len(got)} octets, sha256 "
          f"{hashlib.sha256(got).hexdigest()[:16]})", flush=True)


print(f"[demo] connecting to KBTP target {env_target()} (rdma_cm port 18515)", flush=True)
c = step("connect (rdma_cm REQ/REP/RTU) + HELLO/HELLO_ACK",
         lambda: KbtpClient(env_target(), initiator_id=42))
s = c.session
print(f"[demo] session: handles {s.handle_base:#x}..{s.handle_base + s.handle_count - 1:#x}, "
      f"block size {s.block_size}, quota {s.allocation_quota}, credits {s.request_credits}, "
      f"features {s.features:#x}", flush=True)

print("[demo] ALLOC_STORE: the target allocates a block, RDMA READs our data, binds the handle")
blocks = {}
# Four blocks up to the session's block size (the ECPIX-5 core's configuration: 4 KiB).
bs = s.block_size
SIZES = (64, min(1024, bs // 4), bs // 2, bs)
for i, n in enumerate(SIZES):
    h = c.handle(i)
    data = pattern(f"layer{i}", n)
    inline = n <= 64
    comp = step(f"ALLOC_STORE handle {h:#x} {n:6d} octets {'inline' if inline else 'RDMA READ'}",
                lambda: c.alloc_store(h, data, seal=True, inline=inline),
                n, "to_target")
    print(f"    block offset {comp.block_offset:#x}, generation {comp.generation}")
    blocks[h] = (data, comp.generation)

print("[demo] LOAD: the target RDMA WRITEs the block into our buffer, then sends COMPLETION")
for h, (data, gen) in blocks.items():
    r = step(f"LOAD handle {h:#x} generation {gen}", lambda: c.load(h, length=len(data),
                                                                    generation=gen),
             len(data), "from_target")
    verify(f"handle {h:#x}", r.data, data)

h0 = c.handle(0)
print("[demo] FREE + re-ALLOC_STORE: the generation moves on; the old one is refused")
f = step(f"FREE handle {h0:#x}", lambda: c.free(h0))
print(f"    new generation {f.generation}")
step(f"ALLOC_STORE handle {h0:#x} again", lambda: c.alloc_store(h0, b"fresh", seal=True), 5,
     "to_target")
try:
    c.load(h0, length=64, generation=blocks[h0][1])
    print("    unexpected: stale LOAD accepted")
    bad += 1
except KbtpStatusError as exc:
    print(f"    LOAD with the old generation {blocks[h0][1]}: {exc.status_name} (as expected)")

if s.table is not None:
    print("[demo] DIRECT_LOAD: we RDMA READ the table entry and the block ourselves")
    h = c.handle(3)
    r = step(f"DIRECT_LOAD handle {h:#x}", lambda: c.direct_load(h), SIZES[3], "from_target")
    verify(f"handle {h:#x} (direct)", r.data, blocks[h][0])
if s.head is not None:
    print("[demo] DIRECT_ALLOC: FetchAdd on our Head, READ the slot, WRITE the data, BIND")
    # Our partition holds as many blocks as our quota, all bound by now: one goes back first.
    h1 = c.handle(1)
    step(f"FREE handle {h1:#x} (its block returns to our partition's ring)", lambda: c.free(h1))
    data = pattern("direct", bs)
    t = step(f"FetchAdd + slot READ + RDMA WRITE {bs} octets", lambda: c.direct_alloc(data),
             bs, "to_target")
    h = c.handle(10)
    b = step(f"BIND handle {h:#x} to ticket {t.ticket}", lambda: c.bind(h, t))
    print(f"    block offset {b.block_offset:#x}, generation {b.generation}")
    r = c.load(h, length=bs, allow_unsealed=True)
    verify(f"handle {h:#x} (direct alloc)", r.data, data)

print(f"[demo] pipelined LOADs: {c.credits} requests in flight")
h = c.handle(2)
bufs = [c.register(SIZES[2]) for _ in range(c.credits)]


def batch():
    rids = [c.submit(c.load_msg(h, b)) for b in bufs]
    return [c.wait(r)[0] for r in rids]


step(f"{c.credits} x LOAD handle {h:#x} {SIZES[2]} octets", batch, SIZES[2] * c.credits,
     "from_target")
verify("every buffer of the batch", b"".join(b.read() for b in bufs),
       blocks[h][0] * c.credits)

step("GOODBYE (RELEASE): the target frees everything; we disconnect (DREQ)",
     lambda: c.goodbye(release=True))
total = time.monotonic() - t_start
print(f"[demo] summary: {moved['to_target']} octets to the target, {moved['from_target']} "
      f"octets from it, {c.stats['sends']} requests, {c.stats['reads']} RDMA READs and "
      f"{c.stats['atomics']} atomics of ours, {total:.2f} s in the guest; "
      f"{'all data verified' if not bad else f'{bad} MISMATCHES'}", flush=True)
sys.exit(1 if bad else 0)

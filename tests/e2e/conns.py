# Ref: draft KBTP §Session Establishment, §Operations; issue 22 ("the guest opens connections at
#      once and each stores and loads its own blocks; one more connection attempt than the
#      target has QPs gets REJ, not a hang"). Guest side of tests/system/test_e2e.py.
"""Guest script: as many connections at once as the target has QPs, then one more.

``python3 conns.py N BLOCKS SIZE SEED``: opens N connections (rdma_cm + HELLO, initiator IDs
101..100+N) and keeps them all open; each ALLOC_STOREs BLOCKS blocks of SIZE seeded random
octets, interleaved with the others (block k of every connection before block k+1 of any),
then LOADs them back and compares. Then connection N+1 is attempted: it must be refused by
rdma_cm (the target's REJ) within the timeout, not time out. Then connection 1 says GOODBYE
(release) and a new connection (initiator 200) is accepted on the QP that freed, stores and
loads a block, and every connection frees its blocks and says GOODBYE.

Output: one line per check and a SUMMARY line last, exit status 1 if any check failed
(tests/e2e/guestcheck.py). Oracle: the data this script generated.
"""

import random
import sys
import time

import guestcheck
from host.initiator import ALL_FEATURES, KbtpClient, KbtpTransportError, env_target
from hw.headers import Features

# Served in the NIC (no DIRECT_ALLOC: the engine's fast path).
FEATURES = ALL_FEATURES & ~Features.DIRECT_ALLOC.value
N = int(sys.argv[1]) if len(sys.argv) > 1 else 4
BLOCKS = int(sys.argv[2]) if len(sys.argv) > 2 else 2
SIZE = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
RNG = random.Random(int(sys.argv[4]) if len(sys.argv) > 4 else 1)
#: Seconds rdma_cm may take to refuse; a timeout is a failure (the REJ never came).
REFUSE_S = 30
CHECKS = guestcheck.Checks()
check = CHECKS.check


def blob(n):
    return guestcheck.blob(RNG, n)


def store_load(tag, clients, blocks):
    """ALLOC_STORE ``blocks`` blocks on every client (interleaved), LOAD them all back."""
    stored = {}
    for k in range(blocks):
        for i, c in clients.items():
            h, data = c.handle(k), blob(SIZE)
            comp = c.alloc_store(h, data, seal=True, inline=(k % 2 == 0))
            stored[i, k] = (h, data, comp.generation)
            check(f"{tag}.c{i}.b{k}.alloc_store", comp.data_length == SIZE,
                  f"handle {h:#x} gen {comp.generation}")
    for (i, k), (h, data, gen) in stored.items():
        r = clients[i].load(h, length=SIZE, generation=gen)
        check(f"{tag}.c{i}.b{k}.load", r.data == data, f"{len(r.data)} octets")
    return stored


def main():
    t0 = time.monotonic()
    clients = {}
    for i in range(1, N + 1):
        c = clients[i] = KbtpClient(env_target(), initiator_id=100 + i, features=FEATURES)
        s = c.session
        print(f"SESSION c{i} qp_num={c.qp.qp_num:#x} handles={s.handle_base:#x}+"
              f"{s.handle_count} quota={s.allocation_quota} credits={s.request_credits} "
              f"t={time.monotonic() - t0:.2f}s",
              flush=True)
    bases = {c.session.handle_base for c in clients.values()}
    quotas = [c.session.allocation_quota for c in clients.values()]
    check("connect.all_open", len(clients) == N and len(bases) == N and min(quotas) >= BLOCKS,
          f"{len(clients)} connections, {len(bases)} handle ranges, quotas {quotas}")
    stored = store_load("all", clients, BLOCKS)

    # One more than the target has QPs: refused (CM REJ: rdma_connect fails), not a hang.
    t1 = time.monotonic()
    try:
        extra = KbtpClient(env_target(), initiator_id=100 + N + 1, features=FEATURES,
                           connect_timeout_s=REFUSE_S)
        check("extra.refused", False, "connection N+1 was accepted")
        extra.goodbye(release=True)
    except KbtpTransportError as exc:         # the alarm: nobody answered
        check("extra.refused", False, f"no answer: {exc}")
    except Exception as exc:                  # pyverbs: rdma_connect failed (REJ)
        check("extra.refused", True, f"{type(exc).__name__}: {exc} after "
              f"{time.monotonic() - t1:.2f}s")
    # The open connections are untouched by the refusal.
    i, k = 1, 0
    h, data, gen = stored[i, k]
    check("extra.others_unharmed", clients[i].load(h, length=SIZE, generation=gen).data == data)

    # Connection 1 leaves; its QP is handed to the next connection.
    for (j, k), (h, _, gen) in list(stored.items()):
        if j == 1:
            clients[1].free(h, generation=gen)
            del stored[j, k]
    clients.pop(1).goodbye(release=True)
    new, tries = None, 0
    while new is None and tries < 10:
        tries += 1
        try:
            new = KbtpClient(env_target(), initiator_id=200, features=FEATURES,
                             connect_timeout_s=REFUSE_S)
        except Exception as exc:              # the QP may still be in its time-wait
            print(f"RETRY reconnect {tries}: {type(exc).__name__}: {exc}", flush=True)
            time.sleep(1)
    if check("reuse.connected", new is not None, f"after {tries} attempt(s)"):
        clients[0] = new
        for (j, k), (h, _, gen) in store_load("reuse", {0: new}, 1).items():
            new.free(h, generation=gen)
    for (j, k), (h, _, gen) in stored.items():
        f = clients[j].free(h, generation=gen)
        check(f"free.c{j}.b{k}", f.generation != gen)
    for c in clients.values():
        c.goodbye(release=True)
    print(f"WALL {time.monotonic() - t0:.2f}s", flush=True)


CHECKS.guarded("exception", main)
CHECKS.finish()

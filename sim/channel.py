# Ref: docs/roce-layouts.md §1.1 (frames without FCS), §5 (what the ICRC covers),
#      §6 (RC recovery the link exercises).
"""A lossy, duplicating, corrupting Ethernet link between two frame endpoints.

Deterministic given the seed: the same seed and the same traffic give the same losses. A
frame endpoint is anything with ``receive_frame(frame, now_us)``, ``poll_tx() -> [bytes]``,
``tick(now_us)`` and (optionally) ``next_deadline() -> int | None`` — :class:`roce.rc.
RoceEndpoint`, or an adapter around a simulated DUT.

Corruption flips one bit. A real link's FCS would drop a frame whose Ethernet header or ARP
payload is hit, so such frames are dropped here (counted in ``stats['corrupt_dropped']``);
a hit from the IPv4 header onwards is delivered and must be caught by the receiver's IPv4
checksum / ICRC, as an error that escaped the FCS (or a faulty store-and-forward hop) would be.
"""

import heapq
import random

__all__ = ["LossyLink", "run"]


class LossyLink:
    """Both directions of one link. ``delay_us`` is the one-way latency; duplicates arrive
    ``dup_gap_us`` after the original (frames of one direction stay in order otherwise)."""

    def __init__(self, seed=0, loss=0.0, dup=0.0, corrupt=0.0, delay_us=5, dup_gap_us=1):
        self.rng = random.Random(seed)
        self.loss, self.dup, self.corrupt = loss, dup, corrupt
        self.delay_us, self.dup_gap_us = delay_us, dup_gap_us
        self._q = []                 # heap of (arrival, seq, dst index, frame)
        self._seq = 0
        self.stats = {"sent": 0, "delivered": 0, "lost": 0, "duplicated": 0, "corrupted": 0,
                      "corrupt_dropped": 0}
        self.log = []                # (time, direction 0 = a->b / 1 = b->a, frame) delivered

    def _corrupt(self, frame):
        i = self.rng.randrange(len(frame))
        if i < 14 or frame[12:14] != b"\x08\x00":
            return None
        b = bytearray(frame)
        b[i] ^= 1 << self.rng.randrange(8)
        return bytes(b)

    def send(self, direction, frame, now_us):
        """Offer a frame from side ``direction`` (0 = a, 1 = b) at ``now_us``."""
        self.stats["sent"] += 1
        if self.rng.random() < self.loss:
            self.stats["lost"] += 1
            return
        copies = [frame]
        if self.rng.random() < self.dup:
            self.stats["duplicated"] += 1
            copies.append(frame)
        for n, f in enumerate(copies):
            if self.rng.random() < self.corrupt:
                f = self._corrupt(f)
                if f is None:
                    self.stats["corrupt_dropped"] += 1
                    continue
                self.stats["corrupted"] += 1
            self._seq += 1
            heapq.heappush(self._q, (now_us + self.delay_us + n * self.dup_gap_us, self._seq,
                                     1 - direction, f))

    def next_arrival(self):
        return self._q[0][0] if self._q else None

    def deliver(self, now_us, ends):
        """Hand every frame due by ``now_us`` to its endpoint; returns how many."""
        n = 0
        while self._q and self._q[0][0] <= now_us:
            t, _, dst, f = heapq.heappop(self._q)
            self.stats["delivered"] += 1
            self.log.append((t, 1 - dst, f))
            ends[dst].receive_frame(f, t)
            n += 1
        return n


def run(a, b, *, link=None, until=None, step_us=10, now_us=None, max_us=600_000_000,
        max_steps=2_000_000, log=False):
    """Drive endpoints ``a`` and ``b`` over ``link`` until ``until()`` is true.

    ``until`` is a callable (stop condition) or an int (stop time). Time moves in steps of
    ``step_us`` while frames are in flight and jumps to the next timer deadline when the
    link is idle; it starts at ``now_us`` (default: the later of the endpoints' ``now``).
    Returns the final time; raises TimeoutError after ``max_us``.
    """
    link = link or LossyLink()
    if now_us is None:              # continue from where the endpoints are
        now_us = max(getattr(a, "now", 0), getattr(b, "now", 0))
    if not log:
        link.log = _NoLog()
    ends = (a, b)
    stop_at = until if isinstance(until, int) else None
    cond = until if callable(until) else None
    t = now_us
    for _ in range(max_steps):
        link.deliver(t, ends)
        for e in ends:
            e.tick(t)
        sent = 0
        for i, e in enumerate(ends):
            for f in e.poll_tx():
                link.send(i, f, t)
                sent += 1
        if cond is not None and cond():
            return t
        if stop_at is not None and t >= stop_at:
            return t
        if t - now_us > max_us:
            raise TimeoutError(f"run(): condition not met after {max_us} us")
        nxt = [x for x in [link.next_arrival()] + [getattr(e, "next_deadline", lambda: None)()
                                                   for e in ends] if x is not None]
        if stop_at is not None:
            nxt.append(stop_at)
        if not nxt:
            if cond is None:
                return t
            raise TimeoutError("run(): idle with nothing scheduled and condition not met")
        t = max(t + 1, min(min(nxt), t + step_us) if sent else min(nxt))
    raise TimeoutError("run(): too many steps")


class _NoLog(list):
    def append(self, _):
        pass

# Ref: draft KBTP §Operations, §Free-Block Ring, §Completion, §Target Execution Model;
#      hw/target/target.py; host/driver.py (slow path); model/target.py (oracle); roce/rc.py (initiators'
#      RC endpoint); sim/channel.py (LossyLink); roce-layouts.md §6; issue 7 item 2.
"""The system bench without a simulator: target + host driver + initiators vs the golden model.

:class:`SystemBench` holds everything that does not depend on how the gateware is simulated:
the initiators (one :class:`roce.rc.RoceEndpoint`, one RC QP per initiator), the
:class:`~sim.channel.LossyLink` between them and the target, the host
:class:`~host.driver.KbtpDriver` on a :class:`~host.port.TargetPort`, and the oracle
(:class:`model.target.TargetModel`). The bench runs *rounds*: some initiators post one request
each at the same time; the draft lets requests of different connections run in any order, so
after the round the bench looks for an order under which the model produces exactly what the
initiators observed (every COMPLETION payload or completion record, every byte the target wrote
into initiator memory) and carries that model on; no order matching is a failure.

A subclass supplies the plumbing (all coroutines, so one bench serves both backends):

* ``cycles`` - simulated clock cycles;
* ``_access(space, addr, we, wdata) -> (rdata, err)`` - one host-bus transaction;
* ``_start()`` - reset; ``wait(n)`` - let ``n`` cycles pass (network and host loops keep
  running meanwhile); ``start_loops()`` - start them; ``deliver(frame)`` - a frame from the
  link onto the target's GMII (with ``in_frames`` bookkeeping).

:class:`VlSystemBench` is the plumbing on :class:`sim.vltarget.VlTarget` (plain Python, no
simulator scheduler: its coroutines never suspend, :func:`run_sync` runs them); the cocotb
bench (tests/sim/cocotb_system.py) is the other. :func:`mixed` is the random-round workload both
use (tests/sim/cocotb_system.py, tools/soak.py).
"""

import copy
import itertools
import random

from host import codec
from host.driver import KbtpDriver
from host.port import TargetPort
from hw.headers import Features, Opcode, Status
from sim.channel import LossyLink
from sim.vltarget import n_ranges_of
from model.target import SendMsg, TargetConfig, TargetModel, WriteImm
from roce.rc import RoceEndpoint

__all__ = ["same_events", "SystemBench", "RunTimeout", "VlSystemBench", "PeerMemory", "model_config", "run_sync", "mixed",
           "direct_step", "one_sided", "block_census", "DIRECT", "PERIOD_NS", "T_MAC", "T_IP",
           "P_MAC", "P_IP", "T_QPN0", "P_QPN0", "PMTU", "PMTU_CODE", "STEP"]

PERIOD_NS = 8

T_MAC, T_IP = "02:4b:42:54:50:01", "10.0.0.2"
P_MAC, P_IP = "02:00:00:00:00:02", "10.0.0.1"
T_QPN0, P_QPN0 = 0x11, 0x20
PMTU, PMTU_CODE = 1024, 3
STEP = 32
DIRECT = Features.DIRECT_LOAD.value | Features.DIRECT_ALLOC.value


def same_events(exp, obs, pmem=None):
    """Whether the observed events ``obs`` of one connection are the model's ``exp``: the same
    kinds in the same order, SENDs to the octet, records (``IMM``) by their Immediate and, given
    the initiator's memory ``pmem``, by the octets written there (read back from it)."""
    if len(exp) != len(obs):
        return False
    for e, o in zip(exp, obs):
        if e[0] != o[0]:
            return False
        if e[0] == "SEND" and e != o:
            return False
        if e[0] == "IMM":
            _, imm, stag, to, data = e
            if o[1] != imm:
                return False
            if pmem is not None and (stag not in pmem.bufs
                                     or pmem.contents(stag)[:len(data)] != data):
                return False
    return True


def model_config(**over):
    """The target configuration of the system benches (small pool: rings wrap often).

    Request Credits 16 (the default), so 16 receive buffers per QP (host/driver.py
    ``memory_plan``), of 512 octets (Max Inline 256: 24 + 32 + 256 = 312): with 4 QPs they
    take 4 x 16 x 512 = 32768 octets from 31744, ending at 64512, inside the ECPIX-5 core's
    131072 and the unit-test target's 4 MiB, and 4 x 16 = 64 fill the RecvNotify FIFO exactly.
    """
    kw = dict(block_size=2048, num_blocks=12, num_handles=64, handles_per_initiator=16,
              quota_per_initiator=4, max_inline=256, table_base_handle=0x4000,
              pool_to_base=0x150000, ticket_timeout_ms=1000, retention_ms=10_000.0)
    kw.update(over)
    return TargetConfig(**kw)


class RunTimeout(AssertionError):
    """:meth:`SystemBench.run_until` waited its whole budget (an AssertionError, for the tests
    that expect one); :meth:`SystemBench.round` adds its hang report to it, and only to it: any
    other AssertionError raised while a round runs (a frame of the target's that fails its
    checks, the peer model's or the driver's) reaches the caller with its own message."""


def run_sync(coro):
    """Run a coroutine that never suspends (the :class:`VlSystemBench` plumbing) to its end."""
    try:
        coro.send(None)
    except StopIteration as e:
        return e.value
    coro.close()
    raise RuntimeError("run_sync: the coroutine suspended (it awaited a real event)")


class PeerMemory:
    """The initiators' registered buffers, on the RC endpoint, under the model's API
    (``register(stag, data, base_to=, access=)``), so :class:`tests.hw.kbtp.test_kbtp_engine.Gen`
    registers each buffer both here and in the model's :class:`~model.target.InitiatorMemory`."""

    def __init__(self, ep):
        self.ep = ep
        self.bufs = {}

    def register(self, stag, data, *, base_to=0, access="rw"):
        buf = bytearray(data)
        self.ep.register(buf, base_va=base_to, rkey=stag, read="r" in access,
                         write="w" in access)
        self.bufs[stag] = buf

    def contents(self, stag):
        return bytes(self.bufs[stag])


def bth_summary(f):
    """(opcode, dest QP, PSN, AETH) of a RoCE frame, for hang reports."""
    if f[12:14] != b"\x08\x00" or len(f) < 58:
        return "non-RoCE"
    op, dqp = f[42], int.from_bytes(f[47:50], "big")
    psn = int.from_bytes(f[51:54], "big")
    aeth = f[54:58].hex() if op in (0x10, 0x11, 0x12, 0x0D, 0x0F) else ""
    return (hex(op), hex(dqp), hex(psn), aeth)


def block_census(model, image_of):
    """Where every pool block is, read from a target memory image.

    A block is in exactly one place: an unconsumed slot of its ring (shared or a direct
    partition's), or a valid table entry, or a pending deferred free (those hold no slot yet:
    the model's ``pending_frees`` counts them).

    Parameters
    ----------
    model : TargetModel
        For the layout and the configuration (and the count of pending deferred frees).
    image_of : callable ``(addr, n) -> bytes``
        Reads the target's memory.

    Returns
    -------
    dict
        ``blocks`` (all), ``in_rings``, ``in_table``, ``pending`` (deferred frees), ``lost``
        (blocks found nowhere beyond the pending count), ``duplicated`` (blocks found twice or
        more) and ``where`` (block offset -> list of places).
    """
    cfg, lay = model.cfg, model.lay
    where = {cfg.block_offset(i): [] for i in range(cfg.num_blocks)}
    rings = [("shared", lay["ring"], lay["ring_n"])]
    rings += [(f"partition{p}", d["ring"], d["n"]) for p, d in enumerate(lay["direct"])]
    for name, base, n in rings:
        raw = image_of(base, 16 * n)
        for s in range(n):
            seq, boff = codec.decode_slot(raw[16 * s:16 * s + 16], addr_le=cfg.addr_le,
                                          strict=False)
            if boff != (1 << 64) - 1:
                where.setdefault(boff, []).append(f"{name} slot {s}")
    table = image_of(lay["table"], lay["table_size"])
    for h in range(cfg.num_handles):
        e = codec.decode_entry(table[16 * h:16 * h + 16], addr_le=cfg.addr_le, strict=False)
        if e.flags & 1:
            where.setdefault(e.block_offset, []).append(
                f"entry {cfg.table_base_handle + h:#x}")
    pending = model.shared_ring.pending_count() + sum(p.ring.pending_count()
                                                      for p in model.partitions)
    missing = [b for b, w in where.items() if not w]
    dup = [b for b, w in where.items() if len(w) > 1]
    return {"blocks": cfg.num_blocks,
            "in_rings": sum(1 for w in where.values() for x in w if "slot" in x),
            "in_table": sum(1 for w in where.values() for x in w if "entry" in x),
            "pending": pending, "lost": max(0, len(missing) - pending),
            "duplicated": len(dup), "where": where}


class SystemBench:
    """Target + driver + ``n_init`` initiators over a lossy link, against the golden model.

    Parameters
    ----------
    n_qp, n_mr, mem_words : int
        The target's build parameters (for the driver).
    n_ranges : int or None
        The target's RANGE registers (:func:`sim.vltarget.n_ranges_of` its parameters); None:
        the default of a target of ``n_qp`` QPs.
    n_init : int
        Initiators (QPs of the one peer endpoint), at most ``n_qp``.
    loss, dup, corrupt : float
        LossyLink impairments, both directions.
    seed : int
    cfg : TargetConfig, optional
        Default :func:`model_config`.
    peer_timeout : int
        The initiators' ACK timeout code (4.096 us * 2**code).
    target_timeout : int
        The ACK timeout code of the target's QPs (its requester: a LOAD's data WRITE, a
        STORE's RDMA READ). 10 on a target whose timers run 16 times fast (``timer_scale``
        16) is 262 us of simulated time; 6 is the same at the board's real timer rate.
    """

    def __init__(self, *, n_qp, n_mr, mem_words, n_ranges=None, n_init=4, loss=0.0, dup=0.0,
                 corrupt=0.0, seed=1, cfg=None, peer_timeout=8, target_timeout=10):
        self.n_qp, self.n_mr, self.mem_words = n_qp, n_mr, mem_words
        self.target_timeout = target_timeout
        self.n_init = n_init
        self.rng = random.Random(seed)
        self.link = LossyLink(seed=seed, loss=loss, dup=dup, corrupt=corrupt, delay_us=1,
                              dup_gap_us=1)
        self.ep = RoceEndpoint(P_MAC, P_IP, seed=seed, min_frame=60)
        self.cfg = cfg or model_config()
        self.model = TargetModel(self.cfg)
        self.conns = [f"qp{q}" for q in range(n_init)]
        self.events = {q: [] for q in range(n_init)}      # what each initiator observed
        self.qps = []
        for q in range(n_init):
            self.qps.append(self.ep.create_qp(
                qpn=P_QPN0 + q, dest_qpn=T_QPN0 + q, remote_ip=T_IP, pmtu=PMTU,
                timeout=peer_timeout, sq_psn=0x100 * q + 7, epsn=0x1000 + q,
                on_message=self._on_message(q)))
        self.port = TargetPort(self.access)
        self.driver = KbtpDriver(self.port, self.cfg, n_qp=n_qp, mem_size=mem_words * 8,
                                 n_mr=n_mr, n_ranges=n_ranges)
        self.out_frames = []        # (sim time ns of the first octet, frame)
        self.in_frames = []         # (sim time ns of the last octet, frame) delivered to the DUT
        self.handled = []           # the driver's Handled records
        self.slow_sent = 0          # messages sent that must go to the host
        self.pmem = PeerMemory(self.ep)
        self.acks = {}
        self.host_on = False
        self.step = STEP            # cycles between two looks at the conditions of run_until
        self.prune = True           # forget the initiators' buffers of earlier rounds
        self._prev_bufs = set()

    def _on_message(self, q):
        def cb(qp, data, imm=None, invalidated_rkey=None):
            self.events[q].append(("SEND", bytes(data), invalidated_rkey) if imm is None
                                  else ("IMM", imm))
        return cb

    # ---- plumbing (subclasses) -------------------------------------------------------------
    @property
    def cycles(self):
        raise NotImplementedError

    async def access(self, space, addr, we, wdata):
        return await self._access(space, addr, we, wdata)

    async def wait(self, cycles):
        raise NotImplementedError

    def receive_frame(self, frame, t):          # link -> DUT
        raise NotImplementedError

    def probes(self):
        return {}

    # ---- network and host, one step each (the subclasses' loops call these) -------------------
    def check_out(self, raw, fcs_ok, t_ns):
        """A frame from the target: FCS, addresses and ICRC checked, then recorded."""
        from scapy.layers.l2 import ARP, Ether
        from sim.scapy_roce import icrc_of
        assert fcs_ok, "bad FCS from the DUT"
        eth = Ether(raw)
        if eth.type == 0x0806:
            assert eth[ARP].op == 2 and eth[ARP].psrc == T_IP
        else:
            assert eth.src == T_MAC and eth.dst == P_MAC, eth.summary()
            assert icrc_of(raw) == raw[-4:], f"bad ICRC from the DUT: {raw.hex()}"
        self.out_frames.append((t_ns, raw))
        return raw

    def net_step(self, out):
        """Frames ``out`` (``(raw, fcs_ok, t_ns)``) from the target onto the link; the link's
        due frames to both ends; the initiators' timers and frames."""
        now = self.cycles * PERIOD_NS / 1000
        for raw, ok, t in out:
            self.link.send(1, self.check_out(raw, ok, t), now)
        self.link.deliver(now, (self.ep, self))
        self.ep.tick(now)
        for f in self.ep.poll_tx():
            self.link.send(0, f, now)

    async def host_step(self):
        """One driver poll; the Handled record or None."""
        h = await self.driver.poll(now_ms=self.cycles * PERIOD_NS / 1e6)
        if h is not None:
            self.handled.append(h)
        return h

    async def run_until(self, cond, max_cycles=3_000_000, what="condition"):
        end = self.cycles + max_cycles
        while not cond():
            if self.cycles >= end:
                raise RunTimeout(f"run_until({what}): timed out after {max_cycles} cycles")
            await self.wait(self.step)
        return self.cycles

    async def settle(self, cycles=3000):
        end = self.cycles + cycles
        await self.run_until(lambda: self.cycles >= end)

    # ---- bring-up ----------------------------------------------------------------------
    #: Cycles a HELLO may take: the driver counts the bound entries of the initiator's handle
    #: range in target memory (4,096 entries of a pool-scale table: 64 KiB read).
    hello_cycles = 400_000

    async def bring_up(self, features=None):
        from sim.workload import Gen
        await self._start()
        await self.port.set_own(T_MAC, T_IP)
        await self.driver.init()
        self.start_net()
        for q in range(self.n_init):
            await self.driver.open_qp(
                q, local_qpn=T_QPN0 + q, remote_qpn=P_QPN0 + q, peer_mac=P_MAC, peer_ip=P_IP,
                udp_sport=0xC100 + q, pmtu=PMTU_CODE, rq_psn=0x100 * q + 7,
                sq_psn=0x1000 + q, timeout=self.target_timeout, retry_cnt=7, rnr_retry=7)
            self.model.connect(self.conns[q])
        self.start_host()
        # The peer learns the target's MAC by ARP (already done when the host's accesses above
        # took long enough for the exchange, as on the two-clock core's slower host bus).
        await self.run_until(lambda: self.ep.resolve(T_IP) is not None, 50_000, "ARP")
        # HELLO from every initiator, through the driver; replies compared with the model's.
        features = features or [Features.RECORD_COMPLETION.value if q % 2 else 0
                                for q in range(self.n_init)]
        for q in range(self.n_init):
            raw = codec.encode(codec.Hello(requested_features=features[q],
                                           completion_credits=8, initiator_id=q + 1))
            want = [a.payload for a in self.model.receive(self.conns[q], raw)
                    if isinstance(a, SendMsg)]
            self.qps[q].send(raw)
            self.slow_sent += 1
            await self.run_until(lambda: self.events[q], self.hello_cycles, f"HELLO_ACK {q}")
            got = [e[1] for e in self.events[q]]
            assert got == want, f"HELLO_ACK of initiator {q}: {got} vs model {want}"
            self.acks[q] = codec.decode(got[0])
            self.events[q].clear()
        im = [self.model.initiator_memory(c) for c in self.conns]
        self.gen = Gen(self.rng, self.model, self.conns, im, [self.pmem] * self.n_init)

    # ---- rounds ------------------------------------------------------------------------
    def free_request(self, q):
        """A FREE of one of the initiator's bound handles (or of a random one)."""
        s = self.model.session_of(self.conns[q])
        bound = [h for h in range(s.handle_base, s.handle_base + s.handle_count)
                 if self.model.read_entry(h)["flags"] & 1]
        h = self.rng.choice(bound) if bound and self.rng.random() < 0.9 else \
            s.handle_base + self.rng.randrange(s.handle_count)
        self.gen.rid += 1
        return codec.encode(codec.Free(request_id=self.gen.rid, handle=h,
                                       generation=0))

    def make_request(self, q, stats=None):
        """A random request of initiator ``q`` (:class:`tests.hw.kbtp.test_kbtp_engine.Gen`), except
        one whose RDMA transfer would fault (an unknown or invalid STag, a range outside the
        buffer: the model marks the RdmaRead / RdmaWrite / WriteImm with an error), or whose
        COMPLETION would be a Send with Invalidate of an STag the initiator never registered.
        On RoCE the first ends in a Remote Access Error NAK, the second in an Invalid Request
        NAK; either moves the target's QP to the Error state: the connection fails (the draft's
        "when a connection fails"), and the model's completion is never delivered. Connection
        loss is outside this bench."""
        for _ in range(50):
            raw = self.gen.make(q)
            m = copy.deepcopy(self.model)
            acts = m.receive(self.conns[q], raw)
            if not any(getattr(a, "error", None) or (
                    isinstance(a, SendMsg) and a.invalidate_stag is not None
                    and a.invalidate_stag not in self.pmem.bufs) for a in acts):
                return raw
            if stats is not None:
                stats["faulting_skipped"] = stats.get("faulting_skipped", 0) + 1
        raise AssertionError("no non-faulting request in 50 tries")

    def expected(self, model, order, batch):
        """Run ``batch`` through ``model`` in ``order``; per-initiator observable events."""
        ev = {q: [] for q, _ in batch}
        for k in order:
            q, raw = batch[k]
            for a in model.receive(self.conns[q], raw):
                if isinstance(a, SendMsg):
                    ev[q].append(("SEND", a.payload, a.invalidate_stag))
                elif isinstance(a, WriteImm):
                    ev[q].append(("IMM", a.imm, a.stag, a.to, a.data))
        return ev

    def observed(self, batch):
        return {q: list(self.events[q]) for q, _ in batch}

    async def hang_report(self, batch):
        from hw.iface import REG_KBTP
        from hw.kbtp.engine import reg as ENG
        eng = {k: await self.port.rreg(REG_KBTP + ENG[k]) for k in
               ("HOSTQ_COUNT", "LAST_LATENCY", "LAST_CYCLES", "STALL_CYCLES", "CMD",
                "FREE_QUEUE", "RING_OCCUPANCY")}
        host = {"handled": len(self.handled), **self.driver.state()}
        return (f"events {self.events}; engine {eng}; host {host}; probes {self.probes()}; "
                f"requester {await self.req_counters()}; last out "
                f"{[bth_summary(f) for _, f in self.out_frames[-6:]]}; last in "
                f"{[bth_summary(f) for _, f in self.in_frames[-6:]]}; "
                f"peer {self.ep.counters}; "
                f"counts {await self.engine_counts()}; driver handled "
                f"{[(h.qp, h.op, h.status) for h in self.handled[-20:]]}; requests "
                f"{[(q, raw.hex()) for q, raw in batch]}; frames out {len(self.out_frames)}")

    #: Cycles a round may take (:meth:`round`): more where the host's own link loses frames
    #: (each lost host-link frame costs the driver its retransmission timeout).
    round_cycles = 300_000

    async def round(self, batch, stats, *, timeout=None):
        """Post one request per (initiator, raw) of ``batch`` at once, wait, match the model."""
        timeout = timeout or self.round_cycles
        # Buffers registered before the previous round began: forgotten after this one.
        old_bufs, self._prev_bufs = self._prev_bufs, set(self.pmem.bufs)
        for q, raw in batch:
            self.events[q].clear()
            self.qps[q].send(raw)
        try:
            await self.run_until(lambda: all(self.events[q] for q, _ in batch), timeout,
                                 f"completions of {[q for q, _ in batch]}")
        except RunTimeout:
            raise RunTimeout("round timed out: " + await self.hang_report(batch)) from None
        # (any other failure, a check of the peer's or the driver's, keeps its own message)
        await self.settle(400)
        obs = self.observed(batch)
        first = None
        fits = []
        for order in itertools.permutations(range(len(batch))):
            m = copy.deepcopy(self.model)
            exp = self.expected(m, order, batch)
            if not all(same_events(exp[q], obs[q], self.pmem) for q, _ in batch):
                first = first or exp
                continue
            fits.append((order, m))
            if len(batch) == 1:
                break
        if len(fits) > 1:
            # Orders the initiators cannot tell apart (two FREEs, a FREE and an allocation...)
            # may leave the rings and table in different states: the target's memory decides
            # (a wrong pick would show up later as a different block allocated). Only where
            # the candidates differ is read: a pool-scale table and ring are megabytes.
            regions = self._differences([m for _, m in fits])
            got = [await self.port.mem_read(a, n) for a, n in regions]
            fits = [f for f in fits
                    if [bytes(f[1].mem[a:a + n]) for a, n in regions] == got][:1] or fits
        if fits:
            order, m = fits[0]
        else:
            raise AssertionError(
                "no order of the round's requests gives what the initiators saw:\n"
                + "\n".join(f" initiator {q}: request {raw.hex()}\n  saw   {obs[q]}\n"
                            f"  model {first[q]}" for q, raw in batch))
        self.model = m
        self.gen.model = m
        self.gen.im_m = [m.initiator_memory(c) for c in self.conns]
        # Every buffer the target may have written (LOAD destinations, records) equals the
        # model's copy.
        for q in range(self.n_init):
            imem = m.initiator_memory(self.conns[q])
            for stag in list(imem.buffers):
                if stag in self.pmem.bufs:
                    assert self.pmem.contents(stag) == imem.contents(stag), \
                        f"initiator {q} buffer {stag:#x} differs from the model's"
        if self.prune:
            # Gen registers a fresh buffer per request and never reuses one: drop those of
            # earlier rounds from the model (its deep copies would grow with every round) and
            # from the peer (the last round's stay, for the caller to look at).
            for q in range(self.n_init):
                imem = m.initiator_memory(self.conns[q])
                for stag in old_bufs & set(imem.buffers):
                    del imem.buffers[stag]
            for stag in old_bufs:
                self.pmem.bufs.pop(stag, None)
                self.ep.mrs.pop(stag, None)
        stats["orders"] = stats.get("orders", 0) + (order != tuple(range(len(batch))))
        for q, raw in batch:
            for e in obs[q]:
                if e[0] == "SEND":
                    msg = codec.decode(e[1])
                    key = (Opcode(raw[1]).name if raw[1] in {o.value for o in Opcode}
                           else "?", msg.status)
                    stats.setdefault("status", {}).setdefault(str(key), 0)
                    stats["status"][str(key)] += 1

    #: A pool larger than this is compared over the blocks the model holds data in and
    #: :data:`POOL_SAMPLE` others drawn at random (a pool-scale DDR3 run holds 64 MiB; the host
    #: bus reads a word per access).
    FULL_POOL = 4 << 20
    POOL_SAMPLE = 64

    def _pool_spans(self, model):
        lay = model.lay
        if lay["pool_size"] <= self.FULL_POOL:
            return [("pool", lay["pool"], lay["pool_size"])]
        bs, base = model.cfg.block_size, lay["pool"]
        n = lay["pool_size"] // bs
        zero = bytes(bs)
        mem = memoryview(model.mem)
        held = [i for i in range(n) if mem[base + i * bs:base + (i + 1) * bs] != zero]
        rest = sorted(set(range(n)) - set(held))
        others = random.Random(len(held)).sample(rest, min(self.POOL_SAMPLE, len(rest)))
        return [(f"pool block {i}", base + i * bs, bs) for i in sorted(held + others)]

    def _differences(self, models, chunk=64):
        """``(address, length)`` of every ``chunk`` of the structures (counters, table, rings)
        in which the images of ``models`` are not all the same."""
        out = []
        for _, a, n in self._spans(models[0], pool=False):
            views = [memoryview(m.mem)[a:a + n] for m in models]
            if all(v == views[0] for v in views[1:]):
                continue
            for off in range(0, n, chunk):
                k = min(chunk, n - off)
                if any(v[off:off + k] != views[0][off:off + k] for v in views[1:]):
                    out.append((a + off, k))
        return out

    def _spans(self, model, pool=True):
        lay = model.lay
        spans = [("head", lay["head"], 8), ("tail", lay["tail"], 8),
                 ("table", lay["table"], lay["table_size"]),
                 ("ring", lay["ring"], 16 * lay["ring_n"])]
        if pool:
            spans += self._pool_spans(model)
        for p, d in enumerate(lay["direct"]):
            spans += [(f"partition{p} head", d["head"], 8), (f"partition{p} tail", d["tail"], 8),
                      (f"partition{p} ring", d["ring"], 16 * d["n"])]
        return spans

    async def req_counters(self):
        from hw.target.target import REQ_COUNTER_BASE, REQ_COUNTERS, REQ_STATUS
        names = list(REQ_COUNTERS) + list(REQ_STATUS)
        return {n: await self.port.rreg(REQ_COUNTER_BASE + 4 * k) for k, n in enumerate(names)}

    async def mac_counters(self):
        """The MAC's counters (REG_TOP): frames, FCS errors, overflows, underruns."""
        from hw.iface import REG_TOP
        from hw.target.regbank import TOP_COUNTER_BASE
        from hw.target.target import TOP_COUNTERS
        return {port: await self.port.rreg(REG_TOP + TOP_COUNTER_BASE + 4 * k)
                for k, (blk, port) in enumerate(TOP_COUNTERS) if blk == "mac"}

    async def resp_counters(self):
        from hw.iface import REG_TRANSPORT
        from hw.target.target import RESP_COUNTERS
        return {n: await self.port.rreg(REG_TRANSPORT + 4 * k)
                for k, n in enumerate(RESP_COUNTERS)}

    async def compare_image(self):
        for name, a, n in self._spans(self.model):
            got = await self.port.mem_read(a, n)
            want = bytes(self.model.mem[a:a + n])
            if got != want:
                bad = next(i for i in range(n) if got[i] != want[i])
                raise AssertionError(f"{name} differs at +{bad:#x}: target "
                                     f"{got[bad:bad + 16].hex()} model {want[bad:bad + 16].hex()}")

    async def engine_counts(self):
        from hw.iface import REG_KBTP
        from hw.kbtp.engine import FAST_OPS, reg as ENG
        out = {}
        for k, op in enumerate(FAST_OPS):
            for st in Status:
                v = await self.port.rreg(REG_KBTP + ENG["COUNT"] + 4 * (16 * k + st.value))
                if v:
                    out[(op.name, st.name)] = v
        return out


class _BulkAccess:
    """The host-bus access of a :class:`VlSystemBench` with ``bulk``: one access at a time as
    :meth:`VlSystemBench._access`, and whole memory spans in one harness command."""

    def __init__(self, bench):
        self.b = bench

    async def __call__(self, space, addr, we, wdata):
        return await self.b._access(space, addr, we, wdata)

    async def mem_read(self, addr, n):
        out = self.b.vt.mem_read(addr, n)
        self.b._net()
        return out

    async def mem_write(self, addr, data):
        self.b.vt.mem_write(addr, data)
        self.b._net()


class VlSystemBench(SystemBench):
    """:class:`SystemBench` on a :class:`sim.vltarget.VlTarget` (plain Python).

    No scheduler: :meth:`wait` runs the target ``step`` cycles at a time in C++, then one
    network step and (once started) driver polls. Host-bus accesses also run the network step
    every ``step`` cycles, so a driver waiting for a WorkCompletion (which needs the peer's ACK)
    sees it arrive. Every coroutine here completes without suspending: drive the bench with
    :func:`run_sync`.

    ``bulk``: the driver's and the checks' memory reads and writes go to the harness as one
    command each (``VlTarget.mem_read`` / ``mem_write``: the same host-bus accesses, without a
    network step between two words), for structures of megabytes (a pool-scale table).
    """

    def __init__(self, vt, *, step=128, bulk=False, **kw):
        p = vt.params
        # The same simulated ACK timeout (262 us) whatever the target's timer scaling.
        kw.setdefault("target_timeout", 6 + (p.get("timer_scale", 1).bit_length() - 1))
        super().__init__(n_qp=p["n_qp"], n_mr=p["n_mr"], mem_words=p["mem_words"],
                         n_ranges=n_ranges_of(p), **kw)
        self.vt = vt
        # One pipe round trip per run and a few per driver poll: a longer step than the cocotb
        # bench's saves Python time; 128 cycles (1 us) is the link's delay anyway.
        self.step = step
        self.net_on = False
        self._net_at = 0
        self._in_net = False
        self._sent = []             # frames handed to the harness, not yet in in_frames
        if bulk:
            self.port.access = _BulkAccess(self)

    @property
    def cycles(self):
        return self.vt.cycle

    async def _start(self):
        pass                                    # the harness resets the target on start

    def start_net(self):
        self.net_on = True

    def start_host(self):
        self.host_on = True

    def _net(self):
        if not self.net_on or self._in_net:
            return
        self._in_net = True
        try:
            self._net_at = self.vt.cycle
            self._deliver(self._tx_frames())
        finally:
            self._in_net = False

    def _tx_frames(self):
        """The frames the target sent since the last call (a subclass may take some out)."""
        return self.vt.run(0)

    def _deliver(self, frames):
        self.net_step([(f.frame, f.fcs_ok, f.start * PERIOD_NS) for f in frames])

    async def _access(self, space, addr, we, wdata):
        r = self.vt.access(space, addr, we, wdata)
        if self.vt.cycle - self._net_at >= self.step:
            self._net()
        return r

    def receive_frame(self, frame, t):
        frame = bytes(frame).ljust(60, b"\0")
        self.vt.send(frame)
        self._sent.append(frame)

    async def wait(self, cycles):
        end = self.vt.cycle + cycles
        while self.vt.cycle < end:
            out = self.vt.run(min(self.step, end - self.vt.cycle))
            self._net_at = self.vt.cycle
            self._collect_in()
            if self.net_on:
                self.net_step([(f.frame, f.fcs_ok, f.start * PERIOD_NS) for f in out])
            if self.host_on:
                for _ in range(4):
                    if await self.host_step() is None:
                        break

    def _collect_in(self):
        """Pair the harness's rx_log with the frames sent (in order) for ``in_frames``."""
        log = self.vt.rx_log
        while self._sent and len(self.in_frames) < len(log):
            first, last = log[len(self.in_frames)]
            self.in_frames.append((last * PERIOD_NS, self._sent.pop(0)))


# --------------------------------------------------------------------------------------------
# Workload (shared with tests/sim/cocotb_system.py and tools/soak.py)
# --------------------------------------------------------------------------------------------

async def one_sided(b, q, op, *args):
    """One RDMA operation of initiator ``q`` on a target STag; returns its completion."""
    qp = b.qps[q]
    qp.poll_cq()                        # earlier completions (the initiator's Sends)
    wr = getattr(qp, op)(*args)
    await b.run_until(lambda: not qp.outstanding, 400_000, f"{op} of initiator {q}")
    # A Send of the last round may complete here too (its ACK was lost and came late).
    done = qp.poll_cq()
    assert all(x.status.name == "SUCCESS" for x in done), (op, args, done)
    (c,) = [x for x in done if x.wr_id == wr]
    return c


async def direct_step(b, q, stats):
    """One direct-mode turn of initiator ``q``: a DIRECT_LOAD of one of its bound handles
    (entry, block, entry; each read checked against the model) or a DIRECT_ALLOC (FetchAdd on
    its Head, slot READ, partition WRITE) whose BIND request is returned for the round."""
    from hw.headers import RING_ADD_DATA_UNMASKED

    m, c = b.model, b.conns[q]
    ack = b.acks[q]
    s = m.session_of(c)
    bound = [h for h in range(s.handle_base, s.handle_base + s.handle_count)
             if m.read_entry(h)["flags"] & 1]
    if bound and b.rng.random() < 0.5:
        h = b.rng.choice(bound)
        t = ack.table
        eto = t.tagged_offset + 16 * (h - ack.table_base_handle)
        e1 = (await one_sided(b, q, "read", eto, t.stag, 16)).data
        assert e1 == m.remote_read(c, t.stag, eto, 16)
        ent = codec.decode_entry(e1)
        if ent.data_length:
            blk = (await one_sided(b, q, "read", ent.block_offset, ack.pool.stag,
                                   ent.data_length)).data
            assert blk == m.remote_read(c, ack.pool.stag, ent.block_offset, ent.data_length)
        assert (await one_sided(b, q, "read", eto, t.stag, 16)).data == e1
        stats["direct_load"] = stats.get("direct_load", 0) + 1
        return None
    free = [h for h in range(s.handle_base, s.handle_base + s.handle_count)
            if not m.read_entry(h)["flags"] & 1]
    if not free or m.usage(s.initiator_id) >= s.quota:
        return None                     # the partition ring would be empty: no FetchAdd
    hd, rg = ack.head, ack.ring
    old = (await one_sided(b, q, "fetch_add", hd.tagged_offset, hd.stag,
                           RING_ADD_DATA_UNMASKED)).orig
    assert old == m.remote_fetch_add(c, hd.stag, hd.tagged_offset, RING_ADD_DATA_UNMASKED)
    ticket = old >> 32
    sto = rg.tagged_offset + 16 * (ticket % rg.count)
    slot = (await one_sided(b, q, "read", sto, rg.stag, 16)).data
    assert slot == m.remote_read(c, rg.stag, sto, 16)
    seq, boff = codec.decode_slot(slot)
    assert seq == ticket, (seq, ticket)
    payload = bytes(b.rng.getrandbits(8) for _ in range(b.rng.choice([1, 64, 700])))
    await one_sided(b, q, "write", boff, ack.partition.stag, payload)
    m.remote_write(c, ack.partition.stag, boff, payload)
    stats["bind"] = stats.get("bind", 0) + 1
    b.gen.rid += 1
    return codec.encode(codec.Bind(request_id=b.gen.rid, handle=b.rng.choice(free),
                                   ticket=ticket, data_length=len(payload), block_offset=boff))


def op_kind(raw):
    """Kind of a request for the soak's tallies: ALLOC_STORE/STORE split by inline or READ."""
    from hw.headers import ReqFlags
    try:
        op = Opcode(raw[1])
    except (ValueError, IndexError):
        return "malformed"
    if op in (Opcode.ALLOC_STORE, Opcode.STORE):
        return op.name + ("_inline" if len(raw) > 3 and raw[3] & ReqFlags.INLINE.value
                          else "_read")
    return op.name


async def mixed(b, *, rounds=None, ops=None, direct=False, log=None, progress=None,
                max_batch=None):
    """Random rounds on a brought-up bench: LOAD / STORE / ALLOC_STORE (inline and by READ,
    some malformed on purpose) and FREE from every initiator; with ``direct``, initiator 0's
    turns are also DIRECT_LOAD reads and DIRECT_ALLOC allocations + BIND. Stops after
    ``rounds`` rounds or ``ops`` operations. A round is 1 to ``max_batch`` (default: all)
    initiators, one request each, at once: :meth:`SystemBench.round` tries every order of a
    round's requests against the model, so a round of k costs up to k! model runs. Returns the
    stats dict (per-kind counts in ``kinds``; ``initiators``: the initiators that took part)."""
    n_init = b.n_init
    most = min(n_init, max_batch or n_init)
    stats = {"requests": 0, "free": 0, "direct_load": 0, "bind": 0, "rounds": 0, "kinds": {},
             "initiators": set()}
    r = 0
    while (rounds is None or r < rounds) and (ops is None or
                                              stats["requests"] + stats["direct_load"] < ops):
        r += 1
        who = b.rng.sample(range(n_init), b.rng.randrange(1, most + 1))
        batch = []
        for q in who:
            if direct and q == 0 and b.rng.random() < 0.4:
                d0 = stats["direct_load"]
                raw = await direct_step(b, 0, stats)
                if stats["direct_load"] != d0:
                    stats["kinds"]["DIRECT_LOAD"] = stats["kinds"].get("DIRECT_LOAD", 0) + 1
                if raw is None:
                    continue
                batch.append((q, raw))
            elif b.rng.random() < 0.15:
                batch.append((q, b.free_request(q)))
                stats["free"] += 1
            else:
                batch.append((q, b.make_request(q, stats)))
            # (the DIRECT_ALLOC session's LOADs and STOREs run in the engine, its BINDs at the
            # host, its ALLOC_STOREs in the engine when it serves the partition (QP_SESSION
            # bits 5..4, driver engine_parts), else at the host (QP_SESSION bit 3))
            op = batch[-1][1][1]
            fast = (Opcode.LOAD.value, Opcode.STORE.value) + \
                ((Opcode.ALLOC_STORE.value,) if b.driver.engine_parts else ())
            if op == Opcode.FREE.value or (direct and q == 0 and op not in fast):
                b.slow_sent += 1
        if not batch:
            continue
        stats["requests"] += len(batch)
        stats["initiators"].update(q for q, _ in batch)
        for q, raw in batch:
            k = op_kind(raw)
            if direct and q == 0 and k == "BIND":
                k = "DIRECT_ALLOC+BIND"
            stats["kinds"][k] = stats["kinds"].get(k, 0) + 1
        await b.round(batch, stats)
        stats["rounds"] += 1
        if log:
            log(f"round {r}: {[(q, raw[1]) for q, raw in batch]} ok at cycle {b.cycles}")
        if progress:
            progress(stats)
    return stats


async def mixed_checks(b, stats, *, direct=False):
    """End-of-run checks of :func:`mixed`: image and counters vs the model, host idleness.
    Returns the figures dict."""
    from hw.iface import REG_KBTP
    from hw.kbtp.engine import FAST_OPS, reg as ENG
    await b.settle(2000)
    await b.compare_image()
    got = await b.engine_counts()
    fast = {o.name for o in FAST_OPS}
    want = {k: v for k, v in b.model.counters.items() if k[0] in fast}
    both = dict(got)
    for k, v in b.driver.stats.items():            # any run by the host (none with engine_parts)
        if k[0] in fast:
            both[k] = both.get(k, 0) + v
    assert both == want, f"engine + driver counters {both} vs model {want}"
    # The host handled exactly the slow-path messages: HELLOs, FREEs, and (direct) the
    # DIRECT_ALLOC session's BINDs (and its ALLOC_STOREs, unless the engine serves the
    # partitions: driver.engine_parts); no LOAD or STORE.
    assert len(b.handled) == b.slow_sent, (len(b.handled), b.slow_sent,
                                           [h.op for h in b.handled])
    assert {h.op for h in b.handled if not (direct and h.qp == 0)} <= {"HELLO", "FREE"}, \
        [(h.qp, h.op) for h in b.handled]
    assert not {h.op for h in b.handled} & {"LOAD", "STORE"}, [(h.qp, h.op) for h in b.handled]
    hostq = await b.port.rreg(REG_KBTP + ENG["HOSTQ_COUNT"])
    assert hostq == b.slow_sent, (hostq, b.slow_sent)
    assert b.driver.host_actions == b.slow_sent
    return dict(stats, initiators=len(stats.get("initiators", ())), link=b.link.stats,
                fast_path=sum(got.values()), host_messages=hostq,
                stall_cycles=await b.port.rreg(REG_KBTP + ENG["STALL_CYCLES"]),
                peer_retransmissions=b.ep.counters.retransmissions, cycles=b.cycles)

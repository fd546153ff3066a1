# Ref: draft KBTP §Operations, §Free-Block Ring, §Completion, §Target Execution Model;
#      hw/rtl/target.py (engine wired in); host/driver.py (slow path); sim/model.py (oracle);
#      sim/rc.py (initiators' RC endpoint); sim/channel.py (LossyLink); roce-layouts.md §6.
"""cocotb system bench: the whole target (transport + KBTP engine) and the host driver, serving
several initiators over GMII, checked against the golden model (run by
tests/test_system_cocotb.py).

Initiators: one :class:`sim.rc.RoceEndpoint` with ``N_INIT`` RC QPs, each an initiator with its
own session (HELLO through the driver). Frames cross a :class:`~sim.channel.LossyLink` into the
DUT's GMII (cocotbext-eth GmiiSource / GmiiSink; FCS checked there, ICRC by scapy). The host
driver (:class:`host.driver.KbtpDriver`) initialises target memory and the engine and serves the
slow path; the engine serves LOAD, STORE and ALLOC_STORE.

Oracle: :class:`sim.model.TargetModel`. The bench runs *rounds*: in each, some initiators post
one request each at the same time. The draft lets requests of different connections run in any
order, so after the round the bench looks for an order of the round's requests under which the
model produces exactly what the initiators observed (every COMPLETION payload or completion
record, every byte the target wrote into initiator memory) and carries that model on; no order
matching is a failure. At the end the table, ring, counters and pool in target memory must equal
the model's image octet for octet, and the engine's per-(operation, status) counters the model's.

Host idleness: the driver counts every message it handles; the test checks that those are
exactly the slow-path messages sent (HELLO, FREE), and that the engine's HOSTQ_COUNT agrees, so
no LOAD / STORE / ALLOC_STORE involved the host.

Latency (``latency`` case): from the last octet of the request frame on ``rxd`` to the first
octet of the first frame the target sends for it (the RDMA WRITE of a LOAD, the COMPLETION Send
of an ALLOC_STORE), in clock cycles; written to ``figures_system.json``.
"""

import copy
import itertools
import json
import logging
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cocotb
from cocotb.clock import Clock
from cocotb.triggers import ClockCycles, Lock, ReadOnly, RisingEdge
from cocotb.utils import get_sim_time, get_time_from_sim_steps
from cocotbext.eth import GmiiFrame, GmiiSink, GmiiSource
from scapy.layers.l2 import ARP, Ether

from host import codec
from host.driver import KbtpDriver
from host.port import TargetPort
from hw.headers import Features, Opcode, ReqFlags, Status
from hw.rtl.kbtp_engine import FAST_OPS, reg as ENG
from hw.rtl.iface import REG_KBTP
from sim.channel import LossyLink
from sim.hdl import get_params
from sim.model import RdmaWrite, SendMsg, TargetConfig, TargetModel, WriteImm
from sim.rc import RoceEndpoint
from tests.scapy_roce import icrc_of
from tests.test_kbtp_engine import Gen, build

PERIOD_NS = 8
T_MAC, T_IP = "02:4b:42:54:50:01", "10.0.0.2"
P_MAC, P_IP = "02:00:00:00:00:02", "10.0.0.1"
T_QPN0, P_QPN0 = 0x11, 0x20
PMTU, PMTU_CODE = 1024, 3
STEP = 32
FIGS = {}


def model_config(**over):
    kw = dict(block_size=2048, num_blocks=12, num_handles=64, handles_per_initiator=16,
              quota_per_initiator=4, max_inline=256, table_base_handle=0x4000,
              pool_to_base=0x150000, ticket_timeout_ms=1000, retention_ms=10_000.0)
    kw.update(over)
    return TargetConfig(**kw)


class PeerMemory:
    """The initiators' registered buffers, on the RC endpoint, under the model's API
    (``register(stag, data, base_to=, access=)``), so :class:`tests.test_kbtp_engine.Gen`
    registers each buffer both here and in the model's :class:`~sim.model.InitiatorMemory`."""

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


class SystemBench:
    def __init__(self, dut, *, n_init=4, loss=0.0, dup=0.0, corrupt=0.0, seed=1, cfg=None):
        self.dut = dut
        p = get_params()
        self.n_qp, self.mem_words = p["n_qp"], p["mem_words"]
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
                qpn=P_QPN0 + q, dest_qpn=T_QPN0 + q, remote_ip=T_IP, pmtu=PMTU, timeout=8,
                sq_psn=0x100 * q + 7, epsn=0x1000 + q,
                on_message=self._on_message(q)))
        self.port = TargetPort(self.access)
        self.driver = KbtpDriver(self.port, self.cfg, n_qp=self.n_qp,
                                 mem_size=self.mem_words * 8, n_mr=p["n_mr"])
        self.out_frames = []        # (sim time ns of the first octet, frame)
        self.in_frames = []         # (sim time ns of the last octet, frame) delivered to the DUT
        self.handled = []           # the driver's Handled records
        self.slow_sent = 0          # messages sent that must go to the host
        self.pmem = PeerMemory(self.ep)
        self.bus_lock = Lock()
        self.acks = {}

    def _on_message(self, q):
        def cb(qp, data, imm=None, invalidated_rkey=None):
            self.events[q].append(("SEND", bytes(data), invalidated_rkey) if imm is None
                                  else ("IMM", imm))
        return cb

    @property
    def cycles(self):
        return int(get_sim_time(unit="ns")) // PERIOD_NS

    # ---- DUT plumbing ----------------------------------------------------------------
    async def start(self):
        d = self.dut
        cocotb.start_soon(Clock(d.clk, PERIOD_NS, unit="ns").start())
        for s in (d.host__re, d.host__we, d.host__addr, d.host__space, d.host__wdata,
                  d.rx_dv, d.rx_er, d.rxd):
            s.value = 0
        self.src = GmiiSource(d.rxd, d.rx_er, d.rx_dv, d.clk, d.rst)
        self.sink = GmiiSink(d.txd, d.tx_er, d.tx_en, d.clk, d.rst)
        for x in (self.src, self.sink):
            x.log.setLevel(logging.WARNING)
        d.rst.value = 1
        await ClockCycles(d.clk, 5)
        d.rst.value = 0
        await ClockCycles(d.clk, 2)

    async def access(self, space, addr, we, wdata):
        async with self.bus_lock:      # the driver's loop and the test share the host bus
            return await self._access(space, addr, we, wdata)

    async def _access(self, space, addr, we, wdata):
        d = self.dut
        d.host__space.value = getattr(space, "value", space)
        d.host__addr.value = addr
        d.host__wdata.value = wdata
        d.host__we.value = we
        d.host__re.value = 1 - we
        for _ in range(1000):
            await ReadOnly()
            if d.host__ack.value:
                r, e = int(d.host__rdata.value), int(d.host__err.value)
                await RisingEdge(d.clk)
                d.host__we.value = 0
                d.host__re.value = 0
                return r, e
            await RisingEdge(d.clk)
        raise AssertionError("host bus: no ack")

    def receive_frame(self, frame, t):          # link -> DUT
        def done(f, raw=frame):
            self.in_frames.append((get_time_from_sim_steps(f.sim_time_end, "ns"), raw))
        self.src.send_nowait(GmiiFrame.from_payload(frame, tx_complete=done))

    def check_out(self, f):
        assert f.check_fcs(), "bad FCS from the DUT"
        raw = bytes(f.get_payload())
        eth = Ether(raw)
        if eth.type == 0x0806:
            assert eth[ARP].op == 2 and eth[ARP].psrc == T_IP
        else:
            assert eth.src == T_MAC and eth.dst == P_MAC, eth.summary()
            assert icrc_of(raw) == raw[-4:], f"bad ICRC from the DUT: {raw.hex()}"
        self.out_frames.append((get_time_from_sim_steps(f.sim_time_start, "ns"), raw))
        return raw

    async def net_loop(self):
        """The network: frames between the DUT's GMII, the link and the initiators."""
        while True:
            await ClockCycles(self.dut.clk, STEP)
            now = self.cycles * PERIOD_NS / 1000
            while not self.sink.empty():
                self.link.send(1, self.check_out(self.sink.recv_nowait()), now)
            self.link.deliver(now, (self.ep, self))
            self.ep.tick(now)
            for f in self.ep.poll_tx():
                self.link.send(0, f, now)

    async def host_loop(self):
        """The host: the driver serves the slow path, concurrently with the network (it may
        wait for a WorkCompletion, which needs the initiator's ACK to cross the link)."""
        while True:
            h = await self.driver.poll(now_ms=self.cycles * PERIOD_NS / 1e6)
            if h is None:
                await ClockCycles(self.dut.clk, STEP)
            else:
                self.handled.append(h)

    async def run_until(self, cond, max_cycles=3_000_000, what="condition"):
        end = self.cycles + max_cycles
        while not cond():
            assert self.cycles < end, f"run_until({what}): timed out"
            await ClockCycles(self.dut.clk, STEP)
        return self.cycles

    async def settle(self, cycles=3000):
        end = self.cycles + cycles
        await self.run_until(lambda: self.cycles >= end)

    # ---- bring-up ----------------------------------------------------------------------
    async def bring_up(self, features=None):
        await self.start()
        await self.port.set_own(T_MAC, T_IP)
        await self.driver.init()
        cocotb.start_soon(self.net_loop())
        for q in range(self.n_init):
            await self.driver.open_qp(
                q, local_qpn=T_QPN0 + q, remote_qpn=P_QPN0 + q, peer_mac=P_MAC, peer_ip=P_IP,
                udp_sport=0xC100 + q, pmtu=PMTU_CODE, rq_psn=0x100 * q + 7,
                sq_psn=0x1000 + q, timeout=10, retry_cnt=7, rnr_retry=7)
            self.model.connect(self.conns[q])
        cocotb.start_soon(self.host_loop())
        assert self.ep.resolve(T_IP) is None
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
            await self.run_until(lambda: self.events[q], 400_000, f"HELLO_ACK {q}")
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
        out = {}
        for q, _ in batch:
            evs = []
            for e in self.events[q]:
                evs.append(e)
            out[q] = evs
        return out

    @staticmethod
    def _same(exp, obs, pmem):
        """Model events vs observed ones (records: the written octets are read back from the
        initiator's buffer)."""
        if len(exp) != len(obs):
            return False
        for e, o in zip(exp, obs):
            if e[0] != o[0]:
                return False
            if e[0] == "SEND" and e != o:
                return False
            if e[0] == "IMM":
                _, imm, stag, to, data = e
                if o[1] != imm or stag not in pmem.bufs:
                    return False
                if pmem.contents(stag)[:len(data)] != data:
                    return False
        return True

    async def round(self, batch, stats):
        """Post one request per (initiator, raw) of ``batch`` at once, wait, match the model."""
        for q, raw in batch:
            self.events[q].clear()
            self.qps[q].send(raw)
        try:
            await self.run_until(lambda: all(self.events[q] for q, _ in batch), 300_000,
                                 f"completions of {[q for q, _ in batch]}")
        except AssertionError:
            eng = {k: await self.port.rreg(REG_KBTP + ENG[k]) for k in
                   ("HOSTQ_COUNT", "LAST_LATENCY", "LAST_CYCLES", "STALL_CYCLES", "CMD")}
            raise AssertionError(
                f"round timed out: events {self.events}; engine {eng}; probes {self.probes()}; "
                f"requester {await self.req_counters()}; last out "
                f"{[self.bth_summary(f) for _, f in self.out_frames[-6:]]}; last in "
                f"{[self.bth_summary(f) for _, f in self.in_frames[-6:]]}; "
                f"peer {self.ep.counters}; "
                f"counts {await self.engine_counts()}; driver handled "
                f"{[(h.qp, h.op, h.status) for h in self.handled]}; requests "
                f"{[(q, raw.hex()) for q, raw in batch]}; frames out {len(self.out_frames)}"
            ) from None
        await self.settle(400)
        obs = self.observed(batch)
        first = None
        for order in itertools.permutations(range(len(batch))):
            m = copy.deepcopy(self.model)
            exp = self.expected(m, order, batch)
            if all(self._same(exp[q], obs[q], self.pmem) for q, _ in batch):
                break
            first = first or exp
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
        stats["orders"] = stats.get("orders", 0) + (order != tuple(range(len(batch))))
        for q, raw in batch:
            for e in obs[q]:
                if e[0] == "SEND":
                    msg = codec.decode(e[1])
                    key = (Opcode(raw[1]).name if raw[1] in {o.value for o in Opcode}
                           else "?", msg.status)
                    stats.setdefault("status", {}).setdefault(str(key), 0)
                    stats["status"][str(key)] += 1

    @staticmethod
    def bth_summary(f):
        """(opcode, dest QP, PSN, AETH) of a RoCE frame, for hang reports."""
        if f[12:14] != b"\x08\x00" or len(f) < 58:
            return "non-RoCE"
        op, dqp = f[42], int.from_bytes(f[47:50], "big")
        psn = int.from_bytes(f[51:54], "big")
        aeth = f[54:58].hex() if op in (0x10, 0x11, 0x12, 0x0D, 0x0F) else ""
        return (hex(op), hex(dqp), hex(psn), aeth)

    async def req_counters(self):
        from hw.rtl.target import REQ_COUNTER_BASE, REQ_COUNTERS, REQ_STATUS
        names = list(REQ_COUNTERS) + list(REQ_STATUS)
        return {n: await self.port.rreg(REQ_COUNTER_BASE + 4 * k) for k, n in enumerate(names)}

    def probes(self):
        """Internal signals for a hang report (Verilator exposes them to cocotb)."""
        out = {}
        for path in ("eng.fsm_state", "eng.wc__valid", "eng.wc__ready", "eng.wr__valid",
                     "eng.wr__ready", "eng.notify__valid", "eng.notify__ready", "req.fsm_state",
                     "req.wc__valid", "req.wc__ready", "hq.wc__ready", "resp.repost__ready",
                     "eng.repost__valid", "eng.repost__ready", "eng.cmd_pending", "eng.deferred"):
            h = self.dut
            try:
                for part in path.split("."):
                    h = getattr(h, part)
                out[path] = int(h.value)
            except Exception as e:         # not public in this build
                out[path] = type(e).__name__
        try:
            from hw.rtl.iface import WorkRequest
            from host.port import unpack_record
            out["eng.wrq"] = {k: hex(v) for k, v in
                              unpack_record(WorkRequest, int(self.dut.eng.wrq.value)).items()}
        except Exception as e:
            out["eng.wrq"] = repr(e)
        return out

    async def compare_image(self):
        lay = self.model.lay
        spans = [("head", lay["head"], 8), ("tail", lay["tail"], 8),
                 ("table", lay["table"], lay["table_size"]),
                 ("ring", lay["ring"], 16 * lay["ring_n"]),
                 ("pool", lay["pool"], lay["pool_size"])]
        for name, a, n in spans:
            got = await self.port.mem_read(a, n)
            want = bytes(self.model.mem[a:a + n])
            if got != want:
                bad = next(i for i in range(n) if got[i] != want[i])
                raise AssertionError(f"{name} differs at +{bad:#x}: target "
                                     f"{got[bad:bad + 16].hex()} model {want[bad:bad + 16].hex()}")

    async def engine_counts(self):
        out = {}
        for k, op in enumerate(FAST_OPS):
            for st in Status:
                v = await self.port.rreg(REG_KBTP + ENG["COUNT"] + 4 * (16 * k + st.value))
                if v:
                    out[(op.name, st.name)] = v
        return out


DIRECT = Features.DIRECT_LOAD.value | Features.DIRECT_ALLOC.value


async def mixed(dut, *, rounds, seed, loss=0.0, n_init=4, direct=False):
    """Random rounds. With ``direct``, initiator 0 holds a DIRECT_LOAD + DIRECT_ALLOC session:
    its turns are also DIRECT_LOAD reads and DIRECT_ALLOC allocations + BIND, and the driver
    serves all its requests (the engine leaves DIRECT_ALLOC sessions to the host)."""
    cfg = model_config(direct_partitions=1, direct_quota=4, masked=False) if direct else None
    b = SystemBench(dut, n_init=n_init, loss=loss, dup=loss, corrupt=loss / 5, seed=seed,
                    cfg=cfg)
    feats = [Features.RECORD_COMPLETION.value if q % 2 else 0 for q in range(n_init)]
    if direct:
        feats[0] = DIRECT
    await b.bring_up(features=feats)
    stats = {"requests": 0, "free": 0, "direct_load": 0, "bind": 0}
    for r in range(rounds):
        who = b.rng.sample(range(n_init), b.rng.randrange(1, n_init + 1))
        batch = []
        for q in who:
            if direct and q == 0 and b.rng.random() < 0.4:
                raw = await direct_step(b, 0, stats)
                if raw is None:
                    continue
                batch.append((q, raw))
            elif b.rng.random() < 0.15:
                batch.append((q, b.free_request(q)))
                stats["free"] += 1
            else:
                batch.append((q, b.gen.make(q)))
            if batch[-1][1][1] == Opcode.FREE.value or (direct and q == 0):
                b.slow_sent += 1
        if not batch:
            continue
        stats["requests"] += len(batch)
        await b.round(batch, stats)
        dut._log.info(f"round {r}: {[(q, raw[1]) for q, raw in batch]} ok at cycle {b.cycles}")
    await b.settle(2000)
    await b.compare_image()
    got = await b.engine_counts()
    fast = {o.name for o in FAST_OPS}
    want = {k: v for k, v in b.model.counters.items() if k[0] in fast}
    both = dict(got)
    for k, v in b.driver.stats.items():            # the direct session's, run by the host
        if k[0] in fast:
            both[k] = both.get(k, 0) + v
    assert both == want, f"engine + driver counters {both} vs model {want}"
    # The host handled exactly the slow-path messages: HELLOs, FREEs, and (direct) the
    # DIRECT_ALLOC session's requests; no fast-path request of any other initiator.
    assert len(b.handled) == b.slow_sent, (len(b.handled), b.slow_sent,
                                           [h.op for h in b.handled])
    assert {h.op for h in b.handled if not (direct and h.qp == 0)} <= {"HELLO", "FREE"}, \
        [(h.qp, h.op) for h in b.handled]
    hostq = await b.port.rreg(REG_KBTP + ENG["HOSTQ_COUNT"])
    assert hostq == b.slow_sent, (hostq, b.slow_sent)
    assert b.driver.host_actions == b.slow_sent
    FIGS[f"mixed_loss_{loss}"] = dict(
        stats, link=b.link.stats, fast_path=sum(got.values()), host_messages=hostq,
        stall_cycles=await b.port.rreg(REG_KBTP + ENG["STALL_CYCLES"]),
        peer_retransmissions=b.ep.counters.retransmissions, cycles=b.cycles)
    json.dump(FIGS, open("figures_system.json", "w"), indent=1, default=str)


@cocotb.test()
async def mixed_clean(dut):
    """Random rounds of LOAD / STORE / ALLOC_STORE / FREE from 4 initiators, no loss."""
    await mixed(dut, rounds=40, seed=3)


@cocotb.test()
async def mixed_lossy(dut):
    """The same under 2% loss, 2% duplication and 0.4% corruption in both directions, with
    initiator 0 in DIRECT_LOAD / DIRECT_ALLOC mode (unmasked counters, as RoCEv2 has)."""
    await mixed(dut, rounds=30, seed=4, loss=0.02, direct=True)


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
        stats["direct_load"] += 1
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
    stats["bind"] += 1
    b.gen.rid += 1
    return codec.encode(codec.Bind(request_id=b.gen.rid, handle=b.rng.choice(free),
                                   ticket=ticket, data_length=len(payload), block_offset=boff))


@cocotb.test()
async def latency(dut):
    """Cycles from the last request octet on rxd to the first response octet on txd."""
    b = SystemBench(dut, n_init=1, seed=9)
    await b.bring_up(features=[0])
    s = b.model.session_of(b.conns[0])
    h = s.handle_base
    out = {}
    for name, raw in [
            ("alloc_store_inline_64", build(Opcode.ALLOC_STORE, flags=ReqFlags.INLINE.value,
                                            rid=1, handle=h, length=64,
                                            inline=bytes(range(64)))),
            ("load_64", None)]:
        if raw is None:
            stag, to = b.gen.buffer(0, 64)
            raw = build(Opcode.LOAD, rid=2, handle=h, stag=stag, to=to, length=64,
                        flags=ReqFlags.ALLOW_UNSEALED.value)
        n_in, n_out = len(b.in_frames), len(b.out_frames)
        await b.round([(0, raw)], {})
        # The request: the frame into the DUT carrying the SEND Only (BTH opcode 0x04); its
        # last octet (FCS) was on rxd at t_in. The response: the first frame out carrying a
        # WRITE (First/Only) or a SEND Only; its first preamble octet was on txd at t_out.
        t_in = [t for t, f in b.in_frames[n_in:] if f[42] == 0x04][0]
        t_out = [t for t, f in b.out_frames[n_out:]
                 if f[12:14] == b"\x08\x00" and f[42] in (0x06, 0x0A, 0x04)][0]
        out[name] = int(t_out - t_in) // PERIOD_NS
    FIGS["latency_cycles"] = out
    json.dump(FIGS, open("figures_system.json", "w"), indent=1, default=str)


async def one_sided(b, q, op, *args):
    """One RDMA operation of initiator ``q`` on a target STag; returns its completion."""
    qp = b.qps[q]
    qp.poll_cq()                        # earlier completions (the initiator's Sends)
    getattr(qp, op)(*args)
    await b.run_until(lambda: not qp.outstanding, 400_000, f"{op} of initiator {q}")
    (c,) = qp.poll_cq()
    assert c.status.name == "SUCCESS", (op, args, c)
    return c


@cocotb.test()
async def direct(dut):
    """DIRECT_LOAD and DIRECT_ALLOC + BIND: one-sided RDMA on the target's table, pool,
    partition, ring and Head (answered by the gateware's responder: READ, FetchAdd, WRITE),
    then BIND through the driver; every octet read and every reply against the model."""
    from hw.headers import RING_ADD_DATA_UNMASKED

    cfg = model_config(direct_partitions=1, direct_quota=4, masked=False)
    b = SystemBench(dut, n_init=2, seed=21, cfg=cfg)
    feats = Features.DIRECT_LOAD.value | Features.DIRECT_ALLOC.value
    await b.bring_up(features=[feats, 0])
    ack = b.acks[0]
    assert ack.features & feats == feats, ack
    c0, c1 = b.conns
    # DIRECT_ALLOC by initiator 0: FetchAdd on its Head, READ the slot, WRITE the partition,
    # BIND; twice, so the second ticket lands in the next slot.
    for k in range(2):
        hd = ack.head
        old = (await one_sided(b, 0, "fetch_add", hd.tagged_offset, hd.stag,
                               RING_ADD_DATA_UNMASKED)).orig
        assert old == b.model.remote_fetch_add(c0, hd.stag, hd.tagged_offset,
                                               RING_ADD_DATA_UNMASKED)
        ticket = old >> 32
        rg = ack.ring
        sto = rg.tagged_offset + 16 * (ticket % rg.count)
        slot = (await one_sided(b, 0, "read", sto, rg.stag, 16)).data
        assert slot == b.model.remote_read(c0, rg.stag, sto, 16)
        seq, boff = codec.decode_slot(slot)
        assert seq == ticket, (seq, ticket)
        payload = bytes(b.rng.getrandbits(8) for _ in range(200 + k))
        await one_sided(b, 0, "write", boff, ack.partition.stag, payload)
        b.model.remote_write(c0, ack.partition.stag, boff, payload)
        h0 = b.model.session_of(c0).handle_base + k
        await b.round([(0, codec.encode(codec.Bind(request_id=10 + k, handle=h0, ticket=ticket,
                                                   data_length=len(payload),
                                                   block_offset=boff)))], {})
        b.slow_sent += 1
        done = codec.decode(b.events[0][-1][1])
        assert (done.status, done.block_offset) == (Status.OK.value, boff), done
        if k == 0:
            first = (h0, payload)
    # DIRECT_LOAD by initiator 0 of the first bound handle: entry, block, entry (the draft's
    # consistency check), every read against the model.
    h0, payload0 = first
    t = ack.table
    eto = t.tagged_offset + 16 * (h0 - ack.table_base_handle)
    e1 = (await one_sided(b, 0, "read", eto, t.stag, 16)).data
    assert e1 == b.model.remote_read(c0, t.stag, eto, 16)
    ent = codec.decode_entry(e1)
    assert ent.data_length == len(payload0)
    blk = (await one_sided(b, 0, "read", ent.block_offset, ack.pool.stag,
                           ent.data_length)).data
    assert blk == payload0 == b.model.remote_read(c0, ack.pool.stag, ent.block_offset,
                                            ent.data_length)
    assert (await one_sided(b, 0, "read", eto, t.stag, 16)).data == e1
    # A BIND of a ticket never taken: the model's answer (MALFORMED).
    await b.round([(0, codec.encode(codec.Bind(request_id=20, handle=b.model.session_of(c0)
                                               .handle_base + 5, ticket=77, data_length=8,
                                               block_offset=boff)))], {})
    b.slow_sent += 1
    assert codec.decode(b.events[0][-1][1]).status == Status.MALFORMED.value
    await b.settle(1000)
    await b.compare_image()
    FIGS["direct"] = dict(tickets=2, cycles=b.cycles)
    json.dump(FIGS, open("figures_system.json", "w"), indent=1, default=str)

# Ref: draft KBTP §Operations, §Free-Block Ring, §Completion, §Target Execution Model;
#      hw/target/target.py (engine wired in); host/driver.py (slow path); model/target.py (oracle);
#      roce/rc.py (initiators' RC endpoint); sim/channel.py (LossyLink); roce-layouts.md §6.
"""cocotb system bench: the whole target (transport + KBTP engine) and the host driver, serving
several initiators over GMII, checked against the golden model (run by
tests/sim/test_system_cocotb.py). The bench itself (rounds, model matching, image and counter
checks, the random workload) lives in :mod:`sim.system`, shared with the soak on the Verilated
harness (tools/soak.py); this module adds the cocotb plumbing.

Initiators: one :class:`roce.rc.RoceEndpoint` with ``N_INIT`` RC QPs, each an initiator with its
own session (HELLO through the driver). Frames cross a :class:`~sim.channel.LossyLink` into the
DUT's GMII (cocotbext-eth GmiiSource / GmiiSink; FCS checked there, ICRC by scapy). The host
driver (:class:`host.driver.KbtpDriver`) initialises target memory and the engine and serves the
slow path; the engine serves LOAD, STORE and ALLOC_STORE.

Oracle: :class:`model.target.TargetModel`. The bench runs *rounds*: in each, some initiators post
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

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import cocotb
from cocotb.triggers import ClockCycles, Lock
from cocotb.utils import get_sim_time, get_time_from_sim_steps
from cocotbext.eth import GmiiFrame

from host import codec
from hw.headers import Features, Opcode, ReqFlags, Status
from sim.hdl import cocotb_host_access, cocotb_start_gmii, get_params
from sim.system import (DIRECT, PERIOD_NS, STEP, SystemBench as _Bench, mixed as _mixed,
                        mixed_checks, model_config, one_sided)
from sim.vltarget import n_ranges_of
from sim.workload import build

FIGS = {}


class SystemBench(_Bench):
    """The plumbing of :class:`sim.system.SystemBench` on the cocotb DUT: GMII through
    cocotbext-eth, the host bus pins, the network and host loops as cocotb tasks."""

    def __init__(self, dut, **kw):
        p = get_params()
        super().__init__(n_qp=p["n_qp"], n_mr=p["n_mr"], mem_words=p["mem_words"],
                         n_ranges=n_ranges_of(p), **kw)
        self.dut = dut
        self.bus_lock = Lock()

    @property
    def cycles(self):
        return int(get_sim_time(unit="ns")) // PERIOD_NS

    async def wait(self, cycles):
        await ClockCycles(self.dut.clk, cycles)

    async def _start(self):
        self.src, self.sink = await cocotb_start_gmii(self.dut, PERIOD_NS)

    async def access(self, space, addr, we, wdata):
        async with self.bus_lock:      # the driver's loop and the test share the host bus
            return await self._access(space, addr, we, wdata)

    async def _access(self, space, addr, we, wdata):
        return await cocotb_host_access(self.dut, space, addr, we, wdata)

    def receive_frame(self, frame, t):          # link -> DUT
        def done(f, raw=frame):
            self.in_frames.append((get_time_from_sim_steps(f.sim_time_end, "ns"), raw))
        self.src.send_nowait(GmiiFrame.from_payload(frame, tx_complete=done))

    def start_net(self):
        cocotb.start_soon(self.net_loop())

    def start_host(self):
        cocotb.start_soon(self.host_loop())

    async def net_loop(self):
        """The network: frames between the DUT's GMII, the link and the initiators."""
        while True:
            await ClockCycles(self.dut.clk, STEP)
            out = []
            while not self.sink.empty():
                f = self.sink.recv_nowait()
                out.append((bytes(f.get_payload()), f.check_fcs(),
                            get_time_from_sim_steps(f.sim_time_start, "ns")))
            self.net_step(out)

    async def host_loop(self):
        """The host: the driver serves the slow path, concurrently with the network (it may
        wait for a WorkCompletion, which needs the initiator's ACK to cross the link)."""
        while True:
            if await self.host_step() is None:
                await ClockCycles(self.dut.clk, STEP)

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
            from hw.iface import WorkRequest
            from host.port import unpack_record
            out["eng.wrq"] = {k: hex(v) for k, v in
                              unpack_record(WorkRequest, int(self.dut.eng.wrq.value)).items()}
        except Exception as e:
            out["eng.wrq"] = repr(e)
        return out


async def mixed(dut, *, rounds, seed, loss=0.0, n_init=4, direct=False):
    """Random rounds (:func:`sim.system.mixed`). With ``direct``, initiator 0 holds a
    DIRECT_LOAD + DIRECT_ALLOC session: its turns are also DIRECT_LOAD reads and DIRECT_ALLOC
    allocations + BIND, and the driver serves all its requests (the engine leaves DIRECT_ALLOC
    sessions to the host)."""
    cfg = model_config(direct_partitions=1, direct_quota=4, masked=False) if direct else None
    b = SystemBench(dut, n_init=n_init, loss=loss, dup=loss, corrupt=loss / 5, seed=seed,
                    cfg=cfg)
    feats = [Features.RECORD_COMPLETION.value if q % 2 else 0 for q in range(n_init)]
    if direct:
        feats[0] = DIRECT
    await b.bring_up(features=feats)
    stats = await _mixed(b, rounds=rounds, direct=direct, log=dut._log.info)
    if loss:
        # More rounds (each model-matched) until the link has lost, duplicated and corrupted
        # frames and an end has retransmitted, at most ``max_extra`` of them.
        max_extra, extra = 40, 0
        while extra < max_extra and not _impaired(b.link.stats, await _retransmissions(b)):
            more = await _mixed(b, rounds=1, direct=direct, log=dut._log.info)
            for k, v in more.items():             # counts, and dicts of counts
                if isinstance(v, dict):
                    d = stats.setdefault(k, {})
                    for kk, n in v.items():
                        d[kk] = d.get(kk, 0) + n
                else:
                    stats[k] = stats.get(k, 0) + v
            extra += 1
        stats["extra_rounds"] = extra
    figs = FIGS[f"mixed_loss_{loss}"] = await mixed_checks(b, stats, direct=direct)
    if loss:
        figs["target_retransmits"] = (await b.req_counters())["cnt_retransmits"]
    json.dump(FIGS, open("figures_system.json", "w"), indent=1, default=str)
    if loss:
        # The link really impaired the traffic and the ends recovered by retransmitting (every
        # round matched the model, and the final image equals the model's: nothing was lost or
        # applied twice).
        st = figs["link"]
        assert st["lost"] > 0, f"no frame lost: {figs}"
        assert st["duplicated"] > 0, f"no frame duplicated: {figs}"
        assert st["corrupted"] > 0, f"no corrupted frame delivered: {figs}"
        assert figs["peer_retransmissions"] + figs["target_retransmits"] > 0, \
            f"no retransmission: {figs}"


async def _retransmissions(b):
    return b.ep.counters.retransmissions + (await b.req_counters())["cnt_retransmits"]


def _impaired(st, retransmissions):
    return st["lost"] and st["duplicated"] and st["corrupted"] and retransmissions


@cocotb.test()
async def mixed_clean(dut):
    """Random rounds of LOAD / STORE / ALLOC_STORE / FREE from 4 initiators, no loss."""
    await mixed(dut, rounds=40, seed=3)


@cocotb.test()
async def mixed_lossy(dut):
    """The same under 2% loss, 2% duplication and 0.4% corruption in both directions, with
    initiator 0 in DIRECT_LOAD / DIRECT_ALLOC mode (unmasked counters, as RoCEv2 has)."""
    await mixed(dut, rounds=30, seed=4, loss=0.02, direct=True)


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

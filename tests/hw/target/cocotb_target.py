# Ref: hw/target/target.py; roce-layouts.md §6 (RC rules, NAK table), §8 (ARP); roce/rc.py (peer);
#      sim/channel.py (LossyLink); cocotbext-eth GmiiSource/GmiiSink; sim/scapy_roce.py (ICRC).
"""cocotb system bench of :class:`hw.target.target.KbtpTarget` over GMII (run by
tests/hw/target/test_target_cocotb.py).

The peer is :class:`roce.rc.RoceEndpoint`, an independent Python RC endpoint; frames move
between it and the DUT's GMII (cocotbext-eth GmiiSource / GmiiSink) through a
:class:`sim.channel.LossyLink`, with the endpoint's clock = simulated time. Every frame the DUT
sends is checked: FCS (GmiiSink), and for RoCE the ICRC recomputed by scapy; ARP replies are
dissected by scapy. The host side (host/port.py TargetPort) programs addresses, QPs and MRs, reads
target memory, serves RecvNotify (checks the buffer, reposts it) and pushes WorkRequests.

Figures (cycles per payload octet of 64 KiB WRITE and READ) go to ``figures.json`` in the
test directory.
"""

import json
import random
import sys
from pathlib import Path

# The simulator's Python path is pytest's (tests/ is on it, the checkout may not be).
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import cocotb
from cocotb.triggers import ClockCycles
from cocotb.utils import get_sim_time
from cocotbext.eth import GmiiFrame
from scapy.layers.l2 import ARP, Ether

from hw.iface import QpState, REG_TRANSPORT, WcStatus as HwWc, WrOp as HwOp
from hw.rdma.responder import COUNTERS as RESP_COUNTERS
from hw.target.target import TOP_COUNTERS
from sim.channel import LossyLink
from sim.hdl import cocotb_host_access, cocotb_start_gmii, get_params
from roce.rc import RoceEndpoint, WcStatus
from sim.scapy_roce import RETH, AtomicETH, dissect_roce, icrc_of, roce_frame
from host.port import TargetPort

PERIOD_NS = 8
T_MAC, T_IP = "02:4b:42:54:50:01", "10.0.0.1"
P_MAC, P_IP = "02:00:00:00:00:02", "10.0.0.2"
T_QPN, P_QPN = 0x11, 0x20
PMTU, PMTU_CODE = 1024, 3
# Target memory plan (octets).
MR0 = dict(rkey=0x1000, va=0x7F0000010000, length=0x1000, laddr=0x1000)     # small, atomics
MR1 = dict(rkey=0x2000, va=0x100000000, length=0x10000, laddr=0x10000)      # 64 KiB
RECV_BASE, RECV_COUNT, RECV_LOG2 = 0x4000, 4, 12
SRC, SINK = 0x8000, 0xC000              # requester payload source / READ sink
PEER_RKEY, PEER_VA, INV_RKEY = 0x77, 0x5000, 0x99
STEP = 32                               # cycles between pump rounds
FIGS = {}


def counter_index(block, port):
    return TOP_COUNTERS.index((block, port))


class Bench:
    def __init__(self, dut, *, loss=0.0, dup=0.0, corrupt=0.0, seed=1, peer_timeout=8):
        self.dut = dut
        p = get_params()
        self.width = p["width"]
        self.mem_words = p["mem_words"]
        self.link = LossyLink(seed=seed, loss=loss, dup=dup, corrupt=corrupt, delay_us=1,
                              dup_gap_us=1)
        self.peer = RoceEndpoint(P_MAC, P_IP, seed=seed, min_frame=60)
        self.messages = []
        self.pqp = self.peer.create_qp(
            qpn=P_QPN, dest_qpn=T_QPN, remote_ip=T_IP, pmtu=PMTU, timeout=peer_timeout,
            sq_psn=0x10, epsn=0x200,
            on_message=lambda qp, d, imm=None, invalidated_rkey=None:
                self.messages.append((bytes(d), imm, invalidated_rkey)))
        self.pmem = bytearray(0x10000)
        self.peer.register(self.pmem, base_va=PEER_VA, rkey=PEER_RKEY)
        self.peer.register(bytearray(16), base_va=0, rkey=INV_RKEY)
        self.host = TargetPort(self.access)
        self.out_frames = []        # every frame the DUT sent (after checks)
        self.received = []          # (addr, length, data) of SENDs seen by the host
        self.wcs = []
        self.serve_notify = True
        self.blackhole = False      # drop every frame the DUT sends (the peer vanished)

    @property
    def cycles(self):
        return int(get_sim_time(unit="ns")) // PERIOD_NS

    async def start(self):
        self.src, self.sink = await cocotb_start_gmii(self.dut, PERIOD_NS)

    async def access(self, space, addr, we, wdata):
        return await cocotb_host_access(self.dut, space, addr, we, wdata)

    async def program(self, *, rq_psn=0x10, sq_psn=0x200, timeout=12, retry=7):
        h = self.host
        await h.set_own(T_MAC, T_IP)
        await h.set_mr(0, atomic=1, qp_mask=1, **MR0)
        await h.set_mr(1, qp_mask=1, **MR1)
        await h.set_qp(0, state=QpState.RTS, local_qpn=T_QPN, remote_qpn=P_QPN,
                       peer_mac=P_MAC, peer_ip=P_IP, udp_sport=0xC123, pmtu=PMTU_CODE,
                       rq_psn=rq_psn, sq_psn=sq_psn, timeout=timeout, retry_cnt=retry,
                       rnr_retry=7, recv_base=RECV_BASE, recv_count=RECV_COUNT,
                       recv_size_log2=RECV_LOG2)

    # ---- frame movement ------------------------------------------------------------------
    def check_out(self, raw):
        """Checks on one frame from the DUT (FCS already checked); returns it."""
        eth = Ether(raw)
        if eth.type == 0x0806:
            a = eth[ARP]
            assert a.op == 2 and a.psrc == T_IP and a.hwsrc == T_MAC and eth.src == T_MAC, \
                eth.summary()
        else:
            assert eth.src == T_MAC and eth.dst == P_MAC, eth.summary()
            assert raw[12:14] == b"\x08\x00"
            assert icrc_of(raw) == raw[-4:], f"bad ICRC from the DUT: {raw.hex()}"
            assert len(raw) >= 60
        self.out_frames.append(raw)
        return raw

    def receive_frame(self, frame, t):       # link -> DUT
        self.src.send_nowait(GmiiFrame.from_payload(frame))

    async def pump(self):
        now = self.cycles * PERIOD_NS / 1000
        while not self.sink.empty():
            f = self.sink.recv_nowait()
            assert f.check_fcs(), "bad FCS from the DUT"
            assert not any(f.error or []), "tx_er from the DUT"
            raw = self.check_out(bytes(f.get_payload()))
            if not self.blackhole:
                self.link.send(1, raw, now)
        self.link.deliver(now, (self.peer, self))
        self.peer.tick(now)
        for f in self.peer.poll_tx():
            self.link.send(0, f, now)
        if self.serve_notify:
            n = await self.host.poll_notify()
            if n is not None:
                data = await self.host.mem_read(n["addr"], (n["length"] + 3) & ~3)
                self.received.append((n["addr"], n["length"], data[:n["length"]], n))
                await self.host.repost(n["qp"])
        wc = await self.host.poll_wc()
        if wc is not None:
            self.wcs.append(wc)

    async def run_until(self, cond, max_cycles=2_000_000):
        end = self.cycles + max_cycles
        while not cond():
            assert self.cycles < end, "run_until: timed out"
            await ClockCycles(self.dut.clk, STEP)
            await self.pump()
        return self.cycles

    async def settle(self, cycles=3000):
        end = self.cycles + cycles
        await self.run_until(lambda: self.cycles >= end)

    async def resp_counter(self, name):
        return await self.host.rreg(REG_TRANSPORT + 4 * RESP_COUNTERS.index(name))

    async def top_counter(self, block, port):
        return await self.host.top_counter(counter_index(block, port))

    async def req_counter(self, name):
        from hw.target.target import REQ_COUNTER_BASE, REQ_COUNTERS, REQ_STATUS
        names = list(REQ_COUNTERS) + list(REQ_STATUS)
        return await self.host.rreg(REQ_COUNTER_BASE + 4 * names.index(name))


def ok(c):
    return c.status == WcStatus.SUCCESS


async def peer_ops(b, rng, rounds=1, fa_adds=None):
    """The peer's operations against the target: multi-packet SEND, WRITE, multi-packet READ,
    FetchAdd, CmpSwap. Checks data in target memory and the peer's completions."""
    q = b.pqp
    fa_va, cs_va = MR0["va"] + 0x100, MR0["va"] + 0x108
    fa_total = int.from_bytes(await b.host.mem_read(MR0["laddr"] + 0x100, 8), "little")
    expected_sends = []
    for r in range(rounds):
        msg = rng.randbytes(rng.randrange(1, 3 * PMTU + 100))
        expected_sends.append(msg)
        q.send(msg)
        wdata = rng.randbytes(rng.randrange(1, 2 * PMTU + 50))
        woff = 0x200 + rng.randrange(0, MR0["length"] - 0x200 - len(wdata))
        q.write(MR0["va"] + woff, MR0["rkey"], wdata)
        add = rng.randrange(1, 1 << 32)
        fa_total += add
        q.fetch_add(fa_va, MR0["rkey"], add)
        q.read(MR0["va"] + woff, MR0["rkey"], len(wdata))
        await b.run_until(lambda: not q.outstanding)
        cq = q.poll_cq()
        assert all(ok(c) for c in cq), cq
        rd = [c for c in cq if c.data is not None]
        assert rd[-1].data == wdata, "READ back of the WRITE differs"
        got = await b.host.mem_read(MR0["laddr"] + (woff & ~3), ((len(wdata) + (woff & 3)) + 3)
                                    & ~3)
        assert got[woff & 3:(woff & 3) + len(wdata)] == wdata, "WRITE data in target memory"
    # CmpSwap: one that matches and one that does not.
    cur = int.from_bytes(await b.host.mem_read(MR0["laddr"] + 0x108, 8), "little")
    q.cmp_swap(cs_va, MR0["rkey"], cur ^ 1, 0x1111)          # no swap
    q.cmp_swap(cs_va, MR0["rkey"], cur, 0xFEEDFACE12345678)  # swap
    await b.run_until(lambda: not q.outstanding)
    cq = q.poll_cq()
    assert all(ok(c) for c in cq) and [c.orig for c in cq] == [cur, cur], cq
    assert int.from_bytes(await b.host.mem_read(MR0["laddr"] + 0x108, 8), "little") == \
        0xFEEDFACE12345678
    fa = int.from_bytes(await b.host.mem_read(MR0["laddr"] + 0x100, 8), "little")
    assert fa == fa_total % (1 << 64), f"FetchAdd sum {fa:#x} != {fa_total:#x} (applied twice?)"
    # SENDs delivered to the host, in order, once each, intact.
    await b.run_until(lambda: len(b.received) >= len(expected_sends), 200_000)
    await b.settle(2000)
    assert [x[2] for x in b.received] == expected_sends, \
        f"{len(b.received)} messages received, {len(expected_sends)} sent"
    for addr, length, _, n in b.received:
        assert RECV_BASE <= addr < RECV_BASE + (RECV_COUNT << RECV_LOG2)
    b.received.clear()


async def target_ops(b, rng):
    """The target's requester: WRITE, SEND, SEND_INV, WRITE_IMM, READ (host WorkRequests)."""
    h = b.host
    wdata = rng.randbytes(2 * PMTU + 37)
    sdata = rng.randbytes(PMTU + 5)
    rsrc = rng.randbytes(3 * PMTU + 11)
    b.pmem[0x8000:0x8000 + len(rsrc)] = rsrc
    await h.mem_write(SRC, wdata + bytes(-len(wdata) % 4))
    await h.mem_write(SRC + 0x1000, sdata + bytes(-len(sdata) % 4))
    b.messages.clear()
    b.wcs.clear()
    wrs = [dict(wr_id=1, op=HwOp.WRITE, rkey=PEER_RKEY, va=PEER_VA + 0x100, length=len(wdata),
                laddr=SRC),
           dict(wr_id=2, op=HwOp.SEND, length=len(sdata), laddr=SRC + 0x1000),
           dict(wr_id=3, op=HwOp.SEND_INV, length=16, laddr=SRC + 0x1000, inv_rkey=INV_RKEY),
           dict(wr_id=4, op=HwOp.WRITE_IMM, rkey=PEER_RKEY, va=PEER_VA + 0x3000, length=100,
                laddr=SRC, imm=0xCAFEBABE),
           dict(wr_id=5, op=HwOp.READ, rkey=PEER_RKEY, va=PEER_VA + 0x8000, length=len(rsrc),
                laddr=SINK)]
    for w in wrs:
        await h.post_wr(qp=0, **w)
    await b.run_until(lambda: len(b.wcs) >= len(wrs))
    assert [(w["wr_id"], w["status"]) for w in b.wcs] == \
        [(i, HwWc.OK.value) for i in range(1, 6)], b.wcs
    assert bytes(b.pmem[0x100:0x100 + len(wdata)]) == wdata
    assert bytes(b.pmem[0x3000:0x3000 + 100]) == wdata[:100]
    assert b.messages[0] == (sdata, None, None)
    assert b.messages[1] == (sdata[:16], None, INV_RKEY)
    assert b.messages[2][1] == 0xCAFEBABE
    assert len(b.messages) == 3
    got = await h.mem_read(SINK, (len(rsrc) + 3) & ~3)
    if got[:len(rsrc)] != rsrc:
        await b.settle(20000)
        later = await h.mem_read(SINK, 16)
        firsts = [k for k in range(0, len(got), 4) if got[k:k + 4] != rsrc[k:k + 4]]
        want = [int.from_bytes(rsrc[k:k + 4], "little") for k in range(0, 64, 4)]
        found = [a for a in range(0, b.mem_words * 8, 4)
                 if await h.read(1, a) in want]
        raise AssertionError(f"READ data in target memory: {len(firsts)} words differ, first "
                             f"{firsts[:4]}; later {later.hex()} vs {rsrc[:16].hex()}; "
                             f"peer {b.peer.counters}; found at {[hex(a) for a in found[:8]]}")
    # The peer registered INV_RKEY once: re-register for the next round.
    b.peer.register(bytearray(16), base_va=0, rkey=INV_RKEY)


async def bring_up(b):
    await b.start()
    await b.program()
    # The peer resolves the target's MAC with ARP through the DUT.
    assert b.peer.resolve(T_IP) is None
    await b.run_until(lambda: b.peer.resolve(T_IP) is not None, 50_000)
    arps = [f for f in b.out_frames if f[12:14] == b"\x08\x06"]
    assert arps and Ether(arps[0])[ARP].pdst == P_IP
    assert await b.top_counter("arp", "cnt_answered") >= 1


@cocotb.test()
async def clean(dut):
    """No loss: ARP, the peer's operations, the target's requester, 64 KiB throughput."""
    b = Bench(dut)
    await bring_up(b)
    rng = random.Random(5)
    await peer_ops(b, rng, rounds=2)
    # 64 KiB WRITE then READ by the peer, cycles per payload octet.
    q = b.pqp
    big = rng.randbytes(0x10000)
    t0 = b.cycles
    q.write(MR1["va"], MR1["rkey"], big)
    await b.run_until(lambda: not q.outstanding)
    t1 = b.cycles
    q.read(MR1["va"], MR1["rkey"], len(big))
    await b.run_until(lambda: not q.outstanding)
    t2 = b.cycles
    cq = q.poll_cq()
    assert all(ok(c) for c in cq) and cq[-1].data == big
    for off in (0, 0x7FF8, 0xFFF8):
        assert await b.host.mem_read(MR1["laddr"] + off, 8) == big[off:off + 8]
    FIGS.update(width=b.width, write_64k_cycles_per_octet=round((t1 - t0) / len(big), 4),
                read_64k_cycles_per_octet=round((t2 - t1) / len(big), 4),
                frames_out_clean=len(b.out_frames))
    json.dump(FIGS, open("figures.json", "w"))
    await target_ops(b, rng)


async def lossy(dut, rate, seed, max_extra=25):
    """The peer's and the target's operations (every result checked) through ``rate`` loss,
    duplication and corruption both ways. The link must really have lost, duplicated and
    corrupted frames, and the ends must have retransmitted: at 1 % the first rounds may see no
    impairment, so more rounds (each checked) follow until it has, at most ``max_extra``; a
    link that impairs nothing (loss=0) fails."""
    b = Bench(dut, loss=rate, dup=rate, corrupt=rate, seed=seed, peer_timeout=7)
    await bring_up(b)
    rng = random.Random(seed)
    await peer_ops(b, rng, rounds=3)
    await target_ops(b, rng)

    async def retransmissions():
        return b.peer.counters.retransmissions + await b.req_counter("cnt_retransmits")

    def impaired(st):
        return st["lost"] and st["duplicated"] and st["corrupted"]

    extra = 0
    while extra < max_extra and not (impaired(b.link.stats) and await retransmissions()):
        await (peer_ops(b, rng) if extra % 2 else target_ops(b, rng))
        extra += 1
    st = dict(b.link.stats)
    figs = dict(st, frames_out=len(b.out_frames), extra_rounds=extra,
                icrc_bad=await b.top_counter("icrc", "cnt_bad"),
                peer_retransmissions=b.peer.counters.retransmissions,
                target_retransmits=await b.req_counter("cnt_retransmits"),
                duplicates_at_target=await b.resp_counter("cnt_duplicates"))
    FIGS[f"loss_{rate}"] = figs
    json.dump(FIGS, open("figures.json", "w"))
    # The link really impaired the traffic, and the ends recovered by retransmitting (the
    # operations' own checks above say the data arrived intact, exactly once).
    assert st["lost"] > 0, f"no frame lost: {figs}"
    assert st["duplicated"] > 0, f"no frame duplicated: {figs}"
    assert st["corrupted"] > 0, f"no corrupted frame delivered: {figs}"
    assert figs["peer_retransmissions"] + figs["target_retransmits"] > 0, \
        f"no retransmission: {figs}"


@cocotb.test()
async def lossy_1pct(dut):
    # Seed 11 lost no frame in its first 426 at 1 %: a seed whose link impairs early.
    await lossy(dut, 0.01, 26)


@cocotb.test()
async def lossy_5pct(dut):
    await lossy(dut, 0.05, 12)


@cocotb.test()
async def negative(dut):
    """Raw frames: bad ICRC, wrong QPN, PSN ahead, bad R_Key, out of range, misaligned atomic,
    not our MAC / IP. Checks the answer (NAK code or nothing), the counters, memory."""
    b = Bench(dut)
    b.serve_notify = False
    await b.start()
    await b.program(rq_psn=0x100)
    base = MR0["laddr"] + 0x800
    before = await b.host.mem_read(base, 64)
    psn = [0x100]

    def write_frame(*, rkey=MR0["rkey"], va=MR0["va"] + 0x800, data=b"\xAA" * 32, qpn=T_QPN,
                    p=None, dst_mac=T_MAC, dst_ip=T_IP):
        reth = dict(va=va, rkey=rkey, dma_length=len(data))
        return bytes(roce_frame(0x0A, data, ext={RETH: reth},
                                bth=dict(dqpn=qpn, psn=psn[0] if p is None else p, ackreq=1),
                                src_mac=P_MAC, dst_mac=dst_mac, src_ip=P_IP, dst_ip=dst_ip))

    async def inject(frame, wait=3000):
        b.out_frames.clear()
        b.src.send_nowait(GmiiFrame.from_payload(frame))
        end = b.cycles + wait
        while b.cycles < end:
            await ClockCycles(dut.clk, STEP)
            while not b.sink.empty():
                f = b.sink.recv_nowait()
                assert f.check_fcs()
                b.check_out(bytes(f.get_payload()))
        # BTH .. ICRC: UDP length - 8 octets after the 42 header octets (padding excluded).
        return [dissect_roce(f[42:34 + int.from_bytes(f[38:40], "big")]) for f in b.out_frames
                if f[12:14] == b"\x08\x00"]

    def naks(out):
        return [(x[1]["aeth"]["syndrome"], x[0]["psn"]) for x in out if x[0]["opcode"] == 0x11]

    async def reload_qp():
        await b.host.set_qp(0, state=QpState.RTS, rq_psn=psn[0])

    # Bad ICRC: dropped, counted.
    c0 = await b.top_counter("icrc", "cnt_bad")
    f = bytearray(write_frame())
    f[-1] ^= 0x40
    assert await inject(bytes(f)) == []
    assert await b.top_counter("icrc", "cnt_bad") == c0 + 1
    # Wrong QPN: dropped, counted by the responder.
    c0 = await b.resp_counter("cnt_unknown_qp")
    assert await inject(write_frame(qpn=0x345)) == []
    assert await b.resp_counter("cnt_unknown_qp") == c0 + 1
    # Not our MAC / not our IP: dropped by EthIpRx.
    c0 = await b.top_counter("ethrx", "cnt_mac")
    assert await inject(write_frame(dst_mac="02:4b:42:54:50:99")) == []
    assert await b.top_counter("ethrx", "cnt_mac") == c0 + 1
    c0 = await b.top_counter("ethrx", "cnt_ip")
    assert await inject(write_frame(dst_ip="10.0.0.9")) == []
    assert await b.top_counter("ethrx", "cnt_ip") == c0 + 1
    # PSN ahead: NAK sequence error carrying ePSN, once; the next one ahead is silent.
    c0 = await b.resp_counter("cnt_seq_naks")
    assert naks(await inject(write_frame(p=psn[0] + 5))) == [(0x60, psn[0])]
    assert naks(await inject(write_frame(p=psn[0] + 6))) == []
    assert await b.resp_counter("cnt_seq_naks") == c0 + 1
    assert await b.host.mem_read(base, 64) == before, "memory changed by dropped requests"
    # Fatal errors (the responder QP goes to Error): reload the QP before each.
    for name, frame, code in [
            ("bad R_Key", lambda: write_frame(rkey=0xBAD), 0x62),
            ("out of range", lambda: write_frame(va=MR0["va"] + MR0["length"] - 8), 0x62),
            ("misaligned atomic", lambda: bytes(roce_frame(
                0x14, ext={AtomicETH: dict(va=MR0["va"] + 0x804, rkey=MR0["rkey"],
                                           swap_add=1)},
                bth=dict(dqpn=T_QPN, psn=psn[0], ackreq=1), src_mac=P_MAC, dst_mac=T_MAC,
                src_ip=P_IP, dst_ip=T_IP)), 0x61)]:
        await reload_qp()
        out = naks(await inject(frame()))
        assert out == [(code, psn[0])], f"{name}: {out}"
        assert await b.host.mem_read(base, 64) == before, f"{name}: memory changed"
        psn[0] += 1
    assert (await b.resp_counter("cnt_rkey_errors")
            + await b.resp_counter("cnt_nak_access")) >= 2
    # A good WRITE after reload still works (and is the only change in memory).
    await reload_qp()
    out = naks(await inject(write_frame()))
    assert len(out) == 1 and out[0][0] >> 5 == 0 and out[0][1] == psn[0], out   # ACK
    assert (await b.host.mem_read(base, 64))[:32] == b"\xAA" * 32
    FIGS["negative"] = "pass"
    json.dump(FIGS, open("figures.json", "w"))


@cocotb.test()
async def retry_exhausted(dut):
    """The peer vanishes (the link drops every frame from the DUT): the target's WRITE is
    retransmitted retry_cnt times, then the QP goes to error and the host is told: the
    WorkCompletion says RETRY_EXCEEDED, the next request is flushed, the QP's error bit and the
    error count are set, and the retransmissions are counted. A reload of the QP recovers."""
    from hw.target.target import REQ_COUNTER_BASE, REQ_COUNTERS, REQ_STATUS

    b = Bench(dut, peer_timeout=7)
    await bring_up(b)
    h = b.host
    retry = 2

    async def req_reg(name):
        names = list(REQ_COUNTERS) + list(REQ_STATUS)
        return await h.rreg(REQ_COUNTER_BASE + 4 * names.index(name))

    # Retry counts are taken on the move to RTS (as IB's RTR->RTS): reset the QP first.
    await h.set_qp(0, state=QpState.RESET)
    await h.set_qp(0, state=QpState.RTS, sq_psn=0x300, timeout=10, retry_cnt=retry)
    assert await req_reg("qp_error") == 0 and await req_reg("error_events") == 0
    r0 = await req_reg("cnt_retransmits")
    b.blackhole = True                     # everything the DUT sends is lost
    sent_before = len(b.out_frames)
    await h.mem_write(SRC, bytes(range(64)))
    await h.post_wr(qp=0, wr_id=0x41, op=HwOp.WRITE, rkey=PEER_RKEY, va=PEER_VA, length=64,
                    laddr=SRC)
    await h.post_wr(qp=0, wr_id=0x42, op=HwOp.SEND, length=16, laddr=SRC)
    b.wcs.clear()
    try:
        await b.run_until(lambda: len(b.wcs) >= 2, 400_000)
    except AssertionError:
        names = list(REQ_COUNTERS) + list(REQ_STATUS)
        regs = {n: await req_reg(n) for n in names}
        raise AssertionError(f"no RETRY_EXCEEDED: WCs {b.wcs}, requester {regs}, "
                             f"{len(b.out_frames) - sent_before} frames out") from None
    assert [(w["wr_id"], w["status"]) for w in b.wcs] == \
        [(0x41, HwWc.RETRY_EXCEEDED.value), (0x42, HwWc.FLUSHED.value)], b.wcs
    assert await req_reg("qp_error") == 1
    assert await req_reg("error_events") == 1
    assert await req_reg("cnt_retransmits") - r0 >= retry
    # One original WRITE + `retry` retransmissions left the DUT (all lost on the link).
    writes = [f for f in b.out_frames[sent_before:] if f[12:14] == b"\x08\x00"
              and f[42] == 0x0A]                # BTH opcode RC RDMA WRITE Only
    assert len(writes) == 1 + retry, len(writes)
    assert bytes(b.pmem[0:64]) == bytes(64), "nothing reached the peer"
    # Recovery: the host reloads the QP (as after a reconnect), the link heals.
    b.blackhole = False
    await h.set_qp(0, state=QpState.RTS, sq_psn=0x400, timeout=10, retry_cnt=retry)
    b.pqp.modify(epsn=0x400)              # the peer side of the reconnection
    await b.settle(2000)
    assert await req_reg("qp_error") == 0
    b.wcs.clear()
    await h.post_wr(qp=0, wr_id=0x43, op=HwOp.WRITE, rkey=PEER_RKEY, va=PEER_VA, length=64,
                    laddr=SRC)
    await b.run_until(lambda: len(b.wcs) >= 1, 200_000)
    assert [(w["wr_id"], w["status"]) for w in b.wcs] == [(0x43, HwWc.OK.value)]
    assert bytes(b.pmem[0:64]) == bytes(range(64))
    FIGS["retry_exhausted"] = dict(retry_cnt=retry, frames_lost=len(writes))
    json.dump(FIGS, open("figures.json", "w"))

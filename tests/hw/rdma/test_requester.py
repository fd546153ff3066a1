# Ref: roce-layouts.md §3, §6.3-§6.7 (RC requester rules); hw/rdma/requester.py;
#      sim/scapy_roce.py.
"""RC requester in Amaranth's simulator, end to end through TxPath, RoceTxBuilder, RoceRxParser.

Work requests go in; the request packets the gateware builds are dissected with scapy and fed to
a small independent RC responder written here (:class:`Peer`, rules of roce-layouts.md §6); its
answers (ACK / NAK / READ responses, built by scapy) go back through the real RoceRxParser and
RespDemux. Oracles: the peer's view (received SEND messages, remote memory after WRITEs, which
PSNs arrived), target memory after READs (the peer's memory), and the completion list.
"""

import gc
import random

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
from amaranth.hdl import Module
from amaranth.lib import wiring
from amaranth.sim import Simulator

from hw.iface import QPN_BASE, QpState, WcStatus, WrOp
from hw.lib.membus import MemArbiter, MemRam
from hw.rdma.requester import RespDemux, Requester, ack_timeout_cycles
from hw.rdma.roce_hdr import RoceRxParser, RoceTxBuilder
from hw.rdma.qp import QpTable
from hw.rdma.txpath import TxPath
from sim.hdl import beats_to_packet, stream_get, stream_put
from tests.hw.rdma.responder_bench import write_qp
from sim.scapy_roce import AETH, dissect_roce, roce_frame, roce_rx_beats

WORDS = 8192                    # 64 KiB of target memory
CLK_HZ = 125e6
SCALE = 512                     # timeout code 12 -> 4096 cycles
TIMEOUT_CODE = 12
LOCAL_QPN = [QPN_BASE + i for i in range(64)]          # QP table index i
REMOTE_QPN = [0x345 + i for i in range(64)]
RKEY = 0x1234
VA0 = 0x10000
# QP 0 and QP 63 wrap through 0 (24-bit arithmetic).
SQ_PSN = [0xFFFFF0, 0x100] + [(0x40000 * (i + 1) - 3) % (1 << 24) for i in range(2, 64)]


class Top(wiring.Component):
    def __init__(self, width, img, n_qp=2, sq_depth=8):
        self.req = Requester(width, n_qp, sq_depth, CLK_HZ, SCALE)
        self.txp = TxPath(width, 1, n_qp)
        self.bld = RoceTxBuilder(width)
        self.prs = RoceRxParser(width)
        self.dmx = RespDemux(width)
        self.arb = MemArbiter(2)
        self.ram = MemRam(WORDS, init=MemRam.words_from_bytes(img))
        self.qpt = QpTable(n_qp)
        self.n_qp = n_qp
        super().__init__({})

    def elaborate(self, platform):
        m = Module()
        for name in ("req", "txp", "bld", "prs", "dmx", "arb", "ram"):
            m.submodules[name] = getattr(self, name)
        wiring.connect(m, self.req.tx, self.txp.src[0])
        wiring.connect(m, self.txp.hdr, self.bld.hdr)
        wiring.connect(m, self.txp.payload, self.bld.payload)
        wiring.connect(m, self.prs.hdr, self.dmx.hdr)
        wiring.connect(m, self.prs.payload, self.dmx.payload)
        wiring.connect(m, self.dmx.req_hdr, self.req.rsp_hdr)
        wiring.connect(m, self.dmx.req_payload, self.req.rsp_payload)
        m.d.comb += [self.dmx.resp_hdr.ready.eq(1), self.dmx.resp_payload.ready.eq(1)]
        wiring.connect(m, self.req.mem, self.arb.masters[0])
        wiring.connect(m, self.txp.mem, self.arb.masters[1])
        wiring.connect(m, self.arb.bus, self.ram.bus)
        # The QP table, written through its host bus (write_qp).
        m.submodules.qpt = qpt = self.qpt
        wiring.connect(m, self.req.intake, qpt.intake)
        wiring.connect(m, self.req.cfg, qpt.req)
        wiring.connect(m, self.txp.cfg, qpt.tx)
        m.d.comb += [self.req.load_valid.eq(qpt.load_valid), self.req.load_qp.eq(qpt.load_qp),
                     self.req.load_row.eq(qpt.load_row)]
        return m


def ceil_div(a, b):
    return -(-a // b)


class Peer:
    """Minimal RC responder for one QP (roce-layouts.md §6.2-§6.6), working on scapy fields.

    Remote memory: ``mem`` at VA ``VA0`` behind R_Key ``RKEY``. Knobs: ``drop_req(n, bth)`` /
    ``drop_rsp(n, opcode, psn)`` lose packets (n counts packets seen in that direction),
    ``rnr`` = number of SEND first/only packets to refuse with RNR NAK, ``black_hole`` ignores
    everything.
    """

    def __init__(self, qp, pmtu, epsn, mem_size=0x4000, rnr_code=14):
        self.qp, self.pmtu, self.epsn = qp, pmtu, epsn
        self.msn = 0
        self.mem = bytearray(random.Random(qp).getrandbits(8) for _ in range(mem_size))
        self.messages = []          # (payload, imm, inv_rkey) of completed SENDs / WRITE_IMMs
        self.cur_send = None
        self.wva = None
        self.nak_armed = True
        self.rnr, self.rnr_code = 0, rnr_code
        self.black_hole = False
        self.drop_req = lambda n, bth: False
        self.drop_rsp = lambda n, op, psn: False
        self.n_req = self.n_rsp = 0
        self.seen = []              # (opcode, psn) of every request packet received (not dropped)
        self.error = False

    def frame(self, op, psn, payload=b"", syndrome=None):
        ext = {AETH: {"syndrome": syndrome, "msn": self.msn}} if syndrome is not None else {}
        f = bytes(roce_frame(op, payload, ext=ext,
                             bth={"psn": psn & 0xFFFFFF, "dqpn": LOCAL_QPN[self.qp]},
                             ip_id=self.n_rsp))
        return f

    def handle(self, bth, ext, payload):
        """One request packet in -> list of response frames."""
        n = self.n_req
        self.n_req += 1
        if self.black_hole or self.error or self.drop_req(n, bth):
            return []
        op, psn = bth["opcode"], bth["psn"]
        self.seen.append((op, psn))
        d = (psn - self.epsn) % (1 << 24)
        out = []
        if d == 0:
            self.nak_armed = True
            out = self.execute(op, psn, bth, ext, payload)
        elif d >= 1 << 23:                                  # duplicate
            if op == 0x0C:
                out = self.read_responses(psn, ext["reth"])
            elif bth["ackreq"]:
                out = [self.frame(0x11, self.epsn - 1, syndrome=0x1F)]
        elif self.nak_armed:                               # ahead: NAK once per episode
            self.nak_armed = False
            out = [self.frame(0x11, self.epsn, syndrome=0x60)]
        kept = []
        for f in out:
            r = self.n_rsp
            self.n_rsp += 1
            b = dissect_roce(f[42:])[0]
            if not self.drop_rsp(r, b["opcode"], b["psn"]):
                kept.append(f)
        return kept

    def read_responses(self, psn, reth):
        ln, va = reth["dma_length"], reth["va"]
        n = max(1, ceil_div(ln, self.pmtu))
        data = bytes(self.mem[va - VA0:va - VA0 + ln])
        out = []
        for i in range(n):
            seg = data[i * self.pmtu:(i + 1) * self.pmtu]
            if n == 1:
                op = 0x10
            else:
                op = 0x0D if i == 0 else 0x0F if i == n - 1 else 0x0E
            out.append(self.frame(op, psn + i, seg, None if op == 0x0E else 0x1F))
        return out

    def rkey_ok(self, reth):
        return (reth["rkey"] == RKEY and reth["va"] >= VA0 and
                reth["va"] + reth["dma_length"] <= VA0 + len(self.mem))

    def execute(self, op, psn, bth, ext, payload):
        if op in (0x00, 0x04, 0x05, 0x17) and self.rnr:
            self.rnr -= 1
            return [self.frame(0x11, psn, syndrome=0x20 | self.rnr_code)]
        if op in (0x06, 0x0A, 0x0B, 0x0C) and not self.rkey_ok(ext["reth"]):
            self.error = True
            return [self.frame(0x11, psn, syndrome=0x62)]
        if op == 0x0C:
            n = max(1, ceil_div(ext["reth"]["dma_length"], self.pmtu))
            self.epsn = (self.epsn + n) % (1 << 24)
            self.msn += 1
            return self.read_responses(psn, ext["reth"])
        self.epsn = (self.epsn + 1) % (1 << 24)
        last = op in (0x02, 0x03, 0x04, 0x05, 0x08, 0x09, 0x0A, 0x0B, 0x16, 0x17)
        if op <= 0x05 or op in (0x16, 0x17):                 # SEND
            if op in (0x00, 0x04, 0x05, 0x17):
                self.cur_send = b""
            self.cur_send += payload
            if last:
                self.messages.append(("send", self.cur_send, ext.get("imm", {}).get("imm"),
                                      ext.get("ieth", {}).get("rkey")))
        else:                                                # WRITE
            if "reth" in ext:
                self.wva = ext["reth"]["va"]
            self.mem[self.wva - VA0:self.wva - VA0 + len(payload)] = payload
            self.wva += len(payload)
            if op in (0x09, 0x0B):
                self.messages.append(("imm", b"", ext["imm"]["imm"], None))
        if last:
            self.msn += 1
        if bth["ackreq"]:
            return [self.frame(0x11, psn, syndrome=0x1F)]
        return []


class Bench:
    """Runs a list of work requests against one Peer per QP; collects everything."""

    def __init__(self, width, pmtu_code=1, seed=0, idle=0.0, bp=0.0, n_qp=2, retry_cnt=3,
                 rnr_retry=3, timeout=TIMEOUT_CODE, latency=20):
        self.width, self.rng = width, random.Random(seed)
        self.img = bytes(self.rng.getrandbits(8) for _ in range(WORDS * 8))
        self.top = Top(width, self.img, n_qp)
        self.pmtu = 128 << pmtu_code
        self.pmtu_code = pmtu_code
        self.peers = [Peer(i, self.pmtu, SQ_PSN[i]) for i in range(n_qp)]
        self.idle, self.bp, self.latency = idle, bp, latency
        self.retry_cnt, self.rnr_retry, self.timeout = retry_cnt, rnr_retry, timeout
        self.sent = []              # (qp, opcode, psn, cycle) of every packet on the wire
        self.wcs = []
        self.events = []
        self.final_mem = None
        self.cycles = 0

    async def cfg(self, ctx):
        """Every QP written through the QP table's host bus, state (RTS, the load) last."""
        for i in range(self.top.n_qp):
            await write_qp(ctx, self.top.qpt.bus, i, **self.qp_values(i))

    def qp_values(self, i):
        return dict(state=QpState.RTS.value, local_qpn=LOCAL_QPN[i], remote_qpn=REMOTE_QPN[i],
                    peer_mac=0x525400000002, peer_ip=0x0A000002, udp_sport=50000 + i,
                    pmtu=self.pmtu_code, sq_psn=SQ_PSN[i], timeout=self.timeout,
                    retry_cnt=self.retry_cnt, rnr_retry=self.rnr_retry)

    def run(self, wrs, n_wc=None, max_cycles=200_000, extra=()):
        """``extra``: more background testbenches (``async def f(ctx)``); ``self.now[0]`` is
        the cycle count."""
        top, width = self.top, self.width
        n_wc = len(wrs) if n_wc is None else n_wc
        rx_q = []                   # (ready_cycle, frame)
        now = self.now = [0]

        async def clock(ctx):
            while True:
                await ctx.tick()
                now[0] += 1
                if ctx.get(top.req.error_event):
                    self.events.append((ctx.get(top.req.error_qp), now[0]))

        async def wr_src(ctx):
            await self.cfg(ctx)
            await ctx.tick()                # the last load event takes effect
            await stream_put(ctx, top.req.wr, wrs, idle=self.idle, rng=self.rng)

        async def tx_sink(ctx):
            while True:
                beats = []
                while not beats or not beats[-1].last:
                    beats.append(await stream_get(ctx, top.bld.o, backpressure=self.bp,
                                                  rng=self.rng))
                pkt = beats_to_packet([{"data": b.data, "keep": b.keep, "last": b.last}
                                       for b in beats], width)
                bth, ext, payload, _ = dissect_roce(pkt + bytes(4))
                qp = REMOTE_QPN.index(bth["dqpn"])
                self.sent.append((qp, bth["opcode"], bth["psn"], now[0], payload))
                for f in self.peers[qp].handle(bth, ext, payload):
                    rx_q.append((now[0] + self.latency, f))

        async def rx_src(ctx):
            while True:
                if rx_q and rx_q[0][0] <= now[0]:
                    _, f = rx_q.pop(0)
                    await stream_put(ctx, top.prs.i, roce_rx_beats(f, width), idle=self.idle,
                                     rng=self.rng)
                else:
                    await ctx.tick()

        async def main(ctx):
            while len(self.wcs) < n_wc and now[0] < max_cycles:
                ready = not (self.bp and self.rng.random() < self.bp)
                ctx.set(top.req.wc.ready, ready)
                *_, valid, p = await ctx.tick().sample(top.req.wc.valid, top.req.wc.payload)
                if ready and valid:
                    self.wcs.append((p.qp, p.wr_id, WcStatus(p.status)))
            self.cycles = now[0]
            raw = b"".join(ctx.get(top.ram.mem.data[i]).to_bytes(8, "little")
                           for i in range(WORDS))
            self.final_mem = raw
            self.qp_error = ctx.get(top.req.qp_error)
            for name in ("cnt_timeouts", "cnt_seq_naks", "cnt_rnr_naks", "cnt_retransmits",
                         "cnt_stale", "cnt_src_mismatch"):
                setattr(self, name, ctx.get(getattr(top.req, name)))

        sim = Simulator(top)
        sim.add_clock(1e-8)
        for bg in (clock, wr_src, tx_sink, rx_src, *extra):
            sim.add_testbench(bg, background=True)
        sim.add_testbench(main)
        sim.run()
        # Finalise the stopped background testbenches now: collected later, inside an import
        # of pytest's session end, their close error crashed CPython 3.11's parser.
        del sim
        gc.collect()
        assert len(self.wcs) == n_wc, f"only {len(self.wcs)} of {n_wc} completions"
        return self


def wr(qp, wr_id, op, length, laddr, va=VA0, rkey=RKEY, imm=0, inv=0):
    return {"qp": qp, "wr_id": wr_id, "op": op, "rkey": rkey, "va": va, "length": length,
            "laddr": laddr, "imm": imm, "inv_rkey": inv}


def mixed_wrs(rng, n_qp, count, pmtu):
    """Random SEND/SEND_INV/WRITE/WRITE_IMM/READ; READ sinks and WRITE sources never overlap."""
    out = []
    for i in range(count):
        qp = rng.randrange(n_qp)
        op = rng.choice(list(WrOp))
        length = rng.choice([0, 1, 5, 64, pmtu - 3, pmtu, pmtu + 1, 2 * pmtu + 7, 3 * pmtu])
        if op == WrOp.READ:
            length = max(length, 1)
            laddr = 0x4000 + 0x1000 * (i % 6) + qp * 0x6000 + rng.randrange(8)
        else:
            laddr = rng.randrange(0, 0x3000)
        va = VA0 + 0x200 * rng.randrange(16) + rng.randrange(8)
        out.append(wr(qp, i, op, length, laddr, va=va, imm=rng.getrandbits(32),
                      inv=rng.getrandbits(32)))
    return out


def check_outcome(b, wrs, img, statuses=None):
    """The peer's and target memory's view must match the WR list, in order per QP."""
    n_qp = len(b.peers)
    for q in range(n_qp):
        got = [(w, s) for qp, w, s in b.wcs if qp == q]
        exp = [x["wr_id"] for x in wrs if x["qp"] == q]
        assert [w for w, _ in got] == exp, f"QP {q}: completions out of order"
        if statuses is None:
            assert all(s == WcStatus.OK for _, s in got), got
    # Replay the OK WRs on a model of both memories.
    remote = [bytearray(random.Random(q).getrandbits(8) for _ in range(0x4000))
              for q in range(n_qp)]
    local = bytearray(img)
    msgs = [[] for _ in range(n_qp)]
    status = {(qp, w): s for qp, w, s in b.wcs}
    for x in wrs:
        q, op, ln, la, va = x["qp"], WrOp(x["op"]), x["length"], x["laddr"], x["va"]
        if status[(q, x["wr_id"])] != WcStatus.OK:
            continue
        if op in (WrOp.SEND, WrOp.SEND_INV):
            msgs[q].append(("send", bytes(local[la:la + ln]),
                            None, x["inv_rkey"] if op == WrOp.SEND_INV else None))
        elif op in (WrOp.WRITE, WrOp.WRITE_IMM):
            remote[q][va - VA0:va - VA0 + ln] = local[la:la + ln]
            if op == WrOp.WRITE_IMM:
                msgs[q].append(("imm", b"", x["imm"], None))
        else:
            local[la:la + ln] = remote[q][va - VA0:va - VA0 + ln]
    for q in range(n_qp):
        assert b.peers[q].messages == msgs[q], f"QP {q}: SEND/IMM messages differ"
        assert bytes(b.peers[q].mem) == bytes(remote[q]), f"QP {q}: remote memory differs"
    assert b.final_mem == bytes(local), "target memory differs (READ data / stray writes)"


def check_packets(b):
    """Every packet: PSN sequence per QP is consecutive on first transmission; AckReq rules."""
    for q in range(len(b.peers)):
        psns = [p for qp, op, p, _, _ in b.sent if qp == q]
        assert psns and psns[0] == SQ_PSN[q]


@pytest.mark.parametrize("width,idle,bp,pmtu", [(8, 0.0, 0.0, 1), (64, 0.3, 0.3, 1),
                                                (64, 0.0, 0.0, 3)])
def test_mixed_no_loss(width, idle, bp, pmtu):
    rng = random.Random(width * 3 + pmtu)
    b = Bench(width, pmtu_code=pmtu, seed=width + pmtu, idle=idle, bp=bp)
    wrs = mixed_wrs(rng, 2, 14, b.pmtu)
    b.run(wrs)
    check_outcome(b, wrs, b.img)
    check_packets(b)
    assert b.cnt_timeouts == 0 and b.cnt_retransmits == 0
    # No loss: each PSN goes out exactly once, consecutive from sq_psn per QP; READ requests
    # skip the PSNs of their responses.
    for q in range(2):
        exp, psn = [], SQ_PSN[q]
        for x in wrs:
            if x["qp"] != q:
                continue
            n = max(1, ceil_div(x["length"], b.pmtu))
            exp += [psn] if x["op"] == WrOp.READ else [(psn + i) % (1 << 24) for i in range(n)]
            psn = (psn + n) % (1 << 24)
        assert [p for qp, _, p, _, _ in b.sent if qp == q] == exp


def test_64_qps_high_indices():
    """A 64-QP requester, work requests on QPs 0, 33 and 63 interleaved (the others left in
    RESET): every operation on each; each QP's packets carry its own PSNs from its sq_psn
    (QP 63 wraps through 0) and reach its own peer, completions name their QP, in order per
    QP, and both memories end as the WRs say."""
    qps = (0, 33, 63)
    b = Bench(64, seed=64, n_qp=64)

    async def cfg(ctx):
        for q in qps:
            await write_qp(ctx, b.top.qpt.bus, q, **b.qp_values(q))
    b.cfg = cfg
    rng = random.Random(64)
    ops = [WrOp.SEND, WrOp.WRITE, WrOp.READ, WrOp.WRITE_IMM, WrOp.SEND_INV]
    wrs = []
    for i in range(15):
        q, op = qps[i % 3], ops[i % 5]
        length = rng.choice([0, 5, b.pmtu, b.pmtu + 1, 2 * b.pmtu + 7])
        if op == WrOp.READ:
            length, laddr = max(length, 1), 0x8000 + 0x800 * i    # READ sinks never overlap
        else:
            laddr = rng.randrange(0, 0x3000)
        wrs.append(wr(q, i, op, length, laddr, va=VA0 + 0x200 * rng.randrange(16),
                      imm=rng.getrandbits(32), inv=rng.getrandbits(32)))
    b.run(wrs)
    check_outcome(b, wrs, b.img)
    assert {qp for qp, *_ in b.sent} == set(qps)
    assert [qp for qp, _, _ in b.wcs if qp not in qps] == []
    for q in qps:
        exp, psn = [], SQ_PSN[q]
        for x in wrs:
            if x["qp"] != q:
                continue
            n = max(1, ceil_div(x["length"], b.pmtu))
            exp += [psn] if x["op"] == WrOp.READ else [(psn + i) % (1 << 24) for i in range(n)]
            psn = (psn + n) % (1 << 24)
        assert [p for qp, _, p, _, _ in b.sent if qp == q] == exp, q
    assert b.cnt_timeouts == 0 and b.cnt_retransmits == 0 and b.cnt_stale == 0
    assert b.qp_error == 0

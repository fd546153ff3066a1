# Ref: issue 21 (Must show: bad FCS and bad ICRC found only at the last octet, at every width);
#      docs/roce-layouts.md §5 (ICRC: coverage, octet order), §6.2-§6.5 (ePSN, MSN, ACKs), §4;
#      sim/vltarget.py and sim/vl/harness.cpp ('S': FCS); hw/target/target.py TOP_COUNTERS,
#      RESP_COUNTERS; tools/bench.py CONFIGS (the three configurations) and XGMII_CONFIG (10 Gb/s).
"""A request whose only fault is in its last octet is dropped, counted and forgotten.

For each configuration of the bench (tools/bench.py ``CONFIGS``: the ECPIX-5 core with its DDR3
model, the one-clock unit targets at widths 8 and 64) and the 10 Gb/s one (``XGMII_CONFIG``: width 64
behind the XGMII MAC; its counts are octet times), Verilated (sim/vltarget.py), and for each
of an RDMA WRITE Only (RETH, into an MR), a SEND Only (the KBTP engine is left at reset, its
fast path off, so the message goes to the host's RecvNotify queue), an RDMA READ Request and a
FetchAdd, in PSN order on one QP, programmed straight through host/port.py:

1. the request with a bad FCS;
2. the request with a good FCS and its ICRC's last octet (the last octet before the FCS)
   flipped: the frame is scapy's (its ICRC computed by scapy, sim/scapy_roce.py), then one bit
   of that octet is inverted;
3. the same request, good, with the same PSN.

After each bad frame, for ``QUIET`` cycles (at least 4 x the slowest answer this test saw, which
it checks) no frame may come out; the MAC's ``rx_fcs_errors`` (bad FCS) or the ICRC checker's
``cnt_bad`` (bad ICRC) moves by exactly one; every responder counter stays (``cnt_packets``: no
packet got to the responder, so no PSN was consumed and nothing executed), no RecvNotify
appears, and the MR and the receive buffers hold what they held, to the octet. The good frame
is then served as a first arrival: ACK / READ response / ATOMIC ACKNOWLEDGE carrying the
request's PSN and an MSN that counts only the good requests (§6.4), the WRITE's data in memory,
the SEND's message in the QP's first receive buffer, READ payload = target memory, FetchAdd's
original value returned and original + add stored, once. Every frame the target sends has a
good FCS (the harness checks it) and an ICRC equal to scapy's.

The FCS case and the last octet: the harness's ``send(frame, fcs_ok=False)`` appends the
CRC-32 of the frame inverted (``fcs ^= 0xFFFFFFFF``, sim/vl/harness.cpp), so all four FCS
octets are wrong, and its protocol offers no way to put other octets on GMII. The MAC cannot
tell FCS octets from data octets before RX_DV falls, so it can only judge the frame after its
last octet either way (hw/net/mac.py GmiiRx: the CRC's residue when the frame ends). The unit
targets and the ECPIX-5 core receive cut-through: the frame's octets have already gone on to
the ICRC check, and the verdict on its last beat makes the check drop the packet there (the
commit point); at 10 Gb/s the MAC still holds the frame until then. That a fault in the last
FCS octet alone is caught is shown on the MAC's receiver itself,
:func:`test_mac_fcs_wrong_in_last_octet_only`, with the same frames, in both of its modes.
"""

import random
import time

import pytest
from amaranth.sim import Simulator
from scapy.layers.inet import IP, UDP
from scapy.layers.l2 import Ether

from host.port import TargetPort
from hw.iface import QPN_BASE, REG_TRANSPORT, QpState
from hw.net.mac import GmiiRx
from hw.target.target import RESP_COUNTERS, TOP_COUNTERS
from sim.hdl import frame_get, gmii_drive, gmii_wire, packet_get, run_until_done
from sim.scapy_roce import RETH, AtomicETH, dissect_roce, icrc_of, roce_frame
from sim.system import P_IP, P_MAC, P_QPN0, T_IP, T_MAC, run_sync
from sim.vltarget import VlTarget, config_params
from tools.bench import CONFIGS, XGMII_CONFIG

#: Counts (GMII cycles of 8 ns; octet times of 0.8 ns at 10 Gb/s) waited for an answer that must not come.
QUIET = 20_000
QP, T_QPN, P_QPN = 0, QPN_BASE, P_QPN0
RQ_PSN = 0x5D19F0
SPORT = 0xC0DE
RECV_BASE, RECV_COUNT, RECV_LOG2 = 0x8000, 4, 8          # 4 receive buffers of 256 octets
MR_LADDR, MR_LEN, VA, RKEY = 0x10000, 0x1000, 0x7F00_0000_0000, 0x4B1D
WATCHED = ((RECV_BASE, RECV_COUNT << RECV_LOG2), (MR_LADDR, MR_LEN))
MASK64 = (1 << 64) - 1

OP_SEND_ONLY, OP_WRITE_ONLY, OP_READ_REQ = 0x04, 0x0A, 0x0C
OP_READ_RESP_ONLY, OP_ACK, OP_ATOMIC_ACK, OP_FETCH_ADD = 0x10, 0x11, 0x12, 0x14
ACK_SYNDROME = 0x1F
#: The top counters a bad frame moves: a bad FCS stops at the MAC; a bad ICRC passes the MAC
#: and EthIpRx (a RoCE frame) and stops at the ICRC check, before the parser and responder.
BAD_FCS_MOVES = {("mac", "rx_fcs_errors")}
BAD_ICRC_MOVES = {("mac", "rx_frames_ok"), ("ethrx", "cnt_roce"), ("icrc", "cnt_bad")}


def requests(rng):
    """The four requests, in PSN order: (kind, opcode, payload, extended headers, fields)."""
    return [
        ("WRITE", OP_WRITE_ONLY, rng.randbytes(64),
         {RETH: {"va": VA + 0x100, "rkey": RKEY, "dma_length": 64}}, {"off": 0x100}),
        ("SEND", OP_SEND_ONLY, rng.randbytes(40), {}, {}),
        ("READ", OP_READ_REQ, b"", {RETH: {"va": VA + 0x200, "rkey": RKEY, "dma_length": 48}},
         {"off": 0x200, "len": 48}),
        ("FETCH_ADD", OP_FETCH_ADD, b"",
         {AtomicETH: {"va": VA + 0x400, "rkey": RKEY, "swap_add": 0x0123_4567_89AB_CDEF}},
         {"off": 0x400, "add": 0x0123_4567_89AB_CDEF}),
    ]


def frame_of(opcode, payload, ext, psn):
    """The request as the peer sends it (scapy builds every octet, the ICRC included)."""
    ackreq = int(opcode in (OP_WRITE_ONLY, OP_SEND_ONLY))
    f = bytes(roce_frame(opcode, payload, ext=ext, src_mac=P_MAC, dst_mac=T_MAC, src_ip=P_IP,
                         dst_ip=T_IP, sport=SPORT,
                         bth={"dqpn": T_QPN, "psn": psn, "ackreq": ackreq}))
    assert len(f) >= 60 and f[-4:] == icrc_of(f)
    return f


class Rig:
    """One Verilated target, its QP 0 and MR, and what the test knows of its memory."""

    def __init__(self, vt, rng):
        self.vt, self.port = vt, TargetPort(vt.aaccess)
        port = self.port
        run_sync(port.set_own(T_MAC, T_IP))
        run_sync(port.set_qp(QP, state=QpState.RTS, local_qpn=T_QPN, remote_qpn=P_QPN,
                             peer_mac=P_MAC, peer_ip=P_IP, udp_sport=0xC100, pmtu=3,
                             rq_psn=RQ_PSN, sq_psn=0x1000, timeout=14, retry_cnt=7,
                             rnr_retry=7, recv_base=RECV_BASE, recv_count=RECV_COUNT,
                             recv_size_log2=RECV_LOG2))
        run_sync(port.set_mr(vt.params["n_mr"] - 1, read=1, write=1, atomic=1, qp_mask=1 << QP,
                             rkey=RKEY, va=VA, length=MR_LEN, laddr=MR_LADDR))
        self.mem = {}                   # address -> octets the watched regions must hold
        for addr, n in WATCHED:
            self.mem[addr] = bytearray(rng.randbytes(n))
            vt.mem_write(addr, self.mem[addr])
        self.latencies = []

    # ---- what the host sees -------------------------------------------------------------------
    def top(self):
        return {k: run_sync(self.port.top_counter(i)) for i, k in enumerate(TOP_COUNTERS)}

    def resp(self):
        return {n: run_sync(self.port.rreg(REG_TRANSPORT + 4 * i))
                for i, n in enumerate(RESP_COUNTERS)}

    def expect_memory(self, at=None, octets=b""):
        """Record that ``octets`` are now at ``at``, then compare every watched region."""
        for addr, buf in self.mem.items():
            if at is not None and addr <= at < addr + len(buf):
                buf[at - addr:at - addr + len(octets)] = octets
        for addr, buf in self.mem.items():
            got = self.vt.mem_read(addr, len(buf))
            diff = [hex(addr + i) for i in range(len(buf)) if got[i] != buf[i]]
            assert not diff, f"target memory changed at {diff[:8]} ({len(diff)} octets)"

    def read_mr(self, off, n):
        return bytes(self.mem[MR_LADDR][off:off + n])

    # ---- frames -------------------------------------------------------------------------------
    def answers(self, frame):
        """Send a good frame; the frames the target sends until ``QUIET`` cycles pass idle."""
        n_rx = len(self.vt.rx_log)
        self.vt.send(frame)
        out = []
        while True:
            got = self.vt.run(QUIET, until_tx=True)
            if not got:
                break
            out += got
        assert out, "no answer to a good request"
        # rx_log: (first, last) GMII cycle of every frame sent in, once it has gone in.
        self.latencies.append(out[-1].end - self.vt.rx_log[n_rx][1])
        return [check_sent(f) for f in out]

    def dropped(self, frame, *, fcs_ok, moves, what):
        """Send a bad frame: nothing comes out, the top counters in ``moves`` move by one and
        no other, the responder's counters, the host queue and the memory stay."""
        top0, resp0 = self.top(), self.resp()
        c0 = self.vt.cycle
        self.vt.send(frame, fcs_ok=fcs_ok)
        out = self.vt.run(QUIET, until_tx=True)
        assert out == [], f"{what}: the target answered {[f.frame.hex() for f in out]}"
        assert self.vt.cycle - c0 >= QUIET
        top1, resp1 = self.top(), self.resp()
        moved = {k: top1[k] - top0[k] for k in top0 if top1[k] != top0[k]}
        assert moved == dict.fromkeys(moves, 1), f"{what}: counters moved {moved}"
        assert resp1 == resp0, f"{what}: responder counters moved: " + str(
            {k: resp1[k] - resp0[k] for k in resp0 if resp1[k] != resp0[k]})
        assert run_sync(self.port.poll_notify()) is None, f"{what}: a RecvNotify appeared"
        self.expect_memory()


def check_sent(tx):
    """A frame from the target, parsed by scapy: FCS good, to the peer, ICRC = scapy's."""
    assert tx.fcs_ok, f"bad FCS on {tx.frame.hex()}"
    e = Ether(tx.frame)
    assert (e.src, e.dst, e[IP].src, e[IP].dst) == (T_MAC, P_MAC, T_IP, P_IP), e.summary()
    assert e[UDP].dport == 4791
    body = tx.frame[42:34 + e[UDP].len]
    assert body[-4:] == icrc_of(tx.frame), f"ICRC of {tx.frame.hex()} is not scapy's"
    bth, ext, payload, _ = dissect_roce(body)
    assert bth["dqpn"] == P_QPN
    return bth, ext, payload


@pytest.fixture(params=CONFIGS + (XGMII_CONFIG,))
def config(request):
    return request.param


def test_bad_last_octet_dropped_counted_then_served(config):
    t0 = time.monotonic()
    rng = random.Random(21)
    vt = VlTarget(config_params(config), log=print)
    try:
        rig = Rig(vt, rng)
        top0, resp0 = rig.top(), rig.resp()
        reqs = requests(rng)
        for k, (kind, opcode, payload, ext, f) in enumerate(reqs):
            psn = (RQ_PSN + k) & 0xFFFFFF
            good = frame_of(opcode, payload, ext, psn)
            bad_icrc = good[:-1] + bytes([good[-1] ^ 0x80])
            assert bad_icrc[-4:] != icrc_of(bad_icrc)
            rig.dropped(good, fcs_ok=False, moves=BAD_FCS_MOVES, what=f"{kind} bad FCS")
            rig.dropped(bad_icrc, fcs_ok=True, moves=BAD_ICRC_MOVES, what=f"{kind} bad ICRC")
            out = rig.answers(good)
            assert len(out) == 1, f"{kind}: {len(out)} frames: {out}"
            bth, ext_out, data = out[0]
            assert bth["psn"] == psn, f"{kind}: PSN {bth['psn']:#x}, not {psn:#x}"
            assert ext_out["aeth"]["syndrome"] == ACK_SYNDROME, (kind, ext_out)
            assert ext_out["aeth"]["msn"] == k + 1, (kind, ext_out)  # good requests only
            if kind == "WRITE":
                assert bth["opcode"] == OP_ACK
                rig.expect_memory(MR_LADDR + f["off"], payload)
            elif kind == "SEND":
                assert bth["opcode"] == OP_ACK
                note = run_sync(rig.port.poll_notify())
                assert note is not None and (note["qp"], note["addr"], note["length"]) == (
                    QP, RECV_BASE, len(payload)), note      # the first buffer: none taken
                assert run_sync(rig.port.poll_notify()) is None
                rig.expect_memory(RECV_BASE, payload)
            elif kind == "READ":
                assert bth["opcode"] == OP_READ_RESP_ONLY
                assert data == vt.mem_read(MR_LADDR + f["off"], f["len"])
                rig.expect_memory()
            else:
                assert bth["opcode"] == OP_ATOMIC_ACK
                orig = int.from_bytes(rig.read_mr(f["off"], 8), "little")
                assert ext_out["atomic_ack"]["orig_data"] == orig
                rig.expect_memory(MR_LADDR + f["off"],
                                  ((orig + f["add"]) & MASK64).to_bytes(8, "little"))
        top1, resp1 = rig.top(), rig.resp()
        n = len(reqs)
        counted = {f"{b}.{p}": top1[b, p] - top0[b, p]
                   for b, p in sorted(BAD_FCS_MOVES | BAD_ICRC_MOVES)}
        assert counted["mac.rx_fcs_errors"] == n and counted["icrc.cnt_bad"] == n, counted
        served = {k: resp1[k] - resp0[k] for k in resp0 if resp1[k] != resp0[k]}
        assert served == {"cnt_packets": n, "cnt_acks": 2}, served   # ACKs: WRITE, SEND
        assert max(rig.latencies) * 4 <= QUIET, rig.latencies
        print(f"\nbad last octet [{config}] width {vt.params['width']}: {counted}; "
              f"responder {served}; answers after {min(rig.latencies)}-{max(rig.latencies)} "
              f"cycles, quiet {QUIET}; {vt.cycle} cycles in {time.monotonic() - t0:.1f} s")
    finally:
        vt.close()


@pytest.mark.parametrize("cut_through", [False, True])
def test_mac_fcs_wrong_in_last_octet_only(cut_through):
    """The MAC's receiver (the GmiiRx every configuration above holds) drops a frame whose FCS
    is wrong in its last octet only, and takes the same frame with the good FCS right after.
    Cut-through, the bad frame is passed on with ``err`` on its last beat, the good one
    without."""
    rng = random.Random(21)
    frames = [frame_of(op, pl, ext, RQ_PSN + k)
              for k, (_, op, pl, ext, _) in enumerate(requests(rng))]
    dut = GmiiRx(depth=256, cut_through=cut_through)
    got = []

    async def drive(ctx):
        for f in frames:
            wire = gmii_wire(f)
            await gmii_drive(ctx, dut, wire[:-1] + bytes([wire[-1] ^ 0x80]))
            await gmii_drive(ctx, dut, wire)
        await ctx.tick().repeat(20)
        assert (ctx.get(dut.fcs_errors), ctx.get(dut.frames_ok)) == (len(frames), len(frames))
        assert (ctx.get(dut.runts), ctx.get(dut.rx_errors), ctx.get(dut.overflows)) == (0, 0, 0)

    async def take(ctx):
        if not cut_through:
            for _ in frames:
                got.append(await packet_get(ctx, dut.o, 8))
            return
        for _ in range(2 * len(frames)):
            got.append(await frame_get(ctx, dut.o, 8))

    sim = Simulator(dut)
    sim.add_clock(8e-9)
    run_until_done(sim, [drive, take], limit=20_000 * 8e-9, step=1000 * 8e-9)
    if cut_through:
        assert got == [x for f in frames for x in ((f, 1), (f, 0))]
    else:
        assert got == frames

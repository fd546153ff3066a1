# Ref: issue 7 item 1 (make bench); draft KBTP §Operations,
#      §Completion, §Target Execution Model; roce-layouts.md §1 (framing: preamble, FCS, IFG,
#      ICRC), §2-§3 (BTH, extended headers per opcode); hw/headers.py (every header size);
#      sim/vltarget.py (the Verilated target, cycle-exact GMII); hw/kbtp/engine.py (register
#      map: LAST_LATENCY); boards/ (build/<board>/report.json); issue 20 "Must show" (ADDR_LE
#      and DIRECT_ALLOC sessions run in the engine: the sessions section); model/target.py
#      (the golden model the sessions section replays).
"""``make bench``: cycle-exact goodput, operation rate, latency, sessions and resources of the
target.

Everything is counted in simulated clock cycles of the Verilated target
(:class:`sim.vltarget.VlTarget`), never in wall time. Configurations (``--configs``):

``ecpix5`` (the default, first)
    The core the ECPIX-5 bitstream holds (:data:`sim.vltarget.SHIPPED`): GMII MAC at
    125 MHz, the target at width 64 in its 41.67 MHz core clock, its memory the board's 512 MB
    of DDR3 (LiteDRAM at 50 MHz on the board; here the DDR3 timing model of
    :mod:`boards.dram`, whose read latency, row misses and refresh are LiteDRAM's).
``ecpix5-bram``
    The same core with its target memory in 128 KiB of block RAM (core ``kbtp-bram``, the
    board's default before issue 22): what the DRAM costs, beside it. Run it by name.
``8``, ``64``
    The one-clock unit-test target at that width, everything at 125 MHz and 4 MiB of memory:
    *not what a board builds*; the table names these rows ``unit-w8`` / ``unit-w64``.
``10g``
    The one-clock target at width 64 behind the 10 Gb/s XGMII MAC, everything at 156.25 MHz
    (:data:`sim.vltarget.XGMII_10G`, issue 21 item 4): what a 10G board would build. Its
    counts are octet times of the 10 Gb/s line (0.8 ns, 8 per clock cycle), so its figures
    read as the others do; run it by name. Table rows ``unit-10g``.

The GMII pins move one octet per 125 MHz cycle in every configuration, so cycles are GMII
cycles (8 ns at the board's real clock), one octet/cycle is the line rate (1 Gb/s) and a figure
close to the wire arithmetic is *wire-bound*. Latencies are also given in nanoseconds at the
board's clocks; the engine's own share (LAST_LATENCY) counts core cycles (24 ns each on the
ECPIX-5's 41.67 MHz core clock). The block sizes a configuration's memory cannot hold are listed
as not run.

Figures
-------
goodput
    LOAD, STORE (inline and by RDMA READ) and ALLOC_STORE (inline up to Max Inline, by READ
    above) against block size, at RoCE path MTU 1024 and 4096 (one fresh target per MTU; a
    series that cannot complete is recorded under ``failed`` with the MAC's counters, and that
    MTU is not run at larger sizes; KbtpTarget's MAC buffers are 8192 octets, enough for a
    frame of path MTU 4096). One initiator keeps
    :data:`DEPTH` requests outstanding, or as many as its request credits where the
    configuration's memory holds fewer receive buffers (``depth`` in each row); the time per
    operation is the distance between the first octets of successive COMPLETION frames in
    steady state: with ``depth`` D and n >= 2D + 2 operations, from COMPLETION D to
    COMPLETION n - 1 - D (``window``), where every COMPLETION sends the next request, so each
    interval carries one request and one operation's data; the first D requests went out
    before it (the fill) and the last D COMPLETIONs send none (the drain), and either would
    make an operation look shorter than the wire allows. Fewer operations (sizes above 16 KiB,
    three of them): COMPLETION 0 to the last; by READ, from the end of the last READ response
    before COMPLETION 0 to the end of the last one, over the READ response octets that ended
    in that span (the engine sends a store's READ parts while the last parts of the one before
    are out, so some of the next store's data comes before COMPLETION 0, and the last store's
    latency after its data is no steady state). Reported as a fraction of the theoretical RoCEv2
    goodput of the link
    (:func:`theory_goodput`: per packet ``payload / (payload + PACKET_OVERHEAD)``, with
    PACKET_OVERHEAD = 82 octets derived from hw/headers.py sizes) and as a fraction of the
    operation's own wire bound (:func:`op_plan`: every request, data, completion and ACK
    frame the operation needs, on its busier direction).
multi-QP goodput and fairness
    LOAD, STORE_INLINE, STORE_READ and ALLOC_STORE_INLINE (``--quick``: LOAD and
    STORE_INLINE) at 64 and 4096 octets, both MTUs, from :data:`MULTI_QPS` initiators at
    once, each with its own bound handle (ALLOC_STORE: its own handles) and buffers and
    :data:`MULTI_DEPTH` requests outstanding (:meth:`Bench.series_multi`; JSON ``multi``,
    ``bench_multi.csv``). Over the common steady-state window (every QP past its first
    COMPLETION, none past its last) the aggregate goodput is the size over the distance between
    successive COMPLETIONs of any QP, as a fraction of :func:`theory_goodput` and of the op
    wire bound, and each QP's operation rate is its completions per cycle (over whole groups
    of ``depth`` of them). Fairness: each QP's rate over the mean of them all and the largest
    deviation (goal :data:`FAIRNESS_GOAL`, +-10 %); per QP
    and overall mean and p99 latency (a request's last octet in to its COMPLETION's first octet
    out, queueing behind the other requests included). Every QP's LOAD data and stored blocks
    are checked. An inline store larger than the Max Inline that 4 QPs' receive buffers leave
    (the ECPIX-5's 128 KiB at 4096 octets) runs by READ instead, recorded under
    ``multi_skipped``.
op rate
    Operations per second at 64 octets against the frame-rate limit (the op wire bound).
latency
    Cycles from the request's last octet on the GMII input (``VlTarget.rx_log``) to the first
    octet of the first response frame on the output (``TxFrame.start``; the data WRITE of a
    LOAD, the RDMA READ request of a STORE by READ, the COMPLETION Send of an inline store;
    transport ACKs are not responses), and from the request's first octet; alone and with
    four QPs sending at once. Split into stages by the ARP turnaround (MAC + IP layers), the
    transport ACK of the request (adds ICRC check, parser, responder, TX builder and ICRC
    insertion) and the engine's LAST_LATENCY register (RecvNotify to WorkRequest).
sessions
    Issue 20's "Must show": the same operations from a plain, an ADDR_LE and a DIRECT_ALLOC
    session run in the engine (:func:`run_sessions`; JSON ``sessions``,
    ``bench_sessions.csv``). Each kind on a fresh target configured for it (ADDR_LE: the
    target's structures ADDR_LE, CTRL bit 2, and the session's feature, which a target with
    big-endian structures never grants; DIRECT_ALLOC, asked for with DIRECT_LOAD: one
    partition holding every block of the mix), one session, then :data:`SESSION_OPS` each of
    ALLOC_STORE inline, STORE inline, LOAD and ALLOC_STORE by READ of :data:`SESSION_SIZE`
    octets, the driver not polled (as in every series). Per kind: the engine's OK counts per
    operation and the driver's ``host_actions`` over the mix (after HELLO; whatever reached the
    host is handled, and counted, after it), ``engine_parts``, the ring the ALLOC_STOREs took
    their blocks from (their COMPLETIONs' Block Offsets), the cycles of the four groups (first
    request queued to the last COMPLETION's first octet), in core cycles and us at the
    configuration's clocks. The requests are replayed in the golden model
    (:class:`model.target.TargetModel`): HELLO_ACK and every COMPLETION octet for octet, the
    LOAD data, the KBTP structures and the stored blocks must be its own. The section raises
    :class:`SessionsError` rather than print a row whose host count is not 0, whose engine
    counts are not the operations sent, or whose answers are not the model's.
resources
    The board's committed timing record (``boards/timing_records/<board>.json``, from
    ``make timing``), else ``build/<board>/report.json`` of ``python -m boards build`` if
    present ("not built" otherwise); this module never runs place and route.

The peer is :class:`roce.rc.RoceEndpoint` (the KBTP initiator side written here from
host.codec messages, as tests/sim/cocotb_system.py does) and the target is configured by
:class:`host.driver.KbtpDriver` over the host bus. The peer is never the bottleneck: it reacts
to every frame the moment the frame's last octet has left the target (``run(until_tx=True)``;
the largest reaction delay is reported as ``peer_turnaround_max``), its frames go onto the
wire back to back (the gaps between the frames of one peer burst are reported, they equal the
12-octet IFG), and it keeps ``depth`` requests outstanding, so the target always has the
next request in its receive buffers (``min_outstanding`` >= 1 is checked for every series).

CLI: ``python -m tools.bench [--configs ecpix5,8,64] [--quick] [--sections
goodput,multi,latency,sessions] [--out build/bench]`` writes ``bench.json``, ``bench.csv``,
``bench_multi.csv``, ``bench_sessions.csv`` and ``goodput_<config>.png`` (configurations with
goodput rows) and prints the tables.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
import sys
import time
from pathlib import Path

from hw.headers import (AETH, BTH, RETH, EthernetHeader, IPv4Header, UDPHeader, BthOpcode,
                        CommonHeader, DataDescriptor, CompletionBody, Features, ReqFlags,
                        Status)
from sim.system import run_sync

__all__ = [
    "PREAMBLE_SFD", "FCS", "IFG", "ICRC", "MIN_FRAME", "ROCE_HEADERS", "PACKET_OVERHEAD",
    "CLOCK_HZ", "DEPTH", "SIZING_CREDITS", "MAX_CREDITS", "MULTI_QPS", "FAIRNESS_GOAL",
    "frame_wire", "theory_goodput", "op_plan", "OPS", "Bench", "run_bench", "run_multi",
    "resources", "write_results", "plot", "format_table", "main", "SECTIONS", "SESSION_OPS",
    "SESSION_SIZE", "SESSION_MIX", "SESSION_KINDS", "SessionsError", "session_mix",
    "run_sessions",
]

# --------------------------------------------------------------------------------------------
# Wire arithmetic (independent of the gateware: Ethernet/RoCEv2 framing rules and header sizes)
# --------------------------------------------------------------------------------------------

PREAMBLE_SFD = 8        # 7 x 0x55 + 0xD5 (IEEE 802.3 §3.2.1)
FCS = 4                 # CRC-32 frame check sequence
IFG = 12                # minimum inter-frame gap, octet times
ICRC = 4                # RoCEv2 invariant CRC after the payload (roce-layouts.md §1)
MIN_FRAME = 60          # shortest frame without FCS (shorter ones are padded)
#: Ethernet + IPv4 + UDP + BTH, from the one headers module.
ROCE_HEADERS = EthernetHeader.SIZE + IPv4Header.SIZE + UDPHeader.SIZE + BTH.SIZE
#: Wire octets of one RoCEv2 packet besides its payload (no extended header): 82.
PACKET_OVERHEAD = PREAMBLE_SFD + ROCE_HEADERS + ICRC + FCS + IFG
CLOCK_HZ = 125_000_000  # GMII: one octet per cycle
#: The 10 Gb/s configuration's name (:data:`sim.vltarget.XGMII_10G`).
XGMII_CONFIG = "10g"
#: Octet times per second of the 10 Gb/s line: the unit of that configuration's counts.
XGMII_OCTET_HZ = 1.25e9
#: Requests one initiator keeps outstanding (issue 20: "from one QP at a depth within its
#: credits"): 16, the request credits the shipped core advertises, or as many as the
#: configuration advertises where its memory holds fewer receive buffers (:attr:`Bench.depth`;
#: the ECPIX-5 in block RAM: 4 to 7). Until stop 42 the bench kept 3 outstanding (the figures
#: of the serial engine were measured so); ``--depth 3`` gives those again.
DEPTH = 16
#: Request credits, and so receive buffers per QP (host/driver.py ``memory_plan``), that Max
#: Inline and the pool are sized for: the figures measured before the credits matched the
#: buffers (issue 20 item 5) were measured with 4 buffers per QP, so Max Inline and the pool
#: stay as they were. The configuration then advertises the most credits up to
#: :data:`MAX_CREDITS` that fit beside them (:class:`Bench`).
SIZING_CREDITS = 4
MAX_CREDITS = 16
#: Initiators of the multi-QP goodput and fairness series.
MULTI_QPS = 4
#: Requests each of them keeps outstanding (12 in all): deeper, the fairness window (every QP
#: past its first COMPLETION, none past its last) is no steady state with the operations a
#: series can afford. ``--multi-depth`` sets it; ``test_overload_is_not_lost`` runs 4 x 8.
MULTI_DEPTH = 3
#: Fairness goal: every QP's operation rate within this fraction of the mean of them all.
FAIRNESS_GOAL = 0.10
#: KBTP request sizes (header + Data Descriptor; no Completion Descriptor: RECORD is not used).
REQUEST = CommonHeader.SIZE + DataDescriptor.SIZE                 # 40
COMPLETION = CommonHeader.SIZE + CompletionBody.SIZE              # 40


def frame_wire(payload, ext=0):
    """Wire octets (preamble to the end of the IFG) of one RoCEv2 packet with ``payload``
    octets after ``ext`` octets of extended headers (payload padded to 4 octets, frame to
    MIN_FRAME)."""
    payload += -payload % 4
    frame = max(ROCE_HEADERS + ext + payload + ICRC, MIN_FRAME)
    return PREAMBLE_SFD + frame + FCS + IFG


def theory_goodput(length, mtu):
    """Theoretical RoCEv2 goodput of the link for a ``length``-octet transfer at path MTU
    ``mtu``: payload / (payload + PACKET_OVERHEAD per packet), as a fraction of line rate."""
    packets = max(1, -(-length // mtu))
    return length / (length + PACKET_OVERHEAD * packets)


def _chunks(length, mtu):
    n = max(1, -(-length // mtu))
    return [min(mtu, length - k * mtu) for k in range(n)]


def _read_responses(length, mtu):
    """READ response packets: AETH on Only / First / Last, none on Middle."""
    ch = _chunks(length, mtu)
    return [frame_wire(c, 0 if 0 < k < len(ch) - 1 else AETH.SIZE) for k, c in enumerate(ch)]


def _writes(length, mtu):
    """RDMA WRITE packets: RETH on First / Only."""
    return [frame_wire(c, RETH.SIZE if k == 0 else 0) for k, c in enumerate(_chunks(length, mtu))]


#: Operations of the goodput series: name -> (KBTP opcode name, data by RDMA READ?).
OPS = {
    "LOAD": ("LOAD", False),
    "STORE_INLINE": ("STORE", False),
    "STORE_READ": ("STORE", True),
    "ALLOC_STORE_INLINE": ("ALLOC_STORE", False),
    "ALLOC_STORE_READ": ("ALLOC_STORE", True),
}


def op_plan(op, length, mtu, part=None):
    """The frames one operation needs on each direction, in wire octets.

    Every operation: the request (a SEND of the KBTP request, inline data included), the
    target's ACK of it, the COMPLETION Send and the initiator's ACK of that (the engine's
    WorkCompletion needs it). Plus the data: RDMA WRITE packets to the initiator (LOAD), or
    RDMA READ requests and their response packets (by READ): one READ per ``part`` octets (the
    engine's READ parts, :func:`sim.vltarget.read_part_of`; None: one READ). One ACK per
    direction and operation (coalesced ACKs: the minimum RC allows for one acknowledged
    message each way).

    Returns
    -------
    dict
        ``to_target`` / ``to_peer``: lists of wire octets per frame; ``bound``: octets on the
        busier direction = cycles per operation at line rate; ``frames``: total frames.
    """
    kind, by_read = OPS[op]
    ack = frame_wire(0, AETH.SIZE)
    inline = not by_read and kind != "LOAD"
    req = [frame_wire(c) for c in _chunks(REQUEST + (length if inline else 0), mtu)]
    to_target, to_peer = list(req), [ack]
    if kind == "LOAD":
        to_peer += _writes(length, mtu)
    elif by_read:
        for n in (_chunks(length, part) if part else [length]):
            to_peer.append(frame_wire(0, RETH.SIZE))
            to_target += _read_responses(n, mtu)
    to_peer.append(frame_wire(COMPLETION))
    to_target.append(ack)
    bound = max(sum(to_target), sum(to_peer))
    return {"to_target": to_target, "to_peer": to_peer, "bound": bound,
            "frames": len(to_target) + len(to_peer)}


# --------------------------------------------------------------------------------------------
# The bench: Verilated target + driver + RoceEndpoint initiators
# --------------------------------------------------------------------------------------------

T_MAC, T_IP = "02:4b:42:54:50:01", "10.0.0.2"
P_MAC, P_IP = "02:00:00:00:00:02", "10.0.0.1"
T_QPN0, P_QPN0 = 0x11, 0x20
PMTU_CODE = {256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}
PEER_VA = 0x1000_0000


class Bench:
    """One Verilated target with the driver and ``n_init`` initiators (one QP each).

    Parameters
    ----------
    vt : VlTarget
        A fresh target (just reset).
    block_size : int
        Block Size of the target configuration; the pool takes what memory is left.
    mtus : list of int
        Path MTU of QP q is ``mtus[q % len(mtus)]``.
    n_init : int
        Initiators (QPs, sessions).
    max_inline : int
        Max Inline of the configuration.
    cfg_overrides : dict, optional
        :class:`~host.config.TargetConfig` fields set besides the bench's own (``addr_le``,
        ``direct_partitions``, ``direct_quota``: :func:`run_sessions`). The partitions' blocks
        come out of the ``max_blocks``; at least one shared block must be left.
    """

    def __init__(self, vt, block_size, *, mtus=(1024, 4096), n_init=4, max_inline=16384,
                 n_qp=None, max_blocks=96, seed=1, depth=None, cfg_overrides=None):
        from host.driver import memory_plan
        from host.port import TargetPort
        from model.target import TargetConfig
        from roce.rc import RoceEndpoint
        from sim.vltarget import driver_for, read_part_of
        self.vt = vt
        self.rng = random.Random(seed)
        p = vt.params
        #: counts per second: GMII cycles, or octet times of the 10 Gb/s line (XGMII)
        self.unit_hz = XGMII_OCTET_HZ if p.get("mac") == "xgmii" else CLOCK_HZ
        # The driver sets up the QPs the bench uses (their receive buffers take memory).
        n_qp = n_qp or n_init
        n_mr = p["n_mr"]
        self.block_size, self.n_init = block_size, n_init
        mem = p["mem_words"] * 8
        # Handles per initiator: the table's 256 shared by the QPs the driver sets up (a power
        # of two): one initiator has all 256, so that an ALLOC_STORE series is not cut at 63
        # operations (64 handles, one the bench's own) where SERIES_FACTOR asks for more: at 10
        # Gb/s, ALLOC_STORE by READ of 4 KiB at MTU 4096 measured 4,273.7 octet times per
        # operation over 63 operations, less than its frames take on the wire (4,304: the fill
        # again); 4,415.1 over 255.
        hpi = 1 << ((256 // n_qp).bit_length() - 1)
        # Max Inline: at most ``max_inline``, less where the target's memory is small (each
        # QP's receive buffers hold the longest request): the largest that leaves room for
        # two blocks beside SIZING_CREDITS buffers per QP.
        while True:
            base = dict(block_size=block_size, num_handles=256, handles_per_initiator=hpi,
                        table_base_handle=0x4000, pool_to_base=0x150000,
                        max_inline=max_inline, ticket_timeout_ms=100_000, retention_ms=1e9)
            probe = TargetConfig(num_blocks=1, request_credits=SIZING_CREDITS, **base)
            # the probe's plan holds one block: what is left besides it goes to the pool
            spare = mem - (memory_plan(probe, n_qp)["end"] - block_size) - 8192
            if spare >= 2 * block_size or max_inline <= 256:
                break
            max_inline //= 2
        if spare < block_size:
            raise MemoryError(f"{block_size}-octet blocks do not fit the target's "
                              f"{mem // 1024} KiB")
        self.max_inline = max_inline
        nb = max(1, min(max_blocks, spare // block_size))
        over = dict(cfg_overrides or {})
        direct = over.get("direct_partitions", 0) * over.get("direct_quota", 0)
        if nb <= direct:
            raise MemoryError(f"{direct} DIRECT_ALLOC blocks of {block_size} octets and a "
                              f"shared one do not fit the target's {mem // 1024} KiB")
        # Request credits = receive buffers per QP: the most up to MAX_CREDITS that fit beside
        # that pool and Max Inline (SIZING_CREDITS always do). The unit-test target's 4 MiB
        # holds 16 everywhere (Max Inline 16384: 32 KiB buffers, 4 QPs x 16 x 32 KiB = 2 MiB
        # beside pools of the same size as before). The ECPIX-5's 128 KiB holds 4 to 7, e.g.
        # 4096-octet blocks on one QP: Max Inline 8192 (16 KiB buffers), 10 blocks, the
        # structures end at 49152, the buffers start at 65536 (16 KiB-aligned):
        # (131072 - 65536) / 16384 = 4; at 65536-octet blocks Max Inline falls to 256 and 16
        # fit. Every series keeps min(DEPTH, credits) requests outstanding (``depth``).
        for credits in range(MAX_CREDITS, SIZING_CREDITS - 1, -1):
            # every initiator may use the whole pool (the bench frees between series)
            self.cfg = TargetConfig(num_blocks=nb, quota_per_initiator=nb,
                                    overcommit_quotas=True, request_credits=credits,
                                    **{**base, **over})
            if memory_plan(self.cfg, n_qp)["end"] <= mem:
                break
        self.num_blocks = nb
        #: requests outstanding per initiator: ``depth`` (default DEPTH), within the credits
        self.depth = self.within_credits(depth or DEPTH)
        self.port = TargetPort(self.vt.port_access(self.net_step))
        #: octets of the engine's RDMA READ parts (op_plan)
        self.read_part = read_part_of(p)
        # (the target's RANGEs, not those of a target of the bench's n_qp: it may have more QPs)
        self.driver = driver_for(self.port, self.cfg, p, n_qp=n_qp)
        self.ep = RoceEndpoint(P_MAC, P_IP, seed=seed, min_frame=MIN_FRAME)
        self.mtus = [mtus[q % len(mtus)] for q in range(n_init)]
        self.tx = []            # every TxFrame out of the target, in order
        self.sent = []          # every frame given to vt.send, in order (index = rx_log index)
        self.sent_at = []       # the cycle at which each was queued
        self.events = {q: [] for q in range(n_init)}     # (cycle, payload) of peer messages
        self.turnaround = 0     # largest (cycle the peer reacted - last octet of the frame)
        self._frame = None
        self.qps, self.bufs, self.sess = [], [], {}
        #: per initiator: ADDR_LE granted (its requests' Block Handle and Data Descriptor
        #: little-endian, host.codec), the HELLO sent and the HELLO_ACK received (raw)
        self.addr_le = [False] * n_init
        self.hello = {}
        #: when a list: (initiator, raw request, buffer offset, what the request left in its
        #: buffer slot or None) of every request, in order (the golden model replays them)
        self.journal = None
        #: (first request queued, first octet of the last COMPLETION) of the last series
        self.last_span = None
        for q in range(n_init):
            self.qps.append(self.ep.create_qp(
                qpn=P_QPN0 + q, dest_qpn=T_QPN0 + q, remote_ip=T_IP, remote_mac=T_MAC,
                pmtu=self.mtus[q], timeout=18, sq_psn=0x100 * q + 7, epsn=0x1000 + q,
                on_message=self._on_message(q)))
            # one buffer slot per outstanding request (depth), so every READ and WRITE of a
            # request touches its own octets
            buf = bytearray(block_size * self.depth)
            self.ep.register(buf, base_va=PEER_VA, rkey=0x5000 + q)
            self.bufs.append(buf)
        self.rid = 0
        self.loaded_expect = None   # what a LOAD of the bench handle must return
        self.content = {}           # handle -> what its block holds (bound / stored here)
        self.current_op = None

    def within_credits(self, depth):
        """``depth`` requests outstanding, or as many as one initiator's request credits (its
        receive buffers) where the configuration's memory holds fewer."""
        return min(depth, self.cfg.request_credits)

    # ---- network --------------------------------------------------------------------------
    def _on_message(self, q):
        def cb(qp, data, imm=None, invalidated_rkey=None):
            self.events[q].append((self._frame.start if self._frame else self.vt.cycle,
                                   bytes(data)))
        return cb

    def _deliver(self, frames):
        for f in frames:
            assert f.fcs_ok, f"bad FCS from the target at cycle {f.start}"
            self.tx.append(f)
            self._frame = f
            self.ep.receive_frame(f.frame, f.end / (self.unit_hz / 1e6))
            self._frame = None
        self.ep.tick(self.vt.cycle / (self.unit_hz / 1e6))
        for g in self.ep.poll_tx():
            self.send(g)

    def send(self, frame):
        self.sent.append(bytes(frame))
        self.sent_at.append(self.vt.cycle)
        self.vt.send(frame)

    def net_step(self):
        """After a host access: hand what the target sent meanwhile to the peer, queue the
        peer's answers (no cycle passes here; the next access or run moves them)."""
        self._deliver(self.vt.run(0))

    def pump(self, cond, max_cycles=20_000_000, what="condition"):
        """Run until ``cond()``, handing every target frame to the peer as its last octet
        leaves the target."""
        end = self.vt.cycle + max_cycles
        while not cond():
            if self.vt.cycle >= end:
                raise TimeoutError(f"bench: {what} not reached in {max_cycles} cycles "
                                   f"(peer {self.ep.counters})")
            frames = self.vt.run(min(200_000, end - self.vt.cycle), until_tx=True)
            if frames:
                # the peer answers at this cycle: how long after the frame's last octet
                self.turnaround = max(self.turnaround, self.vt.cycle - frames[-1].end)
            self._deliver(frames)
        return self.vt.cycle

    # ---- bring-up -------------------------------------------------------------------------
    def bring_up(self, features=0):
        """ARP, the driver's set-up, every QP and one session per initiator (HELLO asking for
        ``features``; :attr:`addr_le` follows what the HELLO_ACK grants)."""
        from host import codec
        run_sync(self.port.set_own(T_MAC, T_IP))
        run_sync(self.driver.init())
        for q in range(self.n_init):
            run_sync(self.driver.open_qp(
                q, local_qpn=T_QPN0 + q, remote_qpn=P_QPN0 + q, peer_mac=P_MAC, peer_ip=P_IP,
                udp_sport=0xC100 + q, pmtu=PMTU_CODE[self.mtus[q]], rq_psn=0x100 * q + 7,
                sq_psn=0x1000 + q, timeout=20, retry_cnt=7, rnr_retry=7))
        for q in range(self.n_init):
            hello = codec.encode(codec.Hello(requested_features=features, completion_credits=16,
                                             initiator_id=0x1000 + q))
            self.qps[q].send(hello)
            self.slow_until(lambda: self.events[q], f"HELLO_ACK {q}")
            raw = self.events[q].pop()[1]
            ack = codec.decode(raw)
            assert ack.status == Status.OK.value, ack
            self.sess[q] = ack
            self.hello[q] = (hello, raw)
            self.addr_le[q] = bool(ack.features & Features.ADDR_LE.value)

    def slow_until(self, cond, what):
        """Pump the network and let the driver serve the slow path until ``cond()``."""
        end = self.vt.cycle + 5_000_000
        while not cond():
            if self.vt.cycle >= end:
                raise TimeoutError(f"bench: {what} (slow path) timed out")
            self._deliver(self.vt.run(256, until_tx=True))
            run_sync(self.driver.poll(self.vt.cycle * 1e3 / self.unit_hz))

    def engine_reg(self, name):
        from hw.iface import Space
        from hw.iface import REG_KBTP
        from hw.kbtp.engine import reg
        r, err = self.vt.access(Space.REG, REG_KBTP + reg[name], 0, 0)
        assert not err, name
        return r

    # ---- requests -------------------------------------------------------------------------
    def request(self, q, op, handle, length, data=None, slot=0):
        """Encode one KBTP request of initiator ``q`` (``op`` a key of :data:`OPS`); its
        initiator buffer is slot ``slot`` of the QP's registered region."""
        from host import codec
        kind, by_read = OPS[op]
        self.rid += 1
        off = slot * self.block_size
        le = self.addr_le[q]
        slot_data = None
        if kind == "LOAD":
            self.bufs[q][off:off + length] = slot_data = bytes(length)
            raw = codec.encode(codec.Load(
                request_id=self.rid, handle=handle, flags=ReqFlags.ALLOW_UNSEALED.value,
                data=codec.DataDesc(0x5000 + q, PEER_VA + off, length)), addr_le=le)
        else:
            cls = codec.Store if kind == "STORE" else codec.AllocStore
            if by_read:
                self.bufs[q][off:off + length] = slot_data = bytes(data)
                raw = codec.encode(cls(request_id=self.rid, handle=handle,
                                       data=codec.DataDesc(0x5000 + q, PEER_VA + off, length)),
                                   addr_le=le)
            else:
                raw = codec.encode(cls(request_id=self.rid, handle=handle,
                                       flags=ReqFlags.INLINE.value,
                                       data=codec.DataDesc(0, 0, length), inline=data),
                                   addr_le=le)
        if self.journal is not None:
            self.journal.append((q, raw, off, slot_data))
        return raw

    def completion(self, q, k):
        from host import codec
        msg = codec.decode(self.events[q][k][1])
        assert msg.status == Status.OK.value, f"initiator {q}: {msg}"
        return msg

    def block_of(self, handle):
        """(Data Length, target memory address of the block) of a bound handle."""
        from host import codec
        raw = self.vt.mem_read(self.driver.entry_addr(handle), 16)
        e = codec.decode_entry(raw, addr_le=self.cfg.addr_le)
        assert e.flags & 1, f"handle {handle:#x} not bound: {e}"
        return e.data_length, self.driver.block_addr(e.block_offset)

    def free(self, q, handles):
        """FREE ``handles`` of initiator ``q`` through the slow path (not measured)."""
        from host import codec
        for i in range(0, len(handles), self.depth):  # no more than the receive buffers
            batch = handles[i:i + self.depth]
            n0 = len(self.events[q])
            for h in batch:
                self.rid += 1
                self.qps[q].send(codec.encode(codec.Free(request_id=self.rid, handle=h),
                                              addr_le=self.addr_le[q]))
            self.slow_until(lambda: len(self.events[q]) >= n0 + len(batch), "FREE")
            for k in range(n0, n0 + len(batch)):
                self.completion(q, k)

    # ---- goodput series -------------------------------------------------------------------
    def series(self, q, op, length, n_ops, handles):
        """``n_ops`` operations of initiator ``q``, :attr:`depth` outstanding; returns the
        figures of the steady state (COMPLETIONs D .. n_ops - 1 - D of depth D, see the module
        docstring; 0 .. n_ops - 1 when n_ops < 2D + 2)."""
        kind, by_read = OPS[op]
        D = self.depth
        mtu = self.mtus[q]
        qpn = P_QPN0 + q
        datas = [self.rng.randbytes(length) for _ in range(n_ops)]
        ev0, tx0, sent0 = len(self.events[q]), len(self.tx), len(self.sent)
        self.turnaround = 0
        done = lambda: len(self.events[q]) - ev0
        bound = self.plan(op, length, mtu)["bound"]
        min_out = D
        k = 0
        start = self.vt.cycle
        while done() < n_ops:
            while k < n_ops and k - done() < D:
                h = handles[k] if kind == "ALLOC_STORE" else handles[0]
                raw = self.request(q, op, h, length, datas[k], slot=k % D)
                self.qps[q].send(raw)
                self._deliver([])         # puts the SEND on the wire now
                k += 1
            before = done()
            self.pump(lambda: done() > before, max_cycles=4 * bound + 200_000,
                      what=f"{op} {length} completion {before}")
            if 0 < done() < n_ops:
                min_out = min(min_out, k - done())
        assert self.vt.cycle - start > 0
        comps = [self.completion(q, ev0 + i) for i in range(n_ops)]
        times = [self.events[q][ev0 + i][0] for i in range(n_ops)]
        self.last_span = (start, times[-1])
        lo, hi = (D, n_ops - 1 - D) if n_ops >= 2 * D + 2 else (0, n_ops - 1)
        per_op = (times[hi] - times[lo]) / (hi - lo)
        if n_ops < 2 * D + 2 and by_read:
            # Fewer operations than a steady state needs, by READ: the engine sends the next
            # store's READ parts while the last parts of the one before are out
            # (hw/kbtp/movers.py WorkIssuer), so some of operation 1's data comes before
            # COMPLETION 0, and after the last READ response only the last operation's
            # latency is left (its response's way through the receive path, the entry update
            # and the COMPLETION), which in a steady state overlaps the next data. Time per
            # operation: from the last READ response that ended by COMPLETION 0 to the last READ
            # response, over the READ response octets that ended in that span, in operations.
            # (LOAD's WRITEs do not start before the COMPLETION before them ends: the count
            # above is theirs.)
            ta, tb, inside = self._read_octets_between(sent0, times[lo], times[hi])
            per_op = (tb - ta) * length / inside
        # Bytes moved: data payload octets on the wire in the window, and content checks.
        moved = self._data_octets(kind, by_read, qpn, tx0, sent0)
        if kind == "LOAD":
            for s in range(min(n_ops, D)):
                got = bytes(self.bufs[q][s * self.block_size:s * self.block_size + length])
                assert got == self.loaded_expect, "LOAD data differs from the block"
        else:
            h = handles[n_ops - 1] if kind == "ALLOC_STORE" else handles[0]
            dlen, addr = self.block_of(h)
            assert dlen == length, (dlen, length)
            got = self.vt.mem_read(addr, length)
            assert got == datas[n_ops - 1], f"{op}: block content differs from the data stored"
            if kind == "STORE":             # the bench handle now holds this
                self.loaded_expect = got
            self.content[h] = got
        for c in comps:
            assert c.data_length == length, c
        plan = self.plan(op, length, mtu)
        obs = self._frames_per_op(qpn, tx0, sent0, n_ops)
        th = theory_goodput(length, mtu)
        gp = length / per_op
        util = self._utilisation(tx0, sent0, times[lo], times[hi])
        return {
            "op": op, "size": length, "mtu": mtu, "n_ops": n_ops, "depth": D,
            "window": [lo, hi],
            "cycles_per_op": round(per_op, 1),
            "goodput_octets_per_cycle": round(gp, 5),
            "goodput_mbps": round(gp * self.unit_hz * 8 / 1e6, 2),
            "theory": round(th, 5), "frac_theory": round(gp / th, 4),
            "op_bound_cycles": plan["bound"], "frac_op_bound": round(plan["bound"] / per_op, 4),
            # cycles per operation the wire did not need (RTTs the serial engine waits for)
            "excess_cycles": round(per_op - plan["bound"], 1),
            "ops_per_s": round(self.unit_hz / per_op),
            "frame_rate_limit": round(self.unit_hz / plan["bound"]),
            "frames_per_op_plan": [len(plan["to_target"]), len(plan["to_peer"])],
            "frames_per_op_seen": obs,
            "wire_util_to_target": util[0], "wire_util_to_peer": util[1],
            "wire_bound": max(util) >= 0.95,
            "bytes_asked": length * n_ops, "bytes_moved": moved,
            "min_outstanding": min_out, "peer_turnaround_max": self.turnaround,
            "peer_burst_gap_max": self._burst_gap(sent0),
        }

    def _peer_frames(self, sent0):
        """(first, last, frame) of the peer's frames from index ``sent0`` that reached the
        wire (rx_log grows as frames are sent)."""
        log = self.vt.rx_log
        return [(log[i][0], log[i][1], self.sent[i])
                for i in range(sent0, min(len(self.sent), len(log)))]

    def _data_octets(self, kind, by_read, qpn, tx0, sent0, target_qpn=None):
        """Data payload octets on the wire since ``tx0`` / ``sent0``: the WRITEs to peer QP
        ``qpn`` (LOAD), else the peer's READ responses or inline SEND data (only those to
        target QP ``target_qpn`` when given)."""
        from roce.frames import parse_frame
        O = BthOpcode
        n = 0
        if kind == "LOAD":
            for f in self.tx[tx0:]:
                k, p = parse_frame(f.frame)
                if k == "roce" and p.dest_qp == qpn and O.WRITE_FIRST.value <= p.opcode \
                        <= O.WRITE_ONLY_IMM.value:
                    n += len(p.payload)
        elif by_read:
            for _, _, fr in self._peer_frames(sent0):
                p = _read_response(fr)
                if p is not None and target_qpn in (None, p.dest_qp):
                    n += len(p.payload)
        else:
            # SEND messages: the KBTP request (header + Data Descriptor) then inline data.
            msgs, cur = [], b""
            for _, _, fr in self._peer_frames(sent0):
                k, p = parse_frame(fr)
                if k != "roce" or p.opcode > O.SEND_ONLY_IMM.value or \
                        target_qpn not in (None, p.dest_qp):
                    continue
                cur += p.payload
                if p.opcode in (O.SEND_LAST.value, O.SEND_ONLY.value):
                    msgs.append(cur)
                    cur = b""
            n = sum(len(m) - REQUEST for m in msgs)
        return n

    def _read_octets_between(self, sent0, t0, t1):
        """(ta, tb, n) of the READ responses to the target: ta the last octet of the last one
        that ended by t0 (t0 if none), tb that of the last one that ended by t1, n the payload
        octets of those that ended in (ta, tb]. (From a frame's end to a frame's end: a span
        from t0 would count the whole payload of a frame under way at t0, up to a frame too
        much.)"""
        ends = []
        for _, last, fr in self._peer_frames(sent0):
            p = _read_response(fr) if last <= t1 else None
            if p is not None:
                ends.append((last, len(p.payload)))
        ta = max([t for t, _ in ends if t <= t0], default=t0)
        tb = max([t for t, _ in ends], default=t0)
        return ta, tb, sum(n for t, n in ends if ta < t <= tb)

    def _frames_per_op(self, qpn, tx0, sent0, n_ops):
        to_peer = sum(1 for f in self.tx[tx0:] if f.frame[12:14] == b"\x08\x00")
        to_target = len(self._peer_frames(sent0))
        return [round(to_target / n_ops, 2), round(to_peer / n_ops, 2)]

    def _utilisation(self, tx0, sent0, t0, t1):
        """Fraction of cycles in [t0, t1) each direction carried a frame (with its IFG)."""
        if t1 <= t0:
            return (0.0, 0.0)

        def busy(spans):
            return sum(max(0, min(b + 1 + IFG, t1) - max(a, t0)) for a, b in spans)
        rx = busy([(a, b) for a, b, _ in self._peer_frames(sent0)])
        tx = busy([(f.start, f.end) for f in self.tx[tx0:]])
        return (round(rx / (t1 - t0), 4), round(tx / (t1 - t0), 4))

    def _burst_gap(self, sent0):
        """Largest number of cycles the peer's wire stayed idle while the peer had a frame
        queued: first octet - max(cycle queued, previous frame's last octet + 1 + IFG)."""
        log = self.vt.rx_log
        worst = 0
        for i in range(max(sent0, 1), min(len(self.sent), len(log))):
            ready = max(self.sent_at[i], log[i - 1][1] + 1 + IFG)
            worst = max(worst, log[i][0] - ready)
        return worst

    # ---- many initiators at once ------------------------------------------------------------
    def series_multi(self, op, length, n_ops, handles, qs=None, depth=None):
        """``n_ops`` operations of each initiator in ``qs`` (default: all), every one keeping
        ``depth`` (default :data:`MULTI_DEPTH`, within the credits) requests outstanding at the
        same time; ``handles[q]``: the handles of
        initiator ``q`` (its one bound handle, or one per operation for ALLOC_STORE). ``op``:
        one operation for all, or a dict of each QP's (a mixed series, named ``OP@q+...``).

        The figures are taken over the common steady-state window: from the cycle every QP has
        had its first COMPLETION (warm-up) to the cycle the first QP has had its last (times:
        first octets of the COMPLETIONs). A QP's rate is ``m`` / the cycles
        between its first COMPLETION in the window and its ``m``-th after that, ``m`` the largest
        multiple of the depth that fits (a QP's completions may come depth at a time: whole
        groups keep the phase of the window's edges out of the rate). The aggregate rate is the
        sum of the QPs' rates (``cycles_per_op`` its inverse); ``cycles_per_op_merged`` is the
        distance between successive COMPLETIONs of any QP in the window, which the edges'
        phase skews. Should no common window
        exist (the first QP finished before the last started: ``common_window`` False) the
        window starts at the first COMPLETION of all, a rate is the QP's COMPLETIONs in it /
        its cycles, and the aggregate is the merged one.
        Latency of every request: its last octet in (``rx_log``) to the first octet of its
        COMPLETION."""
        from roce.frames import parse_frame
        qs = list(range(self.n_init)) if qs is None else list(qs)
        # ``op`` a dict: each QP its own operation (a mixed series: LOADs sending while
        # STOREs arrive); the figures then mix them, and the bound is the slowest one's.
        op_of = dict(op) if isinstance(op, dict) else dict.fromkeys(qs, op)
        if isinstance(op, dict):
            op = "+".join(f"{op_of[q]}@{q}" for q in qs)
        kind_of = {q: OPS[op_of[q]] for q in qs}
        D = self.within_credits(depth or MULTI_DEPTH)
        mtu = self.mtus[qs[0]]
        assert all(self.mtus[q] == mtu for q in qs), "one path MTU for every QP"
        datas = {q: [self.rng.randbytes(length) for _ in range(n_ops)] for q in qs}
        ev0 = {q: len(self.events[q]) for q in qs}
        tx0, sent0 = len(self.tx), len(self.sent)
        retx0 = self.ep.counters.retransmissions
        self.turnaround = 0
        done = lambda q: len(self.events[q]) - ev0[q]
        total = lambda: sum(done(q) for q in qs)
        plans = {q: self.plan(op_of[q], length, mtu) for q in qs}
        plan = plans[qs[0]]
        bound = max(pl["bound"] for pl in plans.values())
        k = dict.fromkeys(qs, 0)
        rid_of = {q: {} for q in qs}         # request_id -> operation index
        min_out = dict.fromkeys(qs, D)
        while total() < n_ops * len(qs):
            for q in qs:
                while k[q] < n_ops and k[q] - done(q) < D:
                    h = handles[q][k[q]] if kind_of[q][0] == "ALLOC_STORE" else handles[q][0]
                    raw = self.request(q, op_of[q], h, length, datas[q][k[q]], slot=k[q] % D)
                    rid_of[q][self.rid] = k[q]
                    self.qps[q].send(raw)
                    self._deliver([])     # puts the SEND on the wire now
                    k[q] += 1
            before = total()
            self.pump(lambda: total() > before, max_cycles=4 * len(qs) * bound + 200_000,
                      what=f"{op} {length} x{len(qs)} QPs completion {before}")
            for q in qs:
                if 0 < done(q) < n_ops:
                    min_out[q] = min(min_out[q], k[q] - done(q))
        comps = {q: [self.completion(q, ev0[q] + i) for i in range(n_ops)] for q in qs}
        times = {q: [self.events[q][ev0[q] + i][0] for i in range(n_ops)] for q in qs}
        # Content: every QP's LOAD data is its block, every stored block holds what was stored.
        for q in qs:
            kind = kind_of[q][0]
            for c in comps[q]:
                assert c.data_length == length, (q, c)
            if kind == "LOAD":
                want = self.content[handles[q][0]]
                for s in range(min(n_ops, D)):
                    got = bytes(self.bufs[q][s * self.block_size:s * self.block_size + length])
                    assert got == want, f"initiator {q}: LOAD data differs from its block"
                continue
            checks = (list(enumerate(handles[q][:n_ops])) if kind == "ALLOC_STORE"
                      else [(n_ops - 1, handles[q][0])])
            for i, h in checks:
                dlen, addr = self.block_of(h)
                assert dlen == length, (q, h, dlen, length)
                got = self.vt.mem_read(addr, length)
                assert got == datas[q][i], \
                    f"{op_of[q]} initiator {q}: block content differs from the data stored"
                self.content[h] = got
        # Requests: the k-th SEND Only / Last to target QP q is q's k-th request.
        req_at = {q: [] for q in qs}
        for i in range(sent0, len(self.sent)):
            kk, p = parse_frame(self.sent[i])
            if kk == "roce" and p.opcode in (BthOpcode.SEND_ONLY.value,
                                             BthOpcode.SEND_LAST.value):
                q = p.dest_qp - T_QPN0
                if q in req_at:
                    req_at[q].append(i)
        retx = self.ep.counters.retransmissions - retx0
        lat = {}
        for q in qs:
            assert len(req_at[q]) == n_ops or retx, (q, len(req_at[q]), n_ops)
            lat[q] = [times[q][i] - self.vt.rx_log[req_at[q][rid_of[q][c.request_id]]][1]
                      for i, c in enumerate(comps[q])] if len(req_at[q]) == n_ops else []
        # The common steady-state window: every QP past its first COMPLETION (warm-up), none
        # past its last. Should the first QP finish before the last one starts, the window
        # starts at the first COMPLETION of all (a starved QP then shows a rate near 0).
        w0, w1 = max(t[0] for t in times.values()), min(t[-1] for t in times.values())
        common = w1 > w0
        if not common:
            w0 = min(t[0] for t in times.values())
        span = max(1, w1 - w0)
        merged = sorted(t for q in qs for t in times[q] if w0 <= t <= w1)
        agg_merged = (len(merged) - 1) / max(1, merged[-1] - merged[0])
        rate, spans = {}, {}
        for q in qs:
            inw = [t for t in times[q] if w0 <= t <= w1]
            # whole multiples of D intervals: a QP's completions may come D at a time
            m = max(0, (len(inw) - 1) // D * D)
            if common and m:
                rate[q], spans[q] = m / (inw[m] - inw[0]), (m, inw[m] - inw[0])
            else:
                c = sum(1 for t in inw if t > w0)
                rate[q], spans[q] = c / span, (c, span)
        mean = sum(rate.values()) / len(qs)
        ratio = {q: (rate[q] / mean if mean else 0.0) for q in qs}
        max_dev = max(abs(r - 1) for r in ratio.values())
        # The aggregate: the sum of the QPs' rates, each over whole groups of D intervals, when
        # the window is common; the distance between successive COMPLETIONs of any QP
        # (``agg_merged``, kept in the row) takes the window's edges in the middle of groups.
        # Once the wire to the peer was saturated (the MAC's receive buffer drained a word a
        # cycle), that put more COMPLETIONs than wire time into the window: 4 QPs of 4 KiB
        # LOADs on the ECPIX-5 core came out at 1.013 of the op wire bound (24 per QP; 1.030
        # with --quick's 12), where the summed rates give 1.0007 (1.0015).
        agg = sum(rate.values()) if common else agg_merged
        per_op = 1 / agg if agg else float("inf")
        gp = length * agg
        th = theory_goodput(length, mtu)
        util = self._utilisation(tx0, sent0, w0, w1)
        every = [x for q in qs for x in lat[q]]
        per_qp = []
        for q in qs:
            moved = self._data_octets(*kind_of[q], P_QPN0 + q, tx0, sent0,
                                      target_qpn=T_QPN0 + q)
            per_qp.append({
                "qp": q, "completed": len(comps[q]), "rate_ops": spans[q][0],
                "rate_cycles": spans[q][1],
                "ops_per_cycle": round(rate[q], 8),
                "cycles_per_op": round(1 / rate[q], 1) if rate[q] else None,
                "ratio_to_mean": round(ratio[q], 4),
                "bytes_asked": length * n_ops, "bytes_moved": moved,
                "min_outstanding": min_out[q],
                "latency_mean": round(sum(lat[q]) / len(lat[q]), 1) if lat[q] else None,
                "latency_p99": _pct(lat[q], 0.99) if lat[q] else None,
                "latency_max": max(lat[q]) if lat[q] else None,
            })
        return {
            "op": op, "size": length, "mtu": mtu, "n_qp": len(qs), "n_ops_per_qp": n_ops,
            "depth": D,
            "n_ops": n_ops * len(qs), "window": [w0, w1], "window_cycles": w1 - w0,
            "common_window": common,
            "cycles_per_op": round(per_op, 1),
            "cycles_per_op_merged": round(1 / agg_merged, 1) if agg_merged else None,
            "goodput_octets_per_cycle": round(gp, 5),
            "goodput_mbps": round(gp * self.unit_hz * 8 / 1e6, 2),
            "theory": round(th, 5), "frac_theory": round(gp / th, 4),
            "op_bound_cycles": bound, "frac_op_bound": round(bound * agg, 4),
            "excess_cycles": round(per_op - bound, 1),
            "ops_per_s": round(self.unit_hz * agg), "frame_rate_limit": round(self.unit_hz / bound),
            "frames_per_op_plan": [len(plan["to_target"]), len(plan["to_peer"])],
            "frames_per_op_seen": self._frames_per_op(None, tx0, sent0, n_ops * len(qs)),
            "wire_util_to_target": util[0], "wire_util_to_peer": util[1],
            "wire_bound": max(util) >= 0.95,
            "bytes_asked": length * n_ops * len(qs),
            "bytes_moved": sum(x["bytes_moved"] for x in per_qp),
            "fairness_max_dev": round(max_dev, 4), "fair": max_dev <= FAIRNESS_GOAL,
            "latency_mean": round(sum(every) / len(every), 1) if every else None,
            "latency_p99": _pct(every, 0.99) if every else None,
            "latency_max": max(every) if every else None,
            "min_outstanding": min(min_out.values()), "peer_turnaround_max": self.turnaround,
            "peer_burst_gap_max": self._burst_gap(sent0), "retransmits_peer": retx,
            "per_qp": per_qp,
        }

    def plan(self, op, length, mtu):
        """:func:`op_plan` with this target's READ parts."""
        return op_plan(op, length, mtu, part=self.read_part)

    # ---- latency --------------------------------------------------------------------------
    def latency(self, qs, op, handles, length=64):
        """One request of each initiator in ``qs`` at the same cycle; per request the cycles
        from its last octet in (rx_log) to the first octet of its first non-ACK response,
        from its first octet, to the transport ACK of it, and the engine's LAST_LATENCY
        (when a single request)."""
        from roce.frames import parse_frame
        from roce.frames import parse_frame as _pf
        tx0, sent0 = len(self.tx), len(self.sent)
        idx, ev0 = {}, {}
        for q in qs:
            raw = self.request(q, op, handles[q], length, self.rng.randbytes(length))
            ev0[q] = len(self.events[q])
            self.qps[q].send(raw)
        self._deliver([])
        for i in range(sent0, len(self.sent)):          # the request frame of each QP
            k, p = _pf(self.sent[i])
            if k == "roce" and p.opcode in (BthOpcode.SEND_ONLY.value,
                                            BthOpcode.SEND_FIRST.value):
                idx.setdefault(p.dest_qp - T_QPN0, i)
        assert sorted(idx) == sorted(qs), idx
        self.pump(lambda: all(len(self.events[q]) > ev0[q] for q in qs),
                  what=f"latency {op}")
        self.settle(2000)
        out = []
        for q in qs:
            self.completion(q, ev0[q])
            first, last = self.vt.rx_log[idx[q]]
            resp = ack = None
            for f in self.tx[tx0:]:
                k, p = parse_frame(f.frame)
                if k != "roce" or p.dest_qp != P_QPN0 + q or f.start < last:
                    continue
                if p.opcode == BthOpcode.ACKNOWLEDGE.value:
                    ack = f.start if ack is None else ack
                elif resp is None:
                    resp = f.start
            out.append({"qp": q, "from_last": resp - last, "from_first": resp - first,
                        "ack_from_last": None if ack is None else ack - last})
        if len(qs) == 1:
            out[0]["engine_notify_to_wr"] = self.engine_reg("LAST_LATENCY")
        return out

    def settle(self, cycles):
        """Let the network run ``cycles`` (ACKs, reposts)."""
        end = self.vt.cycle + cycles
        self.pump(lambda: self.vt.cycle >= end, max_cycles=cycles + 1)

    def arp_turnaround(self):
        """Cycles from the last octet of an ARP request to the first octet of the reply."""
        from roce.frames import build_arp, ip_int, mac_bytes
        req = build_arp(1, mac_bytes(P_MAC), ip_int(P_IP), b"\0" * 6, ip_int(T_IP),
                        b"\xff" * 6).ljust(MIN_FRAME, b"\0")
        i, tx0 = len(self.sent), len(self.tx)
        self.send(req)
        self.pump(lambda: any(f.frame[12:14] == b"\x08\x06" for f in self.tx[tx0:]),
                  max_cycles=100_000, what="ARP reply")
        f = next(f for f in self.tx[tx0:] if f.frame[12:14] == b"\x08\x06")
        return f.start - self.vt.rx_log[i][1]


# --------------------------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------------------------

SIZES = [64, 256, 1024, 4096, 16384, 65536, 262144, 1048576]
QUICK_SIZES = [64, 4096]


#: Configurations whose one-initiator series run longer than 4 D operations, by this factor.
#: At 10 Gb/s a pipeline of D requests holds more than D operations' data (the 128 KiB MAC
#: receive buffer, 8 octets a cycle): a window of 2 D - 1 intervals then still sees the fill,
#: and STORE by READ of 4 KiB at MTU 1024 measured 4,494 octet times per operation, faster
#: than its own frames take on the wire (4,554; test_quick_10g_is_possible); 64 operations
#: gave 4,710, 128 gave 4,768 (0.973 of the wire bound). The ECPIX-5 the same since its DDR3
#: model takes LiteDRAM's command rate (2026-12-07): a READ response's payload arrives at one
#: word a core cycle out of the ICRC check and the DDR3 takes a write every 15/8 cycles, so the
#: MAC's receive buffer holds part of the pipeline, and STORE by READ of 4 KiB at MTU 1024
#: measured 4,497 octet times per operation over 64 (test_quick_goodput_is_possible; the wire
#: bound 4,554).
SERIES_FACTOR = {XGMII_CONFIG: 4, "ecpix5": 4}


def _n_ops(size, quick, depth=None):
    # a steady-state window between the fill and the drain of ``depth`` (default DEPTH)
    # requests (see series): 2 depth - 1 intervals
    if size <= 16384:
        return 4 * (depth or DEPTH)
    return 3


#: The configuration the board builds (first in every table) and the unit-test target's widths.
CONFIGS = ("ecpix5", "8", "64")


def label(config):
    """How the table names a configuration: the board's, ``unit-w<width>`` or ``unit-10g``
    (not a board's)."""
    if config == XGMII_CONFIG:
        return "unit-10g"
    return config if not str(config).isdigit() else f"unit-w{config}"



#: Board configurations by name: the shipped core, and simulation-only variants of it.
BOARD_CONFIGS = ("ecpix5", "ecpix5-bram")


def _params(config):
    from sim.vltarget import config_params
    return config_params(config)


def _vt(config, log):
    from sim.vltarget import VlTarget
    return VlTarget(_params(config), log=log)


def clocks_of(config):
    """The clocks of a configuration: ``gmii_hz`` (cycles of every figure) and ``core_hz``
    (the engine's LAST_LATENCY), as the board runs them (the unit target: both 125 MHz)."""
    from sim.vltarget import board_params
    if config in BOARD_CONFIGS:
        p = board_params("ecpix5")
        return {"gmii_hz": p["mac_hz"], "core_hz": p["core_hz"], "width": p["width"]}
    if config == XGMII_CONFIG:
        # gmii_hz: the rate of the counts (octet times of the 10 Gb/s line)
        from sim.vltarget import XGMII_10G
        return {"gmii_hz": XGMII_OCTET_HZ, "core_hz": XGMII_10G["clk_hz"], "width": 64}
    return {"gmii_hz": CLOCK_HZ, "core_hz": CLOCK_HZ, "width": int(config)}


def run_size(width, size, *, quick=False, mtus=(1024, 4096), max_inline=16384, log=print,
             depth=None):
    """Every goodput series of one block size in one configuration (``width``: a name of
    :data:`CONFIGS`): one fresh target per path MTU. A block size the configuration's memory
    cannot hold is recorded in ``unfit``.

    A series that cannot complete (no completion within 4 x its wire bound + 200 000 cycles)
    ends that MTU's run; it is recorded in ``failed`` with the MAC's overflow / underrun
    counters (a frame longer than the MAC buffers is dropped on receive or never sent).
    """
    out = {"series": [], "failed": [], "retransmits": []}
    n = _n_ops(size, quick, depth) * SERIES_FACTOR.get(str(width), 1)
    return _per_mtu(width, size, mtus, out, log, n_init=1, max_inline=max_inline,
                    max_blocks=max(n + 2, 8), depth=depth,
                    run=lambda b, w: _mtu_series(b, w, size, n, b.max_inline, out, log))


def _per_mtu(width, size, mtus, out, log, *, n_init, max_inline, max_blocks, run, extra=None,
             what="", depth=None):
    """One fresh target per path MTU: the :class:`Bench` (a block size the memory cannot hold
    goes into ``out["unfit"]`` and ends the run), ``run(b, width)``, and the retransmissions;
    a series that cannot complete (TimeoutError) ends that MTU's run, recorded in
    ``out["failed"]`` with the MAC's counters. ``extra``: keys added to the failed and
    retransmission records; ``what``: said after the size / MTU in the log lines."""
    extra = extra or {}
    width = str(width)
    for mtu in mtus:
        with _vt(width, log) as vt:
            try:
                b = Bench(vt, size, mtus=(mtu,), n_init=n_init, max_inline=max_inline,
                          max_blocks=max_blocks, depth=depth)
            except MemoryError as e:
                out["unfit"] = str(e)
                log(f"{label(width):<11} {size:>8}:{what} not run, {e}")
                return out
            b.bring_up()
            try:
                run(b, width)
            except TimeoutError as e:
                mac = {k: _top_counter(b, "mac", k) for k in ("rx_overflows", "tx_underruns",
                                                               "rx_frames_ok", "tx_frames")}
                out["failed"].append({"width": width, "size": size, "mtu": mtu, **extra,
                                      "op": b.current_op, "error": str(e)[:200], "mac": mac})
                log(f"{label(width):<11} {b.current_op:<19} {size:>8} {mtu:>5}{what} FAILED: "
                    f"no completion (MAC {mac})")
            # Overload: frames the MAC's full receive buffer lost, and new messages the
            # responder refused with an RNR NAK while that buffer was half full instead.
            out["retransmits"].append({"mtu": mtu, **extra,
                                       "target": _req_counter(b, "cnt_retransmits"),
                                       "peer": b.ep.counters.retransmissions,
                                       "rx_overflows": _top_counter(b, "mac", "rx_overflows"),
                                       "tx_underruns": _top_counter(b, "mac", "tx_underruns"),
                                       "rnr_backlog": _resp_counter(b, "cnt_rnr_backlog")})
    return out


def _mtu_series(b, width, size, n, max_inline, out, log):
    s = b.sess[0]
    hb = s.handle_base
    n_alloc = min(n, b.num_blocks - 1, s.handle_count - 1)
    # ALLOC_STORE by READ at every size; inline too where the size fits Max Inline
    allocs = (["ALLOC_STORE_INLINE"] if size <= max_inline else []) + ["ALLOC_STORE_READ"]
    ops = ["LOAD", "STORE_READ"] + (["STORE_INLINE"] if size <= max_inline else [])
    # The handle of LOAD / STORE: bound by one (unmeasured) ALLOC_STORE by READ.
    b.current_op = "ALLOC_STORE_READ (setup)"
    _bind_one(b, 0, hb, size, max_cycles=4 * b.plan("ALLOC_STORE_READ", size,
                                                    b.mtus[0])["bound"] + 200_000)
    runs = [(a, list(range(hb + 1, hb + 1 + n_alloc)), n_alloc)
            for a in allocs] if n_alloc >= 2 else []
    runs += [(op, [hb], n) for op in ops]
    for op, hs, k in runs:
        b.current_op = op
        r = b.series(0, op, size, k, hs)
        r["width"] = width
        out["series"].append(r)
        log(_row(r))
        if op.startswith("ALLOC"):
            b.free(0, hs)


#: Block sizes and operations of the multi-QP series (sizes also in ``--sizes`` only).
MULTI_SIZES = (64, 4096)
MULTI_OPS = ("LOAD", "STORE_INLINE", "STORE_READ", "ALLOC_STORE_INLINE")
QUICK_MULTI_OPS = ("LOAD", "STORE_INLINE")


def _n_ops_multi(size, quick):
    """Operations per QP of a multi-QP series."""
    if size <= 1024:
        return 24 if quick else 48
    return 12 if quick else 24


def run_multi(width, size, *, quick=False, mtus=(1024, 4096), ops=None, max_inline=16384,
              n_qp=MULTI_QPS, log=print, depth=None):
    """The multi-QP series of one block size (:meth:`Bench.series_multi`): ``n_qp``
    initiators at once, one fresh target per path MTU. An inline operation whose data exceed
    the Max Inline the configuration's memory allows with ``n_qp`` QPs' receive buffers runs
    by READ instead (recorded in ``skipped``), as does an ALLOC_STORE the pool cannot give
    every QP two blocks for. A series that cannot complete ends that MTU's run (``failed``)."""
    out = {"multi": [], "failed": [], "skipped": [], "retransmits": []}
    ops = list(ops or (QUICK_MULTI_OPS if quick else MULTI_OPS))
    n = _n_ops_multi(size, quick)
    return _per_mtu(width, size, mtus, out, log, n_init=n_qp, max_inline=max_inline,
                    max_blocks=n_qp * (n + 1) + 2, extra={"n_qp": n_qp}, what=f" x{n_qp} QPs",
                    run=lambda b, w: _mtu_multi(b, w, size, n, ops, out, log, depth))


def _mtu_multi(b, width, size, n, ops, out, log, depth=None):
    qs = list(range(b.n_init))
    mtu = b.mtus[0]
    for q in qs:        # each QP's own handle for LOAD / STORE, bound by one ALLOC_STORE
        b.current_op = f"ALLOC_STORE_READ (setup QP {q})"
        _bind_one(b, q, b.sess[q].handle_base, size,
                  max_cycles=4 * b.plan("ALLOC_STORE_READ", size, mtu)["bound"] + 200_000)
    n_alloc = min(n, (b.num_blocks - len(qs)) // len(qs),
                  min(b.sess[q].handle_count for q in qs) - 1)
    done = set()
    for op in ops:
        kind, by_read = OPS[op]
        why = None
        if kind != "LOAD" and not by_read and size > b.max_inline:
            why = (f"inline data of {size} octets exceed the Max Inline {b.max_inline} the "
                   f"memory leaves with {len(qs)} QPs' receive buffers")
        elif kind == "ALLOC_STORE" and n_alloc < 2:
            why = f"the pool of {b.num_blocks} blocks cannot give {len(qs)} QPs two each"
        if why:
            alt = "STORE_READ" if kind == "STORE" else None
            out["skipped"].append({"op": op, "size": size, "mtu": mtu, "why": why,
                                   "instead": alt if alt not in done else None})
            log(f"{label(width):<11} {op:<19} {size:>8} {mtu:>5} x{len(qs)} QPs not run: {why}"
                + (f"; {alt} instead" if alt and alt not in done else ""))
            if alt is None or alt in done:
                continue
            op, kind = alt, "STORE"
        if op in done:
            continue
        done.add(op)
        hb = {q: b.sess[q].handle_base for q in qs}
        if kind == "ALLOC_STORE":
            hs, k = {q: list(range(hb[q] + 1, hb[q] + 1 + n_alloc)) for q in qs}, n_alloc
        else:
            hs, k = {q: [hb[q]] for q in qs}, n
        b.current_op = op
        r = b.series_multi(op, size, k, hs, depth=depth)
        r["width"] = width
        out["multi"].append(r)
        log(_multi_row(r))
        log(_fair_line(r))
        if kind == "ALLOC_STORE":
            for q in qs:
                b.free(q, hs[q])


def run_latency(width, log=print):
    """Latency figures (64 octets, MTU 1024, 4 initiators), the ARP turnaround, and the
    latency against the data length (:func:`latency_slopes`)."""
    width = str(width)
    with _vt(width, log) as vt:
        b = Bench(vt, 64, mtus=(1024,), n_init=4, max_blocks=32)
        b.bring_up()
        lat = latency_runs(b)
        out = {"latency": lat, "arp_turnaround": b.arp_turnaround(),
               "retransmits": {"target": _req_counter(b, "cnt_retransmits"),
                               "peer": b.ep.counters.retransmissions}}
    with _vt(width, log) as vt:
        b = Bench(vt, 1024, mtus=(1024,), n_init=1, max_blocks=8)
        b.bring_up()
        out["slopes"] = latency_slopes(b)
    return out


def latency_slopes(b, lengths=(64, 1024)):
    """Alone latency (last request octet -> first response octet) of LOAD and STORE_INLINE
    at two data lengths: the cycles per octet tell the store-and-forward stages (a LOAD's
    WRITE frame is buffered whole before its preamble; an inline request is buffered whole by
    the MAC receiver and the ICRC check, then copied)."""
    h = b.sess[0].handle_base
    for k, n in enumerate(lengths):
        _bind_one(b, 0, h + k, n)
    out = {}
    for op in ("LOAD", "STORE_INLINE"):
        pts = []
        for k, n in enumerate(lengths):
            hs = {0: h + k}
            xs = [b.latency([0], op, hs, length=n)[0] for _ in range(2)]
            pts.append({"length": n, "from_last": min(x["from_last"] for x in xs),
                        "engine_notify_to_wr": min(x["engine_notify_to_wr"] for x in xs)})
        d = pts[-1]["from_last"] - pts[0]["from_last"]
        out[op] = {"points": pts, "cycles_per_octet": round(d / (lengths[-1] - lengths[0]), 3)}
    return out


# ---- sessions: the same operations from each kind of session --------------------------------

#: Operations of each group of the sessions mix, and their block size (one packet at MTU 1024).
SESSION_OPS = 8
SESSION_SIZE = 1024
#: The mix, in order (:data:`OPS` keys), ``n`` operations each. Handles from the session's
#: Handle Base: the inline ALLOC_STOREs bind 0..n-1, the STOREs and LOADs use 0, the
#: ALLOC_STOREs by RDMA READ bind n..2n-1: every operation of the mix is one the engine must
#: run itself.
SESSION_MIX = ("ALLOC_STORE_INLINE", "STORE_INLINE", "LOAD", "ALLOC_STORE_READ")
#: Session kinds: the features the HELLO asks for and the target configuration besides the
#: bench's. A session is granted ADDR_LE only by a target whose structures are ADDR_LE
#: (host/config.py ``offered``: CTRL bit 2), so the ADDR_LE session runs on such a target;
#: DIRECT_ALLOC needs a partition (``direct_quota`` set by :func:`run_sessions` to hold every
#: block of the mix) and is asked for with DIRECT_LOAD, as an initiator of the one trusted
#: domain would.
SESSION_KINDS = {
    "plain": {"features": 0, "cfg": {}},
    "ADDR_LE": {"features": Features.ADDR_LE.value, "cfg": {"addr_le": True}},
    "DIRECT_ALLOC": {"features": Features.DIRECT_ALLOC.value | Features.DIRECT_LOAD.value,
                     "cfg": {"direct_partitions": 1}},
}
SESSION_ENGINE_OPS = ("ALLOC_STORE", "STORE", "LOAD")


class SessionsError(RuntimeError):
    """A row of the sessions table would be wrong: the host driver handled an operation of the
    mix, the engine's counters did not move by the operations sent, or the target's answers
    differ from the golden model's."""


def _feature_names(bits):
    return "+".join(f.name for f in Features if bits & f.value) or "-"


def _drain_host(b, polls=400):
    """Let the driver serve whatever reached the host (after a stalled mix): the operation
    names it handled."""
    names, idle = [], 0
    while idle < 40 and polls > 0:
        polls -= 1
        b._deliver(b.vt.run(256, until_tx=True))
        got = run_sync(b.driver.poll_all(b.vt.cycle * 1e3 / b.unit_hz))
        names += [h.op for h in got]
        idle = 0 if got else idle + 1
    return names


def _counter_delta(c0, c1):
    return {f"{k[0]}.{k[1]}": c1.get(k, 0) - c0.get(k, 0)
            for k in sorted(set(c0) | set(c1)) if c1.get(k, 0) != c0.get(k, 0)}


def _model_check(b, model, conn, journal, ev0, handles):
    """Replay the mix's requests (``journal``, see :attr:`Bench.journal`) in the golden model
    (:class:`model.target.TargetModel`) and compare: every COMPLETION octet for octet (by
    Request ID), the initiator's buffer (LOAD data), the KBTP structures (table, rings,
    counters: ``[0, pool)``) and the blocks of ``handles``. Returns a list of differences."""
    from host import codec
    from model.target import SendMsg
    imem = model.initiator_memory(conn)
    want = {}
    for q, raw, off, slot in journal:
        if slot is not None:
            imem.write(0x5000 + q, PEER_VA + off, slot)
        for a in model.receive(conn, raw, now_ms=b.vt.cycle * 1e3 / b.unit_hz):
            if isinstance(a, SendMsg):
                want[codec.decode(a.payload).request_id] = a.payload
    got = {}
    for _, payload in b.events[0][ev0:]:
        got[codec.decode(payload).request_id] = payload
    bad = []
    for rid in sorted(set(want) | set(got)):
        if want.get(rid) != got.get(rid):
            w, g = want.get(rid), got.get(rid)
            bad.append(f"request {rid}: target {g and codec.decode(g)} model "
                       f"{w and codec.decode(w)}")
    if bytes(imem.contents(0x5000)) != bytes(b.bufs[0]):
        bad.append("LOAD data in the initiator's buffer differ from the model's")
    pool = model.lay["pool"]
    t, m = b.vt.mem_read(0, pool), bytes(model.mem[:pool])
    if t != m:
        k = next(i for i in range(pool) if t[i] != m[i])
        bad.append(f"KBTP structures differ from the model at {k:#x} "
                   f"({sum(x != y for x, y in zip(t, m))} octets): target {t[k:k + 16].hex()} "
                   f"model {m[k:k + 16].hex()}")
    for h in handles:
        e = model.read_entry(h)
        a = model.block_addr(e["block_offset"])
        if b.vt.mem_read(a, e["data_length"]) != bytes(model.mem[a:a + e["data_length"]]):
            bad.append(f"block of handle {h:#x} differs from the model's")
    return bad


def session_mix(b, kind, features, *, n=SESSION_OPS, size=SESSION_SIZE, width="?"):
    """One session of ``kind`` asking for ``features`` on Bench ``b`` (fresh, one initiator):
    the mix of :data:`SESSION_MIX`, ``n`` operations of ``size`` octets each, measured as the
    other series are (:meth:`Bench.series`, the driver not polled). Returns the row; raises
    :class:`SessionsError` when the host handled any operation of the mix, the engine's OK
    counts differ from the operations sent, or the answers differ from the golden model's."""
    from model.target import SendMsg, TargetModel
    t0 = time.monotonic()
    who = f"{label(width)} {kind}"
    b.bring_up(features=features)
    drv, s = b.driver, b.sess[0]
    granted = s.features
    need = features & ~Features.DIRECT_LOAD.value     # DIRECT_LOAD: granted where it can be
    if granted & need != need:
        raise SessionsError(f"{who}: HELLO asked for {_feature_names(features)}, granted "
                            f"{_feature_names(granted)}")
    model, conn = TargetModel(b.cfg), "s"
    model.connect(conn)
    model.initiator_memory(conn).register(0x5000, len(b.bufs[0]), base_to=PEER_VA,
                                          access="rw")
    hello, ack = b.hello[0]
    m_ack = [a.payload for a in model.receive(conn, hello, now_ms=0.0) if isinstance(a, SendMsg)]
    if m_ack != [ack]:
        raise SessionsError(f"{who}: HELLO_ACK differs from the model's: target {ack.hex()} "
                            f"model {[x.hex() for x in m_ack]}")
    # the session is up (HELLO handled by the driver): the counts from here on
    c0 = run_sync(drv.counters())
    ev0 = len(b.events[0])
    b.journal = []
    hb = s.handle_base
    groups, spans = [], []
    try:
        for op in SESSION_MIX:
            b.current_op = op
            hs = ([hb + k for k in range(n)] if op == "ALLOC_STORE_INLINE" else
                  [hb + n + k for k in range(n)] if op == "ALLOC_STORE_READ" else [hb])
            r = b.series(0, op, size, n, hs)
            span = b.last_span[1] - b.last_span[0]
            groups.append({"op": op, "n": n, "cycles": span, "cycles_per_op": r["cycles_per_op"],
                           "bytes_moved": r["bytes_moved"]})
            spans.append(span)
    except TimeoutError as e:
        h0 = drv.host_actions
        names = _drain_host(b)
        c1 = run_sync(drv.counters())
        raise SessionsError(
            f"{who}: {b.current_op} did not complete without the host driver ({e}); the "
            f"driver then handled {len(names)} message(s) {names}, host_actions "
            f"{c0['host_actions']} -> {drv.host_actions} (+{drv.host_actions - h0} in the "
            f"drain); engine counters moved {_counter_delta(c0['engine'], c1['engine'])}; "
            f"engine_parts {drv.engine_parts}") from e
    journal, b.journal = b.journal, None
    b.settle(2000)
    # anything that reached the host during the mix is handled (and counted) now
    stray = [h.op for h in run_sync(drv.poll_all(b.vt.cycle * 1e3 / b.unit_hz))]
    c1 = run_sync(drv.counters())
    host = c1["host_actions"] - c0["host_actions"]
    eng = _counter_delta(c0["engine"], c1["engine"])
    sent = {"ALLOC_STORE": 2 * n, "STORE": n, "LOAD": n}
    ok = {op: eng.get(f"{op}.OK", 0) for op in SESSION_ENGINE_OPS}
    other = {k: v for k, v in eng.items() if not k.endswith(".OK")}
    slow = _counter_delta(c0["slow_path"], c1["slow_path"])
    # where the ALLOC_STOREs took their blocks: the Block Offsets of their COMPLETIONs
    from host import codec
    from hw.headers import Opcode
    parts = [(b.cfg.block_offset(d["first_block"]),
              b.cfg.block_offset(d["first_block"]) + b.cfg.direct_quota * b.cfg.block_size)
             for d in b.cfg.layout()["direct"]]
    comp = {m.request_id: m for m in (codec.decode(p) for _, p in b.events[0][ev0:])}
    reqs = [codec.decode(raw, addr_le=b.addr_le[0]) for _, raw, _, _ in journal]
    allocs = [comp[m.request_id].block_offset for m in reqs
              if m.OPCODE is Opcode.ALLOC_STORE and m.request_id in comp]
    where = {("partition %d" % k if k is not None else "shared ring")
             for k in (next((i for i, (lo, hi) in enumerate(parts) if lo <= x < hi), None)
                       for x in allocs)}
    blocks_from = ", ".join(sorted(where))
    clocks = clocks_of(width)
    cycles = sum(spans)
    row = {
        "config": label(width), "width": width, "kind": kind,
        "requested_features": _feature_names(features), "granted_features": _feature_names(granted),
        "addr_le_session": b.addr_le[0], "addr_le_structures": b.cfg.addr_le,
        "direct_partitions": b.cfg.direct_partitions, "direct_quota": b.cfg.direct_quota,
        "engine_parts": drv.engine_parts, "fast_path": drv.fast_ok,
        "size": size, "mtu": b.mtus[0], "n_per_group": n, "depth": b.depth, "sent": sent,
        "engine_ok": ok, "engine_other": other, "host_actions": host, "host_handled": stray,
        "slow_path": slow, "blocks_from": blocks_from,
        "free_blocks_delta": {k: c1["free_blocks"][k] - c0["free_blocks"].get(k, 0)
                              for k in c1["free_blocks"]},
        "groups": groups, "cycles": cycles,
        "core_cycles": round(cycles * clocks["core_hz"] / clocks["gmii_hz"]),
        "us": round(cycles / clocks["gmii_hz"] * 1e6, 3),
        "note": ("ADDR_LE structures (CTRL bit 2) and the session's ADDR_LE feature"
                 if b.addr_le[0] else ""),
    }
    why = []
    if host:
        why.append(f"the host driver handled {host} message(s) of the mix {stray}")
    if ok != sent:
        why.append(f"engine OK counts {ok}, operations sent {sent}")
    if other:
        why.append(f"engine counted other statuses {other}")
    want_from = "partition 0" if kind == "DIRECT_ALLOC" else "shared ring"
    if blocks_from != want_from:
        why.append(f"ALLOC_STOREs took blocks from {blocks_from}, not the {want_from}")
    if kind == "DIRECT_ALLOC" and not (drv.engine_parts and granted & Features.DIRECT_ALLOC.value):
        why.append(f"engine_parts {drv.engine_parts}, granted {_feature_names(granted)}")
    bad = _model_check(b, model, conn, journal, ev0, [hb + k for k in range(2 * n)])
    row["model"] = "same" if not bad else "; ".join(bad)
    why += [f"golden model: {x}" for x in bad]
    row["wall_s"] = round(time.monotonic() - t0, 1)
    if why:
        raise SessionsError(f"{who}: " + "; ".join(why) + f" (row {row})")
    return row


def run_sessions(width, *, log=print, n=SESSION_OPS, size=SESSION_SIZE, kinds=None):
    """The sessions table of one configuration: for each kind of :data:`SESSION_KINDS` a fresh
    target configured for it and one session, running :func:`session_mix`. Returns
    ``{"sessions": [row per kind]}``."""
    width = str(width)
    out = {"sessions": []}
    for kind in (kinds or SESSION_KINDS):
        spec = SESSION_KINDS[kind]
        over = dict(spec["cfg"])
        if over.get("direct_partitions"):
            over["direct_quota"] = 2 * n + 2            # every block the mix binds, and two
        shared = 2 * n + 2
        with _vt(width, log) as vt:
            b = Bench(vt, size, mtus=(1024,), n_init=1, cfg_overrides=over,
                      max_blocks=shared + over.get("direct_partitions", 0)
                      * over.get("direct_quota", 0))
            if size > b.max_inline:
                raise SessionsError(f"{label(width)} {kind}: inline data of {size} octets "
                                    f"exceed Max Inline {b.max_inline}")
            row = session_mix(b, kind, spec["features"], n=n, size=size, width=width)
        out["sessions"].append(row)
        log(_session_row(row))
    return out


def _read_response(frame):
    """The parsed RoCE packet of ``frame`` if it is an RDMA READ response, else None."""
    from roce.frames import parse_frame
    k, p = parse_frame(frame)
    if k == "roce" and BthOpcode.READ_RESPONSE_FIRST.value <= p.opcode <= \
            BthOpcode.READ_RESPONSE_ONLY.value:
        return p
    return None


def _top_counter(b, blk, port):
    from hw.iface import Space
    from hw.iface import REG_TOP
    from hw.target.regbank import TOP_COUNTER_BASE
    from hw.target.target import TOP_COUNTERS
    k = TOP_COUNTERS.index((blk, port))
    return b.vt.access(Space.REG, REG_TOP + TOP_COUNTER_BASE + 4 * k, 0, 0)[0]


def _bind_one(b, q, h, size, max_cycles=20_000_000):
    """Bind handle ``h`` with ``size`` octets by one ALLOC_STORE (by READ), not measured."""
    data = b.rng.randbytes(size)
    n0 = len(b.events[q])
    b.qps[q].send(b.request(q, "ALLOC_STORE_READ", h, size, data))
    b._deliver([])
    b.pump(lambda: len(b.events[q]) > n0, max_cycles=max_cycles, what="bind")
    b.completion(q, n0)
    b.loaded_expect = data
    b.content[h] = data


def _resp_counter(b, name):
    from hw.iface import REG_TRANSPORT, Space
    from hw.target.target import RESP_COUNTERS
    r, _ = b.vt.access(Space.REG, REG_TRANSPORT + 4 * RESP_COUNTERS.index(name), 0, 0)
    return r


def _req_counter(b, name):
    from hw.iface import Space
    from hw.target.target import REQ_COUNTER_BASE, REQ_COUNTERS
    r, _ = b.vt.access(Space.REG, REQ_COUNTER_BASE + 4 * REQ_COUNTERS.index(name), 0, 0)
    return r


def latency_runs(b, repeat=4):
    """Latency of each operation at 64 octets: alone (QP 0) and with 4 QPs at once."""
    res = {}
    for q in range(b.n_init):
        _bind_one(b, q, b.sess[q].handle_base, b.block_size)
    every = list(range(b.n_init))
    for op in ("LOAD", "STORE_INLINE", "STORE_READ", "ALLOC_STORE_INLINE"):
        alloc = op.startswith("ALLOC")
        hs = {q: b.sess[q].handle_base + (1 if alloc else 0) for q in every}
        alone, cont = [], []
        for _ in range(repeat):
            alone += b.latency([0], op, hs)
            if alloc:
                b.free(0, [hs[0]])
            cont += b.latency(every, op, hs)
            if alloc:
                for q in every:
                    b.free(q, [hs[q]])
        res[op] = {"alone": alone, "contention": cont}
    return res


def _pct(xs, q):
    """The ``q`` quantile of ``xs`` (nearest rank)."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, -(-int(q * len(xs) * 1000) // 1000) - 1))]


def _stats(xs):
    xs = sorted(xs)
    return {"min": xs[0], "median": xs[len(xs) // 2], "max": xs[-1],
            "mean": round(sum(xs) / len(xs), 1)}


def _resource_entry(r):
    """The figures of one board build report (``python -m boards build``'s report.json)."""
    clocks = r.get("clocks", [])
    sync = [c for c in clocks if c.get("domain") == "sync"]
    # Reports from before the "routed" key: a bitstream means the run routed.
    routed = r.get("routed", r.get("bitstream") is not None)
    return {
        "device": r.get("device"), "stage": r.get("stage"), "core": r.get("core"),
        "core_params": r.get("core_params"),
        "resources": {k: f"{v['used']}/{v['available']}" for k, v in
                      r.get("resources", {}).items()},
        "fmax_mhz": sync[0]["achieved_mhz"] if sync else None,
        "constraint_mhz": sync[0]["constraint_mhz"] if sync else None,
        # Every clock of the build (the full core has four: MAC, core, RGMII rx and tx).
        "clocks": {c.get("domain") or c.get("name"):
                   {k: c.get(k) for k in ("constraint_mhz", "achieved_mhz", "slack_ns",
                                          "met")} for c in clocks},
        "routed": routed,
        "timing_met": bool(r.get("timing_met")) and routed,
        "bitstream": r.get("bitstream"),
        "build_time_s": r.get("build_time_s"),
        "note": r.get("error") or r.get("note") or r.get("timing_note"),
    }


def resources(root=None, records=None):
    """Resources and Fmax of every board: its committed timing record
    (boards/timing_records/<board>.json, the report of ``make timing`` on the netlist the
    suite checks against it: test_timing_record_is_this_netlist), else a build report in
    build/<board>/report.json (a local ``python -m boards build``, which may be of other
    gateware). ``source`` says which."""
    here = Path(__file__).resolve().parent.parent
    root = Path(root or here / "build")
    records = Path(records or here / "boards" / "timing_records")
    out = {}
    for rec in sorted(records.glob("*.json")):
        try:
            d = json.loads(rec.read_text())
        except (OSError, ValueError):
            continue
        out[rec.stem] = {**_resource_entry(d["report"]),
                         "source": f"boards/timing_records/{rec.name} (seed {d.get('seed')}, "
                                   f"digest {str(d.get('digest'))[:16]})"}
    for rep in sorted(root.glob("*/report.json")):
        if rep.parent.name in out:
            continue
        try:
            r = json.loads(rep.read_text())
        except (OSError, ValueError):
            continue
        out[rep.parent.name] = {**_resource_entry(r), "source": str(rep)}
    return out or "not built"


#: The sections of a bench run (``--sections``), in the order they run.
SECTIONS = ("goodput", "multi", "latency", "sessions")


def run_width(w, sizes, quick=False, log=print, mtus=(1024, 4096), depth=None,
              multi_depth=None, sections=SECTIONS):
    """Every figure of one configuration (:data:`CONFIGS`), or those of ``sections`` (names of
    :data:`SECTIONS`). An MTU whose series failed at some size is not run at the larger sizes,
    nor is any size past one the memory cannot hold (recorded in ``skipped``)."""
    t0 = time.monotonic()
    w = str(w)
    wr = {"label": label(w), "clocks": clocks_of(w), "series": [], "failed": [],
          "skipped": [], "retransmits": []}
    dead = {}
    for size in (sizes if "goodput" in sections else ()):
        live = [m for m in mtus if m not in dead]
        wr["skipped"] += [{"size": size, "mtu": m, "why": dead[m]} for m in mtus if m in dead]
        if not live:
            continue
        r = run_size(w, size, quick=quick, log=log, mtus=live, depth=depth)
        if "unfit" in r:
            for m in live:
                wr["skipped"].append({"size": size, "mtu": m, "why": r["unfit"]})
                dead[m] = f"larger than {size} octets, which do not fit the memory"
            continue
        wr["series"] += r["series"]
        wr["failed"] += r["failed"]
        for f in r["failed"]:
            dead.setdefault(f["mtu"], f"failed at size {size}")
        wr["retransmits"] += [dict(x, size=size) for x in r["retransmits"]]
    wr["multi"], wr["multi_failed"], wr["multi_skipped"] = [], [], []
    msizes = [z for z in MULTI_SIZES if z in sizes] if "multi" in sections else []
    if msizes:
        log(MULTI_HEADER)
    for size in msizes:
        r = run_multi(w, size, quick=quick, log=log, mtus=mtus, depth=multi_depth)
        if "unfit" in r:
            wr["multi_skipped"] += [{"size": size, "mtu": m, "why": r["unfit"]} for m in mtus]
            continue
        wr["multi"] += r["multi"]
        wr["multi_failed"] += r["failed"]
        wr["multi_skipped"] += r["skipped"]
        wr["retransmits"] += [dict(x, size=f"{size} x{x['n_qp']} QPs") for x in r["retransmits"]]
    if "latency" in sections:
        lat = run_latency(w, log)
        wr["latency"] = _latency_summary(lat["latency"], wr["clocks"])
        wr["latency_samples"] = lat["latency"]
        wr["arp_turnaround"] = lat["arp_turnaround"]
        wr["latency_slopes"] = lat["slopes"]
        wr["retransmits"].append(dict(lat["retransmits"], size="latency"))
    if "sessions" in sections:
        log(SESSION_HEADER)
        wr["sessions"] = run_sessions(w, log=log)["sessions"]
    wr["wall_s"] = round(time.monotonic() - t0, 1)
    return wr


def run_bench(widths=CONFIGS, quick=False, log=print, sizes=None, mtus=(1024, 4096), jobs=1,
              depth=DEPTH, multi_depth=MULTI_DEPTH, sections=SECTIONS):
    """All figures of every configuration (``widths``: names of :data:`CONFIGS`; ``jobs`` at
    once, in separate processes), or those of ``sections`` (:data:`SECTIONS`); returns the
    results dict (see :func:`write_results`)."""
    sections = tuple(sections)
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        raise ValueError(f"unknown sections {sorted(unknown)}: {', '.join(SECTIONS)}")
    sizes = sizes or (QUICK_SIZES if quick else SIZES)
    widths = [str(w) for w in widths]
    res = {"clock_hz": CLOCK_HZ, "packet_overhead": PACKET_OVERHEAD, "depth": depth,
           "multi_depth": multi_depth,
           "quick": quick, "sections": list(sections), "widths": {},
           "resources": resources()}
    if jobs > 1 and len(widths) > 1:
        from concurrent.futures import ProcessPoolExecutor
        with ProcessPoolExecutor(min(jobs, len(widths))) as ex:
            futs = {w: ex.submit(run_width, w, sizes, quick, print, mtus, depth, multi_depth,
                                 sections) for w in widths}
            for w in widths:
                res["widths"][str(w)] = futs[w].result()
    else:
        for w in widths:
            res["widths"][str(w)] = run_width(w, sizes, quick, log, mtus, depth, multi_depth,
                                              sections)
    return res


def _latency_summary(lat, clocks):
    """Statistics of the latency samples, in GMII cycles, and the medians / means in ns at the
    configuration's clocks (``ns``)."""
    out = {}
    g_ns, c_ns = 1e9 / clocks["gmii_hz"], 1e9 / clocks["core_hz"]
    for op, d in lat.items():
        a, c = d["alone"], d["contention"]
        alone = [x["from_last"] for x in a]
        cont = [x["from_last"] for x in c]
        eng = [x["engine_notify_to_wr"] for x in a]
        out[op] = {
            "ns": {"alone_from_last_median": round(_stats(alone)["median"] * g_ns, 1),
                   "alone_from_first_median": round(
                       _stats([x["from_first"] for x in a])["median"] * g_ns, 1),
                   "engine_notify_to_wr_median": round(_stats(eng)["median"] * c_ns, 1),
                   "contention_from_last_mean": round(_stats(cont)["mean"] * g_ns, 1),
                   "contention_from_last_p99": round(_pct(cont, 0.99) * g_ns, 1),
                   "contention_from_last_max": round(_stats(cont)["max"] * g_ns, 1)},
            "alone_from_last": _stats([x["from_last"] for x in a]),
            "alone_from_first": _stats([x["from_first"] for x in a]),
            "alone_ack_from_last": _stats([x["ack_from_last"] for x in a
                                           if x["ack_from_last"] is not None] or [0]),
            "engine_notify_to_wr": _stats([x["engine_notify_to_wr"] for x in a]),
            "contention_from_last": _stats([x["from_last"] for x in c]),
            "contention_from_first": _stats([x["from_first"] for x in c]),
        }
    return out


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------

CSV_FIELDS = ["config", "op", "size", "mtu", "n_ops", "depth", "cycles_per_op", "goodput_mbps",
              "theory", "frac_theory", "op_bound_cycles", "frac_op_bound", "excess_cycles",
              "ops_per_s",
              "frame_rate_limit", "wire_util_to_target", "wire_util_to_peer", "wire_bound",
              "bytes_asked", "bytes_moved", "min_outstanding", "peer_turnaround_max"]


def _row(r):
    return (f"{label(r.get('width', '?')):<11} {r['op']:<19} {r['size']:>8} {r['mtu']:>5} "
            f"{r.get('depth', ''):>3} {r['cycles_per_op']:>10.1f} {r['goodput_mbps']:>8.1f} "
            f"{r['theory']:>6.3f} "
            f"{r['frac_theory']:>6.3f} {r['frac_op_bound']:>6.3f} {r['excess_cycles']:>7.0f} "
            f"{r['ops_per_s']:>9} "
            f"{r['frame_rate_limit']:>9} {'wire' if r['wire_bound'] else '':>4}")


HEADER = (f"{'config':<11} {'op':<19} {'size':>8} {'mtu':>5} {'dep':>3} {'cyc/op':>10} "
          f"{'Mb/s':>8} {'theory':>6} {'/theo':>6} {'/bound':>6} {'excess':>7} {'ops/s':>9} "
          f"{'limit/s':>9} "
          f"{'':>4}")


MULTI_CSV_FIELDS = ["config", "op", "size", "mtu", "n_qp", "n_ops_per_qp", "depth",
                    "window_cycles",
                    "cycles_per_op", "goodput_mbps", "theory", "frac_theory", "op_bound_cycles",
                    "frac_op_bound", "ops_per_s", "wire_util_to_target", "wire_util_to_peer",
                    "fairness_max_dev", "fair", "qp_ratio_to_mean", "latency_mean",
                    "latency_p99", "latency_max", "min_outstanding", "bytes_asked",
                    "bytes_moved"]

MULTI_HEADER = (f"{'config':<11} {'op':<19} {'size':>8} {'mtu':>5} {'QPs':>3} {'cyc/op':>8} "
                f"{'Mb/s':>8} {'/theo':>6} {'/bound':>6} {'ops/s':>9} {'maxdev':>7} "
                f"{'lat mean':>8} {'lat p99':>8}   (aggregate of every QP)")


def _multi_row(r):
    return (f"{label(r.get('width', '?')):<11} {r['op']:<19} {r['size']:>8} {r['mtu']:>5} "
            f"{r['n_qp']:>3} {r['cycles_per_op']:>8.1f} {r['goodput_mbps']:>8.1f} "
            f"{r['frac_theory']:>6.3f} {r['frac_op_bound']:>6.3f} {r['ops_per_s']:>9} "
            f"{100 * r['fairness_max_dev']:>6.1f}% {r['latency_mean']!s:>8} "
            f"{r['latency_p99']!s:>8}")


SESSION_CSV_FIELDS = ["config", "kind", "requested_features", "granted_features",
                      "addr_le_structures", "engine_parts", "size", "mtu", "n_per_group",
                      "sent_alloc_store", "engine_ok_alloc_store", "sent_store",
                      "engine_ok_store", "sent_load", "engine_ok_load", "host_actions",
                      "blocks_from", "cycles", "core_cycles", "us",
                      "cycles_alloc_store_inline", "cycles_store_inline", "cycles_load",
                      "cycles_alloc_store_read", "model", "note"]

SESSION_HEADER = (f"{'config':<11} {'session':<13} {'features':<24} {'structs':<7} "
                  f"{'eparts':<6} {'ALLOC_STORE':>11} {'STORE':>6} {'LOAD':>6} {'host':>4} "
                  f"{'blocks from':<12} {'cycles':>8} {'core cyc':>8} {'us':>8} model"
                  f"   (engine OK counts / sent)")


def _session_row(r):
    ok, sent = r["engine_ok"], r["sent"]
    return (f"{r['config']:<11} {r['kind']:<13} {r['granted_features']:<24} "
            f"{'LE' if r['addr_le_structures'] else 'BE':<7} "
            f"{'yes' if r['engine_parts'] else 'no':<6} "
            f"{str(ok['ALLOC_STORE']) + '/' + str(sent['ALLOC_STORE']):>11} "
            f"{str(ok['STORE']) + '/' + str(sent['STORE']):>6} "
            f"{str(ok['LOAD']) + '/' + str(sent['LOAD']):>6} "
            f"{r['host_actions']:>4} {r['blocks_from']:<12} {r['cycles']:>8} "
            f"{r['core_cycles']:>8} {r['us']:>8.2f} {r['model']}")


def _session_csv(r):
    out = dict(r)
    for op in SESSION_ENGINE_OPS:
        out[f"sent_{op.lower()}"] = r["sent"][op]
        out[f"engine_ok_{op.lower()}"] = r["engine_ok"][op]
    for g in r["groups"]:
        out[f"cycles_{g['op'].lower()}"] = g["cycles"]
    return out


def _fair_line(r):
    """Per QP: operations per cycle / the mean, latency mean and p99 (cycles)."""
    qps = "; ".join(f"QP{x['qp']} {x['completed']} ops {x['ratio_to_mean']:.3f} "
                    f"lat {x['latency_mean']}/{x['latency_p99']}" for x in r["per_qp"])
    return (f"  fairness: rate/mean {qps}; max deviation {100 * r['fairness_max_dev']:.1f}% "
            f"({'within' if r['fair'] else 'OUTSIDE'} +-{100 * FAIRNESS_GOAL:.0f}%) over "
            f"{r['window_cycles']} cycles" + ("" if r["common_window"] else
                                              " (no common window: whole run)"))


def format_table(res):
    """The figures as text (goodput rows, multi-QP rows, latency, sessions, resources)."""
    goodput = "goodput" in res.get("sections", SECTIONS)
    lines = [HEADER] if goodput or any(wr.get("series") for wr in res["widths"].values()) \
        else []
    for w, wr in res["widths"].items():
        for r in wr.get("series", []):
            lines.append(_row(dict(r, width=w)))
    if any(wr.get("multi") or wr.get("multi_failed") or wr.get("multi_skipped")
           for wr in res["widths"].values()):
        lines.append(f"goodput and fairness of {MULTI_QPS} QPs at once, each with "
                     f"{res.get('multi_depth', MULTI_DEPTH)} requests outstanding (latency: "
                     f"cycles from a request's last octet in "
                     f"to its COMPLETION's first octet out):")
        lines.append(MULTI_HEADER)
    for w, wr in res["widths"].items():
        for r in wr.get("multi", []):
            lines.append(_multi_row(dict(r, width=w)))
            lines.append(_fair_line(r))
        for f in wr.get("multi_skipped", []):
            lines.append(f"{label(w):<11} {f.get('op', '(all)'):<19} {f['size']:>8} "
                         f"{f['mtu']:>5} {MULTI_QPS:>3} not run: {f['why']}"
                         + (f"; {f['instead']} instead" if f.get("instead") else ""))
        for f in wr.get("multi_failed", []):
            lines.append(f"{label(w):<11} {f['op']:<19} {f['size']:>8} {f['mtu']:>5} "
                         f"{f['n_qp']:>3} FAILED: no completion; MAC counters {f['mac']}")
    for w, wr in res["widths"].items():
        for f in wr.get("skipped", []):
            lines.append(f"{label(w):<11} {'(all)':<19} {f['size']:>8} {f['mtu']:>5} not run: "
                         f"{f['why']}")
        for f in wr.get("failed", []):
            lines.append(f"{label(w):<11} {f['op']:<19} {f['size']:>8} {f['mtu']:>5} FAILED: "
                         f"no completion; MAC counters {f['mac']}")
        rt = [x for x in wr.get("retransmits", []) if x["target"] or x["peer"]]
        lines.append(f"{label(w)}: retransmissions (target, peer) "
                     + (", ".join(f"size {x['size']} MTU {x.get('mtu', 1024)}: "
                                  f"{x['target']}, {x['peer']}" for x in rt) or "none")
                     + f"; wall time {wr.get('wall_s')} s")
    for w, wr in res["widths"].items():
        lat = wr.get("latency") or {}
        ck = wr.get("clocks") or clocks_of(w)
        if lat:
            lines.append(f"latency, 64 octets, MTU 1024, {label(w)} (counts of "
                         f"{1e9 / ck['gmii_hz']:g} ns, core {ck['core_hz'] / 1e6:.2f} MHz); ARP "
                         f"turnaround "
                         f"{wr.get('arp_turnaround')} cycles:")
            lines.append(f"  {'op':<19} {'last->resp':>10} {'ns':>8} {'first->resp':>11} "
                         f"{'ack':>6} {'engine':>7} {'ns':>7} {'4QP mean':>9} {'ns':>8} "
                         f"{'4QP p99 ns':>10} {'4QP max':>8}")
        for op, d in lat.items():
            ns = d["ns"]
            lines.append(
                f"  {op:<19} {d['alone_from_last']['median']:>10} "
                f"{ns['alone_from_last_median']:>8} "
                f"{d['alone_from_first']['median']:>11} "
                f"{d['alone_ack_from_last']['median']:>6} "
                f"{d['engine_notify_to_wr']['median']:>7} {ns['engine_notify_to_wr_median']:>7} "
                f"{d['contention_from_last']['mean']:>9} {ns['contention_from_last_mean']:>8} "
                f"{ns['contention_from_last_p99']:>10} {d['contention_from_last']['max']:>8}")
        for op, d in wr.get("latency_slopes", {}).items():
            lines.append(f"  {op} alone latency vs data length: "
                         + ", ".join(f"{p['length']} octets {p['from_last']} cycles"
                                     for p in d["points"])
                         + f" ({d['cycles_per_octet']} cycles/octet)")
    if any(wr.get("sessions") for wr in res["widths"].values()):
        lines.append(f"sessions: the same mix from a plain, an ADDR_LE and a DIRECT_ALLOC "
                     f"session, each on a fresh target configured for it ({SESSION_OPS} "
                     f"ALLOC_STORE inline, {SESSION_OPS} STORE inline, {SESSION_OPS} LOAD, "
                     f"{SESSION_OPS} ALLOC_STORE by READ, {SESSION_SIZE} octets, MTU 1024); "
                     f"engine OK counts / operations sent, messages the host driver handled "
                     f"during the mix, cycles of the four groups (core cycles, us at the "
                     f"configuration's clocks); answers against the golden model:")
        lines.append(SESSION_HEADER)
    for w, wr in res["widths"].items():
        for r in wr.get("sessions", []):
            lines.append(_session_row(r))
    rs = res.get("resources")
    if isinstance(rs, dict):
        for board, r in rs.items():
            lines.append(f"resources {board} (core {r['core']}, {r['device']}, stage "
                         f"{r['stage']}): "
                         + ", ".join(f"{k} {v}" for k, v in r["resources"].items())
                         + "; Fmax " + ", ".join(
                             f"{d} {c['achieved_mhz']} MHz (constraint {c['constraint_mhz']})"
                             for d, c in r["clocks"].items())
                         + f"; routed {r['routed']}; timing met {r['timing_met']}; "
                           f"bitstream {r['bitstream']}; "
                           f"build {r['build_time_s']} s; from {r.get('source')}")
    else:
        lines.append(f"resources: {rs}")
    return "\n".join(lines)


def write_results(res, out):
    """``bench.json`` (everything), ``bench.csv`` (one row per goodput series),
    ``bench_multi.csv`` (one row per multi-QP series) and ``bench_sessions.csv`` (one row per
    session kind and configuration); returns the first two paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(res, indent=1, default=str))
    with open(out / "bench.csv", "w", newline="") as fh:
        wtr = csv.DictWriter(fh, CSV_FIELDS, extrasaction="ignore")
        wtr.writeheader()
        for w, wr in res["widths"].items():
            for r in wr.get("series", []):
                wtr.writerow(dict(r, config=label(w)))
    with open(out / "bench_multi.csv", "w", newline="") as fh:
        wtr = csv.DictWriter(fh, MULTI_CSV_FIELDS, extrasaction="ignore")
        wtr.writeheader()
        for w, wr in res["widths"].items():
            for r in wr.get("multi", []):
                wtr.writerow(dict(r, config=label(w), qp_ratio_to_mean=";".join(
                    str(x["ratio_to_mean"]) for x in r["per_qp"])))
    with open(out / "bench_sessions.csv", "w", newline="") as fh:
        wtr = csv.DictWriter(fh, SESSION_CSV_FIELDS, extrasaction="ignore")
        wtr.writeheader()
        for w, wr in res["widths"].items():
            for r in wr.get("sessions", []):
                wtr.writerow(_session_csv(r))
    return out / "bench.json", out / "bench.csv"


def plot(res, out):
    """One PNG per width: fraction of theoretical goodput against block size, per op/MTU."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    paths = []
    for w, wr in res["widths"].items():
        if not wr.get("series"):
            continue
        fig, ax = plt.subplots(figsize=(8, 5))
        keys = sorted({(r["op"], r["mtu"]) for r in wr["series"]})
        for op, mtu in keys:
            rs = sorted((r for r in wr["series"] if (r["op"], r["mtu"]) == (op, mtu)),
                        key=lambda r: r["size"])
            ax.plot([r["size"] for r in rs], [r["frac_theory"] for r in rs], marker="o",
                    linestyle="-" if mtu == 1024 else "--", label=f"{op} MTU {mtu}")
        ax.axhline(0.97, color="grey", linewidth=0.8, linestyle=":")
        ax.set_xscale("log", base=2)
        ax.set_ylim(0, 1.05)
        ax.set_xlabel("block size (octets)")
        ax.set_ylabel("goodput / theoretical RoCEv2 goodput")
        ax.set_title(f"KBTP target, {label(w)}, GMII 1 Gb/s (cycle-exact, wire time)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
        p = Path(out) / f"goodput_{label(w)}.png"
        fig.tight_layout()
        fig.savefig(p, dpi=100)
        plt.close(fig)
        paths.append(p)
    return paths


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m tools.bench", description=__doc__.split("\n")[0])
    ap.add_argument("--configs", "--widths", dest="widths", default=",".join(CONFIGS),
                    help="ecpix5 (the board's core, DDR3), ecpix5-bram (its memory block RAM), "
                         "8 / 64 (the one-clock unit target), "
                         "10g (width 64 behind XGMII at 156.25 MHz)")
    ap.add_argument("--quick", action="store_true", help="two sizes, fewer operations")
    ap.add_argument("--sizes", default=None, help="comma-separated block sizes (octets)")
    ap.add_argument("--out", default="build/bench")
    ap.add_argument("--mtus", default="1024,4096")
    ap.add_argument("--jobs", type=int, default=1, help="configurations run at once")
    ap.add_argument("--depth", type=int, default=DEPTH,
                    help="requests one initiator keeps outstanding (within its credits)")
    ap.add_argument("--multi-depth", type=int, default=MULTI_DEPTH,
                    help="requests each initiator of the multi-QP series keeps outstanding")
    ap.add_argument("--sections", default=",".join(SECTIONS),
                    help="the sections to run, comma-separated: " + ", ".join(SECTIONS))
    a = ap.parse_args(argv)
    sections = [x for x in a.sections.split(",") if x]
    bad = set(sections) - set(SECTIONS)
    if bad:
        ap.error(f"unknown sections {', '.join(sorted(bad))} (of {', '.join(SECTIONS)})")
    widths = [x for x in a.widths.split(",") if x]
    sizes = [int(x) for x in a.sizes.split(",")] if a.sizes else None
    if "goodput" in sections:
        print(HEADER, flush=True)
    mtus = [int(x) for x in a.mtus.split(",") if x]
    res = run_bench(widths, a.quick, log=lambda s: print(s, flush=True), sizes=sizes,
                    mtus=mtus, jobs=a.jobs, depth=a.depth, multi_depth=a.multi_depth,
                    sections=sections)
    j, c = write_results(res, a.out)
    pngs = plot(res, a.out)
    print()
    print(format_table(res))
    print(f"\nwritten {j}, {c}, {c.with_name('bench_multi.csv')}, "
          f"{c.with_name('bench_sessions.csv')}"
          + "".join(f", {p}" for p in pngs))
    return 0


if __name__ == "__main__":
    sys.exit(main())

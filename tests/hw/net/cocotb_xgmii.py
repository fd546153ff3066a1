# Ref: IEEE 802.3 §3.1.1, §4.2.3.3, §4.4.2, clause 46 (XGMII, §46.3.1.4 DIC); hw/net/xgmii.py;
#      sim/hdl.py; cocotbext-eth XgmiiSource/XgmiiSink (the PHY-side oracle), scapy (frame
#      bytes); tests/hw/net/cocotb_mac.py (the GMII bench this one follows).
"""cocotb bench for :class:`hw.net.xgmii.XgmiiMac` in loopback (run by
tests/hw/net/test_xgmii_cocotb.py).

DUT: :class:`XgmiiLoopTop` = XgmiiMac whose received stream goes, through a small FIFO,
straight back into its transmit stream. Gates driven by LFSRs inside the top throttle that
internal stream: one holds ``rx.ready`` low (back-pressure on the receiver) and one holds
``tx.valid`` low (idles on the transmitter), each with probability ``level / 256`` per cycle;
``hold`` stops it altogether (frames then queue in the receive buffer).

cocotbext-eth's XgmiiSource (deficit idle count on, its default) sends frames built by scapy
(with its own zlib FCS) into the MAC's XGMII receive side; XgmiiSink records the XGMII
transmit side; every good frame must come back byte for byte (padded to 60 octets, with a
correct FCS), every bad one must be dropped and counted.
"""

import json
import random
from pathlib import Path

from amaranth import *
from amaranth.lib import fifo, wiring
from amaranth.lib.wiring import In, Out

from hw.net.xgmii import XgmiiMac
from hw.lib.stream import packet_layout

COUNTERS = ["rx_frames_ok", "rx_fcs_errors", "rx_runts", "rx_errors", "rx_overflows",
            "tx_frames", "tx_underruns"]
PERIOD_NS = 6.4              # 156.25 MHz
WIDTH = 64


class XgmiiLoopTop(wiring.Component):
    """XgmiiMac with its user streams looped through a gated 4-entry FIFO.

    Ports
    -----
    xgmii_rxd, xgmii_rxc : In; xgmii_txd, xgmii_txc : Out
        XGMII of the MAC.
    bp_level, idle_level : In(8)
        Probability x 256 of stalling ``rx.ready`` / ``tx.valid`` on a cycle.
    hold : In(1)
        Stall ``rx.ready`` on every cycle.
    <MAC counters>, bp_cycles, idle_cycles, int_beats, cycles : Out(32); rx_backlog : Out(1)
        The MAC's counters; cycles where the gates actually stalled a waiting transfer; beats
        moved on the internal stream; clock cycles since reset; the MAC's backlog flag.
    """

    def __init__(self, rx_depth=32768, tx_depth=8192):
        self._rx_depth, self._tx_depth = rx_depth, tx_depth
        ports = {"xgmii_rxd": In(64), "xgmii_rxc": In(8),
                 "xgmii_txd": Out(64), "xgmii_txc": Out(8),
                 "bp_level": In(8), "idle_level": In(8), "hold": In(1), "rx_backlog": Out(1)}
        ports.update({name: Out(32) for name in
                      COUNTERS + ["bp_cycles", "idle_cycles", "int_beats", "cycles"]})
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        m.submodules.mac = mac = XgmiiMac(WIDTH, rx_depth=self._rx_depth,
                                          tx_depth=self._tx_depth)
        layout = packet_layout(WIDTH)
        m.submodules.buf = buf = fifo.SyncFIFOBuffered(width=layout.size, depth=4)

        m.d.comb += [mac.xgmii_rxd.eq(self.xgmii_rxd), mac.xgmii_rxc.eq(self.xgmii_rxc),
                     self.xgmii_txd.eq(mac.xgmii_txd), self.xgmii_txc.eq(mac.xgmii_txc),
                     self.rx_backlog.eq(mac.rx_backlog)]
        m.d.comb += [getattr(self, name).eq(getattr(mac, name)) for name in COUNTERS]

        # Two Galois LFSRs (x^16 + x^14 + x^13 + x^11 + 1), different seeds, one per gate.
        def lfsr(seed, name):
            s = Signal(16, init=seed, name=name)
            m.d.sync += s.eq(Mux(s[0], (s >> 1) ^ 0xB400, s >> 1))
            return s
        l_bp, l_idle = lfsr(0xACE1, "lfsr_bp"), lfsr(0x1D2F, "lfsr_idle")
        stall_rx = Signal()
        stall_tx = Signal()
        m.d.comb += [stall_rx.eq((l_bp[:8] < self.bp_level) | self.hold),
                     stall_tx.eq(l_idle[8:] < self.idle_level)]

        m.d.comb += [
            buf.w_data.eq(mac.rx.payload.as_value()),
            buf.w_en.eq(mac.rx.valid & ~stall_rx),
            mac.rx.ready.eq(buf.w_rdy & ~stall_rx),
            mac.tx.payload.eq(buf.r_data),
            mac.tx.valid.eq(buf.r_rdy & ~stall_tx),
            buf.r_en.eq(mac.tx.ready & ~stall_tx),
        ]
        m.d.sync += self.cycles.eq(self.cycles + 1)
        with m.If(mac.rx.valid & buf.w_rdy & stall_rx & ~self.hold):
            m.d.sync += self.bp_cycles.eq(self.bp_cycles + 1)
        with m.If(buf.r_rdy & mac.tx.ready & stall_tx):
            m.d.sync += self.idle_cycles.eq(self.idle_cycles + 1)
        with m.If(mac.rx.valid & mac.rx.ready):
            m.d.sync += self.int_beats.eq(self.int_beats + 1)
        return m


# ---------------------------------------------------------------------------------------------
# cocotb side (imported only inside the simulator)
# ---------------------------------------------------------------------------------------------

try:
    import cocotb
    from cocotb.clock import Clock
    from cocotb.triggers import ClockCycles, RisingEdge, with_timeout
except ImportError:                                # pragma: no cover
    cocotb = None

if cocotb is not None:
    from cocotbext.eth import XgmiiFrame, XgmiiSink, XgmiiSource

    from sim.hdl import get_params
    from tests.hw.net.frames import random_frame

    from hw.net.xgmii import ERROR as ERROR_CHAR, START as START_CHAR, TERMINATE as TERM_CHAR

    class TB:
        def __init__(self, dut, salt=""):
            self.dut = dut
            self.params = get_params()
            self.rng = random.Random(f"{self.params.get('seed', 1)}/xgmii/{salt}")
            dut.rst.value = 1          # defined before the first edge (Icarus starts at X)
            cocotb.start_soon(Clock(dut.clk, PERIOD_NS, unit="ns").start())
            self.source = XgmiiSource(dut.xgmii_rxd, dut.xgmii_rxc, dut.clk, dut.rst)
            self.sink = XgmiiSink(dut.xgmii_txd, dut.xgmii_txc, dut.clk, dut.rst)
            assert self.source.enable_dic and self.source.ifg == 12
            dut.bp_level.value = 0
            dut.idle_level.value = 0
            dut.hold.value = 0

        async def reset(self):
            self.dut.rst.value = 1
            await ClockCycles(self.dut.clk, 4)
            self.dut.rst.value = 0
            await ClockCycles(self.dut.clk, 4)

        def set_gates(self, idle, backpressure):
            self.dut.idle_level.value = min(255, int(idle * 256))
            self.dut.bp_level.value = min(255, int(backpressure * 256))

        def counters(self):
            return {name: int(getattr(self.dut, name).value) for name in
                    COUNTERS + ["bp_cycles", "idle_cycles", "int_beats", "cycles"]}

        async def expect(self, payload):
            try:
                frame = await with_timeout(self.sink.recv(), 200, "us")
            except Exception:
                self.dut._log.error("no frame of %d octets; counters %s", len(payload),
                                    self.counters())
                raise
            assert frame.ctrl is None, f"control characters inside a frame: {frame}"
            assert frame.start_lane in (0, 4), frame.start_lane
            # XgmiiSink reads /S/ back as a preamble octet: 7 x 0x55 + SFD.
            assert bytes(frame.get_preamble()) == bytes([0x55] * 7 + [0xD5])
            assert frame.check_fcs(), "bad FCS on the transmitted frame"
            want = payload + bytes(max(0, 60 - len(payload)))
            got = bytes(frame.get_payload())
            assert got == want, f"frame of {len(payload)}: got {len(got)} octets, differs"
            return frame

    def frame_plan(rng, count):
        """(kind, payload, XgmiiFrame) tuples: good frames of 14..1518 octets, bad ones mixed
        in (bad FCS, only the FCS's last octet wrong, runts, /E/ inside)."""
        sizes = [14, 15, 41, 42, 59, 60, 61, 62, 63, 64, 65, 66, 67, 1514, 1517, 1518]
        plan = []
        for i in range(count):
            kind = rng.choice(["good"] * 6 + ["fcs", "fcs_last", "runt", "rx_er"])
            if kind == "runt":
                payload = random_frame(rng, rng.randint(14, 59))
                frame = XgmiiFrame.from_payload(payload, min_len=0)   # good FCS, < 64 octets
            else:
                n = sizes[i] if i < len(sizes) else rng.choice(
                    [rng.randint(14, 128), rng.randint(14, 1518)])
                payload = random_frame(rng, n)
                frame = XgmiiFrame.from_payload(payload)
                if kind == "fcs":
                    # Corrupt one bit after the FCS was computed (preamble/SFD left intact).
                    k = rng.randrange(8, len(frame.data))
                    frame.data[k] ^= 1 << rng.randrange(8)
                    assert not frame.check_fcs()
                elif kind == "fcs_last":
                    frame.data[-1] ^= 1 << rng.randrange(8)
                    kind = "fcs"
                elif kind == "rx_er":
                    frame.normalize()
                    k = rng.randrange(8, len(frame.data))
                    frame.data[k] = ERROR_CHAR
                    frame.ctrl[k] = 1
            plan.append((kind, payload, frame))
        return plan

    async def run_test(dut, idle=0.0, backpressure=0.0, count=48):
        tb = TB(dut, salt=f"{idle}/{backpressure}")
        await tb.reset()
        tb.set_gates(idle, backpressure)
        plan = frame_plan(tb.rng, count)
        # With the internal stream throttled the loop is slower than the wire, so keep at
        # most ~16 KiB in flight (the receive buffer holds 32 KiB); without throttling
        # everything goes back to back.
        limit = 16384 if (idle or backpressure) else 1 << 30
        pending, in_flight = [], 0
        for kind, payload, frame in plan:
            if pending and in_flight + len(frame) > limit:
                for p in pending:
                    await tb.expect(p)
                pending, in_flight = [], 0
            await tb.source.send(frame)
            in_flight += len(frame)
            if kind == "good":
                pending.append(payload)
        for p in pending:
            await tb.expect(p)
        await tb.source.wait()
        await ClockCycles(dut.clk, 2000)
        assert tb.sink.empty(), "unexpected extra frame"
        c = tb.counters()
        kinds = [k for k, _, _ in plan]
        dut._log.info("idle %.2f bp %.2f: %s", idle, backpressure, c)
        assert c["rx_frames_ok"] == kinds.count("good")
        assert c["tx_frames"] == kinds.count("good")
        assert c["rx_fcs_errors"] == kinds.count("fcs")
        assert c["rx_runts"] == kinds.count("runt")
        assert c["rx_errors"] == kinds.count("rx_er")
        assert c["rx_overflows"] == 0 and c["tx_underruns"] == 0
        # The gates really did throttle the stream when asked to (and only then).
        assert (c["bp_cycles"] > 0) == (backpressure > 0)
        assert (c["idle_cycles"] > 0) == (idle > 0)

    @cocotb.test()
    async def test_loop_plain(dut):
        await run_test(dut)

    @cocotb.test()
    async def test_loop_idles(dut):
        await run_test(dut, idle=0.4)

    @cocotb.test()
    async def test_loop_backpressure(dut):
        await run_test(dut, backpressure=0.4)

    @cocotb.test()
    async def test_loop_idles_backpressure(dut):
        await run_test(dut, idle=0.5, backpressure=0.5)

    class WireMonitor:
        """Octet positions (8 x cycles since it started + lane) of every /S/ and /T/ on an
        XGMII: the models' own frame times take a stale clock period after an idle word."""

        def __init__(self, clk, data, ctrl):
            self.clk, self.data, self.ctrl = clk, data, ctrl
            self.starts, self.ends = [], []
            cocotb.start_soon(self._run())

        async def _run(self):
            cycle = 0
            while True:
                await RisingEdge(self.clk)
                c = int(self.ctrl.value)
                if c:
                    d = int(self.data.value)
                    for lane in range(8):
                        if (c >> lane) & 1:
                            o = (d >> (8 * lane)) & 0xFF
                            if o == START_CHAR:
                                self.starts.append(8 * cycle + lane)
                            elif o == TERM_CHAR:
                                self.ends.append(8 * cycle + lane)
                cycle += 1

        def clear(self):
            self.starts.clear()
            self.ends.clear()

    def span_octets(starts):
        return starts[-1] - starts[0]

    @cocotb.test()
    async def test_throughput(dut):
        """Frames of one length back to back from XgmiiSource (DIC on): the MAC receives every
        one at the source's line rate and sends each back as soon as it is whole ("paced");
        then frames queued in the receive buffer (``hold``) go out at the MAC's own line rate
        ("queued"). Both must be (L + 8 + 12) / 8 cycles per frame of L octets with FCS."""
        tb = TB(dut)
        await tb.reset()
        wire_in = WireMonitor(dut.clk, dut.xgmii_rxd, dut.xgmii_rxc)
        wire_out = WireMonitor(dut.clk, dut.xgmii_txd, dut.xgmii_txc)
        results = []
        for length in (60, 61, 63, 100, 1514):        # without FCS: 64, 65, 67, 104, 1518
            n = 24 if length < 1000 else 16           # the queued ones fit the 32 KiB buffer
            frame_len = length + 4
            per_frame = frame_len + 8 + 12            # octets
            payloads = [random_frame(tb.rng, length) for _ in range(n)]
            c0 = tb.counters()
            wire_in.clear()
            wire_out.clear()
            for p in payloads:
                tb.source.send_nowait(XgmiiFrame.from_payload(p))
            for p in payloads:
                await tb.expect(p)
            await tb.source.wait()
            c1 = tb.counters()
            assert c1["rx_frames_ok"] - c0["rx_frames_ok"] == n
            assert c1["rx_overflows"] == 0
            src, paced = list(wire_in.starts), list(wire_out.starts)
            assert len(src) == len(paced) == n

            # Queued: hold the internal stream until every frame is in the receive buffer.
            dut.hold.value = 1
            payloads = [random_frame(tb.rng, length) for _ in range(n)]
            for p in payloads:
                tb.source.send_nowait(XgmiiFrame.from_payload(p))
            await tb.source.wait()
            for _ in range(2000):
                if int(dut.rx_frames_ok.value) - c1["rx_frames_ok"] == n:
                    break
                await RisingEdge(dut.clk)
            assert int(dut.rx_frames_ok.value) - c1["rx_frames_ok"] == n, tb.counters()
            assert int(dut.rx_overflows.value) == 0
            wire_out.clear()
            dut.hold.value = 0
            for p in payloads:
                await tb.expect(p)
            assert tb.sink.empty()
            starts, ends = list(wire_out.starts), list(wire_out.ends)
            assert len(starts) == len(ends) == n
            gaps = [s - e for e, s in zip(ends, starts[1:])]
            r = {"frame_octets": frame_len, "frames": n, "theoretical": per_frame / 8,
                 "source": span_octets(src) / (n - 1) / 8,
                 "paced": span_octets(paced) / (n - 1) / 8,
                 "queued": span_octets(starts) / (n - 1) / 8,
                 "spans_octets": [span_octets(src), span_octets(paced), span_octets(starts)],
                 "theoretical_span_octets": per_frame * (n - 1),
                 "queued_gap_min": min(gaps), "queued_gap_max": max(gaps),
                 "queued_start_lanes": sorted({x % 8 for x in starts})}
            dut._log.info("throughput: %s", r)
            results.append(r)
        Path("throughput.json").write_text(json.dumps(results))
        for r in results:
            want = r["theoretical_span_octets"]
            src, paced, queued = r["spans_octets"]
            # The deficit idle count leaves at most 3 octets over a run of frames.
            assert abs(src - want) <= 3, r
            assert abs(queued - want) <= 3, r
            # Sent back as each frame is whole: the source's pace, up to where in a word the
            # transmitter can start (one word).
            assert abs(paced - want) <= 8, r
            # Gap from /T/ to /S/ (/T/ counted): 9..15 octets.
            assert 9 <= r["queued_gap_min"] and r["queued_gap_max"] <= 15, r

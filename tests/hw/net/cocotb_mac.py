# Ref: IEEE 802.3 §3.1.1, §4.2.3.3, §4.4.2, §35.2 (GMII); hw/net/mac.py; sim/hdl.py;
#      cocotbext-eth GmiiSource/GmiiSink (the PHY-side oracle), scapy (frame bytes).
"""cocotb bench for :class:`hw.net.mac.GmiiMac` in loopback (run by tests/hw/net/test_mac_cocotb.py).

DUT: :class:`MacLoopTop` = GmiiMac(width) whose received stream goes, through a small FIFO,
straight back into its transmit stream. Two gates, driven by LFSRs inside the top, throttle
that internal stream: one holds ``rx.ready`` low (back-pressure on the receiver) and one holds
``tx.valid`` low (idles on the transmitter), each with probability ``level / 256`` per cycle.

cocotbext-eth's GmiiSource sends frames built by scapy (with its own zlib FCS) into the MAC's
GMII receive side; GmiiSink records the GMII transmit side; every good frame must come back
byte for byte (padded to 60 octets, with a correct FCS), every bad one must be dropped and
counted.
"""

import json
import random
from pathlib import Path

from amaranth import *
from amaranth.lib import fifo, wiring
from amaranth.lib.wiring import In, Out

from hw.net.mac import GmiiMac
from hw.lib.stream import packet_layout

COUNTERS = ["rx_frames_ok", "rx_fcs_errors", "rx_runts", "rx_errors", "rx_overflows",
            "tx_frames", "tx_underruns"]
PERIOD_NS = 8


class MacLoopTop(wiring.Component):
    """GmiiMac(width) with its user streams looped through a gated 4-entry FIFO.

    Ports
    -----
    rxd, rx_dv, rx_er : In; txd, tx_en, tx_er : Out
        GMII of the MAC.
    bp_level, idle_level : In(8)
        Probability x 256 of stalling ``rx.ready`` / ``tx.valid`` on a cycle.
    <MAC counters>, bp_cycles, idle_cycles, int_beats, cycles : Out(32)
        The MAC's counters; cycles where the gates actually stalled a waiting transfer; beats
        moved on the internal stream; clock cycles since reset.
    """

    def __init__(self, width):
        self._width = width
        ports = {"rxd": In(8), "rx_dv": In(1), "rx_er": In(1),
                 "txd": Out(8), "tx_en": Out(1), "tx_er": Out(1),
                 "bp_level": In(8), "idle_level": In(8)}
        ports.update({name: Out(32) for name in
                      COUNTERS + ["bp_cycles", "idle_cycles", "int_beats", "cycles"]})
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        m.submodules.mac = mac = GmiiMac(self._width)
        layout = packet_layout(self._width)
        m.submodules.buf = buf = fifo.SyncFIFOBuffered(width=layout.size, depth=4)

        m.d.comb += [mac.rxd.eq(self.rxd), mac.rx_dv.eq(self.rx_dv), mac.rx_er.eq(self.rx_er),
                     self.txd.eq(mac.txd), self.tx_en.eq(mac.tx_en), self.tx_er.eq(mac.tx_er)]
        m.d.comb += [getattr(self, name).eq(getattr(mac, name)) for name in COUNTERS]

        # Two Galois LFSRs (x^16 + x^14 + x^13 + x^11 + 1), different seeds, one per gate.
        def lfsr(seed, name):
            s = Signal(16, init=seed, name=name)
            m.d.sync += s.eq(Mux(s[0], (s >> 1) ^ 0xB400, s >> 1))
            return s
        l_bp, l_idle = lfsr(0xACE1, "lfsr_bp"), lfsr(0x1D2F, "lfsr_idle")
        stall_rx = Signal()
        stall_tx = Signal()
        m.d.comb += [stall_rx.eq(l_bp[:8] < self.bp_level),
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
        with m.If(mac.rx.valid & buf.w_rdy & stall_rx):
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
    from cocotbext.eth import GmiiFrame, GmiiSink, GmiiSource

    from sim.hdl import get_params
    from tests.hw.net.frames import random_frame

    class TB:
        def __init__(self, dut, salt=""):
            self.dut = dut
            self.params = get_params()
            self.width = int(self.params["width"])
            # A different frame plan for every width and test variant, reproducible.
            self.rng = random.Random(f"{self.params.get('seed', 1)}/{self.width}/{salt}")
            dut.rst.value = 1          # defined before the first edge (Icarus starts at X)
            cocotb.start_soon(Clock(dut.clk, PERIOD_NS, unit="ns").start())
            self.source = GmiiSource(dut.rxd, dut.rx_er, dut.rx_dv, dut.clk, dut.rst)
            self.sink = GmiiSink(dut.txd, dut.tx_er, dut.tx_en, dut.clk, dut.rst)
            dut.bp_level.value = 0
            dut.idle_level.value = 0

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
            assert frame.error is None, f"tx_er on a frame: {frame.error}"
            # GmiiSink starts a frame on the first rx_dv octet without storing that octet, so a
            # 7 x 0x55 + SFD preamble on the wire reads back as 6 x 0x55 + SFD.
            assert bytes(frame.get_preamble()) == bytes([0x55] * 6 + [0xD5])
            assert frame.check_fcs(), "bad FCS on the transmitted frame"
            want = payload + bytes(max(0, 60 - len(payload)))
            got = bytes(frame.get_payload())
            assert got == want, f"frame of {len(payload)}: got {len(got)} octets, differs"
            return frame

    def frame_plan(rng, count):
        """(kind, payload, GmiiFrame) tuples: good frames of 14..1518 octets, bad ones mixed in."""
        sizes = [14, 15, 41, 42, 59, 60, 61, 63, 64, 65, 1514, 1517, 1518]
        plan = []
        for i in range(count):
            kind = rng.choice(["good"] * 6 + ["fcs", "runt", "rx_er"])
            if kind == "runt":
                payload = random_frame(rng, rng.randint(14, 59))
                frame = GmiiFrame.from_payload(payload, min_len=0)   # good FCS, < 64 octets
            else:
                n = sizes[i] if i < len(sizes) else rng.choice(
                    [rng.randint(14, 128), rng.randint(14, 1518)])
                payload = random_frame(rng, n)
                frame = GmiiFrame.from_payload(payload)
                if kind == "fcs":
                    # Corrupt one bit after the FCS was computed (preamble/SFD left intact).
                    k = rng.randrange(8, len(frame.data))
                    frame.data[k] ^= 1 << rng.randrange(8)
                    assert not frame.check_fcs()
                elif kind == "rx_er":
                    frame.normalize()
                    frame.error[rng.randrange(8, len(frame.data))] = 1
            plan.append((kind, payload, frame))
        return plan

    async def run_test(dut, idle=0.0, backpressure=0.0, count=40):
        tb = TB(dut, salt=f"{idle}/{backpressure}")
        await tb.reset()
        tb.set_gates(idle, backpressure)
        plan = frame_plan(tb.rng, count)
        # With the internal stream throttled the loop is slower than the wire (at width 8), so
        # keep at most ~1600 octets in flight (the receive buffer holds 2 KiB); without
        # throttling everything goes back to back.
        limit = 1600 if (idle or backpressure) else 1 << 30
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
        await ClockCycles(dut.clk, 3000)
        assert tb.sink.empty(), "unexpected extra frame"
        c = tb.counters()
        kinds = [k for k, _, _ in plan]
        dut._log.info("width %d idle %.2f bp %.2f: %s", tb.width, idle, backpressure, c)
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

    @cocotb.test()
    async def test_throughput(dut):
        """A stream of 1500-octet frames (FCS included): cycles per octet vs the GMII bound."""
        tb = TB(dut)
        await tb.reset()
        n, frame_len = 16, 1500
        payloads = [random_frame(tb.rng, frame_len - 4) for _ in range(n)]
        for p in payloads:
            tb.source.send_nowait(GmiiFrame.from_payload(p))
        frames, marks = [], {}
        for i, p in enumerate(payloads):
            frames.append(await tb.expect(p))
            if i in (3, 13):
                # Same pipeline phase (a frame just left) ten frame periods apart: the internal
                # beats between the two samples are exactly ten frames' worth.
                marks[i] = tb.counters()
        c0, c1 = marks[3], marks[13]
        assert tb.sink.empty()
        # Steady state: start-to-start time of output frames after the first.
        span_cycles = (frames[-1].sim_time_start - frames[1].sim_time_start) / (
            PERIOD_NS * 1000)        # sim time in ps
        per_frame = span_cycles / (n - 2)
        measured = per_frame / frame_len
        theoretical = (frame_len + 20) / frame_len   # preamble+SFD 8, IFG 12
        gaps = [(b.sim_time_start - a.sim_time_end) / (PERIOD_NS * 1000)
                for a, b in zip(frames, frames[1:])]
        duty = (c1["int_beats"] - c0["int_beats"]) / (c1["cycles"] - c0["cycles"])
        result = {"width": tb.width, "frame_octets": frame_len, "cycles_per_frame": per_frame,
                  "cycles_per_octet": measured, "theoretical_cycles_per_octet": theoretical,
                  "min_gap_cycles": min(gaps), "internal_beats_per_cycle": duty,
                  "internal_octets_per_beat": tb.width // 8}
        dut._log.info("throughput: %s", result)
        Path("throughput.json").write_text(json.dumps(result))
        assert min(gaps) >= 12
        assert measured <= theoretical * 1.001, (measured, theoretical)

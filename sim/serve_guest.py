# Ref: brief e2e.md (issue 5); shared/notes/softroce-vm.md (9p share, guest runner)
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

from sim.serve import build_model_server

__all__ = ["make_share", "run_e2e", "E2eResult", "GUEST_SCRIPTS", "PROJECT"]

PROJECT = Path(__file__).resolve().parent.parent
GUEST_SCRIPTS = PROJECT / "tests" / "e2e"
_PROJECT_FILES = ("hw/__init__.py", "hw/headers.py", "host/__init__.py", "host/codec.py",
                  "host/initiator.py")
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
    """A guest run against the model server."""
    guest: object                        # sim.guest.run.GuestResult
    log: list = field(default_factory=list)
    frames: dict = field(default_factory=dict)
    glue: dict = field(default_factory=dict)
    ep_counters: dict = field(default_factory=dict)
    model: object = None
    wall_s: float = 0.0

    @property
    def output(self):
        return self.guest.output

    @property
    def exit_code(self):
        return self.guest.exit_code


def run_e2e(script, args=(), *, mtu=1500, drop=0.0, dup=0.0, corrupt=0.0, seed=1, pcap=None,
            timeout_s=300.0, cfg=None, echo=False, log_stream=None, share_dir=None):
    """Serve the model and run ``tests/e2e/<script>`` in the guest with ``args``.

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
    """
    from sim.guest.run import free_udp_port, run_guest

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
        quoted = " ".join("'" + str(a).replace("'", "'\\''") + "'" for a in args)
        wrapper = ("#!/bin/sh\n"
                   f"PYTHONPATH=/share/pylib exec python3 -u /share/e2e/{script} {quoted}\n")
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

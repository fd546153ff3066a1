# Ref: docs/softroce-vm.md (QEMU TCG, -netdev dgram, 9p share); qemu-system-x86_64(1)
"""Boot the soft-RoCE guest with one script and return its exit status and output.

The guest's only NIC is a virtio-net on QEMU's ``-netdev dgram``: every Ethernet frame the guest
sends is one UDP datagram from ``127.0.0.1:local_port`` to ``127.0.0.1:remote_port`` (no FCS), and
every datagram sent to ``127.0.0.1:local_port`` is delivered to the guest as one frame. Whatever
listens on ``remote_port`` (a cocotb testbench of the RTL, the golden model, a scapy peer) is the
RoCE target; it must answer the guest's ARP request for ``target_ip`` itself, since the guest adds
no static neighbour entry unless asked to (``static_neigh``, for debugging).

The script reaches the guest through a 9p share mounted at ``/share`` (its working directory) and
runs as root with ``rxe0`` on ``eth0`` already set up; the environment holds ``KBTP_GUEST_IP``,
``KBTP_TARGET_IP``, ``KBTP_GUEST_MAC``, ``KBTP_MTU``, ``KBTP_RDMA_DEV`` and ``KBTP_NETDEV``. A
``#!`` line picks its interpreter; otherwise ``*.py`` files run under ``python3 -u``, the rest
under ``sh``.

CLI: ``python -m sim.guest.run SCRIPT [--share DIR] [--remote-port N] ...``; exits with the script's
status.
"""

import argparse
import dataclasses
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from .build import MARK, GuestImage, default_dir, ensure_image

__all__ = [
    "GuestResult", "GuestError", "GuestTimeout", "run_guest", "qemu_command", "free_udp_port",
    "DEFAULT_MAC", "main",
]

DEFAULT_MAC = "02:00:0a:00:00:01"
QEMU = "qemu-system-x86_64"
_EXIT_RE = re.compile(re.escape(MARK) + r" EXIT (\d+)")
_BEGIN = MARK + " BEGIN"
_SETUP_FAILED = MARK + " SETUP-FAILED"
_MAC_RE = re.compile(r"^[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){5}$")


@dataclasses.dataclass
class GuestResult:
    """What one guest run produced.

    Attributes
    ----------
    exit_code : int
        The script's exit status.
    output : str
        The script's stdout and stderr as the guest console printed them (CR LF folded to LF).
    wall_s : float
        Wall time from starting QEMU to its exit.
    boot_s : float
        Wall time until the script started (boot, module loading, network and rxe set-up).
    console : str
        The whole console text (kernel, /init and script).
    log_path : Path
        Where the console was streamed.
    """

    exit_code: int
    output: str
    wall_s: float
    boot_s: float = 0.0
    console: str = ""
    log_path: Path | None = None


class GuestError(RuntimeError):
    """The guest did not run the script to its end (QEMU failed, /init set-up failed, crash)."""

    def __init__(self, msg, console="", log_path=None):
        tail = "\n".join(console.splitlines()[-40:])
        super().__init__(f"{msg} (console log: {log_path})\n--- console tail ---\n{tail}")
        self.console = console
        self.log_path = log_path


class GuestTimeout(GuestError):
    """The script did not finish within ``timeout_s``; QEMU was killed."""


def free_udp_port():
    """Return a UDP port on 127.0.0.1 that is free now (to run guests side by side)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def qemu_command(image, share_dir, *, local_port, remote_port, mac, cmdline, memory_mb=1024,
                 cpu="max"):
    """Return the QEMU argument list for one guest run (exposed for debugging by hand)."""
    net = ("dgram,id=n0,local.type=inet,local.host=127.0.0.1,local.port={},"
           "remote.type=inet,remote.host=127.0.0.1,remote.port={}").format(local_port, remote_port)
    return [
        QEMU,
        # The host's /dev/kvm is a nested PVM device a stock kernel cannot run on: emulate.
        "-accel", "tcg", "-cpu", cpu, "-smp", "1", "-m", str(memory_mb),
        "-nodefaults", "-no-user-config", "-no-reboot", "-display", "none",
        "-serial", "stdio",
        "-kernel", str(image.kernel), "-initrd", str(image.initrd), "-append", cmdline,
        "-netdev", net, "-device", f"virtio-net-pci,netdev=n0,mac={mac}",
        "-virtfs", f"local,path={share_dir},mount_tag=share,security_model=none",
    ]


def _place_script(script, share):
    """Put the script into the share; return (name inside the share, file to delete afterwards)."""
    path = None
    if isinstance(script, Path):
        path = script
    elif isinstance(script, str) and "\n" not in script and len(script) < 4096:
        if os.path.isfile(script):
            path = Path(script)
    if path is not None:
        try:
            return str(path.resolve().relative_to(share.resolve())), None
        except ValueError:
            # Read rather than copy: the script may be a pipe (/dev/stdin).
            dest = share / f".kbtp-run-{os.getpid()}-{path.name}"
            dest.write_bytes(path.read_bytes())
            return dest.name, dest
    if not isinstance(script, str):
        raise TypeError(f"script must be a path or the script's text, not {type(script).__name__}")
    suffix = "" if script.startswith("#!") else ".sh"
    dest = share / f".kbtp-run-{os.getpid()}-{threading.get_ident()}{suffix}"
    dest.write_text(script)
    return dest.name, dest


def _prune_logs(logs, keep=100):
    """Keep the newest ``keep`` console logs of the default log directory."""
    old = sorted(logs.glob("run-*.log"), key=lambda p: p.stat().st_mtime)[:-keep]
    for p in old:
        p.unlink(missing_ok=True)


def _check_cmdline_value(name, value):
    if not value or any(c.isspace() for c in value):
        raise ValueError(f"{name} must be a non-empty word without spaces: {value!r}")


def run_guest(script, *, share_dir=None, local_port=20001, remote_port=20002, guest_ip="10.0.0.1",
              target_ip="10.0.0.2", mac=DEFAULT_MAC, mtu=1500, prefix_len=24, timeout_s=240.0,
              static_neigh=None, image=None, log_path=None, echo=False, memory_mb=1024,
              cpu="max", kernel_args=()):
    """Boot the guest, run ``script`` in it, and return its status and output.

    Parameters
    ----------
    script : str or Path
        A path to the script, or its text (a ``#!`` line picks the interpreter, else ``sh``).
    share_dir : path-like, optional
        Host directory mounted at ``/share`` in the guest (the script's working directory). A
        temporary one is made and removed when omitted.
    local_port, remote_port : int
        QEMU's UDP port and the peer's UDP port, both on 127.0.0.1.
    guest_ip, target_ip : str
        The guest's IPv4 address and the target's (exported to the script as ``KBTP_TARGET_IP``).
    mac : str
        The guest's MAC address.
    mtu : int
        The guest's eth0 MTU (rxe's active MTU follows it: 1024 at 1500, 4096 at 9000).
    prefix_len : int
        The guest's IPv4 prefix length.
    timeout_s : float
        Wall-time limit of the whole run, boot included; QEMU is killed past it.
    static_neigh : str, optional
        The target's MAC: adds a permanent neighbour entry, so the guest sends no ARP (debugging).
    image : GuestImage or path-like, optional
        A built image; by default the cached one (built first if missing or stale).
    log_path : path-like, optional
        Where to stream the console; by default ``<cache>/logs/run-<time>-<pid>.log``.
    echo : bool
        Also copy the console to stderr as it arrives.
    memory_mb : int
        Guest RAM; the ~130 MB initramfs is unpacked into it.
    cpu : str
        QEMU CPU model (TCG).
    kernel_args : sequence of str
        Extra kernel command-line words (debugging: e.g. ``loglevel=7``).

    Returns
    -------
    GuestResult

    Raises
    ------
    GuestError
        QEMU failed to start, /init could not set up the guest, or the guest died before the end.
    GuestTimeout
        ``timeout_s`` passed first.
    """
    if shutil.which(QEMU) is None:
        raise GuestError(f"{QEMU} not found (apt-get install qemu-system-x86)")
    if image is None:
        image = ensure_image()
    elif not isinstance(image, GuestImage):
        image = GuestImage(image)
    if not _MAC_RE.match(mac):
        raise ValueError(f"bad MAC {mac!r}")
    if static_neigh is not None and not _MAC_RE.match(static_neigh):
        raise ValueError(f"bad static_neigh MAC {static_neigh!r}")
    for name, v in (("guest_ip", guest_ip), ("target_ip", target_ip)):
        _check_cmdline_value(name, v)

    tmp_share = None
    if share_dir is None:
        tmp_share = share = Path(tempfile.mkdtemp(prefix="kbtp-guest-share-"))
    else:
        share = Path(share_dir)
        share.mkdir(parents=True, exist_ok=True)
    name, cleanup = _place_script(script, share)
    _check_cmdline_value("script file name", name)

    if log_path is None:
        logs = default_dir() / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        _prune_logs(logs)
        log_path = logs / f"run-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{local_port}.log"
    log_path = Path(log_path)

    cmdline = " ".join([
        # panic=-1 with -no-reboot turns a guest panic into a prompt QEMU exit.
        "console=ttyS0", "quiet", "loglevel=3", "panic=-1", "rdinit=/init",
        # A throw-away test guest: CPU-bug mitigations only slow TCG down (~10% of the boot).
        "mitigations=off",
        f"kbtp.ip={guest_ip}", f"kbtp.prefix={int(prefix_len)}", f"kbtp.mac={mac}",
        f"kbtp.mtu={int(mtu)}", f"kbtp.target={target_ip}", f"kbtp.script={name}",
    ] + ([f"kbtp.neigh={static_neigh}"] if static_neigh else []) + list(kernel_args))
    cmd = qemu_command(image, share, local_port=local_port, remote_port=remote_port, mac=mac,
                       cmdline=cmdline, memory_mb=memory_mb, cpu=cpu)
    try:
        return _boot(cmd, log_path, timeout_s, echo)
    finally:
        if cleanup is not None:
            cleanup.unlink(missing_ok=True)
        if tmp_share is not None:
            shutil.rmtree(tmp_share, ignore_errors=True)


def _boot(cmd, log_path, timeout_s, echo):
    chunks = []
    begin_at = [None]
    done = threading.Event()
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        log.write(("# " + " ".join(cmd) + "\n").encode())
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT)

        def pump():
            # Reads the console as it comes so the log is live and the exit marker is seen early.
            seen = b""
            for line in iter(proc.stdout.readline, b""):
                log.write(line)
                log.flush()
                chunks.append(line)
                if echo:
                    sys.stderr.write(line.decode(errors="replace"))
                    sys.stderr.flush()
                seen = (seen + line)[-4096:]
                if begin_at[0] is None and _BEGIN.encode() in seen:
                    begin_at[0] = time.monotonic() - t0
                if _EXIT_RE.search(seen.decode(errors="replace")):
                    done.set()
            done.set()

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            timed_out = not done.wait(timeout_s)
            if timed_out:
                proc.kill()
            # After the marker /init powers off at once; give QEMU a moment, then insist.
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        finally:
            # Never leave a guest behind (Ctrl-C, an exception in a caller's thread).
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        reader.join(timeout=5)
        wall = time.monotonic() - t0
        log.write(f"\n# qemu exit {proc.returncode}, wall {wall:.2f} s\n".encode())

    console = b"".join(chunks).decode(errors="replace").replace("\r\n", "\n").replace("\r", "")
    exits = list(_EXIT_RE.finditer(console))
    if timed_out and not exits:
        raise GuestTimeout(f"guest did not finish within {timeout_s} s", console, log_path)
    if _SETUP_FAILED in console:
        what = console.split(_SETUP_FAILED, 1)[1].splitlines()[0].strip()
        raise GuestError(f"guest set-up failed: {what}", console, log_path)
    if not exits:
        raise GuestError(f"guest ended without an exit marker (qemu status {proc.returncode})",
                         console, log_path)
    begin = console.find(_BEGIN)
    if begin < 0:
        raise GuestError("exit marker without a begin marker", console, log_path)
    # The script's output starts after the marker's line ("... BEGIN uptime=<guest seconds>").
    nl = console.find("\n", begin)
    start = nl + 1 if 0 <= nl < exits[-1].start() else exits[-1].start()
    output = console[start:exits[-1].start()]
    return GuestResult(exit_code=int(exits[-1].group(1)), output=output, wall_s=wall,
                       boot_s=begin_at[0] or 0.0, console=console, log_path=log_path)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m sim.guest.run",
                                 description="Boot the soft-RoCE guest and run SCRIPT in it.")
    ap.add_argument("script", type=Path, help="script to run in the guest (#! line, *.py or sh)")
    ap.add_argument("--share", type=Path, default=None, help="host directory mounted at /share")
    ap.add_argument("--local-port", type=int, default=20001, help="QEMU's UDP port")
    ap.add_argument("--remote-port", type=int, default=20002, help="the target's UDP port")
    ap.add_argument("--guest-ip", default="10.0.0.1")
    ap.add_argument("--target-ip", default="10.0.0.2")
    ap.add_argument("--mac", default=DEFAULT_MAC)
    ap.add_argument("--mtu", type=int, default=1500)
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds, boot included")
    ap.add_argument("--static-neigh", metavar="MAC", default=None,
                    help="debugging: a permanent neighbour entry for the target (no ARP)")
    ap.add_argument("--log", type=Path, default=None, help="console log file")
    ap.add_argument("--quiet", action="store_true", help="do not echo the console")
    args = ap.parse_args(argv)
    try:
        r = run_guest(args.script, share_dir=args.share, local_port=args.local_port,
                      remote_port=args.remote_port, guest_ip=args.guest_ip,
                      target_ip=args.target_ip, mac=args.mac, mtu=args.mtu,
                      timeout_s=args.timeout, static_neigh=args.static_neigh, log_path=args.log,
                      echo=not args.quiet)
    except GuestError as e:
        print(f"[guest.run] {e}", file=sys.stderr)
        return 124 if isinstance(e, GuestTimeout) else 125
    if args.quiet:
        sys.stdout.write(r.output)
    print(f"[guest.run] exit {r.exit_code}, boot {r.boot_s:.1f} s, wall {r.wall_s:.1f} s, "
          f"log {r.log_path}", file=sys.stderr)
    return r.exit_code


if __name__ == "__main__":
    sys.exit(main())

# Ref: docs/softroce-vm.md (guest recipe); debootstrap(8); Linux x86 boot protocol (PVH)
"""Build the soft-RoCE test guest: a Debian kernel and a Debian userspace in one initramfs.

The image is two files in the cache directory:

- ``vmlinux``: Debian's generic ``linux-image-6.1.0-*-amd64`` kernel, decompressed, so QEMU boots it
  through the PVH entry point (about 3 s faster than the bzImage under TCG);
- ``initramfs.cpio``: an uncompressed newc cpio of a ``debootstrap --variant=minbase`` bookworm tree
  with rdma-core and pyverbs, only the kernel modules that rdma_rxe, virtio-net and 9p need, and an
  ``/init`` from ``init.sh.in``.

Everything comes from Debian's package servers through apt-get and debootstrap, so it builds as root
on a fresh Debian 12 machine. The result is cached: ``inputs.sha256`` holds a hash of everything
that decides the image (package list, module list, init template, this format's version), and a
build whose hash matches is skipped. The debootstrap tree is cached on its own (``rootfs.sha256``)
so that changing only the init template costs seconds.

Run ``python -m sim.guest.build [--out DIR] [--force]``.
"""

import argparse
import contextlib
import fcntl
import hashlib
import json
import lzma
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

__all__ = [
    "SUITE", "PACKAGES", "MODULES", "OPTIONAL_MODULES", "IMAGE_STRIP", "MARK", "GuestImage", "default_dir",
    "inputs_hash", "image_ready", "ensure_image", "build", "decompress_kernel", "main",
]

SUITE = "bookworm"
# Userspace: the RDMA stack and what /init uses (ip, rdma, modprobe); iputils-ping for the network
# test and debugging.
PACKAGES = (
    "rdma-core", "ibverbs-providers", "ibverbs-utils", "rdmacm-utils", "python3-pyverbs",
    "iproute2", "kmod", "iputils-ping",
)
# Modules /init loads, in order; their dependencies come along. rxe computes its ICRC through the
# kernel's "crc32" shash, which needs one of the crc32 providers.
MODULES = (
    "virtio_pci", "virtio_net", "9pnet_virtio", "9p", "crc32_generic",
    "rdma_rxe", "ib_uverbs", "rdma_ucm", "ib_umad",
)
# Loaded when the CPU allows (QEMU's "max" model has PCLMULQDQ; "qemu64" has not).
OPTIONAL_MODULES = ("crc32_pclmul",)
# Trees and files removed from the rootfs: documentation, translations, package caches, and
# udev's hardware database (20 MB; no udev runs in the guest), glibc's iconv modules (9 MB; Python
# has its own codecs). Every MB costs boot time: TCG unpacks the initramfs at ~7-15 MB/s.
STRIP = (
    "usr/share/doc", "usr/share/man", "usr/share/info", "usr/share/locale", "usr/share/lintian",
    "usr/share/linda", "usr/share/bash-completion", "var/cache/apt", "var/lib/apt/lists",
    "var/cache/debconf", "var/log", "usr/lib/udev/hwdb.d", "usr/lib/udev/hwdb.bin",
    "usr/lib/x86_64-linux-gnu/gconv",
)
# Removed from the image only (the cached rootfs keeps them): what nothing in the guest runs -
# perl (dpkg's helper), dpkg's database, time zones, pyverbs' mlx5 provider. ~20 MB less to unpack.
IMAGE_STRIP = (
    "usr/bin/perl", "usr/bin/perl5.36.0", "usr/lib/x86_64-linux-gnu/perl-base",
    "usr/lib/x86_64-linux-gnu/perl", "usr/share/perl5", "usr/share/perl", "var/lib/dpkg/info",
    "usr/share/zoneinfo", "usr/lib/python3/dist-packages/pyverbs/providers/mlx5",
)
# The marker /init prints around the script (run.py parses it).
MARK = "KBTP-GUEST:"
# Bump when the layout of the output or the build steps change in a way the lists above miss.
FORMAT = 2

HERE = Path(__file__).resolve().parent
INIT_TEMPLATE = HERE / "init.sh.in"
PROJECT = HERE.parent.parent
XZ_MAGIC = b"\xfd7zXZ\x00"


class GuestImage:
    """Paths of a built guest image.

    Parameters
    ----------
    out : Path
        The cache directory holding the image.
    """

    def __init__(self, out):
        self.out = Path(out)
        self.kernel = self.out / "vmlinux"
        self.initrd = self.out / "initramfs.cpio"
        self.manifest_path = self.out / "manifest.json"

    @property
    def manifest(self):
        """dict: what was built (kernel version, sizes, build time)."""
        return json.loads(self.manifest_path.read_text())

    def __repr__(self):
        return f"GuestImage({str(self.out)!r})"


def default_dir():
    """Return the cache directory: ``$KBTP_GUEST_DIR`` or ``<project>/build/guest``."""
    env = os.environ.get("KBTP_GUEST_DIR")
    return Path(env) if env else PROJECT / "build" / "guest"


def _sha(*parts):
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()


def _rootfs_hash():
    return _sha(f"format={FORMAT}", SUITE, *sorted(PACKAGES), "strip", *STRIP)


def inputs_hash():
    """Hash of everything that decides the image; a cached image with another hash is rebuilt."""
    return _sha(_rootfs_hash(), "modules", *MODULES, "optional", *OPTIONAL_MODULES, "mark", MARK,
                "image-strip", *IMAGE_STRIP, INIT_TEMPLATE.read_bytes())


def image_ready(out=None):
    """True when ``out`` holds a complete image built from the current inputs."""
    out = Path(out) if out else default_dir()
    img = GuestImage(out)
    stamp = out / "inputs.sha256"
    return (stamp.is_file() and stamp.read_text().strip() == inputs_hash()
            and img.kernel.is_file() and img.initrd.is_file())


def _log(msg):
    print(f"[guest.build] {msg}", file=sys.stderr, flush=True)


def _run(cmd, **kw):
    """Run a command, echoing it; raise with its output's tail when it fails."""
    _log("$ " + " ".join(str(c) for c in cmd))
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if r.returncode != 0:
        tail = (r.stdout + r.stderr)[-3000:]
        raise RuntimeError(f"{cmd[0]} failed ({r.returncode}):\n{tail}")
    return r.stdout


def _need_root_tools():
    if os.geteuid() != 0:
        raise RuntimeError("building the guest needs root (debootstrap, chroot, device nodes)")
    missing = [t for t in ("debootstrap", "apt-get", "apt-cache", "dpkg-deb", "cpio", "chroot")
               if shutil.which(t) is None]
    if missing:
        raise RuntimeError("missing tools: " + ", ".join(missing)
                           + " (apt-get install debootstrap cpio; see Makefile APT_PKGS)")


def _kernel_package():
    """Name of the linux-image-6.1.0-N-amd64 package that bookworm serves now.

    The metapackage linux-image-amd64 depends on exactly one ABI-versioned image; apt's lists may
    be missing on a fresh machine, so update once when the lookup finds nothing.
    """
    for attempt in range(2):
        r = subprocess.run(["apt-cache", "depends", "--no-recommends", "--no-suggests",
                            "linux-image-amd64"], capture_output=True, text=True)
        m = re.search(r"Depends:\s*(linux-image-6\.1\.0-\d+-amd64)\b", r.stdout)
        if m:
            return m.group(1)
        if attempt == 0:
            _run(["apt-get", "update", "-qq"])
    raise RuntimeError("no linux-image-6.1.0-*-amd64 found through apt-cache (Debian 12 sources?)")


def _deb_cache():
    """The machine-wide .deb cache shared by every checkout (``$KBTP_DEBOOTSTRAP_CACHE``)."""
    d = Path(os.environ.get("KBTP_DEBOOTSTRAP_CACHE", "/var/cache/kbtp-guest-debs")).resolve()
    d.mkdir(parents=True, exist_ok=True)
    return d


def _download_deb(pkg):
    """Return the candidate version's .deb of ``pkg``, from the cache or apt-get download."""
    cache = _deb_cache()
    show = subprocess.run(["apt-cache", "show", "--no-all-versions", pkg], capture_output=True,
                          text=True).stdout
    m = re.search(r"^Version:\s*(\S+)", show, re.M)
    if m:
        hit = cache / f"{pkg}_{m.group(1).replace(':', '%3a')}_amd64.deb"
        if hit.is_file():
            _log(f"cached {hit.name}")
            return hit
    tmp = cache / f".dl-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        try:
            _run(["apt-get", "download", "-q", pkg], cwd=tmp)
        except RuntimeError:
            _run(["apt-get", "update", "-qq"])
            _run(["apt-get", "download", "-q", pkg], cwd=tmp)
        debs = sorted(tmp.glob("*.deb"))
        if len(debs) != 1:
            raise RuntimeError(f"expected one .deb for {pkg}, got {debs}")
        dest = cache / debs[0].name
        os.replace(debs[0], dest)
        return dest
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _fetch_kernel(work):
    """Download and unpack the kernel package; return (kver, vmlinuz path, modules dir)."""
    pkg = _kernel_package()
    kdir = work / f"kernel-{pkg}"
    for old in work.glob("kernel-*"):
        # An ABI bump leaves the previous ~400 MB tree behind otherwise.
        if old != kdir:
            shutil.rmtree(old, ignore_errors=True)
    done = kdir / ".unpacked"
    if not done.exists():
        shutil.rmtree(kdir, ignore_errors=True)
        kdir.mkdir(parents=True)
        deb = _download_deb(pkg)
        _run(["dpkg-deb", "-x", deb, kdir / "x"])
        done.touch()
    x = kdir / "x"
    vmlinuz = sorted((x / "boot").glob("vmlinuz-*"))
    if len(vmlinuz) != 1:
        raise RuntimeError(f"expected one vmlinuz in {pkg}, got {vmlinuz}")
    kver = vmlinuz[0].name[len("vmlinuz-"):]
    for base in (x / "lib" / "modules", x / "usr" / "lib" / "modules"):
        if (base / kver).is_dir():
            return pkg, kver, vmlinuz[0], base / kver
    raise RuntimeError(f"no module tree for {kver} in {pkg}")


def decompress_kernel(vmlinuz):
    """Return the ELF vmlinux inside a bzImage whose payload is XZ-compressed.

    QEMU boots an ELF vmlinux through its PVH note, skipping the in-guest decompressor that is slow
    under TCG. The XZ stream is followed by padding and trailing data, so decode one stream only.
    """
    blob = Path(vmlinuz).read_bytes()
    at = blob.find(XZ_MAGIC)
    if at < 0:
        raise RuntimeError(f"{vmlinuz}: no XZ payload (compression changed?)")
    dec = lzma.LZMADecompressor(format=lzma.FORMAT_XZ)
    elf = dec.decompress(blob[at:])
    if not dec.eof or elf[:4] != b"\x7fELF":
        raise RuntimeError(f"{vmlinuz}: XZ payload did not decode to an ELF image")
    return elf


def _debootstrap(work):
    """Return a stripped minbase rootfs, reusing the cached one when its inputs did not change."""
    root = work / "rootfs"
    stamp = work / "rootfs.sha256"
    want = _rootfs_hash()
    if root.is_dir() and stamp.is_file() and stamp.read_text().strip() == want:
        _log(f"rootfs cached: {root}")
        return root
    stamp.unlink(missing_ok=True)
    shutil.rmtree(root, ignore_errors=True)
    partial = work / "rootfs.partial"
    shutil.rmtree(partial, ignore_errors=True)
    t0 = time.monotonic()
    # The default mirror is Debian's own; KBTP_DEBIAN_MIRROR may point at a closer one.
    mirror = os.environ.get("KBTP_DEBIAN_MIRROR")
    # A machine-wide .deb cache lets a fresh clone (CI) skip the downloads another build made.
    cmd = ["debootstrap", "--variant=minbase", "--include=" + ",".join(PACKAGES),
           f"--cache-dir={_deb_cache()}", SUITE, partial]
    if mirror:
        cmd.append(mirror)
    _run(cmd)
    _log(f"debootstrap: {time.monotonic() - t0:.1f} s")
    for rel in STRIP:
        p = partial / rel
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
            p.mkdir()
        elif p.is_file():
            p.unlink()
    # Python's __pycache__ stays: without it importing pyverbs costs ~9 s of TCG time per run.
    partial.rename(root)
    stamp.write_text(want + "\n")
    return root


def _write_new(path, data, mode=0o644):
    """Write a file by replacing it, never in place: the stage shares inodes with the rootfs."""
    path = Path(path)
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(data if isinstance(data, bytes) else data.encode())
    tmp.chmod(mode)
    os.replace(tmp, path)


def _chroot(stage, *cmd):
    return _run(["chroot", stage, *cmd])


def _install_modules(stage, kver, moddir):
    """Copy the module tree in, keep what MODULES need, and index it with the guest's depmod."""
    dst = stage / "lib" / "modules" / kver
    if dst.exists():
        shutil.rmtree(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    # Hard links: the full tree is ~400 MB and nearly all of it is deleted again below.
    _run(["cp", "-al", moddir, dst])
    _chroot(stage, "depmod", kver)
    deps = _chroot(stage, "modprobe", "-a", "-S", kver, "--show-depends",
                   *MODULES, *OPTIONAL_MODULES)
    keep = set()
    for line in deps.splitlines():
        parts = line.split()
        if parts and parts[0] == "insmod":
            keep.add(parts[1])
    if not keep:
        raise RuntimeError("modprobe --show-depends listed no module")
    n = 0
    for ko in list(dst.rglob("*.ko*")):
        if "/" + str(ko.relative_to(stage)) not in keep:
            ko.unlink()
        else:
            n += 1
    # Drop directories emptied above, then index the survivors.
    for d in sorted((p for p in dst.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            d.rmdir()
    _chroot(stage, "depmod", kver)
    return n


def _make_cpio(stage, dest):
    """Write an uncompressed newc cpio of ``stage`` (the kernel unpacks it as its rootfs)."""
    names = subprocess.run(["find", ".", "-mindepth", "1"], cwd=stage, capture_output=True,
                           check=True).stdout.split(b"\n")
    listing = b"\n".join(sorted(n for n in names if n)) + b"\n"
    tmp = Path(str(dest) + ".partial")
    with open(tmp, "wb") as f:
        r = subprocess.run(["cpio", "--quiet", "-o", "-H", "newc", "--reproducible"], cwd=stage,
                           input=listing, stdout=f, stderr=subprocess.PIPE)
    if r.returncode != 0:
        raise RuntimeError("cpio failed: " + r.stderr.decode(errors="replace")[-2000:])
    os.replace(tmp, dest)


def build(out=None, force=False):
    """Build the guest image into ``out`` unless a current one is there.

    Parameters
    ----------
    out : path-like, optional
        Cache directory; defaults to :func:`default_dir`.
    force : bool
        Rebuild the image (the cached debootstrap tree and kernel download are still reused).

    Returns
    -------
    GuestImage
    """
    out = Path(out) if out else default_dir()
    out.mkdir(parents=True, exist_ok=True)
    with open(out / ".lock", "w") as lock:
        # Parallel test workers may all ask for the image: one builds, the others wait and reuse.
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not force and image_ready(out):
            _log(f"image cached: {out}")
            return GuestImage(out)
        return _build_locked(out)


def _build_locked(out):
    _need_root_tools()
    t0 = time.monotonic()
    img = GuestImage(out)
    (out / "inputs.sha256").unlink(missing_ok=True)
    work = out / "work"
    work.mkdir(exist_ok=True)
    pkg, kver, vmlinuz, moddir = _fetch_kernel(work)
    _log(f"kernel: {pkg} ({kver})")
    _write_new(img.kernel, decompress_kernel(vmlinuz))
    root = _debootstrap(work)

    stage = work / "stage"
    shutil.rmtree(stage, ignore_errors=True)
    _run(["cp", "-al", root, stage])
    for rel in IMAGE_STRIP:
        # Unlinking in the stage leaves the hard-linked rootfs copy intact.
        p = stage / rel
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()
    nmod = _install_modules(stage, kver, moddir)
    init = INIT_TEMPLATE.read_text().replace("@OPTIONAL_MODULES@", " ".join(OPTIONAL_MODULES))
    init = init.replace("@MODULES@", " ".join(MODULES))
    init = init.replace("@MARK@", MARK)
    _write_new(stage / "init", init, 0o755)
    _write_new(stage / "etc" / "hostname", "kbtp-guest\n")
    console = stage / "dev" / "console"
    if not console.exists():
        # The kernel opens /dev/console from the initramfs before /init can mount devtmpfs.
        os.mknod(console, 0o600 | 0o020000, os.makedev(5, 1))
    _make_cpio(stage, img.initrd)
    shutil.rmtree(stage)

    manifest = {
        "kernel_package": pkg, "kernel_version": kver, "modules_kept": nmod,
        "suite": SUITE, "packages": list(PACKAGES), "modules": list(MODULES + OPTIONAL_MODULES),
        "kernel_bytes": img.kernel.stat().st_size, "initramfs_bytes": img.initrd.stat().st_size,
        "build_s": round(time.monotonic() - t0, 1), "inputs_sha256": inputs_hash(),
    }
    _write_new(img.manifest_path, json.dumps(manifest, indent=2) + "\n")
    (out / "inputs.sha256").write_text(inputs_hash() + "\n")
    _log(f"built in {manifest['build_s']} s: initramfs {manifest['initramfs_bytes'] / 1e6:.0f} MB, "
         f"{nmod} modules, kernel {manifest['kernel_bytes'] / 1e6:.0f} MB")
    return img


def ensure_image(out=None):
    """Return the current image, building it first if needed (the call tests and run.py use)."""
    return build(out)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m sim.guest.build",
                                 description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None,
                    help="cache directory (default $KBTP_GUEST_DIR or build/guest)")
    ap.add_argument("--force", action="store_true", help="rebuild even when the hash matches")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    img = build(args.out, force=args.force)
    print(f"{img.kernel}\n{img.initrd}\n({time.monotonic() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

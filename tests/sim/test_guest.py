# Ref: docs/softroce-vm.md; RFC 826 (ARP); RFC 792 (ICMP echo); RFC 4291 §2.5.5.2
#      (IPv4-mapped) and App. A (modified EUI-64); IBTA Vol. 1 §9.2 BTH, RoCEv2 Annex A17 (ICRC)
"""The soft-RoCE guest end to end: pyverbs sees rxe0, and frames cross -netdev dgram both ways.

Oracles: the IPv4-mapped GID and the EUI-64 link-local GID computed here with ``ipaddress`` from the
addresses we configured; scapy for every frame parsed or built on the host side, including the
RoCEv2 ICRC of the guest's first RC SEND. Each test boots one TCG guest (~7-15 s wall each on an
idle 2-core machine). Skipped, with the reason, when not root or QEMU/debootstrap/cpio are missing.
"""

import ipaddress
import os
import shutil
import socket
import sys
import threading
import time

import pytest

from tests.tool_gate import requires_tool

_GUEST_TOOLS = ("qemu-system-x86_64", "debootstrap", "cpio")


def needs_guest(fn):
    """Root (skip without it) and the guest's tools (tests/tool_gate.py: fail under CI=true)."""
    missing = [t for t in _GUEST_TOOLS if shutil.which(t) is None]
    fn = requires_tool(", ".join(missing), not missing, "make apt installs them")(fn)
    return pytest.mark.skipif(os.geteuid() != 0, reason="guest tests need root")(fn)

GUEST_MAC = "02:00:0a:00:00:01"
TARGET_MAC = "02:00:0a:00:00:02"
GUEST_IP = "10.0.0.1"
TARGET_IP = "10.0.0.2"


@pytest.fixture(scope="module")
def image():
    from sim.guest.build import ensure_image, image_ready

    cached = image_ready()
    t0 = time.monotonic()
    img = ensure_image()
    print(f"\nguest image: {'cached' if cached else 'built'} in {time.monotonic() - t0:.1f} s, "
          f"initramfs {img.initrd.stat().st_size / 1e6:.0f} MB", file=sys.stderr)
    return img


def _ports():
    from sim.guest.run import free_udp_port

    # Free ports, not 20001/20002: other tests (and parallel workers) may boot guests at once.
    a = free_udp_port()
    b = free_udp_port()
    while b == a:
        b = free_udp_port()
    return a, b


def _report(name, r):
    print(f"\n{name}: exit {r.exit_code}, boot {r.boot_s:.1f} s, wall {r.wall_s:.1f} s",
          file=sys.stderr)


PYVERBS_QUERY = """\
#!/usr/bin/python3 -u
import pyverbs.enums as e
from pyverbs.device import Context

ctx = Context(name="rxe0")
dev = ctx.query_device()
port = ctx.query_port(1)
print("DEV", ctx.name, "max_qp", dev.max_qp, "atomic_caps", dev.atomic_caps,
      "max_qp_rd_atom", dev.max_qp_rd_atom)
print("PORT", "state", port.state, "active", int(port.state == e.IBV_PORT_ACTIVE),
      "link_layer", port.link_layer, "active_mtu", port.active_mtu, "max_mtu", port.max_mtu,
      "gid_tbl_len", port.gid_tbl_len)
for i in range(2):
    print("GID", i, ctx.query_gid(1, i))
print("ENUM", "ACTIVE", e.IBV_PORT_ACTIVE, "ETHERNET", e.IBV_LINK_LAYER_ETHERNET,
      "MTU1024", e.IBV_MTU_1024, "MTU4096", e.IBV_MTU_4096)
"""


def _parse_words(output, tag):
    """Return the key/value words of the output line starting with ``tag``."""
    for line in output.splitlines():
        w = line.split()
        if w and w[0] == tag:
            return w[1:]
    raise AssertionError(f"no {tag} line in guest output:\n{output}")


def _eui64_link_local(mac):
    """fe80::/64 with the modified EUI-64 interface ID of ``mac`` (RFC 4291 App. A)."""
    b = bytearray(int(x, 16) for x in mac.split(":"))
    b[0] ^= 0x02
    iid = bytes(b[:3]) + b"\xff\xfe" + bytes(b[3:])
    return ipaddress.IPv6Address(b"\xfe\x80" + bytes(6) + iid)


@needs_guest
def test_pyverbs_query(image):
    from sim.guest.run import run_guest

    lp, rp = _ports()
    r = run_guest(PYVERBS_QUERY, local_port=lp, remote_port=rp, guest_ip=GUEST_IP,
                  target_ip=TARGET_IP, mac=GUEST_MAC, timeout_s=300)
    _report("pyverbs query", r)
    print(r.output, file=sys.stderr)
    assert r.exit_code == 0, r.output
    enum = dict(zip(*[iter(_parse_words(r.output, "ENUM"))] * 2))
    port = dict(zip(*[iter(_parse_words(r.output, "PORT"))] * 2))
    assert port["active"] == "1" and port["state"] == enum["ACTIVE"]
    assert port["link_layer"] == enum["ETHERNET"]
    # rxe follows the netdev: MTU 1500 leaves room for 1024-byte RoCE payloads only.
    assert port["active_mtu"] == enum["MTU1024"] and port["max_mtu"] == enum["MTU4096"]
    gids = {int(w[0]): ipaddress.IPv6Address(w[1])
            for w in (line.split()[1:] for line in r.output.splitlines() if line.startswith("GID"))}
    assert gids[1].ipv4_mapped == ipaddress.IPv4Address(GUEST_IP)
    assert gids[1] == ipaddress.IPv6Address("::ffff:" + GUEST_IP)
    # GID 0 derives from the MAC /init set: proves the kernel command line reached eth0.
    assert gids[0] == _eui64_link_local(GUEST_MAC)
    dev = _parse_words(r.output, "DEV")
    assert dev[0] == "rxe0" and int(dev[dev.index("max_qp") + 1]) > 0


@needs_guest
def test_exit_status_output_and_share(image, tmp_path):
    """A plain sh script: its status and output come back, and it can write into the share."""
    from sim.guest.run import run_guest

    lp, rp = _ports()
    script = tmp_path / "probe.sh"
    script.write_text("echo hello from $(uname -r) on $KBTP_NETDEV to $KBTP_TARGET_IP\n"
                      "ip -o -4 addr show dev eth0 > addr.txt\n"
                      "cat /sys/class/net/eth0/mtu >> addr.txt\n"
                      "ip neigh show dev eth0\n"
                      "echo to-stderr >&2\n"
                      "exit 7\n")
    # Also the debugging option: a static neighbour entry instead of ARP.
    r = run_guest(script, share_dir=tmp_path, local_port=lp, remote_port=rp,
                  guest_ip="10.0.0.9", target_ip="10.0.9.2", mac=GUEST_MAC, mtu=9000,
                  prefix_len=16, static_neigh="02:00:0a:00:09:02", timeout_s=300)
    _report("sh exit status", r)
    assert r.exit_code == 7
    lines = [line.rstrip() for line in r.output.splitlines()]
    assert lines[0].startswith("hello from 6.1.0-")
    assert lines[0].endswith("amd64 on eth0 to 10.0.9.2")
    assert "10.0.9.2 lladdr 02:00:0a:00:09:02 PERMANENT" in lines
    assert "to-stderr" in lines
    written = (tmp_path / "addr.txt").read_text().split()
    assert "10.0.0.9/16" in written and written[-1] == "9000"


class MiniPeer:
    """A host-side peer on the guest's dgram link: answers ARP for the target and ICMP echo.

    Everything is parsed and built with scapy; each received frame is kept, in order.
    """

    def __init__(self, port, qemu_port):
        from scapy.layers.l2 import Ether  # noqa: F401 (import scapy before the thread starts)

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", port))
        self.sock.settimeout(0.2)
        self.qemu = ("127.0.0.1", qemu_port)
        self.frames = []
        self.sent = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=5)
        self.sock.close()

    def _send(self, pkt):
        raw = bytes(pkt)
        self.sent.append(raw)
        self.sock.sendto(raw, self.qemu)

    def _loop(self):
        from scapy.layers.inet import ICMP, IP
        from scapy.layers.l2 import ARP, Ether

        while not self.stop.is_set():
            try:
                raw, src = self.sock.recvfrom(65535)
            except socket.timeout:
                continue
            if src != self.qemu:
                continue
            self.frames.append(raw)
            f = Ether(raw)
            if ARP in f and f[ARP].op == 1 and f[ARP].pdst == TARGET_IP:
                self._send(Ether(dst=f[ARP].hwsrc, src=TARGET_MAC)
                           / ARP(op=2, hwsrc=TARGET_MAC, psrc=TARGET_IP,
                                 hwdst=f[ARP].hwsrc, pdst=f[ARP].psrc))
            elif (IP in f and ICMP in f and f[IP].dst == TARGET_IP and f[ICMP].type == 8
                  and f.dst == TARGET_MAC):
                self._send(Ether(dst=f.src, src=TARGET_MAC)
                           / IP(src=TARGET_IP, dst=f[IP].src)
                           / ICMP(type=0, id=f[ICMP].id, seq=f[ICMP].seq)
                           / bytes(f[ICMP].payload))


@needs_guest
def test_arp_and_ping_through_dgram(image):
    """The guest resolves the target by ARP (answered here) and gets its ICMP echo answered."""
    from scapy.layers.inet import ICMP, IP
    from scapy.layers.l2 import ARP, Ether

    from sim.guest.run import run_guest

    lp, rp = _ports()
    script = ("ping -c 1 -W 10 $KBTP_TARGET_IP; rc=$?\n"
              "ip neigh show dev eth0\n"
              "exit $rc\n")
    with MiniPeer(rp, lp) as peer:
        r = run_guest(script, local_port=lp, remote_port=rp, guest_ip=GUEST_IP,
                      target_ip=TARGET_IP, mac=GUEST_MAC, timeout_s=300)
    _report("arp + ping", r)
    print(r.output, file=sys.stderr)
    frames = [Ether(f) for f in peer.frames]
    arps = [i for i, f in enumerate(frames) if ARP in f and f[ARP].op == 1]
    pings = [i for i, f in enumerate(frames)
             if IP in f and ICMP in f and f[ICMP].type == 8 and f[IP].dst == TARGET_IP]
    assert arps, f"no ARP request seen: {[f.summary() for f in frames]}"
    a = frames[arps[0]]
    assert a.src == GUEST_MAC and a.dst == "ff:ff:ff:ff:ff:ff"
    assert (a[ARP].hwsrc, a[ARP].psrc, a[ARP].pdst) == (GUEST_MAC, GUEST_IP, TARGET_IP)
    assert pings and pings[0] > arps[0], "the echo request must follow the ARP exchange"
    p = frames[pings[0]]
    # Addressed to the MAC only our ARP reply announced: the guest took the answer.
    assert (p.src, p.dst, p[IP].src) == (GUEST_MAC, TARGET_MAC, GUEST_IP)
    assert r.exit_code == 0, r.output
    assert "1 received" in r.output
    assert f"{TARGET_IP} lladdr {TARGET_MAC}" in r.output


ROCE_SEND = """\
#!/usr/bin/python3 -u
# An RC QP toward the target, brought to RTS by hand (no CM), posting one SEND.
import ipaddress
import os
import time

import pyverbs.enums as e
from pyverbs.addr import GID, AHAttr, GlobalRoute
from pyverbs.cq import CQ
from pyverbs.device import Context
from pyverbs.mr import MR
from pyverbs.pd import PD
from pyverbs.qp import QP, QPAttr, QPCap, QPInitAttr
from pyverbs.wr import SGE, SendWR

DQPN, SQ_PSN, PAYLOAD = {dqpn}, {psn}, {payload!r}
ctx = Context(name=os.environ["KBTP_RDMA_DEV"])
pd = PD(ctx)
cq = CQ(ctx, 8)
qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq,
                       cap=QPCap(max_send_wr=4, max_recv_wr=4)))
attr = QPAttr(port_num=1, path_mtu=e.IBV_MTU_1024)
attr.dest_qp_num, attr.rq_psn, attr.sq_psn = DQPN, 0, SQ_PSN
attr.max_dest_rd_atomic = attr.max_rd_atomic = 1
attr.min_rnr_timer, attr.timeout, attr.retry_cnt, attr.rnr_retry = 12, 18, 7, 7
attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE
dgid = GID(ipaddress.IPv6Address("::ffff:" + os.environ["KBTP_TARGET_IP"]).exploded)
attr.ah_attr = AHAttr(port_num=1, is_global=1, gr=GlobalRoute(dgid=dgid, sgid_index=1,
                                                              hop_limit=64))
qp.to_rts(attr)
mr = MR(pd, len(PAYLOAD), e.IBV_ACCESS_LOCAL_WRITE)
mr.write(PAYLOAD, len(PAYLOAD))
qp.post_send(SendWR(wr_id=1, opcode=e.IBV_WR_SEND, num_sge=1,
                    sg=[SGE(mr.buf, len(PAYLOAD), mr.lkey)], send_flags=e.IBV_SEND_SIGNALED))
print("QPN", qp.qp_num, "PSN", SQ_PSN, flush=True)
# No ACK will come: give ARP and the first transmission time, then leave.
time.sleep(4)
"""


@needs_guest
def test_rc_send_first_roce_frame(image):
    """The guest's first RoCEv2 frame toward the target, after ARP, checked field by field."""
    from scapy.contrib.roce import BTH
    from scapy.layers.inet import IP, UDP
    from scapy.layers.l2 import ARP, Ether

    from sim.guest.run import run_guest

    dqpn, psn, payload = 0x0001A5, 0x0ABCDE, b"KBTP guest says hello over RC SEND"
    lp, rp = _ports()
    with MiniPeer(rp, lp) as peer:
        r = run_guest(ROCE_SEND.format(dqpn=dqpn, psn=psn, payload=payload), local_port=lp,
                      remote_port=rp, guest_ip=GUEST_IP, target_ip=TARGET_IP, mac=GUEST_MAC,
                      timeout_s=300)
    _report("rc send", r)
    print(r.output, file=sys.stderr)
    assert r.exit_code == 0, r.output
    qpn = int(_parse_words(r.output, "QPN")[0])
    frames = [Ether(f) for f in peer.frames]
    raws = list(peer.frames)
    roce = [i for i, f in enumerate(frames) if UDP in f and f[UDP].dport == 4791]
    arps = [i for i, f in enumerate(frames) if ARP in f and f[ARP].op == 1]
    assert roce, f"no RoCEv2 frame: {[f.summary() for f in frames]}"
    assert arps and arps[0] < roce[0]
    f, raw = frames[roce[0]], raws[roce[0]]
    assert (f.src, f.dst) == (GUEST_MAC, TARGET_MAC)
    # rxe check_addr on the far side: IP addresses are the GIDs the QP was given.
    assert (f[IP].src, f[IP].dst) == (GUEST_IP, TARGET_IP)
    b = f[BTH]
    assert b.opcode == 0x04, "RC SEND Only"
    assert (b.dqpn, b.psn, b.pkey, b.ackreq) == (dqpn, psn, 0xFFFF, 1)
    # 34 octets: the SEND is padded to a 4-octet multiple and BTH.PadCnt says by how much.
    pad = -len(payload) % 4
    assert pad and b.padcount == pad
    assert bytes(b.payload) == payload + bytes(pad)
    # The ICRC on the wire (last 4 octets) equals scapy's own computation over the frame...
    assert b.compute_icrc(None) == raw[-4:]
    # ...and that comparison does notice a corrupted payload octet.
    bad = bytearray(raw)
    bad[-5] ^= 0x01
    assert Ether(bytes(bad))[BTH].compute_icrc(None) != raw[-4:]
    assert 0 < qpn < (1 << 24)


# The console protocol of /init, checked without QEMU: a stand-in process prints a transcript.
def _fake_boot(tmp_path, shell, timeout_s=30.0):
    from sim.guest.run import _boot

    return _boot(["sh", "-c", shell], tmp_path / "console.log", timeout_s, False)


def test_console_parsing_without_qemu(tmp_path):
    from sim.guest.build import MARK

    r = _fake_boot(tmp_path, f"printf '[0.1] kernel noise\\r\\n{MARK} BEGIN uptime=3.5\\r\\n"
                             f"line one\\r\\nno newline'; printf '{MARK} EXIT 42\\r\\n'")
    assert (r.exit_code, r.output) == (42, "line one\nno newline")
    assert "kernel noise" in r.console
    assert f"no newline{MARK} EXIT 42\r\n".encode() in r.log_path.read_bytes()


def test_console_failures_without_qemu(tmp_path):
    from sim.guest.build import MARK
    from sim.guest.run import GuestError, GuestTimeout

    with pytest.raises(GuestError, match="set-up failed: rdma link add rxe0"):
        _fake_boot(tmp_path, f"echo '{MARK} SETUP-FAILED rdma link add rxe0'; "
                             f"echo '{MARK} EXIT 125'")
    with pytest.raises(GuestError, match="without an exit marker") as e:
        _fake_boot(tmp_path, f"echo '{MARK} BEGIN'; echo 'Kernel panic'; exit 1")
    assert "Kernel panic" in e.value.console
    t0 = time.monotonic()
    with pytest.raises(GuestTimeout):
        _fake_boot(tmp_path, f"echo '{MARK} BEGIN'; exec sleep 60", timeout_s=1.0)
    assert time.monotonic() - t0 < 10, "the stand-in must be killed at the timeout"

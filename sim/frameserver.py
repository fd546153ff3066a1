# Ref: docs/softroce-vm.md (QEMU -netdev dgram: one Ethernet frame without FCS per datagram);
#      pcap file format (libpcap, LINKTYPE_ETHERNET); draft KBTP §Target Memory Structures.
"""What both backends of ``kbtp-sim serve`` share: the served target configuration, the UDP
frame loop with its impairments, and the pcap writer.

:mod:`sim.serve` (the golden model behind the Python RC endpoint) and :mod:`sim.serve_hw` (the
Verilated gateware) both import this module; neither imports the other at module level.
"""

import random
import select
import socket
import struct
import threading
import time

from host.config import TargetConfig

__all__ = ["FrameServer", "PcapWriter", "model_config", "served_config", "large_config", "DEFAULT_MAC",
           "DEFAULT_IP", "DEFAULT_CM_PORT"]

DEFAULT_MAC = "02:4b:42:54:50:01"
DEFAULT_IP = "10.0.0.2"
DEFAULT_CM_PORT = 18515


# --------------------------------------------------------------------------------------------
# The served configuration
# --------------------------------------------------------------------------------------------

def model_config(**overrides):
    """The target configuration ``kbtp-sim serve`` uses with either backend (RoCEv2: unmasked
    counters), for the shipped core (sim/vltarget.py SHIPPED: the ECPIX-5 with its target memory
    in the 512 MB of DDR3).

    20 blocks of 4 KiB (the board's block size), 2 DIRECT_ALLOC partitions of 4 blocks, quota 4
    per shared-ring initiator (12 shared blocks), 256 handles, long retention and ticket timeout (a TCG guest is
    slow). Request Credits 16 (issue 20 item 5: at least 16 per QP): the host driver posts one
    receive buffer per request credit and QP (:func:`host.driver.memory_plan`, as the draft's
    target pre-posts one per credit, §Target Execution Model; more credits than buffers and a
    pipelining initiator meets RNR NAKs). With Max Inline 1024 each buffer holds 24 + 32 + 1024
    = 1080 octets, so 2048: 4 QPs x 16 x 2048 = 128 KiB of buffers in the DDR3, and 4 x 16 = 64
    fill the RecvNotify FIFO exactly. A target with less memory serves :func:`served_config`
    (the block-RAM core: 4 credits). :func:`large_config` is the 4 MiB one of the one-clock
    unit-test target (the fuzzer's).
    """
    kw = dict(block_size=4096, num_blocks=20, num_handles=256, handles_per_initiator=64,
              direct_partitions=2, direct_quota=4, quota_per_initiator=4, masked=False,
              request_credits=16, max_inline=1024, ticket_timeout_ms=30000,
              retention_ms=60000.0)
    kw.update(overrides)
    return TargetConfig(**kw)


def served_config(n_qp, mem_size, **overrides):
    """:func:`model_config` for a target of ``n_qp`` QPs and ``mem_size`` octets of memory: its
    Request Credits lowered to the most receive buffers per QP that fit beside the structures
    (:func:`host.driver.memory_plan`) when the 16 do not. The ECPIX-5 core with its memory in
    128 KiB of block RAM (``--hw ecpix5-bram``) fits 4: the structures end at 90112 octets
    (pool 81920 of them), the engine's and the driver's scratch (4 x 512 + 4 x 256) at 93184,
    the buffers start at 94208 (2048-aligned); 131072 - 94208 = 36864 octets = 18 buffers, 4 per
    QP. An explicit ``request_credits`` is kept (and refused by the driver if it does not fit).

    The table has a handle range for every QP (``handles_per_initiator * n_qp`` handles when
    that is more than :func:`model_config`'s): a HELLO takes a free range, so a 64-QP target
    with 4 ranges would serve 4 sessions. The pool stays as given: the shared blocks are
    shared out as quotas in HELLO order (host/policy.py ``session_quota``)."""
    from host.driver import memory_plan
    if "num_handles" not in overrides:
        base = model_config(**overrides)
        want = base.handles_per_initiator * n_qp
        if want > base.num_handles:
            overrides = {**overrides, "num_handles": want}
    cfg = model_config(**overrides)
    if "request_credits" in overrides:
        return cfg
    for credits in range(cfg.request_credits, 0, -1):
        c = model_config(**{**overrides, "request_credits": credits})
        if memory_plan(c, n_qp)["end"] <= mem_size:
            return c
    return cfg


def large_config(**overrides):
    """:func:`model_config` with 64 blocks of 64 KiB, partitions of 8 blocks and quota 16: for
    the one-clock unit-test target's 4 MiB memory (``sim.vltarget.HW_DEFAULT``), not a board.

    Request Credits 6, the most receive buffers per QP that fit beside the 4 MiB pool (Max
    Inline 1024, 2048-octet buffers): the target has 532480 words = 4259840 octets, the
    structures end at 4202496, the buffers start at 4206592 after the scratch areas; 53248
    octets = 26 buffers, 6 per QP for the 4 QPs (16 per QP would take 131072 octets)."""
    kw = dict(block_size=65536, num_blocks=64, direct_quota=8, quota_per_initiator=16,
              request_credits=6)
    kw.update(overrides)
    return model_config(**kw)


# --------------------------------------------------------------------------------------------
# pcap
# --------------------------------------------------------------------------------------------

class PcapWriter:
    """A classic libpcap file (LINKTYPE_ETHERNET, microsecond stamps), flushed per frame."""

    def __init__(self, path):
        self.f = open(path, "wb")
        self.f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 65535, 1))
        self.lock = threading.Lock()

    def write(self, frame, when=None):
        t = time.time() if when is None else when
        sec, usec = int(t), int((t - int(t)) * 1e6)
        with self.lock:
            self.f.write(struct.pack("<IIII", sec, usec, len(frame), len(frame)) + bytes(frame))
            self.f.flush()

    def close(self):
        self.f.close()


# --------------------------------------------------------------------------------------------
# The UDP frame loop
# --------------------------------------------------------------------------------------------

class FrameServer:
    """Move frames between a UDP socket and a RoCE endpoint, with optional impairments.

    Parameters
    ----------
    ep : RoceEndpoint
    glue : ModelGlue or None
    listen, peer : (host, port)
        Own UDP address and QEMU's.
    pcap : path or None
        Every frame seen, both directions (after impairment on the way out, before it on the
        way in: what crossed the "wire").
    drop, dup, corrupt : float
        Probability per frame (both directions) of dropping, duplicating, flipping one octet.
    seed : int
    log : callable(str) or None
    """

    def __init__(self, ep, glue=None, *, listen=("127.0.0.1", 20002),
                 peer=("127.0.0.1", 20001), pcap=None, drop=0.0, dup=0.0, corrupt=0.0,
                 seed=1, log=None):
        self.ep, self.glue = ep, glue
        self.peer = peer
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        self.sock.bind(listen)
        self.pcap = PcapWriter(pcap) if pcap else None
        self.drop, self.dup, self.corrupt = drop, dup, corrupt
        self.rng = random.Random(seed)
        self.log = log or (lambda s: None)
        self.t0 = time.monotonic()
        self.stop_event = threading.Event()
        self.counts = {"rx": 0, "tx": 0, "dropped": 0, "duplicated": 0, "corrupted": 0}

    def now_us(self):
        return int((time.monotonic() - self.t0) * 1e6)

    def _impair(self, frame):
        """The frames that come out of the impaired link for one frame going in."""
        if self.drop and self.rng.random() < self.drop:
            self.counts["dropped"] += 1
            return []
        if self.corrupt and self.rng.random() < self.corrupt:
            self.counts["corrupted"] += 1
            b = bytearray(frame)
            i = self.rng.randrange(14, len(b)) if len(b) > 14 else 0
            b[i] ^= 1 << self.rng.randrange(8)
            frame = bytes(b)
        out = [frame]
        if self.dup and self.rng.random() < self.dup:
            self.counts["duplicated"] += 1
            out.append(frame)
        return out

    def _flush(self):
        if self.glue is not None:
            self.glue.pump(self.now_us() / 1000.0)
        for f in self.ep.poll_tx():
            for g in self._impair(f):
                if self.pcap:
                    self.pcap.write(g)
                self.counts["tx"] += 1
                self.sock.sendto(g, self.peer)

    def step(self, timeout_s):
        """Wait up to ``timeout_s`` for frames, process them, fire timers, send replies."""
        dl = self.ep.next_deadline()
        if dl is not None:
            timeout_s = max(0.0, min(timeout_s, (dl - self.now_us()) / 1e6))
        r, _, _ = select.select([self.sock], [], [], timeout_s)
        if r:
            for _ in range(256):
                try:
                    frame = self.sock.recv(65536, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    break
                if self.pcap:
                    self.pcap.write(frame)
                for g in self._impair(frame):
                    self.counts["rx"] += 1
                    self.ep.receive_frame(g, self.now_us())
                self._flush()
        self.ep.tick(self.now_us())
        self._flush()

    def serve_forever(self, duration_s=None):
        end = None if duration_s is None else time.monotonic() + duration_s
        while not self.stop_event.is_set() and (end is None or time.monotonic() < end):
            self.step(0.05)

    def start_thread(self):
        """Serve in a daemon thread; ``stop()`` ends it."""
        self.thread = threading.Thread(target=self.serve_forever, name="kbtp-serve",
                                       daemon=True)
        self.thread.start()
        return self.thread

    def stop(self):
        self.stop_event.set()
        t = getattr(self, "thread", None)
        if t is not None and t is not threading.current_thread():
            t.join(5)
        self.sock.close()
        if self.pcap:
            self.pcap.close()

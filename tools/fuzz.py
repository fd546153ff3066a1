# Ref: issue 7 item 3 (fuzzing); draft KBTP §Messages, §Status Codes, §Completion.
#      roce-layouts.md §1-§5 (Ethernet, IPv4, UDP, BTH, RETH, AtomicETH, ICRC); layouts.md;
#      model/target.py "Readings of the draft" (the oracle); host/codec.py (what is malformed).
"""Fuzz the whole Verilated target (:class:`sim.vltarget.VlTarget`) with mutated RoCEv2/KBTP
frames and check it with oracles that do not share code with the gateware.

Set-up (like a deployment): :class:`host.driver.KbtpDriver` initialises target memory and the
engine with :func:`sim.serve.large_config`; four target QPs, all RTS, each connected to a
:class:`roce.rc.RoceEndpoint` QP:

* QP 0 ``kbtp``: a clean peer with a session (HELLO). It carries mutated *KBTP messages* on a
  valid transport (the peer's own RC Send). Each one is also given to the golden model
  (:class:`model.target.TargetModel`), whose reply must be what the target sent, octet for octet;
  when :func:`host.codec.decode` rejects the message, that reply must be a COMPLETION with the
  codec's status (MALFORMED, or TOO_LARGE for oversized lengths).
* QP 1 ``probe``: a clean peer with a session; after every batch one valid request (the
  generator of the engine tests) must complete within :data:`PROBE_CYCLES` (watchdog) with the
  model's reply.
* QPs 2, 3 ``victim``: a second peer (own MAC/IP), no session. Raw mutated frames are sent to
  these QPNs (and to random addresses); the peer QPs acknowledge what the target sends them.
  No raw frame ever carries the QPN of QP 0 or 1 to our address, so their connections stay
  clean.

Frame classes (:data:`CLASSES`): ``bitflip``, ``truncate``, ``extend`` (ICRC left as it is, so
mostly wrong), ``bth`` / ``reth`` / ``atomic`` / ``kbtp_hdr`` field mutations with the ICRC
recomputed (and sometimes left wrong), ``addr`` (Ethernet / IPv4 / UDP fields), ``random``
(random octets, with or without a plausible header), ``icrc_bad`` and ``fcs_bad`` (exact
counts), and ``kbtp`` (QP 0, above). Seeds: every frame the clean peers send to the target, the
three captures in tests/data (readdressed to a victim QP) and synthetic WRITE / READ / atomic
frames of the victim peer.

Oracles
-------
1. Watchdog: after every batch the probe completes within :data:`PROBE_CYCLES` cycles; the MAC's
   receive counters (frames ok + FCS errors + runts + errors + overflows) grow by exactly the
   number of frames sent.
2. Memory: the whole target memory is read back (``VlTarget.mem_read``) every
   ``--mem-every`` batches and at the end. The KBTP structures (counters, table, rings, pool)
   must equal the model's image; the driver's scratch and receive buffers may change (the
   transport writes receive buffers); every other octet must keep its value after set-up
   (no MR has remote write rights: the direct modes are not granted). Octets that differ are
   "unauthorized writes".
3. Malformed KBTP on a valid transport gets the codec's status in a COMPLETION (above).
4. ``icrc_bad`` batches (only those frames in flight) move the ICRC checker's ``cnt_bad`` by
   exactly the number sent; ``fcs_bad`` batches move the MAC's ``rx_fcs_errors`` likewise.
5. Neither the host driver nor a peer endpoint raises: they are not under fuzz, so an exception
   of either (counted as ``host_errors`` / ``peer_errors``, kept in ``Fuzzer.errors``) fails the
   run (:meth:`Fuzzer.check_errors` at the end of :meth:`Fuzzer.run` and of a replay).

Corpus (``tests/fuzz_corpus/*.json``): a JSON object ``{"version": 1, "entries": [...]}``; an
entry is ``{"name", "class", "kind": "frame"|"kbtp", "hex", "fcs_ok", "why"}``; ``frame``
entries are whole Ethernet frames without FCS, ``kbtp`` entries Send payloads for QP 0. The
addresses and QPNs are the fixed ones of this module, so entries replay on a fresh target
(:func:`replay`).

CLI: ``python -m tools.fuzz --frames 100000 --seed S`` prints frames by class, drops by counter,
completions by status, probes, unauthorized writes, hangs, cycles and frames/s; it exits 1 on
any finding, hang, unauthorized write, or host-driver / peer error.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import sys
import time
import traceback
from collections import Counter
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:                 # tests/ helpers (scapy ICRC, request builder)
    sys.path.insert(0, _ROOT)

from hw.headers import (AtomicETH, BTH, BthOpcode, CommonHeader, DataDescriptor,
                        CompletionDescriptor, Opcode, RETH, pack, unpack)

__all__ = ["CLASSES", "Mutator", "Fuzzer", "ip_checksum", "fix_ip", "fix_icrc", "icrc_ok",
           "set_field", "kbtp_mutate", "expected_status", "load_corpus", "save_corpus",
           "replay", "main", "T_MAC", "T_IP", "CLEAN", "VICTIM", "T_QPN", "P_QPN",
           "ROLE_KBTP", "ROLE_PROBE", "VICTIM_QPS"]

# ---- addresses of the set-up (fixed: corpus frames carry them) ---------------------------------
T_MAC, T_IP = "02:4b:42:54:50:01", "10.0.0.2"
CLEAN = ("02:00:00:00:00:02", "10.0.0.1")        # peer of QP 0 (kbtp) and QP 1 (probe)
VICTIM = ("02:00:00:00:00:03", "10.0.0.3")       # peer of the victim QPs
T_QPN = [0x11, 0x12, 0x13, 0x14]                 # target QPNs of QP 0..3
P_QPN = [0x20, 0x21, 0x22, 0x23]                 # peer QPNs
ROLE_KBTP, ROLE_PROBE = 0, 1
VICTIM_QPS = (2, 3)
PMTU, PMTU_CODE = 1024, 3
PERIOD_NS = 8
PROBE_CYCLES = 2_000_000     # watchdog bound for one probe operation (a 64 KiB LOAD: ~80 k)
STEP = 512                   # cycles per network/host service step
CORPUS_PER_CLASS = 5         # corpus: first frames of new shapes kept per class

CLASSES = ("bitflip", "truncate", "extend", "bth", "reth", "atomic", "kbtp_hdr", "addr",
           "random", "pcap", "icrc_bad", "fcs_bad", "kbtp")
#: Raw-frame classes mixed into a batch (icrc_bad / fcs_bad run in their own batches, kbtp on
#: QP 0).
RAW_MIX = {"bitflip": 14, "truncate": 8, "extend": 8, "bth": 18, "reth": 10, "atomic": 8,
           "kbtp_hdr": 12, "addr": 8, "random": 6, "pcap": 6}

_ETH = 14
_IP = _ETH
_UDP = _IP + 20
_BTH = _UDP + 8
_EXT = _BTH + BTH.SIZE if hasattr(BTH, "SIZE") else _BTH + 12


# ---- checksums (independent of the gateware: RFC 791 sum, roce-layouts.md §5 via zlib) ----------

def ip_checksum(hdr):
    """RFC 791 header checksum of ``hdr`` (its checksum field taken as is: zero it first)."""
    s = 0
    for k in range(0, len(hdr) - 1, 2):
        s += hdr[k] << 8 | hdr[k + 1]
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def fix_ip(frame):
    """Recompute the IPv4 header checksum (20-octet header) of an Ethernet frame."""
    f = bytearray(frame)
    if len(f) >= _UDP:
        f[_IP + 10:_IP + 12] = b"\0\0"
        f[_IP + 10:_IP + 12] = ip_checksum(f[_IP:_UDP]).to_bytes(2, "big")
    return bytes(f)


def _icrc(frame):
    from sim.scapy_roce import zlib_icrc
    return zlib_icrc(bytes(frame[_IP:-4]))


def fix_icrc(frame):
    """Replace the last 4 octets with the ICRC of IPv4 header .. end (roce-layouts.md §5)."""
    f = bytes(frame)
    if len(f) < _EXT + 4:
        return f
    return f[:-4] + _icrc(f)


def icrc_ok(frame):
    return len(frame) >= _EXT + 4 and bytes(frame[-4:]) == _icrc(frame)


def set_field(buf, off, struct, name, value):
    """Set field ``name`` of the ``struct`` at ``buf[off:]`` (hw.headers layouts), in place."""
    n = struct.SIZE
    if off + n > len(buf):
        return False
    d = unpack(struct, bytes(buf), off)
    d[name] = value & ((1 << _bits(struct, name)) - 1)
    buf[off:off + n] = pack(struct, **d)
    return True


def _bits(struct, name):
    from hw.headers import wire_fields
    for n, _, bits, _ in wire_fields(struct):
        if n == name:
            return bits
    raise KeyError(name)


def _ext_len(opcode):
    from hw.headers import EXT_HEADERS
    try:
        return sum(s.SIZE for s in EXT_HEADERS[BthOpcode(opcode)])
    except ValueError:
        return 0


def _mac(s):
    return bytes(int(x, 16) for x in s.split(":"))


def _ip(s):
    return bytes(int(x) for x in s.split("."))


def is_roce(frame):
    return (len(frame) >= _BTH + 12 and frame[12:14] == b"\x08\x00"
            and frame[_UDP + 2:_UDP + 4] == (4791).to_bytes(2, "big"))


def dest_qpn(frame):
    return int.from_bytes(frame[_BTH + 5:_BTH + 8], "big") if is_roce(frame) else None


# ---- bugs found (reported to the lead; frames avoided with --avoid-known) ------------------------

def _ack_with_payload(f):
    """ACKNOWLEDGE / ATOMIC ACKNOWLEDGE to our address, good ICRC, with octets after its
    headers. Found by this fuzzer: the Requester's "Act" state never drains such a payload
    (only READ responses go to Write / Discard), RespDemux then waits on it forever and the
    whole receive path stops (every later frame is lost: rx_overflows). Fixed: RoceRxParser
    flags such packets malformed (hw/rdma/roce_hdr.py HEADERS_ONLY) and RespDemux hands
    malformed responses to the responder, which drops and counts them."""
    if not (is_roce(f) and f[0:6] == _mac(T_MAC) and f[_BTH] in (0x11, 0x12)):
        return False
    if not icrc_ok(f):
        return False
    hdrs = _EXT + _ext_len(f[_BTH]) + 4
    ip_len = int.from_bytes(f[_IP + 2:_IP + 4], "big")
    return len(f) > hdrs or _IP + ip_len > hdrs


#: Frames that stop the target (bugs reported, not yet fixed in hw/): name -> predicate.
#: Empty: "ack_payload" (:func:`_ack_with_payload`) is fixed; its frames stay in the corpus.
KNOWN_BUGS = {}


# ---- KBTP message mutations (QP 0) -------------------------------------------------------------

def kbtp_mutate(rng, raw):
    """One to three field-aware mutations of a KBTP request (hw.headers layouts)."""
    m = bytearray(raw)
    hs = CommonHeader.SIZE
    for _ in range(rng.choice((1, 1, 1, 2, 3))):
        k = rng.randrange(14)
        if len(m) < hs and k < 11:
            k = 11
        if k == 0:
            set_field(m, 0, CommonHeader, "version", rng.choice((0, 2, 0xFF, rng.getrandbits(8))))
        elif k == 1:
            op = rng.choice([o.value for o in Opcode] + [0, 0x0F, 0x80, 0xFF,
                                                         rng.getrandbits(8)])
            set_field(m, 0, CommonHeader, "opcode", op)
        elif k == 2:
            f = unpack(CommonHeader, bytes(m), 0)["flags"]
            set_field(m, 0, CommonHeader, "flags", f ^ (1 << rng.randrange(16)))
        elif k == 3:
            set_field(m, 0, CommonHeader, "handle", rng.choice(
                (0, 1 << 63, (1 << 64) - 1, rng.getrandbits(64), rng.getrandbits(16))))
        elif k == 4:
            set_field(m, 0, CommonHeader, "generation", rng.getrandbits(16))
        elif k == 5:
            set_field(m, 0, CommonHeader, "status", rng.choice((1, 0xFFFF, rng.getrandbits(16))))
        elif k in (6, 7, 8):
            name = ("stag", "tagged_offset", "length")[k - 6]
            v = rng.choice((0, 1, (1 << 32) - 1, 1 << 31, rng.getrandbits(32), 65536, 65537,
                            1024, 1025))
            set_field(m, hs, DataDescriptor, name, v)
        elif k == 9:
            name = rng.choice(("stag", "tagged_offset", "reserved"))
            if len(m) < hs + 32:
                m += bytes(hs + 32 - len(m))
            set_field(m, hs + DataDescriptor.SIZE, CompletionDescriptor, name,
                      rng.getrandbits(32) | 1)
        elif k == 10:
            set_field(m, 0, CommonHeader, "request_id", rng.getrandbits(64))
        elif k == 11:
            del m[rng.randrange(len(m) + 1):]                   # truncate
        elif k == 12:
            m += bytes(rng.getrandbits(8) for _ in range(rng.choice((1, 3, 8, 16, 40))))
        else:
            if m:
                i = rng.randrange(len(m))
                m[i] ^= 1 << rng.randrange(8)
    if len(m) >= 2 and m[1] in (Opcode.HELLO.value, Opcode.GOODBYE.value):
        # HELLO / GOODBYE would end or replace the session (draft §Session Establishment):
        # not what this class tests.
        m[1] = Opcode.COMPLETION.value if rng.random() < 0.5 else 0x7E
    return bytes(m)


def expected_status(raw, cfg):
    """The codec's verdict: the Status a target must answer, or None when it decodes."""
    from host import codec
    try:
        codec.decode(raw, max_inline=cfg.max_inline)
    except codec.KbtpError as e:
        return int(getattr(e.status, "value", e.status))
    return None


# ---- raw frame mutations -----------------------------------------------------------------------

class Mutator:
    """Frame mutations (pure: an RNG, seed frames and the victim addresses)."""

    def __init__(self, rng, *, victim_qpns, protected_qpns):
        self.rng = rng
        self.victim_qpns = list(victim_qpns)
        self.protected = set(protected_qpns)
        self.epsn = {q: 0 for q in self.victim_qpns}    # target's expected PSN (from its ACKs)

    # addressing: every RoCE frame to our IP goes to a victim QPN (never QP 0 / 1)
    def readdress(self, frame, qpn=None):
        f = bytearray(frame)
        if len(f) < _BTH + 12:
            return bytes(f)
        f[0:6] = _mac(T_MAC)
        f[6:12] = _mac(VICTIM[0])
        f[_IP + 12:_IP + 16] = _ip(VICTIM[1])
        f[_IP + 16:_IP + 20] = _ip(T_IP)
        if f[12:14] == b"\x08\x00" and f[_UDP + 2:_UDP + 4] == b"\x12\xb7":
            q = qpn if qpn is not None else self.rng.choice(self.victim_qpns)
            f[_BTH + 5:_BTH + 8] = q.to_bytes(3, "big")
            if q in self.epsn and self.rng.random() < 0.7:
                psn = (self.epsn[q] + self.rng.choice((0, 0, 0, 1, -1, 2))) & 0xFFFFFF
                f[_BTH + 9:_BTH + 12] = psn.to_bytes(3, "big")
        return fix_icrc(fix_ip(bytes(f)))

    def guard(self, frame):
        """Keep raw frames off the clean QPs: a protected QPN becomes a victim one."""
        q = dest_qpn(frame)
        if q is not None and q in self.protected and frame[0:6] == _mac(T_MAC):
            f = bytearray(frame)
            f[_BTH + 5:_BTH + 8] = self.rng.choice(self.victim_qpns).to_bytes(3, "big")
            return fix_icrc(bytes(f)) if icrc_ok(frame) else bytes(f)
        return frame

    def no_hello(self, frame):
        """A victim QP must not get a session: a Send carrying HELLO / GOODBYE is altered."""
        if not is_roce(frame):
            return frame
        op = frame[_BTH]
        if op in (0x00, 0x04, 0x05, 0x17) and len(frame) > _EXT + _ext_len(op) + 1:
            at = _EXT + _ext_len(op) + 1
            if frame[at] in (Opcode.HELLO.value, Opcode.GOODBYE.value):
                f = bytearray(frame)
                f[at] = 0x7E
                return fix_icrc(bytes(f)) if icrc_ok(frame) else bytes(f)
        return frame

    def mutate(self, cls, seed):
        """A mutated frame of class ``cls`` from ``seed`` (already readdressed)."""
        f = bytearray(seed)
        icrc_fix = self.rng.random() < 0.8
        if cls in ("reth", "atomic"):
            f, icrc_fix = self._mut_ext(f, icrc_fix, cls)
        else:       # the classes sent unmutated (e.g. fcs_bad, icrc_bad) have no method
            f, icrc_fix = getattr(self, f"_mut_{cls}", lambda f, fix: (f, fix))(f, icrc_fix)
        if icrc_fix and is_roce(bytes(f)):
            f = bytearray(fix_icrc(bytes(f)))
        return self.no_hello(self.guard(bytes(f)))

    def _mut_bitflip(self, f, icrc_fix):
        r = self.rng
        for _ in range(r.choice((1, 1, 2, 4, 8))):
            i = r.randrange(len(f))
            f[i] ^= 1 << r.randrange(8)
        icrc_fix = r.random() < 0.3
        return f, icrc_fix

    def _mut_truncate(self, f, icrc_fix):
        r = self.rng
        del f[r.randrange(_ETH, len(f)):]
        icrc_fix = r.random() < 0.5
        if r.random() < 0.5:
            self._ip_len(f)
        return f, icrc_fix

    def _mut_extend(self, f, icrc_fix):
        r = self.rng
        f += bytes(r.getrandbits(8) for _ in range(r.choice((1, 2, 4, 8, 64, 300))))
        icrc_fix = r.random() < 0.5
        if r.random() < 0.6:
            self._ip_len(f)
        return f, icrc_fix

    def _mut_bth(self, f, icrc_fix):
        r = self.rng
        name = r.choice(("opcode", "opcode", "opcode", "se", "migreq", "padcnt", "padcnt",
                         "tver", "tver", "pkey", "dest_qp", "ackreq", "resv7", "resv6",
                         "psn", "psn", "fecn", "becn"))
        v = r.getrandbits(24)
        if name == "opcode":
            v = r.choice([o.value for o in BthOpcode] + [0x18, 0x20, 0x3F, 0x40, 0xFF,
                                                         r.getrandbits(8)])
            if r.random() < 0.5:
                # an opcode needs its extended headers: make room, fields random
                old, new = _ext_len(f[_BTH]), _ext_len(v)
                f[_EXT:_EXT + old] = bytes(r.getrandbits(8) for _ in range(new))
                self._ip_len(f)
        elif name == "dest_qp":
            v = r.choice(self.victim_qpns + [0, 1, 2, 0xFFFFFF, T_QPN[-1] + 1, v])
        elif name == "psn":
            q = dest_qpn(bytes(f))
            base = self.epsn.get(q, 0)
            v = (base + r.choice((0, 1, -1, 2, -2, 1 << 23, (1 << 23) + 1, v))) & 0xFFFFFF
        elif name == "pkey":
            v = r.choice((0, 0x7FFF, 0xFFFF, v & 0xFFFF))
        set_field(f, _BTH, BTH, name, v)
        return f, icrc_fix

    def _mut_ext(self, f, icrc_fix, cls):
        r = self.rng
        op = r.choice((0x06, 0x0A, 0x0B, 0x0C) if cls == "reth" else (0x13, 0x14))
        if f[_BTH] != op:
            old = _ext_len(f[_BTH])
            f[_BTH] = op
            f[_EXT:_EXT + old] = bytes(_ext_len(op))
        st = RETH if cls == "reth" else AtomicETH
        names = [n for n in ("va", "rkey", "dma_length", "swap_add", "compare")
                 if _has(st, n)]
        for name in r.sample(names, r.choice((1, 2, len(names)))):
            v = r.choice((0, 1, 8, 0x1000, (1 << 32) - 1, (1 << 64) - 1, 1 << 63,
                          r.getrandbits(64), r.choice((0x100, 0x200, 0x300, 0x10000))))
            if name == "dma_length":
                v = r.choice((0, 1, 4, 64, 1024, 1025, 4096, 1 << 31, r.getrandbits(32)))
            set_field(f, _EXT, st, name, v)
        if op in (0x0C, 0x13, 0x14):       # requests without payload
            del f[_EXT + _ext_len(op):]
            f += bytes(4)
        self._ip_len(f)
        return f, icrc_fix

    def _mut_kbtp_hdr(self, f, icrc_fix):
        r = self.rng
        op = f[_BTH]
        at = _EXT + _ext_len(op)
        end = max(at, len(f) - 4 - (f[_BTH + 1] >> 4 & 3))
        msg = kbtp_mutate(r, bytes(f[at:end]))
        pad = (-len(msg)) % 4
        f = bytearray(f[:at] + msg + bytes(pad + 4))
        set_field(f, _BTH, BTH, "padcnt", pad)
        self._ip_len(f)
        return f, icrc_fix

    def _mut_addr(self, f, icrc_fix):
        r = self.rng
        k = r.randrange(11)
        if k == 0:
            f[0:6] = r.choice((b"\xff" * 6, _mac(CLEAN[0]), bytes(6),
                               bytes(r.getrandbits(8) for _ in range(6))))
        elif k == 1:
            f[12:14] = r.choice((b"\x86\xdd", b"\x08\x06", b"\x81\x00", b"\x00\x00"))
        elif k == 2:
            f[_IP] = r.choice((0x46, 0x44, 0x65, 0x4F))
        elif k == 3:
            f[_IP + 16:_IP + 20] = r.choice((_ip(CLEAN[1]), b"\xff" * 4, bytes(4)))
        elif k == 4:
            f[_IP + 9] = r.choice((6, 1, 0x11 ^ 1))
        elif k == 5:
            f[_IP + 6:_IP + 8] = r.choice((b"\x20\x00", b"\x00\x10", b"\x3f\xff"))
        elif k == 6:
            f[_UDP + 2:_UDP + 4] = r.choice((b"\x12\xb8", b"\x00\x35", b"\x12\xb6"))
        elif k == 7:
            f[_UDP + 4:_UDP + 6] = r.getrandbits(16).to_bytes(2, "big")
        elif k == 8:
            f[_IP + 2:_IP + 4] = r.getrandbits(16).to_bytes(2, "big")
        elif k == 9:
            f[_IP + 8] = r.choice((0, 1))       # TTL
        else:
            f[_IP + 12:_IP + 16] = bytes(r.getrandbits(8) for _ in range(4))  # source IP
        if k not in (2,) and r.random() < 0.8:
            f[:] = fix_ip(bytes(f))
        return f, icrc_fix

    def _mut_random(self, f, icrc_fix):
        r = self.rng
        n = r.choice((1, 13, 41, 59, 60, 64, 100, 600, 1500, 1 + r.randrange(1600)))
        body = bytes(r.getrandbits(8) for _ in range(n))
        if r.random() < 0.5:
            f = bytearray(f[:_BTH + r.choice((0, 4, 12))] + body)
            self._ip_len(f)
            f[:] = fix_ip(bytes(f))
        else:
            f = bytearray(body)
            icrc_fix = False
        return f, icrc_fix

    def _mut_pcap(self, f, icrc_fix):
        return f, True

    @staticmethod
    def _ip_len(f):
        """IPv4 Total Length and UDP Length from the frame (then the header checksum)."""
        if len(f) >= _BTH and f[12:14] == b"\x08\x00":
            f[_IP + 2:_IP + 4] = (len(f) - _IP).to_bytes(2, "big")
            f[_UDP + 4:_UDP + 6] = (len(f) - _UDP).to_bytes(2, "big")
            f[:] = fix_ip(bytes(f))

    def icrc_bad(self, seed):
        """A frame that passes every check before the ICRC, with a wrong ICRC."""
        f = bytearray(self.readdress(seed))
        if len(f) < _EXT + 4:
            f += bytes(4)
            self._ip_len(f)
            f[:] = fix_icrc(bytes(f))
        i = self.rng.randrange(_EXT, len(f))        # payload or the ICRC itself
        f[i] ^= 1 << self.rng.randrange(8)
        return bytes(f)


def _has(struct, name):
    from hw.headers import wire_fields
    return any(n == name for n, *_ in wire_fields(struct))


# ---- corpus -------------------------------------------------------------------------------------

CORPUS_DIR = Path(__file__).resolve().parent.parent / "tests" / "fuzz_corpus"


def load_corpus(path=None):
    """Every entry of ``path`` (a file or directory; default tests/fuzz_corpus)."""
    p = Path(path) if path else CORPUS_DIR
    files = sorted(p.glob("*.json")) if p.is_dir() else [p]
    out = []
    for fp in files:
        doc = json.loads(fp.read_text())
        if doc.get("version") != 1:
            raise ValueError(f"{fp}: unknown corpus version")
        out.extend(doc["entries"])
    return out


def save_corpus(path, entries):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps({"version": 1, "entries": entries}, indent=1) + "\n")


# ---- the fuzzer ---------------------------------------------------------------------------------

def _run_sync(coro):
    """Run a coroutine whose awaits never suspend (VlTarget's accesses are synchronous)."""
    try:
        while True:
            coro.send(None)
    except StopIteration as e:
        return e.value


class Failure(AssertionError):
    pass


class Fuzzer:
    """The target, its driver, the peers, the model, and the oracles."""

    def __init__(self, *, seed=1, params=None, log=print, mem_every=10):
        self.rng = random.Random(seed)
        self.seed = seed
        self.log = log
        self.params = params
        self.mem_every = mem_every
        self.stats = Counter()            # frames sent by class
        self.status = Counter()           # completions by (role, status name)
        self.findings = []                # (why, entry)
        self.probes_ok = 0
        self.probes_sent = 0        # watchdog probes sent (a HELLO / GOODBYE draw is not)
        self.hangs = 0
        self.hang_frames = []
        self.unauthorized = 0
        self.host_errors = 0
        self.peer_errors = 0
        self.errors = []                  # (side, where, exception repr, traceback tail)
        self.model_mismatch = 0
        self.frames_to_target = 0
        self.restarts = 0
        self.frames_prev = 0              # frames sent to targets given up after a hang
        self.rearms = 0
        self.restart_on_hang = True
        self.rearm_every = 10             # victim QPs back to RTS this often per raw batch
        self.progress_path = None         # summary so far, written after every batch
        self.stop_file = None             # stop (and report) when this file appears
        self.skipped_fault = 0
        self.skipped_known = 0
        self.avoid = []                   # predicates: frames of known (reported) bugs
        self.acc_counters = Counter()     # counter deltas of targets given up after a hang
        self.acc_cycles = 0
        self.batch_frames = []            # frames of the current batch (a hang keeps them)
        self.corpus = []                  # interesting entries
        self._sig_seen = Counter()
        self.seeds = []                   # frames the clean peers sent (valid RoCE)
        self.pcap = []

    # ---- plumbing --------------------------------------------------------------------------
    @property
    def now_us(self):
        return self.vt.cycle * PERIOD_NS / 1000

    def to_target(self, frame, fcs_ok=True):
        self.frames_to_target += 1
        self.vt.send(frame, fcs_ok=fcs_ok)

    def _route(self, frames):
        for t in frames:
            f = t.frame
            if not t.fcs_ok:
                self._finding("tx_fcs", "tx", f, "target sent a frame with a bad FCS")
                continue
            dst = f[0:6]
            if is_roce(f):
                if not icrc_ok(f):
                    self._finding("tx_icrc", "tx", f, "target sent a frame with a bad ICRC")
                if dst == _mac(VICTIM[0]):
                    self._track_epsn(f)
            for ep, mac in ((self.clean, CLEAN[0]), (self.victim, VICTIM[0])):
                if dst in (_mac(mac), b"\xff" * 6):
                    try:
                        ep.receive_frame(f, self.now_us)
                    except Exception as e:          # the peer model is not under test,
                        self._error("peer", "receive_frame", e)     # but must not fail

    def _track_epsn(self, f):
        """The target's expected PSN of a victim QP, from its ACK / NAK (AETH)."""
        op, psn = f[_BTH], int.from_bytes(f[_BTH + 9:_BTH + 12], "big")
        src = int.from_bytes(f[_BTH + 5:_BTH + 8], "big")     # dest = the peer's QPN
        q = {P_QPN[i]: T_QPN[i] for i in VICTIM_QPS}.get(src)
        if q is None or op != 0x11:
            return
        syn = f[_EXT]
        self.mut.epsn[q] = psn if syn == 0x60 else (psn + 1) & 0xFFFFFF

    def net(self):
        """Move frames: target -> peers, peers -> target (no host polling)."""
        self._route(self.vt.run(0))
        now = self.now_us
        for ep, role in ((self.clean, "clean"), (self.victim, "victim")):
            try:
                ep.tick(now)
            except Exception as e:
                self._error("peer", f"{role} tick", e)
            for f in ep.poll_tx():
                if role == "clean" and is_roce(f) and len(self.seeds) < 4000:
                    self.seeds.append(bytes(f))
                self.to_target(f)

    def host(self):
        now_ms = self.vt.cycle * PERIOD_NS / 1e6
        for _ in range(4):
            try:
                h = _run_sync(self.driver.poll(now_ms))
            except Exception as e:                 # carry on; the run fails at its end
                self._error("host", "driver.poll", e)
                h = None
            if h is None:
                break
            self.handled.append(h)
        if now_ms - self._last_tick >= 1.0:
            self._last_tick = now_ms
            try:
                _run_sync(self.driver.tick(now_ms))
            except Exception as e:
                self._error("host", "driver.tick", e)

    def step(self, cycles=STEP):
        self._route(self.vt.run(cycles))
        self.net()
        self.host()

    def run_until(self, cond, max_cycles):
        end = self.vt.cycle + max_cycles
        while not cond():
            if self.vt.cycle >= end:
                return False
            self.step()
        return True

    def drain(self, net=True, extra=2000):
        """Run until every queued frame has entered the target, then ``extra`` cycles."""
        while len(self.vt.rx_log) < self.frames_to_target:
            self._route(self.vt.run(4 * STEP))
            if net:
                self.net()
        self._route(self.vt.run(extra))

    def settle(self, cycles=4000):
        end = self.vt.cycle + cycles
        while self.vt.cycle < end:
            self.step()

    # ---- set-up ----------------------------------------------------------------------------
    def setup(self):
        from host.port import TargetPort
        from model.target import TargetModel
        from roce.rc import RoceEndpoint
        from sim.frameserver import large_config as model_config
        from sim.vltarget import HW_DEFAULT, VlTarget, driver_for
        from sim.scapy_roce import pcap_roce_frames
        from sim.workload import Gen

        p = dict(HW_DEFAULT)
        p.update(self.params or {})
        self.p = p
        t0 = time.monotonic()
        self.vt = VlTarget(self.params, log=self.log)
        self.frames_to_target = 0
        self.cfg = model_config()
        self.model = TargetModel(self.cfg)
        self.port = TargetPort(self.vt.port_access(self.net, every=16))
        self.driver = driver_for(self.port, self.cfg, p)
        self.handled = []
        self._last_tick = 0.0
        self.clean = RoceEndpoint(CLEAN[0], CLEAN[1], seed=self.seed, min_frame=60)
        self.victim = RoceEndpoint(VICTIM[0], VICTIM[1], seed=self.seed + 1, min_frame=60)
        self.mut = Mutator(self.rng, victim_qpns=[T_QPN[i] for i in VICTIM_QPS],
                           protected_qpns=[T_QPN[ROLE_KBTP], T_QPN[ROLE_PROBE]])
        self.events = {q: [] for q in range(4)}
        self.qps = []
        for q in range(4):
            ep, peer = (self.victim, VICTIM) if q in VICTIM_QPS else (self.clean, CLEAN)
            self.qps.append(ep.create_qp(
                qpn=P_QPN[q], dest_qpn=T_QPN[q], remote_ip=T_IP, pmtu=PMTU, timeout=8,
                sq_psn=0x100 * q + 7, epsn=0x1000 + q, on_message=self._on_message(q)))
        self.conns = ["kbtp", "probe"]
        _run_sync(self.port.set_own(T_MAC, T_IP))
        _run_sync(self.driver.init())
        for q in range(4):
            peer = VICTIM if q in VICTIM_QPS else CLEAN
            _run_sync(self.driver.open_qp(
                q, local_qpn=T_QPN[q], remote_qpn=P_QPN[q], peer_mac=peer[0], peer_ip=peer[1],
                udp_sport=0xC100 + q, pmtu=PMTU_CODE, rq_psn=0x100 * q + 7,
                sq_psn=0x1000 + q, timeout=10, retry_cnt=7, rnr_retry=7))
        for c in self.conns:
            self.model.connect(c)
        for ep in (self.clean, self.victim):
            ep.resolve(T_IP)
        if not self.run_until(lambda: all(ep.resolve(T_IP) is not None
                                          for ep in (self.clean, self.victim)), 200_000):
            raise Failure("ARP: no answer from the target")
        from host import codec
        from hw.headers import Features
        for q in (ROLE_KBTP, ROLE_PROBE):
            feat = Features.RECORD_COMPLETION.value if q == ROLE_PROBE else 0
            raw = codec.encode(codec.Hello(requested_features=feat, completion_credits=8,
                                           initiator_id=q + 1))
            got = self.request(q, raw)
            if got is None:
                raise Failure(f"HELLO of QP {q}: no HELLO_ACK")
        im = [self.model.initiator_memory(c) for c in self.conns]
        pm = _PeerMemory(self.clean)
        self.gen = Gen(self.rng, self.model, self.conns, im, [pm, pm])
        # seeds: the victim peer's own traffic (Sends without a session, WRITE / READ /
        # atomics to unknown R_Keys built directly: a real NAK would put its QP in error)
        from sim.paths import DATA_DIR
        self.pcap_loaded = bool(self.pcap)
        for path in sorted(Path(DATA_DIR).glob("*.pcap")):
            try:
                if not self.pcap_loaded:
                    self.pcap += pcap_roce_frames(str(path))
            except Exception as e:
                self.log(f"pcap {path}: {e!r}")
        for q in VICTIM_QPS:
            self.qps[q].send(bytes(24))            # header-only request before HELLO
        self.settle(20_000)
        # The watchdog's baseline (counters and frames sent), so that any test may run first.
        self.snap_counters, self._frames_at_snap = self.counters(), self.frames_to_target
        self.mem_checks = 0
        self.plan = self.driver.plan
        self.lay = self.model.lay
        self.check_memory()
        self.log(f"fuzz: target up in {time.monotonic() - t0:.1f} s (cycle {self.vt.cycle}), "
                 f"{len(self.seeds)} peer frames, {len(self.pcap)} capture frames as seeds")

    def _on_message(self, q):
        def cb(qp, data, imm=None, invalidated_rkey=None):
            self.events[q].append(("SEND", bytes(data), invalidated_rkey) if imm is None
                                  else ("IMM", imm))
        return cb

    # ---- requests through the clean peer (model-checked) ----------------------------------
    def request(self, q, raw, max_cycles=None):
        """Send ``raw`` on clean QP ``q``; the target's reply must equal the model's. Returns
        the observed events, or None on a hang."""
        from model.target import SendMsg, WriteImm
        conn = self.conns[q]
        max_cycles = max_cycles or PROBE_CYCLES
        exp = []
        for a in self.model.receive(conn, raw, now_ms=self.vt.cycle * PERIOD_NS / 1e6):
            if isinstance(a, SendMsg):
                exp.append(("SEND", a.payload, a.invalidate_stag))
            elif isinstance(a, WriteImm):
                exp.append(("IMM", a.imm, a.stag, a.to, a.data))
        self.events[q].clear()
        try:
            self.qps[q].send(raw)
        except RuntimeError as e:               # the peer's QP went to error
            self.hangs += 1
            self._finding("peer_qp_error", "kbtp", raw, f"QP {q}: {e}", role=q)
            return None
        n = max(len(exp), 1)
        ok = self.run_until(lambda: len(self.events[q]) >= n and not self.qps[q].outstanding,
                            max_cycles)
        if not ok:
            self.hangs += 1
            self._finding("hang", "kbtp", raw, f"QP {q}: no reply within {max_cycles} cycles; "
                          f"expected {exp}", role=q)
            return None
        self.settle(STEP * 2)
        got = list(self.events[q])
        from sim.system import same_events
        # Records by their Immediate only: the fuzzer does not own the initiator's memory.
        if not same_events(exp, got):
            self.model_mismatch += 1
            self._finding("model", "kbtp", raw, f"QP {q}: target {got} vs model {exp}", role=q)
        from host import codec
        for e in got:
            if e[0] == "SEND":
                try:
                    st = codec.decode(e[1]).status
                    name = _status_name(st)
                except Exception:
                    name = "undecodable"
                self.status[(("kbtp", "probe")[q], name)] += 1
            else:
                self.status[(("kbtp", "probe")[q], "record")] += 1
        return got

    def _error(self, side, where, e):
        """An exception of the host driver (``side`` "host") or of a peer RC endpoint ("peer").
        Neither is under fuzz, so any is a failure of the run (:meth:`check_errors`); the run
        carries on to the end so that its figures are still reported."""
        if side == "host":
            self.host_errors += 1
        else:
            self.peer_errors += 1
        tb = traceback.format_exception(e)
        self.errors.append((side, where, repr(e), "".join(tb[-3:]).strip()))
        if len(self.errors) <= 5:
            self.log(f"{side} error in {where}: {e!r}")

    def check_errors(self):
        """Raise :class:`Failure` naming the first errors if the driver or a peer raised."""
        if self.errors:
            side, where, e, tb = self.errors[0]
            raise Failure(f"{self.host_errors} host-driver and {self.peer_errors} peer errors; "
                          f"first: {side} {where}: {e}\n{tb}; all: "
                          f"{[x[:3] for x in self.errors[:10]]}")

    def _finding(self, why, kind, data, text, role=None, cls=None, fcs_ok=True):
        entry = {"name": f"{why}-{len(self.findings)}-s{self.seed}", "class": cls or kind,
                 "kind": kind, "hex": bytes(data).hex(), "fcs_ok": fcs_ok, "why": text[:2000]}
        self.findings.append(entry)
        self.log(f"FINDING {why}: {text[:600]}")

    # ---- oracles ----------------------------------------------------------------------------
    def counters(self):
        from hw.iface import REG_TRANSPORT
        from hw.target.regbank import TOP_COUNTER_BASE
        from hw.iface import REG_TOP
        from hw.target.target import RESP_COUNTERS, TOP_COUNTERS
        out = {}
        for k, (blk, port) in enumerate(TOP_COUNTERS):
            out[f"{blk}.{port}"] = self.vt.access(_REG, REG_TOP + TOP_COUNTER_BASE + 4 * k,
                                                  0, 0)[0]
        for k, name in enumerate(RESP_COUNTERS):
            out[f"resp.{name}"] = self.vt.access(_REG, REG_TRANSPORT + 4 * k, 0, 0)[0]
        return out

    def probe(self):
        """Watchdog: one valid request from the clean probe peer, model-checked."""
        raw = self.small_request(ROLE_PROBE)
        if len(raw) >= 2 and raw[1] in (Opcode.HELLO.value, Opcode.GOODBYE.value):
            return True
        self.probes_sent += 1
        got = self.request(ROLE_PROBE, raw)
        if got is not None:
            self.probes_ok += 1
        return got is not None

    def faults(self, q, raw):
        """Would the model's run of ``raw`` touch initiator memory it may not (a fault)?"""
        m = copy.deepcopy(self.model)
        acts = m.receive(self.conns[q], raw, now_ms=self.vt.cycle * PERIOD_NS / 1e6)
        return any(getattr(a, "error", None) for a in acts)

    def small_request(self, q):
        """A valid request of session ``q`` moving at most 256 octets (quick to serve):
        ALLOC_STORE inline, LOAD, STORE inline or by RDMA READ, FREE."""
        from host import codec
        from hw.headers import ReqFlags
        from sim.workload import build
        r, m = self.rng, self.model
        s = m.session_of(self.conns[q])
        hs = range(s.handle_base, s.handle_base + s.handle_count)
        bound = [h for h in hs if m.read_entry(h)["flags"] & 1]
        free = [h for h in hs if not m.read_entry(h)["flags"] & 1]
        self.gen.rid += 1
        rid = r.getrandbits(32) << 32 | self.gen.rid
        k = r.random()
        if bound and (k < 0.2 or len(bound) > 10):
            return codec.encode(codec.Free(request_id=rid, handle=r.choice(bound),
                                           generation=0))
        data = bytes(r.getrandbits(8) for _ in range(r.choice((1, 8, 64, 200))))
        seal = ReqFlags.SEAL.value if r.random() < 0.3 else 0
        if k < 0.55 or not bound:
            return build(Opcode.ALLOC_STORE, flags=ReqFlags.INLINE.value | seal, rid=rid,
                         handle=r.choice(free or list(hs)), length=len(data), inline=data)
        h = r.choice(bound)
        if k < 0.75:
            stag, to = self.gen.buffer(q, 256)
            return build(Opcode.LOAD, flags=ReqFlags.ALLOW_UNSEALED.value, rid=rid, handle=h,
                         stag=stag, to=to, length=256)
        if k < 0.88:
            return build(Opcode.STORE, flags=ReqFlags.INLINE.value | seal, rid=rid, handle=h,
                         length=len(data), inline=data)
        stag, to = self.gen.buffer(q, len(data), access="r", data=data)
        return build(Opcode.STORE, flags=seal, rid=rid, handle=h, stag=stag, to=to,
                     length=len(data))

    def free_request(self, q):
        """A FREE of one of the session's bound handles (slow path: the driver)."""
        from host import codec
        s = self.model.session_of(self.conns[q])
        bound = [h for h in range(s.handle_base, s.handle_base + s.handle_count)
                 if self.model.read_entry(h)["flags"] & 1]
        h = self.rng.choice(bound) if bound else s.handle_base
        self.gen.rid += 1
        return codec.encode(codec.Free(request_id=self.gen.rid, handle=h, generation=0))

    def check_memory(self, full=False):
        """Oracle 2. The KBTP structures (without the pool unless ``full``: reading 4 MiB over
        the host bus costs about a minute here) must equal the model's image; the driver's
        scratch and receive buffers may change; every other octet must still be zero (as
        after set-up: the driver writes only ``[0, layout size)``)."""
        size = self.p["mem_words"] * 8
        lay = self.lay
        lay_end = lay["size"]
        lo, hi = self.plan["engine_scratch"], self.plan["end"]
        kb = [(0, lay_end)] if full else [(0, lay["pool"])]
        bad = []
        for a, b in kb:
            got, want = self.vt.mem_read(a, b - a), bytes(self.model.mem[a:b])
            if got != want:
                diff = [i for i in range(b - a) if got[i] != want[i]]
                k = diff[0]
                bad.append(f"KBTP structures differ from the model at {a + k:#x} ({len(diff)} "
                           f"octets): target {got[k:k + 16].hex()} model {want[k:k + 16].hex()}")
                self.unauthorized += len(diff)
        for a, b in ((lay_end, lo), (hi, size)):
            got = self.vt.mem_read(a, b - a)
            if got.count(0) != len(got):
                diff = [i for i in range(len(got)) if got[i]]
                bad.append(f"{len(diff)} octet(s) written outside authorized areas, first at "
                           f"{a + diff[0]:#x}: {got[diff[0]:diff[0] + 16].hex()}")
                self.unauthorized += len(diff)
        self.mem_checks += 1
        for b in bad:
            self._finding("unauthorized", "memory", b"", b)
        return not bad

    # ---- the batches -------------------------------------------------------------------------
    def seed_frame(self):
        r = self.rng
        if self.pcap and r.random() < 0.15:
            return self.mut.readdress(r.choice(self.pcap))
        if self.seeds and r.random() < 0.8:
            return self.mut.readdress(r.choice(self.seeds[-800:]))
        return self.synthetic()

    def synthetic(self):
        """A WRITE / READ / atomic / SEND of the victim peer, valid as a frame."""
        from roce.frames import build_roce
        r = self.rng
        q = r.choice(VICTIM_QPS)
        op = r.choice((0x04, 0x0A, 0x0C, 0x13, 0x14, 0x06, 0x00))
        ext = bytes(_ext_len(op))
        if op in (0x0A, 0x0C, 0x06):
            ext = pack(RETH, va=r.choice((0, 0x10000)), rkey=r.choice((0, 0x100, 0x1234)),
                       dma_length=r.choice((8, 64, 1024)))
        elif op in (0x13, 0x14):
            ext = pack(AtomicETH, va=0, rkey=0x100, swap_add=1, compare=0)
        payload = b""
        if op in (0x04, 0x00, 0x0A, 0x06):
            payload = bytes(r.getrandbits(8) for _ in range(r.choice((24, 40, 64, 256,
                                                                       1024 if op != 4 else 1))))
        f = build_roce(_mac(VICTIM[0]), _mac(T_MAC), int.from_bytes(_ip(VICTIM[1]), "big"),
                       int.from_bytes(_ip(T_IP), "big"), 0xC100 + q, opcode=op,
                       dest_qp=T_QPN[q], psn=self.mut.epsn[T_QPN[q]], ackreq=1, ext=ext,
                       payload=payload)
        return self.mut.no_hello(f)

    def rearm(self):
        """Victim QPs back to RTS (a NAK puts the target's QP in error, and a QP in error
        drops everything: the fuzz would stop reaching the responder), PSNs as last seen."""
        from hw.iface import QpState
        pl = self.plan
        size = 1 << pl["recv_log2"]
        for q in VICTIM_QPS:
            psn = self.mut.epsn.get(T_QPN[q], 0)
            try:
                _run_sync(self.port.set_qp(
                    q, state=QpState.RTS, local_qpn=T_QPN[q], remote_qpn=P_QPN[q],
                    peer_mac=VICTIM[0], peer_ip=VICTIM[1], udp_sport=0xC100 + q,
                    pmtu=PMTU_CODE, rq_psn=psn, sq_psn=0x1000 + q, timeout=10, retry_cnt=7,
                    rnr_retry=7, recv_base=pl["recv"] + q * pl["recv_count"] * size,
                    recv_count=pl["recv_count"], recv_size_log2=pl["recv_log2"]))
                self.rearms += 1
            except Exception as e:
                self._error("host", f"rearm QP {q}", e)

    def raw_batch(self, n):
        """``n`` mutated frames of the RAW_MIX classes, back to back."""
        classes, weights = zip(*RAW_MIX.items())
        if self.rearm_every:
            k = max(1, n // self.rearm_every)
            for part in range(0, n, k):
                self.rearm()
                self._raw(min(k, n - part), classes, weights)
            self.settle(3 * STEP)
            return
        self._raw(n, classes, weights)
        self.settle(3 * STEP)

    def _raw(self, n, classes, weights):
        for _ in range(n):
            cls = self.rng.choices(classes, weights)[0]
            seed = self.seed_frame() if cls != "pcap" or not self.pcap else \
                self.mut.readdress(self.rng.choice(self.pcap))
            f = self.mut.mutate(cls, seed)
            if any(a(f) for a in self.avoid):
                self.skipped_known += 1
                continue
            fcs_ok = self.rng.random() > 0.02
            self.batch_frames.append((cls, f, fcs_ok))
            self.stats[cls] += 1
            self._maybe_keep(cls, f, fcs_ok)
            self.to_target(f, fcs_ok=fcs_ok)
            if self.rng.random() < 0.1:
                self.step(64)
        self.drain()

    def _maybe_keep(self, cls, f, fcs_ok):
        """Corpus: the first frames of each (class, header shape) seen."""
        sig = (cls, fcs_ok, len(f) < 60, f[12:14] == b"\x08\x00",
               is_roce(f), f[_BTH] if is_roce(f) else None, icrc_ok(f) if is_roce(f) else None)
        self._sig_seen[sig] += 1
        self._sig_seen[("class", cls)] += self._sig_seen[sig] == 1
        if self._sig_seen[sig] == 1 and self._sig_seen[("class", cls)] <= CORPUS_PER_CLASS:
            self.corpus.append({"name": f"{cls}-{len(self.corpus)}-s{self.seed}", "class": cls,
                                "kind": "frame", "hex": f.hex(), "fcs_ok": fcs_ok,
                                "why": "first of its shape"})

    def exact_batch(self, cls, n):
        """Oracle 4: ``n`` frames with a wrong ICRC (or FCS) alone on the wire."""
        self.settle(2 * STEP)
        key = "icrc.cnt_bad" if cls == "icrc_bad" else "mac.rx_fcs_errors"
        before = self.counters()[key]
        sent = []
        for _ in range(n):
            seed = self.seed_frame()
            if cls == "icrc_bad":
                f, ok = self.mut.icrc_bad(seed), True
            else:
                f, ok = bytes(seed).ljust(60, b"\0"), False
            sent.append(f)
            self.stats[cls] += 1
            self.to_target(f, fcs_ok=ok)
        # no step(): the peers stay silent until the counter is read (their frames are good
        # anyway, but a retransmission must not race the count)
        self.drain(net=False)
        after = self.counters()[key]
        if after - before != n:
            self._finding(f"{cls.split('_')[0]}_count", "frame", sent[0],
                          f"{key} moved by {after - before}, {n} {cls} frames sent", cls=cls,
                          fcs_ok=cls != "fcs_bad")
        if self.stats[cls] <= n:
            for f in sent[:2]:
                self.corpus.append({"name": f"{cls}-{len(self.corpus)}-s{self.seed}",
                                    "class": cls, "kind": "frame", "hex": f.hex(),
                                    "fcs_ok": cls != "fcs_bad", "why": "exact count"})
        self.settle(2 * STEP)

    def kbtp_batch(self, n):
        """Oracle 3: mutated KBTP messages on QP 0's valid transport, model-checked."""
        from hw.headers import Status
        for _ in range(n):
            base = self.small_request(ROLE_KBTP)
            raw = kbtp_mutate(self.rng, base) if self.rng.random() < 0.9 else base
            want = expected_status(raw, self.cfg)
            if want is None and self.faults(ROLE_KBTP, raw):
                # a valid request on a buffer the peer does not have: the peer's NIC answers
                # with a NAK and puts its QP in error (model Reading 10); not this oracle
                self.skipped_fault += 1
                continue
            self.stats["kbtp"] += 1
            self.batch_frames.append(("kbtp", raw, True))
            got = self.request(ROLE_KBTP, raw)
            if got is None:
                self.restart()
                return
            if want is None:
                continue
            from host import codec
            sends = [e for e in got if e[0] == "SEND"]
            st = None
            if len(sends) == 1:
                try:
                    m = codec.decode(sends[0][1])
                    st = m.status if m.OPCODE is Opcode.COMPLETION else None
                except Exception:
                    st = None
            if st != want:
                self._finding("malformed", "kbtp", raw,
                              f"codec says {_status_name(want)}, target answered {got}")
            elif self._sig_seen[("kbtp", want, raw[1] if len(raw) > 1 else None)] == 0:
                self._sig_seen[("kbtp", want, raw[1] if len(raw) > 1 else None)] += 1
                self._sig_seen[("class", "kbtp")] += 1
                if self._sig_seen[("class", "kbtp")] <= 2 * CORPUS_PER_CLASS:
                    self.corpus.append({"name": f"kbtp-{len(self.corpus)}-s{self.seed}",
                                        "class": "kbtp", "kind": "kbtp", "hex": raw.hex(),
                                        "fcs_ok": True,
                                        "why": f"expect COMPLETION {Status(want).name}"})

    def watchdog(self):
        """Oracle 1 after a batch: the MAC saw every frame, and the probe completes."""
        self.drain()
        self.settle(2 * STEP)
        self.drain()
        c = self.counters()
        mac = sum(c[f"mac.{k}"] - self.snap_counters[f"mac.{k}"] for k in
                  ("rx_frames_ok", "rx_fcs_errors", "rx_runts", "rx_errors", "rx_overflows"))
        if mac != self.frames_to_target - self._frames_at_snap:
            self._finding("mac_count", "counters", b"",
                          f"MAC receive counters moved by {mac}, "
                          f"{self.frames_to_target - self._frames_at_snap} frames sent")
        self.snap_counters, self._frames_at_snap = c, self.frames_to_target
        ok = self.probe()
        if not ok and self.restart_on_hang:
            self.restart()
        self.batch_frames = []
        return ok

    def restart(self):
        """After a hang: keep the batch's frames as findings, start a fresh target."""
        for cls, f, fcs_ok in self.batch_frames:
            if cls != "kbtp":
                self.hang_frames.append({"class": cls, "hex": f.hex(), "fcs_ok": fcs_ok})
        c = self.counters()
        for k, v in c.items():
            self.acc_counters[k] += v - self.first_counters.get(k, 0)
        self.acc_cycles += self.vt.cycle - self._c0
        self.frames_prev += self.frames_to_target
        self.vt.close()
        self.restarts += 1
        self.log(f"fuzz: restarting the target after a hang (restart {self.restarts})")
        self.setup()
        self.first_counters = self.snap_counters = self.counters()
        self._frames_at_snap = self.frames_to_target
        self._c0 = self.vt.cycle

    # ---- main loop -----------------------------------------------------------------------------
    def run(self, frames, *, batch=1000, kbtp_share=0.02, exact_every=5):
        t0 = time.monotonic()
        self._c0 = self.vt.cycle
        self.first_counters = self.counters()
        self._frames_at_snap = self.frames_to_target
        self.snap_counters = self.first_counters
        self.interrupted = False
        try:
            self._loop(frames, batch, kbtp_share, exact_every, t0)
        except KeyboardInterrupt:        # SIGINT: stop early, still check and report
            self.interrupted = True
            self.log(f"fuzz: interrupted after {self.total_fuzzed()} frames")
        self.settle(20_000)
        self.watchdog()
        self.check_memory(full=not self.interrupted)
        self.wall = time.monotonic() - t0
        self.cycles = self.vt.cycle - self._c0 + self.acc_cycles
        self.last_counters = self.counters()
        self.check_errors()

    def _loop(self, frames, batch, kbtp_share, exact_every, t0):
        b = 0
        while self.total_fuzzed() < frames:
            left = frames - self.total_fuzzed()
            n = min(batch, left)
            if b % exact_every == exact_every - 1:
                k = max(1, min(n // 4, 25))
                self.exact_batch("icrc_bad", k)
                self.exact_batch("fcs_bad", min(k, max(1, left - k)) if left > k else 0) \
                    if left > k else None
            else:
                nk = max(1, int(n * kbtp_share)) if n > 4 else 0
                self.kbtp_batch(nk)
                self.raw_batch(n - nk)
            self.watchdog()
            b += 1
            if b % self.mem_every == 0:
                self.check_memory()
            if self.progress_path:
                self.wall = time.monotonic() - t0
                self.cycles = self.vt.cycle - self._c0 + self.acc_cycles
                self.last_counters = self.counters()
                Path(self.progress_path).write_text(json.dumps(self.summary(), indent=1))
            if self.stop_file and Path(self.stop_file).exists():
                raise KeyboardInterrupt
            if b % 5 == 0:
                dt = time.monotonic() - t0
                self.log(f"fuzz: {self.total_fuzzed()} frames, cycle {self.vt.cycle}, "
                         f"{self.total_fuzzed() / max(dt, 1e-9):.0f} frames/s, probes "
                         f"{self.probes_ok}, hangs {self.hangs}, findings {len(self.findings)}")

    def total_fuzzed(self):
        return sum(self.stats.values())

    def summary(self):
        d = {k: self.last_counters[k] - self.first_counters[k] + self.acc_counters[k]
             for k in self.last_counters}
        hostd = {}
        for h in self.handled:
            hostd[h.op] = hostd.get(h.op, 0) + 1
        return {
            "frames": self.total_fuzzed(), "interrupted": getattr(self, "interrupted", False),
            "frames_by_class": dict(sorted(self.stats.items())),
            "frames_to_target_total": self.frames_prev + self.frames_to_target,
            "counters_moved": {k: v for k, v in sorted(d.items()) if v},
            "completions_by_status": {f"{r}:{s}": n for (r, s), n in sorted(self.status.items())},
            "probes_ok": self.probes_ok, "probes_sent": self.probes_sent,
            "memory_checks": self.mem_checks,
            "unauthorized_writes": self.unauthorized,
            "hangs": self.hangs, "model_mismatches": self.model_mismatch,
            "findings": len(self.findings), "restarts_after_hang": self.restarts,
            "skipped_known_bug_frames": self.skipped_known,
            "kbtp_skipped_initiator_fault": self.skipped_fault,
            "victim_qp_rearms": self.rearms, "host_errors": self.host_errors,
            "peer_errors": self.peer_errors, "host_handled": hostd,
            "cycles": self.cycles, "wall_s": round(self.wall, 1),
            "frames_per_s": round(self.total_fuzzed() / max(self.wall, 1e-9), 1),
            "cycles_per_s": round(self.cycles / max(self.wall, 1e-9)),
        }

    def close(self):
        self.vt.close()

    # ---- corpus replay -------------------------------------------------------------------
    def replay(self, entries):
        """Send every corpus entry; the oracles run after each one. Returns failures."""
        fails = []
        for e in entries:
            n0 = len(self.findings)
            raw = bytes.fromhex(e["hex"])
            if e["kind"] == "kbtp":
                self.stats["kbtp"] += 1
                want = expected_status(raw, self.cfg)
                got = self.request(ROLE_KBTP, raw)
                if got is not None and want is not None:
                    from host import codec
                    sends = [x for x in got if x[0] == "SEND"]
                    st = codec.decode(sends[0][1]).status if len(sends) == 1 else None
                    if st != want:
                        self._finding("malformed", "kbtp", raw, f"{e['name']}: {got}")
            elif e["kind"] == "frame":
                f = raw
                if dest_qpn(f) in (T_QPN[ROLE_KBTP], T_QPN[ROLE_PROBE]) \
                        and f[0:6] == _mac(T_MAC):
                    raise ValueError(f"corpus entry {e['name']} targets a clean QP")
                self.stats[e["class"]] += 1
                self.to_target(f, fcs_ok=e["fcs_ok"])
                self.settle(STEP)
            self.watchdog()
            if len(self.findings) > n0:
                fails.append((e["name"], self.findings[n0:]))
        self.check_memory()
        self.check_errors()
        return fails


_REG = 0


def _init_reg():
    global _REG
    from hw.iface import Space
    _REG = Space.REG.value


def _status_name(v):
    from hw.headers import Status
    try:
        return Status(v).name
    except ValueError:
        return f"status_{v}"


class _PeerMemory:
    """The initiator buffers on the clean RC endpoint under the model's ``register`` API."""

    def __init__(self, ep):
        self.ep, self.bufs = ep, {}

    def register(self, stag, data, *, base_to=0, access="rw"):
        buf = bytearray(data)
        self.ep.register(buf, base_va=base_to, rkey=stag, read="r" in access,
                         write="w" in access)
        self.bufs[stag] = buf


def replay(path=None, *, seed=1, params=None, log=print):
    """Replay the corpus on a fresh target; returns (fuzzer, failures)."""
    _init_reg()
    fz = Fuzzer(seed=seed, params=params, log=log)
    fz.setup()
    fz.first_counters = fz.counters()
    fz._frames_at_snap = fz.frames_to_target
    fz.snap_counters = fz.first_counters
    t0, c0 = time.monotonic(), fz.vt.cycle
    fails = fz.replay(load_corpus(path))
    fz.wall, fz.cycles = time.monotonic() - t0, fz.vt.cycle - c0
    fz.last_counters = fz.counters()
    return fz, fails


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m tools.fuzz", description=__doc__.split("\n")[0])
    ap.add_argument("--frames", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--mem-every", type=int, default=2, help="memory check every N batches")
    ap.add_argument("--corpus-out", default=None,
                    help="write the interesting frames (and findings) to this JSON file")
    ap.add_argument("--replay", default=None, help="replay a corpus file/dir instead")
    ap.add_argument("--json", default=None, help="write the summary here")
    ap.add_argument("--progress", default=None, help="summary so far, after every batch")
    ap.add_argument("--stop-file", default=None, help="stop early (and report) when it exists")
    ap.add_argument("--kbtp-share", type=float, default=0.02,
                    help="share of each batch sent as KBTP messages on QP 0")
    ap.add_argument("--keep-known", action="store_true",
                    help="also send frames of the known bugs (KNOWN_BUGS): they stop the target, "
                         "which is then restarted")
    a = ap.parse_args(argv)
    _init_reg()
    error = None
    if a.replay:
        try:
            fz, fails = replay(a.replay, seed=a.seed)
        except Failure as e:
            print(f"FAILED: {e}")
            return 1
        s = fz.summary()
    else:
        fz = Fuzzer(seed=a.seed, mem_every=a.mem_every)
        fz.progress_path, fz.stop_file = a.progress, a.stop_file
        if not a.keep_known:
            fz.avoid = list(KNOWN_BUGS.values())
        fz.setup()
        try:
            fz.run(a.frames, batch=a.batch, kbtp_share=a.kbtp_share)
        except Failure as e:                    # host-driver / peer errors: report, exit 1
            error = e
        s = fz.summary()
        if a.corpus_out:
            save_corpus(a.corpus_out, fz.findings + fz.corpus)
            Path(a.corpus_out).with_suffix(".hang.json").write_text(
                json.dumps(fz.hang_frames, indent=1))
    for k, v in s.items():
        print(f"{k}: {v}")
    for f in fz.findings[:20]:
        print(f"finding: {f['name']}: {f['why'][:400]}")
    if a.json:
        Path(a.json).write_text(json.dumps(s, indent=1, default=str))
    fz.close()
    if error is not None:
        print(f"FAILED: {error}")
    bad = s["hangs"] or s["unauthorized_writes"] or fz.findings or fz.errors
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

# Ref: draft KBTP §Messages, §Operations, §Status Codes; hw/headers.py (every field packed from
#      the one headers module); model/target.py (the oracle the requests are played against).
"""Random KBTP request workloads for the benches that check the gateware against the golden model.

:func:`build` packs a request straight from :mod:`hw.headers` (so malformed ones can be made as
easily as good ones); :class:`Gen` draws random requests (valid ones mostly, errors on purpose)
for the engine unit test (tests/hw/kbtp/test_kbtp_engine.py), the system benches (sim/system.py) and
the fuzzer (tools/fuzz.py).
"""

from hw.headers import (CommonHeader, CompletionDescriptor, DataDescriptor, Opcode, ReqFlags,
                        pack, wire_fields)
from hw.kbtp.engine import FAST_OPS

__all__ = ["build", "to_addr_le", "Gen"]


def build(op, *, flags=0, rid=0, handle=0, gen=0, status=0, version=1, stag=0, to=0,
          length=0, cdesc=None, inline=b"", extra=b""):
    """Request bytes packed straight from hw.headers (so malformed ones can be made too)."""
    raw = pack(CommonHeader, version=version, opcode=op.value, flags=flags, request_id=rid,
               handle=handle, generation=gen, status=status)
    raw += pack(DataDescriptor, stag=stag, tagged_offset=to, length=length)
    if cdesc is not None:
        raw += pack(CompletionDescriptor, stag=cdesc[0], tagged_offset=cdesc[1],
                    reserved=cdesc[2] if len(cdesc) > 2 else 0)
    return raw + inline + extra


#: (octet offset, octets) of the fields ADDR_LE turns little-endian in a request with a
#: Completion Descriptor (host/codec.py: Block Handle; Data Descriptor STag, Tagged Offset,
#: Length; Completion Descriptor STag, Tagged Offset), from the hw.headers layouts.
_LE_SPANS = tuple(
    (base + off, bits // 8)
    for struct, base, names in ((CommonHeader, 0, ("handle",)),
                                (DataDescriptor, CommonHeader.SIZE,
                                 ("stag", "tagged_offset", "length")),
                                (CompletionDescriptor, CommonHeader.SIZE + DataDescriptor.SIZE,
                                 ("stag", "tagged_offset")))
    for name, off, bits, _ in wire_fields(struct) if name in names)


def to_addr_le(raw, cdesc):
    """A request packed by :func:`build` as an ADDR_LE initiator sends it: the listed fields
    octet-reversed (those of the Completion Descriptor only when ``cdesc``; a field cut short
    by a truncated request is left as it is)."""
    raw = bytearray(raw)
    cd = CommonHeader.SIZE + DataDescriptor.SIZE
    for a, n in _LE_SPANS:
        if (a < cd or cdesc) and a + n <= len(raw):
            raw[a:a + n] = raw[a:a + n][::-1]
    return bytes(raw)


class Gen:
    """Random request generator (valid requests mostly, errors on purpose)."""

    def __init__(self, rng, model, conns, imems_model, imems_hw):
        self.rng, self.model, self.conns = rng, model, conns
        self.im_m, self.im_h = imems_model, imems_hw
        self.stag = 0x1000
        self.rid = 0

    def buffer(self, q, size, access="rw", data=None):
        """Register one fresh buffer on both initiator memories; return (stag, to)."""
        self.stag += 1
        to = self.rng.choice([0, 0x10000, 0x7FFF_0000_0000])
        if data is None:
            data = bytes(self.rng.getrandbits(8) for _ in range(size))
        for im in (self.im_m[q], self.im_h[q]):
            im.register(self.stag, data, base_to=to, access=access)
        return self.stag, to

    def handle(self, q):
        s = self.model.session_of(self.conns[q])
        r = self.rng.random()
        bound = [h for h in range(s.handle_base, s.handle_base + s.handle_count)
                 if self.model.read_entry(h)["flags"] & 1]
        if bound and r < 0.45:
            return self.rng.choice(bound)
        if r < 0.8:
            return s.handle_base + self.rng.randrange(min(s.handle_count, 12))
        if r < 0.9:
            other = self.model.session_of(self.conns[(q + 1) % len(self.conns)])
            return other.handle_base + self.rng.randrange(4)
        return self.rng.choice([0, self.model.cfg.table_base_handle - 1,
                                self.model.cfg.table_base_handle + self.model.cfg.num_handles,
                                1 << 63])

    def make(self, q):
        rng, cfg = self.rng, self.model.cfg
        s = self.model.session_of(self.conns[q])
        op = rng.choice(FAST_OPS)
        h = self.handle(q)
        self.rid += 1
        rid = (rng.getrandbits(32) << 32) | self.rid
        gen = 0
        if rng.random() < 0.3 and self.model._in_table(h):
            e = self.model.read_entry(h)["generation"]
            gen = e if rng.random() < 0.7 else ((e + 1) & 0xFFFF or 2)
        flags = 0
        cdesc = None
        if rng.random() < 0.3:
            flags |= ReqFlags.RECORD.value
            cdesc = self.buffer(q, 24) if rng.random() < 0.9 else (0xDEAD, 0)
        kw = dict(rid=rid, handle=h, gen=gen)
        if op is Opcode.LOAD:
            if rng.random() < 0.5:
                flags |= ReqFlags.ALLOW_UNSEALED.value
            if rng.random() < 0.2:
                flags |= ReqFlags.INVALIDATE.value
            size = rng.choice([cfg.block_size, cfg.block_size, 64, 8, 300])
            stag, to = self.buffer(q, max(size, 1)) if rng.random() < 0.93 else (0xBAD, 0)
            raw = build(op, flags=flags, stag=stag, to=to, length=size, cdesc=cdesc, **kw)
        else:
            if rng.random() < 0.4:
                flags |= ReqFlags.SEAL.value
            if rng.random() < 0.5:
                flags |= ReqFlags.INLINE.value
                n = rng.choice([0, 1, 7, 8, 64, 100, cfg.max_inline, cfg.max_inline + 8])
                data = bytes(rng.getrandbits(8) for _ in range(n))
                raw = build(op, flags=flags, length=n, cdesc=cdesc, inline=data, **kw)
            else:
                if rng.random() < 0.2:
                    flags |= ReqFlags.INVALIDATE.value
                n = rng.choice([0, 5, 64, 200, cfg.block_size, cfg.block_size + 1])
                stag, to = self.buffer(q, max(n, 1), access="r") if rng.random() < 0.93 \
                    else (0xBAD, 0)
                raw = build(op, flags=flags, stag=stag, to=to, length=n, cdesc=cdesc, **kw)
        if s is not None and s.addr_le:
            raw = to_addr_le(raw, cdesc is not None)
        if rng.random() < 0.12:
            raw = self.corrupt(raw)
        return raw

    def corrupt(self, raw):
        raw = bytearray(raw)
        k = self.rng.randrange(7)
        if k == 0:
            raw[0] = 2                                    # version
        elif k == 1:
            raw[3] |= self.rng.choice([0x20, 0x01, 0x02, 0x80])   # flag bits
        elif k == 2:
            raw[23] = 1                                   # status in a request
        elif k == 3:
            raw += b"\0" * self.rng.choice([1, 8, 16])    # trailing octets / inline mismatch
        elif k == 4:
            raw = raw[:self.rng.choice([24, 30, 39, len(raw) - 1])]
        elif k == 5:
            raw[24] = 0x55                                # STag with INLINE / any
        else:
            raw[3] |= ReqFlags.RECORD.value               # RECORD without its descriptor
        return bytes(raw)

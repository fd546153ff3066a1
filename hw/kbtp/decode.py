# Ref: draft KBTP §Messages (common header, Data / Completion Descriptors), §Block Table,
#      §Operations (Block Load, Block Mapped Store, Block Unmapped Store), §Allocation Quotas;
#      docs/layouts.md; host/codec.py (strictness); model/target.py "Readings of the draft" 6-9.
"""The KBTP engine's request decoder: combinational, message and table entry in, verdicts out.

It owns the reading of a fast-path message (the fields of :data:`REQUEST`), the decode checks
of host/codec.py (MALFORMED, TOO_LARGE of an inline payload), the authorization (LOAD: the
handle's initiator range; STORE, ALLOC_STORE: the session's handles), the table entry's address
and fields (:data:`ENTRY`) and the entry checks in the golden model's order. The engine's FSM
asks it two questions: ``dispatch`` (after the message is read) and ``entry_next`` (after the
entry is read); where the answer is to complete the request, ``d_result`` / ``e_result`` is the
result to send.
"""

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import data, enum, wiring
from amaranth.lib.wiring import In, Out

from hw.headers import (ALLOWED_FLAGS, KBTP_VERSION, CommonHeader, CompletionDescriptor,
                        DataDescriptor, EntryFlags, Opcode, ReqFlags, Status, TableEntry)
from hw.iface import ADDR_BITS
from hw.kbtp.engine_regs import SESSION
from hw.kbtp.regmap import CONFIG
from hw.lib.membus import be_field, bswap

__all__ = ["RequestDecoder", "Dispatch", "EntryNext", "REQUEST", "ENTRY", "RESULT", "MSG_WORDS",
           "entry_boff"]

MSG_WORDS = 7           # header 24 + Data Descriptor 16 + Completion Descriptor 16 = 56 octets
MSG_BYTES = 8 * MSG_WORDS
_DD = CommonHeader.SIZE
_CD = _DD + DataDescriptor.SIZE

#: The fields of a fast-path request the engine's blocks use.
REQUEST = data.StructLayout({
    "is_load": 1, "is_store": 1, "is_alloc": 1,
    "op_idx": 2,                    # COUNT's op: 0 LOAD, 1 STORE, 2 ALLOC_STORE
    "inline": 1, "seal": 1, "record": 1, "inval": 1, "unsealed": 1,
    "request_id": 64, "handle": 64, "gen": 16,
    "dd_stag": 32, "dd_to": 64, "dd_len": 32, "cd_stag": 32, "cd_to": 64,
    "pos": 16,                      # octet of the inline payload in the message
})
#: The table entry (and the Generation a bind gives it).
ENTRY = data.StructLayout({"flags": 16, "gen": 16, "dlen": 32, "boff": 64, "next_gen": 16})
#: The result of a request, as the COMPLETION / record carries it; ``raw``: a decode-level
#: error (no invalidation, no record).
RESULT = data.StructLayout({"status": 16, "gen": 16, "dlen": 32, "boff": 64, "raw": 1})


class Dispatch(enum.Enum, shape=2):
    """What to do with a message just read."""
    HOSTQ = 0           # not a fast-path opcode: the host's
    COMPLETE = 1        # refused: complete with ``d_result``
    READ_ENTRY = 2      # read its table entry


class EntryNext(enum.Enum, shape=3):
    """What to do after the entry checks."""
    COMPLETE = 0        # complete with ``e_result``
    LOAD_WRITE = 1      # LOAD: RDMA WRITE of the block to the initiator
    OBTAIN = 2          # STORE: get the data into the block
    RING_ALLOC = 3      # ALLOC_STORE: take a block from the ring


class RequestDecoder(wiring.Component):
    """Combinational decoder of fast-path requests (see the module docstring).

    Ports
    -----
    msg : In(8 * MSG_BYTES)     the message's first MSG_BYTES octets, big-endian (octet 0 on top)
    length : In(16)             the message's length (RecvNotify)
    cfg : In(CONFIG), session : In(SESSION)    the engine's registers, the request's session
    range_idx : Out, range : In(9)             the RANGE register of the handle's range
    ent : In(128)               the table entry, as read (big-endian)
    req : Out(REQUEST), entry : Out(ENTRY), entry_addr : Out(ADDR_BITS)
    dispatch : Out(Dispatch), d_result : Out(RESULT)
    entry_next : Out(EntryNext), e_result : Out(RESULT)
    """

    def __init__(self, n_ranges):
        self.n_ranges = n_ranges
        super().__init__({
            "msg": In(8 * MSG_BYTES), "length": In(16),
            "cfg": In(CONFIG), "session": In(SESSION),
            "range_idx": Out(max(1, (n_ranges - 1).bit_length())), "range": In(9),
            "ent": In(128),
            "req": Out(REQUEST), "entry": Out(ENTRY), "entry_addr": Out(ADDR_BITS),
            "dispatch": Out(Dispatch), "d_result": Out(RESULT),
            "entry_next": Out(EntryNext), "e_result": Out(RESULT),
        })

    def elaborate(self, platform):
        m = Module()
        cfg, sess, req = self.cfg, self.session, self.req

        def mf(struct, name, base=0):
            return be_field(self.msg, MSG_BYTES, struct, name, base)

        def mf_le(struct, name, base=0):
            """A field ADDR_LE turns little-endian (host/codec.py), in the session's order."""
            v = mf(struct, name, base)
            return Mux(sess.addr_le, bswap(v), v)

        version, opcode = mf(CommonHeader, "version"), mf(CommonHeader, "opcode")
        flags, req_status = mf(CommonHeader, "flags"), mf(CommonHeader, "status")
        cd_res = mf(CompletionDescriptor, "reserved", _CD)
        is_load, is_store, is_alloc = (opcode == op.value for op in
                                       (Opcode.LOAD, Opcode.STORE, Opcode.ALLOC_STORE))
        m.d.comb += [
            req.is_load.eq(is_load), req.is_store.eq(is_store), req.is_alloc.eq(is_alloc),
            req.op_idx.eq(Mux(is_load, 0, Mux(is_store, 1, 2))),
            req.inline.eq((flags & ReqFlags.INLINE.value) != 0),
            req.seal.eq((flags & ReqFlags.SEAL.value) != 0),
            req.record.eq((flags & ReqFlags.RECORD.value) != 0),
            req.inval.eq((flags & ReqFlags.INVALIDATE.value) != 0),
            req.unsealed.eq((flags & ReqFlags.ALLOW_UNSEALED.value) != 0),
            req.gen.eq(mf(CommonHeader, "generation")),
            req.request_id.eq(mf(CommonHeader, "request_id")),
            req.handle.eq(mf_le(CommonHeader, "handle")),
            req.dd_stag.eq(mf_le(DataDescriptor, "stag", _DD)),
            req.dd_to.eq(mf_le(DataDescriptor, "tagged_offset", _DD)),
            req.dd_len.eq(mf_le(DataDescriptor, "length", _DD)),
            req.cd_stag.eq(mf_le(CompletionDescriptor, "stag", _CD)),
            req.cd_to.eq(mf_le(CompletionDescriptor, "tagged_offset", _CD)),
            req.pos.eq(Mux(req.record, _CD + CompletionDescriptor.SIZE, _CD)),
        ]
        f_inline, dd_len, handle = req.inline, req.dd_len, req.handle

        # Decode (host/codec.py strictness). Every check but Max Inline answers MALFORMED.
        allowed = Signal(16)        # 16 bits wide so that ~allowed covers every flag bit
        m.d.comb += allowed.eq(Mux(is_load, ALLOWED_FLAGS[Opcode.LOAD],
                                   Mux(is_store, ALLOWED_FLAGS[Opcode.STORE],
                                       ALLOWED_FLAGS[Opcode.ALLOC_STORE])))
        ln, pos = self.length, req.pos
        inline_len = Signal(16)
        m.d.comb += inline_len.eq(ln - pos)
        mal = Signal()
        too_large_inline = Signal()
        m.d.comb += [
            mal.eq((version != KBTP_VERSION)
                   | ((flags & ~allowed) != 0)
                   | (~is_load & f_inline & req.inval)
                   | (req_status != 0)
                   | (ln < pos)
                   | (req.record & (cd_res != 0))
                   | ((is_load | ~f_inline) & (ln != pos))
                   | (~is_load & f_inline & ((req.dd_stag != 0) | (req.dd_to != 0)
                                             | (inline_len != dd_len)))),
            too_large_inline.eq(~is_load & f_inline & (inline_len > cfg.max_inline)),
        ]

        # Authorization.
        hidx = Signal(64)
        m.d.comb += hidx.eq(handle - cfg.table_base_handle)
        in_table = (handle >= cfg.table_base_handle) & (hidx < cfg.table_count)
        m.d.comb += self.range_idx.eq((hidx >> cfg.range_log2)[:len(self.range_idx)])
        rng_ok = (hidx >> cfg.range_log2) < self.n_ranges
        rng = self.range
        readable = in_table & rng_ok & (~rng[8] | (rng[:8] == sess.domain))
        hrel = Signal(64)
        m.d.comb += hrel.eq(handle - sess.handle_base)
        owns = (handle >= sess.handle_base) & (hrel < sess.handle_count)
        m.d.comb += self.entry_addr.eq(cfg.table_base + (hidx << 4)[:ADDR_BITS])

        # What to do with the message, first answer first (the model's order).
        d, D, S = self.d_result, Dispatch, Status
        raw = [d.raw.eq(1)]
        # (ALLOC_STORE of a session with a DIRECT_ALLOC partition the engine does not serve:
        # the host allocates from the partition's ring; QP_SESSION bit 3)
        _first(m, [(~(is_load | is_store | is_alloc) | (is_alloc & sess.host_alloc),
                    [self.dispatch.eq(D.HOSTQ)]),
                   (mal, raw + [d.status.eq(S.MALFORMED.value)]),
                   (too_large_inline, raw + [d.status.eq(S.TOO_LARGE.value)]),
                   # A Write with Immediate cannot invalidate (model Readings 9).
                   (req.record & req.inval & sess.record, raw + [d.status.eq(S.MALFORMED.value)]),
                   (Mux(is_load, ~readable, ~owns), [d.status.eq(S.INVALID_HANDLE.value)])],
               [self.dispatch.eq(D.READ_ENTRY)], [self.dispatch.eq(D.COMPLETE)])
        self._entry_checks(m)
        return m

    def _entry_checks(self, m):
        """The table entry, then the checks of model/target.py Readings 6-8 in its order."""
        req, e, r, N = self.req, self.entry, self.e_result, EntryNext
        for name, field in (("flags", "flags"), ("gen", "generation"),
                            ("dlen", "data_length")):
            m.d.comb += e[name].eq(be_field(self.ent, 16, TableEntry, field))
        m.d.comb += e.boff.eq(entry_boff(self.ent, self.cfg.ctrl[2]))
        m.d.comb += e.next_gen.eq(Mux(e.gen == 0xFFFF, 1, e.gen + 1))
        e_valid = (e.flags & EntryFlags.VALID.value) != 0
        e_sealed = (e.flags & EntryFlags.SEALED.value) != 0
        stale = (req.gen != 0) & (req.gen != e.gen)
        dd_len, is_store = req.dd_len, req.is_store

        def complete(status):
            return [r.status.eq(status.value)]
        m.d.comb += r.gen.eq(e.gen)
        with m.If(req.is_load):
            _first(m, [(stale, complete(Status.STALE_GENERATION)),
                       (~e_valid, complete(Status.NOT_VALID)),
                       (~e_sealed & ~req.unsealed, complete(Status.NOT_SEALED)),
                       (e.dlen > dd_len, complete(Status.TOO_LARGE)),
                       (e.dlen == 0, complete(Status.OK) + [r.boff.eq(e.boff)])],
                   [self.entry_next.eq(N.LOAD_WRITE)], [self.entry_next.eq(N.COMPLETE)])
        with m.Else():
            _first(m, [(dd_len > self.cfg.block_size, complete(Status.TOO_LARGE)),
                       (stale, complete(Status.STALE_GENERATION)),
                       (is_store & ~e_valid, complete(Status.NOT_VALID)),
                       (is_store & e_sealed, complete(Status.SEALED)),
                       (is_store, [self.entry_next.eq(N.OBTAIN)]),
                       (e_valid, complete(Status.ALREADY_BOUND)),
                       # (a DIRECT_ALLOC partition's ring is its quota: no USAGE check; an
                       # empty ring answers NO_SPACE, model/target.py's order)
                       ((self.session.ring == 0) & (self.session.usage >= self.session.quota),
                        complete(Status.NO_SPACE))],
                   [self.entry_next.eq(N.RING_ALLOC)], [self.entry_next.eq(N.COMPLETE)])


def entry_boff(ent, le):
    """The Block Offset of a table entry as read (big-endian octets), little-endian when ``le``
    (ADDR_LE structures, draft §Session Establishment)."""
    v = be_field(ent, 16, TableEntry, "block_offset")
    return Mux(le, bswap(v), v)


def _first(m, rules, otherwise, matched=()):
    """Comb statements of the first rule ``(condition, statements)`` whose condition holds (and
    ``matched``, unless they are overridden by the rule), else ``otherwise``."""
    for i, (cond, stmts) in enumerate(rules):
        with (m.Elif if i else m.If)(cond):
            m.d.comb += [*matched, *stmts]
    with m.Else():
        m.d.comb += otherwise

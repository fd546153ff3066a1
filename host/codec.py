# Ref: draft KBTP §Messages (Common Header, Descriptors, KBTP Opcodes), §Session Establishment
#      (HELLO, HELLO_ACK, ADDR_LE, GOODBYE), §Target Memory Structures, §Completion,
#      §Status Codes; docs/layouts.md (all offsets come from hw/headers.py)
"""KBTP message and memory-structure codec (host side, plain Python).

Every message of the draft encodes to and strictly decodes from its wire bytes with the layouts of
:mod:`hw.headers`; no offset table is restated here. Decoding raises :class:`KbtpError`, which
names the offending field and carries the :class:`~hw.headers.Status` that a target must answer.

Byte order and ADDR_LE
----------------------
All fields are big-endian. With ``addr_le=True`` (the ADDR_LE feature was negotiated) these fields
are little-endian, as the draft (§Session Establishment) lists them:

* the Block Handle of the common header of every message the *initiator* sends (HELLO, LOAD,
  STORE, ALLOC_STORE, FREE, BIND, GOODBYE);
* STag, Tagged Offset and Length of Data Descriptors, STag and Tagged Offset of Completion
  Descriptors (their reserved word is zero, so its order does not matter);
* the Block Offset of table entries and ring slots (:func:`encode_entry`, :func:`encode_slot`).

Readings of the draft where it is not explicit (also in the project report):

* The Block Handle of COMPLETION and HELLO_ACK stays **big-endian**. The draft's sentence binds
  the initiator ("the initiator MUST encode the Block Handle ...") and layouts.md says "in
  requests"; the rest of a COMPLETION (Data Length, Block Offset) is big-endian anyway, so a target
  builds it field by field and echoing the handle's raw octets buys nothing.
* The Block Offset of COMPLETION and BIND, the ticket and Data Length of BIND, the Data Length of
  table entries, the Sequence of ring slots, the direct-mode descriptors of HELLO_ACK and the whole
  completion record stay big-endian (none is listed).

Strictness (all MALFORMED unless noted)
---------------------------------------
* truncated header, body, descriptor or direct-mode part; trailing octets after any message whose
  size the header fixes (only STORE/ALLOC_STORE with INLINE carry a variable tail);
* Version != 1; unknown opcode (the private-use range included: nothing is defined there);
* Status != 0 in a request; an unknown Status code in HELLO_ACK or COMPLETION;
* Request ID, Block Handle or Generation nonzero in HELLO or HELLO_ACK (§Session Establishment);
* flag bits: only those in :data:`ALLOWED_FLAGS` for the opcode. The draft registers the five
  request flags for LOAD, STORE, ALLOC_STORE and FREE together; a flag that has no meaning for an
  opcode (INLINE on LOAD or FREE, SEAL on LOAD, ALLOW_UNSEALED on a store, INVALIDATE on FREE,
  which has no Data Descriptor) is rejected, and so is INVALIDATE with INLINE (STag 0: there is no
  STag to invalidate). HELLO, HELLO_ACK, BIND and COMPLETION have no flags; GOODBYE has RELEASE;
* INLINE with a nonzero STag or Tagged Offset; inline data whose length differs from the Data
  Descriptor Length; RECORD set without a Completion Descriptor, or 16 octets that look like one
  with RECORD clear;
* reserved fields nonzero (Completion Descriptor, COMPLETION body, the 8 octets after the Table
  Base Handle, ring slot): rejected rather than ignored, so that a later revision can give them a
  meaning without old targets misreading it;
* HELLO_ACK: unknown Features bits (they would change the length); direct-mode parts missing or
  extra (a HELLO_ACK with a nonzero Status may stop after 56 octets); Head Count != 1 or Head
  Tagged Offset not a multiple of 8; Ring Count not a power of two or smaller than the Partition
  Count; Partition Count != Allocation Quota. Unknown bits of HELLO's Requested Features are
  accepted: a target grants a subset of what is requested;
* BIND with Block Offset all ones (the empty-slot marker: it would match a consumed slot);
* TOO_LARGE: inline data longer than ``max_inline``; a Data Descriptor Length (any opcode, read
  literally from "lengths MUST NOT exceed Block Size"), or a BIND or COMPLETION Data Length,
  larger than ``block_size``.

:func:`encode` checks the message by decoding its own output (``strict=True``), so it never emits
what :func:`decode` rejects; ``strict=False`` packs whatever it is given (for negative tests).
"""

import enum as _pyenum
from dataclasses import dataclass, field, fields
from typing import ClassVar

from hw.headers import (
    ALLOWED_FLAGS, KBTP_VERSION, SLOT_EMPTY, BindBody, CommonHeader, CompletionBody, CompletionDescriptor,
    CompletionRecord, DataDescriptor, DirectAllocPart, DirectLoadPart,
    EntryFlags, Features, GoodbyeFlags, HelloAckBody, HelloBody, Opcode, ReqFlags, RingSlot,
    Status, TableEntry, pack, unpack, wire_fields,
)

__all__ = [
    "KbtpError", "DataDesc", "ComplDesc", "DirectDesc", "Message",
    "Hello", "HelloAck", "Load", "Store", "AllocStore", "Free", "Bind", "Completion", "Goodbye",
    "TableEntryValue", "RingSlotValue", "CompletionRecordValue",
    "encode", "decode", "encode_entry", "decode_entry", "encode_slot", "decode_slot",
    "encode_record", "decode_record", "to_json_dict", "from_json_dict", "message_class",
    "ALLOWED_FLAGS", "REQUEST_OPCODES", "HEADER_SIZE", "HELLO_ACK_MIN_SIZE",
]

HEADER_SIZE = CommonHeader.SIZE                        # 24
HELLO_ACK_MIN_SIZE = HEADER_SIZE + HelloAckBody.SIZE   # 56

#: Opcodes an initiator sends (Status must be 0; ADDR_LE applies to their Block Handle).
REQUEST_OPCODES = frozenset({Opcode.HELLO, Opcode.LOAD, Opcode.STORE, Opcode.ALLOC_STORE,
                             Opcode.FREE, Opcode.BIND, Opcode.GOODBYE})

# Fields that ADDR_LE turns little-endian, per structure (draft §Session Establishment).
_LE_DATA = ("stag", "tagged_offset", "length")
_LE_COMPL = ("stag", "tagged_offset")
_LE_HANDLE = ("handle",)
_LE_OFFSET = ("block_offset",)


class KbtpError(ValueError):
    """Decoding/validation error.

    Attributes
    ----------
    field : str
        The offending field, e.g. ``'opcode'`` or ``'data_descriptor.length'``.
    value : object
        The offending value, or None.
    status : hw.headers.Status
        The status a target must answer (``Status.MALFORMED``, ``Status.TOO_LARGE``).
    message : str
        Human-readable reason, naming the value; ``str(err)`` is ``"<field>: <message>"``.
    header : dict or None
        Set by :func:`decode`: the common header as ints (``version``, ``opcode``, ``flags``,
        ``request_id``, ``handle``, ``generation``, ``status``; handle per ADDR_LE for request
        opcodes) when 24 octets or more arrived.
    """

    def __init__(self, field, message, value=None, status=Status.MALFORMED):
        self.field = field
        self.value = value
        self.status = Status(status)
        self.message = message
        self.header = None
        super().__init__(f"{field}: {message}")


# --------------------------------------------------------------------------------------------
# Value classes
# --------------------------------------------------------------------------------------------

def _as_int(value):
    """Accept Status/ReqFlags/Features members (and their combinations) where ints go."""
    if isinstance(value, _pyenum.Enum):
        return value.value
    return value


@dataclass
class DataDesc:
    """Data Descriptor: a buffer of the initiator."""
    stag: int = 0
    tagged_offset: int = 0
    length: int = 0


@dataclass
class ComplDesc:
    """Completion Descriptor: a 24-octet completion record slot of the initiator."""
    stag: int = 0
    tagged_offset: int = 0


@dataclass
class DirectDesc:
    """Direct-mode descriptor of HELLO_ACK (Table, Pool, Partition, Ring, Head)."""
    stag: int = 0
    tagged_offset: int = 0
    count: int = 0


@dataclass(kw_only=True)
class Message:
    """Common-header fields shared by every message (keyword-only).

    Enum members (Status, ReqFlags, GoodbyeFlags, Features) given for int fields are stored
    as their integer values, so decoded and hand-built messages compare equal.
    """
    OPCODE: ClassVar[Opcode]
    flags: int = 0
    request_id: int = 0
    handle: int = 0
    generation: int = 0
    status: int = 0

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, _pyenum.Enum):
                setattr(self, f.name, value.value)
            elif isinstance(value, (bytearray, memoryview)):
                setattr(self, f.name, bytes(value))


@dataclass
class Hello(Message):
    """HELLO (initiator -> target)."""
    OPCODE: ClassVar[Opcode] = Opcode.HELLO
    requested_features: int = 0
    completion_credits: int = 0
    initiator_id: int = 0


@dataclass
class HelloAck(Message):
    """HELLO_ACK (target -> initiator); direct parts are None when absent."""
    OPCODE: ClassVar[Opcode] = Opcode.HELLO_ACK
    features: int = 0
    request_credits: int = 0
    block_size: int = 0
    max_inline: int = 0
    allocation_quota: int = 0
    handle_base: int = 0
    handle_count: int = 0
    ticket_timeout_ms: int = 0
    table: DirectDesc | None = None
    table_base_handle: int = 0
    pool: DirectDesc | None = None
    partition: DirectDesc | None = None
    ring: DirectDesc | None = None
    head: DirectDesc | None = None


@dataclass
class Load(Message):
    """LOAD: ``data`` is the destination; ``completion`` present iff flags & RECORD."""
    OPCODE: ClassVar[Opcode] = Opcode.LOAD
    data: DataDesc = field(default_factory=DataDesc)
    completion: ComplDesc | None = None


@dataclass
class _StoreBase(Message):
    data: DataDesc = field(default_factory=DataDesc)
    completion: ComplDesc | None = None
    inline: bytes = b""


@dataclass
class Store(_StoreBase):
    """STORE (mapped): ``data`` is the source, or (INLINE) STag = TO = 0, Length = len(inline)."""
    OPCODE: ClassVar[Opcode] = Opcode.STORE


@dataclass
class AllocStore(_StoreBase):
    """ALLOC_STORE (unmapped); same fields as :class:`Store` (a sibling, not a subclass)."""
    OPCODE: ClassVar[Opcode] = Opcode.ALLOC_STORE


@dataclass
class Free(Message):
    """FREE: ``completion`` present iff flags & RECORD."""
    OPCODE: ClassVar[Opcode] = Opcode.FREE
    completion: ComplDesc | None = None


@dataclass
class Bind(Message):
    """BIND (DIRECT_ALLOC): ticket, Data Length and Block Offset read from the slot."""
    OPCODE: ClassVar[Opcode] = Opcode.BIND
    ticket: int = 0
    data_length: int = 0
    block_offset: int = 0


@dataclass
class Completion(Message):
    """COMPLETION (target -> initiator)."""
    OPCODE: ClassVar[Opcode] = Opcode.COMPLETION
    data_length: int = 0
    block_offset: int = 0


@dataclass
class Goodbye(Message):
    """GOODBYE: flags bit 0x0001 = RELEASE."""
    OPCODE: ClassVar[Opcode] = Opcode.GOODBYE


_CLASSES = {cls.OPCODE: cls for cls in
            (Hello, HelloAck, Load, Store, AllocStore, Free, Bind, Completion, Goodbye)}


def message_class(opcode):
    """The message class for an :class:`Opcode` (or its integer value)."""
    return _CLASSES[Opcode(opcode)]


@dataclass
class TableEntryValue:
    """Decoded block table entry."""
    flags: int = 0
    generation: int = 0
    data_length: int = 0
    block_offset: int = 0


@dataclass
class RingSlotValue:
    """Decoded ring slot (:func:`decode_slot` returns the plain tuple; this is for JSON)."""
    sequence: int = 0
    block_offset: int = 0


@dataclass
class CompletionRecordValue:
    """Decoded completion record."""
    request_id: int = 0
    status: int = 0
    generation: int = 0
    data_length: int = 0
    block_offset: int = 0


# --------------------------------------------------------------------------------------------
# Low-level packing with selectable little-endian fields
# --------------------------------------------------------------------------------------------

def _swap_fields(buf, struct, names, base=0):
    """Reverse, in place, the octets of the named (octet-aligned) fields of ``struct``."""
    for fname, off, bits, _ in wire_fields(struct):
        if fname in names:
            lo, hi = base + off, base + off + bits // 8
            buf[lo:hi] = buf[lo:hi][::-1]


def _pack(struct, prefix, le_names=(), **values):
    """``pack`` with field-named errors; ``le_names`` are emitted little-endian."""
    widths = {fname: bits for fname, bits in struct.WIRE_FIELDS}
    for fname, value in values.items():
        value = _as_int(value)
        if not isinstance(value, int) or isinstance(value, bool):
            raise KbtpError(f"{prefix}{fname}", f"must be an integer, got {value!r}", value)
        if not 0 <= value < (1 << widths[fname]):
            raise KbtpError(f"{prefix}{fname}",
                            f"{value:#x} does not fit {widths[fname]} bits", value)
        values[fname] = value
    buf = bytearray(pack(struct, **values))
    _swap_fields(buf, struct, le_names)
    return bytes(buf)


def _unpack(struct, raw, off, le_names=()):
    buf = bytearray(raw[off:off + struct.SIZE])
    _swap_fields(buf, struct, le_names)
    return unpack(struct, buf)


class _Reader:
    """Cursor over a message that raises KbtpError on truncation."""

    def __init__(self, raw, name):
        self.raw, self.name, self.pos = raw, name, HEADER_SIZE

    @property
    def left(self):
        return len(self.raw) - self.pos

    def take(self, struct, field_name, le_names=()):
        if self.left < struct.SIZE:
            raise KbtpError(field_name,
                            f"truncated: {self.name} needs {struct.SIZE} octets at offset "
                            f"{self.pos}, only {self.left} left", self.left)
        out = _unpack(struct, self.raw, self.pos, le_names)
        self.pos += struct.SIZE
        return out

    def finish(self):
        if self.left:
            raise KbtpError("message", f"{self.left} trailing octet(s) after the {self.pos}-octet "
                            f"{self.name}", self.left)


def _flag_names(enum_cls, value):
    names = [m.name for m in enum_cls if value & m.value]
    rest = value & ~sum(m.value for m in enum_cls)
    if rest:
        names.append(f"{rest:#06x}")
    return names


def _status_name(value):
    try:
        return Status(value).name
    except ValueError:
        return value


# --------------------------------------------------------------------------------------------
# Encoding
# --------------------------------------------------------------------------------------------

def encode(msg, *, addr_le=False, strict=True):
    """Encode a message into its wire bytes.

    Parameters
    ----------
    msg : Message
        One of :class:`Hello`, :class:`HelloAck`, :class:`Load`, :class:`Store`,
        :class:`AllocStore`, :class:`Free`, :class:`Bind`, :class:`Completion`, :class:`Goodbye`.
    addr_le : bool
        ADDR_LE negotiated: encode the listed address fields little-endian (module docstring).
    strict : bool
        Check the result with :func:`decode` and raise :class:`KbtpError` if it would be
        rejected. ``False`` packs any field values that fit their widths.

    Returns
    -------
    bytes
    """
    if not isinstance(msg, Message) or type(msg) not in _CLASSES.values():
        raise TypeError(f"not a KBTP message: {msg!r}")
    op = msg.OPCODE
    flags = _as_int(msg.flags)
    hdr_le = _LE_HANDLE if (addr_le and op in REQUEST_OPCODES) else ()
    out = [_pack(CommonHeader, "", hdr_le, version=KBTP_VERSION, opcode=op.value, flags=flags,
                 request_id=msg.request_id, handle=msg.handle, generation=msg.generation,
                 status=msg.status)]
    dle = _LE_DATA if addr_le else ()
    cle = _LE_COMPL if addr_le else ()

    def data_desc(d):
        return _pack(DataDescriptor, "data_descriptor.", dle, stag=d.stag,
                     tagged_offset=d.tagged_offset, length=d.length)

    def compl_desc(c):
        if strict and (c is None) == bool(flags & ReqFlags.RECORD.value):
            raise KbtpError("completion_descriptor",
                            "must be given iff the RECORD flag is set "
                            f"(flags {flags:#06x}, completion {c!r})", c)
        if c is None:
            return b""
        return _pack(CompletionDescriptor, "completion_descriptor.", cle, stag=c.stag,
                     tagged_offset=c.tagged_offset)

    if op is Opcode.HELLO:
        out.append(_pack(HelloBody, "", requested_features=msg.requested_features,
                         completion_credits=msg.completion_credits,
                         initiator_id=msg.initiator_id))
    elif op is Opcode.HELLO_ACK:
        out.append(_encode_hello_ack_body(msg, strict))
    elif op is Opcode.LOAD:
        out += [data_desc(msg.data), compl_desc(msg.completion)]
    elif op in (Opcode.STORE, Opcode.ALLOC_STORE):
        inline = bytes(msg.inline)
        if strict and inline and not flags & ReqFlags.INLINE.value:
            raise KbtpError("inline_data", f"{len(inline)} octets given but INLINE is clear",
                            len(inline))
        out += [data_desc(msg.data), compl_desc(msg.completion), inline]
    elif op is Opcode.FREE:
        out.append(compl_desc(msg.completion))
    elif op is Opcode.BIND:
        out.append(_pack(BindBody, "", ticket=msg.ticket, data_length=msg.data_length,
                         block_offset=msg.block_offset))
    elif op is Opcode.COMPLETION:
        out.append(_pack(CompletionBody, "", data_length=msg.data_length,
                         block_offset=msg.block_offset))
    raw = b"".join(out)
    if strict:
        decode(raw, addr_le=addr_le)
    return raw


def _encode_hello_ack_body(msg, strict):
    out = [_pack(HelloAckBody, "", features=msg.features, request_credits=msg.request_credits,
                 block_size=msg.block_size, max_inline=msg.max_inline,
                 allocation_quota=msg.allocation_quota, handle_base=msg.handle_base,
                 handle_count=msg.handle_count, ticket_timeout_ms=msg.ticket_timeout_ms)]
    features = _as_int(msg.features)
    load_parts = (msg.table, msg.pool)
    alloc_parts = (msg.partition, msg.ring, msg.head)
    for bit, parts, name in ((Features.DIRECT_LOAD, load_parts, "direct_load"),
                             (Features.DIRECT_ALLOC, alloc_parts, "direct_alloc")):
        present = [p is not None for p in parts]
        if strict and any(present) and not all(present):
            raise KbtpError(name, "descriptors must be given all together or not at all")
        if strict and any(present) and not features & bit.value:
            raise KbtpError(name, f"descriptors given but Features lacks {bit.name}")
        if strict and not any(present) and features & bit.value and msg.status == 0:
            raise KbtpError(name, f"Features has {bit.name} but its descriptors are missing")
    if strict and msg.table is None and msg.table_base_handle:
        raise KbtpError("table_base_handle", "nonzero without the DIRECT_LOAD part",
                        msg.table_base_handle)
    if msg.table is not None:
        t, p = msg.table, msg.pool or DirectDesc()
        out.append(_pack(DirectLoadPart, "direct_load.", table_stag=t.stag,
                         table_offset=t.tagged_offset, table_count=t.count,
                         table_base_handle=msg.table_base_handle, pool_stag=p.stag,
                         pool_offset=p.tagged_offset, pool_count=p.count))
    if msg.partition is not None:
        pa, r, h = msg.partition, msg.ring or DirectDesc(), msg.head or DirectDesc()
        out.append(_pack(DirectAllocPart, "direct_alloc.", partition_stag=pa.stag,
                         partition_offset=pa.tagged_offset, partition_count=pa.count,
                         ring_stag=r.stag, ring_offset=r.tagged_offset, ring_count=r.count,
                         head_stag=h.stag, head_offset=h.tagged_offset, head_count=h.count))
    return b"".join(out)


# --------------------------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------------------------

def decode(raw, *, addr_le=False, max_inline=None, block_size=None):
    """Strictly decode one KBTP message.

    Parameters
    ----------
    raw : bytes-like
        The whole message (one Send payload).
    addr_le : bool
        ADDR_LE negotiated (module docstring lists the affected fields).
    max_inline : int or None
        The target's Max Inline; longer inline data raises TOO_LARGE.
    block_size : int or None
        The target's Block Size; larger Data Descriptor / BIND / COMPLETION lengths raise
        TOO_LARGE.

    Returns
    -------
    Message
        An instance of the message class of the opcode, with int fields.

    Raises
    ------
    KbtpError
        With ``field``, ``value`` and the ``status`` the target must answer, and ``header``:
        the common-header fields when at least 24 octets arrived (so that a target can echo
        Request ID and Block Handle in its MALFORMED completion), else None.
    """
    raw = bytes(raw)
    try:
        return _decode(raw, addr_le, max_inline, block_size)
    except KbtpError as err:
        if len(raw) >= HEADER_SIZE:
            le = addr_le and raw[1] in {op.value for op in REQUEST_OPCODES}
            err.header = _unpack(CommonHeader, raw, 0, _LE_HANDLE if le else ())
        raise


def _decode(raw, addr_le, max_inline, block_size):
    op, hdr = _decode_header(raw, addr_le)
    common = {k: hdr[k] for k in ("flags", "request_id", "handle", "generation", "status")}
    body = _Body(raw, op, hdr["flags"], addr_le, max_inline, block_size)
    return _BODY_DECODERS[op](body, common)


def _decode_header(raw, addr_le):
    """The common header's checks, in the codec's order; returns (opcode, header fields)."""
    if len(raw) < HEADER_SIZE:
        raise KbtpError("header", f"truncated: {len(raw)} octet(s), the common header needs "
                        f"{HEADER_SIZE}", len(raw))
    hdr = _unpack(CommonHeader, raw, 0)
    if hdr["version"] != KBTP_VERSION:
        raise KbtpError("version", f"{hdr['version']} is not {KBTP_VERSION}", hdr["version"])
    try:
        op = Opcode(hdr["opcode"])
    except ValueError:
        raise KbtpError("opcode", f"unknown opcode {hdr['opcode']:#04x}", hdr["opcode"]) from None
    if addr_le and op in REQUEST_OPCODES:
        hdr = _unpack(CommonHeader, raw, 0, _LE_HANDLE)
    _check_flags(op, hdr["flags"])
    status = hdr["status"]
    if op in REQUEST_OPCODES and status:
        raise KbtpError("status", f"{status} in a {op.name} request, must be 0", status)
    if op not in REQUEST_OPCODES and _status_name(status) == status:
        raise KbtpError("status", f"unknown status code {status}", status)
    if op in (Opcode.HELLO, Opcode.HELLO_ACK):
        for name in ("request_id", "handle", "generation"):
            if hdr[name]:
                raise KbtpError(name, f"{hdr[name]:#x} in {op.name}, must be 0", hdr[name])
    return op, hdr


class _Body(_Reader):
    """The body of one message after its header: the descriptors, inline data and the checks
    that depend on the session (ADDR_LE, Max Inline, Block Size)."""

    def __init__(self, raw, op, flags, addr_le, max_inline, block_size):
        super().__init__(raw, op.name)
        self.op, self.flags = op, flags
        self.max_inline, self.block_size = max_inline, block_size
        self.dle = _LE_DATA if addr_le else ()
        self.cle = _LE_COMPL if addr_le else ()

    def data_desc(self):
        d = self.take(DataDescriptor, "data_descriptor", self.dle)
        if self.block_size is not None and d["length"] > self.block_size:
            raise KbtpError("data_descriptor.length", f"{d['length']} exceeds Block Size "
                            f"{self.block_size}", d["length"], Status.TOO_LARGE)
        return DataDesc(d["stag"], d["tagged_offset"], d["length"])

    def compl_desc(self):
        if not self.flags & ReqFlags.RECORD.value:
            return None
        c = self.take(CompletionDescriptor, "completion_descriptor", self.cle)
        if c["reserved"]:
            raise KbtpError("completion_descriptor.reserved", f"{c['reserved']:#x}, must be 0",
                            c["reserved"])
        return ComplDesc(c["stag"], c["tagged_offset"])

    def finish_fixed(self):
        # 16 octets too many where a Completion Descriptor would sit: say so, it is the likely
        # mistake (RECORD forgotten), rather than "trailing octets".
        if (self.left == CompletionDescriptor.SIZE and self.op in (Opcode.LOAD, Opcode.FREE)
                and not self.flags & ReqFlags.RECORD.value):
            raise KbtpError("completion_descriptor", "16 octets follow but the RECORD flag is "
                            "clear", self.left)
        self.finish()

    def inline_data(self, d):
        """The octets after the descriptors of an INLINE store: exactly the Data Descriptor's
        Length, zero STag and Tagged Offset, at most Max Inline."""
        if d.stag:
            raise KbtpError("data_descriptor.stag", f"{d.stag:#x} with INLINE, must be 0",
                            d.stag)
        if d.tagged_offset:
            raise KbtpError("data_descriptor.tagged_offset",
                            f"{d.tagged_offset:#x} with INLINE, must be 0", d.tagged_offset)
        inline = self.raw[self.pos:]
        if len(inline) != d.length:
            raise KbtpError("inline_data", f"{len(inline)} octet(s) follow but the Data "
                            f"Descriptor Length is {d.length}", len(inline))
        if self.max_inline is not None and len(inline) > self.max_inline:
            raise KbtpError("inline_data", f"{len(inline)} octets exceed Max Inline "
                            f"{self.max_inline}", len(inline), Status.TOO_LARGE)
        self.pos = len(self.raw)
        return inline


def _decode_hello(body, common):
    b = body.take(HelloBody, "body")
    body.finish()
    return Hello(**common, **b)


def _decode_load(body, common):
    d = body.data_desc()
    c = body.compl_desc()
    body.finish_fixed()
    return Load(**common, data=d, completion=c)


def _decode_store(body, common):
    """STORE and ALLOC_STORE: the same layout."""
    d = body.data_desc()
    c = body.compl_desc()
    inline = b""
    if body.flags & ReqFlags.INLINE.value:
        inline = body.inline_data(d)
    else:
        body.finish_fixed()
    return message_class(body.op)(**common, data=d, completion=c, inline=inline)


def _decode_free(body, common):
    c = body.compl_desc()
    body.finish_fixed()
    return Free(**common, completion=c)


def _decode_bind(body, common):
    b = body.take(BindBody, "body")
    body.finish()
    if b["block_offset"] == SLOT_EMPTY:
        raise KbtpError("block_offset", "all ones is the empty-slot marker, not a block",
                        b["block_offset"])
    _check_block_size("data_length", b["data_length"], body.block_size)
    return Bind(**common, **b)


def _decode_completion(body, common):
    b = body.take(CompletionBody, "body")
    body.finish()
    if b["reserved"]:
        raise KbtpError("reserved", f"{b['reserved']:#x}, must be 0", b["reserved"])
    _check_block_size("data_length", b["data_length"], body.block_size)
    return Completion(**common, data_length=b["data_length"], block_offset=b["block_offset"])


def _decode_goodbye(body, common):
    body.finish()
    return Goodbye(**common)


def _check_flags(op, flags):
    allowed = ALLOWED_FLAGS[op]
    enum_cls = GoodbyeFlags if op is Opcode.GOODBYE else ReqFlags
    known = sum(m.value for m in enum_cls)
    if flags and not allowed:
        raise KbtpError("flags", f"{op.name} has no flags, got {flags:#06x}", flags)
    unknown = flags & ~known & 0xFFFF
    if unknown:
        raise KbtpError("flags", f"unknown flag bits {unknown:#06x} for {op.name}", flags)
    bad = flags & ~allowed
    if bad:
        names = "|".join(_flag_names(enum_cls, bad))
        raise KbtpError("flags", f"{names} ({bad:#06x}) not valid for {op.name}", flags)
    if flags & ReqFlags.INLINE.value and flags & ReqFlags.INVALIDATE.value and \
            op in (Opcode.STORE, Opcode.ALLOC_STORE):
        raise KbtpError("flags", "INVALIDATE with INLINE: there is no STag to invalidate",
                        flags)


def _check_block_size(name, value, block_size):
    if block_size is not None and value > block_size:
        raise KbtpError(name, f"{value} exceeds Block Size {block_size}", value,
                        Status.TOO_LARGE)


def _decode_hello_ack(rd, common, block_size):
    b = rd.take(HelloAckBody, "body")
    features = b["features"]
    unknown = features & ~sum(m.value for m in Features)
    if unknown:
        raise KbtpError("features", f"unknown feature bits {unknown:#06x}", features)
    msg = HelloAck(**common, **b)
    if common["status"] and rd.left == 0:
        return msg                      # an error HELLO_ACK may stop after 56 octets
    if features & Features.DIRECT_LOAD.value:
        p = rd.take(DirectLoadPart, "direct_load")
        if p["reserved"]:
            raise KbtpError("direct_load.reserved", f"{p['reserved']:#x}, must be 0",
                            p["reserved"])
        msg.table = DirectDesc(p["table_stag"], p["table_offset"], p["table_count"])
        msg.table_base_handle = p["table_base_handle"]
        msg.pool = DirectDesc(p["pool_stag"], p["pool_offset"], p["pool_count"])
    if features & Features.DIRECT_ALLOC.value:
        p = rd.take(DirectAllocPart, "direct_alloc")
        msg.partition = DirectDesc(p["partition_stag"], p["partition_offset"],
                                   p["partition_count"])
        msg.ring = DirectDesc(p["ring_stag"], p["ring_offset"], p["ring_count"])
        msg.head = DirectDesc(p["head_stag"], p["head_offset"], p["head_count"])
        if msg.head.count != 1:
            raise KbtpError("head.count", f"{msg.head.count}, must be 1", msg.head.count)
        if msg.head.tagged_offset % 8:
            raise KbtpError("head.tagged_offset", f"{msg.head.tagged_offset:#x} is not a "
                            "multiple of 8 (FetchAdd alignment)", msg.head.tagged_offset)
        n = msg.ring.count
        if n == 0 or n & (n - 1):
            raise KbtpError("ring.count", f"{n} is not a power of two", n)
        if n < msg.partition.count:
            raise KbtpError("ring.count", f"{n} is smaller than the Partition Count "
                            f"{msg.partition.count}", n)
        if msg.partition.count != msg.allocation_quota:
            raise KbtpError("partition.count", f"{msg.partition.count} differs from the "
                            f"Allocation Quota {msg.allocation_quota}", msg.partition.count)
    if rd.left:
        raise KbtpError("features", f"{rd.left} octet(s) follow the HELLO_ACK but Features "
                        f"{features:#06x} announce no further direct-mode part", rd.left)
    return msg


# --------------------------------------------------------------------------------------------
# Target memory structures
# --------------------------------------------------------------------------------------------


#: The body decoder of each opcode (after :func:`_decode_header`).
_BODY_DECODERS = {
    Opcode.HELLO: _decode_hello,
    Opcode.HELLO_ACK: lambda body, common: _decode_hello_ack(body, common, body.block_size),
    Opcode.LOAD: _decode_load,
    Opcode.STORE: _decode_store,
    Opcode.ALLOC_STORE: _decode_store,
    Opcode.FREE: _decode_free,
    Opcode.BIND: _decode_bind,
    Opcode.COMPLETION: _decode_completion,
    Opcode.GOODBYE: _decode_goodbye,
}


def _exact(raw, struct, name):
    raw = bytes(raw)
    if len(raw) != struct.SIZE:
        raise KbtpError(name, f"{len(raw)} octet(s), a {struct.__name__} is {struct.SIZE}",
                        len(raw))
    return raw


def encode_entry(flags, generation, data_length, block_offset, *, addr_le=False):
    """Block table entry, 16 octets (Block Offset little-endian with ADDR_LE)."""
    return _pack(TableEntry, "entry.", _LE_OFFSET if addr_le else (), flags=flags,
                 generation=generation, data_length=data_length, block_offset=block_offset)


def decode_entry(raw, *, addr_le=False, strict=True):
    """Decode a 16-octet block table entry into a :class:`TableEntryValue`.

    With ``strict`` (default) unknown flag bits, SEALED without VALID and Generation 0 ("never
    takes the value zero") raise MALFORMED.
    """
    e = _unpack(TableEntry, _exact(raw, TableEntry, "entry"), 0,
                _LE_OFFSET if addr_le else ())
    if strict:
        flags = e["flags"]
        unknown = flags & ~sum(m.value for m in EntryFlags)
        if unknown:
            raise KbtpError("entry.flags", f"unknown flag bits {unknown:#06x}", flags)
        if flags & EntryFlags.SEALED.value and not flags & EntryFlags.VALID.value:
            raise KbtpError("entry.flags", "SEALED without VALID", flags)
        if e["generation"] == 0:
            raise KbtpError("entry.generation", "0, a generation is never zero", 0)
    return TableEntryValue(e["flags"], e["generation"], e["data_length"], e["block_offset"])


def encode_slot(sequence, block_offset, *, addr_le=False):
    """Ring slot, 16 octets (Block Offset little-endian with ADDR_LE; SLOT_EMPTY = consumed)."""
    return _pack(RingSlot, "slot.", _LE_OFFSET if addr_le else (), sequence=sequence,
                 block_offset=block_offset)


def decode_slot(raw, *, addr_le=False, strict=True):
    """Decode a 16-octet ring slot into ``(sequence, block_offset)``.

    With ``strict`` (default) a nonzero reserved word raises MALFORMED.
    """
    s = _unpack(RingSlot, _exact(raw, RingSlot, "slot"), 0, _LE_OFFSET if addr_le else ())
    if strict and s["reserved"]:
        raise KbtpError("slot.reserved", f"{s['reserved']:#x}, must be 0", s["reserved"])
    return s["sequence"], s["block_offset"]


def encode_record(request_id, status, generation, data_length, block_offset):
    """Completion record, 24 octets, all big-endian."""
    return _pack(CompletionRecord, "record.", request_id=request_id, status=status,
                 generation=generation, data_length=data_length, block_offset=block_offset)


def decode_record(raw):
    """Decode a 24-octet completion record; an unknown Status raises MALFORMED."""
    r = _unpack(CompletionRecord, _exact(raw, CompletionRecord, "record"), 0)
    if _status_name(r["status"]) == r["status"]:
        raise KbtpError("record.status", f"unknown status code {r['status']}", r["status"])
    return CompletionRecordValue(**r)


# --------------------------------------------------------------------------------------------
# JSON view (CLI)
# --------------------------------------------------------------------------------------------

_HEX_FIELDS = frozenset({"request_id", "handle", "stag", "tagged_offset", "block_offset",
                         "initiator_id", "handle_base", "table_base_handle"})


def _json_value(name, value):
    if isinstance(value, (DataDesc, ComplDesc, DirectDesc)):
        return {f.name: _json_value(f.name, getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, (bytes, bytearray)):
        return bytes(value).hex()
    value = _as_int(value)
    if name in _HEX_FIELDS and isinstance(value, int):
        return f"{value:#x}"
    if name == "status":
        return _status_name(value)
    if name in ("features", "requested_features"):
        return _flag_names(Features, value)
    return value


def to_json_dict(msg):
    """A JSON-ready dict: names for opcode/status/flags/features, hex strings for ids/offsets.

    Accepts any message, :class:`TableEntryValue`, :class:`RingSlotValue` or
    :class:`CompletionRecordValue`.
    """
    if isinstance(msg, Message):
        out = {"opcode": msg.OPCODE.name, "version": KBTP_VERSION}
        flag_enum = GoodbyeFlags if msg.OPCODE is Opcode.GOODBYE else ReqFlags
        for f in fields(msg):
            value = getattr(msg, f.name)
            out[f.name] = (_flag_names(flag_enum, _as_int(value)) if f.name == "flags"
                           else _json_value(f.name, value))
        return out
    if isinstance(msg, TableEntryValue):
        return {"struct": "table_entry", "flags": _flag_names(EntryFlags, msg.flags),
                "generation": msg.generation, "data_length": msg.data_length,
                "block_offset": f"{msg.block_offset:#x}"}
    if isinstance(msg, RingSlotValue):
        return {"struct": "ring_slot", "sequence": msg.sequence,
                "block_offset": f"{msg.block_offset:#x}",
                "consumed": msg.block_offset == SLOT_EMPTY}
    if isinstance(msg, CompletionRecordValue):
        out = {"struct": "completion_record"}
        out.update({f.name: _json_value(f.name, getattr(msg, f.name)) for f in fields(msg)})
        return out
    raise TypeError(f"cannot convert {msg!r} to JSON")


def _int_from_json(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise KbtpError(name, f"expected an integer or a hex string, got {value!r}", value)
    if isinstance(value, str):
        try:
            return int(value, 0)
        except ValueError:
            raise KbtpError(name, f"not an integer: {value!r}", value) from None
    return value


def _flags_from_json(name, enum_cls, value):
    if isinstance(value, list):
        out = 0
        for item in value:
            if isinstance(item, str) and item in enum_cls.__members__:
                out |= enum_cls[item].value
            else:
                out |= _int_from_json(name, item)
        return out
    return _int_from_json(name, value)


def _from_json_value(name, value, default):
    if isinstance(default, (DataDesc, ComplDesc, DirectDesc)) or name in (
            "data", "completion", "table", "pool", "partition", "ring", "head"):
        if value is None:
            return None
        if not isinstance(value, dict):
            raise KbtpError(name, f"expected an object, got {value!r}", value)
        cls = {"data": DataDesc, "completion": ComplDesc}.get(name, DirectDesc)
        return cls(**{f.name: _int_from_json(f"{name}.{f.name}", value.get(f.name, 0))
                      for f in fields(cls)})
    if name == "inline":
        try:
            return bytes.fromhex(value)
        except (TypeError, ValueError):
            raise KbtpError(name, f"not a hex string: {value!r}", value) from None
    if name == "status":
        if isinstance(value, str) and value in Status.__members__:
            return Status[value].value
        return _int_from_json(name, value)
    if name in ("features", "requested_features"):
        return _flags_from_json(name, Features, value)
    return _int_from_json(name, value)


def from_json_dict(obj):
    """Inverse of :func:`to_json_dict` (names or ints for opcode/status/flags; hex or ints).

    Missing fields take their defaults; ``version`` and unknown keys are ignored.
    """
    if not isinstance(obj, dict):
        raise KbtpError("input", f"expected a JSON object, got {type(obj).__name__}")
    kind = obj.get("struct")
    if kind is not None:
        cls = {"table_entry": TableEntryValue, "ring_slot": RingSlotValue,
               "completion_record": CompletionRecordValue}.get(kind)
        if cls is None:
            raise KbtpError("struct", f"unknown structure {kind!r}", kind)
        values = {}
        for f in fields(cls):
            value = obj.get(f.name, 0)
            if f.name == "flags":
                values[f.name] = _flags_from_json(f.name, EntryFlags, value)
            else:
                values[f.name] = _from_json_value(f.name, value, f.default)
        return cls(**values)
    op = obj.get("opcode")
    try:
        op = Opcode[op] if isinstance(op, str) and op in Opcode.__members__ else Opcode(
            _int_from_json("opcode", op))
    except ValueError:
        raise KbtpError("opcode", f"unknown opcode {op!r}", op) from None
    cls = _CLASSES[op]
    flag_enum = GoodbyeFlags if op is Opcode.GOODBYE else ReqFlags
    values = {}
    for f in fields(cls):
        if f.name not in obj:
            continue
        if f.name == "flags":
            values[f.name] = _flags_from_json("flags", flag_enum, obj[f.name])
        else:
            values[f.name] = _from_json_value(f.name, obj[f.name], f.default)
    return cls(**values)

# Ref: draft KBTP §Messages, §Target Memory Structures, §Status Codes (docs/layouts.md);
#      IBTA Vol. 1 §9.2-9.5 and RoCEv2 Annex A17 (docs/roce-layouts.md §1-§4); RFC 826 (ARP).
"""The one headers module: every wire header and memory structure of the project.

Gateware, golden model, host codec and testbenches all import their layouts from here, so a
field offset exists in exactly one place.

Every header is an :class:`amaranth.lib.data.Struct`. ``data.Struct`` packs its first field at
the least significant bit, while the wire sends the most significant octet first; so each
structure is declared *in wire order* through :func:`wire_struct`, which reverses the fields.
The resulting layout is correct over a **big-endian load** of the header bytes::

    value = int.from_bytes(header_bytes, "big")      # gateware: bytes concatenated MSB first

Host software packs and unpacks bytes with :func:`pack` / :func:`unpack`, which use the same
layout objects (no second table of offsets), and :func:`wire_fields` lists
``(name, byte_offset, bit_width)`` in wire order for documentation and decoders.
"""

from amaranth.lib import data, enum

__all__ = [
    "wire_struct", "wire_fields", "pack", "unpack", "size_of",
    # KBTP
    "KBTP_VERSION", "Opcode", "Status", "ReqFlags", "GoodbyeFlags", "ALLOWED_FLAGS", "Features",
    "EntryFlags",
    "CommonHeader", "DataDescriptor", "CompletionDescriptor", "DirectDescriptor",
    "HelloBody", "HelloAckBody", "DirectLoadPart", "DirectAllocPart", "BindBody",
    "CompletionBody", "TableEntry", "RingSlot", "CompletionRecord",
    "RING_ADD_DATA", "RING_ADD_DATA_UNMASKED", "ring_add_mask", "SLOT_EMPTY",
    # Ethernet / IPv4 / UDP / ARP
    "EthernetHeader", "ArpPacket", "IPv4Header", "UDPHeader", "ETHERTYPE_IPV4", "ETHERTYPE_ARP",
    "ROCE_UDP_PORT",
    # RoCEv2 transport
    "BthOpcode", "AethSyndrome", "BTH", "RETH", "AETH", "AtomicETH", "AtomicAckETH", "ImmDt",
    "IETH", "DETH", "EXT_HEADERS",
]


# --------------------------------------------------------------------------------------------
# Layout helpers
# --------------------------------------------------------------------------------------------

def wire_struct(name, fields, doc=None):
    """Build a ``data.Struct`` from ``[(field, bits), ...]`` given in wire order.

    The first field listed is the first on the wire, i.e. the most significant bits of a
    big-endian load. Fields may be any width (BTH and IPv4 have sub-octet fields); the total
    must be a whole number of octets.
    """
    total = sum(bits for _, bits in fields)
    if total % 8:
        raise ValueError(f"{name}: {total} bits is not a whole number of octets")
    annotations = {fname: bits for fname, bits in reversed(fields)}
    cls = type(name, (data.Struct,), {"__annotations__": annotations,
                                      "__doc__": doc or f"{name} ({total // 8} octets)."})
    cls.WIRE_FIELDS = tuple(fields)
    cls.SIZE = total // 8
    return cls


def size_of(struct):
    """Size of a wire structure in octets."""
    return struct.SIZE


def wire_fields(struct):
    """``[(name, byte_offset, bit_width, bit_offset_in_first_octet)]`` in wire order.

    ``bit_offset_in_first_octet`` counts from the most significant bit of that octet.
    """
    out, pos = [], 0
    for fname, bits in struct.WIRE_FIELDS:
        out.append((fname, pos // 8, bits, pos % 8))
        pos += bits
    return out


def _offsets(struct):
    cache = struct.__dict__.get("_OFFSETS")
    if cache is None:
        layout = data.Layout.cast(struct)
        cache = {fname: (field.offset, field.width) for fname, field in layout}
        struct._OFFSETS = cache
    return cache


def pack(struct, **values):
    """Pack field values (ints; missing fields are 0) into the structure's wire bytes."""
    offsets = _offsets(struct)
    word = 0
    for fname, value in values.items():
        if fname not in offsets:
            raise KeyError(f"{struct.__name__} has no field {fname!r}")
        shift, width = offsets[fname]
        value = int(value)
        if not 0 <= value < (1 << width):
            raise ValueError(f"{struct.__name__}.{fname} = {value:#x} does not fit {width} bits")
        word |= value << shift
    return word.to_bytes(struct.SIZE, "big")


def unpack(struct, raw, offset=0):
    """Unpack the structure from ``raw[offset:]`` into a dict of ints (wire order)."""
    chunk = bytes(raw[offset:offset + struct.SIZE])
    if len(chunk) != struct.SIZE:
        raise ValueError(f"{struct.__name__} needs {struct.SIZE} octets, got {len(chunk)}")
    word = int.from_bytes(chunk, "big")
    offsets = _offsets(struct)
    return {fname: (word >> offsets[fname][0]) & ((1 << offsets[fname][1]) - 1)
            for fname, _ in struct.WIRE_FIELDS}


# --------------------------------------------------------------------------------------------
# KBTP (draft §Messages, §KBTP Opcodes, §Status Codes, §IANA Considerations)
# --------------------------------------------------------------------------------------------

KBTP_VERSION = 1


class Opcode(enum.Enum, shape=8):
    HELLO = 0x01
    HELLO_ACK = 0x02
    LOAD = 0x10
    STORE = 0x11
    ALLOC_STORE = 0x12
    FREE = 0x13
    BIND = 0x14
    COMPLETION = 0x20
    GOODBYE = 0x30


class Status(enum.Enum, shape=16):
    OK = 0
    INVALID_HANDLE = 1
    STALE_GENERATION = 2
    NOT_VALID = 3
    ALREADY_BOUND = 4
    NO_SPACE = 5
    SEALED = 6
    NOT_SEALED = 7
    TOO_LARGE = 8
    MALFORMED = 9
    INTERNAL = 10
    TICKET_ABANDONED = 11


class ReqFlags(enum.Flag, shape=16):
    """Flags of LOAD, STORE, ALLOC_STORE and FREE."""
    INLINE = 0x0001
    SEAL = 0x0002
    RECORD = 0x0004
    INVALIDATE = 0x0008
    ALLOW_UNSEALED = 0x0010


class GoodbyeFlags(enum.Flag, shape=16):
    RELEASE = 0x0001


_F = ReqFlags
#: Flag bits accepted per opcode: host/codec.py's strictness, which the engine decodes alike
#: (host/codec.py's module docstring says why some registered flags are not accepted).
ALLOWED_FLAGS = {
    Opcode.HELLO: 0,
    Opcode.HELLO_ACK: 0,
    Opcode.LOAD: (_F.RECORD | _F.INVALIDATE | _F.ALLOW_UNSEALED).value,
    Opcode.STORE: (_F.INLINE | _F.SEAL | _F.RECORD | _F.INVALIDATE).value,
    Opcode.ALLOC_STORE: (_F.INLINE | _F.SEAL | _F.RECORD | _F.INVALIDATE).value,
    Opcode.FREE: _F.RECORD.value,
    Opcode.BIND: 0,
    Opcode.COMPLETION: 0,
    Opcode.GOODBYE: GoodbyeFlags.RELEASE.value,
}


class Features(enum.Flag, shape=16):
    DIRECT_LOAD = 0x0001
    DIRECT_ALLOC = 0x0002
    RECORD_COMPLETION = 0x0004
    ADDR_LE = 0x0008


class EntryFlags(enum.Flag, shape=16):
    VALID = 0x0001
    SEALED = 0x0002


CommonHeader = wire_struct("CommonHeader", [
    ("version", 8), ("opcode", 8), ("flags", 16),
    ("request_id", 64), ("handle", 64),
    ("generation", 16), ("status", 16),
], "KBTP common header, 24 octets, starts every message.")

DataDescriptor = wire_struct("DataDescriptor", [
    ("stag", 32), ("tagged_offset", 64), ("length", 32),
], "Data Descriptor: a buffer of the initiator (16 octets).")

CompletionDescriptor = wire_struct("CompletionDescriptor", [
    ("stag", 32), ("tagged_offset", 64), ("reserved", 32),
], "Completion Descriptor: a 24-octet completion record slot of the initiator (16 octets).")

DirectDescriptor = wire_struct("DirectDescriptor", [
    ("stag", 32), ("tagged_offset", 64), ("count", 32),
], "Direct-mode descriptor of HELLO_ACK (16 octets).")

HelloBody = wire_struct("HelloBody", [
    ("requested_features", 16), ("completion_credits", 16), ("initiator_id", 128),
], "HELLO body after the common header (20 octets).")

HelloAckBody = wire_struct("HelloAckBody", [
    ("features", 16), ("request_credits", 16), ("block_size", 32), ("max_inline", 32),
    ("allocation_quota", 32), ("handle_base", 64), ("handle_count", 32),
    ("ticket_timeout_ms", 32),
], "HELLO_ACK body (Target Descriptor) before the direct-mode part (32 octets).")

DirectLoadPart = wire_struct("DirectLoadPart", [
    ("table_stag", 32), ("table_offset", 64), ("table_count", 32),
    ("table_base_handle", 64), ("reserved", 64),
    ("pool_stag", 32), ("pool_offset", 64), ("pool_count", 32),
], "HELLO_ACK DIRECT_LOAD part: Table descriptor, Table Base Handle, Pool descriptor (48).")

DirectAllocPart = wire_struct("DirectAllocPart", [
    ("partition_stag", 32), ("partition_offset", 64), ("partition_count", 32),
    ("ring_stag", 32), ("ring_offset", 64), ("ring_count", 32),
    ("head_stag", 32), ("head_offset", 64), ("head_count", 32),
], "HELLO_ACK DIRECT_ALLOC part: Partition, Ring and Head descriptors (48 octets).")

BindBody = wire_struct("BindBody", [
    ("ticket", 32), ("data_length", 32), ("block_offset", 64),
], "BIND body (16 octets).")

CompletionBody = wire_struct("CompletionBody", [
    ("data_length", 32), ("reserved", 32), ("block_offset", 64),
], "COMPLETION body (16 octets).")

TableEntry = wire_struct("TableEntry", [
    ("flags", 16), ("generation", 16), ("data_length", 32), ("block_offset", 64),
], "Block table entry (16 octets).")

RingSlot = wire_struct("RingSlot", [
    ("sequence", 32), ("reserved", 32), ("block_offset", 64),
], "Free-block ring slot (16 octets); Block Offset all ones = empty (consumed).")

CompletionRecord = wire_struct("CompletionRecord", [
    ("request_id", 64), ("status", 16), ("generation", 16), ("data_length", 32),
    ("block_offset", 64),
], "Completion record written to a Completion Descriptor (24 octets).")

# Ring counters (draft §Free-Block Ring): Ticket in bits 63..32, Slot Offset in bits n+3..0.
RING_ADD_DATA = 0x0000000100000010
RING_ADD_DATA_UNMASKED = 0x0000000100000000   # plain IB/RoCEv2 Fetch and Add variant
SLOT_EMPTY = (1 << 64) - 1


def ring_add_mask(n):
    """Add Mask for a ring of N = 2**n slots: bit 63 | bit 31 | bit (n+3)."""
    if not 0 <= n <= 27:
        raise ValueError(f"ring order n = {n} out of range 0..27 (Slot Offset must fit 31 bits)")
    return (1 << 63) | (1 << 31) | (1 << (n + 3))


# --------------------------------------------------------------------------------------------
# Ethernet, ARP, IPv4, UDP (roce-layouts.md §1, §8)
# --------------------------------------------------------------------------------------------

ETHERTYPE_IPV4 = 0x0800
ETHERTYPE_ARP = 0x0806
ROCE_UDP_PORT = 4791

EthernetHeader = wire_struct("EthernetHeader", [
    ("dst", 48), ("src", 48), ("ethertype", 16),
])

ArpPacket = wire_struct("ArpPacket", [
    ("htype", 16), ("ptype", 16), ("hlen", 8), ("plen", 8), ("oper", 16),
    ("sha", 48), ("spa", 32), ("tha", 48), ("tpa", 32),
], "ARP for IPv4 over Ethernet (28 octets).")

IPv4Header = wire_struct("IPv4Header", [
    ("version", 4), ("ihl", 4), ("tos", 8), ("total_length", 16),
    ("identification", 16), ("flags", 3), ("fragment_offset", 13),
    ("ttl", 8), ("protocol", 8), ("checksum", 16),
    ("src", 32), ("dst", 32),
], "IPv4 header without options (20 octets).")

UDPHeader = wire_struct("UDPHeader", [
    ("src_port", 16), ("dst_port", 16), ("length", 16), ("checksum", 16),
])


# --------------------------------------------------------------------------------------------
# RoCEv2 / InfiniBand transport headers (roce-layouts.md §2-§4)
# --------------------------------------------------------------------------------------------

class BthOpcode(enum.Enum, shape=8):
    SEND_FIRST = 0x00
    SEND_MIDDLE = 0x01
    SEND_LAST = 0x02
    SEND_LAST_IMM = 0x03
    SEND_ONLY = 0x04
    SEND_ONLY_IMM = 0x05
    WRITE_FIRST = 0x06
    WRITE_MIDDLE = 0x07
    WRITE_LAST = 0x08
    WRITE_LAST_IMM = 0x09
    WRITE_ONLY = 0x0A
    WRITE_ONLY_IMM = 0x0B
    READ_REQUEST = 0x0C
    READ_RESPONSE_FIRST = 0x0D
    READ_RESPONSE_MIDDLE = 0x0E
    READ_RESPONSE_LAST = 0x0F
    READ_RESPONSE_ONLY = 0x10
    ACKNOWLEDGE = 0x11
    ATOMIC_ACKNOWLEDGE = 0x12
    CMP_SWAP = 0x13
    FETCH_ADD = 0x14
    SEND_LAST_INV = 0x16
    SEND_ONLY_INV = 0x17
    UD_SEND_ONLY = 0x64
    UD_SEND_ONLY_IMM = 0x65


class AethSyndrome(enum.Enum, shape=8):
    ACK = 0x1F                  # ACK, no credit information (what rxe sends)
    RNR_NAK = 0x20              # | RNR timer code in bits 4:0
    NAK_PSN_SEQ_ERROR = 0x60
    NAK_INVALID_REQUEST = 0x61
    NAK_REMOTE_ACCESS = 0x62
    NAK_REMOTE_OPERATIONAL = 0x63


BTH = wire_struct("BTH", [
    ("opcode", 8), ("se", 1), ("migreq", 1), ("padcnt", 2), ("tver", 4), ("pkey", 16),
    ("fecn", 1), ("becn", 1), ("resv6", 6), ("dest_qp", 24),
    ("ackreq", 1), ("resv7", 7), ("psn", 24),
], "Base Transport Header (12 octets).")

RETH = wire_struct("RETH", [("va", 64), ("rkey", 32), ("dma_length", 32)])
AETH = wire_struct("AETH", [("syndrome", 8), ("msn", 24)])
AtomicETH = wire_struct("AtomicETH", [
    ("va", 64), ("rkey", 32), ("swap_add", 64), ("compare", 64),
])
AtomicAckETH = wire_struct("AtomicAckETH", [("orig_data", 64)])
ImmDt = wire_struct("ImmDt", [("imm", 32)])
IETH = wire_struct("IETH", [("rkey", 32)])
DETH = wire_struct("DETH", [("qkey", 32), ("reserved", 8), ("src_qp", 24)])

#: Extended headers following the BTH, per opcode, in wire order (roce-layouts.md §3).
EXT_HEADERS = {
    BthOpcode.SEND_FIRST: (), BthOpcode.SEND_MIDDLE: (), BthOpcode.SEND_LAST: (),
    BthOpcode.SEND_LAST_IMM: (ImmDt,), BthOpcode.SEND_ONLY: (), BthOpcode.SEND_ONLY_IMM: (ImmDt,),
    BthOpcode.WRITE_FIRST: (RETH,), BthOpcode.WRITE_MIDDLE: (), BthOpcode.WRITE_LAST: (),
    BthOpcode.WRITE_LAST_IMM: (ImmDt,), BthOpcode.WRITE_ONLY: (RETH,),
    BthOpcode.WRITE_ONLY_IMM: (RETH, ImmDt), BthOpcode.READ_REQUEST: (RETH,),
    BthOpcode.READ_RESPONSE_FIRST: (AETH,), BthOpcode.READ_RESPONSE_MIDDLE: (),
    BthOpcode.READ_RESPONSE_LAST: (AETH,), BthOpcode.READ_RESPONSE_ONLY: (AETH,),
    BthOpcode.ACKNOWLEDGE: (AETH,), BthOpcode.ATOMIC_ACKNOWLEDGE: (AETH, AtomicAckETH),
    BthOpcode.CMP_SWAP: (AtomicETH,), BthOpcode.FETCH_ADD: (AtomicETH,),
    BthOpcode.SEND_LAST_INV: (IETH,), BthOpcode.SEND_ONLY_INV: (IETH,),
    BthOpcode.UD_SEND_ONLY: (DETH,), BthOpcode.UD_SEND_ONLY_IMM: (DETH, ImmDt),
}


# --------------------------------------------------------------------------------------------
# roce.rc: InfiniBand CM over QP1 (roce-layouts.md §7.1-§7.6; Linux ibta_vol1_c12.h tables)
# --------------------------------------------------------------------------------------------

GSI_QKEY = 0x80010000          # DETH Q_Key of every QP1 (GSI) datagram
CM_MGMT_CLASS = 0x07           # MAD management class: Communication Management
CM_CLASS_VERSION = 2
MAD_METHOD_SEND = 0x03         # every CM message is a Send with R = 0
IP_CM_SERVICE_ID_TCP = 0x0000000001060000   # | 16-bit port (rdma_cm TCP port space)


class CmAttr(enum.Enum, shape=16):
    CLASS_PORT_INFO = 0x0001
    REQ = 0x0010
    MRA = 0x0011
    REJ = 0x0012
    REP = 0x0013
    RTU = 0x0014
    DREQ = 0x0015
    DREP = 0x0016
    SIDR_REQ = 0x0017
    SIDR_REP = 0x0018
    LAP = 0x0019
    APR = 0x001A


MadHeader = wire_struct("MadHeader", [
    ("base_version", 8), ("mgmt_class", 8), ("class_version", 8), ("method", 8),
    ("status", 16), ("class_specific", 16), ("tid", 64),
    ("attr_id", 16), ("reserved", 16), ("attr_mod", 32),
], "MAD common header (24 octets); bit 7 of `method` is the R (response) bit.")

CmReq = wire_struct("CmReq", [
    ("local_comm_id", 32), ("vendor_id", 32), ("service_id", 64), ("local_ca_guid", 64),
    ("rsvd24", 32), ("local_qkey", 32),
    ("local_qpn", 24), ("responder_resources", 8),
    ("local_eecn", 24), ("initiator_depth", 8),
    ("remote_eecn", 24), ("remote_cm_response_timeout", 5), ("transport_service_type", 2),
    ("e2e_flow_control", 1),
    ("starting_psn", 24), ("local_cm_response_timeout", 5), ("retry_count", 3),
    ("pkey", 16), ("path_mtu", 4), ("rdc_exists", 1), ("rnr_retry_count", 3),
    ("max_cm_retries", 4), ("srq", 1), ("ext_transport_type", 3),
    ("primary_local_lid", 16), ("primary_remote_lid", 16),
    ("primary_local_gid", 128), ("primary_remote_gid", 128),
    ("primary_flow_label", 20), ("rsvd88", 6), ("primary_packet_rate", 6),
    ("primary_traffic_class", 8), ("primary_hop_limit", 8),
    ("primary_sl", 4), ("primary_subnet_local", 1), ("rsvd94", 3),
    ("primary_local_ack_timeout", 5), ("rsvd95", 3),
    ("alternate_path", 44 * 8), ("private_data", 92 * 8),
], "CM REQ (ConnectRequest) message, 232 octets after the MAD header.")

CmRep = wire_struct("CmRep", [
    ("local_comm_id", 32), ("remote_comm_id", 32), ("local_qkey", 32),
    ("local_qpn", 24), ("rsvd15", 8), ("local_eecn", 24), ("rsvd19", 8),
    ("starting_psn", 24), ("rsvd23", 8),
    ("responder_resources", 8), ("initiator_depth", 8),
    ("target_ack_delay", 5), ("failover_accepted", 2), ("e2e_flow_control", 1),
    ("rnr_retry_count", 3), ("srq", 1), ("rsvd27", 4),
    ("local_ca_guid", 64), ("private_data", 196 * 8),
], "CM REP (ConnectReply) message, 232 octets.")

CmRtu = wire_struct("CmRtu", [
    ("local_comm_id", 32), ("remote_comm_id", 32), ("private_data", 224 * 8),
], "CM RTU (ReadyToUse) message, 232 octets.")

CmDrep = wire_struct("CmDrep", [
    ("local_comm_id", 32), ("remote_comm_id", 32), ("private_data", 224 * 8),
], "CM DREP (DisconnectReply) message, 232 octets.")

CmDreq = wire_struct("CmDreq", [
    ("local_comm_id", 32), ("remote_comm_id", 32), ("remote_qpn", 24), ("rsvd11", 8),
    ("private_data", 220 * 8),
], "CM DREQ (DisconnectRequest) message, 232 octets.")

CmRej = wire_struct("CmRej", [
    ("local_comm_id", 32), ("remote_comm_id", 32), ("msg_rejected", 2), ("rsvd8", 6),
    ("reject_info_length", 7), ("rsvd9", 1), ("reason", 16), ("ari", 72 * 8),
    ("private_data", 148 * 8),
], "CM REJ (ConnectReject) message, 232 octets.")

CmMra = wire_struct("CmMra", [
    ("local_comm_id", 32), ("remote_comm_id", 32), ("msg_mraed", 2), ("rsvd8", 6),
    ("service_timeout", 5), ("rsvd9", 3), ("private_data", 222 * 8),
], "CM MRA (MsgRcptAck) message, 232 octets.")

IpCmHeader = wire_struct("IpCmHeader", [
    ("maj_ver", 4), ("min_ver", 4), ("ip_ver", 4), ("rsvd1", 4), ("src_port", 16),
    ("src_ip", 128), ("dst_ip", 128),
], "RDMA IP CM Service header at the start of REQ private data (36 octets; annex A11).")

__all__ += [
    "GSI_QKEY", "CM_MGMT_CLASS", "CM_CLASS_VERSION", "MAD_METHOD_SEND", "IP_CM_SERVICE_ID_TCP",
    "CmAttr", "MadHeader", "CmReq", "CmRep", "CmRtu", "CmDrep", "CmDreq", "CmRej", "CmMra",
    "IpCmHeader",
]

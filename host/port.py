# Ref: hw/target/regbank.py (REG_TOP map, queues Q_NOTIFY/Q_WR/Q_WC/Q_REPOST, records LS word first),
#      hw/rdma/qp.py (QP / MR register maps), hw/iface.py (QpConfig, MrEntry, WorkRequest, ...),
#      hw/target/hostlink.py (Space, bus and UART wire protocol); host/link.py (UartLink).
"""The one narrow interface between host software and a :class:`hw.target.target.KbtpTarget`.

Everything the host does to the target is a 32-bit access on its host bus: ``Space.REG``
registers, ``Space.MEM`` target memory, ``Space.QUEUE`` record queues. :class:`TargetPort` is
written against one coroutine::

    access(space, addr, we, wdata) -> (rdata, err)

Backends
--------
* a cocotb bench passes a coroutine that drives the DUT's host-bus pins (tests/hw/target/cocotb_target.py);
* :func:`uart_access` adapts a :class:`host.link.UartLink` (synchronous serial, a board) to the
  same coroutine, so the driver runs unchanged on hardware;
* a test may pass any coroutine (a fake over a bytearray).

An access object may also offer ``mem_write(addr, octets)`` / ``mem_read(addr, n)`` coroutines
for bulk memory transfers and ``queue_push(q, words)`` / ``queue_pop(q, n) -> words`` for whole
records (:func:`uart_access` does: many words per UART frame); without them the port moves one
word per access.

Memory octet order: a ``Space.MEM`` word at ``addr`` holds octets ``addr .. addr+3`` with octet
``addr`` in bits 7..0 (the memory bus's little-endian lanes, hw/iface.py).

Example::

    port = TargetPort(uart_access(UartLink("/dev/ttyUSB1")))
    await port.mem_write(0x1000, b"abcd")
"""

import ipaddress

from amaranth.hdl import Shape
from amaranth.lib import data

from hw.iface import (REG_MR, REG_QP, REG_TOP, RecvNotify, RecvRepost, Space, WorkCompletion,
                     WorkRequest)
from hw.rdma.qp import MR_REGS, MR_STRIDE, QP_REGS, QP_STRIDE
from hw.target.regbank import (Q_NOTIFY, Q_REPOST, Q_WC, Q_WR, TOP_COUNTER_BASE, TOP_REGS,
                            record_words)

__all__ = ["TargetPort", "TargetHost", "HostError", "pack_record", "unpack_record",
           "record_words", "ip_value", "mac_value", "uart_access", "UartAccess"]


class HostError(Exception):
    """A host access that the target answered with ``err``.

    Attributes
    ----------
    op : str            'read' or 'write'
    space : Space
    addr : int
    value : int or None  the value written (writes)
    """

    def __init__(self, op, space, addr, value=None, why=""):
        self.op, self.space, self.addr, self.value = op, Space(space), addr, value
        text = f"{op} {self.space.name} {addr:#x}"
        if value is not None:
            text += f" value {value:#x}"
        super().__init__(text + (f": {why}" if why else ": target answered err"))


def ip_value(ip):
    """IPv4 address string -> 32-bit value (10.0.0.1 -> 0x0A000001)."""
    return int(ipaddress.IPv4Address(ip))


def mac_value(mac):
    """MAC address string 'aa:bb:..' -> 48-bit value."""
    return int(mac.replace(":", ""), 16)


def _fields(layout):
    for name, f in data.Layout.cast(layout):
        yield name, f.offset, Shape.cast(f.shape).width, f.shape


def pack_record(layout, **values):
    """Pack ``values`` (by field name; enum members allowed) into the layout's integer value."""
    v = 0
    names = set()
    for name, off, width, _ in _fields(layout):
        names.add(name)
        x = values.get(name, 0)
        x = getattr(x, "value", x)
        if not 0 <= x < 1 << width:
            raise ValueError(f"{name}={x} does not fit {width} bits")
        v |= x << off
    unknown = set(values) - names
    if unknown:
        raise KeyError(f"no such field(s) {unknown}")
    return v


def unpack_record(layout, v):
    """Integer value of a record -> dict of field values (ints)."""
    return {name: (v >> off) & ((1 << width) - 1) for name, off, width, _ in _fields(layout)}


class TargetPort:
    """Registers, memory, queues, QP and MR tables of a KbtpTarget over one access coroutine.

    Parameters
    ----------
    access : async callable ``(space, addr, we, wdata) -> (rdata, err)``
        Optionally with ``mem_write(addr, octets)`` and ``mem_read(addr, n)`` coroutine
        attributes for bulk memory (word-aligned, lengths multiples of 4).
    """

    def __init__(self, access):
        self.access = access
        self.accesses = 0           # bus accesses issued (a cost figure for logs)

    # ---- single accesses -------------------------------------------------------------------
    async def write(self, space, addr, value):
        """Write one 32-bit word; HostError on ``err``."""
        value &= 0xFFFFFFFF
        self.accesses += 1
        _, err = await self.access(space, addr, 1, value)
        if err:
            raise HostError("write", space, addr, value)

    async def read(self, space, addr):
        """Read one 32-bit word; HostError on ``err``."""
        self.accesses += 1
        v, err = await self.access(space, addr, 0, 0)
        if err:
            raise HostError("read", space, addr)
        return v

    async def wreg(self, addr, value):
        await self.write(Space.REG, addr, value)

    async def rreg(self, addr):
        return await self.read(Space.REG, addr)

    async def wreg64(self, addr_lo, value):
        """Write a 64-bit register pair: low word at ``addr_lo``, high word at ``addr_lo + 4``."""
        await self.wreg(addr_lo, value & 0xFFFFFFFF)
        await self.wreg(addr_lo + 4, (value >> 32) & 0xFFFFFFFF)

    async def rreg64(self, addr_lo):
        return await self.rreg(addr_lo) | await self.rreg(addr_lo + 4) << 32

    # ---- configuration -------------------------------------------------------------------
    async def set_own(self, mac, ip):
        await self.wreg(REG_TOP + TOP_REGS["own_mac_hi"], mac_value(mac) >> 32)
        await self.wreg(REG_TOP + TOP_REGS["own_mac_lo"], mac_value(mac))
        await self.wreg(REG_TOP + TOP_REGS["own_ip"], ip_value(ip))

    async def top_counter(self, index):
        return await self.rreg(REG_TOP + TOP_COUNTER_BASE + 4 * index)

    async def set_qp(self, i, *, state, **cfg):
        """Write QP ``i``'s fields (QpConfig names; peer_mac/peer_ip may be strings), then state
        (the state write makes the transport load its PSNs)."""
        base = REG_QP + QP_STRIDE * i
        for k in ("peer_mac", "peer_ip"):
            if isinstance(cfg.get(k), str):
                cfg[k] = (mac_value if k == "peer_mac" else ip_value)(cfg[k])
        unknown = set(cfg) - {path for path, _, _ in QP_REGS.values()}
        if unknown:
            raise KeyError(f"no such QP field(s) {unknown}")
        for off, (path, lo, bits) in sorted(QP_REGS.items()):
            if path == "state" or path not in cfg:
                continue
            await self.wreg(base + off, (cfg[path] >> lo) & ((1 << bits) - 1))
        await self.wreg(base, getattr(state, "value", state))

    async def set_mr(self, j, *, valid=1, read=1, write=1, atomic=0, **cfg):
        """Write MR ``j`` (MrEntry names), control word (valid + rights) last."""
        base = REG_MR + MR_STRIDE * j
        unknown = set(cfg) - {path for path, _, _ in MR_REGS.values()}
        if unknown:
            raise KeyError(f"no such MR field(s) {unknown}")
        for off, (path, lo, bits) in sorted(MR_REGS.items()):
            await self.wreg(base + off, (cfg.get(path, 0) >> lo) & ((1 << bits) - 1))
        await self.wreg(base, valid | read << 1 | write << 2 | atomic << 3)

    # ---- memory --------------------------------------------------------------------------
    async def _write_words(self, addr, octets):
        bulk = getattr(self.access, "mem_write", None)
        if bulk is not None:
            self.accesses += len(octets) // 4
            await bulk(addr, bytes(octets))
            return
        for k in range(0, len(octets), 4):
            await self.write(Space.MEM, addr + k, int.from_bytes(octets[k:k + 4], "little"))

    async def _read_words(self, addr, n):
        bulk = getattr(self.access, "mem_read", None)
        if bulk is not None:
            self.accesses += n // 4
            return bytes(await bulk(addr, n))
        out = bytearray()
        for k in range(0, n, 4):
            out += (await self.read(Space.MEM, addr + k)).to_bytes(4, "little")
        return bytes(out)

    async def mem_write(self, addr, octets):
        """Write ``octets`` at ``addr`` (any alignment: partial edge words are read, merged and
        written back, so the caller must own the neighbouring octets of those words)."""
        octets = bytes(octets)
        if not octets:
            return
        lo = addr & ~3
        hi = (addr + len(octets) + 3) & ~3
        if lo == addr and hi == addr + len(octets):
            await self._write_words(addr, octets)
            return
        buf = bytearray(hi - lo)
        if lo != addr:
            buf[0:4] = await self._read_words(lo, 4)
        if hi != addr + len(octets) and (hi - 4 != lo or lo == addr):
            buf[-4:] = await self._read_words(hi - 4, 4)
        buf[addr - lo:addr - lo + len(octets)] = octets
        await self._write_words(lo, bytes(buf))

    async def mem_read(self, addr, n):
        """Read ``n`` octets from ``addr`` (any alignment)."""
        if n <= 0:
            return b""
        lo = addr & ~3
        hi = (addr + n + 3) & ~3
        raw = await self._read_words(lo, hi - lo)
        return raw[addr - lo:addr - lo + n]

    # ---- queues --------------------------------------------------------------------------
    async def _push(self, q, layout, **fields):
        v = pack_record(layout, **fields)
        words = [(v >> (32 * k)) & 0xFFFFFFFF for k in range(record_words(layout))]
        bulk = getattr(self.access, "queue_push", None)
        if bulk is not None:
            self.accesses += len(words)
            await bulk(q, words)
            return
        for w in words:
            await self.write(Space.QUEUE, q, w)

    async def _pop(self, q, layout):
        """One record, or None when the queue is empty."""
        n = record_words(layout)
        bulk = getattr(self.access, "queue_pop", None)
        if bulk is not None:
            self.accesses += n
            words = await bulk(q, n)
            if not words:
                return None
            if len(words) != n:
                raise HostError("read", Space.QUEUE, q,
                                why=f"record cut short: {len(words)} of {n} words")
            return unpack_record(layout, sum(w << (32 * k) for k, w in enumerate(words)))
        self.accesses += 1
        v0, err = await self.access(Space.QUEUE, q, 0, 0)
        if err:
            return None
        v = v0
        for k in range(1, n):
            v |= (await self.read(Space.QUEUE, q)) << (32 * k)
        return unpack_record(layout, v)

    async def post_wr(self, **fields):
        """Push a WorkRequest (host wr_ids are 15 bits: the target tags bit 15)."""
        await self._push(Q_WR, WorkRequest, **fields)

    async def repost(self, qp):
        """Return one receive buffer of ``qp`` (RecvRepost)."""
        await self._push(Q_REPOST, RecvRepost, qp=qp)

    async def poll_wc(self):
        """One WorkCompletion dict, or None."""
        return await self._pop(Q_WC, WorkCompletion)

    async def poll_notify(self):
        """One RecvNotify dict (slow-path message), or None."""
        return await self._pop(Q_NOTIFY, RecvNotify)


#: The historical name (tests/hw/target/target_host.py, the cocotb bench).
TargetHost = TargetPort


# --------------------------------------------------------------------------------------------
# UART backend
# --------------------------------------------------------------------------------------------

class UartAccess:
    """Async access callable over a :class:`host.link.UartLink` (see :func:`uart_access`).

    A UART data word is a big-endian 32-bit value (hw/target/hostlink.py); a ``Space.MEM`` word's
    octet 0 is its bits 7..0, so bulk memory transfers reverse the octets of every word.
    """

    def __init__(self, link):
        self.link = link

    async def __call__(self, space, addr, we, wdata):
        from host.link import LinkStatusError
        space = Space(space)
        link = self.link
        try:
            if space is Space.REG:
                if we:
                    link.write_reg(addr, wdata)
                    return 0, 0
                return link.read_reg(addr), 0
            if space is Space.MEM:
                if we:
                    link.write_mem(addr, wdata.to_bytes(4, "big"))
                    return 0, 0
                return int.from_bytes(link.read_mem(addr, 4), "big"), 0
            if we:
                link.push(addr, [wdata])
                return 0, 0
            words = link.pop(addr, 1)
            return (words[0], 0) if words else (0, 1)
        except LinkStatusError:
            # BUS_ERROR (err on the bus), QUEUE_FULL: the access was refused.
            return 0, 1

    @staticmethod
    def _swap(octets):
        return b"".join(octets[k:k + 4][::-1] for k in range(0, len(octets), 4))

    async def mem_write(self, addr, octets):
        from host.link import LinkStatusError
        try:
            self.link.write_mem(addr, self._swap(octets))
        except LinkStatusError as e:
            raise HostError("write", Space.MEM, addr + 4 * e.done,
                            why=f"bulk write of {len(octets)} octets: {e}") from e

    async def queue_push(self, q, words):
        """Push one record's words in one frame; HostError if the target refuses (full)."""
        from host.link import LinkStatusError
        try:
            self.link.push(q, words)
        except LinkStatusError as e:
            raise HostError("write", Space.QUEUE, q, words[min(e.done, len(words) - 1)],
                            why=f"push of {len(words)} words: {e}") from e

    async def queue_pop(self, q, n):
        """Pop up to ``n`` words in one frame (fewer when the queue runs empty)."""
        return self.link.pop(q, n)

    async def mem_read(self, addr, n):
        from host.link import LinkStatusError
        try:
            return self._swap(self.link.read_mem(addr, n))
        except LinkStatusError as e:
            raise HostError("read", Space.MEM, addr + 4 * e.done,
                            why=f"bulk read of {n} octets: {e}") from e


def uart_access(link):
    """Adapt a synchronous :class:`host.link.UartLink` to the port's async access callable
    (with bulk ``mem_write`` / ``mem_read`` and one-frame ``queue_push`` / ``queue_pop``).
    Link timeouts and framing errors propagate as :class:`host.link.LinkError`; refused
    accesses answer ``err``."""
    return UartAccess(link)

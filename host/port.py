# Ref: hw/target/regbank.py (REG_TOP map, queues Q_NOTIFY/Q_WR/Q_WC/Q_REPOST, records LS word first),
#      hw/rdma/qp.py (QP / MR register maps), hw/iface.py (QpConfig, MrEntry, WorkRequest, ...),
#      hw/target/hostlink.py (Space, bus and UART wire protocol); host/link.py (UartLink),
#      host/udplink.py (UdpLink).
"""The one narrow interface between host software and a :class:`hw.target.target.KbtpTarget`.

Everything the host does to the target is a 32-bit access on its host bus: ``Space.REG``
registers, ``Space.MEM`` target memory, ``Space.QUEUE`` record queues. :class:`TargetPort` is
written against one coroutine::

    access(space, addr, we, wdata) -> (rdata, err)

Backends
--------
* a cocotb bench passes a coroutine that drives the DUT's host-bus pins (tests/hw/target/cocotb_target.py);
* :func:`link_access` adapts a host link,
  :class:`host.link.UartLink` (serial) or :class:`host.udplink.UdpLink` (the target's Ethernet
  port), to the same coroutine, so the driver runs unchanged on hardware;
* a test may pass any coroutine (a fake over a bytearray).

An access object may also offer ``mem_write(addr, octets)`` / ``mem_read(addr, n)`` coroutines
for bulk memory transfers and ``queue_push(q, words)`` / ``queue_pop(q, n) -> words`` for whole
records (:func:`link_access` does: many words per frame); without them the port moves one
word per access. With ``run_ops(ops)`` (:class:`LinkAccess`) it also carries out a list of
accesses in one link exchange: :meth:`TargetPort.batch` and :meth:`TargetPort.reads` use it.

Memory octet order: a ``Space.MEM`` word at ``addr`` holds octets ``addr .. addr+3`` with octet
``addr`` in bits 7..0 (the memory bus's little-endian lanes, hw/iface.py).

Example::

    port = TargetPort(link_access(UartLink("/dev/ttyUSB1")))
    await port.mem_write(0x1000, b"abcd")
    async with port.batch():                # over a UdpLink: one datagram for the three
        await port.wreg(0x100, 1)
        await port.wreg(0x104, 2)
        assert await port.rreg(0x108) == 0
"""

import contextlib
import ipaddress

from amaranth.hdl import Shape
from amaranth.lib import data

from hw.iface import (REG_MR, REG_QP, REG_TOP, RecvNotify, RecvRepost, Space, WorkCompletion,
                     WorkRequest)
from hw.rdma.qp import MR_REGS, MR_STRIDE, QP_REGS, QP_STRIDE
from hw.target.regbank import (Q_NOTIFY, Q_REPOST, Q_WC, Q_WR, TOP_COUNTER_BASE, TOP_REGS,
                            record_words)

__all__ = ["TargetPort", "PortReads", "HostError", "pack_record", "unpack_record",
           "record_words", "ip_value", "mac_value", "link_access", "LinkAccess"]


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
        attributes for bulk memory (word-aligned, lengths multiples of 4), and with
        ``run_ops(ops)`` (:class:`LinkAccess`) for batches.
    batching : bool
        Let :meth:`batch` collect accesses (False: every access goes out at once, as before
        batching existed; for comparisons).

    Batches
    -------
    Inside ``async with port.batch():`` over an access with ``run_ops``, writes, pushes and
    bulk memory writes are queued instead of sent; a read sends the queue followed by itself in
    one ``run_ops`` (one link exchange), and the end of the outermost ``batch`` sends what is
    left. The target sees the same accesses in the same order, only later; an error of a
    queued write is raised by the call that sends it. :meth:`reads` collects several reads for
    one exchange. Without ``run_ops`` (a fake, a simulator's bus) ``batch`` changes nothing.
    """

    def __init__(self, access, *, batching=True):
        self.access = access
        self.accesses = 0           # bus accesses issued (a cost figure for logs)
        self.batching = batching
        self._depth = 0
        self._queued = []           # ops waiting for the next exchange (batches)

    # ---- batches ---------------------------------------------------------------------------
    @property
    def batched(self):
        """True inside :meth:`batch` over an access that runs op lists."""
        return self._depth > 0 and self.batching and hasattr(self.access, "run_ops")

    @contextlib.asynccontextmanager
    async def batch(self):
        """Collect accesses (see the class docstring); nests."""
        self._depth += 1
        try:
            yield self
        except BaseException as exc:
            self._depth -= 1
            if not self._depth:
                try:
                    await self.flush()
                except Exception as flush_error:    # noqa: BLE001 - the first error is raised
                    exc.add_note(f"the batch's flush failed too: {flush_error!r}")
            raise
        self._depth -= 1
        if not self._depth:
            await self.flush()

    async def flush(self, *reads):
        """Send the queued ops followed by ``reads`` (op tuples, see :class:`LinkAccess`) in one
        ``run_ops``; the results of ``reads``. HostError: the first op that failed."""
        ops = self._queued + list(reads)
        self._queued = []
        if not ops:
            return []
        results = await self.access.run_ops(ops)
        for r in results:
            if isinstance(r, HostError):
                raise r
        return results[len(ops) - len(reads):]

    def reads(self):
        """A :class:`PortReads`: reads collected for one exchange."""
        return PortReads(self)

    # ---- single accesses -------------------------------------------------------------------
    async def write(self, space, addr, value):
        """Write one 32-bit word; HostError on ``err``."""
        value &= 0xFFFFFFFF
        self.accesses += 1
        if self.batched:
            self._queued.append(("write", Space(space), addr, value))
            return
        _, err = await self.access(space, addr, 1, value)
        if err:
            raise HostError("write", space, addr, value)

    async def read(self, space, addr):
        """Read one 32-bit word; HostError on ``err``."""
        self.accesses += 1
        if self.batched:
            return (await self.flush(("read", Space(space), addr)))[0]
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

    async def _write_fields(self, base, regs, what, cfg, absent=None):
        """Write the register words (``regs``: offset -> (field, low bit, bits)) of the fields
        in ``cfg``, in offset order; a field not in ``cfg`` is written as ``absent``, or not at
        all when ``absent`` is None. A field split over two words (an MR's 64-bit qp_mask)
        writes both."""
        unknown = set(cfg) - {path for path, _, _ in regs.values()}
        if unknown:
            raise KeyError(f"no such {what} field(s) {unknown}")
        for off, (path, lo, bits) in sorted(regs.items()):
            value = cfg.get(path, absent)
            if value is not None:
                await self.wreg(base + off, (value >> lo) & ((1 << bits) - 1))

    async def set_qp(self, i, *, state, **cfg):
        """Write QP ``i``'s fields (QpConfig names; peer_mac/peer_ip may be strings), then state
        (the state write makes the transport load its PSNs)."""
        base = REG_QP + QP_STRIDE * i
        for k in ("peer_mac", "peer_ip"):
            if isinstance(cfg.get(k), str):
                cfg[k] = (mac_value if k == "peer_mac" else ip_value)(cfg[k])
        await self._write_fields(base, QP_REGS, "QP", cfg)
        await self.wreg(base, getattr(state, "value", state))

    async def set_mr(self, j, *, valid=1, read=1, write=1, atomic=0, **cfg):
        """Write MR ``j`` (MrEntry names; a field not given is written 0), control word
        (valid + rights) last."""
        base = REG_MR + MR_STRIDE * j
        await self._write_fields(base, MR_REGS, "MR", cfg, absent=0)
        await self.wreg(base, valid | read << 1 | write << 2 | atomic << 3)

    async def set_mr_mask(self, j, mask):
        """Write MR ``j``'s qp_mask alone (bit i: QP i may use the region)."""
        await self._write_fields(REG_MR + MR_STRIDE * j, MR_REGS, "MR", {"qp_mask": mask})

    # ---- memory --------------------------------------------------------------------------
    async def _write_words(self, addr, octets):
        if self.batched:
            self.accesses += len(octets) // 4
            self._queued.append(("mem_write", addr, bytes(octets)))
            return
        bulk = getattr(self.access, "mem_write", None)
        if bulk is not None:
            self.accesses += len(octets) // 4
            await bulk(addr, bytes(octets))
            return
        for k in range(0, len(octets), 4):
            await self.write(Space.MEM, addr + k, int.from_bytes(octets[k:k + 4], "little"))

    async def _read_words(self, addr, n):
        if self.batched:
            self.accesses += n // 4
            return (await self.flush(("mem_read", addr, n)))[0]
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
        lo, hi = _span(addr, n)
        raw = await self._read_words(lo, hi - lo)
        return raw[addr - lo:addr - lo + n]

    # ---- queues --------------------------------------------------------------------------
    async def _push(self, q, layout, **fields):
        v = pack_record(layout, **fields)
        words = [(v >> (32 * k)) & 0xFFFFFFFF for k in range(record_words(layout))]
        self.accesses += len(words)
        if self.batched:
            self._queued.append(("push", q, words))
            return
        bulk = getattr(self.access, "queue_push", None)
        if bulk is not None:
            await bulk(q, words)
            return
        for w in words:
            _, err = await self.access(Space.QUEUE, q, 1, w)
            if err:
                raise HostError("write", Space.QUEUE, q, w)

    def _records(self, q, layout, words, asked):
        """Records of popped ``words`` (``asked`` words were asked for); counts the accesses
        (one more for the pop that found the queue empty)."""
        n = record_words(layout)
        self.accesses += len(words) + (len(words) < asked)
        if len(words) % n:
            raise HostError("read", Space.QUEUE, q,
                            why=f"record cut short: {len(words) % n} of {n} words")
        return [unpack_record(layout, sum(w << (32 * k) for k, w in enumerate(words[i:i + n])))
                for i in range(0, len(words), n)]

    async def pop_records(self, q, layout, max_records):
        """Up to ``max_records`` records of queue ``q`` (fewer when it runs empty): one bulk pop
        where the access allows."""
        n = record_words(layout)
        if self.batched:
            words = (await self.flush(("pop", q, n * max_records)))[0]
        else:
            bulk = getattr(self.access, "queue_pop", None)
            if bulk is None:
                out = []
                while len(out) < max_records:
                    r = await self._pop(q, layout)
                    if r is None:
                        break
                    out.append(r)
                return out
            words = list(await bulk(q, n * max_records))
        return self._records(q, layout, words, n * max_records)

    async def _pop(self, q, layout):
        """One record, or None when the queue is empty."""
        n = record_words(layout)
        if self.batched or getattr(self.access, "queue_pop", None) is not None:
            recs = await self.pop_records(q, layout, 1)
            return recs[0] if recs else None
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

    async def poll_wcs(self, max_records):
        """Up to ``max_records`` WorkCompletion dicts in one bulk pop where possible."""
        return await self.pop_records(Q_WC, WorkCompletion, max_records)


def _span(addr, n):
    """Word-aligned ``[lo, hi)`` around ``n`` octets at ``addr``."""
    return addr & ~3, (addr + n + 3) & ~3


class PortReads:
    """Reads collected for one exchange (:meth:`TargetPort.reads`): each method returns an
    index into what :meth:`run` returns. In a batch over a link they go out together (after
    the queued writes); otherwise one after the other."""

    def __init__(self, port):
        self.port = port
        self._items = []

    def _add(self, item):
        self._items.append(item)
        return len(self._items) - 1

    def mem(self, addr, n):
        """``n`` octets of target memory at ``addr`` (any alignment)."""
        return self._add(("mem", addr, n))

    def reg(self, addr):
        """One register."""
        return self._add(("reg", addr))

    def records(self, q, layout, max_records):
        """Up to ``max_records`` records of queue ``q`` (a list)."""
        return self._add(("records", q, layout, max_records))

    async def run(self):
        port = self.port
        if not self._items:
            return []
        if not port.batched:
            out = []
            for kind, *a in self._items:
                if kind == "mem":
                    out.append(await port.mem_read(*a))
                elif kind == "reg":
                    out.append(await port.rreg(*a))
                else:
                    out.append(await port.pop_records(*a))
            return out
        ops = []
        for kind, *a in self._items:
            if kind == "mem" and a[1] <= 0:
                continue
            if kind == "mem":
                lo, hi = _span(a[0], a[1])
                port.accesses += (hi - lo) // 4
                ops.append(("mem_read", lo, hi - lo))
            elif kind == "reg":
                port.accesses += 1
                ops.append(("read", Space.REG, a[0]))
            else:
                ops.append(("pop", a[0], record_words(a[1]) * a[2]))
        res = iter(await port.flush(*ops))
        out = []
        for kind, *a in self._items:
            r = b"" if kind == "mem" and a[1] <= 0 else next(res)
            if kind == "mem":
                off = a[0] - _span(a[0], a[1])[0]
                out.append(r[off:off + a[1]])
            elif kind == "reg":
                out.append(r)
            else:
                out.append(port._records(a[0], a[1], r, record_words(a[1]) * a[2]))
        return out


# --------------------------------------------------------------------------------------------
# Link backends (UART, UDP)
# --------------------------------------------------------------------------------------------

def _swap(octets):
    """Reverse the octets of every word (link words are big-endian, memory lanes little)."""
    return b"".join(octets[k:k + 4][::-1] for k in range(0, len(octets), 4))


class LinkAccess:
    """Async access callable over a host link (:class:`host.link.UartLink`,
    :class:`host.udplink.UdpLink`; see :func:`link_access`).

    A link data word is a big-endian 32-bit value (hw/target/hostlink.py); a ``Space.MEM``
    word's octet 0 is its bits 7..0, so bulk memory transfers reverse the octets of every word.

    :meth:`run_ops` carries out a list of ops in one :meth:`~host.link.FrameLink.exchange`
    (what :meth:`TargetPort.batch` sends)::

        ("write", space, addr, value)   ("read", space, addr)        one word
        ("mem_write", addr, octets)     ("mem_read", addr, n)        word-aligned memory
        ("push", queue, words)          ("pop", queue, n)            queue words

    Consecutive writes to consecutive addresses of one space, and consecutive pushes to one
    queue, share a frame (the target sees the same word accesses in the same order). Each op's
    result is its value (None for writes; a single read of an empty queue fails) or a
    :class:`HostError` for an op the target refused.
    """

    def __init__(self, link):
        self.link = link

    # ---- op lists --------------------------------------------------------------------------
    @staticmethod
    def _unit(op):
        """``(link op, key, words or None)`` of one port op; ``key`` says what may merge."""
        kind = op[0]
        if kind == "write":
            _, space, addr, value = op
            lop = {Space.REG: "write_regs", Space.MEM: "write_mem"}.get(Space(space), "push")
            return lop, addr, [value]
        if kind == "mem_write":
            _, addr, octets = op
            return "write_mem", addr, [int.from_bytes(octets[k:k + 4], "little")
                                       for k in range(0, len(octets), 4)]
        if kind == "push":
            return "push", op[1], list(op[2])
        return kind, None, None

    def _run(self, ops):
        b = self.link.batch()
        units = []                  # (batch index, link op, addr, words, [(op index, first)])
        for i, op in enumerate(ops):
            lop, addr, words = self._unit(op)
            if words is not None:
                if units and units[-1][1] == lop and units[-1][3] is not None and (
                        units[-1][2] == addr if lop == "push"
                        else units[-1][2] + 4 * len(units[-1][3]) == addr):
                    units[-1][4].append((i, len(units[-1][3])))
                    units[-1][3].extend(words)
                else:
                    units.append([None, lop, addr, list(words), [(i, 0)]])
                continue
            units.append([None, lop, None, None, [(i, 0)]])
        for u in units:
            lop, words, i = u[1], u[3], u[4][0][0]
            if lop == "write_mem":
                u[0] = b.write_mem(u[2], b"".join(w.to_bytes(4, "big") for w in words))
            elif words is not None:
                u[0] = getattr(b, lop)(u[2], words)
            else:
                u[0] = self._read(b, ops[i])
        results = b.run(check=False)
        out = [None] * len(ops)
        for k, _, _, words, members in units:
            r = results[k]
            for j, (i, first) in enumerate(members):
                end = members[j + 1][1] if j + 1 < len(members) else len(words or ())
                if isinstance(r, Exception) and (words is None or r.done < end):
                    out[i] = self._error(ops[i], r, max(0, r.done - first))
                elif words is None:
                    out[i] = self._value(ops[i], r)
        return out

    @staticmethod
    def _read(b, op):
        kind, *a = op
        if kind == "read":
            space, addr = Space(a[0]), a[1]
            if space is Space.REG:
                return b.read_reg(addr)
            return b.read_mem(addr, 4) if space is Space.MEM else b.pop(addr, 1)
        if kind == "mem_read":
            return b.read_mem(*a)
        if kind == "pop":
            return b.pop(*a)
        raise ValueError(f"unknown host-port op {op!r}")

    @staticmethod
    def _value(op, r):
        if op[0] == "mem_read":
            return _swap(r)
        if op[0] != "read" or Space(op[1]) is Space.REG:
            return r
        if Space(op[1]) is Space.MEM:
            return int.from_bytes(r, "big")
        return r[0] if r else HostError("read", Space.QUEUE, op[2])

    @staticmethod
    def _error(op, e, done):
        """The HostError of ``op``, ``done`` of whose words went through before ``e``."""
        kind, *a = op
        if kind in ("write", "read"):
            return HostError(kind, a[0], a[1], a[2] if kind == "write" else None, why=str(e))
        if kind == "mem_write":
            return HostError("write", Space.MEM, a[0] + 4 * done,
                             why=f"bulk write of {len(a[1])} octets: {e}")
        if kind == "mem_read":
            return HostError("read", Space.MEM, a[0] + 4 * done,
                             why=f"bulk read of {a[1]} octets: {e}")
        if kind == "push":
            words = a[1]
            return HostError("write", Space.QUEUE, a[0], words[min(done, len(words) - 1)],
                             why=f"push of {len(words)} words: {e}")
        return HostError("read", Space.QUEUE, a[0], why=f"pop of {a[1]} words: {e}")

    async def run_ops(self, ops):
        """Results of ``ops`` (see the class docstring), one link exchange."""
        return self._run(ops)

    def _one(self, op):
        r = self._run([op])[0]
        if isinstance(r, HostError):
            raise r
        return r

    # ---- the access coroutine and its bulk helpers ----------------------------------------
    async def __call__(self, space, addr, we, wdata):
        op = ("write", Space(space), addr, wdata) if we else ("read", Space(space), addr)
        r = self._run([op])[0]
        # BUS_ERROR (err on the bus), QUEUE_FULL, an empty queue: the access was refused.
        return (0, 1) if isinstance(r, HostError) else (r or 0, 0)

    async def mem_write(self, addr, octets):
        self._one(("mem_write", addr, bytes(octets)))

    async def mem_read(self, addr, n):
        return self._one(("mem_read", addr, n))

    async def queue_push(self, q, words):
        """Push one record's words in one frame; HostError if the target refuses (full)."""
        self._one(("push", q, list(words)))

    async def queue_pop(self, q, n):
        """Pop up to ``n`` words in one frame (fewer when the queue runs empty)."""
        return self._one(("pop", q, n))


def link_access(link):
    """Adapt a synchronous host link (:class:`host.link.UartLink`,
    :class:`host.udplink.UdpLink`) to the port's async access callable, with bulk
    ``mem_write`` / ``mem_read``, one-frame ``queue_push`` / ``queue_pop`` and ``run_ops``
    (batches: :meth:`TargetPort.batch`). Link timeouts and framing errors propagate as
    :class:`host.link.LinkError`; refused accesses answer ``err``."""
    return LinkAccess(link)

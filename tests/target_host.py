# Ref: hw/rtl/regbank.py (REG_TOP map, queues), hw/rtl/qp.py (QP / MR register maps),
#      hw/rtl/iface.py (QpConfig, MrEntry, WorkRequest, ...); hw/rtl/hostlink.py (Space).
"""Host-side driver of :class:`hw.rtl.target.KbtpTarget` for tests.

The driver is written against one coroutine ``access(space, addr, we, wdata) -> (rdata, err)``
(a cocotb bench drives the pins; anything else that can do one host-bus access works too).
Queue records are packed from the Amaranth layouts in hw/rtl/iface.py by field name.
"""

import ipaddress

from amaranth.hdl import Shape
from amaranth.lib import data

from hw.rtl.hostlink import Space
from hw.rtl.iface import (REG_MR, REG_QP, REG_TOP, RecvNotify, RecvRepost, WorkCompletion,
                          WorkRequest)
from hw.rtl.qp import MR_REGS, MR_STRIDE, QP_REGS, QP_STRIDE
from hw.rtl.regbank import (Q_NOTIFY, Q_REPOST, Q_WC, Q_WR, TOP_COUNTER_BASE, TOP_REGS,
                            record_words)

__all__ = ["TargetHost", "pack_record", "unpack_record", "HostError", "ip_value",
           "mac_value"]


class HostError(Exception):
    """A host access answered with ``err``."""


def ip_value(ip):
    return int(ipaddress.IPv4Address(ip))


def mac_value(mac):
    return int(mac.replace(":", ""), 16)


def _fields(layout):
    for name, f in data.Layout.cast(layout):
        yield name, f.offset, Shape.cast(f.shape).width, f.shape


def pack_record(layout, **values):
    """Pack ``values`` (by field name; nested structs not needed here) into an int."""
    v = 0
    names = set()
    for name, off, width, shape in _fields(layout):
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
    return {name: (v >> off) & ((1 << width) - 1) for name, off, width, _ in _fields(layout)}


class TargetHost:
    """Program and use a KbtpTarget through its host bus.

    Parameters
    ----------
    access : async callable ``(space, addr, we, wdata) -> (rdata, err)``
    """

    def __init__(self, access):
        self.access = access

    async def write(self, space, addr, value):
        _, err = await self.access(space, addr, 1, value & 0xFFFFFFFF)
        if err:
            raise HostError(f"write {Space(space).name} {addr:#x}")

    async def read(self, space, addr):
        v, err = await self.access(space, addr, 0, 0)
        if err:
            raise HostError(f"read {Space(space).name} {addr:#x}")
        return v

    async def wreg(self, addr, value):
        await self.write(Space.REG, addr, value)

    async def rreg(self, addr):
        return await self.read(Space.REG, addr)

    # ---- configuration -------------------------------------------------------------------
    async def set_own(self, mac, ip):
        await self.wreg(REG_TOP + TOP_REGS["own_mac_hi"], mac_value(mac) >> 32)
        await self.wreg(REG_TOP + TOP_REGS["own_mac_lo"], mac_value(mac))
        await self.wreg(REG_TOP + TOP_REGS["own_ip"], ip_value(ip))

    async def top_counter(self, index):
        return await self.rreg(REG_TOP + TOP_COUNTER_BASE + 4 * index)

    async def set_qp(self, i, *, state, **cfg):
        """Write QP ``i``'s fields (QpConfig names; peer_mac/peer_ip as strings), then state
        (the state write makes the transport load its PSNs)."""
        base = REG_QP + QP_STRIDE * i
        for k in ("peer_mac", "peer_ip"):
            if isinstance(cfg.get(k), str):
                cfg[k] = (mac_value if k == "peer_mac" else ip_value)(cfg[k])
        for off, (path, lo, bits) in sorted(QP_REGS.items()):
            if path == "state" or path not in cfg:
                continue
            await self.wreg(base + off, (cfg[path] >> lo) & ((1 << bits) - 1))
        await self.wreg(base, getattr(state, "value", state))

    async def set_mr(self, j, *, valid=1, read=1, write=1, atomic=0, **cfg):
        base = REG_MR + MR_STRIDE * j
        for off, (path, lo, bits) in sorted(MR_REGS.items()):
            await self.wreg(base + off, (cfg.get(path, 0) >> lo) & ((1 << bits) - 1))
        await self.wreg(base, valid | read << 1 | write << 2 | atomic << 3)

    # ---- memory --------------------------------------------------------------------------
    async def mem_write(self, addr, octets):
        """Write ``octets`` at ``addr`` (both multiples of 4)."""
        assert addr % 4 == 0 and len(octets) % 4 == 0
        for k in range(0, len(octets), 4):
            await self.write(Space.MEM, addr + k, int.from_bytes(octets[k:k + 4], "little"))

    async def mem_read(self, addr, n):
        out = bytearray()
        for k in range(0, n, 4):
            out += (await self.read(Space.MEM, addr + k)).to_bytes(4, "little")
        return bytes(out[:n])

    # ---- queues --------------------------------------------------------------------------
    async def _push(self, q, layout, **fields):
        v = pack_record(layout, **fields)
        for k in range(record_words(layout)):
            await self.write(Space.QUEUE, q, (v >> (32 * k)) & 0xFFFFFFFF)

    async def _pop(self, q, layout):
        """One record, or None when the queue is empty."""
        v0, err = await self.access(Space.QUEUE, q, 0, 0)
        if err:
            return None
        v = v0
        for k in range(1, record_words(layout)):
            v |= (await self.read(Space.QUEUE, q)) << (32 * k)
        return unpack_record(layout, v)

    async def post_wr(self, **fields):
        await self._push(Q_WR, WorkRequest, **fields)

    async def repost(self, qp):
        await self._push(Q_REPOST, RecvRepost, qp=qp)

    async def poll_wc(self):
        return await self._pop(Q_WC, WorkCompletion)

    async def poll_notify(self):
        return await self._pop(Q_NOTIFY, RecvNotify)

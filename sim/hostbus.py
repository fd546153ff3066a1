# Ref: hw/iface.py HostBusSignature (space, addr, wdata, we, re -> ack, rdata, err; an access
#      lasts until ack, err answers an address nobody decodes).
"""The one host-bus access of the Amaranth-simulator tests and harnesses.

``await bus_access(ctx, bus, space, addr, we, wdata)`` drives one access on a
:class:`~hw.iface.HostBusSignature` port from an Amaranth testbench (``ctx`` of
``Simulator.add_testbench``) and returns ``(rdata, err)``. It waits at most ``limit`` cycles for
``ack`` and raises otherwise: ``limit=1`` asserts that the block answers in the cycle of the
request (a register window decoded combinationally). The cocotb benches and the Verilated
harness drive the same signals through their own simulators (sim/hdl.py cocotb_host_access,
sim/vltarget.py).
"""

__all__ = ["bus_access"]


async def bus_access(ctx, bus, space, addr, we, wdata=0, *, limit=200):
    """One access; returns ``(rdata, err)`` sampled in the cycle of ``ack``."""
    ctx.set(bus.space, space)
    ctx.set(bus.addr, addr)
    ctx.set(bus.wdata, wdata)
    ctx.set(bus.we, we)
    ctx.set(bus.re, 1 - we)
    for _ in range(limit):
        if ctx.get(bus.ack):
            r, e = ctx.get(bus.rdata), ctx.get(bus.err)
            await ctx.tick()
            ctx.set(bus.we, 0)
            ctx.set(bus.re, 0)
            return r, e
        await ctx.tick()
    ctx.set(bus.we, 0)
    ctx.set(bus.re, 0)
    raise AssertionError(f"host bus: no ack within {limit} cycles for space {getattr(space, 'value', space)} "
                         f"address {addr:#x}")

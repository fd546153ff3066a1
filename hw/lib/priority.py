# Ref: issue 21 item 3 (no long combinational paths: a priority pick as a tree, not a chain).
"""Priority picks as trees of depth log2(n).

:func:`lowest_set` is shared by the requester's scheduler (:mod:`hw.rdma.req_sq`) and the
responder's context reset pick (:mod:`hw.rdma.resp_state`). Why our own and not
``amaranth.lib``: the library has no priority encoder; an ``m.If`` chain over the bits, which is
what a plain priority encoder elaborates to, is a chain of n multiplexers (64 at 64 QPs).
"""

from amaranth import Cat, Const, Mux, Signal

__all__ = ["lowest_set"]


def lowest_set(m, vec, name):
    """``(any, index)`` of the lowest set bit of ``vec`` (index 0 when none), by a tree of
    depth log2(len(vec)): each node takes its lower half's index when that half has a bit."""
    n = len(vec)
    nodes = [(vec[i], Const(0, 0)) for i in range(n)]
    while len(nodes) > 1:
        if len(nodes) % 2:
            nodes.append((Const(0, 1), Const(0, len(nodes[0][1]))))
        nodes = [(lo_any | hi_any, Cat(Mux(lo_any, lo_idx, hi_idx), ~lo_any))
                 for (lo_any, lo_idx), (hi_any, hi_idx) in zip(nodes[::2], nodes[1::2])]
    found, idx = Signal(name=f"{name}_any"), Signal(max(1, len(nodes[0][1])), name=f"{name}_qp")
    m.d.comb += [found.eq(nodes[0][0]), idx.eq(nodes[0][1])]
    return found, idx

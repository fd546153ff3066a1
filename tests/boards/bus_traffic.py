# Ref: hw/iface.py MemBusSignature (split transactions, in-order responses, a write visible to
#      every request accepted after it).
"""Random traffic on a memory-bus target against a dict of words, for the board memories'
tests (boards/ram.py PipelinedRam, boards/dram.py DramModel)."""

from amaranth.sim import Simulator


def random_traffic(dut, rng, n_ops, addr_of):
    """Drive ``n_ops`` random reads and byte-masked writes while the reader stalls at random;
    ``addr_of(rng)`` gives each request's byte address and the model word it reaches (the
    caller folds in any wrapping). Returns ``(expected, got)``: what the
    word model says each read must return, and what came back, in order. After the last
    answer nothing more may come out."""
    model = {}
    expected, got = [], []
    state = {"sent": 0}

    async def master(ctx):
        req = dut.bus.req
        for _ in range(n_ops):
            addr, w = addr_of(rng)
            we = rng.random() < 0.5
            wdata = rng.getrandbits(64)
            wstrb = rng.choice([0xFF, rng.randrange(256)])
            ctx.set(req.payload, {"addr": addr, "we": we, "wdata": wdata, "wstrb": wstrb})
            ctx.set(req.valid, 1)
            await ctx.tick().until(req.ready)
            ctx.set(req.valid, 0)
            if we:
                mask = sum(0xFF << (8 * k) for k in range(8) if wstrb >> k & 1)
                model[w] = (model.get(w, 0) & ~mask) | (wdata & mask)
            else:
                expected.append(model.get(w, 0))
            state["sent"] += 1
            if rng.random() < 0.2:
                await ctx.tick().repeat(rng.randrange(1, 4))

    async def reader(ctx):
        rsp = dut.bus.rsp
        while state["sent"] < n_ops or len(got) < len(expected):
            ready = rng.random() < 0.6
            ctx.set(rsp.ready, ready)
            if ready and ctx.get(rsp.valid):
                got.append(ctx.get(rsp.payload.rdata))
            await ctx.tick()
        for _ in range(10):                 # nothing extra may come out afterwards
            ctx.set(rsp.ready, 1)
            assert not ctx.get(rsp.valid)
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(master)
    sim.add_testbench(reader)
    sim.run()
    return expected, got


def stream_cycles(dut, requests, idle=0):
    """Offer ``requests`` ((addr, we, wdata, wstrb), in order) back to back to ``dut.bus`` after
    ``idle`` cycles, taking every answer at once: the cycles from the first offer until the last
    answer has come (the way tests/boards/cocotb_litedram.py's ``Bus.run`` counts them on
    LiteDRAM)."""
    out = {}

    async def bench(ctx):
        req, rsp = dut.bus.req, dut.bus.rsp
        ctx.set(rsp.ready, 1)
        if idle:
            await ctx.tick().repeat(idle)
        pending, reads, n = list(requests), 0, 0
        while pending or reads:
            ctx.set(req.valid, bool(pending))
            if pending:
                addr, we, wdata, wstrb = pending[0]
                ctx.set(req.payload, {"addr": addr, "we": we, "wdata": wdata, "wstrb": wstrb})
            if pending and ctx.get(req.ready):
                reads += not pending.pop(0)[1]
            if ctx.get(rsp.valid):
                reads -= 1
            await ctx.tick()
            n += 1
            assert n < 100 * len(requests) + 1000, "the memory hung"
        ctx.set(req.valid, 0)
        out["cycles"] = n

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(bench)
    sim.run()
    return out["cycles"]

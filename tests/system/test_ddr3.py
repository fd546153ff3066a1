# Ref: issue 22 items 2 and 4 (the pool in the board's DDR3: the shipped core simulated with
#      what DRAM costs; table and ring at pool scale); boards/dram.py (DramModel,
#      ECPIX5_DDR3); sim/vltarget.py SHIPPED; sim/system.py (system bench vs the golden
#      model); draft KBTP §Block Table, §Free-Block Ring.
"""The ECPIX-5 core with its 512 MB of DDR3 as target memory (the DDR3 timing model of
boards/dram.py in place of the block RAM), simulated whole under Verilator.

A table of N handles and a ring of N slots over a pool of N blocks of 1 KiB in DDR3, set up by
the host driver (N = 16,384 in `make test`, a 16 MiB pool; 65,536 and 64 MiB, issue 22 item 4,
in `make test-scale`: 18 minutes of one core, most of it the driver writing 2 MiB of table and
ring over the host link and the final check reading them back); then 4 initiators through
loss, duplication and corruption, every round matched to the golden model, and the final
image (counters, table, rings, the blocks holding data and 64 others drawn at random) and
counters compared. (1 KiB
blocks: the golden model holds the whole image in host memory and copies it for every order of
a round's requests it tries; 4 KiB blocks would make that 256 MiB a copy.)
"""

import os

import pytest

from sim.system import VlSystemBench, mixed, mixed_checks, model_config, run_sync
from sim.vltarget import SHIPPED, VlTarget, board_params

pytestmark = pytest.mark.xdist_group("ddr3")

#: Pool scale: handles, ring slots and blocks. Issue 22 item 4 asks for at least 65,536:
#: KBTP_POOL_HANDLES=65536 (`make test-scale`).
N = int(os.environ.get("KBTP_POOL_HANDLES", 16384))


def test_ddr3_is_the_shipped_core_with_ddr3():
    """What the ECPIX-5 builds by default is the kbtp core with its memory in the DDR3 through
    LiteDRAM and 64 QPs, and the shipped simulation is that core with the DDR3 model in LiteDRAM's place
    (512 MB, LiteDRAM's figures at the board's core clock); the block-RAM variant differs from
    it in its memory only."""
    from boards import BOARDS
    from boards.cores import default_core_name
    from sim.vltarget import DRAMS, SHIPPED_BRAM
    import boards.dram
    opts = BOARDS["ecpix5"].core_options[default_core_name()]
    assert opts["litedram"] and opts["dram"] is getattr(boards.dram, DRAMS[SHIPPED["dram"]])
    assert SHIPPED == {**SHIPPED_BRAM, "dram": "ddr3"}
    from boards.cores import CORE_FREQ
    from boards.dram import ECPIX5_DDR3, DramModel
    from sim.vltarget import make_target
    p, d = board_params("ecpix5"), board_params("ecpix5", "ddr3")
    assert d["mem_words"] * 8 == ECPIX5_DDR3.size_bytes == 512 << 20
    # The DDR3 holds receive buffers for SHIPPED_QPS QPs (issue 22 item 3 asks for 64); the
    # 128 KiB of block RAM for 4. Each has a handle range per QP, at least 16.
    from boards.cores import SHIPPED_QPS
    from hw.kbtp.engine import ranges_for
    assert (d["n_qp"], p["n_qp"]) == (SHIPPED_QPS, 4)
    assert (d["n_ranges"], p["n_ranges"]) == (ranges_for(SHIPPED_QPS), ranges_for(4))
    apart = ("mem_words", "dram", "n_qp", "n_ranges")
    assert {k: v for k, v in d.items() if k not in apart} == \
        {k: v for k, v in p.items() if k not in apart}
    core = make_target(SHIPPED)
    assert isinstance(core.target.ram, DramModel)
    assert core.target.ram.timing == ECPIX5_DDR3.cycles(CORE_FREQ)
    assert core.target.ram.depth == d["mem_words"]


def test_ddr3_pool_scale_system_bench():
    """N handles, ring slots and 1 KiB blocks in DDR3; the driver writes the table and rings
    (not the pool: the simulated DRAM starts at zero) and the time it takes is printed; then
    mixed rounds through 2 % loss, 1 % duplication, 0.5 % corruption."""
    assert N >= 16384 and N % 16 == 0, \
        f"KBTP_POOL_HANDLES={N}: at least 16,384 and a multiple of 16"
    from sim.vltarget import build
    build(SHIPPED)
    # 16 ranges of N / 16 handles: the engine checks a handle against 16 range registers
    # (n_ranges); with more ranges the driver keeps every request on the host.
    cfg = model_config(block_size=1024, num_blocks=N, num_handles=N,
                       handles_per_initiator=N // 16)
    lay = cfg.layout()
    assert lay["ring_n"] == N and lay["pool_size"] == N * 1024
    with VlTarget(SHIPPED) as vt:
        b = VlSystemBench(vt, n_init=4, loss=0.02, dup=0.01, corrupt=0.005, seed=22, cfg=cfg,
                          bulk=True)
        b.driver.zero_pool = False
        b.hello_cycles = 10_000_000
        assert b.driver.fast_ok
        octets = sum(len(x) for _, x in b.driver.initial_structures())
        assert octets >= 2 * 16 * N                     # table + ring, 16 octets each
        c0 = vt.cycle
        run_sync(b.bring_up())
        init = vt.cycle - c0
        stats = run_sync(mixed(b, rounds=24))
        figs = run_sync(mixed_checks(b, stats))
        print(f"\nddr3 pool-scale bench: driver bring-up {init:,} GMII cycles "
              f"({init * 8 / 1e6:.1f} ms at the board's clocks) for {octets:,} octets of "
              f"table and rings; {figs}; {vt.cycle:,} GMII cycles in all")
        assert stats["rounds"] == 24 and stats["requests"] > 24
        link = b.link.stats
        assert link["lost"] > 0 and link["duplicated"] > 0, link

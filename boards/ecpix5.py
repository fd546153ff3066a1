# Ref: amaranth_boards.ecpix5 (ECPIX585Platform: clk100 K23, eth_rgmii#0 with tx_ctrl/rx_ctrl,
#      uart#0 R26/R24 on the FT2232H's second channel); LambdaConcept ECPIX-5 docs (RTL8211E
#      PHY, openFPGALoader -b ecpix5); Lattice DS: LFE5UM5G-85F has 208 EBR.
"""LambdaConcept ECPIX-5, 85F variant: the default board."""

from amaranth_boards.ecpix5 import ECPIX585Platform

from .dram import ECPIX5_DDR3
from .memory import BoardMemoryConfig
from .spec import BoardSpec

__all__ = ["ECPIX5"]

ECPIX5 = BoardSpec(
    name="ecpix5",
    platform_cls=ECPIX585Platform,
    ebr_total=208,
    osc_freq=100e6,
    eth_index=0,
    # RTL8211E with its RX clock delay on and TX delay off, as LiteX-Boards' ECPIX-5 target
    # runs it (rx_delay = 0, FPGA TX delay 2 ns): the FPGA forwards tx_clk 90 degrees late and
    # samples RX data as it comes.
    tx_clock="shifted",
    rx_delay_taps=0,
    led_resources=(("rgb_led", 0, "g"), ("rgb_led", 1, "g"), ("rgb_led", 2, "g"),
                   ("rgb_led", 3, "g")),
    program_args=("-b", "ecpix5"),
    phy="Realtek RTL8211E",
    # Routing, not the EBR count, limits this device: with the 256 KiB pool the EBR would
    # hold (155 of 208 DP16KD in all) nextpnr's router2 stopped converging on the width-64
    # core (overuse 16.9k -> 16.2k at its 9th iteration, 2026-11-30). 128 KiB (32 blocks of
    # 4 KiB) halves the pool's banks and their 64-bit buses. (`--placer-heap-beta` does not
    # spread the placement in nextpnr 0.11.1's ECP5 flow: 0.6 and 0.75 gave the same HeAP
    # placement, iteration for iteration, on the same netlist, 2026-11-30.)
    memory=BoardMemoryConfig.for_ebr(208, max_pool_bytes=128 * 1024),
    # Full core (width 64, 4 QPs, 43.7k of 83.6k LUT4) with the ring allocator unit, 2026-12-01:
    # router2 converges from seeds 1 (overuse 0 at iteration 98, sync +1.086 ns) and 3 (115,
    # +0.629 ns), not from 2 (floor 72 overused wires at iteration ~51, then rising; it was
    # seed 2 before the unit). nextpnr is deterministic for one netlist, seed and option set;
    # a change of the gateware can need another seed (`make bitstream SEED=n`).
    # Seed 3 with the static placer (below) for the core with the admission fixes (RNR on MAC
    # backlog, the wire's masters first on the memory bus): router2 at overuse 0 at iteration
    # 140, every clock met (core 35.35 MHz at 25, GMII 128.19 at 125, LiteDRAM 66.30 at 50),
    # 2026-12-05. Seed 1 on the same gateware before the LED flops hovered at overuse 5-127
    # past iteration 380. HeAP at seed 1 diverged on it (overuse 666 at 22, 7,134 at 46).
    # Seed 4 since 2026-12-07: the netlist with cut-through transmit and the READ depth missed
    # the core clock at seed 3 (39.31 MHz at 41.67, a 22.6 ns route in the requester) and the
    # GMII clock at seed 5 (123.00 MHz, the transmit downsizer into its slice); seed 4 met every
    # clock (nextpnr alone on seed 3's netlist: core 43.38, GMII 134.17). 3909978's netlist
    # (cut-through receive, the 56-octet message head on chip) diverged in router2 at seeds 4
    # to 10 (1.15M wires); without the responder's and the engine's 448-bit copies of that head
    # (1.13M wires, 893 flip-flops fewer) seed 4 routed at iteration 154 with every clock met
    # (core 44.12 MHz, GMII 126.33 MHz), 2026-12-07. Seed 3 since (same day): c705061's netlist (the
    # speculative allocation) routed at seed 3 and missed the core clock (37.29 MHz, 26.8 ns from the
    # engine's checks through the allocation's verdict into the memory arbiters); with the verdict
    # taken from its flops (09f568f) seed 3 met every clock (core 45.01 MHz, GMII 133.78 MHz).
    nextpnr_seed=3,
    # nextpnr's analytic "static" placer instead of HeAP: on the width-64 core with 64 QPs and
    # LiteDRAM (77 % of the LUT4) router2 finished at iteration 92 instead of 180, and the core
    # clock reached 37.85 MHz instead of 33.10 (seed 1, 086ec81's gateware); it spread the
    # design enough to expose the LED activity net as the 125 MHz clock's critical path (7.7 ns
    # of routing across the die), since flopped twice (boards/top.py).
    nextpnr_opts=("--placer", "static"),
    # Issue 22: the kbtp core's target memory (pool, table, rings, receive and scratch buffers)
    # is the board's 512 MB of DDR3 through LiteDRAM (boards/litedram_bridge.py; LiteDRAM's
    # clock 50 MHz). Core kbtp-bram keeps it in the block RAM of ``memory`` (128 KiB of pool).
    core_options={"kbtp": {"dram": ECPIX5_DDR3, "litedram": True}},
)

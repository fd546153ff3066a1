# Ref: amaranth_boards.versa_ecp5 (VersaECP5Platform LFE5UM-45F: clk100 LVDS P3/P4,
#      eth_rgmii#0 with tx_ctl/rx_ctl, uart#0 C11/A11, leds 0-7); Lattice ECP5 Versa board user
#      guide (Marvell 88E1512 PHYs, FT2232H JTAG on channel A); Lattice DS: 45F has 108 EBR.
"""Lattice ECP5 Versa (LFE5UM-45F): the second board."""

from pathlib import Path

from amaranth_boards.versa_ecp5 import VersaECP5Platform

from .dram import VERSA_DDR3
from .spec import BoardSpec

__all__ = ["VERSA", "VERSA_LITEDRAM_CORE", "VERSA_WIDTH8"]

#: The Versa's LiteDRAM core (``boards/litedram_gen.py --board versa``, ``make litedram-versa``).
VERSA_LITEDRAM_CORE = Path(__file__).resolve().parent.parent / "build" / "litedram_versa"

#: The kbtp core at width 8 (see the comments of ``core_options`` below): cores kbtp and
#: kbtp-bram (block RAM) and kbtp-ddr3 (the 128 MB of DDR3 through LiteDRAM; does not fit).
VERSA_WIDTH8 = {"n_qp": 2, "sq_depth": 4, "width": 8, "n_mr": 4}

VERSA = BoardSpec(
    name="versa",
    platform_cls=VersaECP5Platform,
    ebr_total=108,
    osc_freq=100e6,
    eth_index=0,
    # 88E1512 in RGMII-ID mode (both clock delays inside the PHY), as LiteX-Boards' Versa ECP5
    # target runs it (tx_delay = rx_delay = 0 on the FPGA side): edge-aligned tx_clk, no
    # DELAYG on receive.
    tx_clock="phy",
    rx_delay_taps=0,
    led_resources=(("led", 0, None), ("led", 1, None), ("led", 2, None), ("led", 3, None)),
    # openFPGALoader has no Versa board entry; its generic FT2232 cable (channel A) is the
    # Versa's on-board JTAG.
    program_args=("-c", "ft2232"),
    phy="Marvell 88E1512",
    # The 45F (43.8k LUT4) does not hold the width-64 kbtp core: at 2 QPs with 4-deep send
    # queues it packs to 50.7k LUT4 cells (`python -m boards build --board versa --pack-only`,
    # 2026-11-30; 57k at 4 QPs on the ECPIX-5). The Versa therefore runs the same target at
    # width 8 on the same core clock (CORE_FREQ, 41.67 MHz: 333 Mb/s of datapath, below the
    # 1 Gb/s line; frames the core cannot take are dropped in the MAC's buffer and counted, and
    # RC retransmission recovers them). It is the second board of the board layer, not a
    # line-rate target; the ECPIX-5 is.
    # Issue 22 asks the Versa to carry its 128 MB of DDR3 (MT41K64M16) through LiteDRAM as the
    # ECPIX-5 does. It does not fit the 45F, not even at this smallest configuration (width 8,
    # 2 QPs), so the Versa's kbtp core keeps its memory in block RAM (2026-12-04, `python -m
    # boards build --board versa [--core ...] --pack-only`, LUT4 = nextpnr's packed LUT4 cells
    # of 43,848):
    #   kbtp (block RAM, 32 KiB pool)       42,453 LUT4 (96.8 %), 19,468 FF, 61 EBR, DSP 0
    #   kbtp-ddr3 (DDR3, 2 QPs)             47,502 LUT4 (108.3 %), 21,113 FF, 45 EBR, DSP 0
    #   kbtp-ddr3 at 64 QPs                 56,739 LUT4 (129.4 %), 22,470 FF, 97 EBR
    #   kbtp-ddr3, 2 QPs, udp_link=False    43,573 LUT4 (99.4 %), 19,671 FF, 40 EBR
    # The DDR3 adds 5,049 LUT4 over the block-RAM pool: LiteDRAM's controller and ECP5 PHY logic
    # ~1.9k LUT4 + 48 LUT-RAMs, our bridge (128-bit native port, two clock-crossing FIFOs) ~1.4k
    # + 79 LUT-RAMs, read levelling 0.4k, init 0.1k (yosys cell names of `top.json`; a
    # TRELLIS_DPR16X4 LUT-RAM packs to several LUT4 cells). The rest is the target (yosys LUT4
    # + 2 per carry cell): KBTP engine 9.1k, requester 4.1k, responder 3.5k, UDP host link 3.2k,
    # Ethernet receive 1.7k, ...; LUT-RAMs, 1,082 in all, make ~8k of the 47.5k packed LUT4. Even without the UDP host link it
    # packs to 99.4 %, which leaves the placer no room (the block-RAM core is at 96.8 % already).
    # The DDR3 configuration stays as core kbtp-ddr3 (`make bitstream BOARD=versa
    # CORE=kbtp-ddr3`, which runs `make litedram-versa` first) for a smaller target; at 108 %
    # of the LUT4 it cannot be placed.
    core_options={"kbtp": VERSA_WIDTH8, "kbtp-bram": VERSA_WIDTH8,
                  "kbtp-ddr3": {**VERSA_WIDTH8, "dram": VERSA_DDR3, "litedram": True,
                                "litedram_core": VERSA_LITEDRAM_CORE}},
    # router2 failed the full core here: "Failed to route arc 0.0 of net 'rst_dcc_sync_CLKI',
    # from X40/Y2/Q6_SLICE to X0/Y0/G_CLKI_TDCC0" (the fabric input of the reset's global
    # buffer; global wires sit at X0/Y0, so the net's bounding box can miss the clock entry).
    # router1 searches without that box.
    nextpnr_router="router1",
)

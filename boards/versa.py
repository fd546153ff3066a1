# Ref: amaranth_boards.versa_ecp5 (VersaECP5Platform LFE5UM-45F: clk100 LVDS P3/P4,
#      eth_rgmii#0 with tx_ctl/rx_ctl, uart#0 C11/A11, leds 0-7); Lattice ECP5 Versa board user
#      guide (Marvell 88E1512 PHYs, FT2232H JTAG on channel A); Lattice DS: 45F has 108 EBR.
"""Lattice ECP5 Versa (LFE5UM-45F): the second board."""

from amaranth_boards.versa_ecp5 import VersaECP5Platform

from .spec import BoardSpec

__all__ = ["VERSA"]

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
    # The kbtp core at its defaults (4 QPs, 8-deep send queues) is 46.2k LUT4 cells on the
    # ECPIX-5, more than the 45F's 43.8k; 2 QPs with 4-deep send queues (~32% fewer flops,
    # mostly the requester's per-QP send-queue state) leave room for placement and timing.
    # Not yet checked for the two-clock width-64 core (boards.cores.KbtpCore): on the ECPIX-5
    # it packs to 57.5k LUT4 cells at 4 QPs (11k more than width 8), so 2 QPs may not fit the
    # 45F; check with `python -m boards build --board versa --pack-only` (brief timing.md).
    core_options={"kbtp": {"n_qp": 2, "sq_depth": 4}},
)

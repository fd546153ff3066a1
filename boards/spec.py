# Ref: amaranth-boards 0.0.21 resources (eth_rgmii, uart, clk100, rst).
"""What the board layer needs to know about one board."""

import functools
from dataclasses import dataclass, field

from .memory import BoardMemoryConfig

__all__ = ["BoardSpec"]


@dataclass(frozen=True)
class BoardSpec:
    """One supported board.

    Attributes
    ----------
    name : str                  CLI name (``--board``)
    platform_cls : type         amaranth-boards platform
    ebr_total : int             DP16KD blocks of the device
    osc_freq : float            oscillator behind ``platform.default_clk`` (Hz)
    eth_index : int             which ``eth_rgmii`` resource
    tx_clock, rx_delay_taps     RGMII skew handling (see hw/net/rgmii.py)
    led_resources : tuple       (resource name, number, subsignal or None) per status LED
    program_args : tuple        openFPGALoader arguments selecting board / cable
    phy : str                   PHY part, for the documentation
    core_options : dict         core name -> extra keyword arguments of its factory, for a
                                device too small for the core's defaults
    nextpnr_router : str        nextpnr's ``--router`` for this board's builds
    nextpnr_opts : tuple        further nextpnr options for this board's builds
    nextpnr_seed : int          nextpnr's ``--seed`` when the build is not given one
    """

    name: str
    platform_cls: type
    ebr_total: int
    osc_freq: float
    eth_index: int
    tx_clock: str
    rx_delay_taps: int
    led_resources: tuple
    program_args: tuple
    phy: str
    sys_freq: float = 125e6
    memory: BoardMemoryConfig = field(default=None)
    core_options: dict = field(default_factory=dict)
    nextpnr_router: str = "router2"
    nextpnr_opts: tuple = ()
    nextpnr_seed: int = 1

    def __post_init__(self):
        if self.memory is None:
            object.__setattr__(self, "memory", BoardMemoryConfig.for_ebr(self.ebr_total))

    def core_factory(self, core, factory):
        """``factory`` with this board's options for ``core`` bound (see ``core_options``)."""
        options = self.core_options.get(core)
        return functools.partial(factory, **options) if options else factory

    def platform(self):
        return self.platform_cls()

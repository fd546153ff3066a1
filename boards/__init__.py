# Ref: see boards/top.py for the structure of a board build.
"""ECP5 board layer: board specs, the board top, build + timing report (``python -m boards``)."""

from .ecpix5 import ECPIX5
from .versa import VERSA

__all__ = ["BOARDS", "ECPIX5", "VERSA"]

BOARDS = {spec.name: spec for spec in (ECPIX5, VERSA)}

# Ref: issue 18 item 1 (a self-contained repository: captures under tests/data).
"""Where the project's recorded traffic lives: ``tests/data`` inside the checkout.

The captures are real Linux soft-RoCE (rdma_rxe) traffic: RC SEND / WRITE / READ / atomics,
NAKs, a retransmission after a drop, and an rdma_cm connect / disconnect between two guests.
Nothing outside the checkout is read.
"""

from pathlib import Path

__all__ = ["ROOT", "DATA_DIR"]

ROOT = Path(__file__).resolve().parent.parent
DATA_DIR = ROOT / "tests" / "data"

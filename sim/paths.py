# Ref: DEVELOPERS.md (CI runs a clone with a copy of shared/ beside it).
"""Where the project's shared material (spec, notes, captures) lives.

``shared/`` sits beside the checkout (``<checkout>/../shared``) on developers' machines and in CI;
``KBTP_SHARED`` overrides it.
"""

import os
from pathlib import Path

__all__ = ["SHARED_DIR", "DATA_DIR"]

_ROOT = Path(__file__).resolve().parent.parent
SHARED_DIR = Path(os.environ.get("KBTP_SHARED", _ROOT.parent / "shared"))
DATA_DIR = SHARED_DIR / "data"

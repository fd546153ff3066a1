# Ref: tests/system/test_e2e.py (how the host side reads a guest script's output).
"""What every guest script of tests/e2e prints and how it ends, in one place.

Each check prints ``OK <name> <detail>`` or ``FAIL <name> <detail>`` on one line; ``finish``
prints ``SUMMARY passed=<n> failed=<m>`` last and exits with status 1 if any check failed. The
host test (tests/system/test_e2e.py) parses exactly these lines.
"""

import sys
import traceback

__all__ = ["Checks", "blob"]


class Checks:
    """Counts and prints checks."""

    def __init__(self):
        self.passed = self.failed = 0

    def check(self, name, cond, detail=""):
        cond = bool(cond)
        self.passed, self.failed = self.passed + cond, self.failed + (not cond)
        print(f"{'OK' if cond else 'FAIL'} {name} {detail}", flush=True)
        return cond

    def expect_status(self, name, status, fn, error=Exception):
        """Run ``fn``; the check passes when it raises ``error`` whose ``status_name`` is
        ``status`` (KbtpStatusError in the scripts)."""
        try:
            fn()
        except error as exc:
            return self.check(name, exc.status_name == status, f"got {exc.status_name}")
        return self.check(name, False, f"no error, expected {status}")

    def guarded(self, name, fn):
        """Run ``fn``; an exception prints its traceback and fails check ``name``."""
        try:
            fn()
        except Exception as exc:
            traceback.print_exc()
            self.check(name, False, f"{type(exc).__name__}: {exc}")

    def finish(self):
        print(f"SUMMARY passed={self.passed} failed={self.failed}", flush=True)
        sys.exit(1 if self.failed else 0)


def blob(rng, n):
    """``n`` octets from ``rng`` (a seeded random.Random: the data oracle)."""
    return bytes(rng.getrandbits(8) for _ in range(n))

# Ref: issue 18 item 4 (under CI a missing pinned tool fails the run); .ci/run (CI=true);
#      Makefile APT_PKGS and requirements.txt (the pinned tools); tests/conftest.py (the hook).
"""The one gate of every test that needs an external tool (yosys, smtbmc, the solvers, QEMU,
tshark, nextpnr, ...).

Locally a missing tool skips the test, with the reason. Under ``CI=true`` (.ci/run) every pinned
tool is installed by ``make install``, so a missing one is a broken set-up and fails the test:
a skip would let the run pass without the check it names.

Two forms, both through :func:`require_tool`:

* ``@requires_tool(name, found, why)`` (or ``pytestmark = requires_tool(...)``): a marker that
  tests/conftest.py evaluates before the test's fixtures are set up (as ``skipif`` is), so an
  expensive fixture (a guest boot) never starts without its tool;
* ``require_tool(name, found, why)`` inside a test body.
"""

import os

import pytest

__all__ = ["in_ci", "require_tool", "requires_tool"]


def in_ci():
    """Whether this is a CI run (the environment variable CI equals "true")."""
    return os.environ.get("CI") == "true"


def require_tool(name, found, why=""):
    """Return if ``found``; otherwise fail under CI=true and skip elsewhere, naming ``name``."""
    if found:
        return
    msg = f"{name} not found" + (f" ({why})" if why else "")
    if in_ci():
        pytest.fail(f"CI=true and a pinned tool is missing: {msg}", pytrace=False)
    pytest.skip(msg)


def requires_tool(name, found, why=""):
    """Marker form of :func:`require_tool` (evaluated in tests/conftest.py at set-up)."""
    return pytest.mark.requires_tool(name, bool(found), why)

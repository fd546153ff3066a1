# Ref: pytest `pytest_collection_modifyitems`; pytest-xdist `--dist loadgroup` with
#      `--no-loadscope-reorder` (work units handed out in collection order, two queued per worker;
#      without that option the xdist_group units, largest first, would go ahead of it);
#      tests/tool_gate.py (the requires_tool marker evaluated here).
"""Test ordering for `make test` (pytest -n 2 --dist loadgroup).

The ECPIX-5 place-and-route check (tests/boards/test_board.py, ~20 min of one core) is moved to the
front of the collection, so that one worker starts it at once and the other worker runs the
rest of the suite beside it. Collected last, it would start when the rest is nearly done and
add its whole length to CI's wall time.
"""

import pytest

FIRST = ("test_board.py::test_ecpix5_synthesis_meets_timing",)


def pytest_collection_modifyitems(session, config, items):
    first = [it for it in items if it.nodeid.endswith(FIRST)]
    if first:
        rest = [it for it in items if it not in first]
        items[:] = first + rest


# Tool gates (tests/tool_gate.py): the `requires_tool` marker, evaluated before fixtures are set up
# (like skipif), so that under CI=true a missing pinned tool fails the test instead of skipping.
def pytest_configure(config):
    config.addinivalue_line("markers", "requires_tool(name, found, why): the test needs an "
                            "external tool; skipped when missing, failed under CI=true")


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    from tests.tool_gate import require_tool
    for m in item.iter_markers("requires_tool"):
        require_tool(*m.args, **m.kwargs)

# Ref: pytest `pytest_collection_modifyitems`; pytest-xdist `--dist loadgroup` with
#      `--no-loadscope-reorder` (work units handed out in collection order, two queued per worker;
#      without that option the xdist_group units, largest first, would go ahead of it);
#      tests/tool_gate.py (the requires_tool marker evaluated here).
"""Test ordering for `make test` (pytest -n 2 --dist loadgroup).

The suite's longest tests are moved to the front of the collection, one for each worker, so
that they run beside the rest of the suite; collected late, one of them would start when the
rest is nearly done and add its whole length to CI's wall time. In a clean-clone run
(2026-12-05) they were the formal proof of the ring allocator unit at depth 16 (616 s) and the
DDR3 pool-scale system bench (1,140 s at 65,536 handles; the suite now runs it at 16,384).
The ECPIX-5 place and route, once first here, is `make timing` (tests/boards/test_board.py).
"""

import pytest

FIRST = ("test_formal_ring.py::test_unit_bmc[1]",
         "test_ddr3.py::test_ddr3_pool_scale_system_bench")


def pytest_collection_modifyitems(session, config, items):
    first = [it for f in FIRST for it in items if it.nodeid.endswith(f)]
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

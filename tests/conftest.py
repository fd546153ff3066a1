# Ref: pytest `pytest_collection_modifyitems`; pytest-xdist `--dist loadgroup` with
#      `--no-loadscope-reorder` (work units handed out in collection order, two queued per worker;
#      without that option the xdist_group units, largest first, would go ahead of it).
"""Test ordering for `make test` (pytest -n 2 --dist loadgroup).

The ECPIX-5 place-and-route check (tests/test_board.py, ~12 min of one core) is moved to the
front of the collection, so that one worker starts it at once and the other worker runs the
rest of the suite beside it. Collected last, it would start when the rest is nearly done and
add its whole length to CI's wall time.
"""

FIRST = ("test_board.py::test_ecpix5_synthesis_meets_timing",)


def pytest_collection_modifyitems(session, config, items):
    first = [it for it in items if it.nodeid.endswith(FIRST)]
    if first:
        rest = [it for it in items if it not in first]
        items[:] = first + rest

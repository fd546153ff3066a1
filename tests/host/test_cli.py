# Ref: draft KBTP §Examples, §Messages; docs/layouts.md ("The draft's worked examples")
"""Tests of the ``kbtp`` console script, run as a subprocess with the venv's entry point.

The expected values come from the draft's example byte strings and from struct.pack
(test_codec's MALFORMED_CASES), not from the codec.
"""

import json
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tests.host.test_codec import DRAFT_ALLOC_STORE, DRAFT_COMPLETION, MALFORMED_CASES, OP, cd, dd, hdr
from tests.tool_gate import requires_tool

KBTP = Path(sys.executable).parent / "kbtp"
if not KBTP.exists():
    KBTP = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "kbtp"
pytestmark = requires_tool("the kbtp console script", KBTP.exists(), "pip install -e .")

ERROR_LINE = re.compile(r"^kbtp: error: (?P<field>[\w.]+): (?P<msg>.+) \(status (?P<st>[A-Z_]+)\)$")


def run(*args, stdin=None):
    return subprocess.run([str(KBTP), *args], input=stdin, capture_output=True, text=True,
                          timeout=60)


def spaced(raw):
    return " ".join(f"{b:02x}" for b in raw)


def assert_one_line_error(proc, field=None, status="MALFORMED"):
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    m = ERROR_LINE.match(lines[0])
    assert m, lines[0]
    if field is not None:
        assert m["field"] == field, lines[0]
    assert m["st"] == status, lines[0]
    return m


def check_alloc_store_json(out):
    assert out["opcode"] == "ALLOC_STORE" and out["version"] == 1
    assert out["flags"] == ["INLINE"]
    assert out["request_id"] == "0x7" and out["handle"] == "0x4001"
    assert out["generation"] == 0 and out["status"] == "OK"
    assert out["data"] == {"stag": "0x0", "tagged_offset": "0x0", "length": 8}
    assert out["completion"] is None
    assert bytes.fromhex(out["inline"]) == b"KVBLOCK!"
    assert out["octets"] == 48


def check_completion_json(out):
    assert out["opcode"] == "COMPLETION" and out["version"] == 1 and out["flags"] == []
    assert out["request_id"] == "0x7" and out["handle"] == "0x4001"
    assert out["generation"] == 5 and out["status"] == "OK"
    assert out["data_length"] == 8
    assert int(out["block_offset"], 16) == 42 * 32 * 1024
    assert out["octets"] == 40


@pytest.mark.parametrize("form", ["spaced", "compact", "colons", "words", "stdin"])
def test_decode_draft_alloc_store(form):
    raw = DRAFT_ALLOC_STORE
    if form == "stdin":
        proc = run("decode", "-", stdin=spaced(raw[:20]) + "\n" + spaced(raw[20:]) + "\n")
    else:
        arg = {"spaced": [spaced(raw)], "compact": [raw.hex()],
               "colons": [raw.hex(":")], "words": spaced(raw).split()}[form]
        proc = run("decode", *arg)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    check_alloc_store_json(json.loads(proc.stdout))


def test_decode_draft_completion():
    proc = run("decode", spaced(DRAFT_COMPLETION))
    assert proc.returncode == 0, proc.stderr
    check_completion_json(json.loads(proc.stdout))
    # ADDR_LE does not reach a COMPLETION's fields
    proc = run("decode", "--addr-le", DRAFT_COMPLETION.hex())
    check_completion_json(json.loads(proc.stdout))


@pytest.mark.parametrize("raw", [DRAFT_ALLOC_STORE, DRAFT_COMPLETION], ids=["alloc", "compl"])
def test_decode_then_encode_gives_the_draft_bytes(raw):
    dec = run("decode", raw.hex())
    enc = run("encode", "-", stdin=dec.stdout)
    assert enc.returncode == 0, enc.stderr
    assert bytes.fromhex(enc.stdout.strip()) == raw


def test_decode_addr_le_request():
    raw = hdr(OP["LOAD"], 0x4, 9, 0x1122334455667788, 3, le=True) + dd(0xA, 0xB, 4096, le=True)
    raw += cd(0xC, 0xD, le=True)
    out = json.loads(run("decode", "--addr-le", raw.hex()).stdout)
    assert out["handle"] == "0x1122334455667788" and out["flags"] == ["RECORD"]
    assert out["data"] == {"stag": "0xa", "tagged_offset": "0xb", "length": 4096}
    assert out["completion"] == {"stag": "0xc", "tagged_offset": "0xd"}
    # Without --addr-le the same octets read big-endian: handle reversed, and Length too large.
    out = json.loads(run("decode", raw.hex()).stdout)
    assert out["handle"] == "0x8877665544332211"
    assert out["data"]["length"] == int.from_bytes((4096).to_bytes(4, "little"), "big")
    proc = run("decode", "--block-size", "32768", raw.hex())
    assert_one_line_error(proc, "data_descriptor.length", "TOO_LARGE")


def test_decode_structures():
    entry = struct.pack(">HHI", 3, 5, 8) + struct.pack("<Q", 0x150000)
    out = json.loads(run("decode", "--struct", "entry", "--addr-le", entry.hex()).stdout)
    assert out == {"struct": "table_entry", "flags": ["VALID", "SEALED"], "generation": 5,
                   "data_length": 8, "block_offset": "0x150000"}
    slot = struct.pack(">IIQ", 4, 0, 2**64 - 1)
    out = json.loads(run("decode", "--struct", "slot", slot.hex()).stdout)
    assert out["sequence"] == 4 and out["consumed"] is True
    record = struct.pack(">QHHIQ", 7, 8, 5, 8, 0x150000)
    out = json.loads(run("decode", "--struct", "record", record.hex()).stdout)
    assert out == {"struct": "completion_record", "request_id": "0x7", "status": "TOO_LARGE",
                   "generation": 5, "data_length": 8, "block_offset": "0x150000"}
    enc = run("encode", "--addr-le", json.dumps({"struct": "table_entry", "flags": ["VALID"],
                                                  "generation": 5, "data_length": 8,
                                                  "block_offset": "0x150000"}))
    assert bytes.fromhex(enc.stdout.strip()) == struct.pack(">HHI", 1, 5, 8) + \
        struct.pack("<Q", 0x150000)


def _cli_args(kwargs):
    args = []
    if kwargs.get("addr_le"):
        args.append("--addr-le")
    for key in ("max_inline", "block_size"):
        if key in kwargs:
            args += ["--" + key.replace("_", "-"), str(kwargs[key])]
    return args


@pytest.mark.parametrize("raw, kwargs, field, status",
                         [c[1:] for c in MALFORMED_CASES], ids=[c[0] for c in MALFORMED_CASES])
def test_cli_malformed(raw, kwargs, field, status):
    if not raw:
        field = "input"                  # nothing to decode: the CLI says so before decoding
    proc = run("decode", *_cli_args(kwargs), spaced(raw))
    assert_one_line_error(proc, field, status.name)


@pytest.mark.parametrize("args, stdin, field", [
    (["decode", "zz"], None, "input"),
    (["decode", "0112 0"], None, "input"),
    (["decode", "01 12 g0"], None, "input"),
    (["decode", "-"], "", "input"),
    (["decode", "-"], "   \n", "input"),
    (["decode", "--struct", "entry", "0001"], None, "entry"),
    (["decode", "--struct", "record", (bytes(8) + b"\x00\x0c" + bytes(14)).hex()], None,
     "record.status"),
    (["encode", "{not json"], None, "input"),
    (["encode", '{"opcode": "NOPE"}'], None, "opcode"),
    (["encode", '{"opcode": "LOAD", "flags": ["RECORD"]}'], None, "completion_descriptor"),
    (["encode", '{"opcode": "BIND", "ticket": "0x1ffffffff"}'], None, "ticket"),
])
def test_cli_bad_input(args, stdin, field):
    assert_one_line_error(run(*args, stdin=stdin), field)


@pytest.mark.parametrize("args", [[], ["decode"], ["frobnicate", "00"],
                                  ["decode", "--max-inline", "lots", "00"],
                                  ["decode", "--struct", "ring", "00"]])
def test_cli_usage_errors(args):
    assert_one_line_error(run(*args), "usage")

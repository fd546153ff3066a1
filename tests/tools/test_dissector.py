# Ref: issue 24 item 1; draft KBTP §Messages, §Status Codes, §Completion, §Session Establishment
#      (ADDR_LE); docs/layouts.md; tools/wireshark/kbtp.lua and gen.py
"""Tests of the Wireshark/tshark KBTP dissector (tools/wireshark/kbtp.lua).

The oracle is host.codec: every message type is encoded by it, wrapped by scapy into RoCEv2 RC
SEND frames (completion records into RDMA WRITE Only with Immediate), written to a pcap and
read back by ``tshark -X lua_script:tools/wireshark/kbtp.lua`` with no other option; every
decoded field must equal what the codec put there. The codec's own malformed cases
(tests/host/test_codec.py MALFORMED_CASES) must show an expert error naming the field the codec names.

tshark runs with HOME pointing at an empty directory, so that an installed copy of the plugin
(~/.local/lib/wireshark/plugins/kbtp.lua, `make install`) does not shadow the file under test.
"""

import dataclasses
import importlib.util
import os
from pathlib import Path
import shutil
import subprocess
import sys

import pytest
from scapy.utils import wrpcap

from host import codec
from host.codec import (
    AllocStore, Bind, ComplDesc, Completion, DataDesc, DirectDesc, Free, Goodbye, Hello,
    HelloAck, Load, Store,
)
from hw.headers import Features, GoodbyeFlags, Opcode, ReqFlags, Status
from sim.paths import DATA_DIR
from sim.scapy_roce import RETH, ImmDt, roce_frame
from tests.host.test_codec import MALFORMED_CASES
from tests.tool_gate import require_tool

pytestmark = pytest.mark.xdist_group("dissector")

ROOT = str(Path(__file__).resolve().parents[2])
LUA = os.path.join(ROOT, "tools", "wireshark", "kbtp.lua")
GEN = os.path.join(ROOT, "tools", "wireshark", "gen.py")
TSHARK = shutil.which("tshark")

SEND_ONLY, WRITE_ONLY_IMM = 0x04, 0x0B
PI_MALFORMED, PI_PROTOCOL = 0x07000000, 0x09000000     # epan/proto.h expert groups
F = ReqFlags


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    require_tool("tshark", TSHARK is not None, "make apt")
    return str(tmp_path_factory.mktemp("tshark-home"))


def tshark(home, pcap, *args, lua=True):
    cmd = [TSHARK, "-r", str(pcap)] + (["-X", f"lua_script:{LUA}"] if lua else []) + list(args)
    env = dict(os.environ, HOME=home)
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stderr
    assert "Lua" not in p.stderr, p.stderr                      # no load or runtime error
    return p.stdout


def fields(home, pcap, names, *args):
    """{frame number: {field: text}} for the frames of ``-Y`` (default: kbtp)."""
    if "-Y" not in args:
        args = args + ("-Y", "kbtp")
    cmd = ["-T", "fields", "-E", "separator=\t", "-e", "frame.number"]
    for n in names:
        cmd += ["-e", n]
    out = tshark(home, pcap, *args, *cmd)
    rows = {}
    for line in out.splitlines():
        cols = line.split("\t")
        rows[int(cols[0])] = dict(zip(names, cols[1:]))
    return rows


# --------------------------------------------------------------------------------------------
# Building captures
# --------------------------------------------------------------------------------------------

class Capture:
    """RoCEv2 frames of one or more KBTP connections, with timestamps."""

    def __init__(self):
        self.frames, self.t = [], 1_700_000_000.0
        self.info = []           # per frame (1-based index - 1): dict describing what was sent

    def _add(self, pkt, info, dt):
        self.t += dt
        pkt.time = self.t
        self.frames.append(pkt)
        self.info.append(dict(info, t=self.t))
        return len(self.frames)

    def send(self, conn, raw, *, to_target, info=None, dt=0.001):
        src, dst = (conn["ini"], conn["tgt"]) if to_target else (conn["tgt"], conn["ini"])
        qp = conn["tqp"] if to_target else conn["iqp"]
        conn["psn"] += 1
        pkt = roce_frame(SEND_ONLY, raw, src_ip=src, dst_ip=dst,
                         bth={"dqpn": qp, "psn": conn["psn"]})
        return self._add(pkt, info or {}, dt)

    def record(self, conn, raw, rid, info=None, dt=0.001):
        conn["psn"] += 1
        pkt = roce_frame(WRITE_ONLY_IMM, raw, src_ip=conn["tgt"], dst_ip=conn["ini"],
                         bth={"dqpn": conn["iqp"], "psn": conn["psn"]},
                         ext={RETH: {"va": 0x7000, "rkey": 0x99, "dma_length": len(raw)},
                              ImmDt: {"imm": rid & 0xFFFFFFFF}})
        return self._add(pkt, info or {}, dt)

    def write(self, path):
        wrpcap(str(path), self.frames)
        return path


def conn(n, tqp=0x11, iqp=0x12):
    return {"ini": f"10.9.{n}.1", "tgt": f"10.9.{n}.2", "tqp": tqp, "iqp": iqp, "psn": 0}


def expected_fields(msg):
    """{kbtp field: int or hex string} named after the codec's dataclass fields."""
    out = {"version": 1, "opcode": msg.OPCODE.value} if isinstance(msg, codec.Message) else {}
    for f in dataclasses.fields(msg):
        v = getattr(msg, f.name)
        if v is None:
            continue
        if isinstance(v, DataDesc):
            out.update({f"data_descriptor.{k}": getattr(v, k) for k in ("stag", "tagged_offset",
                                                                          "length")})
        elif isinstance(v, ComplDesc):
            out.update({f"completion_descriptor.{k}": getattr(v, k)
                        for k in ("stag", "tagged_offset")})
        elif isinstance(v, DirectDesc):
            out.update({f"{f.name}.{k}": getattr(v, k) for k in ("stag", "tagged_offset",
                                                                  "count")})
        elif isinstance(v, bytes):
            if v:
                out["inline_data"] = v.hex()
        elif f.name == "initiator_id":
            out[f.name] = v.to_bytes(16, "big").hex()
        elif isinstance(msg, codec.CompletionRecordValue):
            out[f"record.{f.name}"] = v
        else:
            out[f.name] = v
    return out


def parse_value(text, want):
    if isinstance(want, str):
        return text.replace(":", "").lower()
    return int(text, 0)


HELLO_ACK = HelloAck(
    features=(Features.DIRECT_LOAD | Features.DIRECT_ALLOC | Features.RECORD_COMPLETION).value,
    request_credits=16, block_size=32768, max_inline=1024, allocation_quota=4,
    handle_base=0x4000, handle_count=256, ticket_timeout_ms=100,
    table=DirectDesc(0x11, 0x1000, 256), table_base_handle=0x4000,
    pool=DirectDesc(0x22, 0x200000, 64), partition=DirectDesc(0x33, 0x20000, 4),
    ring=DirectDesc(0x44, 0x8000, 8), head=DirectDesc(0x55, 0x40, 1))


def session(cap, c, addr_le, rid0):
    """HELLO .. GOODBYE of one connection: every message type, each request answered."""
    feats = Features.ADDR_LE.value if addr_le else 0
    ack = dataclasses.replace(HELLO_ACK, features=HELLO_ACK.features | feats)
    sent = []                         # (frame, msg, addr_le, response frame or None)

    def req(msg, status=Status.OK, *, record=False, dlen=0, boff=0, dt=0.25):
        f = cap.send(c, codec.encode(msg, addr_le=addr_le), to_target=True)
        if record:
            rec = codec.CompletionRecordValue(msg.request_id, status.value, 7, dlen, boff)
            r = cap.record(c, codec.encode_record(msg.request_id, status, 7, dlen, boff),
                           msg.request_id, dt=dt)
            sent.append((f, msg, addr_le, r))
            sent.append((r, rec, False, None))
            return
        comp = Completion(request_id=msg.request_id, handle=msg.handle, generation=7,
                          status=status, data_length=dlen, block_offset=boff)
        r = cap.send(c, codec.encode(comp, addr_le=addr_le), to_target=False, dt=dt)
        sent.append((f, msg, addr_le, r))
        sent.append((r, comp, addr_le, None))

    hello = Hello(requested_features=0xF if addr_le else 0x7, completion_credits=32,
                  initiator_id=0x0123456789ABCDEF_FEDCBA9876543210)
    f = cap.send(c, codec.encode(hello), to_target=True)
    r = cap.send(c, codec.encode(ack), to_target=False, dt=0.5)
    sent += [(f, hello, False, r), (r, ack, False, None)]
    rid = rid0
    h = 0x4001
    for msg, kw in [
        (AllocStore(flags=F.INLINE | F.SEAL, request_id=rid, handle=h,
                    data=DataDesc(0, 0, 8), inline=b"KVBLOCK!"), dict(dlen=8, boff=0x150000)),
        (AllocStore(flags=F.RECORD | F.INVALIDATE, request_id=rid + 1, handle=h + 1,
                    data=DataDesc(0xABCD, 0x7F0000001000, 4096),
                    completion=ComplDesc(0x99, 0x7000)), dict(record=True, dlen=4096)),
        (Store(request_id=rid + 2, handle=h + 2, generation=3,
               data=DataDesc(0x1234, 0x1122334455667788, 300)), dict(status=Status.SEALED)),
        (Store(flags=F.INLINE | F.RECORD, request_id=rid + 3, handle=h + 3,
               data=DataDesc(0, 0, 3), completion=ComplDesc(0x98, 0x7018), inline=b"abc"),
         dict(record=True, status=Status.NO_SPACE)),
        (Load(flags=F.ALLOW_UNSEALED | F.INVALIDATE, request_id=rid + 4, handle=h,
              generation=5, data=DataDesc(0x77, 0x2000, 8)), dict(dlen=8, boff=0x150000)),
        (Load(flags=F.RECORD, request_id=rid + 5, handle=h + 9,
              data=DataDesc(0x78, 0x3000, 64), completion=ComplDesc(0x97, 0x7030)),
         dict(status=Status.INVALID_HANDLE)),
        (Bind(request_id=rid + 6, handle=h + 4, ticket=12, data_length=4096,
              block_offset=0x158000), dict(dlen=4096, boff=0x158000)),
        (Free(request_id=rid + 7, handle=h), {}),
        (Free(flags=F.RECORD, request_id=rid + 8, handle=h + 1,
              completion=ComplDesc(0x96, 0x7048)), dict(record=True)),
        (Goodbye(flags=GoodbyeFlags.RELEASE, request_id=rid + 9), {}),
    ]:
        req(msg, **kw)
    return sent


@pytest.fixture(scope="module")
def good(home, tmp_path_factory):
    """A capture of two connections (big-endian, ADDR_LE) exercising every message."""
    cap = Capture()
    sent = session(cap, conn(1), False, 0x100) + session(cap, conn(2), True, 0xFEDCBA9876540001)
    path = cap.write(tmp_path_factory.mktemp("dissector") / "kbtp-good.pcap")
    return path, cap, sent


# --------------------------------------------------------------------------------------------
# Generated constants
# --------------------------------------------------------------------------------------------

def test_lua_constants_generated_from_headers():
    """kbtp.lua carries exactly what tools/wireshark/gen.py renders from hw/headers.py."""
    p = subprocess.run([sys.executable, GEN, "--check"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr


def _gen():
    # by path: tests/tool_gate.py takes the name "tools" on sys.path under pytest
    spec = importlib.util.spec_from_file_location("kbtp_wireshark_gen", GEN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_drift_is_detected(tmp_path):
    gen = _gen()
    text = open(LUA).read()
    assert gen.splice(text, gen.render()) == text
    drifted = text.replace('{0x0012, "ALLOC_STORE"}', '{0x0015, "ALLOC_STORE"}', 1)
    assert drifted != text
    bad = tmp_path / "kbtp.lua"
    bad.write_text(drifted)
    assert gen.main(["--check", "--lua", str(bad)]) == 1
    # and the generated table names every opcode, status, flag and feature of hw/headers.py
    block = gen.render()
    for enum_cls in (Opcode, Status, ReqFlags, GoodbyeFlags, Features):
        for m in enum_cls:
            assert f'{{0x{m.value:04x}, "{m.name}"}}' in block, (enum_cls, m)


# --------------------------------------------------------------------------------------------
# Good messages
# --------------------------------------------------------------------------------------------

def test_every_message_decodes_as_the_codec_encoded_it(home, good):
    path, cap, sent = good
    names = sorted({f"kbtp.{k}" for _, msg, _, _ in sent for k in expected_fields(msg)})
    rows = fields(home, path, names + ["kbtp.addr_le"])
    assert sorted(rows) == sorted(f for f, *_ in sent), "every KBTP frame, and only those"
    seen = set()
    for frame, msg, addr_le, _ in sent:
        row = rows[frame]
        for name, want in expected_fields(msg).items():
            got = row[f"kbtp.{name}"]
            assert got != "", (frame, type(msg).__name__, name)
            assert parse_value(got, want) == (want if isinstance(want, int) else want.lower()), \
                (frame, type(msg).__name__, name, got, want)
        if isinstance(msg, codec.Message) and msg.OPCODE in codec.REQUEST_OPCODES \
                and msg.OPCODE is not Opcode.HELLO:
            assert row["kbtp.addr_le"] == ("1" if addr_le else "0"), (frame, row)
        seen.add(type(msg).__name__)
    assert seen == {"Hello", "HelloAck", "Load", "Store", "AllocStore", "Free", "Bind",
                    "Completion", "Goodbye", "CompletionRecordValue"}


def test_good_messages_have_no_errors(home, good):
    path, _, sent = good
    assert tshark(home, path, "-Y", "_ws.malformed || _ws.expert.severity == error") == ""
    out = tshark(home, path, "-T", "fields", "-e", "frame.protocols")
    assert "rpcordma" not in out and ":data" not in out, out
    assert out.count("infiniband:kbtp") == len(sent)


def test_request_response_matching(home, good):
    path, cap, sent = good
    rows = fields(home, path, ["kbtp.response_in", "kbtp.response_to", "kbtp.time"], "-2")
    for frame, msg, _, resp in sent:
        if resp is None:
            continue
        assert rows[frame]["kbtp.response_in"] == str(resp), (frame, rows[frame])
        assert rows[resp]["kbtp.response_to"] == str(frame), (resp, rows[resp])
        dt = cap.info[resp - 1]["t"] - cap.info[frame - 1]["t"]
        assert abs(float(rows[resp]["kbtp.time"]) - dt) < 1e-5, (resp, rows[resp], dt)
    # single pass (plain tshark) still links each response to its request
    rows1 = fields(home, path, ["kbtp.response_to"])
    assert {f: r["kbtp.response_to"] for f, r in rows1.items() if r["kbtp.response_to"]} == \
        {resp: str(frame) for frame, _, _, resp in sent if resp is not None}


def test_display_filters(home, good):
    path, _, sent = good

    def frames(flt):
        return sorted(fields(home, path, [], "-Y", flt))

    alloc = sorted(f for f, msg, _, _ in sent if getattr(msg, "OPCODE", None) is Opcode.ALLOC_STORE)
    assert len(alloc) == 4 and frames('kbtp.opcode == "ALLOC_STORE"') == alloc
    assert frames("kbtp.opcode == 0x12") == alloc
    failed = sorted(f for f, msg, _, _ in sent
                    if isinstance(msg, codec.Message) and msg.status != 0)
    assert failed and frames("kbtp.status != 0") == failed
    records = sorted(f for f, msg, _, _ in sent if isinstance(msg, codec.CompletionRecordValue))
    assert frames('kbtp.record.status == "NO_SPACE"') == [
        f for f in records if sent[[s[0] for s in sent].index(f)][1].status == 5]
    assert frames("kbtp.flags.inline == 1") == sorted(
        f for f, msg, _, _ in sent if isinstance(msg, codec.Message)
        and msg.OPCODE in (Opcode.STORE, Opcode.ALLOC_STORE) and msg.flags & F.INLINE.value)


# --------------------------------------------------------------------------------------------
# Malformed messages: the codec's cases
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def malformed(home, tmp_path_factory):
    """Each codec malformed case after a valid HELLO/HELLO_ACK of its own connection."""
    cap = Capture()
    cases = []
    for i, (name, raw, kwargs, fieldname, status) in enumerate(MALFORMED_CASES):
        c = conn(100 + i)
        ack = HelloAck(request_credits=8, block_size=kwargs.get("block_size", 0xFFFFFFFF),
                       max_inline=kwargs.get("max_inline", 0xFFFFFFFF), allocation_quota=4,
                       handle_base=0x4000, handle_count=256, ticket_timeout_ms=100)
        cap.send(c, codec.encode(Hello(completion_credits=8)), to_target=True)
        cap.send(c, codec.encode(ack), to_target=False)
        to_target = not (len(raw) >= 2 and raw[1] in (Opcode.HELLO_ACK.value,
                                                      Opcode.COMPLETION.value))
        with pytest.raises(codec.KbtpError) as info:
            codec.decode(raw, **kwargs)
        cases.append((cap.send(c, raw, to_target=to_target), name, fieldname, status,
                      info.value))
    path = cap.write(tmp_path_factory.mktemp("dissector") / "kbtp-malformed.pcap")
    return path, cases


def test_malformed_cases_name_the_field(home, malformed):
    path, cases = malformed
    rows = fields(home, path, ["_ws.expert.message", "_ws.expert.severity", "_ws.expert.group"],
                  "-Y", "_ws.expert.severity == error")
    assert sorted(rows) == sorted(f for f, *_ in cases), "an error on each bad frame, only there"
    for frame, name, fieldname, status, _ in cases:
        msg = rows[frame]["_ws.expert.message"]
        assert f"kbtp.{fieldname}: " in msg, (name, msg)
        # truncation is Malformed (sets _ws.malformed), any other defect a Protocol error
        group = PI_MALFORMED if "truncated" in msg else PI_PROTOCOL
        assert group in [int(g, 0) for g in rows[frame]["_ws.expert.group"].split(",")], \
            (name, rows[frame])
    truncated = sorted(f for f, *_, err in cases if err.message.startswith("truncated"))
    assert len(truncated) >= 5, truncated
    assert sorted(fields(home, path, [], "-Y", "_ws.malformed")) == truncated
    # never Wireshark's own "Malformed Packet" (an exception) nor a Lua error
    verbose = tshark(home, path, "-V")
    assert "Lua Error" not in verbose and "[Malformed Packet" not in verbose


# --------------------------------------------------------------------------------------------
# Real soft-RoCE captures: no KBTP in them, and nothing claimed or broken
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["rxe-retransmit-after-drop.pcap",
                                  "rxe-two-guests-pingpong-rping.pcap",
                                  "rxe-vs-host-peer-send-write-read-atomic.pcap"])
def test_softroce_captures(home, name):
    path = os.path.join(DATA_DIR, name)
    assert tshark(home, path, "-Y", "kbtp") == "", "no KBTP in these captures"
    with_lua = tshark(home, path, "-Y", "_ws.malformed || _ws.expert.severity == error")
    without = tshark(home, path, "-Y", "_ws.malformed || _ws.expert.severity == error",
                     lua=False)
    assert with_lua.count("\n") == without.count("\n")


def test_installed_copy_and_script_load_once(home, good, tmp_path):
    """`make install` copies kbtp.lua to the personal plugins folder; with -X lua_script as
    well it must load once, without a duplicate-protocol error."""
    plugins = tmp_path / ".local" / "lib" / "wireshark" / "plugins"
    plugins.mkdir(parents=True)
    shutil.copy(LUA, plugins / "kbtp.lua")
    path, _, sent = good
    out = tshark(str(tmp_path), path, "-Y", "kbtp", lua=False)
    assert out.count("\n") == len(sent)
    out = tshark(str(tmp_path), path, "-Y", "kbtp")
    assert out.count("\n") == len(sent)

# Ref: issue 5; draft KBTP §Operations, §Direct Modes, §Status Codes.
#      docs/softroce-vm.md (guest, tshark --disable-protocol rpcordma)
"""End to end: Linux soft-RoCE (rxe + pyverbs in the QEMU guest) against ``kbtp-sim serve``,
once with ``--model`` (the golden model behind the Python RC endpoint) and once with the gateware
(the Verilated KbtpTarget with the host driver and the CM over its raw-frame queues).

Two guest boots per backend (each runs many checks; TCG boots are the cost):

* MTU 1500 (RoCE MTU 1024): tests/e2e/ops.py with every section -- ALLOC_STORE/LOAD/DIRECT_LOAD
  /FREE of 64 octets to 64 KiB, STORE and SEAL rules, generations, INVALIDATE through a memory
  window (and its effect: a second LOAD into the window is refused by the guest's NIC), RECORD,
  DIRECT_ALLOC + BIND, pipelined LOADs, a ticket abandoned by timeout, and one status error of
  each kind an initiator can provoke; a pcap of the run is checked with tshark.
* MTU 9000 (RoCE MTU 4096), ADDR_LE target, 2 % frame loss at the endpoint (both directions):
  the sizes, direct and pipeline sections.

Oracles: the guest compares loaded data with the seeded data it stored and statuses with the
draft's rules (its own lines); the host side checks that the model counted the same outcomes,
that the link really lost frames and the endpoints recovered, that the negotiated path MTU is the
one asked for, and tshark's independent dissection of the capture. The two backends must agree:
every check the guest made has the same outcome against both.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tool_gate import requires_tool

# One worker runs them all (make test: --dist loadgroup): the runs are cached per process.
pytestmark = pytest.mark.xdist_group(name="e2e")

_GUEST_TOOLS = ("qemu-system-x86_64", "debootstrap", "cpio")


def needs_guest(fn):
    """Root (skip without it) and the guest's tools (tests/tool_gate.py: fail under CI=true)."""
    missing = [t for t in _GUEST_TOOLS if shutil.which(t) is None]
    fn = requires_tool(", ".join(missing), not missing, "make apt installs them")(fn)
    return pytest.mark.skipif(os.geteuid() != 0, reason="e2e tests need root")(fn)

# Every status an initiator can provoke on its own and the section that provokes it (INTERNAL
# needs a fault of the initiator's NIC that would also kill the connection: not provoked).
ERROR_CHECKS = {
    "INVALID_HANDLE": "err.INVALID_HANDLE_load",
    "STALE_GENERATION": "ops.load_wrong_gen_STALE_GENERATION",
    "NOT_VALID": "ops.load_freed_NOT_VALID",
    "ALREADY_BOUND": "err.ALREADY_BOUND",
    "NO_SPACE": "err.NO_SPACE_quota",
    "SEALED": "ops.store_after_seal_SEALED",
    "NOT_SEALED": "ops.load_unsealed_NOT_SEALED",
    "TOO_LARGE": "err.TOO_LARGE_load_buffer",
    "MALFORMED": "err.MALFORMED",
    "TICKET_ABANDONED": "abandon.TICKET_ABANDONED",
}
SIZES = (64, 1000, 4096)            # up to the block size of the served configuration
BACKENDS = ("model", "gateware")
#: IB path MTU codes (CM REQ) -> octets.
PMTU_CODE = {3: 1024, 5: 4096}


def _lines(output, word):
    return [ln.split(None, 2)[1:] for ln in output.splitlines() if ln.startswith(word + " ")]


def _report(name, r):
    times = {}
    for op, secs, octets in (x[0:1] + x[1].split() for x in _lines(r.output, "TIME")
                             if len(x) == 2):
        times.setdefault(op, []).append(f"{octets}:{float(secs) * 1e3:.1f}ms")
    print(f"\n{name}: exit {r.exit_code}, boot {r.guest.boot_s:.1f} s, wall {r.wall_s:.1f} s; "
          f"frames {r.frames}; glue {r.glue}; times {times}", file=sys.stderr)


def _pmtu(r):
    """The path MTU the target's side set up for the guest's connection."""
    if r.backend == "model":
        m = re.search(r"pmtu=(\d+)", r.log[0])
        return int(m.group(1)) if m else None
    m = next((re.search(r"pmtu code (\d+)", ln) for ln in r.log if "CM REQ from" in ln), None)
    return PMTU_CODE.get(int(m.group(1))) if m else None


def _checks(out):
    """{check name: passed} of a guest run (its OK / FAIL lines)."""
    res = {x[0]: True for x in _lines(out, "OK")}
    res.update({x[0]: False for x in _lines(out, "FAIL")})
    return res


_runs = {}


def _run(name, backend, tmp_path_factory, **kw):
    """One guest run per (name, backend) in this process (module fixtures re-run per param)."""
    from sim.serve_guest import run_e2e

    key = (name, backend)
    if key not in _runs:
        pcap = tmp_path_factory.mktemp("e2e") / f"{name}-{backend}.pcap"
        r = run_e2e(backend=backend, pcap=str(pcap), **kw)
        _report(f"e2e {name} ({backend})", r)
        r.pcap = pcap
        _runs[key] = r
    return _runs[key]


def _mtu1024(backend, tmp_path_factory):
    return _run("mtu1024", backend, tmp_path_factory, script="ops.py",
                args=[",".join(map(str, SIZES)), "3"], mtu=1500,
                config={"ticket_timeout_ms": 10000}, timeout_s=900)


def _mtu4096_loss(backend, tmp_path_factory):
    return _run("mtu4096_loss", backend, tmp_path_factory, script="ops.py",
                args=[",".join(map(str, SIZES)), "5", "sizes", "direct", "pipeline"], mtu=9000,
                drop=0.02, seed=4, config={"addr_le": True}, timeout_s=900)


@pytest.fixture(scope="module", params=BACKENDS)
def run_mtu1024(request, tmp_path_factory):
    return _mtu1024(request.param, tmp_path_factory)


@needs_guest
def test_all_operations_mtu1024(run_mtu1024):
    r = run_mtu1024
    out = r.output
    assert r.exit_code == 0, out
    assert re.search(r"SUMMARY passed=\d+ failed=0", out), out
    ok = {x[0] for x in _lines(out, "OK")}
    for n in SIZES:
        for what in ("alloc_store", "load", "direct_load", "free"):
            assert f"size{n}.{what}" in ok, out
    for name in ("ops.store", "ops.store_inline_seal", "ops.load_sealed_with_gen",
                 "ops.free_new_generation", "ops.rebind_new_generation", "direct.alloc_bind",
                 "direct.load_after_bind", "pipeline.loads", "record.load", "invalidate.load",
                 "invalidate.window_dead"):
        assert name in ok, (name, out)
    assert _pmtu(r) == 1024, r.log[:5]
    # The table entry the guest read through the Table STag: VALID|SEALED, 300 octets.
    assert _lines(out, "ENTRY")[0][1].split()[0] == "3"


@needs_guest
def test_each_status_error(run_mtu1024):
    r = run_mtu1024
    ok = {x[0] for x in _lines(r.output, "OK")}
    counted = {st for (_, st) in r.statuses()}
    for status, check in ERROR_CHECKS.items():
        assert check in ok, (check, r.output)
        assert status in counted, (status, r.model.counters)


def _rem_access_naks(pcap, target_ip="10.0.0.2"):
    """The RC Acknowledge frames (BTH opcode 0x11) with AETH syndrome 0x62 (NAK, remote access
    error) that the guest sent, from a capture of the run (parsed here, not by the endpoint)."""
    from sim.scapy_roce import pcap_roce_frames
    out = []
    for raw in pcap_roce_frames(str(pcap)):
        bth = 14 + 4 * (raw[14] & 0xF) + 8
        src = ".".join(str(x) for x in raw[26:30])
        if src != target_ip and len(raw) > bth + 12 and raw[bth] == 0x11 \
                and raw[bth + 12] == 0x62:
            out.append(raw)
    return out


@needs_guest
def test_invalidated_window_refused_by_guest_nic(run_mtu1024):
    """The second LOAD into the invalidated window: the target's RDMA WRITE is refused (NAK
    remote access) by rxe, i.e. the SEND with Invalidate really invalidated the window."""
    r = run_mtu1024
    window = int(_lines(r.output, "WINDOW")[0][0], 16)
    # On the wire (both backends): the guest's NIC answered with an RC ACK whose AETH syndrome
    # is NAK remote access error (0x62, IBTA Vol. 1 §9.7.5.2.3 / roce-layouts.md §6): the
    # specific error, not a timeout nor another NAK.
    naks = _rem_access_naks(r.pcap)
    assert naks, "no NAK (remote access error) from the guest in the capture"
    if r.backend == "model":
        assert any(f"invalidate {window:#x}" in ln for ln in r.log), r.log[-30:]
        assert any("WRITE failed: REM_ACCESS_ERR" in ln for ln in r.log), r.log[-30:]
        assert r.ep_counters["naks_received"] >= 1
    else:
        # The target's requester got the guest NIC's NAK (remote access error) for its WRITE:
        # a connection-fatal NAK moves that QP to the error state and counts an error event.
        assert r.ep_counters.get("req.error_events", 0) >= 1, r.ep_counters


def _tshark(pcap, home, *args):
    """tshark with the repository's KBTP dissector and no other option (HOME elsewhere, so an
    installed copy of the plugin does not stand in for the file under test)."""
    lua = Path(__file__).resolve().parents[2] / "tools" / "wireshark" / "kbtp.lua"
    p = subprocess.run(["tshark", "-r", str(pcap), "-X", f"lua_script:{lua}", *args],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, HOME=str(home)))
    assert p.returncode == 0 and "Lua" not in p.stderr, p.stderr
    return [ln.split("\t") for ln in p.stdout.splitlines() if ln.strip()]


def _kbtp_counts(pcap, home):
    """({(request opcode name, status name of its response): count}, {error frame: status of
    the target's answer}, malformed rows) of a capture, from the dissector alone."""
    from hw.headers import Opcode, Status
    rows = _tshark(pcap, home, "-2", "-Y", "kbtp", "-T", "fields", "-e", "frame.number",
                   "-e", "kbtp.opcode", "-e", "kbtp.status", "-e", "kbtp.record.status",
                   "-e", "kbtp.response_in", "-e", "kbtp.retransmission_of")
    frames = {int(r[0]): (r + [""] * 6)[1:6] for r in rows}

    def status_of(resp_in):
        _, st, rec, _, _ = frames[int(resp_in)]
        return Status(int(st or rec)).name

    counts = {}
    for op, st, rec, resp_in, rtx in frames.values():
        if not op or rtx or int(op, 0) in (Opcode.COMPLETION.value, Opcode.HELLO_ACK.value):
            continue
        key = (Opcode(int(op, 0)).name, status_of(resp_in) if resp_in else None)
        counts[key] = counts.get(key, 0) + 1
    errors = {}
    for (num,) in _tshark(pcap, home, "-2", "-Y", "_ws.expert.severity == error", "-T",
                          "fields", "-e", "frame.number"):
        _, _, _, resp_in, rtx = frames.get(int(num), ("",) * 5)
        if rtx:
            # An RC retransmission (same PSN) of a request already here: the guest's NIC
            # resends when the target's ACK reaches it after its ACK timeout (a loaded host).
            # The dissector matches the answer to the first copy only, and shows the copy's
            # defect again: the first copy stands for both, as in ``counts``.
            continue
        errors[int(num)] = status_of(resp_in) if resp_in else None
    return counts, errors, _tshark(pcap, home, "-Y", "_ws.malformed")


@requires_tool("tshark", shutil.which("tshark") is not None, "make apt")
def test_kbtp_counts_retransmitted_bad_request(tmp_path):
    """No guest: the capture check of test_pcap_tshark on a made-up capture where the guest's
    NIC resent (same PSN, as rxe does when the target's ACK is late) one of the requests it
    gets wrong on purpose. The resent copy shows the same expert error but has no answer of its
    own (the dissector matches the answer to the first copy): it is not a second error, and
    the request is counted once (the clean-clone run of d83c3a3 failed on this with a
    TypeError, sorting None among the statuses)."""
    from host import codec
    from host.codec import Completion, Hello, HelloAck
    from hw.headers import Status
    from tests.host.test_codec import OP, INLINE, dd, hdr
    from tests.tools.test_dissector import Capture, conn

    cap, c = Capture(), conn(1)
    cap.send(c, codec.encode(Hello(completion_credits=8)), to_target=True)
    cap.send(c, codec.encode(HelloAck(request_credits=8, block_size=4096, max_inline=1024,
                                      allocation_quota=4, handle_base=0x4000,
                                      handle_count=256, ticket_timeout_ms=100)),
             to_target=False)
    bad = cap.send(c, hdr(OP["LOAD"], INLINE, rid=5, handle=0x4001) + dd(1, 0x1000, 64),
                   to_target=True)
    resent = cap._add(cap.frames[bad - 1].copy(), {}, 0.008)
    cap.send(c, codec.encode(Completion(request_id=5, handle=0x4001, generation=0,
                                        status=Status.MALFORMED)), to_target=False)
    counts, errors, malformed = _kbtp_counts(cap.write(tmp_path / "resent.pcap"), tmp_path)
    assert resent == bad + 1 and malformed == []
    assert errors == {bad: "MALFORMED"}, errors
    assert counts == {("HELLO", "OK"): 1, ("LOAD", "MALFORMED"): 1}, counts


@needs_guest
def test_connections_at_once_then_rej(tmp_path_factory):
    """Issue 22: the guest opens as many rdma_cm connections at once as the shipped target has
    QPs (sim/serve_hw.py HW, the ECPIX-5 core in DDR3); each stores and loads its own blocks
    (2 each, interleaved, inline and by RDMA READ) while all are open. One more connection
    attempt is refused: rdma_cm in the guest fails the connect (not its 30 s alarm), and the
    target's CM sent a REJ with reason 1, No QP available (IBTA CM REJ reasons). Then one
    connection leaves and a new one is served on the QP it freed. The served pool gets 2 shared
    blocks per connection (8 + 2 n blocks: 2 DIRECT_ALLOC partitions of 4, sim/frameserver.py
    model_config) as quotas of 2, so that every connection may allocate; the table has a
    handle range per QP (served_config)."""
    from sim.serve_hw import HW
    n = HW["n_qp"]
    r = _run("conns", "gateware", tmp_path_factory, script="conns.py",
             args=[str(n), "2", "1000", "7"], mtu=1500, timeout_s=1800,
             config={"quota_per_initiator": 2, "num_blocks": 8 + 2 * n})
    out = r.output
    assert r.exit_code == 0 and re.search(r"SUMMARY passed=\d+ failed=0", out), out
    ok = {x[0] for x in _lines(out, "OK")}
    print("\n".join(ln for ln in out.splitlines()
                    if ln.startswith(("SESSION", "OK connect", "OK extra", "OK reuse.conn",
                                      "RETRY", "WALL"))), file=sys.stderr)
    assert len(_lines(out, "SESSION")) == n, out
    for i in range(1, n + 1):
        for k in range(2):
            assert {f"all.c{i}.b{k}.alloc_store", f"all.c{i}.b{k}.load"} <= ok, (i, k, out)
    assert {"connect.all_open", "extra.refused", "extra.others_unharmed",
            "reuse.connected", "reuse.c0.b0.load"} <= ok, out
    # The target's side: n connections placed on QPs 0..n-1, the one beyond refused with
    # reason 1, and the new connection on the QP connection 1 left (QP 0).
    placed = [int(m.group(1)) for m in (re.search(r"CM REQ from .* -> qp (\d+)", ln)
                                        for ln in r.log) if m]
    assert placed[:n] == list(range(n)) and placed[n:] == [0], placed
    retries = len(_lines(out, "RETRY"))         # a reconnect refused while QP 0 waited
    assert sum("CM REJ reason 1 " in ln for ln in r.log) == 1 + retries, [
        ln for ln in r.log if "REJ" in ln]


@needs_guest
@requires_tool("tshark", shutil.which("tshark") is not None, "make apt")
def test_pcap_tshark(run_mtu1024, tmp_path):
    """tshark with the KBTP dissector (tools/wireshark/kbtp.lua) and no other option: no
    malformed frame; an expert error only on the two requests the guest gets wrong on purpose
    (the target answered them TOO_LARGE and MALFORMED); every KBTP request counted by opcode
    and status as the target counted it."""
    r = run_mtu1024
    counts, errors, malformed = _kbtp_counts(r.pcap, tmp_path)
    assert malformed == [], malformed[:20]
    # (str: a bad request without an answer, None, fails here and not in sorted())
    assert sorted(map(str, errors.values())) == ["MALFORMED", "TOO_LARGE"], errors
    # (the driver's own events: reclamations, expiries, GOODBYEs, and the engine's partition
    # tickets it stopped waiting for, host/driver.py _drop_engine_tickets)
    target = {k: v for k, v in r.statuses().items()
              if k[0] not in ("RECLAIM", "RETENTION_EXPIRY", "GOODBYE", "ENGINE_TICKET")}
    seen = {k: v for k, v in counts.items() if k[0] != "GOODBYE" and k[1] is not None}
    # A request whose answer never reached the wire (the LOAD into the invalidated window: its
    # data WRITE was refused, the connection failed) has no status in the capture: the target's
    # counts beyond the answered ones must be exactly those requests, operation by operation.
    unanswered = {}
    for (op, st), v in counts.items():
        if st is None and op != "GOODBYE":
            unanswered[op] = unanswered.get(op, 0) + v
    rest = {}
    for k, v in target.items():
        assert seen.get(k, 0) <= v, (k, seen.get(k), v)
        if v > seen.get(k, 0):
            rest[k[0]] = rest.get(k[0], 0) + v - seen.get(k, 0)
    assert set(seen) <= set(target), set(seen) - set(target)
    assert rest == unanswered, (rest, unanswered, sorted(target.items()))
    print(f"\ntshark KBTP counts ({r.backend}): {sorted(seen.items())}; without an answer on "
          f"the wire {unanswered}", file=sys.stderr)
    rows = _tshark(r.pcap, tmp_path, "-Y", "infiniband", "-T", "fields", "-e", "ip.src",
                   "-e", "ip.dst", "-e", "infiniband.bth.opcode")
    dirs = {(a, b) for a, b, _ in rows}
    assert ("10.0.0.1", "10.0.0.2") in dirs and ("10.0.0.2", "10.0.0.1") in dirs, dirs
    ops = {int(op) for _, _, op in rows if op}
    # RC SEND Only, WRITE Only, READ request/response Only, ACK, Atomic ACK, FetchAdd, SEND
    # Only with Invalidate, and CM (UD SEND Only).
    for op in (0x04, 0x0A, 0x0C, 0x10, 0x11, 0x12, 0x14, 0x17, 0x64):
        assert op in ops, (hex(op), sorted(map(hex, ops)))


@needs_guest
@requires_tool("tshark", shutil.which("tshark") is not None, "make apt")
def test_pcap_tshark_lossy(backend_lossy, tmp_path):
    """The ADDR_LE capture with 2 % loss: no malformed frame, no expert error."""
    counts, errors, malformed = _kbtp_counts(backend_lossy.pcap, tmp_path)
    assert malformed == [] and errors == {}, (malformed[:20], errors)
    assert counts.get(("LOAD", "OK"), 0) > 0, counts


@pytest.fixture(params=BACKENDS)
def backend_lossy(request, tmp_path_factory):
    return _mtu4096_loss(request.param, tmp_path_factory)


@needs_guest
@pytest.mark.parametrize("backend", BACKENDS)
def test_mtu4096_addr_le_with_loss(backend, tmp_path_factory):
    r = _mtu4096_loss(backend, tmp_path_factory)
    out = r.output
    assert r.exit_code == 0, out
    assert re.search(r"SUMMARY passed=\d+ failed=0", out), out
    assert "addr_le=True" in out
    assert _pmtu(r) == 4096, r.log[:5]
    ok = {x[0] for x in _lines(out, "OK")}
    for n in SIZES:
        assert f"size{n}.load" in ok and f"size{n}.direct_load" in ok
    assert r.frames["dropped"] > 0


@needs_guest
@pytest.mark.parametrize("run", [_mtu1024, _mtu4096_loss],
                         ids=["mtu1024", "mtu4096_loss"])
def test_backends_agree(run, tmp_path_factory):
    """Every check the guest made has the same outcome against the model and the gateware."""
    model, hw = (run(b, tmp_path_factory) for b in BACKENDS)
    a, b = _checks(model.output), _checks(hw.output)
    assert a and a == b, {k: (a.get(k), b.get(k)) for k in set(a) | set(b)
                          if a.get(k) != b.get(k)}

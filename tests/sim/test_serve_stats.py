# Ref: issue 24 (target time from the simulated target); draft KBTP §Operations, §Completion;
#      sim/serve_stats.py; sim/serve_hw.py (--stats-file); tests/sim/test_serve_hw.py (the initiator).
"""``kbtp-sim serve --stats-file``: board time of each KBTP request, checked from the wire.

The served gateware (the ECPIX-5 core, Verilated) is driven by a Python RC initiator
(:class:`roce.rc.RoceEndpoint`, as in tests/sim/test_serve_hw.py): HELLO, ALLOC_STORE by RDMA READ,
LOAD, a LOAD refused with TOO_LARGE, FREE, a LOAD of the freed handle, and two LOADs in flight
at once. Oracles:

* the initiator's own view: the Request IDs it sent and the Status of each COMPLETION it got
  must be the stats file's records, one for one;
* physics of the GMII link: one octet per 8 ns cycle, so a LOAD's data (length octets) cannot
  leave the target in fewer cycles than its length, and nothing answers before it was asked;
* unit arithmetic at the board's clocks: ns = GMII cycles x 8, core cycles = GMII cycles / 6.

The file is also checked while serving (written every ~1 s, always whole JSON) and at exit
(``final``).
"""

import json
import time

import pytest

from host import codec
from hw.headers import ReqFlags
from roce.rc import QPState
from tests.sim.test_serve_hw import BUF_RKEY, BUF_VA, serving
from sim.vltarget import board_params

DIV = board_params("ecpix5")["core_div"]     # GMII cycles per core cycle of the shipped core

pytestmark = pytest.mark.xdist_group(name="serve_hw")


@pytest.fixture(scope="module")
def served_stats(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve_stats")
    stop, stats = tmp / "stop", tmp / "stats.json"
    with serving(tmp, "--stats-file", str(stats)) as (proc, ini):
        yield proc, ini, tmp, stop, stats


def test_stats_file_board_time(served_stats):
    proc, ini, tmp, stop, stats = served_stats
    qp = ini.connect()
    ini.run_until(lambda: qp.state == QPState.RTS, 300, "REP")
    sent = []                                    # (opcode name, request id, length)
    got = {}                                     # request id -> status, as the initiator saw

    def submit(msg, length=0):
        qp.send(codec.encode(msg))
        sent.append((msg.OPCODE.name, msg.request_id, length))

    def wait(n):
        ini.run_until(lambda: len(ini.inbox) >= n and qp.outstanding == 0, 600, "replies")
        for raw in ini.inbox:
            m = codec.decode(raw)
            got[m.request_id] = m.status

    def desc(off, n):
        return codec.DataDesc(BUF_RKEY, BUF_VA + off, n)

    submit(codec.Hello(requested_features=0, completion_credits=8,
                       initiator_id=9))
    wait(1)
    h = codec.decode(ini.inbox[0]).handle_base
    n = 3000
    ini.mem[0:n] = bytes((k * 7) & 0xFF for k in range(n))
    steps = [(codec.AllocStore(request_id=2, handle=h, data=desc(0, n),
                               flags=ReqFlags.SEAL.value), n),
             (codec.Load(request_id=3, handle=h, data=desc(65536, n)), n),
             (codec.Load(request_id=4, handle=h, data=desc(0, 100)), 100),      # TOO_LARGE
             (codec.AllocStore(request_id=5, handle=h + 1, data=desc(0, 64),
                               flags=ReqFlags.SEAL.value), 64),
             (codec.Free(request_id=6, handle=h + 1), 0),
             (codec.Load(request_id=7, handle=h + 1, data=desc(0, 64)), 64)]   # freed
    for msg, length in steps:
        submit(msg, length)
        wait(len(sent))
    # Two LOADs in flight at once (within the 16 credits): each gets its own first response.
    submit(codec.Load(request_id=8, handle=h, data=desc(65536, n)), n)
    submit(codec.Load(request_id=9, handle=h, data=desc(2 * 65536 - n, n)), n)
    wait(len(sent))
    want = bytes((k * 7) & 0xFF for k in range(n))
    assert bytes(ini.mem[65536:65536 + n]) == want == bytes(ini.mem[2 * 65536 - n:2 * 65536])
    assert got[3] == 0 and got[4] == 8 and got[6] == 0 and got[7] != 0

    # While serving, the file is rewritten every ~1 s; it is always whole JSON.
    deadline = time.monotonic() + 120
    while True:
        ini.srv.step(0.05)
        data = json.loads(stats.read_text()) if stats.exists() else None
        if data and len([r for r in data["records"] if r["completion_cycle"]]) >= len(sent):
            break
        assert time.monotonic() < deadline, "stats file never caught up"
    assert data["final"] is False
    stop.write_text("stop")
    proc.wait(120)
    data = json.loads(stats.read_text())
    assert data["final"] is True

    clk = data["clocks"]
    assert clk["mac_hz"] == 125e6 and clk["ns_per_gmii_cycle"] == 8.0
    div = clk["mac_hz"] / clk["core_hz"]
    assert abs(div - DIV) < 1e-9 and data["params"]["core_div"] == DIV
    recs = {r["request_id"]: r for r in data["records"] if r["peer_qpn"] == qp.qpn}
    # One record per request the initiator sent, with the status it saw.
    assert sorted(recs) == sorted(rid for _, rid, _ in sent)
    for op, rid, length in sent:
        r = recs[rid]
        assert r["opcode"] == op and r["status"] == got[rid], (r, got[rid])
        assert r["length"] == length
        assert 0 < r["cycles_first"] <= r["cycles_completion"], r
        assert r["ns_first"] == r["cycles_first"] * 8
        assert r["ns_completion"] == r["cycles_completion"] * 8
        assert abs(r["core_cycles_completion"] - r["cycles_completion"] / DIV) < 1e-6
        assert r["rx_last_cycle"] < r["first_cycle"] <= r["completion_cycle"] <= data["cycle"]
    # What the first response is: the READ of the source, the WRITE of the data, or the
    # COMPLETION itself when nothing moves.
    assert recs[2]["first_kind"] == "READ" and recs[5]["first_kind"] == "READ"
    for rid in (3, 8, 9):
        assert recs[rid]["first_kind"] == "WRITE"
        # GMII carries one octet per cycle: the data takes at least `length` cycles.
        assert recs[rid]["completion_cycle"] - recs[rid]["first_cycle"] >= n
    for rid in (0, 4, 6, 7):
        assert recs[rid]["first_kind"] == "SEND"
        assert recs[rid]["first_cycle"] == recs[rid]["completion_cycle"]
    # In flight together: the second LOAD's data follows the first's, and the COMPLETIONs
    # keep the requests' order. (The second's data may go before the first's COMPLETION: the
    # engine's front hands over the next WRITE while its back still posts the COMPLETION.)
    assert recs[9]["first_cycle"] > recs[8]["first_cycle"] + n
    assert recs[9]["completion_cycle"] > recs[8]["completion_cycle"]
    # Counters: the engine and driver saw these operations.
    eng = data["driver"]["engine"]
    assert eng.get("LOAD/OK", 0) >= 3, eng
    assert data["counters"]["mac.rx_frames_ok"] > 0
    assert data["frames"]["rx"] > 0 and data["frames"]["tx"] > 0
    print("\nboard time (ns, last request octet -> first response / COMPLETION): " + ", ".join(
        f"{r['opcode']}#{rid} {r['ns_first']:.0f}/{r['ns_completion']:.0f}"
        for rid, r in sorted(recs.items())))

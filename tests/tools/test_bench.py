# Ref: a quick bench checked against independent arithmetic; issue 7 item 1
#      (theoretical goodput 1024 / (1024 + 82) at MTU 1024); roce-layouts.md §1-§3 (framing);
#      tools/bench.py; scapy (frames built independently of hw/headers.py); roce/rc.py (frames the
#      RC endpoint really sends).
"""``make bench`` figures: wire arithmetic against scapy and the RC endpoint's own frames, and a
quick bench on the Verilated target as the ECPIX-5 builds it (two clocks, width 64; 64 and 4096
octets, MTU 1024) whose figures must be physically possible and whose data must arrive."""

import pytest

from tools import bench
from tools.bench import (IFG, MIN_FRAME, PACKET_OVERHEAD, PREAMBLE_SFD, FCS, REQUEST, frame_wire,
                       op_plan, theory_goodput)
from sim.scapy_roce import roce_frame
from sim.vltarget import board_params

DIV = board_params("ecpix5")["core_div"]     # GMII cycles per core cycle of the shipped core


def wire(frame):
    """Octet times of a frame on the wire: preamble + (padded) frame + FCS + IFG."""
    return 8 + max(len(frame), 60) + 4 + 12


def test_overhead_is_the_issue_figure():
    # issue 7: "1024 / (1024 + 82) at MTU 1024"; scapy's WRITE Middle of 1024 octets agrees.
    assert PACKET_OVERHEAD == 82
    assert theory_goodput(1024, 1024) == pytest.approx(1024 / 1106)
    assert wire(bytes(roce_frame(0x07, bytes(1024)))) - 1024 == PACKET_OVERHEAD
    assert (PREAMBLE_SFD, FCS, IFG, MIN_FRAME) == (8, 4, 12, 60)


@pytest.mark.parametrize("opcode,ext", [(0x07, 0), (0x06, 16), (0x0D, 4), (0x11, 4),
                                        (0x04, 0), (0x0C, 16)])
@pytest.mark.parametrize("payload", [0, 1, 7, 40, 64, 1024, 4096])
def test_frame_wire_against_scapy(opcode, ext, payload):
    if opcode in (0x11, 0x0C) and payload:
        return                      # ACK and READ request carry no payload
    assert frame_wire(payload, ext) == wire(bytes(roce_frame(opcode, bytes(payload))))


def test_theory_by_brute_force():
    # per packet payload / (payload + 82), summed packet by packet
    for mtu in (1024, 4096):
        for n in (64, 1000, 1024, 1025, 4096, 65536, 1 << 20):
            left, pay, tot = n, 0, 0
            while True:
                p = min(left, mtu)
                pay, tot, left = pay + p, tot + p + 82, left - p
                if left <= 0:
                    break
            assert theory_goodput(n, mtu) == pytest.approx(pay / tot)
            assert theory_goodput(n, mtu) < 1


@pytest.mark.parametrize("mtu", [1024, 4096])
@pytest.mark.parametrize("length", [64, 1000, 4096, 10000])
def test_data_frames_against_rc_endpoint(mtu, length):
    """The WRITE and READ response frames of op_plan are the ones an RC endpoint sends."""
    from roce.rc import RoceEndpoint
    a = RoceEndpoint("02:00:00:00:00:01", "10.0.0.1", min_frame=60)
    b = RoceEndpoint("02:00:00:00:00:02", "10.0.0.2", min_frame=60)
    qa = a.create_qp(qpn=0x10, dest_qpn=0x20, remote_ip="10.0.0.2",
                     remote_mac="02:00:00:00:00:02", pmtu=mtu)
    b.create_qp(qpn=0x20, dest_qpn=0x10, remote_ip="10.0.0.1",
                remote_mac="02:00:00:00:00:01", pmtu=mtu)
    b.register(bytearray(length), base_va=0x1000, rkey=0x77)
    qa.write(0x1000, 0x77, bytes(length))
    writes = a.poll_tx()
    assert [wire(f) for f in writes] == op_plan("LOAD", length, mtu)["to_peer"][1:-1]
    for f in writes:
        b.receive_frame(f, 0)
    b.poll_tx()
    qa.read(0x1000, 0x77, length)
    (req,) = a.poll_tx()
    plan = op_plan("STORE_READ", length, mtu)
    assert wire(req) == plan["to_peer"][1]
    b.receive_frame(req, 1)
    resp = b.poll_tx()
    assert [wire(f) for f in resp] == plan["to_target"][1:-1]
    # inline: the SEND packets of request + data
    qa.send(bytes(REQUEST + length))
    sends = a.poll_tx()
    assert [wire(f) for f in sends] == op_plan("STORE_INLINE", length, mtu)["to_target"][:-1]


def test_read_parts_in_the_plan():
    """A READ-store's plan with the engine's READ parts (hw/kbtp/movers.py WorkIssuer): one
    READ request per part and each part's responses, as RoceEndpoint's READs of the parts send
    them; the shipped ECPIX-5 core's parts are 4096 octets (a quarter of its READ window)."""
    from roce.rc import RoceEndpoint
    from sim.vltarget import board_params, read_part_of
    assert read_part_of(board_params("ecpix5", dram="ddr3")) == 4096
    wire = lambda f: len(f) + 4 + 20          # FCS, preamble, SFD and gap
    for mtu, length, part in ((1024, 16384, 4096), (4096, 65536, 4096), (4096, 6000, 4096),
                              (4096, 16384, 2048)):
        a = RoceEndpoint("02:00:00:00:00:01", "10.0.0.1", min_frame=60)
        b = RoceEndpoint("02:00:00:00:00:02", "10.0.0.2", min_frame=60)
        a.create_qp(qpn=0x10, dest_qpn=0x20, remote_ip="10.0.0.2",
                    remote_mac="02:00:00:00:00:02", pmtu=mtu)
        b.create_qp(qpn=0x20, dest_qpn=0x10, remote_ip="10.0.0.1",
                    remote_mac="02:00:00:00:00:01", pmtu=mtu)
        b.register(bytearray(length), base_va=0x1000, rkey=0x77)
        reqs, resps = [], []
        for off in range(0, length, part):
            a.qps[0x10].read(0x1000 + off, 0x77, min(part, length - off))
            (req,) = a.poll_tx()
            reqs.append(wire(req))
            b.receive_frame(req, 1)
            resps += [wire(f) for f in b.poll_tx()]
        plan = op_plan("STORE_READ", length, mtu, part=part)
        assert plan["to_peer"][1:-1] == reqs and len(reqs) == -(-length // part)
        assert plan["to_target"][1:-1] == resps
        assert op_plan("STORE_READ", length, mtu)["to_peer"][1:-1] == reqs[:1]


@pytest.fixture(scope="module")
def quick():
    out = {}
    for size in (64, 4096):
        out[size] = bench.run_size("ecpix5", size, quick=True, mtus=(1024,),
                                   log=lambda s: None)
    out["latency"] = bench.run_latency("ecpix5", log=lambda s: None)
    # 4 QPs at once at 4096 octets (the shipped core's 512 MB of DDR3 leaves 4 QPs' receive
    # buffers a Max Inline above 4096; the 128 KiB of block RAM of ecpix5-bram did not)
    out["multi"] = bench.run_multi("ecpix5", 4096, quick=True, mtus=(1024,),
                                   ops=("LOAD", "STORE_INLINE"), log=lambda s: None)
    return out


def test_quick_goodput_is_possible(quick):
    seen = set()
    for size in (64, 4096):
        r = quick[size]
        assert not r["failed"], r["failed"]
        for s in r["series"]:
            seen.add(s["op"])
            assert s["size"] == size and s["mtu"] == 1024
            # nothing moves faster than the wire: payload + 82 per packet at one octet/cycle
            assert 0 < s["frac_theory"] <= 1.0, s
            assert s["cycles_per_op"] >= size + 82 * -(-size // 1024), s
            # in steady state every frame of an operation but the coalescable ACK crosses the
            # wire inside the window (the fill and drain of the depth left out, see
            # Bench.series): no faster than the busier direction without its ACK
            plan = bench.op_plan(s["op"], size, 1024)
            ack = bench.frame_wire(0, bench.AETH.SIZE)
            floor = max(sum(plan["to_target"]) - ack, sum(plan["to_peer"]) - ack)
            assert s["cycles_per_op"] >= floor, (s, floor)
            assert s["goodput_octets_per_cycle"] == pytest.approx(size / s["cycles_per_op"],
                                                                  rel=1e-3)
            # bytes moved on the wire == bytes asked (content checked inside the bench)
            assert s["bytes_moved"] == s["bytes_asked"] == size * s["n_ops"], s
            assert 0 <= s["wire_util_to_target"] <= 1 and 0 <= s["wire_util_to_peer"] <= 1
            # the peer is never the bottleneck
            assert s["min_outstanding"] >= 1, s
            assert s["peer_burst_gap_max"] == 0, s
        assert r["retransmits"] == [{"mtu": 1024, "target": 0, "peer": 0, "rx_overflows": 0,
                                     "tx_underruns": 0, "rnr_backlog": 0}]
    assert seen == {"LOAD", "STORE_READ", "STORE_INLINE", "ALLOC_STORE_INLINE",
                    "ALLOC_STORE_READ"}


def test_quick_latency(quick):
    lat = quick["latency"]["latency"]
    assert set(lat) == {"LOAD", "STORE_INLINE", "STORE_READ", "ALLOC_STORE_INLINE"}
    for op, d in lat.items():
        assert len(d["alone"]) == 4 and len(d["contention"]) == 16
        for x in d["alone"] + d["contention"]:
            assert x["from_last"] > 0
        for x in d["alone"]:
            assert x["engine_notify_to_wr"] > 0
            # first -> last octet of the request frame on rxd: preamble + frame + FCS - 1
            plen = REQUEST + (64 if op in ("STORE_INLINE", "ALLOC_STORE_INLINE") else 0)
            assert x["from_first"] - x["from_last"] == frame_wire(plen) - IFG - 1
            # the engine's part (core cycles, DIV GMII cycles each) is inside the whole
            assert DIV * x["engine_notify_to_wr"] < x["from_last"]
    assert quick["latency"]["arp_turnaround"] > 0
    assert quick["latency"]["retransmits"] == {"target": 0, "peer": 0}
    # nanoseconds at the board's clocks: GMII cycles of 8 ns, core cycles of 8 * DIV ns
    summ = bench._latency_summary(lat, bench.clocks_of("ecpix5"))
    for op, d in summ.items():
        assert d["ns"]["alone_from_last_median"] == d["alone_from_last"]["median"] * 8
        assert d["ns"]["engine_notify_to_wr_median"] == pytest.approx(
            d["engine_notify_to_wr"]["median"] * 8 * DIV, abs=0.1)


def test_table_names_each_configuration():
    assert bench.CONFIGS[0] == "ecpix5"
    assert [bench.label(c) for c in bench.CONFIGS] == ["ecpix5", "unit-w8", "unit-w64"]
    assert bench.clocks_of("ecpix5")["core_hz"] == pytest.approx(125e6 / DIV)


def test_quick_multi_qp(quick):
    """Every one of the 4 QPs completed each of its operations (its data checked inside the
    bench), the aggregate is physically possible and the fairness figures add up."""
    m = quick["multi"]
    assert not m["failed"], m["failed"]
    assert [r["op"] for r in m["multi"]] == ["LOAD", "STORE_INLINE"]
    assert m["skipped"] == []
    for r in m["multi"]:
        n = r["n_ops_per_qp"]
        assert r["n_qp"] == bench.MULTI_QPS == len(r["per_qp"]) and n >= 2
        assert r["size"] == 4096 and r["mtu"] == 1024
        assert [x["qp"] for x in r["per_qp"]] == [0, 1, 2, 3]
        for x in r["per_qp"]:
            assert x["completed"] == n, x
            assert x["bytes_moved"] == x["bytes_asked"] == 4096 * n, x
            assert x["ops_per_cycle"] > 0 and x["min_outstanding"] >= 1, x
            assert 0 < x["latency_mean"] <= x["latency_p99"] <= x["latency_max"], x
        assert r["bytes_moved"] == r["bytes_asked"] == 4 * 4096 * n
        assert r["common_window"] and r["window_cycles"] > 0
        # the QPs share one wire: the aggregate cannot beat it. The op bound counts one ACK
        # each way per operation; a target that coalesces its ACKs over several requests may
        # beat it by at most that ACK frame.
        plan = bench.op_plan(r["op"], 4096, 1024)
        ack = plan["to_peer"][0]
        assert 0 < r["frac_theory"] <= 1.0, r
        assert 0 < r["frac_op_bound"] <= plan["bound"] / (plan["bound"] - ack), r
        assert r["cycles_per_op"] >= 4096 + 82 * 4, r
        rates = [x["ops_per_cycle"] for x in r["per_qp"]]
        # the aggregate is the sum of the per-QP rates (whole groups of DEPTH completions); the
        # distance between successive COMPLETIONs of any QP in the window agrees with it, but
        # in the quick run a QP has only a few groups inside the window (STORE_INLINE of 4 KiB
        # on the DDR3 core: 5.2 % apart; LOAD, wire-bound: 2.9 %), so within 10 %
        assert 1 / sum(rates) == pytest.approx(r["cycles_per_op"], rel=1e-3)
        assert r["cycles_per_op_merged"] == pytest.approx(r["cycles_per_op"], rel=0.10)
        mean = sum(rates) / 4
        assert r["fairness_max_dev"] == pytest.approx(
            max(abs(x / mean - 1) for x in rates), abs=1e-3)
        assert sum(x["ratio_to_mean"] for x in r["per_qp"]) == pytest.approx(4, abs=1e-3)
        assert r["peer_burst_gap_max"] == 0 and r["retransmits_peer"] == 0
    assert m["retransmits"] == [{"mtu": 1024, "n_qp": 4, "target": 0, "peer": 0,
                                 "rx_overflows": 0, "tx_underruns": 0,
                                 "rnr_backlog": 0}]


def test_overload_is_not_lost():
    """4 QPs, each with 8 inline STOREs of 4 KiB outstanding: the wire brings them faster than
    the shipped core finishes them (a receive-buffer write, a read and a block write per octet
    on its 25 MHz memory bus), so they queue in the receive buffers the credits allow. Nothing
    is lost and nothing is sent twice: the responder's and the requester's placement go first
    on the memory bus (MemArbiter ``urgent``), so the MAC's receive buffer never fills
    (rx_overflows 0, and the responder never had to refuse a message, cnt_rnr_backlog 0), and
    the peer retransmits nothing. Every operation completes with its data (checked inside the
    bench). Without the urgent masters this run refused 15 messages with RNR NAKs while the
    MAC buffer was half full and the peer resent 400 packets; without that refusal as well it
    lost 8 frames to the full buffer."""
    m = bench.run_multi("ecpix5", 4096, quick=True, mtus=(1024,), ops=("STORE_INLINE",),
                        depth=8, log=lambda s: None)
    assert not m["failed"], m["failed"]
    (r,) = m["multi"]
    assert r["depth"] == 8
    for x in r["per_qp"]:
        assert x["completed"] == r["n_ops_per_qp"], x
    assert m["retransmits"] == [{"mtu": 1024, "n_qp": 4, "target": 0, "peer": 0,
                                 "rx_overflows": 0, "tx_underruns": 0,
                                 "rnr_backlog": 0}]


class _SizingOnly:
    """What :class:`tools.bench.Bench` reads of a VlTarget before bring-up (no simulation)."""

    def __init__(self, params):
        self.params = params

    def port_access(self, step):
        return None


@pytest.mark.parametrize("config", bench.CONFIGS)
def test_request_credits_are_the_receive_buffers(config):
    """Issue 20 item 5: every Bench configuration advertises as many request credits as its
    driver posts receive buffers per QP, the most up to MAX_CREDITS that fit its memory beside
    the pool and Max Inline sized for SIZING_CREDITS buffers (the figures measured before):
    all 16 on the unit-test target's 4 MiB, 4 to 16 on the ECPIX-5's 128 KiB."""
    from host.driver import memory_plan
    from model.target import TargetConfig
    from sim.vltarget import HW_DEFAULT, board_params
    p = board_params("ecpix5") if config == "ecpix5" else dict(HW_DEFAULT, width=int(config))
    mem = p["mem_words"] * 8
    runs = [(size, 1, max(bench._n_ops(size, quick) + 2, 8))
            for size in bench.SIZES for quick in (False, True)]
    runs += [(size, bench.MULTI_QPS, bench.MULTI_QPS * (bench._n_ops_multi(size, quick) + 1) + 2)
             for size in bench.MULTI_SIZES for quick in (False, True)]
    runs += [(64, 4, 32), (1024, 1, 8)]                                     # run_latency
    seen = set()
    for size, n_qp, max_blocks in runs:
        try:
            b = bench.Bench(_SizingOnly(p), size, mtus=(1024,), n_init=n_qp,
                            max_blocks=max_blocks)
        except MemoryError:
            continue
        credits = b.cfg.request_credits
        seen.add(credits)
        assert b.driver.plan["recv_count"] == credits
        assert bench.SIZING_CREDITS <= credits <= bench.MAX_CREDITS
        assert b.driver.plan["end"] <= mem
        if credits < bench.MAX_CREDITS:         # one more buffer per QP would not fit
            more = TargetConfig(**{**b.cfg.__dict__, "request_credits": credits + 1})
            assert memory_plan(more, n_qp)["end"] > mem
        # Max Inline and the pool were sized for SIZING_CREDITS buffers, which fit too
        fewer = TargetConfig(**{**b.cfg.__dict__, "request_credits": bench.SIZING_CREDITS})
        assert memory_plan(fewer, n_qp)["end"] <= mem
    if config == "ecpix5":
        assert min(seen) == bench.SIZING_CREDITS and max(seen) <= bench.MAX_CREDITS
    else:
        assert seen == {bench.MAX_CREDITS}


@pytest.fixture(scope="module")
def quick10g():
    """The quick series of the 10 Gb/s configuration (issue 21 item 4: XGMII at 156.25 MHz,
    width 64; its counts are octet times of the 10 Gb/s line) at 64 and 4096 octets, both MTUs."""
    return {size: bench.run_size(bench.XGMII_CONFIG, size, quick=True, mtus=(1024, 4096),
                                 log=lambda s: None) for size in (64, 4096)}


def test_quick_10g_is_possible(quick10g):
    """The same physical floors as at 1 Gb/s, in octet times of the 10 Gb/s line: nothing is
    faster than its frames on the wire, every octet asked is moved (and checked inside the
    bench), no retransmission, the peer never the bottleneck (its frames wait at most for the
    next XGMII start lane: the deficit idle count lengthens a gap by up to 3 octets)."""
    assert bench.label(bench.XGMII_CONFIG) == "unit-10g"
    assert bench.clocks_of(bench.XGMII_CONFIG) == {"gmii_hz": 1.25e9, "core_hz": 156.25e6,
                                                   "width": 64}
    seen = set()
    for size in (64, 4096):
        r = quick10g[size]
        assert not r["failed"], r["failed"]
        for s in r["series"]:
            seen.add((s["op"], s["mtu"]))
            plan = bench.op_plan(s["op"], size, s["mtu"])
            ack = bench.frame_wire(0, bench.AETH.SIZE)
            floor = max(sum(plan["to_target"]) - ack, sum(plan["to_peer"]) - ack)
            assert 0 < s["frac_theory"] <= 1.0 and s["cycles_per_op"] >= floor, (s, floor)
            assert s["bytes_moved"] == s["bytes_asked"] == size * s["n_ops"], s
            assert s["min_outstanding"] >= 1 and s["peer_burst_gap_max"] <= 3, s
            # Mb/s at 1.25 G octet times per second
            assert s["goodput_mbps"] == pytest.approx(size / s["cycles_per_op"] * 1e4, rel=2e-3)
        assert [x["rx_overflows"] + x["target"] + x["peer"] for x in r["retransmits"]] == [0, 0]
    assert {op for op, _ in seen} == {"LOAD", "STORE_READ", "STORE_INLINE",
                                      "ALLOC_STORE_INLINE", "ALLOC_STORE_READ"}
    assert {m for _, m in seen} == {1024, 4096}


@pytest.fixture(scope="module")
def sessions8():
    """The sessions section at the smallest configuration (the unit-test target, width 8)."""
    return bench.run_sessions("8", log=lambda s: None)["sessions"]


def test_sessions_run_in_the_engine(sessions8, tmp_path):
    """Issue 20, "Must show": the same operations from a plain, an ADDR_LE and a DIRECT_ALLOC
    session run in the engine: its ALLOC_STORE / STORE / LOAD OK counts move by the operations
    sent, the driver handles none of them (host_actions after HELLO), the ALLOC_STOREs of the
    DIRECT_ALLOC session take their blocks from its partition, and every answer, the LOAD
    data, the KBTP structures and the stored blocks are the golden model's. The table, the
    CSV and the JSON carry the three rows."""
    n = bench.SESSION_OPS
    assert [r["kind"] for r in sessions8] == ["plain", "ADDR_LE", "DIRECT_ALLOC"]
    for r in sessions8:
        assert r["sent"] == {"ALLOC_STORE": 2 * n, "STORE": n, "LOAD": n}, r
        assert r["engine_ok"] == r["sent"], r
        assert r["engine_other"] == {} and r["host_actions"] == 0, r
        assert r["host_handled"] == [] and r["slow_path"] == {}, r
        assert r["engine_parts"] and r["fast_path"], r
        assert r["model"] == "same", r
        assert [g["op"] for g in r["groups"]] == list(bench.SESSION_MIX)
        assert r["cycles"] == sum(g["cycles"] for g in r["groups"]) > 0
        for g in r["groups"]:
            assert g["bytes_moved"] == n * bench.SESSION_SIZE, g
    plain, le, da = sessions8
    assert plain["granted_features"] == "-" and not plain["addr_le_structures"]
    assert le["granted_features"] == "ADDR_LE" and le["addr_le_session"]
    assert le["addr_le_structures"]
    assert "DIRECT_ALLOC" in da["granted_features"] and da["direct_partitions"] == 1
    assert da["blocks_from"] == "partition 0"
    assert da["free_blocks_delta"] == {"shared": 0, "partition0": -2 * n}
    assert plain["blocks_from"] == le["blocks_from"] == "shared ring"
    res = {"widths": {"8": {"sessions": sessions8}}, "resources": "not built"}
    text = bench.format_table(res)
    assert bench.SESSION_HEADER in text
    for r in sessions8:
        assert bench._session_row(r) in text
    bench.write_results(res, tmp_path)
    import csv
    with open(tmp_path / "bench_sessions.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [x["kind"] for x in rows] == ["plain", "ADDR_LE", "DIRECT_ALLOC"]
    for x in rows:
        assert x["engine_ok_alloc_store"] == x["sent_alloc_store"] == str(2 * n)
        assert x["host_actions"] == "0"


def test_sessions_fail_when_the_host_runs_them():
    """A row cannot claim what did not happen: a driver that keeps the DIRECT_ALLOC session's
    ALLOC_STOREs (as before the engine served the partitions: QP_SESSION bit 3) makes the
    section raise, naming the messages the host handled."""
    spec = bench.SESSION_KINDS["DIRECT_ALLOC"]
    n = 2
    with bench._vt("8", lambda s: None) as vt:
        b = bench.Bench(vt, 64, mtus=(1024,), n_init=1, max_blocks=4 * n + 4,
                        cfg_overrides=dict(spec["cfg"], direct_quota=2 * n + 2))
        b.driver.engine_parts = False
        with pytest.raises(bench.SessionsError, match="ALLOC_STORE"):
            bench.session_mix(b, "DIRECT_ALLOC", spec["features"], n=n, size=64, width="8")
        assert b.driver.host_actions > 1          # HELLO and the ALLOC_STOREs


def test_resources_are_the_timing_record(tmp_path):
    """The resources line reports the committed timing record of the board (the netlist the
    suite checks), not whatever build a checkout has lying in build/: a stale build report
    there (another netlist, say) is ignored for that board, and used for a board without a
    record."""
    import json
    from pathlib import Path
    rec = json.loads((Path(bench.__file__).resolve().parent.parent / "boards" /
                      "timing_records" / "ecpix5.json").read_text())
    stale = dict(rec["report"], clocks=[{"domain": "sync", "achieved_mhz": 1.0,
                                         "constraint_mhz": 125.0, "met": False}])
    for board in ("ecpix5", "versa"):
        (tmp_path / board).mkdir()
        (tmp_path / board / "report.json").write_text(json.dumps(stale))
    r = bench.resources(root=tmp_path)
    assert r["ecpix5"]["source"].startswith("boards/timing_records/ecpix5.json")
    assert r["ecpix5"]["clocks"] == bench._resource_entry(rec["report"])["clocks"]
    assert r["ecpix5"]["fmax_mhz"] != 1.0 and r["ecpix5"]["timing_met"]
    assert r["versa"]["fmax_mhz"] == 1.0 and r["versa"]["source"].endswith("report.json")


def test_loads_sent_while_stores_arrive_do_not_run_dry():
    """LOADs of 4 KiB at path MTU 4096 (WRITE frames of 4,170 octets from the DDR3) on one QP
    while another QP's inline STOREs of 4 KiB arrive at the line's rate, on the shipped core.
    The responder's placement of the arriving STOREs goes first on the memory bus (MemArbiter
    ``urgent``), and through the LiteDRAM bridge a word costs a command of its own: the DDR3
    cannot feed both directions at the line's rate, and a WRITE started on the wire before it
    was all in the MAC's transmit buffer would run dry (boards/cores.py BOARD_TX_START). No
    frame of the target's may underrun (an underrun is a frame lost: the peer's FCS check
    drops it and the bench's own check of the target's frames fails), none is resent, and
    every LOAD brings its block and every STORE leaves its data (checked in the series)."""
    n, size = 12, 4096
    with bench._vt("ecpix5", lambda s: None) as vt:
        b = bench.Bench(vt, size, mtus=(4096,), n_init=2, max_blocks=8)
        b.bring_up()
        for q in (0, 1):
            bench._bind_one(b, q, b.sess[q].handle_base, size)
        r = b.series_multi({0: "LOAD", 1: "STORE_INLINE"}, size, n,
                           {q: [b.sess[q].handle_base] for q in (0, 1)}, depth=4)
        mac = {k: bench._top_counter(b, "mac", k) for k in ("tx_underruns", "tx_frames")}
        assert mac["tx_underruns"] == 0, mac
        assert r["retransmits_peer"] == 0 and bench._req_counter(b, "cnt_retransmits") == 0, r
        assert [x["completed"] for x in r["per_qp"]] == [n, n], r["per_qp"]
        # Both directions were busy at once: the LOADs' WRITEs went out while STOREs came in.
        assert r["wire_util_to_target"] > 0.3 and r["wire_util_to_peer"] > 0.3, r

# Ref: issue 24 (kbtp top); host/top.py; host/cli.py (``kbtp top``); sim/serve_stats.py.
"""``kbtp top --stats-file F --once``: one frame of the live view, from a stats file.

The stats file is written here with :func:`sim.serve_stats.write_stats` (as ``kbtp-sim serve``
does: the driver's ``(op, status)`` keys become ``op/status``) from figures chosen by the test;
the oracle is those figures: every count must appear on its line, the per-operation board-time
medians must be the medians of the records (computed here with sorted()), the QP line must show
the peer's dotted address, and an unused partition ring (0xFFFFFFFF) reads -1.
"""

import re

from host.cli import main
from sim.serve_stats import write_stats


def _stats():
    recs = []
    for k, (op, ns) in enumerate([("LOAD", 27_000), ("LOAD", 45_000), ("LOAD", 65_000),
                                  ("FREE", 18_000), ("STORE", None)]):
        recs.append({"opcode": op, "request_id": k + 1, "rx_last_cycle": 1000 * k,
                     "completion_cycle": None if ns is None else 1000 * k + ns // 8,
                     "ns_completion": ns, "cycles_completion": None if ns is None else ns // 8})
    return {"cycle": 125_000, "clocks": {"ns_per_gmii_cycle": 8.0},
            "final": False, "requests_seen": 77, "records": recs,
            "counters": {"mac.rx_frames_ok": 4855, "mac.tx_frames": 4848, "icrc.cnt_bad": 3,
                         "resp.cnt_seq_naks": 5, "resp.cnt_duplicates": 55,
                         "req.cnt_retransmits": 9, "req.cnt_timeouts": 2},
            "driver": {"engine": {("LOAD", "OK"): 40, ("LOAD", "TOO_LARGE"): 2},
                       "slow_path": {("HELLO", "OK"): 1, ("LOAD", "OK"): 4},
                       "hostq_count": 12, "ring_occupancy": 7,
                       "free_blocks": {"shared": 12, "partition0": 0xFFFFFFFF},
                       "quota": {42: {"qp": 0, "usage": 3, "quota": 4, "state": "active"}}},
            "frames": {"rx": 4855, "tx": 4848, "dropped": 1},
            "qps": {"0": {"qpn": 0x11, "peer_qpn": 0x2a, "peer_ip": 0x0A000001,
                          "state": "ESTABLISHED"}}}


def test_top_once_from_stats_file(tmp_path, capsys):
    path = tmp_path / "stats.json"
    write_stats(path, _stats())
    assert main(["top", "--stats-file", str(path), "--once"]) == 0
    out = capsys.readouterr().out
    assert "\x1b[" not in out                      # --once: no screen control
    lines = out.splitlines()
    head = next(ln for ln in lines if ln.startswith("operations"))
    cols = head.split()[1:]
    assert cols[0] == "OK" and "TOO_LARGE" in cols
    load = next(ln for ln in lines if ln.split()[:1] == ["LOAD"]).split()[1:]
    assert int(load[cols.index("OK")]) == 44 and int(load[cols.index("TOO_LARGE")]) == 2
    hello = next(ln for ln in lines if ln.split()[:1] == ["HELLO"]).split()[1:]
    assert int(hello[cols.index("OK")]) == 1
    assert re.search(r"frames\s+in 4855\s+out 4848", out)
    assert "ICRC bad 3" in out and "seq NAKs sent 5" in out and "duplicates 55" in out
    assert re.search(r"retransmit\s+9 \(timeouts 2\)", out)
    assert "host queue 12" in out and "engine ring 7" in out and "partition0 -1" in out
    qp = next(ln for ln in lines if ln.startswith("0 "))
    assert qp.split()[:5] == ["0", "0x000011", "0x00002a", "10.0.0.1", "ESTABLISHED"]
    assert qp.split()[-2:] == ["42", "3/4"]
    assert "77 seen, 4 of the last 5 completed" in out
    for op, vals in (("LOAD", [27.0, 45.0, 65.0]), ("FREE", [18.0])):
        ln = next(x for x in lines if x.strip().startswith(op + " ") and "median" in x)
        med = sorted(vals)[len(vals) // 2]
        assert f"median {med:9.2f} us" in ln and f"max {max(vals):9.2f} us" in ln
    assert "board time 1.000 ms" in out              # 125 000 cycles x 8 ns


def test_top_without_source_fails(capsys):
    assert main(["top", "--once"]) == 2
    assert "--stats-file" in capsys.readouterr().err


def test_top_waits_for_a_missing_file(tmp_path, capsys):
    assert main(["top", "--stats-file", str(tmp_path / "none.json"), "--once"]) == 0
    assert "no data yet" in capsys.readouterr().out

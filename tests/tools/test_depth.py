# Ref: tools/depth.py; yosys write_json netlist format (modules / cells / netnames, bit numbers).
"""tools.depth on small netlists written by hand in yosys's JSON form: the depth it reports is
the number of LUT levels drawn, a carry chain adds one level at its entry and a step per cell,
register outputs start paths, and endpoints of another clock are left out."""

import json

from tools import depth


def _ff(d, q, clk):
    return {"type": "TRELLIS_FF", "port_directions": {"CLK": "input", "DI": "input", "Q": "output"},
            "connections": {"CLK": [clk], "DI": [d], "Q": [q]}}


def _lut(a, z, b=None):
    conn = {"A": [a], "Z": [z]}
    if b is not None:
        conn["B"] = [b]
    return {"type": "LUT4", "port_directions": {"A": "input", "B": "input", "Z": "output"},
            "connections": conn}


def _netlist(cells, names):
    return {"modules": {"top": {"attributes": {"top": 1}, "cells": cells,
                                "netnames": {n: {"bits": [b], "hide_name": 0}
                                             for n, b in names.items()}}}}


def test_chain_of_luts_between_registers():
    # clk=2; src FF q=10 -> 3 LUTs (11, 12, 13) -> dst FF; a 1-LUT path 10 -> 20 -> other FF;
    # a 5-LUT path on another clock (3) that --clock leaves out.
    cells = {"src": _ff(99, 10, 2), "l1": _lut(10, 11), "l2": _lut(11, 12), "l3": _lut(12, 13),
             "dst": _ff(13, 14, 2), "s1": _lut(10, 20), "short": _ff(20, 21, 2),
             "o0": _ff(98, 30, 3)}
    for k in range(5):
        cells[f"o{k + 1}"] = _lut(30 + k, 31 + k)
    cells["odst"] = _ff(35, 36, 3)
    names = {"core_clk": 2, "eth_rx_clk": 3, "src_q": 10, "a": 11, "b": 12, "c": 13,
             "dst_q": 14, "s": 20}
    rows, path, _, clocks = depth.analyse(_netlist(cells, names), clock="core")
    assert clocks == {"core_clk": 3, "eth_rx_clk": 2}
    by_cell = {(r[1], r[2]): r[0] for r in rows}
    assert by_cell[("dst", "DI")] == 3.0
    assert by_cell[("short", "DI")] == 1.0
    assert ("odst", "DI") not in by_cell
    worst = rows[0]
    assert worst[1] == "dst" and path(worst[3]) == ["src", "a", "b", "c"]
    rows_rx, _, _, _ = depth.analyse(_netlist(cells, names), clock="eth_rx")
    assert rows_rx[0][0] == 5.0 and rows_rx[0][1] == "odst"


def test_carry_chain_counts_entry_and_steps(tmp_path, capsys):
    # src FF -> CCU2C c0 (A0 -> COUT) -> c1 (CIN -> COUT) -> c2 (CIN -> S1) -> LUT -> dst FF
    def ccu(a0, cin, cout, s1):
        conn = {"A0": [a0], "CIN": [cin], "COUT": [cout], "S1": [s1]}
        return {"type": "CCU2C", "port_directions": {}, "connections": conn}
    cells = {"src": _ff(99, 10, 2), "c0": ccu(10, "0", 11, 50), "c1": ccu(51, 11, 12, 52),
             "c2": ccu(53, 12, 13, 14), "l": _lut(14, 15), "dst": _ff(15, 16, 2)}
    nl = _netlist(cells, {"core_clk": 2})
    rows, _, _, _ = depth.analyse(nl, clock="core")
    d = {(r[1], r[2]): r[0] for r in rows}[("dst", "DI")]
    assert abs(d - (1.0 + 2 * depth._CARRY_STEP + 1.0)) < 1e-9
    f = tmp_path / "top.json"
    f.write_text(json.dumps(nl))
    assert depth.main([str(f), "--clock", "core", "--top", "3", "--path", "1"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == "2 register inputs on 'core'; deepest 2.2 levels"
    assert "2.2 levels to dst.DI:" in out

# Ref: host/cli.py (``kbtp driver``); host/driver.py; model/target.py (the oracle image and replies).
"""``kbtp driver init|serve|counters`` against the fake target behind a frame-level UART bridge."""

import json

import pytest

from host import cli, codec
from host.driver import memory_plan
from host.link import UartLink
from hw.iface import REG_KBTP
from hw.kbtp.engine import reg as ENG
from model.target import SendMsg, TargetConfig, TargetModel
from tests.host.test_driver import FakeTarget, hello
from tests.host.test_driver_uart import PyBridge

CFG = dict(block_size=256, num_blocks=8, num_handles=64, handles_per_initiator=32)


@pytest.fixture
def board(monkeypatch):
    cfg = TargetConfig(**CFG)
    fake = FakeTarget(cfg, memory_plan(cfg, 2)["end"])
    fake.mem[:] = b"\xA5" * len(fake.mem)             # a board's memory after power-up
    monkeypatch.setattr(cli, "_open_link", lambda port, baud: UartLink(PyBridge(fake)))
    return cfg, fake


def kbtp(*argv):
    return cli.main(["driver", "--port", "/dev/fake", "--config", json.dumps(CFG), *argv])


def test_help_lists_the_driver(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    assert "driver" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli.main(["driver", "--help"])
    out = capsys.readouterr().out
    assert "init" in out and "serve" in out and "counters" in out and "--port" in out


def test_init_counters_serve(board, capsys):
    cfg, fake = board
    assert kbtp("init") == 0
    n = cfg.layout()["size"]
    assert bytes(fake.mem[:n]) == bytes(TargetModel(cfg).mem[:n])
    assert fake.rd(REG_KBTP + ENG["CTRL"]) == 0b11
    assert "initialized" in capsys.readouterr().out
    assert kbtp("counters") == 0
    c = json.loads(capsys.readouterr().out)
    assert c["host_actions"] == 0 and c["free_blocks"]["shared"] == 8
    # serve: program QP 0, handle one HELLO (already waiting in the notify queue)
    model = TargetModel(cfg)
    model.connect(0)
    want = [a.payload for a in model.receive(0, hello(7)) if isinstance(a, SendMsg)]
    fake.regs.update({0x1000 + 0x34: memory_plan(cfg, 2)["recv"],
                      0x1000 + 0x38: memory_plan(cfg, 2)["recv_count"],
                      0x1000 + 0x3C: memory_plan(cfg, 2)["recv_log2"]})
    fake.deliver(0, hello(7))
    assert kbtp("serve", "--qp", "0:local_qpn=0x11,peer_ip=10.0.0.2", "--count", "1") == 0
    out = capsys.readouterr().out
    assert "qp0 HELLO -> OK: send" in out and "1 slow-path messages handled" in out
    assert [p for _, _, p, _, _, _ in fake.sent] == want
    assert codec.decode(want[0]).handle_count == 32
    assert fake.rd(0x1000 + 0x04) == 0x11 and fake.rd(0x1000) == 3      # QP 0 programmed, RTS


def test_errors_are_one_line(board, capsys):
    assert kbtp("--config", "[1]", "init") == 2
    assert "TargetConfig" in capsys.readouterr().err
    cfg, fake = board
    with pytest.raises(SystemExit) as exc:
        kbtp("--mem-size", "0x100", "init")
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "memory plan needs" in err


def test_link_bring_up_over_the_uart(board, capsys):
    """``kbtp driver link``: over the UART, point the target's UDP endpoint at this host (ID
    checked first, enable written last), then print its registers and counters."""
    from hw.target.udplink import REG_UDPLINK, UDPLINK_COUNTER_BASE, UDPLINK_ID, UDPLINK_REGS
    cfg, fake = board
    r = {name: REG_UDPLINK + off for name, off in UDPLINK_REGS.items()}
    fake.regs[r["id"]] = UDPLINK_ID
    fake.regs[REG_UDPLINK + UDPLINK_COUNTER_BASE + 4 * 2] = 5             # bad_src
    assert kbtp("link", "--host-mac", "02:00:00:00:00:09", "--host-ip", "10.0.0.9",
                "--host-port", "40000") == 0
    st = json.loads(capsys.readouterr().out)
    assert (fake.rd(r["host_mac_hi"]), fake.rd(r["host_mac_lo"])) == (0x0200, 0x00000009)
    assert (fake.rd(r["host_ip"]), fake.rd(r["host_port"]), fake.rd(r["ctrl"])) == \
        (0x0A000009, 40000, 1)
    assert st["host_mac"] == "02:00:00:00:00:09" and st["host_ip"] == "10.0.0.9"
    assert st["host_port"] == 40000 and st["ctrl"] == 1 and st["counters"]["bad_src"] == 5
    assert kbtp("link", "--disable") == 0 and fake.rd(r["ctrl"]) == 0
    capsys.readouterr()
    # errors name the offending value, one line, exit 2
    assert kbtp("link", "--host-mac", "03:00:00:00:00:09", "--host-ip", "10.0.0.9",
                "--host-port", "40000") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'03:00:00:00:00:09' is not a unicast" in err
    assert kbtp("link", "--host-ip", "10.0.0.9") == 2
    assert "all of --host-mac" in capsys.readouterr().err
    fake.regs[r["id"]] = 0
    assert kbtp("link", "--host-mac", "02:00:00:00:00:09", "--host-ip", "10.0.0.9",
                "--host-port", "40000") == 2
    assert "not the UDP host link's ID 0x4b480001" in capsys.readouterr().err

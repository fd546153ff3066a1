# Ref: issue 20 item 5 ("Request credits match receive buffers"); draft KBTP §Session
#      Establishment (HELLO_ACK Request Credits), §Target Execution Model, §Flow Control;
#      host/driver.py memory_plan and "Receive buffers"; host/policy.py hello_ack_fields;
#      hw/target/target.py KbtpTarget notify_depth; sim/system.py VlSystemBench; roce/rc.py
#      (the initiator's RNR NAK counter).
"""The Request Credits a target advertises are the receive buffers its host driver posts.

* The plan: ``recv_count`` is ``cfg.request_credits`` and nothing else; a plan whose buffers do
  not fit the memory or the RecvNotify FIFO is refused with the figures to lower.
* Every configuration that ships or is simulated fits, and its HELLO_ACK's Request Credits are
  the buffers programmed into the QP that answered (the fake target of tests/host/test_driver.py
  with the real memory sizes: the shipped ECPIX-5 core's 512 MB of DDR3, its block-RAM
  variant's 128 KiB, the unit-test target's 4 MiB).
* On the Verilated ECPIX-5 core (sim/vltarget.py SHIPPED) an initiator keeping its request
  credits' worth of STOREs by RDMA READ outstanding on one QP never meets an RNR NAK; with the
  driver posting fewer buffers than it advertises (monkeypatched) it does, so the check can fail.
"""

import pytest

from host import codec
from host.driver import KbtpDriver, NOTIFY_DEPTH_PER_QP, memory_plan
from host.port import TargetPort
from hw.iface import REG_QP
from hw.rdma.qp import QP_STRIDE
from model.target import TargetConfig
from tests.host.test_driver import FakeTarget, hello, run

# --------------------------------------------------------------------------------------------
# The plan
# --------------------------------------------------------------------------------------------


def test_recv_count_is_the_request_credits():
    for credits in (1, 4, 16):
        cfg = TargetConfig(request_credits=credits)
        assert memory_plan(cfg, 2)["recv_count"] == credits
        assert memory_plan(cfg, 2, recv_count=credits)["recv_count"] == credits
    with pytest.raises(ValueError, match=r"recv_count 4 .*request_credits 16"):
        memory_plan(TargetConfig(), 2, recv_count=4)
    with pytest.raises(ValueError, match=r"recv_count 4 .*request_credits 16"):
        KbtpDriver(TargetPort(None), TargetConfig(), recv_count=4)
    with pytest.raises(ValueError, match="request_credits 0"):
        memory_plan(TargetConfig(request_credits=0), 2)


def test_plan_names_the_figures_to_lower():
    cfg = TargetConfig(block_size=4096, num_blocks=16, max_inline=1024)    # 2048-octet buffers
    fits = memory_plan(TargetConfig(block_size=4096, num_blocks=16, request_credits=1), 4)
    most = (131072 - fits["recv"]) // (4 * 2048)
    assert 1 < most < 16
    assert memory_plan(TargetConfig(block_size=4096, num_blocks=16, request_credits=most), 4,
                       mem_size=131072)["end"] <= 131072
    with pytest.raises(ValueError, match="memory plan needs"):
        memory_plan(TargetConfig(block_size=4096, num_blocks=16, request_credits=most + 1), 4,
                    mem_size=131072)
    with pytest.raises(ValueError, match=rf"memory plan needs .*request_credits \(recv_count\) "
                                         rf"16 .*lower request_credits to {most}, or max_inline"):
        memory_plan(cfg, 4, mem_size=131072)
    # no room for even one buffer per QP: Max Inline or the pool must give
    with pytest.raises(ValueError, match="memory plan needs .*lower max_inline or the pool"):
        memory_plan(cfg, 4, mem_size=fits["recv"] + 2048)
    # the sum over the QPs is bounded by the RecvNotify FIFO (16 per QP by default)
    deep = TargetConfig(request_credits=NOTIFY_DEPTH_PER_QP + 1)
    with pytest.raises(ValueError, match=r"4 QPs x request_credits 17 = 68 .*FIFO of 64 .*"
                                         r"at most 16"):
        memory_plan(deep, 4)
    assert memory_plan(deep, 4, notify_depth=68)["recv_count"] == 17
    with pytest.raises(ValueError, match="FIFO of 32"):
        memory_plan(TargetConfig(), 4, notify_depth=32)


# --------------------------------------------------------------------------------------------
# HELLO_ACK against the buffers posted, per configuration
# --------------------------------------------------------------------------------------------

def _configs():
    """(name, cfg, n_qp, mem_size, n_mr, credits wanted) of every driver configuration that
    ships or is simulated (the bench's are checked in tests/tools/test_bench.py)."""
    from sim.frameserver import large_config, model_config as served, served_config
    from sim.system import model_config as system
    from sim.vltarget import HW_DEFAULT, SHIPPED, board_params
    ecp = board_params(SHIPPED["board"], SHIPPED["dram"])     # the shipped core: 512 MB of DDR3
    ecp = (ecp["n_qp"], ecp["mem_words"] * 8, ecp["n_mr"])
    bram = board_params(SHIPPED["board"])                     # its block-RAM variant: 128 KiB
    bram = (bram["n_qp"], bram["mem_words"] * 8, bram["n_mr"])
    unit = (HW_DEFAULT["n_qp"], HW_DEFAULT["mem_words"] * 8, HW_DEFAULT["n_mr"])
    direct = dict(direct_partitions=1, direct_quota=4, masked=False)
    return [
        ("default", TargetConfig(), 2, None, 16, 16),
        # kbtp-sim serve on the ECPIX-5 (the shipped board, DDR3): the 16 of issue 20 item 5
        ("served-ecpix5", served_config(ecp[0], ecp[1]), *ecp, 16),
        # ... on its block-RAM variant (--hw ecpix5-bram): 4 fit beside its pool
        ("served-ecpix5-bram", served_config(bram[0], bram[1]), *bram, 4),
        ("served-unit", served_config(unit[0], unit[1]), *unit, 16),
        ("served-model", served(), 4, None, 8, 16),                 # kbtp-sim serve --model
        ("system-ecpix5", system(), *ecp, 16),
        # tests/system/test_shipped.py test_shipped_one_initiator_per_qp: a handle range per QP
        ("system64-ecpix5", system(num_handles=16 * ecp[0], handles_per_initiator=16,
                                   num_blocks=2 * ecp[0] + 16), *ecp, 16),
        ("system-direct-ecpix5", system(**direct), *ecp, 16),       # tools/soak.py
        ("system-unit", system(), *unit, 16),
        ("fuzz-unit", large_config(), *unit, 6),                    # tools/fuzz.py
    ]


@pytest.mark.parametrize("name,cfg,n_qp,mem_size,n_mr,credits", _configs(),
                         ids=[c[0] for c in _configs()])
def test_hello_ack_credits_are_the_posted_buffers(name, cfg, n_qp, mem_size, n_mr, credits):
    assert cfg.request_credits == credits
    plan = memory_plan(cfg, n_qp, mem_size=mem_size)
    fake = FakeTarget(cfg, mem_size or plan["end"], n_qp)
    drv = KbtpDriver(TargetPort(fake), cfg, n_qp=n_qp, mem_size=mem_size, n_mr=n_mr)
    run(drv.init())
    spans = []
    # A HELLO takes a free handle range: a configuration with fewer ranges than QPs serves
    # that many sessions (the buffers of every QP are posted all the same).
    for q in range(min(n_qp, cfg.num_ranges)):
        run(drv.open_qp(q, local_qpn=0x11 + q, remote_qpn=0x20 + q,
                        peer_mac="02:00:00:00:00:02", peer_ip="10.0.0.2"))
        fake.deliver(q, hello(q + 1))
        res = run(drv.poll(0.0))
        assert res.op == "HELLO" and res.status == "OK", res
        ack = codec.decode(fake.sent[-1][2])
        base, count, log2 = fake.recv_buffers(q)
        assert fake.sent[-1][0] == q
        assert ack.request_credits == count == credits, (q, ack.request_credits, count)
        # each buffer holds the longest request, inside the memory, after the driver's areas
        assert 1 << log2 >= 24 + 32 + cfg.max_inline
        assert base >= plan["host_scratch"] and base + (count << log2) <= len(fake.mem)
        spans.append((base, base + (count << log2)))
    spans.sort()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    assert sum(fake.recv_buffers(q)[1] for q in range(n_qp)) <= NOTIFY_DEPTH_PER_QP * n_qp


# --------------------------------------------------------------------------------------------
# On the shipped core: no RNR NAK while the depth equals the credits
# --------------------------------------------------------------------------------------------

STAG = 0x5100
LENGTH = 2048           # the system bench's block size: each STORE READs one whole block


@pytest.fixture(scope="module")
def shipped():
    from sim.vltarget import SHIPPED, build
    build(SHIPPED)                  # once (cached); each test starts a fresh process from reset
    return SHIPPED


def _pipeline(params, *, posted=None, rounds=2):
    """Bring up one initiator on a fresh target (the system bench: driver, RC peer), bind one
    handle, then STOREs by RDMA READ of it with the HELLO_ACK's Request Credits outstanding at
    all times, ``rounds`` times the credits in all. ``posted``: the receive buffers the driver
    programs into the QP instead of its plan's (the credits stay as advertised). Returns the
    credits, the buffers the QP has, the most requests seen outstanding and the RNR NAKs
    (responder's counter, peer's count)."""
    from sim.system import VlSystemBench, run_sync
    from sim.vltarget import VlTarget
    with VlTarget(params) as vt:
        b = VlSystemBench(vt, n_init=1, seed=5)
        if posted is not None:
            b.driver.plan["recv_count"] = posted
        run_sync(b.bring_up(features=[0]))
        ack = b.acks[0]
        credits = ack.request_credits
        buffers = run_sync(b.port.rreg(REG_QP + 0x38))      # QP 0's recv_count
        b.pmem.register(STAG, bytes(k * 7 & 0xFF for k in range(LENGTH)), access="r")
        h = ack.handle_base
        ev = b.events[0]
        desc = codec.DataDesc(STAG, 0, LENGTH)
        b.qps[0].send(codec.encode(codec.AllocStore(request_id=1, handle=h, data=desc)))
        run_sync(b.run_until(lambda: ev, 400_000, "ALLOC_STORE"))
        assert codec.decode(ev[0][1]).status == 0
        ev.clear()
        total, sent, most = rounds * credits, 0, 0
        while len(ev) < total:
            while sent < total and sent - len(ev) < credits:
                sent += 1
                b.qps[0].send(codec.encode(codec.Store(request_id=100 + sent, handle=h,
                                                       data=desc)))
            most = max(most, sent - len(ev))
            done = len(ev)
            run_sync(b.run_until(lambda: len(ev) > done, 2_000_000, f"STORE {done + 1}"))
        got = [codec.decode(e[1]) for e in ev]
        assert [(c.request_id, c.status) for c in got] == \
            [(100 + k, 0) for k in range(1, total + 1)]
        rnr = run_sync(b.resp_counters())["cnt_rnr_naks"]
        return credits, buffers, most, rnr, b.ep.counters.rnr_naks_received


def test_credits_outstanding_meet_no_rnr(shipped):
    """16 credits (sim/system.py model_config), 16 buffers: 16 STOREs outstanding, 32 in all,
    not one RNR NAK."""
    credits, buffers, most, rnr, peer_rnr = _pipeline(shipped)
    assert credits == buffers == 16
    assert most == credits
    assert rnr == peer_rnr == 0


def test_fewer_buffers_than_credits_meet_rnr(shipped):
    """The same with only 4 buffers posted behind the 16 credits: the 5th request outstanding
    finds no buffer (the check above can fail)."""
    credits, buffers, most, rnr, peer_rnr = _pipeline(shipped, posted=4, rounds=1)
    assert (credits, buffers, most) == (16, 4, 16)
    assert rnr > 0 and peer_rnr > 0

# Ref: host/cm.py; roce-layouts.md §7 (CM: REQ/REP/RTU/DREQ/DREP/REJ, Starting PSN §7.8);
#      hw/rdma/rawq.py (queue word formats).
"""host/cm.py against the Python RC endpoint's CM (roce/cm.py, the active side), without
gateware: the raw frame queues are a word-level fake that follows the documented format (the
gateware side of that format is tested in tests/hw/rdma/test_rawq.py and tests/sim/test_serve_hw.py).

Oracle: the independent active-side CM of :class:`roce.rc.RoceEndpoint` must reach RTS with the
target's QPN and Starting PSN from the REP, and the QP programmed through the (fake) driver
must carry the REQ's QPN, PSN, MTU, retry counts and addresses; REJ reason 1 when no QP is free;
DREQ from either side completes with DREP.
"""

import asyncio

import pytest

from hw.iface import QpState, REG_QP, Space
from hw.rdma.rawq import Q_RAW_RX, Q_RAW_TX
from host.cm import CmServer
from roce.rc import QPState, RoceEndpoint
from roce.frames import parse_frame

T_MAC, T_IP = "02:4b:42:54:50:01", "10.0.0.2"


class FakeQueues:
    """Q_RAW_RX / Q_RAW_TX words as documented in hw/rdma/rawq.py, plus register writes."""

    def __init__(self):
        self.rx = []            # frames waiting for the host
        self.tx = []            # frames the host pushed
        self._rd = []
        self._wr = None
        self.regs = {}

    async def access(self, space, addr, we, wdata):
        if space == Space.REG:
            self.regs[addr] = wdata
            return 0, 0
        assert space == Space.QUEUE
        if addr == Q_RAW_RX and not we:
            if not self._rd:
                if not self.rx:
                    return 0, 1
                f = self.rx.pop(0)
                raw = f + bytes(-len(f) % 4)
                self._rd = [int.from_bytes(raw[k:k + 4], "little")
                            for k in range(0, len(raw), 4)]
                return len(f), 0
            return self._rd.pop(0), 0
        if addr == Q_RAW_TX and not we:
            return 4096, 0
        if addr == Q_RAW_TX and we:
            if self._wr is None:
                self._wr = [wdata, b""]
                return 0, 0
            self._wr[1] += wdata.to_bytes(4, "little")
            if len(self._wr[1]) >= self._wr[0]:
                self.tx.append(self._wr[1][:self._wr[0]])
                self._wr = None
            return 0, 0
        return 0, 1

    async def wreg(self, addr, value):
        await self.access(Space.REG, addr, 1, value)


class FakeDriver:
    def __init__(self, port, n_qp=2):
        self.port, self.n_qp = port, n_qp
        self.opened, self.closed = {}, []

    async def open_qp(self, qp, **cfg):
        self.opened[qp] = cfg

    async def disconnect(self, qp):
        self.closed.append(qp)


def connect(ep, *args, **kw):
    """``ep.connect`` as a KBTP initiator: 16 responder resources unless told (the target
    refuses fewer than the engine's READ depth)."""
    return ep.connect(*args, **{"responder_resources": 16, **kw})


def setup():
    q = FakeQueues()
    drv = FakeDriver(q)
    cm = CmServer(drv, q, mac=T_MAC, ip=T_IP, seed=4)
    ep = RoceEndpoint("02:00:0a:00:00:01", "10.0.0.1", seed=9)
    ep.arp_table[int.from_bytes(bytes([10, 0, 0, 2]), "big")] = bytes.fromhex("024b42545001")
    return q, drv, cm, ep


def exchange(q, cm, ep, rounds=6):
    """Move frames both ways for a few rounds (QP1 frames only go to the CM)."""
    now = [0]

    async def go():
        for _ in range(rounds):
            now[0] += 1000
            ep.tick(now[0])
            for f in ep.poll_tx():
                kind, pkt = parse_frame(f)
                if kind == "roce" and pkt.dest_qp == 1:
                    q.rx.append(f)
            await cm.poll(now[0])
            while q.tx:
                ep.receive_frame(q.tx.pop(0), now[0])
    asyncio.run(go())


def test_connect_programs_qp_from_req():
    q, drv, cm, ep = setup()
    qp = connect(ep, T_IP, 18515, pmtu=2048, retry_count=5, rnr_retry=6, local_ack_timeout=17,
                    qp_params=dict(epsn=0x123456))
    exchange(q, cm, ep)
    assert qp.state == QPState.RTS
    cfg = drv.opened[0]
    assert cfg["remote_qpn"] == qp.qpn and cfg["sq_psn"] == 0x123456
    assert cfg["pmtu"] == 4 and cfg["retry_cnt"] == 5 and cfg["rnr_retry"] == 6
    assert cfg["timeout"] == 17 and cfg["state"] == QpState.RTS
    assert cfg["peer_ip"] == 0x0A000001 and cfg["peer_mac"] == 0x02000A000001
    # §7.8: the initiator sends from the PSN the target expects, to the target's QPN.
    assert qp.sq_psn == cfg["rq_psn"] and qp.dest_qpn == cfg["local_qpn"]
    assert cm.conns[0].state == "ESTABLISHED"           # the RTU arrived
    assert cm.stats["in_REQ"] == 1 and cm.stats["out_REP"] == 1 and cm.stats["in_RTU"] == 1


def test_rej_when_no_qp_free_and_bad_service():
    q, drv, cm, ep = setup()
    rej = []
    qps = [connect(ep, T_IP, 18515, on_reject=lambda qp, r: rej.append((qp.qpn, r)))
           for _ in range(3)]
    bad = connect(ep, T_IP, 9999, on_reject=lambda qp, r: rej.append((qp.qpn, r)))
    exchange(q, cm, ep)
    assert [p.state for p in qps[:2]] == [QPState.RTS, QPState.RTS]
    assert (qps[2].qpn, 1) in rej and (bad.qpn, 8) in rej
    assert sorted(drv.opened) == [0, 1]
    assert drv.opened[0]["local_qpn"] != drv.opened[1]["local_qpn"]


def test_rej_when_responder_resources_below_read_depth():
    """An initiator offering fewer responder resources than the RDMA READs the engine keeps
    out (hw/kbtp/movers.py READ_DEPTH) is refused with REJ 27 (insufficient responder
    resources), and no QP is programmed; one offering exactly that many is connected. A CM
    that would promise fewer READs than the engine keeps out cannot be made."""
    from hw.kbtp.movers import READ_DEPTH
    q, drv, cm, ep = setup()
    rej = []
    few = connect(ep, T_IP, 18515, responder_resources=READ_DEPTH - 1,
                     on_reject=lambda qp, r: rej.append((qp.qpn, r)))
    exchange(q, cm, ep)
    assert rej == [(few.qpn, 27)] and drv.opened == {}
    assert few.state != QPState.RTS
    ok = connect(ep, T_IP, 18515, responder_resources=READ_DEPTH)
    exchange(q, cm, ep)
    assert ok.state == QPState.RTS and sorted(drv.opened) == [0]
    with pytest.raises(ValueError, match="initiator_depth 2"):
        CmServer(drv, q, mac=T_MAC, ip=T_IP, initiator_depth=2)


def test_disconnect_both_directions():
    q, drv, cm, ep = setup()
    events = []
    a = connect(ep, T_IP, 18515, on_disconnect=lambda qp: events.append(qp.qpn))
    b = connect(ep, T_IP, 18515, on_disconnect=lambda qp: events.append(qp.qpn))
    exchange(q, cm, ep)
    first = cm.conns[0].peer_qpn
    qa, qb = (a, b) if first == a.qpn else (b, a)
    ep.disconnect(qa)                                    # initiator DREQ -> target DREP
    exchange(q, cm, ep)
    assert qa.qpn in events and 0 in drv.closed
    assert q.regs[REG_QP + 0] == QpState.ERROR.value
    asyncio.run(cm.disconnect(1))                        # target DREQ -> initiator DREP
    exchange(q, cm, ep)
    assert qb.qpn in events and 1 in drv.closed and cm.conns[1].state == "TIMEWAIT"
    # after the time-wait both QPs are free again: a new connection gets QP 0 with a new QPN
    old = drv.opened[0]["local_qpn"]
    exchange(q, cm, ep, rounds=3000)
    c = connect(ep, T_IP, 18515)
    exchange(q, cm, ep)
    assert c.state == QPState.RTS and drv.opened[0]["local_qpn"] != old

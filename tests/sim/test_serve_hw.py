# Ref: issue 5; draft KBTP §Operations, §Session Establishment.
#      roce-layouts.md §7 (CM); sim/serve.py (CLI, FrameServer); sim/serve_hw.py; host/cm.py.
"""``kbtp-sim serve`` with the gateware backend against the Python RC endpoint, over UDP.

The served process (Verilated KbtpTarget + host driver + host/cm.py) runs as ``python -m
sim.serve serve``; the initiator is a :class:`roce.rc.RoceEndpoint` on its own
:class:`sim.serve.FrameServer` socket (the QEMU side of ``-netdev dgram``). It connects with
CM (REQ/REP/RTU through the raw frame queues), sends HELLO, ALLOC_STORE, LOAD, FREE and GOODBYE
as SENDs and exposes a registered buffer. Oracle: a golden model (:mod:`model.target`) fed the same
requests directly: every COMPLETION payload and the initiator's buffer after each request must
be equal. Also: a connection beyond the target's QPs is refused with REJ "no QP available", an
initiator DREQ is answered with DREP, a GOODBYE whose ACK was lost is ACKed again when
retransmitted, the target's DREQ after GOODBYE reaches the initiator after the grace,
and every frame in the pcap has a valid ICRC (scapy).

The first run builds the gateware (sim/vltarget.py, minutes); the test waits up to 40 minutes.
"""

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from host import codec
from host.driver import GOODBYE_GRACE_MS
from hw.headers import ROCE_UDP_PORT, BthOpcode, ReqFlags
from hw.net.ip import ETH_IP_UDP_LEN
import model.target as M
from sim.serve import FrameServer, model_config
from roce.rc import QPState, RoceEndpoint
from sim.serve_hw import HW, _mem_words

ROOT = Path(__file__).resolve().parents[2]
# The tests share one served target (module fixture) and the second needs the first's history:
# one xdist worker runs them all (make test: --dist loadgroup).
pytestmark = pytest.mark.xdist_group(name="serve_hw")
TARGET_IP, INIT_IP = "10.0.0.2", "10.0.0.1"
BUF_VA, BUF_RKEY, BUF_SIZE = 0x7F0000100000, 0x00ABCD01, 2 * 65536
ROCE_PORT = ROCE_UDP_PORT.to_bytes(2, "big")   # UDP destination port octets


def free_port():
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Initiator:
    def __init__(self, tmp, t_port, i_port):
        self.ep = RoceEndpoint("02:00:0a:00:00:01", INIT_IP, seed=5, min_frame=60)
        self.mem = bytearray(BUF_SIZE)
        self.ep.register(self.mem, BUF_VA, BUF_RKEY, read=True, write=True)
        self.srv = FrameServer(self.ep, None, listen=("127.0.0.1", i_port),
                               peer=("127.0.0.1", t_port))
        self.inbox = []
        self.events = []

    def run_until(self, cond, timeout, what):
        end = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < end, f"timed out waiting for {what}"
            self.srv.step(0.01)

    def request(self, qp, msg, timeout=120):
        """Send KBTP request ``msg`` on ``qp``; wait for its reply and the SEND's ACK; return
        the reply decoded."""
        n = len(self.inbox)
        qp.send(codec.encode(msg))
        self.run_until(lambda: len(self.inbox) > n and qp.outstanding == 0, timeout,
                       type(msg).__name__)
        return codec.decode(self.inbox[n])

    def connect(self, **kw):
        # 16 responder resources, as a KBTP initiator offers (host/cm.py refuses fewer than
        # the engine's READ depth)
        kw = {"local_ack_timeout": 22, "pmtu": 1024, "responder_resources": 16, **kw}
        return self.ep.connect(
            TARGET_IP, 18515,
            on_disconnect=lambda qp: self.events.append(("disconnect", qp.qpn)),
            on_reject=lambda qp, r: self.events.append(("reject", qp.qpn, r)),
            qp_params=dict(on_message=lambda qp, data, imm=None, invalidated_rkey=None:
                           self.inbox.append(bytes(data))), **kw)


@contextlib.contextmanager
def serving(tmp, *extra):
    """``kbtp-sim serve`` (gateware backend) in a child process, with ``extra`` options, and an
    :class:`Initiator` beside it; yields ``(proc, initiator)``; stops both at the end."""
    t_port, i_port = free_port(), free_port()
    ready, stop = tmp / "ready", tmp / "stop"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with open(tmp / "serve.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sim.serve", "serve", "--listen", f"127.0.0.1:{t_port}",
             "--peer", f"127.0.0.1:{i_port}", "--ready-file", str(ready), "--stop-file",
             str(stop), "--duration", "3000", *extra],
            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        end = time.monotonic() + 2400
        while not ready.exists():
            assert proc.poll() is None, (tmp / "serve.log").read_text()[-3000:]
            assert time.monotonic() < end, "gateware backend did not come up"
            time.sleep(1)
        ini = Initiator(tmp, t_port, i_port)
        try:
            yield proc, ini
        finally:
            if not stop.exists():
                stop.write_text("stop")
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
            ini.srv.stop()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve_hw")
    with serving(tmp, "--pcap", str(tmp / "run.pcap")) as (proc, ini):
        yield proc, ini, tmp


def test_memory_fits_model_config():
    """The served gateware has room for the --model configuration and the driver's areas."""
    assert HW["mem_words"] >= _mem_words()


def test_cm_and_kbtp_operations(served):
    proc, ini, tmp = served
    ref = M.TargetModel(model_config())
    ref.connect("ref")
    ref_mem = ref.initiator_memory("ref").register(BUF_RKEY, BUF_SIZE, base_to=BUF_VA)

    t0 = time.monotonic()
    qp = ini.connect()
    ini.run_until(lambda: qp.state == QPState.RTS, 300, "REP")
    t_connect = time.monotonic() - t0

    def request(msg):
        raw = codec.encode(msg)
        n = len(ini.inbox)
        qp.send(raw)
        ref_mem.data[:] = ini.mem
        want = [x.payload for x in ref.receive("ref", raw) if isinstance(x, M.SendMsg)]
        ini.run_until(lambda: len(ini.inbox) > n and qp.outstanding == 0, 600,
                      type(msg).__name__)
        got = ini.inbox[n:]
        assert got == want, (codec.decode(got[0]), [codec.decode(w) for w in want])
        assert bytes(ini.mem) == bytes(ref_mem.data), "initiator buffer differs from oracle"
        return codec.decode(got[0])

    def desc(off, n):
        return codec.DataDesc(BUF_RKEY, BUF_VA + off, n)

    ack = request(codec.Hello(requested_features=0, completion_credits=8, initiator_id=3))
    assert ack.status == 0 and ack.block_size == model_config().block_size
    h = ack.handle_base
    for i, n in enumerate((64, 1000, 3000)):
        data = bytes((i * 37 + k * 11) & 0xFF for k in range(n))
        ini.mem[0:n] = data
        c = request(codec.AllocStore(request_id=10 + i, handle=h + i, data=desc(0, n),
                                     flags=ReqFlags.SEAL.value))
        assert (c.status, c.data_length) == (0, n)
        c = request(codec.Load(request_id=20 + i, handle=h + i, data=desc(65536, n)))
        assert c.status == 0 and bytes(ini.mem[65536:65536 + n]) == data
    c = request(codec.Load(request_id=30, handle=h + 2, data=desc(0, 100)))
    assert c.status == 8                                 # TOO_LARGE
    assert request(codec.Free(request_id=31, handle=h + 1)).status == 0
    c = request(codec.Load(request_id=32, handle=h + 1, data=desc(0, 64)))
    assert c.status != 0                                 # freed handle
    # Connections are accepted while the target has QPs (HW["n_qp"]), the next is refused.
    more = []
    for _ in range(HW["n_qp"] - 1):
        more.append(ini.connect())
        ini.run_until(lambda: more[-1].state == QPState.RTS, 300, f"REP {len(more) + 1}")
    extra = ini.connect()
    ini.run_until(lambda: any(e[0] == "reject" for e in ini.events), 300, "REJ")
    assert ("reject", extra.qpn, 1) in ini.events        # IB CM REJ: no QP available
    for q in more:
        ini.ep.disconnect(q)                             # initiator DREQ -> DREP
        ini.run_until(lambda: ("disconnect", q.qpn) in ini.events, 300, "DREP")
    # GOODBYE: no reply (the model sends none either); the target tears the connection down
    # (its DREQ, our DREP), but only after GOODBYE_GRACE_MS. The ACK of the GOODBYE SEND is lost
    # here: the target must still be in RTS to ACK the retransmission (else our SEND never
    # completes, as rxe's did in issue 5's first 2 %-loss runs).
    raw = codec.encode(codec.Goodbye(request_id=40))
    n = len(ini.inbox)
    lost, deliver = [], ini.ep.receive_frame

    def lose_first_ack(frame, now_us):
        # Ethernet + IPv4 + UDP to the RoCE port, BTH opcode RC ACKNOWLEDGE to this QP.
        bth = frame[ETH_IP_UDP_LEN:]
        if (not lost and frame[ETH_IP_UDP_LEN - 6:ETH_IP_UDP_LEN - 4] == ROCE_PORT
                and bth[0] == BthOpcode.ACKNOWLEDGE.value
                and int.from_bytes(bth[5:8], "big") == qp.qpn):
            lost.append(frame)
            return
        deliver(frame, now_us)

    ini.ep.receive_frame = lose_first_ack
    qp.timeout = 16                                      # 268 ms, well inside the grace
    retrans = ini.ep.counters.retransmissions
    t_bye = time.monotonic()
    qp.send(raw)
    acts = ref.receive("ref", raw)
    assert not [x for x in acts if isinstance(x, M.SendMsg)]
    assert [type(x).__name__ for x in acts if isinstance(x, M.Disconnect)] == ["Disconnect"]
    ini.run_until(lambda: qp.outstanding == 0, 120, "ACK of the retransmitted GOODBYE")
    assert lost and ini.ep.counters.retransmissions > retrans
    assert ("disconnect", qp.qpn) not in ini.events
    ini.run_until(lambda: ("disconnect", qp.qpn) in ini.events, 300, "target DREQ")
    ini.ep.receive_frame = deliver
    # The target's DREQ came after the grace (measured on this side's clock, which is later).
    assert time.monotonic() - t_bye >= GOODBYE_GRACE_MS / 1e3
    assert len(ini.inbox) == n
    print(f"\nserve (gateware): CM connect {t_connect:.1f} s, whole run "
          f"{time.monotonic() - t0:.1f} s, initiator counters {ini.ep.counters}")
    # Every RoCE frame the target sent has a valid ICRC (scapy recomputes it).
    from scapy.utils import rdpcap
    from sim.scapy_roce import icrc_of
    sent = [bytes(p) for p in rdpcap(str(tmp / "run.pcap"))
            if bytes(p)[6:12] == bytes.fromhex("024b42545001") and bytes(p)[12:14] == b"\x08\x00"]
    assert len(sent) > 20
    for f in sent:
        assert icrc_of(f) == f[-4:]
    # Part two needs this target's history (xdist may give another test a fresh fixture).
    _reconnect_reuses_qp(served)


def _reconnect_reuses_qp(served):
    """After GOODBYE and the time-wait, a new connection gets a QP index used before; a
    DIRECT_ALLOC session's ALLOC_STORE (slow path) and LOAD work on it. (The target now holds the
    first test's retained session, so the oracle here is the data itself.)"""
    proc, ini, tmp = served
    time.sleep(20)                                       # the first test's time-waits (16 s)
    qp = ini.connect()
    ini.run_until(lambda: qp.state == QPState.RTS, 300, "REP")

    def request(msg):
        return ini.request(qp, msg)

    # DIRECT_ALLOC: this session's ALLOC_STORE runs on the host (slow path: the driver's own
    # RDMA READ, which needs frames to keep moving while the driver waits for its completion).
    ack = request(codec.Hello(requested_features=0x7, completion_credits=8, initiator_id=4))
    assert ack.status == 0 and ack.features & 0x2
    ini.mem[0:200] = bytes(range(200))
    c = request(codec.AllocStore(request_id=1, handle=ack.handle_base,
                                 data=codec.DataDesc(BUF_RKEY, BUF_VA, 200),
                                 flags=ReqFlags.SEAL.value))
    assert (c.status, c.data_length) == (0, 200)
    c = request(codec.Load(request_id=2, handle=ack.handle_base,
                           data=codec.DataDesc(BUF_RKEY, BUF_VA + 65536, 200)))
    assert c.status == 0 and bytes(ini.mem[65536:65736]) == bytes(range(200))
    log = (tmp / "serve.log").read_text()
    assert any(log.count(f"-> qp {i} ") >= 2 for i in range(HW["n_qp"])), log[-2000:]


def test_retry_exhaustion_frees_the_qp(tmp_path):
    """Issue 22 item 3: a QP freed by retry exhaustion is reused. The initiator connects (retry
    count 2; the target's ACK timeout is the served cap, 1 ms at the board's timer rate), then
    drops every RDMA WRITE the target sends it: the data WRITE of its LOAD is never ACKed, the
    target's requester retries it and moves the QP to error. The host sees the QP's bit in
    ``qp_error`` and disconnects it (the target's DREQ reaches the initiator); after the
    time-wait a new connection is placed on that same QP (index 0, the lowest; without the
    disconnect it would get QP 1) and stores and loads on it. Oracle: the target's log (CM
    placements), the initiator's own CM events and buffer."""
    with serving(tmp_path) as (proc, ini):
        # ACK timeout code 10 (4 ms): the time-wait after the DREP is that long.
        qp = ini.connect(retry_count=2, local_ack_timeout=10)
        ini.run_until(lambda: qp.state == QPState.RTS, 300, "REP")

        request = ini.request

        ack = request(qp, codec.Hello(requested_features=0, completion_credits=8,
                                      initiator_id=9))
        assert ack.status == 0
        h = ack.handle_base
        ini.mem[0:64] = bytes(range(64))
        c = request(qp, codec.AllocStore(request_id=1, handle=h, data=codec.DataDesc(
            BUF_RKEY, BUF_VA, 64), flags=ReqFlags.SEAL.value))
        assert c.status == 0
        deliver, dropped = ini.ep.receive_frame, []
        writes = {BthOpcode.WRITE_FIRST.value, BthOpcode.WRITE_MIDDLE.value,
                  BthOpcode.WRITE_LAST.value, BthOpcode.WRITE_ONLY.value}

        def drop_writes(frame, now_us):
            bth = frame[ETH_IP_UDP_LEN:]
            if (frame[ETH_IP_UDP_LEN - 6:ETH_IP_UDP_LEN - 4] == ROCE_PORT and bth[0] in writes
                    and int.from_bytes(bth[5:8], "big") == qp.qpn):
                dropped.append(frame)
                return
            deliver(frame, now_us)

        ini.ep.receive_frame = drop_writes
        n = len(ini.inbox)
        qp.send(codec.encode(codec.Load(request_id=2, handle=h, data=codec.DataDesc(
            BUF_RKEY, BUF_VA + 65536, 64))))
        ini.run_until(lambda: ("disconnect", qp.qpn) in ini.events, 300,
                      "the target's DREQ after retry exhaustion")
        ini.ep.receive_frame = deliver
        # The WRITE and its retries (retry count 2: three in all) were all dropped, and no
        # COMPLETION came: the target's QP failed, it did not report success.
        assert len(dropped) >= 3, len(dropped)
        assert len(ini.inbox) == n
        log = (tmp_path / "serve.log").read_text()
        assert "CM qp 0: the transport moved it to error, disconnect" in log, log[-3000:]
        # The time-wait (the REQ's ACK timeout, 4 ms; the CM's timers run on its 1 s tick at
        # the latest), then a new connection.
        time.sleep(2)
        qp2 = ini.connect()
        ini.run_until(lambda: qp2.state == QPState.RTS, 300, "REP of the new connection")
        ack = request(qp2, codec.Hello(requested_features=0, completion_credits=8,
                                       initiator_id=10))
        assert ack.status == 0
        h2 = ack.handle_base
        ini.mem[0:100] = bytes(range(100, 200))
        c = request(qp2, codec.AllocStore(request_id=1, handle=h2, data=codec.DataDesc(
            BUF_RKEY, BUF_VA, 100), flags=ReqFlags.SEAL.value))
        assert (c.status, c.data_length) == (0, 100)
        c = request(qp2, codec.Load(request_id=2, handle=h2, data=codec.DataDesc(
            BUF_RKEY, BUF_VA + 65536, 100)))
        assert c.status == 0 and bytes(ini.mem[65536:65636]) == bytes(range(100, 200))
        log = (tmp_path / "serve.log").read_text()
        placed = [ln.split("-> qp ")[1].split()[0] for ln in log.splitlines()
                  if "CM REQ from" in ln and "-> qp " in ln]
        assert placed == ["0", "0"], placed
        print(f"\nretry exhaustion: {len(dropped)} WRITEs dropped, the target's DREQ came, "
              f"the new connection got QP {placed[1]}")

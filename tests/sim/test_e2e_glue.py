# Ref: issue 5; draft KBTP §Operations, §Direct Modes; sim/serve.py (glue)
"""``serve --model`` without QEMU: the KBTP-over-RC glue against a Python RC initiator.

The initiator is a second :class:`roce.rc.RoceEndpoint` that connects through CM, sends KBTP
requests as SENDs and exposes registered buffers. Oracle: a separate golden model fed the same
requests directly, with an InitiatorMemory holding the same buffers; its completion payloads and
its view of the initiator's buffers must equal what crossed the RC link (RDMA READ of the
source, RDMA WRITE of LOAD data, SEND of the COMPLETION). Also over a lossy link, the CLI's
gateware-not-ready exit, and the pcap writer (read back with scapy).
"""

from pathlib import Path
import random
import subprocess
import sys

import pytest

from host import codec
from hw.headers import ReqFlags
import model.target as M
from sim.channel import LossyLink, run
from roce.rc import RoceEndpoint
from sim.serve import (ModelGlue, PcapWriter, main, model_config)

TARGET_IP, INIT_IP = "10.0.0.2", "10.0.0.1"
BUF_VA, BUF_RKEY, BUF_SIZE = 0x7F0000100000, 0x00ABCD01, 3 * 65536


class _Target:
    """The served target as sim.channel.run drives it (the glue pumped on every tick)."""

    def __init__(self, cfg):
        self.ep = RoceEndpoint("02:4b:42:54:50:01", TARGET_IP, seed=3)
        self.model = M.TargetModel(cfg)
        self.glue = ModelGlue(self.ep, self.model, 18515)

    @property
    def now(self):
        return self.ep.now

    def receive_frame(self, f, t):
        self.ep.receive_frame(f, t)

    def tick(self, t):
        self.ep.tick(t)
        self.glue.pump(t / 1000)

    def poll_tx(self):
        self.glue.pump(self.ep.now / 1000)
        return self.ep.poll_tx()

    def next_deadline(self):
        return self.ep.next_deadline()


class _Session:
    def __init__(self, cfg, link=None):
        self.t = _Target(cfg)
        self.link = link or LossyLink()
        self.a = RoceEndpoint("02:00:0a:00:00:01", INIT_IP, seed=5)
        self.mem = bytearray(BUF_SIZE)
        self.a.register(self.mem, BUF_VA, BUF_RKEY, read=True, write=True)
        self.inbox = []
        self.qp = self.a.connect(TARGET_IP, 18515, qp_params=dict(
            on_message=lambda qp, data, imm=None, invalidated_rkey=None:
            self.inbox.append(bytes(data))))
        run(self.a, self.t, link=self.link, until=lambda: bool(self.t.glue.conns))
        # The oracle: a fresh model with the same configuration, fed directly.
        self.ref = M.TargetModel(cfg)
        self.ref.connect("ref")
        self.ref_mem = self.ref.initiator_memory("ref").register(BUF_RKEY, BUF_SIZE,
                                                                   base_to=BUF_VA)

    def request(self, msg, addr_le=False):
        raw = codec.encode(msg, addr_le=addr_le)
        n = len(self.inbox)
        self.qp.send(raw)
        # The oracle sees the initiator's buffer as it is now.
        self.ref_mem.data[:] = self.mem
        ref = [x.payload for x in self.ref.receive("ref", raw) if isinstance(x, M.SendMsg)]
        run(self.a, self.t, link=self.link, until=lambda: len(self.inbox) > n)
        got = self.inbox[n:]
        assert got == ref, (codec.decode(got[0]), codec.decode(ref[0]) if ref else None)
        assert bytes(self.mem) == bytes(self.ref_mem.data), "buffer differs from the oracle"
        return codec.decode(got[0])


def _desc(off, n):
    return codec.DataDesc(BUF_RKEY, BUF_VA + off, n)


@pytest.mark.parametrize("loss", [0.0, 0.08])
def test_glue_operations_match_oracle(loss):
    rng = random.Random(7)
    cfg = model_config()
    s = _Session(cfg, LossyLink(seed=11, loss=loss, dup=loss / 2))
    ack = s.request(codec.Hello(requested_features=0x7, completion_credits=8, initiator_id=3))
    assert ack.status == 0 and ack.block_size == cfg.block_size and ack.head is not None
    h = ack.handle_base
    for i, n in enumerate((64, 1000, cfg.block_size)):
        data = bytes(rng.getrandbits(8) for _ in range(n))
        s.mem[0:n] = data
        c = s.request(codec.AllocStore(request_id=10 + i, handle=h + i, data=_desc(0, n),
                                       flags=ReqFlags.SEAL.value))
        assert (c.status, c.data_length) == (0, n)
        c = s.request(codec.Load(request_id=20 + i, handle=h + i, data=_desc(65536, n)))
        assert c.status == 0 and bytes(s.mem[65536:65536 + n]) == data
    # Errors: TOO_LARGE destination, stale generation, NOT_SEALED, RECORD completion.
    c = s.request(codec.Load(request_id=30, handle=h + 2, data=_desc(0, 100)))
    assert c.status == 8
    c = s.request(codec.Load(request_id=31, handle=h, generation=0xFFF0, data=_desc(0, 64)))
    assert c.status == 2
    s.mem[0:5] = b"hello"
    s.request(codec.AllocStore(request_id=32, handle=h + 5, data=_desc(0, 5)))
    assert s.request(codec.Load(request_id=33, handle=h + 5, data=_desc(0, 64))).status == 7
    assert s.request(codec.Free(request_id=34, handle=h + 5)).status == 0


def test_glue_direct_alloc_through_rc():
    """FetchAdd on the Head MR, READ of the slot, WRITE via the Partition STag, then BIND."""
    s = _Session(model_config())
    ack = s.request(codec.Hello(requested_features=0x3, completion_credits=8, initiator_id=4))
    s.qp.fetch_add(ack.head.tagged_offset, ack.head.stag, 1 << 32)
    run(s.a, s.t, until=lambda: s.qp.outstanding == 0)
    ticket = s.qp.poll_cq()[-1].orig >> 32
    s.qp.read(ack.ring.tagged_offset + 16 * (ticket % ack.ring.count), ack.ring.stag, 16)
    run(s.a, s.t, until=lambda: s.qp.outstanding == 0)
    seq, boff = codec.decode_slot(s.qp.poll_cq()[-1].data)
    assert seq == ticket
    s.qp.write(boff, ack.partition.stag, b"direct!")
    run(s.a, s.t, until=lambda: s.qp.outstanding == 0)
    assert [c.status.name for c in s.qp.poll_cq()] == ["SUCCESS"]
    # The oracle model takes the same ticket and write directly.
    assert s.ref.remote_fetch_add("ref", ack.head.stag, ack.head.tagged_offset, 1 << 32) \
        >> 32 == ticket
    s.ref.remote_write("ref", ack.partition.stag, boff, b"direct!")
    c = s.request(codec.Bind(request_id=5, handle=ack.handle_base, ticket=ticket,
                             data_length=7, block_offset=boff))
    assert c.status == 0 and c.block_offset == boff
    c = s.request(codec.Load(request_id=6, handle=ack.handle_base, data=_desc(0, 64),
                             flags=ReqFlags.ALLOW_UNSEALED.value))
    assert c.status == 0 and bytes(s.mem[:7]) == b"direct!"


def test_cli_entry_point_runs():
    """The console script's module runs as a process: --model serves for a moment."""
    r = subprocess.run([sys.executable, "-m", "sim.serve", "serve", "--model", "--duration",
                        "0.3", "--listen", "127.0.0.1:0", "--peer", "127.0.0.1:9"],
                       capture_output=True, text=True, timeout=60,
                       cwd=str(Path(__file__).resolve().parents[2]))
    assert r.returncode == 0, r.stderr
    assert "kbtp-sim serve --model" in r.stdout


def test_pcap_writer_round_trip(tmp_path):
    from scapy.utils import rdpcap

    frames = [bytes(range(60)), b"\xff" * 6 + bytes(100)]
    p = PcapWriter(tmp_path / "x.pcap")
    for f in frames:
        p.write(f)
    p.close()
    assert [bytes(x) for x in rdpcap(str(tmp_path / "x.pcap"))] == frames

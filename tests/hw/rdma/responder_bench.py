# Ref: roce-layouts.md §1-§6; hw/rdma/responder.py, hw/rdma/qp.py; roce/rc.py (the peer requester).
"""Test bench for the RC responder: Responder + QpTable + MrTable + MemRam, driven by frames of
the Python RC peer (roce/rc.py) and answering it.

Frames become :data:`RoceRxHeader` records here with :func:`hw.headers.unpack` (not through the
gateware parser); every :data:`RespTx` record the responder emits is turned back into a frame
(payload read from the RAM when the record is taken, as the TX path would) and given to the peer,
whose completions are the oracle for ACK/NAK/READ/atomic behaviour. Memory is compared with an
image computed in the test from the operations posted.
"""

import random

from amaranth import Module
from amaranth.lib import wiring
from amaranth.lib.wiring import In

from hw.headers import (AETH, BTH, EXT_HEADERS, AtomicAckETH, BthOpcode, EthernetHeader,
                        IPv4Header, UDPHeader, pack, size_of, unpack)
from hw.iface import HostBusSignature, REG_MR, REG_QP, Space
from hw.lib.membus import MemRam
from hw.rdma.qp import MR_REGS, MR_STRIDE, QP_REGS, QP_STRIDE, MrTable, QpTable
from hw.rdma.responder import COUNTERS, Responder
from hw.rdma.roce_hdr import EXT_FIELDS, RoceRxParser
from sim import hostbus
from sim.hdl import packet_to_beats, run_sim, stream_put
from roce.rc import RoceEndpoint
from roce.frames import build_roce, ip_int, mac_bytes

DUT_MAC, DUT_IP = "02:00:00:00:00:01", "10.0.0.1"
PEER_MAC, PEER_IP = "02:00:00:00:00:02", "10.0.0.2"
PMTU_CODE = {256: 1, 512: 2, 1024: 3, 2048: 4, 4096: 5}
MEM_BYTES = 0x8000


class Bench(wiring.Component):
    """Responder with its tables and RAM; the host bus fans out to both tables (ack/err/rdata
    ORed, which the tables allow by answering only inside their windows)."""

    def __init__(self, width, n_qp=2, n_mr=4, init=b"", parser=False, **kw):
        self.resp = Responder(width, n_qp, **kw)
        #: With ``parser``, frames enter through the gateware RoceRxParser instead.
        self.parser = RoceRxParser(width) if parser else None
        self.qpt = QpTable(n_qp)
        self.mrt = MrTable(n_mr)
        self.ram = MemRam(MEM_BYTES // 8, MemRam.words_from_bytes(init))
        self.n_qp = n_qp
        super().__init__({"bus": In(HostBusSignature())})

    def elaborate(self, platform):
        m = Module()
        m.submodules.resp, m.submodules.qpt = self.resp, self.qpt
        m.submodules.mrt, m.submodules.ram = self.mrt, self.ram
        r = self.resp
        if self.parser is not None:
            m.submodules.parser = self.parser
            wiring.connect(m, self.parser.hdr, r.hdr)
            wiring.connect(m, self.parser.payload, r.payload)
        wiring.connect(m, r.mr, self.mrt.lookup)
        wiring.connect(m, r.mem, self.ram.bus)
        wiring.connect(m, r.cfg, self.qpt.resp)
        m.d.comb += [r.load_valid.eq(self.qpt.load_valid), r.load_qp.eq(self.qpt.load_qp),
                     r.load_row.eq(self.qpt.load_row), self.mrt.inv_valid.eq(r.mr_inv_valid),
                     self.mrt.inv_rkey.eq(r.mr_inv_rkey), r.mr_inv_found.eq(self.mrt.inv_found)]
        for t in (self.qpt.bus, self.mrt.bus):
            m.d.comb += [t.addr.eq(self.bus.addr), t.space.eq(self.bus.space),
                         t.wdata.eq(self.bus.wdata), t.we.eq(self.bus.we), t.re.eq(self.bus.re)]
        m.d.comb += [self.bus.ack.eq(self.qpt.bus.ack | self.mrt.bus.ack),
                     self.bus.err.eq(self.qpt.bus.err | self.mrt.bus.err),
                     self.bus.rdata.eq(self.qpt.bus.rdata | self.mrt.bus.rdata)]
        return m



# ---- host bus -----------------------------------------------------------------------------

async def bus_access(ctx, bus, addr, wdata=None):
    """One register access (a write when ``wdata`` is given); returns (rdata, err)."""
    return await hostbus.bus_access(ctx, bus, Space.REG, addr, wdata is not None, wdata or 0,
                                    limit=10)


def qp_words(**cfg):
    """QP register words {offset: value} from QpConfig field values (peer_mac split)."""
    out = {}
    for off, (name, lo, bits) in QP_REGS.items():
        out[off] = (cfg.get(name, 0) >> lo) & ((1 << bits) - 1)
    return out


def mr_words(valid, read, write, atomic, qp_mask, rkey, va, length, laddr):
    vals = dict(qp_mask=qp_mask, rkey=rkey, va=va, length=length, laddr=laddr)
    out = {0x00: valid | read << 1 | write << 2 | atomic << 3}
    for off, (name, lo, bits) in MR_REGS.items():
        out[off] = (vals[name] >> lo) & ((1 << bits) - 1)
    return out


async def write_qp(ctx, bus, i, **cfg):
    words = qp_words(**cfg)
    for off in sorted(words, reverse=True):     # state (offset 0) last: it loads the PSNs
        _, err = await bus_access(ctx, bus, REG_QP + QP_STRIDE * i + off, words[off])
        assert not err


async def write_mr(ctx, bus, j, **kw):
    words = mr_words(**kw)
    for off in sorted(words):
        _, err = await bus_access(ctx, bus, REG_MR + MR_STRIDE * j + off, words[off])
        assert not err


# ---- frames <-> records -------------------------------------------------------------------

def frame_to_record(frame):
    """(RoceRxHeader value dict, payload bytes) of a RoCEv2 frame, via hw.headers.unpack."""
    eth = unpack(EthernetHeader, frame, 0)
    ip = unpack(IPv4Header, frame, 14)
    udp = unpack(UDPHeader, frame, 34)
    bth = unpack(BTH, frame, 42)
    rec = {"bth": bth}
    off = 42 + size_of(BTH)
    for h in EXT_HEADERS[BthOpcode(bth["opcode"])]:
        name = EXT_FIELDS[h]
        rec[name] = unpack(h, frame, off)
        rec[f"has_{name}"] = 1
        off += size_of(h)
    end = 14 + ip["total_length"] - 4 - bth["padcnt"]
    payload = bytes(frame[off:end])
    rec.update(known_opcode=1, malformed=0, payload_len=len(payload),
               meta=dict(src_mac=eth["src"], src_ip=ip["src"], dst_ip=ip["dst"],
                         ip_id=ip["identification"], ip_flags=ip["flags"], tos=ip["tos"],
                         ttl=ip["ttl"], udp_src_port=udp["src_port"], udp_length=udp["length"]))
    return rec, payload


def resp_frame(rec, payload, peer_qpn):
    """Frame the TX path would send for a RespTx record (dict) with its payload."""
    op = BthOpcode(rec["opcode"])
    ext = b""
    for h in EXT_HEADERS[op]:
        if h is AETH:
            ext += pack(AETH, **rec["aeth"])
        elif h is AtomicAckETH:
            ext += pack(AtomicAckETH, **rec["atomic_ack"])
    return build_roce(mac_bytes(DUT_MAC), mac_bytes(PEER_MAC), DUT_IP, PEER_IP, 0xC000,
                      opcode=op.value, dest_qp=peer_qpn, psn=rec["psn"], ackreq=0, ext=ext,
                      payload=payload)


def const_to_dict(c):
    """Nested dict of ints from a data.Const (records taken from a stream)."""
    from amaranth.lib import data
    out = {}
    for name, _ in c.shape():
        v = c[name]
        out[name] = const_to_dict(v) if isinstance(v, data.Const) else int(getattr(v, "value", v))
    return out


# ---- the bench runner ---------------------------------------------------------------------

class Env:
    """State shared by the bench coroutines and a test scenario."""

    def __init__(self, width, seed, idle, backpressure, init, auto_repost=False, **kw):
        self.width = width
        self.auto_repost = auto_repost
        self.rng = random.Random(seed)
        self.idle, self.bp = idle, backpressure
        self.notify_bp = backpressure
        self.init = bytes(init)
        self.dut = Bench(width, init=init, **kw)
        self.tx = []            # (RespTx dict, payload bytes, cycle)
        self.notes = []         # RecvNotify dicts
        self.qp_errors = []     # QP indices of qp_error strobes
        self.cycle = 0
        self.peer = RoceEndpoint(PEER_MAC, PEER_IP, seed=seed)
        self.peer.arp_table[ip_int(DUT_IP)] = mac_bytes(DUT_MAC)

    def mem(self, ctx, addr=0, length=MEM_BYTES):
        """Target memory bytes [addr, addr + length) read from the RAM model."""
        if length == 0:
            return b""
        ram = self.dut.ram
        w0, w1 = addr // 8, (addr + length + 7) // 8
        raw = b"".join(ctx.get(ram.mem.data[i % (MEM_BYTES // 8)]).to_bytes(8, "little")
                       for i in range(w0, w1))
        return raw[addr - 8 * w0:addr - 8 * w0 + length]

    def counters(self, ctx):
        return {n: ctx.get(getattr(self.dut.resp, n)) for n in COUNTERS}

    async def put_frame(self, ctx, frame):
        rec, payload = frame_to_record(frame)
        r = self.dut.resp
        if self.dut.parser is not None:
            # BTH .. ICRC with the receive metadata, as EthIpRx/IcrcCheck deliver it.
            ulen = rec["meta"]["udp_length"]
            beats = packet_to_beats(frame[42:42 + ulen - 8], self.width)
            for b in beats:
                b["meta"] = rec["meta"]
            await stream_put(ctx, self.dut.parser.i, beats, idle=self.idle, rng=self.rng)
            return
        await stream_put(ctx, r.hdr, [rec], idle=self.idle, rng=self.rng)
        if payload:
            await stream_put(ctx, r.payload, packet_to_beats(payload, self.width),
                             idle=self.idle, rng=self.rng)

    async def quiet(self, ctx, cycles=40):
        """Wait until the responder took every header and nothing new came out for a while."""
        n, still = len(self.tx), 0
        while still < cycles:
            await ctx.tick()
            if len(self.tx) != n or not ctx.get(self.dut.resp.hdr.ready):
                n, still = len(self.tx), 0
            else:
                still += 1

    async def exchange(self, ctx, frames):
        """Drive frames, wait for quiet, return the RespTx entries produced meanwhile."""
        k = len(self.tx)
        for f in frames:
            await self.put_frame(ctx, f)
        await self.quiet(ctx)
        return self.tx[k:]

    def to_peer(self, entries, peer_qpn, drop=()):
        for j, (rec, payload, _) in enumerate(entries):
            if j not in drop:
                self.peer.receive_frame(resp_frame(rec, payload, peer_qpn), self.peer.now)

    async def run_peer(self, ctx, peer_qpn, rounds=20, tick_us=0):
        """Let the peer and the DUT talk until the peer has nothing more to send."""
        for _ in range(rounds):
            frames = self.peer.poll_tx()
            if not frames and tick_us:
                self.peer.tick(self.peer.now + tick_us)
                frames = self.peer.poll_tx()
            if not frames:
                return
            self.to_peer(await self.exchange(ctx, frames), peer_qpn)
        raise AssertionError("peer still talking")


def run(env, scenario, vcd=None):
    """Simulate ``scenario(ctx, env)`` with the tx/notify collectors in the background."""
    r = env.dut.resp

    async def clock(ctx):
        async for _, _, err, idx in ctx.tick().sample(r.qp_error, r.qp_error_index):
            env.cycle += 1
            if err:
                env.qp_errors.append(idx)

    async def collect(ctx, port, out, tx):
        # Own loop instead of stream_get: a background testbench is abandoned mid-await when
        # the scenario ends, which must not happen inside an async generator (``until``).
        while True:
            rdy = env.rng.random() >= (env.bp if tx else env.notify_bp)
            ctx.set(port.ready, rdy)
            _, _, valid, p, head = await ctx.tick().sample(port.valid, port.payload,
                                                           r.notify_head)
            if not tx and env.auto_repost:
                ctx.set(r.repost.valid, 0)
            if rdy and valid:
                rec = const_to_dict(p)
                if tx:
                    out.append((rec, env.mem(ctx, rec["laddr"], rec["length"]), env.cycle))
                else:
                    # The consumer copies the message out, then returns the buffer.
                    rec["data"] = env.mem(ctx, rec["addr"], rec["length"])
                    rec["head"] = (head.ok, head.octets)      # the on-chip first octets
                    out.append(rec)
                    if env.auto_repost:
                        ctx.set(r.repost.p.qp, rec["qp"])
                        ctx.set(r.repost.valid, 1)

    async def tx_collector(ctx):
        await collect(ctx, r.tx, env.tx, True)

    async def notify_collector(ctx):
        await collect(ctx, r.notify, env.notes, False)

    async def main(ctx):
        await scenario(ctx, env)

    run_sim(env.dut, main, [tx_collector, notify_collector], processes=[clock], vcd=vcd)

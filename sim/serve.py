# Ref: issue 5; docs/softroce-vm.md (QEMU -netdev dgram, rdma_cm).
#      draft KBTP §Operations, §Direct Modes; docs/roce-layouts.md §7 (CM)
"""``kbtp-sim serve``: a KBTP target on Ethernet frames carried as UDP datagrams.

One UDP datagram is one Ethernet frame without FCS, as QEMU's ``-netdev dgram`` sends and
receives them: the soft-RoCE guest (``sim.guest.run``) talks to this process as if it were a
RoCEv2 NIC. ``--model`` serves the golden model (:mod:`model.target`) behind the Python RC
endpoint (:mod:`roce.rc`); the default mode serves the Verilated gateware with the host driver
and the CM over the raw frame queues (:mod:`sim.serve_hw`; the first run builds it, minutes).

KBTP over RC (:class:`ModelGlue`)
---------------------------------
* A CM connection accepted on the RDMA CM port -> ``TargetModel.connect(qpn)``; a DREQ or a
  QP error -> ``TargetModel.disconnect``.
* Every received SEND is a KBTP request. The model reads initiator memory synchronously through
  an :class:`~model.target.InitiatorMemory`; a real target must RDMA READ first. So the glue decodes
  the request, and when it names source data (STORE / ALLOC_STORE without INLINE) it issues the
  RDMA READ of the Data Descriptor into a bounce buffer, and only when that READ completes
  registers the data in the connection's InitiatorMemory (STag, Tagged Offset) and feeds the
  request to the model. Destinations (LOAD data, RECORD slots) are registered as writable
  zero-filled buffers of the descriptor's size, so the model's writes land there and come back
  as :class:`~model.target.RdmaWrite` / :class:`~model.target.WriteImm` actions, which the glue posts
  on the RC QP. Requests of one connection are processed strictly in order (the next one waits
  for the previous one's READ).
  The READ is issued before the model validates the request, so a request the model rejects
  anyway (e.g. INVALID_HANDLE) still costs one READ of the initiator's source buffer.
* Actions: RdmaRead (already done by the READ) is only logged; RdmaWrite -> RDMA WRITE;
  WriteImm -> RDMA WRITE with Immediate; SendMsg -> SEND or SEND with Invalidate; InvalidateStag
  -> the target MR of that STag is invalidated; Disconnect -> DREQ once the QP has no
  outstanding work (so the last COMPLETION or HELLO_ACK leaves first).
* Direct modes: every model region (Table, Pool, Partition, Ring, Head STags) is registered as
  an MR of the endpoint over the model's memory image (a memoryview: one-sided accesses act on
  the model directly), with the STag as R_Key and the region's Tagged Offsets as VAs. The Head
  is atomic-only; the RC endpoint's FetchAdd is unmasked, so the model runs with
  ``masked=False`` (RoCEv2 initiators have no masked FetchAdd). MRs are endpoint-wide, not per
  QP: enough for one initiator at a time, which is what the tests and the demo run.

Run ``kbtp-sim serve [--model] [--pcap FILE] [--drop F --dup F --corrupt F --seed N]``; the
gateware backend also takes ``--ready-file`` (written once the target is initialised) and
``--stop-file`` (serving ends when it appears).
"""

import argparse
import json
import signal
import sys

from hw.headers import ReqFlags
from host import codec
from host.codec import KbtpError
from host.driver import disconnect_delay_ms
import model.target as M
from roce.rc import QPState, RoceEndpoint, WcStatus
from sim.vltarget import NAMED
from sim.frameserver import (DEFAULT_CM_PORT, DEFAULT_IP, DEFAULT_MAC, FrameServer, PcapWriter,
                             large_config, model_config)

__all__ = ["ModelGlue", "FrameServer", "PcapWriter", "model_config", "large_config", "main",
           "DEFAULT_MAC", "DEFAULT_IP", "DEFAULT_CM_PORT", "EXIT_NO_GATEWARE"]

EXIT_NO_GATEWARE = 2


# --------------------------------------------------------------------------------------------
# KBTP over the Python RC endpoint
# --------------------------------------------------------------------------------------------

class _Conn:
    def __init__(self, qp):
        self.qp = qp
        self.queue = []               # request payloads not yet handled
        self.busy = None              # (payload, descriptor) while its READ is in flight
        self.closing = False
        self.closed = False
        self.close_at = None          # close then (ms) unless the initiator did first


class ModelGlue:
    """Connects a :class:`~model.target.TargetModel` to a :class:`~roce.rc.RoceEndpoint`.

    Parameters
    ----------
    ep : RoceEndpoint
    model : TargetModel
    port : int
        RDMA CM port (IP CM service ID, TCP port space).
    log : callable(str) or None
        One line per event (connections, requests, actions).
    """

    def __init__(self, ep, model, port=DEFAULT_CM_PORT, log=None):
        self.ep, self.model = ep, model
        self.log = log or (lambda s: None)
        self.conns = {}
        self.now_ms = 0.0
        self.stats = {"requests": 0, "reads": 0, "read_bytes": 0, "writes": 0,
                      "write_bytes": 0, "sends": 0}
        self._registered = set()
        ep.listen(port, on_connect=self._on_connect, on_disconnect=self._on_disconnect,
                  responder_resources=16, initiator_depth=16,
                  qp_params=dict(on_message=self._on_message,
                                 on_completion=self._on_completion))

    # ---- CM events ----------------------------------------------------------------------
    def _on_connect(self, qp):
        if qp.qpn in self.conns and not self.conns[qp.qpn].closed:
            return
        self.conns[qp.qpn] = _Conn(qp)
        self.model.connect(qp.qpn)
        self.log(f"connect qpn={qp.qpn:#x} peer_qpn={qp.dest_qpn:#x} pmtu={qp.pmtu}")

    def _on_disconnect(self, qp):
        c = self.conns.get(qp.qpn)
        if c is None or c.closed:
            return
        c.closed = True
        self.log(f"disconnect qpn={qp.qpn:#x}")
        self._apply(c, self.model.disconnect(qp.qpn, self.now_ms))

    # ---- RC events ----------------------------------------------------------------------
    def _on_message(self, qp, data, imm=None, invalidated_rkey=None):
        c = self.conns.get(qp.qpn)
        if c is None:                     # SEND before the RTU: the CM will establish first
            self._on_connect(qp)
            c = self.conns[qp.qpn]
        c.queue.append(bytes(data))

    def _on_completion(self, qp, wc):
        c = self.conns.get(qp.qpn)
        if c is None:
            return
        if wc.status != WcStatus.SUCCESS:
            if wc.status != WcStatus.WR_FLUSH_ERR:
                self.log(f"qpn={qp.qpn:#x} work request {wc.op.name} failed: {wc.status.name}")
            # Disconnect from pump(), outside the endpoint's completion processing.
            c.closing = True
            return
        if c.busy is not None and wc.op.name == "READ" and wc.wr_id == c.busy[2]:
            payload, desc, _ = c.busy
            c.busy = None
            self.stats["reads"] += 1
            self.stats["read_bytes"] += len(wc.data or b"")
            imem = self.model.initiator_memory(qp.qpn)
            imem.register(desc.stag, wc.data or b"", base_to=desc.tagged_offset, access="r")
            self._feed(c, payload, prefilled=True)

    # ---- requests -------------------------------------------------------------------------
    def _decode(self, payload):
        s = self.model.session_of(self._cur.qp.qpn)
        cfg = self.model.cfg
        try:
            return codec.decode(payload, addr_le=bool(s and s.addr_le),
                                max_inline=cfg.max_inline, block_size=cfg.block_size)
        except KbtpError:
            return None                   # the model answers MALFORMED/TOO_LARGE itself

    def pump(self, now_ms):
        """Advance the model's clock and handle queued requests and deferred disconnects."""
        self.now_ms = now_ms
        self._apply(None, self.model.tick(now_ms))
        for c in list(self.conns.values()):
            if c.close_at is not None and now_ms >= c.close_at:
                c.close_at, c.closing = None, True
            while c.queue and c.busy is None and not c.closed and not c.closing:
                self._start(c, c.queue.pop(0))
            if c.closing and not c.closed and c.qp.outstanding == 0:
                c.closed = True
                self.log(f"target disconnects qpn={c.qp.qpn:#x}")
                self._dreq(c.qp)
                self._apply(c, self.model.disconnect(c.qp.qpn, self.now_ms))

    def _dreq(self, qp):
        try:
            self.ep.disconnect(qp)
        except RuntimeError:              # no established CM connection (any more)
            pass

    def _start(self, c, payload):
        self._cur = c
        msg = self._decode(payload)
        self.stats["requests"] += 1
        if msg is not None:
            self.log(f"qpn={c.qp.qpn:#x} <- {type(msg).__name__} id={msg.request_id} "
                     f"handle={msg.handle:#x} flags={msg.flags:#x}"
                     + (f" len={msg.data.length}" if hasattr(msg, "data") else ""))
        else:
            self.log(f"qpn={c.qp.qpn:#x} <- undecodable request ({len(payload)} octets)")
        imem = self.model.initiator_memory(c.qp.qpn)
        imem.buffers.clear()
        if msg is not None:
            comp = getattr(msg, "completion", None)
            if comp is not None:
                imem.register(comp.stag, 24, base_to=comp.tagged_offset, access="w")
            if isinstance(msg, codec.Load) and msg.data.length:
                imem.register(msg.data.stag, msg.data.length, base_to=msg.data.tagged_offset,
                              access="w")
            if isinstance(msg, (codec.Store, codec.AllocStore)) and msg.data.length \
                    and not msg.flags & ReqFlags.INLINE.value:
                # Fetch the source first; the model runs when the READ completes.
                wr = c.qp.read(msg.data.tagged_offset, msg.data.stag, msg.data.length)
                c.busy = (payload, msg.data, wr)
                return
        self._feed(c, payload, prefilled=False)

    def _feed(self, c, payload, prefilled):
        acts = self.model.receive(c.qp.qpn, payload, self.now_ms)
        self._apply(c, acts)
        self._sync_regions()

    # ---- actions --------------------------------------------------------------------------
    def _apply(self, c, actions):
        for a in actions:
            cc = self.conns.get(getattr(a, "conn", None), c)
            qp = cc.qp if cc is not None else None
            live = qp is not None and qp.state == QPState.RTS and not cc.closed
            if isinstance(a, M.RdmaRead):
                if a.error:
                    self.log(f"  RDMA READ fault: {a.error}")
            elif isinstance(a, (M.RdmaWrite, M.WriteImm)):
                if a.error:
                    self.log(f"  RDMA WRITE fault: {a.error}")
                    continue
                if live:
                    imm = a.imm if isinstance(a, M.WriteImm) else None
                    qp.write(a.to, a.stag, a.data, imm=imm)
                    self.stats["writes"] += 1
                    self.stats["write_bytes"] += len(a.data)
                    self.log(f"  -> RDMA WRITE{'_IMM' if imm is not None else ''} "
                             f"stag={a.stag:#x} to={a.to:#x} len={len(a.data)}")
            elif isinstance(a, M.SendMsg):
                if live:
                    qp.send(a.payload, inv_rkey=a.invalidate_stag)
                    self.stats["sends"] += 1
                    try:
                        m = codec.decode(a.payload)
                        what = (f"{type(m).__name__} id={m.request_id} status="
                                f"{codec._status_name(m.status)}")
                    except KbtpError:
                        what = f"{len(a.payload)} octets"
                    inv = "" if a.invalidate_stag is None else \
                        f" (invalidate {a.invalidate_stag:#x})"
                    self.log(f"  -> SEND {what}{inv}")
            elif isinstance(a, M.InvalidateStag):
                self.ep.invalidate(a.stag, missing_ok=True)
                self._registered.discard(a.stag)
                self.log(f"  invalidate target STag {a.stag:#x}: {a.reason}")
            elif isinstance(a, M.Disconnect):
                delay = disconnect_delay_ms(a.reason)
                if cc is not None and delay:
                    # As the gateware server: after GOODBYE, the initiator's DREQ first.
                    cc.close_at = self.now_ms + delay
                    self.log(f"  target closes in {delay / 1e3:g} s: {a.reason}")
                elif cc is not None:
                    cc.closing = True
                    self.log(f"  target closes: {a.reason}")

    def _sync_regions(self):
        """Register (or drop) the model's direct-mode regions as endpoint MRs."""
        mem = memoryview(self.model.mem)
        for stag, r in self.model.regions.items():
            want = r.valid and bool(r.conns & set(self.conns))
            if want and stag not in self._registered:
                self.ep.register(mem[r.addr:r.addr + r.length], r.base_to, stag,
                                 read=r.access == "r", write=r.access == "w",
                                 atomic=r.access == "a")
                self._registered.add(stag)
            elif not want and stag in self._registered:
                self.ep.invalidate(stag, missing_ok=True)
                self._registered.discard(stag)


def build_model_server(*, ip=DEFAULT_IP, mac=DEFAULT_MAC, port=DEFAULT_CM_PORT,
                       listen=("127.0.0.1", 20002), peer=("127.0.0.1", 20001), pcap=None,
                       drop=0.0, dup=0.0, corrupt=0.0, seed=1, log=None, cfg=None):
    """A :class:`FrameServer` serving a fresh golden model; returns (server, glue, model)."""
    ep = RoceEndpoint(mac, ip, seed=seed, min_frame=60)
    model = M.TargetModel(cfg or model_config())
    glue = ModelGlue(ep, model, port, log=log)
    srv = FrameServer(ep, glue, listen=listen, peer=peer, pcap=pcap, drop=drop, dup=dup,
                      corrupt=corrupt, seed=seed, log=log)
    return srv, glue, model


# --------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------

def _fraction(text):
    v = float(text)
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not a fraction in 0..1")
    return v


def _hostport(text):
    host, _, port = text.rpartition(":")
    return (host or "127.0.0.1", int(port))


def _config(text):
    """``--config``: JSON object of :func:`model_config` overrides, checked here."""
    try:
        over = json.loads(text)
        if not isinstance(over, dict):
            raise ValueError("not a JSON object")
        model_config(**over)
    except (ValueError, TypeError) as e:
        raise argparse.ArgumentTypeError(f"--config {text!r}: {e}")
    return over


def main(argv=None):
    p = argparse.ArgumentParser(prog="kbtp-sim")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve", help="serve a KBTP target on Ethernet-frames-in-UDP")
    s.add_argument("--model", action="store_true", help="serve the golden model")
    s.add_argument("--ip", default=DEFAULT_IP)
    s.add_argument("--mac", default=DEFAULT_MAC)
    s.add_argument("--port", type=int, default=DEFAULT_CM_PORT, help="RDMA CM port")
    s.add_argument("--listen", type=_hostport, default=("127.0.0.1", 20002))
    s.add_argument("--peer", type=_hostport, default=("127.0.0.1", 20001))
    s.add_argument("--pcap")
    s.add_argument("--drop", type=_fraction, default=0.0)
    s.add_argument("--dup", type=_fraction, default=0.0)
    s.add_argument("--corrupt", type=_fraction, default=0.0)
    s.add_argument("--seed", type=int, default=1)
    s.add_argument("--duration", type=float, help="stop after this many seconds")
    s.add_argument("-q", "--quiet", action="store_true")
    s.add_argument("--ready-file", help="gateware: write this file once serving")
    s.add_argument("--stop-file", help="gateware: stop when this file appears")
    s.add_argument("--stats-file",
                   help="gateware: write the target's counters and the board time of every "
                        "KBTP request here as JSON (atomically, every ~1 s and at exit)")
    s.add_argument("--hw", choices=sorted(NAMED), default="ecpix5",
                   help="gateware: the ECPIX-5 core as the bitstream holds it (default: two "
                        "clocks, width 64, its 512 MB of DDR3 through the DDR3 timing model of "
                        "boards/dram.py), the same with 128 KiB of block RAM instead, or the "
                        "one-clock width-8 unit-test target")
    s.add_argument("--host-link", choices=("bus", "udp"), default="bus",
                   help="gateware: the driver on the direct host bus (default), or over the UDP "
                        "host link on the target's own Ethernet port (sim/vllink.py)")
    s.add_argument("--host-turnaround-ns", type=float, default=0.0,
                   help="gateware, --host-link udp: modelled host turnaround per exchange "
                        "(simulated time; default 0: the host takes no simulated time)")
    s.add_argument("--config", type=_config, default={},
                   help='target configuration overrides as JSON, e.g. \'{"addr_le": true, '
                        '"ticket_timeout_ms": 3000}\' (fields of model.target.TargetConfig)')
    a = p.parse_args(argv)
    if not a.model:
        from sim.serve_hw import run_gateware
        opts = dict(mac=a.mac, ip=a.ip, port=a.port, listen=list(a.listen), peer=list(a.peer),
                    pcap=a.pcap, drop=a.drop, dup=a.dup, corrupt=a.corrupt, seed=a.seed,
                    duration=a.duration, quiet=a.quiet, ready_file=a.ready_file,
                    stop_file=a.stop_file, config=a.config, hw=a.hw,
                    stats_file=a.stats_file, host_link=a.host_link,
                    host_turnaround_ns=a.host_turnaround_ns)
        return run_gateware(opts, log=lambda s: print(s, file=sys.stderr, flush=True))

    def log(line):
        if not a.quiet:
            print(line, flush=True)

    srv, glue, _ = build_model_server(ip=a.ip, mac=a.mac, port=a.port, listen=a.listen,
                                      peer=a.peer, pcap=a.pcap, drop=a.drop, dup=a.dup,
                                      corrupt=a.corrupt, seed=a.seed, log=log,
                                      cfg=model_config(**a.config))
    signal.signal(signal.SIGTERM, lambda *_: srv.stop_event.set())
    log(f"kbtp-sim serve --model: {a.ip} ({a.mac}) CM port {a.port}, UDP "
        f"{a.listen[0]}:{a.listen[1]} <-> {a.peer[0]}:{a.peer[1]}")
    try:
        srv.serve_forever(a.duration)
    except KeyboardInterrupt:
        pass
    finally:
        srv.stop()
    log(f"frames {srv.counts}; glue {glue.stats}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

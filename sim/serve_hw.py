# Ref: issue 5: the gateware backend of ``kbtp-sim serve``; sim/serve.py (options,
#      FrameServer: UDP socket, pcap, impairments); sim/vltarget.py (the Verilated target driven
#      by a C++ main); hw/target/target.py; host/driver.py; host/cm.py.
"""``kbtp-sim serve`` without ``--model``: the Verilated :class:`~hw.target.target.KbtpTarget`.

The target runs in :class:`sim.vltarget.VlTarget` (a C++ Verilator main that owns the clocks,
the GMII pins and the host bus; no Python per cycle). By default it is the core the ECPIX-5
bitstream holds (:data:`sim.vltarget.SHIPPED`: MAC at 125 MHz, the target at width 64 in its
41.67 MHz core clock, timers at the board's rate); ``hw="unit"`` serves the one-clock width-8
unit-test target (:data:`sim.vltarget.HW_DEFAULT`, timers 16 times fast). This process owns:

* the same :class:`sim.serve.FrameServer` as ``--model``: the UDP socket (QEMU ``-netdev
  dgram``: one Ethernet frame without FCS per datagram), the pcap and the drop/dup/corrupt
  impairments;
* the host side: :class:`host.driver.KbtpDriver` (``init``, ``poll``, ``tick``) and
  :class:`host.cm.CmServer` (rdma_cm over the raw frame queues), both on the target's host bus
  through :class:`host.port.TargetPort`, as they would be on a board.

One loop: frames in from the socket, ``run(STEP)`` cycles, frames out, then the CM and the
driver. Every host-bus access also moves frames both ways, so that a driver waiting for the
completion of its own RDMA operation (which needs the peer's answer) never stalls the network.

Time: the gateware's timers (ACK timeout, RNR) count simulated cycles (scaled by
``timer_scale`` on the unit target); the driver and the CM are host software and use wall time (ticket timeout,
retention, CM retries), as on a board. While nothing moves, the loop sleeps on the socket for
up to :data:`IDLE_WAIT_S` between runs of :data:`IDLE_STEP` cycles, so an idle target leaves the
CPU to the guest and still lets its retransmission timers run.

Stopping: ``duration`` seconds, a ``stop_file`` appearing, or the parent process going away.
``ready_file`` is written once the driver has initialised the target.

Host link (``host_link``): ``"bus"`` (default) drives the target's host bus directly, as the
UART bridge would, in zero simulated time; ``"udp"`` runs the driver's
:class:`~host.port.TargetPort` over :class:`host.udplink.UdpLink` on
:class:`sim.vllink.VlUdpTransport`: every exchange is a UDP datagram on the target's GMII
(simulated at the board's clocks), the link being brought up over the direct bus first (what
the UART does on a board). The network keeps flowing while the driver waits for the link;
the link's datagrams never reach the socket.
"""

import asyncio
import os
import select
import time
from pathlib import Path

from host.driver import disconnect_delay_ms
from sim.vltarget import NAMED, SHIPPED, board_params, driver_for

__all__ = ["HW", "HW_CHOICES", "run_gateware", "Served"]

#: What ``kbtp-sim serve --hw`` can serve: the shipped board core (default) or the one-clock
#: unit-test target.
HW_CHOICES = NAMED
#: The parameters of the default served gateware (the ECPIX-5 core, as the bitstream holds it).
HW = board_params(SHIPPED["board"], SHIPPED.get("dram"))
STEP = 512                  # cycles between two service rounds while frames move
IDLE_STEP = 2048            # ... while nothing moved in the last round
IDLE_WAIT_S = 0.001         # wall time to wait for a frame on the socket when idle
# Host-bus polls the driver spends waiting for the completion of its own RDMA operation (each
# poll also moves frames): the transport always ends a work request, with success or with
# RETRY_EXCEEDED after its retries, and a TCG guest can take seconds to answer; this bound is
# only a guard against a stuck target.
WC_POLLS = 3_000_000
# Cap of the target QPs' ACK timeout code: rdma_cm asks for ~2 s, which the simulator would take
# minutes to reach after a lost frame. 4.096 us * 2^8 = 1 ms at the board's timer rate (about a
# second of wall time while idle); on the unit target (timer_scale 16) code 12 is the same time.
ACK_TIMEOUT = {"ecpix5": 8, "ecpix5-bram": 8, "unit": 12}


def _mem_words():
    """Target memory words the served configuration needs (table, rings, pool, driver areas)."""
    from host.driver import memory_plan
    from sim.frameserver import model_config
    end = memory_plan(model_config(), HW["n_qp"])["end"]
    return -(-end // 8)


class Served:
    """The served target: a :class:`VlTarget`, its frames and its host software."""

    def __init__(self, opts, log=print):
        from host.cm import CmServer
        from host.port import TargetPort
        from sim.frameserver import FrameServer, served_config
        from sim.vltarget import VlTarget
        self.o = opts
        self.log = (lambda s: None) if opts.get("quiet") else log
        hw = opts.get("hw") or "ecpix5"
        self.vl = VlTarget(HW_CHOICES[hw], log=self.log)
        p = self.vl.params
        self.srv = FrameServer(None, None, listen=tuple(opts["listen"]),
                               peer=tuple(opts["peer"]), pcap=opts.get("pcap"),
                               drop=opts.get("drop", 0.0), dup=opts.get("dup", 0.0),
                               corrupt=opts.get("corrupt", 0.0), seed=opts.get("seed", 1),
                               log=self.log)
        self.srv.sock.setblocking(False)
        self.transport = None
        if opts.get("host_link", "bus") == "udp":
            # The driver over the UDP host link (issue 23): every access is a datagram on the
            # target's GMII (sim/vllink.py); the link's steps keep the network moving.
            from host.port import link_access
            from sim.vllink import VlUdpTransport, sim_udp_link
            self.transport = VlUdpTransport(
                self.vl, target_mac=opts["mac"], target_ip=opts["ip"],
                on_frames=self._link_frames,
                host_turnaround_ns=opts.get("host_turnaround_ns", 0.0))
            self.udplink = sim_udp_link(self.transport)
            self.port = TargetPort(link_access(self.udplink))
        elif opts.get("host_link", "bus") == "bus":
            self.port = TargetPort(self.vl.port_access(self.pump))
        else:
            raise ValueError(f"host_link {opts['host_link']!r} is not 'bus' or 'udp'")
        cfg = served_config(p["n_qp"], p["mem_words"] * 8, **opts.get("config", {}))
        self.log(f"served configuration: {cfg.num_blocks} blocks of {cfg.block_size} octets, "
                 f"request credits {cfg.request_credits}, max inline {cfg.max_inline}")
        self.driver = driver_for(self.port, cfg, p, wc_polls=WC_POLLS)
        self.cm = CmServer(self.driver, mac=opts["mac"], ip=opts["ip"], cm_port=opts["port"],
                           log=self.log, seed=opts.get("seed", 1),
                           max_ack_timeout=ACK_TIMEOUT[hw])
        self.counts = {"bad_fcs": 0, "handled": 0}
        self.pending_dreq = []           # (when in ms, QP, CmLink): the target's DREQs to send
        self.moved = 0                   # frames moved either way since the last look
        # --stats-file (issue 24): board time of every KBTP request, counters, every ~1 s.
        self.timer = None
        if opts.get("stats_file"):
            from sim.serve_stats import BoardTimer
            self._peers = {}
            self.timer = BoardTimer(p, self._peer_of)
            if self.transport is not None:
                self.transport.on_send = self.timer.sent

    # ---- frames ------------------------------------------------------------------------------
    def pump(self):
        """Frames from the socket into the target, and the target's frames out."""
        self._pump_in()
        self._out(self.vl.run(0))

    def _link_frames(self, frames):
        """A step of the UDP host link's wait: frames both ways, as :meth:`pump`."""
        self._pump_in()
        self._out(frames)

    def _pump_in(self):
        srv = self.srv
        for _ in range(64):
            try:
                frame = srv.sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                break
            if srv.pcap:
                srv.pcap.write(frame)
            for g in srv._impair(frame):
                srv.counts["rx"] += 1
                # A NIC pads short frames (rxe's ARP is 42 octets): the MAC drops runts.
                self.vl.send(bytes(g).ljust(60, b"\0"))
                if self.timer is not None:
                    self.timer.sent(bytes(g).ljust(60, b"\0"))
                self.moved += 1

    def _out(self, frames):
        srv = self.srv
        if self.transport is not None:      # the host link's datagrams are the host's
            frames = self.transport.sift(frames)
        if self.timer is not None:
            self.timer.sync_rx(self.vl.rx_log)
            self.timer.sent_by_target(frames)
        for f in frames:
            self.moved += 1
            if not f.fcs_ok:
                self.counts["bad_fcs"] += 1
                continue
            for g in srv._impair(f.frame):
                if srv.pcap:
                    srv.pcap.write(g)
                srv.counts["tx"] += 1
                try:
                    srv.sock.sendto(g, srv.peer)
                except OSError:
                    pass

    def _stop(self, t_end, ppid):
        o = self.o
        if t_end is not None and time.monotonic() >= t_end:
            return True
        if o.get("stop_file") and os.path.exists(o["stop_file"]):
            return True
        return os.getppid() != ppid

    # ---- host side ---------------------------------------------------------------------------
    async def start(self):
        t0 = time.monotonic()
        if self.transport is not None:
            # What the UART does on a board: own address and the link's host, then enable.
            self.transport.bring_up()
        await self.port.set_own(self.o["mac"], self.o["ip"])
        await self.driver.init()
        self.log(f"kbtp-sim serve (gateware): {self.o['ip']} ({self.o['mac']}) CM port "
                 f"{self.o['port']}, UDP {self.o['listen'][0]}:{self.o['listen'][1]} <-> "
                 f"{self.o['peer'][0]}:{self.o['peer'][1]}; host link "
                 f"{self.o.get('host_link', 'bus')}; target initialised in "
                 f"{time.monotonic() - t0:.1f} s ({self.vl.cycle} cycles)")
        if self.o.get("ready_file"):
            Path(self.o["ready_file"]).write_text(str(os.getpid()))

    async def _host_round(self, now_ms):
        """CM and driver once; True when either did something."""
        try:
            n_cm = await self.cm.poll()
            h = await self.driver.poll(now_ms)
        except Exception as e:              # a server logs and carries on
            import traceback
            self.counts["errors"] = self.counts.get("errors", 0) + 1
            self.log(f"host error: {e!r}\n{traceback.format_exc()}")
            return False
        if h is not None:
            self.counts["handled"] += 1
            self.cm.established(h.qp)
            self.log(f"qp {h.qp}: {h.op}" + "".join(
                f"\n  {a[0]} {a[1:]!r:.100}" for a in h.actions))
            for a in h.actions:
                if a[0] == "disconnect" and a[1] in self.cm.conns:
                    self.pending_dreq.append((now_ms + disconnect_delay_ms(a[2]), a[1],
                                              self.cm.conns[a[1]]))
        for item in list(self.pending_dreq):
            # The driver asks for it after its last reply completed (errors: at once; GOODBYE:
            # after the grace, unless the initiator disconnected first). Only the connection
            # it was asked for: the QP may carry a new one by then.
            due, qp, link = item
            if now_ms >= due:
                self.pending_dreq.remove(item)
                if self.cm.conns.get(qp) is link:
                    await self.cm.disconnect(qp)
        return bool(n_cm or h is not None)

    def _peer_of(self, qpn):
        """The initiator's QPN of target QPN ``qpn`` (CM links; remembered after they end)."""
        if qpn not in self._peers:
            for c in self.cm.conns.values():
                self._peers[c.qpn] = c.peer_qpn
        return self._peers.get(qpn)

    async def _write_stats(self, final=False):
        """``--stats-file``: counters and board-time records as JSON (sim/serve_stats.py)."""
        from sim.serve_stats import write_stats
        out, drv = await self._log_counters(quiet=not final)
        data = dict(self.timer.snapshot(), final=final, cycle=self.vl.cycle,
                    core_cycle=self.vl.core_cycle, hw=self.o.get("hw") or "ecpix5",
                    params=self.vl.params, counters=out, driver=drv,
                    frames=dict(self.srv.counts), host=dict(self.counts),
                    cm=dict(self.cm.stats),
                    qps={str(c.qp): {"qpn": c.qpn, "peer_qpn": c.peer_qpn,
                                     "peer_ip": c.peer_ip, "state": c.state}
                         for c in self.cm.conns.values()})
        try:
            write_stats(self.o["stats_file"], data)
        except OSError as e:                        # a report only
            self.log(f"stats file not written: {e!r}")

    async def _log_counters(self, quiet=False):
        """Target counters (non-zero ones) at the end of a run, for the log; returns them
        and the driver's (None when unavailable)."""
        from hw.iface import REG_TOP, REG_TRANSPORT
        from hw.target.regbank import TOP_COUNTER_BASE
        from hw.target.target import (REQ_COUNTER_BASE, REQ_COUNTERS, REQ_STATUS, RESP_COUNTERS,
                                   TOP_COUNTERS)
        out = {}
        for k, (blk, port) in enumerate(TOP_COUNTERS):
            out[f"{blk}.{port}"] = await self.port.rreg(REG_TOP + TOP_COUNTER_BASE + 4 * k)
        for k, name in enumerate(RESP_COUNTERS):
            out[f"resp.{name}"] = await self.port.rreg(REG_TRANSPORT + 4 * k)
        for k, name in enumerate(REQ_COUNTERS + REQ_STATUS):
            out[f"req.{name}"] = await self.port.rreg(REQ_COUNTER_BASE + 4 * k)
        if not quiet:
            self.log("counters " + ", ".join(f"{k}={v}" for k, v in out.items() if v))
        c = None
        try:
            c = await self.driver.counters()
            if not quiet:
                self.log(f"driver counters {c}")
        except Exception as e:                      # a report only; never fail the run here
            self.log(f"driver counters unavailable: {e!r}")
        return out, c

    async def run(self):
        await self.start()
        d = self.o.get("duration")
        t_end = None if d is None else time.monotonic() + d
        ppid = os.getppid()
        last_tick = last_stats = 0.0
        t0 = time.monotonic()
        idle = False
        while not self._stop(t_end, ppid):
            if idle:
                select.select([self.srv.sock], [], [], IDLE_WAIT_S)
            self.moved = 0
            self.pump()
            self._out(self.vl.run(IDLE_STEP if idle else STEP))
            now_ms = (time.monotonic() - t0) * 1e3
            busy = await self._host_round(now_ms)
            idle = not (busy or self.moved)
            if now_ms - last_tick >= 1000.0:
                last_tick = now_ms
                await self.driver.tick(now_ms)
                # QPs the transport moved to error (retry exhaustion, a fatal NAK): the CM
                # disconnects them, which frees them for new connections (host/cm.py).
                await self.cm.reap_errors(await self.driver.qp_errors())
            if self.timer is not None and now_ms - last_stats >= 1000.0:
                last_stats = now_ms
                await self._write_stats()
        self._out(self.vl.run(4 * STEP))
        self.log(f"frames {self.srv.counts}; host {self.counts}; cm {self.cm.stats}; "
                 f"simulated {self.vl.cycle} cycles in {time.monotonic() - t0:.1f} s")
        if self.transport is not None:
            self.log(f"UDP host link: {self.udplink.stats}; transport {self.transport.stats}")
        if self.timer is not None:
            await self._write_stats(final=True)
        else:
            await self._log_counters()
        self.srv.stop()
        self.vl.close()


def run_gateware(opts, log=print):
    """Build (if needed) and serve until stopped; returns an exit status."""
    served = Served(opts, log=log)
    try:
        asyncio.run(served.run())
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    from sim.vltarget import build
    build(SHIPPED)

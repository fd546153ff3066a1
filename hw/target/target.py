# Ref: hw/iface.py (architecture, register map).
#      roce-layouts.md §1-§6 (what the blocks implement); hw/target/regbank.py (host map).
"""The whole target in one gateware top: GMII in, GMII out, a host bus, target memory.

Data flow::

    GMII rx -> GmiiMac.rx -> EthIpRx -+-> arp  -> ArpResponder ------------------+
                 |                    +-> roce -> QpFilter -> IcrcCheck           |
                 |                                -> RoceRxParser                 |
                                                  -> RespDemux -+-> Responder --+ |
                                                                +-> Requester -+| |
    TxPath (src 0 responder through AckHold, src 1 requester) <----------------++ |
                        -> RoceTxBuilder -> IcrcInsert -> EthIpTx.roce            |
                                                          EthIpTx.arp <-----------+
                                        EthIpTx.o -> FrameMux -> GmiiMac.tx -> GMII tx
                 |                                       ^
                 +-> (tap) RawQueues: QP1 frames -> host  +-- host frames (RawQueues.tx)
                 +-> (tap) UdpHostLink: UDP 19272  ------+-- its responses
                                  |
                 host (UART link) +-> HostBusArbiter -> HostBusRegister -> HostDecoder -> registers

Memory: MemArbiter(5) = responder, requester (READ response data), TxPath (payload reads),
host port, KBTP engine -> MemRam(mem_words).

Consumers (``engine=True``, the default)::

    Responder.notify -> KbtpEngine.notify;  KbtpEngine.hostq -> HostQueues Q_NOTIFY (slow path)
    KbtpEngine.wr, HostQueues Q_WR -> RecordMerge (wr_id bit 15 := source) -> Requester.wr
    Requester.wc -> wr_id bit 15 ? HostQueues Q_WC (bit cleared) : KbtpEngine.wc
    KbtpEngine.repost, HostQueues Q_REPOST -> RecordMerge -> Responder.repost

so the host's work-request ids are 15 bits. With the engine's fast path disabled (its CTRL
reset value) every message goes to the host, as with ``engine=False``, where the host queues
are wired straight to the responder and requester. The engine's registers are at REG_KBTP
(map in :mod:`hw.kbtp.engine`).

Host map (``host`` port, :class:`~hw.target.hostlink.HostBusSignature`):
``Space.REG`` REG_TOP (see :data:`TOP_COUNTERS`), REG_QP (QpTable), REG_MR (MrTable),
REG_TRANSPORT (responder counters, then requester counters at REG_TRANSPORT + 0x100, see
:data:`REQ_COUNTERS`, followed by :data:`REQ_STATUS`: the bitmap of QPs in error, and the
number of times a QP went to error, e.g. on retry exhaustion); REG_KBTP the engine;
``Space.MEM`` target memory; ``Space.QUEUE`` queues 0-3 (:mod:`hw.target.regbank`) and the raw
frame queues 4 = ``Q_RAW_RX`` (pop) and 5 = ``Q_RAW_TX`` (push) of :mod:`hw.rdma.rawq` (word
formats there); REG_UDPLINK the UDP host link's configuration and counters.

UDP host link (issue 23, :mod:`hw.target.udplink`; with ``udp_link=True``, off by default and not
yet in the board builds): the host bus has two masters, the ``host``
port (the UART link of the board) and :class:`~hw.target.udplink.UdpHostLink`, which takes the
host-link frames from UDP datagrams to port 19272 (it sees every received frame on a tap, like
the raw queues, and does its own filtering; EthIpRx drops these frames and counts them under
``port``) and sends its responses through the transmit mux. It is disabled at reset: the host
enables it over the UART (REG_UDPLINK ``ctrl``) once it has set the host's MAC, IP and port.

QP1 / CM slow path (:mod:`hw.rdma.rawq`): every received frame is also seen by RawQueues, which
keeps the UDP/4791 frames to our MAC/IP whose BTH Dest QP is 1 (whole frame, Ethernet header
through ICRC) for the host; QpFilter removes those packets from the RC path before the ICRC
check. Frames the host pushes (complete, without FCS) join the MAC transmit stream between two
frames of the RC path (FrameMux at the EthIpTx output, at the datapath width).
"""

from types import SimpleNamespace

from amaranth import Cat, Module, Mux, Signal
from amaranth.lib import data, fifo, wiring
from amaranth.lib.wiring import In, Out

from hw.iface import (HostBusSignature, REG_KBTP, REG_MR, REG_QP, REG_TOP, REG_TRANSPORT,
                     REG_UDPLINK, MSG_HEAD_OCTETS, RecvNotify, RecvRepost, Space,
                     WorkRequest)
from hw.net.icrc import IcrcCheck, IcrcInsert
from hw.kbtp.engine import KbtpEngine, ranges_for, read_window_for
from hw.lib.stream import (FrameStream, PacketStream, RecordMerge, RegisterSlice,
                           frame_from_packets)
from hw.net.ip import EthIpRx, EthIpTx
from hw.net.arp import ArpResponder
from hw.net.mac import GmiiMac
from hw.lib.membus import MemArbiter, MemRam
from hw.lib.stream import FrameMux
from hw.rdma.rawq import QpFilter, RawQueues, Q_RAW_RX, Q_RAW_TX
from hw.rdma.qp import MR_STRIDE, QP_STRIDE, CounterBank, MrTable, QpTable
from hw.target.regbank import (HostDecoder, HostMemPort, HostQueues, TopRegs)
from hw.target.udplink import HostBusArbiter, HostBusRegister, UdpHostLink
from hw.rdma.requester import RespDemux, Requester
from hw.rdma.responder import COUNTERS as RESP_COUNTERS
from hw.rdma.responder import Responder
from hw.rdma.roce_hdr import RoceRxParser, RoceTxBuilder
from hw.rdma.resp_common import RespTx
from hw.rdma.txpath import AckHold, TxPath, connect_fields

__all__ = ["KbtpTarget", "TOP_COUNTERS", "RESP_COUNTERS", "REQ_COUNTERS", "REQ_STATUS",
           "REQ_COUNTER_BASE", "HOST_WR_TAG", "MAC_COUNTERS"]

#: REG_TOP counters, in register order (REG_TOP + TOP_COUNTER_BASE + 4 * k): (block, port).
TOP_COUNTERS = (
    [("mac", n) for n in ("rx_frames_ok", "rx_fcs_errors", "rx_runts", "rx_errors",
                          "rx_overflows", "tx_frames", "tx_underruns")]
    + [("ethrx", f"cnt_{n}") for n in EthIpRx.COUNTERS]
    + [("arp", "cnt_answered"), ("arp", "cnt_ignored"),
       ("icrc", "cnt_ok"), ("icrc", "cnt_bad"), ("icrc", "cnt_overflow"),
       ("prs", "cnt_packets"), ("prs", "cnt_bad_opcode"), ("prs", "cnt_malformed"),
       ("bld", "cnt_packets"), ("txp", "cnt_packets"),
       ("ethtx", "cnt_roce"), ("ethtx", "cnt_arp")]
    # Raw frame queues (QP1 / CM slow path), hw/rdma/rawq.py.
    + [("rawq", "cnt_rx_frames"), ("rawq", "cnt_rx_drops"), ("rawq", "cnt_tx_frames"),
       ("rawq", "cnt_tx_drops"), ("qpf", "cnt_dropped")])

REQ_COUNTERS = ("cnt_timeouts", "cnt_seq_naks", "cnt_rnr_naks", "cnt_retransmits", "cnt_stale",
                "cnt_src_mismatch")
REQ_COUNTER_BASE = REG_TRANSPORT + 0x100
#: Read after REQ_COUNTERS: QPs in error (bit i = QP i; ``qp_error_hi`` bit i = QP 32 + i),
#: error events (count).
REQ_STATUS = ("qp_error", "qp_error_hi", "error_events")
#: Bit of WorkRequest.wr_id that marks a host work request (set by the merge, cleared on return).
HOST_WR_TAG = 1 << 15
#: The MAC's counters among TOP_COUNTERS, in order (``mac_counters`` ports with ``mac=False``).
MAC_COUNTERS = tuple(port for blk, port in TOP_COUNTERS if blk == "mac")

#: Octets of a frame the MAC buffers before it starts sending it (cut-through transmit, issue
#: 21; hw/net/mac.py GmiiMac ``tx_start``), for the one-clock target with its own GMII MAC.
#: The TX path's source is the memory bus, 8 octets a cycle against the line's one (any width,
#: one 125 MHz clock), on which it comes right after the receive path (MemArbiter ``urgent``),
#: and its DMA reader keeps up to 32 words ahead (hw/lib/dma.py): 16 octets plus the preamble
#: cover the cycles before its first words come. tests/hw/net/test_mac.py shows the start
#: rule; ``make bench`` counts ``tx_underruns`` in every series.
MAC_TX_START = 16
#: Cycles at most a plain transport ACK waits while the engine may still answer (hw/rdma/
#: txpath.py AckHold), so that a LOAD's RDMA WRITE or a STORE's COMPLETION is not sent behind
#: the ACK of its request: the engine hands them over 12 to 70 cycles after the ACK at 64
#: octets in the one-clock targets, an inline STORE of 1024 octets 293 (1.3 cycles an octet
#: at width 8; tools/bench.py, latency). A hold that ends just before the answer puts the ACK
#: in its way (256 cost such a STORE 40 cycles), so the bound is the largest inline STORE's
#: copy and more: 8192 cycles, 66 us at 125 MHz, against the initiator's ACK timeout of
#: milliseconds. 0: no hold (the ECPIX-5 core, whose answers come after the ACK has left).
ACK_HOLD = 8192
#: Single-packet messages whose first octets wait on chip for the engine (the responder's
#: MsgHead, hw/iface.py), in a FIFO beside the RecvNotify FIFO.
HEAD_DEPTH = 16


class KbtpTarget(wiring.Component):
    """RoCEv2 RC target (responder + requester) over GMII, host-configured.

    Parameters
    ----------
    width : int
        Internal datapath width in bits (8 or 64).
    n_qp, n_mr : int
        QP and MR table sizes.
    mem_words : int
        Target memory size in 8-octet words.
    init : list of int
        Initial memory words (little-endian lanes).
    ram : wiring.Component, optional
        The target memory behind the memory arbiter (its ``bus`` a
        :class:`~hw.iface.MemBusSignature` target of ``mem_words`` words); default a one-cycle
        :class:`~hw.lib.membus.MemRam` holding ``init``. A board passes its own
        (boards/ram.py PipelinedRam).
    clk_hz, timer_scale : float, int
        Requester timers (see :class:`~hw.rdma.requester.Requester`).
    own_mac, own_ip : int
        Reset values of the own-address registers.
    raw_rx_octets, raw_tx_octets, raw_rx_frames : int
        Sizes of the raw frame queues (:class:`~hw.rdma.rawq.RawQueues`).
    notify_depth : int
        Depth of the RecvNotify FIFO in front of the engine (default 16 per QP). The host must
        post no more receive buffers in all (sum of the QPs' ``recv_count``) than this.
    mac_depth : int
        Octets of the MAC's transmit frame buffer (``mac=True``; a power of two): the largest
        frame is path MTU 4096 + 82 octets of headers, so 8192.
    mac_tx_start : int or None
        Cut-through transmit (:class:`~hw.net.mac.GmiiMac` ``tx_start``): octets of a frame in
        the MAC's transmit buffer before it starts on the wire; None: store-and-forward.
        Default :data:`MAC_TX_START`. With ``mac=False`` the MAC outside reads it from here
        (boards.cores.KbtpCore). Cut-through, the TX path's payload reads come on the memory
        bus right after the receive path's (MemArbiter ``urgent``): a frame on the wire cannot
        wait for the round robin.
    mac_rx_cut_through : bool
        Cut-through receive (:class:`~hw.net.mac.GmiiMac` ``rx_cut_through``; default True):
        the MAC passes a frame's octets on as they come and gives its verdict on the last
        beat; the ICRC check is the commit point (issue 21). With ``mac=False`` the MAC
        outside reads it from here (boards.cores.KbtpCore); ``rx`` is a FrameStream either way.
    ack_hold : int
        Cycles at most a plain transport ACK of the responder waits while the engine may still
        answer (:class:`~hw.rdma.txpath.AckHold`; default :data:`ACK_HOLD`; 0: none), so that
        the engine's answer to a request goes on the wire before the request's ACK. Without
        the engine (``engine=False``) an ACK waits only AckHold's ``grace`` cycles, or for the
        requester's next packet.
    mac_rx_depth : int
        Octets of the MAC's receive frame buffer (a power of two; ``mac=False``: of the MAC
        outside). The engine keeps no more RDMA READ data out than it holds besides one largest
        frame (:func:`~hw.kbtp.engine.read_window_for`): READ responses come back at line rate
        whatever the core drains, and one dropped for want of room waits for the QP's
        retransmission timer.
    n_ranges : int or None
        The engine's RANGE registers (handle ranges it authorizes LOADs in); None (default):
        :func:`~hw.kbtp.engine.ranges_for` ``n_qp``, one per QP and at least 16, which a host
        driver of ``n_qp`` QPs assumes unless told otherwise.
    mac : bool
        ``True`` (default): the GMII MAC is inside and the ports are GMII pins. ``False``: no
        MAC; the frame streams and the MAC's counters are ports instead (for a MAC in another
        clock domain, e.g. boards.cores.KbtpCore).

    Ports
    -----
    rxd : In(8), rx_dv, rx_er : In(1); txd : Out(8), tx_en, tx_er : Out(1)
        GMII (``mac=True``).
    rx : In(FrameStream(width)), tx : Out(PacketStream(width))
        ``mac=False``: received frames without FCS (``err`` on a bad frame's last beat: a MAC
        that cuts through; a store-and-forward MAC's good frames with ``err`` 0,
        :func:`~hw.lib.stream.frame_from_packets`), frames to send without FCS (what
        :class:`~hw.net.mac.GmiiMac` hands over / takes). ``rx`` must not be stalled by more
        than the MAC's receive buffer allows (the raw queues tap it without back-pressure).
    mac_counters : In(32).array(len(MAC_COUNTERS))
        ``mac=False``: the MAC's counters (:data:`MAC_COUNTERS` order) for REG_TOP.
    host : In(HostBusSignature)

    Attributes
    ----------
    engine : bool
        KBTP engine in the consumer path (see the module docstring).
    udp_link : bool
        The UDP host link beside the ``host`` port (see the module docstring); off by default.
    """

    def __init__(self, width=8, n_qp=2, mem_words=8192, *, n_mr=4, init=(), clk_hz=125e6,
                 timer_scale=1, sq_depth=8, own_mac=0, own_ip=0, icrc_depth=None,
                 queue_depth=16, engine=True, n_ranges=None, raw_rx_octets=4096,
                 raw_tx_octets=4096, raw_rx_frames=16, notify_depth=None, mac=True,
                 mac_depth=8192, mac_rx_depth=32768, mac_tx_start=MAC_TX_START, ram=None,
                 udp_link=False, mac_rx_cut_through=True, ack_hold=ACK_HOLD):
        self.width, self.n_qp, self.n_mr, self.mem_words = width, n_qp, n_mr, mem_words
        self.ack_hold = ack_hold
        self.init = list(init)
        self.clk_hz, self.timer_scale, self.sq_depth = clk_hz, timer_scale, sq_depth
        self.own_mac, self.own_ip = own_mac, own_ip
        # Largest packet (PMTU 4096 + headers) in beats, with margin for two queued packets.
        self.icrc_depth = icrc_depth or max(64, 2 * (4096 + 64) // (width // 8))
        self.queue_depth = queue_depth
        self.engine = engine
        self.n_ranges = ranges_for(n_qp, n_ranges)
        #: Receive buffers the host may post in all (sum of recv_count over the QPs).
        self.notify_depth = notify_depth or 16 * n_qp
        self.mac_depth, self.mac_rx_depth = mac_depth, mac_rx_depth
        self.mac_tx_start = mac_tx_start
        self.mac_rx_cut_through = mac_rx_cut_through
        self.raw = dict(rx_octets=raw_rx_octets, tx_octets=raw_tx_octets,
                        rx_frames=raw_rx_frames)
        self.mac = mac
        #: The UDP host link (hw/target/udplink.py) as a second host-bus master. Off by
        #: default: the board builds do not carry it yet (issue 23: its place and route and the
        #: simulated serve over it come next).
        self.udp_link = udp_link
        if mac:
            ports = {"rxd": In(8), "rx_dv": In(1), "rx_er": In(1),
                     "txd": Out(8), "tx_en": Out(1), "tx_er": Out(1)}
        else:
            ports = {"rx": In(FrameStream(width)), "tx": Out(PacketStream(width)),
                     "mac_counters": In(32).array(len(MAC_COUNTERS)),
                     "mac_rx_backlog": In(1)}
        super().__init__({**ports, "host": In(HostBusSignature())})
        self.ram = ram if ram is not None else MemRam(mem_words, init=self.init)

    def elaborate(self, platform):
        m = Module()
        w, nq = self.width, self.n_qp
        sm = m.submodules
        if self.mac:
            sm.mac = mac = GmiiMac(w, rx_depth=self.mac_rx_depth, tx_depth=self.mac_depth,
                                   tx_start=self.mac_tx_start,
                                   rx_cut_through=self.mac_rx_cut_through)
        else:
            # The MAC lives outside: its user-side streams and counters are our ports.
            mac = SimpleNamespace(rx=wiring.flipped(self.rx), tx=wiring.flipped(self.tx),
                                  rx_backlog=self.mac_rx_backlog,
                                  **dict(zip(MAC_COUNTERS, self.mac_counters)))
        sm.ethrx = ethrx = EthIpRx(w)
        sm.arp = arp = ArpResponder(w)
        sm.icrc = icrc = IcrcCheck(w, depth=self.icrc_depth)
        sm.prs = prs = RoceRxParser(w)
        sm.dmx = dmx = RespDemux(w)
        sm.resp = resp = Responder(w, nq)
        sm.req = req = Requester(w, nq, self.sq_depth, self.clk_hz, self.timer_scale)
        sm.txp = txp = TxPath(w, 2, nq)
        sm.bld = bld = RoceTxBuilder(w)
        sm.icrcins = icrcins = IcrcInsert(w)
        sm.ethtx = ethtx = EthIpTx(w)
        sm.qpt = qpt = QpTable(nq)
        sm.mrt = mrt = MrTable(self.n_mr, n_qp=nq)
        # The responder (0) and the requester (1, READ responses) place what the wire brings:
        # first, so that they keep pace with the line (MemArbiter ``urgent``). The responder (0,
        # its AtomicUnit through the responder's own mux, which copies the whole request) and
        # the engine (4, its ring allocator through the engine's MemArbiter) lock the bus for a
        # read-modify-write of a word (MemArbiter ``locking``); the other masters leave ``lock``
        # undriven, and it is ignored.
        # The TX path (2) too when the MAC sends cut-through (``mac_tx_start``): a frame that
        # has started on the wire must get its payload at the line's rate. Its demand is the
        # line's too, in bursts of at most a frame (what the MAC's transmit buffer takes ahead).
        urgent = (0, 1) if self.mac_tx_start is None else (0, 1, 2)
        sm.arb = arb = MemArbiter(5 if self.engine else 4, urgent=urgent,
                                  locking=(0, 4) if self.engine else (0,))
        sm.ram = ram = self.ram
        sm.top = top = TopRegs(len(TOP_COUNTERS), own_mac=self.own_mac, own_ip=self.own_ip)
        sm.rcnt = rcnt = CounterBank(len(RESP_COUNTERS), base=REG_TRANSPORT)
        sm.qcnt = qcnt = CounterBank(len(REQ_COUNTERS) + len(REQ_STATUS), base=REQ_COUNTER_BASE)
        sm.hmem = hmem = HostMemPort(self.mem_words * 8)
        sm.hq = hq = HostQueues(self.queue_depth)
        sm.rawq = rawq = RawQueues(w, **self.raw)
        sm.qpf = qpf = QpFilter(w)
        sm.txmux = txmux = FrameMux(w, 3 if self.udp_link else 2)
        if self.udp_link:
            sm.udplink = udplink = UdpHostLink(w)
            sm.hostarb = hostarb = HostBusArbiter(2)
            sm.hostreg = hostreg = HostBusRegister()
        windows = [
            [(Space.REG, REG_TOP, 0x1000)],
            [(Space.REG, REG_QP, QP_STRIDE * nq)],
            [(Space.REG, REG_MR, MR_STRIDE * self.n_mr)],
            [(Space.REG, REG_TRANSPORT, 4 * len(RESP_COUNTERS))],
            [(Space.REG, REQ_COUNTER_BASE, 4 * (len(REQ_COUNTERS) + len(REQ_STATUS)))],
            [(Space.MEM, 0, 1 << 32)],
            [(Space.QUEUE, 0, 4)],
            [(Space.QUEUE, Q_RAW_RX, Q_RAW_TX - Q_RAW_RX + 1)],
        ]
        if self.engine:
            sm.eng = eng = KbtpEngine(nq, self.n_ranges, base=REG_KBTP,
                                      read_window=read_window_for(self.mac_rx_depth))
            windows.append([(Space.REG, REG_KBTP, 0x1000)])
        if self.udp_link:
            windows.append([(Space.REG, REG_UDPLINK, 0x1000)])
        sm.dec = dec = HostDecoder(windows)

        # GMII pins.
        if self.mac:
            m.d.comb += [mac.rxd.eq(self.rxd), mac.rx_dv.eq(self.rx_dv),
                         mac.rx_er.eq(self.rx_er), self.txd.eq(mac.txd),
                         self.tx_en.eq(mac.tx_en), self.tx_er.eq(mac.tx_er)]

        # Own addresses.
        for blk in (ethrx, arp, ethtx, rawq) + ((udplink,) if self.udp_link else ()):
            m.d.comb += [blk.own_mac.eq(top.own_mac), blk.own_ip.eq(top.own_ip)]
        m.d.comb += icrcins.own_ip.eq(top.own_ip)

        # Receive path.
        if isinstance(mac, GmiiMac) and not self.mac_rx_cut_through:
            frame_from_packets(m, mac.rx, ethrx.i)
        else:
            wiring.connect(m, mac.rx, ethrx.i)
        wiring.connect(m, ethrx.arp, arp.i)
        wiring.connect(m, arp.o, ethtx.arp)
        wiring.connect(m, ethrx.roce, qpf.i)
        wiring.connect(m, qpf.o, icrc.i)
        # The raw RX queue sees every beat the MAC hands over (it never stalls).
        m.d.comb += [rawq.tap.valid.eq(ethrx.i.valid & ethrx.i.ready),
                     rawq.tap.payload.eq(ethrx.i.payload)]
        if self.udp_link:       # so does the UDP host link (its input is always ready)
            m.d.comb += [udplink.i.valid.eq(ethrx.i.valid & ethrx.i.ready),
                         udplink.i.payload.eq(ethrx.i.payload)]
        # Register slices (skid buffers: valid, data and ready all from flops) where two
        # streaming blocks' combinational paths added up to the core clock's longest paths
        # (tools/depth.py on the ECPIX-5 netlist): the ICRC check's buffer -> the parser (and,
        # through its ready, the demultiplexer and the memory writers behind it); the TX
        # builder -> the ICRC inserter; the frame multiplexer -> the MAC. One cycle each.
        sm.rx_slice = rx_slice = RegisterSlice(signature=icrc.o.signature)
        wiring.connect(m, icrc.o, rx_slice.i)
        wiring.connect(m, rx_slice.o, prs.i)
        wiring.connect(m, prs.hdr, dmx.hdr)
        wiring.connect(m, prs.payload, dmx.payload)
        wiring.connect(m, dmx.resp_hdr, resp.hdr)
        wiring.connect(m, dmx.resp_payload, resp.payload)
        wiring.connect(m, dmx.req_hdr, req.rsp_hdr)
        wiring.connect(m, dmx.req_payload, req.rsp_payload)

        # Transmit path.
        if self.ack_hold:
            sm.ack_hold = hold = AckHold(RespTx, self.ack_hold)
            wiring.connect(m, resp.tx, hold.i)
            connect_fields(m, hold.o, txp.src[0])
            m.d.comb += hold.other.eq(txp.src[1].valid & txp.src[1].ready)
        else:
            connect_fields(m, resp.tx, txp.src[0])
        wiring.connect(m, req.tx, txp.src[1])
        wiring.connect(m, txp.hdr, bld.hdr)
        wiring.connect(m, txp.payload, bld.payload)
        sm.bld_slice = bld_slice = RegisterSlice(signature=bld.o.signature)
        wiring.connect(m, bld.o, bld_slice.i)
        wiring.connect(m, bld_slice.o, icrcins.i)
        wiring.connect(m, icrcins.o, ethtx.roce)
        wiring.connect(m, ethtx.o, txmux.i[0])
        wiring.connect(m, rawq.tx, txmux.i[1])
        if self.udp_link:
            wiring.connect(m, udplink.o, txmux.i[2])
        sm.tx_slice = tx_slice = RegisterSlice(w)
        wiring.connect(m, txmux.o, tx_slice.i)
        wiring.connect(m, tx_slice.o, mac.tx)

        # QP / MR tables.
        # QP table: one memory copy per reader (registered read ports), and the load event to
        # both engines.
        wiring.connect(m, resp.cfg, qpt.resp)
        wiring.connect(m, req.intake, qpt.intake)
        wiring.connect(m, req.cfg, qpt.req)
        wiring.connect(m, txp.cfg, qpt.tx)
        for unit in (resp, req):
            m.d.comb += [unit.load_valid.eq(qpt.load_valid), unit.load_qp.eq(qpt.load_qp),
                         unit.load_row.eq(qpt.load_row)]
        wiring.connect(m, resp.mr, mrt.lookup)
        m.d.comb += resp.rx_backlog.eq(mac.rx_backlog)
        m.d.comb += [mrt.inv_valid.eq(resp.mr_inv_valid), mrt.inv_rkey.eq(resp.mr_inv_rkey),
                     resp.mr_inv_found.eq(mrt.inv_found)]

        # Memory.
        wiring.connect(m, resp.mem, arb.masters[0])
        wiring.connect(m, req.mem, arb.masters[1])
        wiring.connect(m, txp.mem, arb.masters[2])
        wiring.connect(m, hmem.mem, arb.masters[3])
        wiring.connect(m, arb.bus, ram.bus)

        # Consumers: the engine (fast path) in front of the host queues (slow path), or the host.
        if self.engine:
            wiring.connect(m, eng.mem, arb.masters[4])
            # RecvNotify FIFO, as deep as the receive buffers the host may post (notify_depth):
            # the responder then never waits for the engine. Without it a serial engine waiting
            # for the ACK of its own Send stalls the responder on the next notify, and the
            # in-order RespDemux holds that ACK behind it: a deadlock.
            n_note = data.Layout.cast(RecvNotify).size
            sm.nfy = nfy = fifo.SyncFIFOBuffered(width=n_note + 1, depth=self.notify_depth)
            # Beside it, the first octets of up to HEAD_DEPTH single-packet messages (the
            # responder's MsgHead): the engine decodes those without reading them back from the
            # receive buffer. A notify whose head finds this FIFO full goes without one
            # (``notify_head_ok`` 0), and the engine reads the buffer as before.
            sm.nhd = nhd = fifo.SyncFIFOBuffered(width=8 * MSG_HEAD_OCTETS, depth=HEAD_DEPTH)
            with_head = resp.notify_head.ok & nhd.w_rdy
            m.d.comb += [nfy.w_data.eq(Cat(resp.notify.payload, with_head)),
                         nfy.w_en.eq(resp.notify.valid), resp.notify.ready.eq(nfy.w_rdy),
                         nhd.w_data.eq(resp.notify_head.octets),
                         nhd.w_en.eq(resp.notify.valid & nfy.w_rdy & with_head),
                         eng.notify.payload.eq(nfy.r_data[:n_note]),
                         eng.notify_head_ok.eq(nfy.r_data[n_note]),
                         eng.notify.valid.eq(nfy.r_rdy), nfy.r_en.eq(eng.notify.ready),
                         eng.head.payload.eq(nhd.r_data), eng.head.valid.eq(nhd.r_rdy),
                         nhd.r_en.eq(eng.head.ready)]
            wiring.connect(m, eng.hostq, hq.notify)
            sm.wrm = wrm = RecordMerge(WorkRequest, 2, tag="wr_id")
            wiring.connect(m, eng.wr, wrm.i[0])
            wiring.connect(m, hq.wr, wrm.i[1])
            wiring.connect(m, wrm.o, req.wr)
            if self.ack_hold:
                # An answer may come: a notify waiting, a request in the engine, a
                # WorkRequest into the requester or a packet out of it.
                m.d.comb += hold.expect.eq(nfy.r_rdy | eng.busy | wrm.o.valid | req.tx.valid)
            sm.rpm = rpm = RecordMerge(RecvRepost, 2)
            wiring.connect(m, eng.repost, rpm.i[0])
            wiring.connect(m, hq.repost, rpm.i[1])
            wiring.connect(m, rpm.o, resp.repost)
            # The engine holds a QP's next message while the host works on one of it.
            m.d.comb += [eng.host_done.eq(hq.repost.valid & hq.repost.ready),
                         eng.host_done_qp.eq(hq.repost.payload.qp)]
            # (a register stage: the WorkCompletion's decode in the engine, its locks, scratch
            # slots and context queue, ran on from the requester's FIFO in one cycle, among
            # the ECPIX-5 core clock's deepest paths, tools/depth.py)
            sm.wc_slice = wcs = RegisterSlice(signature=req.wc.signature)
            wiring.connect(m, req.wc, wcs.i)
            wc = wcs.o
            to_host = wc.payload.wr_id[15]
            m.d.comb += [eng.wc.payload.eq(wc.payload), hq.wc.payload.eq(wc.payload),
                         hq.wc.payload.wr_id[15].eq(0),
                         eng.wc.valid.eq(wc.valid & ~to_host),
                         hq.wc.valid.eq(wc.valid & to_host),
                         wc.ready.eq(Mux(to_host, hq.wc.ready, eng.wc.ready))]
        else:
            wiring.connect(m, resp.notify, hq.notify)
            wiring.connect(m, hq.repost, resp.repost)
            wiring.connect(m, hq.wr, req.wr)
            wiring.connect(m, req.wc, hq.wc)

        # Host bus.
        if self.udp_link:
            wiring.connect(m, wiring.flipped(self.host), hostarb.masters[0])
            wiring.connect(m, udplink.bus, hostarb.masters[1])
            wiring.connect(m, hostarb.target, hostreg.up)
            wiring.connect(m, hostreg.down, dec.host)
        else:
            wiring.connect(m, wiring.flipped(self.host), dec.host)
        slaves = [top.bus, qpt.bus, mrt.bus, rcnt.bus, qcnt.bus, hmem.bus, hq.bus, rawq.bus]
        if self.engine:
            slaves.append(eng.bus)
        if self.udp_link:
            slaves.append(udplink.regs)
        for k, slave in enumerate(slaves):
            wiring.connect(m, dec.slaves[k], slave)
        blocks = {"mac": mac, "ethrx": ethrx, "arp": arp, "icrc": icrc, "prs": prs, "bld": bld,
                  "txp": txp, "ethtx": ethtx, "rawq": rawq, "qpf": qpf}
        for k, (blk, port) in enumerate(TOP_COUNTERS):
            m.d.comb += top.counters[k].eq(getattr(blocks[blk], port))
        for k, name in enumerate(RESP_COUNTERS):
            m.d.comb += rcnt.counters[k].eq(getattr(resp, name))
        for k, name in enumerate(REQ_COUNTERS):
            m.d.comb += qcnt.counters[k].eq(getattr(req, name))
        # Retry exhaustion (and every other move to error) is visible to the host: the QP's bit
        # here, an error count, and the failed WorkCompletion's status in Q_WC.
        error_events = Signal(32)
        with m.If(req.error_event):
            m.d.sync += error_events.eq(error_events + 1)
        qp_error = Signal(64)
        m.d.comb += [qp_error.eq(req.qp_error),
                     qcnt.counters[len(REQ_COUNTERS)].eq(qp_error[:32]),
                     qcnt.counters[len(REQ_COUNTERS) + 1].eq(qp_error[32:]),
                     qcnt.counters[len(REQ_COUNTERS) + 2].eq(error_events)]
        return m

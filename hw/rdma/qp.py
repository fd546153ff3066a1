# Ref: roce-layouts.md §1.4 (UDP source port), §1.5 (PMTU codes), §6 (PSNs, retry counters);
#      hw/iface.py (QpConfig, MrEntry, REG_QP, REG_MR); hw/target/hostlink.py (HostBusSignature).
"""Host-written QP and memory-region tables.

Both tables are :class:`~hw.target.hostlink.HostBusSignature` targets that answer only inside
their own window of ``Space.REG`` (so a top level may OR the ``ack``/``err``/``rdata`` of
several targets: outside its window a table drives all three low). Inside the window an
address that names no register is answered with ``ack`` + ``err`` in the cycle of the request.
Every register reads back. Fields narrower than 32 bits read back zero-extended; writes ignore
the upper bits. The MR table answers in the cycle of the request (a ``qp_mask`` write may wait,
:class:`MrTable`); the QP table, whose rows are in memories, one cycle later (:class:`QpTable`).

QP register map (QP ``i`` at ``REG_QP + 0x40 * i``: 64 QPs end at REG_MR; word offsets)::

    0x00 state           QpState; a write raises the load event of QP i (PSN reload)
    0x04 local_qpn       24 bits; found by index (qpn - QPN_BASE) mod 2**QP_INDEX_BITS (qp_match)
    0x08 remote_qpn      24 bits
    0x0C peer_mac_hi     peer MAC bits 47:32
    0x10 peer_mac_lo     peer MAC bits 31:0
    0x14 peer_ip         IPv4 address (big-endian value, 10.0.0.1 = 0x0A000001)
    0x18 udp_sport       16 bits
    0x1C pmtu            IB MTU code (1 = 256 ... 5 = 4096)
    0x20 rq_psn          first PSN expected from the peer
    0x24 sq_psn          first PSN sent
    0x28 timeout         5-bit local ACK timeout code
    0x2C retry_cnt       3 bits
    0x30 rnr_retry       3 bits
    0x34 recv_base       target-memory address of receive buffer 0
    0x38 recv_count      number of receive buffers
    0x3C recv_size_log2  each receive buffer is 2**recv_size_log2 octets

MR register map (MR ``j`` at ``REG_MR + 0x40 * j``; word offsets)::

    0x00 control         bit 0 valid, bit 1 read, bit 2 write, bit 3 atomic
    0x04 qp_mask_lo      bit i: QP table index i (0..31) may use this region
    0x08 rkey
    0x0C va_hi           Tagged Offset bits 63:32
    0x10 va_lo           Tagged Offset bits 31:0
    0x14 length          octets
    0x18 laddr           target-memory address of ``va``
    0x1C qp_mask_hi      bit i: QP table index 32 + i may use this region
"""

from amaranth import Cat, Module, Mux, Signal
from amaranth.lib import enum, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from hw.iface import (ADDR_BITS, HostBusSignature, QP_INDEX_BITS, QpConfig,
                     QpIntakeCfg, QpReadSignature, QpRespCfg, QpState, QpTxCfg, REG_MR, REG_QP,
                     REG_TRANSPORT, ReqCfg, Space, qp_subset)

__all__ = ["QpTable", "MrTable", "CounterBank", "MrLookupSignature", "MrAccess", "MrError",
           "QP_REGS", "MR_REGS", "qp_match", "QP_STRIDE", "MR_STRIDE", "RESPONDER_COUNTERS_BASE"]

#: Where the responder's counters sit (REG_TRANSPORT + 4 * index of responder.COUNTERS); the
#: requester's may follow from REG_TRANSPORT + 0x100.
RESPONDER_COUNTERS_BASE = REG_TRANSPORT

QP_STRIDE = 0x40
MR_STRIDE = 0x40

#: QP register word offset -> (field path, low bit of the field held by the word, bits).
QP_REGS = {
    0x00: ("state", 0, 3), 0x04: ("local_qpn", 0, 24), 0x08: ("remote_qpn", 0, 24),
    0x0C: ("peer_mac", 32, 16), 0x10: ("peer_mac", 0, 32), 0x14: ("peer_ip", 0, 32),
    0x18: ("udp_sport", 0, 16), 0x1C: ("pmtu", 0, 3), 0x20: ("rq_psn", 0, 24),
    0x24: ("sq_psn", 0, 24), 0x28: ("timeout", 0, 5), 0x2C: ("retry_cnt", 0, 3),
    0x30: ("rnr_retry", 0, 3), 0x34: ("recv_base", 0, 32), 0x38: ("recv_count", 0, 8),
    0x3C: ("recv_size_log2", 0, 5),
}
#: MR register word offset -> (field path, low bit, bits); 0x00 packs valid + rights.
MR_REGS = {
    0x04: ("qp_mask", 0, 32), 0x08: ("rkey", 0, 32), 0x0C: ("va", 32, 32),
    0x10: ("va", 0, 32), 0x14: ("length", 0, 32), 0x18: ("laddr", 0, 32),
    0x1C: ("qp_mask", 32, 32),
}


class MrAccess(enum.Enum, shape=2):
    READ = 0
    WRITE = 1
    ATOMIC = 2


class MrError(enum.Enum, shape=2):
    NONE = 0
    BAD_KEY = 1         # no valid region with this R_Key usable by this QP
    RANGE = 2           # [va, va + length) not inside the region
    RIGHTS = 3          # region does not grant the access kind


class MrLookupSignature(wiring.Signature):
    """Lookup port, seen from the asker. Inputs are sampled every cycle; the answer to the
    inputs of cycle t is on ``ok``/``laddr``/``error`` in cycle t + 2 (two register stages:
    the key match, then the range and rights; :class:`MrTable`)."""

    def __init__(self):
        super().__init__({
            "rkey": Out(32), "va": Out(64), "length": Out(32), "qp": Out(QP_INDEX_BITS),
            "access": Out(MrAccess),
            "ok": In(1), "laddr": In(ADDR_BITS), "error": In(MrError),
        })


def qp_match(row, qpn):
    """``row`` (a view with ``local_qpn`` and ``state``, read at ``qp_index_of(qpn)``,
    hw/iface.py QPN_BASE) is the QP of local QPN ``qpn``: its ``local_qpn`` is ``qpn`` and its
    state is not RESET (a zero QPN register must not capture QPN 0 traffic). One compare,
    whatever the QP count."""
    return (row.local_qpn == qpn) & (row.state != QpState.RESET)


def _field(view, path):
    v = getattr(view, path)
    return v.as_value() if hasattr(v, "as_value") else v


class QpTable(wiring.Component):
    """Host-writable :data:`~hw.iface.QpConfig` of ``n_qp`` queue pairs, in memories.

    Copies (each one memory of ``n_qp`` rows, one write port, one registered read port):
    ``full`` (QpConfig, 254 bits: host read-back and read-modify-write), ``resp``
    (:data:`~hw.iface.QpRespCfg`, 107 bits), ``intake`` (:data:`~hw.iface.QpIntakeCfg`, 56),
    ``tx`` (:data:`~hw.iface.QpTxCfg`, 120) and ``req`` (:data:`~hw.iface.ReqCfg`, 14: the
    requester's control FSM reads it at its QP with the QP's record, which is in a memory with
    a registered read too). A reader port's ``data`` is the row at its ``addr`` of the previous
    cycle; every row starts all zero (RESET). A write of row i in cycle t: a port addressing
    row i in cycle t gets the old row (in t + 1), from cycle t + 1 on the new one (in t + 2).

    Host access: the word's QP index comes from the address bits (stride 0x40), its field from
    the word offset, decoded once. The request cycle reads row i of ``full``; the next cycle
    answers (``ack``): a read returns the field, a write merges the field into the row and
    writes the merged row into ``full`` and its subsets into every copy. A write of ``state``
    then raises the load event in the following cycle: ``load_valid`` for one cycle with
    ``load_qp`` and the merged row in ``load_row`` (every memory already holds it).

    Ports
    -----
    bus : In(HostBusSignature)      register map in the module docstring
    resp, intake, tx, req : In(QpReadSignature(...))   reader ports (addr in, data out)
    load_valid : Out(1), load_qp : Out(QP_INDEX_BITS), load_row : Out(QpConfig)
    """

    COPIES = {"resp": QpRespCfg, "intake": QpIntakeCfg, "tx": QpTxCfg, "req": ReqCfg}

    def __init__(self, n_qp):
        if not 1 <= n_qp <= 1 << QP_INDEX_BITS:
            raise ValueError(f"n_qp {n_qp} out of range")
        self.n_qp = n_qp
        super().__init__({
            "bus": In(HostBusSignature()),
            **{name: In(QpReadSignature(layout)) for name, layout in self.COPIES.items()},
            "load_valid": Out(1), "load_qp": Out(QP_INDEX_BITS), "load_row": Out(QpConfig),
        })

    def elaborate(self, platform):
        m = Module()
        bus, nq = self.bus, self.n_qp
        ib = max(1, (nq - 1).bit_length())

        # Decode once: QP index from the address bits, register from the word offset.
        in_win = (bus.space == Space.REG) & (bus.addr >= REG_QP) & \
            (bus.addr < REG_QP + QP_STRIDE * nq)
        rel = Signal(32)
        qp = Signal(ib)
        word = Signal(4)                                # word offset / 4 within the stride
        m.d.comb += [rel.eq(bus.addr - REG_QP), qp.eq(rel[6:6 + ib]), word.eq(rel[2:6])]
        known = (rel[0:2] == 0) & (word < len(QP_REGS))  # QP_REGS: every word 0x00..0x3C

        m.submodules.full = full = Memory(shape=QpConfig, depth=nq, init=[])
        hrd = full.read_port()
        m.d.comb += hrd.addr.eq(qp)                     # the bus holds its address until ack
        row, merged = Signal(QpConfig), Signal(QpConfig)
        m.d.comb += [row.eq(hrd.data), merged.eq(row)]
        with m.Switch(word):
            for off, (path, lo, bits) in QP_REGS.items():
                with m.Case(off >> 2):
                    m.d.comb += _field(merged, path)[lo:lo + bits].eq(bus.wdata[:bits])
        we = Signal()
        wports = [(full.write_port(), QpConfig)]
        for name, layout in self.COPIES.items():
            m.submodules[name] = mem = Memory(shape=layout, depth=nq, init=[])
            rp = mem.read_port()
            port = getattr(self, name)
            m.d.comb += [rp.addr.eq(port.addr), port.data.eq(rp.data)]
            wports.append((mem.write_port(), layout))
        for wp, layout in wports:
            m.d.comb += [wp.en.eq(we), wp.addr.eq(qp),
                         wp.data.eq(merged if layout is QpConfig else qp_subset(layout, merged))]

        m.d.sync += self.load_valid.eq(0)
        with m.FSM():
            with m.State("IDLE"):
                with m.If(in_win & (bus.re | bus.we)):
                    with m.If(known):
                        m.next = "ANSWER"
                    with m.Else():
                        m.d.comb += [bus.ack.eq(1), bus.err.eq(1)]
            with m.State("ANSWER"):                     # row i of `full` is in hrd.data
                m.d.comb += bus.ack.eq(1)
                m.next = "IDLE"
                with m.If(bus.re):
                    with m.Switch(word):
                        for off, (path, lo, bits) in QP_REGS.items():
                            with m.Case(off >> 2):
                                m.d.comb += bus.rdata.eq(_field(row, path)[lo:lo + bits])
                with m.Else():
                    m.d.comb += we.eq(1)
                    with m.If(word == 0):
                        m.d.sync += [self.load_valid.eq(1), self.load_qp.eq(qp),
                                     self.load_row.eq(merged)]
        return m


def _eq_cut(m, a, b, name):
    """``a == b`` from 2-bit compares kept as nets of their own, one LUT4 each. Without the
    cut, yosys (0.70, synth_ecp5/abc9) maps MrTable's eight 32-bit compares against one shared
    R_Key to ~65 LUT4 each; with it, to 22 (16 compares + the AND tree)."""
    pairs = Signal((len(a) + 1) // 2, name=name, attrs={"keep": 1})
    m.d.comb += [pairs[k].eq(a[2 * k:2 * k + 2] == b[2 * k:2 * k + 2])
                 for k in range(len(pairs))]
    return pairs.all()


class MrTable(wiring.Component):
    """Host-writable :data:`~hw.iface.MrEntry` table of ``n_mr`` regions plus a lookup port.

    Lookup: the region whose ``valid`` is set, whose ``rkey`` equals the asked R_Key and whose
    ``qp_mask`` has the asking QP's bit (lowest index wins); then ``va >= region.va`` and
    ``va + length <= region.va + region.length`` (``length`` 0 is inside whenever ``va`` is in
    ``[region.va, region.va + region.length]``), then the right for ``access``.
    ``laddr = region.laddr + (va - region.va)``. Error precedence: BAD_KEY, RANGE, RIGHTS.
    Two register stages: the key match of cycle t sees ``valid``, ``rkey`` and ``qp_mask`` of
    cycle t and registers the region it picks; cycle t + 1 reads that region's ``va``,
    ``length``, ``laddr`` and rights as they are then and registers the answer (in t + 2).

    An ``inv_valid`` strobe clears ``valid`` of every region whose ``rkey`` is ``inv_rkey``
    (SEND with Invalidate); ``inv_found`` says (combinationally, whether or not ``inv_valid``
    is high) that a valid region has R_Key ``inv_rkey``. The compare sees the table of before
    the cycle; a host write of a region's control word in the cycle that invalidates it keeps
    its rights but not its ``valid``.

    ``qp_mask`` has ``n_qp`` bits; mask bits of higher QPs written by the host are dropped and
    read back 0. Every host access is answered in the cycle of the request, but for one case:
    above :attr:`MASK_RAM_ABOVE` QPs, a write of a ``qp_mask`` word waits (up to 8 cycles) while
    the previous one is still being copied into the mask memories (see Storage).

    Storage: flip-flops hold what every region must show at once, for the key match and the
    invalidate: ``valid`` and ``rkey``, and ``qp_mask`` up to :attr:`MASK_RAM_ABOVE` QPs. Above,
    each region's ``qp_mask`` is a LUT RAM of 4-bit rows read at the asking QP (a row of
    flip-flops per region would need a 64:1 multiplexer each); a host write of a mask word is
    copied in, a row a cycle over 8 cycles, from a holding register that answers for that word
    of that region meanwhile, so a lookup sees the new mask from the cycle after the write as
    before. ``va``, ``length``, ``laddr`` and the rights sit in LUT RAM read combinationally at
    the region matched the cycle before. The host reads back every word from another LUT RAM, a
    copy of the register words as written (each cut to its field's width), except ``valid``,
    taken from its flip-flop. Memories keep their contents over a domain reset (the flip-flops
    clear, so every region is then invalid).

    Ports
    -----
    bus : In(HostBusSignature)
    lookup : In(MrLookupSignature)
    inv_valid : In(1), inv_rkey : In(32), inv_found : Out(1)
    """

    #: Lookup LUT RAMs: name -> (register word offset, bits); ``rights`` are control bits 3:1.
    _LOOKUP_WORDS = {"va_hi": (0x0C, 32), "va_lo": (0x10, 32), "length": (0x14, 32),
                     "laddr": (0x18, ADDR_BITS), "rights": (0x00, 3)}

    #: Above this many QPs ``qp_mask`` is in LUT RAM: at 16 QPs either costs about the same
    #: (yosys synth_ecp5, 8 regions: 789 LUT4 in flip-flops, 757 LUT4 + 8 DPR16X4 in RAM); at
    #: 64, 1114 against 783 + 8 DPR16X4, and 472 fewer flip-flops.
    MASK_RAM_ABOVE = 16

    def __init__(self, n_mr, n_qp=1 << QP_INDEX_BITS):
        if not 1 <= n_qp <= 1 << QP_INDEX_BITS:
            raise ValueError(f"n_qp {n_qp} out of range")
        self.n_mr, self.n_qp = n_mr, n_qp
        super().__init__({
            "bus": In(HostBusSignature()),
            "lookup": In(MrLookupSignature()),
            "inv_valid": In(1), "inv_rkey": In(32), "inv_found": Out(1),
        })

    def _word_bits(self, off):
        """Bits of register word ``off`` that hold a field (the rest read 0)."""
        if off == 0x00:
            return 0b1110                               # rights; valid is a flip-flop
        path, lo, bits = MR_REGS[off]
        width = {"qp_mask": self.n_qp, "rkey": 32, "va": 64, "length": 32,
                 "laddr": ADDR_BITS}[path]
        return (1 << max(0, min(bits, width - lo))) - 1

    def elaborate(self, platform):
        m = Module()
        bus, lk, n, nq = self.bus, self.lookup, self.n_mr, self.n_qp
        mask_ram = nq > self.MASK_RAM_ABOVE

        valid = Signal(n)
        rkey = [Signal(32, name=f"rkey{j}") for j in range(n)]

        # Host bus: the window is a power-of-two span of strides aligned on itself, so the
        # region index and the word are address bits, each decoded once (no subtraction).
        ib = max(1, (n - 1).bit_length())
        span = (MR_STRIDE << ib).bit_length() - 1       # log2 of the span
        assert REG_MR % (1 << span) == 0, (REG_MR, n)
        idx, word = bus.addr[6:6 + ib], bus.addr[2:5]   # words 0x00..0x1C; 0x20..0x3C refused
        in_win = (bus.space == Space.REG) & (bus.addr[span:] == REG_MR >> span) & (idx < n)
        access = in_win & (bus.re | bus.we)
        known = (bus.addr[0:2] == 0) & ~bus.addr[5]
        mask_word = Signal()                            # qp_mask_lo, or qp_mask_hi past 32 QPs
        m.d.comb += mask_word.eq((word == 0x04 >> 2) | ((word == 0x1C >> 2) & (nq > 32)))
        copying = Signal()                              # a mask word is going into LUT RAM
        wait = Signal()                                 # ... and another one must wait
        host_we = Signal()
        m.d.comb += [wait.eq(copying & known & bus.we & mask_word),
                     bus.ack.eq(access & ~wait), bus.err.eq(access & ~known),
                     host_we.eq(access & known & bus.we & ~wait)]

        # Read-back copy of every register word, as written and cut to its field.
        m.submodules.words = words = Memory(shape=32, depth=8 * n, init=[])
        wmask = Signal(32)
        with m.Switch(word):
            for off in sorted(set(MR_REGS) | {0x00}):
                with m.Case(off >> 2):
                    m.d.comb += wmask.eq(self._word_bits(off))
        w_rd, w_wr = words.read_port(domain="comb"), words.write_port()
        m.d.comb += [w_rd.addr.eq(Cat(word, idx)), w_wr.addr.eq(Cat(word, idx)),
                     w_wr.data.eq(bus.wdata & wmask), w_wr.en.eq(host_we)]
        with m.If(access & known & bus.re):
            m.d.comb += bus.rdata.eq(w_rd.data | (valid.bit_select(idx, 1) & (word == 0)))

        # Lookup copy of va, length, laddr and the rights, read at the matched region.
        sel = Signal(range(n))
        lkd = {}
        for name, (off, bits) in self._LOOKUP_WORDS.items():
            m.submodules[name] = mem = Memory(shape=bits, depth=n, init=[])
            rp, wp = mem.read_port(domain="comb"), mem.write_port()
            data = bus.wdata[1:4] if name == "rights" else bus.wdata[:bits]
            m.d.comb += [rp.addr.eq(sel), wp.addr.eq(idx), wp.data.eq(data),
                         wp.en.eq(host_we & (word == off >> 2))]
            lkd[name] = rp.data

        for j in range(n):
            with m.If(host_we & (idx == j)):
                with m.Switch(word):
                    with m.Case(0x00 >> 2):
                        m.d.sync += valid[j].eq(bus.wdata[0])
                    with m.Case(0x08 >> 2):
                        m.d.sync += rkey[j].eq(bus.wdata)

        # Invalidate (after the bus write statements: a same-cycle host write of control loses).
        for j in range(n):
            with m.If(valid[j] & _eq_cut(m, rkey[j], self.inv_rkey, f"inv_eq{j}")):
                m.d.comb += self.inv_found.eq(1)
                with m.If(self.inv_valid):
                    m.d.sync += valid[j].eq(0)

        # The asking QP's bit of each region's qp_mask.
        if mask_ram:
            mask_bits = self._mask_ram(m, host_we & mask_word, idx, word == 0x1C >> 2,
                                       bus.wdata & wmask, copying)
        else:
            mask_bits = []
            for j in range(n):
                qp_mask = Signal(nq, name=f"qp_mask{j}")
                with m.If(host_we & (idx == j) & (word == 0x04 >> 2)):
                    m.d.sync += qp_mask[:32].eq(bus.wdata)
                if nq > 32:
                    with m.If(host_we & (idx == j) & (word == 0x1C >> 2)):
                        m.d.sync += qp_mask[32:].eq(bus.wdata)
                mask_bits.append(qp_mask.bit_select(lk.qp, 1))

        # Lookup, stage 1: the key match, registered with the inputs stage 2 needs. (In one
        # stage the R_Key compare, the priority pick, the LUT RAM read at the pick, the 65-bit
        # subtraction and the range compare were the core clock's longest path in the ECPIX-5
        # build of 045cda2: 22.25 ns over 47 cells.)
        found, m_sel, m_found = Signal(), Signal(range(n)), Signal()
        for j in reversed(range(n)):
            key = _eq_cut(m, rkey[j], lk.rkey, f"key_eq{j}")
            with m.If(valid[j] & key & mask_bits[j]):
                m.d.comb += [m_sel.eq(j), m_found.eq(1)]
        va, length, access = Signal(64), Signal(32), Signal(MrAccess)
        m.d.sync += [sel.eq(m_sel), found.eq(m_found), va.eq(lk.va), length.eq(lk.length),
                     access.eq(lk.access)]
        # Stage 2, at the region picked: off = va - region.va, once; inside when it does not
        # borrow, fits 32 bits and off + length <= region.length (33-bit sum: no wrap).
        off = Signal(65)
        end = Signal(33)
        m.d.comb += [off.eq(va - Cat(lkd["va_lo"], lkd["va_hi"])),
                     end.eq(off[:32] + length)]
        in_range = ~off[64] & (off[32:64] == 0) & (end <= lkd["length"])
        rights = lkd["rights"]
        right = Mux(access == MrAccess.READ, rights[0],
                    Mux(access == MrAccess.WRITE, rights[1], rights[2]))
        err = Signal(MrError)
        with m.If(~found):
            m.d.comb += err.eq(MrError.BAD_KEY)
        with m.Elif(~in_range):
            m.d.comb += err.eq(MrError.RANGE)
        with m.Elif(~right):
            m.d.comb += err.eq(MrError.RIGHTS)
        m.d.sync += [lk.ok.eq(err == MrError.NONE), lk.error.eq(err),
                     lk.laddr.eq(lkd["laddr"] + off[:ADDR_BITS])]
        return m

    def _mask_ram(self, m, we, idx, hi, wdata, copying):
        """``qp_mask`` in LUT RAM (class docstring, Storage): ``we`` takes mask word ``hi`` of
        region ``idx`` (``wdata``, cut to the field) into the holding register, from which
        the next 8 cycles (``copying``) write it, a 4-bit row a cycle, into the region's
        memory (word w in rows 8w..8w+7). Returns the asking QP's bit of each region."""
        n, nq, qp = self.n_mr, self.n_qp, self.lookup.qp
        hold_j, hold_hi = Signal(range(n)), Signal()
        hold, row = Signal(32), Signal(3)
        with m.If(we):
            m.d.sync += [copying.eq(1), hold_j.eq(idx), hold_hi.eq(hi), hold.eq(wdata),
                         row.eq(0)]
        with m.Elif(copying):
            m.d.sync += row.eq(row + 1)
            with m.If(row == 7):
                m.d.sync += copying.eq(0)
        # Rows past the QP count hold zeros, but with 8 rows QP 32 + i would alias QP i.
        qp_in = qp < nq if nq <= 32 else 1
        held_bit = hold.bit_select(qp[:5], 1)
        bits = []
        for j in range(n):
            m.submodules[f"mask{j}"] = mem = Memory(shape=4, depth=16 if nq > 32 else 8,
                                                    init=[])
            rp, wp = mem.read_port(domain="comb"), mem.write_port()
            m.d.comb += [rp.addr.eq(qp[2:]), wp.addr.eq(Cat(row, hold_hi)),
                         wp.data.eq(hold.word_select(row, 4)),
                         wp.en.eq(copying & (hold_j == j))]
            held = copying & (hold_j == j) & (qp[5] == hold_hi)
            bits.append(qp_in & Mux(held, held_bit, rp.data.bit_select(qp[:2], 1)))
        return bits


class CounterBank(wiring.Component):
    """Read-only 32-bit registers at ``base + 4 * k`` showing ``counters[k]``.

    Same bus rules as the tables: silent outside ``[base, base + 4 * n)``, writes inside are
    refused with ``err``. Typical use: ``CounterBank(len(COUNTERS))`` with ``counters[k]``
    driven by ``getattr(responder, COUNTERS[k])``.

    Ports
    -----
    bus : In(HostBusSignature)
    counters : In(32).array(n)
    """

    def __init__(self, n, base=RESPONDER_COUNTERS_BASE):
        self.n, self.base = n, base
        super().__init__({"bus": In(HostBusSignature()), "counters": In(32).array(n)})

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        in_win = (bus.space == Space.REG) & (bus.addr >= self.base) & \
            (bus.addr < self.base + 4 * self.n)
        with m.If(in_win & (bus.re | bus.we)):
            m.d.comb += [bus.ack.eq(1), bus.err.eq(bus.we | (bus.addr[0:2] != 0))]
            for k in range(self.n):
                with m.If(bus.re & (bus.addr[2:] == (self.base >> 2) + k)):
                    m.d.comb += bus.rdata.eq(self.counters[k])
        return m

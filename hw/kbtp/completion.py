# Ref: draft KBTP §Completion (COMPLETION message, Completion Record written with RDMA Write
#      with Immediate, Send with Invalidate), §Session Establishment (RECORD_COMPLETION);
#      docs/layouts.md; model/target.py "Readings of the draft" 9-10.
"""The KBTP engine's completion of a request: the COMPLETION message or the Completion Record.

It owns the rule that picks the form (a record by WRITE_IMM when the request asks for one, its
session was granted RECORD_COMPLETION and the request decoded; else a COMPLETION Send, with
Invalidate when asked), the octets of both (built from hw/headers.py's layouts into the QP's
SCRATCH buffer by a :class:`~hw.kbtp.movers.BufferWriter`), the WorkRequest that carries them,
and the fallback of a failed record write to a COMPLETION Send (model Readings 10). The
WorkRequest goes out on ``wr`` to the engine's :class:`~hw.kbtp.movers.WorkIssuer`, which
reports on ``wr_done`` / ``wr_ok`` the record's WorkCompletion (the engine waits for it: a
failed record falls back to a Send) or the Send's hand-over to the requester (nobody waits for
its WorkCompletion, issue 20; the slot it carries stays taken until then).
"""

from amaranth.hdl import Cat, Const, Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from hw.headers import CommonHeader, CompletionBody, CompletionRecord, KBTP_VERSION, Opcode
from hw.iface import ADDR_BITS, MemBusSignature, WorkRequest, WrOp
from hw.kbtp.decode import REQUEST, RESULT
from hw.kbtp.movers import WR_SCRATCH, WR_SYNC, BufferWriter
from hw.lib.membus import be_field

__all__ = ["Completion"]

_SEND_SIZE = CommonHeader.SIZE + CompletionBody.SIZE      # 40 octets


class Completion(wiring.Component):
    """Completion of one request (see the module docstring).

    Ports
    -----
    start : In(1)           the request is finished: ``req`` / ``result`` / ``granted`` /
                            ``scratch`` hold until ``done``
    req : In(REQUEST), result : In(RESULT)
    granted : In(1)         the session was granted RECORD_COMPLETION
    scratch : In(ADDR_BITS) a free SCRATCH slot of the QP (it moves on when a WorkRequest
                            carrying the slot is issued)
    done : Out(1)           the record's WorkCompletion came back OK, or the COMPLETION Send was
                            handed to the requester (its WorkCompletion frees the SCRATCH slot;
                            nobody waits for it)
    mem : Out(MemBusSignature())
    wr : Out(stream.Signature(WorkRequest)), wr_done : In(1), wr_ok : In(1)
    """

    def __init__(self):
        super().__init__({"start": In(1), "req": In(REQUEST), "result": In(RESULT),
                          "granted": In(1), "scratch": In(ADDR_BITS), "done": Out(1),
                          "mem": Out(MemBusSignature()),
                          "wr": Out(stream.Signature(WorkRequest)),
                          "wr_done": In(1), "wr_ok": In(1)})

    def elaborate(self, platform):
        m = Module()
        req, res = self.req, self.result
        m.submodules.writer = writer = BufferWriter(_SEND_SIZE // 8)
        wiring.connect(m, wiring.flipped(self.mem), writer.mem)
        m.d.comb += writer.addr.eq(self.scratch)

        R = CompletionRecord
        rec = Signal(8 * R.SIZE)
        for name, value in (("request_id", req.request_id), ("status", res.status),
                            ("generation", res.gen), ("data_length", res.dlen),
                            ("block_offset", res.boff)):
            m.d.comb += be_field(rec, R.SIZE, R, name).eq(value)
        H, B, T = CommonHeader, CompletionBody, _SEND_SIZE
        msg = Signal(8 * T)
        for struct, name, value, base in (
                (H, "version", KBTP_VERSION, 0), (H, "opcode", Opcode.COMPLETION.value, 0),
                (H, "request_id", req.request_id, 0), (H, "handle", req.handle, 0),
                (H, "generation", res.gen, 0), (H, "status", res.status, 0),
                (B, "data_length", res.dlen, H.SIZE), (B, "block_offset", res.boff, H.SIZE)):
            m.d.comb += be_field(msg, T, struct, name, base).eq(value)

        inv = ~res.raw & req.inval
        wr = self.wr.payload

        def carry(name, *wr_fields):
            """States WRITE_<name> (the writer fills SCRATCH), WR_<name> (the WorkRequest that
            carries it goes out), <name>_WC (its WorkCompletion), then <name>_DONE."""
            with m.State(f"WRITE_{name}"):
                with m.If(writer.done):
                    m.next = f"WR_{name}"
            with m.State(f"WR_{name}"):
                m.d.comb += [self.wr.valid.eq(1), wr.laddr.eq(self.scratch), *wr_fields]
                with m.If(self.wr.ready):
                    m.next = f"{name}_WC"
            with m.State(f"{name}_WC"):
                with m.If(self.wr_done):
                    m.next = f"{name}_DONE"

        with m.FSM() as fsm:
            # (the writer takes ``data`` at its start: the record in IDLE, else the Send)
            m.d.comb += writer.data.eq(Mux(fsm.ongoing("IDLE"),
                                           Cat(Const(0, 8 * (T - R.SIZE)), rec), msg))
            with m.State("IDLE"):
                with m.If(self.start & ~res.raw & req.record & self.granted):
                    m.d.comb += [writer.start.eq(1), writer.words.eq(R.SIZE // 8)]
                    m.next = "WRITE_REC"
                with m.Elif(self.start):
                    m.next = "SEND_BUILD"

            # -------- record: WRITE_IMM of the Completion Record
            carry("REC", wr.wr_id.eq(WR_SYNC | WR_SCRATCH), wr.op.eq(WrOp.WRITE_IMM),
                  wr.rkey.eq(req.cd_stag), wr.va.eq(req.cd_to),
                  wr.length.eq(R.SIZE), wr.imm.eq(req.request_id[:32]))
            with m.State("REC_DONE"):
                # A failed record write falls back to a COMPLETION Send (model Readings 10).
                with m.If(self.wr_ok):
                    m.d.comb += self.done.eq(1)
                    m.next = "IDLE"
                with m.Else():
                    m.next = "SEND_BUILD"

            # -------- COMPLETION Send (with Invalidate)
            with m.State("SEND_BUILD"):
                m.d.comb += [writer.start.eq(1), writer.words.eq(T // 8)]
                m.next = "WRITE_SEND"
            carry("SEND", wr.wr_id.eq(WR_SCRATCH), wr.op.eq(Mux(inv, WrOp.SEND_INV, WrOp.SEND)),
                  wr.inv_rkey.eq(Mux(inv, req.dd_stag, 0)), wr.length.eq(T))
            with m.State("SEND_DONE"):
                m.d.comb += self.done.eq(1)
                m.next = "IDLE"
        return m

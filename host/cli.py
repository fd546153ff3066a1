# Ref: draft KBTP §Messages, §Session Establishment, §Target Memory Structures; layouts.md
"""``kbtp``: decode (and encode) KBTP messages and memory structures from the command line.

Usage::

    kbtp decode [--addr-le] [--max-inline N] [--block-size N]
                [--struct {message,entry,slot,record}] HEX...   # '-' reads stdin
    kbtp encode [--addr-le] JSON                                  # '-' reads stdin

``decode`` prints the fields as indented JSON (:func:`host.codec.to_json_dict`) and exits 0.
``encode`` takes that JSON back and prints the wire bytes as hex. Any bad input prints one line,
``kbtp: error: <field>: <message> (status <STATUS>)``, on stderr and exits 2.
"""

import argparse
import json
import string
import sys

from hw.headers import Status
from host import codec

EXIT_ERROR = 2


class _Fail(Exception):
    """A user-facing error: one line on stderr, exit 2."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports usage errors on one line, like every other error of the tool."""

    def error(self, message):
        raise _Fail(f"usage: {message} (try 'kbtp --help')")


def _int_arg(text):
    try:
        value = int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {text!r}")
    return value


def _read_text(parts):
    if parts == ["-"]:
        return sys.stdin.read()
    return " ".join(parts)


def parse_hex(text):
    """Octets from hex text: whitespace and ':' separators and a leading '0x' are allowed.

    Raises
    ------
    codec.KbtpError
        Field ``input``: empty, an odd number of digits, or a non-hex character.
    """
    compact = "".join(ch for ch in text if not ch.isspace() and ch != ":")
    if compact[:2].lower() == "0x":
        compact = compact[2:]
    if not compact:
        raise codec.KbtpError("input", "no hex digits given")
    for pos, ch in enumerate(compact):
        if ch not in string.hexdigits:
            raise codec.KbtpError("input", f"{ch!r} at digit {pos} is not a hex digit", ch)
    if len(compact) % 2:
        raise codec.KbtpError("input", f"odd number of hex digits ({len(compact)})",
                              len(compact))
    return bytes.fromhex(compact)


def _decode(args):
    raw = parse_hex(_read_text(args.hex))
    if args.struct == "message":
        value = codec.decode(raw, addr_le=args.addr_le, max_inline=args.max_inline,
                             block_size=args.block_size)
    elif args.struct == "entry":
        value = codec.decode_entry(raw, addr_le=args.addr_le)
    elif args.struct == "slot":
        value = codec.RingSlotValue(*codec.decode_slot(raw, addr_le=args.addr_le))
    else:
        value = codec.decode_record(raw)
    out = codec.to_json_dict(value)
    if args.struct == "message":
        out["octets"] = len(raw)
    return json.dumps(out, indent=2)


def _encode(args):
    text = _read_text(args.json)
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as err:
        raise codec.KbtpError("input", f"not JSON: {err.msg} at line {err.lineno} column "
                              f"{err.colno}") from None
    value = codec.from_json_dict(obj)
    if isinstance(value, codec.TableEntryValue):
        raw = codec.encode_entry(value.flags, value.generation, value.data_length,
                                 value.block_offset, addr_le=args.addr_le)
    elif isinstance(value, codec.RingSlotValue):
        raw = codec.encode_slot(value.sequence, value.block_offset, addr_le=args.addr_le)
    elif isinstance(value, codec.CompletionRecordValue):
        raw = codec.encode_record(value.request_id, value.status, value.generation,
                                  value.data_length, value.block_offset)
    else:
        raw = codec.encode(value, addr_le=args.addr_le)
    return raw.hex()


def build_parser():
    """The argument parser (exposed for documentation and tests)."""
    parser = _Parser(prog="kbtp", description="KBTP message codec.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    dec = sub.add_parser("decode", help="decode hex octets to JSON")
    dec.add_argument("hex", nargs="+", help="hex octets (spaces/colons allowed), or '-' for stdin")
    dec.add_argument("--addr-le", action="store_true", help="ADDR_LE was negotiated")
    dec.add_argument("--max-inline", type=_int_arg, metavar="N", help="target's Max Inline")
    dec.add_argument("--block-size", type=_int_arg, metavar="N", help="target's Block Size")
    dec.add_argument("--struct", choices=("message", "entry", "slot", "record"),
                     default="message", help="what the octets are (default: message)")
    dec.set_defaults(run=_decode)
    enc = sub.add_parser("encode", help="encode JSON (as printed by decode) to hex")
    enc.add_argument("json", nargs="+", help="a JSON object, or '-' for stdin")
    enc.add_argument("--addr-le", action="store_true", help="ADDR_LE was negotiated")
    enc.set_defaults(run=_encode)
    return parser


def main(argv=None):
    """Entry point of the ``kbtp`` console script; returns the exit status."""
    try:
        args = build_parser().parse_args(argv)
        print(args.run(args))
    except codec.KbtpError as err:
        print(f"kbtp: error: {err} (status {err.status.name})", file=sys.stderr)
        return EXIT_ERROR
    except _Fail as err:
        print(f"kbtp: error: {err} (status {Status.MALFORMED.name})", file=sys.stderr)
        return EXIT_ERROR
    except (OSError, ValueError, TypeError) as err:   # last resort: never a traceback
        print(f"kbtp: error: input: {err} (status {Status.MALFORMED.name})", file=sys.stderr)
        return EXIT_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())


# --------------------------------------------------------------------------------------------
# ``kbtp driver``: the host driver on a board (host/driver.py over host/link.py's UartLink).
# Appended: it wraps build_parser, so the sub-command exists for the ``kbtp`` console script
# (``python -m host.cli`` runs main() above before this point).
# --------------------------------------------------------------------------------------------

#: How ``kbtp driver`` opens its link (tests replace it): ``(port, baud) -> UartLink``.
def _open_link(port, baud):
    from host.link import UartLink
    return UartLink(port, baud=baud)


#: How ``kbtp driver --link udp`` opens its link (tests replace it): ``(args) -> UdpLink``.
def _open_udp_link(args):
    from host.udplink import UdpLink
    return UdpLink.open(args.target_ip, host_port=args.host_port, host_ip=args.host_ip or "",
                        target_port=args.target_port, timeout=args.timeout,
                        retries=args.retries)


def _link_opener(args):
    """A function opening the link ``kbtp driver`` / ``kbtp top`` run on: ``--link uart``
    (``--port``) or ``--link udp`` (``--target-ip``, ``--host-port``); the options are checked
    here, the link is opened when it is called."""
    if args.link == "udp":
        if not args.target_ip or args.host_port is None:
            raise _Fail("--link udp needs --target-ip and --host-port")
        return lambda: _open_udp_link(args)
    if not args.port:
        raise _Fail("--link uart needs --port DEV")
    return lambda: _open_link(args.port, args.baud)


def _driver_config(args):
    from host.config import TargetConfig
    fields = json.loads(args.config) if args.config else {}
    if not isinstance(fields, dict):
        raise _Fail("--config must be a JSON object of model.target.TargetConfig fields")
    try:
        return TargetConfig(**fields)
    except TypeError as err:
        raise _Fail(f"--config: {err}") from None


def _qp_spec(text):
    """``N:key=value,...`` (QpConfig names; ints in any base, peer_mac/peer_ip as text)."""
    qp, _, rest = text.partition(":")
    out = {}
    for item in filter(None, rest.split(",")):
        key, _, value = item.partition("=")
        out[key.strip()] = value.strip() if key.strip() in ("peer_mac", "peer_ip") \
            else int(value, 0)
    return int(qp, 0), out


def _driver_json(obj):
    if isinstance(obj, dict):
        return {("/".join(map(str, k)) if isinstance(k, tuple) else str(k)): _driver_json(v)
                for k, v in obj.items()}
    return obj


async def _udp_link_setup(args, port):
    """``kbtp driver link``: set the target's UDP endpoint up (given the host's address), or
    turn it off (``--disable``); print its state."""
    from host import udplink
    given = [args.host_mac, args.host_ip, args.host_port]
    if args.disable:
        await port.wreg(udplink.REG_UDPLINK + udplink.UDPLINK_REGS["ctrl"], 0)
    elif any(v is not None and v != "" for v in given):
        if not all(v is not None and v != "" for v in given):
            raise _Fail("link: give all of --host-mac, --host-ip and --host-port (or none, to "
                        "read the endpoint's state)")
        try:
            await udplink.setup_target(port, host_mac=args.host_mac, host_ip=args.host_ip,
                                       host_port=args.host_port)
        except ValueError as err:
            raise _Fail(f"link: {err}") from None
    return json.dumps(await udplink.target_state(port), indent=2)


def _driver(args):
    import asyncio
    from host.driver import KbtpDriver
    from host.port import TargetPort, link_access

    cfg = _driver_config(args)
    open_link = _link_opener(args)

    async def go():
        link = open_link()
        if args.action == "link":
            return await _udp_link_setup(args, TargetPort(link_access(link)))
        drv = KbtpDriver(TargetPort(link_access(link)), cfg, n_qp=args.n_qp,
                         mem_size=args.mem_size, fast_path=not args.no_fast_path,
                         n_ranges=args.n_ranges, mr_base=args.mr_base, n_mr=args.n_mr)
        if args.action == "init" or args.init:
            await drv.init()
            print(f"kbtp driver: initialized {drv.lay['size']} octets "
                  f"(table {drv.lay['table']:#x}, ring {drv.lay['ring']:#x}, "
                  f"pool {drv.lay['pool']:#x}); plan {drv.plan}", flush=True)
            if drv.fast_off_reasons:
                print("kbtp driver: every request is served by this host, not the engine: "
                      + "; ".join(drv.fast_off_reasons), file=sys.stderr, flush=True)
        if args.action == "counters":
            return json.dumps(_driver_json(await drv.counters()), indent=2)
        if args.action == "serve":
            for spec in args.qp or ():
                qp, qcfg = spec
                await drv.open_qp(qp, **qcfg)
            for qp in args.attach or ():
                await drv.open_qp(qp, program=False)
            handled = 0
            while args.count is None or handled < args.count:
                done = await drv.poll_all(max_messages=None if args.count is None
                                          else min(drv.max_messages, args.count - handled))
                if not done:
                    await drv.tick()
                    continue
                for res in done:
                    handled += 1
                    acts = ", ".join(a[0] for a in res.actions) or "nothing sent"
                    print(f"qp{res.qp} {res.op} -> {res.status or '-'}: {acts}", flush=True)
            return f"kbtp driver: {handled} slow-path messages handled"
        return "kbtp driver: done"

    try:
        return asyncio.run(go())
    except _Fail:
        raise
    except Exception as err:        # a link or target failure: one line, exit 2
        print(f"kbtp: error: driver: {type(err).__name__}: {err}", file=sys.stderr)
        raise SystemExit(EXIT_ERROR) from None


def _link_args(p):
    """The options that choose and open the host link (``driver``, ``top``)."""
    from host import udplink
    p.add_argument("--link", choices=("uart", "udp"), default="uart",
                   help="host link: uart (default; --port) or udp (--target-ip, --host-port)")
    p.add_argument("--port", help="uart: serial device or pyserial URL, e.g. /dev/ttyUSB1")
    p.add_argument("--baud", type=_int_arg, default=115200, help="uart: baud rate")
    p.add_argument("--target-ip", help="udp: the target's IPv4 address")
    p.add_argument("--host-ip", help="udp: local address to bind (default: any)")
    p.add_argument("--host-port", type=_int_arg,
                   help="udp: local UDP port, the one the target is configured to accept")
    p.add_argument("--target-port", type=_int_arg, default=udplink.HOSTLINK_UDP_PORT,
                   help="udp: the target's host-link UDP port (default %(default)s)")
    p.add_argument("--timeout", type=float, default=udplink.TIMEOUT,
                   help="udp: seconds before a request is retransmitted (default %(default)s)")
    p.add_argument("--retries", type=_int_arg, default=udplink.RETRIES,
                   help="udp: retransmissions before giving up (default %(default)s)")


_build_codec_parser = build_parser


def build_parser():     # noqa: F811 - extends the codec parser above with ``driver``
    """The argument parser (codec sub-commands + ``driver``)."""
    parser = _build_codec_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    drv = sub.add_parser(
        "driver", help="run the KBTP host driver on a board over its host link (UART or UDP)",
        description="KBTP host driver over the board's host link: the UART (--port) or UDP "
                    "on the target's Ethernet port (--link udp --target-ip --host-port). "
                    "init: write table, rings, counters and pool into target memory and program "
                    "the engine; serve: handle slow-path messages (HELLO, FREE, BIND, GOODBYE, "
                    "...) until interrupted, printing one line per message; counters: print the "
                    "engine's and the driver's figures as JSON; link: bring-up of the UDP host "
                    "link over the UART (with --host-mac, --host-ip, --host-port: point the "
                    "target's endpoint at this host and enable it), then print its registers "
                    "and counters as JSON.")
    drv.add_argument("action", choices=("init", "serve", "counters", "link"))
    _link_args(drv)
    drv.add_argument("--config", metavar="JSON",
                     help="model.target.TargetConfig fields as a JSON object "
                          "(default: TargetConfig())")
    drv.add_argument("--n-qp", type=_int_arg, default=2, help="QPs of the target (default 2)")
    drv.add_argument("--mem-size", type=_int_arg, help="target memory in octets (checked)")
    drv.add_argument("--no-fast-path", action="store_true",
                     help="leave the engine off: the driver executes every request")
    drv.add_argument("--n-ranges", type=_int_arg,
                     help="engine RANGE registers (default: a target of --n-qp QPs has "
                          "max(16, n_qp))")
    drv.add_argument("--mr-base", type=_int_arg, default=0,
                     help="first MR slot for the direct-mode STags")
    drv.add_argument("--n-mr", type=_int_arg, help="MR slots of the target (checked)")
    drv.add_argument("--init", action="store_true", help="serve: initialize first")
    drv.add_argument("--qp", type=_qp_spec, action="append", metavar="N:key=value,...",
                     help="serve: program and open QP N (QpConfig names, e.g. "
                          "0:local_qpn=0x11,remote_qpn=0x20,peer_mac=02:00:00:00:00:02,"
                          "peer_ip=10.0.0.2,rq_psn=0x10,sq_psn=0x200)")
    drv.add_argument("--attach", type=_int_arg, action="append", metavar="N",
                     help="serve: QP N is already programmed; just accept HELLO on it")
    drv.add_argument("--count", type=_int_arg, help="serve: stop after this many messages")
    drv.add_argument("--host-mac", help="link: this host's MAC, as the target will see it")
    drv.add_argument("--disable", action="store_true", help="link: turn the UDP endpoint off")
    drv.set_defaults(run=_driver)
    return parser


# --------------------------------------------------------------------------------------------
# ``kbtp top`` (issue 24): a live view of driver and target counters (host/top.py), from a
# ``kbtp-sim serve --stats-file`` or a board over the UART host link. Appended as ``driver``.
# --------------------------------------------------------------------------------------------

def _top(args):
    from host import top
    if args.stats_file:
        return _top_exit(top.run_top(lambda: top.read_source(args.stats_file),
                                     f"stats file {args.stats_file}", once=args.once,
                                     interval=args.interval))
    if not args.port and args.link == "uart":
        raise _Fail("top: give --stats-file PATH, --port DEV or --link udp ...")
    import asyncio
    from host.driver import KbtpDriver
    from host.port import TargetPort, link_access
    cfg = _driver_config(args)
    link = _link_opener(args)()
    port = TargetPort(link_access(link))
    drv = KbtpDriver(port, cfg, n_qp=args.n_qp, mem_size=args.mem_size, n_mr=args.n_mr)

    def snap():
        try:
            return asyncio.run(top.board_snapshot(port, drv))
        except Exception as err:        # a link failure: one line, exit 2
            print(f"kbtp: error: top: {type(err).__name__}: {err}", file=sys.stderr)
            raise SystemExit(EXIT_ERROR) from None
    where = args.port if args.link == "uart" else f"udp {args.target_ip}"
    return _top_exit(top.run_top(snap, f"board on {where}", once=args.once,
                                 interval=args.interval))


def _top_exit(status):
    return "" if status == 0 else f"kbtp top: exit {status}"


_build_parser_with_driver = build_parser


def build_parser():     # noqa: F811 - extends the parser above with ``top``
    """The argument parser (codec sub-commands, ``driver`` and ``top``)."""
    parser = _build_parser_with_driver()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    t = sub.add_parser("top", help="live view of the target's and driver's counters",
                       description="Refreshing view of operations by status, frames, ICRC and "
                                   "PSN errors, retransmissions, ring occupancy and the QPs, "
                                   "from kbtp-sim serve --stats-file or a board (--port).")
    t.add_argument("--stats-file", help="the JSON of kbtp-sim serve --stats-file")
    _link_args(t)
    t.add_argument("--config", metavar="JSON", help="board: model.target.TargetConfig fields")
    t.add_argument("--n-qp", type=_int_arg, default=2, help="board: QPs of the target")
    t.add_argument("--mem-size", type=_int_arg, help="board: target memory in octets")
    t.add_argument("--n-mr", type=_int_arg, help="board: MR slots of the target")
    t.add_argument("--once", action="store_true", help="print one frame and exit")
    t.add_argument("--interval", type=float, default=1.0, help="seconds between frames")
    t.set_defaults(run=_top)
    return parser

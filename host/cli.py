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

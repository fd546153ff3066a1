# Ref: wire protocol documented in hw/target/hostlink.py (module docstring).
"""Host side of the host link: the frame API and :class:`UartLink`.

Frames requests for :class:`hw.target.hostlink.HostLinkUart` (or the target's UDP host-link
endpoint, :class:`host.udplink.UdpLink`) and checks their responses.

:class:`FrameLink` is what every link offers: ``read_reg``, ``write_reg``, ``read_mem``,
``write_mem``, ``push``, ``pop``, ``status``, ``transact`` (one frame), :meth:`FrameLink.exchange`
(many frames, one response each, in order) and :meth:`FrameLink.batch` (a :class:`LinkBatch`:
many operations collected, then carried out in one :meth:`~FrameLink.exchange`). A link class
only implements ``exchange``; on the UART it sends one frame at a time, the UDP link packs the
frames into as few datagrams as fit.

:class:`UartLink`: the port is anything with ``write(bytes)`` and ``read(n) -> bytes``
(returning fewer octets on a timeout, as pyserial does), or a device path / URL opened with
pyserial.

Example::

    link = UartLink("/dev/ttyUSB1", baud=115200)
    assert link.read_reg(0x0) == 0x4B425450
    link.write_mem(0x100, b"\\x00\\x01\\x02\\x03")
    b = link.batch()
    b.write_reg(0x08, 1)
    b.read_mem(0x100, 4)
    _, data = b.run()           # one result per operation (None for writes)
"""

import struct
from typing import NamedTuple

from hw.target.hostlink import SOF_REQUEST, SOF_RESPONSE, Cmd, LinkStatus

__all__ = ["crc8", "UartLink", "FrameLink", "LinkBatch", "Request", "LinkError", "LinkTimeout",
           "LinkStatusError", "encode_request", "check_request", "parse_response",
           "request_size", "response_size", "STATUS_FIELDS"]

#: Names of the 4 words returned by :meth:`FrameLink.status`.
STATUS_FIELDS = ("frames_ok", "crc_errors", "frame_errors", "bus_errors")


def crc8(data, crc=0):
    """CRC-8/SMBUS (poly 0x07, init 0, MSB first, no final xor) of ``data``."""
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = ((crc << 1) ^ 0x07) & 0xFF if crc & 0x80 else (crc << 1) & 0xFF
    return crc


class LinkError(Exception):
    """A malformed or missing response."""


class LinkTimeout(LinkError):
    """No (complete) response within the timeout; ``seq`` and ``attempts`` name the lost
    datagram on the UDP link (None on the UART)."""

    def __init__(self, message, *, seq=None, attempts=None):
        super().__init__(message)
        self.seq = seq
        self.attempts = attempts


class LinkStatusError(LinkError):
    """The board answered with a non-OK status.

    Attributes
    ----------
    status : LinkStatus
    done : int        words completed before the failure
    data : bytes      data returned before the failure (reads)
    """

    def __init__(self, message, status, done, data=b""):
        super().__init__(message)
        self.status = status
        self.done = done
        self.data = data


def _check_word(name, value, bits=32):
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, not {type(value).__name__} {value!r}")
    if not 0 <= value < (1 << bits):
        raise ValueError(f"{name} {value:#x} does not fit in {bits} bits" if value >= 0
                         else f"{name} {value} is negative")


class Request(NamedTuple):
    """One request frame: ``cmd`` (:class:`Cmd`), byte address, word count, data octets."""
    cmd: Cmd
    addr: int
    count: int
    data: bytes = b""


def _reads(cmd):
    """Whether the response to ``cmd`` carries data words."""
    cmd = Cmd(cmd)
    return not (cmd.value & 1) or cmd is Cmd.STATUS


def _writes(cmd):
    """Whether a ``cmd`` request carries data words."""
    cmd = Cmd(cmd)
    return bool(cmd.value & 1) and cmd is not Cmd.STATUS


def request_size(req):
    """Octets of the request frame ``req``."""
    return 8 + len(req.data)


def response_size(req):
    """Octets of the longest response to ``req`` (all words done)."""
    return 5 + (4 * req.count if _reads(req.cmd) else 0)


def check_request(req, max_words):
    """Raise ValueError / TypeError naming the offending field of ``req`` (a :class:`Request`)."""
    try:
        cmd = Cmd(req.cmd)
    except ValueError:
        what = f"{req.cmd:#04x}" if isinstance(req.cmd, int) else repr(req.cmd)
        raise ValueError(f"command {what} is not a host-link command "
                         f"({', '.join(f'{c.name} {c.value:#04x}' for c in Cmd)})") from None
    _check_word("address", req.addr)
    if req.addr % 4 and cmd.value >> 4 in (1, 2):        # registers, memory (not queues)
        raise ValueError(f"{cmd.name}: address {req.addr:#x} is not a multiple of 4")
    # STATUS answers its 4 words whatever the link's max_words: the bridge takes it before it
    # checks the count.
    top = 255 if cmd is Cmd.STATUS else max_words
    if not isinstance(req.count, int) or not 1 <= req.count <= top:
        raise ValueError(f"{cmd.name}: count {req.count!r} is not in 1..{top} "
                         f"(the link's max_words)")
    want = 4 * req.count if _writes(cmd) else 0
    if len(req.data) != want:
        raise ValueError(f"{cmd.name} of {req.count} words carries {len(req.data)} data "
                         f"octets, expected {want}")
    return Request(cmd, req.addr, req.count, bytes(req.data))


def encode_request(cmd, addr, count, data=b""):
    """Bytes of one request frame (no checks beyond field widths)."""
    cmd = cmd.value if isinstance(cmd, Cmd) else cmd
    body = struct.pack(">BIB", cmd, addr, count) + bytes(data)
    return bytes([SOF_REQUEST]) + body + bytes([crc8(body)])


def parse_response(req, read):
    """Check the response to ``req`` after its start octet; ``read(n, what)`` returns exactly
    ``n`` octets or raises. Returns ``(status, done, data)``; LinkError when it is malformed."""
    cmd = Cmd(req.cmd)
    head = read(3, "the response header")
    rcmd, rstatus, done = head
    if rcmd != cmd.value:
        raise LinkError(f"response is for command {rcmd:#04x}, expected {cmd.value:#04x}")
    try:
        status = LinkStatus(rstatus)
    except ValueError:
        raise LinkError(f"response status {rstatus:#04x} is not a known status") from None
    if done > req.count:
        raise LinkError(f"response count {done} is above the request's {req.count} "
                        f"({cmd.name} at {req.addr:#x})")
    has_data = _reads(cmd) and status not in (LinkStatus.BAD_CRC, LinkStatus.BAD_CMD) and done
    payload = read(4 * done, "the response data") if has_data else b""
    (rcrc,) = read(1, "the response CRC")
    if crc8(head + payload) != rcrc:
        raise LinkError(f"response CRC {rcrc:#04x} is wrong "
                        f"(expected {crc8(head + payload):#04x})")
    return status, done, payload


class LinkBatch:
    """Operations collected on a :class:`FrameLink` and carried out in one exchange.

    Each method queues one operation (split into frames of at most ``max_words``) and returns
    its index; :meth:`run` sends every frame and returns one result per operation, in order:
    an int (``read_reg``), bytes (``read_mem``), a list of words (``pop``), a dict
    (``status``), None (writes). Arguments are checked as they are queued.
    """

    def __init__(self, link):
        self.link = link
        self.requests = []          # Request, in order
        self.groups = []            # operation index of each request
        self._ops = []              # (kind, what, first request, number of requests)

    def __len__(self):
        return len(self._ops)

    def _add(self, kind, what, reqs):
        k = len(self._ops)
        self._ops.append((kind, what, len(self.requests), len(reqs)))
        self.requests += reqs
        self.groups += [k] * len(reqs)
        return k

    def _split(self, cmd, addr, words, step):
        """Frames of ``words`` (ints, or a count for reads) from ``addr``; ``step`` 4 walks the
        address, 0 keeps it (queues)."""
        m = self.link.max_words
        if isinstance(words, int):
            return [Request(cmd, addr + step * k, min(m, words - k)) for k in range(0, words, m)]
        return [Request(cmd, addr + step * k, len(words[k:k + m]),
                        b"".join(w.to_bytes(4, "big") for w in words[k:k + m]))
                for k in range(0, len(words), m)]

    def read_reg(self, addr):
        self.link._check_span(addr, 4)
        return self._add("word", f"read_reg({addr:#x})", [Request(Cmd.READ_REG, addr, 1)])

    def write_reg(self, addr, value):
        return self.write_regs(addr, [value], f"write_reg({addr:#x}, {value:#x})"
                               if isinstance(value, int) else None)

    def write_regs(self, addr, values, what=None):
        """Write consecutive registers from ``addr`` (one frame per ``max_words``)."""
        values = list(values)
        if not values:
            raise ValueError("write_regs of an empty list of values")
        self.link._check_span(addr, 4 * len(values), "register count x 4")
        for i, v in enumerate(values):
            _check_word("value" if len(values) == 1 else f"values[{i}]", v)
        what = what or f"write_regs({addr:#x}, {len(values)} words)"
        return self._add("none", what, self._split(Cmd.WRITE_REG, addr, values, 4))

    def read_mem(self, addr, length):
        self.link._check_span(addr, length)
        return self._add("bytes", f"read_mem({addr:#x}, {length})",
                         self._split(Cmd.READ_MEM, addr, length // 4, 4))

    def write_mem(self, addr, data):
        data = bytes(data)
        self.link._check_span(addr, len(data), "data length")
        words = [int.from_bytes(data[k:k + 4], "big") for k in range(0, len(data), 4)]
        return self._add("none", f"write_mem({addr:#x}, {len(data)} octets)",
                         self._split(Cmd.WRITE_MEM, addr, words, 4))

    def push(self, queue, words):
        _check_word("queue", queue)
        words = list(words)
        if not words:
            raise ValueError("push of an empty list of words")
        for i, w in enumerate(words):
            _check_word(f"words[{i}]", w)
        return self._add("none", f"push(queue {queue})", self._split(Cmd.PUSH, queue, words, 0))

    def pop(self, queue, max_count=1):
        _check_word("queue", queue)
        if not isinstance(max_count, int) or isinstance(max_count, bool) or max_count <= 0:
            raise ValueError(f"max_count {max_count!r} is not a positive int")
        return self._add("words", f"pop(queue {queue})", self._split(Cmd.POP, queue,
                                                                     max_count, 0))

    def status(self):
        return self._add("status", "status()", [Request(Cmd.STATUS, 0, 4)])

    def run(self, check=True):
        """Send every frame; the results (see the class docstring). With ``check`` the first
        failed operation raises its :class:`LinkStatusError` (after every frame has run);
        without, that error stands in the list in place of the operation's result."""
        responses = self.link.exchange(self.requests, self.groups) if self.requests else []
        out = [self._result(kind, what, self.requests[i:i + n], responses[i:i + n])
               for kind, what, i, n in self._ops]
        if check:
            for r in out:
                if isinstance(r, LinkStatusError):
                    raise r
        return out

    @staticmethod
    def _result(kind, what, reqs, responses):
        done, data = 0, b""
        for req, resp in zip(reqs, responses):
            if resp is None:                # not sent: an earlier frame of it stopped it
                continue
            status, n, payload = resp
            if status is not LinkStatus.OK:
                return LinkStatusError(f"{what}: board answered {status.name} after "
                                       f"{done + n} words (frame at address {req.addr:#010x})",
                                       status, done + n, data + payload)
            done, data = done + n, data + payload
        if kind == "word":
            return int.from_bytes(data, "big")
        if kind == "bytes":
            return data
        if kind == "words":
            return [int.from_bytes(data[k:k + 4], "big") for k in range(0, len(data), 4)]
        if kind == "status":
            return dict(zip(STATUS_FIELDS, struct.unpack(">4I", data)))
        return None


class FrameLink:
    """Register / memory / queue access by host-link frames (see the module docstring).

    Subclasses implement :meth:`exchange`. ``stats`` counts ``exchanges`` (round trips),
    ``frames`` and the octets sent and received (``octets_out``, ``octets_in``).
    """

    def __init__(self, max_words):
        if not isinstance(max_words, int) or not 1 <= max_words <= 255:
            raise ValueError(f"max_words {max_words!r} is not in 1..255")
        self.max_words = max_words
        self.stats = {"exchanges": 0, "frames": 0, "octets_out": 0, "octets_in": 0}

    def exchange(self, requests, groups=None):
        """Carry out the :class:`Request` frames in order; one ``(status, done, data)`` per
        frame. ``groups`` (one operation index per frame) lets a link skip the remaining
        frames of an operation after one failed or a pop ran short (None for those)."""
        raise NotImplementedError

    def transact(self, cmd, addr, count, data=b""):
        """Send one frame; return ``(status, done, data)`` of the checked response."""
        return self.exchange([Request(Cmd(cmd), addr, count, bytes(data))])[0]

    def batch(self):
        """A new :class:`LinkBatch` on this link."""
        return LinkBatch(self)

    def _one(self, method, *args):
        b = self.batch()
        getattr(b, method)(*args)
        return b.run()[0]

    # ---- checks -----------------------------------------------------------------------------
    def _check_span(self, addr, length, name="length"):
        _check_word("address", addr)
        if addr % 4:
            raise ValueError(f"address {addr:#x} is not a multiple of 4")
        if not isinstance(length, int) or length <= 0 or length % 4:
            raise ValueError(f"{name} {length!r} is not a positive multiple of 4")
        if addr + length > 1 << 32:
            raise ValueError(f"address {addr:#x} + {name} {length:#x} passes 2**32")

    # ---- public API -------------------------------------------------------------------------
    def read_reg(self, addr):
        """Read the 32-bit register at byte address ``addr``."""
        return self._one("read_reg", addr)

    def write_reg(self, addr, value):
        """Write the 32-bit ``value`` to the register at byte address ``addr``."""
        self._one("write_reg", addr, value)

    def read_mem(self, addr, length):
        """Read ``length`` octets (multiple of 4) of target memory from ``addr``."""
        return self._one("read_mem", addr, length)

    def write_mem(self, addr, data):
        """Write ``data`` (length a multiple of 4) to target memory at ``addr``."""
        self._one("write_mem", addr, data)

    def push(self, queue, words):
        """Push 32-bit ``words`` to queue number ``queue``; LinkStatusError(QUEUE_FULL) if full."""
        self._one("push", queue, words)

    def pop(self, queue, max_count=1):
        """Pop up to ``max_count`` words from queue ``queue``; fewer if it runs empty."""
        return self._one("pop", queue, max_count)

    def status(self):
        """The bridge's counters as a dict (:data:`STATUS_FIELDS`)."""
        return self._one("status")


class UartLink(FrameLink):
    """Register / memory / queue access over the framed UART protocol, one frame at a time.

    Parameters
    ----------
    port : str or file-like
        A pyserial device name / URL, or an object with ``write`` and ``read``.
    baud : int
        Used only when ``port`` is a name.
    timeout : float
        Seconds to wait for a response (pyserial read timeout).
    max_words : int
        The gateware's ``max_words``; longer transfers are split into several frames.
    """

    def __init__(self, port, *, baud=115200, timeout=1.0, max_words=64):
        if isinstance(port, str):
            try:
                import serial
            except ImportError as exc:      # pragma: no cover - depends on the environment
                raise ImportError("opening a serial port by name needs pyserial "
                                  "(pip install pyserial)") from exc
            port = serial.serial_for_url(port, baudrate=baud, timeout=timeout)
        if not (hasattr(port, "write") and hasattr(port, "read")):
            raise TypeError(f"port {port!r} has no write()/read()")
        super().__init__(max_words)
        self.port = port

    def _read_exact(self, n, what):
        out = b""
        while len(out) < n:
            chunk = self.port.read(n - len(out))
            if not chunk:
                raise LinkTimeout(f"timed out waiting for {what}: got {len(out)} of {n} octets "
                                  f"({out.hex() or 'nothing'})")
            out += chunk
        self.stats["octets_in"] += n
        return out

    def _frame(self, req):
        frame = encode_request(req.cmd, req.addr, req.count, req.data)
        self.port.write(frame)
        self.stats["exchanges"] += 1
        self.stats["frames"] += 1
        self.stats["octets_out"] += len(frame)
        # Skip anything before the response's start octet (line noise, a stale answer).
        for _ in range(64):
            sof = self._read_exact(1, "the response start octet")
            if sof[0] == SOF_RESPONSE:
                break
        else:
            raise LinkError("no response start octet 0x5a within 64 octets")
        return parse_response(req, self._read_exact)

    def exchange(self, requests, groups=None):
        requests = [check_request(r, self.max_words) for r in requests]
        out, stopped = [], set()
        for k, req in enumerate(requests):
            g = groups[k] if groups is not None else None
            if g is not None and g in stopped:
                out.append(None)
                continue
            resp = self._frame(req)
            out.append(resp)
            status, done, _ = resp
            if g is not None and (status is not LinkStatus.OK
                                  or (req.cmd is Cmd.POP and done < req.count)):
                stopped.add(g)
        return out

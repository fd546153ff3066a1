# Ref: wire protocol documented in hw/target/hostlink.py (module docstring).
"""Host side of the UART host link: :class:`UartLink`.

Frames requests for :class:`hw.target.hostlink.HostLinkUart` and checks its responses. The
port is anything with ``write(bytes)`` and ``read(n) -> bytes`` (returning fewer octets on a
timeout, as pyserial does), or a device path / URL opened with pyserial.

Example::

    link = UartLink("/dev/ttyUSB1", baud=115200)
    assert link.read_reg(0x0) == 0x4B425450
    link.write_mem(0x100, b"\\x00\\x01\\x02\\x03")
"""

import struct

from hw.target.hostlink import SOF_REQUEST, SOF_RESPONSE, Cmd, LinkStatus

__all__ = ["crc8", "UartLink", "LinkError", "LinkTimeout", "LinkStatusError", "encode_request",
           "STATUS_FIELDS"]

#: Names of the 4 words returned by :meth:`UartLink.status`.
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
    """No (complete) response within the timeout."""


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


def encode_request(cmd, addr, count, data=b""):
    """Bytes of one request frame (no checks beyond field widths)."""
    cmd = cmd.value if isinstance(cmd, Cmd) else cmd
    body = struct.pack(">BIB", cmd, addr, count) + bytes(data)
    return bytes([SOF_REQUEST]) + body + bytes([crc8(body)])


class UartLink:
    """Register / memory / queue access over the framed UART protocol.

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
        if not 1 <= max_words <= 255:
            raise ValueError(f"max_words {max_words} is not in 1..255")
        self.port = port
        self.max_words = max_words

    # ---- framing ----------------------------------------------------------------------------
    def _read_exact(self, n, what):
        out = b""
        while len(out) < n:
            chunk = self.port.read(n - len(out))
            if not chunk:
                raise LinkTimeout(f"timed out waiting for {what}: got {len(out)} of {n} octets "
                                  f"({out.hex() or 'nothing'})")
            out += chunk
        return out

    def transact(self, cmd, addr, count, data=b""):
        """Send one frame; return ``(status, done, data)`` of the checked response."""
        cmd = Cmd(cmd)
        self.port.write(encode_request(cmd, addr, count, data))
        # Skip anything before the response's start octet (line noise, a stale answer).
        for _ in range(64):
            sof = self._read_exact(1, "the response start octet")
            if sof[0] == SOF_RESPONSE:
                break
        else:
            raise LinkError("no response start octet 0x5a within 64 octets")
        head = self._read_exact(3, "the response header")
        rcmd, rstatus, done = head
        if rcmd != cmd.value:
            raise LinkError(f"response is for command {rcmd:#04x}, expected {cmd.value:#04x}")
        try:
            status = LinkStatus(rstatus)
        except ValueError:
            raise LinkError(f"response status {rstatus:#04x} is not a known status") from None
        reads = (not (cmd.value & 1)) or cmd is Cmd.STATUS
        has_data = reads and status not in (LinkStatus.BAD_CRC, LinkStatus.BAD_CMD) and done
        payload = self._read_exact(4 * done, "the response data") if has_data else b""
        (rcrc,) = self._read_exact(1, "the response CRC")
        if crc8(head + payload) != rcrc:
            raise LinkError(f"response CRC {rcrc:#04x} is wrong "
                            f"(expected {crc8(head + payload):#04x})")
        return status, done, payload

    def _run(self, cmd, addr, count, data=b"", *, what, before=0, got=b""):
        """One checked frame; ``before`` words / ``got`` data came from earlier frames of the
        same call, so that an error reports the whole call's progress."""
        status, done, payload = self.transact(cmd, addr, count, data)
        if status is not LinkStatus.OK:
            raise LinkStatusError(f"{what}: board answered {status.name} after {before + done} "
                                  f"words (frame at address {addr:#010x})",
                                  status, before + done, got + payload)
        return done, payload

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
        self._check_span(addr, 4)
        _, payload = self._run(Cmd.READ_REG, addr, 1, what=f"read_reg({addr:#x})")
        return int.from_bytes(payload, "big")

    def write_reg(self, addr, value):
        """Write the 32-bit ``value`` to the register at byte address ``addr``."""
        self._check_span(addr, 4)
        _check_word("value", value)
        self._run(Cmd.WRITE_REG, addr, 1, value.to_bytes(4, "big"),
                  what=f"write_reg({addr:#x}, {value:#x})")

    def read_mem(self, addr, length):
        """Read ``length`` octets (multiple of 4) of target memory from ``addr``."""
        self._check_span(addr, length)
        out = b""
        while len(out) < length:
            n = min(self.max_words, (length - len(out)) // 4)
            a = addr + len(out)
            _, payload = self._run(Cmd.READ_MEM, a, n, what=f"read_mem({addr:#x}, {length})",
                                   before=len(out) // 4, got=out)
            out += payload
        return out

    def write_mem(self, addr, data):
        """Write ``data`` (length a multiple of 4) to target memory at ``addr``."""
        data = bytes(data)
        self._check_span(addr, len(data), "data length")
        for off in range(0, len(data), 4 * self.max_words):
            chunk = data[off:off + 4 * self.max_words]
            self._run(Cmd.WRITE_MEM, addr + off, len(chunk) // 4, chunk,
                      what=f"write_mem({addr:#x}, {len(data)} octets)", before=off // 4)

    def push(self, queue, words):
        """Push 32-bit ``words`` to queue number ``queue``; LinkStatusError(QUEUE_FULL) if full."""
        _check_word("queue", queue)
        words = list(words)
        if not words:
            raise ValueError("push of an empty list of words")
        for i, w in enumerate(words):
            _check_word(f"words[{i}]", w)
        for off in range(0, len(words), self.max_words):
            chunk = words[off:off + self.max_words]
            data = b"".join(w.to_bytes(4, "big") for w in chunk)
            self._run(Cmd.PUSH, queue, len(chunk), data, what=f"push(queue {queue})",
                      before=off)

    def pop(self, queue, max_count=1):
        """Pop up to ``max_count`` words from queue ``queue``; fewer if it runs empty."""
        _check_word("queue", queue)
        if not isinstance(max_count, int) or max_count <= 0:
            raise ValueError(f"max_count {max_count!r} is not a positive int")
        out = []
        while len(out) < max_count:
            n = min(self.max_words, max_count - len(out))
            done, payload = self._run(Cmd.POP, queue, n, what=f"pop(queue {queue})")
            out += [int.from_bytes(payload[i:i + 4], "big") for i in range(0, 4 * done, 4)]
            if done < n:
                break
        return out

    def status(self):
        """The bridge's counters as a dict (:data:`STATUS_FIELDS`)."""
        _, payload = self._run(Cmd.STATUS, 0, 4, what="status()")
        return dict(zip(STATUS_FIELDS, struct.unpack(">4I", payload)))

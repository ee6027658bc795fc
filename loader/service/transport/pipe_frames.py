"""The daemon's end of a pipe link: ``Connection.send_bytes`` messages on non-blocking fds.

``FrameReader`` reassembles messages from whatever bytes a non-blocking fd has,
and hands one out only once it is complete, so a writer frozen mid-message
(SIGSTOP, a debugger) holds up nobody but itself. ``FrameWriter`` writes whole
messages to a non-blocking fd without waiting for room, keeping the rest of a
message that did not fit and writing it before any other.

Workers keep writing with ``send_bytes`` (blocking, with timeouts, like every
worker call), so the daemon parses that framing rather than a framing of its
own: one format on the wire, and the worker side of a link stays a plain
``Connection``. The tests check these classes against ``send_bytes`` and
``recv_bytes``. Nothing is unpickled: a message is bytes, unpacked by
``pipes.unpack_frames``.
"""

from __future__ import annotations

import os
import struct
from typing import Any

import numpy as np

from loader.errors import TransportError

# ``Connection.send_bytes`` framing (multiprocessing/connection.py, the same in CPython 3.8 to 3.13): a
# 4-byte big-endian signed length, or -1 and then an 8-byte big-endian length for messages over 2 GiB - 1.
_SHORT = struct.Struct("!i")
_LONG = struct.Struct("!Q")
_LONG_MARK = -1
_MAX_SHORT = 0x7FFFFFFF
# A message buffer starts at most this big (uninitialised: its pages are taken as bytes land) and doubles
# as bytes arrive, so a garbled length costs no more. It covers the largest chunk a worker builds (one
# batch of big rows, 64 MiB, plus its header: workers/columns.py); only a bigger single sample is copied.
FIRST_BUFFER_MAX_BYTES = 128 * 1024 * 1024


# Workers keep writing with ``send_bytes`` (blocking, with timeouts, like every worker call), so the daemon
# parses that framing rather than a framing of its own: one format on the wire, and the worker side of a
# link stays a plain ``Connection``. The tests check these classes against ``send_bytes``/``recv_bytes``.
class FrameReader:
    """Reassembles ``send_bytes`` messages from a non-blocking fd, from whatever bytes are there.

    A message is read into one buffer (``os.readv``, no joining of pieces) and handed out only once
    complete; a writer frozen mid-message leaves its part here and stops nothing else.
    """

    def __init__(self, fd: int, max_bytes: int) -> None:
        self._fd, self._max = fd, max_bytes
        self._head = bytearray(_SHORT.size + _LONG.size)
        self._head_got = 0
        self._body: np.ndarray | None = None
        self._size = self._got = 0

    @property
    def pending_bytes(self) -> int:
        """Bytes of an unfinished message held here (0 between messages)."""
        return self._head_got + self._got

    def read(self) -> memoryview | None:
        """The next complete message (a read-only view), or None until the rest of it has arrived.

        ``EOFError`` at end of file (what was held is dropped with the reader); ``TransportError`` for
        a length the writer cannot have meant (negative, or over ``max_bytes``).
        """
        if self._body is None and not self._read_header():
            return None
        assert self._body is not None
        while self._got < self._size:
            if self._got == len(self._body):
                self._grow()
            n = self._read_into(self._body.data[self._got :])
            if n is None:
                return None
            self._got += n
        body = self._body.data.toreadonly()  # read-only views, as ``recv_bytes`` gave
        self._head_got, self._body, self._size, self._got = 0, None, 0, 0
        return body

    def _read_header(self) -> bool:
        if not self._fill_head(_SHORT.size):
            return False
        (size,) = _SHORT.unpack_from(self._head)
        if size == _LONG_MARK:
            if not self._fill_head(_SHORT.size + _LONG.size):
                return False
            (size,) = _LONG.unpack_from(self._head, _SHORT.size)
        if not 0 <= size <= self._max:
            raise TransportError(f"message length {size} is garbled or over the limit of {self._max} bytes")
        self._size = size
        self._body = np.empty(min(size, FIRST_BUFFER_MAX_BYTES), np.uint8)
        return True

    def _fill_head(self, upto: int) -> bool:
        while self._head_got < upto:
            n = self._read_into(memoryview(self._head)[self._head_got : upto])
            if n is None:
                return False
            self._head_got += n
        return True

    def _grow(self) -> None:
        assert self._body is not None
        bigger = np.empty(min(self._size, 2 * len(self._body)), np.uint8)
        bigger[: self._got] = self._body[: self._got]
        self._body = bigger

    def _read_into(self, view: memoryview) -> int | None:
        try:
            n = os.readv(self._fd, [view])
        except BlockingIOError:
            return None
        if n == 0:
            held = self.pending_bytes
            raise EOFError("end of file" + (f" with {held} bytes of a message unfinished" if held else ""))
        return n


def _header(size: int) -> bytes:
    return _SHORT.pack(size) if size <= _MAX_SHORT else _SHORT.pack(_LONG_MARK) + _LONG.pack(size)


class FrameWriter:
    """Writes whole ``send_bytes`` messages to a non-blocking fd without waiting for room.

    A message the fd takes only part of keeps its rest here, written by ``flush`` before any other:
    the stream stays whole, and the caller never waits for a reader that is not reading.
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._rest: list[memoryview] = []

    @property
    def pending(self) -> bool:
        return bool(self._rest)

    def send(self, blob: Any) -> bool:
        """Write ``blob`` as one message; False (nothing written) while the fd has no room or an
        earlier message is still unfinished. ``OSError`` when the reader is gone."""
        if not self.flush():
            return False
        view = memoryview(blob).cast("B")
        head = _header(view.nbytes)
        try:
            n = os.writev(self._fd, [head, view])
        except BlockingIOError:
            return False
        self._rest = [memoryview(head), view]
        self._consume(n)
        return True

    def flush(self) -> bool:
        """Write what waits from an earlier ``send``; True once nothing does."""
        while self._rest:
            try:
                n = os.writev(self._fd, self._rest)
            except BlockingIOError:
                return False
            self._consume(n)
        return True

    def _consume(self, n: int) -> None:
        while self._rest and n >= self._rest[0].nbytes:
            n -= self._rest.pop(0).nbytes
        if n:
            self._rest[0] = self._rest[0][n:]


__all__ = ["FrameReader", "FrameWriter", "FIRST_BUFFER_MAX_BYTES"]

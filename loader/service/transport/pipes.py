"""Byte channels over ``multiprocessing`` Pipes: the framing and the worker's end of a pipe link.

A multipart message of protocol frames crosses a Pipe as one ``send_bytes`` of a
small length-prefixed concatenation (``pack_frames``): frame count, frame
lengths, frames. ``unpack_frames`` returns views of the received bytes, so
arrays are ``np.frombuffer`` views as over ZeroMQ. Nothing is pickled.

``PipeChannel`` has the ``Channel`` shape (``send``/``try_send``/``recv``/
``close``); ``QueuedChannel`` is the "queue" transport's data channel: a
``try_send`` hands the packed message to a feeder thread, as
``multiprocessing.Queue.put`` does. Both are the worker's end and block (with
timeouts) like any worker call.

The daemon's end never waits for bytes (``pipe_frames``). See ``links``
for the links.
"""

from __future__ import annotations

import queue
import select
import struct
import threading
import time
from collections.abc import Sequence
from typing import Any

from loader.errors import ServiceUnavailableError, TransportError

SEND_TIMEOUT_S = 10.0
# Linux lets a pipe hold up to 1 MiB (fs.pipe-max-size): fewer wake-ups for big samples.
PIPE_BUFFER_BYTES = 1 << 20
# "queue": data messages waiting for the feeder thread before a put waits (like Queue(maxsize)).
QUEUE_DEPTH_MESSAGES = 64
FEEDER_POLL_S = 0.1
FEEDER_FLUSH_TIMEOUT_S = 5.0

_COUNT = struct.Struct("<I")
_LENGTH = struct.Struct("<Q")


# -- framing -----------------------------------------------------------------
def pack_frames(frames: Sequence[Any]) -> bytes:
    """One bytes object for a multipart message: frame count, frame lengths, then the frames."""
    views = [_view(f) for f in frames]
    parts: list[Any] = [_COUNT.pack(len(views))]
    parts.extend(_LENGTH.pack(v.nbytes) for v in views)
    parts.extend(views)
    return b"".join(parts)


def unpack_frames(blob: bytes | memoryview) -> list[memoryview]:
    """The frames of ``pack_frames`` output, as views of ``blob`` (no copy)."""
    view = memoryview(blob)
    try:
        (count,) = _COUNT.unpack_from(view, 0)
        offset = _COUNT.size + count * _LENGTH.size
        lengths = [_LENGTH.unpack_from(view, _COUNT.size + i * _LENGTH.size)[0] for i in range(count)]
    except struct.error as exc:
        raise TransportError(f"malformed pipe message: {exc}") from exc
    if offset + sum(lengths) != view.nbytes:
        raise TransportError(f"malformed pipe message: {view.nbytes} bytes for frames of {sum(lengths)}")
    frames = []
    for length in lengths:
        frames.append(view[offset : offset + length])
        offset += length
    return frames


def _view(frame: Any) -> memoryview:
    buf = getattr(frame, "buffer", None)  # a zmq.Frame
    view = buf if buf is not None else memoryview(frame)
    return view if view.ndim == 1 and view.format == "B" else view.cast("B")


def writable(conn: Any, timeout_s: float) -> bool:
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLOUT)
    return bool(poller.poll(int(max(0.0, timeout_s) * 1000)))


def grow_pipe(conn: Any) -> None:
    try:
        import fcntl

        fcntl.fcntl(conn.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BUFFER_BYTES)
    except (ImportError, AttributeError, OSError):
        pass  # not Linux, or a socketpair: the default buffer works, a little slower


class PipeChannel:
    """One end of a Pipe with the ``Channel`` shape: ``send``/``try_send``/``recv``/``close``."""

    def __init__(self, conn: Any, endpoint: str) -> None:
        self._conn = conn
        self.endpoint = endpoint
        self.closed = False

    def fileno_obj(self) -> Any:
        return self._conn.fileno()

    def try_send(self, frames: Sequence[Any], timeout_s: float) -> bool:
        """Send if the pipe has room within ``timeout_s``; False otherwise (caller retries)."""
        if not writable(self._conn, timeout_s):
            return False
        self._write(pack_frames(frames))
        return True

    def send(self, frames: Sequence[Any], timeout_s: float | None = None) -> None:
        if not self.try_send(frames, SEND_TIMEOUT_S if timeout_s is None else timeout_s):
            raise ServiceUnavailableError(f"{self.endpoint} did not accept a message in time")

    def _write(self, blob: bytes) -> None:
        try:
            self._conn.send_bytes(blob)
        except OSError as exc:
            raise ServiceUnavailableError(f"{self.endpoint} is closed: {exc}") from exc

    def recv(self, timeout_s: float) -> list[Any] | None:
        """One message, or None when nothing arrived within ``timeout_s``."""
        try:
            if not self._conn.poll(max(0.0, timeout_s)):
                return None
            return unpack_frames(self._conn.recv_bytes())
        except (EOFError, OSError) as exc:
            raise ServiceUnavailableError(f"{self.endpoint} was closed by the daemon") from exc

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._conn.close()


class QueuedChannel(PipeChannel):
    """``"queue"``: ``try_send`` hands the message to a feeder thread that writes it to the pipe."""

    def __init__(self, conn: Any, endpoint: str) -> None:
        super().__init__(conn, endpoint)
        self._queue: queue.Queue[bytes] = queue.Queue(QUEUE_DEPTH_MESSAGES)
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._give_up_at = float("inf")  # set by close(): how long the feeder may still flush
        self._thread = threading.Thread(target=self._feed, name="loader-worker-feeder", daemon=True)
        self._thread.start()

    def try_send(self, frames: Sequence[Any], timeout_s: float) -> bool:
        if self._error is not None:
            raise ServiceUnavailableError(f"{self.endpoint} is closed: {self._error}")
        try:
            # Packing copies the frames, so the caller may reuse its buffers at once.
            self._queue.put(pack_frames(frames), timeout=max(0.0, timeout_s))
        except queue.Full:
            return False
        return True

    def _feed(self) -> None:
        while not self._stop.is_set() or not self._queue.empty():
            try:
                blob = self._queue.get(timeout=FEEDER_POLL_S)
            except queue.Empty:
                continue
            try:
                while not writable(self._conn, FEEDER_POLL_S):
                    if self._stop.is_set() and time.monotonic() > self._give_up_at:
                        return
                self._write(blob)
            except (TransportError, ValueError) as exc:  # ValueError: the pipe was closed under us
                self._error = exc
                return

    def close(self) -> None:
        """Write what is queued (bounded by ``FEEDER_FLUSH_TIMEOUT_S``), stop the feeder, close."""
        if self.closed:
            return
        self._give_up_at = time.monotonic() + FEEDER_FLUSH_TIMEOUT_S
        self._stop.set()
        self._thread.join(FEEDER_FLUSH_TIMEOUT_S + FEEDER_POLL_S)
        super().close()


__all__ = ["pack_frames", "unpack_frames", "writable", "grow_pipe", "PipeChannel", "QueuedChannel"]

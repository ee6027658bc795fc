"""Worker links over ``multiprocessing`` Pipes: the "pipe" and "queue" transports of the in-process ``Loader``.

Each worker the daemon starts gets its own link, made of two Pipes created
before the worker is spawned and handed to it as process arguments:

* control: one duplex Pipe (the worker's ``HELLO``, ``LEASE_REQ``, heartbeats;
  the daemon's ``WELCOME``, ``LEASE``, ``CANCEL``, heartbeat answers, ``BYE``);
* data: one one-way Pipe, worker -> daemon (``CHUNK``, ``FILE_DONE``, ``FILE_ERROR``).

Only bytes cross a link: a multipart message of protocol frames is sent with
``send_bytes`` as one small length-prefixed concatenation (``pack_frames``) and
received with ``recv_bytes``; nothing is pickled, so nothing is unpickled.

Transports (``config.workers.transport``):

* ``"pipe"``: the worker's main thread writes each data message to its Pipe.
* ``"queue"``: the semantics of ``multiprocessing.Queue`` (a ``put`` returns
  at once; a feeder thread writes to the pipe; a bounded number of messages
  wait in between), built on the worker's own one-way Pipe rather than on a
  ``multiprocessing.Queue``. A shared Queue would unpickle what it carries and
  can be left with its lock held or a message half written by a worker killed
  with SIGKILL; a per-worker pipe only ever loses its own worker, whose death
  shows as end-of-file on the daemon's side.

Clients (and ``loader status``) still talk to the daemon over its ZeroMQ
endpoint: ``SplitRouter`` sends to a worker's pipe or to the zmq router by peer.
The daemon reads a link only when it is readable; a worker writes each message
in one uninterrupted call, so a read waits only for the rest of a message that
a live writer is writing, and a killed writer ends it with end-of-file.
"""

from __future__ import annotations

import itertools
import multiprocessing.connection
import queue
import select
import struct
import threading
import time
from typing import Any, Sequence

from loader import processes
from loader.errors import ServiceUnavailableError, TransportError

MP_TRANSPORTS = ("pipe", "queue")
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


def unpack_frames(blob: bytes) -> list[memoryview]:
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


def _writable(conn: Any, timeout_s: float) -> bool:
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLOUT)
    return bool(poller.poll(int(max(0.0, timeout_s) * 1000)))


def _grow_pipe(conn: Any) -> None:
    try:
        import fcntl

        fcntl.fcntl(conn.fileno(), fcntl.F_SETPIPE_SZ, PIPE_BUFFER_BYTES)
    except (ImportError, AttributeError, OSError):
        pass  # not Linux, or a socketpair: the default buffer works, a little slower


# -- the worker's end --------------------------------------------------------
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
        if not _writable(self._conn, timeout_s):
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
                while not _writable(self._conn, FEEDER_POLL_S):
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


class WorkerEnd:
    """The worker's half of a link: picklable while a process is being spawned (fds travel with it)."""

    def __init__(self, kind: str, control: Any, data: Any, name: str) -> None:
        self.kind, self._control, self._data = kind, control, data
        self.endpoint = f"{kind}://{name}"

    def open_channels(self) -> tuple[PipeChannel, PipeChannel]:
        """(control, data) channels; called in the worker process."""
        data_class = QueuedChannel if self.kind == "queue" else PipeChannel
        return PipeChannel(self._control, self.endpoint), data_class(self._data, self.endpoint + "/data")

    def close(self) -> None:
        """Close these fds in the daemon once the worker has its copies, so its death shows as EOF."""
        self._control.close()
        self._data.close()

    def __str__(self) -> str:
        return self.endpoint


# -- the daemon's end --------------------------------------------------------
class _LinkGroup:
    """The daemon's ends of one kind (control or data) of every link, polled as one item."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._conns: dict[bytes, Any] = {}
        self._ready: list[bytes] = []

    def poll_keys(self) -> list[int]:
        return [conn.fileno() for conn in self._conns.values()]

    def add(self, peer: bytes, conn: Any) -> None:
        self._conns[peer] = conn

    def owns(self, peer: bytes) -> bool:
        return peer in self._conns

    def drop(self, peer: bytes) -> None:
        conn = self._conns.pop(peer, None)
        if conn is not None:
            conn.close()

    def recv_from(self, timeout_s: float) -> tuple[bytes, list[Any]] | None:
        """(peer, frames) of one waiting message, taking ready links in turn; a closed link is dropped."""
        if not self._ready:
            by_conn = {id(conn): peer for peer, conn in self._conns.items()}
            ready = multiprocessing.connection.wait(list(self._conns.values()), max(0.0, timeout_s))
            self._ready = [by_conn[id(conn)] for conn in ready]
        while self._ready:
            peer = self._ready.pop()
            conn = self._conns.get(peer)
            if conn is None:
                continue
            try:
                return peer, unpack_frames(conn.recv_bytes())
            except (EOFError, OSError):
                self.drop(peer)  # the worker exited or was killed; the daemon reaps it by exit code
            except TransportError:
                self.drop(peer)  # a garbled link cannot be resynchronised
        return None

    def close(self) -> None:
        for peer in list(self._conns):
            self.drop(peer)


class LinkRouter(_LinkGroup):
    """Control ends, with the ``Router`` shape: ``send(peer, frames)``, ``recv() -> (peer, frames)``."""

    def send(self, peer: bytes, frames: Sequence[Any]) -> bool:
        """Send without waiting for room; False when the worker is gone or not reading."""
        conn = self._conns.get(peer)
        if conn is None or not _writable(conn, 0.0):
            return False
        try:
            conn.send_bytes(pack_frames(frames))
        except OSError:
            self.drop(peer)
            return False
        return True

    def recv(self, timeout_s: float) -> tuple[bytes, list[Any]] | None:
        return self.recv_from(timeout_s)


class LinkData(_LinkGroup):
    """Data ends, with the receiving ``Channel`` shape: ``recv() -> frames``."""

    def recv(self, timeout_s: float) -> list[Any] | None:
        got = self.recv_from(timeout_s)
        return None if got is None else got[1]


class WorkerLinks:
    """Makes a link per worker and keeps the daemon's ends (``control``, ``data``)."""

    def __init__(self, kind: str) -> None:
        if kind not in MP_TRANSPORTS:
            raise TransportError(f"unknown multiprocessing transport {kind!r}: use one of {MP_TRANSPORTS}")
        self.kind = kind
        self.control = LinkRouter(f"{kind}://control")
        self.data = LinkData(f"{kind}://data")
        self._ids = itertools.count(1)

    def new_link(self) -> WorkerEnd:
        """A fresh link; pass the result to the worker process, then ``close()`` it here."""
        peer = b"%s-%d" % (self.kind.encode(), next(self._ids))
        ctx = processes.context("spawn")
        control_here, control_there = ctx.Pipe(duplex=True)
        data_here, data_there = ctx.Pipe(duplex=False)
        _grow_pipe(data_there)
        self.control.add(peer, control_here)
        self.data.add(peer, data_here)
        return WorkerEnd(self.kind, control_there, data_there, peer.decode())

    def close(self) -> None:
        self.control.close()
        self.data.close()


class SplitRouter:
    """The daemon's router when workers use pipes: worker peers over their links, the rest over zmq."""

    def __init__(self, clients: Any, workers: LinkRouter) -> None:
        self._clients, self._workers = clients, workers
        self.endpoint = clients.endpoint

    def poll_keys(self) -> list[Any]:
        return [self._clients.fileno_obj(), *self._workers.poll_keys()]

    def send(self, peer: bytes, frames: Sequence[Any]) -> bool:
        target = self._workers if self._workers.owns(peer) else self._clients
        return target.send(peer, frames)

    def recv(self, timeout_s: float) -> tuple[bytes, list[Any]] | None:
        return self._workers.recv(0.0) or self._clients.recv(timeout_s)

    def close(self) -> None:
        self._workers.close()
        self._clients.close()


__all__ = [
    "MP_TRANSPORTS",
    "pack_frames",
    "unpack_frames",
    "PipeChannel",
    "QueuedChannel",
    "WorkerEnd",
    "WorkerLinks",
    "LinkRouter",
    "LinkData",
    "SplitRouter",
]

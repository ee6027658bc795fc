"""Worker links over ``multiprocessing`` Pipes: the "pipe" and "queue" transports of the in-process ``Loader``.

Each worker the daemon starts gets its own link, made of two Pipes created
before the worker is spawned and handed to it as process arguments:

* control: one duplex Pipe (the worker's ``HELLO``, ``LEASE_REQ``, heartbeats;
  the daemon's ``WELCOME``, ``LEASE``, ``CANCEL``, heartbeat answers, ``BYE``);
* data: one one-way Pipe, worker -> daemon (``CHUNK``, ``FILE_DONE``, ``FILE_ERROR``).

Only bytes cross a link: a multipart message of protocol frames is sent with
``send_bytes`` as one small length-prefixed concatenation and received with
``recv_bytes`` (``pipes.py``); nothing is pickled, so nothing is unpickled.

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
from typing import Any, Sequence

from loader import processes
from loader.errors import TransportError
from loader.service.pipes import PipeChannel, QueuedChannel, grow_pipe, pack_frames, unpack_frames, writable

MP_TRANSPORTS = ("pipe", "queue")


# -- the worker's end --------------------------------------------------------
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
        if conn is None or not writable(conn, 0.0):
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
        grow_pipe(data_there)
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
    "WorkerEnd",
    "WorkerLinks",
    "LinkRouter",
    "LinkData",
    "SplitRouter",
]

"""Worker links over ``multiprocessing`` Pipes: the "pipe" and "queue" transports of the in-process ``Loader``.

Each worker the daemon starts gets its own link, made of two Pipes created
before the worker is spawned and handed to it as process arguments:

* control: one duplex Pipe (the worker's ``HELLO``, ``LEASE_REQ``, heartbeats;
  the daemon's ``WELCOME``, ``LEASE``, ``CANCEL``, heartbeat answers, ``BYE``);
* data: one one-way Pipe, worker -> daemon (``CHUNK``, ``FILE_DONE``, ``FILE_ERROR``).

Only bytes cross a link: a multipart message of protocol frames is sent with
``send_bytes`` as one small length-prefixed concatenation (``pipes``);
nothing is pickled, so nothing is unpickled.

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

The daemon's ends are non-blocking and never wait for bytes: each link
reassembles its messages from whatever has arrived (``pipe_frames.FrameReader``) and
hands one out only once it is complete, so a worker frozen mid-message (SIGSTOP,
a debugger) holds up nobody but itself; the coordinator's progress and
heartbeat timeouts then replace it. A link is dropped, with the part of a
message it holds, at end-of-file (a worker that exited or was killed) and at
a length no worker sends (over ``MAX_MESSAGE_BYTES``, or garbled): a dropped
link is never read again. A control message to a worker is never waited for
nor interleaved with another (``pipe_frames.FrameWriter``): one that the worker's
pipe takes only in part keeps its rest, written first at the next loop turn.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import select
import time
from collections.abc import Sequence
from typing import Any

from loader.errors import TransportError
from loader.runtime import processes
from loader.service.transport.pipe_frames import FrameReader, FrameWriter
from loader.service.transport.pipes import (
    PipeChannel,
    QueuedChannel,
    grow_pipe,
    pack_frames,
    unpack_frames,
)

log = logging.getLogger("loader.daemon")

MP_TRANSPORTS = ("pipe", "queue")
# The longest message the daemon takes from a worker's data link. A chunk is at most 4 MiB, or one
# batch of big rows up to 64 MiB (workers/columns.py), or a single sample bigger than that: this leaves
# room for any sample that should travel through a pipe. A longer length is a garbled link, dropped.
# Buffers grow as the bytes arrive (pipe_frames.FrameReader), so the limit is never allocated up front.
MAX_MESSAGE_BYTES = 4 * 1024**3
# Control messages from a worker (hello, lease requests, heartbeats, bye) are a few hundred bytes.
MAX_CONTROL_MESSAGE_BYTES = 1024**2


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
class _Link:
    """The daemon's end of one link of one kind: its Connection (which owns the fd), reader and writer."""

    def __init__(self, conn: Any, max_bytes: int, writes: bool) -> None:
        self.conn, self.fd = conn, conn.fileno()
        # Non-blocking, so no read or write of the daemon's can wait on a worker; O_NONBLOCK belongs to
        # this end's open file, not to the worker's end.
        os.set_blocking(self.fd, False)
        self.reader = FrameReader(self.fd, max_bytes)
        self.writer = FrameWriter(self.fd) if writes else None


class _LinkGroup:
    """The daemon's ends of one kind (control or data) of every link, polled as one item."""

    max_message_bytes = MAX_MESSAGE_BYTES
    writes = False

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self._links: dict[bytes, _Link] = {}
        self._by_fd: dict[int, bytes] = {}
        self._poll = select.poll()
        self._ready: list[bytes] = []

    def poll_keys(self) -> list[int]:
        return list(self._by_fd)

    def add(self, peer: bytes, conn: Any) -> None:
        link = _Link(conn, self.max_message_bytes, self.writes)
        self._links[peer] = link
        self._by_fd[link.fd] = peer
        self._poll.register(link.fd, select.POLLIN)

    def owns(self, peer: bytes) -> bool:
        return peer in self._links

    def pending_bytes(self, peer: bytes) -> int:
        """Bytes of an unfinished message held for ``peer`` (0 between messages, or for no such link)."""
        link = self._links.get(peer)
        return link.reader.pending_bytes if link is not None else 0

    def drop(self, peer: bytes) -> None:
        """Forget a link and the part of a message it holds; nothing more is read from it."""
        link = self._links.pop(peer, None)
        if link is not None:
            self._poll.unregister(link.fd)
            del self._by_fd[link.fd]
            link.conn.close()

    def recv_from(self, timeout_s: float) -> tuple[bytes, list[Any]] | None:
        """(peer, frames) of one complete message, taking ready links in turn; None when none is
        complete within ``timeout_s`` (at once when no link is left). Never waits past that."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        while True:
            if not self._ready:
                self._ready = self._readable(deadline - time.monotonic())
            while self._ready:
                got = self._read(self._ready.pop())
                if got is not None:
                    return got
            if not self._links or time.monotonic() >= deadline:
                return None

    def _readable(self, timeout_s: float) -> list[bytes]:
        timeout_ms = math.ceil(timeout_s * 1000) if timeout_s > 0 else 0
        return [self._by_fd[fd] for fd, _ in self._poll.poll(timeout_ms) if fd in self._by_fd]

    def _read(self, peer: bytes) -> tuple[bytes, list[Any]] | None:
        link = self._links.get(peer)
        if link is None:
            return None
        try:
            blob = link.reader.read()
            return None if blob is None else (peer, unpack_frames(blob))
        except (EOFError, OSError) as exc:
            # The worker exited or was killed; the daemon reaps it by exit code.
            log.debug("%s: link %s closed: %s", self.endpoint, peer.decode(errors="replace"), exc)
        except TransportError as exc:
            log.warning("%s: dropping the link of %s: %s", self.endpoint, peer.decode(errors="replace"), exc)
        self.drop(peer)  # a closed or garbled link cannot be resynchronised
        return None

    def close(self) -> None:
        for peer in list(self._links):
            self.drop(peer)


class LinkRouter(_LinkGroup):
    """Control ends, with the ``Router`` shape: ``send(peer, frames)``, ``recv() -> (peer, frames)``."""

    max_message_bytes = MAX_CONTROL_MESSAGE_BYTES
    writes = True

    def send(self, peer: bytes, frames: Sequence[Any]) -> bool:
        """Send without waiting for room; False when the worker is gone or not reading."""
        link = self._links.get(peer)
        if link is None or link.writer is None:
            return False
        try:
            return link.writer.send(pack_frames(frames))
        except OSError:
            self.drop(peer)
            return False

    def poll_keys(self) -> list[int]:
        # The daemon's poller asks for the keys at every loop turn, whatever the workers send: the
        # rest of a control message that did not fit goes out here (a worker waits for it whole).
        self.flush()
        return super().poll_keys()

    def flush(self) -> None:
        """Write the rest of every control message a worker's pipe took only part of."""
        for peer, link in list(self._links.items()):
            try:
                if link.writer is not None:
                    link.writer.flush()
            except OSError:
                self.drop(peer)

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
    "MAX_MESSAGE_BYTES",
    "MAX_CONTROL_MESSAGE_BYTES",
    "pack_frames",
    "unpack_frames",
    "WorkerEnd",
    "WorkerLinks",
    "LinkRouter",
    "LinkData",
    "SplitRouter",
]

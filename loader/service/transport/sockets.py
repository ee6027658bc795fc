"""ZeroMQ sockets: the ONLY module that imports ``zmq``.

``ZmqChannel`` (DEALER, PUSH, PULL) is a ``channel.Channel``; ``Router`` is the
daemon's well-known endpoint (a ``channel.RouterLike``); ``Poller`` waits until
any registered channel (or an ``inproc.Waker``) is readable.

Every socket has ``linger=0`` and is closed on every path; every receive takes a
timeout; zmq errors become ``TransportError``/``ServiceUnavailableError`` naming
the endpoint. Multipart frames are received with ``copy=False`` so large array
frames are used in place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import zmq

from loader.errors import ServiceUnavailableError, TransportError

SEND_TIMEOUT_S = 10.0
# Frames at least this large are sent without copying (zmq keeps a reference).
ZERO_COPY_MIN_BYTES = 64 * 1024
# Messages queued per peer before a sender blocks: bounded, and large enough for bursts.
HIGH_WATER_MARK = 64

Frames = list[Any]


def _context() -> zmq.Context:
    return zmq.Context.instance()


def _translate(exc: zmq.ZMQError, action: str, endpoint: str) -> TransportError:
    if exc.errno == zmq.EADDRINUSE:
        return TransportError(f"cannot bind {endpoint}: address already in use (is another daemon running?)")
    return TransportError(f"{action} {endpoint} failed: {exc}")


class _Socket:
    """One zmq socket with the house settings; ``close()`` is idempotent."""

    def __init__(self, kind: int, endpoint: str, *, bind: bool, identity: bytes | None = None) -> None:
        self._sock = _context().socket(kind)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SNDHWM, HIGH_WATER_MARK)
        self._sock.setsockopt(zmq.RCVHWM, HIGH_WATER_MARK)
        if identity is not None:
            self._sock.setsockopt(zmq.IDENTITY, identity)
        if kind == zmq.ROUTER:
            # A reply to a vanished client must fail loudly, not vanish silently.
            self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        self.endpoint = endpoint
        try:
            if bind:
                self._sock.bind(endpoint)
                self.endpoint = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
            else:
                self._sock.connect(endpoint)
        except zmq.ZMQError as exc:
            self._sock.close(0)
            raise _translate(exc, "bind" if bind else "connect", endpoint) from exc
        self.closed = False

    def fileno_obj(self) -> Any:
        return self._sock

    def _send(self, frames: Sequence[Any], timeout_s: float | None) -> bool:
        wait_ms = int((SEND_TIMEOUT_S if timeout_s is None else timeout_s) * 1000)
        if not self._sock.poll(wait_ms, zmq.POLLOUT):
            return False
        copy = sum(_nbytes(f) for f in frames) < ZERO_COPY_MIN_BYTES
        try:
            self._sock.send_multipart(frames, copy=copy, flags=zmq.NOBLOCK)
        except zmq.Again:
            return False
        except zmq.ZMQError as exc:
            raise _translate(exc, "send to", self.endpoint) from exc
        return True

    def _recv(self, timeout_s: float) -> list[Any] | None:
        try:
            if not self._sock.poll(int(max(0.0, timeout_s) * 1000), zmq.POLLIN):
                return None
            return self._sock.recv_multipart(copy=False, flags=zmq.NOBLOCK)
        except zmq.Again:
            return None
        except zmq.ZMQError as exc:
            raise _translate(exc, "receive from", self.endpoint) from exc

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._sock.close(0)

    def __enter__(self) -> _Socket:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _nbytes(frame: Any) -> int:
    try:
        return memoryview(frame).nbytes
    except TypeError:
        return len(frame)


class ZmqChannel(_Socket):
    """A point-to-point zmq socket: DEALER (control), PUSH or PULL (data)."""

    def send(self, frames: Sequence[Any], timeout_s: float | None = None) -> None:
        """Send, waiting at most ``timeout_s``; a full peer raises ``ServiceUnavailableError``."""
        if not self._send(frames, timeout_s):
            raise ServiceUnavailableError(f"{self.endpoint} did not accept a message in time")

    def try_send(self, frames: Sequence[Any], timeout_s: float) -> bool:
        """Send if the socket accepts within ``timeout_s``; False otherwise (caller retries)."""
        return self._send(frames, timeout_s)

    def recv(self, timeout_s: float) -> list[Any] | None:
        """One multipart message, or None when nothing arrived within ``timeout_s``."""
        return self._recv(timeout_s)


class Router(_Socket):
    """The daemon's well-known endpoint: many DEALER peers, addressed by identity."""

    def __init__(self, endpoint: str) -> None:
        super().__init__(zmq.ROUTER, endpoint, bind=True)

    def send(self, peer: bytes, frames: Sequence[Any]) -> bool:
        """Send to ``peer`` without blocking; False when the peer is gone or full."""
        copy = sum(_nbytes(f) for f in frames) < ZERO_COPY_MIN_BYTES
        try:
            self._sock.send_multipart([peer, *frames], copy=copy, flags=zmq.NOBLOCK)
        except zmq.Again:
            return False
        except zmq.ZMQError as exc:
            if exc.errno == zmq.EHOSTUNREACH:
                return False
            raise _translate(exc, "send to", self.endpoint) from exc
        return True

    def recv(self, timeout_s: float) -> tuple[bytes, list[Any]] | None:
        frames = self._recv(timeout_s)
        if frames is None or len(frames) < 2:
            return None
        return bytes(frames[0].buffer), frames[1:]


def dealer(endpoint: str, identity: bytes | None = None) -> ZmqChannel:
    return ZmqChannel(zmq.DEALER, endpoint, bind=False, identity=identity)


def push(endpoint: str) -> ZmqChannel:
    return ZmqChannel(zmq.PUSH, endpoint, bind=False)


def pull(endpoint: str) -> ZmqChannel:
    return ZmqChannel(zmq.PULL, endpoint, bind=True)


def data_endpoint_for(control: str) -> str:
    """Where the daemon binds its data socket, next to the control endpoint."""
    if control.startswith("tcp://"):
        host = control[len("tcp://") :].rsplit(":", 1)[0]
        return f"tcp://{host}:*"
    if control.startswith("ipc://"):
        return control + ".data"
    if control.startswith("inproc://"):
        return control + "-data"
    raise TransportError(f"unsupported endpoint {control!r}: use tcp://, ipc:// or inproc://")


def reachable_endpoint(announced: str, connect_address: str) -> str:
    """The data endpoint as seen from a worker: a wildcard host becomes the host it dialled."""
    if announced.startswith("tcp://") and connect_address.startswith("tcp://"):
        host, port = announced[len("tcp://") :].rsplit(":", 1)
        if host in ("0.0.0.0", "*", "[::]", "::"):
            dialled = connect_address[len("tcp://") :].rsplit(":", 1)[0]
            return f"tcp://{dialled}:{port}"
    return announced


class Poller:
    """Wait for any of several channels (or wakers) to become readable.

    An item is polled by its ``fileno_obj()`` (a zmq socket or a file descriptor),
    or, for a group whose members change (the daemon's pipes to its workers), by
    every key its ``poll_keys()`` returns at the start of each ``wait``.
    """

    def __init__(self) -> None:
        self._poller = zmq.Poller()
        self._items: list[Any] = []
        self._by_key: dict[Any, Any] = {}

    def register(self, item: Any) -> None:
        if item not in self._items:
            self._items.append(item)
        self._sync()

    def unregister(self, item: Any) -> None:
        if item in self._items:
            self._items.remove(item)
        self._sync()

    def _sync(self) -> None:
        wanted: dict[Any, Any] = {}
        for item in self._items:
            keys = item.poll_keys() if hasattr(item, "poll_keys") else [item.fileno_obj()]
            wanted.update((key, item) for key in keys)
        for key in self._by_key.keys() - wanted.keys():
            self._poller.unregister(key)
        for key in wanted.keys() - self._by_key.keys():
            self._poller.register(key, zmq.POLLIN)
        self._by_key = wanted

    def wait(self, timeout_s: float) -> list[Any]:
        """The registered items that are readable, each once, waiting at most ``timeout_s``."""
        self._sync()
        try:
            events = self._poller.poll(int(max(0.0, timeout_s) * 1000))
        except zmq.ZMQError as exc:
            raise TransportError(f"poll failed: {exc}") from exc
        ready: list[Any] = []
        for key, _ in events:
            item = self._by_key.get(key)
            if item is not None and item not in ready:
                ready.append(item)
        return ready


__all__ = [
    "ZmqChannel",
    "Router",
    "Poller",
    "dealer",
    "push",
    "pull",
    "data_endpoint_for",
    "reachable_endpoint",
]

"""ZeroMQ sockets: the ONLY module that imports ``zmq``.

``ZmqChannel`` (DEALER, PUSH, PULL) is a ``channel.Channel``; ``Router`` is the
daemon's well-known endpoint (a ``channel.RouterLike``); ``Poller`` waits until
any registered channel (or an ``inproc.Waker``) is readable.

Every socket has ``linger=0`` and is closed on every path; every receive takes a
timeout; zmq errors become ``TransportError``/``ServiceUnavailableError`` naming
the endpoint. Multipart frames are received with ``copy=False`` so large array
frames are used in place.

Authentication (``transport.auth`` holds the keys as plain data): a daemon
with keys binds its sockets as CURVE servers in a context of its own
(``AuthServer``), whose ZAP handler (``zmq.auth.thread.ThreadAuthenticator``)
admits only the listed public keys; a peer's DEALER and PUSH sockets are CURVE
clients when given keys (or when ``LOADER_PEER_KEY`` and
``LOADER_DAEMON_PUBLIC_KEY`` name key files). A peer without an admitted key
never completes the handshake: not one of its messages reaches the daemon.
Every daemon socket has a maximum inbound message part size (``MAXMSGSIZE``): a
peer that sends a bigger part is disconnected by zmq before the daemon buffers it.
zmq bounds parts, not whole messages (it delivers a multipart message only whole),
so many parts each under the bound are all buffered: only CURVE keeps such a peer
out (docs/security.md, "Exhaustion").
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import time
from collections.abc import Sequence
from typing import Any

import zmq
import zmq.utils.garbage  # its exit hook registered now, before ours (``service/local.py``)

from loader.errors import ConfigError, ServiceUnavailableError, TransportError
from loader.service.transport.auth import CurveClient, CurveServer, peer_from_env

log = logging.getLogger("loader.daemon")

SEND_TIMEOUT_S = 10.0
# Frames at least this large are sent without copying (zmq keeps a reference).
ZERO_COPY_MIN_BYTES = 64 * 1024
# Messages queued per peer before a sender blocks: bounded, and large enough for bursts.
HIGH_WATER_MARK = 64
# Bytes of a random DEALER identity: a ROUTER routes by it, so it must not be guessable (zmq's own are counters).
IDENTITY_BYTES = 16

Frames = list[Any]


def _context() -> zmq.Context:
    return zmq.Context.instance()


def _translate(exc: zmq.ZMQError, action: str, endpoint: str) -> TransportError:
    if exc.errno == zmq.EADDRINUSE:
        return TransportError(f"cannot bind {endpoint}: address already in use (is another daemon running?)")
    return TransportError(f"{action} {endpoint} failed: {exc}")


class AuthServer:
    """A daemon's CURVE side: its own zmq context with a ZAP handler admitting ``keys.allowed``.

    Its own context, because a context has one ZAP handler and tests run several daemons in one
    process. ``close()`` (after the daemon's sockets are closed) stops the handler; idempotent.
    """

    def __init__(self, keys: CurveServer) -> None:
        # Imported here: zmq.auth.thread imports asyncio (about 20 ms), which every process (daemon, worker,
        # client) paid at start-up, with or without CURVE.
        from zmq.auth.thread import ThreadAuthenticator

        self.keys = keys
        self.context = zmq.Context()
        self._auth = ThreadAuthenticator(self.context)
        self._auth.start()
        self._auth.configure_curve_callback(domain="*", credentials_provider=_Allowed(keys.allowed))
        self.closed = False

    def secure(self, sock: zmq.Socket) -> None:
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_SECRETKEY, self.keys.secret)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, self.keys.public)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._auth.stop()
            self.context.term()


class _Allowed:
    """``ThreadAuthenticator``'s credentials provider: is this (z85) public key listed?

    A refusal is logged (a warning, once a minute per key, for at most ``DENIALS_REMEMBERED`` keys at a time):
    a peer refused gets no answer at all, so the daemon's log is where an operator learns of a wrong key."""

    def __init__(self, allowed: frozenset[bytes]) -> None:
        self.allowed = allowed
        self._said: dict[bytes, float] = {}  # key -> when its refusal was last logged

    def callback(self, domain: str, key: bytes) -> bool:
        if key in self.allowed:
            return True
        now = time.monotonic()
        if now - self._said.get(key, -DENIAL_LOG_EVERY_S) >= DENIAL_LOG_EVERY_S:
            if len(self._said) >= DENIALS_REMEMBERED:
                self._said.clear()
            self._said[key] = now
            log.warning(
                "refused a peer with CURVE public key %s: it is not in service.authorized_keys",
                key.decode("ascii", "replace")[:40],
            )
        return False


DENIAL_LOG_EVERY_S = 60.0
DENIALS_REMEMBERED = 1024


def curve_keypair() -> tuple[bytes, bytes]:
    """A fresh (public, secret) CURVE key pair, z85-encoded."""
    return zmq.curve_keypair()


def create_key_files(directory: str, name: str) -> tuple[str, str]:
    """Write ``name.key`` (public) and ``name.key_secret`` (owner-only) into ``directory``; their paths."""
    import zmq.auth  # only where keys are made or read (``AuthServer``)

    os.makedirs(directory, mode=0o700, exist_ok=True)
    public, secret = zmq.auth.create_certificates(directory, name)
    os.chmod(secret, 0o600)
    return str(public), str(secret)


def load_key_file(path: str) -> tuple[bytes, bytes | None]:
    """(public, secret or None) from a zmq certificate file; ``ConfigError`` naming the file otherwise."""
    import zmq.auth

    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read CURVE key file {path}: {exc}") from exc
    if public is None:
        raise ConfigError(f"cannot read CURVE key file {path}: it holds no public key")
    return public, secret


def load_public_keys(directory: str) -> frozenset[bytes]:
    """The public keys of every ``*.key`` file in ``directory``."""
    if not os.path.isdir(directory):
        raise ConfigError(f"authorized keys directory {directory} does not exist")
    import zmq.auth

    keys = frozenset(zmq.auth.load_certificates(directory))
    if not keys:
        raise ConfigError(
            f"authorized keys directory {directory} holds no public key (*.key): the daemon would admit no client "
            "nor hand-started worker (`loader keys DIR` makes them)"
        )
    return keys


HANDSHAKE_TIMEOUT_MS = 5000


class _Socket:
    """One zmq socket with the house settings; ``close()`` is idempotent."""

    _watch: PeerWatch | None = None  # a connecting socket's, made on demand or before it connects

    def __init__(
        self,
        kind: int,
        endpoint: str,
        *,
        bind: bool,
        identity: bytes | None = None,
        curve: CurveClient | None = None,
        server: AuthServer | None = None,
        max_message_bytes: int | None = None,
        watched: bool = False,
    ) -> None:
        """``watched``: a connecting socket's ``PeerWatch`` is made before it connects, so that it sees the first
        connection's events (a peer that breaks off the handshake is not dialled again)."""
        self._sock = (server.context if server is not None else _context()).socket(kind)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.SNDHWM, HIGH_WATER_MARK)
        self._sock.setsockopt(zmq.RCVHWM, HIGH_WATER_MARK)
        if max_message_bytes is not None:
            self._sock.setsockopt(zmq.MAXMSGSIZE, int(max_message_bytes))
        if identity is not None:
            self._sock.setsockopt(zmq.IDENTITY, identity)
        if kind == zmq.ROUTER:
            # A reply to a vanished client must fail loudly, not vanish silently.
            self._sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        if bind:
            # A connection that has not finished zmq's handshake (or CURVE's) in this time is dropped: the 30 s
            # default let a flood of half-open connections hold the daemon's file descriptors.
            self._sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_TIMEOUT_MS)
        if server is not None:
            server.secure(self._sock)
        elif curve is not None:
            self._sock.setsockopt(zmq.CURVE_SERVERKEY, curve.server_public)
            self._sock.setsockopt(zmq.CURVE_PUBLICKEY, curve.public)
            self._sock.setsockopt(zmq.CURVE_SECRETKEY, curve.secret)
        self.endpoint = endpoint
        try:
            if bind:
                _refuse_live_ipc(endpoint)
                self._sock.bind(endpoint)
                self.endpoint = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
                _owner_only(self.endpoint)
            else:
                if watched:
                    self._watch = PeerWatch(self._sock, connecting=True)
                self._sock.connect(endpoint)
        except zmq.ZMQError as exc:
            self._close_unused()
            raise _translate(exc, "bind" if bind else "connect", endpoint) from exc
        except BaseException:
            self._close_unused()
            raise
        self.closed = False

    def _close_unused(self) -> None:
        if self._watch is not None:
            self._watch.close()
        self._sock.close(0)

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


def _refuse_live_ipc(endpoint: str) -> None:
    """Refuse to bind an ``ipc://PATH`` something still listens on.

    zmq binds over an existing socket file (it unlinks it first): a second daemon on the same path would
    silently take it from the first, which keeps running unreachable. A file nothing answers on is a
    stale one (a daemon killed with SIGKILL) and is left for zmq to replace."""
    path = endpoint[len("ipc://") :] if endpoint.startswith("ipc://") else ""
    if not path or path == "*" or path.startswith("@") or not os.path.exists(path):
        return
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(IPC_PROBE_TIMEOUT_S)
        probe.connect(path)
    except OSError:
        return  # refused (stale), not a socket, or unreachable: zmq's bind says what it makes of it
    finally:
        probe.close()
    raise TransportError(f"cannot bind {endpoint}: address already in use (is another daemon running?)")


IPC_PROBE_TIMEOUT_S = 1.0


def _owner_only(endpoint: str) -> None:
    """An ``ipc://`` socket file gets mode 0600: other local users cannot connect to it."""
    if endpoint.startswith("ipc://"):
        path = endpoint[len("ipc://") :]
        if path and not path.startswith("@"):  # "@name": Linux abstract namespace, no file
            os.chmod(path, 0o600)


def _nbytes(frame: Any) -> int:
    try:
        return memoryview(frame).nbytes
    except TypeError:
        return len(frame)


def load_peer_watch() -> Any:
    """zmq's monitor-event reader, imported on first use: zmq.utils.monitor imports asyncio (about 20 ms), which
    workers and the daemon never need. A client calls this as its module is imported, so the import happens in
    that thread, not in its receiver thread at a moment when the training script might fork (a child would
    inherit the import lock held)."""
    from zmq.utils.monitor import recv_monitor_message

    return recv_monitor_message


# PeerWatch.handshake_broken: how a connection's handshake failed.
HANDSHAKE_MECHANISM = "mechanism"  # zmq's mechanism mismatch: one side has CURVE keys, the other none
HANDSHAKE_AUTH = "auth"  # the peer's authenticator refused this side's CURVE key
HANDSHAKE_BROKEN = "broken"  # closed by the peer mid-handshake: another protocol, socket kind or CURVE key
HANDSHAKE_SLOW = "slow"  # dropped unfinished after SLOW_HANDSHAKE_S or more: a busy daemon, or another protocol's
SLOW_HANDSHAKE_S = 1.0  # broken off later than this after its connection: not refused at once
REDIAL_GRACE_S = 0.5  # zmq says it dials again just after a drop: not heard from within this, it will not
HOPELESS_FAILURES = 3  # handshakes refused at once in a row (PeerWatch.handshake_hopeless), where zmq dials again
MECHANISM_MISMATCH = 0x11000002  # ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH (not exported by every pyzmq)
_HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)


class PeerWatch:
    """Whether the peer a connecting socket dialled still listens, from zmq's monitor events (read without
    blocking, by the thread that owns the socket).

    zmq reconnects by itself and says nothing to the sender, so a peer killed with SIGKILL (the OOM killer)
    was found only by its silence, after a client's ``timeout_s``. Once the connection drops, each attempt to
    reconnect that the peer's host refuses ends in ``EVENT_CLOSED``: nothing listens at that address any more.
    An attempt that hangs (a network partition) ends in no event, so a partition is left to the silence
    check, as before; a reconnection clears the count.

    A connection that something accepts but whose ZeroMQ handshake breaks off is told apart too
    (``handshake_broken``): the address is another program's, a daemon's metrics port or data socket, or
    the two sides disagree on CURVE. A client pointed there waited its timeout to be told about keys.
    Handshakes dropped only after a while (``HANDSHAKE_SLOW``) are a daemon too busy to finish one, or a
    server of another protocol timing out a client that says nothing it understands: ``client.ask``'s
    ``ConnectJudge`` asks such an address once as HTTP to tell them apart."""

    _EVENTS = (
        zmq.EVENT_CONNECTED
        | zmq.EVENT_HANDSHAKE_SUCCEEDED
        | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
        | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
        | zmq.EVENT_HANDSHAKE_FAILED_AUTH
        | zmq.EVENT_DISCONNECTED
        | zmq.EVENT_CONNECT_RETRIED
        | zmq.EVENT_CLOSED
    )

    def __init__(self, sock: zmq.Socket, *, connecting: bool = False) -> None:
        """``connecting``: made before the socket's first connection, whose refusals count too (a client's
        handshake with an address where nothing listens)."""
        self._recv_event = load_peer_watch()
        self._sock = sock
        self._monitor: zmq.Socket | None = sock.get_monitor_socket(self._EVENTS)
        self._lost = connecting
        self._refused_since: float | None = None
        self._shaking = False  # connected, handshake not done yet
        self._broken: str | None = None  # how the last handshake failed (HANDSHAKE_*), until one succeeds
        self._broken_since = 0.0  # when handshakes began to fail
        self._quick_failures = 0  # handshakes failed at once since the last that succeeded
        self._redialing = False  # zmq said it will dial again since the connection last dropped
        self._connected_at = 0.0  # when the last connection was made (as read)
        self._dropped_at = 0.0  # when it dropped (as read)

    def refused_for(self, now: float) -> float:
        """Seconds since the first refused reconnection of a connection that dropped and has not come back."""
        self._read(now)
        return 0.0 if self._refused_since is None else now - self._refused_since

    def refusing(self, now: float) -> bool:
        """Whether the peer's address refuses connections now (none came back since the first refusal)."""
        self._read(now)
        return self._refused_since is not None

    def handshake_broken(self, now: float) -> str | None:
        """How the last connection's handshake failed, if none has succeeded since: ``HANDSHAKE_MECHANISM``
        (one side has CURVE keys, the other not), ``HANDSHAKE_AUTH`` (the peer refused this side's key),
        ``HANDSHAKE_BROKEN`` (the peer closed it at once, or spoke something else) or ``HANDSHAKE_SLOW``
        (dropped unfinished after a while)."""
        self._read(now)
        return self._broken

    def handshake_hopeless(self, now: float, after_s: float) -> bool:
        """Whether waiting for a handshake is pointless: handshakes have failed for ``after_s``, and zmq will not
        dial again (it gives up after a refused key, or a mechanism or socket kind that does not pair), or
        ``HOPELESS_FAILURES`` failed at once (another program answering). Never for handshakes dropped unfinished
        after a while (``HANDSHAKE_SLOW``): a daemon too busy to finish one in its 5 s drops it, and the next may
        pass."""
        self._read(now)
        if self._broken is None or self._broken == HANDSHAKE_SLOW or now - self._broken_since < after_s:
            return False
        given_up = not self._redialing and now - self._dropped_at >= REDIAL_GRACE_S
        return given_up or self._quick_failures >= HOPELESS_FAILURES

    def _broke(self, how: str, now: float) -> None:
        if how == HANDSHAKE_BROKEN and now - self._connected_at >= SLOW_HANDSHAKE_S:
            how = HANDSHAKE_SLOW  # dropped unfinished after a while, not refused at once
        else:
            self._quick_failures += 1
        if self._broken is None:
            self._broken_since = now
        self._broken, self._shaking = how, False

    def _read(self, now: float) -> None:
        while self._monitor is not None:
            try:
                if not int(self._monitor.get(zmq.EVENTS)) & zmq.POLLIN:  # asked every round: 1.5 us, a raised Again 3
                    return
                event = self._recv_event(self._monitor, zmq.NOBLOCK)
            except zmq.ZMQError:  # the monitor went away with its socket: nothing more to learn
                return
            self._on_event(event.get("event"), event.get("value"), now)

    def _on_event(self, kind: Any, value: Any, now: float) -> None:
        """One monitor event, read at ``now``."""
        if kind in (zmq.EVENT_CONNECTED, zmq.EVENT_HANDSHAKE_SUCCEEDED):
            self._lost, self._refused_since = False, None
            self._shaking = kind == zmq.EVENT_CONNECTED
            if kind == zmq.EVENT_CONNECTED:
                self._connected_at = now
            else:
                self._broken, self._quick_failures = None, 0
        elif kind == zmq.EVENT_CONNECT_RETRIED:
            self._redialing = True
        elif kind == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL and value == MECHANISM_MISMATCH:
            self._broke(HANDSHAKE_MECHANISM, now)
        elif kind == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            self._broke(HANDSHAKE_AUTH, now)
        elif kind & _HANDSHAKE_FAILED:
            self._broke(HANDSHAKE_BROKEN, now)
        elif kind == zmq.EVENT_DISCONNECTED:
            if self._shaking:  # dropped before any handshake event: a socket of a kind that does not pair
                self._broke(HANDSHAKE_BROKEN, now)
            self._lost, self._redialing, self._dropped_at = True, False, now
        elif kind == zmq.EVENT_CLOSED and self._lost and self._refused_since is None:
            self._refused_since = now

    def close(self) -> None:
        if self._monitor is None:
            return
        monitor, self._monitor = self._monitor, None
        try:
            self._sock.disable_monitor()
        except zmq.ZMQError:  # the socket is closed already
            pass
        monitor.close(0)


class ZmqChannel(_Socket):
    """A point-to-point zmq socket: DEALER (control), PUSH or PULL (data)."""

    def watch_peer(self, *, connecting: bool = False) -> PeerWatch:
        """This socket's ``PeerWatch`` (made once, in the thread that uses the socket from then on; a thread that
        starts after it was made, such as a client's receiver after its handshake, may take it over)."""
        if self._watch is None:
            self._watch = PeerWatch(self._sock, connecting=connecting)
        return self._watch

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
        super().close()

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

    def __init__(
        self, endpoint: str, *, server: AuthServer | None = None, max_message_bytes: int | None = None
    ) -> None:
        super().__init__(zmq.ROUTER, endpoint, bind=True, server=server, max_message_bytes=max_message_bytes)

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


def dealer(
    endpoint: str,
    identity: bytes | None = None,
    curve: CurveClient | None = None,
    max_message_bytes: int | None = None,
    watched: bool = False,
) -> ZmqChannel:
    """A peer's control socket; a random identity unless given; CURVE keys given or from the environment;
    messages over ``max_message_bytes`` dropped unread (None: no bound); ``watched``: its ``PeerWatch`` made
    before it connects (``watch_peer`` gives it)."""
    if identity is None:
        identity = b"\x01" + secrets.token_bytes(IDENTITY_BYTES - 1)  # zmq reserves a leading zero byte
    return ZmqChannel(
        zmq.DEALER,
        endpoint,
        bind=False,
        identity=identity,
        curve=curve or peer_from_env(),
        max_message_bytes=max_message_bytes,
        watched=watched,
    )


def push(endpoint: str, curve: CurveClient | None = None) -> ZmqChannel:
    return ZmqChannel(zmq.PUSH, endpoint, bind=False, curve=curve or peer_from_env())


def pull(endpoint: str, *, server: AuthServer | None = None, max_message_bytes: int | None = None) -> ZmqChannel:
    return ZmqChannel(zmq.PULL, endpoint, bind=True, server=server, max_message_bytes=max_message_bytes)


def data_endpoint_for(control: str, port: int = 0) -> str:
    """Where the daemon binds its data socket, next to the control endpoint (TCP: on ``port``, 0 for any)."""
    if control.startswith("tcp://"):
        host = control[len("tcp://") :].rsplit(":", 1)[0]
        return f"tcp://{host}:{port or '*'}"
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
    "AuthServer",
    "curve_keypair",
    "create_key_files",
    "load_key_file",
    "load_public_keys",
    "ZmqChannel",
    "Router",
    "Poller",
    "dealer",
    "push",
    "pull",
    "data_endpoint_for",
    "reachable_endpoint",
]

"""The daemon's HTTP endpoint for operators: ``/metrics`` (Prometheus), ``/healthz``, ``/readyz``.

Configured by ``[service] metrics = "HOST:PORT"`` (off by default). Served by
one small WSGI app (``prometheus_client.make_wsgi_app`` plus the two probes) on
a ``wsgiref`` server whose daemon thread ``MetricsServer`` owns and ``close()``
stops within ``CLOSE_TIMEOUT_S``; each connection gets a thread of its own (at
most ``MAX_CONNECTIONS``), a read timeout and a whole-request deadline. When
every slot is taken, a new connection takes the slot of the one that has waited
longest without sending a complete request (that one is shut down); only when
every slot is answering a request is the new one closed. So idle connections,
however many a peer holds, cannot keep a probe out.

The HTTP thread never touches daemon state: the daemon's own thread calls
``publish`` every ``PUBLISH_INTERVAL_S`` (on a housekeeping tick) with a fresh immutable ``Snapshot``
(``snapshot.py``) and the collector reads the latest one.

- ``/healthz``: 200 while the daemon's loop keeps publishing (its last
  snapshot is younger than ``STALE_AFTER_S``), 503 when it is stuck.
- ``/readyz``: 200 once a worker is connected and the file list is read,
  503 before (a Kubernetes Service sends no trainer to it until then).

``prometheus_client`` is the optional ``metrics`` extra; without it a daemon
configured for metrics fails at start with the pip command to run.
"""

from __future__ import annotations

import logging
import re
import select
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import Any, cast
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from loader.errors import ConfigError
from loader.service.daemon.snapshot import METRICS, Snapshot, Snapshotter

log = logging.getLogger("loader.metrics")

PUBLISH_INTERVAL_S = 0.5  # how old a scraped value may be; each snapshot costs the loop ~0.1-0.2 ms
STALE_AFTER_S = 30.0  # a loop silent this long is not alive (housekeeping runs every ~0.1 s)
CLOSE_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 5.0  # a client whose next bytes take longer than this is dropped
REQUEST_DEADLINE_S = 10.0  # ... and one whose whole request and answer take longer
MAX_CONNECTIONS = 32  # served at once; a newer one displaces the longest idle (see _Server)
EVICT_WAIT_S = 1.0  # how long a new connection waits for the one it displaced to give its slot back
SERVE_POLL_S = 0.2
# The package is not on the package index (README, "Install"): the extra comes from the project's checkout or a
# wheel built from it, not from `pip install 'loader-service[metrics]'`, which finds no distribution.
INSTALL_HINT = (
    "install the metrics extra from the project's checkout or the wheel you built "
    "(pip install '/path/to/loader[metrics]', or pip install prometheus-client), or set service.metrics = \"\""
)
_ADDRESS = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^:/\s\[\]]+)):(?P<port>\d+)$")


def require_prometheus_client() -> Any:
    """The ``prometheus_client`` module, or ``ConfigError`` saying how to install it."""
    try:
        import prometheus_client
    except ImportError:
        raise ConfigError(
            f"service.metrics is set but the prometheus_client package is not installed: {INSTALL_HINT}"
        ) from None
    return prometheus_client


class _Collector:
    """A prometheus_client collector over the latest published snapshot."""

    def __init__(self, latest: Callable[[], Snapshot | None]) -> None:
        self._latest = latest

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        snapshot = self._latest()
        by_name: dict[str, list[tuple[tuple[tuple[str, str], ...], float]]] = {}
        for name, labels, value in snapshot.samples if snapshot is not None else ():
            by_name.setdefault(name, []).append((labels, value))
        for name, kind, label_names, help_text in METRICS:
            family_cls = CounterMetricFamily if kind == "counter" else GaugeMetricFamily
            family = family_cls(name, help_text, labels=list(label_names))
            for labels, value in by_name.get(name, ()):
                family.add_metric([v for _, v in labels], value)
            yield family


class _QuietHandler(WSGIRequestHandler):
    timeout = REQUEST_TIMEOUT_S  # a socket timeout: one read that waits this long ends the connection

    def parse_request(self) -> bool:
        # The request is complete (headers read, within http.server's limits): from now on this connection is
        # answering and keeps its slot. False (nothing to answer) if it was displaced meanwhile.
        return super().parse_request() and cast("_Server", self.server).answering(self.connection)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)


class _Slot:
    """A connection holding one of the ``MAX_CONNECTIONS`` slots: since when, whether it is answering a complete
    request (then it is never displaced), whether it was cut (shut down; its thread is ending)."""

    __slots__ = ("since", "answering", "cut")

    def __init__(self, since: float) -> None:
        self.since = since
        self.answering = False
        self.cut = False


class _Server(ThreadingMixIn, WSGIServer):
    """A thread per connection, at most ``MAX_CONNECTIONS`` at once, so one idle or slow client cannot hold the
    probes: with one serving thread, a connection trickling a byte a second made every /healthz time out, and
    Kubernetes' liveness probe would restart a healthy daemon. Closing every connection past the limit was not
    enough either: a peer holding 33 idle connections (reopening each one dropped) failed 19 of 20 probes. So
    when every slot is taken the acceptor shuts down the connection that has held its slot longest without a
    complete request, waits (``EVICT_WAIT_S`` at most) for its thread to give the slot back, and admits the new
    one; it turns the new one away only when every slot is answering a request, which lasts
    ``REQUEST_DEADLINE_S`` at most. A connection whose bytes wait unread is not idle, so a probe loses its slot
    only if ``MAX_CONNECTIONS`` newer connections come in the moment between its thread reading its request and
    parsing it (a peer holding 40 idle connections and reopening each one dropped: 30 of 30 probes answered).

    A slot is given back by the connection's own thread, just before it closes its socket, and only the
    acceptor (or ``server_close``) shuts one down, under ``_lock`` while it is held: nobody shuts down a
    descriptor that was closed and perhaps reused for another file, and the count is exact. The acceptor only
    shuts a socket down (the blocked read or write returns at once); closing it under its thread could hand its
    descriptor number to a new file that thread would then read."""

    daemon_threads = True
    block_on_close = False  # close() stays bounded: server_close cuts every connection left
    request_queue_size = 64

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._lock = threading.Condition()  # guards _held; the acceptor waits on it for a slot to be given back
        self._held: dict[socket.socket, _Slot] = {}  # in the order admitted: the first idle one is the longest
        super().__init__(*args, **kwargs)

    def held(self) -> int:
        """How many slots are taken now."""
        with self._lock:
            return len(self._held)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._admit(request):
            log.debug("metrics: every connection slot is answering; closed one from %s", client_address)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._give_back(request)  # no thread started to give it back
            raise

    def _admit(self, request: socket.socket) -> bool:
        give_up = time.monotonic() + EVICT_WAIT_S
        with self._lock:
            while len(self._held) >= MAX_CONNECTIONS:
                if not any(slot.cut for slot in self._held.values()):  # none on its way out already: make one
                    idle = (sock for sock, slot in self._held.items() if not slot.answering and not _unread(sock))
                    longest = next(idle, None)
                    if longest is None:
                        return False
                    log.debug("metrics: every connection slot is taken; dropped the longest idle one")
                    self._cut(longest)
                left = give_up - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
            self._held[request] = _Slot(time.monotonic())
            return True

    def answering(self, request: socket.socket) -> bool:
        """Called by a connection's thread once its request is complete: whether to answer it (False: displaced)."""
        with self._lock:
            slot = self._held.get(request)
            if slot is None or slot.cut:
                return False
            slot.answering = True
            return True

    def _give_back(self, request: socket.socket) -> None:
        with self._lock:
            if self._held.pop(request, None) is not None:
                self._lock.notify()

    def _cut(self, request: socket.socket) -> None:
        # Called with _lock held and request in _held: its thread has not closed it (see the class docstring).
        self._held[request].cut = True
        try:
            request.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def shutdown_request(self, request: Any) -> None:
        # Called on a connection's own thread as it ends (and by the acceptor for one it turned away): the slot goes
        # back before the socket is closed.
        self._give_back(request)
        super().shutdown_request(request)

    def service_actions(self) -> None:
        # The whole-request deadline, checked by the acceptor (every SERVE_POLL_S at most) rather than by a timer
        # thread per connection: a client trickling a byte a second never trips the read timeout.
        expired = time.monotonic() - REQUEST_DEADLINE_S
        with self._lock:
            for request, slot in self._held.items():
                if not slot.cut and slot.since < expired:
                    self._cut(request)

    def server_close(self) -> None:
        # No acceptor checks deadlines from now on: end every connection left rather than let one trickle forever.
        with self._lock:
            for request, slot in self._held.items():
                if not slot.cut:
                    self._cut(request)
        super().server_close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver prints a traceback to stderr for each failed request (a client that timed out): one line.
        log.debug("metrics: a request from %s failed: %s", client_address, sys.exc_info()[1])


def _unread(sock: socket.socket) -> bool:
    """Whether bytes (or the end) from ``sock``'s peer wait unread: its thread has not got to them yet, so it is
    not idle (a probe whose request just arrived). Its thread reads whatever comes, so this does not last."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


class _Server6(_Server):
    address_family = socket.AF_INET6


def parse_address(address: str) -> tuple[str, int, bool]:
    """(host, port, ipv6) of ``"HOST:PORT"`` or ``"[V6]:PORT"``."""
    match = _ADDRESS.match(address)
    if match is None or not 0 <= int(match["port"]) <= 65535:
        raise ConfigError(f"service.metrics must look like 'HOST:PORT', got {address!r}")
    if match["v6"] is not None:
        return match["v6"], int(match["port"]), True
    return match["host"], int(match["port"]), False


class MetricsServer:
    """``/metrics``, ``/healthz`` and ``/readyz`` at ``address``; see the module docstring. Context manager."""

    def __init__(self, address: str) -> None:
        prometheus_client = require_prometheus_client()
        host, port, ipv6 = parse_address(address)
        self._snapshot: Snapshot | None = None
        self.snapshotter = Snapshotter()  # used on the daemon's thread only
        self._closed = False
        registry = prometheus_client.CollectorRegistry(auto_describe=False)
        registry.register(_Collector(lambda: self._snapshot))
        self._metrics_app = prometheus_client.make_wsgi_app(registry)
        try:
            self._server = make_server(
                host, port, self._app, server_class=_Server6 if ipv6 else _Server, handler_class=_QuietHandler
            )
        except OSError as exc:
            raise ConfigError(f"service.metrics cannot listen on {address}: {exc.strerror or exc}") from exc
        bound = self._server.server_address[1]
        self.address = f"[{host}]:{bound}" if ipv6 else f"{host}:{bound}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(SERVE_POLL_S,), name="loader-metrics", daemon=True
        )
        self._thread.start()
        log.info("metrics, /healthz and /readyz on http://%s", self.address)

    def due(self, now: float) -> bool:
        """Called on the daemon's thread each housekeeping tick: whether to take a snapshot now."""
        snapshot = self._snapshot
        return snapshot is None or now - snapshot.taken_at >= PUBLISH_INTERVAL_S

    def publish(self, snapshot: Snapshot) -> None:
        """Called on the daemon's thread: make ``snapshot`` the one scrapes read (one reference swap)."""
        self._snapshot = snapshot

    def _app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("REQUEST_METHOD") not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Content-Type", "text/plain"), ("Allow", "GET, HEAD")])
            return [b"only GET and HEAD\n"]
        path = environ.get("PATH_INFO", "")
        if path in ("/healthz", "/readyz"):
            ok, text = self._probe(path)
            start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")])
            return [text.encode() + b"\n"]
        if path in ("/metrics", "/"):
            return self._metrics_app(environ, start_response)
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found: try /metrics, /healthz or /readyz\n"]

    def _probe(self, path: str) -> tuple[bool, str]:
        snapshot = self._snapshot
        if snapshot is None:
            return path == "/healthz", "starting"  # alive while it starts; not ready
        age = time.monotonic() - snapshot.taken_at
        if age > STALE_AFTER_S:
            return False, f"the daemon loop has not run for {age:.0f} s"
        if path == "/healthz":
            return True, "ok"
        return (True, "ready") if snapshot.ready else (False, "not ready: no worker connected yet")

    def close(self) -> None:
        """Stop serving (bounded) and release the port. Idempotent."""
        if self._closed:
            return
        self._closed = True
        stopper = threading.Thread(target=self._server.shutdown, name="loader-metrics-stop", daemon=True)
        stopper.start()
        stopper.join(CLOSE_TIMEOUT_S)
        self._thread.join(CLOSE_TIMEOUT_S)
        self._server.server_close()

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def start_metrics(address: str) -> MetricsServer:
    """A started ``MetricsServer`` (its ``snapshotter`` is for the daemon's thread to feed it)."""
    return MetricsServer(address)


__all__ = ["MetricsServer", "start_metrics", "require_prometheus_client", "parse_address", "STALE_AFTER_S"]

"""The daemon's HTTP endpoint for operators: ``/metrics`` (Prometheus), ``/healthz``, ``/readyz``.

Configured by ``[service] metrics = "HOST:PORT"`` (off by default). Served by
one small WSGI app (``prometheus_client.make_wsgi_app`` plus the two probes) on
a ``wsgiref`` server whose daemon thread ``MetricsServer`` owns and ``close()``
stops within ``CLOSE_TIMEOUT_S``; each connection gets a thread of its own (at
most ``MAX_CONNECTIONS``), a read timeout and a whole-request deadline.

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
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from loader.errors import ConfigError
from loader.service.daemon.snapshot import METRICS, Snapshot, Snapshotter

log = logging.getLogger("loader.metrics")

PUBLISH_INTERVAL_S = 0.5  # how old a scraped value may be; each snapshot costs the loop ~0.1-0.2 ms
STALE_AFTER_S = 30.0  # a loop silent this long is not alive (housekeeping runs every ~0.1 s)
CLOSE_TIMEOUT_S = 5.0
REQUEST_TIMEOUT_S = 5.0  # a client whose next bytes take longer than this is dropped
REQUEST_DEADLINE_S = 10.0  # ... and one whose whole request and answer take longer
MAX_CONNECTIONS = 32  # served at once; more are closed at once
SERVE_POLL_S = 0.2
_ADDRESS = re.compile(r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^:/\s\[\]]+)):(?P<port>\d+)$")


def require_prometheus_client() -> Any:
    """The ``prometheus_client`` module, or ``ConfigError`` saying how to install it."""
    try:
        import prometheus_client
    except ImportError:
        raise ConfigError(
            "service.metrics is set but the prometheus_client package is not installed: "
            "pip install 'loader-service[metrics]' (or set service.metrics = \"\")"
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

    def handle(self) -> None:
        # A whole-request deadline as well: a client trickling a byte a second never trips the read timeout.
        timer = threading.Timer(REQUEST_DEADLINE_S, self._cut)
        timer.daemon = True
        timer.start()
        try:
            super().handle()
        finally:
            timer.cancel()

    def _cut(self) -> None:
        try:
            self.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)


class _Server(ThreadingMixIn, WSGIServer):
    """A thread per connection, at most ``MAX_CONNECTIONS`` at once (more are closed at once), so one idle or
    slow client cannot hold the probes: with one serving thread, a connection trickling a byte a second made
    every /healthz time out, and Kubernetes' liveness probe would restart a healthy daemon."""

    daemon_threads = True
    block_on_close = False  # close() stays bounded; each connection ends by its deadline anyway
    request_queue_size = 64

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        super().__init__(*args, **kwargs)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # socketserver prints a traceback to stderr for each failed request (a client that timed out): one line.
        log.debug("metrics: a request from %s failed: %s", client_address, sys.exc_info()[1])


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

"""The metrics endpoint's connection slots against a peer that holds more idle connections than there are slots.

Closing every connection past ``MAX_CONNECTIONS`` let 33 idle holders fail 19 of 20 health probes (40 failed
all): Kubernetes' liveness probe would restart a healthy daemon. An idle connection now gives its slot up to a
newer one; one that is answering a request keeps it.
"""

from __future__ import annotations

import selectors
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("prometheus_client")  # the metrics extra (in the test extra: present in CI)
from loader.service.daemon import metrics
from loader.service.daemon.metrics import MAX_CONNECTIONS, MetricsServer

PROBE_TIMEOUT_S = 2.0


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def serving_threads() -> int:
    """The server's connection threads (``ThreadingMixIn`` names each after its target)."""
    return sum(thread.name.endswith("(process_request_thread)") for thread in threading.enumerate())


def probe(server: MetricsServer, path: str = "/healthz") -> int:
    started = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://{server.address}{path}", timeout=PROBE_TIMEOUT_S) as answer:
            status = answer.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    assert time.monotonic() - started < PROBE_TIMEOUT_S
    return status


class Holders:
    """``count`` connections that never send a byte; each one the server drops is reopened at once.

    One thread for all of them, which also notes the most threads the process had while they held."""

    def __init__(self, address: tuple[str, int], count: int) -> None:
        self.address = address
        self.reopened = 0
        self.most_threads = threading.active_count()
        self._selector = selectors.DefaultSelector()
        self._stop = threading.Event()
        for _ in range(count):
            self._open()
        self._thread = threading.Thread(target=self._hold, name="test-holders", daemon=True)
        self._thread.start()

    def _open(self) -> None:
        sock = socket.create_connection(self.address, timeout=5)
        sock.setblocking(False)
        self._selector.register(sock, selectors.EVENT_READ)

    def _hold(self) -> None:
        while not self._stop.is_set():
            self.most_threads = max(self.most_threads, threading.active_count())
            for key, _ in self._selector.select(0.05):
                sock: Any = key.fileobj
                try:
                    if sock.recv(1):
                        continue  # the server never says anything first
                except BlockingIOError:
                    continue
                except OSError:
                    pass  # reset: dropped as well
                self._selector.unregister(sock)
                sock.close()
                self._open()
                self.reopened += 1

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(5)
        assert not self._thread.is_alive()
        for key in list(self._selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        self._selector.close()


@pytest.fixture
def server() -> Iterator[MetricsServer]:
    with MetricsServer("127.0.0.1:0") as server:
        yield server


@pytest.fixture
def holders(server: MetricsServer) -> Iterator[Callable[[int], Holders]]:
    made: list[Holders] = []
    host, port = server.address.rsplit(":", 1)

    def make(count: int) -> Holders:
        made.append(Holders((host, int(port)), count))
        return made[-1]

    yield make
    for each in made:
        each.close()


def slow_path(server: MetricsServer) -> threading.Event:
    """Make ``/slow`` wait (answering, then 404) until the returned event is set: a connection busy answering."""
    release = threading.Event()
    app = server._server.get_app()

    def slow(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if environ.get("PATH_INFO") == "/slow":
            release.wait(5)
        return app(environ, start_response)

    server._server.set_app(slow)
    return release


def ask_slow(server: MetricsServer) -> socket.socket:
    host, port = server.address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=5)
    sock.sendall(b"GET /slow HTTP/1.0\r\n\r\n")
    return sock


def answer_of(sock: socket.socket) -> bytes:
    with sock:
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
        return data


def busy_slots(server: MetricsServer) -> int:
    with server._server._lock:
        return sum(slot.answering for slot in server._server._held.values())


def test_idle_holders_beyond_the_slots_do_not_hold_the_probes(server, holders):
    baseline = threading.active_count()
    held = holders(MAX_CONNECTIONS + 8)
    wait_for(lambda: serving_threads() >= MAX_CONNECTIONS)  # every slot held by an idle connection
    for _ in range(5):
        assert probe(server) == 200
        assert probe(server, "/metrics") == 200
    wait_for(lambda: held.reopened >= 10)  # the probes took slots from holders, which came straight back
    held.close()
    wait_for(lambda: server._server.held() == 0 and serving_threads() == 0)
    # One thread per slot: the holders' thread, and a connection thread or two just ending, beside them.
    assert held.most_threads <= baseline + MAX_CONNECTIONS + 3
    assert probe(server) == 200


def test_a_connection_answering_is_not_evicted(server, holders):
    release = slow_path(server)
    slow = ask_slow(server)  # the oldest connection of all, but its request is complete
    wait_for(lambda: busy_slots(server) == 1)
    held = holders(MAX_CONNECTIONS + 8)
    wait_for(lambda: serving_threads() >= MAX_CONNECTIONS)
    for _ in range(3):
        assert probe(server) == 200
    release.set()
    assert answer_of(slow).startswith(b"HTTP/1.0 404 ")  # answered, not cut
    held.close()
    wait_for(lambda: server._server.held() == 0)


def test_a_connection_is_turned_away_only_when_every_slot_is_answering(server):
    release = slow_path(server)
    slow = [ask_slow(server) for _ in range(MAX_CONNECTIONS)]
    try:
        wait_for(lambda: busy_slots(server) == MAX_CONNECTIONS)
        started = time.monotonic()
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            probe(server)
        assert time.monotonic() - started < 1.0  # closed at once, not left waiting
        assert server._server.held() == MAX_CONNECTIONS
    finally:
        release.set()
        answers = [answer_of(sock) for sock in slow]
    assert all(answer.startswith(b"HTTP/1.0 404 ") for answer in answers)
    wait_for(lambda: server._server.held() == 0)
    assert probe(server) == 200


def test_the_whole_request_deadline_still_cuts_a_trickling_client(server, monkeypatch):
    monkeypatch.setattr(metrics, "REQUEST_DEADLINE_S", 0.5)
    host, port = server.address.rsplit(":", 1)
    started = time.monotonic()
    with socket.create_connection((host, int(port)), timeout=5) as trickle:
        trickle.settimeout(0.1)
        cut = False
        for byte in b"GET /healthz HTTP/1.1\r\nX-Slow: " + b"a" * 100:
            try:
                trickle.send(bytes([byte]))  # a byte each 0.1 s: never the read timeout
                cut = trickle.recv(1) == b""
            except TimeoutError:
                continue
            except OSError:
                cut = True
            if cut:
                break
    assert cut and time.monotonic() - started < 0.5 + 2.0
    wait_for(lambda: server._server.held() == 0)


def test_close_ends_the_connections_left():
    server = MetricsServer("127.0.0.1:0")
    host, port = server.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as idle:
        wait_for(lambda: server._server.held() == 1)
        started = time.monotonic()
        server.close()
        assert idle.recv(1) == b""  # within the socket's 5 s: no acceptor checks deadlines any more
        assert time.monotonic() - started < 2.0
    wait_for(lambda: server._server.held() == 0 and serving_threads() == 0)

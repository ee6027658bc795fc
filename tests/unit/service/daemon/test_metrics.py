"""The metrics server without a daemon: probes from snapshots, families from the table, bounded close."""

from __future__ import annotations

import re
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from loader.config import LoaderConfig
from loader.errors import ConfigError
from loader.service.daemon.snapshot import METRICS, Snapshot

pytest.importorskip("prometheus_client")  # the metrics extra (in the test extra: present in CI)
from loader.service.daemon.metrics import STALE_AFTER_S, MetricsServer, parse_address

DOCS = Path(__file__).resolve().parents[4] / "docs" / "operations.md"


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.fixture
def server():
    with MetricsServer("127.0.0.1:0") as server:
        yield server


def test_probes_follow_the_published_snapshot(server):
    base = f"http://{server.address}"
    assert get(base + "/healthz")[0] == 200  # starting: alive
    assert get(base + "/readyz")[0] == 503  # and not ready
    server.publish(Snapshot(taken_at=time.monotonic(), ready=False, samples=()))
    assert get(base + "/readyz") == (503, "not ready: no worker connected yet\n")
    server.publish(Snapshot(taken_at=time.monotonic(), ready=True, samples=()))
    assert get(base + "/readyz")[0] == 200 and get(base + "/healthz")[0] == 200
    # A loop that stopped publishing is neither alive nor ready.
    server.publish(Snapshot(taken_at=time.monotonic() - STALE_AFTER_S - 1, ready=True, samples=()))
    assert get(base + "/healthz")[0] == 503 and get(base + "/readyz")[0] == 503
    assert get(base + "/other")[0] == 404


def test_metrics_come_from_the_latest_snapshot(server):
    samples = (("loader_leases", (), 7.0), ("loader_workers", (("state", "busy"),), 2.0))
    server.publish(Snapshot(taken_at=time.monotonic(), ready=True, samples=samples))
    status, text = get(f"http://{server.address}/metrics")
    assert status == 200
    assert "loader_leases_total 7.0" in text
    assert 'loader_workers{state="busy"} 2.0' in text
    for name, kind, _labels, _help in METRICS:
        exposed = f"{name}_total" if kind == "counter" else name  # the text format names counters *_total
        assert f"# TYPE {exposed} {kind}" in text


def test_close_is_bounded_idempotent_and_frees_the_port():
    server = MetricsServer("127.0.0.1:0")
    address = server.address
    started = time.monotonic()
    server.close()
    server.close()
    assert time.monotonic() - started < 10
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://{address}/healthz", timeout=5)
    MetricsServer(address).close()  # the port is free again


def test_a_port_in_use_is_one_clear_error(server):
    with pytest.raises(ConfigError, match=f"service.metrics cannot listen on {server.address}"):
        MetricsServer(server.address)


def test_missing_prometheus_client_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    # The package is on no index: the extra is installed from the checkout (or a wheel built from it).
    with pytest.raises(ConfigError, match=r"prometheus_client package is not installed: .*checkout") as info:
        MetricsServer("127.0.0.1:0")
    assert "pip install '/path/to/loader[metrics]'" in str(info.value)
    assert "loader-service[" not in str(info.value)


def test_addresses():
    assert parse_address("0.0.0.0:9100") == ("0.0.0.0", 9100, False)
    assert parse_address("[::1]:0") == ("::1", 0, True)
    for bad in ("9100", "host:", "http://h:1", "h:70000"):
        with pytest.raises(ConfigError, match="service.metrics"):
            parse_address(bad)


@pytest.mark.parametrize("bad", ["9100", "h:99999", "http://h:1", 9100])
def test_config_checks_the_metrics_address(bad):
    with pytest.raises(ConfigError, match="service.metrics must look like 'HOST:PORT'"):
        LoaderConfig.from_dict({"source": {"files": ["x"]}, "service": {"metrics": bad}})
    assert LoaderConfig.from_dict({"source": {"files": ["x"]}}).service.metrics == ""


def test_the_documented_table_is_the_exported_list():
    documented = re.findall(r"^\| `(loader_\w+)` \| (counter|gauge) \|", DOCS.read_text(), flags=re.M)
    assert documented == [(name, kind) for name, kind, _labels, _help in METRICS]


def test_frames_nbytes_counts_every_kind_of_frame():
    import numpy as np

    from loader.service.daemon.stage import frames_nbytes

    array = np.zeros((4, 3), np.float32)
    assert frames_nbytes([b"ab", array, memoryview(array), bytearray(5), array[:, :2]]) == 2 + 48 + 48 + 5 + 32


def test_an_idle_or_trickling_connection_does_not_hold_the_probes(server):
    # With one serving thread, a client sending a byte a second made every /healthz time out: Kubernetes'
    # liveness probe (1 s) would have restarted a healthy daemon.
    import socket
    import threading

    host, port = server.address.rsplit(":", 1)
    idle = socket.create_connection((host, int(port)), timeout=5)  # connected, never writes
    trickle = socket.create_connection((host, int(port)), timeout=5)
    stop = threading.Event()

    def drip() -> None:
        for byte in b"GET /healthz HTTP/1.1\r\n":
            if stop.wait(0.2):
                return
            try:
                trickle.send(bytes([byte]))
            except OSError:
                return

    dripping = threading.Thread(target=drip, daemon=True)
    dripping.start()
    try:
        for _ in range(3):
            assert get(f"http://{server.address}/healthz")[0] == 200  # within get()'s 5 s
    finally:
        stop.set()
        dripping.join(5)
        idle.close()
        trickle.close()


def test_only_get_and_head_are_answered(server):
    request = urllib.request.Request(f"http://{server.address}/healthz", method="DELETE")
    try:
        urllib.request.urlopen(request, timeout=5)
        raise AssertionError("DELETE was answered")
    except urllib.error.HTTPError as exc:
        assert exc.code == 405

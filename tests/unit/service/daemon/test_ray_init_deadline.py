"""``workers.launcher = "ray"`` where no cluster answers: ``ray.init`` gets a deadline, a stop signal ends
the wait at once, and absurd Ray keys are refused at config load. A fake ``ray`` module stands in for Ray
(no cluster, no network): its ``init`` blocks as Ray's did at an address where nothing listens."""

from __future__ import annotations

import signal
import sys
import threading
import time
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from loader.config import LoaderConfig
from loader.errors import ConfigError, TransportError
from loader.service.daemon.ray_launcher import RayLauncher

ORIGIN = "configs/ray.toml"
UNREACHABLE = "127.0.0.1:1"
DEADLINE_S = 0.5
FAKE_INIT_S = 5.0  # the fake's init gives up after this (the real one took minutes): old code fails, not hangs
PROMPT_S = 2.0


def _config(tmp_path: Any, **workers: Any) -> LoaderConfig:
    np.save(tmp_path / "a.npy", np.arange(4))
    mapping = {"source": {"files": [str(tmp_path / "a.npy")]}, "workers": workers}
    return LoaderConfig.from_dict(mapping, origin=ORIGIN)


class FakeRay(types.ModuleType):
    """What RayLauncher touches of ``ray`` before its first actor: ``init`` blocks until released."""

    def __init__(self) -> None:
        super().__init__("ray")
        self.release = threading.Event()
        self.calls: list[tuple[str, threading.Thread]] = []

    def is_initialized(self) -> bool:
        return False

    def init(self, address: str, **_: Any) -> None:
        self.calls.append((address, threading.current_thread()))
        self.release.wait(FAKE_INIT_S)
        raise ConnectionError(f"fake ray: nothing answered at {address}")

    def shutdown(self) -> None:
        pass


@pytest.fixture
def fake_ray(monkeypatch: Any) -> Iterator[FakeRay]:
    fake = FakeRay()
    monkeypatch.setitem(sys.modules, "ray", fake)
    try:
        yield fake
    finally:
        fake.release.set()  # the connect thread left behind ends now, not with the test process


def test_unreachable_cluster_fails_start_within_the_deadline(tmp_path: Any, fake_ray: FakeRay) -> None:
    launcher = RayLauncher(_config(tmp_path, launcher="ray", ray_address=UNREACHABLE, ray_connect_timeout_s=DEADLINE_S))
    began = time.monotonic()
    with pytest.raises(TransportError) as info:
        launcher.start("tcp://127.0.0.1:5555", "w-1", "workers.entry:run")
    waited = time.monotonic() - began
    assert DEADLINE_S <= waited < PROMPT_S, waited
    message = str(info.value)
    assert (
        "\n" not in message
        and UNREACHABLE in message
        and ORIGIN in message
        and f"{DEADLINE_S:g}s (workers.ray_connect_timeout_s)" in message
    )
    # The connect ran in the launcher's own thread, a daemon thread (left inside ray.init while the process exits).
    ((address, thread),) = fake_ray.calls
    assert address == UNREACHABLE and thread is not threading.current_thread() and thread.daemon
    # Never a second ray.init beside the first, still stuck.
    with pytest.raises(TransportError, match="still connecting"):
        launcher.start("tcp://127.0.0.1:5555", "w-2", "workers.entry:run")
    assert len(fake_ray.calls) == 1
    fake_ray.release.set()
    thread.join(PROMPT_S)
    assert not thread.is_alive()


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals need the main thread")
def test_sigterm_while_connecting_ends_the_wait_at_once(tmp_path: Any, fake_ray: FakeRay) -> None:
    stop = threading.Event()  # as `loader serve` does: its SIGTERM handler asks the daemon to stop

    def program_handler(signum: int, frame: Any) -> None:
        stop.set()

    launcher = RayLauncher(_config(tmp_path, launcher="ray", ray_address=UNREACHABLE))
    previous = signal.signal(signal.SIGTERM, program_handler)
    main = threading.main_thread().ident
    assert main is not None
    timer = threading.Timer(0.3, signal.pthread_kill, (main, signal.SIGTERM))
    try:
        timer.start()
        began = time.monotonic()
        with pytest.raises(TransportError) as info:
            launcher.start("tcp://127.0.0.1:5555", "w-1", "workers.entry:run")
        waited = time.monotonic() - began
        assert signal.getsignal(signal.SIGTERM) is program_handler  # the program's handler is back
    finally:
        timer.cancel()
        signal.signal(signal.SIGTERM, previous)
    assert stop.is_set()  # the program's own handler still ran
    assert waited < PROMPT_S, waited  # not the whole connect (the fake's FAKE_INIT_S, Ray's minutes)
    message = str(info.value)
    assert "\n" not in message and "SIGTERM" in message and UNREACHABLE in message


@pytest.mark.parametrize(
    ("values", "match"),
    [
        ({"ray_address": "\x00"}, r"workers\.ray_address must be 'auto', 'local', 'HOST:PORT' or .*got '\\x00'"),
        ({"ray_address": "   "}, r"workers\.ray_address must be .*got '   '"),
        ({"ray_address": "http://x"}, r"workers\.ray_address must be .*got 'http://x'"),
        ({"ray_address": "head\n:6379"}, r"workers\.ray_address must be .*got 'head\\n:6379'"),
        ({"ray_address": "head:0"}, r"workers\.ray_address must be .*got 'head:0'"),
        # A subnormal float: it shows as 9.99989e-321.
        ({"ray_cpus_per_worker": 1e-320}, r"workers\.ray_cpus_per_worker must be >= 0\.0001, got [0-9.]+e-32"),
        ({"ray_connect_timeout_s": 0}, r"workers\.ray_connect_timeout_s must be > 0, got 0"),
        ({"ray_connect_timeout_s": float("inf")}, r"workers\.ray_connect_timeout_s must be a finite number"),
    ],
    ids=["nul", "blank", "http", "newline", "port-0", "subnormal-cpus", "no-connect-time", "endless-connect"],
)
def test_absurd_ray_keys_are_refused_in_one_line(tmp_path: Any, values: dict[str, Any], match: str) -> None:
    with pytest.raises(ConfigError, match=match) as info:
        _config(tmp_path, launcher="ray", **values)
    assert ORIGIN in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    "address", ["auto", "local", UNREACHABLE, "head-node.example:6379", "[::1]:6379", "ray://head:10001", "ray://head"]
)
def test_what_ray_accepts_still_loads(tmp_path: Any, address: str) -> None:
    """A guard for the checks above (it passes on the old code too): Ray's own address forms still load."""
    config = _config(tmp_path, launcher="ray", ray_address=address, ray_cpus_per_worker=0.0001)
    assert (config.workers.ray_address, config.workers.ray_cpus_per_worker) == (address, 0.0001)

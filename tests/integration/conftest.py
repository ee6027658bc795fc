"""Fixtures for service integration tests: data files with unique ids and a daemon on a thread."""

from __future__ import annotations

import collections
import contextlib
import multiprocessing.resource_tracker
import os
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from loader.config import LoaderConfig

DAEMON_JOIN_TIMEOUT_S = 5.0


@pytest.fixture(scope="session", autouse=True)
def _resource_tracker() -> None:
    """Start multiprocessing's resource tracker (a child that lives for the session) before any test,
    so the first test that spawns a worker is not blamed for it by ``no_leaks``."""
    multiprocessing.resource_tracker.ensure_running()


def write_id_files(directory: Any, n_files: int, per_file: int | list[int]) -> list[int]:
    """``f<i>.npy`` files of int64 ids, unique across files; returns every id written."""
    sizes = per_file if isinstance(per_file, list) else [per_file] * n_files
    ids, start = [], 0
    for i, size in enumerate(sizes):
        values = np.arange(start, start + size, dtype=np.int64)
        np.save(directory / f"f{i:03d}.npy", values)
        ids.extend(values.tolist())
        start += size + 1000  # gaps, so an off-by-one would show
    return ids


def make_config(data_dir: Any, **sections: dict[str, Any]) -> LoaderConfig:
    mapping: dict[str, Any] = {
        "source": {"files": [str(data_dir / "*.npy")]},
        "pipeline": {"batch_size": 32, "seed": 7},
        "workers": {"count": 2, "heartbeat_interval_s": 0.2, "heartbeat_timeout_s": 2.0},
        "service": {"bind": "tcp://127.0.0.1:*"},
        "client": {"timeout_s": 10.0},
    }
    for name, values in sections.items():
        mapping.setdefault(name, {}).update(values)
    return LoaderConfig.from_dict(mapping)


@contextlib.contextmanager
def running_daemon(config: LoaderConfig, **kwargs: Any) -> Iterator[Any]:
    """A ``Daemon`` serving on a background thread; stopped and closed on exit."""
    from loader.service.daemon.loop import Daemon

    daemon = Daemon(config, **kwargs)
    stop = threading.Event()
    thread = threading.Thread(target=daemon.serve, args=(stop,), name="test-daemon", daemon=True)
    thread.start()
    try:
        yield daemon
    finally:
        stop.set()
        thread.join(DAEMON_JOIN_TIMEOUT_S)
        daemon.close()


def connected_workers(endpoint: str) -> int:
    """How many workers the daemon at ``endpoint`` has heard from (its ``status()``)."""
    from loader.service.client.client import query_status

    return sum(1 for w in query_status(endpoint)["workers"] if w["connected"])


def kill_leased_worker(status: dict[str, Any]) -> int:
    """SIGKILL a worker that holds a lease in this ``status()`` snapshot; its pid."""
    pid = [w for w in status["workers"] if w["leases"]][0]["pid"]
    os.kill(pid, signal.SIGKILL)
    return pid


def collect_ids(batches: Any, field: str = "data") -> list[int]:
    out: list[int] = []
    for batch in batches:
        out.extend(np.asarray(batch[field]).reshape(-1).tolist())
    return out


def read_while_growing(client: Any, workers: Callable[[], int], ids: list[int], target: int, epochs: int = 3) -> int:
    """Read epochs (each checked exactly-once against ``ids``), at most ``epochs``, until the count of
    ``workers()`` seen while reading has reached ``target``; the largest count seen (an autoscaled pool)."""
    peak = 0
    for _ in range(epochs):
        got: list[int] = []
        for batch in client.epoch():
            got.extend(np.asarray(batch["data"]).reshape(-1).tolist())
            peak = max(peak, workers())
        assert collections.Counter(got) == collections.Counter(ids)
        if peak >= target:
            break
    return peak


@pytest.fixture
def id_files(tmp_path: Any) -> tuple[Any, list[int]]:
    data = tmp_path / "data"
    data.mkdir()
    return data, write_id_files(data, 6, 500)

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


def silence(client: Any) -> None:
    """Make ``client`` send nothing more (no ping, credit or goodbye), as a trainer's killed process: the daemon
    lets another client take its job's rank once it has been quiet a moment (a live one keeps its rank)."""
    client._channel.try_send = lambda frames, timeout_s=0.0: True


def connected_workers(endpoint: str) -> int:
    """How many workers the daemon at ``endpoint`` has heard from (its ``status()``)."""
    from loader.service.client.client import query_status

    return sum(1 for w in query_status(endpoint)["workers"] if w["connected"])


def kill_leased_worker(status: dict[str, Any]) -> int:
    """SIGKILL a worker that holds a lease in this ``status()`` snapshot; its pid."""
    for worker in status["workers"]:
        if worker["leases"] and worker["pid"]:
            try:
                os.kill(worker["pid"], signal.SIGKILL)
            except ProcessLookupError:  # killed already; the daemon has not noticed yet
                continue
            return int(worker["pid"])
    raise AssertionError(f"no live worker holds a lease: {status['workers']}")


def collect_ids(batches: Any, field: str = "data") -> list[int]:
    out: list[int] = []
    for batch in batches:
        out.extend(np.asarray(batch[field]).reshape(-1).tolist())
    return out


def collect_ids_meanwhile(batches: Any, timeout_s: float = 60.0) -> Callable[[], list[int]]:
    """Read ``batches`` on a thread from now on (so the daemon's stage keeps room and goes on reading worker
    data); the returned function waits for the end and gives the ids, or raises what the reading raised."""
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(_ids_or_error(batches)), name="collect-ids", daemon=True)
    thread.start()

    def result() -> list[int]:
        thread.join(timeout_s)
        assert not thread.is_alive(), f"the epoch did not end within {timeout_s} s"
        (value,) = got
        if isinstance(value, BaseException):
            raise value
        return value

    return result


def _ids_or_error(batches: Any) -> list[int] | BaseException:
    try:
        return collect_ids(batches)
    except BaseException as exc:  # raised again by the waiting test
        return exc


def collect_ranks(ranks: list[Any], field: str = "data", timeout_s: float = 60.0) -> list[list[int]]:
    """The ids each rank's client reads in one epoch, every rank reading at once (one thread each).

    Ranks of a job cut one global stream: a rank runs ahead of the others by at most a bounded
    buffer, as in data-parallel training. So ranks must read together, never one after another."""
    got: list[list[int] | BaseException | None] = [None] * len(ranks)

    def read(r: int) -> None:
        try:
            got[r] = collect_ids(ranks[r].epoch(), field)
        except BaseException as exc:  # reported below, on the test's thread
            got[r] = exc

    threads = [threading.Thread(target=read, args=(r,), name=f"rank-{r}", daemon=True) for r in range(len(ranks))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s)
        assert not thread.is_alive(), f"{thread.name} did not finish its epoch within {timeout_s}s"
    for result in got:
        if isinstance(result, BaseException):
            raise result
    return [list(result or []) for result in got]


def assert_ranks_cover_once(per_rank: list[list[int]], ids: list[int]) -> None:
    """Ranks together deliver every id; the only repeats are the padding of the last step
    (at most world_size - 1 samples, so that every rank gets a batch)."""
    flat = [i for got in per_rank for i in got]
    assert set(flat) == set(ids)
    assert len(ids) <= len(flat) <= len(ids) + len(per_rank) - 1


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

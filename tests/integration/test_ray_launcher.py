"""Workers as Ray actors (``workers.launcher = "ray"``) on a local Ray instance started once for the module.

The seed's one order holds whatever launches the workers: every epoch here is compared, batch by batch,
with ``loader.Loader`` reading the same config with local worker processes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

import loader
from loader.service.client.client import Client, query_status
from loader.service.transport import auth
from tests.helpers import wait_until
from tests.integration.conftest import (
    connected_workers,
    make_config,
    read_while_growing,
    running_daemon,
    write_id_files,
)

ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install '/path/to/loader[ray]'")

from loader.service.daemon import autoscale  # noqa: E402
from loader.service.daemon.ray_launcher import RayWorker  # noqa: E402  (imports Ray's types only after the skip)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

RAY_CPUS = 2
SIZES = [37, 120, 5, 64, 200, 1, 90, 143]  # uneven files: chunks, files and steps never line up
ACTOR_DEATH_TIMEOUT_S = 20.0


@pytest.fixture(scope="module")
def local_ray() -> Iterator[Any]:
    """A private Ray instance for this module (seconds to start: once), shut down after it."""
    if ray.is_initialized():
        pytest.skip("this process is already a Ray driver: the tests need a Ray instance of their own")
    ray.init(num_cpus=RAY_CPUS, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def data(tmp_path_factory: Any) -> tuple[Any, list[int]]:
    directory = tmp_path_factory.mktemp("ray-data")
    return directory, write_id_files(directory, len(SIZES), SIZES)


def config(directory: Any, launcher: str = "ray", **sections: dict[str, Any]) -> Any:
    pipeline = {"batch_size": 8, "shuffle_buffer": 50, "seed": 11, **sections.pop("pipeline", {})}
    workers = {"count": 2, "samples_per_message": 16, "launcher": launcher, **sections.pop("workers", {})}
    return make_config(directory, pipeline=pipeline, workers=workers, **sections)


def ids_of(batch: dict[str, Any]) -> list[int]:
    return [int(v) for v in batch["data"].reshape(-1)]


def reference(directory: Any, **sections: dict[str, Any]) -> list[list[int]]:
    """The epoch's batches as local worker processes give them (the seed's one order)."""
    with loader.Loader(config(directory, launcher="local", **sections)) as local:
        return [ids_of(b) for b in local.epoch(0)]


def actors(daemon: Any) -> list[RayWorker]:
    handles = [record.process for record in list(daemon.coordinator.workers.values())]
    assert all(isinstance(h, RayWorker) for h in handles), handles
    return handles


@contextlib.contextmanager
def tracked(daemon: Any) -> Iterator[list[RayWorker]]:
    """Every actor the daemon started while this block ran (replacements too), to check after it closed."""
    seen: list[RayWorker] = []
    launch = daemon.pool._launcher.start

    def recording(*args: Any) -> RayWorker:
        handle = launch(*args)
        seen.append(handle)
        return handle

    daemon.pool._launcher.start = recording
    seen.extend(actors(daemon))
    yield seen


def assert_all_dead(handles: list[RayWorker]) -> None:
    """Each actor answers no call, and every CPU of the local Ray is free again."""
    for handle in handles:
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(handle.actor.__ray_ready__.remote(), timeout=ACTOR_DEATH_TIMEOUT_S)
    assert wait_until(lambda: ray.available_resources().get("CPU", 0) == RAY_CPUS, timeout_s=ACTOR_DEATH_TIMEOUT_S), (
        ray.available_resources()
    )


def test_actors_read_the_seeds_one_order_and_close_stops_them(local_ray: Any, data: Any) -> None:
    directory, ids = data
    expected = reference(directory)
    assert sorted(i for b in expected for i in b) == sorted(ids)
    with running_daemon(config(directory)) as daemon:
        handles = actors(daemon)
        assert len(handles) == 2
        assert wait_until(lambda: connected_workers(daemon.endpoint) == 2, timeout_s=30), "both actors said hello"
        with Client(daemon.endpoint, timeout_s=20) as client:
            assert [ids_of(b) for b in client.epoch(0)] == expected
    assert_all_dead(handles)
    # The in-process Loader can use Ray actors too (its private ipc endpoint pins them to this node).
    with loader.Loader(config(directory)) as in_process:
        assert [ids_of(b) for b in in_process.epoch(0)] == expected


def test_a_killed_actor_is_replaced_and_the_epoch_stays_exact(local_ray: Any, data: Any) -> None:
    directory, ids = data
    slow = {"mappers": ["tests.helpers:slow_sample_2ms"]}  # ~1 s of reading: the kill lands mid-file
    expected = reference(directory, pipeline=slow)
    with running_daemon(config(directory, pipeline=slow)) as daemon, tracked(daemon) as started:
        assert wait_until(lambda: connected_workers(daemon.endpoint) == 2, timeout_s=30)
        got, killed = [], None
        with Client(daemon.endpoint, timeout_s=20) as client:
            for i, batch in enumerate(client.epoch(0)):
                got.append(ids_of(batch))
                if killed is None and i >= 3:
                    leased = [w["id"] for w in query_status(daemon.endpoint)["workers"] if w["leases"]]
                    if leased:
                        killed = leased[0]
                        ray.kill(daemon.coordinator.workers[killed].process.actor, no_restart=True)
        assert killed is not None, "no worker held a lease to kill"
        assert got == expected, "exactly once, and in the seed's order"
        status = query_status(daemon.endpoint)
        assert status["worker_restarts"] >= 1
        assert killed not in [w["id"] for w in status["workers"]]
        assert wait_until(lambda: connected_workers(daemon.endpoint) == 2, timeout_s=30)
        assert len(started) >= 3, "a replacement actor was started"
    assert_all_dead(started)


def test_close_stops_an_actor_still_waiting_for_cpus(local_ray: Any, data: Any) -> None:
    directory, _ = data
    with running_daemon(config(directory, workers={"count": RAY_CPUS + 1})) as daemon:
        handles = actors(daemon)
        assert wait_until(lambda: connected_workers(daemon.endpoint) == RAY_CPUS, timeout_s=30)
        assert all(h.is_alive() for h in handles), "the third waits for a CPU, alive and not connected"
    assert_all_dead(handles)


def test_authenticated_wildcard_bind_is_dialled_at_the_nodes_address(
    local_ray: Any, data: Any, tmp_path: Any, monkeypatch: Any
) -> None:
    from loader.cli import main as cli_main

    directory, _ = data
    keys = tmp_path / "keys"
    assert cli_main(["keys", str(keys)]) == 0
    service = {
        "bind": "tcp://0.0.0.0:*",
        "daemon_key": str(keys / "daemon.key_secret"),
        "authorized_keys": str(keys / "authorized"),
    }
    expected = reference(directory)
    monkeypatch.setenv(auth.ENV_PEER_KEY, str(keys / "peers" / "client.key_secret"))
    monkeypatch.setenv(auth.ENV_DAEMON_PUBLIC_KEY, str(keys / "daemon.key"))
    with running_daemon(config(directory, service=service)) as daemon:
        handles = actors(daemon)
        with Client(daemon.endpoint, timeout_s=20) as client:  # the actors' CURVE keys are the daemon's own
            assert [ids_of(b) for b in client.epoch(0)] == expected
    assert_all_dead(handles)


def test_autoscaling_grows_and_retires_actors(local_ray: Any, tmp_path: Any, monkeypatch: Any) -> None:
    # Shorter delays than the defaults (1 s, 3 s): their hysteresis is tested on a fake clock in
    # tests/unit/service/daemon/test_autoscale.py; here the actors' real growth and retirement are.
    monkeypatch.setattr(autoscale, "GROW_AFTER_S", 0.5)
    monkeypatch.setattr(autoscale, "SHRINK_AFTER_S", 1.5)
    ids = write_id_files(tmp_path, 12, 150)
    scaled = config(
        tmp_path,
        # ~0.3 s of mapping per file for one worker: a client reading as fast as it can waits.
        pipeline={"mappers": ["tests.helpers:slow_sample_2ms"], "batch_size": 16, "shuffle_buffer": 0},
        workers={"count": 1, "min": 1, "max": RAY_CPUS},
    )
    with running_daemon(scaled) as daemon, tracked(daemon) as started:
        assert wait_until(lambda: connected_workers(daemon.endpoint) == 1, timeout_s=30)
        with Client(daemon.endpoint, timeout_s=20) as client:
            # Epochs, each exactly-once while actors join, until the pool has grown.
            peak = read_while_growing(client, lambda: connected_workers(daemon.endpoint), ids, RAY_CPUS)
        assert peak == RAY_CPUS, "grown to workers.max"
        # The client left: the idle actor is retired (killed, its CPU given back), and not replaced.
        assert wait_until(lambda: len(daemon.coordinator.workers) == 1, timeout_s=30)
        assert wait_until(lambda: ray.available_resources().get("CPU", 0) == RAY_CPUS - 1, timeout_s=10)
        assert query_status(daemon.endpoint)["worker_restarts"] == 0
    assert_all_dead(started)

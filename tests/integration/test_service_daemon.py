"""One daemon (2 spawned workers) serving several clients: the end-to-end path."""

from __future__ import annotations

import collections
import time

import numpy as np
import pytest

from loader import Client
from loader.errors import ServiceUnavailableError
from loader.service import protocol as P
from loader.service import transport
from loader.service.client.client import query_status
from tests.helpers import wait_until
from tests.integration.conftest import (
    assert_ranks_cover_once,
    collect_ids,
    collect_ranks,
    make_config,
    running_daemon,
    write_id_files,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    data = tmp_path_factory.mktemp("daemon-data")
    ids = write_id_files(data, 7, [400, 350, 500, 123, 1, 640, 300])
    config = make_config(data, pipeline={"batch_size": 50, "shuffle_buffer": 300})
    with running_daemon(config) as daemon:
        assert wait_until(
            lambda: (
                len(query_status(daemon.endpoint)["workers"]) == 2
                and all(w["connected"] for w in query_status(daemon.endpoint)["workers"])
            ),
            timeout_s=20,
        )
        yield daemon, ids


def test_one_client_gets_every_record_once_per_epoch(served):
    daemon, ids = served
    with Client(daemon.endpoint, timeout_s=10) as client:
        orders = []
        for _ in range(3):
            batches = list(client.epoch())
            got = collect_ids(batches)
            assert collections.Counter(got) == collections.Counter(ids)
            assert all(len(b["data"]) == 50 for b in batches[:-1])
            assert batches[0]["data"].dtype == np.int64
            orders.append(got)
        assert orders[0] != orders[1], "each epoch is shuffled differently"


def test_world_size_two_gives_disjoint_shares_covering_everything(served):
    daemon, ids = served
    with Client(daemon.endpoint, rank=0, world_size=2) as a, Client(daemon.endpoint, rank=1, world_size=2) as b:
        for _ in range(2):
            assert_ranks_cover_once(collect_ranks([a, b]), ids)


def _workers(status: dict) -> set[tuple[str, int | None]]:
    return {(w["id"], w["pid"]) for w in status["workers"] if w["connected"]}


def test_warm_daemon_serves_first_batch_with_the_workers_it_has(served):
    # A warm daemon's new client is served by the workers already connected: none is started,
    # restarted or awaited for it. (How fast that is belongs to scripts/bench: first_batch_warm_daemon.)
    daemon, ids = served
    before = query_status(daemon.endpoint)
    assert len(_workers(before)) == 2
    with Client(daemon.endpoint) as client:
        first = next(iter(client.epoch()))
        after = query_status(daemon.endpoint)
    assert len(first["data"]) == 50
    assert _workers(after) == _workers(before)
    assert after["worker_restarts"] == before["worker_restarts"]


def test_abandoned_epoch_does_not_leak_into_the_next(served):
    daemon, ids = served
    with Client(daemon.endpoint, prefetch=2) as client:
        it = client.epoch()
        next(it)
        next(it)
        del it
        got = collect_ids(client.epoch())
        assert collections.Counter(got) == collections.Counter(ids)


def test_paddle_style_reader_and_list_of_epochs(served):
    daemon, ids = served
    with Client(daemon.endpoint) as client:
        reader = client.reader()  # a paddle batch reader: lists of sample tuples
        for _ in range(2):
            samples = [sample for batch in reader() for sample in batch]
            assert all(isinstance(s, tuple) and len(s) == 1 for s in samples)
            assert collections.Counter(int(s[0]) for s in samples) == collections.Counter(ids)


def test_status_reports_workers_and_clients(served):
    daemon, ids = served
    with Client(daemon.endpoint):
        status = query_status(daemon.endpoint, timeout_s=5)
        assert status["files"]["total"] == 7
        assert {"leased", "queued"} <= set(status["files"])  # files done are per worker
        assert len(status["workers"]) == 2 and all(w["alive"] for w in status["workers"])
        assert all({"files_done", "leases", "last_heartbeat_s"} <= set(w) for w in status["workers"])
        assert status["samples_per_s"] >= 0 and status["buffered_samples"] >= 0  # rate and queue depth
        assert len(status["clients"]) >= 1
        assert status["skipped_records"] == 0


def test_vanished_client_is_dropped_and_a_new_one_is_served(served):
    daemon, ids = served
    # A raw client that asks for an epoch and then disappears without a word.
    ghost = transport.dealer(daemon.endpoint)
    ghost.send(P.encode(P.ClientHello(rank=0, world_size=1, prefetch=2)))
    assert ghost.recv(5.0) is not None
    ghost.send(P.encode(P.Epoch(epoch=0, gen=1, credit=2)))
    time.sleep(0.3)
    before = len(query_status(daemon.endpoint)["clients"])
    ghost.close()
    assert wait_until(lambda: len(query_status(daemon.endpoint)["clients"]) == before - 1, timeout_s=8)
    # Its share is freed: nothing of its epoch stays buffered, leased or queued.
    assert wait_until(
        lambda: (lambda s: s["buffered_samples"] == 0 and s["files"]["leased"] == 0 and s["files"]["queued"] == 0)(
            query_status(daemon.endpoint)
        ),
        timeout_s=8,
    )
    with Client(daemon.endpoint) as client:
        assert collections.Counter(collect_ids(client.epoch())) == collections.Counter(ids)


def test_peers_of_another_protocol_version_are_refused_with_both_versions(served):
    daemon, ids = served
    other = P.PROTOCOL_VERSION + 1
    hellos = [
        P.Hello(worker="old-worker", pid=1, version=other, package="9.9"),
        P.ClientHello(rank=0, world_size=1, version=other, package="9.9"),
    ]
    for hello in hellos:
        peer = transport.dealer(daemon.endpoint)
        try:
            peer.send(P.encode(hello))
            frames = peer.recv(5.0)
        finally:
            peer.close()
        assert frames is not None
        answer, _ = P.decode(frames)
        assert isinstance(answer, P.Error) and answer.refused == "version", answer
        assert f"speaks loader protocol {other} (loader 9.9), this side speaks {P.PROTOCOL_VERSION}" in answer.message
    assert "old-worker" not in {w["id"] for w in query_status(daemon.endpoint)["workers"]}
    with Client(daemon.endpoint) as client:  # the daemon still serves its own version
        assert collections.Counter(collect_ids(client.epoch())) == collections.Counter(ids)


def test_client_without_daemon_fails_fast(port):
    start = time.monotonic()
    with pytest.raises(ServiceUnavailableError, match=str(port)):
        Client(f"tcp://127.0.0.1:{port}", timeout_s=0.5)
    assert time.monotonic() - start < 3


def test_query_status_without_daemon_fails_fast(port):
    with pytest.raises(ServiceUnavailableError):
        query_status(f"tcp://127.0.0.1:{port}", timeout_s=0.3)


def test_next_epoch_is_read_ahead_once_every_file_is_leased(tmp_path):
    # One worker, two slow files: once the second file of epoch 0 is leased, epoch 1's files
    # must be queued while that file is still being read, so an idle worker never waits for
    # the slowest file of the epoch.
    ids = write_id_files(tmp_path, 2, 60)
    config = make_config(
        tmp_path,
        pipeline={"batch_size": 10, "epochs": 0, "mappers": ["tests.helpers:slow_sample_2ms"]},
        workers={"count": 1, "samples_per_message": 10},
    )
    with running_daemon(config) as daemon:
        with Client(daemon.endpoint, timeout_s=10) as client:
            epoch = client.epoch()
            got = list(next(epoch)["data"])

            def read_ahead_while_reading() -> bool:
                status = query_status(daemon.endpoint, timeout_s=5)
                return status["files"]["queued"] >= 2 and status["samples_in"] < len(ids)

            assert wait_until(read_ahead_while_reading, timeout_s=10, interval_s=0.005)
            got.extend(i for batch in epoch for i in batch["data"])
            assert sorted(got) == sorted(ids)
            assert sorted(i for batch in client.epoch() for i in batch["data"]) == sorted(ids)


def test_client_places_batches_with_its_device(served):
    # The client's double buffer goes through loader.device.Placer: stage() on the receiver
    # thread, finish() on the consumer. "torch:cpu" exercises that path without a GPU.
    torch = pytest.importorskip("torch")
    daemon, ids = served
    with Client(daemon.endpoint, device="torch:cpu", timeout_s=10) as client:
        batches = list(client.epoch())
    assert all(isinstance(b["data"], torch.Tensor) for b in batches)
    assert sorted(int(i) for b in batches for i in b["data"]) == sorted(ids)


def test_close_stops_workers_that_never_connected_at_once(tmp_path):
    # A worker started and not yet connected gets no BYE and, the loop stopped, no WELCOME: close must
    # stop it rather than wait out the whole join timeout for it to end by itself.
    import os

    from loader.service.daemon.loop import WORKER_JOIN_TIMEOUT_S, Daemon

    write_id_files(tmp_path, 1, 10)
    daemon = Daemon(make_config(tmp_path), worker_entry="tests.helpers:never_says_hello")
    pids = [record.process.pid for record in daemon.coordinator.workers.values()]
    assert len(pids) == 2
    started = time.monotonic()
    daemon.close()
    assert time.monotonic() - started < WORKER_JOIN_TIMEOUT_S / 2
    for pid in pids:
        with pytest.raises(ProcessLookupError):  # ended and reaped
            os.kill(pid, 0)


def test_a_fixed_data_port_is_where_workers_send_and_bad_ones_are_refused(tmp_path):
    # Two ports to open in a firewall: the control port and service.data_port (it was always a random one).
    from loader.errors import ConfigError
    from tests.helpers import free_port

    ids = write_id_files(tmp_path, 2, 100)
    control, data = free_port(), free_port()
    config = make_config(
        tmp_path, workers={"count": 1}, service={"bind": f"tcp://127.0.0.1:{control}", "data_port": data}
    )
    with running_daemon(config) as daemon:
        assert daemon.data_endpoint == f"tcp://127.0.0.1:{data}"
        with Client(daemon.endpoint, timeout_s=20) as client:
            assert collections.Counter(collect_ids(client.epoch())) == collections.Counter(ids)
    with pytest.raises(ConfigError, match="service.data_port is service.bind's own port"):
        make_config(tmp_path, service={"bind": f"tcp://127.0.0.1:{control}", "data_port": control})
    with pytest.raises(ConfigError, match="service.data_port is a TCP port"):
        make_config(tmp_path, service={"bind": f"ipc://{tmp_path}/s", "data_port": data})

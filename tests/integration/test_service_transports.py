"""``loader.Loader`` over each worker transport ("zmq", "pipe", "queue"): exactly once, kill -9, errors.

Also: heartbeats flow while user code runs (a slow mapper keeps its worker), a
hung worker is found by the lease progress timeout, and a PyDataProvider2
provider works as a source.
"""

from __future__ import annotations

import collections

import pytest

import loader
from loader.config import LoaderConfig
from loader.errors import WorkerError
from tests.helpers import wait_until
from tests.integration.conftest import collect_ids, kill_leased_worker, make_config, running_daemon, write_id_files

pytestmark = pytest.mark.integration

TRANSPORTS = ["zmq", "pipe", "queue"]
SIZES = [97, 0, 250, 31, 180, 1, 64]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_exactly_once_per_epoch(tmp_path, transport, no_leaks):
    ids = write_id_files(tmp_path, len(SIZES), SIZES)
    config = make_config(
        tmp_path,
        pipeline={"batch_size": 17, "shuffle_buffer": 64, "epochs": 2},
        workers={"transport": transport, "samples_per_message": 23},
    )
    with loader.Loader(config) as local:
        got = collect_ids(local)
        assert local.status()["transport"] == transport
    assert collections.Counter(got) == collections.Counter(ids * 2)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_killed_worker_is_replaced_and_epoch_is_exactly_once(tmp_path, transport):
    ids = write_id_files(tmp_path, 4, 300)
    config = make_config(
        tmp_path,
        pipeline={"mappers": ["tests.helpers:slow_sample_2ms"], "batch_size": 40},
        workers={"transport": transport, "samples_per_message": 16},
    )
    with loader.Loader(config) as local:
        got, killed = [], None
        for i, batch in enumerate(local.epoch()):
            got.extend(batch["data"].tolist())
            if i == 3:
                killed = kill_leased_worker(local.status())
        assert killed is not None
        assert collections.Counter(got) == collections.Counter(ids)
        status = local.status()
        assert status["worker_restarts"] >= 1 and killed not in [w["pid"] for w in status["workers"]]
        assert collections.Counter(collect_ids(local.epoch())) == collections.Counter(ids)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_mapper_error_names_file_record_and_cause(tmp_path, transport):
    write_id_files(tmp_path, 2, 1300)  # id 1234 is record 1234 of file f000
    config = make_config(
        tmp_path, pipeline={"mappers": ["tests.helpers:fail_on_1234"]}, workers={"transport": transport}
    )
    with loader.Loader(config) as local:
        with pytest.raises(WorkerError) as info:
            collect_ids(local.epoch())
        err = info.value
        assert err.type_name == "Boom" and err.file.endswith("f000.npy") and err.record == 1234
        with pytest.raises(WorkerError):  # still usable: the next epoch fails the same way
            collect_ids(local.epoch())


@pytest.mark.parametrize("transport", ["zmq", "pipe"])
def test_mapper_slower_than_heartbeat_timeout_keeps_its_worker(tmp_path, transport):
    ids = write_id_files(tmp_path, 2, 50)
    config = make_config(
        tmp_path,
        pipeline={"mappers": ["tests.helpers:sleep_1500ms_on_7"]},
        workers={"transport": transport, "count": 1, "heartbeat_interval_s": 0.2, "heartbeat_timeout_s": 1.0},
    )
    with loader.Loader(config) as local:
        assert collections.Counter(collect_ids(local.epoch())) == collections.Counter(ids)
        assert local.status()["worker_restarts"] == 0


def test_hung_worker_is_replaced_after_the_progress_timeout(tmp_path, monkeypatch):
    ids = write_id_files(tmp_path, 3, 40)
    monkeypatch.setenv("LOADER_TEST_HANG_MARKER", str(tmp_path / "hung-once"))
    config = make_config(
        tmp_path,
        pipeline={"mappers": ["tests.helpers:hang_once_on_5"]},
        workers={"count": 1, "progress_timeout_s": 1.0},
    )
    with running_daemon(config) as daemon, loader.Client(daemon.endpoint) as client:
        assert collections.Counter(collect_ids(client.epoch())) == collections.Counter(ids)
        assert (tmp_path / "hung-once").exists()
        assert wait_until(lambda: daemon.coordinator.restarts >= 1, timeout_s=5)


@pytest.mark.parametrize("transport", ["zmq", "pipe"])
def test_provider_source_delivers_every_sample_once_with_slot_names(tmp_path, transport, no_leaks):
    expected = []
    for f in range(3):
        values = [f * 100 + i for i in range(f * 7 + 5)]
        (tmp_path / f"part{f}.txt").write_text("".join(f"{v}\n" for v in values))
        expected.extend(values)
    config = LoaderConfig.from_dict(
        {
            "source": {
                "files": [str(tmp_path / "*.txt")],
                "provider": "tests.unit.provider.fixtures:numbered_file_lines",
            },
            "pipeline": {"batch_size": 8, "shuffle_buffer": 10, "seed": 3},
            "workers": {"count": 2, "transport": transport, "heartbeat_interval_s": 0.2, "heartbeat_timeout_s": 2.0},
        }
    )
    with loader.Loader(config) as local:
        batches = list(local.epoch())
    assert all(set(batch) == {"id", "vec"} for batch in batches)
    ids = [int(i) for batch in batches for i in batch["id"]]
    assert collections.Counter(ids) == collections.Counter(expected)
    for batch in batches:
        assert batch["vec"].shape == (len(batch["id"]), 3)
        assert (batch["vec"] == batch["id"][:, None]).all()

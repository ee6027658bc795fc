"""Leases ahead end to end: workers holding several small files at once change nothing in what is read.

Whole batch sequences (ids in order, batch by batch) are compared with one worker reading one file at
a time: with leases ahead, with workers killed while they hold queued leases, and with a slow file
whose queued leases are taken back. Files larger than the reorder window (cut as it fills) are read
exactly once, in order, epoch after epoch.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import numpy as np
import pytest

import loader
from loader.service.client.client import Client, query_status
from tests.helpers import wait_until
from tests.integration.conftest import kill_leased_worker, make_config, running_daemon, write_id_files

pytestmark = pytest.mark.integration

SIZES = [3, 7, 1, 12, 5, 9, 2, 6, 11, 4] * 6  # 60 small files: most of a worker's time is between files
SLOW_IDS = range(0, 3)  # the first file's ids: its samples take SLOW_SAMPLE_S each
# Files larger than the reorder window: rows of 264 bytes, each file 6.3 MiB against a window of 1 MiB. Before
# the fix, 8 epochs of these stalled in every try (10 of 10); smaller files read too quickly to be taken back.
BIG_FILES, BIG_ROWS, ROW_INTS = 10, 25_000, 33


def slow_first_file(sample: Any) -> Any:
    """A mapper slow on the first file only: its worker's queued leases wait behind it."""
    if int(np.asarray(sample[0]).reshape(-1)[0]) in SLOW_IDS:
        time.sleep(0.15)
    return sample


def tick_2ms(sample: Any) -> Any:
    """Long enough an epoch to kill workers in, short enough files to hold several."""
    time.sleep(0.002)
    return sample


@pytest.fixture(scope="module")
def data(tmp_path_factory: Any) -> tuple[Any, list[int]]:
    directory = tmp_path_factory.mktemp("ahead-data")
    return directory, write_id_files(directory, len(SIZES), SIZES)


def config(directory: Any, *, workers: int, ahead: int, mappers: tuple[str, ...] = (), shuffle: int = 20) -> Any:
    return make_config(
        directory,
        pipeline={"batch_size": 8, "shuffle_buffer": shuffle, "seed": 5, "mappers": list(mappers)},
        workers={"count": workers, "samples_per_message": 16, "leases_ahead": ahead},
    )


def ids_of(batch: dict[str, Any]) -> list[int]:
    return [int(v) for v in np.asarray(batch["data"]).reshape(-1)]


def read_loader(cfg: Any) -> list[list[int]]:
    with loader.Loader(cfg) as source:
        return [ids_of(b) for b in source.epoch(0)]


@pytest.fixture(scope="module")
def reference(data: tuple[Any, list[int]]) -> list[list[int]]:
    directory, ids = data
    batches = read_loader(config(directory, workers=1, ahead=0))
    assert sorted(i for b in batches for i in b) == sorted(ids)
    return batches


def test_the_same_batches_with_any_workers_and_leases_ahead(data: Any, reference: list[list[int]]) -> None:
    directory, _ = data
    for workers, ahead in [(1, 3), (3, 1), (3, 16)]:
        assert read_loader(config(directory, workers=workers, ahead=ahead)) == reference, (workers, ahead)


def test_killing_workers_that_hold_leases_ahead_loses_and_repeats_nothing(data: Any, monkeypatch: Any) -> None:
    from loader.service.daemon import ahead

    # Files of 2-24 ms here: grant leases ahead to files under the hold time (not only under 5 ms), so
    # workers hold some to be killed with (the daemon runs in this process).
    monkeypatch.setattr(ahead, "AHEAD_GRANT_S", ahead.AHEAD_HOLD_S)
    directory, _ = data
    tick = ("tests.integration.test_leases_ahead:tick_2ms",)
    expected = read_loader(config(directory, workers=1, ahead=0, mappers=tick))
    with running_daemon(config(directory, workers=3, ahead=4, mappers=tick)) as daemon:
        with Client(daemon.endpoint, timeout_s=30) as client:
            got, killed = [], set()
            for batch in client.epoch(0):
                got.append(ids_of(batch))
                status = query_status(daemon.endpoint)
                holding = [w for w in status["workers"] if w["leases"] > 1 and w["alive"] and w["pid"] not in killed]
                if len(killed) < 2 and holding:
                    with contextlib.suppress(AssertionError):  # it died meanwhile
                        killed.add(kill_leased_worker({"workers": holding}))
        assert killed, "a worker held leases ahead when it was killed"
        assert wait_until(lambda: query_status(daemon.endpoint)["worker_restarts"] >= len(killed), timeout_s=10)
    assert got == expected


def test_leases_queued_behind_a_slow_file_go_to_another_worker(data: Any) -> None:
    directory, _ = data
    slow = ("tests.integration.test_leases_ahead:slow_first_file",)
    expected = read_loader(config(directory, workers=1, ahead=0, mappers=slow, shuffle=0))
    with running_daemon(config(directory, workers=2, ahead=4, mappers=slow, shuffle=0)) as daemon:
        with Client(daemon.endpoint, timeout_s=30) as client:
            got = [ids_of(b) for b in client.epoch(0)]
        status = query_status(daemon.endpoint)
    assert got == expected
    assert status["files"]["taken_back"] >= 1, "the slow file's worker gave back what waited behind it"


@pytest.fixture(scope="module")
def big_files(tmp_path_factory: Any) -> tuple[Any, list[int]]:
    """Files larger than a 1 MiB reorder window: rows of 33 int64, the first one the row's unique id."""
    directory = tmp_path_factory.mktemp("ahead-big")
    ids = np.arange(BIG_FILES * BIG_ROWS, dtype=np.int64)
    for i, part in enumerate(np.split(ids, BIG_FILES)):
        np.save(directory / f"f{i:03d}.npy", np.repeat(part[:, None], ROW_INTS, axis=1))
    return directory, ids.tolist()


def test_files_larger_than_the_reorder_window_read_every_epoch_exactly_once(big_files: Any) -> None:
    """The livelock that had leases ahead off by default: taken back, the head file stood in the queue
    behind later files that were cut as the window filled, leased again at once and cut again, in turn
    on both workers, so no file completed until EpochStalledError. Short timeouts: a stall fails fast."""
    directory, ids = big_files
    cfg = make_config(
        directory,
        pipeline={"batch_size": 256, "shuffle_buffer": 0, "seed": 5},
        workers={"count": 2, "leases_ahead": 2},
        service={"bind": "tcp://127.0.0.1:*", "reorder_window_mib": 1},
    )
    with running_daemon(cfg) as daemon:
        with Client(daemon.endpoint, timeout_s=10, progress_timeout_s=5) as client:
            for epoch in range(8):  # each epoch's timing differs: the stall came within a few of them
                got = [i for batch in client.epoch(epoch) for i in np.asarray(batch["data"])[:, 0].tolist()]
                assert got == ids, f"epoch {epoch}: every row once, in the files' order"
    # Whether leases are taken back in a given run depends on timing (a loaded machine may not), so this
    # test only says no epoch stalls or repeats; the take-back and cut sequence that livelocked is replayed
    # turn by turn in tests/unit/service/daemon/test_leases_ahead.py.

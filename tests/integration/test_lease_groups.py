"""Lease groups end to end (``source.files_per_lease``): small files leased several at a time.

The order, resume and fault properties of ``test_order_and_resume`` run with lease groups as one of
their kinds of data; here: without a shuffle the files are read in list order exactly as one file
per lease reads them, a failing file is named by its own path and record inside its group, under
``on_error = "skip"`` the rest of the group goes on, and a daemon leases far fewer times.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import loader
from loader.errors import ConfigError, WorkerError
from loader.service.client.client import Client, query_status
from tests.integration.conftest import make_config, running_daemon, write_id_files

pytestmark = pytest.mark.integration

SIZES = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4] * 3  # 60 small files


def config(directory: Any, *, per_lease: int, workers: int = 2, shuffle: int = 0, **pipeline: Any) -> Any:
    return make_config(
        directory,
        source={"files": [str(directory / "*.npy")], "files_per_lease": per_lease},
        pipeline={"batch_size": 8, "shuffle_buffer": shuffle, "seed": 3, **pipeline},
        workers={"count": workers, "samples_per_message": 16},
    )


def ids_of(batch: dict[str, Any]) -> list[int]:
    return [int(v) for v in np.asarray(batch["data"]).reshape(-1)]


def read_loader(cfg: Any) -> list[list[int]]:
    with loader.Loader(cfg) as source:
        return [ids_of(b) for b in source.epoch(0)]


@pytest.fixture(scope="module")
def data(tmp_path_factory: Any) -> tuple[Any, list[int]]:
    directory = tmp_path_factory.mktemp("groups-data")
    return directory, write_id_files(directory, len(SIZES), SIZES)


def test_unshuffled_groups_read_what_one_file_per_lease_reads(data: Any) -> None:
    directory, ids = data
    single = read_loader(config(directory, per_lease=1))
    assert [i for b in single for i in b] == ids
    for per_lease, workers in [(8, 1), (8, 3), (64, 2)]:
        assert read_loader(config(directory, per_lease=per_lease, workers=workers)) == single, (per_lease, workers)


def test_groups_lease_fewer_times_and_say_so_in_status(data: Any) -> None:
    directory, ids = data
    with running_daemon(config(directory, per_lease=8, shuffle=16)) as daemon:
        with Client(daemon.endpoint, timeout_s=20) as client:
            got = [i for b in client.epoch(0) for i in ids_of(b)]
        status = query_status(daemon.endpoint)
    assert sorted(got) == sorted(ids)
    files = status["files"]
    assert (files["total"], files["leases"]) == (60, 8)
    assert 8 <= files["granted"] <= 8 + 4, files  # one grant per group (a cut file may be leased again)
    [dataset] = [d for d in status["datasets"] if d["name"] == "default"]
    assert (dataset["files"], dataset["leases"]) == (60, 8)


def break_file(directory: Any, index: int) -> str:
    path = directory / f"f{index:03d}.npy"
    path.write_bytes(b"\x93NUMPY but not really")
    return str(path)


def test_a_file_that_fails_in_a_group_is_named_and_skipped_alone(tmp_path: Any) -> None:
    ids = write_id_files(tmp_path, 12, 5)
    broken = break_file(tmp_path, 6)  # the middle of the second group of four
    with running_daemon(config(tmp_path, per_lease=4, workers=2)) as daemon:
        with Client(daemon.endpoint, timeout_s=20) as client, pytest.raises(WorkerError) as info:
            for _ in client.epoch(0):
                pass
    assert info.value.file == broken and info.value.record is None, info.value
    skip = config(tmp_path, per_lease=4, workers=2, on_error="skip")
    with running_daemon(skip) as daemon:
        with Client(daemon.endpoint, timeout_s=20) as client:
            got = [i for b in client.epoch(0) for i in ids_of(b)]
        status = query_status(daemon.endpoint)
    lost = ids[6 * 5 : 7 * 5]
    assert got == [i for i in ids if i not in lost], "every other file, in order"
    assert status["skipped_records"] == 1


def draw(sample: Any, rng: Any) -> Any:
    """The sample's id and one draw of its generator."""
    (value,) = sample
    return (np.array([int(value), int(rng.integers(2**62))], dtype=np.int64),)


def test_a_mappers_generator_is_seeded_by_the_group_and_its_record(data: Any) -> None:
    directory, ids = data
    mapper = {"mappers": ["tests.integration.test_lease_groups:draw"]}
    rows = {}
    for workers in (1, 3):
        with loader.Loader(config(directory, per_lease=8, workers=workers, **mapper)) as source:
            rows[workers] = [np.asarray(b["data"]).tolist() for b in source.epoch(1)]
    assert rows[1] == rows[3], "the same draws whatever the worker count"
    # Unshuffled, group k holds files 8k .. 8k+7; its records run on through them.
    where, group_record = {}, 0
    for i, size in enumerate(SIZES):
        if i % 8 == 0:
            group_record = 0
        for r in range(size):
            where[ids[sum(SIZES[:i]) + r]] = (i // 8, group_record + r)
        group_record += size
    for value, drawn in (row for batch in rows[1] for row in batch):
        expected = np.random.default_rng((3, 1, *where[value]))
        assert drawn == int(expected.integers(2**62))


def test_a_worker_death_in_a_group_names_every_file_of_its_lease(tmp_path: Any) -> None:
    # Only the worker knows which file of its lease it was reading: the daemon names them all.
    write_id_files(tmp_path, 12, 5)
    np.save(tmp_path / "f006.npy", np.array([1, 2, 123456789, 4], dtype=np.int64))  # kills its worker
    cfg = config(tmp_path, per_lease=4, workers=2, mappers=["tests.helpers:exit_on_123456789"])
    with running_daemon(cfg) as daemon:
        with Client(daemon.endpoint, timeout_s=30) as client, pytest.raises(WorkerError) as info:
            for _ in client.epoch(0):
                pass
    assert info.value.type_name == "WorkerDiedError" and info.value.file == str(tmp_path / "f004.npy")
    assert "first of 4 small files leased together" in info.value.message
    assert all(str(tmp_path / f"f{i:03d}.npy") in info.value.message for i in range(4, 8)), info.value.message


def test_a_sample_that_does_not_fit_its_batch_in_a_group_says_which_lease(tmp_path: Any) -> None:
    write_id_files(tmp_path, 8, 5)
    np.save(tmp_path / "f005.npy", np.zeros((5, 2), dtype=np.int64))  # rows of another shape
    with running_daemon(config(tmp_path, per_lease=4, workers=1)) as daemon:
        with Client(daemon.endpoint, timeout_s=20) as client, pytest.raises(WorkerError) as info:
            for _ in client.epoch(0):
                pass
    assert "does not fit its batch" in info.value.message and info.value.file == str(tmp_path / "f004.npy")
    assert str(tmp_path / "f005.npy") in info.value.message, info.value.message


def id_line(line: str) -> Any:
    """A text line of one id; lines of ``#`` are comments."""
    return None if line.startswith("#") else {"data": np.int64(int(line))}


def id_lines_source(directory: Any, **source: Any) -> dict[str, Any]:
    """A ``[source]`` of the directory's ``.txt`` files of one id a line (``id_line``)."""
    parser = "tests.integration.test_lease_groups:id_line"
    return {"files": [str(directory / "*.txt")], "format": "text", "format_options": {"parser": parser}, **source}


def test_a_resume_after_the_small_files_were_grouped_otherwise_is_refused(tmp_path: Any) -> None:
    # Groups follow the files' sizes: an anchor's order index would name another group, and the resumed
    # epoch would repeat some samples and miss others without a word.
    for i in range(12):
        (tmp_path / f"f{i:03d}.txt").write_text("".join(f"{i * 100 + r}\n" for r in range(5)))
    cfg = make_config(
        tmp_path,
        source=id_lines_source(tmp_path, files_per_lease=3),
        pipeline={"batch_size": 4, "shuffle_buffer": 2, "seed": 1},
        workers={"count": 1},
    )
    with loader.Loader(cfg) as first:
        batches = iter(first.epoch(0))
        for _ in range(9):
            next(batches)
        state = first.state_dict()
    assert state["anchor"][1] > 0, "the anchor names a group past the first"
    grown = tmp_path / "f001.txt"  # the same records, past 1 MiB: it now goes alone
    grown.write_text("#" + "x" * (1 << 20) + "\n" + grown.read_text())
    with loader.Loader(cfg) as resumed:
        with pytest.raises(ConfigError, match="lease_groups .* a file changed"):
            resumed.load_state_dict(state)

"""What a worker sends is what the mappers made: columns stack only without changing a value, and chunks are
sized by what their values really weigh (lists of arrays, bytes, rows a batch mapper widened)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import workers.columns as columns
from loader.config import LoaderConfig
from loader.service import protocol as P
from loader.service.client.batches import to_batch
from loader.service.shm.pool import ArenaPool
from tests.unit.workers.file_jobs import run_file_job
from workers.arena_writer import ArenaWriter
from workers.columns import rows_for_bytes, stack_column, value_nbytes

HERE = "tests.unit.workers.test_columns"
MIB = 1024 * 1024


@pytest.fixture(autouse=True)
def no_chunk_timer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(columns, "MAX_CHUNK_DELAY_S", 3600.0)  # only sizes end chunks, however slow the run


def test_bytes_keep_their_trailing_nul_bytes_and_their_own_lengths() -> None:
    # np.asarray(bytes) made an "S" array: every value padded to the longest, trailing NULs dropped when read.
    values = [b"\x00\x01\x00\x00", b"ab", b"x" * 1000]
    column = stack_column(values)
    assert column.dtype.hasobject and list(column) == values
    for batch in (
        to_batch({"b": column}, "tuple", "stacked")["b"],
        [s[0] for s in to_batch({"b": column}, "tuple", "list")],
    ):
        assert list(batch) == values and [len(v) for v in batch] == [4, 2, 1000]


def test_values_of_different_dtypes_stay_as_they_were() -> None:
    # np.stack promoted uint8 + int8 to int16, and int64 2**60 + float32 to float64 (two ids then equal).
    column = stack_column([np.full(3, 200, np.uint8), np.full(3, -1, np.int8)])
    assert column.dtype.hasobject and [v.dtype for v in column] == [np.uint8, np.int8]
    column = stack_column([np.int64(2**60), np.float32(0.5), np.int64(2**60 + 2)])
    assert [type(v) for v in column] == [np.int64, np.float32, np.int64] and column[0] != column[2]
    assert stack_column([np.float32(1), np.float32(2)]).dtype == np.float32
    same = stack_column([np.zeros((2, 3), np.float16), np.ones((2, 3), np.float16)])
    assert same.dtype == np.float16 and same.shape == (2, 2, 3)
    assert stack_column([1, 2, 3]).dtype == np.int64 and stack_column([1, 2.5]).dtype == np.float64
    assert stack_column([2**70, 1]).dtype.hasobject  # past 64 bits: the values as they are


def test_a_value_weighs_what_it_holds() -> None:
    crops = [np.zeros(1000, np.float32) for _ in range(4)]
    assert value_nbytes(crops) >= 16_000 and value_nbytes({"crops": crops, "name": "x" * 10}) >= 16_010
    assert value_nbytes(b"abc") == 3 and value_nbytes(5) == 8 and value_nbytes(np.zeros(10)) == 80


def test_a_batch_of_big_rows_is_one_chunk_only_within_the_daemons_message_bound() -> None:
    assert rows_for_bytes(100 * 1024, 4096, 64, 1 * MIB) == 64  # 6.4 MiB: one batch per chunk
    assert rows_for_bytes(100 * 1024, 4096, 64, 512 * 1024, 512 * 1024) == 5  # a daemon taking 1 MiB messages


def list_of_crops(sample: Any) -> Any:
    (value,) = sample
    # A list of ragged crops, 240 KiB a sample: counted as 8 bytes before, so 300 of them made one 70 MiB message.
    return {"crops": [np.full(15_000 + i, value, np.float32) for i in range(4)], "y": np.int64(value)}


def one_big_bytes(sample: Any) -> Any:
    (value,) = sample
    return (b"x" * (128 * 1024) if value == 0 else b"%d" % value,)


def widen_block(block: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Rows of 64 KiB from rows of 8 bytes."""
    (ids,) = block.values()
    return {"data": np.repeat(ids.astype(np.float32)[:, None], 16_384, axis=1), "id": ids}


def _run(path: str, tables: dict[str, Any], arena: ArenaWriter | None = None) -> list[tuple[Any, Any, int]]:
    config = LoaderConfig.from_dict({"source": {"files": [path]}, **tables})
    sent = run_file_job(P.Lease(lease=1, stream=1, epoch=0, file=0, path=path), config, arena)
    return [(*P.decode(frames), sum(memoryview(f).nbytes for f in frames)) for frames in sent]


def _values_file(tmp_path: Any, n: int) -> str:
    path = str(tmp_path / "values.npy")
    np.save(path, np.arange(n, dtype=np.int64))
    return path


def test_samples_holding_lists_of_arrays_go_in_chunks_within_the_message_bound(tmp_path: Any) -> None:
    path = _values_file(tmp_path, 300)
    tables = {"pipeline": {"mappers": [f"{HERE}:list_of_crops"], "batch_format": "list"}}
    messages = _run(path, {**tables, "workers": {"shm_arena_mib": 0}, "service": {"max_message_mib": 8}})
    assert isinstance(messages[-1][0], P.FileDone) and messages[-1][0].sent == 300
    assert max(size for *_, size in messages) <= 8 * MIB


def test_one_big_bytes_value_does_not_pad_its_neighbours(tmp_path: Any) -> None:
    path = _values_file(tmp_path, 4096)
    messages = _run(path, {"pipeline": {"mappers": [f"{HERE}:one_big_bytes"]}, "workers": {"shm_arena_mib": 0}})
    assert isinstance(messages[-1][0], P.FileDone) and messages[-1][0].sent == 4096
    assert sum(size for *_, size in messages) < 1 * MIB, "4095 short values and one of 128 KiB, not 4096 of 128 KiB"
    values = [v for message, cols, _ in messages[:-1] for v in next(iter(cols.values()))]
    assert values[0] == b"x" * (128 * 1024) and values[1:] == [b"%d" % i for i in range(1, 4096)]


def test_rows_a_batch_mapper_widens_are_sized_as_sent_not_as_their_references(tmp_path: Any) -> None:
    # Before: the size of the first block was read after its rows became 24-byte arena references, and
    # the next blocks were 4096 rows of 64 KiB, over the daemon's bound: the file failed (or was skipped).
    path = _values_file(tmp_path, 3000)
    tables = {
        "pipeline": {"batch_mappers": [f"{HERE}:widen_block"], "batch_size": 4},
        "workers": {"samples_per_message": 4096, "shm_arena_mib": 32},
        "service": {"max_message_mib": 16},
    }
    with ArenaPool(32 * MIB, directory=str(tmp_path)) as pool:
        messages = _run(path, tables, ArenaWriter(pool.create()))
    done = messages[-1][0]
    assert isinstance(done, P.FileDone) and (done.sent, done.skipped) == (3000, 0)
    assert max(message.count for message, *_ in messages[:-1]) <= 16 * MIB // (64 * 1024)


def test_a_file_of_records_is_refused_naming_it_rather_than_sent_as_raw_bytes(tmp_path: Any) -> None:
    # A structured dtype travels as its dtype.str, "|V8": the training loop got bytes, its field names lost.
    path = str(tmp_path / "records.npy")
    np.save(path, np.zeros(10, np.dtype([("x", "<f4"), ("y", "<i4")])))
    messages = _run(path, {"workers": {"shm_arena_mib": 0}})
    ((failure, *_),) = messages
    assert isinstance(failure, P.FileError) and failure.error["type"] == "UnsendableSampleError"
    assert "field 'data' has the structured dtype" in failure.error["message"] and failure.error["record"] == 0


@pytest.mark.parametrize("arena", [False, True])
def test_a_file_of_zero_width_rows_is_refused_naming_it_rather_than_lost_on_the_way(tmp_path: Any, arena: bool) -> None:
    # The daemon drops a |V0 frame as malformed: the epoch failed as "a chunk was lost on the way".
    path = str(tmp_path / "void.npy")
    np.save(path, np.zeros(10, "V0"))
    if arena:  # rows read unchanged from a local .npy go as references into the file: refused all the same
        with ArenaPool(32 * MIB, directory=str(tmp_path)) as pool:
            messages = _run(path, {}, ArenaWriter(pool.create()))
    else:
        messages = _run(path, {"workers": {"shm_arena_mib": 0}})
    ((failure, *_),) = messages
    assert isinstance(failure, P.FileError) and failure.error["type"] == "UnsendableSampleError"
    assert "field 'data' has the zero-width dtype |V0" in failure.error["message"] and failure.error["record"] == 0

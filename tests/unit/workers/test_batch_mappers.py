"""Batch mappers: applied to whole blocks in a worker, their results checked, failures named or skipped."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from loader.config import LoaderConfig
from loader.errors import BatchMapperError, ConfigError
from loader.examples import cpu_heavy, cpu_heavy_batch
from loader.service import protocol as P
from loader.service.order import fingerprint
from workers.file_job import FileJob
from workers.mapping import BatchMappers

HERE = "tests.unit.workers.test_batch_mappers"
BLOCKS: list[int] = []  # rows of each block ``negate`` was given, in this process


def negate(block: dict[str, Any]) -> dict[str, Any]:
    BLOCKS.append(len(block["data"]))
    return {"data": -block["data"]}


def with_square(block: dict[str, Any]) -> dict[str, Any]:
    return {**block, "square": block["data"] * block["data"]}


def fail_on_minus_40(block: dict[str, Any]) -> dict[str, Any]:
    if (block["data"] == -40).any():
        raise KeyError("no -40 here")
    return block


def drop_first_row(block: dict[str, Any]) -> dict[str, Any]:
    return {"data": block["data"][1:]}


def with_rng(block: dict[str, Any], rng: Any) -> dict[str, Any]:
    return block


def plus_one(sample: Any) -> Any:
    (value,) = sample
    return (value + 1,)


def steps(*functions: Any) -> BatchMappers:
    return BatchMappers([f"{HERE}:{f.__name__}" for f in functions], functions)


def test_batch_mappers_run_in_order_on_the_whole_block() -> None:
    block = {"data": np.arange(5, dtype=np.int64)}
    out = steps(negate, with_square)(block)
    assert list(out) == ["data", "square"]
    assert out["data"].tolist() == [0, -1, -2, -3, -4] and out["square"].tolist() == [0, 1, 4, 9, 16]
    assert not steps() and steps(negate)


@pytest.mark.parametrize(
    ("result", "message"),
    [
        ([1, 2, 3], r"returned a list, not a dict of arrays"),
        ({}, r"returned a dict with no fields"),
        (
            {"data": [1, 2, 3]},
            r"returned field 'data' as a value of type list, not a numpy array with a leading axis of 3 rows",
        ),
        ({"data": np.int64(3)}, r"returned field 'data' as a value of type int64"),
        ({"data": np.array(3)}, r"returned field 'data' as a 0-d array"),
        ({"data": np.zeros(3), "extra": np.zeros(2)}, r"returned 2 rows of field 'extra' for a block of 3"),
        ({P.INDEX_COLUMN: np.zeros(3)}, r"returned a field named '__idx__'"),
        ({1: np.zeros(3)}, r"returned a field named 1: field names are strings other than '__idx__'"),
    ],
)
def test_a_batch_mapper_result_is_checked(result: Any, message: str) -> None:
    mappers = BatchMappers(["m:bad"], [lambda block: result])
    with pytest.raises(BatchMapperError, match=rf"^batch mapper 'm:bad' {message}"):
        mappers({"data": np.arange(3)})


def test_a_batch_mapper_that_raises_is_named() -> None:
    with pytest.raises(BatchMapperError, match=rf"^batch mapper '{HERE}:fail_on_minus_40' raised KeyError") as info:
        steps(negate, fail_on_minus_40)({"data": np.arange(38, 42)})
    assert isinstance(info.value.__cause__, KeyError)


def test_a_batch_mapper_with_an_rng_is_refused() -> None:
    with pytest.raises(BatchMapperError, match="takes an rng parameter"):
        steps(with_rng)
    config = LoaderConfig.from_dict(
        {"source": {"files": ["x.npy"]}, "pipeline": {"batch_mappers": [f"{HERE}:with_rng"]}}
    )
    with pytest.raises(ConfigError, match=rf"pipeline.batch_mappers \('{HERE}:with_rng'\) takes an rng parameter"):
        config.check_imports()


def test_cpu_heavy_batch_computes_exactly_what_cpu_heavy_computes_per_row() -> None:
    x = np.random.default_rng(5).standard_normal((37, 64)).astype(np.float32)
    label = np.arange(37, dtype=np.int64)
    out = cpu_heavy_batch({"x": x, "label": label})
    rows = [cpu_heavy([x[i], label[i]]) for i in range(37)]
    assert list(out) == ["x", "label"] and out["x"].dtype == np.float32 and out["x"].shape == (37, 64)
    assert np.array_equal(out["x"], np.stack([r[0] for r in rows])), "bit for bit, not merely close"
    assert out["label"] is label
    assert np.array_equal(cpu_heavy_batch({"x": x[3:4], "label": label[3:4]})["x"][0], rows[3][0]), "a 1-row block"


# -- in a worker's FileJob ----------------------------------------------------------------------------------------


def run_job(
    tmp_path: Any,
    batch: list[str],
    *,
    mappers: tuple[Any, ...] = (),
    on_error: str = "raise",
    start: int = 0,
    rows: int = 100,
) -> tuple[list[tuple[P.Message, dict[str, np.ndarray]]], P.Message]:
    """Run one lease of a file of ids 0..rows-1; (chunks with their columns, the closing FILE_DONE or FILE_ERROR)."""
    path = tmp_path / "ids.npy"
    np.save(path, np.arange(rows, dtype=np.int64))
    config = LoaderConfig.from_dict(
        {
            "source": {"files": [str(path)]},
            "pipeline": {"batch_size": 4, "batch_mappers": batch, "on_error": on_error},
            "workers": {"samples_per_message": 16, "shm_arena_mib": 0},
        }
    )
    lease = P.Lease(lease=1, stream=1, epoch=0, file=0, path=str(path), start=start)
    sent: list[list[Any]] = []
    job = FileJob(
        lease,
        config=config,
        worker_id="w",
        mappers=lambda: list(mappers),
        batch_mappers=lambda: config.pipeline.resolve_mappers("batch_mappers"),
        arena=lambda: None,
        send_data=sent.append,
        check=lambda: None,
    )
    job.run()
    messages = [P.decode(frames) for frames in sent]
    return [(m, {k: np.asarray(v) for k, v in c.items()}) for m, c in messages[:-1]], messages[-1][0]


def rows_of(chunks: list[tuple[P.Message, dict[str, np.ndarray]]], field: str = "data") -> list[int]:
    return [int(v) for _, columns in chunks for v in columns[field]]


@pytest.mark.parametrize("start", [0, 37])
def test_the_fast_path_feeds_its_blocks_to_the_batch_mappers(tmp_path: Any, start: int) -> None:
    BLOCKS.clear()
    chunks, end = run_job(tmp_path, [f"{HERE}:negate", f"{HERE}:with_square"], start=start)
    assert rows_of(chunks) == [-i for i in range(start, 100)]
    assert rows_of(chunks, "square") == [i * i for i in range(start, 100)]
    assert [m.record for m, _ in chunks] == list(np.cumsum([start] + [m.count for m, _ in chunks])[:-1])
    assert isinstance(end, P.FileDone) and (end.sent, end.skipped) == (100 - start, 0)
    assert BLOCKS == [m.count for m, _ in chunks] and max(BLOCKS) == 16, "once per block read, not per sample"


def test_batch_mappers_follow_the_per_sample_mappers(tmp_path: Any) -> None:
    BLOCKS.clear()
    chunks, end = run_job(tmp_path, [f"{HERE}:negate"], mappers=(plus_one,))
    assert rows_of(chunks) == [-(i + 1) for i in range(100)]
    assert isinstance(end, P.FileDone) and end.sent == 100
    assert sum(BLOCKS) == 100 and len(BLOCKS) < 100, "the per-sample path maps whole chunks too"


@pytest.mark.parametrize("mappers", [(), (plus_one,)])
def test_a_failing_block_fails_the_file_naming_mapper_file_and_first_record(tmp_path: Any, mappers: Any) -> None:
    shift = 1 if mappers else 0  # plus_one makes record 39 the -40
    chunks, end = run_job(tmp_path, [f"{HERE}:negate", f"{HERE}:fail_on_minus_40"], mappers=mappers)
    assert isinstance(end, P.FileError)
    first = max(m.record + m.count for m, _ in chunks) if chunks else 0
    assert first <= 40 - shift, "the failing block starts at or before the bad record"
    assert end.error["type"] == "BatchMapperError" and end.error["record"] == first
    assert end.error["file"].endswith("ids.npy")
    assert end.error["message"] == f"batch mapper '{HERE}:fail_on_minus_40' raised KeyError: 'no -40 here'"


@pytest.mark.parametrize("mappers", [(), (plus_one,)])
def test_a_failing_block_is_skipped_and_counted(tmp_path: Any, mappers: Any) -> None:
    shift = 1 if mappers else 0
    chunks, end = run_job(tmp_path, [f"{HERE}:negate", f"{HERE}:fail_on_minus_40"], mappers=mappers, on_error="skip")
    got = rows_of(chunks)
    assert isinstance(end, P.FileDone) and end.sent == len(got) and end.sent + end.skipped == 100
    assert 1 <= end.skipped <= 16 and -40 not in got
    missing = sorted(set(range(100)) - {-v - shift for v in got})
    assert missing == list(range(missing[0], missing[0] + end.skipped)), "one whole block, nothing else"
    assert got == sorted(got, reverse=True), "the rest in record order"


def test_a_result_of_another_length_fails_the_file(tmp_path: Any) -> None:
    _, end = run_job(tmp_path, [f"{HERE}:drop_first_row"])
    assert isinstance(end, P.FileError) and end.error["record"] == 0
    assert "returned 0 rows of field 'data' for a block of 1: it must return one row per row it is given" in str(
        end.error["message"]
    )


def test_batch_mappers_are_in_the_checkpoint_fingerprint_only_when_set() -> None:
    plain = LoaderConfig.from_dict({"source": {"files": ["x.npy"]}})
    batched = LoaderConfig.from_dict({"source": {"files": ["x.npy"]}, "pipeline": {"batch_mappers": ["a:b"]}})
    assert "batch_mappers" not in fingerprint(plain, ["x.npy"], 1), "states saved before batch mappers still match"
    assert (
        fingerprint(batched, ["x.npy"], 1)["batch_mappers"]
        != fingerprint(
            LoaderConfig.from_dict({"source": {"files": ["x.npy"]}, "pipeline": {"batch_mappers": ["a:c"]}}),
            ["x.npy"],
            1,
        )["batch_mappers"]
    )


class _Damaged(Exception):
    records_skipped = 3  # like a RecordIO chunk that fails its checksum: the reader steps past its records


class _DamagedSource:
    """Ten records, of which 2..4 lie in a damaged chunk the reader steps past."""

    can_read_blocks = False
    fields = ["data"]

    def __init__(self, config: Any, path: str) -> None:
        self.path = path

    def locate(self, record: int) -> tuple[str, int]:
        return self.path, record

    def changed(self) -> None:  # never written while read
        return None

    def samples(self) -> Any:
        class Reading:
            def __init__(self) -> None:
                self.record = 0

            def __iter__(self) -> Any:
                return self

            def __next__(self) -> Any:
                if self.record == 2:
                    self.record = 5
                    raise _Damaged("bad chunk")
                if self.record >= 10:
                    raise StopIteration
                self.record += 1
                return (np.int64(self.record - 1),)

        return Reading()

    def close(self) -> None:
        pass


@pytest.mark.parametrize(("start", "skipped", "sent"), [(0, 3, 7), (3, 2, 5), (6, 0, 4)])
def test_damage_before_a_lease_start_is_not_counted_again(tmp_path, monkeypatch, start, skipped, sent) -> None:
    import workers.file_job as file_job

    monkeypatch.setattr(file_job, "FileSource", _DamagedSource)
    chunks, end = run_job(tmp_path, [], mappers=(plus_one,), on_error="skip", start=start)
    assert isinstance(end, P.FileDone) and (end.skipped, end.sent) == (skipped, sent)
    assert rows_of(chunks) == [i + 1 for i in range(10) if i >= start and not 2 <= i <= 4]

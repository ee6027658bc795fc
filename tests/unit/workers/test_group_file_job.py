"""A worker's ``FileJob`` on a lease of several small files (``source.files_per_lease``): records numbered
the same on every read of the group, failures named by their own file and record, columns named by each
file's own fields."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from loader.config import LoaderConfig
from loader.service import protocol as P
from tests.unit.workers.file_jobs import run_file_job

HERE = "tests.unit.workers.test_group_file_job"


def parse(line: str) -> tuple[np.int64]:
    """A text line of one int; ``bad`` raises."""
    if line == "bad":
        raise ValueError("bad line")
    return (np.int64(int(line)),)


def words(line: str) -> tuple[np.ndarray]:
    """A text line of ints: rows of another length on each line."""
    return (np.array([int(w) for w in line.split()]),)


def same(sample: Any) -> Any:
    return sample


def fail_on_12(sample: Any) -> Any:
    if int(sample[0]) == 12:
        raise ValueError("twelve")
    return sample


def run_group(
    paths: list[str],
    source: dict[str, Any],
    *,
    start: int = 0,
    on_error: str = "skip",
    mappers: tuple[str, ...] = (),
    batch_format: str = "stacked",
) -> tuple[list[tuple[int, dict[str, np.ndarray]]], P.Message]:
    """One lease of the group ``paths``: ([(record, columns) of each chunk], the closing FILE_DONE or FILE_ERROR)."""
    config = LoaderConfig.from_dict(
        {
            "source": {"files": paths, "files_per_lease": 8, **source},
            "pipeline": {"batch_size": 4, "on_error": on_error, "mappers": list(mappers), "batch_format": batch_format},
            "workers": {"samples_per_message": 16, "shm_arena_mib": 0},
        }
    )
    lease = P.Lease(lease=1, stream=1, epoch=0, file=0, path=paths[0], more=paths[1:], start=start)
    messages = [P.decode(frames) for frames in run_file_job(lease, config)]
    chunks = [(m.record, {k: np.asarray(v) for k, v in c.items()}) for m, c in messages[:-1]]
    return chunks, messages[-1][0]


def records_and_values(chunks: list[tuple[int, dict[str, np.ndarray]]]) -> list[tuple[int, int]]:
    out = []
    for record, columns in chunks:
        (values,) = [v for k, v in columns.items() if k != P.INDEX_COLUMN]
        records = columns.get(P.INDEX_COLUMN, np.arange(record, record + len(values)))
        out.extend((int(r), int(v)) for r, v in zip(records, values.reshape(-1)))
    return out


@pytest.fixture
def text_group(tmp_path: Any) -> list[str]:
    """a.txt fails at its record 3 (the reader steps past the line); b.txt follows with ten good records."""
    (tmp_path / "a.txt").write_text("1\n2\n3\nbad\n5\n6\n")
    (tmp_path / "b.txt").write_text("".join(f"{i}\n" for i in range(10, 20)))
    return [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]


TEXT = {"format": "text", "format_options": {"parser": f"{HERE}:parse"}}


@pytest.mark.parametrize("mappers", [(), (f"{HERE}:same",)], ids=["blocks", "samples"])
def test_a_lease_from_inside_a_group_reads_what_the_first_lease_numbered(text_group: list[str], mappers: Any) -> None:
    chunks, done = run_group(text_group, TEXT, mappers=mappers)
    whole = records_and_values(chunks)
    # a's rows 0..2, its failure is record 3 (the reader reads on: a's last two lines are 4 and 5), b's rows
    # from record 6 on.
    assert whole == [(0, 1), (1, 2), (2, 3), (4, 5), (5, 6)] + [(6 + i, 10 + i) for i in range(10)]
    assert (done.sent, done.skipped) == (15, 1)
    for start in (3, 4, 6, 8, 15):  # a cut or re-lease of the group: the records from ``start`` on, once each
        chunks, done = run_group(text_group, TEXT, start=start, mappers=mappers)
        assert records_and_values(chunks) == [(r, v) for r, v in whole if r >= start], start
        assert (done.sent, done.skipped) == (len([r for r, _ in whole if r >= start]), 1 if start <= 3 else 0)


@pytest.mark.parametrize("mappers", [(), (f"{HERE}:same",)], ids=["blocks", "samples"])
def test_a_failure_inside_a_group_names_its_file_and_its_record_there(text_group: list[str], mappers: Any) -> None:
    _, failure = run_group(list(reversed(text_group)), TEXT, on_error="raise", mappers=mappers)
    assert isinstance(failure, P.FileError)
    assert (failure.error["file"], failure.error["record"]) == (text_group[0], 3)


def test_samples_of_each_file_are_named_by_that_files_fields(tmp_path: Any) -> None:
    # Archives of one dataset may list their members in another order: each file's samples are named by
    # its own members, as one file per lease names them (not by the group's first file's).
    np.savez(tmp_path / "a.npz", image=np.zeros((2, 3)), label=np.arange(2))
    np.savez(tmp_path / "b.npz", label=np.arange(10, 13), image=np.ones((3, 3)))
    paths = [str(tmp_path / "a.npz"), str(tmp_path / "b.npz")]
    chunks, done = run_group(paths, {}, mappers=(f"{HERE}:same",))
    assert isinstance(done, P.FileDone) and done.sent == 5
    labels = [int(v) for _, columns in chunks for v in columns["label"]]
    images = np.concatenate([columns["image"] for _, columns in chunks])
    assert labels == [0, 1, 10, 11, 12]
    assert images.shape == (5, 3) and images[:2].sum() == 0 and images[2:].min() == 1
    np.savez(tmp_path / "c.npz", image=np.ones((2, 3)), label=np.arange(20, 22))
    chunks, _ = run_group([paths[0], str(tmp_path / "c.npz")], {}, mappers=(f"{HERE}:same",))
    assert len(chunks) == 1, "files of the same fields share chunks"


def test_samples_of_files_that_do_not_stack_together_go_in_chunks_of_their_own(tmp_path: Any) -> None:
    # One file per lease sends each file's rows stacked, and the stage refuses (or, for list batches, keeps)
    # rows of another shape or dtype: a group must not stack them into one chunk of objects or upcast them.
    np.save(tmp_path / "a.npy", np.zeros((2, 3), dtype=np.float32))
    np.save(tmp_path / "b.npy", np.ones((2, 4), dtype=np.float32))  # another row shape
    np.save(tmp_path / "c.npy", np.ones((2, 4), dtype=np.int64))  # another dtype
    np.save(tmp_path / "d.npy", np.full((2, 4), 2, dtype=np.int64))  # stacks with c
    paths = [str(tmp_path / f"{name}.npy") for name in "abcd"]
    chunks, done = run_group(paths, {}, mappers=(f"{HERE}:same",))
    assert isinstance(done, P.FileDone) and done.sent == 8
    layouts = [(record, columns["data"].dtype, columns["data"].shape) for record, columns in chunks]
    assert layouts == [(0, np.float32, (2, 3)), (2, np.float32, (2, 4)), (4, np.int64, (4, 4))]


def test_a_file_of_a_group_that_cannot_be_opened_is_skipped_in_words(tmp_path: Any, caplog: Any) -> None:
    np.save(tmp_path / "a.npy", np.arange(3))
    (tmp_path / "b.npy").write_bytes(b"not an npy file")
    paths = [str(tmp_path / "a.npy"), str(tmp_path / "b.npy")]
    with caplog.at_level("WARNING", logger="loader.worker"):
        _, done = run_group(paths, {})
    assert isinstance(done, P.FileDone) and (done.sent, done.skipped) == (3, 1)
    assert f"skipping {paths[1]}, which could not be opened: DataError" in caplog.text
    assert "record None" not in caplog.text


def test_ragged_samples_share_a_chunk_across_files_as_they_do_inside_one(tmp_path: Any) -> None:
    (tmp_path / "a.txt").write_text("1\n1 2\n")
    (tmp_path / "b.txt").write_text("1 2 3\n")
    paths = [str(tmp_path / "a.txt"), str(tmp_path / "b.txt")]
    chunks, _ = run_group(
        paths,
        {"format": "text", "format_options": {"parser": f"{HERE}:words"}},
        mappers=(f"{HERE}:same",),
        batch_format="list",  # ragged rows: stacked batches refuse them (workers/sample_check.py)
    )
    (column,) = chunks[0][1].values()
    assert len(chunks) == 1 and [len(v) for v in column] == [1, 2, 3]


def test_a_mapper_failing_inside_a_group_names_its_file_and_record_there(text_group: list[str]) -> None:
    _, failure = run_group(text_group[1:] * 2, TEXT, on_error="raise", mappers=(f"{HERE}:fail_on_12",))
    assert isinstance(failure, P.FileError) and failure.error["type"] == "ValueError"
    assert (failure.error["file"], failure.error["record"]) == (text_group[1], 2)
    chunks, done = run_group(text_group, TEXT, mappers=(f"{HERE}:fail_on_12",))
    assert [v for _, v in records_and_values(chunks)] == [1, 2, 3, 5, 6, 10, 11] + list(range(13, 20))
    assert (done.sent, done.skipped) == (14, 2)


def fail_on_odd(sample: Any) -> Any:
    if int(sample[0]) % 2:
        raise ValueError("odd")
    return sample


def test_a_lease_of_many_bad_records_names_the_first_few_then_says_there_are_more(tmp_path: Any, caplog: Any) -> None:
    from workers.file_job import SKIPS_LOGGED_PER_LEASE

    (tmp_path / "a.txt").write_text("".join(f"{i}\n" for i in range(40)))
    with caplog.at_level("WARNING", logger="workers"):
        chunks, done = run_group([str(tmp_path / "a.txt")], TEXT, mappers=(f"{HERE}:fail_on_odd",))
    assert [value for _, value in records_and_values(chunks)] == list(range(0, 40, 2))
    assert isinstance(done, P.FileDone) and done.skipped == 20  # every skip is counted, for the daemon's summary
    named = [r.getMessage() for r in caplog.records if r.getMessage().startswith("skipping record")]
    assert named == [f"skipping record {r} of {tmp_path / 'a.txt'}: ValueError: odd" for r in (1, 3, 5, 7, 9)]
    assert len(named) == SKIPS_LOGGED_PER_LEASE
    assert sum("skipping more records of" in r.getMessage() for r in caplog.records) == 1

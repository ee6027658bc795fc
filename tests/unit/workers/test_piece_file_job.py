"""A worker's ``FileJob`` on a lease of a piece of a file (``source.records_per_lease``): only the piece's
records, numbered from 0 (``start`` too), failures named by the record's number in the file."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from loader.config import LoaderConfig
from loader.service import protocol as P
from tests.unit.workers.file_jobs import run_file_job

MAPPERS = "tests.unit.workers.test_group_file_job"  # ``same``, and ``fail_on_12``: raises on the value 12


def run_piece(
    path: str, piece: list[int], *, start: int = 0, on_error: str = "raise", mappers: tuple[str, ...] = ()
) -> tuple[list[tuple[int, int]], P.Message]:
    """One lease of ``piece`` of ``path``: ([(record, value) sent], the closing FILE_DONE or FILE_ERROR)."""
    config = LoaderConfig.from_dict(
        {
            "source": {"files": [path], "records_per_lease": piece[1]},
            "pipeline": {"batch_size": 4, "on_error": on_error, "mappers": list(mappers)},
            "workers": {"samples_per_message": 16, "shm_arena_mib": 0},
        }
    )
    lease = P.Lease(lease=1, stream=1, epoch=0, file=0, path=path, piece=piece, start=start)
    messages = [P.decode(frames) for frames in run_file_job(lease, config)]
    sent = []
    for message, columns in messages[:-1]:
        values = np.asarray(columns["data"]).reshape(-1)
        records = columns.get(P.INDEX_COLUMN, np.arange(message.record, message.record + len(values)))
        sent.extend((int(r), int(v)) for r, v in zip(records, values))
    return sent, messages[-1][0]


@pytest.fixture
def hundred(tmp_path: Any) -> str:
    path = tmp_path / "a.npy"
    np.save(path, np.arange(100, dtype=np.int64))  # record i holds i
    return str(path)


@pytest.mark.parametrize("mappers", [(), (f"{MAPPERS}:same",)], ids=["blocks", "samples"])
@pytest.mark.parametrize(("piece", "start"), [([0, 30], 0), ([30, 30], 0), ([30, 30], 12), ([90, 30], 4)])
def test_a_piece_sends_its_records_numbered_from_0(hundred: str, mappers: Any, piece: list[int], start: int) -> None:
    sent, done = run_piece(hundred, piece, start=start, mappers=mappers)
    first, count = piece
    stop = min(100, first + count)  # the last piece of the file is shorter
    assert sent == [(r - first, r) for r in range(first + start, stop)]
    assert isinstance(done, P.FileDone) and (done.sent, done.skipped) == (stop - first - start, 0)


@pytest.mark.parametrize("mappers", [(), (f"{MAPPERS}:same",)], ids=["blocks", "samples"])
def test_a_file_shorter_than_the_records_before_its_piece_fails_naming_it(hundred: str, mappers: Any) -> None:
    _, failure = run_piece(hundred, [120, 30], mappers=mappers)
    assert isinstance(failure, P.FileError) and failure.error["file"] == hundred
    assert "has 100 records, fewer than the 120 before this lease's piece" in failure.error["message"]


def test_a_mapper_failing_inside_a_piece_names_the_record_in_the_file(hundred: str) -> None:
    _, failure = run_piece(hundred, [5, 20], mappers=(f"{MAPPERS}:fail_on_12",))
    assert isinstance(failure, P.FileError) and failure.error["type"] == "ValueError"
    assert (failure.error["file"], failure.error["record"]) == (hundred, 12)
    sent, done = run_piece(hundred, [5, 20], on_error="skip", mappers=(f"{MAPPERS}:fail_on_12",))
    assert [v for _, v in sent] == [v for v in range(5, 25) if v != 12]
    assert isinstance(done, P.FileDone) and (done.sent, done.skipped) == (19, 1)

"""``ArenaWriter.put_rows``: a chunk's big mapped rows written straight into the arena, one array per sample."""

from __future__ import annotations

import numpy as np
import pytest

from loader.service.shm import refs as R
from loader.service.shm.pool import ArenaPool
from workers.arena_writer import ArenaWriter

MIB = 1024 * 1024


@pytest.fixture
def writer(tmp_path):
    with ArenaPool(4 * MIB, directory=str(tmp_path)) as pool:
        yield ArenaWriter(pool.create()), pool


def _images(n: int, seed: int = 3) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.random((64, 96, 3), dtype=np.float32) for _ in range(n)]


def test_rows_of_one_layout_are_written_and_gather_to_their_stack(writer):
    arena_writer, pool = writer
    rows = _images(4)
    rows[1] = rows[1][:, ::-1]  # a flipped view (not contiguous), as a random flip returns
    rows[2] = np.asfortranarray(rows[2])
    put = arena_writer.put_rows(rows)
    assert put is not None
    refs, spec = put
    assert spec == ("<f4", (64, 96, 3)) and refs.shape == (4, R.REF_WIDTH)
    out = R.gather(refs, {0: spec}, pool.get)
    assert np.array_equal(out, np.stack(rows))
    assert arena_writer.arena.used_blocks() == 0


@pytest.mark.parametrize(
    "rows",
    [
        [np.zeros((64, 96, 3), np.float32), np.zeros((64, 95, 3), np.float32)],  # ragged
        [np.zeros((64, 96, 3), np.float32), np.zeros((64, 96, 3), np.float64)],  # mixed dtypes
        [np.zeros((8, 8), np.float32)] * 3,  # small rows stay inline
        [np.zeros((64, 96, 3), np.float32), [0.0] * 10],  # not an array
        ["a string", "another"],
        [np.empty((20000,), dtype=object)],
        [],
    ],
    ids=["ragged", "dtypes", "small", "list", "str", "object", "empty"],
)
def test_rows_that_do_not_stack_into_one_eligible_column_are_left_to_the_caller(writer, rows):
    arena_writer, _ = writer
    assert arena_writer.put_rows(rows) is None
    assert arena_writer.arena.used_blocks() == 0


def test_rows_that_do_not_fit_take_nothing(writer):
    arena_writer, _ = writer
    too_many = [np.zeros((1024, 1024), np.uint8)] * 5  # 5 MiB in a 4 MiB arena
    assert arena_writer.put_rows(too_many) is None
    assert arena_writer.arena.used_blocks() == 0


def test_put_describes_and_frees_the_placed_columns_with_its_own(writer):
    arena_writer, pool = writer
    rows = _images(3)
    refs, spec = arena_writer.put_rows(rows)
    columns = {"image": refs, "mask": np.ones((3, 20000), np.float32), "label": np.arange(3)}
    described, written = arena_writer.put(columns, {"image": spec})
    assert described == {"image": {0: ["<f4", [64, 96, 3]]}, "mask": {0: ["<f4", [20000]]}}
    assert columns["label"].tolist() == [0, 1, 2]  # small: inline, untouched
    assert np.array_equal(R.gather(columns["image"], {0: spec}, pool.get, free=False), np.stack(rows))
    arena_writer.free(written)  # a chunk never sent gives back both columns
    assert arena_writer.arena.used_blocks() == 0

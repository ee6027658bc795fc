"""Window shuffle and step cutter (pure numpy, no sockets). Duplicates are the sequencer's: test_sequencer.py."""

from __future__ import annotations

import numpy as np
import pytest

from loader.service.blocks import concat
from loader.service.daemon.batching import StepCutter, WindowShuffle, split_tail, tail_sizes
from loader.service.order import WINDOW_ROUNDS, start_anchor


def _blocks(total, size, start=0):
    return [{"x": np.arange(i, min(i + size, total))} for i in range(start, total, size)]


def _shuffled(capacity, seed, total=1000, size=37, epoch=0):
    shuffle = WindowShuffle(capacity, seed, epoch, start_anchor())
    out = []
    for block in _blocks(total, size):
        out.extend(b["x"] for b in shuffle.add(block, 0, block["x"]))
    out.extend(b["x"] for b in shuffle.finish())
    return np.concatenate(out)


def test_shuffle_keeps_every_row_once_and_is_seeded():
    a, b, c = _shuffled(100, 1), _shuffled(100, 1), _shuffled(100, 2)
    assert sorted(a.tolist()) == list(range(1000))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert not np.array_equal(a, np.arange(1000))
    assert not np.array_equal(a, _shuffled(100, 1, epoch=1)), "each epoch draws afresh"


@pytest.mark.parametrize("size", [1, 7, 37, 250, 1000])
def test_shuffle_depends_on_the_rows_not_on_how_they_were_chunked(size):
    # Workers cut files into chunks of their own sizes: the output must not see it.
    np.testing.assert_array_equal(_shuffled(64, 3, size=size), _shuffled(64, 3, size=13))


def test_shuffle_golden_prefix():
    # Pins the (seed, algorithm) -> order mapping: a change breaks every saved checkpoint, so only on purpose.
    assert _shuffled(8, 0, total=40, size=5)[:8].tolist() == GOLDEN


GOLDEN = [10, 12, 7, 5, 14, 4, 2, 3]


def test_a_window_emits_exactly_its_own_rows():
    capacity = 10
    window = WINDOW_ROUNDS * capacity
    out = _shuffled(capacity, 5, total=3 * window, size=9)
    for w in range(3):
        assert sorted(out[w * window : (w + 1) * window].tolist()) == list(range(w * window, (w + 1) * window))


def test_window_anchors_name_where_each_window_begins():
    capacity = 10
    window = WINDOW_ROUNDS * capacity
    shuffle = WindowShuffle(capacity, 0, 0, start_anchor())
    for block in _blocks(2 * window + 5, 11):
        shuffle.add(block, 3, block["x"])
    assert shuffle.anchors == {0: (0, 0), 1: (3, window), 2: (3, 2 * window)}
    shuffle.forget_anchors_before(2)
    assert list(shuffle.anchors) == [2]


def test_zero_capacity_passes_blocks_through_in_order():
    np.testing.assert_array_equal(_shuffled(0, 1), np.arange(1000))


def test_shuffle_buffer_is_bounded():
    shuffle = WindowShuffle(50, 0, 0, start_anchor())
    for block in _blocks(1000, 10):
        shuffle.add(block, 0, block["x"])
        assert shuffle.rows <= 100


def _steps(cutter):
    steps = []
    while (step := cutter.pop()) is not None:
        steps.append([b["x"].tolist() for b in step.slices])
    return steps


def test_cutter_says_where_a_step_cut_from_one_block_lies():
    cutter = StepCutter(world_size=2, batch_size=3, drop_last=False)
    blocks = _blocks(20, 8)  # rows 0-7, 8-15, 16-19
    cutter.extend(blocks)
    cuts = []
    while (cut := cutter.pop()) is not None:
        cuts.append(cut)
    # Steps of 6 rows: 0-5 and 6-11 (the second joins two blocks), 12-17 (joins), then none whole.
    assert [c.source is not None for c in cuts] == [True, False, False]
    first = cuts[0]
    assert first.source is blocks[0] and first.start == 0
    for rank, piece in enumerate(first.slices):
        lies = first.source["x"][first.start + rank * 3 : first.start + (rank + 1) * 3]
        assert piece["x"].tolist() == lies.tolist()
        assert np.shares_memory(piece["x"], first.source["x"])  # a view, not a copy
    cutter = StepCutter(world_size=1, batch_size=2, drop_last=False)
    cutter.extend(_blocks(8, 8))
    starts = []
    while (cut := cutter.pop()) is not None:
        starts.append(cut.start)
    assert starts == [0, 2, 4, 6]


def test_cutter_cuts_global_steps_across_blocks():
    cutter = StepCutter(world_size=2, batch_size=3, drop_last=False)
    cutter.extend(_blocks(14, 4))
    assert _steps(cutter) == [[[0, 1, 2], [3, 4, 5]], [[6, 7, 8], [9, 10, 11]]]
    tail, dropped = cutter.flush()
    assert [b["x"].tolist() for b in tail] == [[12], [13]] and dropped == []
    assert cutter.flush() == (None, [])


def test_cutter_drop_last_returns_the_dropped_rows():
    cutter = StepCutter(world_size=3, batch_size=2, drop_last=True)
    cutter.extend(_blocks(8, 5))
    assert len(_steps(cutter)) == 1
    tail, dropped = cutter.flush()
    assert tail is None and concat(dropped)["x"].tolist() == [6, 7]


def test_cutter_skips_rows_before_the_resume_position():
    cutter = StepCutter(world_size=1, batch_size=4, drop_last=False, skip=5)
    dropped = cutter.extend(_blocks(12, 3))
    assert concat(dropped)["x"].tolist() == [0, 1, 2, 3, 4]
    assert _steps(cutter) == [[[5, 6, 7, 8]]]


@pytest.mark.parametrize("rows,world", [(1, 1), (1, 3), (2, 3), (5, 3), (7, 4), (9, 2)])
def test_tail_is_split_evenly_and_padded_with_at_most_world_minus_one_repeats(rows, world):
    sizes = tail_sizes(rows, world)
    assert sum(sizes) == rows and max(sizes) - min(sizes) <= 1
    parts = split_tail({"x": np.arange(rows)}, rows, world)
    assert len(parts) == world and all(len(p["x"]) >= 1 for p in parts)
    flat = [v for p in parts for v in p["x"].tolist()]
    assert set(flat) == set(range(rows)), "every row of the tail is delivered"
    assert len(flat) - rows == max(0, world - rows) <= world - 1


def test_concat_mixes_stacked_and_ragged_blocks():
    from loader.service.protocol import object_array

    a = {"x": np.zeros((2, 3))}
    b = {"x": object_array([np.zeros(1), np.zeros(4)])}
    out = concat([a, b])
    assert out["x"].dtype == object and len(out["x"]) == 4

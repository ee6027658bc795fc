"""The sequencer: files back in the epoch's order, duplicates dropped, a bounded reorder window."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loader.service.daemon.sequencer import Cut, Sequencer


def _rows(first: int, count: int, width: int = 1) -> tuple[dict[str, np.ndarray], np.ndarray]:
    records = np.arange(first, first + count)
    return {"x": np.repeat(records[:, None], width, axis=1).astype(np.int64)}, records


def _values(tagged) -> list[int]:
    return [int(v) for block, _, _ in tagged for v in block["x"][:, 0]]


def test_rows_of_later_files_wait_for_the_head_and_duplicates_drop():
    seq = Sequencer([2, 0, 1], 0, 0, reorder_rows=100)
    out, dropped, cut = seq.add(0, *_rows(0, 3))  # file 0 is second in the order: held
    assert out == [] and dropped == [] and cut is None and seq.held_rows == 3
    out, _, _ = seq.add(2, *_rows(0, 2))  # the head passes straight on
    assert _values(out) == [0, 1]
    _, dropped, _ = seq.add(2, *_rows(1, 2))  # a re-leased head re-sends record 1
    assert [int(v) for v in dropped[0]["x"][:, 0]] == [1]
    out = seq.finish(2)
    assert _values(out) == [0, 1, 2], "the held rows of file 0 follow once file 2 is complete"
    assert seq.held_rows == 0 and seq.held_bytes == 0


def test_a_chunk_beyond_the_window_cuts_its_file_at_the_record_it_stands():
    seq = Sequencer([0, 1], 0, 0, reorder_rows=4)
    seq.add(1, *_rows(0, 3))
    out, dropped, cut = seq.add(1, *_rows(3, 2))
    assert cut == Cut(1, 3) and len(dropped) == 1 and seq.held_rows == 3
    assert seq.add(1, *_rows(3, 1))[2] is None and seq.held_rows == 3, "nothing of a cut file is taken"
    assert seq.lease_start(1) == 3, "its next lease starts after the last row taken"
    assert seq.add(1, *_rows(3, 1))[2] is None and seq.held_rows == 4


def test_small_rows_are_held_up_to_the_byte_budget_and_not_beyond():
    # 1000 rows of 8 bytes fit 8 KiB, far more rows than the row bound of 10.
    seq = Sequencer([0, 1], 0, 0, reorder_rows=10, reorder_bytes=8192)
    assert seq.add(1, *_rows(0, 500))[2] is None and seq.held_bytes == 4000
    assert seq.may_read(1), "room for another chunk of 500 rows"
    assert seq.add(1, *_rows(500, 500))[2] is None and seq.held_bytes == 8000
    assert seq.add(1, *_rows(1000, 100))[2] == Cut(1, 1000)
    big = Sequencer([0, 1], 0, 0, reorder_rows=10, reorder_bytes=8192)
    assert big.add(1, *_rows(0, 20, width=128))[2] == Cut(1, 0), "1 KiB rows: only the row bound applies"


def test_a_resumed_stream_starts_at_its_anchor_file_and_record():
    seq = Sequencer([3, 1, 0, 2], 2, 40, reorder_rows=10)
    assert set(seq.files) == {0, 2}, "files before the anchor are never read"
    assert seq.lease_start(0) == 40 and seq.lease_start(2) == 0
    out, dropped, _ = seq.add(0, *_rows(38, 4))
    assert _values(out) == [40, 41] and len(dropped) == 1


@settings(max_examples=80, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 25), min_size=1, max_size=5),
    chunk=st.integers(1, 7),
    window=st.integers(1, 30),
    seed=st.integers(0, 2**16),
)
def test_any_interleaving_with_cuts_and_re_leases_gives_the_order_exactly_once(sizes, chunk, window, seed):
    order = list(np.random.default_rng(seed).permutation(len(sizes)))
    seq = Sequencer(order, 0, 0, reorder_rows=window)
    rng = np.random.default_rng(seed + 1)
    offsets = np.cumsum([0, *sizes])
    next_record = {f: seq.lease_start(f) for f in range(len(sizes))}  # each file's current lease position
    got: list[int] = []
    for _ in range(10_000):
        if seq.complete:
            break
        readable = [f for f in range(len(sizes)) if f in seq.files and not seq.files[f].done and seq.may_read(f)]
        f = int(rng.choice(readable))
        first = next_record[f]
        count = min(chunk, sizes[f] - first)
        if count <= 0:
            got += _values(seq.finish(f))
            continue
        block, records = _rows(offsets[f] + first, count)
        out, _, cut = seq.add(f, block, records - offsets[f])
        got += _values(out)
        next_record[f] = seq.lease_start(f) if cut is not None else first + count
    assert seq.complete
    expected = [int(offsets[f] + r) for f in order for r in range(sizes[f])]
    assert got == expected


@pytest.mark.parametrize("window", [0, 1])
def test_the_head_file_is_always_readable(window):
    seq = Sequencer([0, 1], 0, 0, reorder_rows=window)
    seq.add(1, *_rows(0, 5))
    assert seq.may_read(0)


def test_after_a_cut_only_the_head_may_be_leased_until_the_window_empties():
    """Room for one row is not room for a chunk: a cut file leased again at once would be cut again at
    once, in a loop that kept workers from the head file while the window stayed full."""
    seq = Sequencer([0, 1, 2], 0, 0, reorder_rows=10)
    seq.add(1, *_rows(0, 4))
    assert seq.may_read(2), "room for another chunk of 4 rows"
    seq.add(1, *_rows(4, 4))
    assert not seq.may_read(2), "8 rows held of 10: no room for a chunk of 4"
    assert seq.add(1, *_rows(8, 4))[2] == Cut(1, 8)
    assert not seq.may_read(1) and not seq.may_read(2), "the cut file is not leased just to be cut again"
    assert seq.may_read(0), "the head is"
    seq.finish(0)
    assert seq.may_read(1) and seq.may_read(2), "the window emptied into the stream: room again"


def test_records_a_cut_lease_skipped_are_kept_for_the_file_and_misfits_advance_it():
    seq = Sequencer([0, 1], 0, 0, reorder_rows=4)
    seq.lease_start(1)
    block, _ = _rows(0, 3)
    seq.add(1, block, np.array([0, 2, 5]))  # the worker skipped records 1, 3 and 4
    assert seq.add(1, *_rows(6, 3))[2] == Cut(1, 6), "the window is full: the lease is cut at record 6"
    assert seq.files[1].skipped_before_cuts == 3, "the cut lease's FILE_DONE would have said so; it is not taken"
    assert seq.lease_start(1) == 6
    assert seq.skip(1, np.array([6, 7])) == 2 and seq.files[1].next_record == 8, "misfits are taken, rowless"
    assert seq.skip(1, np.array([7])) == 0, "and never counted twice"
    seq.files[1].held, seq.held_rows = [], 0  # room again
    assert seq.add(1, *_rows(9, 1))[2] is None
    assert seq.cut(1) == Cut(1, 10)
    assert seq.files[1].skipped_before_cuts == 3 + 1, "record 8 was skipped by the second lease"

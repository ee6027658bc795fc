"""Decorated readers: shuffle, batch, multi-pass, double buffer; and the paddle-style bridges."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import loader.io as lio
from loader.errors import ClosedError, DataError, ShapeMismatchError
from tests.helpers import Boom, ListReader, RangeReader, raise_on, wait_until

OVERLAP_TIMEOUT_S = 10.0  # only reached when the double buffer does not read ahead

TIMEOUT_S = 20


def _ints(n: int) -> lio.ReaderBase:
    return lio.from_reader(RangeReader(n), shapes=[[-1]], dtypes=["int64"])


def _values(reader) -> list[int]:
    return [int(item[0]) for item in reader]


# -- shuffle ------------------------------------------------------------------


def test_shuffle_keeps_the_multiset_and_block_boundaries():
    got = _values(lio.ShuffleReader(_ints(25), buffer_size=10, seed=3))
    assert sorted(got) == list(range(25))
    assert got != list(range(25))
    assert sorted(got[:10]) == list(range(10)) and sorted(got[10:20]) == list(range(10, 20))


def test_shuffle_is_deterministic_given_a_seed_and_differs_per_pass():
    a = lio.ShuffleReader(_ints(50), 50, seed=7)
    b = lio.ShuffleReader(_ints(50), 50, seed=7)
    first = _values(a)
    assert first == _values(b)
    a.reinit()
    second = _values(a)
    assert sorted(second) == list(range(50)) and second != first
    assert _values(lio.ShuffleReader(_ints(50), 50, seed=8)) != first


def test_shuffle_buffer_of_one_keeps_order_and_reinit_mid_pass_is_clean():
    assert _values(lio.ShuffleReader(_ints(5), 1)) == [0, 1, 2, 3, 4]
    reader = lio.ShuffleReader(_ints(20), 8, seed=1)
    reader.read_next(), reader.read_next()
    reader.reinit()
    assert sorted(_values(reader)) == list(range(20))
    with pytest.raises(ValueError):
        lio.ShuffleReader(_ints(2), 0)


# -- batch --------------------------------------------------------------------


def test_batch_stacks_and_keeps_the_partial_last_batch():
    source = lio.from_reader(
        ListReader([(np.full(2, i, np.float32), i) for i in range(10)]), [[-1, 2], [-1]], ["float32", "int64"]
    )
    batches = list(lio.BatchReader(source, 4))
    assert [b[0].shape for b in batches] == [(4, 2), (4, 2), (2, 2)]
    assert [b[1].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert batches[0][0].dtype == np.float32 and batches[0][1].dtype == np.int64


def test_batch_drop_last_and_validation():
    assert [len(b[0]) for b in lio.BatchReader(_ints(10), 4, drop_last=True)] == [4, 4]
    assert list(lio.BatchReader(_ints(3), 4, drop_last=True)) == []
    assert list(lio.BatchReader(_ints(0), 4)) == []
    with pytest.raises(ValueError):
        lio.BatchReader(_ints(3), 0)


def test_batch_of_sequences_concatenates_and_adds_lengths():
    samples = [(np.ones((n, 3), np.float32) * n, n) for n in (2, 0, 3, 1)]
    source = lio.from_reader(ListReader(samples), [[-1, 3], [-1]], ["float32", "int64"], lod_levels=[1, 0])
    reader = lio.BatchReader(source, 3)
    assert reader.slot_names == ["slot0", "slot1", "slot0.lengths"]
    assert reader.lod_levels == [0, 0, 0] and reader.dtypes[2] == np.int64
    data, labels, lengths = reader.read_next()
    assert data.shape == (5, 3) and lengths.tolist() == [2, 0, 3] and labels.tolist() == [2, 0, 3]
    data, labels, lengths = reader.read_next()
    assert data.shape == (1, 3) and lengths.tolist() == [1]
    assert reader.read_next() == []
    with pytest.raises(ValueError, match="lod_level"):
        lio.BatchReader(lio.from_reader(ListReader([]), [[-1, 1]], ["int64"], lod_levels=[2]), 2)


def test_batch_of_mismatched_instances_names_the_slot():
    source = lio.from_reader(ListReader([np.zeros(2), np.zeros(3)]), None, None)
    with pytest.raises(ShapeMismatchError, match="slot 0"):
        lio.BatchReader(source, 2).read_next()
    source = lio.from_reader(ListReader([np.zeros(2, np.float32), np.zeros(2, np.float64)]), None, None)
    with pytest.raises(ShapeMismatchError, match="dtype"):
        lio.BatchReader(source, 2).read_next()


def test_batch_mismatch_names_the_instance_and_its_own_shape_not_a_block_of_them():
    sizes = [2, 2, 2, 3]  # the odd instance comes after a run of three that are read as one block
    source = lio.from_reader(ListReader([np.zeros(n, np.int64) for n in sizes]), [[-1, -1]], ["int64"])
    with pytest.raises(ShapeMismatchError) as info:
        lio.BatchReader(source, 4).read_next()
    message = str(info.value)
    assert "item 3 of the batch has shape (3,)" in message and "the first has shape (2,)" in message, message


@pytest.mark.parametrize(
    "decorate, lod_level",
    [
        (lambda r: lio.ShuffleReader(r, 10, seed=0), 0),
        (lambda r: lio.BatchReader(r, 5), 0),
        (lambda r: lio.BatchReader(r, 5), 1),  # sequences: instances read one by one, not in blocks
    ],
    ids=["shuffle", "batch", "batch-of-sequences"],
)
def test_instances_read_before_a_failure_below_are_not_lost(tmp_path, decorate, lod_level):
    path = tmp_path / "lines.txt"
    path.write_text("".join(("bad" if i == 7 else str(i)) + "\n" for i in range(20)))
    source = lio.create_file_reader(
        path,
        shapes=[[-1, 1]],
        dtypes=["int64"],
        lod_levels=[lod_level],
        parser=lambda line: [np.full((1, 1), int(line))],
    )
    reader = decorate(source)
    got, failures = [], 0
    while True:
        try:
            item = reader.read_next()
        except ValueError:  # the parser's, at line 8: the text reader steps past it
            failures += 1
            continue
        if not item:
            break
        got += item[0].ravel().tolist()
    assert failures == 1
    assert sorted(got) == [i for i in range(20) if i != 7]
    reader.close()


def test_batch_is_a_copy_not_a_view_of_the_file(tmp_path):
    array = np.arange(12, dtype=np.int32).reshape(6, 2)
    np.save(tmp_path / "a.npy", array)
    batch = lio.BatchReader(lio.create_file_reader(tmp_path / "a.npy"), 4).read_next()[0]
    assert batch.flags.writeable and batch.flags.owndata
    np.testing.assert_array_equal(batch, array[:4])


# -- multi pass ---------------------------------------------------------------


def test_multi_pass_repeats_and_reinit_restarts():
    reader = lio.MultiPassReader(_ints(3), 3)
    assert _values(reader) == [0, 1, 2] * 3
    assert reader.read_next() == []
    reader.reinit()
    assert len(_values(reader)) == 9


def test_multi_pass_of_an_empty_reader_ends_at_once():
    reader = lio.MultiPassReader(_ints(0), 5)
    assert reader.read_next() == [] and not reader.has_next()


def test_multi_pass_batches_count():
    reader = lio.MultiPassReader(lio.BatchReader(_ints(10), 4), 2)
    assert [len(b[0]) for b in reader] == [4, 4, 2, 4, 4, 2]


# -- double buffer ------------------------------------------------------------


class SlowReader(lio.ReaderBase):
    """``n`` items, each taking ``delay_s`` to produce; records which thread read it."""

    def __init__(self, n: int, delay_s: float = 0.0, fail_at: int | None = None) -> None:
        super().__init__()
        self.n, self.delay_s, self.fail_at = n, delay_s, fail_at
        self.i = 0
        self.threads: set[str] = set()
        self.closed_calls = 0

    @property
    def slot_names(self):
        return ["x"]

    def _read_next_impl(self):
        self.threads.add(threading.current_thread().name)
        if self.i >= self.n:
            return []
        if self.fail_at is not None and self.i == self.fail_at:
            raise Boom(f"failed at {self.i}")
        time.sleep(self.delay_s)
        self.i += 1
        return [np.array(self.i - 1)]

    def _reinit_impl(self):
        self.i = 0

    def _close_impl(self):
        self.closed_calls += 1


@pytest.mark.timeout(TIMEOUT_S)
def test_double_buffer_reads_on_another_thread(no_leaks):
    source = SlowReader(20)
    with lio.DoubleBufferReader(source) as reader:
        assert reader.slot_names == ["x"]
        assert _values(reader) == list(range(20))
        assert threading.current_thread().name not in source.threads
    assert source.closed_calls == 1


@pytest.mark.timeout(TIMEOUT_S)
def test_double_buffer_overlaps_producer_and_consumer(no_leaks):
    source = SlowReader(15)
    consumed = 0
    with lio.DoubleBufferReader(source) as reader:
        for _ in reader:
            consumed += 1
            # While the consumer still holds item k, the reader's thread reads item k+1 without
            # being asked (read serially, it would wait for the next read_next and time out here).
            assert wait_until(lambda k=consumed: source.i >= min(k + 1, 15), timeout_s=OVERLAP_TIMEOUT_S), consumed
    assert consumed == 15


@pytest.mark.timeout(TIMEOUT_S)
def test_double_buffer_error_reaches_consumer_after_earlier_items(no_leaks):
    reader = lio.DoubleBufferReader(SlowReader(10, fail_at=4))
    assert [int(reader.read_next()[0]) for _ in range(4)] == [0, 1, 2, 3]
    with pytest.raises(Boom, match="failed at 4"):
        reader.read_next()
    with pytest.raises(Boom):
        reader.read_next()  # sticky until reinit
    reader.close()


@pytest.mark.timeout(TIMEOUT_S)
def test_double_buffer_reinit_mid_pass_and_close_mid_pass(no_leaks):
    reader = lio.DoubleBufferReader(SlowReader(50, 0.001), capacity=3)
    assert reader.read_next()[0] == 0 and reader.read_next()[0] == 1
    reader.reinit()
    assert _values(reader) == list(range(50))
    reader.reinit()
    reader.read_next()
    start = time.perf_counter()
    reader.close()
    assert time.perf_counter() - start < 2.0
    with pytest.raises(ClosedError):
        reader.read_next()


def test_double_buffer_rejects_bad_arguments():
    with pytest.raises(ValueError):
        lio.DoubleBufferReader(_ints(1), capacity=0)
    with pytest.raises(ValueError):
        lio.DoubleBufferReader(_ints(1), place="tpu:7")


@pytest.mark.timeout(TIMEOUT_S)
def test_seed_004_graph_composes(tmp_path, no_leaks):
    # random [1,2]/[1,1] -> shuffle(7) -> batch(10) -> double_buffer: every read is (10,2),(10,1).
    rng = np.random.default_rng(0)
    for i in range(3):
        np.savez(tmp_path / f"p{i}.npz", x=rng.random((330, 1, 2)).astype(np.float32), y=rng.integers(0, 9, (330, 1)))
    files = [str(tmp_path / f"p{i}.npz") for i in range(3)]
    graph = lio.DoubleBufferReader(
        lio.BatchReader(
            lio.ShuffleReader(lio.open_files(files, [[-1, 2], [-1, 1]], ["float32", "int64"]), 7, seed=1), 10
        )
    )
    with graph:
        shapes = [(b[0].shape, b[1].shape) for b in graph]
    assert len(shapes) == 99 and set(shapes) == {((10, 2), (10, 1))}


# -- bridges -------------------------------------------------------------------


def test_to_reader_gives_a_fresh_pass_per_call(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(6).reshape(3, 2))
    paddle_reader = lio.to_reader(lio.create_file_reader(tmp_path / "a.npy"))
    first = [s[0].tolist() for s in paddle_reader()]
    assert first == [[0, 1], [2, 3], [4, 5]]
    assert all(isinstance(s, tuple) and len(s) == 1 for s in paddle_reader())
    assert [s[0].tolist() for s in paddle_reader()] == first


def _open_files_threads() -> int:
    return sum(t.name.startswith("loader-open-files") for t in threading.enumerate())


def test_a_to_reader_generator_abandoned_mid_pass_stops_the_prefetching_threads(tmp_path):
    for i in range(3):
        np.save(tmp_path / f"{i}.npy", np.arange(i * 40, i * 40 + 40))
    files = sorted(str(p) for p in tmp_path.glob("*.npy"))
    multi = lio.open_files(files, shapes=[[-1]], dtypes=["int64"], thread_num=2, buffer_size=1)
    paddle_reader = lio.to_reader(multi)
    try:
        first = paddle_reader()
        next(first)
        assert _open_files_threads() == 2
        first.close()  # a training loop that broke out and dropped it
        assert _open_files_threads() == 0
        # A newer generator owns the reader: dropping an older one leaves its pass alone.
        older = paddle_reader()
        next(older)
        newer = paddle_reader()
        taken = [int(next(newer)[0])]
        older.close()
        taken += [int(s[0]) for s in newer]
        assert sorted(taken) == list(range(120))
    finally:
        multi.close()
    assert _open_files_threads() == 0


def test_from_reader_converts_values_to_declared_dtypes():
    source = lio.from_reader(ListReader([([0.5, 1.5], 3), ([2.5, 3.5], 4)]), [[-1, 2], [-1]], ["float32", "int64"])
    x, y = source.read_next()
    assert x.dtype == np.float32 and y.dtype == np.int64 and y.shape == ()
    with pytest.raises(ShapeMismatchError, match="dtype float64"):
        lio.from_reader(ListReader([(np.zeros(2),)]), [[-1, 2]], ["float32"]).read_next()


def test_from_reader_dict_samples_and_errors():
    source = lio.from_reader(ListReader([{"a": 1, "b": [1, 2]}]), None, None)
    assert source.slot_names == ["a", "b"]
    assert [x.tolist() for x in source.read_next()] == [1, [1, 2]]
    failing = lio.from_reader(raise_on(2), None, None)
    assert failing.read_next()[0] == 0 and failing.read_next()[0] == 1
    with pytest.raises(Boom):
        failing.read_next()


def test_from_reader_read_on_past_a_refused_sample_names_each_later_sample_by_its_own_index():
    samples = [
        (np.zeros(2, np.int64),),
        (np.zeros(3, np.int64),),
        None,
        (np.zeros(3, np.int64),),
        (np.ones(2, np.int64),),
    ]
    source = lio.from_reader(ListReader(samples), [[-1, 2]], ["int64"])
    outcomes = []
    for _ in samples:
        try:
            outcomes.append(source.read_next()[0].tolist())
        except DataError as exc:  # ShapeMismatchError is one
            outcomes.append(str(exc).split(": ")[1].split(",")[0])
    assert outcomes == [[0, 0], "record 1", "sample 2 is None", "record 3", [1, 1]]
    assert source.read_next() == []


def test_the_toolkits_compose_both_ways():
    class Doubler:
        def __init__(self, reader):
            self.reader = reader

        def __call__(self):
            return ((s[0] * 2,) for s in self.reader())

    classy = lio.BatchReader(_ints(6), 3)
    paddle_style = Doubler(lio.to_reader(classy))  # a paddle-style decorator over a class graph
    back = lio.from_reader(paddle_style, None, None)  # and back into the class graph
    assert [b[0].tolist() for b in back] == [[0, 2, 4], [6, 8, 10]]

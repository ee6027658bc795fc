"""loader.provider: memory bounds, open files, shuffling, file lists, checks and errors."""

from __future__ import annotations

import gc
import tracemalloc

import numpy as np
import pytest

from loader.errors import DataError
from loader.provider import DEFAULT_MAX_OPEN_FILES, dense_vector, integer_value, provider
from loader.reader import multiprocess_reader
from tests.helpers import Boom
from tests.unit.provider import fixtures as fx


@pytest.fixture(autouse=True)
def _reset_counter():
    fx.COUNTER.reset()


def _files(n: int) -> list[str]:
    return [str(i) for i in range(n)]


def _ids(reader) -> list[int]:
    return [s[0] for s in reader()]


def _peak_bytes(files: list[str]) -> tuple[int, int]:
    reader = fx.one_sample_files.reader(files, is_train=True, seed=1)
    gc.collect()
    tracemalloc.start()
    try:
        count = sum(1 for _ in reader())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return count, peak


@pytest.mark.slow
def test_ten_thousand_small_files_keep_memory_flat(tmp_path):
    paths = []
    for i in range(10_000):
        path = tmp_path / f"{i}.txt"
        path.write_text(str(i))
        paths.append(str(path))
    small_count, small_peak = _peak_bytes(paths[:2_000])
    big_count, big_peak = _peak_bytes(paths)
    assert (small_count, big_count) == (2_000, 10_000)
    # The data set is 10,000 x 1 KiB; the pool (100 samples) and the open files are not.
    assert big_peak < 2 * 2**20, big_peak
    assert big_peak < small_peak * 1.5 + 256 * 2**10, (small_peak, big_peak)
    assert fx.COUNTER.open_max <= DEFAULT_MAX_OPEN_FILES
    assert fx.COUNTER.open_now == 0


def test_shuffle_reads_a_bounded_number_of_files_at_once():
    reader = fx.numbered.reader(_files(100), is_train=True, seed=4, count=20)
    ids = _ids(reader)
    assert sorted(ids) == sorted(f * 1000 + i for f in range(100) for i in range(20))
    assert fx.COUNTER.open_max == DEFAULT_MAX_OPEN_FILES
    assert fx.COUNTER.open_now == 0


def test_no_shuffle_reads_files_in_order_one_at_a_time():
    ids = _ids(fx.numbered.reader(_files(5), is_train=False))
    assert ids == [f * 1000 + i for f in range(5) for i in range(10)]
    assert fx.COUNTER.open_max == 1


def test_breaking_out_of_a_pass_closes_the_open_files():
    passes = fx.numbered.reader(_files(50), is_train=True, seed=1, count=100)()
    for _ in range(30):
        next(passes)
    assert fx.COUNTER.open_now > 0
    passes.close()
    assert fx.COUNTER.open_now == 0


def test_seeded_shuffle_is_reproducible_and_fresh_without_seed():
    files = _files(20)
    a = _ids(fx.numbered.reader(files, is_train=True, seed=9))
    b = _ids(fx.numbered.reader(files, is_train=True, seed=9))
    c = _ids(fx.numbered.reader(files, is_train=True, seed=10))
    assert a == b and a != c
    reader = fx.numbered.reader(files, is_train=True, seed=9)
    assert _ids(reader) != _ids(reader)  # pass 1 differs from pass 0
    unseeded = fx.numbered.reader(files, is_train=True)
    assert _ids(unseeded) != _ids(unseeded)
    assert sorted(a) == sorted(f * 1000 + i for f in range(20) for i in range(10))


def test_a_seeded_provider_in_a_multiprocess_reader_child_shuffles_each_pass_anew():
    files = _files(6)
    here = fx.numbered.reader(files, is_train=True, seed=9)
    expected = [_ids(here) for _ in range(3)]  # passes 0, 1, 2 in this process
    merged = multiprocess_reader([fx.numbered.reader(files, is_train=True, seed=9)])
    # Each pass forks a fresh copy of the provider's session: pass k of the merged reader is pass k.
    assert [_ids(merged) for _ in range(3)] == expected
    assert expected[0] != expected[1] != expected[2]


def test_should_shuffle_defaults_to_is_train_and_strings_are_normalised():
    assert fx.numbered.reader(["0"], is_train=True).settings.should_shuffle is True
    assert fx.numbered.reader(["0"], is_train=False).settings.should_shuffle is False
    for word, expect in [("On", True), ("t", True), ("FALSE", False), ("off", False), (0, False), (True, True)]:

        @provider(input_types=[integer_value(3)], should_shuffle=word)
        def p(settings, filename):
            yield 1

        assert p.reader(["x"], is_train=not expect).settings.should_shuffle is expect


def test_file_list_from_a_train_list_file(tmp_path):
    listing = tmp_path / "train.list"
    listing.write_text("0\n\n1\n2\n")
    reader = fx.numbered.reader(str(listing), is_train=False, count=2)
    assert reader.settings.file_list == ["0", "1", "2"]
    assert _ids(reader) == [0, 1, 1000, 1001, 2000, 2001]


def test_drop_last_and_batch_size_validation():
    batches = list(fx.numbered.batch_reader(_files(1), 4, is_train=False, drop_last=True)())
    assert [len(b["slot0"]) for b in batches] == [4, 4]
    batches = list(fx.numbered.batch_reader(_files(1), 4, is_train=False)())
    assert [len(b["slot0"]) for b in batches] == [4, 4, 2]
    with pytest.raises(ValueError, match="batch_size"):
        fx.numbered.batch_reader(_files(1), 0)


def test_check_errors_name_file_sample_and_slot():
    good = {"x": np.array([1.0, 2.0, 3.0]), "y": 4, "ids": [0, 7]}
    cases = [
        ({"x": [1.0, 2.0], "y": 1, "ids": []}, "slot 'x': expected 3 values"),
        ({"x": [1.0, 2.0, float("nan")], "y": 1, "ids": []}, "slot 'x': non-finite value at position 2"),
        ({"x": ["a", 2.0, 3.0], "y": 1, "ids": []}, "slot 'x': expected float values"),
        ({"x": [1, 2, 3], "y": 5, "ids": []}, r"slot 'y': integer 5 out of range \[0, 5\)"),
        ({"x": [1, 2, 3], "y": -1, "ids": []}, "slot 'y': integer -1 out of range"),
        ({"x": [1, 2, 3], "y": 1.0, "ids": []}, "slot 'y': expected an int"),
        ({"x": [1, 2, 3], "y": 1, "ids": [8]}, r"slot 'ids': column id 8 out of range \[0, 8\)"),
        ({"x": [1, 2, 3], "y": 1, "ids": [1, 1]}, "slot 'ids': column ids are not unique"),
        ({"x": [1, 2, 3], "y": None, "ids": []}, r"slot 'y': is missing \(None\)"),
    ]
    for bad, message in cases:
        reader = fx.checked_strict.reader(["data-7.txt"], samples=[good, good, bad])
        with pytest.raises(DataError, match=f"data-7.txt: sample 2: {message}"):
            list(reader())
    # numpy arrays (float64 too) are fine for dense slots, ints count as floats
    batch = next(fx.checked_strict.batch_reader(["f"], 2, samples=[good, dict(good, x=[1, 2, 3])])())
    assert batch["x"].dtype == np.float32 and batch["x"].tolist() == [[1, 2, 3], [1, 2, 3]]


def test_wrong_sample_shape_is_an_error_even_without_check():
    @provider(input_types=[dense_vector(2), integer_value(3)])
    def two_slots(settings, filename):
        yield [1.0, 2.0], 1
        yield [1.0, 2.0], 1, 5

    with pytest.raises(DataError, match="f: sample 1: has 3 slots, input_types has 2"):
        list(two_slots.reader(["f"])())

    @provider(input_types=[dense_vector(2)])
    def short_dense(settings, filename):
        yield [1.0, 2.0]
        yield [1.0]

    with pytest.raises(DataError, match="slot 'slot0'.*cannot build a batch"):
        list(short_dense.batch_reader(["f"], 2)())


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_sample_that_does_not_fit_its_batch_without_check_names_its_file_and_index(shuffle):
    # Without check=True the batch's error named the slot only ("slot 'x' ... inhomogeneous shape"), in a batch
    # drawn from several shuffled files: not which file, nor which sample.
    @provider(input_types={"x": dense_vector(3), "label": integer_value(10)})
    def one_bad(settings, filename):
        for i in range(5):
            bad = filename == "b" and i == 3
            yield {"x": [1.0, 2.0] if bad else [1.0, 2.0, 3.0], "label": "7" if filename == "c" else i}

    reader = one_bad.batch_reader(["a", "b"], 4, is_train=shuffle, seed=1)
    with pytest.raises(DataError, match=r"^b: sample 3: slot 'x' .*dense vectors of 3 values expected, got samples "):
        list(reader())
    with pytest.raises(DataError, match=r"^c: sample \d: slot 'label' .*ints expected, got '7' \(str\)"):
        list(one_bad.batch_reader(["a", "c"], 4, is_train=shuffle, seed=1)())

    @provider(input_types={"x": dense_vector(3)}, should_shuffle=False)
    def mixed(settings, filename):  # each sample fits alone (3 values), the two do not stack
        yield np.zeros(3)
        yield np.zeros((1, 3))

    with pytest.raises(DataError, match=r"^a batch of 2 samples of f: slot 'x'"):
        list(mixed.batch_reader(["f"], 2)())


def test_an_exception_in_process_reaches_the_caller_and_files_are_closed():
    @provider(input_types=[integer_value(10)])
    def failing(settings, filename):
        fx.COUNTER.enter()
        try:
            yield 1
            raise Boom(f"cannot parse {filename}")
        finally:
            fx.COUNTER.leave()

    with pytest.raises(Boom, match="cannot parse"):
        list(failing.reader(_files(4), is_train=True, seed=0)())
    assert fx.COUNTER.open_now == 0


def test_input_types_required_and_kwargs_may_not_clash():
    @provider()
    def untyped(settings, filename):
        yield 1

    with pytest.raises(ValueError, match="input_types must be set"):
        untyped.reader(["f"])
    with pytest.raises(ValueError, match="clash"):
        fx.numbered.reader(["f"], logger=None)


def test_a_bounded_pool_is_the_shuffle_granularity_when_min_pool_size_is_left_at_minus_one():
    # The original's min_pool_size = min(pool_size, -1 as unbounded) = pool_size: a pool of 3000 is filled to
    # 3000 before the first draw, so some of the first 100 samples out come from past the first 1000 read.
    @provider(input_types=[integer_value(10**6)], pool_size=3000)
    def counted(settings, filename):
        for i in range(5000):
            fx.COUNTER.produced += 1
            yield i

    out = []
    peak = 0
    for sample in counted.reader(["only"], is_train=True, seed=2)():
        out.append(sample[0])
        peak = max(peak, fx.COUNTER.produced - len(out))
    assert sorted(out) == list(range(5000))
    assert peak == 2999  # filled to pool_size (3000) before each draw, never beyond
    assert max(out[:100]) >= 1000

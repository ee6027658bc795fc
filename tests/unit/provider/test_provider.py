"""PyDataProvider2 (loader.provider): the upstream test_PyDataProvider2 assertions, adapted."""

from __future__ import annotations

import logging
import pickle

import numpy as np
import pytest

from loader import LoDTensor
from loader.errors import DataError
from loader.provider import (
    InputType,
    SequenceType,
    SparseBatch,
    dense_vector,
    integer_value_sub_sequence,
    iter_file_samples,
    provider,
    sparse_binary_vector,
    sparse_binary_vector_sequence,
    sparse_vector,
)
from tests.unit.provider import fixtures as fx


@pytest.fixture(autouse=True)
def _reset_counter():
    fx.COUNTER.reset()


def test_dense_no_seq_two_passes():
    batches = fx.dense_no_seq.batch_reader(["dummy"], 100, is_train=False)
    for _ in range(2):
        got = list(batches())
        assert len(got) == 2  # a third fetch would be the end of the pass
        for b, batch in enumerate(got):
            dense = batch["slot0"]
            assert dense.shape == (100, 200) and dense.dtype == np.float32
            for r in range(100):
                i = b * 100 + r
                expect = [(j - 100) * (i + 1) / 200.0 for j in range(200)]
                np.testing.assert_allclose(dense[r], expect, atol=1e-5)


def test_index_no_seq_in_order():
    (batch,) = list(fx.index_no_seq.batch_reader(["dummy"], 200, is_train=False)())
    assert batch["slot0"].dtype == np.int64
    assert batch["slot0"].tolist() == list(range(200))


def test_init_hook_gets_user_args():
    reader = fx.with_init_hook.reader(["dummy"], is_train=False, value=list(range(20)))
    assert [s[0] for s in reader()] == list(range(20))
    assert reader.settings.value == list(range(20))
    assert reader.settings.is_train is False and reader.settings.file_list == ["dummy"]


def test_init_hook_may_set_input_types():
    reader = fx.types_from_hook.reader(["dummy"], input_order=["word", "label"])
    assert reader.slot_names == ["word", "label"]
    assert list(reader()) == [([1, 2, 3], 1)]


def test_sparse_non_value_csr():
    (batch,) = list(fx.sparse_non_value.batch_reader(["dummy"], 200, is_train=False)())
    sparse = batch["slot0"]
    assert isinstance(sparse, SparseBatch) and sparse.dim == 200000 and sparse.rows == 200
    assert sparse.offsets.tolist() == list(range(0, 2001, 10))
    for i in range(200):
        cols, vals = sparse.row(i)
        assert cols.tolist() == [(i + 1) * (j + 1) for j in range(10)]
        assert vals.tolist() == [1.0] * 10


def test_sparse_value_csr():
    (batch,) = list(fx.sparse_value.batch_reader(["dummy"], 200, is_train=False)())
    sparse = batch["slot0"]
    for i in range(200):
        cols, vals = sparse.row(i)
        assert cols.tolist() == [(i + 1) * (j + 1) for j in range(10)]
        np.testing.assert_allclose(vals, [j / (i + 1) for j in range(10)], rtol=1e-6)
    assert sparse.values.dtype == np.float32 and sparse.indices.dtype == np.int64


def test_index_seq_start_positions():
    (batch,) = list(fx.index_seq.batch_reader(["dummy"], 200, is_train=False)())
    seq = batch["slot0"]
    assert isinstance(seq, LoDTensor)
    starts = seq.start_positions()[0]
    assert len(starts) == 201
    assert starts == [i * (i + 1) // 2 for i in range(201)]
    for i in range(200):
        assert seq.data[starts[i] : starts[i + 1]].tolist() == list(range(i + 1))


def test_index_sub_seq_start_positions():
    (batch,) = list(fx.index_sub_seq.batch_reader(["dummy"], 200, is_train=False)())
    sub = batch["slot0"]
    subs_per_sample = [i % 4 + 1 for i in range(200)]
    sub_lengths = [j + 1 for i in range(200) for j in range(i % 4 + 1)]
    assert sub.recursive_sequence_lengths() == [subs_per_sample, sub_lengths]
    seq_starts, sub_starts = sub.start_positions()
    assert sub_starts == np.concatenate([[0], np.cumsum(sub_lengths)]).tolist()
    timesteps = [sum(j + 1 for j in range(i % 4 + 1)) for i in range(200)]
    assert seq_starts == np.concatenate([[0], np.cumsum(timesteps)]).tolist()
    assert sub.data[:4].tolist() == [0, 0, 0, 1]


def test_min_pool_size_keeps_the_pool_filled():
    total = 2**14
    produced_before = fx.COUNTER.produced
    consumed = 0
    for batch in fx.min_pool.batch_reader(["dummy"], 100, is_train=True, seed=3)():
        consumed += len(batch["slot0"])
        held = fx.COUNTER.produced - produced_before - consumed
        # Before each draw the pool holds min(1000, what is left); one draw takes one.
        assert held >= min(999, total - consumed)
        assert held <= 1000
    assert consumed == total


def test_can_over_batch_size_false_keeps_batches_at_most_batch_size():
    seen = 0
    for batch in fx.weighted_no_over.batch_reader(["a", "b"], 100, is_train=True, seed=1)():
        seq = batch["slot0"]
        assert len(seq.data) <= 100
        seen += len(seq.recursive_sequence_lengths()[0])
    assert seen == 1000


def test_can_over_batch_size_true_lets_batches_exceed_but_stops_at_size():
    sizes = []
    for batch in fx.weighted_over.batch_reader(["a", "b"], 100, is_train=True, seed=1)():
        lengths = batch["slot0"].recursive_sequence_lengths()[0]
        sizes.append(sum(lengths))
        assert sum(lengths[:-1]) < 100  # the batch ended at the first sample reaching 100
    assert max(sizes) > 100


@pytest.mark.parametrize("order", [["input1", "input2"], ["input2", "input1"]])
def test_dict_input_order(order):
    reader = fx.dict_slots.batch_reader(["dummy"], 30, input_order=order)
    for batch in reader():
        assert list(batch) == order
        assert batch["input1"].tolist() == [0] * len(batch["input1"])
        assert batch["input2"].tolist() == [1] * len(batch["input2"])
    sample = next(iter(fx.dict_slots.reader(["dummy"], input_order=order)()))
    assert sample == ((0, 1) if order[0] == "input1" else (1, 0))


def test_check_fail_continue_drops_and_logs(caplog):
    caplog.set_level(logging.DEBUG, logger="loader.provider")
    reader = fx.checked_continue.reader(["dummy"], is_train=True, seed=5)
    ids = [s[0] for s in reader()]
    assert ids and all(i < 10 for i in ids)
    assert reader.settings.should_shuffle is True  # "123" is not understood: default for training
    assert reader.last_pass_dropped == 1000 - len(ids) > 0
    text = caplog.text
    assert "Could not recognize should_shuffle" in text
    assert f"dropped {1000 - len(ids)} sample(s)" in text


def test_cache_pass_in_mem_reads_files_once():
    reader = fx.cached.reader(["f1", "f2"], is_train=True, seed=11)
    passes = [[s[0] for s in reader()] for _ in range(10)]
    assert fx.COUNTER.calls == 2  # both files read on the first pass only
    for ids in passes:
        assert sorted(ids) == sorted(list(range(1000)) * 2)
    assert passes[1] != passes[2]  # later passes are still shuffled


def test_cache_not_kept_from_an_abandoned_pass():
    reader = fx.cached.reader(["f1"], is_train=False)
    first = reader()
    next(first)
    first.close()
    assert len([s for s in reader()]) == 1000
    assert len([s for s in reader()]) == 1000
    assert fx.COUNTER.calls == 2


def test_a_new_pass_during_a_pass_is_independent():
    reader = fx.numbered.reader([str(i) for i in range(5)], is_train=True, seed=2)
    first = reader()
    head = [next(first) for _ in range(7)]
    second = sorted(s[0] for s in reader())
    rest = list(first)
    expected = sorted(f * 1000 + i for f in range(5) for i in range(10))
    assert second == expected
    assert sorted(s[0] for s in head + rest) == expected
    assert fx.COUNTER.open_now == 0


def test_sub_sequence_sample_with_check_names_the_nesting_problem():
    @provider(input_types=[integer_value_sub_sequence(10)], check=True)
    def bad(settings, filename):
        yield [[1, 2], 3]

    with pytest.raises(DataError, match=r"dummy: sample 0: slot 'slot0': \[1\]: expected a sequence"):
        list(bad.reader(["dummy"])())


def test_input_types_helpers():
    t = integer_value_sub_sequence(7)
    assert t == InputType(7, SequenceType.SUB_SEQUENCE, 3)
    assert repr(dense_vector(3)) == "InputType(dim=3, seq_type=SequenceType.NO_SEQUENCE, type=DataType.Dense)"
    assert sparse_vector(4).type.name == "SparseValue"
    assert SequenceType.tostring(5) == "INVALID(5)"


def test_provider_pickles_by_reference():
    again = pickle.loads(pickle.dumps(fx.index_no_seq))
    assert again is fx.index_no_seq


def test_iter_file_samples_yields_checked_lists_in_file_order():
    samples = list(iter_file_samples(fx.dict_slots, "dummy", is_train=True, input_order=["input2", "input1"]))
    assert samples == [[1, 0]] * 100


def test_a_dense_slot_is_float32_through_the_service_as_in_batches():
    # A provider of Python floats gave float32 batches in process and float64 through a daemon.
    from loader.provider import integer_value

    @provider(input_types=[dense_vector(4), integer_value(3)])
    def process(settings, filename):
        for k in range(3):
            yield [0.5 * k, 1.0, 2.0, 3.0], k

    samples = list(iter_file_samples(process, "f"))
    assert [s[0].dtype for s in samples] == [np.float32] * 3 and [s[1] for s in samples] == [0, 1, 2]
    batch = next(process.batch_reader(["f"], 3, is_train=False)())
    assert np.array_equal(np.stack([s[0] for s in samples]), batch["slot0"]) and batch["slot0"].dtype == np.float32


def test_an_index_slot_refuses_what_is_not_an_int():
    # The original refused it ("Cannot cast int"); a cast to int64 made 1.7 a 1 and "7" a 7 without a word.
    from loader.provider import integer_value

    for bad in (1.7, "7"):

        @provider(input_types=[dense_vector(2), integer_value(10)])
        def process(settings, filename, bad=bad):
            yield [0.0, 0.0], 1
            yield [0.0, 0.0], bad

        with pytest.raises(DataError, match=rf"slot 'slot1' .*ints expected, got {bad!r}"):
            list(process.batch_reader(["f"], 2, is_train=False)())


def test_an_error_in_process_names_the_file_and_the_sample_it_was_making():
    @provider(input_types=[dense_vector(2)])
    def process(settings, filename):
        yield [0.0, 0.0]
        int("x")  # a bad line of the user's file

    with pytest.raises(ValueError, match="invalid literal") as info:
        list(process.batch_reader(["train-00017.txt"], 8, is_train=False)())
    assert "(in process(settings, 'train-00017.txt'), making sample 1)" in info.value.__notes__


def test_a_process_that_returns_no_samples_is_named_with_its_file():
    @provider(input_types=[dense_vector(2)])
    def forgot_to_yield(settings, filename):
        return None

    with pytest.raises(TypeError) as info:
        list(forgot_to_yield.reader(["part-3.txt"])())
    text = str(info.value)
    assert "forgot_to_yield" in text and "'part-3.txt'" in text and "NoneType" in text and "\n" not in text


def test_an_error_in_calc_batch_size_names_the_file_and_sample():
    @provider(input_types=[dense_vector(2)], calc_batch_size=lambda sample: sample[3])
    def weighed(settings, filename):
        yield [1.0, 2.0]

    with pytest.raises(IndexError) as info:
        list(weighed.batch_reader(["part-5.txt"], 4)())
    assert any(
        "calc_batch_size" in note and "sample 0" in note and "'part-5.txt'" in note for note in info.value.__notes__
    )


@pytest.mark.parametrize(
    "input_type, sample, words",
    [
        (sparse_binary_vector(5), [1, 7], ["column id 7", "[0, 5)"]),
        (sparse_binary_vector(5), [-1], ["column id -1", "[0, 5)"]),
        (sparse_vector(5), [(1.7, 0.5)], ["must be ints", "1.7"]),
        (sparse_binary_vector(5), ["2"], ["must be ints", "'2'"]),
        (sparse_binary_vector_sequence(5), [[0], [9]], ["column id 9"]),
    ],
)
def test_sparse_column_ids_are_ints_in_range_even_without_check(input_type, sample, words):
    @provider(input_types=[input_type])
    def unchecked(settings, filename):
        yield sample

    with pytest.raises(DataError) as info:
        list(unchecked.batch_reader(["f"], 2)())
    assert "slot0" in str(info.value) and all(word in str(info.value) for word in words)

"""``RecordGenerators`` gives exactly ``default_rng((seed, epoch, file_key, record))``: state, draws, spawns."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import workers.sample_rng as sample_rng
from workers.sample_rng import BLOCK_RECORDS, RecordGenerators, pcg64_states

keys = st.tuples(st.integers(0, 2**80), st.integers(0, 2**33), st.one_of(st.integers(0, 300), st.integers(0, 2**64)))


@settings(max_examples=60, deadline=None)
@given(key=keys, records=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=20))
def test_states_equal_seed_sequences(key: tuple[int, int, int], records: list[int]) -> None:
    got = pcg64_states(key, np.array(records, np.int64))
    want = np.stack([np.random.SeedSequence((*key, r)).generate_state(4, np.uint64) for r in records])
    assert got.dtype == np.uint64
    np.testing.assert_array_equal(got, want)


@settings(max_examples=40, deadline=None)
@given(key=keys, record=st.one_of(st.integers(0, 3 * BLOCK_RECORDS), st.integers(0, 2**34)))
def test_a_records_generator_draws_what_default_rng_draws(key: tuple[int, int, int], record: int) -> None:
    ours = RecordGenerators(key).generator(record)
    theirs = np.random.default_rng((*key, record))
    assert ours.bit_generator.state == theirs.bit_generator.state
    np.testing.assert_array_equal(ours.integers(0, 2**62, 8), theirs.integers(0, 2**62, 8))
    assert ours.random() == theirs.random()
    assert ours.standard_normal(3).tolist() == theirs.standard_normal(3).tolist()


def test_records_in_any_order_across_blocks_match() -> None:
    generators = RecordGenerators((5, 2, 9))
    for record in [0, BLOCK_RECORDS - 1, BLOCK_RECORDS, 3, 10 * BLOCK_RECORDS + 7, 1, 2**32 - 1, 2**32, 2**40]:
        assert generators.generator(record).integers(2**62) == np.random.default_rng((5, 2, 9, record)).integers(2**62)


def test_spawned_children_and_seed_sequence_fields_are_default_rngs() -> None:
    ours = RecordGenerators((1, 2, 3)).generator(17)
    theirs = np.random.default_rng((1, 2, 3, 17))
    for n in (2, 1, 3):  # the count of children spawned carries on between calls
        assert [g.random() for g in ours.spawn(n)] == [g.random() for g in theirs.spawn(n)]
    seq, want = ours.bit_generator.seed_seq, theirs.bit_generator.seed_seq
    assert (seq.entropy, seq.spawn_key, seq.pool_size, seq.n_children_spawned) == (
        want.entropy,
        tuple(want.spawn_key),
        want.pool_size,
        want.n_children_spawned,
    )
    assert seq.generate_state(3).tolist() == want.generate_state(3).tolist()


def test_a_generator_pickles_and_copies_with_its_state() -> None:
    ours = RecordGenerators((1, 2, 3)).generator(5)
    ours.random()
    for clone in (pickle.loads(pickle.dumps(ours)), copy.deepcopy(ours)):
        assert clone.random() == copy.deepcopy(ours).random()


def test_negative_keys_and_a_numpy_that_hashes_differently_fall_back_to_default_rng(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ValueError):  # what default_rng says of a negative seed, not a wrong generator
        RecordGenerators((-1, 0, 0)).generator(0)
    monkeypatch.setattr(sample_rng, "_shortcut_ok", None)
    monkeypatch.setattr(sample_rng, "_INIT_B", sample_rng._INIT_B + 1)  # as if numpy's hash had changed
    generators = RecordGenerators((4, 0, 1))
    assert not generators._fast
    assert generators.generator(9).random() == np.random.default_rng((4, 0, 1, 9)).random()

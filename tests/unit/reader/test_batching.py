"""loader.batch: a reader of samples -> a reader of lists of samples."""

from __future__ import annotations

import importlib

import pytest

import loader
from tests.helpers import Boom, ListReader, RangeReader, raise_on


def test_exported_lazily():
    assert loader.batch is importlib.import_module("loader.reader.batching").batch


def test_batches_and_tail():
    assert list(loader.batch(RangeReader(7), 3)()) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(loader.batch(RangeReader(7), 3, drop_last=True)()) == [[0, 1, 2], [3, 4, 5]]
    assert list(loader.batch(RangeReader(6), 3, drop_last=True)()) == [[0, 1, 2], [3, 4, 5]]
    assert list(loader.batch(ListReader([]), 3)()) == []


@pytest.mark.parametrize("drop_last, keeps_tail", [(False, True), (0, True), (None, True), (True, False), (1, False)])
def test_drop_last_truthiness(drop_last, keeps_tail):
    out = list(loader.batch(RangeReader(5), 2, drop_last=drop_last)())
    assert out[-1] == ([4] if keeps_tail else [2, 3])


@pytest.mark.parametrize("size, expected", [(2.9, 2), ("3", 3), (True, 1)])
def test_batch_size_goes_through_int(size, expected):
    first = next(iter(loader.batch(RangeReader(10), size)()))
    assert len(first) == expected


@pytest.mark.parametrize("size", [0, -1, 0.5])
def test_bad_batch_size_raises_when_made(size):
    with pytest.raises(ValueError, match="batch_size should be a positive integer value"):
        loader.batch(RangeReader(3), size)


def test_non_numeric_batch_size():
    # The types int() raises, with a message naming batch_size (int()'s own named no argument).
    with pytest.raises(ValueError, match=r"positive integer value, but got batch_size='many'$"):
        loader.batch(RangeReader(3), "many")
    with pytest.raises(TypeError, match=r"positive integer value, but got batch_size=None$"):
        loader.batch(RangeReader(3), None)


def test_samples_not_copied_and_source_errors_propagate():
    sample = {"x": [1]}
    (only,) = list(loader.batch(ListReader([sample]), 4)())
    assert only[0] is sample
    with pytest.raises(Boom):
        list(loader.batch(raise_on(5), 2)())


def test_lazy_and_reiterable():
    r = loader.batch(RangeReader(4), 2)
    assert list(r()) == list(r()) == [[0, 1], [2, 3]]

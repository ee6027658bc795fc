"""Columnar blocks: concatenation, and the view it takes instead when the parts are adjacent."""

from __future__ import annotations

import numpy as np
import pytest

from loader.service.blocks import concat


def _joined(parts):
    return concat([{"x": p} for p in parts])["x"]


def test_adjacent_slices_of_one_array_join_without_a_copy():
    a = np.arange(60, dtype=np.float32).reshape(20, 3)
    joined = _joined([a[0:4], a[4:8], a[8:20]])
    assert np.shares_memory(joined, a) and np.array_equal(joined, a)
    frames = np.frombuffer(bytes(range(64)), dtype=np.uint8).reshape(16, 4)  # what a received frame is
    joined = _joined([frames[2:5], frames[5:9]])
    assert np.shares_memory(joined, frames) and np.array_equal(joined, frames[2:9])
    assert not joined.flags.writeable, "a view of read-only frames stays read-only"


@pytest.mark.parametrize(
    "case",
    ["another array", "a gap", "reversed", "other row shape", "other dtype", "strided", "object"],
)
def test_anything_else_is_copied_into_a_new_array(case):
    a = np.arange(40, dtype=np.int64).reshape(20, 2)
    b = a.copy()
    parts = {
        "another array": [a[0:4], b[4:8]],
        "a gap": [a[0:4], a[5:8]],
        "reversed": [a[4:8], a[0:4]],
        "other row shape": [a[0:4], a.reshape(40, 1)[8:16]],
        "other dtype": [a[0:4], a[4:8].view(np.float64)],
        "strided": [a[0:8:2], a[8:16:2]],
        "object": [np.array([None, 1], dtype=object), np.array([2, None], dtype=object)],
    }[case]
    if case in ("other row shape",):
        with pytest.raises(ValueError):  # numpy refuses rows of another shape, as before
            _joined(parts)
        return
    joined = _joined(parts)
    assert not np.shares_memory(joined, a)
    assert joined.tolist() == [row for p in parts for row in p.tolist()]

"""``SampleCheck``: samples that would reach the training loop wrong are refused with their own record."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest

from loader.config import LoaderConfig
from loader.errors import DataError, ShapeMismatchError
from loader.service import protocol as P
from tests.unit.workers.file_jobs import run_file_job
from workers.columns import sample_parts
from workers.sample_check import SampleCheck, unsendable

HERE = "tests.unit.workers.test_sample_check"


def test_a_sample_of_none_is_refused_in_either_batch_format() -> None:
    for stacked in (True, False):
        with pytest.raises(DataError, match="the sample is None"):
            SampleCheck(["data", "label"], stacked)(None)


def test_stacked_batches_refuse_a_row_of_another_shape_or_dtype_and_list_batches_take_it() -> None:
    check = SampleCheck(["data", "label"], stacked=True)
    check((np.zeros((28, 28), np.float32), 1))
    check((np.ones((28, 28), np.float32), 2))
    with pytest.raises(
        ShapeMismatchError, match=r"field 'data' has shape \(5, 28\) and dtype float32, but .*\(28, 28\)"
    ):
        check((np.zeros((5, 28), np.float32), 3))
    with pytest.raises(ShapeMismatchError, match="dtype float64"):
        check((np.zeros((28, 28), np.float64), 3))
    listed = SampleCheck(["data", "label"], stacked=False)
    for rows in (28, 5, 17):
        listed((np.zeros((rows, 28), np.float32), 1))


def test_what_numpy_stacks_by_its_own_rules_is_left_to_it() -> None:
    check = SampleCheck(None, stacked=True)
    for value in (1, 2.5, True, "a", "a longer string", b"x"):
        check((value, np.int64(1)))  # Python numbers and strings: a column takes what they stack to
    with pytest.raises(ShapeMismatchError):
        check((0, np.int32(1)))  # numpy scalars keep their dtype


def test_restart_forgets_the_first_sample_for_the_next_file_of_a_group() -> None:
    check = SampleCheck(["x"], stacked=True)
    check((np.zeros(3),))
    check.restart(["x"])
    check((np.zeros(4),))  # another file: the daemon compares files (daemon/fit.py)
    with pytest.raises(ShapeMismatchError):
        check((np.zeros(3),))


def test_a_mapper_that_adds_or_drops_a_field_keeps_the_readers_names_where_they_are() -> None:
    assert sample_parts((1, 2, 3), ["data", "label"])[1] == ["data", "label", "2"]
    assert sample_parts((1,), ["data", "label"])[1] == ["data"]
    assert sample_parts((1, 2, 3), ["data", "2"])[1] == ["0", "1", "2"], "never a name twice"
    assert sample_parts({"a": 1}, ["data"])[1] == ["a"]


def ragged_at_3(sample: Any) -> Any:
    (value,) = sample
    return (np.zeros(5 if value == 3 else 4, np.float32), np.int64(value))


def nothing(sample: Any) -> Any:
    return None


def a_set_at_3(sample: Any) -> Any:
    (value,) = sample
    return (np.float32(value), {1, 2} if value == 3 else 7)


def a_huge_int_at_3(sample: Any) -> Any:
    (value,) = sample
    return (np.float32(value), 2**70 if value == 3 else 7)


def a_field_more_at_3(sample: Any) -> Any:
    (value,) = sample
    out = {"x": np.float32(value), "y": np.int64(value)}
    if value == 3:
        out["mask"] = np.zeros(2, np.uint8)
    return out


def empty_at_3(sample: Any) -> Any:
    (value,) = sample
    return {} if value == 3 else {"x": np.float32(value)}


def zero_width_at_3(sample: Any) -> Any:
    (value,) = sample
    return (np.zeros(2, "V0") if value == 3 else np.zeros(2, np.float32),)


def records_at_3(sample: Any) -> Any:
    (value,) = sample
    if value == 3:
        return (np.zeros(2, np.dtype([("a", "<f4"), ("b", "<i4")])),)
    return (np.zeros(2, np.float32),)


@pytest.mark.parametrize(
    ("mapper", "kind", "text", "bad"),
    [
        ("ragged_at_3", "ShapeMismatchError", "has shape (5,) and dtype float32", 3),
        ("nothing", "DataError", "the sample is None", 0),
        # Values a message cannot carry: before, the encoder's TypeError ended the worker process, every time.
        ("a_set_at_3", "UnsendableSampleError", "field '1' holds a builtins.set, which cannot be sent", 3),
        ("a_huge_int_at_3", "UnsendableSampleError", "does not fit in 64 bits", 3),
        # Before, the next record was blamed (its fields differed from the chunk's) and the odd one was sent.
        ("a_field_more_at_3", "DataError", "the sample's fields are ['x', 'y', 'mask'] (a dict)", 3),
        ("empty_at_3", "DataError", "the sample has no fields", 3),
        ("records_at_3", "UnsendableSampleError", "structured dtype", 3),
        # The daemon drops a zero-width frame as malformed: the file failed as "a chunk was lost on the way".
        ("zero_width_at_3", "UnsendableSampleError", "field 'data' has the zero-width dtype |V0", 3),
    ],
)
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_the_file_job_names_the_record(
    tmp_path: Any, mapper: str, kind: str, text: str, bad: int, on_error: str
) -> None:
    path = str(tmp_path / "values.npy")
    np.save(path, np.arange(8, dtype=np.int64))
    config = LoaderConfig.from_dict(
        {
            "source": {"files": [path]},
            "pipeline": {"batch_size": 2, "mappers": [f"{HERE}:{mapper}"], "on_error": on_error},
            "workers": {"shm_arena_mib": 0},
        }
    )
    messages = [
        P.decode(frames) for frames in run_file_job(P.Lease(lease=1, stream=1, epoch=0, file=0, path=path), config)
    ]
    last = messages[-1][0]
    if on_error == "raise":
        assert isinstance(last, P.FileError)
        assert (last.error["type"], last.error["record"]) == (kind, bad) and text in last.error["message"]
    else:
        assert isinstance(last, P.FileDone)
        expected_skipped = 8 if mapper == "nothing" else 1
        assert (last.sent, last.skipped) == (8 - expected_skipped, expected_skipped)
        for _, columns in messages[:-1]:
            assert all(not np.asarray(values).dtype.hasobject for values in columns.values()), "nothing ragged sent"


def test_a_python_number_and_an_array_in_one_field_are_refused_in_stacked_batches() -> None:
    # Before, the batch holding both had a list for that field, the next batch an array.
    check = SampleCheck(["x"], stacked=True)
    check((1.5,))
    with pytest.raises(ShapeMismatchError, match=r"field 'x' has shape \(3,\) .* are Python numbers"):
        check((np.zeros(3, np.float32),))
    check = SampleCheck(["x"], stacked=True)
    check((np.zeros(3, np.float32),))
    with pytest.raises(ShapeMismatchError, match=r"field 'x' is a Python number, but the samples before it have"):
        check((2,))
    check((np.ones(3, np.float32),))
    SampleCheck(["x"], stacked=False)((1.5,))  # a list batch takes any mix


def test_an_empty_numpy_string_is_named_as_such() -> None:
    # np.str_("") from a reader is dtype <U0: "write it with a dtype of one byte or more" sent the user the wrong way.
    assert (
        unsendable(np.str_(""))
        == "is an empty numpy string (dtype <U0, no bytes): give str(value), or an array of a width"
    )
    assert "zero-width dtype |V0" in (unsendable(np.zeros(2, "V0")) or "")


def test_unsendable_walks_containers_and_names_what_it_found() -> None:
    from workers.sample_check import unsendable

    assert unsendable([np.zeros(3), {"a": (1, b"x", None, 2.5, "s")}, 2**64 - 1, -(2**63)]) is None
    assert "builtins.frozenset" in unsendable([1, {"k": [frozenset()]}])
    assert "64 bits" in unsendable({"k": -(2**63) - 1})
    assert "dtype object" in unsendable(np.array([None, 1], dtype=object))
    assert "nests" in unsendable(functools.reduce(lambda inner, _: [inner], range(40), []))


def test_dict_samples_with_their_keys_in_another_order_are_taken_by_key() -> None:
    check = SampleCheck(None, stacked=True)
    check({"x": np.zeros(3, np.float32), "y": np.int64(1)})
    check({"y": np.int64(2), "x": np.ones(3, np.float32)})  # the same fields: fine, and compared by name
    with pytest.raises(ShapeMismatchError, match="field 'x'"):
        check({"y": np.int64(2), "x": np.ones(4, np.float32)})


def test_a_chunk_takes_dict_samples_by_key() -> None:
    from workers.columns import ChunkBuilder

    builder = ChunkBuilder(None, 100)
    builder.add(0, {"label": np.int64(1), "weight": np.int64(100)})
    assert builder.fits({"weight": np.int64(200), "label": np.int64(2)})
    builder.add(1, {"weight": np.int64(200), "label": np.int64(2)})
    columns, _ = builder.take()
    assert columns["label"].tolist() == [1, 2] and columns["weight"].tolist() == [100, 200]


def test_a_tensor_in_a_sample_is_refused_with_the_fix() -> None:
    from workers.sample_check import unsendable

    class Tensor:  # what torch.Tensor has that the check looks at, without importing torch
        device = "cpu"

        def numpy(self) -> np.ndarray:
            return np.zeros(1)

    reason = unsendable([Tensor()])
    assert reason is not None and "return numpy arrays (tensor.numpy())" in reason

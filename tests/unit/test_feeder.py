"""loader.DataFeeder / Field / LoDTensor: the upstream test_data_feeder assertions and full shape checks."""

from __future__ import annotations

import numpy as np
import pytest

import loader
from loader import DataFeeder, Field, LoDTensor
from loader.errors import DataError, ShapeMismatchError


def _mnist_feeder() -> DataFeeder:
    return DataFeeder([Field("image", [-1, 1, 28, 28]), Field("label", [-1, 1], "int64")], place="cpu")


def test_lazy_exports():
    assert loader.DataFeeder is DataFeeder and loader.Field is Field and loader.LoDTensor is LoDTensor


def test_lod_level_0_flat_samples_are_reshaped_per_sample():
    out = _mnist_feeder().feed([([0] * 784, [9]), ([1] * 784, [1])])
    assert out["image"].shape == (2, 1, 28, 28) and out["image"].dtype == np.float32
    assert out["label"].shape == (2, 1) and out["label"].dtype == np.int64
    assert np.asarray(out["label"]).tolist() == [[9], [1]]
    assert out["image"][1].min() == 1


def test_scalar_labels_and_numpy_samples():
    out = _mnist_feeder().feed([(np.zeros((1, 28, 28)), 3), (np.ones(784, dtype=np.float64), np.int64(4))])
    assert out["image"].shape == (2, 1, 28, 28) and out["image"].dtype == np.float32
    assert np.asarray(out["label"]).tolist() == [[3], [4]]


def test_a_wrong_size_names_field_expected_and_received_shape():
    feeder = _mnist_feeder()
    with pytest.raises(
        ValueError, match=r"field 'image': expected shape \(1, 28, 28\).*received shape \(783,\).*sample 1"
    ):
        feeder.feed([([0] * 784, [9]), ([1] * 783, [1])])
    with pytest.raises(ShapeMismatchError):
        feeder.feed([([0] * 783, [9]), ([1] * 783, [1])])


@pytest.mark.parametrize(
    ("dtype", "value", "says"),
    [("int64", 2**64, "too large"), ("uint8", 256, "out of bounds"), ("uint8", -1, "out of bounds")],
)
def test_an_integer_out_of_its_dtypes_range_names_the_field_and_sample(dtype, value, says):
    feeder = DataFeeder([Field("x", [-1, 2]), Field("y", [-1, 1], dtype)])
    with pytest.raises(DataError, match=rf"field 'y': sample 1 cannot be converted to {dtype} .*{says}"):
        feeder.feed([([0.0, 1.0], [1]), ([0.0, 1.0], [value])])


def test_a_none_is_named_not_turned_into_nan():
    feeder = DataFeeder([Field("x", [-1, 3]), Field("s", [-1], "float32")])
    for batch, where, what in [
        ([([1, 2, 3], 1.0), (None, 2.0)], "'x': sample 1", "is None"),
        ([([1, 2, 3], 1.0), ([1, None, 3], 2.0)], "'x': sample 1", "holds a None"),
        ([([1, 2, 3], 1.0), ([1, 2, 3], None)], "'s': sample 1", "is None"),
        ([(np.array([1, None, 3], dtype=object), 1.0)], "'x': sample 0", "holds a None"),
    ]:
        with pytest.raises(DataError, match=rf"field {where} {what}, which float32 would hold as NaN"):
            feeder.feed(batch)
    out = feeder.feed([([1, float("nan"), 3], float("nan"))])  # the data's own NaNs stay
    assert np.isnan(out["x"][0, 1]) and np.isnan(out["s"][0])
    from loader.fields import FieldConverter

    column = np.empty(2, dtype=object)  # a column given as one object array: astype made its None a NaN
    column[0], column[1] = np.array([1.0, 2.0, 3.0]), np.array([1.0, None, 3.0], dtype=object)
    with pytest.raises(DataError, match=r"field 'x': sample 1 holds a None"):
        FieldConverter(Field("x", [-1, 3]))(column)
    sequences = DataFeeder([Field("q", [-1, 1], lod_level=1)])
    with pytest.raises(DataError, match=r"field 'q': element 2 of the flattened data \(sample 1\) holds a None"):
        sequences.feed([([[1.0], [2.0]],), ([np.array([None], dtype=object)],)])
    with pytest.raises(DataError, match=r"field 'f': a value is None, which float32 would hold as NaN"):
        DataFeeder([Field("f", [-1, 2], flatten=True)]).feed([([1.0, None],)])


def test_same_rank_mismatch_is_an_error_unlike_the_original():
    feeder = DataFeeder([Field("x", [-1, 3])])
    with pytest.raises(ShapeMismatchError, match=r"field 'x': expected shape \(3,\).*received shape \(2,\)"):
        feeder.feed([([1, 2],), ([3, 4],)])


def test_wrong_number_of_fields_names_both_counts():
    with pytest.raises(ValueError, match=r"sample 1 \(1\) does not match the number of fields of the feeder \(2"):
        _mnist_feeder().feed([([0] * 784, [9]), ([0] * 784,)])


def test_a_feed_list_that_is_not_a_list_is_refused_in_one_line():
    # DataFeeder(field) failed with "'Field' object is not iterable"; DataFeeder("image") looked up the
    # fields 'i', 'm', 'a', ... one letter each.
    image = Field("image", [-1, 2])
    with pytest.raises(TypeError, match=r"feed_list must be a list.*got a Field \('image'\).*\[image\]"):
        DataFeeder(image)
    with pytest.raises(TypeError, match=r"feed_list must be a list.*got a str \('image'\).*\['image'\]"):
        DataFeeder("image")
    assert DataFeeder((image,)).feed_names == ["image"]  # a tuple is a list here
    assert DataFeeder(f for f in [image]).feed_names == ["image"]  # and so is any other iterable


def test_a_dict_sample_is_refused_not_read_by_its_keys():
    # A dict sample of the right length was fed its keys: "could not convert string to float: 'image'", or,
    # for keys that convert, silently wrong data.
    feeder = DataFeeder([Field("a", [-1, 1], "int64"), Field("b", [-1, 1], "int64")])
    with pytest.raises(ValueError, match=r"sample 0 is a dict.*a tuple of its fields in feed_list order \['a', 'b'\]"):
        feeder.feed([{1: 5, 2: 6}])


def test_one_sample_given_as_the_mini_batch_says_feed_takes_a_list_of_samples():
    feeder = _mnist_feeder()
    with pytest.raises(ValueError, match=r"feed takes a mini-batch, a list of samples: \[sample\] for one"):
        feeder.feed(([0] * 784, 9))
    with pytest.raises(ValueError, match=r"feed takes a mini-batch, a list of samples: \[sample\] for one"):
        feeder.feed((np.zeros(784), 9))


def test_lod_level_1():
    out = DataFeeder([Field("words", [-1, 1], "int64", lod_level=1)]).feed([([1, 2, 3],), ([4, 5],), ([6, 7, 8, 9],)])
    tensor = out["words"]
    assert isinstance(tensor, LoDTensor)
    assert tensor.data.shape == (9, 1) and tensor.shape == (9, 1)
    assert tensor.recursive_sequence_lengths() == [[3, 2, 4]]
    assert tensor.lod() == [[0, 3, 5, 9]]
    assert np.asarray(tensor).ravel().tolist() == list(range(1, 10))
    assert tensor.has_valid_recursive_sequence_lengths()


def test_lod_level_2():
    out = DataFeeder([Field("para", [-1, 1], "int64", lod_level=2)]).feed([([[1, 2, 3], [4, 5]],), ([[6, 7, 8, 9]],)])
    tensor = out["para"]
    assert tensor.data.shape == (9, 1)
    assert tensor.recursive_sequence_lengths() == [[2, 1], [3, 2, 4]]
    assert tensor.lod() == [[0, 2, 3], [0, 3, 5, 9]]
    assert tensor.start_positions() == [[0, 5, 9], [0, 3, 5, 9]]


def test_lod_numpy_sequences_and_element_shape_errors():
    feeder = DataFeeder([Field("emb", [-1, 4], lod_level=1)])
    out = feeder.feed([(np.ones((3, 4)),), (np.zeros((2, 4)),)])
    assert out["emb"].data.shape == (5, 4) and out["emb"].recursive_sequence_lengths() == [[3, 2]]
    with pytest.raises(ShapeMismatchError, match=r"field 'emb'.*received shape \(3,\).*element 4 .*sample 1"):
        feeder.feed([([[1, 2, 3, 4]] * 3,), ([[1, 2, 3, 4], [1, 2, 3]],)])
    with pytest.raises(ShapeMismatchError, match="should be a sequence nested"):
        feeder.feed([(5,)])


def test_free_dimensions_and_casting():
    feeder = DataFeeder([Field("x", [-1, -1, 2], "int32")])
    out = feeder.feed([([[1.9, 2], [3, 4], [5, 6]],), ([[0, 0], [0, 0], [0, 0]],)])
    assert out["x"].shape == (2, 3, 2) and out["x"].dtype == np.int32
    assert out["x"][0, 0, 0] == 1  # float to int truncates, as numpy (and the original) do
    out = feeder.feed([(list(range(6)),)])  # flat, one free dim: reshaped to (3, 2)
    assert out["x"].shape == (1, 3, 2)
    with pytest.raises(ShapeMismatchError):
        feeder.feed([([[1, 2]] * 3,), ([[1, 2]] * 2,)])
    with pytest.raises(DataError, match="cannot be converted"):
        DataFeeder([Field("y", [-1, 1])]).feed([(["a"],)])


def test_empty_minibatch_and_shape_without_batch_dim():
    out = _mnist_feeder().feed([])
    assert out["image"].shape == (0, 1, 28, 28) and out["label"].shape == (0, 1)
    out = DataFeeder([Field("image", [1, 28, 28])]).feed([([0] * 784,)])
    assert out["image"].shape == (1, 1, 28, 28)


def test_field_validation():
    with pytest.raises(ValueError, match="not numeric"):
        Field("s", [-1], "U4")
    with pytest.raises(ValueError, match="lod_level"):
        Field("s", [-1], lod_level=-1)
    with pytest.raises(TypeError, match="Field"):
        DataFeeder([3])
    with pytest.raises(ValueError, match="no Field of that name"):
        DataFeeder(["surely-never-declared"])
    with pytest.raises(ValueError, match="unique"):
        DataFeeder([Field("a", [-1]), Field("a", [-1])])
    assert Field("a", [None, 2]).shape == (-1, 2)


def test_feed_parallel_validates_eagerly():
    feeder = _mnist_feeder()
    batches = [[([i] * 784, [i])] for i in range(3)]
    outs = feeder.feed_parallel(batches, num_places=3)
    assert isinstance(outs, list) and [o["label"].numpy().tolist() for o in outs] == [[[0]], [[1]], [[2]]]
    with pytest.raises(ValueError, match="got 2 mini-batches for 3 places"):
        feeder.feed_parallel(iter(batches[:2]), num_places=3)
    with pytest.raises(ValueError, match="num_places"):
        feeder.feed_parallel(batches, num_places=0)


def test_feed_parallel_default_places_from_cpu_num(monkeypatch):
    monkeypatch.setenv("CPU_NUM", "2")
    outs = _mnist_feeder().feed_parallel([[([0] * 784, [0])]] * 2)
    assert len(outs) == 2


def test_without_cpu_num_there_is_one_cpu_place_as_in_paddle(monkeypatch, caplog):
    monkeypatch.delenv("CPU_NUM", raising=False)
    monkeypatch.setattr("loader.feeder._CPU_NUM_WARNED", False)
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    feeder = _mnist_feeder()

    def three_batches():
        for i in range(3):
            yield [([i] * 784, [i])]

    with caplog.at_level("WARNING", logger="loader.feeder"):
        groups = list(feeder.decorate_reader(three_batches, multi_devices=True)())
        assert len(feeder.feed_parallel([[([0] * 784, [0])]])) == 1
    assert [len(g) for g in groups] == [1, 1, 1]  # every batch fed (4 places dropped them all)
    (warning,) = [r.getMessage() for r in caplog.records]  # once a process
    assert warning.startswith("CPU_NUM is not set: feeding one CPU place, as Paddle does"), warning


def test_decorate_reader_single_and_multi_devices():
    feeder = _mnist_feeder()

    def batches():
        for i in range(5):
            yield [([i] * 784, [i]), ([i] * 784, [i])]

    single = list(feeder.decorate_reader(batches, multi_devices=False)())
    assert len(single) == 5 and single[4]["label"].numpy().tolist() == [[4], [4]]
    grouped = list(feeder.decorate_reader(batches, multi_devices=True, num_places=2)())
    assert len(grouped) == 2 and [len(g) for g in grouped] == [2, 2]
    assert grouped[1][1]["label"].numpy().tolist() == [[3], [3]]
    strict = feeder.decorate_reader(batches, multi_devices=True, num_places=2, drop_last=False)
    seen = []
    with pytest.raises(ValueError, match="left over"):
        for group in strict():
            seen.append(group)
    assert len(seen) == 2  # the full groups came first
    with pytest.raises(ValueError, match="num_places"):
        feeder.decorate_reader(batches, multi_devices=True, num_places=-1)


def test_a_large_batch_feeds_into_one_contiguous_array_per_slot():
    # Speed is the benchmark's business (never a timed unit test); here, that the batch is stacked once.
    feeder = DataFeeder([Field("x", [-1, 784]), Field("y", [-1, 1], "int64")])
    batch = [(np.random.rand(784).astype(np.float32), i % 10) for i in range(512)]
    out = feeder.feed(batch)
    x, y = np.asarray(out["x"]), np.asarray(out["y"])
    assert x.shape == (512, 784) and x.dtype == np.float32 and x.flags.c_contiguous
    np.testing.assert_array_equal(x, np.stack([s[0] for s in batch]))
    assert y.reshape(-1).tolist() == [i % 10 for i in range(512)]


@pytest.mark.parametrize("dtype", ["bfloat16", "BF16", "bf16"])
def test_a_bfloat16_field_says_what_to_do_instead(dtype):
    # Paddle's VarType.BF16 / paddle.bfloat16: "unknown dtype 'BF16'" said nothing of why or what instead.
    with pytest.raises(
        ValueError, match=r"Field 'x': dtype bfloat16 has no numpy form to feed: declare the field float32"
    ):
        Field("x", (2,), dtype)

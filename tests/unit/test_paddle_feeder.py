"""Fluid's and Paddle 3's DataFeeder tests, run against loader through the ``paddle`` alias.

The assertions are upstream's (test_data_feeder.py of paddle.fluid, and of paddle.base with
``program_guard``), unchanged; then fluid's other ways of building a feeder: ``program=``,
names in ``feed_list``, fluid places, LoDTensor methods, and the one-step way to plain arrays.

Paddle 3's file has a fourth case, ``test_errors``, left out here for two reasons. It needs
Paddle's new IR: it builds its variables under ``paddle.pir_utils.IrGuard()``, which the alias
does not provide (this package has no graph). And it asserts the opposite of a choice made here
on purpose: it expects ``DataFeeder(['image', label], ...)`` to raise ``ValueError`` because
Paddle 3 in PIR mode could not look a name up, while this package accepts names in ``feed_list``
and resolves them (through ``program=`` or the declared ``Field``s) as fluid and inference code
need; ``test_program_keyword_and_names_resolved_through_the_program`` checks that.
"""

from __future__ import annotations

import importlib
import unittest

import numpy as np
import pytest

import loader
from loader import DataFeeder, Field, LoDTensor
from tests import paddle_shim


@pytest.fixture
def paddle(monkeypatch):
    return paddle_shim.install(monkeypatch)


# --- fluid's test_data_feeder.py (fluid.layers.data: the batch dimension is prepended) ---------------------


class FluidDataFeederCases(unittest.TestCase):
    """Upstream's three cases with upstream's assertions; ``fluid`` is the alias's ``paddle.fluid``."""

    __test__ = False  # run by the test functions below, once the alias is installed
    fluid: object = None

    def test_lod_level_0_converter(self):
        fluid = self.fluid
        img = fluid.layers.data(name="image", shape=[1, 28, 28])
        label = fluid.layers.data(name="label", shape=[1], dtype="int64")
        feeder = fluid.DataFeeder([img, label], fluid.CPUPlace())
        result = feeder.feed([([0] * 784, [9]), ([1] * 784, [1])])

        self.assertEqual(result["image"].shape(), [2, 1, 28, 28])
        self.assertEqual(result["label"].shape(), [2, 1])
        self.assertEqual(result["image"].recursive_sequence_lengths(), [])
        self.assertEqual(result["label"].recursive_sequence_lengths(), [])

        try:
            result = feeder.feed([([0] * 783, [9]), ([1] * 783, [1])])
            self.assertTrue(False)
        except ValueError:
            self.assertTrue(True)

    def test_lod_level_1_converter(self):
        fluid = self.fluid
        sentences = fluid.layers.data(name="sentences", shape=[1], dtype="int64", lod_level=1)
        label = fluid.layers.data(name="label", shape=[1], dtype="int64")
        feeder = fluid.DataFeeder([sentences, label], fluid.CPUPlace())
        result = feeder.feed([([1, 2, 3], [1]), ([4, 5], [1]), ([6, 7, 8, 9], [1])])

        self.assertEqual(result["sentences"].shape(), [9, 1])
        self.assertEqual(result["label"].shape(), [3, 1])
        self.assertEqual(result["sentences"].recursive_sequence_lengths(), [[3, 2, 4]])
        self.assertEqual(result["label"].recursive_sequence_lengths(), [])

    def test_lod_level_2_converter(self):
        fluid = self.fluid
        paragraphs = fluid.layers.data(name="paragraphs", shape=[1], dtype="int64", lod_level=2)
        label = fluid.layers.data(name="label", shape=[1], dtype="int64")
        feeder = fluid.DataFeeder([paragraphs, label], fluid.CPUPlace())
        result = feeder.feed([([[1, 2, 3], [4, 5]], [1]), ([[6, 7, 8, 9]], [1])])

        self.assertEqual(result["paragraphs"].shape(), [9, 1])
        self.assertEqual(result["label"].shape(), [2, 1])
        self.assertEqual(result["paragraphs"].recursive_sequence_lengths(), [[2, 1], [3, 2, 4]])
        self.assertEqual(result["label"].recursive_sequence_lengths(), [])


class Paddle3DataFeederCases(unittest.TestCase):
    """Paddle 3's version (paddle.base, paddle.static.data with -1, program_guard), upstream's assertions."""

    __test__ = False
    paddle: object = None

    def test_lod_level_0_converter(self):
        paddle = self.paddle
        base = importlib.import_module("paddle.base")
        with paddle.static.program_guard(paddle.static.Program(), paddle.static.Program()):
            img = paddle.static.data(name="image", shape=[-1, 1, 28, 28])
            label = paddle.static.data(name="label", shape=[-1, 1], dtype="int64")
            feeder = base.DataFeeder([img, label], base.CPUPlace())
            result = feeder.feed([([0] * 784, [9]), ([1] * 784, [1])])

            self.assertEqual(result["image"].shape(), [2, 1, 28, 28])
            self.assertEqual(result["label"].shape(), [2, 1])

            try:
                result = feeder.feed([([0] * 783, [9]), ([1] * 783, [1])])
                self.assertTrue(False)
            except ValueError:
                self.assertTrue(True)

    def test_lod_level_1_converter(self):
        paddle = self.paddle
        base = importlib.import_module("paddle.base")
        with paddle.static.program_guard(paddle.static.Program(), paddle.static.Program()):
            sentences = paddle.static.data(name="sentences", shape=[-1, 1], dtype="int64")
            label = paddle.static.data(name="label", shape=[-1, 1], dtype="int64")
            feeder = base.DataFeeder([sentences, label], base.CPUPlace())
            result = feeder.feed([([1, 2, 3], [1]), ([4, 5], [1]), ([6, 7, 8, 9], [1])])

            self.assertEqual(result["sentences"].shape(), [9, 1])
            self.assertEqual(result["label"].shape(), [3, 1])

    def test_lod_level_2_converter(self):
        paddle = self.paddle
        base = importlib.import_module("paddle.base")
        with paddle.static.program_guard(paddle.static.Program(), paddle.static.Program()):
            # Upstream's lod_level=2, restored. Paddle 3's static.data drops it in PIR mode (a PIR value has
            # no LoD), and so does the alias: the feeder gets a value without lod_level and flattens the
            # batch, which is what these shape assertions check. lod_level 2 itself (the nested lengths)
            # is fed by the fluid case above, where the variable keeps it.
            paragraphs = paddle.static.data(name="paragraphs", shape=[-1, 1], dtype="int64", lod_level=2)
            label = paddle.static.data(name="label", shape=[-1, 1], dtype="int64")
            feeder = base.DataFeeder([paragraphs, label], base.CPUPlace())
            result = feeder.feed([([[1, 2, 3], [4, 5]], [1]), ([[6, 7, 8, 9]], [1])])

            self.assertEqual(result["paragraphs"].shape(), [9, 1])
            self.assertEqual(result["label"].shape(), [2, 1])


@pytest.mark.parametrize(
    "case", ["test_lod_level_0_converter", "test_lod_level_1_converter", "test_lod_level_2_converter"]
)
def test_fluid_data_feeder_upstream_cases(paddle, case):
    FluidDataFeederCases.fluid = importlib.import_module("paddle.fluid")
    outcome = unittest.TestResult()
    FluidDataFeederCases(case).run(outcome)
    assert outcome.wasSuccessful(), outcome.failures + outcome.errors


@pytest.mark.parametrize(
    "case", ["test_lod_level_0_converter", "test_lod_level_1_converter", "test_lod_level_2_converter"]
)
def test_paddle3_data_feeder_upstream_cases(paddle, case):
    Paddle3DataFeederCases.paddle = importlib.import_module("paddle")
    outcome = unittest.TestResult()
    Paddle3DataFeederCases(case).run(outcome)
    assert outcome.wasSuccessful(), outcome.failures + outcome.errors


def test_the_upstream_cases_can_fail():
    # The harness above must not pass vacuously: a feeder that ignores lod_level fails case 1.
    class Broken(FluidDataFeederCases):
        pass

    fluid = type("fluid", (), {})()
    fluid.layers = type(
        "layers", (), {"data": staticmethod(lambda **kw: Field(kw["name"], kw["shape"], kw.get("dtype", "float32")))}
    )
    fluid.DataFeeder = DataFeeder
    fluid.CPUPlace = paddle_shim.CPUPlace
    Broken.fluid = fluid
    outcome = unittest.TestResult()
    Broken("test_lod_level_1_converter").run(outcome)
    assert not outcome.wasSuccessful()


# --- program=, names, places, dtypes -------------------------------------------------------------------


def test_program_keyword_and_names_resolved_through_the_program(paddle):
    fluid = importlib.import_module("paddle.fluid")
    program = fluid.Program()
    with fluid.program_guard(program):
        fluid.layers.data(name="pixel", shape=[4], dtype="float32")
        fluid.layers.data(name="words", shape=[1], dtype="int64", lod_level=1)
    # Inference code passes names and the program it loaded.
    feeder = fluid.DataFeeder(feed_list=["pixel", "words"], place=fluid.CPUPlace(), program=program)
    result = feeder.feed([([1, 2, 3, 4], [7, 8]), ([5, 6, 7, 8], [9])])
    assert result["pixel"].shape() == [2, 4] and result["pixel"].dtype == np.float32
    assert result["words"].dtype == np.int64 and result["words"].recursive_sequence_lengths() == [[2, 1]]
    assert [f.lod_level for f in feeder.fields] == [0, 1]
    with pytest.raises(ValueError, match="'nope'"):
        fluid.DataFeeder(["nope"], fluid.CPUPlace(), program=program)


def test_program_none_is_accepted_with_variables(paddle):
    fluid = importlib.import_module("paddle.fluid")
    x = fluid.layers.data(name="x", shape=[2])
    assert fluid.DataFeeder([x], fluid.CPUPlace(), program=None).feed([([1, 2],)])["x"].shape() == [1, 2]


def test_names_resolve_through_declared_fields_without_a_program():
    Field("declared_img", [-1, 3])
    Field("declared_lbl", [-1, 1], "int64")
    result = DataFeeder(["declared_img", "declared_lbl"]).feed([([1, 2, 3], 4)])
    assert result["declared_img"].shape() == [1, 3] and result["declared_lbl"].dtype == np.int64


def test_a_program_may_be_a_list_or_dict_of_fields():
    fields = [Field("a", [-1, 2]), Field("b", [-1, 1], "int32")]
    for program in (fields, {f.name: f for f in fields}):
        out = DataFeeder(["b", "a"], program=program).feed([(1, [1, 2])])
        assert out["b"].dtype == np.int32 and out["a"].shape() == [1, 2]


@pytest.mark.parametrize(
    "dtype, expected",
    [
        (paddle_shim.VarType.FP32, "float32"),
        (paddle_shim.VarType.INT64, "int64"),
        (paddle_shim.VarType.UINT8, "uint8"),
        ("paddle.float64", "float64"),
        ("VarType.FP16", "float16"),
        (np.int16, "int16"),
        ("bool", "bool"),
    ],
)
def test_fluid_dtypes_become_numpy_dtypes(dtype, expected):
    var = paddle_shim.Variable("v", (-1, 1), dtype)
    assert DataFeeder([var]).fields[0].dtype == expected


def test_fluid_places_are_recognised():
    assert DataFeeder([Field("p", [-1])], paddle_shim.CPUPlace()).place == "cpu"
    assert DataFeeder([Field("p", [-1])], None).place == "cpu"


# --- LoDTensor as fluid reads it, and plain arrays in one step --------------------------------------------


def test_every_result_is_a_lod_tensor_read_the_fluid_way():
    feeder = DataFeeder([Field("x", [-1, 2]), Field("s", [-1, 1], "int64", lod_level=1)])
    result = feeder.feed([([1, 2], [1, 2, 3]), ([3, 4], [4])])
    x, s = result["x"], result["s"]
    assert isinstance(x, LoDTensor) and isinstance(s, LoDTensor)
    assert x.shape() == [2, 2] and x.shape == (2, 2) and x.lod() == [] and x.recursive_sequence_lengths() == []
    assert np.array(x).tolist() == [[1.0, 2.0], [3.0, 4.0]] and np.array(x).dtype == np.float32
    assert x.dtype == np.float32 and x._dtype() == np.float32 and x.ndim == 2 and len(x) == 2
    assert s.lod() == [[0, 3, 4]] and s.shape() == [4, 1]
    s.set_lod([[0, 1, 4]])
    assert s.recursive_sequence_lengths() == [[1, 3]] and s.has_valid_recursive_sequence_lengths()
    with pytest.raises(ValueError, match="offsets"):
        s.set_lod([[1, 2]])
    s.set(np.zeros((5, 1), np.int64), paddle_shim.CPUPlace())
    assert s.shape() == [5, 1] and not s.has_valid_recursive_sequence_lengths()


def test_a_lod_tensor_made_with_lengths_that_do_not_fit_its_rows_is_refused():
    # fluid.create_lod_tensor, which paddle.md maps onto LoDTensor(flat, lengths), asserted the LoD valid;
    # here lengths of 10 rows over 9 were taken, and each sequence cut from them was silently wrong.
    assert LoDTensor(np.zeros((9, 1)), [[3, 2, 4]]).lod() == [[0, 3, 5, 9]]
    assert LoDTensor(np.zeros((9, 1)), [[2, 1], [3, 2, 4]]).recursive_sequence_lengths() == [[2, 1], [3, 2, 4]]
    with pytest.raises(ValueError, match=r"sum to 10 rows, but the data has 9"):
        LoDTensor(np.zeros((9, 1)), [[3, 2, 5]])
    with pytest.raises(ValueError, match=r"level 1 has 2 lengths, but level 0 sums to 3"):
        LoDTensor(np.zeros((9, 1)), [[2, 1], [5, 4]])
    with pytest.raises(ValueError, match=r"negative"):
        LoDTensor(np.zeros((1, 1)), [[2, -1]])


def test_numpy_array_of_a_result_is_a_copy_and_asarray_is_not():
    # numpy >= 2 hands copy=True to __array__ and trusts it: returning the data itself made
    # numpy.array(t) an alias, so the caller's changes wrote into the fed tensor.
    result = DataFeeder([Field("x", [-1, 2])]).feed([([1, 2],), ([3, 4],)])
    x = result["x"]
    copied = np.array(x)
    copied[0, 0] = 99
    assert x.numpy()[0, 0] == 1
    assert np.array(x, dtype=np.float64).dtype == np.float64 and np.array(x, copy=True) is not x.data
    assert np.asarray(x) is x.data  # asarray may share, as numpy's own rule says


def test_return_arrays_gives_plain_arrays_in_one_step():
    feeder = DataFeeder([Field("x", [-1, 2]), Field("s", [-1, 1], "int64", lod_level=1)], return_arrays=True)
    result = feeder.feed([([1, 2], [1, 2, 3]), ([3, 4], [4])])
    assert type(result["x"]) is np.ndarray and result["x"].shape == (2, 2)
    assert isinstance(result["s"], LoDTensor)  # a sequence still needs its lengths
    batches = list(feeder.decorate_reader(lambda: iter([[([1, 2], [1])]]), multi_devices=False)())
    assert type(batches[0]["x"]) is np.ndarray
    assert type(DataFeeder([Field("x", [-1, 2])]).feed([([1, 2],)])["x"].numpy()) is np.ndarray


def test_paddle3_values_without_lod_level_flatten_the_batch():
    value = paddle_shim.Value("v", (-1, 2), paddle_shim.VarType.INT64)
    feeder = DataFeeder([value])
    assert feeder.fields[0].flatten and feeder.fields[0].lod_level == 0
    assert feeder.feed([([1, 2, 3, 4],), ([5, 6],)])["v"].shape() == [3, 2]
    with pytest.raises(ValueError, match="cannot be reshaped"):
        feeder.feed([([1, 2, 3],)])
    with pytest.raises(ValueError, match="lod_level must be 0"):
        Field("f", [-1, 1], lod_level=1, flatten=True)


def test_loader_exports_are_the_same_objects(paddle):
    fluid = importlib.import_module("paddle.fluid")
    assert fluid.DataFeeder is loader.DataFeeder and fluid.LoDTensor is loader.LoDTensor

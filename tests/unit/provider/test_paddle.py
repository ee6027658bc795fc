"""PyDataProvider2 as Paddle's own providers used it: settings.slots, positional samples, N-d dense_array."""

from __future__ import annotations

import ast
import subprocess
import sys

import numpy as np
import pytest

from loader.errors import DataError
from loader.provider import Settings, dense_array, dense_vector, integer_value, integer_value_sequence, provider


def _srl_hook(settings, word_dict, label_dict, **kwargs):
    # Paddle's semantic role labelling demo sets settings.slots, the older name of input_types.
    settings.word_dict = word_dict
    settings.slots = [integer_value_sequence(len(word_dict)), integer_value_sequence(len(label_dict))]


@provider(init_hook=_srl_hook, should_shuffle=False)
def srl_process(settings, filename):
    for line in ["a b", "b a a"]:
        words = line.split()
        yield [settings.word_dict[w] for w in words], [0] * len(words)


def test_init_hook_may_set_settings_slots():
    reader = srl_process.reader(["f"], word_dict={"a": 0, "b": 1}, label_dict={"O": 0})
    assert list(reader()) == [([0, 1], [0, 0]), ([1, 0, 0], [0, 0, 0])]
    assert reader.settings.slots is reader.settings.input_types
    (batch,) = list(srl_process.batch_reader(["f"], 10, word_dict={"a": 0, "b": 1}, label_dict={"O": 0})())
    assert batch["slot0"].recursive_sequence_lengths() == [[2, 3]]


@provider(input_types={"pixel": dense_vector(3), "label": integer_value(10)}, should_shuffle=False)
def positional(settings, filename):
    yield [1.0, 2.0, 3.0], 4  # a list sample with dict input types: values in slot order
    yield {"label": 5, "pixel": [4.0, 5.0, 6.0]}
    yield (7.0, 8.0, 9.0), 6


def test_list_samples_with_dict_input_types_are_positional():
    reader = positional.reader(["f"])
    assert reader.slot_names == ["pixel", "label"]
    assert [s[1] for s in reader()] == [4, 5, 6]
    ordered = positional.reader(["f"], input_order=["pixel", "label"])
    assert list(ordered())[0] == ([1.0, 2.0, 3.0], 4)


@provider(input_types={"pixel": dense_vector(3), "label": integer_value(10)}, should_shuffle=False)
def wrong_count(settings, filename):
    yield [1.0, 2.0, 3.0], 4, "extra"


def test_a_positional_sample_with_the_wrong_slot_count_names_the_file_and_sample():
    with pytest.raises(DataError, match=r"f: sample 0: has 3 slots, input_types has 2"):
        list(wrong_count.reader(["f"])())


@pytest.mark.parametrize("check", [False, True])
def test_dense_array_takes_n_d_arrays_read_flat(check):
    @provider(input_types=[dense_array(784), integer_value(10)], should_shuffle=False, check=check)
    def images(settings, filename):
        for i in range(3):
            yield np.full((28, 28), i, dtype=np.float32), i

    (batch,) = list(images.batch_reader(["f"], 8)())
    assert batch["slot0"].shape == (3, 784) and batch["slot0"][2, 783] == 2.0
    assert batch["slot1"].tolist() == [0, 1, 2]


def test_dense_array_of_the_wrong_size_is_refused_when_checked():
    @provider(input_types=[dense_array(784)], should_shuffle=False, check=True)
    def small(settings, filename):
        yield np.zeros((27, 28), dtype=np.float32)

    with pytest.raises(DataError, match=r"expected 784 values, got an array of shape \(27, 28\)"):
        list(small.reader(["f"])())


def test_settings_is_a_class_with_declared_attributes():
    annotations = Settings.__annotations__
    for name in ("input_types", "is_train", "file_list", "should_shuffle", "pool_size", "slot_names", "dict_mode"):
        assert name in annotations
    with pytest.raises(ValueError, match="clash"):
        srl_process.reader(["f"], word_dict={}, label_dict={}, pool_size=3)


def test_session_and_core_import_without_a_loop():
    # The session never imports the decorator's module (not even for type checking): no cycle left.
    import loader.provider.session as session

    tree = ast.parse(open(session.__file__, encoding="utf-8").read())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert "loader.provider.core" not in imported and "loader.provider.settings" in imported
    code = "import loader.provider.session, loader.provider.core, loader.provider.settings"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_provider_without_its_parentheses_is_refused_naming_the_function():
    # `@provider` alone hands the function over as input_types; it used to return a plain function, so the
    # first `process.reader(...)` failed with "'function' object has no attribute 'reader'".
    def process(settings, filename):
        yield [1.0]

    with pytest.raises(TypeError, match=r"@provider needs its arguments.*process"):
        provider(process)


@pytest.mark.parametrize(
    ("option", "value", "words"),
    [
        ("pool_size", "big", "pool_size must be an integer, got 'big'"),
        ("min_pool_size", None, "min_pool_size must be an integer, got None"),
        ("max_open_files", "x", "max_open_files must be an integer, got 'x'"),
        ("calc_batch_size", 3, "calc_batch_size must be a function of a sample, or None, got 3"),
        ("init_hook", "hook", "init_hook must be a function, or None, got 'hook'"),
    ],
)
def test_a_provider_option_of_the_wrong_type_is_refused_when_decorating(option, value, words):
    # These went through unchecked and failed at the first pass with "'int' object is not callable" or
    # "invalid literal for int()", naming no option.
    with pytest.raises(TypeError, match=f"provider: {words}"):
        provider(input_types=[dense_vector(1)], **{option: value})

"""Client.reader() / Loader.reader() batches as paddle batch readers, ready for DataFeeder.feed."""

from __future__ import annotations

import numpy as np

from loader import DataFeeder, Field
from loader.reader.batches import as_samples, batch_reader


def test_a_stacked_batch_becomes_sample_tuples_in_field_order():
    batch = {"image": np.arange(6, dtype=np.float32).reshape(3, 2), "label": np.array([7, 8, 9])}
    samples = as_samples(batch)
    assert [s[1] for s in samples] == [7, 8, 9] and samples[2][0].tolist() == [4.0, 5.0]
    feeder = DataFeeder([Field("image", [-1, 2]), Field("label", [-1, 1], "int64")])
    fed = feeder.feed(samples)  # the loop of a fluid script, unchanged
    assert fed["image"].shape() == [3, 2] and np.array(fed["label"]).ravel().tolist() == [7, 8, 9]


def test_list_format_batches_keep_tuples_and_wrap_the_rest():
    assert as_samples([(1, "a"), {"x": 2, "y": "b"}, 3]) == [(1, "a"), (2, "b"), (3,)]
    assert as_samples({}) == []


def test_batch_reader_calls_the_epoch_each_time():
    calls = []

    def epoch():
        calls.append(1)
        return iter([{"x": np.array([1, 2])}, {"x": np.array([3])}])

    reader = batch_reader(epoch)
    assert list(reader()) == [[(1,), (2,)], [(3,)]]
    assert list(reader()) == [[(1,), (2,)], [(3,)]] and len(calls) == 2


def test_worked_example_of_docs_paddle_md(tmp_path):
    # A Paddle Go-layout file of pickled (image, label) samples, converted once, served, fed.
    import pickle

    import loader
    from loader.config import LoaderConfig
    from loader.recordio import convert_paddle_file
    from tests import paddle_recordio_files as files

    samples = [(np.full(784, i, np.float32), i % 10) for i in range(40)]
    src = str(tmp_path / "mnist-paddle.recordio")
    files.write_go(src, [pickle.dumps(s, protocol=2) for s in samples], files.SNAPPY)
    (tmp_path / "mnist").mkdir()
    assert convert_paddle_file(src, str(tmp_path / "mnist" / "part-0.recordio"), allow_pickle=True) == 40
    config = LoaderConfig.from_dict(
        {
            "source": {"files": [str(tmp_path / "mnist" / "*.recordio")], "fields": ["image", "label"]},
            "pipeline": {"batch_size": 8, "shuffle_buffer": 16, "seed": 1},
            "workers": {"count": 1},
        }
    )
    feeder = DataFeeder([Field("image", [-1, 1, 28, 28]), Field("label", [-1, 1], "int64")])
    with loader.Loader(config) as local:
        train_reader = local.reader()
        labels = []
        for data in train_reader():
            fed = feeder.feed(data)
            assert fed["image"].shape()[1:] == [1, 28, 28]
            labels.extend(np.array(fed["label"]).ravel().tolist())
    assert sorted(labels) == sorted(i % 10 for i in range(40))

"""Files whose fields come in another order (``.npz`` keys, dict samples) are joined by name in batches."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from loader import Client, DataFeeder, Field, WorkerError
from tests.integration.conftest import make_config, running_daemon


@pytest.mark.parametrize("batch_format", ["stacked", "list"])
def test_npz_files_with_their_keys_in_another_order_make_one_epoch(tmp_path, batch_format) -> None:
    # Before: the second file failed its epoch ("a sample has fields ['weight', 'label'], but the batch has ...").
    np.savez(tmp_path / "a.npz", label=np.array([1, 1]), weight=np.array([100, 100]))
    np.savez(tmp_path / "b.npz", weight=np.array([200, 200]), label=np.array([2, 2]))
    config = make_config(
        tmp_path,
        source={"files": [str(tmp_path / "a.npz"), str(tmp_path / "b.npz")]},
        pipeline={"batch_size": 4, "batch_format": batch_format},
        workers={"count": 1},
    )
    with running_daemon(config) as daemon, Client(daemon.endpoint) as client:
        (batch,) = list(client.epoch())
    if batch_format == "stacked":
        assert batch["label"].tolist() == [1, 1, 2, 2] and batch["weight"].tolist() == [100, 100, 200, 200]
    else:
        assert [(int(label), int(weight)) for label, weight in batch] == [(1, 100), (1, 100), (2, 200), (2, 200)]


def label_first_dicts(path: str) -> Any:
    """A paddle reader per file whose dict samples list the label first."""

    def reader() -> Any:
        for i in range(6):
            yield {"label": i, "words": list(range(i % 3 + 1))}

    return reader


@pytest.mark.parametrize("batch_format", ["stacked", "list"])
def test_dict_samples_come_in_the_order_of_source_fields(tmp_path, batch_format) -> None:
    # Client.reader() tuples follow the batch's field order, which was the dict's own: with fields =
    # ["words", "label"] a DataFeeder([words, label]) got the labels as its sequences.
    (tmp_path / "a.txt").write_text("")
    source = {
        "files": [str(tmp_path / "a.txt")],
        "reader": f"{__name__}:label_first_dicts",
        "fields": ["words", "label"],
    }
    # Ragged words stack only one sample at a time.
    pipeline = {"batch_size": 6 if batch_format == "list" else 1, "batch_format": batch_format}
    config = make_config(tmp_path, source=source, pipeline=pipeline, workers={"count": 1})
    feeder = DataFeeder([Field("words", [-1, 1], "int64", lod_level=1), Field("label", [-1, 1], "int64")])
    with running_daemon(config) as daemon, Client(daemon.endpoint) as client:
        batches = list(client.reader()())
    fed = [feeder.feed(data) for data in batches]
    lengths = [n for f in fed for n in f["words"].recursive_sequence_lengths()[0]]
    labels = [int(v) for f in fed for v in np.array(f["label"]).ravel()]
    assert labels == list(range(6)) and lengths == [i % 3 + 1 for i in range(6)]


@pytest.mark.parametrize("fields", [["image"], ["image", "label", "weight"]])
def test_source_fields_of_another_count_than_the_files_fail_the_epoch_in_one_line(tmp_path, fields) -> None:
    # Without mappers, names of another count were dropped for "0", "1": the loop's batch["image"] raised KeyError.
    np.save(tmp_path / "part-0.npy", np.zeros((6, 4), np.float32))
    np.save(tmp_path / "part-0.label.npy", np.zeros(6, np.int64))
    config = make_config(
        tmp_path,
        source={"files": [str(tmp_path / "part-0.npy")], "fields": fields},
        pipeline={"batch_size": 3},
        workers={"count": 1},
    )
    with running_daemon(config) as daemon, Client(daemon.endpoint) as client:
        with pytest.raises(WorkerError) as info:
            list(client.epoch())
    text = str(info.value)
    assert f"source.fields names {len(fields)} field" in text and "has 2 (data, label)" in text
    assert "part-0.npy" in text and "name each of them, in order" in text


def test_a_npy_without_the_label_companion_its_neighbours_have_is_named_with_what_differs(tmp_path) -> None:
    # Before: "a sample has fields ['data', 'label'], but the batch has fields ['data']", naming whichever file
    # came second, and neither the missing companion nor the file the batch's fields came from.
    np.save(tmp_path / "a.npy", np.zeros((4, 2)))
    np.save(tmp_path / "a.label.npy", np.zeros(4, dtype=np.int64))
    np.save(tmp_path / "b.npy", np.ones((4, 2)))
    config = make_config(tmp_path, pipeline={"batch_size": 2, "shuffle_buffer": 0}, workers={"count": 1})
    with running_daemon(config) as daemon, Client(daemon.endpoint) as client:
        with pytest.raises(WorkerError) as caught:
            list(client.epoch())
    message = str(caught.value)
    assert f"but the batch has fields ['data', 'label'] (as in {tmp_path / 'a.npy'}): 'label' missing" in message
    assert "NAME.label.npy beside NAME.npy" in message and str(tmp_path / "b.npy") in message

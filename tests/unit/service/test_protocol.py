"""The wire format: header + raw frames, object columns, and malformed input."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from loader.errors import TransportError
from loader.service import protocol as P


def test_round_trip_keeps_dtype_shape_and_values():
    cols = {"x": np.arange(12, dtype=np.float32).reshape(3, 4), "y": np.array([1, 2, 3], dtype=np.int8),
            "s": np.array(["a", "bb", "ccc"]), "empty": np.zeros((3, 0), dtype=np.float64)}
    head, out = P.decode(P.encode(P.CHUNK, {"s": 1, "f": 2}, cols))
    assert head == {"k": P.CHUNK, "s": 1, "f": 2}
    assert list(out) == list(cols)
    for name in cols:
        assert out[name].dtype == cols[name].dtype and out[name].shape == cols[name].shape
        np.testing.assert_array_equal(out[name], cols[name])


def test_arrays_are_raw_frames_not_packed():
    big = np.ones((256, 1024), dtype=np.float32)
    frames = P.encode(P.BATCH, {}, {"x": big})
    assert len(frames) == 2 and memoryview(frames[1]).nbytes == big.nbytes
    assert len(frames[0]) < 100


def test_non_contiguous_arrays_are_sent_contiguous():
    base = np.arange(20).reshape(4, 5)
    _, out = P.decode(P.encode(P.CHUNK, {}, {"x": base[:, ::2]}))
    np.testing.assert_array_equal(out["x"], base[:, ::2])


def test_object_column_round_trip_without_pickle():
    ragged = P.object_array([np.arange(3), np.arange(5), "text"])
    _, out = P.decode(P.encode(P.CHUNK, {}, {"seq": ragged}))
    assert out["seq"].dtype == object and len(out["seq"]) == 3
    np.testing.assert_array_equal(out["seq"][1], np.arange(5))
    assert out["seq"][2] == "text"


@pytest.mark.parametrize(
    "frames",
    [
        [],
        [b"\xc1"],
        [msgpack.packb([1, 2])],
        [msgpack.packb({"k": "chunk", "cols": [["x", "<f4", [4]]]})],
        [msgpack.packb({"k": "chunk", "cols": [["x", "<f4", [4]]]}), b"123"],
        [msgpack.packb({"k": "chunk", "cols": [["x", "|O", [1]]]}), b"\xc1"],
        [msgpack.packb({"k": "chunk", "cols": [["x", "O", [1]]]}), b"12345678"],
    ],
)
def test_malformed_messages_raise_transport_error(frames):
    with pytest.raises(TransportError):
        P.decode(frames)


def test_error_dicts_travel_in_headers():
    from loader.errors import WorkerError

    err = WorkerError("Boom", "bad", "tb", worker="w1", file="/d/f.npy", record=7)
    head, _ = P.decode(P.encode(P.FILE_ERROR, {"error": err.to_dict()}))
    back = WorkerError.from_dict(head["error"])
    assert (back.type_name, back.file, back.record, back.worker) == ("Boom", "/d/f.npy", 7, "w1")


def test_versioned_headers_and_mismatch_lines():
    import loader

    head = P.versioned({"worker": "w1"})
    assert head == {"worker": "w1", "v": P.PROTOCOL_VERSION, "lv": loader.__version__}
    assert P.version_mismatch(head, "worker w1") is None
    assert P.version_mismatch({}, "an old peer") is None  # peers from before the check spoke version 1
    line = P.version_mismatch({"v": 7, "lv": "3.0"}, "worker w2")
    assert line is not None and "\n" not in line
    assert line.startswith("worker w2 speaks loader protocol 7 (loader 3.0)")
    assert f"this side speaks {P.PROTOCOL_VERSION} (loader {loader.__version__})" in line

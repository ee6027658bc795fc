"""The package itself: version, lazy imports, the error tree, the codec."""

from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np
import pytest

import loader
from loader.errors import (
    BatchMapperError,
    ComposeNotAligned,
    DataError,
    LoaderError,
    UnsendableSampleError,
    WorkerDiedError,
    WorkerError,
)
from loader.runtime import codec
from loader.service.shm.file_layout import FileChangedError


def test_version_from_console_script():
    out = subprocess.run([sys.executable, "-m", "loader.cli", "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    assert out.stdout.strip() == f"loader {loader.__version__}"


def test_import_does_not_load_zmq():
    code = "import sys, loader; print('zmq' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr


def test_error_tree():
    assert issubclass(ComposeNotAligned, ValueError)
    assert issubclass(WorkerDiedError, WorkerError)
    assert issubclass(WorkerError, LoaderError)


def test_worker_error_carries_origin_and_pickles():
    try:
        raise KeyError("missing")
    except KeyError as exc:
        err = WorkerError.from_exception(exc, worker="w1", file="a.npy", record=7)
    assert err.type_name == "KeyError"
    assert "a.npy" in str(err) and "record 7" in str(err) and "w1" in str(err)
    assert "Traceback" in err.remote_traceback
    back = pickle.loads(pickle.dumps(err))
    assert back.to_dict() == err.to_dict()
    died = pickle.loads(pickle.dumps(WorkerDiedError("reader 0", -9)))
    assert died.exitcode == -9 and "signal 9" in str(died)


def _carried(exc: BaseException, **where: object) -> WorkerError:
    try:
        raise exc
    except Exception as raised:
        return WorkerError.from_exception(raised, worker="w1", **where)  # type: ignore[arg-type]


def test_an_error_dict_of_any_types_makes_a_worker_error_without_raising():
    # An error dict comes from a peer: "file" as a list made the one-line form's check of the message raise
    # TypeError in the daemon's loop (a fuzz test's epoch then hung to its timeout).
    for fields in ({"file": ["a"], "message": None}, {"file": 3, "message": 5}, {"file": "f", "message": ["f"]}):
        error = WorkerError.from_dict({"type": "X", **fields})
        assert str(error).startswith("X: ") and "\n" not in str(error)


def test_a_loader_data_error_is_one_line_with_its_traceback_kept_apart():
    # A truncated .npy reaching the training loop printed 25-46 lines: the loader's own insides.
    cause = ValueError("mmap length is greater than file size")
    error = DataError("/d/f1.npy: not a readable .npy array (mmap length is greater than file size)")
    error.__cause__ = cause
    for err in (_carried(error, file="/d/f1.npy"), _carried(FileChangedError("/d/f1.npy changed"), file="/d/f1.npy")):
        assert len(str(err).splitlines()) == 1
        assert str(err).count("/d/f1.npy") == 1  # named by the message, not again in the "in ..." part
        assert "(in worker w1)" in str(err)
        assert "Traceback" in err.remote_traceback  # still there, for whoever wants it
        for back in (WorkerError.from_dict(err.to_dict()), pickle.loads(pickle.dumps(err))):
            assert str(back) == str(err) and back.remote_traceback == err.remote_traceback
    record = _carried(UnsendableSampleError("field 'data' is bad"), file="/d/f1.npy", record=3)
    assert str(record) == "UnsendableSampleError: field 'data' is bad (in worker w1, file /d/f1.npy, record 3)"


def test_a_data_error_raised_by_user_code_keeps_its_traceback():
    # A reader of the user's raising its own DataError subclass lost the traceback to its line: the one-line
    # form was chosen by the class, not by whose code raised it.
    class BadRow(DataError):
        pass

    def read(path: str) -> object:
        raise BadRow(f"{path}: row 1: empty text")

    try:
        read("/d/f0.csv")
    except BadRow as exc:
        err = WorkerError.from_exception(exc, file="/d/f0.csv", record=1)
    assert not err.data_error
    assert "--- original traceback ---" in str(err) and "in read" in str(err)


def test_a_data_error_of_an_installed_package_inside_the_standard_librarys_directory_keeps_its_traceback(
    monkeypatch,
):
    # conda, Docker python: images and a plain pyenv Python keep site-packages inside the standard library's
    # directory: a user's installed reader raising its own DataError counted as the loader's, and lost its
    # traceback.
    import os

    from loader import errors

    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "")
    parent = os.path.join(os.path.dirname(os.path.dirname(here)), "")  # tests/unit/ plays site-packages in it
    packages, _, installed = errors._code_dirs()

    def read() -> object:
        raise DataError("/d/f0.csv: row 1: empty text")

    def carried() -> WorkerError:
        try:
            read()
        except DataError as exc:
            return WorkerError.from_exception(exc, file="/d/f0.csv")
        raise AssertionError("read() raised nothing")

    monkeypatch.setattr(errors, "_CODE_DIRS", (packages, parent, installed))
    assert carried().data_error  # as if this file were the standard library's: one line
    monkeypatch.setattr(errors, "_CODE_DIRS", (packages, parent, (*installed, here)))
    assert not carried().data_error  # an installed package's, inside it: its traceback kept


def test_an_error_of_user_code_keeps_its_traceback_in_str():
    def mapper(sample: object) -> object:
        raise KeyError("label")

    try:
        mapper(None)
    except KeyError as exc:
        err = WorkerError.from_exception(exc, file="/d/f1.npy", record=2)
    text = str(err)
    assert text.startswith("KeyError: 'label' (in file /d/f1.npy, record 2)\n--- original traceback ---")
    assert "in mapper" in text
    try:
        try:
            mapper(None)
        except KeyError as exc:
            raise BatchMapperError(f"batch mapper 'm:f' raised KeyError: {exc}") from exc
    except BatchMapperError as exc:
        wrapped = WorkerError.from_exception(exc)
    assert "in mapper" in str(wrapped)  # a batch mapper's failure is the user's line too
    older = err.to_dict()
    del older["data_error"]  # a peer of an older version sends no such key: as before
    assert "original traceback" in str(WorkerError.from_dict(older))


@pytest.mark.parametrize(
    "sample",
    [
        None,
        True,
        3,
        -2.5,
        "text",
        b"\x00bytes",
        [1, [2, 3]],
        (1, (2, "a")),
        {1: (1, 2), "k": [None]},
        np.arange(12, dtype=np.float32).reshape(3, 4),
        np.array(5, dtype=np.int64),
        np.zeros((0, 3), dtype=np.uint8),
        np.float64(1.5),
        np.asfortranarray(np.arange(6).reshape(2, 3)),
        (np.arange(3), 7, {"x": np.ones(2, dtype=">f8")}),
    ],
)
def test_codec_round_trip_keeps_types(sample):
    back = codec.unpack(codec.pack(sample))
    _assert_same(back, sample)


def _assert_same(a, b):
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(b, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
        assert a.flags.writeable
    elif isinstance(b, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    elif isinstance(b, dict):
        assert list(a) == list(b)
        for k in b:
            _assert_same(a[k], b[k])
    else:
        assert a == b


def test_codec_refuses_to_encode_the_tuple_nesting_it_refuses_to_decode():
    # Encoded but not decodable: a RecordIO file written with it could not be read back.
    deep = 1
    for _ in range(codec.MAX_TUPLE_NESTING):
        deep = (deep,)
    assert codec.unpack(codec.pack(deep)) == deep and codec.unpack(codec.pack([deep])) == [deep]
    for exact in (False, True):
        with pytest.raises(TypeError, match=f"nested deeper than {codec.MAX_TUPLE_NESTING}"):
            codec.pack((deep,), exact=exact)
    assert codec.unpack(codec.pack((1, (2,)))) == (1, (2,))  # the count unwinds after a refusal


def test_codec_rejects_unknown_types_and_garbage():
    with pytest.raises(TypeError, match="set"):
        codec.pack({1, 2})
    with pytest.raises(TypeError, match="object"):
        codec.pack(np.array([object()]))
    with pytest.raises(ValueError):
        codec.unpack(b"\xc1\xc1\xc1")


def test_changing_a_read_only_row_in_place_carries_the_fix():
    import numpy as np

    row = np.zeros(4, np.float32)
    row.flags.writeable = False  # as a row of a memory-mapped .npy is
    try:
        row /= 255.0
    except ValueError as exc:
        err = WorkerError.from_exception(exc, file="a.npy", record=0)
    assert "read-only" in err.message and "x = x / 255" in err.message and "x.copy()" in err.message
    other = WorkerError.from_exception(ValueError("bad value"))
    assert other.message == "bad value"  # no hint where none applies

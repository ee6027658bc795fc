"""Acceptance test of ``loader.io``: every public name and stated behaviour of its specification.

Thread tests are bounded by the suite's pytest timeout and by their own deadlines.
"""

from __future__ import annotations

import inspect
import mmap
import os
import threading
import time
from collections import Counter

import numpy as np
import pytest

import loader.io as lio
from loader import reader as paddle_reader
from loader.errors import ShapeMismatchError, UnknownFormatError
from loader.recordio import Writer
from tests.helpers import Boom, ListReader, RangeReader, live_threads, wait_until

EMPTY = inspect.Parameter.empty
READ_AHEAD_TIMEOUT_S = 10.0  # only reached when the double buffer does not read ahead


def _params(fn) -> list[tuple[str, object]]:
    return [
        (p.name, p.default)
        for p in inspect.signature(fn).parameters.values()
        if p.kind is not inspect.Parameter.VAR_KEYWORD
    ]


def _npy(path, rows: np.ndarray) -> str:
    np.save(path, rows)
    return str(path)


def _memory_mapped(array: np.ndarray) -> bool:
    while array is not None:
        if isinstance(array, np.memmap) or isinstance(array, mmap.mmap):
            return True
        array = getattr(array, "base", None)
    return False


def _wait_threads_gone(before: set, timeout_s: float = 5.0) -> set:
    deadline = time.monotonic() + timeout_s
    while live_threads() - before and time.monotonic() < deadline:
        time.sleep(0.01)
    return live_threads() - before


# --- names and signatures ------------------------------------------------------------------


def test_public_names_and_signatures_are_exactly_as_stated():
    for name in (
        "ReaderBase",
        "FileReader",
        "DecoratedReader",
        "ShuffleReader",
        "BatchReader",
        "MultiPassReader",
        "DoubleBufferReader",
        "open_files",
        "register_file_reader",
        "to_reader",
        "from_reader",
    ):
        assert hasattr(lio, name), name
    for cls in (lio.FileReader, lio.DecoratedReader):
        assert issubclass(cls, lio.ReaderBase)
    for cls in (lio.ShuffleReader, lio.BatchReader, lio.MultiPassReader, lio.DoubleBufferReader):
        assert issubclass(cls, lio.DecoratedReader)
    assert _params(lio.FileReader) == [("path", EMPTY), ("shapes", EMPTY), ("dtypes", EMPTY), ("lod_levels", None)]
    assert _params(lio.ShuffleReader) == [("reader", EMPTY), ("buffer_size", EMPTY), ("seed", None)]
    assert _params(lio.BatchReader) == [("reader", EMPTY), ("batch_size", EMPTY), ("drop_last", False)]
    assert _params(lio.MultiPassReader) == [("reader", EMPTY), ("pass_num", EMPTY)]
    assert _params(lio.DoubleBufferReader) == [("reader", EMPTY), ("place", "cpu"), ("capacity", 2)]
    assert _params(lio.open_files) == [
        ("filenames", EMPTY),
        ("shapes", EMPTY),
        ("dtypes", EMPTY),
        ("lod_levels", None),
        ("thread_num", None),
        ("buffer_size", None),
        ("pass_num", 1),
        ("is_test", False),
    ]
    assert _params(lio.register_file_reader)[:2] == [("format_name", EMPTY), ("factory", EMPTY)]
    assert _params(lio.to_reader) == [("reader_base", EMPTY)]
    assert _params(lio.from_reader) == [("reader", EMPTY), ("shapes", EMPTY), ("dtypes", EMPTY), ("lod_levels", None)]


# --- ReaderBase and FileReader ---------------------------------------------------------------


def test_reader_base_protocol_on_a_file_reader(tmp_path):
    path = _npy(tmp_path / "a.npy", np.arange(12, dtype=np.float32).reshape(3, 4))
    with lio.FileReader(path, [[-1, 4]], ["float32"]) as r:
        assert isinstance(r, lio.ReaderBase)
        assert r.has_next()
        first = r.read_next()
        assert isinstance(first, list) and len(first) == 1 and isinstance(first[0], np.ndarray)
        assert first[0].shape == (4,)  # a row of shape (4,) is an instance of [-1, 4]
        np.testing.assert_array_equal(first[0], [0, 1, 2, 3])
        rest = list(r)  # iterating yields the lists
        assert [x[0][0] for x in rest] == [4, 8]
        assert r.read_next() == [] and not r.has_next()  # empty list at the end
        r.reinit()  # start again from the beginning
        assert r.read_next()[0][0] == 0
    assert r.closed


def test_file_reader_checks_rank_every_fixed_size_and_dtype(tmp_path):
    path = _npy(tmp_path / "rows.npy", np.zeros((3, 4), np.float32))
    for shapes, dtypes in (([[-1, -1]], ["float32"]), ([[-1, 4]], ["float32"]), ([[-1, 4]], [np.float32])):
        assert len(list(lio.FileReader(path, shapes, dtypes))) == 3
    for shapes, dtypes, wanted in (
        ([[-1, 5]], ["float32"], "[-1, 5]"),  # a fixed size (the original checked only rank)
        ([[-1, 4, 1]], ["float32"], "[-1, 4, 1]"),  # the rank
    ):
        with pytest.raises(ShapeMismatchError) as info:
            list(lio.FileReader(path, shapes, dtypes))
        text = str(info.value)
        assert path in text and "record 0" in text and "slot 0" in text and "(4,)" in text and wanted in text
    with pytest.raises(ShapeMismatchError, match="float64"):
        list(lio.FileReader(path, [[-1, 4]], ["float64"]))


def test_shape_mismatch_names_file_record_index_slot_and_both_shapes(tmp_path):
    path = str(tmp_path / "mixed.recordio")
    with Writer(path) as writer:
        for i in range(5):
            writer.write((np.zeros(3 if i != 3 else 2, np.float32), np.int64(i)))
    r = lio.FileReader(path, [[-1, 3], [-1]], ["float32", "int64"])
    assert len([r.read_next() for _ in range(3)]) == 3
    with pytest.raises(ShapeMismatchError) as info:
        r.read_next()
    text = str(info.value)
    assert path in text and "record 3" in text and "slot 0" in text and "(2,)" in text and "[-1, 3]" in text
    r.close()


def test_batch_of_npy_rows_has_shape_n_by_4(tmp_path):
    path = _npy(tmp_path / "a.npy", np.arange(40, dtype=np.float32).reshape(10, 4))
    batches = list(lio.BatchReader(lio.FileReader(path, [[-1, 4]], ["float32"]), 4))
    assert [b[0].shape for b in batches] == [(4, 4), (4, 4), (2, 4)]
    batches = list(lio.BatchReader(lio.FileReader(path, [[-1, 4]], ["float32"]), 4, drop_last=True))
    assert [b[0].shape for b in batches] == [(4, 4), (4, 4)]
    np.testing.assert_array_equal(np.concatenate([b[0] for b in batches]), np.arange(32).reshape(8, 4))


def test_original_mnist_shapes_give_n_by_784_and_n_by_1_batches(tmp_path):
    path = str(tmp_path / "mnist.recordio")
    with Writer(path) as writer:
        for i in range(10):
            writer.write((np.full(784, i, np.float32), np.int64(i % 10)))  # a scalar label
    reader = lio.open_files([path], shapes=[[-1, 784], [-1, 1]], dtypes=["float32", "int64"])
    with lio.BatchReader(reader, 4) as batches:
        got = list(batches)
    assert [[a.shape for a in b] for b in got] == [[(4, 784), (4, 1)]] * 2 + [[(2, 784), (2, 1)]]
    assert np.concatenate([b[1] for b in got]).ravel().tolist() == list(range(10))
    with pytest.raises(ShapeMismatchError):  # a scalar does not fit [-1, 2]
        list(lio.FileReader(path, [[-1, 784], [-1, 2]], ["float32", "int64"]))


# --- decorated readers ---------------------------------------------------------------------


def _ints(n: int) -> lio.ReaderBase:
    return lio.from_reader(RangeReader(n), [[-1]], ["int64"])


def test_shuffle_reader_is_a_block_shuffle_deterministic_given_a_seed():
    def run(seed):
        return [int(x[0]) for x in lio.ShuffleReader(_ints(100), 25, seed=seed)]

    first = run(7)
    assert first == run(7) and first != list(range(100))
    for block in range(4):
        assert sorted(first[block * 25 : block * 25 + 25]) == list(range(block * 25, block * 25 + 25))
    assert run(None) != run(None)


def test_batch_reader_concatenates_sequences_and_merges_lengths():
    samples = [(np.arange(n, dtype=np.int64).reshape(n, 1), np.int64(n)) for n in (3, 2, 4, 1)]
    source = lio.from_reader(ListReader(samples), [[-1, 1], [-1]], ["int64", "int64"], lod_levels=[1, 0])
    batches = list(lio.BatchReader(source, 3))
    data, labels, lengths = batches[0]
    assert data.shape == (9, 1) and labels.shape == (3,)
    assert lengths.tolist() == [3, 2, 4]
    assert batches[1][0].shape == (1, 1) and batches[1][2].tolist() == [1]


def test_multi_pass_reader_repeats_the_data():
    r = lio.MultiPassReader(lio.BatchReader(_ints(10), 4), 3)
    assert [len(b[0]) for b in r] == [4, 4, 2] * 3
    r.reinit()
    assert len(list(r)) == 9


class _Slow(lio.ReaderBase):
    """Batches that take ``delay_s`` each to read, counted."""

    def __init__(self, count: int, delay_s: float) -> None:
        super().__init__()
        self.count, self.delay_s, self.pos = count, delay_s, 0

    @property
    def slot_names(self):
        return ["x"]

    def _read_next_impl(self):
        if self.pos >= self.count:
            return []
        time.sleep(self.delay_s)
        self.pos += 1
        return [np.full((2, 2), self.pos)]

    def _reinit_impl(self):
        self.pos = 0


def test_double_buffer_overlaps_reading_with_consuming():
    count = 12
    source = _Slow(count, 0.0)
    before = live_threads()
    with lio.DoubleBufferReader(source) as r:
        got = []
        for item in r:
            got.append(int(item[0][0, 0]))
            # The next instance is read while this one is being consumed, before it is asked for.
            assert wait_until(lambda: source.pos >= min(len(got) + 1, count), timeout_s=READ_AHEAD_TIMEOUT_S), got
    assert got == list(range(1, count + 1))
    assert not _wait_threads_gone(before)


def test_double_buffer_passes_errors_and_reinit_starts_a_clean_pass():
    r = lio.DoubleBufferReader(lio.from_reader(lambda: (x for x in [1, 2, 3]), [[-1]], ["int64"]), capacity=1)
    assert r.read_next()[0] == 1
    r.reinit()
    assert [int(x[0]) for x in r] == [1, 2, 3]
    r.close()
    failing = lio.DoubleBufferReader(lio.from_reader(lambda: iter(_boom_after(2)), [[-1]], ["int64"]))
    with pytest.raises(Boom):
        list(failing)
    failing.close()


def _boom_after(n):
    yield from range(n)
    raise Boom("file reader broke")


# --- open_files --------------------------------------------------------------------------


def _files(tmp_path, sizes) -> list[str]:
    paths = []
    for i, size in enumerate(sizes):
        rows = np.stack([np.full(size, i), np.arange(size)], axis=1).astype(np.int64).reshape(size, 2)
        paths.append(_npy(tmp_path / f"f{i:02d}.npy", rows))
    return paths


def test_open_files_defaults_and_list_order_with_is_test(tmp_path):
    paths = _files(tmp_path, [5, 0, 3, 7, 1])
    r = lio.open_files(paths, shapes=[[-1, 2]], dtypes=["int64"])
    assert isinstance(r, lio.ReaderBase)
    expected_threads = min(len(paths), os.cpu_count() or 1)
    assert r.thread_num == expected_threads and r.buffer_size == 3 * expected_threads
    assert Counter(tuple(x[0]) for x in r) == Counter((i, j) for i, n in enumerate([5, 0, 3, 7, 1]) for j in range(n))
    r.close()
    with lio.open_files(paths, [[-1, 2]], ["int64"], thread_num=4, is_test=True) as ordered:
        got = [tuple(int(v) for v in x[0]) for x in ordered]
    assert got == [(i, j) for i, n in enumerate([5, 0, 3, 7, 1]) for j in range(n)]


@pytest.mark.parametrize("thread_num", [1, 2, 3, 5, 8])
def test_open_files_delivers_every_instance_exactly_once_per_pass(tmp_path, thread_num):
    sizes = [0, 13, 1, 200, 0, 57, 9, 300, 2]
    paths = _files(tmp_path, sizes)
    before = live_threads()
    with lio.open_files(paths, [[-1, 2]], ["int64"], thread_num=thread_num, buffer_size=2, pass_num=2) as r:
        got = [tuple(int(v) for v in x[0]) for x in r]
    expected = [(i, j) for i, n in enumerate(sizes) for j in range(n)]
    assert Counter(got) == Counter(expected * 2)
    assert not _wait_threads_gone(before)


def test_open_files_batches_keep_the_row_shape(tmp_path):
    paths = [_npy(tmp_path / f"r{i}.npy", np.ones((10, 4), np.float32)) for i in range(3)]
    with lio.BatchReader(lio.open_files(paths, shapes=[[-1, 4]], dtypes=["float32"]), 8) as r:
        shapes = [b[0].shape for b in r]
    assert shapes == [(8, 4)] * 3 + [(6, 4)]


def test_open_files_error_in_a_file_reader_names_the_file(tmp_path):
    good = _files(tmp_path, [50, 50])
    bad = _npy(tmp_path / "bad.npy", np.zeros((5, 3), np.int64))
    with lio.open_files(good + [bad], [[-1, 2]], ["int64"], thread_num=2) as r:
        with pytest.raises(ShapeMismatchError) as info:
            list(r)
    assert bad in str(info.value)

    def explode(path, **kwargs):
        raise Boom("cannot open")

    lio.register_file_reader("explodes", explode)
    try:
        victim = tmp_path / "x.explodes"
        victim.write_bytes(b"")
        with lio.open_files(good + [str(victim)], [[-1, 2]], ["int64"], thread_num=2) as r:
            with pytest.raises(Boom) as info:
                list(r)
        assert str(victim) in "".join(getattr(info.value, "__notes__", [])) + str(info.value)
    finally:
        lio.unregister_file_reader("explodes")


def test_reinit_mid_pass_starts_clean_and_close_stops_threads_promptly(tmp_path):
    sizes = [400] * 6
    paths = _files(tmp_path, sizes)
    before = live_threads()
    r = lio.open_files(paths, [[-1, 2]], ["int64"], thread_num=3, buffer_size=2)
    for _ in range(100):
        r.read_next()
    r.reinit()
    got = [tuple(int(v) for v in x[0]) for x in r]
    assert Counter(got) == Counter((i, j) for i in range(6) for j in range(400))
    r.reinit()
    r.read_next()
    start = time.monotonic()
    r.close()
    assert time.monotonic() - start < 2.0
    assert not _wait_threads_gone(before)


# --- the registry --------------------------------------------------------------------------


def test_registry_lookup_builtins_and_user_formats(tmp_path):
    npz = tmp_path / "d.npz"
    np.savez(npz, x=np.arange(6, dtype=np.float32).reshape(3, 2), y=np.arange(3))
    r = lio.create_file_reader(npz, shapes=[[-1, 2], [-1]], dtypes=["float32", "int64"])
    assert r.slot_names == ["x", "y"] and len(list(r)) == 3
    npy = _npy(tmp_path / "m.npy", np.zeros((3, 2), np.float32))
    row = lio.create_file_reader(npy).read_next()[0]
    assert _memory_mapped(row) and not row.flags.writeable  # a read-only view of the file, not loaded
    text = tmp_path / "t.txt"
    text.write_text("1 2\n3 4\n")
    parsed = lio.create_file_reader(text, parser=lambda line: [np.array(line.split(), np.int64)])
    assert [x[0].tolist() for x in parsed] == [[1, 2], [3, 4]]

    class Csv(lio.FileReader):
        def _open(self, **options):
            self._rows = np.loadtxt(self.path, delimiter=",", ndmin=2)
            self._at = 0

        def _read_instance(self):
            if self._at >= len(self._rows):
                return None
            self._at += 1
            return [self._rows[self._at - 1]]

        def _rewind(self):
            self._at = 0

    lio.register_file_reader("csv", Csv)
    try:
        csv = tmp_path / "a.CSV"
        csv.write_text("1,2\n3,4\n")
        assert [x[0].tolist() for x in lio.FileReader(str(csv), [[-1, 2]], ["float64"])] == [[1, 2], [3, 4]]
        with lio.open_files([str(csv)], [[-1, 2]], ["float64"]) as r:
            assert len(list(r)) == 2
    finally:
        lio.unregister_file_reader("csv")
    with pytest.raises(UnknownFormatError) as info:
        lio.FileReader(str(tmp_path / "data.unknown"), None, None)
    for name in ("recordio", "npy", "npz", "text"):
        assert name in str(info.value)


def test_register_formats_from_a_config_table(tmp_path):
    import tomllib

    table = tomllib.loads(
        '[formats]\narr = "loader.io.formats_numpy:NpyFileReader"\n'
        'rows = { factory = "loader.io.formats_numpy:NpyFileReader", suffixes = [".rows", ".r2"] }\n'
    )["formats"]
    assert lio.register_formats(table) == ["arr", "rows"]
    try:
        for name in ("x.arr", "y.r2"):
            with open(tmp_path / name, "wb") as fh:
                np.save(fh, np.arange(6).reshape(3, 2))
            assert len(list(lio.FileReader(str(tmp_path / name), [[-1, 2]], ["int64"]))) == 3
    finally:
        lio.unregister_file_reader("arr")
        lio.unregister_file_reader("rows")
    with pytest.raises(ValueError):
        lio.register_formats({"bad": {"factroy": "x:y"}})


def test_register_file_reader_from_a_module_path_string(tmp_path):
    lio.register_file_reader("npyalias", "loader.io.formats_numpy:NpyFileReader", [".npyalias"])
    try:
        path = tmp_path / "x.npyalias"
        with open(path, "wb") as fh:
            np.save(fh, np.arange(4).reshape(2, 2))
        assert len(list(lio.create_file_reader(path))) == 2
    finally:
        lio.unregister_file_reader("npyalias")


# --- bridges -------------------------------------------------------------------------------


def test_bridges_compose_both_ways():
    base = lio.BatchReader(lio.from_reader(RangeReader(10), [[-1]], ["int64"]), 3)
    paddle = lio.to_reader(base)
    assert [b[0].tolist() for b in paddle()] == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    assert len(list(paddle())) == 4  # every call is a new pass
    mapped = paddle_reader.map_readers(lambda b: int(b[0].sum()), paddle)
    assert list(mapped()) == [3, 12, 21, 9]
    back = lio.from_reader(
        paddle_reader.firstn(lio.to_reader(lio.from_reader(RangeReader(5), [[-1]], ["int64"])), 3), [[-1]], ["int64"]
    )
    assert [int(x[0]) for x in back] == [0, 1, 2]
    assert threading.active_count() >= 1

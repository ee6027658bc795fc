"""open_files: exactly-once delivery across threads, ordering, errors with file names, prompt close."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import loader.io as lio
from loader.errors import ClosedError, CorruptFileError, ShapeMismatchError
from loader.io.multi_file import MultiFileReader
from loader.recordio import Writer

TIMEOUT_S = 30


def _write_files(directory: str, sizes: list[int], kinds: str = "npy") -> list[str]:
    """File ``i`` holds instances ``(i, j)`` for ``j < sizes[i]``, as .npy or .recordio."""
    paths = []
    for i, size in enumerate(sizes):
        rows = np.stack([np.full(size, i, np.int64), np.arange(size, dtype=np.int64)], axis=1)
        kind = kinds if kinds != "mixed" else ("npy" if i % 2 else "recordio")
        path = os.path.join(directory, f"f{i:03d}.{kind}")
        if kind == "npy":
            np.save(path, rows.reshape(size, 2))
        else:
            with Writer(path, max_num_records=7) as writer:
                for row in rows:
                    writer.write([row])
        paths.append(path)
    return paths


def _ids(reader) -> list[tuple[int, int]]:
    return [tuple(int(v) for v in item[0]) for item in reader]


def _expected(sizes: list[int]) -> list[tuple[int, int]]:
    return [(i, j) for i, size in enumerate(sizes) for j in range(size)]


@pytest.fixture
def workdir():
    directory = tempfile.mkdtemp(prefix="io_multi_")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.timeout(120)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sizes=st.lists(st.one_of(st.just(0), st.integers(1, 40), st.integers(200, 700)), min_size=1, max_size=9),
    thread_num=st.integers(1, 8),
    buffer_size=st.one_of(st.none(), st.integers(1, 4)),
    kinds=st.sampled_from(["npy", "recordio", "mixed"]),
)
def test_every_instance_exactly_once_per_pass(workdir, sizes, thread_num, buffer_size, kinds):
    directory = tempfile.mkdtemp(dir=workdir)
    paths = _write_files(directory, sizes, kinds)
    before = threading.active_count()
    with lio.open_files(
        paths, [[-1, 2]], ["int64"], thread_num=thread_num, buffer_size=buffer_size, pass_num=2
    ) as reader:
        got = _ids(reader)
    expected = _expected(sizes)
    assert Counter(got) == Counter(expected * 2)
    # records of one file keep their order within a pass
    half = len(got) // 2
    for part in (got[:half], got[half:]):
        for i in range(len(sizes)):
            mine = [j for f, j in part if f == i]
            assert mine == list(range(sizes[i]))
    deadline = time.monotonic() + 5
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() <= before


@pytest.mark.timeout(120)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    sizes=st.lists(st.one_of(st.just(0), st.integers(1, 300)), min_size=1, max_size=6),
    thread_num=st.integers(1, 8),
    stop_after=st.integers(0, 400),
    seed=st.integers(0, 2**16),
)
def test_reinit_anywhere_then_shuffled_batches_still_cover_everything_once(
    workdir, sizes, thread_num, stop_after, seed
):
    directory = tempfile.mkdtemp(dir=workdir)
    paths = _write_files(directory, sizes, "npy")
    source = lio.open_files(paths, [[-1, 2]], ["int64"], thread_num=thread_num, buffer_size=2)
    with lio.BatchReader(lio.ShuffleReader(source, 50, seed=seed), 7) as reader:
        for _ in range(stop_after):
            if not reader.read_next():
                break
        reader.reinit()
        got = [tuple(row) for batch in reader for row in batch[0].tolist()]
    assert Counter(got) == Counter(_expected(sizes))


@pytest.mark.timeout(TIMEOUT_S)
def test_is_test_reads_files_in_list_order(workdir, no_leaks):
    sizes = [5, 0, 300, 1, 40]
    paths = _write_files(workdir, sizes, "mixed")[::-1]  # list order differs from name order
    with lio.open_files(paths, [[-1, 2]], ["int64"], thread_num=4, is_test=True) as reader:
        assert reader.thread_num == 1
        got = _ids(reader)
    assert got == [(i, j) for i in reversed(range(len(sizes))) for j in range(sizes[i])]


@pytest.mark.timeout(TIMEOUT_S)
def test_defaults_and_single_name(workdir, no_leaks):
    paths = _write_files(workdir, [3, 4, 5])
    reader = lio.open_files(paths, [[-1, 2]], ["int64"])
    assert reader.thread_num == min(3, os.cpu_count() or 1) and reader.buffer_size == 3 * reader.thread_num
    assert reader.slot_names == ["data"]
    reader.close()
    with lio.open_files(paths[0], None, None) as single:
        assert len(_ids(single)) == 3
    with pytest.raises(ValueError, match="no file"):
        lio.open_files([], None, None)
    for bad in ({"thread_num": 0}, {"buffer_size": 0}, {"pass_num": 0}):
        with pytest.raises(ValueError):
            lio.open_files(paths, None, None, **bad)


@pytest.mark.timeout(TIMEOUT_S)
def test_reinit_mid_pass_starts_a_clean_pass(workdir, no_leaks):
    sizes = [500, 300, 0, 700]
    paths = _write_files(workdir, sizes)
    with lio.open_files(paths, [[-1, 2]], ["int64"], thread_num=3, buffer_size=2) as reader:
        for _ in range(123):
            reader.read_next()
        assert reader.has_next()
        reader.reinit()
        assert Counter(_ids(reader)) == Counter(_expected(sizes))
        assert reader.read_next() == []
        reader.reinit()
        assert len(_ids(reader)) == sum(sizes)


@pytest.mark.timeout(TIMEOUT_S)
def test_read_block_hands_over_views_and_mixes_with_read_next(workdir, no_leaks):
    sizes = [1000, 10]
    paths = _write_files(workdir, sizes)
    with lio.open_files(paths, [[-1, 2]], ["int64"], is_test=True) as reader:
        got = []
        assert reader.has_next()
        while True:
            block = reader.read_block(37)
            if not block:
                break
            assert 1 <= len(block[0]) <= 37
            got += [tuple(row) for row in block[0].tolist()]
            item = reader.read_next()
            if item:
                got.append(tuple(item[0].tolist()))
        assert not reader.has_next() and reader.read_block(5) == []  # a looked-ahead end stays the end
    assert got == _expected(sizes)
    with pytest.raises(ClosedError):
        reader.read_block(5)


@pytest.mark.timeout(TIMEOUT_S)
def test_corrupt_file_error_reaches_consumer_with_the_file_name(workdir, no_leaks):
    paths = _write_files(workdir, [50, 50, 50], "recordio")
    data = bytearray(open(paths[1], "rb").read())
    data[-2] ^= 0x55
    open(paths[1], "wb").write(bytes(data))
    reader = lio.open_files(paths, [[-1, 2]], ["int64"], thread_num=2)
    with pytest.raises(CorruptFileError, match=os.path.basename(paths[1])):
        _ids(reader)
    with pytest.raises(CorruptFileError):
        reader.read_next()  # sticky until reinit
    reader.close()


@pytest.mark.timeout(TIMEOUT_S)
def test_shape_errors_and_missing_files_name_the_file(workdir, no_leaks):
    paths = _write_files(workdir, [20, 20])
    with pytest.raises(ShapeMismatchError, match=r"f00[01]\.npy: record 0"):
        _ids(lio.open_files(paths, [[-1, 3]], ["int64"], thread_num=2))
    missing = os.path.join(workdir, "missing.npy")
    with pytest.raises(FileNotFoundError) as info:
        _ids(lio.open_files([missing], None, None, thread_num=1))
    assert "missing.npy" in str(info.value)


class ExplodingFormat(lio.FileReader):
    """Raises a plain KeyError (not a loader error) after 3 rows."""

    def __init__(self, path, shapes=None, dtypes=None, lod_levels=None):
        super().__init__(path, shapes, dtypes, lod_levels)
        self.i = 0

    def _read_instance(self):
        self.i += 1
        if self.i > 3:
            raise KeyError("user bug")
        return [np.array([self.i, 0])]

    def _rewind(self):
        self.i = 0


@pytest.mark.timeout(TIMEOUT_S)
def test_foreign_exceptions_keep_their_type_with_a_note_naming_the_file(workdir, no_leaks):
    path = os.path.join(workdir, "x.boom")
    open(path, "w").close()
    lio.register_file_reader("boom", ExplodingFormat)
    try:
        with pytest.raises(KeyError) as info:
            _ids(lio.open_files([path], None, None))
    finally:
        lio.unregister_file_reader("boom")
    assert any("x.boom" in note for note in info.value.__notes__)


@pytest.mark.timeout(TIMEOUT_S)
def test_close_mid_pass_stops_every_thread_promptly(workdir, no_leaks):
    paths = _write_files(workdir, [2000] * 6)
    reader = lio.open_files(paths, [[-1, 2]], ["int64"], thread_num=4, buffer_size=1)
    reader.read_next()
    time.sleep(0.05)  # let the producers fill the channel and block on it
    start = time.perf_counter()
    reader.close()
    assert time.perf_counter() - start < 1.0
    reader.close()


class SlowFormat(lio.FileReader):
    """A decoder-like format: every instance costs ``SECONDS_PER_INSTANCE`` of work; records the block sizes asked."""

    SECONDS_PER_INSTANCE = 0.03
    asked: list[tuple[str, int]] = []

    def _open(self):
        self.i = 0

    def _read_instance(self):
        time.sleep(self.SECONDS_PER_INSTANCE)  # the cost of decoding one instance, not a wait for anything
        self.i += 1
        return [np.array([self.i])] if self.i <= 10_000 else None

    def read_block(self, max_instances):
        SlowFormat.asked.append((self.path, max_instances))
        return super().read_block(max_instances)

    def _rewind(self):
        self.i = 0


@pytest.mark.timeout(TIMEOUT_S)
def test_close_is_prompt_over_a_slow_format_and_leaves_no_thread_reading(workdir, no_leaks):
    paths = [os.path.join(workdir, f"f{i}.slowfmt") for i in range(2)]
    lio.register_file_reader("slowfmt", SlowFormat)
    SlowFormat.asked = []
    try:
        reader = lio.open_files(paths, [[-1, 1]], ["int64"], thread_num=2, buffer_size=1)
        for _ in range(40):  # past both files' first blocks
            assert reader.read_next()
        start = time.perf_counter()
        reader.close()
        took = time.perf_counter() - start
    finally:
        lio.unregister_file_reader("slowfmt")
    # A block of 256 slow instances took 7.7 s: close() gave up after 5 s and left the threads reading.
    after_first = [count for path in paths for count in [c for p, c in SlowFormat.asked if p == path][1:]]
    assert after_first and max(after_first) == 1, SlowFormat.asked
    assert took < 1.0


@pytest.mark.timeout(TIMEOUT_S)
def test_abandoned_iteration_then_close(workdir, no_leaks):
    paths = _write_files(workdir, [300] * 4)
    with MultiFileReader(paths, thread_num=2) as reader:
        for n, _ in enumerate(reader):
            if n == 10:
                break


@pytest.mark.timeout(TIMEOUT_S)
def test_slot_names_skip_empty_recordio_files(workdir):
    empty = os.path.join(workdir, "a.recordio")
    with Writer(empty):
        pass
    with Writer(os.path.join(workdir, "b.recordio")) as writer:
        writer.write({"x": np.zeros(2), "y": 1})
    reader = lio.open_files([empty, os.path.join(workdir, "b.recordio")], None, None)
    assert reader.slot_names == ["x", "y"]
    reader.close()


@pytest.mark.timeout(TIMEOUT_S)
def test_readers_dropped_without_close_stop_their_threads(workdir, no_leaks):
    import gc

    paths = _write_files(workdir, [3000] * 3)
    reader = lio.DoubleBufferReader(lio.open_files(paths, [[-1, 2]], ["int64"], thread_num=3, buffer_size=1))
    reader.read_next()
    del reader
    gc.collect()


def test_npz_files_with_their_keys_in_another_order_are_joined_by_name(tmp_path) -> None:
    # Both slots have one shape and dtype: read by position, file b's label and weight were swapped silently.
    np.savez(tmp_path / "a.npz", label=np.array([1, 1]), weight=np.array([100, 100]))
    np.savez(tmp_path / "b.npz", weight=np.array([200, 200]), label=np.array([2, 2]))
    files = [str(tmp_path / "a.npz"), str(tmp_path / "b.npz")]
    reader = lio.open_files(files, shapes=[[-1], [-1]], dtypes=["int64", "int64"], is_test=True)
    assert reader.slot_names == ["label", "weight"]
    assert [tuple(int(v) for v in instance) for instance in reader] == [(1, 100), (1, 100), (2, 200), (2, 200)]

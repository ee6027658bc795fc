"""Acceptance test of the reader toolkit (``loader.reader``): every public name and stated behaviour.

Each test quotes the line of the toolkit's specification that it checks. Thread and process tests are
bounded by the suite's pytest timeout and by their own deadlines.
"""

from __future__ import annotations

import gc
import gzip
import inspect
import os
import signal
import struct
import threading
import time
import traceback
import zlib

import msgpack
import numpy as np
import pytest

import loader
from loader import reader
from loader.errors import CorruptFileError, WorkerDiedError, WorkerError
from loader.reader import creator
from tests.helpers import (
    Boom,
    CpuWhileWaiting,
    ListReader,
    RangeReader,
    child_pids,
    exit_with,
    live_threads,
    open_fd_count,
    raise_on,
)

EMPTY = inspect.Parameter.empty


def _params(fn) -> list[tuple[str, object]]:
    return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()]


# --- names and signatures ------------------------------------------------------------------


def test_public_names_and_signatures_are_exactly_as_stated():
    assert _params(reader.map_readers) == [("func", EMPTY), ("readers", EMPTY)]
    assert inspect.signature(reader.map_readers).parameters["readers"].kind is inspect.Parameter.VAR_POSITIONAL
    assert _params(reader.buffered) == [("reader", EMPTY), ("size", EMPTY)]
    assert _params(reader.compose) == [("readers", EMPTY), ("check_alignment", True)]
    assert _params(reader.chain) == [("readers", EMPTY)]
    assert _params(reader.shuffle) == [("reader", EMPTY), ("buf_size", EMPTY), ("seed", None)]
    assert _params(reader.firstn) == [("reader", EMPTY), ("n", EMPTY)]
    assert _params(reader.xmap_readers) == [
        ("mapper", EMPTY),
        ("reader", EMPTY),
        ("process_num", EMPTY),
        ("buffer_size", EMPTY),
        ("order", False),
    ]
    assert _params(reader.multiprocess_reader) == [("readers", EMPTY), ("use_pipe", True), ("queue_size", 1000)]
    assert _params(reader.cache) == [("reader", EMPTY)]
    assert _params(reader.Fake()) == [("reader", EMPTY), ("data_num", EMPTY)]
    assert _params(reader.PipeReader) == [("command", EMPTY), ("bufsize", 8192), ("file_type", "plain")]
    assert _params(reader.PipeReader("true").get_line) == [("cut_lines", True), ("line_break", "\n")]
    assert _params(creator.np_array) == [("x", EMPTY)]
    assert _params(creator.text_file) == [("path", EMPTY)]
    assert _params(creator.recordio) == [("paths", EMPTY), ("buf_size", 100), ("allow_pickle", False)]
    assert _params(loader.batch) == [("reader", EMPTY), ("batch_size", EMPTY), ("drop_last", False)]
    params = _params(loader.recordio.convert_reader_to_recordio_file)
    assert [name for name, _ in params] == ["filename", "reader_creator", "compressor", "max_num_records"]
    assert params[3][1] == 1000
    assert issubclass(reader.ComposeNotAligned, ValueError)
    assert callable(loader.recordio.Writer) and callable(loader.recordio.Scanner)


# --- the decorators ------------------------------------------------------------------------


def test_map_readers_applies_func_to_items_in_step():
    r = reader.map_readers(lambda a, b: a * 10 + b, RangeReader(4), RangeReader(5, start=1))
    assert list(r()) == [1, 12, 23, 34]


def test_compose_flattens_tuples_and_detects_misalignment():
    assert list(reader.compose(RangeReader(3), RangeReader(3))()) == [(0, 0), (1, 1), (2, 2)]
    assert list(reader.compose(ListReader([(1, 2)]), ListReader([3]), ListReader([[4, 5]]))()) == [(1, 2, 3, [4, 5])]
    got = []
    with pytest.raises(reader.ComposeNotAligned):
        for row in reader.compose(reader.chain(RangeReader(10), RangeReader(10)), RangeReader(10))():
            got.append(row)
    assert len(got) == 10
    unchecked = reader.compose(reader.chain(RangeReader(10), RangeReader(10)), RangeReader(10), check_alignment=False)
    assert len(list(unchecked())) == 10


def test_chain_firstn_cache_fake():
    assert list(reader.chain(RangeReader(2), RangeReader(3))()) == [0, 1, 0, 1, 2]
    assert list(reader.firstn(RangeReader(10), 3)()) == [0, 1, 2]
    calls = []

    def counted():
        calls.append(1)
        return iter([1, 2])

    cached = reader.cache(counted)
    assert list(cached()) == list(cached()) == [1, 2] and len(calls) == 1
    fake = reader.Fake()(RangeReader(10, start=7), 4)
    assert list(fake()) == [7, 7, 7, 7]
    assert list(fake()) == [7, 7, 7, 7]


def test_shuffle_blocks_seed_and_fresh_randomness():
    data = RangeReader(100)
    first = list(reader.shuffle(data, 10, seed=3)())
    assert first == list(reader.shuffle(data, 10, seed=3)())  # reproducible with a seed
    assert first != list(range(100))
    for block in range(10):  # blocks of buf_size items: nothing crosses a block boundary
        assert sorted(first[block * 10 : block * 10 + 10]) == list(range(block * 10, block * 10 + 10))
    assert list(reader.shuffle(data, 0)()) == list(range(100))
    assert list(reader.shuffle(data, 1)()) == list(range(100))
    unseeded = reader.shuffle(data, 100)
    assert list(unseeded()) != list(unseeded())  # fresh randomness (equal with probability 1/100!)


@pytest.mark.parametrize("size", [0, -1])
def test_buffered_size_zero_or_less_is_unbounded(size):
    pulled = []

    def source():
        for i in range(200):
            pulled.append(i)
            yield i

    it = reader.buffered(source, size)()
    assert next(it) == 0
    deadline = time.monotonic() + 5
    while len(pulled) < 200 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(pulled) == 200  # the producer never blocked on a full buffer
    assert list(it) == list(range(1, 200))


def test_buffered_size_bounds_prefetch():
    pulled = []

    def source():
        for i in range(200):
            pulled.append(i)
            yield i

    it = reader.buffered(source, 5)()
    next(it)
    time.sleep(0.3)
    assert len(pulled) <= 5 + 3  # buffer + the item in hand + one blocked in put
    it.close()


def test_batch_lists_drop_last_and_eager_validation():
    assert list(loader.batch(RangeReader(5), 2)()) == [[0, 1], [2, 3], [4]]
    assert list(loader.batch(RangeReader(5), 2, drop_last=True)()) == [[0, 1], [2, 3]]
    called = []

    def never():
        called.append(1)
        return iter([])

    for bad in (0, -3):
        with pytest.raises(ValueError):
            loader.batch(never, bad)  # raised when the batch reader is made
    assert not called


# --- failures reach the consumer, never a hang ----------------------------------------------


def _assert_carries_origin(exc: BaseException, type_name: str, message: str, frame: str) -> None:
    if isinstance(exc, WorkerError):
        assert exc.type_name == type_name and message in exc.message
        assert frame in exc.remote_traceback and "Traceback" in exc.remote_traceback
    else:
        assert type(exc).__name__ == type_name and message in str(exc)
        assert frame in "".join(traceback.format_exception(exc))


def test_source_exception_through_buffered_carries_type_message_traceback():
    got = []
    with pytest.raises(Boom) as info:
        for x in reader.buffered(raise_on(3, "source broke"), 2)():
            got.append(x)
    assert got == [0, 1, 2]
    _assert_carries_origin(info.value, "Boom", "source broke at sample 3", "_gen")


@pytest.mark.parametrize("order", [False, True])
def test_mapper_exception_through_xmap_carries_type_message_traceback(order):
    with pytest.raises(Boom) as info:
        list(reader.xmap_readers(raise_on(5, "mapper broke"), RangeReader(20), 3, 4, order=order)())
    _assert_carries_origin(info.value, "Boom", "mapper broke at sample 5", "__call__")


@pytest.mark.parametrize("use_pipe", [True, False])
def test_child_exception_carries_type_message_traceback(use_pipe, no_leaks):
    with pytest.raises(WorkerError) as info:
        list(reader.multiprocess_reader([RangeReader(5), raise_on(2, "child broke")], use_pipe)())
    _assert_carries_origin(info.value, "Boom", "child broke at sample 2", "_gen")
    assert "Boom" in str(info.value) and "child broke" in str(info.value)


def _sigkill_self():
    yield 0
    os.kill(os.getpid(), signal.SIGKILL)
    yield 1  # never reached


@pytest.mark.parametrize("use_pipe", [True, False])
@pytest.mark.parametrize("culprit, code", [(exit_with(7, after=2), 7), (_sigkill_self, -signal.SIGKILL)])
def test_silent_child_death_is_reported_within_seconds_with_exit_code(use_pipe, culprit, code, no_leaks):
    start = time.monotonic()
    with pytest.raises(WorkerDiedError) as info:
        list(reader.multiprocess_reader([culprit, RangeReader(3)], use_pipe)())
    assert time.monotonic() - start < 5.0
    assert info.value.exitcode == code
    assert str(abs(code)) in str(info.value)


# --- abandoning stops everything -----------------------------------------------------------


def test_thousand_abandoned_decorated_readers_leave_nothing(tmp_path, no_leaks):
    path = tmp_path / "lines.txt"
    path.write_text("".join(f"{i}\n" for i in range(100)))
    stack = reader.xmap_readers(
        str.upper, reader.buffered(reader.shuffle(creator.text_file(path), 10, seed=1), 4), 2, 4, order=True
    )
    threads, fds = live_threads(), open_fd_count()
    for i in range(1000):
        it = stack()
        next(it)
        if i % 3 == 0:
            it.close()
        elif i % 3 == 1:
            for _ in it:
                break
        else:
            del it
    gc.collect()
    deadline = time.monotonic() + 5
    while (live_threads() - threads or open_fd_count() > fds) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert live_threads() - threads == set()
    assert open_fd_count() <= fds


def test_abandoned_multiprocess_and_pipe_readers_leave_no_processes(tmp_path, no_leaks):
    children, fds = child_pids(), open_fd_count()
    # 40 here; tests/unit/reader/test_multiprocess.py abandons 100 more (forks are the slow part).
    for i in range(40):
        it = reader.multiprocess_reader([RangeReader(100_000), RangeReader(100_000)], bool(i % 2), 10)()
        next(it)
        if i % 4:
            it.close()  # else: dropped while running, closed by garbage collection
        del it
    for _ in range(100):
        lines = reader.PipeReader(["yes", "y"]).get_line()
        assert next(lines) == "y"
        del lines
    gc.collect()
    deadline = time.monotonic() + 5
    while child_pids() - children and time.monotonic() < deadline:
        time.sleep(0.02)
    assert child_pids() - children == set()
    assert open_fd_count() <= fds


def test_xmap_order_keeps_order_without_busy_waiting():
    # Item 0's mapping is held at a gate; the three other handlers map items 1-3 and wait for
    # their turn. Their CPU while they wait is measured on their own clocks: a busy-wait burns
    # about the whole window (one core among them), a blocking wait almost nothing.
    probe = CpuWhileWaiting()
    waiting: set[threading.Thread] = set()

    def first_waits(x):
        if x == 0:
            probe.gate.wait(probe.GATE_TIMEOUT_S)
        else:
            waiting.add(threading.current_thread())
        return x * 2

    measuring = probe.hold(lambda: list(waiting), ready=lambda: len(waiting) == 3)
    out = list(reader.xmap_readers(first_waits, RangeReader(40), 4, 8, order=True)())
    measuring.join(probe.GATE_TIMEOUT_S)
    assert out == [x * 2 for x in range(40)]
    assert probe.used_s is not None, "the other handlers never mapped their items"
    assert probe.used_s < probe.WINDOW_S / 3, f"waiting handlers used {probe.used_s:.3f} s of CPU"


@pytest.mark.parametrize("use_pipe", [True, False])
def test_multiprocess_reader_keeps_sample_types(use_pipe, no_leaks):
    samples = [(i, np.arange(3, dtype=np.int16) + i, {"k": i, 2: ("t", 1.5)}, [i]) for i in range(4)]
    got = list(reader.multiprocess_reader([ListReader(samples[:2]), ListReader(samples[2:])], use_pipe)())
    assert len(got) == 4
    for sample in got:
        assert type(sample) is tuple
        original = samples[sample[0]]
        assert type(sample[1]) is np.ndarray and sample[1].dtype == np.int16
        np.testing.assert_array_equal(sample[1], original[1])
        assert sample[2] == original[2] and type(sample[2][2]) is tuple and 2 in sample[2]
        assert type(sample[3]) is list


# --- PipeReader ---------------------------------------------------------------------------


def test_pipe_reader_string_command_split_like_a_shell_and_unterminated_last_line(no_leaks):
    lines = list(reader.PipeReader("printf 'a b\\nlast'").get_line())
    assert lines == ["a b", "last"]
    assert list(reader.PipeReader(["printf", "x y\\nz\\n"]).get_line()) == ["x y", "z"]
    chunks = "".join(reader.PipeReader(["printf", "p\\nq"], bufsize=1).get_line(cut_lines=False))
    assert chunks == "p\nq"
    assert list(reader.PipeReader(["printf", "a;b;c"]).get_line(line_break=";")) == ["a", "b", "c"]


def test_pipe_reader_multi_member_gzip_and_utf8_across_chunks(tmp_path, no_leaks):
    path = tmp_path / "two.gz"
    path.write_bytes(gzip.compress("héllo\n€uro\n".encode()) + gzip.compress(b"zweites\n"))
    assert list(reader.PipeReader(["cat", str(path)], bufsize=3, file_type="gzip").get_line()) == [
        "héllo",
        "€uro",
        "zweites",
    ]
    text = tmp_path / "u.txt"
    text.write_text("ünïcødé €\n")
    assert list(reader.PipeReader(["cat", str(text)], bufsize=1).get_line()) == ["ünïcødé €"]


# --- creators -----------------------------------------------------------------------------


def test_np_array_of_0d_array_yields_it_once_and_rows_otherwise():
    got = list(creator.np_array(np.array(5))())
    assert len(got) == 1 and got[0] == 5
    rows = list(creator.np_array(np.array([[1, 2, 3], [4, 5, 6]], np.int32))())
    assert [list(r) for r in rows] == [[1, 2, 3], [4, 5, 6]]


def test_text_file_closes_its_file_when_abandoned(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("a\nb\n\nc")
    assert list(creator.text_file(path)()) == ["a", "b", "", "c"]
    fds = open_fd_count()
    it = creator.text_file(path)()
    next(it)
    assert open_fd_count() == fds + 1
    it.close()
    assert open_fd_count() == fds


def test_creator_recordio_path_list_comma_string_and_glob(tmp_path):
    for name, start in (("a-0.recordio", 0), ("a-1.recordio", 10)):
        n = loader.recordio.convert_reader_to_recordio_file(str(tmp_path / name), RangeReader(start + 3, start))
        assert n == 3
    a, b = str(tmp_path / "a-0.recordio"), str(tmp_path / "a-1.recordio")
    assert list(creator.recordio(a)()) == [0, 1, 2]
    assert list(creator.recordio([a, b])()) == [0, 1, 2, 10, 11, 12]
    assert list(creator.recordio(f"{a},{b}")()) == [0, 1, 2, 10, 11, 12]
    assert list(creator.recordio(str(tmp_path / "a-*.recordio"), buf_size=1)()) == [0, 1, 2, 10, 11, 12]


# --- RecordIO ------------------------------------------------------------------------------


def _chunks(data: bytes) -> list[tuple[int, tuple[int, ...], bytes]]:
    out, pos = [], 0
    while pos < len(data):
        header = struct.unpack_from("<5I", data, pos)
        stored = data[pos + 20 : pos + 20 + header[4]]
        out.append((pos, header, stored))
        pos += 20 + header[4]
    return out


@pytest.mark.parametrize("compressor", [loader.recordio.Compressor.NONE, loader.recordio.Compressor.ZLIB])
def test_recordio_file_is_a_run_of_checked_chunks(tmp_path, compressor):
    path = tmp_path / "f.recordio"
    samples = [{"x": np.arange(i + 1, dtype=np.float32), "y": (i, "s")} for i in range(7)]
    n = loader.recordio.convert_reader_to_recordio_file(
        str(path), ListReader(samples), compressor=compressor, max_num_records=3
    )
    assert n == 7
    chunks = _chunks(path.read_bytes())
    assert [header[1] for _, header, _ in chunks] == [3, 3, 1]  # record counts
    for _, (magic, _count, crc, comp, size), stored in chunks:
        assert magic == 0x01020304 and comp == int(compressor) and size == len(stored)
        assert crc == zlib.crc32(stored)  # CRC32 of the stored (compressed) bytes
    payload = chunks[0][2] if compressor == loader.recordio.Compressor.NONE else zlib.decompress(chunks[0][2])
    (length,) = struct.unpack_from("<I", payload, 0)
    record = msgpack.unpackb(payload[4 : 4 + length], raw=False, strict_map_key=False, ext_hook=lambda c, d: ("ext", c))
    assert set(record) == {"x", "y"}  # msgpack, not pickle
    with loader.recordio.Scanner(str(path)) as scanner:
        got = list(scanner)
    assert len(got) == 7
    for a, b in zip(got, samples):
        np.testing.assert_array_equal(a["x"], b["x"])
        assert a["x"].dtype == np.float32 and a["y"] == b["y"]


def test_recordio_writer_scanner_roundtrip_and_never_unpickles(tmp_path):
    import pickle

    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    path = tmp_path / "evil.recordio"
    with loader.recordio.Writer(str(path)) as writer:
        writer.write((1, "ok"))
        writer.write_raw(pickle.dumps(Evil()))
    with loader.recordio.Scanner(str(path)) as scanner:
        assert next(iter(scanner)) == (1, "ok")
        with pytest.raises(loader.recordio.PickledRecordError, match="allow_pickle=True"):
            list(scanner)  # a pickle is named as one, and left alone without the opt-in
    with loader.recordio.Scanner(str(path), allow_pickle=True) as scanner:
        assert next(iter(scanner)) == (1, "ok")
        with pytest.raises(loader.recordio.UnsafePickleError, match="builtins.open|io.open"):
            list(scanner)  # with it, the restricted unpickler refuses the global by name
    assert not marker.exists()


def test_corrupt_recordio_chunk_names_file_and_byte_offset(tmp_path):
    path = tmp_path / "c.recordio"
    loader.recordio.convert_reader_to_recordio_file(str(path), RangeReader(6), max_num_records=2)
    data = bytearray(path.read_bytes())
    offset = _chunks(bytes(data))[1][0]
    data[offset + 21] ^= 0xFF  # a payload byte of the second chunk
    path.write_bytes(bytes(data))
    got = []
    with pytest.raises(CorruptFileError) as info:
        for x in creator.recordio(str(path))():
            got.append(x)
    assert got == [0, 1]
    assert str(path) in str(info.value) and f"offset {offset}" in str(info.value)
    assert isinstance(info.value, ValueError)

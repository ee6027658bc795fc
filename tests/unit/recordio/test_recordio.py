"""RecordIO: chunk framing, round trips, and every kind of damage reported with its offset."""

from __future__ import annotations

import io
import os
import random
import struct
import zlib

import numpy as np
import pytest

import loader
from loader import recordio
from loader.errors import ClosedError, CorruptFileError
from loader.recordio import (
    HEADER,
    MAGIC,
    Compressor,
    Scanner,
    Writer,
    convert_reader_to_recordio_file,
    convert_reader_to_recordio_files,
)
from tests.helpers import ListReader, RangeReader

COMPRESSORS = [Compressor.NONE, Compressor.ZLIB, Compressor.SNAPPY]

SAMPLES = [
    None,
    True,
    0,
    -(2**63),
    2**64 - 1,
    3.5,
    "héllo",
    b"\x00\xff",
    [1, [2, 3]],
    (1, "a", (2.0,)),
    {"x": 1, 2: "two"},
    np.arange(12, dtype=np.float32).reshape(3, 4),
    np.zeros((0, 5), dtype=np.int64),
    np.array(7, dtype=np.uint8),
    np.float16(1.5),
    (np.ones((2, 2), dtype=np.complex64), np.array([1], dtype=np.int8)),
    {"img": np.arange(6, dtype=np.float64).reshape(2, 3)[:, ::2], "label": 3},
]


def _equal(a, b) -> bool:
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    if isinstance(a, np.generic):
        return type(a) is type(b) and a == b
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return type(b) is dict and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _write(path, samples, compressor=Compressor.NONE, max_num_records=1000):
    with Writer(path, compressor, max_num_records) as writer:
        for sample in samples:
            writer.write(sample)
    return path


def _chunk_offsets(path) -> list[int]:
    data = open(path, "rb").read()
    offsets, pos = [], 0
    while pos < len(data):
        offsets.append(pos)
        size = HEADER.unpack_from(data, pos)[4]
        pos += HEADER.size + size
    return offsets


@pytest.mark.parametrize("compressor", COMPRESSORS)
def test_round_trip_of_many_types(tmp_path, compressor):
    path = _write(tmp_path / "a.recordio", SAMPLES, compressor, max_num_records=4)
    with Scanner(path) as scanner:
        got = list(scanner)
    assert len(got) == len(SAMPLES)
    for want, have in zip(SAMPLES, got):
        assert _equal(want, have), (want, have)


def test_header_is_five_little_endian_uint32_in_fluid_order(tmp_path):
    path = tmp_path / "h.recordio"
    with Writer(path, Compressor.NONE) as writer:
        writer.write_raw(b"12345\x00")
        writer.write_raw(b"123\x00")
    data = open(path, "rb").read()
    assert data[:4] == b"\x04\x03\x02\x01"
    magic, count, crc, comp, size = struct.unpack("<5I", data[:20])
    assert (magic, count, comp, size) == (MAGIC, 2, 0, 18)
    assert crc == zlib.crc32(data[20:])
    assert data[20:] == struct.pack("<I", 6) + b"12345\x00" + struct.pack("<I", 4) + b"123\x00"


def test_zlib_chunks_use_id_2_and_checksum_the_stored_bytes(tmp_path):
    path = _write(tmp_path / "z.recordio", ["ab" * 500], Compressor.ZLIB)
    data = open(path, "rb").read()
    _, _, crc, comp, size = struct.unpack("<5I", data[:20])
    assert comp == 2 and size == len(data) - 20 < 1000
    assert crc == zlib.crc32(data[20:])
    assert Compressor.GZIP is Compressor.ZLIB


def test_paddles_compressor_names_are_aliases():
    # fluid.recordio_writer.Compressor exposed only Snappy and NoCompress: code written for it uses those names.
    assert Compressor.Snappy is Compressor.SNAPPY and Compressor.NoCompress is Compressor.NONE


@pytest.mark.parametrize("compressor", COMPRESSORS)
def test_records_split_into_chunks_of_max_num_records(tmp_path, compressor):
    path = _write(tmp_path / "m.recordio", list(range(10)), compressor, max_num_records=3)
    assert len(_chunk_offsets(path)) == 4  # 3 + 3 + 3 + 1
    with Scanner(path) as scanner:
        assert list(scanner) == list(range(10))


def test_chunks_also_split_by_bytes(tmp_path):
    path = tmp_path / "b.recordio"
    with Writer(path, max_num_records=1000, max_chunk_bytes=100) as writer:
        for _ in range(10):
            writer.write_raw(b"x" * 40)
    assert len(_chunk_offsets(path)) == 5
    buffer = io.BytesIO()
    with Writer(buffer, max_chunk_bytes=10) as writer:
        for raw in (b"a", b"x" * 20, b"b"):  # the big one gets a chunk of its own
            writer.write_raw(raw)
    buffer.seek(0)
    assert list(Scanner(buffer).raw_records()) == [b"a", b"x" * 20, b"b"]
    data = buffer.getvalue()
    assert HEADER.unpack_from(data, 0)[1] == 1 and HEADER.unpack_from(data, 25)[1] == 1


def test_raw_records_reset_and_empty_records(tmp_path):
    path = tmp_path / "r.recordio"
    with Writer(path, max_num_records=2) as writer:
        for raw in [b"ABC", b"", b"CDE", b"\x00" * 5]:
            writer.write_raw(raw)
    with Scanner(path) as scanner:
        assert scanner.next_raw() == b"ABC"
        assert list(scanner.raw_records()) == [b"", b"CDE", b"\x00" * 5]
        assert scanner.next_raw() is None
        assert scanner.next_raw() is None  # stays at the end
        scanner.reset()
        assert list(scanner.raw_records()) == [b"ABC", b"", b"CDE", b"\x00" * 5]


def test_empty_file_yields_nothing(tmp_path):
    path = tmp_path / "e.recordio"
    with Writer(path):
        pass
    assert os.path.getsize(path) == 0
    with Scanner(path) as scanner:
        assert list(scanner) == []
        assert scanner.next_raw() is None


def test_file_objects_are_left_open(tmp_path):
    buffer = io.BytesIO()
    with Writer(buffer, max_num_records=2) as writer:
        for i in range(5):
            writer.write(i)
    assert not buffer.closed
    buffer.seek(0)
    with Scanner(buffer) as scanner:
        assert list(scanner) == [0, 1, 2, 3, 4]
    assert not buffer.closed


def test_close_is_idempotent_and_use_after_close_raises(tmp_path):
    path = tmp_path / "c.recordio"
    writer = Writer(path)
    writer.write(1)
    writer.close()
    writer.close()
    with pytest.raises(ClosedError):
        writer.write(2)
    scanner = Scanner(path)
    scanner.close()
    scanner.close()
    with pytest.raises(ClosedError):
        scanner.next_raw()


def test_exit_by_exception_keeps_records_written(tmp_path):
    path = tmp_path / "x.recordio"
    with pytest.raises(KeyError):
        with Writer(path, max_num_records=10) as writer:
            writer.write("kept")
            raise KeyError("boom")
    with Scanner(path) as scanner:
        assert list(scanner) == ["kept"]


def test_unknown_compressors_are_refused_early():
    with pytest.raises(ValueError):
        Writer(io.BytesIO(), 7)


def test_default_compressor_is_none():
    assert recordio.DEFAULT_COMPRESSOR is Compressor.NONE


def test_objects_are_never_pickled(tmp_path):
    with pytest.raises(TypeError):
        with Writer(tmp_path / "p.recordio") as writer:
            writer.write(object())


def test_a_sample_that_cannot_be_written_names_the_file_and_record(tmp_path):
    path = tmp_path / "bad.recordio"
    samples = [1, 2, (3, {4, 5}), 6]
    with pytest.raises(TypeError) as info:
        convert_reader_to_recordio_file(path, ListReader(samples))
    message = str(info.value)
    assert f"RecordIO writer for {path}: record 2 cannot be written" in message
    assert "type set" in message and "numpy arrays" in message
    assert [sample for sample in Scanner(path)] == [1, 2]  # the records before it are kept


def test_convert_reader_to_recordio_file(tmp_path):
    path = tmp_path / "conv.recordio"
    count = convert_reader_to_recordio_file(path, RangeReader(2500), Compressor.ZLIB, max_num_records=1000)
    assert count == 2500
    assert len(_chunk_offsets(path)) == 3
    with Scanner(path) as scanner:
        assert list(scanner) == list(range(2500))


@pytest.mark.parametrize("total,per_file,sizes", [(10, 3, [3, 3, 3, 1]), (6, 3, [3, 3]), (2, 5, [2]), (0, 4, [])])
def test_convert_reader_to_recordio_files_writes_every_sample_once(tmp_path, total, per_file, sizes):
    paths = convert_reader_to_recordio_files(tmp_path / "part.recordio", per_file, RangeReader(total))
    assert [os.path.basename(p) for p in paths] == [f"part-{i:05d}.recordio" for i in range(len(sizes))]
    got = []
    for path, size in zip(paths, sizes):
        with Scanner(path) as scanner:
            items = list(scanner)
        assert len(items) == size
        got += items
    assert got == list(range(total))


def test_convert_reader_to_recordio_files_checks_arguments(tmp_path):
    with pytest.raises(ValueError, match="recordio"):
        convert_reader_to_recordio_files(tmp_path / "a.bin", 2, ListReader([1]))
    with pytest.raises(ValueError):
        convert_reader_to_recordio_files(tmp_path / "a.recordio", 0, ListReader([1]))


# -- corruption ----------------------------------------------------------------


def _three_chunks(tmp_path, compressor=Compressor.NONE):
    path = _write(tmp_path / "c.recordio", [np.arange(i, i + 8) for i in range(9)], compressor, max_num_records=3)
    offsets = _chunk_offsets(path)
    assert len(offsets) == 3
    return path, offsets


def _patch(path, offset, data: bytes) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(data)


def _read_all(path):
    with Scanner(path) as scanner:
        return list(scanner)


def _expect_corrupt(path, offset, reason):
    with pytest.raises(CorruptFileError, match=reason) as info:
        _read_all(path)
    message = str(info.value)
    assert str(path) in message and f"byte offset {offset}:" in message
    return info.value


def test_bad_magic(tmp_path):
    path, offsets = _three_chunks(tmp_path)
    _patch(path, offsets[1], b"\x00\x00\x00\x00")
    _expect_corrupt(path, offsets[1], "bad magic")


@pytest.mark.parametrize("compressor", COMPRESSORS)
def test_crc_mismatch(tmp_path, compressor):
    path, offsets = _three_chunks(tmp_path, compressor)
    pos = offsets[2] + HEADER.size + 5
    data = open(path, "rb").read()
    _patch(path, pos, bytes([data[pos] ^ 0xFF]))
    _expect_corrupt(path, offsets[2], "CRC32 mismatch")


def test_truncated_header(tmp_path):
    path, offsets = _three_chunks(tmp_path)
    with open(path, "ab") as fh:
        fh.write(HEADER.pack(MAGIC, 1, 0, 0, 10)[:11])
    _expect_corrupt(path, os.path.getsize(path) - 11, "truncated header")


def test_truncated_payload(tmp_path):
    path, offsets = _three_chunks(tmp_path)
    os.truncate(path, os.path.getsize(path) - 3)
    _expect_corrupt(path, offsets[2], "truncated payload")


def test_huge_size_field_does_not_allocate(tmp_path):
    path, offsets = _three_chunks(tmp_path)
    _patch(path, offsets[0] + 16, struct.pack("<I", 0xFFFFFFF0))
    _expect_corrupt(path, offsets[0], "truncated payload")


def _raw_chunk(path, count: int, compressor: Compressor, stored: bytes) -> None:
    """A file of one chunk whose stored bytes are ``stored``, with a valid CRC."""
    path.write_bytes(HEADER.pack(MAGIC, count, zlib.crc32(stored), int(compressor), len(stored)) + stored)


def test_zlib_payload_is_inflated_only_up_to_the_format_limit(tmp_path, monkeypatch):
    from loader.recordio import chunks

    payload = struct.pack("<I", 4000) + bytes(4000)  # one record of 4000 zero bytes: a 1:100 deflate
    path = tmp_path / "bomb.recordio"
    _raw_chunk(path, 1, Compressor.ZLIB, zlib.compress(payload))
    monkeypatch.setattr(chunks, "MAX_UINT32", 1000)  # stands for the real 4 GiB bound
    _expect_corrupt(path, 0, "zlib payload inflates past 1000 bytes")


def test_cut_off_zlib_stream_with_a_valid_checksum(tmp_path):
    path = tmp_path / "cut.recordio"
    _raw_chunk(path, 1, Compressor.ZLIB, zlib.compress(struct.pack("<I", 3) + b"abc")[:-4])
    _expect_corrupt(path, 0, "zlib payload does not inflate")


def test_record_count_mismatch(tmp_path):
    path, offsets = _three_chunks(tmp_path)
    _patch(path, offsets[1] + 4, struct.pack("<I", 4))
    _expect_corrupt(path, offsets[1], "records")
    _patch(path, offsets[1] + 4, struct.pack("<I", 2))
    _expect_corrupt(path, offsets[1], "left over")


def test_unknown_compressor(tmp_path):
    path, offsets = _three_chunks(tmp_path)
    _patch(path, offsets[0] + 12, struct.pack("<I", 9))
    _expect_corrupt(path, offsets[0], "unknown compressor")


def test_undecodable_record_with_a_valid_checksum(tmp_path):
    path = tmp_path / "u.recordio"
    with Writer(path, max_num_records=2) as writer:
        writer.write(1)
        writer.write(2)
        writer.write_raw(b"\xc1")  # a msgpack byte that is never valid
    offsets = _chunk_offsets(path)
    error = _expect_corrupt(path, offsets[1], r"record 2 cannot be decoded \(FormatError\)")  # it said "()"
    assert isinstance(error, ValueError)  # DataError is also a ValueError


def test_error_repeats_instead_of_drifting(tmp_path):
    path, offsets = _three_chunks(tmp_path)
    _patch(path, offsets[1], b"\x00")
    with Scanner(path) as scanner:
        for _ in range(2):
            with pytest.raises(CorruptFileError, match=f"byte offset {offsets[1]}:"):
                list(scanner)


@pytest.mark.parametrize("compressor", COMPRESSORS)
def test_fuzz_random_byte_flips_raise_corrupt_file_error(tmp_path, compressor):
    source = _write(
        tmp_path / "src.recordio",
        [{"x": np.arange(i % 7, dtype=np.float32), "y": ("s" * (i % 5), i)} for i in range(40)],
        compressor,
        max_num_records=6,
    )
    original = open(source, "rb").read()
    rng = random.Random(1234)
    path = tmp_path / "fuzz.recordio"
    for trial in range(300):
        data = bytearray(original)
        for _ in range(rng.choice([1, 1, 2, 5])):
            data[rng.randrange(len(data))] ^= rng.randrange(1, 256)
        if trial % 10 == 0:
            data = data[: rng.randrange(len(data))]
        path.write_bytes(bytes(data))
        if bytes(data) == original:
            continue
        with pytest.raises(CorruptFileError):
            _read_all(path)


def test_fuzz_random_garbage_files(tmp_path):
    rng = random.Random(99)
    path = tmp_path / "garbage.recordio"
    for _ in range(200):
        size = rng.randrange(1, 200)
        data = bytearray(rng.randrange(256) for _ in range(size))
        if rng.random() < 0.5:
            data[:4] = struct.pack("<I", MAGIC)
        path.write_bytes(bytes(data))
        with pytest.raises(CorruptFileError):
            _read_all(path)


def test_module_exports():
    assert set(recordio.__all__) >= {"Writer", "Scanner", "Compressor", "convert_reader_to_recordio_file"}


class PaddleFeeder:
    """What Fluid's convert_reader_to_recordio_file took third: a DataFeeder (any object with feed())."""

    def feed(self, batch):
        return {}


def _batches():
    return loader.batch(lambda: iter([(np.full(2, i, "float32"), i) for i in range(10)]), 4)


def test_a_feeder_in_paddles_third_place_is_refused_by_name(tmp_path):
    path = tmp_path / "f.recordio"
    for convert, args in (
        (convert_reader_to_recordio_file, (path, _batches(), PaddleFeeder())),
        (convert_reader_to_recordio_files, (path, 2, _batches(), PaddleFeeder())),
    ):
        with pytest.raises(TypeError, match=r"got a feeder \(PaddleFeeder\) where the compressor goes") as info:
            convert(*args)
        assert "pass the sample reader (not paddle.batch(...)) and drop the feeder" in str(info.value)
    assert not path.exists()


def test_a_batch_reader_is_warned_of_once_and_written_as_given(tmp_path):
    path = tmp_path / "b.recordio"
    with pytest.warns(UserWarning, match=r"first record is a list of 4 tuples, a batch") as caught:
        assert convert_reader_to_recordio_file(path, _batches()) == 3
    assert len(caught) == 1
    assert len(next(iter(Scanner(path)))) == 4  # each record is a whole batch, as the warning says


def test_a_sample_reader_converts_without_a_warning(tmp_path, recwarn):
    convert_reader_to_recordio_file(tmp_path / "s.recordio", lambda: iter([(1, 2), (3, 4)]))
    assert not [w for w in recwarn if issubclass(w.category, UserWarning)]

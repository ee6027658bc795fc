"""loader.io file readers: formats, the shape/dtype check, the registry, the ReaderBase contract."""

from __future__ import annotations

import re
import zipfile
import zlib

import numpy as np
import pytest

import loader.io as lio
from loader.errors import ClosedError, CorruptFileError, DataError, ShapeMismatchError, UnknownFormatError
from loader.io.file_reader import FileReader
from loader.recordio import Compressor, Writer


def _recordio(path, samples, compressor=Compressor.NONE):
    with Writer(path, compressor, max_num_records=3) as writer:
        for sample in samples:
            writer.write(sample)
    return str(path)


def _drain(reader):
    return list(reader)


class CountingReader(FileReader):
    """A minimal custom format: ``n`` instances ``[i]`` read from a file holding ``n``."""

    def __init__(self, path, shapes=None, dtypes=None, lod_levels=None, scale=1):
        super().__init__(path, shapes, dtypes, lod_levels)
        self.n = int(open(self.path).read())
        self.scale = scale
        self.i = 0

    def _read_instance(self):
        if self.i >= self.n:
            return None
        self.i += 1
        return [np.array([self.i * self.scale], dtype=np.int64)]

    def _rewind(self):
        self.i = 0


def counting_factory(path, **kwargs):
    return CountingReader(path, **kwargs)


# -- formats ---------------------------------------------------------------


@pytest.mark.parametrize("compressor", [Compressor.NONE, Compressor.ZLIB])
def test_recordio_tuple_samples(tmp_path, compressor):
    samples = [(np.full((3,), i, np.float32), np.array([i], np.int64)) for i in range(7)]
    path = _recordio(tmp_path / "a.recordio", samples, compressor)
    with lio.create_file_reader(path, shapes=[[-1, 3], [-1, 1]], dtypes=["float32", "int64"]) as reader:
        assert reader.slot_names == ["slot0", "slot1"]
        got = _drain(reader)
    assert len(got) == 7
    for (x, y), item in zip(samples, got):
        np.testing.assert_array_equal(item[0], x)
        np.testing.assert_array_equal(item[1], y)


def test_recordio_dict_samples_name_slots_by_key(tmp_path):
    samples = [{"image": np.zeros((2, 2), np.uint8), "label": 1}, {"label": 2, "image": np.ones((2, 2), np.uint8)}]
    path = _recordio(tmp_path / "d.recordio", samples)
    with lio.create_file_reader(path) as reader:
        assert reader.slot_names == ["image", "label"]
        first, second = _drain(reader)
    assert first[1] == 1 and second[1] == 2 and second[0].sum() == 4  # keys matched, not positions


def test_recordio_corruption_reaches_the_reader(tmp_path):
    path = _recordio(tmp_path / "c.recordio", [np.arange(4)] * 10)
    data = bytearray(open(path, "rb").read())
    data[30] ^= 0xFF
    open(path, "wb").write(bytes(data))
    with pytest.raises(CorruptFileError, match="byte offset 0"):
        _drain(lio.create_file_reader(path))


def test_npy_rows_are_instances(tmp_path):
    array = np.arange(40, dtype=np.float32).reshape(10, 4)
    np.save(tmp_path / "a.npy", array)
    with lio.create_file_reader(tmp_path / "a.npy", shapes=[[-1, 4]], dtypes=["float32"]) as reader:
        assert reader.slot_names == ["data"]
        got = _drain(reader)
    assert len(got) == 10 and all(type(item[0]) is np.ndarray for item in got)
    np.testing.assert_array_equal(np.stack([item[0] for item in got]), array)


def test_npy_of_scalars_gives_0d_arrays(tmp_path):
    np.save(tmp_path / "s.npy", np.arange(5, dtype=np.int32))
    got = _drain(lio.create_file_reader(tmp_path / "s.npy", shapes=[[-1]], dtypes=["int32"]))
    assert [item[0].shape for item in got] == [()] * 5 and [int(item[0]) for item in got] == list(range(5))


def test_npy_rows_of_leading_one_are_normalised(tmp_path):
    np.save(tmp_path / "o.npy", np.zeros((6, 1, 4), np.float32))
    reader = lio.create_file_reader(tmp_path / "o.npy", shapes=[[-1, 4]], dtypes=["float32"])
    assert reader.read_next()[0].shape == (4,)
    assert reader.read_block(10)[0].shape == (5, 4)


@pytest.mark.parametrize("saver", [np.savez, np.savez_compressed])
def test_npz_one_slot_per_key(tmp_path, saver):
    x, y = np.arange(30, dtype=np.float64).reshape(10, 3), np.arange(10, dtype=np.int64)
    saver(tmp_path / "a.npz", x=x, y=y)
    with lio.create_file_reader(tmp_path / "a.npz", shapes=[[-1, 3], [-1]], dtypes=["float64", "int64"]) as reader:
        assert reader.slot_names == ["x", "y"]
        got = _drain(reader)
    np.testing.assert_array_equal(np.stack([g[0] for g in got]), x)
    np.testing.assert_array_equal(np.stack([g[1] for g in got]), y)


def test_stored_npz_members_are_memory_mapped_or_read_whole_when_small(tmp_path):
    from loader.io.formats_numpy import SMALL_MEMBER_BYTES

    big_rows = SMALL_MEMBER_BYTES // 16 + 1  # two int64 a row: just over the limit
    np.savez(
        tmp_path / "m.npz", a=np.arange(2 * big_rows).reshape(big_rows, 2), f=np.asfortranarray(np.ones((big_rows, 3)))
    )
    np.savez(tmp_path / "s.npz", a=np.arange(12, dtype=np.int16).reshape(6, 2), f=np.asfortranarray(np.ones((6, 3))))
    big = lio.create_file_reader(tmp_path / "m.npz").read_block(4)
    assert isinstance(big[0].base, np.memmap) or isinstance(big[0].base.base, np.memmap)
    np.testing.assert_array_equal(big[0], np.arange(8).reshape(4, 2))
    small = lio.create_file_reader(tmp_path / "s.npz").read_block(4)
    assert not any(isinstance(b.base, np.memmap) for b in small), "a mapping costs more than a few pages"
    np.testing.assert_array_equal(small[0], np.arange(8).reshape(4, 2))
    np.testing.assert_array_equal(small[1], np.ones((4, 3)))
    assert not small[0].flags.writeable and not small[1].flags.writeable, "read-only, like a mapping"


@pytest.mark.parametrize("mapped", [False, True], ids=["read whole", "mapped"])
def test_a_bit_flipped_in_a_stored_npz_member_is_refused_not_served(tmp_path, mapped, monkeypatch):
    # zipfile checks a CRC only when a member is read through it: these are read or mapped straight from the file.
    from loader.io import formats_numpy, zip_crc

    rows = formats_numpy.SMALL_MEMBER_BYTES // 64 + (1000 if mapped else -10)
    x = np.arange(rows * 16, dtype=np.float32).reshape(rows, 16)
    np.savez(tmp_path / "good.npz", x=x, label=np.arange(rows))
    data = bytearray((tmp_path / "good.npz").read_bytes())
    data[data.find(x[100].tobytes()) + 2] ^= 0x40  # one bit of row 100
    (tmp_path / "bad.npz").write_bytes(data)
    with pytest.raises(zipfile.BadZipFile, match="Bad CRC-32"):
        np.load(tmp_path / "bad.npz")["x"]  # numpy's own verdict
    with pytest.raises(DataError) as caught:
        lio.create_file_reader(tmp_path / "bad.npz").read_block(rows)
    assert str(caught.value).startswith(f"{tmp_path / 'bad.npz'}: member 'x.npy' of the .npz archive is damaged")
    summed, crc32 = [], zlib.crc32
    monkeypatch.setattr(zip_crc.zlib, "crc32", lambda block, crc=0: summed.append(len(block)) or crc32(block, crc))
    for _ in range(3):  # a worker reads its files every epoch: a good member is summed once
        np.testing.assert_array_equal(lio.create_file_reader(tmp_path / "good.npz").read_block(rows)[0], x)
    with zipfile.ZipFile(tmp_path / "good.npz") as archive:
        assert sum(summed) == sum(info.compress_size for info in archive.infolist())  # both members, once
    (tmp_path / "good.npz").write_bytes((tmp_path / "good.npz").read_bytes())  # a new file (inode, mtime): again
    summed.clear()
    lio.create_file_reader(tmp_path / "good.npz").read_block(1)
    assert summed
    if mapped:  # a member over MAX_SUMMED_BYTES is not read whole by every worker that reads a piece of it
        monkeypatch.setattr(zip_crc, "MAX_SUMMED_BYTES", rows * 64 - 1)
        summed.clear()
        np.testing.assert_array_equal(lio.create_file_reader(tmp_path / "bad.npz").read_block(100)[0], x[:100])
        assert sum(summed) < rows * 64, "x's bytes were not summed (the labels' were)"


def test_counting_an_npz_reads_no_member_data_and_a_damaged_one_fails_at_its_first_read(tmp_path, monkeypatch):
    # The daemon opens files in its loop to count their rows: 10,000 small stored members (2.4 GiB) were read
    # and summed at open, which silenced it for 9 s and its workers gave up on it. Now only headers are read.
    from loader.config.sections import SourceConfig
    from loader.io.survey import header_rows

    # Over zipfile's first read (4 KiB), which sums a member it reads to its end.
    members = {f"m{i}": np.full((100, 8), i, dtype=np.int64) for i in range(50)}
    np.savez(tmp_path / "many.npz", **members)
    data = bytearray((tmp_path / "many.npz").read_bytes())
    data[data.find(members["m7"].tobytes()) + 3] ^= 0x40  # a bit of member m7's data
    (tmp_path / "many.npz").write_bytes(data)
    read = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda *a, **k: read.append(a[0]) or real_open(*a, **k))
    assert header_rows(SourceConfig(files=[str(tmp_path / "many.npz")]), str(tmp_path / "many.npz")) == 100
    assert read == [str(tmp_path / "many.npz")]  # the archive once, for its directory and headers
    monkeypatch.undo()
    with pytest.raises(DataError, match="member 'm7.npy' of the .npz archive is damaged"):
        lio.create_file_reader(tmp_path / "many.npz").read_block(4)


def test_a_header_claiming_more_empty_rows_than_the_file_has_bytes_is_refused(tmp_path):
    import struct

    header = b"{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000000, 0), }"
    header += b" " * (63 - (10 + len(header)) % 64) + b"\n"
    (tmp_path / "empty.npy").write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header)
    assert np.load(tmp_path / "empty.npy", mmap_mode="r").shape == (10**12, 0)  # numpy takes it
    with pytest.raises(DataError, match=r"claims 1,000,000,000,000 rows of 0 bytes each in a file of 128 bytes"):
        lio.create_file_reader(tmp_path / "empty.npy")
    np.savez(tmp_path / "empty.npz", a=np.zeros((10**6, 0)), b=np.zeros((10**6, 0), np.int8))
    with pytest.raises(DataError, match=r"1,000,000 rows of 0 bytes"):
        lio.create_file_reader(tmp_path / "empty.npz")
    np.save(tmp_path / "few.npy", np.zeros((5, 0), np.float32))  # as many as it could be: read as before
    assert lio.create_file_reader(tmp_path / "few.npy").read_block(8)[0].shape == (5, 0)


def test_npy_format_3_and_a_header_length_past_numpys_limit(tmp_path):
    import struct

    values = np.arange(24, dtype=np.float32).reshape(6, 4)
    with open(tmp_path / "v3.npy", "wb") as fh:
        np.lib.format.write_array(fh, values, version=(3, 0))
    np.testing.assert_array_equal(lio.create_file_reader(tmp_path / "v3.npy").read_block(6)[0], values)
    with open(tmp_path / "v3.npy", "rb") as member, zipfile.ZipFile(tmp_path / "v3.npz", "w") as archive:
        archive.writestr("x.npy", member.read())
    np.testing.assert_array_equal(lio.create_file_reader(tmp_path / "v3.npz").read_block(6)[0], values)
    # The length is refused before np.load reads it: 4 GiB of header was a MemoryError under a memory limit.
    (tmp_path / "long.npy").write_bytes(b"\x93NUMPY\x02\x00" + struct.pack("<I", 0xFFFFFFF0) + b"{}")
    with pytest.raises(DataError, match=r"long.npy: not a readable .npy array \(a header of 4294967280 bytes; at most"):
        lio.create_file_reader(tmp_path / "long.npy")


def test_an_archive_listing_more_members_than_a_dataset_has_fields_is_refused_unparsed(tmp_path, monkeypatch):
    # zipfile parses every entry at open, in the daemon's loop when it counts rows: 300,000 took 2.2 s here.
    from loader.io import formats_numpy

    np.savez(tmp_path / "ok.npz", a=np.zeros(2), b=np.zeros(2), c=np.zeros(2))
    with zipfile.ZipFile(tmp_path / "many.npz", "w") as archive:
        archive.writestr("x.npy", b"")
        for i in range(4):
            archive.writestr(f"junk{i}", b"")
    monkeypatch.setattr(formats_numpy, "MAX_ARCHIVE_MEMBERS", 3)
    parsed, real = [], zipfile.ZipFile
    monkeypatch.setattr(formats_numpy.zipfile, "ZipFile", lambda *a, **k: parsed.append(1) or real(*a, **k))
    assert lio.create_file_reader(tmp_path / "ok.npz").rows == 2 and parsed
    parsed.clear()
    with pytest.raises(DataError, match=r"many.npz: the archive lists 5 members, more than 3"):
        lio.create_file_reader(tmp_path / "many.npz")
    assert not parsed, "refused from the end record, before zipfile parsed the entries"


def test_npz_headers_are_parsed_once_per_distinct_header(tmp_path):
    from loader.io import formats_numpy

    for i in range(3):
        np.savez(tmp_path / f"p{i}.npz", a=np.full((5, 2), i, dtype=np.int32))
    formats_numpy._parse_header.cache_clear()
    for i in range(3):
        np.testing.assert_array_equal(lio.create_file_reader(tmp_path / f"p{i}.npz").read_block(5)[0], i)
    info = formats_numpy._parse_header.cache_info()
    assert (info.misses, info.hits) == (1, 2)


def test_npz_member_cut_short_or_with_a_huge_header_is_refused(tmp_path):
    import struct
    import zipfile

    with zipfile.ZipFile(tmp_path / "cut.npz", "w") as archive:
        full = tmp_path / "full.npy"
        np.save(full, np.arange(100, dtype=np.int64))
        archive.writestr("a.npy", full.read_bytes()[:-16])  # the header promises 800 bytes of data
    with pytest.raises(DataError, match="cut.npz"):
        lio.create_file_reader(tmp_path / "cut.npz")
    with zipfile.ZipFile(tmp_path / "huge.npz", "w") as archive:
        archive.writestr("a.npy", b"\x93NUMPY\x02\x00" + struct.pack("<I", 1 << 30) + b"{}")
    with pytest.raises(DataError, match="header of 1073741824 bytes"):
        lio.create_file_reader(tmp_path / "huge.npz")


def test_npz_keys_of_different_lengths(tmp_path):
    np.savez(tmp_path / "bad.npz", a=np.zeros(3), b=np.zeros(4))
    with pytest.raises(ShapeMismatchError, match="different numbers of rows"):
        lio.create_file_reader(tmp_path / "bad.npz")


def test_object_arrays_are_refused(tmp_path):
    np.save(tmp_path / "o.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(DataError):
        lio.create_file_reader(tmp_path / "o.npy")
    np.savez(tmp_path / "o.npz", a=np.array([{"a": 1}], dtype=object))
    with pytest.raises(DataError, match="never unpickled"):
        lio.create_file_reader(tmp_path / "o.npz")


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (b"", "the file is empty"),
        (b"\x00" * 8 + b"not an array at all" * 4, "does not start with the .npy magic string"),
        ("cut", "EOF"),
    ],
)
def test_a_broken_npy_names_the_file_and_says_why_without_pickle_advice(tmp_path, content, reason):
    path = tmp_path / "bad.npy"
    if content == "cut":
        np.save(path, np.arange(100.0))
        path.write_bytes(path.read_bytes()[:60])  # inside the header
    else:
        path.write_bytes(content)
    with pytest.raises(DataError) as caught:
        lio.create_file_reader(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: not a readable .npy array") and reason in message
    assert "allow_pickle" not in message and "pickled" not in message


def test_not_a_zip(tmp_path):
    (tmp_path / "x.npz").write_bytes(b"garbage")
    with pytest.raises(DataError, match="x.npz"):
        lio.create_file_reader(tmp_path / "x.npz")


def test_empty_npy_and_npz(tmp_path):
    np.save(tmp_path / "e.npy", np.zeros((0, 4), np.float32))
    np.savez(tmp_path / "e.npz", a=np.zeros((0, 2)))
    assert _drain(lio.create_file_reader(tmp_path / "e.npy", shapes=[[-1, 4]], dtypes=["float32"])) == []
    assert lio.create_file_reader(tmp_path / "e.npz").read_block(5) == []


def test_text_format_with_parser(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("# header\n1 2 3\n4 5 6\r\n7 8 9")

    def parse(line):
        if line.startswith("#"):
            return None
        return [np.array(line.split(), dtype=np.float32)]

    reader = lio.create_file_reader(path, format="text", parser=parse, shapes=[[-1, 3]], dtypes=["float32"])
    got = [item[0].tolist() for item in reader]
    assert got == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    reader.reinit()
    assert reader.read_next()[0].tolist() == [1, 2, 3]
    reader.close()


def test_text_parser_errors_keep_their_type_and_name_the_line(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("1\nx\n")
    reader = lio.create_file_reader(path, parser=lambda line: int(line))
    assert reader.read_next()[0] == 1
    with pytest.raises(ValueError) as info:
        reader.read_next()
    assert any("line 2" in note and str(path) in note for note in info.value.__notes__)
    with pytest.raises(ValueError, match="parser"):
        lio.create_file_reader(path)


# -- shape and dtype check ----------------------------------------------------


def test_every_fixed_size_is_checked_not_only_the_rank(tmp_path):
    path = _recordio(tmp_path / "s.recordio", [[np.zeros(4, np.float32)]] * 2 + [[np.zeros(5, np.float32)]])
    reader = lio.create_file_reader(path, shapes=[[-1, 4]], dtypes=["float32"])
    reader.read_next(), reader.read_next()
    with pytest.raises(ShapeMismatchError) as info:
        reader.read_next()
    message = str(info.value)
    assert path in message and "record 2" in message and "slot 0" in message
    assert "(5,)" in message and "[-1, 4]" in message


def test_reading_on_past_a_refused_record_names_each_later_record_by_its_own_index(tmp_path):
    sizes = [2, 3, 2, 3, 2]  # records 1 and 3 do not fit [-1, 2]
    path = _recordio(tmp_path / "r.recordio", [[np.full(n, i, np.int64)] for i, n in enumerate(sizes)])
    reader = lio.FileReader(path, [[-1, 2]], ["int64"])
    outcomes = []
    for _ in sizes:
        try:
            outcomes.append(int(reader.read_next()[0][0]))
        except ShapeMismatchError as exc:
            outcomes.append(re.search(r"record \d+", str(exc)).group())
        assert reader.record_index == len(outcomes), "the refused record is read, so the next one follows it"
    assert outcomes == [0, "record 1", 2, "record 3", 4]
    assert reader.read_next() == []
    reader.close()


def test_instance_may_carry_a_leading_one(tmp_path):
    path = _recordio(tmp_path / "l.recordio", [[np.zeros((1, 4), np.float32)], [np.zeros(4, np.float32)]])
    got = _drain(lio.create_file_reader(path, shapes=[[-1, 4]], dtypes=["float32"]))
    assert [g[0].shape for g in got] == [(4,), (4,)]


def test_paddle_s_positional_order_lod_levels_before_dtypes_is_told_to_pass_them_by_keyword(tmp_path):
    # fluid's open_files(filenames, shapes, lod_levels, dtypes) and open_recordio_file took lod_levels third;
    # here dtypes are third, and [0, 0] in their place failed as numpy's "Cannot interpret '0' as a data type".
    path = _recordio(tmp_path / "p.recordio", [[np.zeros(2, np.float32), np.zeros(1, np.int64)]])
    shapes = [[-1, 2], [-1, 1]]
    words = r"dtypes\[0\] = 0 is not a dtype.*lod_levels come after dtypes here.*by keyword"
    with pytest.raises(TypeError, match=words):
        lio.open_files([path], shapes, [0, 0], ["float32", "int64"])
    with pytest.raises(TypeError, match=words):
        FileReader(path, shapes, [0, 0], ["float32", "int64"])
    with pytest.raises(TypeError, match=r"dtypes\[1\] = 'floot32' is not a dtype"):
        lio.open_files([path], shapes, dtypes=["float32", "floot32"])
    reader = lio.open_files([path], shapes, lod_levels=[0, 0], dtypes=["float32", "int64"])
    assert [a.shape for a in reader.read_next()] == [(2,), (1,)]


def test_minus_one_matches_any_size_and_rank_is_checked(tmp_path):
    path = _recordio(tmp_path / "v.recordio", [[np.zeros((3, 7), np.int32)], [np.zeros((2, 7, 1), np.int32)]])
    reader = lio.create_file_reader(path, shapes=[[-1, -1, 7]], dtypes=["int32"])
    assert reader.read_next()[0].shape == (3, 7)
    with pytest.raises(ShapeMismatchError, match="record 1"):
        reader.read_next()


def test_dtype_slot_count_and_sequence_checks(tmp_path):
    path = _recordio(tmp_path / "t.recordio", [[np.zeros(2, np.float64)]])
    with pytest.raises(ShapeMismatchError, match="dtype float64 does not match declared float32"):
        _drain(lio.create_file_reader(path, shapes=[[-1, 2]], dtypes=["float32"]))
    with pytest.raises(ShapeMismatchError, match="1 slots, 2 declared"):
        _drain(lio.create_file_reader(path, shapes=[[-1, 2], [-1, 1]], dtypes=None))
    seq = _recordio(tmp_path / "q.recordio", [[np.zeros((5, 2), np.float32)], [np.zeros((0, 2), np.float32)]])
    got = _drain(lio.create_file_reader(seq, shapes=[[-1, 2]], dtypes=["float32"], lod_levels=[1]))
    assert [g[0].shape for g in got] == [(5, 2), (0, 2)]
    with pytest.raises(ValueError, match="different numbers of slots"):
        lio.create_file_reader(seq, shapes=[[-1, 2]], dtypes=["float32", "int64"])


def test_no_declared_shapes_skips_the_checks(tmp_path):
    path = _recordio(tmp_path / "n.recordio", [[np.zeros(2)], [np.zeros((3, 3), np.int8)]])
    assert len(_drain(lio.create_file_reader(path))) == 2


# -- ReaderBase contract -------------------------------------------------------


def test_a_subclass_overriding_only_read_next_is_told_what_to_implement():
    class OnlyReadNext(lio.ReaderBase):
        def read_next(self):
            return []

    reader = OnlyReadNext()
    assert list(reader) == []  # iteration goes through the override
    with pytest.raises(NotImplementedError, match=r"OnlyReadNext does not implement _read_next_impl\(\)"):
        reader.has_next()
    with pytest.raises(NotImplementedError, match=r"_reinit_impl\(\)"):
        reader.reinit()
    with pytest.raises(NotImplementedError, match="slot_names"):
        _ = reader.slot_names


def test_has_next_reinit_close_and_read_block(tmp_path):
    path = _recordio(tmp_path / "r.recordio", [[np.array([i])] for i in range(5)] + [[np.array([9, 9])]])
    reader = lio.create_file_reader(path)
    assert reader.has_next() and reader.has_next()
    assert reader.read_next()[0].tolist() == [0]
    block = reader.read_block(10)  # stops before the instance of another shape
    assert block[0].tolist() == [[1], [2], [3], [4]]
    assert reader.read_block(10)[0].tolist() == [[9, 9]]
    assert reader.read_block(10) == [] and not reader.has_next() and reader.read_next() == []
    reader.reinit()
    assert [x[0].tolist() for x in reader][:2] == [[0], [1]]
    reader.close()
    reader.close()
    with pytest.raises(ClosedError):
        reader.read_next()
    with pytest.raises(ClosedError):
        reader.has_next()


def test_read_block_ends_before_a_failure_and_the_next_read_raises_it(tmp_path):
    # Where a failure is met must not depend on the block size: a caller that reads on past it (a lease
    # group, a re-read skipping records already sent) numbers the records after it the same every time.
    path = tmp_path / "t.txt"
    path.write_text("1\n2\n3\nx\n5\n")
    reader = lio.create_file_reader(path, parser=lambda line: int(line))
    assert reader.read_block(16)[0].tolist() == [1, 2, 3]
    with pytest.raises(ValueError) as info:
        reader.read_block(16)
    assert any("line 4" in note for note in info.value.__notes__)
    assert reader.read_block(16)[0].tolist() == [5]  # the text reader steps past a bad line
    reader.reinit()
    assert reader.read_block(2)[0].tolist() == [1, 2]
    assert reader.read_block(16)[0].tolist() == [3]
    reader.close()
    with pytest.raises(ClosedError):
        reader.read_block(16)


def test_read_block_ends_before_damage_a_recordio_reader_steps_past(tmp_path):
    path = _recordio(tmp_path / "d.recordio", [[np.array([i])] for i in range(9)])  # 3 chunks of 3 records
    data = bytearray(open(path, "rb").read())
    data[-3] ^= 0xFF  # the last chunk's payload: its checksum fails, the framing holds
    open(path, "wb").write(bytes(data))
    reader = lio.create_file_reader(path)
    assert reader.read_block(16)[0].tolist() == [[i] for i in range(6)], "the rows before the damage"
    with pytest.raises(CorruptFileError) as info:
        reader.read_block(16)
    assert info.value.records_skipped == 3
    assert reader.read_block(16) == []


def test_npy_read_block_after_has_next_gives_the_row_back(tmp_path):
    np.save(tmp_path / "a.npy", np.arange(6))
    reader = lio.create_file_reader(tmp_path / "a.npy")
    assert reader.has_next() and reader.record_index == 0
    assert reader.read_block(4)[0].tolist() == [0, 1, 2, 3]
    assert reader.record_index == 4
    assert reader.read_next()[0] == 4
    assert reader.read_block(4)[0].tolist() == [5]
    assert not reader.has_next() and reader.read_block(4) == []
    with pytest.raises(ValueError):
        reader.read_block(0)
    reader.reinit()
    assert reader.record_index == 0 and reader.read_block(2)[0].tolist() == [0, 1]
    reader.close()
    with pytest.raises(ClosedError):
        reader.read_block(1)


# -- registry ---------------------------------------------------------------------


def test_unknown_suffix_lists_registered_formats(tmp_path):
    with pytest.raises(UnknownFormatError) as info:
        lio.create_file_reader(tmp_path / "file.weird")
    for name in ("recordio", "npy", "npz", "text"):
        assert name in str(info.value)
    with pytest.raises(UnknownFormatError, match="unknown file format 'nope'"):
        lio.create_file_reader(tmp_path / "file.npy", format="nope")


def test_register_a_callable_and_a_module_string(tmp_path):
    (tmp_path / "a.cnt").write_text("3")
    (tmp_path / "b.TAR.CNT").write_text("2")
    try:
        lio.register_file_reader("cnt", counting_factory)
        assert [x[0][0] for x in lio.create_file_reader(tmp_path / "a.cnt")] == [1, 2, 3]
        lio.register_file_reader("tarcnt", "tests.unit.io.test_readers:counting_factory", suffixes=[".tar.cnt"])
        reader = lio.create_file_reader(tmp_path / "b.TAR.CNT", scale=10)  # longest suffix wins; options pass through
        assert [x[0][0] for x in reader] == [10, 20]
        assert lio.registered_formats()["tarcnt"] == [".tar.cnt"]
    finally:
        lio.unregister_file_reader("cnt")
        lio.unregister_file_reader("tarcnt")
    with pytest.raises(UnknownFormatError):
        lio.create_file_reader(tmp_path / "a.cnt")


def test_bad_module_strings(tmp_path):
    with pytest.raises(ValueError):
        lio.register_file_reader("x", "no_colon_here")
    try:
        lio.register_file_reader("ghost", "no_such_module_xyz:factory", suffixes=[".ghost"])
        with pytest.raises(UnknownFormatError, match="no_such_module_xyz"):
            lio.create_file_reader(tmp_path / "a.ghost")
    finally:
        lio.unregister_file_reader("ghost")


def test_zip_helper_is_not_fooled_by_non_npy_members(tmp_path):
    path = tmp_path / "extra.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("README.txt", "hello")
        with archive.open("a.npy", "w") as member:
            np.lib.format.write_array(member, np.arange(3))
    assert [int(x[0]) for x in lio.create_file_reader(path)] == [0, 1, 2]


def test_dict_slot_names_win_over_declared_shapes(tmp_path):
    path = _recordio(tmp_path / "n.recordio", [{"a": np.zeros(2, np.float32), "b": 1}])
    reader = lio.create_file_reader(path, shapes=[[-1, 2], [-1]], dtypes=["float32", "int64"])
    assert reader.slot_names == ["a", "b"]
    assert len(_drain(reader)) == 1 and reader.slot_names == ["a", "b"]


def test_text_dict_samples_are_joined_by_key_and_a_missing_key_is_named(tmp_path) -> None:
    import json

    path = tmp_path / "d.txt"
    path.write_text('{"label": 1, "weight": 100}\n{"weight": 200, "label": 2}\n{"label": 3}\n')
    reader = lio.create_file_reader(str(path), format="text", parser=json.loads)
    assert reader.slot_names == ["label", "weight"]
    assert [int(v) for v in reader.read_next()] == [1, 100]
    assert [int(v) for v in reader.read_next()] == [2, 200], "taken by key, not by the dict's own order"
    with pytest.raises(ShapeMismatchError, match=r"d.txt: line 3: .*lacks \['weight'\]"):
        reader.read_next()


def test_a_text_line_that_does_not_decode_is_named_after_every_line_before_it(tmp_path) -> None:
    path = tmp_path / "t.txt"
    path.write_bytes(b"".join(b"%d\n" % i for i in range(2999)) + b"caf\xe9\n")
    reader = lio.create_file_reader(str(path), format="text", parser=int)
    got = []
    with pytest.raises(DataError, match=r"t.txt: line 3000 is not utf-8 text \(byte 0xe9 at character 4\)"):
        while True:
            got.append(int(reader.read_next()[0]))
    assert got == list(range(2999)), "the good lines before it all arrived"
    latin = lio.create_file_reader(str(path), format="text", parser=lambda line: len(line), encoding="latin-1")
    assert sum(1 for _ in latin) == 3000


def test_recordio_dict_samples_with_a_key_more_are_refused_naming_the_record(tmp_path) -> None:
    path = str(tmp_path / "d.recordio")
    with Writer(path) as writer:
        writer.write({"a": np.int64(1), "b": np.int64(2)})
        writer.write({"b": np.int64(3), "a": np.int64(4)})
        writer.write({"a": np.int64(5), "b": np.int64(6), "c": np.int64(7)})
    reader = lio.create_file_reader(path)
    assert [int(v) for v in reader.read_next()] == [1, 2]
    assert [int(v) for v in reader.read_next()] == [4, 3]
    with pytest.raises(ShapeMismatchError, match=r"record 2: .*adds \['c'\]"):
        reader.read_next()


def _npy_bytes(shape: tuple[int, ...], payload: bytes) -> bytes:
    import struct

    header = f"{{'descr': '<f4', 'fortran_order': False, 'shape': {shape!r}, }}"
    header += " " * (118 - len(header)) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + payload


@pytest.mark.parametrize(
    ("shape", "compression", "reason"),
    [
        ((10, 10), zipfile.ZIP_DEFLATED, "holds fewer bytes than its header's (10, 10)"),  # was a bare ValueError
        ((10**11, 10), zipfile.ZIP_DEFLATED, "holds fewer bytes"),  # was a MemoryError for 3.6 TiB
        ((-5, 10), zipfile.ZIP_STORED, "claims the shape (-5, 10)"),
        ((-5, 10), zipfile.ZIP_DEFLATED, "claims the shape (-5, 10)"),
    ],
)
def test_an_npz_member_whose_header_lies_is_refused_at_open_naming_the_file(tmp_path, shape, compression, reason):
    path = tmp_path / "bad.npz"
    with zipfile.ZipFile(path, "w", compression) as archive:
        archive.writestr("x.npy", _npy_bytes(shape, b"\0" * 40))
    with pytest.raises(DataError, match=rf"bad.npz: .*member 'x.npy'.*{re.escape(reason)}"):
        lio.create_file_reader(str(path))


@pytest.mark.parametrize("suffix", ["npy", "npz"])
def test_a_mapped_file_cut_short_while_it_is_read_is_an_error_not_a_sigbus(tmp_path, suffix):
    # np.save over a file a reader maps truncates it in place: a row past the new end killed the process.
    path = str(tmp_path / f"x.{suffix}")
    save = np.save if suffix == "npy" else (lambda p, a: np.savez(p, data=a))
    save(path, np.ones((4096, 256), np.float32))
    reader = lio.create_file_reader(path)
    assert reader.read_block(16)[0].sum() == 16 * 256
    save(path, np.zeros((10, 256), np.float32))
    with pytest.raises(DataError, match=r"x\.np[yz]: the file was cut from \d+ to \d+ bytes while it was read"):
        reader.read_block(1024)


def test_a_mapped_file_replaced_by_rename_keeps_reading_the_old_one(tmp_path):
    import os

    path = str(tmp_path / "x.npy")
    np.save(path, np.ones((100, 4), np.float32))
    reader = lio.create_file_reader(path)
    reader.read_block(10)
    np.save(str(tmp_path / "new.npy"), np.zeros((5, 4), np.float32))
    os.replace(str(tmp_path / "new.npy"), path)  # the safe way to regenerate a file
    assert reader.read_block(1000)[0].sum() == 90 * 4


def test_compressed_npz_members_claiming_more_than_the_inflate_bound_are_refused_at_open(tmp_path):
    from loader.io.formats_numpy import MAX_INFLATED_BYTES

    # A bomb by its claims alone: a header of 2 GiB of float64 and a zip directory saying the member inflates to
    # that much, as a real 2 MB bomb would (the stream itself is short, so nothing near it is ever allocated).
    path = tmp_path / "bomb.npz"
    shape = (MAX_INFLATED_BYTES // 4,)
    member = _npy_bytes(shape, b"\0" * 4096).replace(b"'<f4'", b"'<f8'")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("x.npy", member)
    raw = bytearray(path.read_bytes())
    directory = raw.find(b"PK\x01\x02")
    header_len = member.index(b"\n") + 1
    raw[directory + 24 : directory + 28] = (header_len + 2 * MAX_INFLATED_BYTES).to_bytes(4, "little")
    path.write_bytes(bytes(raw))
    with pytest.raises(DataError, match=r"bomb.npz: member 'x.npy' is compressed.* over the limit") as info:
        lio.create_file_reader(str(path))  # it was opened, and the first read allocated the 2 GiB
    assert "np.savez, not np.savez_compressed" in str(info.value)
    # Stored, the same claim is mapped, never held in memory: only the compressed members count.
    small = tmp_path / "ok.npz"
    np.savez_compressed(small, a=np.zeros((1000, 10), np.float32), b=np.arange(1000))
    assert lio.create_file_reader(str(small)).read_block(1000)[0].shape == (1000, 10)


def test_an_npz_with_two_members_of_one_name_is_refused_naming_it(tmp_path):
    import io
    import warnings

    def npy(array):
        out = io.BytesIO()
        np.save(out, array)
        return out.getvalue()

    path = tmp_path / "dup.npz"
    with warnings.catch_warnings(), zipfile.ZipFile(path, "w") as archive:
        warnings.simplefilter("ignore")  # zipfile warns of the duplicate name, and writes it
        archive.writestr("x.npy", npy(np.arange(8)))
        archive.writestr("x.npy", npy(np.arange(8) * 10.0))
    # Both were read as fields named 'x'; a batch kept the float one and dropped the ints without a word.
    with pytest.raises(DataError, match=r"dup.npz: the archive holds two members named 'x.npy'"):
        lio.create_file_reader(str(path))


def test_a_recordio_record_that_makes_no_arrays_fails_alone_naming_the_file_and_record(tmp_path):
    # A ragged nest raised numpy's bare ValueError, and a reader skipping bad records took it for the end of
    # the file: the records after it were lost, counted as one.
    samples = [(np.int64(i),) for i in range(8)]
    samples[4] = [[1, [2, 3]], "a"]
    reader = lio.create_file_reader(_recordio(tmp_path / "r.recordio", samples))
    got = [int(reader.read_next()[0]) for _ in range(4)]
    with pytest.raises(DataError, match=r"r.recordio: record 4 makes no arrays") as info:
        reader.read_next()
    assert info.value.records_skipped == 1
    got += [int(item[0]) for item in reader]
    assert got == [0, 1, 2, 3, 5, 6, 7]


def test_a_recordio_record_that_does_not_decode_is_stepped_past_and_later_records_keep_their_numbers(tmp_path):
    path = tmp_path / "u.recordio"
    with Writer(path) as writer:
        writer.write({"a": np.int64(0)})
        writer.write_raw(b"\xc1")  # never valid msgpack, nor a pickle, nor tensors
        writer.write({"a": np.int64(2)})
        writer.write({"b": np.int64(3)})
        writer.write({"a": np.int64(4)})
    reader = lio.create_file_reader(str(path))
    assert int(reader.read_next()[0]) == 0
    with pytest.raises(CorruptFileError, match="record 1 cannot be decoded") as info:
        reader.read_next()
    assert info.value.records_skipped == 1
    assert int(reader.read_next()[0]) == 2
    with pytest.raises(ShapeMismatchError, match=r"record 3: .*lacks \['a'\]"):  # its own number, not 2
        reader.read_next()
    assert int(reader.read_next()[0]) == 4 and reader.read_next() == []


def test_a_text_line_the_parser_refuses_fails_alone(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(b"1\nx\n3\n\xff\n5\n[1, [2]]\n7\n")

    def parse(line):
        return [int(line)] if not line.startswith("[") else [[1, [2]]]

    reader = lio.create_file_reader(path, parser=parse)
    got, failures = [], []
    while True:
        try:
            item = reader.read_next()
        except (ValueError, DataError) as exc:
            assert exc.records_skipped == 1
            failures.append(type(exc).__name__)
            continue
        if not item:
            break
        got.append(int(item[0]))
    assert got == [1, 3, 5, 7] and failures == ["ValueError", "DataError", "DataError"]


def _hostile_npz(path, kind):
    """An archive zipfile itself refuses or cannot inflate, each in its own way."""
    import io
    import struct

    out = io.BytesIO()
    np.save(out, np.arange(40000, dtype=np.int64))  # over SMALL_MEMBER_BYTES: a stored one is mapped
    member = out.getvalue()
    method = {"lzma": zipfile.ZIP_LZMA, "bzip2": zipfile.ZIP_BZIP2, "deflate": zipfile.ZIP_DEFLATED}.get(kind, 0)
    with zipfile.ZipFile(path, "w", method) as archive:
        archive.writestr("x.npy", member)
    raw = bytearray(path.read_bytes())
    local, central = raw.find(b"PK\x03\x04"), raw.find(b"PK\x01\x02")
    if kind == "encrypted":  # flag bit 0: zipfile raised RuntimeError (a password is needed)
        raw[local + 6] |= 1
        raw[central + 8] |= 1
    elif kind == "method 99":  # NotImplementedError
        struct.pack_into("<H", raw, local + 8, 99)
        struct.pack_into("<H", raw, central + 10, 99)
    elif kind == "stored past the end":  # np.memmap's bare ValueError at the first read
        del raw[central - 1000 : central]
        eocd = raw.find(b"PK\x05\x06")
        struct.pack_into("<I", raw, eocd + 16, central - 1000)
    else:  # a damaged stream: zlib.error, LZMAError or bzip2's OSError, at open (the header) or the first read
        start = local + 30 + len("x.npy") + (5 if kind == "deflate" else len(raw) // 3)
        raw[start : start + 40] = b"\xff" * 40
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("kind", ["encrypted", "method 99", "deflate", "lzma", "bzip2", "stored past the end"])
def test_an_npz_zipfile_cannot_read_is_a_data_error_naming_the_file(tmp_path, kind):
    path = tmp_path / "bad.npz"
    _hostile_npz(path, kind)
    with pytest.raises(DataError, match=r"bad.npz: .*(not a readable .npz archive|does not read)"):
        reader = lio.create_file_reader(str(path))
        reader.read_block(10)
    with pytest.raises(FileNotFoundError):  # a missing file is still its own OSError, as for .npy
        lio.create_file_reader(str(tmp_path / "missing.npz"))


def test_opening_many_npy_files_of_one_directory_lists_it_once_and_sees_a_new_companion(tmp_path, monkeypatch):
    import os
    import time

    from loader.io import formats_numpy

    for i in range(50):
        np.save(tmp_path / f"f{i:03d}.npy", np.arange(3) + 3 * i)
    np.save(tmp_path / "f007.label.npy", np.arange(3))
    settled = time.time() - 10  # a listing taken just after a change could miss a file of the same mtime tick
    os.utime(tmp_path, (settled, settled))
    listed = []
    scandir = os.scandir
    monkeypatch.setattr(os, "scandir", lambda path=".": listed.append(path) or scandir(path))
    monkeypatch.setattr(formats_numpy, "_LISTINGS", {}, raising=False)
    readers = [lio.create_file_reader(str(tmp_path / f"f{i:03d}.npy")) for i in range(50)]
    # Each open listed the whole directory (glob): opening n files of a directory cost O(n) each.
    assert len(listed) == 1
    assert [r.slot_names for r in readers[6:9]] == [["data"], ["data", "label"], ["data"]]
    np.save(tmp_path / "f009.label.npy", np.arange(3))  # the directory changes: listed again
    assert lio.create_file_reader(str(tmp_path / "f009.npy")).slot_names == ["data", "label"]
    assert len(listed) == 2


def test_dict_keys_that_name_one_field_as_text_are_refused(tmp_path):
    path = tmp_path / "k.recordio"
    with Writer(path) as writer:
        writer.write({1: np.arange(3), "1": np.arange(3) * 10})
    # Both became fields named "1": a batch (a dict by field) kept one and dropped the other without a word.
    with pytest.raises(ShapeMismatchError, match=r"k.recordio: record 0: the keys \[1, '1'\] name fields alike"):
        lio.create_file_reader(str(path)).read_next()


def test_a_text_file_through_open_files_is_told_how_a_parser_reaches_it(tmp_path):
    # open_files passes no format options, so "needs parser=..." alone left its user with nothing to pass.
    import functools

    from loader.io import open_files, register_file_reader, unregister_file_reader
    from loader.io.formats_text import TextFileReader

    (tmp_path / "a.ints").write_text("1\n2\n")
    register_file_reader("ints_plain", TextFileReader, [".ints"])
    try:
        with pytest.raises(ValueError, match=r"for open_files a format of your own, loader\.io\.register_file_reader"):
            open_files([str(tmp_path / "a.ints")], None, None).read_next()
        # What the message says to do, done: the parser reaches the reader.
        register_file_reader(
            "ints_plain", functools.partial(TextFileReader, parser=lambda line: (int(line),)), [".ints"]
        )
        reader = open_files([str(tmp_path / "a.ints")], None, None, is_test=True)
        assert [int(reader.read_next()[0]), int(reader.read_next()[0])] == [1, 2]
        reader.close()
    finally:
        unregister_file_reader("ints_plain")

"""PaddlePaddle's RecordIO files (Go and Fluid C++ writers, every compressor, pickled and not).

The files are built from the published layouts (tests/paddle_recordio_files.py). Upstream's
creator_test assertions run through the ``paddle`` alias unchanged.
"""

from __future__ import annotations

import functools
import importlib
import os
import pickle
import struct
import unittest
import zlib

import numpy as np
import pytest

from loader import cli
from loader.errors import CorruptFileError, DataError
from loader.reader import creator
from loader.recordio import Layout, PickledRecordError, Scanner, UnsafePickleError, convert_paddle_file, framing
from loader.recordio import tensors as fluid_tensors
from loader.recordio.crc32c import crc32c, masked_crc32c
from tests import paddle_recordio_files as files
from tests import paddle_shim

GO_COMPRESSORS = [files.NONE, files.SNAPPY, files.GZIP]
FLUID_COMPRESSORS = [files.NONE, files.SNAPPY]
ALL_WRITERS = [("go", c) for c in GO_COMPRESSORS] + [("fluid", c) for c in FLUID_COMPRESSORS]
PY2_TUPLES = [b"(I1\nI2\nI3\ntp0\n.", b"(I4\nI5\nI6\ntp0\n."]  # Python 2's cPickle.dumps((1, 2, 3)), protocol 0


def _pickled(protocol: int) -> list[bytes]:
    if protocol == -2:
        return list(PY2_TUPLES)
    return [pickle.dumps((1, 2, 3), protocol=protocol), pickle.dumps((4, 5, 6), protocol=protocol)]


def _tensor_records() -> list[bytes]:
    # Fluid's recordio_writer: one record per batch, one serialized LoDTensor per slot.
    return [fluid_tensors.encode([np.array([a], np.int64) for a in row]) for row in ((1, 2, 3), (4, 5, 6))]


class CreatorCases(unittest.TestCase):
    """Upstream's creator_test TestRecordIO, assertions unchanged; ``path`` is set per file."""

    __test__ = False
    path: str = ""

    def do_test(self, path):
        paddle = importlib.import_module("paddle")
        reader = paddle.reader.creator.recordio(path)
        idx = 0
        for e in reader():
            if idx == 0:
                self.assertEqual(e, (1, 2, 3))
            elif idx == 1:
                self.assertEqual(e, (4, 5, 6))
            idx += 1
        self.assertEqual(idx, 2)

    def test_recordIO(self):
        self.do_test(self.path)
        self.do_test([self.path])


def _run_creator_case(path: str) -> unittest.TestResult:
    CreatorCases.path = path
    outcome = unittest.TestResult()
    CreatorCases("test_recordIO").run(outcome)
    return outcome


@pytest.fixture
def paddle(monkeypatch):
    return paddle_shim.install(monkeypatch)


@pytest.mark.parametrize("compressor", FLUID_COMPRESSORS)
def test_upstream_creator_test_on_fluid_tensor_records(paddle, tmp_path, compressor):
    path = str(tmp_path / "fluid.recordio")
    files.write_fluid(path, _tensor_records(), compressor)
    outcome = _run_creator_case(path)
    assert outcome.wasSuccessful(), outcome.failures + outcome.errors


@pytest.mark.parametrize("writer, compressor", ALL_WRITERS)
@pytest.mark.parametrize("protocol", [-2, 0, 2, 4, 5])
def test_upstream_creator_test_on_pickled_files_after_one_conversion(paddle, tmp_path, writer, compressor, protocol):
    src, dst = str(tmp_path / "paddle.dat"), str(tmp_path / "ours.recordio")
    (files.write_go if writer == "go" else files.write_fluid)(src, _pickled(protocol), compressor)
    assert convert_paddle_file(src, dst, allow_pickle=True) == 2
    outcome = _run_creator_case(dst)
    assert outcome.wasSuccessful(), outcome.failures + outcome.errors


@pytest.mark.parametrize("compressor", GO_COMPRESSORS)
def test_upstream_creator_test_with_the_opt_in_set_in_the_alias(paddle, monkeypatch, tmp_path, compressor):
    # The one line a port adds to read pickled files in place.
    monkeypatch.setattr(paddle.reader.creator, "recordio", functools.partial(creator.recordio, allow_pickle=True))
    path = str(tmp_path / "go.dat")
    files.write_go(path, _pickled(2), compressor)
    outcome = _run_creator_case(path)
    assert outcome.wasSuccessful(), outcome.failures + outcome.errors


def test_the_creator_case_can_fail(paddle, tmp_path):
    path = str(tmp_path / "three.recordio")
    files.write_fluid(path, _tensor_records() + _tensor_records()[:1], files.NONE)  # three records, not two
    assert not _run_creator_case(path).wasSuccessful()


@pytest.mark.parametrize("writer, compressor", ALL_WRITERS)
def test_pickled_records_are_refused_without_the_opt_in(tmp_path, writer, compressor):
    path = str(tmp_path / "paddle.dat")
    (files.write_go if writer == "go" else files.write_fluid)(path, _pickled(2), compressor)
    with pytest.raises(PickledRecordError) as info:
        list(creator.recordio(path)())
    message = str(info.value)
    assert path in message and "record 0" in message and "allow_pickle=True" in message
    assert "loader recordio convert" in message and "\n" not in message
    assert "creator.recordio(..., allow_pickle=True)" in message  # where the argument can be passed
    assert isinstance(info.value, DataError)


@pytest.mark.parametrize("compressor", GO_COMPRESSORS)
def test_go_layout_is_detected_and_raw_records_come_back_as_bytes(tmp_path, compressor):
    path = str(tmp_path / "raw.dat")
    records = [b"2", b"", b"hello", bytes(range(256)) * 300]
    files.write_go(path, records, compressor, max_chunk_bytes=1000)  # several chunks
    with Scanner(path) as scanner:
        assert list(scanner) == records
        assert scanner.layout is Layout.GO


@pytest.mark.parametrize("compressor", FLUID_COMPRESSORS)
def test_fluid_layout_tensor_records_with_lod(tmp_path, compressor):
    from loader import LoDTensor

    words = LoDTensor(np.arange(9, dtype=np.int64).reshape(9, 1))
    words.set_recursive_sequence_lengths([[3, 2, 4]])
    record = fluid_tensors.encode([np.ones((3, 2), np.float32), words])
    path = str(tmp_path / "lod.recordio")
    files.write_fluid(path, [record] * 5, compressor, max_num_records=2)
    with Scanner(path) as scanner:
        got = list(scanner)
        assert scanner.layout is Layout.FLUID
    assert len(got) == 5
    dense, seq = got[4]
    assert dense.shape == (3, 2) and dense.dtype == np.float32
    assert seq.recursive_sequence_lengths() == [[3, 2, 4]] and np.asarray(seq).ravel().tolist() == list(range(9))


def test_numpy_samples_pickled_by_paddle_read_with_the_opt_in(tmp_path):
    sample = (np.arange(12, dtype=np.float32).reshape(3, 4), np.int64(7), "label", b"raw", [1.5, None], {"k": 2})
    path = str(tmp_path / "np.dat")
    files.write_go(path, [pickle.dumps(sample, protocol=p) for p in (2, 4, 5)])
    got = list(creator.recordio(path, allow_pickle=True)())
    assert len(got) == 3
    for item in got:
        assert np.array_equal(item[0], sample[0]) and item[0].dtype == np.float32
        assert item[1:] == sample[1:]


def test_a_hostile_pickle_in_a_file_is_refused_even_with_the_opt_in(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(os, "system", lambda cmd: calls.append(cmd))
    evil = b"cposix\nsystem\n(S'echo pwned'\ntR."  # protocol 0: posix.system('echo pwned')
    path = str(tmp_path / "evil.dat")
    files.write_go(path, [pickle.dumps((1, 2)), evil])
    scanner = Scanner(path, allow_pickle=True)
    assert scanner.next_sample() == (True, (1, 2))
    with pytest.raises(UnsafePickleError, match="posix.system") as info:
        scanner.next_sample()
    assert path in str(info.value) and "record 1" in str(info.value)
    scanner.close()
    assert calls == []


def test_go_chunk_with_a_bad_checksum_is_reported(tmp_path):
    path = str(tmp_path / "bad.dat")
    files.write_go(path, [b"a", b"b"], files.NONE)
    files.write_go(str(tmp_path / "good.dat"), [b"c"], files.NONE)
    data = bytearray(open(tmp_path / "good.dat", "rb").read() + open(path, "rb").read())
    data[-1] ^= 0xFF  # damage the second chunk's payload
    open(path, "wb").write(data)
    with Scanner(path) as scanner:
        assert scanner.next_sample() == (True, b"c")
        with pytest.raises(CorruptFileError, match="CRC32 mismatch"):
            scanner.next_sample()


# --- the Snappy framing format against its published layout ----------------------------------------------


def test_crc32c_and_its_mask_match_the_published_check_values():
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    crc = crc32c(b"abc")
    assert masked_crc32c(b"abc") == ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def test_framing_decodes_hand_built_frames():
    body = b"\x03\x08abc"  # raw Snappy: varint length 3, literal tag (3-1)<<2, "abc"
    compressed = b"\x00" + (4 + len(body)).to_bytes(3, "little") + struct.pack("<I", masked_crc32c(b"abc")) + body
    stored = b"\x01" + (4 + 3).to_bytes(3, "little") + struct.pack("<I", masked_crc32c(b"def")) + b"def"
    padding = b"\xfe\x02\x00\x00\x00\x00"
    stream = framing.STREAM_IDENTIFIER + compressed + padding + stored
    assert framing.decode(stream) == b"abcdef"
    assert framing.decode(framing.encode(b"xyz" * 50000)) == b"xyz" * 50000
    with pytest.raises(ValueError, match="reserved unskippable"):
        framing.decode(framing.STREAM_IDENTIFIER + b"\x02\x00\x00\x00")
    with pytest.raises(ValueError, match="CRC32C mismatch"):
        framing.decode(stream[:-1] + b"x")


def test_go_header_field_order_is_read_as_published(tmp_path):
    payload = struct.pack("<I", 1) + b"Z"
    chunk = struct.pack("<5I", 0x01020304, zlib.crc32(payload), 0, len(payload), 1) + payload
    path = tmp_path / "one.dat"
    path.write_bytes(chunk)
    with Scanner(str(path)) as scanner:
        assert list(scanner) == [b"Z"] and scanner.layout is Layout.GO


# --- loader recordio convert ----------------------------------------------------------------------------


def test_cli_convert_with_the_opt_in_streams_and_reports_progress(tmp_path, capsys):
    src, dst = str(tmp_path / "big.dat"), str(tmp_path / "big.recordio")
    records = [pickle.dumps((i, np.full(3, i, np.int32))) for i in range(3000)]
    files.write_go(src, records, files.SNAPPY, max_chunk_bytes=4096)
    assert cli.main(["recordio", "convert", src, dst, "--allow-pickle"]) == 0
    err = capsys.readouterr().err
    assert f"converted {src}" in err and "3,000 records" in err
    got = list(creator.recordio(dst)())  # no opt-in needed any more
    assert [g[0] for g in got] == list(range(3000)) and got[5][1].tolist() == [5, 5, 5]


def test_cli_convert_without_the_opt_in_fails_in_one_line_and_leaves_nothing(tmp_path, capsys):
    src, dst = str(tmp_path / "p.dat"), str(tmp_path / "out.recordio")
    files.write_go(src, _pickled(2))
    assert cli.main(["recordio", "convert", src, dst]) == cli.EXIT_ERROR
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("loader: error:") and "--allow-pickle" in err and src in err
    assert not os.path.exists(dst) and not os.path.exists(dst + ".partial")


def test_cli_convert_into_a_directory_writes_the_source_name_there(tmp_path, capsys):
    # `convert SRC DIR` wrote DIR.partial and failed to rename it ("Is a directory: DIR.partial"); `DIR/` left
    # DIR/.partial behind.
    src = str(tmp_path / "mnist-0.recordio")
    files.write_go(src, _pickled(2))
    out = tmp_path / "out"
    out.mkdir()
    for dst in (str(out), str(out) + os.sep):
        assert cli.main(["recordio", "convert", src, dst, "--allow-pickle"]) == 0
        assert sorted(os.listdir(out)) == ["mnist-0.recordio"]
        assert f"to {out / 'mnist-0.recordio'}" in capsys.readouterr().err
        assert list(creator.recordio(str(out / "mnist-0.recordio"))()) == [(1, 2, 3), (4, 5, 6)]


def test_cli_convert_into_a_missing_directory_names_it_in_one_line(tmp_path, capsys):
    src = str(tmp_path / "p.recordio")
    files.write_go(src, _pickled(2))
    dst = str(tmp_path / "nodir" / "x.recordio")
    assert cli.main(["recordio", "convert", src, dst, "--allow-pickle"]) == cli.EXIT_ERROR
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err.startswith("loader: error:") and dst in err and "no such directory" in err and ".partial" not in err
    assert not (tmp_path / "nodir").exists()


def test_convert_leaves_no_partial_file_when_the_final_rename_fails(tmp_path):
    src = str(tmp_path / "p.recordio")
    files.write_go(src, _pickled(2))
    out = tmp_path / "out"
    (out / "p.recordio").mkdir(parents=True)  # DST/<SRC's name> is a directory: the rename fails
    with pytest.raises(OSError):
        convert_paddle_file(src, str(out), allow_pickle=True)
    assert os.listdir(out) == ["p.recordio"] and not [p for p in tmp_path.rglob("*") if p.name.endswith(".partial")]


def test_cli_convert_into_a_directory_holding_a_directory_of_the_source_name_fails(tmp_path, capsys):
    # The command resolved DIR to DIR/<SRC's name> and the conversion resolved that again: it wrote
    # DIR/p.recordio/p.recordio and said it wrote DIR/p.recordio.
    src = str(tmp_path / "p.recordio")
    files.write_go(src, _pickled(2))
    out = tmp_path / "out"
    (out / "p.recordio").mkdir(parents=True)
    assert cli.main(["recordio", "convert", src, str(out), "--allow-pickle"]) == cli.EXIT_ERROR
    assert os.listdir(out) == ["p.recordio"] and not os.listdir(out / "p.recordio")
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err.endswith(f"over a directory: {out / 'p.recordio'}") and ".partial" not in err


def test_convert_keeps_lod_as_lengths(tmp_path):
    from loader import LoDTensor

    seq = LoDTensor(np.arange(3, dtype=np.int64).reshape(3, 1))
    seq.set_recursive_sequence_lengths([[1, 2]])
    src, dst = str(tmp_path / "f.recordio"), str(tmp_path / "o.recordio")
    files.write_fluid(src, [fluid_tensors.encode([seq])], files.NONE)
    assert convert_paddle_file(src, dst) == 1
    with Scanner(dst) as scanner:
        (item,) = list(scanner)
    assert item[0]["recursive_sequence_lengths"] == [[1, 2]] and item[0]["data"].shape == (3, 1)


@pytest.mark.parametrize("dims", [[0, 2**62], [0] * 100])
def test_tensor_dims_numpy_cannot_hold_are_a_corrupt_record_naming_the_file(tmp_path, dims):
    # No data bytes to check them by: numpy's reshape raised a bare ValueError, naming neither file nor record.
    desc = b"\x08\x05" + b"".join(b"\x10" + fluid_tensors._encode_varint(d) for d in dims)
    record = struct.pack("<I", 1) + struct.pack("<IQ", 0, 0) + struct.pack("<Ii", 0, len(desc)) + desc
    with pytest.raises(fluid_tensors.NotTensors, match="TensorDesc dims"):
        fluid_tensors.decode(record)
    path = str(tmp_path / "dims.recordio")
    files.write_fluid(path, [record], files.NONE)
    with pytest.raises(CorruptFileError, match=r"dims.recordio: corrupt chunk at byte offset 0: record 0 cannot"):
        list(Scanner(path))


# -- records that are mini-batches (Fluid's convert_reader_to_recordio_file) ---------------------------


def _mnist_batches(tmp_path, compressor=files.SNAPPY):
    """A file as Fluid's converter wrote MNIST: one record per batch of 32 (a DataFeeder's image and label
    tensors), the last batch short."""
    rng = np.random.default_rng(0)
    images = rng.random((72, 784), dtype=np.float32)
    labels = np.arange(72, dtype=np.int64).reshape(72, 1)
    records = [fluid_tensors.encode([images[a:b], labels[a:b]]) for a, b in ((0, 32), (32, 64), (64, 72))]
    path = str(tmp_path / "mnist.recordio")
    files.write_fluid(path, records, compressor)
    return path, images, labels


@pytest.mark.parametrize("compressor", FLUID_COMPRESSORS)
def test_open_files_reads_a_file_of_fluid_batches_as_its_samples(tmp_path, compressor):
    from loader import io as lio

    path, images, labels = _mnist_batches(tmp_path, compressor)
    reader = lio.open_files([path], shapes=[[-1, 784], [-1, 1]], dtypes=["float32", "int64"])
    got = list(reader)
    assert len(got) == 72  # 32 + 32 + 8: the -1 is the batch axis, as in Fluid's open_files
    assert all(image.shape == (784,) and label.shape == (1,) for image, label in got)
    assert np.array_equal(np.stack([g[0] for g in got]), images)
    assert np.array_equal(np.stack([g[1] for g in got]), labels)
    batched = list(lio.BatchReader(lio.FileReader(path, [[-1, 784], [-1, 1]], ["float32", "int64"]), 32))
    assert [b[0].shape for b in batched] == [(32, 784), (32, 784), (8, 784)]


def test_a_batch_record_of_sequences_is_read_sequence_by_sequence(tmp_path):
    from loader import LoDTensor
    from loader import io as lio

    words = LoDTensor(np.arange(9, dtype=np.int64).reshape(9, 1))
    words.set_recursive_sequence_lengths([[3, 2, 4]])
    path = str(tmp_path / "seq.recordio")
    files.write_fluid(path, [fluid_tensors.encode([np.array([[0], [1], [2]], np.int64), words])], files.NONE)
    reader = lio.FileReader(path, [[-1, 1], [-1, 1]], ["int64", "int64"], lod_levels=[0, 1])
    got = list(reader)
    assert [label.tolist() for label, _ in got] == [[0], [1], [2]]
    assert [seq.ravel().tolist() for _, seq in got] == [[0, 1, 2], [3, 4], [5, 6, 7, 8]]


def test_sample_records_are_read_as_before_when_shapes_are_declared(tmp_path):
    from loader import io as lio
    from loader.recordio import Writer

    path = str(tmp_path / "samples.recordio")
    with Writer(path) as writer:
        for i in range(3):
            writer.write([np.full(4, i, np.float32), np.array([i], np.int64)])
            writer.write([np.full((1, 4), i, np.float32), np.array([[i]], np.int64)])  # a batch axis of one
    got = list(lio.FileReader(path, [[-1, 4], [-1, 1]], ["float32", "int64"]))
    assert [(x.shape, y.tolist()) for x, y in got] == [((4,), [i]) for i in range(3) for _ in range(2)]


def test_a_batch_record_whose_tensors_disagree_on_the_batch_size_is_named(tmp_path):
    from loader import io as lio

    path = str(tmp_path / "bad.recordio")
    record = fluid_tensors.encode([np.zeros((4, 2), np.float32), np.zeros((3, 1), np.int64)])
    files.write_fluid(path, [record], files.NONE)
    with pytest.raises(DataError, match=r"bad.recordio: record 0 does not split into samples .*\[4, 3\] rows"):
        list(lio.FileReader(path, [[-1, 2], [-1, 1]], ["float32", "int64"]))


def test_cli_convert_split_batches_writes_one_record_per_sample(tmp_path, capsys):
    path, images, labels = _mnist_batches(tmp_path)
    dst = str(tmp_path / "samples.recordio")
    assert cli.main(["recordio", "convert", path, dst, "--split-batches"]) == 0
    assert "72 records" in capsys.readouterr().err
    got = list(creator.recordio(dst)())
    assert len(got) == 72 and all(len(sample) == 2 for sample in got)
    assert np.array_equal(np.stack([s[0] for s in got]), images)
    assert np.array_equal(np.stack([s[1] for s in got]), labels)
    assert convert_paddle_file(path, dst) == 3  # without the flag: one record per batch, as before


def test_convert_split_batches_splits_lod_tensors_into_their_sequences(tmp_path):
    from loader import LoDTensor

    words = LoDTensor(np.arange(9, dtype=np.int64).reshape(9, 1))
    words.set_recursive_sequence_lengths([[3, 2, 4]])
    src, dst = str(tmp_path / "f.recordio"), str(tmp_path / "o.recordio")
    files.write_fluid(src, [fluid_tensors.encode([np.array([7, 8, 9], np.int64), words])], files.NONE)
    assert convert_paddle_file(src, dst, split_batches=True) == 3
    with Scanner(dst) as scanner:
        got = list(scanner)
    assert [int(label) for label, _ in got] == [7, 8, 9]
    assert [seq.ravel().tolist() for _, seq in got] == [[0, 1, 2], [3, 4], [5, 6, 7, 8]]


def test_convert_split_batches_names_a_record_that_is_not_a_batch(tmp_path, capsys):
    from loader.recordio import Writer

    src, dst = str(tmp_path / "s.recordio"), str(tmp_path / "o.recordio")
    with Writer(src) as writer:
        writer.write({"x": np.zeros(3)})
    assert cli.main(["recordio", "convert", src, dst, "--split-batches"]) != 0
    err = capsys.readouterr().err
    assert "s.recordio: record 0 is not a mini-batch (it holds a dict" in err and "without --split-batches" in err
    assert not os.path.exists(dst)

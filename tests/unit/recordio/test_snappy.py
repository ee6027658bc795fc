"""Snappy RecordIO chunks: CRC32C, raw Snappy blocks, the snappystream framing, and chunks.

The expected outputs of the hand-built Snappy blocks are derived from the format
(see ``loader/recordio/snappy.py``), not from our encoder. Run this module
(``python -m tests.unit.recordio.test_snappy``) to print the codec's speeds.
"""

from __future__ import annotations

import io
import os
import random
import struct
import zlib
from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loader.errors import CorruptFileError
from loader.recordio import HEADER, MAGIC, Compressor, Scanner, Writer, crc32c, native, snappy, snappystream
from loader.recordio.snappy import SnappyError
from loader.runtime import codec

BIG = 1 << 20  # max_length for hand-built blocks that are not about the limit


# -- CRC32C ---------------------------------------------------------------------


def _crc32c_bitwise(data: bytes) -> int:
    """The textbook bit-at-a-time definition, sharing nothing with the module."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


@pytest.mark.parametrize(
    "data,expected",
    [
        (b"123456789", 0xE3069283),  # the CRC catalogue's check value
        (bytes(32), 0x8A9136AA),  # RFC 3720 (iSCSI) B.4 test vectors
        (b"\xff" * 32, 0x62A8AB43),
        (bytes(range(32)), 0x46DD794E),
        (bytes(range(31, -1, -1)), 0x113FDB5C),
        (b"", 0),
    ],
)
def test_crc32c_published_check_values(data, expected):
    assert crc32c.crc32c(data) == expected
    assert crc32c._update_python(0xFFFFFFFF, data) ^ 0xFFFFFFFF == expected
    if len(data) >= 4:
        assert crc32c._update_numpy(0xFFFFFFFF, data) ^ 0xFFFFFFFF == expected


@pytest.mark.parametrize("size", [0, 1, 3, 4, 7, 8, 9, 255, 256, 257, 1000, 32768, 65535, 65536, 65537, 140001])
def test_crc32c_matches_the_bitwise_definition_on_both_paths(size):
    data = random.Random(size).randbytes(size)
    want = _crc32c_bitwise(data)
    assert crc32c.crc32c(data) == want
    assert crc32c._update_python(0xFFFFFFFF, data) ^ 0xFFFFFFFF == want
    if 4 <= size <= crc32c.ROW_BYTES * crc32c.MAX_ROWS:
        assert crc32c._update_numpy(0xFFFFFFFF, data) ^ 0xFFFFFFFF == want


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=3000), st.binary(max_size=3000))
def test_crc32c_continues_across_pieces(a, b):
    assert crc32c.crc32c(b, crc32c.crc32c(a)) == crc32c.crc32c(a + b) == _crc32c_bitwise(a + b)


def test_masked_crc32c():
    crc = 0xE3069283
    assert crc32c.mask(crc) == (((crc >> 15) | (crc << 17)) + 0xA282EAD8) % 2**32
    assert crc32c.masked_crc32c(b"") == 0xA282EAD8
    # as found in a reference Snappy implementation's framed output for b"hello"
    assert crc32c.masked_crc32c(b"hello") == 0x191C1FBB


# -- raw Snappy blocks: hand-built element streams -----------------------------

HELLO = b"hello"
A100 = bytes(range(100))
A300 = bytes(i % 251 for i in range(300))
A70000 = bytes(i % 253 for i in range(70000))


@pytest.mark.parametrize(
    "block,expected",
    [
        (b"\x00", b""),  # length 0, no elements
        (b"\x05\x10" + HELLO, HELLO),  # literal, length-1 = 4 in the tag
        (b"\x3c\xec" + A300[:60], A300[:60]),  # the longest short literal: tag 59 << 2
        (b"\x64\xf0\x63" + A100, A100),  # literal with 1 length byte (tag 60 << 2, 99)
        (b"\x3d\xf0\x3c" + A300[:61], A300[:61]),  # 61, the shortest that needs a length byte
        (b"\xac\x02\xf4\x2b\x01" + A300, A300),  # 2 length bytes: 299 = 0x012b
        (b"\xf0\xa2\x04\xf8\x6f\x11\x01" + A70000, A70000),  # 3 length bytes: 69999 = 0x01116f
        (b"\x05\xfc\x04\x00\x00\x00" + HELLO, HELLO),  # 4 length bytes (not minimal, still valid)
        (b"\x08\x0cabcd\x01\x04", b"abcdabcd"),  # copy-1: offset 4, length 4
        (b"\x0f\x0cabcd\x1d\x04", b"abcdabcdabcdabc"),  # copy-1 length 11 (7 << 2), overlapping
        (b"\xb7\x02\xf4\x2b\x01" + A300 + b"\x3d\x2c", A300 + A300[:11]),  # copy-1 offset 300 = 1 << 8 | 0x2c
        (b"\x14\x240123456789\x26\x0a\x00", b"0123456789" * 2),  # copy-2: length 10, offset 10
        (b"\xa4\x01\xf0\x63" + A100 + b"\xfe\x64\x00", A100 + A100[:64]),  # copy-2 length 64 (63 << 2)
        (b"\x09\x14abcdef\x0b\x06\x00\x00\x00", b"abcdefabc"),  # copy-4: length 3, offset 6
        # copy-4 with offset 70000 = 0x011170, after a literal of 70000 bytes
        (b"\xf5\xa2\x04\xf8\x6f\x11\x01" + A70000 + b"\x13\x70\x11\x01\x00", A70000 + A70000[:5]),
        (b"\x3d\x00a\xee\x01\x00", b"a" * 61),  # overlap: copy-2 offset 1 length 60
        (b"\x0d\x08abc\x19\x03", b"abcabcabcabca"),  # overlap: copy-1 offset 3 length 10
        (b"\x0d\x08abc\x26\x03\x00", b"abcabcabcabca"),  # the same with copy-2
    ],
)
def test_decompress_hand_built_blocks(block, expected):
    assert bytes(snappy.decompress(block, max_length=BIG)) == expected


def test_decompress_a_slice_of_a_bigger_buffer():
    buffer = b"junk" + b"\x05\x10" + HELLO + b"more"
    assert bytes(snappy.decompress(buffer, 4, 4 + 7, max_length=BIG)) == HELLO


@pytest.mark.parametrize(
    "block,reason",
    [
        (b"", "varint is cut off"),
        (b"\x85", "varint is cut off"),
        (b"\x80\x80\x80\x80\x80\x01", "longer than 5 bytes"),
        (b"\xff\xff\xff\xff\x7f", "does not fit 32 bits"),
        (b"\x05\x10hell", "runs past the end"),
        (b"\x64\xf0", "literal length at byte 1 is cut off"),
        (b"\x05\xf8\x04\x00", "literal length at byte 1 is cut off"),
        (b"\x03\x10hello", "writes past the declared length 3"),
        (b"\x04\x01", "copy-1 at byte 1 is cut off"),
        (b"\x04\x02\x01", "copy-2 at byte 1 is cut off"),
        (b"\x04\x03\x01\x00\x00", "copy-4 at byte 1 is cut off"),
        (b"\x08\x0cabcd\x01\x00", "offset 0"),
        (b"\x08\x0cabcd\x01\x05", "before the start"),  # offset 5 with 4 bytes decoded
        (b"\x04\x01\x01", "before the start"),  # a copy first of all
        (b"\x09\x0cabcd\x0d\x04", "copy-1 of 7 bytes at byte 6 writes past the declared length 9"),
        (b"\x09\x0cabcd", "decode to 4 bytes, the declared length is 9"),
    ],
)
def test_decompress_rejects_malformed_blocks(block, reason):
    with pytest.raises(SnappyError, match=reason):
        snappy.decompress(block, max_length=BIG)


def test_decompress_refuses_a_declared_length_over_the_limit_before_allocating():
    with pytest.raises(SnappyError, match="exceeds the limit of 65536"):
        snappy.decompress(b"\xff\xff\xff\xff\x0f\x00", max_length=65536)
    # exactly at the limit is fine: "a", 1023 copies of 64 bytes at offset 1, one of 63
    block = b"\x80\x80\x04" + b"\x00a" + b"\xfe\x01\x00" * 1023 + bytes([62 << 2 | 2, 1, 0])
    assert bytes(snappy.decompress(block, max_length=65536)) == b"a" * 65536


def _elements(block: bytes) -> list[tuple[int, int]]:
    """``(kind, length)`` of each element of a valid block."""
    _, pos = snappy._read_varint(block, 0, len(block))
    found = []
    while pos < len(block):
        tag = block[pos]
        kind, length = tag & 3, (tag >> 2) + 1
        if kind == 0:
            extra = max(0, length - 60)
            if extra:
                length = int.from_bytes(block[pos + 1 : pos + 1 + extra], "little") + 1
            pos += 1 + extra + length
        else:
            length = ((tag >> 2) & 7) + 4 if kind == 1 else length
            pos += (0, 2, 3, 5)[kind]
        found.append((kind, length))
    return found


def test_compress_uses_literals_copy1_and_copy2_only():
    rng = random.Random(3)
    words = [b"label", b"image", b"\x00" * 40, b"tokens", bytes(rng.randrange(256) for _ in range(30))]
    data = b"".join(rng.choice(words) for _ in range(3000))
    packed = snappy.compress(data)
    kinds = {kind for kind, _ in _elements(packed)}
    assert kinds == {0, 1, 2}
    assert len(packed) < len(data) // 3
    assert bytes(snappy.decompress(packed, max_length=BIG)) == data


def test_compress_shrinks_runs_and_barely_grows_noise():
    assert len(snappy.compress(bytes(30000))) < 1600  # one literal, then copies of 64
    noise = os.urandom(30000)
    assert len(snappy.compress(noise)) <= len(noise) + 10


_COMPRESSIBLE = st.lists(
    st.one_of(st.binary(max_size=20), st.sampled_from([b"\x00" * 70, b"abc" * 9, b"msgpack", b"\xff\xfe"])),
    max_size=400,
).map(b"".join)


@settings(max_examples=120, deadline=None)
@given(st.one_of(st.binary(max_size=5000), _COMPRESSIBLE))
def test_compress_round_trip(data):
    assert bytes(snappy.decompress(snappy.compress(data), max_length=BIG)) == data


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_decompress_of_garbage_raises_only_snappy_error(data):
    try:
        snappy.decompress(data, max_length=4096)
    except SnappyError:
        pass


# -- the snappystream framing ---------------------------------------------------


def _block(flag: int, data: bytes, crc_of: bytes) -> bytes:
    return struct.pack(">BHI", flag, len(data), crc32c.masked_crc32c(crc_of)) + data


def test_stream_layout_of_a_hand_built_stream():
    stream = b"snappy\x00" + _block(1, b"\x05\x10hello", b"hello") + _block(0, b"world", b"world")
    assert snappystream.decode(stream) == b"helloworld"
    assert snappystream.decode(b"snappy\x00") == b""


def test_encode_writes_oSnappyStream_blocks():
    payload = (b"0123456789abcdef" * 2500)[:40000]  # two blocks: 32768 + 7232 bytes
    stream = snappystream.encode(payload)
    assert stream[:7] == b"snappy\x00"
    flag, length, crc = struct.unpack_from(">BHI", stream, 7)
    assert (flag, crc) == (1, crc32c.masked_crc32c(payload[:32768]))
    first = stream[14 : 14 + length]
    assert bytes(snappy.decompress(first, max_length=BIG)) == payload[:32768]
    flag, length, crc = struct.unpack_from(">BHI", stream, 14 + len(first))
    assert (flag, crc) == (1, crc32c.masked_crc32c(payload[32768:]))
    assert len(stream) == 14 + len(first) + 7 + length
    assert snappystream.encode(b"") == b"snappy\x00"


def test_encode_stores_incompressible_blocks_raw_and_every_block_fits_the_original_reader():
    noise = os.urandom(70000)
    stream = snappystream.encode(noise)
    pos, flags = 7, []
    while pos < len(stream):
        flag, length, _ = struct.unpack_from(">BHI", stream, pos)
        assert length <= 32768  # the original's reader gives up on longer blocks
        flags.append(flag)
        pos += 7 + length
    assert flags == [0, 0, 0] and stream[14 : 14 + 32768] == noise[:32768]


@pytest.mark.parametrize("packed_size,flag", [(700, 0), (699, 1)])
def test_encode_keeps_raw_bytes_unless_snappy_saves_an_eighth(monkeypatch, packed_size, flag):
    # 800 bytes: compressed output must be under 800 - 800 // 8 = 700 bytes to be used
    monkeypatch.setattr(snappystream, "compress", lambda block: b"\x00" * packed_size)
    stream = snappystream.encode(b"x" * 800)
    assert struct.unpack_from(">BH", stream, 7) == (flag, 800 if flag == 0 else packed_size)


@settings(max_examples=40, deadline=None)
@given(st.one_of(st.binary(max_size=70000), _COMPRESSIBLE), st.sampled_from([100, 4096, 32768]))
def test_stream_round_trip(payload, block_size):
    assert snappystream.decode(snappystream.encode(payload, block_size)) == payload


def test_stream_round_trip_across_many_blocks():
    rng = np.random.default_rng(7)
    sizes = rng.integers(1, 3000, 200)
    payload = b"".join(codec.pack({"x": rng.integers(0, 4, size=int(n), dtype=np.uint8), "y": "label"}) for n in sizes)
    payload += os.urandom(50000)
    stream = snappystream.encode(payload)
    assert len(stream) < len(payload)
    assert snappystream.decode(stream) == payload


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=80), st.integers(0, 200), st.integers(1, 255))
def test_damaged_streams_raise_only_snappy_error(tail, position, xor):
    stream = bytearray(snappystream.encode(b"abc" * 30 + bytes(range(60)) + b"abc" * 30) + tail)
    stream[position % len(stream)] ^= xor
    try:
        snappystream.decode(bytes(stream))
    except SnappyError:
        pass


# -- chunks and files ------------------------------------------------------------


def _records_file(path, records, compressor=Compressor.SNAPPY, max_num_records=3):
    with Writer(path, compressor, max_num_records) as writer:
        for record in records:
            writer.write_raw(record)
    data = open(path, "rb").read()
    offsets, pos = [], 0
    while pos < len(data):
        offsets.append(pos)
        pos += HEADER.size + HEADER.unpack_from(data, pos)[4]
    return offsets


def _replace_payload(path, offset, edit) -> None:
    """Give the chunk at ``offset`` the payload ``edit(payload)``, with a matching outer CRC32."""
    data = open(path, "rb").read()
    magic, count, _, comp, size = HEADER.unpack_from(data, offset)
    start = offset + HEADER.size
    payload = edit(data[start : start + size])
    head = HEADER.pack(magic, count, zlib.crc32(payload), comp, len(payload))
    with open(path, "wb") as fh:
        fh.write(data[:offset] + head + payload + data[start + size :])


RECORDS = [b"ABC", b"BCD", b"CDE", b"x" * 100, b"", b"label" * 20, b"\x00" * 64]


def test_scanner_reads_a_hand_built_paddle_chunk(tmp_path):
    # records ABC, BCD, CDE as the original laid them out: uint32 length + bytes
    payload = b"".join(struct.pack("<I", 3) + r for r in (b"ABC", b"BCD", b"CDE"))
    block = b"\x15" + b"\x18\x03\x00\x00\x00ABC" + b"\x01\x07" + b"\x08BCD" + b"\x01\x07" + b"\x08CDE"
    stored = b"snappy\x00" + struct.pack(">BHI", 1, len(block), crc32c.masked_crc32c(payload)) + block
    path = tmp_path / "paddle.recordio"
    path.write_bytes(HEADER.pack(MAGIC, 3, zlib.crc32(stored), 1, len(stored)) + stored)
    with Scanner(path) as scanner:
        assert list(scanner.raw_records()) == [b"ABC", b"BCD", b"CDE"]
        assert scanner.next_raw() is None


@settings(max_examples=30, deadline=None)
@given(st.lists(st.one_of(st.binary(max_size=3000), _COMPRESSIBLE), max_size=30), st.integers(1, 8))
def test_writer_scanner_round_trip(records, per_chunk):
    buffer = io.BytesIO()
    with Writer(buffer, Compressor.SNAPPY, per_chunk) as writer:
        for record in records:
            writer.write_raw(record)
    buffer.seek(0)
    assert list(Scanner(buffer).raw_records()) == records


def test_samples_round_trip_and_chunks_say_snappy(tmp_path):
    samples = [{"image": np.arange(i, i + 784, dtype=np.uint8).reshape(28, 28), "label": i % 10} for i in range(50)]
    path = tmp_path / "s.recordio"
    with Writer(path, Compressor.SNAPPY, 20) as writer:
        for sample in samples:
            writer.write(sample)
    data = open(path, "rb").read()
    assert HEADER.unpack_from(data, 0)[3] == 1
    with Scanner(path) as scanner:
        got = list(scanner)
    assert [s["label"] for s in got] == [s["label"] for s in samples]
    assert all(np.array_equal(a["image"], b["image"]) for a, b in zip(got, samples))


def test_a_file_mixing_none_zlib_and_snappy_chunks_reads_in_order():
    buffer = io.BytesIO()
    order = [Compressor.SNAPPY, Compressor.NONE, Compressor.ZLIB, Compressor.SNAPPY, Compressor.NONE]
    for i, compressor in enumerate(order):
        with Writer(buffer, compressor, max_num_records=2) as writer:
            for j in range(3):  # two chunks per writer
                writer.write(("chunk", i, j, "z" * 50))
    data, pos, ids = buffer.getvalue(), 0, []
    while pos < len(data):
        ids.append(HEADER.unpack_from(data, pos)[3])
        pos += HEADER.size + HEADER.unpack_from(data, pos)[4]
    assert ids == [1, 1, 0, 0, 2, 2, 1, 1, 0, 0]
    buffer.seek(0)
    assert list(Scanner(buffer)) == [("chunk", i, j, "z" * 50) for i in range(len(order)) for j in range(3)]


def test_loader_io_reads_snappy_recordio_files(tmp_path):
    import loader.io as lio

    path = tmp_path / "io.recordio"
    with Writer(path, Compressor.SNAPPY, max_num_records=3) as writer:
        for i in range(7):
            writer.write((np.full((3,), i, np.float32), np.array([i], np.int64)))
    with lio.create_file_reader(str(path), shapes=[[-1, 3], [-1, 1]], dtypes=["float32", "int64"]) as reader:
        got = list(reader)
    assert [int(label[0]) for _, label in got] == list(range(7))


def _set(position: int, value: bytes) -> Callable[[bytes], bytes]:
    return lambda p: p[:position] + value + p[position + len(value) :]


def _hand_block(block: bytes, declared_payload: bytes) -> Callable[[bytes], bytes]:
    """A stream of one compressed block whose CRC is right for ``declared_payload``."""
    return lambda p: b"snappy\x00" + struct.pack(">BHI", 1, len(block), crc32c.masked_crc32c(declared_payload)) + block


@pytest.mark.parametrize(
    "edit,reason",
    [
        (_set(0, b"SNAPPY"), "bad stream magic"),
        (lambda p: p[:-10], "cut off"),
        (lambda p: p + b"\x01\x00", "block header cut off"),
        (_set(7, b"\x02"), "bad block type 2"),
        (_set(7 + 3, b"\x00\x00\x00\x00"), "masked CRC32C mismatch"),
        (lambda p: p + struct.pack(">BHI", 0, 0, 0), "empty block"),
        (_hand_block(b"\x08\x0cabcd\x01\x05", b"abcdabcd"), "before the start"),
        (_hand_block(b"\x06\x0cabcd\x01\x04", b"abcdab"), "writes past the declared length"),
        (_hand_block(b"\x09\x0cabcd", b"abcd"), "declared length is 9"),
        (_hand_block(b"\x80\x80\x08\x00", b""), "exceeds the limit of 65536"),
    ],
)
def test_damaged_snappy_payload_is_a_corrupt_file_error_naming_file_and_offset(tmp_path, edit, reason):
    path = tmp_path / "bad.recordio"
    offsets = _records_file(path, RECORDS)
    _replace_payload(path, offsets[1], edit)
    with pytest.raises(CorruptFileError, match=reason) as info:
        with Scanner(path) as scanner:
            list(scanner.raw_records())
    message = str(info.value)
    assert str(path) in message and f"byte offset {offsets[1]}: Snappy payload" in message
    assert "\n" not in message


def test_outer_crc32_is_checked_before_the_snappy_stream(tmp_path):
    path = tmp_path / "crc.recordio"
    offsets = _records_file(path, RECORDS)
    with open(path, "r+b") as fh:
        fh.seek(offsets[0] + HEADER.size)
        fh.write(b"SNAPPY")
    with pytest.raises(CorruptFileError, match="CRC32 mismatch"):
        with Scanner(path) as scanner:
            list(scanner.raw_records())


# -- the optional C codecs (cramjam, google-crc32c): same bytes as the pure-Python reference ------------
needs_cramjam = pytest.mark.skipif(native.SNAPPY is None, reason="cramjam is not installed (the snappy extra)")
needs_google_crc = pytest.mark.skipif(native.CRC32C is None, reason="google-crc32c (with its C code) is not installed")


@needs_cramjam
@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=5000), st.integers(min_value=0, max_value=40))
def test_cramjam_and_the_pure_decoder_agree(data, repeats):
    payload = data * (1 + repeats % 5) + bytes(repeats * 50)
    for block in (snappy.compress(payload), snappy.compress_python(payload)):
        assert bytes(snappy.decompress(block, max_length=BIG)) == payload
        assert bytes(snappy.decompress_python(block, max_length=BIG)) == payload


@needs_cramjam
@settings(max_examples=300, deadline=None)
@given(st.binary(min_size=1, max_size=3000), st.data())
def test_a_damaged_block_fails_the_same_way_with_cramjam_installed(data, draw):
    block = bytearray(snappy.compress_python(data * 3))
    at = draw.draw(st.integers(min_value=0, max_value=len(block) - 1))
    block[at] ^= draw.draw(st.integers(min_value=1, max_value=255))
    try:
        expected = bytes(snappy.decompress_python(bytes(block), max_length=BIG))
    except snappy.SnappyError as exc:
        with pytest.raises(snappy.SnappyError) as got:
            snappy.decompress(bytes(block), max_length=BIG)
        assert str(got.value) == str(exc)  # the pure decoder words the error, position included
    else:
        assert bytes(snappy.decompress(bytes(block), max_length=BIG)) == expected


@needs_cramjam
def test_the_declared_length_limit_holds_with_cramjam_installed():
    with pytest.raises(snappy.SnappyError, match="exceeds the limit"):
        snappy.decompress(snappy.compress(bytes(70000)), max_length=65536)


@needs_google_crc
@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=70000), st.integers(min_value=0, max_value=2**32 - 1))
def test_google_crc32c_and_the_pure_crc_agree(data, start):
    assert crc32c.crc32c(data) == crc32c.crc32c_python(data)
    assert crc32c.crc32c(data, start) == crc32c.crc32c_python(data, start)

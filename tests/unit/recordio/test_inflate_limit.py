"""A compressed chunk is bounded before it is inflated: a small crafted file cannot take GiBs."""

from __future__ import annotations

import zlib

import pytest

from loader.errors import CorruptFileError
from loader.recordio import Scanner
from loader.recordio.chunks import HEADER, MAGIC, MAX_PAYLOAD_BYTES, Compressor

MIB = 1024 * 1024


def _zlib_bomb(path, inflated_bytes):
    """One zlib chunk whose payload inflates to ``inflated_bytes`` zeros (built without holding them)."""
    packer = zlib.compressobj(1)
    parts, left = [], inflated_bytes
    block = bytes(MIB)
    while left:
        parts.append(packer.compress(block[: min(MIB, left)]))
        left -= min(MIB, left)
    parts.append(packer.flush())
    stored = b"".join(parts)
    path.write_bytes(HEADER.pack(MAGIC, 1, zlib.crc32(stored), int(Compressor.ZLIB), len(stored)) + stored)
    return path


def test_default_limit_refuses_a_chunk_that_inflates_past_it(tmp_path):
    path = _zlib_bomb(tmp_path / "bomb.recordio", MAX_PAYLOAD_BYTES + MIB)
    assert path.stat().st_size < 2 * MIB
    with Scanner(path) as scanner, pytest.raises(CorruptFileError, match=f"inflates past {MAX_PAYLOAD_BYTES}"):
        scanner.next_raw()


def test_the_limit_is_the_scanners_to_choose(tmp_path):
    path = _zlib_bomb(tmp_path / "bomb.recordio", 3 * MIB)
    with (
        Scanner(path, max_payload_bytes=2 * MIB) as scanner,
        pytest.raises(CorruptFileError, match="bomb.recordio.*inflates past 2097152"),
    ):
        scanner.next_raw()
    assert MAX_PAYLOAD_BYTES <= 256 * MIB  # far below the 4 GiB a uint32 size allows


def test_a_snappy_chunk_is_bounded_by_the_same_limit(tmp_path):
    # Snappy ignored the limit: an 8 MiB record of zeros (387 KiB stored) came back past a 1 MiB limit.
    from loader.recordio import Writer

    path = tmp_path / "s.recordio"
    with Writer(str(path), Compressor.SNAPPY) as writer:
        writer.write_raw(bytes(8 * MIB))
    assert path.stat().st_size < MIB
    with (
        Scanner(path, max_payload_bytes=MIB) as scanner,
        pytest.raises(CorruptFileError, match="s.recordio.*grows past 1048576 bytes"),
    ):
        scanner.next_raw()
    with Scanner(path) as scanner:
        assert len(scanner.next_raw()) == 8 * MIB  # within the default limit it reads


def test_a_mangled_record_count_moves_the_numbering_no_further_than_the_chunk_could_hold(tmp_path):
    # The count sits in the header, outside the checksum: 0xFFFFFFF0 made records_skipped 4,294,967,280.
    from loader.recordio import Writer

    path = tmp_path / "c.recordio"
    with Writer(str(path), Compressor.NONE, max_num_records=4) as writer:
        for i in range(8):
            writer.write_raw(b"%d" % i)
    data = bytearray(path.read_bytes())
    magic, count, checksum, compressor, size = HEADER.unpack_from(data, 0)
    assert (magic, count) == (MAGIC, 4)
    HEADER.pack_into(data, 0, magic, 0xFFFFFFF0, checksum, compressor, size)
    path.write_bytes(bytes(data))
    with Scanner(path) as scanner:
        with pytest.raises(CorruptFileError) as info:
            scanner.next_raw()
        assert 1 <= info.value.records_skipped <= size // 4
        assert bytes(scanner.next_raw()) == b"4"  # the next chunk reads


def test_a_writer_never_closed_is_reported_under_the_default_warning_filters(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "w.recordio"
    script = f"from loader.recordio import Writer\nwriter = Writer({str(path)!r})\nwriter.write([1, 2])\ndel writer\n"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "was not closed: its last 1 records were never written" in result.stderr, result.stderr
    assert path.stat().st_size == 0


def test_a_writer_dropped_with_records_pending_says_they_were_not_written(tmp_path):
    import gc
    import warnings

    from loader.recordio import Writer

    writer = Writer(str(tmp_path / "w.recordio"))
    writer.write_raw(b"lost")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del writer
        gc.collect()
    assert any(
        issubclass(w.category, UserWarning) and "last 1 records were never written" in str(w.message) for w in caught
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with Writer(str(tmp_path / "ok.recordio")) as closed:
            closed.write_raw(b"kept")
        del closed
        gc.collect()

"""RecordIO files: a run of self-checking chunks of records.

Layout (the Fluid C++ format of the original, field order included)::

    file   = chunk*                          (no file header, footer or index)
    chunk  = header payload
    header = 5 x uint32 little-endian: magic 0x01020304, num_records,
             crc32 of the stored payload, compressor id, stored payload size
    payload (before compression) = (uint32 LE length, record bytes)*

Compressors: ``NONE`` (0) and ``ZLIB`` (2, the original's declared but never
implemented "gzip" slot, done here with zlib). Snappy (1) is recognised and
refused with a clear message: it needs a third-party library.

Records written by :meth:`Writer.write` are samples encoded with
:mod:`loader.codec` (msgpack, numpy arrays as dtype + shape + bytes), never
pickle, so reading a file cannot run code.

Unlike the original, every kind of damage is reported the same way: a bad
magic number, a CRC mismatch, a truncated header or payload, record lengths
that do not add up, or an undecodable record raise ``CorruptFileError`` naming
the file and the byte offset of the chunk. The scanner holds one chunk in
memory at a time.
"""

from __future__ import annotations

import enum
import io
import os
import struct
import zlib
from typing import Any, BinaryIO, Callable, Iterable, Iterator

from loader import codec
from loader.errors import ClosedError, CorruptFileError

MAGIC = 0x01020304
HEADER = struct.Struct("<5I")  # magic, num_records, checksum, compressor, stored size
RECORD_LEN = struct.Struct("<I")
MAX_UINT32 = 0xFFFFFFFF
# A chunk is flushed once its records reach this many bytes, whatever max_num_records
# says, so a scanner's memory stays bounded (one bigger record gets a chunk of its own).
DEFAULT_MAX_CHUNK_BYTES = 64 * 1024 * 1024
ZLIB_LEVEL = 1  # fast end of zlib: reading speed matters more than the last few percent


class Compressor(enum.IntEnum):
    """Compressor ids stored in each chunk header (the original's numbering)."""

    NONE = 0
    SNAPPY = 1  # read and written by the original; refused here (no stdlib codec)
    ZLIB = 2  # the original's "gzip" slot
    GZIP = 2  # alias of ZLIB, the original's name for the slot
    NoCompress = 0  # alias of NONE, the original's name


# NONE by default: training data is mostly float arrays or already-compressed media,
# which deflate barely shrinks, while inflating every chunk costs reading time on
# the CPU that also feeds the model. Choose ZLIB for text-like or sparse data.
DEFAULT_COMPRESSOR = Compressor.NONE


def _compress(compressor: Compressor, payload: bytes) -> bytes:
    if compressor == Compressor.NONE:
        return payload
    if compressor == Compressor.ZLIB:
        return zlib.compress(payload, ZLIB_LEVEL)
    raise ValueError(f"compressor {compressor.name} is not supported; use Compressor.NONE or Compressor.ZLIB")


class Writer:
    """Appends records to a RecordIO file, ``max_num_records`` per chunk.

    ``target`` is a path (opened, truncated and owned: ``close()`` closes it) or a
    binary file object (written to and flushed, but left open for its owner).
    Leaving a ``with`` block, even by an exception, writes the pending chunk:
    every record accepted before the error is kept, in intact chunks.
    """

    def __init__(
        self,
        target: str | os.PathLike[str] | BinaryIO,
        compressor: Compressor | int = DEFAULT_COMPRESSOR,
        max_num_records: int = 1000,
        *,
        max_chunk_bytes: int = DEFAULT_MAX_CHUNK_BYTES,
    ) -> None:
        self.compressor = Compressor(compressor)
        _compress(self.compressor, b"")  # refuse an unsupported compressor now, not at first flush
        if max_num_records <= 0:
            raise ValueError(f"max_num_records must be > 0, got {max_num_records}")
        if not 0 < max_chunk_bytes <= MAX_UINT32 - HEADER.size:
            raise ValueError(f"max_chunk_bytes must be in 1..{MAX_UINT32 - HEADER.size}, got {max_chunk_bytes}")
        self.max_num_records = max_num_records
        self.max_chunk_bytes = max_chunk_bytes
        if isinstance(target, (str, os.PathLike)):
            self.name = os.fspath(target)
            self._file: BinaryIO = open(self.name, "wb")
            self._owns_file = True
        else:
            self.name = str(getattr(target, "name", "<stream>"))
            self._file = target
            self._owns_file = False
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._closed = False
        self.num_records = 0  # records accepted so far

    def write(self, sample: Any) -> None:
        """Encode ``sample`` with :func:`loader.codec.pack` and append it as one record."""
        self.write_raw(codec.pack(sample))

    def write_raw(self, record: bytes | bytearray | memoryview) -> None:
        """Append one record of raw bytes."""
        if self._closed:
            raise ClosedError(f"RecordIO writer for {self.name} is closed")
        record = bytes(record)
        size = RECORD_LEN.size + len(record)
        if size > MAX_UINT32 - HEADER.size:
            raise ValueError(f"a record of {len(record)} bytes does not fit a RecordIO chunk (4 GiB)")
        if self._pending and self._pending_bytes + size > self.max_chunk_bytes:
            self.flush()  # a record bigger than max_chunk_bytes gets a chunk of its own
        self._pending.append(RECORD_LEN.pack(len(record)))
        self._pending.append(record)
        self._pending_bytes += size
        self.num_records += 1
        if len(self._pending) // 2 >= self.max_num_records or self._pending_bytes >= self.max_chunk_bytes:
            self.flush()

    def flush(self) -> None:
        """Write the pending chunk, if any (an empty chunk writes nothing)."""
        if self._closed:
            raise ClosedError(f"RecordIO writer for {self.name} is closed")
        if self._pending:
            stored = _compress(self.compressor, b"".join(self._pending))
            if len(stored) > MAX_UINT32:
                raise ValueError(f"a compressed chunk of {len(stored)} bytes does not fit its uint32 size field")
            count = len(self._pending) // 2
            header = HEADER.pack(MAGIC, count, zlib.crc32(stored), int(self.compressor), len(stored))
            self._file.write(header + stored)
            self._pending.clear()
            self._pending_bytes = 0
        self._file.flush()

    def close(self) -> None:
        """Flush and, when the writer opened the file, close it. Idempotent."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True
            if self._owns_file:
                self._file.close()

    def __enter__(self) -> "Writer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Scanner:
    """Reads a RecordIO file chunk by chunk.

    Iterating yields decoded samples; :meth:`raw_records` yields the record
    bytes. Each iteration continues from where the last stopped; :meth:`reset`
    goes back to the first record. ``source`` is a path (owned) or a seekable
    binary file object (left open by ``close()``).
    """

    def __init__(self, source: str | os.PathLike[str] | BinaryIO) -> None:
        if isinstance(source, (str, os.PathLike)):
            self.name = os.fspath(source)
            self._file: BinaryIO = open(self.name, "rb")
            self._owns_file = True
        else:
            self.name = str(getattr(source, "name", "<stream>"))
            self._file = source
            self._owns_file = False
        self._closed = False
        self.reset()

    # -- position -------------------------------------------------------------
    def reset(self) -> None:
        """Start again from the first record of the file."""
        self._check_open()
        self._file.seek(0)
        self._offset = 0  # byte offset of the next chunk header
        self._chunk: list[memoryview] = []
        self._chunk_offset = 0  # byte offset of the chunk now in _chunk
        self._pos = 0  # next record within _chunk
        self.record_index = 0  # index in the file of the next record

    def _check_open(self) -> None:
        if self._closed:
            raise ClosedError(f"RecordIO scanner for {self.name} is closed")

    # -- records --------------------------------------------------------------
    def next_raw(self) -> bytes | None:
        """The next record's bytes, or ``None`` at the end of the file."""
        self._check_open()
        while self._pos >= len(self._chunk):
            if not self._load_chunk():
                return None
        record = self._chunk[self._pos]
        self._pos += 1
        self.record_index += 1
        return bytes(record)

    def next_sample(self) -> tuple[bool, Any]:
        """``(True, sample)`` for the next record, ``(False, None)`` at the end."""
        raw = self.next_raw()
        if raw is None:
            return False, None
        try:
            return True, codec.unpack(raw)
        except Exception as exc:  # noqa: BLE001 - file bytes are untrusted; any failure is corruption
            raise self._corrupt(
                self._chunk_offset, f"record {self.record_index - 1} cannot be decoded ({exc})"
            ) from exc

    def raw_records(self) -> Iterator[bytes]:
        """Yield the remaining records as bytes."""
        while True:
            raw = self.next_raw()
            if raw is None:
                return
            yield raw

    def __iter__(self) -> Iterator[Any]:
        while True:
            found, sample = self.next_sample()
            if not found:
                return
            yield sample

    # -- chunks ---------------------------------------------------------------
    def _corrupt(self, offset: int, reason: str) -> CorruptFileError:
        return CorruptFileError(f"RecordIO file {self.name}: corrupt chunk at byte offset {offset}: {reason}")

    def _load_chunk(self) -> bool:
        """Read, check and split the chunk at ``self._offset``; False at a clean end of file."""
        offset = self._offset
        # Seek every time: after a CorruptFileError the file position is wherever the
        # failed read left it, and a retry must report the same chunk again.
        self._file.seek(offset)
        head = self._file.read(HEADER.size)
        if not head:
            self._chunk, self._pos = [], 0
            return False
        if len(head) < HEADER.size:
            raise self._corrupt(offset, f"truncated header ({len(head)} of {HEADER.size} bytes)")
        magic, count, checksum, compressor, size = HEADER.unpack(head)
        if magic != MAGIC:
            raise self._corrupt(offset, f"bad magic number 0x{magic:08x} (expected 0x{MAGIC:08x})")
        stored = self._read_payload(offset, size)
        if zlib.crc32(stored) != checksum:
            raise self._corrupt(offset, f"CRC32 mismatch (stored 0x{checksum:08x}, computed 0x{zlib.crc32(stored):08x})")
        payload = self._decompress(offset, compressor, stored)
        self._chunk = self._split(offset, payload, count)
        self._chunk_offset, self._pos = offset, 0
        self._offset = offset + HEADER.size + size
        return True

    def _read_payload(self, offset: int, size: int) -> bytes:
        # Compare with the bytes really left before reading, so a damaged size field
        # cannot make us allocate gigabytes.
        left = self._bytes_left()
        if left is not None and size > left:
            raise self._corrupt(offset, f"truncated payload ({left} of {size} bytes present)")
        stored = self._file.read(size)
        if len(stored) < size:
            raise self._corrupt(offset, f"truncated payload ({len(stored)} of {size} bytes present)")
        return stored

    def _bytes_left(self) -> int | None:
        try:
            here = self._file.tell()
            end = os.fstat(self._file.fileno()).st_size
        except (OSError, AttributeError, io.UnsupportedOperation):
            return None
        return max(0, end - here)

    def _decompress(self, offset: int, compressor: int, stored: bytes) -> bytes:
        if compressor == Compressor.NONE:
            return stored
        if compressor == Compressor.ZLIB:
            try:
                return zlib.decompress(stored)
            except zlib.error as exc:
                raise self._corrupt(offset, f"zlib payload does not inflate ({exc})") from exc
        if compressor == Compressor.SNAPPY:
            raise self._corrupt(offset, "Snappy-compressed chunks are not supported (rewrite with NONE or ZLIB)")
        raise self._corrupt(offset, f"unknown compressor id {compressor}")

    def _split(self, offset: int, payload: bytes, count: int) -> list[memoryview]:
        view = memoryview(payload)
        records: list[memoryview] = []
        pos, end = 0, len(payload)
        for index in range(count):
            if pos + RECORD_LEN.size > end:
                raise self._corrupt(offset, f"header claims {count} records, payload ends after {index}")
            (length,) = RECORD_LEN.unpack_from(payload, pos)
            pos += RECORD_LEN.size
            if pos + length > end:
                raise self._corrupt(offset, f"record {index} of the chunk overruns the payload")
            records.append(view[pos : pos + length])
            pos += length
        if pos != end:
            raise self._corrupt(offset, f"{end - pos} bytes left over after {count} records")
        return records

    # -- lifetime -------------------------------------------------------------
    def close(self) -> None:
        """Release the file (when the scanner opened it). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._chunk = []
        if self._owns_file:
            self._file.close()

    def __enter__(self) -> "Scanner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def convert_reader_to_recordio_file(
    filename: str | os.PathLike[str],
    reader_creator: Callable[[], Iterable[Any]],
    compressor: Compressor | int = DEFAULT_COMPRESSOR,
    max_num_records: int = 1000,
) -> int:
    """Write every sample of a paddle-style reader as one record; return how many."""
    with Writer(filename, compressor, max_num_records) as writer:
        for sample in reader_creator():
            writer.write(sample)
        return writer.num_records


def convert_reader_to_recordio_files(
    filename: str | os.PathLike[str],
    batch_per_file: int,
    reader_creator: Callable[[], Iterable[Any]],
    compressor: Compressor | int = DEFAULT_COMPRESSOR,
    max_num_records: int = 1000,
) -> list[str]:
    """Split a reader's samples over files of ``batch_per_file`` records each.

    Files are named ``<stem>-00000.recordio``, ``<stem>-00001.recordio``, ... (the
    number counts files). Every sample is written exactly once: each file gets
    ``batch_per_file`` records and the last one the remainder (the original gave
    the first file one extra and dropped the tail). A reader with no samples
    writes no file. Returns the paths written, in order.
    """
    name = os.fspath(filename)
    stem, ext = os.path.splitext(name)
    if ext != ".recordio":
        raise ValueError(f"filename must end with .recordio, got {name!r}")
    if batch_per_file <= 0:
        raise ValueError(f"batch_per_file must be > 0, got {batch_per_file}")
    paths: list[str] = []
    writer: Writer | None = None
    try:
        for sample in reader_creator():
            if writer is None or writer.num_records >= batch_per_file:
                if writer is not None:
                    writer.close()
                paths.append(f"{stem}-{len(paths):05d}.recordio")
                writer = Writer(paths[-1], compressor, max_num_records)
            writer.write(sample)
    finally:
        if writer is not None:
            writer.close()
    return paths


__all__ = [
    "Compressor",
    "DEFAULT_COMPRESSOR",
    "MAGIC",
    "Writer",
    "Scanner",
    "convert_reader_to_recordio_file",
    "convert_reader_to_recordio_files",
]

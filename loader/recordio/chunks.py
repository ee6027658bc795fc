"""RecordIO chunks: the header, the compressors, and packing/unpacking one chunk.

::

    chunk  = header payload
    header = 5 x uint32 little-endian, in one of two orders (``Layout``):
             FLUID (Fluid's C++ writer, and ours): magic 0x01020304, num_records, crc32, compressor, size
             GO    (the Go ``recordio`` package):  magic 0x01020304, crc32, compressor, size, num_records
    payload (before compression) = (uint32 LE length, record bytes)*

``crc32`` is zlib's CRC-32 of the stored payload, ``size`` its length. Which order a file
uses is found at its first chunk (:func:`detect_layout`): the order whose checksum matches.

Stored payloads (the compressor is read from the header, the flavour from the payload):
NONE is the payload itself; ZLIB/GZIP (id 2) a zlib stream (ours) or a gzip stream (Go's);
SNAPPY (id 1) a hoxnox snappystream (``"snappy\0"``, Fluid's and ours:
:mod:`loader.recordio.snappystream`) or the official framing format (``sNaPpY``, Go's:
:mod:`loader.recordio.framing`), both decoded in pure Python. Every kind of damage found
while unpacking raises ``CorruptFileError`` naming the file and the byte offset of the
chunk (``chunk_error``).
"""

from __future__ import annotations

import enum
import os
import struct
import zlib
from collections.abc import Callable
from typing import BinaryIO, cast

from loader.errors import CorruptFileError
from loader.recordio import framing, snappystream
from loader.recordio.snappy import SnappyError

MAGIC = 0x01020304
HEADER = struct.Struct("<5I")  # FLUID order: magic, num_records, checksum, compressor, stored size
RECORD_LEN = struct.Struct("<I")
MAX_UINT32 = 0xFFFFFFFF
# The most bytes one compressed chunk may inflate to. A writer makes chunks of at most
# writer.DEFAULT_MAX_CHUNK_BYTES (64 MiB) unless a single record is larger; a zlib stream can
# inflate ~1000x, so without this bound a 1 MB crafted file could make a reader allocate GiBs.
# Files with bigger records pass a larger ``max_payload_bytes`` to the Scanner.
MAX_PAYLOAD_BYTES = 256 * 1024 * 1024
ZLIB_LEVEL = 1  # fast end of zlib: reading speed matters more than the last few percent


class Compressor(enum.IntEnum):
    """Compressor ids stored in each chunk header (the original's numbering)."""

    NONE = 0
    SNAPPY = 1  # the original's default: a snappystream of Snappy blocks (pure Python here)
    ZLIB = 2  # the original's "gzip" slot
    GZIP = 2  # alias of ZLIB, the original's name for the slot
    NoCompress = 0  # alias of NONE, the original's name
    Snappy = 1  # alias of SNAPPY, the original's name (fluid.recordio_writer.Compressor.Snappy)


# NONE by default: training data is mostly float arrays or already-compressed media,
# which deflate barely shrinks, while inflating every chunk costs reading time on
# the CPU that also feeds the model. Choose ZLIB for text-like or sparse data;
# SNAPPY (the original's default) is for files the original must read, since our
# Snappy codec is pure Python and so slower than zlib's C.
DEFAULT_COMPRESSOR = Compressor.NONE


class Layout(enum.Enum):
    """The order of a chunk header's fields: Fluid's C++ writer (and this package), or Go's."""

    FLUID = "fluid"
    GO = "go"


def header_fields(layout: Layout, head: bytes) -> tuple[int, int, int, int, int]:
    """``(magic, num_records, checksum, compressor, stored size)`` of a 20-byte header read in ``layout``."""
    magic, a, b, c, d = HEADER.unpack(head)
    if layout is Layout.GO:
        return magic, d, a, b, c
    return magic, a, b, c, d


def detect_layout(head: bytes, read_payload: Callable[[int], bytes | None]) -> Layout:
    """The layout of a file from its first chunk header: the order whose checksum matches its payload.

    ``read_payload(size)`` gives the ``size`` bytes after the header, or ``None`` when the
    file has fewer. With no match (a damaged chunk) the answer is FLUID, whose reader then
    reports the damage.
    """
    for layout in (Layout.FLUID, Layout.GO):
        _, _, checksum, compressor, size = header_fields(layout, head)
        if compressor not in (0, 1, 2):
            continue
        stored = read_payload(size)
        if stored is not None and zlib.crc32(stored) == checksum:
            return layout
    return Layout.FLUID


def compress(compressor: Compressor, payload: bytes) -> bytes:
    """The stored form of ``payload``; ``ValueError`` for a compressor we cannot write."""
    if compressor == Compressor.NONE:
        return payload
    if compressor == Compressor.ZLIB:
        return zlib.compress(payload, ZLIB_LEVEL)
    if compressor == Compressor.SNAPPY:
        return snappystream.encode(payload)
    raise ValueError(f"compressor {compressor!r} is not supported")


def pack_chunk(records: list[bytes], compressor: Compressor) -> bytes:
    """Header and stored payload of one chunk holding ``records`` (raw bytes each)."""
    parts = []
    for record in records:
        parts.append(RECORD_LEN.pack(len(record)))
        parts.append(record)
    stored = compress(compressor, b"".join(parts))
    if len(stored) > MAX_UINT32:
        raise ValueError(f"a compressed chunk of {len(stored)} bytes does not fit its uint32 size field")
    return HEADER.pack(MAGIC, len(records), zlib.crc32(stored), int(compressor), len(stored)) + stored


def chunk_error(name: str, offset: int, reason: str) -> CorruptFileError:
    return CorruptFileError(f"RecordIO file {name}: corrupt chunk at byte offset {offset}: {reason}")


def parse_header(name: str, offset: int, head: bytes, layout: Layout = Layout.FLUID) -> tuple[int, int, int, int]:
    """``(num_records, checksum, compressor, stored size)`` of a complete 20-byte header."""
    if len(head) < HEADER.size:
        raise chunk_error(name, offset, f"truncated header ({len(head)} of {HEADER.size} bytes)")
    magic, count, checksum, compressor, size = header_fields(layout, head)
    if magic != MAGIC:
        raise chunk_error(name, offset, f"bad magic number 0x{magic:08x} (expected 0x{MAGIC:08x})")
    return count, checksum, compressor, size


def unpack_payload(
    name: str,
    offset: int,
    count: int,
    checksum: int,
    compressor: int,
    stored: bytes,
    max_payload_bytes: int = MAX_PAYLOAD_BYTES,
) -> list[memoryview]:
    """Check and inflate a chunk's stored payload (to at most ``max_payload_bytes``) and split it
    into its ``count`` records."""
    if zlib.crc32(stored) != checksum:
        raise chunk_error(
            name, offset, f"CRC32 mismatch (stored 0x{checksum:08x}, computed 0x{zlib.crc32(stored):08x})"
        )
    payload = _decompress(name, offset, compressor, stored, min(max_payload_bytes, MAX_UINT32))
    view = memoryview(payload)
    records: list[memoryview] = []
    pos, end = 0, len(payload)
    for index in range(count):
        if pos + RECORD_LEN.size > end:
            raise chunk_error(name, offset, f"header claims {count} records, payload ends after {index}")
        (length,) = RECORD_LEN.unpack_from(payload, pos)
        pos += RECORD_LEN.size
        if pos + length > end:
            raise chunk_error(name, offset, f"record {index} of the chunk overruns the payload")
        records.append(view[pos : pos + length])
        pos += length
    if pos != end:
        raise chunk_error(name, offset, f"{end - pos} bytes left over after {count} records")
    return records


def _decompress(name: str, offset: int, compressor: int, stored: bytes, limit: int) -> bytes:
    if compressor == Compressor.NONE:
        return stored
    if compressor == Compressor.ZLIB:
        # Bounded before inflating (max_length): a crafted chunk could inflate ~1000x.
        # wbits 32 + 15 reads a zlib stream (ours) or a gzip stream (Go's writer) alike.
        inflater = zlib.decompressobj(32 + zlib.MAX_WBITS)
        try:
            payload = inflater.decompress(stored, limit)
        except zlib.error as exc:
            raise chunk_error(name, offset, f"zlib payload does not inflate ({exc})") from exc
        if inflater.unconsumed_tail:
            raise chunk_error(
                name, offset, f"zlib payload inflates past {limit} bytes (the limit: Scanner(max_payload_bytes=...))"
            )
        if not inflater.eof:
            raise chunk_error(name, offset, "zlib payload does not inflate (the stream is cut off)")
        return payload
    if compressor == Compressor.SNAPPY:
        try:
            if framing.is_framed(stored):
                return framing.decode(stored, limit)
            return snappystream.decode(stored, limit)
        except SnappyError as exc:
            raise chunk_error(name, offset, f"Snappy payload: {exc}") from exc
    raise chunk_error(name, offset, f"unknown compressor id {compressor}")


def open_target(target: str | os.PathLike[str] | BinaryIO, mode: str) -> tuple[str, BinaryIO, bool]:
    """``(name, file, owned)``: a path is opened (and owned by the caller); a file object is used as is."""
    if isinstance(target, (str, os.PathLike)):
        name = os.fspath(target)
        return name, cast(BinaryIO, open(name, mode)), True  # closed by the owner's close()
    return str(getattr(target, "name", "<stream>")), target, False


__all__ = [
    "open_target",
    "Layout",
    "header_fields",
    "detect_layout",
    "MAGIC",
    "HEADER",
    "RECORD_LEN",
    "MAX_UINT32",
    "MAX_PAYLOAD_BYTES",
    "Compressor",
    "DEFAULT_COMPRESSOR",
    "compress",
    "pack_chunk",
    "chunk_error",
    "parse_header",
    "unpack_payload",
]

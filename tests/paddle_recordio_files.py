"""RecordIO files as PaddlePaddle's writers made them, built here from the formats' published layouts.

* ``write_go``: the Go ``recordio`` package (``paddle.reader.creator.recordio``, ``paddle.v2``):
  header ``<magic, crc32, compressor, size, num_records>`` little-endian; payload
  ``(u32 length, record)*`` compressed by nothing (0), Snappy's framing format (1, Go's
  ``snappy.NewBufferedWriter``) or gzip (2, Go's ``gzip.NewWriter``); the CRC is zlib's CRC-32
  of the compressed payload; chunks flushed by size.
* ``write_fluid``: Fluid's C++ ``recordio::Writer``: header ``<magic, num_records, crc32,
  compressor, size>``; payload compressed by nothing (0) or hoxnox snappystream (1); chunks of
  ``max_num_records`` records.

The framing and snappystream bytes are produced by this package's codecs
(``loader.recordio.framing``/``snappystream``), which their own tests check against the
published block layouts; gzip by Python's ``gzip`` module. Nothing here reads the files.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from collections.abc import Sequence

from loader.recordio import framing, snappystream

MAGIC = 0x01020304
NONE, SNAPPY, GZIP = 0, 1, 2


def _payload(records: Sequence[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(r)) + r for r in records)


def go_chunk(records: Sequence[bytes], compressor: int) -> bytes:
    payload = _payload(records)
    if compressor == SNAPPY:
        stored = framing.encode(payload)
    elif compressor == GZIP:
        stored = gzip.compress(payload, mtime=0)
    else:
        stored = payload
    return struct.pack("<5I", MAGIC, zlib.crc32(stored), compressor, len(stored), len(records)) + stored


def fluid_chunk(records: Sequence[bytes], compressor: int) -> bytes:
    payload = _payload(records)
    stored = snappystream.encode(payload) if compressor == SNAPPY else payload
    return struct.pack("<5I", MAGIC, len(records), zlib.crc32(stored), compressor, len(stored)) + stored


def write_go(path: str, records: Sequence[bytes], compressor: int = SNAPPY, max_chunk_bytes: int = 32 << 20) -> None:
    """A Go-layout file; a chunk is flushed once its records reach ``max_chunk_bytes`` (Go's rule)."""
    chunks, pending, size = [], [], 0
    for record in records:
        pending.append(record)
        size += len(record)
        if size >= max_chunk_bytes:
            chunks.append(go_chunk(pending, compressor))
            pending, size = [], 0
    if pending:
        chunks.append(go_chunk(pending, compressor))
    with open(path, "wb") as fh:
        fh.write(b"".join(chunks))


def write_fluid(path: str, records: Sequence[bytes], compressor: int = SNAPPY, max_num_records: int = 1000) -> None:
    """A Fluid-layout file, ``max_num_records`` records per chunk (the C++ writer's rule)."""
    with open(path, "wb") as fh:
        for start in range(0, len(records), max_num_records):
            fh.write(fluid_chunk(records[start : start + max_num_records], compressor))


__all__ = ["write_go", "write_fluid", "go_chunk", "fluid_chunk", "NONE", "SNAPPY", "GZIP"]

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

Modules: ``chunks`` (header, compressors, one chunk packed and unpacked),
``writer`` (``Writer``), ``scanner`` (``Scanner``) and ``convert`` (reader ->
files). Everything public is importable from ``loader.recordio``.
"""

from __future__ import annotations

from loader.recordio.chunks import DEFAULT_COMPRESSOR, HEADER, MAGIC, RECORD_LEN, Compressor
from loader.recordio.convert import convert_reader_to_recordio_file, convert_reader_to_recordio_files
from loader.recordio.scanner import Scanner
from loader.recordio.writer import DEFAULT_MAX_CHUNK_BYTES, Writer

__all__ = [
    "Compressor",
    "DEFAULT_COMPRESSOR",
    "DEFAULT_MAX_CHUNK_BYTES",
    "MAGIC",
    "HEADER",
    "RECORD_LEN",
    "Writer",
    "Scanner",
    "convert_reader_to_recordio_file",
    "convert_reader_to_recordio_files",
]

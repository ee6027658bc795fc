"""RecordIO files: a run of self-checking chunks of records.

Reads this package's files and PaddlePaddle's, writes this package's. Paddle wrote two
layouts with the same magic number: Fluid's C++ writer (the one below, which is ours too)
and the Go ``recordio`` package (``paddle.reader.creator.recordio``, ``paddle.v2``), whose
header orders the fields magic, crc32, compressor, size, num_records and whose Snappy
payloads use the official framing format, gzip for id 2. The layout is detected at a file's
first chunk (the order whose CRC matches), the compressor flavour from each payload.
Paddle's records were pickles (never unpickled unless ``allow_pickle=True``, then only by
the restricted unpickler of ``safe_pickle``), Fluid's serialized LoDTensors (``tensors``),
or raw bytes (Go); ``records`` decides which. ``loader recordio convert SRC DST``
(``paddle_convert``) rewrites such a file as ours once.

Layout written (the Fluid C++ format of the original, field order included)::

    file   = chunk*                          (no file header, footer or index)
    chunk  = header payload
    header = 5 x uint32 little-endian: magic 0x01020304, num_records,
             crc32 of the stored payload, compressor id, stored payload size
    payload (before compression) = (uint32 LE length, record bytes)*

Compressors: ``NONE`` (0), ``SNAPPY`` (1, the original's default) and ``ZLIB``
(2, the original's declared but never implemented "gzip" slot, done here with
zlib). A Snappy payload is what the original wrote through hoxnox/snappystream:
the magic ``"snappy\0"``, then blocks of at most 32 KiB, each a raw Snappy
block or stored bytes, with a masked CRC32C of its contents. Snappy and CRC32C
are implemented here in pure Python (numpy for the CRC), so files written by
Paddle read without a third-party codec; with the ``snappy`` extra installed
(cramjam and google-crc32c, ``native``) the C codecs do the same work, giving
the same bytes. The pure-Python path runs at Python speed (compressible chunks
decode at roughly 10-35 MB/s, zlib inflates at over 150), so without the extra
prefer ``NONE`` or ``ZLIB`` for files that only this package reads.

Records written by :meth:`Writer.write` are samples encoded with
:mod:`loader.runtime.codec` (msgpack, numpy arrays as dtype + shape + bytes), never
pickle, so reading a file cannot run code.

Unlike the original, every kind of damage is reported the same way: a bad
magic number, a CRC mismatch, a truncated header or payload, record lengths
that do not add up, a malformed Snappy stream (bad magic, cut-off block, bad
element, masked CRC32C mismatch) or an undecodable record raise
``CorruptFileError`` naming the file and the byte offset of the chunk. The
scanner holds one chunk in memory at a time.

Modules: ``chunks`` (header layouts, compressors, one chunk packed and unpacked),
``records`` (record -> sample), ``safe_pickle``, ``tensors``, ``framing`` (Go's Snappy),
``paddle_convert`` (``loader recordio convert``),
``writer`` (``Writer``), ``scanner`` (``Scanner``), ``convert`` (reader ->
files), and the Snappy codec: ``snappystream`` (the block stream), ``snappy``
(raw Snappy blocks), ``crc32c`` (the checksum), ``native`` (their C forms, when installed). The names in ``__all__`` below
are importable from ``loader.recordio``; the codec modules are internal.
"""

from __future__ import annotations

from loader.recordio.chunks import DEFAULT_COMPRESSOR, HEADER, MAGIC, RECORD_LEN, Compressor, Layout
from loader.recordio.convert import convert_reader_to_recordio_file, convert_reader_to_recordio_files
from loader.recordio.paddle_convert import convert_paddle_file
from loader.recordio.records import PickledRecordError
from loader.recordio.safe_pickle import UnsafePickleError
from loader.recordio.scanner import Scanner
from loader.recordio.writer import DEFAULT_MAX_CHUNK_BYTES, Writer

__all__ = [
    "Compressor",
    "Layout",
    "PickledRecordError",
    "UnsafePickleError",
    "convert_paddle_file",
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

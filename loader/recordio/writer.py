"""``Writer``: append records to a RecordIO file, ``max_num_records`` per chunk."""

from __future__ import annotations

import os
import warnings
from typing import Any, BinaryIO

from loader.errors import ClosedError
from loader.recordio.chunks import (
    DEFAULT_COMPRESSOR,
    HEADER,
    MAX_UINT32,
    RECORD_LEN,
    Compressor,
    compress,
    open_target,
    pack_chunk,
)
from loader.runtime import codec

# A chunk is flushed once its records reach this many bytes, whatever max_num_records
# says, so a scanner's memory stays bounded (one bigger record gets a chunk of its own).
DEFAULT_MAX_CHUNK_BYTES = 64 * 1024 * 1024


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
        compress(self.compressor, b"")  # refuse an unsupported compressor now, not at first flush
        if max_num_records <= 0:
            raise ValueError(f"max_num_records must be > 0, got {max_num_records}")
        if not 0 < max_chunk_bytes <= MAX_UINT32 - HEADER.size:
            raise ValueError(f"max_chunk_bytes must be in 1..{MAX_UINT32 - HEADER.size}, got {max_chunk_bytes}")
        self.max_num_records = max_num_records
        self.max_chunk_bytes = max_chunk_bytes
        self.name, self._file, self._owns_file = open_target(target, "wb")
        self._pending: list[bytes] = []
        self._pending_bytes = 0  # stored size of the pending records, length prefixes included
        self._closed = False
        self.num_records = 0  # records accepted so far

    def write(self, sample: Any) -> None:
        """Encode ``sample`` with :func:`loader.runtime.codec.pack` and append it as one record.

        A sample the codec cannot encode (it never pickles) raises ``TypeError`` naming the file,
        the record and the part that failed; nothing is appended.
        """
        try:
            record = codec.pack(sample)
        except TypeError as exc:
            # The codec's own message names only the type: with convert_reader_to_recordio_file
            # the caller never saw the writer, so say which file and which record.
            raise TypeError(
                f"RecordIO writer for {self.name}: record {self.num_records} cannot be written: {exc} "
                f"(a record holds {codec.KEPT_TYPES}; nothing is pickled)"
            ) from None
        self.write_raw(record)

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
        self._pending.append(record)
        self._pending_bytes += size
        self.num_records += 1
        if len(self._pending) >= self.max_num_records or self._pending_bytes >= self.max_chunk_bytes:
            self.flush()

    def flush(self) -> None:
        """Write the pending chunk, if any (an empty chunk writes nothing)."""
        if self._closed:
            raise ClosedError(f"RecordIO writer for {self.name} is closed")
        if self._pending:
            self._file.write(pack_chunk(self._pending, self.compressor))
            self._pending = []
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

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        # Records wait for a full chunk, written on flush() or close(): a writer dropped without either loses
        # them. Said, not done here: writing from a finalizer (at interpreter exit, the file half-closed) is not safe.
        # A UserWarning, shown by default: lost data is no ResourceWarning (hidden by default), and the file it
        # leaves (often 0 bytes) otherwise shows nothing until a dataset turns out to hold no samples.
        if not getattr(self, "_closed", True) and getattr(self, "_pending", None):
            warnings.warn(
                f"RecordIO writer for {self.name} was not closed: its last {len(self._pending)} records were never "
                "written (use `with Writer(...)` or call close())",
                UserWarning,
                stacklevel=2,
            )


__all__ = ["Writer", "DEFAULT_MAX_CHUNK_BYTES"]

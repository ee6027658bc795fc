"""``Scanner``: read a RecordIO file chunk by chunk, checking each chunk as it is loaded.

It reads this package's files and PaddlePaddle's: the header layout (Fluid's C++ order or
the Go package's) is detected at the first chunk (``scanner.layout``), the compressor
flavour from each payload, and each record is decoded by :mod:`loader.recordio.records`
(pickled records only with ``allow_pickle=True``, through the restricted unpickler).
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from typing import Any, BinaryIO

from loader.errors import ClosedError, CorruptFileError, stepped_past
from loader.recordio.chunks import (
    HEADER,
    MAX_PAYLOAD_BYTES,
    RECORD_LEN,
    Compressor,
    Layout,
    chunk_error,
    detect_layout,
    open_target,
    parse_header,
    unpack_payload,
)
from loader.recordio.records import decode_record


class Scanner:
    """Reads a RecordIO file chunk by chunk.

    Iterating yields decoded samples; :meth:`raw_records` yields the record
    bytes. Each iteration continues from where the last stopped; :meth:`reset`
    goes back to the first record. ``source`` is a path (owned) or a seekable
    binary file object (left open by ``close()``). One chunk is in memory at a time.

    ``allow_pickle=True`` opts in to reading PaddlePaddle's pickled records with the
    restricted unpickler (:mod:`loader.recordio.safe_pickle`); without it such a record
    raises ``PickledRecordError`` saying how to opt in. ``layout`` is the header layout
    found at the first chunk (``None`` until a chunk was read).
    """

    def __init__(
        self,
        source: str | os.PathLike[str] | BinaryIO,
        *,
        allow_pickle: bool = False,
        max_payload_bytes: int = MAX_PAYLOAD_BYTES,
    ) -> None:
        self.max_payload_bytes = int(max_payload_bytes)
        self.name, self._file, self._owns_file = open_target(source, "rb")
        self.allow_pickle = bool(allow_pickle)
        self.layout: Layout | None = None
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
    def _next_view(self) -> memoryview | None:
        """The next record, as a view of the loaded chunk, or ``None`` at the end of the file."""
        self._check_open()
        while self._pos >= len(self._chunk):
            if not self._load_chunk():
                return None
        record = self._chunk[self._pos]
        self._pos += 1
        self.record_index += 1
        return record

    def next_raw(self) -> bytes | None:
        """The next record's bytes, or ``None`` at the end of the file."""
        record = self._next_view()
        return None if record is None else bytes(record)

    def next_sample(self) -> tuple[bool, Any]:
        """``(True, sample)`` for the next record, ``(False, None)`` at the end."""
        raw = self._next_view()  # decoded straight from the chunk: no copy of the record
        if raw is None:
            return False, None
        try:
            sample = decode_record(
                raw,
                name=self.name,
                chunk_offset=self._chunk_offset,
                index=self.record_index - 1,
                layout=self.layout or Layout.FLUID,
                allow_pickle=self.allow_pickle,
            )
        except Exception as exc:
            # One record's bytes, read and passed: the next call reads the next record. Said on the error, so a
            # reader skipping bad records goes on (it took any other failure for the end of the file).
            stepped_past(exc)
            raise
        return True, sample

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
    def _load_chunk(self) -> bool:
        """Read, check and split the chunk at ``self._offset``; False at a clean end of file."""
        offset = self._offset
        # Seek every time: after a CorruptFileError the file position is wherever the failed
        # read left it. A damaged header or a cut-off payload is reported again on a retry
        # (nothing after it can be trusted); a chunk whose contents are bad is stepped past.
        self._file.seek(offset)
        head = self._file.read(HEADER.size)
        if not head:
            self._chunk, self._pos = [], 0
            return False
        if self.layout is None:
            self.layout = self._detect(offset, head)
        count, checksum, compressor, size = parse_header(self.name, offset, head, self.layout)
        stored = self._read_payload(offset, size)
        try:
            self._chunk = unpack_payload(self.name, offset, count, checksum, compressor, stored, self.max_payload_bytes)
        except CorruptFileError as exc:
            # The framing is intact (the header parsed, the payload is all there), only this chunk's
            # contents are bad: step past it, so a reader that skips bad records loses this chunk's
            # ``count`` records and no more. The error says how many (``records_skipped``).
            self._chunk, self._pos = [], 0
            self._offset = offset + HEADER.size + size
            # The count is the damaged chunk's own header, outside its checksum: at most what its payload could
            # hold (4 bytes a record at least), so a mangled count cannot move the record numbering by billions.
            room = size if compressor == Compressor.NONE else self.max_payload_bytes
            lost = min(count, room // RECORD_LEN.size)
            self.record_index += lost
            exc.records_skipped = lost  # type: ignore[attr-defined]
            raise
        self._chunk_offset, self._pos = offset, 0
        self._offset = offset + HEADER.size + size
        return True

    def _detect(self, offset: int, head: bytes) -> Layout:
        if len(head) < HEADER.size:
            return Layout.FLUID  # parse_header reports the truncation

        def payload(size: int) -> bytes | None:
            left = self._bytes_left()
            if left is not None and size > left:
                return None
            stored = self._file.read(size)
            self._file.seek(offset + HEADER.size)
            return stored if len(stored) == size else None

        return detect_layout(head, payload)

    def _read_payload(self, offset: int, size: int) -> bytes:
        # Compare with the bytes really left before reading, so a damaged size field
        # cannot make us allocate gigabytes.
        left = self._bytes_left()
        if left is not None and size > left:
            raise chunk_error(self.name, offset, f"truncated payload ({left} of {size} bytes present)")
        stored = self._file.read(size)
        if len(stored) < size:
            raise chunk_error(self.name, offset, f"truncated payload ({len(stored)} of {size} bytes present)")
        return stored

    def _bytes_left(self) -> int | None:
        try:
            here = self._file.tell()
            end = os.fstat(self._file.fileno()).st_size
        except (OSError, AttributeError, io.UnsupportedOperation):
            return None
        return max(0, end - here)

    # -- lifetime -------------------------------------------------------------
    def close(self) -> None:
        """Release the file (when the scanner opened it). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._chunk = []
        if self._owns_file:
            self._file.close()

    def __enter__(self) -> Scanner:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["Scanner"]

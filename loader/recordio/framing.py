"""The official Snappy framing format: what the Go ``recordio`` package wrote for Snappy chunks.

Paddle's Go writer (``github.com/PaddlePaddle/recordio``, behind ``paddle.reader.creator.recordio``
and ``paddle.v2``) compressed a chunk's payload with ``snappy.NewBufferedWriter``, the framing
format of the Snappy project (unlike the Fluid C++ writer's hoxnox snappystream)::

    stream = frame*
    frame  = type:u8 length:u24 little-endian body[length]

* ``0xff``: the stream identifier, body ``"sNaPpY"``; it comes first and may repeat;
* ``0x00``: compressed data: a masked CRC32C (u32 little-endian) of the uncompressed data,
  then one raw Snappy block (:mod:`loader.recordio.snappy`);
* ``0x01``: uncompressed data: the masked CRC32C, then the bytes;
* ``0xfe`` and ``0x80``-``0xfd``: padding and skippable frames, ignored;
* ``0x02``-``0x7f``: reserved unskippable frames: an error.

Each data frame holds at most 65536 uncompressed bytes. Every kind of damage raises
``SnappyError`` naming the frame and its byte position in the payload. ``encode`` writes the
same format (compressed frames only where Snappy saves at least 12.5 %, as Go's writer does);
this package writes its own files with ``snappystream``, so ``encode`` serves conversions back
and tests.
"""

from __future__ import annotations

import struct

from loader.recordio.crc32c import masked_crc32c
from loader.recordio.snappy import SnappyError, compress, decompress

STREAM_IDENTIFIER = b"\xff\x06\x00\x00sNaPpY"
MAX_FRAME_DATA = 1 << 16  # uncompressed bytes in one data frame
_CRC = struct.Struct("<I")
_COMPRESSED, _UNCOMPRESSED, _PADDING, _IDENTIFIER = 0x00, 0x01, 0xFE, 0xFF


def is_framed(stored: bytes | bytearray | memoryview) -> bool:
    """True when ``stored`` starts with the framing format's stream identifier."""
    return bytes(stored[: len(STREAM_IDENTIFIER)]) == STREAM_IDENTIFIER


def encode(payload: bytes | bytearray | memoryview) -> bytes:
    """``payload`` in the framing format."""
    view = memoryview(payload).cast("B")
    parts = [STREAM_IDENTIFIER]
    for start in range(0, len(view), MAX_FRAME_DATA):
        block = bytes(view[start : start + MAX_FRAME_DATA])
        packed = compress(block)
        kind, body = (_COMPRESSED, packed) if len(packed) < len(block) - len(block) // 8 else (_UNCOMPRESSED, block)
        length = _CRC.size + len(body)
        parts.append(bytes([kind]) + length.to_bytes(3, "little") + _CRC.pack(masked_crc32c(block)) + body)
    return b"".join(parts)


def decode(stored: bytes | bytearray | memoryview, limit: int | None = None) -> bytes:
    """The payload inside a framed stream; ``SnappyError`` says what is wrong and where, and when the
    payload grows past ``limit`` bytes (each frame holds at most 64 KiB, so it stops within one of it)."""
    data = bytes(stored)
    if not is_framed(data):
        raise SnappyError(f"bad stream identifier {data[:10]!r} (expected {STREAM_IDENTIFIER!r})")
    out: list[bytes | bytearray] = []
    pos, end, total = 0, len(data), 0
    while pos < end:
        where = f"frame at payload byte {pos}"
        if pos + 4 > end:
            raise SnappyError(f"{where}: frame header cut off ({end - pos} of 4 bytes)")
        kind, length = data[pos], int.from_bytes(data[pos + 1 : pos + 4], "little")
        body, pos = pos + 4, pos + 4 + length
        if pos > end:
            raise SnappyError(f"{where}: frame of {length} bytes cut off ({end - body} present)")
        if kind == _IDENTIFIER:
            if data[body:pos] != STREAM_IDENTIFIER[4:]:
                raise SnappyError(f"{where}: bad stream identifier {data[body:pos]!r}")
        elif kind in (_COMPRESSED, _UNCOMPRESSED):
            out.append(_data_frame(data, body, pos, kind, where))
            total += len(out[-1])
            if limit is not None and total > limit:
                raise SnappyError(f"{where}: the payload grows past {limit} bytes (Scanner(max_payload_bytes=...))")
        elif kind < 0x80:
            raise SnappyError(f"{where}: reserved unskippable frame type 0x{kind:02x}")
        # 0x80-0xfe: skippable frames and padding carry nothing for us.
    return b"".join(out)


def _data_frame(data: bytes, body: int, stop: int, kind: int, where: str) -> bytes | bytearray:
    if stop - body < _CRC.size:
        raise SnappyError(f"{where}: data frame shorter than its checksum")
    (crc,) = _CRC.unpack_from(data, body)
    if kind == _COMPRESSED:
        try:
            block: bytes | bytearray = decompress(data, body + _CRC.size, stop, max_length=MAX_FRAME_DATA)
        except SnappyError as exc:
            raise SnappyError(f"{where}: {exc}") from None
    else:
        block = data[body + _CRC.size : stop]
        if len(block) > MAX_FRAME_DATA:
            raise SnappyError(f"{where}: {len(block)} uncompressed bytes exceed the frame limit {MAX_FRAME_DATA}")
    computed = masked_crc32c(block)
    if computed != crc:
        raise SnappyError(f"{where}: masked CRC32C mismatch (stored 0x{crc:08x}, computed 0x{computed:08x})")
    return block


__all__ = ["STREAM_IDENTIFIER", "MAX_FRAME_DATA", "is_framed", "encode", "decode"]
